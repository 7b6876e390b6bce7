package main

// The set scenarios' "across slots" rows (multi.go) run on a private Redis
// Cluster of three primaries, no replicas: internal/redistest's Cluster
// without a testing.TB, as server.go is its server. The nodes are
// server.go's servers with cluster-enabled, joined by redis-cli --cluster
// create (internal/redisbin finds it beside the server, else on PATH).

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/distkit-go/distlock/internal/redisbin"
	"github.com/distkit-go/distlock/lease"
)

// Sizes and bounds of the cluster.
const (
	clusterPrimaries = 3
	// clusterTimeout bounds building the cluster and its settling.
	clusterTimeout = 30 * time.Second
)

// cluster is a private Redis Cluster: clusterPrimaries nodes, each
// serving a range of slots, with an admin client per node (INFO cpu,
// INFO commandstats).
type cluster struct {
	nodes  []*server
	admins []rueidis.Client // one per node, in the order of nodes
	// ranges[i] are the slot ranges node i serves.
	ranges [][][2]int
}

// startCluster starts the nodes, joins them and waits until every node
// says the cluster is ok with every slot served. On an error it stops
// what it started.
func startCluster() (c *cluster, err error) {
	cli, err := redisbin.CLI()
	if err != nil {
		return nil, fmt.Errorf("%w (redis-cli comes with redis-server, e.g. the redis-tools package)", err)
	}
	c = &cluster{}
	defer func() {
		if err != nil {
			c.stop()
		}
	}()
	for range clusterPrimaries {
		s, err := startServerOf(true)
		if err != nil {
			return nil, fmt.Errorf("a cluster node (Redis 7.0 or later, for cluster-port): %w", err)
		}
		c.nodes = append(c.nodes, s)
		admin, err := rueidis.NewClient(rueidis.ClientOption{
			InitAddress: []string{s.addr}, DisableCache: true, ForceSingleClient: true,
		})
		if err != nil {
			return nil, err
		}
		c.admins = append(c.admins, admin)
	}
	ctx, cancel := context.WithTimeout(context.Background(), clusterTimeout)
	defer cancel()
	args := append([]string{"--cluster", "create"}, c.addrs()...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("redis-cli --cluster create: %w\n%s", err, out)
	}
	for why := ""; ; time.Sleep(20 * time.Millisecond) {
		ok, w := c.settled(ctx)
		if ok {
			break
		}
		if w != "" {
			why = w
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("the cluster did not settle in %v: %s", clusterTimeout, why)
		}
	}
	return c, nil
}

func (c *cluster) addrs() []string {
	addrs := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		addrs[i] = n.addr
	}
	return addrs
}

// settled reports whether every node sees the cluster ok, all slots
// served by clusterPrimaries nodes, and reads the slot ranges of each
// node as the first node sees them; if not, it says why.
func (c *cluster) settled(ctx context.Context) (bool, string) {
	for _, a := range c.admins {
		info, err := a.Do(ctx, a.B().ClusterInfo().Build()).ToString()
		if err != nil {
			return false, err.Error()
		}
		for _, want := range []string{"cluster_state:ok", "cluster_slots_ok:16384", fmt.Sprintf("cluster_known_nodes:%d", clusterPrimaries)} {
			if !strings.Contains(info, want) {
				return false, "CLUSTER INFO has no " + want
			}
		}
	}
	text, err := c.admins[0].Do(ctx, c.admins[0].B().ClusterNodes().Build()).ToString()
	if err != nil {
		return false, err.Error()
	}
	ranges, err := slotRanges(strings.TrimPrefix(text, "txt:"), c.addrs())
	if err != nil {
		return false, err.Error()
	}
	c.ranges = ranges
	return true, ""
}

// slotRanges reads CLUSTER NODES: the slot ranges of each node of addrs,
// in their order.
func slotRanges(text string, addrs []string) ([][][2]int, error) {
	ranges := make([][][2]int, len(addrs))
	for line := range strings.Lines(text) {
		f := strings.Fields(line)
		if len(f) < 8 {
			continue
		}
		addr, _, _ := strings.Cut(f[1], "@")
		i := -1
		for j, a := range addrs {
			if a == addr {
				i = j
			}
		}
		if i < 0 {
			return nil, fmt.Errorf("CLUSTER NODES: a node %s of no known address", addr)
		}
		for _, r := range f[8:] {
			var lo, hi int
			if _, err := fmt.Sscanf(r, "%d-%d", &lo, &hi); err != nil {
				if _, err := fmt.Sscanf(r, "%d", &lo); err != nil {
					continue // a slot being migrated: "[...]"
				}
				hi = lo
			}
			ranges[i] = append(ranges[i], [2]int{lo, hi})
		}
	}
	for i, r := range ranges {
		if len(r) == 0 {
			return nil, fmt.Errorf("CLUSTER NODES: %s serves no slot", addrs[i])
		}
	}
	return ranges, nil
}

// nodeOf returns the index of the node that serves slot, or -1.
func (c *cluster) nodeOf(slot int) int {
	for i, rs := range c.ranges {
		for _, r := range rs {
			if r[0] <= slot && slot <= r[1] {
				return i
			}
		}
	}
	return -1
}

// idleCPU measures the CPU the idle cluster's nodes use together over d
// (the cluster bus and each node's cron), which the Redis CPU of every
// round on the cluster includes; per second.
func (c *cluster) idleCPU(d time.Duration) (time.Duration, error) {
	a, err := redisCPUOf(c.admins)
	if err != nil {
		return 0, err
	}
	start := time.Now()
	time.Sleep(d)
	z, err := redisCPUOf(c.admins)
	if err != nil {
		return 0, err
	}
	return time.Duration(float64(z-a) / time.Since(start).Seconds()), nil
}

// stop closes the admin clients and stops every node.
func (c *cluster) stop() {
	for _, a := range c.admins {
		a.Close()
	}
	for _, n := range c.nodes {
		n.stop()
	}
}

// slotOf returns the Redis Cluster slot of a key whose hash tag is tag
// (every key of a distlock name n is "ns:{n}...": its slot is slotOf(n)).
func slotOf(tag string) int { return lease.KeySlot(tag) }
