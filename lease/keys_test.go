package lease_test

import (
	"fmt"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock/internal/redistest"
	"github.com/distkit-go/distlock/lease"
)

// checkCase is one input to a Check function and whether it must be
// accepted.
type checkCase struct {
	name string
	in   string
	ok   bool
}

// commonCheckCases are inputs that name, namespace and owner treat alike.
// Each limit-dependent case is added per function by lengthCases.
func commonCheckCases() []checkCase {
	return []checkCase{
		{"empty", "", false},
		{"ascii", "orders", true},
		{"single byte", "x", true},
		{"punctuation and symbols", "a:b/c.d-e_f@g+h=i~j$k%l^m&n*o|p<q>r?s!t", true},
		{"hash sign", "a#b", true},
		{"inner space", "payment queue", true},
		{"only a space", " ", true},
		{"leading and trailing space", " x ", true},
		{"unicode letters", "zähler-ключ-鍵", true},
		{"combining mark", "e\u0301", true},
		{"emoji", "lock-🔒", true},
		{"tab", "a\tb", false},
		{"newline", "a\nb", false},
		{"carriage return", "a\rb", false},
		{"NUL", "a\x00b", false},
		{"escape", "\x1b[31mred", false},
		{"DEL", "a\x7fb", false},
		{"C1 control", "a\u0085b", false},
		{"no-break space", "a\u00a0b", false},
		{"line separator", "a\u2028b", false},
		{"zero-width space", "a\u200bb", false},
		{"byte-order mark", "\ufeffa", false},
		{"invalid UTF-8 byte", "a\xffb", false},
		{"truncated UTF-8", "a\xe4", false},
		{"overlong UTF-8", "\xc0\xaf", false},
		{"UTF-16 surrogate", "\xed\xa0\x80", false},
	}
}

// lengthCases checks the byte limit exactly at max and at max+1, with ASCII
// and with multi-byte characters (the limit is in bytes, not runes).
func lengthCases(maxLen int) []checkCase {
	// "ä" is two bytes; pad with one ASCII byte when max is odd.
	umlauts := func(n int) string { return strings.Repeat("ä", n/2) + strings.Repeat("a", n%2) }
	return []checkCase{
		{fmt.Sprintf("%d ASCII bytes", maxLen), strings.Repeat("a", maxLen), true},
		{fmt.Sprintf("%d ASCII bytes", maxLen+1), strings.Repeat("a", maxLen+1), false},
		{fmt.Sprintf("%d bytes of two-byte runes", maxLen), umlauts(maxLen), true},
		{fmt.Sprintf("%d bytes of two-byte runes", maxLen+1), umlauts(maxLen) + "a", false},
		{"far too long", strings.Repeat("a", 10*maxLen), false},
	}
}

func braceCases(ok bool) []checkCase {
	return []checkCase{
		{"open brace", "a{b", ok},
		{"close brace", "a}b", ok},
		{"hash tag", "{tag}", ok},
		{"empty braces", "{}", ok},
	}
}

func runCheckCases(t *testing.T, check func(string) error, cases []checkCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := check(tc.in)
			if tc.ok {
				assert.NoError(t, err, "input %q: got an error, want it accepted", tc.in)
				return
			}
			require.Error(t, err, "input %q: got it accepted, want an error", tc.in)
			assert.ErrorIs(t, err, lease.ErrInvalidName, "input %q: got %v, want it to wrap ErrInvalidName", tc.in, err)
		})
	}
}

func TestCheckName(t *testing.T) {
	cases := append(commonCheckCases(), lengthCases(lease.MaxNameLen)...)
	cases = append(cases, braceCases(false)...)
	runCheckCases(t, lease.CheckName, cases)
}

func TestCheckNamespace(t *testing.T) {
	cases := append(commonCheckCases(), lengthCases(lease.MaxNamespaceLen)...)
	cases = append(cases, braceCases(false)...)
	runCheckCases(t, lease.CheckNamespace, cases)
}

func TestCheckOwner(t *testing.T) {
	cases := append(commonCheckCases(), lengthCases(lease.MaxOwnerLen)...)
	cases = append(cases, braceCases(true)...) // the owner never goes into a key
	runCheckCases(t, lease.CheckOwner, cases)
}

