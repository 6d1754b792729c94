/* test_memory_groups.c - a model memory as one object (issue 35):
   - kvc_memory_config_check is kvc_memory_create's own validation: seven group policies
     it once passed and the create refused, then random configurations (check OK exactly
     when create OK, with the same result);
   - a memory's group caches (kvc_memory_group / kvc_memory_layer) refuse calls that would
     change them apart from the other groups (KVC_ERR_OWNED), read-only calls and the
     per-layer calls of a memory batch still work, and a random mix of memory calls and
     direct group calls keeps every group in step;
   - one answer for "can the memory go back to t": kvc_memory_can_rewind, kvc_memory_trim,
     kvc_memory_restore(NULL) and kvc_cache_trim / kvc_cache_restore on one cache agree (0 is always
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


/* ---- a memory's groups refuse changes from outside ---------------------------------- */

/* a toy model: recurrent layers scan state = state / 2 + x(token); attention layers put
   K = V = token * 10 + i */
static float xval(int32_t token, int32_t i) { return (float)((token * 7 + i) % 17 - 8); }
static void step(float *st, int32_t token) {
    int32_t i;
    for (i = 0; i < NS; ++i) st[i] = st[i] * 0.5f + xval(token, i);
}

typedef struct world {
    kvc_memory *m;
    int32_t n_groups;
    kvc_kind kind[3];          /* group g = model layer g */
    int32_t tokens[4096], off; /* what the memory must hold */
    int direct;                /* feed through the groups' caches (kvc_put, kvc_state) */
} world;

static void world_create(world *w, int32_t n_groups, const kvc_kind *kinds) {
    kvc_memory_config mc;
    kvc_group_config g[3];
    int32_t map[3], i;
    memset(g, 0, sizeof(g));
    for (i = 0; i < n_groups; ++i) {
        kvc_pool_config_init(&g[i].pool);
        g[i].pool.n_layers = 1;
        if (kinds[i] == KVC_KIND_RECURRENT) {
            g[i].pool.state_floats = NS;
        } else {
            g[i].pool.n_kv_heads = 1;
            g[i].pool.head_dim_k = g[i].pool.head_dim_v = 4;
            g[i].pool.page_cells = 2;
        }
        kvc_cache_config_init(&g[i].cache, kinds[i]);
        if (kinds[i] == KVC_KIND_ROTATING) g[i].cache.window = 6;
        if (kinds[i] != KVC_KIND_FULL) g[i].cache.checkpoints = 4;
        map[i] = i;
        w->kind[i] = kinds[i];
    }
    kvc_memory_config_init(&mc);
    mc.n_layers = n_groups;
    mc.layer_group = map;
    mc.n_groups = n_groups;
    mc.groups = g;
    mc.budget_bytes = 1 << 20;
    w->n_groups = n_groups;
    w->off = 0;
    w->direct = 0;
    TK_OK(kvc_memory_create(&mc, &w->m));
}

/* a batch of n tokens (drawn from seed) through every layer, checkpoints at[] */
static kvc_result world_feed(world *w, int32_t n, const int32_t *at, int32_t n_at, uint64_t seed) {
    int32_t l, t, k, i;
    float kv[64 * 4];
    kvc_result r;
    for (t = 0; t < n; ++t) w->tokens[w->off + t] = (int32_t)((seed * 31 + (uint64_t)t * 7) % 97);
    if ((r = kvc_memory_begin(w->m, n, at, n_at)) != KVC_OK) return r;
    for (l = 0; l < w->n_groups; ++l) {
        kvc_cache *c;
        int32_t gl;
        TK_OK(kvc_memory_layer(w->m, l, &c, &gl));
        if (w->kind[l] == KVC_KIND_RECURRENT) {
            float *st;
            TK_OK(w->direct ? kvc_state(c, 0, gl, &st) : kvc_memory_state(w->m, l, 0, &st));
            for (t = 0, k = 0; t < n; ++t) {
                step(st, w->tokens[w->off + t]);
                if (k < n_at && at[k] == w->off + t + 1) {
                    TK_OK(w->direct ? kvc_state_checkpoint(c, gl, at[k], st)
                                    : kvc_memory_state_checkpoint(w->m, l, at[k], st));
                    k++;
                }
            }
        } else {
            for (t = 0; t < n; ++t)
                for (i = 0; i < 4; ++i) kv[t * 4 + i] = (float)(w->tokens[w->off + t] * 10 + i);
            TK_OK(w->direct ? kvc_put(c, gl, kv, kv) : kvc_memory_put(w->m, l, kv, kv));
        }
    }
    w->off += n;
    return KVC_OK;
}

