/* fuzz/fuzz_memory.c - libFuzzer target: operation sequences on model memories
   (kvc_memory: layer groups of FULL, ROTATING and RECURRENT caches under one budget),
   decoded from the input bytes and checked against a deliberately simple reference.

   The first bytes choose the model: 1-6 layers mapped onto 1-4 groups, each FULL,
   ROTATING (window 2-9, 0-2 sinks) or RECURRENT (1-8 state floats, one sequence), with
   1-2 kv heads, head sizes 1-4, f32 or f16, 1-8 cells per page, 1-4 or the default 8
   checkpoints, and a budget of one page per group plus 0-15 more pages of each (so it
   often runs out). Memory comes from a counting allocator that can refuse: an operation
   byte of 23 arms it to refuse the k-th allocation (k from the next byte) of the next
   operation's main call (kvc_memory_create, _begin, _snapshot_take, _restore, _fork),
   which must then fail with KVC_ERR_NO_MEMORY and change nothing (the reference and the
   bytes used are compared as after any refusal), or succeed when it needs fewer
   allocations. Every later byte starts an
   operation on up to 4 memories (the first, its forks, a second memory of the same
   configuration), 6 memory snapshots and one kvc_prefix; its parameters come from the
   bytes after it (a missing byte reads as 0).

   Operations: batches (kvc_memory_begin with 0-3 checkpoints, K/V put per attention
   layer with values that encode (token, position, layer, index), the recurrent states
   updated in place with a known recurrence while handing over the checkpoint states,
   sometimes skipping one, which must drop that checkpoint; a cancel before or after a
   state was handed out; calls refused while the batch is open; a clear in the middle),
   trim, live restore, snapshots taken at any offset and restored into the memory, its
   forks or the other memory (FOREIGN), snapshot free, fork, clear, destroy, prefix
   reuse over a memory (begin with a token list, evaluate, generate, close), broken
   configurations (kvc_memory_config_check must name the documented field, and
   kvc_memory_create must agree) and invalid arguments.

   Reference, per memory and group: the tokens it holds (tests/ref_model.h's ref_state:
   token ids at positions [0, offset), the ROTATING window's anchor and whether it
   wrapped) and its checkpoints (offset, and for ROTATING the window state there): the
   latest cfg.checkpoints, those past a rewind dropped. A group can go back to any offset
   (FULL), any until wrapped (ROTATING) and else only to its checkpoints. Every result
   code is predicted; KVC_ERR_FULL of kvc_memory_begin from bounds on the pages it needs
   (the exact count depends on which pages forks and snapshots share): above the free
   budget it must fail, below it must succeed, between either, and a failure must change
   nothing (contents, checkpoints and bytes_used are compared). After every operation
   each memory is compared: offsets of the memory and of every group, every FULL layer's
   K and V via kvc_cache_gather, every ROTATING layer's visible window likewise, every
   RECURRENT state (kvc_state_read) against the recurrence replayed over the group's
   tokens, checkpoint lists, kvc_memory_can_rewind of every offset, rewind_point and
   stats. At the end everything is freed in an input-chosen order and the counting
   allocator must be back to zero blocks. A mismatch prints what differs and the last
   operations, then aborts (fuzz/fuzz_replay.c prints the input file to replay).

   -DFM_TOLERATE_KNOWN=1 steers around library bugs this target found (each marked
   "known:" below, all fixed since), should fuzzing ever need to go on past one again. */
#define KVCACHE_IMPLEMENTATION
#include "../kvcache.h"
#include "fuzz_util.h"
#include "../tests/ref_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef FM_TOLERATE_KNOWN
#define FM_TOLERATE_KNOWN 0 /* every bug it was written for is fixed */
#endif

#define FM_MAXL 6     /* model layers */
#define FM_MAXG 4     /* groups */
#define FM_MEMS 4     /* live memories */
#define FM_SNAPS 6    /* live memory snapshots */
#define FM_MAXT 64    /* tokens a memory is grown to at most */
#define FM_BATCH 8    /* tokens per batch at most */
#define FM_CK 8       /* checkpoints a group keeps at most (cfg.checkpoints 0 = 8) */
#define FM_ROW 8      /* floats of one token's K (or V) of one layer at most: 2 heads x 4 */
#define FM_NF 8       /* state floats at most */
#define FM_PT 48      /* prefix: prompt length and max_tokens bound */
#define FM_STEPS 300  /* operations per input at most */

/* ---- memory: a counting allocator that can refuse one allocation ------------------------ */
static long fm_live_blocks;
static long fm_refuse_next = -1;    /* armed (op 23): the allocation of the next main call to refuse */
static long fm_refuse_at = -1, fm_seen; /* during that call: which one, and how many were asked for */
static int fm_refused;                /* the call had an allocation refused */
static void *fm_alloc(size_t n, void *user) {
    void *p;
    (void)user;
    if (fm_refuse_at >= 0 && fm_seen++ == fm_refuse_at) {
        fm_refused = 1;
        return NULL;
    }
    p = malloc(n);
    if (p) fm_live_blocks++;
    return p;
}
/* around an operation's main call: the armed refusal applies to it alone */
static void fm_arm(void) {
    fm_refuse_at = fm_refuse_next;
    fm_seen = 0;
    fm_refused = 0;
}
/* 1 when the call had an allocation refused: KVC_ERR_NO_MEMORY is then its answer */
static int fm_disarm(void) {
    int refused = fm_refused;
    fm_refuse_at = fm_refuse_next = -1;
    fm_refused = 0;
    return refused;
}
static void fm_free(void *p, void *user) {
    (void)user;
    if (p) fm_live_blocks--;
    free(p);
}
/* a parallel_for for the n_workers check (never run: the configuration is refused) */
static void fm_pfor(void *user, int32_t n, kvc_task_fn fn, void *ctx) {
    int32_t i;
    (void)user;
    for (i = 0; i < n; ++i) fn(ctx, i, 0);
}

/* ---- values ---------------------------------------------------------------------------- */
static uint32_t fm_hash(uint32_t x) {
    x ^= x >> 16; x *= 0x7feb352du; x ^= x >> 15; x *= 0x846ca68bu; x ^= x >> 16;
    return x;
}
/* K (kv 0) and V (kv 1) of token tok at position pos, model layer l, index i: integers in
   [-1000, 1000], exact in f16 */
static float fm_kv(uint32_t tok, int32_t pos, int32_t l, int32_t i, int kv) {
    uint32_t x = fm_hash(tok * 0x9e3779b1u ^ fm_hash((uint32_t)pos * 977u + (uint32_t)(l * 64 + i * 2 + kv) + 1u));
    return (float)((int)(x % 2001u) - 1000);
}
/* the toy recurrence: state[i] = state[i] / 2 + x(token, position, layer, i) */
static float fm_x(uint32_t tok, int32_t pos, int32_t l, int32_t i) {
    return (float)((int)(fm_hash(tok * 0x85ebca6bu ^ fm_hash((uint32_t)pos * 131u + (uint32_t)(l * 16 + i) + 7u)) % 17u) - 8);
}
static void fm_step(float *st, int32_t nf, uint32_t tok, int32_t pos, int32_t l) {
    int32_t i;
    for (i = 0; i < nf; ++i) st[i] = st[i] * 0.5f + fm_x(tok, pos, l, i);
}

/* ---- reference state ------------------------------------------------------------------- */
typedef struct fm_ck {
    int32_t to, bb; /* offset; ROTATING: the window anchor there */
    int rel;        /* ROTATING: a window page was released there */
} fm_ck;

typedef struct fm_gref {
    ref_state st;   /* tokens [0, off); ROTATING window state */
    fm_ck ck[FM_CK];
    int nck;
} fm_gref;

typedef struct fm_mem {
    kvc_memory *h;
    int family;     /* memories sharing pools (forks) have the same */
    int pend;       /* a batch named checkpoints: the next call that settles them may free pages */
    uint32_t changes; /* calls that added or replaced tokens: batches, restores from a
                         snapshot (kvc_prefix's generation rule) */
    int grace;      /* a batch ended and no call settled it yet: RECURRENT groups still take
                       kvc_state and kvc_state_checkpoint (the pointers stay writable until a
                       call other than those two), so their refusals are not checked */
    fm_gref g[FM_MAXG];
} fm_mem;

typedef struct fm_snap {
    kvc_memory_snapshot *h;
    int family;
    int32_t from, to;
    fm_gref g[FM_MAXG]; /* the state at `to`; ck: the checkpoints it carries */
} fm_snap;

typedef struct fm_group {
    kvc_kind kind;
    int32_t nl, H, dk, dv, pc, W, S, maxck, nf;
    kvc_type tk, tv;
    size_t pb;                 /* page bytes */
    int32_t layer[FM_MAXL];    /* the model layer of each group layer */
} fm_group;

typedef struct fm_world {
    fuzz_in in;
    int32_t L, G, map[FM_MAXL];
    fm_group gr[FM_MAXG];
    kvc_group_config gc[FM_MAXG];
    kvc_memory_config mc;
    fm_mem m[FM_MEMS];
    int nm, next_family;
    fm_snap s[FM_SNAPS];
    int ns;
    kvc_prefix *px;
    kvc_memory *px_mem;
    int32_t px_max, px_tok[FM_PT], px_n;
    int px_open;
    uint32_t px_changes; /* the memory's changes when px_tok was recorded */
    float k[FM_BATCH * FM_ROW], v[FM_BATCH * FM_ROW];
    float gk[FM_MAXT * FM_ROW], gv[FM_MAXT * FM_ROW];
    int32_t gpos[FM_MAXT];
} fm_world;

