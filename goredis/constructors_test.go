package goredis_test

import (
	"errors"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"

	"github.com/distkit-go/distlock"
	"github.com/distkit-go/distlock/goredis"
)

// TestConstructorsRefuseNilClient checks that every constructor refuses a
// nil client, and a nil pointer of each go-redis client type, with the
// error distlock gives for a nil client, instead of panicking (then or at
// the first call). Nothing is sent: there is no client to send with.
func TestConstructorsRefuseNilClient(t *testing.T) {
	_, want := distlock.NewMutex(rueidis.Client(nil), "job")
	if want == nil {
		t.Fatal("distlock.NewMutex(nil) returned no error")
	}
	clients := map[string]redis.UniversalClient{
		"nil":                nil,
		"nil *Client":        (*redis.Client)(nil),
		"nil *ClusterClient": (*redis.ClusterClient)(nil),
		"nil *Ring":          (*redis.Ring)(nil),
	}
	constructors := map[string]func(redis.UniversalClient) (any, error){
		"NewMutex":     func(c redis.UniversalClient) (any, error) { return goredis.NewMutex(c, "job") },
		"NewSemaphore": func(c redis.UniversalClient) (any, error) { return goredis.NewSemaphore(c, "job", 3) },
		"NewElection":  func(c redis.UniversalClient) (any, error) { return goredis.NewElection(c, "job") },
		"NewRWMutex":   func(c redis.UniversalClient) (any, error) { return goredis.NewRWMutex(c, "job") },
		"NewMultiMutex": func(c redis.UniversalClient) (any, error) {
			return goredis.NewMultiMutex(c, []string{"job", "other"})
		},
	}
	for cname, newFn := range constructors {
		for kind, c := range clients {
			t.Run(cname+"/"+kind, func(t *testing.T) {
				got, err := newFn(c)
				if !errors.Is(err, distlock.ErrInvalidOption) {
					t.Fatalf("err = %v, want one matching distlock.ErrInvalidOption", err)
				}
				var oe *distlock.OptionError
				if !errors.As(err, &oe) || oe.Field != "client" {
					t.Fatalf("err = %#v, want a *distlock.OptionError for the field \"client\"", err)
				}
				if err.Error() != want.Error() {
					t.Errorf("err = %q, want distlock's own %q", err, want)
				}
				if !isNilValue(got) {
					t.Errorf("got %#v with the error, want nil", got)
				}
			})
		}
	}
}

// isNilValue reports whether v holds a nil pointer of a distlock type.
func isNilValue(v any) bool {
	switch v := v.(type) {
	case *distlock.Mutex:
		return v == nil
	case *distlock.Semaphore:
		return v == nil
	case *distlock.Election:
		return v == nil
	case *distlock.RWMutex:
		return v == nil
	case *distlock.MultiMutex:
		return v == nil
	}
	return v == nil
}
