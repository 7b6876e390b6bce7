// Package history records what the clients of a distlock lock saw, and checks
// the record against the lease contract (SAFETY.md, L1 to L3) and against a
// fenced counter that the holders update.
//
// A test gives every client the same [Recorder]. Each client adds an [Op] for
// every grant, for periodic State samples, for the Lost and regained events
// its guard publishes, for every write that Redis confirmed (seen on the wire)
// and for its release; a [Counter] adds the reads and writes that holders
// make under their fencing tokens, in the order it applied them. [Check] then
// looks at the whole record at once:
//
//   - L1: a guard reports Acquired only before the deadline that the last
//     confirmed write allows (its send time plus the TTL minus the margin);
//   - L2: no two acquisitions of a key report Acquired at the same moment;
//   - L3: tokens strictly increase in grant order;
//   - L4: a guard that regains its lease after Lost does so only when
//     nobody else held the key in between;
//   - the counter accepts no operation with a token below one it already
//     accepted, and no accepted write loses an update.
//
// A key may allow several holders at once (a semaphore's permits; see
// [Config]): then the history may show up to that many at once, and L2
// and L3 take the form that fits. An election is a key of one holder, whose
// observers add what they saw ([Observed]); Check makes sure that no
// observer saw the terms out of order, or a leader under another's token.
// A read-write lock's key ([Config].RW) has readers and writers (the Mode
// of each Granted op): no writer may report Acquired at the same moment as
// anyone else. And where the record says who stood in line when ([Asked]),
// Check makes sure that nobody got ahead of a caller that stood in line
// before it asked (arrival order).
//
// Times are readings of the machine's monotonic clock ([Mono]), so ops
// recorded by a helper process line up with the test's own.
package history

import (
	"fmt"
	"slices"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Mono is a reading of the machine's monotonic clock (CLOCK_MONOTONIC) in
// nanoseconds. Unlike the monotonic part of a [time.Time], which Go counts
// from the start of each process, it means the same in every process on the
// machine.
type Mono int64

// baseTime and baseMono are the same instant read from both clocks.
var baseTime, baseMono = readBase()

func readBase() (time.Time, Mono) {
	var ts unix.Timespec
	before := time.Now()
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic(fmt.Sprintf("history: reading CLOCK_MONOTONIC: %v", err))
	}
	after := time.Now()
	// Take the middle of the two Go readings: Go's monotonic clock is
	// CLOCK_MONOTONIC shifted by a per-process constant, so the error is at
	// most half the time the system call took.
	return before.Add(after.Sub(before) / 2), Mono(ts.Nano())
}

// Now returns the current monotonic reading.
func Now() Mono { return At(time.Now()) }

// At converts t, read from time.Now in this process (so that it carries a
// monotonic reading), to a Mono.
func At(t time.Time) Mono { return baseMono + Mono(t.Sub(baseTime)) }

// Sub returns m-o as a duration.
func (m Mono) Sub(o Mono) time.Duration { return time.Duration(m - o) }

// Add returns m+d.
func (m Mono) Add(d time.Duration) Mono { return m + Mono(d) }

// Kind says what an [Op] records.
type Kind uint8

// The kinds of Op. Every kind but Read and Write belongs to one acquisition,
// named by Key, Client and Token.
const (
	// Granted: Lock returned the guard. At is read right after it returned.
	Granted Kind = iota + 1
	// Sample: State was called. At is read just before the call and End
	// just after it; Held says whether it returned Acquired.
	Sample
	// Lost: the guard published Lost. At is the event's time.
	Lost
	// Regained: the guard published Acquired again after Lost. At is the
	// event's time.
	Regained
	// Released: Release returned. Held says whether it returned Released
	// (rather than Lost).
	Released
	// Confirmed: Redis confirmed a write of this acquisition's lease (the
	// acquire or a renewal). At is when the reply arrived; Until is the
	// latest deadline the write allows: the time the call was made (no
	// earlier than the library's send time) plus the TTL minus the margin.
	Confirmed
	// Read: a holder read the [Counter] with Token. Value is what it read;
	// OK says whether the counter accepted the token.
	Read
	// Write: a holder wrote Value to the [Counter] with Token; OK says
	// whether the counter accepted it.
	Write
	// Observed: an observer of an election, named by Client, learnt that
	// Leader leads with Token (both empty: that nobody leads). At is when
	// the observer received it.
	Observed
	// Downgraded: a read-write lock's write acquisition called Downgrade,
	// which succeeded. At is read just before the call: from then on the
	// acquisition counts as a reader.
	Downgraded
	// Asked: the first acquire call of an acquisition. Sent is when it was
	// sent, At when its reply came; Held says whether the reply left the
	// caller standing in line. A caller in line at At is ahead of every
	// caller whose first call was sent after At (see [Config.Check]).
	Asked
)

var kindNames = [...]string{
	Granted:    "granted",
	Sample:     "sample",
	Lost:       "lost",
	Regained:   "regained",
	Released:   "released",
	Confirmed:  "confirmed",
	Read:       "read",
	Write:      "write",
	Observed:   "observed",
	Downgraded: "downgraded",
	Asked:      "asked",
}

