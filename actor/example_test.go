package actor_test

import (
	"context"
	"fmt"

	"github.com/distkit-go/distlock/actor"
)

// counterMsg is the mailbox type of the counter: add n, then, if reply is
// set, answer with the new total; with stop set, return from the loop.
type counterMsg struct {
	add   int
	reply actor.Reply[int]
	stop  bool
}

// counter owns the total alone; nothing outside the loop touches it. It
// stops when a message tells it to.
func counter(_ *actor.Actor[counterMsg], inbox <-chan counterMsg) {
	total := 0
	for m := range inbox {
		if m.stop {
			return
		}
		total += m.add
		if m.reply != nil {
			m.reply.Send(total) // never blocks: the slot has capacity one
		}
	}
}

// A counter actor: Send adds without waiting for an answer, Call adds and
// returns the new total, and a stop message ends it.
func Example() {
	ctx := context.Background()
	a := actor.Start(counter)

	for range 3 {
		if err := a.Send(ctx, counterMsg{add: 1}); err != nil {
			fmt.Println("send:", err)
			return
		}
	}
	total, err := actor.Call(ctx, a, func(r actor.Reply[int]) counterMsg {
		return counterMsg{add: 10, reply: r}
	})
	fmt.Println(total, err)

	if err := a.Send(ctx, counterMsg{stop: true}); err != nil {
		fmt.Println("stop:", err)
	}
	if err := a.Wait(ctx); err != nil {
		fmt.Println("wait:", err)
	}
	_, err = actor.Call(ctx, a, func(r actor.Reply[int]) counterMsg {
		return counterMsg{reply: r}
	})
	fmt.Println(err)

	// Output:
	// 13 <nil>
	// actor: stopped
}
