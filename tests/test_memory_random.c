/* test_memory_random.c - randomized model-based test of model memories: random operation
   sequences (batches with checkpoints, cancel, trim, rewinds, snapshots, forks, prefix
   reuse, broken configurations, invalid arguments) on memories of FULL, ROTATING and
   RECURRENT groups, each result and every state, key and value checked against a reference
   after every step. The engine is fuzz/fuzz_memory.c's (the libFuzzer target), driven here
   by random inputs from a seed: half of them random bytes, half the committed corpus
   (fuzz/corpus/memory) with random bytes changed and appended, so `make test` covers
   fresh sequences on every run.
   `test_memory_random SEED [EPISODE]` replays a run or one episode. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
#include <dirent.h>
#include <signal.h>
#include <time.h>
#define LLVMFuzzerTestOneInput kvc_memory_episode
#include "../fuzz/fuzz_memory.c"
#undef LLVMFuzzerTestOneInput
#include "tk.h"

static unsigned long long g_seed;
static int g_episode = -1;

/* a failed check aborts inside the engine (after printing its last steps): name the replay */
static void on_abort(int sig) {
    fprintf(stderr, "episode %d failed (replay: test_memory_random %llu %d)\n", g_episode, g_seed, g_episode);
    signal(sig, SIG_DFL);
    raise(sig);
}

/* the corpus inputs, concatenated; start[i] .. start[i + 1] is input i */
static unsigned char g_corpus[1 << 20];
static size_t g_start[512];
static int g_n;

static void load_corpus(const char *dir) {
    DIR *d = opendir(dir);
    struct dirent *ent;
    size_t used = 0;
    g_start[0] = 0;
    if (d == NULL) return;
    while ((ent = readdir(d)) != NULL && g_n < 511) {
        char path[1024];
        FILE *f;
        size_t got;
        if (ent->d_name[0] == '.') continue;
        snprintf(path, sizeof(path), "%s/%s", dir, ent->d_name);
        if ((f = fopen(path, "rb")) == NULL) continue;
        got = fread(g_corpus + used, 1, sizeof(g_corpus) - used, f);
        fclose(f);
        used += got;
        g_start[++g_n] = used;
    }
    closedir(d);
}

int main(int argc, char **argv) {
    int episodes = tk_scaled(1200), e, only = argc > 2 ? atoi(argv[2]) : -1;
    unsigned char buf[8192];
    g_seed = argc > 1 ? strtoull(argv[1], NULL, 10) : (unsigned long long)time(NULL);
    printf("seed %llu\n", g_seed);
    signal(SIGABRT, on_abort);
    load_corpus("fuzz/corpus/memory");
    for (e = 0; e < episodes; ++e) {
        tk_rng rng;
        size_t n, i;
        rng.s = g_seed * 0x9E3779B97F4A7C15ull + (unsigned long long)e * 0xD1B54A32D192ED03ull + 1;
        if (g_n > 0 && e % 2) { /* a corpus input, changed */
            int k = tk_int(&rng, 0, g_n - 1), flips = tk_int(&rng, 1, 8), f;
            size_t len = g_start[k + 1] - g_start[k], tail = (size_t)tk_int(&rng, 0, 256);
            if (len + tail > sizeof(buf)) len = sizeof(buf) - tail;
            memcpy(buf, g_corpus + g_start[k], len);
            for (i = 0; i < tail; ++i) buf[len + i] = (unsigned char)tk_next(&rng);
            n = len + tail;
            for (f = 0; f < flips && n > 0; ++f) buf[tk_next(&rng) % n] = (unsigned char)tk_next(&rng);
        } else {
            n = (size_t)tk_int(&rng, 64, 4096);
            for (i = 0; i < n; ++i) buf[i] = (unsigned char)tk_next(&rng);
        }
        if (only >= 0 && e != only) continue;
        g_episode = e;
        kvc_memory_episode(buf, n);
        tk_passed++; /* the episode's every check held (a failed one aborts) */
    }
    return tk_report("memory_random");
}
