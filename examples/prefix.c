/* prefix.c - single-entry prompt reuse (ollama's findRemaining / close) with kvc_prefix
   over a FULL cache: a follow-up request reuses the conversation so far, an edited
   request reuses up to the edit, an identical request still evaluates one token.

   Build (from the repository root):
       cc -std=c99 -O2 -Wall -Wextra -Wpedantic examples/prefix.c -o prefix -lm */
#define KVCACHE_IMPLEMENTATION
#include "../kvcache.h"

#include <stdio.h>
#include <string.h>

#define N_LAYERS 2
#define ROW 8        /* 1 kv head of 8 values */
#define PAGE 4
#define MAX_TOK 64

#define CHECK(call)                                                                     \
    do {                                                                                \
        kvc_result r_ = (call);                                                         \
        if (r_ != KVC_OK) {                                                             \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, kvc_strerror(r_)); \
            return 1;                                                                   \
        }                                                                               \
    } while (0)

static kvc_pool *pool;
static kvc_cache *cache;
static kvc_prefix *prefix;

/* A forward pass over n tokens (the fake model's K/V depend on the token id). */
static int forward(const int32_t *tokens, int32_t n) {
    static float k[MAX_TOK * ROW], v[MAX_TOK * ROW], q[MAX_TOK * ROW], out[MAX_TOK * ROW];
    int32_t i, layer;
    kvc_attention_desc a;
    for (i = 0; i < n * ROW; ++i) {
        k[i] = 0.001f * (float)tokens[i / ROW];
        v[i] = (float)tokens[i / ROW];
        q[i] = 1.0f;
    }
    CHECK(kvc_begin(cache, n));
    for (layer = 0; layer < N_LAYERS; ++layer) {
        CHECK(kvc_put(cache, layer, k, v));
        memset(&a, 0, sizeof(a));
        a.n_queries = n;
        a.n_heads = 1;
        a.q = q;
        a.out = out;
        CHECK(kvc_attention(cache, layer, &a));
    }
    return 0;
}

/* One request: reuse what the cache holds, evaluate the rest, generate n_gen tokens
   (the last one sampled but never fed back, as in a real decode loop), record. */
static int request(const char *name, const int32_t *prompt, int32_t n, int32_t n_gen) {
    int32_t reused, gen[8], i, offset, recorded;
    const int32_t *toks;
    kvc_pool_stats st;
    CHECK(kvc_prefix_begin(prefix, prompt, n, &reused));
    if (forward(prompt + reused, n - reused)) return 1;   /* evaluate the remainder */
    for (i = 0; i < n_gen; ++i) {
        gen[i] = 900 + i;                                 /* "sampled" from the logits */
        if (i + 1 < n_gen && forward(&gen[i], 1)) return 1;
    }
    CHECK(kvc_prefix_close(prefix, gen, n_gen));
    CHECK(kvc_prefix_tokens(prefix, &toks, &recorded));
    CHECK(kvc_cache_offset(cache, &offset));
    CHECK(kvc_pool_stats_get(pool, &st));
    printf("%-24s prompt %2d  reused %2d  evaluated %2d  generated %d  offset %2d  recorded %2d  pages %d\n",
           name, (int)n, (int)reused, (int)(n - reused), (int)n_gen, (int)offset, (int)recorded,
           (int)st.pages_used);
    return 0;
}

int main(void) {
    kvc_pool_config pc;
    kvc_cache_config cc;
    int32_t p1[12], p2[21], p3[10], i;

    CHECK(kvc_pool_config_init(&pc));
    pc.n_layers = N_LAYERS;
    pc.n_kv_heads = 1;
    pc.head_dim_k = pc.head_dim_v = ROW;
    pc.page_cells = PAGE;
    pc.budget_bytes = 32 * (size_t)(N_LAYERS * PAGE * ROW * 4 * 2); /* 32 pages */
    CHECK(kvc_pool_create(&pc, &pool));
    memset(&cc, 0, sizeof(cc));
    cc.kind = KVC_KIND_FULL;
    CHECK(kvc_cache_create(pool, &cc, &cache));
    /* one cache per layer group; a model mixing full and sliding layers passes both */
    CHECK(kvc_prefix_create(&cache, 1, MAX_TOK, &prefix));

    /* Request 1: a 12-token prompt, 4 generated tokens (3 of them evaluated). */
    for (i = 0; i < 12; ++i) p1[i] = 100 + i;
    if (request("1: new prompt", p1, 12, 4)) return 1;

    /* Request 2: the conversation so far (prompt + the 4 replies) + 5 new tokens.
       The cache holds 15 of those 16 tokens; the 16th was never evaluated. */
    memcpy(p2, p1, sizeof(p1));
    for (i = 0; i < 4; ++i) p2[12 + i] = 900 + i;
    for (i = 16; i < 21; ++i) p2[i] = 200 + i;
    if (request("2: follow-up", p2, 21, 2)) return 1;

    /* Request 3: the user edited the prompt at token 8: reuse stops there and the
       cache is trimmed back to 8 tokens (its later pages return to the pool). */
    memcpy(p3, p1, 8 * sizeof(int32_t));
    p3[8] = 777;
    p3[9] = 778;
    if (request("3: edited at token 8", p3, 10, 0)) return 1;

    /* Request 4: exactly what the cache holds. Everything matches, yet one token is
       evaluated again: its logits are needed to sample the first new token. */
    if (request("4: identical", p3, 10, 0)) return 1;

    CHECK(kvc_prefix_destroy(prefix));
    CHECK(kvc_cache_destroy(cache));
    CHECK(kvc_pool_destroy(pool));
    return 0;
}
