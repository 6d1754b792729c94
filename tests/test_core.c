/* test_core.c - unit tests of the foundation: pool, full and rotating caches,
   snapshots, prefix reuse, views and the scalar attention, with exact expected
   contents. Every value written encodes (layer, head, position, dim, K or V) so
   every read can be checked. */
#include <stdlib.h>
#include <time.h>

#include "count_alloc.h"
#define KVCACHE_IMPLEMENTATION
#include "../kvcache.h"
#include "tk.h"

/* ---- helpers ------------------------------------------------------------------- */

/* a free without its alloc: the allocator a config must refuse */
static void free_only(void *ptr, void *user) { (void)user; tk_count_free(ptr); }

/* exactly representable in f16: integers in [-1024, 1023] */
static float enc(int kv, int layer, int head, int pos, int dim, int salt) {
    return (float)((kv * 523 + layer * 131 + head * 37 + pos * 7 + dim * 3 + salt * 1009) % 2048 - 1024);
}

typedef struct fixture {
    kvc_pool_config cfg;
    kvc_pool *pool;
    int salt;     /* goes into the values of the next append */
    float *k, *v; /* scratch for one batch */
} fixture;

static void fx_config(kvc_pool_config *cfg, int layers, int heads, int hk, int hv, int page_cells, int pages) {
    kvc_pool_config_init(cfg);
    cfg->n_layers = layers;
    cfg->n_kv_heads = heads;
    cfg->head_dim_k = hk;
    cfg->head_dim_v = hv;
    cfg->page_cells = page_cells;
    /* exactly `pages` pages of f32 K and V (the default types) */
    TK_OK(kvc_pool_budget_for_tokens(cfg, pages * page_cells, &cfg->budget_bytes));
}

static void fx_init(fixture *f, kvc_type tk, kvc_type tv, int page_cells, int pages) {
    fx_config(&f->cfg, 2, 2, 4, 3, page_cells, pages);
    f->cfg.type_k = tk;
    f->cfg.type_v = tv;
    TK_OK(kvc_pool_budget_for_tokens(&f->cfg, pages * page_cells, &f->cfg.budget_bytes)); /* exactly `pages` pages */
    f->pool = NULL;
    f->salt = 0;
    TK_OK(kvc_pool_create(&f->cfg, &f->pool));
    f->k = (float *)malloc(sizeof(float) * 4096);
    f->v = (float *)malloc(sizeof(float) * 4096);
}

static void fx_done(fixture *f) {
    kvc_pool_stats s;
    TK_OK(kvc_pool_stats_get(f->pool, &s));
    TK_EQ(s.pages_used, 0);
    TK_OK(kvc_pool_destroy(f->pool));
    free(f->k);
    free(f->v);
}

/* append tokens [offset, offset+n) with encoded values, every layer */
static kvc_result append(fixture *f, kvc_cache *c, int n) {
    int32_t off = 0, l, t, h, d;
    kvc_result r;
    kvc_cache_offset(c, &off);
    r = kvc_begin(c, n, NULL, 0);
    if (r != KVC_OK) return r;
    for (l = 0; l < f->cfg.n_layers; ++l) {
        for (t = 0; t < n; ++t)
            for (h = 0; h < f->cfg.n_kv_heads; ++h) {
                for (d = 0; d < f->cfg.head_dim_k; ++d)
                    f->k[(t * f->cfg.n_kv_heads + h) * f->cfg.head_dim_k + d] = enc(0, l, h, off + t, d, f->salt);
                for (d = 0; d < f->cfg.head_dim_v; ++d)
                    f->v[(t * f->cfg.n_kv_heads + h) * f->cfg.head_dim_v + d] = enc(1, l, h, off + t, d, f->salt);
            }
        r = kvc_put(c, l, f->k, f->v);
        if (r != KVC_OK) return r;
    }
    return KVC_OK;
}

/* the cache's visible cells must be exactly `positions`, each with its encoded K/V
   written with salts[i] (NULL: all 0) */
static int view_is(fixture *f, const kvc_cache *c, const int32_t *positions, const int *salts, int n) {
    static float k[4096], v[4096];
    int32_t pos[512], got = -1, l, i, h, d, ok = 1;
    for (l = 0; l < f->cfg.n_layers; ++l) {
        if (kvc_cache_gather(c, l, k, v, pos, 512, &got) != KVC_OK || got != n) return 0;
        for (i = 0; i < n; ++i) {
            if (pos[i] != positions[i]) ok = 0;
            for (h = 0; h < f->cfg.n_kv_heads; ++h) {
                for (d = 0; d < f->cfg.head_dim_k; ++d)
                    if (k[(i * f->cfg.n_kv_heads + h) * f->cfg.head_dim_k + d] != enc(0, l, h, positions[i], d, salts ? salts[i] : 0)) ok = 0;
                for (d = 0; d < f->cfg.head_dim_v; ++d)
                    if (v[(i * f->cfg.n_kv_heads + h) * f->cfg.head_dim_v + d] != enc(1, l, h, positions[i], d, salts ? salts[i] : 0)) ok = 0;
            }
        }
    }
    return ok;
}

/* view == [a, b) (plus [0, s) first when s > 0) */
static int view_range(fixture *f, const kvc_cache *c, int s, int a, int b) {
    int32_t p[512], n = 0, i;
    for (i = 0; i < s; ++i) p[n++] = i;
    for (i = a; i < b; ++i) p[n++] = i;
    return view_is(f, c, p, NULL, n);
}

static int32_t pages_used(fixture *f) {
    kvc_pool_stats s;
    kvc_pool_stats_get(f->pool, &s);
    return s.pages_used;
}

static int32_t offset_of(const kvc_cache *c) {
    int32_t o = -1;
    kvc_cache_offset(c, &o);
    return o;
}

static kvc_cache *make_cache(fixture *f, kvc_kind kind, int window, int sinks) {
    kvc_cache_config cc;
    kvc_cache *c = NULL;
    kvc_cache_config_init(&cc, kind);
    cc.window = window;
    cc.sinks = sinks;
    TK_OK(kvc_cache_create(f->pool, &cc, &c));
    return c;
}

/* view [0, a) with salt sa, then [a, b) with salt sb */
static int view_salted(fixture *f, const kvc_cache *c, int a, int sa, int b, int sb) {
    int32_t p[512];
    int salts[512], i;
    for (i = 0; i < b; ++i) { p[i] = i; salts[i] = i < a ? sa : sb; }
    return view_is(f, c, p, salts, b);
}

/* ---- results, types, configuration ---------------------------------------------- */

static void test_results(void) {
    TK_CHECK(strcmp(kvc_strerror(KVC_OK), "ok") == 0);
    TK_CHECK(strcmp(kvc_strerror(KVC_ERR_FULL), "page budget exhausted") == 0);
    TK_CHECK(strcmp(kvc_strerror((kvc_result)-999), "unknown kvc_result") == 0);
    {   /* KVC_RESULT_MIN_ comes from the list: every value from it to 0 is a code, the
           one below is not */
        int a;
        for (a = KVC_RESULT_MIN_; a <= 0; ++a)
            TK_CHECK(strcmp(kvc_strerror((kvc_result)a), "unknown kvc_result") != 0);
        TK_CHECK(strcmp(kvc_strerror((kvc_result)(KVC_RESULT_MIN_ - 1)), "unknown kvc_result") == 0);
        TK_EQ(KVC_RESULT_MIN_, KVC_ERR_OWNED); /* the last entry of the list */
        TK_CHECK(strcmp(kvc_strerror(KVC_ERR_POSITION), "the engine's position is not the cache's offset") == 0);
    }
    {   /* every code has its own text */
        int a, b;
        for (a = KVC_RESULT_MIN_; a <= 0; ++a)
            for (b = a + 1; b <= 0; ++b) TK_CHECK(strcmp(kvc_strerror((kvc_result)a), kvc_strerror((kvc_result)b)) != 0);
    }
    TK_CHECK(strcmp(kvc_type_name(KVC_TYPE_F32), "f32") == 0);
    TK_CHECK(strcmp(kvc_type_name(KVC_TYPE_F16), "f16") == 0);
    TK_CHECK(strcmp(kvc_type_name(KVC_TYPE_BF16), "bf16") == 0);
    TK_CHECK(strcmp(kvc_type_name(KVC_TYPE_Q8_0), "q8_0") == 0);
    TK_CHECK(strcmp(kvc_type_name(KVC_TYPE_Q4_0), "q4_0") == 0);
    TK_CHECK(strcmp(kvc_type_name((kvc_type)99), "?") == 0);
}

static void test_pool_config(void) {
    kvc_pool_config cfg, bad;
    kvc_pool *p = NULL;
    size_t bytes = 0;
    static unsigned char arena[1 << 20];
    fx_config(&cfg, 2, 2, 4, 4, 4, 4);
    TK_RES(kvc_pool_config_init(NULL), KVC_ERR_NULL);
    TK_RES(kvc_pool_create(NULL, &p), KVC_ERR_NULL);
    TK_RES(kvc_pool_create(&cfg, NULL), KVC_ERR_NULL);
    bad = cfg; bad.n_layers = 0; TK_RES(kvc_pool_create(&bad, &p), KVC_ERR_INVALID);
    bad = cfg; bad.n_kv_heads = -1; TK_RES(kvc_pool_create(&bad, &p), KVC_ERR_INVALID);
    bad = cfg; bad.head_dim_v = 0; TK_RES(kvc_pool_create(&bad, &p), KVC_ERR_INVALID);
    bad = cfg; bad.type_k = (kvc_type)42; TK_RES(kvc_pool_create(&bad, &p), KVC_ERR_INVALID);
    bad = cfg; bad.page_cells = -3; TK_RES(kvc_pool_create(&bad, &p), KVC_ERR_INVALID);
    bad = cfg; bad.budget_bytes = 10; TK_RES(kvc_pool_create(&bad, &p), KVC_ERR_INVALID);
    bad = cfg; bad.runtime.allocator.free = free_only; TK_RES(kvc_pool_create(&bad, &p), KVC_ERR_INVALID);
    bad = cfg; bad.arena_bytes = 100; TK_RES(kvc_pool_create(&bad, &p), KVC_ERR_INVALID);
    bad = cfg; bad.n_kv_heads = INT32_MAX; bad.head_dim_k = INT32_MAX; bad.head_dim_v = INT32_MAX;
    TK_RES(kvc_pool_create(&bad, &p), KVC_ERR_OVERFLOW);
    TK_CHECK(p == NULL);
    TK_RES(kvc_pool_arena_bytes(&cfg, NULL), KVC_ERR_NULL);
    TK_OK(kvc_pool_arena_bytes(&cfg, &bytes));
    TK_CHECK(bytes > 4 * 4 * 2 * 2 * 8 * 4 && bytes < sizeof(arena));
    bad = cfg; bad.arena = arena; bad.arena_bytes = bytes - 1;
    TK_RES(kvc_pool_create(&bad, &p), KVC_ERR_ARENA_TOO_SMALL);
    TK_CHECK(p == NULL);
    /* a budget that is not a whole number of pages rounds down */
    cfg.budget_bytes += 100;
    TK_OK(kvc_pool_create(&cfg, &p));
    {
        kvc_pool_stats s;
        TK_OK(kvc_pool_stats_get(p, &s));
        TK_EQ(s.pages_total, 4);
        TK_EQ(s.page_cells, 4);
        TK_EQ(s.k_row_bytes, 2 * 4 * 4);
        TK_EQ(s.page_bytes, 4 * 2 * (32 + 32));
        TK_EQ(s.pages_used, 0);
    }
    TK_OK(kvc_pool_destroy(p));
    TK_RES(kvc_pool_destroy(NULL), KVC_ERR_NULL);
}

/* kvc_pool_page_bytes and kvc_pool_budget_for_tokens: the budget they give holds exactly
   the tokens asked for in whole pages, in the storage types configured. */
