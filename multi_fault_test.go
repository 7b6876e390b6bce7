package distlock_test

// Faults under a MultiMutex (issue 25): a holder cut off from one node of
// a Cluster, and a waiter killed while it holds some names and stands in
// the line of the next.

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock"
	"github.com/distkit-go/distlock/internal/faultproxy"
	"github.com/distkit-go/distlock/internal/helperproc"
	"github.com/distkit-go/distlock/internal/redistest"
	"github.com/distkit-go/distlock/lease"
)

const (
	// mfCutTTL is the set's TTL in the cut-off test: short, so that the
	// test is, and far above the 30 ms of its margin that a late timer
	// may use.
	mfCutTTL = 1500 * time.Millisecond
	// mfTimerJitter is how much later than the test's own timer due at D
	// the guard's Lost event may come: two timers due at one moment fire
	// a few milliseconds apart on a loaded machine.
	mfTimerJitter = 30 * time.Millisecond
)

// mfMargin is the guard's safety margin for a lease of ttl, as SAFETY.md
// states it: D = t_s + T − m, with m = T/100 + 30 ms.
func mfMargin(ttl time.Duration) time.Duration { return ttl/100 + 30*time.Millisecond }

// mfExpiry returns when node expires key, as a time of this process's
// clock (Redis runs on this machine, on its wall clock), or false when the
// key has no expiry or is gone. PEXPIRETIME is in whole milliseconds, and
// Redis deletes the key only once its clock is past it.
func mfExpiry(t *testing.T, node *redistest.Server, key string) (time.Time, bool) {
	t.Helper()
	node.SkipUnless(t, redistest.ExpireTime)
	ms, err := node.MustDo("PEXPIRETIME", key).AsInt64()
	require.NoError(t, err)
	if ms < 0 {
		return time.Time{}, false
	}
	now := time.Now()
	return now.Add(time.UnixMilli(ms).Sub(now.Round(0))), true
}

// A holder of a multi-lock cut off from one node is Lost before any
// name's lease can end. On a Cluster of three primaries, a MultiMutex
// holds one name on each; then the client alone loses one node: every
// connection of its client to that node goes through a fault proxy of its
// own, which swallows every byte both ways (the other clients, and the
// test's own connections, reach the node directly). The names on the
// other nodes keep being renewed (where the cut node's group comes last),
// but the set's guard vouches only for what every group confirmed: it
// must turn Lost (its event, its context) at its deadline D, before
// t_s + T for the last renewal every group confirmed, and before Redis
// expires any of the names, as PEXPIRETIME reads them during the cut.
func mfCutOff(t *testing.T, cl *redistest.Cluster) {
	for i, cut := range []string{"FirstGroupsNode", "LastGroupsNode"} {
		t.Run(cut, func(t *testing.T) {
			names, nodes := mcNames(t, cl, fmt.Sprint("cut", i), 1)
			cutAt := 0
			if i == 1 {
				cutAt = len(nodes) - 1
			}
			mfHolderCutOff(t, cl, names, nodes, cutAt)
		})
	}
}

