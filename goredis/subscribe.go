package goredis

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/redis/go-redis/v9"

	"github.com/distkit-go/distlock/lease"
)

// Subscribe subscribes to channel on a PubSub of its own (a connection of
// its own, from go-redis's pub/sub pool), with SSUBSCRIBE when sharded
// (on a Cluster, at the primary that owns the channel's slot, or a replica
// of it with ClusterOptions.ReadOnly) and SUBSCRIBE otherwise. It calls
// ready once, when Redis confirms that subscription, and message with the
// payload of every message on channel, in order, on the calling goroutine.
//
// It returns:
//   - ctx.Err() when ctx ends: the PubSub is closed (context.AfterFunc),
//     which closes its connection and so ends the subscription, and
//     unblocks a Receive waiting on it;
//   - nil when the server ends the subscription: an unsubscribe (or
//     sunsubscribe) for channel, which Redis sends when the slot of a
//     sharded channel leaves the node, or the server closing the
//     connection (CLIENT KILL, a shutdown);
//   - a *lease.ReplyError when Redis answers the subscription with an
//     error: the lease protocol tells a refusal (an unknown command, an
//     ACL's NOPERM: it falls back to plain channels or to polling) from a
//     reply worth trying again (MOVED, ASK, TRYAGAIN, CLUSTERDOWN, LOADING,
//     MASTERDOWN); on a Cluster, a redirection also makes go-redis reload
//     the cluster's layout;
//   - any other error as it is.
//
// go-redis's PubSub re-dials and subscribes again on its own after a
// connection error, before Receive reports it. Subscribe closes the PubSub
// on any return, so that re-subscription never delivers anything: messages
// sent meanwhile were missed, and the caller must know.
func (r *adapter) Subscribe(ctx context.Context, channel string, sharded bool, ready func(), message func(string)) error {
	kind, unkind := "subscribe", "unsubscribe"
	if sharded {
		kind, unkind = "ssubscribe", "sunsubscribe"
	}
	ps, sent, err := r.newPubSub(ctx, channel, sharded)
	if err != nil {
		return err
	}
	// When ctx ends, closing the PubSub unblocks Receive. The goroutine
	// that context.AfterFunc runs this in is waited for before returning.
	closed := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(closed)
		_ = ps.Close()
	})
	defer func() {
		if !stop() {
			<-closed
		}
		_ = ps.Close()
	}()

	// This dials the connection (on a Cluster, to the node of the channel's
	// slot) and sends the command; Redis answers in Receive.
	switch {
	case sent:
	case sharded:
		err = ps.SSubscribe(ctx, channel)
	default:
		err = ps.Subscribe(ctx, channel)
	}
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		// Not Redis's answer to the subscription, even when it is an error
		// reply (one of the connection's handshake: AUTH, HELLO, LOADING):
		// it is not a *lease.ReplyError, so it does not read as pub/sub
		// refused.
		return fmt.Errorf("goredis: subscribing to %s: %w", channel, err)
	}
	confirmed := false
	for {
		msg, err := ps.Receive(ctx)
		if err != nil {
			return r.receiveError(ctx, err)
		}
		switch m := msg.(type) {
		case *redis.Message:
			if m.Channel == channel {
				message(m.Payload)
			}
		case *redis.Subscription:
			switch {
			case m.Channel != channel:
			case m.Kind == kind && !confirmed:
				confirmed = true
				ready()
			case m.Kind == unkind:
				return nil
			}
		}
	}
}

// receiveError returns what Subscribe returns for err, which ended Receive.
func (r *adapter) receiveError(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err() // the PubSub was closed for ctx
	}
	if errors.Is(err, io.EOF) {
		return nil // the server closed the connection
	}
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		return err
	}
	_, moved := redis.IsMovedError(err)
	_, ask := redis.IsAskError(err)
	if cc, ok := r.rdb.(*redis.ClusterClient); ok && (moved || ask) {
		// Read the cluster's layout again (in the background), so that
		// the next subscription goes to the node that now owns the slot.
		cc.ReloadState(ctx)
	}
	return lease.NewReplyError(rerr.Error(), err)
}

// newPubSub returns the PubSub that Subscribe reads, and whether it has
// sent the subscription already. A *redis.Client or *redis.ClusterClient
// makes it without a channel (no connection yet, and no command), and
// Subscribe sends the command itself. A *redis.Ring cannot: it picks the
// shard by the channel, so it gets the channel at once and sends the
// command then, and it panics without a channel, or when no shard is up
// (go-redis v9.23); that panic is returned as an error, a failure to
// subscribe like a refused dial, which the caller tries again.
func (r *adapter) newPubSub(ctx context.Context, channel string, sharded bool) (ps *redis.PubSub, sent bool, err error) {
	ring, ok := r.rdb.(*redis.Ring)
	if !ok {
		if sharded {
			return r.rdb.SSubscribe(ctx), false, nil // no channel yet: no connection either
		}
		return r.rdb.Subscribe(ctx), false, nil
	}
	defer func() {
		if p := recover(); p != nil {
			ps, sent, err = nil, false, fmt.Errorf("goredis: subscribing to %s on a Ring: %v", channel, p)
		}
	}()
	if sharded {
		return ring.SSubscribe(ctx, channel), true, nil
	}
	return ring.Subscribe(ctx, channel), true, nil
}
