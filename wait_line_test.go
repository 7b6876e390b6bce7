package distlock

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock/lease"
)

// The line's rules (wait.go), which a Lock's queue and a MultiMutex's
// queue share. Their use is checked end to end by the queue tests (a
// single lock's in wait_redis_test.go and delayed_test.go, a set's in
// multi_test.go); these tests pin each rule down alone.

// TestStandingStaleOncePerGrant checks the stale refusal (issue 31): a
// reply that has the request out of line with a token above those it saw
// is stale once, and the same token again is not (the request cannot
// spin on it); a reply in line is never stale.
func TestStandingStaleOncePerGrant(t *testing.T) {
	var s standing
	s.queuedBy(time.Now(), lease.Grant{Rank: 2, Ticket: 7, Fence: 10})
	require.False(t, s.stale(lease.Grant{Rank: -1, Fence: 10}), "no grant since the last reply")
	require.True(t, s.stale(lease.Grant{Rank: -1, Fence: 12}), "a grant since the last reply")
	require.Equal(t, int64(12), s.place.Seen, "the refusal's token is seen")
	require.False(t, s.stale(lease.Grant{Rank: -1, Fence: 12}), "the same refusal again")
	require.False(t, s.stale(lease.Grant{Rank: 0, Fence: 20}), "a reply in line")
	require.Equal(t, int64(7), s.place.Ticket, "the ticket is kept")
}

// TestStandingQueuedByKeepsTheTicket checks what a reply in line records:
// its send time and fence, its ticket (a reply without one keeps the
// request's), and its fence as seen, never lowering it.
func TestStandingQueuedByKeepsTheTicket(t *testing.T) {
	var s standing
	t0 := time.Now()
	s.queuedBy(t0, lease.Grant{Ticket: 7, Fence: 10})
	s.passed(grantNote{token: 15})
	t1 := t0.Add(time.Millisecond)
	s.queuedBy(t1, lease.Grant{Fence: 11})
	require.Equal(t, t1, s.queued)
	require.Equal(t, int64(11), s.queuedFence)
	require.Equal(t, int64(7), s.place.Ticket, "a reply without a ticket keeps the request's")
	require.Equal(t, int64(15), s.place.Seen, "the largest token seen")
}

// TestStandingPassedDatesTheGrant checks a grant's date: an announcement
// after the last call in line counts from that call, one older than it
// is not acted on, and a pass made by a release of this process counts
// from the earlier of the release and that call.
func TestStandingPassedDatesTheGrant(t *testing.T) {
	queued := time.Now()
	var s standing
	s.queuedBy(queued, lease.Grant{Rank: 0, Ticket: 3, Fence: 10})

	require.Equal(t, queued, s.passed(grantNote{token: 11}), "an announcement after the call")
	require.Equal(t, int64(11), s.place.Seen)
	require.True(t, s.passed(grantNote{token: 10}).IsZero(), "an announcement older than the call")

	release := queued.Add(-time.Millisecond)
	require.Equal(t, queued, s.passed(grantNote{token: 12, sent: release}), "a release sent before the call in line")
	release = queued.Add(time.Millisecond)
	require.Equal(t, release, s.passed(grantNote{token: 12, sent: release}), "a release sent after it")
	require.Equal(t, release, s.passed(grantNote{token: 9, sent: release}), "a release of an older grant")
}

// TestStandingMovedKeepsOnlyThePlace checks what a request keeps when it
// moves to another lock's line: the claim window, the room and its ticket,
// and nothing of the last line's tokens.
func TestStandingMovedKeepsOnlyThePlace(t *testing.T) {
	s := standing{place: lease.Place{Claim: time.Second, Room: "room"}}
	s.queuedBy(time.Now(), lease.Grant{Ticket: 4, Fence: 30})
	s.moved()
	require.Equal(t, standing{place: lease.Place{Claim: time.Second, Room: "room", Ticket: 4}}, s)
	require.True(t, s.stale(lease.Grant{Rank: -1, Fence: 1}), "a token of the new line is above what it saw there")
}

// TestNextAsk checks how long a waiter waits before it calls again.
func TestNextAsk(t *testing.T) {
	const claim = time.Second
	refresh := refreshAfter(claim)
	for _, c := range []struct {
		name      string
		listening bool
		g         lease.Grant
		replied   bool
		want      time.Duration
	}{
		{"behind another waiter", true, lease.Grant{Rank: 1, HolderTTL: time.Millisecond}, true, refresh},
		{"first, the holder's lease ends later", true, lease.Grant{Rank: 0, HolderTTL: time.Minute}, true, refresh},
		{"first, the holder's lease ends sooner", true, lease.Grant{Rank: 0, HolderTTL: 20 * time.Millisecond}, true, 20*time.Millisecond + expiryGrace},
		{"first, the holder's key has no expiry", true, lease.Grant{Rank: 0, HolderTTL: -1}, true, refresh},
		{"no announcements", false, lease.Grant{Rank: 1}, true, DefaultRetryInterval},
		{"no reply", true, lease.Grant{}, false, refresh},
	} {
		t.Run(c.name, func(t *testing.T) {
			require.Equal(t, c.want, nextAsk(claim, c.listening, c.g, c.replied))
		})
	}
}
