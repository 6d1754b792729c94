# kvcache.h - `make` builds and runs the tiny-model demo, `make check` is the quick loop
# before a commit (every test program at reduced scale and every fuzz corpus, in parallel,
# under 90 s on two cores), `make test` runs every test (tests/run.sh, what CI runs),
# `make bench` runs the benchmarks (`make bench-build` only builds them, `make bench-quick` runs
# each with --quick: small sizes, a smoke run of every path in seconds), `make examples`
# builds and runs the small examples, `make shaders` regenerates the Vulkan backend's SPIR-V.
CC ?= cc
CFLAGS ?= -std=c99 -O2 -Wall -Wextra -Wpedantic -Werror
BENCHFLAGS ?= -std=c99 -O2 -Wall -Wextra -Wpedantic -Werror
BUILD = build
EXAMPLES = $(filter-out examples/tinylm.c examples/redis_store.c,$(wildcard examples/*.c)) # redis_store: tests/redis_tiers.sh
BENCHES = $(wildcard bench/bench_*.c)

.PHONY: all run check test bench bench-build bench-quick examples clean shaders

all: run

$(BUILD):
	mkdir -p $(BUILD)

$(BUILD)/tinylm: examples/tinylm.c kvcache.h | $(BUILD)
	$(CC) $(CFLAGS) -I. $< -o $@ -lm

# the main demo: a real transformer through the cache, checked against Hugging Face, for
# every model in tests/data
run: $(BUILD)/tinylm
	./$(BUILD)/tinylm tests/data/*/

# `make check`: every test program (tests/test_*.c; test_vk, which needs a Vulkan driver
# and takes longest, only with VK=1) at KVC_TEST_SCALE=$(CHECK_SCALE), and every fuzz
# corpus replayed through one program (fuzz/gen_fuzz_all.sh), built and run CHECK_JOBS at
# a time, and tests/docs_check.sh. Built at -O1: the builds are most of the time, so
# kvcache.h's implementation is compiled once per configuration (below). A binary is
# rebuilt only when its sources changed; the programs always run. The last line is
# "N passed, N failed" (tests/check_summary.sh); the exit status is non-zero on any failure.
CHECK_SCALE ?= 0.1
CHECK_JOBS ?= 2
CHECK_CFLAGS ?= -std=c99 -O1 -Wall -Wextra -Wpedantic -Werror
CHECK = $(BUILD)/check
CHECK_TESTS = $(filter-out $(if $(filter 1,$(VK)),,test_vk),$(basename $(notdir $(wildcard tests/test_*.c))))
FUZZ_NAMES = $(patsubst fuzz/fuzz_%.c,%,$(filter-out fuzz/fuzz_replay.c,$(wildcard fuzz/fuzz_*.c)))
# the fuzz replays first: their program (every target in one unit) takes longest to build
CHECK_LOGS = $(FUZZ_NAMES:%=$(CHECK)/fuzz-%.log) $(CHECK_TESTS:%=$(CHECK)/%.log) $(CHECK)/docs.log
TEST_DEPS = kvcache.h kvcache_vk.h $(wildcard tests/*.h fuzz/*.c fuzz/*.h) # some tests run a fuzz engine
FUZZ_DEPS = kvcache.h $(wildcard fuzz/*.c fuzz/*.h) tests/ref_model.h tests/load_fixture.h tests/format_bytes.h

check:
	@mkdir -p $(CHECK) && rm -f $(CHECK)/*.log
	@$(MAKE) --no-print-directory -k -j$(CHECK_JOBS) $(CHECK_LOGS); bash tests/check_summary.sh $(CHECK_LOGS)

.PRECIOUS: $(CHECK)/test_% $(CHECK)/fuzz $(CHECK)/fuzz_all.c $(CHECK)/lib-%.c $(CHECK)/lib-%.o

$(CHECK):
	mkdir -p $(CHECK)

# A test program whose unit (tests/unit.sh) is "whole" compiles kvcache.h's implementation
# itself; any other compiles only the API (-DKVCACHE_IMPLEMENTATION_DONE) and links the
# library object of its configuration (lib-default, lib-threads, ...), built once. The
# rules are made only where a goal is under $(CHECK) (the sub-make of `make check`).
ifneq ($(filter $(CHECK)/%,$(MAKECMDGOALS)),)
define check_test
$(CHECK)/$(1): tests/$(1).c $(TEST_DEPS) $(if $(filter whole,$(2)),,$(CHECK)/$(2).o) | $(CHECK)
	$$(CC) $$(CHECK_CFLAGS) -I. $(if $(filter whole,$(2)),$$<,-DKVCACHE_IMPLEMENTATION_DONE $$< $(CHECK)/$(2).o) -o $$@ -lm -lpthread
endef
$(foreach t,$(CHECK_TESTS),$(eval $(call check_test,$(t),$(shell bash tests/unit.sh tests/$(t).c))))
endif

$(CHECK)/lib-%.c: tests/unit.sh | $(CHECK)
	bash tests/unit.sh --source lib-$* >$@

$(CHECK)/lib-%.o: $(CHECK)/lib-%.c kvcache.h tests/count_alloc.h
	$(CC) $(CHECK_CFLAGS) -I. -c $< -o $@

$(CHECK_TESTS:%=$(CHECK)/%.log): $(CHECK)/%.log: $(CHECK)/%
	@echo "  run   $* (KVC_TEST_SCALE=$(CHECK_SCALE))"; KVC_TEST_SCALE=$(CHECK_SCALE) ./$< >$@ 2>&1; echo "exit $$?" >>$@

$(CHECK)/fuzz_all.c: fuzz/gen_fuzz_all.sh $(wildcard fuzz/fuzz_*.c) | $(CHECK)
	bash fuzz/gen_fuzz_all.sh >$@

$(CHECK)/fuzz: $(CHECK)/fuzz_all.c $(FUZZ_DEPS)
	$(CC) $(CHECK_CFLAGS) -I. fuzz/fuzz_replay.c $(CHECK)/fuzz_all.c -o $@ -lm

$(FUZZ_NAMES:%=$(CHECK)/fuzz-%.log): $(CHECK)/fuzz-%.log: $(CHECK)/fuzz
	@echo "  run   fuzz replay of fuzz/corpus/$*"; ./$< --name $* fuzz/corpus/$* >$@ 2>&1; echo "exit $$?" >>$@

# the docs name every test program, fuzz target and saved-format section
$(CHECK)/docs.log: | $(CHECK)
	@bash tests/docs_check.sh >$@ 2>&1; echo "exit $$?" >>$@

test:
	bash tests/run.sh

examples: | $(BUILD)
	@for e in $(EXAMPLES); do n=$$(basename $$e .c); \
	  $(CC) $(CFLAGS) -I. $$e -o $(BUILD)/$$n -lm && echo "== $$n" && ./$(BUILD)/$$n || exit 1; done

bench-build: | $(BUILD)
	@for b in $(BENCHES); do n=$$(basename $$b .c); echo "  build $$n"; \
	  $(CC) $(BENCHFLAGS) -I. $$b -o $(BUILD)/$$n -lm -lpthread || exit 1; done

bench: bench-build
	@for b in $(BENCHES); do n=$$(basename $$b .c); echo "== $$n" && ./$(BUILD)/$$n || exit 1; done

bench-quick: bench-build
	@for b in $(BENCHES); do n=$$(basename $$b .c); echo "== $$n --quick" && ./$(BUILD)/$$n --quick || exit 1; done

# regenerate the SPIR-V committed in kvcache_vk.h from shaders/*.comp (needs glslc; GLSLANG=path
# to glslang 15 or later rebuilds the -DKHR=1 modules too, see docs/design.md)
shaders:
	bash shaders/embed.sh

clean:
	rm -rf $(BUILD)
