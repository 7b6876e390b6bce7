package lease_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock/internal/faultproxy"
	"github.com/distkit-go/distlock/internal/redistest"
	"github.com/distkit-go/distlock/lease"
)

// Timing used by the tests against redis-server. A busy 2-core machine can
// add tens of milliseconds to any step, and an admin command opens its own
// connection, so TTL checks allow a wide margin below the TTL just written
// and never above it.
const (
	ttl          = 10 * time.Second       // lease TTL for tests that do not let it run out
	ttlMargin    = 3 * time.Second        // how far a PTTL read soon after a write may have dropped
	shortPTTL    = 1000                   // ms; an aged lease, to see whether a call refreshed it
	callTimeout  = 5 * time.Second        // bound on each lease call that should succeed
	stallTimeout = 100 * time.Millisecond // deadline for a call to a paused server
	stallReturn  = 2 * time.Second        // how soon that call must give up; far above stallTimeout
	recoverIn    = 5 * time.Second        // how long a client may take to work again after a resume
	pollEvery    = 10 * time.Millisecond
)

// env is one private redis-server and a lease client of it.
type env struct {
	srv *redistest.Server
	lc  *lease.Client
}

func newEnv(t *testing.T) *env {
	t.Helper()
	return newEnvOn(redistest.Start(t))
}

// newEnvOn returns an env of a running server, with a client of its own.
func newEnvOn(srv *redistest.Server) *env {
	return &env{srv: srv, lc: lease.New(srv.Client())}
}

// keys returns keys unique to the test.
func keys(t *testing.T) lease.Keys {
	t.Helper()
	k, err := lease.NewKeys("distlock-test", t.Name())
	require.NoError(t, err)
	return k
}

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), callTimeout)
	t.Cleanup(cancel)
	return ctx
}

func (e *env) acquire(t *testing.T, k lease.Keys, value string, ttl time.Duration) lease.Grant {
	t.Helper()
	g, err := e.lc.Acquire(ctxFor(t), k, value, ttl)
	require.NoError(t, err, "Acquire(%q)", value)
	return g
}

// mustAcquire acquires k for value and returns the token.
func (e *env) mustAcquire(t *testing.T, k lease.Keys, value string) int64 {
	t.Helper()
	g := e.acquire(t, k, value, ttl)
	require.True(t, g.Acquired, "Acquire(%q): got %+v, want it granted", value, g)
	return g.Token
}

func (e *env) renew(t *testing.T, k lease.Keys, value string, ttl time.Duration) lease.Renewal {
	t.Helper()
	r, err := e.lc.Renew(ctxFor(t), k, value, ttl)
	require.NoError(t, err, "Renew(%q)", value)
	return r
}

func (e *env) release(t *testing.T, k lease.Keys, value string) bool {
	t.Helper()
	r, err := e.lc.Release(ctxFor(t), k, value)
	require.NoError(t, err, "Release(%q)", value)
	return r.Deleted
}

// get returns key's string value and whether it exists.
func (e *env) get(t *testing.T, key string) (string, bool) {
	t.Helper()
	msg := e.srv.MustDo("GET", key)
	if msg.IsNil() {
		return "", false
	}
	s, err := msg.ToString()
	require.NoError(t, err, "GET %s", key)
	return s, true
}

func (e *env) intReply(t *testing.T, args ...string) int64 {
	t.Helper()
	n, err := e.srv.MustDo(args...).AsInt64()
	require.NoError(t, err, "%v", args)
	return n
}

func (e *env) pttl(t *testing.T, key string) time.Duration {
	t.Helper()
	return time.Duration(e.intReply(t, "PTTL", key)) * time.Millisecond
}

func (e *env) exists(t *testing.T, key string) bool {
	t.Helper()
	return e.intReply(t, "EXISTS", key) == 1
}

// serverTime returns the server's TIME in microseconds.
func (e *env) serverTime(t *testing.T) int64 {
	t.Helper()
	arr, err := e.srv.MustDo("TIME").ToArray()
	require.NoError(t, err)
	require.Len(t, arr, 2)
	sec, err1 := arr[0].AsInt64()
	usec, err2 := arr[1].AsInt64()
	require.NoError(t, errors.Join(err1, err2))
	return sec*1_000_000 + usec
}

