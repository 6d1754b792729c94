/* bench_host.c - what the cache's memory costs the host program's own work.

   An engine loop: a small transformer's decode steps, whose weight matmuls (f32, the
   engine's own malloc'd memory, --weights-mib in all) run beside a kvcache.h FULL
   cache (f16) that the same steps append to and attend over. The weights are what
   the host program owns; the cache is what the library owns. Built twice - with and
   without -DKVCACHE_HUGE_PAGES (MADV_HUGEPAGE on the cache's slab) - and run
   alternately, it shows whether the library's memory advice changes the speed of
   the host's matmuls (issue 35: an adopter saw them 3-41 % slower with the advice).

   Per step: for each layer q/k/v/o and the MLP's gate/up/down matrix-vector products
   (timed: "matmul"), then kvc_begin, kvc_put and kvc_attention (timed: "cache").
   Printed: the median and the spread (min-max) of the per-step times over --steps
   decode steps, after --prompt tokens of prefill (K/V appended, no matmuls), and the
   process's resident memory. The times are the thread's CPU time (user + system, so
   page faults and compaction count; time spent descheduled by other processes on a
   shared machine does not). With --weights-4k the weights are advised MADV_NOHUGEPAGE,
   as an engine's weights are on a kernel whose THP mode is "madvise" (or mmapped from
   a file): then only the cache can have huge pages. Nothing is asserted. Exit status 1
   on a library error.

   Build:  cc -std=c99 -O2 bench/bench_host.c -o bench_host -lm            (no advice)
           cc -std=c99 -O2 -DKVCACHE_HUGE_PAGES bench/bench_host.c -o ...  (advice)
   Usage:  bench_host [--quick] [--weights-mib N] [--prompt N] [--steps N] [--weights-4k] [--help]
             --weights-mib  the weights' size (default 64; 6 layers, hidden 512)
             --prompt       tokens in the cache before the timed steps (default 4096)
             --steps        timed decode steps (default 200)
             --weights-4k   advise the weights MADV_NOHUGEPAGE (4 KiB pages)
             --quick        32 MiB of weights, 512 prompt tokens, 20 steps (a second)
   A/B:    for i in 1 2 3 4 5; do ./bench_host_huge; ./bench_host_nohuge; done */
#define _POSIX_C_SOURCE 199309L
#define _DEFAULT_SOURCE /* madvise and MADV_HUGEPAGE in <sys/mman.h> under -std=c99 */
#define KVCACHE_IMPLEMENTATION
#include "../kvcache.h"
#include "bench_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LAYERS 6
#define HIDDEN 512
#define HEADS 8
#define KV_HEADS 4
#define HEAD_DIM 64
#define KVD (KV_HEADS * HEAD_DIM)
#define MAX_STEPS 100000

typedef struct layer {
    float *wq, *wk, *wv, *wo, *gate, *up, *down;
} layer;

static int g_inter;      /* the MLP's width: sets the weights' size */
static int g_weights_4k; /* --weights-4k */

/* the thread's CPU time in seconds */
static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* y[out] = W[out][in] . x[in] (8 partial sums, as an engine's plain C matmul) */
static void matvec(float *y, const float *w, const float *x, int in, int out) {
    for (int o = 0; o < out; ++o) {
        const float *r = w + (size_t)o * in;
        float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0}, s = 0;
        for (int k = 0; k < in; k += 8)
            for (int u = 0; u < 8; ++u) acc[u] += r[k + u] * x[k + u];
        for (int u = 0; u < 8; ++u) s += acc[u];
        y[o] = s;
    }
}

static float *random_floats(size_t n, uint32_t *seed) {
    float *p = (float *)malloc(n * sizeof *p);
    if (!p) { fprintf(stderr, "out of memory\n"); exit(1); }
#ifdef MADV_NOHUGEPAGE
    if (g_weights_4k) { /* before the first touch: the 2 MiB-aligned part */
        uintptr_t huge = (uintptr_t)1 << 21, lo = ((uintptr_t)p + huge - 1) & ~(huge - 1);
        uintptr_t hi = ((uintptr_t)(p + n)) & ~(huge - 1);
        if (hi > lo) (void)madvise((void *)lo, (size_t)(hi - lo), MADV_NOHUGEPAGE);
    }
#endif
    for (size_t i = 0; i < n; ++i) {
        *seed = *seed * 1664525u + 1013904223u;
        p[i] = (float)((*seed >> 8) * (1.0 / 16777216.0) - 0.5) * 0.1f;
    }
    return p;
}

