/* test_hybrid.c - the pieces hybrid models need: state pools and RECURRENT caches,
   checkpoints inside a batch (RECURRENT and ROTATING), snapshots restored into another
   cache, and model memories (one budget over layer groups, all-or-nothing operations,
   prefix reuse through checkpoints). Contents are checked exactly: a toy recurrence
   (state = state * 0.5 + token value) and encoded K/V values. */
#include <stdlib.h>
#include <time.h>
#define KVCACHE_IMPLEMENTATION
#include "../kvcache.h"
#include "tk.h"

/* ---- a toy recurrent layer: state[i] = state[i] / 2 + x(token, layer, i) ------------ */
#define NS 6 /* floats of state per layer */
static float xval(int32_t token, int32_t layer, int32_t i) { return (float)((token * 7 + layer * 3 + i) % 17 - 8); }
static void step(float *st, int32_t token, int32_t layer) {
    int32_t i;
    for (i = 0; i < NS; ++i) st[i] = st[i] * 0.5f + xval(token, layer, i);
}
/* the state after tokens[0..n) from zeros */
static void ref_state(const int32_t *tokens, int32_t n, int32_t layer, float *out) {
    int32_t t;
    memset(out, 0, sizeof(float) * NS);
    for (t = 0; t < n; ++t) step(out, tokens[t], layer);
}

static kvc_pool *state_pool(int32_t layers, int32_t pages) {
    kvc_pool_config pc;
    kvc_pool *p = NULL;
    kvc_pool_config_init(&pc);
    pc.n_layers = layers;
    pc.state_floats = NS;
    pc.budget_bytes = (size_t)pages * (size_t)layers * (NS + 1) * 4;
    TK_OK(kvc_pool_create(&pc, &p));
    return p;
}

/* run tokens[off .. off+n) through a RECURRENT cache (sequence 0), naming checkpoints */
static kvc_result feed(kvc_cache *c, const int32_t *tokens, int32_t off, int32_t n, const int32_t *at, int32_t n_at,
                       int32_t layers) {
    int32_t l, t, k;
    kvc_result r = kvc_begin(c, n, at, n_at);
    if (r != KVC_OK) return r;
    for (l = 0; l < layers; ++l) {
        float *st;
        if ((r = kvc_state(c, 0, l, &st)) != KVC_OK) return r;
        for (t = off, k = 0; t < off + n; ++t) {
            step(st, tokens[t], l);
            if (k < n_at && at[k] == t + 1) {
                if ((r = kvc_state_checkpoint(c, l, t + 1, st)) != KVC_OK) return r;
                k++;
            }
        }
    }
    return KVC_OK;
}

static int state_is(const kvc_cache *c, int32_t seq, const int32_t *tokens, int32_t n, int32_t layers) {
    int32_t l, i;
    for (l = 0; l < layers; ++l) {
        const float *st;
        float want[NS];
        if (kvc_state_read(c, seq, l, &st) != KVC_OK) return 0;
        ref_state(tokens, n, l, want);
        for (i = 0; i < NS; ++i)
            if ((st ? st[i] : 0.0f) != want[i]) return 0;
    }
    return 1;
}

static void test_state_pool_config(void) {
    kvc_pool_config pc;
    kvc_pool *p = NULL;
    kvc_cache_config cc;
    kvc_cache *c = NULL;
    size_t bytes = 0;
    kvc_pool_config_init(&pc);
    pc.n_layers = 3;
    pc.state_floats = -1;
    pc.budget_bytes = 1 << 20;
    TK_RES(kvc_pool_create(&pc, &p), KVC_ERR_INVALID);
    pc.state_floats = 8;
    pc.n_kv_heads = 2; /* a state pool has no heads */
    TK_RES(kvc_pool_create(&pc, &p), KVC_ERR_INVALID);
    pc.n_kv_heads = 0;
    TK_OK(kvc_pool_page_bytes(&pc, &bytes));
    TK_EQ(bytes, 3 * (8 + 1) * 4); /* one state of every layer (and an unused float) */
    {   /* the budget for N states: N pages of one state of every layer */
        size_t b = 0;
        kvc_pool_config kv;
        TK_OK(kvc_pool_budget_for_states(&pc, 5, &b));
        TK_EQ(b, 5 * bytes);
        TK_OK(kvc_pool_budget_for_states(&pc, 0, &b));
        TK_EQ(b, bytes); /* a pool holds at least one page */
        TK_RES(kvc_pool_budget_for_states(&pc, -1, &b), KVC_ERR_RANGE);
        TK_RES(kvc_pool_budget_for_states(NULL, 1, &b), KVC_ERR_NULL);
        TK_RES(kvc_pool_budget_for_states(&pc, 1, NULL), KVC_ERR_NULL);
        kvc_pool_config_init(&kv);
        kv.n_layers = 1; kv.n_kv_heads = 1; kv.head_dim_k = kv.head_dim_v = 4;
        TK_RES(kvc_pool_budget_for_states(&kv, 1, &b), KVC_ERR_INVALID); /* K/V: budget_for_tokens */
        TK_EQ(b, bytes);
    }
    TK_OK(kvc_pool_budget_for_states(&pc, 2, &pc.budget_bytes));
    TK_OK(kvc_pool_create(&pc, &p));
    {
        kvc_pool_stats ps;
        TK_OK(kvc_pool_stats_get(p, &ps));
        TK_EQ(ps.pages_total, 2);
    }
    kvc_cache_config_init(&cc, KVC_KIND_FULL);
    TK_RES(kvc_cache_create(p, &cc, &c), KVC_ERR_INVALID); /* K/V kinds need a K/V pool */
    {
        kvc_radix_config rc;
        kvc_radix *t = NULL;
        kvc_radix_config_init(&rc, KVC_KIND_FULL);
        TK_RES(kvc_radix_create(p, &rc, &t), KVC_ERR_UNSUPPORTED); /* states share no prefix */
    }
    kvc_cache_config_init(&cc, KVC_KIND_RECURRENT);
    cc.max_seqs = 3;
    TK_RES(kvc_cache_create(p, &cc, &c), KVC_ERR_FULL); /* no room for a state per sequence */
    cc.max_seqs = 2;
    cc.window = 4;
    TK_RES(kvc_cache_create(p, &cc, &c), KVC_ERR_INVALID);
    cc.window = 0;
    TK_OK(kvc_cache_create(p, &cc, &c));
    TK_OK(kvc_cache_destroy(c));
    TK_OK(kvc_pool_destroy(p));
}

