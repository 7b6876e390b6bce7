// Package lease is distlock's Redis protocol: the scripts that acquire, renew
// and release a lease, the layout of a lock's keys, and the format of the
// value a holder writes.
//
// Every operation is a single Lua script, so it takes one round trip and
// cannot interleave with another client's. Every script that touches a held
// lease first checks that the key still holds the caller's value; none of them
// ever re-creates a lease that has expired.
//
// # Fencing tokens
//
// Acquire issues a fencing token in the same script that writes the lease.
// A token is the Redis server's clock in microseconds at the grant, raised to
// one more than the previous token if the clock has not moved past it. Tokens
// of one lock therefore strictly increase as long as the fencing key survives,
// and, when it does not (a restart without persistence, an eviction, a
// failover to a replica that missed the last writes, or simply
// [FenceRetention] without any acquisition), they still increase unless the
// server's clock has stepped back by more than the time that passed. Tokens
// stay below 2^53, so they are exact in Lua, in JSON and in float64: Acquire
// fails rather than issue a larger one, and it fails as well when the fencing
// key holds anything but a token (something other than distlock wrote it).
package lease

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/redis/rueidis"
)

// FenceRetention is how long the fencing key outlives the last acquisition.
// It guards token order against a server clock that steps back; see the
// package documentation.
const FenceRetention = 24 * time.Hour

// ErrProtocol is wrapped by errors for replies that do not have the shape the
// scripts return, which means something other than distlock wrote the keys or
// answered the call.
var ErrProtocol = errors.New("unexpected reply")

// ErrBadTTL is returned for a TTL under one millisecond, Redis's unit.
var ErrBadTTL = errors.New("lease: TTL under one millisecond")

// acquireScript writes the lease if it is free, and issues a fencing token.
//
// KEYS[1] lease key, KEYS[2] fencing key, KEYS[3] the value's void key
// (see [Keys.Void]).
// ARGV[1] the acquisition's value, ARGV[2] TTL in ms, ARGV[3] fencing key
// retention in ms.
// Reply: {1, token} when the lease is now ours; {0, pttl, holder value} when
// another value holds it (pttl is -1 when the key has no expiry), or when
// ARGV[1] was voided by [Client.Cancel] (with an empty holder value when
// the lease is free); an error when the fencing key holds anything but decimal digits, or
// when the token would pass 2^53-1.
//
// A voided value belongs to an attempt its caller gave up on without seeing
// the outcome; the attempt can still reach Redis after the clean-up that
// voided it (rueidis may send the two on different connections), and must
// not then leave an orphaned lease.
//
// The lease is also granted when it already holds ARGV[1]: that happens when
// an earlier attempt of the same acquisition was applied but its reply was
// lost, and granting it again (with a fresh TTL and a new token) avoids
// blocking everyone, the caller included, until the orphan expires. All reads
// and checks come before the first write, so a key of the wrong type or
// content fails the script without leaving anything behind.
//
// Tokens are Lua numbers (float64): from 2^53 on, last+1 rounds back to
// last, and Redis's conversion of a number beyond int64 (inf, 1e300) to an
// integer reply is garbage (math.MinInt64 on amd64). So the token helpers
// (fenceLua) parse the fencing key strictly and refuse to issue a token they
// cannot represent exactly rather than one that repeats or goes back.
var acquireScript = newScript(fenceLua + `
local last, ferr = lastToken()
if ferr then
  return ferr
end
local cur = redis.call('GET', KEYS[1])
if cur and cur ~= ARGV[1] then
  return {0, redis.call('PTTL', KEYS[1]), cur}
end
if redis.call('EXISTS', KEYS[3]) == 1 then
  return {0, redis.call('PTTL', KEYS[1]), cur or ''}
end
return grant(last, ARGV[1], ARGV[2], ARGV[3])
`)

