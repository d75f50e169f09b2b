package config

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/hybridlimit/ratelimit"
)

// Mode says how a rule's limit is enforced.
type Mode int

const (
	// Strict: the hybrid limiter in strict mode. Every allowed request is
	// backed by quota Redis granted; the fleet never admits more than the
	// limit per window while Redis answers.
	Strict Mode = iota
	// Optimistic: the hybrid limiter in optimistic mode, fewer round trips
	// on cold keys for a bounded overshoot.
	Optimistic
	// Exact: one Redis script call per request (the global limiter).
	Exact
)

var modeNames = [...]string{"strict", "optimistic", "exact"}

// String returns "strict", "optimistic" or "exact".
func (m Mode) String() string {
	if m >= 0 && int(m) < len(modeNames) {
		return modeNames[m]
	}
	return "Mode(" + strconv.Itoa(int(m)) + ")"
}

// ParseMode reads "strict", "optimistic" or "exact".
func ParseMode(s string) (Mode, error) {
	for i, n := range modeNames {
		if s == n {
			return Mode(i), nil
		}
	}
	return 0, fmt.Errorf("unknown mode %q (want strict, optimistic or exact)", s)
}

// ParseAlgorithm reads an algorithm name: fixed_window, sliding_window,
// sliding_log, token_bucket or gcra (and the spellings
// ratelimit.ParseAlgorithm accepts).
func ParseAlgorithm(s string) (ratelimit.Algorithm, error) {
	a, err := ratelimit.ParseAlgorithm(s)
	if err != nil {
		return 0, fmt.Errorf("unknown algorithm %q (want fixed_window, sliding_window, sliding_log, token_bucket or gcra)", s)
	}
	return a, nil
}

// AlgorithmName returns the configuration name of a: "fixed_window", ...
func AlgorithmName(a ratelimit.Algorithm) string {
	switch a {
	case ratelimit.FixedWindow:
		return "fixed_window"
	case ratelimit.SlidingWindow:
		return "sliding_window"
	case ratelimit.SlidingLog:
		return "sliding_log"
	case ratelimit.TokenBucket:
		return "token_bucket"
	case ratelimit.GCRA:
		return "gcra"
	}
	return a.String()
}

// ParseFailureMode reads "local", "open" or "closed".
func ParseFailureMode(s string) (ratelimit.FailureMode, error) {
	for _, f := range []ratelimit.FailureMode{ratelimit.FailLocal, ratelimit.FailOpen, ratelimit.FailClosed} {
		if s == f.String() {
			return f, nil
		}
	}
	return 0, fmt.Errorf("unknown failure mode %q (want local, open or closed)", s)
}

// Unit is the unit of a rate limit. Its values are those of Envoy's
// RateLimitResponse.RateLimit.Unit, so that a conversion is a cast.
type Unit int32

// The units. MONTH and YEAR are 30 and 365 days, as in envoyproxy/ratelimit.
const (
	UnitUnknown Unit = 0
	Second      Unit = 1
	Minute      Unit = 2
	Hour        Unit = 3
	Day         Unit = 4
	Month       Unit = 5
	Year        Unit = 6
	Week        Unit = 7
)

var units = map[string]Unit{
	"SECOND": Second, "MINUTE": Minute, "HOUR": Hour, "DAY": Day,
	"WEEK": Week, "MONTH": Month, "YEAR": Year,
}

// ParseUnit reads a unit name, case-insensitively: second, minute, hour,
// day, week, month or year.
func ParseUnit(s string) (Unit, bool) {
	u, ok := units[strings.ToUpper(s)]
	return u, ok
}

// Duration returns the length of the unit's window; 0 for an unknown unit.
func (u Unit) Duration() time.Duration {
	switch u {
	case Second:
		return time.Second
	case Minute:
		return time.Minute
	case Hour:
		return time.Hour
	case Day:
		return 24 * time.Hour
	case Week:
		return 7 * 24 * time.Hour
	case Month:
		return 30 * 24 * time.Hour
	case Year:
		return 365 * 24 * time.Hour
	}
	return 0
}

// String returns the unit's name in capitals, e.g. "MINUTE".
func (u Unit) String() string {
	for n, v := range units {
		if v == u {
			return n
		}
	}
	return "UNKNOWN"
}

// Defaults are what a rule gets for the extensions it does not name.
type Defaults struct {
	Mode        Mode
	Algorithm   ratelimit.Algorithm
	FailureMode ratelimit.FailureMode
}

// Rule is one rate_limit block, or one rate_limits list: the limit, or the
// limits, a matching descriptor is counted against. Rules are read-only
// once Parse returns them.
type Rule struct {
	// ID is the rule's index in Config.Rules.
	ID int
	// Domain is the domain the rule belongs to.
	Domain string
	// Path names the rule as envoyproxy/ratelimit's statistics do, without
	// the domain: the descriptors from the top, "key" or "key_value", joined
	// by dots, e.g. "message_type_marketing.to_number".
	Path string
	// Ident identifies the rule unambiguously within its Config (domain and
	// every key and value on its path): the same rule in two Configs has the
	// same Ident.
	Ident string
	// File and Line locate the rate_limit block.
	File string
	Line int

	Name            string   // rate_limit.name
	Replaces        []string // rate_limit.replaces[].name
	Unlimited       bool
	RequestsPerUnit uint32 // 0 (and not Unlimited): every request is over the limit
	Unit            Unit
	ShadowMode      bool
	QuotaMode       bool
	DetailedMetric  bool
	// ValuesInLabel: the metric label of a decision may hold the request's
	// values (detailed_metric on the rule, or value_to_metric on a
	// descriptor of its path), so it is not always Path.
	ValuesInLabel bool

	Mode        Mode
	Algorithm   ratelimit.Algorithm
	FailureMode ratelimit.FailureMode

	// Metadata is the descriptor's metadata mapping (nil when none): with
	// response dynamic metadata on, a request's descriptors that pass
	// return theirs, as envoyproxy/ratelimit does.
	Metadata *structpb.Struct

	// Limits, for a rate_limits list of two or more limits, holds each of
	// them in file order, decided together, all or nothing, by one limiter
	// in Mode with FailureMode; Name, RequestsPerUnit, Unit and Algorithm
	// are then those of the first, and Replaces those of every item. It is
	// nil for a rate_limit block (and a list of one limit, which is read as
	// that block).
	Limits []RuleLimit
}