static void test_recurrent_basics(void) {
    int32_t tokens[16] = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3};
    kvc_pool *p = state_pool(2, 8);
    kvc_cache_config cc;
    kvc_cache *c = NULL, *d = NULL;
    kvc_snapshot *snap = NULL;
    kvc_pool_stats ps;
    float *st, kbuf[8], q[8], out[8];
    int32_t off = -1, n_pages = -1;
    int ok;
    kvc_attention_desc a;
    kvc_cache_config_init(&cc, KVC_KIND_RECURRENT);
    TK_OK(kvc_cache_create(p, &cc, &c));
    {
        const float *r = (const float *)1;
        TK_OK(kvc_state_read(c, 0, 1, &r));
        TK_CHECK(r == NULL); /* nothing consumed: all zeros */
    }
    TK_RES(kvc_state(c, 0, 0, &st), KVC_ERR_STATE); /* no batch */
    TK_OK(feed(c, tokens, 0, 3, NULL, 0, 2));
    TK_CHECK(state_is(c, 0, tokens, 3, 2));
    TK_OK(kvc_cache_offset(c, &off));
    TK_EQ(off, 3);
    TK_RES(kvc_put(c, 0, kbuf, kbuf), KVC_ERR_UNSUPPORTED);
    memset(&a, 0, sizeof(a));
    a.n_queries = 1; a.n_heads = 1; a.q = q; a.out = out;
    TK_RES(kvc_attention(c, 0, &a), KVC_ERR_UNSUPPORTED);
    TK_OK(kvc_snapshot_take(c, 0, KVC_POS_END, &snap));
    TK_CHECK(snap != NULL);
    TK_OK(feed(c, tokens, 3, 2, NULL, 0, 2)); /* writes a copy: the snapshot keeps its page */
    TK_CHECK(state_is(c, 0, tokens, 5, 2));
    TK_OK(kvc_cache_pages(c, &n_pages));
    TK_EQ(n_pages, 1);
    TK_OK(kvc_pool_stats_get(p, &ps));
    TK_EQ(ps.pages_used, 2);
    /* a state cannot be rewound: only to the snapshot's own offset */
    TK_RES(kvc_cache_restore(c, NULL, 4), KVC_ERR_UNREACHABLE);
    TK_RES(kvc_cache_trim(c, 1), KVC_ERR_UNREACHABLE);
    TK_RES(kvc_cache_restore(c, snap, 2), KVC_ERR_UNREACHABLE);
    TK_CHECK(state_is(c, 0, tokens, 5, 2)); /* nothing changed */
    TK_OK(kvc_cache_can_rewind(c, 3, &ok));
    TK_EQ(ok, 0);
    TK_OK(kvc_cache_restore(c, snap, 3));
    TK_CHECK(state_is(c, 0, tokens, 3, 2));
    TK_OK(kvc_cache_offset(c, &off));
    TK_EQ(off, 3);
    /* the snapshot restores into another cache of the pool with the same config */
    TK_OK(kvc_cache_create(p, &cc, &d));
    TK_OK(kvc_cache_restore(d, snap, 3));
    TK_CHECK(state_is(d, 0, tokens, 3, 2));
    TK_OK(feed(d, tokens, 3, 4, NULL, 0, 2));
    TK_CHECK(state_is(d, 0, tokens, 7, 2));
    TK_CHECK(state_is(c, 0, tokens, 3, 2)); /* c did not move with d */
    /* cancel: allowed before a state was handed out, refused after */
    TK_OK(kvc_begin(c, 2, NULL, 0));
    TK_OK(kvc_cancel(c));
    TK_CHECK(state_is(c, 0, tokens, 3, 2));
    TK_OK(kvc_begin(c, 2, NULL, 0));
    TK_OK(kvc_state(c, 0, 0, &st));
    TK_RES(kvc_cancel(c), KVC_ERR_RECURRENT);
    TK_OK(kvc_state(c, 0, 1, &st));
    /* split and merge: a state cannot be cut */
    {
        kvc_snapshot *pa = NULL, *ch = NULL, *m = NULL;
        TK_OK(kvc_snapshot_split(c, snap, 1, &pa, &ch));
        TK_CHECK(pa == NULL && ch == snap);
        TK_OK(kvc_snapshot_take(c, 0, KVC_POS_END, &pa));
        TK_OK(kvc_snapshot_merge(c, ch, pa, &m));
        TK_CHECK(m == pa);
        snap = m;
    }
    TK_OK(kvc_snapshot_free(snap));
    TK_OK(kvc_cache_clear(c));
    TK_OK(kvc_cache_offset(c, &off));
    TK_EQ(off, 0);
    TK_OK(kvc_cache_destroy(c));
    TK_OK(kvc_cache_destroy(d));
    TK_OK(kvc_pool_stats_get(p, &ps));
    TK_EQ(ps.pages_used, 0);
    TK_EQ(ps.live_snapshots, 0);
    TK_OK(kvc_pool_destroy(p));
}

static void test_recurrent_checkpoints(void) {
    int32_t tokens[24], i, at[3] = {4, 7, 10}, got[8], n = 0, off = -1;
    kvc_pool *p = state_pool(3, 16);
    kvc_cache_config cc;
    kvc_cache *c = NULL, *f = NULL;
    kvc_snapshot *s = NULL;
    float *st;
    for (i = 0; i < 24; ++i) tokens[i] = (i * 5 + 3) % 11;
    kvc_cache_config_init(&cc, KVC_KIND_RECURRENT);
    cc.checkpoints = 3;
    TK_OK(kvc_cache_create(p, &cc, &c));
    /* bad checkpoint lists change nothing */
    {
        int32_t bad1[2] = {5, 4}, bad2[1] = {0}, bad3[1] = {11}, four[4] = {1, 2, 3, 4};
        TK_RES(kvc_begin(c, 10, bad1, 2), KVC_ERR_RANGE);
        TK_RES(kvc_begin(c, 10, bad2, 1), KVC_ERR_RANGE);
        TK_RES(kvc_begin(c, 10, bad3, 1), KVC_ERR_RANGE);
        TK_RES(kvc_begin(c, 10, four, 4), KVC_ERR_RANGE); /* more than cc.checkpoints */
        TK_RES(kvc_begin(c, 10, NULL, 1), KVC_ERR_NULL);
        TK_OK(kvc_cache_offset(c, &off));
        TK_EQ(off, 0);
    }
    TK_OK(feed(c, tokens, 0, 10, at, 3, 3));
    TK_RES(kvc_state_checkpoint(c, 0, 5, tokens == NULL ? NULL : (const float *)tokens), KVC_ERR_NOT_FOUND);
    TK_OK(kvc_cache_checkpoints(c, got, 8, &n));
    TK_EQ(n, 3);
    TK_EQ(got[0], 4); TK_EQ(got[1], 7); TK_EQ(got[2], 10);
    TK_OK(kvc_cache_checkpoints(c, NULL, 0, &n));
    TK_EQ(n, 3);
    TK_RES(kvc_cache_checkpoints(c, got, 2, &n), KVC_ERR_RANGE);
    /* a fork shares the states and the checkpoints */
    TK_OK(kvc_cache_fork(c, &f));
    TK_OK(kvc_cache_trim(c, 3)); /* to the checkpoint at 7 */
    TK_CHECK(state_is(c, 0, tokens, 7, 3));
    TK_OK(kvc_cache_restore(c, NULL, 4));
    TK_CHECK(state_is(c, 0, tokens, 4, 3));
    TK_RES(kvc_cache_restore(c, NULL, 7), KVC_ERR_UNREACHABLE); /* past the rewind: dropped */
    TK_OK(kvc_cache_checkpoints(c, got, 8, &n));
    TK_EQ(n, 1);
    /* the fork kept all of them */
    TK_OK(kvc_cache_restore(f, NULL, 7));
    TK_CHECK(state_is(f, 0, tokens, 7, 3));
    /* continuing from 4 with a different history */
    {
        int32_t at2[1] = {6};
        TK_OK(feed(c, tokens, 4, 4, at2, 1, 3));
        TK_CHECK(state_is(c, 0, tokens, 8, 3));
        TK_OK(kvc_snapshot_take(c, 0, 6, &s)); /* at a checkpoint inside the last batch */
        TK_RES(kvc_snapshot_take(c, 0, 5, &s), KVC_ERR_UNREACHABLE); /* as kvc_cache_trim / kvc_cache_restore */
        TK_RES(kvc_cache_restore(c, NULL, 5), KVC_ERR_UNREACHABLE);
    }
    /* a checkpoint whose layers were not all handed over is not kept */
    {
        int32_t at3[1] = {10};
        TK_OK(kvc_begin(c, 4, at3, 1));
        for (i = 0; i < 3; ++i) {
            int32_t t;
            TK_OK(kvc_state(c, 0, i, &st));
            for (t = 8; t < 12; ++t) {
                step(st, tokens[t], i);
                if (t + 1 == 10 && i != 1) TK_OK(kvc_state_checkpoint(c, i, 10, st));
            }
        }
        TK_RES(kvc_cache_restore(c, NULL, 10), KVC_ERR_UNREACHABLE);
        TK_OK(kvc_cache_restore(c, NULL, 6)); /* the older one still is */
        TK_CHECK(state_is(c, 0, tokens, 6, 3));
    }
    /* the snapshot at 6 carries the checkpoint at 4 before it: restored into the fork */
    TK_OK(kvc_cache_restore(f, s, 6));
    TK_CHECK(state_is(f, 0, tokens, 6, 3));
    TK_OK(kvc_cache_restore(f, NULL, 4));
    TK_CHECK(state_is(f, 0, tokens, 4, 3));
    TK_OK(kvc_snapshot_free(s));
    TK_OK(kvc_cache_destroy(f));
    TK_OK(kvc_cache_destroy(c));
    {
        kvc_pool_stats ps;
        TK_OK(kvc_pool_stats_get(p, &ps));
        TK_EQ(ps.pages_used, 0);
    }
    TK_OK(kvc_pool_destroy(p));
}

