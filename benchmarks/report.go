package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"
)

// figures are one round's figures of one variant.
type figures struct {
	ops              float64 // acquisitions per second
	p50, p99, worst  time.Duration
	handoff50        time.Duration // median hand-off (handoffsOf); 0 without one
	handoff90        time.Duration
	fairness         float64 // fewest / most acquisitions of one contender
	cmds             float64 // commands per acquisition, on the wire
	hookCmds         float64 // processed per acquisition, by a go-redis hook
	redis, client    time.Duration
	redisKnown, some bool // Redis CPU was read; at least one acquisition
}

// figuresOf computes a round's figures; hold is taken out of the client's
// CPU for every acquisition.
func figuresOf(s sample, hold time.Duration) figures {
	n := len(s.waits)
	f := figures{ops: float64(n) / s.elapsed.Seconds(), some: n > 0}
	if len(s.unfinished) > 0 {
		f.worst = slices.Max(s.unfinished)
	}
	if n == 0 {
		return f
	}
	waits := slices.Clone(s.waits)
	slices.Sort(waits)
	f.p50, f.p99 = waits[(n-1)/2], waits[int(0.99*float64(n-1))]
	f.worst = max(f.worst, waits[n-1])
	if m := len(s.handoffs); m > 0 {
		gaps := slices.Clone(s.handoffs)
		slices.Sort(gaps)
		f.handoff50, f.handoff90 = gaps[(m-1)/2], gaps[int(0.9*float64(m-1))]
	}
	if most := slices.Max(s.acq); most > 0 {
		f.fairness = float64(slices.Min(s.acq)) / float64(most)
	}
	f.cmds = float64(s.cmds) / float64(n)
	f.hookCmds = float64(s.hookCmds) / float64(n)
	if s.redisCPU >= 0 {
		f.redis, f.redisKnown = s.redisCPU/time.Duration(n), true
	}
	f.client = max(0, s.clientCPU-time.Duration(n)*hold) / time.Duration(n)
	return f
}

// spread is a figure over the rounds: the median and the range.
type spread struct {
	med, lo, hi float64
	n           int
}

func spreadOf(xs []float64) spread {
	if len(xs) == 0 {
		return spread{}
	}
	xs = slices.Clone(xs)
	slices.Sort(xs)
	med := xs[len(xs)/2]
	if len(xs)%2 == 0 {
		med = (xs[len(xs)/2-1] + xs[len(xs)/2]) / 2
	}
	return spread{med: med, lo: xs[0], hi: xs[len(xs)-1], n: len(xs)}
}

// cell formats a spread as "median (min–max)" with format, or "–" when
// there is no figure.
func (s spread) cell(format func(float64) string) string {
	if s.n == 0 {
		return "–"
	}
	if s.n == 1 || format(s.lo) == format(s.hi) {
		return format(s.med)
	}
	return fmt.Sprintf("%s (%s–%s)", format(s.med), format(s.lo), format(s.hi))
}

// durationCell formats a spread of nanoseconds in the unit that suits its
// median, the same for all three numbers, the unit once at the median.
func (s spread) durationCell() string {
	if s.n == 0 {
		return "–"
	}
	unit, scale := "µs", 1e3
	switch {
	case s.med >= 1e9:
		unit, scale = "s", 1e9
	case s.med >= 1e6:
		unit, scale = "ms", 1e6
	}
	digits := 0
	switch m := s.med / scale; {
	case unit == "µs":
		if m < 10 {
			digits = 1
		}
	case m < 10:
		digits = 2
	case m < 100:
		digits = 1
	}
	num := func(x float64) string { return strconv.FormatFloat(x/scale, 'f', digits, 64) }
	if s.n == 1 || num(s.lo) == num(s.hi) {
		return num(s.med) + " " + unit
	}
	return fmt.Sprintf("%s %s (%s–%s)", num(s.med), unit, num(s.lo), num(s.hi))
}

func fixed(digits int) func(float64) string {
	return func(x float64) string { return strconv.FormatFloat(x, 'f', digits, 64) }
}

