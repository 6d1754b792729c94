/* load_fixture.h - the world the loader fuzz target (fuzz/fuzz_load.c) loads into, and
   the objects its seed corpus (fuzz/corpus/load/) is made of: `test_persist
   --write-corpus DIR` writes that corpus from the same definitions, so the two always
   agree on the pool configuration and the namespace.

   Include after kvcache.h with KVCACHE_IMPLEMENTATION (the fingerprints read the cache
   internals to cover every byte a load may change). */
#ifndef LOAD_FIXTURE_H
#define LOAD_FIXTURE_H

#define LF_LAYERS 2
#define LF_HEADS 2
#define LF_HK 4
#define LF_HV 3
#define LF_PAGE 4
#define LF_PAGES 48
#define LF_ROW (LF_HEADS * 4)

static const kvc_namespace LF_NS = {0x6b7663ull, 42};

typedef struct lf_world {
    kvc_pool *pool;
    kvc_cache *full, *rot, *causal;
    kvc_radix *tree;       /* FULL */
    kvc_radix *rtree;      /* ROTATING, the window of lf_cache_configs' rot */
    kvc_pool *spool;       /* a state pool (LF_LAYERS layers of LF_STATE floats) */
    kvc_cache *rec;        /* RECURRENT on it, LF_SEQS sequences */
} lf_world;

#define LF_STATE 6
#define LF_SEQS 3

/* values exact in f16: small integers from (layer, position, head, dim, salt) */
static float lf_val(int kv, int layer, int pos, int i, int salt) {
    return (float)((kv * 523 + layer * 131 + pos * 7 + i * 3 + salt * 1009) % 2048 - 1024);
}

static kvc_result lf_put_all(kvc_cache *c, int32_t n, const int32_t *pos, int salt) {
    float k[64 * LF_HEADS * LF_HK], v[64 * LF_HEADS * LF_HV];
    int32_t l, t, i;
    kvc_result r;
    for (l = 0; l < LF_LAYERS; ++l) {
        for (t = 0; t < n; ++t) {
            for (i = 0; i < LF_HEADS * LF_HK; ++i) k[t * LF_HEADS * LF_HK + i] = lf_val(0, l, pos[t], i, salt);
            for (i = 0; i < LF_HEADS * LF_HV; ++i) v[t * LF_HEADS * LF_HV + i] = lf_val(1, l, pos[t], i, salt);
        }
        if ((r = kvc_put(c, l, k, v)) != KVC_OK) return r;
    }
    return KVC_OK;
}

/* append n tokens to a FULL/ROTATING cache in batches of `batch` */
static kvc_result lf_append(kvc_cache *c, int32_t n, int32_t batch, int salt) {
    int32_t pos[64], off = 0, done, i;
    kvc_result r;
    for (done = 0; done < n; done += batch) {
        int32_t b = n - done < batch ? n - done : batch;
        kvc_cache_offset(c, &off);
        for (i = 0; i < b; ++i) pos[i] = off + i;
        if ((r = kvc_begin(c, b, NULL, 0)) != KVC_OK || (r = lf_put_all(c, b, pos, salt)) != KVC_OK) return r;
    }
    return KVC_OK;
}

/* a CAUSAL batch of n tokens of sequence seq from position p0 */
static kvc_result lf_causal_append(kvc_cache *c, int32_t seq, int32_t p0, int32_t n, int salt) {
    int32_t pos[64], sq[64], i;
    kvc_batch b;
    kvc_result r;
    for (i = 0; i < n; ++i) { pos[i] = p0 + i; sq[i] = seq; }
    b.n_tokens = n;
    b.pos = pos;
    b.seq = sq;
    b.non_causal = NULL;
    if ((r = kvc_begin_batch(c, &b)) != KVC_OK) return r;
    return lf_put_all(c, n, pos, salt);
}

