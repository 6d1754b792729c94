/* test_limits.c - sizes near 2^31 / 2^32 (cells, bytes, tokens, layers, heads, head
   dims, page_cells, budgets, max_seqs, batch sizes, snapshot ranges, positions) must be
   refused cleanly: a result code, nothing changed, no arithmetic that wraps, no
   allocation of a wrapped size. Run it on 64-bit hosts and on the 32-bit ARM build
   (size_t of 32 bits), and under UBSan (signed overflow is caught there).

   Every pool here gets its memory from a limiting allocator: it refuses any block larger
   than 64 MiB (so a legitimately huge request fails cleanly instead of really taking
   the memory) and records the largest size it was asked for, so a test can tell an
   honest huge request from a wrapped small one. */
#include <stdlib.h>
#include <time.h>

#define KVCACHE_IMPLEMENTATION
#include "../kvcache.h"
#include "tk.h"

#define LIMIT ((size_t)64 << 20)

static long g_calls, g_live;
static size_t g_max_request, g_limit = LIMIT;
static void *lim_alloc(size_t n, void *user) {
    void *p;
    (void)user;
    g_calls++;
    if (n > g_max_request) g_max_request = n;
    if (n > g_limit) return NULL;
    p = malloc(n);
    if (p) g_live++;
    return p;
}
static void lim_free(void *p, void *user) {
    (void)user;
    if (p) g_live--;
    free(p);
}
static void lim_reset(void) { g_calls = 0; g_max_request = 0; }

static const int is32 = sizeof(size_t) == 4;
/* compare sizes as 64-bit values (a function, so 32-bit builds do not warn about constants) */
static uint64_t u64(size_t x) { return (uint64_t)x; }

static void config(kvc_pool_config *c, int32_t layers, int32_t heads, int32_t hk, int32_t hv, int32_t page_cells,
                   size_t budget) {
    kvc_pool_config_init(c);
    c->n_layers = layers;
    c->n_kv_heads = heads;
    c->head_dim_k = hk;
    c->head_dim_v = hv;
    c->page_cells = page_cells;
    c->budget_bytes = budget;
    c->runtime.allocator.alloc = lim_alloc;
    c->runtime.allocator.free = lim_free;
}

/* A pool configuration that must be refused: `want` (or any of want/alt when alt != 0),
   no pool, and no allocation unless the refusal is the allocator's own. */
static void refused(const kvc_pool_config *c, kvc_result want, kvc_result alt, int line) {
    kvc_pool *p = NULL;
    size_t bytes = 12345;
    kvc_result r;
    lim_reset();
    r = kvc_pool_create(c, &p);
    if (!(r == want || (alt != 0 && r == alt))) fprintf(stderr, "line %d: pool_create gave %d (%s)\n", line, r, kvc_strerror(r));
    TK_CHECK(r == want || (alt != 0 && r == alt));
    TK_CHECK(p == NULL);
    if (r != KVC_ERR_NO_MEMORY) TK_EQ(g_calls, 0); /* refused before asking for memory */
    /* the arena size query agrees: the same refusal, or (the allocator refused) a size at
       least as large as the largest block asked for */
    if (r == KVC_ERR_NO_MEMORY) {
        TK_OK(kvc_pool_arena_bytes(c, &bytes));
        TK_CHECK(bytes >= g_max_request);
    } else {
        TK_RES(kvc_pool_arena_bytes(c, &bytes), r);
        TK_EQ(bytes, 12345); /* untouched */
    }
    if (p) kvc_pool_destroy(p);
}

