package option_test

import (
	"errors"
	"io"
	"reflect"
	"testing"

	"github.com/hybridlimit/ratelimit"
	"github.com/hybridlimit/ratelimit/internal/option"
)

// A package's option plumbing as local, global, hybrid and sync write it.
type config struct {
	n     int
	trace []string
}

type Option interface{ apply(*config) error }

type optionFunc func(*config) error

func (f optionFunc) apply(c *config) error { return f(c) }

func withN(n int) Option {
	return optionFunc(func(c *config) error {
		c.trace = append(c.trace, "n")
		if n < 0 {
			return option.Invalid("n must be >= 0, got %d", n)
		}
		c.n = n
		return nil
	})
}

func TestApplyInOrderLaterWins(t *testing.T) {
	var c config
	if err := option.Apply(&c, []Option{withN(1), withN(2), withN(3)}, Option.apply); err != nil {
		t.Fatal(err)
	}
	if c.n != 3 || len(c.trace) != 3 {
		t.Fatalf("got n = %d after %v, want 3 after 3 options", c.n, c.trace)
	}
}

func TestApplyIgnoresNil(t *testing.T) {
	var c config
	err := option.Apply(&c, []Option{nil, withN(4), nil}, Option.apply)
	if err != nil {
		t.Fatalf("nil Options: %v, want them ignored", err)
	}
	if c.n != 4 || !reflect.DeepEqual(c.trace, []string{"n"}) {
		t.Fatalf("got n = %d after %v, want 4 after one option", c.n, c.trace)
	}
	if err := option.Apply(&c, []Option{nil}, Option.apply); err != nil || c.n != 4 {
		t.Fatalf("only nil: err %v, n %d; want nil, 4 untouched", err, c.n)
	}
	if err := option.Apply[config, Option](&c, nil, Option.apply); err != nil || c.n != 4 {
		t.Fatalf("no options: err %v, n %d; want nil, 4 untouched", err, c.n)
	}
}

func TestApplyStopsAtFirstError(t *testing.T) {
	c := config{n: 7}
	err := option.Apply(&c, []Option{withN(-1), withN(-2), withN(5)}, Option.apply)
	if !errors.Is(err, ratelimit.ErrInvalidOption) {
		t.Fatalf("got %v, want an error wrapping ErrInvalidOption", err)
	}
	if want := ratelimit.ErrInvalidOption.Error() + ": n must be >= 0, got -1"; err.Error() != want {
		t.Fatalf("got %q, want the first bad option's %q", err, want)
	}
	if c.n != 7 || len(c.trace) != 1 {
		t.Fatalf("got n = %d after %v; want 7 and no option applied after the bad one", c.n, c.trace)
	}
}

func TestInvalid(t *testing.T) {
	err := option.Invalid("timeout must be > 0, got %v", -3)
	if !errors.Is(err, ratelimit.ErrInvalidOption) {
		t.Fatalf("%v does not wrap ErrInvalidOption", err)
	}
	if want := ratelimit.ErrInvalidOption.Error() + ": timeout must be > 0, got -3"; err.Error() != want {
		t.Fatalf("got %q, want %q", err, want)
	}
	// No args: the format is text, and %w in it may wrap a cause as well.
	if err := option.Invalid("empty instance id"); err.Error() != ratelimit.ErrInvalidOption.Error()+": empty instance id" {
		t.Fatalf("got %q", err)
	}
	err = option.Invalid("reading: %w", io.EOF)
	if !errors.Is(err, io.EOF) || !errors.Is(err, ratelimit.ErrInvalidOption) {
		t.Fatalf("%v wraps not both ErrInvalidOption and io.EOF", err)
	}
}
