package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"
)

// holdFor is how long a contended scenario's holder works under the lock.
const holdFor = 100 * time.Microsecond

// Leads: how far ahead of a round's start it is set, so that every worker
// (or helper process, told over a pipe) is ready before it.
const (
	localLead  = 2 * time.Millisecond
	helperLead = 30 * time.Millisecond
)

// maxWarmUp bounds the unmeasured round each variant runs first.
const maxWarmUp = 200 * time.Millisecond

// config is what to run, from the flags.
type config struct {
	// runs is the number of full runs (every scenario, cfg.rounds rounds
	// each), one after the other; with more than one, the report ends with
	// the summary across them (printAcrossRuns).
	runs      int
	rounds    int
	round     time.Duration
	scenarios []string
	libs      []string
	ctxs      []string
	drain     time.Duration // roundSpec.Drain
	// commandstats has every round read INFO commandstats at its start and
	// end, for a table per scenario of what Redis ran per acquisition.
	commandstats bool
	// cpuprofile, if not empty, is the file of this process's CPU profile;
	// the helper processes of a scenario write theirs beside it.
	cpuprofile string
	// targets has each run's report end with the targets of issue 17.
	targets bool
	// multi runs the set scenarios (multi.go) instead of the peer
	// scenarios; scenarios and libs then name the set family's.
	multi bool

	out      io.Writer // the tables
	progress io.Writer // a line per scenario, a word per round
}

// scenario is one way of calling the locks.
type scenario struct {
	name  string
	title string
	// workers contend in this process, or procs processes with one worker
	// each.
	workers, procs int
	shared         bool          // all workers on one key (or sets that overlap): contention
	hold           time.Duration // busy work under the lock
	// names, in a set scenario (multi.go), is the size of each worker's
	// set; cluster puts its names on the private Redis Cluster, each in
	// a slot of its own.
	names   int
	cluster bool
}

var scenarios = []scenario{
	{name: "serial", title: "1. Serial Lock + Release, one goroutine, no contention", workers: 1},
	{name: "keys64", title: "2. 64 goroutines on 64 keys, no contention", workers: 64},
	{name: "goroutines8", title: "3. 8 goroutines on one key, each holding it 100 µs", workers: 8, shared: true, hold: holdFor},
	{name: "processes8", title: "4. 8 processes on one key, each holding it 100 µs", procs: 8, shared: true, hold: holdFor},
}

func scenarioNames() []string {
	names := make([]string, len(scenarios))
	for i, s := range scenarios {
		names[i] = s.name
	}
	return names
}

func scenarioOf(name string) scenario {
	for _, s := range slices.Concat(scenarios, setScenarios) {
		if s.name == name {
			return s
		}
	}
	panic("unknown scenario " + name) // parseFlags checked the names
}

// contenders is the number of workers in all.
func (s scenario) contenders() int { return max(s.workers, s.procs) }

// variant is one row of a scenario's table: a library with a Lock ctx.
type variant struct {
	lib, ctx string
}

// keys returns the keys of v's workers in the round tagged tag: a
// namespace of their own for every scenario, variant and round.
func (s scenario) keys(v variant, tag string) []string {
	prefix := strings.Join([]string{"bench", s.name, v.lib, v.ctx, tag}, ":")
	keys := make([]string, s.contenders())
	for i := range keys {
		keys[i] = prefix + ":k"
		if !s.shared {
			keys[i] += strconv.Itoa(i)
		}
	}
	return keys
}

// sample is what one round of one variant measured.
type sample struct {
	elapsed    time.Duration
	acq        []int // per contender
	waits      []time.Duration
	unfinished []time.Duration
	// handoffs, in a contended scenario, are the gaps between one hold's
	// end and the next hold's start (handoffsOf).
	handoffs  []time.Duration
	cmds      int64
	hookCmds  int64 // processed by go-redis, by its hook (0 on rueidis)
	redisCPU  time.Duration
	redisCmds commandStats  // with -commandstats: INFO commandstats over the round
	clientCPU time.Duration // holds included
	gaveUp    int
	stuck     int
	late      int // jobs that held the lock only after the end
	overlaps  int
	errs      []string
	stuckKeys []string
	// keys describes the round's keys in Redis, after a round with an
	// error or a stuck job: those of the first stuck job's key, or of the
	// round's first key.
	keys string
}

// add merges a process's result into s.
func (s *sample) add(r localResult) {
	s.acq = append(s.acq, r.Acq...)
	s.waits = append(s.waits, r.Waits...)
	s.unfinished = append(s.unfinished, r.Unfinished...)
	s.cmds += r.Cmds
	s.hookCmds += r.HookCmds
	s.clientCPU += r.CPU
	s.gaveUp += r.GaveUp
	s.stuck += r.Stuck
	s.late += r.Late
	s.overlaps += r.Overlaps
	s.errs = append(s.errs, r.Errs...)
	s.stuckKeys = append(s.stuckKeys, r.StuckKeys...)
}

