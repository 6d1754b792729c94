/* hybrid.c - the memory of a hybrid model: recurrent layers beside full attention
   layers (the layout of LFM2, Qwen3-Next or Granite 4 H), one kvc_memory over both.

   A toy model of 6 layers, R R A R R A: the recurrent layers (R) keep a state of 8
   floats that decays and adds the token, s = s / 2 + x(token); the attention layers
   (A) store K/V rows that encode token and position. Shows the configuration (and a
   bad one named by kvc_memory_config_check), a prefill with checkpoints, a branch
   (snapshot, generate, restore, generate another), prompt reuse across requests with
   kvc_prefix_create_memory, what the budget holds, and many conversations through one
   radix prefix tree over the memory. Every result is compared with
   the same tokens computed from scratch: the program exits 1 on a mismatch.

   Build (from the repository root):
       cc -std=c99 -O2 -Wall -Wextra -Wpedantic examples/hybrid.c -o hybrid -lm */
#define KVCACHE_IMPLEMENTATION
#include "../kvcache.h"

#include <stdio.h>
#include <string.h>

#define N_LAYERS 6
#define STATE 8   /* floats of state per recurrent layer */
#define ROW 8     /* attention: 2 kv heads of 4 values */
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

static const int32_t layer_group[N_LAYERS] = {0, 0, 1, 0, 0, 1}; /* 0: recurrent, 1: attention */
static kvc_group_config groups[2];
static kvc_memory_config config;

static int is_recurrent(int32_t layer) { return layer_group[layer] == 0; }
static float x_of(int32_t token, int32_t layer, int32_t i) { return (float)((token * 7 + layer * 3 + i) % 17 - 8); }

/* One forward pass over tokens[off .. off+n) with checkpoints at[0..n_at). A recurrent
   layer scans its tokens and hands the state over at each checkpoint inside the batch
   (the batch's end is taken from the live state); an attention layer puts its K/V. */
static int forward(kvc_memory *m, const int32_t *tokens, int32_t off, int32_t n, const int32_t *at, int32_t n_at) {
    static float kv[MAX_TOK * ROW];
    int32_t layer, t, i, k;
    CHECK(kvc_memory_begin(m, n, at, n_at));
    for (layer = 0; layer < N_LAYERS; ++layer) {
        if (is_recurrent(layer)) {
            float *s;
            CHECK(kvc_memory_state(m, layer, 0, &s)); /* the live state, updated in place */
            for (t = off, k = 0; t < off + n; ++t) {
                for (i = 0; i < STATE; ++i) s[i] = s[i] * 0.5f + x_of(tokens[t], layer, i);
                if (k < n_at && at[k] == t + 1) { /* a copy for a checkpoint inside the batch */
                    if (t + 1 < off + n) CHECK(kvc_memory_state_checkpoint(m, layer, t + 1, s));
                    k++;
                }
            }
        } else {
            for (t = 0; t < n; ++t)
                for (i = 0; i < ROW; ++i) kv[t * ROW + i] = (float)(tokens[off + t] * 100 + (off + t) + i * layer);
            CHECK(kvc_memory_put(m, layer, kv, kv));
        }
    }
    return 0;
}

/* Generate n tokens one at a time after what m holds: seq[offset + i] = base + i (a
   stand-in for sampling), each fed back; with ckpt_end the last batch names its end
   as a checkpoint, so that a later request can come back to the end of this reply. */
static int generate(kvc_memory *m, int32_t *seq, int32_t n, int32_t base, int ckpt_end) {
    int32_t i, off;
    for (i = 0; i < n; ++i) {
        int32_t end;
        CHECK(kvc_memory_offset(m, &off));
        seq[off] = base + i;
        end = off + 1;
        if (forward(m, seq, off, 1, &end, ckpt_end && i == n - 1)) return 1;
    }
    return 0;
}

/* Whether m holds exactly what a fresh memory fed tokens[0..n) in one batch holds:
   every recurrent state and every attention layer's K/V and positions. */
