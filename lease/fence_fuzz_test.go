package lease_test

import (
	"math/big"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock/internal/redistest"
	"github.com/distkit-go/distlock/lease"
)

// FuzzFenceKey stores arbitrary bytes in a lock's fencing key and acquires
// the lock, against a real redis-server. The acquire script parses the
// fencing key itself; it must accept exactly the digit strings below 2^53-1
// it could have written, and issue a larger token, and for anything else
// fail with a clear error and write nothing.
func FuzzFenceKey(f *testing.F) {
	for _, s := range []string{"", "0", "1", "007", "123456789", "9007199254740990", "9007199254740991",
		"9007199254740992", "99999999999999999999999", "-1", "+1", " 1", "1 ", "1.5", "1e3", "0x10", "nan", "inf",
		"１２", "12\x00", "\xff"} {
		f.Add(s)
	}
	rc := redistest.Start(f).Client()
	lc := lease.New(rc)
	k, err := lease.NewKeys("fuzz", "fence")
	require.NoError(f, err)
	maxToken := big.NewInt(1<<53 - 1)
	// get returns a key's value; the fuzz function must not call f's
	// methods, so it does not use env.
	get := func(t *testing.T, key string) (string, bool) {
		s, err := rc.Do(ctxFor(t), rc.B().Get().Key(key).Build()).ToString()
		if rueidis.IsRedisNil(err) {
			return "", false
		}
		require.NoError(t, err)
		return s, true
	}
	f.Fuzz(func(t *testing.T, raw string) {
		require.NoError(t, rc.Do(ctxFor(t), rc.B().Del().Key(k.Lease, k.Fence).Build()).Error())
		require.NoError(t, rc.Do(ctxFor(t), rc.B().Set().Key(k.Fence).Value(raw).Build()).Error())
		value := lease.NewValue("fuzz")
		g, err := lc.Acquire(ctxFor(t), k, value, ttl)

		digits := raw != "" && strings.Trim(raw, "0123456789") == ""
		last, _ := new(big.Int).SetString(raw, 10)
		switch {
		case !digits:
			require.ErrorContains(t, err, "does not hold an integer", "fencing key %q", raw)
		case last.Cmp(maxToken) >= 0:
			require.ErrorContains(t, err, "is exhausted", "fencing key %q", raw)
		default:
			require.NoError(t, err, "fencing key %q", raw)
			require.True(t, g.Acquired)
			require.Positive(t, big.NewInt(g.Token).Cmp(last), "token %d after fencing key %q", g.Token, raw)
			require.LessOrEqual(t, g.Token, maxToken.Int64())
			fence, _ := get(t, k.Fence)
			require.Equal(t, strconv.FormatInt(g.Token, 10), fence)
			got, ok := get(t, k.Lease)
			require.True(t, ok)
			require.Equal(t, value, got)
			return
		}
		require.False(t, g.Acquired)
		_, ok := get(t, k.Lease)
		require.False(t, ok, "a refused acquire wrote the lease")
		fence, _ := get(t, k.Fence)
		require.Equal(t, raw, fence, "a refused acquire changed the fencing key")
	})
}
