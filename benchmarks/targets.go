package main

import (
	"fmt"
	"io"
	"strconv"
)

// The targets that issue 17 sets distlock on go-redis (the row
// distlock-goredis), checked in the run that measured them: each figure per
// round (a ratio between two rows of the same round, which ran within
// moments of each other), its median over the rounds against the target,
// and how many of the rounds met it on their own.

// goal is one target, or a figure shown beside the targets (bound 0).
type goal struct {
	scenario string // the scenario's name
	figure   string // how the figure reads
	// of returns the figure per round for the ctx kind, or nothing when a
	// row it needs did not run.
	of      func(figs map[variant][]figures, ctx string) []float64
	atLeast bool    // the figure must be at least bound; else at most
	bound   float64 // 0: no target, the figure is shown for what it tells
	// duration figures are nanoseconds, shown in the unit that suits them;
	// the others have two decimals.
	duration bool
}

var goals = []goal{
	{scenario: "serial", figure: "ops/s distlock-goredis / redsync", of: ratioGoal(libRedsync), atLeast: true, bound: 1},
	{scenario: "serial", figure: "ops/s distlock-goredis / distlock (rueidis)", of: ratioGoal(libDistlock), atLeast: true, bound: 0.8},
	{scenario: "keys64", figure: "ops/s distlock-goredis / redsync", of: ratioGoal(libRedsync), atLeast: true, bound: 1},
	{scenario: "keys64", figure: "ops/s distlock-goredis / distlock (rueidis)", of: ratioGoal(libDistlock), atLeast: true, bound: 0.8},
	{scenario: "processes8", figure: "fairness of distlock-goredis (fewest / most acquisitions of a process)",
		of: figureGoal(func(f figures) float64 { return f.fairness }), atLeast: true, bound: 0.9},
	{scenario: "processes8", figure: "commands per acquisition of distlock-goredis (go-redis hook)",
		of: figureGoal(func(f figures) float64 { return f.hookCmds }), bound: 3},
	{scenario: "processes8", figure: "commands per acquisition of distlock-goredis (on the wire, pub/sub included)",
		of: figureGoal(func(f figures) float64 { return f.cmds })},
	{scenario: "processes8", figure: "ops/s distlock-goredis / bare-goredis (spinning SET NX + DEL on go-redis)",
		of: ratioGoal(libBareGoRedis), atLeast: true, bound: 1},
	{scenario: "processes8", figure: "wait p50 of distlock-goredis",
		of: figureGoal(func(f figures) float64 { return float64(f.p50) }), duration: true},
	{scenario: "processes8", figure: "wait p99 of distlock-goredis",
		of: figureGoal(func(f figures) float64 { return float64(f.p99) }), duration: true},
}

// ratioGoal is distlock-goredis's ops/s over base's, round by round.
func ratioGoal(base string) func(map[variant][]figures, string) []float64 {
	return func(figs map[variant][]figures, ctx string) []float64 {
		return ratiosOver(figs, variant{lib: libDistlockGoRedis, ctx: ctx}, base)
	}
}

// figureGoal is a figure of distlock-goredis, round by round (the rounds
// with an acquisition).
func figureGoal(get func(figures) float64) func(map[variant][]figures, string) []float64 {
	return func(figs map[variant][]figures, ctx string) []float64 {
		var xs []float64
		for _, f := range figs[variant{lib: libDistlockGoRedis, ctx: ctx}] {
			if f.some {
				xs = append(xs, get(f))
			}
		}
		return xs
	}
}

// met reports whether x meets g's target.
func (g goal) met(x float64) bool {
	if g.atLeast {
		return x >= g.bound
	}
	return x <= g.bound
}

// target reads the goal's target, such as "≥ 0.80".
func (g goal) target() string {
	switch {
	case g.bound == 0:
		return "–"
	case g.atLeast:
		return "≥ " + fixed(2)(g.bound)
	}
	return "≤ " + fixed(2)(g.bound)
}

// printTargets prints a table of the goals whose scenario ran, per ctx
// kind: the figure's median (min–max) over the rounds and the verdict,
// which judges the median and says in how many rounds the figure met the
// target on its own. It prints nothing when distlock-goredis did not run.
func printTargets(w io.Writer, results []scenarioResult, ctxs []string) {
	byName := map[string]map[variant][]figures{}
	for _, r := range results {
		byName[r.scenario.name] = r.figures()
	}
	var rows []string
	for _, sc := range scenarioNames() {
		figs, ok := byName[sc]
		if !ok {
			continue
		}
		for _, ctx := range ctxs {
			for _, g := range goals {
				if g.scenario != sc {
					continue
				}
				xs := g.of(figs, ctx)
				if len(xs) == 0 {
					// No round gave this figure (a row of it made no
					// acquisition within its round: a starved machine, or
					// a round too short for the client's first connect).
					// Said, not left out, so that a missing figure is seen.
					rows = append(rows, fmt.Sprintf("| %s | %s | %s | %s | – | **no figure**: no round had one |",
						g.scenario, ctxLabel(ctx), g.figure, g.target()))
					continue
				}
				verdict := "–"
				if g.bound != 0 {
					verdict = verdictOf(g, xs)
				}
				cell := spreadOf(xs).cell(fixed(2))
				if g.duration {
					cell = spreadOf(xs).durationCell()
				}
				rows = append(rows, fmt.Sprintf("| %s | %s | %s | %s | %s | %s |",
					g.scenario, ctxLabel(ctx), g.figure, g.target(), cell, verdict))
			}
		}
	}
	if len(rows) == 0 {
		return
	}
	fmt.Fprintf(w, "\n### Targets of issue 17: distlock on go-redis\n\n")
	fmt.Fprintf(w, "Each figure is computed per round (a ratio between two rows of the same round and ctx); "+
		"the verdict judges the median over the rounds and counts the rounds that met the target on their own.\n\n")
	fmt.Fprintf(w, "| scenario | ctx | figure | target | median (min–max) | verdict |\n|---|---|---|---|---|---|\n")
	for _, r := range rows {
		fmt.Fprintln(w, r)
	}
}

// verdictOf judges the median of xs against g and counts the rounds that
// met the target.
func verdictOf(g goal, xs []float64) string {
	n := 0
	for _, x := range xs {
		if g.met(x) {
			n++
		}
	}
	rounds := strconv.Itoa(n) + " of " + count(len(xs), "round") + " met it"
	switch {
	case !g.met(spreadOf(xs).med):
		return "**missed**: " + rounds
	case n == len(xs):
		return "**met**: " + rounds
	}
	return "met at the median: " + rounds
}
