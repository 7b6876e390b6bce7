package lease

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"strings"
	"sync/atomic"

	"github.com/google/uuid"
)

// The format of a lease value: "owner#id".

// NewValue returns a fresh lease value for one acquisition by owner:
// "owner#id", where id is formatted as a UUID. The owner part lets an
// operator see who holds a key; the id makes the value unique, so two
// acquisitions by the same owner never renew or release each other's lease.
//
// The id is a random prefix drawn once per process followed by a counter, so
// it costs no system call and cannot repeat within a process, and two
// processes share a prefix with a chance of about one in 2^64.
func NewValue(owner string) string {
	var id [16]byte
	copy(id[:8], idPrefix[:])
	binary.BigEndian.PutUint64(id[8:], idCounter.Add(1))
	id[6] = id[6]&0x0f | 0x40 // version 4
	id[8] = id[8]&0x3f | 0x80 // RFC 4122 variant

	var text [36]byte
	hex.Encode(text[0:8], id[0:4])
	text[8] = '-'
	hex.Encode(text[9:13], id[4:6])
	text[13] = '-'
	hex.Encode(text[14:18], id[6:8])
	text[18] = '-'
	hex.Encode(text[19:23], id[8:10])
	text[23] = '-'
	hex.Encode(text[24:36], id[10:16])

	var b strings.Builder
	b.Grow(len(owner) + 1 + len(text))
	b.WriteString(owner)
	b.WriteByte('#')
	b.Write(text[:])
	return b.String()
}

// The parts of NewValue's ids.
var (
	idPrefix  = randomBytes()
	idCounter atomic.Uint64
)

func randomBytes() (b [8]byte) {
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on supported systems
	return b
}

// Owner returns the owner part of a value written by [NewValue]. For a value
// that distlock did not write it returns the whole value.
func Owner(value string) string {
	i := strings.LastIndexByte(value, '#')
	if i < 0 {
		return value
	}
	if id := value[i+1:]; len(id) != 36 || uuid.Validate(id) != nil {
		return value
	}
	return value[:i]
}