static void test_budget_for_tokens(void) {
    static const kvc_type types[3][2] = {{KVC_TYPE_F32, KVC_TYPE_F32}, {KVC_TYPE_F16, KVC_TYPE_Q8_0},
                                         {KVC_TYPE_Q4_0, KVC_TYPE_BF16}};
    static const int32_t tokens[4] = {1, 16, 17, 40};
    kvc_pool_config cfg, bad;
    size_t pb = 0, b = 0, f32_page = 0;
    int t, i;
    fx_config(&cfg, 2, 2, 4, 4, 4, 4);
    TK_RES(kvc_pool_page_bytes(NULL, &pb), KVC_ERR_NULL);
    TK_RES(kvc_pool_page_bytes(&cfg, NULL), KVC_ERR_NULL);
    TK_RES(kvc_pool_budget_for_tokens(NULL, 1, &b), KVC_ERR_NULL);
    TK_RES(kvc_pool_budget_for_tokens(&cfg, 1, NULL), KVC_ERR_NULL);
    TK_RES(kvc_pool_budget_for_tokens(&cfg, -1, &b), KVC_ERR_RANGE);
    TK_OK(kvc_pool_page_bytes(&cfg, &pb));
    TK_EQ(pb, 4 * 2 * (2 * 4 * 4 + 2 * 4 * 4));
    cfg.budget_bytes = 0; /* not needed to size a page */
    pb = 0;
    TK_OK(kvc_pool_page_bytes(&cfg, &pb));
    TK_EQ(pb, 512);
    TK_OK(kvc_pool_budget_for_tokens(&cfg, 0, &b));
    TK_EQ(b, 512); /* a pool holds at least one page */
    TK_OK(kvc_pool_budget_for_tokens(&cfg, 4, &b));
    TK_EQ(b, 512);
    TK_OK(kvc_pool_budget_for_tokens(&cfg, 5, &b));
    TK_EQ(b, 1024);
    bad = cfg; bad.head_dim_v = 0; TK_RES(kvc_pool_page_bytes(&bad, &pb), KVC_ERR_INVALID);
    bad = cfg; bad.type_k = KVC_TYPE_Q8_0; TK_RES(kvc_pool_budget_for_tokens(&bad, 1, &b), KVC_ERR_INVALID);
    bad = cfg; bad.n_kv_heads = INT32_MAX; bad.head_dim_k = INT32_MAX; bad.head_dim_v = INT32_MAX;
    TK_RES(kvc_pool_page_bytes(&bad, &pb), KVC_ERR_OVERFLOW);
    TK_EQ(pb, 512); /* unchanged on error */
    /* more pages than int32 cell indices reach, or more bytes than a size_t holds */
    bad = cfg; bad.page_cells = 256;
    TK_RES(kvc_pool_budget_for_tokens(&bad, INT32_MAX, &b), KVC_ERR_OVERFLOW);
    bad.n_layers = INT32_MAX; bad.n_kv_heads = 1024; bad.head_dim_k = 1024; bad.head_dim_v = 1024;
    TK_RES(kvc_pool_budget_for_tokens(&bad, 1 << 30, &b), KVC_ERR_OVERFLOW);
    TK_EQ(b, 1024);
    for (t = 0; t < 3; ++t) {
        for (i = 0; i < 4; ++i) {
            fixture f;
            kvc_pool_stats s;
            kvc_cache *c;
            int32_t pages = (tokens[i] + 15) / 16;
            fx_config(&f.cfg, 2, 2, 32, 32, 16, 1);
            f.cfg.type_k = types[t][0];
            f.cfg.type_v = types[t][1];
            TK_OK(kvc_pool_page_bytes(&f.cfg, &pb));
            if (t == 0) f32_page = pb;
            else TK_CHECK(pb < f32_page); /* the saving of the smaller types is kept */
            TK_OK(kvc_pool_budget_for_tokens(&f.cfg, tokens[i], &f.cfg.budget_bytes));
            TK_EQ(f.cfg.budget_bytes, (size_t)pages * pb);
            f.pool = NULL;
            f.salt = 0;
            f.k = (float *)malloc(sizeof(float) * 4096);
            f.v = (float *)malloc(sizeof(float) * 4096);
            TK_OK(kvc_pool_create(&f.cfg, &f.pool));
            TK_OK(kvc_pool_stats_get(f.pool, &s));
            TK_EQ(s.page_bytes, pb);
            TK_EQ(s.pages_total, pages);
            c = make_cache(&f, KVC_KIND_FULL, 0, 0);
            TK_OK(append(&f, c, tokens[i]));
            TK_EQ(offset_of(c), tokens[i]);
            /* whole pages: the rest of the last page fits, not one token more */
            if (pages * 16 > tokens[i]) TK_OK(append(&f, c, pages * 16 - tokens[i]));
            TK_RES(kvc_begin(c, 1, NULL, 0), KVC_ERR_FULL);
            TK_OK(kvc_cache_destroy(c));
            fx_done(&f);
            /* one byte less holds one page less */
            f.cfg.budget_bytes -= 1;
            if (pages == 1) {
                kvc_pool *p = NULL;
                TK_RES(kvc_pool_create(&f.cfg, &p), KVC_ERR_INVALID);
            } else {
                f.pool = NULL;
                TK_OK(kvc_pool_create(&f.cfg, &f.pool));
                TK_OK(kvc_pool_stats_get(f.pool, &s));
                TK_EQ(s.pages_total, pages - 1);
                TK_OK(kvc_pool_destroy(f.pool));
            }
        }
    }
}

static kvc_result causal_tokens(fixture *f, kvc_cache *x, int32_t seq, int32_t pos0, int32_t n);

static void serial_for(void *user, int32_t n_tasks, kvc_task_fn fn, void *ctx) {
    int32_t i;
    (void)user;
    for (i = 0; i < n_tasks; ++i) fn(ctx, i, 0);
}

/* kvc_pool_config_check names the field kvc_pool_create refuses, with its result. */
static void test_pool_config_check(void) {
    static unsigned char arena[1 << 20];
    kvc_pool_config cfg, bad;
    kvc_pool *p = NULL;
    const char *field = "not touched";
    int i;
    fx_config(&cfg, 2, 2, 32, 32, 4, 4);
    TK_RES(kvc_pool_config_check(NULL, &field), KVC_ERR_NULL);
    TK_CHECK(field == NULL);
    field = "not touched";
    TK_OK(kvc_pool_config_check(&cfg, &field));
    TK_CHECK(field == NULL);
    TK_OK(kvc_pool_config_check(&cfg, NULL)); /* field may be NULL */
    for (i = 0; i < 20; ++i) {
        const char *want = NULL;
        kvc_result res = KVC_ERR_INVALID;
        bad = cfg;
        switch (i) {
        case 0: bad.n_layers = 0; want = "n_layers"; break;
        case 1: bad.n_kv_heads = -1; want = "n_kv_heads"; break;
        case 2: bad.head_dim_k = 0; want = "head_dim_k"; break;
        case 3: bad.head_dim_v = -5; want = "head_dim_v"; break;
        case 4: bad.page_cells = -3; want = "page_cells"; break;
        case 5: bad.type_k = (kvc_type)42; want = "type_k"; break;
        case 6: bad.type_v = KVC_TYPE_COUNT; want = "type_v"; break;
        case 7: bad.type_k = KVC_TYPE_Q8_0; bad.head_dim_k = 48; want = "head_dim_k"; break;
        case 8: bad.type_v = KVC_TYPE_Q4_0; bad.head_dim_v = 48; want = "head_dim_v"; break;
        case 9: bad.budget_bytes = 10; want = "budget_bytes"; break;
        case 10: bad.budget_bytes = 0; want = "budget_bytes"; break;
        case 11: bad.runtime.allocator.free = free_only; want = "runtime.allocator"; break;
        case 12: bad.arena_bytes = 100; want = "arena_bytes"; break;
        case 13: bad.runtime.parallel_for = serial_for; bad.runtime.n_workers = 0; want = "runtime.n_workers"; break;
        case 14:
            bad.n_kv_heads = INT32_MAX; bad.head_dim_k = INT32_MAX; bad.head_dim_v = INT32_MAX;
            res = KVC_ERR_OVERFLOW; want = "n_kv_heads"; break;
        case 15: bad.arena = arena; bad.arena_bytes = 64; res = KVC_ERR_ARENA_TOO_SMALL; want = "arena_bytes"; break;
        case 16: /* the first refused field in the order of the checks */
            bad.n_layers = 0; bad.budget_bytes = 0; want = "n_layers"; break;
        case 17: /* valid ones: the field stays NULL */
            bad.type_k = KVC_TYPE_Q8_0; bad.type_v = KVC_TYPE_Q4_0;
            TK_OK(kvc_pool_budget_for_tokens(&bad, 1, &bad.budget_bytes));
            res = KVC_OK; break;
        case 18: bad.runtime.parallel_for = serial_for; bad.runtime.n_workers = 1; res = KVC_OK; break;
        default: bad.arena = arena; bad.arena_bytes = sizeof(arena); res = KVC_OK; break;
        }
        field = "not touched";
        TK_RES(kvc_pool_config_check(&bad, &field), res);
        if (want == NULL) TK_CHECK(field == NULL);
        else TK_CHECK(field != NULL && strcmp(field, want) == 0);
        if (field != NULL && want != NULL && strcmp(field, want) != 0)
            fprintf(stderr, "case %d: field %s, wanted %s\n", i, field, want);
        /* kvc_pool_create returns the same */
        p = NULL;
        TK_RES(kvc_pool_create(&bad, &p), res);
        TK_CHECK((p != NULL) == (res == KVC_OK));
        if (p) TK_OK(kvc_pool_destroy(p));
    }
}

/* kvc_cache_config_check names the field kvc_cache_create refuses, with its result. */
static void test_cache_config_check(void) {
    fixture f;
    kvc_cache_config cc, bad;
    kvc_cache *c;
    const char *field = "not touched";
    int i;
    fx_init(&f, KVC_TYPE_F32, KVC_TYPE_F32, 4, 8); /* 32 cells, head_dim_k 4 */
    kvc_cache_config_init(&cc, KVC_KIND_CAUSAL);
    cc.capacity = 16;
    TK_RES(kvc_cache_config_check(NULL, &cc, &field), KVC_ERR_NULL);
    TK_CHECK(field == NULL);
    TK_RES(kvc_cache_config_check(f.pool, NULL, NULL), KVC_ERR_NULL);
    for (i = 0; i < 22; ++i) {
        const char *want = NULL;
        kvc_result res = KVC_ERR_INVALID;
        bad = cc;
        switch (i) {
        case 0: kvc_cache_config_init(&bad, KVC_KIND_FULL); bad.window = 3; want = "window"; break;
        case 1: kvc_cache_config_init(&bad, KVC_KIND_FULL); bad.sinks = 1; want = "sinks"; break;
        case 2: kvc_cache_config_init(&bad, KVC_KIND_ROTATING); want = "window"; break;
        case 3: kvc_cache_config_init(&bad, KVC_KIND_ROTATING); bad.window = 4; bad.sinks = 4; want = "sinks"; break;
        case 4: kvc_cache_config_init(&bad, KVC_KIND_ROTATING); bad.window = 4; bad.sinks = -1; want = "sinks"; break;
        case 5: bad.kind = (kvc_kind)7; want = "kind"; break;
        case 6: bad.capacity = 0; want = "capacity"; break;
        case 7: bad.padding = -1; want = "padding"; break;
        case 8: bad.max_seqs = -1; want = "max_seqs"; break;
        case 9: bad.chunk = -1; want = "chunk"; break;
        case 10: bad.window = -1; want = "window"; break;
        case 11: bad.capacity = INT32_MAX; res = KVC_ERR_RANGE; want = "capacity"; break;
        case 12: bad.rope.style = (kvc_rope_style)9; want = "rope.style"; break;
        case 13: bad.rope.style = KVC_ROPE_NEOX; want = "rope.theta"; break;
        case 14: bad.rope.style = KVC_ROPE_NEOX; bad.rope.theta = 10000; bad.rope.n_dims = 3; want = "rope.n_dims"; break;
        case 15: bad.rope.style = KVC_ROPE_NEOX; bad.rope.theta = 10000; bad.rope.n_dims = 8; want = "rope.n_dims"; break;
        case 16: bad.sinks = 1; want = "sinks"; break;
        case 17: bad.capacity = 64; res = KVC_ERR_FULL; want = "capacity"; break; /* 32 cells in the pool */
        case 18: res = KVC_OK; break;
        case 19: kvc_cache_config_init(&bad, KVC_KIND_FULL); res = KVC_OK; break;
        case 20: kvc_cache_config_init(&bad, KVC_KIND_ROTATING); bad.window = 4; bad.sinks = 3; res = KVC_OK; break;
        default: bad.rope.style = KVC_ROPE_NEOX; bad.rope.theta = 10000; bad.rope.n_dims = 4; res = KVC_OK; break;
        }
        field = "not touched";
        TK_RES(kvc_cache_config_check(f.pool, &bad, &field), res);
        if (want == NULL) TK_CHECK(field == NULL);
        else TK_CHECK(field != NULL && strcmp(field, want) == 0);
        if (field != NULL && want != NULL && strcmp(field, want) != 0)
            fprintf(stderr, "case %d: field %s, wanted %s\n", i, field, want);
        c = NULL;
        TK_RES(kvc_cache_create(f.pool, &bad, &c), res);
        TK_CHECK((c != NULL) == (res == KVC_OK));
        if (c) TK_OK(kvc_cache_destroy(c));
        TK_EQ(pages_used(&f), 0);
    }
    fx_done(&f);
}

