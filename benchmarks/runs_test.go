package main

import (
	"bytes"
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

// fakeResult is a result of sc with the Background ctx only, made without
// Redis: for each library, the acquisitions of each round of 1 s, each
// costing Redis redisPerOp.
func fakeResult(sc scenario, acq map[string][]int, redisPerOp time.Duration) scenarioResult {
	res := scenarioResult{
		scenario: sc, ctxs: []string{ctxBackground},
		samples: map[variant][]sample{}, libs: map[string]*library{},
	}
	for _, lib := range []string{libBare, libDistlock, "redislock"} {
		rounds, ok := acq[lib]
		if !ok {
			continue
		}
		v := variant{lib: lib, ctx: ctxBackground}
		res.variants = append(res.variants, v)
		res.libs[lib] = &library{name: lib, client: clientRueidis}
		for _, n := range rounds {
			res.samples[v] = append(res.samples[v], sample{
				elapsed: time.Second, acq: []int{n}, waits: make([]time.Duration, n),
				redisCPU: time.Duration(n) * redisPerOp,
			})
		}
	}
	return res
}

func TestLoadedRounds(t *testing.T) {
	// 700 is exactly 0.7 × the best: not below it.
	if got, want := loadedRounds([]float64{1000, 690, 700, 950, 100}, 1000), []int{1, 4}; !slices.Equal(got, want) {
		t.Errorf("loadedRounds: got %v, want %v", got, want)
	}
	if got := loadedRounds(nil, 0); got != nil {
		t.Errorf("loadedRounds(nil): got %v, want none", got)
	}

	serial := scenarioOf("serial")
	loaded := fakeResult(serial, map[string][]int{libBare: {1000, 600, 950}, libDistlock: {500, 400, 480}}, 0)
	line := bareLine(loaded)
	for _, want := range []string{
		"Bare pair: 950 (600–1,000) pairs/s Background.",
		"1 of 3: Background round 2 (600 against 1,000)",
	} {
		if !strings.Contains(line, want) {
			t.Errorf("bareLine: got %q, want it to contain %q", line, want)
		}
	}

	quiet := fakeResult(serial, map[string][]int{libBare: {1000, 800, 950}, libDistlock: {500, 400, 480}}, 0)
	if got, want := bareLine(quiet), "none of 3."; !strings.HasSuffix(got, want) {
		t.Errorf("bareLine of a quiet run: got %q, want it to end %q", got, want)
	}
	if got := bareLine(fakeResult(serial, map[string][]int{libDistlock: {500}}, 0)); got != "" {
		t.Errorf("bareLine without a bare row: got %q, want nothing", got)
	}

	// The table shows the rate above itself, and ratios per round against
	// the bare pair of the same round: 0.5, 0.667, 0.505.
	var out bytes.Buffer
	printTable(&out, loaded)
	for _, want := range []string{
		"\n\n" + line + "\n\n| ctx | library | ops/s | × bare |",
		"| Background | **distlock** | 480 (400–500) | 0.51 (0.50–0.67) |",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table: got\n%s\nwant it to contain %q", out.String(), want)
		}
	}
}

func TestAcrossRuns(t *testing.T) {
	keys64 := scenarioOf("keys64")
	bare := []int{1000, 1000, 1000}
	runs := [][]scenarioResult{
		// distlock's medians over bare: 0.62, 0.58, 0.66; Redis CPU per
		// acquisition 30, 34, 31 µs.
		{fakeResult(keys64, map[string][]int{libBare: bare, libDistlock: {600, 620, 640}}, 30*time.Microsecond)},
		{fakeResult(keys64, map[string][]int{libBare: {1000, 450, 1000}, libDistlock: {550, 261, 700}}, 34*time.Microsecond)},
		{fakeResult(keys64, map[string][]int{libBare: bare, libDistlock: {700, 660, 650}}, 31*time.Microsecond)},
	}
	rs := []scenarioResult{runs[0][0], runs[1][0], runs[2][0]}
	v := variant{lib: libDistlock, ctx: ctxBackground}
	for _, c := range columnsOf(keys64, true) {
		worst, meds, ok := acrossRuns(c, rs, v)
		var want float64
		switch c.head {
		case "× bare":
			want = 0.58 // the lowest of 0.62, 0.58, 0.66
		case "Redis CPU/op":
			want = float64(34 * time.Microsecond) // the highest
		default:
			continue
		}
		if !ok || len(meds) != 3 || math.Abs(worst-want) > 1e-9 {
			t.Errorf("%s: got %v from %d runs (ok %v), want %v", c.head, worst, len(meds), ok, want)
		}
	}
	if _, _, ok := acrossRuns(columnsOf(keys64, true)[0], rs, variant{lib: "redislock", ctx: ctxBackground}); ok {
		t.Error("× bare of a library that did not run: got a figure, want none")
	}

	var out bytes.Buffer
	printAcrossRuns(&out, runs)
	for _, want := range []string{
		"## Across the 3 runs",
		"### " + keys64.title + ": 3 runs",
		"run 2 1,000 (1 of 3 rounds loaded)",
		"Loaded rounds (bare below 0.7 × the best round of all the runs): 1 of 9.",
		"| ctx | library | × bare, lowest (each run) | wait p99, highest (each run) | Redis CPU/op, highest (each run) |",
		"| Background | **distlock** | 0.58 (0.62, 0.58, 0.66) | 0.0 µs (0.0 µs, 0.0 µs, 0.0 µs) | 34 µs (30 µs, 34 µs, 31 µs) |",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("summary: got\n%s\nwant it to contain %q", out.String(), want)
		}
	}
}
