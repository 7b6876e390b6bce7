package distlock_test

// BenchmarkHandoff measures the client's part of a contended hand-off: from
// the moment the releasing client has the reply of the release that passed
// the lock on, to the moment the next holder's Lock returns. Redis's part
// (the scripts) is not in it.
//
//	go test -run '^$' -bench Handoff -benchtime 1x .
//
// The holder is always this process's benchmark goroutine; the waiter is
// another goroutine of this process on the same client (the process
// variant: the release's reply wakes it through deliverPasses) or a helper
// process with a client of its own (the procs variant: the waiter's room
// hears the grant on its pub/sub channel). One hand-off goes:
//
//  1. the holder takes the free lock;
//  2. the waiter calls Lock, and the holder polls Redis until the waiter
//     stands in line, then pauses handoffSettle so that the waiter is
//     asleep in its room, as a waiter in line is;
//  3. the holder releases; a wrapper around its lease.Redis reads the
//     clock when the release script's reply is back on the holder's
//     goroutine (t0), before distlock has read it;
//  4. the waiter reads the clock when its Lock returns (t1), releases, and
//     reports t1.
//
// The hand-off is t1 - t0. Each hand-off is interleaved with one of the
// baseline, the same steps with the bare mechanism in place of the lock:
// in one process a channel send to a goroutine asleep on it; across
// processes an SPUBLISH on the same client, t0 at its reply as above, and
// t1 in the helper's message callback of an SSUBSCRIBE on rueidis (its
// Receive). The ratio is the lock's median over the baseline's.
//
// Across processes, t0 and t1 are read from CLOCK_MONOTONIC, which on Linux
// is one clock for the whole machine: the runtime's own nanotime (what
// time.Now's monotonic reading counts from, less the process's start),
// checked against clock_gettime at the start. Wall-clock time would do too
// on one machine, but it can be stepped.
//
// Hand-offs run in blocks of handoffBlock, alternating the lock's blocks
// with the baseline's; the CPU (getrusage of both processes) and the heap
// allocations (runtime/metrics, both processes) are counted per block, so
// the figure per hand-off is of a whole cycle: the holder's acquisition,
// the waiter's call that stands in line, the release that passes, the wake
// and the waiter's release, plus the harness's own polling and messages,
// which the baseline's blocks pay alike (they poll Redis and send the same
// messages); the difference is what the lock costs over the bare push.
//
// DISTLOCK_HANDOFFS (default 1000) sets the number of hand-offs of each
// kind.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/metrics"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"
	_ "unsafe" // for go:linkname

	"github.com/redis/rueidis"
	"golang.org/x/sys/unix"

	"github.com/distkit-go/distlock"
	"github.com/distkit-go/distlock/internal/helperproc"
	"github.com/distkit-go/distlock/internal/redistest"
	"github.com/distkit-go/distlock/lease"
)

// handoffRole is the helper role of BenchmarkHandoff's waiter process.
const handoffRole = "handoff"

const (
	handoffsVar     = "DISTLOCK_HANDOFFS"
	defaultHandoffs = 1000
	// handoffBlock is how many hand-offs of one kind run in a row.
	handoffBlock = 50
	// handoffSettle is how long the holder waits, once the waiter stands
	// in line, before it releases: the waiter's reply has reached it and it
	// is asleep in its room well before.
	handoffSettle = time.Millisecond
)

//go:linkname nanotime runtime.nanotime
func nanotime() int64

// monoNow reads CLOCK_MONOTONIC, the same in every process of the machine.
func monoNow() int64 { return nanotime() }

// checkMonoClock fails the benchmark if nanotime is not CLOCK_MONOTONIC.
func checkMonoClock(b *testing.B) {
	b.Helper()
	var ts unix.Timespec
	before := monoNow()
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		b.Fatal(err)
	}
	after := monoNow()
	if got := ts.Nano(); got < before || got > after {
		b.Fatalf("CLOCK_MONOTONIC %d is not within the runtime's nanotime %d..%d", got, before, after)
	}
}

// stampKey marks the context of a release whose reply's arrival the
// stamping Redis records; queuedKey the context of a Lock whose calls'
// replies the stamping Redis reports on the chan struct{} it carries.
type (
	stampKey  struct{}
	queuedKey struct{}
)

// stamp is when a call was sent and when its reply came back.
type stamp struct{ sent, replied int64 }

// stampRedis is a lease.Redis that records, in the *stamp a call's context
// carries under stampKey, when that call was sent and its reply came back.
type stampRedis struct{ lease.Redis }

