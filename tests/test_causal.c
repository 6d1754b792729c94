/* test_causal.c - the CAUSAL kind: the scenarios of ollama's causal cache
   (kvcache.Causal) with exact masks and values,
   bad input, and a randomized model-based test against a map (sequence, position) -> K/V. */
#define KVCACHE_IMPLEMENTATION
#include "../kvcache.h"
#include "tk.h"

#include <time.h>

#define L_ 2   /* layers */
#define H_ 2   /* kv heads */
#define D_ 4   /* head dim (K and V) */
#define ROW (H_ * D_)
#define NINF (-INFINITY)

static kvc_pool *make_pool(kvc_type tk, kvc_type tv, int page_cells, int pages) {
    kvc_pool_config cfg;
    kvc_pool *p = NULL;
    kvc_pool_config_init(&cfg);
    cfg.n_layers = L_; cfg.n_kv_heads = H_; cfg.head_dim_k = D_; cfg.head_dim_v = D_;
    cfg.type_k = tk; cfg.type_v = tv; cfg.page_cells = page_cells;
    TK_OK(kvc_pool_budget_for_tokens(&cfg, pages * page_cells, &cfg.budget_bytes));
    TK_OK(kvc_pool_create(&cfg, &p));
    return p;
}

static kvc_cache *make_causal(kvc_pool *p, int capacity, int padding, int window, int chunk) {
    kvc_cache_config cc;
    kvc_cache *c = NULL;
    kvc_cache_config_init(&cc, KVC_KIND_CAUSAL);
    cc.capacity = capacity; cc.padding = padding; cc.window = window; cc.chunk = chunk;
    cc.max_seqs = 300;
    cc.rope.style = KVC_ROPE_NEOX; cc.rope.theta = 10000.0f;
    TK_OK(kvc_cache_create(p, &cc, &c));
    return c;
}

/* exact in f16: K/V of (seq, pos) */
static float val(int kv, int layer, int seq, int pos, int i) {
    return (float)((kv * 97 + layer * 31 + seq * 211 + pos * 7 + i * 3) % 512 - 256);
}

/* a batch with K/V encoding (seq, pos), every layer put */
static kvc_result batch(kvc_cache *c, int n, const int32_t *pos, const int32_t *seq, const unsigned char *nc) {
    static float k[64 * ROW], v[64 * ROW];
    kvc_batch b;
    int l, t, i;
    kvc_result r;
    b.n_tokens = n; b.pos = pos; b.seq = seq; b.non_causal = nc;
    r = kvc_begin_batch(c, &b);
    if (r != KVC_OK) return r;
    for (l = 0; l < L_; ++l) {
        for (t = 0; t < n; ++t)
            for (i = 0; i < ROW; ++i) {
                k[t * ROW + i] = val(0, l, seq[t], pos[t], i);
                v[t * ROW + i] = val(1, l, seq[t], pos[t], i);
            }
        if ((r = kvc_put(c, l, k, v)) != KVC_OK) return r;
    }
    return KVC_OK;
}

static kvc_result batch_seq(kvc_cache *c, int seq, int from, int n) {
    int32_t pos[64], sq[64];
    int i;
    for (i = 0; i < n; ++i) { pos[i] = from + i; sq[i] = seq; }
    return batch(c, n, pos, sq, NULL);
}

/* the exported mask must equal `want` (rows x cols, 1 = visible) */
static int mask_is(const kvc_cache *c, int rows, int cols, int first, const char *want) {
    static float m[4096];
    int32_t r = 0, cl = 0, f = 0, i;
    if (kvc_mask_export(c, 1, m, 4096, &r, &cl, &f) != KVC_OK) return 0;
    if (r != rows || cl != cols || f != first) { fprintf(stderr, "mask %dx%d@%d, wanted %dx%d@%d\n", r, cl, f, rows, cols, first); return 0; }
    for (i = 0; i < rows * cols; ++i)
        if ((want[i] == '1') != (m[i] == 0.0f) || (want[i] == '0' && m[i] != NINF)) {
            fprintf(stderr, "mask[%d][%d] = %g, wanted %c\n", i / cols, i % cols, m[i], want[i]);
            return 0;
        }
    return 1;
}

static void test_store(void) {
    kvc_pool *p = make_pool(KVC_TYPE_F16, KVC_TYPE_F32, 4, 8);
    kvc_cache *c = make_causal(p, 16, 4, 0, 0);
    static float k[64 * ROW];
    int32_t pos[64], n = 0, i, used = 0;
    TK_OK(batch_seq(c, 0, 0, 3));
    TK_CHECK(mask_is(c, 3, 4, 0, "1000" "1100" "1110"));
    TK_OK(batch_seq(c, 0, 3, 2));
    TK_CHECK(mask_is(c, 2, 8, 0, "11110000" "11111000"));
    TK_OK(kvc_cache_offset(c, &used));
    TK_EQ(used, 5);
    TK_OK(kvc_cache_gather(c, 1, k, NULL, pos, 64, &n));
    TK_EQ(n, 8); /* the padded range: empty cells have position -1 */
    for (i = 0; i < 5; ++i) { TK_EQ(pos[i], i); TK_CHECK(k[i * ROW + 5] == val(0, 1, 0, i, 5)); }
    TK_EQ(pos[5], -1);
    {   /* kvc_begin continues sequence 0 */
        int32_t lo = 0, hi = 0;
        TK_OK(kvc_begin(c, 2, NULL, 0));
        TK_OK(kvc_cancel(c));
        TK_OK(kvc_seq_pos_range(c, 0, &lo, &hi));
        TK_EQ(lo, 0);
        TK_EQ(hi, 4);
        TK_OK(kvc_begin(c, 1, NULL, 0));
        for (i = 0; i < L_; ++i) TK_OK(kvc_put(c, i, k, k));
        TK_OK(kvc_seq_pos_range(c, 0, &lo, &hi));
        TK_EQ(hi, 5);
    }
    TK_OK(kvc_cache_destroy(c));
    TK_OK(kvc_pool_destroy(p));
}

