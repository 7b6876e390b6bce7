package main

// The set scenarios (-multi): a lock over several names at once,
// distlock's MultiMutex, against what a user would write without it (the
// names' Mutexes taken one after the other in sorted order) and against
// bsm/redislock's ObtainMulti (all or nothing in one script, polled; its
// keys must share a slot), each as a ratio to the bare pair taken once per
// name in the same round.
//
// The rows: sets of 2 and 8 names; on one server, where a MultiMutex takes
// every name in one script and releases them in one, and across slots, on
// a private three-primary Redis Cluster with each name in a slot of its
// own (spread over the three primaries), where it takes one script per
// slot, in order; uncontended (one goroutine, a set of its own) and
// contended (4 goroutines on overlapping sets, holding 100 µs). The rounds
// are the peer scenarios' (runRounds): every variant of a row alternates
// with the others, round by round.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/bsm/redislock"
	"github.com/redis/rueidis"

	"github.com/distkit-go/distlock"
)

// setWorkers is the number of goroutines of a contended set scenario.
const setWorkers = 4

// setScenarios are the set scenarios, in the table's order.
var setScenarios = []scenario{
	{name: "set2-one-free", title: "2 names, one server (one script), uncontended", workers: 1, names: 2},
	{name: "set2-one-contended", title: "2 names, one server (one script), 4 goroutines on overlapping sets", workers: setWorkers, shared: true, hold: holdFor, names: 2},
	{name: "set2-across-free", title: "2 names across slots (Cluster), uncontended", workers: 1, names: 2, cluster: true},
	{name: "set2-across-contended", title: "2 names across slots (Cluster), 4 goroutines on overlapping sets", workers: setWorkers, shared: true, hold: holdFor, names: 2, cluster: true},
	{name: "set8-one-free", title: "8 names, one server (one script), uncontended", workers: 1, names: 8},
	{name: "set8-one-contended", title: "8 names, one server (one script), 4 goroutines on overlapping sets", workers: setWorkers, shared: true, hold: holdFor, names: 8},
	{name: "set8-across-free", title: "8 names across slots (Cluster), uncontended", workers: 1, names: 8, cluster: true},
	{name: "set8-across-contended", title: "8 names across slots (Cluster), 4 goroutines on overlapping sets", workers: setWorkers, shared: true, hold: holdFor, names: 8, cluster: true},
}

func setScenarioNames() []string {
	names := make([]string, len(setScenarios))
	for i, s := range setScenarios {
		names[i] = s.name
	}
	return names
}

// sets returns the sets of names of sc's workers for v in the round tagged
// tag: names of their own for every scenario, variant and round. An
// uncontended worker has a set of its own; the contended workers take
// theirs from a pool of twice the set's size, each starting half a set
// after the one before, around a ring: each set shares half its names with
// each neighbour and none with the set opposite it, so two of the four can
// hold at once. On cl (nil: one server), name j of a pool lies on primary
// j mod 3 (shifted by the worker, for uncontended workers), each name in
// a slot of its own.
func (sc scenario) sets(v variant, tag string, cl *cluster) [][]string {
	prefix := strings.Join([]string{"bench", sc.name, v.lib, v.ctx, tag}, ":")
	pools := make([][]string, 1)
	if !sc.shared {
		pools = make([][]string, sc.workers)
	}
	used := map[int]bool{} // slots taken, on a cluster
	for w := range pools {
		size := sc.names
		if sc.shared {
			size = 2 * sc.names
		}
		for j := range size {
			base := prefix + ":n" + strconv.Itoa(w*size+j)
			name := base
			for c := 1; cl != nil; c++ {
				slot := slotOf(name)
				if !used[slot] && cl.nodeOf(slot) == (w+j)%len(cl.nodes) {
					used[slot] = true
					break
				}
				name = base + "." + strconv.Itoa(c)
			}
			pools[w] = append(pools[w], name)
		}
	}
	if !sc.shared {
		return pools
	}
	pool := pools[0]
	sets := make([][]string, sc.workers)
	for i := range sets {
		for j := range sc.names {
			sets[i] = append(sets[i], pool[(i*sc.names/2+j)%len(pool)])
		}
	}
	return sets
}

