package distlock_test

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock"
	"github.com/distkit-go/distlock/internal/redistest"
	"github.com/distkit-go/distlock/lease"
)

// multiOpts are the options of the MultiMutexes and Mutexes of these
// tests: a short claim window, so that what a waiter leaves behind lapses
// within a test, and a TTL that does not run out during one.
var multiOpts = []distlock.Option{distlock.WithTTL(6 * time.Second), distlock.WithClaimWindow(2 * time.Second)}

func newMulti(t *testing.T, c rueidis.Client, names []string, opts ...distlock.Option) *distlock.MultiMutex {
	t.Helper()
	m, err := distlock.NewMultiMutex(c, names, append(append([]distlock.Option(nil), multiOpts...), opts...)...)
	require.NoError(t, err)
	return m
}

// holderOf returns the value of the lease of name, "" when free.
func holderOf(t *testing.T, srv *redistest.Server, name string) string {
	t.Helper()
	msg := srv.MustDo("GET", "distlock:{"+name+"}")
	if msg.IsNil() {
		return ""
	}
	s, err := msg.ToString()
	require.NoError(t, err)
	return s
}

// lineLen returns how many stand in the line of name.
func lineLen(t *testing.T, srv *redistest.Server, name string) int64 {
	t.Helper()
	return inLine(t, srv, "distlock:{"+name+"}")
}

func TestMultiMutexInvalidInput(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	cases := map[string][]string{
		"no names":    nil,
		"empty name":  {"a", ""},
		"duplicate":   {"a", "b", "a"},
		"brace":       {"a", "b{c}"},
		"65 names":    make65(),
		"long name":   {strings.Repeat("k", 513)},
		"newline":     {"a\nb"},
		"invalid utf": {"a\xff"},
	}
	for name, names := range cases {
		t.Run(name, func(t *testing.T) {
			m, err := distlock.NewMultiMutex(c, names)
			require.ErrorIs(t, err, distlock.ErrInvalidOption)
			assert.Nil(t, m)
		})
	}
	_, err := distlock.NewMultiMutex(c, []string{"a"}, distlock.WithTTL(0))
	require.ErrorIs(t, err, distlock.ErrInvalidOption)
	_, err = (&distlock.MultiMutex{}).Lock(t.Context())
	require.ErrorIs(t, err, distlock.ErrInvalidOption)
	m := newMulti(t, c, []string{"a", "b"})
	//lint:ignore SA1012 testing the nil check
	_, err = m.Lock(nil)
	require.ErrorIs(t, err, distlock.ErrInvalidOption)
	_, err = m.TryLockFor(t.Context(), -time.Second, 0)
	require.ErrorIs(t, err, distlock.ErrInvalidOption)
	keys := srv.MustDo("KEYS", "*")
	arr, _ := keys.ToArray()
	assert.Empty(t, arr, "bad input left something in Redis")
}

func make65() []string {
	names := make([]string, 65)
	for i := range names {
		names[i] = fmt.Sprint("n", i)
	}
	return names
}

