/* snapshot.c - snapshots of a FULL cache: branch, restore, branch again; what a
   snapshot pins; copy-on-write; merge and split.

   Build (from the repository root):
       cc -std=c99 -O2 -Wall -Wextra -Wpedantic examples/snapshot.c -o snapshot -lm

   Every value of token t's V row is a tag: t for the prompt, 100+t on branch A,
   200+t on branch B, so a gather shows which branch wrote which cell. */
#define KVCACHE_IMPLEMENTATION
#include "../kvcache.h"

#include <stdio.h>
#include <string.h>

#define DIM 4   /* one layer, one kv head of 4 values: enough to see the data */
#define PAGE 4  /* four tokens per page */

#define CHECK(call)                                                                     \
    do {                                                                                \
        kvc_result r_ = (call);                                                         \
        if (r_ != KVC_OK) {                                                             \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, kvc_strerror(r_)); \
            return 1;                                                                   \
        }                                                                               \
    } while (0)

static kvc_pool *pool;

/* Append n tokens whose V rows hold tag + position. */
static int append(kvc_cache *c, int32_t n, float tag) {
    float k[16 * DIM], v[16 * DIM];
    int32_t i, offset;
    CHECK(kvc_cache_offset(c, &offset));
    for (i = 0; i < n * DIM; ++i) { k[i] = 1.0f; v[i] = tag + (float)(offset + i / DIM); }
    CHECK(kvc_begin(c, n, NULL, 0));
    return kvc_put(c, 0, k, v) == KVC_OK ? 0 : 1;
}

/* Print the cache's V tags (gathered to f32) and the pool's page count. */
static int show(kvc_cache *c, const char *what) {
    float v[64 * DIM];
    int32_t n, i;
    kvc_pool_stats st;
    CHECK(kvc_cache_gather(c, 0, NULL, v, NULL, 64, &n));
    CHECK(kvc_pool_stats_get(pool, &st));
    printf("%-34s pages used %d  V:", what, (int)st.pages_used);
    for (i = 0; i < n; ++i) printf(" %g", v[i * DIM]);
    printf("\n");
    return 0;
}

static int info(const kvc_snapshot *s, const char *name) {
    kvc_snapshot_info in;
    if (s == NULL) { printf("  %-8s (none)\n", name); return 0; }
    CHECK(kvc_snapshot_info_get(s, &in));
    printf("  %-8s [%2d, %2d)  %d page%s  %zu bytes\n", name, (int)in.from, (int)in.to, (int)in.n_pages,
           in.n_pages == 1 ? " " : "s", in.bytes);
    return 0;
}

int main(void) {
    kvc_pool_config pc;
    kvc_cache_config cc;
    kvc_cache *cache;
    kvc_snapshot *snap, *tail, *head, *merged;

    CHECK(kvc_pool_config_init(&pc));
    pc.n_layers = 1;
    pc.n_kv_heads = 1;
    pc.head_dim_k = pc.head_dim_v = DIM;
    pc.page_cells = PAGE;
    pc.budget_bytes = 32 * (size_t)(PAGE * DIM * 4 * 2); /* 32 pages, f32 K+V */
    CHECK(kvc_pool_create(&pc, &pool));
    memset(&cc, 0, sizeof(cc));
    cc.kind = KVC_KIND_FULL;
    CHECK(kvc_cache_create(pool, &cc, &cache));

    /* 1. A prompt of 10 tokens: 3 pages (4 + 4 + 2 tokens). */
    if (append(cache, 10, 0.0f) || show(cache, "prompt, 10 tokens")) return 1;

    /* 2. Snapshots share pages: taking one copies nothing, and pins only what it covers. */
    CHECK(kvc_snapshot_take(cache, 0, KVC_POS_END, &snap));
    CHECK(kvc_snapshot_take(cache, 8, KVC_POS_END, &tail));
    if (show(cache, "after 2 snapshots (no copy)")) return 1;
    printf("snapshots:\n");
    if (info(snap, "snap") || info(tail, "tail")) return 1;

    /* 3. Branch A: rewind to 8 and write other tokens 8..12 over the shared page.
       The page holding 8..9 is copied first (copy-on-write): the snapshots keep theirs. */
    CHECK(kvc_cache_trim(cache, 2));
    if (append(cache, 5, 100.0f) || show(cache, "branch A: trim 2, +5 tokens")) return 1;

    /* 4. Back to the end of the prompt: the original 8, 9 come back from the snapshot. */
    CHECK(kvc_cache_restore(cache, snap, 10));
    if (show(cache, "restore(snap, 10)")) return 1;

    /* 5. Branch B from there. */
    if (append(cache, 3, 200.0f) || show(cache, "branch B: +3 tokens")) return 1;

    /* 6. The tail snapshot alone pins one page once nothing else holds it. */
    CHECK(kvc_snapshot_free(snap));
    CHECK(kvc_cache_clear(cache));
    if (show(cache, "snap freed, cache cleared")) return 1;
    CHECK(kvc_snapshot_free(tail));
    if (show(cache, "tail freed")) return 1;

    /* 7. Merge and split, as when a request is saved in segments: [0,6) then [6,10). */
    if (append(cache, 6, 0.0f)) return 1;
    CHECK(kvc_snapshot_take(cache, 0, KVC_POS_END, &head));
    if (append(cache, 4, 0.0f)) return 1;       /* copies page 1 (4..5 shared with head) */
    CHECK(kvc_snapshot_take(cache, 6, KVC_POS_END, &tail));
    if (show(cache, "10 tokens, snapshots [0,6) [6,10)")) return 1;
    if (info(head, "head") || info(tail, "tail")) return 1;
    CHECK(kvc_snapshot_merge(cache, head, tail, &merged)); /* consumes both */
    printf("merge:\n");
    if (info(merged, "merged") || show(cache, "after merge (1 page combined)")) return 1;
    CHECK(kvc_snapshot_split(cache, merged, 6, &head, &tail)); /* consumes merged */
    printf("split at 6 (page 1 is shared by both halves, not copied):\n");
    if (info(head, "head") || info(tail, "tail") || show(cache, "after split")) return 1;
    CHECK(kvc_cache_clear(cache));
    if (show(cache, "cache cleared, halves kept")) return 1;
    CHECK(kvc_cache_restore(cache, head, 6)); /* a [0,6) snapshot needs no earlier tokens */
    if (show(cache, "restore(head, 6)")) return 1;
    CHECK(kvc_cache_restore(cache, tail, 9)); /* [6,10) stacks on it, clamped to 9 */
    if (show(cache, "restore(tail, 9)")) return 1;

    CHECK(kvc_snapshot_free(head));
    CHECK(kvc_snapshot_free(tail));
    CHECK(kvc_cache_destroy(cache));
    CHECK(kvc_pool_destroy(pool));
    return 0;
}
