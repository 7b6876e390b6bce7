package actor_test

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"strings"
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

// request is a message that asks the actor for an answer, or, with stop
// set, tells it to return from its loop.
type request struct {
	n     int
	reply actor.Reply[int]
	stop  bool
}

// stopMsg is the message that tells a loop its work is over.
var stopMsg = request{stop: true}

// recorder is a loop that appends every message it takes to got, answers
// requests that carry a reply with their n, and returns when it takes a stop
// message (which it does not record).
func recorder(got *[]int) actor.Loop[request] {
	return func(_ *actor.Actor[request], inbox <-chan request) {
		for m := range inbox {
			if m.stop {
				return
			}
			*got = append(*got, m.n)
			if m.reply != nil {
				m.reply.Send(m.n)
			}
		}
	}
}

// deaf returns a loop that never reads its mailbox and returns when release
// is closed.
func deaf(release <-chan struct{}) actor.Loop[request] {
	return func(*actor.Actor[request], <-chan request) { <-release }
}

// returnsAtOnce is a loop that returns without reading anything.
func returnsAtOnce(*actor.Actor[request], <-chan request) {}

// isClosed reports whether ch is closed, without blocking.
func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// wait waits for a to be done, failing the test if it does not finish in
// time.
func wait(t *testing.T, a *actor.Actor[request]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
	defer cancel()
	require.NoError(t, a.Wait(ctx), "actor did not finish")
}

// stopAndWait sends a a stop message and waits for it, failing the test if
// the message is not taken or the actor does not finish in time.
func stopAndWait(t *testing.T, a *actor.Actor[request]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
	defer cancel()
	require.NoError(t, a.Send(ctx, stopMsg), "Send(stop)")
	require.NoError(t, a.Wait(ctx), "actor did not finish after the stop message")
}

// startDeaf starts an actor whose loop never reads its mailbox. The returned
// function makes the loop return and waits for the actor.
func startDeaf(t *testing.T) (*actor.Actor[request], func()) {
	release := make(chan struct{})
	a := actor.Start(deaf(release))
	return a, func() {
		t.Helper()
		close(release)
		wait(t, a)
	}
}

// goroutineID returns the id of the calling goroutine, read from the first
// line of its stack trace ("goroutine 18 [running]:"), or 0 if that line
// cannot be parsed.
func goroutineID() uint64 {
	var buf [64]byte
	n := runtime.Stack(buf[:], false)
	fields := strings.Fields(strings.TrimPrefix(string(buf[:n]), "goroutine "))
	if len(fields) == 0 {
		return 0
	}
	id, err := strconv.ParseUint(fields[0], 10, 64)
	if err != nil {
		return 0
	}
	return id
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
		a := actor.Start(func(_ *actor.Actor[request], inbox <-chan request) {
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

func TestStopByMessage(t *testing.T) {
	t.Run("loop returns on the message", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			var got []int
			a := actor.Start(recorder(&got))
			require.NoError(t, a.Send(t.Context(), request{n: 1}))
			require.NoError(t, a.Send(t.Context(), request{n: 2}))
			synctest.Wait()
			require.False(t, isClosed(a.Done()), "Done closed before the stop message")

			require.NoError(t, a.Send(t.Context(), stopMsg), "Send(stop)")
			synctest.Wait()
			assert.True(t, isClosed(a.Done()), "Done not closed after the stop message was taken")
			assert.Equal(t, []int{1, 2}, got, "messages taken before the stop message")
		})
	})

	t.Run("stop from a Call is answered", func(t *testing.T) {
		// A loop may answer the message that stops it; the caller gets the
		// answer, not ErrStopped.
		a := actor.Start(func(_ *actor.Actor[request], inbox <-chan request) {
			m := <-inbox
			m.reply.Send(m.n)
		})
		v, err := actor.Call(t.Context(), a, func(r actor.Reply[int]) request {
			return request{n: 3, reply: r, stop: true}
		})
		require.NoError(t, err, "Call(stop)")
		assert.Equal(t, 3, v, "answer to the stop request")
		wait(t, a)
	})

	t.Run("concurrent stop messages", func(t *testing.T) {
		// Many senders race to stop the actor: the loop takes exactly one
		// stop message and every other Send reports ErrStopped instead of
		// blocking.
		const (
			rounds  = 200
			senders = 16
		)
		for round := range rounds {
			stops := make(chan struct{}, senders) // one send per stop message the loop took
			a := actor.Start(func(_ *actor.Actor[request], inbox <-chan request) {
				for m := range inbox {
					if m.stop {
						stops <- struct{}{}
						return
					}
				}
			})

			start := make(chan struct{})
			errs := make(chan error, senders)
			var wg sync.WaitGroup
			for range senders {
				wg.Go(func() {
					<-start
					ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
					defer cancel()
					errs <- a.Send(ctx, stopMsg)
				})
			}
			close(start) // release every sender at once
			wg.Wait()
			close(errs)
			wait(t, a)

			var taken, stopped int
			for err := range errs {
				switch {
				case err == nil:
					taken++
				case assert.ErrorIs(t, err, actor.ErrStopped, "round %d", round):
					stopped++
				}
			}
			require.Equal(t, 1, taken, "stop messages taken, round %d", round)
			require.Equal(t, senders-1, stopped, "Sends that got ErrStopped, round %d", round)
			require.Len(t, stops, 1, "times the loop saw stop, round %d", round)
		}
	})

	t.Run("own timer", func(t *testing.T) {
		// Something the actor owns may tell it to stop, too.
		synctest.Test(t, func(t *testing.T) {
			const lifetime = time.Minute
			var got []int
			start := time.Now()
			a := actor.Start(func(_ *actor.Actor[request], inbox <-chan request) {
				timer := time.NewTimer(lifetime)
				defer timer.Stop()
				for {
					select {
					case m := <-inbox:
						got = append(got, m.n)
					case <-timer.C:
						return
					}
				}
			})
			require.NoError(t, a.Send(t.Context(), request{n: 1}))
			require.NoError(t, a.Wait(t.Context()))
			assert.Equal(t, lifetime, time.Since(start), "time the actor lived (fake clock)")
			assert.Equal(t, []int{1}, got)
		})
	})
}

