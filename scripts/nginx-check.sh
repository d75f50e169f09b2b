#!/usr/bin/env bash
# Checks the nginx auth_request example of docs/ratelimitd.md for real:
# Debian's nginx with njs on loopback, in front of ratelimitd built from this
# repository (embedded Redis) and a backend answering 200. The rules, the
# njs module and the nginx configuration are taken from the page itself (the
# fenced blocks after its "<!-- nginx-check: NAME -->" markers), so what is
# checked is what the page says. Only the addresses are changed, to free
# loopback ports.
#
# Needs: nginx and its njs module (apt-get install nginx-light
# libnginx-mod-http-js), curl, go. Installs nothing; starts nothing that
# outlives it (it stops what it started, by PID).
set -euo pipefail
cd "$(dirname "$0")/.."

NJS=/usr/lib/nginx/modules/ngx_http_js_module.so
for need in nginx curl go; do
  command -v "$need" >/dev/null || { echo "nginx-check: $need not found (apt-get install nginx-light libnginx-mod-http-js curl)" >&2; exit 2; }
done
[ -f "$NJS" ] || { echo "nginx-check: $NJS not found (apt-get install libnginx-mod-http-js)" >&2; exit 2; }

DIR=$(mktemp -d /tmp/nginx-check.XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$DIR"
}
trap cleanup EXIT