static void test_window(void) {
    kvc_pool *p = make_pool(KVC_TYPE_F32, KVC_TYPE_F32, 4, 8);
    kvc_cache *c = make_causal(p, 8, 1, 2, 0); /* W = 2 keys including the current one */
    int32_t used = 0, lo = 0, hi = 0;
    int can = -1;
    TK_OK(batch_seq(c, 0, 0, 4));
    TK_CHECK(mask_is(c, 4, 4, 0, "1000" "1100" "0110" "0011"));
    /* window across batches: positions 4, 5 see only their own window; cells that nobody
       can see any more (positions <= 4 - 2) are released before the batch takes cells */
    TK_OK(batch_seq(c, 0, 4, 2));
    TK_OK(kvc_cache_offset(c, &used));
    TK_EQ(used, 3); /* positions 3, 4, 5 */
    TK_OK(kvc_seq_pos_range(c, 0, &lo, &hi));
    TK_EQ(lo, 3);
    TK_EQ(hi, 5);
    /* cells 0,1 were free again: the batch took them */
    TK_CHECK(mask_is(c, 2, 4, 0, "1001" "1100"));
    TK_OK(kvc_seq_can_resume(c, 0, 6, &can));
    TK_EQ(can, 1);
    TK_OK(kvc_seq_can_resume(c, 0, 4, &can)); /* needs position 3 and 4: held */
    TK_EQ(can, 1);
    TK_OK(kvc_seq_can_resume(c, 0, 3, &can)); /* needs 2: gone */
    TK_EQ(can, 0);
    TK_OK(kvc_seq_can_resume(c, 0, 7, &can)); /* would skip position 6 */
    TK_EQ(can, 0);
    TK_OK(kvc_cache_destroy(c));
    /* chunked attention: chunks of 3 positions */
    c = make_causal(p, 8, 1, 0, 3);
    TK_OK(batch_seq(c, 0, 0, 5));
    TK_CHECK(mask_is(c, 5, 5, 0, "10000" "11000" "11100" "00010" "00011"));
    TK_OK(kvc_cache_destroy(c));
    TK_OK(kvc_pool_destroy(p));
}

static void test_sequences(void) {
    kvc_pool *p = make_pool(KVC_TYPE_F32, KVC_TYPE_F16, 4, 8);
    kvc_cache *c = make_causal(p, 16, 1, 0, 0);
    int32_t pos[8] = {0, 1, 0, 1, 2, 2}, seq[8] = {0, 0, 1, 1, 1, 0};
    unsigned char nc[8] = {0, 0, 1, 1, 0, 0};
    TK_OK(batch(c, 6, pos, seq, NULL));
    TK_CHECK(mask_is(c, 6, 6, 0, "100000" "110000" "001000" "001100" "001110" "110001"));
    TK_OK(kvc_cache_clear(c));
    /* non-causal tokens (an image) see their whole sequence */
    TK_OK(batch(c, 4, pos, seq, nc));
    TK_CHECK(mask_is(c, 4, 4, 0, "1000" "1100" "0011" "0011"));
    /* copy_prefix shares cells: seq 5 takes seq 1's positions < 1 */
    TK_OK(kvc_seq_copy_prefix(c, 1, 5, 1));
    {
        int32_t p5[1] = {1}, s5[1] = {5}, lo = 0, hi = 0;
        TK_OK(batch(c, 1, p5, s5, NULL));
        TK_CHECK(mask_is(c, 1, 3, 2, "101"));
        TK_OK(kvc_seq_pos_range(c, 5, &lo, &hi));
        TK_EQ(lo, 0);
        TK_EQ(hi, 1);
        /* keep(5) drops the others: cell 2 (shared) and 4 stay */
        TK_OK(kvc_seq_keep(c, 5));
        TK_OK(kvc_cache_offset(c, &lo));
        TK_EQ(lo, 2);
        TK_OK(kvc_seq_pos_range(c, 1, &lo, &hi));
        TK_EQ(lo, -1);
    }
    TK_OK(kvc_cache_destroy(c));
    TK_OK(kvc_pool_destroy(p));
}

/* RoPE of one head's vector, in double, as the test's own reference:
   NeoX pairs (i, i + n/2), interleaved pairs (2i, 2i+1) */
