/* test_memory_radix.c - the radix prefix tree over a model memory: one tree whose entries
   hold every group's share (FULL pages, ROTATING window pages, RECURRENT states at node
   ends), lookups that reuse the longest prefix every group can serve, commits that end
   nodes at the checkpoints, eviction by priority across the groups under one budget,
   and the bad-input contract. A toy model whose K/V and states are exact functions of
   the tokens lets every reused memory be compared with what evaluating the tokens would
   give; a random test compares the reused lengths with a reference list of what was
   committed. */
#include <stdlib.h>
#include <time.h>
#define KVCACHE_IMPLEMENTATION
#include "../kvcache.h"
#include "tk.h"

#define NS 5       /* state floats per recurrent layer */
#define DIM 4      /* head dim of the attention groups */
#define WINDOW 6
#define SINKS 1
#define MAXT 96    /* longest conversation */

static const kvc_namespace NSP = {7, 0};

/* An allocator that refuses the g_refuse-th allocation from the moment it is armed
   (counted from 0; -1: none), and only that one: memories made with g_refusing use it. */
static long g_seen, g_refuse = -1;
static int g_refusing;
static void *refusing_alloc(size_t n, void *user) {
    (void)user;
    if (g_refuse >= 0 && g_seen++ == g_refuse) return NULL;
    return malloc(n);
}
static void refusing_free(void *p, void *user) { (void)user; free(p); }
static void refuse_nth(long n) { g_seen = 0; g_refuse = n; }

/* the toy model: layer 0 recurrent, layer 1 sliding-window attention, layer 2 full */
static float xval(int32_t token, int32_t i) { return (float)((token * 7 + i) % 17 - 8); }
static void step(float *st, int32_t token) {
    int32_t i;
    for (i = 0; i < NS; ++i) st[i] = st[i] * 0.5f + xval(token, i);
}
static float kval(int32_t token, int32_t pos, int32_t layer, int32_t i) {
    return (float)(token * 64 + (pos % 13) * 4 + i + layer * 1000);
}

static void memory_config(kvc_memory_config *mc, kvc_group_config g[3], int32_t map[3], size_t budget) {
    int32_t l;
    kvc_memory_config_init(mc);
    memset(g, 0, sizeof(kvc_group_config) * 3);
    for (l = 0; l < 3; ++l) map[l] = l;
    g[0].pool.n_layers = 1;
    g[0].pool.state_floats = NS;
    kvc_cache_config_init(&g[0].cache, KVC_KIND_RECURRENT);
    g[0].cache.checkpoints = 16;
    for (l = 1; l < 3; ++l) {
        g[l].pool.n_layers = 1;
        g[l].pool.n_kv_heads = 1;
        g[l].pool.head_dim_k = g[l].pool.head_dim_v = DIM;
        g[l].pool.type_k = g[l].pool.type_v = KVC_TYPE_F32;
    }
    g[1].pool.page_cells = 2;
    kvc_cache_config_init(&g[1].cache, KVC_KIND_ROTATING);
    g[1].cache.window = WINDOW;
    g[1].cache.sinks = SINKS;
    g[1].cache.checkpoints = 16;
    g[2].pool.page_cells = 4;
    kvc_cache_config_init(&g[2].cache, KVC_KIND_FULL);
    mc->n_layers = 3;
    mc->layer_group = map;
    mc->n_groups = 3;
    mc->groups = g;
    mc->budget_bytes = budget;
    if (g_refusing) {
        mc->runtime.allocator.alloc = refusing_alloc;
        mc->runtime.allocator.free = refusing_free;
    }
}

/* a forward pass over tokens[off, off+n), with checkpoints at[] */
static kvc_result feed(kvc_memory *m, const int32_t *tokens, int32_t off, int32_t n, const int32_t *at, int32_t n_at) {
    float kv[MAXT * DIM], *st;
    int32_t l, t, i, k = 0;
    kvc_result r = kvc_memory_begin(m, n, at, n_at);
    if (r != KVC_OK) return r;
    if ((r = kvc_memory_state(m, 0, 0, &st)) != KVC_OK) return r;
    for (t = off; t < off + n; ++t) {
        step(st, tokens[t]);
        if (k < n_at && at[k] == t + 1) {
            if ((r = kvc_memory_state_checkpoint(m, 0, t + 1, st)) != KVC_OK) return r;
            k++;
        }
    }
    for (l = 1; l < 3; ++l) {
        for (t = 0; t < n; ++t)
            for (i = 0; i < DIM; ++i) kv[t * DIM + i] = kval(tokens[off + t], off + t, l, i);
        if ((r = kvc_memory_put(m, l, kv, kv)) != KVC_OK) return r;
    }
    return KVC_OK;
}

/* the memory holds exactly what evaluating tokens[0, n) gives: the state, every key of
   the full layer, and (at least) the keys the sliding layer's next query sees */
static int holds(const kvc_memory *m, const int32_t *tokens, int32_t n) {
    kvc_cache *c;
    int32_t gl, off = -1, cells = 0, t, i, pos[MAXT + 8], seen[MAXT + 8];
    float k[(MAXT + 8) * DIM], want[NS];
    const float *st;
    if (kvc_memory_offset(m, &off) != KVC_OK || off != n) return 0;
    if (kvc_memory_layer(m, 0, &c, &gl) != KVC_OK || kvc_state_read(c, 0, 0, &st) != KVC_OK) return 0;
    memset(want, 0, sizeof(want));
    for (t = 0; t < n; ++t) step(want, tokens[t]);
    for (i = 0; i < NS; ++i)
        if ((st ? st[i] : 0.0f) != want[i]) return 0;
    for (gl = 1; gl < 3; ++gl) {
        kvc_cache *a;
        int32_t l2;
        if (kvc_memory_layer(m, gl, &a, &l2) != KVC_OK) return 0;
        if (kvc_cache_gather(a, l2, k, NULL, pos, MAXT + 8, &cells) != KVC_OK) return 0;
        memset(seen, 0, sizeof(seen));
        for (t = 0; t < cells; ++t) {
            if (pos[t] < 0 || pos[t] >= n) return 0;
            seen[pos[t]] = 1;
            for (i = 0; i < DIM; ++i)
                if (k[t * DIM + i] != kval(tokens[pos[t]], pos[t], gl, i)) return 0;
        }
        for (t = 0; t < n; ++t) {
            int needed = gl == 2 || t < SINKS || t > n - WINDOW + SINKS; /* the next query's */
            if (needed && !seen[t]) return 0;
        }
    }
    return 1;
}

