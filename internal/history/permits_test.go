package history_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock/internal/history"
)

// two is the Config of a history whose key "lock" has two permits.
var two = history.Config{Permits: map[string]int{"lock": 2}}

// confirmSent records a write sent at sent, confirmed at at, whose deadline
// is until.
func (b *builder) confirmSent(client string, token int64, sent, at, until history.Mono) *builder {
	return b.add(history.Op{Kind: history.Confirmed, Sent: sent * ms, At: at * ms, Until: until * ms,
		Client: client, Token: token})
}

// hold records a grant of client with token at from, confirmed by a write
// sent just before, and held samples every 10 ms until to (exclusive).
func (b *builder) hold(client string, token int64, from, to history.Mono) *builder {
	b.confirmSent(client, token, from-1, from, to+50).grant(client, token, from)
	for at := from + 1; at < to; at += 10 {
		b.sample(client, token, at, true)
	}
	return b
}

// semaphore is a history of a key of two permits that keeps the contract:
// a and b hold at once, c waits for a's permit, d for b's.
func semaphore() *builder {
	b := &builder{}
	b.hold("a", 10, 0, 100).hold("b", 20, 5, 200)
	b.hold("c", 30, 110, 300).hold("d", 40, 210, 400)
	return b
}

func TestCheckPermitsGoodHistory(t *testing.T) {
	r := two.Check(semaphore().ops)
	require.NoError(t, r.Err())
	assert.Equal(t, 4, r.Acquisitions)
	assert.Equal(t, 2, r.Peak)
	assert.Empty(t, r.Overlaps)
	assert.Contains(t, r.Summary(), "crowds=0 peak=2")

	// The same history breaks the rule of a lock: checked as one, it
	// overlaps.
	r = history.Check(semaphore().ops)
	assert.NotEmpty(t, r.Overlaps)
	assert.Equal(t, 2, r.Peak)
}

func TestCheckPermitsFindsThreeAtOnce(t *testing.T) {
	// e is granted at 150 ms while b and c hold: three at once.
	b := semaphore().hold("e", 35, 150, 170)
	r := two.Check(b.ops)
	require.Len(t, r.Crowds, 1)
	c := r.Crowds[0]
	assert.Equal(t, "e", c.Grant.Client)
	assert.Equal(t, 2, c.Permits)
	require.Len(t, c.Earlier, 2)
	assert.Equal(t, "b", c.Earlier[0].Client)
	assert.Equal(t, "c", c.Earlier[1].Client)
	assert.Equal(t, 3, r.Peak)
	assert.ErrorContains(t, r.Err(), "L2 more holders than permits: 1")
	// Three permits allow it.
	r = history.Config{Permits: map[string]int{"lock": 3}}.Check(b.ops)
	require.NoError(t, r.Err())
	assert.Equal(t, 3, r.Peak)
}

func TestCheckPermitsFindsHolderPastLaterGrants(t *testing.T) {
	// a reports Acquired once more at 250 ms. So when c was granted
	// (110 ms), a and b still held; when d was granted (210 ms), a and c
	// did: three at once both times.
	b := semaphore().sample("a", 10, 250, true)
	r := two.Check(b.ops)
	require.Len(t, r.Crowds, 2)
	assert.Equal(t, "c", r.Crowds[0].Grant.Client)
	assert.Equal(t, "d", r.Crowds[1].Grant.Client)
	assert.Len(t, r.L1, 1, "the same sample is past a's deadline")
}

func TestCheckPermitsAcrossKeys(t *testing.T) {
	// Three holders at once, but on two keys of two permits.
	b := semaphore()
	b.add(history.Op{Kind: history.Granted, Key: "other", At: 150 * ms, Client: "e", Token: 35})
	b.add(history.Op{Kind: history.Sample, Key: "other", At: 160 * ms, End: 160*ms + 1, Client: "e", Token: 35, Held: true})
	b.add(history.Op{Kind: history.Confirmed, Key: "other", At: 150 * ms, Until: 200 * ms, Client: "e", Token: 35})
	r := history.Config{Permits: map[string]int{"lock": 2, "other": 2}}.Check(b.ops)
	require.NoError(t, r.Err())
	assert.Equal(t, 2, r.Peak)
}