// fence returns the fencing key's stored token.
func (e *env) fence(t *testing.T, k lease.Keys) int64 {
	t.Helper()
	s, ok := e.get(t, k.Fence)
	require.True(t, ok, "fencing key %s is missing", k.Fence)
	n, err := strconv.ParseInt(s, 10, 64)
	require.NoError(t, err, "fencing key holds %q", s)
	return n
}

// assertTTL checks that key's remaining TTL is at most want and not much
// less.
func (e *env) assertTTL(t *testing.T, key string, want time.Duration) {
	t.Helper()
	got := e.pttl(t, key)
	assert.LessOrEqual(t, got, want, "PTTL %s: got %v, want at most %v", key, got, want)
	assert.Greater(t, got, want-ttlMargin, "PTTL %s: got %v, want about %v", key, got, want)
}

func TestAcquireFreeKey(t *testing.T) {
	e := newEnv(t)
	k := keys(t)
	value := lease.NewValue("me")

	before := e.serverTime(t)
	g := e.acquire(t, k, value, ttl)
	after := e.serverTime(t)

	require.True(t, g.Acquired, "got %+v, want granted", g)
	assert.Empty(t, g.Holder)
	assert.Zero(t, g.HolderTTL)
	// The token is the server clock in µs at the grant: between the TIME
	// read before and the one read after.
	assert.GreaterOrEqual(t, g.Token, before, "token: got %d, want at least the server time before, %d", g.Token, before)
	assert.LessOrEqual(t, g.Token, after, "token: got %d, want at most the server time after, %d", g.Token, after)
	assert.Less(t, g.Token, int64(1)<<53, "token must stay exact as a float64")

	got, ok := e.get(t, k.Lease)
	require.True(t, ok, "lease key %s is missing", k.Lease)
	assert.Equal(t, value, got, "lease key value")
	e.assertTTL(t, k.Lease, ttl)
	assert.Equal(t, g.Token, e.fence(t, k), "fencing key: want the token just issued")
}

func TestFenceRetention(t *testing.T) {
	e := newEnv(t)
	k := keys(t)
	value := lease.NewValue("me")
	e.mustAcquire(t, k, value)
	e.assertTTL(t, k.Fence, lease.FenceRetention)

	// Each grant renews the retention; a refusal does not.
	require.Equal(t, int64(1), e.intReply(t, "PEXPIRE", k.Fence, "60000"))
	require.False(t, e.acquire(t, k, lease.NewValue("other"), ttl).Acquired)
	assert.LessOrEqual(t, e.pttl(t, k.Fence), time.Minute, "a refused acquire renewed the fencing key")
	require.True(t, e.release(t, k, value))
	e.mustAcquire(t, k, lease.NewValue("next"))
	e.assertTTL(t, k.Fence, lease.FenceRetention)
}

func TestAcquireHeldKey(t *testing.T) {
	e := newEnv(t)
	k := keys(t)
	holder := lease.NewValue("holder")
	token := e.mustAcquire(t, k, holder)

	g := e.acquire(t, k, lease.NewValue("other"), 2*ttl)
	require.False(t, g.Acquired, "got %+v, want refused", g)
	assert.Equal(t, holder, g.Holder, "holder value")
	assert.Zero(t, g.Token, "a refused grant carries no token")
	assert.LessOrEqual(t, g.HolderTTL, ttl, "HolderTTL: got %v, want at most %v", g.HolderTTL, ttl)
	assert.Greater(t, g.HolderTTL, ttl-ttlMargin, "HolderTTL: got %v, want about %v", g.HolderTTL, ttl)

	// The refusal wrote nothing: the holder's lease and TTL are untouched
	// (not raised to the loser's 2*ttl) and no token was used up.
	got, _ := e.get(t, k.Lease)
	assert.Equal(t, holder, got, "lease key value after a refused acquire")
	e.assertTTL(t, k.Lease, ttl)
	assert.Equal(t, token, e.fence(t, k), "fencing key after a refused acquire")
}

