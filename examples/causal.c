/* causal.c - the CAUSAL kind (ollama's causal cache): several sequences in one fixed
   set of cells.

   Two conversations share a 6-token prompt through kvc_seq_copy_prefix (no K/V is
   copied: the cells just gain a second sequence). Conversation 1 then drops a span
   from its middle, a context shift: its later cells move back and their keys are
   re-rotated with RoPE. Both continue, and we print which cells each one sees.

   Build: cc -std=c99 -O2 -I. examples/causal.c -o causal -lm */
#define KVCACHE_IMPLEMENTATION
#include "../kvcache.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define LAYERS 2
#define KV_HEADS 1
#define HEAD_DIM 8

#define CHECK(call)                                                               \
    do {                                                                          \
        kvc_result r_ = (call);                                                   \
        if (r_ != KVC_OK) {                                                       \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, kvc_strerror(r_)); \
            return 1;                                                             \
        }                                                                         \
    } while (0)

/* A forward pass in miniature: each token's key is its position, rotated by RoPE
   the way a model would rotate it (NeoX style, theta 10000). */
static void rope_key(float *k, int pos) {
    int i;
    for (i = 0; i < HEAD_DIM / 2; ++i) {
        double f = pow(10000.0, -2.0 * i / HEAD_DIM), a = 1.0, b = 0.0;
        k[i] = (float)(a * cos(pos * f) - b * sin(pos * f));
        k[i + HEAD_DIM / 2] = (float)(b * cos(pos * f) + a * sin(pos * f));
    }
}

static kvc_result run_batch(kvc_cache *c, int n, const int32_t *pos, const int32_t *seq) {
    float k[16 * HEAD_DIM], v[16 * HEAD_DIM];
    kvc_batch b;
    int t, i, l;
    kvc_result r;
    b.n_tokens = n;
    b.pos = pos;
    b.seq = seq;
    b.non_causal = NULL;
    if ((r = kvc_begin_batch(c, &b)) != KVC_OK) return r;
    for (t = 0; t < n; ++t) {
        rope_key(k + t * HEAD_DIM, pos[t]);
        for (i = 0; i < HEAD_DIM; ++i) v[t * HEAD_DIM + i] = (float)pos[t];
    }
    for (l = 0; l < LAYERS; ++l)
        if ((r = kvc_put(c, l, k, v)) != KVC_OK) return r;
    return KVC_OK;
}

/* print, for each token of the last batch, the positions of the cells it sees */
static kvc_result show_mask(const kvc_cache *c, const char *title) {
    float mask[64 * 64];
    int32_t rows, cols, first, i, j;
    kvc_result r = kvc_mask_export(c, 1, mask, sizeof(mask) / sizeof(mask[0]), &rows, &cols, &first);
    if (r != KVC_OK) return r;
    printf("%s (cells %d..%d)\n", title, first, first + cols - 1);
    for (i = 0; i < rows; ++i) {
        printf("  token %d sees cells:", i);
        for (j = 0; j < cols; ++j)
            if (mask[i * cols + j] == 0.0f) printf(" %d", first + j);
        printf("\n");
    }
    return KVC_OK;
}

static int print_seq(const kvc_cache *c, int seq) {
    int32_t lo, hi;
    if (kvc_seq_pos_range(c, seq, &lo, &hi) != KVC_OK) return 1;
    printf("  sequence %d holds positions %d..%d\n", seq, lo, hi);
    return 0;
}