func TestCheckPermitsTokenOrder(t *testing.T) {
	t.Run("concurrent grants in either order", func(t *testing.T) {
		// b's Lock returned first although a's grant came first in Redis:
		// b's grant write was sent before a returned, so nothing is wrong.
		b := &builder{}
		b.confirmSent("a", 10, 0, 8, 200).grant("a", 10, 9).sample("a", 10, 10, true)
		b.confirmSent("b", 20, 1, 4, 200).grant("b", 20, 5).sample("b", 20, 10, true)
		require.NoError(t, two.Check(b.ops).Err())
	})
	t.Run("token below an earlier grant", func(t *testing.T) {
		// a was granted at 9 ms; b's grant was sent at 20 ms, so it came
		// later in Redis, but its token is smaller.
		b := &builder{}
		b.confirmSent("a", 20, 0, 8, 200).grant("a", 20, 9)
		b.confirmSent("b", 10, 20, 24, 200).grant("b", 10, 25)
		r := two.Check(b.ops)
		require.Len(t, r.TokenOrder, 1)
		assert.Contains(t, r.TokenOrder[0], "lock/a token 20 was granted 11ms before the grant of lock/b token 10 was sent")
	})
	t.Run("the same token twice", func(t *testing.T) {
		b := &builder{}
		b.grant("a", 10, 1).grant("b", 10, 2)
		r := two.Check(b.ops)
		require.Len(t, r.TokenOrder, 1)
		assert.Contains(t, r.TokenOrder[0], "has the token of")
	})
	t.Run("no send time: only distinct tokens", func(t *testing.T) {
		b := &builder{}
		b.confirm("a", 20, 0, 200).grant("a", 20, 9)
		b.confirm("b", 10, 20, 200).grant("b", 10, 25)
		require.NoError(t, two.Check(b.ops).Err())
	})
}

func TestCheckPermitsL1(t *testing.T) {
	// L1 holds for every key: c says Acquired past its deadline.
	b := semaphore().sample("c", 30, 360, true)
	r := two.Check(b.ops)
	require.Len(t, r.L1, 1)
	assert.Empty(t, r.Crowds)
}

// observe records that observer saw leader with token at at.
func (b *builder) observe(observer, leader string, token int64, at history.Mono) *builder {
	return b.add(history.Op{Kind: history.Observed, At: at * ms, Client: observer, Leader: leader, Token: token})
}

// election is a history of an election that keeps the contract: a leads
// with token 10, then nobody, then b with token 20; two observers follow.
func election() *builder {
	b := &builder{}
	b.hold("a", 10, 0, 100).hold("b", 20, 200, 300)
	b.observe("o1", "", 0, 0).observe("o1", "a", 10, 2).observe("o1", "", 0, 150).observe("o1", "b", 20, 201)
	b.observe("o2", "a", 10, 50).observe("o2", "b", 20, 250)
	return b
}

func TestCheckObserversGood(t *testing.T) {
	r := history.Check(election().ops)
	require.NoError(t, r.Err())
	assert.Equal(t, 6, r.Observations)
	assert.Zero(t, r.UnknownTerms)
	assert.Equal(t, 1, r.Peak)
	assert.Contains(t, r.Summary(), "observations=6 observer_violations=0 unknown_terms=0")
}

func TestCheckObserversFindsBreaches(t *testing.T) {
	for _, c := range []struct {
		name string
		b    *builder
		want string
	}{
		{"token goes back", election().observe("o2", "a", 10, 260), "after token 20"},
		{"term again after its end", election().observe("o3", "a", 10, 50).observe("o3", "", 0, 150).
			observe("o3", "a", 10, 160), "the term again after it was seen to end"},
		{"leader under another's token", election().observe("o3", "b", 10, 50), "the token was granted to a"},
		{"observers disagree on an unknown term", election().observe("o3", "c", 30, 400).observe("o4", "d", 30, 400),
			`another observer saw "c" under this token`},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := history.Check(c.b.ops)
			require.Len(t, r.Observers, 1, "%q", r.Observers)
			assert.Contains(t, r.Observers[0], c.want)
			assert.ErrorContains(t, r.Err(), "observers: 1")
		})
	}
}

func TestCheckObserversUnknownTerm(t *testing.T) {
	// A term nobody recorded the grant of (its candidate was killed first)
	// is counted, not a breach.
	r := history.Check(election().observe("o1", "c", 30, 400).observe("o2", "c", 30, 401).ops)
	require.NoError(t, r.Err())
	assert.Equal(t, 1, r.UnknownTerms)
}

func TestCheckObserversMalformed(t *testing.T) {
	r := history.Check(election().observe("o1", "c", 0, 400).ops)
	require.Len(t, r.Malformed, 1)
}

func TestObservedOpRoundTrip(t *testing.T) {
	op := history.Op{Kind: history.Observed, At: 5, Key: "e", Client: "o", Leader: "a", Token: 7}
	assert.Contains(t, op.String(), `observed e by o: leader "a" token 7`)
	b, err := op.Kind.MarshalText()
	require.NoError(t, err)
	var k history.Kind
	require.NoError(t, k.UnmarshalText(b))
	assert.Equal(t, history.Observed, k)
}
