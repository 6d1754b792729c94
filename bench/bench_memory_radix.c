/* bench_memory_radix.c - many conversations served through one radix tree over a hybrid
   model memory (kvc_radix_create_memory), run by `make bench`.

   Shapes: bench_hybrid's layer layouts, 24 layers each, with smaller layers so that 100
   conversations fit this machine (attention layers 2 kv heads x head dim 64, f16: 512
   bytes of K+V per layer and token; 64 cells per page, as turns are ~100 tokens and a
   tree node shares the page its span ends in, which the next turn copies on write):
     hybrid   18 recurrent layers beside 6 full-attention layers (every 4th); the state
              is a short-convolution state of (L - 1) x hidden = 2 x 2048 f32 (16 KiB a
              layer, 288 KiB a sequence), updated in place by a cheap loop (every 64th
              float per token; the model math is not modelled, only the cache's work)
     sliding  20 sliding-window layers (window 512) beside 4 full-attention layers
   Random K/V (rows of a fixed table picked by position and token).

   --convs conversations (default 100) of --turns turns (default 10) over one shared
   256-token system prompt, served round-robin (turn 0 of every conversation, then
   turn 1, ...) so that they compete for one --budget-mib budget, small enough that the
   tree evicts. The system prompt is evaluated and committed once, with priority 2. Each
   turn: prompt = system prompt + the conversation so far + a new user message of
   20-100 tokens; kvc_radix_lookup_memory; the rest of the prompt evaluated (batches of
   512) with a checkpoint named at its end; a reply of 20-60 tokens generated one at a
   time (its last token, the end of the turn, sampled and never fed); the prompt and the
   fed reply committed with priority 0.
   Checked after every lookup (exit 1 if wrong): the reused length is one where this
   conversation (or the system prompt) committed a state, at most the minimum, and equal
   to it when nothing was evicted since the conversation's last commit; the reused
   memory holds that prefix's state (first recurrent layer) and K/V (every cell of the
   first layer of each attention group).
   The minimum a turn recomputes: the tokens after the end of the conversation's last
   commit (where the tree holds its live state), i.e. the end-of-turn token and the new
   message. Printed: per turn index, tokens recomputed against that minimum, turns over
   it (and each one that went back to the system prompt or further: a full
   re-processing of the conversation), the hit rate (tokens reused / tokens queried),
   the tree's pages and bytes against the budget (peak and end), entries evicted, the
   median and 99th percentile of the conversations' lookups. Then lookup + ready memory
   of a cached 32k-token prefix (kvc_radix_lookup_memory; committed with a checkpoint
   at every 512 tokens, the last 8 kept: 9 nodes), median of --reps, beside
   kvc_radix_lookup on a pool of the same full-attention layers, the two timed
   alternately in the same run. Nothing is asserted about timings. About 10 s.

   Build:  cc -std=c99 -O2 -Wall -Wextra -Wpedantic bench/bench_memory_radix.c -o bench_memory_radix -lm
   Usage:  bench_memory_radix [--quick] [--convs N] [--turns N] [--reps N] [--budget-mib N] [--help]
   (--help lists them with their defaults; --quick: 10 conversations x 3 turns, 5 reps) */
#define _POSIX_C_SOURCE 200809L
#define KVCACHE_IMPLEMENTATION
#include "../kvcache.h"
#include "bench_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_LAYERS 24
#define KV_HEADS 2
#define HEAD_DIM 64
#define ROW (KV_HEADS * HEAD_DIM)
#define PAGE 64
#define WINDOW 512
#define STATE_FLOATS (2 * 2048)
#define STATE_STRIDE 64
#define CHUNK 512
#define SYSTEM_TOKENS 256
#define MSG_MIN 20
#define MSG_MAX 100
#define REPLY_MIN 20
#define REPLY_MAX 60
#define MAX_TURNS 64
#define MAX_CONVS 1000
#define MAX_TOKENS (SYSTEM_TOKENS + MAX_TURNS * (MSG_MAX + REPLY_MAX))
#define LONG_PREFIX 32768
#define MAX_REPS 101
#define TABLE_ROWS 256
#define EOT 2
#define MIB (1024.0 * 1024.0)

static const kvc_namespace NS = {1, 0};

