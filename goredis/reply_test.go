package goredis_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock/goredis"
	"github.com/distkit-go/distlock/internal/loopback"
	"github.com/distkit-go/distlock/internal/redistest"
	"github.com/distkit-go/distlock/lease"
)

// TestReplyConversion runs Lua scripts of every reply shape on a real
// Redis through go-redis and checks the lease.Reply the adapter makes of
// each: integers, strings (bulk and status), nil (Lua false and nil, at the
// top and inside arrays), nested arrays, and error replies, which must be
// *lease.ReplyError values that lease.IsReply recognises, with Redis's own
// message.
func TestReplyConversion(t *testing.T) {
	srv := redistest.Start(t)
	rdb := newClient(t, srv.Addr())
	ctx := ctxFor(t, callTimeout)

	values := []struct {
		name string
		lua  string
		want lease.Reply
	}{
		{"integer", "return 42", lease.IntReply(42)},
		{"negative integer", "return -7", lease.IntReply(-7)},
		{"bulk string", "return 'owner#1'", lease.StringReply("owner#1")},
		{"empty string", "return ''", lease.StringReply("")},
		{"status", "return redis.status_reply('OK')", lease.StringReply("OK")},
		{"false", "return false", lease.NilReply()},
		{"nil", "return nil", lease.NilReply()},
		{"empty array", "return {}", lease.ArrayReply([]lease.Reply{})},
		{"array with nils", "return {1, 'two', false, {3, false, 'x'}, 'five'}", lease.ArrayReply([]lease.Reply{
			lease.IntReply(1), lease.StringReply("two"), lease.NilReply(),
			lease.ArrayReply([]lease.Reply{lease.IntReply(3), lease.NilReply(), lease.StringReply("x")}),
			lease.StringReply("five"),
		})},
	}
	for _, c := range values {
		t.Run(c.name, func(t *testing.T) {
			got := goredis.ReplyOf(rdb.Eval(ctx, c.lua, nil))
			require.NoError(t, got.Err())
			assert.Equal(t, c.want, got)
		})
	}

	errorReplies := []struct {
		name, lua, want string
	}{
		{"error reply", "return redis.error_reply('ERR distlock: boom')", "ERR distlock: boom"},
		{"own code", "return redis.error_reply('TRYAGAIN later')", "TRYAGAIN later"},
		// Redis 7 says "ERR user_script:1: oops", Redis 6.2 "ERR Error
		// running script (call to f_<sha>): @user_script:1:
		// user_script:1: oops".
		{"runtime error", "error('oops')", "user_script:1: oops"},
	}
	for _, c := range errorReplies {
		t.Run(c.name, func(t *testing.T) {
			err := goredis.ReplyOf(rdb.Eval(ctx, c.lua, nil)).Err()
			var re *lease.ReplyError
			if !errors.As(err, &re) || !lease.IsReply(err) {
				t.Fatalf("err = %#v, want a *lease.ReplyError", err)
			}
			assert.Contains(t, re.Message, c.want)
			var rerr redis.Error
			assert.True(t, errors.As(err, &rerr), "the ReplyError unwraps to go-redis's error")
		})
	}

	t.Run("error inside an array", func(t *testing.T) {
		got := goredis.ReplyOf(rdb.Eval(ctx, "return {1, redis.error_reply('ERR inner')}", nil))
		arr, err := got.ToArray()
		require.NoError(t, err)
		require.Len(t, arr, 2)
		assert.Equal(t, lease.IntReply(1), arr[0])
		require.True(t, lease.IsReply(arr[1].Err()), "element 1: %v", arr[1].Err())
		assert.Equal(t, "ERR inner", arr[1].Err().(*lease.ReplyError).Message)
	})

	t.Run("no reply", func(t *testing.T) {
		// A port nobody listens on: the error is go-redis's, not a reply.
		port, err := loopback.FreePort()
		require.NoError(t, err)
		dead := newClient(t, "127.0.0.1:"+strconv.Itoa(port), &redis.Options{MaxRetries: -1, DialerRetries: 1})
		err = goredis.ReplyOf(dead.Eval(ctx, "return 1", nil)).Err()
		require.Error(t, err)
		assert.False(t, lease.IsReply(err), "err = %v is not an error reply", err)
	})
}

// TestIntegerReplyAllocatesNothing checks that converting an integer reply,
// the reply of the common cases, costs no allocation of the adapter's.
func TestIntegerReplyAllocatesNothing(t *testing.T) {
	cmd := redis.NewCmd(context.Background())
	cmd.SetVal(int64(1))
	if n := testing.AllocsPerRun(100, func() { _ = goredis.ReplyOf(cmd) }); n != 0 {
		t.Errorf("converting an integer reply allocates %v times, want 0", n)
	}
}

// TestEvalFallsBackToEvalOnNoScript flushes Redis's script cache and checks
// that the next call still runs: EVALSHA gets NOSCRIPT, and the adapter
// sends the body with EVAL, once; the call after that is EVALSHA alone.
func TestEvalFallsBackToEvalOnNoScript(t *testing.T) {
	srv := redistest.Start(t)
	rdb := newClient(t, srv.Addr())
	lc, err := lease.NewOn(goredis.NewRedis(rdb), lease.Ack{})
	require.NoError(t, err)
	k, err := lease.NewKeys("goredis-test", "noscript")
	require.NoError(t, err)
	value := lease.NewValue("t")
	ctx := ctxFor(t, callTimeout)

	grant, err := lc.Acquire(ctx, k, value, 30*time.Second)
	require.NoError(t, err)
	require.True(t, grant.Acquired, "first acquire: %+v", grant)

	srv.MustDo("SCRIPT", "FLUSH")
	srv.MustDo("CONFIG", "RESETSTAT")
	r, err := lc.Renew(ctx, k, value, 30*time.Second)
	require.NoError(t, err)
	require.True(t, r.OK, "renew after SCRIPT FLUSH: %+v", r)
	assert.Equal(t, int64(1), cmdStat(t, srv, "evalsha", "calls"), "EVALSHA sent once")
	assert.Equal(t, int64(1), cmdStat(t, srv, "evalsha", "failed_calls"), "EVALSHA answered NOSCRIPT")
	assert.Equal(t, int64(1), cmdStat(t, srv, "eval", "calls"), "EVAL sent once, after NOSCRIPT")

	r, err = lc.Renew(ctx, k, value, 30*time.Second)
	require.NoError(t, err)
	require.True(t, r.OK, "second renew: %+v", r)
	assert.Equal(t, int64(2), cmdStat(t, srv, "evalsha", "calls"), "EVALSHA sent again")
	assert.Equal(t, int64(1), cmdStat(t, srv, "evalsha", "failed_calls"), "no NOSCRIPT once Redis has the script")
	assert.Equal(t, int64(1), cmdStat(t, srv, "eval", "calls"), "no EVAL once Redis has the script")
}
