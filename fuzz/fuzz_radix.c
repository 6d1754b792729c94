/* fuzz/fuzz_radix.c - libFuzzer target: the radix prefix tree (kvc_radix_*) driven by
   operation sequences decoded from the input bytes, checked against a reference model.

   The first bytes choose a pool (1-2 layers, f32/f16 K and V, 1-8 cells per page, a
   budget of 2-64 pages or a roomy one), a tree (FULL, or ROTATING with a window of 1-16
   keys and 0..W-1 sinks; max_entries 0-3) and an alphabet of 2-6 token ids (small, so
   that prompts share prefixes). Every later byte starts an operation: a lookup into one
   of 6 cache slots (the prompt continues or branches off something committed or live,
   under one of 3 namespaces that differ in model or salt), evaluating more tokens in a
   live cache, a commit (of all, fewer, or more tokens than the cache evaluated), release
   / destroy / clear, a rewind, pin / unpin, kvc_radix_evict, unrelated caches that take
   pages (so kvc_begin evicts under pressure), a refused allocation during a commit,
   lookup or pin, an entry saved to memory and loaded back (pinned or not), bad calls,
   and destroying and recreating the tree.

   The reference is a trie of tokens, one record per token, and only the facts the
   documented rules talk about: which token ends a node of the tree (a commit splits a
   node where it ends inside it and leaves a leaf; a pin splits where it ends; nodes never
   merge), each node's LRU tick, users (caches holding it in use) and pins, the latest
   commit that ended there (max_entries), and for ROTATING trees whether the node holds
   the page of each logical page (a commit gives a node the pages its cache still held).
   From that it predicts exactly:
     - every lookup's reused count: the longest prefix the trie holds of tokens[0 .. n-1)
       (so at least one token is left to evaluate), ROTATING: shortened until every page
       its window needs is held;
     - every result code, the tree statistics (nodes, entries, in use, pins, lookups,
       tokens, commits, evicted entries and their pages) after every operation;
     - evictions by max_entries; kvc_radix_evict and a kvc_begin under pressure evict a
       number of entries the reference cannot know (pages shared with caches), so the
       reference replays that many least-recently-used unreferenced leaves, which must
       exist; a kvc_begin that says KVC_ERR_FULL evicts nothing. Pinned entries and
       entries in use are never evicted: the following lookups would disagree.
   The K/V written for position p is a function of the namespace and the whole prefix
   tokens[0..p] (exact in f16), so after every operation every live cache - stitched from
   the tree's pages by a lookup, then written into - must read back (kvc_cache_gather,
   every layer) exactly the visible positions of its model with exactly those values.
   A failure prints the last steps and aborts (fuzz/fuzz_replay.c names the input). */
#define KVCACHE_IMPLEMENTATION
#include "../kvcache.h"
#include "fuzz_util.h"
#include "../tests/ref_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FR_MAXT 64    /* tokens of a cache (prompt + generated) */
#define FR_PROMPT 44  /* longest prompt: leaves room to generate */
#define FR_LIVE 6     /* cache slots */
#define FR_HOGS 3     /* unrelated caches */
#define FR_TOKS 4096  /* tokens the reference trie holds */
#define FR_SEQS 12    /* recently committed sequences: material for prompts */
#define FR_PINS 8
#define FR_NS 3
#define FR_STEPS 256
#define FR_LAYERS 2
#define FR_HK 3
#define FR_HV 2

/* ---- the world ---------------------------------------------------------------------- */

/* One token of the reference trie: position `pos` of the sequences through it. A radix
   node is a chain of these ending in a token with `end` set; its tick, users, pins and
   entry tick live on that last token (tick on every token of the path, as a touch sets
   it on a node and all its ancestors). */
typedef struct fr_tok {
    int32_t tok, pos;
    int ns;
    int parent, child, next; /* -1: none (parent -1: a first token, under the root) */
    int end;                 /* the last token of its node */
    int present;             /* its node holds the page of logical page pos / page_cells */
    int kept;                /* scratch: on the path of one of the max_entries latest commits */
    uint32_t users, pins;
    uint64_t tick, entry_tick;
} fr_tok;

typedef struct fr_live {
    kvc_cache *h;            /* NULL: the slot is free */
    int ns;
    int32_t off, bb;         /* offset; the window's anchor (first token of the last batch) */
    int rel;                 /* ROTATING: a window page was released (the window "wrapped") */
    int32_t n_plan;          /* tokens known: tok[0 .. off) evaluated, the rest to come */
    int32_t tok[FR_MAXT];
    uint32_t hash[FR_MAXT];  /* of ns and tok[0..p]: the K/V of position p */
    int lease;               /* the reference token ending the node it holds in use, -1: none */
} fr_live;

typedef struct fr_seq {
    int ns;
    int32_t n, tok[FR_MAXT];
} fr_seq;

typedef struct fr_world {
    fuzz_in in;
    long live_blocks, allocs, fail_at; /* the allocator: allocation number fail_at fails */
    kvc_pool *pool;
    kvc_radix *tree;
    kvc_kind kind;
    int32_t W, S, pc, layers, max_entries, alphabet;
    kvc_namespace ns[FR_NS];
    fr_live live[FR_LIVE];
    kvc_cache *hogs[FR_HOGS];
    int n_hogs;
    fr_seq seqs[FR_SEQS];
    int n_seqs, seq_next;
    fr_seq pins[FR_PINS];
    int n_pins;
    float k[FR_MAXT * FR_HK], v[FR_MAXT * FR_HV], gk[FR_MAXT * FR_HK], gv[FR_MAXT * FR_HV];
    int32_t gpos[FR_MAXT];
    unsigned char saved[1 << 16]; /* kvc_radix_save's output (at most 64 pages of 320 bytes) */
    kvc_radix_stats rs; /* the counters the reference predicts */
    uint64_t clock;
    /* the reference trie: tokens [0, hw) were used, freel[0 .. n_free) are free again;
       last in the struct: an input clears what comes before T, not T itself */
    int hw, n_free, root_child;
    fr_tok T[FR_TOKS];
    int freel[FR_TOKS];
} fr_world;

static fr_world fr_the_world;

static void *fr_alloc(size_t size, void *user) {
    fr_world *w = (fr_world *)user;
    void *p;
    if (w->allocs++ == w->fail_at) return NULL;
    p = malloc(size);
    if (p != NULL) w->live_blocks++;
    return p;
}
static void fr_free(void *ptr, void *user) {
    fr_world *w = (fr_world *)user;
    if (ptr != NULL) w->live_blocks--;
    free(ptr);
}