static fm_world FM_; /* one input at a time; reset for each */

static int fm_is_kv(const fm_group *g) { return g->kind != KVC_KIND_RECURRENT; }
static int fm_has_ck(const fm_group *g) { return g->kind != KVC_KIND_FULL; }
static int32_t fm_ceil_div(int32_t a, int32_t b) { return a <= 0 ? 0 : (a + b - 1) / b; }
static int32_t fm_off(const fm_mem *m) { return m->g[0].st.off; }

static size_t fm_used(fm_mem *m) {
    kvc_memory_stats st;
    FUZZ_RES(kvc_memory_stats_get(m->h, &st), KVC_OK);
    return st.bytes_used;
}

/* ---- what a group and a memory can go back to -------------------------------------------- */
static int fm_wrapped(const fm_group *g, const ref_state *st) { return ref_wrapped(g->kind, g->W, st); }
static int fm_ck_find(const fm_gref *r, int32_t t) {
    int i;
    for (i = 0; i < r->nck; ++i)
        if (r->ck[i].to == t) return i;
    return -1;
}
static int fm_reach(const fm_group *g, const fm_gref *r, int32_t t) {
    if (t < 0 || t > r->st.off) return 0;
    if (t == r->st.off || t == 0 || g->kind == KVC_KIND_FULL) return 1; /* 0: clearing */
    if (g->kind == KVC_KIND_ROTATING && !fm_wrapped(g, &r->st)) return 1;
    return fm_ck_find(r, t) >= 0;
}
static int fm_mem_reach(const fm_world *w, const fm_mem *m, int32_t t) {
    int g;
    for (g = 0; g < w->G; ++g)
        if (!fm_reach(&w->gr[g], &m->g[g], t)) return 0;
    return 1;
}
static int32_t fm_rewind_point(const fm_world *w, const fm_mem *m, int32_t max) {
    int32_t t = fuzz_min(max, fm_off(m));
    while (t > 0 && !fm_mem_reach(w, m, t)) t--;
    return t;
}

static void fm_ck_push(const fm_group *g, fm_gref *r, fm_ck c) {
    if (r->nck == g->maxck) { /* the oldest goes */
        memmove(r->ck, r->ck + 1, sizeof(fm_ck) * (size_t)(r->nck - 1));
        r->nck--;
    }
    r->ck[r->nck++] = c;
}
static void fm_ck_drop_after(fm_gref *r, int32_t t) {
    while (r->nck > 0 && r->ck[r->nck - 1].to > t) r->nck--;
}

static void fm_reset(fm_mem *m, int G) {
    int g;
    for (g = 0; g < G; ++g) {
        m->g[g].st.off = m->g[g].st.bb = m->g[g].st.rel = 0;
        m->g[g].nck = 0;
    }
}

/* every group goes back to t (a rewind the reference allowed) */
static void fm_rewind(const fm_world *w, fm_mem *m, int32_t t) {
    int g;
    if (t == 0) { fm_reset(m, w->G); return; } /* the library clears */
    for (g = 0; g < w->G; ++g) {
        const fm_group *gr = &w->gr[g];
        fm_gref *r = &m->g[g];
        if (t == r->st.off) continue;
        if (gr->kind == KVC_KIND_FULL || (gr->kind == KVC_KIND_ROTATING && !fm_wrapped(gr, &r->st))) {
            ref_rewind(&r->st, t);
        } else {
            int i = fm_ck_find(r, t);
            FUZZ_CHECK(i >= 0, "reference: no checkpoint at %d in group %d", t, g);
            r->st.off = t;
            r->st.bb = r->ck[i].bb;
            r->st.rel = r->ck[i].rel;
        }
        fm_ck_drop_after(r, t);
    }
}

/* ---- checks ------------------------------------------------------------------------------ */
static void fm_check_mem(fm_world *w, int mi) {
    fm_mem *m = &w->m[mi];
    int32_t off = -1, t, tp = -1, n;
    int g, ok;
    kvc_memory_stats ms;
    FUZZ_RES(kvc_memory_offset(m->h, &off), KVC_OK);
    FUZZ_CHECK(off == fm_off(m), "memory %d: offset %d, reference %d", mi, off, fm_off(m));
    for (g = 0; g < w->G; ++g) {
        const fm_group *gr = &w->gr[g];
        const fm_gref *r = &m->g[g];
        kvc_cache *c = NULL;
        int32_t gl, i, j, co = -1, at[16], nat = -1;
        FUZZ_RES(kvc_memory_group(m->h, g, &c), KVC_OK);
        FUZZ_RES(kvc_cache_offset(c, &co), KVC_OK);
        FUZZ_CHECK(co == r->st.off, "memory %d group %d: offset %d, reference %d", mi, g, co, r->st.off);
        if (fm_is_kv(gr)) {
            int32_t view[FM_MAXT], nview = ref_view(gr->kind, gr->W, gr->S, &r->st, view);
            int32_t nk = gr->H * gr->dk, nv = gr->H * gr->dv;
            for (gl = 0; gl < gr->nl; ++gl) {
                int32_t l = gr->layer[gl];
                FUZZ_RES(kvc_cache_gather(c, gl, w->gk, w->gv, w->gpos, FM_MAXT, &n), KVC_OK);
                FUZZ_CHECK(n == nview, "memory %d group %d layer %d: %d cells, reference %d", mi, g, l, n, nview);
                for (j = 0; j < n; ++j) {
                    uint32_t tok = r->st.uid[view[j]];
                    FUZZ_CHECK(w->gpos[j] == view[j], "memory %d group %d layer %d cell %d: pos %d, want %d", mi, g, l, j,
                               w->gpos[j], view[j]);
                    for (i = 0; i < nk; ++i)
                        FUZZ_CHECK(w->gk[j * nk + i] == fm_kv(tok, view[j], l, i, 0),
                                   "memory %d group %d layer %d pos %d: K[%d] %g, want %g", mi, g, l, view[j], i,
                                   (double)w->gk[j * nk + i], (double)fm_kv(tok, view[j], l, i, 0));
                    for (i = 0; i < nv; ++i)
                        FUZZ_CHECK(w->gv[j * nv + i] == fm_kv(tok, view[j], l, i, 1),
                                   "memory %d group %d layer %d pos %d: V[%d] %g, want %g", mi, g, l, view[j], i,
                                   (double)w->gv[j * nv + i], (double)fm_kv(tok, view[j], l, i, 1));
                }
            }
        } else {
            for (gl = 0; gl < gr->nl; ++gl) {
                int32_t l = gr->layer[gl];
                const float *p = NULL;
                float want[FM_NF];
                memset(want, 0, sizeof(want));
                for (t = 0; t < r->st.off; ++t) fm_step(want, gr->nf, r->st.uid[t], t, l);
                FUZZ_RES(kvc_state_read(c, 0, gl, &p), KVC_OK);
                for (i = 0; i < gr->nf; ++i)
                    FUZZ_CHECK((p ? p[i] : 0.0f) == want[i], "memory %d group %d layer %d (offset %d): state[%d] %g, want %g",
                               mi, g, l, r->st.off, i, p ? (double)p[i] : 0.0, (double)want[i]);
            }
        }
        if (fm_has_ck(gr)) {
            FUZZ_RES(kvc_cache_checkpoints(c, at, 16, &nat), KVC_OK);
            FUZZ_CHECK(nat == r->nck, "memory %d group %d: %d checkpoints, reference %d", mi, g, nat, r->nck);
            for (i = 0; i < nat; ++i)
                FUZZ_CHECK(at[i] == r->ck[i].to, "memory %d group %d: checkpoint %d at %d, reference %d", mi, g, i, at[i],
                           r->ck[i].to);
        }
    }
    for (t = -1; t <= off + 1; ++t) {
        FUZZ_RES(kvc_memory_can_rewind(m->h, t, &ok), KVC_OK);
        FUZZ_CHECK(ok == fm_mem_reach(w, m, t), "memory %d: can_rewind(%d) %d, reference %d", mi, t, ok,
                   fm_mem_reach(w, m, t));
    }
    for (t = 0; t <= off + 1; t += 1 + off / 4) {
        FUZZ_RES(kvc_memory_rewind_point(m->h, t, &tp), KVC_OK);
        FUZZ_CHECK(tp == fm_rewind_point(w, m, t), "memory %d: rewind_point(%d) %d, reference %d", mi, t, tp,
                   fm_rewind_point(w, m, t));
    }
    FUZZ_RES(kvc_memory_stats_get(m->h, &ms), KVC_OK);
    FUZZ_CHECK(ms.offset == off && ms.n_groups == w->G && ms.budget_bytes == w->mc.budget_bytes &&
                   ms.bytes_used <= ms.budget_bytes,
               "memory %d: stats offset %d groups %d budget %zu used %zu", mi, ms.offset, ms.n_groups, ms.budget_bytes,
               ms.bytes_used);
    {   /* offsets below the current one every group can go back to, counted over the
           checkpoints of the first group that keeps them */
        int32_t want = 0, i;
        for (g = 0; g < w->G && !fm_has_ck(&w->gr[g]); ++g) {}
        for (i = 0; g < w->G && i < m->g[g].nck; ++i)
            want += m->g[g].ck[i].to < off && fm_mem_reach(w, m, m->g[g].ck[i].to);
        FUZZ_CHECK(ms.n_checkpoints == want, "memory %d: stats n_checkpoints %d, reference %d", mi, ms.n_checkpoints, want);
    }
}

