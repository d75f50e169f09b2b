#!/usr/bin/env bash
# Runs every test of the module (and of the bench module) with the race
# detector against real redis-server processes, installing Redis first when
# it is missing. This is the README's test command (`make test`) and what CI runs.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1 || ! command -v redis-sentinel >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1; then
    echo "== installing redis-server and redis-sentinel (apt-get)"
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-server redis-tools redis-sentinel >/dev/null
  else
    echo "redis-server, redis-cli and redis-sentinel are required and this is not a Debian-like system:" >&2
    echo "install Redis >= 6.2 and put redis-server, redis-cli and redis-sentinel on PATH, then run again." >&2
    exit 1
  fi
fi
redis-server --version

echo "== go vet"
go vet ./...
# One package at a time (-p 1): the outage tests of global and hybrid each
# drive a fleet far past its limit while Redis is frozen, and on 2 cores two
# of them at once starve each other's breakers and probes of CPU.
echo "== go test -race -p 1 ./..."
go test -race -count=1 -p 1 -timeout 30m ./...
# The tests that compare the hybrid's speed with per-request Redis, measure
# Redis memory, or need a couple of hundred thousand decisions in seconds,
# skip themselves under the race detector (it slows the in-memory path, not
# Redis), or the bounds of theirs that need such speed: they run here,
# without it, alone.
echo "== go test (no race detector): hybrid scale tests"
go test -count=1 -timeout 10m -run 'TestManyKeysUnderLimit|TestRedisMemoryPerKey|TestMultiManyKeysCounterDropped|TestBusyHostDefaults|TestColdKeysClusterAlgorithms' -v ./hybrid/ | grep -E '^(=== RUN|--- |ok|FAIL|PASS)|scale_test|multi_test|Error'

if [ -f bench/go.mod ]; then
  echo "== bench module: go test -race ./... (benchmarks not run here)"
  (cd bench && go vet ./... && go test -race -count=1 -timeout 20m ./...)
fi
if [ -f cmd/ratelimitd/go.mod ]; then
  echo "== cmd/ratelimitd module: go vet, go test -race ./... (benchmarks not run here)"
  (cd cmd/ratelimitd && go vet ./... && go test -race -count=1 -timeout 10m ./...)
fi

# A short run of the fuzzers, seconds each (their seed corpora also run as
# tests above). What costs is the instrumented build: the parsers' take
# about a minute on 2 cores; FuzzCheck, the JSON endpoint, instruments
# gRPC and Envoy's protos too (two more minutes), so it runs with
# FUZZ_ALL=1. A failing input is written under testdata/fuzz/ and fails
# the run. The budget is a count of inputs (a few seconds each here), not a
# duration: go1.26's fuzzing coordinator can fail a duration run at its end
# with "context deadline exceeded" and no input (go.dev/issue/75804, fixed
# in go1.27), which a loaded CI machine hits. FUZZTIME=30s (say) overrides.
fuzz() { go test -run '^$' -fuzz "^$1\$" -fuzztime "${FUZZTIME:-$3}" -fuzzminimizetime 1s "$2"; }
echo "== fuzz, ${FUZZTIME:-a few seconds} each"
fuzz FuzzParseLimit . 20000x
if [ -f cmd/ratelimitd/go.mod ]; then
  (cd cmd/ratelimitd && fuzz FuzzParse ./internal/config/ 20000x && fuzz FuzzParseBounded ./internal/config/ 20000x)
  if [ "${FUZZ_ALL:-}" = 1 ]; then
    (cd cmd/ratelimitd && fuzz FuzzCheck ./internal/server/ 5000x)
  fi
fi