/* ---- pool geometry ------------------------------------------------------------------- */
static void test_pool_limits(void) {
    kvc_pool_config c;
    size_t bytes = 0;

    /* one row's values must fit an int32 (kvc_put, the kernels and the converters count
       values in int32): 65536 heads x 65536 dims is 2^32 values */
    config(&c, 1, 65536, 65536, 1, 1, (size_t)-1);
    refused(&c, KVC_ERR_OVERFLOW, KVC_OK, __LINE__);
    config(&c, 1, 1, INT32_MAX, 1, 1, (size_t)-1);
    refused(&c, KVC_ERR_OVERFLOW, KVC_OK, __LINE__);
    config(&c, 1, INT32_MAX, 1, INT32_MAX, 1, (size_t)-1);
    refused(&c, KVC_ERR_OVERFLOW, KVC_OK, __LINE__);
    config(&c, 1, 46341, 46341, 1, 1, (size_t)-1); /* 46341^2 > 2^31 */
    refused(&c, KVC_ERR_OVERFLOW, KVC_OK, __LINE__);

    /* huge layer counts and page sizes: the page does not fit the budget, or its bytes
       overflow, or (64-bit, budget unlimited) the allocator refuses the honest size */
    config(&c, INT32_MAX, 1, 1, 1, 256, (size_t)1 << 20);
    refused(&c, is32 ? KVC_ERR_OVERFLOW : KVC_ERR_INVALID, KVC_OK, __LINE__);
    config(&c, INT32_MAX, 1, 1, 1, 256, (size_t)-1);
    refused(&c, KVC_ERR_OVERFLOW, KVC_ERR_NO_MEMORY, __LINE__);
    config(&c, 1, 1, 1, 1, INT32_MAX, (size_t)1 << 20);
    refused(&c, KVC_ERR_INVALID, KVC_ERR_OVERFLOW, __LINE__);
    config(&c, 1, 1, 1, 1, INT32_MAX, (size_t)-1);
    refused(&c, KVC_ERR_OVERFLOW, KVC_ERR_NO_MEMORY, __LINE__);
    config(&c, INT32_MAX, INT32_MAX, 1, 1, INT32_MAX, (size_t)-1);
    refused(&c, KVC_ERR_OVERFLOW, KVC_OK, __LINE__);

    /* an unlimited budget with small pages: 2^31 cells of metadata or more */
    config(&c, 1, 1, 1, 1, 256, (size_t)-1);
    refused(&c, KVC_ERR_NO_MEMORY, KVC_ERR_OVERFLOW, __LINE__);
    if (g_calls > 0) TK_CHECK(g_max_request >= ((size_t)1 << 31)); /* honest: it needs that much */
    config(&c, 1, 1, 1, 1, 1, (size_t)-1);
    refused(&c, KVC_ERR_NO_MEMORY, KVC_ERR_OVERFLOW, __LINE__);

    /* budgets at the 2^31 / 2^32 edges: the arena size is at least the pages it holds */
    {
        size_t budgets[5];
        int i, n = 3;
        budgets[0] = ((size_t)1 << 31) - 1;
        budgets[1] = (size_t)1 << 31;
        budgets[2] = (size_t)-1 >> (is32 ? 0 : 32); /* 2^32 - 1 */
        if (!is32) { budgets[3] = (size_t)((uint64_t)1 << 32); budgets[4] = budgets[3] + 1; n = 5; }
        for (i = 0; i < n; ++i) {
            kvc_result r;
            config(&c, 2, 2, 64, 64, 256, budgets[i]); /* 512 KiB pages */
            bytes = 0;
            r = kvc_pool_arena_bytes(&c, &bytes);
            /* 32-bit: pages + metadata + objects of a 4 GiB budget do not fit a size_t */
            TK_CHECK(r == KVC_OK || (is32 && r == KVC_ERR_OVERFLOW && budgets[i] > (size_t)-1 - ((size_t)16 << 20)));
            if (r == KVC_OK) {
                TK_CHECK(bytes >= budgets[i] / ((size_t)512 << 10) * ((size_t)512 << 10));
                TK_CHECK(u64(bytes) <= u64(budgets[i]) + ((uint64_t)16 << 20));
            }
        }
    }

    /* the object part of an arena, near SIZE_MAX */
    config(&c, 1, 1, 4, 4, 16, 1 << 16);
    c.arena_object_bytes = (size_t)-1;
    TK_RES(kvc_pool_arena_bytes(&c, &bytes), KVC_ERR_OVERFLOW);
    c.arena_object_bytes = (size_t)-1 - 100;
    TK_RES(kvc_pool_arena_bytes(&c, &bytes), KVC_ERR_OVERFLOW);
    c.arena_object_bytes = (size_t)-1 / 2;
    TK_OK(kvc_pool_arena_bytes(&c, &bytes));
    TK_CHECK(bytes > (size_t)-1 / 2);

    /* negative and zero sizes */
    config(&c, INT32_MIN, 1, 1, 1, 1, 1 << 20);
    refused(&c, KVC_ERR_INVALID, KVC_OK, __LINE__);
    config(&c, 1, 1, INT32_MIN, 1, 1, 1 << 20);
    refused(&c, KVC_ERR_INVALID, KVC_OK, __LINE__);
    config(&c, 1, 1, 1, 1, INT32_MIN, 1 << 20);
    refused(&c, KVC_ERR_INVALID, KVC_OK, __LINE__);
    config(&c, 1, 1, 1, 1, 1, 0);
    refused(&c, KVC_ERR_INVALID, KVC_OK, __LINE__);
}