func (s stampRedis) Eval(ctx context.Context, sc *lease.Script, keys, args []string) lease.Reply {
	p, _ := ctx.Value(stampKey{}).(*stamp)
	if p != nil {
		p.sent = monoNow()
	}
	r := s.Redis.Eval(ctx, sc, keys, args)
	if p != nil {
		p.replied = monoNow()
	}
	if q, ok := ctx.Value(queuedKey{}).(chan struct{}); ok {
		select {
		case q <- struct{}{}:
		default:
		}
	}
	return r
}

// handoffCmd is a message from the benchmark to its waiter process.
type handoffCmd struct {
	Lock   string `json:"lock,omitempty"`   // take this lock, report when Lock returned, release
	Room   string `json:"room,omitempty"`   // with Lock: also listen, as a bare subscriber, on this wake channel
	Listen string `json:"listen,omitempty"` // subscribe to this channel for good
	Heard  bool   `json:"heard,omitempty"`  // report when the next message on it arrived
	Usage  bool   `json:"usage,omitempty"`  // report the process's CPU and allocations
	RoomID bool   `json:"roomID,omitempty"` // report the name of the process's waiting rooms
}

// handoffReply is the waiter process's answer.
type handoffReply struct {
	Ready  bool   `json:"ready,omitempty"`
	At     int64  `json:"at,omitempty"`     // CLOCK_MONOTONIC ns
	Pushed int64  `json:"pushed,omitempty"` // when the bare subscriber heard the grant (0: it did not)
	CPU    int64  `json:"cpu,omitempty"`
	Allocs uint64 `json:"allocs,omitempty"`
	Room   string `json:"room,omitempty"`
	Err    string `json:"err,omitempty"`
}

// clientUsage is a process's CPU time (user and system) and heap
// allocations so far.
func clientUsage() (cpu time.Duration, allocs uint64) {
	var ru unix.Rusage
	_ = unix.Getrusage(unix.RUSAGE_SELF, &ru)
	cpu = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	s := []metrics.Sample{{Name: "/gc/heap/allocs:objects"}}
	metrics.Read(s)
	return cpu, s[0].Value.Uint64()
}

// runHandoffHelper is the main of BenchmarkHandoff's waiter process.
func runHandoffHelper() int {
	rc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{os.Getenv(helperAddrVar)}, DisableCache: true})
	if err != nil {
		fmt.Fprintln(os.Stderr, "handoff helper:", err)
		return 1
	}
	defer rc.Close()
	// The bare subscriber of the waiter's room listens on a client of its
	// own: the room unsubscribes its channel on its connection when it
	// closes, which would end a subscription of the same channel there.
	rc2, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{os.Getenv(helperAddrVar)}, DisableCache: true})
	if err != nil {
		fmt.Fprintln(os.Stderr, "handoff helper:", err)
		return 1
	}
	defer rc2.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	heard, pushed := make(chan int64, 1), make(chan int64, 1)
	listen := func(rc rueidis.Client, channel string, at chan int64) string {
		ready := make(chan struct{})
		var once sync.Once
		sctx := rueidis.WithOnSubscriptionHook(ctx, func(s rueidis.PubSubSubscription) {
			if s.Kind == "ssubscribe" && s.Channel == channel {
				once.Do(func() { close(ready) })
			}
		})
		go func() {
			_ = rc.Receive(sctx, rc.B().Ssubscribe().Channel(channel).Build(), func(rueidis.PubSubMessage) {
				t := monoNow()
				select {
				case <-at:
				default:
				}
				at <- t
			})
		}()
		select {
		case <-ready:
			return ""
		case <-time.After(queueTimeout):
			return "no subscription"
		}
	}
	listening := map[string]bool{}
	link := helperproc.Parent()
	send := func(r handoffReply) bool {
		if err := link.Send(r); err != nil {
			fmt.Fprintln(os.Stderr, "handoff helper:", err)
			return false
		}
		return true
	}
	if !send(handoffReply{Ready: true}) {
		return 1
	}
	locks := map[string]*distlock.Mutex{}
	for {
		var cmd handoffCmd
		if err := link.Recv(&cmd); err != nil {
			if errors.Is(err, io.EOF) {
				return 0
			}
			fmt.Fprintln(os.Stderr, "handoff helper:", err)
			return 1
		}
		var r handoffReply
		switch {
		case cmd.Lock != "":
			if !listening[cmd.Room] {
				listening[cmd.Room] = true
				if r.Err = listen(rc2, cmd.Room, pushed); r.Err != "" {
					break
				}
			}
			select {
			case <-pushed:
			default:
			}
			m := locks[cmd.Lock]
			if m == nil {
				if m, err = distlock.NewMutex(rc, cmd.Lock); err != nil {
					r.Err = err.Error()
					break
				}
				locks[cmd.Lock] = m
			}
			g, err := m.Lock(context.Background())
			r.At = monoNow()
			select {
			case r.Pushed = <-pushed:
			case <-time.After(10 * time.Millisecond):
			}
			if err == nil {
				_, err = g.Release(context.Background())
			}
			if err != nil {
				r.Err = err.Error()
			}
		case cmd.Listen != "":
			r.Err = listen(rc, cmd.Listen, heard)
		case cmd.Heard:
			select {
			case r.At = <-heard:
			case <-time.After(queueTimeout):
				r.Err = "no message"
			}
		case cmd.RoomID:
			r.Room = distlock.RoomID()
		case cmd.Usage:
			cpu, allocs := clientUsage()
			r.CPU, r.Allocs = int64(cpu), allocs
		}
		if !send(r) {
			return 1
		}
	}
}

