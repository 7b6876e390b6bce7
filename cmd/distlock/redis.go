package main

import (
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
func connect(rawURL string, embedded bool) (rueidis.Client, string, func(), error) {
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
		c, err := rueidis.NewClient(opt)
		if err != nil {
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

// redact hides the password of a Redis URL, so that it never reaches a
// message or a log.
func redact(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}