/* ---- a small pool for the cache-level limits -------------------------------------------- */
typedef struct world {
    kvc_pool *pool;
    float k[64 * 4], v[64 * 4];
} world;

static void world_init(world *w, int32_t page_cells, int32_t pages) {
    kvc_pool_config c;
    int i;
    /* 1 layer, 1 kv head, K and V head dim 2, f32: 16 bytes a cell */
    config(&c, 1, 1, 2, 2, page_cells, (size_t)pages * (size_t)page_cells * 16);
    w->pool = NULL;
    TK_OK(kvc_pool_create(&c, &w->pool));
    for (i = 0; i < 64 * 4; ++i) { w->k[i] = (float)(i % 7) - 3.0f; w->v[i] = (float)i; }
}
static void world_done(world *w) {
    kvc_pool_stats s;
    TK_OK(kvc_pool_stats_get(w->pool, &s));
    TK_EQ(s.pages_used, 0);
    TK_OK(kvc_pool_destroy(w->pool));
}
static int32_t pages_used(const world *w) {
    kvc_pool_stats s;
    kvc_pool_stats_get(w->pool, &s);
    return s.pages_used;
}
static int32_t offset_of(const kvc_cache *c) {
    int32_t o = -1;
    kvc_cache_offset(c, &o);
    return o;
}
/* n tokens; token t's V row is (2t, 2t+1) of w->v shifted by `salt` */
static kvc_result append(world *w, kvc_cache *c, int32_t n) {
    kvc_result r = kvc_begin(c, n, NULL, 0);
    if (r != KVC_OK) return r;
    return kvc_put(c, 0, w->k, w->v);
}
static kvc_cache *make(world *w, kvc_kind kind, int32_t window, int32_t sinks) {
    kvc_cache_config cc;
    kvc_cache *c = NULL;
    kvc_cache_config_init(&cc, kind);
    cc.window = window;
    cc.sinks = sinks;
    TK_OK(kvc_cache_create(w->pool, &cc, &c));
    return c;
}

/* ROTATING caches with windows and sinks at INT32_MAX: the sink page count must not
   overflow (sinks + page_cells - 1) */
static void test_rotating_limits(void) {
    world w;
    kvc_cache *c, *bad = NULL;
    kvc_cache_config cc;
    float gk[64 * 2], gv[64 * 2];
    int32_t pos[64], n = -1, i, ok = 1;
    world_init(&w, 4, 64);
    c = make(&w, KVC_KIND_ROTATING, INT32_MAX, INT32_MAX - 1);
    if (c != NULL) {
        TK_OK(append(&w, c, 10));
        TK_OK(append(&w, c, 3));
        TK_EQ(offset_of(c), 13);
        TK_OK(kvc_cache_gather(c, 0, gk, gv, pos, 64, &n));
        TK_EQ(n, 13); /* every token is a sink: all visible */
        for (i = 0; i < n && i < 13; ++i) {
            int32_t src = i < 10 ? i : i - 10; /* each batch wrote rows 0.. of w->v */
            ok &= pos[i] == i && gv[2 * i] == w.v[2 * src] && gv[2 * i + 1] == w.v[2 * src + 1];
        }
        TK_CHECK(ok);
        TK_OK(kvc_cache_trim(c, 13)); /* never wrapped: trim works */
        TK_EQ(offset_of(c), 0);
        TK_OK(kvc_cache_destroy(c));
    }
    c = make(&w, KVC_KIND_ROTATING, INT32_MAX, 0);
    if (c != NULL) {
        TK_OK(append(&w, c, 9));
        TK_OK(kvc_cache_gather(c, 0, NULL, NULL, NULL, 0, &n));
        TK_EQ(n, 9);
        TK_OK(kvc_cache_destroy(c));
    }
    kvc_cache_config_init(&cc, KVC_KIND_ROTATING);
    cc.window = INT32_MAX; cc.sinks = INT32_MAX;
    TK_RES(kvc_cache_create(w.pool, &cc, &bad), KVC_ERR_INVALID);
    cc.window = INT32_MIN; cc.sinks = 0;
    TK_RES(kvc_cache_create(w.pool, &cc, &bad), KVC_ERR_INVALID);
    cc.window = 5; cc.sinks = INT32_MIN;
    TK_RES(kvc_cache_create(w.pool, &cc, &bad), KVC_ERR_INVALID);
    TK_CHECK(bad == NULL);
    world_done(&w);
}

