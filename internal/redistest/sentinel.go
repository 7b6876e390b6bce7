package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/redis/rueidis"
)

// sentinelTimeout bounds waiting for sentinels to see their peers and
// replicas, for a replica to sync, and for a failover.
const sentinelTimeout = 30 * time.Second

// StartReplica starts a server that replicates from primary and waits until
// it is in sync (see [Server.WaitInSync]). via is the address the replica
// connects to: primary's own, or a proxy in front of it. extra arguments go
// to the server.
func StartReplica(tb testing.TB, primary *Server, via string, extra ...string) *Server {
	tb.Helper()
	host, port, err := net.SplitHostPort(via)
	if err != nil {
		tb.Fatalf("redistest: primary address %q: %v", via, err)
	}
	s := Start(tb, append([]string{"--replicaof", host, port, "--repl-diskless-sync-delay", "0"}, extra...)...)
	s.WaitInSync(primary)
	return s
}

// WaitInSync waits until the server is a replica whose link to primary is
// up and which acknowledges primary's writes: a write on primary followed
// by WAIT on the same connection counts it. (After a full sync, a primary
// streams new writes to a replica only from the replica's first
// acknowledgement, which can take a second.) It fails the test after a
// while.
func (s *Server) WaitInSync(primary *Server) {
	s.tb.Helper()
	waitFor(s.tb, sentinelTimeout, func() (bool, string) {
		repl, err := s.Info("replication")
		if err != nil {
			return false, err.Error()
		}
		if repl["role"] != "slave" || repl["master_link_status"] != "up" {
			return false, fmt.Sprintf("replica %s: role %s, link %s", s.Addr(), repl["role"], repl["master_link_status"])
		}
		n, err := primary.acks("redistest:replication-probe", 1)
		if err != nil {
			return false, err.Error()
		}
		return n >= 1, fmt.Sprintf("primary %s: %d replicas acknowledge its writes", primary.Addr(), n)
	})
}

// acks writes probe on the server, deletes it, and returns how many
// replicas, up to want, acknowledged that within a moment (WAIT on the same
// connection).
func (s *Server) acks(probe string, want int) (int64, error) {
	c, err := s.adminClient()
	if err != nil {
		return 0, err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	d, release := c.Dedicate()
	defer release()
	res := d.DoMulti(ctx,
		d.B().Set().Key(probe).Value("1").Build(),
		d.B().Del().Key(probe).Build(),
		d.B().Wait().Numreplicas(int64(want)).Timeout(100).Build())
	return res[2].AsInt64()
}

// Sentinels is a group of Redis Sentinels (redis-server --sentinel) that
// watch one primary.
type Sentinels struct {
	tb    testing.TB
	name  string
	nodes []*Server
}

// SentinelConfig is how a group of sentinels watches its primary.
type SentinelConfig struct {
	Name      string        // the master set name, e.g. "mymaster"
	Primary   string        // the primary's "host:port"
	Count     int           // how many sentinels
	Quorum    int           // how many must agree that the primary is down
	DownAfter time.Duration // silence after which a sentinel deems the primary down
}

// StartSentinels starts cfg.Count sentinels watching cfg.Primary and waits
// until each of them knows all the others and replicas replicas. They are
// killed when the test ends.
//
// The failover timeout is long (a minute) so that a sentinel never
// "fixes" a replica that replicates through a proxy within a test: Sentinel
// points a replica whose primary address differs from the one it monitors
// back at the real primary only after that long.
func StartSentinels(tb testing.TB, cfg SentinelConfig, replicas int) *Sentinels {
	tb.Helper()
	host, port, err := net.SplitHostPort(cfg.Primary)
	if err != nil {
		tb.Fatalf("redistest: primary address %q: %v", cfg.Primary, err)
	}
	g := &Sentinels{tb: tb, name: cfg.Name}
	for range cfg.Count {
		dir := tb.TempDir()
		conf := filepath.Join(dir, "sentinel.conf")
		text := fmt.Sprintf("sentinel monitor %[1]s %[2]s %[3]s %[4]d\n"+
			"sentinel down-after-milliseconds %[1]s %[5]d\n"+
			"sentinel failover-timeout %[1]s 60000\n"+
			"sentinel parallel-syncs %[1]s 1\n",
			cfg.Name, host, port, cfg.Quorum, cfg.DownAfter.Milliseconds())
		if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
			tb.Fatalf("redistest: writing %s: %v", conf, err)
		}
		g.nodes = append(g.nodes, startServer(tb, &Server{dir: dir, pre: []string{conf, "--sentinel"}}))
	}
	g.WaitReady(replicas)
	return g
}

