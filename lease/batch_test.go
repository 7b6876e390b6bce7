package lease_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock/internal/redistest"
	"github.com/distkit-go/distlock/lease"
)

// batchTTL is the TTL a batch renews to; the leases are acquired with
// shorter ones, so that a PTTL near batchTTL shows the renewal happened.
const (
	batchTTL  = time.Minute
	shortTTL  = 10 * time.Second
	pttlSlack = 5 * time.Second
)

// batchCase is one lease of a batch: how it is set up, and what its
// renewal must say.
type batchCase struct {
	name    string
	keys    lease.Keys
	value   string
	want    lease.Renewal
	renewed bool // its key's (or hold's) TTL must now be about batchTTL
}

// TestRenewBatchKinds renews, in one batch, leases of every kind in every
// state that a renewal meets, and checks that each gets the answer its
// kind's own renewal script gives, and that only the ones held are
// extended.
func TestRenewBatchKinds(t *testing.T) {
	e := newEnv(t)
	ctx := ctxFor(t)
	k := func(i int) lease.Keys {
		kk, err := lease.NewKeys("distlock-test", t.Name()+":"+strconv.Itoa(i))
		require.NoError(t, err)
		return kk
	}
	var cases []batchCase
	add := func(c batchCase) { cases = append(cases, c) }
	acquire := func(kk lease.Keys, v string) {
		g, err := e.lc.Acquire(ctx, kk, v, shortTTL)
		require.NoError(t, err)
		require.True(t, g.Acquired, "acquire %s for %s", kk.Lease, v)
	}

	held := k(1)
	acquire(held, "v1")
	add(batchCase{name: "lock held", keys: held, value: "v1", want: lease.Renewal{OK: true}, renewed: true})
	other := k(2)
	acquire(other, "someone")
	add(batchCase{name: "lock held by another", keys: other, value: "v2", want: lease.Renewal{Holder: "someone"}})
	add(batchCase{name: "lock missing", keys: k(3), value: "v3", want: lease.Renewal{}})
	el := k(4).Election()
	acquire(el, "leader")
	add(batchCase{name: "election held", keys: el, value: "leader", want: lease.Renewal{OK: true}, renewed: true})

	sem := k(5).Semaphore(3)
	acquire(sem, "s1")
	acquire(sem, "s2")
	add(batchCase{name: "semaphore permit", keys: sem, value: "s1", want: lease.Renewal{OK: true}, renewed: true})
	add(batchCase{name: "semaphore second permit", keys: sem, value: "s2", want: lease.Renewal{OK: true}, renewed: true})
	add(batchCase{name: "semaphore no permit", keys: sem, value: "s9", want: lease.Renewal{}})

	rwr := k(6).RW(lease.Read)
	acquire(rwr, "r1")
	add(batchCase{name: "rwmutex reader", keys: rwr, value: "r1", want: lease.Renewal{OK: true}, renewed: true})
	add(batchCase{name: "rwmutex reader not holding", keys: rwr, value: "r9", want: lease.Renewal{}})
	rww := k(7).RW(lease.Write)
	acquire(rww, "w1")
	add(batchCase{name: "rwmutex writer", keys: rww, value: "w1", want: lease.Renewal{OK: true}, renewed: true})
	add(batchCase{name: "rwmutex writer's other", keys: rww.RW(lease.Read), value: "r8", want: lease.Renewal{Holder: "w1"}})
	// One lock per name: a Mutex's renewal of a hold a read-write lock
	// made (the hash's path of the lock's run), and a read-write lock's of
	// a Mutex's string.
	add(batchCase{name: "lock face of a writer's hash", keys: k(7), value: "w1", want: lease.Renewal{OK: true}, renewed: true})
	add(batchCase{name: "rwmutex face of a lock's string", keys: held.RW(lease.Write), value: "v1", want: lease.Renewal{OK: true}, renewed: true})
	add(batchCase{name: "rwmutex face of another's string", keys: other.RW(lease.Read), value: "v2", want: lease.Renewal{Holder: "someone"}})
	// A key of another type is refused, not an error of the whole batch.
	e.srv.MustDo("RPUSH", k(8).Lease, "x")
	add(batchCase{name: "lock of a list", keys: k(8), value: "v8", want: lease.Renewal{}})
	add(batchCase{name: "semaphore of a list", keys: k(8).Semaphore(2), value: "v8", want: lease.Renewal{}})
	add(batchCase{name: "rwmutex of a list", keys: k(8).RW(lease.Read), value: "v8", want: lease.Renewal{}})

	items := make([]lease.RenewItem, len(cases))
	for i, c := range cases {
		items[i] = lease.RenewItem{Keys: c.keys, Value: c.value, TTL: batchTTL}
	}
	// A lease of another TTL makes a run of its own.
	held2 := k(9)
	acquire(held2, "v9")
	items = append(items, lease.RenewItem{Keys: held2, Value: "v9", TTL: 30 * time.Second})
	cases = append(cases, batchCase{name: "lock held, another TTL", keys: held2, value: "v9", want: lease.Renewal{OK: true}})

	pttl := func(key string) time.Duration {
		n, err := e.srv.MustDo("PTTL", key).AsInt64()
		require.NoError(t, err)
		return time.Duration(n) * time.Millisecond
	}
	out := make([]lease.Renewal, len(items))
	require.NoError(t, e.lc.RenewBatch(ctx, items, out))
	// What the batch itself extended, before the lone renewals below
	// extend the same leases again.
	for _, c := range cases {
		if c.renewed {
			assert.Greater(t, pttl(c.keys.Lease), batchTTL-pttlSlack, "%s: extended by the batch", c.name)
		}
	}
	if d := pttl(held2.Lease); d <= 30*time.Second-pttlSlack || d > 30*time.Second {
		t.Errorf("the other run's TTL after the batch: got %v, want about 30s", d)
	}
	for i, c := range cases {
		assert.Equal(t, c.want, out[i], "%s: outcome", c.name)
		// The lone renewal agrees (it runs after the batch: a lease the
		// batch renewed is still held).
		lone, err := e.lc.Renew(ctx, c.keys, c.value, items[i].TTL)
		require.NoError(t, err, c.name)
		assert.Equal(t, c.want, lone, "%s: the lone renewal's outcome", c.name)
	}
	assert.Greater(t, pttl(held.Lease), batchTTL-pttlSlack, "lock held: extended")
	assert.Greater(t, pttl(sem.Lease), batchTTL-pttlSlack, "semaphore: extended")
	assert.Greater(t, pttl(rwr.Lease), batchTTL-pttlSlack, "reader's hash: extended")
	d := pttl(held2.Lease)
	assert.True(t, d > 30*time.Second-pttlSlack && d <= 30*time.Second, "the other run's TTL: got %v, want about 30s", d)
	assert.LessOrEqual(t, pttl(other.Lease), shortTTL, "a lock held by another is not extended")
	assert.Equal(t, time.Duration(-2*time.Millisecond), pttl(k(3).Lease), "a missing lock is not created")
}