/* begin / trim / snapshot ranges at the int32 edges on FULL and ROTATING caches */
static void test_token_limits(void) {
    world w;
    kvc_cache *c, *r;
    kvc_snapshot *s = NULL, *none = NULL, *a = NULL, *b = NULL;
    int k;
    world_init(&w, 4, 16);
    c = make(&w, KVC_KIND_FULL, 0, 0);
    r = make(&w, KVC_KIND_ROTATING, 6, 2);
    TK_RES(kvc_begin(c, INT32_MAX, NULL, 0), KVC_ERR_FULL); /* offset 0: fits int32, not the pool */
    TK_RES(kvc_begin(c, INT32_MIN, NULL, 0), KVC_ERR_INVALID);
    TK_EQ(pages_used(&w), 0);
    TK_OK(append(&w, c, 10));
    TK_OK(append(&w, r, 10));
    for (k = 0; k < 2; ++k) {
        kvc_cache *x = k ? r : c;
        int32_t before = pages_used(&w);
        TK_RES(kvc_begin(x, INT32_MAX, NULL, 0), KVC_ERR_RANGE); /* offset + n > INT32_MAX */
        TK_RES(kvc_begin(x, INT32_MAX - 10, NULL, 0), KVC_ERR_FULL); /* exactly INT32_MAX: the pool refuses */
        TK_RES(kvc_begin(x, INT32_MAX - 9, NULL, 0), KVC_ERR_RANGE);
        TK_RES(kvc_cache_trim(x, INT32_MAX), k ? KVC_ERR_RANGE : KVC_ERR_RANGE);
        TK_RES(kvc_cache_trim(x, INT32_MIN), KVC_ERR_RANGE);
        TK_RES(kvc_cache_restore(x, NULL, INT32_MAX), KVC_ERR_UNREACHABLE);
        TK_RES(kvc_cache_restore(x, NULL, INT32_MIN), KVC_ERR_UNREACHABLE);
        TK_OK(kvc_snapshot_take(x, INT32_MAX, KVC_POS_END, &none));
        TK_CHECK(none == NULL);
        TK_EQ(offset_of(x), 10);
        TK_EQ(pages_used(&w), before);
    }
    /* a FULL snapshot from INT32_MIN counts from 0 */
    TK_OK(kvc_snapshot_take(c, INT32_MIN, KVC_POS_END, &s));
    TK_CHECK(s != NULL);
    if (s != NULL) {
        kvc_snapshot_info info;
        TK_OK(kvc_snapshot_info_get(s, &info));
        TK_EQ(info.from, 0);
        TK_EQ(info.to, 10);
        TK_RES(kvc_cache_restore(c, s, INT32_MAX), KVC_ERR_UNREACHABLE);
        TK_RES(kvc_cache_restore(c, s, INT32_MIN), KVC_ERR_UNREACHABLE);
        TK_OK(kvc_snapshot_split(c, s, INT32_MAX, &a, &b));
        TK_CHECK(a == s && b == NULL);
        TK_OK(kvc_snapshot_split(c, s, INT32_MIN, &a, &b));
        TK_CHECK(a == NULL && b == s);
        TK_OK(kvc_snapshot_free(s));
    }
    TK_OK(kvc_snapshot_take(r, INT32_MIN, KVC_POS_END, &s)); /* ROTATING: the whole window */
    TK_CHECK(s != NULL);
    TK_RES(kvc_cache_restore(r, s, INT32_MAX), KVC_ERR_UNREACHABLE);
    TK_OK(kvc_snapshot_free(s));
    {   /* attention with positions and windows at the edges: no wrapped arithmetic */
        kvc_attention_desc d;
        float q[4] = {1, 0, 0, 1}, out[4];
        int32_t p[2] = {INT32_MIN, INT32_MAX};
        memset(&d, 0, sizeof(d));
        d.n_queries = 2; d.n_heads = 1; d.q = q; d.pos = p; d.out = out;
        d.window = INT32_MAX;
        TK_OK(kvc_attention(c, 0, &d));
        TK_CHECK(out[0] == 0.0f && out[1] == 0.0f); /* INT32_MIN sees nothing */
        TK_OK(kvc_attention(r, 0, &d));
        d.window = 1; /* INT32_MAX with a window of 1 sees nothing held */
        TK_OK(kvc_attention(c, 0, &d));
        TK_CHECK(out[2] == 0.0f && out[3] == 0.0f);
        d.pos = NULL;
        d.n_queries = INT32_MAX;
        TK_RES(kvc_attention(c, 0, &d), KVC_ERR_RANGE);
    }
    TK_OK(kvc_cache_destroy(c));
    TK_OK(kvc_cache_destroy(r));
    world_done(&w);
}