static void fm_check_all(fm_world *w) {
    int i;
    for (i = 0; i < w->nm; ++i) fm_check_mem(w, i);
}

/* ---- creating and destroying memories ---------------------------------------------------- */
static int fm_find_mem(const fm_world *w, const kvc_memory *h) {
    int i;
    for (i = 0; i < w->nm; ++i)
        if (w->m[i].h == h) return i;
    return -1;
}

static void fm_prefix_drop(fm_world *w) {
    if (w->px == NULL) return;
    fuzz_note("prefix destroy");
    FUZZ_RES(kvc_prefix_destroy(w->px), KVC_OK);
    w->px = NULL;
    w->px_mem = NULL;
}

static void fm_create(fm_world *w) {
    fm_mem *m = &w->m[w->nm];
    int32_t l, gl;
    kvc_result r;
    if (w->nm == FM_MEMS) return;
    memset(m, 0, sizeof(*m));
    fuzz_note("create memory %d (family %d)", w->nm, w->next_family);
    fm_arm();
    r = kvc_memory_create(&w->mc, &m->h);
    if (fm_disarm() && r == KVC_ERR_NO_MEMORY) {
        fuzz_note("create refused an allocation");
        return;
    }
    FUZZ_RES(r, KVC_OK);
    m->family = w->next_family++;
    for (l = 0; l < w->L; ++l) { /* the layer map as documented */
        kvc_cache *c = NULL, *cg = NULL;
        FUZZ_RES(kvc_memory_layer(m->h, l, &c, &gl), KVC_OK);
        FUZZ_RES(kvc_memory_group(m->h, w->map[l], &cg), KVC_OK);
        FUZZ_CHECK(c == cg && w->gr[w->map[l]].layer[gl] == l, "memory_layer(%d): group layer %d", l, gl);
    }
    w->nm++;
}

static void fm_destroy(fm_world *w, int mi) {
    if (w->px != NULL && w->px_mem == w->m[mi].h) fm_prefix_drop(w); /* the memory must outlive it */
    fuzz_note("destroy memory %d", mi);
    FUZZ_RES(kvc_memory_destroy(w->m[mi].h), KVC_OK);
    w->m[mi] = w->m[--w->nm]; /* its snapshots stay, restorable into its family */
}

static void fm_snap_free(fm_world *w, int si) {
    fuzz_note("snapshot free %d", si);
    FUZZ_RES(kvc_memory_snapshot_free(w->s[si].h), KVC_OK);
    w->s[si] = w->s[--w->ns];
}

/* ---- a batch -------------------------------------------------------------------------------- */
/* Page bounds of kvc_memory_begin for group g: lo <= net pages <= hi (the exact count
   depends on which pages forks, snapshots and checkpoints share). */
static void fm_net_bounds(const fm_group *gr, const fm_gref *r, int32_t n, int32_t inside, int64_t *lo, int64_t *hi) {
    int32_t o = r->st.off;
    if (gr->kind == KVC_KIND_RECURRENT) { /* a private state page (unless owned), one per checkpoint */
        *lo = inside;
        *hi = inside + 1;
        return;
    }
    {
        int32_t pc = gr->pc, base = (o + n - 1) / pc - fm_ceil_div(o, pc) + 1, maxdead = 0;
        if (gr->kind == KVC_KIND_ROTATING) { /* window pages older than the batch's first query */
            int32_t lo_tok = o - (gr->W - gr->S) + 1, nsp = fm_ceil_div(gr->S, pc);
            if (lo_tok > 0) maxdead = fuzz_max(0, lo_tok / pc - nsp);
        }
        *lo = base - maxdead;
        *hi = base + (o % pc != 0); /* a shared tail page is copied */
    }
}

/* The result kvc_memory_cancel gives now; done[g] = layers of group g put or handed out. */
static int fm_cancel_expect(const fm_world *w, const int *done) {
    int g;
    int all = 1;
    for (g = 0; g < w->G; ++g) all &= done[g] == w->gr[g].nl;
    if (all) return KVC_ERR_STATE; /* the batch ended */
    for (g = 0; g < w->G; ++g) {
        if (w->gr[g].kind == KVC_KIND_RECURRENT && done[g] > 0) return KVC_ERR_RECURRENT;
    }
    return KVC_OK;
}

/* calls refused while a batch is open; nothing may change */
static void fm_refused_in_batch(fm_world *w, fm_mem *m, int which) {
    kvc_memory_snapshot *s = NULL;
    kvc_memory *f = NULL;
    int32_t r = -1;
    fuzz_note("refused calls in a batch (%d)", which);
    switch (which % 6) {
    case 0: FUZZ_RES(kvc_memory_begin(m->h, 1, NULL, 0), KVC_ERR_STATE); break;
    case 1: FUZZ_RES(kvc_memory_snapshot_take(m->h, 0, fm_off(m), &s), KVC_ERR_STATE); break;
    case 2: FUZZ_RES(kvc_memory_fork(m->h, &f), KVC_ERR_STATE); break;
    case 3: FUZZ_RES(kvc_memory_trim(m->h, 0), KVC_ERR_STATE); break;
    case 4: FUZZ_RES(kvc_memory_restore(m->h, NULL, 0), KVC_ERR_STATE); break;
    default:
        if (w->px != NULL && w->px_mem == m->h) {
            int32_t tok = 1;
            FUZZ_RES(kvc_prefix_begin(w->px, &tok, 1, &r), KVC_ERR_STATE);
        }
        break;
    }
}

/* One forward pass of tokens tok[0..n) with checkpoints at[0..n_at) through memory mi,
   parameters from the input. Returns 1 when the batch was completed. */
