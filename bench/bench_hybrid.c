/* bench_hybrid.c - a 20-turn chat on two hybrid model memories (run by `make bench`).

   Shapes (24 layers each; attention layers 8 kv heads x head dim 128, f16, 256 cells per
   page):
     hybrid   18 recurrent layers beside 6 full-attention layers (every 4th), as in
              Granite 4 H or Nemotron-H. The recurrent state is a Mamba-2 layer's of
              d_model 2048: 64 heads x head dim 64 x d_state 128 f32 of SSM state plus a
              conv state of 3 x (4096 + 2 x 128) f32 = 537,344 floats, 2.05 MiB a layer,
              36.9 MiB a sequence for the 18 layers. The engine updates it in place with a
              cheap loop (every 1024th float per token): the model math is not modelled,
              only the cache work (the state pages copied for checkpoints and writes).
     sliding  20 sliding-window layers (window 512) beside 4 full-attention layers (5:1,
              as in Gemma 3).
   Random K/V (rows of a fixed random table picked by position and token).

   The chat: a 200-token system prompt; each turn a user message of 50-200 tokens and a
   reply of 50-100 tokens generated one at a time (the last one, the end of the turn,
   sampled and never fed, as in a real decode loop). A reply starts with 20-40 tokens of
   reasoning. The next prompt is everything so far + the next user message, with the
   reply either as generated ("verbatim") or without its reasoning ("reasoning dropped",
   what the chat templates of Qwen3, DeepSeek-R1 and gpt-oss do). Prompt reuse is
   kvc_prefix_create_memory on two memories fed the same requests:
     with      the engine names checkpoints at the end of each prompt and of each reply
     without   the engine names none, so the groups keep none: the recurrent state (and a
               wrapped window) can only continue from where it is, or start over
   Both memories must hold bit-identical states and K/V after every turn (exit 1 if not).
   Printed per turn: the prompt, the tokens recomputed with and without checkpoints, and
   what the checkpoints hold against the budget. At the end, on the "with" memory:
   kvc_memory_snapshot_take / kvc_memory_restore / kvc_memory_fork of the whole memory,
   median of --reps runs, next to a memcpy of the bytes the memory holds.
   Nothing is asserted about timings; exit status 1 on a library error or a mismatch.

   Build:  cc -std=c99 -O2 -Wall -Wextra -Wpedantic bench/bench_hybrid.c -o bench_hybrid -lm
   Usage:  bench_hybrid [--quick] [--turns N] [--reps N] [--help]
             --turns N  chat turns (1..64, default 20)
             --reps N   runs of each timed memory operation, median printed (default 7)
             --quick    5 turns, 3 reps */
#define _POSIX_C_SOURCE 200809L
#define KVCACHE_IMPLEMENTATION
#include "../kvcache.h"
#include "bench_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_LAYERS 24
#define ROW (8 * 128)                   /* kv heads x head dim */
#define PAGE 256
#define WINDOW 512
#define MAMBA_STATE (64 * 64 * 128 + 3 * (4096 + 2 * 128))
#define STATE_STRIDE 1024               /* the cheap loop touches every 1024th float */
#define CHUNK 512                       /* prefill in batches of this many tokens */
#define SYSTEM_TOKENS 200
#define MAX_TURNS 64
#define MAX_TOKENS (SYSTEM_TOKENS + MAX_TURNS * 300 + 8)
#define MAX_REPS 51
#define TABLE_ROWS 256
#define EOT 2                           /* end of turn: sampled, never fed */
#define THINK 3                         /* opens a reply's reasoning */
#define MIB (1024.0 * 1024.0)

typedef struct shape {
    const char *name;
    int32_t group_of[N_LAYERS];         /* 0: recurrent or sliding, 1: full attention */
    kvc_group_config groups[2];
    kvc_memory_config cfg;
} shape;