static void rope_style(double *x, int n, double pos, int interleaved) {
    int i;
    for (i = 0; i < n / 2; ++i) {
        int i0 = interleaved ? 2 * i : i, i1 = interleaved ? 2 * i + 1 : i + n / 2;
        double f = pow(10000.0, -2.0 * i / n), a = x[i0], b = x[i1];
        x[i0] = a * cos(pos * f) - b * sin(pos * f);
        x[i1] = b * cos(pos * f) + a * sin(pos * f);
    }
}

/* a caller's own shift: interleaved RoPE done here instead of by the library */
static int g_callback_calls;
static void my_shift(void *user, int32_t layer, float *k, int32_t heads, int32_t dim, int32_t old_pos, int32_t new_pos) {
    int h, d;
    (void)user;
    (void)layer;
    g_callback_calls++;
    for (h = 0; h < heads; ++h) {
        double x[64];
        for (d = 0; d < dim; ++d) x[d] = k[h * dim + d];
        rope_style(x, dim, (double)new_pos - old_pos, 1);
        for (d = 0; d < dim; ++d) k[h * dim + d] = (float)x[d];
    }
}

/* mode 0: NeoX by the library, 1: interleaved by the library, 2: interleaved by a callback;
   kt: the K storage type (f16 re-rounds after rotating) */
static void test_remove_shift(int mode, kvc_type kt) {
    kvc_pool *p = make_pool(kt, KVC_TYPE_F32, 4, 8);
    kvc_cache_config cc;
    kvc_cache *c = NULL;
    static float k[16 * ROW], v[16 * ROW], got[16 * ROW];
    int32_t pos[16], seq[16], n, i, l, j;
    kvc_batch b;
    double worst = 0;
    int inter = mode != 0;
    kvc_cache_config_init(&cc, KVC_KIND_CAUSAL);
    cc.capacity = 16;
    cc.rope.style = mode == 0 ? KVC_ROPE_NEOX : KVC_ROPE_INTERLEAVED;
    cc.rope.theta = 10000.0f;
    if (mode == 2) { cc.rope.style = KVC_ROPE_NONE; cc.rope.shift = my_shift; }
    TK_OK(kvc_cache_create(p, &cc, &c));
    g_callback_calls = 0;
    /* keys stored with RoPE applied at their position */
    for (i = 0; i < 8; ++i) { pos[i] = i; seq[i] = 0; }
    b.n_tokens = 8; b.pos = pos; b.seq = seq; b.non_causal = NULL;
    TK_OK(kvc_begin_batch(c, &b));
    for (l = 0; l < L_; ++l) {
        for (i = 0; i < 8; ++i)
            for (j = 0; j < H_; ++j) {
                double x[D_];
                int d;
                for (d = 0; d < D_; ++d) x[d] = val(0, l, j, 0, d) / 256.0;
                rope_style(x, D_, i, inter);
                for (d = 0; d < D_; ++d) { k[(i * H_ + j) * D_ + d] = (float)x[d]; v[(i * H_ + j) * D_ + d] = (float)i; }
            }
        TK_OK(kvc_put(c, l, k, v));
    }
    /* a cell to be shifted shared with another sequence: refused, nothing changes */
    TK_OK(kvc_seq_copy_prefix(c, 0, 1, 8));
    TK_RES(kvc_seq_remove(c, 0, 2, 5), KVC_ERR_SHARED);
    TK_EQ(g_callback_calls, 0);
    TK_OK(kvc_seq_remove(c, 1, 0, KVC_POS_END)); /* to the end: no shift needed */
    TK_RES(kvc_seq_remove(c, 1, 0, KVC_POS_END), KVC_ERR_NOT_FOUND);
    /* drop positions 2,3,4: 5,6,7 become 2,3,4 and their keys rotate back by 3 */
    TK_OK(kvc_seq_remove(c, 0, 2, 5));
    if (mode == 2) TK_EQ(g_callback_calls, 3 * L_);
    {
        int32_t pp[1] = {5}, ss[1] = {0};
        TK_OK(batch(c, 1, pp, ss, NULL)); /* a new batch so the view covers the sequence */
    }
    for (l = 0; l < L_; ++l) {
        TK_OK(kvc_cache_gather(c, l, got, v, pos, 16, &n));
        for (i = 0; i < n; ++i) {
            if (pos[i] < 0 || pos[i] == 5) continue;
            TK_EQ(pos[i], v[i * ROW] < 2 ? v[i * ROW] : v[i * ROW] - 3); /* v holds the old position */
            for (j = 0; j < H_; ++j) {
                double x[D_];
                int d;
                for (d = 0; d < D_; ++d) x[d] = val(0, l, j, 0, d) / 256.0;
                rope_style(x, D_, pos[i], inter);
                for (d = 0; d < D_; ++d) {
                    double e = fabs(x[d] - got[(i * H_ + j) * D_ + d]);
                    if (e > worst) worst = e;
                }
            }
        }
    }
    /* f32: rounding only; f16: two roundings of values below 1 (2^-11 each) */
    TK_NEAR(worst, 0.0, kt == KVC_TYPE_F32 ? 1e-5 : 2e-3);
    TK_OK(kvc_cache_destroy(c));
    TK_OK(kvc_pool_destroy(p));
}