// handoffSide is the waiter's side of one variant: lock starts the
// waiter's Lock (or, for the baseline, readies the receiver), at waits for
// the instant it returned (and, across processes, when a bare subscriber of
// the waiter's process heard the grant; 0 if it did not), usage reads the
// waiter's CPU and allocations where it is another process.
type handoffSide struct {
	lock   func()
	inLine func() (polls int) // waits until the waiter stands in line
	at     func() (returned, pushed int64)
	usage  func() (time.Duration, uint64)
}

// handoffFigures are one kind's figures over the run: the times from the
// reply of the release (or the baseline's push) to the waiter's return,
// from its send, and from the moment a bare subscriber in the waiter's
// process heard it; and the CPU and allocations of whole cycles.
type handoffFigures struct {
	fromReply, fromSend, fromPush []time.Duration
	cpu                           time.Duration
	allocs                        uint64
}

func BenchmarkHandoff(b *testing.B) {
	checkMonoClock(b)
	n := defaultHandoffs
	if s := os.Getenv(handoffsVar); s != "" {
		var err error
		if n, err = strconv.Atoi(s); err != nil || n < 1 {
			b.Fatalf("%s=%q: want a positive number", handoffsVar, s)
		}
	}
	srv := redistest.Start(b)
	b.Run("process", func(b *testing.B) {
		c := srv.Client()
		defer c.Close()
		r := stampRedis{lease.FromRueidis(c)}
		holder, err := distlock.NewMutexOn(r, "handoff")
		if err != nil {
			b.Fatal(err)
		}
		waiter, err := distlock.NewMutexOn(r, "handoff")
		if err != nil {
			b.Fatal(err)
		}
		keys, _ := lease.NewKeys("distlock", "handoff")
		start, held, queued := make(chan struct{}), make(chan int64, 1), make(chan struct{}, 1)
		go func() {
			// The waiter's calls report their replies on queued: once the
			// first is back, the waiter stands in line.
			ctx := context.WithValue(context.Background(), queuedKey{}, queued)
			for range start {
				g, err := waiter.Lock(ctx)
				at := monoNow()
				if err == nil {
					_, err = g.Release(context.Background())
				}
				if err != nil {
					b.Error(err)
				}
				held <- at
			}
		}()
		defer close(start)
		wake, woke := make(chan struct{}), make(chan int64, 1) // the baseline's receiver
		go func() {
			for range wake {
				woke <- monoNow()
			}
		}()
		defer close(wake)
		lockSide := handoffSide{
			lock: func() {
				select {
				case <-queued:
				default:
				}
				start <- struct{}{}
			},
			inLine: func() int { <-queued; return 0 },
			at:     func() (int64, int64) { return <-held, 0 },
		}
		baseSide := handoffSide{lock: func() {}, at: func() (int64, int64) { return <-woke, 0 }}
		send := func() stamp {
			t0 := monoNow()
			wake <- struct{}{}
			return stamp{sent: t0, replied: t0}
		}
		runHandoffs(b, c, holder, keys, n, lockSide, baseSide, send)
	})
	b.Run("procs", func(b *testing.B) {
		c := srv.Client()
		defer c.Close()
		r := stampRedis{lease.FromRueidis(c)}
		holder, err := distlock.NewMutexOn(r, "handoff-procs")
		if err != nil {
			b.Fatal(err)
		}
		keys, _ := lease.NewKeys("distlock", "handoff-procs")
		p := startHelpers(b, srv, handoffRole, 1)[0]
		defer stopBenchProcs(b, []*helperproc.Proc{p})
		recv := func() handoffReply {
			ctx, cancel := context.WithTimeout(context.Background(), phaseGrace)
			defer cancel()
			var r handoffReply
			if err := p.Recv(ctx, &r); err != nil {
				b.Fatalf("waiter process: %v", err)
			}
			if r.Err != "" {
				b.Fatalf("waiter process: %s", r.Err)
			}
			return r
		}
		ask := func(cmd handoffCmd) handoffReply {
			if err := p.Send(cmd); err != nil {
				b.Fatal(err)
			}
			return recv()
		}
		const channel = "{handoff-procs}:bare"
		ask(handoffCmd{Listen: channel})
		usage := func() (time.Duration, uint64) {
			r := ask(handoffCmd{Usage: true})
			return time.Duration(r.CPU), r.Allocs
		}
		// The helper answers a Lock command once its Lock has returned, so
		// the command is sent here and its answer read in at. The helper
		// also listens on its room's wake channel as a bare subscriber of
		// its own, on the same client, to tell when the grant reached it.
		room := keys.WakeChannel(roomOf(b, p))
		lockSide := handoffSide{
			lock: func() {
				if err := p.Send(handoffCmd{Lock: "handoff-procs", Room: room}); err != nil {
					b.Fatal(err)
				}
			},
			at: func() (int64, int64) {
				r := recv()
				return r.At, r.Pushed
			},
			inLine: func() int { return handoffInLine(b, c, keys) },
			usage:  usage,
		}
		baseSide := handoffSide{lock: func() {}, at: func() (int64, int64) { return ask(handoffCmd{Heard: true}).At, 0 }, usage: usage}
		send := func() stamp {
			t0 := monoNow()
			if err := c.Do(context.Background(), c.B().Spublish().Channel(channel).Message("1").Build()).Error(); err != nil {
				b.Fatal(err)
			}
			return stamp{sent: t0, replied: monoNow()}
		}
		runHandoffs(b, c, holder, keys, n, lockSide, baseSide, send)
	})
}