func TestAcquireHeldKeyWithoutExpiry(t *testing.T) {
	e := newEnv(t)
	k := keys(t)
	e.srv.MustDo("SET", k.Lease, "operator")

	g := e.acquire(t, k, lease.NewValue("me"), ttl)
	require.False(t, g.Acquired, "got %+v, want refused", g)
	assert.Equal(t, "operator", g.Holder)
	assert.Equal(t, -time.Millisecond, g.HolderTTL, "HolderTTL of a key without expiry: want PTTL's -1 ms")
	assert.False(t, e.exists(t, k.Fence), "a refused acquire created the fencing key")
}

// TestAcquireSameValueAgain is the lost-reply case: the first grant was
// applied but the caller never saw it, and retries with the same value.
func TestAcquireSameValueAgain(t *testing.T) {
	e := newEnv(t)
	k := keys(t)
	value := lease.NewValue("me")
	first := e.mustAcquire(t, k, value)
	e.intReply(t, "PEXPIRE", k.Lease, strconv.Itoa(shortPTTL)) // the lease has aged

	second := e.mustAcquire(t, k, value)
	assert.Equal(t, first, second, "the repeated grant keeps the acquisition's token")
	assert.Equal(t, second, e.fence(t, k))
	e.assertTTL(t, k.Lease, ttl) // refreshed, not left at shortPTTL
}

func TestAcquireConcurrent(t *testing.T) {
	e := newEnv(t)
	k := keys(t)
	const n = 8
	values := make([]string, n)
	grants := make([]lease.Grant, n)
	errs := make([]error, n)
	ctx := ctxFor(t)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		values[i] = lease.NewValue("racer-" + strconv.Itoa(i))
		wg.Go(func() {
			<-start
			grants[i], errs[i] = e.lc.Acquire(ctx, k, values[i], ttl)
		})
	}
	close(start)
	wg.Wait()

	winner := -1
	for i := range n {
		require.NoError(t, errs[i], "racer %d", i)
		if grants[i].Acquired {
			require.Equal(t, -1, winner, "racers %d and %d were both granted", winner, i)
			winner = i
		}
	}
	require.NotEqual(t, -1, winner, "nobody was granted")
	for i := range n {
		if i != winner {
			assert.Equal(t, values[winner], grants[i].Holder, "racer %d: holder", i)
		}
	}
	assert.Equal(t, grants[winner].Token, e.fence(t, k))
}

func TestTokensStrictlyIncrease(t *testing.T) {
	e := newEnv(t)
	k := keys(t)
	const rounds = 200
	var last int64
	for i := range rounds {
		value := lease.NewValue("w" + strconv.Itoa(i%3))
		token := e.mustAcquire(t, k, value)
		require.Greater(t, token, last, "round %d: got token %d, want more than %d", i, token, last)
		last = token
		if i%4 == 0 { // sometimes also a repeated grant of the same value
			again := e.mustAcquire(t, k, value)
			require.Equal(t, last, again, "round %d: a repeated grant keeps its token", i)
		}
		require.True(t, e.release(t, k, value), "round %d: release", i)
	}
}

// TestTokenTextIsTheToken: the acquire script writes a grant's token to the
// fencing key as text it builds from the server clock's seconds and µs; the
// text must be the token of the reply, whatever the µs. It grants until a
// token falls in the first 10 ms of a second, whose µs have four digits or
// fewer to pad.
func TestTokenTextIsTheToken(t *testing.T) {
	e := newEnv(t)
	k := keys(t)
	const (
		// Each try waits for a millisecond past the start of the next
		// second of the server's clock, so it lands in the first 10 ms of
		// that second unless the machine holds it up for 9 ms more; ten
		// seconds of tries allow for a busy one.
		within   = 10 * time.Second
		shortest = 10_000 // µs: four digits
	)
	short, tries := 0, 0
	for start := time.Now(); short == 0; tries++ {
		require.Less(t, time.Since(start), within, "no grant in the first %d µs of a second in %d tries, each aimed at one", shortest, tries)
		us := serverMicros(t, e.srv)
		time.Sleep(time.Duration(1_001_000-us) * time.Microsecond)
		value := lease.NewValue("me")
		token := e.mustAcquire(t, k, value)
		fence, _ := e.get(t, k.Fence)
		require.Equal(t, strconv.FormatInt(token, 10), fence, "the fencing key's text after the grant of token %d", token)
		require.True(t, e.release(t, k, value))
		if token%1_000_000 < shortest {
			short++
		}
	}
}