static kvc_memory *new_memory(size_t budget) {
    kvc_memory_config mc;
    kvc_group_config g[3];
    int32_t map[3];
    kvc_memory *m = NULL;
    memory_config(&mc, g, map, budget);
    TK_OK(kvc_memory_create(&mc, &m));
    return m;
}

static kvc_radix_stats stats_of(const kvc_radix *t) {
    kvc_radix_stats s;
    memset(&s, 0, sizeof(s));
    TK_OK(kvc_radix_stats_get(t, &s));
    return s;
}

/* one request: look up, evaluate the rest (checkpoints at[]), commit; returns the reused
   length (-1 on failure); the memory is destroyed unless *keep is given */
static int32_t request(kvc_radix *t, const int32_t *tokens, int32_t n, const int32_t *at, int32_t n_at,
                       int32_t priority, kvc_memory **keep) {
    kvc_memory *m = NULL;
    int32_t reused = -1, ck[32], n_ck = 0, i;
    if (kvc_radix_lookup_memory(t, NSP, tokens, n, &m, &reused) != KVC_OK) return -1;
    TK_CHECK(reused >= 0 && (n == 0 || reused < n));
    TK_CHECK(holds(m, tokens, reused));
    for (i = 0; i < n_at; ++i)
        if (at[i] > reused && at[i] <= n) ck[n_ck++] = at[i];
    if (n > reused) TK_OK(feed(m, tokens, reused, n - reused, ck, n_ck));
    TK_CHECK(holds(m, tokens, n));
    TK_OK(kvc_radix_commit_memory(t, NSP, m, tokens, n, priority));
    if (keep) *keep = m;
    else TK_OK(kvc_memory_destroy(m));
    return reused;
}

static void test_reuse(void) {
    int32_t sys[16], a[40], b[40], turn2[56], i, at_sys[2] = {16, 24};
    kvc_memory *m0 = new_memory(1 << 20), *m = NULL;
    kvc_radix_config rc;
    kvc_radix *t = NULL;
    kvc_radix_stats s;
    for (i = 0; i < 16; ++i) sys[i] = 100 + i;
    for (i = 0; i < 40; ++i) a[i] = i < 16 ? sys[i] : 200 + i;
    for (i = 0; i < 40; ++i) b[i] = i < 16 ? sys[i] : 300 + i;
    kvc_radix_config_init(&rc, KVC_KIND_FULL);
    TK_OK(kvc_radix_create_memory(m0, &rc, &t));
    TK_OK(kvc_memory_destroy(m0)); /* the tree keeps the pools */
    /* conversation A: nothing cached; a checkpoint at the end of the system prompt */
    TK_EQ(request(t, a, 40, at_sys, 2, 0, NULL), 0);
    s = stats_of(t);
    TK_EQ(s.n_states, 3); /* at 16, 24 and the end */
    TK_EQ(s.n_in_use, 0);
    /* B shares the system prompt: resumes from the state at 16 */
    TK_EQ(request(t, b, 40, NULL, 0, 0, NULL), 16);
    /* A again: all but the last token (the state at 39 is not kept: back to 24) */
    TK_EQ(request(t, a, 40, NULL, 0, 0, NULL), 24);
    /* A's second turn: A + generated + new tokens reuses all of A */
    for (i = 0; i < 56; ++i) turn2[i] = i < 40 ? a[i] : 400 + i;
    TK_EQ(request(t, turn2, 56, NULL, 0, 0, &m), 40);
    TK_EQ(stats_of(t).n_in_use, 3); /* the memory's three caches hold the entry */
    TK_OK(kvc_radix_release_memory(m));
    TK_EQ(stats_of(t).n_in_use, 0);
    TK_OK(kvc_memory_destroy(m));
    /* a prompt that ends inside the tree at a state: reuses up to it, one token left */
    TK_EQ(request(t, a, 25, NULL, 0, 0, NULL), 24);
    TK_EQ(request(t, a, 24, NULL, 0, 0, NULL), 16);
    /* an empty prompt: nothing reused, nothing committed */
    {
        kvc_memory *e = NULL;
        int32_t r = -1, off = -1;
        TK_OK(kvc_radix_lookup_memory(t, NSP, NULL, 0, &e, &r));
        TK_EQ(r, 0);
        TK_OK(kvc_memory_offset(e, &off));
        TK_EQ(off, 0);
        TK_OK(kvc_radix_commit_memory(t, NSP, e, NULL, 0, 0));
        TK_OK(kvc_memory_destroy(e));
    }
    /* another namespace sees nothing */
    {
        kvc_namespace other = {8, 0};
        kvc_memory *e = NULL;
        int32_t r = -1;
        TK_OK(kvc_radix_lookup_memory(t, other, a, 40, &e, &r));
        TK_EQ(r, 0);
        TK_OK(kvc_memory_destroy(e));
    }
    TK_OK(kvc_radix_destroy(t));
}

