/* test_tail.c - kvc_cache_config.f16_tail: the newest tokens of a quantized cache kept
   in f16 beside the pages, on random data with a fresh seed per run.
   - decode through a tail equals f16-precision attention over the tail's tokens merged
     (through the LSE) with the quantized attention over the older ones: a cache with a
     tail against a plain quantized cache and an f16 cache fed the same rows, FULL and
     ROTATING, with random sinks / softcap, over random batches, trims, cancelled
     batches, snapshot restores, forks and save/load round trips, each with the tail
     range its rule gives (a load brings the saved tail back: attention after it is
     bit-identical to before the save);
   - the pages (every token, those that left the tail included) hold exactly what a
     cache without a tail holds, and a save of it with nothing in the tail is
     byte-for-byte a plain cache's save (the tail's rows are a TAIL section of their own);
   - a model memory's save keeps its groups' tails (attention bit-identical after the load);
   - configuration: negative, unquantized pools, CAUSAL and RECURRENT are refused.
   `test_tail SEED` replays a run. */
#define KVCACHE_IMPLEMENTATION
#include "../kvcache.h"
#include "tk.h"

#include <time.h>

#define NL 2   /* layers */
#define NKV 2  /* kv heads */
#define G 2    /* query heads per kv head */
#define D 64   /* head dim */
#define NH (NKV * G)

typedef struct world {
    kvc_pool *pq, *pf;
    kvc_cache *tail, *plain, *f16; /* tail: FULL or ROTATING; plain, f16: FULL references */
    int32_t T, window;             /* f16_tail; ROTATING window (0: FULL) */
    int32_t lo, hi;                /* the tail's range by its rule */
} world;

static int32_t offset_of(kvc_cache *c) {
    int32_t o = -1;
    TK_OK(kvc_cache_offset(c, &o));
    return o;
}

/* The rule: a batch of n at offset o joins the tail if that is contiguous with it. */
static void rule_begin(world *w, int32_t o, int32_t n) {
    int32_t lo = w->hi >= o && w->lo <= o ? w->lo : o;
    w->lo = TK_MAX(lo, o + n - w->T);
    w->hi = o + n;
}

/* a batch of n tokens into all three; with put_layers < NL the batch is cancelled after
   that many layers */
static void feed(world *w, tk_rng *rng, int32_t n, int32_t put_layers) {
    float *k = (float *)malloc(sizeof(float) * (size_t)n * NKV * D), *v = (float *)malloc(sizeof(float) * (size_t)n * NKV * D);
    int32_t l, o = offset_of(w->tail);
    TK_OK(kvc_begin(w->tail, n, NULL, 0));
    TK_OK(kvc_begin(w->plain, n, NULL, 0));
    TK_OK(kvc_begin(w->f16, n, NULL, 0));
    rule_begin(w, o, n);
    for (l = 0; l < put_layers; ++l) {
        tk_fill(rng, k, (size_t)n * NKV * D, 2.0f);
        tk_fill(rng, v, (size_t)n * NKV * D, 1.0f);
        TK_OK(kvc_put(w->tail, l, k, v));
        TK_OK(kvc_put(w->plain, l, k, v));
        TK_OK(kvc_put(w->f16, l, k, v));
    }
    if (put_layers < NL) {
        TK_OK(kvc_cancel(w->tail));
        TK_OK(kvc_cancel(w->plain));
        TK_OK(kvc_cancel(w->f16));
        w->hi = TK_MIN(w->hi, o);
    }
    free(k); free(v);
}

/* attention of a one-query desc over the keys [b, e) of cache c (those a query at
   offset - 1 with window W also sees): a fork trimmed to e, with a window from b */
