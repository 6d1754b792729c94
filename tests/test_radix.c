/* test_radix.c - the radix prefix cache (kvc_radix_*): scenarios with exact page counts,
   contents, eviction order and every error path, then a model-based random test.

   K/V values: the value written for the token at position p is a function of the
   whole prefix tokens[0..p] (a hash, as a real model's K/V depend on everything before
   them), reduced to integers in [-1024, 1023] so that f16 stores them exactly. A
   stitched cache that mixes pages of the wrong conversations therefore reads back
   wrong values.

   The random test runs episodes of random operations (lookup + evaluate + generate +
   commit turns, releases, pins, unpins, explicit eviction, unrelated caches that take
   pages and so force eviction under a small budget) on a random pool and tree (FULL or
   ROTATING, max_entries 0/1/2), against a reference that is just the list of committed
   token sequences, the live caches with the path each keeps in use, and the pins:
     - every lookup's reused count is at most the longest common prefix with a committed
       sequence (capped at n - 1), and exactly that while nothing was ever evicted (FULL);
     - a path in use (or pinned, FULL) is found whole: in-use entries survive eviction;
     - every returned cache reads back exactly the K/V committed for those tokens;
     - a KVC_ERR_FULL leaves the tree exactly as it was (all-or-nothing eviction);
     - after teardown the pool holds no page and no object.
   Usage: test_radix [seed [episode]]; the random seed is printed, and a failure prints the
   command that replays its episode. KVC_TEST_SCALE scales the episode count. */
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "count_alloc.h"
#define KVCACHE_IMPLEMENTATION
#include "../kvcache.h"
#include "tk.h"

/* ---- values ------------------------------------------------------------------------ */

#define MAXT 96
#define MAX_ROW 16

typedef struct shape { int32_t layers, heads, hk, hv; } shape;

/* hash of the prefix tokens[0..p] */
static uint32_t prefix_hash(const int32_t *tokens, int32_t p) {
    uint32_t h = 2166136261u;
    int32_t i;
    for (i = 0; i <= p; ++i) h = (h ^ (uint32_t)tokens[i]) * 16777619u;
    return h;
}
static float val(uint32_t h, int kv, int layer, int head, int dim) {
    return (float)((int32_t)((h + (uint32_t)(kv * 523 + layer * 131 + head * 37 + dim * 3)) % 2048u) - 1024);
}

/* Evaluate tokens [from, to) into the cache: kvc_begin + kvc_put of every layer. */
static kvc_result extend(kvc_cache *c, const shape *s, const int32_t *tokens, int32_t from, int32_t to) {
    static float k[MAXT * MAX_ROW], v[MAXT * MAX_ROW];
    int32_t l, p, h, d;
    kvc_result r;
    if (to <= from) return KVC_OK;
    if ((r = kvc_begin(c, to - from, NULL, 0)) != KVC_OK) return r;
    for (l = 0; l < s->layers; ++l) {
        for (p = from; p < to; ++p) {
            uint32_t hash = prefix_hash(tokens, p);
            for (h = 0; h < s->heads; ++h) {
                for (d = 0; d < s->hk; ++d) k[((p - from) * s->heads + h) * s->hk + d] = val(hash, 0, l, h, d);
                for (d = 0; d < s->hv; ++d) v[((p - from) * s->heads + h) * s->hv + d] = val(hash, 1, l, h, d);
            }
        }
        if ((r = kvc_put(c, l, k, v)) != KVC_OK) return r;
    }
    return KVC_OK;
}

/* Every cell the cache shows holds the K/V of tokens at its position; returns the
   number of wrong cells (and counts one check per layer). */
static int check_contents(const kvc_cache *c, const shape *s, const int32_t *tokens) {
    static float k[MAXT * MAX_ROW], v[MAXT * MAX_ROW];
    static int32_t pos[MAXT];
    int32_t l, n, i, h, d, bad = 0;
    for (l = 0; l < s->layers; ++l) {
        TK_OK(kvc_cache_gather(c, l, k, v, pos, MAXT, &n));
        for (i = 0; i < n; ++i) {
            uint32_t hash = prefix_hash(tokens, pos[i]);
            int wrong = 0;
            for (h = 0; h < s->heads; ++h) {
                for (d = 0; d < s->hk; ++d) wrong |= k[(i * s->heads + h) * s->hk + d] != val(hash, 0, l, h, d);
                for (d = 0; d < s->hv; ++d) wrong |= v[(i * s->heads + h) * s->hv + d] != val(hash, 1, l, h, d);
            }
            bad += wrong;
        }
        TK_EQ(bad, 0);
    }
    return bad;
}

static kvc_pool *make_pool(const shape *s, kvc_type tk, kvc_type tv, int32_t page_cells, int32_t pages) {
    kvc_pool_config pc;
    kvc_pool *pool = NULL;
    size_t page_bytes = 0;
    kvc_pool_config_init(&pc);
    pc.n_layers = s->layers;
    pc.n_kv_heads = s->heads;
    pc.head_dim_k = s->hk;
    pc.head_dim_v = s->hv;
    pc.type_k = tk;
    pc.type_v = tv;
    pc.page_cells = page_cells;
    TK_OK(kvc_pool_page_bytes(&pc, &page_bytes));
    pc.budget_bytes = (size_t)pages * page_bytes;
    TK_OK(kvc_pool_create(&pc, &pool));
    return pool;
}

static int32_t pages_used(const kvc_pool *pool) {
    kvc_pool_stats st;
    kvc_pool_stats_get(pool, &st);
    return st.pages_used;
}

static kvc_radix_stats tree_stats(const kvc_radix *t) {
    kvc_radix_stats s;
    memset(&s, 0, sizeof(s));
    TK_OK(kvc_radix_stats_get(t, &s));
    return s;
}

static const kvc_namespace NS = {7, 0};

/* A conversation turn: lookup, evaluate the rest, generate `gen` tokens (the last one
   not evaluated), commit everything. Returns the cache (kept alive) or NULL. */
static kvc_cache *turn(kvc_radix *t, const shape *s, int32_t *tokens, int32_t n, int32_t gen, int32_t *reused) {
    kvc_cache *c = NULL;
    int32_t i;
    TK_OK(kvc_radix_lookup(t, NS, tokens, n, &c, reused));
    if (c == NULL) return NULL;
    TK_OK(extend(c, s, tokens, *reused, n));
    for (i = 0; i < gen; ++i) {
        tokens[n + i] = 500 + i;
        if (i + 1 < gen) TK_OK(extend(c, s, tokens, n + i, n + i + 1));
    }
    TK_OK(kvc_radix_commit(t, NS, c, tokens, n + gen, 0));
    return c;
}

/* ---- scenarios --------------------------------------------------------------------- */

/* Two conversations share a 10-token system prompt (page size 4): the second one's
   lookup stitches the first one's pages, its divergence inside page 2 copies only that
   page, and every cache reads back its own tokens. */