func TestSendAfterLoopReturned(t *testing.T) {
	t.Run("done", func(t *testing.T) {
		a := actor.Start(returnsAtOnce)
		wait(t, a)

		err := a.Send(t.Context(), request{n: 1})
		assert.ErrorIs(t, err, actor.ErrStopped, "Send after the actor is done")
	})

	t.Run("after a stop message", func(t *testing.T) {
		var got []int
		a := actor.Start(recorder(&got))
		stopAndWait(t, a)
		err := a.Send(t.Context(), request{n: 1})
		assert.ErrorIs(t, err, actor.ErrStopped, "Send after the stop message and Wait")
		assert.Empty(t, got, "messages the loop took")
	})

	t.Run("children still running", func(t *testing.T) {
		// The loop has returned but a child has not: nobody reads the
		// mailbox any more, so Send must report ErrStopped rather than
		// wait for the child.
		synctest.Test(t, func(t *testing.T) {
			release := make(chan struct{})
			a := actor.Start(func(a *actor.Actor[request], _ <-chan request) {
				a.Go(func(context.Context) { <-release })
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
			var childErr error
			a := actor.Start(func(a *actor.Actor[request], _ <-chan request) {
				a.Go(func(ctx context.Context) {
					<-ctx.Done() // the loop has returned
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
			a, stop := startDeaf(t)
			defer stop()

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
			a, stop := startDeaf(t)
			defer stop()

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
		a, stop := startDeaf(t)
		defer stop()
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		assert.ErrorIs(t, a.Send(ctx, request{n: 1}), context.Canceled)
	})
}

func TestRun(t *testing.T) {
	t.Run("on the calling goroutine", func(t *testing.T) {
		// A message sent before Run waits; Run then runs the loop on the
		// goroutine that called it, which takes the message, and returns
		// only once the loop and its child have returned.
		synctest.Test(t, func(t *testing.T) {
			a := actor.New[request]()
			errc := make(chan error, 1)
			go func() { errc <- a.Send(t.Context(), request{n: 7}) }()
			synctest.Wait()
			select {
			case err := <-errc:
				t.Fatalf("Send before Run returned %v; want it to wait for the loop", err)
			default:
			}
			require.False(t, isClosed(a.Done()), "Done closed before Run")

			var (
				loopID uint64
				took   int
			)
			childReturned := make(chan struct{})
			a.Run(func(a *actor.Actor[request], inbox <-chan request) {
				loopID = goroutineID()
				took = (<-inbox).n
				a.Go(func(ctx context.Context) {
					defer close(childReturned)
					<-ctx.Done()
				})
			})

			want := goroutineID()
			require.NotZero(t, want, "id of the goroutine that called Run")
			assert.Equal(t, want, loopID, "goroutine the loop ran on")
			assert.NoError(t, <-errc, "Send before Run")
			assert.Equal(t, 7, took, "message sent before Run")
			assert.True(t, isClosed(childReturned), "child still running after Run returned")
			assert.True(t, isClosed(a.Done()), "Done not closed after Run returned")
		})
	})

	t.Run("Start runs the loop on a new goroutine", func(t *testing.T) {
		ids := make(chan uint64, 1)
		a := actor.Start(func(*actor.Actor[request], <-chan request) { ids <- goroutineID() })
		wait(t, a)
		caller := goroutineID()
		require.NotZero(t, caller, "id of the goroutine that called Start")
		got := <-ids
		assert.NotZero(t, got, "id of the loop's goroutine")
		assert.NotEqual(t, caller, got, "goroutine the loop ran on")
	})
}

func TestDoneWaitsForChildren(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		grandRelease := make(chan struct{})
		loopReturned := make(chan struct{})
		a := actor.Start(func(a *actor.Actor[request], inbox <-chan request) {
			defer close(loopReturned)
			a.Go(func(context.Context) {
				// A child may start children of its own.
				a.Go(func(context.Context) { <-grandRelease })
				<-release
			})
			for m := range inbox {
				if m.stop {
					return
				}
			}
		})

		synctest.Wait()
		assert.False(t, isClosed(a.Done()), "Done closed before the stop message")

		require.NoError(t, a.Send(t.Context(), stopMsg), "Send(stop)")
		synctest.Wait()
		require.True(t, isClosed(loopReturned), "loop has not returned after the stop message")
		assert.False(t, isClosed(a.Done()), "Done closed while two children run")

		close(release)
		synctest.Wait()
		assert.False(t, isClosed(a.Done()), "Done closed while the grandchild runs")

		close(grandRelease)
		synctest.Wait()
		assert.True(t, isClosed(a.Done()), "Done not closed after every child returned")
	})
}

func TestChildCtxCancelledWhenLoopReturns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sawCancel := make(chan struct{})
		release := make(chan struct{})
		var childErr error
		a := actor.Start(func(a *actor.Actor[request], inbox <-chan request) {
			a.Go(func(ctx context.Context) {
				<-ctx.Done()
				childErr = ctx.Err()
				close(sawCancel)
				<-release // some work still to finish after the cancel
			})
			for m := range inbox {
				if m.stop {
					return
				}
			}
		})

		synctest.Wait()
		require.False(t, isClosed(sawCancel), "child's ctx cancelled while the loop runs")

		require.NoError(t, a.Send(t.Context(), stopMsg), "Send(stop)")
		synctest.Wait()
		require.True(t, isClosed(sawCancel), "child's ctx not cancelled after the loop returned")
		assert.ErrorIs(t, childErr, context.Canceled, "child's ctx.Err()")
		assert.False(t, isClosed(a.Done()), "Done closed while the child runs")

		close(release)
		synctest.Wait()
		assert.True(t, isClosed(a.Done()), "Done not closed after the child returned")
	})
}

func TestStopChildren(t *testing.T) {
	// On a stop message the loop starts a child that reports back with
	// Send(ctx, ...); nobody reads the mailbox any more, so the child blocks
	// there until StopChildren cancels its ctx. StopChildren then waits for
	// the child to finish before the loop goes on.
	synctest.Test(t, func(t *testing.T) {
		proceed := make(chan struct{})       // lets the loop call StopChildren
		childRelease := make(chan struct{})  // lets the child return after its Send
		sendReturned := make(chan struct{})  // closed by the child after its Send
		childReturned := make(chan struct{}) // closed by the child as it returns
		stoppedChildren := make(chan struct{})
		var (
			childErr                error
			childDoneAtStopChildren bool
		)
		a := actor.Start(func(a *actor.Actor[request], inbox <-chan request) {
			for m := range inbox {
				if !m.stop {
					continue
				}
				a.Go(func(ctx context.Context) {
					defer close(childReturned)
					childErr = a.Send(ctx, request{n: 99})
					close(sendReturned)
					<-childRelease
				})
				<-proceed
				a.StopChildren()
				childDoneAtStopChildren = isClosed(childReturned)
				close(stoppedChildren)
				return
			}
		})

		require.NoError(t, a.Send(t.Context(), stopMsg), "Send(stop)")
		synctest.Wait()
		require.False(t, isClosed(sendReturned), "child's Send returned before StopChildren")

		close(proceed)
		synctest.Wait()
		require.True(t, isClosed(sendReturned), "child's Send still blocked after StopChildren cancelled its ctx")
		assert.ErrorIs(t, childErr, context.Canceled, "child's Send after StopChildren")
		assert.False(t, isClosed(stoppedChildren), "StopChildren returned while the child runs")
		assert.False(t, isClosed(a.Done()), "Done closed while the loop runs")

		close(childRelease)
		synctest.Wait()
		assert.True(t, isClosed(stoppedChildren), "StopChildren did not return after the child returned")
		assert.True(t, childDoneAtStopChildren, "child still running when StopChildren returned")
		assert.True(t, isClosed(a.Done()), "Done not closed after the loop returned")
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
			assert.NoError(t, a.Send(t.Context(), stopMsg), "Send(stop)")
			assert.NoError(t, a.Wait(t.Context()), "Wait after the stop message")
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
		wait(t, a)
		_, err := actor.Call(t.Context(), a, func(r actor.Reply[int]) request {
			return request{n: 1, reply: r}
		})
		assert.ErrorIs(t, err, actor.ErrStopped)
	})

	t.Run("loop exits without answering", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			a := actor.Start(func(_ *actor.Actor[request], inbox <-chan request) {
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
		// The loop answers and returns at once, so the reply and the loop's
		// return are both ready when Call looks; the answer must win.
		for i := range 200 {
			a := actor.Start(func(_ *actor.Actor[request], inbox <-chan request) {
				m := <-inbox
				m.reply.Send(m.n * 2)
			})
			v, err := actor.Call(t.Context(), a, func(r actor.Reply[int]) request {
				return request{n: i, reply: r}
			})
			require.NoError(t, err, "iteration %d", i)
			require.Equal(t, i*2, v, "iteration %d", i)
			wait(t, a)
		}
	})

	t.Run("loop returns while a child holds the reply", func(t *testing.T) {
		// The loop hands the request to a child and later returns. Call
		// waits on the loop, not on its children: it reports ErrStopped as
		// soon as the loop has returned, though the child still runs, and
		// the child's late answer does not block it.
		synctest.Test(t, func(t *testing.T) {
			release := make(chan struct{})
			childReturned := make(chan struct{})
			a := actor.Start(func(a *actor.Actor[request], inbox <-chan request) {
				for m := range inbox {
					if m.stop {
						return
					}
					a.Go(func(context.Context) {
						defer close(childReturned)
						<-release // slow work that ignores ctx
						m.reply.Send(m.n + 1)
					})
				}
			})

			type result struct {
				v   int
				err error
			}
			results := make(chan result, 1)
			go func() {
				v, err := actor.Call(t.Context(), a, func(r actor.Reply[int]) request {
					return request{n: 41, reply: r}
				})
				results <- result{v, err}
			}()
			synctest.Wait()
			select {
			case r := <-results:
				t.Fatalf("Call returned (%d, %v) while the loop runs; want it to wait", r.v, r.err)
			default:
			}

			require.NoError(t, a.Send(t.Context(), stopMsg), "Send(stop)")
			start := time.Now()
			r := <-results
			assert.ErrorIs(t, r.err, actor.ErrStopped, "Call after the loop returned, child running")
			assert.Zero(t, r.v, "value returned with ErrStopped")
			assert.Zero(t, time.Since(start), "time Call took to report ErrStopped (fake clock)")
			assert.False(t, isClosed(childReturned), "child returned before Call reported")
			assert.False(t, isClosed(a.Done()), "Done closed while the child runs")

			close(release)
			require.NoError(t, a.Wait(t.Context()))
			assert.True(t, isClosed(childReturned), "child still running after Wait")
		})
	})
}

func TestCallCtx(t *testing.T) {
	t.Run("loop never takes the request", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			a, stop := startDeaf(t)
			defer stop()
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
			a := actor.Start(func(_ *actor.Actor[request], inbox <-chan request) {
				for m := range inbox {
					if m.stop {
						return
					}
					held = append(held, m)
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
		a := actor.Start(func(_ *actor.Actor[request], inbox <-chan request) {
			for m := range inbox {
				if m.stop {
					return
				}
				if m.n == 0 {
					// The slow request: answer only when told, after
					// its caller has gone.
					capacity = cap(m.reply)
					<-answerNow
				}
				m.reply.Send(m.n) // must not block, caller or not
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
