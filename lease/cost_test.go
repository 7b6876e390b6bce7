package lease_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/distkit-go/distlock/internal/loopback"
	"github.com/distkit-go/distlock/internal/redisbin"
	"github.com/distkit-go/distlock/internal/redistest"
	"github.com/distkit-go/distlock/lease"
)

// TestScriptCost measures what each path of each script costs redis-server,
// and prints a table: instructions per call, counted by callgrind on a
// private redis-server run under valgrind (repeatable whatever else the
// machine does), and µs per call on a plain private redis-server, sent one
// at a time, sent 16 at a time, and as Redis itself times the command (INFO
// commandstats). The bare SET NX PX + DEL and PING are measured beside the
// scripts for reference.
//
// It runs only when DISTLOCK_SCRIPT_COST is set; scripts/script-cost runs
// it, for the working tree or for an older commit (it uses nothing but the
// package's exported API, so that it can be copied into an older tree).
// DISTLOCK_SCRIPT_COST_N sets the calls per path (default 1000), and
// DISTLOCK_SCRIPT_COST_PATHS, a regular expression, the paths measured (by
// name; a pair is shown only when both its paths are). Without
// valgrind on PATH the instruction column is left out. With
// DISTLOCK_SCRIPT_COST_DIR set, callgrind's dumps are kept in that folder,
// callgrind.out.1 for the first path and so on, for callgrind_annotate.
func TestScriptCost(t *testing.T) {
	if os.Getenv("DISTLOCK_SCRIPT_COST") == "" {
		t.Skip("set DISTLOCK_SCRIPT_COST=1 to measure the scripts (see scripts/script-cost)")
	}
	n := 1000
	if s := os.Getenv("DISTLOCK_SCRIPT_COST_N"); s != "" {
		var err error
		if n, err = strconv.Atoi(s); err != nil || n < 1 {
			t.Fatalf("DISTLOCK_SCRIPT_COST_N=%q: want a positive count", s)
		}
	}
	paths := costPaths()
	if s := os.Getenv("DISTLOCK_SCRIPT_COST_PATHS"); s != "" {
		only, err := regexp.Compile(s)
		if err != nil {
			t.Fatalf("DISTLOCK_SCRIPT_COST_PATHS=%q: %v", s, err)
		}
		paths = slices.DeleteFunc(paths, func(p costPath) bool { return !only.MatchString(p.name) })
	}
	// A batch path makes one call per p.per leases: with fewer than that
	// it would make none, and have nothing to measure.
	paths = slices.DeleteFunc(paths, func(p costPath) bool {
		if p.per > n {
			t.Logf("%s: left out, a batch of %d leases needs DISTLOCK_SCRIPT_COST_N of at least %d (it is %d)", p.name, p.per, p.per, n)
			return true
		}
		return false
	})
	{
		srv := redistest.Start(t)
		paths = measurable(t, newCostEnv(t, srv.Client()), paths)
	}

	instr := map[string]float64{}
	if _, err := exec.LookPath("valgrind"); err == nil {
		cg := startCallgrind(t)
		e := newCostEnv(t, cg.client(t))
		for _, p := range paths {
			e.prepare(t, p, n)
			cg.zero(t)
			e.serial(t, p, n)
			instr[p.name] = cg.dump(t) / float64(n)
		}
	} else {
		t.Log("valgrind not on PATH: no instruction counts")
	}

	srv := redistest.Start(t)
	e := newCostEnv(t, srv.Client())
	e.srv = srv
	// Rounds alternate between the paths, so that a change in the load of
	// the machine falls on all of them alike. DISTLOCK_SCRIPT_COST_ROUNDS
	// sets how many (default 5; 0 leaves the µs columns out, for a quick
	// count of instructions).
	rounds := 5
	if s := os.Getenv("DISTLOCK_SCRIPT_COST_ROUNDS"); s != "" {
		var err error
		if rounds, err = strconv.Atoi(s); err != nil || rounds < 0 {
			t.Fatalf("DISTLOCK_SCRIPT_COST_ROUNDS=%q: want a count, 0 or more", s)
		}
	}
	type timing struct{ serial, inFlight, server []float64 }
	times := map[string]*timing{}
	for _, p := range paths {
		times[p.name] = &timing{}
	}
	for range rounds {
		for _, p := range paths {
			tm := times[p.name]
			e.prepare(t, p, n)
			srv.MustDo("CONFIG", "RESETSTAT")
			start := time.Now()
			e.serial(t, p, n)
			tm.serial = append(tm.serial, costUsPer(time.Since(start), n))
			tm.server = append(tm.server, e.serverUsec(t, p.command)*float64(max(p.calls, 1))/float64(max(p.per, 1)))
			if p.calls > 1 {
				continue // a round's calls follow one another, on one key
			}
			e.prepare(t, p, n)
			start = time.Now()
			e.inFlight(t, p, n, costInFlight)
			tm.inFlight = append(tm.inFlight, costUsPer(time.Since(start), n))
		}
	}

	var b strings.Builder
	fmt.Fprintf(&b, "script costs per call: %d calls per path; µs medians of %d rounds\n", n, rounds)
	fmt.Fprintf(&b, "| path | instructions | µs serial | µs %d in flight | µs in Redis |\n|---|---|---|---|---|\n", costInFlight)
	row := func(name string, in float64, tm timing) {
		fmt.Fprintf(&b, "| %s | %s | %.1f | %.1f | %.2f |\n", name, costKilo(in),
			costMedian(tm.serial), costMedian(tm.inFlight), costMedian(tm.server))
	}
	for _, p := range paths {
		row(p.name, instr[p.name], *times[p.name])
	}
	for _, pair := range costPairs {
		if slices.ContainsFunc(pair.of, func(name string) bool { return times[name] == nil }) {
			continue // a path of the pair was not measured
		}
		var in float64
		var sum timing
		for i, name := range pair.of {
			in += instr[name]
			tm := times[name]
			if i == 0 {
				sum = timing{slices.Clone(tm.serial), slices.Clone(tm.inFlight), slices.Clone(tm.server)}
				continue
			}
			for r := range rounds {
				sum.serial[r] += tm.serial[r]
				sum.inFlight[r] += tm.inFlight[r]
				sum.server[r] += tm.server[r]
			}
		}
		row("**"+pair.name+"**", in, sum)
	}
	fmt.Print(b.String())
}

