package history

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"time"
)

// Acq identifies one acquisition in a [Report].
type Acq struct {
	Key     string
	Client  string
	Token   int64
	Granted Mono // when Lock returned it
	// LastHeld is the start of the last State sample that returned
	// Acquired, or 0 if there was none.
	LastHeld Mono
}

func (a Acq) String() string { return fmt.Sprintf("%s/%s token %d", a.Key, a.Client, a.Token) }

// Overlap is a breach of L2: First, granted earlier, still reported Acquired
// after Second had been granted.
type Overlap struct {
	First, Second Acq
	// By is how long after Second's grant First last reported Acquired.
	By time.Duration
}

func (o Overlap) String() string {
	return fmt.Sprintf("overlap: %v reported Acquired %v after %v was granted", o.First, o.By, o.Second)
}

// Report is what [Check] found in a history. The counts describe the
// history; the slices list breaches of the contract, each in words.
type Report struct {
	Acquisitions int // granted acquisitions
	Samples      int // State samples
	HeldSamples  int // samples that returned Acquired
	// Unchecked is the number of held samples that L1 could not be checked
	// for, because their acquisition has no Confirmed op (nobody recorded
	// its wire traffic).
	Unchecked int
	Reads     int   // accepted counter reads
	Writes    int   // accepted counter writes
	Refused   int   // counter calls refused for a stale token
	Final     int64 // the counter value the accepted writes lead to (per key, summed)

	L1          []string  // held samples past the deadline the confirmed writes allow
	Overlaps    []Overlap // L2
	TokenOrder  []string  // L3: a token not above the one granted before it
	Stale       []string  // accepted counter calls with a token below one accepted before
	LostUpdates []string  // accepted writes not based on the counter's current value
	Malformed   []string  // ops that contradict the record itself
}

// maxListed is how many breaches of one kind Err spells out.
const maxListed = 5

// Err returns nil if the history keeps the contract, and otherwise an error
// that lists the breaches.
func (r Report) Err() error {
	var errs []error
	add := func(what string, list []string) {
		if len(list) == 0 {
			return
		}
		shown := list[:min(len(list), maxListed)]
		err := fmt.Errorf("%s: %d, e.g. %q", what, len(list), shown)
		errs = append(errs, err)
	}
	overlaps := make([]string, len(r.Overlaps))
	for i, o := range r.Overlaps {
		overlaps[i] = o.String()
	}
	add("L1 held past the deadline", r.L1)
	add("L2 overlaps", overlaps)
	add("L3 token order", r.TokenOrder)
	add("stale counter calls accepted", r.Stale)
	add("lost updates", r.LostUpdates)
	add("malformed ops", r.Malformed)
	return errors.Join(errs...)
}

// Summary returns the counts as space-separated key=value pairs, for test
// logs that scripts collect.
func (r Report) Summary() string {
	return fmt.Sprintf("acquisitions=%d samples=%d held_samples=%d l1_unchecked=%d "+
		"l1_violations=%d overlaps=%d token_order_violations=%d "+
		"reads=%d writes=%d stale_refused=%d stale_accepted=%d lost_updates=%d malformed=%d",
		r.Acquisitions, r.Samples, r.HeldSamples, r.Unchecked,
		len(r.L1), len(r.Overlaps), len(r.TokenOrder),
		r.Reads, r.Writes, r.Refused, len(r.Stale), len(r.LostUpdates), len(r.Malformed))
}

type acqID struct {
	key, client string
	token       int64
}

// acqState is what Check gathers about one acquisition.
type acqState struct {
	Acq
	granted  bool
	samples  []Op // held samples
	confirms []Op
}