// TestCheckErrorNamesTheProblem checks that the messages say what is wrong,
// since mutex.go shows them to users.
func TestCheckErrorNamesTheProblem(t *testing.T) {
	tests := []struct {
		name  string
		check func(string) error
		in    string
		want  []string
	}{
		{"empty name", lease.CheckName, "", []string{"key", "empty"}},
		{"empty namespace", lease.CheckNamespace, "", []string{"namespace", "empty"}},
		{"empty owner", lease.CheckOwner, "", []string{"owner", "empty"}},
		{"long name", lease.CheckName, strings.Repeat("a", lease.MaxNameLen+1), []string{"513", "512"}},
		{"bad UTF-8", lease.CheckName, "\xff", []string{"UTF-8"}},
		{"tab", lease.CheckName, "ab\tc", []string{"U+0009", "byte 2"}},
		{"brace", lease.CheckNamespace, "n{s", []string{`'{'`, "byte 1", "hash tag"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.check(tt.in)
			require.Error(t, err)
			for _, w := range tt.want {
				assert.Contains(t, err.Error(), w, "got message %q, want it to mention %q", err, w)
			}
		})
	}
}

func TestNewKeysLayout(t *testing.T) {
	tests := []struct {
		ns, name string
		want     lease.Keys
	}{
		{"distlock", "orders", lease.Keys{
			Lease:   "distlock:{orders}",
			Fence:   "distlock:{orders}:fence",
			Queue:   "distlock:{orders}:queue",
			Waiters: "distlock:{orders}:waiters",
			Wake:    "distlock:{orders}:wake",
			Leader:  "distlock:{orders}:leader",
			Limit:   "distlock:{orders}:permits",
		}},
		{"a:b", "c:d", lease.Keys{
			Lease:   "a:b:{c:d}",
			Fence:   "a:b:{c:d}:fence",
			Queue:   "a:b:{c:d}:queue",
			Waiters: "a:b:{c:d}:waiters",
			Wake:    "a:b:{c:d}:wake",
			Leader:  "a:b:{c:d}:leader",
			Limit:   "a:b:{c:d}:permits",
		}},
		{"ns", "zähler 1", lease.Keys{
			Lease:   "ns:{zähler 1}",
			Fence:   "ns:{zähler 1}:fence",
			Queue:   "ns:{zähler 1}:queue",
			Waiters: "ns:{zähler 1}:waiters",
			Wake:    "ns:{zähler 1}:wake",
			Leader:  "ns:{zähler 1}:leader",
			Limit:   "ns:{zähler 1}:permits",
		}},
	}
	for _, tt := range tests {
		t.Run(tt.ns+"/"+tt.name, func(t *testing.T) {
			got, err := lease.NewKeys(tt.ns, tt.name)
			require.NoError(t, err)
			assert.Equal(t, tt.want, got, "got keys %+v, want %+v", got, tt.want)
		})
	}
}

func TestNewKeysRejects(t *testing.T) {
	tests := []struct {
		name     string
		ns, lock string
	}{
		{"empty namespace", "", "x"},
		{"empty name", "ns", ""},
		{"brace in namespace", "n{s", "x"},
		{"closing brace in namespace", "ns}", "x"},
		{"brace in name", "ns", "{x}"},
		{"empty hash tag as name", "ns", "{}"},
		{"newline in name", "ns", "x\n"},
		{"control char in namespace", "n\x00s", "x"},
		{"invalid UTF-8 name", "ns", "\xc3"},
		{"namespace too long", strings.Repeat("n", lease.MaxNamespaceLen+1), "x"},
		{"name too long", "ns", strings.Repeat("x", lease.MaxNameLen+1)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := lease.NewKeys(tt.ns, tt.lock)
			require.Error(t, err, "NewKeys(%q, %q): got keys %+v, want an error", tt.ns, tt.lock, got)
			assert.ErrorIs(t, err, lease.ErrInvalidName)
			assert.Equal(t, lease.Keys{}, got, "got keys %+v with the error, want the zero Keys", got)
		})
	}
}

// TestNewKeysAtLimits checks that the longest namespace and name are
// accepted together.
func TestNewKeysAtLimits(t *testing.T) {
	ns, name := strings.Repeat("n", lease.MaxNamespaceLen), strings.Repeat("x", lease.MaxNameLen)
	k, err := lease.NewKeys(ns, name)
	require.NoError(t, err)
	assert.Equal(t, name, hashTag(k.Lease))
}

// crc16 is CRC16-XMODEM (polynomial 0x1021, initial value 0), the checksum
// Redis Cluster uses to place keys in slots.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}

// hashTag returns the part of key that Redis Cluster hashes: the text between
// the first '{' and the next '}' if that is not empty, else the whole key.
func hashTag(key string) string {
	if open := strings.IndexByte(key, '{'); open >= 0 {
		if n := strings.IndexByte(key[open+1:], '}'); n > 0 {
			return key[open+1 : open+1+n]
		}
	}
	return key
}

// keySlot returns key's Redis Cluster hash slot.
func keySlot(key string) int { return int(crc16(hashTag(key)) % 16384) }