/* CAUSAL: capacities, max_seqs, positions and mask sizes at the edges */
static void test_causal_limits(void) {
    world w;
    kvc_cache_config cc;
    kvc_cache *c = NULL, *bad = NULL;
    int32_t pos[9], seq[9], lo, hi, rows = -1, cols = -1, first = -1, i;
    float mask[16];
    kvc_batch b;
    int can = -1;
    world_init(&w, 4, 64);
    kvc_cache_config_init(&cc, KVC_KIND_CAUSAL);
    cc.capacity = INT32_MAX;
    TK_RES(kvc_cache_create(w.pool, &cc, &bad), KVC_ERR_RANGE);
    cc.capacity = INT32_MAX - 1; /* a 32-bit size_t cannot size its cells: the configuration
                                    is refused before the pool's pages are looked at */
    TK_RES(kvc_cache_create(w.pool, &cc, &bad), sizeof(size_t) < 8 ? KVC_ERR_OVERFLOW : KVC_ERR_FULL);
    cc.capacity = 8; cc.padding = INT32_MAX;
    TK_RES(kvc_cache_create(w.pool, &cc, &bad), KVC_ERR_RANGE);
    cc.padding = INT32_MIN;
    TK_RES(kvc_cache_create(w.pool, &cc, &bad), KVC_ERR_INVALID);
    cc.padding = 0; cc.max_seqs = (1 << 20) + 1;
    TK_RES(kvc_cache_create(w.pool, &cc, &bad), KVC_ERR_INVALID);
    cc.max_seqs = INT32_MAX;
    TK_RES(kvc_cache_create(w.pool, &cc, &bad), KVC_ERR_INVALID);
    cc.max_seqs = 4; cc.rope.style = KVC_ROPE_NEOX; cc.rope.theta = 10000.0f; cc.rope.n_dims = INT32_MAX;
    TK_RES(kvc_cache_create(w.pool, &cc, &bad), KVC_ERR_INVALID);
    cc.rope.n_dims = 0; cc.window = INT32_MIN;
    TK_RES(kvc_cache_create(w.pool, &cc, &bad), KVC_ERR_INVALID);
    TK_CHECK(bad == NULL);
    TK_EQ(pages_used(&w), 0);

    cc.window = INT32_MAX; cc.chunk = INT32_MAX; cc.padding = 4;
    TK_OK(kvc_cache_create(w.pool, &cc, &c));
    if (c == NULL) { world_done(&w); return; }
    /* one token at the largest position a batch may use */
    pos[0] = INT32_MAX; seq[0] = 0;
    b.n_tokens = 1; b.pos = pos; b.seq = seq; b.non_causal = NULL;
    TK_RES(kvc_begin_batch(c, &b), KVC_ERR_RANGE);
    pos[0] = INT32_MIN;
    TK_RES(kvc_begin_batch(c, &b), KVC_ERR_RANGE);
    seq[0] = INT32_MAX; pos[0] = 0;
    TK_RES(kvc_begin_batch(c, &b), KVC_ERR_RANGE);
    for (i = 0; i < 9; ++i) { pos[i] = i; seq[i] = 1; }
    b.n_tokens = 9; /* capacity 8 */
    TK_RES(kvc_begin_batch(c, &b), KVC_ERR_FULL);
    b.n_tokens = INT32_MIN;
    TK_RES(kvc_begin_batch(c, &b), KVC_ERR_INVALID);
    pos[0] = INT32_MAX - 1; seq[0] = 0;
    b.n_tokens = 1;
    TK_OK(kvc_begin_batch(c, &b));
    TK_OK(kvc_put(c, 0, w.k, w.v));
    /* 2^30 rows of 4 columns is 2^32 floats: a wrapping product would let it write */
    TK_OK(kvc_mask_export(c, 1 << 30, NULL, 0, &rows, &cols, &first));
    TK_EQ(rows, 1 << 30);
    TK_EQ(cols, 4);
    for (i = 0; i < 16; ++i) mask[i] = 7.0f;
    TK_RES(kvc_mask_export(c, 1 << 30, mask, 16, &rows, &cols, &first), KVC_ERR_RANGE);
    TK_RES(kvc_mask_export(c, INT32_MAX, mask, 16, &rows, &cols, &first), KVC_ERR_RANGE);
    TK_CHECK(mask[0] == 7.0f && mask[15] == 7.0f);
    {   /* the query at INT32_MAX - 1 sees its own cell: the output is its V */
        kvc_attention_desc d;
        float q[2] = {1, 1}, out[2];
        memset(&d, 0, sizeof(d));
        d.n_queries = 1; d.n_heads = 1; d.q = q; d.out = out;
        TK_OK(kvc_attention(c, 0, &d));
        TK_CHECK(out[0] == w.v[0] && out[1] == w.v[1]);
        d.pos = pos; d.seq = seq; d.window = INT32_MAX;
        TK_OK(kvc_attention(c, 0, &d));
        TK_CHECK(out[0] == w.v[0] && out[1] == w.v[1]);
    }
    /* the batch is complete (one layer): sequence 0 has no position after INT32_MAX - 1 */
    TK_RES(kvc_begin(c, 1, NULL, 0), KVC_ERR_RANGE);
    TK_RES(kvc_begin(c, INT32_MAX, NULL, 0), KVC_ERR_FULL);
    /* a window of INT32_MAX reaches back to position 0 or 1, which are not held */
    TK_OK(kvc_seq_can_resume(c, 0, INT32_MAX, &can));
    TK_EQ(can, 0);
    TK_OK(kvc_seq_can_resume(c, 0, INT32_MAX - 1, &can));
    TK_EQ(can, 0);
    TK_RES(kvc_seq_can_resume(c, 0, INT32_MIN, &can), KVC_ERR_RANGE);
    TK_OK(kvc_seq_pos_range(c, 0, &lo, &hi));
    TK_EQ(lo, INT32_MAX - 1);
    TK_EQ(hi, INT32_MAX - 1);
    /* shifts by 1 and by 2^31 - 3 (RoPE re-rotation by huge angles stays finite) */
    TK_OK(kvc_seq_remove(c, 0, 0, 1));
    TK_OK(kvc_seq_pos_range(c, 0, &lo, &hi));
    TK_EQ(hi, INT32_MAX - 2);
    TK_OK(kvc_seq_remove(c, 0, 0, INT32_MAX - 2));
    TK_OK(kvc_seq_pos_range(c, 0, &lo, &hi));
    TK_EQ(lo, 0);
    TK_EQ(hi, 0);
    {
        float gk[8], gv[8];
        int32_t gp[4], n = -1;
        TK_OK(kvc_cache_gather(c, 0, gk, gv, gp, 4, &n));
        TK_CHECK(n >= 1 && isfinite(gk[0]) && isfinite(gk[1]));
    }
    TK_OK(kvc_seq_remove(c, 0, INT32_MAX - 1, KVC_POS_END));
    TK_RES(kvc_seq_remove(c, 0, INT32_MIN, 0), KVC_ERR_INVALID);
    TK_RES(kvc_seq_remove(c, 0, INT32_MAX, INT32_MIN), KVC_ERR_INVALID);
    TK_RES(kvc_seq_remove(c, INT32_MAX, 0, 1), KVC_ERR_RANGE);
    TK_RES(kvc_seq_remove(c, INT32_MIN, 0, 1), KVC_ERR_RANGE);
    TK_OK(kvc_seq_copy_prefix(c, 0, 1, INT32_MAX));
    TK_RES(kvc_seq_copy_prefix(c, 0, 1, INT32_MIN), KVC_ERR_INVALID);
    TK_RES(kvc_seq_copy_prefix(c, 0, INT32_MAX, 1), KVC_ERR_RANGE);
    TK_OK(kvc_seq_pos_range(c, 1, &lo, &hi));
    TK_EQ(lo, 0);
    TK_EQ(hi, 0);
    TK_OK(kvc_cache_destroy(c));
    world_done(&w);
}

