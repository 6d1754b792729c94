/* bench_tiers.c - time to a ready cache of a shared prefix from each tier (run by
   `make bench`).

   On a model shape of --layers layers (default 4) x 8 kv heads x head dim 128, f16, 256
   cells per page (bench_prefix's shape), for each prefix length of --sizes (default
   4096,32768), a prompt of the prefix + 1 new token:
     pool hit     kvc_radix_lookup of the prompt while the tree holds the prefix;
     host tier    the entry evicted to the host-RAM tier, then kvc_tier_fetch +
                  kvc_radix_lookup (the blob checked and loaded back into the pool);
     directory    the entry evicted to kvc_store_dir in --dir (no host tier), then fetch +
                  lookup (the file was just written: it comes from the page cache);
     K/V writes   kvc_begin + kvc_put of the prefix's K/V: the cache's share of
                  recomputing it. A real recompute adds the model's forward pass over the
                  prefix (not run here), which on any model is far larger.
   and the time to move the entry down (eviction saving it to the host tier, or writing
   it to the directory), and the bytes per token in each place. Every time is the median
   of --reps runs, measured in this run; every fetch is checked to bring back the whole
   prefix (exit status 1 otherwise or on a library error).
   --vk: the same rows on a device pool (kvcache_vk.h, the first Vulkan device): the K/V
   live on the device, eviction reads them off it and a fetch writes them back through
   the backend's two staging halves (both wait for their copies, so "ready" means the
   cache is on the device); the prefix is loaded from the CPU's evaluation, so there is
   no K/V-writes row. On lavapipe the "device" is host memory: its numbers are the
   staging's and the format's costs, not a GPU's bus.

   Build:  cc -std=c99 -O2 -Wall -Wextra -Wpedantic bench/bench_tiers.c -o bench_tiers -lm
   Usage:  bench_tiers [--quick] [--vk] [--layers N] [--sizes A,B] [--reps N] [--dir DIR] [--help] */
#define _POSIX_C_SOURCE 200809L
#define KVCACHE_IMPLEMENTATION
#include "../kvcache.h"
#include "bench_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__has_include)
#if __has_include(<vulkan/vulkan.h>)
#define HAVE_VK 1
#endif
#endif
#ifdef HAVE_VK
#define VK_NO_PROTOTYPES
#define KVCACHE_VK_IMPLEMENTATION
#define KVCACHE_VK_HELPERS /* the loader and a device of its own */
#include "../kvcache_vk.h"
static kvc_vk_loader g_loader;
static kvc_vk_context *g_vk; /* --vk: the device; NULL: CPU pools */
static kvc_vk_pool *g_vk_pool;
#endif

#define KV_HEADS 8
#define HEAD_DIM 128
#define ROW (KV_HEADS * HEAD_DIM)
#define PAGE 256
#define MAX_REPS 101
#define MIB (1024.0 * 1024.0)

static int g_layers = 4, g_reps = 5;
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
#ifdef HAVE_VK
    if (device) {
        CHECK(kvc_vk_pool_create(g_vk, &pc, NULL, &g_vk_pool));
        return kvc_vk_pool_host(g_vk_pool);
    }
#endif
    CHECK(kvc_pool_create(&pc, &p));
    return p;
}