typedef struct turn_row {               /* what one turn measured, in one scenario */
    int32_t prompt, with_recomputed, without_recomputed, n_checkpoints;
    size_t checkpoint_bytes, bytes_used;
} turn_row;

static int g_turns = 20, g_reps = 7;
static float *g_table_k, *g_table_v;    /* TABLE_ROWS random rows each */
static float *g_k, *g_v;                /* one batch of K/V rows */
static unsigned char *g_copy_src, *g_copy_dst; /* the memcpy reference, kept for both shapes */
static size_t g_copy_bytes;

static uint64_t rng_next(uint64_t *s) { /* xorshift64* */
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}
static int32_t rng_range(uint64_t *s, int32_t lo, int32_t hi) { return lo + (int32_t)(rng_next(s) % (uint64_t)(hi - lo + 1)); }

static void shape_init(shape *sh, int hybrid) {
    int32_t l, n_full = 0;
    kvc_group_config *g = sh->groups;
    memset(sh, 0, sizeof(*sh));
    sh->name = hybrid ? "hybrid" : "sliding";
    for (l = 0; l < N_LAYERS; ++l) {
        sh->group_of[l] = hybrid ? (l % 4 == 3) : (l % 6 == 5);
        n_full += sh->group_of[l];
    }
    g[0].pool.n_layers = N_LAYERS - n_full;
    g[1].pool.n_layers = n_full;
    g[1].pool.n_kv_heads = 8;
    g[1].pool.head_dim_k = g[1].pool.head_dim_v = 128;
    g[1].pool.type_k = g[1].pool.type_v = KVC_TYPE_F16;
    g[1].pool.page_cells = PAGE;
    CHECK(kvc_cache_config_init(&g[1].cache, KVC_KIND_FULL));
    if (hybrid) {
        g[0].pool.state_floats = MAMBA_STATE;
        CHECK(kvc_cache_config_init(&g[0].cache, KVC_KIND_RECURRENT)); /* 8 checkpoints kept */
    } else {
        g[0].pool = g[1].pool;
        g[0].pool.n_layers = N_LAYERS - n_full;
        CHECK(kvc_cache_config_init(&g[0].cache, KVC_KIND_ROTATING));
        g[0].cache.window = WINDOW;
    }
    CHECK(kvc_memory_config_init(&sh->cfg));
    sh->cfg.n_layers = N_LAYERS;
    sh->cfg.layer_group = sh->group_of;
    sh->cfg.n_groups = 2;
    sh->cfg.groups = sh->groups;
    sh->cfg.budget_bytes = (size_t)2 << 30;
}

/* One batch: tokens[off .. off+n) with checkpoints at[0..n_at). */
static void forward(const shape *sh, kvc_memory *m, const int32_t *tokens, int32_t off, int32_t n, const int32_t *at,
                    int32_t n_at) {
    int32_t l, t, i, k, gl;
    for (t = 0; t < n; ++t) {
        uint32_t r = ((uint32_t)(off + t) * 2654435761u ^ (uint32_t)tokens[off + t] * 40503u) % TABLE_ROWS;
        memcpy(g_k + (size_t)t * ROW, g_table_k + (size_t)r * ROW, sizeof(float) * ROW);
        memcpy(g_v + (size_t)t * ROW, g_table_v + (size_t)r * ROW, sizeof(float) * ROW);
    }
    CHECK(kvc_memory_begin(m, n, at, n_at));
    for (l = 0, gl = 0; l < N_LAYERS; ++l) {
        if (sh->group_of[l] == 0 && sh->groups[0].cache.kind == KVC_KIND_RECURRENT) {
            float *s;
            CHECK(kvc_memory_state(m, l, 0, &s));
            for (t = off, k = 0; t < off + n; ++t) {
                for (i = (tokens[t] + gl) % STATE_STRIDE; i < MAMBA_STATE; i += STATE_STRIDE)
                    s[i] = s[i] * 0.5f + (float)(tokens[t] % 17);
                if (k < n_at && at[k] == t + 1) { /* a checkpoint inside the batch gets a copy */
                    if (t + 1 < off + n) CHECK(kvc_memory_state_checkpoint(m, l, t + 1, s));
                    k++;
                }
            }
            gl++;
        } else {
            CHECK(kvc_memory_put(m, l, g_k, g_v));
        }
    }
}

