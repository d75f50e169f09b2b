package httplimit

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/textproto"
	"strings"
)

// A KeyFunc derives the rate-limit key of a request: requests with the same
// key share one quota. An error, or an empty key, means the request cannot
// be keyed; the middleware then answers through the error handler with an
// error wrapping ErrKey (400 by default) rather than letting it through.
type KeyFunc func(*http.Request) (string, error)

// ClientIP returns a KeyFunc that keys a request by its client's IP address:
// an IPv4 address as such ("192.0.2.7"), an IPv6 address by its /64 prefix
// ("2001:db8:1:2::/64"), since one subscriber usually holds a whole /64.
//
// The client is the peer of the connection (Request.RemoteAddr), unless the
// peer is in one of the trusted prefixes: a proxy of your own. Then
// X-Forwarded-For is read from the right (the entry the trusted peer
// appended) to the left, skipping every trusted address, and the first
// address that is not trusted is the client. A client can prepend anything to
// X-Forwarded-For, but not remove what the proxies appended after it, so it
// cannot choose its key. With no trusted prefixes, forwarding headers are
// ignored: the peer is the client. The Forwarded header (RFC 7239) is not
// read.
//
// When every address is trusted (a request from inside), the leftmost one is
// the key. The key function fails, with an error wrapping ErrKey, when
// RemoteAddr is not an IP address (a Unix socket listener), or when an entry
// the trusted proxies appended is not one (a proxy writing "unknown"). A
// trusted prefix that is not valid makes every request fail with an error
// wrapping ratelimit.ErrInvalidOption.
//
// Keying an IPv4 peer allocates nothing.
func ClientIP(trusted ...netip.Prefix) KeyFunc {
	ts := make([]netip.Prefix, 0, len(trusted))
	for _, p := range trusted {
		if !p.IsValid() {
			return failing(invalid("ClientIP: trusted prefix %v is not valid", p))
		}
		p = p.Masked()
		if a := p.Addr(); a.Is4In6() && p.Bits() >= 96 {
			p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
		}
		ts = append(ts, p)
	}
	isTrusted := func(a netip.Addr) bool {
		for _, p := range ts {
			if p.Contains(a) {
				return true
			}
		}
		return false
	}
	return func(r *http.Request) (string, error) {
		text, addr, ok := parsePeer(r.RemoteAddr)
		if !ok {
			return "", fmt.Errorf("%w: the peer address %q is not an IP address", ErrKey, r.RemoteAddr)
		}
		if len(ts) == 0 || !isTrusted(addr) {
			return addrKey(text, addr), nil
		}
		// Header lines in order, entries in a line left to right: walk both
		// backwards.
		xff := r.Header["X-Forwarded-For"]
	walk:
		for i := len(xff) - 1; i >= 0; i-- {
			for line := xff[i]; line != ""; {
				entry := line
				if j := strings.LastIndexByte(line, ','); j >= 0 {
					entry, line = line[j+1:], line[:j]
				} else {
					line = ""
				}
				if entry = strings.TrimSpace(entry); entry == "" {
					continue
				}
				a, ok := parseForwarded(entry)
				if !ok {
					return "", fmt.Errorf("%w: X-Forwarded-For entry %q, appended by a trusted proxy, is not an IP address", ErrKey, entry)
				}
				text, addr = entry, a
				if !isTrusted(addr) {
					break walk
				}
			}
		}
		return addrKey(text, addr), nil
	}
}

// parsePeer parses RemoteAddr: "ip:port", "[ipv6]:port" or a bare address.
// It returns the address text as written and the address, unmapped and
// without zone. The port is not parsed: it does not matter.
func parsePeer(s string) (string, netip.Addr, bool) {
	host, _, err := net.SplitHostPort(s)
	if err != nil {
		host = s
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return "", netip.Addr{}, false
	}
	return host, clean(a), true
}

// parseForwarded parses one X-Forwarded-For entry: an address, possibly
// with a port or in brackets, as some proxies write it.
func parseForwarded(s string) (netip.Addr, bool) {
	if a, err := netip.ParseAddr(s); err == nil {
		return clean(a), true
	}
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return clean(ap.Addr()), true
	}
	if len(s) > 2 && s[0] == '[' && s[len(s)-1] == ']' {
		if a, err := netip.ParseAddr(s[1 : len(s)-1]); err == nil {
			return clean(a), true
		}
	}
	return netip.Addr{}, false
}

func clean(a netip.Addr) netip.Addr { return a.Unmap().WithZone("") }

// addrKey returns the key of a client address: the IPv4 address, reusing
// text when it already is its canonical form, or the IPv6 /64 prefix.
func addrKey(text string, a netip.Addr) string {
	if a.Is4() {
		var buf [15]byte
		if string(a.AppendTo(buf[:0])) == text {
			return text
		}
		return a.String()
	}
	p, _ := a.Prefix(64) // an IPv6 address always has a /64
	return p.String()
}

// Header returns a KeyFunc that keys a request by the value of the named
// header, for example an API key: "X-API-Key". A request without the header,
// or with an empty value, cannot be keyed (an error wrapping ErrKey); it is
// never keyed by the empty string. Only the first value counts.
func Header(name string) KeyFunc {
	canon := textproto.CanonicalMIMEHeaderKey(strings.TrimSpace(name))
	if canon == "" || strings.ContainsAny(canon, " \t\r\n:") {
		return failing(invalid("Header(%q): not a header name", name))
	}
	return func(r *http.Request) (string, error) {
		if v := r.Header[canon]; len(v) > 0 && v[0] != "" {
			return v[0], nil
		}
		return "", fmt.Errorf("%w: header %s missing or empty", ErrKey, canon)
	}
}

// Static returns a KeyFunc that keys every request by s: one quota shared by
// every request of the handler it wraps, or, in Join, a fixed part of the key
// such as the route's name.
func Static(s string) KeyFunc {
	if s == "" {
		return failing(invalid("Static(\"\"): empty key"))
	}
	return func(*http.Request) (string, error) { return s, nil }
}

// Join returns a KeyFunc that combines the keys of parts, e.g. a route and a
// user: Join(Static("POST /rides"), Header("X-User-Id")). The parts are
// joined with '|', a '|' or '\' inside a part escaped with '\', so distinct
// combinations never give the same key. The first part that fails fails the
// whole. Join with no parts, or a nil part, fails every request with an error
// wrapping ratelimit.ErrInvalidOption.
func Join(parts ...KeyFunc) KeyFunc {
	if len(parts) == 0 {
		return failing(invalid("Join(): no parts"))
	}
	for i, p := range parts {
		if p == nil {
			return failing(invalid("Join: part %d is nil", i))
		}
	}
	parts = append([]KeyFunc(nil), parts...)
	return func(r *http.Request) (string, error) {
		var keys [8]string
		ks := keys[:0]
		size := len(parts) - 1
		for _, p := range parts {
			k, err := p(r)
			if err == nil && k == "" {
				err = errors.New("a part of the key is empty")
			}
			if err != nil {
				return "", err
			}
			ks = append(ks, k)
			size += len(k)
		}
		var b strings.Builder
		b.Grow(size)
		for i, k := range ks {
			if i > 0 {
				b.WriteByte('|')
			}
			if !strings.ContainsAny(k, `|\`) {
				b.WriteString(k)
				continue
			}
			for j := 0; j < len(k); j++ {
				if k[j] == '|' || k[j] == '\\' {
					b.WriteByte('\\')
				}
				b.WriteByte(k[j])
			}
		}
		return b.String(), nil
	}
}

// failing returns a KeyFunc that always returns err: how a KeyFunc built from
// invalid arguments reports them, since it cannot return an error itself.
func failing(err error) KeyFunc {
	return func(*http.Request) (string, error) { return "", err }
}