/* kvc_begin_at: the engine's position must be the cache's offset (CAUSAL: sequence 0's
   next position); otherwise KVC_ERR_POSITION and nothing changes. */
static void test_begin_at(void) {
    fixture f;
    kvc_cache *c, *r, *x;
    kvc_cache_config cc;
    fx_init(&f, KVC_TYPE_F32, KVC_TYPE_F32, 4, 16);
    c = make_cache(&f, KVC_KIND_FULL, 0, 0);
    TK_RES(kvc_begin_at(NULL, 0, 1), KVC_ERR_NULL);
    TK_RES(kvc_begin_at(c, 0, 0), KVC_ERR_INVALID);
    TK_RES(kvc_begin_at(c, 1, 1), KVC_ERR_POSITION);
    TK_RES(kvc_begin_at(c, -1, 1), KVC_ERR_POSITION);
    TK_EQ(offset_of(c), 0);
    TK_EQ(pages_used(&f), 0);
    TK_OK(kvc_begin_at(c, 0, 3));
    TK_EQ(offset_of(c), 3);
    TK_RES(kvc_begin_at(c, 3, 1), KVC_ERR_STATE); /* a batch is open */
    TK_OK(kvc_cancel(c));
    TK_OK(append(&f, c, 5));
    TK_RES(kvc_begin_at(c, 4, 1), KVC_ERR_POSITION); /* the engine lost a token */
    TK_RES(kvc_begin_at(c, 6, 1), KVC_ERR_POSITION); /* or counted one twice */
    TK_EQ(offset_of(c), 5);
    TK_EQ(pages_used(&f), 2);
    TK_CHECK(view_range(&f, c, 0, 0, 5));
    TK_OK(kvc_begin_at(c, 5, 4));
    TK_EQ(offset_of(c), 9);
    TK_OK(kvc_cancel(c));
    TK_OK(kvc_cache_destroy(c));
    /* ROTATING: the offset counts every token, evicted ones too */
    r = make_cache(&f, KVC_KIND_ROTATING, 4, 0);
    TK_OK(append(&f, r, 10));
    TK_RES(kvc_begin_at(r, 4, 1), KVC_ERR_POSITION);
    TK_OK(kvc_begin_at(r, 10, 1));
    TK_EQ(offset_of(r), 11);
    TK_OK(kvc_cancel(r));
    TK_OK(kvc_cache_destroy(r));
    /* CAUSAL: sequence 0's next position, whatever other sequences hold */
    kvc_cache_config_init(&cc, KVC_KIND_CAUSAL);
    cc.capacity = 32;
    x = NULL;
    TK_OK(kvc_cache_create(f.pool, &cc, &x));
    TK_RES(kvc_begin_at(x, 1, 1), KVC_ERR_POSITION);
    TK_OK(causal_tokens(&f, x, 1, 0, 8));
    TK_OK(causal_tokens(&f, x, 0, 0, 5));
    TK_RES(kvc_begin_at(x, 8, 1), KVC_ERR_POSITION);
    TK_RES(kvc_begin_at(x, 4, 1), KVC_ERR_POSITION);
    TK_EQ(offset_of(x), 13); /* cells in use: unchanged */
    TK_OK(kvc_begin_at(x, 5, 2));
    TK_EQ(offset_of(x), 15);
    TK_OK(kvc_cancel(x));
    TK_EQ(offset_of(x), 13);
    TK_OK(kvc_cache_destroy(x));
    fx_done(&f);
}

/* Arena mode: create, use and tear down everything without one allocator call. */
static void test_arena(void) {
    fixture f;
    size_t bytes;
    void *arena;
    kvc_cache *c, *r, *fork;
    kvc_snapshot *s1, *s2, *m;
    kvc_prefix *px;
    int32_t toks[20], reused, i;
    long allocs;
    fx_config(&f.cfg, 2, 2, 4, 3, 4, 16);
    f.k = (float *)malloc(sizeof(float) * 4096);
    f.v = (float *)malloc(sizeof(float) * 4096);
    f.salt = 0;
    TK_OK(kvc_pool_arena_bytes(&f.cfg, &bytes));
    arena = malloc(bytes);
    f.cfg.arena = arena;
    f.cfg.arena_bytes = bytes;
    allocs = tk_allocs;
    TK_OK(kvc_pool_create(&f.cfg, &f.pool));
    c = make_cache(&f, KVC_KIND_FULL, 0, 0);
    r = make_cache(&f, KVC_KIND_ROTATING, 5, 1);
    TK_OK(append(&f, c, 7));
    TK_OK(append(&f, r, 9));
    TK_OK(kvc_snapshot_take(c, 0, KVC_POS_END, &s1));
    TK_OK(append(&f, c, 6));
    TK_OK(kvc_snapshot_take(c, 7, KVC_POS_END, &s2));
    TK_OK(kvc_snapshot_merge(c, s1, s2, &m));
    TK_OK(kvc_cache_fork(c, &fork));
    for (i = 0; i < 20; ++i) toks[i] = 100 + i;
    TK_OK(kvc_prefix_create(&c, 1, 64, &px));
    TK_OK(kvc_prefix_begin(px, toks, 13, &reused));
    TK_OK(kvc_prefix_close(px, toks + 13, 2));
    {   /* a CAUSAL cache: batches, sequence operations, per-sequence snapshots */
        kvc_cache_config cc;
        kvc_cache *x = NULL;
        kvc_snapshot *sx = NULL;
        int32_t moves = -1;
        kvc_cache_config_init(&cc, KVC_KIND_CAUSAL);
        cc.capacity = 8; cc.max_seqs = 4; cc.rope.style = KVC_ROPE_NEOX; cc.rope.theta = 10000.0f;
        TK_OK(kvc_cache_create(f.pool, &cc, &x));
        TK_OK(causal_tokens(&f, x, 0, 0, 3));
        TK_OK(causal_tokens(&f, x, 1, 0, 2));
        TK_OK(kvc_seq_copy_prefix(x, 0, 2, 2));
        TK_OK(kvc_seq_snapshot(x, 1, &sx));
        TK_OK(kvc_seq_remove(x, 1, 0, 1)); /* its later cell moves back, re-rotated */
        TK_OK(kvc_seq_restore(x, sx, 3));
        TK_OK(kvc_cache_defrag(x, &moves));
        TK_OK(kvc_snapshot_free(sx));
        TK_OK(kvc_cache_destroy(x));
    }
    TK_EQ(tk_allocs, allocs); /* nothing from the allocator after create */
    TK_CHECK(view_range(&f, fork, 0, 0, 13));
    TK_OK(kvc_prefix_destroy(px));
    TK_OK(kvc_snapshot_free(m));
    TK_OK(kvc_cache_destroy(fork));
    TK_OK(kvc_cache_destroy(c));
    TK_OK(kvc_cache_destroy(r));
    TK_EQ(tk_allocs, allocs);
    fx_done(&f);
    free(arena);
}

/* ---- full cache ------------------------------------------------------------------ */

static void test_full_basic(void) {
    fixture f;
    kvc_cache *c;
    kvc_run runs[8];
    int32_t n = -1, cells = -1;
    const void *first_k;
    fx_init(&f, KVC_TYPE_F32, KVC_TYPE_F16, 4, 8);
    c = make_cache(&f, KVC_KIND_FULL, 0, 0);
    TK_OK(append(&f, c, 3));
    TK_OK(kvc_cache_runs(c, 0, runs, 8, &n));
    first_k = runs[0].k;
    TK_OK(append(&f, c, 5));
    TK_OK(append(&f, c, 1));
    TK_EQ(offset_of(c), 9);
    TK_CHECK(view_range(&f, c, 0, 0, 9));
    TK_OK(kvc_cache_pages(c, &n));
    TK_EQ(n, 3);
    TK_EQ(pages_used(&f), 3);
    TK_OK(kvc_cache_cells(c, &cells));
    TK_EQ(cells, 9);
    /* pages 0,1,2 of a fresh pool are consecutive: one contiguous run, never moved */
    TK_OK(kvc_cache_runs(c, 1, runs, 8, &n));
    TK_EQ(n, 1);
    TK_EQ(runs[0].n_cells, 9);
    TK_OK(kvc_cache_runs(c, 0, runs, 8, &n));
    TK_CHECK(runs[0].k == first_k);
    TK_EQ(runs[0].pos[8], 8);
    TK_CHECK(((const float *)runs[0].k)[f.cfg.n_kv_heads * f.cfg.head_dim_k * 5 + 2] == enc(0, 0, 0, 5, 2, 0));
    /* trim gives pages back */
    TK_OK(kvc_cache_trim(c, 4));
    TK_EQ(offset_of(c), 5);
    TK_EQ(pages_used(&f), 2);
    TK_CHECK(view_range(&f, c, 0, 0, 5));
    TK_RES(kvc_cache_trim(c, 6), KVC_ERR_RANGE);
    TK_RES(kvc_cache_trim(c, -1), KVC_ERR_RANGE);
    TK_OK(kvc_cache_trim(c, 0));
    TK_EQ(offset_of(c), 5);
    /* rewrite after a rewind */
    f.salt = 3;
    TK_OK(append(&f, c, 4));
    TK_CHECK(view_salted(&f, c, 5, 0, 9, 3));
    TK_OK(kvc_cache_clear(c));
    TK_EQ(offset_of(c), 0);
    TK_EQ(pages_used(&f), 0);
    TK_OK(kvc_cache_destroy(c));
    fx_done(&f);
}

/* A trim by 0 succeeds and changes nothing, on every kind that trims, in any state: a
   cache trimmed by 0 after every step (appends, cancelled batches, a wrapped window) and
   its twin, never trimmed, hold the same cells after each step (once, a wrapped window
   answered KVC_ERR_UNSUPPORTED and a cancelled batch's window was re-anchored). */
static int same_cells(fixture *f, const kvc_cache *a, const kvc_cache *b) {
    static float ka[4096], va[4096], kb[4096], vb[4096];
    int32_t pa[512], pb[512], na = -1, nb = -2, l, ok = offset_of(a) == offset_of(b);
    for (l = 0; l < f->cfg.n_layers; ++l) {
        ok &= kvc_cache_gather(a, l, ka, va, pa, 512, &na) == KVC_OK && kvc_cache_gather(b, l, kb, vb, pb, 512, &nb) == KVC_OK;
        ok &= na == nb && memcmp(pa, pb, sizeof(int32_t) * (size_t)na) == 0 &&
              memcmp(ka, kb, sizeof(float) * (size_t)na * 8) == 0 && memcmp(va, vb, sizeof(float) * (size_t)na * 6) == 0;
    }
    return ok;
}
static void test_trim_zero(tk_rng *rng) {
    int kind, step;
    for (kind = 0; kind < 3; ++kind) {
        fixture f;
        kvc_cache *a, *b;
        int32_t window = kind == 2 ? 4 : 8;
        fx_init(&f, KVC_TYPE_F32, KVC_TYPE_F32, 1 + kind, 160);
        a = make_cache(&f, kind ? KVC_KIND_ROTATING : KVC_KIND_FULL, kind ? window : 0, kind == 2);
        b = make_cache(&f, kind ? KVC_KIND_ROTATING : KVC_KIND_FULL, kind ? window : 0, kind == 2);
        for (step = 0; step < 40; ++step) {
            int32_t n = tk_int(rng, 1, 3);
            if (offset_of(a) + n > 60) break;
            if (tk_pct(rng, 30)) { /* a batch begun, then cancelled */
                TK_OK(kvc_begin(a, n, NULL, 0));
                TK_OK(kvc_begin(b, n, NULL, 0));
                TK_OK(kvc_cancel(a));
                TK_OK(kvc_cancel(b));
            } else {
                TK_OK(append(&f, a, n));
                TK_OK(append(&f, b, n));
            }
            TK_OK(kvc_cache_trim(a, 0));
            TK_CHECK(same_cells(&f, a, b));
        }
        TK_OK(kvc_cache_destroy(a));
        TK_OK(kvc_cache_destroy(b));
        fx_done(&f);
    }
}

/* ---- rotating cache: the scenarios of ollama's MLX runner (RotatingKVCache) ------- */