typedef struct shape {
    const char *name;
    int hybrid;
    int32_t group_of[N_LAYERS]; /* 0: recurrent or sliding, 1: full attention */
    int32_t n_full;
    kvc_group_config groups[2];
    kvc_memory_config cfg;
} shape;

typedef struct conv {
    int32_t *tok;                   /* the history: system prompt, messages, replies */
    int32_t n;
    int32_t bounds[2 * MAX_TURNS + 1]; /* offsets where it committed a state, ascending */
    int32_t n_bounds;
    uint64_t evicted;               /* the tree's entries_evicted after its last commit */
    uint64_t rng;
} conv;

typedef struct turn_stats {         /* one turn index, over every conversation */
    long prompt, recomputed, minimum, over, over_tokens, full, sys_lost;
} turn_stats;

static int g_convs = 100, g_turns = 10, g_reps = 21, g_quick = 0;
static double g_budget_mib[2] = {0, 0}; /* per shape; 0: the default */
static float *g_table;                  /* TABLE_ROWS rows, multiples of 1/1024: exact in f16 */
static float *g_k;                      /* one batch of K (= V) rows */
static float *g_gather;                 /* one layer's gathered K rows */
static int32_t *g_pos;

static uint64_t rng_next(uint64_t *s) { /* xorshift64* */
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}
static int32_t rng_range(uint64_t *s, int32_t lo, int32_t hi) { return lo + (int32_t)(rng_next(s) % (uint64_t)(hi - lo + 1)); }

static uint32_t row_of(int32_t pos, int32_t token) {
    return ((uint32_t)pos * 2654435761u ^ (uint32_t)token * 40503u) % TABLE_ROWS;
}

static void shape_init(shape *sh, int hybrid, size_t budget) {
    int32_t l;
    kvc_group_config *g = sh->groups;
    memset(sh, 0, sizeof(*sh));
    sh->name = hybrid ? "hybrid" : "sliding";
    sh->hybrid = hybrid;
    for (l = 0; l < N_LAYERS; ++l) {
        sh->group_of[l] = hybrid ? (l % 4 == 3) : (l % 6 == 5);
        sh->n_full += sh->group_of[l];
    }
    g[1].pool.n_layers = sh->n_full;
    g[1].pool.n_kv_heads = KV_HEADS;
    g[1].pool.head_dim_k = g[1].pool.head_dim_v = HEAD_DIM;
    g[1].pool.type_k = g[1].pool.type_v = KVC_TYPE_F16;
    g[1].pool.page_cells = PAGE;
    CHECK(kvc_cache_config_init(&g[1].cache, KVC_KIND_FULL));
    if (hybrid) {
        g[0].pool.n_layers = N_LAYERS - sh->n_full;
        g[0].pool.state_floats = STATE_FLOATS;
        CHECK(kvc_cache_config_init(&g[0].cache, KVC_KIND_RECURRENT)); /* 8 checkpoints kept */
    } else {
        g[0].pool = g[1].pool;
        g[0].pool.n_layers = N_LAYERS - sh->n_full;
        CHECK(kvc_cache_config_init(&g[0].cache, KVC_KIND_ROTATING));
        g[0].cache.window = WINDOW;
    }
    CHECK(kvc_memory_config_init(&sh->cfg));
    sh->cfg.n_layers = N_LAYERS;
    sh->cfg.layer_group = sh->group_of;
    sh->cfg.n_groups = 2;
    sh->cfg.groups = sh->groups;
    sh->cfg.budget_bytes = budget;
}

/* the state update of one token on recurrent layer gl */
static void state_step(float *s, int32_t token, int32_t gl) {
    int32_t i;
    for (i = (token + gl) % STATE_STRIDE; i < STATE_FLOATS; i += STATE_STRIDE) s[i] = s[i] * 0.5f + (float)(token % 17);
}

