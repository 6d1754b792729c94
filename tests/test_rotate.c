/* test_rotate.c - rotated storage (kvc_pool_config.rotate): the rule against its dense
   matrix, rotated against plain attention on every type and kind, gather and views,
   RoPE shifts, accuracy on data with outlier channels, bad configurations, save/load.
   Usage: test_rotate [seed] */
#define KVCACHE_IMPLEMENTATION
#include "../kvcache.h"
#include "tk.h"
#include <time.h>

/* ---- the rule: kvc_rotate_rows against R as a dense matrix, in double ------------- */

static int32_t block_of(int32_t d) { /* the rule, written again */
    int32_t n = 1;
    while (n < 256 && d % (2 * n) == 0) n *= 2;
    return n < 16 ? 0 : n;
}

/* R[i][j] of a head of d values: the block-diagonal (1/sqrt n) H S */
static double rule_entry(int32_t d, int32_t i, int32_t j) {
    static const uint32_t signs[8] = KVC_ROTATION_SIGNS_INIT;
    int32_t n = block_of(d), a = i % n, b = j % n, par = 0, x;
    double s = ((signs[(j & 255) >> 5] >> (j & 31)) & 1u) ? -1.0 : 1.0;
    (void)d;
    if (i / n != j / n) return 0.0;
    for (x = a & b; x; x >>= 1) par ^= x & 1;
    return (par ? -s : s) / sqrt((double)n);
}

static void test_rule(tk_rng *rng) {
    static const int32_t dims[] = {16, 32, 48, 64, 80, 96, 112, 128, 160, 192, 256, 384, 512, 768};
    static const int32_t refused[] = {0, -16, 1, 2, 8, 24, 40, 56, 72, 88};
    int32_t k, n, i, j, r;
    for (k = 0; k < (int32_t)(sizeof(dims) / sizeof(dims[0])); ++k) {
        int32_t d = dims[k], rows = 3;
        float *x = (float *)malloc(sizeof(float) * (size_t)d * rows), *y = (float *)malloc(sizeof(float) * (size_t)d * rows);
        double err = 0, back = 0, norm_in = 0, norm_out = 0;
        TK_OK(kvc_rotation_block(d, &n));
        TK_EQ(n, block_of(d));
        tk_fill(rng, x, (size_t)d * rows, 3.0f);
        memcpy(y, x, sizeof(float) * (size_t)d * rows);
        TK_OK(kvc_rotate_rows(y, d, rows, 0));
        for (r = 0; r < rows; ++r)
            for (i = 0; i < d; ++i) {
                double want = 0;
                for (j = 0; j < d; ++j) want += rule_entry(d, i, j) * x[r * d + j];
                err = fmax(err, fabs(want - y[r * d + i]));
                norm_in += (double)x[r * d + i] * x[r * d + i];
                norm_out += (double)y[r * d + i] * y[r * d + i];
            }
        /* the inverse is the transpose */
        {
            float *z = (float *)malloc(sizeof(float) * (size_t)d * rows);
            memcpy(z, y, sizeof(float) * (size_t)d * rows);
            TK_OK(kvc_rotate_rows(z, d, rows, 1));
            for (r = 0; r < rows; ++r)
                for (i = 0; i < d; ++i) {
                    double want = 0;
                    for (j = 0; j < d; ++j) want += rule_entry(d, j, i) * y[r * d + j];
                    err = fmax(err, fabs(want - z[r * d + i]));
                    back = fmax(back, fabs((double)z[r * d + i] - x[r * d + i]));
                }
            free(z);
        }
        if (!(err <= 1e-5 && back <= 1e-5)) printf("rule d %d: err %.3g back %.3g\n", d, err, back);
        TK_CHECK(err <= 1e-5);       /* values of up to 3: float sums of n terms */
        TK_CHECK(back <= 1e-5);      /* R^T R = I */
        TK_CHECK(fabs(norm_in - norm_out) <= 1e-5 * norm_in); /* orthonormal */
        free(x); free(y);
    }
    for (k = 0; k < (int32_t)(sizeof(refused) / sizeof(refused[0])); ++k) {
        float x[88];
        memset(x, 0, sizeof(x));
        n = 7;
        TK_RES(kvc_rotation_block(refused[k], &n), KVC_ERR_INVALID);
        TK_EQ(n, 0);
        if (refused[k] > 0) TK_RES(kvc_rotate_rows(x, refused[k], 1, 0), KVC_ERR_INVALID);
    }
    {   /* the library's float signs are the table's bits */
        static const uint32_t signs[8] = KVC_ROTATION_SIGNS_INIT;
        int32_t bad = 0;
        for (i = 0; i < 256; ++i) bad += kvc__rot_sign_f[i] != (((signs[i >> 5] >> (i & 31)) & 1u) ? -1.0f : 1.0f);
        TK_EQ(bad, 0);
    }
    TK_RES(kvc_rotation_block(128, NULL), KVC_ERR_NULL);
    TK_RES(kvc_rotate_rows(NULL, 128, 1, 0), KVC_ERR_NULL);
    TK_OK(kvc_rotate_rows(NULL, 128, 0, 0));
    {
        float x[128];
        TK_RES(kvc_rotate_rows(x, 128, -1, 0), KVC_ERR_INVALID);
    }
}

/* ---- CPU paths: the same bits as the scalar reference ------------------------------ */

