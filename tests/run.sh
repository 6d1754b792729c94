#!/usr/bin/env bash
# tests/run.sh - every test of kvcache.h; `make test` runs this.
# Stages: strict compile checks (gcc, g++, clang, two translation units, KVCACHE_STATIC),
# the test programs and the fuzz corpora replayed, the examples and the tiny-model
# end-to-end check, then the same under ASan+UBSan and under valgrind, the compiler and
# target matrix, and libFuzzer for KVC_FUZZ_SECONDS per target when that is set; the long
# ones two at a time ("lanes", below). The last line is "N passed, N failed, N skipped".
# A test program's checks count one by one (its "RESULT name passed failed" line);
# every other step counts as one. Steps whose tool is missing are skipped, not failed.
# kvcache.h's implementation is compiled once per compiler, flags and configuration, and
# the programs that use only its API link against it (build, below; tests/unit.sh).
set -u
cd "$(dirname "$0")/.."
B=build/test
rm -rf "$B"; mkdir -p "$B" # no binary of an earlier run stands in for a failed build
passed=0 failed=0 skipped=0
CC=${CC:-gcc}
STRICT="-std=c99 -Wall -Wextra -Wpedantic -Werror"
seed=${KVC_SEED:-$(( $(date +%s) ^ $$ ))}
# lavapipe (the Vulkan tests' CPU device) on one thread: the lanes keep both cores busy, and
# its worker threads only added CPU (tinylm --vk on mistral-swa-tiny: 82 s CPU against 56,
# the same 57 s wall)
export LP_NUM_THREADS=${LP_NUM_THREADS:-1}
run_t0=$SECONDS
echo "seed $seed (KVC_SEED=$seed replays it)"

have() { command -v "$1" >/dev/null 2>&1; }

# took T0: " (N s)" since SECONDS was T0, when that is 5 s or more (what each step costs)
took() { local s=$((SECONDS - $1)); [ $s -lt 5 ] || echo " ($s s)"; }

# step NAME CMD...: run CMD, count it as one pass or fail, show its output on failure
step() {
  local name=$1 t0=$SECONDS; shift
  if "$@" >"$B/$name.log" 2>&1; then
    passed=$((passed + 1)); echo "  ok    $name$(took $t0)"
  else
    failed=$((failed + 1)); echo "  FAIL  $name$(took $t0)"; tail -n 30 "$B/$name.log"; return 1
  fi
}

# checks NAME CMD...: run a test program, add its RESULT counts (and a failure if it crashed)
checks() {
  local name=$1 t0=$SECONDS; shift
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
    echo "  ok    $name: $3 checks$(took $t0)"
  fi
}

skip() { skipped=$((skipped + 1)); echo "  skip  $1 ($2)"; }

# cpu_s: sets cpu to the CPU seconds (user + sys) this shell and the children it waited for
# have used (bash's times, in this shell: a pipe or $(...) would ask a fresh subshell)
cpu_s() {
  local f="$B/times.$BASHPID"
  times >"$f"
  cpu=$(awk '{ for (i = 1; i <= NF; ++i) { split($i, a, "m"); t += a[1] * 60 + a[2] } } END { printf "%d", t + 0.5 }' "$f")
}

# stage KEY TITLE: starts a stage; each one's wall and CPU time go into the summary at the
# end (CPU over wall: how busy the stage kept the cores)
stage_key="" stage_t0=$SECONDS stage_cpu0=0 stage_times=""
stage() {
  local cpu; cpu_s
  [ -n "$stage_key" ] && stage_times="$stage_times $stage_key $((SECONDS - stage_t0)) s (cpu $((cpu - stage_cpu0)) s),"
  stage_key=$1 stage_t0=$SECONDS stage_cpu0=$cpu
  [ -n "$2" ] && echo "== $2"
}

