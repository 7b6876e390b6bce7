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

// Crowd is a breach of L2 for a key of several permits: when Grant was
// granted, more than Permits-1 acquisitions granted before it (by token)
// reported Acquired afterwards, so that with Grant more than Permits held
// the key at once. Earlier lists them.
type Crowd struct {
	Grant   Acq
	Earlier []Acq
	Permits int
}

func (c Crowd) String() string {
	return fmt.Sprintf("more than %d at once: %v was granted while %d granted before it still reported Acquired "+
		"after its grant: %v", c.Permits, c.Grant, len(c.Earlier), c.Earlier)
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
	// Peak is the largest number of acquisitions of one key that held it
	// over a common stretch of time, each from its grant to the start of
	// its last State sample that returned Acquired. A test that means to
	// fill every permit checks that it did.
	Peak         int
	Observations int // Observed ops
	// UnknownTerms counts the distinct tokens that observers saw and that
	// no Granted op of the key carries (a candidate that was killed before
	// it recorded its grant, or a term nobody recorded).
	UnknownTerms int

	L1          []string  // held samples past the deadline the confirmed writes allow
	Overlaps    []Overlap // L2
	Crowds      []Crowd   // L2 for keys of several permits
	TokenOrder  []string  // L3: a token not above the one granted before it
	Stale       []string  // accepted counter calls with a token below one accepted before
	LostUpdates []string  // accepted writes not based on the counter's current value
	Malformed   []string  // ops that contradict the record itself
	// Observers lists what observers saw against the record: a term older
	// than one they had seen, a term again after they saw it end, or a
	// leader under a token that another acquisition was granted.
	Observers []string
	// Arrival lists callers granted ahead of one that stood in line before
	// they asked ([Asked]).
	Arrival []string
	// Readers is the largest number of readers of a read-write lock that
	// held it over a common stretch of time (as Peak counts them): a test
	// that means readers to share checks it.
	Readers int
	// L4 lists guards that regained their lease (a Regained op) after
	// another acquisition of the key had been granted since their own
	// grant: the renewal that brought them back extended a grant that was
	// not theirs.
	L4 []string
	// Regrants lists lease values (the Lease of the ops) that were granted
	// under more than one token, with the tokens: a delayed acquire call
	// granted a value anew after its grant ended. It is not a breach by
	// itself (a semaphore's holder that asks again gets a new token); what
	// a regrant may break, L1 and L4, is checked on each grant apart.
	Regrants []string
	// Unfiled counts the Confirmed ops that named their Lease but no Token
	// and came before any grant of that value was known; they are left
	// out of the checks.
	Unfiled int
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
	crowds := make([]string, len(r.Crowds))
	for i, c := range r.Crowds {
		crowds[i] = c.String()
	}
	add("L2 more holders than permits", crowds)
	add("L3 token order", r.TokenOrder)
	add("stale counter calls accepted", r.Stale)
	add("lost updates", r.LostUpdates)
	add("malformed ops", r.Malformed)
	add("observers", r.Observers)
	add("arrival order", r.Arrival)
	add("L4 regained after another held", r.L4)
	return errors.Join(errs...)
}

// Summary returns the counts as space-separated key=value pairs, for test
// logs that scripts collect.
func (r Report) Summary() string {
	return fmt.Sprintf("acquisitions=%d samples=%d held_samples=%d l1_unchecked=%d "+
		"l1_violations=%d overlaps=%d token_order_violations=%d "+
		"reads=%d writes=%d stale_refused=%d stale_accepted=%d lost_updates=%d malformed=%d "+
		"crowds=%d peak=%d observations=%d observer_violations=%d unknown_terms=%d arrival_violations=%d readers_peak=%d "+
		"l4_violations=%d regrants=%d unfiled=%d",
		r.Acquisitions, r.Samples, r.HeldSamples, r.Unchecked,
		len(r.L1), len(r.Overlaps), len(r.TokenOrder),
		r.Reads, r.Writes, r.Refused, len(r.Stale), len(r.LostUpdates), len(r.Malformed),
		len(r.Crowds), r.Peak, r.Observations, len(r.Observers), r.UnknownTerms, len(r.Arrival), r.Readers,
		len(r.L4), len(r.Regrants), r.Unfiled)
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
	sent     Mono // the earliest Sent of confirms, or 0
	// A read-write lock's acquisition: its mode at the grant, when it
	// downgraded (0: never), and the start of its last held sample in
	// write mode.
	mode          string
	downgraded    Mono
	lastWriteHeld Mono
	asked         *Op    // its Asked op, if recorded
	lease         string // the value it wrote, if an op named it
	lost          []Mono // its Lost ops
	regained      []Mono // its Regained ops
}