static kvc_pool *lf_pool(kvc_type tk, kvc_type tv) {
    kvc_pool_config pc;
    kvc_pool *p = NULL;
    kvc_pool_config_init(&pc);
    pc.n_layers = LF_LAYERS;
    pc.n_kv_heads = LF_HEADS;
    pc.head_dim_k = LF_HK;
    pc.head_dim_v = LF_HV;
    pc.type_k = tk;
    pc.type_v = tv;
    pc.page_cells = LF_PAGE;
    if (kvc_pool_budget_for_tokens(&pc, LF_PAGES * LF_PAGE, &pc.budget_bytes) != KVC_OK) return NULL;
    return kvc_pool_create(&pc, &p) == KVC_OK ? p : NULL;
}

static void lf_cache_configs(kvc_cache_config *full, kvc_cache_config *rot, kvc_cache_config *causal) {
    kvc_cache_config_init(full, KVC_KIND_FULL);
    kvc_cache_config_init(rot, KVC_KIND_ROTATING);
    rot->window = 6;
    rot->sinks = 2;
    kvc_cache_config_init(causal, KVC_KIND_CAUSAL);
    causal->capacity = 32;
    causal->max_seqs = 4;
}

static kvc_pool *lf_state_pool(void) {
    kvc_pool_config pc;
    kvc_pool *p = NULL;
    kvc_pool_config_init(&pc);
    pc.n_layers = LF_LAYERS;
    pc.state_floats = LF_STATE;
    pc.budget_bytes = (size_t)4 * LF_SEQS * LF_LAYERS * (LF_STATE + 1) * 4; /* four pages a sequence */
    return kvc_pool_create(&pc, &p) == KVC_OK ? p : NULL;
}

/* RECURRENT: n tokens of sequence seq (the states take a value per token and layer) */
static kvc_result lf_rec_append(kvc_cache *c, int32_t seq, int32_t p0, int32_t n, int salt) {
    int32_t pos[64], sq[64], i, l;
    kvc_batch b;
    kvc_result r;
    for (i = 0; i < n; ++i) { pos[i] = p0 + i; sq[i] = seq; }
    b.n_tokens = n;
    b.pos = pos;
    b.seq = sq;
    b.non_causal = NULL;
    if ((r = kvc_begin_batch(c, &b)) != KVC_OK) return r;
    for (l = 0; l < LF_LAYERS; ++l) {
        float *st;
        if ((r = kvc_state(c, seq, l, &st)) != KVC_OK) return r;
        for (i = 0; i < LF_STATE; ++i) st[i] += lf_val(0, l, p0 + n, i, salt);
    }
    return KVC_OK;
}

/* The fixture's contents: full 10 tokens, rotating 15 tokens one at a time (wrapped),
   causal sequences 0 (8 tokens) and 1 (its first 5 shared + 3 of its own), a tree with
   one 9-token entry (tokens 100..108), a ROTATING tree with one 20-token entry (tokens
   200..219), a RECURRENT cache with sequences 0 (7 tokens) and 2 (3 tokens). `fill` = 0
   leaves everything empty. */
static int lf_make(lf_world *w, kvc_type tk, kvc_type tv, int fill) {
    kvc_cache_config f, r, c, rc_cache;
    kvc_radix_config rc, rr;
    kvc_cache *tmp = NULL;
    int32_t tok[20], i, reused;
    memset(w, 0, sizeof(*w));
    if ((w->pool = lf_pool(tk, tv)) == NULL || (w->spool = lf_state_pool()) == NULL) return 0;
    lf_cache_configs(&f, &r, &c);
    kvc_radix_config_init(&rc, KVC_KIND_FULL);
    kvc_radix_config_init(&rr, KVC_KIND_ROTATING);
    rr.cache.window = r.window;
    rr.cache.sinks = r.sinks;
    kvc_cache_config_init(&rc_cache, KVC_KIND_RECURRENT);
    rc_cache.max_seqs = LF_SEQS;
    if (kvc_cache_create(w->pool, &f, &w->full) || kvc_cache_create(w->pool, &r, &w->rot) ||
        kvc_cache_create(w->pool, &c, &w->causal) || kvc_radix_create(w->pool, &rc, &w->tree) ||
        kvc_radix_create(w->pool, &rr, &w->rtree) || kvc_cache_create(w->spool, &rc_cache, &w->rec))
        return 0;
    if (!fill) return 1;
    for (i = 0; i < 9; ++i) tok[i] = 100 + i;
    if (lf_append(w->full, 10, 3, 1) || lf_append(w->rot, 15, 1, 2) || lf_causal_append(w->causal, 0, 0, 8, 3) ||
        kvc_seq_copy_prefix(w->causal, 0, 1, 5) || lf_causal_append(w->causal, 1, 5, 3, 4))
        return 0;
    if (kvc_radix_lookup(w->tree, LF_NS, tok, 9, &tmp, &reused) || lf_append(tmp, 9, 9, 5) ||
        kvc_radix_commit(w->tree, LF_NS, tmp, tok, 9, 0) || kvc_cache_destroy(tmp))
        return 0;
    for (i = 0; i < 20; ++i) tok[i] = 200 + i;
    if (kvc_radix_lookup(w->rtree, LF_NS, tok, 20, &tmp, &reused) || lf_append(tmp, 20, 3, 6) ||
        kvc_radix_commit(w->rtree, LF_NS, tmp, tok, 20, 0) || kvc_cache_destroy(tmp))
        return 0;
    if (lf_rec_append(w->rec, 0, 0, 4, 7) || lf_rec_append(w->rec, 2, 0, 3, 8) || lf_rec_append(w->rec, 0, 4, 3, 9))
        return 0;
    return 1;
}