func TestMultiMutexLockRelease(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	names := []string{"c", "a", "b"}
	m := newMulti(t, c, names)
	assert.Equal(t, names, m.Names())
	g, err := m.Lock(t.Context())
	require.NoError(t, err)
	tokens := map[string]int64{}
	for _, n := range names {
		assert.NotEmpty(t, holderOf(t, srv, n), "%s is not held", n)
		tokens[n] = g.TokenOf(n)
		assert.Positive(t, tokens[n], "TokenOf(%q)", n)
		fence, err := srv.MustDo("GET", "distlock:{"+n+"}:fence").AsInt64()
		require.NoError(t, err)
		assert.Equal(t, fence, tokens[n], "%s's token is its own sequence's", n)
	}
	assert.Equal(t, g.TokenOf("c"), g.Token(), "Token is the first name's")
	assert.Zero(t, g.TokenOf("d"))
	assert.Equal(t, distlock.Acquired, g.State())

	// Each name excludes a Mutex of the name.
	for _, n := range names {
		_, err := newMutex(t, c, n).TryLock(t.Context())
		require.ErrorIs(t, err, distlock.ErrNotAcquired, n)
	}
	// And another set that shares one name.
	_, err = newMulti(t, c, []string{"x", "b"}).TryLock(t.Context())
	var na *distlock.NotAcquiredError
	require.ErrorAs(t, err, &na)
	assert.Equal(t, "distlock:{b}", na.Key)
	assert.Empty(t, holderOf(t, srv, "x"), "a TryLock that failed kept a name")
	// The error names the held name when it is not the first the set
	// takes (z comes before a).
	_, err = newMulti(t, c, []string{"a", "z"}).TryLock(t.Context())
	require.ErrorAs(t, err, &na)
	assert.Equal(t, "distlock:{a}", na.Key)
	assert.Empty(t, holderOf(t, srv, "z"), "a TryLock that failed kept a name")

	st, err := g.Release(t.Context())
	require.NoError(t, err)
	assert.Equal(t, distlock.Released, st)
	for _, n := range names {
		assert.Empty(t, holderOf(t, srv, n), "%s still held after Release", n)
	}
	// The next acquisition gets larger tokens on every name.
	g2, err := m.TryLock(t.Context())
	require.NoError(t, err)
	for _, n := range names {
		assert.Greater(t, g2.TokenOf(n), tokens[n], n)
	}
	_, err = g2.Release(t.Context())
	require.NoError(t, err)

	// On a single lock's guard, TokenOf answers for its own name only.
	single, err := newMutex(t, c, "a").TryLock(t.Context())
	require.NoError(t, err)
	assert.Equal(t, single.Token(), single.TokenOf("a"))
	assert.Zero(t, single.TokenOf("b"))
	_, err = single.Release(t.Context())
	require.NoError(t, err)
}

// A set that waits for a name held by a Mutex holds the names before it,
// and gets every name once the Mutex releases.
func TestMultiMutexWaitsBehindMutex(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	mg, err := newMutex(t, c, "y", multiOpts...).Lock(t.Context())
	require.NoError(t, err)
	m := newMulti(t, c, []string{"x", "y", "z"})
	got := acquireAsync(t, t.Context(), m.Lock)
	// It stands in b's line.
	require.Eventually(t, func() bool {
		return lineLen(t, srv, "y") == 1
	}, 5*time.Second, 5*time.Millisecond)
	assert.NotEmpty(t, holderOf(t, srv, "z"), "the set does not hold z, which it takes before y, while it waits")
	assert.Empty(t, holderOf(t, srv, "x"), "the set holds x, which it takes after y, while it waits")
	select {
	case r := <-got:
		t.Fatalf("Lock returned while b was held: %v", r.Err())
	default:
	}
	_, err = mg.Release(t.Context())
	require.NoError(t, err)
	r := await(t, got, 5*time.Second, "the set's Lock, once b was released")
	require.NoError(t, r.Err())
	for _, n := range []string{"x", "y", "z"} {
		assert.NotEmpty(t, holderOf(t, srv, n))
		pttl, _ := srv.MustDo("PTTL", "distlock:{"+n+"}").AsInt64()
		assert.Positive(t, pttl, n)
	}
	_, err = r.Guard().Release(t.Context())
	require.NoError(t, err)
}