static void test_recurrent_sequences(void) {
    int32_t a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {9, 8, 7, 6, 5, 4};
    int32_t pos[5] = {0, 0, 1, 1, 2}, seq[5] = {0, 1, 0, 1, 1}, tok[5];
    kvc_pool *p = state_pool(2, 8);
    kvc_cache_config cc;
    kvc_cache *c = NULL;
    kvc_batch bt;
    int32_t i, l;
    kvc_cache_config_init(&cc, KVC_KIND_RECURRENT);
    cc.max_seqs = 3;
    TK_OK(kvc_cache_create(p, &cc, &c));
    for (i = 0; i < 5; ++i) tok[i] = seq[i] == 0 ? a[pos[i]] : b[pos[i]];
    bt.n_tokens = 5; bt.pos = pos; bt.seq = seq; bt.non_causal = NULL;
    for (l = 0; l < 2; ++l) { /* before the batch: no state to hand out */
        float *st;
        TK_RES(kvc_state(c, 1, l, &st), KVC_ERR_STATE);
    }
    {
        int32_t badpos[5] = {0, 1, 1, 1, 2}; /* sequence 1 must start at 0 */
        kvc_batch bad = bt;
        bad.pos = badpos;
        TK_RES(kvc_begin_batch(c, &bad), KVC_ERR_RANGE);
    }
    TK_OK(kvc_begin_batch(c, &bt));
    for (l = 0; l < 2; ++l) {
        float *s0, *s1, *s2;
        TK_OK(kvc_state(c, 0, l, &s0));
        TK_OK(kvc_state(c, 1, l, &s1));
        TK_RES(kvc_state(c, 2, l, &s2), KVC_ERR_STATE); /* not in the batch */
        for (i = 0; i < 5; ++i) step(seq[i] == 0 ? s0 : s1, tok[i], l);
    }
    TK_CHECK(state_is(c, 0, a, 2, 2));
    TK_CHECK(state_is(c, 1, b, 3, 2));
    TK_CHECK(state_is(c, 2, a, 0, 2));
    {
        int32_t lo = -2, hi = -2;
        TK_OK(kvc_seq_pos_range(c, 1, &lo, &hi));
        TK_EQ(lo, 0);
        TK_EQ(hi, 2);
        /* a state cannot lose some of its tokens, only all of them */
        TK_RES(kvc_seq_remove(c, 1, 1, 3), KVC_ERR_RECURRENT);
        TK_RES(kvc_seq_remove(c, 1, 0, 2), KVC_ERR_RECURRENT);
        TK_RES(kvc_seq_remove(c, 3, 0, KVC_POS_END), KVC_ERR_RANGE);
        TK_CHECK(state_is(c, 1, b, 3, 2));
        TK_OK(kvc_seq_remove(c, 1, 0, KVC_POS_END));
        TK_CHECK(state_is(c, 1, b, 0, 2));
        TK_CHECK(state_is(c, 0, a, 2, 2));
        TK_OK(kvc_seq_pos_range(c, 1, &lo, &hi));
        TK_EQ(lo, -1);
        TK_EQ(hi, -1);
        TK_OK(kvc_seq_keep(c, 1)); /* drops sequence 0 */
        TK_CHECK(state_is(c, 0, a, 0, 2));
    }
    TK_OK(kvc_cache_destroy(c));
    TK_OK(kvc_pool_destroy(p));
}

/* ---- ROTATING checkpoints: a wrapped window goes back to them ------------------------- */
static float kvv(int32_t pos, int32_t i) { return (float)((pos * 13 + i * 5) % 31 - 15); }

static void put_tokens(kvc_cache *c, int32_t from, int32_t n, int32_t layers, int32_t row) {
    float *k = (float *)malloc(sizeof(float) * (size_t)(n * row)), *v = (float *)malloc(sizeof(float) * (size_t)(n * row));
    int32_t t, i, l;
    for (t = 0; t < n; ++t)
        for (i = 0; i < row; ++i) { k[t * row + i] = kvv(from + t, i); v[t * row + i] = -kvv(from + t, i); }
    for (l = 0; l < layers; ++l) TK_OK(kvc_put(c, l, k, v));
    free(k);
    free(v);
}

/* the cells a cache shows (positions and K) equal those of a fresh cache fed [0, n) */
static int same_view(kvc_cache *c, kvc_pool *p, const kvc_cache_config *cc, int32_t n, int32_t row) {
    kvc_cache *r = NULL;
    float k1[64 * 8], k2[64 * 8];
    int32_t p1[64], p2[64], n1 = 0, n2 = 0, i, ok = 1, t;
    if (kvc_cache_create(p, cc, &r) != KVC_OK) return 0;
    for (t = 0; t < n; ++t) { /* one token a batch: the view is the window at n */
        if (kvc_begin(r, 1, NULL, 0) != KVC_OK) ok = 0;
        put_tokens(r, t, 1, 1, row);
    }
    if (kvc_cache_gather(c, 0, k1, NULL, p1, 64, &n1) != KVC_OK) ok = 0;
    if (kvc_cache_gather(r, 0, k2, NULL, p2, 64, &n2) != KVC_OK) ok = 0;
    /* the rewound cache may show one older key than a one-token batch would: compare the
       window the next query sees, the last (window - 1) keys */
    if (n1 < n2) ok = 0;
    for (i = 0; ok && i < n2; ++i) {
        int32_t j = n1 - n2 + i, d;
        if (p1[j] != p2[i]) ok = 0;
        for (d = 0; d < row; ++d) if (k1[j * row + d] != k2[i * row + d]) ok = 0;
    }
    kvc_cache_destroy(r);
    return ok;
}

static void test_rotating_checkpoints(void) {
    kvc_pool_config pc;
    kvc_pool *p = NULL;
    kvc_cache_config cc;
    kvc_cache *c = NULL, *d = NULL;
    kvc_snapshot *s = NULL;
    int32_t at[2] = {5, 9}, off = -1, row = 4;
    int can;
    kvc_pool_config_init(&pc);
    pc.n_layers = 1; pc.n_kv_heads = 1; pc.head_dim_k = pc.head_dim_v = 4; pc.page_cells = 2;
    TK_OK(kvc_pool_budget_for_tokens(&pc, 64, &pc.budget_bytes));
    TK_OK(kvc_pool_create(&pc, &p));
    kvc_cache_config_init(&cc, KVC_KIND_ROTATING);
    cc.window = 4;
    TK_OK(kvc_cache_create(p, &cc, &c));
    TK_OK(kvc_begin(c, 12, at, 2)); /* one batch past the window */
    put_tokens(c, 0, 12, 1, row);
    TK_OK(kvc_begin(c, 1, NULL, 0));
    put_tokens(c, 12, 1, 1, row);
    TK_OK(kvc_cache_can_rewind(c, 8, &can));
    TK_EQ(can, 0); /* wrapped: only checkpoints */
    TK_RES(kvc_cache_trim(c, 5), KVC_ERR_UNREACHABLE);
    TK_OK(kvc_cache_can_rewind(c, 9, &can));
    TK_EQ(can, 1);
    TK_OK(kvc_snapshot_take(c, 0, 9, &s));
    TK_OK(kvc_cache_trim(c, 4));
    TK_OK(kvc_cache_offset(c, &off));
    TK_EQ(off, 9);
    TK_CHECK(same_view(c, p, &cc, 9, row));
    TK_OK(kvc_cache_restore(c, NULL, 5));
    TK_CHECK(same_view(c, p, &cc, 5, row));
    TK_RES(kvc_cache_restore(c, NULL, 9), KVC_ERR_UNREACHABLE);
    /* continue after the rewind: the same as a cache that never went further */
    TK_OK(kvc_begin(c, 3, NULL, 0));
    put_tokens(c, 5, 3, 1, row);
    TK_CHECK(same_view(c, p, &cc, 8, row));
    /* the snapshot at 9 into another cache, and a snapshot of another window refused */
    TK_OK(kvc_cache_create(p, &cc, &d));
    TK_OK(kvc_cache_restore(d, s, 9));
    TK_CHECK(same_view(d, p, &cc, 9, row));
    TK_OK(kvc_cache_restore(d, NULL, 5)); /* it carried the checkpoint at 5 */
    TK_CHECK(same_view(d, p, &cc, 5, row));
    TK_OK(kvc_cache_destroy(d));
    cc.window = 5;
    TK_OK(kvc_cache_create(p, &cc, &d));
    TK_RES(kvc_cache_restore(d, s, 9), KVC_ERR_FOREIGN);
    TK_OK(kvc_cache_destroy(d));
    TK_OK(kvc_snapshot_free(s));
    TK_OK(kvc_cache_destroy(c));
    {
        kvc_pool_stats ps;
        TK_OK(kvc_pool_stats_get(p, &ps));
        TK_EQ(ps.pages_used, 0);
    }
    TK_OK(kvc_pool_destroy(p));
}

