package main

import (
	"bytes"
	"io"
	"maps"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
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
// after it: redsync's retries take up to 250 ms, and a loaded 2-core
// machine under -race took over a second for a round's first Lock on a
// fresh connection (every job drained by then ends the wait at once; only
// a stuck one waits all of it).
const (
	// 50 ms: beside two busy loops, a peer's round of 20 ms once ended
	// before its workers had made a single call.
	smokeRound = 50 * time.Millisecond
	smokeDrain = drainTimeout
)

// TestSmoke runs every scenario with every library and both contexts for
// one short round, so that CI keeps the harness compiling and working: no
// worker may see an error or an overlap, every variant must acquire (in
// the round, or after its end: a loaded machine under -race can take
// longer than a round for the first Lock), distlock on either client and
// the bare commands must never leave a job stuck (other libraries may: see
// openRueidislock for rueidislock's lost wake-up), the go-redis rows'
// hook must have counted their commands, every table must show the bare
// pair's rate, and with -targets the report must end with issue 17's
// targets.
func TestSmoke(t *testing.T) {
	for _, e := range envFlags {
		t.Setenv(e.env, "") // the defaults, whatever the environment says
	}
	cfg, err := parseFlags([]string{"-rounds", "1", "-round", smokeRound.String(), "-targets"})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	cfg.out, cfg.progress = &out, io.Discard
	cfg.drain = smokeDrain
	cfg.commandstats = true // its reads cost a round nothing that matters here
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
			if s.stuck > 0 && (strings.HasPrefix(v.lib, libDistlock) || strings.HasPrefix(v.lib, libBare)) {
				t.Errorf("%s %s %s: %d jobs stuck (%s)", res.scenario.name, v.lib, v.ctx, s.stuck, s.keys)
			}
			goRedis := res.libs[v.lib].client == clientGoRedis
			if goRedis && len(s.waits) > 0 && s.hookCmds == 0 {
				t.Errorf("%s %s %s: %d acquisitions, but the go-redis hook counted no command", res.scenario.name, v.lib, v.ctx, len(s.waits))
			}
			if !goRedis && s.hookCmds != 0 {
				t.Errorf("%s %s %s: a rueidis row with %d commands counted by a go-redis hook", res.scenario.name, v.lib, v.ctx, s.hookCmds)
			}
		}
		if !strings.Contains(out.String(), "### "+res.scenario.title+"\n\nBare pair: ") {
			t.Errorf("no table for %s, or no bare rate above it", res.scenario.name)
		}
		if s := res.samples[variant{lib: libDistlockGoRedis, ctx: ctxBackground}]; len(s) == 1 && len(s[0].waits) > 0 && s[0].redisCmds["evalsha"].calls == 0 {
			t.Errorf("%s: distlock-goredis acquired %d times in its round, but the round's commandstats have no EVALSHA: %v",
				res.scenario.name, len(s[0].waits), s[0].redisCmds)
		}
	}
	if got, want := strings.Count(out.String(), "Redis's commands per acquisition (INFO commandstats"), len(scenarios); got != want {
		t.Errorf("got %d tables of commandstats, want %d", got, want)
	}
	// Every goal has a row per context (a round of one variant of each
	// scenario, so each of them has its figure).
	_, targets, ok := strings.Cut(out.String(), "### Targets of issue 17")
	if !ok {
		t.Fatal("no table of issue 17's targets")
	}
	for _, g := range goals {
		for _, ctx := range ctxKinds {
			row := "| " + g.scenario + " | " + ctxLabel(ctx) + " | " + g.figure + " | " + g.target() + " | "
			if !strings.Contains(targets, row) {
				t.Errorf("targets: no row %q", row)
			}
		}
	}
}

