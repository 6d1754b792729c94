/* test_threads.c - a pool shared between threads (kvc_pool_config.runtime.lock), the kvc_threads
   helper shared by several pools, and a model memory's forks on two threads.

   The server shape: N_THREADS threads, each with caches of its own on ONE pool with a
   radix prefix tree, a budget small enough that the tree evicts all the time, and the
   pool's attention on one shared kvc_threads. Each thread serves its share of a list of
   requests drawn from the seed (a system prompt, often one of a few shared ones, then a
   suffix from a small vocabulary, then "generated" tokens): lookup, prefill in batches,
   the last prompt token and every generated token one at a time, commit, sometimes a
   fork that decodes one more token (copy-on-write of pages the tree shares), a pin and
   unpin, an explicit eviction, pool and tree statistics read while others change them.
   K/V of a token are a function of the whole prefix (a hash chain, as in a real model),
   so a request's single-token attention outputs do not depend on what the tree had
   cached: their bits, hashed per request, must equal those of a single-threaded run of
   the same requests on a fresh pool. Afterwards: no cache alive, every used page the
   tree's, none after the tree goes. Once more with tiers under the tree (a small host
   tier spilling to a store in memory, every request fetching first, every fourth sending
   the whole tree down): the same bits, blobs fetched back, the
   store called only under the pool's lock (ThreadSanitizer sees its unlocked table).

   Under `make test` this also runs under ThreadSanitizer (tests/run.sh). Usage:
   test_threads [seed]; KVC_TEST_SCALE scales the request counts. */
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#define KVCACHE_THREADS
#define KVCACHE_IMPLEMENTATION
#include "../kvcache.h"
#include "tk.h"

#if defined(_WIN32) && !defined(__MINGW32__)
int main(void) { /* no pthreads here */
    printf("test_threads: skipped (no pthreads)\n");
    return tk_report("threads");
}
#else
#include <pthread.h>

#define N_THREADS 4
#define NL 2                /* layers */
#define NKV 2               /* kv heads */
#define NH 4                /* query heads (GQA 2) */
#define HD 32               /* head dim */
#define PC 16               /* page cells */
#define MAX_T 112           /* tokens of a request, at most */
#define BUDGET_PAGES 44     /* 4 threads x (7 pages + a copy-on-write one + a fork's) fit */
#define PREFILL 24          /* > 16 queries: the attention's tasks go to parallel_for */

static uint64_t mix(uint64_t x) { /* splitmix64 */
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}
static float val(uint64_t h, uint64_t salt, int j) { /* in [-1, 1), a multiple of 1/256 */
    return (float)((int)(mix(h ^ (salt * 0x100000001b3ull) ^ (uint64_t)j) % 512) - 256) / 256.0f;
}

typedef struct request {
    int32_t n_prompt, n_total;      /* tokens [0, n_prompt) are the prompt; the rest generated */
    int32_t tokens[MAX_T + 1];      /* + 1: the token a fork decodes after the commit */
    uint64_t h[MAX_T + 1];          /* h[i]: hash of tokens[0..i] */
    int fork, pin;
} request;

static void make_requests(uint64_t seed, request *rq, int32_t n) {
    int32_t sys[3][40], sys_len[3], i, r, s;
    tk_rng rng;
    rng.s = seed ^ 0x5eed;
    for (s = 0; s < 3; ++s) {
        sys_len[s] = tk_int(&rng, 18, 40);
        for (i = 0; i < sys_len[s]; ++i) sys[s][i] = tk_int(&rng, 0, 999);
    }
    for (r = 0; r < n; ++r) {
        request *q = &rq[r];
        int32_t n_sys = 0, n_suffix = tk_int(&rng, 2, 40), n_gen = tk_int(&rng, 1, 24);
        s = tk_int(&rng, 0, 3); /* 3: no shared system prompt */
        if (s < 3) {
            n_sys = sys_len[s];
            memcpy(q->tokens, sys[s], sizeof(int32_t) * (size_t)n_sys);
        }
        for (i = 0; i < n_suffix; ++i) q->tokens[n_sys + i] = tk_int(&rng, 0, 5); /* small vocab: suffixes share too */
        q->n_prompt = n_sys + n_suffix;
        q->n_total = q->n_prompt + n_gen;
        if (q->n_total > MAX_T) q->n_total = MAX_T;
        for (i = 0; i <= q->n_total; ++i) {
            if (i >= q->n_prompt) q->tokens[i] = (int32_t)(q->h[i - 1] >> 40) % 1000; /* "generated" */
            q->h[i] = mix((i ? q->h[i - 1] : seed) ^ (uint64_t)(uint32_t)q->tokens[i]);
        }
        q->fork = tk_pct(&rng, 30);
        q->pin = tk_pct(&rng, 20);
    }
}

