// Command benchmarks measures distlock against the locks users would pick
// instead, side by side against one private redis-server, and prints a
// markdown table per scenario, ready to paste into BENCHMARKS.md:
//
//	cd benchmarks && go run .                     # every scenario, 5 rounds of 500ms (about 3 minutes)
//	go run . -runs 3                              # three full runs and the least favourable median of each figure:
//	                                              # what BENCHMARKS.md's headline takes (about 10 minutes)
//	go run . -scenarios serial,keys64 -rounds 9   # some scenarios, more rounds
//	go run . -libs bare,distlock -round 1s        # some libraries, longer rounds
//	go run . -libs distlock-goredis -scenarios serial -commandstats -cpuprofile /tmp/cpu.pprof
//	                                              # where one library's time goes
//	go run . -multi                               # the set scenarios instead: locks over several names (about 90 s)
//
// It is a module of its own (github.com/distkit-go/distlock/benchmarks), so
// that distlock never depends on the peers it is measured against; its go.mod
// replaces distlock with the tree it sits in, so it measures that code.
//
// # What it runs
//
// Each library is called as a worker calls it: for every job a new Mutex
// (or locker object, where the library has one) and a blocking Lock with the
// library's own way of waiting; the job's context is context.Background() in
// one variant and a context.WithCancel of it in the other (what workers
// pass); distlock releases with context.WithoutCancel(ctx), the README's
// idiom. The libraries and how they are configured are listed in catalog
// (libraries.go) and in the output.
//
// The scenarios (the -scenarios names):
//
//   - serial: one goroutine, Lock and Release on one key, no contention;
//   - keys64: 64 goroutines, a key each, in parallel, no contention;
//   - goroutines8: 8 goroutines of this process on one key, each holding it
//     for 100µs of busy work;
//   - processes8: 8 processes on one key, the same way, each with a client
//     of its own: this binary started again with a role in its environment
//     (see procs.go).
//
// A hold is busy work, never a sleep: a sleep shorter than a millisecond
// lasts a whole millisecond on an otherwise idle Linux process.
//
// # Locks over several names (-multi)
//
// -multi runs another family of scenarios instead (multi.go): distlock's
// MultiMutex against the names' Mutexes taken one after the other in
// sorted order and against bsm/redislock's ObtainMulti, each against the
// bare pair taken once per name, with sets of 2 and 8 names, on one
// server (one script per acquisition) and across the slots of a private
// three-primary Redis Cluster (cluster.go; one script per slot),
// uncontended and with 4 goroutines on overlapping sets. -scenarios and
// -libs then take the set scenarios' and libraries' names (set2-one-free
// ... set8-across-contended; bare, multimutex, mutexes, obtainmulti), and
// -ctx defaults to background alone. It prints one table of rates, ratios
// and commands per acquisition for all the rows, and one of waits,
// fairness and CPU; -runs, -rounds, -round and -commandstats apply as
// above.
//
// # How it measures
//
// Rounds alternate across libraries and contexts (every variant's round 1,
// then every variant's round 2 in the reverse order, and so on), so that all
// of them see the same moments of the machine, and every round of every
// variant uses keys of its own. Before its first round each variant runs one
// unmeasured warm-up round (connections dialled, scripts loaded). Each figure
// is computed per round, and the table shows its median over the rounds with
// the spread (min–max) in brackets. Above each table stands the bare pair's
// own rate (pairs/s), since a loaded machine squeezes every ratio toward 1
// (the round trip and the waits for a CPU, which every library pays alike,
// grow; each library's own work does not); a round whose bare rate is
// below 0.7 of the best bare round of the scenario with the same ctx is
// named there as loaded (loadedBelow, runs.go). The figures:
//
//   - ops/s: acquisitions (each followed by its release) per second;
//   - × bare: ops/s over that of the bare SET NX PX + DEL on rueidis in the
//     same round with the same context; × own client: over the bare commands
//     sent through the library's own client (rueidis or go-redis);
//   - wait p50, p99, worst: from calling Lock to holding the lock;
//   - hand-off p50, p90 (contended scenarios): from the end of one hold's
//     work (its release about to be called) to the next holder's Lock
//     return, whoever it is; a fair lock's rate is about 1 / (hold +
//     hand-off), so this is the lock's own share of the critical path;
//   - fairness (contended scenarios): the fewest acquisitions of one
//     contender over the most;
//   - cmds/op: Redis commands per acquisition, counted on the client (a
//     counting net.Conn under each client; a script is one command);
//   - hook cmds/op, for the go-redis rows: the commands go-redis processed
//     per acquisition, counted by a hook on the client (each command of a
//     pipeline; a command go-redis retries, once; not the commands of a
//     subscription or of a new connection's handshake, which the wire count
//     has);
//   - Redis CPU/op: used_cpu_sys + used_cpu_user of the private server (INFO
//     cpu) over the round, per acquisition;
//   - client CPU/op: the CPU time of the process (getrusage), or of the
//     contending processes together, over the round, less the busy holds
//     (100µs for each acquisition), per acquisition.
//
// The go-redis rows (bare-goredis, distlock-goredis through the adapter
// module github.com/distkit-go/distlock/goredis, redislock, redsync) each
// have a client of their own with one configuration, goRedisOptions:
// go-redis's defaults, written out.
//
// A job that is still in a library's Lock 3 s after its round's end (a
// peer's lost wake-up, say) is counted as stuck, reported in one line under
// its table and abandoned: its ctx is cancelled if it can be, and what it
// does afterwards is not recorded.
//
// # Figures that hold
//
// One run's medians move with the machine. -runs n repeats the whole run n
// times, one after the other, and ends with a summary per scenario: for
// each variant, the least favourable of the runs' medians of × bare,
// fairness, wait p99 and Redis CPU/op (the lowest ratio and fairness, the
// highest wait and CPU), with each run's median beside it, and each run's
// bare rate with its loaded rounds against the best bare round of all the
// runs. BENCHMARKS.md's headline is that summary of `go run . -runs 3` on
// a quiet machine.
//
// -targets ends each run's report with the targets of issue 17 for
// distlock on go-redis (targets.go): ratios to redsync, to distlock on
// rueidis and to spinning on go-redis, fairness and commands per
// acquisition, each as its median (min–max) over the rounds.
//
// Two flags help find where a library's time goes: -commandstats follows
// each table with what Redis ran per acquisition (INFO commandstats, by
// command), and -cpuprofile writes a CPU profile of this process (the
// serial, keys64 and goroutines8 scenarios run in it) and of each helper
// process (processes8). Profile one library at a time (-libs).
//
// Flags override the environment variables DISTLOCK_BENCH_ROUNDS,
// DISTLOCK_BENCH_ROUND, DISTLOCK_BENCH_SCENARIOS and DISTLOCK_BENCH_LIBS.
//
// `go test ./...` in this directory runs every scenario with every library
// for one short round (see main_test.go), so that CI keeps the harness
// compiling and working.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"runtime/pprof"
	"strings"
	"time"
)

