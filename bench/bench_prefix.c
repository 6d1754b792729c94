/* bench_prefix.c - the radix prefix cache and persistence benchmark (run by `make bench`).

   On a model shape of --layers layers (default 8; 32 gives bench_core's 4 GiB cache)
   x 8 kv heads x head dim 128, f16, 256 cells per page:
     1. lookup + ready cache of a cached 32k-token prefix (kvc_radix_lookup of the prefix
        + 1 new token: walk 32k token ids, stitch 128 pages into a new cache), next to
        memcpy of the prefix's K/V bytes (what a cache without page sharing copies);
     2. memory of 20 conversations sharing a 4k-token prefix (each 4k + 200 own tokens +
        20 generated, committed): pool pages with sharing, next to the pages the 20
        caches reference (what 20 private copies would hold);
     3. save / load throughput of a 4k-token cache: to memory (next to memcpy), to a file
        by path (temporary file + rename, page cache) and through callbacks that fsync
        (next to fwrite + fflush + fsync of the same bytes, this disk's write speed),
        and load from the file (next to fread of it).
   Every time is the median of --reps runs, measured in this run. Nothing is asserted
   about timings; exit status 1 on a library error. Files go to --dir (default build).

   Build:  cc -std=c99 -O2 -Wall -Wextra -Wpedantic bench/bench_prefix.c -o bench_prefix -lm
   Usage:  bench_prefix [--quick] [--layers N] [--reps N] [--dir DIR] [--help]
             --layers N  layers of the model shape (1..64, default 8)
             --reps N    runs per measurement, median printed (default 7)
             --dir DIR   where the save/load files go (default build)
             --quick     1 layer, 3 reps (seconds) */
#define _POSIX_C_SOURCE 200809L
#define KVCACHE_IMPLEMENTATION
#include "../kvcache.h"
#include "bench_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define KV_HEADS 8
#define HEAD_DIM 128
#define ROW (KV_HEADS * HEAD_DIM)
#define PAGE 256
#define MAX_REPS 101
#define LONG_PREFIX 32768
#define SHARED_PREFIX 4096
#define N_CONV 20
#define GIB (1024.0 * 1024.0 * 1024.0)
#define MIB (1024.0 * 1024.0)

static int g_layers = 8, g_reps = 7;
static const char *g_dir = "build";
static const kvc_namespace NS = {1, 0};
static float *g_k, *g_v; /* one batch of inputs, reused for every layer */

static void fmt_time(char *buf, double s) {
    if (s < 1e-3) sprintf(buf, "%8.2f us", s * 1e6);
    else if (s < 1.0) sprintf(buf, "%8.2f ms", s * 1e3);
    else sprintf(buf, "%8.3f s ", s);
}

/* a row: operation, bytes, its median, the reference's median, ratio */
static void row(const char *name, double bytes, double t, const char *ref, double tr) {
    char a[32], b[32], bw[32];
    fmt_time(a, t);
    fmt_time(b, tr);
    if (t * 1000 < tr) sprintf(bw, "%11s", "-"); /* no bandwidth: it does not move the bytes */
    else sprintf(bw, "%6.2f GB/s", bytes / t / 1e9);
    printf("%-46s %9.1f MiB %11s %11s | %-30s %11s %6.2f GB/s | %8.4f%%\n", name, bytes / MIB, a, bw,
           ref, b, bytes / tr / 1e9, 100.0 * t / tr);
}

static kvc_pool *make_pool(int32_t pages) {
    kvc_pool_config pc;
    kvc_pool *p;
    kvc_pool_config_init(&pc);
    pc.n_layers = g_layers;
    pc.n_kv_heads = KV_HEADS;
    pc.head_dim_k = pc.head_dim_v = HEAD_DIM;
    pc.type_k = pc.type_v = KVC_TYPE_F16;
    pc.page_cells = PAGE;
    CHECK(kvc_pool_budget_for_tokens(&pc, pages * PAGE, &pc.budget_bytes)); /* exactly `pages` pages */
    CHECK(kvc_pool_create(&pc, &p));
    return p;
}

/* evaluate n tokens (random K/V, batches of 512) */
static void append(kvc_cache *c, int32_t n) {
    int32_t done, l;
    for (done = 0; done < n; done += 512) {
        int32_t b = n - done < 512 ? n - done : 512;
        CHECK(kvc_begin(c, b, NULL, 0));
        for (l = 0; l < g_layers; ++l) CHECK(kvc_put(c, l, g_k, g_v));
    }
}

