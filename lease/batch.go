package lease

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"
)

// Renewing many leases in one script.
//
// A process that holds many locks on one client renews each of them every
// third of its TTL: 100,000 locks with a 6 s TTL are 50,000 renewals a
// second. Sent one script each, Redis pays the cost of a command (reading
// it, looking the script up, calling into Lua, writing the reply: most of
// a lone renewal's 28.7k instructions) 50,000 times a second, and the
// client writes and parses as many commands. [Client.RenewBatch] renews
// up to [MaxRenewBatch] leases, of any kind, in one script, so that the
// cost of the command is shared, and each lease pays only for the calls
// that renew it (COSTS.md, "Renewals in batches").
//
// # Redis Cluster
//
// A script may only touch keys of one slot: Redis refuses one whose keys
// span slots (CROSSSLOT), and rueidis refuses to build such a command on a
// cluster client (it panics). So on a Cluster a batch holds the leases of
// one slot ([Client.BatchGroup] says which leases may share a batch), and
// on a standalone server or behind Sentinel, every lease of the client. A
// client that spreads keys over servers by itself, such as go-redis's
// Ring (which places a key by its hash tag, not by slot), batches the
// leases of one hash tag: one lock's. A [Redis] tells which it is by
// implementing [Topology]; one that does not is taken for one that shards
// by hash tag, which is right for every client that can run the lease
// scripts at all (their keys share one tag), only with smaller batches.
//
// Batching per node rather than per slot (16,384 slots: 100,000 locks are
// about six per slot) would need
//
//   - the flag: a script may touch keys of several slots of its node only
//     when it declares "#!lua flags=allow-cross-slot-keys" (Redis 7.0 and
//     later; Redis 6.2 refuses the shebang line), and a script with a
//     shebang line is judged by its flags (it may not write on a server at
//     maxmemory unless it says allow-oom, for one), so it would be a second
//     script, used only where INFO server says 7.0 or later;
//   - the slot → node map: the client's view of the cluster (CLUSTER SHARDS),
//     to group the leases by node, and a way to send a command to one node
//     whatever its keys (rueidis's Nodes(); go-redis's ForEachShard or a
//     client of the node);
//   - MOVED and ASK per key: while a slot migrates, or after a failover the
//     client has not seen yet, some keys of a batch are on another node.
//     The node answers MOVED for the whole script (it checks every key
//     before it runs), so the batch must be split by the new map and sent
//     again, and during a migration (ASK, TRYAGAIN) the keys of the moving
//     slot sent alone, with ASKING, to the importing node.
//
// None of that is built: per slot needs none of it, since one slot is on
// one node and the client's routing of a one-slot command already follows
// MOVED and ASK.

// MaxRenewBatch is the most leases that one [Client.RenewBatch] renews. A
// script holds Redis for as long as it runs: 500 lock renewals cost about
// 6.3 million instructions, some 1.5 ms of a server's time (COSTS.md), and
// a batch of 500 is barely cheaper per lease than one of 100, so a larger
// cap would only hold up the other commands longer.
const MaxRenewBatch = 500

// ErrBadBatch is returned by [Client.RenewBatch] for a batch it cannot
// send: too many leases, leases of several groups (see
// [Client.BatchGroup]), or a Client
// that waits for replicas (see [NewWithAck]; its renewals go one at a
// time, each with its WAIT).
var ErrBadBatch = errors.New("lease: invalid renewal batch")

// Sharding says how a client spreads keys over servers, and so which keys
// one script may touch.
type Sharding int

const (
	// ShardedByTag: the client places each key by its hash tag (go-redis's
	// Ring), or says nothing: a script's keys must share one hash tag.
	ShardedByTag Sharding = iota
	// Unsharded: one server (or one primary, behind Sentinel) holds every
	// key; a script may touch any keys.
	Unsharded
	// ShardedBySlot: a Redis Cluster; a script's keys must share one slot.
	ShardedBySlot
)

// Topology is implemented by a [Redis] that knows how its client spreads
// keys over servers. The rueidis seam ([FromRueidis]) and the go-redis
// adapter implement it.
type Topology interface {
	Sharding() Sharding
}

