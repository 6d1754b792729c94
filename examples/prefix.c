/* prefix.c - prompt reuse, two ways.

   Part 1, single entry (ollama's MLX runner's findRemaining / close) with kvc_prefix
   over a FULL cache: a follow-up request reuses the conversation so far, an edited
   request reuses up to the edit, an identical request still evaluates one token.

   Part 2, the radix prefix cache (kvc_radix): three characters of a game share one long
   system prompt, each with its own conversation, on a small fixed budget. The system
   prompt was computed once by an earlier run and saved to a file (atomically); at
   start-up it is loaded and pinned. Shows pages used with sharing vs. without, the hit
   counters, and eviction of the least recently used conversations under pressure while
   the pinned system prompt stays. Every number printed is also checked: the program
   exits 1 if one is not what it should be.

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

#define EXPECT(cond)                                                                    \
    do {                                                                                \
        if (!(cond)) {                                                                  \
            fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #cond);          \
            return 1;                                                                   \
        }                                                                               \
    } while (0)

static kvc_pool *pool;
static kvc_cache *cache;
static kvc_prefix *prefix;
static float last_out[ROW]; /* the attention output of the last token of the last pass */

/* A forward pass over n tokens into cache c (the fake model's K/V depend on the token
   id and position, so a wrongly stitched prefix would change the outputs). */
static int forward_into(kvc_cache *c, const int32_t *tokens, int32_t n) {
    static float k[MAX_TOK * ROW], v[MAX_TOK * ROW], q[MAX_TOK * ROW], out[MAX_TOK * ROW];
    int32_t i, layer, off;
    kvc_attention_desc a;
    CHECK(kvc_cache_offset(c, &off));
    for (i = 0; i < n * ROW; ++i) {
        k[i] = 0.001f * (float)tokens[i / ROW] + 0.0001f * (float)((off + i / ROW) % 7);
        v[i] = (float)tokens[i / ROW] + (float)(i % ROW);
        q[i] = 1.0f;
    }
    CHECK(kvc_begin(c, n, NULL, 0));
    for (layer = 0; layer < N_LAYERS; ++layer) {
        CHECK(kvc_put(c, layer, k, v));
        memset(&a, 0, sizeof(a));
        a.n_queries = n;
        a.n_heads = 1;
        a.q = q;
        a.out = out;
        CHECK(kvc_attention(c, layer, &a));
    }
    memcpy(last_out, out + (size_t)(n - 1) * ROW, sizeof(last_out));
    return 0;
}
static int forward(const int32_t *tokens, int32_t n) { return forward_into(cache, tokens, n); }

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

int part2(void);

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
    printf("== part 1: single-entry reuse (kvc_prefix)\n");
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
    return part2();
}

/* ---- part 2: the radix prefix cache ------------------------------------------------ */

#define SYS 30       /* system prompt tokens: 7.5 pages of 4 */
#define N_CHARS 3
#define SAVED "prefix_system_prompt.kvc"

static const kvc_namespace GAME = {0x6d6f64656c31ull, 0}; /* the model's id; no tenants */
static int32_t system_prompt[SYS];

static int32_t pool_pages(void) {
    kvc_pool_stats st;
    kvc_pool_stats_get(pool, &st);
    return st.pages_used;
}

/* An earlier run: evaluate the system prompt once, save the tree's entry to a file
   (written to a temporary file and renamed: never seen half-written). */
static int earlier_run(const kvc_pool_config *pc) {
    kvc_pool *p;
    kvc_radix *t;
    kvc_radix_config rc;
    kvc_cache *c;
    kvc_path_io file;
    kvc_io io;
    int32_t reused;
    CHECK(kvc_pool_create(pc, &p));
    kvc_radix_config_init(&rc, KVC_KIND_FULL);
    CHECK(kvc_radix_create(p, &rc, &t));
    CHECK(kvc_radix_lookup(t, GAME, system_prompt, SYS, &c, &reused));
    if (forward_into(c, system_prompt, SYS)) return 1;
    CHECK(kvc_radix_commit(t, GAME, c, system_prompt, SYS, 0));
    CHECK(kvc_io_path(&file, SAVED, 1, &io));
    CHECK(kvc_radix_save(t, GAME, system_prompt, SYS, &io));
    CHECK(kvc_cache_destroy(c));
    CHECK(kvc_radix_destroy(t));
    CHECK(kvc_pool_destroy(p));
    return 0;
}

