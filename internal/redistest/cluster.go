package redistest

import (
	"context"
	"fmt"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/distkit-go/distlock/internal/redisbin"
)

// clusterTimeout bounds building a cluster and waiting for it to settle
// after a change.
const clusterTimeout = 30 * time.Second

// settlePoll is how often the cluster helpers look at the cluster's state.
const settlePoll = 20 * time.Millisecond

// Cluster is a Redis Cluster of private redis-server processes, built with
// redis-cli --cluster create. Its nodes are killed when the test ends.
type Cluster struct {
	tb    testing.TB
	nodes []*Server
}

// StartCluster starts primaries*(1+replicas) cluster-enabled servers, joins
// them with redis-cli --cluster create (each primary gets replicas
// replicas) and waits until every node agrees on the layout, the cluster
// state is ok and every replica is in sync with its primary.
//
// Each node has its own free port and cluster bus port. A server with the
// cluster-port setting (Redis 7.0 and later) is given any free port for its
// bus, so nothing depends on port+10000 being free; one without it (Redis
// 6.2) gets a port whose port+10000, where it puts its bus, is free too.
// The program that builds the cluster is the redis-cli (or valkey-cli)
// beside the server, else the one on PATH (see internal/redisbin). Replicas
// start their initial sync at once (repl-diskless-sync-delay 0). extra
// arguments go to every node.
func StartCluster(tb testing.TB, primaries, replicas int, extra ...string) *Cluster {
	tb.Helper()
	cli, err := redisbin.CLI()
	if err != nil {
		tb.Fatalf("redistest: %v; redis-cli comes with redis-server (e.g. the redis-tools package)", err)
	}
	c := &Cluster{tb: tb}
	args := append([]string{
		"--cluster-enabled", "yes",
		"--cluster-config-file", "nodes.conf",
		"--cluster-node-timeout", "5000",
		"--repl-diskless-sync-delay", "0",
	}, extra...)
	// Whether the nodes know cluster-port, asked of a server of their
	// program that is not a node.
	probe := Start(tb)
	b := busOffset
	if probe.Has(ClusterPort) {
		b = busFlag
	}
	probe.Kill()
	for range primaries * (1 + replicas) {
		c.nodes = append(c.nodes, startServer(tb, &Server{bus: b, args: args}))
	}
	ctx, cancel := context.WithTimeout(context.Background(), clusterTimeout)
	defer cancel()
	create := append([]string{"--cluster", "create"}, c.Addrs()...)
	create = append(create, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	if out, err := exec.CommandContext(ctx, cli, create...).CombinedOutput(); err != nil {
		tb.Fatalf("redistest: redis-cli --cluster create: %v\n%s", err, out)
	}
	c.WaitSettled(primaries)
	return c
}

// Nodes returns every node, primaries and replicas, in start order.
func (c *Cluster) Nodes() []*Server { return slices.Clone(c.nodes) }

// Addrs returns the addresses of every node.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		addrs[i] = n.Addr()
	}
	return addrs
}

// ClientOption returns rueidis options for a cluster client (every node as
// a seed, client-side caching off).
func (c *Cluster) ClientOption() rueidis.ClientOption {
	return rueidis.ClientOption{InitAddress: c.Addrs(), DisableCache: true}
}

// Client returns a new cluster client, closed when the test ends.
func (c *Cluster) Client() rueidis.Client {
	c.tb.Helper()
	return NewClient(c.tb, c.ClientOption())
}

// Node is one line of CLUSTER NODES.
type Node struct {
	ID      string
	Addr    string // host:port
	Primary bool
	Of      string   // the primary's ID, for a replica
	Slots   [][2]int // slot ranges served, for a primary
	Failing bool     // flagged fail or fail?
}

// Layout returns the cluster as node n sees it.
func (c *Cluster) Layout(n *Server) ([]Node, error) {
	text, err := n.text("CLUSTER", "NODES")
	if err != nil {
		return nil, err
	}
	return parseNodes(text)
}