static void test_rotating_concat_and_update(void) {
    fixture f;
    kvc_cache *c;
    int32_t o, n = 0;
    int can_trim = -1;
    fx_init(&f, KVC_TYPE_F16, KVC_TYPE_F32, 2, 32);
    c = make_cache(&f, KVC_KIND_ROTATING, 4, 0);
    /* concat of tokens 1..8: everything */
    TK_OK(append(&f, c, 8));
    TK_CHECK(view_range(&f, c, 0, 0, 8));
    /* concat of 9..16: every query of the chunk still sees a full window (W-1 older + chunk) */
    TK_OK(append(&f, c, 8));
    TK_CHECK(view_range(&f, c, 0, 5, 16));
    /* single-token updates across the wrap: exactly the last W tokens */
    for (o = 16; o < 27; ++o) {
        TK_OK(append(&f, c, 1));
        TK_CHECK(view_range(&f, c, 0, o - 3, o + 1));
        TK_OK(kvc_cache_pages(c, &n));
        TK_CHECK(n <= 3); /* 4 tokens span at most 3 pages of 2 */
    }
    TK_CHECK(pages_used(&f) <= 3);
    /* wrapped: no live rewind, no trim (ollama's MLX runner's rules) */
    TK_RES(kvc_cache_restore(c, NULL, 20), KVC_ERR_UNREACHABLE);
    TK_OK(kvc_cache_restore(c, NULL, 27)); /* the current offset is reachable */
    TK_RES(kvc_cache_restore(c, NULL, 28), KVC_ERR_UNREACHABLE);
    TK_OK(kvc_cache_can_trim(c, &can_trim));
    TK_EQ(can_trim, 0);
    TK_RES(kvc_cache_trim(c, 1), KVC_ERR_UNREACHABLE);
    TK_CHECK(view_range(&f, c, 0, 23, 27));
    TK_OK(kvc_cache_destroy(c));
    fx_done(&f);
}

static void test_rotating_rewind_restore(void) {
    fixture f;
    kvc_cache *c;
    kvc_snapshot *s6 = NULL, *s12 = NULL, *none = NULL;
    int can_trim = 0;
    fx_init(&f, KVC_TYPE_F32, KVC_TYPE_F32, 3, 32);
    c = make_cache(&f, KVC_KIND_ROTATING, 8, 0);
    TK_OK(append(&f, c, 5));
    TK_OK(kvc_cache_can_trim(c, &can_trim));
    TK_EQ(can_trim, 1);
    /* rewind then concat (not wrapped yet) */
    TK_OK(kvc_cache_restore(c, NULL, 3));
    TK_EQ(offset_of(c), 3);
    TK_CHECK(view_range(&f, c, 0, 0, 3));
    f.salt = 1;
    TK_OK(append(&f, c, 3));
    TK_CHECK(view_salted(&f, c, 3, 0, 6, 1));
    TK_RES(kvc_cache_restore(c, NULL, -1), KVC_ERR_UNREACHABLE);
    /* snapshot at 6 (window not wrapped), run on until it wraps */
    TK_OK(kvc_snapshot_take(c, 0, KVC_POS_END, &s6));
    TK_OK(kvc_snapshot_take(c, 6, KVC_POS_END, &none));
    TK_CHECK(none == NULL); /* offset <= from: nothing to keep, as in ollama's MLX runner */
    f.salt = 2;
    TK_OK(append(&f, c, 6));
    TK_EQ(offset_of(c), 12);
    TK_OK(kvc_snapshot_take(c, 10, KVC_POS_END, &s12));
    TK_OK(append(&f, c, 3));
    TK_RES(kvc_cache_restore(c, s6, 7), KVC_ERR_UNREACHABLE); /* beyond the snapshot */
    TK_OK(kvc_cache_restore(c, s6, 6));
    TK_EQ(offset_of(c), 6);
    TK_CHECK(view_salted(&f, c, 3, 0, 6, 1));
    TK_OK(kvc_cache_restore(c, s6, 4)); /* clamping is fine: the snapshot's window never wrapped */
    TK_EQ(offset_of(c), 4);
    TK_CHECK(view_salted(&f, c, 3, 0, 4, 1));
    TK_RES(kvc_cache_restore(c, s12, 11), KVC_ERR_UNREACHABLE); /* clamping a wrapped window */
    TK_EQ(offset_of(c), 4);
    TK_OK(kvc_cache_restore(c, s12, 12));
    TK_EQ(offset_of(c), 12);
    {   /* the window of the last batch (6 tokens at 6): W-1 older + 6 */
        int32_t p[16], n = 0, i;
        int salts[16];
        for (i = 0; i < 12; ++i) { p[n] = i; salts[n++] = i < 3 ? 0 : i < 6 ? 1 : 2; }
        TK_CHECK(view_is(&f, c, p, salts, n));
    }
    {   /* rotating snapshots cannot split and merge keeps the child */
        kvc_snapshot *a = NULL, *b = NULL, *m = NULL;
        kvc_snapshot_info info = {0, 0, 0, 0};
        TK_OK(kvc_snapshot_split(c, s12, 11, &a, &b));
        TK_CHECK(a == NULL && b == s12);
        TK_OK(kvc_snapshot_merge(c, s6, s12, &m));
        TK_CHECK(m == s12);
        TK_OK(kvc_snapshot_info_get(m, &info));
        TK_EQ(info.to, 12);
        TK_OK(kvc_snapshot_merge(c, m, NULL, &m));
        TK_CHECK(m == NULL);
    }
    TK_OK(kvc_cache_destroy(c));
    fx_done(&f);
}

static void test_rotating_sinks(void) {
    fixture f;
    kvc_cache *c;
    int32_t o;
    fx_init(&f, KVC_TYPE_F16, KVC_TYPE_F16, 2, 32);
    c = make_cache(&f, KVC_KIND_ROTATING, 4, 1); /* 1 sink + 3 recent */
    for (o = 0; o < 12; ++o) {
        TK_OK(append(&f, c, 1));
        if (o < 4) TK_CHECK(view_range(&f, c, 0, 0, o + 1));
        else TK_CHECK(view_range(&f, c, 1, o - 2, o + 1));
    }
    TK_OK(append(&f, c, 5)); /* a chunk: 1 sink + 2 older + 5 */
    TK_CHECK(view_range(&f, c, 1, 10, 17));
    TK_CHECK(pages_used(&f) <= 6);
    TK_OK(kvc_cache_destroy(c));
    c = make_cache(&f, KVC_KIND_ROTATING, 6, 3); /* sinks spanning two pages */
    TK_OK(append(&f, c, 10));
    TK_OK(append(&f, c, 1));
    TK_CHECK(view_range(&f, c, 3, 8, 11));
    TK_OK(kvc_cache_destroy(c));
    fx_done(&f);
}

/* ---- snapshots on the full cache --------------------------------------------------- */

static void test_snapshot_full(void) {
    fixture f;
    kvc_cache *c, *other;
    kvc_snapshot *s = NULL, *a = NULL, *b = NULL, *m = NULL;
    kvc_snapshot_info info = {0, 0, 0, 0};
    kvc_pool_stats st;
    int32_t used;
    fx_init(&f, KVC_TYPE_F32, KVC_TYPE_F16, 4, 40);
    c = make_cache(&f, KVC_KIND_FULL, 0, 0);
    other = make_cache(&f, KVC_KIND_FULL, 0, 0);
    TK_OK(append(&f, c, 10));
    used = pages_used(&f);
    TK_OK(kvc_snapshot_take(c, 6, KVC_POS_END, &s));
    TK_EQ(pages_used(&f), used); /* shares pages: nothing copied */
    TK_OK(kvc_snapshot_info_get(s, &info));
    TK_EQ(info.from, 6);
    TK_EQ(info.to, 10);
    TK_EQ(info.n_pages, 2);
    TK_OK(kvc_pool_stats_get(f.pool, &st));
    TK_EQ(info.bytes, 2 * st.page_bytes);
    /* copy-on-write: the live cache rewrites 8.. with other values */
    TK_OK(kvc_cache_restore(c, NULL, 8));
    f.salt = 1;
    TK_OK(append(&f, c, 4));
    TK_CHECK(view_salted(&f, c, 8, 0, 12, 1));
    TK_EQ(pages_used(&f), used + 1); /* the shared tail page was copied, once */
    TK_RES(kvc_cache_restore(c, s, 11), KVC_ERR_UNREACHABLE); /* beyond the snapshot */
    /* another cache of the pool takes it too (as the MLX runner's snapshots do), but
       needs the tokens before `from` itself: empty, it cannot reach 10 */
    TK_RES(kvc_cache_restore(other, s, 10), KVC_ERR_UNREACHABLE);
    {
        kvc_snapshot *whole = NULL;
        TK_OK(kvc_snapshot_take(c, 0, KVC_POS_END, &whole));
        TK_OK(kvc_cache_restore(other, whole, 12));
        TK_CHECK(view_salted(&f, other, 8, 0, 12, 1));
        TK_OK(kvc_snapshot_free(whole));
        TK_OK(kvc_cache_clear(other));
    }
    TK_OK(kvc_cache_restore(c, s, 10));
    TK_CHECK(view_range(&f, c, 0, 0, 10)); /* the snapshot never changed */
    /* ... and the reverse: writing after the restore leaves the snapshot alone */
    f.salt = 2;
    TK_OK(append(&f, c, 3));
    TK_CHECK(view_salted(&f, c, 10, 0, 13, 2));
    TK_OK(kvc_cache_restore(c, s, 9));
    TK_EQ(offset_of(c), 9);
    TK_CHECK(view_range(&f, c, 0, 0, 9));
    /* where ollama's MLX runner's Restore returns false */
    TK_RES(kvc_cache_restore(c, s, -1), KVC_ERR_UNREACHABLE);
    TK_OK(kvc_cache_restore(c, NULL, 5));
    TK_RES(kvc_cache_restore(c, s, 10), KVC_ERR_UNREACHABLE); /* offset 5 < from 6 */
    TK_RES(kvc_cache_restore(c, NULL, 6), KVC_ERR_UNREACHABLE); /* live: beyond offset */
    TK_EQ(offset_of(c), 5);
    TK_OK(kvc_snapshot_free(s));
    TK_OK(kvc_cache_clear(c));
    f.salt = 0;

    /* a snapshot of a small range keeps only its pages alive */
    TK_OK(append(&f, c, 64)); /* 16 pages */
    TK_OK(kvc_snapshot_take(c, 61, KVC_POS_END, &s));
    TK_OK(kvc_cache_clear(c));
    TK_EQ(pages_used(&f), 1);
    TK_OK(kvc_snapshot_free(s));
    TK_EQ(pages_used(&f), 0);

    /* merge [0,6) + [6,10) where the boundary page diverged (copy-on-write made two) */
    TK_OK(append(&f, c, 6));
    TK_OK(kvc_snapshot_take(c, -5, KVC_POS_END, &a)); /* from < 0 counts as 0 */
    TK_OK(kvc_snapshot_info_get(a, &info));
    TK_EQ(info.from, 0);
    TK_OK(append(&f, c, 4));
    TK_OK(kvc_snapshot_take(c, 6, KVC_POS_END, &b));
    TK_RES(kvc_snapshot_merge(c, b, a, &m), KVC_ERR_INVALID); /* not adjacent: nothing consumed */
    TK_OK(kvc_snapshot_merge(c, a, b, &m));
    TK_OK(kvc_snapshot_info_get(m, &info));
    TK_EQ(info.from, 0);
    TK_EQ(info.to, 10);
    TK_EQ(info.n_pages, 3);
    TK_OK(kvc_cache_clear(c));
    TK_OK(kvc_cache_restore(c, m, 10));
    TK_CHECK(view_range(&f, c, 0, 0, 10));
    /* split at 6, inside a page: both halves hold the boundary page */
    TK_OK(kvc_snapshot_split(c, m, 6, &a, &b));
    TK_OK(kvc_snapshot_info_get(a, &info));
    TK_EQ(info.to, 6);
    TK_EQ(info.n_pages, 2);
    TK_OK(kvc_snapshot_info_get(b, &info));
    TK_EQ(info.from, 6);
    TK_EQ(info.n_pages, 2);
    TK_OK(kvc_cache_clear(c));
    TK_RES(kvc_cache_restore(c, b, 10), KVC_ERR_UNREACHABLE); /* offset 0 < from 6 */
    TK_OK(kvc_cache_restore(c, a, 6));
    TK_OK(kvc_cache_restore(c, b, 10));
    TK_CHECK(view_range(&f, c, 0, 0, 10));
    {   /* split outside the ends */
        kvc_snapshot *x = NULL, *y = NULL;
        TK_OK(kvc_snapshot_split(c, a, 0, &x, &y));
        TK_CHECK(x == NULL && y == a);
        TK_OK(kvc_snapshot_split(c, a, 6, &x, &y));
        TK_CHECK(x == a && y == NULL);
        TK_OK(kvc_snapshot_split(c, NULL, 3, &x, &y));
        TK_CHECK(x == NULL && y == NULL);
    }
    /* merge with a missing side frees the other */
    TK_OK(kvc_pool_stats_get(f.pool, &st));
    TK_EQ(st.live_snapshots, 2);
    TK_OK(kvc_snapshot_merge(c, a, NULL, &m));
    TK_CHECK(m == NULL);
    TK_OK(kvc_snapshot_merge(c, NULL, b, &m));
    TK_CHECK(m == NULL);
    TK_OK(kvc_pool_stats_get(f.pool, &st));
    TK_EQ(st.live_snapshots, 0);
    /* fork shares every page */
    {
        kvc_cache *fk = NULL;
        used = pages_used(&f);
        TK_OK(kvc_cache_fork(c, &fk));
        TK_EQ(pages_used(&f), used);
        f.salt = 5;
        TK_OK(append(&f, fk, 2));
        TK_CHECK(view_salted(&f, fk, 10, 0, 12, 5));
        TK_CHECK(view_range(&f, c, 0, 0, 10));
        TK_OK(kvc_cache_destroy(fk));
    }
    TK_OK(kvc_cache_destroy(other));
    TK_OK(kvc_cache_destroy(c));
    fx_done(&f);
}