// Issue 25's case: a Mutex holds b; a MultiMutex on {a, b, c} waits; its
// context is cancelled: within 100 ms a and c can be taken by anyone, and
// b's holder is undisturbed; the set leaves its void marker only on the
// names it reached (issue 32). The names are x, y and z, which the set takes
// in the order z, y, x (by slot: 8157, 12222, 16287), so that it holds z
// while it waits in y's line.
func TestMultiMutexCancelGivesEverythingBack(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	mg, err := newMutex(t, c, "y", multiOpts...).Lock(t.Context())
	require.NoError(t, err)
	m := newMulti(t, c, []string{"x", "y", "z"})
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() {
		_, err := m.Lock(ctx)
		errc <- err
	}()
	require.Eventually(t, func() bool {
		return lineLen(t, srv, "y") == 1 && holderOf(t, srv, "z") != ""
	}, 5*time.Second, 5*time.Millisecond, "the set does not hold z and wait in y's line")
	setValue := holderOf(t, srv, "z")
	cancelled := time.Now()
	cancel()
	select {
	case err := <-errc:
		require.ErrorIs(t, err, context.Canceled)
		assert.Less(t, time.Since(cancelled), 100*time.Millisecond, "Lock returned late")
	case <-time.After(time.Second):
		t.Fatal("Lock did not return once its context was cancelled")
	}
	// Anyone can take x and z within 100 ms of the cancel.
	var gx, gz *distlock.Guard
	mx, mz := newMutex(t, c, "x", multiOpts...), newMutex(t, c, "z", multiOpts...)
	for (gx == nil || gz == nil) && time.Since(cancelled) < time.Second {
		if gx == nil {
			gx, _ = mx.TryLock(t.Context())
		}
		if gz == nil {
			gz, _ = mz.TryLock(t.Context())
		}
	}
	took := time.Since(cancelled)
	require.NotNil(t, gx, "x could not be taken")
	require.NotNil(t, gz, "z could not be taken")
	t.Logf("x and z free %v after the cancel", took)
	assert.Less(t, took, 100*time.Millisecond)
	assert.Zero(t, lineLen(t, srv, "y"), "the set's place in y's line is still there")
	assert.Equal(t, distlock.Acquired, mg.State(), "y's holder was disturbed")
	// The clean-up (one script, done once y's line is empty) leaves the
	// void marker of the set's value on the names it reached, z and y, and
	// none on x, which it never reached (issue 32).
	for _, n := range []string{"z", "y"} {
		assert.True(t, exists(t, srv, "distlock:{"+n+"}:void:"+setValue), "the set's void marker on %s", n)
	}
	voids, err := srv.MustDo("KEYS", "distlock:{x}:void:*").AsStrSlice()
	require.NoError(t, err)
	assert.Empty(t, voids, "the cancelled set voided x, which it never reached")
	for _, g := range []*distlock.Guard{mg, gx, gz} {
		_, err := g.Release(t.Context())
		require.NoError(t, err)
	}
}

// Two sets over the same names in opposite orders, and a chain of sets
// whose names close a circle, all make progress.
func TestMultiMutexNoDeadlock(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	sets := [][]string{{"a", "b"}, {"b", "a"}, {"b", "c"}, {"c", "a"}, {"a", "b", "c"}}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	const rounds = 15
	errc := make(chan error, len(sets))
	for _, names := range sets {
		go func() {
			m := newMulti(t, c, names)
			for range rounds {
				g, err := m.Lock(ctx)
				if err != nil {
					errc <- fmt.Errorf("%v: %w", names, err)
					return
				}
				time.Sleep(time.Millisecond)
				if _, err := g.Release(context.WithoutCancel(ctx)); err != nil {
					errc <- err
					return
				}
			}
			errc <- nil
		}()
	}
	for range sets {
		require.NoError(t, <-errc)
	}
}

func TestMultiMutexTryLockFor(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	mg, err := newMutex(t, c, "b", multiOpts...).Lock(t.Context())
	require.NoError(t, err)
	m := newMulti(t, c, []string{"a", "b"})
	_, err = m.TryLockFor(t.Context(), 100*time.Millisecond, 10*time.Millisecond)
	require.ErrorIs(t, err, distlock.ErrTimeout)
	assert.Empty(t, holderOf(t, srv, "a"))
	go func() {
		time.Sleep(50 * time.Millisecond)
		_, _ = mg.Release(context.Background())
	}()
	g, err := m.TryLockFor(t.Context(), 5*time.Second, 10*time.Millisecond)
	require.NoError(t, err)
	_, err = g.Release(t.Context())
	require.NoError(t, err)
}

// Each name is the exclusive side of an RWMutex of it too: readers and a
// writer of a name exclude a set that holds it, and the set waits for
// readers to leave.
func TestMultiMutexAndRWMutex(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	rw, err := distlock.NewRWMutex(c, "y", multiOpts...)
	require.NoError(t, err)
	m := newMulti(t, c, []string{"x", "y"})
	g, err := m.TryLock(t.Context())
	require.NoError(t, err)
	_, err = rw.TryRLock(t.Context())
	require.ErrorIs(t, err, distlock.ErrNotAcquired, "a reader got in beside the set")
	_, err = rw.TryLock(t.Context())
	require.ErrorIs(t, err, distlock.ErrNotAcquired, "a writer got in beside the set")
	_, err = g.Release(t.Context())
	require.NoError(t, err)

	r, err := rw.RLock(t.Context())
	require.NoError(t, err)
	_, err = m.TryLock(t.Context())
	require.ErrorIs(t, err, distlock.ErrNotAcquired, "the set got in beside a reader")
	got := make(chan error, 1)
	go func() {
		g, err := m.Lock(t.Context())
		if err == nil {
			_, err = g.Release(context.Background())
		}
		got <- err
	}()
	require.Eventually(t, func() bool {
		return lineLen(t, srv, "y") == 1
	}, 5*time.Second, 5*time.Millisecond, "the set does not wait in y's line behind the reader")
	_, err = r.Release(t.Context())
	require.NoError(t, err)
	require.NoError(t, <-got)
}

