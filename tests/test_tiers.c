/* test_tiers.c - tiers under the prefix tree (kvc_tier_*): SHA-256 against its published
   vectors, the key chain rebuilt byte by byte from docs/format.md's fingerprint, then
   real parts -- pools, trees and the directory store in a fresh temporary directory:
     - eviction moves an entry down (host tier, store) and kvc_tier_fetch brings it back
       bit for bit (the entry's saved bytes before eviction equal those after the fetch,
       and every cell reads back the K/V written for its prefix), for f32, f16 and q8_0;
     - a second pool and tree of the same configuration ("another process") finds what
       the first evicted or published, through the directory alone;
     - damaged (bytes flipped), truncated, foreign (another type), other-token and
       wrong-kind blobs are refused whole: the tree and pool stay as they were;
     - the host tier's byte budget is never exceeded (oldest blobs spill to the store);
     - a store whose every call fails costs a recompute, no error; one that hangs costs
       a request at most one timeout (one call), however many entries go down or probes
       a fetch makes;
     - every allocation failing in turn during eviction and fetch: no crash, no leak,
       and what is found is right.
   Usage: test_tiers [seed]. KVC_TEST_SCALE scales the random rounds. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include <dirent.h>

#include "count_alloc.h"
#define KVCACHE_IMPLEMENTATION
#include "../kvcache.h"
#include "tk.h"

/* ---- SHA-256 ------------------------------------------------------------------------ */

static void hex_of(const unsigned char *b, char *out) {
    kvc_key k;
    memcpy(k.bytes, b, 32);
    kvc_key_hex(&k, out);
}