/* K/V of a position: a function of its whole prefix and namespace, exact in f16 */
static uint32_t fr_hash0(int ns) { return 2166136261u ^ (uint32_t)(ns + 1) * 0x9e3779b9u; }
static uint32_t fr_hash_next(uint32_t h, int32_t tok) { return (h ^ (uint32_t)tok) * 16777619u; }
static float fr_val(uint32_t h, int kv, int layer, int d) {
    uint32_t x = h ^ (uint32_t)(kv * 64 + layer * 8 + d + 1) * 0x85ebca6bu;
    x ^= x >> 13;
    x *= 0xc2b2ae35u;
    x ^= x >> 16;
    return (float)((int)(x % 129u) - 64) / 8.0f;
}

static kvc_radix_stats fr_stats(fr_world *w) {
    kvc_radix_stats s;
    memset(&s, 0, sizeof(s));
    FUZZ_RES(kvc_radix_stats_get(w->tree, &s), KVC_OK);
    return s;
}
static int32_t fr_pages_used(fr_world *w) {
    kvc_pool_stats s;
    FUZZ_RES(kvc_pool_stats_get(w->pool, &s), KVC_OK);
    return s.pages_used;
}

/* ---- the reference trie ----------------------------------------------------------------- */

static int fr_find_child(fr_world *w, int parent, int ns, int32_t tok) {
    int c = parent < 0 ? w->root_child : w->T[parent].child;
    for (; c >= 0; c = w->T[c].next)
        if (w->T[c].tok == tok && w->T[c].ns == ns) return c;
    return -1;
}

/* tokens[0 .. n) followed down under ns: path[p] is the token at position p; returns
   how many matched */
static int32_t fr_walk(fr_world *w, int ns, const int32_t *tok, int32_t n, int *path) {
    int32_t m = 0;
    int at = -1;
    while (m < n && (at = fr_find_child(w, at, ns, tok[m])) >= 0) path[m++] = at;
    return m;
}

/* the last token of t's node (a token inside a node has exactly one child) */
static int fr_node_end(const fr_world *w, int t) {
    while (!w->T[t].end) {
        FUZZ_CHECK(w->T[t].child >= 0 && w->T[w->T[t].child].next < 0, "model: token %d inside a node branches", t);
        t = w->T[t].child;
    }
    return t;
}

static int fr_free_tokens(const fr_world *w) { return FR_TOKS - w->hw + w->n_free; }

static int fr_new_tok(fr_world *w) {
    int t = w->n_free > 0 ? w->freel[--w->n_free] : w->hw++;
    memset(&w->T[t], 0, sizeof(fr_tok));
    w->T[t].parent = w->T[t].child = w->T[t].next = -1;
    return t;
}

static void fr_unlink(fr_world *w, int t) {
    int *link = w->T[t].parent < 0 ? &w->root_child : &w->T[w->T[t].parent].child;
    while (*link != t) link = &w->T[*link].next;
    *link = w->T[t].next;
}

static int fr_live_tok(const fr_world *w, int t) {
    /* freed tokens are marked by pos -1 */
    return w->T[t].pos >= 0;
}

/* a touch: the node ending at e and every ancestor were used now */
static void fr_touch(fr_world *w, int e) {
    uint64_t tick = ++w->clock;
    for (; e >= 0; e = w->T[e].parent) w->T[e].tick = tick;
}

/* ROTATING: logical pages of a node that hold a page (FULL: all of them) */
static int32_t fr_node_pages(const fr_world *w, int e) {
    int32_t n = 0, last_lp = -1;
    int t = e;
    for (;;) {
        int32_t lp = w->T[t].pos / w->pc;
        if (lp != last_lp && w->T[t].present) n++;
        last_lp = lp;
        if (w->T[t].parent < 0 || w->T[w->T[t].parent].end) break;
        t = w->T[t].parent;
    }
    return n;
}

/* remove the leaf node ending at e (counted as an eviction) */
static void fr_evict_node(fr_world *w, int e) {
    int t = e, p;
    w->rs.entries_evicted++;
    w->rs.pages_evicted += (uint64_t)fr_node_pages(w, e);
    for (;;) {
        p = w->T[t].parent;
        fr_unlink(w, t);
        w->T[t].pos = -1;
        w->freel[w->n_free++] = t;
        if (p < 0 || w->T[p].end) break;
        t = p;
    }
}

/* the least recently used leaf nobody uses or pinned (kept too when `trim`), or -1.
   Ticks of two leaves never tie (a tick is set along one path only). */
static int fr_lru(fr_world *w, int trim) {
    int t, best = -1, ties = 0;
    for (t = 0; t < w->hw; ++t) {
        const fr_tok *x = &w->T[t];
        if (!fr_live_tok(w, t) || !x->end || x->child >= 0 || x->users || x->pins || (trim && x->kept)) continue;
        if (best >= 0 && x->tick == w->T[best].tick) ties++;
        if (best < 0 || x->tick < w->T[best].tick) { best = t; ties = 0; }
    }
    FUZZ_CHECK(ties == 0, "model: two evictable leaves with tick %llu", (unsigned long long)w->T[best].tick);
    return best;
}

/* the library evicted n entries for pages: the same LRU leaves go from the reference */
static void fr_replay_evictions(fr_world *w, uint64_t n, const char *why) {
    uint64_t i;
    for (i = 0; i < n; ++i) {
        int e = fr_lru(w, 0);
        FUZZ_CHECK(e >= 0, "%s evicted %llu entries, the reference has only %llu to evict", why,
                 (unsigned long long)n, (unsigned long long)i);
        fr_evict_node(w, e);
    }
}

/* max_entries: keep the paths of the latest commits, evict every other free leaf */
static void fr_trim(fr_world *w) {
    int t, best, k;
    if (w->max_entries == 0) return;
    for (t = 0; t < w->hw; ++t) w->T[t].kept = 0;
    for (k = 0; k < w->max_entries; ++k) {
        best = -1;
        for (t = 0; t < w->hw; ++t)
            if (fr_live_tok(w, t) && w->T[t].end && w->T[t].entry_tick && !w->T[t].kept &&
                (best < 0 || w->T[t].entry_tick > w->T[best].entry_tick))
                best = t;
        if (best < 0) break;
        for (t = best; t >= 0; t = w->T[t].parent) w->T[t].kept = 1;
    }
    while ((best = fr_lru(w, 1)) >= 0) fr_evict_node(w, best);
}