/* checkpoints committed later split nodes an earlier commit made */
static void test_late_checkpoint(void) {
    int32_t a[30], b[30], i, at[1] = {10};
    kvc_memory *m0 = new_memory(1 << 20);
    kvc_radix_config rc;
    kvc_radix *t = NULL;
    for (i = 0; i < 30; ++i) { a[i] = 500 + i; b[i] = i < 20 ? a[i] : 600 + i; }
    kvc_radix_config_init(&rc, KVC_KIND_FULL);
    TK_OK(kvc_radix_create_memory(m0, &rc, &t));
    TK_EQ(request(t, a, 30, NULL, 0, 0, NULL), 0); /* no checkpoint: one node, a state at 30 */
    TK_EQ(request(t, b, 30, NULL, 0, 0, NULL), 0); /* shares 20 tokens but no state there */
    TK_EQ(request(t, a, 30, at, 1, 0, NULL), 0);   /* all but its last token: no state before */
    TK_EQ(stats_of(t).n_nodes, 4);                  /* [0,10) [10,20) and the two tails */
    TK_EQ(request(t, b, 30, NULL, 0, 0, NULL), 10); /* A's second commit left a state at 10 */
    TK_OK(kvc_memory_destroy(m0));
    TK_OK(kvc_radix_destroy(t));
}

/* Pressure: conversations that do not fit together; kvc_memory_begin evicts whole
   entries (every group's pages and the states) and everything adds up afterwards. */
static void test_eviction(void) {
    int32_t tok[40], c, i, at[2] = {12, 30};
    kvc_memory *m0 = new_memory(6 * 1024);
    kvc_memory_stats ms;
    kvc_radix_config rc;
    kvc_radix *t = NULL;
    kvc_radix_stats s;
    kvc_radix_config_init(&rc, KVC_KIND_FULL);
    TK_OK(kvc_radix_create_memory(m0, &rc, &t));
    for (c = 0; c < 20; ++c) {
        for (i = 0; i < 40; ++i) tok[i] = 1000 * (c + 1) + i;
        TK_EQ(request(t, tok, 40, at, 2, 0, NULL), 0);
    }
    s = stats_of(t);
    TK_CHECK(s.entries_evicted > 0);
    TK_CHECK(s.n_entries >= 1 && s.n_entries < 20);
    TK_OK(kvc_memory_stats_get(m0, &ms));
    TK_EQ(ms.bytes_used, s.bytes); /* the template memory is empty: the tree holds it all */
    TK_CHECK(ms.bytes_used <= ms.budget_bytes);
    /* the latest one is there, the first one is gone */
    TK_EQ(request(t, tok, 40, NULL, 0, 0, NULL), 30);
    for (i = 0; i < 40; ++i) tok[i] = 1000 + i;
    TK_EQ(request(t, tok, 40, NULL, 0, 0, NULL), 0);
    TK_OK(kvc_radix_evict(t, 1 << 20, NULL));
    TK_OK(kvc_memory_stats_get(m0, &ms));
    TK_EQ(ms.bytes_used, 0);
    TK_EQ(stats_of(t).n_nodes, 0);
    TK_OK(kvc_radix_destroy(t));
    TK_OK(kvc_memory_destroy(m0));
}

/* Priorities: the lowest first, pins still win (on a memory's tree and a pool's). */
static void test_priority(void) {
    int32_t sys[16], a[40], b[40], c[40], i, at_c[1] = {20};
    kvc_memory *m0 = new_memory(1 << 20);
    kvc_radix_config rc;
    kvc_radix *t = NULL;
    kvc_memory *e = NULL;
    int32_t r = -1, before;
    for (i = 0; i < 16; ++i) sys[i] = 50 + i;
    for (i = 0; i < 40; ++i) { a[i] = i < 16 ? sys[i] : 700 + i; b[i] = i < 16 ? sys[i] : 800 + i; c[i] = 900 + i; }
    kvc_radix_config_init(&rc, KVC_KIND_FULL);
    TK_OK(kvc_radix_create_memory(m0, &rc, &t));
    TK_EQ(request(t, sys, 16, NULL, 0, 2, NULL), 0); /* the system prompt: priority 2 */
    TK_EQ(request(t, a, 40, NULL, 0, 0, NULL), 16);
    TK_EQ(request(t, c, 40, at_c, 1, 1, NULL), 0);   /* a user turn: priority 1 */
    TK_EQ(request(t, b, 40, NULL, 0, 0, NULL), 16);  /* newer than c, but priority 0 */
    before = stats_of(t).n_entries;
    TK_EQ(before, 3);
    TK_OK(kvc_radix_evict(t, 1, NULL));             /* a, then b: priority 0 */
    TK_OK(kvc_radix_evict(t, 1, NULL));
    TK_EQ(stats_of(t).n_entries, 2);
    TK_OK(kvc_radix_lookup_memory(t, NSP, c, 40, &e, &r));
    TK_EQ(r, 20);
    TK_OK(kvc_memory_destroy(e));
    TK_OK(kvc_radix_pin(t, NSP, c, 20));            /* c's first 20 pinned: its tail goes, */
    TK_OK(kvc_radix_evict(t, 1, NULL));
    TK_OK(kvc_radix_evict(t, 1, NULL));             /* then the system prompt, despite 2 */
    TK_OK(kvc_radix_lookup_memory(t, NSP, c, 40, &e, &r));
    TK_EQ(r, 20);
    TK_OK(kvc_memory_destroy(e));
    TK_OK(kvc_radix_lookup_memory(t, NSP, b, 40, &e, &r));
    TK_EQ(r, 0);
    TK_OK(kvc_memory_destroy(e));
    TK_OK(kvc_radix_unpin(t, NSP, c, 20));
    TK_OK(kvc_radix_evict(t, 1 << 20, NULL));
    TK_EQ(stats_of(t).n_nodes, 0);
    TK_OK(kvc_radix_destroy(t));
    TK_OK(kvc_memory_destroy(m0));
}