static void test_sha256(void) {
    static const struct { const char *msg; int repeat_a; const char *hex; } v[] = {
        {"", 0, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
        {"abc", 0, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
        {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq", 0,
         "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
        {"abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu",
         0, "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1"},
        /* the padding's edges: 55, 56, 63, 64, 65 bytes of 'a' */
        {NULL, 55, "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318"},
        {NULL, 56, "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a"},
        {NULL, 63, "7d3e74a05d7db15bce4ad9ec0658ea98e3f06eeecf16b4c6fff2da457ddc2f34"},
        {NULL, 64, "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb"},
        {NULL, 65, "635361c48bb9eab14198e76ea8ab7f1a41685d6ad62aa9146d301d4f17eb0ae0"},
        {NULL, 1000000, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"},
    };
    unsigned char out[32];
    char hex[65];
    size_t i;
    char *a = (char *)malloc(1000000);
    memset(a, 'a', 1000000);
    for (i = 0; i < sizeof(v) / sizeof(v[0]); ++i) {
        const char *m = v[i].msg ? v[i].msg : a;
        size_t n = v[i].msg ? strlen(v[i].msg) : (size_t)v[i].repeat_a;
        TK_OK(kvc_sha256(m, n, out));
        hex_of(out, hex);
        if (strcmp(hex, v[i].hex) != 0) fprintf(stderr, "sha256 vector %d: %s\n", (int)i, hex);
        TK_CHECK(strcmp(hex, v[i].hex) == 0);
    }
    free(a);
    TK_RES(kvc_sha256(NULL, 1, out), KVC_ERR_NULL);
    TK_OK(kvc_sha256(NULL, 0, out));
}

/* ---- pools, trees, values ----------------------------------------------------------- */

#define LAYERS 2
#define HEADS 2
#define HD 32
#define PC 4      /* page cells = block tokens by default */
#define MAXT 64

static const kvc_namespace NS = {0x1234, 5};

/* The K/V of the token at position p: a function of tokens[0 .. p] (as a model's), small
   integers that every type tested stores exactly enough to tell prefixes apart. */
static uint32_t prefix_hash(const int32_t *tokens, int32_t p) {
    uint32_t h = 2166136261u;
    int32_t i;
    for (i = 0; i <= p; ++i) h = (h ^ (uint32_t)tokens[i]) * 16777619u;
    return h;
}
static float val(uint32_t h, int kv, int layer, int head, int dim) {
    return (float)((int32_t)((h + (uint32_t)(kv * 523 + layer * 131 + head * 37 + dim * 3)) % 64u) - 32);
}

static kvc_result extend(kvc_cache *c, const int32_t *tokens, int32_t from, int32_t to) {
    static float k[MAXT * HEADS * HD], v[MAXT * HEADS * HD];
    int32_t l, p, h, d;
    kvc_result r;
    if (to <= from) return KVC_OK;
    if ((r = kvc_begin(c, to - from, NULL, 0)) != KVC_OK) return r;
    for (l = 0; l < LAYERS; ++l) {
        for (p = from; p < to; ++p) {
            uint32_t hash = prefix_hash(tokens, p);
            for (h = 0; h < HEADS; ++h)
                for (d = 0; d < HD; ++d) {
                    k[((p - from) * HEADS + h) * HD + d] = val(hash, 0, l, h, d);
                    v[((p - from) * HEADS + h) * HD + d] = val(hash, 1, l, h, d);
                }
        }
        if ((r = kvc_put(c, l, k, v)) != KVC_OK) return r;
    }
    return KVC_OK;
}

/* Cells whose K/V differ from what their prefix wrote (f32/f16 exact; q8_0 within a
   quantization step of the block's scale). */
static int wrong_cells(const kvc_cache *c, const int32_t *tokens, kvc_type type) {
    static float k[MAXT * HEADS * HD], v[MAXT * HEADS * HD];
    static int32_t pos[MAXT];
    int32_t l, n, i, h, d, bad = 0;
    float tol = type == KVC_TYPE_Q8_0 ? 0.2f : 0.0f;
    for (l = 0; l < LAYERS; ++l) {
        if (kvc_cache_gather(c, l, k, v, pos, MAXT, &n) != KVC_OK) return -1;
        for (i = 0; i < n; ++i) {
            uint32_t hash = prefix_hash(tokens, pos[i]);
            int wrong = 0;
            for (h = 0; h < HEADS; ++h)
                for (d = 0; d < HD; ++d) {
                    wrong |= fabsf(k[(i * HEADS + h) * HD + d] - val(hash, 0, l, h, d)) > tol;
                    wrong |= fabsf(v[(i * HEADS + h) * HD + d] - val(hash, 1, l, h, d)) > tol;
                }
            bad += wrong;
        }
    }
    return bad;
}

static kvc_pool *make_pool(kvc_type type, int32_t pages) {
    kvc_pool_config pc;
    kvc_pool *pool = NULL;
    size_t page_bytes = 0;
    kvc_pool_config_init(&pc);
    pc.n_layers = LAYERS;
    pc.n_kv_heads = HEADS;
    pc.head_dim_k = pc.head_dim_v = HD;
    pc.type_k = pc.type_v = type;
    pc.page_cells = PC;
    kvc_pool_page_bytes(&pc, &page_bytes);
    pc.budget_bytes = (size_t)pages * page_bytes;
    if (kvc_pool_create(&pc, &pool) != KVC_OK) return NULL;
    return pool;
}

static kvc_radix *make_tree(kvc_pool *pool) {
    kvc_radix_config rc;
    kvc_radix *t = NULL;
    kvc_radix_config_init(&rc, KVC_KIND_FULL);
    if (kvc_radix_create(pool, &rc, &t) != KVC_OK) return NULL;
    return t;
}

/* A conversation: look up, evaluate the rest, commit; the cache is destroyed. */
static kvc_result converse(kvc_radix *t, const int32_t *tokens, int32_t n, int32_t *reused) {
    kvc_cache *c = NULL;
    kvc_result r;
    int32_t dummy;
    if ((r = kvc_radix_lookup(t, NS, tokens, n, &c, reused ? reused : &dummy)) != KVC_OK) return r;
    r = extend(c, tokens, reused ? *reused : dummy, n);
    if (r == KVC_OK) r = kvc_radix_commit(t, NS, c, tokens, n, 0);
    kvc_cache_destroy(c);
    return r;
}

/* The entry's saved bytes (kvc_radix_save), malloc'ed; NULL if the tree lacks it. */
static unsigned char *entry_bytes(kvc_radix *t, const int32_t *tokens, int32_t n, size_t *size) {
    kvc_mem mem;
    kvc_io io;
    memset(&mem, 0, sizeof(mem));
    kvc_io_memory(&mem, &io);
    if (kvc_radix_save(t, NS, tokens, n, &io) != KVC_OK) return NULL;
    mem.data = (unsigned char *)malloc(mem.size);
    mem.capacity = mem.size;
    mem.size = 0;
    if (kvc_radix_save(t, NS, tokens, n, &io) != KVC_OK) { free(mem.data); return NULL; }
    *size = mem.size;
    return mem.data;
}

static kvc_tier_stats tier_stats(const kvc_radix *t) {
    kvc_tier_stats s;
    memset(&s, 0, sizeof(s));
    TK_OK(kvc_tier_stats_get(t, &s));
    return s;
}

static int32_t reuse_of(kvc_radix *t, const int32_t *tokens, int32_t n, kvc_type type) {
    kvc_cache *c = NULL;
    int32_t m = -1;
    TK_OK(kvc_radix_lookup(t, NS, tokens, n, &c, &m));
    if (c != NULL) {
        TK_EQ(wrong_cells(c, tokens, type), 0);
        kvc_cache_destroy(c);
    }
    return m;
}

static int32_t pages_used(const kvc_pool *pool) {
    kvc_pool_stats st;
    kvc_pool_stats_get(pool, &st);
    return st.pages_used;
}

static void fill_tokens(tk_rng *rng, int32_t *tokens, int32_t n) {
    int32_t i;
    for (i = 0; i < n; ++i) tokens[i] = tk_int(rng, 0, 50000);
}

/* ---- the directory store ---- */

static char g_dir[256];

static int count_blob_files(void) {
    DIR *d = opendir(g_dir);
    struct dirent *e;
    int n = 0;
    if (d == NULL) return -1;
    while ((e = readdir(d)) != NULL) {
        size_t len = strlen(e->d_name);
        n += len == 68 && strcmp(e->d_name + 64, ".kvc") == 0;
    }
    closedir(d);
    return n;
}
static void clear_dir(void) {
    DIR *d = opendir(g_dir);
    struct dirent *e;
    char path[600];
    if (d == NULL) return;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        snprintf(path, sizeof(path), "%s/%s", g_dir, e->d_name);
        remove(path);
    }
    closedir(d);
}
static void blob_path(const kvc_radix *t, const int32_t *tokens, int32_t n, char *path) {
    kvc_key key;
    char hex[65];
    TK_OK(kvc_tier_key(t, NS, tokens, n, &key));
    kvc_key_hex(&key, hex);
    snprintf(path, 600, "%s/%s.kvc", g_dir, hex);
}
static unsigned char *read_file(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    unsigned char *b;
    long n;
    if (f == NULL) return NULL;
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    fseek(f, 0, SEEK_SET);
    b = (unsigned char *)malloc((size_t)n + 1);
    *size = fread(b, 1, (size_t)n, f);
    fclose(f);
    return b;
}
static void write_file(const char *path, const unsigned char *b, size_t size) {
    FILE *f = fopen(path, "wb");
    if (f == NULL) return;
    fwrite(b, 1, size, f);
    fclose(f);
}

/* ---- the key chain, rebuilt from docs/format.md ------------------------------------ */

static void put32(unsigned char **p, uint32_t x) {
    int i;
    for (i = 0; i < 4; ++i) *(*p)++ = (unsigned char)(x >> (8 * i));
}
static void put64(unsigned char **p, uint64_t x) {
    put32(p, (uint32_t)x);
    put32(p, (uint32_t)(x >> 32));
}

static void test_keys(void) {
    kvc_pool *a = make_pool(KVC_TYPE_F16, 16), *b = make_pool(KVC_TYPE_F16, 16), *f32 = make_pool(KVC_TYPE_F32, 16);
    kvc_radix *ta = make_tree(a), *tb = make_tree(b), *tf = make_tree(f32);
    kvc_tier_config tc;
    unsigned char fp[256], *p = fp, chain[32 + 4 * 2 * PC];
    kvc_key k0, k1, k2, got, other;
    int32_t tokens[2 * PC] = {1, 2, 3, 70000, -5, 6, 7, 8}, i;
    kvc_namespace ns2 = NS;
    TK_OK(kvc_tier_config_init(&tc));
    TK_RES(kvc_tier_key(ta, NS, tokens, PC, &got), KVC_ERR_STATE); /* no tiers yet */
    TK_OK(kvc_tier_attach(ta, &tc));
    TK_RES(kvc_tier_attach(ta, &tc), KVC_ERR_STATE);
    TK_OK(kvc_tier_attach(tb, &tc));
    TK_OK(kvc_tier_attach(tf, &tc));
    /* fingerprint: "KVCTIER1", version, block, namespace, what, parts, then per part */
    memcpy(p, "KVCTIER1", 8); p += 8;
    put32(&p, 1); put32(&p, PC); put64(&p, NS.model); put64(&p, NS.salt); put32(&p, 3); put32(&p, 1);
    put32(&p, LAYERS); put32(&p, HEADS); put32(&p, HD); put32(&p, HD); put32(&p, KVC_TYPE_F16); put32(&p, KVC_TYPE_F16);
    put32(&p, PC); put32(&p, 0); put32(&p, 0);               /* page cells, state floats, rotate */
    put32(&p, KVC_KIND_FULL); put32(&p, 0); put32(&p, 0);    /* kind, window, sinks */
    put32(&p, 0); put32(&p, 0); put32(&p, 0); put32(&p, 0);  /* rope style, theta bits, dims, callback */
    TK_OK(kvc_sha256(fp, (size_t)(p - fp), k0.bytes));
    memcpy(chain, k0.bytes, 32);
    p = chain + 32;
    for (i = 0; i < PC; ++i) put32(&p, (uint32_t)tokens[i]);
    TK_OK(kvc_sha256(chain, 32 + 4 * PC, k1.bytes));
    memcpy(chain, k1.bytes, 32);
    p = chain + 32;
    for (i = PC; i < 2 * PC; ++i) put32(&p, (uint32_t)tokens[i]);
    TK_OK(kvc_sha256(chain, 32 + 4 * PC, k2.bytes));
    TK_OK(kvc_tier_key(ta, NS, tokens, PC, &got));
    TK_CHECK(memcmp(got.bytes, k1.bytes, 32) == 0);
    TK_OK(kvc_tier_key(ta, NS, tokens, 2 * PC, &got));
    TK_CHECK(memcmp(got.bytes, k2.bytes, 32) == 0);
    TK_OK(kvc_tier_key(tb, NS, tokens, 2 * PC, &other)); /* another pool, same model: same key */
    TK_CHECK(memcmp(got.bytes, other.bytes, 32) == 0);
    TK_OK(kvc_tier_key(tf, NS, tokens, 2 * PC, &other)); /* another type: another key */
    TK_CHECK(memcmp(got.bytes, other.bytes, 32) != 0);
    ns2.salt++;
    TK_OK(kvc_tier_key(ta, ns2, tokens, 2 * PC, &other)); /* another namespace */
    TK_CHECK(memcmp(got.bytes, other.bytes, 32) != 0);
    TK_RES(kvc_tier_key(ta, NS, tokens, PC + 1, &got), KVC_ERR_INVALID); /* not whole blocks */
    TK_RES(kvc_tier_key(ta, NS, tokens, 0, &got), KVC_ERR_INVALID);
    TK_RES(kvc_tier_key(ta, NS, NULL, PC, &got), KVC_ERR_NULL);
    tc.block_tokens = -1;
    TK_RES(kvc_tier_attach(ta, &tc), KVC_ERR_STATE);
    kvc_radix_destroy(ta); kvc_radix_destroy(tb); kvc_radix_destroy(tf);
    kvc_pool_destroy(a); kvc_pool_destroy(b); kvc_pool_destroy(f32);
    {   /* bad configurations */
        kvc_pool *q = make_pool(KVC_TYPE_F16, 8);
        kvc_radix *t = make_tree(q);
        kvc_tier_config_init(&tc);
        tc.block_tokens = -1;
        TK_RES(kvc_tier_attach(t, &tc), KVC_ERR_INVALID);
        tc.block_tokens = 0;
        tc.timeout_ms = -1;
        TK_RES(kvc_tier_attach(t, &tc), KVC_ERR_INVALID);
        tc.timeout_ms = 0;
        tc.store.put = NULL;
        tc.store.get = NULL;
        tc.store.exists = NULL;
        tc.store.erase = NULL;
        { kvc_store_dir_state st; kvc_store s; TK_OK(kvc_store_dir(&st, g_dir, &s)); tc.store.put = s.put; }
        TK_RES(kvc_tier_attach(t, &tc), KVC_ERR_NULL); /* a store needs put, exists and get */
        TK_RES(kvc_tier_fetch(t, NS, tokens, PC, &i), KVC_ERR_STATE);
        TK_RES(kvc_tier_publish(t, NS, tokens, PC, &i), KVC_ERR_STATE);
        TK_RES(kvc_tier_attach(NULL, &tc), KVC_ERR_NULL);
        kvc_radix_destroy(t);
        kvc_pool_destroy(q);
    }
}

/* ---- eviction down, fetch up, bit for bit ------------------------------------------- */

static void test_host_exact(tk_rng *rng, kvc_type type) {
    kvc_pool *pool = make_pool(type, 32);
    kvc_radix *t = make_tree(pool);
    kvc_tier_config tc;
    kvc_tier_stats s;
    int32_t tokens[MAXT], n = 4 * PC + 2, x = 4 * PC, got = -1, before_pages;
    unsigned char *before, *after;
    size_t nb = 0, na = 0;
    fill_tokens(rng, tokens, MAXT);
    kvc_tier_config_init(&tc);
    tc.host_bytes = 1 << 20;
    TK_OK(kvc_tier_attach(t, &tc));
    TK_OK(converse(t, tokens, n, NULL));
    before = entry_bytes(t, tokens, x, &nb);
    TK_CHECK(before != NULL);
    TK_OK(kvc_radix_evict(t, 1000, NULL));
    TK_EQ(pages_used(pool), 0);
    s = tier_stats(t);
    TK_EQ(s.kept_host, 1);
    TK_EQ(s.host_blobs, 1);
    TK_CHECK(s.host_bytes == nb); /* the blob is the entry as kvc_radix_save writes it */
    TK_EQ(reuse_of(t, tokens, n + 3, type), 0);
    TK_OK(kvc_tier_fetch(t, NS, tokens, n + 3, &got));
    TK_EQ(got, x);
    s = tier_stats(t);
    TK_EQ(s.fetched_host, 1);
    TK_EQ(s.tokens_fetched, x);
    TK_EQ(s.host_blobs, 0); /* moved up, not copied */
    TK_CHECK(s.host_bytes == 0);
    after = entry_bytes(t, tokens, x, &na);
    TK_CHECK(after != NULL && na == nb && memcmp(before, after, nb) == 0);
    TK_EQ(reuse_of(t, tokens, n + 3, type), x);
    /* what the tree holds already is not fetched again */
    before_pages = pages_used(pool);
    TK_OK(kvc_tier_fetch(t, NS, tokens, n + 3, &got));
    TK_EQ(got, 0);
    TK_EQ(pages_used(pool), before_pages);
    /* an entry shorter than a block keeps nothing */
    TK_OK(kvc_radix_evict(t, 1000, NULL));
    TK_OK(converse(t, tokens + 40, PC - 1, NULL));
    TK_OK(kvc_radix_evict(t, 1000, NULL));
    s = tier_stats(t);
    TK_EQ(s.dropped, 1);
    TK_EQ(s.host_blobs, 1);
    /* a leaf under a kept parent keeps only what reaches past its parent */
    TK_OK(converse(t, tokens, 2 * PC + 1, NULL));
    {
        int32_t branch[MAXT];
        memcpy(branch, tokens, sizeof(branch));
        branch[2 * PC] ^= 1; /* a sibling leaf from token 2 * PC on */
        TK_OK(converse(t, branch, 2 * PC + 1, NULL));
        TK_OK(kvc_radix_evict(t, 1, NULL)); /* one leaf: [2PC, 2PC+1) has no whole block past its parent */
        TK_EQ(tier_stats(t).dropped, 2);
    }
    TK_OK(kvc_radix_evict(t, 1000, NULL));
    free(before);
    free(after);
    TK_OK(kvc_radix_destroy(t)); /* host blobs go with it */
    TK_OK(kvc_pool_destroy(pool));
}

/* A pool's ROTATING tree (window 7, one sink): the entry kept is the sinks and window a
   lookup at the block boundary uses, and it comes back with the same bytes. */
static void test_rotating(tk_rng *rng) {
    kvc_pool *pool = make_pool(KVC_TYPE_F16, 32);
    kvc_radix_config rc;
    kvc_radix *t = NULL;
    kvc_tier_config tc;
    kvc_cache *c = NULL;
    int32_t tokens[MAXT], n = 6 * PC + 3, x = 6 * PC, got = -1, reused = -1;
    unsigned char *before, *after;
    size_t nb = 0, na = 0;
    fill_tokens(rng, tokens, MAXT);
    kvc_radix_config_init(&rc, KVC_KIND_ROTATING);
    rc.cache.window = 7;
    rc.cache.sinks = 1;
    TK_OK(kvc_radix_create(pool, &rc, &t));
    kvc_tier_config_init(&tc);
    tc.host_bytes = 1 << 20;
    TK_OK(kvc_tier_attach(t, &tc));
    TK_OK(kvc_radix_lookup(t, NS, tokens, n, &c, &reused));
    TK_OK(extend(c, tokens, reused, n));
    TK_OK(kvc_radix_commit(t, NS, c, tokens, n, 0));
    TK_OK(kvc_cache_destroy(c));
    before = entry_bytes(t, tokens, x, &nb);
    TK_CHECK(before != NULL);
    TK_OK(kvc_radix_evict(t, 1000, NULL));
    TK_EQ(pages_used(pool), 0);
    TK_EQ(tier_stats(t).kept_host, 1);
    TK_OK(kvc_tier_fetch(t, NS, tokens, n, &got));
    TK_EQ(got, x);
    after = entry_bytes(t, tokens, x, &na);
    TK_CHECK(after != NULL && na == nb && memcmp(before, after, nb) == 0);
    TK_OK(kvc_radix_lookup(t, NS, tokens, n, &c, &reused));
    TK_EQ(reused, x);
    TK_EQ(wrong_cells(c, tokens, KVC_TYPE_F16), 0);
    TK_OK(extend(c, tokens, reused, n)); /* goes on like a cache that never left */
    TK_EQ(wrong_cells(c, tokens, KVC_TYPE_F16), 0);
    TK_OK(kvc_cache_destroy(c));
    free(before);
    free(after);
    TK_OK(kvc_radix_destroy(t));
    TK_OK(kvc_pool_destroy(pool));
}

/* The host tier's budget holds; the oldest blobs spill to the store; everything comes
   back (from the host tier or the store). */
static void test_budget_and_spill(tk_rng *rng) {
    kvc_pool *pool = make_pool(KVC_TYPE_F16, 64);
    kvc_radix *t = make_tree(pool);
    kvc_store_dir_state st;
    kvc_tier_config tc;
    kvc_tier_stats s;
    int32_t tokens[5][MAXT], i, got, n = 3 * PC + 1;
    size_t blob = 0;
    unsigned char *b;
    clear_dir();
    for (i = 0; i < 5; ++i) fill_tokens(rng, tokens[i], n);
    TK_OK(converse(t, tokens[0], n, NULL));
    b = entry_bytes(t, tokens[0], 3 * PC, &blob);
    free(b);
    kvc_tier_config_init(&tc);
    tc.host_bytes = blob * 2 + blob / 2; /* two blobs fit, not three */
    TK_OK(kvc_store_dir(&st, g_dir, &tc.store));
    TK_OK(kvc_tier_attach(t, &tc));
    for (i = 1; i < 5; ++i) TK_OK(converse(t, tokens[i], n, NULL));
    TK_OK(kvc_radix_evict(t, 1000, NULL));
    s = tier_stats(t);
    TK_EQ(s.kept_host, 5);
    TK_EQ(s.host_blobs, 2);
    TK_CHECK(s.host_bytes <= tc.host_bytes);
    TK_EQ(s.kept_store, 3);
    TK_EQ(count_blob_files(), 3);
    for (i = 0; i < 5; ++i) {
        TK_OK(kvc_tier_fetch(t, NS, tokens[i], n, &got));
        TK_EQ(got, 3 * PC);
        TK_EQ(reuse_of(t, tokens[i], n, KVC_TYPE_F16), 3 * PC);
    }
    s = tier_stats(t);
    TK_EQ(s.fetched_host, 2);
    TK_EQ(s.fetched_store, 3);
    /* evict again: the store already holds three; flush moves the host's to it */
    TK_OK(kvc_radix_evict(t, 1000, NULL));
    TK_OK(kvc_tier_flush(t));
    s = tier_stats(t);
    TK_EQ(s.host_blobs, 0);
    TK_EQ(count_blob_files(), 5);
    /* a blob larger than the whole host budget goes straight to the store */
    TK_OK(kvc_radix_destroy(t));
    t = make_tree(pool);
    tc.host_bytes = blob / 2;
    TK_OK(kvc_tier_attach(t, &tc));
    clear_dir();
    TK_OK(converse(t, tokens[0], n, NULL));
    TK_OK(kvc_radix_evict(t, 1000, NULL));
    s = tier_stats(t);
    TK_EQ(s.host_blobs, 0);
    TK_EQ(s.kept_store, 1);
    TK_EQ(count_blob_files(), 1);
    /* ... and without a store it is dropped */
    TK_OK(kvc_radix_destroy(t));
    t = make_tree(pool);
    memset(&tc.store, 0, sizeof(tc.store));
    TK_OK(kvc_tier_attach(t, &tc));
    TK_OK(converse(t, tokens[0], n, NULL));
    TK_OK(kvc_radix_evict(t, 1000, NULL));
    s = tier_stats(t);
    TK_EQ(s.dropped, 1);
    TK_EQ(s.host_blobs, 0);
    TK_OK(kvc_radix_destroy(t));
    TK_OK(kvc_pool_destroy(pool));
}

/* Two "processes": pools and trees that share nothing but the directory. */
static void test_two_pools(tk_rng *rng) {
    kvc_pool *p1 = make_pool(KVC_TYPE_Q8_0, 32), *p2 = make_pool(KVC_TYPE_Q8_0, 32);
    kvc_radix *t1 = make_tree(p1), *t2 = make_tree(p2);
    kvc_store_dir_state st1, st2;
    kvc_tier_config tc;
    int32_t sys[MAXT], q[MAXT], n_sys = 5 * PC + 3, got = -1, pub = -1, reused = -1;
    unsigned char *b1, *b2;
    size_t n1 = 0, n2 = 0;
    clear_dir();
    fill_tokens(rng, sys, n_sys);
    memcpy(q, sys, sizeof(q));
    fill_tokens(rng, q + n_sys, 6); /* the second process's question after the same system prompt */
    kvc_tier_config_init(&tc);
    TK_OK(kvc_store_dir(&st1, g_dir, &tc.store));
    TK_OK(kvc_tier_attach(t1, &tc));
    TK_OK(kvc_store_dir(&st2, g_dir, &tc.store));
    tc.host_bytes = 1 << 20; /* the second one also has a host tier */
    TK_OK(kvc_tier_attach(t2, &tc));
    TK_OK(converse(t1, sys, n_sys, NULL));
    TK_OK(kvc_tier_publish(t1, NS, sys, n_sys, &pub)); /* write-through */
    TK_EQ(pub, 5 * PC);
    TK_EQ(count_blob_files(), 1);
    TK_OK(kvc_tier_fetch(t2, NS, q, n_sys + 6, &got));
    TK_EQ(got, 5 * PC);
    b1 = entry_bytes(t1, sys, 5 * PC, &n1);
    b2 = entry_bytes(t2, sys, 5 * PC, &n2);
    TK_CHECK(b1 != NULL && b2 != NULL && n1 == n2 && memcmp(b1, b2, n1) == 0);
    TK_OK(converse(t2, q, n_sys + 6, &reused));
    TK_EQ(reused, 5 * PC); /* recomputed: only what follows the last whole block */
    TK_EQ(tier_stats(t2).fetched_store, 1);
    free(b1);
    free(b2);
    /* the first evicts everything to the store; a fresh tree on the second pool gets it */
    TK_OK(kvc_radix_evict(t1, 1000, NULL));
    TK_OK(kvc_radix_destroy(t2));
    t2 = make_tree(p2);
    tc.host_bytes = 0;
    TK_OK(kvc_tier_attach(t2, &tc));
    TK_OK(kvc_tier_fetch(t2, NS, sys, n_sys, &got));
    TK_EQ(got, 5 * PC);
    TK_EQ(reuse_of(t2, sys, n_sys, KVC_TYPE_Q8_0), 5 * PC);
    /* another namespace finds nothing */
    {
        kvc_namespace other = NS;
        other.model++;
        TK_OK(kvc_tier_fetch(t2, other, sys, n_sys, &got));
        TK_EQ(got, 0);
    }
    TK_OK(kvc_radix_destroy(t1));
    TK_OK(kvc_radix_destroy(t2));
    TK_OK(kvc_pool_destroy(p1));
    TK_OK(kvc_pool_destroy(p2));
}

/* Blobs that must be refused, the tree and pool unchanged. */
static void test_refused(tk_rng *rng) {
    kvc_pool *pool = make_pool(KVC_TYPE_F16, 32), *pf = make_pool(KVC_TYPE_F32, 32);
    kvc_radix *t = make_tree(pool), *tf = make_tree(pf);
    kvc_store_dir_state st;
    kvc_tier_config tc;
    int32_t a[MAXT], other[MAXT], n = 4 * PC, got = -1, i, refused = 0;
    char path[600], path_other[600];
    unsigned char *good, *bad;
    size_t size = 0, osize = 0;
    clear_dir();
    fill_tokens(rng, a, n);
    fill_tokens(rng, other, n);
    kvc_tier_config_init(&tc);
    TK_OK(kvc_store_dir(&st, g_dir, &tc.store));
    TK_OK(kvc_tier_attach(t, &tc));
    TK_OK(kvc_tier_attach(tf, &tc));
    TK_OK(converse(t, a, n, NULL));
    TK_OK(converse(t, other, n, NULL));
    TK_OK(kvc_tier_publish(t, NS, a, n, &got));
    TK_OK(kvc_tier_publish(t, NS, other, n, &got));
    TK_OK(kvc_radix_evict(t, 1000, NULL));
    blob_path(t, a, n, path);
    blob_path(t, other, n, path_other);
    good = read_file(path, &size);
    TK_CHECK(good != NULL && size > 200);
    bad = (unsigned char *)malloc(size + 64);
    /* damaged: one byte flipped in the header, CONF, META, TOKS, KVDT and a checksum */
    {
        size_t at[8];
        int k;
        at[0] = 3; at[1] = 12; at[2] = 16 + 20; at[3] = 16 + 104 + 20; at[4] = 16 + 104 + 48 + 16;
        at[5] = size / 2; at[6] = size - 1; at[7] = size - 9;
        for (k = 0; k < 8; ++k) {
            memcpy(bad, good, size);
            bad[at[k]] ^= 0x10;
            write_file(path, bad, size);
            TK_OK(kvc_tier_fetch(t, NS, a, n, &got));
            TK_EQ(got, 0);
            refused++;
        }
    }
    /* truncated at several lengths */
    for (i = 1; i < 6; ++i) {
        write_file(path, good, size * (size_t)i / 6);
        TK_OK(kvc_tier_fetch(t, NS, a, n, &got));
        TK_EQ(got, 0);
        refused++;
    }
    /* other tokens' blob under a's key */
    {
        unsigned char *ob = read_file(path_other, &osize);
        write_file(path, ob, osize);
        TK_OK(kvc_tier_fetch(t, NS, a, n, &got));
        TK_EQ(got, 0);
        refused++;
        free(ob);
    }
    /* foreign: an f32 pool's blob of the same tokens under a's (f16) key */
    {
        unsigned char *fb;
        size_t fs = 0;
        TK_OK(converse(tf, a, n, NULL));
        fb = entry_bytes(tf, a, n, &fs);
        write_file(path, fb, fs);
        TK_OK(kvc_tier_fetch(t, NS, a, n, &got));
        TK_EQ(got, 0);
        refused++;
        free(fb);
    }
    /* another kind of object: a saved cache */
    {
        kvc_cache *c = NULL;
        kvc_cache_config cc;
        kvc_path_io pio;
        kvc_io io;
        kvc_cache_config_init(&cc, KVC_KIND_FULL);
        TK_OK(kvc_cache_create(pool, &cc, &c));
        TK_OK(extend(c, a, 0, n));
        TK_OK(kvc_io_path(&pio, path, 1, &io));
        TK_OK(kvc_cache_save(c, NS, a, n, &io));
        kvc_cache_destroy(c);
        TK_OK(kvc_tier_fetch(t, NS, a, n, &got));
        TK_EQ(got, 0);
        refused++;
    }
    TK_EQ((int32_t)tier_stats(t).refused, refused);
    TK_EQ(pages_used(pool), 0); /* nothing refused stayed in the pool */
    {
        kvc_radix_stats rs;
        TK_OK(kvc_radix_stats_get(t, &rs));
        TK_EQ(rs.n_nodes, 0);
    }
    /* the good blob back: found, exact */
    write_file(path, good, size);
    TK_OK(kvc_tier_fetch(t, NS, a, n + 1, &got));
    TK_EQ(got, n);
    TK_EQ(reuse_of(t, a, n + 1, KVC_TYPE_F16), n);
    free(good);
    free(bad);
    TK_OK(kvc_radix_destroy(t));
    TK_OK(kvc_radix_destroy(tf));
    TK_OK(kvc_pool_destroy(pool));
    TK_OK(kvc_pool_destroy(pf));
}

/* A store whose every call fails: eviction drops, fetch finds nothing, no error. */
static kvc_result dead_put(void *u, const kvc_key *k, const void *d, size_t n, int32_t ms) {
    (void)u; (void)k; (void)d; (void)n;
    TK_EQ(ms, 250); /* the caller's timeout reaches the store */
    return KVC_ERR_IO;
}
static kvc_result dead_exists(void *u, const kvc_key *k, size_t *n, int32_t ms) {
    (void)u; (void)k; (void)n; (void)ms;
    return KVC_ERR_IO;
}
static kvc_result dead_get(void *u, const kvc_key *k, void *d, size_t cap, size_t *n, int32_t ms) {
    (void)u; (void)k; (void)d; (void)cap; (void)n; (void)ms;
    return KVC_ERR_IO;
}

static void test_dead_store(tk_rng *rng) {
    kvc_pool *pool = make_pool(KVC_TYPE_F16, 32);
    kvc_radix *t = make_tree(pool);
    kvc_tier_config tc;
    kvc_tier_stats s;
    int32_t a[MAXT], n = 3 * PC + 1, got = -1, reused = -1;
    fill_tokens(rng, a, n);
    kvc_tier_config_init(&tc);
    tc.store.put = dead_put;
    tc.store.exists = dead_exists;
    tc.store.get = dead_get;
    tc.timeout_ms = 250;
    TK_OK(kvc_tier_attach(t, &tc));
    TK_OK(converse(t, a, n, NULL));
    TK_RES(kvc_tier_publish(t, NS, a, n, &got), KVC_ERR_IO);
    TK_OK(kvc_radix_evict(t, 1000, NULL));
    TK_OK(kvc_tier_fetch(t, NS, a, n, &got));
    TK_EQ(got, 0);
    s = tier_stats(t);
    TK_EQ(s.dropped, 1);
    TK_EQ(s.store_errors, 2); /* publish, then the fetch; the eviction between: store down, not called */
    TK_OK(converse(t, a, n, &reused)); /* recomputed, right */
    TK_EQ(reused, 0);
    TK_EQ(reuse_of(t, a, n, KVC_TYPE_F16), n - 1);
    TK_OK(kvc_radix_destroy(t));
    TK_OK(kvc_pool_destroy(pool));
}

/* A store that hangs: every call waits on a simulated clock for the store's delay, but no
   longer than the timeout_ms it is given, and then fails (as a store that honours the
   timeout does: kvc_store_dir on a local disk never waits; examples/redis_store.h bounds
   each call by it). A request must wait at most one timeout however many entries its
   eviction sends down or its fetch probes: the first failing call ends the store's part
   until the next fetch, publish or flush, which try it again. */
static struct {
    kvc_store dir;
    int32_t delay_ms; /* 0: answers at once */
    long calls, waited_ms;
} g_slow;
static kvc_result slow_wait(int32_t ms) {
    TK_EQ(ms, 50);
    g_slow.calls++;
    g_slow.waited_ms += g_slow.delay_ms < ms ? g_slow.delay_ms : ms;
    return g_slow.delay_ms > ms ? KVC_ERR_IO : KVC_OK;
}
static kvc_result slow_put(void *u, const kvc_key *k, const void *d, size_t n, int32_t ms) {
    kvc_result r = slow_wait(ms);
    (void)u;
    return r != KVC_OK ? r : g_slow.dir.put(g_slow.dir.user, k, d, n, ms);
}
static kvc_result slow_exists(void *u, const kvc_key *k, size_t *n, int32_t ms) {
    kvc_result r = slow_wait(ms);
    (void)u;
    return r != KVC_OK ? r : g_slow.dir.exists(g_slow.dir.user, k, n, ms);
}
static kvc_result slow_get(void *u, const kvc_key *k, void *d, size_t cap, size_t *n, int32_t ms) {
    kvc_result r = slow_wait(ms);
    (void)u;
    return r != KVC_OK ? r : g_slow.dir.get(g_slow.dir.user, k, d, cap, n, ms);
}

static void test_slow_store(tk_rng *rng) {
    kvc_pool *pool = make_pool(KVC_TYPE_F16, 32);
    kvc_radix *t = make_tree(pool);
    kvc_store_dir_state st;
    kvc_tier_config tc;
    int32_t a[4][MAXT], n = 3 * PC + 1, got = -1, i;
    clear_dir();
    memset(&g_slow, 0, sizeof(g_slow));
    TK_OK(kvc_store_dir(&st, g_dir, &g_slow.dir));
    kvc_tier_config_init(&tc);
    tc.store.put = slow_put;
    tc.store.exists = slow_exists;
    tc.store.get = slow_get;
    tc.timeout_ms = 50;
    TK_OK(kvc_tier_attach(t, &tc));
    for (i = 0; i < 4; ++i) fill_tokens(rng, a[i], n);
    TK_OK(converse(t, a[0], n, NULL));
    TK_OK(converse(t, a[1], n, NULL));
    TK_OK(kvc_radix_evict(t, 1000, NULL)); /* both to the store, at once */
    TK_EQ(g_slow.calls, 2);
    TK_EQ(tier_stats(t).kept_store, 2);
    /* the store hangs: two entries evicted, one call, one timeout */
    TK_OK(converse(t, a[2], n, NULL));
    TK_OK(converse(t, a[3], n, NULL));
    g_slow.delay_ms = 1000;
    g_slow.calls = g_slow.waited_ms = 0;
    TK_OK(kvc_radix_evict(t, 1000, NULL));
    TK_EQ(g_slow.calls, 1);
    TK_CHECK(g_slow.waited_ms <= 50);
    TK_EQ(tier_stats(t).dropped, 2);
    /* a fetch probing three block boundaries: one call, one timeout, nothing found */
    g_slow.calls = g_slow.waited_ms = 0;
    TK_OK(kvc_tier_fetch(t, NS, a[0], n, &got));
    TK_EQ(got, 0);
    TK_EQ(g_slow.calls, 1);
    TK_CHECK(g_slow.waited_ms <= 50);
    /* slow but within the timeout: served (each call waits 30 ms: exists + get) */
    g_slow.delay_ms = 30;
    g_slow.calls = g_slow.waited_ms = 0;
    TK_OK(kvc_tier_fetch(t, NS, a[0], n, &got));
    TK_EQ(got, 3 * PC);
    TK_EQ(g_slow.calls, 2);
    /* back at once: the next fetch uses it */
    g_slow.delay_ms = 0;
    TK_OK(kvc_tier_fetch(t, NS, a[1], n, &got));
    TK_EQ(got, 3 * PC);
    TK_OK(kvc_radix_destroy(t));
    TK_OK(kvc_pool_destroy(pool));
    clear_dir();
}

/* Under pool pressure a fetch evicts (down the tiers) to make room. */
static void test_fetch_under_pressure(tk_rng *rng) {
    kvc_pool *pool = make_pool(KVC_TYPE_F16, 6);
    kvc_radix *t = make_tree(pool);
    kvc_tier_config tc;
    int32_t a[MAXT], b[MAXT], n = 4 * PC + 1, got = -1;
    fill_tokens(rng, a, n);
    fill_tokens(rng, b, n);
    kvc_tier_config_init(&tc);
    tc.host_bytes = 1 << 20;
    TK_OK(kvc_tier_attach(t, &tc));
    TK_OK(converse(t, a, n, NULL)); /* 5 pages */
    TK_OK(converse(t, b, n, NULL)); /* evicts a down */
    TK_EQ(tier_stats(t).kept_host, 1);
    TK_OK(kvc_tier_fetch(t, NS, a, n, &got)); /* needs 4 pages: b goes down */
    TK_EQ(got, 4 * PC);
    TK_EQ(tier_stats(t).kept_host, 2);
    TK_EQ(reuse_of(t, a, n, KVC_TYPE_F16), 4 * PC);
    TK_OK(kvc_tier_fetch(t, NS, b, n, &got));
    TK_EQ(got, 4 * PC);
    TK_EQ(reuse_of(t, b, n, KVC_TYPE_F16), 4 * PC);
    TK_OK(kvc_radix_destroy(t));
    TK_OK(kvc_pool_destroy(pool));
}

/* ---- a memory's tree: RECURRENT states, ROTATING windows and FULL pages ----------- */
/* The toy model of test_memory_radix.c: layer 0 recurrent, layer 1 sliding (window 6,
   one sink, pages of 2), layer 2 full (pages of 4); K and states exact functions of the
   tokens, so a memory can be compared with evaluating them. */
#define HS 5
#define HDIM 4
#define HWIN 6
#define HSINKS 1
#define HBLOCK 8

static float hx(int32_t token, int32_t i) { return (float)((token * 7 + i) % 17 - 8); }
static void hstep(float *st, int32_t token) {
    int32_t i;
    for (i = 0; i < HS; ++i) st[i] = st[i] * 0.5f + hx(token, i);
}
static float hk(int32_t token, int32_t pos, int32_t layer, int32_t i) {
    return (float)(token % 1000 * 64 + (pos % 13) * 4 + i + layer * 1000);
}

static kvc_memory *hybrid_memory(size_t budget) {
    kvc_memory_config mc;
    kvc_group_config g[3];
    int32_t map[3] = {0, 1, 2}, l;
    kvc_memory *m = NULL;
    kvc_memory_config_init(&mc);
    memset(g, 0, sizeof(g));
    g[0].pool.n_layers = 1;
    g[0].pool.state_floats = HS;
    kvc_cache_config_init(&g[0].cache, KVC_KIND_RECURRENT);
    g[0].cache.checkpoints = 16;
    for (l = 1; l < 3; ++l) {
        g[l].pool.n_layers = 1;
        g[l].pool.n_kv_heads = 1;
        g[l].pool.head_dim_k = g[l].pool.head_dim_v = HDIM;
        g[l].pool.type_k = g[l].pool.type_v = KVC_TYPE_F32;
    }
    g[1].pool.page_cells = 2;
    kvc_cache_config_init(&g[1].cache, KVC_KIND_ROTATING);
    g[1].cache.window = HWIN;
    g[1].cache.sinks = HSINKS;
    g[1].cache.checkpoints = 16;
    g[2].pool.page_cells = 4;
    kvc_cache_config_init(&g[2].cache, KVC_KIND_FULL);
    mc.n_layers = 3;
    mc.layer_group = map;
    mc.n_groups = 3;
    mc.groups = g;
    mc.budget_bytes = budget;
    TK_OK(kvc_memory_create(&mc, &m));
    return m;
}

/* Evaluate tokens[off, off + n) with a checkpoint at every multiple of HBLOCK inside. */
static kvc_result hfeed(kvc_memory *m, const int32_t *tokens, int32_t off, int32_t n) {
    float kv[MAXT * HDIM], *st;
    int32_t l, t, i, at[16], n_at = 0;
    kvc_result r;
    for (t = (off / HBLOCK + 1) * HBLOCK; t < off + n && n_at < 16; t += HBLOCK) at[n_at++] = t;
    if ((r = kvc_memory_begin(m, n, at, n_at)) != KVC_OK) return r;
    if ((r = kvc_memory_state(m, 0, 0, &st)) != KVC_OK) return r;
    for (t = off; t < off + n; ++t) {
        hstep(st, tokens[t]);
        if ((t + 1) % HBLOCK == 0 && t + 1 < off + n && (r = kvc_memory_state_checkpoint(m, 0, t + 1, st)) != KVC_OK)
            return r;
    }
    for (l = 1; l < 3; ++l) {
        for (t = 0; t < n; ++t)
            for (i = 0; i < HDIM; ++i) kv[t * HDIM + i] = hk(tokens[off + t], off + t, l, i);
        if ((r = kvc_memory_put(m, l, kv, kv)) != KVC_OK) return r;
    }
    return KVC_OK;
}

/* The memory holds exactly what evaluating tokens[0, n) gives (state bits, every K of
   the full layer, the sliding layer's keys the next query sees). */
static int hholds(const kvc_memory *m, const int32_t *tokens, int32_t n) {
    kvc_cache *c;
    int32_t gl, off = -1, cells = 0, t, i, pos[MAXT + 8], seen[MAXT + 8];
    float k[(MAXT + 8) * HDIM], want[HS];
    const float *st;
    if (kvc_memory_offset(m, &off) != KVC_OK || off != n) return 0;
    if (kvc_memory_layer(m, 0, &c, &gl) != KVC_OK || kvc_state_read(c, 0, 0, &st) != KVC_OK) return 0;
    memset(want, 0, sizeof(want));
    for (t = 0; t < n; ++t) hstep(want, tokens[t]);
    for (i = 0; i < HS; ++i)
        if (memcmp(st ? &st[i] : &want[i], &want[i], sizeof(float)) != 0) return 0;
    for (gl = 1; gl < 3; ++gl) {
        kvc_cache *a;
        int32_t l2;
        if (kvc_memory_layer(m, gl, &a, &l2) != KVC_OK) return 0;
        if (kvc_cache_gather(a, l2, k, NULL, pos, MAXT + 8, &cells) != KVC_OK) return 0;
        memset(seen, 0, sizeof(seen));
        for (t = 0; t < cells; ++t) {
            if (pos[t] < 0 || pos[t] >= n) return 0;
            seen[pos[t]] = 1;
            for (i = 0; i < HDIM; ++i)
                if (k[t * HDIM + i] != hk(tokens[pos[t]], pos[t], gl, i)) return 0;
        }
        for (t = 0; t < n; ++t)
            if ((gl == 2 || t < HSINKS || t > n - HWIN + HSINKS) && !seen[t]) return 0;
    }
    return 1;
}

/* look up, evaluate the rest, commit; the reused length */
static int32_t hrequest(kvc_radix *t, const int32_t *tokens, int32_t n) {
    kvc_memory *m = NULL;
    int32_t reused = -1;
    TK_OK(kvc_radix_lookup_memory(t, NS, tokens, n, &m, &reused));
    if (m == NULL) return -1;
    TK_CHECK(hholds(m, tokens, reused));
    TK_OK(hfeed(m, tokens, reused, n - reused));
    TK_CHECK(hholds(m, tokens, n));
    TK_OK(kvc_radix_commit_memory(t, NS, m, tokens, n, 0));
    TK_OK(kvc_memory_destroy(m));
    return reused;
}

static kvc_radix *hybrid_tree(kvc_tier_config *tc, size_t budget) {
    kvc_memory *m = hybrid_memory(budget);
    kvc_radix_config rc;
    kvc_radix *t = NULL;
    kvc_radix_config_init(&rc, KVC_KIND_FULL);
    TK_OK(kvc_radix_create_memory(m, &rc, &t));
    TK_OK(kvc_memory_destroy(m)); /* the tree keeps the pools */
    TK_OK(kvc_tier_attach(t, tc));
    return t;
}

static void test_hybrid(tk_rng *rng) {
    kvc_store_dir_state st;
    kvc_tier_config tc;
    kvc_radix *t, *t2;
    int32_t a[MAXT], n = 5 * HBLOCK, got = -1, pub = -1;
    kvc_radix_stats rs;
    clear_dir();
    fill_tokens(rng, a, MAXT);
    kvc_tier_config_init(&tc);
    tc.host_bytes = 1 << 20;
    tc.block_tokens = HBLOCK;
    TK_OK(kvc_store_dir(&st, g_dir, &tc.store));
    t = hybrid_tree(&tc, 1 << 20);
    TK_EQ(hrequest(t, a, n + 3), 0); /* states at 8, 16, ..., 40 and the end */
    TK_OK(kvc_tier_publish(t, NS, a, n + 3, &pub));
    TK_EQ(pub, n);
    TK_OK(kvc_radix_evict(t, 1000, NULL));
    TK_OK(kvc_radix_stats_get(t, &rs));
    TK_EQ(rs.n_pages, 0);
    /* node by node (the commit ended nodes at the checkpoints): the leaf [40, 43) holds no
       whole block past its parent (dropped), then each node keeps its path's prefix */
    TK_EQ(tier_stats(t).kept_host, 5);
    TK_EQ(tier_stats(t).dropped, 1);
    TK_OK(kvc_tier_fetch(t, NS, a, n + 5, &got));
    TK_EQ(got, n);
    TK_EQ(tier_stats(t).fetched_host, 1);
    TK_EQ(hrequest(t, a, n + 5), n); /* the states, windows and pages as evaluated */
    /* another process's tree: the published entry through the directory */
    tc.host_bytes = 0;
    t2 = hybrid_tree(&tc, 1 << 20);
    TK_OK(kvc_tier_fetch(t2, NS, a, n + 2, &got));
    TK_EQ(got, n);
    TK_EQ(tier_stats(t2).fetched_store, 1);
    TK_EQ(hrequest(t2, a, n + 2), n);
    TK_OK(kvc_radix_destroy(t));
    TK_OK(kvc_radix_destroy(t2));
    /* pressure: kvc_memory_begin itself evicts (down the tiers) when the budget runs out */
    {
        int32_t conv[6][MAXT], i;
        kvc_radix_stats one;
        size_t budget;
        kvc_tier_stats s;
        for (i = 0; i < 6; ++i) fill_tokens(rng, conv[i], MAXT);
        tc.host_bytes = 1 << 20;
        memset(&tc.store, 0, sizeof(tc.store));
        t = hybrid_tree(&tc, 1 << 20);
        TK_EQ(hrequest(t, conv[0], n + 3), 0);
        TK_OK(kvc_radix_stats_get(t, &one));
        budget = one.bytes * 5 / 2; /* room for two conversations and a half */
        TK_OK(kvc_radix_destroy(t));
        t = hybrid_tree(&tc, budget);
        for (i = 0; i < 6; ++i) TK_EQ(hrequest(t, conv[i], n + 3), 0);
        s = tier_stats(t);
        TK_CHECK(s.kept_host >= 4); /* the older conversations went down, node by node */
        for (i = 0; i < 3; ++i) { /* and come back whole, states and windows exact */
            TK_OK(kvc_tier_fetch(t, NS, conv[i], n + 3, &got));
            TK_EQ(got, n);
            TK_EQ(hrequest(t, conv[i], n + 3), n);
        }
        TK_OK(kvc_radix_destroy(t));
    }
}

/* Every allocation failing in turn during eviction and fetch. */
static void test_alloc_failures(tk_rng *rng) {
    int32_t a[MAXT], n = 3 * PC + 1, got, k, fetched_ok = 0;
    long allocs0, frees0;
    kvc_store_dir_state st;
    fill_tokens(rng, a, n);
    for (k = 0; k < 40; ++k) {
        kvc_pool *pool;
        kvc_radix *t;
        kvc_tier_config tc;
        kvc_result r;
        int with_store = k % 2;
        clear_dir();
        allocs0 = tk_allocs;
        frees0 = tk_frees;
        pool = make_pool(KVC_TYPE_F16, 16);
        t = make_tree(pool);
        kvc_tier_config_init(&tc);
        tc.host_bytes = with_store ? 0 : 1 << 20;
        if (with_store) kvc_store_dir(&st, g_dir, &tc.store);
        TK_OK(kvc_tier_attach(t, &tc));
        TK_OK(converse(t, a, n, NULL));
        tk_fail_after = k / 2;
        r = kvc_radix_evict(t, 1000, NULL); /* eviction never fails; the copy may */
        TK_OK(r);
        tk_fail_after = -1;
        TK_EQ(pages_used(pool), 0);
        tk_fail_after = k / 2;
        got = -1;
        r = kvc_tier_fetch(t, NS, a, n, &got);
        tk_fail_after = -1;
        TK_CHECK(r == KVC_OK || r == KVC_ERR_NO_MEMORY);
        if (got > 0) {
            fetched_ok++;
            TK_EQ(reuse_of(t, a, n, KVC_TYPE_F16), got);
        } else {
            TK_EQ(pages_used(pool), 0);
        }
        TK_OK(kvc_radix_destroy(t));
        TK_OK(kvc_pool_destroy(pool));
        TK_EQ(tk_allocs - allocs0, tk_frees - frees0); /* no leak */
    }
    TK_CHECK(fetched_ok > 0);
}

int main(int argc, char **argv) {
    unsigned long long seed = argc > 1 ? strtoull(argv[1], NULL, 10) : (unsigned long long)time(NULL);
    tk_rng rng;
    int round, rounds = tk_scaled(10);
    const char *tmp = getenv("TMPDIR");
    rng.s = seed;
    printf("test_tiers seed %llu\n", seed);
    snprintf(g_dir, sizeof(g_dir), "%s/kvc_tiers_XXXXXX", tmp != NULL && tmp[0] != '\0' ? tmp : "/tmp");
    if (mkdtemp(g_dir) == NULL) {
        fprintf(stderr, "mkdtemp failed\n");
        return 1;
    }
    test_sha256();
    test_keys();
    for (round = 0; round < rounds; ++round) {
        test_host_exact(&rng, KVC_TYPE_F32);
        test_host_exact(&rng, KVC_TYPE_F16);
        test_host_exact(&rng, KVC_TYPE_Q8_0);
        test_rotating(&rng);
        test_budget_and_spill(&rng);
        test_two_pools(&rng);
        test_refused(&rng);
        test_dead_store(&rng);
        test_slow_store(&rng);
        test_fetch_under_pressure(&rng);
        test_hybrid(&rng);
    }
    test_alloc_failures(&rng);
    clear_dir();
    rmdir(g_dir);
    return tk_report("tiers");
}
