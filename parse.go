package ratelimit

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// units are the period units ParseLimit reads, lower case.
var units = map[string]time.Duration{
	"ms": time.Millisecond, "msec": time.Millisecond, "millisecond": time.Millisecond, "milliseconds": time.Millisecond,
	"s": time.Second, "sec": time.Second, "secs": time.Second, "second": time.Second, "seconds": time.Second,
	"m": time.Minute, "min": time.Minute, "mins": time.Minute, "minute": time.Minute, "minutes": time.Minute,
	"h": time.Hour, "hr": time.Hour, "hrs": time.Hour, "hour": time.Hour, "hours": time.Hour,
	"d": 24 * time.Hour, "day": 24 * time.Hour, "days": 24 * time.Hour,
}

// ParseLimit reads a Limit written for people, as in a configuration file:
//
//	<rate>/<period>[ burst <burst>]
//
// rate and burst are whole numbers. period is a unit, optionally preceded by
// a whole number of them: ms, s, m, h and d, or their names, singular or
// plural, or sec, min, hr ("100/s", "100/sec", "100/second", "10/1m",
// "5000/hour", "100/day", "100/5s", "10/15 min"). Any Go duration that
// time.ParseDuration reads is a period too ("1m30s", "1.5s"), so ParseLimit
// reads back what Limit.String writes: ParseLimit(l.String()) == l for every
// valid l. Units and the word burst are case-insensitive; spaces around the
// parts are ignored. Months and years are not units: their length varies.
//
// The Limit returned is valid (Limit.Validate). Any error wraps
// ErrInvalidLimit and quotes the input.
func ParseLimit(s string) (Limit, error) {
	in := s
	s = strings.TrimSpace(s)
	rate, rest, ok := strings.Cut(s, "/")
	if !ok {
		return Limit{}, parseError(in, "want <rate>/<period>, as in 100/min, 10/5s or 100/s burst 20")
	}
	var l Limit
	var err error
	if l.Rate, err = parseCount(strings.TrimSpace(rate)); err != nil {
		return Limit{}, parseError(in, "rate: "+err.Error())
	}
	period := strings.TrimSpace(rest)
	if i := strings.LastIndex(lower(period), "burst"); i > 0 && isSpace(period[i-1]) {
		b := period[i+len("burst"):]
		if b == "" || !isSpace(b[0]) {
			return Limit{}, parseError(in, "want burst <n> after the period")
		}
		if l.Burst, err = parseCount(strings.TrimSpace(b)); err != nil {
			return Limit{}, parseError(in, "burst: "+err.Error())
		}
		period = strings.TrimSpace(period[:i])
	}
	if l.Period, err = parsePeriod(period); err != nil {
		return Limit{}, parseError(in, "period: "+err.Error())
	}
	if err := l.Validate(); err != nil {
		return Limit{}, fmt.Errorf("%w (parsing %s)", err, quoteInput(in))
	}
	return l, nil
}

func parseError(in, msg string) error {
	return fmt.Errorf("%w: parsing %s: %s", ErrInvalidLimit, quoteInput(in), msg)
}

// quoteInput quotes s for an error message, cut to 64 bytes: the input may
// come from anywhere.
func quoteInput(s string) string {
	if len(s) > 64 {
		return strconv.Quote(s[:64]) + "..."
	}
	return strconv.Quote(s)
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' }

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// parseCount reads a whole number of decimal digits, without sign.
func parseCount(s string) (int, error) {
	if s == "" {
		return 0, fmt.Errorf("missing number")
	}
	for i := 0; i < len(s); i++ {
		if !isDigit(s[i]) {
			return 0, fmt.Errorf("%s is not a whole number", quoteInput(s))
		}
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		return 0, fmt.Errorf("%s is too large", quoteInput(s))
	}
	return n, nil
}

// parsePeriod reads [<count>]<unit> or a Go duration.
func parsePeriod(s string) (time.Duration, error) {
	i := 0
	for i < len(s) && isDigit(s[i]) {
		i++
	}
	if unit, ok := units[lower(strings.TrimSpace(s[i:]))]; ok {
		if i == 0 {
			return unit, nil
		}
		n, err := parseCount(s[:i])
		if err != nil {
			return 0, err
		}
		if int64(n) > math.MaxInt64/int64(unit) {
			return 0, fmt.Errorf("%s is too long", quoteInput(s))
		}
		return time.Duration(n) * unit, nil
	}
	if d, err := time.ParseDuration(s); err == nil {
		return d, nil
	}
	if s == "" {
		return 0, fmt.Errorf("missing")
	}
	return 0, fmt.Errorf("%s is not a unit (ms, s, m, h, d, or sec, min, hour, day...) with an optional count, nor a Go duration", quoteInput(s))
}
