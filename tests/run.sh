#!/usr/bin/env bash
# tests/run.sh - every test of kvcache.h; `make test` runs this.
# Stages: strict compile checks (gcc, g++, clang, two translation units, KVCACHE_STATIC),
# the test programs and the fuzz corpora replayed, the examples and the tiny-model
# end-to-end check, then the same under ASan+UBSan and under valgrind, and libFuzzer for
# KVC_FUZZ_SECONDS per target when that is set. The last line is "N passed, N failed, N skipped".
# A test program's checks count one by one (its "RESULT name passed failed" line);
# every other step counts as one. Steps whose tool is missing are skipped, not failed.
set -u
cd "$(dirname "$0")/.."
B=build/test
mkdir -p "$B"
passed=0 failed=0 skipped=0
CC=${CC:-gcc}
STRICT="-std=c99 -Wall -Wextra -Wpedantic -Werror"
seed=${KVC_SEED:-$(( $(date +%s) ^ $$ ))}
run_t0=$SECONDS
echo "seed $seed (KVC_SEED=$seed replays it)"

have() { command -v "$1" >/dev/null 2>&1; }

# step NAME CMD...: run CMD, count it as one pass or fail, show its output on failure
step() {
  local name=$1; shift
  if "$@" >"$B/$name.log" 2>&1; then
    passed=$((passed + 1)); echo "  ok    $name"
  else
    failed=$((failed + 1)); echo "  FAIL  $name"; tail -n 30 "$B/$name.log"; return 1
  fi
}

# checks NAME CMD...: run a test program, add its RESULT counts (and a failure if it crashed)
checks() {
  local name=$1; shift
  local rc=0
  "$@" >"$B/$name.log" 2>&1 || rc=$?
  local line; line=$(grep '^RESULT ' "$B/$name.log" | tail -n 1)
  if [ -z "$line" ]; then
    failed=$((failed + 1)); echo "  FAIL  $name (no RESULT line, exit $rc)"; tail -n 30 "$B/$name.log"; return
  fi
  set -- $line
  passed=$((passed + $3)); failed=$((failed + $4))
  if [ "$4" != 0 ] || [ $rc != 0 ]; then
    [ $rc != 0 ] && [ "$4" = 0 ] && failed=$((failed + 1))
    echo "  FAIL  $name: $3 passed, $4 failed, exit $rc"; grep -v '^RESULT' "$B/$name.log" | tail -n 30
  else
    echo "  ok    $name: $3 checks"
  fi
}

skip() { skipped=$((skipped + 1)); echo "  skip  $1 ($2)"; }

# stage KEY TITLE: starts a stage; each one's wall time goes into the summary at the end
stage_key="" stage_t0=$SECONDS stage_times=""
stage() {
  [ -n "$stage_key" ] && stage_times="$stage_times $stage_key $((SECONDS - stage_t0))s"
  stage_key=$1 stage_t0=$SECONDS
  [ -n "$2" ] && echo "== $2"
}