// Check checks a history against L1, L2, L3 and the counter's rules; see the
// package documentation. Ops may come in any order, except that a counter's
// Read and Write ops must be in the order the counter applied them, as
// [Counter] records them.
func Check(ops []Op) Report {
	var r Report
	acqs := make(map[acqID]*acqState)
	get := func(op Op) *acqState {
		id := acqID{op.Key, op.Client, op.Token}
		a := acqs[id]
		if a == nil {
			a = &acqState{Acq: Acq{Key: op.Key, Client: op.Client, Token: op.Token}}
			acqs[id] = a
		}
		return a
	}
	for _, op := range ops {
		switch op.Kind {
		case Granted:
			a := get(op)
			if a.granted {
				r.Malformed = append(r.Malformed, fmt.Sprintf("%v granted twice", a.Acq))
				continue
			}
			a.granted, a.Granted = true, op.At
		case Sample:
			r.Samples++
			if op.End < op.At {
				r.Malformed = append(r.Malformed, fmt.Sprintf("%v ends before it starts", op))
			}
			if op.Held {
				r.HeldSamples++
				a := get(op)
				a.samples = append(a.samples, op)
				a.LastHeld = max(a.LastHeld, op.At)
			}
		case Confirmed:
			a := get(op)
			a.confirms = append(a.confirms, op)
		case Lost, Regained, Released, Read, Write:
		default:
			r.Malformed = append(r.Malformed, fmt.Sprintf("op of unknown kind: %v", op))
		}
	}

	byKey := make(map[string][]*acqState)
	for _, a := range acqs {
		if !a.granted {
			if len(a.samples) > 0 {
				r.Malformed = append(r.Malformed, fmt.Sprintf("%v reported Acquired but was never granted", a.Acq))
			}
			continue // confirmed writes of an attempt that did not return a guard
		}
		r.Acquisitions++
		for _, s := range a.samples {
			if s.At < a.Granted && s.End < a.Granted {
				r.Malformed = append(r.Malformed, fmt.Sprintf("%v sampled before its grant", a.Acq))
				break
			}
		}
		r.checkL1(a)
		byKey[a.Key] = append(byKey[a.Key], a)
	}
	for _, list := range byKey {
		r.checkOrder(list)
	}
	r.checkCounter(ops)
	slices.SortFunc(r.Overlaps, func(a, b Overlap) int { return cmp.Compare(a.Second.Granted, b.Second.Granted) })
	return r
}

// checkL1 checks that every held sample of a started before the latest
// deadline allowed by a write confirmed before the sample ended. The library
// may have used any confirmation that arrived before State returned, and
// State compares the clock at some instant between the sample's start and
// end with its deadline; so a correct guard always passes, whatever the
// scheduling.
func (r *Report) checkL1(a *acqState) {
	if len(a.confirms) == 0 {
		r.Unchecked += len(a.samples)
		return
	}
	slices.SortFunc(a.confirms, func(x, y Op) int { return cmp.Compare(x.At, y.At) })
	for _, s := range a.samples {
		var until Mono
		for _, c := range a.confirms {
			if c.At > s.End {
				break
			}
			until = max(until, c.Until)
		}
		if until == 0 {
			r.L1 = append(r.L1, fmt.Sprintf("%v reported Acquired at %d before any write was confirmed", a.Acq, s.At))
		} else if s.At >= until {
			r.L1 = append(r.L1, fmt.Sprintf("%v reported Acquired %v after its deadline", a.Acq, s.At.Sub(until)))
		}
	}
}

// checkOrder checks L2 and L3 among the acquisitions of one key. In grant
// order, no acquisition may report Acquired after a later one was granted
// (the sample's start is no later than the moment State looked at the
// clock, and the grant is read after Lock returned, so a reported overlap
// really happened), and tokens must strictly increase.
func (r *Report) checkOrder(list []*acqState) {
	slices.SortFunc(list, func(a, b *acqState) int {
		return cmp.Or(cmp.Compare(a.Granted, b.Granted), cmp.Compare(a.Token, b.Token))
	})
	var longest *acqState // the earlier acquisition that reported Acquired last
	for i, a := range list {
		if i > 0 && a.Token <= list[i-1].Token {
			r.TokenOrder = append(r.TokenOrder, fmt.Sprintf("%v granted after %v", a.Acq, list[i-1].Acq))
		}
		if longest != nil && longest.LastHeld > a.Granted {
			r.Overlaps = append(r.Overlaps, Overlap{First: longest.Acq, Second: a.Acq, By: longest.LastHeld.Sub(a.Granted)})
		}
		if longest == nil || a.LastHeld > longest.LastHeld {
			longest = a
		}
	}
}

// checkCounter replays the counter ops of each key in the order recorded.
func (r *Report) checkCounter(ops []Op) {
	type counter struct{ highest, value int64 }
	counters := make(map[string]*counter)
	for _, op := range ops {
		if op.Kind != Read && op.Kind != Write {
			continue
		}
		c := counters[op.Key]
		if c == nil {
			c = &counter{}
			counters[op.Key] = c
		}
		if !op.OK {
			r.Refused++
			if op.Token >= c.highest {
				r.Malformed = append(r.Malformed, fmt.Sprintf("%v refused, but no higher token was accepted before", op))
			}
			continue
		}
		if op.Token < c.highest {
			r.Stale = append(r.Stale, fmt.Sprintf("%v accepted after token %d", op, c.highest))
		}
		c.highest = max(c.highest, op.Token)
		switch op.Kind {
		case Read:
			r.Reads++
			if op.Value != c.value {
				r.Malformed = append(r.Malformed, fmt.Sprintf("%v, but the counter held %d", op, c.value))
			}
		case Write:
			r.Writes++
			if op.Value != c.value+1 {
				r.LostUpdates = append(r.LostUpdates, fmt.Sprintf("%v over %d", op, c.value))
			}
			c.value = op.Value
		}
	}
	for _, c := range counters {
		r.Final += c.value
	}
}