static int same_as_recompute(kvc_memory *m, const int32_t *tokens, int32_t n) {
    kvc_memory *ref;
    int32_t layer, off;
    CHECK(kvc_memory_offset(m, &off));
    if (off != n) return 0;
    CHECK(kvc_memory_create(&config, &ref));
    if (forward(ref, tokens, 0, n, NULL, 0)) return 0;
    for (layer = 0; layer < N_LAYERS; ++layer) {
        kvc_cache *a, *b;
        int32_t gl, na = 0, nb = 0, pa[MAX_TOK], pb[MAX_TOK];
        static float ka[MAX_TOK * ROW], kb[MAX_TOK * ROW], va[MAX_TOK * ROW], vb[MAX_TOK * ROW];
        CHECK(kvc_memory_layer(m, layer, &a, &gl));
        CHECK(kvc_memory_layer(ref, layer, &b, &gl));
        if (is_recurrent(layer)) {
            const float *sa, *sb;
            CHECK(kvc_state_read(a, 0, gl, &sa));
            CHECK(kvc_state_read(b, 0, gl, &sb));
            if ((sa == NULL) != (sb == NULL) || (sa && memcmp(sa, sb, sizeof(float) * STATE) != 0)) off = -1;
        } else {
            CHECK(kvc_cache_gather(a, gl, ka, va, pa, MAX_TOK, &na));
            CHECK(kvc_cache_gather(b, gl, kb, vb, pb, MAX_TOK, &nb));
            if (na != nb || memcmp(ka, kb, sizeof(float) * (size_t)(na * ROW)) != 0 ||
                memcmp(va, vb, sizeof(float) * (size_t)(na * ROW)) != 0 || memcmp(pa, pb, sizeof(int32_t) * (size_t)na) != 0)
                off = -1;
        }
    }
    CHECK(kvc_memory_destroy(ref));
    return off == n;
}

static int show_stats(kvc_memory *m, const char *when, kvc_memory_stats *st) {
    CHECK(kvc_memory_stats_get(m, st));
    printf("  %-18s %2d tokens, %4zu of %zu budget bytes used, %3zu by checkpoints only, %d checkpoints\n", when,
           (int)st->offset, st->bytes_used, st->budget_bytes, st->checkpoint_bytes, (int)st->n_checkpoints);
    return 0;
}