// TestKeySlotReference checks the test's own keySlot against the examples
// of the Redis Cluster specification and against a cluster-enabled
// redis-server (CLUSTER KEYSLOT needs no slots assigned), so that the slot
// tests below can be trusted.
func TestKeySlotReference(t *testing.T) {
	assert.Equal(t, uint16(0x31C3), crc16("123456789"), "CRC16-XMODEM check value")
	tests := []struct {
		key string
		tag string
	}{
		{"foo", "foo"},
		{"123456789", "123456789"},
		{"{user1000}.following", "user1000"},
		{"{user1000}.followers", "user1000"},
		{"foo{}{bar}", "foo{}{bar}"}, // an empty tag hashes the whole key
		{"foo{{bar}}zap", "{bar"},
		{"foo{bar}{zap}", "bar"},
		{"{}", "{}"},
		{"}{x}", "x"},
		{"x{", "x{"},
		{"ns:{zähler}", "zähler"},
	}
	srv := startCluster(t)
	for _, tt := range tests {
		assert.Equal(t, tt.tag, hashTag(tt.key), "hash tag of %q", tt.key)
		got, want := keySlot(tt.key), clusterSlot(t, srv, tt.key)
		assert.Equal(t, want, got, "slot of %q: got %d, want %d from CLUSTER KEYSLOT", tt.key, got, want)
	}
	assert.Equal(t, 12182, keySlot("foo"), "slot of foo from the specification")
	assert.Equal(t, 5061, keySlot("bar"), "slot of bar from the specification")
}