static double resident_mib(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    long size = 0, rss = 0;
    if (!f) return 0;
    if (fscanf(f, "%ld %ld", &size, &rss) != 2) rss = 0;
    fclose(f);
    return rss * 4096.0 / (1024.0 * 1024.0);
}

static void usage(FILE *to, const char *argv0) {
    fprintf(to, "usage: %s [--quick] [--weights-mib N] [--prompt N] [--steps N] [--weights-4k] [--help]\n"
                "  --weights-mib N  the engine's f32 weights, 6 layers of hidden 512 (default 64)\n"
                "  --prompt N       tokens in the cache before the timed steps (default 4096)\n"
                "  --steps N        timed decode steps, median and spread printed (default 200)\n"
                "  --weights-4k     advise the weights MADV_NOHUGEPAGE (as under THP \"madvise\")\n"
                "  --quick          32 MiB of weights, 512 prompt tokens, 20 steps\n"
                "Build with and without -DKVCACHE_HUGE_PAGES and run the two alternately.\n",
            argv0);
}

int main(int argc, char **argv) {
    long weights_mib = 64, prompt = 4096, steps = 200;
    uint32_t seed = 12345;
    layer w[LAYERS];
    kvc_pool_config pc;
    kvc_cache_config cc;
    kvc_pool *pool;
    kvc_cache *cache;
    float *x, *q, *k, *v, *att, *h, *g, *u, *kv_rows;
    double *t_mm, *t_cache;

    for (int a = 1; a < argc; ++a) {
        long val = a + 1 < argc ? strtol(argv[a + 1], NULL, 10) : -1;
        if (!strcmp(argv[a], "--help") || !strcmp(argv[a], "-h")) { usage(stdout, argv[0]); return 0; }
        if (!strcmp(argv[a], "--weights-4k")) { g_weights_4k = 1; continue; }
        if (!strcmp(argv[a], "--quick")) { weights_mib = 32, prompt = 512, steps = 20; continue; }
        if (!strcmp(argv[a], "--weights-mib") && val >= 4 && val <= 4096) weights_mib = val;
        else if (!strcmp(argv[a], "--prompt") && val >= 0 && val <= 1 << 20) prompt = val;
        else if (!strcmp(argv[a], "--steps") && val >= 1 && val <= MAX_STEPS) steps = val;
        else { usage(stderr, argv[0]); return 2; }
        ++a;
    }
    /* per layer 4 hidden^2 (q and o; k and v are half) + 3 hidden x inter floats */
    g_inter = (int)(((double)weights_mib * 1048576 / 4 / LAYERS - 3.0 * HIDDEN * HIDDEN) / (3.0 * HIDDEN));
    g_inter = g_inter < 8 ? 8 : g_inter / 8 * 8;
    for (int l = 0; l < LAYERS; ++l) {
        w[l].wq = random_floats((size_t)HIDDEN * HIDDEN, &seed);
        w[l].wk = random_floats((size_t)KVD * HIDDEN, &seed);
        w[l].wv = random_floats((size_t)KVD * HIDDEN, &seed);
        w[l].wo = random_floats((size_t)HIDDEN * HIDDEN, &seed);
        w[l].gate = random_floats((size_t)g_inter * HIDDEN, &seed);
        w[l].up = random_floats((size_t)g_inter * HIDDEN, &seed);
        w[l].down = random_floats((size_t)HIDDEN * g_inter, &seed);
    }
    x = random_floats(HIDDEN, &seed), q = random_floats(HIDDEN, &seed), k = random_floats(KVD, &seed);
    v = random_floats(KVD, &seed), att = random_floats(HIDDEN, &seed), h = random_floats(HIDDEN, &seed);
    g = random_floats((size_t)g_inter, &seed), u = random_floats((size_t)g_inter, &seed);
    kv_rows = random_floats((size_t)256 * KVD, &seed);
    t_mm = (double *)malloc((size_t)steps * sizeof *t_mm);
    t_cache = (double *)malloc((size_t)steps * sizeof *t_cache);
    if (!t_mm || !t_cache) return 1;

    CHECK(kvc_pool_config_init(&pc));
    pc.n_layers = LAYERS;
    pc.n_kv_heads = KV_HEADS;
    pc.head_dim_k = pc.head_dim_v = HEAD_DIM;
    pc.type_k = pc.type_v = KVC_TYPE_F16;
    CHECK(kvc_pool_budget_for_tokens(&pc, (int32_t)(prompt + steps + 256), &pc.budget_bytes));
    CHECK(kvc_pool_create(&pc, &pool));
    memset(&cc, 0, sizeof cc);
    cc.kind = KVC_KIND_FULL;
    CHECK(kvc_cache_create(pool, &cc, &cache));
    for (long done = 0; done < prompt;) { /* prefill: K/V only, 256 tokens a batch */
        int32_t n = (int32_t)(prompt - done < 256 ? prompt - done : 256);
        CHECK(kvc_begin(cache, n, NULL, 0));
        for (int l = 0; l < LAYERS; ++l) CHECK(kvc_put(cache, l, kv_rows, kv_rows));
        done += n;
    }
    for (long s = 0; s < steps; ++s) {
        double mm = 0, ca = 0, t0;
        CHECK(kvc_begin(cache, 1, NULL, 0));
        for (int l = 0; l < LAYERS; ++l) {
            kvc_attention_desc d;
            t0 = cpu_now();
            matvec(q, w[l].wq, x, HIDDEN, HIDDEN);
            matvec(k, w[l].wk, x, HIDDEN, KVD);
            matvec(v, w[l].wv, x, HIDDEN, KVD);
            mm += cpu_now() - t0;
            t0 = cpu_now();
            CHECK(kvc_put(cache, l, k, v));
            memset(&d, 0, sizeof d);
            d.n_queries = 1;
            d.n_heads = HEADS;
            d.q = q;
            d.out = att;
            CHECK(kvc_attention(cache, l, &d));
            ca += cpu_now() - t0;
            t0 = cpu_now();
            matvec(h, w[l].wo, att, HIDDEN, HIDDEN);
            matvec(g, w[l].gate, h, HIDDEN, g_inter);
            matvec(u, w[l].up, h, HIDDEN, g_inter);
            for (int i = 0; i < g_inter; ++i) g[i] *= u[i];
            matvec(h, w[l].down, g, g_inter, HIDDEN);
            for (int i = 0; i < HIDDEN; ++i) x[i] = 0.5f * x[i] + 0.01f * h[i]; /* bounded */
            mm += cpu_now() - t0;
        }
        t_mm[s] = mm, t_cache[s] = ca;
    }
    {
        double mm_med, ca_med, mm_lo, mm_hi, ca_lo, ca_hi;
        mm_med = median(t_mm, (int)steps), ca_med = median(t_cache, (int)steps); /* sorts */
        mm_lo = t_mm[0], mm_hi = t_mm[steps - 1], ca_lo = t_cache[0], ca_hi = t_cache[steps - 1];
#if defined(KVCACHE_HUGE_PAGES) && defined(MADV_HUGEPAGE)
        const char *advice = "MADV_HUGEPAGE";
#else
        const char *advice = "none";
#endif
        printf("bench_host: advice %-13s weights %.0f MiB%s, cache %ld+%ld tokens (%.0f MiB f16): "
               "cpu: matmul %.3f ms/step (%.3f-%.3f), cache %.3f ms/step (%.3f-%.3f), resident %.0f MiB\n",
               advice, 4.0 * LAYERS * ((double)4 * HIDDEN * HIDDEN - 2.0 * (HIDDEN - KVD) * HIDDEN +
                                       3.0 * HIDDEN * g_inter) / 1048576, g_weights_4k ? " (4k)" : "",
               prompt, steps, (double)pc.budget_bytes / 1048576, mm_med * 1e3, mm_lo * 1e3, mm_hi * 1e3,
               ca_med * 1e3, ca_lo * 1e3, ca_hi * 1e3, resident_mib());
    }
    CHECK(kvc_cache_destroy(cache));
    CHECK(kvc_pool_destroy(pool));
    for (int l = 0; l < LAYERS; ++l)
        free(w[l].wq), free(w[l].wk), free(w[l].wv), free(w[l].wo), free(w[l].gate), free(w[l].up), free(w[l].down);
    free(x), free(q), free(k), free(v), free(att), free(h), free(g), free(u), free(kv_rows), free(t_mm), free(t_cache);
    return 0;
}