static void fr_lease(fr_world *w, fr_live *c, int e) {
    if (c->lease >= 0) w->T[c->lease].users--;
    c->lease = e;
    if (e >= 0) w->T[e].users++;
}

/* ---- a cache's model ------------------------------------------------------------------- */

static int fr_rot(const fr_world *w) { return w->kind == KVC_KIND_ROTATING; }

/* the first non-sink position the cache shows (FULL: 0) */
static int32_t fr_window_lo(const fr_world *w, const fr_live *c) {
    if (!fr_rot(w)) return 0;
    return fuzz_max(fuzz_min(w->S, c->off), fuzz_max(w->S, c->bb - (w->W - w->S) + 1));
}
static int fr_visible(const fr_world *w, const fr_live *c, int32_t p) {
    return p < c->off && (!fr_rot(w) || p < w->S || p >= fr_window_lo(w, c));
}

/* Does the cache hold logical page lp? FULL: every page below its offset. ROTATING: its
   sink pages, and the window pages with a token at or after the oldest one the next
   query may see (what kvc_begin or a lookup keeps; after a kvc_cancel with a window of
   one key that is the page of the next slot, which shows no cell). */
static int fr_held(const fr_world *w, const fr_live *c, int32_t lp) {
    int32_t nsp = (w->S + w->pc - 1) / w->pc;
    if (lp * w->pc >= c->off) return 0;
    return !fr_rot(w) || lp < nsp || (lp + 1) * w->pc > c->bb - (w->W - w->S) + 1;
}

static int fr_wrapped(const fr_world *w, const fr_live *c) { return fr_rot(w) && (c->off > w->W || c->rel); }

/* does a kvc_begin at offset o release the first window page (so the window wrapped)? */
static int fr_begin_releases(const fr_world *w, int32_t o) {
    return ref_begin_releases(w->kind, w->W, w->S, w->pc, o); /* tests/ref_model.h */
}

/* every position the cache shows, with the K/V of its prefix, in every layer */
static void fr_check_cache(fr_world *w, int i) {
    fr_live *c = &w->live[i];
    int32_t off = -1, n = -1, l, p, j, d;
    FUZZ_RES(kvc_cache_offset(c->h, &off), KVC_OK);
    FUZZ_CHECK(off == c->off, "cache %d: offset %d, reference %d", i, off, c->off);
    for (l = 0; l < w->layers; ++l) {
        FUZZ_RES(kvc_cache_gather(c->h, l, w->gk, w->gv, w->gpos, FR_MAXT, &n), KVC_OK);
        for (p = 0, j = 0; p < c->off; ++p) {
            if (!fr_visible(w, c, p)) continue;
            FUZZ_CHECK(j < n && w->gpos[j] == p, "cache %d layer %d: cell %d is not position %d", i, l, j, p);
            for (d = 0; d < FR_HK; ++d)
                FUZZ_CHECK(w->gk[j * FR_HK + d] == fr_val(c->hash[p], 0, l, d),
                         "cache %d layer %d position %d: K is not that of its prefix", i, l, p);
            for (d = 0; d < FR_HV; ++d)
                FUZZ_CHECK(w->gv[j * FR_HV + d] == fr_val(c->hash[p], 1, l, d),
                         "cache %d layer %d position %d: V is not that of its prefix", i, l, p);
            j++;
        }
        FUZZ_CHECK(n == j, "cache %d layer %d: %d cells, reference %d", i, l, n, j);
    }
}

/* the counters, and what the pool holds */
static void fr_check_stats(fr_world *w) {
    kvc_radix_stats s = fr_stats(w), *r = &w->rs;
    int32_t nodes = 0, entries = 0, in_use = 0, pinned = 0;
    int t, i;
    for (t = 0; t < w->hw; ++t) {
        if (!fr_live_tok(w, t) || !w->T[t].end) continue;
        nodes++;
        entries += w->T[t].child < 0;
        pinned += (int32_t)w->T[t].pins;
    }
    for (i = 0; i < FR_LIVE; ++i) in_use += w->live[i].h != NULL && w->live[i].lease >= 0;
    FUZZ_CHECK(s.lookups == r->lookups && s.tokens_queried == r->tokens_queried && s.tokens_hit == r->tokens_hit,
             "lookups %llu/%llu/%llu, reference %llu/%llu/%llu", (unsigned long long)s.lookups,
             (unsigned long long)s.tokens_queried, (unsigned long long)s.tokens_hit, (unsigned long long)r->lookups,
             (unsigned long long)r->tokens_queried, (unsigned long long)r->tokens_hit);
    FUZZ_CHECK(s.commits == r->commits, "commits %llu, reference %llu", (unsigned long long)s.commits,
             (unsigned long long)r->commits);
    FUZZ_CHECK(s.entries_evicted == r->entries_evicted && s.pages_evicted == r->pages_evicted,
             "evicted %llu entries / %llu pages, reference %llu / %llu", (unsigned long long)s.entries_evicted,
             (unsigned long long)s.pages_evicted, (unsigned long long)r->entries_evicted,
             (unsigned long long)r->pages_evicted);
    FUZZ_CHECK(s.n_nodes == nodes && s.n_entries == entries, "%d nodes / %d entries, reference %d / %d", s.n_nodes,
             s.n_entries, nodes, entries);
    FUZZ_CHECK(s.n_in_use == in_use && s.n_pinned == pinned, "%d in use / %d pins, reference %d / %d", s.n_in_use,
             s.n_pinned, in_use, pinned);
    FUZZ_CHECK(s.n_pages <= fr_pages_used(w), "the tree references %d pages, the pool has %d in use", s.n_pages,
             fr_pages_used(w));
}

/* after a step: the statistics, the slot the step used and one more in turn (so every
   live cache at least every FR_LIVE steps: reading all of them every step took over a
   third of the time); all of them at the end */
static void fr_check_step(fr_world *w, int slot) {
    int other = fuzz_step % FR_LIVE;
    fr_check_stats(w);
    if (w->live[slot].h != NULL) fr_check_cache(w, slot);
    if (other != slot && w->live[other].h != NULL) fr_check_cache(w, other);
}