/* every group holds exactly tokens[0, off): offsets, states, FULL keys */
static int world_ok(const world *w) {
    int32_t g, off, t, i, cells, pos[4096];
    static float k[4096 * 4];
    if (kvc_memory_offset(w->m, &off) != KVC_OK || off != w->off) return 0;
    for (g = 0; g < w->n_groups; ++g) {
        kvc_cache *c;
        int32_t o;
        if (kvc_memory_group(w->m, g, &c) != KVC_OK || kvc_cache_offset(c, &o) != KVC_OK || o != w->off) return 0;
        if (w->kind[g] == KVC_KIND_RECURRENT) {
            const float *st;
            float ref[NS];
            memset(ref, 0, sizeof(ref));
            for (t = 0; t < w->off; ++t) step(ref, w->tokens[t]);
            if (kvc_state_read(c, 0, 0, &st) != KVC_OK) return 0;
            if (st == NULL ? w->off != 0 : memcmp(st, ref, sizeof(ref)) != 0) return 0;
        } else if (w->kind[g] == KVC_KIND_FULL) {
            if (kvc_cache_gather(c, 0, k, NULL, pos, 4096, &cells) != KVC_OK || cells != w->off) return 0;
            for (t = 0; t < cells; ++t)
                for (i = 0; i < 4; ++i)
                    if (pos[t] != t || k[t * 4 + i] != (float)(w->tokens[t] * 10 + i)) return 0;
        }
    }
    return 1;
}

/* issue 35's case: a legal kvc_cache_trim on one group of a FULL + RECURRENT memory left them at
   4 and 2 tokens, then kvc_memory_begin(2, at = {6}) wrote a checkpoint through a page
   id it never set */