/* Bad input: distinct errors, nothing changed. */
static void test_errors(void) {
    int32_t tok[12], i, r = -1;
    kvc_memory *m0 = new_memory(1 << 20), *other = new_memory(1 << 20), *m = NULL;
    kvc_memory_config mc;
    kvc_group_config g[3];
    int32_t map[3];
    kvc_radix_config rc;
    kvc_radix *t = NULL, *pt = NULL;
    kvc_radix_stats before, after;
    kvc_cache *c = NULL;
    for (i = 0; i < 12; ++i) tok[i] = 40 + i;
    kvc_radix_config_init(&rc, KVC_KIND_FULL);
    TK_RES(kvc_radix_create_memory(NULL, &rc, &t), KVC_ERR_NULL);
    TK_RES(kvc_radix_create_memory(m0, NULL, &t), KVC_ERR_NULL);
    TK_RES(kvc_radix_create_memory(m0, &rc, NULL), KVC_ERR_NULL);
    rc.max_entries = -1;
    TK_RES(kvc_radix_create_memory(m0, &rc, &t), KVC_ERR_INVALID);
    rc.max_entries = 0;
    memory_config(&mc, g, map, 1 << 20);
    kvc_cache_config_init(&g[2].cache, KVC_KIND_CAUSAL);
    g[2].cache.capacity = 16;
    TK_OK(kvc_memory_create(&mc, &m));
    TK_RES(kvc_radix_create_memory(m, &rc, &t), KVC_ERR_UNSUPPORTED); /* CAUSAL has no prefix */
    TK_OK(kvc_memory_destroy(m));
    TK_CHECK(t == NULL);
    TK_OK(kvc_radix_create_memory(m0, &rc, &t));
    TK_EQ(request(t, tok, 12, NULL, 0, 0, &m), 0);
    before = stats_of(t);
    /* the pool tree's calls and the memory tree's do not mix */
    TK_OK(kvc_memory_group(m, 2, &c));
    TK_RES(kvc_radix_lookup(t, NSP, tok, 12, &c, &r), KVC_ERR_UNSUPPORTED);
    TK_RES(kvc_radix_commit(t, NSP, c, tok, 12, 0), KVC_ERR_UNSUPPORTED);
    {
        kvc_radix_config prc;
        kvc_pool *pool = NULL;
        kvc_pool_config pc;
        kvc_pool_config_init(&pc);
        pc.n_layers = 1; pc.n_kv_heads = 1; pc.head_dim_k = pc.head_dim_v = DIM;
        pc.budget_bytes = 1 << 16;
        TK_OK(kvc_pool_create(&pc, &pool));
        kvc_radix_config_init(&prc, KVC_KIND_FULL);
        TK_OK(kvc_radix_create(pool, &prc, &pt));
        TK_RES(kvc_radix_lookup_memory(pt, NSP, tok, 12, &m, &r), KVC_ERR_UNSUPPORTED);
        TK_RES(kvc_radix_commit_memory(pt, NSP, m, tok, 12, 0), KVC_ERR_UNSUPPORTED);
        TK_OK(kvc_radix_destroy(pt));
        TK_OK(kvc_pool_destroy(pool));
    }
    TK_RES(kvc_radix_lookup_memory(NULL, NSP, tok, 12, &m, &r), KVC_ERR_NULL);
    TK_RES(kvc_radix_lookup_memory(t, NSP, NULL, 12, &m, &r), KVC_ERR_NULL);
    TK_RES(kvc_radix_lookup_memory(t, NSP, tok, 12, NULL, &r), KVC_ERR_NULL);
    TK_RES(kvc_radix_lookup_memory(t, NSP, tok, 12, &m, NULL), KVC_ERR_NULL);
    TK_RES(kvc_radix_lookup_memory(t, NSP, tok, -1, &m, &r), KVC_ERR_INVALID);
    TK_RES(kvc_radix_commit_memory(NULL, NSP, m, tok, 12, 0), KVC_ERR_NULL);
    TK_RES(kvc_radix_commit_memory(t, NSP, NULL, tok, 12, 0), KVC_ERR_NULL);
    TK_RES(kvc_radix_commit_memory(t, NSP, m, NULL, 12, 0), KVC_ERR_NULL);
    TK_RES(kvc_radix_commit_memory(t, NSP, m, tok, -1, 0), KVC_ERR_INVALID);
    TK_RES(kvc_radix_commit_memory(t, NSP, other, tok, 0, 0), KVC_ERR_FOREIGN);
    TK_OK(kvc_memory_begin(m, 1, NULL, 0));
    TK_RES(kvc_radix_commit_memory(t, NSP, m, tok, 12, 0), KVC_ERR_STATE);
    TK_OK(kvc_memory_cancel(m));
    TK_RES(kvc_radix_release_memory(NULL), KVC_ERR_NULL);
    TK_RES(kvc_radix_destroy(t), KVC_ERR_BUSY);      /* m holds its entry */
    after = stats_of(t);
    TK_EQ(after.n_nodes, before.n_nodes);
    TK_EQ(after.n_pages, before.n_pages);
    TK_EQ(after.commits, before.commits);
    TK_EQ(after.lookups, before.lookups);
    TK_EQ(after.n_in_use, before.n_in_use);
    TK_CHECK(holds(m, tok, 12));
    TK_OK(kvc_memory_destroy(m));
    TK_OK(kvc_radix_destroy(t));
    TK_OK(kvc_memory_destroy(m0));
    TK_OK(kvc_memory_destroy(other));
}

/* Issue 35.3: a batch that needs an unused entry evicted, with one of its allocations
   refused, evicts nothing (it evicted the entry, then returned KVC_ERR_NO_MEMORY); the
   memory and the tree are as they were, and the call then succeeds (evicting). */