# Lanes: the long stages are cut into jobs ("lanes") that run up to KVC_JOBS (default: the
# CPU count) at a time, each next one starting as soon as one ends, longest first (this
# 2-core machine's CI took 21 min one after the other, 19 in two fixed halves). lane NAME
# FUNCTION ARGS... runs FUNCTION ARGS in the background with its own counts, its output
# kept in a file; lanes_join waits for them, prints each lane's output whole, in the order
# they started, and adds the counts. Lanes build and write distinct files under $B
# (test_persist writes next to its own binary). KVC_JOBS=1 runs each lane in turn.
JOBS=${KVC_JOBS:-$(nproc 2>/dev/null || echo 1)}
lanes=""
lane() {
  local name=$1; shift
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n; done
  rm -f "$B/lane-$name.count"
  ( passed=0 failed=0 skipped=0 t0=$SECONDS; "$@"
    cpu_s; [ $((SECONDS - t0)) -lt 10 ] || echo "        ($name: $((SECONDS - t0)) s, cpu $cpu s)"
    echo "$passed $failed $skipped" >"$B/lane-$name.count" ) >"$B/lane-$name.out" 2>&1 &
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

# build LABEL "CC FLAGS" SRC OUT LIBS...: build the program SRC (a test or an example) into
# OUT. kvcache.h's implementation is compiled once per LABEL (the compiler and flags) and
# configuration: SRC's unit has only the API and links against $B/lib/LABEL-lib-CONFIG.o,
# unless tests/unit.sh says it needs the implementation in its own unit ("whole"; it says
# why), or the flags define KVCACHE_STATIC (nothing of the library is visible outside a
# unit). The object is built by the first lane that needs it; the others wait (flock).
build() {
  local label=$1 cc=$2 src=$3 out=$4 unit xnone=""; shift 4
  unit=$(bash tests/unit.sh "$src")
  case "$unit $cc" in whole*|*KVCACHE_STATIC*) $cc -I. "$src" -o "$out" "$@"; return ;; esac
  case " $cc " in *" -x "*) xnone="-x none" ;; esac # g++ -x c++: the object is no source
  lib_obj "$label" "$cc" "$unit" &&
    $cc -I. -DKVCACHE_IMPLEMENTATION_DONE "$src" $xnone "$B/lib/$label-$unit.o" -o "$out" "$@"
}
# lib_obj LABEL "CC FLAGS" lib-CONFIG: build $B/lib/LABEL-lib-CONFIG.o once (its compiler
# errors go to the log of the first program that needed it)
lib_obj() {
  local o="$B/lib/$1-$3.o"
  mkdir -p "$B/lib"
  ( flock 9
    [ -f "$o" ] && exit 0
    [ -f "$o.failed" ] && { echo "$o did not build (the first program that needed it shows why)"; exit 1; }
    { bash tests/unit.sh --source "$3" >"${o%.o}.c" && $2 -I. -c "${o%.o}.c" -o "$o"; } || { touch "$o.failed"; exit 1; }
  ) 9>"$o.lock"
}

