module github.com/distkit-go/distlock/benchmarks

go 1.26.0

// The benchmarks measure the distlock in this repository, and its go-redis
// adapter.
replace (
	github.com/distkit-go/distlock => ../
	github.com/distkit-go/distlock/goredis => ../goredis
)

require (
	github.com/bsm/redislock v0.10.0
	github.com/distkit-go/distlock v0.0.0-00010101000000-000000000000
	github.com/distkit-go/distlock/goredis v0.0.0-00010101000000-000000000000
	github.com/go-redsync/redsync/v4 v4.18.1
	github.com/redis/go-redis/v9 v9.23.0
	github.com/redis/rueidis v1.0.79
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/google/uuid v1.6.0 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
)