static void test_begin_refused(void) {
    int32_t a[40], b[40], i, at[1] = {20}, r = -1;
    long k;
    kvc_memory *m0, *m = NULL;
    kvc_radix_config rc;
    kvc_radix *t = NULL;
    kvc_radix_stats before, now;
    kvc_memory_stats ms;
    kvc_result res = KVC_ERR_NO_MEMORY;
    g_refusing = 1;
    m0 = new_memory(3 * 1024);
    g_refusing = 0;
    for (i = 0; i < 40; ++i) { a[i] = 1100 + i; b[i] = 2100 + i; }
    kvc_radix_config_init(&rc, KVC_KIND_FULL);
    TK_OK(kvc_radix_create_memory(m0, &rc, &t));
    TK_EQ(request(t, a, 40, NULL, 0, 0, NULL), 0);
    TK_OK(kvc_radix_lookup_memory(t, NSP, b, 40, &m, &r));
    TK_EQ(r, 0);
    before = stats_of(t);
    TK_CHECK(before.n_pages > 0);
    for (k = 0; k < 16; ++k) {
        refuse_nth(k);
        res = kvc_memory_begin(m, 40, at, 1);
        g_refuse = -1;
        if (res == KVC_OK) break;
        TK_RES(res, KVC_ERR_NO_MEMORY);
        now = stats_of(t);
        TK_EQ(now.entries_evicted, before.entries_evicted);
        TK_EQ(now.n_pages, before.n_pages);
        TK_OK(kvc_memory_stats_get(m, &ms));
        TK_EQ(ms.offset, 0);
    }
    TK_OK(res);
    TK_CHECK(k > 0);
    TK_CHECK(stats_of(t).entries_evicted > before.entries_evicted); /* it needed the room */
    TK_OK(kvc_memory_cancel(m));
    TK_OK(kvc_memory_destroy(m));
    TK_OK(kvc_radix_destroy(t));
    TK_OK(kvc_memory_destroy(m0));
}

/* Issue 35 (contracts): kvc_memory_restore makes room as kvc_memory_begin does. A restore
   from a snapshot taken from 2 (its FULL group's page at 2 shared no more: the memory wrote
   other tokens there since) needs a page copy; with the budget short of it by one byte and
   an unused tree entry, the restore evicts the entry and succeeds (it returned KVC_ERR_FULL
   with the entry in place). *used: the budget's bytes in use just before the restore. */
static kvc_result restore_needing_room(size_t budget, size_t *used, int *evicted_before, int *evicted) {
    int32_t a[40], b[12], c2[12], i, at[1] = {2}, r = -1;
    kvc_memory *m0 = new_memory(budget), *m = NULL;
    kvc_radix_config rc;
    kvc_radix *t = NULL;
    kvc_memory_snapshot *s = NULL;
    kvc_memory_stats ms;
    kvc_result res;
    for (i = 0; i < 40; ++i) a[i] = 3100 + i;
    for (i = 0; i < 12; ++i) { b[i] = 4100 + i; c2[i] = i < 2 ? b[i] : 5100 + i; }
    kvc_radix_config_init(&rc, KVC_KIND_FULL);
    TK_OK(kvc_radix_create_memory(m0, &rc, &t));
    TK_EQ(request(t, a, 40, NULL, 0, 0, NULL), 0); /* the unused entry */
    TK_OK(kvc_radix_lookup_memory(t, NSP, b, 12, &m, &r));
    TK_OK(feed(m, b, 0, 10, at, 1));
    TK_OK(kvc_memory_snapshot_take(m, 2, 10, &s));
    TK_OK(kvc_memory_trim(m, 8));
    TK_OK(feed(m, c2, 2, 2, NULL, 0)); /* the FULL group's page 0 copied on write */
    TK_OK(kvc_memory_trim(m, 2));
    TK_OK(kvc_memory_stats_get(m, &ms));
    *used = ms.bytes_used;
    *evicted_before = stats_of(t).entries_evicted > 0;
    res = kvc_memory_restore(m, s, 10);
    *evicted = stats_of(t).entries_evicted > 0;
    if (res == KVC_OK) TK_CHECK(holds(m, b, 10));
    else TK_CHECK(holds(m, c2, 2)); /* nothing changed */
    TK_OK(kvc_memory_snapshot_free(s));
    TK_OK(kvc_memory_destroy(m));
    TK_OK(kvc_radix_destroy(t));
    TK_OK(kvc_memory_destroy(m0));
    return res;
}
static void test_restore_evicts(void) {
    size_t used = 0, used2 = 0;
    int before = 1, evicted = 1;
    TK_OK(restore_needing_room(1 << 20, &used, &before, &evicted)); /* room enough: nothing evicted */
    TK_CHECK(!before && !evicted);
    /* one FULL page (4 cells x 4 dims x 4 bytes, K and V) short */
    TK_OK(restore_needing_room(used + 4 * DIM * 4 * 2 - 1, &used2, &before, &evicted));
    TK_EQ(used2, used);
    TK_CHECK(!before && evicted);
}

/* ---- save and load of a memory tree's entries --------------------------------------- */
static kvc_result save_entry(kvc_radix *t, kvc_namespace ns, const int32_t *tok, int32_t n, unsigned char **buf,
                             size_t *len) {
    kvc_mem mm;
    kvc_io io;
    kvc_result r;
    memset(&mm, 0, sizeof(mm));
    kvc_io_memory(&mm, &io);
    *buf = NULL;
    if ((r = kvc_radix_save(t, ns, tok, n, &io)) != KVC_OK) return r; /* counts the bytes */
    mm.data = (unsigned char *)malloc(mm.size);
    mm.capacity = mm.size;
    mm.size = 0;
    kvc_io_memory(&mm, &io);
    r = kvc_radix_save(t, ns, tok, n, &io);
    *buf = mm.data;
    *len = mm.size;
    return r;
}

static kvc_result load_entry(kvc_radix *t, kvc_namespace ns, const unsigned char *buf, size_t len, int pin,
                             int32_t *n) {
    kvc_mem mm;
    kvc_io io;
    memset(&mm, 0, sizeof(mm));
    mm.data = (unsigned char *)(uintptr_t)buf;
    mm.capacity = mm.size = len;
    kvc_io_memory(&mm, &io);
    return kvc_radix_load(t, ns, &io, pin, n);
}