/* ---- single-entry prefix reuse ------------------------------------------------------ */

static void test_prefix(void) {
    fixture f;
    kvc_cache *c, *r, *both[2];
    kvc_prefix *px = NULL, *mixed = NULL;
    int32_t toks[64], reused = -1, n = 0, i;
    const int32_t *rec = NULL;
    for (i = 0; i < 64; ++i) toks[i] = 1000 + i;
    fx_init(&f, KVC_TYPE_F16, KVC_TYPE_F16, 4, 64);
    c = make_cache(&f, KVC_KIND_FULL, 0, 0);
    TK_OK(kvc_prefix_create(&c, 1, 32, &px));
    TK_RES(kvc_prefix_close(px, NULL, 0), KVC_ERR_STATE); /* no request open */
    /* request 1: nothing cached */
    TK_OK(kvc_prefix_begin(px, toks, 10, &reused));
    TK_EQ(reused, 0);
    TK_OK(append(&f, c, 10)); /* the prompt */
    TK_OK(append(&f, c, 1));  /* generated token 1 forwarded; token 2 sampled, not forwarded */
    TK_OK(kvc_prefix_close(px, toks + 10, 2));
    TK_OK(kvc_prefix_tokens(px, &rec, &n));
    TK_EQ(n, 11); /* clipped to what the cache holds */
    TK_EQ(rec[10], toks[10]);
    /* request 2 extends the conversation: all 11 reused */
    TK_OK(kvc_prefix_begin(px, toks, 14, &reused));
    TK_EQ(reused, 11);
    TK_EQ(offset_of(c), 11);
    TK_OK(append(&f, c, 3));
    TK_OK(kvc_prefix_close(px, NULL, 0));
    /* request 3 diverges at 5: the cache is trimmed there */
    {
        int32_t alt[8];
        memcpy(alt, toks, sizeof(int32_t) * 5);
        alt[5] = 7; alt[6] = 8;
        TK_OK(kvc_prefix_begin(px, alt, 7, &reused));
        TK_EQ(reused, 5);
        TK_EQ(offset_of(c), 5);
        TK_OK(append(&f, c, 2));
        TK_OK(kvc_prefix_close(px, NULL, 0));
        /* an identical request still evaluates one token */
        TK_OK(kvc_prefix_begin(px, alt, 7, &reused));
        TK_EQ(reused, 6);
        TK_EQ(offset_of(c), 6);
    }
    TK_OK(kvc_prefix_destroy(px));

    /* mixed kinds: a wrapped rotating window cannot trim, so both start over */
    TK_OK(kvc_cache_clear(c));
    r = make_cache(&f, KVC_KIND_ROTATING, 4, 0);
    both[0] = c; both[1] = r;
    TK_OK(kvc_prefix_create(both, 2, 64, &mixed));
    TK_OK(kvc_prefix_begin(mixed, toks, 10, &reused));
    TK_OK(append(&f, c, 10));
    TK_OK(append(&f, r, 10));
    TK_OK(kvc_prefix_close(mixed, NULL, 0));
    TK_OK(kvc_prefix_begin(mixed, toks, 12, &reused)); /* extends: no trim needed */
    TK_EQ(reused, 10);
    TK_OK(append(&f, c, 2));
    TK_OK(append(&f, r, 2));
    TK_OK(kvc_prefix_close(mixed, NULL, 0));
    TK_OK(kvc_prefix_begin(mixed, toks, 6, &reused)); /* would need a trim of the window */
    TK_EQ(reused, 0);
    TK_EQ(offset_of(c), 0);
    TK_EQ(offset_of(r), 0);
    TK_OK(kvc_prefix_destroy(mixed));
    TK_OK(kvc_cache_destroy(r));
    TK_OK(kvc_cache_destroy(c));
    fx_done(&f);
}

/* ---- budget --------------------------------------------------------------------------- */

static void test_budget(void) {
    fixture f;
    kvc_cache *c;
    kvc_snapshot *s1 = NULL, *s2 = NULL;
    int32_t n = 0;
    fx_init(&f, KVC_TYPE_F32, KVC_TYPE_F32, 4, 3);
    c = make_cache(&f, KVC_KIND_FULL, 0, 0);
    TK_OK(append(&f, c, 11));
    TK_RES(append(&f, c, 2), KVC_ERR_FULL);
    TK_EQ(offset_of(c), 11);
    TK_CHECK(view_range(&f, c, 0, 0, 11));
    TK_OK(append(&f, c, 1));
    TK_RES(kvc_begin(c, 1, NULL, 0), KVC_ERR_FULL);
    TK_OK(kvc_cache_clear(c));
    /* copy-on-write needs a page too */
    TK_OK(append(&f, c, 6));              /* pages A B */
    TK_OK(kvc_snapshot_take(c, 0, KVC_POS_END, &s1)); /* shares A B */
    f.salt = 1;
    TK_OK(append(&f, c, 1));              /* B is shared: copied to B' (the last page) */
    TK_OK(kvc_snapshot_take(c, 0, KVC_POS_END, &s2)); /* shares A B' */
    TK_OK(kvc_cache_restore(c, s1, 6));   /* back to A B */
    TK_EQ(pages_used(&f), 3);
    TK_RES(append(&f, c, 1), KVC_ERR_FULL); /* B is shared and no page is left to copy it */
    TK_EQ(offset_of(c), 6);
    TK_OK(kvc_cache_pages(c, &n));
    TK_EQ(n, 2);
    TK_CHECK(view_range(&f, c, 0, 0, 6));
    TK_OK(kvc_snapshot_free(s2));         /* B' returns to the pool */
    TK_OK(append(&f, c, 1));
    TK_CHECK(view_salted(&f, c, 6, 0, 7, 1));
    TK_OK(kvc_snapshot_free(s1));
    TK_OK(kvc_cache_destroy(c));
    fx_done(&f);
}

/* ---- attention against a double-precision reference --------------------------------- */

static kvc_result append_random(fixture *f, kvc_cache *c, int n, tk_rng *rng) {
    int32_t l, i, nk = n * f->cfg.n_kv_heads * f->cfg.head_dim_k, nv = n * f->cfg.n_kv_heads * f->cfg.head_dim_v;
    kvc_result r = kvc_begin(c, n, NULL, 0);
    if (r != KVC_OK) return r;
    for (l = 0; l < f->cfg.n_layers; ++l) {
        for (i = 0; i < nk; ++i) f->k[i] = tk_float(rng) * 2.0f;
        for (i = 0; i < nv; ++i) f->v[i] = tk_float(rng);
        r = kvc_put(c, l, f->k, f->v);
        if (r != KVC_OK) return r;
    }
    return KVC_OK;
}

/* The documented mask, from the cells kvc_cache_gather returns (what is stored). */
static double ref_max_error(fixture *f, const kvc_cache *c, int layer, const kvc_attention_desc *d,
                            kvc_kind kind, int window, int sinks) {
    static float k[8192], v[8192];
    static double w[1024];
    int32_t pos[1024], n = 0, qi, h, j, e;
    int hk = f->cfg.head_dim_k, hv = f->cfg.head_dim_v, nkv = f->cfg.n_kv_heads, group = d->n_heads / nkv;
    double worst = 0, scale = d->scale > 0 ? d->scale : 1.0 / sqrt((double)hk);
    int32_t off = offset_of(c);
    if (kvc_cache_gather(c, layer, k, v, pos, 1024, &n) != KVC_OK) return 1e9;
    for (qi = 0; qi < d->n_queries; ++qi) {
        int32_t p = d->pos ? d->pos[qi] : off - d->n_queries + qi;
        for (h = 0; h < d->n_heads; ++h) {
            const float *q = d->q + ((size_t)qi * d->n_heads + h) * hk;
            const float *out = d->out + ((size_t)qi * d->n_heads + h) * hv;
            int g = h / group;
            double m = -1e300, sum = 0;
            for (j = 0; j < n; ++j) {
                int vis = pos[j] >= 0 && (d->non_causal || pos[j] <= p) && (d->window == 0 || pos[j] > p - d->window) &&
                          (kind != KVC_KIND_ROTATING || pos[j] < sinks || pos[j] > p - (window - sinks));
                w[j] = -1e301;
                if (vis) {
                    double s = 0;
                    for (e = 0; e < hk; ++e) s += (double)q[e] * k[((size_t)j * nkv + g) * hk + e];
                    w[j] = s * scale;
                    if (w[j] > m) m = w[j];
                }
            }
            for (j = 0; j < n; ++j) { w[j] = w[j] < -1e300 ? 0 : exp(w[j] - m); sum += w[j]; }
            for (e = 0; e < hv; ++e) {
                double acc = 0;
                for (j = 0; j < n; ++j) acc += w[j] * v[((size_t)j * nkv + g) * hv + e];
                acc = sum > 0 ? acc / sum : 0;
                if (fabs(acc - out[e]) > worst) worst = fabs(acc - out[e]);
            }
        }
    }
    return worst;
}

static void check_attention(fixture *f, kvc_cache *c, kvc_kind kind, int window, int sinks, tk_rng *rng,
                            int nq, int heads, const int32_t *pos, int desc_window, int non_causal) {
    static float q[4096], out[4096];
    kvc_attention_desc d;
    int i, l;
    memset(&d, 0, sizeof(d));
    d.n_queries = nq;
    d.n_heads = heads;
    d.q = q;
    d.pos = pos;
    d.window = desc_window;
    d.non_causal = non_causal;
    d.out = out;
    for (i = 0; i < nq * heads * f->cfg.head_dim_k; ++i) q[i] = tk_float(rng) * 2.0f;
    for (l = 0; l < f->cfg.n_layers; ++l) {
        for (i = 0; i < nq * heads * f->cfg.head_dim_v; ++i) out[i] = 12345.0f;
        TK_OK(kvc_attention(c, l, &d));
        TK_NEAR(ref_max_error(f, c, l, &d, kind, window, sinks), 0.0, 2e-6);
    }
}

