package distlock

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
)

// TestRoomLingersFromItsLastLeave checks the room's linger (W5, and the
// shared subscription of a lock taken over and over): a room keeps its
// subscription for roomLinger after its last waiter left, counted from the
// last leave when waiters came and went during the linger, or stayed
// while its timer ran, and then it closes.
func TestRoomLingersFromItsLastLeave(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := &fakeMutex(t, &fakeStore{}).e
		const slack = 10 * time.Millisecond
		enter := func() (*room, *waiter) {
			r, _ := proc.enterRoom(e, true)
			w := r.join("waiter")
			r.listen()
			synctest.Wait() // the subscription is up
			return r, w
		}
		rooms := func() int {
			synctest.Wait()
			return RoomsOf(e.keys.Lease)
		}

		r, w := enter()
		r.leave(w)
		time.Sleep(roomLinger - slack)
		r, w = enter() // back during the linger
		r.leave(w)
		time.Sleep(roomLinger - slack) // the first linger has run out meanwhile
		require.Equal(t, 1, rooms(), "rooms %v after the last leave, which was at most roomLinger ago", roomLinger-slack)
		time.Sleep(2 * slack)
		require.Equal(t, 0, rooms(), "rooms roomLinger after the last leave")

		r, w = enter()
		r.leave(w)
		r, w = enter() // in the room while its linger timer runs
		time.Sleep(2 * roomLinger)
		require.Equal(t, 1, rooms(), "rooms while a waiter is in it")
		r.leave(w)
		time.Sleep(roomLinger - slack)
		require.Equal(t, 1, rooms(), "rooms less than roomLinger after the last leave")
		time.Sleep(2 * slack)
		require.Equal(t, 0, rooms(), "rooms roomLinger after the last leave")
	})
}