// serverMicros returns the microseconds of the current second of srv's
// clock.
func serverMicros(t *testing.T, srv *redistest.Server) int64 {
	t.Helper()
	tm, err := srv.MustDo("TIME").AsStrSlice()
	require.NoError(t, err)
	require.Len(t, tm, 2, "TIME's reply")
	us, err := strconv.ParseInt(tm[1], 10, 64)
	require.NoError(t, err)
	return us
}

func TestTokenAfterFenceAhead(t *testing.T) {
	e := newEnv(t)
	k := keys(t)
	// A token from a server whose clock ran far ahead (year 2200, still
	// below 2^53): later grants must not go back to the real clock.
	const ahead = int64(7_258_118_400_000_000)
	e.srv.MustDo("SET", k.Fence, strconv.FormatInt(ahead, 10))

	for i := range int64(3) {
		value := lease.NewValue("me")
		got := e.mustAcquire(t, k, value)
		assert.Equal(t, ahead+1+i, got, "grant %d after the fence was set to %d", i, ahead)
		require.True(t, e.release(t, k, value))
	}
	assert.Equal(t, ahead+3, e.fence(t, k))
	e.assertTTL(t, k.Fence, lease.FenceRetention)
}

// TestTokenAfterRestart checks that a server restarted without persistence,
// which forgot the fencing key, still issues a larger token: it is seeded
// from the server clock.
func TestTokenAfterRestart(t *testing.T) {
	e := newEnv(t)
	k := keys(t)
	old := e.mustAcquire(t, k, lease.NewValue("me"))

	e.srv.Restart()
	require.False(t, e.exists(t, k.Fence), "the restarted server kept the fencing key")
	// A new client: the old one's connection is gone with the old process.
	e.lc = lease.New(e.srv.Client())
	before := e.serverTime(t)
	got := e.mustAcquire(t, k, lease.NewValue("me"))
	assert.Greater(t, got, old, "token after a restart: got %d, want more than %d from before", got, old)
	assert.GreaterOrEqual(t, got, before, "token after a restart: got %d, want the server clock (at least %d)", got, before)
}

func TestRenew(t *testing.T) {
	t.Run("holder extends", func(t *testing.T) {
		e := newEnv(t)
		k := keys(t)
		value := lease.NewValue("me")
		token := e.mustAcquire(t, k, value)
		e.intReply(t, "PEXPIRE", k.Lease, strconv.Itoa(shortPTTL))

		r := e.renew(t, k, value, ttl)
		assert.Equal(t, lease.Renewal{OK: true}, r)
		e.assertTTL(t, k.Lease, ttl)
		got, _ := e.get(t, k.Lease)
		assert.Equal(t, value, got)
		assert.Equal(t, token, e.fence(t, k), "a renewal must not issue a token")
	})
	t.Run("other value refused", func(t *testing.T) {
		e := newEnv(t)
		k := keys(t)
		holder := lease.NewValue("holder")
		e.mustAcquire(t, k, holder)
		e.intReply(t, "PEXPIRE", k.Lease, strconv.Itoa(shortPTTL))

		r := e.renew(t, k, lease.NewValue("holder"), ttl) // same owner, another acquisition
		assert.Equal(t, lease.Renewal{Holder: holder}, r)
		assert.LessOrEqual(t, e.pttl(t, k.Lease), time.Duration(shortPTTL)*time.Millisecond,
			"a refused renewal extended the holder's lease")
	})
	t.Run("missing key not re-created", func(t *testing.T) {
		e := newEnv(t)
		k := keys(t)
		r := e.renew(t, k, lease.NewValue("me"), ttl)
		assert.Equal(t, lease.Renewal{}, r, "renewal of a missing key: want refused with an empty holder")
		assert.False(t, e.exists(t, k.Lease), "Renew created the lease key")
	})
	t.Run("deleted key not re-created", func(t *testing.T) {
		e := newEnv(t)
		k := keys(t)
		value := lease.NewValue("me")
		e.mustAcquire(t, k, value)
		e.intReply(t, "DEL", k.Lease)

		r := e.renew(t, k, value, ttl)
		assert.Equal(t, lease.Renewal{}, r, "renewal of a deleted key: want refused with an empty holder")
		assert.False(t, e.exists(t, k.Lease), "Renew re-created the deleted lease key")
	})
	t.Run("overwritten key refused", func(t *testing.T) {
		e := newEnv(t)
		k := keys(t)
		value := lease.NewValue("me")
		e.mustAcquire(t, k, value)
		e.srv.MustDo("SET", k.Lease, "operator")

		r := e.renew(t, k, value, ttl)
		assert.Equal(t, lease.Renewal{Holder: "operator"}, r)
		assert.Equal(t, time.Duration(-1)*time.Millisecond, e.pttl(t, k.Lease), "a refused renewal set a TTL on the operator's key")
	})
}