static void part(kvc_cache *c, int32_t layer, const kvc_attention_desc *d0, int32_t W, int32_t b, int32_t e,
                 const float *sinks, float *out, float *lse) {
    kvc_attention_desc d = *d0;
    kvc_cache *f = NULL;
    int32_t off = offset_of(c), h;
    memset(out, 0, sizeof(float) * NH * D);
    for (h = 0; h < NH; ++h) lse[h] = -INFINITY;
    if (b >= e) return;
    TK_OK(kvc_cache_fork(c, &f));
    if (e < off) TK_OK(kvc_cache_trim(f, off - e));
    d.window = W ? TK_MIN(W, off - b) : off - b;
    d.sinks = sinks;
    d.out = out;
    d.lse = lse;
    TK_OK(kvc_attention(f, layer, &d));
    TK_OK(kvc_cache_destroy(f));
}

/* One decode query at the last position on every layer: the tail cache against the
   merge (through the LSE) of quantized attention over [0, lo), f16 attention over the
   tail's tokens [lo, hi) and quantized attention over [hi, offset) (after a restore). */
static void check_decode(world *w, tk_rng *rng) {
    int32_t off = offset_of(w->tail), lo, hi, l, h, i, j, pos;
    float q[NH * D], out[NH * D], o[3][NH * D], lse[NH], ls[3][NH], sinks[NH];
    kvc_attention_desc d;
    double err = 0, lerr = 0, mo = 1e-3;
    if (off == 0) return;
    TK_EQ(offset_of(w->plain), off);
    hi = TK_MIN(w->hi, off);
    if (w->lo < hi) lo = w->lo;
    else lo = hi = off; /* nothing in the tail: all quantized */
    pos = off - 1;
    for (h = 0; h < NH; ++h) sinks[h] = 3.0f * tk_float(rng);
    memset(&d, 0, sizeof(d));
    d.n_queries = 1; d.n_heads = NH; d.q = q; d.pos = &pos; d.window = w->window;
    d.softcap = tk_pct(rng, 30) ? 4.0f : 0.0f;
    d.sinks = tk_pct(rng, 50) ? sinks : NULL;
    for (l = 0; l < NL; ++l) {
        tk_fill(rng, q, NH * D, 2.0f);
        d.out = out; d.lse = lse;
        TK_OK(kvc_attention(w->tail, l, &d));
        part(w->plain, l, &d, w->window, 0, lo, d.sinks, o[0], ls[0]); /* the sink joins one part */
        part(w->f16, l, &d, w->window, lo, hi, NULL, o[1], ls[1]);
        part(w->plain, l, &d, w->window, hi, off, NULL, o[2], ls[2]);
        if (lo == 0 && d.sinks) part(w->f16, l, &d, w->window, lo, hi, d.sinks, o[1], ls[1]);
        for (h = 0; h < NH; ++h) {
            double m = fmax(fmax(ls[0][h], ls[1][h]), ls[2][h]), wt[3], sum = 0, lm;
            for (j = 0; j < 3; ++j) sum += wt[j] = ls[j][h] == -INFINITY ? 0 : exp(ls[j][h] - m);
            lm = m + log(sum);
            for (i = 0; i < D; ++i) {
                double x = (wt[0] * o[0][h * D + i] + wt[1] * o[1][h * D + i] + wt[2] * o[2][h * D + i]) / sum;
                err = fmax(err, fabs(x - out[h * D + i]));
                mo = fmax(mo, fabs(x));
            }
            lerr = fmax(lerr, fabs(lm - lse[h]) / (1 + fabs(lm)));
        }
    }
    if (!(err <= 2e-5 * mo && lerr <= 2e-5)) {
        printf("decode: offset %d tail [%d, %d) T %d window %d: err %.3g (max %.3g), lse err %.3g\n", off, w->lo, w->hi,
               w->T, w->window, err, mo, lerr);
        TK_CHECK(0);
    } else {
        TK_CHECK(1);
    }
}