// TestGoRedisOptions checks that the go-redis rows share one client
// configuration and that it is go-redis's defaults, as the catalog says:
// a client made with goRedisOptions has the options go-redis gives a
// client made with the address alone.
func TestGoRedisOptions(t *testing.T) {
	const addr = "127.0.0.1:1" // nothing is dialled
	explicit := goRedisClient(addr, newCounters())
	defer explicit.Close()
	plain := redis.NewClient(&redis.Options{Addr: addr})
	defer plain.Close()
	got, want := explicit.Options(), plain.Options()
	for _, f := range []struct {
		name      string
		got, want any
	}{
		{"Protocol", got.Protocol, want.Protocol},
		{"DialTimeout", got.DialTimeout, want.DialTimeout},
		{"ReadTimeout", got.ReadTimeout, want.ReadTimeout},
		{"WriteTimeout", got.WriteTimeout, want.WriteTimeout},
		{"ContextTimeoutEnabled", got.ContextTimeoutEnabled, want.ContextTimeoutEnabled},
		{"PoolSize", got.PoolSize, want.PoolSize},
		{"PoolTimeout", got.PoolTimeout, want.PoolTimeout},
		{"MinIdleConns", got.MinIdleConns, want.MinIdleConns},
		{"MaxRetries", got.MaxRetries, want.MaxRetries},
		{"MinRetryBackoff", got.MinRetryBackoff, want.MinRetryBackoff},
		{"MaxRetryBackoff", got.MaxRetryBackoff, want.MaxRetryBackoff},
	} {
		if f.got != f.want {
			t.Errorf("goRedisOptions: %s: got %v, want go-redis's default %v", f.name, f.got, f.want)
		}
	}
}

func TestParseCommandStats(t *testing.T) {
	before := parseCommandStats("# Commandstats\r\n" +
		"cmdstat_evalsha:calls=3,usec=21,usec_per_call=7.00,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_info:calls=1,usec=30,usec_per_call=30.00,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_get:calls=5,usec=1,usec_per_call=0.20,rejected_calls=0,failed_calls=0\r\n")
	after := parseCommandStats("# Commandstats\r\n" +
		"cmdstat_evalsha:calls=7,usec=49,usec_per_call=7.00,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_info:calls=2,usec=60,usec_per_call=30.00,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_get:calls=5,usec=1,usec_per_call=0.20,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_spublish:calls=2,usec=1,usec_per_call=0.50,rejected_calls=0,failed_calls=0\r\n")
	got := after.minus(before)
	want := commandStats{"evalsha": {calls: 4, usec: 28}, "spublish": {calls: 2, usec: 1}}
	if !maps.Equal(got, want) {
		t.Errorf("got %v, want %v (INFO and unchanged commands left out)", got, want)
	}
	if got := after.minus(nil); got != nil {
		t.Errorf("minus(nil): got %v, want nil", got)
	}
}

func TestParseFlags(t *testing.T) {
	for _, e := range envFlags {
		t.Setenv(e.env, "")
	}
	for _, args := range [][]string{
		{"-rounds", "0"},
		{"-runs", "0"},
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
	cfg, err := parseFlags([]string{"-scenarios", "keys64,serial", "-libs", "distlock-goredis,distlock", "-commandstats"})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(cfg.scenarios, ","), "serial,keys64"; got != want {
		t.Errorf("scenarios: got %q, want %q (the tables' order)", got, want)
	}
	if got, want := commandLine(cfg), "cd benchmarks && go run . -scenarios serial,keys64 -libs distlock,distlock-goredis -commandstats"; got != want {
		t.Errorf("commandLine: got %q, want %q", got, want)
	}
	// A user's report leaves issue 17's targets out unless asked for them.
	if cfg.targets || cfg.runs != 1 {
		t.Errorf("defaults: got targets %v, runs %d; want false, 1", cfg.targets, cfg.runs)
	}
	cfg, err = parseFlags([]string{"-runs", "3", "-targets"})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := commandLine(cfg), "cd benchmarks && go run . -runs 3 -targets"; got != want {
		t.Errorf("commandLine: got %q, want %q", got, want)
	}
}