static void test_sharing(kvc_type type) {
    shape s = {2, 2, 4, 3};
    kvc_pool *pool = make_pool(&s, type, type, 4, 64);
    kvc_radix_config rc;
    kvc_radix *t = NULL;
    kvc_cache *a, *b, *c = NULL;
    int32_t ta[MAXT], tb[MAXT], i, reused = -1, n_pages = -1;
    kvc_radix_stats st;
    TK_OK(kvc_radix_config_init(&rc, KVC_KIND_FULL));
    TK_OK(kvc_radix_create(pool, &rc, &t));
    for (i = 0; i < 10; ++i) ta[i] = tb[i] = 100 + i;  /* the shared system prompt */
    ta[10] = 1; ta[11] = 2;                              /* conversation A's user turn */
    a = turn(t, &s, ta, 12, 3, &reused);                 /* holds 14 tokens: 4 pages */
    TK_EQ(reused, 0);
    TK_EQ(pages_used(pool), 4);
    st = tree_stats(t);
    TK_EQ(st.n_nodes, 1);
    TK_EQ(st.n_pages, 4);
    TK_EQ(st.n_in_use, 1);
    tb[10] = 9; tb[11] = 8; tb[12] = 7;
    TK_OK(kvc_radix_lookup(t, NS, tb, 13, &b, &reused));
    TK_EQ(reused, 10);                                   /* the system prompt */
    TK_EQ(pages_used(pool), 4);                          /* nothing copied */
    TK_OK(kvc_cache_pages(b, &n_pages));
    TK_EQ(n_pages, 3);                                   /* tokens 0..9: pages 0, 1, 2 */
    check_contents(b, &s, tb);
    TK_OK(extend(b, &s, tb, 10, 13));                    /* copies page 2, takes page 3 */
    TK_EQ(pages_used(pool), 6);
    check_contents(b, &s, tb);
    check_contents(a, &s, ta);
    TK_OK(kvc_radix_commit(t, NS, b, tb, 13, 0));        /* splits A's node at 10 */
    st = tree_stats(t);
    TK_EQ(st.n_nodes, 3);
    TK_EQ(st.n_entries, 2);
    TK_EQ(st.n_pages, 6);                                /* A's 4 + B's copy of page 2 + page 3 */
    TK_EQ(st.n_in_use, 2);
    /* a third conversation finds each branch whole */
    TK_OK(kvc_radix_lookup(t, NS, tb, 13, &c, &reused));
    TK_EQ(reused, 12);                                   /* exact hit: one token left */
    check_contents(c, &s, tb);
    TK_OK(kvc_cache_destroy(c));
    TK_OK(kvc_radix_lookup(t, NS, ta, 15, &c, &reused));
    TK_EQ(reused, 14);
    check_contents(c, &s, ta);
    TK_OK(kvc_cache_destroy(c));
    st = tree_stats(t);
    TK_EQ(st.lookups, 4);
    TK_EQ(st.tokens_queried, 12 + 13 + 13 + 15);
    TK_EQ(st.tokens_hit, 0 + 10 + 12 + 14);
    TK_EQ(st.commits, 2);
    TK_RES(kvc_radix_destroy(t), KVC_ERR_BUSY);          /* a and b hold entries */
    TK_RES(kvc_pool_destroy(pool), KVC_ERR_BUSY);
    TK_OK(kvc_cache_destroy(a));
    TK_OK(kvc_radix_release(b));
    TK_EQ(tree_stats(t).n_in_use, 0);
    TK_OK(kvc_radix_destroy(t));
    check_contents(b, &s, tb);                           /* b keeps its pages */
    TK_OK(kvc_cache_destroy(b));
    TK_EQ(pages_used(pool), 0);
    TK_OK(kvc_pool_destroy(pool));
}

/* A divergence exactly at a page boundary shares every page; the tree dedups tokens a
   cache evaluated itself; a commit of fewer tokens than an entry holds adds nothing. */
static void test_dedup(void) {
    shape s = {1, 1, 2, 2};
    kvc_pool *pool = make_pool(&s, KVC_TYPE_F32, KVC_TYPE_F32, 4, 32);
    kvc_radix_config rc;
    kvc_radix *t = NULL;
    kvc_cache *a, *b = NULL, *own = NULL;
    kvc_cache_config cc;
    int32_t ta[MAXT], tb[MAXT], i, reused;
    kvc_radix_config_init(&rc, KVC_KIND_FULL);
    TK_OK(kvc_radix_create(pool, &rc, &t));
    for (i = 0; i < 12; ++i) ta[i] = tb[i] = i;
    a = turn(t, &s, ta, 12, 1, &reused);                 /* 12 tokens, 3 pages */
    TK_EQ(pages_used(pool), 3);
    /* a cache that evaluated 8 shared tokens itself: commit keeps the tree's pages */
    kvc_cache_config_init(&cc, KVC_KIND_FULL);
    TK_OK(kvc_cache_create(pool, &cc, &own));
    tb[8] = 50; tb[9] = 51;
    TK_OK(extend(own, &s, tb, 0, 10));
    TK_EQ(pages_used(pool), 6);
    TK_OK(kvc_radix_commit(t, NS, own, tb, 10, 0));
    TK_EQ(tree_stats(t).n_pages, 4);                     /* 3 + own's page 2 (tokens 8, 9) */
    TK_OK(kvc_cache_destroy(own));
    TK_EQ(pages_used(pool), 4);
    TK_OK(kvc_radix_lookup(t, NS, tb, 11, &b, &reused));
    TK_EQ(reused, 10);
    check_contents(b, &s, tb);
    /* commit of a prefix the tree holds: nothing new */
    TK_OK(kvc_radix_commit(t, NS, b, tb, 6, 0));
    TK_EQ(tree_stats(t).n_nodes, 3);
    TK_EQ(tree_stats(t).n_pages, 4);
    TK_OK(kvc_cache_destroy(b));
    TK_OK(kvc_cache_destroy(a));
    TK_OK(kvc_radix_destroy(t));
    TK_EQ(pages_used(pool), 0);
    TK_OK(kvc_pool_destroy(pool));
}

/* LRU eviction under pool pressure: unreferenced leaves go oldest first; pinned and
   in-use entries stay; an allocation that cannot succeed evicts nothing. */
static void test_eviction(void) {
    shape s = {1, 1, 2, 2};
    kvc_pool *pool = make_pool(&s, KVC_TYPE_F32, KVC_TYPE_F32, 4, 12);
    kvc_radix_config rc;
    kvc_radix *t = NULL;
    kvc_cache *c, *hog = NULL, *user = NULL;
    kvc_cache_config cc;
    int32_t tok[4][MAXT], i, j, reused, freed;
    kvc_radix_stats st;
    kvc_radix_config_init(&rc, KVC_KIND_FULL);
    TK_OK(kvc_radix_create(pool, &rc, &t));
    for (j = 0; j < 4; ++j) { /* four entries of 8 tokens (2 pages each), distinct first tokens */
        for (i = 0; i < 8; ++i) tok[j][i] = 10 * j + i;
        c = turn(t, &s, tok[j], 8, 1, &reused);
        TK_OK(kvc_cache_destroy(c));
    }
    TK_EQ(pages_used(pool), 8);
    TK_OK(kvc_radix_pin(t, NS, tok[1], 8));               /* entry 1 pinned */
    TK_OK(kvc_radix_lookup(t, NS, tok[2], 8, &user, &reused)); /* entry 2 in use */
    TK_EQ(reused, 7);
    TK_OK(kvc_radix_lookup(t, NS, tok[0], 8, &c, &reused));   /* touch entry 0: 3 is LRU */
    TK_OK(kvc_cache_destroy(c));
    /* an unrelated cache needs 6 pages: 4 free, so the LRU entry (3) goes */
    kvc_cache_config_init(&cc, KVC_KIND_FULL);
    TK_OK(kvc_cache_create(pool, &cc, &hog));
    TK_OK(extend(hog, &s, tok[3], 0, 8));
    TK_OK(extend(hog, &s, tok[3], 0, 8)); /* hog's values are not checked */
    TK_OK(extend(hog, &s, tok[3], 0, 8));
    st = tree_stats(t);
    TK_EQ(st.entries_evicted, 1);
    TK_EQ(st.pages_evicted, 2);
    TK_EQ(st.n_entries, 3);
    TK_OK(kvc_radix_lookup(t, NS, tok[3], 8, &c, &reused));
    TK_EQ(reused, 0);
    TK_OK(kvc_cache_destroy(c));
    /* 6 more pages: only entry 0 (2 pages) is evictable: FULL, nothing evicted */
    TK_EQ(pages_used(pool), 12);
    TK_RES(kvc_begin(hog, 24, NULL, 0), KVC_ERR_FULL);
    st = tree_stats(t);
    TK_EQ(st.entries_evicted, 1);
    TK_EQ(st.n_entries, 3);
    /* 2 pages: entry 0 goes; pinned 1 and in-use 2 stay */
    TK_OK(kvc_begin(hog, 8, NULL, 0));
    TK_OK(kvc_cancel(hog));
    TK_EQ(tree_stats(t).entries_evicted, 2);
    TK_OK(kvc_radix_lookup(t, NS, tok[1], 8, &c, &reused));
    TK_EQ(reused, 7);
    check_contents(c, &s, tok[1]);
    TK_OK(kvc_cache_destroy(c));
    TK_OK(kvc_radix_lookup(t, NS, tok[2], 8, &c, &reused));
    TK_EQ(reused, 7);
    check_contents(c, &s, tok[2]);
    TK_OK(kvc_cache_destroy(c));
    /* explicit eviction: nothing evictable while pinned and in use */
    TK_OK(kvc_radix_evict(t, 100, &freed));
    TK_EQ(freed, 0);
    TK_OK(kvc_radix_unpin(t, NS, tok[1], 8));
    TK_RES(kvc_radix_unpin(t, NS, tok[1], 8), KVC_ERR_NOT_FOUND);
    TK_OK(kvc_radix_evict(t, 100, &freed));
    TK_EQ(freed, 2);
    TK_OK(kvc_cache_destroy(user));                       /* entry 2 no longer in use */
    TK_OK(kvc_radix_evict(t, 1, NULL));
    st = tree_stats(t);
    TK_EQ(st.n_nodes, 0);
    TK_EQ(st.n_pages, 0);
    TK_EQ(st.entries_evicted, 4);
    TK_OK(kvc_cache_destroy(hog));
    TK_OK(kvc_radix_destroy(t));
    TK_EQ(pages_used(pool), 0);
    TK_OK(kvc_pool_destroy(pool));
}