static int fm_batch(fm_world *w, int mi, const int32_t *tok, int32_t n, const int32_t *at, int32_t n_at) {
    fm_mem *m = &w->m[mi];
    int32_t o = fm_off(m), g, l, t, i, inside = 0;
    unsigned mode = fuzz_byte(&w->in), skip = fuzz_byte(&w->in);
    int32_t cancel_at = (mode & 7) == 0 ? fuzz_int(&w->in, 0, w->L) : -1;   /* a cancel before layer cancel_at */
    int32_t odd_at = (mode & 0x38) == 0 ? fuzz_int(&w->in, 0, w->L - 1) : -1; /* refused calls before it */
    int clear_mid = (mode & 0xc0) == 0xc0 && (skip & 0x0f) == 0x0f;
    int done[FM_MAXG], handed[4][FM_MAXG], want, r, drops = 0;
    int64_t lo = 0, hi = 0;
    size_t used = fm_used(m), freeb = w->mc.budget_bytes - used;
    ref_state after[FM_MAXG];
    int32_t range_group = -1; /* the first group that keeps fewer checkpoints than named */
    memset(done, 0, sizeof(done));
    memset(handed, 0, sizeof(handed));
    /* the expected result */
    want = KVC_OK;
    for (i = 0; i < n_at; ++i)
        if (at[i] <= (i > 0 ? at[i - 1] : o) || at[i] > o + n) want = KVC_ERR_RANGE;
    for (g = 0; g < w->G && want == KVC_OK; ++g)
        if (fm_has_ck(&w->gr[g]) && n_at > w->gr[g].maxck) want = KVC_ERR_RANGE, range_group = g;
    for (i = 0; i < n_at; ++i) inside += at[i] < o + n;
    for (g = 0; g < w->G; ++g) {
        int64_t a, b;
        fm_net_bounds(&w->gr[g], &m->g[g], n, inside, &a, &b);
        lo += a * (int64_t)w->gr[g].pb;
        hi += b * (int64_t)w->gr[g].pb;
    }
    fuzz_note("memory %d begin %d at offset %d, %d checkpoints (%d..%d), bytes %lld..%lld of %zu free, want %d", mi, n, o,
              n_at, n_at ? at[0] : 0, n_at ? at[n_at - 1] : 0, (long long)lo, (long long)hi, freeb, want);
    fm_arm();
    r = kvc_memory_begin(m->h, n, at, n_at);
    if (fm_disarm() && r == KVC_ERR_NO_MEMORY) want = KVC_ERR_NO_MEMORY; /* all or nothing */
    /* settling the last batch's checkpoints (dropping the oldest, releasing incomplete
       ones) may free pages first: then only the upper bound is known */
    if (want == KVC_OK && lo > (int64_t)freeb && !m->pend) want = KVC_ERR_FULL;
    if (want == KVC_ERR_NO_MEMORY) fuzz_note("begin refused an allocation");
    if (want == KVC_OK && hi > (int64_t)freeb && r == KVC_ERR_FULL) want = KVC_ERR_FULL; /* either */
    /* a group's own pool may be out of pages (KVC_ERR_FULL) before a later group's
       checkpoint count is checked */
    if (range_group > 0 && r == KVC_ERR_FULL) want = KVC_ERR_FULL;
    FUZZ_RES(r, want);
    if (r != KVC_OK) { /* nothing changed, but settling may have given pages back */
        FUZZ_CHECK(fm_used(m) <= used, "memory %d: refused begin took pages: bytes_used %zu -> %zu", mi, used, fm_used(m));
        return 0;
    }
    m->pend = 0;
    m->changes++;
    for (g = 0; g < w->G; ++g) {
        uint32_t uids[FM_BATCH];
        for (t = 0; t < n; ++t) uids[t] = (uint32_t)tok[t];
        ref_begin(w->gr[g].kind, w->gr[g].W, w->gr[g].S, fuzz_max(w->gr[g].pc, 1), &m->g[g].st, uids, n, &after[g]);
    }
    for (l = 0; l <= w->L; ++l) {
        const fm_group *gr;
        int32_t gl;
        if (l == odd_at) fm_refused_in_batch(w, m, (int)(skip >> 4));
        if (l == cancel_at) {
            int wc = fm_cancel_expect(w, done);
            fuzz_note("memory %d cancel before layer %d, want %d", mi, l, wc);
            FUZZ_RES(kvc_memory_cancel(m->h), wc);
            if (wc == KVC_OK) {
                for (g = 0; g < w->G; ++g) ref_cancel(&m->g[g].st, &after[g]);
                return 0;
            }
        }
        if (l == w->L) break;
        if (clear_mid && l == w->L / 2) {
            fuzz_note("memory %d clear in the batch, before layer %d", mi, l);
            FUZZ_RES(kvc_memory_clear(m->h), KVC_OK);
            fm_reset(m, w->G);
            return 0;
        }
        g = w->map[l];
        gr = &w->gr[g];
        for (gl = 0; gr->layer[gl] != l; ++gl) {}
        if (fm_is_kv(gr)) {
            int32_t nk = gr->H * gr->dk, nv = gr->H * gr->dv;
            for (t = 0; t < n; ++t) {
                for (i = 0; i < nk; ++i) w->k[t * nk + i] = fm_kv((uint32_t)tok[t], o + t, l, i, 0);
                for (i = 0; i < nv; ++i) w->v[t * nv + i] = fm_kv((uint32_t)tok[t], o + t, l, i, 1);
            }
            fuzz_note("memory %d put layer %d", mi, l);
            FUZZ_RES(kvc_memory_put(m->h, l, w->k, w->v), KVC_OK);
        } else {
            float *st = NULL, want_st[FM_NF];
            int32_t k = 0;
            memset(want_st, 0, sizeof(want_st));
            for (t = 0; t < o; ++t) fm_step(want_st, gr->nf, m->g[g].st.uid[t], t, l);
            fuzz_note("memory %d state layer %d", mi, l);
            FUZZ_RES(kvc_memory_state(m->h, l, 0, &st), KVC_OK);
            FUZZ_CHECK(st != NULL, "memory %d layer %d: no state", mi, l);
            for (i = 0; i < gr->nf; ++i) /* the live state handed out is the state at o */
                FUZZ_CHECK(st[i] == want_st[i], "memory %d layer %d: live state[%d] %g at offset %d, want %g", mi, l, i,
                           (double)st[i], o, (double)want_st[i]);
            if (mode & 0x40) /* an offset the batch did not name */
                FUZZ_RES(kvc_memory_state_checkpoint(m->h, l, o + n + 1, st), KVC_ERR_RANGE);
            for (t = 0; t < n; ++t) {
                fm_step(st, gr->nf, (uint32_t)tok[t], o + t, l);
                while (k < n_at && at[k] < o + t + 1) k++;
                if (k < n_at && at[k] == o + t + 1) {
                    /* a skipped hand-over drops the checkpoint (the batch end comes from the live state) */
                    int skipped = (mode & 0x80) && ((skip >> ((uint32_t)(gl * 3 + k) % 8u)) & 1u) && at[k] < o + n;
                    if (!skipped) {
                        FUZZ_RES(kvc_memory_state_checkpoint(m->h, l, at[k], st), KVC_OK);
                        handed[k][g]++;
                    }
                }
            }
        }
        done[g]++;
    }
    /* the batch ended: the reference's new state and checkpoints */
    m->pend = n_at > 0;
    m->grace = 1;
    for (g = 0; g < w->G; ++g) {
        const fm_group *gr = &w->gr[g];
        fm_gref *rg = &m->g[g];
        int before = rg->nck, pushed = 0;
        rg->st = after[g];
        for (i = 0; i < n_at && fm_has_ck(gr); ++i) {
            fm_ck c;
            c.to = at[i];
            c.bb = at[i] == o + n ? o : at[i] - 1;
            c.rel = after[g].rel;
            if (gr->kind == KVC_KIND_RECURRENT && at[i] < o + n && handed[i][g] < gr->nl) continue;
            fm_ck_push(gr, rg, c);
            pushed++;
        }
        drops |= before + pushed > gr->maxck;
    }
#if FM_TOLERATE_KNOWN
    {   /* known: until the next call settles the batch's checkpoints, the oldest one that
           settling will drop past cfg.checkpoints still counts as reachable
           (kvc_cache_can_rewind, kvc_memory_can_rewind) and a rewind to it fails an assertion in
           kvc__rewind_any; stats count it too. A snapshot take settles every group. */
        if (drops) {
            kvc_memory_snapshot *s = NULL;
            fuzz_note("memory %d: settle (snapshot at the offset)", mi);
            FUZZ_RES(kvc_memory_snapshot_take(m->h, 0, fm_off(m), &s), KVC_OK);
            FUZZ_RES(kvc_memory_snapshot_free(s), KVC_OK);
        }
    }
#endif
    (void)drops;
    return 1;
}

/* checkpoints for a batch of n at offset o, from the input: 0-3 of them, increasing inside
   the batch, now and then out of order or outside */
static int32_t fm_decode_at(fm_world *w, int32_t o, int32_t n, int32_t *at) {
    unsigned x = fuzz_byte(&w->in);
    int32_t n_at = (int32_t)(x % 4), i, prev = o;
    for (i = 0; i < n_at; ++i) {
        if (prev >= o + n) break;
        at[i] = prev + 1 + fuzz_int(&w->in, 0, fuzz_min(o + n - prev - 1, 7));
        prev = at[i];
    }
    n_at = i;
    if ((x & 0xf0) == 0xf0 && n_at > 0) at[fuzz_int(&w->in, 0, n_at - 1)] += fuzz_int(&w->in, -4, 4); /* maybe broken */
    return n_at;
}

static void fm_op_batch(fm_world *w, int mi) {
    int32_t o = fm_off(&w->m[mi]), n = fuzz_min(fuzz_int(&w->in, 1, FM_BATCH), FM_MAXT - o), tok[FM_BATCH], at[4], n_at, t;
    if (n < 1) return;
    for (t = 0; t < n; ++t) tok[t] = (int32_t)(fuzz_byte(&w->in) % 8u);
    n_at = fm_decode_at(w, o, n, at);
    fm_batch(w, mi, tok, n, at, n_at);
}

/* ---- trims, rewinds, snapshots ----------------------------------------------------------- */
static void fm_op_trim(fm_world *w, int mi) {
    fm_mem *m = &w->m[mi];
    int32_t off = fm_off(m), n = fuzz_int(&w->in, -1, off + 1);
    int want = n < 0 || n > off ? KVC_ERR_RANGE : fm_mem_reach(w, m, off - n) ? KVC_OK : KVC_ERR_UNREACHABLE;
    fuzz_note("memory %d trim %d of %d, want %d", mi, n, off, want);
    FUZZ_RES(kvc_memory_trim(m->h, n), want);
    if (want == KVC_OK) fm_rewind(w, m, off - n);
    if (want == KVC_OK) m->grace = 0;
}

static void fm_op_rewind(fm_world *w, int mi) {
    fm_mem *m = &w->m[mi];
    int32_t off = fm_off(m), t = fuzz_int(&w->in, -1, off + 1);
    int want;
    if (fuzz_byte(&w->in) % 2 && off > 0) { /* a checkpoint of some group, more often than chance */
        int g = fuzz_int(&w->in, 0, w->G - 1);
        if (m->g[g].nck > 0) t = m->g[g].ck[fuzz_int(&w->in, 0, m->g[g].nck - 1)].to;
    }
    want = fm_mem_reach(w, m, t) ? KVC_OK : KVC_ERR_UNREACHABLE;
    fuzz_note("memory %d restore(NULL, %d) at %d, want %d", mi, t, off, want);
    FUZZ_RES(kvc_memory_restore(m->h, NULL, t), want);
    if (want == KVC_OK) fm_rewind(w, m, t);
    if (want == KVC_OK) m->grace = 0;
}

