package httplimit

import (
	"net/http"
	"strconv"
	"time"

	"github.com/hybridlimit/ratelimit"
)

// Header names in their canonical form (textproto.CanonicalMIMEHeaderKey), so
// that the middleware can write the header map directly. On the wire the
// names are case-insensitive: X-Ratelimit-Limit is X-RateLimit-Limit.
const (
	headerLimit      = "X-Ratelimit-Limit"
	headerRemaining  = "X-Ratelimit-Remaining"
	headerReset      = "X-Ratelimit-Reset"
	headerRetryAfter = "Retry-After"
	headerPolicy     = "Ratelimit-Policy"
	headerRateLimit  = "Ratelimit"
)

// policyStrings are the header values that depend only on the policy and on
// the Limit and Algorithm of its decisions: built once per limit, not once
// per request.
type policyStrings struct {
	limit  ratelimit.Limit
	alg    ratelimit.Algorithm
	quota  string // X-RateLimit-Limit
	policy string // the policy's member of RateLimit-Policy
}

func (m *middleware) policyStrings(l ratelimit.Limit, a ratelimit.Algorithm) *policyStrings {
	if p := m.static.Load(); p != nil && p.limit == l && p.alg == a {
		return p
	}
	q := m.quota
	if q == 0 {
		q = l.Capacity(a)
	}
	p := &policyStrings{
		limit:  l,
		alg:    a,
		quota:  strconv.Itoa(q),
		policy: string(appendPolicyMember(nil, m.quotedName, q, l.Period)),
	}
	m.static.Store(p)
	return p
}

// writeHeaders sets the selected rate-limit headers of decision d on h;
// Retry-After only when the request is denied.
//
// A decision of one limit is one policy. A decision that lists several
// (Decision.Limits) is one policy per limit: RateLimit-Policy and RateLimit
// are structured-field lists, one member per limit, in the limiter's
// order, separated by ", "; the X-RateLimit-* headers and Retry-After
// describe the limit the Decision itself describes, the tightest.
func (m *middleware) writeHeaders(h http.Header, d ratelimit.Decision, denied bool) {
	sets := m.headers
	if !denied {
		sets &^= RetryAfter
	}
	if sets == 0 {
		return
	}
	var quota, policy string
	states := d.Limits()
	var ms *multiStrings
	if len(states) > 1 {
		ms = m.multiStrings(states)
		quota, policy = ms.quota(d), ms.policy
	} else {
		ps := m.policyStrings(d.Limit, d.Algorithm)
		quota, policy = ps.quota, ps.policy
	}
	remaining := max(d.Remaining, 0)

	// The values that change per request are appended to one buffer that
	// becomes one string, and every header's one-element value slice shares
	// one array: two allocations per response (three when the RateLimit
	// list of many limits with long names outgrows buf).
	var buf [512]byte
	var ends [4]int
	b, n := buf[:0], 0
	if sets&XRateLimit != 0 {
		b = strconv.AppendInt(b, int64(remaining), 10)
		ends[n], n = len(b), n+1
		b = strconv.AppendInt(b, resetUnix(time.Now(), d.ResetAfter), 10)
		ends[n], n = len(b), n+1
	}
	if sets&RetryAfter != 0 {
		b = strconv.AppendInt(b, retryAfterSeconds(d.RetryAfter), 10)
		ends[n], n = len(b), n+1
	}
	if sets&IETF != 0 {
		if ms == nil {
			b = appendRateLimitMember(b, m.quotedName, remaining, ceilSeconds(d.ResetAfter))
		} else {
			for i := range states {
				if i > 0 {
					b = append(b, ", "...)
				}
				b = appendRateLimitMember(b, ms.names[i], max(states[i].Remaining, 0), ceilSeconds(states[i].ResetAfter))
			}
		}
		ends[n], n = len(b), n+1
	}
	s := string(b)
	var parts [4]string
	for i, start := 0, 0; i < n; i++ {
		parts[i], start = s[start:ends[i]], ends[i]
	}

	vals := make([]string, 0, 6)
	set := func(name, v string) {
		vals = append(vals, v)
		h[name] = vals[len(vals)-1 : len(vals) : len(vals)]
	}
	i := 0
	if sets&XRateLimit != 0 {
		set(headerLimit, quota)
		set(headerRemaining, parts[i])
		set(headerReset, parts[i+1])
		i += 2
	}
	if sets&RetryAfter != 0 {
		set(headerRetryAfter, parts[i])
		i++
	}
	if sets&IETF != 0 {
		set(headerPolicy, policy)
		set(headerRateLimit, parts[i])
	}
}

// appendPolicyMember appends one member of the RateLimit-Policy list:
// "<name>";q=<quota>;w=<window seconds>. The window parameter is left out
// when the period is not a whole number of seconds, which the field cannot
// express.
func appendPolicyMember(b []byte, quotedName string, quota int, period time.Duration) []byte {
	b = append(b, quotedName...)
	b = append(b, ";q="...)
	b = strconv.AppendInt(b, int64(quota), 10)
	if period >= time.Second && period%time.Second == 0 {
		b = append(b, ";w="...)
		b = strconv.AppendInt(b, int64(period/time.Second), 10)
	}
	return b
}

// appendRateLimitMember appends one member of the RateLimit list:
// "<name>";r=<remaining>;t=<seconds until reset>.
func appendRateLimitMember(b []byte, quotedName string, remaining int, reset int64) []byte {
	b = append(b, quotedName...)
	b = append(b, ";r="...)
	b = strconv.AppendInt(b, int64(remaining), 10)
	b = append(b, ";t="...)
	return strconv.AppendInt(b, reset, 10)
}

// quoteString returns s as a structured-field string (RFC 8941 section
// 3.3.3): in double quotes, with '"' and '\' escaped. s must be printable
// ASCII (WithPolicyName checks it).
func quoteString(s string) string {
	b := make([]byte, 0, len(s)+2)
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		if s[i] == '"' || s[i] == '\\' {
			b = append(b, '\\')
		}
		b = append(b, s[i])
	}
	return string(append(b, '"'))
}

// ceilSeconds returns d in whole seconds, rounded up; 0 for d <= 0.
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	s := int64(d / time.Second)
	if d%time.Second != 0 {
		s++
	}
	return s
}

// retryAfterSeconds is Retry-After's value: d rounded up to whole seconds,
// at least 1 (a denied decision's RetryAfter is > 0; 0 would invite an
// immediate retry).
func retryAfterSeconds(d time.Duration) int64 { return max(ceilSeconds(d), 1) }

// resetUnix returns the Unix time in seconds, rounded up, of now + after.
func resetUnix(now time.Time, after time.Duration) int64 {
	t := now.Add(max(after, 0))
	s := t.Unix()
	if t.Nanosecond() != 0 {
		s++
	}
	return s
}