/* A pin on part of an entry splits it: the pinned system prompt stays, the rest of the
   conversation can go. */
static void test_pin_prefix(void) {
    shape s = {1, 1, 2, 2};
    kvc_pool *pool = make_pool(&s, KVC_TYPE_F16, KVC_TYPE_F32, 4, 32);
    kvc_radix_config rc;
    kvc_radix *t = NULL;
    kvc_cache *c;
    int32_t tok[MAXT], i, reused, freed;
    kvc_radix_config_init(&rc, KVC_KIND_FULL);
    TK_OK(kvc_radix_create(pool, &rc, &t));
    for (i = 0; i < 20; ++i) tok[i] = i;
    c = turn(t, &s, tok, 20, 1, &reused);
    TK_OK(kvc_cache_destroy(c));
    TK_RES(kvc_radix_pin(t, NS, tok, 21), KVC_ERR_NOT_FOUND);
    TK_OK(kvc_radix_pin(t, NS, tok, 6));                  /* inside page 1: shared by both halves */
    TK_EQ(tree_stats(t).n_nodes, 2);
    TK_EQ(tree_stats(t).n_pages, 5);
    TK_EQ(tree_stats(t).n_pinned, 1);
    TK_RES(kvc_radix_unpin(t, NS, tok, 5), KVC_ERR_NOT_FOUND); /* no entry ends there */
    TK_OK(kvc_radix_evict(t, 100, &freed));
    TK_EQ(freed, 3);                                      /* pages 2, 3, 4; page 1 stays */
    TK_EQ(pages_used(pool), 2);
    TK_OK(kvc_radix_lookup(t, NS, tok, 20, &c, &reused));
    TK_EQ(reused, 6);
    check_contents(c, &s, tok);
    TK_OK(kvc_cache_destroy(c));
    TK_OK(kvc_radix_destroy(t));                          /* pins do not block destroy */
    TK_EQ(pages_used(pool), 0);
    TK_OK(kvc_pool_destroy(pool));
}

/* Namespaces: the same tokens under another model or tenant never match. */
static void test_namespaces(void) {
    shape s = {1, 1, 2, 2};
    kvc_pool *pool = make_pool(&s, KVC_TYPE_F32, KVC_TYPE_F32, 4, 32);
    kvc_radix_config rc;
    kvc_radix *t = NULL;
    kvc_cache *c, *d;
    kvc_namespace other_model = {8, 0}, other_tenant = {7, 1};
    int32_t tok[MAXT], i, reused;
    kvc_radix_config_init(&rc, KVC_KIND_FULL);
    TK_OK(kvc_radix_create(pool, &rc, &t));
    for (i = 0; i < 9; ++i) tok[i] = i;
    c = turn(t, &s, tok, 9, 2, &reused);
    TK_OK(kvc_radix_lookup(t, other_model, tok, 9, &d, &reused));
    TK_EQ(reused, 0);
    TK_OK(kvc_cache_destroy(d));
    TK_OK(kvc_radix_lookup(t, other_tenant, tok, 9, &d, &reused));
    TK_EQ(reused, 0);
    TK_OK(kvc_cache_destroy(d));
    TK_RES(kvc_radix_pin(t, other_model, tok, 3), KVC_ERR_NOT_FOUND);
    TK_OK(kvc_radix_lookup(t, NS, tok, 9, &d, &reused));
    TK_EQ(reused, 8);
    /* the same tokens committed under the tenant's key make a separate entry */
    TK_OK(kvc_radix_commit(t, other_tenant, d, tok, 9, 0));
    TK_EQ(tree_stats(t).n_entries, 2);
    TK_EQ(tree_stats(t).n_pages, 3);                      /* both share d's pages */
    TK_OK(kvc_cache_destroy(d));
    TK_OK(kvc_cache_destroy(c));
    TK_OK(kvc_radix_destroy(t));
    TK_OK(kvc_pool_destroy(pool));
}

/* ROTATING: window 6 with 2 sinks, pages of 2. A conversation of 20 tokens keeps only
   the sinks and its window; a lookup of its first 9 tokens + something else finds 9
   tokens matching but no window there, so it shortens to what is whole. */
static void test_rotating(void) {
    shape s = {2, 1, 3, 2};
    kvc_pool *pool = make_pool(&s, KVC_TYPE_F32, KVC_TYPE_F16, 2, 64);
    kvc_radix_config rc;
    kvc_radix *t = NULL;
    kvc_cache *a, *c = NULL;
    int32_t tok[MAXT], other[MAXT], i, reused, off = -1, can = -1;
    kvc_radix_config_init(&rc, KVC_KIND_ROTATING);
    rc.cache.window = 6;
    rc.cache.sinks = 2;
    TK_OK(kvc_radix_create(pool, &rc, &t));
    for (i = 0; i < 20; ++i) tok[i] = other[i] = i;
    other[9] = 99;
    TK_OK(kvc_radix_lookup(t, NS, tok, 20, &a, &reused));
    for (i = 0; i < 20; ++i) TK_OK(extend(a, &s, tok, i, i + 1)); /* decode-like: the window slides */
    TK_OK(kvc_radix_commit(t, NS, a, tok, 21, 0));       /* 20 tokens held */
    TK_OK(kvc_cache_pages(a, &off));
    TK_EQ(off, 3);                                       /* sink page 0 + window pages 8, 9 */
    TK_EQ(tree_stats(t).n_pages, 3);
    /* continuing the conversation: the window for 20 is whole */
    tok[20] = 77;
    TK_OK(kvc_radix_lookup(t, NS, tok, 21, &c, &reused));
    TK_EQ(reused, 20);
    TK_OK(kvc_cache_offset(c, &off));
    TK_EQ(off, 20);
    TK_OK(kvc_cache_can_trim(c, &can));
    TK_EQ(can, 0);                                       /* wrapped */
    check_contents(c, &s, tok);
    TK_OK(extend(c, &s, tok, 20, 21));
    check_contents(c, &s, tok);
    TK_OK(kvc_cache_destroy(c));
    /* diverging at 9: pages 2..4 are gone; only tokens 0..3 (sinks + page 1) remain whole */
    TK_OK(kvc_radix_lookup(t, NS, other, 12, &c, &reused));
    TK_EQ(reused, 2);
    TK_OK(kvc_cache_can_trim(c, &can));
    TK_EQ(can, 1);
    check_contents(c, &s, other);
    TK_OK(extend(c, &s, other, 2, 12));
    check_contents(c, &s, other);
    /* committing the new branch fills the path's missing pages from this cache where
       it still holds them (page 4: tokens 8, 9 are the branch's own after the split) */
    TK_OK(kvc_radix_commit(t, NS, c, other, 12, 0));
    TK_OK(kvc_cache_destroy(c));
    TK_OK(kvc_radix_lookup(t, NS, other, 12, &c, &reused));
    TK_EQ(reused, 11);
    check_contents(c, &s, other);
    TK_OK(kvc_cache_destroy(c));
    TK_OK(kvc_cache_destroy(a));
    TK_OK(kvc_radix_destroy(t));
    TK_EQ(pages_used(pool), 0);
    TK_OK(kvc_pool_destroy(pool));
}

