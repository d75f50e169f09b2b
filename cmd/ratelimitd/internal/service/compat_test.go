package service

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/hybridlimit/ratelimit/cmd/ratelimitd/internal/config"
)

// envoyproxy/ratelimit's behaviours that give hits back (a check of
// hits_addend 0, STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT) go through the
// limiters' reservations, whatever the backend: here the memory one, on
// its clock.
func TestCompatGiveBackOnMemory(t *testing.T) {
	t.Run("hits_addend 0 checks", func(t *testing.T) {
		m := memService(t, decideConfig, nil)
		check, debit := dsc("b", "x"), dsc("b", "x")
		check.HitsAddend = wrapperspb.UInt64(0)
		// b: 2 a minute; a check is OK while one more hit fits, and counts nothing
		for i, want := range []string{"OK:OK/2", "OK:OK/1", "OVER_LIMIT:OVER_LIMIT/0"} {
			expect(t, "check "+string(rune('1'+i)), codesOf(m.call(t, req("d", check))), want)
			m.call(t, req("d", debit))
		}
		expect(t, "the checks counted nothing", codesOf(m.call(t, req("d", dsc("b", "y")))), "OK:OK/1")
	})
	t.Run("stop increment when over limit", func(t *testing.T) {
		m := memService(t, decideConfig, func(o *Options) { o.Compat.StopIncrementWhenOverLimit = true })
		// big: 100 a minute; b: 2 a minute
		for i, want := range []string{"OK:OK/99,OK/1", "OK:OK/98,OK/0", "OVER_LIMIT:OK/98,OVER_LIMIT/0", "OVER_LIMIT:OK/98,OVER_LIMIT/0"} {
			expect(t, "call "+string(rune('1'+i)), codesOf(m.call(t, req("d", dsc("big", "x"), dsc("b", "x")))), want)
		}
		expect(t, "big gave back the hits of the calls over", codesOf(m.call(t, req("d", dsc("big", "x")))), "OK:OK/97")
	})
	t.Run("the migration mode needs Redis", func(t *testing.T) {
		m := memService(t, "", func(o *Options) { o.Compat.EnvoyKeys = true })
		cfg, err := config.Parse(config.Defaults{Mode: config.Exact}, config.Source{Name: "t.yaml", Data: []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n")})
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Apply(cfg); err == nil || !strings.Contains(err.Error(), "t.yaml:4") || !strings.Contains(err.Error(), "memory backend") {
			t.Fatalf("Apply: %v", err)
		}
	})
}