// Names of the set libraries (the -libs names with -multi); the bare row is
// libBare, so that the ratios and loaded rounds of report.go and runs.go
// apply as they are.
const (
	setMulti       = "multimutex"
	setInOrder     = "mutexes"
	setObtainMulti = "obtainmulti"
)

// setLibSpec describes a set library and how to open it.
type setLibSpec struct {
	name, client, how string
	// head is its name in the table's head.
	head string
	// oneServer libraries run only on one server: their keys must share a
	// slot on a Cluster.
	oneServer bool
	open      func(addrs []string, counts counters) (setLockFunc, func(), error)
}

// setCatalog lists the set libraries in the order of the tables.
var setCatalog = []setLibSpec{
	{
		name: libBare, client: clientRueidis, head: "bare",
		how: "the bare pair once per name, in sorted order: `SET bare:{name} v NX PX 30000` on rueidis, sent again at once " +
			"until it succeeds (the spin), holding the names before it; then a `DEL` per name, pipelined (`DoMulti`)",
		open: openBareSet,
	},
	{
		name: setMulti, client: clientRueidis, head: "MultiMutex",
		how: "`distlock.NewMultiMutex(client, names)` per job, `Lock(ctx)`, `Release(context.WithoutCancel(ctx))`, defaults; " +
			"each name's `TokenOf` is checked to grow from one acquisition to the next",
		open: openMultiMutex,
	},
	{
		name: setInOrder, client: clientRueidis, head: "Mutexes in order",
		how: "`distlock.NewMutex(client, name)` and `Lock(ctx)` for each name in sorted order, holding the ones before; " +
			"`Release(context.WithoutCancel(ctx))` of each in reverse order (a deferred Release per Mutex); each `Token` checked likewise",
		open: openMutexesInOrder,
	},
	{
		name: setObtainMulti, client: clientGoRedis, head: "ObtainMulti", oneServer: true,
		how: "bsm/redislock v0.10.0 `ObtainMulti(ctx, keys, 30s, &Options{RetryStrategy: LinearBackoff(1ms)})` on the go-redis client " +
			"of the peer rows, `Release(ctx)`: all or nothing in one script (MSETNX), tried again every 1 ms; " +
			"its keys share a hash tag (`{round}:name`), as a Cluster requires, so it runs on one server only",
		open: openObtainMulti,
	},
}

func setLibraryNames() []string {
	names := make([]string, len(setCatalog))
	for i, s := range setCatalog {
		names[i] = s.name
	}
	return names
}

func setSpecOf(name string) setLibSpec {
	for _, s := range setCatalog {
		if s.name == name {
			return s
		}
	}
	panic("unknown set library " + name) // parseFlags checked the names
}

// fences checks that every name's fencing tokens, as this process sees
// them, grow from one acquisition to the next: a hold of a name never
// overlaps another (runLocal checks that), so its tokens must come in the
// order of the holds.
type fences struct {
	mu   sync.Mutex
	last map[string]int64
}

// check records token, just acquired for name, and returns an error if it
// does not exceed the last one seen.
func (f *fences) check(name string, token int64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.last == nil {
		f.last = map[string]int64{}
	}
	if last := f.last[name]; token <= last {
		return fmt.Errorf("token of %s: got %d after %d, want more", name, token, last)
	}
	f.last[name] = token
	return nil
}

// setClient returns a rueidis client of the server or cluster at addrs,
// with the options of the peer rows (rueidisOption), counting its
// commands on the wire.
func setClient(addrs []string, counts counters) (rueidis.Client, error) {
	opt := rueidisOption(addrs[0], counts)
	opt.InitAddress = addrs
	return rueidis.NewClient(opt)
}