/* kvc_begin that may evict under pressure: all or nothing, least recently used first */
static kvc_result fr_begin(fr_world *w, kvc_cache *h, int32_t n) {
    kvc_radix_stats s;
    kvc_result r = kvc_begin(h, n, NULL, 0);
    s = fr_stats(w);
    if (r == KVC_ERR_FULL) {
        FUZZ_CHECK(s.entries_evicted == w->rs.entries_evicted, "a kvc_begin that said FULL evicted %llu entries",
                 (unsigned long long)(s.entries_evicted - w->rs.entries_evicted));
        return r;
    }
    FUZZ_RES(r, KVC_OK);
    fr_replay_evictions(w, s.entries_evicted - w->rs.entries_evicted, "kvc_begin");
    return r;
}

/* evaluate k more tokens in live cache i (the prompt's, then new ones); 0 if out of pages */
static int fr_eval(fr_world *w, int i, int32_t k) {
    fr_live *c = &w->live[i];
    int32_t o = c->off, p, l, d;
    if (k < 1 || o + k > FR_MAXT) return 0;
    while (c->n_plan < o + k) c->tok[c->n_plan++] = fuzz_int(&w->in, 0, w->alphabet - 1);
    if (fr_begin(w, c->h, k) != KVC_OK) return 0;
    if (fr_begin_releases(w, o)) c->rel = 1;
    for (p = o; p < o + k; ++p) c->hash[p] = fr_hash_next(p > 0 ? c->hash[p - 1] : fr_hash0(c->ns), c->tok[p]);
    for (l = 0; l < w->layers; ++l) {
        for (p = o; p < o + k; ++p) {
            for (d = 0; d < FR_HK; ++d) w->k[(p - o) * FR_HK + d] = fr_val(c->hash[p], 0, l, d);
            for (d = 0; d < FR_HV; ++d) w->v[(p - o) * FR_HV + d] = fr_val(c->hash[p], 1, l, d);
        }
        FUZZ_RES(kvc_put(c->h, l, w->k, w->v), KVC_OK);
    }
    c->off = o + k;
    c->bb = o;
    return 1;
}

static void fr_drop(fr_world *w, int i) {
    fr_live *c = &w->live[i];
    FUZZ_RES(kvc_cache_destroy(c->h), KVC_OK);
    fr_lease(w, c, -1);
    c->h = NULL;
}

static void fr_record(fr_world *w, int ns, const int32_t *tok, int32_t n) {
    fr_seq *q = &w->seqs[w->seq_next];
    if (n == 0) return;
    w->seq_next = (w->seq_next + 1) % FR_SEQS;
    if (w->n_seqs < FR_SEQS) w->n_seqs++;
    q->ns = ns;
    q->n = n;
    memcpy(q->tok, tok, sizeof(int32_t) * (size_t)n);
}

/* ---- the operations ------------------------------------------------------------------------ */

/* A prompt: part of something committed or live (sometimes with one token changed), then
   new tokens; returns its length (>= 1). */
static int32_t fr_prompt(fr_world *w, int *ns, int32_t *tok, int32_t max) {
    int src = fuzz_int(&w->in, 0, 3), i;
    int32_t n = 0, keep, more;
    *ns = 0;
    if (src <= 1 && w->n_seqs > 0) {
        const fr_seq *q = &w->seqs[fuzz_int(&w->in, 0, w->n_seqs - 1)];
        *ns = q->ns;
        n = keep = fuzz_min(fuzz_int(&w->in, 0, q->n), max);
        memcpy(tok, q->tok, sizeof(int32_t) * (size_t)keep);
    } else if (src == 2) {
        const fr_live *c = &w->live[fuzz_int(&w->in, 0, FR_LIVE - 1)];
        if (c->h != NULL) {
            *ns = c->ns;
            n = keep = fuzz_min(fuzz_int(&w->in, 0, c->n_plan), max);
            memcpy(tok, c->tok, sizeof(int32_t) * (size_t)keep);
        }
    } else {
        *ns = fuzz_int(&w->in, 0, FR_NS - 1);
    }
    if (n > 0 && fuzz_int(&w->in, 0, 5) == 0) tok[fuzz_int(&w->in, 0, n - 1)] ^= 1;
    for (more = fuzz_int(&w->in, 0, 10), i = 0; i < more && n < max; ++i) tok[n++] = fuzz_int(&w->in, 0, w->alphabet - 1);
    if (n == 0) tok[n++] = fuzz_int(&w->in, 0, w->alphabet - 1);
    return n;
}

/* The reference's lookup: the longest prefix of tokens[0 .. n) held, ROTATING: shortened
   below the highest page its window needs that the path lacks (to that page's first
   token, or to the start of the node that lacks it if that is later: an ancestor may hold
   the page for the shorter prefix), until none is missing. */
static int fr_page_present(const fr_world *w, const int *path, int32_t m, int32_t lp) {
    return w->T[path[fuzz_min(m, (lp + 1) * w->pc) - 1]].present;
}
static int32_t fr_below_missing(const fr_world *w, const int *path, int32_t m, int32_t lp) {
    int32_t j = fuzz_min(m, (lp + 1) * w->pc) - 1;
    while (j > 0 && !w->T[path[j - 1]].end) --j; /* the first token of the node lacking lp */
    return fuzz_max(lp * w->pc, j);
}
static int32_t fr_usable(const fr_world *w, const int *path, int32_t m) {
    int32_t pc = w->pc, nsp = (w->S + pc - 1) / pc;
    while (fr_rot(w) && m > 0) {
        int32_t last = (m - 1) / pc, lo = fuzz_max(w->S, m - w->W + w->S), first = fuzz_max(nsp, lo / pc);
        int32_t sink_end = fuzz_min(nsp, last + 1), lp, miss = -1;
        for (lp = last; lp >= first && miss < 0; --lp)
            if (!fr_page_present(w, path, m, lp)) miss = lp;
        for (lp = sink_end - 1; lp >= 0 && miss < 0; --lp)
            if (!fr_page_present(w, path, m, lp)) miss = lp;
        if (miss < 0) break;
        m = fr_below_missing(w, path, m, miss);
    }
    return m;
}