func (k Kind) String() string {
	if int(k) < len(kindNames) && kindNames[k] != "" {
		return kindNames[k]
	}
	return fmt.Sprintf("Kind(%d)", k)
}

// MarshalText encodes k by name, for the JSON lines a helper process sends.
func (k Kind) MarshalText() ([]byte, error) {
	if int(k) >= len(kindNames) || kindNames[k] == "" {
		return nil, fmt.Errorf("history: unknown kind %d", k)
	}
	return []byte(kindNames[k]), nil
}

// UnmarshalText decodes a name written by MarshalText.
func (k *Kind) UnmarshalText(b []byte) error {
	for i, name := range kindNames {
		if name != "" && name == string(b) {
			*k = Kind(i)
			return nil
		}
	}
	return fmt.Errorf("history: unknown kind %q", b)
}

// Op is one thing a client saw or did.
type Op struct {
	Kind   Kind   `json:"kind"`
	At     Mono   `json:"at"`
	End    Mono   `json:"end,omitzero"`   // Sample: when State returned
	Until  Mono   `json:"until,omitzero"` // Confirmed: the latest deadline the write allows
	Key    string `json:"key,omitzero"`   // the lock (or the counter, for Read and Write)
	Client string `json:"client"`
	Token  int64  `json:"token"`
	Held   bool   `json:"held,omitzero"`  // Sample: Acquired; Released: returned Released
	Value  int64  `json:"value,omitzero"` // Read and Write
	OK     bool   `json:"ok,omitzero"`    // Read and Write: accepted
	// Sent, for Confirmed, is a time before Redis applied the write, if the
	// recorder knows one (0 otherwise): the call's send time for an acquire
	// or a renewal; for a grant passed to a waiter, the send time of a call
	// that found the waiter still in line. An op that names its Token
	// says with Sent when its grant was sent, at the latest (the check of
	// token order reads it); one filed by its Lease places itself by it.
	Sent   Mono   `json:"sent,omitzero"`
	Leader string `json:"leader,omitzero"` // Observed: the leader's value
	// Mode, for the Granted op of a read-write lock's acquisition, is
	// "read" or "write".
	Mode string `json:"mode,omitzero"`
	// Lease is the value the acquisition wrote into the lease, where the
	// recorder knows it. One value can be granted more than once, each
	// grant with a token of its own (a delayed acquire call that lands
	// after the value's grant ended grants it anew), so a Confirmed op
	// that names its Lease but not its Token (0) is filed by Check under
	// the grant of that value it belongs to; see [Config.Check].
	Lease string `json:"lease,omitzero"`
}

func (o Op) String() string {
	s := fmt.Sprintf("%s %s/%s token %d at %d", o.Kind, o.Key, o.Client, o.Token, o.At)
	switch o.Kind {
	case Sample, Released, Asked:
		s += fmt.Sprintf(" held=%t", o.Held)
	case Granted:
		if o.Mode != "" {
			s += " for " + o.Mode
		}
	case Confirmed:
		s += fmt.Sprintf(" until %d", o.Until)
	case Read, Write:
		s += fmt.Sprintf(" value %d ok=%t", o.Value, o.OK)
	case Observed:
		s = fmt.Sprintf("%s %s by %s: leader %q token %d at %d", o.Kind, o.Key, o.Client, o.Leader, o.Token, o.At)
	}
	return s
}

// Recorder collects ops from any number of goroutines. Its zero value is
// ready to use.
type Recorder struct {
	mu  sync.Mutex
	ops []Op
}

// Add records op.
func (r *Recorder) Add(op Op) {
	r.mu.Lock()
	r.ops = append(r.ops, op)
	r.mu.Unlock()
}

// Ops returns a copy of everything recorded so far, in the order it was
// added.
func (r *Recorder) Ops() []Op {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.ops)
}

// Counter is a fenced resource: an integer that lock holders read and write
// back incremented, passing their fencing token with every call. Like
// storage that honours fencing tokens, it refuses any call whose token is
// below the highest it has seen, reads included (a holder that read under an
// old token must not write what it computed from that read). It records
// every call, accepted or refused, in its Recorder in the order it applied
// them. It is safe for concurrent use.
type Counter struct {
	rec *Recorder
	key string

	mu      sync.Mutex
	value   int64
	highest int64
}

// NewCounter returns a counter at zero that records its calls in rec under
// key.
func NewCounter(rec *Recorder, key string) *Counter {
	return &Counter{rec: rec, key: key}
}

// Read returns the counter's value and true, or 0 and false if token is
// below the highest token seen.
func (c *Counter) Read(client string, token int64) (int64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ok := token >= c.highest
	var v int64
	if ok {
		c.highest, v = token, c.value
	}
	c.rec.Add(Op{Kind: Read, At: Now(), Key: c.key, Client: client, Token: token, Value: v, OK: ok})
	return v, ok
}

// Write sets the counter to v and reports true, or reports false and leaves
// it alone if token is below the highest token seen.
func (c *Counter) Write(client string, token, v int64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	ok := token >= c.highest
	if ok {
		c.highest, c.value = token, v
	}
	c.rec.Add(Op{Kind: Write, At: Now(), Key: c.key, Client: client, Token: token, Value: v, OK: ok})
	return ok
}

// Value returns the counter's value.
func (c *Counter) Value() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.value
}
