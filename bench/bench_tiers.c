/* bench_tiers.c - time to first token from a shared prefix: recompute against each tier
   (run by `make bench`).

   1. The demo models (--models; default tests/data/lfm2-tiny, the hybrid shape: RECURRENT
      conv layers beside FULL attention, and tests/data/qwen3-swa-tiny, the sliding one:
      ROTATING window layers beside a FULL layer), through examples/tinylm.c's loader,
      memory and forward pass: for each prefix length of --model-sizes (default 4096,32768)
      the time from a prompt (the prefix + 1 new token) to the new token's logits when the
      prefix is recomputed (the forward pass over every token: the model's real work), a
      pool hit, in the host-RAM tier, in a directory store and in Redis on localhost
      (--redis-port, a build with -DBENCH_TIERS_REDIS -lhiredis); the ratio to the
      recompute measured in the same run; bytes a token in each place (below).
   2. The bench shape: --layers layers (default 4) x 8 kv heads x head dim 128, f16, 256
      cells per page (bench_prefix's shape), for each length of --sizes (default
      4096,32768), a prompt of the prefix + 1 new token:
     pool hit     kvc_radix_lookup of the prompt while the tree holds the prefix;
     host tier    the entry evicted to the host-RAM tier, then kvc_tier_fetch +
                  kvc_radix_lookup (the blob checked and loaded back into the pool);
     directory    the entry evicted to kvc_store_dir in --dir (no host tier), then fetch +
                  lookup (the file was just written: it comes from the page cache);
     K/V writes   kvc_begin + kvc_put of the prefix's K/V: the cache's share of
                  recomputing it (there is no model of this shape to run: its forward
                  pass over 32k tokens would take hours on a CPU; part 1 has the real one).
   and the time to move the entry down (eviction saving it to the host tier, or writing
   it to the directory), and the bytes per token in each place. Every time is the median
   of --reps runs (a recompute: one run), measured in this run; every fetch is checked to
   bring back the whole prefix (exit status 1 otherwise or on a library error).
   --vk: part 2's rows on a device pool (kvcache_vk.h, the first Vulkan device): the K/V
   live on the device, eviction reads them off it and a fetch writes them back through
   the backend's two staging halves (both wait for their copies, so "ready" means the
   cache is on the device); the prefix is loaded from the CPU's evaluation, so there is
   no K/V-writes row. On lavapipe the "device" is host memory: its numbers are the
   staging's and the format's costs, not a GPU's bus.

   Build:  cc -std=c99 -O2 -Wall -Wextra -Wpedantic bench/bench_tiers.c -o bench_tiers -lm
           (Redis: add -DBENCH_TIERS_REDIS ... -lhiredis, examples/redis_store.h)
   Usage:  bench_tiers [--quick] [--vk] [--layers N] [--sizes A,B] [--reps N] [--dir DIR]
                       [--models LIST] [--model-sizes A,B] [--redis-port P] [--help] */
#define _POSIX_C_SOURCE 200809L
#if defined(__has_include)
#if __has_include(<vulkan/vulkan.h>)
#define TINYLM_VK /* tinylm.c then includes kvcache_vk.h with its helpers: --vk */
#endif
#endif
/* the demo models' loader, memories and forward pass: examples/tinylm.c (its main renamed),
   which includes kvcache.h with the implementation */
#define main tinylm_main
#include "../examples/tinylm.c"
#undef main
#include "bench_util.h"
#ifdef BENCH_TIERS_REDIS
#include "../examples/redis_store.h"
#include <signal.h>
#endif

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef TINYLM_VK
static kvc_vk_loader g_bench_loader;
static kvc_vk_context *g_bench_vk; /* --vk: the device; NULL: CPU pools */
static kvc_vk_pool *g_bench_vk_pool;
#endif

#define KV_HEADS 8
#define HEAD_DIM 128
#define ROW (KV_HEADS * HEAD_DIM)
#define PAGE 256
#define MAX_REPS 101
#define MIB (1024.0 * 1024.0)