# block NAME: the fenced block after <!-- nginx-check: NAME --> in the page.
block() {
  awk -v m="<!-- nginx-check: $1 -->" '
    $0 == m { found = 1; next }
    found && /^```/ { if (inside) exit; inside = 1; next }
    inside { print }
  ' docs/ratelimitd.md
}
for name in rules.yaml ratelimit.js api.conf; do
  block "$name" >"$DIR/$name"
  [ -s "$DIR/$name" ] || { echo "nginx-check: no block '$name' in docs/ratelimitd.md" >&2; exit 1; }
done

# free loopback ports: nothing answers a connection there now.
port() {
  local p
  while :; do
    p=$((20000 + RANDOM % 12000)) # below the ephemeral range (32768-), where client sockets take ports
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then echo "$p"; return; fi
  done
}
RL=$(port); GRPC=$(port); NG=$(port); BE=$(port)

echo "== ratelimitd (go build ./cmd/ratelimitd), http 127.0.0.1:$RL"
(cd cmd/ratelimitd && go build -o "$DIR/ratelimitd" .)
"$DIR/ratelimitd" --config "$DIR/rules.yaml" --http "127.0.0.1:$RL" --grpc "127.0.0.1:$GRPC" \
  --deny-status 403 --response-headers --log-level warn 2>"$DIR/ratelimitd.log" &
PIDS+=($!)

sed -e "s#/etc/nginx/njs/#$DIR/#" \
    -e "s#127.0.0.1:8080#127.0.0.1:$RL#" \
    -e "s#listen 8000;#listen 127.0.0.1:$NG;#" \
    -e "s#127.0.0.1:9000#127.0.0.1:$BE#" "$DIR/api.conf" >"$DIR/api-local.conf"
mkdir -p "$DIR/tmp"
cat >"$DIR/nginx.conf" <<EOF
load_module $NJS;
daemon off;
worker_processes 1;
pid $DIR/nginx.pid;
error_log $DIR/error.log warn;
events { worker_connections 64; }
http {
    access_log off;
    client_body_temp_path $DIR/tmp/body;
    proxy_temp_path $DIR/tmp/proxy;
    fastcgi_temp_path $DIR/tmp/fastcgi;
    uwsgi_temp_path $DIR/tmp/uwsgi;
    scgi_temp_path $DIR/tmp/scgi;
    server {   # the backend
        listen 127.0.0.1:$BE;
        default_type text/plain;
        return 200 "backend ok\n";
    }
    include $DIR/api-local.conf;
}
EOF
echo "== $(nginx -v 2>&1), njs $(dpkg-query -W -f '${Version}' libnginx-mod-http-js 2>/dev/null || echo '?'), on 127.0.0.1:$NG"
nginx -t -p "$DIR" -c "$DIR/nginx.conf" 2>&1 | sed 's/^/  /'
nginx -p "$DIR" -c "$DIR/nginx.conf" &
PIDS+=($!)

for _ in $(seq 100); do
  curl -sf "http://127.0.0.1:$RL/readyz" >/dev/null 2>&1 && curl -s "http://127.0.0.1:$NG/" >/dev/null 2>&1 && break
  sleep 0.1
done

passed=0; failed=0
check() { # check DESCRIPTION COMMAND...: counts and prints the outcome
  local what=$1; shift
  if "$@"; then passed=$((passed + 1)); echo "  ok:   $what"; else failed=$((failed + 1)); echo "  FAIL: $what"; fi
}
# req NAME [curl args]: one request; its status line, the rate-limit
# headers and the body, kept in $DIR/NAME and printed.
req() {
  local name=$1; shift
  curl -s -D "$DIR/$name.h" -o "$DIR/$name.b" "$@" "http://127.0.0.1:$NG/api/rides"
  printf '$ curl -i'; printf ' %q' "$@"; echo " http://127.0.0.1:$NG/api/rides"
  tr -d '\r' <"$DIR/$name.h" | grep -iE '^(HTTP/|retry-after|ratelimit-)' | sed 's/^/  /'
  sed 's/^/  /' "$DIR/$name.b"
}
status() { tr -d '\r' <"$DIR/$1.h" | head -1 | awk '{print $2}'; }
header() { tr -d '\r' <"$DIR/$1.h" | grep -i "^$2:" | head -1 | sed 's/^[^:]*: *//'; }

echo "== three requests of alice pass (3 per minute), the fourth gets 429"
# All four in one minute window: not within 5s of the minute's end.
s=$((10#$(date +%S)))
if [ "$s" -ge 55 ]; then sleep $((61 - s)); fi
for i in 1 2 3 4; do req "alice$i" -H 'X-User-Id: alice'; done
check "alice 1-3: 200" test "$(status alice1)$(status alice2)$(status alice3)" = 200200200
check "alice 3: RateLimit-Limit 3, RateLimit-Remaining 0" test "$(header alice3 RateLimit-Limit)/$(header alice3 RateLimit-Remaining)" = 3/0
check "alice 4: 429" test "$(status alice4)" = 429
check "alice 4: Retry-After = RateLimit-Reset, in (0, 60]" bash -c '[ "$1" = "$2" ] && [ "$1" -gt 0 ] && [ "$1" -le 60 ]' _ "$(header alice4 Retry-After)" "$(header alice4 RateLimit-Reset)"
check "alice 4: RateLimit-Limit 3, RateLimit-Remaining 0" test "$(header alice4 RateLimit-Limit)/$(header alice4 RateLimit-Remaining)" = 3/0
check "alice 4: the fixed JSON body" test "$(cat "$DIR/alice4.b")" = '{"error":"rate_limit_exceeded"}'

echo "== a header that tries to rewrite the JSON is a key like any other"
evil='alice"}]},{"entries":[{"key":"remote_address","value":"x'
req evil1 -H "X-User-Id: $evil"
req evil2 -H "X-User-Id: $evil"
check "injected header: 200, its own count (Remaining 2, then 1)" test "$(status evil1)/$(header evil1 RateLimit-Remaining)/$(status evil2)/$(header evil2 RateLimit-Remaining)" = 200/2/200/1

echo "== without X-User-Id only the per-address limit applies (50/s)"
req anon
check "no user: 200" test "$(status anon)" = 200

if [ -s "$DIR/error.log" ]; then echo "== nginx error.log"; sed 's/^/  /' "$DIR/error.log"; fi
echo "nginx check: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
