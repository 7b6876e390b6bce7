package distlock_test

import (
	"context"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock"
)

// noRedis is a rueidis client that must never be used: it embeds a nil
// client, so any call panics and fails the fuzz target. NewMutex and the
// argument checks of TryLockFor must not reach Redis.
type noRedis struct{ rueidis.Client }

// validPart is the documented rule for lock names and namespaces (and,
// with braces allowed, owner ids), written out independently of the
// library: 1 to max bytes of valid UTF-8, every character printable
// (letters, marks, numbers, punctuation, symbols, the ASCII space).
func validPart(s string, maxLen int, bracesAllowed bool) bool {
	if s == "" || len(s) > maxLen || !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if !unicode.IsPrint(r) || (!bracesAllowed && (r == '{' || r == '}')) {
			return false
		}
	}
	return true
}

// Which options FuzzNewMutex passes, as bits of its mask argument.
const (
	optNamespace = 1 << iota
	optOwner
	optTTL
	optMaxWait
	optRetry
	optNil // a nil Option, which must be refused
	optAck
)

// FuzzNewMutex checks that NewMutex never panics on any key, namespace,
// owner, duration or replica acknowledgement; that it accepts exactly what the documentation allows,
// naming the first wrong field (in the documented order) in an error that
// matches ErrInvalidOption; and that it sends nothing to Redis. For an
// accepted Mutex it also checks the key layout and TryLockFor's refusal of
// negative durations.
func FuzzNewMutex(f *testing.F) {
	const all = optNamespace | optOwner | optTTL | optMaxWait | optRetry
	sec := int64(time.Second)
	f.Add("job", "distlock", "worker-1", sec, int64(0), int64(0), int64(0), int64(0), int64(0), int64(0), uint8(all))
	f.Add("", "ns", "o", sec, int64(0), int64(0), int64(0), int64(0), int64(0), int64(0), uint8(all))
	f.Add("a{b}", "ns", "o", sec, int64(0), int64(0), int64(0), int64(0), int64(0), int64(0), uint8(all))
	f.Add("job", "{ns}", "o", sec, int64(0), int64(0), int64(0), int64(0), int64(0), int64(0), uint8(all))
	f.Add("job", "ns", "{owner}", sec, int64(0), int64(0), int64(0), int64(0), int64(0), int64(0), uint8(all))
	f.Add("job", "ns", "", sec, int64(0), int64(0), int64(0), int64(0), int64(0), int64(0), uint8(all))
	f.Add("zähler", "ns", "host:1 pid 2", int64(distlock.MinTTL), int64(0), int64(0), int64(-1), int64(0), int64(0), int64(0), uint8(all))
	f.Add("job", "ns", "o", int64(distlock.MinTTL)-1, int64(0), int64(0), int64(0), int64(0), int64(0), int64(0), uint8(all))
	f.Add("job", "ns", "o", int64(distlock.MaxTTL)+1, int64(0), int64(0), int64(0), int64(0), int64(0), int64(0), uint8(all))
	f.Add("job", "ns", "o", int64(0), int64(-1), int64(-1), int64(0), int64(-1), int64(0), int64(0), uint8(all))
	f.Add("tab\there", "ns", "o", sec, int64(0), int64(0), int64(0), int64(0), int64(0), int64(0), uint8(0))
	f.Add("job", "ns", "o", sec, int64(0), int64(0), int64(0), int64(0), int64(0), int64(0), uint8(all|optNil))
	f.Add("job", "ns", "o", 3*sec, int64(0), int64(0), int64(0), int64(0), int64(1), sec, uint8(all|optAck))
	f.Add("job", "ns", "o", 3*sec, int64(0), int64(0), int64(0), int64(0), int64(1), sec+1, uint8(all|optAck))
	f.Add("job", "ns", "o", sec, int64(0), int64(0), int64(0), int64(0), int64(-1), int64(time.Millisecond), uint8(all|optAck))
	f.Add("job", "ns", "o", sec, int64(0), int64(0), int64(0), int64(0), int64(2), int64(time.Millisecond)-1, uint8(all|optAck))
	f.Fuzz(func(t *testing.T, key, ns, owner string, ttl, maxWait, retry, timeout, interval, ackReplicas, ackTimeout int64, mask uint8) {
		var opts []distlock.Option
		// What NewMutex should see, starting from the documented defaults.
		wantNS, wantOwner, wantTTL := distlock.DefaultNamespace, "", distlock.DefaultTTL
		var wantMaxWait, wantRetry time.Duration
		if mask&optNamespace != 0 {
			opts, wantNS = append(opts, distlock.WithNamespace(ns)), ns
		}
		if mask&optOwner != 0 {
			opts, wantOwner = append(opts, distlock.WithOwner(owner)), owner
		}
		if mask&optTTL != 0 {
			opts, wantTTL = append(opts, distlock.WithTTL(time.Duration(ttl))), time.Duration(ttl)
		}
		if mask&optMaxWait != 0 {
			opts, wantMaxWait = append(opts, distlock.WithMaxWait(time.Duration(maxWait))), time.Duration(maxWait)
		}
		if mask&optRetry != 0 {
			opts, wantRetry = append(opts, distlock.WithRetryInterval(time.Duration(retry))), time.Duration(retry)
		}
		if mask&optAck != 0 {
			opts = append(opts, distlock.WithReplicaAck(int(ackReplicas), time.Duration(ackTimeout)))
		}
		if mask&optNil != 0 {
			opts = append(opts, nil)
		}

		var field string // the first field that must be refused
		switch {
		case mask&optNil != 0:
			field = "option"
		case !validPart(key, 512, false):
			field = "key"
		case !validPart(wantNS, 128, false):
			field = "namespace"
		case mask&optOwner != 0 && !validPart(wantOwner, 256, true):
			field = "owner"
		case wantTTL < distlock.MinTTL || wantTTL > distlock.MaxTTL:
			field = "ttl"
		case wantMaxWait < 0:
			field = "max wait"
		case wantRetry < 0:
			field = "retry interval"
		case mask&optAck != 0 && (ackReplicas < 0 || ackTimeout < int64(time.Millisecond) ||
			time.Duration(ackTimeout) > wantTTL/3):
			field = "replica ack"
		}

		m, err := distlock.NewMutex(noRedis{}, key, opts...)
		if field != "" {
			require.ErrorIs(t, err, distlock.ErrInvalidOption)
			var oe *distlock.OptionError
			require.ErrorAs(t, err, &oe)
			require.Equal(t, field, oe.Field, "error: %v", err)
			require.Nil(t, m)
			return
		}
		require.NoError(t, err)
		require.Equal(t, wantNS+":{"+key+"}", m.Key())
		if mask&optOwner != 0 {
			require.Equal(t, owner, m.Owner())
		}
		if timeout < 0 || interval < 0 {
			_, err := m.TryLockFor(context.Background(), time.Duration(timeout), time.Duration(interval))
			require.ErrorIs(t, err, distlock.ErrInvalidOption)
		}
	})
}
