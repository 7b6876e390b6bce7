package distlock

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestSetSeen: a set's call brings, for each name of its group, the
// largest token the request learnt of, but for the names its last call
// left held, which bring their grant's token less one (so that the call,
// landing after the set gave them up, is refused rather than granted them
// anew); a name never granted keeps what it learnt.
func TestSetSeen(t *testing.T) {
	a := &setAcquirer{
		s:      &lockSet{groups: []int{0, 2, 5}},
		tokens: []int64{10, 20, 30, 40, 0},
		seen:   []int64{11, 21, 31, 41, 51},
	}
	cases := []struct {
		gi, lastStop int
		want         []int64
	}{
		{0, -1, []int64{11, 21}},     // nothing held: what it learnt
		{1, -1, []int64{31, 41, 51}}, // nothing held in this group yet
		{1, 4, []int64{29, 39, 51}},  // stopped at the 5th: the 3rd and 4th held
		{1, 5, []int64{29, 39, 51}},  // the 5th's token unknown (0): what it learnt
		{0, 1, []int64{9, 21}},       // stopped at the 2nd: the 1st held
	}
	for _, c := range cases {
		got := a.setSeen(c.gi, c.lastStop)
		assert.Equal(t, c.want, got, "group %d, last stop %d", c.gi, c.lastStop)
		got[0] = -7
		assert.NotEqual(t, int64(-7), a.seen[a.s.groups[c.gi]], "setSeen shares its slice with the request's")
	}
}