// costInFlight is how many calls the in-flight column keeps outstanding at
// once; rueidis pipelines them on its connection.
const costInFlight = 16

// costPath is one path through one script (or one bare command): prepare
// sets up the keys of the i-th call, call makes it and checks its outcome.
type costPath struct {
	name    string
	command string // the command INFO commandstats times: evalsha, set, del or ping
	// per is how many calls of the path one command serves (a batch's
	// leases), by which Redis's time per command is divided; 0 is 1.
	per     int
	prepare func(e *costEnv, k lease.Keys, i int) error
	call    func(e *costEnv, k lease.Keys, i int) error
	calls   int // commands per call, for a round of several (0: one); a round is not sent in flight
}

// costPairs are the rows that add up paths: what a Lock+Release costs.
var costPairs = []struct {
	name string
	of   []string
}{
	{"lock pair: acquire + release, uncontended", []string{"lock acquire: free, nobody in line", "lock release: nobody in line"}},
	{"election pair, uncontended", []string{"election acquire: free", "election release: nobody in line"}},
	{"semaphore pair, uncontended", []string{"semaphore acquire: free permit", "semaphore release: nobody in line"}},
	{"rwmutex read pair, uncontended", []string{"rwmutex read acquire: free, nobody in line", "rwmutex read release: nobody in line"}},
	{"rwmutex write pair, uncontended", []string{"rwmutex write acquire: free, nobody in line", "rwmutex write release: nobody in line"}},
	{"set of 2 pair, uncontended (one script each)", []string{"set of 2 acquire: free", "set of 2 release: nobody in line"}},
	{"set of 8 pair, uncontended (one script each)", []string{"set of 8 acquire: free", "set of 8 release: nobody in line"}},
	{"bare pair: SET NX PX + DEL", []string{"bare SET NX PX", "bare DEL"}},
}

// costClaim outlasts the preparation of every call of a path: under
// callgrind, preparing a thousand places in line takes over ten seconds,
// and a place that lapsed before its call would change the path measured.
const (
	costTTL   = time.Minute
	costClaim = time.Minute
)

// The values of one call's acquisition, of another holder and of a waiter.
func costValue(i int) string  { return fmt.Sprintf("cost#v%d", i) }
func costHolder(i int) string { return fmt.Sprintf("cost#h%d", i) }
func costWaiter(i int) string { return fmt.Sprintf("cost#w%d", i) }