// thousands formats x rounded to an integer with commas: 12,345.
func thousands(x float64) string {
	s := strconv.FormatInt(int64(math.Round(x)), 10)
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// ctxLabel is how a Lock ctx kind reads in the tables.
func ctxLabel(kind string) string {
	if kind == ctxCancel {
		return "WithCancel"
	}
	return "Background"
}

// printHeader prints how the run was made: the command that repeats it,
// the machine, and how each library is called.
func printHeader(cfg config, admin rueidis.Client) {
	w := cfg.out
	fmt.Fprintf(w, "## distlock and its peers\n\n")
	fmt.Fprintf(w, "`%s`\n\n", commandLine(cfg))
	runs := "Median"
	if cfg.runs > 1 {
		runs = fmt.Sprintf("%d full runs, one after the other, then a summary across them. Each run: the median", cfg.runs)
	}
	fmt.Fprintf(w, "%d CPUs (GOMAXPROCS %d), %s/%s, %s, redis-server %s%s, %s. "+
		"%s of %d rounds of %v per variant, range (min–max) in brackets; "+
		"rounds interleaved across libraries and contexts, keys of their own per round.\n\n",
		runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.GOOS, runtime.GOARCH, runtime.Version(),
		redisVersion(admin), gitRevision(), time.Now().Format("2006-01-02 15:04 MST"), runs, cfg.rounds, cfg.round)
	for _, name := range cfg.libs {
		spec, _ := specOf(name)
		fmt.Fprintf(w, "- **%s**: %s.\n", spec.name, spec.how)
	}
	fmt.Fprintf(w, "\n"+
		"Above each table, the bare pair's own rate: on a loaded machine every ratio is squeezed toward 1, "+
		"and a round whose bare rate is below %.1f × the best round's (same scenario and ctx) is named as loaded. "+
		"ops/s: Lock + Release pairs per second; × bare: ops/s over bare's, same round and ctx; "+
		"× own client: over the bare commands on the library's own client (bare or bare-goredis); "+
		"wait: from calling Lock to holding (the worst includes a job still waiting at the round's end, counted to the end); "+
		"hand-off (contended scenarios): from the end of one hold's work (its release about to be called) to the next holder's Lock return, across all contenders; fairness: fewest / most acquisitions of one contender; "+
		"cmds/op: commands sent per acquisition, counted on the client's connections (a script is one; a new connection's handshake and a subscription's commands included); "+
		"hook cmds/op (go-redis rows): commands go-redis processed per acquisition, counted by a hook on the client (each command of a pipeline, a retried command once; no pub/sub or handshake commands); "+
		"Redis CPU/op: the server's used_cpu_sys+used_cpu_user (INFO cpu) over the round; "+
		"client CPU/op: getrusage of the process (of the 8 processes together in scenario 4) over the round, "+
		"less the busy holds.\n", loadedBelow)
}

// commandLine returns the command that repeats this run, flags at their
// defaults left out.
func commandLine(cfg config) string {
	args := []string{"cd benchmarks && go run ."}
	scenarios, libs, ctxs := scenarioNames(), libraryNames(), ctxKinds
	if cfg.multi {
		args = append(args, "-multi")
		scenarios, libs, ctxs = setScenarioNames(), setLibraryNames(), []string{ctxBackground}
	}
	if cfg.runs != 1 {
		args = append(args, "-runs", strconv.Itoa(cfg.runs))
	}
	if cfg.rounds != defaultRounds {
		args = append(args, "-rounds", strconv.Itoa(cfg.rounds))
	}
	if cfg.round != defaultRound {
		args = append(args, "-round", cfg.round.String())
	}
	for _, f := range []struct {
		flag       string
		got, known []string
	}{
		{"-scenarios", cfg.scenarios, scenarios},
		{"-libs", cfg.libs, libs},
		{"-ctx", cfg.ctxs, ctxs},
	} {
		if !slices.Equal(f.got, f.known) {
			args = append(args, f.flag, strings.Join(f.got, ","))
		}
	}
	if cfg.commandstats {
		args = append(args, "-commandstats")
	}
	if cfg.targets {
		args = append(args, "-targets")
	}
	if cfg.cpuprofile != "" {
		args = append(args, "-cpuprofile", cfg.cpuprofile)
	}
	return strings.Join(args, " ")
}

func redisVersion(admin rueidis.Client) string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	info, err := admin.Do(ctx, admin.B().Info().Section("server").Build()).ToString()
	if err != nil {
		return "(version unknown)"
	}
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
			return v
		}
	}
	return "(version unknown)"
}

// gitRevision returns ", distlock at <commit>" (with "+changes" for a
// work tree that differs from it), or "" outside a git work tree.
func gitRevision() string {
	out, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return ""
	}
	rev := strings.TrimSpace(string(out))
	if st, err := exec.Command("git", "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(st) > 0 {
		rev += "+changes"
	}
	return ", distlock at " + rev
}