// fenceLua defines the helpers shared by acquireScript and handoffScript.
// lastToken reads the fencing key (KEYS[2]); it accepts only the digits-only
// integers the scripts write, since Lua's tonumber would also take "1.5",
// "0x10", " 5 ", "nan" or "inf". nextToken returns the server clock in µs, or
// last+1 if the clock has not moved past last, and refuses to pass 2^53-1,
// beyond which a Lua number (a float64) can no longer count by one. grant
// writes value to the lease (KEYS[1]) with ttl, stores the next token with
// retention, and returns the script's reply {1, token}, or the error of
// nextToken before writing anything.
const fenceLua = `
local function lastToken()
  local raw = redis.call('GET', KEYS[2])
  if not raw then
    return 0
  end
  if not string.match(raw, '^%d+$') then
    return nil, redis.error_reply('ERR distlock: fencing key ' .. KEYS[2] .. ' does not hold an integer')
  end
  return tonumber(raw)
end
local function nextToken(last)
  local t = redis.call('TIME')
  local token = tonumber(t[1]) * 1000000 + tonumber(t[2])
  if token <= last then
    token = last + 1
  end
  if token > 9007199254740991 then
    return nil, redis.error_reply('ERR distlock: fencing key ' .. KEYS[2] .. ' is exhausted: the next token would pass 2^53-1')
  end
  return token
end
local function grant(last, value, ttl, retention)
  local token, terr = nextToken(last)
  if terr then
    return terr
  end
  redis.call('SET', KEYS[1], value, 'PX', ttl)
  redis.call('SET', KEYS[2], string.format('%.0f', token), 'PX', retention)
  return {1, token}
end
`

// handoffScript passes the lease from the caller's value straight to a
// waiter's value, in one step: a release and an acquisition in a single
// round trip.
//
// KEYS[1] lease key, KEYS[2] fencing key.
// ARGV[1] the releasing acquisition's value, ARGV[2] the waiter's value,
// ARGV[3] the waiter's TTL in ms, ARGV[4] fencing key retention in ms.
// Reply: {1, token} when the lease now holds ARGV[2] with a new token; {0}
// when it did not hold ARGV[1] (nothing is written then). As in
// acquireScript, all reads and checks come before the first write.
var handoffScript = newScript(fenceLua + `
if redis.pcall('GET', KEYS[1]) ~= ARGV[1] then
  return {0}
end
local last, ferr = lastToken()
if ferr then
  return ferr
end
return grant(last, ARGV[2], ARGV[3], ARGV[4])
`)

// renewScript extends the lease if it still holds the caller's value.
//
// KEYS[1] lease key. ARGV[1] the acquisition's value, ARGV[2] TTL in ms.
// Reply: {1} when extended; {0, holder value or false} when refused.
var renewScript = newScript(`
local cur = redis.pcall('GET', KEYS[1])
if cur == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1}
end
if type(cur) ~= 'string' then
  cur = false
end
return {0, cur}
`)

// releaseScript deletes the lease if it still holds the caller's value, and
// announces the release to waiters.
//
// KEYS[1] lease key, KEYS[2] release channel (declared as a key so that
// Redis Cluster checks it shares the lease's slot), and for [Client.Cancel]
// KEYS[3] the value's void key. ARGV[1] the acquisition's value, and for
// Cancel ARGV[2] how long the void key lasts, in ms.
// Reply: 1 when deleted, 0 when the key held something else or nothing.
//
// The announcement carries the released value, so a waiter can tell a
// release it is waiting for from an old one. It goes out on the sharded
// channel (SPUBLISH, Redis 7), which in a cluster stays on the lease's shard;
// where SPUBLISH does not exist (Redis 6, miniredis) it falls back to PUBLISH,
// which is what waiters subscribe to there (see [Client.Subscribe]).
var releaseScript = newScript(`
if KEYS[3] then
  redis.call('SET', KEYS[3], '1', 'PX', ARGV[2])
end
if redis.pcall('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  local r = redis.pcall('SPUBLISH', KEYS[2], ARGV[1])
  if type(r) == 'table' and r.err then
    redis.call('PUBLISH', KEYS[2], ARGV[1])
  end
  return 1
end
return 0
`)

// NewValue returns a fresh lease value for one acquisition by owner:
// "owner#id", where id is formatted as a UUID. The owner part lets an
// operator see who holds a key; the id makes the value unique, so two
// acquisitions by the same owner never renew or release each other's lease.
//
// The id is a random prefix drawn once per process followed by a counter, so
// it costs no system call and cannot repeat within a process, and two
// processes share a prefix with a chance of about one in 2^64.
func NewValue(owner string) string {
	var id [16]byte
	copy(id[:8], idPrefix[:])
	binary.BigEndian.PutUint64(id[8:], idCounter.Add(1))
	id[6] = id[6]&0x0f | 0x40 // version 4
	id[8] = id[8]&0x3f | 0x80 // RFC 4122 variant

	var text [36]byte
	hex.Encode(text[0:8], id[0:4])
	text[8] = '-'
	hex.Encode(text[9:13], id[4:6])
	text[13] = '-'
	hex.Encode(text[14:18], id[6:8])
	text[18] = '-'
	hex.Encode(text[19:23], id[8:10])
	text[23] = '-'
	hex.Encode(text[24:36], id[10:16])

	var b strings.Builder
	b.Grow(len(owner) + 1 + len(text))
	b.WriteString(owner)
	b.WriteByte('#')
	b.Write(text[:])
	return b.String()
}