static void fm_op_take(fm_world *w, int mi) {
    fm_mem *m = &w->m[mi];
    kvc_memory_snapshot *out = (kvc_memory_snapshot *)&out; /* not NULL: a NULL answer is checked */
    int32_t off = fm_off(m), from = fuzz_int(&w->in, -2, off), at = fuzz_int(&w->in, 0, off + 1);
    int want = KVC_OK, g, i;
    kvc_result r;
    fm_snap *s;
    if (fuzz_byte(&w->in) % 2 && off > 0) { /* at a checkpoint */
        g = fuzz_int(&w->in, 0, w->G - 1);
        if (m->g[g].nck > 0) at = m->g[g].ck[fuzz_int(&w->in, 0, m->g[g].nck - 1)].to;
        from = fuzz_min(from, at - 1);
    }
    if (w->ns == FM_SNAPS) fm_snap_free(w, 0);
    if (at < 0 || at > off) want = KVC_ERR_RANGE;
    for (g = 0; g < w->G && want == KVC_OK && at > from && at > 0; ++g) {
        const fm_group *gr = &w->gr[g];
        const fm_gref *r = &m->g[g];
        if (gr->kind == KVC_KIND_FULL || at == off || fm_ck_find(r, at) >= 0) continue;
        if (gr->kind == KVC_KIND_ROTATING && (at > r->st.bb || !ref_wrapped(gr->kind, gr->W, &r->st)))
            continue; /* inside the last batch, or nothing released yet */
        want = KVC_ERR_UNREACHABLE; /* as a rewind there (once KVC_ERR_RECURRENT for a state) */
    }
    fuzz_note("memory %d snapshot_take(%d, %d) at %d, want %d", mi, from, at, off, want);
    fm_arm();
    r = kvc_memory_snapshot_take(m->h, from, at, &out);
    if (fm_disarm() && r == KVC_ERR_NO_MEMORY) {
        fuzz_note("snapshot_take refused an allocation");
        return;
    }
    FUZZ_RES(r, want);
    if (want != KVC_OK) return;
    if (at <= from || at == 0) {
        FUZZ_CHECK(out == NULL, "snapshot_take(%d, %d): not NULL", from, at);
        return;
    }
    FUZZ_CHECK(out != NULL, "snapshot_take(%d, %d): NULL", from, at);
    m->grace = 0; /* every group settled */
    s = &w->s[w->ns++];
    s->h = out;
    s->family = m->family;
    s->from = fuzz_max(from, 0);
    s->to = at;
    for (g = 0; g < w->G; ++g) {
        const fm_gref *r = &m->g[g];
        fm_gref *d = &s->g[g];
        int k = fm_ck_find(r, at);
        d->st = r->st;
        d->st.off = at;
        if (w->gr[g].kind == KVC_KIND_ROTATING) {
            if (at == r->st.off) {
            } else if (at > r->st.bb || !ref_wrapped(KVC_KIND_ROTATING, w->gr[g].W, &r->st)) {
                /* the window inside the last batch, or with nothing released yet */
                d->st.bb = at - 1;
            } else {
                FUZZ_CHECK(k >= 0, "reference: no checkpoint at %d", at);
                d->st.bb = r->ck[k].bb;
                d->st.rel = r->ck[k].rel;
            }
        }
        d->nck = 0;
        for (i = 0; i < r->nck; ++i) /* the checkpoints up to it come with it */
            if (r->ck[i].to <= at) d->ck[d->nck++] = r->ck[i];
    }
}

static void fm_op_restore(fm_world *w, int mi) {
    fm_mem *m = &w->m[mi];
    fm_snap *s;
    int32_t target, g, i, risky = 0;
    size_t freeb = w->mc.budget_bytes - fm_used(m), copy_bytes = 0;
    int want = KVC_OK, r;
    if (w->ns == 0) return;
    s = &w->s[fuzz_int(&w->in, 0, w->ns - 1)];
    target = fuzz_byte(&w->in) % 4 ? s->to : fuzz_int(&w->in, -1, s->to + 1);
    if (s->family != m->family) want = KVC_ERR_FOREIGN;
    else if (target < 0 || target > s->to) want = KVC_ERR_UNREACHABLE;
    for (g = 0; g < w->G && want == KVC_OK; ++g) {
        const fm_group *gr = &w->gr[g];
        if (gr->kind == KVC_KIND_FULL && fm_off(m) < s->from) want = KVC_ERR_UNREACHABLE;
        else if (gr->kind != KVC_KIND_FULL && target < s->to &&
                 (gr->kind == KVC_KIND_RECURRENT || s->to > gr->W || s->g[g].st.rel))
            want = KVC_ERR_UNREACHABLE;
        if (gr->kind == KVC_KIND_FULL && s->from % gr->pc != 0 && target > s->from) {
            risky++;
            copy_bytes += gr->pb;
        }
    }
    fuzz_note("memory %d restore snapshot [%d, %d) to %d at %d, want %d", mi, s->from, s->to, target, fm_off(m), want);
    fm_arm();
    r = kvc_memory_restore(m->h, s->h, target);
    if (fm_disarm() && r == KVC_ERR_NO_MEMORY) {
        fuzz_note("restore refused an allocation");
        return;
    }
    /* the FULL groups' pages at `from` may need copies (unless a group still shares that
       page with the snapshot) that do not fit: then the restore is refused whole, and the
       checks after this operation see nothing changed */
    if (r == KVC_ERR_FULL && want == KVC_OK && risky > 0 && copy_bytes > freeb) return;
    FUZZ_RES(r, want);
    if (want != KVC_OK) return;
    m->grace = 0;
    m->changes++;
    for (g = 0; g < w->G; ++g) {
        const fm_group *gr = &w->gr[g];
        fm_gref *d = &m->g[g];
        const fm_gref *src = &s->g[g];
        if (gr->kind == KVC_KIND_FULL) { /* keeps its tokens before `from` */
            if (target > s->from)
                memcpy(d->st.uid + s->from, src->st.uid + s->from, sizeof(uint32_t) * (size_t)(target - s->from));
            ref_rewind(&d->st, target);
            continue;
        }
        d->st = src->st;
        if (target < s->to) ref_rewind(&d->st, target);
        d->nck = 0;
        for (i = 0; i < src->nck; ++i)
            if (src->ck[i].to <= target) d->ck[d->nck++] = src->ck[i];
    }
}

/* ---- direct calls on a group's cache (issue 35) -------------------------------------------
   kvc_memory_group hands a group's cache out. On a memory of two or more groups every call
   that would change it alone is refused (KVC_ERR_OWNED) and changes nothing; on a memory of
   one group its cache is the memory, so a trim or live restore on it goes where the
   memory's would; kvc_cache_destroy and kvc_cache_fork are refused on any memory's cache.
   Reads agree with the reference. fm_check_all then compares the whole memory. */
static void fm_op_direct(fm_world *w, int mi) {
    fm_mem *m = &w->m[mi];
    kvc_cache *c, *f = NULL;
    int32_t g = fuzz_int(&w->in, 0, w->G - 1), off = fm_off(m), n = fuzz_int(&w->in, 1, 4), o = -1, at[1];
    unsigned x = fuzz_byte(&w->in);
    int ok = -1, want;
    FUZZ_RES(kvc_memory_group(m->h, g, &c), KVC_OK);
    fuzz_note("memory %d group %d direct call %u (n %d) at %d", mi, g, x % 10, n, off);
    at[0] = off + n;
    switch (x % 10) {
    case 0: FUZZ_RES(kvc_cache_destroy(c), KVC_ERR_OWNED); return;
    case 1: FUZZ_RES(kvc_cache_fork(c, &f), KVC_ERR_OWNED); return;
    case 2: FUZZ_RES(kvc_cache_offset(c, &o), KVC_OK); FUZZ_CHECK(o == off, "group offset %d, reference %d", o, off); return;
    case 3: {
        int32_t t = fuzz_int(&w->in, 0, off);
        FUZZ_RES(kvc_cache_can_rewind(c, t, &ok), KVC_OK);
        FUZZ_CHECK(ok == fm_reach(&w->gr[g], &m->g[g], t), "group %d can_rewind(%d) %d", g, t, ok);
        return;
    }
    default: break;
    }
    if (w->G > 1) { /* every change of one group alone */
        switch (x % 10) {
        case 4: FUZZ_RES(kvc_cache_trim(c, fuzz_min(n, off)), KVC_ERR_OWNED); break;
        case 5: FUZZ_RES(kvc_cache_restore(c, NULL, fuzz_int(&w->in, 0, off)), KVC_ERR_OWNED); break;
        case 6: FUZZ_RES(kvc_cache_clear(c), KVC_ERR_OWNED); break;
        case 7: FUZZ_RES(kvc_begin(c, n, NULL, 0), KVC_ERR_OWNED); break;
        case 8: FUZZ_RES(kvc_begin(c, n, at, 1), KVC_ERR_OWNED); break;
        default: FUZZ_RES(kvc_cancel(c), KVC_ERR_OWNED); break;
        }
        return;
    }
    /* one group: a trim or restore to 1 .. off goes where kvc_memory_trim would (to the
       offset itself: nothing changes, also on a wrapped or cancelled ROTATING window) */
    if (off < 2) return;
    n = fuzz_int(&w->in, 0, off - 1);
    want = fm_reach(&w->gr[0], &m->g[0], off - n) ? KVC_OK : KVC_ERR_UNREACHABLE;
    if (x % 2) {
        FUZZ_RES(kvc_cache_trim(c, n), want);
    } else {
        FUZZ_RES(kvc_cache_restore(c, NULL, off - n), want);
    }
    if (want == KVC_OK && n > 0) { /* by 0: nothing changes, the batch's grace included */
        fm_rewind(w, m, off - n);
        m->grace = 0;
    }
}