static void test_paths(tk_rng *rng) {
    uint32_t f = 0;
    kvc__rot_fn fn;
    int32_t n, i, inv, bad = 0;
    float x[256], y[256];
    TK_OK(kvc_cpu_features(&f));
    fn = kvc__pick_rot(f);
    printf("rotation path: %s\n", fn == kvc__rot_one ? "scalar" : "simd");
    for (n = 16; n <= 256; n *= 2)
        for (inv = 0; inv < 2; ++inv)
            for (i = 0; i < 20; ++i) {
                int32_t i0 = n * tk_int(rng, 0, 512 / n - 1), j;
                tk_fill(rng, x, (size_t)n, tk_pct(rng, 20) ? 1e30f : 3.0f);
                memcpy(y, x, sizeof(float) * (size_t)n);
                kvc__rot_one(x, i0, n, inv);
                fn(y, i0, n, inv);
                for (j = 0; j < n; ++j) bad += memcmp(&x[j], &y[j], 4) != 0;
            }
    TK_EQ(bad, 0);
    {   /* pools of the scalar path and of the best one store the same bytes */
        kvc_pool *pp[2];
        kvc_cache *cp[2];
        kvc_run ra, rb;
        int32_t nr = 0, k;
        float kv[3 * 2 * 96];
        tk_fill(rng, kv, sizeof(kv) / sizeof(kv[0]), 2.0f);
        for (k = 0; k < 2; ++k) {
            kvc_pool_config pc;
            kvc_cache_config cc;
            kvc_pool_config_init(&pc);
            pc.n_layers = 1; pc.n_kv_heads = 2; pc.head_dim_k = pc.head_dim_v = 96;
            pc.budget_bytes = (size_t)1 << 20; pc.rotate = KVC_ROTATE_K | KVC_ROTATE_V;
            pc.runtime.cpu_disable = k ? 0 : ~0u;
            kvc_cache_config_init(&cc, KVC_KIND_FULL);
            TK_OK(kvc_pool_create(&pc, &pp[k]));
            TK_OK(kvc_cache_create(pp[k], &cc, &cp[k]));
            TK_OK(kvc_begin(cp[k], 3, NULL, 0));
            TK_OK(kvc_put(cp[k], 0, kv, kv));
        }
        TK_OK(kvc_cache_runs(cp[0], 0, &ra, 1, &nr));
        TK_OK(kvc_cache_runs(cp[1], 0, &rb, 1, &nr));
        TK_CHECK(memcmp(ra.k, rb.k, sizeof(kv)) == 0 && memcmp(ra.v, rb.v, sizeof(kv)) == 0);
        for (k = 0; k < 2; ++k) {
            TK_OK(kvc_cache_destroy(cp[k]));
            TK_OK(kvc_pool_destroy(pp[k]));
        }
    }
}

/* ---- rotated against plain: the same data in two pools ----------------------------- */

typedef struct spec {
    kvc_kind kind;
    kvc_type tk, tv;
    int32_t hk, hv, n_kv, group, page_cells, tokens, n_queries, window, sinks, seqs;
    float outlier;  /* > 0: channels 3 and 17 of every head (K and V) are this many times larger */
    int32_t tail;   /* kvc_cache_config.f16_tail (quantized FULL / ROTATING only) */
} spec;

typedef struct built {
    kvc_pool *pool;
    kvc_cache *cache;
} built;

static void fill_kv(tk_rng *rng, const spec *s, float *x, int32_t n, int32_t d, float amp) {
    int32_t i;
    tk_fill(rng, x, (size_t)n * s->n_kv * d, amp);
    if (s->outlier > 0)
        for (i = 0; i < n * s->n_kv; ++i) {
            x[(size_t)i * d + 3] *= s->outlier;
            x[(size_t)i * d + 17 % d] *= s->outlier;
        }
}

static int build(const spec *s, uint32_t rotate, uint64_t seed, built *b) {
    kvc_pool_config pc;
    kvc_cache_config cc;
    tk_rng rng;
    int32_t done = 0, nk = s->n_kv * s->hk, nv = s->n_kv * s->hv, ok = 1;
    float *k = (float *)malloc(sizeof(float) * 64 * (size_t)nk), *v = (float *)malloc(sizeof(float) * 64 * (size_t)nv);
    rng.s = seed;
    kvc_pool_config_init(&pc);
    pc.n_layers = 2; pc.n_kv_heads = s->n_kv; pc.head_dim_k = s->hk; pc.head_dim_v = s->hv;
    pc.type_k = s->tk; pc.type_v = s->tv; pc.page_cells = s->page_cells;
    pc.budget_bytes = (size_t)64 << 20; pc.rotate = rotate;
    kvc_cache_config_init(&cc, s->kind);
    if (s->kind == KVC_KIND_ROTATING) { cc.window = s->window; cc.sinks = s->sinks; }
    cc.f16_tail = s->tail;
    if (s->kind == KVC_KIND_CAUSAL) {
        cc.capacity = s->tokens * s->seqs + 64; cc.max_seqs = s->seqs; cc.window = s->window;
        cc.rope.style = KVC_ROPE_NEOX; cc.rope.theta = 10000.0f;
    }
    if (kvc_pool_create(&pc, &b->pool) != KVC_OK) { TK_CHECK(0); free(k); free(v); return 0; }
    if (kvc_cache_create(b->pool, &cc, &b->cache) != KVC_OK) {
        TK_CHECK(0);
        kvc_pool_destroy(b->pool);
        free(k); free(v);
        return 0;
    }
    while (done < s->tokens && ok) {
        int32_t n = KVC__MIN(tk_int(&rng, 1, 64), s->tokens - done), l, i;
        if (s->kind == KVC_KIND_CAUSAL) {
            kvc_batch bt;
            int32_t pos[64], seq[64];
            memset(&bt, 0, sizeof(bt));
            for (i = 0; i < n; ++i) { pos[i] = (done + i) / s->seqs; seq[i] = (done + i) % s->seqs; }
            bt.n_tokens = n; bt.pos = pos; bt.seq = seq;
            ok = kvc_begin_batch(b->cache, &bt) == KVC_OK;
        } else {
            ok = kvc_begin(b->cache, n, NULL, 0) == KVC_OK;
        }
        for (l = 0; l < 2 && ok; ++l) {
            fill_kv(&rng, s, k, n, s->hk, 2.0f);
            fill_kv(&rng, s, v, n, s->hv, 1.0f);
            ok = kvc_put(b->cache, l, k, v) == KVC_OK;
        }
        done += n;
    }
    TK_CHECK(ok);
    free(k); free(v);
    return ok;
}