func openBareSet(addrs []string, counts counters) (setLockFunc, func(), error) {
	c, err := setClient(addrs, counts)
	if err != nil {
		return nil, nil, err
	}
	del := func(ctx context.Context, keys []string) error {
		cmds := make(rueidis.Commands, len(keys))
		for i, k := range keys {
			cmds[i] = c.B().Del().Key(k).Build()
		}
		var errs []error
		for _, r := range c.DoMulti(ctx, cmds...) {
			errs = append(errs, r.Error())
		}
		return errors.Join(errs...)
	}
	lock := func(ctx context.Context, names []string) (func() error, error) {
		keys := make([]string, 0, len(names))
		for _, n := range slices.Sorted(slices.Values(names)) {
			k := "bare:{" + n + "}"
			for {
				err := c.Do(ctx, c.B().Set().Key(k).Value("v").Nx().Px(bareTTL).Build()).Error()
				if err == nil {
					break
				}
				if !rueidis.IsRedisNil(err) {
					return nil, errors.Join(err, del(context.WithoutCancel(ctx), keys))
				}
			}
			keys = append(keys, k)
		}
		return func() error { return del(ctx, keys) }, nil
	}
	return lock, c.Close, nil
}

func openMultiMutex(addrs []string, counts counters) (setLockFunc, func(), error) {
	c, err := setClient(addrs, counts)
	if err != nil {
		return nil, nil, err
	}
	var seen fences
	lock := func(ctx context.Context, names []string) (func() error, error) {
		m, err := distlock.NewMultiMutex(c, names)
		if err != nil {
			return nil, err
		}
		g, err := m.Lock(ctx)
		if err != nil {
			return nil, err
		}
		release := func() error {
			st, err := g.Release(context.WithoutCancel(ctx))
			if err == nil && st != distlock.Released {
				err = fmt.Errorf("distlock: release of the set %v ended in state %v", names, st)
			}
			return err
		}
		for _, n := range names {
			if err := seen.check(n, g.TokenOf(n)); err != nil {
				return nil, errors.Join(err, release())
			}
		}
		return release, nil
	}
	return lock, c.Close, nil
}

func openMutexesInOrder(addrs []string, counts counters) (setLockFunc, func(), error) {
	c, err := setClient(addrs, counts)
	if err != nil {
		return nil, nil, err
	}
	var seen fences
	lock := func(ctx context.Context, names []string) (func() error, error) {
		var guards []*distlock.Guard
		release := func() error {
			var errs []error
			for i := len(guards) - 1; i >= 0; i-- {
				st, err := guards[i].Release(context.WithoutCancel(ctx))
				if err == nil && st != distlock.Released {
					err = fmt.Errorf("distlock: release of %s ended in state %v", guards[i].Key(), st)
				}
				errs = append(errs, err)
			}
			return errors.Join(errs...)
		}
		for _, n := range slices.Sorted(slices.Values(names)) {
			m, err := distlock.NewMutex(c, n)
			if err != nil {
				return nil, errors.Join(err, release())
			}
			g, err := m.Lock(ctx)
			if err != nil {
				return nil, errors.Join(err, release())
			}
			guards = append(guards, g)
			if err := seen.check(n, g.Token()); err != nil {
				return nil, errors.Join(err, release())
			}
		}
		return release, nil
	}
	return lock, c.Close, nil
}

func openObtainMulti(addrs []string, counts counters) (setLockFunc, func(), error) {
	c := goRedisClient(addrs[0], counts)
	locker := redislock.New(c)
	opt := &redislock.Options{RetryStrategy: redislock.LinearBackoff(pollEvery)} // stateless: one for all
	lock := func(ctx context.Context, names []string) (func() error, error) {
		l, err := locker.ObtainMulti(ctx, obtainMultiKeys(names), bareTTL, opt)
		if err != nil {
			return nil, err
		}
		return func() error { return l.Release(ctx) }, nil
	}
	return lock, func() { _ = c.Close() }, nil
}

// obtainMultiKeys returns ObtainMulti's keys of names (of one round): each
// name under the hash tag of the round, the names' part before their last
// colon, which all the names of a round share.
func obtainMultiKeys(names []string) []string {
	keys := make([]string, len(names))
	for i, n := range names {
		round := n[:max(strings.LastIndexByte(n, ':'), 0)]
		keys[i] = "{" + round + "}:" + n
	}
	return keys
}

// setTopology is where a set scenario runs: one server or the cluster,
// with the set libraries opened on it.
type setTopology struct {
	addrs   []string
	admins  []rueidis.Client // one per server, for INFO
	cluster *cluster         // nil on one server
	libs    map[string]*library
}