/* ---- 1: lookup of a 32k-token prefix vs copying its bytes ---------------------------- */
static void bench_lookup(void) {
    kvc_pool *pool = make_pool(LONG_PREFIX / PAGE + 4);
    kvc_radix_config rc;
    kvc_radix *tree;
    kvc_cache *c;
    kvc_pool_stats st;
    int32_t *tok = (int32_t *)malloc(sizeof(int32_t) * (LONG_PREFIX + 1)), i, reused = 0;
    double t[MAX_REPS], tc[MAX_REPS], bytes;
    unsigned char *dst;
    kvc_radix_config_init(&rc, KVC_KIND_FULL);
    CHECK(kvc_radix_create(pool, &rc, &tree));
    for (i = 0; i <= LONG_PREFIX; ++i) tok[i] = (i * 7919) % 50000;
    CHECK(kvc_radix_lookup(tree, NS, tok, LONG_PREFIX, &c, &reused));
    append(c, LONG_PREFIX);
    CHECK(kvc_radix_commit(tree, NS, c, tok, LONG_PREFIX, 0));
    CHECK(kvc_cache_destroy(c));
    CHECK(kvc_pool_stats_get(pool, &st));
    bytes = (double)LONG_PREFIX * g_layers * (double)(st.k_row_bytes + st.v_row_bytes);
    dst = (unsigned char *)malloc((size_t)bytes);
    if (dst == NULL) { fprintf(stderr, "no memory for the copy\n"); exit(1); }
    memset(dst, 1, (size_t)bytes);
    for (i = 0; i < g_reps; ++i) {
        double t0 = now();
        CHECK(kvc_radix_lookup(tree, NS, tok, LONG_PREFIX + 1, &c, &reused));
        t[i] = now() - t0;
        CHECK(kvc_cache_destroy(c));
        t0 = now();
        memcpy(dst, pool->slab, (size_t)bytes); /* as many bytes as the prefix has, from the page slab */
        tc[i] = now() - t0;
        dst[(size_t)i * 4096] ^= 1;
    }
    if (reused != LONG_PREFIX) { fprintf(stderr, "lookup reused %d, expected %d\n", (int)reused, LONG_PREFIX); exit(1); }
    printf("1. lookup + ready cache of a %d-token prefix (%d pages) vs copying it\n", LONG_PREFIX, LONG_PREFIX / PAGE);
    row("kvc_radix_lookup (reuses 32768, shares pages)", bytes, median(t, g_reps), "memcpy of the prefix's K/V", median(tc, g_reps));
    printf("\n");
    free(dst);
    free(tok);
    CHECK(kvc_radix_destroy(tree));
    CHECK(kvc_pool_destroy(pool));
}

/* ---- 2: 20 conversations sharing a 4k prefix ------------------------------------------ */
static void bench_memory(void) {
    int32_t pages = SHARED_PREFIX / PAGE + N_CONV * 2 + 8, i, j, reused, refs = 0, n;
    kvc_pool *pool = make_pool(pages);
    kvc_radix_config rc;
    kvc_radix *tree;
    kvc_cache *conv[N_CONV];
    kvc_pool_stats st;
    int32_t *tok = (int32_t *)malloc(sizeof(int32_t) * (SHARED_PREFIX + 256));
    double t0, t_shared;
    kvc_radix_config_init(&rc, KVC_KIND_FULL);
    CHECK(kvc_radix_create(pool, &rc, &tree));
    for (i = 0; i < SHARED_PREFIX; ++i) tok[i] = i;
    t0 = now();
    for (j = 0; j < N_CONV; ++j) {
        for (i = SHARED_PREFIX; i < SHARED_PREFIX + 220; ++i) tok[i] = 100000 * (j + 1) + i;
        CHECK(kvc_radix_lookup(tree, NS, tok, SHARED_PREFIX + 200, &conv[j], &reused));
        append(conv[j], SHARED_PREFIX + 219 - reused); /* its own 200 + 19 generated (the 20th not evaluated) */
        CHECK(kvc_radix_commit(tree, NS, conv[j], tok, SHARED_PREFIX + 220, 0));
    }
    t_shared = now() - t0;
    CHECK(kvc_pool_stats_get(pool, &st));
    for (j = 0; j < N_CONV; ++j) {
        CHECK(kvc_cache_pages(conv[j], &n));
        refs += n;
    }
    printf("2. %d conversations sharing a %d-token prefix (each + 200 own + 20 generated tokens)\n", N_CONV, SHARED_PREFIX);
    printf("   with sharing: %4d pages = %8.1f MiB   (built in %.3f s: the prefix evaluated once)\n", (int)st.pages_used,
           (double)st.bytes_used / MIB, t_shared);
    printf("   20 copies:    %4d pages = %8.1f MiB   (the pages the 20 caches reference)\n", (int)refs,
           (double)refs * (double)st.page_bytes / MIB);
    printf("   sharing uses %.1f %% of the memory of copies (%.2fx less); at 32 layers: %.0f vs %.0f MiB\n\n",
           100.0 * st.pages_used / refs, (double)refs / st.pages_used,
           (double)st.pages_used * (double)st.page_bytes / MIB * 32 / g_layers,
           (double)refs * (double)st.page_bytes / MIB * 32 / g_layers);
    for (j = 0; j < N_CONV; ++j) CHECK(kvc_cache_destroy(conv[j]));
    free(tok);
    CHECK(kvc_radix_destroy(tree));
    CHECK(kvc_pool_destroy(pool));
}

