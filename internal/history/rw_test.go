package history_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/distkit-go/distlock/internal/history"
)

// rw is the Config of a history whose key "lock" is a read-write lock.
var rw = history.Config{RW: map[string]bool{"lock": true}}

// holdAs is hold for an acquisition of a read-write lock in mode.
func (b *builder) holdAs(mode, client string, token int64, from, to history.Mono) *builder {
	b.hold(client, token, from, to)
	for i := len(b.ops) - 1; i >= 0; i-- {
		if op := &b.ops[i]; op.Kind == history.Granted && op.Client == client && op.Token == token {
			op.Mode = mode
		}
	}
	return b
}

// readWrite is a history of a read-write lock that keeps the contract:
// readers a and b hold at once, writer w after both, reader c after w.
func readWrite() *builder {
	b := &builder{}
	b.holdAs("read", "a", 10, 0, 100).holdAs("read", "b", 20, 5, 120)
	b.holdAs("write", "w", 30, 130, 200).holdAs("read", "c", 40, 210, 300)
	return b
}

func TestCheckRWGoodHistory(t *testing.T) {
	r := rw.Check(readWrite().ops)
	require.NoError(t, r.Err())
	assert.Equal(t, 2, r.Readers, "the readers shared the lock")
	assert.Contains(t, r.Summary(), "readers_peak=2")
	// As a lock's history, the two readers overlap.
	assert.NotEmpty(t, history.Check(readWrite().ops).Overlaps)
}

func TestCheckRWFindsAReaderWithTheWriter(t *testing.T) {
	b := readWrite().sample("b", 20, 150, true) // b after w's grant
	r := rw.Check(b.ops)
	require.Len(t, r.Overlaps, 1)
	assert.Equal(t, [2]string{"b", "w"}, [2]string{r.Overlaps[0].First.Client, r.Overlaps[0].Second.Client})
	assert.ErrorContains(t, r.Err(), "L2 overlaps: 1")
}

func TestCheckRWFindsTheWriterWithALaterReader(t *testing.T) {
	b := readWrite().sample("w", 30, 220, true) // w after c's grant
	r := rw.Check(b.ops)
	require.Len(t, r.Overlaps, 1)
	assert.Equal(t, [2]string{"w", "c"}, [2]string{r.Overlaps[0].First.Client, r.Overlaps[0].Second.Client})
}

// A writer that downgraded counts as a reader from the start of its
// Downgrade: the readers granted after it may hold with it, a writer not.
func TestCheckRWDowngrade(t *testing.T) {
	b := &builder{}
	b.holdAs("write", "w", 10, 0, 200).holdAs("read", "r", 20, 110, 250)
	b.add(history.Op{Kind: history.Downgraded, At: 100 * ms, Client: "w", Token: 10})
	r := rw.Check(b.ops)
	require.NoError(t, r.Err())
	assert.Equal(t, 2, r.Readers)

	// Without the Downgrade, w held as a writer with r.
	b = &builder{}
	b.holdAs("write", "w", 10, 0, 200).holdAs("read", "r", 20, 110, 250)
	assert.Len(t, rw.Check(b.ops).Overlaps, 1)

	// After it, a writer must still wait for w.
	b.add(history.Op{Kind: history.Downgraded, At: 100 * ms, Client: "w", Token: 10})
	b.holdAs("write", "x", 30, 150, 300)
	r = rw.Check(b.ops)
	require.Len(t, r.Overlaps, 2, "w and r held when x was granted: %v", r.Overlaps)
}

func TestCheckRWFindsMissingModeAndSharedToken(t *testing.T) {
	b := readWrite().hold("m", 50, 310, 320)
	assert.Contains(t, rw.Check(b.ops).Malformed[0], "without a mode")
	b = readWrite().holdAs("read", "d", 40, 215, 230)
	assert.NotEmpty(t, rw.Check(b.ops).TokenOrder)
}

// asked records the first acquire call of client's acquisition token:
// sent at sent, answered at at, leaving it in line if inLine.
func (b *builder) asked(client string, token int64, sent, at history.Mono, inLine bool) *builder {
	return b.add(history.Op{Kind: history.Asked, Sent: sent * ms, At: at * ms, Client: client, Token: token, Held: inLine})
}

// Arrival order: a caller that stood in line before another asked is not
// passed over, whatever the modes (and on any kind of key).
func TestCheckArrival(t *testing.T) {
	b := readWrite().asked("w", 30, 50, 51, true).asked("c", 40, 60, 61, true)
	require.NoError(t, rw.Check(b.ops).Err())

	// c (a reader) asked after w stood in line, but got a smaller token.
	b = &builder{}
	b.holdAs("read", "a", 10, 0, 100).holdAs("read", "c", 20, 70, 100).holdAs("write", "w", 30, 130, 200)
	b.asked("w", 30, 50, 51, true).asked("c", 20, 60, 61, false)
	r := rw.Check(b.ops)
	require.Len(t, r.Arrival, 1)
	assert.Contains(t, r.Arrival[0], "was granted ahead of")
	assert.ErrorContains(t, r.Err(), "arrival order: 1")
	assert.Contains(t, r.Summary(), "arrival_violations=1")

	// Asked while w was still on its way to the line: no order between them.
	b = &builder{}
	b.holdAs("read", "a", 10, 0, 100).holdAs("read", "c", 20, 70, 100).holdAs("write", "w", 30, 130, 200)
	b.asked("w", 30, 50, 61, true).asked("c", 20, 60, 62, false)
	require.NoError(t, rw.Check(b.ops).Err())

	// A lock's history too.
	b = good().asked("b", 20, 50, 51, true).hold("x", 15, 120, 140).asked("x", 15, 60, 61, false)
	r = history.Check(b.ops)
	assert.Len(t, r.Arrival, 1)
	b = (&builder{}).asked("a", 10, 1, 2, true).asked("a", 10, 3, 4, true).hold("a", 10, 5, 6)
	assert.Contains(t, history.Check(b.ops).Malformed, "lock/a token 10 asked twice")
}