/* Evaluate tokens [p, p + n) of q in one batch; with digest, fold the outputs' bits in. */
static int eval(kvc_cache *c, const request *q, int32_t p, int32_t n, uint64_t *digest) {
    float k[PREFILL * NKV * HD], v[PREFILL * NKV * HD], qv[PREFILL * NH * HD], out[PREFILL * NH * HD];
    kvc_attention_desc d;
    int32_t l, t, j;
    int ok = 1;
    if (kvc_begin_at(c, p, n) != KVC_OK) return 0;
    for (l = 0; l < NL; ++l) {
        for (t = 0; t < n; ++t)
            for (j = 0; j < NKV * HD; ++j) {
                k[t * NKV * HD + j] = val(q->h[p + t], 2 * (uint64_t)l + 1, j);
                v[t * NKV * HD + j] = val(q->h[p + t], 2 * (uint64_t)l + 2, j);
            }
        for (t = 0; t < n; ++t)
            for (j = 0; j < NH * HD; ++j) qv[t * NH * HD + j] = val(q->h[p + t], 100 + (uint64_t)l, j);
        if (kvc_put(c, l, k, v) != KVC_OK) ok = 0;
        memset(&d, 0, sizeof(d));
        d.n_queries = n;
        d.n_heads = NH;
        d.q = qv;
        d.out = out;
        if (kvc_attention(c, l, &d) != KVC_OK) ok = 0;
        for (j = 0; j < n * NH * HD; ++j) {
            uint32_t bits;
            if (!(out[j] == out[j]) || out[j] > 1.0f || out[j] < -1.0f) ok = 0; /* averages of [-1, 1) */
            memcpy(&bits, &out[j], sizeof(bits));
            if (digest) *digest = mix(*digest ^ bits);
        }
    }
    return ok;
}

typedef struct shared {
    kvc_pool *pool;
    kvc_radix *tree;
    int tiers;             /* fetch before each lookup */
    request *rq;
    uint64_t *digest;      /* [n_requests] */
    int32_t n_requests, n_threads;
    int32_t *reused;       /* [n_requests] tokens a lookup found */
    int32_t *bad;          /* [n_requests] failed calls */
} shared;

typedef struct worker {
    shared *s;
    int32_t id;
} worker;

#define CALL(expr, want) do { if ((int)(expr) != (int)(want)) { errors++; fprintf(stderr, "request %d: %s failed\n", (int)r, #expr); } } while (0)

static void serve(shared *s, int32_t r) {
    static const kvc_namespace ns = {42, 0};
    const request *q = &s->rq[r];
    kvc_cache *c = NULL, *f = NULL;
    int32_t p, reused = 0, errors = 0;
    uint64_t dg = 0;
    if (s->tiers) {
        int32_t got = -1;
        CALL(kvc_tier_fetch(s->tree, ns, q->tokens, q->n_prompt, &got), KVC_OK);
        if (got < 0 || got % PC != 0) errors++;
    }
    CALL(kvc_radix_lookup(s->tree, ns, q->tokens, q->n_prompt, &c, &reused), KVC_OK);
    if (c == NULL) { s->bad[r] = errors; return; }
    if (reused < 0 || reused > q->n_prompt - 1) errors++;
    for (p = reused; p < q->n_prompt - 1;) { /* prefill: batches whose bits are not compared */
        int32_t n = TK_MIN(PREFILL, q->n_prompt - 1 - p);
        if (!eval(c, q, p, n, NULL)) errors++;
        p += n;
    }
    for (p = q->n_prompt - 1; p < q->n_total; ++p) /* last prompt token, then generation */
        if (!eval(c, q, p, 1, &dg)) errors++;
    CALL(kvc_radix_commit(s->tree, ns, c, q->tokens, q->n_total, 0), KVC_OK);
    if (q->pin) {
        kvc_radix_stats rs;
        CALL(kvc_radix_pin(s->tree, ns, q->tokens, q->n_total), KVC_OK); /* in use: still there */
        CALL(kvc_radix_stats_get(s->tree, &rs), KVC_OK);
        if (rs.n_pinned < 1) errors++;
        CALL(kvc_radix_unpin(s->tree, ns, q->tokens, q->n_total), KVC_OK);
    }
    if (q->fork) { /* one more token in a fork: its tail page is shared with c and the tree */
        CALL(kvc_cache_fork(c, &f), KVC_OK);
        if (f != NULL && !eval(f, q, q->n_total, 1, &dg)) errors++;
        CALL(kvc_cache_destroy(f), KVC_OK);
    }
    if (r % 2) CALL(kvc_radix_release(c), KVC_OK);
    CALL(kvc_cache_destroy(c), KVC_OK);
    if (r % 5 == 0) {
        kvc_pool_stats ps;
        kvc_radix_stats rs;
        int32_t freed = -1;
        CALL(kvc_pool_stats_get(s->pool, &ps), KVC_OK);
        CALL(kvc_radix_stats_get(s->tree, &rs), KVC_OK);
        if (ps.pages_used > ps.pages_total || rs.n_pages > ps.pages_total) errors++;
        CALL(kvc_radix_evict(s->tree, 1, &freed), KVC_OK);
        if (freed < 0) errors++;
    }
    if (s->tiers && r % 4 == 3) CALL(kvc_radix_evict(s->tree, 1 << 20, NULL), KVC_OK); /* all down the tiers */
    s->digest[r] = dg;
    s->reused[r] = reused;
    s->bad[r] = errors;
}