// Sharding reports ShardedBySlot for a rueidis cluster client and Unsharded
// for the others (a standalone server, Sentinel).
func (r rueidisRedis) Sharding() Sharding {
	if r.rc.Mode() == rueidis.ClientModeCluster {
		return ShardedBySlot
	}
	return Unsharded
}

// RenewItem is one lease of a [Client.RenewBatch]: what [Client.Renew]
// takes.
type RenewItem struct {
	Keys  Keys
	Value string
	TTL   time.Duration
}

// BatchGroup returns which leases may be renewed in one [Client.RenewBatch]:
// those whose group is equal. It is "" for every lease on one server
// (Unsharded), the slot of k's lease key on a Redis Cluster (as a decimal
// number), and k's hash tag (the lock's name) for a client that shards by
// hash tag or does not say (see [Topology]).
func (c *Client) BatchGroup(k Keys) string {
	switch c.sharding() {
	case Unsharded:
		return ""
	case ShardedBySlot:
		return strconv.Itoa(int(keySlot(k.Lease)))
	}
	return "{" + hashTag(k.Lease) + "}"
}

// sharding returns how c's Redis spreads keys (see [Topology]).
func (c *Client) sharding() Sharding {
	if t, ok := c.r.(Topology); ok {
		return t.Sharding()
	}
	return ShardedByTag
}

// RenewBatch renews every lease of items, as [Client.Renew] would each of
// them, in one script: each is extended to its TTL, counted from when Redis
// runs the script, if it still holds its value, and never re-created. It
// writes each lease's outcome to out[i], which must have room for every
// item. Leases of every kind may share a batch. A batch of one lease is
// sent as that lease's own renewal (Client.Renew's script), which costs
// Redis less: a lone guard's renewal costs what it did before batches.
//
// It returns an error when the batch as a whole has no answer: no reply
// (ctx ended, the connection broke), an error reply (the script did not
// run, or stopped part way: the leases it extended before are extended,
// but none is confirmed), or a reply it cannot read. Then out tells
// nothing, and no lease of the batch counts as renewed. It returns
// ErrBadTTL for a TTL under a millisecond and ErrBadBatch for a batch it
// cannot send (see there) before anything is sent. A TRYAGAIN reply is
// retried until ctx ends, as every script's.
//
// It is safe for concurrent use.
func (c *Client) RenewBatch(ctx context.Context, items []RenewItem, out []Renewal) error {
	n := len(items)
	switch {
	case n == 0:
		return nil
	case n > MaxRenewBatch:
		return fmt.Errorf("%w: %d leases, at most %d", ErrBadBatch, n, MaxRenewBatch)
	case len(out) < n:
		return fmt.Errorf("%w: room for %d outcomes, %d leases", ErrBadBatch, len(out), n)
	case c.ack.Replicas > 0:
		return fmt.Errorf("%w: a client that waits for replicas renews one lease at a time", ErrBadBatch)
	}
	group := c.BatchGroup(items[0].Keys)
	for i := range items {
		if items[i].TTL < time.Millisecond {
			return ErrBadTTL
		}
		if i > 0 && group != "" && c.BatchGroup(items[i].Keys) != group {
			return fmt.Errorf("%w: %s and %s are in different groups (%s, %s)", ErrBadBatch,
				items[0].Keys.Lease, items[i].Keys.Lease, group, c.BatchGroup(items[i].Keys))
		}
	}
	if n == 1 {
		// A batch of one is a lone renewal: its kind's own script costs
		// Redis less than the batch script's parsing and array reply.
		r, err := c.Renew(ctx, items[0].Keys, items[0].Value, items[0].TTL)
		if err == nil {
			out[0] = r
		}
		return err
	}
	keys, args, order := batchArgs(items)
	arr, err := c.run(ctx, batchRenewScript, keys, args).ToArray()
	if err != nil {
		return err
	}
	if len(arr) != n {
		return fmt.Errorf("%w to renew a batch: %d outcomes for %d leases", ErrProtocol, len(arr), n)
	}
	for p, i := range order {
		switch e := arr[p]; e.kind {
		case replyInt:
			out[i] = Renewal{OK: e.n == 1}
		case replyString:
			out[i] = Renewal{Holder: e.s}
		case replyNil:
			out[i] = Renewal{}
		default:
			return fmt.Errorf("%w to renew a batch: outcome %d is of another type", ErrProtocol, p+1)
		}
	}
	return nil
}

