package actor_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock/actor"
)

// waitTimeout bounds every wait on real time in these tests. Tests that
// involve time run in a synctest bubble, where it costs nothing.
const waitTimeout = 10 * time.Second

// ctxTimeout is the deadline given to calls that are meant to time out
// inside a synctest bubble.
const ctxTimeout = 5 * time.Second

// request is a message that asks the actor for an answer.
type request struct {
	n     int
	reply actor.Reply[int]
}

// recorder is a loop that appends every message it takes to got, answers
// requests that carry a reply with their n, and returns when stop is closed.
func recorder(got *[]int) actor.Loop[request] {
	return func(_ *actor.Actor[request], inbox <-chan request, stop <-chan struct{}) {
		for {
			select {
			case m := <-inbox:
				*got = append(*got, m.n)
				if m.reply != nil {
					m.reply.Send(m.n)
				}
			case <-stop:
				return
			}
		}
	}
}

// idle is a loop that never reads its mailbox and returns when stop is
// closed.
func idle(_ *actor.Actor[request], _ <-chan request, stop <-chan struct{}) {
	<-stop
}

// returnsAtOnce is a loop that returns without reading anything.
func returnsAtOnce(*actor.Actor[request], <-chan request, <-chan struct{}) {}

// isClosed reports whether ch is closed, without blocking.
func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// stopAndWait stops a and waits for it, failing the test if it does not
// finish in time.
func stopAndWait(t *testing.T, a *actor.Actor[request]) {
	t.Helper()
	a.Stop()
	ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
	defer cancel()
	require.NoError(t, a.Wait(ctx), "actor did not finish after Stop")
}

func TestSendDeliversInOrder(t *testing.T) {
	var got []int
	a := actor.Start(recorder(&got))
	const n = 100
	for i := range n {
		require.NoError(t, a.Send(t.Context(), request{n: i}), "Send(%d)", i)
	}
	stopAndWait(t, a)

	want := make([]int, n)
	for i := range want {
		want[i] = i
	}
	// Reading got is safe: Wait returned, so the loop has returned.
	assert.Equal(t, want, got, "messages in the order the loop took them")
}

func TestSendMeansTaken(t *testing.T) {
	// The mailbox is unbuffered: once Send returns nil the loop holds the
	// message, so an actor that takes one message and returns has done so.
	synctest.Test(t, func(t *testing.T) {
		took := make(chan int, 1)
		a := actor.Start(func(_ *actor.Actor[request], inbox <-chan request, _ <-chan struct{}) {
			took <- (<-inbox).n
		})
		require.NoError(t, a.Send(t.Context(), request{n: 7}))
		synctest.Wait()
		select {
		case got := <-took:
			assert.Equal(t, 7, got, "message the loop took")
		default:
			t.Fatal("Send returned nil but the loop has not taken the message")
		}
		require.NoError(t, a.Wait(t.Context()))
	})
}