static int g_layers = 4, g_reps = 5, g_redis_port = 0; /* --redis-port */
static const char *g_dir = "build";
static const kvc_namespace NS = {1, 0};
static float *g_k, *g_v;

static void fmt_time(char *buf, double s) {
    if (s < 1e-3) sprintf(buf, "%9.2f us", s * 1e6);
    else if (s < 1.0) sprintf(buf, "%9.2f ms", s * 1e3);
    else sprintf(buf, "%9.3f s ", s);
}

static kvc_pool *make_pool_on(int32_t tokens, int device) {
    kvc_pool_config pc;
    kvc_pool *p;
    (void)device;
    kvc_pool_config_init(&pc);
    pc.n_layers = g_layers;
    pc.n_kv_heads = KV_HEADS;
    pc.head_dim_k = pc.head_dim_v = HEAD_DIM;
    pc.type_k = pc.type_v = KVC_TYPE_F16;
    pc.page_cells = PAGE;
    CHECK(kvc_pool_budget_for_tokens(&pc, tokens + 2 * PAGE, &pc.budget_bytes));
#ifdef TINYLM_VK
    if (device) {
        CHECK(kvc_vk_pool_create(g_bench_vk, &pc, NULL, &g_bench_vk_pool));
        return kvc_vk_pool_host(g_bench_vk_pool);
    }
#endif
    CHECK(kvc_pool_create(&pc, &p));
    return p;
}

static int on_device(void) {
#ifdef TINYLM_VK
    return g_bench_vk != NULL;
#else
    return 0;
#endif
}
static kvc_pool *make_pool(int32_t tokens) { return make_pool_on(tokens, on_device()); }
static void destroy_pool(kvc_pool *p) {
#ifdef TINYLM_VK
    if (on_device()) {
        (void)p;
        CHECK(kvc_vk_pool_destroy(g_bench_vk_pool));
        g_bench_vk_pool = NULL;
        return;
    }
#endif
    CHECK(kvc_pool_destroy(p));
}

static void append(kvc_cache *c, int32_t n) {
    int32_t done, l;
    for (done = 0; done < n; done += 512) {
        int32_t b = n - done < 512 ? n - done : 512;
        CHECK(kvc_begin(c, b, NULL, 0));
        for (l = 0; l < g_layers; ++l) CHECK(kvc_put(c, l, g_k, g_v));
    }
}

/* commit the prefix tok[0 .. n) into the tree (evaluated afresh) */
static void commit_prefix(kvc_radix *t, const int32_t *tok, int32_t n) {
    kvc_cache *c;
    int32_t reused;
    CHECK(kvc_radix_lookup(t, NS, tok, n, &c, &reused));
    append(c, n - reused);
    CHECK(kvc_radix_commit(t, NS, c, tok, n, 0));
    CHECK(kvc_cache_destroy(c));
}

/* --vk: the device tree t gets the CPU's evaluation of tok[0 .. n), through its file */
static void load_prefix(kvc_radix *t, const int32_t *tok, int32_t n) {
    kvc_pool *cpu = make_pool_on(n, 0);
    kvc_radix_config rc;
    kvc_radix *ct;
    kvc_mem m;
    kvc_io io;
    int32_t got = 0;
    kvc_radix_config_init(&rc, KVC_KIND_FULL);
    CHECK(kvc_radix_create(cpu, &rc, &ct));
    commit_prefix(ct, tok, n);
    memset(&m, 0, sizeof(m));
    CHECK(kvc_io_memory(&m, &io));
    CHECK(kvc_radix_save(ct, NS, tok, n, &io)); /* counts the bytes */
    m.capacity = m.size;
    m.size = 0;
    if ((m.data = (unsigned char *)malloc(m.capacity)) == NULL) CHECK(KVC_ERR_NO_MEMORY);
    CHECK(kvc_radix_save(ct, NS, tok, n, &io));
    m.pos = 0;
    CHECK(kvc_radix_load(t, NS, &io, 0, &got));
    if (got != n) { fprintf(stderr, "loaded %d of %d tokens\n", (int)got, (int)n); exit(1); }
    free(m.data);
    CHECK(kvc_radix_destroy(ct));
    CHECK(kvc_pool_destroy(cpu));
}
static void put_prefix(kvc_radix *t, const int32_t *tok, int32_t n) {
    if (on_device()) load_prefix(t, tok, n);
    else commit_prefix(t, tok, n);
}