/* ---- model memories ----------------------------------------------------------------------- */
/* LFM2-like: layers 0 and 2 recurrent, 1 and 3 attention (FULL), one budget */
static void lfm2_config(kvc_memory_config *mc, kvc_group_config g[2], int32_t map[4], size_t budget) {
    int32_t l;
    kvc_memory_config_init(mc);
    for (l = 0; l < 4; ++l) map[l] = l % 2;
    memset(g, 0, sizeof(kvc_group_config) * 2);
    g[0].pool.n_layers = 2;
    g[0].pool.state_floats = NS;
    kvc_cache_config_init(&g[0].cache, KVC_KIND_RECURRENT);
    g[1].pool.n_layers = 2;
    g[1].pool.n_kv_heads = 1;
    g[1].pool.head_dim_k = g[1].pool.head_dim_v = 4;
    g[1].pool.type_k = g[1].pool.type_v = KVC_TYPE_F32;
    g[1].pool.page_cells = 4;
    kvc_cache_config_init(&g[1].cache, KVC_KIND_FULL);
    mc->n_layers = 4;
    mc->layer_group = map;
    mc->n_groups = 2;
    mc->groups = g;
    mc->budget_bytes = budget;
}

static const size_t STATE_PAGE = 2 * (NS + 1) * 4, KV_PAGE = 2 * 4 * 8 * 4;

/* a forward pass of the toy model over tokens[off, off+n) through the memory */
static kvc_result mem_feed(kvc_memory *m, const int32_t *tokens, int32_t off, int32_t n, const int32_t *at, int32_t n_at) {
    int32_t l, t, k, i;
    kvc_result r = kvc_memory_begin(m, n, at, n_at);
    float kv[64 * 4];
    if (r != KVC_OK) return r;
    for (l = 0; l < 4; ++l) {
        if (l % 2 == 0) {
            float *st;
            int32_t gl = l / 2;
            if ((r = kvc_memory_state(m, l, 0, &st)) != KVC_OK) return r;
            for (t = off, k = 0; t < off + n; ++t) {
                step(st, tokens[t], gl);
                if (k < n_at && at[k] == t + 1) {
                    if ((r = kvc_memory_state_checkpoint(m, l, t + 1, st)) != KVC_OK) return r;
                    k++;
                }
            }
        } else {
            for (t = 0; t < n; ++t)
                for (i = 0; i < 4; ++i) kv[t * 4 + i] = (float)(tokens[off + t] * 10 + i + l);
            if ((r = kvc_memory_put(m, l, kv, kv)) != KVC_OK) return r;
        }
    }
    return KVC_OK;
}

/* the memory holds exactly tokens[0, n): states and every key */
static int mem_is(const kvc_memory *m, const int32_t *tokens, int32_t n) {
    kvc_cache *c;
    int32_t gl, off, cells, t, i, pos[128];
    float k[128 * 4];
    if (kvc_memory_offset(m, &off) != KVC_OK || off != n) return 0;
    if (kvc_memory_layer(m, 0, &c, &gl) != KVC_OK || !state_is(c, 0, tokens, n, 2)) return 0;
    if (kvc_memory_layer(m, 3, &c, &gl) != KVC_OK) return 0;
    if (kvc_cache_gather(c, gl, k, NULL, pos, 128, &cells) != KVC_OK || cells != n) return 0;
    for (t = 0; t < n; ++t)
        for (i = 0; i < 4; ++i)
            if (pos[t] != t || k[t * 4 + i] != (float)(tokens[t] * 10 + i + 3)) return 0;
    return 1;
}

static void test_memory_config(void) {
    kvc_memory_config mc;
    kvc_group_config g[2];
    int32_t map[4];
    const char *field = NULL;
    kvc_memory *m = NULL;
    lfm2_config(&mc, g, map, 1 << 16);
    TK_OK(kvc_memory_config_check(&mc, &field));
    TK_CHECK(field == NULL);
    map[3] = 2;
    TK_RES(kvc_memory_config_check(&mc, &field), KVC_ERR_RANGE);
    TK_CHECK(field && strcmp(field, "layer_group") == 0);
    map[3] = 0; /* group 0 gets 3 layers, its pool says 2 */
    TK_RES(kvc_memory_config_check(&mc, &field), KVC_ERR_INVALID);
    TK_CHECK(field && strcmp(field, "groups.pool.n_layers") == 0);
    map[3] = 1;
    g[1].pool.budget_bytes = 100; /* the memory's budget applies */
    TK_RES(kvc_memory_create(&mc, &m), KVC_ERR_INVALID);
    TK_RES(kvc_memory_config_check(&mc, &field), KVC_ERR_INVALID);
    TK_CHECK(field && strcmp(field, "groups.pool") == 0);
    g[1].pool.budget_bytes = 0;
    g[0].cache.kind = KVC_KIND_FULL; /* a state pool takes only RECURRENT */
    TK_RES(kvc_memory_config_check(&mc, &field), KVC_ERR_INVALID);
    TK_CHECK(field && strcmp(field, "groups.cache") == 0);
    g[0].cache.kind = KVC_KIND_RECURRENT;
    g[0].cache.max_seqs = 4;
    mc.budget_bytes = 3 * STATE_PAGE + KV_PAGE; /* not one state per sequence */
    TK_RES(kvc_memory_config_check(&mc, &field), KVC_ERR_INVALID);
    TK_CHECK(field && strcmp(field, "budget_bytes") == 0);
    mc.budget_bytes = 4 * STATE_PAGE + KV_PAGE;
    TK_OK(kvc_memory_config_check(&mc, &field));
    g[0].pool.state_floats = 0; /* a group with no shape */
    TK_RES(kvc_memory_config_check(&mc, &field), KVC_ERR_INVALID);
    g[0].pool.state_floats = NS;
    mc.n_groups = 0;
    TK_RES(kvc_memory_create(&mc, &m), KVC_ERR_INVALID);
    TK_CHECK(m == NULL);
}

