/* bench_core.c - the foundation benchmark of kvcache.h (run by `make bench`).

   Times, on a cache of 32k tokens x 32 layers x 8 kv heads x head dim 128 stored as
   f16 (4 GiB of K+V):
     - append: kvc_begin + kvc_put of every layer (f32 input converted to f16), as a
       prefill in batches and as a token-by-token decode; an f32-stored append too;
     - kvc_snapshot_take, kvc_cache_restore (from a snapshot) and kvc_cache_fork, which
       share pages and should cost O(pages): well under 1 % of copying the bytes;
     - prefix reuse: kvc_prefix_begin on a prompt that shares the whole cached
       prefix (longest-common-prefix scan + the trim).
   Every time is the median of --reps runs, and is compared with memcpy of the same
   number of bytes (memcpy bandwidth measured over a 1 GiB buffer at the start; the
   appends also pair each of their runs with a memcpy sample taken right after it).
   Nothing is asserted about timings: the program only prints. Exit status 1 on a
   library error. Peak memory: the pool (4 GiB + 4 pages of headroom at 32k tokens),
   the 2 x 1 GiB memcpy buffers and 16 MiB of random f32 input rows, reused for every
   layer and batch.

   Build:  cc -std=c99 -O2 -Wall -Wextra -Wpedantic bench/bench_core.c -o bench_core -lm
   Usage:  bench_core [--quick] [--tokens N] [--reps N] [--batch N] [--page-cells N] [--help]
             --tokens      cached tokens (default 32768, at least 2 pages; halved while
                           the pool cannot be allocated)
             --reps        repetitions per measurement, median printed (default 7)
             --batch       tokens per kvc_begin in the prefill append (default 512)
             --page-cells  token slots per page (default 256, the library default)
             --quick       1024 tokens, 3 reps, batch 256, 64 MiB memcpy buffers (seconds) */
#define _POSIX_C_SOURCE 199309L
#define KVCACHE_IMPLEMENTATION
#include "../kvcache.h"
#include "bench_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define N_LAYERS 32
#define KV_HEADS 8
#define HEAD_DIM 128
#define ROW (KV_HEADS * HEAD_DIM) /* floats of one token, one layer, K or V */
#define N_SETS 4                  /* distinct random input batches, reused across layers */
#define MAX_REPS 101
#define GIB (1024.0 * 1024.0 * 1024.0)

static int g_reps = 7, g_batch = 512, g_page_cells = 256;
static double g_memcpy_bps; /* bytes per second */
static float *g_k[N_SETS], *g_v[N_SETS];

static void fmt_time(char *buf, double s) {
    if (s < 1e-3) sprintf(buf, "%8.2f us", s * 1e6);
    else if (s < 1.0) sprintf(buf, "%8.2f ms", s * 1e3);
    else sprintf(buf, "%8.3f s ", s);
}
static void fmt_bytes(char *buf, double b) {
    if (b >= GIB) sprintf(buf, "%7.2f GiB", b / GIB);
    else if (b >= 1024.0 * 1024.0) sprintf(buf, "%7.2f MiB", b / (1024.0 * 1024.0));
    else sprintf(buf, "%7.2f KiB", b / 1024.0);
}

static void fmt_pct(char *buf, double p) {
    if (p >= 1.0) sprintf(buf, "%.1f%%", p);
    else if (p >= 0.01) sprintf(buf, "%.3f%%", p);
    else sprintf(buf, "%.6f%%", p);
}

static void table_header(void) {
    printf("%-44s %11s %11s %11s %12s  %s\n", "operation", "bytes", "median", "memcpy same",
           "time/memcpy", "bandwidth (of memcpy's)");
    printf("%-44s %11s %11s %11s %12s  %s\n", "---------", "-----", "------", "-----------",
           "-----------", "-----------------------");
}

/* One table row: `bytes` is what the operation covers (written bytes for an append),
   t its median time, tm the time memcpy takes for those bytes. */
