#!/usr/bin/env bash
# bench/bench_vk.sh - the GPU benchmark: bench_vk (Vulkan decode attention over the cache
# and a Vulkan copy kernel) and PyTorch's SDPA on the same shapes, in one run.
#   bash bench/bench_vk.sh [bench_vk options]
#   e.g. --types f16,q8_0,q8_0+rot,q4_0,q4_0+rot --cells 32768 (TYPE+rot: rotated storage, with
#   the rotation passes' time and share of the call)
#   --quick: bench_vk's small shape only, no SDPA (a smoke run); --help: this and bench_vk's options
# BENCH_VK_BIN=path runs a prebuilt bench_vk instead of compiling bench/bench_vk.c.
# A CPU device (lavapipe) gets bench_vk's --quick shape unless sizes are given (bench_vk says so).
set -eu
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
"$bin" "$@"
case " $* " in *" --help "*|*" -h "*) exit 0 ;; esac
echo
if [ $quick = 1 ]; then
  echo "bench_vk_sdpa: skipped (--quick)"
elif command -v python3 >/dev/null 2>&1 && python3 -c 'import torch' >/dev/null 2>&1; then
  PYTHONUNBUFFERED=1 python3 bench/bench_vk_sdpa.py
else
  echo "bench_vk_sdpa: skipped (python3 with torch not found)"
fi