func TestSendAfterLoopReturned(t *testing.T) {
	t.Run("done", func(t *testing.T) {
		a := actor.Start(returnsAtOnce)
		ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
		defer cancel()
		require.NoError(t, a.Wait(ctx))

		err := a.Send(t.Context(), request{n: 1})
		assert.ErrorIs(t, err, actor.ErrStopped, "Send after the actor is done")
	})

	t.Run("after stop", func(t *testing.T) {
		a := actor.Start(idle)
		stopAndWait(t, a)
		err := a.Send(t.Context(), request{n: 1})
		assert.ErrorIs(t, err, actor.ErrStopped, "Send after Stop and Wait")
	})

	t.Run("children still running", func(t *testing.T) {
		// The loop has returned but a child has not: nobody reads the
		// mailbox any more, so Send must report ErrStopped rather than
		// wait for the child.
		synctest.Test(t, func(t *testing.T) {
			release := make(chan struct{})
			a := actor.Start(func(a *actor.Actor[request], _ <-chan request, _ <-chan struct{}) {
				a.Go(func() { <-release })
			})
			synctest.Wait() // the loop has returned; the child blocks
			require.False(t, isClosed(a.Done()), "Done closed while a child runs")

			err := a.Send(t.Context(), request{n: 1})
			assert.ErrorIs(t, err, actor.ErrStopped, "Send after the loop returned, child running")

			close(release)
			require.NoError(t, a.Wait(t.Context()))
		})
	})

	t.Run("from a child", func(t *testing.T) {
		// A child that reports back through the mailbox after the loop
		// returned must get ErrStopped, not deadlock with the actor that
		// waits for it.
		synctest.Test(t, func(t *testing.T) {
			loopReturned := make(chan struct{})
			var childErr error
			a := actor.Start(func(a *actor.Actor[request], _ <-chan request, _ <-chan struct{}) {
				defer close(loopReturned)
				a.Go(func() {
					<-loopReturned
					childErr = a.Send(context.Background(), request{n: 1})
				})
			})
			require.NoError(t, a.Wait(t.Context()))
			assert.ErrorIs(t, childErr, actor.ErrStopped, "child's Send after the loop returned")
		})
	})
}

func TestSendHonoursCtx(t *testing.T) {
	t.Run("deadline", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			a := actor.Start(idle)
			defer stopAndWait(t, a)

			ctx, cancel := context.WithTimeout(t.Context(), ctxTimeout)
			defer cancel()
			start := time.Now()
			err := a.Send(ctx, request{n: 1})
			assert.ErrorIs(t, err, context.DeadlineExceeded, "Send to a loop that never reads")
			assert.Equal(t, ctxTimeout, time.Since(start), "time Send blocked (fake clock)")
		})
	})

	t.Run("cancel", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			a := actor.Start(idle)
			defer stopAndWait(t, a)

			ctx, cancel := context.WithCancel(t.Context())
			errc := make(chan error, 1)
			go func() { errc <- a.Send(ctx, request{n: 1}) }()
			synctest.Wait()
			select {
			case err := <-errc:
				t.Fatalf("Send returned %v before ctx was cancelled; want it to block", err)
			default:
			}
			cancel()
			assert.ErrorIs(t, <-errc, context.Canceled, "Send after cancel")
		})
	})

	t.Run("already cancelled", func(t *testing.T) {
		a := actor.Start(idle)
		defer stopAndWait(t, a)
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		assert.ErrorIs(t, a.Send(ctx, request{n: 1}), context.Canceled)
	})
}

func TestStopIdempotentAndConcurrent(t *testing.T) {
	// Many rounds of many callers racing, so that a Stop that is not
	// idempotent under concurrency (check, then close) shows up as a
	// "close of closed channel" panic.
	const (
		rounds  = 200
		callers = 16
	)
	for round := range rounds {
		stops := make(chan struct{}, callers) // one send per time the loop saw stop
		a := actor.Start(func(_ *actor.Actor[request], _ <-chan request, stop <-chan struct{}) {
			<-stop
			stops <- struct{}{}
		})

		start := make(chan struct{})
		var wg sync.WaitGroup
		for range callers {
			wg.Go(func() {
				<-start
				a.Stop()
				a.Stop()
			})
		}
		close(start) // release every caller at once
		wg.Wait()

		ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
		require.NoError(t, a.Wait(ctx), "round %d", round)
		cancel()
		require.NotPanics(t, a.Stop, "Stop after the actor is done, round %d", round)
		require.Len(t, stops, 1, "times the loop saw stop, round %d", round)
	}
}