static void test_attention(tk_rng *rng) {
    int t;
    for (t = 0; t < 4; ++t) {
        fixture f;
        kvc_cache *c, *r;
        int32_t pos[4] = {3, 17, 18, -1}, n;
        kvc_type tk = (t & 1) ? KVC_TYPE_F16 : KVC_TYPE_F32, tv = (t & 2) ? KVC_TYPE_F16 : KVC_TYPE_F32;
        fx_init(&f, tk, tv, 3, 64);
        c = make_cache(&f, KVC_KIND_FULL, 0, 0);
        r = make_cache(&f, KVC_KIND_ROTATING, 6, 2);
        TK_OK(append_random(&f, c, 7, rng));
        TK_OK(append_random(&f, c, 13, rng));
        check_attention(&f, c, KVC_KIND_FULL, 0, 0, rng, 1, 2, NULL, 0, 0);   /* decode, GQA 1 */
        check_attention(&f, c, KVC_KIND_FULL, 0, 0, rng, 3, 4, NULL, 0, 0);   /* 3 queries, GQA 2 */
        check_attention(&f, c, KVC_KIND_FULL, 0, 0, rng, 4, 6, pos, 0, 0);    /* positions, GQA 3 */
        check_attention(&f, c, KVC_KIND_FULL, 0, 0, rng, 3, 2, NULL, 5, 0);   /* window mask */
        check_attention(&f, c, KVC_KIND_FULL, 0, 0, rng, 2, 2, pos, 0, 1);    /* non-causal */
        for (n = 0; n < 5; ++n) TK_OK(append_random(&f, r, 1 + n * 3, rng)); /* 35 tokens in chunks */
        check_attention(&f, r, KVC_KIND_ROTATING, 6, 2, rng, 1, 4, NULL, 0, 0);
        check_attention(&f, r, KVC_KIND_ROTATING, 6, 2, rng, 13, 2, NULL, 0, 0); /* the last chunk */
        TK_OK(append_random(&f, r, 1, rng));
        check_attention(&f, r, KVC_KIND_ROTATING, 6, 2, rng, 1, 2, NULL, 0, 0);
        {   /* a query that sees nothing gives zeros */
            static float q[64], out[64];
            kvc_attention_desc d;
            int32_t p = -1, i, zero = 1;
            memset(&d, 0, sizeof(d));
            for (i = 0; i < 64; ++i) { q[i] = 1.0f; out[i] = 7.0f; }
            d.n_queries = 1; d.n_heads = 2; d.q = q; d.pos = &p; d.out = out;
            TK_OK(kvc_attention(c, 0, &d));
            for (i = 0; i < 2 * f.cfg.head_dim_v; ++i) zero &= out[i] == 0.0f;
            TK_CHECK(zero);
        }
        TK_OK(kvc_cache_destroy(c));
        TK_OK(kvc_cache_destroy(r));
        fx_done(&f);
    }
}

/* ---- bad input: distinct errors, nothing changed ---------------------------------------- */

typedef struct fingerprint {
    int32_t offset, pages, cells, used;
} fingerprint;

static fingerprint fp_of(fixture *f, const kvc_cache *c) {
    fingerprint p;
    p.offset = offset_of(c);
    kvc_cache_pages(c, &p.pages);
    kvc_cache_cells(c, &p.cells);
    p.used = pages_used(f);
    return p;
}
#define TK_SAME(f, c, before)                                                   \
    do {                                                                        \
        fingerprint now_ = fp_of(f, c);                                         \
        TK_EQ(now_.offset, (before).offset);                                    \
        TK_EQ(now_.pages, (before).pages);                                      \
        TK_EQ(now_.cells, (before).cells);                                      \
        TK_EQ(now_.used, (before).used);                                        \
    } while (0)

static void test_errors(void) {
    fixture f, g;
    kvc_cache *c, *r, *other_pool_cache, *tmp = NULL;
    kvc_cache_config cc;
    kvc_snapshot *s = NULL, *s_r = NULL, *foreign = NULL, *x = NULL, *y = NULL;
    kvc_prefix *px = NULL;
    const int32_t *rec_empty = NULL;
    kvc_attention_desc d;
    kvc_run runs[4];
    static float q[256], out[256];
    int32_t n = 0, toks[4] = {1, 2, 3, 4}, reused, pos_buf[16];
    int can = -1;
    fingerprint before;
    fx_init(&f, KVC_TYPE_F32, KVC_TYPE_F16, 4, 16);
    fx_init(&g, KVC_TYPE_F32, KVC_TYPE_F16, 4, 16);
    c = make_cache(&f, KVC_KIND_FULL, 0, 0);
    r = make_cache(&f, KVC_KIND_ROTATING, 4, 0);
    other_pool_cache = make_cache(&g, KVC_KIND_FULL, 0, 0);
    TK_OK(append(&f, c, 9));
    TK_OK(append(&f, r, 9));
    TK_OK(append(&f, other_pool_cache, 9));
    TK_OK(kvc_snapshot_take(c, 2, KVC_POS_END, &s));
    TK_OK(kvc_snapshot_take(r, 0, KVC_POS_END, &s_r));
    TK_OK(kvc_snapshot_take(other_pool_cache, 2, KVC_POS_END, &foreign));
    before = fp_of(&f, c);

    /* cache creation */
    kvc_cache_config_init(&cc, KVC_KIND_ROTATING);
    TK_RES(kvc_cache_create(f.pool, &cc, &tmp), KVC_ERR_INVALID);
    cc.window = 4; cc.sinks = 4;
    TK_RES(kvc_cache_create(f.pool, &cc, &tmp), KVC_ERR_INVALID);
    cc.sinks = -1;
    TK_RES(kvc_cache_create(f.pool, &cc, &tmp), KVC_ERR_INVALID);
    cc.kind = KVC_KIND_FULL; cc.window = 3; cc.sinks = 0;
    TK_RES(kvc_cache_create(f.pool, &cc, &tmp), KVC_ERR_INVALID);
    cc.kind = (kvc_kind)7; cc.window = 0;
    TK_RES(kvc_cache_create(f.pool, &cc, &tmp), KVC_ERR_INVALID);
    TK_RES(kvc_cache_create(NULL, &cc, &tmp), KVC_ERR_NULL);
    TK_RES(kvc_cache_create(f.pool, NULL, &tmp), KVC_ERR_NULL);
    TK_CHECK(tmp == NULL);
    TK_RES(kvc_cache_destroy(NULL), KVC_ERR_NULL);
    TK_RES(kvc_cache_fork(NULL, &tmp), KVC_ERR_NULL);
    TK_RES(kvc_cache_fork(c, NULL), KVC_ERR_NULL);
    TK_RES(kvc_cache_clear(NULL), KVC_ERR_NULL);
    TK_RES(kvc_cache_offset(c, NULL), KVC_ERR_NULL);
    TK_RES(kvc_cache_cells(NULL, &n), KVC_ERR_NULL);
    TK_RES(kvc_cache_pages(c, NULL), KVC_ERR_NULL);
    TK_RES(kvc_pool_destroy(f.pool), KVC_ERR_BUSY);
    TK_RES(kvc_pool_stats_get(f.pool, NULL), KVC_ERR_NULL);

    /* begin / put / cancel */
    TK_RES(kvc_begin(NULL, 1, NULL, 0), KVC_ERR_NULL);
    TK_RES(kvc_begin(c, 0, NULL, 0), KVC_ERR_INVALID);
    TK_RES(kvc_begin(c, -5, NULL, 0), KVC_ERR_INVALID);
    TK_RES(kvc_begin(c, INT32_MAX, NULL, 0), KVC_ERR_RANGE);
    TK_RES(kvc_begin(c, 1000, NULL, 0), KVC_ERR_FULL);
    TK_RES(kvc_put(c, 0, f.k, f.v), KVC_ERR_STATE); /* no batch */
    TK_RES(kvc_cancel(c), KVC_ERR_STATE);
    TK_RES(kvc_cancel(NULL), KVC_ERR_NULL);
    TK_SAME(&f, c, before);
    TK_OK(kvc_begin(c, 2, NULL, 0));
    TK_RES(kvc_begin(c, 1, NULL, 0), KVC_ERR_STATE); /* the batch is not finished */
    TK_RES(kvc_put(c, -1, f.k, f.v), KVC_ERR_RANGE);
    TK_RES(kvc_put(c, 2, f.k, f.v), KVC_ERR_RANGE);
    TK_RES(kvc_put(c, 0, NULL, f.v), KVC_ERR_NULL);
    TK_RES(kvc_put(NULL, 0, f.k, f.v), KVC_ERR_NULL);
    TK_RES(kvc_snapshot_take(c, 0, KVC_POS_END, &x), KVC_ERR_STATE);
    TK_RES(kvc_cache_fork(c, &tmp), KVC_ERR_STATE);
    TK_RES(kvc_cache_trim(c, 0), KVC_ERR_STATE);    /* a batch is open: kvc_cancel first */
    TK_RES(kvc_cache_restore(c, NULL, 9), KVC_ERR_STATE);
    TK_RES(kvc_cache_restore(c, s, 9), KVC_ERR_STATE);
    TK_OK(kvc_put(c, 0, f.k, f.v));
    memset(&d, 0, sizeof(d));
    d.n_queries = 1; d.n_heads = 2; d.q = q; d.out = out;
    TK_OK(kvc_attention(c, 0, &d));
    TK_RES(kvc_attention(c, 1, &d), KVC_ERR_STATE); /* layer 1 not put yet */
    TK_OK(kvc_cancel(c));
    /* back to 9 tokens; the tail page shared with `s` stays copied (same contents) */
    TK_EQ(offset_of(c), 9);
    TK_EQ(pages_used(&f), before.used + 1);
    TK_CHECK(view_range(&f, c, 0, 0, 9));
    before = fp_of(&f, c);

    /* attention */
    TK_RES(kvc_attention(NULL, 0, &d), KVC_ERR_NULL);
    TK_RES(kvc_attention(c, 0, NULL), KVC_ERR_NULL);
    TK_RES(kvc_attention(c, 2, &d), KVC_ERR_RANGE);
    d.n_heads = 3; TK_RES(kvc_attention(c, 0, &d), KVC_ERR_INVALID); d.n_heads = 2;
    d.n_queries = 0; TK_RES(kvc_attention(c, 0, &d), KVC_ERR_INVALID);
    d.n_queries = 10; TK_RES(kvc_attention(c, 0, &d), KVC_ERR_RANGE); d.n_queries = 1;
    d.window = -1; TK_RES(kvc_attention(c, 0, &d), KVC_ERR_INVALID); d.window = 0;
    d.scale = -1.0f; TK_RES(kvc_attention(c, 0, &d), KVC_ERR_INVALID);
    d.scale = (float)NAN; TK_RES(kvc_attention(c, 0, &d), KVC_ERR_INVALID); d.scale = 0.0f;
    d.q = NULL; TK_RES(kvc_attention(c, 0, &d), KVC_ERR_NULL); d.q = q;

    /* trim */
    TK_RES(kvc_cache_trim(NULL, 1), KVC_ERR_NULL);
    TK_RES(kvc_cache_can_trim(c, NULL), KVC_ERR_NULL);
    TK_OK(kvc_cache_can_trim(r, &can));
    TK_EQ(can, 0);

    /* snapshots */
    TK_RES(kvc_snapshot_take(NULL, 0, KVC_POS_END, &x), KVC_ERR_NULL);
    TK_RES(kvc_snapshot_take(c, 0, KVC_POS_END, NULL), KVC_ERR_NULL);
    TK_RES(kvc_cache_restore(NULL, s, 3), KVC_ERR_NULL);
    TK_RES(kvc_cache_restore(c, foreign, 9), KVC_ERR_FOREIGN); /* another pool */
    TK_RES(kvc_cache_restore(c, s_r, 9), KVC_ERR_FOREIGN); /* another cache (and kind) */
    TK_RES(kvc_cache_restore(r, s, 9), KVC_ERR_FOREIGN);
    TK_RES(kvc_snapshot_merge(c, s, foreign, &x), KVC_ERR_FOREIGN);
    TK_RES(kvc_snapshot_merge(c, s, s, &x), KVC_ERR_INVALID);
    TK_RES(kvc_snapshot_merge(c, s, NULL, NULL), KVC_ERR_NULL);
    TK_RES(kvc_snapshot_merge(NULL, s, NULL, &x), KVC_ERR_NULL);
    TK_RES(kvc_snapshot_split(c, foreign, 4, &x, &y), KVC_ERR_FOREIGN);
    TK_RES(kvc_snapshot_split(c, s, 4, NULL, &y), KVC_ERR_NULL);
    TK_RES(kvc_snapshot_info_get(NULL, NULL), KVC_ERR_NULL);
    TK_OK(kvc_snapshot_free(NULL));
    TK_SAME(&f, c, before);
    TK_CHECK(view_range(&f, c, 0, 0, 9));

    /* views */
    TK_RES(kvc_cache_runs(c, 0, NULL, 0, NULL), KVC_ERR_NULL);
    TK_RES(kvc_cache_runs(c, 5, runs, 4, &n), KVC_ERR_RANGE);
    TK_RES(kvc_cache_runs(c, 0, NULL, 2, &n), KVC_ERR_INVALID);
    TK_OK(kvc_cache_runs(c, 0, NULL, 0, &n)); /* only the count */
    TK_EQ(n, 2); /* pages 0 1 and the copied tail page */
    TK_RES(kvc_cache_runs(c, 0, runs, 1, &n), KVC_ERR_RANGE);
    TK_EQ(n, 2);
    TK_OK(kvc_cache_runs(c, 0, runs, 2, &n));
    TK_EQ(runs[0].n_cells + runs[1].n_cells, 9);
    TK_EQ(runs[1].pos[0], 8);
    TK_OK(kvc_cache_gather(c, 0, NULL, NULL, NULL, 0, &n)); /* only the count */
    TK_EQ(n, 9);
    TK_RES(kvc_cache_gather(c, 0, NULL, NULL, pos_buf, 3, &n), KVC_ERR_RANGE);
    TK_EQ(n, 9);
    TK_RES(kvc_cache_gather(c, -1, NULL, NULL, NULL, 30, &n), KVC_ERR_RANGE);
    TK_RES(kvc_cache_gather(c, 0, NULL, NULL, NULL, -1, &n), KVC_ERR_INVALID);

    /* prefix */
    TK_RES(kvc_prefix_create(NULL, 1, 8, &px), KVC_ERR_NULL);
    TK_RES(kvc_prefix_create(&c, 0, 8, &px), KVC_ERR_INVALID);
    TK_RES(kvc_prefix_create(&c, 1, 0, &px), KVC_ERR_INVALID);
    {
        kvc_cache *dup[2];
        dup[0] = c; dup[1] = c;
        TK_RES(kvc_prefix_create(dup, 2, 8, &px), KVC_ERR_INVALID);
        dup[1] = NULL;
        TK_RES(kvc_prefix_create(dup, 2, 8, &px), KVC_ERR_NULL);
    }
    TK_OK(kvc_prefix_create(&c, 1, 8, &px));
    TK_RES(kvc_prefix_begin(px, toks, -1, &reused), KVC_ERR_INVALID);
    TK_RES(kvc_prefix_begin(px, NULL, 2, &reused), KVC_ERR_NULL);
    TK_RES(kvc_prefix_begin(NULL, toks, 2, &reused), KVC_ERR_NULL);
    TK_RES(kvc_prefix_close(px, NULL, 2), KVC_ERR_NULL);
    TK_RES(kvc_prefix_close(px, toks, -1), KVC_ERR_INVALID);
    TK_RES(kvc_prefix_tokens(px, NULL, &n), KVC_ERR_NULL);
    TK_OK(kvc_begin(c, 1, NULL, 0));
    TK_RES(kvc_prefix_begin(px, toks, 4, &reused), KVC_ERR_STATE); /* a batch is open */
    TK_OK(kvc_cancel(c));
    TK_SAME(&f, c, before);
    {   /* an empty prompt is a valid request: nothing reused, the caches start over */
        int32_t off = -1;
        reused = -1;
        TK_OK(kvc_prefix_begin(px, NULL, 0, &reused));
        TK_EQ(reused, 0);
        TK_OK(kvc_cache_offset(c, &off));
        TK_EQ(off, 0);
        TK_OK(kvc_prefix_close(px, NULL, 0));
        TK_OK(kvc_prefix_tokens(px, &rec_empty, &n));
        TK_EQ(n, 0);
    }
    TK_OK(kvc_prefix_destroy(px));
    TK_RES(kvc_prefix_destroy(NULL), KVC_ERR_NULL);

    TK_OK(kvc_snapshot_free(s));
    TK_OK(kvc_snapshot_free(s_r));
    TK_OK(kvc_snapshot_free(foreign));
    TK_OK(kvc_cache_destroy(c));
    TK_OK(kvc_cache_destroy(r));
    TK_OK(kvc_cache_destroy(other_pool_cache));
    fx_done(&f);
    fx_done(&g);
}