// startWithAdmin starts a private redis-server and an admin client of it
// (INFO, CONFIG), and returns the function that stops both.
func startWithAdmin() (*server, rueidis.Client, func(), error) {
	srv, err := startServer()
	if err != nil {
		return nil, nil, nil, err
	}
	admin, err := rueidis.NewClient(rueidis.ClientOption{
		InitAddress: []string{srv.addr}, DisableCache: true, ForceSingleClient: true,
	})
	if err != nil {
		srv.stop()
		return nil, nil, nil, err
	}
	return srv, admin, func() { admin.Close(); srv.stop() }, nil
}

// run runs the configured scenarios cfg.runs times and prints their
// tables, and with more than one run the summary across the runs. It
// returns the results by run, then by scenario. It fails if a worker saw
// an error (a stuck job is reported in the table, not as an error: the
// smoke test checks distlock's own).
func run(cfg config) ([][]scenarioResult, error) {
	if cfg.multi {
		return runSets(cfg)
	}
	srv, admin, stop, err := startWithAdmin()
	if err != nil {
		return nil, err
	}
	defer stop()
	libs, err := openLibraries(srv.addr, cfg.libs)
	if err != nil {
		return nil, err
	}
	defer closeLibraries(libs)

	printHeader(cfg, admin)
	return runEach(cfg, func(sc scenario, n int) (scenarioResult, error) {
		res, err := runScenario(cfg, sc, libs, admin, n)
		if err == nil {
			printTable(cfg.out, res)
			printCommandStats(cfg.out, res)
		}
		return res, err
	}, func(results []scenarioResult) {
		if cfg.targets {
			printTargets(cfg.out, results, cfg.ctxs)
		}
	})
}

// runEach runs every scenario of cfg, cfg.runs times, with one (sc's
// results of run n), under a heading per run when there are several, and
// calls after with each run's results; with several runs it then prints
// the summary across them. It returns the results by run, then by
// scenario, and the errors the workers saw.
func runEach(cfg config, one func(sc scenario, n int) (scenarioResult, error), after func([]scenarioResult)) ([][]scenarioResult, error) {
	var (
		runs     [][]scenarioResult
		failures []error
	)
	for n := range cfg.runs {
		if cfg.runs > 1 {
			fmt.Fprintf(cfg.out, "\n## Run %d of %d\n", n+1, cfg.runs)
		}
		var results []scenarioResult
		for _, name := range cfg.scenarios {
			sc := scenarioOf(name)
			res, err := one(sc, n)
			if err != nil {
				return append(runs, results), fmt.Errorf("%s: %w", sc.name, err)
			}
			results = append(results, res)
			failures = append(failures, res.failures()...)
		}
		after(results)
		runs = append(runs, results)
	}
	if cfg.runs > 1 {
		printAcrossRuns(cfg.out, runs)
	}
	return runs, errors.Join(failures...)
}

// scenarioResult holds a scenario's samples, per variant and round.
type scenarioResult struct {
	scenario scenario
	drain    time.Duration
	ctxs     []string // the Lock ctx kinds, in the tables' order
	variants []variant
	samples  map[variant][]sample
	libs     map[string]*library
}

// failures returns an error for each sample that saw one.
func (r scenarioResult) failures() []error {
	var errs []error
	for _, v := range r.variants {
		for i, s := range r.samples[v] {
			for _, e := range s.errs {
				errs = append(errs, fmt.Errorf("%s: %s %s round %d: %s (%s)", r.scenario.name, v.lib, v.ctx, i+1, e, s.keys))
			}
			if s.overlaps > 0 {
				errs = append(errs, fmt.Errorf("%s: %s %s round %d: %d acquisitions while another worker held the key", r.scenario.name, v.lib, v.ctx, i+1, s.overlaps))
			}
		}
	}
	return errs
}

