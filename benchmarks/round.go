package main

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// The Lock contexts of a job (the -ctx names).
const (
	ctxBackground = "background" // context.Background()
	ctxCancel     = "cancel"     // context.WithCancel(context.Background()), cancelled after the release
)

var ctxKinds = []string{ctxBackground, ctxCancel}

// Bounds of a round.
const (
	// drainTimeout bounds how long after a round's end its workers may take
	// to finish the job they are in (a Lock still waiting at the end goes on
	// until it holds the lock: a Background ctx cannot be cancelled). The
	// slowest legitimate drain here is redsync's: a retry within 250 ms.
	drainTimeout = 3 * time.Second
	// maxErrors bounds the error messages a worker keeps.
	maxErrors = 3
)

// roundSpec is what the workers of one round do, in this process or in a
// helper (it travels as JSON).
type roundSpec struct {
	Lib  string        `json:"lib"`
	Ctx  string        `json:"ctx"`
	Keys []string      `json:"keys"` // one worker per key; one key for all of them is contention
	Hold time.Duration `json:"hold"` // busy work while holding
	// Sets, in the set scenarios (multi.go), stand for Keys: one worker
	// per set, whose every job takes all its names at once
	// (library.lockSet); sets that share a name contend for it.
	Sets [][]string `json:"sets,omitempty"`
	// Start and End bound the round (Unix ns, one wall clock for all the
	// processes of the machine). Only acquisitions that hold the lock
	// before End count.
	Start int64 `json:"start"`
	End   int64 `json:"end"`
	// Spans asks for each acquisition's hold interval, to check across
	// processes that no two holds overlap.
	Spans bool `json:"spans,omitempty"`
	// Drain bounds how long after End the workers may take to finish
	// their jobs (drainTimeout unless the smoke test says less).
	Drain time.Duration `json:"drain"`
}

// span is one hold, in ns from the round's start.
type span struct {
	Held  int64 `json:"held"`
	Freed int64 `json:"freed"`
}

// localResult is what the workers of one process measured in a round.
type localResult struct {
	Acq   []int           `json:"acq"`   // acquisitions of each worker
	Waits []time.Duration `json:"waits"` // from calling Lock to holding, per acquisition
	Spans []span          `json:"spans,omitempty"`
	// Unfinished is, for each worker whose job was still waiting at the
	// round's end, how long it had waited by then.
	Unfinished []time.Duration `json:"unfinished,omitempty"`
	// Commands the library's client sent (on the wire; and processed, by
	// the hook of a go-redis client) and the process's CPU time, all from
	// the round's start to its end.
	Cmds     int64         `json:"cmds"`
	HookCmds int64         `json:"hook_cmds"`
	CPU      time.Duration `json:"cpu"`
	// GaveUp counts Lock calls that gave up by the library's own rule (the
	// job then called Lock again); Stuck counts workers still in a job
	// drainTimeout after the round's end; Overlaps counts acquisitions that
	// found another worker of the process holding the same key (or a name
	// of its set).
	GaveUp int `json:"gave_up"`
	Stuck  int `json:"stuck"`
	// Late counts jobs that held the lock only after the round's end
	// (released, not counted).
	Late int `json:"late"`
	// StuckKeys are the keys of the stuck workers' jobs.
	StuckKeys []string `json:"stuck_keys,omitempty"`
	Overlaps  int      `json:"overlaps"`
	Errs      []string `json:"errs,omitempty"`
}