/* CAUSAL cell bookkeeping of capacity x max_seqs bits: 2^20 cells x 2^20 sequences is
   2^37 bytes of bitsets. On 32-bit hosts that product wrapped to a small block. */
static void test_causal_bytes(void) {
    kvc_pool_config c;
    kvc_pool *p = NULL;
    kvc_cache_config cc;
    kvc_cache *x = NULL;
    kvc_result r;
    config(&c, 1, 1, 1, 1, 4096, (size_t)1 << 23); /* 2^20 cells of 8 bytes */
    TK_OK(kvc_pool_create(&c, &p));
    if (p == NULL) return;
    kvc_cache_config_init(&cc, KVC_KIND_CAUSAL);
    cc.capacity = 1 << 20;
    cc.max_seqs = 1 << 20;
    lim_reset();
    r = kvc_cache_create(p, &cc, &x);
    if (is32) {
        TK_RES(r, KVC_ERR_OVERFLOW);
        TK_EQ(g_calls, 0);
    } else {
        TK_RES(r, KVC_ERR_NO_MEMORY);
        TK_CHECK(u64(g_max_request) >= (uint64_t)1 << 37); /* asked for the real size */
    }
    TK_CHECK(x == NULL);
    {
        kvc_pool_stats s;
        TK_OK(kvc_pool_stats_get(p, &s));
        TK_EQ(s.pages_used, 0);
        TK_EQ(s.live_caches, 0);
    }
    cc.max_seqs = 64; /* the same capacity with few sequences works */
    TK_OK(kvc_cache_create(p, &cc, &x));
    if (x) TK_OK(kvc_cache_destroy(x));
    TK_OK(kvc_pool_destroy(p));
}