static void destroy(built *b) {
    TK_OK(kvc_cache_destroy(b->cache));
    TK_OK(kvc_pool_destroy(b->pool));
}

static void queries_of(const spec *s, tk_rng *rng, int32_t *pos, int32_t *seq) {
    int32_t i, last = s->kind == KVC_KIND_CAUSAL ? s->tokens / s->seqs - 1 : s->tokens - 1;
    for (i = 0; i < s->n_queries; ++i) {
        pos[i] = s->kind == KVC_KIND_ROTATING ? last - tk_int(rng, 0, 2) : tk_int(rng, 0, last);
        seq[i] = s->kind == KVC_KIND_CAUSAL ? tk_int(rng, 0, s->seqs - 1) : 0;
    }
}

/* attention through a caller scratch of exactly kvc_attention_scratch_bytes (or none) */
static void attend(const spec *s, const built *b, const float *q, const int32_t *pos, const int32_t *seq, float *out,
                   int with_scratch) {
    kvc_attention_desc d;
    size_t bytes = 0;
    void *mem = NULL;
    memset(&d, 0, sizeof(d));
    d.n_queries = s->n_queries; d.n_heads = s->n_kv * s->group; d.q = q; d.out = out;
    d.pos = pos; d.seq = s->kind == KVC_KIND_CAUSAL ? seq : NULL;
    d.window = s->kind == KVC_KIND_FULL ? s->window : 0;
    if (with_scratch) {
        TK_OK(kvc_attention_scratch_bytes(b->cache, &d, &bytes));
        mem = malloc(bytes);
        d.scratch = mem;
        d.scratch_bytes = bytes - 1;
        TK_RES(kvc_attention(b->cache, 1, &d), KVC_ERR_RANGE); /* one byte short */
        d.scratch_bytes = bytes;
    }
    TK_OK(kvc_attention(b->cache, 1, &d));
    free(mem);
}

/* The largest error the storage type pair may add to an output, relative to the
   output's max |value|: rotated and plain each have their type's error (test_kernels'
   accuracy bounds, about twice what it measures), so their difference may have both. */
static double tolerance(kvc_type tk, kvc_type tv) {
    static const double bound[KVC_TYPE_COUNT] = {1e-5, 1.5e-3, 1.2e-2, 3e-2, 0.35};
    return bound[tk] + bound[tv];
}

static double max_abs(const float *x, size_t n) {
    double m = 0;
    size_t i;
    for (i = 0; i < n; ++i) m = fmax(m, fabs((double)x[i]));
    return m;
}

/* gathered values, rotated against plain: rms of the difference over rms of the
   values; f32 exact up to rounding, the others about twice one side's rounding error */
static double gather_tol(uint32_t rotated, kvc_type t) {
    static const double bound[KVC_TYPE_COUNT] = {1e-6, 1e-3, 8e-3, 2e-2, 0.25};
    return rotated ? bound[t] : 0.0;
}
static double gworst[KVC_TYPE_COUNT];

static double rms_diff(const float *a, const float *b, size_t n) {
    double se = 0, sa = 1e-30;
    size_t i;
    for (i = 0; i < n; ++i) {
        se += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        sa += (double)a[i] * a[i];
    }
    return sqrt(se / sa);
}

static double worst[KVC_TYPE_COUNT][KVC_TYPE_COUNT]; /* measured, printed at the end */

static void compare(tk_rng *rng, const spec *s, uint32_t rotate) {
    int32_t nh = s->n_kv * s->group;
    size_t nq = (size_t)s->n_queries * nh * s->hk, no = (size_t)s->n_queries * nh * s->hv, i;
    float *q = (float *)malloc(sizeof(float) * nq), *ref = (float *)malloc(sizeof(float) * no);
    float *out = (float *)malloc(sizeof(float) * no);
    int32_t pos[64], seq[64];
    uint64_t seed = tk_next(rng);
    double err = 0, scale;
    built a, b;
    tk_fill(rng, q, nq, 1.0f);
    queries_of(s, rng, pos, seq);
    if (!build(s, 0, seed, &a)) goto done;
    if (!build(s, rotate, seed, &b)) { destroy(&a); goto done; }
    attend(s, &a, q, pos, seq, ref, 0);
    attend(s, &b, q, pos, seq, out, tk_pct(rng, 30));
    scale = max_abs(ref, no) + 1e-3;
    for (i = 0; i < no; ++i) err = fmax(err, fabs((double)out[i] - ref[i]));
    err /= scale;
    {   /* only the rotated side's types matter: a plain side is stored alike in both */
        kvc_type tk = (rotate & KVC_ROTATE_K) ? s->tk : KVC_TYPE_F32, tv = (rotate & KVC_ROTATE_V) ? s->tv : KVC_TYPE_F32;
        double tol = tolerance(s->tk, s->tv);
        if (!(rotate & KVC_ROTATE_K) && !(rotate & KVC_ROTATE_V)) tol = 0;
        (void)tk; (void)tv;
        worst[s->tk][s->tv] = fmax(worst[s->tk][s->tv], err);
        if (!(err <= tol)) {
            printf("rotate %u vs plain: kind %d %s/%s hk %d hv %d kv %d group %d pc %d tokens %d queries %d "
                   "window %d: max err %.3g of %.3g (tolerance %.3g)\n", rotate, (int)s->kind, kvc_type_name(s->tk),
                   kvc_type_name(s->tv), s->hk, s->hv, s->n_kv, s->group, s->page_cells, s->tokens, s->n_queries,
                   s->window, err, scale, tol);
            TK_CHECK(0);
        } else {
            TK_CHECK(1);
        }
    }
    {   /* gather gives plain rows: rotated against plain within the types' error (rms) */
        int32_t nc = 0, nc2 = 0, nk = s->n_kv * s->hk, nv = s->n_kv * s->hv;
        float *ka, *va, *kb, *vb;
        double ek, ev;
        TK_OK(kvc_cache_gather(a.cache, 1, NULL, NULL, NULL, 0, &nc));
        ka = (float *)malloc(sizeof(float) * ((size_t)nc * nk + 1));
        kb = (float *)malloc(sizeof(float) * ((size_t)nc * nk + 1));
        va = (float *)malloc(sizeof(float) * ((size_t)nc * nv + 1));
        vb = (float *)malloc(sizeof(float) * ((size_t)nc * nv + 1));
        TK_OK(kvc_cache_gather(a.cache, 1, ka, va, NULL, nc, &nc));
        TK_OK(kvc_cache_gather(b.cache, 1, kb, vb, NULL, nc, &nc2));
        TK_EQ(nc, nc2);
        ek = rms_diff(ka, kb, (size_t)nc * nk);
        ev = rms_diff(va, vb, (size_t)nc * nv);
        if (!(ek <= gather_tol(rotate & KVC_ROTATE_K, s->tk)) || !(ev <= gather_tol(rotate & KVC_ROTATE_V, s->tv)))
            printf("gather rotate %u %s/%s hk %d hv %d kind %d: k rms err %.3g, v %.3g\n", rotate,
                   kvc_type_name(s->tk), kvc_type_name(s->tv), s->hk, s->hv, (int)s->kind, ek, ev);
        gworst[s->tk] = fmax(gworst[s->tk], (rotate & KVC_ROTATE_K) ? ek : 0);
        gworst[s->tv] = fmax(gworst[s->tv], (rotate & KVC_ROTATE_V) ? ev : 0);
        TK_CHECK(ek <= gather_tol(rotate & KVC_ROTATE_K, s->tk));
        TK_CHECK(ev <= gather_tol(rotate & KVC_ROTATE_V, s->tv));
        free(ka); free(kb); free(va); free(vb);
    }
    destroy(&a);
    destroy(&b);
done:
    free(q); free(ref); free(out);
}

