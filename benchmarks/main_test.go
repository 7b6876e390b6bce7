package main

import (
	"bytes"
	"io"
	"os"
	"strings"
	"testing"
	"time"
)

// TestMain runs the helper processes of the processes8 scenario: this test
// binary, started again with roleVar set.
func TestMain(m *testing.M) {
	if role := os.Getenv(roleVar); role != "" {
		os.Exit(runHelper(role))
	}
	os.Exit(m.Run())
}

// The smoke test's one round per variant, and how long a job may go on
// after it (redsync's retries take up to 250 ms).
const (
	smokeRound = 20 * time.Millisecond
	smokeDrain = time.Second
)

// TestSmoke runs every scenario with every library and both contexts for
// one short round, so that CI keeps the harness compiling and working: no
// worker may see an error or an overlap, every variant must acquire (in
// the round, or after its end: a loaded machine under -race can take
// longer than a round for the first Lock), and distlock and the bare
// commands must never leave a job stuck. Other libraries may (see
// openRueidislock for rueidislock's lost wake-up).
func TestSmoke(t *testing.T) {
	for _, e := range envFlags {
		t.Setenv(e.env, "") // the defaults, whatever the environment says
	}
	cfg, err := parseFlags([]string{"-rounds", "1", "-round", smokeRound.String()})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	cfg.out, cfg.progress = &out, io.Discard
	cfg.drain = smokeDrain
	results, err := run(cfg)
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
	if got, want := len(results), len(scenarios); got != want {
		t.Fatalf("got %d scenarios, want %d", got, want)
	}
	for _, res := range results {
		for _, v := range res.variants {
			samples := res.samples[v]
			if len(samples) != 1 {
				t.Errorf("%s %s %s: got %d rounds, want 1", res.scenario.name, v.lib, v.ctx, len(samples))
				continue
			}
			s := samples[0]
			if len(s.waits)+s.late == 0 && s.stuck == 0 {
				t.Errorf("%s %s %s: no acquisition in a %v round and its drain", res.scenario.name, v.lib, v.ctx, smokeRound)
			}
			if s.stuck > 0 && (v.lib == "distlock" || strings.HasPrefix(v.lib, libBare)) {
				t.Errorf("%s %s %s: %d jobs stuck (%s)", res.scenario.name, v.lib, v.ctx, s.stuck, s.keys)
			}
		}
		if !strings.Contains(out.String(), "### "+res.scenario.title) {
			t.Errorf("no table for %s", res.scenario.name)
		}
	}
}

func TestParseFlags(t *testing.T) {
	for _, e := range envFlags {
		t.Setenv(e.env, "")
	}
	for _, args := range [][]string{
		{"-rounds", "0"},
		{"-round", "-1s"},
		{"-scenarios", "serial,nope"},
		{"-libs", ""},
		{"-ctx", "todo"},
		{"extra"},
	} {
		if _, err := parseFlags(args); err == nil {
			t.Errorf("parseFlags(%q): got no error, want one", args)
		}
	}
	cfg, err := parseFlags([]string{"-scenarios", "keys64,serial", "-libs", "distlock"})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(cfg.scenarios, ","), "serial,keys64"; got != want {
		t.Errorf("scenarios: got %q, want %q (the tables' order)", got, want)
	}
	if got, want := commandLine(cfg), "cd benchmarks && go run . -scenarios serial,keys64 -libs distlock"; got != want {
		t.Errorf("commandLine: got %q, want %q", got, want)
	}
}