func mfHolderCutOff(t *testing.T, cl *redistest.Cluster, names []string, nodes []*redistest.Server, cutAt int) {
	cut := nodes[cutAt]
	proxy := faultproxy.New(t, cut.Addr())
	opt := cl.ClientOption()
	var through atomic.Bool // the client dialed the cut node through the proxy
	opt.DialCtxFn = func(ctx context.Context, addr string, d *net.Dialer, _ *tls.Config) (net.Conn, error) {
		if addr == cut.Addr() {
			through.Store(true)
			addr = proxy.Addr()
		}
		return d.DialContext(ctx, "tcp", addr)
	}
	c := redistest.NewClient(t, opt)
	set, err := distlock.NewMultiMutex(c, names, distlock.WithTTL(mfCutTTL))
	require.NoError(t, err)
	g, err := set.Lock(t.Context())
	require.NoError(t, err)
	require.True(t, through.Load(), "the client never dialed %s through its proxy", cut.Addr())
	events := g.Subscribe(t.Context())
	require.Equal(t, distlock.Acquired, nextEvent(t, events).State)

	// Cut just after a renewal was confirmed, so that none is in flight:
	// D is then the deadline of a renewal every group confirmed.
	d0 := g.Deadline()
	require.Eventually(t, func() bool { return g.Deadline().After(d0) }, eventually, time.Millisecond,
		"the set never renewed")
	proxy.SetBoth(faultproxy.Blackhole)
	cutOff := time.Now()
	d := g.Deadline()
	require.False(t, d.IsZero(), "the guard no longer vouches for its lease")
	leaseEnd := d.Add(mfMargin(mfCutTTL)) // t_s + T
	// What Redis says: when each name's lease ends, as the last write
	// that reached it set it.
	earliest := time.Time{}
	for i, n := range names {
		e, ok := mfExpiry(t, nodes[i], mcKey(n))
		require.True(t, ok, "%s has no lease", n)
		assert.False(t, e.Before(leaseEnd.Add(-time.Millisecond)), "%s expires at %v, before t_s + T (%v): the guard's send time is off",
			n, e.Sub(cutOff), leaseEnd.Sub(cutOff))
		if earliest.IsZero() || e.Before(earliest) {
			earliest = e
		}
	}

	// A timer of the test's own, due at D, says how late this process's
	// timers run (the guard's deadline timer is one of them), and what
	// the guard says then.
	type atD struct {
		at       time.Time
		state    distlock.State
		deadline time.Time
	}
	control := make(chan atD, 1)
	time.AfterFunc(time.Until(d), func() { control <- atD{time.Now(), g.State(), g.Deadline()} })

	var ev distlock.Event
	for ev = nextEvent(t, events); ev.State == distlock.Acquired; ev = nextEvent(t, events) {
		// A failed renewal's report (an Acquired event with a
		// *RenewError); the guard stays Acquired until D.
		assert.ErrorIs(t, ev.Err, distlock.ErrRenewFailed, "an Acquired event during the cut")
	}
	seen := time.Now()
	select {
	case <-g.Context().Done(): // cancelled before the Lost event is published
	default:
		t.Errorf("the guard's context is alive after its %v event", ev.State)
	}
	ctl := <-control
	late := ctl.at.Sub(d)
	t.Logf("cut off from %s (group %d); Lost %v after the cut (the test heard it at %v), D at %v, t_s + T at %v, "+
		"Redis expires the first name at %v; the test's timer due at D ran %v late",
		cut.Addr(), cutAt, ev.Time.Sub(cutOff), seen.Sub(cutOff), d.Sub(cutOff), leaseEnd.Sub(cutOff), earliest.Sub(cutOff), late)
	require.Equal(t, distlock.Lost, ev.State, "the event after the cut")
	assert.ErrorIs(t, ev.Err, distlock.ErrLost)
	assert.ErrorIs(t, context.Cause(g.Context()), distlock.ErrLost, "the guard's context's cause")
	// State is exact whatever the load: Lost from D on, with no deadline
	// (no renewal was confirmed after the cut).
	assert.Equal(t, distlock.Lost, ctl.state, "State at D")
	assert.True(t, ctl.deadline.IsZero(), "Deadline at D: %v", ctl.deadline.Sub(d))
	assert.Equal(t, distlock.Lost, g.State())
	// The event comes at D, not before (nothing was refused), and as soon
	// after it as this process's timers allow.
	assert.False(t, ev.Time.Before(d), "Lost %v before D, while no renewal could be refused", d.Sub(ev.Time))
	assert.Less(t, ev.Time.Sub(d), late+mfTimerJitter, "Lost %v after D, while the test's timer due at D ran %v late",
		ev.Time.Sub(d), late)
	// And so before any name's lease can end, on a machine whose timers
	// keep within the margin (SAFETY.md, L1: the margin's 30 ms are for
	// a late timer; only State is exact on a starved machine).
	if late < mfMargin(mfCutTTL)/2 {
		assert.True(t, ev.Time.Before(leaseEnd), "Lost %v after t_s + T", ev.Time.Sub(leaseEnd))
		assert.True(t, ev.Time.Before(earliest), "Lost %v after Redis expired a name", ev.Time.Sub(earliest))
	} else {
		t.Logf("this machine is starved (timers %v late): the Lost event's hard bound is not checked", late)
	}

	// Heal, and end the guard: Release reports Lost, and leaves every
	// name free at the latest when its lease ends.
	proxy.Heal()
	st, err := g.Release(t.Context())
	assert.Equal(t, distlock.Lost, st, "Release of the lost guard")
	if err != nil {
		// The delete is best effort once the lease has ended: it may
		// meet the connections the heal reset, or not be sent at all.
		t.Logf("Release of the lost guard: %v", err)
	}
	other := cl.Client()
	for _, n := range names {
		m := newMutex(t, other, n)
		var gn *distlock.Guard
		require.Eventually(t, func() bool { gn, _ = m.TryLock(t.Context()); return gn != nil }, eventually, pollEvery,
			"%s was never free again", n)
		release(t, gn)
	}
}