/* ---- 3: save / load vs the disk ------------------------------------------------------ */

/* callbacks: fwrite, then fflush + fsync + close + rename at the end (a durable save) */
typedef struct durable { FILE *f; char tmp[1100], path[1024]; } durable;
static size_t d_write(void *u, const void *d, size_t n) { return fwrite(d, 1, n, ((durable *)u)->f); }
static int d_finish(void *u, int ok) {
    durable *d = (durable *)u;
    int bad = fflush(d->f) != 0 || fsync(fileno(d->f)) != 0;
    bad |= fclose(d->f) != 0;
    if (ok && !bad) bad = rename(d->tmp, d->path) != 0;
    return bad;
}

static void bench_persist(void) {
    kvc_pool *pool = make_pool(3 * (SHARED_PREFIX / PAGE) + 4); /* c, d, and d's next contents while loading */
    kvc_cache_config cc;
    kvc_cache *c, *d;
    kvc_mem m;
    kvc_io io;
    kvc_path_io pio;
    durable du;
    char path[1024], raw[1024];
    double t[6][MAX_REPS], size;
    unsigned char *buf, *buf2;
    int i;
    FILE *f;
    kvc_cache_config_init(&cc, KVC_KIND_FULL);
    CHECK(kvc_cache_create(pool, &cc, &c));
    CHECK(kvc_cache_create(pool, &cc, &d));
    append(c, SHARED_PREFIX);
    memset(&m, 0, sizeof(m));
    CHECK(kvc_io_memory(&m, &io));
    CHECK(kvc_cache_save(c, NS, NULL, 0, &io)); /* counts the bytes */
    size = (double)m.size;
    buf = (unsigned char *)malloc(m.size);
    buf2 = (unsigned char *)malloc(m.size);
    memset(buf2, 0, m.size);
    snprintf(path, sizeof(path), "%s/bench_prefix.kvc", g_dir);
    snprintf(raw, sizeof(raw), "%s/bench_prefix.raw", g_dir);
    for (i = 0; i < g_reps; ++i) {
        double t0;
        /* memory */
        m.data = buf;
        m.capacity = (size_t)size;
        m.size = m.pos = 0;
        CHECK(kvc_io_memory(&m, &io));
        t0 = now();
        CHECK(kvc_cache_save(c, NS, NULL, 0, &io));
        t[0][i] = now() - t0;
        t0 = now();
        CHECK(kvc_cache_load(d, NS, &io, NULL, 0, NULL));
        t[1][i] = now() - t0;
        t0 = now();
        memcpy(buf2, buf, (size_t)size);
        t[2][i] = now() - t0;
        /* a path (page cache), and the raw write of the same bytes */
        t0 = now();
        CHECK(kvc_io_path(&pio, path, 1, &io));
        CHECK(kvc_cache_save(c, NS, NULL, 0, &io));
        t[3][i] = now() - t0;
        t0 = now();
        CHECK(kvc_io_path(&pio, path, 0, &io));
        CHECK(kvc_cache_load(d, NS, &io, NULL, 0, NULL));
        t[4][i] = now() - t0;
        t0 = now();
        f = fopen(raw, "wb");
        if (f == NULL || fwrite(buf, 1, (size_t)size, f) != (size_t)size || fclose(f) != 0) { fprintf(stderr, "write %s failed\n", raw); exit(1); }
        t[5][i] = now() - t0;
    }
    printf("3. save / load of a %d-token cache (%.1f MiB saved)\n", SHARED_PREFIX, size / MIB);
    row("kvc_cache_save to memory", size, median(t[0], g_reps), "memcpy", median(t[2], g_reps));
    row("kvc_cache_load from memory", size, median(t[1], g_reps), "memcpy", median(t[2], g_reps));
    row("kvc_cache_save to a path (tmp + rename)", size, median(t[3], g_reps), "fwrite + fclose, same bytes", median(t[5], g_reps));
    {
        double tr[MAX_REPS], tl[MAX_REPS], ts[MAX_REPS], tw[MAX_REPS];
        for (i = 0; i < g_reps; ++i) {
            double t0 = now();
            f = fopen(raw, "rb");
            if (f == NULL || fread(buf2, 1, (size_t)size, f) != (size_t)size) { fprintf(stderr, "read failed\n"); exit(1); }
            fclose(f);
            tr[i] = now() - t0;
            tl[i] = t[4][i];
            /* durable: fsync both */
            snprintf(du.path, sizeof(du.path), "%s", path);
            snprintf(du.tmp, sizeof(du.tmp), "%s.tmp", path);
            t0 = now();
            du.f = fopen(du.tmp, "wb");
            if (du.f == NULL) { fprintf(stderr, "open failed\n"); exit(1); }
            io.write = d_write;
            io.read = NULL;
            io.finish = d_finish;
            io.user = &du;
            CHECK(kvc_cache_save(c, NS, NULL, 0, &io));
            ts[i] = now() - t0;
            t0 = now();
            f = fopen(raw, "wb");
            if (f == NULL || fwrite(buf, 1, (size_t)size, f) != (size_t)size || fflush(f) != 0 || fsync(fileno(f)) != 0 ||
                fclose(f) != 0) { fprintf(stderr, "durable write failed\n"); exit(1); }
            tw[i] = now() - t0;
        }
        row("kvc_cache_load from a path (page cache)", size, median(tl, g_reps), "fread, same bytes", median(tr, g_reps));
        row("kvc_cache_save, callbacks with fsync", size, median(ts, g_reps), "fwrite + fsync (disk speed)", median(tw, g_reps));
    }
    remove(path);
    remove(raw);
    free(buf);
    free(buf2);
    CHECK(kvc_cache_destroy(c));
    CHECK(kvc_cache_destroy(d));
    CHECK(kvc_pool_destroy(pool));
}

