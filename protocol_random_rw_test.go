package distlock_test

// The randomized protocol test of the RWMutex (issue 18), on the machinery
// of TestRandomSemaphore (protocol_random_sem_test.go): the same round,
// moves and faults, the same wire (a read-write lock's scripts reply as a
// semaphore's do), and the checks that fit a read-write lock.
//
// The faces of one lock are mixed on one name (issue 23): each call is an
// RWMutex's RLock (six in ten) or Lock (two in ten), a Mutex's Lock (one
// in ten) or an Election's Campaign (one in ten); the last three hold the
// lock alone, as writers. Afterwards it checks:
//   - Safety, strictly: L1 (history.Check on Redis's confirmed writes, as
//     for the semaphore); no writer reported Acquired while anyone else
//     did (history.Config.RW, which also checks that tokens are distinct
//     and follow the send times); Redis never listed a live writer with
//     another live holder; token order against what Redis showed
//     (checkTokens).
//   - W2 order (checkOrder): nobody got the lock while one that joined the
//     line before it still waited with a live place. (A reader that joined
//     behind another waits for the same writer and is granted in the same
//     release, after it.)
//   - W1 (checkIdle, with one "permit"): nobody held the lock while a live
//     waiter stood in line for longer than the bounds, and a waiter a
//     release passed the lock to returned soon after.
//   - W3 (checkGiveUps) and W5 (checkLeftovers).
// DISTLOCK_RANDOM_SEED, DISTLOCK_RANDOM_OPS and DISTLOCK_SOAK work as for
// TestRandomProtocol.

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock"
	"github.com/distkit-go/distlock/internal/history"
	"github.com/distkit-go/distlock/lease"
)

const (
	rwRandomOps  = 200 // moves per round by default
	rwRandomName = "rwrandom"
	// In ten calls: this many RLock, then Lock, then Mutex.Lock; the rest
	// Election.Campaign.
	rwRandomReads   = 6
	rwRandomWrites  = 2
	rwRandomMutexes = 1
)

// rwSampleScript reads, in one step, the last token, the live holders with
// what is left of each lease (ms) and whether it holds alone ("w" or "r":
// a Mutex's or an Election's string is a "w"), the line, and the server's
// clock (ms).
const rwSampleScript = `
local tm = redis.call('TIME')
local now = tonumber(tm[1]) * 1000 + math.floor(tonumber(tm[2]) / 1000)
local h = {}
local typ = redis.call('TYPE', KEYS[1]).ok
if typ == 'string' then
  local ms = redis.call('PTTL', KEYS[1])
  if ms > 0 then
    h = {redis.call('GET', KEYS[1]), tostring(ms), 'w'}
  end
elseif typ == 'hash' then
  local w = redis.call('HGET', KEYS[1], '~w')
  local all = redis.call('HGETALL', KEYS[1])
  for i = 1, #all, 2 do
    local e = tonumber(string.match(all[i + 1], '^(%d+) %d+$') or '')
    if string.sub(all[i], 1, 1) ~= '~' and e and e > now then
      table.insert(h, all[i])
      table.insert(h, string.format('%.0f', e - now))
      table.insert(h, all[i] == w and 'w' or 'r')
    end
  end
end
return {redis.call('GET', KEYS[2]) or '', h, redis.call('ZRANGE', KEYS[3], 0, -1), now}
`

// TestRandomRWMutex runs randomized rounds of RLock and Lock calls of an
// RWMutex, Lock calls of a Mutex and Campaign calls of an Election on one
// name, releases, cancellations, kills, partitions, subscription drops and
// Redis pauses, and checks safety (no exclusive holder with anyone), L1,
// token order, W1, W2 (arrival order across the faces), W3 and W5. See
// the top of this file.
func TestRandomRWMutex(t *testing.T) {
	t.Parallel()
	runRandomRounds(t, rwRandomOps, runRWRound)
}

