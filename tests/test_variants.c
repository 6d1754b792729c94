/* test_variants.c - the attention variants of kvc_attention_desc (learned per-head sinks,
   logit soft-capping, the log-sum-exp output), on random data with a fresh seed per run.
   - paths: every kernel path of this CPU against the scalar reference with random sinks,
     softcap and lse, every K/V type pair, the three cache kinds (CAUSAL with explicit
     queries and with the open batch's own positions, sequences and non-causal marks),
     decode (split over cell chunks) and prefill shapes; outputs and LSE compared.
   - naive: the scalar path against the formula computed directly in double on f32 keys.
   - cascade: two calls over the two halves of a cache (a trimmed fork, and the whole
     cache with a window), merged through their LSE, equal one call over the whole.
   - threads: 1..3 workers give the serial bits with the variants on.
   Caches of quantized types also run with an f16 tail (kvc_cache_config.f16_tail, its
   own reference checks are in test_tail.c).
   - edges and bad input: nothing visible (with and without a sink), a -INFINITY sink
     (no sink), softcap / sinks that are refused.
   `test_variants SEED` replays a run. */
#define KVCACHE_THREADS
#define KVCACHE_IMPLEMENTATION
#include "../kvcache.h"
#include "tk.h"
#include "fixture.h"

#include <time.h>

typedef struct variant {
    float scale, softcap, sinks[64];
    int use_sinks, use_lse, non_causal;
} variant;

static void random_variant(tk_rng *rng, int32_t n_heads, variant *v) {
    int32_t h;
    memset(v, 0, sizeof(*v));
    v->scale = tk_pct(rng, 50) ? 0.0f : 0.02f + 0.1f * (tk_float(rng) + 1.0f);
    v->softcap = tk_pct(rng, 30) ? 0.0f : 0.5f + 5.0f * (tk_float(rng) + 1.0f);
    v->use_sinks = tk_pct(rng, 70);
    v->use_lse = tk_pct(rng, 80);
    v->non_causal = tk_pct(rng, 10);
    for (h = 0; h < n_heads; ++h) /* around the scores' range; some heads without a sink */
        v->sinks[h] = tk_pct(rng, 15) ? -INFINITY : 4.0f * tk_float(rng);
}

static void attend(const shape *s, const variant *v, run *r, const float *q, const int32_t *pos, const int32_t *seq,
                   float *out, float *lse) {
    kvc_attention_desc d;
    memset(&d, 0, sizeof(d));
    d.n_queries = s->n_queries; d.n_heads = s->n_kv * s->group; d.q = q; d.out = out;
    d.pos = s->open_batch ? NULL : pos;
    d.seq = s->kind == KVC_KIND_CAUSAL && !s->open_batch ? seq : NULL;
    d.window = s->kind == KVC_KIND_FULL ? s->window : 0;
    d.non_causal = v->non_causal;
    d.scale = v->scale;
    d.softcap = v->softcap;
    d.sinks = v->use_sinks ? v->sinks : NULL;
    d.lse = v->use_lse ? lse : NULL;
    TK_OK(kvc_attention(r->cache, 1, &d));
}

/* LSE values equal (both -inf) or within tol * (1 + |a|) */
static double lse_err(float a, float b) {
    if (a == -INFINITY || b == -INFINITY) return a == b ? 0.0 : 1e30;
    return fabs((double)a - b) / (1.0 + fabs((double)a));
}

/* fixture.h's random shape, with an open batch (CAUSAL) or an f16 tail (quantized types) */
static shape random_variant_shape(tk_rng *rng, int32_t hk, int32_t hv, kvc_type tk, kvc_type tv) {
    shape s = random_shape(rng, hk, hv, tk, tv);
    if (s.kind == KVC_KIND_CAUSAL && tk_pct(rng, 40)) s.n_queries = s.open_batch = tk_int(rng, 1, 40);
    s.f16_tail = s.kind != KVC_KIND_CAUSAL && (tk >= KVC_TYPE_Q8_0 || tv >= KVC_TYPE_Q8_0) && tk_pct(rng, 50)
                     ? tk_int(rng, 1, 300) : 0;
    return s;
}

/* one shape and variant on every path: outputs within 2e-5 of scalar's (relative to the
   output's max), LSE within 2e-5 * (1 + |lse|) */
