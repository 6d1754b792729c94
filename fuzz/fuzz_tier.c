/* fuzz_tier.c - libFuzzer target for the way up from a store (kvc_tier_fetch, Layer 9).

   The input is a blob a store hands back: byte 0 picks the key it is stored under (the
   prefix of 1 to 4 blocks of this target's prompt) and whether every complete section's
   checksum is recomputed first (so the checks behind the checksums -- the token section
   against the prompt, the configuration, lengths, page contents -- are reached as by an
   attacker who can write checksums); the rest is the blob. A pool tree (FULL, f16, 4
   cells a page, blocks of 4 tokens) that already holds another conversation fetches the
   prompt through a store of one blob, then:
     - the fetch returns KVC_OK (a bad blob is refused, never an error of the request);
     - nothing fetched: the tree, the pool's pages and the other conversation exactly as
       before, the blob counted as refused (every key of the prompt is probed);
     - something fetched: a whole number of blocks, at most the key's, the tokens of the
       prompt (the lookup reuses them), and a cache that views, attention and one more
       batch can use;
     - after the tree is destroyed every page is back.
   Any breach aborts. The seed corpus fuzz/corpus/tier/ is the blobs this target's world
   publishes (1 to 4 blocks; an f32 pool's, foreign) and damaged and truncated ones,
   written by a build with -DFUZZ_TIER_MAIN: ./fuzz_tier_seeds fuzz/corpus/tier.

   Build: clang -g -O1 -fsanitize=fuzzer,address,undefined -I. fuzz/fuzz_tier.c -o fuzz_tier -lm
   Run:   ./fuzz_tier -max_total_time=60 fuzz/corpus/tier */
#define KVCACHE_IMPLEMENTATION
#include "../kvcache.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "../tests/format_bytes.h"

#define FT_CELLS 4 /* a page, and a block */
#define FT_HD 8
#define FT_PROMPT (4 * FT_CELLS + 1)
static const kvc_namespace FT_NS = {0x7469657266757a7aull, 1};

/* the store: one blob under one key; puts (eviction under pressure) are taken and freed */
typedef struct ft_store {
    kvc_key key;
    const uint8_t *data;
    size_t size;
    long puts;
} ft_store;

static kvc_result ft_put(void *u, const kvc_key *k, const void *d, size_t n, int32_t ms) {
    (void)k, (void)d, (void)n, (void)ms;
    ((ft_store *)u)->puts++;
    return KVC_OK; /* kept nowhere: a later get does not find it */
}
static kvc_result ft_exists(void *u, const kvc_key *k, size_t *n, int32_t ms) {
    ft_store *s = (ft_store *)u;
    (void)ms;
    if (memcmp(k->bytes, s->key.bytes, 32) != 0) return KVC_ERR_NOT_FOUND;
    *n = s->size;
    return KVC_OK;
}
static kvc_result ft_get(void *u, const kvc_key *k, void *d, size_t cap, size_t *n, int32_t ms) {
    ft_store *s = (ft_store *)u;
    (void)ms;
    if (memcmp(k->bytes, s->key.bytes, 32) != 0) return KVC_ERR_NOT_FOUND;
    *n = s->size;
    if (s->size > cap) return KVC_ERR_RANGE;
    if (s->size > 0) memcpy(d, s->data, s->size);
    return KVC_OK;
}

typedef struct ft_world {
    kvc_pool *pool;
    kvc_radix *tree;
    ft_store store;
} ft_world;

static void ft_tokens(int32_t *t, int32_t n, int32_t first) {
    int32_t i;
    for (i = 0; i < n; ++i) t[i] = first + 7 * i;
}

/* n tokens of K/V (a value per token, layer and dim) into c from its offset */
static kvc_result ft_append(kvc_cache *c, int32_t n, int32_t seed) {
    float k[32 * FT_HD], v[32 * FT_HD];
    int32_t off = 0, i, l;
    kvc_result r;
    if (n > 32 || kvc_cache_offset(c, &off) != KVC_OK) return KVC_ERR_INVALID;
    if ((r = kvc_begin(c, n, NULL, 0)) != KVC_OK) return r;
    for (l = 0; l < 2; ++l) {
        for (i = 0; i < n * FT_HD; ++i) {
            k[i] = (float)((seed + off * 13 + i * 5 + l * 3) % 17) / 4.0f;
            v[i] = -k[i];
        }
        if ((r = kvc_put(c, l, k, v)) != KVC_OK) return r;
    }
    return KVC_OK;
}

/* A committed conversation of n tokens from `first` in the tree. */
static void ft_converse(kvc_radix *t, int32_t first, int32_t n, int32_t seed) {
    int32_t tok[64], reused = 0;
    kvc_cache *c = NULL;
    ft_tokens(tok, n, first);
    FUZZ_RES(kvc_radix_lookup(t, FT_NS, tok, n, &c, &reused), KVC_OK);
    FUZZ_RES(ft_append(c, n - reused, seed), KVC_OK);
    FUZZ_RES(kvc_radix_commit(t, FT_NS, c, tok, n, 0), KVC_OK);
    kvc_cache_destroy(c);
}