func runRWRound(t *testing.T, seed uint64, ops int) {
	w, keys := randomWorld(t, rwRandomName)
	r := &semRound{keys: keys}
	script := rueidis.NewLuaScript(rwSampleScript)
	var mu sync.Mutex
	modes := map[string]string{}
	faces := map[string]int{} // calls by face, for the figure
	var crowded []string      // samples in which Redis listed a writer with others
	r.round = newRound(t, w, seed, roundKind{
		call: "RLock, Lock, Mutex.Lock or Campaign", unit: "the lock", figure: "random-rw", widen: true, maxHold: semRandomMaxHold,
		killOdds: 40,
		newCall: func(p *rproc, name string) func(context.Context) (*distlock.Guard, error) {
			mode, call := "write", (func(context.Context) (*distlock.Guard, error))(nil)
			n := r.rng.IntN(10)
			switch {
			case n < rwRandomReads+rwRandomWrites:
				rw, err := distlock.NewRWMutex(r.wires[p.idx], w.lock, distlock.WithTTL(w.ttl), distlock.WithOwner(name))
				require.NoError(t, err)
				call = rw.Lock
				if n < rwRandomReads {
					mode, call = "read", rw.RLock
				}
			case n < rwRandomReads+rwRandomWrites+rwRandomMutexes:
				m, err := distlock.NewMutex(r.wires[p.idx], w.lock, distlock.WithTTL(w.ttl), distlock.WithOwner(name))
				require.NoError(t, err)
				call = m.Lock
			default:
				el, err := distlock.NewElection(r.wires[p.idx], w.lock, distlock.WithTTL(w.ttl))
				require.NoError(t, err)
				call = func(ctx context.Context) (*distlock.Guard, error) { return el.Campaign(ctx, name) }
			}
			mu.Lock()
			modes[name] = mode
			faces[faceOf(n)]++
			mu.Unlock()
			return call
		},
		modeOf: func(name string) string {
			mu.Lock()
			defer mu.Unlock()
			return modes[name]
		},
		read: func(ctx context.Context, admin rueidis.Client) (lineSample, error) {
			var s lineSample
			arr, err := script.Exec(ctx, admin, []string{keys.Lease, keys.Fence, keys.Queue}, nil).ToArray()
			if err != nil || len(arr) != 4 {
				return s, fmt.Errorf("sample: %v (%d values)", err, len(arr))
			}
			if ms, err := arr[3].AsInt64(); err == nil {
				s.now = time.UnixMilli(ms)
			}
			if f, _ := arr[0].ToString(); f != "" {
				s.fence, _ = strconv.ParseInt(f, 10, 64)
			}
			hs, _ := arr[1].AsStrSlice()
			writer := false
			for i := 0; i+2 < len(hs); i += 3 {
				ms, _ := strconv.ParseInt(hs[i+1], 10, 64)
				s.holders = append(s.holders, lease.Holding{Value: hs[i], TTL: time.Duration(ms) * time.Millisecond})
				writer = writer || hs[i+2] == "w"
			}
			if writer && len(s.holders) > 1 {
				mu.Lock()
				crowded = append(crowded, fmt.Sprintf("%v", s.holders))
				mu.Unlock()
			}
			s.line, _ = arr[2].AsStrSlice()
			return s, nil
		},
	})
	r.addProcs()
	moved, drainedIn := r.run(ops)

	calls := r.calls()
	r.checkL1(calls)
	report := history.Config{RW: map[string]bool{w.key: true}}.Check(w.rec.Ops())
	t.Logf("SAFETY scenario=random-rw %s", report.Summary())
	assert.Empty(t, report.Overlaps, "a writer held with someone else")
	assert.Empty(t, report.TokenOrder, "L3")
	mu.Lock()
	assert.Empty(t, crowded, "Redis listed a live writer with other live holders")
	mu.Unlock()
	r.checkTokens(calls)
	r.checkGiveUps()
	r.checkOrder(calls)
	r.checkIdle(calls)
	r.checkLeftovers(keys, true, keys.Fence)

	acquired, cancelled, killed, failed := r.tally()
	longest, most := 0, 0
	for _, s := range r.samples {
		longest, most = max(longest, len(s.line)), max(most, len(s.holders))
	}
	figure(t, "random-rw", "seed", seed, "moves", ops, "moving", moved, "draining", drainedIn,
		"waiters", len(r.waiters), "acquired", acquired, "cancelled", cancelled, "killed", killed, "failed", failed,
		"rlock_calls", faces["rlock"], "lock_calls", faces["lock"], "mutex_calls", faces["mutex"], "campaign_calls", faces["campaign"],
		"line_max", longest, "holders_max", most, "readers_peak", report.Readers, "samples", len(r.samples),
		"worst_sched_delay", w.probe.worst())
	t.Logf("moves: %v", r.moves)
}

// faceOf names the face of the n-th of ten calls of a round (see
// rwRandomReads).
func faceOf(n int) string {
	switch {
	case n < rwRandomReads:
		return "rlock"
	case n < rwRandomReads+rwRandomWrites:
		return "lock"
	case n < rwRandomReads+rwRandomWrites+rwRandomMutexes:
		return "mutex"
	}
	return "campaign"
}
