package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"
)

// With -commandstats every round reads INFO commandstats at its start and
// end, and each scenario's table is followed by one of what Redis ran per
// acquisition, by command: the calls and the server's time in them. It
// tells where Redis's CPU per acquisition goes (a script's call, and the
// calls the script makes, each count), and which client sends what: a
// client's own commands per acquisition (cmds/op) say how many, this says
// which.

// maxCommandCells bounds the commands shown per variant, the costliest.
const maxCommandCells = 10

// cmdStat is one command's line of INFO commandstats.
type cmdStat struct {
	calls, usec int64
}

// commandStats is INFO commandstats by command name ("evalsha", "set").
type commandStats map[string]cmdStat

// readCommandStats reads INFO commandstats; nil if it cannot.
func readCommandStats(admin rueidis.Client) commandStats {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	info, err := admin.Do(ctx, admin.B().Info().Section("commandstats").Build()).ToString()
	if err != nil {
		return nil
	}
	return parseCommandStats(info)
}

// readCommandStatsOf reads INFO commandstats of the servers of admins
// and adds them up; nil if it cannot read one of them.
func readCommandStatsOf(admins []rueidis.Client) commandStats {
	sum := commandStats{}
	for _, a := range admins {
		st := readCommandStats(a)
		if st == nil {
			return nil
		}
		for name, c := range st {
			t := sum[name]
			sum[name] = cmdStat{calls: t.calls + c.calls, usec: t.usec + c.usec}
		}
	}
	return sum
}

// parseCommandStats reads lines such as
// "cmdstat_evalsha:calls=3,usec=21,usec_per_call=7.00,rejected_calls=0,failed_calls=0".
func parseCommandStats(info string) commandStats {
	stats := commandStats{}
	for line := range strings.Lines(info) {
		name, fields, ok := strings.Cut(strings.TrimSpace(line), ":")
		if name, ok = strings.CutPrefix(name, "cmdstat_"); !ok {
			continue
		}
		var st cmdStat
		for f := range strings.SplitSeq(fields, ",") {
			k, v, _ := strings.Cut(f, "=")
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				continue
			}
			switch k {
			case "calls":
				st.calls = n
			case "usec":
				st.usec = n
			}
		}
		stats[name] = st
	}
	return stats
}

// minus returns what s counts beyond before, leaving out the INFO commands
// that read them; nil if either is nil.
func (s commandStats) minus(before commandStats) commandStats {
	if s == nil || before == nil {
		return nil
	}
	d := commandStats{}
	for name, st := range s {
		b := before[name]
		if name == "info" || st.calls == b.calls {
			continue
		}
		d[name] = cmdStat{calls: st.calls - b.calls, usec: st.usec - b.usec}
	}
	return d
}

// printCommandStats prints, per variant, what Redis ran per acquisition
// over all its rounds: each command's calls per acquisition and µs per
// call, the costliest first. It prints nothing for a run without
// -commandstats.
func printCommandStats(w io.Writer, res scenarioResult) {
	var rows []string
	for _, v := range res.variants {
		total, acq, known := commandStats{}, 0, false
		for _, s := range res.samples[v] {
			if s.redisCmds == nil {
				continue
			}
			known = true
			acq += len(s.waits)
			for name, st := range s.redisCmds {
				t := total[name]
				total[name] = cmdStat{calls: t.calls + st.calls, usec: t.usec + st.usec}
			}
		}
		if !known || acq == 0 {
			continue
		}
		names := make([]string, 0, len(total))
		for name := range total {
			names = append(names, name)
		}
		slices.SortFunc(names, func(a, b string) int {
			return cmp.Or(cmp.Compare(total[b].usec, total[a].usec), cmp.Compare(a, b))
		})
		var cells []string
		for i, name := range names {
			if i == maxCommandCells && len(names) > i+1 {
				cells = append(cells, fmt.Sprintf("%d more", len(names)-i))
				break
			}
			st := total[name]
			cells = append(cells, fmt.Sprintf("%s %.2f × %.1f µs", name, float64(st.calls)/float64(acq), float64(st.usec)/float64(st.calls)))
		}
		rows = append(rows, fmt.Sprintf("| %s | %s | %s |", ctxLabel(v.ctx), v.lib, strings.Join(cells, ", ")))
	}
	if len(rows) == 0 {
		return
	}
	fmt.Fprintf(w, "\nRedis's commands per acquisition (INFO commandstats, all rounds): calls per acquisition × µs per call. "+
		"A script's calls count too, and its own time includes theirs, so the times do not add up.\n\n"+
		"| ctx | library | commands |\n|---|---|---|\n")
	for _, r := range rows {
		fmt.Fprintln(w, r)
	}
}