// roomOf returns the name of the waiting rooms of the helper process p.
func roomOf(b *testing.B, p *helperproc.Proc) string {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), phaseGrace)
	defer cancel()
	if err := p.Send(handoffCmd{RoomID: true}); err != nil {
		b.Fatal(err)
	}
	var r handoffReply
	if err := p.Recv(ctx, &r); err != nil || r.Room == "" {
		b.Fatalf("waiter process's room: %+v, %v", r, err)
	}
	return r.Room
}

// runHandoffs runs n hand-offs of holder's lock to lockSide's waiter and n
// of the baseline (send, heard by baseSide), in alternating blocks, and
// reports the figures.
func runHandoffs(b *testing.B, c rueidis.Client, holder *distlock.Mutex, keys lease.Keys, n int,
	lockSide, baseSide handoffSide, send func() stamp) {
	b.Helper()
	var lock, base handoffFigures
	ctx := context.Background()
	lastPolls := 0
	one := func(f *handoffFigures, lockTurn bool) {
		var t0 stamp
		var polls int
		side := baseSide
		if lockTurn {
			side = lockSide
			g, err := holder.Lock(ctx)
			if err != nil {
				b.Fatal(err)
			}
			lockSide.lock()
			polls = lockSide.inLine()
			time.Sleep(handoffSettle)
			if _, err := g.Release(context.WithValue(ctx, stampKey{}, &t0)); err != nil {
				b.Fatal(err)
			}
		} else {
			// The same harness steps as the last hand-off: its polls of
			// Redis and the settling pause.
			for range lastPolls {
				handoffPoll(b, c, keys)
			}
			time.Sleep(handoffSettle)
			t0 = send()
		}
		t1, pushed := side.at()
		if lockTurn {
			lastPolls = polls
		}
		if f == nil {
			return
		}
		f.fromReply = append(f.fromReply, time.Duration(t1-t0.replied))
		f.fromSend = append(f.fromSend, time.Duration(t1-t0.sent))
		if pushed != 0 {
			f.fromPush = append(f.fromPush, time.Duration(t1-pushed))
		}
	}
	block := func(f *handoffFigures, side handoffSide, lockTurn bool, k int) {
		cpu0, allocs0 := clientUsage()
		var rcpu0 time.Duration
		var rallocs0 uint64
		if side.usage != nil {
			rcpu0, rallocs0 = side.usage()
		}
		for range k {
			one(f, lockTurn)
		}
		cpu1, allocs1 := clientUsage()
		f.cpu += cpu1 - cpu0
		f.allocs += allocs1 - allocs0
		if side.usage != nil {
			rcpu1, rallocs1 := side.usage()
			f.cpu += rcpu1 - rcpu0
			f.allocs += rallocs1 - rallocs0
		}
	}
	// A few of each first, unmeasured: the room, its subscription and the
	// connections are up before the count starts.
	for _, t := range []bool{true, false, true, false} {
		one(nil, t)
	}
	for i := 0; len(lock.fromReply) < n; i++ {
		k := min(handoffBlock, n-len(lock.fromReply))
		if i%2 == 0 {
			block(&lock, lockSide, true, k)
			block(&base, baseSide, false, k)
		} else {
			block(&base, baseSide, false, k)
			block(&lock, lockSide, true, k)
		}
	}
	lr, br := quantiles(lock.fromReply), quantiles(base.fromReply)
	ls, bs := quantiles(lock.fromSend), quantiles(base.fromSend)
	b.ReportMetric(float64(lr[0]), "ns/hand-off")
	b.ReportMetric(float64(lr[1]), "p90-ns")
	b.ReportMetric(float64(lr[2]), "p99-ns")
	b.ReportMetric(float64(br[0]), "base-ns")
	b.ReportMetric(float64(br[2]), "base-p99-ns")
	b.ReportMetric(float64(ls[0]), "from-send-ns")
	b.ReportMetric(float64(ls[0])/float64(bs[0]), "from-send-x-base")
	b.ReportMetric(float64(lock.cpu)/float64(n), "cpu-ns/cycle")
	b.ReportMetric(float64(lock.cpu-base.cpu)/float64(n), "cpu-ns/cycle-over-base")
	b.ReportMetric(float64(lock.allocs)/float64(n), "allocs/cycle")
	b.ReportMetric(float64(int64(lock.allocs)-int64(base.allocs))/float64(n), "allocs/cycle-over-base")
	b.Logf("%d hand-offs (median, p90, p99); baseline in brackets", n)
	b.Logf("  from the release's reply: %v %v %v (%v %v %v), median %.2f× the baseline's", lr[0], lr[1], lr[2], br[0], br[1], br[2], float64(lr[0])/float64(br[0]))
	b.Logf("  from the release's send:  %v %v %v (%v %v %v), median %.2f× the baseline's", ls[0], ls[1], ls[2], bs[0], bs[1], bs[2], float64(ls[0])/float64(bs[0]))
	if len(lock.fromPush) > 0 {
		lp := quantiles(lock.fromPush)
		b.ReportMetric(float64(lp[0]), "from-push-ns")
		b.ReportMetric(float64(lp[2]), "from-push-p99-ns")
		b.Logf("  from the push's arrival at a bare subscriber of the waiter's process: %v %v %v (%d of %d heard)", lp[0], lp[1], lp[2], len(lock.fromPush), n)
	}
	b.Logf("  client CPU per cycle %v (baseline %v), allocations %.1f (baseline %.1f)",
		lock.cpu/time.Duration(n), base.cpu/time.Duration(n), float64(lock.allocs)/float64(n), float64(base.allocs)/float64(n))
}

// handoffPoll polls the length of keys's line once, with benchWaitInLine's
// pause, and returns it.
func handoffPoll(b *testing.B, c rueidis.Client, keys lease.Keys) int64 {
	n, err := c.Do(context.Background(), c.B().Zcard().Key(keys.Queue).Build()).AsInt64()
	if err != nil {
		b.Fatal(err)
	}
	time.Sleep(time.Millisecond) // polling Redis, not a synchronisation by sleep
	return n
}

// handoffInLine waits until a waiter stands in keys's line, and returns how
// many times it polled.
func handoffInLine(b *testing.B, c rueidis.Client, keys lease.Keys) int {
	deadline := time.Now().Add(queueTimeout)
	for polls := 1; ; polls++ {
		if handoffPoll(b, c, keys) > 0 {
			return polls
		}
		if time.Now().After(deadline) {
			b.Fatalf("no waiter in %s's line after %v", keys.Queue, queueTimeout)
		}
	}
}

// quantiles returns the median, p90 and p99 of ds.
func quantiles(ds []time.Duration) [3]time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	at := func(q float64) time.Duration { return s[min(len(s)-1, int(q*float64(len(s))))] }
	return [3]time.Duration{at(0.5), at(0.9), at(0.99)}
}
