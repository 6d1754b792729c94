#!/usr/bin/env bash
# tests/redis_tiers.sh - the tiers with a real Redis (examples/redis_store.c): starts its own
# redis-server on 127.0.0.1 with a free port and a temporary directory (no other address),
# and checks, through separate processes:
#   1. a writer publishes a long system prompt; a reader (another process, its own pool)
#      fetches it and reuses it: every turn reuses the writer's 992 tokens, every cell
#      bit-identical to evaluating the tokens;
#   2. the server killed while a reader runs turns: the turns before reuse from Redis, the
#      turns after recompute (no crash, no wrong cell); under valgrind when present (no leak);
#   3. damaged (one byte changed with SETRANGE), truncated and foreign (an f32 pool's blob
#      of the same tokens copied under the f16 key) blobs refused: the reader recomputes;
#   4. the server hanging (SIGSTOP): each fetch gives up after about one timeout (300 ms;
#      at most 1000 ms allowed, where 64 probes of one timeout each would take 19 s), the
#      reader recomputes; after SIGCONT it reuses from Redis again.
# Skipped (exit 0, with a message) where redis-server or hiredis is absent.
# Usage: bash tests/redis_tiers.sh [BUILD_DIR]   (one line "RESULT redis <passed> <failed>")
set -u
cd "$(dirname "$0")/.."
B=${1:-build}
mkdir -p "$B"
passed=0 failed=0
ok() { passed=$((passed + 1)); }
bad() { failed=$((failed + 1)); echo "FAIL: $*"; }

if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
  echo "skip: redis-server not installed (Debian: apt-get install redis-server libhiredis-dev)"
  echo "RESULT redis 0 0"; exit 0
fi
if ! ${CC:-cc} -std=c99 -O1 -Wall -Wextra -Wpedantic -Werror -I. examples/redis_store.c -o "$B/redis_store" -lm -lhiredis 2>"$B/redis_store.build.log"; then
  if grep -q "hiredis" "$B/redis_store.build.log"; then
    echo "skip: hiredis not installed (Debian: apt-get install libhiredis-dev)"
    echo "RESULT redis 0 0"; exit 0
  fi
  cat "$B/redis_store.build.log"; echo "RESULT redis 0 1"; exit 1
fi

tmp=$(mktemp -d)
server_pid=""
cleanup() { [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }
start_server() {
  port=$(free_port)
  redis-server --bind 127.0.0.1 --port "$port" --dir "$tmp" --save "" --appendonly no \
    --daemonize no --loglevel warning >"$tmp/redis.log" 2>&1 &
  server_pid=$!
  for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && return 0; sleep 0.1; done
  echo "redis-server did not start"; cat "$tmp/redis.log"; return 1
}
stop_server() { kill "$server_pid" 2>/dev/null; wait "$server_pid" 2>/dev/null; server_pid=""; }
rs() { "$B/redis_store" --port "$port" "$@"; }

start_server || { echo "RESULT redis 0 1"; exit 1; }

# 1. two processes share the system prompt
out=$(rs write) && ok || bad "writer: $out"
key=$(echo "$out" | sed -n 's/^key \([0-9a-f]*\) tokens 992$/\1/p')
[ -n "$key" ] && ok || bad "writer printed: $out"
out=$(rs read --turns 3 --expect-reuse 992) && ok || bad "reader: $out"
echo "$out" | grep -q "^from-redis 3 recomputed 0 refused 0 .* wrong 0$" && ok || bad "reader: $out"

# 3. damaged, truncated, foreign blobs: refused, recomputed, right
redis-cli -p "$port" COPY "kvc:$key" "kvc:good" >/dev/null
for offset in 20 140 400 100000; do
  redis-cli -p "$port" SETRANGE "kvc:$key" "$offset" "Z" >/dev/null
  out=$(rs read --expect-reuse 0) && ok || bad "damaged at $offset: $out"
  echo "$out" | grep -q "refused 1 .* wrong 0$" && ok || bad "damaged at $offset: $out"
  redis-cli -p "$port" COPY "kvc:good" "kvc:$key" REPLACE >/dev/null
done
redis-cli -p "$port" SET "kvc:$key" "KVCACHE" >/dev/null # truncated to 7 bytes
out=$(rs read --expect-reuse 0) && ok || bad "truncated: $out"
echo "$out" | grep -q "refused 1 .* wrong 0$" && ok || bad "truncated: $out"
out=$(rs write --type f32) && ok || bad "f32 writer: $out"
fkey=$(echo "$out" | sed -n 's/^key \([0-9a-f]*\) tokens 992$/\1/p')
[ -n "$fkey" ] && [ "$fkey" != "$key" ] && ok || bad "the f32 key must differ: $fkey"
redis-cli -p "$port" COPY "kvc:$fkey" "kvc:$key" REPLACE >/dev/null
out=$(rs read --expect-reuse 0) && ok || bad "foreign: $out"
echo "$out" | grep -q "refused 1 .* wrong 0$" && ok || bad "foreign: $out"
redis-cli -p "$port" COPY "kvc:good" "kvc:$key" REPLACE >/dev/null
out=$(rs read --expect-reuse 992) && ok || bad "restored: $out"

# 4. the server hangs: a fetch waits about one timeout, then recomputes
kill -STOP "$server_pid"
out=$(rs read --turns 2 --max-fetch-ms 1000) && ok || bad "hanging server: $out"
echo "$out" | grep -q "^from-redis 0 recomputed 2 .* wrong 0$" && ok || bad "hanging server: $out"
echo "$out" | tail -n 1
kill -CONT "$server_pid"
out=$(rs read --expect-reuse 992) && ok || bad "after SIGCONT: $out"

# 2. the server killed mid-run
run=("$B/redis_store")
if command -v valgrind >/dev/null 2>&1; then run=(valgrind -q --error-exitcode=9 --leak-check=full "$B/redis_store"); fi
"${run[@]}" --port "$port" read --turns 8 --pause-ms 400 >"$tmp/kill.out" 2>"$tmp/kill.err" &
reader=$!
for _ in $(seq 100); do grep -q "from redis" "$tmp/kill.out" 2>/dev/null && break; sleep 0.1; done
stop_server
wait "$reader"; rc=$?
[ "$rc" = 0 ] && ok || { bad "reader after the kill exited $rc"; cat "$tmp/kill.out" "$tmp/kill.err"; }
last=$(tail -n 1 "$tmp/kill.out")
fr=$(echo "$last" | sed -n 's/^from-redis \([0-9]*\) recomputed \([0-9]*\) .* wrong 0$/\1/p')
rc_=$(echo "$last" | sed -n 's/^from-redis \([0-9]*\) recomputed \([0-9]*\) .* wrong 0$/\2/p')
[ -n "$fr" ] && [ "$fr" -ge 1 ] && [ -n "$rc_" ] && [ "$rc_" -ge 1 ] && ok || bad "killed server: $last"

echo "RESULT redis $passed $failed"
[ "$failed" = 0 ]
