module github.com/hybridlimit/ratelimit/bench

go 1.26.8

require (
	github.com/hybridlimit/ratelimit v0.0.0
	github.com/sethvargo/go-limiter v0.7.1
	golang.org/x/time v0.16.0
)

require github.com/hashicorp/golang-lru/v2 v2.0.7 // indirect

replace github.com/hybridlimit/ratelimit => ../