func TestDoneWaitsForChildren(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		grandRelease := make(chan struct{})
		loopReturned := make(chan struct{})
		a := actor.Start(func(a *actor.Actor[request], _ <-chan request, stop <-chan struct{}) {
			defer close(loopReturned)
			a.Go(func() {
				// A child may start children of its own.
				a.Go(func() { <-grandRelease })
				<-release
			})
			<-stop
		})

		synctest.Wait()
		assert.False(t, isClosed(a.Done()), "Done closed before Stop")

		a.Stop()
		synctest.Wait()
		require.True(t, isClosed(loopReturned), "loop has not returned after Stop")
		assert.False(t, isClosed(a.Done()), "Done closed while two children run")

		close(release)
		synctest.Wait()
		assert.False(t, isClosed(a.Done()), "Done closed while the grandchild runs")

		close(grandRelease)
		synctest.Wait()
		assert.True(t, isClosed(a.Done()), "Done not closed after every child returned")
	})
}

func TestWait(t *testing.T) {
	t.Run("ctx ends first", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			var got []int
			a := actor.Start(recorder(&got))

			ctx, cancel := context.WithTimeout(t.Context(), ctxTimeout)
			defer cancel()
			start := time.Now()
			err := a.Wait(ctx)
			assert.ErrorIs(t, err, context.DeadlineExceeded, "Wait on a running actor")
			assert.Equal(t, ctxTimeout, time.Since(start), "time Wait blocked (fake clock)")

			// The actor keeps running after Wait gave up.
			assert.NoError(t, a.Send(t.Context(), request{n: 1}), "Send after Wait timed out")
			a.Stop()
			assert.NoError(t, a.Wait(t.Context()), "Wait after Stop")
			assert.Equal(t, []int{1}, got)
		})
	})

	t.Run("done", func(t *testing.T) {
		a := actor.Start(returnsAtOnce)
		ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
		defer cancel()
		assert.NoError(t, a.Wait(ctx))
		assert.NoError(t, a.Wait(ctx), "second Wait")
		assert.True(t, isClosed(a.Done()), "Done after Wait returned nil")
	})
}

func TestCall(t *testing.T) {
	var got []int
	a := actor.Start(recorder(&got))
	defer stopAndWait(t, a)

	for i := range 10 {
		v, err := actor.Call(t.Context(), a, func(r actor.Reply[int]) request {
			return request{n: i, reply: r}
		})
		require.NoError(t, err, "Call(%d)", i)
		assert.Equal(t, i, v, "answer to Call(%d)", i)
	}
}

func TestCallConcurrent(t *testing.T) {
	var got []int
	a := actor.Start(recorder(&got))
	defer stopAndWait(t, a)

	const callers = 32
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() {
			v, err := actor.Call(t.Context(), a, func(r actor.Reply[int]) request {
				return request{n: i, reply: r}
			})
			assert.NoError(t, err, "Call(%d)", i)
			assert.Equal(t, i, v, "answer to Call(%d)", i)
		})
	}
	wg.Wait()
}

func TestCallErrStopped(t *testing.T) {
	t.Run("actor already done", func(t *testing.T) {
		a := actor.Start(returnsAtOnce)
		require.NoError(t, a.Wait(t.Context()))
		_, err := actor.Call(t.Context(), a, func(r actor.Reply[int]) request {
			return request{n: 1, reply: r}
		})
		assert.ErrorIs(t, err, actor.ErrStopped)
	})

	t.Run("loop exits without answering", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			a := actor.Start(func(_ *actor.Actor[request], inbox <-chan request, _ <-chan struct{}) {
				<-inbox // take the request and drop it
			})
			v, err := actor.Call(t.Context(), a, func(r actor.Reply[int]) request {
				return request{n: 1, reply: r}
			})
			assert.ErrorIs(t, err, actor.ErrStopped)
			assert.Zero(t, v, "value returned with ErrStopped")
		})
	})

	t.Run("answer just before exit", func(t *testing.T) {
		// The loop answers and returns at once, so reply and Done are both
		// ready when Call looks; the answer must win.
		for i := range 200 {
			a := actor.Start(func(_ *actor.Actor[request], inbox <-chan request, _ <-chan struct{}) {
				m := <-inbox
				m.reply.Send(m.n * 2)
			})
			v, err := actor.Call(t.Context(), a, func(r actor.Reply[int]) request {
				return request{n: i, reply: r}
			})
			require.NoError(t, err, "iteration %d", i)
			require.Equal(t, i*2, v, "iteration %d", i)
		}
	})

	t.Run("child answers after loop returned", func(t *testing.T) {
		// The actor is not done until its children are, so a child that
		// holds the reply slot still gets its answer to the caller.
		synctest.Test(t, func(t *testing.T) {
			a := actor.Start(func(a *actor.Actor[request], inbox <-chan request, _ <-chan struct{}) {
				m := <-inbox
				a.Go(func() {
					time.Sleep(time.Second) // fake clock: some slow work
					m.reply.Send(m.n + 1)
				})
			})
			v, err := actor.Call(t.Context(), a, func(r actor.Reply[int]) request {
				return request{n: 41, reply: r}
			})
			require.NoError(t, err)
			assert.Equal(t, 42, v)
		})
	})
}