static void test_memory_ops(void) {
    kvc_memory_config mc;
    kvc_group_config g[2];
    int32_t map[4], tokens[64], i, at[2] = {6, 10}, off = -1, n_reused = 0;
    kvc_memory *m = NULL, *f = NULL;
    kvc_memory_snapshot *s = NULL;
    kvc_memory_stats st;
    kvc_prefix *px = NULL;
    for (i = 0; i < 64; ++i) tokens[i] = (i * 11 + 2) % 13;
    /* room for 3 states and 4 pages of 4 tokens */
    lfm2_config(&mc, g, map, 3 * STATE_PAGE + 4 * KV_PAGE);
    TK_OK(kvc_memory_create(&mc, &m));
    TK_OK(mem_feed(m, tokens, 0, 10, at, 2));
    TK_CHECK(mem_is(m, tokens, 10));
    TK_OK(kvc_memory_stats_get(m, &st));
    TK_EQ(st.offset, 10);
    TK_EQ(st.n_checkpoints, 1); /* 6 (10 is the offset itself) */
    TK_EQ(st.bytes_used, 2 * STATE_PAGE + 3 * KV_PAGE); /* live state = checkpoint 10, checkpoint 6 */
    TK_OK(kvc_memory_snapshot_take(m, 0, 10, &s));
    /* all or nothing: 7 more tokens need 2 KV pages + a state copy: 2*KV + STATE > free */
    TK_RES(mem_feed(m, tokens, 10, 7, NULL, 0), KVC_ERR_FULL);
    TK_CHECK(mem_is(m, tokens, 10));
    TK_OK(kvc_memory_stats_get(m, &st));
    TK_EQ(st.bytes_used, 2 * STATE_PAGE + 3 * KV_PAGE);
    TK_OK(mem_feed(m, tokens, 10, 2, NULL, 0));
    TK_CHECK(mem_is(m, tokens, 12));
    /* trims go only where every group can: the checkpoint at 6 or the snapshot */
    TK_RES(kvc_memory_trim(m, 1), KVC_ERR_UNREACHABLE);
    TK_CHECK(mem_is(m, tokens, 12));
    TK_OK(kvc_memory_fork(m, &f));
    TK_OK(kvc_memory_trim(m, 6));
    TK_CHECK(mem_is(m, tokens, 6));
    TK_CHECK(mem_is(f, tokens, 12));
    TK_OK(kvc_memory_restore(m, s, 10));
    TK_CHECK(mem_is(m, tokens, 10));
    TK_OK(kvc_memory_restore(f, s, 10)); /* into the fork too */
    TK_CHECK(mem_is(f, tokens, 10));
    TK_RES(kvc_memory_restore(f, s, 8), KVC_ERR_UNREACHABLE);
    TK_OK(kvc_memory_destroy(f));
    TK_OK(kvc_memory_snapshot_free(s));
    /* prefix reuse through checkpoints: turn 1 then a request that shares 8 tokens */
    TK_OK(kvc_memory_clear(m));
    TK_OK(kvc_prefix_create_memory(m, 64, &px));
    TK_OK(kvc_prefix_begin(px, tokens, 12, &n_reused));
    TK_EQ(n_reused, 0);
    {
        int32_t ck[2] = {8, 12};
        TK_OK(mem_feed(m, tokens, 0, 12, ck, 2));
    }
    TK_OK(kvc_prefix_close(px, NULL, 0));
    {
        int32_t req[16];
        memcpy(req, tokens, sizeof(int32_t) * 10);
        req[10] = 99; req[11] = 98; req[12] = 97;
        TK_OK(kvc_prefix_begin(px, req, 13, &n_reused));
        TK_EQ(n_reused, 8); /* common prefix 10, the last checkpoint before it: 8 */
        TK_CHECK(mem_is(m, tokens, 8));
        TK_OK(mem_feed(m, req, 8, 5, NULL, 0));
        TK_CHECK(mem_is(m, req, 13));
        TK_OK(kvc_prefix_close(px, NULL, 0));
        /* the same prompt again: the end of it is the live offset, one token evaluated */
        TK_OK(kvc_prefix_begin(px, req, 13, &n_reused));
        TK_EQ(n_reused, 8); /* 12 would do, but only 8 and 13 are reachable */
    }
    TK_OK(kvc_memory_offset(m, &off));
    TK_EQ(off, 8);
    TK_OK(kvc_prefix_destroy(px));
    TK_OK(kvc_memory_destroy(m));
}


/* ---- persistence: a RECURRENT cache and a whole memory, bit-exact, damage changes nothing */
static kvc_result save_mem(const kvc_memory *m, const int32_t *tokens, int32_t n, unsigned char **buf, size_t *len) {
    kvc_mem mm;
    kvc_io io;
    kvc_namespace ns = {7, 1};
    kvc_result r;
    memset(&mm, 0, sizeof(mm));
    kvc_io_memory(&mm, &io);
    if ((r = kvc_memory_save(m, ns, tokens, n, &io)) != KVC_OK) return r; /* counts */
    mm.data = (unsigned char *)malloc(mm.size);
    mm.capacity = mm.size;
    mm.size = 0;
    kvc_io_memory(&mm, &io);
    r = kvc_memory_save(m, ns, tokens, n, &io);
    *buf = mm.data;
    *len = mm.size;
    return r;
}

static kvc_result load_mem(kvc_memory *m, unsigned char *buf, size_t len, int32_t *tokens, int32_t max, int32_t *n) {
    kvc_mem mm;
    kvc_io io;
    kvc_namespace ns = {7, 1};
    memset(&mm, 0, sizeof(mm));
    mm.data = buf;
    mm.capacity = mm.size = len;
    kvc_io_memory(&mm, &io);
    return kvc_memory_load(m, ns, &io, tokens, max, n);
}

