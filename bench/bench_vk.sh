#!/usr/bin/env bash
# bench/bench_vk.sh - the GPU benchmark: bench_vk (Vulkan decode attention over the cache
# and a Vulkan copy kernel) and PyTorch's SDPA on the same shapes, in one run.
#   bash bench/bench_vk.sh [bench_vk options]
#   e.g. --types f16,q8_0,q8_0+rot,q4_0,q4_0+rot --cells 32768 (TYPE+rot: rotated storage, with
#   the rotation passes' time and share of the call)
#   --quick: bench_vk's small shape only, no SDPA (a smoke run); --help: this and bench_vk's options
# BENCH_VK_BIN=path runs a prebuilt bench_vk instead of compiling bench/bench_vk.c.
# The sizes (--cells, --batch, --prefill-queries, --prefill-heads, --prefill-cells, --no-prefill)
# go to both; at the end a table puts each bench_vk row beside SDPA's graph time of its shape
# (head dim 128, FULL caches: the shapes SDPA runs).
# A CPU device (lavapipe) gets bench_vk's --quick shape unless sizes are given (bench_vk says so).
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
for a in "$@"; do
  case $a in
    --quick) quick=1 ;;
    -h|--help)
      echo "usage: bash bench/bench_vk.sh [bench_vk options]: bench_vk, then PyTorch SDPA on the same"
      echo "shapes (skipped without python3 + torch, and with --quick). BENCH_VK_BIN=path: a prebuilt bench_vk."
      echo "bench_vk's options:" ;;
  esac
done
bin=${BENCH_VK_BIN:-}
if [ -z "$bin" ]; then
  mkdir -p build
  ${CC:-cc} -std=c99 -O2 -Wall -Wextra -I. bench/bench_vk.c -o build/bench_vk -lm
  bin=build/bench_vk
fi
command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader
ours=$(mktemp) theirs=$(mktemp)
trap 'rm -f "$ours" "$theirs"' EXIT
"$bin" "$@" | tee "$ours"
case " $* " in *" --help "*|*" -h "*) exit 0 ;; esac
echo
# the options SDPA's script shares with bench_vk
# (rows of another head dim or of CAUSAL caches are not SDPA's shapes: no joined table)
sizes=() prev="" join=1
for a in "$@"; do
  case $prev in --cells|--batch|--prefill-queries|--prefill-heads|--prefill-cells) sizes+=("$prev" "$a") ;; esac
  case $prev in --hd) [ "$a" = 128 ] || join=0 ;; esac
  case $a in --no-prefill) sizes+=("$a") ;; --causal) join=0 ;; esac
  prev=$a
done
if [ $quick = 1 ]; then
  echo "bench_vk_sdpa: skipped (--quick)"
  exit 0
elif command -v python3 >/dev/null 2>&1 && python3 -c 'import torch' >/dev/null 2>&1; then
  PYTHONUNBUFFERED=1 python3 bench/bench_vk_sdpa.py ${sizes[@]+"${sizes[@]}"} | tee "$theirs"
else
  echo "bench_vk_sdpa: skipped (python3 with torch not found)"
  exit 0
fi
# ours vs SDPA: decode rows by (batch, cells), prefill rows by (queries, heads, cells)
[ $join = 1 ] && grep -q '^| sdpa' "$theirs" || exit 0
echo
echo "| row | shape | kvcache_vk (us) | SDPA graph (us) | vs SDPA |"
echo "|---|---|---|---|---|"
awk -F'|' '
  function t(x) { gsub(/ /, "", x); return x }
  FNR == NR { # SDPA
    if (t($2) == "sdpa") sd[t($3) "/" t($4)] = t($6)
    else if (t($2) ~ /^sdpaflash/) sp[t($3) "/" t($4) "/" t($5)] = t($7)
    next
  }
  t($2) ~ /^(f16|bf16|q8_0|q4_0)/ && t($3) ~ /^[0-9]+$/ && t($5) ~ /^[0-9.]+$/ {
    k = t($3) "/" t($4)
    if (k in sd) printf "| decode %s | batch %s, %s cells | %s | %s | %.2fx |\n", t($2), t($3), t($4), t($5), sd[k], sd[k] / t($5)
  }
  t($2) == "causal" && t($7) ~ /^[0-9.]+$/ && t($5) == "128" {
    k = t($3) "/" t($4) "/" t($6)
    if (k in sp) printf "| prefill f16 | %s queries, %s heads, %s cells | %s | %s | %.2fx |\n", t($3), t($4), t($6), t($7), sp[k], sp[k] / t($7)
  }' "$theirs" "$ours"
