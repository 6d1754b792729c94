/* fuzz_load.c - libFuzzer target for the loaders of kvcache.h (Layer 7).

   Each input is given to every loader: kvc_cache_load into a FULL, a ROTATING, a
   CAUSAL and a RECURRENT cache, kvc_seq_load into the CAUSAL cache and kvc_radix_load
   into a FULL and a ROTATING prefix tree, all holding contents of their own (tests/load_fixture.h, the same world
   `test_persist --write-corpus` saved the corpus fuzz/corpus/load/ from). Then
   once more with every section's checksum recomputed, so that the checks behind the
   checksums (lengths, window states, cell indices, positions, sequence sets) are
   reached as an attacker who can write checksums would reach them.
   A load that fails must leave its target exactly as it was (fingerprint of every held
   cell, pool pages, tree statistics) and the caller's token array untouched, and must
   not have asked the allocator for more than the input could justify (a declared size
   allocated before its bytes were read: the crafted ROTATING entry of issue 23 in the
   corpus); a load that succeeds must leave a cache that the next batch, the views and
   attention can use. Any breach aborts; so does a page leak (kvc_pool_destroy asserts
   that every page came back).

   Build: clang -g -O1 -fsanitize=fuzzer,address,undefined -I. fuzz/fuzz_load.c -o fuzz_load -lm
   Run:   ./fuzz_load -max_total_time=60 fuzz/corpus/load */
#define KVCACHE_IMPLEMENTATION
#include "../kvcache.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../tests/load_fixture.h"
#include "../tests/format_bytes.h"

static void must(int cond) {
    if (!cond) abort();
}

typedef struct world_state {
    uint64_t fp;
    int32_t pages;
    kvc_radix_stats tree, rtree;
} world_state;

static world_state state_of(const lf_world *w, const kvc_cache *target) {
    world_state s;
    kvc_pool_stats ps;
    memset(&s, 0, sizeof(s));
    s.fp = target != NULL ? lf_fingerprint(target) : 0;
    kvc_pool_stats_get(w->pool, &ps);
    s.pages = ps.pages_used;
    kvc_pool_stats_get(w->spool, &ps);
    s.pages += ps.pages_used;
    kvc_radix_stats_get(w->tree, &s.tree);
    kvc_radix_stats_get(w->rtree, &s.rtree);
    return s;
}

/* A load takes its staging pages as any allocation does, evicting unused entries first
   when the pool is short: a failed load may have evicted (counted), nothing else. */
static int same_tree(const kvc_radix_stats *a, const kvc_radix_stats *b) {
    if (a->commits != b->commits || a->n_pinned != b->n_pinned) return 0;
    return a->entries_evicted != b->entries_evicted || (a->n_nodes == b->n_nodes && a->n_pages == b->n_pages);
}

static int same(const world_state *a, const world_state *b) {
    int evicted = a->tree.entries_evicted != b->tree.entries_evicted || a->rtree.entries_evicted != b->rtree.entries_evicted;
    return a->fp == b->fp && (evicted || a->pages == b->pages) && same_tree(&a->tree, &b->tree) &&
           same_tree(&a->rtree, &b->rtree);
}

/* A loaded FULL/ROTATING cache works: views, attention, one more batch. */
static void use_linear(kvc_cache *c) {
    static float k[512 * LF_HEADS * LF_HK], v[512 * LF_HEADS * LF_HV];
    float q[LF_HEADS * LF_HK], out[LF_HEADS * LF_HV];
    static int32_t pos[512];
    int32_t n = 0, off = 0, l;
    kvc_attention_desc a;
    memset(q, 0, sizeof(q));
    memset(&a, 0, sizeof(a));
    must(kvc_cache_offset(c, &off) == KVC_OK);
    for (l = 0; l < LF_LAYERS; ++l) must(kvc_cache_gather(c, l, k, v, pos, 512, &n) == KVC_OK);
    if (off > 0) {
        a.n_queries = 1;
        a.n_heads = LF_HEADS;
        a.q = q;
        a.out = out;
        must(kvc_attention(c, 0, &a) == KVC_OK);
    }
    if (off < 1000) {
        kvc_result r = lf_append(c, 2, 2, 9);
        must(r == KVC_OK || r == KVC_ERR_FULL);
        if (r != KVC_OK) kvc_cancel(c);
    }
}