static void *worker_main(void *arg) {
    worker *w = (worker *)arg;
    int32_t r;
    for (r = w->id; r < w->s->n_requests; r += w->s->n_threads) serve(w->s, r);
    return NULL;
}

/* The store of the tiered run: blobs in a table with no lock of its own -- the tier calls
   it under the pool's lock, so ThreadSanitizer reports any call that is not. */
#define MEM_SLOTS 48
static struct {
    kvc_key key[MEM_SLOTS];
    unsigned char *data[MEM_SLOTS];
    size_t size[MEM_SLOTS];
    int32_t next; /* the slot a new key takes (round robin: the oldest goes) */
    long calls;
} g_mem;
static int32_t mem_find(const kvc_key *k) {
    int32_t i;
    for (i = 0; i < MEM_SLOTS; ++i)
        if (g_mem.data[i] != NULL && memcmp(g_mem.key[i].bytes, k->bytes, 32) == 0) return i;
    return -1;
}
static kvc_result mem_put(void *u, const kvc_key *k, const void *d, size_t n, int32_t ms) {
    int32_t i = mem_find(k);
    unsigned char *copy = (unsigned char *)malloc(n);
    (void)u, (void)ms;
    g_mem.calls++;
    if (copy == NULL) return KVC_ERR_NO_MEMORY;
    memcpy(copy, d, n);
    if (i < 0) i = g_mem.next, g_mem.next = (g_mem.next + 1) % MEM_SLOTS;
    free(g_mem.data[i]);
    g_mem.key[i] = *k;
    g_mem.data[i] = copy;
    g_mem.size[i] = n;
    return KVC_OK;
}
static kvc_result mem_exists(void *u, const kvc_key *k, size_t *n, int32_t ms) {
    int32_t i = mem_find(k);
    (void)u, (void)ms;
    g_mem.calls++;
    if (i < 0) return KVC_ERR_NOT_FOUND;
    *n = g_mem.size[i];
    return KVC_OK;
}
static kvc_result mem_get(void *u, const kvc_key *k, void *d, size_t cap, size_t *n, int32_t ms) {
    int32_t i = mem_find(k);
    (void)u, (void)ms;
    g_mem.calls++;
    if (i < 0) return KVC_ERR_NOT_FOUND;
    *n = g_mem.size[i];
    if (*n > cap) return KVC_ERR_RANGE;
    memcpy(d, g_mem.data[i], *n);
    return KVC_OK;
}
static void mem_clear(void) {
    int32_t i;
    for (i = 0; i < MEM_SLOTS; ++i) free(g_mem.data[i]);
    memset(&g_mem, 0, sizeof(g_mem));
}
static kvc_tier_stats g_tier_stats; /* the tiered run's, at its end */

/* One run of every request on a fresh pool: n_threads threads (1: this thread alone,
   no lock), with tiers when `tiers`. Returns the tree's evictions. */
