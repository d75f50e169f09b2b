// Package cli holds what the project's commands (ratelimit-sim,
// ratelimit-surge) share: running run(ctx) with a context canceled by
// SIGINT or SIGTERM, reading flags without exiting, and the --redis flag.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

// Main runs run with the command line and standard output, under a context
// canceled by SIGINT or SIGTERM, and exits: 0 on success or -h, 130 when
// interrupted, 1 with the error on standard error otherwise.
func Main(name string, run func(ctx context.Context, args []string, out io.Writer) error) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout)
	stop()
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
	case errors.Is(err, context.Canceled):
		fmt.Fprintln(os.Stderr, name+": interrupted")
		os.Exit(130)
	default:
		fmt.Fprintln(os.Stderr, name+":", err)
		os.Exit(1)
	}
}

// NewFlagSet returns a flag set that reports errors instead of exiting and
// prints nothing by itself (see Parse).
func NewFlagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return fs
}

// Parse parses args into fs. For -h it prints the usage to out and
// returns flag.ErrHelp; arguments left after the flags are an error.
func Parse(fs *flag.FlagSet, args []string, out io.Writer) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprintf(out, "usage: %s [flags]\n", fs.Name())
			fs.SetOutput(out)
			fs.PrintDefaults()
		}
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	return nil
}

// RedisFlagUsage is the usage of the commands' --redis flag.
const RedisFlagUsage = "Redis `address` host:port; a comma-separated list means a Cluster (default: embedded miniredis)"

// RedisAddrs splits a --redis value into addresses: none for "" (the
// embedded miniredis), one for a server, several for a Cluster.
func RedisAddrs(v string) ([]string, error) {
	if v == "" {
		return nil, nil
	}
	var addrs []string
	for _, a := range strings.Split(v, ",") {
		a = strings.TrimSpace(a)
		if a == "" {
			return nil, fmt.Errorf("--redis %q: empty address", v)
		}
		addrs = append(addrs, a)
	}
	return addrs, nil
}
