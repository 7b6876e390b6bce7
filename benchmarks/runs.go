package main

// What makes a figure hold: every table shows the bare pair's own rate, so
// that a reader can tell a quiet machine's run from a loaded one's, and
// names the rounds in which the bare pair ran far below its best; a loaded
// machine squeezes every ratio toward 1, since the round trip and the
// scheduler's delays, which every library pays alike, grow while each
// library's own work does not. With -runs, the command repeats the whole
// run and ends with the least favourable of the runs' medians of each
// figure: the figure BENCHMARKS.md's headline takes.

import (
	"fmt"
	"io"
	"slices"
	"strings"
)

// loadedBelow is the fraction of the best bare rate below which a round
// counts as loaded: the bare pair did less than 0.7 of what it did in the
// best round of the same scenario and ctx, so something else had the
// machine's CPUs.
const loadedBelow = 0.7

// bareRates returns the bare pair's ops/s in each round with ctx, or nil
// when the bare row did not run.
func bareRates(figs map[variant][]figures, ctx string) []float64 {
	var xs []float64
	for _, f := range figs[variant{lib: libBare, ctx: ctx}] {
		xs = append(xs, f.ops)
	}
	return xs
}

// loadedRounds returns the indices of the rates below loadedBelow × best.
func loadedRounds(rates []float64, best float64) []int {
	var idx []int
	for i, r := range rates {
		if r < loadedBelow*best {
			idx = append(idx, i)
		}
	}
	return idx
}

// bareLine says the bare pair's rate in res, per ctx (median and range
// over the rounds), and which rounds ran loaded against the best round of
// the same ctx. It is empty when the bare row did not run.
func bareLine(res scenarioResult) string {
	figs := res.figures()
	var rates, loaded []string
	total, flagged := 0, 0
	for _, ctx := range res.ctxs {
		xs := bareRates(figs, ctx)
		if len(xs) == 0 {
			continue
		}
		best := slices.Max(xs)
		rates = append(rates, spreadOf(xs).cell(thousands)+" pairs/s "+ctxLabel(ctx))
		total += len(xs)
		for _, i := range loadedRounds(xs, best) {
			flagged++
			loaded = append(loaded, fmt.Sprintf("%s round %d (%s against %s)", ctxLabel(ctx), i+1, thousands(xs[i]), thousands(best)))
		}
	}
	if total == 0 {
		return ""
	}
	line := "Bare pair: " + strings.Join(rates, ", ") + ". "
	if flagged == 0 {
		return line + fmt.Sprintf("Loaded rounds (bare below %.1f × its best round): none of %d.", loadedBelow, total)
	}
	return line + fmt.Sprintf("**Loaded rounds** (bare below %.1f × its best round, ratios squeezed toward 1): %d of %d: %s.",
		loadedBelow, flagged, total, strings.Join(loaded, ", "))
}

// acrossRuns returns one column's figure of v over the runs rs (each run's
// result of the same scenario): each run's median (n 0 where the run has
// none), and the least favourable of them, the lowest for a figure that is
// better higher, else the highest; ok is false when no run has the figure.
func acrossRuns(c column, rs []scenarioResult, v variant) (worst float64, meds []spread, ok bool) {
	for _, r := range rs {
		s := spreadOf(c.of(r, r.figures(), v))
		meds = append(meds, s)
		if s.n == 0 {
			continue
		}
		if !ok || c.higherIsBetter && s.med < worst || !c.higherIsBetter && s.med > worst {
			worst, ok = s.med, true
		}
	}
	return worst, meds, ok
}

// only is the spread of the one figure x.
func only(x float64) spread { return spread{med: x, lo: x, hi: x, n: 1} }

// printAcrossRuns prints, per scenario, the summary of the full runs:
// each run's bare rate and loaded rounds, against the best bare round of
// all the runs, and a table whose cells give the least favourable of the
// runs' medians, then each run's median. runs holds the results by run,
// then by scenario, every run with the same scenarios.
func printAcrossRuns(w io.Writer, runs [][]scenarioResult) {
	if len(runs) == 0 {
		return
	}
	fmt.Fprintf(w, "\n## Across the %d runs\n\n"+
		"Each figure is computed per round against the bare pair of the same round, and its median taken over a run's rounds; "+
		"each cell gives the least favourable of the runs' medians (the lowest × bare and fairness, the highest wait and CPU), "+
		"then each run's median in run order. These are the headline figures.\n", len(runs))
	for j, first := range runs[0] {
		rs := make([]scenarioResult, len(runs))
		for i := range runs {
			rs[i] = runs[i][j]
		}
		sc := first.scenario
		fmt.Fprintf(w, "\n### %s: %d runs\n\n", sc.title, len(runs))
		if line := bareAcrossRuns(rs); line != "" {
			fmt.Fprintf(w, "%s\n\n", line)
		}
		cols := columnsOf(sc, true)
		head := []string{"ctx", "library"}
		for _, c := range cols {
			least := "highest"
			if c.higherIsBetter {
				least = "lowest"
			}
			head = append(head, c.head+", "+least+" (each run)")
		}
		tableHead(w, head)
		for _, v := range first.variants {
			row := []string{ctxLabel(v.ctx), rowName(v)}
			for _, c := range cols {
				worst, meds, ok := acrossRuns(c, rs, v)
				if !ok {
					row = append(row, "–")
					continue
				}
				each := make([]string, len(meds))
				for i, m := range meds {
					each[i] = "–"
					if m.n > 0 {
						each[i] = c.cell(only(m.med))
					}
				}
				row = append(row, fmt.Sprintf("%s (%s)", c.cell(only(worst)), strings.Join(each, ", ")))
			}
			fmt.Fprintf(w, "| %s |\n", strings.Join(row, " | "))
		}
	}
}

// bareAcrossRuns says the bare pair's median rate in each run, per ctx,
// and how many of each run's rounds ran loaded against the best bare
// round of all the runs with the same ctx. It is empty when the bare row
// did not run.
func bareAcrossRuns(rs []scenarioResult) string {
	var parts []string
	total, flagged := 0, 0
	for _, ctx := range rs[0].ctxs {
		byRun := make([][]float64, len(rs))
		var all []float64
		for i, r := range rs {
			byRun[i] = bareRates(r.figures(), ctx)
			all = append(all, byRun[i]...)
		}
		if len(all) == 0 {
			continue
		}
		best := slices.Max(all)
		var each []string
		for i, xs := range byRun {
			n := len(loadedRounds(xs, best))
			total += len(xs)
			flagged += n
			cell := fmt.Sprintf("run %d %s", i+1, thousands(spreadOf(xs).med))
			if n > 0 {
				cell += fmt.Sprintf(" (%d of %d rounds loaded)", n, len(xs))
			}
			each = append(each, cell)
		}
		parts = append(parts, ctxLabel(ctx)+": "+strings.Join(each, ", "))
	}
	if total == 0 {
		return ""
	}
	return fmt.Sprintf("Bare pair, pairs/s per run: %s. Loaded rounds (bare below %.1f × the best round of all the runs): %d of %d.",
		strings.Join(parts, "; "), loadedBelow, flagged, total)
}