/* the rows of cache a, as gathered, are the first ones of cache b, bit for bit */
static void check_same_rows(kvc_cache *a, kvc_cache *b) {
    int32_t n = 0, m = 0, l;
    size_t sz, sz_b;
    float *x, *y;
    TK_OK(kvc_cache_gather(a, 0, NULL, NULL, NULL, 0, &n));
    TK_OK(kvc_cache_gather(b, 0, NULL, NULL, NULL, 0, &m));
    TK_CHECK(n <= m);
    if (n > m) return;
    sz = (size_t)n * NKV * D;
    sz_b = (size_t)m * NKV * D;
    x = (float *)malloc(sizeof(float) * 2 * sz + 1);
    y = (float *)malloc(sizeof(float) * 2 * sz_b + 1);
    for (l = 0; l < NL; ++l) {
        TK_OK(kvc_cache_gather(a, l, x, x + sz, NULL, n, &n));
        TK_OK(kvc_cache_gather(b, l, y, y + sz_b, NULL, m, &m));
        TK_CHECK(memcmp(x, y, sizeof(float) * sz) == 0);
        TK_CHECK(memcmp(x + sz, y + sz_b, sizeof(float) * sz) == 0);
    }
    free(x); free(y);
}

/* every stored row of the tail cache is the plain cache's (FULL) */
static void check_pages(world *w) {
    int32_t n = 0, m = 0;
    if (w->window) return;
    TK_OK(kvc_cache_gather(w->tail, 0, NULL, NULL, NULL, 0, &n));
    TK_OK(kvc_cache_gather(w->plain, 0, NULL, NULL, NULL, 0, &m));
    TK_EQ(n, m);
    check_same_rows(w->tail, w->plain);
}

typedef struct blob { unsigned char *data; size_t size; } blob;
static const kvc_namespace NS = {1, 2};
static blob save_of(kvc_cache *c) {
    kvc_mem m;
    kvc_io io;
    blob b;
    memset(&m, 0, sizeof(m));
    TK_OK(kvc_io_memory(&m, &io));
    TK_OK(kvc_cache_save(c, NS, NULL, 0, &io));
    b.data = (unsigned char *)malloc(m.size ? m.size : 1);
    m.data = b.data; m.capacity = m.size; m.size = 0;
    TK_OK(kvc_cache_save(c, NS, NULL, 0, &io));
    b.size = m.size;
    return b;
}

static void world_make(world *w, tk_rng *rng) {
    kvc_pool_config pc;
    kvc_cache_config cc;
    kvc_type tk, tv;
    do {
        tk = (kvc_type)tk_int(rng, 0, 4);
        tv = (kvc_type)tk_int(rng, 0, 4);
    } while (tk < KVC_TYPE_Q8_0 && tv < KVC_TYPE_Q8_0);
    memset(w, 0, sizeof(*w));
    w->T = tk_pct(rng, 30) ? tk_int(rng, 1, 8) : tk_int(rng, 9, 300);
    w->window = tk_pct(rng, 30) ? tk_int(rng, 8, 400) : 0;
    kvc_pool_config_init(&pc);
    pc.n_layers = NL; pc.n_kv_heads = NKV; pc.head_dim_k = pc.head_dim_v = D;
    pc.type_k = tk; pc.type_v = tv; pc.page_cells = tk_pct(rng, 50) ? tk_int(rng, 3, 40) : 256;
    pc.budget_bytes = (size_t)48 << 20;
    pc.runtime.cpu_disable = tk_pct(rng, 25) ? ~0u : 0u;
    TK_OK(kvc_pool_create(&pc, &w->pq));
    pc.type_k = tk >= KVC_TYPE_Q8_0 ? KVC_TYPE_F16 : tk; /* the tail's own types */
    pc.type_v = tv >= KVC_TYPE_Q8_0 ? KVC_TYPE_F16 : tv;
    TK_OK(kvc_pool_create(&pc, &w->pf));
    kvc_cache_config_init(&cc, w->window ? KVC_KIND_ROTATING : KVC_KIND_FULL);
    cc.window = w->window;
    cc.f16_tail = w->T;
    TK_OK(kvc_cache_create(w->pq, &cc, &w->tail));
    kvc_cache_config_init(&cc, KVC_KIND_FULL);
    TK_OK(kvc_cache_create(w->pq, &cc, &w->plain));
    TK_OK(kvc_cache_create(w->pf, &cc, &w->f16));
}