static void test_direct_refused(void) {
    static const kvc_kind kinds[3] = {KVC_KIND_FULL, KVC_KIND_RECURRENT, KVC_KIND_ROTATING};
    world w;
    kvc_cache *c, *f;
    kvc_snapshot *s = NULL;
    kvc_prefix *px = NULL;
    int32_t at = 6, n_at, o, gl;
    int ok;
    const float *st;
    world_create(&w, 2, kinds);
    TK_OK(world_feed(&w, 4, NULL, 0, 1));
    TK_OK(kvc_memory_group(w.m, 0, &c));
    TK_RES(kvc_cache_trim(c, 2), KVC_ERR_OWNED);
    TK_CHECK(world_ok(&w));
    TK_OK(world_feed(&w, 2, &at, 1, 2));
    TK_CHECK(world_ok(&w));
    /* every call that changes a group alone: refused, nothing changed */
    TK_RES(kvc_begin(c, 1, NULL, 0), KVC_ERR_OWNED);
    TK_RES(kvc_begin(c, 1, NULL, 0), KVC_ERR_OWNED);
    TK_RES(kvc_cache_clear(c), KVC_ERR_OWNED);
    TK_RES(kvc_cache_restore(c, NULL, 2), KVC_ERR_OWNED);
    TK_RES(kvc_cache_destroy(c), KVC_ERR_OWNED);
    TK_RES(kvc_cache_fork(c, &f), KVC_ERR_OWNED);
    TK_OK(kvc_memory_layer(w.m, 1, &c, &gl));
    TK_RES(kvc_cache_trim(c, 0), KVC_ERR_OWNED);
    TK_RES(kvc_prefix_create(&c, 1, 16, &px), KVC_ERR_OWNED);
    TK_CHECK(world_ok(&w));
    /* reads work, and so do the per-layer calls of a memory batch */
    TK_OK(kvc_cache_offset(c, &o));
    TK_EQ(o, 6);
    TK_OK(kvc_cache_can_rewind(c, 6, &ok));
    TK_CHECK(ok);
    TK_OK(kvc_cache_checkpoints(c, NULL, 0, &n_at));
    TK_OK(kvc_state_read(c, 0, 0, &st));
    TK_OK(kvc_snapshot_take(c, 0, KVC_POS_END, &s));
    TK_OK(kvc_snapshot_free(s));
    w.direct = 1;
    TK_OK(world_feed(&w, 3, NULL, 0, 3));
    TK_CHECK(world_ok(&w));
    TK_OK(kvc_prefix_create_memory(w.m, 16, &px));
    TK_OK(kvc_prefix_destroy(px));
    /* a snapshot of a group's cache holds the memory's pool: the last memory on it cannot
       go while it lives (it went, leaving the pool behind, never freed) */
    TK_OK(kvc_snapshot_take(c, 0, KVC_POS_END, &s));
    TK_RES(kvc_memory_destroy(w.m), KVC_ERR_BUSY);
    TK_OK(kvc_memory_offset(w.m, &o)); /* nothing destroyed */
    TK_EQ(o, 9);
    TK_OK(kvc_snapshot_free(s));
    TK_OK(kvc_memory_destroy(w.m));
    /* one group: its cache is the memory, nothing to keep in step; destroy still refused */
    world_create(&w, 1, kinds);
    TK_OK(world_feed(&w, 5, NULL, 0, 4));
    TK_OK(kvc_memory_group(w.m, 0, &c));
    TK_OK(kvc_cache_trim(c, 2));
    w.off -= 2;
    TK_CHECK(world_ok(&w));
    TK_RES(kvc_cache_destroy(c), KVC_ERR_OWNED);
    TK_OK(kvc_memory_destroy(w.m));
}


/* Memory calls and direct group calls at random (issue 35: 506 of 1500 seeds crashed).
   A direct call that would change a group alone must be refused on a memory of two or
   more groups; after every step each group holds exactly the model's tokens. */
static void mix_direct(world *w, tk_rng *rng) {
    kvc_cache *c, *f = NULL;
    int32_t g = tk_int(rng, 0, w->n_groups - 1), o, n, at[2];
    int ok;
    kvc_result r = KVC_OK, want = w->n_groups > 1 ? KVC_ERR_OWNED : KVC_OK;
    TK_OK(kvc_memory_group(w->m, g, &c));
    switch (tk_int(rng, 0, 7)) {
    case 0: r = kvc_cache_trim(c, tk_int(rng, 0, 3)); break;
    case 1: r = kvc_cache_clear(c); break;
    case 2: r = kvc_cache_restore(c, NULL, tk_int(rng, 0, w->off)); break;
    case 3:
        n = tk_int(rng, 1, 3);
        at[0] = w->off + n;
        r = kvc_begin(c, n, at, tk_int(rng, 0, 1));
        if (r == KVC_OK) TK_OK(kvc_cancel(c)); /* one group: nothing handed out yet */
        break;
    case 4: r = kvc_cancel(c); if (w->n_groups == 1) { TK_RES(r, KVC_ERR_STATE); return; } break;
    case 5: TK_RES(kvc_cache_destroy(c), KVC_ERR_OWNED); TK_RES(kvc_cache_fork(c, &f), KVC_ERR_OWNED); return;
    case 6: TK_OK(kvc_cache_offset(c, &o)); TK_EQ(o, w->off); return;
    default: TK_OK(kvc_cache_can_rewind(c, tk_int(rng, 0, w->off), &ok)); return;
    }
    if (w->n_groups > 1 || r != KVC_OK) {
        if (w->n_groups > 1) TK_RES(r, want);
        return;
    }
    TK_OK(kvc_cache_offset(c, &w->off)); /* one group: the memory went where its cache went */
}