static int on_device(void) {
#ifdef HAVE_VK
    return g_vk != NULL;
#else
    return 0;
#endif
}
static kvc_pool *make_pool(int32_t tokens) { return make_pool_on(tokens, on_device()); }
static void destroy_pool(kvc_pool *p) {
#ifdef HAVE_VK
    if (on_device()) {
        (void)p;
        CHECK(kvc_vk_pool_destroy(g_vk_pool));
        g_vk_pool = NULL;
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
    double host_bpt = 0, dir_bpt = 0;
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
    /* the directory store */
    CHECK(kvc_radix_create(pool, &rc, &t));
    kvc_tier_config_init(&tc);
    CHECK(kvc_store_dir(&dir, g_dir, &tc.store));
    CHECK(kvc_tier_attach(t, &tc));
    put_prefix(t, tok, n);
    for (i = 0; i < g_reps; ++i) {
        t0 = now();
        CHECK(kvc_radix_evict(t, 1 << 30, NULL)); /* straight to the directory */
        tdown_d[i] = now() - t0;
        td[i] = ready_cache(t, tok, n, 1);
    }
    {
        kvc_key key;
        size_t size = 0;
        CHECK(kvc_tier_key(t, NS, tok, n, &key));
        CHECK(tc.store.exists(tc.store.user, &key, &size, 0));
        dir_bpt = (double)size / n;
        if (tc.store.erase) tc.store.erase(tc.store.user, &key, 0);
    }
    CHECK(kvc_radix_destroy(t));
    line("pool hit: kvc_radix_lookup", n, median(tp, g_reps), (double)ps.page_bytes / PAGE);
    line("host tier: kvc_tier_fetch + lookup", n, median(th, g_reps), host_bpt);
    line("directory: kvc_tier_fetch + lookup", n, median(td, g_reps), dir_bpt);
    if (!on_device()) line("K/V writes of a recompute (no model)", n, median(tw, g_reps), 0);
    line("down: eviction into the host tier", n, median(tdown_h, g_reps), 0);
    line("down: eviction into the directory", n, median(tdown_d, g_reps), 0);
    printf("\n");
    free(tok);
    destroy_pool(pool);
}

int main(int argc, char **argv) {
    int32_t sizes[8] = {4096, 32768};
    int n_sizes = 2, r, s;
    size_t i;
    for (r = 1; r < argc; r += 2) {
        long v = r + 1 < argc ? strtol(argv[r + 1], NULL, 10) : -1;
        if (!strcmp(argv[r], "--help") || !strcmp(argv[r], "-h")) {
            printf("usage: %s [--quick] [--vk] [--layers N] [--sizes A,B] [--reps N] [--dir DIR]\n"
                   "  --vk        device pools (kvcache_vk.h, the first Vulkan device)\n"
                   "  --layers N  layers of the model shape (1..64, default 4)\n"
                   "  --sizes L   prefix lengths (default 4096,32768)\n"
                   "  --reps N    runs per measurement, median printed (default 5)\n"
                   "  --dir DIR   the directory store (default build)\n"
                   "  --quick     1 layer, 4096 tokens, 3 reps\n", argv[0]);
            return 0;
        }
        if (!strcmp(argv[r], "--quick")) {
            g_layers = 1, g_reps = 3, n_sizes = 1;
            --r;
        } else if (!strcmp(argv[r], "--vk")) {
            --r;
#ifdef HAVE_VK
            {
                kvc_vk_device_options o;
                memset(&o, 0, sizeof(o));
                o.device_index = -1;
                if (kvc_vk_loader_open(&g_loader) != KVC_OK) { printf("bench_tiers --vk: skipped (no Vulkan loader)\n"); return 0; }
                o.get_instance_proc_addr = g_loader.get_instance_proc_addr;
                if (kvc_vk_device_create(&o, &g_vk) != KVC_OK) { printf("bench_tiers --vk: skipped (no Vulkan device)\n"); return 0; }
            }
#else
            printf("bench_tiers --vk: skipped (no Vulkan headers)\n");
            return 0;
#endif
        } else if (!strcmp(argv[r], "--layers") && v >= 1 && v <= 64) g_layers = (int)v;
        else if (!strcmp(argv[r], "--reps") && v >= 1) g_reps = (int)(v < MAX_REPS ? v : MAX_REPS);
        else if (!strcmp(argv[r], "--sizes") && r + 1 < argc) n_sizes = parse_list(argv[r + 1], sizes, 8);
        else if (!strcmp(argv[r], "--dir") && r + 1 < argc) g_dir = argv[r + 1];
        else {
            fprintf(stderr, "usage: %s [--quick] [--vk] [--layers N] [--sizes A,B] [--reps N] [--dir DIR]\n", argv[0]);
            return 2;
        }
    }
    for (s = 0; s < n_sizes; ++s)
        if (sizes[s] < PAGE || sizes[s] % PAGE != 0) {
            fprintf(stderr, "sizes must be multiples of %d\n", PAGE);
            return 2;
        }
    g_k = (float *)malloc(sizeof(float) * 512 * ROW);
    g_v = (float *)malloc(sizeof(float) * 512 * ROW);
    for (i = 0; i < (size_t)512 * ROW; ++i) {
        g_k[i] = (float)((i * 2654435761u) % 2001) / 1000.0f - 1.0f;
        g_v[i] = (float)((i * 40503u) % 2001) / 1000.0f - 1.0f;
    }
    printf("kvcache.h tiers benchmark: %d layers x %d kv heads x head dim %d, f16, %d cells per page, "
           "median of %d runs\n", g_layers, KV_HEADS, HEAD_DIM, PAGE, g_reps);
#ifdef HAVE_VK
    if (g_vk != NULL) {
        kvc_vk_info info;
        kvc_vk_context_info(g_vk, &info);
        printf("device pools on %s: eviction and fetch copy through the staging halves\n", info.device_name);
    }
#endif
    printf("\n");
    printf("%-44s %6s %12s %10s\n", "ready cache of a prefix (+1 new token)", "tokens", "median", "bytes/token");
    for (s = 0; s < n_sizes; ++s) bench_size(sizes[s]);
    free(g_k);
    free(g_v);
#ifdef HAVE_VK
    if (g_vk != NULL) {
        CHECK(kvc_vk_context_destroy(g_vk));
        kvc_vk_loader_close(&g_loader);
    }
#endif
    return 0;
}