/* One batch: tokens[off .. off+n) with checkpoints at[0..n_at). */
static void forward(const shape *sh, kvc_memory *m, const int32_t *tokens, int32_t off, int32_t n, const int32_t *at,
                    int32_t n_at) {
    int32_t l, t, k, gl;
    for (t = 0; t < n; ++t)
        memcpy(g_k + (size_t)t * ROW, g_table + (size_t)row_of(off + t, tokens[off + t]) * ROW, sizeof(float) * ROW);
    CHECK(kvc_memory_begin(m, n, at, n_at));
    for (l = 0, gl = 0; l < N_LAYERS; ++l) {
        if (sh->hybrid && sh->group_of[l] == 0) {
            float *s;
            CHECK(kvc_memory_state(m, l, 0, &s));
            for (t = off, k = 0; t < off + n; ++t) {
                state_step(s, tokens[t], gl);
                if (k < n_at && at[k] == t + 1) { /* a checkpoint inside the batch gets a copy */
                    if (t + 1 < off + n) CHECK(kvc_memory_state_checkpoint(m, l, t + 1, s));
                    k++;
                }
            }
            gl++;
        } else {
            CHECK(kvc_memory_put(m, l, g_k, g_k));
        }
    }
}

/* tokens[from .. n) in batches of CHUNK, a checkpoint named at n when ckpt */
static void prefill(const shape *sh, kvc_memory *m, const int32_t *tokens, int32_t from, int32_t n, int ckpt) {
    int32_t off;
    for (off = from; off < n; off += CHUNK) {
        int32_t b = n - off < CHUNK ? n - off : CHUNK;
        forward(sh, m, tokens, off, b, &n, ckpt && off + b == n);
    }
}

/* Whether memory m holds what evaluating tokens[0 .. len) gives: the first recurrent
   layer's state, and every cell's position and K of the first layer of each attention
   group (cells of a sliding group: those it keeps). */
static int holds(const shape *sh, const kvc_memory *m, const int32_t *tokens, int32_t len) {
    int32_t off, g, l, c, n_cells, i;
    CHECK(kvc_memory_offset(m, &off));
    if (off != len) return 0;
    if (sh->hybrid) {
        static float want[STATE_FLOATS];
        const float *s;
        kvc_cache *cache;
        int32_t gl;
        memset(want, 0, sizeof(want));
        for (i = 0; i < len; ++i) state_step(want, tokens[i], 0);
        CHECK(kvc_memory_layer(m, 0, &cache, &gl));
        CHECK(kvc_state_read(cache, 0, gl, &s));
        if (len > 0 && (s == NULL || memcmp(s, want, sizeof(want)) != 0)) return 0;
    }
    for (g = sh->hybrid ? 1 : 0; g < 2; ++g) {
        kvc_cache *cache;
        int32_t gl;
        for (l = 0; sh->group_of[l] != g; ++l) {}
        CHECK(kvc_memory_layer(m, l, &cache, &gl));
        CHECK(kvc_cache_gather(cache, gl, g_gather, NULL, g_pos, MAX_TOKENS, &n_cells));
        if (n_cells < (g == 0 && len > WINDOW - 1 ? WINDOW - 1 : len)) return 0;
        for (c = 0; c < n_cells; ++c) {
            int32_t p = g_pos[c];
            if (p < 0 || p >= len) return 0;
            if (memcmp(g_gather + (size_t)c * ROW, g_table + (size_t)row_of(p, tokens[p]) * ROW, sizeof(float) * ROW))
                return 0;
        }
    }
    return 1;
}

static kvc_radix_stats tree_stats(const kvc_radix *t) {
    kvc_radix_stats s;
    CHECK(kvc_radix_stats_get(t, &s));
    return s;
}

static void fail(const char *what, const shape *sh, int32_t c, int32_t turn, int32_t reused, int32_t minimum) {
    fprintf(stderr, "%s, conversation %d turn %d: %s (reused %d, minimum %d)\n", sh->name, (int)c, (int)turn, what,
            (int)reused, (int)minimum);
    exit(1);
}

static void fmt_time(char *buf, double s) {
    if (s < 1e-3) sprintf(buf, "%.2f us", s * 1e6);
    else sprintf(buf, "%.2f ms", s * 1e3);
}