static void test_persistence(unsigned long long seed) {
    int32_t a[40], turn2[48], i, n = -1, at[1] = {16};
    kvc_memory *m0 = new_memory(1 << 20), *m1 = new_memory(1 << 20), *m = NULL;
    kvc_memory_stats ms0, ms1;
    kvc_radix_config rc;
    kvc_radix *t = NULL, *t2 = NULL;
    kvc_radix_stats before;
    unsigned char *buf = NULL, *bad;
    size_t len = 0, cut;
    int32_t r = -1;
    for (i = 0; i < 48; ++i) turn2[i] = i < 40 ? (a[i] = 30 + (i * 7) % 11) : 99;
    kvc_radix_config_init(&rc, KVC_KIND_FULL);
    TK_OK(kvc_radix_create_memory(m0, &rc, &t));
    TK_OK(kvc_radix_create_memory(m1, &rc, &t2));
    TK_EQ(request(t, a, 40, at, 1, 0, NULL), 0);
    TK_RES(save_entry(t, NSP, a, 30, &buf, &len), KVC_ERR_NOT_FOUND); /* no state at 30 */
    TK_OK(save_entry(t, NSP, a, 40, &buf, &len));
    /* into another memory's tree: turn 2 then reuses all 40 tokens */
    TK_RES(load_entry(t2, (kvc_namespace){8, 0}, buf, len, 0, &n), KVC_ERR_MISMATCH);
    TK_EQ(stats_of(t2).n_nodes, 0);
    TK_OK(load_entry(t2, NSP, buf, len, 1, &n));
    TK_EQ(n, 40);
    TK_EQ(stats_of(t2).n_pinned, 1);
    TK_OK(kvc_radix_lookup_memory(t2, NSP, turn2, 48, &m, &r));
    TK_EQ(r, 40);
    TK_CHECK(holds(m, turn2, 40));
    TK_OK(kvc_memory_destroy(m));
    TK_OK(kvc_radix_unpin(t2, NSP, a, 40));
    TK_OK(kvc_radix_evict(t2, 1 << 20, NULL));
    /* every truncation, and damaged bytes: an error, the tree and the budget unchanged */
    before = stats_of(t2);
    TK_OK(kvc_memory_stats_get(m1, &ms0));
    bad = (unsigned char *)malloc(len);
    for (cut = 0; cut < len; cut += 1 + (cut > 64 ? (size_t)(seed % 7) : 0)) {
        kvc_result e = load_entry(t2, NSP, buf, cut, 0, &n);
        TK_CHECK(e == KVC_ERR_TRUNCATED || e == KVC_ERR_CORRUPT || e == KVC_ERR_FORMAT);
    }
    for (i = 0; i < 64; ++i) {
        size_t at_byte = (size_t)((seed + (unsigned long long)i * 2654435761u) % len);
        memcpy(bad, buf, len);
        bad[at_byte] ^= (unsigned char)(1u << (i % 8));
        TK_CHECK(load_entry(t2, NSP, bad, len, 0, &n) != KVC_OK);
    }
    TK_EQ(stats_of(t2).n_nodes, before.n_nodes);
    TK_OK(kvc_memory_stats_get(m1, &ms1));
    TK_EQ(ms1.bytes_used, ms0.bytes_used);
    free(bad);
    /* a pool tree's entry is no memory tree's, and the other way round */
    {
        kvc_pool_config pc;
        kvc_pool *pool = NULL;
        kvc_radix *pt = NULL;
        kvc_pool_config_init(&pc);
        pc.n_layers = 1; pc.n_kv_heads = 1; pc.head_dim_k = pc.head_dim_v = DIM;
        pc.budget_bytes = 1 << 16;
        TK_OK(kvc_pool_create(&pc, &pool));
        TK_OK(kvc_radix_create(pool, &rc, &pt));
        TK_RES(load_entry(pt, NSP, buf, len, 0, &n), KVC_ERR_MISMATCH);
        TK_OK(kvc_radix_destroy(pt));
        TK_OK(kvc_pool_destroy(pool));
    }
    free(buf);
    TK_OK(kvc_radix_destroy(t));
    TK_OK(kvc_radix_destroy(t2));
    TK_OK(kvc_memory_destroy(m0));
    TK_OK(kvc_memory_destroy(m1));
}

/* Issue 35 (contracts): a load never evicts. Loading an entry into a tree whose unused
   entry holds the pages it needs: damaged input fails and a sound one is refused with
   KVC_ERR_FULL, both with the tree as it was (a damaged file evicted the entry); after
   kvc_radix_evict it loads. */
static void test_load_evicts_nothing(void) {
    int32_t a[40], b[40], i, n = -1, r = -1;
    kvc_memory *m0 = new_memory(3 * 1024), *m = NULL;
    kvc_radix_config rc;
    kvc_radix *t = NULL;
    kvc_radix_stats before, now;
    unsigned char *buf = NULL, *bad;
    size_t len = 0, cut;
    kvc_result e;
    for (i = 0; i < 40; ++i) { a[i] = 3100 + i; b[i] = 4100 + i; }
    kvc_radix_config_init(&rc, KVC_KIND_FULL);
    TK_OK(kvc_radix_create_memory(m0, &rc, &t));
    TK_EQ(request(t, a, 40, NULL, 0, 0, NULL), 0);
    TK_OK(save_entry(t, NSP, a, 40, &buf, &len));
    TK_OK(kvc_radix_evict(t, 1 << 20, NULL));
    TK_EQ(request(t, b, 40, NULL, 0, 0, NULL), 0); /* the tree now holds b, unused */
    before = stats_of(t);
    bad = (unsigned char *)malloc(len);
    for (i = 0; i < 3; ++i) { /* a flipped byte in the K/V, near the end, a truncation */
        memcpy(bad, buf, len);
        cut = i == 2 ? len - 9 : len;
        if (i < 2) bad[i == 0 ? len - 40 : len - 3] ^= 0x10;
        e = load_entry(t, NSP, bad, cut, 0, &n);
        TK_CHECK(e != KVC_OK);
        now = stats_of(t);
        TK_EQ(now.entries_evicted, before.entries_evicted);
        TK_EQ(now.n_pages, before.n_pages);
    }
    free(bad);
    TK_RES(load_entry(t, NSP, buf, len, 0, &n), KVC_ERR_FULL); /* sound, but no room */
    now = stats_of(t);
    TK_EQ(now.entries_evicted, before.entries_evicted);
    TK_EQ(now.n_nodes, before.n_nodes);
    TK_OK(kvc_radix_evict(t, 1 << 20, NULL));
    TK_OK(load_entry(t, NSP, buf, len, 0, &n));
    TK_EQ(n, 40);
    {
        int32_t turn[41];
        memcpy(turn, a, sizeof(a));
        turn[40] = 7;
        TK_OK(kvc_radix_lookup_memory(t, NSP, turn, 41, &m, &r));
        TK_EQ(r, 40);
        TK_CHECK(holds(m, turn, 40));
        TK_OK(kvc_memory_destroy(m));
    }
    free(buf);
    TK_OK(kvc_radix_destroy(t));
    TK_OK(kvc_memory_destroy(m0));
}