static void world_free(world *w) {
    TK_OK(kvc_cache_destroy(w->tail));
    TK_OK(kvc_cache_destroy(w->plain));
    TK_OK(kvc_cache_destroy(w->f16));
    TK_OK(kvc_pool_destroy(w->pq));
    TK_OK(kvc_pool_destroy(w->pf));
}

static void test_random(tk_rng *rng) {
    int32_t round, step;
    for (round = 0; round < tk_scaled(12); ++round) {
        world w;
        world_make(&w, rng);
        for (step = 0; step < 14; ++step) {
            int32_t op = tk_int(rng, 0, 9), off = offset_of(w.tail);
            int32_t n = tk_pct(rng, 50) ? 1 : tk_int(rng, 1, tk_pct(rng, 20) ? 600 : 2 * w.T + 2);
            if (op <= 3 || off == 0) { /* a batch (mostly decode) */
                feed(&w, rng, n, NL);
            } else if (op == 4 && !w.window) { /* a cancelled batch, some layers put (ROTATING:
                                                   kvc_begin may have released pages for good) */
                feed(&w, rng, n, tk_int(rng, 0, NL - 1));
            } else if (op == 5 && !w.window) { /* trim */
                int32_t m = tk_int(rng, 1, off);
                TK_OK(kvc_cache_trim(w.tail, m));
                TK_OK(kvc_cache_trim(w.plain, m));
                TK_OK(kvc_cache_trim(w.f16, m));
                w.hi = TK_MIN(w.hi, off - m);
            } else if (op == 6) { /* snapshot, more tokens, restore */
                kvc_snapshot *s = NULL;
                int32_t from = w.window ? 0 : tk_int(rng, 0, off - 1);
                TK_OK(kvc_snapshot_take(w.tail, from, KVC_POS_END, &s));
                TK_CHECK(s != NULL);
                feed(&w, rng, n, NL);
                check_decode(&w, rng);
                TK_OK(kvc_cache_restore(w.tail, s, off));
                TK_OK(kvc_cache_trim(w.plain, n));
                TK_OK(kvc_cache_trim(w.f16, n));
                w.hi = w.window ? 0 : TK_MIN(w.hi, from); /* the snapshot's tokens: as stored */
                TK_OK(kvc_snapshot_free(s));
            } else if (op == 7) { /* a fork reads what the cache reads, and goes on alike */
                kvc_cache *f = NULL;
                float q[2 * NH * D], a[2 * NH * D], b[2 * NH * D];
                kvc_attention_desc d;
                int32_t nq = TK_MIN(2, off);
                TK_OK(kvc_cache_fork(w.tail, &f));
                tk_fill(rng, q, 2 * NH * D, 2.0f);
                memset(&d, 0, sizeof(d));
                d.n_queries = nq; d.n_heads = NH; d.q = q; d.out = a;
                TK_OK(kvc_attention(w.tail, 1, &d));
                d.out = b;
                TK_OK(kvc_attention(f, 1, &d));
                TK_CHECK(memcmp(a, b, sizeof(float) * (size_t)nq * NH * D) == 0);
                TK_OK(kvc_cache_destroy(f));
            } else if (op == 8) { /* save and load: the tail's rows travel too (a TAIL section):
                                     attention after the load is bit-identical to before the
                                     save; with nothing in the tail the save is byte-for-byte
                                     a plain cache's (no TAIL) */
                blob bt = save_of(w.tail), bp;
                kvc_mem m;
                kvc_io io;
                kvc_attention_desc d;
                float q[NH * D], a[NH * D], b[NH * D];
                int32_t pos = off - 1, held = w.lo < TK_MIN(w.hi, off);
                if (!w.window) {
                    bp = save_of(w.plain);
                    TK_CHECK((bt.size == bp.size && memcmp(bt.data, bp.data, bt.size) == 0) == !held);
                    free(bp.data);
                }
                tk_fill(rng, q, NH * D, 2.0f);
                memset(&d, 0, sizeof(d));
                d.n_queries = 1; d.n_heads = NH; d.q = q; d.pos = &pos; d.window = w.window; d.out = a;
                TK_OK(kvc_attention(w.tail, NL - 1, &d));
                memset(&m, 0, sizeof(m));
                m.data = bt.data; m.size = m.capacity = bt.size;
                TK_OK(kvc_io_memory(&m, &io));
                TK_OK(kvc_cache_load(w.tail, NS, &io, NULL, 0, NULL));
                TK_EQ(offset_of(w.tail), off);
                d.out = b;
                TK_OK(kvc_attention(w.tail, NL - 1, &d));
                TK_CHECK(memcmp(a, b, sizeof(a)) == 0);
                if (held) { /* a cut or a flipped byte in the TAIL section (last in the file):
                               refused, the cache unchanged */
                    size_t cut = (size_t)tk_int(rng, 1, 24), at = bt.size - (size_t)tk_int(rng, 1, 24);
                    m.size = m.capacity = bt.size - cut;
                    m.pos = 0;
                    TK_RES(kvc_cache_load(w.tail, NS, &io, NULL, 0, NULL), KVC_ERR_TRUNCATED);
                    bt.data[at] ^= 0x10;
                    m.size = m.capacity = bt.size;
                    m.pos = 0;
                    TK_RES(kvc_cache_load(w.tail, NS, &io, NULL, 0, NULL), KVC_ERR_CORRUPT);
                    TK_OK(kvc_attention(w.tail, NL - 1, &d));
                    TK_CHECK(memcmp(a, b, sizeof(a)) == 0);
                    TK_EQ(offset_of(w.tail), off);
                }
                if (held) w.hi = TK_MIN(w.hi, off);
                else w.lo = w.hi = 0;
                free(bt.data);
            } else {
                feed(&w, rng, n, NL);
            }
            check_decode(&w, rng);
            check_pages(&w);
        }
        world_free(&w);
    }
}

