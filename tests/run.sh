#!/usr/bin/env bash
# tests/run.sh - every test of kvcache.h; `make test` runs this.
# Stages: strict compile checks (gcc, g++, clang, two translation units, KVCACHE_STATIC),
# the test programs and the fuzz corpora replayed, the examples and the tiny-model
# end-to-end check, then the same under ASan+UBSan and under valgrind, the compiler and
# target matrix, and libFuzzer for KVC_FUZZ_SECONDS per target when that is set; the long
# ones two at a time ("lanes", below). The last line is "N passed, N failed, N skipped".
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

# Lanes: the long stages come in pairs that run side by side (this 2-core machine's CI took
# 21 min one after the other). lane NAME FUNCTION runs FUNCTION in the background with its
# own counts, its output kept in a file; lanes_join waits for them, prints each lane's
# output whole, in the order they started, and adds the counts. Lanes build and write
# distinct files under $B (test_persist writes next to its own binary). KVC_JOBS=1 (or a
# 1-CPU machine) runs each lane in turn.
JOBS=${KVC_JOBS:-$(nproc 2>/dev/null || echo 1)}
lanes=""
lane() {
  local name=$1; shift
  rm -f "$B/lane-$name.count"
  ( passed=0 failed=0 skipped=0 t0=$SECONDS; "$@"; echo "        (lane $name: $((SECONDS - t0)) s)"
    echo "$passed $failed $skipped" >"$B/lane-$name.count" ) >"$B/lane-$name.out" 2>&1 &
  [ "$JOBS" -ge 2 ] || wait
  lanes="$lanes $name"
}
lanes_join() {
  local name p f s
  wait
  for name in $lanes; do
    cat "$B/lane-$name.out"
    if read -r p f s <"$B/lane-$name.count" 2>/dev/null; then
      passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + s))
    else
      failed=$((failed + 1)); echo "  FAIL  lane $name (ended without its counts)"
    fi
  done
  lanes=""
}