// RuleLimit is one limit of a rate_limits list: RequestsPerUnit (at least
// 1) per Unit, counted with Algorithm.
type RuleLimit struct {
	Name            string // the item's name: current_limit.name when this limit is the tightest
	RequestsPerUnit uint32
	Unit            Unit
	Algorithm       ratelimit.Algorithm
	Line            int // of the item
}

// Limit returns the limit for the library: RequestsPerUnit per Unit.
func (l RuleLimit) Limit() ratelimit.Limit {
	return ratelimit.Limit{Rate: int(l.RequestsPerUnit), Period: l.Unit.Duration()}
}

// Limit returns the rule's limit for the library: RequestsPerUnit per Unit
// (the first of Limits for a rule of several). It is meaningful only when
// the rule is neither Unlimited nor zero.
func (r *Rule) Limit() ratelimit.Limit {
	return ratelimit.Limit{Rate: int(r.RequestsPerUnit), Period: r.Unit.Duration()}
}

// AllLimits returns Limits, or for a rule of one limit that limit: every
// limit a descriptor of the rule is counted against. It is meaningful only
// when the rule is neither Unlimited nor zero.
func (r *Rule) AllLimits() []RuleLimit {
	if r.Limits != nil {
		return r.Limits
	}
	return []RuleLimit{{Name: r.Name, RequestsPerUnit: r.RequestsPerUnit, Unit: r.Unit, Algorithm: r.Algorithm, Line: r.Line}}
}

// Named reports whether the rule, or one limit of its rate_limits list, is
// named name (a replaces entry naming it replaces the whole rule).
func (r *Rule) Named(name string) bool {
	if name == "" {
		return false
	}
	if r.Name == name {
		return true
	}
	for _, l := range r.Limits {
		if l.Name == name {
			return true
		}
	}
	return false
}

// Config is a set of domains read from one or more files.
type Config struct {
	// Rules lists every rate_limit block, in file order; Rule.ID indexes it.
	Rules []*Rule
	// Warnings are what was read with envoyproxy/ratelimit's silent meaning
	// (see Options.Strict) or changed to be enforced (a fixed-window limit
	// too large for the hybrid limiter is counted in mode exact), each
	// naming the file, the line and the field.
	Warnings []*Error
	domains  map[string]*Domain
}

// Domain returns the named domain, or nil.
func (c *Config) Domain(name string) *Domain { return c.domains[name] }

// Domains returns the names of the configured domains, sorted.
func (c *Config) Domains() []string {
	n := make([]string, 0, len(c.domains))
	for k := range c.domains {
		n = append(n, k)
	}
	sort.Strings(n)
	return n
}

// Source is the content of one configuration file.
type Source struct {
	Name string // the path, used in errors
	Data []byte
}

// ReadSources reads the configuration files named by paths. A path that is
// a directory stands for every *.yaml and *.yml file in it (not its
// subdirectories), dot files excluded: the layout of a mounted Kubernetes
// ConfigMap, whose visible files are symlinks into a "..data" directory.
// Symlinks are followed. The sources come back sorted by name.
func ReadSources(paths []string) ([]Source, error) {
	var names []string
	for _, p := range paths {
		fi, err := os.Stat(p)
		if err != nil {
			return nil, err
		}
		if !fi.IsDir() {
			names = append(names, p)
			continue
		}
		ents, err := os.ReadDir(p)
		if err != nil {
			return nil, err
		}
		for _, e := range ents {
			n := e.Name()
			if strings.HasPrefix(n, ".") {
				continue
			}
			if ext := filepath.Ext(n); ext != ".yaml" && ext != ".yml" {
				continue
			}
			full := filepath.Join(p, n)
			st, err := os.Stat(full) // follows the symlink
			if err != nil {
				return nil, err
			}
			if st.Mode().IsRegular() {
				names = append(names, full)
			}
		}
	}
	sort.Strings(names)
	srcs := make([]Source, 0, len(names))
	for _, n := range names {
		b, err := os.ReadFile(n)
		if err != nil {
			return nil, err
		}
		srcs = append(srcs, Source{Name: n, Data: b})
	}
	if len(srcs) == 0 {
		return nil, fmt.Errorf("no configuration file (*.yaml, *.yml) in %s", strings.Join(paths, ", "))
	}
	return srcs, nil
}

// Load reads and parses the files named by paths (see ReadSources).
func Load(d Defaults, paths ...string) (*Config, error) {
	srcs, err := ReadSources(paths)
	if err != nil {
		return nil, err
	}
	return Parse(d, srcs...)
}