// Config says what the keys of a history allow. The zero Config is for
// locks: one holder per key.
type Config struct {
	// Permits maps the keys that allow several holders at once (a
	// semaphore's lease key) to how many. A key not listed allows one.
	Permits map[string]int
	// RW lists the keys of read-write locks: many readers at once, or one
	// writer (the Mode of each Granted op).
	RW map[string]bool
}

// permits returns how many holders key allows.
func (c Config) permits(key string) int { return max(c.Permits[key], 1) }

// Check checks a history of locks; it is Config{}.Check.
func Check(ops []Op) Report { return Config{}.Check(ops) }

// Check checks a history against L1, L2, L3, the counter's rules and the
// observers' rules; see the package documentation. Ops may come in any
// order, except that a counter's Read and Write ops must be in the order
// the counter applied them, as [Counter] records them, and an observer's
// Observed ops in the order it received them.
//
// For a key of one holder, L2 and L3 are checked in grant order, as the
// grants were made one after another. For a key of n > 1 holders:
//
//   - L2: when an acquisition was granted, at most n-1 acquisitions with
//     smaller tokens may report Acquired after that moment. Each of them
//     held its lease in Redis from its grant until it last reported
//     Acquired (a correct guard does not report Acquired past its lease,
//     and a renewal never revives a lease that ended), so each held a
//     permit when Redis made the later grant;
//   - L3: tokens are distinct, and an acquisition granted (Lock returned)
//     before another's grant write was even sent has the smaller token.
//     The send time is the earliest Sent of the later acquisition's
//     Confirmed ops that named their token (a renewal filed by its value
//     was sent after the grant and does not count); acquisitions without
//     one are only checked for distinct tokens.
//
// One lease value may be granted more than once, each time with a token
// of its own; each grant is an acquisition of its own (a grant that no
// Lock returned is not checked, but its confirmations do not count for
// another grant of the same value). A Confirmed op that names its Lease
// and not its Token is filed under the grant of that value it belongs to:
// the latest grant known (from an op that carries its token) by the time
// the write was sent (Sent, or At without one). A renewal sent later may
// still have reached a newer grant, so the filing never credits a grant
// with a write that reached only a newer one, and a regain is checked on
// its own (L4): a guard that reports Acquired again after Lost, while
// another acquisition of the key was granted after its own grant (a larger
// token) and before the regain, was brought back by a write that extended
// someone else's grant.
func (c Config) Check(ops []Op) Report {
	var r Report
	ops = r.file(ops)
	acqs := make(map[acqID]*acqState)
	get := func(op Op) *acqState {
		id := acqID{op.Key, op.Client, op.Token}
		a := acqs[id]
		if a == nil {
			a = &acqState{Acq: Acq{Key: op.Key, Client: op.Client, Token: op.Token}}
			acqs[id] = a
		}
		if op.Lease != "" {
			a.lease = op.Lease
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
			a.granted, a.Granted, a.mode = true, op.At, op.Mode
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
			if op.Sent != 0 && (a.sent == 0 || op.Sent < a.sent) {
				a.sent = op.Sent
			}
		case Observed:
			r.Observations++
		case Downgraded:
			a := get(op)
			if a.downgraded == 0 || op.At < a.downgraded {
				a.downgraded = op.At
			}
		case Asked:
			a := get(op)
			if a.asked != nil {
				r.Malformed = append(r.Malformed, fmt.Sprintf("%v asked twice", a.Acq))
				continue
			}
			a.asked = &op
		case Lost:
			a := get(op)
			a.lost = append(a.lost, op.At)
		case Regained:
			a := get(op)
			a.regained = append(a.regained, op.At)
		case Released, Read, Write:
		default:
			r.Malformed = append(r.Malformed, fmt.Sprintf("op of unknown kind: %v", op))
		}
	}

	byKey := make(map[string][]*acqState)
	grants := make(map[leaseID][]*acqState) // every grant of each value, granted or not
	for _, a := range acqs {
		if a.lease != "" {
			grants[leaseID{a.Key, a.lease}] = append(grants[leaseID{a.Key, a.lease}], a)
		}
	}
	for id, list := range grants {
		if len(list) > 1 {
			tokens := make([]int64, len(list))
			for i, a := range list {
				tokens[i] = a.Token
			}
			slices.Sort(tokens)
			r.Regrants = append(r.Regrants, fmt.Sprintf("%s value %q granted under tokens %v", id.key, id.lease, tokens))
		}
	}
	slices.Sort(r.Regrants)
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
		r.checkL1(a, grants[leaseID{a.Key, a.lease}])
		byKey[a.Key] = append(byKey[a.Key], a)
	}
	for key, list := range byKey {
		switch n := c.permits(key); {
		case c.RW[key]:
			r.checkRW(list)
		case n > 1:
			r.checkPermits(list, n)
		default:
			r.checkOrder(list)
		}
		r.checkArrival(list)
		if c.permits(key) == 1 {
			r.checkRegains(list, c.RW[key])
		}
		r.Peak = max(r.Peak, peak(list))
	}
	r.checkCounter(ops)
	r.checkObservers(ops, byKey)
	slices.SortFunc(r.Overlaps, func(a, b Overlap) int { return cmp.Compare(a.Second.Granted, b.Second.Granted) })
	slices.SortFunc(r.Crowds, func(a, b Crowd) int { return cmp.Compare(a.Grant.Granted, b.Grant.Granted) })
	return r
}

