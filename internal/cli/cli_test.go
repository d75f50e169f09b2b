package cli

import (
	"bytes"
	"errors"
	"flag"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	fs := NewFlagSet("cmd")
	n := fs.Int("n", 1, "a number")
	if err := Parse(fs, []string{"-n", "3"}, nil); err != nil || *n != 3 {
		t.Fatalf("Parse: %v, n = %d", err, *n)
	}

	var out bytes.Buffer
	fs = NewFlagSet("cmd")
	fs.Int("n", 1, "a number")
	if err := Parse(fs, []string{"-h"}, &out); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: %v", err)
	}
	if s := out.String(); !strings.HasPrefix(s, "usage: cmd [flags]\n") || !strings.Contains(s, "a number") {
		t.Fatalf("usage printed: %q", s)
	}

	fs = NewFlagSet("cmd")
	if err := Parse(fs, []string{"extra"}, nil); err == nil || !strings.Contains(err.Error(), `unexpected arguments ["extra"]`) {
		t.Fatalf("positional argument: %v", err)
	}
	fs = NewFlagSet("cmd")
	if err := Parse(fs, []string{"-nope"}, &out); err == nil {
		t.Fatal("an unknown flag is an error")
	}
}

func TestRedisAddrs(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
		err  bool
	}{
		{"", nil, false},
		{"127.0.0.1:6379", []string{"127.0.0.1:6379"}, false},
		{"h1:7000, h2:7001,h3:7002", []string{"h1:7000", "h2:7001", "h3:7002"}, false},
		{"h1:7000,,h2:7001", nil, true},
		{" ", nil, true},
	} {
		got, err := RedisAddrs(tc.in)
		if (err != nil) != tc.err || strings.Join(got, "|") != strings.Join(tc.want, "|") {
			t.Errorf("RedisAddrs(%q) = %q, %v", tc.in, got, err)
		}
	}
}
