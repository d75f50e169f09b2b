package ratelimit_test

import (
	"errors"
	"fmt"

	"github.com/hybridlimit/ratelimit"
)

func ExampleParseLimit() {
	for _, s := range []string{"100/min", "5000/hour", "10/5s burst 20", "100/fortnight"} {
		l, err := ratelimit.ParseLimit(s)
		if err != nil {
			fmt.Println(errors.Is(err, ratelimit.ErrInvalidLimit), err)
			continue
		}
		fmt.Printf("%-17q %v: %d per %v, burst %d\n", s, l, l.Rate, l.Period, l.Burst)
	}
	// Output:
	// "100/min"         100/1m0s: 100 per 1m0s, burst 0
	// "5000/hour"       5000/1h0m0s: 5000 per 1h0m0s, burst 0
	// "10/5s burst 20"  10/5s burst 20: 10 per 5s, burst 20
	// true ratelimit: invalid limit: parsing "100/fortnight": period: "fortnight" is not a unit (ms, s, m, h, d, or sec, min, hour, day...) with an optional count, nor a Go duration
}