tests=$(ls tests/test_*.c)
examples=$(ls examples/*.c | grep -v tinylm)
# Fuzz targets: fuzz/fuzz_NAME.c defines LLVMFuzzerTestOneInput, fuzz/corpus/NAME/ is its
# seed corpus. Every stage replays each corpus through fuzz/fuzz_replay.c (no libFuzzer
# needed); a target added later is picked up by this glob.
fuzzers=$(ls fuzz/fuzz_*.c 2>/dev/null | grep -v '/fuzz_replay\.c$')
fuzz_name() { basename "$1" .c | sed 's/^fuzz_//'; }
fuzz_names=""; for fz in $fuzzers; do fuzz_names="$fuzz_names $(fuzz_name "$fz")"; done
# One replay program per configuration for all targets: fuzz/gen_fuzz_all.sh writes
# $B/fuzz_all.c, which includes every target and runs the one --name names (its comment
# says what that asks of the targets).
bash fuzz/gen_fuzz_all.sh > "$B/fuzz_all.c"
# replay LABEL BINARY NAME [runner...]: the corpus of NAME through BINARY, counted per input
replay() {
  local label=$1 bin=$2 name=$3; shift 3
  checks "$label" "$@" "$bin" --name "$name" "fuzz/corpus/$name"
}

stage compile "compile checks"
printf '#define KVCACHE_IMPLEMENTATION\n#include "kvcache.h"\nint main(void){return 0;}\n' > "$B/tu_a.c"
printf '#include "kvcache.h"\nint kvc_second_tu(void){kvc_pool_config c; return (int)kvc_pool_config_init(&c);}\n' > "$B/tu_b.c"
printf '#define KVCACHE_STATIC\n#define KVCACHE_IMPLEMENTATION\n#include "kvcache.h"\nint main(void){return 0;}\n' > "$B/tu_static.c"
step gcc-c99-two-units sh -c "$CC $STRICT -I. -c $B/tu_a.c -o $B/tu_a.o && $CC $STRICT -I. -c $B/tu_b.c -o $B/tu_b.o && $CC $B/tu_a.o $B/tu_b.o -o $B/tu -lm"
step gcc-static sh -c "$CC $STRICT -I. $B/tu_static.c -o $B/tu_static -lm"
if have g++; then
  step g++-c++11 g++ -x c++ -std=c++11 -Wall -Wextra -Wpedantic -Werror -I. -c "$B/tu_a.c" -o "$B/tu_cxx.o"
  for t in $tests $fuzzers fuzz/fuzz_replay.c; do
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
  printf '#define KVCACHE_IMPLEMENTATION\n#define KVCACHE_VK_IMPLEMENTATION\n#define KVCACHE_VK_HELPERS\n#define VK_NO_PROTOTYPES\n#include "kvcache.h"\n#include "kvcache_vk.h"\nint main(void){return 0;}\n' > "$B/tu_vk.c"
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

stage tests "tests (gcc -O2), and beside them the examples and the tiny-model end-to-end check"
test_programs() {
for t in $tests; do
  n=$(basename "$t" .c)
  step "build-$n" $CC $STRICT -O2 -I. "$t" -o "$B/$n" -lm -lpthread && checks "$n" "$B/$n" "$seed"
done
# a target that configures kvcache.h with macros could not share the replay program
step fuzz-targets-share-a-build sh -c '! grep -n "^[[:space:]]*#[[:space:]]*define[[:space:]]*KVCACHE_" "$@" | grep -v KVCACHE_IMPLEMENTATION' sh $fuzzers
step build-fuzz $CC $STRICT -O2 -I. fuzz/fuzz_replay.c "$B/fuzz_all.c" -o "$B/fuzz" -lm &&
  for n in $fuzz_names; do replay "fuzz-replay-$n" "$B/fuzz" "$n"; done
}
examples_and_tinylm() {
echo "-- examples"
for e in $examples; do
  n=$(basename "$e" .c)
  step "example-$n" sh -c "$CC $STRICT -O2 -I. $e -o $B/$n -lm && $B/$n"
done
if [ -f examples/tinylm.c ]; then
  echo "-- end-to-end: tiny models against Hugging Face reference logits"
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
      done
    else skip tinylm-vk "no Vulkan loader or device (apt-get install mesa-vulkan-drivers)"; fi
  fi
fi
}
lane tests test_programs
lane examples examples_and_tinylm
lanes_join

stage asan "sanitizers (ASan + UBSan, TSan), and beside them valgrind memcheck"
sanitizers() {
SAN="-O1 -g -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
SANCC=$CC; have clang && SANCC=clang
if echo 'int main(void){return 0;}' | $SANCC $SAN -x c - -o "$B/san_probe" >/dev/null 2>&1; then
  for t in $tests; do
    n=$(basename "$t" .c)
    # test_vk: the Vulkan driver's own allocations are not ours to free (the test counts
    # the backend's with its own allocator), and lavapipe under ASan is slow
    if [ "$n" = test_vk ]; then
      step "asan-build-$n" $SANCC $STRICT $SAN -I. "$t" -o "$B/$n.asan" -lm -lpthread &&
        ASAN_OPTIONS=detect_leaks=0 KVC_TEST_SCALE=0.15 checks "asan-$n" "$B/$n.asan" "$seed"
      continue
    fi
    # a third of the native scale: the native run above has the full one (CI time)
    step "asan-build-$n" $SANCC $STRICT $SAN -I. "$t" -o "$B/$n.asan" -lm -lpthread &&
      KVC_TEST_SCALE=0.3 checks "asan-$n" "$B/$n.asan" "$seed"
  done
  step asan-build-fuzz $SANCC $STRICT $SAN -I. fuzz/fuzz_replay.c "$B/fuzz_all.c" -o "$B/fuzz.asan" -lm &&
    for n in $fuzz_names; do replay "asan-fuzz-replay-$n" "$B/fuzz.asan" "$n"; done
  if [ -f examples/tinylm.c ]; then
    step asan-build-tinylm $SANCC $STRICT $SAN -I. examples/tinylm.c -o "$B/tinylm.asan" -lm &&
      step asan-tinylm "$B/tinylm.asan" --quiet --chunk 5 tests/data/mistral-swa-tiny
  fi
else skip sanitizers "the compiler cannot build with -fsanitize=address,undefined"; fi
# ThreadSanitizer: the programs with threads -- test_threads (a pool, its prefix tree and a
# kvc_threads shared by 4 threads; a memory's forks on two) in full, test_kernels (the
# kvc_threads attention) at reduced scale. About 11 + 15 s alone on this 2-core machine.
TSAN="-O1 -g -fsanitize=thread"
if echo 'int main(void){return 0;}' | $SANCC $TSAN -x c - -o "$B/tsan_probe" >/dev/null 2>&1 && "$B/tsan_probe"; then
  for n in test_threads test_kernels; do
    [ -f "tests/$n.c" ] || continue
    scale=0.5; [ "$n" = test_kernels ] && scale=0.1
    step "tsan-build-$n" $SANCC $STRICT $TSAN -I. "tests/$n.c" -o "$B/$n.tsan" -lm -lpthread &&
      KVC_TEST_SCALE=$scale checks "tsan-$n" "$B/$n.tsan" "$seed"
  done
else skip tsan "the compiler cannot build and run with -fsanitize=thread"; fi
}
memcheck() {
echo "-- valgrind memcheck"
if have valgrind; then
  VG="valgrind -q --error-exitcode=9 --leak-check=full --errors-for-leak-kinds=all"
  # test_vk on lavapipe: LLVM's and the dynamic linker's process-lifetime state is still
  # reachable at exit; tests/valgrind-vk.supp suppresses exactly those blocks (reachable
  # ones the driver stack allocated by itself; its patterns reach the loader's dlopen
  # frames, hence the deeper stacks, and name its frames after the test's dlclose, hence
  # keep-debuginfo). LLVM compiling each new pipeline under valgrind is what costs, and
  # what the native runs above put in Mesa's shader cache is compiled again (presumably
  # valgrind's CPU gives other keys): device setup and the error tests took 19 s, an
  # episode 27-112 s, all three 240 s. So one episode per run, its cache kind
  # (episode % 3) rotating with the random seed.
  VGVK="--keep-debuginfo=yes --num-callers=40 --suppressions=tests/valgrind-vk.supp"
  for t in $tests; do
    n=$(basename "$t" .c)
    step "vg-build-$n" $CC $STRICT -O1 -g -I. "$t" -o "$B/$n.vg" -lm -lpthread || continue
    if [ "$n" = test_vk ]; then
      KVC_VK_EPISODE=$((seed % 3)) KVC_TEST_SCALE=0.05 checks "valgrind-$n" $VG $VGVK "$B/$n.vg" "$seed"
    else
      KVC_NO_STACK_TEST=1 KVC_TEST_SCALE=0.05 checks "valgrind-$n" $VG "$B/$n.vg" "$seed"
    fi
  done
  step vg-build-fuzz $CC $STRICT -O1 -g -I. fuzz/fuzz_replay.c "$B/fuzz_all.c" -o "$B/fuzz.vg" -lm &&
    for n in $fuzz_names; do replay "valgrind-fuzz-replay-$n" "$B/fuzz.vg" "$n" $VG; done
  for e in $examples; do n=$(basename "$e" .c); step "valgrind-example-$n" $VG "$B/$n"; done
  [ -f examples/tinylm.c ] && step valgrind-tinylm $VG "$B/tinylm" --quiet tests/data/llama-tiny
else skip valgrind "valgrind not installed"; fi
}
lane asan sanitizers
lane valgrind memcheck
lanes_join

stage matrix "compiler and target matrix (KVC_TEST_SCALE=0.05; every fuzz corpus replayed too), two lanes"
# mx LABEL "COMPILER FLAGS" [RUNNER] -- PROGRAMS: build each test program (tests/test_NAME.c,
# or fuzz: every fuzz target in one replay program) and run it at reduced scale.
MXS=0.05
MXLIBS="-lm -lpthread"
mx() {
  local label=$1 cc=$2 runner=$3; shift 4
  local p n src t0=$SECONDS
  for p in "$@"; do
    case $p in
      fuzz) step "$label-build-fuzz" $cc -I. fuzz/fuzz_replay.c "$B/fuzz_all.c" -o "$B/mx-$label-fuzz" $MXLIBS &&
          for n in $fuzz_names; do replay "$label-fuzz-replay-$n" "$B/mx-$label-fuzz" "$n" $runner; done ;;
      *) src=tests/test_$p.c
        [ -f "$src" ] || continue
        step "$label-build-$p" $cc -I. "$src" -o "$B/mx-$label-$p" $MXLIBS &&
          KVC_TEST_SCALE=$MXS checks "$label-$p" $runner "$B/mx-$label-$p" "$seed" ;;
    esac
  done
  echo "        ($label: $((SECONDS - t0)) s)"
}
all_tests=""; for t in $tests; do all_tests="$all_tests $(basename "$t" .c | sed 's/^test_//')"; done
all_fuzz=""; [ -n "$fuzzers" ] && all_fuzz=fuzz
# The library alone, strict at -O3 and with KVCACHE_STATIC (every warning an error). The
# test programs below build at -O3 / STATIC without -Wmaybe-uninitialized: inlined into
# test code, gcc warns about out-structs that a failing call would not write.
step gcc-O3-library $CC $STRICT -O3 -I. -c "$B/tu_a.c" -o "$B/tu_O3.o"
step gcc-O3-static-library $CC $STRICT -O3 -I. -c "$B/tu_static.c" -o "$B/tu_static_O3.o"
NOMU="-Wno-maybe-uninitialized"
CXXW="-Wall -Wextra -Werror"
XW="$STRICT -O2 -static"
# Two lanes (alone on this machine, before some became subsets: gcc -O3 60 s, g++ 57, clang++ 51,
# clang -O3 50, gcc static 42, gcc -O0 29, no-SIMD 27, aarch64 23, clang -O0 16, arm32 14,
# tcc 2).
matrix_gcc() {
  mx gcc-O3 "$CC $STRICT $NOMU -O3" "" -- $all_tests $all_fuzz
  mx gcc-nosimd "$CC $STRICT -O2 -DKVCACHE_NO_SIMD" "" -- $all_tests $all_fuzz
  # tcc has no SIMD intrinsics: the scalar path, a different front end, its own codegen;
  # every warning tcc has (-Wall is only implicit declarations), as errors
  if have tcc; then mx tcc "tcc -Wall -Wunsupported -Wwrite-strings -Werror" "" -- $all_tests $all_fuzz
  else skip tcc "tcc not installed"; fi
  # 32-bit ARM: size_t of 32 bits (test_limits' 32-bit cases); aarch64 (the other lane):
  # the NEON paths. Static binaries under qemu-user, as strict as the native builds.
  if have arm-linux-gnueabihf-gcc && have qemu-arm; then
    mx arm32 "arm-linux-gnueabihf-gcc $XW" qemu-arm -- core causal limits $all_fuzz
  else skip arm32 "gcc-arm-linux-gnueabihf or qemu-user not installed"; fi
  # -O0 (no inlining, other UB exposure): the core programs and the fuzz replays
  if have clang; then mx clang-O0 "clang $STRICT -O0" "" -- core causal radix memory_radix hybrid limits $all_fuzz; fi
}
matrix_clang() {
  if have clang; then
    step clang-O3-static-library clang $STRICT -O3 -I. -c "$B/tu_static.c" -o "$B/tu_static_clang.o"
    mx clang-O3 "clang $STRICT -O3" "" -- $all_tests $all_fuzz # -O2: ASan's -O1 and gcc -O2 above
  else skip clang-matrix "clang not installed"; fi
  # C++: every program compiles as C++11 in the first stage; here g++ runs a set as C++17
  if have g++; then
    mx g++-c++17 "g++ -x c++ -std=c++17 $CXXW -O2" "" -- core causal radix memory_radix hybrid reserve rotate variants threads $all_fuzz
  else skip g++-matrix "g++ not installed"; fi
  # KVCACHE_STATIC changes linkage, not behaviour: a few programs and the fuzz replays
  mx gcc-static "$CC $STRICT $NOMU -O2 -DKVCACHE_STATIC" "" -- core radix persist memory_radix $all_fuzz
  # gcc 12's aarch64 vectoriser stops with an internal error on test_variants' cascade
  # loop: no auto-vectorisation there (the NEON intrinsics are what this build is for)
  if have aarch64-linux-gnu-gcc && have qemu-aarch64; then
    mx aarch64 "aarch64-linux-gnu-gcc $XW -fno-tree-vectorize" qemu-aarch64 -- core kernels variants limits $all_fuzz
  else skip aarch64 "gcc-aarch64-linux-gnu or qemu-user not installed"; fi
}
lane matrix-gcc matrix_gcc
lane matrix-clang matrix_clang
lanes_join

# Each target is one single-threaded process: up to KVC_JOBS (default: the CPU count) fuzz
# side by side, each for the full KVC_FUZZ_SECONDS, and the next target builds meanwhile.
stage libfuzzer "libFuzzer: each target for KVC_FUZZ_SECONDS seconds from its corpus (.ci/run: 20), $JOBS at a time"
FUZZ_S=${KVC_FUZZ_SECONDS:-0}
LF="-g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all"
if [ "$FUZZ_S" = 0 ]; then
  skip libfuzzer "KVC_FUZZ_SECONDS not set"
elif ! have clang || ! echo 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n){(void)d;(void)n;return 0;}' |
    clang $LF -x c - -o "$B/lf_probe" >/dev/null 2>&1; then
  skip libfuzzer "clang cannot link -fsanitize=fuzzer (libclang-rt-dev)"
else
  started=""
  for fz in $fuzzers; do
    n=$(fuzz_name "$fz")
    # fuzz a copy: the committed corpus stays as it is; crashes land in $B/fuzz-$n-artifacts/
    rm -rf "$B/fuzz-$n-corpus" "$B/fuzz-$n-artifacts" "$B/libfuzzer-$n.rc"
    mkdir -p "$B/fuzz-$n-corpus" "$B/fuzz-$n-artifacts"
    cp fuzz/corpus/"$n"/* "$B/fuzz-$n-corpus/" 2>/dev/null
    step "libfuzzer-build-$n" clang $STRICT $LF -I. "$fz" -o "$B/fuzz_$n.lf" -lm || continue
    while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n; done
    ( "$B/fuzz_$n.lf" -max_total_time="$FUZZ_S" -timeout=30 -rss_limit_mb=2048 -print_final_stats=1 \
        -artifact_prefix="$B/fuzz-$n-artifacts/" "$B/fuzz-$n-corpus" >"$B/libfuzzer-$n-${FUZZ_S}s.log" 2>&1
      echo $? >"$B/libfuzzer-$n.rc" ) &
    started="$started $n"
  done
  wait
  for n in $started; do # the results in order, as steps
    log="$B/libfuzzer-$n-${FUZZ_S}s.log"
    if [ "$(cat "$B/libfuzzer-$n.rc" 2>/dev/null)" = 0 ]; then
      passed=$((passed + 1)); echo "  ok    libfuzzer-$n-${FUZZ_S}s"
      grep -E 'stat::number_of_executed_units|Done [0-9]+ runs' "$log" | sed 's/^/        /'
    else
      failed=$((failed + 1)); echo "  FAIL  libfuzzer-$n-${FUZZ_S}s"; tail -n 30 "$log"
      for a in "$B/fuzz-$n-artifacts"/*; do
        [ -f "$a" ] && echo "  replay: $B/fuzz_$n.lf $a   (or: $B/fuzz --name $n $a)"
      done
    fi
  done
fi

stage end ""
echo "stage times:$stage_times; total $((SECONDS - run_t0))s"
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" = 0 ]
