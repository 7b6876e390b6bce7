package distlock_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/distkit-go/distlock"
)

// Move money between two accounts under both accounts' locks at once. The
// accounts come in any order: every process takes them in the same order,
// so two transfers in opposite directions never deadlock. Each account's
// fencing token comes from that account's own lock.
func ExampleMultiMutex() {
	srv := exampleRedis()
	defer srv.Close()
	client := srv.Client()

	transfer := func(ctx context.Context, from, to string) error {
		m, err := distlock.NewMultiMutex(client, []string{"account-" + from, "account-" + to})
		if err != nil {
			return err
		}
		g, err := m.Lock(ctx) // every name, or none
		if err != nil {
			return err
		}
		defer g.Release(context.WithoutCancel(ctx))
		fmt.Println("holding both accounts; tokens from their own sequences:",
			g.TokenOf("account-"+from) > 0, g.TokenOf("account-"+to) > 0)
		return g.Context().Err() // the writes would carry each account's token
	}

	ctx := context.Background()
	if err := transfer(ctx, "17", "42"); err != nil {
		log.Fatal(err)
	}

	// A Mutex of one account is the same lock: while it holds account-42,
	// a single attempt at the pair takes neither account.
	single, err := distlock.NewMutex(client, "account-42")
	if err != nil {
		log.Fatal(err)
	}
	g, err := single.Lock(ctx)
	if err != nil {
		log.Fatal(err)
	}
	pair, err := distlock.NewMultiMutex(client, []string{"account-42", "account-17"})
	if err != nil {
		log.Fatal(err)
	}
	_, err = pair.TryLock(ctx)
	var na *distlock.NotAcquiredError
	fmt.Println("pair while account-42 is held:", errors.As(err, &na), na.Key)
	if _, err := g.Release(ctx); err != nil {
		log.Fatal(err)
	}
	// Output:
	// holding both accounts; tokens from their own sequences: true true
	// pair while account-42 is held: true distlock:{account-42}
}
