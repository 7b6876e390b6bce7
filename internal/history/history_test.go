package history_test

import (
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/distkit-go/distlock/internal/history"
)

const ms = history.Mono(time.Millisecond)

// builder writes histories by hand: one key, times in milliseconds.
type builder struct{ ops []history.Op }

func (b *builder) add(op history.Op) *builder {
	if op.Key == "" {
		op.Key = "lock"
	}
	b.ops = append(b.ops, op)
	return b
}

func (b *builder) grant(client string, token int64, at history.Mono) *builder {
	return b.add(history.Op{Kind: history.Granted, At: at * ms, Client: client, Token: token})
}

// confirm records a write confirmed at at whose deadline is until.
func (b *builder) confirm(client string, token int64, at, until history.Mono) *builder {
	return b.add(history.Op{Kind: history.Confirmed, At: at * ms, Until: until * ms, Client: client, Token: token})
}

// sample records a State sample from at to at+1µs.
func (b *builder) sample(client string, token int64, at history.Mono, held bool) *builder {
	return b.add(history.Op{Kind: history.Sample, At: at * ms, End: at*ms + 1000, Client: client, Token: token, Held: held})
}

func (b *builder) counter(kind history.Kind, client string, token, value int64, ok bool) *builder {
	return b.add(history.Op{Kind: kind, Key: "counter", Client: client, Token: token, Value: value, OK: ok})
}

// good is a history that keeps the contract: a holds token 10 from 0 to
// 100 ms, b holds token 20 from 150 ms on, each increments the counter, and
// a stale write by a is refused.
func good() *builder {
	b := &builder{}
	b.confirm("a", 10, 0, 90).grant("a", 10, 1).
		sample("a", 10, 2, true).counter(history.Read, "a", 10, 0, true).counter(history.Write, "a", 10, 1, true).
		confirm("a", 10, 40, 120).sample("a", 10, 100, true).sample("a", 10, 121, false)
	b.confirm("b", 20, 149, 300).grant("b", 20, 150).sample("b", 20, 151, true).
		counter(history.Read, "b", 20, 1, true).counter(history.Write, "b", 20, 2, true).
		counter(history.Write, "a", 10, 2, false)
	return b
}

func TestCheckGoodHistory(t *testing.T) {
	r := history.Check(good().ops)
	require.NoError(t, r.Err())
	assert.Equal(t, 2, r.Acquisitions)
	assert.Equal(t, 4, r.Samples)
	assert.Equal(t, 3, r.HeldSamples)
	assert.Zero(t, r.Unchecked)
	assert.Equal(t, 2, r.Reads)
	assert.Equal(t, 2, r.Writes)
	assert.Equal(t, 1, r.Refused)
	assert.Equal(t, int64(2), r.Final)
	assert.Contains(t, r.Summary(), "overlaps=0")
	assert.Contains(t, r.Summary(), "stale_refused=1")
}

func TestCheckFindsOverlap(t *testing.T) {
	// a still says Acquired at 160 ms, after b was granted at 150 ms.
	b := good().sample("a", 10, 160, true)
	r := history.Check(b.ops)
	require.Error(t, r.Err())
	require.Len(t, r.Overlaps, 1)
	o := r.Overlaps[0]
	assert.Equal(t, "a", o.First.Client)
	assert.Equal(t, "b", o.Second.Client)
	assert.Equal(t, 10*time.Millisecond, o.By)
	assert.Contains(t, r.Err().Error(), "L2 overlaps: 1")
	// The same sample is also past a's deadline.
	assert.Len(t, r.L1, 1)
}

func TestCheckOverlapWithOneSampleLeft(t *testing.T) {
	// Three holders: c's grant comes after b's, but a (the first) reported
	// Acquired past both grants. Both later grants overlap with a.
	b := &builder{}
	b.confirm("a", 1, 0, 1000).grant("a", 1, 1).sample("a", 1, 500, true)
	b.confirm("b", 2, 100, 1000).grant("b", 2, 100)
	b.confirm("c", 3, 200, 1000).grant("c", 3, 200)
	r := history.Check(b.ops)
	require.Len(t, r.Overlaps, 2)
	assert.Equal(t, "b", r.Overlaps[0].Second.Client)
	assert.Equal(t, "c", r.Overlaps[1].Second.Client)
	assert.Equal(t, "a", r.Overlaps[1].First.Client)
}

func TestCheckOverlapAcrossKeysIsFine(t *testing.T) {
	b := &builder{}
	b.confirm("a", 1, 0, 1000).grant("a", 1, 1).sample("a", 1, 500, true)
	b.add(history.Op{Kind: history.Confirmed, Key: "other", At: 100 * ms, Until: 1000 * ms, Client: "b", Token: 2})
	b.add(history.Op{Kind: history.Granted, Key: "other", At: 100 * ms, Client: "b", Token: 2})
	require.NoError(t, history.Check(b.ops).Err())
}

