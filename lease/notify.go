package lease

import (
	"context"
	"errors"
	"strconv"
	"strings"
)

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
	err := c.r.Subscribe(ctx, channel, true, ready, onMessage)
	if isUnknownCommand(err) {
		err = c.r.Subscribe(ctx, channel, false, ready, onMessage)
	}
	if RefusesPubSub(err) && ctx.Err() == nil {
		return errors.Join(ErrNoPubSub, err)
	}
	return err
}

func isUnknownCommand(err error) bool {
	re, ok := replyError(err)
	return ok && strings.Contains(strings.ToLower(re.Message), "unknown command")
}

// RefusesPubSub reports whether err, returned by [Redis.Subscribe], is
// Redis refusing the subscription itself (an unknown command, an ACL's
// NOPERM), after which waiters poll ([ErrNoPubSub]), as opposed to an
// error reply that says "not here" or "not now": a redirection, a slot
// that is moving, a cluster or a primary that is down, a server loading
// its data. After those, subscribing again can work.
func RefusesPubSub(err error) bool {
	return IsReply(err) && !SaysNotNow(err)
}

// SaysNotNow reports whether err is an error reply that says "not here" or
// "not now" (a redirection, a slot that is moving, a cluster or a primary
// that is down, a server loading its data): asking again, later or
// elsewhere, can work.
func SaysNotNow(err error) bool {
	re, ok := replyError(err)
	if !ok {
		return false
	}
	for _, code := range [...]string{"MOVED", "ASK", "TRYAGAIN", "CLUSTERDOWN", "LOADING", "MASTERDOWN"} {
		if re.prefix(code) {
			return true
		}
	}
	return false
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
