package goredis_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock/goredis"
	"github.com/distkit-go/distlock/internal/redistest"
	"github.com/distkit-go/distlock/lease"
)

// returnTimeout bounds how long Subscribe may take to return once its end
// is due (ctx cancelled, the server ended it).
const returnTimeout = 5 * time.Second

// subscription is one Subscribe call running on a goroutine of the test.
type subscription struct {
	cancel   context.CancelFunc
	readies  atomic.Int32
	ready    chan struct{} // closed at the first ready
	messages chan string   // every message, in order
	done     chan struct{} // closed when Subscribe has returned
	err      error         // what it returned, once done is closed
}

// subscribe starts r.Subscribe(channel) on a goroutine that the test's
// clean-up stops (ctx) and waits for.
func subscribe(t *testing.T, r lease.Redis, channel string, sharded bool) *subscription {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s := &subscription{cancel: cancel, ready: make(chan struct{}), messages: make(chan string, 1000), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		s.err = r.Subscribe(ctx, channel, sharded, func() {
			if s.readies.Add(1) == 1 {
				close(s.ready)
			}
		}, func(msg string) { s.messages <- msg })
	}()
	t.Cleanup(func() {
		cancel()
		<-s.done
	})
	return s
}

// waitReady waits for the subscription to be confirmed.
func (s *subscription) waitReady(t *testing.T) {
	t.Helper()
	select {
	case <-s.ready:
	case <-s.done:
		t.Fatalf("Subscribe returned %v before it was confirmed", s.err)
	case <-time.After(settleTimeout):
		t.Fatalf("subscription not confirmed within %v", settleTimeout)
	}
}

// wait waits for Subscribe to return and returns what it returned.
func (s *subscription) wait(t *testing.T, within time.Duration) error {
	t.Helper()
	select {
	case <-s.done:
		return s.err
	case <-time.After(within):
		t.Fatalf("Subscribe did not return within %v", within)
		return nil
	}
}

// publish sends msg on channel through s (SPUBLISH when sharded).
func publish(t *testing.T, s *redistest.Server, channel, msg string, sharded bool) {
	t.Helper()
	cmd := "PUBLISH"
	if sharded {
		cmd = "SPUBLISH"
	}
	s.MustDo(cmd, channel, msg)
}

// TestSubscribeDeliversInOrder subscribes, sharded and plain, publishes
// messages on the channel and on another one, and checks that ready is
// called once, that every message of the channel arrives once and in
// order, that the other channel's do not, and that cancelling ctx ends the
// call with ctx's error and the subscription on the server. The sharded
// case needs a server with sharded pub/sub.
func TestSubscribeDeliversInOrder(t *testing.T) {
	for _, sharded := range []bool{true, false} {
		t.Run(kindName(sharded), func(t *testing.T) {
			srv := startFor(t, sharded)
			rdb := newClient(t, srv.Addr())
			const channel = "distlock:{job}:wake:room"
			s := subscribe(t, goredis.NewRedis(rdb), channel, sharded)
			s.waitReady(t)

			const n = 200
			for i := range n {
				publish(t, srv, channel, strconv.Itoa(i), sharded)
				publish(t, srv, channel+"-other", "x", sharded)
			}
			for i := range n {
				select {
				case got := <-s.messages:
					require.Equal(t, strconv.Itoa(i), got, "message %d", i)
				case <-time.After(settleTimeout):
					t.Fatalf("message %d did not arrive within %v", i, settleTimeout)
				}
			}

			s.cancel()
			err := s.wait(t, returnTimeout)
			assert.ErrorIs(t, err, context.Canceled)
			assert.Equal(t, int32(1), s.readies.Load(), "ready calls")
			assert.Empty(t, s.messages, "messages of another channel, or repeated")
			eventually(t, settleTimeout, func() (bool, string) {
				n := subscribers(t, srv, channel, sharded)
				return n == 0, strconv.FormatInt(n, 10) + " subscribers left on the server"
			})
		})
	}
}

// subscribers returns how many clients the server has subscribed to
// channel (PUBSUB SHARDNUMSUB or NUMSUB).
func subscribers(t *testing.T, s *redistest.Server, channel string, sharded bool) int64 {
	t.Helper()
	sub := "NUMSUB"
	if sharded {
		sub = "SHARDNUMSUB"
	}
	arr, err := s.MustDo("PUBSUB", sub, channel).ToArray()
	require.NoError(t, err)
	require.Len(t, arr, 2)
	n, err := arr[1].AsInt64()
	require.NoError(t, err)
	return n
}

// startFor starts a server for a test of one kind of subscription, and
// skips a sharded one, saying why, on a server without sharded pub/sub
// (Redis 6.2).
func startFor(t *testing.T, sharded bool) *redistest.Server {
	t.Helper()
	srv := redistest.Start(t)
	if sharded {
		srv.SkipUnless(t, redistest.ShardedPubSub)
	}
	return srv
}

func kindName(sharded bool) string {
	if sharded {
		return "sharded"
	}
	return "plain"
}