func costPaths() []costPath {
	acquire := func(k lease.Keys, value string) func(e *costEnv) error {
		return func(e *costEnv) error {
			g, err := e.lc.Acquire(context.Background(), k, value, costTTL)
			if err == nil && !g.Acquired {
				err = fmt.Errorf("acquire %s: got %+v, want it granted", value, g)
			}
			return err
		}
	}
	held := func(e *costEnv, k lease.Keys, i int) error { return acquire(k, costValue(i))(e) }
	// warm gives the lock a fencing key, as a lock used before has.
	warm := func(e *costEnv, k lease.Keys, i int) error {
		if err := acquire(k, costHolder(i))(e); err != nil {
			return err
		}
		_, err := e.lc.Release(context.Background(), k, costHolder(i))
		return err
	}
	heldByAnother := func(e *costEnv, k lease.Keys, i int) error { return acquire(k, costHolder(i))(e) }
	// queue has the call's waiter stand in line, first.
	queue := func(e *costEnv, k lease.Keys, i int) error {
		g, err := e.lc.AcquireOrQueue(context.Background(), k, costWaiter(i), costTTL, lease.Place{Claim: costClaim, Room: "room"})
		if err == nil && g.Rank != 0 {
			err = fmt.Errorf("queue %s: got %+v, want rank 0", costWaiter(i), g)
		}
		return err
	}
	release := func(e *costEnv, k lease.Keys, i int) error {
		r, err := e.lc.Release(context.Background(), k, costValue(i))
		if err == nil && (!r.Deleted || r.Passed.Value != "") {
			err = fmt.Errorf("release %s: got %+v, want deleted, not passed", costValue(i), r)
		}
		return err
	}
	renew := func(e *costEnv, k lease.Keys, i int) error {
		r, err := e.lc.Renew(context.Background(), k, costValue(i), costTTL)
		if err == nil && !r.OK {
			err = fmt.Errorf("renew %s: got %+v, want OK", costValue(i), r)
		}
		return err
	}
	// renewBatch renews per leases in one lease.Client.RenewBatch: the
	// call of every per-th lease renews it and the per-1 before it, the
	// others send nothing, so that the figures per call are per lease.
	// The warm-up call (the last key) renews its own lease alone.
	renewBatch := func(kind func(lease.Keys) lease.Keys, per int) func(e *costEnv, k lease.Keys, i int) error {
		return func(e *costEnv, k lease.Keys, i int) error {
			first := i - per + 1
			switch {
			case i == len(e.keys)-1:
				first = i
			case i%per != per-1:
				return nil
			}
			items := make([]lease.RenewItem, 0, per)
			for j := first; j <= i; j++ {
				items = append(items, lease.RenewItem{Keys: kind(e.keys[j]), Value: costValue(j), TTL: costTTL})
			}
			out := make([]lease.Renewal, len(items))
			if err := e.lc.RenewBatch(context.Background(), items, out); err != nil {
				return err
			}
			for j, r := range out {
				if !r.OK {
					return fmt.Errorf("renew %s in a batch: got %+v, want OK", costValue(first+j), r)
				}
			}
			return nil
		}
	}
	lock := func(k lease.Keys) lease.Keys { return k }
	election := func(k lease.Keys) lease.Keys { return k.Election() }
	semaphore := func(k lease.Keys) lease.Keys { return k.Semaphore(4) }
	reader := func(k lease.Keys) lease.Keys { return k.RW(lease.Read) }
	writer := func(k lease.Keys) lease.Keys { return k.RW(lease.Write) }
	with := func(kind func(lease.Keys) lease.Keys, f func(e *costEnv, k lease.Keys, i int) error) func(e *costEnv, k lease.Keys, i int) error {
		return func(e *costEnv, k lease.Keys, i int) error { return f(e, kind(k), i) }
	}
	both := func(fs ...func(e *costEnv, k lease.Keys, i int) error) func(e *costEnv, k lease.Keys, i int) error {
		return func(e *costEnv, k lease.Keys, i int) error {
			for _, f := range fs {
				if err := f(e, k, i); err != nil {
					return err
				}
			}
			return nil
		}
	}
	// full has every permit of a semaphore held, by other values than the
	// call's.
	full := func(e *costEnv, k lease.Keys, i int) error {
		for j := range k.Permits {
			if err := acquire(k, fmt.Sprintf("%s.%d", costHolder(i), j))(e); err != nil {
				return err
			}
		}
		return nil
	}
	// setOf is the set of n locks of a call: k and n-1 locks named after
	// it, in the set's order.
	setOf := func(k lease.Keys, n int) []lease.Keys {
		open := strings.IndexByte(k.Lease, '{')
		ns, name := k.Lease[:open-1], k.Lease[open+1:len(k.Lease)-1]
		ks := []lease.Keys{k}
		for j := 1; j < n; j++ {
			kj, err := lease.NewKeys(ns, fmt.Sprintf("%s.%d", name, j))
			if err != nil {
				panic(err)
			}
			ks = append(ks, kj)
		}
		if err := lease.SortSet(ks); err != nil {
			panic(err)
		}
		return ks
	}
	setHeld := func(n int) func(e *costEnv, k lease.Keys, i int) error {
		return func(e *costEnv, k lease.Keys, i int) error {
			g, err := e.lc.AcquireAll(context.Background(), setOf(k, n), costValue(i), costTTL, nil)
			if err == nil && g.Held != n {
				err = fmt.Errorf("acquire a set of %d: got %+v, want it granted", n, g)
			}
			return err
		}
	}
	setWarm := func(n int) func(e *costEnv, k lease.Keys, i int) error {
		return func(e *costEnv, k lease.Keys, i int) error {
			for _, kj := range setOf(k, n) {
				if err := warm(e, kj, i); err != nil {
					return err
				}
			}
			return nil
		}
	}
	setRelease := func(n int) func(e *costEnv, k lease.Keys, i int) error {
		return func(e *costEnv, k lease.Keys, i int) error {
			rs, err := e.lc.ReleaseAll(context.Background(), setOf(k, n), costValue(i))
			for _, r := range rs {
				if err == nil && (!r.Deleted || r.Passed.Value != "") {
					err = fmt.Errorf("release a set of %d: got %+v, want each deleted, not passed", n, rs)
				}
			}
			return err
		}
	}
	// setQueue has the call's set take the locks before the middle one,
	// which another holds, and stand in its line.
	setQueue := func(n int) func(e *costEnv, k lease.Keys, i int) error {
		return func(e *costEnv, k lease.Keys, i int) error {
			ks := setOf(k, n)
			g, err := e.lc.AcquireAll(context.Background(), ks, costWaiter(i), costTTL, &lease.Place{Claim: costClaim, Room: "room"})
			if err == nil && (g.Held != n/2 || g.Blocked.Rank != 0) {
				err = fmt.Errorf("a set of %d stands in line: got %+v, want %d held and rank 0", n, g, n/2)
			}
			return err
		}
	}
	setMiddleHeld := func(n int) func(e *costEnv, k lease.Keys, i int) error {
		return func(e *costEnv, k lease.Keys, i int) error { return heldByAnother(e, setOf(k, n)[n/2], i) }
	}
	do := func(e *costEnv, cmd rueidis.Completed) error { return e.rc.Do(context.Background(), cmd).Error() }
	// round is a contended round between two clients on one key, as the
	// library makes it: A takes the free lock, B stands in line, A's
	// release passes the lock to B (and tells B's room, which listens, so
	// that the wake's delivery is counted too), and B releases. (B's guard
	// starts on the grant's claim window and would renew it a third of the
	// window in, 28k more, if it held the lock that long.) Each round has
	// a key of its own (the room's subscription is to that key's channel,
	// and a test of its own would cost a subscription per key), so all run
	// on the one key of kind(round).
	round := func(kind func(lease.Keys) lease.Keys, holder func(i int) string) func(e *costEnv, k lease.Keys, i int) error {
		return func(e *costEnv, _ lease.Keys, i int) error {
			k := kind(e.roundKeys)
			a, b := holder(i), costWaiter(i)
			if err := acquire(k, a)(e); err != nil {
				return err
			}
			g, err := e.lc.AcquireOrQueue(context.Background(), k, b, costTTL, lease.Place{Claim: costClaim, Room: "room"})
			if err != nil || g.Acquired || g.Rank != 0 {
				return fmt.Errorf("queue %s: got %+v, %v; want rank 0", b, g, err)
			}
			r, err := e.lc.Release(context.Background(), k, a)
			if err != nil || r.Passed.Value != b {
				return fmt.Errorf("release %s: got %+v, %v; want passed to %s", a, r, err, b)
			}
			if r, err := e.lc.Release(context.Background(), k, b); err != nil || !r.Deleted || r.Passed.Value != "" {
				return fmt.Errorf("release %s: got %+v, %v; want deleted, not passed", b, r, err)
			}
			return nil
		}
	}
	listen := func(kind func(lease.Keys) lease.Keys) func(e *costEnv, k lease.Keys, i int) error {
		return func(e *costEnv, _ lease.Keys, i int) error {
			if i == 0 {
				return e.listen(kind(e.roundKeys))
			}
			return nil
		}
	}
	return []costPath{
		{name: "lock acquire: free, nobody in line", command: "evalsha", prepare: warm, call: held},
		{name: "lock release: nobody in line", command: "evalsha", prepare: both(warm, held), call: release},
		{name: "lock acquire: held, refused", command: "evalsha", prepare: heldByAnother, call: func(e *costEnv, k lease.Keys, i int) error {
			g, err := e.lc.Acquire(context.Background(), k, costValue(i), costTTL)
			if err == nil && g.Acquired {
				err = fmt.Errorf("acquire %s: granted, want refused", costValue(i))
			}
			return err
		}},
		{name: "lock acquire: held, stands in line", command: "evalsha", prepare: heldByAnother, call: queue},
		{name: "lock acquire: held, stands in line behind another", command: "evalsha", prepare: both(heldByAnother, queue), call: func(e *costEnv, k lease.Keys, i int) error {
			g, err := e.lc.AcquireOrQueue(context.Background(), k, costValue(i), costTTL, lease.Place{Claim: costClaim, Room: "room"})
			if err == nil && g.Rank != 1 {
				err = fmt.Errorf("queue %s: got %+v, want rank 1", costValue(i), g)
			}
			return err
		}},
		{name: "lock acquire: held, refreshes its place", command: "evalsha", prepare: both(heldByAnother, queue), call: func(e *costEnv, k lease.Keys, i int) error {
			// As a waiter's refresh is sent: with its ticket and the token
			// it saw (Place.Seen), which no grant has passed since.
			g, err := e.lc.AcquireOrQueue(context.Background(), k, costWaiter(i), costTTL, lease.Place{Claim: costClaim, Room: "room", Ticket: 1, Seen: 1})
			if err == nil && (g.Rank != 0 || g.Ticket == 1) {
				err = fmt.Errorf("refresh %s: got %+v, want rank 0 and its ticket", costWaiter(i), g)
			}
			return err
		}},
		{name: "lock acquire: held, a late refresh refused", command: "evalsha", prepare: heldByAnother, call: func(e *costEnv, k lease.Keys, i int) error {
			// A refresh of a value that is not in line, sent before the
			// last grant (its Seen is below the fencing key's token).
			g, err := e.lc.AcquireOrQueue(context.Background(), k, costWaiter(i), costTTL, lease.Place{Claim: costClaim, Room: "room", Ticket: 1, Seen: 1})
			if err == nil && (g.Acquired || g.Rank != -1) {
				err = fmt.Errorf("late refresh %s: got %+v, want it refused (rank -1)", costWaiter(i), g)
			}
			return err
		}},
		{name: "lock release: passes to the first in line", command: "evalsha", prepare: both(heldByAnother, queue), call: func(e *costEnv, k lease.Keys, i int) error {
			r, err := e.lc.Release(context.Background(), k, costHolder(i))
			if err == nil && r.Passed.Value != costWaiter(i) {
				err = fmt.Errorf("release %s: got %+v, want passed to %s", costHolder(i), r, costWaiter(i))
			}
			return err
		}},
		{name: "lock renew", command: "evalsha", prepare: held, call: renew},
		{name: "lock renew, batch of 100: per lease", command: "evalsha", per: 100, prepare: held, call: renewBatch(lock, 100)},
		{name: "lock renew, batch of 500: per lease", command: "evalsha", per: 500, prepare: held, call: renewBatch(lock, 500)},
		{name: "lock cancel: held, nobody in line", command: "evalsha", prepare: both(warm, held), call: func(e *costEnv, k lease.Keys, i int) error {
			r, err := e.lc.Cancel(context.Background(), k, costValue(i), costTTL)
			if err == nil && !r.Deleted {
				err = fmt.Errorf("cancel %s: got %+v, want deleted", costValue(i), r)
			}
			return err
		}},
		{name: "election acquire: free", command: "evalsha", prepare: with(election, warm), call: with(election, held)},
		{name: "election release: nobody in line", command: "evalsha", prepare: with(election, both(warm, held)), call: with(election, release)},
		{name: "semaphore acquire: free permit", command: "evalsha", prepare: with(semaphore, warm), call: with(semaphore, held)},
		{name: "semaphore release: nobody in line", command: "evalsha", prepare: with(semaphore, both(warm, held)), call: with(semaphore, release)},
		{name: "semaphore acquire: all permits held, stands in line", command: "evalsha", prepare: with(semaphore, full), call: with(semaphore, queue)},
		{name: "semaphore release: passes to the first in line", command: "evalsha", prepare: with(semaphore, both(full, queue)), call: with(semaphore, func(e *costEnv, k lease.Keys, i int) error {
			r, err := e.lc.Release(context.Background(), k, costHolder(i)+".0")
			if err == nil && r.Passed.Value != costWaiter(i) {
				err = fmt.Errorf("release %s.0: got %+v, want passed to %s", costHolder(i), r, costWaiter(i))
			}
			return err
		})},
		{name: "semaphore renew", command: "evalsha", prepare: with(semaphore, held), call: with(semaphore, renew)},
		{name: "semaphore renew, batch of 100: per lease", command: "evalsha", per: 100, prepare: with(semaphore, held), call: renewBatch(semaphore, 100)},
		{name: "rwmutex read acquire: free, nobody in line", command: "evalsha", prepare: with(reader, warm), call: with(reader, held)},
		{name: "rwmutex read release: nobody in line", command: "evalsha", prepare: with(reader, both(warm, held)), call: with(reader, release)},
		{name: "rwmutex read acquire: readers hold", command: "evalsha", prepare: with(reader, heldByAnother), call: with(reader, held)},
		{name: "rwmutex read release: other readers hold", command: "evalsha", prepare: with(reader, both(heldByAnother, held)), call: with(reader, release)},
		{name: "rwmutex write acquire: free, nobody in line", command: "evalsha", prepare: with(writer, warm), call: with(writer, held)},
		{name: "rwmutex write release: nobody in line", command: "evalsha", prepare: with(writer, both(warm, held)), call: with(writer, release)},
		{name: "rwmutex write acquire: a reader holds, stands in line", command: "evalsha", prepare: with(reader, heldByAnother), call: with(writer, queue)},
		{name: "rwmutex read release: passes to the writer in line", command: "evalsha", prepare: both(with(reader, heldByAnother), with(writer, queue)), call: with(reader, func(e *costEnv, k lease.Keys, i int) error {
			r, err := e.lc.Release(context.Background(), k, costHolder(i))
			if err == nil && r.Passed.Value != costWaiter(i) {
				err = fmt.Errorf("release %s: got %+v, want passed to %s", costHolder(i), r, costWaiter(i))
			}
			return err
		})},
		{name: "rwmutex write release: passes to the reader in line", command: "evalsha", prepare: both(with(writer, heldByAnother), with(reader, queue)), call: with(writer, func(e *costEnv, k lease.Keys, i int) error {
			r, err := e.lc.Release(context.Background(), k, costHolder(i))
			if err == nil && r.Passed.Value != costWaiter(i) {
				err = fmt.Errorf("release %s: got %+v, want passed to %s", costHolder(i), r, costWaiter(i))
			}
			return err
		})},
		{name: "lock acquire: a reader holds, stands in line", command: "evalsha", prepare: with(reader, heldByAnother), call: queue},
		{name: "lock release: passes to the reader in line", command: "evalsha", prepare: both(heldByAnother, with(reader, queue)), call: func(e *costEnv, k lease.Keys, i int) error {
			r, err := e.lc.Release(context.Background(), k, costHolder(i))
			if err == nil && r.Passed.Value != costWaiter(i) {
				err = fmt.Errorf("release %s: got %+v, want passed to %s", costHolder(i), r, costWaiter(i))
			}
			return err
		}},
		{name: "rwmutex read release: passes to the lock in line", command: "evalsha", prepare: both(with(reader, heldByAnother), queue), call: with(reader, func(e *costEnv, k lease.Keys, i int) error {
			r, err := e.lc.Release(context.Background(), k, costHolder(i))
			if err == nil && r.Passed.Value != costWaiter(i) {
				err = fmt.Errorf("release %s: got %+v, want passed to %s", costHolder(i), r, costWaiter(i))
			}
			return err
		})},
		{name: "rwmutex renew (reader)", command: "evalsha", prepare: with(reader, held), call: with(reader, renew)},
		{name: "rwmutex renew (writer)", command: "evalsha", prepare: with(writer, held), call: with(writer, renew)},
		{name: "rwmutex renew (reader), batch of 100: per lease", command: "evalsha", per: 100, prepare: with(reader, held), call: renewBatch(reader, 100)},
		{name: "rwmutex downgrade: nobody in line", command: "evalsha", prepare: with(writer, held), call: with(writer, func(e *costEnv, k lease.Keys, i int) error {
			ok, _, err := e.lc.Downgrade(context.Background(), k, costValue(i), costTTL)
			if err == nil && !ok {
				err = fmt.Errorf("downgrade %s: refused", costValue(i))
			}
			return err
		})},
		{name: "lock contended round: take, stand in line, pass, release", command: "evalsha", calls: 4,
			prepare: listen(func(k lease.Keys) lease.Keys { return k }), call: round(func(k lease.Keys) lease.Keys { return k }, costHolder)},
		{name: "semaphore (1) contended round: take, stand in line, pass, release", command: "evalsha", calls: 4,
			prepare: listen(func(k lease.Keys) lease.Keys { return k.Semaphore(1) }), call: round(func(k lease.Keys) lease.Keys { return k.Semaphore(1) }, costHolder)},
		{name: "rwmutex write contended round: take, stand in line, pass, release", command: "evalsha", calls: 4,
			prepare: listen(writer), call: round(writer, costHolder)},
		{name: "set of 2 acquire: free", command: "evalsha", prepare: setWarm(2), call: setHeld(2)},
		{name: "set of 2 release: nobody in line", command: "evalsha", prepare: both(setWarm(2), setHeld(2)), call: setRelease(2)},
		{name: "set of 8 acquire: free", command: "evalsha", prepare: setWarm(8), call: setHeld(8)},
		{name: "set of 8 release: nobody in line", command: "evalsha", prepare: both(setWarm(8), setHeld(8)), call: setRelease(8)},
		{name: "set of 8 acquire: takes 4, stands in line at the 5th", command: "evalsha", prepare: both(setWarm(8), setMiddleHeld(8)), call: setQueue(8)},
		{name: "set of 8 renew: one batch", command: "evalsha", prepare: setHeld(8), call: func(e *costEnv, k lease.Keys, i int) error {
			ks := setOf(k, 8)
			items := make([]lease.RenewItem, len(ks))
			for j, kj := range ks {
				items[j] = lease.RenewItem{Keys: kj, Value: costValue(i), TTL: costTTL}
			}
			return e.lc.RenewBatch(context.Background(), items, make([]lease.Renewal, len(ks)))
		}},
		{name: "bare SET NX PX", command: "set", call: func(e *costEnv, k lease.Keys, i int) error {
			return do(e, e.rc.B().Set().Key(k.Lease).Value(costValue(i)).Nx().PxMilliseconds(costTTL.Milliseconds()).Build())
		}},
		{name: "bare DEL", command: "del", prepare: func(e *costEnv, k lease.Keys, i int) error {
			return do(e, e.rc.B().Set().Key(k.Lease).Value(costValue(i)).Nx().PxMilliseconds(costTTL.Milliseconds()).Build())
		}, call: func(e *costEnv, k lease.Keys, i int) error {
			return do(e, e.rc.B().Del().Key(k.Lease).Build())
		}},
		{name: "PING", command: "ping", call: func(e *costEnv, _ lease.Keys, _ int) error {
			return do(e, e.rc.B().Ping().Build())
		}},
	}
}