// parseNodes parses the reply of CLUSTER NODES.
func parseNodes(text string) ([]Node, error) {
	var nodes []Node
	for line := range strings.Lines(text) {
		f := strings.Fields(line)
		if len(f) < 8 {
			continue
		}
		addr, _, _ := strings.Cut(f[1], "@")
		flags := strings.Split(f[2], ",")
		n := Node{
			ID:      f[0],
			Addr:    addr,
			Primary: slices.Contains(flags, "master"),
			Failing: slices.Contains(flags, "fail") || slices.Contains(flags, "fail?"),
		}
		if !n.Primary && f[3] != "-" {
			n.Of = f[3]
		}
		for _, r := range f[8:] {
			if strings.HasPrefix(r, "[") {
				continue // a slot being migrated or imported
			}
			lo, hi, isRange := strings.Cut(r, "-")
			a, err := strconv.Atoi(lo)
			if err != nil {
				return nil, fmt.Errorf("slot range %q: %w", r, err)
			}
			b := a
			if isRange {
				if b, err = strconv.Atoi(hi); err != nil {
					return nil, fmt.Errorf("slot range %q: %w", r, err)
				}
			}
			n.Slots = append(n.Slots, [2]int{a, b})
		}
		nodes = append(nodes, n)
	}
	slices.SortFunc(nodes, func(a, b Node) int { return strings.Compare(a.Addr, b.Addr) })
	return nodes, nil
}

// settled reports whether the cluster is in a steady state with the given
// number of primaries, and if not, why.
func (c *Cluster) settled(primaries int) (bool, string) {
	var first []Node
	for i, n := range c.nodes {
		info, err := n.fields("CLUSTER", "INFO")
		if err != nil {
			return false, err.Error()
		}
		if info["cluster_state"] != "ok" {
			return false, fmt.Sprintf("%s: cluster_state %s", n.Addr(), info["cluster_state"])
		}
		nodes, err := c.Layout(n)
		if err != nil {
			return false, err.Error()
		}
		if len(nodes) != len(c.nodes) {
			return false, fmt.Sprintf("%s knows %d nodes, not %d", n.Addr(), len(nodes), len(c.nodes))
		}
		var p int
		for _, x := range nodes {
			if x.Failing {
				return false, fmt.Sprintf("%s sees %s failing", n.Addr(), x.Addr)
			}
			if x.Primary && len(x.Slots) > 0 {
				p++
			}
		}
		if p != primaries {
			return false, fmt.Sprintf("%s sees %d primaries with slots, not %d", n.Addr(), p, primaries)
		}
		for j := range nodes {
			nodes[j].Failing = false
		}
		if i == 0 {
			first = nodes
		} else if !slices.EqualFunc(first, nodes, func(a, b Node) bool {
			return a.ID == b.ID && a.Addr == b.Addr && a.Primary == b.Primary && a.Of == b.Of && slices.Equal(a.Slots, b.Slots)
		}) {
			return false, fmt.Sprintf("%s and %s disagree on the layout", c.nodes[0].Addr(), n.Addr())
		}
		repl, err := n.Info("replication")
		if err != nil {
			return false, err.Error()
		}
		if repl["role"] == "slave" && repl["master_link_status"] != "up" {
			return false, fmt.Sprintf("replica %s is not in sync", n.Addr())
		}
	}
	// Every replica acknowledges its primary's writes (WAIT counts it).
	for _, p := range first {
		if !p.Primary || len(p.Slots) == 0 {
			continue
		}
		want := 0
		for _, r := range first {
			if r.Of == p.ID {
				want++
			}
		}
		if want == 0 {
			continue
		}
		got, err := c.server(p.Addr).acks(keyInSlot(p.Slots[0][0]), want)
		if err != nil {
			return false, err.Error()
		}
		if got < int64(want) {
			return false, fmt.Sprintf("%d of %d replicas of %s acknowledge its writes", got, want, p.Addr)
		}
	}
	return true, ""
}

// keyInSlot returns a key that hashes to slot.
func keyInSlot(slot int) string {
	for i := 0; ; i++ {
		k := "redistest:probe:" + strconv.Itoa(i)
		if int(crc16(k)%16384) == slot {
			return k
		}
	}
}