static uint64_t run_server(request *rq, int32_t n, int32_t n_threads, uint64_t *digest, int32_t *reused, int tiers) {
    kvc_pool_config pc;
    kvc_radix_config rc;
    kvc_pool_stats ps;
    kvc_radix_stats rs;
    kvc_threads *th = NULL;
    kvc_mutex *mx = NULL;
    pthread_t tid[N_THREADS];
    worker w[N_THREADS];
    shared s;
    int32_t i, *bad = (int32_t *)calloc((size_t)n, sizeof(int32_t)), sum = 0;
    size_t page_bytes = 0;
    TK_OK(kvc_pool_config_init(&pc));
    pc.n_layers = NL;
    pc.n_kv_heads = NKV;
    pc.head_dim_k = pc.head_dim_v = HD;
    pc.type_k = KVC_TYPE_F16;
    pc.type_v = KVC_TYPE_F32;
    pc.page_cells = PC;
    TK_OK(kvc_pool_page_bytes(&pc, &page_bytes));
    pc.budget_bytes = page_bytes * BUDGET_PAGES;
    if (n_threads > 1) {
        TK_OK(kvc_mutex_create(&mx));
        TK_OK(kvc_mutex_attach(mx, &pc.runtime));
        TK_OK(kvc_threads_create(2, &th)); /* one helper for every thread's attention */
        TK_OK(kvc_threads_attach(th, &pc.runtime));
    }
    memset(&s, 0, sizeof(s));
    TK_OK(kvc_pool_create(&pc, &s.pool));
    TK_OK(kvc_radix_config_init(&rc, KVC_KIND_FULL));
    TK_OK(kvc_radix_create(s.pool, &rc, &s.tree));
    if (tiers) { /* a host tier for about two blobs of 32 tokens, then the store */
        kvc_tier_config tc;
        TK_OK(kvc_tier_config_init(&tc));
        tc.host_bytes = 2 * 32 * NL * NKV * HD * (2 + 4) + 4096;
        tc.store.put = mem_put;
        tc.store.exists = mem_exists;
        tc.store.get = mem_get;
        TK_OK(kvc_tier_attach(s.tree, &tc));
        s.tiers = 1;
    }
    s.rq = rq;
    s.digest = digest;
    s.reused = reused;
    s.bad = bad;
    s.n_requests = n;
    s.n_threads = n_threads;
    for (i = 0; i < n_threads; ++i) {
        w[i].s = &s;
        w[i].id = i;
    }
    if (n_threads == 1) {
        worker_main(&w[0]);
    } else {
        for (i = 0; i < n_threads; ++i) TK_EQ(pthread_create(&tid[i], NULL, worker_main, &w[i]), 0);
        for (i = 0; i < n_threads; ++i) pthread_join(tid[i], NULL);
    }
    for (i = 0; i < n; ++i) sum += bad[i];
    TK_EQ(sum, 0);
    /* every cache gone: the pages in use are exactly the tree's */
    TK_OK(kvc_pool_stats_get(s.pool, &ps));
    TK_OK(kvc_radix_stats_get(s.tree, &rs));
    TK_EQ(ps.live_caches, 0);
    TK_EQ(ps.live_snapshots, 0);
    TK_EQ(rs.n_in_use, 0);
    TK_EQ(rs.n_pinned, 0);
    TK_EQ(ps.pages_used, rs.n_pages);
    TK_CHECK(ps.pages_peak <= BUDGET_PAGES);
    TK_EQ(rs.lookups, (uint64_t)n);
    memset(&g_tier_stats, 0, sizeof(g_tier_stats));
    if (tiers) {
        TK_OK(kvc_tier_stats_get(s.tree, &g_tier_stats));
        TK_CHECK(g_tier_stats.host_bytes <= 2 * 32 * NL * NKV * HD * (2 + 4) + 4096);
    }
    TK_EQ(rs.commits, (uint64_t)n + g_tier_stats.fetched_host + g_tier_stats.fetched_store); /* a fetch commits */
    TK_OK(kvc_radix_destroy(s.tree));
    TK_OK(kvc_pool_stats_get(s.pool, &ps));
    TK_EQ(ps.pages_used, 0);
    TK_EQ(ps.live_prefixes, 0);
    TK_OK(kvc_pool_destroy(s.pool));
    if (th != NULL) TK_OK(kvc_threads_destroy(th));
    if (mx != NULL) TK_OK(kvc_mutex_destroy(mx));
    free(bad);
    return rs.entries_evicted;
}