// checkPermits checks L2 and L3 among the acquisitions of a key of n > 1
// permits; see [Config.Check].
func (r *Report) checkPermits(list []*acqState, n int) {
	byToken := slices.Clone(list)
	slices.SortFunc(byToken, func(a, b *acqState) int { return cmp.Compare(a.Token, b.Token) })
	for i, a := range byToken {
		if i > 0 && a.Token == byToken[i-1].Token {
			r.TokenOrder = append(r.TokenOrder, fmt.Sprintf("%v has the token of %v", a.Acq, byToken[i-1].Acq))
		}
		var earlier []Acq
		for _, e := range byToken[:i] {
			if e.LastHeld > a.Granted {
				earlier = append(earlier, e.Acq)
			}
		}
		if len(earlier) > n-1 {
			r.Crowds = append(r.Crowds, Crowd{Grant: a.Acq, Earlier: earlier, Permits: n})
		}
	}
	r.checkSent(list)
}

// checkSent checks L3 where grants are not made one after another (a
// semaphore's, a read-write lock's): an acquisition granted before
// another's grant was sent has the smaller token.
func (r *Report) checkSent(list []*acqState) {
	for _, a := range list {
		if a.sent == 0 {
			continue
		}
		for _, e := range list {
			if e != a && e.Granted < a.sent && e.Token >= a.Token {
				r.TokenOrder = append(r.TokenOrder, fmt.Sprintf("%v was granted %v before the grant of %v was sent, "+
					"with a token not below it", e.Acq, a.sent.Sub(e.Granted), a.Acq))
			}
		}
	}
}

// checkRW checks a read-write lock's acquisitions: no writer reports
// Acquired at the same moment as anyone else, by the argument of
// checkOrder made pairwise in token order (which is the order of the
// grants in Redis): an acquisition granted earlier than a writer (a smaller
// token) must not report Acquired after the writer was granted, and a
// writer (until its Downgrade began) must not report Acquired after a
// later acquisition was granted. Tokens are distinct, and checked against
// the send times as for a semaphore (checkSent).
func (r *Report) checkRW(list []*acqState) {
	byToken := slices.Clone(list)
	slices.SortFunc(byToken, func(a, b *acqState) int { return cmp.Compare(a.Token, b.Token) })
	var readers []*acqState
	for i, a := range byToken {
		if i > 0 && a.Token == byToken[i-1].Token {
			r.TokenOrder = append(r.TokenOrder, fmt.Sprintf("%v has the token of %v", a.Acq, byToken[i-1].Acq))
		}
		switch a.mode {
		case "write":
			for _, s := range a.samples {
				if a.downgraded == 0 || s.At < a.downgraded {
					a.lastWriteHeld = max(a.lastWriteHeld, s.At)
				}
			}
			if a.downgraded != 0 {
				readers = append(readers, a)
			}
		case "read":
			readers = append(readers, a)
		default:
			r.Malformed = append(r.Malformed, fmt.Sprintf("%v of a read-write lock granted without a mode", a.Acq))
		}
	}
	for i, a := range byToken {
		for _, e := range byToken[:i] {
			switch {
			case a.mode == "write" && e.LastHeld > a.Granted:
				r.Overlaps = append(r.Overlaps, Overlap{First: e.Acq, Second: a.Acq, By: e.LastHeld.Sub(a.Granted)})
			case e.mode == "write" && e.lastWriteHeld > a.Granted:
				r.Overlaps = append(r.Overlaps, Overlap{First: e.Acq, Second: a.Acq, By: e.lastWriteHeld.Sub(a.Granted)})
			}
		}
	}
	r.checkSent(list)
	r.Readers = max(r.Readers, peak(readers))
}

