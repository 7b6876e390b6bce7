package main

import (
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"time"

	"github.com/redis/rueidis"

	"github.com/distkit-go/distlock"
	"github.com/distkit-go/distlock/internal/embedredis"
)

// common holds the flags that every subcommand shares: where Redis is, and
// which keys a lock name maps to.
type common struct {
	redis     string
	namespace string
	ttl       time.Duration
}

// register adds --redis and --namespace to fs, and --ttl with the given
// default unless it is 0 (inspect has no use for a TTL). redisHelp describes
// the fallback when --redis is not given.
func (c *common) register(fs *flag.FlagSet, redisHelp string, ttl time.Duration) {
	fs.StringVar(&c.redis, "redis", "", "Redis `URL`: redis://, rediss:// or unix://, several ?addr= for a cluster (default $REDIS_URL"+redisHelp+")")
	fs.StringVar(&c.namespace, "namespace", distlock.DefaultNamespace, "key `NAMESPACE`: the lock KEY lives at NAMESPACE:{KEY}")
	if ttl > 0 {
		durationVar(fs, &c.ttl, "ttl", ttl, fmt.Sprintf("lease `TTL`, renewed every TTL/3 (%v to %v)", distlock.MinTTL, distlock.MaxTTL))
	}
}

// connect returns a rueidis client for url (a redis://, rediss:// or unix://
// URL as rueidis parses it; several addr= parameters make a cluster client).
// An empty url falls back to $REDIS_URL; if that is empty too and embedded is
// true, an in-process miniredis is started. It also returns a description of
// the server for messages (without any password) and a func that closes the
// client and the embedded server.
//
// by, when not zero, is when connecting must be done: rueidis dials and
// sends its handshake (HELLO) before NewClient returns, with no context, and
// waits up to its dial timeout (5 s) for a server that accepts connections
// but does not answer (a stopped one). The dial timeout is lowered to what is
// left until by, and an error that says so is returned when that runs out.
// The lowered timeout also bounds each later reconnection's handshake, which
// on a working server takes a round trip.
func connect(rawURL string, embedded bool, by time.Time) (rueidis.Client, string, func(), error) {
	if rawURL == "" {
		rawURL = os.Getenv("REDIS_URL")
	}
	if rawURL != "" {
		where := redact(rawURL)
		opt, err := rueidis.ParseURL(rawURL)
		if err != nil {
			return nil, "", nil, usagef("bad Redis URL %q: %v", where, err)
		}
		opt.DisableCache = true // distlock never reads through the cache
		if !by.IsZero() {
			left := time.Until(by)
			if left <= 0 {
				return nil, "", nil, fmt.Errorf("connecting to %s: %w", where, errConnectTime)
			}
			if opt.Dialer.Timeout <= 0 {
				opt.Dialer.Timeout = rueidis.DefaultDialTimeout
			}
			opt.Dialer.Timeout = min(opt.Dialer.Timeout, left)
		}
		c, err := rueidis.NewClient(opt)
		if err != nil {
			if !by.IsZero() && !time.Now().Before(by) {
				err = fmt.Errorf("%w (%v)", errConnectTime, err)
			}
			return nil, "", nil, fmt.Errorf("connecting to %s: %w", where, err)
		}
		return c, where, c.Close, nil
	}
	if !embedded {
		return nil, "", nil, usagef("no Redis given: pass --redis URL or set REDIS_URL")
	}
	srv, err := embedredis.Start()
	if err != nil {
		return nil, "", nil, err
	}
	return srv.Client(), "embedded Redis (miniredis) at " + srv.Addr(), srv.Close, nil
}

// connectReal is connect for the commands that need a real Redis (all but
// the demo): a bad or missing URL is a usage error, and a failure to
// connect an *exitStatus with exitFailed.
func connectReal(rawURL string, by time.Time) (rueidis.Client, string, func(), error) {
	c, where, closeClient, err := connect(rawURL, false, by)
	var ue usageError
	if err != nil && !errors.As(err, &ue) {
		err = &exitStatus{code: exitFailed, err: err}
	}
	return c, where, closeClient, err
}

// errConnectTime is wrapped by the error of a connect that ran out of the
// time it was given.
var errConnectTime = errors.New("no reply in time")

// redact hides the password of a Redis URL, so that it never reaches a
// message or a log.
func redact(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}