// The parts of NewValue's ids.
var (
	idPrefix  = randomBytes()
	idCounter atomic.Uint64
)

func randomBytes() (b [8]byte) {
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on supported systems
	return b
}

// Owner returns the owner part of a value written by [NewValue]. For a value
// that distlock did not write it returns the whole value.
func Owner(value string) string {
	i := strings.LastIndexByte(value, '#')
	if i < 0 {
		return value
	}
	if id := value[i+1:]; len(id) != 36 || uuid.Validate(id) != nil {
		return value
	}
	return value[:i]
}

// Client runs the lease scripts through a rueidis client. It holds no state
// of its own and is safe for concurrent use.
//
// While a Redis Cluster slot is being migrated, Redis answers TRYAGAIN to a
// script that names several keys of the slot when only some of them have
// moved (the release script counts its channel as a key, and a channel is
// never present): the script did not run. Every method retries it, with
// short pauses, until its context ends.
type Client struct {
	rc  rueidis.Client
	ack Ack // Replicas 0: do not wait for replicas; see NewWithAck
}

// New returns a Client that talks to Redis through rc.
func New(rc rueidis.Client) *Client { return &Client{rc: rc} }

// Grant is the outcome of [Client.Acquire].
type Grant struct {
	// Acquired reports whether the lease is now held by the caller's value.
	Acquired bool
	// Token is the fencing token, when Acquired.
	Token int64
	// Holder is the value that holds the lease, when not Acquired.
	Holder string
	// HolderTTL is the holder's remaining lease, when not Acquired; it is
	// negative when the key has no expiry.
	HolderTTL time.Duration
}

// Acquire writes value to the lease with the given TTL if the lease is free
// (or already holds value), and issues a fencing token. It makes one round
// trip. A Redis error, including a key of the wrong type, is returned as the
// rueidis error and leaves nothing written. A TTL under a millisecond is
// refused with ErrBadTTL before anything is sent.
//
// A Client made by [NewWithAck] also waits for replicas, in the same round
// trip. If the lease was granted but not acknowledged in time, Acquire
// deletes it again (only if it still holds value) and returns an
// [*AckError]; a lease that was not granted is reported as usual.
func (c *Client) Acquire(ctx context.Context, k Keys, value string, ttl time.Duration) (Grant, error) {
	if ttl < time.Millisecond {
		return Grant{}, ErrBadTTL
	}
	res, w := c.exec(ctx, acquireScript, []string{k.Lease, k.Fence, k.Void(value)},
		[]string{value, ms(ttl), ms(FenceRetention)})
	arr, err := res.ToArray()
	if err != nil {
		return Grant{}, err
	}
	if len(arr) < 2 {
		return Grant{}, fmt.Errorf("%w to acquire: %d elements", ErrProtocol, len(arr))
	}
	ok, err1 := arr[0].AsInt64()
	n, err2 := arr[1].AsInt64()
	if err := errors.Join(err1, err2); err != nil {
		return Grant{}, fmt.Errorf("%w to acquire: %w", ErrProtocol, err)
	}
	if ok == 1 {
		if err := c.ackError("acquire", k.Lease, w); err != nil {
			if uerr := c.undo(ctx, k, value); uerr != nil {
				return Grant{}, fmt.Errorf("%w; deleting the lease again failed, it expires on its own: %v", err, uerr)
			}
			return Grant{}, err
		}
		return Grant{Acquired: true, Token: n}, nil
	}
	g := Grant{HolderTTL: time.Duration(n) * time.Millisecond}
	if len(arr) > 2 {
		g.Holder, _ = arr[2].ToString()
	}
	return g, nil
}

// Renewal is the outcome of [Client.Renew].
type Renewal struct {
	// OK reports whether the lease held the caller's value and was extended.
	OK bool
	// Holder is the value found instead when not OK; empty if the key was
	// missing (expired or deleted).
	Holder string
}