// The dead waiter test's helper: a process that waits for a MultiMutex,
// to be killed while it waits.
const (
	mfWaiterRole  = "multi-waiter"
	mfNamesVar    = "DISTLOCK_HELPER_NAMES" // the set's names, comma-separated
	mfClaimVar    = "DISTLOCK_HELPER_CLAIM"
	mfWaiterOwner = "dead-set"
)

// runMultiWaiter locks a MultiMutex on the names it is given, with the
// claim window it is given, and reports the outcome should Lock return
// (the test kills it before).
func runMultiWaiter() int {
	claim, err := time.ParseDuration(os.Getenv(mfClaimVar))
	if err != nil {
		fmt.Fprintln(os.Stderr, "multi-waiter:", err)
		return 2
	}
	rc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{os.Getenv(helperAddrVar)}, DisableCache: true})
	if err != nil {
		fmt.Fprintln(os.Stderr, "multi-waiter:", err)
		return 1
	}
	defer rc.Close()
	set, err := distlock.NewMultiMutex(rc, strings.Split(os.Getenv(mfNamesVar), ","), distlock.WithTTL(mfHoldTTL),
		distlock.WithClaimWindow(claim), distlock.WithOwner(mfWaiterOwner))
	if err != nil {
		fmt.Fprintln(os.Stderr, "multi-waiter:", err)
		return 1
	}
	link := helperproc.Parent()
	_, err = set.Lock(context.Background())
	_ = link.Send(fmt.Sprint("Lock returned: ", err))
	return 0
}

// Timing of the dead waiter test.
const (
	// mfClaim is the claim window of the dead waiter and of the others.
	mfClaim = time.Second
	// mfHoldTTL is the TTL of every hold: it never runs out in the test,
	// so only the claim window can explain how soon a name frees.
	mfHoldTTL = 10 * time.Second
	// mfSlack is how much later than its bound a waiter may acquire on a
	// loaded machine: a wake-up and a round trip, which take hundreds of
	// milliseconds on a starved 2-core machine, and still far less than
	// what a dead waiter costs when it keeps a name longer than its claim
	// window (the TTL, 10 s) or twice it.
	mfSlack = 500 * time.Millisecond
)

// A waiter killed mid-line costs the others at most its claim window. On
// one server, a Mutex holds p; a MultiMutex on {q, p} (q comes first:
// slot 8157 of z before 12222 of y) in a process of its own holds q (for
// its claim window, renewed while it waits) and stands in p's line. A
// Mutex waits for q, behind the set's hold, and another for p, behind the
// set's place. The set's process is killed (SIGKILL) and p's holder
// releases at once, passing p to the first in line, the dead set. Then:
// the waiter for q gets it within a claim window of the kill, and the
// waiter for p within a claim window of the release (the pass to the dead
// set lapses); both plus a wake-up. Nothing of the dead set is left.
func TestMultiMutexDeadWaiterCostsAtMostTheClaimWindow(t *testing.T) {
	const q, p = "z", "y"
	ks := make([]lease.Keys, 2)
	for i, n := range []string{p, q} {
		var err error
		ks[i], err = lease.NewKeys(distlock.DefaultNamespace, n)
		require.NoError(t, err)
	}
	require.NoError(t, lease.SortSet(ks))
	require.Equal(t, mcKey(q), ks[0].Lease, "the set must take q first")

	srv := redistest.Start(t)
	opts := []distlock.Option{distlock.WithTTL(mfHoldTTL), distlock.WithClaimWindow(mfClaim)}
	gp, err := newMutex(t, srv.Client(), p, append(opts, distlock.WithOwner("holder"))...).Lock(t.Context())
	require.NoError(t, err)

	proc := helperproc.Start(t, mfWaiterRole, helperAddrVar+"="+srv.Addr(), mfNamesVar+"="+p+","+q,
		mfClaimVar+"="+mfClaim.String())
	owner := func(name string) string {
		v, _ := get(t, srv, mcKey(name))
		return lease.Owner(v)
	}
	require.Eventually(t, func() bool { return inLine(t, srv, mcKey(p)) == 1 && owner(q) == mfWaiterOwner },
		2*eventually, pollEvery, "the set never held %s while waiting in %s's line", q, p)

	waitQ := acquireAsync(t, t.Context(), newMutex(t, srv.Client(), q, opts...).Lock)
	waitInLine(t, srv, mcKey(q), 1)
	waitP := acquireAsync(t, t.Context(), newMutex(t, srv.Client(), p, opts...).Lock)
	waitInLine(t, srv, mcKey(p), 2)

	proc.Kill()
	killed := time.Now()
	var msg string
	require.ErrorIs(t, proc.Recv(t.Context(), &msg), helperproc.ErrExited, "the set's process said %q", msg)
	require.Equal(t, mfWaiterOwner, owner(q), "%s was freed before the test could see it held", q)
	released := time.Now()
	assert.Equal(t, distlock.Released, release(t, gp))
	// The release passed p to the first in line, the dead set, whose
	// place was still fresh: the cost to measure.
	require.Equal(t, mfWaiterOwner, owner(p), "the release did not pass %s to the dead set", p)

	oq := await(t, waitQ, mfClaim+eventually, "the waiter for "+q)
	require.NoError(t, oq.Err())
	op := await(t, waitP, mfClaim+eventually, "the waiter for "+p)
	require.NoError(t, op.Err())
	t.Logf("%s taken %v after the kill; %s taken %v after its release", q, oq.At().Sub(killed), p, op.At().Sub(released))
	assert.Less(t, oq.At().Sub(killed), mfClaim+mfSlack, "the dead set held %s for %v", q, oq.At().Sub(killed))
	assert.Less(t, op.At().Sub(released), mfClaim+mfSlack, "the dead set held up %s for %v", p, op.At().Sub(released))

	for _, o := range []outcome{oq, op} {
		assert.Equal(t, distlock.Released, release(t, o.Guard()))
	}
	for _, n := range []string{q, p} {
		require.Eventually(t, func() bool { return !exists(t, srv, mcKey(n)+":queue") && !exists(t, srv, mcKey(n)+":waiters") },
			mfClaim+eventually, pollEvery, "the dead set's place in %s's line is still there", n)
		assert.False(t, exists(t, srv, mcKey(n)), "%s is held after everyone released", n)
	}
}