int main(void) {
    int32_t tokens[MAX_TOK], req[MAX_TOK], i, reused, n1, n2, n3;
    const char *field = NULL;
    size_t state_page, kv_page;
    kvc_memory_stats st;
    kvc_memory *mem;
    kvc_memory_snapshot *snap;
    kvc_prefix *prefix;

    /* 1. Configuration: a state pool for the recurrent group (4 layers), a K/V pool for
       the attention group (2 layers), one budget for both. */
    CHECK(kvc_pool_config_init(&groups[0].pool));
    CHECK(kvc_pool_config_init(&groups[1].pool));
    groups[0].pool.n_layers = 4;
    groups[0].pool.state_floats = STATE;
    CHECK(kvc_cache_config_init(&groups[0].cache, KVC_KIND_RECURRENT)); /* keeps 8 checkpoints */
    groups[1].pool.n_layers = 2;
    groups[1].pool.n_kv_heads = 2;
    groups[1].pool.head_dim_k = groups[1].pool.head_dim_v = 4;
    groups[1].pool.type_k = groups[1].pool.type_v = KVC_TYPE_F32;
    groups[1].pool.page_cells = 8;
    CHECK(kvc_cache_config_init(&groups[1].cache, KVC_KIND_FULL));
    CHECK(kvc_memory_config_init(&config));
    config.n_layers = N_LAYERS;
    config.layer_group = layer_group;
    config.n_groups = 2;
    config.groups = groups;
    config.budget_bytes = 16 * 1024;
    groups[0].pool.n_layers = 3; /* wrong on purpose: four layers map to group 0 */
    EXPECT(kvc_memory_config_check(&config, &field) != KVC_OK && field != NULL);
    printf("config check with 3 layers in group 0: %s (field \"%s\")\n",
           kvc_strerror(kvc_memory_config_check(&config, &field)), field);
    EXPECT(strcmp(field, "groups.pool.n_layers") == 0);
    groups[0].pool.n_layers = 4;
    CHECK(kvc_memory_config_check(&config, &field));
    CHECK(kvc_memory_create(&config, &mem));
    CHECK(kvc_pool_page_bytes(&groups[0].pool, &state_page)); /* one state of every layer */
    CHECK(kvc_pool_page_bytes(&groups[1].pool, &kv_page));    /* 8 tokens of K and V */
    printf("a state page holds %zu bytes, a K/V page %zu bytes (8 tokens)\n", state_page, kv_page);

    /* 2. A prefill of 20 tokens with checkpoints at 8 and 16 (and its end): the memory can
       go back to them later, the recurrent group only to them. */
    for (i = 0; i < MAX_TOK; ++i) tokens[i] = 10 + (i * 5) % 23;
    {
        int32_t at[3] = {8, 16, 20};
        if (forward(mem, tokens, 0, 20, at, 3)) return 1;
    }
    printf("prefill of 20 tokens, checkpoints at 8, 16, 20:\n");
    if (show_stats(mem, "after the prefill", &st)) return 1;
    /* 3 K/V pages; 3 states: the live one and the checkpoints at 8 and 16 (the one at
       the batch's end shares the live state until the next batch writes it) */
    EXPECT(st.bytes_used == 3 * kv_page + 3 * state_page && st.n_checkpoints == 2);
    EXPECT(same_as_recompute(mem, tokens, 20));
    {
        int ok12, ok16;
        CHECK(kvc_memory_can_rewind(mem, 12, &ok12));
        CHECK(kvc_memory_can_rewind(mem, 16, &ok16));
        printf("  can rewind to 12: %s, to 16: %s\n", ok12 ? "yes" : "no", ok16 ? "yes" : "no");
        EXPECT(!ok12 && ok16);
    }

    /* 3. A branch: snapshot at 20, generate A, restore, generate B. */
    CHECK(kvc_memory_snapshot_take(mem, 0, 20, &snap));
    memcpy(req, tokens, sizeof(int32_t) * 20);
    if (generate(mem, req, 4, 500, 0)) return 1;
    EXPECT(same_as_recompute(mem, req, 24));
    CHECK(kvc_memory_restore(mem, snap, 20));
    if (generate(mem, req, 4, 600, 0)) return 1;
    EXPECT(req[20] == 600 && same_as_recompute(mem, req, 24));
    printf("branch: snapshot at 20, 4 tokens of A, restore, 4 tokens of B: B equals a recompute\n");
    /* the snapshot carries the checkpoints before 20 (it shares their state pages), so no
       page is held by checkpoints only */
    if (show_stats(mem, "with the snapshot", &st)) return 1;
    CHECK(kvc_memory_snapshot_free(snap));

    /* 4. Prompt reuse across requests. Request 1: a system prompt (12 tokens) and a user
       message (8), checkpoints at the end of each; 4 tokens generated, a checkpoint at
       the last. Request 2 edits the user message: it reuses the system prompt only. */
    CHECK(kvc_memory_clear(mem));
    CHECK(kvc_prefix_create_memory(mem, MAX_TOK, &prefix));
    n1 = 20;
    CHECK(kvc_prefix_begin(prefix, tokens, n1, &reused));
    {
        int32_t at[2] = {12, 20};
        if (forward(mem, tokens, reused, n1 - reused, at, 2)) return 1;
    }
    if (generate(mem, tokens, 4, 700, 1)) return 1;
    CHECK(kvc_prefix_close(prefix, tokens + n1, 4));
    printf("request 1: %d tokens, %d reused\n", (int)n1, (int)reused);
    EXPECT(reused == 0);

    n2 = 16; /* the system prompt and a different user message */
    memcpy(req, tokens, sizeof(int32_t) * 12);
    for (i = 12; i < n2; ++i) req[i] = 800 + i;
    CHECK(kvc_prefix_begin(prefix, req, n2, &reused));
    printf("request 2 (user message edited): %d tokens, %d reused (the checkpoint at 12)\n", (int)n2, (int)reused);
    EXPECT(reused == 12);
    if (forward(mem, req, reused, n2 - reused, &n2, 1)) return 1;
    CHECK(kvc_prefix_close(prefix, NULL, 0));
    EXPECT(same_as_recompute(mem, req, n2));

    /* Request 3 goes on from request 2 verbatim: everything is reused (the live state). */
    n3 = 22;
    for (i = n2; i < n3; ++i) req[i] = 900 + i;
    CHECK(kvc_prefix_begin(prefix, req, n3, &reused));
    printf("request 3 (a follow-up): %d tokens, %d reused\n", (int)n3, (int)reused);
    EXPECT(reused == n2);
    if (forward(mem, req, reused, n3 - reused, NULL, 0)) return 1;
    CHECK(kvc_prefix_close(prefix, NULL, 0));
    EXPECT(same_as_recompute(mem, req, n3));
    printf("after each request the memory equals a recompute from scratch\n");

    /* 5. What the budget holds: attention pages, the live states and the checkpoints
       (a checkpoint's state page is its own; its K/V pages are shared with the cache). */
    if (show_stats(mem, "at the end", &st)) return 1;
    EXPECT(st.offset == n3 && st.bytes_used <= st.budget_bytes);

    CHECK(kvc_prefix_destroy(prefix));

    /* 6. Many conversations: one radix prefix tree over the memory. Its entries hold the
       attention group's pages and the recurrent group's states at the checkpoints a
       request named, so a conversation that shares only the system prompt resumes from
       the state at its end, and a second turn resumes from the first turn's end. */
    {
        kvc_radix_config rc;
        kvc_radix *tree;
        kvc_radix_stats ts;
        kvc_memory *conv;
        kvc_namespace ns = {42, 0};
        int32_t a[MAX_TOK], b[MAX_TOK], at[2] = {12, 20};
        CHECK(kvc_radix_config_init(&rc, KVC_KIND_FULL)); /* a memory's tree: the groups' kinds */
        CHECK(kvc_radix_create_memory(mem, &rc, &tree));
        for (i = 0; i < 24; ++i) a[i] = tokens[i];                    /* system prompt + user A */
        for (i = 0; i < 20; ++i) b[i] = i < 12 ? tokens[i] : 300 + i; /* same system prompt + user B */
        CHECK(kvc_radix_lookup_memory(tree, ns, a, 20, &conv, &reused));
        if (forward(conv, a, reused, 20 - reused, at, 2)) return 1;
        if (generate(conv, a, 4, 950, 1)) return 1;                  /* the reply, a checkpoint at 24 */
        CHECK(kvc_radix_commit_memory(tree, ns, conv, a, 24, 0));
        CHECK(kvc_memory_destroy(conv));
        printf("tree: conversation A committed (24 tokens, states at 12, 20, 24)\n");
        CHECK(kvc_radix_lookup_memory(tree, ns, b, 20, &conv, &reused));
        printf("tree: conversation B (same system prompt) reuses %d tokens\n", (int)reused);
        EXPECT(reused == 12);
        if (forward(conv, b, reused, 20 - reused, &at[1], 1)) return 1;
        EXPECT(same_as_recompute(conv, b, 20));
        CHECK(kvc_radix_commit_memory(tree, ns, conv, b, 20, 0));
        CHECK(kvc_memory_destroy(conv));
        for (i = 24; i < 30; ++i) a[i] = 960 + i;                     /* A's second turn */
        CHECK(kvc_radix_lookup_memory(tree, ns, a, 30, &conv, &reused));
        printf("tree: A's second turn (30 tokens) reuses %d\n", (int)reused);
        EXPECT(reused == 24);
        if (forward(conv, a, reused, 30 - reused, NULL, 0)) return 1;
        EXPECT(same_as_recompute(conv, a, 30));
        CHECK(kvc_memory_destroy(conv));
        CHECK(kvc_radix_stats_get(tree, &ts));
        printf("tree: %d nodes, %d entries, %d states, %zu bytes of pages and states\n", (int)ts.n_nodes,
               (int)ts.n_entries, (int)ts.n_states, ts.bytes);
        CHECK(kvc_radix_destroy(tree));
    }
    CHECK(kvc_memory_destroy(mem));
    return 0;
}