static void row_tm(const char *name, double bytes, double t, double tm, int bandwidth) {
    char tb[32], mb[32], bb[32], pb[32];
    fmt_time(tb, t);
    fmt_time(mb, tm);
    fmt_bytes(bb, bytes);
    fmt_pct(pb, 100.0 * t / tm);
    printf("%-44s %11s %11s %11s %12s", name, bb, tb, mb, pb);
    if (bandwidth) printf("  %6.2f GB/s (%5.1f%%)", bytes / t / 1e9, 100.0 * tm / t);
    printf("\n");
    fflush(stdout); /* the f16 appends take a while: show each row as it is done */
}
/* ... with tm from the memcpy bandwidth measured at the start */
static void row(const char *name, double bytes, double t, int bandwidth) {
    row_tm(name, bytes, t, bytes / g_memcpy_bps, bandwidth);
}

/* memcpy bandwidth: a 1 GiB buffer pair (both touched first), kept for the whole run
   so that the long measurements can take a memcpy sample right after each of their
   runs (this machine is noisy: a ratio of neighbours is steadier than two medians
   taken minutes apart). Every sample is also kept for the summary at the end. */
static unsigned char *g_cpy_a, *g_cpy_b;
static size_t g_cpy_n, g_cpy_max = (size_t)1 << 30; /* --quick: 64 MiB */
static double g_cpy_all[4 * MAX_REPS];
static int g_cpy_count;

static double memcpy_sample(void) { /* seconds for one copy of g_cpy_n bytes */
    double t0 = now(), t;
    memcpy(g_cpy_b, g_cpy_a, g_cpy_n);
    t = now() - t0;
    g_cpy_a[(size_t)g_cpy_count * 4096 % g_cpy_n] ^= 1; /* keep the copies observable */
    if (g_cpy_count < 4 * MAX_REPS) g_cpy_all[g_cpy_count++] = t;
    return t;
}

static void measure_memcpy(void) {
    double t[MAX_REPS];
    int i;
    for (g_cpy_n = g_cpy_max; g_cpy_n >= ((size_t)1 << 26); g_cpy_n /= 2) {
        g_cpy_a = (unsigned char *)malloc(g_cpy_n);
        g_cpy_b = (unsigned char *)malloc(g_cpy_n);
        if (g_cpy_a && g_cpy_b) break;
        free(g_cpy_a);
        free(g_cpy_b);
        g_cpy_a = g_cpy_b = NULL;
    }
    if (!g_cpy_a) { fprintf(stderr, "cannot allocate memcpy buffers\n"); exit(1); }
    memset(g_cpy_a, 1, g_cpy_n);
    memset(g_cpy_b, 2, g_cpy_n);
    memcpy(g_cpy_b, g_cpy_a, g_cpy_n); /* warm-up */
    for (i = 0; i < g_reps; ++i) t[i] = memcpy_sample();
    g_memcpy_bps = (double)g_cpy_n / median(t, g_reps);
    printf("memcpy: %.2f GiB buffer, median of %d copies (after a warm-up, both buffers touched): "
           "%.2f GB/s (bytes copied / time)\n", (double)g_cpy_n / GIB, g_reps, g_memcpy_bps / 1e9);
}

/* Random f32 input rows: N_SETS batches of g_batch tokens; layer l uses set l % N_SETS. */
static void make_inputs(void) {
    uint32_t x = 0x12345678u;
    size_t i, n = (size_t)g_batch * ROW;
    int s;
    for (s = 0; s < N_SETS; ++s) {
        g_k[s] = (float *)malloc(n * sizeof(float));
        g_v[s] = (float *)malloc(n * sizeof(float));
        if (!g_k[s] || !g_v[s]) { fprintf(stderr, "cannot allocate inputs\n"); exit(1); }
        for (i = 0; i < n; ++i) {
            x ^= x << 13; x ^= x >> 17; x ^= x << 5;
            g_k[s][i] = (float)((double)x / 4294967296.0 * 4.0 - 2.0);
            x ^= x << 13; x ^= x >> 17; x ^= x << 5;
            g_v[s][i] = (float)((double)x / 4294967296.0 * 4.0 - 2.0);
        }
    }
}

