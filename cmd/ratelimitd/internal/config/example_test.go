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
