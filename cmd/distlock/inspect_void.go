package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/distkit-go/distlock/lease"
)

// Void markers. A waiter that gives up (its Lock's context ended, its max
// wait ran out, a MultiMutex's Lock cancelled) leaves NAMESPACE:{KEY}:void:
// <value> behind for one TTL, so that an acquire with its value that
// reaches Redis later is refused (see lease.Keys.Void). Nothing lists them:
// inspect finds them by scanning the keyspace with SCAN MATCH, on every
// node the client knows, a pass over every key of the database. --watch
// does it at most every voidScanEvery.

// maxNamedVoids is how many void markers inspect names, the first to end
// first.
const maxNamedVoids = 10

// voidScanEvery is how often --watch scans for void markers; between two
// scans it shows what the last one found.
const voidScanEvery = 5 * time.Second

// voidScanCount is the COUNT hint of each SCAN call.
const voidScanCount = 1000

// voidState is one void marker: the value that gave up, and how long the
// marker has left.
type voidState struct {
	Owner       string `json:"owner"`
	Value       string `json:"value"`
	ExpiresInMS int64  `json:"expires_in_ms"`
}

// voidScan is what one scan for a KEY's void markers found, and when.
type voidScan struct {
	at    time.Time
	n     int
	named []voidState
}

// voids fills in s.Voided and s.Voids for keys: by a scan, or with --watch
// from the last scan if it is recent.
func (in *inspector) voids(ctx context.Context, s *lockState, keys lease.Keys) error {
	last, ok := in.voidScans[keys.Lease]
	if !ok || in.voidEvery == 0 || time.Since(last.at) >= in.voidEvery {
		var err error
		if last, err = in.scanVoids(ctx, keys); err != nil {
			return fmt.Errorf("scanning for %s: %w", keys.Void("*"), err)
		}
		if in.voidScans == nil {
			in.voidScans = make(map[string]voidScan)
		}
		in.voidScans[keys.Lease] = last
	}
	s.Voided, s.Voids = last.n, last.named
	return nil
}

// scanVoids scans every node for keys' void markers and reads how long the
// first maxNamedVoids to end have left.
func (in *inspector) scanVoids(ctx context.Context, keys lease.Keys) (voidScan, error) {
	prefix := keys.Void("")
	pattern := globEscape(prefix) + "*"
	seen := make(map[string]bool) // a Cluster's replicas have the keys of their primary
	var found []string
	for _, node := range in.rc.Nodes() {
		cursor := uint64(0)
		for {
			e, err := node.Do(ctx, node.B().Scan().Cursor(cursor).Match(pattern).Count(voidScanCount).Build()).AsScanEntry()
			if err != nil {
				return voidScan{}, err
			}
			for _, key := range e.Elements {
				if !seen[key] && strings.HasPrefix(key, prefix) {
					seen[key] = true
					found = append(found, key)
				}
			}
			if cursor = e.Cursor; cursor == 0 {
				break
			}
		}
	}
	vs := voidScan{at: time.Now(), n: len(found)}
	if len(found) == 0 {
		return vs, nil
	}
	cmds := make(rueidis.Commands, len(found))
	for i, key := range found {
		cmds[i] = in.rc.B().Pttl().Key(key).Build()
	}
	for i, res := range in.rc.DoMulti(ctx, cmds...) {
		ms, err := res.AsInt64()
		if err != nil {
			return voidScan{}, err
		}
		if ms == -2 { // gone since the scan
			vs.n--
			continue
		}
		v := strings.TrimPrefix(found[i], prefix)
		vs.named = append(vs.named, voidState{Owner: lease.Owner(v), Value: v, ExpiresInMS: ms})
	}
	slices.SortFunc(vs.named, func(a, b voidState) int {
		if c := int(a.ExpiresInMS - b.ExpiresInMS); c != 0 {
			return c
		}
		return strings.Compare(a.Value, b.Value)
	})
	vs.named = vs.named[:min(len(vs.named), maxNamedVoids)]
	return vs, nil
}

// globEscape escapes the characters that SCAN's MATCH pattern gives a
// meaning to (*, ?, [, ] and \), so that s matches only itself.
func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// voidText writes the void markers of s:
//
//	2 void: db-1:812 (29.1s left), db-3:77 (12s left)
func (s lockState) voidText(b *strings.Builder) {
	if s.Voided == 0 {
		return
	}
	fmt.Fprintf(b, "  %d void: ", s.Voided)
	for i, v := range s.Voids {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(b, "%s (%v left)", v.Owner, time.Duration(v.ExpiresInMS)*time.Millisecond)
	}
	if s.Voided > len(s.Voids) {
		b.WriteString(", ...")
	}
}