/* ROTATING paths longer than the pool: window 2, pages of 1, a budget of 6 pages. A
   conversation of 40 tokens slides through the pool (its window releases pages), so the
   tree's path spans 40 logical pages of which it holds only the last ones. A lookup of
   it needs only its window's pages; it used to fill a scratch table indexed by logical
   page, sized by the pool's page count, and wrote past it (found by fuzz_radix). */
static void test_rotating_long(void) {
    shape s = {1, 1, 2, 2};
    kvc_pool *pool = make_pool(&s, KVC_TYPE_F32, KVC_TYPE_F32, 1, 6);
    kvc_radix_config rc;
    kvc_radix *t = NULL;
    kvc_cache *a = NULL, *c = NULL;
    int32_t tok[MAXT], i, reused = -1;
    kvc_radix_config_init(&rc, KVC_KIND_ROTATING);
    rc.cache.window = 2;
    TK_OK(kvc_radix_create(pool, &rc, &t));
    for (i = 0; i < 41; ++i) tok[i] = i % 3;
    TK_OK(kvc_radix_lookup(t, NS, tok, 40, &a, &reused));
    for (i = 0; i < 40; ++i) TK_OK(extend(a, &s, tok, i, i + 1));
    TK_OK(kvc_radix_commit(t, NS, a, tok, 40, 0));
    TK_OK(kvc_cache_destroy(a));
    TK_OK(kvc_radix_lookup(t, NS, tok, 41, &c, &reused));
    TK_EQ(reused, 40);
    check_contents(c, &s, tok);
    TK_OK(extend(c, &s, tok, 40, 41));
    check_contents(c, &s, tok);
    TK_OK(kvc_cache_destroy(c));
    TK_OK(kvc_radix_lookup(t, NS, tok, 30, &c, &reused)); /* its window is gone: a miss */
    TK_EQ(reused, 0);
    TK_OK(kvc_cache_destroy(c));
    TK_OK(kvc_radix_destroy(t));
    TK_EQ(pages_used(pool), 0);
    TK_OK(kvc_pool_destroy(pool));
}

/* max_entries = 1 is the single entry of ollama's MLX runner: a stream of requests reuses exactly what
   kvc_prefix (the in-place single entry) reuses. */
static void test_single_entry(unsigned long long seed) {
    shape s = {1, 1, 2, 2};
    kvc_pool *pool = make_pool(&s, KVC_TYPE_F32, KVC_TYPE_F32, 3, 200);
    kvc_radix_config rc;
    kvc_radix *t = NULL;
    kvc_cache *in_place = NULL, *c;
    kvc_cache_config cc;
    kvc_prefix *px = NULL;
    tk_rng rng;
    int32_t prev[MAXT], tok[MAXT], n_prev = 0, req, i;
    rng.s = seed ^ 0x51ull;
    kvc_radix_config_init(&rc, KVC_KIND_FULL);
    rc.max_entries = 1;
    TK_OK(kvc_radix_create(pool, &rc, &t));
    kvc_cache_config_init(&cc, KVC_KIND_FULL);
    TK_OK(kvc_cache_create(pool, &cc, &in_place));
    TK_OK(kvc_prefix_create(&in_place, 1, MAXT, &px));
    for (req = 0; req < 60; ++req) {
        int32_t n = tk_int(&rng, 1, 30), gen = tk_int(&rng, 0, 3), keep = n_prev ? tk_int(&rng, 0, n_prev) : 0;
        int32_t reused_a, reused_b;
        for (i = 0; i < n; ++i) tok[i] = i < keep ? prev[i] : tk_int(&rng, 0, 3);
        TK_OK(kvc_prefix_begin(px, tok, n, &reused_a));
        TK_OK(extend(in_place, &s, tok, reused_a, n));
        for (i = 0; i < gen; ++i) {
            tok[n + i] = tk_int(&rng, 0, 3);
            if (i + 1 < gen) TK_OK(extend(in_place, &s, tok, n + i, n + i + 1));
        }
        TK_OK(kvc_prefix_close(px, tok + n, gen));
        tok[n + gen] = 0;
        c = NULL;
        TK_OK(kvc_radix_lookup(t, NS, tok, n, &c, &reused_b));
        TK_EQ(reused_b, reused_a);
        TK_OK(extend(c, &s, tok, reused_b, n + (gen > 0 ? gen - 1 : 0)));
        check_contents(c, &s, tok);
        TK_OK(kvc_radix_commit(t, NS, c, tok, n + gen, 0));
        TK_OK(kvc_cache_destroy(c));
        TK_EQ(tree_stats(t).n_entries, 1);
        memcpy(prev, tok, sizeof(int32_t) * (size_t)(n + gen));
        n_prev = n + gen;
    }
    TK_OK(kvc_prefix_destroy(px));
    TK_OK(kvc_cache_destroy(in_place));
    TK_OK(kvc_radix_destroy(t));
    TK_EQ(pages_used(pool), 0);
    TK_OK(kvc_pool_destroy(pool));
}

/* A cache from a lookup that ends inside a page needs one page for its copy-on-write
   when the pool is full: kvc_begin evicts another entry to get it. */
static void test_cow_reclaim(void) {
    shape s = {1, 1, 2, 2};
    kvc_pool *pool = make_pool(&s, KVC_TYPE_F32, KVC_TYPE_F32, 4, 4);
    kvc_radix_config rc;
    kvc_radix *t = NULL;
    kvc_cache *c;
    int32_t a[MAXT], b[MAXT], i, reused;
    kvc_radix_config_init(&rc, KVC_KIND_FULL);
    TK_OK(kvc_radix_create(pool, &rc, &t));
    for (i = 0; i < 8; ++i) { a[i] = i; b[i] = 40 + i; }
    c = turn(t, &s, a, 6, 1, &reused);    /* 6 tokens: 2 pages */
    TK_OK(kvc_cache_destroy(c));
    c = turn(t, &s, b, 8, 1, &reused);    /* 8 tokens: 2 pages; the pool is full */
    TK_OK(kvc_cache_destroy(c));
    TK_EQ(pages_used(pool), 4);
    a[6] = 60;
    TK_OK(kvc_radix_lookup(t, NS, a, 7, &c, &reused));
    TK_EQ(reused, 6);
    TK_OK(extend(c, &s, a, 6, 7));        /* page 1 is shared: copy it after evicting b */
    TK_EQ(tree_stats(t).entries_evicted, 1);
    check_contents(c, &s, a);
    TK_OK(kvc_cache_destroy(c));
    TK_OK(kvc_radix_destroy(t));
    TK_EQ(pages_used(pool), 0);
    TK_OK(kvc_pool_destroy(pool));
}

/* Every allocation of pages evicts unused entries first (issue 23): a sequence snapshot
   and a merge that need a fresh page while the tree holds the rest of the pool. */
static void fill_tree(kvc_radix *t, const shape *s, int32_t first, int32_t n) {
    int32_t tok[MAXT], i, reused;
    kvc_cache *c;
    for (i = 0; i < n; ++i) tok[i] = first + i;
    c = turn(t, s, tok, n, 1, &reused);
    if (c != NULL) TK_OK(kvc_cache_destroy(c));
}

