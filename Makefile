# kvcache.h - `make` builds and runs the tiny-model demo, `make test` runs every test,
# `make bench` runs the benchmarks, `make examples` builds and runs the small examples,
# `make shaders` regenerates the Vulkan backend's SPIR-V.
CC ?= cc
CFLAGS ?= -std=c99 -O2 -Wall -Wextra -Wpedantic -Werror
BENCHFLAGS ?= -std=c99 -O2 -Wall -Wextra -Wpedantic -Werror
BUILD = build
EXAMPLES = $(filter-out examples/tinylm.c,$(wildcard examples/*.c))
BENCHES = $(wildcard bench/bench_*.c)

.PHONY: all run test bench examples clean shaders

all: run

$(BUILD):
	mkdir -p $(BUILD)

$(BUILD)/tinylm: examples/tinylm.c kvcache.h | $(BUILD)
	$(CC) $(CFLAGS) -I. $< -o $@ -lm

# the main demo: a real transformer through the cache, checked against Hugging Face
run: $(BUILD)/tinylm
	./$(BUILD)/tinylm tests/data/llama-tiny tests/data/mistral-swa-tiny

examples: | $(BUILD)
	@for e in $(EXAMPLES); do n=$$(basename $$e .c); \
	  $(CC) $(CFLAGS) -I. $$e -o $(BUILD)/$$n -lm && echo "== $$n" && ./$(BUILD)/$$n || exit 1; done

test:
	bash tests/run.sh

bench: | $(BUILD)
	@for b in $(BENCHES); do n=$$(basename $$b .c); \
	  $(CC) $(BENCHFLAGS) -I. $$b -o $(BUILD)/$$n -lm -lpthread && echo "== $$n" && ./$(BUILD)/$$n || exit 1; done

# regenerate the SPIR-V committed in kvcache_vk.h from shaders/*.comp (needs glslc)
shaders:
	bash shaders/embed.sh

clean:
	rm -rf $(BUILD)