static void fm_op_fork(fm_world *w, int mi) {
    kvc_memory *f = NULL;
    kvc_result r;
    if (w->nm == FM_MEMS) return;
    fuzz_note("memory %d fork", mi);
    fm_arm();
    r = kvc_memory_fork(w->m[mi].h, &f);
    if (fm_disarm() && r == KVC_ERR_NO_MEMORY) {
        fuzz_note("fork refused an allocation");
        return;
    }
    FUZZ_RES(r, KVC_OK);
    w->m[mi].grace = 0; /* the fork settled it */
    w->m[w->nm] = w->m[mi];
    w->m[w->nm].h = f;
    w->nm++;
}

/* ---- prefix reuse over a memory ------------------------------------------------------------ */
static void fm_op_prefix_create(fm_world *w, int mi) {
    int32_t maxt = fuzz_int(&w->in, 1, FM_PT);
    if (w->px != NULL) { fm_prefix_drop(w); return; }
    fuzz_note("prefix over memory %d, max_tokens %d", mi, maxt);
    FUZZ_RES(kvc_prefix_create_memory(w->m[mi].h, maxt, &w->px), KVC_OK);
    w->px_mem = w->m[mi].h;
    w->px_max = maxt;
    w->px_n = 0;
    w->px_open = 0;
    w->px_changes = w->m[mi].changes;
}

/* ollama's MLX runner's request cycle: begin, evaluate the rest of the prompt, generate, close */
static void fm_op_prefix_session(fm_world *w) {
    int mi = w->px ? fm_find_mem(w, w->px_mem) : -1;
    fm_mem *m;
    int32_t tok[FM_PT], n = 0, keep, p = 0, reused = -1, gen[8], g, i, j, prompt[FM_PT], n_prompt;
    if (mi < 0) return;
    m = &w->m[mi];
    if (!w->px_open && m->changes != w->px_changes) w->px_n = 0; /* changed behind its back */
    keep = fuzz_int(&w->in, 0, w->px_n);
    for (i = 0; i < keep && n < FM_PT; ++i) tok[n++] = w->px_tok[i];
    for (i = fuzz_int(&w->in, 0, 12); i > 0 && n < FM_PT; --i) tok[n++] = fuzz_int(&w->in, 0, 7);
    if (n == 0) tok[n++] = 1;
    while (p < n && p < w->px_n && tok[p] == w->px_tok[p]) p++;
    if (p == n) p--;
    p = fm_rewind_point(w, m, fuzz_min(p, fm_off(m)));
    fuzz_note("prefix begin n %d (recorded %d) on memory %d at %d, want reuse %d", n, w->px_n, mi, fm_off(m), p);
    FUZZ_RES(kvc_prefix_begin(w->px, tok, n, &reused), KVC_OK);
    FUZZ_CHECK(reused == p, "prefix reused %d, reference %d", reused, p);
    fm_rewind(w, m, p);
    w->px_n = p;
    w->px_changes = m->changes;
    n_prompt = fuzz_min(n, w->px_max);
    memcpy(prompt, tok, sizeof(int32_t) * (size_t)n_prompt);
    w->px_open = 1;
    if (fuzz_byte(&w->in) % 8 == 0) return; /* left open */
    while (p < n) {
        int32_t b = fuzz_min(fuzz_min(n - p, fuzz_int(&w->in, 1, FM_BATCH)), FM_MAXT - fm_off(m)), at[4], n_at;
        if (b < 1) break;
        n_at = fm_decode_at(w, p, b, at);
        if (!fm_batch(w, mi, tok + p, b, at, n_at)) break;
        p += b;
    }
    g = fuzz_int(&w->in, 0, 6);
    for (j = 0; j < g; ++j) {
        gen[j] = fuzz_int(&w->in, 0, 7);
        if (p == n && fm_off(m) < FM_MAXT && fm_batch(w, mi, gen + j, 1, NULL, 0)) continue;
        p = -1; /* evaluation stopped: what is recorded is clipped to the offset */
    }
    fuzz_note("prefix close generated %d", g);
    FUZZ_RES(kvc_prefix_close(w->px, gen, g), KVC_OK);
    keep = fuzz_min(fuzz_min(fm_off(m), w->px_max), n_prompt + g);
    j = fuzz_min(keep, n_prompt);
    memcpy(w->px_tok, prompt, sizeof(int32_t) * (size_t)j);
    if (keep > j) memcpy(w->px_tok + j, gen, sizeof(int32_t) * (size_t)(keep - j));
    w->px_n = keep;
    w->px_changes = m->changes;
    w->px_open = 0;
    {   /* the recorded tokens as the object shows them */
        const int32_t *rt = NULL;
        int32_t rn = -1;
        FUZZ_RES(kvc_prefix_tokens(w->px, &rt, &rn), KVC_OK);
        FUZZ_CHECK(rn == w->px_n && memcmp(rt, w->px_tok, sizeof(int32_t) * (size_t)rn) == 0, "prefix tokens: %d, want %d",
                   rn, w->px_n);
    }
}

/* ---- configurations ------------------------------------------------------------------------ */
/* bytes of the pages a configuration takes at least (kvc_memory_config_check's rule) */
static size_t fm_min_bytes(const kvc_memory_config *mc) {
    size_t need = 0, pb = 0;
    int32_t g;
    for (g = 0; g < mc->n_groups; ++g) {
        const kvc_group_config *gc = &mc->groups[g];
        int64_t pages = 1;
        FUZZ_RES(kvc_pool_page_bytes(&gc->pool, &pb), KVC_OK);
        if (gc->cache.kind == KVC_KIND_RECURRENT) pages = gc->cache.max_seqs > 0 ? gc->cache.max_seqs : 1;
        if (gc->cache.kind == KVC_KIND_CAUSAL) {
            int32_t pc = gc->pool.page_cells > 0 ? gc->pool.page_cells : 256;
            pages = fm_ceil_div(gc->cache.capacity, pc);
        }
        need += (size_t)pages * pb;
    }
    return need;
}

static void fm_op_config(fm_world *w) {
    kvc_memory_config mc = w->mc;
    kvc_group_config gc[FM_MAXG];
    int32_t map[FM_MAXL];
    unsigned x = fuzz_byte(&w->in);
    int32_t g = fuzz_int(&w->in, 0, w->G - 1), l = fuzz_int(&w->in, 0, w->L - 1);
    int want = KVC_ERR_INVALID, r, rc;
    const char *wf = NULL, *field = (const char *)&field;
    kvc_memory *out = NULL;
    int kv = fm_is_kv(&w->gr[g]);
    memcpy(gc, w->gc, sizeof(gc));
    memcpy(map, w->map, sizeof(map));
    mc.groups = gc;
    mc.layer_group = map;
    switch (x % 17) {
    case 0: want = KVC_OK; break;
    case 1: mc.layer_group = NULL; want = KVC_ERR_NULL; wf = "layer_group"; break;
    case 2: mc.groups = NULL; want = KVC_ERR_NULL; wf = "groups"; break;
    case 3: mc.n_layers = 0; wf = "n_layers"; break;
    case 4: mc.n_groups = x & 0x80 ? 0 : KVC_MAX_GROUPS + 1; wf = "n_groups"; break;
    case 5: mc.runtime.allocator.alloc = NULL; wf = "runtime.allocator"; break;
    case 6: mc.runtime.parallel_for = fm_pfor; mc.runtime.n_workers = 0; wf = "runtime.n_workers"; break;
    case 7: map[l] = x & 0x80 ? -1 : w->G; want = KVC_ERR_RANGE; wf = "layer_group"; break;
    case 8: gc[g].pool.n_layers += x & 0x80 ? 1 : -1; wf = "groups.pool.n_layers"; break;
    case 9: /* a field the memory sets */
        if ((x >> 5) % 4 == 0) gc[g].pool.budget_bytes = 100;
        else if ((x >> 5) % 4 == 1) gc[g].pool.runtime.cpu_disable = KVC_CPU_F16C;
        else if ((x >> 5) % 4 == 2) gc[g].pool.arena_bytes = 64;
        else gc[g].pool.runtime.allocator.free = fm_free;
        wf = "groups.pool";
        break;
    case 10: /* no shape */
        if (kv) gc[g].pool.head_dim_k = 0;
        else gc[g].pool.n_kv_heads = 1;
        wf = "groups.pool";
        break;
    case 11: gc[g].cache.kind = kv ? KVC_KIND_RECURRENT : KVC_KIND_FULL; wf = "groups.cache"; break; /* a kind its pool cannot take */
    case 12: gc[g].cache.kind = (kvc_kind)9; wf = "groups.cache"; break;
    case 13: /* a policy the memory checks itself */
        if (kv) { kvc_cache_config_init(&gc[g].cache, KVC_KIND_CAUSAL); gc[g].cache.capacity = 0; }
        else gc[g].cache.max_seqs = -1;
        wf = "groups.cache";
        break;
    case 14: /* CAUSAL groups are taken (but not fuzzed here) */
        if (!kv) { want = KVC_OK; break; }
        kvc_cache_config_init(&gc[g].cache, KVC_KIND_CAUSAL);
        gc[g].cache.capacity = fuzz_int(&w->in, 1, 24);
        if (fm_min_bytes(&mc) > mc.budget_bytes) wf = "budget_bytes";
        else want = KVC_OK;
        break;
    case 15: { /* below the minimum (0 where the minimum is a few bytes: no wrap-around) */
        size_t need = fm_min_bytes(&mc), less = 1 + (size_t)fuzz_int(&w->in, 0, 7);
        mc.budget_bytes = need > less ? need - less : 0;
        wf = "budget_bytes";
        break;
    }
    default: /* a policy kvc_cache_create refuses */
        /* kvc_memory_config_check checks a group's policy as kvc_cache_create does
           (ROTATING window 0, sinks >= window, a RECURRENT window, a FULL window) */
        if (FM_TOLERATE_KNOWN) return;
        if (gc[g].cache.kind == KVC_KIND_ROTATING) {
            if (x & 0x80) gc[g].cache.window = 0;
            else gc[g].cache.sinks = gc[g].cache.window;
        } else if (gc[g].cache.kind == KVC_KIND_RECURRENT) {
            gc[g].cache.window = 3;
        } else {
            gc[g].cache.window = 2; /* FULL keeps no window (nor reads checkpoints) */
        }
        wf = "groups.cache";
        break;
    }
    fuzz_note("config check mutation %u group %d layer %d, want %d %s", x % 17, g, l, want, wf ? wf : "-");
    r = kvc_memory_config_check(&mc, &field);
    FUZZ_RES(r, want);
    FUZZ_CHECK(wf == NULL ? field == NULL : field != NULL && strcmp(field, wf) == 0, "config check: field %s, want %s",
               field ? field : "(null)", wf ? wf : "(null)");
    rc = kvc_memory_create(&mc, &out); /* answers what the check said */
    FUZZ_CHECK(rc == r, "config check %d but create %d", r, rc);
    if (rc == KVC_OK) FUZZ_RES(kvc_memory_destroy(out), KVC_OK);
    else FUZZ_CHECK(out == NULL, "refused create wrote its output");
}

