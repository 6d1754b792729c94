/* bench_causal.c - the CAUSAL kind at scale: 32k cells shared by 64 sequences.
   Times batch slot-finding (kvc_begin_batch of a 64-token decode batch, one token per
   sequence, and of a 512-token prefill of one sequence), mask export for that batch,
   remove + RoPE shift of a sequence's middle, and defrag after half the sequences
   finish. Medians of several runs; prints, asserts nothing.
   Usage: bench_causal [--quick] [--cells N] [--reps R] [--help]
     --cells N  cells of the cache (default 32768, at least 5120)
     --reps R   runs per measurement, median printed (default 7, at most 32)
     --quick    8192 cells, 3 runs (well under a second) */
#define _POSIX_C_SOURCE 199309L
#define KVCACHE_IMPLEMENTATION
#include "../kvcache.h"
#include "bench_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define LAYERS 8
#define KV_HEADS 8
#define HEAD_DIM 128
#define SEQS 64

static float *g_k, *g_v;

static int put_all(kvc_cache *c) {
    int l;
    for (l = 0; l < LAYERS; ++l)
        if (kvc_put(c, l, g_k, g_v) != KVC_OK) return 1;
    return 0;
}

/* fill: every sequence gets cells/SEQS - 8 positions, interleaved in chunks of 64 */
static int fill(kvc_cache *c, int cells) {
    int32_t pos[64], seq[64], per = cells / SEQS - 8, s, i, p;
    kvc_batch b;
    for (p = 0; p < per; p += 64)
        for (s = 0; s < SEQS; ++s) {
            int n = per - p < 64 ? per - p : 64;
            for (i = 0; i < n; ++i) { pos[i] = p + i; seq[i] = s; }
            b.n_tokens = n; b.pos = pos; b.seq = seq; b.non_causal = NULL;
            if (kvc_begin_batch(c, &b) != KVC_OK || put_all(c)) return 1;
        }
    return 0;
}