typedef kvc_result (*ft_put_fn)(void *, const kvc_key *, const void *, size_t, int32_t);

/* A pool (type f16 or f32) and its tree with a store tier over w->store (puts to `put`). */
static void ft_make(ft_world *w, kvc_type type, ft_put_fn put) {
    kvc_pool_config pc;
    kvc_radix_config rc;
    kvc_tier_config tc;
    memset(w, 0, sizeof(*w));
    kvc_pool_config_init(&pc);
    pc.n_layers = 2;
    pc.n_kv_heads = 1;
    pc.head_dim_k = pc.head_dim_v = FT_HD;
    pc.type_k = pc.type_v = type;
    pc.page_cells = FT_CELLS;
    pc.budget_bytes = 0;
    FUZZ_RES(kvc_pool_budget_for_tokens(&pc, 12 * FT_CELLS, &pc.budget_bytes), KVC_OK);
    FUZZ_RES(kvc_pool_create(&pc, &w->pool), KVC_OK);
    kvc_radix_config_init(&rc, KVC_KIND_FULL);
    FUZZ_RES(kvc_radix_create(w->pool, &rc, &w->tree), KVC_OK);
    kvc_tier_config_init(&tc);
    tc.block_tokens = FT_CELLS;
    tc.store.put = put;
    tc.store.exists = ft_exists;
    tc.store.get = ft_get;
    tc.store.user = &w->store;
    FUZZ_RES(kvc_tier_attach(w->tree, &tc), KVC_OK);
}

static void ft_free(ft_world *w) {
    kvc_pool_stats ps;
    FUZZ_RES(kvc_radix_destroy(w->tree), KVC_OK);
    FUZZ_RES(kvc_pool_stats_get(w->pool, &ps), KVC_OK);
    FUZZ_CHECK(ps.pages_used == 0, "%d pages left after the tree", (int)ps.pages_used);
    FUZZ_RES(kvc_pool_destroy(w->pool), KVC_OK);
}


/* The fetched entry's cache works: the lookup reuses what came back, views, attention
   and one more batch. */
static void ft_use(kvc_radix *t, const int32_t *tok, int32_t got) {
    static float k[64 * FT_HD], v[64 * FT_HD];
    static int32_t pos[64];
    float q[FT_HD], out[FT_HD];
    kvc_cache *c = NULL;
    kvc_attention_desc a;
    int32_t reused = -1, n = 0, l;
    kvc_result r;
    fuzz_note("lookup of the prompt after fetching %d tokens", (int)got);
    FUZZ_RES(kvc_radix_lookup(t, FT_NS, tok, FT_PROMPT, &c, &reused), KVC_OK);
    FUZZ_CHECK(reused == got, "the lookup reused %d of the %d fetched", (int)reused, (int)got);
    for (l = 0; l < 2; ++l) FUZZ_RES(kvc_cache_gather(c, l, k, v, pos, 64, &n), KVC_OK);
    FUZZ_CHECK(n == got, "%d cells gathered, %d fetched", (int)n, (int)got);
    memset(q, 0, sizeof(q));
    memset(&a, 0, sizeof(a));
    a.n_queries = 1;
    a.n_heads = 1;
    a.q = q;
    a.out = out;
    FUZZ_RES(kvc_attention(c, 0, &a), KVC_OK);
    r = ft_append(c, FT_PROMPT - got, 5);
    FUZZ_CHECK(r == KVC_OK || r == KVC_ERR_FULL, "one more batch: %s", kvc_strerror(r));
    if (r != KVC_OK) kvc_cancel(c);
    kvc_cache_destroy(c);
}