static void test_server(uint64_t seed) {
    int32_t n = tk_scaled(160), i, same = 0, same_tr = 0, hits_st = 0, hits_mt = 0, hits_tr = 0;
    request *rq = (request *)malloc(sizeof(request) * (size_t)n);
    uint64_t *d_st = (uint64_t *)calloc((size_t)n, sizeof(uint64_t)), *d_mt = (uint64_t *)calloc((size_t)n, sizeof(uint64_t));
    uint64_t *d_tr = (uint64_t *)calloc((size_t)n, sizeof(uint64_t));
    int32_t *r_st = (int32_t *)calloc((size_t)n, sizeof(int32_t)), *r_mt = (int32_t *)calloc((size_t)n, sizeof(int32_t));
    int32_t *r_tr = (int32_t *)calloc((size_t)n, sizeof(int32_t));
    uint64_t ev_st, ev_mt;
    make_requests(seed, rq, n);
    ev_st = run_server(rq, n, 1, d_st, r_st, 0);
    ev_mt = run_server(rq, n, N_THREADS, d_mt, r_mt, 0);
    run_server(rq, n, N_THREADS, d_tr, r_tr, 1);
    for (i = 0; i < n; ++i) {
        same += d_st[i] == d_mt[i];
        same_tr += d_st[i] == d_tr[i];
        if (d_st[i] != d_mt[i]) fprintf(stderr, "request %d: outputs differ from the single-threaded run\n", (int)i);
        if (d_st[i] != d_tr[i]) fprintf(stderr, "request %d: outputs with tiers differ from the run without\n", (int)i);
        hits_st += r_st[i];
        hits_mt += r_mt[i];
        hits_tr += r_tr[i];
    }
    TK_EQ(same, n);
    TK_EQ(same_tr, n);
    printf("server: %d requests on %d threads, tokens reused %d (one thread: %d), entries evicted %llu (%llu)\n",
           (int)n, N_THREADS, (int)hits_mt, (int)hits_st, (unsigned long long)ev_mt, (unsigned long long)ev_st);
    printf("server with tiers: tokens reused %d; blobs fetched %llu from the host tier, %llu from the store "
           "(%llu calls), %llu kept in it\n", (int)hits_tr, (unsigned long long)g_tier_stats.fetched_host,
           (unsigned long long)g_tier_stats.fetched_store, (unsigned long long)g_mem.calls,
           (unsigned long long)g_tier_stats.kept_store);
    if (n >= 40) TK_CHECK(g_tier_stats.fetched_host + g_tier_stats.fetched_store > 0);
    mem_clear();
    free(d_tr);
    free(r_tr);
    if (n >= 40) { /* the shape is exercised: prefixes were found, and the budget made the tree evict */
        TK_CHECK(hits_st > 0);
        TK_CHECK(ev_st > 0);
    }
    free(rq);
    free(d_st);
    free(d_mt);
    free(r_st);
    free(r_mt);
}

/* ---- two pools on one kvc_threads (it used to mix their jobs up) ------------------- */
typedef struct side {
    kvc_pool *pool;
    kvc_cache *cache;
    float *q, *ref, *out;
    int32_t nq, calls, wrong;
} side;

#define SIDE_CELLS 200
#define SIDE_Q 40

static void side_attend(side *s, float *out) {
    kvc_attention_desc d;
    memset(&d, 0, sizeof(d));
    d.n_queries = SIDE_Q;
    d.n_heads = NH;
    d.q = s->q;
    d.out = out;
    if (kvc_attention(s->cache, 0, &d) != KVC_OK) s->wrong++;
}

static void *side_main(void *arg) {
    side *s = (side *)arg;
    int32_t i;
    for (i = 0; i < s->calls; ++i) {
        side_attend(s, s->out);
        s->wrong += memcmp(s->out, s->ref, sizeof(float) * SIDE_Q * NH * HD) != 0;
    }
    return NULL;
}

static void test_shared_helper(tk_rng *rng) {
    kvc_threads *th;
    side sd[2];
    pthread_t tid[2];
    int32_t i, j;
    TK_OK(kvc_threads_create(3, &th));
    for (i = 0; i < 2; ++i) {
        kvc_pool_config pc;
        kvc_cache_config cc;
        float *k = (float *)malloc(sizeof(float) * SIDE_CELLS * NKV * HD), *v = (float *)malloc(sizeof(float) * SIDE_CELLS * NKV * HD);
        side *s = &sd[i];
        TK_OK(kvc_pool_config_init(&pc));
        pc.n_layers = 1;
        pc.n_kv_heads = NKV;
        pc.head_dim_k = pc.head_dim_v = HD;
        pc.type_k = pc.type_v = i ? KVC_TYPE_F16 : KVC_TYPE_F32;
        TK_OK(kvc_pool_budget_for_tokens(&pc, SIDE_CELLS, &pc.budget_bytes));
        TK_OK(kvc_pool_create(&pc, &s->pool)); /* first without the helper: the reference */
        TK_OK(kvc_cache_config_init(&cc, KVC_KIND_FULL));
        TK_OK(kvc_cache_create(s->pool, &cc, &s->cache));
        for (j = 0; j < SIDE_CELLS * NKV * HD; ++j) { k[j] = tk_float(rng); v[j] = tk_float(rng); }
        TK_OK(kvc_begin(s->cache, SIDE_CELLS, NULL, 0));
        TK_OK(kvc_put(s->cache, 0, k, v));
        s->q = (float *)malloc(sizeof(float) * SIDE_Q * NH * HD);
        s->ref = (float *)malloc(sizeof(float) * SIDE_Q * NH * HD);
        s->out = (float *)malloc(sizeof(float) * SIDE_Q * NH * HD);
        for (j = 0; j < SIDE_Q * NH * HD; ++j) s->q[j] = tk_float(rng);
        side_attend(s, s->ref);
        TK_OK(kvc_cache_destroy(s->cache));
        TK_OK(kvc_pool_destroy(s->pool));
        TK_OK(kvc_threads_attach(th, &pc.runtime)); /* now both pools on one helper */
        TK_OK(kvc_pool_create(&pc, &s->pool));
        TK_OK(kvc_cache_create(s->pool, &cc, &s->cache));
        TK_OK(kvc_begin(s->cache, SIDE_CELLS, NULL, 0));
        TK_OK(kvc_put(s->cache, 0, k, v));
        s->calls = tk_scaled(400);
        s->wrong = 0;
        free(k);
        free(v);
    }
    for (i = 0; i < 2; ++i) TK_EQ(pthread_create(&tid[i], NULL, side_main, &sd[i]), 0);
    for (i = 0; i < 2; ++i) pthread_join(tid[i], NULL);
    for (i = 0; i < 2; ++i) {
        TK_EQ(sd[i].wrong, 0);
        TK_OK(kvc_cache_destroy(sd[i].cache));
        TK_OK(kvc_pool_destroy(sd[i].pool));
        free(sd[i].q);
        free(sd[i].ref);
        free(sd[i].out);
    }
    TK_OK(kvc_threads_destroy(th));
}