/* Append n tokens in batches of `batch`: kvc_begin + kvc_put of every layer. */
static void append(kvc_cache *c, int32_t n, int32_t batch) {
    int32_t done, l, b;
    for (done = 0; done < n; done += b) {
        b = n - done < batch ? n - done : batch;
        CHECK(kvc_begin(c, b, NULL, 0));
        for (l = 0; l < N_LAYERS; ++l) CHECK(kvc_put(c, l, g_k[l % N_SETS], g_v[l % N_SETS]));
    }
}

/* A pool of `tokens` tokens (+ `extra` pages of headroom) of storage type `type`;
   halves the tokens while the allocation fails. */
static kvc_pool *make_pool(kvc_type type, int32_t *tokens, int32_t extra) {
    kvc_pool_config pc;
    kvc_pool *pool = NULL;
    size_t page_bytes = 0;
    for (;;) {
        int32_t pages = (*tokens + g_page_cells - 1) / g_page_cells + extra;
        kvc_result r;
        CHECK(kvc_pool_config_init(&pc));
        pc.n_layers = N_LAYERS;
        pc.n_kv_heads = KV_HEADS;
        pc.head_dim_k = pc.head_dim_v = HEAD_DIM;
        pc.type_k = pc.type_v = type;
        pc.page_cells = g_page_cells;
        CHECK(kvc_pool_page_bytes(&pc, &page_bytes));
        pc.budget_bytes = (size_t)pages * page_bytes;
        r = kvc_pool_create(&pc, &pool);
        if (r == KVC_OK) return pool;
        if (r != KVC_ERR_NO_MEMORY || *tokens <= 2 * g_page_cells) CHECK(r);
        printf("NOTE: a %s pool of %d tokens (%.2f GiB) could not be allocated; scaling down to %d tokens\n",
               kvc_type_name(type), (int)*tokens, (double)pc.budget_bytes / GIB, (int)(*tokens / 2));
        *tokens /= 2;
    }
}

static kvc_cache *make_cache(kvc_pool *pool) {
    kvc_cache_config cc;
    kvc_cache *c;
    memset(&cc, 0, sizeof(cc));
    cc.kind = KVC_KIND_FULL;
    CHECK(kvc_cache_create(pool, &cc, &c));
    return c;
}

/* Prefill append of `tokens` tokens: one cold pass (first touch of the pool's
   memory), then reps warm passes into the same, recycled pages. */
static void bench_append(const char *label, kvc_pool *pool, kvc_cache *c, int32_t tokens, int cold_row) {
    kvc_pool_stats st;
    double t[MAX_REPS], ratio[MAX_REPS], t0, cold, bytes, tmed;
    char name[64];
    int i;
    int32_t all;
    CHECK(kvc_pool_stats_get(pool, &st));
    bytes = (double)tokens * N_LAYERS * (double)(st.k_row_bytes + st.v_row_bytes);
    /* cold pass over every page of the pool (headroom included), so that no later
       measurement pays for first-touch page faults */
    all = st.pages_total * st.page_cells;
    CHECK(kvc_cache_clear(c));
    t0 = now();
    append(c, all, g_batch);
    cold = now() - t0;
    for (i = 0; i < g_reps; ++i) {
        CHECK(kvc_cache_clear(c));
        t0 = now();
        append(c, tokens, g_batch);
        t[i] = now() - t0;
        ratio[i] = t[i] / (memcpy_sample() * bytes / (double)g_cpy_n); /* its neighbour */
    }
    sprintf(name, "append %s, %d/batch (paired)", label, g_batch);
    tmed = median(t, g_reps);
    row_tm(name, bytes, tmed, tmed / median(ratio, g_reps), 1);
    if (cold_row) {
        sprintf(name, "append %s, first touch (%d tok, 1 run)", label, (int)all);
        row(name, (double)all * N_LAYERS * (double)(st.k_row_bytes + st.v_row_bytes), cold, 1);
    }
}