/* The conversations, round-robin, through one tree; prints the tables. */
static void serve(int hybrid) {
    const double budget_mib = g_budget_mib[!hybrid] > 0 ? g_budget_mib[!hybrid] : hybrid ? (g_quick ? 24 : 896)
                                                                                         : (g_quick ? 48 : 1280);
    shape sh;
    kvc_memory *m0, *m;
    kvc_radix_config rc;
    kvc_radix *tree;
    kvc_radix_stats st;
    conv *cv = (conv *)calloc((size_t)g_convs, sizeof(conv));
    int32_t *sys = (int32_t *)malloc(sizeof(int32_t) * SYSTEM_TOKENS), *seq = (int32_t *)malloc(sizeof(int32_t) * MAX_TOKENS);
    turn_stats ts[MAX_TURNS];
    int32_t c, turn, i, reused, n_printed = 0;
    uint64_t rng = 0x9E3779B97F4A7C15ull, queried = 0, hit = 0;
    size_t peak_bytes = 0, peak_used = 0;
    int32_t peak_pages = 0, peak_states = 0;
    long total[7] = {0, 0, 0, 0, 0, 0, 0};
    double t0 = now(), t_lookup, *lookups = (double *)malloc(sizeof(double) * (size_t)g_convs * (size_t)g_turns);
    kvc_memory_stats ms;

    memset(ts, 0, sizeof(ts));
    shape_init(&sh, hybrid, (size_t)(budget_mib * MIB));
    CHECK(kvc_memory_create(&sh.cfg, &m0));
    CHECK(kvc_radix_config_init(&rc, KVC_KIND_FULL));
    CHECK(kvc_radix_create_memory(m0, &rc, &tree));
    CHECK(kvc_memory_destroy(m0)); /* the tree keeps the pools */
    /* the system prompt, once, priority 2 */
    for (i = 0; i < SYSTEM_TOKENS; ++i) sys[i] = rng_range(&rng, 10, 31999);
    CHECK(kvc_radix_lookup_memory(tree, NS, sys, SYSTEM_TOKENS, &m, &reused));
    prefill(&sh, m, sys, 0, SYSTEM_TOKENS, 1);
    CHECK(kvc_radix_commit_memory(tree, NS, m, sys, SYSTEM_TOKENS, 2));
    CHECK(kvc_memory_destroy(m));
    queried += SYSTEM_TOKENS;
    for (c = 0; c < g_convs; ++c) {
        cv[c].tok = (int32_t *)malloc(sizeof(int32_t) * MAX_TOKENS);
        memcpy(cv[c].tok, sys, sizeof(int32_t) * SYSTEM_TOKENS);
        cv[c].n = SYSTEM_TOKENS;
        cv[c].bounds[cv[c].n_bounds++] = SYSTEM_TOKENS;
        cv[c].rng = 1000003ull * (uint64_t)(c + 1);
        cv[c].evicted = 0;
    }
    printf("== %s: %s + %d full attention layers (%.1f KiB of K/V a token%s), budget %.0f MiB\n", sh.name,
           hybrid ? "18 recurrent layers (288 KiB of state a sequence)" : "20 sliding-window layers (window 512)",
           (int)sh.n_full, (hybrid ? 6.0 : 24.0) * ROW * 2 * 2 / 1024,
           hybrid ? " in the 6" : " in all 24", budget_mib);
    for (turn = 0; turn < g_turns; ++turn) {
        for (c = 0; c < g_convs; ++c) {
            conv *v = &cv[c];
            int32_t msg = rng_range(&v->rng, MSG_MIN, MSG_MAX), n_gen = rng_range(&v->rng, REPLY_MIN, REPLY_MAX);
            int32_t n, minimum, ok = 0, off;
            for (i = 0; i < msg; ++i) v->tok[v->n++] = rng_range(&v->rng, 10, 31999);
            n = v->n;
            minimum = v->bounds[v->n_bounds - 1]; /* the end of its last commit */
            t_lookup = now();
            CHECK(kvc_radix_lookup_memory(tree, NS, v->tok, n, &m, &reused));
            lookups[c * g_turns + turn] = now() - t_lookup;
            queried += (uint64_t)n;
            hit += (uint64_t)reused;
            for (i = 0; i < v->n_bounds; ++i) ok |= reused == v->bounds[i];
            if (reused != 0 && !ok) fail("reused a length where no state was committed", &sh, c, turn, reused, minimum);
            if (reused > minimum) fail("reused more than was committed", &sh, c, turn, reused, minimum);
            st = tree_stats(tree);
            if (reused != minimum && st.entries_evicted == v->evicted)
                fail("reused less than the minimum with nothing evicted", &sh, c, turn, reused, minimum);
            if (!holds(&sh, m, v->tok, reused)) fail("the reused memory holds wrong contents", &sh, c, turn, reused, minimum);
            ts[turn].prompt += n;
            ts[turn].recomputed += n - reused;
            ts[turn].minimum += n - minimum;
            if (reused < minimum) {
                ts[turn].over++;
                ts[turn].over_tokens += minimum - reused;
                ts[turn].sys_lost += reused < SYSTEM_TOKENS;
                if (reused <= SYSTEM_TOKENS) {
                    ts[turn].full++;
                    if (n_printed++ < 20)
                        printf("   full re-processing: conversation %d turn %d reused %d of %d (minimum %d)\n", (int)c,
                               (int)turn, (int)reused, (int)n, (int)minimum);
                }
            }
            /* the rest of the prompt, a checkpoint at its end; the reply one token at a time */
            prefill(&sh, m, v->tok, reused, n, 1);
            memcpy(seq, v->tok, sizeof(int32_t) * (size_t)n);
            for (i = 0; i < n_gen; ++i) {
                seq[n + i] = i == n_gen - 1 ? EOT : 1000 + (int32_t)((c * 7919 + turn * 131 + i * 7) % 30000);
                if (i == n_gen - 1) break; /* sampled, never fed */
                off = n + i + 1;
                forward(&sh, m, seq, n + i, 1, &off, 0);
            }
            CHECK(kvc_radix_commit_memory(tree, NS, m, seq, n + n_gen, 0));
            CHECK(kvc_memory_stats_get(m, &ms));
            CHECK(kvc_memory_destroy(m));
            if (ms.bytes_used > peak_used) peak_used = ms.bytes_used;
            st = tree_stats(tree);
            if (st.bytes > peak_bytes) peak_bytes = st.bytes;
            if (st.n_pages > peak_pages) peak_pages = st.n_pages;
            if (st.n_states > peak_states) peak_states = st.n_states;
            v->evicted = st.entries_evicted;
            if (hybrid) v->bounds[v->n_bounds++] = n; /* the checkpoint at the prompt's end */
            memcpy(v->tok + n, seq + n, sizeof(int32_t) * (size_t)n_gen);
            v->n = n + n_gen;
            v->bounds[v->n_bounds++] = n + n_gen - 1; /* the commit's end: the fed tokens */
        }
    }
    st = tree_stats(tree);
    printf("   turn | prompt tokens | recomputed  minimum | turns over the minimum  tokens over  full re-processing  "
           "system prompt lost\n");
    for (turn = 0; turn < g_turns; ++turn) {
        printf("   %4d | %13ld | %10ld %8ld | %22ld %12ld %19ld %19ld\n", (int)turn, ts[turn].prompt,
               ts[turn].recomputed, ts[turn].minimum, ts[turn].over, ts[turn].over_tokens, ts[turn].full,
               ts[turn].sys_lost);
        total[0] += ts[turn].recomputed;
        total[1] += ts[turn].minimum;
        total[2] += ts[turn].over;
        total[3] += ts[turn].over_tokens;
        total[4] += ts[turn].full;
        total[5] += ts[turn].prompt;
        total[6] += ts[turn].sys_lost;
    }
    printf("   all  | %13ld | %10ld %8ld | %22ld %12ld %19ld %19ld\n", total[5], total[0], total[1], total[2], total[3],
           total[4], total[6]);
    printf("   %d turns in %.1f s; hit rate %.1f %% (%llu of %llu tokens queried reused; tree counters %llu / %llu)\n",
           g_convs * g_turns, now() - t0, 100.0 * (double)hit / (double)queried, (unsigned long long)hit,
           (unsigned long long)queried, (unsigned long long)st.tokens_hit, (unsigned long long)st.tokens_queried);
    printf("   tree: peak %.1f MiB (%d pages, %d states) of the %.0f MiB budget (peak in use with a turn's memory %.1f "
           "MiB); at the end %.1f MiB, %d pages, %d states, %d nodes, %d entries; %llu entries evicted (%llu page "
           "references)\n",
           (double)peak_bytes / MIB, (int)peak_pages, (int)peak_states, budget_mib, (double)peak_used / MIB,
           (double)st.bytes / MIB, (int)st.n_pages, (int)st.n_states, (int)st.n_nodes, (int)st.n_entries,
           (unsigned long long)st.entries_evicted, (unsigned long long)st.pages_evicted);
    {
        char a[32], b[32];
        int32_t k = g_convs * g_turns;
        int32_t slow = 0;
        for (i = 0; i < k; ++i) slow += lookups[i] > 50e-6;
        fmt_time(a, median(lookups, k)); /* sorts */
        fmt_time(b, lookups[k - 1 - k / 100]);
        printf("   kvc_radix_lookup_memory in the conversations: median %s, 99th percentile %s, %d of %d over 50 us\n",
               a, b, (int)slow, (int)k);
    }
    if (st.tokens_hit != hit || st.tokens_queried != queried) {
        fprintf(stderr, "%s: the tree's counters differ from the lookups' results\n", sh.name);
        exit(1);
    }
    CHECK(kvc_radix_destroy(tree));
    for (c = 0; c < g_convs; ++c) free(cv[c].tok);
    free(cv);
    free(sys);
    free(seq);
    free(lookups);
}