/* ---- random conversations against a reference list of what was committed ---------- */
typedef struct {
    int32_t tok[MAXT];
    int32_t n;
    unsigned char state[MAXT + 1]; /* state[b]: a state after tokens[0, b) was committed */
} ref_entry;

static unsigned long long rng_state;
static uint32_t rnd(void) {
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (uint32_t)(rng_state >> 33);
}

/* what a lookup must reuse when nothing was evicted */
static int32_t expected_reuse(const ref_entry *e, int32_t n_e, const int32_t *q, int32_t n) {
    int32_t best = 0, i, b;
    for (i = 0; i < n_e; ++i)
        for (b = 1; b <= e[i].n && b <= n - 1; ++b) {
            if (e[i].tok[b - 1] != q[b - 1]) break;
            if (e[i].state[b] && b > best) best = b;
        }
    return best;
}

static void test_random(unsigned long long seed, int32_t rounds, size_t budget) {
    static ref_entry ref[512];
    int32_t n_ref = 0, k, i;
    kvc_memory *m0 = new_memory(budget);
    kvc_radix_config rc;
    kvc_radix *t = NULL;
    kvc_radix_stats s;
    int evicting = budget < (1 << 20);
    rng_state = seed;
    kvc_radix_config_init(&rc, KVC_KIND_FULL);
    TK_OK(kvc_radix_create_memory(m0, &rc, &t));
    for (k = 0; k < rounds; ++k) {
        int32_t q[MAXT], n = (int32_t)(rnd() % (MAXT / 2)) + 1, at[4], n_at = 0, reused, want;
        /* often a continuation of an earlier conversation, else fresh; a 3-token alphabet */
        if (n_ref > 0 && rnd() % 3 != 0) {
            const ref_entry *e = &ref[rnd() % (uint32_t)n_ref];
            int32_t keep = (int32_t)(rnd() % (uint32_t)(e->n + 1));
            n = TK_MIN(MAXT, keep + n);
            for (i = 0; i < n; ++i) q[i] = i < keep ? e->tok[i] : (int32_t)(rnd() % 3);
        } else {
            for (i = 0; i < n; ++i) q[i] = (int32_t)(rnd() % 3);
        }
        for (i = 0; i < 4; ++i) { /* increasing checkpoint offsets */
            int32_t a = (int32_t)(rnd() % (uint32_t)n) + 1;
            if (n_at == 0 || a > at[n_at - 1]) at[n_at++] = a;
        }
        want = expected_reuse(ref, n_ref, q, n);
        reused = request(t, q, n, at, n_at, (int32_t)(rnd() % 3), NULL);
        if (evicting) TK_CHECK(reused >= 0 && reused <= want);
        else TK_EQ(reused, want);
        if (n_ref < 512) {
            ref_entry *e = &ref[n_ref++];
            memset(e, 0, sizeof(*e));
            memcpy(e->tok, q, sizeof(int32_t) * (size_t)n);
            e->n = n;
            e->state[n] = 1;
            for (i = 0; i < n_at; ++i)
                if (at[i] > reused) e->state[at[i]] = 1;
        }
    }
    s = stats_of(t);
    TK_CHECK(s.lookups == (uint64_t)rounds && s.commits == (uint64_t)rounds);
    TK_CHECK(evicting ? s.entries_evicted > 0 : s.entries_evicted == 0);
    TK_OK(kvc_radix_destroy(t));
    TK_OK(kvc_memory_destroy(m0));
}

/* an allocator that refuses while `refuse` is set (the lookup-into's all or nothing) */
static int refuse_alloc;
static void *maybe_alloc(size_t n, void *user) { (void)user; return refuse_alloc ? NULL : malloc(n); }
static void maybe_free(void *p, void *user) { (void)user; free(p); }

/* attention of n queries over the last n positions of layer l (1: sliding, 2: full) */
static void attend(const kvc_memory *m, int32_t l, int32_t n, float *out) {
    float q[MAXT * DIM];
    int32_t i;
    kvc_attention_desc d;
    for (i = 0; i < n * DIM; ++i) q[i] = (float)((i * 37) % 11 - 5) * 0.01f;
    memset(&d, 0, sizeof(d));
    d.n_queries = n;
    d.n_heads = 1;
    d.q = q;
    d.out = out;
    TK_OK(kvc_memory_attention(m, l, &d));
}

/* kvc_radix_lookup_into_memory: the engine's one memory takes what a new lookup memory
   would hold (same states, same attention bits), all or nothing, and is reused */