// figures returns the figures of every round of every variant of r.
func (r scenarioResult) figures() map[variant][]figures {
	figs := map[variant][]figures{}
	for _, v := range r.variants {
		for _, s := range r.samples[v] {
			figs[v] = append(figs[v], figuresOf(s, r.scenario.hold))
		}
	}
	return figs
}

// ratiosOver returns, round by round, v's ops/s over that of the library
// base in the same round with the same ctx: both ran within moments of
// each other (the rounds are interleaved). It is empty when base did not
// run.
func ratiosOver(figs map[variant][]figures, v variant, base string) []float64 {
	b := figs[variant{lib: base, ctx: v.ctx}]
	var xs []float64
	for i, f := range figs[v] {
		if i < len(b) && b[i].ops > 0 {
			xs = append(xs, f.ops/b[i].ops)
		}
	}
	return xs
}

// valuesOf returns get of the rounds fs that cond accepts; a nil cond
// accepts the rounds with an acquisition.
func valuesOf(fs []figures, get func(figures) float64, cond func(figures) bool) []float64 {
	var xs []float64
	for _, f := range fs {
		if cond == nil && f.some || cond != nil && cond(f) {
			xs = append(xs, get(f))
		}
	}
	return xs
}

// column is one figure of a scenario's table, computed per round.
type column struct {
	head string
	// shared columns are shown only for the contended scenarios.
	shared bool
	// format shows a number of the figure; nil for a duration in
	// nanoseconds, shown in the unit that suits it.
	format func(float64) string
	// higherIsBetter says which of several runs' medians is the least
	// favourable: the lowest when it is true, else the highest.
	higherIsBetter bool
	// summary columns are the ones the summary across runs shows.
	summary bool
	// of returns the figure of each round of v; nothing for a figure v
	// does not have.
	of func(res scenarioResult, figs map[variant][]figures, v variant) []float64
}

// cell formats a spread of the column's figure.
func (c column) cell(s spread) string {
	if c.format == nil {
		return s.durationCell()
	}
	return s.cell(c.format)
}

// perRound makes a column's of from a figure of every round that cond accepts
// (nil: the rounds with an acquisition).
func perRound(get func(figures) float64, cond func(figures) bool) func(scenarioResult, map[variant][]figures, variant) []float64 {
	return func(_ scenarioResult, figs map[variant][]figures, v variant) []float64 {
		return valuesOf(figs[v], get, cond)
	}
}

// ownBare is the bare row on v's own client.
func (r scenarioResult) ownBare(v variant) string {
	if r.libs[v.lib].client == clientGoRedis {
		return libBareGoRedis
	}
	return libBare
}

// columns are the figures of a scenario's table, in its order.
var columns = []column{
	{head: "ops/s", format: thousands, higherIsBetter: true,
		of: perRound(func(f figures) float64 { return f.ops }, func(figures) bool { return true })},
	{head: "× bare", format: fixed(2), higherIsBetter: true, summary: true,
		of: func(_ scenarioResult, figs map[variant][]figures, v variant) []float64 {
			return ratiosOver(figs, v, libBare)
		}},
	{head: "× own client", format: fixed(2), higherIsBetter: true,
		of: func(r scenarioResult, figs map[variant][]figures, v variant) []float64 {
			return ratiosOver(figs, v, r.ownBare(v))
		}},
	{head: "wait p50", of: perRound(func(f figures) float64 { return float64(f.p50) }, nil)},
	{head: "wait p99", summary: true, of: perRound(func(f figures) float64 { return float64(f.p99) }, nil)},
	{head: "worst wait", of: perRound(func(f figures) float64 { return float64(f.worst) }, func(f figures) bool { return f.worst > 0 })},
	{head: "hand-off p50", shared: true,
		of: perRound(func(f figures) float64 { return float64(f.handoff50) }, func(f figures) bool { return f.handoff50 > 0 })},
	{head: "hand-off p90", shared: true,
		of: perRound(func(f figures) float64 { return float64(f.handoff90) }, func(f figures) bool { return f.handoff90 > 0 })},
	{head: "fairness", shared: true, format: fixed(2), higherIsBetter: true, summary: true,
		of: perRound(func(f figures) float64 { return f.fairness }, nil)},
	{head: "cmds/op", format: fixed(2), of: perRound(func(f figures) float64 { return f.cmds }, nil)},
	{head: "hook cmds/op", format: fixed(2), // "–" for a rueidis client, which has no hook
		of: func(r scenarioResult, figs map[variant][]figures, v variant) []float64 {
			if r.libs[v.lib].client != clientGoRedis {
				return nil
			}
			return valuesOf(figs[v], func(f figures) float64 { return f.hookCmds }, nil)
		}},
	{head: "Redis CPU/op", summary: true,
		of: perRound(func(f figures) float64 { return float64(f.redis) }, func(f figures) bool { return f.redisKnown })},
	{head: "client CPU/op", of: perRound(func(f figures) float64 { return float64(f.client) }, nil)},
}