// Addrs returns the sentinels' addresses.
func (g *Sentinels) Addrs() []string {
	addrs := make([]string, len(g.nodes))
	for i, n := range g.nodes {
		addrs[i] = n.Addr()
	}
	return addrs
}

// Nodes returns the sentinel processes.
func (g *Sentinels) Nodes() []*Server { return append([]*Server(nil), g.nodes...) }

// ClientOption returns rueidis options for a client of whatever primary the
// sentinels currently name, as an application would build it.
func (g *Sentinels) ClientOption() rueidis.ClientOption {
	return rueidis.ClientOption{
		InitAddress:  g.Addrs(),
		Sentinel:     rueidis.SentinelOption{MasterSet: g.name},
		DisableCache: true,
	}
}

// Client returns a new sentinel-aware client, closed when the test ends.
func (g *Sentinels) Client() rueidis.Client {
	g.tb.Helper()
	return NewClient(g.tb, g.ClientOption())
}

// master returns the fields of SENTINEL MASTER from sentinel n.
func (g *Sentinels) master(n *Server) (map[string]string, error) {
	msg := n.MustDo("SENTINEL", "MASTER", g.name)
	return msg.AsStrMap()
}

// WaitReady waits until every sentinel knows every other one and the given
// number of replicas, and none of them deems the primary down. Without
// that, a failover could not gather a majority.
func (g *Sentinels) WaitReady(replicas int) {
	g.tb.Helper()
	waitFor(g.tb, sentinelTimeout, func() (bool, string) {
		for _, n := range g.nodes {
			m, err := g.master(n)
			if err != nil {
				return false, err.Error()
			}
			if m["flags"] != "master" || m["num-other-sentinels"] != strconv.Itoa(len(g.nodes)-1) || m["num-slaves"] != strconv.Itoa(replicas) {
				return false, fmt.Sprintf("sentinel %s: flags %s, %s other sentinels, %s replicas",
					n.Addr(), m["flags"], m["num-other-sentinels"], m["num-slaves"])
			}
		}
		return true, ""
	})
}

// Primary returns the address of the primary as the first sentinel names
// it.
func (g *Sentinels) Primary() string {
	g.tb.Helper()
	addr, err := g.nodes[0].MustDo("SENTINEL", "GET-MASTER-ADDR-BY-NAME", g.name).AsStrSlice()
	if err != nil || len(addr) != 2 {
		g.tb.Fatalf("redistest: SENTINEL GET-MASTER-ADDR-BY-NAME: %v, %v", addr, err)
	}
	return net.JoinHostPort(addr[0], addr[1])
}

// WaitPrimary waits until every sentinel names s as the primary and s says
// it is one: the failover to s is over.
func (g *Sentinels) WaitPrimary(s *Server) {
	g.tb.Helper()
	waitFor(g.tb, sentinelTimeout, func() (bool, string) {
		for _, n := range g.nodes {
			addr, err := n.MustDo("SENTINEL", "GET-MASTER-ADDR-BY-NAME", g.name).AsStrSlice()
			if err != nil || len(addr) != 2 || net.JoinHostPort(addr[0], addr[1]) != s.Addr() {
				return false, fmt.Sprintf("sentinel %s names %v as the primary", n.Addr(), addr)
			}
		}
		repl, err := s.Info("replication")
		if err != nil {
			return false, err.Error()
		}
		return repl["role"] == "master", fmt.Sprintf("%s has role %s", s.Addr(), repl["role"])
	})
}

// waitFor polls cond until it holds, and fails the test with its last
// reason after timeout.
func waitFor(tb testing.TB, timeout time.Duration, cond func() (bool, string)) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, why := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("redistest: gave up after %v: %s", timeout, why)
		}
		time.Sleep(settlePoll)
	}
}