// Renew extends the lease to the given TTL, counted from when Redis runs the
// script, if it still holds value. It never re-creates a missing lease.
//
// A Client made by [NewWithAck] also waits for replicas, in the same round
// trip. A renewal that was applied but not acknowledged in time returns an
// [*AckError] and no Renewal: it is not confirmed, although the primary has
// extended the lease.
func (c *Client) Renew(ctx context.Context, k Keys, value string, ttl time.Duration) (Renewal, error) {
	if ttl < time.Millisecond {
		// PEXPIRE with 0 or less would delete the lease.
		return Renewal{}, ErrBadTTL
	}
	res, w := c.exec(ctx, renewScript, []string{k.Lease}, []string{value, ms(ttl)})
	arr, err := res.ToArray()
	if err != nil {
		return Renewal{}, err
	}
	if len(arr) < 1 {
		return Renewal{}, fmt.Errorf("%w to renew: empty array", ErrProtocol)
	}
	ok, err := arr[0].AsInt64()
	if err != nil {
		return Renewal{}, fmt.Errorf("%w to renew: %w", ErrProtocol, err)
	}
	r := Renewal{OK: ok == 1}
	if !r.OK && len(arr) > 1 {
		r.Holder, _ = arr[1].ToString()
	}
	if r.OK {
		if err := c.ackError("renew", k.Lease, w); err != nil {
			return Renewal{}, err
		}
	}
	return r, nil
}

// Handoff passes the lease from value to next, with next's TTL and a new
// fencing token, if the lease still holds value; it reports whether it did
// and the token. It is a release and an acquisition in one round trip, used
// to give the lock to a waiter of the same process without freeing it in
// between. Like Acquire, it fails without writing anything if the fencing key
// is not one distlock wrote.
func (c *Client) Handoff(ctx context.Context, k Keys, value, next string, ttl time.Duration) (bool, int64, error) {
	if ttl < time.Millisecond {
		return false, 0, ErrBadTTL
	}
	arr, err := c.run(ctx, handoffScript, []string{k.Lease, k.Fence},
		[]string{value, next, ms(ttl), ms(FenceRetention)}).ToArray()
	if err != nil {
		return false, 0, err
	}
	if len(arr) < 1 {
		return false, 0, fmt.Errorf("%w to handoff: empty array", ErrProtocol)
	}
	ok, err := arr[0].AsInt64()
	if err != nil || ok != 1 {
		return false, 0, err
	}
	if len(arr) < 2 {
		return false, 0, fmt.Errorf("%w to handoff: no token", ErrProtocol)
	}
	token, err := arr[1].AsInt64()
	if err != nil {
		return false, 0, fmt.Errorf("%w to handoff: %w", ErrProtocol, err)
	}
	return true, token, nil
}

// releaseTries bounds how many times Release sends its script when calls
// fail without a reply from Redis. It is more than the number of
// connections rueidis keeps to one node by default (two, or four with four
// or more CPUs), since each dead one can fail one call.
const releaseTries = 8

// Release deletes the lease if it still holds value and reports whether it
// did; when it did, it publishes value on the lock's release channel. It
// never touches a lease held by another value.
//
// The delete is idempotent, so when a call fails without a reply from Redis
// Release sends it again, up to releaseTries calls in all and while ctx
// allows. rueidis keeps a pooled connection that broke while it was idle
// until a command fails on it, so after a network blip the first call on
// each connection fails although Redis is reachable; without a retry the
// lease would outlive its release by up to a TTL. The result is that of the
// last call: in the rare case that a call broken in flight had deleted the
// lease, a retry reports it as no longer holding value.
func (c *Client) Release(ctx context.Context, k Keys, value string) (bool, error) {
	return c.release(ctx, []string{k.Lease, k.Channel}, []string{value})
}

// Cancel gives value up for good, after an acquire with it whose outcome
// the caller did not see: it marks value void for ttl (an acquire with value
// that reaches Redis later, for instance on another connection than this
// call's, is refused), then deletes the lease if it holds value, as Release
// does. It retries as Release does. A TTL under a millisecond is refused
// with ErrBadTTL before anything is sent.
func (c *Client) Cancel(ctx context.Context, k Keys, value string, ttl time.Duration) (bool, error) {
	if ttl < time.Millisecond {
		return false, ErrBadTTL
	}
	return c.release(ctx, []string{k.Lease, k.Channel, k.Void(value)}, []string{value, ms(ttl)})
}

// release runs releaseScript for Release and Cancel.
func (c *Client) release(ctx context.Context, keys, args []string) (bool, error) {
	var err error
	for range releaseTries {
		var n int64
		n, err = c.run(ctx, releaseScript, keys, args).AsInt64()
		if err == nil {
			return n == 1, nil
		}
		if _, replied := rueidis.IsRedisErr(err); replied || ctx.Err() != nil {
			break
		}
	}
	return false, err
}

// ms formats d in whole milliseconds, the unit of Redis's PX and PEXPIRE.
func ms(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }
