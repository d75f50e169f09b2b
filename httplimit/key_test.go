package httplimit_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/httplimit"
	"github.com/hybridlimit/ratelimit/local"
)

func request(remote string, xff ...string) *http.Request {
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.RemoteAddr = remote
	for _, v := range xff {
		r.Header.Add("X-Forwarded-For", v)
	}
	return r
}

func TestClientIP(t *testing.T) {
	proxies := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("fd00::/8")}
	for _, c := range []struct {
		name    string
		trusted []netip.Prefix
		remote  string
		xff     []string
		want    string
	}{
		{"peer", nil, "203.0.113.9:5000", nil, "203.0.113.9"},
		{"no trusted proxies: forwarding ignored", nil, "203.0.113.9:5000", []string{"198.51.100.1"}, "203.0.113.9"},
		{"untrusted peer cannot spoof", proxies, "203.0.113.9:5000", []string{"198.51.100.1"}, "203.0.113.9"},
		{"untrusted peer naming a trusted proxy", proxies, "203.0.113.9:5000", []string{"10.0.0.7"}, "203.0.113.9"},
		{"trusted proxy", proxies, "10.0.0.1:5000", []string{"198.51.100.1"}, "198.51.100.1"},
		{"rightmost untrusted, spoofed entries left of it ignored", proxies, "10.0.0.1:5000",
			[]string{"6.6.6.6, 7.7.7.7, 198.51.100.1"}, "198.51.100.1"},
		{"chain of trusted proxies", proxies, "10.0.0.1:5000", []string{"6.6.6.6, 198.51.100.1, 10.0.0.3, 10.0.0.2"}, "198.51.100.1"},
		{"several header lines, last line last", proxies, "10.0.0.1:5000", []string{"6.6.6.6", "198.51.100.1 , 10.0.0.2"}, "198.51.100.1"},
		{"several header lines, client in an earlier one", proxies, "10.0.0.1:5000", []string{"6.6.6.6, 198.51.100.1", "10.0.0.2"}, "198.51.100.1"},
		{"garbage left of the client never read", proxies, "10.0.0.1:5000", []string{"garbage, 198.51.100.1"}, "198.51.100.1"},
		{"every hop trusted: the leftmost", proxies, "10.0.0.1:5000", []string{"10.0.0.3, 10.0.0.2"}, "10.0.0.3"},
		{"trusted proxy without the header", proxies, "10.0.0.1:5000", nil, "10.0.0.1"},
		{"empty entries skipped", proxies, "10.0.0.1:5000", []string{"198.51.100.1,, "}, "198.51.100.1"},
		{"entry with a port", proxies, "10.0.0.1:5000", []string{"198.51.100.1:4711"}, "198.51.100.1"},
		{"IPv6 peer keyed by /64", nil, "[2001:db8:1:2:aaaa::1]:443", nil, "2001:db8:1:2::/64"},
		{"IPv6 neighbour in the same /64", nil, "[2001:db8:1:2:ffff:ffff:ffff:ffff]:443", nil, "2001:db8:1:2::/64"},
		{"IPv6 with a zone", nil, "[fe80::1%eth0]:443", nil, "fe80::/64"},
		{"IPv6 client through a trusted IPv6 proxy", proxies, "[fd00::1]:443", []string{"2001:db8:9:9::5"}, "2001:db8:9:9::/64"},
		{"IPv6 entry in brackets with a port", proxies, "10.0.0.1:5000", []string{"[2001:db8:9:9::5]:80"}, "2001:db8:9:9::/64"},
		{"IPv6 entry in brackets", proxies, "10.0.0.1:5000", []string{"[2001:db8:9:9::5]"}, "2001:db8:9:9::/64"},
		{"IPv4-mapped peer is IPv4", nil, "[::ffff:192.0.2.1]:80", nil, "192.0.2.1"},
		{"IPv4-mapped trusted prefix", []netip.Prefix{netip.MustParsePrefix("::ffff:10.0.0.0/104")}, "10.1.2.3:80", []string{"198.51.100.1"}, "198.51.100.1"},
		{"unmasked trusted prefix", []netip.Prefix{netip.MustParsePrefix("10.1.2.3/8")}, "10.9.9.9:80", []string{"198.51.100.1"}, "198.51.100.1"},
		{"bare RemoteAddr", nil, "192.0.2.1", nil, "192.0.2.1"},
		{"non-canonical IPv4 text", nil, "[::ffff:c000:0201]:1", nil, "192.0.2.1"},
	} {
		t.Run(c.name, func(t *testing.T) {
			key, err := httplimit.ClientIP(c.trusted...)(request(c.remote, c.xff...))
			require.NoError(t, err)
			require.Equal(t, c.want, key)
		})
	}
}

func TestClientIPErrors(t *testing.T) {
	proxies := netip.MustParsePrefix("10.0.0.0/8")
	for _, c := range []struct {
		name    string
		trusted []netip.Prefix
		remote  string
		xff     []string
		want    error
	}{
		{"unix socket peer", nil, "@", nil, httplimit.ErrKey},
		{"empty peer", nil, "", nil, httplimit.ErrKey},
		{"host name peer", nil, "example.com:80", nil, httplimit.ErrKey},
		{"proxy wrote unknown", []netip.Prefix{proxies}, "10.0.0.1:1", []string{"unknown"}, httplimit.ErrKey},
		{"invalid trusted prefix", []netip.Prefix{{}}, "10.0.0.1:1", nil, ratelimit.ErrInvalidOption},
	} {
		t.Run(c.name, func(t *testing.T) {
			key, err := httplimit.ClientIP(c.trusted...)(request(c.remote, c.xff...))
			require.ErrorIs(t, err, c.want)
			require.Empty(t, key)
		})
	}
}

// Keying by an IPv4 peer or by a header value allocates nothing.
func TestKeyAllocations(t *testing.T) {
	ip := httplimit.ClientIP(netip.MustParsePrefix("10.0.0.0/8"))
	direct := request("203.0.113.9:5000")
	proxied := request("10.0.0.1:5000", "198.51.100.1, 10.0.0.2")
	hdr := httplimit.Header("X-API-Key")
	withKey := request("203.0.113.9:5000")
	withKey.Header.Set("X-API-Key", "k-123")
	for name, f := range map[string]func(){
		"ClientIP direct":  func() { _, _ = ip(direct) },
		"ClientIP proxied": func() { _, _ = ip(proxied) },
		"Header":           func() { _, _ = hdr(withKey) },
	} {
		require.Zero(t, testing.AllocsPerRun(100, f), name)
	}
}

// Through a real server and client (the peer is 127.0.0.1): without trusted
// proxies X-Forwarded-For changes nothing; with loopback trusted it keys the
// request, rightmost untrusted address first.
func TestClientIPThroughServer(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	newLim := func() ratelimit.Limiter {
		lim, err := local.New(ratelimit.PerMinute(2), local.WithAlgorithm(ratelimit.FixedWindow), local.WithClock(func() time.Time { return now }))
		require.NoError(t, err)
		return lim
	}

	t.Run("untrusted peer", func(t *testing.T) {
		srv, rec := serve(t, newLim())
		for i, xff := range []string{"198.51.100.1", "198.51.100.2", "198.51.100.3"} {
			r := get(t, srv, "X-Forwarded-For", xff)
			require.Equal(t, "127.0.0.1", rec.last(t).Key)
			require.Equal(t, i < 2, r.status == http.StatusOK, "request %d: one quota whatever the header", i)
		}
	})

	t.Run("trusted proxy", func(t *testing.T) {
		srv, rec := serve(t, newLim(), httplimit.WithKey(httplimit.ClientIP(netip.MustParsePrefix("127.0.0.0/8"))))
		for _, c := range []struct {
			xff, key string
			status   int
		}{
			{"198.51.100.1", "198.51.100.1", 200},
			{"198.51.100.1", "198.51.100.1", 200},
			{"198.51.100.1", "198.51.100.1", 429},
			{"198.51.100.2", "198.51.100.2", 200},               // another client, another quota
			{"198.51.100.2, 127.0.0.9", "198.51.100.2", 200},    // a trusted hop skipped
			{"198.51.100.2, 198.51.100.3", "198.51.100.3", 200}, // spoofing 198.51.100.2 by prepending does not work
			{"2001:db8:7:7::1", "2001:db8:7:7::/64", 200},
			{"2001:db8:7:7::2", "2001:db8:7:7::/64", 200},
			{"2001:db8:7:7:ffff::3", "2001:db8:7:7::/64", 429}, // the same /64
		} {
			r := get(t, srv, "X-Forwarded-For", c.xff)
			require.Equal(t, c.key, rec.last(t).Key, "X-Forwarded-For %q", c.xff)
			require.Equal(t, c.status, r.status, "X-Forwarded-For %q", c.xff)
		}
	})
}

func TestHeaderKey(t *testing.T) {
	k := httplimit.Header("x-api-key")
	r := request("192.0.2.1:1")
	_, err := k(r)
	require.ErrorIs(t, err, httplimit.ErrKey, "a missing header is an error, not an empty key")
	require.ErrorContains(t, err, "X-Api-Key")
	r.Header.Set("X-API-Key", "")
	_, err = k(r)
	require.ErrorIs(t, err, httplimit.ErrKey)
	r.Header.Set("X-API-Key", "k1")
	r.Header.Add("X-API-Key", "k2")
	key, err := k(r)
	require.NoError(t, err)
	require.Equal(t, "k1", key)

	for _, bad := range []string{"", " ", "X Key", "X:Key"} {
		_, err := httplimit.Header(bad)(r)
		require.ErrorIs(t, err, ratelimit.ErrInvalidOption, "Header(%q)", bad)
	}
}

func TestJoinAndStatic(t *testing.T) {
	r := request("192.0.2.1:1")
	r.Header.Set("X-User", "u1")
	key, err := httplimit.Join(httplimit.Static("POST /rides"), httplimit.Header("X-User"), httplimit.ClientIP())(r)
	require.NoError(t, err)
	require.Equal(t, "POST /rides|u1|192.0.2.1", key)

	// Escaping keeps distinct combinations distinct.
	a, err := httplimit.Join(httplimit.Static("a|b"), httplimit.Static("c"))(r)
	require.NoError(t, err)
	b, err := httplimit.Join(httplimit.Static("a"), httplimit.Static("b|c"))(r)
	require.NoError(t, err)
	c, err := httplimit.Join(httplimit.Static(`a\`), httplimit.Static("b|c"))(r)
	require.NoError(t, err)
	require.Equal(t, `a\|b|c`, a)
	require.Equal(t, `a|b\|c`, b)
	require.Equal(t, `a\\|b\|c`, c)

	_, err = httplimit.Join(httplimit.Static("r"), httplimit.Header("X-Missing"))(r)
	require.ErrorIs(t, err, httplimit.ErrKey)
	empty := func(*http.Request) (string, error) { return "", nil }
	_, err = httplimit.Join(httplimit.Static("r"), empty)(r)
	require.Error(t, err)
	failing := errors.New("lookup failed")
	_, err = httplimit.Join(func(*http.Request) (string, error) { return "", failing })(r)
	require.ErrorIs(t, err, failing)

	for name, k := range map[string]httplimit.KeyFunc{
		"Join()":       httplimit.Join(),
		"Join(nil)":    httplimit.Join(httplimit.Static("a"), nil),
		"Static(\"\")": httplimit.Static(""),
	} {
		_, err := k(r)
		require.ErrorIs(t, err, ratelimit.ErrInvalidOption, name)
	}
}