// TestRenewBatchRefusedAreNotExtended checks that a batch in which every
// lease is refused writes nothing: a lease of another holder keeps its
// TTL, a missing one stays missing.
func TestRenewBatchRefusedAreNotExtended(t *testing.T) {
	e := newEnv(t)
	ctx := ctxFor(t)
	k := keys(t)
	g, err := e.lc.Acquire(ctx, k, "holder", shortTTL)
	require.NoError(t, err)
	require.True(t, g.Acquired)
	same := keys(t).Election()
	gone, err := lease.NewKeys("distlock-test", t.Name()+":gone")
	require.NoError(t, err)
	out := make([]lease.Renewal, 3)
	require.NoError(t, e.lc.RenewBatch(ctx, []lease.RenewItem{
		{Keys: k, Value: "me", TTL: batchTTL},
		{Keys: same, Value: "me", TTL: batchTTL},
		{Keys: gone, Value: "me", TTL: batchTTL},
	}, out))
	assert.Equal(t, []lease.Renewal{{Holder: "holder"}, {Holder: "holder"}, {}}, out,
		"the election's key is the lock's (one lock per name); the third lease is missing")
	n, err := e.srv.MustDo("PTTL", k.Lease).AsInt64()
	require.NoError(t, err)
	assert.LessOrEqual(t, time.Duration(n)*time.Millisecond, shortTTL)
	n, err = e.srv.MustDo("PTTL", gone.Lease).AsInt64()
	require.NoError(t, err)
	assert.Equal(t, int64(-2), n, "a missing lease stays missing")
}