static spec random_spec(tk_rng *rng, kvc_kind kind, kvc_type tk, kvc_type tv) {
    static const int32_t dims[] = {32, 48, 64, 80, 96, 128, 256};
    spec s;
    memset(&s, 0, sizeof(s));
    s.kind = kind;
    s.tk = tk; s.tv = tv;
    do s.hk = dims[tk_int(rng, 0, 6)]; while (tk >= KVC_TYPE_Q8_0 && s.hk % 32 != 0);
    do s.hv = dims[tk_int(rng, 0, 6)]; while (tv >= KVC_TYPE_Q8_0 && s.hv % 32 != 0);
    s.n_kv = tk_int(rng, 1, 3);
    s.group = tk_pct(rng, 30) ? 1 : tk_int(rng, 2, 4);
    s.page_cells = tk_pct(rng, 50) ? tk_int(rng, 3, 20) : 256;
    s.tokens = tk_int(rng, 1, tk_pct(rng, 30) ? 600 : 150);
    s.n_queries = tk_pct(rng, 60) ? tk_int(rng, 1, 8) : tk_int(rng, 9, 24);
    s.window = tk_pct(rng, 40) ? tk_int(rng, 1, 100) : 0;
    s.sinks = tk_int(rng, 0, 4);
    s.seqs = tk_int(rng, 1, 3);
    if (kind == KVC_KIND_ROTATING && s.window < 8) s.window = tk_int(rng, 8, 200);
    if (kind == KVC_KIND_ROTATING && s.sinks >= s.window) s.sinks = 0;
    if (kind == KVC_KIND_CAUSAL) s.tokens = KVC__MAX(s.tokens, s.seqs);
    if (kind != KVC_KIND_CAUSAL) s.n_queries = KVC__MIN(s.n_queries, s.tokens);
    return s;
}

static void test_equivalence(tk_rng *rng) {
    int32_t tk, tv, kind, i, n = tk_scaled(2);
    for (tk = 0; tk < KVC_TYPE_COUNT; ++tk)
        for (tv = 0; tv < KVC_TYPE_COUNT; ++tv)
            for (kind = 0; kind < 3; ++kind)
                for (i = 0; i < n; ++i) {
                    spec s = random_spec(rng, (kvc_kind)kind, (kvc_type)tk, (kvc_type)tv);
                    /* an f16 tail holds the newest tokens rotated like the pages (or attention,
                       which rotates q once for every key, would score them wrongly) */
                    if (kind != KVC_KIND_CAUSAL && (tk >= KVC_TYPE_Q8_0 || tv >= KVC_TYPE_Q8_0) && tk_pct(rng, 50))
                        s.tail = tk_int(rng, 1, 40);
                    compare(rng, &s, tk_pct(rng, 60) ? KVC_ROTATE_K | KVC_ROTATE_V : (uint32_t)tk_int(rng, 1, 2));
                }
    for (tk = 0; tk < KVC_TYPE_COUNT; ++tk) {
        printf("rotated vs plain, max err / max |out|, K %-4s, V f32..q4_0:", kvc_type_name((kvc_type)tk));
        for (tv = 0; tv < KVC_TYPE_COUNT; ++tv) printf(" %.2e", worst[tk][tv]);
        printf("\n");
    }
    printf("gather, rotated vs plain, rms err / rms value, f32..q4_0:");
    for (tk = 0; tk < KVC_TYPE_COUNT; ++tk) printf(" %.2e", gworst[tk]);
    printf("\n");
}