// columnsOf returns the columns of sc's table (with summary, only those of
// the summary across runs).
func columnsOf(sc scenario, summary bool) []column {
	var cs []column
	for _, c := range columns {
		if (!c.shared || sc.shared) && (!summary || c.summary) {
			cs = append(cs, c)
		}
	}
	return cs
}

// rowName is how a variant's library reads in a table: distlock's rows in
// bold.
func rowName(v variant) string {
	if v.lib == libDistlock || v.lib == libDistlockGoRedis {
		return "**" + v.lib + "**"
	}
	return v.lib
}

// tableHead prints the head of a markdown table.
func tableHead(w io.Writer, head []string) {
	fmt.Fprintf(w, "| %s |\n|%s\n", strings.Join(head, " | "), strings.Repeat("---|", len(head)))
}

// printTable prints a scenario's table, with the bare pair's rate above it
// and the notes under it.
func printTable(w io.Writer, res scenarioResult) {
	sc := res.scenario
	fmt.Fprintf(w, "\n### %s\n\n", sc.title)
	if line := bareLine(res); line != "" {
		fmt.Fprintf(w, "%s\n\n", line)
	}
	cols := columnsOf(sc, false)
	head := []string{"ctx", "library"}
	for _, c := range cols {
		head = append(head, c.head)
	}
	tableHead(w, head)

	figs := res.figures()
	for _, v := range res.variants {
		row := []string{ctxLabel(v.ctx), rowName(v)}
		for _, c := range cols {
			row = append(row, c.cell(spreadOf(c.of(res, figs, v))))
		}
		fmt.Fprintf(w, "| %s |\n", strings.Join(row, " | "))
	}
	printNotes(w, tableNotes(res, figs, ""))
}

// tableNotes returns the notes under a scenario's table: stuck jobs,
// Lock calls that gave up, rounds without an acquisition, failures. Each
// starts with prefix.
func tableNotes(res scenarioResult, figs map[variant][]figures, prefix string) []string {
	var notes []string
	for _, v := range res.variants {
		gaveUp, empty := 0, 0
		var stuck []string
		for i, s := range res.samples[v] {
			gaveUp += s.gaveUp
			if s.stuck > 0 {
				stuck = append(stuck, fmt.Sprintf("round %d: %s (%s)", i+1, count(s.stuck, "job"), s.keys))
			}
			if !figs[v][i].some {
				empty++
			}
		}
		if len(stuck) > 0 {
			notes = append(notes, fmt.Sprintf("%s, %s: stuck in Lock %v after the round's end, abandoned "+
				"(the worst wait counts them to then): %s", v.lib, ctxLabel(v.ctx), res.drain, strings.Join(stuck, "; ")))
		}
		if gaveUp > 0 {
			notes = append(notes, fmt.Sprintf("%s, %s: %s gave up waiting by the library's own rule and were called again "+
				"(the job's wait counts from its first call)", v.lib, ctxLabel(v.ctx), count(gaveUp, "Lock call")))
		}
		if empty > 0 {
			notes = append(notes, fmt.Sprintf("%s, %s: no acquisition in %d of %d rounds (left out of all but ops/s)", v.lib, ctxLabel(v.ctx), empty, len(figs[v])))
		}
	}
	for _, err := range res.failures() {
		notes = append(notes, "FAILED: "+err.Error())
	}
	for i, n := range notes {
		notes[i] = prefix + n
	}
	return notes
}

// printNotes prints notes as a list, after an empty line.
func printNotes(w io.Writer, notes []string) {
	if len(notes) > 0 {
		fmt.Fprintln(w)
		for _, n := range notes {
			fmt.Fprintf(w, "- %s.\n", n)
		}
	}
}

// count says "1 job" or "3 jobs".
func count(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return strconv.Itoa(n) + " " + noun + "s"
}
