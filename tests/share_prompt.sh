#!/usr/bin/env bash
# tests/share_prompt.sh - two tinylm processes share a long prompt through a store (issue 39):
# for every model of tests/data, a writer (tinylm --share-write) evaluates the `long` case and
# publishes its prompt's whole blocks (192 of 200 tokens; llama-tiny: all 160) to the store;
# then a reader (tinylm --share-read, another process, an empty pool) fetches them, computes
# only the rest, and its logits must pass tinylm's reference check and be bit-identical to
# the writer's. Through a directory (kvc_store_dir) always; through Redis (examples/
# redis_store.h, a redis-server this script starts on 127.0.0.1 with a free port and a
# temporary directory) where redis-server and hiredis are installed, else skipped with a
# message. Then a reader of one model on a store that holds only another model's prefix
# must find nothing (the keys carry the model's id) and fail.
# Usage: bash tests/share_prompt.sh [BUILD_DIR]   (one line "RESULT share <passed> <failed>")
set -u
cd "$(dirname "$0")/.."
B=${1:-build}
mkdir -p "$B"
passed=0 failed=0
ok() { passed=$((passed + 1)); }
bad() { failed=$((failed + 1)); echo "FAIL: $*"; }

redis=1
if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1 ||
   [ ! -e /usr/include/hiredis/hiredis.h ]; then
  redis=0; echo "skip: the Redis half (redis-server or hiredis not installed: apt-get install redis-server libhiredis-dev)"
fi
if [ $redis = 1 ]; then build=(-DTINYLM_REDIS examples/tinylm.c -lm -lhiredis); else build=(examples/tinylm.c -lm); fi
if ! ${CC:-cc} -std=c99 -O2 -Wall -Wextra -Wpedantic -Werror -I. "${build[@]}" -o "$B/tinylm_share" 2>"$B/tinylm_share.log"; then
  cat "$B/tinylm_share.log"; echo "RESULT share 0 1"; exit 1
fi

tmp=$(mktemp -d)
server_pid=""
cleanup() { [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT

# share STORE MODEL: the writer, then the reader; both must pass, the reader reuse what the
# writer published and its logits be the writer's, bit for bit
share() {
  local store=$1 m=$2 name out w r
  name=$(basename "$m")
  out=$("$B/tinylm_share" --quiet --share-write "$store" "$tmp/$name.logits" "$m" 2>&1) && ok || bad "$name writer: $out"
  w=$(echo "$out" | sed -n 's/^share: published \([0-9]*\) of the .*/\1/p')
  out=$("$B/tinylm_share" --quiet --share-read "$store" "$tmp/$name.logits" "$m" 2>&1) && ok || bad "$name reader: $out"
  r=$(echo "$out" | sed -n 's/^share: fetched \([0-9]*\) tokens .*, bit-identical to the writer.s$/\1/p')
  [ -n "$w" ] && [ "$w" -gt 0 ] && [ "$r" = "$w" ] && ok || bad "$name: published ${w:-?}, the reader: $out"
  echo "$out" | grep '^share:' | sed "s|^|$name: |"
}

models=$(ls -d tests/data/*/ | sed 's,/$,,')
for m in $models; do
  mkdir -p "$tmp/dir-$(basename "$m")"
  share "dir:$tmp/dir-$(basename "$m")" "$m"
done
# a store with another model's prefix only: nothing to fetch, the reader fails
first=$(echo "$models" | head -n 1) second=$(echo "$models" | sed -n 2p)
if [ -n "$second" ]; then
  out=$("$B/tinylm_share" --quiet --share-read "dir:$tmp/dir-$(basename "$first")" "$tmp/x.logits" "$second" 2>&1)
  [ $? = 1 ] && echo "$out" | grep -q "gave back 0 tokens" && ok || bad "a foreign store: $out"
fi

if [ $redis = 1 ]; then
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()')
  redis-server --bind 127.0.0.1 --port "$port" --dir "$tmp" --save "" --appendonly no \
    --daemonize no --loglevel warning >"$tmp/redis.log" 2>&1 &
  server_pid=$!
  for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
  for m in $models; do share "redis:127.0.0.1:$port" "$m"; done # one server, every model
fi

echo "RESULT share $passed $failed"
[ "$failed" = 0 ]
