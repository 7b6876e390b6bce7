package distlock

import (
	"context"
	"testing"
)

// BenchmarkOverhead measures a lock + release pair against an in-memory
// store: everything distlock adds on top of the two Redis round trips.
func BenchmarkOverhead(b *testing.B) {
	f := &fakeStore{}
	m, err := newMutex("bench", nil)
	if err != nil {
		b.Fatal(err)
	}
	m.e.client, m.e.store = f, f
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		g, err := m.Lock(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := g.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
}
