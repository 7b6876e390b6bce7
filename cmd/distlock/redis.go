package main

import (
	"fmt"
	"os"

	"github.com/redis/rueidis"

	"github.com/distkit-go/distlock/internal/embedredis"
)

// connect returns a rueidis client for url (a redis://, rediss:// or unix://
// URL as rueidis parses it; several addr= parameters make a cluster client).
// An empty url falls back to $REDIS_URL; if that is empty too and embedded is
// true, an in-process miniredis is started. The returned func closes the
// client and the embedded server.
func connect(url string, embedded bool) (rueidis.Client, string, func(), error) {
	if url == "" {
		url = os.Getenv("REDIS_URL")
	}
	if url != "" {
		opt, err := rueidis.ParseURL(url)
		if err != nil {
			return nil, "", nil, usagef("bad Redis URL %q: %v", url, err)
		}
		opt.DisableCache = true // distlock never reads through the cache
		c, err := rueidis.NewClient(opt)
		if err != nil {
			return nil, "", nil, fmt.Errorf("connecting to %s: %w", url, err)
		}
		return c, url, c.Close, nil
	}
	if !embedded {
		return nil, "", nil, usagef("no Redis given: pass --redis or set REDIS_URL")
	}
	srv, err := embedredis.Start()
	if err != nil {
		return nil, "", nil, err
	}
	return srv.Client(), "embedded Redis (miniredis) at " + srv.Addr(), srv.Close, nil
}