/* ---- a model memory's forks on two threads: one lock, one budget --------------------- */
typedef struct mem_side {
    kvc_memory *mem;
    int32_t rounds, errors;
    tk_rng rng;
} mem_side;

static void *mem_main(void *arg) {
    mem_side *m = (mem_side *)arg;
    float k[8 * NKV * HD], v[8 * NKV * HD], q[NH * HD], out[NH * HD];
    kvc_attention_desc d;
    int32_t i, j, n, l;
    memset(&d, 0, sizeof(d));
    d.n_queries = 1;
    d.n_heads = NH;
    d.q = q;
    d.out = out;
    for (j = 0; j < 8 * NKV * HD; ++j) { k[j] = tk_float(&m->rng); v[j] = tk_float(&m->rng); }
    for (j = 0; j < NH * HD; ++j) q[j] = tk_float(&m->rng);
    for (i = 0; i < m->rounds; ++i) {
        kvc_memory_stats st;
        int32_t off = 0;
        n = tk_int(&m->rng, 1, 8);
        if (kvc_memory_offset(m->mem, &off) != KVC_OK) m->errors++;
        if (off + n > 100) { /* keep within the budget: back to where every group can go */
            int32_t to = 0;
            if (kvc_memory_rewind_point(m->mem, tk_int(&m->rng, 0, off), &to) != KVC_OK ||
                kvc_memory_trim(m->mem, off - to) != KVC_OK)
                m->errors++;
            continue;
        }
        if (kvc_memory_begin(m->mem, n, NULL, 0) != KVC_OK) { m->errors++; continue; }
        for (l = 0; l < 2; ++l) {
            if (kvc_memory_put(m->mem, l, k, v) != KVC_OK) m->errors++;
            if (kvc_memory_attention(m->mem, l, &d) != KVC_OK) m->errors++;
        }
        if (kvc_memory_stats_get(m->mem, &st) != KVC_OK || st.bytes_used > st.budget_bytes) m->errors++;
    }
    return NULL;
}