/* One turn of a character's conversation: look the history up, evaluate the rest,
   generate 4 tokens (the last one sampled, not evaluated), commit it all. */
static int converse(kvc_radix *t, int32_t *hist, int32_t n, int32_t *n_total, kvc_cache **out, int32_t *reused) {
    int32_t i;
    kvc_cache *c;
    CHECK(kvc_radix_lookup(t, GAME, hist, n, &c, reused));
    if (forward_into(c, hist + *reused, n - *reused)) return 1;
    for (i = 0; i < 4; ++i) {
        hist[n + i] = 700 + 10 * (int32_t)(hist[SYS] % 10) + i; /* "sampled" */
        if (i < 3 && forward_into(c, &hist[n + i], 1)) return 1;
    }
    CHECK(kvc_radix_commit(t, GAME, c, hist, n + 4, 0)); /* prompt AND the generated tokens */
    *n_total = n + 4;
    *out = c;
    return 0;
}

/* The same tokens evaluated from scratch in a cache of their own give the same output. */
static int same_as_fresh(const int32_t *tokens, int32_t n, const float *out) {
    kvc_cache_config cc;
    kvc_cache *fresh;
    int same;
    CHECK(kvc_cache_config_init(&cc, KVC_KIND_FULL));
    CHECK(kvc_cache_create(pool, &cc, &fresh));
    if (forward_into(fresh, tokens, n)) return 0;
    same = memcmp(out, last_out, sizeof(last_out)) == 0;
    CHECK(kvc_cache_destroy(fresh));
    return same;
}