func TestCheckFindsTokenGoingBack(t *testing.T) {
	b := &builder{}
	b.confirm("a", 20, 0, 90).grant("a", 20, 1)
	b.confirm("b", 10, 150, 300).grant("b", 10, 150)
	r := history.Check(b.ops)
	require.Len(t, r.TokenOrder, 1)
	assert.Contains(t, r.TokenOrder[0], "b token 10 granted after lock/a token 20")
	assert.Contains(t, r.Err().Error(), "L3 token order")
}

func TestCheckFindsRepeatedToken(t *testing.T) {
	b := &builder{}
	b.confirm("a", 10, 0, 90).grant("a", 10, 1)
	b.confirm("b", 10, 150, 300).grant("b", 10, 150)
	require.Len(t, history.Check(b.ops).TokenOrder, 1)
}

func TestCheckFindsHeldPastDeadline(t *testing.T) {
	b := &builder{}
	b.confirm("a", 1, 0, 100).grant("a", 1, 1).sample("a", 1, 99, true).sample("a", 1, 100, true)
	r := history.Check(b.ops)
	require.Len(t, r.L1, 1, "held at 99 ms is fine, at 100 ms is not")
	assert.Contains(t, r.L1[0], "after its deadline")
}

func TestCheckL1IgnoresLaterConfirmation(t *testing.T) {
	// A renewal confirmed at 130 ms cannot vouch for a sample that ended at
	// 120 ms.
	b := &builder{}
	b.confirm("a", 1, 0, 100).grant("a", 1, 1).sample("a", 1, 120, true).confirm("a", 1, 130, 230)
	require.Len(t, history.Check(b.ops).L1, 1)

	// Confirmed within the sample (before State returned), it can.
	b = &builder{}
	b.confirm("a", 1, 0, 100).grant("a", 1, 1).
		add(history.Op{Kind: history.Sample, At: 120 * ms, End: 131 * ms, Client: "a", Token: 1, Held: true}).
		confirm("a", 1, 130, 230)
	require.NoError(t, history.Check(b.ops).Err())
}

func TestCheckFindsHeldBeforeConfirmation(t *testing.T) {
	b := &builder{}
	b.grant("a", 1, 1).sample("a", 1, 2, true).confirm("a", 1, 50, 100)
	r := history.Check(b.ops)
	require.Len(t, r.L1, 1)
	assert.Contains(t, r.L1[0], "before any write was confirmed")
}

func TestCheckCountsUncheckedSamples(t *testing.T) {
	// Without wire records L1 cannot be checked; the samples are counted so
	// that a test can tell.
	b := &builder{}
	b.grant("a", 1, 1).sample("a", 1, 2, true).sample("a", 1, 3, true)
	r := history.Check(b.ops)
	require.NoError(t, r.Err())
	assert.Equal(t, 2, r.Unchecked)
}

func TestCheckFindsStaleWriteAccepted(t *testing.T) {
	b := good()
	b.ops = b.ops[:len(b.ops)-1] // drop a's refused write
	b.counter(history.Write, "a", 10, 3, true)
	r := history.Check(b.ops)
	require.Len(t, r.Stale, 1)
	assert.Contains(t, r.Stale[0], "accepted after token 20")
	assert.Contains(t, r.Err().Error(), "stale counter calls accepted: 1")
}

func TestCheckFindsStaleReadAccepted(t *testing.T) {
	b := good().counter(history.Read, "a", 10, 2, true)
	require.Len(t, history.Check(b.ops).Stale, 1)
}

func TestCheckFindsLostUpdate(t *testing.T) {
	// a and b both read 0 and both write 1: one increment is lost.
	b := &builder{}
	b.confirm("a", 1, 0, 1000).grant("a", 1, 1).confirm("b", 2, 0, 1000).grant("b", 2, 2)
	b.counter(history.Read, "a", 1, 0, true).counter(history.Read, "b", 2, 0, true).
		counter(history.Write, "b", 2, 1, true).counter(history.Write, "b", 2, 1, true)
	r := history.Check(b.ops)
	require.Len(t, r.LostUpdates, 1)
	assert.Contains(t, r.LostUpdates[0], "value 1 ok=true over 1")
	assert.Equal(t, int64(1), r.Final)
}

