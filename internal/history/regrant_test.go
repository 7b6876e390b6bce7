package history_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock/internal/history"
)

// Histories where one lease value is granted more than once (fault 1 of
// issue 31: a delayed acquire call grants a value anew after its grant
// ended), and regains (SAFETY.md L4).

// lost records a's Lost event at at; regained its Acquired-again event.
func (b *builder) lost(client string, token int64, at history.Mono) *builder {
	return b.add(history.Op{Kind: history.Lost, At: at * ms, Client: client, Token: token})
}

func (b *builder) regained(client string, token int64, at history.Mono) *builder {
	return b.add(history.Op{Kind: history.Regained, At: at * ms, Client: client, Token: token})
}

// confirmValue records a write of the value lease confirmed at at, sent at
// sent, whose deadline is until, with its grant's token if the recorder
// knows it (token 0: Check files it).
func (b *builder) confirmValue(client, lease string, token int64, sent, at, until history.Mono) *builder {
	return b.add(history.Op{Kind: history.Confirmed, Sent: sent * ms, At: at * ms, Until: until * ms,
		Client: client, Token: token, Lease: lease})
}

// TestCheckRegainWhileNobodyHeld: replies held past the deadline, then a
// renewal finds the key still holding a's grant: a legitimate regain.
func TestCheckRegainWhileNobodyHeld(t *testing.T) {
	b := &builder{}
	b.confirmValue("a", "a-1", 10, 0, 1, 90).grant("a", 10, 2).sample("a", 10, 3, true).
		lost("a", 10, 90).sample("a", 10, 95, false).
		confirmValue("a", "a-1", 0, 60, 100, 150).regained("a", 10, 101).sample("a", 10, 102, true)
	b.confirmValue("c", "c-1", 20, 200, 201, 300).grant("c", 20, 202).sample("c", 20, 203, true)
	r := history.Check(b.ops)
	require.NoError(t, r.Err())
	assert.Empty(t, r.L4)
	assert.Empty(t, r.Regrants)
	assert.Zero(t, r.Unfiled)
	assert.Contains(t, r.Summary(), "l4_violations=0 regrants=0 unfiled=0")
}

// fault1 is fault 1 of issue 31: a's grant (token 10) ends at its deadline
// (Lost at 90), c is granted token 20 and releases, then a's delayed
// refresh grants a's value anew with token 30 and a's renewal, sent
// before that grant was known, extends it: a is Acquired again.
func fault1() *builder {
	b := &builder{}
	b.confirmValue("a", "a-1", 10, 0, 1, 90).grant("a", 10, 2).sample("a", 10, 3, true).
		lost("a", 10, 90)
	b.confirmValue("c", "c-1", 20, 110, 111, 200).grant("c", 20, 112).sample("c", 20, 113, true).
		add(history.Op{Kind: history.Released, At: 120 * ms, Client: "c", Token: 20, Held: true})
	// The delayed refresh's reply, then a renewal sent after it (token
	// 30's), then a's regain.
	b.confirmValue("a", "a-1", 30, 60, 140, 400).
		confirmValue("a", "a-1", 0, 141, 145, 400).
		regained("a", 10, 146)
	return b
}

func TestCheckFindsRegainAfterAnotherHeld(t *testing.T) {
	r := history.Check(fault1().ops)
	require.Error(t, r.Err())
	require.Len(t, r.L4, 1, "L4: %v", r.L4)
	assert.Contains(t, r.L4[0], "lock/a token 10 regained its lease")
	assert.Contains(t, r.L4[0], "after lock/c token 20 was granted")
	assert.Contains(t, r.Err().Error(), "L4 regained after another held")
	assert.Equal(t, []string{`lock value "a-1" granted under tokens [10 30]`}, r.Regrants)
	assert.Equal(t, 2, r.Acquisitions, "the grant that no Lock returned is not an acquisition")
	assert.Contains(t, r.Summary(), "l4_violations=1 regrants=1 unfiled=0")

	t.Run("held sample", func(t *testing.T) {
		// a also reports Acquired after the regain: its own confirmations
		// end at 90, and the write that covers the sample extended token
		// 30's grant, not a's.
		r := history.Check(fault1().sample("a", 10, 150, true).ops)
		require.Len(t, r.L1, 1, "L1: %v", r.L1)
		assert.Contains(t, r.L1[0], "lock/a token 10 reported Acquired 60ms after its deadline")
		assert.Contains(t, r.L1[0], "token 30, a later grant of the same value")
		assert.Len(t, r.L4, 1)
	})
	t.Run("regain before the other's grant", func(t *testing.T) {
		// The same moves, but a regained before c was granted: not L4.
		b := &builder{}
		b.confirmValue("a", "a-1", 10, 0, 1, 90).grant("a", 10, 2).lost("a", 10, 90).
			confirmValue("a", "a-1", 10, 60, 95, 150).regained("a", 10, 96)
		b.confirmValue("c", "c-1", 20, 160, 161, 300).grant("c", 20, 162)
		assert.Empty(t, history.Check(b.ops).L4)
	})
}