/* kvc_prefix: token list bounds */
static void test_prefix_limits(void) {
    world w;
    kvc_cache *c;
    kvc_prefix *px = NULL;
    int32_t toks[8] = {1, 2, 3, 4, 5, 6, 7, 8}, reused = -1;
    world_init(&w, 4, 16);
    c = make(&w, KVC_KIND_FULL, 0, 0);
    TK_RES(kvc_prefix_create(&c, 1, INT32_MAX, &px), KVC_ERR_INVALID);
    TK_RES(kvc_prefix_create(&c, 1, INT32_MAX / 8 + 1, &px), KVC_ERR_INVALID);
    TK_RES(kvc_prefix_create(&c, 1, INT32_MIN, &px), KVC_ERR_INVALID);
    TK_RES(kvc_prefix_create(&c, INT32_MIN, 8, &px), KVC_ERR_INVALID);
    lim_reset();
    TK_RES(kvc_prefix_create(&c, 1, INT32_MAX / 8, &px), KVC_ERR_NO_MEMORY); /* 2 GiB of tokens */
    TK_CHECK(g_max_request >= (size_t)(INT32_MAX / 8) * 8);
    TK_CHECK(px == NULL);
    TK_OK(kvc_prefix_create(&c, 1, 8, &px));
    if (px != NULL) {
        TK_RES(kvc_prefix_begin(px, toks, INT32_MIN, &reused), KVC_ERR_INVALID);
        TK_OK(kvc_prefix_begin(px, toks, 8, &reused));
        TK_EQ(reused, 0);
        TK_OK(append(&w, c, 8));
        TK_RES(kvc_prefix_close(px, toks, INT32_MIN), KVC_ERR_INVALID);
        /* INT32_MAX generated tokens: only what the cache holds is read (8 - 8 = none) */
        TK_OK(kvc_prefix_close(px, toks, INT32_MAX));
        TK_OK(kvc_prefix_destroy(px));
    }
    TK_OK(kvc_cache_destroy(c));
    world_done(&w);
}

/* ---- page tables -------------------------------------------------------------------- */
/* A cache's page table grows with it (issue 23): an empty cache on a pool of 2^21 pages
   (page_cells 1) asked for one slot per pool page, 8 MiB; now a few hundred bytes, the
   table doubling as tokens come, and a growth the allocator refuses is KVC_ERR_NO_MEMORY
   with the cache as it was. */
static void test_page_tables(void) {
    world w;
    kvc_cache *c = NULL, *r = NULL;
    int32_t off = -1, n, i;
    kvc_pool_stats st;
    world_init(&w, 1, 1 << 21);
    if (w.pool == NULL) return;
    lim_reset();
    c = make(&w, KVC_KIND_FULL, 0, 0);
    r = make(&w, KVC_KIND_ROTATING, 40, 2);
    printf("empty cache on a pool of %d pages: largest block %lu bytes\n", 1 << 21, (unsigned long)g_max_request);
    TK_CHECK(g_max_request < 4096); /* before: 8 MiB + the struct */
    lim_reset();
    TK_OK(append(&w, c, 8)); /* the first 8 entries live in the cache's own block */
    TK_EQ(g_calls, 0);
    g_limit = 16; /* the growth to 16 entries (64 bytes) is refused */
    TK_RES(kvc_begin(c, 1, NULL, 0), KVC_ERR_NO_MEMORY);
    TK_OK(kvc_cache_offset(c, &off));
    TK_EQ(off, 8);
    TK_OK(kvc_pool_stats_get(w.pool, &st));
    TK_EQ(st.pages_used, 8);
    g_limit = LIMIT;
    lim_reset();
    for (n = 8; n < 1000; n += 64) TK_OK(append(&w, c, n + 64 <= 1000 ? 64 : 1000 - n));
    for (i = 0; i < 300; ++i) TK_OK(append(&w, r, 1)); /* a window of 40: its table stays small */
    TK_OK(kvc_cache_offset(c, &off));
    TK_EQ(off, 1000);
    TK_CHECK(g_max_request <= 2 * 1000 * 4 + 64); /* doubling: at most twice the entries held */
    {   /* the contents survived every move of the table */
        static float k[64 * 4], v[64 * 4];
        static int32_t pos[1000];
        float *kk = (float *)malloc(sizeof(float) * 2 * 1000), *vv = (float *)malloc(sizeof(float) * 2 * 1000);
        TK_OK(kvc_cache_gather(c, 0, kk, vv, pos, 1000, &n));
        TK_EQ(n, 1000);
        for (i = 0; i < n; ++i) TK_EQ(pos[i], i);
        (void)k; (void)v;
        free(kk);
        free(vv);
    }
    TK_OK(kvc_cache_destroy(c));
    TK_OK(kvc_cache_destroy(r));
    world_done(&w);
}