static void lf_free(lf_world *w) {
    if (w->rtree) kvc_radix_destroy(w->rtree);
    if (w->rec) kvc_cache_destroy(w->rec);
    if (w->spool) kvc_pool_destroy(w->spool);
    if (w->tree) kvc_radix_destroy(w->tree);
    if (w->full) kvc_cache_destroy(w->full);
    if (w->rot) kvc_cache_destroy(w->rot);
    if (w->causal) kvc_cache_destroy(w->causal);
    if (w->pool) kvc_pool_destroy(w->pool);
    memset(w, 0, sizeof(*w));
}

/* FNV-1a over bytes */
static uint64_t lf_mix(uint64_t h, const void *data, size_t n) {
    const unsigned char *p = (const unsigned char *)data;
    size_t i;
    for (i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

/* Everything a cache holds: its bookkeeping, and for every cell it holds
   (FULL/ROTATING: tokens below offset of its pages; CAUSAL: every cell) the position,
   sequence set and K/V bytes of every layer. */
static uint64_t lf_fingerprint(const kvc_cache *c) {
    const kvc_pool *p = c->pool;
    uint64_t h = 1469598103934665603ull;
    int32_t fields[6], i, l, cells = c->cfg.kind == KVC_KIND_CAUSAL ? c->capacity : c->n_pages * p->page_cells;
    fields[0] = c->offset; fields[1] = c->batch_begin; fields[2] = c->first_lpage; fields[3] = c->n_pages;
    fields[4] = c->n_used; fields[5] = c->batch_pending; /* not the batch view: a load starts none */
    h = lf_mix(h, fields, sizeof(fields));
    for (i = 0; c->cfg.kind == KVC_KIND_RECURRENT && i < c->cfg.max_seqs; ++i) { /* states */
        h = lf_mix(h, &c->state_off[i], 4);
        if (c->state_page[i] == KVC__NO_PAGE) continue;
        for (l = 0; l < p->cfg.n_layers; ++l) h = lf_mix(h, kvc__k_at(p, l, c->state_page[i], 0), p->k_row);
    }
    for (i = 0; i < cells; ++i) {
        uint32_t page = c->pages[i / p->page_cells];
        int32_t slot = i % p->page_cells;
        if (c->cfg.kind != KVC_KIND_CAUSAL) {
            if ((int64_t)kvc__entry_lpage(c, i / p->page_cells) * p->page_cells + slot >= c->offset) continue;
        } else {
            h = lf_mix(h, c->seqs + (size_t)i * c->words, sizeof(uint32_t) * (size_t)c->words);
            if (kvc__cell_empty(c, i)) continue;
        }
        h = lf_mix(h, kvc__pos_at(p, page, slot), 4);
        for (l = 0; l < p->cfg.n_layers; ++l) {
            h = lf_mix(h, kvc__k_at(p, l, page, slot), p->k_row);
            h = lf_mix(h, kvc__v_at(p, l, page, slot), p->v_row);
        }
    }
    return h;
}
#endif