/* lookup into slot i (its old cache destroyed first); fail: the allocation that fails */
static void fr_lookup(fr_world *w, int i, int fail) {
    fr_live *c = &w->live[i];
    int32_t tok[FR_MAXT], n, m, reused = -1, p;
    int path[FR_MAXT], ns;
    kvc_cache *h = NULL;
    kvc_result r;
    if (c->h != NULL) fr_drop(w, i);
    n = fr_prompt(w, &ns, tok, FR_PROMPT);
    m = fr_usable(w, path, fr_walk(w, ns, tok, n - 1, path));
    fuzz_note("lookup slot %d ns %d n %d%s: want reuse %d", i, ns, n, fail >= 0 ? " (allocation fails)" : "", m);
    if (fail >= 0) w->fail_at = w->allocs + fail;
    r = kvc_radix_lookup(w->tree, w->ns[ns], tok, n, &h, &reused);
    w->fail_at = -1;
    if (fail == 0) { /* the ready cache could not be made: nothing changed */
        FUZZ_RES(r, KVC_ERR_NO_MEMORY);
        return;
    }
    FUZZ_RES(r, KVC_OK);
    FUZZ_CHECK(reused == m, "lookup reused %d, reference %d", reused, m);
    memset(c, 0, sizeof(*c));
    c->h = h;
    c->ns = ns;
    c->off = m;
    c->bb = m > 0 ? m - 1 : 0;
    c->lease = -1;
    c->n_plan = n;
    memcpy(c->tok, tok, sizeof(int32_t) * (size_t)n);
    for (p = 0; p < m; ++p) c->hash[p] = fr_hash_next(p > 0 ? c->hash[p - 1] : fr_hash0(ns), tok[p]);
    if (m > 0) {
        int e = fr_node_end(w, path[m - 1]);
        fr_touch(w, e);
        fr_lease(w, c, e);
    }
    w->rs.lookups++;
    w->rs.tokens_queried += (uint64_t)n;
    w->rs.tokens_hit += (uint64_t)m;
}

/* ROTATING: the committing cache fills the pages the path up to m lacks, of node
   tokens whose node has all its tokens in that page below m */
static void fr_fill_holes(fr_world *w, const fr_live *c, const int *path, int32_t m, int at_end) {
    int ext[FR_MAXT], t;
    int32_t n_ext = m, i, node_end;
    memcpy(ext, path, sizeof(int) * (size_t)m);
    for (t = path[m - 1]; t != at_end;) ext[n_ext++] = t = w->T[t].child;
    node_end = n_ext;
    for (i = n_ext - 1; i >= 0; --i) {
        fr_tok *x = &w->T[ext[i]];
        int32_t lp = i / w->pc;
        if (x->end) node_end = i + 1;
        if (!x->present && fuzz_min(node_end, (lp + 1) * w->pc) <= m && fr_held(w, c, lp)) x->present = 1;
    }
}

/* commit live cache i: fail >= 0 refuses that allocation of the call */
static void fr_commit(fr_world *w, int i, int fail) {
    fr_live *c = &w->live[i];
    int32_t nt, n, m, p, mode = fuzz_int(&w->in, 0, 3);
    int path[FR_MAXT], inside, split, leaf, at;
    kvc_result r;
    nt = mode <= 1 ? c->off : mode == 2 ? fuzz_min(c->off + fuzz_int(&w->in, 1, 4), FR_MAXT) : fuzz_int(&w->in, 0, c->off);
    while (c->n_plan < nt) c->tok[c->n_plan++] = fuzz_int(&w->in, 0, w->alphabet - 1); /* not evaluated yet */
    n = fuzz_min(nt, c->off);
    m = fr_walk(w, c->ns, c->tok, n, path);
    if (fr_free_tokens(w) < n - m) return; /* the reference is full */
    inside = m > 0 && !w->T[path[m - 1]].end;
    split = inside && (m < n || (w->max_entries > 0 && n > 0));
    leaf = m < n;
    fuzz_note("commit slot %d: %d tokens (offset %d), %d held, split %d leaf %d%s", i, nt, c->off, m, split, leaf,
            fail >= 0 ? " (an allocation fails)" : "");
    if (fail >= 0) w->fail_at = w->allocs + fail;
    r = kvc_radix_commit(w->tree, w->ns[c->ns], c->h, c->tok, nt, 0);
    w->fail_at = -1;
    if (fail >= 0 && fail < split + leaf) { /* a node could not be made: nothing changed */
        FUZZ_RES(r, KVC_ERR_NO_MEMORY);
        return;
    }
    FUZZ_RES(r, KVC_OK);
    if (split) w->T[path[m - 1]].end = 1;
    at = m > 0 ? fr_node_end(w, path[m - 1]) : -1; /* the node holding token m - 1 */
    if (m > 0 && fr_rot(w)) fr_fill_holes(w, c, path, m, at);
    for (p = m; p < n; ++p) { /* the new leaf: its pages are those the cache holds */
        int t = fr_new_tok(w);
        fr_tok *x = &w->T[t];
        x->tok = c->tok[p];
        x->pos = p;
        x->ns = c->ns;
        x->parent = at;
        x->next = at < 0 ? w->root_child : w->T[at].child;
        if (at < 0) w->root_child = t;
        else w->T[at].child = t;
        x->present = fr_held(w, c, p / w->pc);
        x->end = p == n - 1;
        at = t;
    }
    if (n > 0) {
        fr_touch(w, at);
        if (w->T[at].pos + 1 == n) w->T[at].entry_tick = w->clock;
    }
    fr_lease(w, c, n > 0 ? at : -1);
    w->rs.commits++;
    fr_trim(w);
    fr_record(w, c->ns, c->tok, n);
}

static void fr_pin(fr_world *w, int fail) {
    int32_t tok[FR_MAXT], n, m;
    int path[FR_MAXT], ns, split;
    kvc_result r;
    n = fr_prompt(w, &ns, tok, FR_MAXT);
    if (fuzz_int(&w->in, 0, 1)) n = fuzz_int(&w->in, 1, n); /* often a part of something held */
    m = fr_walk(w, ns, tok, n, path);
    split = m == n && !w->T[path[n - 1]].end;
    fuzz_note("pin ns %d n %d: %d held, split %d%s", ns, n, m, split, fail >= 0 ? " (allocation fails)" : "");
    if (fail >= 0) w->fail_at = w->allocs + fail;
    r = kvc_radix_pin(w->tree, w->ns[ns], tok, n);
    w->fail_at = -1;
    if (m < n) { FUZZ_RES(r, KVC_ERR_NOT_FOUND); return; }
    if (fail == 0 && split) { FUZZ_RES(r, KVC_ERR_NO_MEMORY); return; }
    FUZZ_RES(r, KVC_OK);
    w->T[path[n - 1]].end = 1;
    w->T[path[n - 1]].pins++;
    if (w->n_pins < FR_PINS) {
        fr_seq *q = &w->pins[w->n_pins++];
        q->ns = ns;
        q->n = n;
        memcpy(q->tok, tok, sizeof(int32_t) * (size_t)n);
    }
}

