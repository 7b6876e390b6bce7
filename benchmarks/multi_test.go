package main

import (
	"bytes"
	"io"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// multiSmokeRound is the set smoke test's round: longer than TestSmoke's,
// since on a loaded machine a worker may first run after a 20 ms round
// has ended, and then does nothing.
const multiSmokeRound = 100 * time.Millisecond

// TestMultiSmoke runs set scenarios (all on one server, two across slots)
// with every set library for one short round, on one server and on a private Redis Cluster, so that CI
// keeps the -multi harness compiling and working: no worker may see an
// error, an overlapping hold of a name or a fencing token that does not
// grow (run fails then), every variant must acquire, distlock and the bare
// pairs must never leave a job stuck, ObtainMulti must run on one server
// only, and the tables must have a row per scenario. An uncontended
// MultiMutex on one server must send one script to acquire and one to
// release (with one more command per acquisition of slack for a retried
// call on a slow machine; across slots, where it sends one per name, a
// round of a few acquisitions under -race is too short for a bound).
func TestMultiSmoke(t *testing.T) {
	for _, e := range envFlags {
		t.Setenv(e.env, "")
	}
	// Every one-server scenario, and one of each shape across slots: a
	// round on the Cluster costs a few seconds under -race.
	scenarios := []string{"set2-one-free", "set2-one-contended", "set8-one-free", "set8-one-contended",
		"set2-across-contended", "set8-across-free"}
	cfg, err := parseFlags([]string{"-multi", "-rounds", "1", "-round", multiSmokeRound.String(), "-scenarios", strings.Join(scenarios, ",")})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	cfg.out, cfg.progress = &out, io.Discard
	cfg.drain = smokeDrain
	cfg.commandstats = true
	runs, err := run(cfg)
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
	if got, want := len(runs), 1; got != want {
		t.Fatalf("got %d runs, want %d", got, want)
	}
	results := runs[0]
	if got, want := len(results), len(scenarios); got != want {
		t.Fatalf("got %d scenarios, want %d", got, want)
	}
	for _, res := range results {
		sc := res.scenario
		var libs []string
		for _, v := range res.variants {
			libs = append(libs, v.lib)
			samples := res.samples[v]
			if len(samples) != 1 {
				t.Errorf("%s %s: got %d rounds, want 1", sc.name, v.lib, len(samples))
				continue
			}
			s := samples[0]
			if len(s.waits)+s.late == 0 && s.stuck == 0 {
				t.Errorf("%s %s: no acquisition in a %v round and its drain", sc.name, v.lib, multiSmokeRound)
			}
			if s.stuck > 0 && v.lib != setObtainMulti {
				t.Errorf("%s %s: %d jobs stuck (%s)", sc.name, v.lib, s.stuck, s.keys)
			}
			if v.lib == setMulti && !sc.shared && !sc.cluster && len(s.waits) > 0 {
				if got, most := figuresOf(s, sc.hold).cmds, 3.0; got > most {
					t.Errorf("%s: MultiMutex sent %.2f commands per acquisition, want one script to acquire and one to release (at most %v)", sc.name, got, most)
				}
			}
		}
		want := []string{libBare, setMulti, setInOrder, setObtainMulti}
		if sc.cluster {
			want = want[:3]
		}
		if !slices.Equal(libs, want) {
			t.Errorf("%s: got libraries %v, want %v", sc.name, libs, want)
		}
		row := "| " + strings.Join(setRowHead(sc), " | ") + " | "
		if got := strings.Count(out.String(), row); got != 1+len(libs) {
			t.Errorf("%s: got %d rows starting %q, want %d (one of throughput, one of waits per library)", sc.name, got, row, 1+len(libs))
		}
	}
	for _, head := range []string{"### Throughput and commands", "### Waits, fairness and CPU", "the idle cluster itself"} {
		if !strings.Contains(out.String(), head) {
			t.Errorf("no %q in the report", head)
		}
	}
	if got, want := strings.Count(out.String(), "Redis's commands per acquisition (INFO commandstats"), len(scenarios); got != want {
		t.Errorf("got %d tables of commandstats, want %d", got, want)
	}
}

// TestSets checks the sets of names of the set scenarios: distinct names
// of the round; around a ring when contended (each set shares half its
// names with each neighbour, none with the set opposite); on a cluster,
// each name in a slot of its own, name j of a pool on primary j mod 3.
func TestSets(t *testing.T) {
	cl := &cluster{nodes: make([]*server, 3), ranges: [][][2]int{{{0, 5460}}, {{5461, 10922}}, {{10923, 16383}}}}
	v := variant{lib: setMulti, ctx: ctxBackground}
	for _, sc := range setScenarios {
		c := cl
		if !sc.cluster {
			c = nil
		}
		sets := sc.sets(v, "r1", c)
		if got, want := len(sets), sc.workers; got != want {
			t.Fatalf("%s: got %d sets, want %d", sc.name, got, want)
		}
		slots := map[int]string{}
		for i, set := range sets {
			if got, want := len(set), sc.names; got != want {
				t.Errorf("%s: set %d has %d names, want %d", sc.name, i, got, want)
			}
			for j, n := range set {
				if !strings.HasPrefix(n, "bench:"+sc.name+":"+v.lib+":"+v.ctx+":r1:") || strings.ContainsAny(n, "{}") {
					t.Errorf("%s: name %q is not of the round, or has a brace", sc.name, n)
				}
				if slices.Contains(set[:j], n) {
					t.Errorf("%s: set %d has %q twice", sc.name, i, n)
				}
				if c == nil {
					continue
				}
				slot := slotOf(n)
				if other, ok := slots[slot]; ok && other != n {
					t.Errorf("%s: %q and %q share slot %d", sc.name, n, other, slot)
				}
				slots[slot] = n
				// The pool index is the name's number, before any "." the
				// search for a slot added.
				num := n[strings.LastIndex(n, ":n")+2:]
				num, _, _ = strings.Cut(num, ".")
				k, _ := strconv.Atoi(num)
				if got, want := c.nodeOf(slot), k%3; got != want {
					t.Errorf("%s: %q on node %d, want %d", sc.name, n, got, want)
				}
			}
		}
		if !sc.shared {
			continue
		}
		shared := func(a, b []string) int {
			n := 0
			for _, x := range a {
				if slices.Contains(b, x) {
					n++
				}
			}
			return n
		}
		for i := range sets {
			next, opposite := sets[(i+1)%len(sets)], sets[(i+2)%len(sets)]
			if got, want := shared(sets[i], next), sc.names/2; got != want {
				t.Errorf("%s: sets %d and %d share %d names, want %d", sc.name, i, (i+1)%len(sets), got, want)
			}
			if got := shared(sets[i], opposite); got != 0 {
				t.Errorf("%s: sets %d and %d (opposite) share %d names, want none", sc.name, i, (i+2)%len(sets), got)
			}
		}
	}
}

// TestSlotOf checks the slot computation against CLUSTER KEYSLOT's answers
// (Redis's documentation: foo is in slot 12182, bar in 5061).
func TestSlotOf(t *testing.T) {
	for key, want := range map[string]int{"foo": 12182, "bar": 5061, "": 0} {
		if got := slotOf(key); got != want {
			t.Errorf("slotOf(%q): got %d, want %d", key, got, want)
		}
	}
}

func TestObtainMultiKeys(t *testing.T) {
	got := obtainMultiKeys([]string{"bench:s:l:c:r1:n0", "bench:s:l:c:r1:n3.2"})
	want := []string{"{bench:s:l:c:r1}:bench:s:l:c:r1:n0", "{bench:s:l:c:r1}:bench:s:l:c:r1:n3.2"}
	if !slices.Equal(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestParseFlagsMulti(t *testing.T) {
	for _, e := range envFlags {
		t.Setenv(e.env, "")
	}
	cfg, err := parseFlags([]string{"-multi"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cfg.scenarios, setScenarioNames()) || !slices.Equal(cfg.libs, setLibraryNames()) || !slices.Equal(cfg.ctxs, []string{ctxBackground}) {
		t.Errorf("-multi: got scenarios %v, libs %v, ctxs %v; want the set family's, background", cfg.scenarios, cfg.libs, cfg.ctxs)
	}
	if got, want := commandLine(cfg), "cd benchmarks && go run . -multi"; got != want {
		t.Errorf("commandLine: got %q, want %q", got, want)
	}
	cfg, err = parseFlags([]string{"-multi", "-scenarios", "set8-across-free,set2-one-free", "-libs", "mutexes,multimutex", "-ctx", "background,cancel", "-runs", "3"})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := commandLine(cfg), "cd benchmarks && go run . -multi -runs 3 -scenarios set2-one-free,set8-across-free -libs multimutex,mutexes -ctx background,cancel"; got != want {
		t.Errorf("commandLine: got %q, want %q", got, want)
	}
	for _, args := range [][]string{
		{"-multi", "-targets"},
		{"-multi", "-libs", "distlock"},
		{"-multi", "-scenarios", "serial"},
		{"-scenarios", "set2-one-free"},
	} {
		if _, err := parseFlags(args); err == nil {
			t.Errorf("parseFlags(%q): got no error, want one", args)
		}
	}
}