// checkArrival checks arrival order where the record has Asked ops: when
// a caller's first call left it in line before another's first call was
// sent, the other is not granted before it (a smaller token), whatever
// their modes or kinds.
func (r *Report) checkArrival(list []*acqState) {
	for _, a := range list {
		if a.asked == nil || !a.asked.Held {
			continue
		}
		for _, b := range list {
			if b != a && b.asked != nil && a.asked.At < b.asked.Sent && b.Token < a.Token {
				r.Arrival = append(r.Arrival, fmt.Sprintf("%v was granted ahead of %v, which stood in line %v before it asked",
					b.Acq, a.Acq, b.asked.Sent.Sub(a.asked.At)))
			}
		}
	}
}

// peak returns the largest number of the acquisitions in list whose spans,
// from grant to last held sample, share an instant.
func peak(list []*acqState) int {
	type edge struct {
		at    Mono
		delta int
	}
	var edges []edge
	for _, a := range list {
		if a.LastHeld > a.Granted {
			edges = append(edges, edge{a.Granted, 1}, edge{a.LastHeld, -1})
		}
	}
	// An end before a start at the same instant: spans that only touch do
	// not count as together.
	slices.SortFunc(edges, func(x, y edge) int { return cmp.Or(cmp.Compare(x.at, y.at), cmp.Compare(x.delta, y.delta)) })
	cur, most := 0, 0
	for _, e := range edges {
		cur += e.delta
		most = max(most, cur)
	}
	return most
}

// checkObservers checks the Observed ops of each observer of each key, in
// the order recorded: the tokens of the leaders an observer sees never go
// down; once it has seen that nobody leads after a term, it never sees that
// term again; and a leader seen under a token is the one that the token
// was granted to, for every observer.
func (r *Report) checkObservers(ops []Op, byKey map[string][]*acqState) {
	type observer struct{ key, name string }
	type seenState struct {
		highest int64 // the highest token seen
		ended   bool  // nobody led when last seen, after highest
	}
	seen := make(map[observer]*seenState)
	type term struct {
		key   string
		token int64
	}
	leaders := make(map[term]string) // what observers saw first under each token granted to nobody known
	granted := make(map[term]string) // whom each token was granted to
	for key, list := range byKey {
		for _, a := range list {
			granted[term{key, a.Token}] = a.Client
		}
	}
	unknown := make(map[term]bool)
	for _, op := range ops {
		if op.Kind != Observed {
			continue
		}
		o := observer{op.Key, op.Client}
		s := seen[o]
		if s == nil {
			s = &seenState{}
			seen[o] = s
		}
		if op.Token == 0 {
			if op.Leader != "" {
				r.Malformed = append(r.Malformed, fmt.Sprintf("%v: a leader without a token", op))
			}
			s.ended = true
			continue
		}
		switch {
		case op.Token < s.highest:
			r.Observers = append(r.Observers, fmt.Sprintf("%v: after token %d", op, s.highest))
		case op.Token == s.highest && s.ended:
			r.Observers = append(r.Observers, fmt.Sprintf("%v: the term again after it was seen to end", op))
		}
		if op.Token > s.highest {
			s.highest, s.ended = op.Token, false
		}
		t := term{op.Key, op.Token}
		if to, ok := granted[t]; ok {
			if to != op.Leader {
				r.Observers = append(r.Observers, fmt.Sprintf("%v: the token was granted to %s", op, to))
			}
			continue
		}
		unknown[t] = true
		if first, ok := leaders[t]; !ok {
			leaders[t] = op.Leader
		} else if first != op.Leader {
			r.Observers = append(r.Observers, fmt.Sprintf("%v: another observer saw %q under this token", op, first))
		}
	}
	r.UnknownTerms = len(unknown)
}

