#!/usr/bin/env bash
# Re-makes every figure under docs/img (PNG, SVG and the JSON of their
# series) and the measurements the documents quote, against a real
# redis-server this script starts on a free loopback port and stops (by
# PID) when it is done. Each step prints its own table; the output of the
# whole run goes to stdout (about 12 minutes on 2 cores).
#
#   bash scripts/plots.sh                 # everything
#   bash scripts/plots.sh sim surge       # some: sim, surge, sweep, multi-region
#
# The commands it runs, each usable alone against any Redis:
#   ratelimit-sim   --redis ADDR --plot docs/img                          # sim-*.png
#   ratelimit-surge --redis ADDR --plot docs/img                          # surge-*.png
#   ratelimit-sim   --redis ADDR --sweep --duration 3s --plot docs/img    # regime.png
#   ratelimit-sim   --redis ADDR --multi-region --duration 5s --plot docs/img   # multi-region-*.png
set -euo pipefail
cd "$(dirname "$0")/.."

steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(sim surge sweep multi-region)

command -v redis-server >/dev/null || { echo "plots: redis-server not found (apt-get install redis-server)" >&2; exit 2; }
BIN=$(mktemp -d /tmp/plots.XXXXXX)
REDIS_PID=""
cleanup() {
  if [ -n "$REDIS_PID" ]; then kill "$REDIS_PID" 2>/dev/null || true; wait "$REDIS_PID" 2>/dev/null || true; fi
  rm -rf "$BIN"
}
trap cleanup EXIT

port() {
  local p
  while :; do
    p=$((20000 + RANDOM % 12000)) # below the ephemeral range (32768-), where client sockets take ports
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then echo "$p"; return; fi
  done
}
PORT=$(port)
redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no --dir "$BIN" >"$BIN/redis.log" 2>&1 &
REDIS_PID=$!
for _ in $(seq 50); do redis-cli -p "$PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
if ! redis-cli -p "$PORT" ping >/dev/null 2>&1; then
  echo "plots: redis-server did not start on port $PORT; its log:" >&2
  cat "$BIN/redis.log" >&2
  exit 1
fi
ADDR=127.0.0.1:$PORT
echo "== $(redis-server --version | cut -d' ' -f1-3) on $ADDR; $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg); commit $(git rev-parse --short HEAD)"

go build -o "$BIN/ratelimit-sim" ./cmd/ratelimit-sim
go build -o "$BIN/ratelimit-surge" ./cmd/ratelimit-surge
mkdir -p docs/img

for step in "${steps[@]}"; do
  if ! redis-cli -p "$PORT" flushall >/dev/null; then
    echo "plots: the redis-server on $ADDR is gone; its log:" >&2
    cat "$BIN/redis.log" >&2
    exit 1
  fi
  echo
  case "$step" in
    sim)          set -x; "$BIN/ratelimit-sim" --redis "$ADDR" --plot docs/img; set +x ;;
    surge)        set -x; "$BIN/ratelimit-surge" --redis "$ADDR" --plot docs/img; set +x ;;
    sweep)        set -x; "$BIN/ratelimit-sim" --redis "$ADDR" --sweep --duration 3s --plot docs/img; set +x ;;
    multi-region) set -x; "$BIN/ratelimit-sim" --redis "$ADDR" --multi-region --duration 5s --plot docs/img; set +x ;;
    *) echo "plots: unknown step $step (sim, surge, sweep, multi-region)" >&2; exit 2 ;;
  esac 2>&1
done
echo "== load at the end $(cut -d' ' -f1-3 /proc/loadavg)"