static void fr_unpin(fr_world *w) {
    int32_t tok[FR_MAXT], n, m;
    int path[FR_MAXT], ns, node = -1, j = -1;
    if (w->n_pins > 0 && fuzz_int(&w->in, 0, 3)) { /* one of ours */
        j = fuzz_int(&w->in, 0, w->n_pins - 1);
        ns = w->pins[j].ns;
        n = w->pins[j].n;
        memcpy(tok, w->pins[j].tok, sizeof(int32_t) * (size_t)n);
    } else {
        n = fr_prompt(w, &ns, tok, FR_MAXT);
    }
    m = fr_walk(w, ns, tok, n, path);
    if (m == n && w->T[path[n - 1]].end && w->T[path[n - 1]].pins > 0) node = path[n - 1];
    fuzz_note("unpin ns %d n %d: %s", ns, n, node >= 0 ? "pinned" : "not pinned");
    FUZZ_RES(kvc_radix_unpin(w->tree, w->ns[ns], tok, n), node >= 0 ? KVC_OK : KVC_ERR_NOT_FOUND);
    if (node < 0) return;
    w->T[node].pins--;
    if (j < 0) /* the same pin from our list, if it is there */
        for (j = 0; j < w->n_pins; ++j)
            if (w->pins[j].ns == ns && w->pins[j].n == n && !memcmp(w->pins[j].tok, tok, sizeof(int32_t) * (size_t)n))
                break;
    if (j < w->n_pins) w->pins[j] = w->pins[--w->n_pins];
}

static void fr_evict(fr_world *w) {
    int32_t want = fuzz_int(&w->in, 0, 6), freed = -1, before = fr_pages_used(w);
    kvc_radix_stats s;
    uint64_t n;
    FUZZ_RES(kvc_radix_evict(w->tree, want, &freed), KVC_OK);
    s = fr_stats(w);
    n = s.entries_evicted - w->rs.entries_evicted;
    fuzz_note("evict %d pages: %d freed, %llu entries", want, freed, (unsigned long long)n);
    fr_replay_evictions(w, n, "kvc_radix_evict");
    FUZZ_CHECK(freed == before - fr_pages_used(w), "evict says %d pages freed, the pool has %d fewer in use", freed,
             before - fr_pages_used(w));
    FUZZ_CHECK(want > 0 || n == 0, "evict of 0 pages evicted %llu entries", (unsigned long long)n);
    FUZZ_CHECK(freed >= want || fr_lru(w, 0) < 0, "evict stopped at %d of %d pages with leaves left to evict", freed,
             want);
}

/* an unrelated cache takes pages (so a kvc_begin evicts), or one gives them back */
static void fr_hog(fr_world *w) {
    kvc_cache_config cc;
    kvc_cache *h = NULL;
    int32_t n = fuzz_int(&w->in, 1, 24), l;
    if (w->n_hogs > 0 && fuzz_int(&w->in, 0, 1)) {
        fuzz_note("hog destroyed");
        FUZZ_RES(kvc_cache_destroy(w->hogs[--w->n_hogs]), KVC_OK);
        return;
    }
    if (w->n_hogs == FR_HOGS) return;
    fuzz_note("hog of %d tokens", n);
    kvc_cache_config_init(&cc, KVC_KIND_FULL);
    FUZZ_RES(kvc_cache_create(w->pool, &cc, &h), KVC_OK);
    if (fr_begin(w, h, n) != KVC_OK) {
        FUZZ_RES(kvc_cache_destroy(h), KVC_OK);
        return;
    }
    memset(w->k, 0, sizeof(w->k));
    memset(w->v, 0, sizeof(w->v));
    for (l = 0; l < w->layers; ++l) FUZZ_RES(kvc_put(h, l, w->k, w->v), KVC_OK);
    w->hogs[w->n_hogs++] = h;
}

/* release, destroy or clear: the entry is no longer in use */
static void fr_let_go(fr_world *w, int i) {
    fr_live *c = &w->live[i];
    int how = fuzz_int(&w->in, 0, 2);
    fuzz_note("%s slot %d", how == 0 ? "release" : how == 1 ? "destroy" : "clear", i);
    if (how == 0) {
        FUZZ_RES(kvc_radix_release(c->h), KVC_OK);
        fr_lease(w, c, -1);
    } else if (how == 1) {
        fr_drop(w, i);
    } else {
        FUZZ_RES(kvc_cache_clear(c->h), KVC_OK);
        fr_lease(w, c, -1);
        c->off = c->bb = c->rel = c->n_plan = 0;
    }
}

/* a live rewind (the entry stays in use); what comes next is new */
static void fr_rewind(fr_world *w, int i) {
    fr_live *c = &w->live[i];
    int32_t target = fuzz_int(&w->in, 0, c->off);
    int same = fr_rot(w) && target == c->off;
    kvc_result want = same ? KVC_OK : fr_wrapped(w, c) && target > 0 ? KVC_ERR_UNREACHABLE : KVC_OK; /* 0: clearing */
    fuzz_note("rewind slot %d to %d (offset %d)", i, target, c->off);
    FUZZ_RES(kvc_cache_restore(c->h, NULL, target), want);
    if (want != KVC_OK || same) return;
    c->off = c->n_plan = target;
    c->bb = target > 0 ? target - 1 : 0;
    if (target == 0) c->rel = 0;
}

/* Save an entry to memory and load it back, pinned or not. The save needs the whole
   entry usable (as a lookup of it + 1 token would reuse all of it); the load reads its
   pages into free pool pages (it never evicts) and commits the same tokens from a cache
   holding them, which then goes. */