// runScenario runs a warm-up round and cfg.rounds measured rounds of every
// variant of sc, interleaved: round r of every variant, then round r+1 in
// the reverse order, so that no variant always follows the same one. run
// is the number of the full run (from 0), which the keys' names include.
func runScenario(cfg config, sc scenario, libs map[string]*library, admin rueidis.Client, run int) (scenarioResult, error) {
	res := scenarioResult{scenario: sc, drain: cfg.drain, ctxs: cfg.ctxs, samples: map[variant][]sample{}, libs: libs}
	for _, ctx := range cfg.ctxs {
		for _, name := range cfg.libs {
			spec, _ := specOf(name)
			if spec.contendedOnly && !sc.shared {
				continue
			}
			res.variants = append(res.variants, variant{lib: name, ctx: ctx})
		}
	}
	measure := func(v variant, tag string, d time.Duration) (sample, error) {
		return measureLocal(sc, libs[v.lib], v, tag, d, cfg, admin), nil
	}
	if sc.procs > 0 {
		profile := ""
		if cfg.cpuprofile != "" {
			profile = cfg.cpuprofile + "." + sc.name
		}
		hs, err := startHelpers(sc.procs, addrOf(admin), cfg.libs, profile)
		if err != nil {
			return res, err
		}
		defer func() { _ = stopHelpers(hs) }()
		measure = func(v variant, tag string, d time.Duration) (sample, error) {
			return measureHelpers(sc, hs, v, tag, d, cfg, admin)
		}
	}
	return res, runRounds(cfg, &res, run, measure)
}

// runRounds runs a warm-up round and cfg.rounds measured rounds of every
// variant of res with measure, interleaved: round r of every variant,
// then round r+1 in the reverse order, so that no variant always follows
// the same one. It adds the measured samples to res. run is the number of
// the full run (from 0), which the round's tag (the keys' names) includes.
func runRounds(cfg config, res *scenarioResult, run int, measure func(v variant, tag string, d time.Duration) (sample, error)) error {
	warmUp := min(cfg.round, maxWarmUp)
	prefix := "run" + strconv.Itoa(run+1) + ":"
	if cfg.runs > 1 {
		fmt.Fprintf(cfg.progress, "run %d of %d: ", run+1, cfg.runs)
	}
	fmt.Fprintf(cfg.progress, "%s: warm-up, rounds of %d:", res.scenario.name, cfg.rounds)
	defer fmt.Fprintln(cfg.progress)
	for _, v := range res.variants {
		if _, err := measure(v, prefix+"warm", warmUp); err != nil {
			return err
		}
	}
	order := slices.Clone(res.variants)
	for r := range cfg.rounds {
		fmt.Fprintf(cfg.progress, " %d", r+1)
		for _, v := range order {
			s, err := measure(v, prefix+"r"+strconv.Itoa(r+1), cfg.round)
			if err != nil {
				return err
			}
			res.samples[v] = append(res.samples[v], s)
		}
		slices.Reverse(order)
	}
	return nil
}

// addrOf returns the address of the admin client's server.
func addrOf(admin rueidis.Client) string {
	for addr := range admin.Nodes() {
		return addr
	}
	return ""
}

// measureLocal runs one round of v in this process.
func measureLocal(sc scenario, lib *library, v variant, tag string, d time.Duration, cfg config, admin rueidis.Client) sample {
	start := time.Now().Add(localLead)
	spec := roundSpec{
		Lib: v.lib, Ctx: v.ctx, Keys: sc.keys(v, tag), Hold: sc.hold,
		Start: start.UnixNano(), End: start.Add(d).UnixNano(), Drain: cfg.drain, Spans: sc.shared,
	}
	redis := watchRedis([]rueidis.Client{admin}, start, start.Add(d), cfg.commandstats)
	r := runLocal(lib, spec)
	u := <-redis
	s := sample{elapsed: d, redisCPU: u.cpu, redisCmds: u.cmds, handoffs: handoffsOf(r.Spans)}
	s.add(r)
	s.describeKeys(admin, spec.Keys[0])
	return s
}

// describeKeys sets s.keys after a round with an error or a stuck job:
// the keys of the first stuck job, else those of the round's key first.
func (s *sample) describeKeys(admin rueidis.Client, first string) {
	if len(s.errs) == 0 && s.stuck == 0 {
		return
	}
	if len(s.stuckKeys) > 0 {
		first = s.stuckKeys[0]
	}
	s.keys = keysOf(admin, first)
}

// keysOf describes the keys in Redis whose name contains key's: a lock's
// own keys, whatever the library adds to the name, with their TTLs. It
// tells a failed round's lock still held from one lost track of.
func keysOf(admin rueidis.Client, key string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var found []string
	for cursor := uint64(0); ; {
		e, err := admin.Do(ctx, admin.B().Scan().Cursor(cursor).Match("*"+key+"*").Count(1000).Build()).AsScanEntry()
		if err != nil {
			return "keys: " + err.Error()
		}
		for _, k := range e.Elements {
			ttl, _ := admin.Do(ctx, admin.B().Pttl().Key(k).Build()).AsInt64()
			found = append(found, fmt.Sprintf("%s (PTTL %d ms)", k, ttl))
		}
		if cursor = e.Cursor; cursor == 0 {
			break
		}
	}
	if len(found) == 0 {
		return "no key of the round in Redis"
	}
	return "keys of the round in Redis: " + strings.Join(found, ", ")
}

