package local_test

import (
	"context"
	"fmt"
	"time"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/local"
)

func Example() {
	// A fixed, hand-advanced clock makes the example deterministic.
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	lim, err := local.New(ratelimit.PerSecond(3),
		local.WithAlgorithm(ratelimit.FixedWindow),
		local.WithClock(func() time.Time { return now }))
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	for i := 0; i < 4; i++ {
		d, _ := lim.Allow(ctx, "user-1")
		fmt.Println(d.Allowed, d.Remaining, d.RetryAfter)
	}
	now = now.Add(time.Second) // the next window
	d, _ := lim.Allow(ctx, "user-1")
	fmt.Println(d.Allowed, d.Remaining, d.RetryAfter)

	_, err = lim.AllowN(ctx, "user-1", 4)
	fmt.Println(err)
	// Output:
	// true 2 0s
	// true 1 0s
	// true 0 0s
	// false 0 1s
	// true 2 0s
	// ratelimit: invalid n: n = 4 exceeds the capacity 3 of 3/1s; it could never be admitted
}

func ExampleTable() {
	evicted := 0
	t := local.NewTable(2, func(key string, v int) { evicted++ })
	t.GetOrCreate("a", func() int { return 1 })
	t.GetOrCreate("b", func() int { return 2 })
	t.Get("a")                                  // "b" is now the least recently used
	t.GetOrCreate("c", func() int { return 3 }) // evicts "b"
	_, okB := t.Peek("b")
	v, okA := t.Peek("a")
	fmt.Println(t.Len(), t.Cap(), evicted, okB, v, okA)
	// Output: 2 2 1 false 1 true
}

func ExampleMulti() {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	lim, err := local.NewMulti([]ratelimit.Limit{ratelimit.PerSecond(2), ratelimit.PerMinute(3)},
		local.WithAlgorithm(ratelimit.FixedWindow),
		local.WithClock(func() time.Time { return now }))
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	show := func(d ratelimit.Decision) {
		fmt.Printf("%v by %v, retry %v;", d.Allowed, d.Limit, d.RetryAfter)
		for _, s := range d.Limits() {
			fmt.Printf(" %v: %d left", s.Limit, s.Remaining)
		}
		fmt.Println()
	}
	for i := 0; i < 3; i++ {
		d, _ := lim.Allow(ctx, "user-1")
		show(d)
	}
	now = now.Add(time.Second)
	for i := 0; i < 2; i++ {
		d, _ := lim.Allow(ctx, "user-1")
		show(d)
	}
	// Output:
	// true by 2/1s, retry 0s; 2/1s: 1 left 3/1m0s: 2 left
	// true by 2/1s, retry 0s; 2/1s: 0 left 3/1m0s: 1 left
	// false by 2/1s, retry 1s; 2/1s: 0 left 3/1m0s: 1 left
	// true by 3/1m0s, retry 0s; 2/1s: 1 left 3/1m0s: 0 left
	// false by 3/1m0s, retry 59s; 2/1s: 1 left 3/1m0s: 0 left
}

// ExampleLimiter_Reserve limits the tokens an LLM may generate for a user:
// a request reserves its estimate before the call and settles with what it
// really used, giving the rest back; a call that used more than its
// estimate puts the user in debt.
func ExampleLimiter_Reserve() {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	lim, err := local.New(ratelimit.PerMinute(1000),
		local.WithAlgorithm(ratelimit.FixedWindow),
		local.WithClock(func() time.Time { return now }))
	if err != nil {
		panic(err)
	}
	ctx := context.Background()

	r, _ := lim.Reserve(ctx, "user-1", 800) // the estimate, before the call
	fmt.Println(r.OK(), r.Decision().Remaining)
	_ = r.Settle(ctx, 320) // the tokens the call really used
	d, _ := lim.AllowN(ctx, "user-1", 600)
	fmt.Println(d.Allowed, d.Remaining)

	r, _ = lim.Reserve(ctx, "user-1", 50)
	_ = r.Settle(ctx, 250) // 200 over: an overdraft
	d, _ = lim.Allow(ctx, "user-1")
	fmt.Println(d.Allowed, d.RetryAfter)
	// Output:
	// true 200
	// true 80
	// false 1m0s
}
