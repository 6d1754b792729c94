/* rotating.c - a ROTATING cache: a sliding window of W = 4 keys kept as a ring of
   pages, with and without an attention sink (StreamingLLM), and why a wrapped
   window needs a snapshot to go back.

   Build (from the repository root):
       cc -std=c99 -O2 -Wall -Wextra -Wpedantic examples/rotating.c -o rotating -lm

   V of token t is filled with t and queries are zero, so attention averages the
   positions a query sees: printed next to the average we expect from the window. */
#define KVCACHE_IMPLEMENTATION
#include "../kvcache.h"

#include <stdio.h>
#include <string.h>

#define WINDOW 4
#define DIM 4      /* one layer, one kv head of 4 values */
#define PAGE 2     /* two tokens per page: the ring of pages is easy to follow */
#define MAXC 32

#define CHECK(call)                                                                     \
    do {                                                                                \
        kvc_result r_ = (call);                                                         \
        if (r_ != KVC_OK) {                                                             \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, kvc_strerror(r_)); \
            return 1;                                                                   \
        }                                                                               \
    } while (0)

/* Print the positions the cache exposes now (every key the batch's earliest query
   may see), the pages it holds and the attention average of the last query. */
static int show(kvc_cache *cache, const char *what, float last_out, int sinks) {
    int32_t pos[MAXC], n, i, offset, pages;
    double expect = 0.0;
    int seen = 0;
    CHECK(kvc_cache_gather(cache, 0, NULL, NULL, pos, MAXC, &n));
    CHECK(kvc_cache_offset(cache, &offset));
    CHECK(kvc_cache_pages(cache, &pages));
    for (i = 0; i < offset; ++i) /* keys of the last query: sinks + the W-sinks newest */
        if (i < sinks || i > offset - 1 - (WINDOW - sinks)) { expect += i; seen++; }
    printf("  %-22s offset %2d  pages %d  pos {", what, (int)offset, (int)pages);
    for (i = 0; i < n; ++i) printf(i ? " %d" : "%d", (int)pos[i]);
    printf("}");
    if (last_out >= 0.0f) printf("  last query avg %.2f (expect %.2f)", last_out, expect / seen);
    printf("\n");
    return 0;
}

/* One forward pass of n tokens (n > 1: ollama's MLX runner's concat, n == 1: its ring
   update; both keep the same window). */
static int step(kvc_cache *cache, int32_t n, int sinks) {
    float k[16 * DIM], v[16 * DIM], q[16 * DIM], out[16 * DIM];
    char what[32];
    int32_t i, offset;
    kvc_attention_desc a;
    CHECK(kvc_cache_offset(cache, &offset));
    CHECK(kvc_begin(cache, n, NULL, 0));
    for (i = 0; i < n * DIM; ++i) {
        k[i] = 0.1f;
        v[i] = (float)(offset + i / DIM);
        q[i] = 0.0f;
    }
    CHECK(kvc_put(cache, 0, k, v));
    memset(&a, 0, sizeof(a));
    a.n_queries = n;
    a.n_heads = 1;
    a.q = q;
    a.out = out;
    CHECK(kvc_attention(cache, 0, &a));
    sprintf(what, n > 1 ? "concat %d tokens" : "update %d token", (int)n);
    return show(cache, what, out[(n - 1) * DIM], sinks);
}

static int demo(kvc_pool *pool, int sinks) {
    kvc_cache_config cc;
    kvc_cache *cache;
    kvc_snapshot *snap;
    kvc_pool_stats st;
    kvc_result r;
    int i;
    memset(&cc, 0, sizeof(cc));
    cc.kind = KVC_KIND_ROTATING;
    cc.window = WINDOW; /* W keys including the current token */
    cc.sinks = sinks;   /* the first `sinks` tokens stay visible forever */
    CHECK(kvc_cache_create(pool, &cc, &cache));
    printf("window %d, sinks %d, %d tokens per page\n", WINDOW, sinks, PAGE);

    /* Before the window has wrapped (offset <= W) a live rewind works. */
    if (step(cache, 3, sinks)) return 1;
    CHECK(kvc_cache_restore(cache, NULL, 1));
    if (show(cache, "live rewind to 1: ok", -1.0f, sinks)) return 1;
    CHECK(kvc_cache_clear(cache));

    if (step(cache, 8, sinks) || step(cache, 8, sinks)) return 1;
    for (i = 0; i < 3; ++i)
        if (step(cache, 1, sinks)) return 1;

    /* Snapshot the window at offset 19: it shares the pages, nothing is copied. */
    CHECK(kvc_snapshot_take(cache, 0, KVC_POS_END, &snap));
    if (step(cache, 1, sinks)) return 1;

    /* Wrapped: the keys older than the window are gone, so going back needs the snapshot. */
    r = kvc_cache_restore(cache, NULL, 19);
    printf("  live rewind to 19     -> %s\n", kvc_strerror(r));
    if (r != KVC_ERR_UNREACHABLE) return 1;
    r = kvc_cache_restore(cache, snap, 18);
    printf("  snapshot, target 18   -> %s (would clamp a wrapped window)\n", kvc_strerror(r));
    if (r != KVC_ERR_UNREACHABLE) return 1;
    CHECK(kvc_cache_restore(cache, snap, 19));
    if (show(cache, "restore(snap, 19): ok", -1.0f, sinks)) return 1;
    if (step(cache, 1, sinks)) return 1; /* the same token 19 again, same window */

    CHECK(kvc_snapshot_free(snap));
    CHECK(kvc_cache_destroy(cache));
    CHECK(kvc_pool_stats_get(pool, &st));
    printf("  cache destroyed: pages used %d, peak %d\n\n", (int)st.pages_used, (int)st.pages_peak);
    return 0;
}

int main(void) {
    kvc_pool_config pc;
    kvc_pool *pool;
    CHECK(kvc_pool_config_init(&pc));
    pc.n_layers = 1;
    pc.n_kv_heads = 1;
    pc.head_dim_k = pc.head_dim_v = DIM;
    pc.page_cells = PAGE;
    pc.budget_bytes = 32 * (size_t)(PAGE * DIM * 4 * 2); /* 32 pages, f32 K+V */
    CHECK(kvc_pool_create(&pc, &pool));
    if (demo(pool, 0) || demo(pool, 1)) return 1;
    CHECK(kvc_pool_destroy(pool));
    return 0;
}