/* ---- invalid arguments: each refused, nothing changed ---------------------------------------- */
static void fm_op_invalid(fm_world *w, int mi) {
    fm_mem *m = &w->m[mi];
    unsigned x = fuzz_byte(&w->in);
    int32_t l = fuzz_int(&w->in, 0, w->L - 1), off = fm_off(m), at[10], i, t = 0, gl = 0;
    const fm_group *gr = &w->gr[w->map[l]];
    float *st = NULL, buf[FM_NF * FM_BATCH];
    kvc_cache *c = NULL;
    kvc_memory_snapshot *s = NULL;
    kvc_prefix *px = NULL;
    int ok = 0, maxck = 0;
    memset(buf, 0, sizeof(buf));
    memset(at, 0, sizeof(at));
    for (i = 0; i < w->G; ++i)
        if (fm_has_ck(&w->gr[i])) maxck = fuzz_max(maxck, w->gr[i].maxck);
    fuzz_note("invalid arguments %u on memory %d layer %d", x % 24, mi, l);
    switch (x % 24) {
    case 0: FUZZ_RES(kvc_memory_begin(NULL, 1, NULL, 0), KVC_ERR_NULL); break;
    case 1: FUZZ_RES(kvc_memory_begin(m->h, 1, NULL, 1), KVC_ERR_NULL); break;
    case 2: FUZZ_RES(kvc_memory_begin(m->h, 0, NULL, 0), KVC_ERR_INVALID); break;
    case 3: FUZZ_RES(kvc_memory_begin(m->h, 1, at, -1), KVC_ERR_INVALID); break;
    case 4: if (off > 0) FUZZ_RES(kvc_memory_begin(m->h, INT32_MAX - off + 1, NULL, 0), KVC_ERR_RANGE); break;
    case 5: at[0] = x & 0x80 ? off : off + 3; FUZZ_RES(kvc_memory_begin(m->h, 2, at, 1), KVC_ERR_RANGE); break;
    case 6: /* more checkpoints than a group keeps */
        if (maxck == 0 || maxck == FM_CK) break;
        for (i = 0; i < w->G; ++i)
            if (fm_has_ck(&w->gr[i])) maxck = fuzz_min(maxck, w->gr[i].maxck);
        for (i = 0; i <= maxck; ++i) at[i] = off + 1 + i;
        for (i = 0; !fm_has_ck(&w->gr[i]) || w->gr[i].maxck > maxck; ++i) {}
        t = kvc_memory_begin(m->h, maxck + 1, at, maxck + 1);
        /* an earlier group's own pool may be out of pages first (as in fm_batch) */
        if (!(i > 0 && t == KVC_ERR_FULL)) FUZZ_RES(t, KVC_ERR_RANGE);
        break;
    case 7: FUZZ_RES(kvc_memory_put(m->h, l, buf, buf), fm_is_kv(gr) ? KVC_ERR_STATE : KVC_ERR_UNSUPPORTED); break;
    case 8: FUZZ_RES(kvc_memory_put(m->h, x & 0x80 ? -1 : w->L, buf, buf), KVC_ERR_RANGE); break;
    case 9: if (fm_is_kv(gr)) FUZZ_RES(kvc_memory_put(m->h, l, NULL, buf), KVC_ERR_NULL); break;
    case 10: if (fm_is_kv(gr) || !m->grace) FUZZ_RES(kvc_memory_state(m->h, l, 0, &st), fm_is_kv(gr) ? KVC_ERR_UNSUPPORTED : KVC_ERR_STATE); break;
    case 11: if (!fm_is_kv(gr)) FUZZ_RES(kvc_memory_state(m->h, l, 1, &st), KVC_ERR_RANGE); break;
    case 12: FUZZ_RES(kvc_memory_state(m->h, l, 0, NULL), KVC_ERR_NULL); break;
    case 13:
        if (fm_is_kv(gr) || !m->grace)
            FUZZ_RES(kvc_memory_state_checkpoint(m->h, l, off + 1, buf), fm_is_kv(gr) ? KVC_ERR_UNSUPPORTED : KVC_ERR_STATE);
        break;
    case 14: FUZZ_RES(kvc_memory_state_checkpoint(m->h, l, off + 1, NULL), KVC_ERR_NULL); break;
    case 15: FUZZ_RES(kvc_memory_cancel(m->h), KVC_ERR_STATE); break;
    case 16:
        FUZZ_RES(kvc_memory_layer(m->h, x & 0x80 ? -1 : w->L, &c, &gl), KVC_ERR_RANGE);
        FUZZ_RES(kvc_memory_layer(m->h, l, NULL, &gl), KVC_ERR_NULL);
        FUZZ_RES(kvc_memory_group(m->h, x & 0x80 ? -1 : w->G, &c), KVC_ERR_RANGE);
        FUZZ_RES(kvc_memory_group(m->h, 0, NULL), KVC_ERR_NULL);
        break;
    case 17:
        FUZZ_RES(kvc_memory_offset(m->h, NULL), KVC_ERR_NULL);
        FUZZ_RES(kvc_memory_stats_get(m->h, NULL), KVC_ERR_NULL);
        FUZZ_RES(kvc_memory_can_rewind(m->h, 0, NULL), KVC_ERR_NULL);
        FUZZ_RES(kvc_memory_rewind_point(m->h, -1, &t), KVC_ERR_RANGE);
        FUZZ_RES(kvc_memory_rewind_point(m->h, 0, NULL), KVC_ERR_NULL);
        break;
    case 18:
        FUZZ_RES(kvc_memory_trim(NULL, 0), KVC_ERR_NULL);
        FUZZ_RES(kvc_memory_clear(NULL), KVC_ERR_NULL);
        FUZZ_RES(kvc_memory_cancel(NULL), KVC_ERR_NULL);
        FUZZ_RES(kvc_memory_destroy(NULL), KVC_ERR_NULL);
        FUZZ_RES(kvc_memory_snapshot_free(NULL), KVC_OK);
        break;
    case 19:
        FUZZ_RES(kvc_memory_snapshot_take(m->h, 0, off, NULL), KVC_ERR_NULL);
        FUZZ_RES(kvc_memory_snapshot_take(NULL, 0, off, &s), KVC_ERR_NULL);
        FUZZ_RES(kvc_memory_snapshot_take(m->h, 0, x & 0x80 ? -1 : off + 1, &s), KVC_ERR_RANGE);
        break;
    case 20:
        FUZZ_RES(kvc_memory_restore(NULL, NULL, 0), KVC_ERR_NULL);
        FUZZ_RES(kvc_memory_restore(m->h, NULL, -1), KVC_ERR_UNREACHABLE);
        FUZZ_RES(kvc_memory_fork(m->h, NULL), KVC_ERR_NULL);
        FUZZ_RES(kvc_memory_fork(NULL, (kvc_memory **)&c), KVC_ERR_NULL);
        break;
    case 21:
        FUZZ_RES(kvc_prefix_create_memory(NULL, 4, &px), KVC_ERR_NULL);
        FUZZ_RES(kvc_prefix_create_memory(m->h, 4, NULL), KVC_ERR_NULL);
        FUZZ_RES(kvc_prefix_create_memory(m->h, 0, &px), KVC_ERR_INVALID);
        break;
    case 22:
        if (w->px == NULL) break;
        FUZZ_RES(kvc_prefix_begin(w->px, at, -1, &t), KVC_ERR_INVALID);
        if (!w->px_open) FUZZ_RES(kvc_prefix_close(w->px, NULL, 0), KVC_ERR_STATE);
        FUZZ_RES(kvc_prefix_close(w->px, NULL, -1), KVC_ERR_INVALID);
        break;
    default:
        FUZZ_RES(kvc_memory_can_rewind(m->h, off + 1, &ok), KVC_OK);
        FUZZ_CHECK(!ok, "can_rewind past the offset");
        FUZZ_RES(kvc_memory_config_check(NULL, NULL), KVC_ERR_NULL);
        FUZZ_RES(kvc_memory_create(NULL, (kvc_memory **)&c), KVC_ERR_NULL);
        FUZZ_RES(kvc_memory_create(&w->mc, NULL), KVC_ERR_NULL);
        FUZZ_RES(kvc_memory_config_init(NULL), KVC_ERR_NULL);
        {   /* attention itself is kvc_attention's (fuzz_ops): only the layer mapping here */
            kvc_attention_desc d;
            memset(&d, 0, sizeof(d));
            FUZZ_RES(kvc_memory_attention(NULL, 0, &d), KVC_ERR_NULL);
            FUZZ_RES(kvc_memory_attention(m->h, x & 0x80 ? -1 : w->L, &d), KVC_ERR_RANGE);
        }
        break;
    }
}