static void test_defrag_and_snapshots(void) {
    kvc_pool *p = make_pool(KVC_TYPE_F16, KVC_TYPE_F16, 4, 16);
    kvc_pool *q = make_pool(KVC_TYPE_F16, KVC_TYPE_F16, 4, 16);
    kvc_cache *c = make_causal(p, 16, 1, 0, 0), *other = make_causal(q, 16, 1, 0, 0);
    kvc_snapshot *s = NULL;
    kvc_snapshot_info info = {0, 0, 0, 0};
    static float k[64 * ROW];
    int32_t moves = -1, i, n = 0, pos[64], lo = 0, hi = 0, used = 0;
    /* four sequences of 4 cells each fill the cache; dropping 0 and 2 leaves holes */
    for (i = 0; i < 4; ++i) TK_OK(batch_seq(c, i, 0, 4));
    TK_RES(batch_seq(c, 9, 0, 1), KVC_ERR_FULL);
    TK_OK(kvc_seq_remove(c, 0, 0, KVC_POS_END));
    TK_OK(kvc_seq_remove(c, 2, 0, KVC_POS_END));
    TK_RES(batch_seq(c, 9, 0, 9), KVC_ERR_FULL); /* 8 free < 9: refused before any defrag */
    TK_OK(kvc_cache_offset(c, &used));
    TK_EQ(used, 8);
    TK_OK(kvc_cache_defrag(c, &moves));
    TK_EQ(moves, 1); /* seq 3's four cells fill seq 0's hole in one block move */
    TK_OK(batch_seq(c, 1, 4, 1));  /* seq 1 stayed at cells 4..7; its new cell is 8 */
    TK_OK(kvc_cache_gather(c, 0, k, NULL, pos, 64, &n));
    TK_EQ(n, 5);
    for (i = 0; i < n; ++i) { TK_EQ(pos[i], i); TK_CHECK(k[i * ROW + 1] == val(0, 0, 1, pos[i], 1)); }
    /* per-sequence snapshot: seq 3 moves to seq 7 of another cache... of the same pool */
    TK_OK(kvc_seq_snapshot(c, 3, &s));
    TK_OK(kvc_snapshot_info_get(s, &info));
    TK_EQ(info.from, 0);
    TK_EQ(info.to, 4);
    TK_EQ(info.n_pages, 1);
    TK_RES(kvc_seq_restore(other, s, 7), KVC_ERR_FOREIGN);
    TK_RES(kvc_cache_restore(c, s, 3), KVC_ERR_UNSUPPORTED);
    TK_OK(kvc_seq_remove(c, 3, 0, KVC_POS_END));
    TK_OK(kvc_seq_restore(c, s, 7));
    TK_OK(kvc_seq_pos_range(c, 7, &lo, &hi));
    TK_EQ(lo, 0);
    TK_EQ(hi, 3);
    TK_OK(batch_seq(c, 7, 4, 1)); /* the view covers seq 7: its restored K are seq 3's */
    TK_OK(kvc_cache_gather(c, 1, k, NULL, pos, 64, &n));
    {
        int found = 0;
        for (i = 0; i < n; ++i)
            if (pos[i] >= 0 && pos[i] < 4 && k[i * ROW + 2] == val(0, 1, 3, pos[i], 2)) found++;
        TK_EQ(found, 4);
    }
    TK_OK(kvc_snapshot_free(s));
    TK_OK(kvc_cache_destroy(c));
    TK_OK(kvc_cache_destroy(other));
    TK_OK(kvc_pool_destroy(p));
    TK_OK(kvc_pool_destroy(q));
}