/* kvc_cache_runs exposes the stored rows: for f32, R k exactly as kvc_rotate_rows gives it */
static void test_runs(tk_rng *rng) {
    enum { D = 96, KV = 2, N = 37 };
    static float k[N * KV * D], v[N * KV * D], kr[N * KV * D], vr[N * KV * D];
    kvc_pool_config pc;
    kvc_cache_config cc;
    kvc_pool *p;
    kvc_cache *c;
    kvc_run runs[8];
    int32_t n_runs = 0, r, done = 0, i;
    kvc_pool_config_init(&pc);
    pc.n_layers = 1; pc.n_kv_heads = KV; pc.head_dim_k = pc.head_dim_v = D; pc.page_cells = 16;
    pc.budget_bytes = (size_t)1 << 20; pc.rotate = KVC_ROTATE_K; /* V plain */
    kvc_cache_config_init(&cc, KVC_KIND_FULL);
    TK_OK(kvc_pool_create(&pc, &p));
    TK_OK(kvc_cache_create(p, &cc, &c));
    tk_fill(rng, k, sizeof(k) / sizeof(k[0]), 1.0f);
    tk_fill(rng, v, sizeof(v) / sizeof(v[0]), 1.0f);
    TK_OK(kvc_begin(c, N, NULL, 0));
    TK_OK(kvc_put(c, 0, k, v));
    memcpy(kr, k, sizeof(k));
    memcpy(vr, v, sizeof(v));
    TK_OK(kvc_rotate_rows(kr, D, N * KV, 0));
    TK_OK(kvc_cache_runs(c, 0, runs, 8, &n_runs));
    for (r = 0; r < n_runs; ++r) {
        TK_CHECK(memcmp(runs[r].k, kr + (size_t)done * KV * D, sizeof(float) * (size_t)runs[r].n_cells * KV * D) == 0);
        TK_CHECK(memcmp(runs[r].v, vr + (size_t)done * KV * D, sizeof(float) * (size_t)runs[r].n_cells * KV * D) == 0);
        done += runs[r].n_cells;
    }
    TK_EQ(done, N);
    {   /* gather un-rotates */
        static float kg[N * KV * D];
        double e = 0;
        TK_OK(kvc_cache_gather(c, 0, kg, NULL, NULL, N, &i));
        for (i = 0; i < N * KV * D; ++i) e = fmax(e, fabs((double)kg[i] - k[i]));
        TK_CHECK(e <= 1e-6);
    }
    TK_OK(kvc_cache_destroy(c));
    TK_OK(kvc_pool_destroy(p));
}

/* ---- RoPE shift of rotated keys: un-rotate, shift, re-rotate ------------------------ */

static void test_rope_shift(tk_rng *rng) {
    int32_t t;
    for (t = 0; t < KVC_TYPE_COUNT; ++t) {
        spec s;
        built a, b;
        uint64_t seed = tk_next(rng);
        int32_t nh, pos[4], seq[4], i;
        float q[4 * 4 * 128], ra[4 * 4 * 128], rb[4 * 4 * 128];
        double err = 0, scale;
        memset(&s, 0, sizeof(s));
        s.kind = KVC_KIND_CAUSAL; s.tk = s.tv = (kvc_type)t; s.hk = s.hv = 128; s.n_kv = 2; s.group = 2;
        s.page_cells = 16; s.tokens = 120; s.n_queries = 4; s.seqs = 2;
        nh = s.n_kv * s.group;
        if (!build(&s, 0, seed, &a)) continue;
        if (!build(&s, KVC_ROTATE_K | KVC_ROTATE_V, seed, &b)) { destroy(&a); continue; }
        TK_OK(kvc_seq_remove(a.cache, 0, 5, 17)); /* the later cells of sequence 0 shift by 12 */
        TK_OK(kvc_seq_remove(b.cache, 0, 5, 17));
        tk_fill(rng, q, (size_t)s.n_queries * nh * s.hk, 1.0f);
        for (i = 0; i < 4; ++i) { seq[i] = 0; pos[i] = 40 - i; }
        attend(&s, &a, q, pos, seq, ra, 0);
        attend(&s, &b, q, pos, seq, rb, 0);
        scale = max_abs(ra, (size_t)s.n_queries * nh * s.hv) + 1e-3;
        for (i = 0; i < s.n_queries * nh * s.hv; ++i) err = fmax(err, fabs((double)ra[i] - rb[i]));
        if (!(err <= tolerance(s.tk, s.tv) * scale)) printf("rope shift %s: err %.3g of %.3g\n", kvc_type_name(s.tk), err, scale);
        TK_CHECK(err <= tolerance(s.tk, s.tv) * scale);
        destroy(&a);
        destroy(&b);
    }
}

/* ---- accuracy with outlier channels: rotated q4_0 beats plain q4_0 ------------------ */

/* attention in double over plain f32 inputs (FULL, causal, the last Q positions) */
static void reference(const float *k, const float *v, const float *q, int32_t n, int32_t kv, int32_t g, int32_t d,
                      int32_t nq, double *out) {
    int32_t qi, h, c, i;
    double *sc = (double *)malloc(sizeof(double) * (size_t)n);
    for (qi = 0; qi < nq; ++qi)
        for (h = 0; h < kv * g; ++h) {
            int32_t pos = n - nq + qi;
            double m = -1e300, sum = 0, *o = out + ((size_t)qi * kv * g + h) * d;
            const float *qq = q + ((size_t)qi * kv * g + h) * d;
            for (i = 0; i < d; ++i) o[i] = 0;
            for (c = 0; c <= pos; ++c) {
                double dot = 0;
                for (i = 0; i < d; ++i) dot += (double)qq[i] * k[((size_t)c * kv + h / g) * d + i];
                sc[c] = dot / sqrt((double)d);
                m = fmax(m, sc[c]);
            }
            for (c = 0; c <= pos; ++c) {
                double w = exp(sc[c] - m);
                sum += w;
                for (i = 0; i < d; ++i) o[i] += w * v[((size_t)c * kv + h / g) * d + i];
            }
            for (i = 0; i < d; ++i) o[i] /= sum;
        }
    free(sc);
}

