package distlock_test

// Scenario 7 runs a lock holder in a process of its own (this test binary,
// started again by helperproc), so that the test can SIGSTOP or SIGKILL it
// while it holds the lock. The holder talks to the test in JSON lines: it
// reports what it sees (its grant, State samples, events, the writes Redis
// confirmed, its release) for the history, and it asks the test to run its
// fenced counter calls, the test playing the storage service. The test
// answers each call, and tells the holder when to release and exit.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock"
	"github.com/distkit-go/distlock/internal/helperproc"
	"github.com/distkit-go/distlock/internal/history"
)

// The helper's environment.
const (
	helperAddrVar = "DISTLOCK_HELPER_REDIS"
	helperTTLVar  = "DISTLOCK_HELPER_TTL"
	helperName    = "child"
	holderRole    = "holder"
)

// helperMsg is a line from the helper.
type helperMsg struct {
	// Op is something the helper saw or did, for the history.
	Op *history.Op `json:"op,omitempty"`
	// Call is a fenced counter call (Kind Read or Write) for the test to
	// run; the test answers with a helperReply.
	Call *history.Op `json:"call,omitempty"`
}

// helperReply answers a counter call.
type helperReply struct {
	Value int64 `json:"value"`
	OK    bool  `json:"ok"`
	// Stop tells the helper to release the lock and exit.
	Stop bool `json:"stop,omitempty"`
}

// runHelper is the main of a helper process started by the fault suite.
func runHelper(role string) int {
	if role == benchRole {
		return runBenchHelper() // bench_procs_test.go
	}
	if role == permitRole {
		return runPermitHelper() // safety_semaphore_test.go
	}
	switch role {
	case semRole:
		return runSemHelper() // bench_sem_test.go
	case electRole:
		return runElectHelper() // bench_sem_test.go
	case handoffRole:
		return runHandoffHelper() // bench_handoff_test.go
	case mfWaiterRole:
		return runMultiWaiter() // multi_fault_test.go
	}
	if role != holderRole {
		fmt.Fprintln(os.Stderr, "unknown helper role", role)
		return 2
	}
	if err := runHolder(helperproc.Parent()); err != nil {
		fmt.Fprintln(os.Stderr, "holder:", err)
		return 1
	}
	return 0
}

// recordEvents records g's Lost and Regained events in sink, as op makes
// them (with the event's time), until ctx ends or the guard's channel
// closes. The first event is the state at the time of the call, not a
// change.
func recordEvents(ctx context.Context, g *distlock.Guard, op func(history.Kind) history.Op, sink opSink) {
	first := true
	for ev := range g.Subscribe(ctx) {
		o := op(history.Lost)
		o.At = history.At(ev.Time)
		switch {
		case ev.State == distlock.Lost:
			sink.Add(o)
		case ev.State == distlock.Acquired && !first && ev.Err == nil: // not a failed renewal's report
			o.Kind = history.Regained
			sink.Add(o)
		}
		first = false
	}
}

// linkSink forwards ops to the test.
type linkSink struct{ link *helperproc.Link }

func (s linkSink) Add(op history.Op) { _ = s.link.Send(helperMsg{Op: &op}) }

// runHolder acquires the lock and then, until told to stop, samples its
// state and increments the counter through the test with its token, whatever
// the state says: it is the careless client that fencing protects against.
func runHolder(link *helperproc.Link) error {
	ttl, err := time.ParseDuration(os.Getenv(helperTTLVar))
	if err != nil {
		return err
	}
	rc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{os.Getenv(helperAddrVar)}, DisableCache: true})
	if err != nil {
		return err
	}
	defer rc.Close()
	sink := linkSink{link}
	m, err := distlock.NewMutex(newWire(rc, sink, newTokenBook()), "safety", distlock.WithTTL(ttl),
		distlock.WithOwner(helperName))
	if err != nil {
		return err
	}
	g, err := m.Lock(context.Background())
	if err != nil {
		return err
	}
	key, token := g.Key(), g.Token()
	op := func(kind history.Kind) history.Op {
		return history.Op{Kind: kind, At: history.Now(), Key: key, Client: helperName, Token: token}
	}
	sink.Add(op(history.Granted))

	events, stopEvents := context.WithCancel(context.Background())
	defer stopEvents()
	var wg sync.WaitGroup
	wg.Go(func() {
		recordEvents(events, g, op, sink)
	})
	call := func(c history.Op) (helperReply, error) {
		var r helperReply
		if err := link.Send(helperMsg{Call: &c}); err != nil {
			return r, err
		}
		return r, link.Recv(&r)
	}
	for {
		s := op(history.Sample)
		st := g.State()
		s.End, s.Held = history.Now(), st == distlock.Acquired
		sink.Add(s)

		r, err := call(op(history.Read))
		if err != nil {
			return err
		}
		if !r.Stop && r.OK {
			w := op(history.Write)
			w.Value = r.Value + 1
			r, err = call(w)
			if err != nil {
				return err
			}
		}
		if r.Stop {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), eventually)
	defer cancel()
	st, err := g.Release(ctx)
	stopEvents()
	wg.Wait()
	rel := op(history.Released)
	rel.Held = st == distlock.Released
	sink.Add(rel)
	if st == distlock.Lost && errors.Is(err, context.DeadlineExceeded) {
		// The best-effort delete of a lapsed lease, given a short time of
		// its own, timed out on a busy machine: harmless (see mustRelease).
		err = nil
	}
	return err
}

