package httplimit_test

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// A strict parser of RFC 8941 structured-field Lists of Items, enough to
// check that RateLimit-Policy and RateLimit parse as structured fields:
// Integers, Strings, Tokens and Booleans, with parameters. Inner lists,
// Decimals and Byte Sequences are rejected (the middleware never sends them).

type sfToken string

type sfParam struct {
	key   string
	value any
}

type sfItem struct {
	value  any
	params []sfParam
}

type sfParser struct {
	s string
	i int
}

func parseSFList(s string) ([]sfItem, error) {
	p := &sfParser{s: s}
	p.skip(" ")
	var items []sfItem
	for p.i < len(p.s) {
		it, err := p.item()
		if err != nil {
			return nil, err
		}
		items = append(items, it)
		p.skip(" \t")
		if p.i == len(p.s) {
			return items, nil
		}
		if p.s[p.i] != ',' {
			return nil, fmt.Errorf("at %d: want ',' after a list member, got %q", p.i, p.s[p.i])
		}
		p.i++
		p.skip(" \t")
		if p.i == len(p.s) {
			return nil, errors.New("trailing comma")
		}
	}
	return items, nil
}

func (p *sfParser) skip(chars string) {
	for p.i < len(p.s) && strings.IndexByte(chars, p.s[p.i]) >= 0 {
		p.i++
	}
}

func (p *sfParser) item() (sfItem, error) {
	v, err := p.bareItem()
	if err != nil {
		return sfItem{}, err
	}
	it := sfItem{value: v}
	for p.i < len(p.s) && p.s[p.i] == ';' {
		p.i++
		p.skip(" ")
		k, err := p.key()
		if err != nil {
			return sfItem{}, err
		}
		var pv any = true
		if p.i < len(p.s) && p.s[p.i] == '=' {
			p.i++
			if pv, err = p.bareItem(); err != nil {
				return sfItem{}, err
			}
		}
		it.params = append(it.params, sfParam{k, pv})
	}
	return it, nil
}

func (p *sfParser) key() (string, error) {
	start := p.i
	if p.i >= len(p.s) || !(p.s[p.i] >= 'a' && p.s[p.i] <= 'z' || p.s[p.i] == '*') {
		return "", fmt.Errorf("at %d: a key starts with lcalpha or '*'", p.i)
	}
	for p.i < len(p.s) && (p.s[p.i] >= 'a' && p.s[p.i] <= 'z' || p.s[p.i] >= '0' && p.s[p.i] <= '9' || strings.IndexByte("_-.*", p.s[p.i]) >= 0) {
		p.i++
	}
	return p.s[start:p.i], nil
}

func (p *sfParser) bareItem() (any, error) {
	if p.i >= len(p.s) {
		return nil, errors.New("empty item")
	}
	switch c := p.s[p.i]; {
	case c == '-' || c >= '0' && c <= '9':
		start := p.i
		if c == '-' {
			p.i++
		}
		digits := p.i
		for p.i < len(p.s) && p.s[p.i] >= '0' && p.s[p.i] <= '9' {
			p.i++
		}
		if n := p.i - digits; n == 0 || n > 15 {
			return nil, fmt.Errorf("at %d: an integer has 1 to 15 digits", start)
		}
		if p.i < len(p.s) && p.s[p.i] == '.' {
			return nil, fmt.Errorf("at %d: decimals not expected", p.i)
		}
		return strconv.ParseInt(p.s[start:p.i], 10, 64)
	case c == '"':
		p.i++
		var b strings.Builder
		for p.i < len(p.s) {
			c := p.s[p.i]
			p.i++
			switch {
			case c == '\\':
				if p.i >= len(p.s) || (p.s[p.i] != '"' && p.s[p.i] != '\\') {
					return nil, errors.New("bad escape in string")
				}
				b.WriteByte(p.s[p.i])
				p.i++
			case c == '"':
				return b.String(), nil
			case c < 0x20 || c > 0x7e:
				return nil, fmt.Errorf("character %#x not allowed in a string", c)
			default:
				b.WriteByte(c)
			}
		}
		return nil, errors.New("unterminated string")
	case c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '*':
		start := p.i
		for p.i < len(p.s) && (isTchar(p.s[p.i]) || p.s[p.i] == ':' || p.s[p.i] == '/') {
			p.i++
		}
		return sfToken(p.s[start:p.i]), nil
	case c == '?':
		if p.i+1 < len(p.s) && (p.s[p.i+1] == '0' || p.s[p.i+1] == '1') {
			p.i += 2
			return p.s[p.i-1] == '1', nil
		}
		return nil, errors.New("bad boolean")
	}
	return nil, fmt.Errorf("at %d: unexpected %q", p.i, p.s[p.i])
}

func isTchar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

func TestSFParser(t *testing.T) {
	items, err := parseSFList(`"a \"b\"";q=10;w=60, tok;r=-1;x, "";t=?0`)
	require.NoError(t, err)
	require.Len(t, items, 3)
	require.Equal(t, `a "b"`, items[0].value)
	require.Equal(t, []sfParam{{"q", int64(10)}, {"w", int64(60)}}, items[0].params)
	require.Equal(t, sfToken("tok"), items[1].value)
	require.Equal(t, []sfParam{{"r", int64(-1)}, {"x", true}}, items[1].params)
	require.Equal(t, "", items[2].value)
	require.Equal(t, []sfParam{{"t", false}}, items[2].params)

	for _, bad := range []string{`"open`, `"a",`, `"a";Q=1`, `"a";q=`, `"a\x"`, `"a" "b"`, `"a";q=1234567890123456`, `"a";q=1.5`, "\"a\tb\""} {
		_, err := parseSFList(bad)
		require.Error(t, err, "%q must not parse", bad)
	}
}