// batchKind is the batch script's letter for k's kind: its renewal is
// that of renewScript ('l'), rwRenewScript ('r') or semRenewScript ('s').
func batchKind(k Keys) byte {
	switch {
	case k.Permits > 0:
		return 's'
	case k.Mode != 0:
		return 'r'
	}
	return 'l'
}

// batchArgs lays items out for batchRenewScript: in runs of one kind and
// TTL (ARGV[1] lists the runs, so that each lease costs Redis two
// arguments, its key and its value, not four), and returns where each
// item went: order[p] is the item at position p. A batch usually has one
// or two runs (one TTL per kind of lock), so finding an item's run is a
// short scan.
func batchArgs(items []RenewItem) (keys, args []string, order []int) {
	type run struct {
		kind  byte
		ttl   time.Duration
		count int
	}
	var runs []run
	runOf := make([]int, len(items))
	for i := range items {
		kind, ttl := batchKind(items[i].Keys), items[i].TTL.Truncate(time.Millisecond)
		r := 0
		for r < len(runs) && (runs[r].kind != kind || runs[r].ttl != ttl) {
			r++
		}
		if r == len(runs) {
			runs = append(runs, run{kind: kind, ttl: ttl})
		}
		runs[r].count++
		runOf[i] = r
	}
	var head strings.Builder
	start := make([]int, len(runs))
	for r, run := range runs {
		if r > 0 {
			head.WriteByte(' ')
			start[r] = start[r-1] + runs[r-1].count
		}
		head.WriteByte(run.kind)
		head.WriteByte(' ')
		head.WriteString(strconv.FormatInt(run.ttl.Milliseconds(), 10))
		head.WriteByte(' ')
		head.WriteString(strconv.Itoa(run.count))
	}
	keys = make([]string, len(items))
	args = make([]string, len(items)+1)
	order = make([]int, len(items))
	args[0] = head.String()
	for i := range items {
		p := start[runOf[i]]
		start[runOf[i]]++
		keys[p], args[p+1], order[p] = items[i].Keys.Lease, items[i].Value, i
	}
	return keys, args, order
}