// costEnv is a client of the server being measured.
type costEnv struct {
	rc   rueidis.Client
	lc   *lease.Client
	srv  *redistest.Server // nil under callgrind
	keys []lease.Keys

	roundKeys lease.Keys // the one key of the contended rounds
	wakes     atomic.Int64
	listening map[string]bool // the channels listen subscribed to
	stop      []func()
}

func newCostEnv(t *testing.T, rc rueidis.Client) *costEnv {
	k, err := lease.NewKeys("cost", "round")
	if err != nil {
		t.Fatal(err)
	}
	e := &costEnv{rc: rc, lc: lease.New(rc), roundKeys: k}
	t.Cleanup(func() {
		for _, stop := range e.stop {
			stop()
		}
	})
	return e
}

// listen subscribes to the waiting room "room" of k, as a waiter's process
// does, until the test ends; the grants it is told of count in e.wakes.
func (e *costEnv) listen(k lease.Keys) error {
	if e.listening[k.WakeChannel("room")] {
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready, done := make(chan struct{}), make(chan error, 1)
	go func() {
		done <- e.lc.Subscribe(ctx, k, "room", func() { close(ready) }, func(string, int64) { e.wakes.Add(1) })
	}()
	select {
	case <-ready:
		e.stop = append(e.stop, func() { cancel(); <-done })
		if e.listening == nil {
			e.listening = map[string]bool{}
		}
		e.listening[k.WakeChannel("room")] = true
		return nil
	case err := <-done:
		cancel()
		return fmt.Errorf("subscribe: %v", err)
	}
}

// prepare empties the server and sets up n calls of p, plus one more call
// made at once, so that the scripts are loaded and the connection is warm.
func (e *costEnv) prepare(t *testing.T, p costPath, n int) {
	t.Helper()
	if err := e.rc.Do(context.Background(), e.rc.B().Flushall().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	e.keys = make([]lease.Keys, n+1)
	for i := range e.keys {
		k, err := lease.NewKeys("cost", "k"+strconv.Itoa(i))
		if err != nil {
			t.Fatal(err)
		}
		e.keys[i] = k
		if p.prepare != nil {
			if err := p.prepare(e, k, i); err != nil {
				t.Fatalf("%s: prepare: %v", p.name, err)
			}
		}
	}
	if err := p.call(e, e.keys[n], n); err != nil {
		t.Fatalf("%s: %v", p.name, err)
	}
}

// measurable returns the paths that the scripts of the tree can take: a
// path between two kinds that the tree's scripts refuse to mix (before
// issue 23, a lock and a read-write lock) is left out, and said so.
func measurable(t *testing.T, e *costEnv, paths []costPath) []costPath {
	t.Helper()
	var out []costPath
	for _, p := range paths {
		if err := e.rc.Do(context.Background(), e.rc.B().Flushall().Build()).Error(); err != nil {
			t.Fatal(err)
		}
		k, err := lease.NewKeys("cost", "probe")
		if err != nil {
			t.Fatal(err)
		}
		if p.prepare != nil {
			err = p.prepare(e, k, 0)
		}
		if err == nil {
			err = p.call(e, k, 0)
		}
		if err != nil && strings.Contains(err.Error(), "another kind") {
			t.Logf("not measured: %s (%v)", p.name, err)
			continue
		}
		out = append(out, p)
	}
	return out
}

// serial makes the n prepared calls of p one after the other.
func (e *costEnv) serial(t *testing.T, p costPath, n int) {
	t.Helper()
	for i := range n {
		if err := p.call(e, e.keys[i], i); err != nil {
			t.Fatalf("%s: %v", p.name, err)
		}
	}
}

// inFlight makes the n prepared calls of p from par goroutines.
func (e *costEnv) inFlight(t *testing.T, p costPath, n, par int) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make([]error, par)
	for g := range par {
		wg.Go(func() {
			for i := g; i < n; i += par {
				if err := p.call(e, e.keys[i], i); err != nil {
					errs[g] = err
					return
				}
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatalf("%s: %v", p.name, err)
		}
	}
}

// serverUsec returns the µs per call that Redis counted for command since
// the last CONFIG RESETSTAT.
func (e *costEnv) serverUsec(t *testing.T, command string) float64 {
	t.Helper()
	info, err := e.srv.MustDo("INFO", "commandstats").ToString()
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(info) {
		stats, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+command+":")
		if !ok {
			continue
		}
		for kv := range strings.SplitSeq(stats, ",") {
			if v, ok := strings.CutPrefix(kv, "usec_per_call="); ok {
				f, _ := strconv.ParseFloat(v, 64)
				return f
			}
		}
	}
	t.Fatalf("INFO commandstats: no %s calls in:\n%s", command, info)
	return 0
}

// callgrind is a private redis-server run under valgrind's callgrind.
type callgrind struct {
	cmd   *exec.Cmd
	dir   string
	addr  string
	dumps int
}

// startCallgrind starts redis-server (the one internal/redisbin finds, as
// every test's) under callgrind on a free port, killed when the test ends.
// Its cron runs once a second (hz 1), the least Redis allows, so that
// little of what is counted is not the calls.
func startCallgrind(t *testing.T) *callgrind {
	t.Helper()
	server, err := redisbin.Server()
	if err != nil {
		t.Fatal(err)
	}
	port, err := loopback.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	dir := os.Getenv("DISTLOCK_SCRIPT_COST_DIR")
	if dir == "" {
		dir = t.TempDir()
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cg := &callgrind{dir: dir, addr: "127.0.0.1:" + strconv.Itoa(port)}
	cg.cmd = exec.Command("valgrind", "--tool=callgrind", "--callgrind-out-file="+filepath.Join(dir, "callgrind.out"),
		server, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", dir, "--logfile", filepath.Join(dir, "redis.log"), "--hz", "1", "--dynamic-hz", "no")
	cg.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cg.cmd.Stderr = &strings.Builder{}
	if err := cg.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		_ = cg.cmd.Wait()
	}()
	t.Cleanup(func() {
		_ = cg.cmd.Process.Kill()
		<-exited
	})
	const startWait = time.Minute // valgrind starts slowly
	for deadline := time.Now().Add(startWait); loopback.Ping(cg.addr) != nil; time.Sleep(100 * time.Millisecond) {
		select {
		case <-exited:
			t.Fatalf("valgrind redis-server exited: %s", cg.cmd.Stderr)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("valgrind redis-server did not answer PING within %v", startWait)
		}
	}
	return cg
}

func (cg *callgrind) client(t *testing.T) rueidis.Client {
	t.Helper()
	return redistest.NewClient(t, rueidis.ClientOption{
		InitAddress:       []string{cg.addr},
		DisableCache:      true,
		ForceSingleClient: true,
		ConnWriteTimeout:  time.Minute, // valgrind is slow
	})
}

// control runs callgrind_control with arg on the server.
func (cg *callgrind) control(t *testing.T, arg string) {
	t.Helper()
	out, err := exec.Command("callgrind_control", arg, strconv.Itoa(cg.cmd.Process.Pid)).CombinedOutput()
	if err != nil {
		t.Fatalf("callgrind_control %s: %v: %s", arg, err, out)
	}
}

// zero sets the server's counts to zero.
func (cg *callgrind) zero(t *testing.T) { cg.control(t, "-z") }

// dump writes the counts since the last zero and returns the instructions.
func (cg *callgrind) dump(t *testing.T) float64 {
	t.Helper()
	cg.control(t, "-d")
	cg.dumps++
	name := filepath.Join(cg.dir, "callgrind.out."+strconv.Itoa(cg.dumps))
	f, err := os.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "totals: "); ok {
			n, err := strconv.ParseFloat(strings.Fields(v)[0], 64)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			return n
		}
	}
	t.Fatalf("%s: no totals line", name)
	return 0
}

func costUsPer(d time.Duration, n int) float64 { return float64(d.Microseconds()) / float64(n) }

func costMedian(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(xs))
	return s[len(s)/2]
}

// costKilo formats an instruction count in thousands, or "-" when there is none.
func costKilo(n float64) string {
	if n == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f k", n/1000)
}