static double rms_error(const float *k, const float *v, const float *q, const double *ref, kvc_type t, uint32_t rotate,
                        int32_t n, int32_t kv, int32_t g, int32_t d, int32_t nq) {
    kvc_pool_config pc;
    kvc_cache_config cc;
    kvc_pool *p;
    kvc_cache *c;
    kvc_attention_desc ad;
    size_t no = (size_t)nq * kv * g * d, i;
    float *out = (float *)malloc(sizeof(float) * no);
    double se = 0, so = 0;
    kvc_pool_config_init(&pc);
    pc.n_layers = 1; pc.n_kv_heads = kv; pc.head_dim_k = pc.head_dim_v = d;
    pc.type_k = pc.type_v = t; pc.budget_bytes = (size_t)16 << 20; pc.rotate = rotate;
    kvc_cache_config_init(&cc, KVC_KIND_FULL);
    TK_OK(kvc_pool_create(&pc, &p));
    TK_OK(kvc_cache_create(p, &cc, &c));
    TK_OK(kvc_begin(c, n, NULL, 0));
    TK_OK(kvc_put(c, 0, k, v));
    memset(&ad, 0, sizeof(ad));
    ad.n_queries = nq; ad.n_heads = kv * g; ad.q = q; ad.out = out;
    TK_OK(kvc_attention(c, 0, &ad));
    for (i = 0; i < no; ++i) {
        se += (out[i] - ref[i]) * (out[i] - ref[i]);
        so += ref[i] * ref[i];
    }
    TK_OK(kvc_cache_destroy(c));
    TK_OK(kvc_pool_destroy(p));
    free(out);
    return sqrt(se / so);
}

static void test_outliers(tk_rng *rng) {
    enum { N = 300, KV = 2, G = 2, D = 128, Q = 3 };
    static float k[N * KV * D], v[N * KV * D], q[Q * KV * G * D];
    static double ref[Q * KV * G * D];
    int32_t i, t;
    tk_fill(rng, k, sizeof(k) / sizeof(k[0]), 1.0f);
    tk_fill(rng, v, sizeof(v) / sizeof(v[0]), 1.0f);
    tk_fill(rng, q, sizeof(q) / sizeof(q[0]), 1.0f);
    for (i = 0; i < N * KV; ++i) { /* two outlier channels per head, as in real keys and values */
        k[(size_t)i * D + 5] = 12.0f + 3.0f * tk_float(rng);
        k[(size_t)i * D + 70] *= 15.0f;
        v[(size_t)i * D + 33] *= 10.0f;
        v[(size_t)i * D + 100] = -8.0f + tk_float(rng);
    }
    reference(k, v, q, N, KV, G, D, Q, ref);
    for (t = KVC_TYPE_Q8_0; t <= KVC_TYPE_Q4_0; ++t) {
        double plain = rms_error(k, v, q, ref, (kvc_type)t, 0, N, KV, G, D, Q);
        double rot = rms_error(k, v, q, ref, (kvc_type)t, KVC_ROTATE_K | KVC_ROTATE_V, N, KV, G, D, Q);
        double rk = rms_error(k, v, q, ref, (kvc_type)t, KVC_ROTATE_K, N, KV, G, D, Q);
        double rv = rms_error(k, v, q, ref, (kvc_type)t, KVC_ROTATE_V, N, KV, G, D, Q);
        printf("outliers %s: rms error / rms out: plain %.3e, rotated K+V %.3e, K only %.3e, V only %.3e\n",
               kvc_type_name((kvc_type)t), plain, rot, rk, rv);
        TK_CHECK(rot < (t == KVC_TYPE_Q4_0 ? 0.6 : 1.0) * plain); /* measured: about 0.4 and 0.5 */
        TK_CHECK(rk < plain);
        TK_CHECK(rv < plain);
    }
}

/* ---- bad configurations: refused, nothing created --------------------------------- */

static void test_bad_configs(void) {
    kvc_pool_config pc;
    kvc_pool *p;
    const char *field = NULL;
    kvc_pool_config_init(&pc);
    pc.n_layers = 1; pc.n_kv_heads = 2; pc.head_dim_k = 40; pc.head_dim_v = 64; pc.budget_bytes = (size_t)1 << 20;
    pc.rotate = KVC_ROTATE_V; /* K plain: head dim 40 is fine */
    TK_OK(kvc_pool_config_check(&pc, &field));
    TK_CHECK(field == NULL);
    pc.rotate = KVC_ROTATE_K; /* block of 40 would be 8 */
    TK_RES(kvc_pool_config_check(&pc, &field), KVC_ERR_INVALID);
    TK_CHECK(field != NULL && strcmp(field, "rotate") == 0);
    p = (kvc_pool *)&pc; /* kvc_pool_create leaves *out alone on failure */
    TK_RES(kvc_pool_create(&pc, &p), KVC_ERR_INVALID);
    TK_CHECK(p == (kvc_pool *)&pc);
    pc.head_dim_k = 48; /* block 16: accepted */
    TK_OK(kvc_pool_config_check(&pc, &field));
    pc.rotate = 4; /* an unknown bit */
    TK_RES(kvc_pool_config_check(&pc, &field), KVC_ERR_INVALID);
    TK_CHECK(field != NULL && strcmp(field, "rotate") == 0);
    pc.rotate = KVC_ROTATE_K | KVC_ROTATE_V; pc.head_dim_v = 72; /* block 8 */
    TK_RES(kvc_pool_config_check(&pc, &field), KVC_ERR_INVALID);
    TK_CHECK(field != NULL && strcmp(field, "rotate") == 0);
    {   /* a state pool has no heads to rotate */
        kvc_pool_config sp;
        kvc_pool_config_init(&sp);
        sp.n_layers = 1; sp.state_floats = 64; sp.budget_bytes = (size_t)1 << 20;
        TK_OK(kvc_pool_config_check(&sp, &field));
        sp.rotate = KVC_ROTATE_K;
        TK_RES(kvc_pool_config_check(&sp, &field), KVC_ERR_INVALID);
        TK_CHECK(field != NULL && strcmp(field, "rotate") == 0);
    }
    {   /* a model memory's group: its pool's rotate is checked too */
        kvc_memory_config mc;
        kvc_group_config g;
        int32_t lg[2] = {0, 0};
        kvc_memory *m = NULL;
        kvc_memory_config_init(&mc);
        memset(&g, 0, sizeof(g));
        kvc_pool_config_init(&g.pool);
        g.pool.n_layers = 2; g.pool.n_kv_heads = 1; g.pool.head_dim_k = g.pool.head_dim_v = 40;
        g.pool.rotate = KVC_ROTATE_K;
        kvc_cache_config_init(&g.cache, KVC_KIND_FULL);
        mc.n_layers = 2; mc.layer_group = lg; mc.n_groups = 1; mc.groups = &g; mc.budget_bytes = (size_t)1 << 20;
        TK_RES(kvc_memory_config_check(&mc, &field), KVC_ERR_INVALID);
        TK_RES(kvc_memory_create(&mc, &m), KVC_ERR_INVALID);
        TK_CHECK(m == NULL);
        g.pool.head_dim_k = g.pool.head_dim_v = 64;
        TK_OK(kvc_memory_create(&mc, &m));
        TK_OK(kvc_memory_destroy(m));
    }
}