// The guard renews every name past the TTL, and is Lost when one name's
// lease is refused (someone deleted it): its renewal finds it gone.
func TestMultiMutexRenewsEveryName(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	ttl := 1500 * time.Millisecond
	m := newMulti(t, c, []string{"x", "y", "z"}, distlock.WithTTL(ttl), distlock.WithClaimWindow(ttl))
	g, err := m.Lock(t.Context())
	require.NoError(t, err)
	events := g.Subscribe(t.Context())
	time.Sleep(2 * ttl) // renewals must keep every name
	assert.Equal(t, distlock.Acquired, g.State())
	for _, n := range []string{"x", "y", "z"} {
		pttl, _ := srv.MustDo("PTTL", "distlock:{"+n+"}").AsInt64()
		assert.Greater(t, pttl, int64(0), "%s's lease ran out", n)
	}
	srv.MustDo("DEL", "distlock:{y}")
	deadline := time.After(2 * ttl)
	for {
		select {
		case ev := <-events:
			if ev.State != distlock.Lost {
				continue
			}
			var le *distlock.LostError
			require.ErrorAs(t, ev.Err, &le)
			assert.Equal(t, distlock.LostRefused, le.Reason)
			assert.Equal(t, "distlock:{y}", le.Key, "the loss names the name that was lost")
			assert.ErrorIs(t, context.Cause(g.Context()), distlock.ErrLost)
			// The names still held go back at once, not at the end of
			// their leases.
			assert.Eventually(t, func() bool {
				return holderOf(t, srv, "x") == "" && holderOf(t, srv, "z") == ""
			}, ttl/2, 5*time.Millisecond, "the names the lost set still held were kept")
			st, err := g.Release(t.Context())
			assert.Equal(t, distlock.Lost, st)
			assert.NoError(t, err)
			return
		case <-deadline:
			t.Fatal("the guard was not Lost after y's lease was deleted")
		}
	}
}

// A set that finds a name it held lost while it waits for a later one
// gives back what it holds and waits for the lost name first: it never
// holds a name while it waits for one before it (M-D).
func TestMultiMutexLostEarlierNameStartsAgain(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	// The set takes z, then y, then x. (A pass of its last name, x, would
	// make it hold the set at once, trusting what its last call found, as
	// a Mutex's waiter trusts a pass: an operator's delete of z is then
	// found by the guard's first renewal, L4.)
	hy, err := newMutex(t, c, "y", multiOpts...).Lock(t.Context())
	require.NoError(t, err)
	m := newMulti(t, c, []string{"x", "y", "z"})
	got := acquireAsync(t, t.Context(), m.Lock)
	require.Eventually(t, func() bool {
		return lineLen(t, srv, "y") == 1 && holderOf(t, srv, "z") != ""
	}, 5*time.Second, 5*time.Millisecond, "the set does not hold z and wait in y's line")
	setValue := holderOf(t, srv, "z")

	// An operator deletes z, and a Mutex takes it.
	srv.MustDo("DEL", "distlock:{z}")
	hz, err := newMutex(t, c, "z", multiOpts...).TryLock(t.Context())
	require.NoError(t, err)
	// y's holder leaves: y is passed to the set, which finds z gone, gives
	// y back, and waits in z's line.
	_, err = hy.Release(t.Context())
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		return lineLen(t, srv, "z") == 1 && holderOf(t, srv, "y") != setValue
	}, 5*time.Second, 5*time.Millisecond, "the set kept y while it waits for z")
	select {
	case r := <-got:
		t.Fatalf("Lock returned while z was held by another: %v", r.Err())
	default:
	}
	_, err = hz.Release(t.Context())
	require.NoError(t, err)
	r := await(t, got, 5*time.Second, "the set's Lock, once z was released")
	require.NoError(t, r.Err())
	assert.Equal(t, distlock.Acquired, r.Guard().State())
	_, err = r.Guard().Release(t.Context())
	require.NoError(t, err)
}

