package distlock_test

import (
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock"
	"github.com/distkit-go/distlock/internal/redistest"
)

// The Mutex's tests against redis-server are client-independent and live in
// internal/suite (TestSuiteMutex, TestSuiteFaults); here is the validation
// of NewMutex's input and of the zero values, the same code for every
// client.

func TestInvalidInput(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	cases := []struct {
		name  string
		c     rueidis.Client
		key   string
		opts  []distlock.Option
		field string
	}{
		{"nil client", nil, "k", nil, "client"},
		{"empty key", c, "", nil, "key"},
		{"brace in key", c, "a{b", nil, "key"},
		{"closing brace", c, "a}b", nil, "key"},
		{"newline in key", c, "a\nb", nil, "key"},
		{"invalid utf8", c, "a\xffb", nil, "key"},
		{"long key", c, strings.Repeat("k", 513), nil, "key"},
		{"empty namespace", c, "k", []distlock.Option{distlock.WithNamespace("")}, "namespace"},
		{"brace in namespace", c, "k", []distlock.Option{distlock.WithNamespace("{ns}")}, "namespace"},
		{"empty owner", c, "k", []distlock.Option{distlock.WithOwner("")}, "owner"},
		{"control char owner", c, "k", []distlock.Option{distlock.WithOwner("a\x00")}, "owner"},
		{"zero ttl", c, "k", []distlock.Option{distlock.WithTTL(0)}, "ttl"},
		{"negative ttl", c, "k", []distlock.Option{distlock.WithTTL(-time.Second)}, "ttl"},
		{"ttl too small", c, "k", []distlock.Option{distlock.WithTTL(distlock.MinTTL - time.Millisecond)}, "ttl"},
		{"ttl too large", c, "k", []distlock.Option{distlock.WithTTL(distlock.MaxTTL + time.Second)}, "ttl"},
		{"negative max wait", c, "k", []distlock.Option{distlock.WithMaxWait(-1)}, "max wait"},
		{"negative retry", c, "k", []distlock.Option{distlock.WithRetryInterval(-1)}, "retry interval"},
		{"nil logger", c, "k", []distlock.Option{distlock.WithLogger(nil)}, "logger"},
		{"nil option", c, "k", []distlock.Option{nil}, "option"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m, err := distlock.NewMutex(tc.c, tc.key, tc.opts...)
			require.ErrorIs(t, err, distlock.ErrInvalidOption)
			assert.Nil(t, m)
			var oe *distlock.OptionError
			require.ErrorAs(t, err, &oe)
			assert.Equal(t, tc.field, oe.Field)
			assert.Contains(t, err.Error(), tc.field)
		})
	}

	m := newMutex(t, c, "k")
	t.Run("negative TryLockFor timeout", func(t *testing.T) {
		_, err := m.TryLockFor(t.Context(), -time.Second, 0)
		require.ErrorIs(t, err, distlock.ErrInvalidOption)
	})
	t.Run("negative TryLockFor interval", func(t *testing.T) {
		_, err := m.TryLockFor(t.Context(), time.Second, -1)
		require.ErrorIs(t, err, distlock.ErrInvalidOption)
	})
	t.Run("nil context", func(t *testing.T) {
		//lint:ignore SA1012 testing the nil check
		_, err := m.Lock(nil)
		require.ErrorIs(t, err, distlock.ErrInvalidOption)
	})

	t.Run("zero values", func(t *testing.T) {
		// Not made by their constructors: an error (or, for Observe, a
		// panic) in the caller's goroutine, never a crash elsewhere.
		var zm distlock.Mutex
		var zs distlock.Semaphore
		var ze distlock.Election
		calls := map[string]func() error{
			"Mutex.Lock":              func() error { _, err := zm.Lock(t.Context()); return err },
			"Mutex.TryLock":           func() error { _, err := zm.TryLock(t.Context()); return err },
			"Mutex.TryLockFor":        func() error { _, err := zm.TryLockFor(t.Context(), time.Second, 0); return err },
			"Semaphore.Acquire":       func() error { _, err := zs.Acquire(t.Context()); return err },
			"Semaphore.TryAcquire":    func() error { _, err := zs.TryAcquire(t.Context()); return err },
			"Semaphore.TryAcquireFor": func() error { _, err := zs.TryAcquireFor(t.Context(), time.Second, 0); return err },
			"Election.Campaign":       func() error { _, err := ze.Campaign(t.Context(), "me"); return err },
			"Election.Leader":         func() error { _, err := ze.Leader(t.Context()); return err },
		}
		for name, call := range calls {
			err := call()
			require.ErrorIs(t, err, distlock.ErrInvalidOption, name)
			assert.Contains(t, err.Error(), "zero", name)
		}
		assert.Panics(t, func() { ze.Observe(t.Context()) }, "Election.Observe")
	})

	// None of that reached Redis: no script ran and no key exists.
	info, err := srv.MustDo("INFO", "commandstats").ToString()
	require.NoError(t, err)
	assert.NotContains(t, info, "cmdstat_eval", "a script ran for bad input")
	n, err := srv.MustDo("DBSIZE").ToInt64()
	require.NoError(t, err)
	assert.Zero(t, n)
}