func TestRelease(t *testing.T) {
	e := newEnv(t)
	k := keys(t)
	value := lease.NewValue("me")
	token := e.mustAcquire(t, k, value)

	assert.False(t, e.release(t, k, lease.NewValue("me")), "release with another acquisition's value")
	got, ok := e.get(t, k.Lease)
	require.True(t, ok, "a release with another value deleted the lease")
	assert.Equal(t, value, got)
	e.assertTTL(t, k.Lease, ttl)

	assert.True(t, e.release(t, k, value), "release with the holder's value")
	assert.False(t, e.exists(t, k.Lease), "the lease key survived its release")
	assert.Equal(t, token, e.fence(t, k), "release must keep the fencing key")

	assert.False(t, e.release(t, k, value), "second release")

	// Someone else holds it now: a late release by the old holder leaves it.
	next := lease.NewValue("next")
	e.mustAcquire(t, k, next)
	assert.False(t, e.release(t, k, value), "stale release after another acquisition")
	got, _ = e.get(t, k.Lease)
	assert.Equal(t, next, got, "a stale release touched the new holder's lease")
}

func TestCancelVoidsALateAttempt(t *testing.T) {
	// The clean-up of an attempt whose reply was lost can reach Redis
	// before the attempt itself (on another connection). The attempt must
	// then be refused, not leave an orphaned lease.
	e := newEnv(t)
	k := keys(t)
	value := lease.NewValue("me")
	r, err := e.lc.Cancel(ctxFor(t), k, value, ttl)
	deleted := r.Deleted
	require.NoError(t, err)
	assert.False(t, deleted, "nothing to delete yet")
	e.assertTTL(t, k.Void(value), ttl)

	g := e.acquire(t, k, value, ttl)
	assert.False(t, g.Acquired, "an attempt with a voided value was granted")
	assert.Empty(t, g.Holder)
	assert.False(t, e.exists(t, k.Lease), "an attempt with a voided value wrote the lease")
	assert.False(t, e.exists(t, k.Fence), "an attempt with a voided value issued a token")

	// Other values are not affected.
	e.mustAcquire(t, k, lease.NewValue("other"))
}

func TestCancelDeletesOnlyItsOwnLease(t *testing.T) {
	e := newEnv(t)
	k := keys(t)
	value, other := lease.NewValue("me"), lease.NewValue("other")
	e.mustAcquire(t, k, value)

	r, err := e.lc.Cancel(ctxFor(t), k, other, ttl)
	deleted := r.Deleted
	require.NoError(t, err)
	assert.False(t, deleted, "cancelled another value's lease")
	got, ok := e.get(t, k.Lease)
	require.True(t, ok)
	assert.Equal(t, value, got)

	r, err = e.lc.Cancel(ctxFor(t), k, value, ttl)
	deleted = r.Deleted
	require.NoError(t, err)
	assert.True(t, deleted)
	assert.False(t, e.exists(t, k.Lease))
	// A retry of the same acquisition is refused from now on.
	assert.False(t, e.acquire(t, k, value, ttl).Acquired)

	_, err = e.lc.Cancel(ctxFor(t), k, value, 0)
	require.ErrorIs(t, err, lease.ErrBadTTL)
}