static void test_bad_input(void) {
    kvc_pool *p = make_pool(KVC_TYPE_F32, KVC_TYPE_F32, 4, 8);
    kvc_cache *c = make_causal(p, 8, 1, 0, 0), *full = NULL, *tmp = NULL;
    kvc_cache_config cc;
    int32_t pos[2] = {0, 1}, seq[2] = {0, 0}, bad_seq[2] = {0, 300}, bad_pos[2] = {0, -1}, used = -1, n;
    kvc_batch b;
    kvc_snapshot *s = NULL;
    float m[4];
    kvc_cache_config_init(&cc, KVC_KIND_CAUSAL);
    TK_RES(kvc_cache_create(p, &cc, &tmp), KVC_ERR_INVALID); /* capacity 0 */
    cc.capacity = 100;
    TK_RES(kvc_cache_create(p, &cc, &tmp), KVC_ERR_FULL);    /* more pages than the pool has */
    cc.capacity = 4; cc.rope.style = KVC_ROPE_NEOX;          /* theta missing */
    TK_RES(kvc_cache_create(p, &cc, &tmp), KVC_ERR_INVALID);
    cc.rope.theta = 1e4f; cc.rope.n_dims = 3;
    TK_RES(kvc_cache_create(p, &cc, &tmp), KVC_ERR_INVALID);
    TK_CHECK(tmp == NULL);
    kvc_cache_config_init(&cc, KVC_KIND_FULL);
    TK_OK(kvc_cache_create(p, &cc, &full));
    TK_OK(batch_seq(c, 0, 0, 2));
    b.n_tokens = 2; b.pos = pos; b.seq = bad_seq; b.non_causal = NULL;
    TK_RES(kvc_begin_batch(c, &b), KVC_ERR_RANGE);
    b.seq = seq; b.pos = bad_pos;
    TK_RES(kvc_begin_batch(c, &b), KVC_ERR_RANGE);
    b.pos = NULL;
    TK_RES(kvc_begin_batch(c, &b), KVC_ERR_NULL);
    b.pos = pos; b.n_tokens = 0;
    TK_RES(kvc_begin_batch(c, &b), KVC_ERR_INVALID);
    {
        int32_t nine[9] = {0, 1, 2, 3, 4, 5, 6, 7, 8}, zeros[9] = {0};
        b.n_tokens = 9; b.pos = nine; b.seq = zeros;
        TK_RES(kvc_begin_batch(c, &b), KVC_ERR_FULL);
        b.n_tokens = 2; b.pos = pos; b.seq = seq;
    }
    TK_RES(kvc_begin_batch(full, &b), KVC_ERR_UNSUPPORTED);
    TK_RES(kvc_seq_remove(c, 4, 0, 1), KVC_ERR_NOT_FOUND);
    TK_RES(kvc_seq_remove(c, -1, 0, 1), KVC_ERR_RANGE);
    TK_RES(kvc_seq_remove(c, 0, 3, 1), KVC_ERR_INVALID);
    TK_RES(kvc_seq_remove(full, 0, 0, 1), KVC_ERR_UNSUPPORTED);
    TK_RES(kvc_seq_copy_prefix(c, 0, 0, 5), KVC_ERR_INVALID);
    TK_RES(kvc_seq_copy_prefix(c, 0, 300, 5), KVC_ERR_RANGE);
    TK_RES(kvc_seq_copy_prefix(c, 0, 1, -1), KVC_ERR_INVALID);
    TK_RES(kvc_seq_keep(c, 300), KVC_ERR_RANGE);
    TK_RES(kvc_seq_snapshot(c, 5, &s), KVC_ERR_NOT_FOUND);
    TK_RES(kvc_mask_export(c, 1, m, 3, &n, &n, &n), KVC_ERR_RANGE);
    TK_RES(kvc_mask_export(full, 1, NULL, 0, &n, &n, &n), KVC_ERR_UNSUPPORTED);
    TK_RES(kvc_cache_defrag(full, NULL), KVC_ERR_UNSUPPORTED);
    TK_RES(kvc_cache_trim(c, 1), KVC_ERR_UNSUPPORTED);
    TK_RES(kvc_snapshot_take(c, 0, KVC_POS_END, &s), KVC_ERR_UNSUPPORTED);
    TK_RES(kvc_cache_fork(c, &tmp), KVC_ERR_UNSUPPORTED);
    TK_RES(kvc_prefix_create(&c, 1, 4, NULL), KVC_ERR_NULL);
    {
        kvc_prefix *px = NULL;
        TK_RES(kvc_prefix_create(&c, 1, 4, &px), KVC_ERR_UNSUPPORTED);
    }
    {   /* attention: explicit queries need sequences */
        kvc_attention_desc d;
        float q[2 * ROW], out[2 * ROW];
        memset(&d, 0, sizeof(d));
        memset(q, 0, sizeof(q));
        d.n_queries = 1; d.n_heads = H_; d.q = q; d.out = out; d.pos = pos;
        TK_RES(kvc_attention(c, 0, &d), KVC_ERR_NULL);
        d.seq = bad_seq + 1;
        TK_RES(kvc_attention(c, 0, &d), KVC_ERR_RANGE);
        d.pos = NULL; /* the batch: 2 queries */
        TK_RES(kvc_attention(c, 0, &d), KVC_ERR_RANGE);
    }
    TK_OK(kvc_cache_offset(c, &used));
    TK_EQ(used, 2);
    TK_OK(kvc_cache_destroy(c));
    TK_OK(kvc_cache_destroy(full));
    TK_OK(kvc_pool_destroy(p));
}

/* ---- randomized model-based test ---------------------------------------------------- */

#define RS 5     /* sequences */
#define RP 96    /* positions */
#define CAP 48   /* cells: a multiple of every padding the test picks */

typedef struct ref_entry {
    int has, cell;            /* cell: an id shared by copy_prefix, not the cache's index */
    float k[L_][ROW], v[L_][ROW];
} ref_entry;

typedef struct ref_model {
    ref_entry e[RS][RP];
    int next_cell, window, chunk;
} ref_model;