/* A prompt in batches of CHUNK, naming a checkpoint at its end when ckpt. */
static void prefill(const shape *sh, kvc_memory *m, const int32_t *tokens, int32_t from, int32_t n, int ckpt) {
    int32_t off;
    for (off = from; off < n; off += CHUNK) {
        int32_t b = n - off < CHUNK ? n - off : CHUNK;
        forward(sh, m, tokens, off, b, &n, ckpt && off + b == n);
    }
}

/* cell i (from the first) of a cache's runs */
static void cell_at(const kvc_run *runs, int32_t n_runs, int32_t i, const void **k, const void **v, int32_t *pos) {
    int32_t r;
    for (r = 0; r < n_runs && i >= runs[r].n_cells; ++r) i -= runs[r].n_cells;
    *k = (const unsigned char *)runs[r].k + (size_t)i * ROW * 2;
    *v = (const unsigned char *)runs[r].v + (size_t)i * ROW * 2;
    *pos = runs[r].pos[i];
}

/* Whether two memories of one shape hold the same states, and the same K/V bytes and
   positions in the cells the next token sees (the window of a sliding layer). */
static int same_contents(const shape *sh, const kvc_memory *a, const kvc_memory *b) {
    int32_t l, off_a, off_b;
    CHECK(kvc_memory_offset(a, &off_a));
    CHECK(kvc_memory_offset(b, &off_b));
    if (off_a != off_b) return 0;
    for (l = 0; l < N_LAYERS; ++l) {
        kvc_cache *ca, *cb;
        int32_t gla, glb;
        CHECK(kvc_memory_layer(a, l, &ca, &gla));
        CHECK(kvc_memory_layer(b, l, &cb, &glb));
        if (sh->group_of[l] == 0 && sh->groups[0].cache.kind == KVC_KIND_RECURRENT) {
            const float *sa, *sb;
            CHECK(kvc_state_read(ca, 0, gla, &sa));
            CHECK(kvc_state_read(cb, 0, glb, &sb));
            if ((sa == NULL) != (sb == NULL) || (sa && memcmp(sa, sb, sizeof(float) * MAMBA_STATE) != 0)) return 0;
        } else if (gla == 0) { /* the first layer of each attention group */
            kvc_run ra[64], rb[64];
            int32_t na, nb, ca_n = 0, cb_n = 0, i, want;
            CHECK(kvc_cache_runs(ca, gla, ra, 64, &na));
            CHECK(kvc_cache_runs(cb, glb, rb, 64, &nb));
            for (i = 0; i < na; ++i) ca_n += ra[i].n_cells;
            for (i = 0; i < nb; ++i) cb_n += rb[i].n_cells;
            want = sh->group_of[l] == 0 && off_a > WINDOW - 1 ? WINDOW - 1 : off_a;
            if (ca_n < want || cb_n < want) return 0;
            for (i = 1; i <= want; ++i) { /* the last `want` cells of each */
                const void *ka, *va, *kb, *vb;
                int32_t pa, pb;
                cell_at(ra, na, ca_n - i, &ka, &va, &pa);
                cell_at(rb, nb, cb_n - i, &kb, &vb, &pb);
                if (pa != pb || pa != off_a - i || memcmp(ka, kb, ROW * 2) != 0 || memcmp(va, vb, ROW * 2) != 0) return 0;
            }
        }
    }
    return 1;
}

/* The chat in one scenario on mem[0] (with checkpoints) and mem[1] (without), cleared
   first (the memories are reused so that their pages are resident already); rows[t]
   gets turn t. */