// runLocal runs spec's workers in this process with lib and measures them.
// It waits at most spec.Drain after the round's end for the workers to
// finish their jobs. A worker still in a job then is counted as stuck and
// abandoned: its Lock ctx is cancelled, if it has a cancellable one, and
// whatever the job does afterwards is not recorded (see worker.run). Its
// goroutine may outlive the round (a Lock on context.Background() that
// never returns cannot be ended from outside); the round's keys are its
// own, so it cannot disturb another round.
func runLocal(lib *library, spec roundSpec) localResult {
	start, end := localTime(spec.Start), localTime(spec.End)
	sets := spec.Sets
	if len(sets) == 0 {
		for _, key := range spec.Keys {
			sets = append(sets, []string{key})
		}
	}
	holders := sharedNames(sets)
	gate := make(chan struct{})
	workers := make([]*worker, len(sets))
	var wg sync.WaitGroup
	for i, names := range sets {
		w := &worker{lib: lib, spec: spec, names: names, start: start, end: end, holders: holders}
		workers[i] = w
		wg.Go(func() {
			<-gate
			w.run()
		})
	}
	time.Sleep(time.Until(start))
	cmds0, hook0, cpu0 := lib.counts.wire.Load(), lib.counts.hook.Load(), processCPU()
	close(gate)
	time.Sleep(time.Until(end))
	res := localResult{
		Cmds:     lib.counts.wire.Load() - cmds0,
		HookCmds: lib.counts.hook.Load() - hook0,
		CPU:      processCPU() - cpu0,
	}

	drained := make(chan struct{})
	go func() {
		defer close(drained)
		wg.Wait()
	}()
	select {
	case <-drained:
	case <-time.After(spec.Drain):
	}
	for _, w := range workers {
		w.mu.Lock()
		w.abandoned = !w.done
		res.Acq = append(res.Acq, len(w.waits))
		res.Waits = append(res.Waits, w.waits...)
		res.Spans = append(res.Spans, w.spans...)
		if !w.done {
			res.StuckKeys = append(res.StuckKeys, w.names[0])
		}
		switch {
		case !w.done && !w.asked.IsZero():
			res.Stuck++
			res.Unfinished = append(res.Unfinished, time.Since(w.asked))
			w.cancel()
		case !w.done:
			res.Stuck++
			res.Errs = append(res.Errs, fmt.Sprintf("%s: a release still busy %v after the round's end", lib.name, spec.Drain))
		case w.unfinished > 0:
			res.Unfinished = append(res.Unfinished, w.unfinished)
		}
		res.GaveUp += w.gaveUp
		res.Late += w.late
		res.Overlaps += w.overlaps
		res.Errs = append(res.Errs, w.errs...)
		w.mu.Unlock()
	}
	return res
}

// worker is one worker of a round. Its goroutine updates the results under
// mu, so that runLocal can read them even while it is stuck in a job.
type worker struct {
	lib        *library
	spec       roundSpec
	names      []string // the key, or the names of a set
	start, end time.Time
	// holders counts, for each name that another worker also takes, the
	// workers holding it now (nil when no name is shared).
	holders map[string]*atomic.Int32

	mu         sync.Mutex
	asked      time.Time          // when the job in Lock asked for the lock; zero outside Lock
	cancel     context.CancelFunc // the Lock ctx's, while in Lock
	waits      []time.Duration
	spans      []span
	unfinished time.Duration // the wait, until the end, of a job that held the lock only after it
	gaveUp     int
	late       int
	overlaps   int
	errs       []string
	done       bool
	// abandoned is set when runLocal has read the results of a worker
	// whose job had not ended: the job then releases what it holds, if it
	// ever gets the lock, and ends without recording anything.
	abandoned bool
}

func (w *worker) fail(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.abandoned && len(w.errs) < maxErrors {
		w.errs = append(w.errs, err.Error())
	}
}

// run does jobs on w.names from now until w.end, as a worker does: a Lock
// ctx of spec.Ctx's kind and a new lock object per job, hold, release.
// A Lock that gives up is called again, its wait counting from the job's
// first call; a job that starts after end is not done, and one that holds
// the lock after end is released and not counted.
func (w *worker) run() {
	defer func() {
		w.mu.Lock()
		w.done = true
		w.mu.Unlock()
	}()
	for time.Now().Before(w.end) {
		release, cancel, asked, ok := w.lock()
		if !ok {
			return
		}
		w.mu.Lock()
		abandoned := w.abandoned
		w.mu.Unlock()
		if abandoned {
			_ = release()
			cancel()
			return
		}
		held := time.Now()
		in := held.Before(w.end)
		overlap := false
		for _, n := range w.names {
			if h := w.holders[n]; h != nil && h.Add(1) > 1 {
				overlap = true
			}
		}
		busy(w.spec.Hold)
		freed := time.Now()
		for _, n := range w.names {
			if h := w.holders[n]; h != nil {
				h.Add(-1)
			}
		}
		w.mu.Lock()
		if overlap {
			w.overlaps++
		}
		if in {
			w.waits = append(w.waits, held.Sub(asked))
			if w.spec.Spans {
				w.spans = append(w.spans, span{Held: held.Sub(w.start).Nanoseconds(), Freed: freed.Sub(w.start).Nanoseconds()})
			}
		} else {
			w.unfinished = w.end.Sub(asked)
			w.late++
		}
		w.mu.Unlock()
		err := release()
		cancel()
		if err != nil {
			w.fail(fmt.Errorf("release: %w", err))
			return
		}
		if !in {
			return
		}
	}
}