// A set that waits for its last name holds the set as soon as that name
// is passed to it, without asking Redis again (as a Mutex's waiter holds
// a lock passed to it), and its guard then renews every name to the TTL.
func TestMultiMutexPassOfLastNameHoldsAtOnce(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	// The set takes z, then x: x is its last name.
	hx, err := newMutex(t, c, "x", multiOpts...).Lock(t.Context())
	require.NoError(t, err)
	counting, calls := srv.CountingClient(t)
	m := newMulti(t, counting, []string{"x", "z"})
	got := make(chan *distlock.Guard, 1)
	go func() {
		g, err := m.Lock(t.Context())
		assert.NoError(t, err)
		got <- g
	}()
	require.Eventually(t, func() bool {
		// ... and its room hears the pass: a pass announced before the
		// room's subscription is up is found by a call, by design.
		return lineLen(t, srv, "x") == 1 && len(wakeChannels(t, srv, "distlock:{x}")) == 1
	}, 5*time.Second, 5*time.Millisecond, "the set does not wait in x's line, with its room listening")
	// The room's subscription coming up makes the set ask once more (a
	// pass may have gone unheard); the next refresh is half a claim
	// window (1 s) after that. Release in the quiet between.
	before := calls.Load()
	require.Eventually(t, func() bool {
		n := calls.Load()
		quiet := n == before
		before = n
		return quiet
	}, 5*time.Second, 100*time.Millisecond, "the set's calls did not settle")
	_, err = hx.Release(t.Context())
	require.NoError(t, err)
	g := <-got
	require.NotNil(t, g)
	// A call to Redis since the quiet is the set's renewal of z (it keeps
	// the names it holds while it waits) when the machine's load has moved
	// it into this window; a claim of x would show in the deadline below
	// (a claim grants the TTL, 6 s, not the 2 s claim window).
	if extra := calls.Load() - before; extra > 0 {
		t.Logf("%d call(s) to Redis between the quiet and the pass (a renewal of the held name, by the deadline below)", extra)
	}
	assert.Equal(t, distlock.Acquired, g.State())
	fence, err := srv.MustDo("GET", "distlock:{x}:fence").AsInt64()
	require.NoError(t, err)
	assert.Equal(t, fence, g.TokenOf("x"), "the pass's token")
	claim := 2 * time.Second // multiOpts' claim window
	assert.WithinDuration(t, time.Now().Add(claim), g.Deadline(), claim/2,
		"the guard starts on the claim window: it held the pass of its last name at once, without asking Redis again")
	// Its first renewal, a third of the claim window in, extends both
	// names to the TTL.
	require.Eventually(t, func() bool {
		for _, n := range []string{"x", "z"} {
			pttl, _ := srv.MustDo("PTTL", "distlock:{"+n+"}").AsInt64()
			if time.Duration(pttl)*time.Millisecond <= claim {
				return false
			}
		}
		return true
	}, 2*claim, 10*time.Millisecond, "the names were not renewed to the TTL")
	_, err = g.Release(t.Context())
	require.NoError(t, err)
}

// WithReplicaAck: a set is granted once a replica has acknowledged it,
// renewed name by name with the wait, and refused, leaving nothing held,
// when the replica acknowledges nothing.
func TestMultiMutexReplicaAck(t *testing.T) {
	p := redistest.Start(t, "--repl-diskless-sync-delay", "0")
	replica := redistest.StartReplica(t, p, p.Addr())
	c := p.Client()
	ttl := 1500 * time.Millisecond
	m := newMulti(t, c, []string{"x", "y", "z"}, distlock.WithTTL(ttl), distlock.WithClaimWindow(ttl),
		distlock.WithReplicaAck(1, 400*time.Millisecond))
	g, err := m.Lock(t.Context())
	require.NoError(t, err)
	time.Sleep(ttl) // at least two renewals, each acknowledged
	assert.Equal(t, distlock.Acquired, g.State())
	for _, n := range []string{"x", "y", "z"} {
		assert.Equal(t, holderOf(t, p, n), holderOf(t, replica, n), "the replica's copy of %s", n)
	}
	_, err = g.Release(t.Context())
	require.NoError(t, err)

	replica.Pause() // connected, acknowledging nothing
	defer replica.Resume()
	m = newMulti(t, c, []string{"x", "y", "z"}, distlock.WithReplicaAck(1, 200*time.Millisecond))
	_, err = m.TryLock(t.Context())
	require.ErrorIs(t, err, distlock.ErrNotReplicated)
	for _, n := range []string{"x", "y", "z"} {
		assert.Empty(t, holderOf(t, p, n), "%s held after a grant the replica did not acknowledge", n)
	}
}