// crc16 is the CRC16 (XMODEM) that Redis Cluster hashes keys with.
func crc16(s string) uint16 {
	var crc uint16
	for i := range len(s) {
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

// WaitSettled waits until every node reports cluster state ok, all nodes
// agree on the layout, there are the given number of primaries serving
// slots, nobody is flagged as failing, and every replica's link to its
// primary is up. It fails the test after a while.
func (c *Cluster) WaitSettled(primaries int) {
	c.tb.Helper()
	waitFor(c.tb, clusterTimeout, func() (bool, string) { return c.settled(primaries) })
}

// Slot returns the hash slot of key, as the cluster computes it.
func (c *Cluster) Slot(key string) int {
	c.tb.Helper()
	n, err := c.nodes[0].MustDo("CLUSTER", "KEYSLOT", key).AsInt64()
	if err != nil {
		c.tb.Fatalf("redistest: CLUSTER KEYSLOT %s: %v", key, err)
	}
	return int(n)
}

// server returns the node at addr.
func (c *Cluster) server(addr string) *Server {
	for _, n := range c.nodes {
		if n.Addr() == addr {
			return n
		}
	}
	c.tb.Fatalf("redistest: no node at %s", addr)
	return nil
}

// PrimaryOf returns the primary that serves key's slot, as the first node
// sees the cluster.
func (c *Cluster) PrimaryOf(key string) *Server {
	c.tb.Helper()
	return c.ownerOf(c.Slot(key))
}

// ownerOf returns the primary that serves slot, as the first node sees the
// cluster.
func (c *Cluster) ownerOf(slot int) *Server {
	c.tb.Helper()
	nodes, err := c.Layout(c.nodes[0])
	if err != nil {
		c.tb.Fatalf("redistest: CLUSTER NODES: %v", err)
	}
	for _, n := range nodes {
		for _, r := range n.Slots {
			if n.Primary && r[0] <= slot && slot <= r[1] {
				return c.server(n.Addr)
			}
		}
	}
	c.tb.Fatalf("redistest: nobody serves slot %d", slot)
	return nil
}

// Primaries returns the nodes that serve slots, as the first node sees the
// cluster.
func (c *Cluster) Primaries() []*Server {
	c.tb.Helper()
	nodes, err := c.Layout(c.nodes[0])
	if err != nil {
		c.tb.Fatalf("redistest: CLUSTER NODES: %v", err)
	}
	var ps []*Server
	for _, n := range nodes {
		if n.Primary && len(n.Slots) > 0 {
			ps = append(ps, c.server(n.Addr))
		}
	}
	return ps
}

// ReplicasOf returns the replicas of primary, as the first node sees the
// cluster.
func (c *Cluster) ReplicasOf(primary *Server) []*Server {
	c.tb.Helper()
	nodes, err := c.Layout(c.nodes[0])
	if err != nil {
		c.tb.Fatalf("redistest: CLUSTER NODES: %v", err)
	}
	var id string
	for _, n := range nodes {
		if n.Addr == primary.Addr() {
			id = n.ID
		}
	}
	var rs []*Server
	for _, n := range nodes {
		if id != "" && n.Of == id {
			rs = append(rs, c.server(n.Addr))
		}
	}
	return rs
}

// Failover runs CLUSTER FAILOVER on replica (a manual failover: its primary
// stops taking writes, the replica catches up and takes over its slots, and
// the old primary becomes its replica) and waits until the cluster has
// settled with replica serving the slots.
func (c *Cluster) Failover(replica *Server) {
	c.tb.Helper()
	primaries := len(c.Primaries())
	if got, err := replica.MustDo("CLUSTER", "FAILOVER").ToString(); err != nil || got != "OK" {
		c.tb.Fatalf("redistest: CLUSTER FAILOVER on %s: %q, %v", replica.Addr(), got, err)
	}
	waitFor(c.tb, clusterTimeout, func() (bool, string) {
		repl, err := replica.Info("replication")
		if err != nil {
			return false, err.Error()
		}
		return repl["role"] == "master", fmt.Sprintf("%s has role %s", replica.Addr(), repl["role"])
	})
	c.WaitSettled(primaries)
}

// Info returns the fields of INFO section from the server.
func (s *Server) Info(section string) (map[string]string, error) {
	return s.fields("INFO", section)
}

// text runs cmd, whose reply is text (INFO, CLUSTER INFO, CLUSTER NODES),
// and returns it.
func (s *Server) text(cmd ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	msg, err := s.Do(ctx, cmd...)
	if err != nil {
		return "", err
	}
	text, err := msg.ToString()
	// RESP3 sends these replies as verbatim strings, which rueidis returns
	// with their format prefix.
	return strings.TrimPrefix(text, "txt:"), err
}

// fields runs cmd, whose reply is lines of "field:value" (INFO, CLUSTER
// INFO), and returns the fields.
func (s *Server) fields(cmd ...string) (map[string]string, error) {
	text, err := s.text(cmd...)
	if err != nil {
		return nil, err
	}
	fields := make(map[string]string)
	for line := range strings.Lines(text) {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok && !strings.HasPrefix(k, "#") {
			fields[k] = v
		}
	}
	return fields, nil
}

// ID returns the cluster node ID of n.
func (c *Cluster) ID(n *Server) string {
	c.tb.Helper()
	id, err := n.MustDo("CLUSTER", "MYID").ToString()
	if err != nil {
		c.tb.Fatalf("redistest: CLUSTER MYID on %s: %v", n.Addr(), err)
	}
	return id
}

// Migration is a slot on its way from one primary to another, moved the way
// redis-cli --cluster reshard moves it: the target imports the slot, the
// source marks it migrating, keys are moved with MIGRATE, and finally every
// primary is told the target owns the slot. Until then the source answers
// ASK for a key it no longer has, and TRYAGAIN for a command on several
// keys of which only some are left.
type Migration struct {
	c        *Cluster
	slot     int
	from, to *Server
}

// StartMigration starts moving slot from its primary to the primary to.
func (c *Cluster) StartMigration(slot int, to *Server) *Migration {
	c.tb.Helper()
	m := &Migration{c: c, slot: slot, from: c.ownerOf(slot), to: to}
	s := strconv.Itoa(slot)
	if m.from == to {
		c.tb.Fatalf("redistest: slot %d is already on %s", slot, to.Addr())
	}
	to.MustDo("CLUSTER", "SETSLOT", s, "IMPORTING", c.ID(m.from))
	m.from.MustDo("CLUSTER", "SETSLOT", s, "MIGRATING", c.ID(to))
	return m
}

// From returns the primary the slot is leaving.
func (m *Migration) From() *Server { return m.from }

// To returns the primary the slot is moving to.
func (m *Migration) To() *Server { return m.to }

// Move moves keys, all in the slot, from the source to the target in one
// MIGRATE.
func (m *Migration) Move(keys ...string) {
	m.c.tb.Helper()
	args := append([]string{"MIGRATE", "127.0.0.1", strconv.Itoa(m.to.Port()), "", "0", "5000", "KEYS"}, keys...)
	if got, err := m.from.MustDo(args...).ToString(); err != nil || got != "OK" {
		m.c.tb.Fatalf("redistest: MIGRATE %v: %q, %v", keys, got, err)
	}
}

// Finish assigns the slot to the target on every primary, target first and
// source next, and waits until the cluster has settled.
func (m *Migration) Finish() {
	m.c.tb.Helper()
	s, id := strconv.Itoa(m.slot), m.c.ID(m.to)
	primaries := m.c.Primaries()
	m.to.MustDo("CLUSTER", "SETSLOT", s, "NODE", id)
	m.from.MustDo("CLUSTER", "SETSLOT", s, "NODE", id)
	for _, p := range primaries {
		if p != m.to && p != m.from {
			p.MustDo("CLUSTER", "SETSLOT", s, "NODE", id)
		}
	}
	m.c.WaitSettled(len(primaries))
}