/* ---- one input ----------------------------------------------------------------------------- */
static void fm_setup(fm_world *w) {
    int32_t l, g, i;
    size_t need = 0, budget;
    w->L = fuzz_int(&w->in, 1, FM_MAXL);
    w->G = fuzz_int(&w->in, 1, fuzz_min(FM_MAXG, w->L));
    for (l = 0; l < w->L; ++l) w->map[l] = l < w->G ? l : (int32_t)(fuzz_byte(&w->in) % (unsigned)w->G);
    for (i = fuzz_int(&w->in, 0, 3); i > 0; --i) { /* a few swaps: any layer order */
        int32_t a = fuzz_int(&w->in, 0, w->L - 1), b = fuzz_int(&w->in, 0, w->L - 1), x = w->map[a];
        w->map[a] = w->map[b];
        w->map[b] = x;
    }
    memset(w->gc, 0, sizeof(w->gc));
    for (g = 0; g < w->G; ++g) {
        fm_group *gr = &w->gr[g];
        kvc_group_config *gc = &w->gc[g];
        unsigned x = fuzz_byte(&w->in);
        memset(gr, 0, sizeof(*gr));
        gr->kind = x % 3 == 0 ? KVC_KIND_FULL : x % 3 == 1 ? KVC_KIND_ROTATING : KVC_KIND_RECURRENT;
        for (l = 0; l < w->L; ++l)
            if (w->map[l] == g) gr->layer[gr->nl++] = l;
        gc->pool.n_layers = gr->nl;
        kvc_cache_config_init(&gc->cache, gr->kind);
        gr->maxck = fuzz_int(&w->in, 0, 4);
        gc->cache.checkpoints = gr->maxck;
        if (gr->maxck == 0) gr->maxck = 8;
        if (gr->kind == KVC_KIND_RECURRENT) {
            gr->nf = fuzz_int(&w->in, 1, FM_NF);
            gc->pool.state_floats = gr->nf;
            gc->cache.max_seqs = (x >> 2) & 1; /* 0 means 1 */
        } else {
            unsigned y = fuzz_byte(&w->in);
            gr->H = fuzz_int(&w->in, 1, 2);
            gr->dk = fuzz_int(&w->in, 1, 4);
            gr->dv = fuzz_int(&w->in, 1, 4);
            gr->pc = fuzz_int(&w->in, 1, 8);
            gr->tk = y & 1 ? KVC_TYPE_F16 : KVC_TYPE_F32;
            gr->tv = y & 2 ? KVC_TYPE_F16 : KVC_TYPE_F32;
            gc->pool.n_kv_heads = gr->H;
            gc->pool.head_dim_k = gr->dk;
            gc->pool.head_dim_v = gr->dv;
            gc->pool.type_k = gr->tk;
            gc->pool.type_v = gr->tv;
            gc->pool.page_cells = gr->pc;
            if (gr->kind == KVC_KIND_ROTATING) {
                gr->W = fuzz_int(&w->in, 2, 9);
                gr->S = fuzz_int(&w->in, 0, fuzz_min(2, gr->W - 1));
                gc->cache.window = gr->W;
                gc->cache.sinks = gr->S;
            }
        }
        FUZZ_RES(kvc_pool_page_bytes(&gc->pool, &gr->pb), KVC_OK);
        need += gr->pb;
    }
    budget = need;
    for (g = 0; g < w->G; ++g) budget += (size_t)fuzz_int(&w->in, 0, 15) * w->gr[g].pb;
    budget += (size_t)fuzz_int(&w->in, 0, 63);
    kvc_memory_config_init(&w->mc);
    w->mc.n_layers = w->L;
    w->mc.layer_group = w->map;
    w->mc.n_groups = w->G;
    w->mc.groups = w->gc;
    w->mc.budget_bytes = budget;
    w->mc.runtime.allocator.alloc = fm_alloc;
    w->mc.runtime.allocator.free = fm_free;
    {
        const char *field = (const char *)&field;
        FUZZ_RES(kvc_memory_config_check(&w->mc, &field), KVC_OK);
        FUZZ_CHECK(field == NULL, "valid config: field %s", field);
    }
    {
        char desc[FUZZ_LOG_WIDTH];
        int n = 0;
        for (g = 0; g < w->G && n < (int)sizeof(desc) - 40; ++g)
            n += snprintf(desc + n, sizeof(desc) - (size_t)n, " [%d: %d layers %s W%d S%d pc%d ck%d nf%d]", g,
                          w->gr[g].nl, w->gr[g].kind == KVC_KIND_FULL ? "full" : w->gr[g].kind == KVC_KIND_ROTATING ? "rot" : "rec",
                          w->gr[g].W, w->gr[g].S, w->gr[g].pc, w->gr[g].maxck, w->gr[g].nf);
        fuzz_note("model %d layers, budget %zu:%s", w->L, budget, desc);
    }
}

static void fm_teardown(fm_world *w) {
    unsigned order = fuzz_byte(&w->in);
    fm_prefix_drop(w);
    while (w->nm + w->ns > 0) { /* memories and snapshots in any order: the pools go with the last */
        if (w->ns > 0 && (w->nm == 0 || (order & 1))) fm_snap_free(w, (int)(order % (unsigned)w->ns));
        else fm_destroy(w, (int)(order % (unsigned)w->nm));
        order = order >> 1 | (order & 1) << 7;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fm_world *w = &FM_;
    memset(w, 0, sizeof(*w));
    w->in.p = data;
    w->in.n = size;
    fuzz_log_reset();
    fm_live_blocks = 0;
    fm_disarm();
    fm_setup(w);
    fm_create(w);
    for (fuzz_step = 0; fuzz_step < FM_STEPS && w->in.i < w->in.n; ++fuzz_step) {
        unsigned byte = fuzz_byte(&w->in), op = byte % 24;
        int mi;
        if (w->nm == 0) fm_create(w);
        mi = fuzz_int(&w->in, 0, w->nm - 1);
        if (byte >= 240) op = 24; /* (the top 16 bytes: the corpora's older ops keep their meaning) */
        switch (op) {
        case 24: fm_op_direct(w, mi); break; /* calls on a group's cache (issue 35) */
        case 0: case 1: case 2: case 3: case 4: case 5: fm_op_batch(w, mi); break;
        case 6: fm_op_trim(w, mi); break;
        case 7: case 8: fm_op_rewind(w, mi); break;
        case 9: case 10: fm_op_take(w, mi); break;
        case 11: case 12: fm_op_restore(w, mi); break;
        case 13: if (w->ns > 0) fm_snap_free(w, fuzz_int(&w->in, 0, w->ns - 1)); break;
        case 14: fm_op_fork(w, mi); break;
        case 15: fuzz_note("memory %d clear", mi); FUZZ_RES(kvc_memory_clear(w->m[mi].h), KVC_OK); fm_reset(&w->m[mi], w->G); w->m[mi].grace = 0; break;
        case 16: fm_op_prefix_create(w, mi); break;
        case 17: case 18: fm_op_prefix_session(w); break;
        case 19: fm_op_config(w); break;
        case 20: fm_op_invalid(w, mi); break;
        case 21: if (w->nm > 1 || fuzz_byte(&w->in) % 2) fm_destroy(w, mi); break;
        case 22: fm_create(w); break; /* another memory of the configuration: its own pools */
        default: /* the next operation's main call: its k-th allocation refused */
            fm_refuse_next = fuzz_int(&w->in, 0, 15);
            fuzz_note("refuse allocation %ld of the next call", fm_refuse_next);
            continue;
        }
        fm_disarm(); /* an operation without a main call drops it */
        fm_check_all(w);
    }
    fm_teardown(w);
    FUZZ_CHECK(fm_live_blocks == 0, "%ld blocks of the counting allocator still live", fm_live_blocks);
    return 0;
}
