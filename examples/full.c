/* full.c - a FULL (append-only) cache: forward passes, page-by-page growth,
   zero-copy runs and trimming.

   Build (from the repository root):
       cc -std=c99 -O2 -Wall -Wextra -Wpedantic examples/full.c -o full -lm

   The "model" here is fake but the numbers are real: the value vector of token t is
   filled with t and every query is zero, so attention weights every visible key
   equally and its output is the mean of the visible positions: (0+1+...+p)/(p+1) =
   p/2 for the query at position p. */
#define KVCACHE_IMPLEMENTATION
#include "../kvcache.h"

#include <stdio.h>
#include <string.h>

#define N_LAYERS 2
#define KV_HEADS 2
#define HEAD_DIM 8
#define Q_HEADS 4   /* GQA: two query heads per kv head */
#define PAGE 4      /* tiny pages so the growth is visible; real models use 256 */
#define MAX_BATCH 8
#define ROW (KV_HEADS * HEAD_DIM)

#define CHECK(call)                                                                     \
    do {                                                                                \
        kvc_result r_ = (call);                                                         \
        if (r_ != KVC_OK) {                                                             \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, kvc_strerror(r_)); \
            return 1;                                                                   \
        }                                                                               \
    } while (0)

static float k_in[MAX_BATCH * ROW], v_in[MAX_BATCH * ROW];
static float q_in[MAX_BATCH * Q_HEADS * HEAD_DIM], out[MAX_BATCH * Q_HEADS * HEAD_DIM];

/* One forward pass of n tokens: reserve cells, then per layer put K/V and attend. */
static int forward(kvc_pool *pool, kvc_cache *cache, int32_t n) {
    int32_t i, j, layer, offset, cells;
    kvc_attention_desc attn;
    kvc_pool_stats st;
    CHECK(kvc_cache_offset(cache, &offset));          /* position of the first new token */
    CHECK(kvc_begin(cache, n, NULL, 0));              /* the only call that can run out of pages */
    for (layer = 0; layer < N_LAYERS; ++layer) {
        for (i = 0; i < n; ++i)
            for (j = 0; j < ROW; ++j) {
                k_in[i * ROW + j] = 0.01f * (float)(j + layer);
                v_in[i * ROW + j] = (float)(offset + i);   /* V = the token's position */
            }
        CHECK(kvc_put(cache, layer, k_in, v_in));
        memset(&attn, 0, sizeof(attn));
        attn.n_queries = n;
        attn.n_heads = Q_HEADS;
        attn.q = q_in;                                /* zeros: uniform attention */
        attn.out = out;                               /* pos = NULL: the batch's own positions */
        CHECK(kvc_attention(cache, layer, &attn));
    }
    CHECK(kvc_cache_offset(cache, &offset));
    CHECK(kvc_cache_cells(cache, &cells));
    CHECK(kvc_pool_stats_get(pool, &st));
    printf("  +%d token%s -> offset %2d, cells %2d, pages used %d (%zu bytes); "
           "last query sees mean pos %.2f (expected %.2f)\n",
           (int)n, n == 1 ? " " : "s", (int)offset, (int)cells, (int)st.pages_used, st.bytes_used,
           out[(n - 1) * Q_HEADS * HEAD_DIM], (offset - 1) / 2.0);
    return 0;
}

/* Print the zero-copy runs of layer 0: each is one contiguous [cells][kv_heads][dim] block. */
static int print_runs(kvc_cache *cache) {
    kvc_run runs[16];
    int32_t n, i;
    CHECK(kvc_cache_runs(cache, 0, runs, 16, &n));
    printf("  kvc_cache_runs: %d run%s:", (int)n, n == 1 ? "" : "s");
    for (i = 0; i < n; ++i)
        printf(" [pos %d..%d, %d cells]", (int)runs[i].pos[0], (int)runs[i].pos[runs[i].n_cells - 1],
               (int)runs[i].n_cells);
    printf("\n");
    return 0;
}

int main(void) {
    kvc_pool_config pc;
    kvc_cache_config cc;
    kvc_pool *pool;
    kvc_cache *cache, *other;
    kvc_pool_stats st;
    int32_t i, offset;

    CHECK(kvc_pool_config_init(&pc));
    pc.n_layers = N_LAYERS;
    pc.n_kv_heads = KV_HEADS;
    pc.head_dim_k = pc.head_dim_v = HEAD_DIM;
    pc.type_k = pc.type_v = KVC_TYPE_F16;             /* stored as half, read back as f32 */
    pc.page_cells = PAGE;
    pc.budget_bytes = 16 * (size_t)(N_LAYERS * PAGE * ROW * 2 * 2); /* exactly 16 pages */
    CHECK(kvc_pool_create(&pc, &pool));
    CHECK(kvc_pool_stats_get(pool, &st));
    printf("pool: %d pages of %d cells, %zu bytes per page (all %d layers, K+V, f16)\n",
           (int)st.pages_total, (int)st.page_cells, st.page_bytes, N_LAYERS);

    memset(&cc, 0, sizeof(cc));
    cc.kind = KVC_KIND_FULL;
    CHECK(kvc_cache_create(pool, &cc, &cache));

    printf("prompt of 6 tokens, then token-by-token decode (a page holds %d tokens):\n", PAGE);
    if (forward(pool, cache, 6)) return 1;
    for (i = 0; i < 5; ++i)
        if (forward(pool, cache, 1)) return 1;
    print_runs(cache); /* pages 0,1,2 were taken in order: one contiguous run */

    /* A second cache takes the next page, so our cache's next page is not adjacent. */
    printf("a second cache takes the next free page (its own token 0):\n");
    CHECK(kvc_cache_create(pool, &cc, &other));
    if (forward(pool, other, 1)) return 1;
    printf("ours grows past it:\n");
    if (forward(pool, cache, 3)) return 1;
    print_runs(cache);

    /* Trim: drop the last 7 tokens; pages that hold no remaining token go back. */
    CHECK(kvc_cache_trim(cache, 7));
    CHECK(kvc_cache_offset(cache, &offset));
    CHECK(kvc_pool_stats_get(pool, &st));
    printf("kvc_cache_trim(7): offset %d, pages used %d (peak %d)\n", (int)offset, (int)st.pages_used,
           (int)st.pages_peak);
    print_runs(cache);
    printf("decode continues after the trim:\n");
    if (forward(pool, cache, 1)) return 1;

    CHECK(kvc_cache_destroy(other));
    CHECK(kvc_cache_destroy(cache));
    CHECK(kvc_pool_stats_get(pool, &st));
    printf("caches destroyed: pages used %d\n", (int)st.pages_used);
    CHECK(kvc_pool_destroy(pool));
    return 0;
}
