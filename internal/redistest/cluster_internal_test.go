package redistest

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestCRC16(t *testing.T) {
	// The CRC16/XMODEM check value, and slots that Redis itself reports.
	assert.Equal(t, uint16(0x31C3), crc16("123456789"))
	for key, slot := range map[string]int{"foo": 12182, "bar": 5061, "hello": 866} {
		assert.Equal(t, slot, int(crc16(key)%16384), "slot of %q", key)
	}
	for _, slot := range []int{0, 1, 5460, 16383} {
		assert.Equal(t, slot, int(crc16(keyInSlot(slot))%16384), "keyInSlot(%d)", slot)
	}
}

func TestParseNodes(t *testing.T) {
	text := "e7d1 127.0.0.1:30004@31004 slave 67ed 0 1426238317239 4 connected\n" +
		"67ed 127.0.0.1:30002@31002 master - 0 1426238316232 2 connected 5461-10922 [5470->-e7d1]\n" +
		"292f 127.0.0.1:30003@31003 myself,master - 0 0 3 connected 10923-16383 0\n" +
		"6ec2 127.0.0.1:30005@31005 master,fail? - 0 0 5 connected\n"
	nodes, err := parseNodes(text)
	require.NoError(t, err)
	assert.Equal(t, []Node{
		{ID: "67ed", Addr: "127.0.0.1:30002", Primary: true, Slots: [][2]int{{5461, 10922}}},
		{ID: "292f", Addr: "127.0.0.1:30003", Primary: true, Slots: [][2]int{{10923, 16383}, {0, 0}}},
		{ID: "e7d1", Addr: "127.0.0.1:30004", Of: "67ed"},
		{ID: "6ec2", Addr: "127.0.0.1:30005", Primary: true, Failing: true},
	}, nodes)

	_, err = parseNodes("x 127.0.0.1:1@2 master - 0 0 1 connected a-b\n")
	assert.Error(t, err, "a slot range that is not a number")
}