static void check_paths(tk_rng *rng, const shape *s) {
    uint32_t disable[8];
    const char *names[8];
    int32_t np = (int32_t)tk_cpu_paths(disable, names), p, nh = s->n_kv * s->group;
    size_t nq = (size_t)s->n_queries * nh * s->hk, no = (size_t)s->n_queries * nh * s->hv, nl = (size_t)s->n_queries * nh, i;
    float *q = (float *)malloc(sizeof(float) * nq), *ref = (float *)malloc(sizeof(float) * no);
    float *out = (float *)malloc(sizeof(float) * no), *lref = (float *)malloc(sizeof(float) * nl);
    float *lse = (float *)malloc(sizeof(float) * nl);
    int32_t pos[64], seq[64];
    uint64_t seed = tk_next(rng);
    variant v;
    run r;
    random_variant(rng, nh, &v);
    tk_fill(rng, q, nq, 2.0f);
    queries_of(s, rng, pos, seq);
    for (i = 0; i < nl; ++i) lref[i] = lse[i] = 12345.0f;
    if (!build(s, disable[0], NULL, NULL, 0, seed, &r)) { TK_CHECK(0); return; }
    attend(s, &v, &r, q, pos, seq, ref, lref);
    destroy(&r);
    if (v.use_lse)
        for (i = 0; i < nl; ++i) TK_CHECK(lref[i] != 12345.0f && lref[i] == lref[i]);
    for (p = 1; p < np; ++p) {
        double err = 0, lerr = 0, scale = max_abs(ref, no) + 1e-3;
        if (!build(s, disable[p], NULL, NULL, 0, seed, &r)) { TK_CHECK(0); continue; }
        attend(s, &v, &r, q, pos, seq, out, lse);
        destroy(&r);
        for (i = 0; i < no; ++i) err = fmax(err, fabs((double)out[i] - ref[i]));
        if (v.use_lse)
            for (i = 0; i < nl; ++i) lerr = fmax(lerr, lse_err(lref[i], lse[i]));
        if (!(err <= 2e-5 * scale) || !(lerr <= 2e-5)) {
            printf("%s vs scalar: kind %d %s/%s hk %d hv %d kv %d group %d pc %d tokens %d queries %d window %d open %d "
                   "tail %d softcap %g sinks %d scale %g: max err %.3g (scale %.3g), lse err %.3g\n",
                   names[p], (int)s->kind, kvc_type_name(s->tk), kvc_type_name(s->tv), s->hk, s->hv, s->n_kv, s->group,
                   s->page_cells, s->tokens, s->n_queries, s->window, s->open_batch, s->f16_tail, v.softcap, v.use_sinks, v.scale,
                   err, scale, lerr);
            TK_CHECK(0);
        } else {
            TK_CHECK(1);
        }
    }
    free(q); free(ref); free(out); free(lref); free(lse);
}

static void test_paths(tk_rng *rng) {
    static const int32_t dims[] = {64, 80, 96, 128, 256};
    int32_t tk, tv, i, n = tk_scaled(3);
    for (tk = 0; tk < KVC_TYPE_COUNT; ++tk)
        for (tv = 0; tv < KVC_TYPE_COUNT; ++tv)
            for (i = 0; i < n; ++i) {
                int32_t hk = dims[tk_int(rng, 0, 4)], hv = dims[tk_int(rng, 0, 4)];
                shape s;
                if (tk >= KVC_TYPE_Q8_0 && hk == 80) hk = 96; /* block types: multiples of 32 */
                if (tv >= KVC_TYPE_Q8_0 && hv == 80) hv = 64;
                s = random_variant_shape(rng, hk, hv, (kvc_type)tk, (kvc_type)tv);
                check_paths(rng, &s);
            }
    for (i = 0; i < 2 * n; ++i) { /* head dims no fused kernel takes: the tile path */
        shape s = random_variant_shape(rng, 4 * tk_int(rng, 1, 9) + 2 * (i & 1), 4 * tk_int(rng, 1, 9), (kvc_type)(i % 3),
                               (kvc_type)((i / 3) % 3));
        check_paths(rng, &s);
    }
}

/* ---- the scalar path (and this CPU's) against the formula in double ---- */