// startCluster starts a redis-server with cluster support, for CLUSTER
// KEYSLOT.
func startCluster(t *testing.T) *redistest.Server {
	t.Helper()
	return redistest.Start(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")
}

// clusterSlot returns Redis's own hash slot for key.
func clusterSlot(t *testing.T, srv *redistest.Server, key string) int {
	t.Helper()
	n, err := srv.MustDo("CLUSTER", "KEYSLOT", key).AsInt64()
	require.NoError(t, err)
	return int(n)
}

// trickyNames are namespace/name pairs that a careless key layout would
// confuse with each other.
var trickyNames = [][2]string{
	{"a:b", "c"},
	{"a", "b:c"},
	{"a", "b"},
	{"a:", "b"},
	{"a", ":b"},
	{"a", "b:fence"},
	{"a", "b:released"},
	{"a", "fence"},
	{"a:b:fence", "x"},
	{"distlock", "orders"},
	{"distlock", "orders:fence"},
	{"distlock:orders", "fence"},
	{"ns", " "},
	{"ns", "  "},
	{"ns", "x "},
	{"ns ", "x"},
	{"ns", "ä"},
	{"ns", "a\u0308"}, // the same glyph as "ä", decomposed: different bytes, a different lock
}

func TestNewKeysShareOneSlot(t *testing.T) {
	for _, p := range trickyNames {
		k, err := lease.NewKeys(p[0], p[1])
		require.NoError(t, err, "NewKeys(%q, %q)", p[0], p[1])
		for _, key := range []string{k.Lease, k.Fence, k.Queue, k.Waiters, k.WakeChannel("r")} {
			assert.Equal(t, p[1], hashTag(key), "hash tag of %q: want the lock name", key)
			assert.Equal(t, keySlot(k.Lease), keySlot(key), "slot of %q differs from the lease key %q", key, k.Lease)
		}
	}
}

// TestNewKeysSlotMatchesRedisCluster asks Redis itself for the slots of
// each lock's keys, so the hash tag rule is Redis's and not only the test's
// reading of it.
func TestNewKeysSlotMatchesRedisCluster(t *testing.T) {
	srv := startCluster(t)
	for _, p := range trickyNames {
		k, err := lease.NewKeys(p[0], p[1])
		require.NoError(t, err)
		want := clusterSlot(t, srv, k.Lease)
		for _, key := range []string{k.Fence, k.Queue, k.Waiters, k.WakeChannel("r")} {
			got := clusterSlot(t, srv, key)
			assert.Equal(t, want, got, "CLUSTER KEYSLOT %q: got %d, want %d (the slot of %q)", key, got, want, k.Lease)
		}
	}
}

func TestNewKeysDistinct(t *testing.T) {
	owner := map[string][2]string{} // every key and channel name -> the pair that produced it
	for _, p := range trickyNames {
		k, err := lease.NewKeys(p[0], p[1])
		require.NoError(t, err)
		for _, key := range []string{k.Lease, k.Fence, k.Queue, k.Waiters, k.WakeChannel("r")} {
			if prev, dup := owner[key]; dup {
				t.Errorf("key %q is produced by both %q and %q", key, prev, p)
			}
			owner[key] = p
		}
	}
}

// checkKeys checks the properties every accepted (ns, name) must have.
func checkKeys(t *testing.T, ns, name string, k lease.Keys) {
	t.Helper()
	require.NoError(t, lease.CheckNamespace(ns), "NewKeys accepted namespace %q that CheckNamespace refuses", ns)
	require.NoError(t, lease.CheckName(name), "NewKeys accepted name %q that CheckName refuses", name)
	wantLease := ns + ":{" + name + "}"
	require.Equal(t, wantLease, k.Lease)
	require.Equal(t, wantLease+":fence", k.Fence)
	require.Equal(t, wantLease+":queue", k.Queue)
	require.Equal(t, wantLease+":waiters", k.Waiters)
	require.Equal(t, wantLease+":wake:r", k.WakeChannel("r"))
	for _, key := range []string{k.Lease, k.Fence, k.Queue, k.Waiters, k.WakeChannel("r")} {
		require.True(t, utf8.ValidString(key), "key %q is not valid UTF-8", key)
		require.Equal(t, name, hashTag(key), "hash tag of %q: want the name %q", key, name)
		require.Equal(t, keySlot(k.Lease), keySlot(key))
		if i := strings.IndexFunc(key, unicode.IsControl); i >= 0 {
			t.Fatalf("key %q has a control character at byte %d", key, i)
		}
	}
	// The layout is reversible, so no two (ns, name) pairs share a key: the
	// first '{' ends the namespace since neither part may contain braces.
	open := strings.IndexByte(k.Lease, '{')
	require.Equal(t, ns, k.Lease[:open-1], "namespace parsed back from %q", k.Lease)
	require.Equal(t, name, k.Lease[open+1:len(k.Lease)-1], "name parsed back from %q", k.Lease)
}

func FuzzNewKeys(f *testing.F) {
	for _, p := range trickyNames {
		f.Add(p[0], p[1])
	}
	f.Add("distlock", "{tag}")
	f.Add("distlock", "a}b{")
	f.Add("", "x")
	f.Add("ns", "")
	f.Add("ns", "a\tb")
	f.Add("ns", "a\xffb")
	f.Add(strings.Repeat("n", lease.MaxNamespaceLen), strings.Repeat("x", lease.MaxNameLen))
	f.Fuzz(func(t *testing.T, ns, name string) {
		k, err := lease.NewKeys(ns, name)
		if err != nil {
			require.ErrorIs(t, err, lease.ErrInvalidName)
			require.Equal(t, lease.Keys{}, k, "got keys with an error")
			require.True(t, lease.CheckNamespace(ns) != nil || lease.CheckName(name) != nil,
				"NewKeys(%q, %q) refused (%v) what both Check functions accept", ns, name, err)
			return
		}
		checkKeys(t, ns, name, k)
	})
}

func TestNewValueOwner(t *testing.T) {
	owners := []string{"worker-1", "host:1234", "a#b", "#", "trailing#", "{braces}", "zähler", " "}
	seen := map[string]bool{}
	for _, o := range owners {
		for range 3 {
			v := lease.NewValue(o)
			assert.True(t, strings.HasPrefix(v, o+"#"), "NewValue(%q) = %q, want the prefix %q", o, v, o+"#")
			assert.False(t, seen[v], "NewValue(%q) returned %q twice", o, v)
			seen[v] = true
			assert.Equal(t, o, lease.Owner(v), "Owner(NewValue(%q)) with value %q", o, v)
		}
	}
}

func TestOwnerOfForeignValue(t *testing.T) {
	for _, v := range []string{
		"",
		"plain",
		"a#b",
		"a#",
		"#",
		"worker#1",
		"worker#6ba7b810-9dad-11d1-80b4-00c04fd430c8x", // one character too many
		"worker#6ba7b810-9dad-11d1-80b4",               // too short
	} {
		assert.Equal(t, v, lease.Owner(v), "Owner(%q): want the whole value back", v)
	}
}

func FuzzOwner(f *testing.F) {
	for _, s := range []string{"worker-1", "a#b", "#", "", "x#6ba7b810-9dad-11d1-80b4-00c04fd430c8", "\xff", "{o}"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, o string) {
		// Owner must not panic on any stored value, and returns a prefix of it.
		if got := lease.Owner(o); !strings.HasPrefix(o, got) {
			t.Fatalf("Owner(%q) = %q, not a prefix of the value", o, got)
		}
		if lease.CheckOwner(o) != nil {
			return
		}
		v := lease.NewValue(o)
		if got := lease.Owner(v); got != o {
			t.Fatalf("Owner(NewValue(%q)) = %q (value %q), want %q", o, got, v, o)
		}
		// The value adds only printable ASCII: it passes the owner rules
		// whenever it fits their length limit.
		if len(v) <= lease.MaxOwnerLen {
			if err := lease.CheckOwner(v); err != nil {
				t.Fatalf("NewValue(%q) = %q: %v", o, v, err)
			}
		}
	})
}