/* fetch (if a tier is attached) + lookup of tok[0 .. n] (prefix + 1); checks the reuse */
static double ready_cache(kvc_radix *t, const int32_t *tok, int32_t n, int tiered) {
    kvc_cache *c;
    int32_t got = n, reused = 0;
    double t0 = now();
    if (tiered) CHECK(kvc_tier_fetch(t, NS, tok, n + 1, &got));
    CHECK(kvc_radix_lookup(t, NS, tok, n + 1, &c, &reused));
    t0 = now() - t0;
    if (got != n || reused != n) {
        fprintf(stderr, "prefix of %d: fetched %d, reused %d\n", (int)n, (int)got, (int)reused);
        exit(1);
    }
    CHECK(kvc_cache_destroy(c));
    return t0;
}

static void line(const char *what, int32_t n, double t, double bytes_per_token) {
    char a[32];
    fmt_time(a, t);
    if (bytes_per_token > 0) printf("%-44s %6d %s %10.0f\n", what, (int)n, a, bytes_per_token);
    else printf("%-44s %6d %s %10s\n", what, (int)n, a, "-");
}

/* A tree on pool with `store` under it (no host tier): the prefix committed, then per rep
   evicted straight to the store (tdown) and fetched back + looked up (tready); returns
   the blob's bytes a token (the blob erased at the end). */
static double store_rounds(kvc_pool *pool, const int32_t *tok, int32_t n, const kvc_store *store, double *tdown,
                           double *tready) {
    kvc_radix_config rc;
    kvc_radix *t;
    kvc_tier_config tc;
    kvc_key key;
    size_t size = 0;
    double t0;
    int i;
    kvc_radix_config_init(&rc, KVC_KIND_FULL);
    CHECK(kvc_radix_create(pool, &rc, &t));
    kvc_tier_config_init(&tc);
    tc.store = *store;
    tc.timeout_ms = 10000;
    CHECK(kvc_tier_attach(t, &tc));
    put_prefix(t, tok, n);
    for (i = 0; i < g_reps; ++i) {
        t0 = now();
        CHECK(kvc_radix_evict(t, 1 << 30, NULL)); /* straight to the store */
        tdown[i] = now() - t0;
        tready[i] = ready_cache(t, tok, n, 1);
    }
    CHECK(kvc_tier_key(t, NS, tok, n, &key));
    CHECK(store->exists(store->user, &key, &size, 10000));
    if (store->erase) store->erase(store->user, &key, 10000);
    CHECK(kvc_radix_destroy(t));
    return (double)size / n;
}