func TestReleaseAfterConnectionsReset(t *testing.T) {
	// rueidis keeps a pooled connection that broke while idle until a
	// command fails on it. Release retries such failures, so a release
	// right after a network blip still deletes the lease.
	srv := redistest.Start(t)
	proxy := faultproxy.New(t, srv.Addr())
	opt := srv.ClientOption()
	opt.InitAddress = []string{proxy.Addr()}
	opt.PipelineMultiplex = 2 // four connections, chosen at random per command
	rc := redistest.NewClient(t, opt)
	lc := lease.New(rc)
	k := keys(t)
	value := lease.NewValue("me")
	_, err := lc.Acquire(ctxFor(t), k, value, ttl)
	require.NoError(t, err)
	// Open every pooled connection: keyed commands pick one at random.
	for i := range 64 {
		require.NoError(t, rc.Do(ctxFor(t), rc.B().Exists().Key(strconv.Itoa(i)).Build()).Error())
	}

	proxy.Reset()
	r, err := lc.Release(ctxFor(t), k, value)
	require.NoError(t, err, "release after a reset")
	assert.True(t, r.Deleted, "release after a reset: lease not deleted")
	assert.False(t, newEnvOn(srv).exists(t, k.Lease))

	// With Redis unreachable the retries end quickly, with the error.
	e := newEnvOn(srv)
	e.mustAcquire(t, k, value)
	proxy.Refuse()
	start := time.Now()
	_, err = lc.Release(ctxFor(t), k, value)
	require.Error(t, err)
	assert.Less(t, time.Since(start), stallReturn, "release against a closed port")
}

func TestWrongTypeLeaseKey(t *testing.T) {
	e := newEnv(t)
	k := keys(t)
	e.intReply(t, "HSET", k.Lease, "field", "v")
	value := lease.NewValue("me")

	g, err := e.lc.Acquire(ctxFor(t), k, value, ttl)
	require.Error(t, err, "Acquire on a hash: got %+v, want an error", g)
	assert.Contains(t, err.Error(), "holds a hash, not a lock")
	require.ErrorIs(t, err, lease.ErrWrongKind)
	var wk *lease.WrongKindError
	require.ErrorAs(t, err, &wk)
	assert.Equal(t, "hash", wk.Found)
	assert.True(t, lease.IsReply(err), "got %T, want a Redis error reply under it", err)
	assert.Equal(t, lease.Grant{}, g)
	assert.False(t, e.exists(t, k.Fence), "a failed acquire wrote the fencing key")

	// Renew and Release read the key with pcall: they refuse, without an
	// error, and leave the key alone.
	r, err := e.lc.Renew(ctxFor(t), k, value, ttl)
	require.NoError(t, err, "Renew on a hash")
	assert.Equal(t, lease.Renewal{}, r, "Renew on a hash: want refused with an empty holder")
	rel, err := e.lc.Release(ctxFor(t), k, value)
	require.NoError(t, err, "Release on a hash")
	assert.False(t, rel.Deleted, "Release on a hash reported a deletion")

	typ, err := e.srv.MustDo("TYPE", k.Lease).ToString()
	require.NoError(t, err)
	assert.Equal(t, "hash", typ, "type of the lease key afterwards")
	assert.Equal(t, time.Duration(-1)*time.Millisecond, e.pttl(t, k.Lease), "the hash got a TTL")
}