static void chat(const shape *sh, int drop_reasoning, turn_row *rows, kvc_memory *mem[2]) {
    int32_t *prompt = (int32_t *)malloc(sizeof(int32_t) * MAX_TOKENS), *seq = (int32_t *)malloc(sizeof(int32_t) * MAX_TOKENS);
    int32_t n = 0, turn, i, j, n_gen, n_think;
    uint64_t rng = 0x9E3779B97F4A7C15ull; /* the same conversation in every run */
    kvc_prefix *px[2];
    for (j = 0; j < 2; ++j) {
        CHECK(kvc_memory_clear(mem[j]));
        CHECK(kvc_prefix_create_memory(mem[j], MAX_TOKENS, &px[j]));
    }
    for (i = 0; i < SYSTEM_TOKENS; ++i) prompt[n++] = rng_range(&rng, 10, 31999);
    for (turn = 0; turn < g_turns; ++turn) {
        int32_t msg = rng_range(&rng, 50, 200), p;
        for (i = 0; i < msg; ++i) prompt[n++] = rng_range(&rng, 10, 31999);
        n_gen = rng_range(&rng, 50, 100);
        n_think = rng_range(&rng, 20, 40);
        rows[turn].prompt = n;
        for (j = 0; j < 2; ++j) { /* j = 0: with checkpoints, 1: without */
            int32_t reused, off;
            memcpy(seq, prompt, sizeof(int32_t) * (size_t)n);
            CHECK(kvc_prefix_begin(px[j], seq, n, &reused));
            *(j == 0 ? &rows[turn].with_recomputed : &rows[turn].without_recomputed) = n - reused;
            prefill(sh, mem[j], seq, reused, n, j == 0);
            for (i = 0; i < n_gen; ++i) { /* "sampled": THINK, reasoning, answer, EOT */
                seq[n + i] = i == 0 ? THINK : i == n_gen - 1 ? EOT : 1000 + (turn * 131 + i * 7) % 30000;
                if (i == n_gen - 1) break;
                off = n + i + 1;
                forward(sh, mem[j], seq, n + i, 1, &off, j == 0 && i == n_gen - 2);
            }
            CHECK(kvc_prefix_close(px[j], seq + n, n_gen));
        }
        if (!same_contents(sh, mem[0], mem[1])) {
            fprintf(stderr, "%s, turn %d: the memories with and without checkpoints differ\n", sh->name, (int)turn + 1);
            exit(1);
        }
        {
            kvc_memory_stats st;
            CHECK(kvc_memory_stats_get(mem[0], &st));
            rows[turn].n_checkpoints = st.n_checkpoints;
            rows[turn].checkpoint_bytes = st.checkpoint_bytes;
            rows[turn].bytes_used = st.bytes_used;
        }
        /* the reply goes into the history as the template renders it */
        p = drop_reasoning ? n_think : 0;
        for (i = p; i < n_gen; ++i) prompt[n++] = seq[rows[turn].prompt + i];
    }
    CHECK(kvc_prefix_destroy(px[0]));
    CHECK(kvc_prefix_destroy(px[1]));
    free(prompt);
    free(seq);
}

static void fmt_time(char *buf, double s) {
    if (s < 1e-3) sprintf(buf, "%8.2f us", s * 1e6);
    else sprintf(buf, "%8.2f ms", s * 1e3);
}