// measureHelpers runs one round of v in the helper processes, one worker
// each, and checks that no two of their holds overlapped.
func measureHelpers(sc scenario, hs []*helper, v variant, tag string, d time.Duration, cfg config, admin rueidis.Client) (sample, error) {
	start := time.Now().Add(helperLead)
	spec := roundSpec{
		Lib: v.lib, Ctx: v.ctx, Keys: sc.keys(v, tag)[:1], Hold: sc.hold,
		Start: start.UnixNano(), End: start.Add(d).UnixNano(), Drain: cfg.drain, Spans: true,
	}
	for _, h := range hs {
		if err := h.send(spec); err != nil {
			return sample{}, err
		}
	}
	redis := watchRedis([]rueidis.Client{admin}, start, start.Add(d), cfg.commandstats)
	s := sample{elapsed: d}
	var spans []span
	for _, h := range hs {
		r, err := h.result()
		if err != nil {
			<-redis // its goroutine ends by the round's end
			return sample{}, err
		}
		s.add(r)
		spans = append(spans, r.Spans...)
	}
	u := <-redis
	s.redisCPU, s.redisCmds = u.cpu, u.cmds
	s.describeKeys(admin, spec.Keys[0])
	s.handoffs = handoffsOf(spans)
	slices.SortFunc(spans, func(a, b span) int { return cmp.Compare(a.Held, b.Held) })
	for i := 1; i < len(spans); i++ {
		if spans[i].Held < spans[i-1].Freed {
			s.overlaps++
		}
	}
	return s, nil
}

// handoffsOf returns the hand-offs of a round's holds of one key: for
// each hold but the first, the time from the end of the hold before it
// (the holder's work done, its release about to be called) to its start
// (the next holder's Lock returned), in the order of the holds. Holds that
// overlap (counted as such elsewhere) give no hand-off. A fair lock's
// rate is about 1 / (hold + hand-off), so this is where a contended
// scenario's time goes besides the holds: the release's round trip, the
// pass in Redis, the next holder's wake-up.
func handoffsOf(spans []span) []time.Duration {
	spans = slices.Clone(spans)
	slices.SortFunc(spans, func(a, b span) int { return cmp.Compare(a.Held, b.Held) })
	var gaps []time.Duration
	for i := 1; i < len(spans); i++ {
		if g := spans[i].Held - spans[i-1].Freed; g >= 0 {
			gaps = append(gaps, time.Duration(g))
		}
	}
	return gaps
}

// redisUsage is what the server spent over a round.
type redisUsage struct {
	cpu  time.Duration // -1 if it could not be read
	cmds commandStats  // nil unless asked for, or if it could not be read
}

// watchRedis samples the CPU time of the servers of admins (one client
// per server; their sum) at start and end (and, if stats is true, their
// INFO commandstats after each), in a goroutine of its own, and sends the
// differences on the channel it returns, which has room for them. The
// caller receives from it: that is the goroutine's wait.
func watchRedis(admins []rueidis.Client, start, end time.Time, stats bool) <-chan redisUsage {
	ch := make(chan redisUsage, 1)
	go func() {
		time.Sleep(time.Until(start))
		a, errA := redisCPUOf(admins)
		var sa commandStats
		if stats {
			sa = readCommandStatsOf(admins)
		}
		time.Sleep(time.Until(end))
		z, errZ := redisCPUOf(admins)
		u := redisUsage{cpu: z - a}
		if errA != nil || errZ != nil {
			u.cpu = -1
		}
		if stats {
			u.cmds = readCommandStatsOf(admins).minus(sa)
		}
		ch <- u
	}()
	return ch
}

// redisCPUOf returns the sum of redisCPU over the servers of admins.
func redisCPUOf(admins []rueidis.Client) (time.Duration, error) {
	var sum time.Duration
	for _, a := range admins {
		cpu, err := redisCPU(a)
		if err != nil {
			return 0, err
		}
		sum += cpu
	}
	return sum, nil
}

// redisCPU returns used_cpu_sys + used_cpu_user from INFO cpu.
func redisCPU(admin rueidis.Client) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	info, err := admin.Do(ctx, admin.B().Info().Section("cpu").Build()).ToString()
	if err != nil {
		return 0, err
	}
	var sum float64
	n := 0
	for line := range strings.Lines(info) {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && (k == "used_cpu_sys" || k == "used_cpu_user") {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return 0, fmt.Errorf("INFO cpu: %s: %w", k, err)
			}
			sum += f
			n++
		}
	}
	if n != 2 {
		return 0, errors.New("INFO cpu: no used_cpu_sys and used_cpu_user")
	}
	return time.Duration(sum * float64(time.Second)), nil
}