func TestWrongTypeFenceKey(t *testing.T) {
	tests := []struct {
		name    string
		setup   []string // %s is replaced by the fencing key
		wantErr string
	}{
		{"not an integer", []string{"SET", "", "soon"}, "fencing key"},
		{"empty string", []string{"SET", "", ""}, "fencing key"},
		{"fraction", []string{"SET", "", "1.5"}, "fencing key"},
		{"negative", []string{"SET", "", "-5"}, "fencing key"},
		{"hexadecimal", []string{"SET", "", "0x10"}, "fencing key"},
		{"padded", []string{"SET", "", " 5 "}, "fencing key"},
		{"NaN", []string{"SET", "", "nan"}, "fencing key"},
		{"infinity", []string{"SET", "", "inf"}, "fencing key"},
		{"exponent", []string{"SET", "", "1e300"}, "fencing key"},
		{"2^53, no longer exact plus one", []string{"SET", "", "9007199254740992"}, "fencing key"},
		{"max int64", []string{"SET", "", "9223372036854775807"}, "fencing key"},
		{"hash", []string{"HSET", "", "f", "1"}, "WRONGTYPE"},
		{"list", []string{"RPUSH", "", "1"}, "WRONGTYPE"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			k := keys(t)
			args := append([]string(nil), tt.setup...)
			args[1] = k.Fence
			e.srv.MustDo(args...)
			before, err := e.srv.MustDo("DUMP", k.Fence).ToString()
			require.NoError(t, err)

			g, err := e.lc.Acquire(ctxFor(t), k, lease.NewValue("me"), ttl)
			require.Error(t, err, "Acquire with a bad fencing key: got %+v, want an error", g)
			assert.Contains(t, err.Error(), tt.wantErr)
			assert.False(t, e.exists(t, k.Lease), "a failed acquire wrote the lease key")
			// Nothing else either: the common case's branch gives up
			// before its first write, and the full path fails.
			after, err := e.srv.MustDo("DUMP", k.Fence).ToString()
			require.NoError(t, err)
			assert.Equal(t, before, after, "a failed acquire changed the fencing key")
			assert.Equal(t, int64(1), e.intReply(t, "DBSIZE"), "keys after a failed acquire: want the fencing key alone")
		})
	}
}

// TestTokenAtFloatLimit checks the top of the token range: tokens are Lua
// numbers (float64), exact only below 2^53, where last+1 stops being larger
// than last. The last exact token is issued; after it Acquire fails rather
// than issue a token that repeats or goes back.
func TestTokenAtFloatLimit(t *testing.T) {
	e := newEnv(t)
	k := keys(t)
	const maxToken = int64(1)<<53 - 1
	e.srv.MustDo("SET", k.Fence, strconv.FormatInt(maxToken-1, 10))

	value := lease.NewValue("me")
	got := e.mustAcquire(t, k, value)
	assert.Equal(t, maxToken, got, "the last exact token")
	require.True(t, e.release(t, k, value))

	g, err := e.lc.Acquire(ctxFor(t), k, value, ttl)
	require.Error(t, err, "Acquire past the last exact token: got %+v, want an error", g)
	assert.Contains(t, err.Error(), "fencing")
	assert.False(t, e.exists(t, k.Lease), "a failed acquire wrote the lease key")
	assert.Equal(t, maxToken, e.fence(t, k), "a failed acquire changed the fencing key")
}

// TestAcquireBadTTL checks that a TTL Redis refuses fails the script before
// it writes anything. (distlock validates the TTL before it gets here.)
func TestAcquireBadTTL(t *testing.T) {
	for _, d := range []time.Duration{0, -time.Second, 999 * time.Microsecond} {
		t.Run(d.String(), func(t *testing.T) {
			e := newEnv(t)
			k := keys(t)
			value := lease.NewValue("me")
			_, err := e.lc.Acquire(ctxFor(t), k, value, d)
			require.ErrorIs(t, err, lease.ErrBadTTL, "Acquire with TTL %v", d)
			assert.False(t, e.exists(t, k.Lease), "a failed acquire wrote the lease key")
			assert.False(t, e.exists(t, k.Fence), "a failed acquire wrote the fencing key")

			// Renew refuses too: PEXPIRE 0 or less would delete the lease.
			e.acquire(t, k, value, time.Second)
			_, err = e.lc.Renew(ctxFor(t), k, value, d)
			require.ErrorIs(t, err, lease.ErrBadTTL, "Renew with TTL %v", d)
			assert.True(t, e.exists(t, k.Lease), "a refused renewal deleted the lease")
		})
	}
}