/* ---- save / load: rotate is part of the configuration ------------------------------ */

typedef struct blob { unsigned char *data; size_t size; } blob;

static blob save(const kvc_cache *c, int32_t seq) {
    kvc_mem m;
    kvc_io io;
    blob b = {NULL, 0};
    kvc_namespace ns = {7, 9};
    int32_t tok[1] = {1};
    int pass;
    memset(&m, 0, sizeof(m));
    TK_OK(kvc_io_memory(&m, &io));
    for (pass = 0; pass < 2; ++pass) {
        if (pass == 1) {
            b.data = (unsigned char *)malloc(m.size ? m.size : 1);
            m.data = b.data;
            m.capacity = m.size;
            m.size = 0;
        }
        if (seq < 0) TK_OK(kvc_cache_save(c, ns, tok, 1, &io));
        else TK_OK(kvc_seq_save(c, seq, ns, tok, 1, &io));
    }
    b.size = m.size;
    return b;
}

static kvc_result load(kvc_cache *c, const blob *b, int32_t seq) {
    kvc_mem m;
    kvc_io io;
    kvc_namespace ns = {7, 9};
    int32_t tok[4], n = 0;
    memset(&m, 0, sizeof(m));
    m.data = b->data;
    m.size = m.capacity = b->size;
    kvc_io_memory(&m, &io);
    return seq < 0 ? kvc_cache_load(c, ns, &io, tok, 4, &n) : kvc_seq_load(c, seq, ns, &io, tok, 4, &n);
}

static void test_persist(tk_rng *rng) {
    int32_t kind;
    for (kind = 0; kind < 3; ++kind) {
        spec s = random_spec(rng, (kvc_kind)kind, (kvc_type)tk_int(rng, 0, 4), (kvc_type)tk_int(rng, 0, 4));
        uint32_t rot = (uint32_t)tk_int(rng, 1, 3), other = rot == 3 ? 1 : 3;
        uint64_t seed = tk_next(rng), seed2 = tk_next(rng);
        int32_t nh = s.n_kv * s.group, pos[64], seq[64], off0 = 0, off1 = 0, seqv = -1;
        size_t nq = (size_t)s.n_queries * nh * s.hk, no = (size_t)s.n_queries * nh * s.hv;
        float *q = (float *)malloc(sizeof(float) * nq), *o1 = (float *)malloc(sizeof(float) * no);
        float *o2 = (float *)malloc(sizeof(float) * no);
        built src, same, plain, diff;
        blob b;
        if (s.kind == KVC_KIND_CAUSAL) s.seqs = 1;
        tk_fill(rng, q, nq, 1.0f);
        queries_of(&s, rng, pos, seq);
        if (!build(&s, rot, seed, &src)) { free(q); free(o1); free(o2); continue; }
        b = save(src.cache, seqv);
        attend(&s, &src, q, pos, seq, o1, 0);
        /* same rotate: bit-exact */
        if (build(&s, rot, seed2, &same)) {
            TK_OK(load(same.cache, &b, seqv));
            attend(&s, &same, q, pos, seq, o2, 0);
            if (memcmp(o1, o2, sizeof(float) * no) != 0) printf("persist kind %d rot %u %s/%s\n", kind, rot, kvc_type_name(s.tk), kvc_type_name(s.tv));
            TK_CHECK(memcmp(o1, o2, sizeof(float) * no) == 0);
            destroy(&same);
        }
        /* plain pool and another rotation: KVC_ERR_ROTATION, nothing changed */
        if (build(&s, 0, seed2, &plain)) {
            attend(&s, &plain, q, pos, seq, o1, 0);
            kvc_cache_offset(plain.cache, &off0);
            TK_RES(load(plain.cache, &b, seqv), KVC_ERR_ROTATION);
            kvc_cache_offset(plain.cache, &off1);
            TK_EQ(off0, off1);
            attend(&s, &plain, q, pos, seq, o2, 0);
            TK_CHECK(memcmp(o1, o2, sizeof(float) * no) == 0);
            {   /* and the other way: a plain save into the rotated pool */
                blob pb = save(plain.cache, seqv);
                TK_RES(load(src.cache, &pb, seqv), KVC_ERR_ROTATION);
                free(pb.data);
            }
            if (kind == KVC_KIND_CAUSAL) { /* a sequence too */
                blob sb = save(src.cache, 0);
                TK_OK(kvc_seq_remove(plain.cache, 0, 0, KVC_POS_END));
                TK_RES(load(plain.cache, &sb, 0), KVC_ERR_ROTATION);
                TK_OK(kvc_seq_pos_range(plain.cache, 0, &off0, &off1));
                TK_EQ(off1, -1); /* still empty */
                free(sb.data);
            }
            destroy(&plain);
        }
        if (build(&s, other, seed2, &diff)) {
            kvc_pool_stats st0, st1;
            kvc_pool_stats_get(diff.pool, &st0);
            TK_RES(load(diff.cache, &b, seqv), KVC_ERR_ROTATION);
            kvc_pool_stats_get(diff.pool, &st1);
            TK_EQ(st0.pages_used, st1.pages_used);
            destroy(&diff);
        }
        destroy(&src);
        free(b.data);
        free(q); free(o1); free(o2);
    }
}

