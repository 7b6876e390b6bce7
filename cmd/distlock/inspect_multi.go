package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/distkit-go/distlock/lease"
)

// lookState is what one look at the KEYs of "distlock inspect" found:
// each KEY's state, and the requests that hold or wait for several of them
// at once. Its JSON form is the --json output for several KEYs (one KEY
// prints its lockState alone).
type lookState struct {
	Time  time.Time   `json:"time"`
	Locks []lockState `json:"locks"`
	// Requests are the multi-name requests (a MultiMutex's, or those of
	// "distlock run" with several -k) found among the KEYs, in the order
	// of the first KEY each holds.
	Requests []requestState `json:"requests,omitempty"`
}

// requestState is one request for several names at once: a lease value
// that holds some of the KEYs and stands in the line of others (a
// MultiMutex waiting for its next name), or holds several of them.
type requestState struct {
	Owner string       `json:"owner"`
	Value string       `json:"value"`
	Holds []string     `json:"holds"`           // the KEYs it holds, in the order given
	Waits []placeState `json:"waits,omitempty"` // the lines it stands in: one, unless something is amiss
}

// placeState is a request's place in the line of one KEY.
type placeState struct {
	Name    string `json:"name"`
	Place   int    `json:"place"`   // 1 for the first in line
	Waiting int    `json:"waiting"` // how many stand in that line
}

// look reads the state of every KEY once, then finds the requests that
// span several of them. A KEY whose state cannot be read is in the result
// with state "error", and the first such error is returned as well.
func (in *inspector) look(ctx context.Context) (lookState, error) {
	s := lookState{Time: time.Now(), Locks: make([]lockState, len(in.keys))}
	var first error
	fail := func(i int, err error) {
		s.Locks[i] = lockState{Time: time.Now(), Key: in.keys[i].Lease, State: "error", Error: err.Error()}
		if first == nil {
			first = err
		}
	}
	for i, k := range in.keys {
		ls, err := in.inspect(ctx, k)
		if err == nil {
			vctx, cancel := context.WithTimeout(ctx, inspectTimeout)
			err = in.voids(vctx, &ls, k)
			cancel()
		}
		if err != nil {
			fail(i, err)
			continue
		}
		s.Locks[i] = ls
	}
	if len(in.keys) > 1 {
		reqs, failed, err := in.requests(ctx, s.Locks)
		if err != nil {
			fail(failed, err)
		}
		s.Requests = reqs
	}
	return s, first
}

// exclusiveHolder returns the lease value that holds s exclusively, as a
// MultiMutex holds each of its names: a lock's or an election's holder, or
// a read-write lock's writer; "" for anything else.
func exclusiveHolder(s lockState) string {
	switch {
	case s.State != "held":
		return ""
	case s.Kind == kindLock || s.Kind == kindElection:
		return s.Value
	case s.Kind == kindRWMutex && s.Mode == "write" && len(s.Holders) > 0:
		return s.Holders[0].Value
	}
	return ""
}

// requests correlates the lease values across the KEYs' states: a value
// that holds one KEY and stands in the line of another, or holds several,
// is one request for several names at once. Every lease value is unique
// to one acquisition, so only such a request can do either. A holder's
// place in the other lines is read with ZRANK, all in one round trip
// (which reads beyond the first waiters that a lock's state names). On an
// error it returns the index of the KEY whose line could not be read.
func (in *inspector) requests(ctx context.Context, locks []lockState) ([]requestState, int, error) {
	var reqs []requestState
	for i, s := range locks {
		v := exclusiveHolder(s)
		if v == "" || slices.ContainsFunc(reqs, func(r requestState) bool { return r.Value == v }) {
			continue
		}
		r := requestState{Owner: lease.Owner(v), Value: v}
		for j, o := range locks[i:] {
			if exclusiveHolder(o) == v {
				r.Holds = append(r.Holds, in.names[i+j])
			}
		}
		reqs = append(reqs, r)
	}
	// Ask where each holder stands in the lines of the KEYs it does not
	// hold, where anyone waits.
	type ask struct{ req, lock int }
	var asks []ask
	var cmds rueidis.Commands
	for ri, r := range reqs {
		for li, s := range locks {
			if s.State == "error" || s.Waiting == 0 || slices.Contains(r.Holds, in.names[li]) {
				continue
			}
			asks = append(asks, ask{ri, li})
			cmds = append(cmds, in.rc.B().Zrank().Key(in.keys[li].Queue).Member(r.Value).Build())
		}
	}
	if len(cmds) > 0 {
		ctx, cancel := context.WithTimeout(ctx, inspectTimeout)
		defer cancel()
		for i, res := range in.rc.DoMulti(ctx, cmds...) {
			a := asks[i]
			rank, err := res.AsInt64()
			if rueidis.IsRedisNil(err) {
				continue
			}
			if err != nil {
				return nil, a.lock, fmt.Errorf("reading %s: %w", in.keys[a.lock].Queue, err)
			}
			reqs[a.req].Waits = append(reqs[a.req].Waits,
				placeState{Name: in.names[a.lock], Place: int(rank) + 1, Waiting: locks[a.lock].Waiting})
		}
	}
	return slices.DeleteFunc(reqs, func(r requestState) bool { return len(r.Holds) < 2 && len(r.Waits) == 0 }), 0, nil
}

// held reports whether any KEY is held, which sets inspect's exit status.
func (s lookState) held() bool {
	return slices.ContainsFunc(s.Locks, func(l lockState) bool { return l.State == "held" })
}

// differs reports whether s and o describe different states, ignoring the
// time and the leases' countdowns.
func (s lookState) differs(o lookState) bool {
	if len(s.Locks) != len(o.Locks) || len(s.Requests) != len(o.Requests) {
		return true
	}
	for i := range s.Locks {
		if s.Locks[i].differs(o.Locks[i]) {
			return true
		}
	}
	for i, r := range s.Requests {
		p := o.Requests[i]
		if r.Value != p.Value || !slices.Equal(r.Holds, p.Holds) || !slices.Equal(r.Waits, p.Waits) {
			return true
		}
	}
	return false
}

// text is the human form of s: a line for each KEY, then one for each
// request for several of them, each prefixed with the time for a watch.
func (s lookState) text(withTime bool) string {
	lines := make([]string, 0, len(s.Locks)+len(s.Requests))
	for _, l := range s.Locks {
		lines = append(lines, l.text(withTime))
	}
	for _, r := range s.Requests {
		var b strings.Builder
		if withTime {
			b.WriteString(s.Time.Format("15:04:05.000  "))
		}
		r.text(&b)
		lines = append(lines, b.String())
	}
	return strings.Join(lines, "\n")
}

// text writes the line of a request for several names:
//
//	request db-2:4711#<uuid>  holds ledger, users; waits in the line of accounts, at place 1 of 2
//	request db-2:4711#<uuid>  holds accounts, ledger, users
func (r requestState) text(b *strings.Builder) {
	fmt.Fprintf(b, "request %s  holds %s", r.Value, strings.Join(r.Holds, ", "))
	for i, w := range r.Waits {
		if i == 0 {
			b.WriteString("; waits in the line of ")
		} else {
			b.WriteString(", and in the line of ")
		}
		fmt.Fprintf(b, "%s, at place %d of %d", w.Name, w.Place, w.Waiting)
	}
}