// lock is the Lock of one job: it calls the library's Lock, again when it
// gives up, until it holds the lock; it reports false for an error, and
// for a Lock that gave up after the round's end.
func (w *worker) lock() (release func() error, cancel context.CancelFunc, asked time.Time, ok bool) {
	asked = time.Now()
	defer func() {
		w.mu.Lock()
		w.asked, w.cancel = time.Time{}, nil
		w.mu.Unlock()
	}()
	for {
		ctx := context.Background()
		cancel = func() {}
		if w.spec.Ctx == ctxCancel {
			ctx, cancel = context.WithCancel(ctx)
		}
		w.mu.Lock()
		w.asked, w.cancel = asked, cancel
		w.mu.Unlock()
		var err error
		if w.spec.Sets != nil {
			release, err = w.lib.lockSet(ctx, w.names)
		} else {
			release, err = w.lib.lock(ctx, w.names[0])
		}
		if err == nil {
			return release, cancel, asked, true
		}
		cancel()
		if !giveUp(err) {
			w.fail(err)
			return nil, nil, asked, false
		}
		w.mu.Lock()
		w.gaveUp++
		over := !time.Now().Before(w.end)
		if over {
			w.unfinished = w.end.Sub(asked)
		}
		w.mu.Unlock()
		if over {
			return nil, nil, asked, false
		}
	}
}

// busy keeps the CPU busy for d. A hold never sleeps: here a sleep shorter
// than a millisecond lasts a whole one.
func busy(d time.Duration) {
	for start := time.Now(); time.Since(start) < d; {
	}
}

// processCPU returns the CPU time, user and system, of this process so
// far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// localTime turns a Unix time in ns, perhaps from another process, into a
// local time with a monotonic reading. Each reading of the clock reads the
// wall clock and the monotonic clock one after the other, and a process
// preempted between the two pairs them wrongly by the length of the
// preemption, which would shift all its holds of the round against the
// other processes' (compared to the tens of µs between two holds). So it
// reads the clock several times and converts with the reading whose
// pairing is the median of theirs.
func localTime(unixNano int64) time.Time {
	var rs [5]time.Time
	for i := range rs {
		rs[i] = time.Now()
	}
	// skew is how much later, against its wall reading, the monotonic
	// reading of rs[i] was taken than that of rs[0] (Round(0) drops the
	// monotonic reading, so that Sub compares the wall readings).
	skew := func(i int) time.Duration { return rs[i].Sub(rs[0]) - rs[i].Round(0).Sub(rs[0].Round(0)) }
	idx := []int{0, 1, 2, 3, 4}
	slices.SortFunc(idx, func(a, b int) int { return cmp.Compare(skew(a), skew(b)) })
	r := rs[idx[len(idx)/2]]
	return r.Add(time.Unix(0, unixNano).Sub(r))
}

// sharedNames returns a counter for each name that more than one of sets
// holds, or nil when they share none.
func sharedNames(sets [][]string) map[string]*atomic.Int32 {
	seen := map[string]int{}
	for _, set := range sets {
		for _, n := range set {
			seen[n]++
		}
	}
	var shared map[string]*atomic.Int32
	for n, c := range seen {
		if c > 1 {
			if shared == nil {
				shared = map[string]*atomic.Int32{}
			}
			shared[n] = new(atomic.Int32)
		}
	}
	return shared
}