static void bench_size(int32_t n) {
    kvc_pool *pool = make_pool(n);
    kvc_radix_config rc;
    kvc_radix *t;
    kvc_tier_config tc;
    kvc_store_dir_state dir;
    kvc_tier_stats ts;
    kvc_pool_stats ps;
    kvc_cache_config cc;
    kvc_cache *c;
    int32_t *tok = (int32_t *)malloc(sizeof(int32_t) * ((size_t)n + 1)), i;
    double tp[MAX_REPS], th[MAX_REPS], td[MAX_REPS], tw[MAX_REPS], tdown_h[MAX_REPS], tdown_d[MAX_REPS], t0;
    double tr[MAX_REPS], tdown_r[MAX_REPS], host_bpt = 0, dir_bpt = 0, redis_bpt = 0;
    kvc_store store;
    for (i = 0; i <= n; ++i) tok[i] = (i * 7919 + n) % 50000;
    CHECK(kvc_pool_stats_get(pool, &ps));
    kvc_radix_config_init(&rc, KVC_KIND_FULL);
    kvc_cache_config_init(&cc, KVC_KIND_FULL);
    /* the K/V writes of a recompute (kvc_put: not on a device pool) */
    for (i = 0; i < g_reps && !on_device(); ++i) {
        CHECK(kvc_cache_create(pool, &cc, &c));
        t0 = now();
        append(c, n);
        tw[i] = now() - t0;
        CHECK(kvc_cache_destroy(c));
    }
    /* pool hit, and the host tier */
    CHECK(kvc_radix_create(pool, &rc, &t));
    kvc_tier_config_init(&tc);
    tc.host_bytes = (size_t)n * (size_t)g_layers * (size_t)(ps.k_row_bytes + ps.v_row_bytes) + ((size_t)1 << 20);
    CHECK(kvc_tier_attach(t, &tc));
    put_prefix(t, tok, n);
    for (i = 0; i < g_reps; ++i) tp[i] = ready_cache(t, tok, n, 0);
    for (i = 0; i < g_reps; ++i) {
        t0 = now();
        CHECK(kvc_radix_evict(t, 1 << 30, NULL)); /* down to the host tier */
        tdown_h[i] = now() - t0;
        CHECK(kvc_tier_stats_get(t, &ts));
        if (ts.host_blobs != 1) { fprintf(stderr, "the host tier holds %d blobs\n", (int)ts.host_blobs); exit(1); }
        host_bpt = (double)ts.host_bytes / n;
        th[i] = ready_cache(t, tok, n, 1);
    }
    CHECK(kvc_radix_destroy(t));
    CHECK(kvc_store_dir(&dir, g_dir, &store));
    dir_bpt = store_rounds(pool, tok, n, &store, tdown_d, td);
#ifdef BENCH_TIERS_REDIS
    if (g_redis_port > 0) {
        redis_store rs;
        redis_store_open(&rs, "127.0.0.1", g_redis_port, &store);
        redis_bpt = store_rounds(pool, tok, n, &store, tdown_r, tr);
        redis_store_close(&rs);
    }
#endif
    line("pool hit: kvc_radix_lookup", n, median(tp, g_reps), (double)ps.page_bytes / PAGE);
    line("host tier: kvc_tier_fetch + lookup", n, median(th, g_reps), host_bpt);
    line("directory: kvc_tier_fetch + lookup", n, median(td, g_reps), dir_bpt);
    if (redis_bpt > 0) line("Redis on 127.0.0.1: kvc_tier_fetch + lookup", n, median(tr, g_reps), redis_bpt);
    if (!on_device()) line("K/V writes of a recompute (no model)", n, median(tw, g_reps), 0);
    line("down: eviction into the host tier", n, median(tdown_h, g_reps), 0);
    line("down: eviction into the directory", n, median(tdown_d, g_reps), 0);
    if (redis_bpt > 0) line("down: eviction into Redis", n, median(tdown_r, g_reps), 0);
    printf("\n");
    free(tok);
    destroy_pool(pool);
}

/* ---- time to first token on the demo models: recompute against every tier ------------
   A model of tests/data (tinylm's loader and forward pass, f32, one memory group per layer
   type: lfm2-tiny's RECURRENT conv layers beside FULL attention, qwen3-swa-tiny's ROTATING
   sliding layers beside one FULL layer), a radix tree over its memory with a host-RAM tier
   and a store under it (blocks of 32 tokens), a prompt of n prefix tokens + 1 new one. The
   time to the new token's logits:
     recompute   the tree holds nothing: the forward pass over all n + 1 tokens (chunks of
                 2048, a checkpoint every 64 tokens, as tinylm's requests), then committed;
     pool hit    kvc_radix_lookup_memory reuses the n tokens, the forward of 1 token;
     host tier   the tree evicted (the entry down to the host tier), kvc_tier_fetch +
                 lookup + the forward of 1 token;
     directory   the same after the host tier was flushed to kvc_store_dir (page cache);
     Redis       the same from a redis-server on 127.0.0.1 (--redis-port; a build with
                 -DBENCH_TIERS_REDIS and -lhiredis).
   Each fetch must bring back all n tokens and the lookup reuse them (exit 1 otherwise). */