static kvc_result make_cache(kvc_type tk, kvc_type tv, int32_t n_kv, int32_t d, int32_t page_cells, uint32_t disable,
                             kvc_pool **pool, kvc_cache **cache) {
    kvc_pool_config pc;
    kvc_cache_config cc;
    kvc_result r;
    kvc_pool_config_init(&pc);
    pc.n_layers = 1; pc.n_kv_heads = n_kv; pc.head_dim_k = pc.head_dim_v = d;
    pc.type_k = tk; pc.type_v = tv; pc.page_cells = page_cells;
    pc.budget_bytes = (size_t)32 << 20; pc.runtime.cpu_disable = disable;
    kvc_cache_config_init(&cc, KVC_KIND_FULL);
    r = kvc_pool_create(&pc, pool);
    if (r != KVC_OK) return r;
    r = kvc_cache_create(*pool, &cc, cache);
    if (r != KVC_OK) kvc_pool_destroy(*pool);
    return r;
}

static void test_naive(tk_rng *rng) {
    int32_t round, path;
    for (round = 0; round < tk_scaled(6); ++round) {
        int32_t n = tk_int(rng, 1, 1200), n_kv = tk_int(rng, 1, 2), g = tk_int(rng, 1, 4), d = 32 * tk_int(rng, 1, 4);
        int32_t nh = n_kv * g, nq = tk_int(rng, 1, 12), window = tk_pct(rng, 40) ? tk_int(rng, 1, 300) : 0;
        int32_t qi, h, c, i, pos[12];
        float *k = (float *)malloc(sizeof(float) * (size_t)n * n_kv * d), *v = (float *)malloc(sizeof(float) * (size_t)n * n_kv * d);
        float *q = (float *)malloc(sizeof(float) * (size_t)nq * nh * d), *out = (float *)malloc(sizeof(float) * (size_t)nq * nh * d);
        double *sc = (double *)malloc(sizeof(double) * (size_t)n), *o = (double *)malloc(sizeof(double) * (size_t)d);
        float lse[12 * 8];
        variant var;
        random_variant(rng, nh, &var);
        tk_fill(rng, k, (size_t)n * n_kv * d, 2.0f);
        tk_fill(rng, v, (size_t)n * n_kv * d, 1.0f);
        tk_fill(rng, q, (size_t)nq * nh * d, 2.0f);
        for (qi = 0; qi < nq; ++qi) pos[qi] = tk_int(rng, 0, n - 1);
        for (path = 0; path < 2; ++path) { /* scalar, then this CPU's own path */
            kvc_pool *pool = NULL;
            kvc_cache *cache = NULL;
            kvc_attention_desc desc;
            double err = 0, lerr = 0, mo = 1e-3;
            TK_OK(make_cache(KVC_TYPE_F32, KVC_TYPE_F32, n_kv, d, tk_int(rng, 1, 300), path ? 0u : ~0u, &pool, &cache));
            TK_OK(kvc_begin(cache, n, NULL, 0));
            TK_OK(kvc_put(cache, 0, k, v));
            memset(&desc, 0, sizeof(desc));
            desc.n_queries = nq; desc.n_heads = nh; desc.q = q; desc.out = out; desc.pos = pos;
            desc.window = window; desc.non_causal = var.non_causal; desc.scale = var.scale;
            desc.softcap = var.softcap; desc.sinks = var.use_sinks ? var.sinks : NULL; desc.lse = lse;
            TK_OK(kvc_attention(cache, 0, &desc));
            for (qi = 0; qi < nq; ++qi)
                for (h = 0; h < nh; ++h) {
                    const float *qq = q + ((size_t)qi * nh + h) * d;
                    double scale = var.scale > 0 ? var.scale : 1.0 / sqrt((double)d), m = -INFINITY, sum = 0, l;
                    double sink = var.use_sinks ? var.sinks[h] : -INFINITY;
                    int any = 0;
                    for (c = 0; c < n; ++c) {
                        double dot = 0;
                        int vis = (var.non_causal || c <= pos[qi]) && (window == 0 || c > pos[qi] - window);
                        sc[c] = -INFINITY;
                        if (!vis) continue;
                        for (i = 0; i < d; ++i) dot += (double)qq[i] * k[((size_t)c * n_kv + h / g) * d + i];
                        sc[c] = dot * scale;
                        if (var.softcap > 0) sc[c] = var.softcap * tanh(sc[c] / var.softcap);
                        m = fmax(m, sc[c]);
                        any = 1;
                    }
                    m = fmax(m, sink);
                    for (i = 0; i < d; ++i) o[i] = 0;
                    if (any || sink != -INFINITY) {
                        for (c = 0; c < n; ++c) {
                            double w;
                            if (sc[c] == -INFINITY) continue;
                            w = exp(sc[c] - m);
                            sum += w;
                            for (i = 0; i < d; ++i) o[i] += w * v[((size_t)c * n_kv + h / g) * d + i];
                        }
                        if (sink != -INFINITY) sum += exp(sink - m);
                        for (i = 0; i < d; ++i) o[i] /= sum;
                        l = m + log(sum);
                    } else {
                        l = -INFINITY;
                    }
                    for (i = 0; i < d; ++i) {
                        err = fmax(err, fabs(o[i] - out[((size_t)qi * nh + h) * d + i]));
                        mo = fmax(mo, fabs(o[i]));
                    }
                    if (l == -INFINITY) lerr = fmax(lerr, lse[qi * nh + h] == -INFINITY ? 0.0 : 1e30);
                    else lerr = fmax(lerr, fabs(l - lse[qi * nh + h]) / (1 + fabs(l)));
                }
            if (!(err <= 1e-5 * mo && lerr <= 1e-5)) {
                printf("naive (%s): n %d d %d g %d window %d softcap %g sinks %d: err %.3g (out max %.3g), lse err %.3g\n",
                       path ? "this cpu" : "scalar", n, d, g, window, var.softcap, var.use_sinks, err, mo, lerr);
                TK_CHECK(0);
            } else {
                TK_CHECK(1);
            }
            TK_OK(kvc_cache_destroy(cache));
            TK_OK(kvc_pool_destroy(pool));
        }
        free(k); free(v); free(q); free(out); free(sc); free(o);
    }
}