// TestSubscribeEndsWhenServerEndsIt kills the subscription's connection on
// the server (CLIENT KILL TYPE pubsub) and checks that Subscribe returns nil
// at once, having called ready once: it does not let go-redis's PubSub
// re-dial and subscribe again behind the caller's back. The sharded case
// needs a server with sharded pub/sub.
func TestSubscribeEndsWhenServerEndsIt(t *testing.T) {
	for _, sharded := range []bool{true, false} {
		t.Run(kindName(sharded), func(t *testing.T) {
			srv := startFor(t, sharded)
			rdb := newClient(t, srv.Addr())
			const channel = "distlock:{job}:wake:room"
			s := subscribe(t, goredis.NewRedis(rdb), channel, sharded)
			s.waitReady(t)

			srv.MustDo("CLIENT", "KILL", "TYPE", "pubsub")
			err := s.wait(t, returnTimeout)
			assert.NoError(t, err)
			assert.Equal(t, int32(1), s.readies.Load(), "ready calls")
			// Nothing subscribed again after the kill: go-redis's own
			// re-subscription was closed with the PubSub.
			eventually(t, settleTimeout, func() (bool, string) {
				n := subscribers(t, srv, channel, sharded)
				return n == 0, strconv.FormatInt(n, 10) + " subscribers on the server"
			})
		})
	}
}

// TestSubscribeEndsWhenSlotMoves subscribes to a sharded channel on a
// cluster, moves the channel's slot to another primary, and checks that
// the subscription ends with nil (Redis sends sunsubscribe when the slot
// leaves the node) and that subscribing again reaches the new owner, where
// messages arrive. It needs a server with sharded pub/sub: a plain
// subscription, distlock's fallback, does not move with a slot (a plain
// publish reaches every node).
func TestSubscribeEndsWhenSlotMoves(t *testing.T) {
	redistest.Start(t).SkipUnless(t, redistest.ShardedPubSub)
	c := redistest.StartCluster(t, 3, 0)
	cc := newClusterClient(t, c)
	r := goredis.NewRedis(cc)
	const channel = "distlock:{moving}:wake:room"

	s := subscribe(t, r, channel, true)
	s.waitReady(t)
	from := c.PrimaryOf(channel)
	var to *redistest.Server
	for _, p := range c.Primaries() {
		if p != from {
			to = p
			break
		}
	}
	c.StartMigration(c.Slot(channel), to).Finish()
	require.NoError(t, s.wait(t, settleTimeout), "the server ended the subscription")

	// The cluster client may still route by the old layout: the old owner
	// answers MOVED, which Subscribe returns as an error worth trying again
	// (not a refusal of pub/sub), and go-redis reloads the layout.
	var again *subscription
	eventually(t, settleTimeout, func() (bool, string) {
		again = subscribe(t, r, channel, true)
		select {
		case <-again.ready:
			return true, ""
		case <-again.done:
			if lease.RefusesPubSub(again.err) {
				t.Fatalf("subscribing after the move: %v reads as pub/sub refused", again.err)
			}
			return false, "subscribing again: " + again.err.Error()
		case <-time.After(settleTimeout):
			return false, "no confirmation"
		}
	})
	publish(t, to, channel, "after the move", true)
	select {
	case got := <-again.messages:
		assert.Equal(t, "after the move", got)
	case <-time.After(settleTimeout):
		t.Fatal("no message after the move")
	}
}

// TestSubscribeRefused checks that a subscription that Redis refuses comes
// back as a *lease.ReplyError, which lease's fallback recognises: an
// unknown command (a server without sharded pub/sub, such as Redis 6.2, or
// one with SSUBSCRIBE renamed away, as a proxy would), and an ACL that
// allows no channel (NOPERM).
func TestSubscribeRefused(t *testing.T) {
	t.Run("unknown command", func(t *testing.T) {
		srv := redistest.Start(t)
		if srv.Has(redistest.ShardedPubSub) {
			srv = redistest.Start(t, "--rename-command", "SSUBSCRIBE", "SSUBSCRIBE-OFF")
		}
		rdb := newClient(t, srv.Addr())
		s := subscribe(t, goredis.NewRedis(rdb), "distlock:{job}:wake:room", true)
		err := s.wait(t, returnTimeout)
		var re *lease.ReplyError
		require.True(t, errors.As(err, &re), "err = %#v, want a *lease.ReplyError", err)
		assert.Contains(t, strings.ToLower(re.Message), "unknown command")
		assert.Zero(t, s.readies.Load())
	})
	t.Run("NOPERM", func(t *testing.T) {
		for _, sharded := range []bool{true, false} {
			t.Run(kindName(sharded), func(t *testing.T) {
				srv := startFor(t, sharded)
				srv.MustDo("ACL", "SETUSER", "locker", "on", ">secret", "~*", "resetchannels", "+@all")
				rdb := newClient(t, srv.Addr(), &redis.Options{Username: "locker", Password: "secret"})
				s := subscribe(t, goredis.NewRedis(rdb), "distlock:{job}:wake:room", sharded)
				err := s.wait(t, returnTimeout)
				var re *lease.ReplyError
				require.True(t, errors.As(err, &re), "err = %#v, want a *lease.ReplyError", err)
				assert.True(t, strings.HasPrefix(re.Message, "NOPERM"), "%q", re.Message)
			})
		}
	})
}