static void test_persistence(void) {
    kvc_memory_config mc;
    kvc_group_config g[2];
    int32_t map[4], tokens[32], i, got[32], n = -1, at[1] = {5};
    kvc_memory *m = NULL, *d = NULL;
    unsigned char *buf = NULL;
    size_t len = 0;
    kvc_memory_stats st;
    for (i = 0; i < 32; ++i) tokens[i] = (i * 3 + 1) % 7;
    lfm2_config(&mc, g, map, 8 * STATE_PAGE + 12 * KV_PAGE);
    TK_OK(kvc_memory_create(&mc, &m));
    TK_OK(kvc_memory_create(&mc, &d));
    TK_OK(mem_feed(m, tokens, 0, 9, at, 1));
    TK_OK(save_mem(m, tokens, 9, &buf, &len));
    TK_OK(mem_feed(d, tokens, 0, 3, NULL, 0)); /* something to replace */
    TK_OK(load_mem(d, buf, len, got, 32, &n));
    TK_EQ(n, 9);
    TK_CHECK(memcmp(got, tokens, sizeof(int32_t) * 9) == 0);
    TK_CHECK(mem_is(d, tokens, 9));
    TK_OK(mem_feed(d, tokens, 9, 4, NULL, 0)); /* and it goes on from there */
    TK_CHECK(mem_is(d, tokens, 13));
    /* every truncation and a damaged byte in every 7th position: an error, d unchanged */
    {
        /* and the caller's tokens and count untouched (group 0's tokens were written
           before a later group's checksum failed) */
        size_t cut, bad = 0, total = 0, touched = 0;
        int32_t sentinel[32], n_out;
        for (i = 0; i < 32; ++i) sentinel[i] = -1 - i;
        for (cut = 0; cut < len; cut += 1) {
            total++;
            memcpy(got, sentinel, sizeof(got));
            n_out = -5;
            bad += load_mem(d, buf, cut, got, 32, &n_out) != KVC_OK && mem_is(d, tokens, 13);
            touched += memcmp(got, sentinel, sizeof(got)) != 0 || n_out != -5;
        }
        for (cut = 0; cut < len; cut += 3) {
            buf[cut] ^= 0x20;
            total++;
            memcpy(got, sentinel, sizeof(got));
            n_out = -5;
            bad += load_mem(d, buf, len, got, 32, &n_out) != KVC_OK && mem_is(d, tokens, 13);
            touched += memcmp(got, sentinel, sizeof(got)) != 0 || n_out != -5;
            buf[cut] ^= 0x20;
        }
        TK_EQ(bad, total);
        TK_EQ(touched, 0);
    }
    TK_OK(kvc_memory_stats_get(d, &st));
    TK_RES(load_mem(d, buf, len, got, 3, &n), KVC_ERR_RANGE); /* tokens do not fit */
    TK_EQ(n, 9);
    TK_CHECK(mem_is(d, tokens, 13));
    free(buf);
    /* another layout refuses it */
    {
        kvc_memory *e = NULL;
        int32_t map2[4] = {1, 0, 1, 0};
        TK_OK(save_mem(m, tokens, 9, &buf, &len));
        mc.layer_group = map2;
        TK_OK(kvc_memory_create(&mc, &e));
        TK_RES(load_mem(e, buf, len, NULL, 0, NULL), KVC_ERR_MISMATCH);
        TK_OK(kvc_memory_destroy(e));
        free(buf);
    }
    /* a RECURRENT cache alone, two sequences */
    {
        kvc_pool *p = state_pool(2, 8);
        kvc_cache_config cc;
        kvc_cache *a = NULL, *b = NULL;
        kvc_mem mm;
        kvc_io io;
        kvc_namespace ns = {1, 2};
        unsigned char store[4096];
        int32_t pos[3] = {0, 1, 0}, seq[3] = {0, 0, 1}, l;
        kvc_batch bt;
        kvc_cache_config_init(&cc, KVC_KIND_RECURRENT);
        cc.max_seqs = 2;
        TK_OK(kvc_cache_create(p, &cc, &a));
        TK_OK(kvc_cache_create(p, &cc, &b));
        bt.n_tokens = 3; bt.pos = pos; bt.seq = seq; bt.non_causal = NULL;
        TK_OK(kvc_begin_batch(a, &bt));
        for (l = 0; l < 2; ++l) {
            float *s0, *s1;
            TK_OK(kvc_state(a, 0, l, &s0));
            TK_OK(kvc_state(a, 1, l, &s1));
            step(s0, tokens[0], l); step(s0, tokens[1], l); step(s1, tokens[0], l);
        }
        memset(&mm, 0, sizeof(mm));
        mm.data = store;
        mm.capacity = sizeof(store);
        kvc_io_memory(&mm, &io);
        TK_OK(kvc_cache_save(a, ns, tokens, 2, &io));
        kvc_io_memory(&mm, &io);
        TK_OK(kvc_cache_load(b, ns, &io, NULL, 0, NULL));
        TK_CHECK(state_is(b, 0, tokens, 2, 2));
        TK_CHECK(state_is(b, 1, tokens, 1, 2));
        TK_OK(kvc_cache_destroy(a));
        TK_OK(kvc_cache_destroy(b));
        TK_OK(kvc_pool_destroy(p));
    }
    TK_OK(kvc_memory_destroy(m));
    TK_OK(kvc_memory_destroy(d));
}

/* cancel takes back a batch some groups have already finished */
static void test_memory_cancel(void) {
    kvc_memory_config mc;
    kvc_group_config g[2];
    int32_t map[4], tokens[8] = {1, 2, 3, 4, 5, 6, 7, 8}, off = -1;
    kvc_memory *m = NULL;
    float kv[4] = {1, 2, 3, 4}, *st;
    lfm2_config(&mc, g, map, 4 * STATE_PAGE + 4 * KV_PAGE);
    TK_OK(kvc_memory_create(&mc, &m));
    TK_OK(mem_feed(m, tokens, 0, 2, NULL, 0));
    TK_OK(kvc_memory_begin(m, 1, NULL, 0));
    TK_OK(kvc_memory_put(m, 1, kv, kv));
    TK_OK(kvc_memory_put(m, 3, kv, kv)); /* the FULL group has ended its part */
    TK_OK(kvc_memory_cancel(m));          /* no state handed out yet: all taken back */
    TK_CHECK(mem_is(m, tokens, 2));
    TK_OK(kvc_memory_begin(m, 1, NULL, 0));
    TK_OK(kvc_memory_state(m, 0, 0, &st));
    TK_OK(kvc_memory_state(m, 2, 0, &st)); /* the RECURRENT group has ended its part */
    TK_RES(kvc_memory_cancel(m), KVC_ERR_RECURRENT);
    TK_OK(kvc_memory_put(m, 1, kv, kv));
    TK_OK(kvc_memory_put(m, 3, kv, kv));
    TK_RES(kvc_memory_cancel(m), KVC_ERR_STATE); /* nothing open */
    TK_OK(kvc_memory_offset(m, &off));
    TK_EQ(off, 3);
    TK_OK(kvc_memory_destroy(m));
}

/* ---- allocation failure: every memory call is all or nothing (issue 35) -------------- */
/* An allocator that refuses the g_refuse-th allocation from the moment it is armed
   (counted from 0; -1: none), and only that one. */
static long g_seen, g_refuse = -1;
static void *refusing_alloc(size_t n, void *user) {
    (void)user;
    if (g_refuse >= 0 && g_seen++ == g_refuse) return NULL;
    return malloc(n);
}
static void refusing_free(void *p, void *user) { (void)user; free(p); }
static void refuse_nth(long n) { g_seen = 0; g_refuse = n; }

/* A memory of one-layer groups of the given kinds (K/V: 1 head of 4 f32, page_cells
   cells a page; RECURRENT: NS floats) over the refusing allocator. */
#define MAXG 4
static int32_t g_window[MAXG]; /* CAUSAL groups' windows (0: none) */
static kvc_memory *kinds_memory(const kvc_kind *kind, int32_t n, int32_t page_cells, size_t budget) {
    kvc_memory_config mc;
    static kvc_group_config g[MAXG];
    static int32_t map[MAXG];
    kvc_memory *m = NULL;
    int32_t i;
    kvc_memory_config_init(&mc);
    memset(g, 0, sizeof(g));
    for (i = 0; i < n; ++i) {
        map[i] = i;
        g[i].pool.n_layers = 1;
        kvc_cache_config_init(&g[i].cache, kind[i]);
        if (kind[i] == KVC_KIND_RECURRENT) {
            g[i].pool.state_floats = NS;
            continue;
        }
        g[i].pool.n_kv_heads = 1;
        g[i].pool.head_dim_k = g[i].pool.head_dim_v = 4;
        g[i].pool.type_k = g[i].pool.type_v = KVC_TYPE_F32;
        g[i].pool.page_cells = page_cells;
        if (kind[i] == KVC_KIND_ROTATING) { g[i].cache.window = 6; g[i].cache.sinks = 1; }
        if (kind[i] == KVC_KIND_CAUSAL) { g[i].cache.capacity = 6; g[i].cache.window = g_window[i]; }
    }
    mc.n_layers = n;
    mc.layer_group = map;
    mc.n_groups = n;
    mc.groups = g;
    mc.budget_bytes = budget;
    mc.runtime.allocator.alloc = refusing_alloc;
    mc.runtime.allocator.free = refusing_free;
    TK_OK(kvc_memory_create(&mc, &m));
    return m;
}

/* tokens[off, off+n) through every group (checkpoints at[] in the RECURRENT ones) */
static kvc_result kinds_feed(kvc_memory *m, int32_t n_groups, const int32_t *tokens, int32_t off, int32_t n,
                             const int32_t *at, int32_t n_at) {
    kvc_result r = kvc_memory_begin(m, n, at, n_at);
    int32_t l, t, k, i;
    float kv[64 * 4];
    for (l = 0; l < n_groups && r == KVC_OK; ++l) {
        kvc_cache *c;
        float *st;
        TK_OK(kvc_memory_group(m, l, &c));
        if (kvc_memory_state(m, l, 0, &st) == KVC_OK) {
            for (t = off, k = 0; t < off + n && r == KVC_OK; ++t) {
                step(st, tokens[t], 0);
                if (k < n_at && at[k] == t + 1) r = kvc_memory_state_checkpoint(m, l, at[k++], st);
            }
            continue;
        }
        for (t = 0; t < n; ++t)
            for (i = 0; i < 4; ++i) kv[t * 4 + i] = (float)(tokens[off + t] * 10 + i + l);
        r = kvc_memory_put(m, l, kv, kv);
    }
    return r;
}