/* the store the tier calls: whichever *cur points to (the directory, then Redis) */
static kvc_store *g_cur_store;
static kvc_result sw_put(void *u, const kvc_key *k, const void *d, size_t n, int32_t ms) {
    (void)u;
    return g_cur_store->put(g_cur_store->user, k, d, n, ms);
}
static kvc_result sw_exists(void *u, const kvc_key *k, size_t *n, int32_t ms) {
    (void)u;
    return g_cur_store->exists(g_cur_store->user, k, n, ms);
}
static kvc_result sw_get(void *u, const kvc_key *k, void *d, size_t cap, size_t *n, int32_t ms) {
    (void)u;
    return g_cur_store->get(g_cur_store->user, k, d, cap, n, ms);
}

/* One request of toks[0 .. n1) through the tree: a fetch first when `fetch`, then the
   lookup (it must reuse `want` tokens), the forward pass over the rest (the last token's
   logits), committed when `commit`. Returns the seconds from the fetch to the logits. */
static double model_request(const model *m, kvc_radix *tree, const int32_t *toks, int32_t n1, int fetch,
                            int32_t want, int commit) {
    const config *c = &m->c;
    const int chunk = 2048;
    float *logits = alloc_floats((size_t)c->vocab);
    kvc_memory *km;
    memory M;
    int32_t got = 0, reused = -1, p, i, len, at[KEEP_CHECKPOINTS];
    double t0 = now(), t;
    if (fetch) CHECK(kvc_tier_fetch(tree, g_radix_ns, toks, n1, &got));
    CHECK(kvc_radix_lookup_memory(tree, g_radix_ns, toks, n1, &km, &reused));
    memory_layout(&M, c, NULL);
    M.mem = km;
    for (i = 0; i < M.n; ++i) {
        CHECK(kvc_memory_group(km, i, &M.g[i].cache));
        M.g[i].window = M.g[i].type == LAYER_SLIDING ? c->window : 0;
    }
    for (p = reused; p < n1; p += len) {
        len = n1 - p < chunk ? n1 - p : chunk;
        if (forward(m, &M, toks + p, len, p, at, checkpoints_in(p, len, at), len - 1, logits) != 0) exit(1);
    }
    t = now() - t0;
    if (reused != want || (fetch && got != want)) {
        fprintf(stderr, "a prefix of %d: fetched %d, reused %d\n", (int)want, (int)got, (int)reused);
        exit(1);
    }
    if (commit) CHECK(kvc_radix_commit_memory(tree, g_radix_ns, km, toks, n1, 0));
    CHECK(kvc_memory_destroy(km));
    free(logits);
    return t;
}

static void model_line(const char *what, double t, double recompute, double bytes_per_token) {
    char a[32], b[32] = "-";
    fmt_time(a, t);
    if (bytes_per_token > 0) snprintf(b, sizeof b, "%.0f", bytes_per_token);
    printf("  %-38s %s %11.1fx %12s\n", what, a, recompute / t, b);
}

