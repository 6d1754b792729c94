/* fixture.h - the attention harness test_kernels and test_variants share (include it after
   kvcache.h and tk.h): a random shape (cache kind, K/V types, head dims, kv heads, GQA
   group, page size, length, queries, window, sinks, sequences), the same cache contents
   built in a pool of any CPU path and thread hook (build), and queries it can answer. */
#ifndef KVC_TEST_FIXTURE_H
#define KVC_TEST_FIXTURE_H

typedef struct shape {
    kvc_kind kind;
    kvc_type tk, tv;
    int32_t hk, hv, n_kv, group, page_cells, tokens, n_queries, window, sinks, seqs;
    int32_t open_batch; /* CAUSAL: the queries are an open batch of this many tokens (pos NULL) */
    int32_t f16_tail;   /* FULL, ROTATING with a quantized type: kvc_cache_config.f16_tail */
} shape;

typedef struct run {
    kvc_pool *pool;
    kvc_cache *cache;
} run;

/* the same cache contents (from seed) in a pool with the given cpu_disable and workers;
   0 when the pool or cache could not be made */
TK_UNUSED static int build(const shape *s, uint32_t disable, kvc_parallel_for_fn pf, void *pu, int32_t workers,
                           uint64_t seed, run *r) {
    kvc_pool_config pc;
    kvc_cache_config cc;
    tk_rng rng;
    int32_t done = 0, nk = s->n_kv * s->hk, nv = s->n_kv * s->hv, l, i;
    float *k = (float *)malloc(sizeof(float) * 64 * (size_t)nk), *v = (float *)malloc(sizeof(float) * 64 * (size_t)nv);
    rng.s = seed;
    kvc_pool_config_init(&pc);
    pc.n_layers = 2; pc.n_kv_heads = s->n_kv; pc.head_dim_k = s->hk; pc.head_dim_v = s->hv;
    pc.type_k = s->tk; pc.type_v = s->tv; pc.page_cells = s->page_cells;
    pc.budget_bytes = (size_t)64 << 20; pc.runtime.cpu_disable = disable;
    pc.runtime.parallel_for = pf; pc.runtime.parallel_user = pu; pc.runtime.n_workers = workers;
    kvc_cache_config_init(&cc, s->kind);
    if (s->kind == KVC_KIND_ROTATING) { cc.window = s->window; cc.sinks = s->sinks; }
    cc.f16_tail = s->f16_tail;
    if (s->kind == KVC_KIND_CAUSAL) {
        cc.capacity = s->tokens * s->seqs + 64 + s->open_batch;
        cc.max_seqs = s->seqs;
        cc.window = s->window;
    }
    if (kvc_pool_create(&pc, &r->pool) != KVC_OK) { free(k); free(v); return 0; }
    if (kvc_cache_create(r->pool, &cc, &r->cache) != KVC_OK) {
        printf("cache: kind %d window %d sinks %d capacity %d seqs %d\n", (int)s->kind, cc.window, cc.sinks, cc.capacity, cc.max_seqs);
        kvc_pool_destroy(r->pool);
        free(k); free(v);
        return 0;
    }
    while (done < s->tokens + s->open_batch) { /* batches of random sizes; CAUSAL: the sequences interleaved */
        int32_t n = tk_int(&rng, 1, 64); /* (not inside TK_MIN: it evaluates twice) */
        n = TK_MIN(n, s->tokens - done);
        if (done >= s->tokens) n = s->open_batch; /* the last batch stays open */
        if (s->kind == KVC_KIND_CAUSAL) {
            kvc_batch b;
            int32_t pos[64], seq[64];
            unsigned char nc[64];
            memset(&b, 0, sizeof(b));
            for (i = 0; i < n; ++i) {
                pos[i] = (done + i) / s->seqs;
                seq[i] = (done + i) % s->seqs;
                nc[i] = (unsigned char)(tk_int(&rng, 0, 3) == 0);
            }
            b.n_tokens = n; b.pos = pos; b.seq = seq; b.non_causal = done >= s->tokens ? nc : NULL;
            TK_OK(kvc_begin_batch(r->cache, &b));
        } else {
            TK_OK(kvc_begin(r->cache, n, NULL, 0));
        }
        for (l = 0; l < 2; ++l) {
            tk_fill(&rng, k, (size_t)n * nk, 2.0f);
            tk_fill(&rng, v, (size_t)n * nv, 1.0f);
            TK_OK(kvc_put(r->cache, l, k, v));
        }
        done += n;
    }
    free(k); free(v);
    return 1;
}

TK_UNUSED static void destroy(run *r) {
    TK_OK(kvc_cache_destroy(r->cache));
    TK_OK(kvc_pool_destroy(r->pool));
}

/* the queries of a shape: positions (and sequences) the cache can answer */
TK_UNUSED static void queries_of(const shape *s, tk_rng *rng, int32_t *pos, int32_t *seq) {
    int32_t i, last = s->kind == KVC_KIND_CAUSAL ? s->tokens / s->seqs - 1 : s->tokens - 1;
    for (i = 0; i < s->n_queries; ++i) {
        pos[i] = s->kind == KVC_KIND_ROTATING ? last - tk_int(rng, 0, 2) : tk_int(rng, 0, last);
        seq[i] = s->kind == KVC_KIND_CAUSAL ? tk_int(rng, 0, s->seqs - 1) : 0;
    }
}

/* a random shape with the given head dims and types (no open batch, no f16 tail) */
TK_UNUSED static shape random_shape(tk_rng *rng, int32_t hk, int32_t hv, kvc_type tk, kvc_type tv) {
    shape s;
    memset(&s, 0, sizeof(s));
    s.kind = (kvc_kind)tk_int(rng, 0, 2);
    s.tk = tk; s.tv = tv; s.hk = hk; s.hv = hv;
    s.n_kv = tk_int(rng, 1, 3);
    s.group = tk_pct(rng, 30) ? 1 : tk_int(rng, 2, 6);
    s.page_cells = tk_pct(rng, 50) ? tk_int(rng, 3, 20) : 256;
    s.tokens = tk_int(rng, 1, tk_pct(rng, 30) ? 1500 : 200);
    s.n_queries = tk_pct(rng, 60) ? tk_int(rng, 1, 8) : tk_int(rng, 9, 40);
    s.window = tk_pct(rng, 40) ? tk_int(rng, 1, 100) : 0;
    s.sinks = tk_int(rng, 0, 4);
    s.seqs = tk_int(rng, 1, 4);
    if (s.kind == KVC_KIND_ROTATING && s.window < 8) s.window = tk_int(rng, 8, 300);
    if (s.kind == KVC_KIND_ROTATING && s.sinks >= s.window) s.sinks = 0;
    if (s.kind == KVC_KIND_CAUSAL) s.tokens = TK_MAX(s.tokens, s.seqs);
    if (s.kind != KVC_KIND_CAUSAL) s.n_queries = TK_MIN(s.n_queries, s.tokens);
    return s;
}

TK_UNUSED static double max_abs(const float *x, size_t n) {
    double m = 0;
    size_t i;
    for (i = 0; i < n; ++i) m = fmax(m, fabs((double)x[i]));
    return m;
}

#endif