// TestCheckFilesConfirmationsByGrant: a confirmation that names its value
// and not its token counts for the latest grant of that value known when
// the write was sent.
func TestCheckFilesConfirmationsByGrant(t *testing.T) {
	b := &builder{}
	// Token 30 becomes known at 55: the write sent at 50 is a's, the one
	// sent at 70 token 30's. a's sample at 140 is covered by the first.
	b.confirmValue("a", "a-1", 10, 0, 1, 90).grant("a", 10, 2).
		confirmValue("a", "a-1", 0, 50, 60, 150).
		confirmValue("a", "a-1", 30, 20, 55, 300).
		confirmValue("a", "a-1", 0, 70, 75, 200).
		sample("a", 10, 140, true)
	r := history.Check(b.ops)
	require.NoError(t, r.Err())
	assert.Zero(t, r.Unfiled)

	late := b.sample("a", 10, 160, true) // only token 30's write covers it
	r = history.Check(late.ops)
	require.Len(t, r.L1, 1, "L1: %v", r.L1)
	assert.Contains(t, r.L1[0], "token 30")

	t.Run("unfiled", func(t *testing.T) {
		b := &builder{}
		// The first confirmation comes before any grant of a-1 is known.
		b.confirmValue("a", "a-1", 0, 0, 1, 90).
			confirmValue("a", "a-1", 10, 5, 6, 90).grant("a", 10, 7).sample("a", 10, 8, true)
		r := history.Check(b.ops)
		require.NoError(t, r.Err())
		assert.Equal(t, 1, r.Unfiled)
		assert.Equal(t, 1, r.HeldSamples)
	})
}

// TestCheckRegainsByKind: L4 concerns keys of one holder; on a read-write
// lock, readers share, so only a regain where a writer is concerned counts;
// a semaphore's permits are leases of their own and are not checked.
func TestCheckRegainsByKind(t *testing.T) {
	build := func(modeA, modeC string) []history.Op {
		b := &builder{}
		b.add(history.Op{Kind: history.Granted, At: 2 * ms, Client: "a", Token: 10, Mode: modeA}).lost("a", 10, 90).
			add(history.Op{Kind: history.Granted, At: 112 * ms, Client: "c", Token: 20, Mode: modeC}).
			regained("a", 10, 146)
		return b.ops
	}
	rw := history.Config{RW: map[string]bool{"lock": true}}
	assert.Empty(t, rw.Check(build("read", "read")).L4, "two readers")
	assert.Len(t, rw.Check(build("read", "write")).L4, 1, "a writer after a reader")
	assert.Len(t, rw.Check(build("write", "read")).L4, 1, "a reader after a writer")
	sem := history.Config{Permits: map[string]int{"lock": 2}}
	assert.Empty(t, sem.Check(build("", "")).L4, "two permits")
	assert.Len(t, history.Check(build("", "")).L4, 1, "a lock")
}

// TestCheckFiledSendIsNotTheGrants: on a key of several holders, token
// order is checked against the send time of each grant. A renewal filed by
// its value was sent after its grant, so its send time must not stand in
// for the grant's: b, granted between a's grant and a's renewal with a
// larger token, is in order.
func TestCheckFiledSendIsNotTheGrants(t *testing.T) {
	b := &builder{}
	b.confirmValue("a", "a-1", 10, 0, 1, 300).grant("a", 10, 2).
		confirmValue("b", "b-1", 20, 3, 4, 300).grant("b", 20, 5).
		confirmValue("a", "a-1", 0, 50, 51, 350)
	sem := history.Config{Permits: map[string]int{"lock": 2}}
	r := sem.Check(b.ops)
	require.NoError(t, r.Err())
	assert.Zero(t, r.Unfiled)

	// The same renewal recorded under its token, as a grant: b's grant came
	// before it was sent, with a larger token, which is out of order.
	b = &builder{}
	b.confirmValue("a", "a-1", 10, 50, 51, 300).grant("a", 10, 52).
		confirmValue("b", "b-1", 20, 3, 4, 300).grant("b", 20, 5)
	assert.NotEmpty(t, sem.Check(b.ops).TokenOrder)
}