/* ---- cascade: the two halves of a cache merged through their LSE ---- */

static void test_cascade(tk_rng *rng) {
    int32_t round;
    for (round = 0; round < tk_scaled(10); ++round) {
        kvc_type tk = (kvc_type)tk_int(rng, 0, 4), tv = (kvc_type)tk_int(rng, 0, 4);
        int32_t n = tk_int(rng, 2, 2000), half = tk_int(rng, 1, n - 1), n_kv = tk_int(rng, 1, 2), g = tk_int(rng, 1, 4);
        int32_t d = 64, nh = n_kv * g, nq = tk_int(rng, 1, 20), qi, h, i;
        float *k = (float *)malloc(sizeof(float) * (size_t)n * n_kv * d), *v = (float *)malloc(sizeof(float) * (size_t)n * n_kv * d);
        size_t no = (size_t)nq * nh * d;
        float *q = (float *)malloc(sizeof(float) * (size_t)nq * nh * d), *whole = (float *)malloc(sizeof(float) * no);
        float *o1 = (float *)malloc(sizeof(float) * no), *o2 = (float *)malloc(sizeof(float) * no);
        float lw[20 * 8], l1[20 * 8], l2[20 * 8];
        int32_t pos[20];
        kvc_pool *pool = NULL;
        kvc_cache *cache = NULL, *first = NULL;
        kvc_attention_desc desc;
        variant var;
        double err = 0, lerr = 0, mo = 1e-3;
        random_variant(rng, nh, &var);
        tk_fill(rng, k, (size_t)n * n_kv * d, 2.0f);
        tk_fill(rng, v, (size_t)n * n_kv * d, 1.0f);
        tk_fill(rng, q, (size_t)nq * nh * d, 2.0f);
        for (qi = 0; qi < nq; ++qi) pos[qi] = n - 1; /* every query sees every key */
        TK_OK(make_cache(tk, tv, n_kv, d, tk_int(rng, 1, 300), 0, &pool, &cache));
        TK_OK(kvc_begin(cache, n, NULL, 0));
        TK_OK(kvc_put(cache, 0, k, v));
        TK_OK(kvc_cache_fork(cache, &first));
        TK_OK(kvc_cache_trim(first, n - half)); /* keys [0, half) */
        memset(&desc, 0, sizeof(desc));
        desc.n_queries = nq; desc.n_heads = nh; desc.q = q; desc.pos = pos;
        desc.scale = var.scale; desc.softcap = var.softcap; desc.sinks = var.use_sinks ? var.sinks : NULL;
        desc.out = whole; desc.lse = lw;
        TK_OK(kvc_attention(cache, 0, &desc));
        desc.out = o1; desc.lse = l1; /* the sink joins one of the two parts */
        TK_OK(kvc_attention(first, 0, &desc));
        desc.out = o2; desc.lse = l2; desc.sinks = NULL; desc.window = n - half; /* keys [half, n) */
        TK_OK(kvc_attention(cache, 0, &desc));
        for (qi = 0; qi < nq; ++qi)
            for (h = 0; h < nh; ++h) {
                size_t row = (size_t)qi * nh + h;
                double a = l1[row], b = l2[row], m = fmax(a, b), w1 = exp(a - m), w2 = exp(b - m), l = m + log(w1 + w2);
                for (i = 0; i < d; ++i) {
                    double o = (w1 * o1[row * d + i] + w2 * o2[row * d + i]) / (w1 + w2);
                    err = fmax(err, fabs(o - whole[row * d + i]));
                    mo = fmax(mo, fabs(o));
                }
                lerr = fmax(lerr, fabs(l - lw[row]) / (1 + fabs(l)));
            }
        if (!(err <= 2e-5 * mo && lerr <= 2e-5)) { /* the types' rounding is the same in both */
            printf("cascade %s/%s n %d half %d softcap %g sinks %d: err %.3g (max %.3g), lse err %.3g\n", kvc_type_name(tk),
                   kvc_type_name(tv), n, half, var.softcap, var.use_sinks, err, mo, lerr);
            TK_CHECK(0);
        } else {
            TK_CHECK(1);
        }
        TK_OK(kvc_cache_destroy(first));
        TK_OK(kvc_cache_destroy(cache));
        TK_OK(kvc_pool_destroy(pool));
        free(k); free(v); free(q); free(whole); free(o1); free(o2);
    }
}