static void test_memory_forks(tk_rng *rng) {
    kvc_memory_config mc;
    kvc_group_config g[2];
    kvc_memory_stats st;
    int32_t layer_group[2] = {0, 1}, i;
    kvc_memory *m0 = NULL, *m1 = NULL;
    kvc_mutex *mx;
    mem_side ms[2];
    pthread_t tid[2];
    const char *field;
    size_t pb0 = 0, pb1 = 0;
    TK_OK(kvc_mutex_create(&mx));
    TK_OK(kvc_memory_config_init(&mc));
    memset(g, 0, sizeof(g));
    for (i = 0; i < 2; ++i) {
        TK_OK(kvc_pool_config_init(&g[i].pool));
        g[i].pool.n_layers = 1;
        g[i].pool.n_kv_heads = NKV;
        g[i].pool.head_dim_k = g[i].pool.head_dim_v = HD;
        g[i].pool.page_cells = PC;
        TK_OK(kvc_cache_config_init(&g[i].cache, i ? KVC_KIND_ROTATING : KVC_KIND_FULL));
    }
    g[1].cache.window = 24;
    TK_OK(kvc_pool_page_bytes(&g[0].pool, &pb0));
    TK_OK(kvc_pool_page_bytes(&g[1].pool, &pb1));
    mc.n_layers = 2;
    mc.layer_group = layer_group;
    mc.n_groups = 2;
    mc.groups = g;
    mc.budget_bytes = 2 * (7 + 1) * pb0 + 2 * 4 * pb1; /* two memories of <= 100 tokens each */
    mc.runtime.lock = kvc_mutex_lock; /* missing unlock: refused */
    TK_RES(kvc_memory_config_check(&mc, &field), KVC_ERR_INVALID);
    TK_CHECK(field != NULL && strcmp(field, "runtime.lock") == 0);
    mc.runtime.unlock = kvc_mutex_unlock;
    mc.runtime.lock_user = mx;
    g[0].pool.runtime.lock = kvc_mutex_lock; /* a group's own lock: the memory's applies */
    g[0].pool.runtime.unlock = kvc_mutex_unlock;
    TK_RES(kvc_memory_config_check(&mc, &field), KVC_ERR_INVALID);
    TK_CHECK(field != NULL && strcmp(field, "groups.pool") == 0);
    g[0].pool.runtime.lock = g[0].pool.runtime.unlock = NULL;
    TK_OK(kvc_memory_config_check(&mc, &field));
    TK_OK(kvc_memory_create(&mc, &m0));
    TK_OK(kvc_memory_fork(m0, &m1));
    ms[0].mem = m0;
    ms[1].mem = m1;
    for (i = 0; i < 2; ++i) {
        ms[i].rounds = tk_scaled(300);
        ms[i].errors = 0;
        ms[i].rng.s = tk_next(rng);
    }
    for (i = 0; i < 2; ++i) TK_EQ(pthread_create(&tid[i], NULL, mem_main, &ms[i]), 0);
    for (i = 0; i < 2; ++i) pthread_join(tid[i], NULL);
    TK_EQ(ms[0].errors, 0);
    TK_EQ(ms[1].errors, 0);
    TK_OK(kvc_memory_destroy(m1));
    TK_OK(kvc_memory_clear(m0));
    TK_OK(kvc_memory_stats_get(m0, &st));
    TK_EQ(st.bytes_used, 0); /* the shared budget counted every page back */
    TK_OK(kvc_memory_destroy(m0));
    TK_OK(kvc_mutex_destroy(mx));
}

/* ---- the lock's configuration and the mutex ----------------------------------------- */
static int g_depth, g_max_depth, g_calls;
static void count_lock(void *user) { (void)user; g_calls++; if (++g_depth > g_max_depth) g_max_depth = g_depth; }
static void count_unlock(void *user) { (void)user; g_depth--; }

static void test_config(void) {
    kvc_pool_config pc;
    kvc_pool *pool;
    kvc_cache *c;
    kvc_cache_config cc;
    kvc_mutex *mx;
    const char *field = NULL;
    float k[NKV * HD], v[NKV * HD], q[NH * HD], out[NH * HD];
    kvc_attention_desc d;
    int calls;
    TK_OK(kvc_pool_config_init(&pc));
    pc.n_layers = 1;
    pc.n_kv_heads = NKV;
    pc.head_dim_k = pc.head_dim_v = HD;
    pc.budget_bytes = 1 << 20;
    pc.runtime.unlock = count_unlock; /* both or neither */
    TK_RES(kvc_pool_config_check(&pc, &field), KVC_ERR_INVALID);
    TK_CHECK(field != NULL && strcmp(field, "runtime.lock") == 0);
    TK_RES(kvc_pool_create(&pc, &pool), KVC_ERR_INVALID);
    pc.runtime.lock = count_lock;
    TK_OK(kvc_pool_create(&pc, &pool));
    TK_OK(kvc_cache_config_init(&cc, KVC_KIND_FULL));
    TK_OK(kvc_cache_create(pool, &cc, &c));
    TK_OK(kvc_begin(c, 1, NULL, 0));
    TK_CHECK(g_calls > 0 && g_depth == 0); /* taken and given back, nested at most as deep as it is recursive */
    memset(k, 0, sizeof(k));
    memset(v, 0, sizeof(v));
    memset(q, 0, sizeof(q));
    memset(&d, 0, sizeof(d));
    d.n_queries = 1;
    d.n_heads = NH;
    d.q = q;
    d.out = out;
    calls = g_calls;
    TK_OK(kvc_put(c, 0, k, v)); /* the per-layer calls take no lock */
    TK_OK(kvc_attention(c, 0, &d));
    TK_EQ(g_calls, calls);
    TK_OK(kvc_cache_destroy(c));
    TK_OK(kvc_pool_destroy(pool));
    TK_EQ(g_depth, 0);
    /* the mutex is recursive */
    TK_OK(kvc_mutex_create(&mx));
    kvc_mutex_lock(mx);
    kvc_mutex_lock(mx);
    TK_RES(kvc_mutex_destroy(mx), KVC_ERR_BUSY);
    kvc_mutex_unlock(mx);
    kvc_mutex_unlock(mx);
    TK_RES(kvc_mutex_attach(NULL, &pc.runtime), KVC_ERR_NULL);
    TK_RES(kvc_mutex_create(NULL), KVC_ERR_NULL);
    TK_OK(kvc_mutex_destroy(mx));
}