tests=$(ls tests/test_*.c)
examples=$(ls examples/*.c | grep -v tinylm)
# Fuzz targets: tests/fuzz_NAME.c defines LLVMFuzzerTestOneInput, tests/corpus/NAME/ is its
# seed corpus. Every stage replays each corpus through tests/fuzz_replay.c (no libFuzzer
# needed); a target added later is picked up by this glob.
fuzzers=$(ls tests/fuzz_*.c 2>/dev/null | grep -v '/fuzz_replay\.c$')
fuzz_name() { basename "$1" .c | sed 's/^fuzz_//'; }
# replay LABEL BINARY NAME [runner...]: the corpus of NAME through BINARY, counted per input
replay() {
  local label=$1 bin=$2 name=$3; shift 3
  checks "$label" "$@" "$bin" --name "$name" "tests/corpus/$name"
}

stage compile "compile checks"
printf '#define KVCACHE_IMPLEMENTATION\n#include "kvcache.h"\nint main(void){return 0;}\n' > "$B/tu_a.c"
printf '#include "kvcache.h"\nint kvc_second_tu(void){kvc_pool_config c; return (int)kvc_pool_config_init(&c);}\n' > "$B/tu_b.c"
printf '#define KVCACHE_STATIC\n#define KVCACHE_IMPLEMENTATION\n#include "kvcache.h"\nint main(void){return 0;}\n' > "$B/tu_static.c"
step gcc-c99-two-units sh -c "$CC $STRICT -I. -c $B/tu_a.c -o $B/tu_a.o && $CC $STRICT -I. -c $B/tu_b.c -o $B/tu_b.o && $CC $B/tu_a.o $B/tu_b.o -o $B/tu -lm"
step gcc-static sh -c "$CC $STRICT -I. $B/tu_static.c -o $B/tu_static -lm"
if have g++; then
  step g++-c++11 g++ -x c++ -std=c++11 -Wall -Wextra -Wpedantic -Werror -I. -c "$B/tu_a.c" -o "$B/tu_cxx.o"
  for t in $tests $fuzzers tests/fuzz_replay.c; do
    n=$(basename "$t" .c); step "g++-$n" g++ -x c++ -std=c++11 -Wall -Wextra -Werror -I. -c "$t" -o "$B/$n.cxx.o"
  done
else skip g++ "g++ not installed"; fi
if have clang; then
  step clang-c99 clang $STRICT -I. -c "$B/tu_a.c" -o "$B/tu_clang.o"
else skip clang-c99 "clang not installed"; fi

# the Vulkan backend: kvcache_vk.h builds with and without VK_NO_PROTOTYPES, in C and
# C++, in two translation units; its committed SPIR-V is what glslc makes of shaders/
have_vk=0
echo '#include <vulkan/vulkan.h>' | $CC -x c -fsyntax-only - >/dev/null 2>&1 && have_vk=1
if [ $have_vk = 1 ]; then
  printf '#define KVCACHE_IMPLEMENTATION\n#define KVCACHE_VK_IMPLEMENTATION\n#define VK_NO_PROTOTYPES\n#include "kvcache.h"\n#include "kvcache_vk.h"\nint main(void){return 0;}\n' > "$B/tu_vk.c"
  printf '#include "kvcache.h"\n#include "kvcache_vk.h"\nint kvc_vk_second_tu(void){return kvc_vk_context_destroy(0) == KVC_ERR_NULL;}\n' > "$B/tu_vk_b.c"
  printf '#define KVCACHE_IMPLEMENTATION\n#define KVCACHE_VK_IMPLEMENTATION\n#include "kvcache.h"\n#include "kvcache_vk.h"\nint main(void){return 0;}\n' > "$B/tu_vk_proto.c"
  step gcc-vk-two-units sh -c "$CC $STRICT -I. -c $B/tu_vk.c -o $B/tu_vk.o && $CC $STRICT -I. -c $B/tu_vk_b.c -o $B/tu_vk_b.o && $CC $B/tu_vk.o $B/tu_vk_b.o -o $B/tu_vk -lm"
  step gcc-vk-prototypes sh -c "$CC $STRICT -I. $B/tu_vk_proto.c -o $B/tu_vk_proto -lm -lvulkan"
  have g++ && step g++-vk-c++11 g++ -x c++ -std=c++11 -Wall -Wextra -Wpedantic -Werror -I. -c "$B/tu_vk.c" -o "$B/tu_vk_cxx.o"
  have clang && step clang-vk clang $STRICT -I. -c "$B/tu_vk.c" -o "$B/tu_vk_clang.o"
else skip kvcache_vk "no Vulkan headers (apt-get install libvulkan-dev)"; fi
if have glslc; then
  step shaders-committed sh -c "cp kvcache_vk.h $B/kvcache_vk.h && bash shaders/embed.sh $B/kvcache_vk.h && cmp kvcache_vk.h $B/kvcache_vk.h"
else skip shaders-committed "glslc not installed"; fi

stage tests "tests (gcc -O2)"
for t in $tests; do
  n=$(basename "$t" .c)
  step "build-$n" $CC $STRICT -O2 -I. "$t" -o "$B/$n" -lm -lpthread && checks "$n" "$B/$n" "$seed"
done
for fz in $fuzzers; do
  n=$(fuzz_name "$fz")
  step "build-fuzz-$n" $CC $STRICT -O2 -I. tests/fuzz_replay.c "$fz" -o "$B/fuzz_$n" -lm &&
    replay "fuzz-replay-$n" "$B/fuzz_$n" "$n"
done
stage examples "examples"
for e in $examples; do
  n=$(basename "$e" .c)
  step "example-$n" sh -c "$CC $STRICT -O2 -I. $e -o $B/$n -lm && $B/$n"
done
if [ -f examples/tinylm.c ]; then
  stage tinylm "end-to-end: tiny models against Hugging Face reference logits"
  step build-tinylm $CC $STRICT -O2 -I. examples/tinylm.c -o "$B/tinylm" -lm
  for m in tests/data/*/; do
    step "tinylm-$(basename "$m")" "$B/tinylm" --quiet "$m"
    step "tinylm-$(basename "$m")-chunk7" "$B/tinylm" --quiet --chunk 7 "$m"
  done
  if [ $have_vk = 1 ]; then # the same demo with the pages and attention on a Vulkan device
    step build-tinylm-vk $CC $STRICT -O2 -DTINYLM_VK -I. examples/tinylm.c -o "$B/tinylm_vk" -lm
    if "$B/tinylm_vk" --vk --quiet --reference tests/data/llama-tiny >/dev/null 2>&1; then
      for m in tests/data/*/; do
        step "tinylm-vk-$(basename "$m")" "$B/tinylm_vk" --vk --quiet "$m"
        step "tinylm-vk-$(basename "$m")-chunk7" "$B/tinylm_vk" --vk --quiet --chunk 7 "$m"
      done
    else skip tinylm-vk "no Vulkan loader or device (apt-get install mesa-vulkan-drivers)"; fi
  fi
fi

stage asan "sanitizers (ASan + UBSan)"
SAN="-O1 -g -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
SANCC=$CC; have clang && SANCC=clang
if echo 'int main(void){return 0;}' | $SANCC $SAN -x c - -o "$B/san_probe" >/dev/null 2>&1; then
  for t in $tests; do
    n=$(basename "$t" .c)
    # test_vk: the Vulkan driver's own allocations are not ours to free (the test counts
    # the backend's with its own allocator), and lavapipe under ASan is slow
    if [ "$n" = test_vk ]; then
      step "asan-build-$n" $SANCC $STRICT $SAN -I. "$t" -o "$B/$n.asan" -lm -lpthread &&
        ASAN_OPTIONS=detect_leaks=0 KVC_TEST_SCALE=0.3 checks "asan-$n" "$B/$n.asan" "$seed"
      continue
    fi
    step "asan-build-$n" $SANCC $STRICT $SAN -I. "$t" -o "$B/$n.asan" -lm -lpthread && checks "asan-$n" "$B/$n.asan" "$seed"
  done
  for fz in $fuzzers; do
    n=$(fuzz_name "$fz")
    step "asan-build-fuzz-$n" $SANCC $STRICT $SAN -I. tests/fuzz_replay.c "$fz" -o "$B/fuzz_$n.asan" -lm &&
      replay "asan-fuzz-replay-$n" "$B/fuzz_$n.asan" "$n"
  done
  if [ -f examples/tinylm.c ]; then
    step asan-build-tinylm $SANCC $STRICT $SAN -I. examples/tinylm.c -o "$B/tinylm.asan" -lm &&
      step asan-tinylm "$B/tinylm.asan" --quiet --chunk 5 tests/data/mistral-swa-tiny
  fi
else skip sanitizers "the compiler cannot build with -fsanitize=address,undefined"; fi

stage valgrind "valgrind memcheck"
if have valgrind; then
  VG="valgrind -q --error-exitcode=9 --leak-check=full --errors-for-leak-kinds=all"
  # test_vk on lavapipe: LLVM's and the dynamic linker's process-lifetime state is still
  # reachable at exit; tests/valgrind-vk.supp suppresses exactly those blocks (reachable
  # ones the driver stack allocated by itself; its patterns reach the loader's dlopen
  # frames, hence the deeper stacks, and name its frames after the test's dlclose, hence
  # keep-debuginfo). 3 episodes (one per cache kind): ~20-30 s once Mesa's shader cache
  # holds the pipelines the runs above compiled, 1-3 min when it is cold.
  VGVK="--keep-debuginfo=yes --num-callers=40 --suppressions=tests/valgrind-vk.supp"
  for t in $tests; do
    n=$(basename "$t" .c)
    vgx=""; [ "$n" = test_vk ] && vgx=$VGVK
    step "vg-build-$n" $CC $STRICT -O1 -g -I. "$t" -o "$B/$n.vg" -lm -lpthread &&
      KVC_TEST_SCALE=0.05 checks "valgrind-$n" $VG $vgx "$B/$n.vg" "$seed"
  done
  for fz in $fuzzers; do
    n=$(fuzz_name "$fz")
    step "vg-build-fuzz-$n" $CC $STRICT -O1 -g -I. tests/fuzz_replay.c "$fz" -o "$B/fuzz_$n.vg" -lm &&
      replay "valgrind-fuzz-replay-$n" "$B/fuzz_$n.vg" "$n" $VG
  done
  for e in $examples; do n=$(basename "$e" .c); step "valgrind-example-$n" $VG "$B/$n"; done
  [ -f examples/tinylm.c ] && step valgrind-tinylm $VG "$B/tinylm" --quiet tests/data/llama-tiny
else skip valgrind "valgrind not installed"; fi

stage matrix "compiler and target matrix (KVC_TEST_SCALE=0.05; every fuzz corpus replayed too)"
# mx LABEL "COMPILER FLAGS" [RUNNER] -- PROGRAMS: build each test program (tests/test_NAME.c,
# or fuzz:NAME for a fuzz target with the replay driver) and run it at reduced scale.
MXS=0.05
MXLIBS="-lm -lpthread"
mx() {
  local label=$1 cc=$2 runner=$3; shift 4
  local p n src t0=$SECONDS
  for p in "$@"; do
    case $p in
      fuzz:*) n=${p#fuzz:}
        step "$label-build-fuzz-$n" $cc -I. tests/fuzz_replay.c "tests/fuzz_$n.c" -o "$B/mx-$label-fuzz-$n" $MXLIBS &&
          replay "$label-fuzz-replay-$n" "$B/mx-$label-fuzz-$n" "$n" $runner ;;
      *) src=tests/test_$p.c
        [ -f "$src" ] || continue
        step "$label-build-$p" $cc -I. "$src" -o "$B/mx-$label-$p" $MXLIBS &&
          KVC_TEST_SCALE=$MXS checks "$label-$p" $runner "$B/mx-$label-$p" "$seed" ;;
    esac
  done
  echo "        ($label: $((SECONDS - t0)) s)"
}
all_tests=""; for t in $tests; do all_tests="$all_tests $(basename "$t" .c | sed 's/^test_//')"; done
all_fuzz=""; for fz in $fuzzers; do all_fuzz="$all_fuzz fuzz:$(fuzz_name "$fz")"; done
# The library alone, strict at -O3 and with KVCACHE_STATIC (every warning an error). The
# test programs below build at -O3 / STATIC without -Wmaybe-uninitialized: inlined into
# test code, gcc warns about out-structs that a failing call would not write.
step gcc-O3-library $CC $STRICT -O3 -I. -c "$B/tu_a.c" -o "$B/tu_O3.o"
step gcc-O3-static-library $CC $STRICT -O3 -I. -c "$B/tu_static.c" -o "$B/tu_static_O3.o"
NOMU="-Wno-maybe-uninitialized"
mx gcc-O0 "$CC $STRICT -O0" "" -- $all_tests $all_fuzz
mx gcc-O3 "$CC $STRICT $NOMU -O3" "" -- $all_tests $all_fuzz
mx gcc-static "$CC $STRICT $NOMU -O2 -DKVCACHE_STATIC" "" -- $all_tests $all_fuzz
mx gcc-nosimd "$CC $STRICT -O2 -DKVCACHE_NO_SIMD" "" -- $all_tests $all_fuzz
if have clang; then
  step clang-O3-static-library clang $STRICT -O3 -I. -c "$B/tu_static.c" -o "$B/tu_static_clang.o"
  for o in O0 O3; do mx clang-$o "clang $STRICT -$o" "" -- $all_tests $all_fuzz; done # -O2: ASan's -O1 and gcc -O2 above
else skip clang-matrix "clang not installed"; fi
CXXW="-Wall -Wextra -Werror"
if have g++; then
  # C++11: every test compiles as C++11 in the first stage; here C++17 builds and runs them
  mx g++-c++17 "g++ -x c++ -std=c++17 $CXXW -O2" "" -- $all_tests $all_fuzz
else skip g++-matrix "g++ not installed"; fi
if have clang++; then
  mx clang++-c++17 "clang++ -x c++ -std=c++17 $CXXW -O2" "" -- $all_tests $all_fuzz
else skip clang++-matrix "clang++ not installed"; fi
# tcc has no SIMD intrinsics: the scalar path, a different front end, its own codegen;
# every warning tcc has (-Wall is only implicit declarations), as errors
if have tcc; then mx tcc "tcc -Wall -Wunsupported -Wwrite-strings -Werror" "" -- $all_tests $all_fuzz
else skip tcc "tcc not installed"; fi
# 32-bit ARM: size_t of 32 bits (test_limits' 32-bit cases); aarch64: the NEON paths.
# Static binaries under qemu-user, as strict as the native builds.
XW="$STRICT -O2 -static"
if have arm-linux-gnueabihf-gcc && have qemu-arm; then
  mx arm32 "arm-linux-gnueabihf-gcc $XW" qemu-arm -- core causal limits $all_fuzz
else skip arm32 "gcc-arm-linux-gnueabihf or qemu-user not installed"; fi
if have aarch64-linux-gnu-gcc && have qemu-aarch64; then
  mx aarch64 "aarch64-linux-gnu-gcc $XW" qemu-aarch64 -- core kernels limits $all_fuzz
else skip aarch64 "gcc-aarch64-linux-gnu or qemu-user not installed"; fi

stage libfuzzer "libFuzzer: each target for KVC_FUZZ_SECONDS seconds from its corpus (.ci/run: 60)"
FUZZ_S=${KVC_FUZZ_SECONDS:-0}
LF="-g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all"
if [ "$FUZZ_S" = 0 ]; then
  skip libfuzzer "KVC_FUZZ_SECONDS not set"
elif ! have clang || ! echo 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n){(void)d;(void)n;return 0;}' |
    clang $LF -x c - -o "$B/lf_probe" >/dev/null 2>&1; then
  skip libfuzzer "clang cannot link -fsanitize=fuzzer (libclang-rt-dev)"
else
  for fz in $fuzzers; do
    n=$(fuzz_name "$fz")
    # fuzz a copy: the committed corpus stays as it is; crashes land in $B/fuzz-$n-artifacts/
    rm -rf "$B/fuzz-$n-corpus" "$B/fuzz-$n-artifacts"
    mkdir -p "$B/fuzz-$n-corpus" "$B/fuzz-$n-artifacts"
    cp tests/corpus/"$n"/* "$B/fuzz-$n-corpus/" 2>/dev/null
    if step "libfuzzer-build-$n" clang $STRICT $LF -I. "$fz" -o "$B/fuzz_$n.lf" -lm; then
      if ! step "libfuzzer-$n-${FUZZ_S}s" "$B/fuzz_$n.lf" -max_total_time="$FUZZ_S" -timeout=30 -rss_limit_mb=2048 \
          -print_final_stats=1 -artifact_prefix="$B/fuzz-$n-artifacts/" "$B/fuzz-$n-corpus"; then
        for a in "$B/fuzz-$n-artifacts"/*; do
          [ -f "$a" ] && echo "  replay: $B/fuzz_$n.lf $a   (or: $B/fuzz_$n $a)"
        done
      else
        grep -E 'stat::number_of_executed_units|Done [0-9]+ runs' "$B/libfuzzer-$n-${FUZZ_S}s.log" | sed 's/^/        /'
      fi
    fi
  done
fi

stage end ""
echo "stage times:$stage_times; total $((SECONDS - run_t0))s"
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" = 0 ]