static int ref_cells_used(const ref_model *m) {
    static unsigned char seen[1 << 16];
    int s, p, n = 0;
    memset(seen, 0, sizeof(seen));
    for (s = 0; s < RS; ++s)
        for (p = 0; p < RP; ++p)
            if (m->e[s][p].has && !seen[m->e[s][p].cell & 0xffff]) { seen[m->e[s][p].cell & 0xffff] = 1; n++; }
    return n;
}
static int ref_max_pos(const ref_model *m, int s) {
    int p, hi = -1;
    for (p = 0; p < RP; ++p) if (m->e[s][p].has) hi = p;
    return hi;
}
static int ref_min_pos(const ref_model *m, int s) {
    int p;
    for (p = 0; p < RP; ++p) if (m->e[s][p].has) return p;
    return -1;
}
/* sequences other than s holding `cell` */
static int ref_cell_shared(const ref_model *m, int s, int cell) {
    int t, p;
    for (t = 0; t < RS; ++t)
        for (p = 0; p < RP; ++p)
            if (t != s && m->e[t][p].has && m->e[t][p].cell == cell) return 1;
    return 0;
}
/* cells whose every holder satisfies dead(seq, pos) */
static int ref_freeable(const ref_model *m, const int *minpos) {
    static int all_dead[1 << 16], present[1 << 16];
    int s, p, n = 0, c;
    memset(present, 0, sizeof(present));
    for (c = 0; c < (1 << 16); ++c) all_dead[c] = 1;
    for (s = 0; s < RS; ++s)
        for (p = 0; p < RP; ++p)
            if (m->e[s][p].has) {
                int id = m->e[s][p].cell & 0xffff, dead = m->window > 0 && minpos[s] >= 0 && p <= minpos[s] - m->window;
                present[id] = 1;
                if (!dead) all_dead[id] = 0;
            }
    for (c = 0; c < (1 << 16); ++c) n += present[c] && all_dead[c];
    return n;
}

static int ref_visible(const ref_model *m, int key, int p, int nc, int window) {
    if (!nc && key > p) return 0;
    if (m->window > 0 && key <= p - m->window) return 0;
    if (window > 0 && key <= p - window) return 0;
    if (m->chunk > 0 && key / m->chunk != p / m->chunk) return 0;
    return 1;
}

static double ref_attend_err(const ref_model *m, int s, int p, int nc, int window, int layer, const float *q,
                             const float *out, int heads) {
    double worst = 0, w[RP];
    int h, g, key, d;
    for (h = 0; h < heads; ++h) {
        double mx = -1e300, sum = 0;
        g = h / (heads / H_);
        for (key = 0; key < RP; ++key) {
            w[key] = -1e301;
            if (!m->e[s][key].has || !ref_visible(m, key, p, nc, window)) continue;
            w[key] = 0;
            for (d = 0; d < D_; ++d) w[key] += (double)q[h * D_ + d] * m->e[s][key].k[layer][g * D_ + d];
            w[key] *= 0.5; /* 1/sqrt(4) */
            if (w[key] > mx) mx = w[key];
        }
        for (key = 0; key < RP; ++key) { w[key] = w[key] < -1e300 ? 0 : exp(w[key] - mx); sum += w[key]; }
        for (d = 0; d < D_; ++d) {
            double acc = 0;
            for (key = 0; key < RP; ++key) if (w[key] > 0) acc += w[key] * m->e[s][key].v[layer][g * D_ + d];
            acc = sum > 0 ? acc / sum : 0;
            if (fabs(acc - out[h * D_ + d]) > worst) worst = fabs(acc - out[h * D_ + d]);
        }
    }
    return worst;
}

static void rotate_ref(float *k, double delta) { /* NeoX over each head, theta 1e4 */
    int h, i;
    for (h = 0; h < H_; ++h)
        for (i = 0; i < D_ / 2; ++i) {
            double f = pow(10000.0, -2.0 * i / D_), a = k[h * D_ + i], b = k[h * D_ + i + D_ / 2];
            k[h * D_ + i] = (float)(a * cos(delta * f) - b * sin(delta * f));
            k[h * D_ + i + D_ / 2] = (float)(b * cos(delta * f) + a * sin(delta * f));
        }
}

static void compare(kvc_cache *c, const ref_model *m, tk_rng *rng, int step) {
    int32_t used = -1, s, lo, hi;
    static float q[64 * ROW], out[64 * ROW];
    kvc_attention_desc d;
    int i;
    TK_OK(kvc_cache_offset(c, &used));
    TK_EQ(used, ref_cells_used(m));
    for (s = 0; s < RS; ++s) {
        TK_OK(kvc_seq_pos_range(c, s, &lo, &hi));
        TK_EQ(lo, ref_min_pos(m, s));
        TK_EQ(hi, ref_max_pos(m, s));
    }
    memset(&d, 0, sizeof(d));
    for (i = 0; i < 3; ++i) {
        int32_t qp = tk_int(rng, 0, RP - 1), qs = tk_int(rng, 0, RS - 1), l = tk_int(rng, 0, L_ - 1), j;
        int heads = H_ * tk_int(rng, 1, 2);
        for (j = 0; j < heads * D_; ++j) q[j] = tk_float(rng);
        d.n_queries = 1; d.n_heads = heads; d.q = q; d.out = out; d.pos = &qp; d.seq = &qs;
        d.non_causal = tk_int(rng, 0, 5) == 0;
        d.window = tk_int(rng, 0, 3) == 0 ? tk_int(rng, 1, 8) : 0;
        TK_OK(kvc_attention(c, l, &d));
        {
            double e = ref_attend_err(m, qs, qp, d.non_causal, d.window, l, q, out, heads);
            if (e > 1e-4) fprintf(stderr, "step %d: attention seq %d pos %d layer %d: error %g\n", step, qs, qp, l, e);
            TK_CHECK(e <= 1e-4);
        }
    }
}