/* Prefix trees share the pages, which hold what a plain cache holds: a lookup's cache
   (its tail empty) reads exactly what a plain cache trimmed alike reads, also after the
   committing cache went on writing into the shared last page. */
static void test_tree(tk_rng *rng) {
    int32_t round;
    for (round = 0; round < tk_scaled(4); ++round) {
        world w;
        kvc_radix_config rc;
        kvc_radix *tree = NULL;
        kvc_cache *hit = NULL, *ref = NULL;
        int32_t *tok, n, reused = 0, i, l, off;
        float q[NH * D], a[NH * D], b[NH * D];
        kvc_attention_desc d;
        world_make(&w, rng);
        if (w.window) { world_free(&w); continue; }
        feed(&w, rng, tk_int(rng, 2, 700), NL);
        off = offset_of(w.tail);
        tok = (int32_t *)malloc(sizeof(int32_t) * (size_t)(off > 0 ? off : 1));
        for (i = 0; i < off; ++i) tok[i] = i;
        TK_OK(kvc_radix_config_init(&rc, KVC_KIND_FULL));
        rc.cache.f16_tail = w.T;
        TK_OK(kvc_radix_create(w.pq, &rc, &tree));
        TK_OK(kvc_radix_commit(tree, NS, w.tail, tok, off, 0));
        feed(&w, rng, tk_int(rng, 1, 5), NL); /* the tail cache writes on (copy on write) */
        check_decode(&w, rng);
        n = tk_int(rng, 1, off);
        TK_OK(kvc_radix_lookup(tree, NS, tok, n, &hit, &reused));
        TK_EQ(reused, n - 1);
        check_same_rows(hit, w.plain); /* nothing in f16: the tree's rows as stored */
        if (reused > 0) {
            TK_OK(kvc_cache_fork(w.plain, &ref));
            TK_OK(kvc_cache_trim(ref, offset_of(w.plain) - reused));
            memset(&d, 0, sizeof(d));
            d.n_queries = 1; d.n_heads = NH; d.q = q;
            for (l = 0; l < NL; ++l) {
                tk_fill(rng, q, NH * D, 2.0f);
                d.out = a;
                TK_OK(kvc_attention(hit, l, &d));
                d.out = b;
                TK_OK(kvc_attention(ref, l, &d));
                TK_CHECK(memcmp(a, b, sizeof(a)) == 0);
            }
            TK_OK(kvc_cache_destroy(ref));
        }
        TK_OK(kvc_cache_destroy(hit));
        TK_OK(kvc_radix_release(w.tail));
        TK_OK(kvc_radix_destroy(tree));
        free(tok);
        world_free(&w);
    }
}