static void bench_model(const char *dir, int32_t n, int reps, int redis_port) {
    model m;
    memory tmpl;
    kvc_radix_config rc;
    kvc_radix *tree;
    kvc_tier_config tc;
    kvc_store_dir_state ds;
    kvc_store dir_store, redis_s;
    kvc_radix_stats st;
    kvc_tier_stats ts;
    kvc_key key;
    const kind_spec *hybrid = NULL;
    int32_t *tok = (int32_t *)malloc(sizeof(int32_t) * ((size_t)n + 1)), i, k, kv_layers = 0;
    double trc, tp[MAX_REPS], th[MAX_REPS], td[MAX_REPS], tr[MAX_REPS], pool_bpt, host_bpt = 0, dir_bpt = 0,
        redis_bpt = 0;
    size_t size = 0, host_all = 0;
    int32_t host_blobs = 0;
#ifdef BENCH_TIERS_REDIS
    redis_store rs;
#endif
    (void)redis_s;
    g_quiet = 1;
    if (model_load(&m, dir) != 0) { /* tinylm said why */
        printf("%s: skipped (no model there)\n\n", dir);
        free(tok);
        return;
    }
    for (k = 0; k < COUNT_OF(KINDS); ++k)
        if (KINDS[k].hybrid) hybrid = &KINDS[k];
    for (i = 0; i < m.c.layers; ++i) kv_layers += m.c.type[i] != LAYER_CONV;
    /* room for the tree's entry, a request's memory and a blob loading: 3 copies */
    g_budget_bytes = (size_t)3 * ((size_t)n + 2 * PAGE_CELLS + 1) * (size_t)kv_layers * (size_t)m.c.kv *
                         (size_t)m.c.hd * 8u + ((size_t)16 << 20);
    if ((g_radix_ns.model = weights_id(dir)) == 0) exit(1);
    for (i = 0; i <= n; ++i) tok[i] = (i * 7919 + 13) % m.c.vocab;
    if (memory_create(&tmpl, &m.c, hybrid, KVC_TYPE_F32, 0, n + 1, 2048) != 0) exit(1);
    kvc_radix_config_init(&rc, KVC_KIND_FULL);
    kvc_tier_config_init(&tc);
    tc.host_bytes = g_budget_bytes;
    tc.block_tokens = 32;
    tc.timeout_ms = 10000;
    CHECK(kvc_store_dir(&ds, g_dir, &dir_store));
    g_cur_store = &dir_store;
    tc.store.put = sw_put;
    tc.store.exists = sw_exists;
    tc.store.get = sw_get;
    CHECK(kvc_radix_create_memory(tmpl.mem, &rc, &tree));
    CHECK(kvc_tier_attach(tree, &tc));
    printf("%s, %d layers (", dir, m.c.layers);
    for (i = 0; i < m.c.layers; ++i) printf("%s%s", i ? " " : "", LAYER_TYPE_NAMES[m.c.type[i]]);
    printf("), %d kv heads x %d, f32: a %d-token prefix + 1 token\n", m.c.kv, m.c.hd, (int)n);
    printf("  %-38s %12s %12s %12s\n", "time to first token", "median", "recompute/x", "bytes/token");

    trc = model_request(&m, tree, tok, n + 1, 0, 0, 1); /* one run: the slowest by far */
    CHECK(kvc_radix_stats_get(tree, &st));
    pool_bpt = (double)st.bytes / (n + 1);
    for (i = 0; i < reps; ++i) tp[i] = model_request(&m, tree, tok, n + 1, 0, n, 0);
    for (i = 0; i < reps; ++i) {
        CHECK(kvc_radix_evict(tree, 1 << 30, NULL)); /* down to the host tier */
        CHECK(kvc_tier_stats_get(tree, &ts));
        host_all = ts.host_bytes, host_blobs = ts.host_blobs;
        th[i] = model_request(&m, tree, tok, n + 1, 1, n, 0);
    }
    for (i = 0; i < reps; ++i) {
        CHECK(kvc_radix_evict(tree, 1 << 30, NULL));
        CHECK(kvc_tier_flush(tree)); /* host tier -> the directory */
        td[i] = model_request(&m, tree, tok, n + 1, 1, n, 0);
    }
    CHECK(kvc_tier_key(tree, g_radix_ns, tok, n, &key));
    CHECK(dir_store.exists(dir_store.user, &key, &size, 0));
    dir_bpt = host_bpt = (double)size / n; /* the same bytes in the host tier */
    dir_store.erase(dir_store.user, &key, 0);
#ifdef BENCH_TIERS_REDIS
    if (redis_port > 0) {
        redis_store_open(&rs, "127.0.0.1", redis_port, &redis_s);
        g_cur_store = &redis_s;
        for (i = 0; i < reps; ++i) {
            CHECK(kvc_radix_evict(tree, 1 << 30, NULL));
            CHECK(kvc_tier_flush(tree)); /* host tier -> Redis */
            tr[i] = model_request(&m, tree, tok, n + 1, 1, n, 0);
        }
        CHECK(redis_s.exists(redis_s.user, &key, &size, 1000));
        redis_bpt = (double)size / n;
        redis_s.erase(redis_s.user, &key, 1000);
    }
#endif
    model_line("recompute (forward over every token)", trc, trc, pool_bpt);
    model_line("pool hit (lookup + forward of 1)", median(tp, reps), trc, pool_bpt);
    model_line("host tier (fetch + lookup + 1)", median(th, reps), trc, host_bpt);
    model_line("directory store (page cache)", median(td, reps), trc, dir_bpt);
    if (redis_bpt > 0) model_line("Redis on 127.0.0.1", median(tr, reps), trc, redis_bpt);
    else printf("  %-38s (not run: %s)\n", "Redis on 127.0.0.1",
#ifdef BENCH_TIERS_REDIS
                "no --redis-port"
#else
                "a build with -DBENCH_TIERS_REDIS -lhiredis"
#endif
        );
    printf("  (bytes/token: the pool's pages the tree holds, and the blob of the %d tokens; the host tier held "
           "%d blobs, %.1f MiB, after an eviction: every evicted node's whole-block prefix)\n\n", (int)n,
           (int)host_blobs, host_all / MIB);
    CHECK(kvc_radix_evict(tree, 1 << 30, NULL));
    CHECK(kvc_radix_destroy(tree));
#ifdef BENCH_TIERS_REDIS
    if (redis_port > 0) redis_store_close(&rs);
#endif
    (void)redis_port;
    (void)tr;
    memory_free(&tmpl, "bench", "f32");
    model_free(&m);
    free(tok);
}