static void fr_save_load(fr_world *w) {
    int32_t tok[FR_MAXT], n, got = -1, need = 0, lp, free_pages;
    int path[FR_MAXT], ns, pin = fuzz_int(&w->in, 0, 1), whole, at;
    kvc_mem mem;
    kvc_io io;
    kvc_pool_stats ps;
    kvc_result r;
    fr_live ld; /* the loaded cache: offset n, anchor n - 1, as a lookup would make it */
    n = fr_prompt(w, &ns, tok, FR_MAXT);
    if (fuzz_int(&w->in, 0, 1)) n = fuzz_int(&w->in, 1, n);
    whole = fr_walk(w, ns, tok, n, path) == n && fr_usable(w, path, n) == n;
    memset(&ld, 0, sizeof(ld));
    ld.off = n;
    ld.bb = n - 1;
    for (lp = 0; lp * w->pc < n; ++lp) need += fr_held(w, &ld, lp);
    FUZZ_RES(kvc_pool_stats_get(w->pool, &ps), KVC_OK);
    free_pages = ps.pages_total - ps.pages_used;
    fuzz_note("save ns %d n %d (%s), load%s: %d pages, %d free", ns, n, whole ? "held" : "not held",
            pin ? " pinned" : "", need, free_pages);
    memset(&mem, 0, sizeof(mem));
    mem.data = w->saved;
    mem.capacity = sizeof(w->saved);
    FUZZ_RES(kvc_io_memory(&mem, &io), KVC_OK);
    FUZZ_RES(kvc_radix_save(w->tree, w->ns[ns], tok, n, &io), whole ? KVC_OK : KVC_ERR_NOT_FOUND);
    /* a load that lacks free pages evicts entries (maybe this one) first: fuzz_load covers it */
    if (!whole || need > free_pages) return;
    mem.pos = 0;
    r = kvc_radix_load(w->tree, w->ns[ns], &io, pin, &got);
    FUZZ_RES(r, KVC_OK);
    FUZZ_CHECK(got == n, "loaded %d tokens, saved %d", got, n);
    if (w->max_entries > 0 || pin) w->T[path[n - 1]].end = 1; /* the split commit makes */
    at = fr_node_end(w, path[n - 1]);
    if (fr_rot(w)) fr_fill_holes(w, &ld, path, n, at);
    fr_touch(w, at);
    if (w->T[at].pos + 1 == n) w->T[at].entry_tick = w->clock;
    if (pin) {
        w->T[at].pins++;
        if (w->n_pins < FR_PINS) {
            fr_seq *q = &w->pins[w->n_pins++];
            q->ns = ns;
            q->n = n;
            memcpy(q->tok, tok, sizeof(int32_t) * (size_t)n);
        }
    }
    w->rs.commits++;
    fr_trim(w);
}

/* calls that must fail and change nothing (checked by the step's checks) */
static void fr_bad(fr_world *w) {
    int32_t t[2] = {0, 1}, reused = -1, leases = 0;
    int k = fuzz_int(&w->in, 0, 7), i = fuzz_int(&w->in, 0, FR_LIVE - 1);
    kvc_cache *h = NULL;
    fuzz_note("bad call %d", k);
    for (; i < FR_LIVE && w->live[i].h == NULL; ++i) {}
    if (k == 0) FUZZ_RES(kvc_radix_lookup(w->tree, w->ns[0], t, -1, &h, &reused), KVC_ERR_INVALID);
    else if (k == 1) FUZZ_RES(kvc_radix_lookup(w->tree, w->ns[0], NULL, 2, &h, &reused), KVC_ERR_NULL);
    else if (k == 2) FUZZ_RES(kvc_radix_evict(w->tree, -1, NULL), KVC_ERR_INVALID);
    else if (k == 3) {
        FUZZ_RES(kvc_radix_pin(w->tree, w->ns[0], t, 0), KVC_ERR_INVALID);
        FUZZ_RES(kvc_radix_unpin(w->tree, w->ns[0], NULL, 1), KVC_ERR_NULL);
    } else if (k == 4) { /* a cache of another configuration */
        kvc_cache_config cc;
        kvc_cache_config_init(&cc, fr_rot(w) ? KVC_KIND_FULL : KVC_KIND_ROTATING);
        if (!fr_rot(w)) cc.window = 4;
        FUZZ_RES(kvc_cache_create(w->pool, &cc, &h), KVC_OK);
        FUZZ_RES(kvc_radix_commit(w->tree, w->ns[0], h, t, 0, 0), KVC_ERR_INVALID);
        FUZZ_RES(kvc_cache_destroy(h), KVC_OK);
    } else if (i < FR_LIVE && k == 5) { /* a batch open: commit refuses; then it is cancelled */
        fr_live *c = &w->live[i];
        int32_t o = c->off;
        if (o >= FR_MAXT || fr_begin(w, c->h, 1) != KVC_OK) return;
        if (fr_begin_releases(w, o)) c->rel = 1;
        FUZZ_RES(kvc_radix_commit(w->tree, w->ns[c->ns], c->h, c->tok, o, 0), KVC_ERR_STATE);
        FUZZ_RES(kvc_radix_commit(w->tree, w->ns[c->ns], c->h, NULL, 1, 0), KVC_ERR_NULL);
        FUZZ_RES(kvc_radix_commit(w->tree, w->ns[c->ns], c->h, c->tok, -1, 0), KVC_ERR_INVALID);
        FUZZ_RES(kvc_cancel(c->h), KVC_OK);
        c->bb = o; /* a cancel anchors the window at the batch start */
    } else if (k == 6) { /* destroy the tree: refused while an entry is in use */
        kvc_radix_config rc;
        for (i = 0; i < FR_LIVE; ++i) leases += w->live[i].h != NULL && w->live[i].lease >= 0;
        FUZZ_RES(kvc_radix_destroy(w->tree), leases ? KVC_ERR_BUSY : KVC_OK);
        if (leases) return;
        kvc_radix_config_init(&rc, w->kind);
        rc.cache.window = w->W;
        rc.cache.sinks = w->S;
        rc.max_entries = w->max_entries = fuzz_int(&w->in, 0, 3);
        FUZZ_RES(kvc_radix_create(w->pool, &rc, &w->tree), KVC_OK);
        fuzz_note("new tree, max_entries %d", w->max_entries);
        w->hw = w->n_free = w->n_pins = w->n_seqs = w->seq_next = 0;
        w->root_child = -1;
        w->clock = 0;
        memset(&w->rs, 0, sizeof(w->rs));
    } else {
        FUZZ_RES(kvc_radix_stats_get(w->tree, NULL), KVC_ERR_NULL);
        FUZZ_RES(kvc_radix_release(NULL), KVC_ERR_NULL);
    }
}