// TestRenewBatchLarge renews MaxRenewBatch leases in one call, and checks
// that one more is refused before anything is sent.
func TestRenewBatchLarge(t *testing.T) {
	e := newEnv(t)
	ctx := ctxFor(t)
	items := make([]lease.RenewItem, lease.MaxRenewBatch+1)
	for i := range items {
		k, err := lease.NewKeys("distlock-test", fmt.Sprintf("%s:%d", t.Name(), i))
		require.NoError(t, err)
		items[i] = lease.RenewItem{Keys: k, Value: "v" + strconv.Itoa(i), TTL: batchTTL}
		if i%2 == 0 {
			g, err := e.lc.Acquire(ctx, k, items[i].Value, shortTTL)
			require.NoError(t, err)
			require.True(t, g.Acquired)
		}
	}
	out := make([]lease.Renewal, len(items))
	err := e.lc.RenewBatch(ctx, items, out)
	require.ErrorIs(t, err, lease.ErrBadBatch)
	require.NoError(t, e.lc.RenewBatch(ctx, items[:lease.MaxRenewBatch], out))
	for i, r := range out[:lease.MaxRenewBatch] {
		assert.Equal(t, i%2 == 0, r.OK, "lease %d", i)
	}
}

// TestRenewBatchBadInput checks the errors given before anything is sent.
func TestRenewBatchBadInput(t *testing.T) {
	e := newEnv(t)
	ctx := ctxFor(t)
	k := keys(t)
	out := make([]lease.Renewal, 1)
	assert.ErrorIs(t, e.lc.RenewBatch(ctx, []lease.RenewItem{{Keys: k, Value: "v", TTL: 0}}, out), lease.ErrBadTTL)
	assert.ErrorIs(t, e.lc.RenewBatch(ctx, []lease.RenewItem{{Keys: k, Value: "v", TTL: time.Second}}, nil), lease.ErrBadBatch)
	assert.NoError(t, e.lc.RenewBatch(ctx, nil, nil), "an empty batch")
	ack, err := lease.NewWithAck(e.srv.Client(), lease.Ack{Replicas: 1, Timeout: time.Second})
	require.NoError(t, err)
	assert.ErrorIs(t, ack.RenewBatch(ctx, []lease.RenewItem{{Keys: k, Value: "v", TTL: time.Second}}, out), lease.ErrBadBatch)
	assert.Equal(t, "", e.lc.BatchGroup(k), "a standalone server: one group")
}

// fakeRedis answers every script with reply.
type fakeRedis struct{ reply lease.Reply }

func (f fakeRedis) Eval(context.Context, *lease.Script, []string, []string) lease.Reply {
	return f.reply
}
func (f fakeRedis) EvalWait(context.Context, *lease.Script, []string, []string, int, time.Duration) (lease.Reply, int64, error) {
	return f.reply, 0, nil
}
func (f fakeRedis) Subscribe(context.Context, string, bool, func(), func(string)) error {
	return errors.New("no pub/sub")
}
func (f fakeRedis) Identity() any { return f }

// TestRenewBatchBadReply checks that a reply that does not answer for
// every lease, or answers in a form no lease's outcome has, fails the
// whole batch: no member may read a refusal or a confirmation from it.
func TestRenewBatchBadReply(t *testing.T) {
	// Two holders of one read-write lock: one group on a Redis that does
	// not say how it shards, so that every case reaches the reply.
	k1, err := lease.NewKeys("t", "a")
	require.NoError(t, err)
	k1 = k1.RW(lease.Read)
	items := []lease.RenewItem{{Keys: k1, Value: "r1", TTL: time.Second}, {Keys: k1, Value: "r2", TTL: time.Second}}
	one := lease.IntReply(1)
	for _, tt := range []struct {
		name  string
		reply lease.Reply
	}{
		{"short", lease.ArrayReply([]lease.Reply{one})},
		{"long", lease.ArrayReply([]lease.Reply{one, one, one})},
		{"not an array", lease.IntReply(1)},
		{"nil", lease.NilReply()},
		{"an array in an outcome", lease.ArrayReply([]lease.Reply{one, lease.ArrayReply(nil)})},
		{"an error reply", lease.ErrorReply(lease.NewReplyError("ERR boom", nil))},
		{"no reply", lease.ErrorReply(context.DeadlineExceeded)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			lc, err := lease.NewOn(fakeRedis{tt.reply}, lease.Ack{})
			require.NoError(t, err)
			out := []lease.Renewal{{OK: true}, {OK: true}}
			err = lc.RenewBatch(context.Background(), items, out)
			require.Error(t, err)
			assert.NotErrorIs(t, err, lease.ErrBadBatch, "the batch was sent")
		})
	}
	lc, err := lease.NewOn(fakeRedis{}, lease.Ack{})
	require.NoError(t, err)
	assert.Equal(t, "{"+hashTag(k1.Lease)+"}", lc.BatchGroup(k1), "a Redis that does not say: one lock's leases to a batch")
}