int main(int argc, char **argv) {
    int cells = 32768, reps = 7, r, i;
    kvc_pool_config pc;
    kvc_cache_config cc;
    kvc_pool *pool;
    kvc_cache *c;
    double t_decode[32], t_prefill[32], t_mask[32], t_remove[32], t_defrag[32];
    int32_t moves = 0, rows, cols, first;
    float *mask;
    for (i = 1; i < argc; ++i) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: %s [--quick] [--cells N] [--reps R] [--help]\n"
                   "  --cells N  cells of the CAUSAL cache, shared by 64 sequences (default 32768, >= 5120)\n"
                   "  --reps R   runs per measurement, median printed (default 7, at most 32)\n"
                   "  --quick    8192 cells, 3 runs\n", argv[0]);
            return 0;
        }
        if (!strcmp(argv[i], "--quick")) { cells = 8192; reps = 3; }
        else if (!strcmp(argv[i], "--cells") && i + 1 < argc) cells = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--quick] [--cells N] [--reps R] [--help]\n", argv[0]);
            return 2;
        }
    }
    if (reps > 32) reps = 32;
    if (reps < 1) reps = 1;
    if (cells < SEQS * 80) cells = SEQS * 80; /* a sequence long enough for the removal of 64 */
    g_k = (float *)calloc(512 * KV_HEADS * HEAD_DIM, sizeof(float));
    g_v = (float *)calloc(512 * KV_HEADS * HEAD_DIM, sizeof(float));
    mask = (float *)malloc(sizeof(float) * 64 * (size_t)cells);
    for (i = 0; i < 512 * KV_HEADS * HEAD_DIM; ++i) { g_k[i] = (float)((i * 7) % 13) / 13.0f; g_v[i] = g_k[i]; }

    kvc_pool_config_init(&pc);
    pc.n_layers = LAYERS; pc.n_kv_heads = KV_HEADS; pc.head_dim_k = pc.head_dim_v = HEAD_DIM;
    pc.type_k = pc.type_v = KVC_TYPE_F16;
    pc.page_cells = 256;
    CHECK(kvc_pool_budget_for_tokens(&pc, cells + 256, &pc.budget_bytes));
    if (kvc_pool_create(&pc, &pool) != KVC_OK) { fprintf(stderr, "pool create failed\n"); return 1; }
    kvc_cache_config_init(&cc, KVC_KIND_CAUSAL);
    cc.capacity = cells; cc.max_seqs = 256;
    cc.rope.style = KVC_ROPE_NEOX; cc.rope.theta = 10000.0f;
    if (kvc_cache_create(pool, &cc, &c) != KVC_OK) { fprintf(stderr, "cache create failed\n"); return 1; }

    for (r = 0; r < reps; ++r) {
        int32_t pos[512], seq[512], lo, hi;
        kvc_batch b;
        double t0;
        kvc_cache_clear(c);
        if (fill(c, cells)) { fprintf(stderr, "fill failed\n"); return 1; }
        /* decode: one token for each of the 64 sequences */
        for (i = 0; i < SEQS; ++i) { kvc_seq_pos_range(c, i, &lo, &hi); pos[i] = hi + 1; seq[i] = i; }
        b.n_tokens = SEQS; b.pos = pos; b.seq = seq; b.non_causal = NULL;
        t0 = now();
        if (kvc_begin_batch(c, &b) != KVC_OK) { fprintf(stderr, "decode batch failed\n"); return 1; }
        t_decode[r] = now() - t0;
        put_all(c);
        t0 = now();
        kvc_mask_export(c, 1, mask, (size_t)64 * cells, &rows, &cols, &first);
        t_mask[r] = now() - t0;
        /* remove + shift: drop 64 positions from the middle of sequence 0 */
        kvc_seq_pos_range(c, 0, &lo, &hi);
        t0 = now();
        if (kvc_seq_remove(c, 0, hi / 2 - 32, hi / 2 + 32) != KVC_OK) { fprintf(stderr, "remove failed\n"); return 1; }
        t_remove[r] = now() - t0;
        /* half the sequences finish, then defrag */
        for (i = 0; i < SEQS; i += 2) kvc_seq_remove(c, i, 0, KVC_POS_END);
        t0 = now();
        kvc_cache_defrag(c, &moves);
        t_defrag[r] = now() - t0;
        /* prefill of 512 tokens of sequence 1 into the free space */
        for (i = 0; i < 512; ++i) { pos[i] = hi + 2 + i; seq[i] = 1; }
        b.n_tokens = 512;
        t0 = now();
        if (kvc_begin_batch(c, &b) != KVC_OK) { fprintf(stderr, "prefill batch failed\n"); return 1; }
        t_prefill[r] = now() - t0;
        put_all(c);
    }
    printf("CAUSAL cache: %d cells, %d sequences, %d layers x %d kv heads x %d dims, f16, medians of %d runs\n",
           cells, SEQS, LAYERS, KV_HEADS, HEAD_DIM, reps);
    printf("  %-44s %10.1f us\n", "slot finding: 64-token decode batch", median(t_decode, reps) * 1e6);
    printf("  %-44s %10.1f us\n", "slot finding: 512-token prefill batch", median(t_prefill, reps) * 1e6);
    printf("  %-44s %10.1f us  (%d x %d floats)\n", "mask export of the decode batch", median(t_mask, reps) * 1e6, rows, cols);
    printf("  %-44s %10.1f us\n", "remove 64 positions + re-rotate the rest", median(t_remove, reps) * 1e6);
    printf("  %-44s %10.1f us  (%d block moves)\n", "defrag after 32 sequences finish", median(t_defrag, reps) * 1e6, moves);
    kvc_cache_destroy(c);
    kvc_pool_destroy(pool);
    free(g_k);
    free(g_v);
    free(mask);
    return 0;
}