func TestCallCtx(t *testing.T) {
	t.Run("loop never takes the request", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			a := actor.Start(idle)
			defer stopAndWait(t, a)
			ctx, cancel := context.WithTimeout(t.Context(), ctxTimeout)
			defer cancel()
			_, err := actor.Call(ctx, a, func(r actor.Reply[int]) request {
				return request{n: 1, reply: r}
			})
			assert.ErrorIs(t, err, context.DeadlineExceeded)
		})
	})

	t.Run("loop takes but never answers", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			var held []request // owned by the loop
			a := actor.Start(func(_ *actor.Actor[request], inbox <-chan request, stop <-chan struct{}) {
				for {
					select {
					case m := <-inbox:
						held = append(held, m)
					case <-stop:
						return
					}
				}
			})
			ctx, cancel := context.WithCancel(t.Context())
			errc := make(chan error, 1)
			go func() {
				_, err := actor.Call(ctx, a, func(r actor.Reply[int]) request {
					return request{n: 1, reply: r}
				})
				errc <- err
			}()
			synctest.Wait()
			select {
			case err := <-errc:
				t.Fatalf("Call returned %v before ctx was cancelled; want it to block", err)
			default:
			}
			cancel()
			assert.ErrorIs(t, <-errc, context.Canceled)
			stopAndWait(t, a)
			assert.Len(t, held, 1, "requests the loop took")
		})
	})
}

func TestLateReplyDoesNotBlockActor(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		answerNow := make(chan struct{})
		var capacity int
		a := actor.Start(func(_ *actor.Actor[request], inbox <-chan request, stop <-chan struct{}) {
			for {
				select {
				case m := <-inbox:
					if m.n == 0 {
						// The slow request: answer only when told, after
						// its caller has gone.
						capacity = cap(m.reply)
						<-answerNow
					}
					m.reply.Send(m.n) // must not block, caller or not
				case <-stop:
					return
				}
			}
		})
		defer stopAndWait(t, a)

		ctx, cancel := context.WithTimeout(t.Context(), ctxTimeout)
		defer cancel()
		_, err := actor.Call(ctx, a, func(r actor.Reply[int]) request {
			return request{n: 0, reply: r}
		})
		require.ErrorIs(t, err, context.DeadlineExceeded, "slow Call")

		close(answerNow)
		// If the late answer blocked the loop, this Call would never be
		// taken and synctest would report a deadlock.
		v, err := actor.Call(t.Context(), a, func(r actor.Reply[int]) request {
			return request{n: 5, reply: r}
		})
		require.NoError(t, err, "Call after a late reply")
		assert.Equal(t, 5, v)
		assert.Equal(t, 1, capacity, "capacity of the reply slot")
	})
}

func TestErrStoppedMessage(t *testing.T) {
	got := fmt.Sprint(actor.ErrStopped)
	assert.Equal(t, "actor: stopped", got)
}
