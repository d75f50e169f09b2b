module github.com/hybridlimit/ratelimit/bench

go 1.26.8

require (
	github.com/go-redis/redis_rate/v10 v10.0.1
	github.com/hybridlimit/ratelimit v0.0.0
	github.com/redis/go-redis/v9 v9.23.0
	github.com/sethvargo/go-limiter v0.7.1
	golang.org/x/time v0.16.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/hashicorp/golang-lru/v2 v2.0.7 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
)

replace github.com/hybridlimit/ratelimit => ../