static void ft_fetch(const uint8_t *blob, size_t size, int32_t blocks) {
    ft_world w;
    kvc_radix_stats before, after;
    kvc_tier_stats ts;
    kvc_pool_stats pb, pa;
    int32_t tok[FT_PROMPT], got = -1, reused = -1;
    kvc_cache *c = NULL;
    ft_make(&w, KVC_TYPE_F16, ft_put);
    ft_converse(w.tree, 1000, 3 * FT_CELLS + 2, 11); /* another conversation the fetch must leave */
    ft_tokens(tok, FT_PROMPT, 1);
    FUZZ_RES(kvc_tier_key(w.tree, FT_NS, tok, blocks * FT_CELLS, &w.store.key), KVC_OK);
    w.store.data = blob;
    w.store.size = size;
    FUZZ_RES(kvc_radix_stats_get(w.tree, &before), KVC_OK);
    FUZZ_RES(kvc_pool_stats_get(w.pool, &pb), KVC_OK);
    fuzz_note("fetch: a blob of %lu bytes under the key of %d blocks", (unsigned long)size, (int)blocks);
    FUZZ_RES(kvc_tier_fetch(w.tree, FT_NS, tok, FT_PROMPT, &got), KVC_OK);
    FUZZ_RES(kvc_tier_stats_get(w.tree, &ts), KVC_OK);
    FUZZ_RES(kvc_radix_stats_get(w.tree, &after), KVC_OK);
    FUZZ_RES(kvc_pool_stats_get(w.pool, &pa), KVC_OK);
    if (got == 0) {
        FUZZ_CHECK(after.n_nodes == before.n_nodes && after.n_pages == before.n_pages &&
                       pa.pages_used == pb.pages_used && after.entries_evicted == before.entries_evicted,
                   "a refused blob changed the tree or pool");
        FUZZ_CHECK(ts.refused + ts.store_errors == 1 || size == 0, "refused %d, store errors %d",
                   (int)ts.refused, (int)ts.store_errors);
    } else {
        FUZZ_CHECK(got == blocks * FT_CELLS, "fetched %d tokens under the key of %d", (int)got,
                   (int)(blocks * FT_CELLS));
        FUZZ_CHECK(ts.fetched_store == 1 && ts.refused == 0, "a fetch counted %d, refused %d",
                   (int)ts.fetched_store, (int)ts.refused);
        ft_use(w.tree, tok, got);
    }
    /* the other conversation is still served, whole */
    ft_tokens(tok, 3 * FT_CELLS + 2, 1000);
    FUZZ_RES(kvc_radix_lookup(w.tree, FT_NS, tok, 3 * FT_CELLS + 2, &c, &reused), KVC_OK);
    FUZZ_CHECK(reused == 3 * FT_CELLS + 1 || after.entries_evicted != before.entries_evicted,
               "the other conversation: %d reused", (int)reused);
    kvc_cache_destroy(c);
    ft_free(&w);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const int32_t blocks = size > 0 ? 1 + (data[0] & 3) : 1;
    uint8_t *blob;
    fuzz_log_reset();
    if (size <= 1) {
        ft_fetch(data, 0, blocks);
        return 0;
    }
    blob = (uint8_t *)malloc(size - 1);
    FUZZ_CHECK(blob != NULL, "out of memory");
    memcpy(blob, data + 1, size - 1);
    if (data[0] & 4) tk_fix_checksums(blob, size - 1);
    ft_fetch(blob, size - 1, blocks);
    free(blob);
    return 0;
}

#ifdef FUZZ_TIER_MAIN
/* The seed corpus: the blobs this world publishes, one more from an f32 pool (foreign),
   and damaged and truncated copies; each file is the mode byte, then the blob. */
static uint8_t g_seed[1 << 16];
static size_t g_seed_size;
static kvc_result seed_put(void *u, const kvc_key *k, const void *d, size_t n, int32_t ms) {
    (void)u, (void)k, (void)ms;
    if (n > sizeof(g_seed)) return KVC_ERR_RANGE;
    memcpy(g_seed, d, n);
    g_seed_size = n;
    return KVC_OK;
}
static void seed_write(const char *dir, const char *name, int mode, const uint8_t *d, size_t n) {
    char path[512];
    FILE *f;
    unsigned char m = (unsigned char)mode;
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    f = fopen(path, "wb");
    FUZZ_CHECK(f != NULL && fwrite(&m, 1, 1, f) == 1 && fwrite(d, 1, n, f) == n && fclose(f) == 0,
               "cannot write %s", path);
}
/* the blob of `blocks` blocks of the prompt, from a pool of `type` */
static void seed_blob(kvc_type type, int32_t blocks) {
    ft_world w;
    int32_t tok[FT_PROMPT], pub = 0;
    ft_make(&w, type, seed_put);
    ft_converse(w.tree, 1, blocks * FT_CELLS + 1, 3);
    ft_tokens(tok, FT_PROMPT, 1);
    FUZZ_RES(kvc_tier_publish(w.tree, FT_NS, tok, blocks * FT_CELLS + 1, &pub), KVC_OK);
    FUZZ_CHECK(pub == blocks * FT_CELLS, "published %d", (int)pub);
    ft_free(&w);
}
int main(int argc, char **argv) {
    char name[64];
    int32_t b;
    if (argc != 2) {
        fprintf(stderr, "usage: %s DIR (writes the seed corpus of fuzz_tier)\n", argv[0]);
        return 2;
    }
    for (b = 1; b <= 4; ++b) {
        seed_blob(KVC_TYPE_F16, b);
        snprintf(name, sizeof(name), "blocks%d.kvc", (int)b);
        seed_write(argv[1], name, b - 1, g_seed, g_seed_size);
        if (b == 3) { /* under another key: other tokens */
            seed_write(argv[1], "other-key.kvc", 0, g_seed, g_seed_size);
            g_seed[g_seed_size / 2] ^= 0x40;
            seed_write(argv[1], "damaged.kvc", b - 1, g_seed, g_seed_size);
            seed_write(argv[1], "damaged-checksums-fixed.kvc", (b - 1) | 4, g_seed, g_seed_size);
            seed_write(argv[1], "truncated.kvc", b - 1, g_seed, g_seed_size - 9);
        }
    }
    seed_blob(KVC_TYPE_F32, 2);
    seed_write(argv[1], "foreign-f32.kvc", 1, g_seed, g_seed_size);
    return 0;
}
#endif