/* What a call must leave as it was when it fails: per group the offset, cells, pages
   and checkpoints; the memory's offset, bytes and checkpoints. */
typedef struct mem_sig {
    int32_t v[MAXG * 20 + 4];
} mem_sig;
static mem_sig sig_of(const kvc_memory *m) {
    mem_sig s;
    kvc_memory_stats st;
    int32_t g, k = 0, n;
    memset(&s, 0, sizeof(s));
    TK_OK(kvc_memory_stats_get(m, &st));
    s.v[k++] = st.offset;
    s.v[k++] = (int32_t)st.bytes_used;
    s.v[k++] = st.n_checkpoints;
    for (g = 0; g < st.n_groups && g < MAXG; ++g) {
        kvc_cache *c;
        TK_OK(kvc_memory_group(m, g, &c));
        TK_OK(kvc_cache_offset(c, &s.v[k++]));
        TK_OK(kvc_cache_cells(c, &s.v[k++]));
        TK_OK(kvc_cache_pages(c, &s.v[k++]));
        n = 0;
        if (kvc_cache_checkpoints(c, &s.v[k + 1], 16, &n) == KVC_OK) s.v[k] = n;
        k += 17;
    }
    return s;
}
static int unchanged(const kvc_memory *m, const mem_sig *before) {
    mem_sig now = sig_of(m);
    return memcmp(&now, before, sizeof(now)) == 0;
}

/* Issue 35.1: two FULL groups of 1-cell pages, a 9-token batch grows both page tables
   (8 entries inline); refusing any one allocation inside the call leaves the memory as
   it was (it aborted on an assertion), and the call then succeeds. */
static void test_memory_begin_refused(void) {
    kvc_kind kind[2] = {KVC_KIND_FULL, KVC_KIND_FULL};
    int32_t tokens[16], i;
    long k;
    kvc_memory *m = kinds_memory(kind, 2, 1, 2 * 16 * KV_PAGE);
    mem_sig before;
    kvc_result r = KVC_ERR_NO_MEMORY;
    for (i = 0; i < 16; ++i) tokens[i] = 3 * i + 1;
    before = sig_of(m);
    for (k = 0; k < 16 && r != KVC_OK; ++k) {
        refuse_nth(k);
        r = kvc_memory_begin(m, 9, NULL, 0);
        g_refuse = -1;
        if (r == KVC_OK) break;
        TK_RES(r, KVC_ERR_NO_MEMORY);
        TK_CHECK(unchanged(m, &before));
    }
    TK_OK(r);
    TK_CHECK(k > 0); /* the first allocation was refused at least once */
    TK_OK(kvc_memory_cancel(m));
    TK_OK(kinds_feed(m, 2, tokens, 0, 9, NULL, 0));
    {
        mem_sig after = sig_of(m);
        TK_EQ(after.v[0], 9);
        TK_EQ(after.v[3], 9);  /* group 0: 9 tokens */
        TK_EQ(after.v[23], 9); /* group 1 */
    }
    TK_OK(kvc_memory_destroy(m));
}

/* Issue 35.4: two CAUSAL groups, group 0 with a window of 3, group 1 full: the batch is
   refused with KVC_ERR_FULL and group 0 keeps its 6 cells (it released its window: 2). */
static void test_memory_causal_full(void) {
    kvc_kind kind[2] = {KVC_KIND_CAUSAL, KVC_KIND_CAUSAL};
    int32_t tokens[8] = {5, 6, 7, 8, 9, 10, 11, 12}, cells = -1;
    kvc_memory *m;
    kvc_cache *c0;
    mem_sig before;
    g_window[0] = 3;
    m = kinds_memory(kind, 2, 4, 4 * KV_PAGE);
    g_window[0] = 0;
    TK_OK(kinds_feed(m, 2, tokens, 0, 6, NULL, 0));
    before = sig_of(m);
    TK_RES(kvc_memory_begin(m, 1, NULL, 0), KVC_ERR_FULL);
    TK_CHECK(unchanged(m, &before));
    TK_OK(kvc_memory_group(m, 0, &c0));
    TK_OK(kvc_cache_offset(c0, &cells));
    TK_EQ(cells, 6);
    TK_OK(kvc_memory_destroy(m));
}

/* Issue 35.2: FULL + ROTATING + RECURRENT, a restore from a snapshot that carries
   checkpoints; refusing any one allocation inside the call leaves the memory as it was
   (the cleanup released a FULL group's chain it never set), and the call then succeeds. */
static void test_memory_restore_refused(void) {
    kvc_kind kind[3] = {KVC_KIND_FULL, KVC_KIND_ROTATING, KVC_KIND_RECURRENT};
    int32_t tokens[32], i, at[2] = {4, 8}, off = -1;
    long k;
    kvc_memory *m = kinds_memory(kind, 3, 2, 64 * KV_PAGE);
    kvc_memory_snapshot *snap = NULL;
    mem_sig before;
    kvc_result r = KVC_ERR_NO_MEMORY;
    int ok = 0;
    for (i = 0; i < 32; ++i) tokens[i] = 7 * i + 2;
    TK_OK(kinds_feed(m, 3, tokens, 0, 12, at, 2));
    TK_OK(kvc_memory_snapshot_take(m, 0, 12, &snap));
    TK_OK(kinds_feed(m, 3, tokens, 12, 6, NULL, 0));
    before = sig_of(m);
    for (k = 0; k < 32; ++k) {
        refuse_nth(k);
        r = kvc_memory_restore(m, snap, 12);
        g_refuse = -1;
        if (r == KVC_OK) break;
        TK_RES(r, KVC_ERR_NO_MEMORY);
        TK_CHECK(unchanged(m, &before));
    }
    TK_OK(r);
    TK_CHECK(k > 1); /* a table and a chain were refused before it went through */
    TK_OK(kvc_memory_offset(m, &off));
    TK_EQ(off, 12);
    TK_OK(kvc_memory_can_rewind(m, 8, &ok));
    TK_CHECK(ok); /* the carried checkpoint came back */
    TK_OK(kvc_memory_snapshot_free(snap));
    TK_OK(kvc_memory_destroy(m));
}

/* Found by fuzz_memory's refusals: kvc_snapshot_take on a cache with checkpoints, its
   carried chain refused, released page references the fresh snapshot never took (a
   wild read, pages freed under the cache). Every refusal: KVC_ERR_NO_MEMORY, the pool's
   pages and the cache as they were; then it succeeds. */
static void test_snapshot_take_refused(void) {
    kvc_pool_config pc;
    kvc_pool *p = NULL;
    kvc_cache_config cc;
    kvc_cache *c = NULL;
    kvc_snapshot *s = NULL;
    kvc_pool_stats before, now;
    int32_t at[2] = {3, 5}, n_at = -1;
    long k;
    kvc_result r = KVC_ERR_NO_MEMORY;
    float kv[8 * 4];
    memset(kv, 0, sizeof(kv));
    kvc_pool_config_init(&pc);
    pc.n_layers = 1; pc.n_kv_heads = 1; pc.head_dim_k = pc.head_dim_v = 4; pc.page_cells = 2;
    pc.runtime.allocator.alloc = refusing_alloc;
    pc.runtime.allocator.free = refusing_free;
    TK_OK(kvc_pool_budget_for_tokens(&pc, 64, &pc.budget_bytes));
    TK_OK(kvc_pool_create(&pc, &p));
    kvc_cache_config_init(&cc, KVC_KIND_ROTATING);
    cc.window = 8;
    TK_OK(kvc_cache_create(p, &cc, &c));
    TK_OK(kvc_begin(c, 6, at, 2));
    TK_OK(kvc_put(c, 0, kv, kv));
    TK_OK(kvc_snapshot_take(c, 0, KVC_POS_END, &s)); /* settles the checkpoints */
    TK_OK(kvc_snapshot_free(s));
    TK_OK(kvc_pool_stats_get(p, &before));
    for (k = 0; k < 8; ++k) {
        s = NULL;
        refuse_nth(k);
        r = kvc_snapshot_take(c, 0, KVC_POS_END, &s);
        g_refuse = -1;
        if (r == KVC_OK) break;
        TK_RES(r, KVC_ERR_NO_MEMORY);
        TK_OK(kvc_pool_stats_get(p, &now));
        TK_EQ(now.pages_used, before.pages_used);
        TK_EQ(now.live_snapshots, before.live_snapshots);
        TK_OK(kvc_cache_checkpoints(c, NULL, 0, &n_at));
        TK_EQ(n_at, 2);
    }
    TK_OK(r);
    TK_CHECK(k > 1); /* the snapshot, then its chain, were refused first */
    TK_OK(kvc_snapshot_free(s));
    TK_OK(kvc_cache_destroy(c));
    TK_OK(kvc_pool_destroy(p));
}