/* ---- threads: the serial bits whatever the worker count ---- */

static void test_threads(tk_rng *rng) {
    int32_t round, w;
    for (round = 0; round < tk_scaled(4); ++round) {
        shape s = random_variant_shape(rng, 128, 128, (kvc_type)tk_int(rng, 0, 4), (kvc_type)tk_int(rng, 0, 4));
        int32_t nh = s.n_kv * s.group, pos[64], seq[64];
        size_t nq, no, nl;
        float *q, *ref, *out, *lref, *lse;
        uint64_t seed = tk_next(rng);
        variant v;
        run r;
        s.tokens = tk_int(rng, 600, 2500); /* several split-K chunks */
        if (s.kind != KVC_KIND_CAUSAL) s.n_queries = tk_int(rng, 1, 8);
        nq = (size_t)s.n_queries * nh * s.hk; no = (size_t)s.n_queries * nh * s.hv; nl = (size_t)s.n_queries * nh;
        q = (float *)malloc(sizeof(float) * nq); ref = (float *)malloc(sizeof(float) * no);
        out = (float *)malloc(sizeof(float) * no); lref = (float *)malloc(sizeof(float) * nl);
        lse = (float *)malloc(sizeof(float) * nl);
        random_variant(rng, nh, &v);
        v.use_lse = 1;
        tk_fill(rng, q, nq, 2.0f);
        queries_of(&s, rng, pos, seq);
        if (!build(&s, 0, NULL, NULL, 0, seed, &r)) { TK_CHECK(0); break; }
        attend(&s, &v, &r, q, pos, seq, ref, lref);
        destroy(&r);
        for (w = 1; w <= 3; ++w) {
            kvc_threads *th = NULL;
            TK_OK(kvc_threads_create(w, &th));
            if (build(&s, 0, kvc_threads_parallel_for, th, w, seed, &r)) {
                attend(&s, &v, &r, q, pos, seq, out, lse);
                TK_CHECK(memcmp(out, ref, sizeof(float) * no) == 0);
                TK_CHECK(memcmp(lse, lref, sizeof(float) * nl) == 0);
                destroy(&r);
            }
            TK_OK(kvc_threads_destroy(th));
        }
        free(q); free(ref); free(out); free(lref); free(lse);
    }
}

/* ---- edges and bad input ---- */