/* Prefix objects and trees on one locked pool from three threads at once: both count
   among the pool's live_prefixes, which kvc_prefix_create / _destroy once changed
   outside the lock (a race under TSan; the counter ended at -1 and kvc_pool_destroy
   said BUSY with nothing alive). Afterwards the counter is 0 and the pool goes. */
typedef struct churn_gate { /* the threads start their loops together: they overlap */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int waiting, n;
} churn_gate;

typedef struct churn {
    kvc_pool *pool;
    kvc_cache *cache; /* NULL: trees instead of prefix objects */
    churn_gate *gate;
    int32_t rounds, failed;
} churn;

static void *churn_main(void *arg) {
    churn *c = (churn *)arg;
    int32_t i;
    pthread_mutex_lock(&c->gate->mu);
    if (++c->gate->waiting == c->gate->n) pthread_cond_broadcast(&c->gate->cv);
    while (c->gate->waiting < c->gate->n) pthread_cond_wait(&c->gate->cv, &c->gate->mu);
    pthread_mutex_unlock(&c->gate->mu);
    for (i = 0; i < c->rounds; ++i) {
        if (c->cache != NULL) {
            kvc_prefix *x;
            if (kvc_prefix_create(&c->cache, 1, 64, &x) != KVC_OK || kvc_prefix_destroy(x) != KVC_OK) c->failed++;
        } else {
            kvc_radix_config rc;
            kvc_radix *t;
            if (kvc_radix_config_init(&rc, KVC_KIND_FULL) != KVC_OK || kvc_radix_create(c->pool, &rc, &t) != KVC_OK ||
                kvc_radix_destroy(t) != KVC_OK)
                c->failed++;
        }
    }
    return NULL;
}

static void test_prefix_counter(void) {
    kvc_pool_config pc;
    kvc_cache_config cc;
    kvc_pool *pool;
    kvc_mutex *mx;
    kvc_pool_stats ps;
    churn w[3];
    churn_gate gate;
    pthread_t tid[3];
    int i;
    TK_OK(kvc_pool_config_init(&pc));
    pc.n_layers = 1;
    pc.n_kv_heads = 1;
    pc.head_dim_k = pc.head_dim_v = 8;
    pc.page_cells = 4;
    TK_OK(kvc_pool_budget_for_tokens(&pc, 64, &pc.budget_bytes));
    TK_OK(kvc_mutex_create(&mx));
    TK_OK(kvc_mutex_attach(mx, &pc.runtime));
    TK_OK(kvc_pool_create(&pc, &pool));
    TK_OK(kvc_cache_config_init(&cc, KVC_KIND_FULL));
    TK_EQ(pthread_mutex_init(&gate.mu, NULL), 0);
    TK_EQ(pthread_cond_init(&gate.cv, NULL), 0);
    gate.waiting = 0;
    gate.n = 3;
    for (i = 0; i < 3; ++i) {
        w[i].pool = pool;
        w[i].cache = NULL;
        w[i].gate = &gate;
        w[i].rounds = tk_scaled(3000);
        w[i].failed = 0;
        if (i < 2) TK_OK(kvc_cache_create(pool, &cc, &w[i].cache));
    }
    for (i = 0; i < 3; ++i) TK_EQ(pthread_create(&tid[i], NULL, churn_main, &w[i]), 0);
    for (i = 0; i < 3; ++i) TK_EQ(pthread_join(tid[i], NULL), 0);
    for (i = 0; i < 3; ++i) TK_EQ(w[i].failed, 0);
    TK_OK(kvc_pool_stats_get(pool, &ps));
    TK_EQ(ps.live_prefixes, 0);
    for (i = 0; i < 2; ++i) TK_OK(kvc_cache_destroy(w[i].cache));
    TK_OK(kvc_pool_destroy(pool));
    TK_OK(kvc_mutex_destroy(mx));
    pthread_cond_destroy(&gate.cv);
    pthread_mutex_destroy(&gate.mu);
}

int main(int argc, char **argv) {
    unsigned long long seed = argc > 1 ? strtoull(argv[1], NULL, 10) : (unsigned long long)time(NULL);
    tk_rng rng;
    printf("seed %llu\n", seed);
    rng.s = seed;
    test_config();
    test_shared_helper(&rng);
    test_memory_forks(&rng);
    test_prefix_counter();
    test_server(seed);
    return tk_report("threads");
}
#endif