/* A model memory saves its groups' tails too: a memory of a FULL and a ROTATING group
   (q8_0 / q4_0, tails of their own), a few batches, then kvc_memory_save and a load into
   a fresh memory of the same config: every layer's attention is bit-identical after the
   load to before the save (kvc_memory_load moves the staged groups' tails in); a memory
   whose groups have shorter tails loads the file too. */
static void test_memory(tk_rng *rng) {
    int32_t round;
    for (round = 0; round < tk_scaled(3); ++round) {
        kvc_group_config gc[2];
        kvc_memory_config mc;
        kvc_memory *a = NULL, *b = NULL, *c = NULL;
        int32_t layer_group[2 * NL], l, i, pos, off = 0;
        float k[8 * NKV * D], v[8 * NKV * D], q[NH * D], oa[NH * D], ob[NH * D];
        kvc_attention_desc d;
        kvc_mem m;
        kvc_io io;
        memset(gc, 0, sizeof(gc));
        for (i = 0; i < 2; ++i) {
            kvc_pool_config_init(&gc[i].pool);
            gc[i].pool.n_layers = NL; gc[i].pool.n_kv_heads = NKV;
            gc[i].pool.head_dim_k = gc[i].pool.head_dim_v = D;
            gc[i].pool.type_k = tk_pct(rng, 50) ? KVC_TYPE_Q8_0 : KVC_TYPE_Q4_0;
            gc[i].pool.type_v = tk_pct(rng, 50) ? KVC_TYPE_Q8_0 : KVC_TYPE_F16;
            gc[i].pool.page_cells = tk_int(rng, 3, 20);
            kvc_cache_config_init(&gc[i].cache, i ? KVC_KIND_ROTATING : KVC_KIND_FULL);
            gc[i].cache.window = i ? tk_int(rng, 8, 40) : 0;
            gc[i].cache.f16_tail = tk_int(rng, 2, 12);
        }
        for (l = 0; l < 2 * NL; ++l) layer_group[l] = l % 2;
        TK_OK(kvc_memory_config_init(&mc));
        mc.n_layers = 2 * NL; mc.layer_group = layer_group; mc.n_groups = 2; mc.groups = gc;
        mc.budget_bytes = (size_t)16 << 20;
        TK_OK(kvc_memory_create(&mc, &a));
        TK_OK(kvc_memory_create(&mc, &b));
        gc[0].cache.f16_tail = gc[1].cache.f16_tail = 1;
        TK_OK(kvc_memory_create(&mc, &c));
        for (i = tk_int(rng, 2, 6); i > 0; --i) {
            int32_t n = tk_pct(rng, 50) ? 1 : tk_int(rng, 1, 8);
            TK_OK(kvc_memory_begin(a, n, NULL, 0));
            for (l = 0; l < 2 * NL; ++l) {
                tk_fill(rng, k, (size_t)n * NKV * D, 2.0f);
                tk_fill(rng, v, (size_t)n * NKV * D, 1.0f);
                TK_OK(kvc_memory_put(a, l, k, v));
            }
            off += n;
        }
        memset(&m, 0, sizeof(m));
        TK_OK(kvc_io_memory(&m, &io));
        TK_OK(kvc_memory_save(a, NS, NULL, 0, &io));
        m.capacity = m.size;
        m.data = (unsigned char *)malloc(m.capacity);
        m.size = m.pos = 0;
        TK_OK(kvc_memory_save(a, NS, NULL, 0, &io));
        m.pos = 0;
        TK_OK(kvc_memory_load(b, NS, &io, NULL, 0, NULL));
        m.pos = 0;
        TK_OK(kvc_memory_load(c, NS, &io, NULL, 0, NULL)); /* shorter tails: loads too */
        pos = off - 1;
        memset(&d, 0, sizeof(d));
        d.n_queries = 1; d.n_heads = NH; d.q = q; d.pos = &pos;
        for (l = 0; l < 2 * NL; ++l) {
            d.window = l % 2 ? gc[1].cache.window : 0;
            tk_fill(rng, q, NH * D, 2.0f);
            d.out = oa;
            TK_OK(kvc_memory_attention(a, l, &d));
            d.out = ob;
            TK_OK(kvc_memory_attention(b, l, &d));
            TK_CHECK(memcmp(oa, ob, sizeof(oa)) == 0);
        }
        free(m.data);
        TK_OK(kvc_memory_destroy(a));
        TK_OK(kvc_memory_destroy(b));
        TK_OK(kvc_memory_destroy(c));
    }
}

