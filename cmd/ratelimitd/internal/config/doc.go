// Package config reads ratelimitd's rules: the YAML format of
// envoyproxy/ratelimit, as is, plus a few extensions of ratelimitd's own.
//
// A file holds one domain and a tree of descriptors:
//
//	domain: messaging
//	descriptors:
//	  - key: message_type
//	    value: marketing
//	    descriptors:
//	      - key: to_number
//	        rate_limit: {unit: day, requests_per_unit: 5}
//	  - key: to_number
//	    rate_limit: {unit: day, requests_per_unit: 100, mode: exact}
//
// Every field envoyproxy/ratelimit reads is read with its meaning there:
// key, value (a trailing, middle or repeated '*' is a wildcard),
// rate_limit {unit, requests_per_unit, unlimited, name, replaces},
// shadow_mode, quota_mode, detailed_metric, value_to_metric,
// share_threshold, metadata (accepted, not used) and nested descriptors.
// The extensions live in the rate_limit block: algorithm (fixed_window, the
// default, sliding_window, token_bucket or gcra; exact mode also takes
// sliding_log), mode (strict, optimistic or exact) and failure_mode (local,
// open or closed). A rule that does not name them gets the Defaults given to
// Parse.
//
// A descriptor may also take rate_limits instead of rate_limit: a list of
// up to ratelimit.MaxLimits limits, each {unit, requests_per_unit,
// algorithm, name}, all enforced on the descriptor together, all or
// nothing (a hit one limit denies is counted by none):
//
//	descriptors:
//	  - key: api_key
//	    rate_limits:
//	      - {unit: second, requests_per_unit: 20, algorithm: token_bucket, name: burst}
//	      - {unit: minute, requests_per_unit: 600}
//	      - {unit: day, requests_per_unit: 10000, mode: exact}
//
// One limiter decides them, so they share one mode and one failure mode,
// given on any item (the same wherever given); replaces may be given on any
// item, and a replaces naming any item's name replaces the whole rule. Two
// limits of one algorithm and unit, requests_per_unit 0 and unlimited are
// errors in a list; a list of one limit is a rate_limit block. The rule's
// Limits lists them (see Rule).
//
// Matching follows envoyproxy/ratelimit: at each level of a request's
// descriptor, an entry matches the descriptor with the same key and value
// first, then the first wildcard value that matches, then the descriptor
// with the key alone; a rule applies only when the request has exactly as
// many entries as the rule is deep.
//
// Parse checks everything before anything is used: an unknown field, a value
// of the wrong type, an unknown unit, a duplicate descriptor or domain, a
// limit that cannot be counted exactly, all are errors that name the file,
// the line and the field (see Error). What envoyproxy/ratelimit loads with a
// silent meaning (a rate_limit without requests_per_unit, a known field in a
// block that does not take it, a second YAML document) is read with that
// meaning and listed in Config.Warnings, or refused with Options.Strict. A
// fixed-window limit may be any uint32 per any unit, in every mode, as
// envoyproxy/ratelimit takes it (Limit.ValidateFor: the hybrid limiter
// takes them too). YAML anchors and aliases are read, and expanded
// where used, within Options.Limits: past MaxRules rules, or 5 times as many
// descriptors, with aliases expanded, the load stops at once (an alias bomb
// never costs more); ParseContext stops it when its context ends. A Config
// is immutable once made and safe for concurrent use.
package config