/* ---- allocation failures: every one returns an error, changes nothing, leaks nothing ---- */

static int scenario(int *failed_cleanly) {
    fixture f;
    kvc_cache *c = NULL, *fk = NULL;
    kvc_snapshot *s = NULL, *a = NULL, *b = NULL;
    kvc_prefix *px = NULL;
    kvc_result r;
    int32_t toks[3] = {5, 6, 7}, reused;
    *failed_cleanly = 1;
    fx_config(&f.cfg, 2, 1, 2, 2, 2, 8);
    f.k = (float *)malloc(4096 * sizeof(float));
    f.v = (float *)malloc(4096 * sizeof(float));
    f.salt = 0;
    r = kvc_pool_create(&f.cfg, &f.pool);
    if (r != KVC_OK) { free(f.k); free(f.v); *failed_cleanly = r == KVC_ERR_NO_MEMORY; return 1; }
#define STEP(call)                                                                  \
    do {                                                                            \
        int32_t off_ = c ? offset_of(c) : 0;                                        \
        r = (call);                                                                 \
        if (r != KVC_OK) {                                                          \
            *failed_cleanly = r == KVC_ERR_NO_MEMORY && (!c || offset_of(c) == off_); \
            goto done;                                                              \
        }                                                                           \
    } while (0)
    {
        kvc_cache_config cc;
        kvc_cache_config_init(&cc, KVC_KIND_FULL);
        STEP(kvc_cache_create(f.pool, &cc, &c));
    }
    STEP(append(&f, c, 5));
    STEP(kvc_snapshot_take(c, 1, KVC_POS_END, &s));
    STEP(kvc_cache_fork(c, &fk));
    STEP(kvc_snapshot_split(c, s, 3, &a, &b));
    s = NULL;
    STEP(kvc_snapshot_merge(c, a, b, &s));
    a = b = NULL;
    STEP(kvc_prefix_create(&c, 1, 16, &px));
    STEP(kvc_prefix_begin(px, toks, 3, &reused));
#undef STEP
done:
    if (px) kvc_prefix_destroy(px);
    kvc_snapshot_free(s);
    kvc_snapshot_free(a);
    kvc_snapshot_free(b);
    if (fk) kvc_cache_destroy(fk);
    if (c) kvc_cache_destroy(c);
    {
        kvc_pool_stats st;
        kvc_pool_stats_get(f.pool, &st);
        if (st.pages_used != 0) *failed_cleanly = 0;
    }
    kvc_pool_destroy(f.pool);
    free(f.k);
    free(f.v);
    return r != KVC_OK;
}

/* Every allocating call on every kind, with the calls that do not allocate in between:
   FULL, ROTATING and CAUSAL caches (batches, sequences, copy_prefix, remove, defrag,
   per-sequence snapshot and restore), snapshots (take, split, merge, restore), fork,
   prefix reuse, and attention with a head of more than 512 values (its scratch row is
   allocated). When the injected failure hits, the call must say KVC_ERR_NO_MEMORY with
   nothing changed, and every object made so far must still work: the probe appends to
   every cache and checks their contents, then everything is torn down. */
typedef struct kinds_state {
    fixture f;
    kvc_pool *big;                       /* head dim 600: attention allocates */
    kvc_cache *c, *r, *x, *fc, *fr, *bigc;
    kvc_snapshot *s1, *s2, *sr, *sx, *a, *b;
    kvc_prefix *px;
    int32_t off_c, off_r;                /* tokens appended (positions 0..off-1, salt 0) */
} kinds_state;

static kvc_result causal_tokens(fixture *f, kvc_cache *x, int32_t seq, int32_t pos0, int32_t n) {
    int32_t pos[8], sq[8], i, l, h, d;
    kvc_batch b;
    kvc_result r;
    for (i = 0; i < n; ++i) { pos[i] = pos0 + i; sq[i] = seq; }
    b.n_tokens = n; b.pos = pos; b.seq = sq; b.non_causal = NULL;
    r = kvc_begin_batch(x, &b);
    if (r != KVC_OK) return r;
    for (l = 0; l < f->cfg.n_layers; ++l) {
        for (i = 0; i < n; ++i)
            for (h = 0; h < f->cfg.n_kv_heads; ++h) {
                for (d = 0; d < f->cfg.head_dim_k; ++d)
                    f->k[(i * f->cfg.n_kv_heads + h) * f->cfg.head_dim_k + d] = enc(0, l, h, pos[i], d, seq);
                for (d = 0; d < f->cfg.head_dim_v; ++d)
                    f->v[(i * f->cfg.n_kv_heads + h) * f->cfg.head_dim_v + d] = enc(1, l, h, pos[i], d, seq);
            }
        if ((r = kvc_put(x, l, f->k, f->v)) != KVC_OK) return r;
    }
    return KVC_OK;
}

typedef struct kinds_print {
    int32_t off[6], cells[6], pages[6], used, live_c, live_s, live_p, seq_lo[4], seq_hi[4];
} kinds_print;

static kinds_print kinds_fp(kinds_state *k) {
    kinds_print p;
    kvc_cache *all[6];
    kvc_pool_stats st;
    int i;
    memset(&p, 0, sizeof(p));
    all[0] = k->c; all[1] = k->r; all[2] = k->x; all[3] = k->fc; all[4] = k->fr; all[5] = k->bigc;
    for (i = 0; i < 6; ++i)
        if (all[i]) {
            kvc_cache_offset(all[i], &p.off[i]);
            kvc_cache_cells(all[i], &p.cells[i]);
            kvc_cache_pages(all[i], &p.pages[i]);
        }
    kvc_pool_stats_get(k->f.pool, &st);
    p.used = st.pages_used; p.live_c = st.live_caches; p.live_s = st.live_snapshots; p.live_p = st.live_prefixes;
    for (i = 0; k->x && i < 4; ++i) kvc_seq_pos_range(k->x, i, &p.seq_lo[i], &p.seq_hi[i]);
    return p;
}

/* After a failed allocation: every live object still works. */
static int kinds_probe(kinds_state *k) {
    int ok = 1;
    int32_t before = -1, after = -2, lo = -1, hi = -1;
    if (k->c) { /* FULL: one more token, the whole content exact */
        ok &= append(&k->f, k->c, 1) == KVC_OK;
        ok &= view_range(&k->f, k->c, 0, 0, ++k->off_c);
    }
    if (k->r) { /* ROTATING, window 5 with 1 sink: the sink and the last 4 */
        ok &= append(&k->f, k->r, 1) == KVC_OK;
        k->off_r++;
        ok &= view_range(&k->f, k->r, 1, k->off_r - 4 > 1 ? k->off_r - 4 : 1, k->off_r);
    }
    if (k->x) { /* CAUSAL: a token of sequence 3 after its last position takes one cell */
        kvc_cache_offset(k->x, &before);
        kvc_seq_pos_range(k->x, 3, &lo, &hi);
        ok &= causal_tokens(&k->f, k->x, 3, hi + 1, 1) == KVC_OK;
        kvc_cache_offset(k->x, &after);
        ok &= after == before + 1;
    }
    if (k->fc) ok &= append(&k->f, k->fc, 1) == KVC_OK;
    return ok;
}