static void test_config(void) {
    kvc_pool_config pc;
    kvc_cache_config cc;
    kvc_pool *p = NULL;
    kvc_cache *c = NULL;
    const char *field = NULL;
    int32_t t;
    kvc_pool_config_init(&pc);
    pc.n_layers = 1; pc.n_kv_heads = 1; pc.head_dim_k = pc.head_dim_v = 64; pc.budget_bytes = (size_t)4 << 20;
    for (t = 0; t < KVC_TYPE_COUNT; ++t) {
        pc.type_k = (kvc_type)t;
        pc.type_v = KVC_TYPE_F16;
        TK_OK(kvc_pool_create(&pc, &p));
        kvc_cache_config_init(&cc, KVC_KIND_FULL);
        cc.f16_tail = -1;
        TK_RES(kvc_cache_config_check(p, &cc, &field), KVC_ERR_INVALID);
        TK_CHECK(field != NULL && strcmp(field, "f16_tail") == 0);
        cc.f16_tail = 32;
        TK_RES(kvc_cache_create(p, &cc, &c), t >= KVC_TYPE_Q8_0 ? KVC_OK : KVC_ERR_INVALID);
        if (t >= KVC_TYPE_Q8_0) {
            TK_OK(kvc_cache_destroy(c));
            cc.kind = KVC_KIND_ROTATING; cc.window = 16;
            TK_OK(kvc_cache_config_check(p, &cc, &field));
            kvc_cache_config_init(&cc, KVC_KIND_CAUSAL);
            cc.capacity = 64; cc.f16_tail = 8;
            TK_RES(kvc_cache_config_check(p, &cc, &field), KVC_ERR_UNSUPPORTED);
            TK_CHECK(field != NULL && strcmp(field, "f16_tail") == 0);
        } else {
            TK_OK(kvc_cache_config_check(p, &cc, &field) == KVC_ERR_INVALID ? KVC_OK : KVC_ERR_STATE);
            TK_CHECK(field != NULL && strcmp(field, "f16_tail") == 0);
        }
        TK_OK(kvc_pool_destroy(p));
    }
}

int main(int argc, char **argv) {
    tk_rng rng;
    rng.s = argc > 1 ? strtoull(argv[1], NULL, 10) : (unsigned long long)time(NULL) * 2654435761ull;
    printf("seed %llu (test_tail %llu replays it)\n", rng.s, rng.s);
    test_config();
    test_random(&rng);
    test_tree(&rng);
    test_memory(&rng);
    return tk_report("tail");
}