// checkL1 checks that every held sample of a started before the latest
// deadline allowed by a write confirmed before the sample ended. The library
// may have used any confirmation that arrived before State returned, and
// State compares the clock at some instant between the sample's start and
// end with its deadline; so a correct guard always passes, whatever the
// scheduling.
//
// others are the grants of a's value (a among them); a sample that only
// another grant's confirmation would cover says so.
func (r *Report) checkL1(a *acqState, others []*acqState) {
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
			r.L1 = append(r.L1, fmt.Sprintf("%v reported Acquired %v after its deadline%s", a.Acq, s.At.Sub(until), coveredBy(s, a, others)))
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

// leaseID names one lease value of one key.
type leaseID struct{ key, lease string }

// file returns ops with every Confirmed op that names its Lease but no
// Token filed under a grant of that value: the latest one known, from an
// op that carries its token, no later than the write's send time (At when
// Sent is 0). Ops that no grant is known for are dropped and counted in
// Unfiled. A filed op keeps no Sent (see checkSent). ops itself is not
// modified.
func (r *Report) file(ops []Op) []Op {
	type grant struct {
		token int64
		known Mono // the earliest op that carries the token
	}
	grants := make(map[leaseID][]grant)
	needed := false
	for _, op := range ops {
		if op.Lease == "" {
			continue
		}
		if op.Token == 0 {
			needed = needed || op.Kind == Confirmed
			continue
		}
		id := leaseID{op.Key, op.Lease}
		i := slices.IndexFunc(grants[id], func(g grant) bool { return g.token == op.Token })
		if i < 0 {
			grants[id] = append(grants[id], grant{op.Token, op.At})
		} else {
			grants[id][i].known = min(grants[id][i].known, op.At)
		}
	}
	if !needed {
		return ops
	}
	out := make([]Op, 0, len(ops))
	for _, op := range ops {
		if op.Kind == Confirmed && op.Token == 0 && op.Lease != "" {
			sent := op.Sent
			if sent == 0 {
				sent = op.At
			}
			var best grant
			for _, g := range grants[leaseID{op.Key, op.Lease}] {
				if g.known <= sent && (best.token == 0 || g.known > best.known) {
					best = g
				}
			}
			if best.token == 0 {
				r.Unfiled++
				continue
			}
			// Its send time placed it; it says nothing of when the grant
			// was sent (a renewal comes after it), which is what a grant's
			// Sent tells the check of token order.
			op.Token, op.Sent = best.token, 0
		}
		out = append(out, op)
	}
	return out
}

// coveredBy says, for a held sample s of a past every deadline that a's
// own confirmations allow, which other grant of a's value had a
// confirmation that would have covered it: the write that kept a's guard
// going extended a grant that was not a's.
func coveredBy(s Op, a *acqState, others []*acqState) string {
	for _, o := range others {
		if o == a {
			continue
		}
		for _, c := range o.confirms {
			if c.At <= s.End && s.At < c.Until {
				return fmt.Sprintf(" (a write confirmed for token %d, a later grant of the same value, would cover it)", o.Token)
			}
		}
	}
	return ""
}

// checkRegains checks L4 on a key of one holder (or a read-write lock's,
// where it concerns a writer): a Regained op of an acquisition a at R is
// a breach when another acquisition e of the key, with a larger token
// (granted after a, by L3), was granted before R. The key held e's grant
// after a's, so whatever renewal brought a back found a value that a grant
// of its own had not left there.
func (r *Report) checkRegains(list []*acqState, rw bool) {
	for _, a := range list {
		for _, at := range a.regained {
			for _, e := range list {
				if e == a || e.Token <= a.Token || e.Granted >= at {
					continue
				}
				if rw && a.mode != "write" && e.mode != "write" {
					continue // readers share
				}
				var last Mono
				for _, l := range a.lost {
					if l <= at {
						last = max(last, l)
					}
				}
				lost := "without a Lost before it"
				if last != 0 {
					lost = fmt.Sprintf("Lost %v before", at.Sub(last))
				}
				r.L4 = append(r.L4, fmt.Sprintf("%v regained its lease %v after %v was granted (%s)",
					a.Acq, at.Sub(e.Granted), e.Acq, lost))
				break
			}
		}
	}
}