/* lookup + ready memory of a cached 32k-token prefix, against kvc_radix_lookup on a pool
   of the same full-attention layers; the two timed alternately */
static void lookup_32k(int hybrid) {
    shape sh;
    kvc_memory *m0, *m;
    kvc_radix_config rc;
    kvc_radix *mt, *pt;
    kvc_pool_config pc;
    kvc_pool *pool;
    kvc_cache *c;
    int32_t *tok = (int32_t *)malloc(sizeof(int32_t) * (LONG_PREFIX + 1)), i, reused = 0, l;
    double t_mem[MAX_REPS], t_pool[MAX_REPS], tm, tp;
    char a[32], b[32];
    kvc_radix_stats st;
    shape_init(&sh, hybrid, (size_t)512 << 20);
    for (i = 0; i <= LONG_PREFIX; ++i) tok[i] = (i * 7919) % 50000;
    CHECK(kvc_memory_create(&sh.cfg, &m0));
    CHECK(kvc_radix_config_init(&rc, KVC_KIND_FULL));
    CHECK(kvc_radix_create_memory(m0, &rc, &mt));
    CHECK(kvc_memory_destroy(m0));
    CHECK(kvc_radix_lookup_memory(mt, NS, tok, LONG_PREFIX, &m, &reused));
    for (i = 0; i < LONG_PREFIX; i += CHUNK) { /* a checkpoint at each batch's end: the tree keeps the last 8 */
        int32_t end = i + CHUNK;
        forward(&sh, m, tok, i, CHUNK, &end, 1);
    }
    CHECK(kvc_radix_commit_memory(mt, NS, m, tok, LONG_PREFIX, 0));
    CHECK(kvc_memory_destroy(m));
    /* the pure-attention tree: a pool of the full-attention group's shape */
    pc = sh.groups[1].pool;
    CHECK(kvc_pool_budget_for_tokens(&pc, LONG_PREFIX + 2 * PAGE, &pc.budget_bytes));
    CHECK(kvc_pool_create(&pc, &pool));
    CHECK(kvc_radix_create(pool, &rc, &pt));
    CHECK(kvc_radix_lookup(pt, NS, tok, LONG_PREFIX, &c, &reused));
    for (i = 0; i < LONG_PREFIX; i += CHUNK) {
        CHECK(kvc_begin(c, CHUNK, NULL, 0));
        for (l = 0; l < sh.n_full; ++l) CHECK(kvc_put(c, l, g_k, g_k));
    }
    CHECK(kvc_radix_commit(pt, NS, c, tok, LONG_PREFIX, 0));
    CHECK(kvc_cache_destroy(c));
    for (i = 0; i < g_reps; ++i) {
        double t0 = now();
        CHECK(kvc_radix_lookup_memory(mt, NS, tok, LONG_PREFIX + 1, &m, &reused));
        t_mem[i] = now() - t0;
        CHECK(kvc_memory_destroy(m));
        if (reused != LONG_PREFIX) { fprintf(stderr, "memory lookup reused %d, expected %d\n", (int)reused, LONG_PREFIX); exit(1); }
        t0 = now();
        CHECK(kvc_radix_lookup(pt, NS, tok, LONG_PREFIX + 1, &c, &reused));
        t_pool[i] = now() - t0;
        CHECK(kvc_cache_destroy(c));
        if (reused != LONG_PREFIX) { fprintf(stderr, "pool lookup reused %d, expected %d\n", (int)reused, LONG_PREFIX); exit(1); }
    }
    st = tree_stats(mt);
    tm = median(t_mem, g_reps);
    tp = median(t_pool, g_reps);
    fmt_time(a, tm);
    fmt_time(b, tp);
    printf("   lookup of a cached %d-token prefix + 1 (median of %d): kvc_radix_lookup_memory %s (%d pages, %d "
           "states in the tree); kvc_radix_lookup on a pool of the %d full layers %s; ratio %.2f\n",
           LONG_PREFIX, g_reps, a, (int)st.n_pages, (int)st.n_states, (int)sh.n_full, b, tm / tp);
    CHECK(kvc_radix_destroy(pt));
    CHECK(kvc_pool_destroy(pool));
    CHECK(kvc_radix_destroy(mt));
    free(tok);
}