int main(int argc, char **argv) {
    int32_t sizes[8] = {4096, 32768}, msizes[8] = {4096, 32768};
    int n_sizes = 2, n_msizes = 2, r, s, redis_port = 0;
    const char *models = "tests/data/lfm2-tiny,tests/data/qwen3-swa-tiny";
    size_t i;
    for (r = 1; r < argc; r += 2) {
        long v = r + 1 < argc ? strtol(argv[r + 1], NULL, 10) : -1;
        if (!strcmp(argv[r], "--help") || !strcmp(argv[r], "-h")) {
            printf("usage: %s [--quick] [--vk] [--layers N] [--sizes A,B] [--reps N] [--dir DIR] [--models LIST]\n"
                   "          [--model-sizes A,B] [--redis-port P]\n"
                   "  --vk             the bench shape on device pools (kvcache_vk.h, the first Vulkan device)\n"
                   "  --layers N       layers of the bench shape (1..64, default 4)\n"
                   "  --sizes L        its prefix lengths (default 4096,32768)\n"
                   "  --reps N         runs per measurement, median printed (default 5; a recompute: 1)\n"
                   "  --dir DIR        the directory store (default build)\n"
                   "  --models LIST    demo models, comma-separated folders (default\n"
                   "                   tests/data/lfm2-tiny,tests/data/qwen3-swa-tiny; none: skip them)\n"
                   "  --model-sizes L  their prefix lengths (default 4096,32768)\n"
                   "  --redis-port P   also Redis on 127.0.0.1:P (a build with -DBENCH_TIERS_REDIS -lhiredis)\n"
                   "  --quick          bench shape: 1 layer, 4096 tokens; models: 512 tokens; 3 reps\n",
                   argv[0]);
            return 0;
        }
        if (!strcmp(argv[r], "--quick")) {
            g_layers = 1, g_reps = 3, n_sizes = 1, msizes[0] = 512, n_msizes = 1;
            --r;
        } else if (!strcmp(argv[r], "--vk")) {
            --r;
#ifdef TINYLM_VK
            {
                kvc_vk_device_options o;
                memset(&o, 0, sizeof(o));
                o.device_index = -1;
                if (kvc_vk_loader_open(&g_bench_loader) != KVC_OK) { printf("bench_tiers --vk: skipped (no Vulkan loader)\n"); return 0; }
                o.get_instance_proc_addr = g_bench_loader.get_instance_proc_addr;
                if (kvc_vk_device_create(&o, &g_bench_vk) != KVC_OK) { printf("bench_tiers --vk: skipped (no Vulkan device)\n"); return 0; }
            }
#else
            printf("bench_tiers --vk: skipped (no Vulkan headers)\n");
            return 0;
#endif
        } else if (!strcmp(argv[r], "--layers") && v >= 1 && v <= 64) g_layers = (int)v;
        else if (!strcmp(argv[r], "--reps") && v >= 1) g_reps = (int)(v < MAX_REPS ? v : MAX_REPS);
        else if (!strcmp(argv[r], "--sizes") && r + 1 < argc) n_sizes = parse_list(argv[r + 1], sizes, 8);
        else if (!strcmp(argv[r], "--model-sizes") && r + 1 < argc) n_msizes = parse_list(argv[r + 1], msizes, 8);
        else if (!strcmp(argv[r], "--models") && r + 1 < argc) models = argv[r + 1];
        else if (!strcmp(argv[r], "--redis-port") && v > 0 && v < 65536) redis_port = g_redis_port = (int)v;
        else if (!strcmp(argv[r], "--dir") && r + 1 < argc) g_dir = argv[r + 1];
        else {
            fprintf(stderr, "usage: %s [--quick] [--vk] [--layers N] [--sizes A,B] [--reps N] [--dir DIR] [--models LIST] "
                            "[--model-sizes A,B] [--redis-port P] [--help]\n", argv[0]);
            return 2;
        }
    }
    for (s = 0; s < n_sizes; ++s)
        if (sizes[s] < PAGE || sizes[s] % PAGE != 0) {
            fprintf(stderr, "sizes must be multiples of %d\n", PAGE);
            return 2;
        }
    for (s = 0; s < n_msizes; ++s)
        if (msizes[s] < 64 || msizes[s] % 64 != 0) {
            fprintf(stderr, "model sizes must be multiples of 64 (a checkpoint and a whole block there)\n");
            return 2;
        }
#ifdef BENCH_TIERS_REDIS
    signal(SIGPIPE, SIG_IGN); /* a write to a server that died: an error, not the end */
#endif
    if (strcmp(models, "none") != 0) {
        char dir[1024];
        printf("kvcache.h tiers benchmark: time to first token on the demo models, median of %d runs "
               "(a recompute: 1)\n\n", g_reps);
        for (s = 0; s < n_msizes; ++s)
            for (const char *m = models; *m;) {
                size_t len = strcspn(m, ",");
                snprintf(dir, sizeof dir, "%.*s", (int)len, m);
                bench_model(dir, msizes[s], g_reps, redis_port);
                m += len + (m[len] == ',');
            }
    }
    g_k = (float *)malloc(sizeof(float) * 512 * ROW);
    g_v = (float *)malloc(sizeof(float) * 512 * ROW);
    for (i = 0; i < (size_t)512 * ROW; ++i) {
        g_k[i] = (float)((i * 2654435761u) % 2001) / 1000.0f - 1.0f;
        g_v[i] = (float)((i * 40503u) % 2001) / 1000.0f - 1.0f;
    }
    printf("kvcache.h tiers benchmark: %d layers x %d kv heads x head dim %d, f16, %d cells per page, "
           "median of %d runs\n", g_layers, KV_HEADS, HEAD_DIM, PAGE, g_reps);
#ifdef TINYLM_VK
    if (g_bench_vk != NULL) {
        kvc_vk_info info;
        kvc_vk_context_info(g_bench_vk, &info);
        printf("device pools on %s: eviction and fetch copy through the staging halves\n", info.device_name);
    }
#endif
    printf("\n");
    printf("%-44s %6s %12s %10s\n", "ready cache of a prefix (+1 new token)", "tokens", "median", "bytes/token");
    for (s = 0; s < n_sizes; ++s) bench_size(sizes[s]);
    free(g_k);
    free(g_v);
#ifdef TINYLM_VK
    if (g_bench_vk != NULL) {
        CHECK(kvc_vk_context_destroy(g_bench_vk));
        kvc_vk_loader_close(&g_bench_loader);
    }
#endif
    return 0;
}