static int scenario_kinds(int *failed_cleanly) {
    kinds_state k;
    kinds_print fp;
    kvc_result r = KVC_OK;
    kvc_cache_config cc;
    int32_t toks[6] = {3, 1, 4, 1, 5, 9}, reused, moves;
    memset(&k, 0, sizeof(k));
    *failed_cleanly = 1;
    fx_config(&k.f.cfg, 2, 1, 2, 2, 2, 40);
    k.f.k = (float *)malloc(4096 * sizeof(float));
    k.f.v = (float *)malloc(4096 * sizeof(float));
    r = kvc_pool_create(&k.f.cfg, &k.f.pool);
    if (r != KVC_OK) { free(k.f.k); free(k.f.v); *failed_cleanly = r == KVC_ERR_NO_MEMORY; return 1; }
#define KSTEP(call)                                                                     \
    do {                                                                                \
        fp = kinds_fp(&k);                                                              \
        r = (call);                                                                     \
        if (r != KVC_OK) {                                                              \
            kinds_print now_ = kinds_fp(&k);                                            \
            *failed_cleanly = r == KVC_ERR_NO_MEMORY && memcmp(&now_, &fp, sizeof(fp)) == 0 && \
                              kinds_probe(&k);                                          \
            goto done;                                                                  \
        }                                                                               \
    } while (0)
    kvc_cache_config_init(&cc, KVC_KIND_FULL);
    KSTEP(kvc_cache_create(k.f.pool, &cc, &k.c));
    cc.kind = KVC_KIND_ROTATING; cc.window = 5; cc.sinks = 1;
    KSTEP(kvc_cache_create(k.f.pool, &cc, &k.r));
    kvc_cache_config_init(&cc, KVC_KIND_CAUSAL);
    cc.capacity = 16; cc.max_seqs = 4; cc.window = 0;
    cc.rope.style = KVC_ROPE_NEOX; cc.rope.theta = 10000.0f;
    KSTEP(kvc_cache_create(k.f.pool, &cc, &k.x));
    KSTEP(append(&k.f, k.c, 5)); k.off_c = 5;
    KSTEP(append(&k.f, k.r, 7)); k.off_r = 7;
    KSTEP(causal_tokens(&k.f, k.x, 0, 0, 4));
    KSTEP(causal_tokens(&k.f, k.x, 1, 0, 3));
    /* FULL snapshots: take, split, merge, restore */
    KSTEP(kvc_snapshot_take(k.c, 1, KVC_POS_END, &k.s1));
    KSTEP(kvc_snapshot_split(k.c, k.s1, 3, &k.a, &k.b));
    k.s1 = NULL;
    KSTEP(kvc_snapshot_merge(k.c, k.a, k.b, &k.s1));
    k.a = k.b = NULL;
    KSTEP(append(&k.f, k.c, 2)); k.off_c += 2;
    KSTEP(kvc_snapshot_take(k.c, 5, KVC_POS_END, &k.s2));
    KSTEP(kvc_cache_restore(k.c, k.s1, 5)); k.off_c = 5;
    /* ROTATING snapshot, restore; forks of both */
    KSTEP(kvc_snapshot_take(k.r, 0, KVC_POS_END, &k.sr));
    KSTEP(append(&k.f, k.r, 2)); k.off_r += 2;
    KSTEP(kvc_cache_restore(k.r, k.sr, 7)); k.off_r = 7;
    KSTEP(kvc_cache_fork(k.c, &k.fc));
    KSTEP(kvc_cache_fork(k.r, &k.fr));
    KSTEP(append(&k.f, k.fc, 1)); /* copy-on-write of the shared tail */
    /* CAUSAL: sequences, per-sequence snapshot and restore, defrag */
    KSTEP(kvc_seq_copy_prefix(k.x, 0, 2, 2));
    KSTEP(kvc_seq_snapshot(k.x, 1, &k.sx));
    KSTEP(kvc_seq_remove(k.x, 0, 1, 2));
    KSTEP(kvc_seq_restore(k.x, k.sx, 3));
    KSTEP(kvc_seq_keep(k.x, 3) == KVC_OK ? causal_tokens(&k.f, k.x, 0, 0, 2) : KVC_ERR_STATE);
    KSTEP(kvc_cache_defrag(k.x, &moves));
    KSTEP(kvc_seq_snapshot(k.x, 3, &k.a));
    KSTEP(kvc_snapshot_free(k.a));
    k.a = NULL;
    /* prefix reuse over the FULL and ROTATING caches */
    {
        kvc_cache *both[2];
        both[0] = k.c; both[1] = k.r;
        KSTEP(kvc_prefix_create(both, 2, 16, &k.px));
    }
    KSTEP(kvc_prefix_begin(k.px, toks, 6, &reused));
    TK_EQ(reused, 0); /* nothing recorded yet; the wrapped window cannot trim: both start over */
    k.off_c = k.off_r = reused;
    KSTEP(append(&k.f, k.c, 6 - reused)); k.off_c = 6; /* the engine evaluates the prompt */
    KSTEP(append(&k.f, k.r, 6 - reused)); k.off_r = 6;
    KSTEP(kvc_prefix_close(k.px, NULL, 0));
    /* attention with a head of 600 values allocates its scratch row */
    {
        kvc_pool_config bc;
        kvc_attention_desc d;
        static float q[600], out[600], kv[1200];
        int i;
        fx_config(&bc, 1, 1, 600, 600, 4, 4);
        KSTEP(kvc_pool_create(&bc, &k.big));
        kvc_cache_config_init(&cc, KVC_KIND_FULL);
        KSTEP(kvc_cache_create(k.big, &cc, &k.bigc));
        for (i = 0; i < 1200; ++i) kv[i] = (float)(i % 13);
        for (i = 0; i < 600; ++i) q[i] = 0.01f;
        KSTEP(kvc_begin(k.bigc, 1, NULL, 0));
        KSTEP(kvc_put(k.bigc, 0, kv, kv + 600));
        memset(&d, 0, sizeof(d));
        d.n_queries = 1; d.n_heads = 1; d.q = q; d.out = out;
        KSTEP(kvc_attention(k.bigc, 0, &d));
        if (out[0] != kv[600] || out[599] != kv[1199]) { *failed_cleanly = 0; r = KVC_ERR_INVALID; goto done; }
    }
    *failed_cleanly = kinds_probe(&k); /* the same probe must pass without a failure too */
#undef KSTEP
done:
    if (k.px) kvc_prefix_destroy(k.px);
    kvc_snapshot_free(k.s1); kvc_snapshot_free(k.s2); kvc_snapshot_free(k.sr); kvc_snapshot_free(k.sx);
    kvc_snapshot_free(k.a); kvc_snapshot_free(k.b);
    if (k.fc) kvc_cache_destroy(k.fc);
    if (k.fr) kvc_cache_destroy(k.fr);
    if (k.c) kvc_cache_destroy(k.c);
    if (k.r) kvc_cache_destroy(k.r);
    if (k.x) kvc_cache_destroy(k.x);
    if (k.bigc) kvc_cache_destroy(k.bigc);
    {
        kvc_pool_stats st;
        kvc_pool_stats_get(k.f.pool, &st);
        if (st.pages_used != 0 || st.live_caches || st.live_snapshots || st.live_prefixes) *failed_cleanly = 0;
        if (k.big) {
            kvc_pool_stats_get(k.big, &st);
            if (st.pages_used != 0) *failed_cleanly = 0;
        }
    }
    if (kvc_pool_destroy(k.f.pool) != KVC_OK) *failed_cleanly = 0;
    if (k.big && kvc_pool_destroy(k.big) != KVC_OK) *failed_cleanly = 0;
    free(k.f.k);
    free(k.f.v);
    return r != KVC_OK;
}

static void test_alloc_failures_all_kinds(void) {
    long n;
    int clean, failed = 1;
    for (n = 0; failed && n < 200; ++n) {
        long a0 = tk_allocs, f0 = tk_frees;
        tk_fail_after = n;
        failed = scenario_kinds(&clean);
        tk_fail_after = -1;
        if (!clean) fprintf(stderr, "allocation failure injected at allocation %ld: not clean\n", n);
        TK_CHECK(clean);
        TK_EQ(tk_allocs - a0, tk_frees - f0); /* nothing leaked */
    }
    TK_CHECK(!failed); /* the scenario eventually runs with enough allocations */
    TK_CHECK(n > 15);  /* pools, caches, forks, snapshots, prefix, attention: each one failed */
}

static void test_alloc_failures(void) {
    long n;
    int clean, failed = 1;
    for (n = 0; failed && n < 100; ++n) {
        long a0 = tk_allocs, f0 = tk_frees;
        tk_fail_after = n;
        failed = scenario(&clean);
        tk_fail_after = -1;
        TK_CHECK(clean);
        TK_EQ(tk_allocs - a0, tk_frees - f0); /* nothing leaked */
    }
    TK_CHECK(!failed); /* the scenario eventually runs with enough allocations */
    TK_CHECK(n > 5);
}

/* An allocator whose blocks are 4-byte aligned (issue 23): refused at pool creation
   (KVC_ERR_ALIGNMENT, nothing kept); one that turns misaligned later fails that
   allocation cleanly (KVC_ERR_NO_MEMORY) instead of handing out a misaligned object. */
static long g_skew_after, g_skew_live;
/* The block sits at 16k + 2 (misaligned) or 16k + 16 (aligned) inside a malloc'd one, whose
   start is kept in the byte before it: malloc aligns to 8 only on some 32-bit hosts. */
static void *skew_alloc(size_t n, void *user) {
    unsigned char *b, *q;
    (void)user;
    b = (unsigned char *)malloc(n + 32);
    if (b == NULL) return NULL;
    g_skew_live++;
    q = b + (16 - ((uintptr_t)b & 15)); /* 16-aligned, 1..16 bytes in */
    if (g_skew_after == 0) q += 2;
    else {
        if (g_skew_after > 0) g_skew_after--;
        q += 16;
    }
    q[-1] = (unsigned char)(q - b);
    return q;
}
static void skew_free(void *p, void *user) {
    unsigned char *q = (unsigned char *)p;
    (void)user;
    if (p == NULL) return;
    g_skew_live--;
    free(q - q[-1]);
}
static void test_alignment(void) {
    kvc_pool_config cfg;
    kvc_pool *p = NULL;
    kvc_cache_config cc;
    kvc_cache *c = NULL;
    fx_config(&cfg, 1, 1, 4, 4, 4, 8);
    cfg.runtime.allocator.alloc = skew_alloc;
    cfg.runtime.allocator.free = skew_free;
    g_skew_after = 0; /* the first block already */
    TK_RES(kvc_pool_create(&cfg, &p), KVC_ERR_ALIGNMENT);
    TK_CHECK(p == NULL);
    TK_EQ(g_skew_live, 0);
    TK_CHECK(KVC_ALLOC_ALIGN >= sizeof(void *) && KVC_ALLOC_ALIGN <= 16);
    g_skew_after = 2; /* the pool's two blocks, then misaligned */
    TK_OK(kvc_pool_create(&cfg, &p));
    kvc_cache_config_init(&cc, KVC_KIND_FULL);
    TK_RES(kvc_cache_create(p, &cc, &c), KVC_ERR_NO_MEMORY);
    TK_CHECK(c == NULL);
    g_skew_after = -1; /* aligned again */
    TK_OK(kvc_cache_create(p, &cc, &c));
    TK_OK(kvc_cache_destroy(c));
    TK_OK(kvc_pool_destroy(p));
    TK_EQ(g_skew_live, 0);
}

/* kvc_prefix and changes behind its back (issue 23): a clear and other K/V, a trim, a
   load between close and the next begin must not be taken for the recorded tokens. */
static void test_prefix_stale(void) {
    fixture f;
    kvc_cache *c;
    kvc_prefix *px = NULL;
    int32_t toks[32], reused = -1, i, kept;
    for (i = 0; i < 32; ++i) toks[i] = 500 + i;
    fx_init(&f, KVC_TYPE_F32, KVC_TYPE_F32, 4, 32);
    c = make_cache(&f, KVC_KIND_FULL, 0, 0);
    TK_OK(kvc_prefix_create(&c, 1, 32, &px));
    for (kept = 0; kept < 3; ++kept) {
        TK_OK(kvc_prefix_begin(px, toks, 8, &reused));
        TK_OK(append(&f, c, 8));
        TK_OK(kvc_prefix_close(px, NULL, 0));
        if (kept == 0) { /* behind its back: cleared and refilled with other K/V */
            TK_OK(kvc_cache_clear(c));
            f.salt += 7;
            TK_OK(append(&f, c, 8));
        } else if (kept == 1) { /* trimmed and refilled */
            TK_OK(kvc_cache_trim(c, 3));
            TK_OK(append(&f, c, 3));
        } else { /* trimmed only: what is left is a prefix of the recorded tokens */
            TK_OK(kvc_cache_trim(c, 2));
        }
        TK_OK(kvc_prefix_begin(px, toks, 12, &reused));
        TK_EQ(reused, kept == 2 ? 6 : 0); /* before: 8 (then 8, 6), the tokens were stale */
        TK_EQ(offset_of(c), kept == 2 ? 6 : 0);
        TK_OK(append(&f, c, kept == 2 ? 6 : 12));
        TK_OK(kvc_prefix_close(px, NULL, 0));
        TK_OK(kvc_cache_clear(c));
    }
    TK_OK(kvc_prefix_destroy(px));
    TK_OK(kvc_cache_destroy(c));
    fx_done(&f);
}

int main(int argc, char **argv) {
    tk_rng rng;
    rng.s = argc > 1 ? strtoull(argv[1], NULL, 10) : (unsigned long long)time(NULL) * 2654435761ull;
    printf("seed %llu\n", rng.s);
    test_results();
    test_pool_config();
    test_budget_for_tokens();
    test_pool_config_check();
    test_cache_config_check();
    test_begin_at();
    test_arena();
    test_full_basic();
    test_trim_zero(&rng);
    test_rotating_concat_and_update();
    test_rotating_rewind_restore();
    test_rotating_sinks();
    test_snapshot_full();
    test_prefix();
    test_budget();
    test_attention(&rng);
    test_errors();
    test_alloc_failures();
    test_alloc_failures_all_kinds();
    test_alignment();
    test_prefix_stale();
    TK_EQ(tk_allocs, tk_frees);
    return tk_report("core");
}