static void test_direct_mix(tk_rng *rng) {
    static const kvc_kind all[3] = {KVC_KIND_FULL, KVC_KIND_ROTATING, KVC_KIND_RECURRENT};
    int32_t seed, seeds = tk_scaled(400), bad = 0;
    for (seed = 0; seed < seeds; ++seed) {
        world w;
        kvc_kind kinds[3];
        kvc_memory_snapshot *snap = NULL;
        int32_t snap_at = 0, snap_tokens[4096], i, step_i, n_groups = tk_int(rng, 1, 3);
        for (i = 0; i < n_groups; ++i) kinds[i] = all[tk_int(rng, 0, 2)];
        world_create(&w, n_groups, kinds);
        for (step_i = 0; step_i < 40; ++step_i) {
            int32_t n, at[2], n_at = 0, t;
            kvc_memory *fk;
            w.direct = tk_pct(rng, 50);
            switch (tk_int(rng, 0, 7)) {
            case 0:
            case 1:
                n = tk_int(rng, 1, 4);
                if (tk_pct(rng, 50)) at[n_at++] = w.off + tk_int(rng, 1, n);
                if (world_feed(&w, n, at, n_at, (uint64_t)(seed * 100 + step_i)) != KVC_OK) bad++;
                break;
            case 2:
                n = tk_int(rng, 0, 3);
                if (n <= w.off && kvc_memory_trim(w.m, n) == KVC_OK) w.off -= n;
                break;
            case 3:
                t = tk_int(rng, 0, w.off);
                if (kvc_memory_restore(w.m, NULL, t) == KVC_OK) w.off = t;
                break;
            case 4:
                if (snap != NULL) {
                    if (kvc_memory_restore(w.m, snap, snap_at) == KVC_OK) {
                        w.off = snap_at;
                        memcpy(w.tokens, snap_tokens, sizeof(int32_t) * (size_t)snap_at);
                    }
                } else if (kvc_memory_snapshot_take(w.m, 0, w.off, &snap) == KVC_OK && snap != NULL) {
                    snap_at = w.off;
                    memcpy(snap_tokens, w.tokens, sizeof(int32_t) * (size_t)snap_at);
                }
                break;
            case 5:
                if (kvc_memory_fork(w.m, &fk) == KVC_OK) TK_OK(kvc_memory_destroy(fk));
                else bad++;
                break;
            default:
                mix_direct(&w, rng);
                break;
            }
            if (!world_ok(&w)) { bad++; break; }
        }
        TK_OK(kvc_memory_snapshot_free(snap));
        TK_OK(kvc_memory_destroy(w.m));
    }
    TK_EQ(bad, 0);
}


/* ---- one answer for "can it go back to t" ------------------------------------------- */

/* memory calls and kvc_cache_can_rewind / kvc_cache_trim / kvc_cache_restore on a lone cache, at offset `off`
   with no checkpoint: 0 is reachable (clearing) and 0 < t < off is not, all agree */
static void contracts_at(world *w, kvc_cache *lone, int32_t off) {
    int ok;
    kvc_memory *f;
    TK_OK(kvc_memory_can_rewind(w->m, 0, &ok));
    TK_CHECK(ok);
    TK_OK(kvc_memory_can_rewind(w->m, 2, &ok));
    TK_CHECK(!ok);
    TK_RES(kvc_memory_trim(w->m, off - 2), KVC_ERR_UNREACHABLE);
    TK_RES(kvc_memory_restore(w->m, NULL, 2), KVC_ERR_UNREACHABLE);
    TK_OK(kvc_cache_can_rewind(lone, 0, &ok));
    TK_CHECK(ok);
    TK_OK(kvc_cache_can_rewind(lone, 2, &ok));
    TK_CHECK(!ok);
    TK_RES(kvc_cache_trim(lone, off - 2), KVC_ERR_UNREACHABLE); /* once KVC_ERR_RECURRENT / _UNSUPPORTED */
    TK_RES(kvc_cache_restore(lone, NULL, 2), KVC_ERR_UNREACHABLE);
    TK_CHECK(world_ok(w));
    TK_OK(kvc_memory_fork(w->m, &f)); /* restore(NULL, 0) on a fork, trim on the memory */
    TK_OK(kvc_memory_restore(f, NULL, 0));
    TK_OK(kvc_memory_offset(f, &off));
    TK_EQ(off, 0);
    TK_OK(kvc_memory_destroy(f));
    TK_OK(kvc_memory_trim(w->m, w->off));
    w->off = 0;
    TK_CHECK(world_ok(w));
    TK_OK(kvc_cache_offset(lone, &off));
    TK_OK(kvc_cache_trim(lone, off)); /* to 0: once KVC_ERR_RECURRENT / _UNSUPPORTED */
    TK_OK(kvc_cache_offset(lone, &off));
    TK_EQ(off, 0);
}