static void random_episode(tk_rng *rng, int steps) {
    static ref_model m, saved;
    int page_cells = tk_int(rng, 1, 7);
    /* f32 K: shifts re-rotate exactly. Pages for the cache's CAP cells and as many again
       for the per-sequence snapshot it may hold, so that no call runs out of pages. */
    kvc_pool *p = make_pool(KVC_TYPE_F32, KVC_TYPE_F16, page_cells, 2 * ((CAP + page_cells - 1) / page_cells));
    kvc_cache_config cc;
    kvc_cache *c = NULL;
    kvc_snapshot *snap = NULL;
    int snap_n = 0, step;
    memset(&m, 0, sizeof(m));
    kvc_cache_config_init(&cc, KVC_KIND_CAUSAL);
    cc.capacity = CAP; cc.padding = tk_int(rng, 1, 4); cc.max_seqs = RS;
    cc.window = tk_int(rng, 0, 2) ? 0 : tk_int(rng, 1, 12);
    cc.chunk = tk_int(rng, 0, 4) ? 0 : tk_int(rng, 2, 9);
    cc.rope.style = KVC_ROPE_NEOX; cc.rope.theta = 10000.0f;
    m.window = cc.window; m.chunk = cc.chunk;
    TK_OK(kvc_cache_create(p, &cc, &c));
    if (!c) { kvc_pool_destroy(p); return; }
    for (step = 0; step < steps; ++step) {
        int op = tk_int(rng, 0, 99), s = tk_int(rng, 0, RS - 1), t = tk_int(rng, 0, RS - 1);
        kvc_result r;
        if (op < 45) { /* a batch */
            static float k[32 * ROW], v[32 * ROW];
            int32_t pos[32], seq[32], minpos[RS], nxt[RS], n = 0, i, l, j;
            unsigned char nc[32];
            int want_full;
            for (i = 0; i < RS; ++i) { minpos[i] = -1; nxt[i] = ref_max_pos(&m, i) + 1; }
            for (i = tk_int(rng, 1, 3); i > 0; --i) {
                int sq = tk_int(rng, 0, RS - 1), cnt = tk_int(rng, 1, 4);
                while (cnt-- > 0 && nxt[sq] < RP && n < 32) {
                    if (minpos[sq] < 0) minpos[sq] = nxt[sq];
                    pos[n] = nxt[sq]++; seq[n] = sq; nc[n] = tk_int(rng, 0, 9) == 0; n++;
                }
            }
            if (n == 0) continue;
            want_full = CAP - ref_cells_used(&m) + ref_freeable(&m, minpos) < n;
            {
                kvc_batch b;
                b.n_tokens = n; b.pos = pos; b.seq = seq; b.non_causal = nc;
                r = kvc_begin_batch(c, &b);
            }
            TK_RES(r, want_full ? KVC_ERR_FULL : KVC_OK);
            if (r != KVC_OK) { compare(c, &m, rng, step); continue; }
            for (i = 0; i < RS; ++i) /* the window release */
                if (minpos[i] >= 0 && m.window > 0)
                    for (j = 0; j < RP; ++j) if (j <= minpos[i] - m.window) m.e[i][j].has = 0;
            for (l = 0; l < L_; ++l) {
                for (i = 0; i < n * ROW; ++i) { k[i] = tk_float(rng); v[i] = (float)tk_int(rng, -256, 256) / 64.0f; }
                TK_OK(kvc_put(c, l, k, v));
                for (i = 0; i < n; ++i) {
                    ref_entry *e = &m.e[seq[i]][pos[i]];
                    memcpy(e->k[l], k + i * ROW, sizeof(e->k[l]));
                    memcpy(e->v[l], v + i * ROW, sizeof(e->v[l]));
                }
            }
            for (i = 0; i < n; ++i) { m.e[seq[i]][pos[i]].has = 1; m.e[seq[i]][pos[i]].cell = ++m.next_cell; }
            {   /* the batch's own queries and its mask */
                static float q[32 * 2 * ROW], out[32 * 2 * ROW], mask[64 * CAP];
                kvc_attention_desc d;
                int32_t rows, cols, first, li = tk_int(rng, 0, L_ - 1);
                memset(&d, 0, sizeof(d));
                for (i = 0; i < n * ROW; ++i) q[i] = tk_float(rng);
                d.n_queries = n; d.n_heads = H_; d.q = q; d.out = out;
                TK_OK(kvc_attention(c, li, &d));
                for (i = 0; i < n; ++i) {
                    double e = ref_attend_err(&m, seq[i], pos[i], nc[i], 0, li, q + i * ROW, out + i * ROW, H_);
                    TK_CHECK(e <= 1e-4);
                }
                TK_OK(kvc_mask_export(c, 4, mask, sizeof(mask) / sizeof(mask[0]), &rows, &cols, &first));
                TK_EQ(rows, (n + 3) / 4 * 4);
                TK_EQ(cols % cc.padding, 0);
                for (i = 0; i < rows; ++i) {
                    int vis = 0, want = 0, key;
                    for (j = 0; j < cols; ++j) vis += mask[i * cols + j] == 0.0f;
                    if (i < n)
                        for (key = 0; key < RP; ++key) want += m.e[seq[i]][key].has && ref_visible(&m, key, pos[i], nc[i], 0);
                    TK_EQ(vis, want);
                }
            }
        } else if (op < 60) { /* remove, maybe with a shift */
            int b = tk_int(rng, 0, RP - 1), e = tk_int(rng, 0, 3) == 0 ? KVC_POS_END : b + tk_int(rng, 0, 6), want = KVC_OK, j;
            int shift = 0;
            if (ref_max_pos(&m, s) < 0) want = KVC_ERR_NOT_FOUND;
            else if (e != KVC_POS_END)
                for (j = e; j < RP; ++j)
                    if (m.e[s][j].has) { shift = 1; if (ref_cell_shared(&m, s, m.e[s][j].cell)) want = KVC_ERR_SHARED; }
            TK_RES(kvc_seq_remove(c, s, b, e), want);
            if (want == KVC_OK) {
                for (j = b; j < RP && j < e; ++j) m.e[s][j].has = 0;
                if (shift && e > b)
                    for (j = e; j < RP; ++j)
                        if (m.e[s][j].has) {
                            int l;
                            m.e[s][j - (e - b)] = m.e[s][j];
                            m.e[s][j].has = 0;
                            for (l = 0; l < L_; ++l) rotate_ref(m.e[s][j - (e - b)].k[l], -(double)(e - b));
                        }
            }
        } else if (op < 68) { /* copy_prefix */
            int len = tk_int(rng, 0, RP), j;
            TK_RES(kvc_seq_copy_prefix(c, s, t, len), s == t ? KVC_ERR_INVALID : KVC_OK);
            if (s != t)
                for (j = 0; j < RP; ++j) {
                    m.e[t][j].has = 0;
                    if (m.e[s][j].has && j < len) m.e[t][j] = m.e[s][j];
                }
        } else if (op < 71) { /* keep */
            int u, j;
            TK_OK(kvc_seq_keep(c, s));
            for (u = 0; u < RS; ++u) if (u != s) for (j = 0; j < RP; ++j) m.e[u][j].has = 0;
        } else if (op < 78) {
            TK_OK(kvc_cache_defrag(c, NULL));
        } else if (op < 86) { /* per-sequence snapshot */
            if (snap) { kvc_snapshot_free(snap); snap = NULL; }
            snap_n = ref_max_pos(&m, s) >= 0;
            TK_RES(kvc_seq_snapshot(c, s, &snap), snap_n ? KVC_OK : KVC_ERR_NOT_FOUND);
            if (snap) { int j; for (j = 0; j < RP; ++j) saved.e[0][j] = m.e[s][j]; }
        } else if (op < 94) { /* restore it as sequence t */
            int n = 0, only_t = 0, j, want;
            static unsigned char counted[1 << 16];
            if (!snap) continue;
            for (j = 0; j < RP; ++j) n += saved.e[0][j].has;
            memset(counted, 0, sizeof(counted));
            for (j = 0; j < RP; ++j)
                if (m.e[t][j].has && !ref_cell_shared(&m, t, m.e[t][j].cell) && !counted[m.e[t][j].cell & 0xffff]) {
                    counted[m.e[t][j].cell & 0xffff] = 1;
                    only_t++;
                }
            want = CAP - ref_cells_used(&m) + only_t < n ? KVC_ERR_FULL : KVC_OK;
            TK_RES(kvc_seq_restore(c, snap, t), want);
            if (want == KVC_OK)
                for (j = 0; j < RP; ++j) {
                    m.e[t][j] = saved.e[0][j];
                    if (m.e[t][j].has) m.e[t][j].cell = ++m.next_cell;
                }
        } else if (op < 96) {
            TK_OK(kvc_cache_clear(c));
            memset(m.e, 0, sizeof(m.e));
        } else {
            continue;
        }
        compare(c, &m, rng, step);
    }
    kvc_snapshot_free(snap);
    TK_OK(kvc_cache_destroy(c));
    {
        kvc_pool_stats st;
        TK_OK(kvc_pool_stats_get(p, &st));
        TK_EQ(st.pages_used, 0);
    }
    TK_OK(kvc_pool_destroy(p));
}

int main(int argc, char **argv) {
    tk_rng rng;
    int episodes = (int)(60 * tk_scale()) + 1, i;
    rng.s = argc > 1 ? strtoull(argv[1], NULL, 10) : (unsigned long long)time(NULL) * 2654435761ull;
    printf("seed %llu\n", rng.s);
    test_store();
    test_window();
    test_sequences();
    test_remove_shift(0, KVC_TYPE_F32);
    test_remove_shift(1, KVC_TYPE_F32);
    test_remove_shift(2, KVC_TYPE_F32);
    test_remove_shift(0, KVC_TYPE_F16);
    test_defrag_and_snapshots();
    test_bad_input();
    for (i = 0; i < episodes; ++i) random_episode(&rng, 300);
    return tk_report("causal");
}