int main(void) {
    kvc_pool_config pc;
    kvc_cache_config cc;
    kvc_pool *pool;
    kvc_cache *cache;
    int32_t pos[16], seq[16], used, i;
    float keys[16 * KV_HEADS * HEAD_DIM];
    int32_t kpos[16], n;

    kvc_pool_config_init(&pc);
    pc.n_layers = LAYERS;
    pc.n_kv_heads = KV_HEADS;
    pc.head_dim_k = pc.head_dim_v = HEAD_DIM;
    pc.page_cells = 8;
    pc.budget_bytes = 1 << 20;
    CHECK(kvc_pool_create(&pc, &pool));

    kvc_cache_config_init(&cc, KVC_KIND_CAUSAL);
    cc.capacity = 16;
    cc.rope.style = KVC_ROPE_NEOX;
    cc.rope.theta = 10000.0f;
    CHECK(kvc_cache_create(pool, &cc, &cache));

    /* the shared prompt: positions 0..5 of sequence 0 */
    for (i = 0; i < 6; ++i) { pos[i] = i; seq[i] = 0; }
    CHECK(run_batch(cache, 6, pos, seq));
    CHECK(kvc_seq_copy_prefix(cache, 0, 1, 6)); /* sequence 1 shares those 6 cells */
    CHECK(kvc_cache_offset(cache, &used));
    printf("prompt: 6 tokens, shared by sequences 0 and 1 in %d cells\n", used);

    /* both continue with two tokens each, in one batch */
    pos[0] = 6; seq[0] = 0;
    pos[1] = 7; seq[1] = 0;
    pos[2] = 6; seq[2] = 1;
    pos[3] = 7; seq[3] = 1;
    CHECK(run_batch(cache, 4, pos, seq));
    CHECK(show_mask(cache, "batch: seq 0 at 6,7 and seq 1 at 6,7"));

    /* a context shift for sequence 1: drop positions 6..7 of its own (its cells are
       private) -- it keeps the shared prompt -- then drop the middle of a longer run */
    pos[0] = 8; seq[0] = 1;
    pos[1] = 9; seq[1] = 1;
    CHECK(run_batch(cache, 2, pos, seq));
    printf("before the shift:\n");
    if (print_seq(cache, 1)) return 1;
    CHECK(kvc_seq_remove(cache, 1, 6, 8)); /* positions 8,9 become 6,7, keys re-rotated by -2 */
    printf("after removing positions 6..7 of sequence 1:\n");
    if (print_seq(cache, 1) || print_seq(cache, 0)) return 1;
    /* a shared cell cannot move: the prompt belongs to both sequences */
    printf("removing 2..3 of sequence 1 (cells shared with sequence 0 would move): %s\n",
           kvc_strerror(kvc_seq_remove(cache, 1, 2, 4)));

    /* both continue */
    pos[0] = 8; seq[0] = 0;
    pos[1] = 8; seq[1] = 1;
    CHECK(run_batch(cache, 2, pos, seq));
    CHECK(show_mask(cache, "batch: seq 0 at 8, seq 1 at 8"));

    /* the shifted keys now carry their new positions' rotation */
    CHECK(kvc_cache_gather(cache, 0, keys, NULL, kpos, 16, &n));
    for (i = 0; i < n; ++i) {
        float want[HEAD_DIM];
        double err = 0;
        int d;
        if (kpos[i] < 0) continue;
        rope_key(want, kpos[i]);
        for (d = 0; d < HEAD_DIM; ++d) err = fmax(err, fabs(want[d] - keys[i * HEAD_DIM + d]));
        if (err > 1e-5) { printf("cell %d: key off by %g\n", i, err); return 1; }
    }
    printf("every key matches RoPE at its current position (max error <= 1e-5)\n");

    /* sequence 0 gives up its continuation: holes appear in the middle; defrag closes them */
    CHECK(kvc_seq_remove(cache, 0, 6, KVC_POS_END));
    CHECK(kvc_cache_offset(cache, &used));
    printf("sequence 0 drops positions 6..: %d cells in use\n", used);
    CHECK(kvc_cache_defrag(cache, &n));
    printf("defrag: %d block move(s); sequence 1 now in the first %d cells\n", n, used);
    pos[0] = 9; seq[0] = 1;
    CHECK(run_batch(cache, 1, pos, seq));
    CHECK(show_mask(cache, "batch: seq 1 at 9"));

    CHECK(kvc_cache_destroy(cache));
    CHECK(kvc_pool_destroy(pool));
    return 0;
}
