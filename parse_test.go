package ratelimit_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/ratelimit"
)

func TestParseLimit(t *testing.T) {
	lim := func(rate int, period time.Duration, burst int) ratelimit.Limit {
		return ratelimit.Limit{Rate: rate, Period: period, Burst: burst}
	}
	for in, want := range map[string]ratelimit.Limit{
		"100/s":                     ratelimit.PerSecond(100),
		"100/sec":                   ratelimit.PerSecond(100),
		"100/second":                ratelimit.PerSecond(100),
		"100/seconds":               ratelimit.PerSecond(100),
		"100/min":                   ratelimit.PerMinute(100),
		"100/minute":                ratelimit.PerMinute(100),
		"10/1m":                     ratelimit.PerMinute(10),
		"5000/hour":                 ratelimit.PerHour(5000),
		"5000/h":                    ratelimit.PerHour(5000),
		"5000/HR":                   ratelimit.PerHour(5000),
		"100/day":                   lim(100, 24*time.Hour, 0),
		"100/7d":                    lim(100, 7*24*time.Hour, 0),
		"100/5s":                    lim(100, 5*time.Second, 0),
		"10/15 min":                 lim(10, 15*time.Minute, 0),
		"10/250ms":                  lim(10, 250*time.Millisecond, 0),
		"10/1500 milliseconds":      lim(10, 1500*time.Millisecond, 0),
		"10/1m30s":                  lim(10, 90*time.Second, 0),
		"10/1.5s":                   lim(10, 1500*time.Millisecond, 0),
		"100/min burst 20":          lim(100, time.Minute, 20),
		"100/1m0s burst 20":         lim(100, time.Minute, 20),
		"  100 / Minute  BURST 20 ": lim(100, time.Minute, 20),
		"100/min\tburst\t0":         lim(100, time.Minute, 0),
		"007/s":                     ratelimit.PerSecond(7),
	} {
		got, err := ratelimit.ParseLimit(in)
		require.NoError(t, err, "%q", in)
		require.Equal(t, want, got, "%q", in)
	}
}

func TestParseLimitErrors(t *testing.T) {
	for in, msg := range map[string]string{
		"":                       "want <rate>/<period>",
		"100":                    "want <rate>/<period>",
		"100 per minute":         "want <rate>/<period>",
		"/min":                   "rate: missing number",
		"x/min":                  `rate: "x" is not a whole number`,
		"-5/min":                 `rate: "-5" is not a whole number`,
		"+5/min":                 `rate: "+5" is not a whole number`,
		"1.5/min":                `rate: "1.5" is not a whole number`,
		"99999999999999999999/s": "rate: \"99999999999999999999\" is too large",
		"0/min":                  "Rate must be > 0, got 0",
		"100/":                   "period: missing",
		"100/fortnight":          `period: "fortnight" is not a unit`,
		"100/month":              `period: "month" is not a unit`,
		"100/5/s":                `period: "5/s" is not a unit`,
		"100/0s":                 "Period must be >= 1ms, got 0s",
		"100/-1s":                "Period must be >= 1ms, got -1s",
		"100/1us":                "Period must be >= 1ms",
		"100/1.0000001s":         "Period must be a whole number of microseconds",
		"100/9999999999999d":     `period: "9999999999999d" is too long`,
		"100/min burst":          "want burst <n> after the period",
		"100/min burst x":        `burst: "x" is not a whole number`,
		"100/min burst -1":       `burst: "-1" is not a whole number`,
		"100/min burst 20 30":    `burst: "20 30" is not a whole number`,
		"100/minburst 20":        `period: "minburst 20" is not a unit`,
		"3000000/hour":           "Rate x Period (3000000 x 1h0m0s) is too large to count exactly",
		"1/h burst 3000000":      "Burst x Period (3000000 x 1h0m0s) is too large to count exactly",
	} {
		_, err := ratelimit.ParseLimit(in)
		require.ErrorIs(t, err, ratelimit.ErrInvalidLimit, "%q", in)
		require.Contains(t, err.Error(), msg, "%q", in)
		require.Contains(t, err.Error(), "parsing", "%q: the error names the input", in)
	}
	_, err := ratelimit.ParseLimit(strings.Repeat("9", 1000) + "/s")
	require.ErrorIs(t, err, ratelimit.ErrInvalidLimit)
	require.Less(t, len(err.Error()), 300, "a long input is cut in the error")
}

// ParseLimit reads back what Limit.String writes.
func TestParseLimitRoundTrip(t *testing.T) {
	for _, l := range []ratelimit.Limit{
		ratelimit.PerSecond(1), ratelimit.PerMinute(100), ratelimit.PerHour(2_500_000),
		{Rate: 100, Period: time.Minute, Burst: 20}, {Rate: 3, Period: 1500 * time.Millisecond},
		{Rate: 1, Period: 24 * time.Hour, Burst: 1}, {Rate: 7, Period: time.Millisecond + time.Microsecond},
		{Rate: 100_000, Period: 24 * time.Hour}, {Rate: 5, Period: 90 * time.Minute, Burst: 100},
	} {
		got, err := ratelimit.ParseLimit(l.String())
		require.NoError(t, err, "%q", l.String())
		require.Equal(t, l, got, "%q", l.String())
	}
}

// No input makes ParseLimit panic; what it accepts is valid and survives
// a round trip through String.
func FuzzParseLimit(f *testing.F) {
	for _, s := range []string{"100/s", "10/1m", "100/min burst 20", "100/1m0s burst 20", "10/1.5s", "x/y", "1/9999999999999d",
		"10/15 min", "100/min burst", " burst 1/s", "1/1h2m3.000004s"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		l, err := ratelimit.ParseLimit(s)
		if err != nil {
			require.ErrorIs(t, err, ratelimit.ErrInvalidLimit)
			require.Equal(t, ratelimit.Limit{}, l)
			return
		}
		require.NoError(t, l.Validate(), "%q", s)
		back, err := ratelimit.ParseLimit(l.String())
		require.NoError(t, err, "%q -> %q", s, l.String())
		require.Equal(t, l, back, "%q -> %q", s, l.String())
	})
}