static void test_rewind_contracts(void) {
    static const kvc_kind rec[1] = {KVC_KIND_RECURRENT}, rot[1] = {KVC_KIND_ROTATING};
    kvc_memory *lm;
    kvc_cache *lone;
    world w, l;
    int k;
    for (k = 0; k < 2; ++k) { /* a state at 5, a window of 6 wrapped at 9 */
        int32_t n = k == 0 ? 5 : 9;
        world_create(&w, 1, k == 0 ? rec : rot);
        world_create(&l, 1, k == 0 ? rec : rot); /* its group, as a lone cache: a copy */
        TK_OK(world_feed(&w, n, NULL, 0, 7));
        TK_OK(world_feed(&l, n, NULL, 0, 7));
        lm = l.m;
        TK_OK(kvc_memory_group(lm, 0, &lone)); /* one group: its cache takes direct calls */
        contracts_at(&w, lone, n);
        TK_OK(kvc_memory_destroy(lm));
        TK_OK(kvc_memory_destroy(w.m));
    }
}

/* a restore to `at` keeps the checkpoint at `at`, as a rewind to `at` does */
static void test_restore_keeps_at(void) {
    static const kvc_kind kinds[2] = {KVC_KIND_RECURRENT, KVC_KIND_FULL};
    world w;
    kvc_memory_snapshot *snap;
    kvc_cache *c;
    int32_t at[2] = {8, 12}, ck[8], n_ck, tokens[64];
    int ok;
    world_create(&w, 2, kinds);
    TK_OK(world_feed(&w, 12, at, 2, 9));
    TK_OK(kvc_memory_snapshot_take(w.m, 0, KVC_POS_END, &snap)); /* at the offset, 12 */
    memcpy(tokens, w.tokens, sizeof(int32_t) * 12);
    TK_OK(world_feed(&w, 3, NULL, 0, 10));
    TK_OK(kvc_memory_restore(w.m, snap, 12));
    w.off = 12;
    memcpy(w.tokens, tokens, sizeof(int32_t) * 12);
    TK_CHECK(world_ok(&w));
    TK_OK(kvc_memory_group(w.m, 0, &c));
    TK_OK(kvc_cache_checkpoints(c, ck, 8, &n_ck));
    TK_EQ(n_ck, 2);
    TK_EQ(ck[n_ck > 1 ? 1 : 0], 12);
    TK_OK(world_feed(&w, 2, NULL, 0, 11));
    TK_OK(kvc_memory_can_rewind(w.m, 12, &ok));
    TK_CHECK(ok); /* was 0: the restore had dropped it */
    TK_OK(kvc_memory_can_rewind(w.m, 8, &ok));
    TK_CHECK(ok);
    TK_OK(kvc_memory_restore(w.m, NULL, 12));
    w.off = 12;
    TK_CHECK(world_ok(&w));
    TK_OK(kvc_memory_snapshot_free(snap));
    TK_OK(kvc_memory_destroy(w.m));
}

int main(int argc, char **argv) {
    unsigned long long seed = argc > 1 ? strtoull(argv[1], NULL, 10) : (unsigned long long)time(NULL);
    tk_rng rng;
    printf("seed %llu\n", seed);
    rng.s = seed;
    test_check_seven();
    test_check_property(&rng);
    test_direct_refused();
    test_direct_mix(&rng);
    test_rewind_contracts();
    test_restore_keeps_at();
    return tk_report("memory_groups");
}