static void test_evicting_allocations(void) {
    shape s = {1, 1, 2, 2};
    kvc_radix_config rc;
    kvc_radix *t = NULL;
    kvc_pool *pool = make_pool(&s, KVC_TYPE_F32, KVC_TYPE_F32, 4, 4);
    kvc_cache_config cc;
    kvc_cache *causal = NULL, *x = NULL;
    kvc_snapshot *snap = NULL, *parent = NULL, *child = NULL, *merged = NULL;
    int32_t tok[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    kvc_radix_config_init(&rc, KVC_KIND_FULL);
    /* kvc_seq_snapshot: a CAUSAL cache of one page, the tree the other three */
    kvc_cache_config_init(&cc, KVC_KIND_CAUSAL);
    cc.capacity = 4;
    cc.max_seqs = 2;
    TK_OK(kvc_cache_create(pool, &cc, &causal));
    TK_OK(kvc_radix_create(pool, &rc, &t));
    fill_tree(t, &s, 100, 8);
    fill_tree(t, &s, 200, 4);
    TK_EQ(pages_used(pool), 4);
    {
        int32_t pos[2] = {0, 1}, seq[2] = {0, 0};
        kvc_batch b;
        float k[4] = {1, 2, 3, 4}, v[4] = {5, 6, 7, 8};
        b.n_tokens = 2; b.pos = pos; b.seq = seq; b.non_causal = NULL;
        TK_OK(kvc_begin_batch(causal, &b));
        TK_OK(kvc_put(causal, 0, k, v));
    }
    TK_OK(kvc_seq_snapshot(causal, 0, &snap)); /* before: KVC_ERR_FULL */
    TK_EQ(tree_stats(t).entries_evicted, 1);
    if (snap != NULL) TK_OK(kvc_snapshot_free(snap));
    TK_OK(kvc_cache_destroy(causal));
    TK_OK(kvc_radix_destroy(t));
    TK_EQ(pages_used(pool), 0);
    TK_OK(kvc_pool_destroy(pool));

    /* kvc_snapshot_merge: parent [0,2) and child [2,4) on two copies of page 0 */
    pool = make_pool(&s, KVC_TYPE_F32, KVC_TYPE_F32, 4, 8);
    kvc_cache_config_init(&cc, KVC_KIND_FULL);
    TK_OK(kvc_cache_create(pool, &cc, &x));
    TK_OK(extend(x, &s, tok, 0, 2));
    TK_OK(kvc_snapshot_take(x, 0, KVC_POS_END, &parent));
    TK_OK(extend(x, &s, tok, 2, 4)); /* copy-on-write of page 0 */
    TK_OK(kvc_snapshot_take(x, 2, KVC_POS_END, &child));
    TK_OK(kvc_radix_create(pool, &rc, &t));
    fill_tree(t, &s, 100, 12);
    fill_tree(t, &s, 200, 12);
    TK_EQ(pages_used(pool), 8);
    TK_OK(kvc_snapshot_merge(x, parent, child, &merged)); /* before: KVC_ERR_FULL */
    TK_EQ(tree_stats(t).entries_evicted, 1);
    if (merged != NULL) {
        TK_OK(kvc_cache_restore(x, merged, 4));
        check_contents(x, &s, tok);
        TK_OK(kvc_snapshot_free(merged));
    } else {
        kvc_snapshot_free(parent);
        kvc_snapshot_free(child);
    }
    TK_OK(kvc_cache_destroy(x));
    TK_OK(kvc_radix_destroy(t));
    TK_EQ(pages_used(pool), 0);
    TK_OK(kvc_pool_destroy(pool));
}

/* Every bad argument: an error and nothing changed. */
static void test_errors(void) {
    shape s = {1, 1, 2, 2};
    kvc_pool *pool = make_pool(&s, KVC_TYPE_F32, KVC_TYPE_F32, 4, 16), *other = make_pool(&s, KVC_TYPE_F32, KVC_TYPE_F32, 4, 4);
    kvc_radix_config rc, bad;
    kvc_radix *t = NULL, *t2 = NULL;
    kvc_cache *c = NULL, *foreign = NULL, *rot = NULL, *causal = NULL;
    kvc_cache_config cc;
    kvc_radix_stats before;
    int32_t tok[MAXT], i, reused = -5;
    for (i = 0; i < 10; ++i) tok[i] = i;
    TK_RES(kvc_radix_config_init(NULL, KVC_KIND_FULL), KVC_ERR_NULL);
    kvc_radix_config_init(&rc, KVC_KIND_FULL);
    TK_RES(kvc_radix_create(NULL, &rc, &t), KVC_ERR_NULL);
    TK_RES(kvc_radix_create(pool, NULL, &t), KVC_ERR_NULL);
    TK_RES(kvc_radix_create(pool, &rc, NULL), KVC_ERR_NULL);
    bad = rc; bad.max_entries = -1;
    TK_RES(kvc_radix_create(pool, &bad, &t), KVC_ERR_INVALID);
    bad = rc; bad.cache.window = 3;
    TK_RES(kvc_radix_create(pool, &bad, &t), KVC_ERR_INVALID);
    kvc_radix_config_init(&bad, KVC_KIND_ROTATING);
    TK_RES(kvc_radix_create(pool, &bad, &t), KVC_ERR_INVALID);          /* window 0 */
    bad.cache.window = 4; bad.cache.sinks = 4;
    TK_RES(kvc_radix_create(pool, &bad, &t), KVC_ERR_INVALID);          /* sinks >= window */
    kvc_radix_config_init(&bad, KVC_KIND_CAUSAL);
    TK_RES(kvc_radix_create(pool, &bad, &t), KVC_ERR_UNSUPPORTED);
    kvc_radix_config_init(&bad, (kvc_kind)7);
    TK_RES(kvc_radix_create(pool, &bad, &t), KVC_ERR_INVALID);
    TK_EQ(t == NULL, 1);
    TK_OK(kvc_radix_create(pool, &rc, &t));
    c = turn(t, &s, tok, 6, 1, &reused);
    before = tree_stats(t);
    /* lookup */
    TK_RES(kvc_radix_lookup(NULL, NS, tok, 3, &c, &reused), KVC_ERR_NULL);
    TK_RES(kvc_radix_lookup(t, NS, NULL, 3, &foreign, &reused), KVC_ERR_NULL);
    TK_RES(kvc_radix_lookup(t, NS, tok, 3, NULL, &reused), KVC_ERR_NULL);
    TK_RES(kvc_radix_lookup(t, NS, tok, 3, &foreign, NULL), KVC_ERR_NULL);
    TK_RES(kvc_radix_lookup(t, NS, tok, -1, &foreign, &reused), KVC_ERR_INVALID);
    TK_EQ(foreign == NULL, 1);
    {   /* an empty prompt is a request that reuses nothing (tokens may be NULL) */
        kvc_cache *empty = NULL;
        int32_t off = -1;
        reused = -1;
        TK_OK(kvc_radix_lookup(t, NS, NULL, 0, &empty, &reused));
        TK_EQ(reused, 0);
        TK_OK(kvc_cache_offset(empty, &off));
        TK_EQ(off, 0);
        TK_EQ(tree_stats(t).n_in_use, before.n_in_use);
        TK_OK(kvc_cache_destroy(empty));
        before = tree_stats(t);
    }
    /* commit */
    TK_RES(kvc_radix_commit(NULL, NS, c, tok, 6, 0), KVC_ERR_NULL);
    TK_RES(kvc_radix_commit(t, NS, NULL, tok, 6, 0), KVC_ERR_NULL);
    TK_RES(kvc_radix_commit(t, NS, c, NULL, 6, 0), KVC_ERR_NULL);
    TK_RES(kvc_radix_commit(t, NS, c, tok, -1, 0), KVC_ERR_INVALID);
    kvc_cache_config_init(&cc, KVC_KIND_FULL);
    TK_OK(kvc_cache_create(other, &cc, &foreign));
    TK_OK(extend(foreign, &s, tok, 0, 3));
    TK_RES(kvc_radix_commit(t, NS, foreign, tok, 3, 0), KVC_ERR_FOREIGN);
    kvc_cache_config_init(&cc, KVC_KIND_ROTATING);
    cc.window = 4;
    TK_OK(kvc_cache_create(pool, &cc, &rot));
    TK_OK(extend(rot, &s, tok, 0, 3));
    TK_RES(kvc_radix_commit(t, NS, rot, tok, 3, 0), KVC_ERR_INVALID);  /* not the tree's kind */
    kvc_cache_config_init(&cc, KVC_KIND_CAUSAL);
    cc.capacity = 4;
    TK_OK(kvc_cache_create(pool, &cc, &causal));
    TK_RES(kvc_radix_commit(t, NS, causal, tok, 0, 0), KVC_ERR_INVALID);
    TK_OK(kvc_begin(c, 1, NULL, 0));
    TK_RES(kvc_radix_commit(t, NS, c, tok, 7, 0), KVC_ERR_STATE);      /* batch open */
    TK_OK(kvc_cancel(c));
    /* pin / unpin / evict / stats / release / destroy */
    TK_RES(kvc_radix_pin(NULL, NS, tok, 3), KVC_ERR_NULL);
    TK_RES(kvc_radix_pin(t, NS, NULL, 3), KVC_ERR_NULL);
    TK_RES(kvc_radix_pin(t, NS, tok, 0), KVC_ERR_INVALID);
    TK_RES(kvc_radix_pin(t, NS, tok, 7), KVC_ERR_NOT_FOUND);
    TK_RES(kvc_radix_unpin(NULL, NS, tok, 3), KVC_ERR_NULL);
    TK_RES(kvc_radix_unpin(t, NS, NULL, 3), KVC_ERR_NULL);
    TK_RES(kvc_radix_unpin(t, NS, tok, 0), KVC_ERR_INVALID);
    TK_RES(kvc_radix_unpin(t, NS, tok, 6), KVC_ERR_NOT_FOUND);         /* never pinned */
    TK_RES(kvc_radix_evict(NULL, 1, NULL), KVC_ERR_NULL);
    TK_RES(kvc_radix_evict(t, -1, NULL), KVC_ERR_INVALID);
    TK_RES(kvc_radix_stats_get(NULL, &before), KVC_ERR_NULL);
    TK_RES(kvc_radix_stats_get(t, NULL), KVC_ERR_NULL);
    TK_RES(kvc_radix_release(NULL), KVC_ERR_NULL);
    TK_OK(kvc_radix_release(rot));                                      /* holds nothing: fine */
    TK_RES(kvc_radix_destroy(NULL), KVC_ERR_NULL);
    TK_RES(kvc_radix_destroy(t), KVC_ERR_BUSY);
    {
        kvc_radix_stats after = tree_stats(t);
        TK_EQ(after.n_nodes, before.n_nodes);
        TK_EQ(after.n_pages, before.n_pages);
        TK_EQ(after.commits, before.commits);
        TK_EQ(after.lookups, before.lookups);
        TK_EQ(after.n_in_use, before.n_in_use);
    }
    /* two trees on one pool: both give pages back; destroy in any order */
    TK_OK(kvc_radix_create(pool, &rc, &t2));
    TK_OK(kvc_radix_commit(t2, NS, c, tok, 6, 0));                      /* moves c's entry to t2 */
    TK_EQ(tree_stats(t).n_in_use, 0);
    TK_EQ(tree_stats(t2).n_in_use, 1);
    TK_OK(kvc_radix_destroy(t));
    TK_OK(kvc_cache_destroy(c));
    TK_OK(kvc_radix_destroy(t2));
    TK_OK(kvc_cache_destroy(foreign));
    TK_OK(kvc_cache_destroy(rot));
    TK_OK(kvc_cache_destroy(causal));
    TK_EQ(pages_used(pool), 0);
    TK_OK(kvc_pool_destroy(pool));
    TK_OK(kvc_pool_destroy(other));
}

/* Allocation failures: every failing allocation of a lookup, a commit with a split or a
   pin with a split returns KVC_ERR_NO_MEMORY and changes nothing. In arena mode the tree
   allocates nothing. */
static void test_alloc_failures(void) {
    shape s = {1, 1, 2, 2};
    kvc_pool *pool = make_pool(&s, KVC_TYPE_F32, KVC_TYPE_F32, 4, 32);
    kvc_radix_config rc;
    kvc_radix *t = NULL;
    kvc_cache *a, *b = NULL, *c;
    int32_t ta[MAXT], tb[MAXT], i, reused, fail;
    kvc_radix_config_init(&rc, KVC_KIND_FULL);
    TK_OK(kvc_radix_create(pool, &rc, &t));
    for (i = 0; i < 12; ++i) ta[i] = tb[i] = i;
    tb[6] = 66;
    a = turn(t, &s, ta, 12, 1, &reused);
    TK_OK(kvc_radix_lookup(t, NS, tb, 10, &b, &reused));
    TK_OK(extend(b, &s, tb, reused, 10));
    for (fail = 0; fail < 3; ++fail) { /* the commit allocates a head (split) and a leaf */
        kvc_radix_stats st0 = tree_stats(t), st1;
        int32_t used = pages_used(pool);
        kvc_result r;
        tk_fail_after = fail;
        r = kvc_radix_commit(t, NS, b, tb, 10, 0);
        tk_fail_after = -1;
        st1 = tree_stats(t);
        if (fail < 2) {
            TK_RES(r, KVC_ERR_NO_MEMORY);
            TK_EQ(st1.n_nodes, st0.n_nodes);
            TK_EQ(st1.n_pages, st0.n_pages);
            TK_EQ(st1.commits, st0.commits);
            TK_EQ(pages_used(pool), used);
        } else {
            TK_OK(r);
            TK_EQ(st1.n_nodes, 3);
        }
    }
    tk_fail_after = 0;
    TK_RES(kvc_radix_lookup(t, NS, ta, 5, &c, &reused), KVC_ERR_NO_MEMORY);
    TK_RES(kvc_radix_pin(t, NS, ta, 3), KVC_ERR_NO_MEMORY);
    tk_fail_after = -1;
    TK_EQ(tree_stats(t).lookups, 2);
    TK_EQ(tree_stats(t).n_nodes, 3);
    TK_EQ(tree_stats(t).n_pinned, 0);
    TK_OK(kvc_cache_destroy(a));
    TK_OK(kvc_cache_destroy(b));
    TK_OK(kvc_radix_destroy(t));
    TK_EQ(pages_used(pool), 0);
    TK_OK(kvc_pool_destroy(pool));
}

static void test_arena(void) {
    shape s = {2, 1, 4, 4};
    kvc_pool_config pc;
    kvc_pool *pool = NULL;
    kvc_radix_config rc;
    kvc_radix *t = NULL;
    kvc_cache *c;
    size_t bytes = 0;
    void *arena;
    long allocs;
    int32_t tok[MAXT], i, j, reused;
    kvc_pool_config_init(&pc);
    pc.n_layers = s.layers; pc.n_kv_heads = s.heads; pc.head_dim_k = s.hk; pc.head_dim_v = s.hv;
    pc.page_cells = 4;
    pc.budget_bytes = (size_t)16 * 4 * 2 * 8 * 4;
    TK_OK(kvc_pool_arena_bytes(&pc, &bytes));
    arena = malloc(bytes);
    pc.arena = arena;
    pc.arena_bytes = bytes;
    allocs = tk_allocs;
    TK_OK(kvc_pool_create(&pc, &pool));
    kvc_radix_config_init(&rc, KVC_KIND_FULL);
    TK_OK(kvc_radix_create(pool, &rc, &t));
    for (j = 0; j < 12; ++j) { /* more conversations than the pool holds: eviction */
        for (i = 0; i < 10; ++i) tok[i] = i < 5 ? i : 10 * j + i;
        c = turn(t, &s, tok, 10, 2, &reused);
        TK_EQ(reused, j ? 5 : 0);
        check_contents(c, &s, tok);
        TK_OK(kvc_cache_destroy(c));
    }
    TK_EQ(tree_stats(t).entries_evicted > 0, 1);
    TK_OK(kvc_radix_destroy(t));
    TK_EQ(pages_used(pool), 0);
    TK_OK(kvc_pool_destroy(pool));
    TK_EQ(tk_allocs, allocs);
    free(arena);
}

/* ---- the model-based random test ----------------------------------------------------- */

#define R_SEQS 160
#define R_LIVE 6
#define R_PINS 6
#define R_HOGS 3
#define R_MAXN 40

typedef struct r_seq { int ns; int32_t n; int32_t tok[MAXT]; } r_seq;
typedef struct r_live {
    kvc_cache *c;
    int ns;
    int32_t n;            /* tokens evaluated (the cache's offset) */
    int32_t tok[MAXT];
    int32_t lease;        /* length of the path it keeps in use (0: none) */
} r_live;

typedef struct r_ep {
    tk_rng rng;
    shape s;
    kvc_pool *pool;
    kvc_radix *t;
    kvc_kind kind;
    int32_t max_entries, alphabet;
    kvc_namespace ns[2];
    r_seq seqs[R_SEQS];
    int n_seqs;
    r_live live[R_LIVE];
    int n_live;
    r_seq pins[R_PINS];
    int n_pins;
    kvc_cache *hogs[R_HOGS];
    int n_hogs;
    int failed;
} r_ep;

static int32_t lcp(const int32_t *a, int32_t na, const int32_t *b, int32_t nb) {
    int32_t i = 0;
    while (i < na && i < nb && a[i] == b[i]) i++;
    return i;
}

/* the most a lookup of tok[0..n) may reuse: the best committed prefix, n - 1 at most */
static int32_t r_upper(const r_ep *e, int ns, const int32_t *tok, int32_t n) {
    int32_t best = 0, i;
    for (i = 0; i < e->n_seqs; ++i)
        if (e->seqs[i].ns == ns) best = TK_MAX(best, lcp(tok, n - 1, e->seqs[i].tok, e->seqs[i].n));
    return best;
}

static void r_record(r_ep *e, int ns, const int32_t *tok, int32_t n) {
    r_seq *q;
    if (n == 0) return;
    if (e->n_seqs == R_SEQS) { /* forget the oldest: upper bounds only grow looser */
        memmove(e->seqs, e->seqs + 1, sizeof(r_seq) * (R_SEQS - 1));
        e->n_seqs--;
    }
    q = &e->seqs[e->n_seqs++];
    q->ns = ns;
    q->n = n;
    memcpy(q->tok, tok, sizeof(int32_t) * (size_t)n);
}

#define R_CHECK(cond) do { if (!(cond)) { e->failed = 1; fprintf(stderr, "  %s:%d: %s\n", __FILE__, __LINE__, #cond); } } while (0)

static void r_check_lookup(r_ep *e, int ns, const int32_t *tok, int32_t n, int32_t reused, const kvc_cache *c) {
    int32_t upper = r_upper(e, ns, tok, n), off = -1, i;
    R_CHECK(reused >= 0 && reused <= upper);
    if (e->kind == KVC_KIND_FULL && tree_stats(e->t).entries_evicted == 0) R_CHECK(reused == upper);
    for (i = 0; i < e->n_live; ++i) /* a path in use is found whole */
        if (e->live[i].ns == ns && e->live[i].lease > 0) {
            int32_t l = TK_MIN(e->live[i].lease, lcp(tok, n - 1, e->live[i].tok, e->live[i].lease));
            if (l == e->live[i].lease || e->kind == KVC_KIND_FULL) R_CHECK(reused >= l);
        }
    if (e->kind == KVC_KIND_FULL)
        for (i = 0; i < e->n_pins; ++i)
            if (e->pins[i].ns == ns) R_CHECK(reused >= lcp(tok, n - 1, e->pins[i].tok, e->pins[i].n));
    kvc_cache_offset(c, &off);
    R_CHECK(off == reused);
    if (check_contents(c, &e->s, tok)) e->failed = 1;
}

static void r_check_counts(r_ep *e) {
    kvc_radix_stats st = tree_stats(e->t);
    int32_t in_use = 0, pins = 0, i;
    kvc_pool_stats ps;
    for (i = 0; i < e->n_live; ++i) in_use += e->live[i].lease > 0;
    for (i = 0; i < e->n_pins; ++i) pins++;
    R_CHECK(st.n_in_use == in_use);
    R_CHECK(st.n_pinned == pins);
    kvc_pool_stats_get(e->pool, &ps);
    R_CHECK(st.n_pages <= ps.pages_used);
}

static void r_drop_live(r_ep *e, int i) {
    TK_OK(kvc_cache_destroy(e->live[i].c));
    e->live[i] = e->live[--e->n_live];
}

/* lookup + evaluate + generate + commit; the cache stays live (or is destroyed) */
static void r_turn(r_ep *e) {
    int32_t tok[MAXT], n, keep = 0, gen, reused, i, ns = tk_int(&e->rng, 0, 9) == 0;
    kvc_cache *c = NULL;
    kvc_radix_stats st0;
    kvc_result r;
    n = tk_int(&e->rng, 1, R_MAXN);
    if (e->n_seqs > 0 && tk_int(&e->rng, 0, 3)) { /* continue or branch off something cached */
        const r_seq *q = &e->seqs[tk_int(&e->rng, 0, e->n_seqs - 1)];
        ns = q->ns;
        keep = tk_int(&e->rng, 0, q->n);
        memcpy(tok, q->tok, sizeof(int32_t) * (size_t)keep);
        int32_t more = keep + tk_int(&e->rng, 0, 8);
        n = TK_MAX(n, TK_MIN(more, R_MAXN + 20));
    }
    for (i = keep; i < n; ++i) tok[i] = tk_int(&e->rng, 0, e->alphabet - 1);
    TK_OK(kvc_radix_lookup(e->t, e->ns[ns], tok, n, &c, &reused));
    if (c == NULL) return;
    r_check_lookup(e, ns, tok, n, reused, c);
    gen = tk_int(&e->rng, 0, 4);
    for (i = 0; i < gen; ++i) tok[n + i] = tk_int(&e->rng, 0, e->alphabet - 1);
    st0 = tree_stats(e->t);
    r = extend(c, &e->s, tok, reused, n + (gen > 0 ? gen - 1 : 0));
    if (r == KVC_ERR_FULL) { /* all or nothing: the tree lost nothing */
        kvc_radix_stats st1 = tree_stats(e->t);
        R_CHECK(st1.entries_evicted == st0.entries_evicted && st1.n_nodes == st0.n_nodes);
        TK_OK(kvc_cache_destroy(c));
        return;
    }
    TK_OK(r);
    if (check_contents(c, &e->s, tok)) e->failed = 1;
    TK_OK(kvc_radix_commit(e->t, e->ns[ns], c, tok, n + gen, 0));
    r_record(e, ns, tok, n + (gen > 0 ? gen - 1 : 0));
    if (e->max_entries > 0) { /* leaves beyond the limit only while in use or pinned */
        int32_t in_use = 1;
        for (i = 0; i < e->n_live; ++i) in_use += e->live[i].lease > 0;
        R_CHECK(tree_stats(e->t).n_entries <= e->max_entries + in_use + e->n_pins);
    }
    if (e->n_live == R_LIVE) r_drop_live(e, tk_int(&e->rng, 0, R_LIVE - 1));
    if (tk_int(&e->rng, 0, 2) == 0) { TK_OK(kvc_cache_destroy(c)); return; }
    e->live[e->n_live].c = c;
    e->live[e->n_live].ns = ns;
    e->live[e->n_live].n = n + (gen > 0 ? gen - 1 : 0);
    e->live[e->n_live].lease = e->live[e->n_live].n;
    memcpy(e->live[e->n_live].tok, tok, sizeof(int32_t) * (size_t)(n + gen));
    e->n_live++;
}

/* an in-use entry is found whole, and a lookup of it reads back its K/V */
static void r_probe_live(r_ep *e) {
    r_live *l;
    int32_t tok[MAXT], reused;
    kvc_cache *c = NULL;
    if (e->n_live == 0) return;
    l = &e->live[tk_int(&e->rng, 0, e->n_live - 1)];
    if (l->lease == 0) return;
    memcpy(tok, l->tok, sizeof(int32_t) * (size_t)l->lease);
    tok[l->lease] = tk_int(&e->rng, 0, e->alphabet - 1);
    TK_OK(kvc_radix_lookup(e->t, e->ns[l->ns], tok, l->lease + 1, &c, &reused));
    R_CHECK(reused == l->lease);
    r_check_lookup(e, l->ns, tok, l->lease + 1, reused, c);
    TK_OK(kvc_cache_destroy(c));
}

static void r_pin(r_ep *e) {
    r_live *l;
    r_seq *p;
    int32_t n;
    if (e->n_live == 0 || e->n_pins == R_PINS) return;
    l = &e->live[tk_int(&e->rng, 0, e->n_live - 1)];
    if (l->lease == 0) return;
    n = tk_int(&e->rng, 1, l->lease);
    TK_OK(kvc_radix_pin(e->t, e->ns[l->ns], l->tok, n));
    p = &e->pins[e->n_pins++];
    p->ns = l->ns;
    p->n = n;
    memcpy(p->tok, l->tok, sizeof(int32_t) * (size_t)n);
}

static void r_unpin(r_ep *e) {
    int i;
    if (e->n_pins == 0) return;
    i = tk_int(&e->rng, 0, e->n_pins - 1);
    TK_OK(kvc_radix_unpin(e->t, e->ns[e->pins[i].ns], e->pins[i].tok, e->pins[i].n));
    e->pins[i] = e->pins[--e->n_pins];
}

/* an unrelated cache takes pages (eviction under pressure), or gives them back */
static void r_hog(r_ep *e) {
    kvc_cache_config cc;
    kvc_radix_stats st0, st1;
    int32_t tok[MAXT], i, n = tk_int(&e->rng, 1, 30);
    kvc_result r;
    if (e->n_hogs > 0 && tk_int(&e->rng, 0, 1)) {
        TK_OK(kvc_cache_destroy(e->hogs[--e->n_hogs]));
        return;
    }
    if (e->n_hogs == R_HOGS) return;
    kvc_cache_config_init(&cc, KVC_KIND_FULL);
    TK_OK(kvc_cache_create(e->pool, &cc, &e->hogs[e->n_hogs]));
    for (i = 0; i < n; ++i) tok[i] = 1000 + i;
    st0 = tree_stats(e->t);
    r = extend(e->hogs[e->n_hogs], &e->s, tok, 0, n);
    st1 = tree_stats(e->t);
    if (r == KVC_ERR_FULL) {
        R_CHECK(st1.entries_evicted == st0.entries_evicted && st1.n_pages == st0.n_pages);
        TK_OK(kvc_cache_destroy(e->hogs[e->n_hogs]));
        return;
    }
    TK_OK(r);
    e->n_hogs++;
}

static int r_episode(unsigned long long seed, int episode) {
    r_ep *e = (r_ep *)calloc(1, sizeof(r_ep));
    kvc_radix_config rc;
    int steps, step, i, failed;
    int32_t pages;
    e->rng.s = seed * 0x9e3779b97f4a7c15ull + (unsigned long long)episode * 0x2545f4914f6cdd1dull + 1;
    tk_next(&e->rng);
    e->s.layers = tk_int(&e->rng, 1, 3);
    e->s.heads = tk_int(&e->rng, 1, 2);
    e->s.hk = tk_int(&e->rng, 1, 5);
    e->s.hv = tk_int(&e->rng, 1, 5);
    e->alphabet = tk_int(&e->rng, 0, 1) ? 3 : 12;
    pages = tk_int(&e->rng, 0, 2) ? tk_int(&e->rng, 6, 40) : 400;
    e->pool = make_pool(&e->s, tk_int(&e->rng, 0, 1) ? KVC_TYPE_F16 : KVC_TYPE_F32,
                        tk_int(&e->rng, 0, 1) ? KVC_TYPE_F16 : KVC_TYPE_F32, tk_int(&e->rng, 1, 6), pages);
    e->kind = tk_int(&e->rng, 0, 2) ? KVC_KIND_FULL : KVC_KIND_ROTATING;
    kvc_radix_config_init(&rc, e->kind);
    if (e->kind == KVC_KIND_ROTATING) {
        rc.cache.window = tk_int(&e->rng, 1, 12);
        rc.cache.sinks = tk_int(&e->rng, 0, rc.cache.window - 1);
    }
    e->max_entries = rc.max_entries = tk_int(&e->rng, 0, 5) == 0 ? tk_int(&e->rng, 1, 2) : 0;
    e->ns[0].model = 1;
    e->ns[1].model = 1;
    e->ns[1].salt = 2;
    TK_OK(kvc_radix_create(e->pool, &rc, &e->t));
    steps = tk_int(&e->rng, 20, 160);
    for (step = 0; step < steps && !e->failed; ++step) {
        int op = tk_int(&e->rng, 0, 19);
        if (op < 10) r_turn(e);
        else if (op < 13) r_probe_live(e);
        else if (op == 13 && e->n_live) r_drop_live(e, tk_int(&e->rng, 0, e->n_live - 1));
        else if (op == 14 && e->n_live) {
            i = tk_int(&e->rng, 0, e->n_live - 1);
            TK_OK(kvc_radix_release(e->live[i].c));
            e->live[i].lease = 0;
        } else if (op == 15) r_pin(e);
        else if (op == 16) r_unpin(e);
        else if (op == 17) TK_OK(kvc_radix_evict(e->t, tk_int(&e->rng, 0, 5), NULL));
        else r_hog(e);
        r_check_counts(e);
    }
    for (i = 0; i < e->n_live; ++i)
        if (e->live[i].lease > 0) { TK_RES(kvc_radix_destroy(e->t), KVC_ERR_BUSY); break; }
    while (e->n_live > 0) r_drop_live(e, 0);
    while (e->n_hogs > 0) TK_OK(kvc_cache_destroy(e->hogs[--e->n_hogs]));
    TK_OK(kvc_radix_destroy(e->t));
    { /* no page leaks, no object left */
        kvc_pool_stats ps;
        kvc_pool_stats_get(e->pool, &ps);
        R_CHECK(ps.pages_used == 0 && ps.live_caches == 0 && ps.live_prefixes == 0);
    }
    TK_OK(kvc_pool_destroy(e->pool));
    failed = e->failed;
    free(e);
    return failed;
}

int main(int argc, char **argv) {
    unsigned long long seed = argc > 1 ? strtoull(argv[1], NULL, 10) : (unsigned long long)time(NULL);
    int only = argc > 2 ? atoi(argv[2]) : -1, episodes = (int)(1500 * tk_scale()), ep, bad = 0;
    printf("seed %llu\n", seed);
    test_sharing(KVC_TYPE_F32);
    test_sharing(KVC_TYPE_F16);
    test_dedup();
    test_eviction();
    test_pin_prefix();
    test_namespaces();
    test_rotating();
    test_rotating_long();
    test_single_entry(seed);
    test_cow_reclaim();
    test_evicting_allocations();
    test_errors();
    test_alloc_failures();
    test_arena();
    for (ep = 0; ep < episodes; ++ep) {
        if (only >= 0 && ep != only) continue;
        if (r_episode(seed, ep)) {
            tk_failed++;
            fprintf(stderr, "episode %d failed: replay with %s %llu %d\n", ep, argv[0], seed, ep);
            if (++bad >= 5) break;
        } else {
            tk_passed++;
        }
    }
    return tk_report("radix");
}
