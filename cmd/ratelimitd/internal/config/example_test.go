package config_test

import (
	"fmt"

	"github.com/hybridlimit/ratelimit/cmd/ratelimitd/internal/config"
)

func ExampleLookup() {
	src := `
domain: messaging
descriptors:
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit: {unit: day, requests_per_unit: 5}
  - key: to_number
    rate_limit: {unit: day, requests_per_unit: 100, mode: exact}
`
	c, err := config.Parse(config.Defaults{}, config.Source{Name: "messaging.yaml", Data: []byte(src)})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, desc := range [][]entry{
		{{"message_type", "marketing"}, {"to_number", "2061111111"}},
		{{"to_number", "2061111111"}},
		{{"message_type", "marketing"}},
	} {
		m := config.Lookup(c.Domain("messaging"), desc)
		if m.Rule == nil {
			fmt.Println("no rule")
			continue
		}
		fmt.Printf("%s: %d per %s, %s\n", m.Rule.Path, m.Rule.RequestsPerUnit, m.Rule.Unit, m.Rule.Mode)
	}
	_, err = config.Parse(config.Defaults{}, config.Source{Name: "bad.yaml", Data: []byte("domain: x\ndescriptors:\n  - key: a\n    rate_limit: {unit: weekly, requests_per_unit: 1}\n")})
	fmt.Println(err)
	// Output:
	// message_type_marketing.to_number: 5 per DAY, strict
	// to_number: 100 per DAY, exact
	// no rule
	// bad.yaml:4: unit: unknown unit "weekly" (want second, minute, hour, day, week, month or year)
}

// Several limits on one descriptor, decided together: a burst bucket, a
// per-minute and a per-day window. A mistake names its file and line.
func ExampleRule_AllLimits() {
	src := `
domain: api
descriptors:
  - key: api_key
    rate_limits:
      - {unit: second, requests_per_unit: 20, algorithm: token_bucket, name: burst}
      - {unit: minute, requests_per_unit: 600}
      - {unit: day, requests_per_unit: 10000, failure_mode: closed}
`
	c, err := config.Parse(config.Defaults{}, config.Source{Name: "api.yaml", Data: []byte(src)})
	if err != nil {
		fmt.Println(err)
		return
	}
	r := config.Lookup(c.Domain("api"), []entry{{"api_key", "k-1"}}).Rule
	fmt.Printf("%s: mode %s, failure mode %s\n", r.Path, r.Mode, r.FailureMode)
	for _, l := range r.AllLimits() {
		fmt.Printf("  %d per %s, %s %q (line %d)\n", l.RequestsPerUnit, l.Unit, config.AlgorithmName(l.Algorithm), l.Name, l.Line)
	}
	bad := src + "      - {unit: minute, requests_per_unit: 1000}\n"
	_, err = config.Parse(config.Defaults{}, config.Source{Name: "api.yaml", Data: []byte(bad)})
	fmt.Println(err)
	// Output:
	// api_key: mode strict, failure mode closed
	//   20 per SECOND, token_bucket "burst" (line 6)
	//   600 per MINUTE, fixed_window "" (line 7)
	//   10000 per DAY, fixed_window "" (line 8)
	// api.yaml:9: rate_limits: a second fixed_window limit per minute (first on line 7): merge them into one
}