/* ---- attention plans ------------------------------------------------------------------ */
/* Query and head counts near 2^31 in the attention plan's size sums: a clean
   KVC_ERR_OVERFLOW (never a wrapped size, no signed overflow under UBSan), and an honest
   huge size where it fits. The positions and queries are never read by the size query. */
static void test_attention_limits(void) {
    world w;
    kvc_cache *c;
    kvc_attention_desc d;
    int32_t pos[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    size_t bytes;
    world_init(&w, 4, 16);
    c = make(&w, KVC_KIND_FULL, 0, 0);
    TK_OK(append(&w, c, 8));
    memset(&d, 0, sizeof(d));
    d.pos = pos;
    d.n_queries = INT32_MAX; /* explicit positions: any count is a valid call shape */
    d.n_heads = 2;           /* but the rows of q and out (queries x heads) must fit an int32 */
    bytes = 12345;
    TK_RES(kvc_attention_scratch_bytes(c, &d, &bytes), KVC_ERR_OVERFLOW);
    TK_EQ(bytes, 12345);
    d.n_queries = INT32_MAX - 15;
    TK_RES(kvc_attention_scratch_bytes(c, &d, &bytes), KVC_ERR_OVERFLOW);
    d.n_heads = 1; /* INT32_MAX rows: an honest size (16 GiB of softmax state alone), or OVERFLOW on 32 bits */
    d.n_queries = INT32_MAX;
    if (is32) {
        TK_RES(kvc_attention_scratch_bytes(c, &d, &bytes), KVC_ERR_OVERFLOW);
    } else {
        TK_OK(kvc_attention_scratch_bytes(c, &d, &bytes));
        TK_CHECK(u64(bytes) >= ((uint64_t)INT32_MAX + 1) * 8);
    }
    d.n_queries = 1;
    d.n_heads = INT32_MAX;
    TK_RES(kvc_attention_scratch_bytes(c, &d, &bytes), KVC_ERR_OVERFLOW);
    d.n_queries = 8;
    d.n_heads = 1 << 28;
    TK_RES(kvc_attention_scratch_bytes(c, &d, &bytes), KVC_ERR_OVERFLOW);
    d.n_queries = 17;
    d.n_heads = 1 << 27;
    TK_RES(kvc_attention_scratch_bytes(c, &d, &bytes), KVC_ERR_OVERFLOW);
    /* kvc_attention refuses the same shapes before it reads q or out */
    d.q = w.k;
    d.out = w.v;
    TK_RES(kvc_attention(c, 0, &d), KVC_ERR_OVERFLOW);
    d.n_queries = 1;
    d.n_heads = 1 << 24; /* large but representable: a real size, more than 2^24 rows of floats */
    if (is32) { /* 2^24 rows of 32 scores alone are 2 GiB: more than a 32-bit size may hold with the rest */
        kvc_result r = kvc_attention_scratch_bytes(c, &d, &bytes);
        TK_CHECK(r == KVC_OK || r == KVC_ERR_OVERFLOW);
    } else {
        TK_OK(kvc_attention_scratch_bytes(c, &d, &bytes));
        TK_CHECK(u64(bytes) >= ((uint64_t)1 << 24) * 32 * 4);
    }
    TK_OK(kvc_cache_destroy(c));
    world_done(&w);
}

int main(void) {
    printf("size_t: %d bits\n", (int)(8 * sizeof(size_t)));
    test_pool_limits();
    test_rotating_limits();
    test_token_limits();
    test_causal_limits();
    test_causal_bytes();
    test_prefix_limits();
    test_attention_limits();
    test_page_tables();
    TK_EQ(g_live, 0); /* every block given back */
    return tk_report("limits");
}