/* snapshot / restore / fork of the whole memory against memcpy of its bytes */
static void time_whole(const shape *sh, kvc_memory *m) {
    kvc_memory_stats st;
    kvc_memory_snapshot *snap;
    kvc_memory *f;
    double t_take[MAX_REPS], t_restore[MAX_REPS], t_fork[MAX_REPS], t_copy[MAX_REPS], copy;
    int32_t offset, i, one = 7;
    unsigned char *src, *dst;
    char a[32], b[32], c[32], d[32];
    CHECK(kvc_memory_stats_get(m, &st));
    CHECK(kvc_memory_offset(m, &offset));
    if (st.bytes_used > g_copy_bytes) { /* both buffers written once: resident, as the memory's pages are */
        free(g_copy_src);
        free(g_copy_dst);
        g_copy_src = (unsigned char *)malloc(st.bytes_used);
        g_copy_dst = (unsigned char *)malloc(st.bytes_used);
        if (g_copy_src == NULL || g_copy_dst == NULL) { fprintf(stderr, "no memory for the copy\n"); exit(1); }
        memset(g_copy_src, 1, st.bytes_used);
        memset(g_copy_dst, 2, st.bytes_used);
        g_copy_bytes = st.bytes_used;
    }
    src = g_copy_src;
    dst = g_copy_dst;
    for (i = 0; i < g_reps; ++i) {
        double t0 = now();
        CHECK(kvc_memory_snapshot_take(m, 0, offset, &snap));
        t_take[i] = now() - t0;
        forward(sh, m, &one, 0, 1, NULL, 0); /* move on by a token (position `offset`) ... */
        t0 = now();
        CHECK(kvc_memory_restore(m, snap, offset)); /* ... and back */
        t_restore[i] = now() - t0;
        CHECK(kvc_memory_snapshot_free(snap));
        t0 = now();
        CHECK(kvc_memory_fork(m, &f));
        t_fork[i] = now() - t0;
        CHECK(kvc_memory_destroy(f));
        t0 = now();
        memcpy(dst, src, st.bytes_used);
        t_copy[i] = now() - t0;
        dst[(size_t)i * 4096 % st.bytes_used] ^= 1;
    }
    copy = median(t_copy, g_reps);
    fmt_time(d, copy);
    printf("  whole memory at %d tokens, %.1f MiB held; median of %d; memcpy of %.1f MiB: %s\n", (int)offset,
           (double)st.bytes_used / MIB, g_reps, (double)st.bytes_used / MIB, d);
    fmt_time(a, median(t_take, g_reps));
    fmt_time(b, median(t_restore, g_reps));
    fmt_time(c, median(t_fork, g_reps));
    printf("  %-28s %s  %8.4f %% of the memcpy\n", "kvc_memory_snapshot_take", a, 100.0 * median(t_take, g_reps) / copy);
    printf("  %-28s %s  %8.4f %% of the memcpy\n", "kvc_memory_restore", b, 100.0 * median(t_restore, g_reps) / copy);
    printf("  %-28s %s  %8.4f %% of the memcpy\n", "kvc_memory_fork", c, 100.0 * median(t_fork, g_reps) / copy);
}