// lossyRedis is a Redis whose first lose scripts get no reply: each fails
// as on a connection that broke before the reply, without running.
type lossyRedis struct {
	lease.Redis
	lose atomic.Int32
}

func (r *lossyRedis) Eval(ctx context.Context, s *lease.Script, keys, args []string) lease.Reply {
	if r.lose.Add(-1) >= 0 {
		return lease.ErrorReply(io.ErrUnexpectedEOF)
	}
	return r.Redis.Eval(ctx, s, keys, args)
}

// Issue 31, fault 3: a set joins a waiting room once per call. A Mutex of
// client c waits in y's line, so c has a room for y; a MultiMutex on
// {x, y} of c, whose first call gets no reply, asks again and then stands
// in y's line behind the Mutex. (Before the fix, it joined y's room again
// before its second call, and left it once.) y's holder releases, the
// Mutex takes y and releases it, the set takes both and releases them:
// then no room is left for y.
func TestMultiMutexJoinsARoomOnce(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	const key = "distlock:{y}"
	gy, err := newMutex(t, srv.Client(), "y", multiOpts...).Lock(t.Context())
	require.NoError(t, err)
	waiter := acquireAsync(t, t.Context(), newMutex(t, c, "y", multiOpts...).Lock)
	waitInLine(t, srv, key, 1)
	require.Equal(t, 1, distlock.RoomsOf(key), "the Mutex's room for y")

	lossy := &lossyRedis{Redis: lease.FromRueidis(c)}
	lossy.lose.Store(1)
	m, err := distlock.NewMultiMutexOn(lossy, []string{"x", "y"}, multiOpts...)
	require.NoError(t, err)
	set := acquireAsync(t, t.Context(), m.Lock)
	waitInLine(t, srv, key, 2)
	require.Negative(t, lossy.lose.Load(), "the set's first call was not lost")

	assert.Equal(t, distlock.Released, release(t, gy))
	ow := await(t, waiter, eventually, "the Mutex once y's holder released")
	require.NoError(t, ow.Err())
	assert.Equal(t, distlock.Released, release(t, ow.Guard()))
	os := await(t, set, eventually, "the set once the Mutex released")
	require.NoError(t, os.Err())
	assert.Equal(t, distlock.Released, release(t, os.Guard()))
	require.Eventually(t, func() bool { return distlock.RoomsOf(key) == 0 }, eventually, pollEvery,
		"y's room is still there after everyone released: %d rooms", distlock.RoomsOf(key))
}

// Issue 32, item 5: a TryLock that fails touches no name it gives back. A
// Mutex holds a; a set on {a, z}, which takes z first, fails on a: z is
// left as it was, without a token issued or a fencing key made for it, and
// a's holder is untouched.
func TestMultiMutexFailedTryLockTouchesNothing(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	ga, err := newMutex(t, c, "a", multiOpts...).Lock(t.Context())
	require.NoError(t, err)
	aFence, _ := get(t, srv, "distlock:{a}:fence")
	m := newMulti(t, c, []string{"a", "z"})
	for range 3 {
		_, err = m.TryLock(t.Context())
		var na *distlock.NotAcquiredError
		require.ErrorAs(t, err, &na)
		assert.Equal(t, "distlock:{a}", na.Key)
	}
	keys, err := srv.MustDo("KEYS", "distlock:{z}*").AsStrSlice()
	require.NoError(t, err)
	assert.Empty(t, keys, "the failed TryLocks left keys on z, which was free")
	got, _ := get(t, srv, "distlock:{a}:fence")
	assert.Equal(t, aFence, got, "a's fencing key")
	assert.Equal(t, distlock.Acquired, ga.State())
	assert.Equal(t, distlock.Released, release(t, ga))
	g, err := m.TryLock(t.Context())
	require.NoError(t, err)
	assert.Equal(t, distlock.Released, release(t, g))
}
