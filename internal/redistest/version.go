package redistest

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
)

// Version is what a server says it is, in INFO server.
type Version struct {
	// Name is the server's name: "redis", or "valkey" (Valkey's
	// server_name; Redis gives none).
	Name string
	// Number is the server's own version: Redis's redis_version, Valkey's
	// valkey_version.
	Number string
	// compat is the Redis version whose commands and settings the server
	// has: redis_version, which Valkey keeps at the Redis release it was
	// forked from (7.2.4), so that one threshold per feature serves both.
	compat [3]int
}

// String returns the name and the version, e.g. "redis 6.2.16".
func (v Version) String() string { return v.Name + " " + v.Number }

// Has reports whether a server of this version has f.
func (v Version) Has(f Feature) bool {
	since := features[f].since
	for i := range since {
		if v.compat[i] != since[i] {
			return v.compat[i] > since[i]
		}
	}
	return true
}

// A Feature is something that some of the servers distlock supports lack,
// which a test or a helper depends on.
type Feature int

const (
	// ShardedPubSub is sharded pub/sub: SSUBSCRIBE, SPUBLISH, PUBSUB
	// SHARDCHANNELS and SHARDNUMSUB (Redis 7.0). Without it, distlock's
	// scripts and waiters fall back to plain pub/sub.
	ShardedPubSub Feature = iota
	// ExpireTime is PEXPIRETIME, a key's absolute expiry (Redis 7.0).
	ExpireTime
	// ClusterPort is the cluster-port setting (Redis 7.0). Before it, a
	// node's cluster bus listens on its port + 10000.
	ClusterPort
)

// features names each Feature (for a skip message) and gives the first
// Redis version that has it.
var features = [...]struct {
	name  string
	since [3]int
}{
	ShardedPubSub: {"sharded pub/sub (Redis 7.0)", [3]int{7, 0, 0}},
	ExpireTime:    {"PEXPIRETIME (Redis 7.0)", [3]int{7, 0, 0}},
	ClusterPort:   {"the cluster-port setting (Redis 7.0)", [3]int{7, 0, 0}},
}

// String returns what a skip message calls the feature.
func (f Feature) String() string { return features[f].name }

// parseVersion reads a Version from the fields of INFO server.
func parseVersion(info map[string]string) (Version, error) {
	v := Version{Name: "redis", Number: info["redis_version"]}
	if name := info["server_name"]; name != "" {
		v.Name = name
		if n := info[name+"_version"]; n != "" {
			v.Number = n
		}
	}
	parts := strings.SplitN(info["redis_version"], ".", 3)
	if len(parts) != 3 {
		return Version{}, fmt.Errorf("redistest: INFO server: redis_version %q is not major.minor.patch", info["redis_version"])
	}
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil {
			return Version{}, fmt.Errorf("redistest: INFO server: redis_version %q: %w", info["redis_version"], err)
		}
		v.compat[i] = n
	}
	return v, nil
}

// Version returns what the server says it is. It asks the running server
// (INFO server) the first time and remembers the answer: a restart runs
// the same program. It fails the test if the server cannot say.
func (s *Server) Version() Version {
	s.tb.Helper()
	s.mu.Lock()
	v := s.version
	s.mu.Unlock()
	if v != nil {
		return *v
	}
	info, err := s.Info("server")
	if err != nil {
		s.tb.Fatalf("redistest: INFO server on %s: %v", s.Addr(), err)
	}
	got, err := parseVersion(info)
	if err != nil {
		s.tb.Fatal(err)
	}
	s.mu.Lock()
	s.version = &got
	s.mu.Unlock()
	return got
}

// Has reports whether the server has f.
func (s *Server) Has(f Feature) bool {
	s.tb.Helper()
	return s.Version().Has(f)
}

// SkipUnless skips tb unless the server has f, saying what the test needs
// and what the server is ("needs sharded pub/sub (Redis 7.0): server is
// redis 6.2.16").
func (s *Server) SkipUnless(tb testing.TB, f Feature) {
	tb.Helper()
	if v := s.Version(); !v.Has(f) {
		tb.Skipf("needs %v: server is %v", f, v)
	}
}