static void run_shape(int hybrid) {
    shape sh;
    turn_row verbatim[MAX_TURNS], dropped[MAX_TURNS];
    kvc_memory *mem[2];
    size_t state_page = 0, kv_page = 0;
    double kv_layer_token;
    int32_t t;
    long sum[4] = {0, 0, 0, 0};
    shape_init(&sh, hybrid);
    CHECK(kvc_pool_page_bytes(&sh.groups[1].pool, &kv_page));
    kv_layer_token = (double)kv_page / sh.groups[1].pool.n_layers / PAGE; /* K+V of one token, one layer */
    if (hybrid) {
        CHECK(kvc_pool_page_bytes(&sh.groups[0].pool, &state_page));
        printf("== hybrid: 18 recurrent layers (Mamba-2 state: %.2f MiB a layer, %.1f MiB a sequence) + 6 full "
               "attention layers (%.0f KiB a token)\n", (double)MAMBA_STATE * 4 / MIB, (double)state_page / MIB,
               6 * kv_layer_token / 1024);
    } else {
        printf("== sliding: 20 sliding-window layers (window %d) + 4 full attention layers (%.0f KiB a token "
               "in all 24)\n", WINDOW, 24 * kv_layer_token / 1024);
    }
    printf("   budget %.0f MiB; checkpoints at the end of each prompt and reply (with) or none (without)\n",
           (double)sh.cfg.budget_bytes / MIB);
    CHECK(kvc_memory_create(&sh.cfg, &mem[0]));
    CHECK(kvc_memory_create(&sh.cfg, &mem[1]));
    chat(&sh, 0, verbatim, mem);
    chat(&sh, 1, dropped, mem);
    printf("        |     verbatim history      |   reasoning dropped from history   | with checkpoints (reasoning dropped)\n");
    printf("  turn  | prompt  recomputed: with  without | prompt  recomputed: with  without | checkpoints  ckpt MiB  used MiB\n");
    for (t = 0; t < g_turns; ++t) {
        printf("  %4d  | %6d  %16d %8d | %6d  %16d %8d | %11d %9.1f %9.1f\n", (int)t + 1, (int)verbatim[t].prompt,
               (int)verbatim[t].with_recomputed, (int)verbatim[t].without_recomputed, (int)dropped[t].prompt,
               (int)dropped[t].with_recomputed, (int)dropped[t].without_recomputed, (int)dropped[t].n_checkpoints,
               (double)dropped[t].checkpoint_bytes / MIB, (double)dropped[t].bytes_used / MIB);
        sum[0] += verbatim[t].with_recomputed;
        sum[1] += verbatim[t].without_recomputed;
        sum[2] += dropped[t].with_recomputed;
        sum[3] += dropped[t].without_recomputed;
    }
    printf("  total |         %16ld %8ld |         %16ld %8ld |\n", sum[0], sum[1], sum[2], sum[3]);
    time_whole(&sh, mem[0]);
    CHECK(kvc_memory_destroy(mem[0]));
    CHECK(kvc_memory_destroy(mem[1]));
    printf("\n");
}

int main(int argc, char **argv) {
    int i;
    uint64_t rng = 12345;
    size_t j;
    for (i = 1; i < argc; ++i) {
        long v = i + 1 < argc ? strtol(argv[i + 1], NULL, 10) : -1;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: %s [--quick] [--turns N] [--reps N] [--help]\n"
                   "  --turns N  chat turns (1..%d, default 20)\n"
                   "  --reps N   runs of each timed memory operation, median printed (default 7)\n"
                   "  --quick    5 turns, 3 reps\n", argv[0], MAX_TURNS);
            return 0;
        }
        if (!strcmp(argv[i], "--quick")) { g_turns = 5; g_reps = 3; continue; }
        if (!strcmp(argv[i], "--turns") && v >= 1 && v <= MAX_TURNS) g_turns = (int)v;
        else if (!strcmp(argv[i], "--reps") && v >= 1 && v <= MAX_REPS) g_reps = (int)v;
        else {
            fprintf(stderr, "usage: %s [--quick] [--turns N (1..%d, default 20)] [--reps N (default 7)]\n", argv[0],
                    MAX_TURNS);
            return 2;
        }
        i++;
    }
    g_table_k = (float *)malloc(sizeof(float) * TABLE_ROWS * ROW);
    g_table_v = (float *)malloc(sizeof(float) * TABLE_ROWS * ROW);
    g_k = (float *)malloc(sizeof(float) * CHUNK * ROW);
    g_v = (float *)malloc(sizeof(float) * CHUNK * ROW);
    for (j = 0; j < (size_t)TABLE_ROWS * ROW; ++j) {
        g_table_k[j] = (float)(rng_next(&rng) % 2001) / 1000.0f - 1.0f;
        g_table_v[j] = (float)(rng_next(&rng) % 2001) / 1000.0f - 1.0f;
    }
    printf("kvcache.h hybrid-model benchmark: a %d-turn chat, attention layers 8 kv heads x 128 f16, %d cells per "
           "page\n\n", g_turns, PAGE);
    run_shape(1);
    run_shape(0);
    free(g_table_k);
    free(g_table_v);
    free(g_k);
    free(g_v);
    free(g_copy_src);
    free(g_copy_dst);
    return 0;
}