// TestRenewBatchByTag checks a Redis that shards by hash tag, or does not
// say how it shards: only the leases of one lock (the read-write lock's
// holders of one name, a semaphore's permits) share a batch, and leases of
// two locks are refused before anything is sent.
func TestRenewBatchByTag(t *testing.T) {
	one, err := lease.NewKeys("t", "a")
	require.NoError(t, err)
	other, err := lease.NewKeys("t", "b")
	require.NoError(t, err)
	lc, err := lease.NewOn(fakeRedis{lease.ArrayReply([]lease.Reply{lease.IntReply(1), lease.IntReply(1)})}, lease.Ack{})
	require.NoError(t, err)
	out := make([]lease.Renewal, 2)
	require.NoError(t, lc.RenewBatch(context.Background(), []lease.RenewItem{
		{Keys: one.RW(lease.Read), Value: "r1", TTL: time.Second}, {Keys: one.RW(lease.Read), Value: "r2", TTL: time.Second}}, out))
	assert.Equal(t, []lease.Renewal{{OK: true}, {OK: true}}, out)
	err = lc.RenewBatch(context.Background(), []lease.RenewItem{
		{Keys: one, Value: "v", TTL: time.Second}, {Keys: other, Value: "v", TTL: time.Second}}, out)
	assert.ErrorIs(t, err, lease.ErrBadBatch)
}

// TestRenewBatchCluster renews a batch of two locks of one slot on a
// Redis Cluster, and checks that leases of two slots are refused with
// ErrBadBatch (rueidis would panic building the command) and that
// BatchGroup tells them apart.
func TestRenewBatchCluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3, 0)
	lc := lease.New(cl.Client())
	ctx := ctxFor(t)
	base := t.Name()
	first, err := lease.NewKeys("distlock-test", base)
	require.NoError(t, err)
	var same, other lease.Keys
	for i := 0; same.Lease == "" || other.Lease == ""; i++ {
		k, err := lease.NewKeys("distlock-test", base+strconv.Itoa(i))
		require.NoError(t, err)
		if keySlot(k.Lease) == keySlot(first.Lease) {
			same = k
		} else {
			other = k
		}
	}
	assert.Equal(t, lc.BatchGroup(first), lc.BatchGroup(same))
	assert.NotEqual(t, lc.BatchGroup(first), lc.BatchGroup(other))
	assert.Equal(t, strconv.Itoa(keySlot(first.Lease)), lc.BatchGroup(first), "the group is the slot")
	for _, k := range []lease.Keys{first, same} {
		g, err := lc.Acquire(ctx, k, "v", shortTTL)
		require.NoError(t, err)
		require.True(t, g.Acquired)
	}
	out := make([]lease.Renewal, 2)
	require.NoError(t, lc.RenewBatch(ctx, []lease.RenewItem{{Keys: first, Value: "v", TTL: batchTTL}, {Keys: same, Value: "v", TTL: batchTTL}}, out))
	assert.Equal(t, []lease.Renewal{{OK: true}, {OK: true}}, out)
	err = lc.RenewBatch(ctx, []lease.RenewItem{{Keys: first, Value: "v", TTL: batchTTL}, {Keys: other, Value: "v", TTL: batchTTL}}, out)
	assert.ErrorIs(t, err, lease.ErrBadBatch)
}