func TestCheckFindsMalformed(t *testing.T) {
	cases := map[string]*builder{
		"granted twice":        good().grant("a", 10, 5),
		"held without a grant": (&builder{}).sample("x", 7, 5, true),
		"sampled before grant": (&builder{}).confirm("a", 1, 0, 100).sample("a", 1, 1, true).grant("a", 1, 2),
		"refused current":      good().counter(history.Write, "b", 20, 3, false),
		"read the wrong value": good().counter(history.Read, "b", 20, 7, true),
		"ends before it starts": (&builder{}).add(history.Op{
			Kind: history.Sample, At: 5 * ms, End: 4 * ms, Client: "a",
		}),
		"unknown kind": (&builder{}).add(history.Op{Kind: 99, Client: "a"}),
	}
	for name, b := range cases {
		t.Run(name, func(t *testing.T) {
			r := history.Check(b.ops)
			require.NotEmpty(t, r.Malformed, "ops: %v", b.ops)
			require.Error(t, r.Err())
		})
	}
}

func TestErrListsAtMostAFew(t *testing.T) {
	b := &builder{}
	b.confirm("a", 1, 0, 10).grant("a", 1, 1)
	for i := range 20 {
		b.sample("a", 1, 10+history.Mono(i), true)
	}
	r := history.Check(b.ops)
	require.Len(t, r.L1, 20)
	assert.Contains(t, r.Err().Error(), "L1 held past the deadline: 20")
	assert.Less(t, len(r.Err().Error()), 2000, "error too long: %v", r.Err())
}

func TestCounter(t *testing.T) {
	var rec history.Recorder
	c := history.NewCounter(&rec, "counter")

	v, ok := c.Read("a", 5)
	require.True(t, ok)
	require.Equal(t, int64(0), v)
	require.True(t, c.Write("a", 5, 1))

	// A higher token is accepted, and from then on the lower one is not.
	v, ok = c.Read("b", 6)
	require.True(t, ok)
	require.Equal(t, int64(1), v)
	_, ok = c.Read("a", 5)
	require.False(t, ok, "read with a stale token")
	require.False(t, c.Write("a", 5, 2), "write with a stale token")
	require.True(t, c.Write("b", 6, 2))
	require.Equal(t, int64(2), c.Value())

	r := history.Check(rec.Ops())
	require.NoError(t, r.Err())
	assert.Equal(t, 2, r.Reads)
	assert.Equal(t, 2, r.Writes)
	assert.Equal(t, 2, r.Refused)
	assert.Equal(t, int64(2), r.Final)
}

func TestCounterConcurrentHoldersWithoutLock(t *testing.T) {
	// Holders that all use the same token (no lock at all) do lose updates,
	// and the checker says so: the check can fail.
	var rec history.Recorder
	c := history.NewCounter(&rec, "counter")
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range 4 {
		wg.Go(func() {
			<-start
			for range 200 {
				v, _ := c.Read("x", 1)
				c.Write("x", 1, v+1)
			}
		})
	}
	close(start)
	wg.Wait()
	r := history.Check(rec.Ops())
	assert.Equal(t, 800, r.Writes)
	if c.Value() < 800 {
		assert.NotEmpty(t, r.LostUpdates, "counter at %d after 800 increments", c.Value())
	} else {
		assert.Empty(t, r.LostUpdates)
	}
	assert.Equal(t, c.Value(), r.Final)
}

func TestMono(t *testing.T) {
	var ts unix.Timespec
	require.NoError(t, unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts))
	now := history.Now()
	// The process-independent reading agrees with the system clock to well
	// within a millisecond (allow for a descheduled test).
	assert.InDelta(t, float64(ts.Nano()), float64(now), float64(50*time.Millisecond))

	t0 := time.Now()
	m0 := history.At(t0)
	assert.Equal(t, 5*time.Millisecond, history.At(t0.Add(5*time.Millisecond)).Sub(m0))
	assert.Equal(t, m0.Add(time.Second), history.At(t0.Add(time.Second)))
	assert.GreaterOrEqual(t, history.Now(), now, "monotonic")
}

func TestOpJSON(t *testing.T) {
	op := history.Op{Kind: history.Confirmed, At: 5, Until: 9, Key: "k", Client: "c", Token: 3}
	b, err := json.Marshal(op)
	require.NoError(t, err)
	assert.JSONEq(t, `{"kind":"confirmed","at":5,"until":9,"key":"k","client":"c","token":3}`, string(b))
	var back history.Op
	require.NoError(t, json.Unmarshal(b, &back))
	assert.Equal(t, op, back)

	require.Error(t, json.Unmarshal([]byte(`{"kind":"nonsense"}`), &back))
	_, err = json.Marshal(history.Op{Kind: 0})
	require.Error(t, err)
	assert.Equal(t, "Kind(42)", history.Kind(42).String())
}