static void use_causal(kvc_cache *c) {
    static float mask[64 * 64];
    int32_t rows, cols, first;
    kvc_result r = lf_causal_append(c, 2, 1000, 2, 9);
    must(r == KVC_OK || r == KVC_ERR_FULL);
    if (r == KVC_OK) must(kvc_mask_export(c, 1, mask, 64 * 64, &rows, &cols, &first) == KVC_OK);
}

static void use_recurrent(kvc_cache *c) {
    const float *st = NULL;
    int32_t off = 0;
    kvc_result r;
    must(kvc_cache_offset(c, &off) == KVC_OK);
    must(kvc_state_read(c, 0, 0, &st) == KVC_OK);
    r = lf_rec_append(c, 1, 0, 2, 9);
    must(r == KVC_OK || r == KVC_ERR_FULL || r == KVC_ERR_RANGE);
    if (r != KVC_OK) kvc_cancel(c);
}

static void use_tree(kvc_radix *t, int32_t first) {
    int32_t tok[24], i, reused;
    kvc_cache *c = NULL;
    for (i = 0; i < 24; ++i) tok[i] = first + i;
    must(kvc_radix_lookup(t, LF_NS, tok, 24, &c, &reused) == KVC_OK);
    use_linear(c);
    kvc_cache_destroy(c);
}

/* The largest block a load asked the system allocator for: the pools' blocks are
   asked for by lf_make before any load, so a load's own asks are the ones above them. */
static size_t g_max_ask;
static void *count_alloc(size_t n, void *user) {
    (void)user;
    if (n > g_max_ask) g_max_ask = n;
    return malloc(n);
}

static void load_all(const uint8_t *data, size_t size) {
    lf_world w;
    int kind;
    must(lf_make(&w, KVC_TYPE_F16, KVC_TYPE_F32, 1));
    /* from here on the pools' objects come from a counting allocator (pools keep the
       allocator of their creation: swap it in place, as the library resolved it) */
    w.pool->alloc.alloc = count_alloc;
    w.spool->alloc.alloc = count_alloc;
    for (kind = 0; kind < 7; ++kind) {
        kvc_cache *target = kind == 0 ? w.full : kind == 1 ? w.rot : kind == 4 || kind == 5 ? NULL
                          : kind == 6 ? w.rec : w.causal;
        world_state before = state_of(&w, target), after;
        int32_t tokens[64], n_tokens = -1, i;
        kvc_mem m;
        kvc_io io;
        kvc_result r;
        memset(&m, 0, sizeof(m));
        m.data = (unsigned char *)(uintptr_t)data; /* only read */
        m.size = m.capacity = size;
        kvc_io_memory(&m, &io);
        for (i = 0; i < 64; ++i) tokens[i] = -2 - i;
        g_max_ask = 0;
        if (kind < 3 || kind == 6) r = kvc_cache_load(target, LF_NS, &io, tokens, 64, &n_tokens);
        else if (kind == 3) r = kvc_seq_load(target, 2, LF_NS, &io, tokens, 64, &n_tokens);
        else r = kvc_radix_load(kind == 4 ? w.tree : w.rtree, LF_NS, &io, (int)(size & 1), &n_tokens);
        after = state_of(&w, target);
        /* a load allocates its cache (the tree's), its staging page list and tokens as
           they arrive (4 KiB, then twice what was read): bounded by the input */
        must(g_max_ask <= 65536 + 2 * size);
        if (r != KVC_OK) {
            must(same(&before, &after));
            for (i = 0; i < 64; ++i) must(tokens[i] == -2 - i);
            must(n_tokens == -1 || r == KVC_ERR_RANGE);
            continue;
        }
        must(n_tokens >= 0);
        if (kind < 2) use_linear(target);
        else if (kind < 4) use_causal(target);
        else if (kind == 6) use_recurrent(target);
        else use_tree(kind == 4 ? w.tree : w.rtree, kind == 4 ? 100 : 200);
    }
    lf_free(&w); /* asserts that every page came back */
}


int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint8_t *fixed;
    load_all(data, size);
    if (size < 16) return 0;
    fixed = (uint8_t *)malloc(size);
    must(fixed != NULL);
    memcpy(fixed, data, size);
    tk_fix_checksums(fixed, size);
    load_all(fixed, size);
    free(fixed);
    return 0;
}