static void test_lookup_into(void) {
    int32_t sys[16], a[40], b[40], i, l, at_sys[2] = {16, 36}, r = -1, r2 = -1, off = -1;
    kvc_memory_config mc;
    kvc_group_config g[3];
    int32_t map[3];
    kvc_memory *e = NULL, *n = NULL, *f = NULL, *other = new_memory(1 << 20);
    kvc_radix_config rc;
    kvc_radix *t = NULL;
    float o1[MAXT * DIM], o2[MAXT * DIM];
    const float *s1, *s2;
    for (i = 0; i < 16; ++i) sys[i] = 700 + i;
    for (i = 0; i < 40; ++i) a[i] = i < 16 ? sys[i] : 800 + i;
    for (i = 0; i < 40; ++i) b[i] = i < 16 ? sys[i] : 900 + i;
    memory_config(&mc, g, map, 1 << 20);
    mc.runtime.allocator.alloc = maybe_alloc;
    mc.runtime.allocator.free = maybe_free;
    TK_OK(kvc_memory_create(&mc, &e)); /* the engine's memory, for the whole run */
    kvc_radix_config_init(&rc, KVC_KIND_FULL);
    TK_OK(kvc_radix_create_memory(e, &rc, &t));
    TK_OK(kvc_radix_lookup_into_memory(t, NSP, a, 40, e, &r));
    TK_EQ(r, 0);
    TK_OK(feed(e, a, 0, 40, at_sys, 2));
    TK_OK(kvc_radix_commit_memory(t, NSP, e, a, 40, 0));
    /* B shares the system prompt: into e, and as a new memory; the same contents */
    TK_OK(kvc_radix_lookup_into_memory(t, NSP, b, 40, e, &r));
    TK_EQ(r, 16);
    TK_CHECK(holds(e, b, 16));
    TK_EQ(stats_of(t).n_in_use, 3);
    TK_OK(kvc_radix_lookup_memory(t, NSP, b, 40, &n, &r2));
    TK_EQ(r2, 16);
    TK_OK(feed(e, b, 16, 24, NULL, 0));
    TK_OK(feed(n, b, 16, 24, NULL, 0));
    for (l = 1; l < 3; ++l) {
        attend(e, l, 24, o1);
        attend(n, l, 24, o2);
        TK_CHECK(memcmp(o1, o2, sizeof(float) * 24 * DIM) == 0);
    }
    TK_OK(kvc_memory_state_read(e, 0, &s1));
    TK_OK(kvc_memory_state_read(n, 0, &s2));
    TK_CHECK(s1 != NULL && s2 != NULL && memcmp(s1, s2, sizeof(float) * NS) == 0);
    TK_OK(kvc_memory_destroy(n));
    TK_OK(kvc_radix_commit_memory(t, NSP, e, b, 40, 0));
    /* a fork holding B's 16 tokens: its page tables (8 entries) cannot grow to A's 36 */
    TK_OK(kvc_radix_lookup_into_memory(t, NSP, b, 40, e, &r));
    TK_OK(kvc_memory_fork(e, &f));
    refuse_alloc = 1;
    TK_RES(kvc_radix_lookup_into_memory(t, NSP, a, 40, f, &r), KVC_ERR_NO_MEMORY);
    refuse_alloc = 0;
    TK_CHECK(holds(f, b, 16));
    TK_OK(kvc_radix_lookup_into_memory(t, NSP, a, 40, f, &r));
    TK_EQ(r, 36);
    TK_CHECK(holds(f, a, 36));
    TK_OK(kvc_memory_destroy(f));
    /* back to A (one token left: the state at 39 is not kept, 36 is the last before) */
    TK_OK(kvc_radix_lookup_into_memory(t, NSP, a, 40, e, &r));
    TK_EQ(r, 36);
    TK_CHECK(holds(e, a, 36));
    TK_OK(feed(e, a, 36, 4, NULL, 0));
    TK_CHECK(holds(e, a, 40));
    /* refused calls leave e as it was */
    TK_RES(kvc_radix_lookup_into_memory(t, NSP, b, 40, other, &r), KVC_ERR_FOREIGN);
    TK_RES(kvc_radix_lookup_into_memory(t, NSP, b, 40, NULL, &r), KVC_ERR_NULL);
    TK_RES(kvc_radix_lookup_into_memory(t, NSP, b, 40, e, NULL), KVC_ERR_NULL);
    TK_RES(kvc_radix_lookup_into_memory(t, NSP, b, -1, e, &r), KVC_ERR_INVALID);
    TK_OK(kvc_memory_begin(e, 1, NULL, 0));
    TK_RES(kvc_radix_lookup_into_memory(t, NSP, b, 40, e, &r), KVC_ERR_STATE);
    TK_OK(kvc_memory_cancel(e));
    TK_CHECK(holds(e, a, 40));
    TK_OK(kvc_radix_commit_memory(t, NSP, e, a, 40, 0));
    TK_OK(kvc_memory_clear(e));
    TK_OK(kvc_memory_offset(e, &off));
    TK_EQ(off, 0);
    TK_EQ(stats_of(t).n_in_use, 0);
    TK_OK(kvc_radix_lookup_into_memory(t, NSP, b, 40, e, &r));
    TK_EQ(r, 16); /* b's state at 39 is not kept either: its last checkpoint, 16 */
    TK_RES(kvc_radix_destroy(t), KVC_ERR_BUSY);
    TK_OK(kvc_radix_release_memory(e));
    TK_OK(kvc_radix_destroy(t));
    TK_OK(kvc_memory_destroy(e));
    TK_OK(kvc_memory_destroy(other));
}

int main(int argc, char **argv) {
    unsigned long long seed = argc > 1 ? strtoull(argv[1], NULL, 10) : (unsigned long long)time(NULL);
    int32_t rounds = (int32_t)(400 * tk_scale());
    if (rounds < 40) rounds = 40;
    if (rounds > 512) rounds = 512; /* the reference's size */
    printf("seed %llu\n", seed);
    test_reuse();
    test_late_checkpoint();
    test_lookup_into();
    test_eviction();
    test_priority();
    test_errors();
    test_begin_refused();
    test_persistence(seed);
    test_load_evicts_nothing();
    test_restore_evicts();
    test_random(seed, rounds, 1 << 20);
    test_random(seed ^ 0x9e3779b97f4a7c15ULL, rounds, 8 * 1024);
    return tk_report("memory_radix");
}