// openSetLibraries opens each named set library on a client of its own of
// t's servers, leaving out those that run on one server only when t is the
// cluster.
func (t *setTopology) openSetLibraries(names []string) error {
	t.libs = map[string]*library{}
	for _, name := range names {
		spec := setSpecOf(name)
		if spec.oneServer && t.cluster != nil {
			continue
		}
		counts := newCounters()
		lock, closeFn, err := spec.open(t.addrs, counts)
		if err != nil {
			closeLibraries(t.libs)
			return fmt.Errorf("%s: %w", name, err)
		}
		t.libs[name] = &library{name: name, client: spec.client, counts: counts, lockSet: lock, close: closeFn}
	}
	return nil
}

// runSets runs the set scenarios cfg.runs times and prints their tables,
// and with more than one run the summary across the runs; it returns the
// results as run does.
func runSets(cfg config) ([][]scenarioResult, error) {
	srv, admin, stop, err := startWithAdmin()
	if err != nil {
		return nil, err
	}
	defer stop()
	one := &setTopology{addrs: []string{srv.addr}, admins: []rueidis.Client{admin}}
	if err := one.openSetLibraries(cfg.libs); err != nil {
		return nil, err
	}
	defer closeLibraries(one.libs)

	var across *setTopology
	idle := time.Duration(-1)
	for _, name := range cfg.scenarios {
		if scenarioOf(name).cluster && across == nil {
			fmt.Fprintf(cfg.progress, "starting a Redis Cluster of %d primaries\n", clusterPrimaries)
			cl, err := startCluster()
			if err != nil {
				return nil, err
			}
			defer cl.stop()
			across = &setTopology{addrs: cl.addrs(), admins: cl.admins, cluster: cl}
			if err := across.openSetLibraries(cfg.libs); err != nil {
				return nil, err
			}
			defer closeLibraries(across.libs)
			if idle, err = cl.idleCPU(clusterIdleFor); err != nil {
				return nil, err
			}
		}
	}

	printSetHeader(cfg, admin, idle)
	return runEach(cfg, func(sc scenario, n int) (scenarioResult, error) {
		t := one
		if sc.cluster {
			t = across
		}
		return runSetScenario(cfg, sc, t, n)
	}, func(results []scenarioResult) {
		printSetTables(cfg.out, results)
		if cfg.commandstats {
			for _, res := range results {
				fmt.Fprintf(cfg.out, "\n#### %s\n", res.scenario.title)
				printCommandStats(cfg.out, res)
			}
		}
	})
}

// clusterIdleFor is how long the idle cluster's CPU is measured.
const clusterIdleFor = 500 * time.Millisecond

// runSetScenario runs a warm-up round and cfg.rounds measured rounds of
// every set library on t for sc, interleaved (runRounds).
func runSetScenario(cfg config, sc scenario, t *setTopology, run int) (scenarioResult, error) {
	res := scenarioResult{scenario: sc, drain: cfg.drain, ctxs: cfg.ctxs, samples: map[variant][]sample{}, libs: t.libs}
	for _, ctx := range cfg.ctxs {
		for _, name := range cfg.libs {
			if t.libs[name] != nil {
				res.variants = append(res.variants, variant{lib: name, ctx: ctx})
			}
		}
	}
	measure := func(v variant, tag string, d time.Duration) (sample, error) {
		return measureSets(sc, t, v, tag, d, cfg), nil
	}
	return res, runRounds(cfg, &res, run, measure)
}

// measureSets runs one round of v on t in this process.
func measureSets(sc scenario, t *setTopology, v variant, tag string, d time.Duration, cfg config) sample {
	start := time.Now().Add(localLead)
	spec := roundSpec{
		Lib: v.lib, Ctx: v.ctx, Sets: sc.sets(v, tag, t.cluster), Hold: sc.hold,
		Start: start.UnixNano(), End: start.Add(d).UnixNano(), Drain: cfg.drain,
	}
	redis := watchRedis(t.admins, start, start.Add(d), cfg.commandstats)
	r := runLocal(t.libs[v.lib], spec)
	u := <-redis
	s := sample{elapsed: d, redisCPU: u.cpu, redisCmds: u.cmds}
	s.add(r)
	first := spec.Sets[0][0]
	if len(s.stuckKeys) > 0 {
		first = s.stuckKeys[0]
	}
	admin := t.admins[0]
	if t.cluster != nil {
		admin = t.admins[max(t.cluster.nodeOf(slotOf(first)), 0)]
	}
	s.describeKeys(admin, first)
	return s
}