/* The offsets a batch asks the engine for (kvc_memory_batch_checkpoints), the results of
   a hand-over that is not asked for and of one outside the batch, and the count of
   checkpoints dropped because a layer's state never came. */
static void test_memory_batch_checkpoints(void) {
    kvc_memory_config mc;
    kvc_group_config g[2];
    int32_t map[4], tokens[16], i, l, t, at[1] = {2}, got[8], n = -1, ok = -1;
    kvc_memory *m = NULL;
    kvc_memory_stats st;
    float kv[16 * 4], *s0 = NULL, *s2 = NULL;
    const float *rd = NULL;
    for (i = 0; i < 16; ++i) tokens[i] = (i * 5 + 1) % 9;
    lfm2_config(&mc, g, map, 16 * STATE_PAGE + 8 * KV_PAGE);
    g[0].cache.checkpoints = 2;
    g[0].cache.reserve = 2;
    TK_OK(kvc_memory_create(&mc, &m));
    TK_RES(kvc_memory_batch_checkpoints(m, 0, NULL, 0, &n), KVC_ERR_STATE); /* no batch open */
    TK_OK(kvc_memory_batch_checkpoints(m, 1, NULL, 0, &n));                  /* FULL: nothing to hand over */
    TK_EQ(n, 0);
    TK_RES(kvc_memory_batch_checkpoints(m, 4, NULL, 0, &n), KVC_ERR_RANGE);
    TK_RES(kvc_memory_batch_checkpoints(m, 0, NULL, 1, &n), KVC_ERR_NULL);
    TK_OK(kvc_memory_state_read(m, 0, &rd));
    TK_CHECK(rd == NULL); /* no token consumed yet: all zeros */
    TK_RES(kvc_memory_state_read(m, 1, &rd), KVC_ERR_UNSUPPORTED);
    /* 6 tokens naming 2; the reserve of 2 asks for 4 and 5 (6, the end, is the live state) */
    TK_OK(kvc_memory_begin(m, 6, at, 1));
    TK_OK(kvc_memory_batch_checkpoints(m, 0, NULL, 0, &n));
    TK_EQ(n, 3);
    TK_RES(kvc_memory_batch_checkpoints(m, 2, got, 2, &n), KVC_ERR_RANGE);
    TK_EQ(n, 3);
    TK_OK(kvc_memory_batch_checkpoints(m, 2, got, 8, &n));
    TK_EQ(n, 3);
    TK_EQ(got[0], 2); TK_EQ(got[1], 4); TK_EQ(got[2], 5);
    TK_OK(kvc_memory_batch_checkpoints(m, 3, NULL, 0, &n));
    TK_EQ(n, 0);
    TK_OK(kvc_memory_batch_checkpoints(m, 0, got, 8, &n));
    TK_OK(kvc_memory_state(m, 0, 0, &s0));
    TK_OK(kvc_memory_state(m, 2, 0, &s2));
    TK_RES(kvc_memory_state_checkpoint(m, 0, 3, s0), KVC_ERR_NOT_FOUND); /* inside, not asked for */
    TK_RES(kvc_memory_state_checkpoint(m, 0, 6, s0), KVC_ERR_NOT_FOUND); /* the end, not named */
    TK_RES(kvc_memory_state_checkpoint(m, 0, 7, s0), KVC_ERR_RANGE);     /* past the batch */
    TK_RES(kvc_memory_state_checkpoint(m, 0, 0, s0), KVC_ERR_RANGE);     /* its start */
    for (t = 0; t < 6; ++t) {
        step(s0, tokens[t], 0);
        step(s2, tokens[t], 1);
        for (i = 0; i < n; ++i)
            if (got[i] == t + 1) {
                TK_OK(kvc_memory_state_checkpoint(m, 0, t + 1, s0));
                if (t + 1 != 5) TK_OK(kvc_memory_state_checkpoint(m, 2, t + 1, s2)); /* layer 2 misses 5 */
            }
    }
    for (l = 1; l < 4; l += 2) {
        for (t = 0; t < 6; ++t)
            for (i = 0; i < 4; ++i) kv[t * 4 + i] = (float)(tokens[t] * 10 + i + l);
        TK_OK(kvc_memory_put(m, l, kv, kv));
    }
    TK_CHECK(mem_is(m, tokens, 6));
    TK_OK(kvc_memory_state_read(m, 2, &rd));
    {
        float want[NS];
        ref_state(tokens, 6, 1, want);
        TK_CHECK(rd != NULL && memcmp(rd, want, sizeof(want)) == 0);
    }
    TK_OK(kvc_memory_stats_get(m, &st));
    TK_EQ(st.checkpoints_dropped, 1); /* 5: layer 2's state never came */
    TK_OK(kvc_memory_can_rewind(m, 5, &ok));
    TK_EQ(ok, 0);
    TK_OK(kvc_memory_can_rewind(m, 4, &ok));
    TK_EQ(ok, 1);
    /* a batch whose every asked-for offset is handed over drops nothing more */
    TK_OK(kvc_memory_begin(m, 3, NULL, 0));
    TK_OK(kvc_memory_stats_get(m, &st));
    TK_EQ(st.checkpoints_dropped, 1); /* the first batch settled: still counted once */
    for (l = 0; l < 4; ++l) {
        if (l % 2 == 0) {
            TK_OK(kvc_memory_batch_checkpoints(m, l, got, 8, &n));
            TK_EQ(n, 2); /* 7, 8 (the reserve's; 6 is the start, 9 the end) */
            TK_OK(kvc_memory_state(m, l, 0, &s0));
            for (t = 6; t < 9; ++t) {
                step(s0, tokens[t], l / 2);
                for (i = 0; i < n; ++i)
                    if (got[i] == t + 1) TK_OK(kvc_memory_state_checkpoint(m, l, t + 1, s0));
            }
        } else {
            for (t = 0; t < 3; ++t)
                for (i = 0; i < 4; ++i) kv[t * 4 + i] = (float)(tokens[6 + t] * 10 + i + l);
            TK_OK(kvc_memory_put(m, l, kv, kv));
        }
    }
    TK_CHECK(mem_is(m, tokens, 9));
    TK_OK(kvc_memory_trim(m, 2)); /* to 7, a reserve checkpoint every layer got */
    TK_CHECK(mem_is(m, tokens, 7));
    TK_OK(kvc_memory_stats_get(m, &st));
    TK_EQ(st.checkpoints_dropped, 1);
    TK_OK(kvc_memory_destroy(m));
}

int main(int argc, char **argv) {
    (void)argc; (void)argv;
    test_state_pool_config();
    test_recurrent_basics();
    test_recurrent_checkpoints();
    test_recurrent_sequences();
    test_rotating_checkpoints();
    test_memory_config();
    test_memory_ops();
    test_persistence();
    test_memory_cancel();
    test_memory_begin_refused();
    test_memory_causal_full();
    test_memory_restore_refused();
    test_snapshot_take_refused();
    test_memory_batch_checkpoints();
    return tk_report("test_hybrid");
}