int main(int argc, char **argv) {
    int r;
    size_t i;
    for (r = 1; r < argc; r += 2) {
        long v = r + 1 < argc ? strtol(argv[r + 1], NULL, 10) : -1;
        if (!strcmp(argv[r], "--help") || !strcmp(argv[r], "-h")) {
            printf("usage: %s [--quick] [--layers N] [--reps N] [--dir DIR] [--help]\n"
                   "  --layers N  layers of the model shape (1..64, default 8)\n"
                   "  --reps N    runs per measurement, median printed (default 7)\n"
                   "  --dir DIR   where the save/load files go (default build)\n"
                   "  --quick     1 layer, 3 reps\n", argv[0]);
            return 0;
        }
        if (!strcmp(argv[r], "--quick")) {
            g_layers = 1, g_reps = 3;
            --r; /* no value */
        } else if (!strcmp(argv[r], "--layers") && v >= 1 && v <= 64) g_layers = (int)v;
        else if (!strcmp(argv[r], "--reps") && v >= 1) g_reps = (int)(v < MAX_REPS ? v : MAX_REPS);
        else if (!strcmp(argv[r], "--dir") && r + 1 < argc) g_dir = argv[r + 1];
        else {
            fprintf(stderr, "usage: %s [--quick] [--layers N] [--reps N] [--dir DIR] [--help]\n", argv[0]);
            return 2;
        }
    }
    g_k = (float *)malloc(sizeof(float) * 512 * ROW);
    g_v = (float *)malloc(sizeof(float) * 512 * ROW);
    for (i = 0; i < (size_t)512 * ROW; ++i) {
        g_k[i] = (float)((i * 2654435761u) % 2001) / 1000.0f - 1.0f;
        g_v[i] = (float)((i * 40503u) % 2001) / 1000.0f - 1.0f;
    }
    printf("kvcache.h prefix benchmark: %d layers x %d kv heads x head dim %d, f16, %d cells per page, "
           "median of %d runs\n\n", g_layers, KV_HEADS, HEAD_DIM, PAGE, g_reps);
    printf("%-46s %13s %11s %11s | %-30s %11s %11s | %9s\n", "operation", "bytes", "median", "", "reference",
           "median", "", "time/ref");
    bench_lookup();
    bench_memory();
    bench_persist();
    free(g_k);
    free(g_v);
    return 0;
}
