package lease

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"
)

// unsubscribeTimeout bounds the command that ends a subscription.
const unsubscribeTimeout = time.Second

// ErrNoPubSub is returned by [Client.Subscribe] when the server has no
// pub/sub that distlock can use (neither SSUBSCRIBE nor SUBSCRIBE is allowed,
// for example behind a proxy or an ACL that forbids them). Waiters then fall
// back to polling.
var ErrNoPubSub = errors.New("lease: release notifications unavailable")

// Subscribe listens for grants to the waiters of room (see
// [Client.AcquireOrQueue]) until ctx is done or the subscription breaks. It
// calls ready once the server has confirmed the subscription, and granted
// with the waiter's value and the grant's fencing token for every grant
// announced, in order, from the calling goroutine. Announcements that do not
// have the shape the scripts publish are ignored.
//
// It subscribes to the sharded channel (SSUBSCRIBE) and falls back to a plain
// channel where the server does not know sharded pub/sub, matching the
// scripts. It returns ctx.Err() when ctx ends, after unsubscribing on the
// same connection; nil when the server ended the subscription (a slot moved,
// or a reconnect); [ErrNoPubSub] when the server refuses pub/sub; or the
// connection's error. After any return but ctx's, announcements may have
// been missed, and the caller should ask Redis before waiting again.
func (c *Client) Subscribe(ctx context.Context, k Keys, room string, ready func(), granted func(value string, token int64)) error {
	channel := k.WakeChannel(room)
	onMessage := func(msg string) {
		tok, value, ok := strings.Cut(msg, "\n")
		token, err := strconv.ParseInt(tok, 10, 64)
		if ok && err == nil && value != "" {
			granted(value, token)
		}
	}
	return c.listen(ctx, channel, ready, onMessage)
}

// listen subscribes to channel, sharded or else plain, until ctx ends or
// the subscription breaks, with the returns that Subscribe documents.
func (c *Client) listen(ctx context.Context, channel string, ready func(), onMessage func(string)) error {
	err := c.receive(ctx, channel, true, ready, onMessage)
	if isUnknownCommand(err) {
		err = c.receive(ctx, channel, false, ready, onMessage)
	}
	var re *rueidis.RedisError
	if errors.As(err, &re) && ctx.Err() == nil {
		return errors.Join(ErrNoPubSub, err)
	}
	return err
}

func (c *Client) receive(ctx context.Context, channel string, sharded bool, ready func(), message func(string)) error {
	kind, cmd := "subscribe", c.rc.B().Subscribe().Channel(channel).Build()
	if sharded {
		kind, cmd = "ssubscribe", c.rc.B().Ssubscribe().Channel(channel).Build()
	}
	ctx = rueidis.WithOnSubscriptionHook(ctx, func(s rueidis.PubSubSubscription) {
		if s.Kind == kind && s.Channel == channel {
			ready()
		}
	})
	// When ctx ends, Receive returns but the connection stays subscribed;
	// this hook runs on that connection and ends the subscription there.
	ctx = rueidis.WithOnReceiveReturnHook(ctx, func(err error, cc rueidis.CommandClient) error {
		if !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
			return err
		}
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), unsubscribeTimeout)
		defer cancel()
		unsub := cc.B().Unsubscribe().Channel(channel).Build()
		if sharded {
			unsub = cc.B().Sunsubscribe().Channel(channel).Build()
		}
		_ = cc.Do(uctx, unsub).Error()
		return err
	})
	return c.rc.Receive(ctx, cmd, func(m rueidis.PubSubMessage) { message(m.Message) })
}

func isUnknownCommand(err error) bool {
	var re *rueidis.RedisError
	return errors.As(err, &re) && strings.Contains(strings.ToLower(re.Error()), "unknown command")
}

// SubscribeLeader listens for the changes of holder that an election's
// scripts announce on [Keys.Leader] (see [Keys.Election]), as Subscribe
// listens for grants: changed is called with the new holder's value and
// token, or with an empty value and the token of the holder that left
// without a successor. The same returns as Subscribe's apply; after any
// but ctx's, changes may have been missed, and the caller should read the
// lease before relying on what it heard.
func (c *Client) SubscribeLeader(ctx context.Context, k Keys, ready func(), changed func(value string, token int64)) error {
	onMessage := func(msg string) {
		tok, value, ok := strings.Cut(msg, "\n")
		token, err := strconv.ParseInt(tok, 10, 64)
		if ok && err == nil {
			changed(value, token)
		}
	}
	return c.listen(ctx, k.Leader, ready, onMessage)
}
