#!/usr/bin/env bash
# Runs every test of the module (and of the bench module) with the race
# detector against real redis-server processes, installing Redis first when
# it is missing. This is the README's test command (`make test`) and what CI runs.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1; then
    echo "== installing redis-server (apt-get)"
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-server redis-tools >/dev/null
  else
    echo "redis-server and redis-cli are required and this is not a Debian-like system:" >&2
    echo "install Redis >= 6.2 and put redis-server and redis-cli on PATH, then run again." >&2
    exit 1
  fi
fi
redis-server --version

echo "== go vet"
go vet ./...
echo "== go test -race ./..."
go test -race -count=1 -timeout 30m ./...
if [ -f bench/go.mod ]; then
  echo "== bench module: go test -race ./... (benchmarks not run here)"
  (cd bench && go vet ./... && go test -race -count=1 -timeout 20m ./...)
fi
