/* test_reserve.c - rollback for speculative decoding (kvc_cache_config.reserve): a
   ROTATING cache keeps the pages of R positions beyond its window, a RECURRENT cache keeps
   per-token checkpoints of a draft, so that trims and rewinds by up to R tokens succeed
   after the window has wrapped and across batches. Every rewound state is compared with a
   fresh cache fed only the accepted tokens: attention outputs and states bit-identical
   (random K/V, queries and recurrences from a fresh seed each run; argv[1] replays one).
   Also: bad configurations refused with nothing created, pages used equal to the count the
   reserve implies, KVC_ERR_FULL leaving the cache as it was, snapshots, forks, save/load,
   and a model memory with a ROTATING and a RECURRENT group drafting and rolling back. */
#include <time.h>
#define KVCACHE_IMPLEMENTATION
#include "../kvcache.h"
#include "tk.h"

static unsigned long long g_seed;

/* a random float in [-1, 1) for (a, b, c, i), fixed by the run's seed */
static float rv(int64_t a, int64_t b, int64_t c, int64_t i) {
    unsigned long long x = g_seed ^ ((unsigned long long)a * 0x9E3779B97F4A7C15ull) ^
                           ((unsigned long long)b * 0xC2B2AE3D27D4EB4Full) ^
                           ((unsigned long long)c * 0x165667B19E3779F9ull) ^ ((unsigned long long)i * 0x27D4EB2F165667C5ull);
    x ^= x >> 30; x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 27; x *= 0x94D049BB133111EBull;
    x ^= x >> 31;
    return (float)((double)(x >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* ---- ROTATING: K/V and queries of token id `tok` at position `pos` ------------------- */
#define HK 2 /* kv heads */
#define HD 8 /* head dim */
#define ROW (HK * HD)
#define NQH 4 /* query heads (GQA 2:1) */
#define MAXT 512

static void kv_rows(const int32_t *tok, int32_t from, int32_t n, int32_t layer, float *k, float *v) {
    int32_t t, i;
    for (t = 0; t < n; ++t)
        for (i = 0; i < ROW; ++i) {
            k[t * ROW + i] = rv(tok[from + t], from + t, layer, i);
            v[t * ROW + i] = rv(tok[from + t], from + t, layer + 100, i);
        }
}

/* kvc_begin + put of tok[from .. from+n) in every layer of a K/V cache */
static kvc_result kv_feed(kvc_cache *c, const int32_t *tok, int32_t from, int32_t n, int32_t layers) {
    static float k[MAXT * ROW], v[MAXT * ROW];
    int32_t l;
    kvc_result r = kvc_begin(c, n, NULL, 0);
    if (r != KVC_OK) return r;
    for (l = 0; l < layers; ++l) {
        kv_rows(tok, from, n, l, k, v);
        if ((r = kvc_put(c, l, k, v)) != KVC_OK) return r;
    }
    return KVC_OK;
}

/* attention of nq queries (the last nq positions; random q from qseed) in `layer` */
static kvc_result kv_attend(const kvc_cache *c, int32_t layer, int32_t nq, int32_t qseed, float *out) {
    static float q[MAXT * NQH * HD];
    kvc_attention_desc a;
    int32_t i;
    for (i = 0; i < nq * NQH * HD; ++i) q[i] = rv(qseed, layer, 7, i);
    memset(&a, 0, sizeof(a));
    a.n_queries = nq;
    a.n_heads = NQH;
    a.q = q;
    a.out = out;
    return kvc_attention(c, layer, &a);
}

static kvc_pool *kv_pool(int32_t layers, int32_t page_cells, kvc_type type, int32_t pages) {
    kvc_pool_config pc;
    kvc_pool *p = NULL;
    size_t pb = 0;
    kvc_pool_config_init(&pc);
    pc.n_layers = layers;
    pc.n_kv_heads = HK;
    pc.head_dim_k = pc.head_dim_v = HD;
    pc.type_k = pc.type_v = type;
    pc.page_cells = page_cells;
    TK_OK(kvc_pool_page_bytes(&pc, &pb));
    pc.budget_bytes = pb * (size_t)pages;
    TK_OK(kvc_pool_create(&pc, &p));
    return p;
}

static int32_t pages_used(const kvc_pool *p) {
    kvc_pool_stats st;
    memset(&st, 0, sizeof(st));
    if (kvc_pool_stats_get(p, &st) != KVC_OK) return -1;
    return st.pages_used;
}

/* Whether c's view (the cells attention reads) and its attention for the last batch (nq
   queries; after a rewind: nq = 1) equal those of a fresh cache without a reserve fed
   tok[0 .. off - nq) in one batch and then tok[off - nq .. off) as its last batch. */
static int same_as_fresh(kvc_cache *c, kvc_pool *p, const kvc_cache_config *cc, const int32_t *tok, int32_t nq,
                         int32_t layers, int32_t qseed) {
    static float k1[MAXT * ROW], k2[MAXT * ROW], o1[MAXT * NQH * HD], o2[MAXT * NQH * HD];
    int32_t p1[MAXT], p2[MAXT], n1 = -1, n2 = -2, off = 0, l, ok = 1;
    kvc_cache_config fc = *cc;
    kvc_cache *r = NULL;
    fc.reserve = 0;
    if (kvc_cache_offset(c, &off) != KVC_OK || nq > off || kvc_cache_create(p, &fc, &r) != KVC_OK) return 0;
    if (off - nq > 0 && kv_feed(r, tok, 0, off - nq, layers) != KVC_OK) ok = 0;
    if (ok && kv_feed(r, tok, off - nq, nq, layers) != KVC_OK) ok = 0;
    for (l = 0; ok && l < layers; ++l) {
        if (kvc_cache_gather(c, l, k1, NULL, p1, MAXT, &n1) != KVC_OK) ok = 0;
        if (kvc_cache_gather(r, l, k2, NULL, p2, MAXT, &n2) != KVC_OK) ok = 0;
        if (!ok || n1 != n2 || memcmp(p1, p2, sizeof(int32_t) * (size_t)n1) != 0 ||
            memcmp(k1, k2, sizeof(float) * (size_t)n1 * ROW) != 0)
            ok = 0;
        if (ok && (kv_attend(c, l, nq, qseed, o1) != KVC_OK || kv_attend(r, l, nq, qseed, o2) != KVC_OK)) ok = 0;
        if (ok && memcmp(o1, o2, sizeof(float) * (size_t)(nq * NQH * HD)) != 0) ok = 0;
    }
    kvc_cache_destroy(r);
    return ok;
}

static void test_config(void) {
    kvc_pool *p = kv_pool(1, 4, KVC_TYPE_F32, 8);
    kvc_cache_config cc;
    kvc_cache *c = NULL;
    const char *field = NULL;
    kvc_kind kinds[2] = {KVC_KIND_FULL, KVC_KIND_CAUSAL};
    int i;
    for (i = 0; i < 2; ++i) { /* FULL rewinds anyway; CAUSAL has no rollback */
        kvc_cache_config_init(&cc, kinds[i]);
        cc.capacity = kinds[i] == KVC_KIND_CAUSAL ? 8 : 0;
        cc.reserve = 1;
        TK_RES(kvc_cache_config_check(p, &cc, &field), KVC_ERR_INVALID);
        TK_CHECK(field != NULL && strcmp(field, "reserve") == 0);
        TK_RES(kvc_cache_create(p, &cc, &c), KVC_ERR_INVALID);
        TK_CHECK(c == NULL);
    }
    kvc_cache_config_init(&cc, KVC_KIND_ROTATING);
    cc.window = 4;
    cc.reserve = -1;
    TK_RES(kvc_cache_config_check(p, &cc, &field), KVC_ERR_INVALID);
    TK_CHECK(field != NULL && strcmp(field, "reserve") == 0);
    TK_RES(kvc_cache_create(p, &cc, &c), KVC_ERR_INVALID);
    cc.reserve = (1 << 24) + 1;
    TK_RES(kvc_cache_create(p, &cc, &c), KVC_ERR_INVALID);
    cc.reserve = 1 << 24;
    TK_OK(kvc_cache_config_check(p, &cc, &field));
    TK_CHECK(field == NULL);
    {
        kvc_pool_stats st;
        memset(&st, 0, sizeof(st));
        TK_OK(kvc_pool_stats_get(p, &st));
        TK_EQ(st.live_caches, 0); /* nothing was created by the refusals */
        TK_EQ(st.pages_used, 0);
    }
    TK_OK(kvc_pool_destroy(p));
    {   /* a state pool: 0 .. 4096 */
        kvc_pool_config pc;
        kvc_pool_config_init(&pc);
        pc.n_layers = 1;
        pc.state_floats = 4;
        pc.budget_bytes = 4096;
        TK_OK(kvc_pool_create(&pc, &p));
        kvc_cache_config_init(&cc, KVC_KIND_RECURRENT);
        cc.reserve = 4097;
        TK_RES(kvc_cache_config_check(p, &cc, &field), KVC_ERR_INVALID);
        TK_CHECK(field != NULL && strcmp(field, "reserve") == 0);
        cc.reserve = 4096;
        TK_OK(kvc_cache_create(p, &cc, &c));
        TK_OK(kvc_cache_destroy(c));
        TK_OK(kvc_pool_destroy(p));
    }
}

/* Pages a ROTATING cache holds after batches that only went forward, the last one
   [o, e): the sink pages, and the window pages from the one holding the oldest token
   the reserve keeps (window_lo(o) - R) to the one holding e - 1. */
static int32_t expect_pages(const kvc_cache_config *cc, int32_t pc, int32_t o, int32_t e) {
    int32_t nsp = (cc->sinks + pc - 1) / pc, last = (e - 1) / pc, first;
    int64_t keep = (int64_t)o - (cc->window - cc->sinks) + 1 - cc->reserve;
    int32_t sinks_held = TK_MIN(nsp, last + 1);
    first = keep > 0 ? (int32_t)(keep / pc) : 0;
    first = TK_MAX(first, nsp);
    return sinks_held + TK_MAX(0, last - first + 1);
}

/* Decode one token at a time far past the window: pages used follow the reserve exactly,
   then the cache trims by every j <= R and equals a fresh cache fed the accepted tokens. */
static void test_rotating_decode(tk_rng *rng) {
    int32_t tok[MAXT], pc = tk_int(rng, 1, 5), t, j, R = tk_int(rng, 1, 9), n = 40, layers = 2;
    kvc_pool *p = kv_pool(layers, pc, tk_pct(rng, 50) ? KVC_TYPE_F16 : KVC_TYPE_F32, 64);
    kvc_cache_config cc;
    kvc_cache *c = NULL, *z = NULL;
    int can = -1;
    kvc_cache_config_init(&cc, KVC_KIND_ROTATING);
    cc.window = tk_int(rng, 2, 10);
    cc.sinks = tk_pct(rng, 30) ? tk_int(rng, 0, cc.window - 1) : 0;
    cc.reserve = R;
    for (t = 0; t < MAXT; ++t) tok[t] = tk_int(rng, 0, 999);
    TK_OK(kvc_cache_create(p, &cc, &c));
    {   /* the same without a reserve: today's page count */
        kvc_cache_config zc = cc;
        zc.reserve = 0;
        TK_OK(kvc_cache_create(p, &zc, &z));
        for (t = 0; t < n; ++t) {
            int32_t a = -1, b = -1;
            TK_OK(kv_feed(c, tok, t, 1, layers));
            TK_OK(kv_feed(z, tok, t, 1, layers));
            TK_OK(kvc_cache_pages(c, &a));
            TK_OK(kvc_cache_pages(z, &b));
            TK_EQ(a, expect_pages(&cc, pc, t, t + 1));
            TK_EQ(b, expect_pages(&zc, pc, t, t + 1));
            TK_EQ(pages_used(p), a + b);
        }
        TK_OK(kvc_cache_can_trim(z, &can));
        TK_EQ(can, 0); /* wrapped, no reserve: as before */
        TK_RES(kvc_cache_trim(z, 1), KVC_ERR_UNREACHABLE);
        TK_OK(kvc_cache_destroy(z));
    }
    TK_OK(kvc_cache_can_trim(c, &can));
    TK_EQ(can, 1);
    for (j = 0; j <= R; ++j) { /* every target within R: reachable, and exactly the fresh window */
        TK_OK(kvc_cache_can_rewind(c, n - j, &can));
        TK_EQ(can, 1);
    }
    for (j = R + 1; j <= n; ++j) { /* beyond: reachable while every page of its window is held */
        int32_t target = n - j, lo = TK_MAX(cc.sinks, target - (cc.window - cc.sinks));
        int32_t nsp = (cc.sinks + pc - 1) / pc, keep = (n - 1) - (cc.window - cc.sinks) + 1 - R;
        int32_t first = TK_MAX(nsp, keep > 0 ? keep / pc : 0); /* the first window page held */
        int want = first == nsp || lo >= target || lo >= first * pc || target <= nsp * pc;
        TK_OK(kvc_cache_can_rewind(c, target, &can));
        TK_EQ(can, want);
    }
    j = tk_int(rng, 1, R);
    TK_OK(kvc_cache_trim(c, j));
    TK_CHECK(same_as_fresh(c, p, &cc, tok, 1, layers, 1));
    /* continue with other tokens: the same as a cache that never drafted */
    for (t = n - j; t < n + 3; ++t) tok[t] = tk_int(rng, 0, 999);
    TK_OK(kv_feed(c, tok, n - j, j + 3, layers));
    TK_CHECK(same_as_fresh(c, p, &cc, tok, j + 3, layers, 2));
    TK_OK(kvc_cache_destroy(c));
    TK_EQ(pages_used(p), 0);
    TK_OK(kvc_pool_destroy(p));
}

/* Random drafts on a ROTATING cache with a reserve: batches of random sizes (a draft of k
   in one batch or in several), trims and rewinds to any target >= m - R (m: the furthest
   offset reached), snapshots there, continuing; after every step the cache equals a fresh
   cache fed the accepted tokens. */
static void test_rotating_random(tk_rng *rng) {
    int32_t tok[MAXT], pc = tk_int(rng, 1, 6), R = tk_int(rng, 1, 8), layers = 2, off = 0, last = 1, step, t, m = 0;
    kvc_pool *p = kv_pool(layers, pc, tk_pct(rng, 50) ? KVC_TYPE_F16 : KVC_TYPE_F32, 400);
    kvc_cache_config cc;
    kvc_cache *c = NULL;
    kvc_cache_config_init(&cc, KVC_KIND_ROTATING);
    cc.window = tk_int(rng, 1, 12);
    cc.sinks = tk_pct(rng, 30) ? tk_int(rng, 0, cc.window - 1) : 0;
    cc.reserve = R;
    TK_OK(kvc_cache_create(p, &cc, &c));
    for (t = 0; t < MAXT; ++t) tok[t] = tk_int(rng, 0, 999);
    for (step = 0; step < tk_scaled(60) && off < MAXT - 40; ++step) {
        int op = tk_int(rng, 0, 9);
        if (op < 5 || off == 0) { /* a batch */
            int32_t n = tk_int(rng, 1, tk_pct(rng, 20) ? 24 : R + 2);
            for (t = off; t < off + n; ++t) tok[t] = tk_int(rng, 0, 999);
            TK_OK(kv_feed(c, tok, off, n, layers));
            off += n;
            m = TK_MAX(m, off);
            last = n;
            TK_CHECK(same_as_fresh(c, p, &cc, tok, n, layers, step));
        } else if (op < 8) { /* reject j <= R drafted tokens */
            int32_t j = tk_int(rng, 0, TK_MIN(off, off - (m - R)));
            int can = -1, trim = tk_pct(rng, 50);
            TK_OK(kvc_cache_can_rewind(c, off - j, &can));
            TK_EQ(can, 1);
            if (trim) TK_OK(kvc_cache_trim(c, j));
            else TK_OK(kvc_cache_restore(c, NULL, off - j));
            off -= j;
            /* the view after a rewind is the window of one query at off - 1; a trim by 0 or
               a restore to the offset itself leaves the cache as it was */
            if (j > 0) last = 1;
            if (off > 0) TK_CHECK(same_as_fresh(c, p, &cc, tok, last, layers, step));
        } else if (op == 9 && off > 0) { /* save and load: the same view, the same targets reachable */
            kvc_mem mem;
            kvc_io io;
            kvc_namespace ns = {3, 4};
            kvc_cache *d = NULL;
            int32_t tt;
            memset(&mem, 0, sizeof(mem));
            TK_OK(kvc_io_memory(&mem, &io));
            TK_OK(kvc_cache_save(c, ns, NULL, 0, &io)); /* counts the bytes */
            mem.data = (unsigned char *)malloc(mem.size);
            mem.capacity = mem.size;
            mem.size = 0;
            TK_OK(kvc_cache_save(c, ns, NULL, 0, &io));
            TK_OK(kvc_cache_create(p, &cc, &d));
            TK_OK(kvc_cache_load(d, ns, &io, NULL, 0, NULL));
            TK_CHECK(same_as_fresh(d, p, &cc, tok, last, layers, step + 2000));
            for (tt = 0; tt <= off; ++tt) {
                int a = -1, b = -2;
                TK_OK(kvc_cache_can_rewind(c, tt, &a));
                TK_OK(kvc_cache_can_rewind(d, tt, &b));
                TK_EQ(a, b);
            }
            TK_OK(kvc_cache_destroy(d));
            free(mem.data);
        } else if (off > 0) { /* a snapshot of a target in the reserve, restored elsewhere */
            int32_t j = tk_int(rng, 0, TK_MIN(off, off - (m - R))), target = off - j;
            kvc_snapshot *s = NULL;
            kvc_cache *d = NULL;
            if (target == 0) continue;
            TK_OK(kvc_snapshot_take(c, 0, target, &s));
            TK_CHECK(s != NULL);
            TK_OK(kvc_cache_create(p, &cc, &d));
            if (s != NULL) {
                if (j > 0) { /* the snapshot holds the reserve too: a restore below its end */
                    int32_t j2 = tk_int(rng, 0, TK_MIN(target, target - (m - R)));
                    TK_OK(kvc_cache_restore(d, s, target - j2));
                    if (target - j2 > 0) TK_CHECK(same_as_fresh(d, p, &cc, tok, 1, layers, step + 1000));
                } else {
                    TK_OK(kvc_cache_restore(d, s, target));
                }
            }
            TK_OK(kvc_snapshot_free(s));
            TK_OK(kvc_cache_destroy(d));
        }
    }
    TK_OK(kvc_cache_destroy(c));
    TK_EQ(pages_used(p), 0);
    TK_OK(kvc_pool_destroy(p));
}

/* The reserve's pages count in the budget: a begin that needs one page more than the
   pool has fails with KVC_ERR_FULL and changes nothing; a fork and save/load keep it. */
static void test_rotating_budget(void) {
    int32_t tok[64], t, pages = -1, off = -1, n = 0, before, want_pages;
    kvc_pool *p;
    kvc_cache_config cc;
    kvc_cache *c = NULL, *f = NULL;
    kvc_result r = KVC_OK;
    for (t = 0; t < 64; ++t) tok[t] = t * 3 + 1;
    kvc_cache_config_init(&cc, KVC_KIND_ROTATING);
    cc.window = 4;
    cc.reserve = 4;
    /* page_cells 2: decode holds at most ceil((W - 1 + R + 1) / 2) + 1 = 5 pages; a pool of 4 runs out */
    p = kv_pool(1, 2, KVC_TYPE_F32, 4);
    TK_OK(kvc_cache_create(p, &cc, &c));
    while (n < 64 && (r = kv_feed(c, tok, n, 1, 1)) == KVC_OK) n++;
    TK_RES(r, KVC_ERR_FULL);
    TK_OK(kvc_cache_offset(c, &off));
    TK_EQ(off, n); /* nothing changed */
    TK_OK(kvc_cache_pages(c, &pages));
    TK_EQ(pages, 4);
    TK_EQ(pages_used(p), 4);
    want_pages = expect_pages(&cc, 2, n, n + 1); /* what the failed begin needed */
    TK_EQ(want_pages, 5);
    TK_OK(kvc_cache_destroy(c));
    TK_OK(kvc_pool_destroy(p));

    p = kv_pool(1, 2, KVC_TYPE_F32, 64);
    TK_OK(kvc_cache_create(p, &cc, &c));
    for (n = 0; n < 20; ++n) TK_OK(kv_feed(c, tok, n, 1, 1));
    before = pages_used(p);
    TK_OK(kvc_cache_fork(c, &f)); /* shares every page, the reserve's too */
    TK_EQ(pages_used(p), before);
    TK_OK(kvc_cache_trim(f, 4));
    TK_CHECK(same_as_fresh(f, p, &cc, tok, 1, 1, 6));
    TK_OK(kvc_cache_destroy(f));
    {   /* save keeps the pages the cache holds (window and reserve); a load into a cache
           with a reserve can then roll back as the original could, one without cannot */
        kvc_mem mem;
        kvc_io io;
        kvc_namespace ns = {1, 2};
        kvc_cache_config zc = cc;
        memset(&mem, 0, sizeof(mem));
        TK_OK(kvc_io_memory(&mem, &io));
        TK_OK(kvc_cache_save(c, ns, tok, 20, &io));
        mem.data = (unsigned char *)malloc(mem.size);
        mem.capacity = mem.size;
        mem.size = 0;
        TK_OK(kvc_cache_save(c, ns, tok, 20, &io));
        TK_OK(kvc_cache_create(p, &cc, &f));
        mem.pos = 0;
        TK_OK(kvc_cache_load(f, ns, &io, NULL, 0, NULL));
        TK_OK(kvc_cache_trim(f, 4));
        TK_CHECK(same_as_fresh(f, p, &cc, tok, 1, 1, 7));
        TK_OK(kvc_cache_destroy(f));
        zc.reserve = 0;
        TK_OK(kvc_cache_create(p, &zc, &f));
        mem.pos = 0;
        TK_OK(kvc_cache_load(f, ns, &io, NULL, 0, NULL));
        TK_RES(kvc_cache_trim(f, 1), KVC_ERR_UNREACHABLE);
        TK_OK(kv_feed(f, tok, 20, 1, 1)); /* and it drops the extra pages at its next batch */
        TK_CHECK(same_as_fresh(f, p, &zc, tok, 1, 1, 8));
        TK_OK(kvc_cache_pages(f, &pages));
        TK_EQ(pages, expect_pages(&zc, 2, 20, 21));
        TK_OK(kvc_cache_destroy(f));
        free(mem.data);
    }
    TK_OK(kvc_cache_destroy(c));
    TK_EQ(pages_used(p), 0);
    TK_OK(kvc_pool_destroy(p));
}

/* ---- RECURRENT: a random recurrence (state = a * state + x(token, layer)) ------------- */
#define NS 5
#define SL 2 /* layers */

static void rstep(float *st, int32_t tok, int32_t layer) {
    int32_t i;
    for (i = 0; i < NS; ++i) st[i] = st[i] * (0.5f + 0.25f * rv(9, layer, i, 0)) + rv(tok, layer, 3, i);
}

static void rref(const int32_t *tok, int32_t n, int32_t layer, float *out) {
    int32_t t;
    memset(out, 0, sizeof(float) * NS);
    for (t = 0; t < n; ++t) rstep(out, tok[t], layer);
}

/* a batch tok[off .. off+n): the engine hands over the state after every token (the
   cache takes those it asked for: named ones and the reserve's; the others are
   refused with KVC_ERR_NOT_FOUND); skip_layer >= 0 hands nothing over for that layer */
static kvc_result rfeed(kvc_cache *c, const int32_t *tok, int32_t off, int32_t n, const int32_t *at, int32_t n_at,
                        int32_t skip_layer) {
    int32_t l, t;
    kvc_result r = kvc_begin(c, n, at, n_at);
    if (r != KVC_OK) return r;
    for (l = 0; l < SL; ++l) {
        float *st;
        if ((r = kvc_state(c, 0, l, &st)) != KVC_OK) return r;
        for (t = off; t < off + n; ++t) {
            rstep(st, tok[t], l);
            if (l != skip_layer) {
                r = kvc_state_checkpoint(c, l, t + 1, st);
                if (r != KVC_OK && r != KVC_ERR_NOT_FOUND) return r;
            }
        }
    }
    return KVC_OK;
}

static int rstate_is(const kvc_cache *c, const int32_t *tok, int32_t n) {
    int32_t l;
    for (l = 0; l < SL; ++l) {
        const float *st;
        float want[NS];
        if (kvc_state_read(c, 0, l, &st) != KVC_OK || st == NULL) return 0;
        rref(tok, n, l, want);
        if (memcmp(st, want, sizeof(want)) != 0) return 0;
    }
    return 1;
}

static kvc_pool *rpool(int32_t pages) {
    kvc_pool_config pc;
    kvc_pool *p = NULL;
    size_t pb = 0;
    kvc_pool_config_init(&pc);
    pc.n_layers = SL;
    pc.state_floats = NS;
    TK_OK(kvc_pool_page_bytes(&pc, &pb));
    pc.budget_bytes = pb * (size_t)pages;
    TK_OK(kvc_pool_create(&pc, &p));
    return p;
}

static void test_recurrent(tk_rng *rng) {
    int32_t tok[MAXT], R = tk_int(rng, 1, 6), t, j, off, n_at = 0, at[16], m;
    kvc_pool *p = rpool(64);
    kvc_cache_config cc;
    kvc_cache *c = NULL;
    int can = -1;
    for (t = 0; t < MAXT; ++t) tok[t] = tk_int(rng, 0, 999);
    kvc_cache_config_init(&cc, KVC_KIND_RECURRENT);
    cc.reserve = R;
    cc.checkpoints = 2;
    TK_OK(kvc_cache_create(p, &cc, &c));
    /* the prompt, 10 tokens with a named checkpoint at its end (prefix reuse) */
    at[0] = 10;
    TK_OK(rfeed(c, tok, 0, 10, at, 1, -1));
    off = 10;
    /* decode far past R, one token a batch: each begin keeps the start's state */
    for (t = 0; t < 3 * R + 2; ++t, ++off) TK_OK(rfeed(c, tok, off, 1, NULL, 0, -1));
    TK_OK(kvc_cache_checkpoints(c, NULL, 0, &n_at));
    TK_EQ(n_at, R + 1); /* the reserve's R, and the named one at 10 */
    TK_OK(kvc_cache_checkpoints(c, at, 16, &n_at));
    TK_EQ(at[0], 10);
    TK_EQ(pages_used(p), 1 + R + 1); /* the live state + one per checkpoint, nothing else */
    for (j = 0; j <= R; ++j) {
        TK_OK(kvc_cache_can_rewind(c, off - j, &can));
        TK_EQ(can, 1);
    }
    TK_OK(kvc_cache_can_rewind(c, off - R - 1, &can));
    TK_EQ(can, 0);
    TK_RES(kvc_cache_trim(c, R + 1), KVC_ERR_UNREACHABLE); /* beyond the reserve: nothing changed */
    TK_CHECK(rstate_is(c, tok, off));
    m = off; /* the furthest offset reached */
    j = tk_int(rng, 0, R);
    TK_OK(kvc_cache_trim(c, j));
    off -= j;
    TK_CHECK(rstate_is(c, tok, off));
    for (t = off; t < off + 8; ++t) tok[t] = tk_int(rng, 0, 999); /* the right tokens */
    /* a draft of k in one batch: the reserve's checkpoints are the batch's last R offsets
       (and its start when k <= R); with earlier batches', every offset >= m - R */
    {
        int32_t k = tk_int(rng, 1, 8);
        TK_OK(rfeed(c, tok, off, k, NULL, 0, -1));
        off += k;
        m = TK_MAX(m, off);
        for (t = 0; t <= off; ++t) {
            TK_OK(kvc_cache_can_rewind(c, t, &can));
            TK_EQ(can, t >= m - R || t == 10 || t == 0); /* 0: clearing */
        }
        j = tk_int(rng, 0, off - (m - R));
        {
            kvc_snapshot *s = NULL;
            TK_OK(kvc_snapshot_take(c, 0, off - j, &s)); /* a reserve checkpoint as a snapshot */
            TK_CHECK(s != NULL);
            TK_OK(kvc_cache_trim(c, j));
            off -= j;
            TK_CHECK(rstate_is(c, tok, off));
            TK_OK(kvc_cache_restore(c, s, off));
            TK_CHECK(rstate_is(c, tok, off));
            TK_OK(kvc_snapshot_free(s));
        }
        TK_OK(rfeed(c, tok, off, 2, NULL, 0, -1));
        off += 2;
        TK_CHECK(rstate_is(c, tok, off));
    }
    /* a layer not handed over: none of the batch's offsets is kept (and its start, more
       than R before its end, is not a reserve checkpoint) */
    {
        int32_t k = R + 2;
        TK_OK(rfeed(c, tok, off, k, NULL, 0, 1));
        off += k;
        for (j = 1; j <= R; ++j) {
            TK_OK(kvc_cache_can_rewind(c, off - j, &can));
            TK_EQ(can, 0);
        }
        TK_OK(kvc_cache_can_rewind(c, at[0], &can)); /* the named prompt end: still there */
        TK_EQ(can, 1);
    }
    /* a fork shares the reserve checkpoints; a snapshot carries them into a cache without a
       reserve, which keeps only its named ones */
    {
        kvc_cache *f = NULL, *z = NULL;
        kvc_snapshot *s = NULL;
        kvc_cache_config zc = cc;
        int32_t before = pages_used(p), n_z = -1;
        TK_OK(rfeed(c, tok, off, 1, NULL, 0, -1));
        off += 1;
        before = pages_used(p);
        TK_OK(kvc_cache_fork(c, &f));
        TK_EQ(pages_used(p), before);
        TK_OK(kvc_cache_trim(f, 1));
        TK_CHECK(rstate_is(f, tok, off - 1));
        TK_CHECK(rstate_is(c, tok, off));
        TK_OK(kvc_cache_destroy(f));
        TK_OK(kvc_snapshot_take(c, 0, KVC_POS_END, &s));
        zc.reserve = 0;
        TK_OK(kvc_cache_create(p, &zc, &z));
        TK_OK(kvc_cache_restore(z, s, off));
        TK_CHECK(rstate_is(z, tok, off));
        TK_OK(kvc_cache_checkpoints(z, NULL, 0, &n_z));
        TK_EQ(n_z, 1); /* the named one at 10 */
        TK_RES(kvc_cache_trim(z, 1), KVC_ERR_UNREACHABLE);
        TK_OK(kvc_cache_destroy(z));
        TK_OK(kvc_snapshot_free(s));
    }
    /* the named checkpoint outlives the reserve's: back to the prompt */
    TK_OK(kvc_cache_restore(c, NULL, 10));
    TK_CHECK(rstate_is(c, tok, 10));
    TK_OK(kvc_cache_destroy(c));
    TK_EQ(pages_used(p), 0);
    TK_OK(kvc_pool_destroy(p));
    {   /* KVC_ERR_FULL all or nothing: the reserve's checkpoints need pages */
        kvc_pool *q = rpool(3);
        int32_t used;
        cc.reserve = 4;
        TK_OK(kvc_cache_create(q, &cc, &c));
        TK_OK(rfeed(c, tok, 0, 1, NULL, 0, -1)); /* 1 page: the state */
        TK_OK(rfeed(c, tok, 1, 1, NULL, 0, -1)); /* + the start's (shared, then copied): 2 */
        TK_EQ(pages_used(q), 2);
        used = pages_used(q);
        TK_RES(rfeed(c, tok, 2, 3, NULL, 0, -1), KVC_ERR_FULL); /* copy + 2 inside = 3 > 1 free */
        TK_EQ(pages_used(q), used);
        TK_OK(kvc_cache_offset(c, &off));
        TK_EQ(off, 2);
        TK_CHECK(rstate_is(c, tok, 2));
        TK_OK(kvc_cache_destroy(c));
        TK_OK(kvc_pool_destroy(q));
    }
}

/* ---- a model memory: RECURRENT (R 4) + ROTATING (window 8, R 4), drafts rolled back -- */
#define MR 4

static void mem_config(kvc_memory_config *mc, kvc_group_config g[2], int32_t map[4], int32_t page_cells) {
    int32_t l;
    kvc_memory_config_init(mc);
    for (l = 0; l < 4; ++l) map[l] = l % 2;
    memset(g, 0, sizeof(kvc_group_config) * 2);
    g[0].pool.n_layers = 2;
    g[0].pool.state_floats = NS;
    kvc_cache_config_init(&g[0].cache, KVC_KIND_RECURRENT);
    g[0].cache.reserve = MR;
    g[1].pool.n_layers = 2;
    g[1].pool.n_kv_heads = HK;
    g[1].pool.head_dim_k = g[1].pool.head_dim_v = HD;
    g[1].pool.type_k = g[1].pool.type_v = KVC_TYPE_F32;
    g[1].pool.page_cells = page_cells;
    kvc_cache_config_init(&g[1].cache, KVC_KIND_ROTATING);
    g[1].cache.window = 8;
    g[1].cache.reserve = MR;
    mc->n_layers = 4;
    mc->layer_group = map;
    mc->n_groups = 2;
    mc->groups = g;
    mc->budget_bytes = 1 << 20;
}

/* one forward pass of the toy hybrid model: attention outputs of the batch's queries
   (layers 1 and 3) go to out[layer / 2] */
static kvc_result mem_feed(kvc_memory *m, const int32_t *tok, int32_t off, int32_t n, float *out0, float *out1) {
    static float k[MAXT * ROW], v[MAXT * ROW], q[MAXT * NQH * HD];
    int32_t l, t, i;
    kvc_result r = kvc_memory_begin(m, n, NULL, 0);
    if (r != KVC_OK) return r;
    for (l = 0; l < 4; ++l) {
        if (l % 2 == 0) {
            float *st;
            if ((r = kvc_memory_state(m, l, 0, &st)) != KVC_OK) return r;
            for (t = off; t < off + n; ++t) {
                rstep(st, tok[t], l / 2);
                r = kvc_memory_state_checkpoint(m, l, t + 1, st); /* the reserve asks for the last MR */
                if (r != KVC_OK && r != KVC_ERR_NOT_FOUND) return r;
            }
        } else {
            kvc_attention_desc a;
            kv_rows(tok, off, n, l, k, v);
            if ((r = kvc_memory_put(m, l, k, v)) != KVC_OK) return r;
            for (i = 0; i < n * NQH * HD; ++i) q[i] = rv(tok[off + i / (NQH * HD)], off + i / (NQH * HD), l + 50, i % (NQH * HD));
            memset(&a, 0, sizeof(a));
            a.n_queries = n;
            a.n_heads = NQH;
            a.q = q;
            a.out = l == 1 ? out0 : out1;
            if ((r = kvc_memory_attention(m, l, &a)) != KVC_OK) return r;
        }
    }
    return KVC_OK;
}

static int mem_states_are(const kvc_memory *m, const int32_t *tok, int32_t n) {
    kvc_cache *c = NULL;
    return kvc_memory_group(m, 0, &c) == KVC_OK && rstate_is(c, tok, n);
}

/* draft k tokens (one batch, or k batches of one) of which the last j are wrong, trim
   them, continue with the right ones: every output equals a memory that never drafted */
static void test_memory_draft(tk_rng *rng) {
    int32_t right[MAXT], draft[MAXT], map[4], t, trial;
    kvc_memory_config mc;
    kvc_group_config g[2];
    static float a0[MAXT * NQH * HD], a1[MAXT * NQH * HD], b0[MAXT * NQH * HD], b1[MAXT * NQH * HD];
    for (trial = 0; trial < tk_scaled(40); ++trial) {
        kvc_memory *m = NULL, *ref = NULL;
        int32_t prompt = tk_int(rng, 1, 30), k = tk_int(rng, 1, 8), j = tk_int(rng, 0, TK_MIN(k, MR)), off, n_cont;
        int one_batch = tk_pct(rng, 50), can = -1, ok = 1;
        const char *field = NULL;
        mem_config(&mc, g, map, tk_int(rng, 1, 5));
        TK_OK(kvc_memory_config_check(&mc, &field));
        TK_OK(kvc_memory_create(&mc, &m));
        TK_OK(kvc_memory_create(&mc, &ref));
        for (t = 0; t < MAXT; ++t) right[t] = draft[t] = tk_int(rng, 0, 999);
        for (t = prompt + k - j; t < prompt + k; ++t) draft[t] = right[t] + 1000; /* the wrong ones */
        TK_OK(mem_feed(m, right, 0, prompt, a0, a1));
        if (one_batch) {
            TK_OK(mem_feed(m, draft, prompt, k, a0, a1));
        } else {
            for (t = prompt; t < prompt + k; ++t) TK_OK(mem_feed(m, draft, t, 1, a0, a1));
        }
        off = prompt + k;
        TK_OK(kvc_memory_can_rewind(m, off - j, &can));
        TK_EQ(can, 1);
        {
            int32_t rp = -1;
            TK_OK(kvc_memory_rewind_point(m, off - j, &rp));
            TK_EQ(rp, off - j);
        }
        TK_OK(kvc_memory_trim(m, j));
        off -= j;
        TK_CHECK(mem_states_are(m, right, off));
        /* continue with the right tokens; the reference never drafted */
        n_cont = tk_int(rng, 1, 4);
        TK_OK(mem_feed(m, right, off, n_cont, a0, a1));
        TK_OK(mem_feed(ref, right, 0, off, b0, b1));
        TK_OK(mem_feed(ref, right, off, n_cont, b0, b1));
        off += n_cont;
        TK_CHECK(mem_states_are(m, right, off));
        TK_CHECK(mem_states_are(ref, right, off));
        ok = memcmp(a0, b0, sizeof(float) * (size_t)(n_cont * NQH * HD)) == 0 &&
             memcmp(a1, b1, sizeof(float) * (size_t)(n_cont * NQH * HD)) == 0;
        if (!ok) fprintf(stderr, "trial %d: prompt %d k %d j %d one_batch %d: attention differs\n", trial, prompt, k, j, one_batch);
        TK_CHECK(ok);
        TK_OK(kvc_memory_destroy(m));
        TK_OK(kvc_memory_destroy(ref));
    }
    {   /* a group's bad reserve: refused by the check and by create */
        kvc_memory *m = NULL;
        const char *field = NULL;
        mem_config(&mc, g, map, 4);
        g[1].cache.reserve = -2;
        TK_RES(kvc_memory_config_check(&mc, &field), KVC_ERR_INVALID);
        TK_CHECK(field != NULL && strcmp(field, "groups.cache.reserve") == 0);
        TK_RES(kvc_memory_create(&mc, &m), KVC_ERR_INVALID);
        TK_CHECK(m == NULL);
        g[1].cache.reserve = 0;
        g[1].cache.kind = KVC_KIND_FULL;
        g[1].cache.window = 0;
        g[1].cache.reserve = 1;
        TK_RES(kvc_memory_config_check(&mc, &field), KVC_ERR_INVALID);
        TK_CHECK(field != NULL && strcmp(field, "groups.cache.reserve") == 0);
    }
}

/* The memory's joint budget with reserves is exact: decoding one token a batch, the bytes
   in use after every step are the ROTATING group's pages (expect_pages) plus the RECURRENT
   group's live state and min(o, R) reserve checkpoints; a step fails with KVC_ERR_FULL,
   changing nothing, exactly when that count would exceed the budget. */
static void test_memory_budget(void) {
    int32_t tok[64], map[4], t, pc = 2;
    kvc_memory_config mc;
    kvc_group_config g[2];
    static float a0[NQH * HD], a1[NQH * HD];
    size_t sp = 0, kp = 0, cut;
    for (t = 0; t < 64; ++t) tok[t] = t * 5 + 2;
    mem_config(&mc, g, map, pc);
    g[0].pool.budget_bytes = g[1].pool.budget_bytes = 0;
    TK_OK(kvc_pool_page_bytes(&g[0].pool, &sp));
    TK_OK(kvc_pool_page_bytes(&g[1].pool, &kp));
    for (cut = 0; cut < 3; ++cut) {
        kvc_memory *m = NULL;
        kvc_memory_stats st;
        kvc_result r = KVC_OK;
        memset(&st, 0, sizeof(st));
        size_t want = 0, prev = 0;
        int32_t off = -1;
        /* budgets: roomy; the steady state's peak less one byte; one page less again */
        mc.budget_bytes = cut == 0 ? ((size_t)1 << 20) : (1 + MR) * sp + 6 * kp - (cut == 1 ? 1 : kp);
        TK_OK(kvc_memory_create(&mc, &m));
        for (t = 0; t < 40; ++t) {
            want = sp * (size_t)(1 + TK_MIN(t, MR)) + kp * (size_t)expect_pages(&g[1].cache, pc, t, t + 1);
            r = mem_feed(m, tok, t, 1, a0, a1);
            TK_OK(kvc_memory_stats_get(m, &st));
            if (r != KVC_OK) break;
            TK_EQ(st.bytes_used, want);
            prev = want;
        }
        if (cut == 0) {
            TK_OK(r);
        } else { /* refused exactly when the step needs more than the budget */
            TK_RES(r, KVC_ERR_FULL);
            TK_CHECK(want > mc.budget_bytes);
            TK_CHECK(prev <= mc.budget_bytes);
            TK_EQ(st.bytes_used, prev);
            TK_OK(kvc_memory_offset(m, &off));
            TK_EQ(off, t);
            TK_CHECK(mem_states_are(m, tok, t));
        }
        TK_OK(kvc_memory_destroy(m));
    }
}

int main(int argc, char **argv) {
    tk_rng rng;
    int i;
    g_seed = argc > 1 ? strtoull(argv[1], NULL, 10) : (unsigned long long)time(NULL);
    printf("seed %llu\n", g_seed);
    rng.s = g_seed * 0x9E3779B97F4A7C15ull + 1;
    test_config();
    for (i = 0; i < tk_scaled(30); ++i) test_rotating_decode(&rng);
    for (i = 0; i < tk_scaled(30); ++i) test_rotating_random(&rng);
    test_rotating_budget();
    for (i = 0; i < tk_scaled(20); ++i) test_recurrent(&rng);
    test_memory_draft(&rng);
    test_memory_budget();
    return tk_report("test_reserve");
}