// batchRenewScript renews many leases, each as its own kind's renewal
// script would (renewScript, rwRenewScript, semRenewScript), and answers
// for each.
//
// ARGV[1] lists the batch's runs, "<kind> <ttl ms> <count>" each, separated
// by spaces: the first count leases are of the first run, and so on. Kind
// is l (a lock or an election), r (a read-write lock, in either mode) or s
// (a semaphore). KEYS[i] is the i-th lease's key and ARGV[i+1] its value.
// Reply: one element per lease, in order: 1 when extended; when refused,
// the value found instead (a lock's string, a read-write lock's writer) or
// nil.
//
// A lock's run reads its strings with one MGET (a renewal is one GET and
// one PEXPIRE; the MGET saves the GETs' command overhead); a lease that
// the MGET does not find holding its value (a hash gives nil, as a missing
// key does) takes the hash's path, as renewScript does. TIME is read once,
// for the first lease that needs it: every lease of the batch is dated
// from the same moment, no later than the script's start (Redis 7 gives a
// script one clock), which is never earlier than the call's send time.
//
// It has no shebang line, so that Redis 6.2 runs it as it runs the other
// scripts; on a Cluster its keys share one slot (see RenewBatch).
//
// Cost (COSTS.md, "Renewals in batches"): 12.8k instructions per lock in
// a batch of 100 (1.8 µs of Redis's time), against 28.5k for a lone
// renewal; 38.6k per semaphore permit (61.1k alone), 41.7k per read hold
// (63.3k alone).
var batchRenewScript = newScript(`
local out, i = {}, 0
local ms, us
local function clock()
  if not ms then
    local t = redis.call('TIME')
    ms, us = t[1] * 1000, t[2] / 1000
  end
end
-- hash renews value's field of a read-write lock's hash (renewHashLua):
-- 1, or the writer's value or false when refused; nil when key is no hash.
local function hash(key, value, ttl, ttln)
  local h = redis.pcall('HMGET', key, '~w', value)
  if h.err then
    return nil
  end
  if not h[2] then
    return h[1] or false
  end
  local e, tok = string.match(h[2], '^(%d+) (%d+)$')
  clock()
  if not e or e + 0 <= ms + math.floor(us) then
    return h[1] or false
  end
  redis.call('HSET', key, value, ms + math.ceil(us) + ttln .. ' ' .. tok)
  if redis.call('PTTL', key) < ttln then
    redis.call('PEXPIRE', key, ttl)
  end
  return 1
end
for kind, ttl, n in string.gmatch(ARGV[1], '(%a) (%d+) (%d+)') do
  local ttln = ttl + 0
  n = n + 0
  if kind == 'l' then
    local cur = redis.call('MGET', unpack(KEYS, i + 1, i + n))
    for j = 1, n do
      i = i + 1
      local v = cur[j]
      if v == ARGV[i + 1] then
        redis.call('PEXPIRE', KEYS[i], ttl)
        out[i] = 1
      elseif v then
        out[i] = v
      else
        out[i] = hash(KEYS[i], ARGV[i + 1], ttl, ttln) or false
      end
    end
  elseif kind == 'r' then
    for j = 1, n do
      i = i + 1
      local r = hash(KEYS[i], ARGV[i + 1], ttl, ttln)
      if r == nil then
        local cur = redis.pcall('GET', KEYS[i])
        if cur == ARGV[i + 1] then
          redis.call('PEXPIRE', KEYS[i], ttl)
          r = 1
        elseif type(cur) == 'string' then
          r = cur
        else
          r = false
        end
      end
      out[i] = r
    end
  elseif kind == 's' then
    for j = 1, n do
      i = i + 1
      local r = false
      local s = redis.pcall('ZSCORE', KEYS[i], ARGV[i + 1])
      if type(s) == 'string' then
        clock()
        if s + 0 > ms + math.floor(us) then
          redis.call('ZADD', KEYS[i], 'XX', ms + math.ceil(us) + ttln, ARGV[i + 1])
          if redis.call('PTTL', KEYS[i]) < ttln then
            redis.call('PEXPIRE', KEYS[i], ttl)
          end
          r = 1
        end
      end
      out[i] = r
    end
  else
    return redis.error_reply('ERR distlock: unknown kind in a renewal batch')
  end
end
if i ~= #KEYS then
  return redis.error_reply('ERR distlock: a renewal batch of ' .. #KEYS .. ' keys lists ' .. i)
end
return out
`)

// hashTag returns the part of key that Redis Cluster (and go-redis's Ring)
// hashes: the text between the first '{' and the next '}' when that is not
// empty, or the whole key.
func hashTag(key string) string {
	if open := strings.IndexByte(key, '{'); open >= 0 {
		if end := strings.IndexByte(key[open+1:], '}'); end > 0 {
			return key[open+1 : open+1+end]
		}
	}
	return key
}

// KeySlot returns the Redis Cluster slot of key: the CRC16 (XMODEM) of
// its hash tag (the part between the first "{" and the "}" after it, when
// not empty; the whole key otherwise), modulo 16,384. A lock's keys are
// all in the slot of its name, the order of a set is by it (see
// [SortSet]), and tools that place names on a Cluster can use it.
func KeySlot(key string) int { return int(keySlot(key)) }

// keySlot is KeySlot.
func keySlot(key string) uint16 {
	key = hashTag(key)
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc = crc<<8 ^ crc16Table[byte(crc>>8)^key[i]]
	}
	return crc & 16383
}

// crc16Table is the table of CRC16-CCITT (XMODEM: polynomial 0x1021, no
// reflection, initial value 0), Redis Cluster's key hash.
var crc16Table = func() (t [256]uint16) {
	for i := range t {
		crc := uint16(i) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
		t[i] = crc
	}
	return t
}()