tests=$(ls tests/test_*.c)
examples=$(ls examples/*.c | grep -v tinylm | grep -v redis_store) # redis_store: hiredis and a server (redis_tiers)
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
# the docs name every test program, fuzz target and saved-format section (one check each)
checks docs bash tests/docs_check.sh
printf '#define KVCACHE_IMPLEMENTATION\n#include "kvcache.h"\nint main(void){return 0;}\n' > "$B/tu_a.c"
printf '#include "kvcache.h"\nint kvc_second_tu(void){kvc_pool_config c; return (int)kvc_pool_config_init(&c);}\n' > "$B/tu_b.c"
printf '#define KVCACHE_STATIC\n#define KVCACHE_IMPLEMENTATION\n#include "kvcache.h"\nint main(void){return 0;}\n' > "$B/tu_static.c"
# in lanes, longest first: g++ (the programs as C++), the Vulkan backend, gcc, clang
compile_gcc() {
  step gcc-c99-two-units sh -c "$CC $STRICT -I. -c $B/tu_a.c -o $B/tu_a.o && $CC $STRICT -I. -c $B/tu_b.c -o $B/tu_b.o && $CC $B/tu_a.o $B/tu_b.o -o $B/tu -lm"
  step gcc-static sh -c "$CC $STRICT -I. $B/tu_static.c -o $B/tu_static -lm"
}
compile_cxx() {
  step g++-c++11 g++ -x c++ -std=c++11 -Wall -Wextra -Wpedantic -Werror -I. -c "$B/tu_a.c" -o "$B/tu_cxx.o"
  # each program's code as C++: its own (and the implementation's too where it keeps that in
  # its unit: tests/unit.sh), checked without code generation (-fsyntax-only: the same
  # diagnostics at -O0, a fifth of the time); the step above and the matrix's g++ -O2
  # programs generate the implementation's C++ code
  local t n api
  for t in $tests $fuzzers fuzz/fuzz_replay.c; do
    n=$(basename "$t" .c) api=""; [ "$(bash tests/unit.sh "$t")" = whole ] || api=-DKVCACHE_IMPLEMENTATION_DONE
    step "g++-$n" g++ -x c++ -std=c++11 -Wall -Wextra -Werror -I. $api -fsyntax-only "$t"
  done
}
# the library as clang compiles it at -O0: the matrix's clang -O0 programs link this object
compile_clang() { step clang-c99 lib_obj clang-O0 "clang $STRICT -O0" lib-default; }

# the Vulkan backend: kvcache_vk.h builds with and without VK_NO_PROTOTYPES, in C and
# C++, in two translation units; its committed SPIR-V is what glslc makes of shaders/
have_vk=0
echo '#include <vulkan/vulkan.h>' | $CC -x c -fsyntax-only - >/dev/null 2>&1 && have_vk=1
compile_vk() {
  printf '#define KVCACHE_IMPLEMENTATION\n#define KVCACHE_VK_IMPLEMENTATION\n#define KVCACHE_VK_HELPERS\n#define VK_NO_PROTOTYPES\n#include "kvcache.h"\n#include "kvcache_vk.h"\nint main(void){return 0;}\n' > "$B/tu_vk.c"
  printf '#include "kvcache.h"\n#include "kvcache_vk.h"\nint kvc_vk_second_tu(void){return kvc_vk_context_destroy(0) == KVC_ERR_NULL;}\n' > "$B/tu_vk_b.c"
  printf '#define KVCACHE_IMPLEMENTATION\n#define KVCACHE_VK_IMPLEMENTATION\n#include "kvcache.h"\n#include "kvcache_vk.h"\nint main(void){return 0;}\n' > "$B/tu_vk_proto.c"
  step gcc-vk-two-units sh -c "$CC $STRICT -I. -c $B/tu_vk.c -o $B/tu_vk.o && $CC $STRICT -I. -c $B/tu_vk_b.c -o $B/tu_vk_b.o && $CC $B/tu_vk.o $B/tu_vk_b.o -o $B/tu_vk -lm"
  step gcc-vk-prototypes sh -c "$CC $STRICT -I. $B/tu_vk_proto.c -o $B/tu_vk_proto -lm -lvulkan"
  have g++ && step g++-vk-c++11 g++ -x c++ -std=c++11 -Wall -Wextra -Wpedantic -Werror -I. -c "$B/tu_vk.c" -o "$B/tu_vk_cxx.o"
  have clang && step clang-vk clang $STRICT -I. -c "$B/tu_vk.c" -o "$B/tu_vk_clang.o"
}
if have g++; then lane compile-g++ compile_cxx; else skip g++ "g++ not installed"; fi
if [ $have_vk = 1 ]; then lane compile-vk compile_vk
else skip kvcache_vk "no Vulkan headers (apt-get install libvulkan-dev)"; fi
lane compile-gcc compile_gcc
if have clang; then lane compile-clang compile_clang; else skip clang-c99 "clang not installed"; fi
if have glslc; then
  lane shaders step shaders-committed sh -c "cp kvcache_vk.h $B/kvcache_vk.h && bash shaders/embed.sh $B/kvcache_vk.h && cmp kvcache_vk.h $B/kvcache_vk.h"
else skip shaders-committed "glslc not installed"; fi
lanes_join

stage tests "tests (gcc -O2 -g1), the fuzz corpora, the examples and the tiny-model end-to-end check"
# -g1: line tables and function names, what valgrind's and the sanitizers' stack traces show;
# the full -g (the variables' locations too) made the builds about 20 % longer (gcc 12, the 10
# largest units: 133 s against 111 s CPU), and no step here reads it
O2="$CC $STRICT -O2 -g1"
# test_one tests/test_NAME.c: build it (valgrind runs this binary later) and run it
# (test_vk at half scale: lavapipe compiling each new pipeline is what costs, 136 s in full)
test_one() {
  local n scale=1; n=$(basename "$1" .c)
  [ "$n" = test_vk ] && scale=0.5
  step "build-$n" build O2 "$O2" "$1" "$B/$n" -lm -lpthread && KVC_TEST_SCALE=$scale checks "$n" "$B/$n" "$seed"
}
fuzz_replays() {
  # a target that configures kvcache.h with macros could not share the replay program
  step fuzz-targets-share-a-build sh -c '! grep -n "^[[:space:]]*#[[:space:]]*define[[:space:]]*KVCACHE_" "$@" | grep -v KVCACHE_IMPLEMENTATION' sh $fuzzers
  step build-fuzz $O2 -I. fuzz/fuzz_replay.c "$B/fuzz_all.c" -o "$B/fuzz" -lm &&
    for n in $fuzz_names; do replay "fuzz-replay-$n" "$B/fuzz" "$n"; done
}
example_one() { build O2 "$O2" "$1" "$B/$2" -lm && "$B/$2"; }
run_examples() {
  for e in $examples; do
    n=$(basename "$e" .c)
    step "example-$n" example_one "$e" "$n"
  done
}
# one tinylm for the CPU runs and the Vulkan ones (--vk; -DTINYLM_VK where the Vulkan headers
# are: without --vk it runs as a build without it, and opens no loader): built by the first
# lane that needs it, the other waits (flock), as lib_obj does
tinylm_build() {
  local vk=""; [ $have_vk = 1 ] && vk=-DTINYLM_VK
  ( flock 9
    [ -f "$B/tinylm" ] && exit 0
    [ -f "$B/tinylm.failed" ] && { echo "examples/tinylm.c did not build (build-tinylm's log shows why)"; exit 1; }
    $O2 $vk -I. examples/tinylm.c -o "$B/tinylm" -lm || { touch "$B/tinylm.failed"; exit 1; }
  ) 9>"$B/tinylm.lock"
}
tinylm() {
  echo "-- end-to-end: tiny models against Hugging Face reference logits"
  step build-tinylm tinylm_build
  for m in tests/data/*/; do
    step "tinylm-$(basename "$m")" "$B/tinylm" --quiet "$m"
    step "tinylm-$(basename "$m")-chunk7" "$B/tinylm" --quiet --chunk 7 "$m"
  done
  # models no test was tuned on (conv biases, conv_L 4 and 2, tied embeddings, Llama's
  # attention and MLP biases), made with float64 reference logits by tests/gen_model.py
  # (numpy; about 2 s each, tinylm 2-5 s)
  local py=""
  for p in python3 /usr/bin/python3; do $p -c 'import numpy' 2>/dev/null && { py=$p; break; }; done
  if [ -n "$py" ]; then
    step tinylm-gen-lfm2 sh -c "$py tests/gen_model.py $B/gen-lfm2 >/dev/null && $B/tinylm --quiet --chunk 7 $B/gen-lfm2"
    step tinylm-gen-lfm2-tied sh -c "$py tests/gen_model.py $B/gen-lfm2-tied --seed 2 --conv-L 2 --tied >/dev/null && $B/tinylm --quiet $B/gen-lfm2-tied"
    step tinylm-gen-llama-bias sh -c "$py tests/gen_model.py $B/gen-llama --arch llama --attention-bias --mlp-bias >/dev/null && $B/tinylm --quiet $B/gen-llama"
  else skip tinylm-gen "no python3 with numpy (apt-get install python3-numpy)"; fi
}
tinylm_vk() { # the same demo with the pages and attention on a Vulkan device
  step build-tinylm-vk tinylm_build
  if "$B/tinylm" --vk --quiet --reference tests/data/llama-tiny >/dev/null 2>&1; then
    for m in tests/data/*/; do
      step "tinylm-vk-$(basename "$m")" "$B/tinylm" --vk --quiet "$m"
    done
  else skip tinylm-vk "no Vulkan loader or device (apt-get install mesa-vulkan-drivers)"; fi
}
redis_tiers() { # the tiers through a real Redis (tests/redis_tiers.sh starts its own server)
  if ! have redis-server || [ ! -e /usr/include/hiredis/hiredis.h ]; then
    skip redis-tiers "redis-server or hiredis not installed (apt-get install redis-server libhiredis-dev)"; return
  fi
  CC=$CC checks redis-tiers bash tests/redis_tiers.sh "$B"
}
# two tinylm processes share the long prompt through a directory and Redis (the Redis half
# skipped with a message where it is not installed; about 10 s, most of it the -O2 build)
share_prompt() { CC=$CC checks share-prompt bash tests/share_prompt.sh "$B"; }
# test_vk's saves and loads again with 256-byte KVCACHE_IO_CHUNK: every chunk a page or two,
# so each save runs many chunks announced ahead (prefetch_pages) and each load many posted
# writes (a few seconds)
test_vk_io_chunk() {
  step build-test_vk-io-chunk build O2 "$O2 -DKVCACHE_IO_CHUNK=256" tests/test_vk.c "$B/test_vk_io_chunk" -lm -lpthread &&
    KVC_VK_SAVELOAD_ONLY=1 checks test_vk-io-chunk "$B/test_vk_io_chunk" "$seed"
}
# test_vk in two lanes, one binary: the unit tests (part 1, about 125 s) and the episodes
# (parts 2 and 4, about 50 s) followed by tinylm on the device (about 145 s), where one lane
# took 305 s (2026-11-28)
test_vk_build() { # once for both lanes (flock, as lib_obj)
  ( flock 9
    [ -f "$B/test_vk" ] && exit 0
    [ -f "$B/test_vk.failed" ] && { echo "tests/test_vk.c did not build (the other lane's build log shows why)"; exit 1; }
    build O2 "$O2" tests/test_vk.c "$B/test_vk" -lm -lpthread || { touch "$B/test_vk.failed"; exit 1; }
  ) 9>"$B/test_vk.lock"
}
test_vk_part() { # KVC_VK_PART mask, the checks' name
  step "build-$2" test_vk_build && KVC_VK_PART=$1 KVC_TEST_SCALE=0.5 checks "$2" "$B/test_vk" "$seed"
}
test_vk_episodes_then_tinylm() {
  test_vk_part 6 test_vk-episodes
  [ -f examples/tinylm.c ] && [ $have_vk = 1 ] && tinylm_vk
}
# longest first: test_vk's episodes then tinylm on lavapipe (3-4 min), its unit tests (2 min),
# tinylm, the examples, the rest
[ -f tests/test_vk.c ] && lane test_vk-episodes test_vk_episodes_then_tinylm
[ -f tests/test_vk.c ] && lane test_vk-unit test_vk_part 1 test_vk-unit
[ -f tests/test_vk.c ] || { [ -f examples/tinylm.c ] && [ $have_vk = 1 ] && lane tinylm-vk tinylm_vk; }
[ -f examples/tinylm.c ] && lane tinylm tinylm
lane examples run_examples
lane redis-tiers redis_tiers
lane fuzz-replays fuzz_replays
[ -f tests/test_vk.c ] && lane test_vk-io-chunk test_vk_io_chunk
[ -f examples/tinylm.c ] && lane share-prompt share_prompt
for t in $tests; do [ "$t" = tests/test_vk.c ] || lane "$(basename "$t" .c)" test_one "$t"; done
lanes_join

stage asan "sanitizers (ASan + UBSan, TSan) and valgrind memcheck, a lane per program"
# -O0: the checks are the same, a build takes 9 s instead of 21 (clang 14, this machine) and
# the runs at a third of the scale stay short (test_random the longest, 15 s)
SAN="-O0 -g1 -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
SANCC=$CC; have clang && SANCC=clang
TSAN="-O1 -g1 -fsanitize=thread"
VG="valgrind -q --error-exitcode=9 --leak-check=full --errors-for-leak-kinds=all"
# test_vk on lavapipe under valgrind: LLVM's and the dynamic linker's process-lifetime state
# is still reachable at exit; tests/valgrind-vk.supp suppresses exactly those blocks
# (reachable ones the driver stack allocated by itself; its patterns reach the loader's
# dlopen frames, hence the deeper stacks, and name its frames after the test's dlclose,
# hence keep-debuginfo). LLVM compiling each new pipeline under valgrind is what costs, and
# what the native runs above put in Mesa's shader cache is compiled again (presumably
# valgrind's CPU gives other keys): device setup and the error tests took 19 s, an episode
# 27-112 s, all three 240 s. So one episode per run, its cache kind (episode % 3) rotating
# with the random seed; its unit tests (KVC_VK_PART=1) and its episodes (6) in two lanes: in
# one process they took 159-474 s, cold 286 s and 219 s apart (seed 1795700697).
VGVK="--keep-debuginfo=yes --num-callers=40 --suppressions=tests/valgrind-vk.supp"
# asan_one tests/test_NAME.c: a third of the native scale (the native run has the full one;
# CI time). test_vk: the Vulkan driver's own allocations are not ours to free (the test
# counts the backend's with its own allocator), and lavapipe under ASan is slow; its calls
# are those of the native run (same seed: the unit tests, the first 3 of its 12 episodes,
# the hybrid ones shorter), which has the validation layers check them, so they are off
# here (KVC_VK_VALIDATION=0: they took 46 of its 124 s CPU under ASan)
asan_one() {
  local n scale=0.3 opts="" vl=1; n=$(basename "$1" .c)
  [ "$n" = test_vk ] && scale=0.15 opts=detect_leaks=0 vl=0
  step "asan-build-$n" build asan "$SANCC $STRICT $SAN" "$1" "$B/$n.asan" -lm -lpthread &&
    ASAN_OPTIONS=$opts KVC_VK_VALIDATION=$vl KVC_TEST_SCALE=$scale checks "asan-$n" "$B/$n.asan" "$seed"
}
asan_fuzz() {
  step asan-build-fuzz $SANCC $STRICT $SAN -I. fuzz/fuzz_replay.c "$B/fuzz_all.c" -o "$B/fuzz.asan" -lm &&
    for n in $fuzz_names; do replay "asan-fuzz-replay-$n" "$B/fuzz.asan" "$n"; done
}
asan_tinylm() {
  # at -O1: the model's arithmetic at -O0 under ASan took 123 s for three types
  step asan-build-tinylm $SANCC $STRICT ${SAN/-O0/-O1} -I. examples/tinylm.c -o "$B/tinylm.asan" -lm &&
    step asan-tinylm "$B/tinylm.asan" --quiet --chunk 5 --types f32,q4_0+rot tests/data/mistral-swa-tiny
}
# ThreadSanitizer: the programs with threads -- test_threads (a pool, its prefix tree and a
# kvc_threads shared by 4 threads; a memory's forks on two) at half scale, test_kernels (the
# kvc_threads attention) at a tenth.
tsan_one() {
  local n=$1 scale=$2
  step "tsan-build-$n" build tsan "$SANCC $STRICT $TSAN" "tests/$n.c" "$B/$n.tsan" -lm -lpthread &&
    KVC_TEST_SCALE=$scale checks "tsan-$n" "$B/$n.tsan" "$seed"
}
# valgrind memcheck runs the native -O2 -g1 binaries of the first stage
vg_one() {
  local n=$1
  [ -x "$B/$n" ] || { skip "valgrind-$n" "its native build failed"; return; }
  if [ "$n" = test_vk ]; then
    KVC_VK_HOST_ONLY=1 KVC_TEST_SCALE=0.05 checks "valgrind-$n-$3" $VG $VGVK "$B/$n" "$seed"
  else
    KVC_NO_STACK_TEST=1 KVC_TEST_SCALE=0.05 checks "valgrind-$n" $VG "$B/$n" "$seed"
  fi
}
vg_fuzz() {
  [ -x "$B/fuzz" ] && for n in $fuzz_names; do replay "valgrind-fuzz-replay-$n" "$B/fuzz" "$n" $VG; done
}
vg_examples() { # on the CPU (KVC_NO_VK: savegame.c would take lavapipe, whose LLVM stays reachable)
  for e in $examples; do n=$(basename "$e" .c); [ -x "$B/$n" ] && step "valgrind-example-$n" env KVC_NO_VK=1 $VG "$B/$n"; done
  # (q4_0+rot alone: f32 runs natively and under ASan, 33 s with both here)
  [ -x "$B/tinylm" ] && step valgrind-tinylm $VG "$B/tinylm" --quiet --types q4_0+rot tests/data/llama-tiny
}
# longest first (alone on this machine): valgrind's test_vk parts (about 4 min each), the fuzz
# replays and the examples under either tool (1-2 min), ASan per program (20-60 s), TSan,
# valgrind per program (under 20 s)
have_san=0 have_tsan=0
echo 'int main(void){return 0;}' | $SANCC $SAN -x c - -o "$B/san_probe" >/dev/null 2>&1 && have_san=1
echo 'int main(void){return 0;}' | $SANCC $TSAN -x c - -o "$B/tsan_probe" >/dev/null 2>&1 && "$B/tsan_probe" && have_tsan=1
# asan-test_vk, the longest lane (116 s in a CI run of c05b5aa), first
[ $have_san = 1 ] && [ -f tests/test_vk.c ] && lane asan-test_vk asan_one tests/test_vk.c
if have valgrind; then
  if [ -f tests/test_vk.c ]; then
    # the host side only (KVC_VK_HOST_ONLY: argument checks, saves and loads): lavapipe's
    # LLVM compiling the kernels' pipelines under memcheck took 381 s CPU an episode and over
    # 14 minutes for the unit tests (2026-11-27); the kernels run natively and under ASan
    lane valgrind-test_vk-host vg_one test_vk 1 host
  fi
  # test_kernels is the longest of the per-program runs (58 s of a 235 s stage, 2026-11-28):
  # started among the first, not last
  [ -f tests/test_kernels.c ] && lane valgrind-test_kernels vg_one test_kernels
  lane valgrind-fuzz vg_fuzz
  lane valgrind-examples vg_examples
fi
if [ $have_san = 1 ]; then
  lane asan-fuzz asan_fuzz
  [ -f examples/tinylm.c ] && lane asan-tinylm asan_tinylm
  for t in $tests; do [ "$t" = tests/test_vk.c ] || lane "asan-$(basename "$t" .c)" asan_one "$t"; done
else skip sanitizers "the compiler cannot build with -fsanitize=address,undefined"; fi
if [ $have_tsan = 1 ]; then
  [ -f tests/test_kernels.c ] && lane tsan-test_kernels tsan_one test_kernels 0.1
  [ -f tests/test_threads.c ] && lane tsan-test_threads tsan_one test_threads 0.5
else skip tsan "the compiler cannot build and run with -fsanitize=thread"; fi
if have valgrind; then
  for t in $tests; do n=$(basename "$t" .c); [ "$n" = test_vk ] || [ "$n" = test_kernels ] || lane "valgrind-$n" vg_one "$n"; done
else skip valgrind "valgrind not installed"; fi
lanes_join

# One libFuzzer program for every target (fuzz_all.c; KVC_FUZZ_TARGET names the one to
# fuzz): a build instead of one per target, made in a lane of the matrix stage (alone, it
# kept one core idle for 39 s). Each target is then one single-threaded process, up to
# KVC_JOBS side by side, each for the full KVC_FUZZ_SECONDS.
FUZZ_S=${KVC_FUZZ_SECONDS:-0}
LF="-g1 -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all"
have_lf=0
if [ "$FUZZ_S" != 0 ] && have clang && echo 'int LLVMFuzzerTestOneInput(const unsigned char *d, unsigned long n){(void)d;(void)n;return 0;}' |
    clang $LF -x c - -o "$B/lf_probe" >/dev/null 2>&1; then
  have_lf=1
fi
lf_build() {
  { cat "$B/fuzz_all.c"
    printf 'const char *kvc_fuzz_replay_name = "";\n'
    printf 'int LLVMFuzzerInitialize(int *argc, char ***argv);\n'
    printf 'int LLVMFuzzerInitialize(int *argc, char ***argv) {\n'
    printf '    (void)argc; (void)argv;\n'
    printf '    if (getenv("KVC_FUZZ_TARGET") != NULL) kvc_fuzz_replay_name = getenv("KVC_FUZZ_TARGET");\n'
    printf '    return 0;\n}\n'; } >"$B/fuzz_all_lf.c"
  step libfuzzer-build clang $STRICT $LF -I. "$B/fuzz_all_lf.c" -o "$B/fuzz_all.lf" -lm
}
lf_one() {
  local n=$1 log="$B/libfuzzer-$1-${FUZZ_S}s.log" a
  # fuzz a copy: the committed corpus stays as it is; crashes land in $B/fuzz-$n-artifacts/
  rm -rf "$B/fuzz-$n-corpus" "$B/fuzz-$n-artifacts"
  mkdir -p "$B/fuzz-$n-corpus" "$B/fuzz-$n-artifacts"
  cp fuzz/corpus/"$n"/* "$B/fuzz-$n-corpus/" 2>/dev/null
  if KVC_FUZZ_TARGET=$n "$B/fuzz_all.lf" -max_total_time="$FUZZ_S" -timeout=30 -rss_limit_mb=2048 \
      -print_final_stats=1 -artifact_prefix="$B/fuzz-$n-artifacts/" "$B/fuzz-$n-corpus" >"$log" 2>&1; then
    passed=$((passed + 1)); echo "  ok    libfuzzer-$n-${FUZZ_S}s"
    grep -E 'stat::number_of_executed_units|Done [0-9]+ runs' "$log" | sed 's/^/        /'
  else
    failed=$((failed + 1)); echo "  FAIL  libfuzzer-$n-${FUZZ_S}s"; tail -n 30 "$log"
    for a in "$B/fuzz-$n-artifacts"/*; do
      [ -f "$a" ] && echo "  replay: KVC_FUZZ_TARGET=$n $B/fuzz_all.lf $a   (or: $B/fuzz --name $n $a)"
    done
  fi
}

stage matrix "compiler and target matrix (KVC_TEST_SCALE=0.05; every fuzz corpus replayed too), a lane per configuration"
# mx LABEL "COMPILER FLAGS" [RUNNER] -- PROGRAMS: build each test program (tests/test_NAME.c,
# or fuzz: every fuzz target in one replay program) and run it at reduced scale. test_vk runs
# its host side there (KVC_VK_HOST_ONLY: argument checks, saves, loads, tiers): its kernels'
# pipelines on lavapipe, new ones at each scale, took 40 s of gcc -O3's lane, and the kernels
# run in the tests stage and under ASan.
MXS=0.05
MXLIBS="-lm -lpthread"
mx() {
  local label=$1 cc=$2 runner=$3; shift 4
  local p n src
  for p in "$@"; do
    case $p in
      fuzz) step "$label-build-fuzz" $cc -I. fuzz/fuzz_replay.c "$B/fuzz_all.c" -o "$B/mx-$label-fuzz" $MXLIBS &&
          for n in $fuzz_names; do replay "$label-fuzz-replay-$n" "$B/mx-$label-fuzz" "$n" $runner; done ;;
      *) src=tests/test_$p.c
        [ -f "$src" ] || continue
        step "$label-build-$p" build "$label" "$cc" "$src" "$B/mx-$label-$p" $MXLIBS &&
          KVC_VK_HOST_ONLY=$([ "$p" = vk ] && echo 1) KVC_TEST_SCALE=$MXS checks "$label-$p" $runner "$B/mx-$label-$p" "$seed" ;;
    esac
  done
}
all_tests=""; for t in $tests; do all_tests="$all_tests $(basename "$t" .c | sed 's/^test_//')"; done
all_fuzz=""; [ -n "$fuzzers" ] && all_fuzz=fuzz
# The library alone, strict at -O3 and with KVCACHE_STATIC (every warning an error). The
# test programs below build at -O3 / STATIC without -Wmaybe-uninitialized: inlined into
# test code, gcc warns about out-structs that a failing call would not write. The strict
# -O3 library is the object the -O3 programs link (its lane builds it first).
# In two lanes (every other program; the fuzz replays in the second), which both need the
# strict object first: one lane, alone, was the matrix stage's last for 40 s on 2 cores.
mx_gcc_O3() { # half (0 or 1)
  if [ "$1" = 0 ]; then step gcc-O3-library lib_obj gcc-O3 "$CC $STRICT -O3" lib-default
  else lib_obj gcc-O3 "$CC $STRICT -O3" lib-default || true; fi # (a failure: the other lane's step)
  local p i=0 half=""
  for p in $all_tests; do [ $((i++ % 2)) = "$1" ] && half="$half $p"; done
  [ "$1" = 1 ] && half="$half $all_fuzz"
  mx gcc-O3 "$CC $STRICT $NOMU -O3" "" -- $half
}
NOMU="-Wno-maybe-uninitialized"
CXXW="-Wall -Wextra -Werror"
XW="$STRICT -O2 -static"
# A lane per configuration, longest first (CPU seconds in a CI run of c05b5aa: gcc -O3 191,
# clang -O3 90, aarch64 79, g++ C++17 73, no-SIMD 52, gcc static 46, arm32 30, clang -O0 9,
# tcc 9).
lane mx-gcc-O3-a mx_gcc_O3 0
lane mx-gcc-O3-b mx_gcc_O3 1
if have clang; then
  # clang's optimiser on the kernels and the random and model-based programs (every program
  # runs under clang at -O0 with ASan, and under gcc at -O2 and -O3)
  lane mx-clang-O3 mx clang-O3 "clang $STRICT -O3" "" -- core kernels variants rotate tail random causal memory_radix $all_fuzz
else skip clang-matrix "clang not installed"; fi
# 32-bit ARM: size_t of 32 bits (test_limits' 32-bit cases), malloc aligned to 8; aarch64:
# the NEON paths. Static binaries under qemu-user, as strict as the native builds. gcc 12's
# aarch64 vectoriser stops with an internal error on test_variants' cascade loop: no
# auto-vectorisation there (the NEON intrinsics are what this build is for).
if have aarch64-linux-gnu-gcc && have qemu-aarch64; then
  lane mx-aarch64 mx aarch64 "aarch64-linux-gnu-gcc $XW -fno-tree-vectorize" qemu-aarch64 -- core kernels variants limits $all_fuzz
else skip aarch64 "gcc-aarch64-linux-gnu or qemu-user not installed"; fi
# C++: every program compiles as C++11 in the first stage; here g++ runs a set as C++17
if have g++; then
  lane mx-g++-c++17 mx g++-c++17 "g++ -x c++ -std=c++17 $CXXW -O2" "" -- core causal radix memory_radix hybrid reserve rotate variants threads $all_fuzz
else skip g++-matrix "g++ not installed"; fi
# KVCACHE_STATIC changes linkage, not behaviour: a few programs and the fuzz replays
lane mx-gcc-static mx gcc-static "$CC $STRICT $NOMU -O2 -DKVCACHE_STATIC" "" -- core radix persist memory_radix $all_fuzz
# the scalar path alone: the kernel programs, the random and model-based ones
lane mx-gcc-nosimd mx gcc-nosimd "$CC $STRICT -O2 -DKVCACHE_NO_SIMD" "" -- core kernels variants rotate tail random hybrid $all_fuzz
# the huge-page opt-in: the slab advised MADV_HUGEPAGE (the default leaves it alone)
lane mx-gcc-hugepages mx gcc-hugepages "$CC $STRICT -O2 -DKVCACHE_HUGE_PAGES" "" -- hugepages
# -O0 (no inlining, other UB exposure): the core programs and the fuzz replays
if have clang; then lane mx-clang-O0 mx clang-O0 "clang $STRICT -O0" "" -- core causal radix memory_radix hybrid limits $all_fuzz; fi
if have arm-linux-gnueabihf-gcc && have qemu-arm; then
  lane mx-arm32 mx arm32 "arm-linux-gnueabihf-gcc $XW" qemu-arm -- core causal limits $all_fuzz
else skip arm32 "gcc-arm-linux-gnueabihf or qemu-user not installed"; fi
# tcc has no SIMD intrinsics: the scalar path, a different front end, its own codegen;
# every warning tcc has (-Wall is only implicit declarations), as errors
if have tcc; then lane mx-tcc mx tcc "tcc -Wall -Wunsupported -Wwrite-strings -Werror" "" -- $all_tests $all_fuzz
else skip tcc "tcc not installed"; fi
[ $have_lf = 1 ] && lane libfuzzer-build lf_build
lane gcc-O3-static-library step gcc-O3-static-library $CC $STRICT -O3 -I. -c "$B/tu_static.c" -o "$B/tu_static_O3.o"
have clang && lane clang-O3-static-library step clang-O3-static-library clang $STRICT -O3 -I. -c "$B/tu_static.c" -o "$B/tu_static_clang.o"
lanes_join

stage libfuzzer "libFuzzer: each target for KVC_FUZZ_SECONDS seconds from its corpus (.ci/run: 10), $JOBS at a time"
if [ "$FUZZ_S" = 0 ]; then
  skip libfuzzer "KVC_FUZZ_SECONDS not set"
elif [ $have_lf = 0 ]; then
  skip libfuzzer "clang cannot link -fsanitize=fuzzer (libclang-rt-dev)"
elif [ -x "$B/fuzz_all.lf" ]; then # (a failed build counted in the matrix stage)
  for n in $fuzz_names; do lane "libfuzzer-$n" lf_one "$n"; done
  lanes_join
fi

stage end ""
cpu_s; echo "stage times:${stage_times%,}; total $((SECONDS - run_t0)) s (cpu $cpu s)"
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" = 0 ]