// printSetHeader prints how the set scenarios were run: the command that
// repeats them, the machine, how each library is called, how the sets
// are made, and what the figures are. idle is the idle cluster's CPU a
// second (-1: no cluster).
func printSetHeader(cfg config, admin rueidis.Client, idle time.Duration) {
	w := cfg.out
	fmt.Fprintf(w, "## Locks over several names\n\n`%s`\n\n", commandLine(cfg))
	runs := "Median"
	if cfg.runs > 1 {
		runs = fmt.Sprintf("%d full runs, one after the other, then a summary across them. Each run: the median", cfg.runs)
	}
	fmt.Fprintf(w, "%d CPUs (GOMAXPROCS %d), %s/%s, %s, redis-server %s%s, %s. "+
		"%s of %d rounds of %v per variant, range (min–max) in brackets; "+
		"rounds interleaved across libraries (and contexts), names of their own per round.\n\n",
		runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.GOOS, runtime.GOARCH, runtime.Version(),
		redisVersion(admin), gitRevision(), time.Now().Format("2006-01-02 15:04 MST"), runs, cfg.rounds, cfg.round)
	for _, name := range cfg.libs {
		spec := setSpecOf(name)
		fmt.Fprintf(w, "- **%s** (%s): %s.\n", spec.head, spec.name, spec.how)
	}
	fmt.Fprintf(w, "\n"+
		"One server: the private redis-server, where a MultiMutex takes all its names in one script and releases them in one. "+
		"Across slots: a private Redis Cluster of %d primaries (no replicas), every name in a slot of its own and the names of a set "+
		"spread over the primaries, where a MultiMutex takes one script per slot, in order. "+
		"Uncontended: one goroutine with a set of its own. Contended: %d goroutines whose sets overlap around a ring "+
		"(each shares half its names with each neighbour, none with the set opposite), holding %v of busy work; "+
		"no two holds of a name may overlap (checked).\n\n"+
		"pairs/s: Lock + Release of the whole set per second (median over the rounds); × bare: over the bare row's pairs/s in the same round "+
		"(median and range of the per-round ratios); cmds/op: commands sent per acquisition of the set, counted on the client's connections "+
		"(a script is one; a go-redis EVALSHA that falls back to EVAL counts two); "+
		"MultiMutex ÷ in order: the MultiMutex's pairs/s over the Mutexes' in order, per round. "+
		"Redis CPU/op: used_cpu_sys+used_cpu_user (INFO cpu) of the server, or of the cluster's nodes together, over the round, per acquisition",
		clusterPrimaries, setWorkers, holdFor)
	if idle >= 0 {
		fmt.Fprintf(w, "; the idle cluster itself (its bus and cron) used %v of CPU a second, which the across-slots rows include", idle.Round(10*time.Microsecond))
	}
	fmt.Fprintf(w, ". client CPU/op: getrusage of this process over the round, less the busy holds, per acquisition. "+
		"wait: from calling Lock to holding the set (the worst includes a job still waiting at the round's end); "+
		"fairness: fewest / most acquisitions of one goroutine.\n")
}