// TestTTLTruncatedToMilliseconds checks that TTLs go to Redis in whole
// milliseconds, rounded down, so the lease never outlives what the caller
// asked for.
func TestTTLTruncatedToMilliseconds(t *testing.T) {
	e := newEnv(t)
	k := keys(t)
	value := lease.NewValue("me")
	acquireTTL := 1500*time.Millisecond + 700*time.Microsecond
	e.acquire(t, k, value, acquireTTL)
	got := e.pttl(t, k.Lease)
	assert.LessOrEqual(t, got, 1500*time.Millisecond, "PTTL after Acquire(%v)", acquireTTL)
	assert.Positive(t, got)

	renewTTL := 2500*time.Millisecond + 999*time.Microsecond
	require.True(t, e.renew(t, k, value, renewTTL).OK)
	got = e.pttl(t, k.Lease)
	assert.LessOrEqual(t, got, 2500*time.Millisecond, "PTTL after Renew(%v)", renewTTL)
	assert.Greater(t, got, 1500*time.Millisecond, "PTTL after Renew(%v): the renewal did not extend", renewTTL)
}

func TestCancelledContextSendsNothing(t *testing.T) {
	e := newEnv(t)
	k := keys(t)
	value := lease.NewValue("me")
	ctx, cancel := context.WithCancel(t.Context())
	cancel()

	_, err := e.lc.Acquire(ctx, k, value, ttl)
	assert.ErrorIs(t, err, context.Canceled, "Acquire")
	assert.False(t, e.exists(t, k.Lease), "Acquire with a cancelled context wrote the lease")
	assert.False(t, e.exists(t, k.Fence), "Acquire with a cancelled context wrote the fencing key")

	e.mustAcquire(t, k, value)
	_, err = e.lc.Release(ctx, k, value)
	assert.ErrorIs(t, err, context.Canceled, "Release")
	assert.True(t, e.exists(t, k.Lease), "Release with a cancelled context deleted the lease")
	_, err = e.lc.Renew(ctx, k, value, ttl)
	assert.ErrorIs(t, err, context.Canceled, "Renew")
}

// TestDeadlineOnPausedServer checks that every call gives up at its context
// deadline when Redis does not answer, and that the client works again once
// Redis does.
func TestDeadlineOnPausedServer(t *testing.T) {
	e := newEnv(t)
	k := keys(t)
	value := lease.NewValue("me")
	e.mustAcquire(t, k, value) // connection up, script loaded

	e.srv.Pause()
	paused := true
	defer func() {
		if paused {
			e.srv.Resume()
		}
	}()

	calls := []struct {
		name string
		call func(ctx context.Context) error
	}{
		{"Acquire", func(ctx context.Context) error { _, err := e.lc.Acquire(ctx, k, value, ttl); return err }},
		{"Renew", func(ctx context.Context) error { _, err := e.lc.Renew(ctx, k, value, ttl); return err }},
		{"Release", func(ctx context.Context) error { _, err := e.lc.Release(ctx, k, value); return err }},
	}
	for _, c := range calls {
		ctx, cancel := context.WithTimeout(t.Context(), stallTimeout)
		start := time.Now()
		err := c.call(ctx)
		elapsed := time.Since(start)
		cancel()
		assert.ErrorIs(t, err, context.DeadlineExceeded, "%s on a paused server", c.name)
		assert.Less(t, elapsed, stallReturn, "%s on a paused server: returned after %v, want soon after the %v deadline", c.name, elapsed, stallTimeout)
		assert.GreaterOrEqual(t, elapsed, stallTimeout-5*time.Millisecond, "%s returned before its deadline", c.name)
	}

	e.srv.Resume()
	paused = false
	// The timed-out calls may or may not have reached Redis; a repeated
	// Acquire with the same value is granted either way.
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		g, err := e.lc.Acquire(ctx, k, value, ttl)
		require.NoError(c, err)
		assert.True(c, g.Acquired, "got %+v", g)
	}, recoverIn, pollEvery, "the client did not recover after the server resumed")
}
