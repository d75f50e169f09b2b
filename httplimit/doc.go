// Package httplimit is net/http middleware that rate-limits requests with any
// ratelimit.Limiter (local, global or hybrid).
//
// For each request the middleware derives a key (by default the client's IP
// address, see ClientIP), asks the limiter for a decision of one event (or the
// cost given by WithCost), writes the rate-limit response headers and then
// either calls the next handler or answers 429 Too Many Requests:
//
//	lim, err := hybrid.New(client, ratelimit.PerMinute(100))
//	...
//	mw := httplimit.New(lim, httplimit.WithKey(httplimit.Header("X-API-Key")))
//	http.ListenAndServe(":8080", mw(apiHandler))
//
// # Headers
//
// By default every response the limiter decided carries
//
//	X-RateLimit-Limit      the quota: Decision.Limit.Capacity(Decision.Algorithm), or WithQuota's
//	X-RateLimit-Remaining  Decision.Remaining
//	X-RateLimit-Reset      Unix time, in seconds rounded up, when the quota is full again (now + Decision.ResetAfter)
//	RateLimit-Policy       "<name>";q=<quota>;w=<window seconds>
//	RateLimit              "<name>";r=<remaining>;t=<seconds until reset, rounded up>
//
// and a denied one also Retry-After: Decision.RetryAfter in whole seconds,
// rounded up, never 0. RateLimit-Policy and RateLimit are the structured
// fields of draft-ietf-httpapi-ratelimit-headers; WithHeaders selects which
// sets are sent. The quota is the capacity Remaining counts down from: Rate
// for the window algorithms, Burst (or Rate when Burst is 0) for TokenBucket
// and GCRA.
//
// # Several limits
//
// A limiter of several limits on each key (a ratelimit.MultiLimiter, such
// as local.NewMulti, global.NewMulti or hybrid.NewMulti: per second, per
// minute and per day, all or nothing) is one policy per limit: one member
// per limit, in the limiter's order, in each of RateLimit-Policy and
// RateLimit, with that limit's quota (its capacity), window, remaining and
// reset:
//
//	RateLimit-Policy: "default-1s";q=20;w=1, "default-60s";q=600;w=60, "default-86400s";q=10000;w=86400
//	RateLimit: "default-1s";r=19;t=1, "default-60s";r=412;t=37, "default-86400s";r=8211;t=40213
//
// Each policy is named after the policy name (WithPolicyName) and the
// limit's period in seconds, the w it advertises: "<name>-<seconds>s"
// ("<name>-1500ms" for a period of no whole seconds; two limits of one
// period also get their algorithm, "<name>-1s-token_bucket"). Names derived
// so stay the same as long as the limits do, whatever their order of
// tightness. WithPolicyNames names each limit instead.
//
// X-RateLimit-Limit, X-RateLimit-Remaining, X-RateLimit-Reset and
// Retry-After describe the tightest limit, the one the Decision itself
// describes (see ratelimit.Combine): the least remaining when the request
// is allowed; when it is denied, the denying limit whose RetryAfter is the
// latest, so Retry-After is when every limit admits the request again. A
// MultiLimiter of one limit writes exactly what a Limiter of that limit
// writes. A Limiter that is not a MultiLimiter but whose decisions list
// several limits (Decision.Limits) gets the same headers.
//
// # Errors
//
// The middleware never lets a request through without a decision, except in
// shadow mode, and never panics on a request. Each failure reaches the
// observer (WithObserver) as an OutcomeError event and then the error handler
// (WithErrorHandler), whose default (DefaultError) answers with a JSON body
// {"error":"<code>"}:
//
//	cause                                    Event.Err wraps              status code
//	the key cannot be derived                ErrKey                       400    rate_limit_key_invalid
//	bad configuration: New's arguments, or   ratelimit.ErrInvalidOption   500    rate_limit_misconfigured
//	  a KeyFunc built from bad arguments
//	the request's context has ended          ErrCanceled                  503    request_canceled
//	the limiter rejects the cost             ErrLimiter and               500    rate_limit_misconfigured
//	                                           ratelimit.ErrInvalidN
//	any other limiter error                  ErrLimiter                   503    rate_limiter_unavailable
//
// A request whose context has already ended is not decided: it spends no
// quota.
//
// A limiter error fails closed: the request is not served. Failing open is
// the limiter's choice, not the middleware's: a Redis outage need not reach
// the middleware at all, since the hybrid limiter decides by its
// ratelimit.FailureMode (FailLocal by default) with a nil error, and a global
// limiter does so when given global.WithFailureMode; a service that prefers
// to serve everything during an outage sets ratelimit.FailOpen there, where
// the limiter also bounds and reports it. An error that still reaches the
// middleware is a closed limiter (shutdown), a global limiter without a
// failure mode, or a cost out of range: serving the request anyway would
// lift the limit without anyone noticing.
//
// # Shadow mode
//
// WithShadow makes the middleware decide, write the headers (all but
// Retry-After) and report every outcome to the observer, but serve every
// request, denied or failed: a new rule can be tried on production traffic
// before it is enforced.
//
// # Concurrency
//
// The middleware returned by New, and the handlers it wraps, are safe for
// concurrent use. The hooks (KeyFunc, cost, observer, denied and error
// handlers) are called on the request's goroutine and must be safe for
// concurrent use. An allowed request costs the middleware two small
// allocations (the header values) beyond what the limiter and the key
// function allocate, whether it lists one policy or several; ClientIP and
// Header allocate nothing for an IPv4 peer or a header value. A
// MultiLimiter decides into a buffer from a sync.Pool (AllowNInto), so
// the state of its limits costs no allocation either; that buffer is
// reused once the observer and the denied handler have returned, so that
// Event.Decision.Limits is valid only until then (see Event).
package httplimit