// printSetTables prints the set scenarios' tables: rates, ratios and
// commands per row, then waits, fairness and CPU per row and library.
func printSetTables(w io.Writer, results []scenarioResult) {
	if len(results) == 0 {
		return
	}
	ctxs := results[0].ctxs
	var libs []string // the set libraries that ran, bare first
	for _, spec := range setCatalog {
		for _, res := range results {
			if res.libs[spec.name] != nil {
				libs = append(libs, spec.name)
				break
			}
		}
	}
	fmt.Fprintf(w, "\n### Throughput and commands\n\n")
	head := []string{"names", "where", "contention"}
	if len(ctxs) > 1 {
		head = append(head, "ctx")
	}
	for _, lib := range libs {
		h := setSpecOf(lib).head
		if lib == libBare {
			head = append(head, "bare pairs/s")
			continue
		}
		head = append(head, h+" pairs/s", "× bare", "cmds/op")
	}
	both := slices.Contains(libs, setMulti) && slices.Contains(libs, setInOrder)
	if both {
		head = append(head, "MultiMutex ÷ in order")
	}
	tableHead(w, head)
	cmds := columnOf("cmds/op")
	var notes []string
	for _, res := range results {
		figs := res.figures()
		for _, ctx := range ctxs {
			row := setRowHead(res.scenario)
			if len(ctxs) > 1 {
				row = append(row, ctxLabel(ctx))
			}
			for _, lib := range libs {
				v := variant{lib: lib, ctx: ctx}
				if res.libs[lib] == nil {
					if lib != libBare {
						row = append(row, "–", "–", "–")
					}
					continue
				}
				ops := spreadOf(valuesOf(figs[v], func(f figures) float64 { return f.ops }, func(figures) bool { return true }))
				if lib == libBare {
					row = append(row, thousands(ops.med))
					continue
				}
				row = append(row, thousands(ops.med), spreadOf(ratiosOver(figs, v, libBare)).cell(fixed(2)),
					cmds.cell(spreadOf(cmds.of(res, figs, v))))
			}
			if both {
				row = append(row, spreadOf(ratiosOver(figs, variant{lib: setMulti, ctx: ctx}, setInOrder)).cell(fixed(2)))
			}
			fmt.Fprintf(w, "| %s |\n", strings.Join(row, " | "))
		}
		notes = append(notes, loadedNote(res, figs)...)
		notes = append(notes, tableNotes(res, figs, res.scenario.name+": ")...)
	}
	printNotes(w, notes)

	fmt.Fprintf(w, "\n### Waits, fairness and CPU\n\n")
	cols := []column{columnOf("wait p50"), columnOf("wait p99"), columnOf("worst wait"), columnOf("fairness"),
		columnOf("Redis CPU/op"), columnOf("client CPU/op")}
	head = []string{"names", "where", "contention", "ctx", "library"}
	for _, c := range cols {
		head = append(head, c.head)
	}
	tableHead(w, head)
	for _, res := range results {
		figs := res.figures()
		for _, v := range res.variants {
			row := append(setRowHead(res.scenario), ctxLabel(v.ctx), setSpecOf(v.lib).head)
			for _, c := range cols {
				if c.shared && !res.scenario.shared {
					row = append(row, "–")
					continue
				}
				row = append(row, c.cell(spreadOf(c.of(res, figs, v))))
			}
			fmt.Fprintf(w, "| %s |\n", strings.Join(row, " | "))
		}
	}
}

// setRowHead is the first cells of a set scenario's row.
func setRowHead(sc scenario) []string {
	where, contention := "one server", "none"
	if sc.cluster {
		where = "across slots"
	}
	if sc.shared {
		contention = strconv.Itoa(sc.workers) + " goroutines"
	}
	return []string{strconv.Itoa(sc.names), where, contention}
}

// columnOf returns the column of the peer tables with head.
func columnOf(head string) column {
	for _, c := range columns {
		if c.head == head {
			return c
		}
	}
	panic("no column " + head)
}

// loadedNote names the rounds of res in which the bare row ran below
// loadedBelow of its best round (same ctx): a loaded machine.
func loadedNote(res scenarioResult, figs map[variant][]figures) []string {
	var loaded []string
	for _, ctx := range res.ctxs {
		xs := bareRates(figs, ctx)
		if len(xs) == 0 {
			continue
		}
		best := slices.Max(xs)
		for _, i := range loadedRounds(xs, best) {
			loaded = append(loaded, fmt.Sprintf("%s round %d (%s against %s)", ctxLabel(ctx), i+1, thousands(xs[i]), thousands(best)))
		}
	}
	if len(loaded) == 0 {
		return nil
	}
	return []string{fmt.Sprintf("%s: **loaded rounds** (bare below %.1f × its best round, ratios squeezed toward 1): %s",
		res.scenario.name, loadedBelow, strings.Join(loaded, ", "))}
}