int main(int argc, char **argv) {
    int32_t tokens = 32768, t32, n_dec, i, reused, from;
    kvc_pool *pool;
    kvc_cache *cache, *fork;
    kvc_snapshot *snap, *snap2;
    kvc_prefix *prefix;
    kvc_pool_stats st;
    int32_t *ids;
    double t[MAX_REPS], ratio[MAX_REPS], t0, cache_bytes, tok_bytes;
    int r;

    for (r = 1; r < argc; r += 2) {
        long v = r + 1 < argc ? strtol(argv[r + 1], NULL, 10) : -1;
        if (!strcmp(argv[r], "--help") || !strcmp(argv[r], "-h")) {
            printf("usage: %s [--quick] [--tokens N] [--reps N] [--batch N] [--page-cells N] [--help]\n"
                   "  --tokens N      cached tokens (default 32768, at least 2 pages; halved while the pool\n"
                   "                  cannot be allocated)\n"
                   "  --reps N        repetitions per measurement, median printed (default 7)\n"
                   "  --batch N       tokens per kvc_begin in the prefill append (default 512)\n"
                   "  --page-cells N  token slots per page (default 256)\n"
                   "  --quick         1024 tokens, 3 reps, batch 256, 64 MiB memcpy buffers\n", argv[0]);
            return 0;
        }
        if (!strcmp(argv[r], "--quick")) {
            tokens = 1024, g_reps = 3, g_batch = 256, g_cpy_max = (size_t)1 << 26;
            --r; /* no value */
        } else if (!strcmp(argv[r], "--tokens") && v >= 1) tokens = (int32_t)(v < 1 << 26 ? v : 1 << 26);
        else if (!strcmp(argv[r], "--reps") && v >= 1) g_reps = (int)(v < MAX_REPS ? v : MAX_REPS);
        else if (!strcmp(argv[r], "--batch") && v >= 1) g_batch = (int)(v < 65536 ? v : 65536);
        else if (!strcmp(argv[r], "--page-cells") && v >= 1) g_page_cells = (int)(v < 65536 ? v : 65536);
        else {
            fprintf(stderr, "usage: %s [--quick] [--tokens N (>= 2 pages)] [--reps N] [--batch N] [--page-cells N] [--help]\n", argv[0]);
            return 2;
        }
    }

    if (tokens < 2 * g_page_cells) {
        fprintf(stderr, "--tokens must be at least 2 pages (2 x %d)\n", g_page_cells);
        return 2;
    }
    printf("kvcache.h %d.%d.%d core benchmark: %d layers, %d kv heads, head dim %d, page_cells %d, "
           "median of %d runs\n", KVCACHE_VERSION_MAJOR, KVCACHE_VERSION_MINOR, KVCACHE_VERSION_PATCH,
           N_LAYERS, KV_HEADS, HEAD_DIM, g_page_cells, g_reps);
    measure_memcpy();
    for (i = 0; i < g_reps; ++i) { /* the floor under the sub-microsecond rows */
        int k;
        t0 = now();
        for (k = 0; k < 1000; ++k) (void)now();
        t[i] = (now() - t0) / 1000;
    }
    printf("clock_gettime(CLOCK_MONOTONIC): %.0f ns per call (each row times one call per run)\n",
           median(t, g_reps) * 1e9);
    make_inputs();

    /* ---- the f16 cache: 4 pages of headroom for the copy-on-write cases ---- */
    pool = make_pool(KVC_TYPE_F16, &tokens, 4);
    CHECK(kvc_pool_stats_get(pool, &st));
    tok_bytes = N_LAYERS * (double)(st.k_row_bytes + st.v_row_bytes);
    cache_bytes = tokens * tok_bytes;
    printf("cache: %d tokens, f16 K+V = %.2f GiB; page = %d cells x %d layers = %.2f MiB, %d pages\n\n",
           (int)tokens, cache_bytes / GIB, (int)st.page_cells, N_LAYERS, (double)st.page_bytes / 1048576.0,
           (int)((tokens + st.page_cells - 1) / st.page_cells));
    table_header();
    cache = make_cache(pool);
    bench_append("f16", pool, cache, tokens, 1);

    /* decode: trim n_dec tokens, append them back one by one; time per token */
    n_dec = tokens / 2 < 256 ? tokens / 2 : 256;
    for (i = 0; i < g_reps; ++i) {
        int32_t k, l;
        CHECK(kvc_cache_trim(cache, n_dec));
        t0 = now();
        for (k = 0; k < n_dec; ++k) {
            CHECK(kvc_begin(cache, 1, NULL, 0));
            for (l = 0; l < N_LAYERS; ++l) CHECK(kvc_put(cache, l, g_k[l % N_SETS], g_v[l % N_SETS]));
        }
        t[i] = (now() - t0) / n_dec;
        ratio[i] = t[i] / (memcpy_sample() * tok_bytes / (double)g_cpy_n);
    }
    t0 = median(t, g_reps);
    row_tm("append f16, decode 1 token (paired)", tok_bytes, t0, t0 / median(ratio, g_reps), 1);

    /* snapshot of the whole cache */
    for (i = 0; i < g_reps; ++i) {
        t0 = now();
        CHECK(kvc_snapshot_take(cache, 0, KVC_POS_END, &snap));
        t[i] = now() - t0;
        CHECK(kvc_snapshot_free(snap));
    }
    row("snapshot_take [0, T)", cache_bytes, median(t, g_reps), 0);

    /* restore from a whole-cache snapshot after the cache diverged 100 tokens back */
    CHECK(kvc_snapshot_take(cache, 0, KVC_POS_END, &snap));
    for (i = 0; i < g_reps; ++i) {
        CHECK(kvc_cache_trim(cache, tokens > 200 ? 100 : 1));
        append(cache, 1, 1); /* diverge: copies the shared tail page (not timed) */
        t0 = now();
        CHECK(kvc_cache_restore(cache, snap, tokens));
        t[i] = now() - t0;
    }
    row("restore(snap [0, T), T)", cache_bytes, median(t, g_reps), 0);

    /* restore from a snapshot that starts mid-page: the boundary page is rebuilt
       (cells before `from` from the cache, the rest from the snapshot) */
    from = tokens / 2 + g_page_cells / 2;
    if (from % g_page_cells == 0) from++;
    CHECK(kvc_snapshot_take(cache, from, KVC_POS_END, &snap2));
    for (i = 0; i < g_reps; ++i) {
        CHECK(kvc_cache_trim(cache, tokens - from));
        append(cache, 1, 1); /* diverge right at `from` */
        t0 = now();
        CHECK(kvc_cache_restore(cache, snap2, tokens));
        t[i] = now() - t0;
        ratio[i] = t[i] / (memcpy_sample() * (tokens - from) * tok_bytes / (double)g_cpy_n);
    }
    t0 = median(t, g_reps);
    row_tm("restore(snap [T/2+mid-page, T), T) (p) *", (tokens - from) * tok_bytes, t0,
           t0 / median(ratio, g_reps), 0);
    CHECK(kvc_snapshot_free(snap2));

    /* the first append after a snapshot copies the shared, partly filled tail page */
    CHECK(kvc_cache_trim(cache, 1));
    for (i = 0; i < g_reps; ++i) {
        int32_t l;
        CHECK(kvc_snapshot_take(cache, 0, KVC_POS_END, &snap2));
        t0 = now();
        CHECK(kvc_begin(cache, 1, NULL, 0));
        for (l = 0; l < N_LAYERS; ++l) CHECK(kvc_put(cache, l, g_k[l % N_SETS], g_v[l % N_SETS]));
        t[i] = now() - t0;
        CHECK(kvc_snapshot_free(snap2));
        CHECK(kvc_cache_trim(cache, 1));
        ratio[i] = t[i] / (memcpy_sample() * (double)st.page_bytes / (double)g_cpy_n);
    }
    append(cache, 1, 1);
    t0 = median(t, g_reps);
    row_tm("append 1 token after snapshot (COW) (p) *", (double)st.page_bytes, t0, t0 / median(ratio, g_reps), 0);
    CHECK(kvc_snapshot_free(snap));

    /* fork */
    for (i = 0; i < g_reps; ++i) {
        t0 = now();
        CHECK(kvc_cache_fork(cache, &fork));
        t[i] = now() - t0;
        CHECK(kvc_cache_destroy(fork));
    }
    row("cache_fork (T tokens)", cache_bytes, median(t, g_reps), 0);

    /* prefix reuse: record T tokens, then requests that share all of them */
    ids = (int32_t *)malloc(sizeof(int32_t) * (size_t)(tokens + 16));
    if (!ids) { fprintf(stderr, "cannot allocate token ids\n"); return 1; }
    for (i = 0; i < tokens + 16; ++i) ids[i] = (int32_t)((i * 2654435761u) % 151936u);
    CHECK(kvc_prefix_create(&cache, 1, tokens + 16, &prefix));
    CHECK(kvc_prefix_begin(prefix, ids, tokens, &reused)); /* nothing recorded: clears */
    append(cache, tokens, g_batch);
    CHECK(kvc_prefix_close(prefix, NULL, 0));
    for (i = 0; i < g_reps; ++i) { /* the prompt extends the cached tokens: no trim */
        t0 = now();
        CHECK(kvc_prefix_begin(prefix, ids, tokens + 16, &reused));
        t[i] = now() - t0;
        CHECK(kvc_prefix_close(prefix, NULL, 0));
        if (reused != tokens) { fprintf(stderr, "prefix reused %d, expected %d\n", (int)reused, (int)tokens); return 1; }
    }
    row("prefix_begin, T cached + 16 new", cache_bytes, median(t, g_reps), 0);
    for (i = 0; i < g_reps; ++i) { /* identical prompt: reuse T-1, trim the last token */
        t0 = now();
        CHECK(kvc_prefix_begin(prefix, ids, tokens, &reused));
        t[i] = now() - t0;
        if (reused != tokens - 1) { fprintf(stderr, "prefix reused %d, expected %d\n", (int)reused, (int)(tokens - 1)); return 1; }
        append(cache, 1, 1);
        CHECK(kvc_prefix_close(prefix, NULL, 0));
    }
    row("prefix_begin, identical T (trim 1)", cache_bytes, median(t, g_reps), 0);
    CHECK(kvc_prefix_destroy(prefix));
    free(ids);
    CHECK(kvc_cache_destroy(cache));
    CHECK(kvc_pool_destroy(pool));

    /* ---- f32 storage for comparison: a quarter of the tokens (same bytes / 2) ---- */
    t32 = tokens / 4 > 1 ? tokens / 4 : 1;
    pool = make_pool(KVC_TYPE_F32, &t32, 0);
    cache = make_cache(pool);
    {
        char label[48];
        sprintf(label, "f32 (%d tok)", (int)t32);
        bench_append(label, pool, cache, t32, 0);
    }
    CHECK(kvc_cache_destroy(cache));
    CHECK(kvc_pool_destroy(pool));

    {
        double lo, hi, n = (double)g_cpy_n;
        int count = g_cpy_count;
        t0 = median(g_cpy_all, count); /* sorts */
        lo = n / g_cpy_all[count - 1];
        hi = n / g_cpy_all[0];
        printf("memcpy over the whole run: %d samples, median %.2f GB/s, range %.2f .. %.2f GB/s\n",
               count, n / t0 / 1e9, lo / 1e9, hi / 1e9);
    }
    printf("\nbytes: K+V the operation covers (append: bytes stored; snapshot/restore/fork/prefix: the\n"
           "cached tokens involved). memcpy same: those bytes at the memcpy bandwidth above, except\n"
           "(paired) / (p) rows: each run is followed by a 1 GiB memcpy sample and the ratios of these\n"
           "neighbours are medianed (memcpy same = median time / median ratio).\n"
           "time/memcpy < 1%% is the design target for snapshot/restore/fork; append's bandwidth is\n"
           "stored bytes / time (the f16 append also reads twice as many f32 input bytes, from\n"
           "%d reused input batches of %d tokens, so mostly from cache). T = %d tokens.\n"
           "* rows with a partial-page copy: the boundary page of a snapshot starting mid-page, and\n"
           "  the copy-on-write of the shared tail page on the first append after a snapshot\n"
           "  (bytes = one page).\n",
           N_SETS, g_batch, (int)tokens);
    for (i = 0; i < N_SETS; ++i) { free(g_k[i]); free(g_v[i]); }
    free(g_cpy_a);
    free(g_cpy_b);
    return 0;
}