// Defaults of the flags.
const (
	defaultRounds = 5
	defaultRound  = 500 * time.Millisecond
)

func main() {
	if role := os.Getenv(roleVar); role != "" {
		os.Exit(runHelper(role))
	}
	cfg, err := parseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchmarks:", err)
		os.Exit(2)
	}
	cfg.out, cfg.progress = os.Stdout, os.Stderr
	stop, err := startCPUProfile(cfg.cpuprofile)
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchmarks:", err)
		os.Exit(2)
	}
	_, err = run(cfg)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchmarks:", err)
		os.Exit(1)
	}
}

// startCPUProfile starts a CPU profile of this process into the file
// path, if path is not empty, and returns the function that ends it.
func startCPUProfile(path string) (stop func(), err error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "benchmarks: CPU profile:", err)
		}
	}, nil
}

// parseFlags reads the command line, with defaults from the environment.
func parseFlags(args []string) (config, error) {
	fs := flag.NewFlagSet("benchmarks", flag.ContinueOnError)
	runs := fs.Int("runs", 1, "full runs, one after the other, then the least favourable median of each figure across them (BENCHMARKS.md's headline: -runs 3)")
	rounds := fs.Int("rounds", defaultRounds, "measured rounds per variant (the tables show the median and min–max)")
	round := fs.Duration("round", defaultRound, "length of one round")
	scenarios := fs.String("scenarios", strings.Join(scenarioNames(), ","), "comma-separated scenarios to run")
	libs := fs.String("libs", strings.Join(libraryNames(), ","), "comma-separated libraries to run")
	ctxs := fs.String("ctx", strings.Join(ctxKinds, ","), "comma-separated Lock contexts: "+strings.Join(ctxKinds, ", "))
	commandstats := fs.Bool("commandstats", false, "after each table, what Redis ran per acquisition (INFO commandstats)")
	targets := fs.Bool("targets", false, "end each run's report with the targets of issue 17 for distlock on go-redis")
	cpuprofile := fs.String("cpuprofile", "", "write this process's CPU profile to `file`, and each helper's to file.<scenario>.<n>")
	multi := fs.Bool("multi", false, "run the set scenarios (locks over several names: "+strings.Join(setScenarioNames(), ", ")+
		") with their libraries ("+strings.Join(setLibraryNames(), ", ")+") instead; -ctx defaults to background")
	for _, e := range envFlags {
		if v := os.Getenv(e.env); v != "" {
			if err := fs.Set(e.flag, v); err != nil {
				return config{}, fmt.Errorf("%s=%q: %v", e.env, v, err)
			}
		}
	}
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	if fs.NArg() > 0 {
		return config{}, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	cfg := config{
		runs: *runs, rounds: *rounds, round: *round, drain: drainTimeout,
		commandstats: *commandstats, cpuprofile: *cpuprofile, targets: *targets, multi: *multi,
	}
	if cfg.runs < 1 || cfg.rounds < 1 || cfg.round <= 0 {
		return config{}, fmt.Errorf("-runs %d -rounds %d -round %v: want at least one run of at least one round of some length", cfg.runs, cfg.rounds, cfg.round)
	}
	knownScenarios, knownLibs := scenarioNames(), libraryNames()
	if cfg.multi {
		if cfg.targets {
			return config{}, errors.New("-targets is for the peer scenarios, not -multi")
		}
		knownScenarios, knownLibs = setScenarioNames(), setLibraryNames()
		// The flags left at their defaults name the set family's.
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		if !set["scenarios"] {
			*scenarios = strings.Join(knownScenarios, ",")
		}
		if !set["libs"] {
			*libs = strings.Join(knownLibs, ",")
		}
		if !set["ctx"] {
			*ctxs = ctxBackground
		}
	}
	var err error
	if cfg.scenarios, err = pick("scenario", *scenarios, knownScenarios); err != nil {
		return config{}, err
	}
	if cfg.libs, err = pick("library", *libs, knownLibs); err != nil {
		return config{}, err
	}
	if cfg.ctxs, err = pick("context", *ctxs, ctxKinds); err != nil {
		return config{}, err
	}
	return cfg, nil
}

// pick splits a comma-separated list and checks every name against known,
// returning them in known's order.
func pick(what, list string, known []string) ([]string, error) {
	want := map[string]bool{}
	for name := range strings.SplitSeq(list, ",") {
		if name = strings.TrimSpace(name); name == "" {
			continue
		}
		want[name] = true
	}
	var out []string
	for _, k := range known {
		if want[k] {
			out = append(out, k)
			delete(want, k)
		}
	}
	for name := range want {
		return nil, fmt.Errorf("unknown %s %q (known: %s)", what, name, strings.Join(known, ", "))
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no %s selected", what)
	}
	return out, nil
}

// envFlags are the environment variables that set a flag's default; the
// command line overrides them.
var envFlags = []struct{ env, flag string }{
	{"DISTLOCK_BENCH_ROUNDS", "rounds"},
	{"DISTLOCK_BENCH_ROUND", "round"},
	{"DISTLOCK_BENCH_SCENARIOS", "scenarios"},
	{"DISTLOCK_BENCH_LIBS", "libs"},
}