/* one operation on slot i (the ops that need no cache ignore it) */
static void fr_op(fr_world *w, unsigned op, int i) {
    fr_live *c = &w->live[i];
    if (op < 4) fr_lookup(w, i, -1);
    else if (op < 7 && c->h != NULL) {
        int32_t k = fuzz_int(&w->in, 1, 12);
        fuzz_note("evaluate %d tokens in slot %d (offset %d)", k, i, c->off);
        fr_eval(w, i, k);
    } else if (op < 9 && c->h != NULL) fr_commit(w, i, -1);
    else if (op == 9 && c->h != NULL) fr_let_go(w, i);
    else if (op == 10) fr_pin(w, -1);
    else if (op == 11) fr_unpin(w);
    else if (op == 12) fr_evict(w);
    else if (op == 13) fr_hog(w);
    else if (op == 14) { /* an allocation refused inside a call that allocates */
        int what = fuzz_int(&w->in, 0, 2), fail = fuzz_int(&w->in, 0, 1);
        if (what == 0 && c->h != NULL) fr_commit(w, i, fail);
        else if (what == 1) fr_lookup(w, i, 0);
        else fr_pin(w, 0);
    } else if (op == 15) {
        int what = fuzz_int(&w->in, 0, 2);
        if (what == 0 && c->h != NULL) fr_rewind(w, i);
        else if (what == 1) fr_save_load(w);
        else fr_bad(w);
    }
}

/* ---- one input ----------------------------------------------------------------------------- */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fr_world *w = &fr_the_world;
    kvc_pool_config cfg;
    kvc_radix_config rc;
    kvc_pool_stats st;
    int32_t pages;
    size_t page_bytes;
    int i;
    memset(w, 0, offsetof(fr_world, T)); /* the trie is reset by hw / n_free */
    w->in.p = data;
    w->in.n = size;
    w->fail_at = -1;
    w->root_child = -1;
    for (i = 0; i < FR_LIVE; ++i) w->live[i].lease = -1;
    fuzz_log_reset();
    kvc_pool_config_init(&cfg);
    w->layers = cfg.n_layers = fuzz_int(&w->in, 1, FR_LAYERS);
    cfg.n_kv_heads = 1;
    cfg.head_dim_k = FR_HK;
    cfg.head_dim_v = FR_HV;
    i = (int)fuzz_byte(&w->in);
    cfg.type_k = i & 1 ? KVC_TYPE_F16 : KVC_TYPE_F32;
    cfg.type_v = i & 2 ? KVC_TYPE_F16 : KVC_TYPE_F32;
    w->pc = cfg.page_cells = fuzz_int(&w->in, 1, 8);
    pages = i & 4 ? 400 : fuzz_int(&w->in, 2, 64);
    FUZZ_RES(kvc_pool_page_bytes(&cfg, &page_bytes), KVC_OK);
    cfg.budget_bytes = (size_t)pages * page_bytes;
    cfg.runtime.allocator.alloc = fr_alloc;
    cfg.runtime.allocator.free = fr_free;
    cfg.runtime.allocator.user = w;
    FUZZ_RES(kvc_pool_create(&cfg, &w->pool), KVC_OK);
    FUZZ_RES(kvc_pool_stats_get(w->pool, &st), KVC_OK);
    FUZZ_CHECK(st.pages_total == pages, "the budget gives %d pages, wanted %d", st.pages_total, pages);
    i = (int)fuzz_byte(&w->in);
    w->kind = i % 3 == 0 ? KVC_KIND_ROTATING : KVC_KIND_FULL;
    kvc_radix_config_init(&rc, w->kind);
    if (w->kind == KVC_KIND_ROTATING) {
        w->W = rc.cache.window = fuzz_int(&w->in, 1, 16);
        w->S = rc.cache.sinks = i & 0x80 ? fuzz_int(&w->in, 0, w->W - 1) : 0;
    }
    w->max_entries = rc.max_entries = (i >> 2) % 8 < 5 ? 0 : (i >> 2) % 8 - 4;
    w->alphabet = fuzz_int(&w->in, 2, 6);
    w->ns[1].salt = 5; /* the same model as 0, another tenant */
    w->ns[2].model = 2;
    FUZZ_RES(kvc_radix_create(w->pool, &rc, &w->tree), KVC_OK);
    fuzz_note("%s tree W %d S %d max_entries %d, page_cells %d, %d pages, %d layers, alphabet %d",
            fr_rot(w) ? "ROTATING" : "FULL", w->W, w->S, w->max_entries, w->pc, pages, w->layers, w->alphabet);
    for (fuzz_step = 0; fuzz_step < FR_STEPS && w->in.i < w->in.n; ++fuzz_step) {
        unsigned op = fuzz_byte(&w->in) % 16;
        int slot = fuzz_int(&w->in, 0, FR_LIVE - 1);
        fr_op(w, op, slot);
#ifdef FR_DEBUG_HOOK /* a debugging build may #define it to dump the library's tree and the trie */
        FR_DEBUG_HOOK(w);
#endif
        fr_check_step(w, slot);
    }
    for (i = 0; i < FR_LIVE; ++i)
        if (w->live[i].h != NULL) fr_check_cache(w, i);
    /* teardown: destroy refuses while an entry is in use; afterwards nothing is left */
    for (i = 0; i < FR_LIVE; ++i)
        if (w->live[i].h != NULL && w->live[i].lease >= 0) {
            FUZZ_RES(kvc_radix_destroy(w->tree), KVC_ERR_BUSY);
            break;
        }
    for (i = 0; i < FR_LIVE; ++i)
        if (w->live[i].h != NULL) fr_drop(w, i);
    while (w->n_hogs > 0) FUZZ_RES(kvc_cache_destroy(w->hogs[--w->n_hogs]), KVC_OK);
    FUZZ_RES(kvc_radix_destroy(w->tree), KVC_OK);
    FUZZ_RES(kvc_pool_stats_get(w->pool, &st), KVC_OK);
    FUZZ_CHECK(st.pages_used == 0 && st.live_caches == 0 && st.live_prefixes == 0,
             "after teardown: %d pages, %d caches, %d prefixes", st.pages_used, st.live_caches, st.live_prefixes);
    FUZZ_RES(kvc_pool_destroy(w->pool), KVC_OK);
    FUZZ_CHECK(w->live_blocks == 0, "%ld blocks still allocated", w->live_blocks);
    return 0;
}