int main(int argc, char **argv) {
    int i;
    uint64_t rng = 12345;
    size_t j;
    for (i = 1; i < argc; ++i) {
        long v = i + 1 < argc ? strtol(argv[i + 1], NULL, 10) : -1;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: %s [--quick] [--convs N] [--turns N] [--reps N] [--budget-mib N] [--help]\n"
                   "  --convs N       conversations served round-robin (1..%d, default 100)\n"
                   "  --turns N       turns per conversation (1..%d, default 10)\n"
                   "  --reps N        runs of each timed lookup, median printed (default 21)\n"
                   "  --budget-mib N  the pool budget of both shapes (default 896 hybrid, 1280 sliding)\n"
                   "  --quick         10 conversations x 3 turns, 5 reps\n", argv[0], MAX_CONVS, MAX_TURNS);
            return 0;
        }
        if (!strcmp(argv[i], "--quick")) { g_quick = 1; g_convs = 10; g_turns = 3; g_reps = 5; continue; }
        if (!strcmp(argv[i], "--convs") && v >= 1 && v <= MAX_CONVS) g_convs = (int)v;
        else if (!strcmp(argv[i], "--turns") && v >= 1 && v <= MAX_TURNS) g_turns = (int)v;
        else if (!strcmp(argv[i], "--reps") && v >= 1 && v <= MAX_REPS) g_reps = (int)v;
        else if (!strcmp(argv[i], "--budget-mib") && v >= 8) g_budget_mib[0] = g_budget_mib[1] = (double)v;
        else {
            fprintf(stderr, "usage: %s [--quick] [--convs N (default 100)] [--turns N (default 10)] [--reps N "
                            "(default 21)] [--budget-mib N (default 896 hybrid, 1280 sliding)]\n", argv[0]);
            return 2;
        }
        i++;
    }
    g_table = (float *)malloc(sizeof(float) * TABLE_ROWS * ROW);
    g_k = (float *)malloc(sizeof(float) * CHUNK * ROW);
    g_gather = (float *)malloc(sizeof(float) * (size_t)MAX_TOKENS * ROW);
    g_pos = (int32_t *)malloc(sizeof(int32_t) * MAX_TOKENS);
    if (!g_table || !g_k || !g_gather || !g_pos) { fprintf(stderr, "out of memory\n"); return 1; }
    for (j = 0; j < (size_t)TABLE_ROWS * ROW; ++j) g_table[j] = (float)((int)(rng_next(&rng) % 2049) - 1024) / 1024.0f;
    printf("kvcache.h radix tree over model memories: %d conversations x %d turns, round-robin, over a %d-token "
           "system prompt; 24 layers, attention 2 kv heads x 64 f16, %d cells per page\n\n", g_convs, g_turns,
           SYSTEM_TOKENS, PAGE);
    serve(1);
    lookup_32k(1);
    printf("\n");
    serve(0);
    lookup_32k(0);
    free(g_table);
    free(g_k);
    free(g_gather);
    free(g_pos);
    return 0;
}