// helperHolder is the test's side of a holder process.
type helperHolder struct {
	t    *testing.T
	w    *world
	proc *helperproc.Proc
	done chan struct{} // closed when serve has returned

	mu    sync.Mutex
	stop  bool
	ops   []history.Op // the helper's own ops
	calls []history.Op // its counter calls, as the counter answered them
}

// startHolder starts a holder process for the world's lock and serves it.
func (w *world) startHolder() *helperHolder {
	t := w.t
	p := helperproc.Start(t, holderRole, helperAddrVar+"="+w.srv.Addr(), helperTTLVar+"="+w.ttl.String())
	h := &helperHolder{t: t, w: w, proc: p, done: make(chan struct{})}
	go h.serve()
	t.Cleanup(func() {
		p.Kill()
		<-h.done
	})
	return h
}

// serve records the helper's ops and answers its counter calls until it
// exits.
func (h *helperHolder) serve() {
	defer close(h.done)
	for {
		var m helperMsg
		if err := h.proc.Recv(context.Background(), &m); err != nil {
			if !errors.Is(err, helperproc.ErrExited) {
				h.t.Errorf("holder: %v", err)
			}
			return
		}
		switch {
		case m.Op != nil:
			h.w.rec.Add(*m.Op)
			h.mu.Lock()
			h.ops = append(h.ops, *m.Op)
			h.mu.Unlock()
		case m.Call != nil:
			c := *m.Call
			var r helperReply
			if c.Kind == history.Write {
				r.OK = h.w.counter.Write(c.Client, c.Token, c.Value)
			} else {
				r.Value, r.OK = h.w.counter.Read(c.Client, c.Token)
			}
			c.At, c.OK = history.Now(), r.OK
			if c.Kind == history.Read {
				c.Value = r.Value
			}
			h.mu.Lock()
			h.calls = append(h.calls, c)
			r.Stop = h.stop
			h.mu.Unlock()
			if err := h.proc.Send(r); err != nil {
				return // it died
			}
		}
	}
}

// find returns the helper's ops (or, with calls, its counter calls) that
// match f.
func (h *helperHolder) find(calls bool, f func(history.Op) bool) []history.Op {
	h.mu.Lock()
	defer h.mu.Unlock()
	list := h.ops
	if calls {
		list = h.calls
	}
	var out []history.Op
	for _, op := range list {
		if f(op) {
			out = append(out, op)
		}
	}
	return out
}

// waitOp waits for the helper's first op that matches f.
func (h *helperHolder) waitOp(what string, calls bool, f func(history.Op) bool) history.Op {
	h.t.Helper()
	var got []history.Op
	waitFor(h.t, eventually, what, func() bool {
		got = h.find(calls, f)
		return len(got) > 0
	})
	return got[0]
}

// lastExpiry returns t_s + T of the helper's last confirmed write, as its
// wire recorded it: the earliest moment its lease can expire.
func (h *helperHolder) lastExpiry() history.Mono {
	var until history.Mono
	for _, op := range h.find(false, func(op history.Op) bool { return op.Kind == history.Confirmed }) {
		until = max(until, op.Until)
	}
	return until.Add(distlock.Margin(h.w.ttl))
}

// release tells the helper to release and exit, and waits for it.
func (h *helperHolder) release() history.Op {
	h.t.Helper()
	h.mu.Lock()
	h.stop = true
	h.mu.Unlock()
	rel := h.waitOp("the helper's release", false, func(op history.Op) bool { return op.Kind == history.Released })
	ctx, cancel := context.WithTimeout(context.Background(), eventually)
	defer cancel()
	require.NoError(h.t, h.proc.Wait(ctx), "helper exit")
	return rel
}

// confirmations counts the helper's confirmed writes.
func (h *helperHolder) confirmations() int {
	return len(h.find(false, func(op history.Op) bool { return op.Kind == history.Confirmed }))
}