int part2(void) {
    kvc_pool_config pc;
    kvc_radix_config rc;
    kvc_radix *tree;
    kvc_radix_stats st;
    kvc_cache *conv[N_CHARS], *hog;
    kvc_cache_config hog_cfg;
    kvc_path_io file;
    kvc_io io;
    int32_t hist[N_CHARS][MAX_TOK], len[N_CHARS], i, j, reused, loaded, alone = 0, shared_pages, total;
    float out[ROW];

    printf("\n== part 2: three characters share a %d-token system prompt (kvc_radix)\n", SYS);
    for (i = 0; i < SYS; ++i) system_prompt[i] = 10 + i;
    CHECK(kvc_cache_config_init(&hog_cfg, KVC_KIND_FULL));
    CHECK(kvc_pool_config_init(&pc));
    pc.n_layers = N_LAYERS;
    pc.n_kv_heads = 1;
    pc.head_dim_k = pc.head_dim_v = ROW;
    pc.page_cells = PAGE;
    pc.budget_bytes = 34 * (size_t)(N_LAYERS * PAGE * ROW * 4 * 2); /* 34 pages of 4 tokens */
    if (earlier_run(&pc)) return 1;

    /* start-up: the saved system prompt, loaded and pinned: nothing to evaluate */
    CHECK(kvc_pool_create(&pc, &pool));
    kvc_radix_config_init(&rc, KVC_KIND_FULL);
    CHECK(kvc_radix_create(pool, &rc, &tree));
    CHECK(kvc_io_path(&file, SAVED, 0, &io));
    CHECK(kvc_radix_load(tree, GAME, &io, 1 /* pin */, &loaded));
    remove(SAVED);
    printf("start-up: loaded the saved system prompt (%d tokens, %d pages), pinned\n", (int)loaded, (int)pool_pages());
    EXPECT(loaded == SYS && pool_pages() == 8);

    /* turn 1 of every character: system prompt + 6 tokens of its own */
    for (i = 0; i < N_CHARS; ++i) {
        memcpy(hist[i], system_prompt, sizeof(system_prompt));
        for (j = 0; j < 6; ++j) hist[i][SYS + j] = 100 * (i + 1) + j;
        if (converse(tree, hist[i], SYS + 6, &len[i], &conv[i], &reused)) return 1;
        EXPECT(reused == SYS);
        memcpy(out, last_out, sizeof(out));
        EXPECT(same_as_fresh(hist[i], len[i] - 1, out)); /* the stitched cache computes the same */
        printf("character %d, turn 1: prompt %d tokens, reused %d, evaluated %d, generated 4\n", i + 1,
               SYS + 6, (int)reused, SYS + 6 - (int)reused);
    }
    /* pages: each conversation's cache references 10 pages; alone they would own them */
    for (i = 0; i < N_CHARS; ++i) {
        int32_t np;
        CHECK(kvc_cache_pages(conv[i], &np));
        alone += np;
    }
    shared_pages = pool_pages();
    printf("pages: %d with sharing (the system prompt's 8 once, page 7 copied where each "
           "conversation starts) vs %d without\n", (int)shared_pages, (int)alone);
    EXPECT(alone == 3 * 10 && shared_pages == 8 + 3 * 3);

    /* turn 2 of character 1: the whole history, generated tokens included, is reused */
    total = len[0];
    for (j = 0; j < 5; ++j) hist[0][total + j] = 900 + j;
    CHECK(kvc_cache_destroy(conv[0]));
    if (converse(tree, hist[0], total + 5, &len[0], &conv[0], &reused)) return 1;
    printf("character 1, turn 2: prompt %d tokens (history + 5 new), reused %d, evaluated %d\n", (int)(total + 5),
           (int)reused, (int)(total + 5 - reused));
    EXPECT(reused == total - 1); /* the last generated token was never evaluated */
    memcpy(out, last_out, sizeof(out));
    EXPECT(same_as_fresh(hist[0], len[0] - 1, out));

    CHECK(kvc_radix_stats_get(tree, &st));
    printf("hits: %d lookups, %d of %d tokens found cached (%.0f %%)\n", (int)st.lookups, (int)st.tokens_hit,
           (int)st.tokens_queried, 100.0 * (double)st.tokens_hit / (double)st.tokens_queried);
    EXPECT(st.lookups == 4 && st.tokens_hit == (uint64_t)(3 * SYS + total - 1) &&
           st.tokens_queried == (uint64_t)(3 * (SYS + 6) + total + 5));

    /* eviction: the conversations end, the tree keeps them; another task needs 20 of
       the 34 pages. The least recently used conversations go first (2, then 3); the
       pinned system prompt and character 1 (used last) stay. */
    for (i = 0; i < N_CHARS; ++i) CHECK(kvc_cache_destroy(conv[i]));
    printf("the conversations end: the tree keeps %d pages, %d of 34 are free\n", (int)pool_pages(),
           34 - (int)pool_pages());
    EXPECT(pool_pages() == 20);
    CHECK(kvc_cache_create(pool, &hog_cfg, &hog));
    {
        int32_t big[40];
        for (i = 0; i < 40; ++i) big[i] = 5000 + i;
        if (forward_into(hog, big, 40) || forward_into(hog, big, 40)) return 1; /* 80 tokens */
    }
    CHECK(kvc_radix_stats_get(tree, &st));
    printf("a task of 20 pages: %d conversations evicted (%d pages), %d pages used\n", (int)st.entries_evicted,
           (int)st.pages_evicted, (int)pool_pages());
    EXPECT(st.entries_evicted == 2 && st.pages_evicted == 6 && pool_pages() == 34);
    for (i = 0; i < N_CHARS; ++i) {
        kvc_cache *c;
        CHECK(kvc_radix_lookup(tree, GAME, hist[i], len[i], &c, &reused));
        printf("character %d looks up its history: %d of %d tokens still cached\n", i + 1, (int)reused, (int)len[i]);
        EXPECT(reused == (i == 0 ? len[0] - 1 : SYS));
        CHECK(kvc_cache_destroy(c));
    }
    CHECK(kvc_cache_destroy(hog));
    CHECK(kvc_radix_destroy(tree));
    EXPECT(pool_pages() == 0);
    CHECK(kvc_pool_destroy(pool));
    printf("all checks passed\n");
    return 0;
}
