package httplimit

import (
	"strconv"
	"sync"
	"time"

	"github.com/hybridlimit/ratelimit"
)

// statesPool holds the buffers a MultiLimiter's decisions are written into
// (AllowNInto), so that a decision on several limits allocates nothing. A
// buffer goes back once the observer and the denied handler have returned:
// Decision.Limits is valid until then (see Event).
var statesPool = sync.Pool{New: func() any {
	s := make([]ratelimit.LimitState, 0, ratelimit.MaxLimits)
	return &s
}}

// multiStrings are the header values that depend only on the limits of a
// decision of several limits and on the policy names: built once per set
// of limits, not once per request.
type multiStrings struct {
	limits []ratelimit.Limit
	algs   []ratelimit.Algorithm
	quotas []string // X-RateLimit-Limit when limit i is the tightest
	names  []string // limit i's policy name, as a structured-field string
	policy string   // RateLimit-Policy: one member per limit
}

func (ms *multiStrings) matches(states []ratelimit.LimitState) bool {
	if len(ms.limits) != len(states) {
		return false
	}
	for i := range states {
		if ms.limits[i] != states[i].Limit || ms.algs[i] != states[i].Algorithm {
			return false
		}
	}
	return true
}

// quota returns X-RateLimit-Limit for a decision d whose Limits is states
// (the quota of the limit d describes).
func (ms *multiStrings) quota(d ratelimit.Decision) string {
	for i := range ms.limits {
		if ms.limits[i] == d.Limit && ms.algs[i] == d.Algorithm {
			return ms.quotas[i]
		}
	}
	// d does not describe one of its limits (a Limiter elsewhere that
	// combined them another way): its own capacity.
	return strconv.Itoa(d.Limit.Capacity(d.Algorithm))
}

func (m *middleware) multiStrings(states []ratelimit.LimitState) *multiStrings {
	if p := m.mstatic.Load(); p != nil && p.matches(states) {
		return p
	}
	ms := &multiStrings{
		limits: make([]ratelimit.Limit, len(states)),
		algs:   make([]ratelimit.Algorithm, len(states)),
		quotas: make([]string, len(states)),
		names:  make([]string, len(states)),
	}
	for i, s := range states {
		ms.limits[i], ms.algs[i] = s.Limit, s.Algorithm
	}
	names := m.names
	if len(names) != len(states) {
		names = policyNames(m.name, ms.limits, ms.algs)
	}
	var b []byte
	for i, s := range states {
		q := s.Limit.Capacity(s.Algorithm)
		ms.quotas[i] = strconv.Itoa(q)
		ms.names[i] = quoteString(names[i])
		if i > 0 {
			b = append(b, ", "...)
		}
		b = appendPolicyMember(b, ms.names[i], q, s.Limit.Period)
	}
	ms.policy = string(b)
	m.mstatic.Store(ms)
	return ms
}

// policyNames derives a policy name for each of limits from the policy
// name: "<name>-<period>", the period in whole seconds ("default-1s",
// "default-60s", "default-86400s", as the w parameter counts it), or in
// milliseconds or microseconds when it is not whole ("default-1500ms").
// Limits of one period (possible only with distinct algorithms) each get
// their algorithm appended ("default-1s-token_bucket"); a name still
// repeated gets its position from 1 ("default-1s-token_bucket-2").
func policyNames(name string, limits []ratelimit.Limit, algs []ratelimit.Algorithm) []string {
	names := make([]string, len(limits))
	for i, l := range limits {
		names[i] = name + "-" + periodName(l.Period)
	}
	for i := range names {
		dup := false
		for j := range names {
			if j != i && limits[j].Period == limits[i].Period {
				dup = true
				break
			}
		}
		if dup {
			names[i] += "-" + algorithmName(algs[i])
		}
	}
	for i := range names {
		for j := 0; j < i; j++ {
			if names[j] == names[i] {
				names[i] += "-" + strconv.Itoa(i+1)
				break
			}
		}
	}
	return names
}

func periodName(p time.Duration) string {
	switch {
	case p%time.Second == 0:
		return strconv.FormatInt(int64(p/time.Second), 10) + "s"
	case p%time.Millisecond == 0:
		return strconv.FormatInt(int64(p/time.Millisecond), 10) + "ms"
	case p%time.Microsecond == 0:
		return strconv.FormatInt(int64(p/time.Microsecond), 10) + "us"
	}
	return strconv.FormatInt(int64(p), 10) + "ns"
}

// algorithmName is a's name in a policy name: its constant's name in
// snake case, fixed_window, sliding_window, sliding_log, token_bucket or
// gcra, as configuration files spell them.
func algorithmName(a ratelimit.Algorithm) string {
	s := a.String()
	b := make([]byte, 0, len(s)+2)
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'A' <= c && c <= 'Z' {
			if i > 0 && 'a' <= s[i-1] && s[i-1] <= 'z' {
				b = append(b, '_')
			}
			c += 'a' - 'A'
		}
		b = append(b, c)
	}
	return string(b)
}