/* a model memory (a ROTATING group beside a FULL one, one rotated): saved, loaded into a
   memory of the same rotation bit-exactly, refused by one whose FULL group is not rotated */
static kvc_memory *memory_of(uint32_t rotate) {
    kvc_memory_config mc;
    kvc_group_config g[2];
    static const int32_t lg[3] = {0, 1, 0};
    kvc_memory *m = NULL;
    int32_t i;
    kvc_memory_config_init(&mc);
    memset(g, 0, sizeof(g));
    for (i = 0; i < 2; ++i) {
        kvc_pool_config_init(&g[i].pool);
        g[i].pool.n_layers = i == 0 ? 2 : 1;
        g[i].pool.n_kv_heads = 2; g[i].pool.head_dim_k = g[i].pool.head_dim_v = 64;
        g[i].pool.type_k = g[i].pool.type_v = KVC_TYPE_Q4_0; g[i].pool.page_cells = 16;
        kvc_cache_config_init(&g[i].cache, i == 0 ? KVC_KIND_FULL : KVC_KIND_ROTATING);
    }
    g[0].pool.rotate = rotate;
    g[1].pool.rotate = KVC_ROTATE_K | KVC_ROTATE_V;
    g[1].cache.window = 20;
    mc.n_layers = 3; mc.layer_group = lg; mc.n_groups = 2; mc.groups = g; mc.budget_bytes = (size_t)4 << 20;
    TK_OK(kvc_memory_create(&mc, &m));
    return m;
}

static kvc_result save_memory(void *m, const kvc_io *io) {
    kvc_namespace ns = {7, 9};
    int32_t tok[1] = {1};
    return kvc_memory_save((const kvc_memory *)m, ns, tok, 1, io);
}

static void memory_attend(kvc_memory *m, const float *q, float *out) {
    kvc_attention_desc d;
    int32_t l;
    memset(&d, 0, sizeof(d));
    d.n_queries = 1; d.n_heads = 4; d.q = q;
    for (l = 0; l < 3; ++l) {
        d.out = out + (size_t)l * 4 * 64;
        TK_OK(kvc_memory_attention(m, l, &d));
    }
}

static void test_memory_persist(tk_rng *rng) {
    kvc_memory *a = memory_of(KVC_ROTATE_K), *b = memory_of(KVC_ROTATE_K), *c = memory_of(0);
    float k[40 * 2 * 64], v[40 * 2 * 64], q[4 * 64], o1[3 * 4 * 64], o2[3 * 4 * 64];
    int32_t l, off = -1, tok[4], n = 0;
    kvc_mem mm;
    kvc_io io;
    kvc_namespace ns = {7, 9};
    blob bl = {NULL, 0};
    if (a == NULL || b == NULL || c == NULL) { TK_CHECK(0); return; }
    tk_fill(rng, q, sizeof(q) / sizeof(q[0]), 1.0f);
    TK_OK(kvc_memory_begin(a, 40, NULL, 0));
    for (l = 0; l < 3; ++l) {
        tk_fill(rng, k, sizeof(k) / sizeof(k[0]), 2.0f);
        tk_fill(rng, v, sizeof(v) / sizeof(v[0]), 1.0f);
        TK_OK(kvc_memory_put(a, l, k, v));
    }
    memory_attend(a, q, o1);
    {   /* counted, then written */
        memset(&mm, 0, sizeof(mm));
        TK_OK(kvc_io_memory(&mm, &io));
        TK_OK(save_memory(a, &io));
        bl.data = (unsigned char *)malloc(mm.size);
        mm.data = bl.data; mm.capacity = mm.size; mm.size = 0;
        TK_OK(save_memory(a, &io));
        bl.size = mm.size;
    }
    memset(&mm, 0, sizeof(mm));
    mm.data = bl.data; mm.size = mm.capacity = bl.size;
    kvc_io_memory(&mm, &io);
    TK_OK(kvc_memory_load(b, ns, &io, tok, 4, &n));
    memory_attend(b, q, o2);
    TK_CHECK(memcmp(o1, o2, sizeof(o1)) == 0);
    memset(&mm, 0, sizeof(mm));
    mm.data = bl.data; mm.size = mm.capacity = bl.size;
    kvc_io_memory(&mm, &io);
    TK_RES(kvc_memory_load(c, ns, &io, tok, 4, &n), KVC_ERR_ROTATION);
    TK_OK(kvc_memory_offset(c, &off));
    TK_EQ(off, 0);
    free(bl.data);
    TK_OK(kvc_memory_destroy(a));
    TK_OK(kvc_memory_destroy(b));
    TK_OK(kvc_memory_destroy(c));
}

int main(int argc, char **argv) {
    tk_rng rng;
    rng.s = argc > 1 ? strtoull(argv[1], NULL, 10) : (unsigned long long)time(NULL) * 2654435761ull;
    printf("seed %llu (test_rotate %llu replays it)\n", rng.s, rng.s);
    test_rule(&rng);
    test_bad_configs();
    test_paths(&rng);
    test_runs(&rng);
    test_equivalence(&rng);
    test_rope_shift(&rng);
    test_outliers(&rng);
    test_persist(&rng);
    test_memory_persist(&rng);
    return tk_report("rotate");
}