static void test_edges(tk_rng *rng) {
    kvc_pool *pool = NULL;
    kvc_cache *cache = NULL;
    kvc_attention_desc d;
    float k[40 * 64], v[40 * 64], q[2 * 64], out[2 * 64], out2[2 * 64], lse[2], lse2[2], sinks[2];
    int32_t pos[2] = {39, 39}, i;
    tk_fill(rng, k, 40 * 64, 1.0f);
    tk_fill(rng, v, 40 * 64, 1.0f);
    tk_fill(rng, q, 2 * 64, 1.0f);
    TK_OK(make_cache(KVC_TYPE_F16, KVC_TYPE_F16, 1, 64, 16, 0, &pool, &cache));
    TK_OK(kvc_begin(cache, 40, NULL, 0));
    TK_OK(kvc_put(cache, 0, k, v));
    memset(&d, 0, sizeof(d));
    d.n_queries = 1; d.n_heads = 2; d.q = q; d.out = out; d.pos = pos; d.lse = lse;
    /* a -INFINITY sink is no sink */
    TK_OK(kvc_attention(cache, 0, &d));
    sinks[0] = sinks[1] = -INFINITY;
    d.sinks = sinks; d.out = out2; d.lse = lse2;
    TK_OK(kvc_attention(cache, 0, &d));
    TK_CHECK(memcmp(out, out2, sizeof(float) * 128) == 0 && memcmp(lse, lse2, sizeof(lse)) == 0);
    /* a huge sink takes all the weight: out ~ 0, lse ~ the sink */
    sinks[0] = 80.0f; sinks[1] = 0.5f;
    TK_OK(kvc_attention(cache, 0, &d));
    TK_CHECK(max_abs(out2, 64) < 1e-20);
    TK_NEAR(lse2[0], 80.0, 1e-5);
    TK_CHECK(lse2[1] > 0.5f && lse2[1] > lse[1]); /* log(e^0.5 + sum) */
    TK_NEAR(exp((double)lse2[1]), exp((double)lse[1]) + exp(0.5), 1e-4 * exp((double)lse2[1]));
    /* nothing visible: a window of keys past the cache (query position beyond it, window 1) */
    pos[0] = 100;
    d.window = 1;
    d.sinks = NULL;
    TK_OK(kvc_attention(cache, 0, &d));
    TK_CHECK(max_abs(out2, 128) == 0.0 && lse2[0] == -INFINITY && lse2[1] == -INFINITY);
    d.sinks = sinks; /* with a sink: zeros, lse = the sink */
    TK_OK(kvc_attention(cache, 0, &d));
    TK_CHECK(max_abs(out2, 128) == 0.0 && lse2[0] == 80.0f && lse2[1] == 0.5f);
    d.window = 0; pos[0] = 39;
    /* softcap: tiny caps flatten the scores toward uniform weights */
    d.sinks = NULL; d.softcap = 1e-6f;
    TK_OK(kvc_attention(cache, 0, &d));
    {
        double mean = 0;
        for (i = 0; i < 40; ++i) mean += (double)v[i * 64 + 3];
        TK_NEAR(out2[3], mean / 40, 1e-3);
        TK_NEAR(lse2[0], log(40.0), 1e-4);
    }
    /* bad input, refused with nothing written */
    out2[0] = 7.0f;
    d.softcap = -1.0f; TK_RES(kvc_attention(cache, 0, &d), KVC_ERR_INVALID);
    d.softcap = NAN; TK_RES(kvc_attention(cache, 0, &d), KVC_ERR_INVALID);
    d.softcap = INFINITY; TK_RES(kvc_attention(cache, 0, &d), KVC_ERR_INVALID);
    d.softcap = 0.0f; d.sinks = sinks;
    sinks[1] = NAN; TK_RES(kvc_attention(cache, 0, &d), KVC_ERR_INVALID);
    sinks[1] = INFINITY; TK_RES(kvc_attention(cache, 0, &d), KVC_ERR_INVALID);
    TK_CHECK(out2[0] == 7.0f);
    {
        size_t bytes;
        TK_RES(kvc_attention_scratch_bytes(cache, &d, &bytes), KVC_ERR_INVALID);
    }
    TK_OK(kvc_cache_destroy(cache));
    TK_OK(kvc_pool_destroy(pool));
}

int main(int argc, char **argv) {
    tk_rng rng;
    rng.s = argc > 1 ? strtoull(argv[1], NULL, 10) : (unsigned long long)time(NULL) * 2654435761ull;
    printf("seed %llu (test_variants %llu replays it)\n", rng.s, rng.s);
    test_edges(&rng);
    test_naive(&rng);
    test_cascade(&rng);
    test_paths(&rng);
    test_threads(&rng);
    return tk_report("variants");
}
