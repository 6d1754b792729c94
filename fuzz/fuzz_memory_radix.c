/* fuzz/fuzz_memory_radix.c - libFuzzer target: the radix prefix tree over a model memory
   (kvc_radix_create_memory and the _memory calls), driven by operation sequences decoded
   from the input bytes, checked against a reference list of what was committed.

   The first bytes choose the memory: any non-empty mix of a RECURRENT group (1-2 layers),
   a ROTATING group (window 2-9 keys, 0..W-1 sinks, 1-4 cells per page) and a FULL group
   (1-4 cells per page), f16 or f32, a roomy budget or a tight one (so that kvc_memory_begin
   evicts), max_entries 0-2, and an alphabet of 2-4 token ids. Every later byte starts an
   operation: a request into one of 4 memory slots (a lookup of a prompt that continues
   or branches off something committed, under one of 2 namespaces; the rest evaluated in
   one or two batches with 0-3 checkpoints; sometimes a rollback to a checkpoint; a
   commit of all, fewer or more tokens at a priority 0-2, or none), a commit of fewer
   tokens from a live slot, release / destroy, pin / unpin, kvc_radix_evict, a memory
   that takes budget (pressure), an entry saved and loaded back, and bad calls. An
   operation byte of 203, 215, 227, 239 or 251 arms the allocator to refuse the k-th
   allocation of the next call of one kind (lookup, begin, commit, load or fork, and k
   from the next byte); that call must fail with KVC_ERR_NO_MEMORY and change nothing:
   the tree's nodes, pages, evictions and counters are compared around it, and the
   memories are checked as after every operation. At the end no block may be left.

   The reference: every committed prefix that must carry the states of the RECURRENT group
   (the commit's end and its checkpoints) and every committed token sequence. While
   nothing was evicted it predicts every lookup's reused length exactly: with a RECURRENT
   group the longest committed state point that is a prefix of tokens[0 .. n-1); a FULL
   group alone, the longest committed prefix; a ROTATING group without a RECURRENT one is
   bounded by that (its window's pages may be gone). After an eviction the prediction is
   an upper bound. Always, after every operation, every live memory must hold exactly
   what evaluating its tokens gives: the RECURRENT state, every visible key of the
   attention groups, whose values are a function of the namespace and the whole prefix
   tokens[0..p]. A failure prints the last steps and aborts. */
#define KVCACHE_IMPLEMENTATION
#include "../kvcache.h"
#include "fuzz_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FMR_MAXT 48     /* tokens of a slot */
#define FMR_SLOTS 4
#define FMR_REFS 96     /* committed sequences the reference keeps (then: bounds only) */
#define FMR_STEPS 160
#define FMR_NS_FLOATS 3
#define FMR_DIM 2

typedef struct fmr_ref {
    int ns;
    int32_t n, tok[FMR_MAXT];
    unsigned char state[FMR_MAXT + 1];
} fmr_ref;

typedef struct fmr_slot {
    kvc_memory *m;      /* NULL: free */
    int ns;
    int32_t n;          /* tokens the memory holds */
    int32_t tok[FMR_MAXT];
    int32_t ck[8];      /* checkpoints of its last batches (rollback targets) */
    int32_t n_ck;
} fmr_slot;

typedef struct fmr_world {
    fuzz_in in;
    kvc_memory *m0;     /* the template: empty; its stats show the budget */
    kvc_radix *t;
    int rec, rot, full; /* group index, or -1 */
    int32_t n_groups, layers[3], W, S, alphabet, R; /* R: the RECURRENT / ROTATING groups' reserve */
    int approx;         /* something was evicted, or the reference is full: bounds only */
    fmr_ref ref[FMR_REFS];
    int32_t n_ref;
    fmr_slot s[FMR_SLOTS];
    kvc_memory *hog;
} fmr_world;

static fmr_world fmr_the_world;

/* ---- memory: a counting allocator that can refuse one allocation of one call ----------- */
enum { FMR_LOOKUP, FMR_BEGIN, FMR_COMMIT, FMR_LOAD, FMR_FORK, FMR_CALLS };
static const char *const fmr_call_name[FMR_CALLS] = {"lookup", "begin", "commit", "load", "fork"};
static long fmr_live;                          /* blocks given out and not yet freed */
static int fmr_arm_call = -1;                  /* armed: the next call of this kind ... */
static long fmr_arm_k = -1;                    /* ... has its k-th allocation refused */
static long fmr_refuse_at = -1, fmr_seen;
static int fmr_refused;
static void *fmr_alloc(size_t n, void *user) {
    void *p;
    (void)user;
    if (fmr_refuse_at >= 0 && fmr_seen++ == fmr_refuse_at) {
        fmr_refused = 1;
        return NULL;
    }
    p = malloc(n);
    if (p) fmr_live++;
    return p;
}
static void fmr_free(void *p, void *user) {
    (void)user;
    if (p) fmr_live--;
    free(p);
}
/* before a call of kind `call`: the armed refusal applies if it is for this kind */
static void fmr_arm(int call) {
    if (call != fmr_arm_call) return;
    fmr_refuse_at = fmr_arm_k;
    fmr_seen = 0;
    fmr_refused = 0;
    fmr_arm_call = -1;
}
/* after it: 1 when it had an allocation refused (KVC_ERR_NO_MEMORY is then its answer) */
static int fmr_disarm(void) {
    int refused = fmr_refused;
    fmr_refuse_at = -1;
    fmr_refused = 0;
    return refused;
}
static const kvc_namespace fmr_ns[2] = {{11, 0}, {11, 1}};

/* ---- the toy model -------------------------------------------------------------------- */
static uint32_t fmr_hash(int ns, const int32_t *tok, int32_t p) { /* of tokens[0..p] */
    uint32_t h = 2166136261u ^ (uint32_t)(ns + 1) * 0x9e3779b9u;
    int32_t i;
    for (i = 0; i <= p; ++i) h = (h ^ (uint32_t)tok[i]) * 16777619u;
    return h;
}
static float fmr_kval(uint32_t h, int32_t layer, int32_t d) { /* exact in f16 */
    return (float)((int32_t)((h >> (d * 5 + layer * 3)) % 61u) - 30);
}
static void fmr_step(float *st, int32_t token, int32_t layer) {
    int32_t i;
    for (i = 0; i < FMR_NS_FLOATS; ++i) st[i] = st[i] * 0.5f + (float)((token * 5 + i + layer * 7) % 9 - 4);
}

/* ---- helpers -------------------------------------------------------------------------- */
static kvc_radix_stats fmr_stats(fmr_world *w) {
    kvc_radix_stats s;
    memset(&s, 0, sizeof(s));
    FUZZ_RES(kvc_radix_stats_get(w->t, &s), KVC_OK);
    return s;
}

/* a call refused for want of memory left the tree as it was */
static void fmr_tree_same(fmr_world *w, const kvc_radix_stats *before, const char *call) {
    kvc_radix_stats now = fmr_stats(w);
    fuzz_note("%s refused an allocation", call);
    FUZZ_CHECK(now.n_nodes == before->n_nodes && now.n_pages == before->n_pages && now.n_states == before->n_states &&
                   now.entries_evicted == before->entries_evicted && now.lookups == before->lookups &&
                   now.commits == before->commits && now.n_in_use == before->n_in_use && now.n_pinned == before->n_pinned,
               "%s refused an allocation and changed the tree: nodes %d -> %d, pages %d -> %d, evicted %llu -> %llu",
               call, before->n_nodes, now.n_nodes, before->n_pages, now.n_pages,
               (unsigned long long)before->entries_evicted, (unsigned long long)now.entries_evicted);
}

static void fmr_note_evictions(fmr_world *w) {
    if (fmr_stats(w).entries_evicted > 0 && !w->approx) {
        fuzz_note("evictions: predictions are bounds from here on");
        w->approx = 1;
    }
}

/* the memory holds exactly tokens[0, n) of namespace ns */
static void fmr_check_holds(fmr_world *w, kvc_memory *m, int ns, const int32_t *tok, int32_t n) {
    int32_t off = -1, l, t, d, i;
    FUZZ_RES(kvc_memory_offset(m, &off), KVC_OK);
    FUZZ_CHECK(off == n, "memory offset %d, wanted %d", off, n);
    for (l = 0; l < w->n_groups * 2; ++l) {
        kvc_cache *c = NULL;
        int32_t gl = -1;
        if (kvc_memory_layer(m, l, &c, &gl) != KVC_OK) break; /* past the last layer */
        {
            int32_t group = -1, k;
            for (k = 0; k < w->n_groups; ++k) {
                kvc_cache *gc = NULL;
                FUZZ_RES(kvc_memory_group(m, k, &gc), KVC_OK);
                if (gc == c) group = k;
            }
            if (group == w->rec) {
                const float *st = NULL;
                float want[FMR_NS_FLOATS];
                memset(want, 0, sizeof(want));
                for (t = 0; t < n; ++t) fmr_step(want, tok[t], gl);
                FUZZ_RES(kvc_state_read(c, 0, gl, &st), KVC_OK);
                for (i = 0; i < FMR_NS_FLOATS; ++i)
                    FUZZ_CHECK((st ? st[i] : 0.0f) == want[i], "layer %d state[%d] %g, wanted %g", l, i,
                               (double)(st ? st[i] : 0.0f), (double)want[i]);
            } else {
                float k1[(FMR_MAXT + 8) * FMR_DIM];
                int32_t pos[FMR_MAXT + 8], cells = 0;
                unsigned char seen[FMR_MAXT + 8];
                FUZZ_RES(kvc_cache_gather(c, gl, k1, NULL, pos, FMR_MAXT + 8, &cells), KVC_OK);
                memset(seen, 0, sizeof(seen));
                for (t = 0; t < cells; ++t) {
                    uint32_t h;
                    FUZZ_CHECK(pos[t] >= 0 && pos[t] < n, "layer %d cell at position %d of %d", l, pos[t], n);
                    seen[pos[t]] = 1;
                    h = fmr_hash(ns, tok, pos[t]);
                    for (d = 0; d < FMR_DIM; ++d)
                        FUZZ_CHECK(k1[t * FMR_DIM + d] == fmr_kval(h, gl, d), "layer %d position %d: K %g, wanted %g",
                                   l, pos[t], (double)k1[t * FMR_DIM + d], (double)fmr_kval(h, gl, d));
                }
                for (t = 0; t < n; ++t) {
                    int needed = group == w->full || t < w->S || t > n - w->W + w->S;
                    FUZZ_CHECK(!needed || seen[t], "layer %d misses position %d of %d", l, t, n);
                }
            }
        }
    }
}

/* a forward pass over tok[off, off + n) with checkpoints at[] */
static kvc_result fmr_feed(fmr_world *w, kvc_memory *m, int ns, const int32_t *tok, int32_t off, int32_t n,
                           const int32_t *at, int32_t n_at) {
    int32_t l, t, d, k;
    float kv[FMR_MAXT * FMR_DIM];
    kvc_radix_stats before = fmr_stats(w);
    kvc_result r;
    fmr_arm(FMR_BEGIN);
    r = kvc_memory_begin(m, n, at, n_at);
    if (fmr_disarm() && r == KVC_ERR_NO_MEMORY) fmr_tree_same(w, &before, "begin");
    else FUZZ_CHECK(r != KVC_ERR_NO_MEMORY, "begin: KVC_ERR_NO_MEMORY with no allocation refused");
    if (r != KVC_OK) return r;
    for (l = 0; l < w->n_groups * 2; ++l) {
        kvc_cache *c = NULL, *rc = NULL;
        int32_t gl = -1;
        if (kvc_memory_layer(m, l, &c, &gl) != KVC_OK) break;
        if (w->rec >= 0) FUZZ_RES(kvc_memory_group(m, w->rec, &rc), KVC_OK);
        if (c == rc) {
            float *st = NULL;
            FUZZ_RES(kvc_memory_state(m, l, 0, &st), KVC_OK);
            for (t = off, k = 0; t < off + n; ++t) {
                fmr_step(st, tok[t], gl);
                if (k < n_at && at[k] == t + 1) {
                    FUZZ_RES(kvc_memory_state_checkpoint(m, l, t + 1, st), KVC_OK);
                    k++;
                } else if (w->R > 0 && t + 1 < off + n) { /* the reserve's: KVC_ERR_NOT_FOUND if not asked */
                    r = kvc_memory_state_checkpoint(m, l, t + 1, st);
                    FUZZ_CHECK(r == KVC_OK || r == KVC_ERR_NOT_FOUND, "reserve checkpoint %d: %d", t + 1, (int)r);
                }
            }
        } else {
            for (t = 0; t < n; ++t)
                for (d = 0; d < FMR_DIM; ++d) kv[t * FMR_DIM + d] = fmr_kval(fmr_hash(ns, tok, off + t), gl, d);
            FUZZ_RES(kvc_memory_put(m, l, kv, kv), KVC_OK);
        }
    }
    return KVC_OK;
}

/* what a lookup of tok[0, n) under ns must reuse (exact unless approx or only a bound) */
static int32_t fmr_predict(const fmr_world *w, int ns, const int32_t *tok, int32_t n) {
    int32_t best = 0, i, b;
    for (i = 0; i < w->n_ref; ++i) {
        const fmr_ref *r = &w->ref[i];
        if (r->ns != ns) continue;
        for (b = 1; b <= r->n && b <= n - 1; ++b) {
            if (r->tok[b - 1] != tok[b - 1]) break;
            if ((w->rec < 0 || r->state[b]) && b > best) best = b;
        }
    }
    return best;
}
static int fmr_exact(const fmr_world *w) { return !w->approx && (w->rec >= 0 || w->rot < 0); }

/* the tree holds tok[0, n) (pins need the tokens, not the states) */
static int fmr_held(const fmr_world *w, int ns, const int32_t *tok, int32_t n) {
    int32_t i, b;
    for (i = 0; i < w->n_ref; ++i) {
        const fmr_ref *r = &w->ref[i];
        if (r->ns != ns || r->n < n) continue;
        for (b = 0; b < n && r->tok[b] == tok[b]; ++b) {}
        if (b == n) return 1;
    }
    return 0;
}

static void fmr_record(fmr_world *w, const fmr_slot *s, int32_t n) {
    fmr_ref *r;
    int32_t i;
    if (n <= 0) return;
    if (w->n_ref == FMR_REFS) { w->approx = 1; return; }
    r = &w->ref[w->n_ref++];
    memset(r, 0, sizeof(*r));
    r->ns = s->ns;
    r->n = n;
    memcpy(r->tok, s->tok, sizeof(int32_t) * (size_t)n);
    if (n == s->n) r->state[n] = 1; /* the live state, else a checkpoint's */
    for (i = 0; i < s->n_ck; ++i)
        if (s->ck[i] <= n) r->state[s->ck[i]] = 1;
}

static void fmr_drop(fmr_world *w, int i) {
    if (w->s[i].m != NULL) FUZZ_RES(kvc_memory_destroy(w->s[i].m), KVC_OK);
    memset(&w->s[i], 0, sizeof(w->s[i]));
}

/* ---- operations ----------------------------------------------------------------------- */

static void fmr_commit(fmr_world *w, int i, int32_t n, int32_t priority) {
    fmr_slot *s = &w->s[i];
    kvc_radix_stats before = fmr_stats(w);
    kvc_result r;
    fuzz_note("commit slot %d: %d of %d tokens, priority %d", i, n, s->n, priority);
    fmr_arm(FMR_COMMIT);
    r = kvc_radix_commit_memory(w->t, fmr_ns[s->ns], s->m, s->tok, n, priority);
    if (fmr_disarm() && r == KVC_ERR_NO_MEMORY) {
        fmr_tree_same(w, &before, "commit");
        return;
    }
    FUZZ_RES(r, KVC_OK);
    fmr_record(w, s, n < s->n ? n : s->n);
}

static void fmr_request(fmr_world *w, int i) {
    fmr_slot *s = &w->s[i];
    int32_t tok[FMR_MAXT], n, keep = 0, k, reused = -1, want, at[3], n_at = 0, mid, o, o_last = 0;
    int ns = fuzz_int(&w->in, 0, 1);
    kvc_memory *m = NULL;
    kvc_result r;
    if (w->n_ref > 0 && fuzz_int(&w->in, 0, 3) != 0) { /* continue or branch off a commit */
        const fmr_ref *e = &w->ref[fuzz_int(&w->in, 0, w->n_ref - 1)];
        ns = fuzz_int(&w->in, 0, 7) == 0 ? 1 - e->ns : e->ns;
        keep = fuzz_int(&w->in, 0, e->n);
        memcpy(tok, e->tok, sizeof(int32_t) * (size_t)keep);
    }
    n = fuzz_min(FMR_MAXT - 4, keep + fuzz_int(&w->in, 0, 16));
    for (k = keep; k < n; ++k) tok[k] = fuzz_int(&w->in, 0, w->alphabet - 1);
    want = fmr_predict(w, ns, tok, n);
    fuzz_note("request slot %d: ns %d, %d tokens (%d kept), predict %d%s", i, ns, n, keep, want,
              fmr_exact(w) ? "" : " at most");
    {
        kvc_radix_stats before = fmr_stats(w);
        fmr_arm(FMR_LOOKUP);
        r = kvc_radix_lookup_memory(w->t, fmr_ns[ns], tok, n, &m, &reused);
        if (fmr_disarm() && r == KVC_ERR_NO_MEMORY) {
            fmr_tree_same(w, &before, "lookup");
            return;
        }
        FUZZ_RES(r, KVC_OK);
    }
    FUZZ_CHECK(reused >= 0 && (n == 0 || reused < n), "reused %d of %d", reused, n);
    if (fmr_exact(w)) FUZZ_CHECK(reused == want, "reused %d, predicted %d", reused, want);
    else FUZZ_CHECK(reused <= want || w->n_ref == FMR_REFS, "reused %d, at most %d", reused, want);
    fmr_drop(w, i);
    s->m = m;
    s->ns = ns;
    s->n = reused;
    memcpy(s->tok, tok, sizeof(int32_t) * (size_t)n);
    fmr_check_holds(w, m, ns, tok, reused);
    /* the rest in one or two batches, with checkpoints */
    o = reused;
    mid = n > o + 1 && fuzz_int(&w->in, 0, 1) ? fuzz_int(&w->in, o + 1, n - 1) : n;
    while (o < n) {
        o_last = o;
        int32_t end = o < mid ? mid : n, a;
        n_at = 0;
        for (k = 0; k < 3; ++k) {
            a = fuzz_int(&w->in, o + 1, end);
            if (fuzz_int(&w->in, 0, 1) && (n_at == 0 || a > at[n_at - 1])) at[n_at++] = a;
        }
        fuzz_note("evaluate [%d, %d), %d checkpoints", o, end, n_at);
        r = fmr_feed(w, m, ns, tok, o, end - o, at, n_at);
        if (r == KVC_ERR_FULL || r == KVC_ERR_NO_MEMORY) { /* FULL even after eviction: the budget is
                                                               taken by live memories; or refused */
            fmr_note_evictions(w);
            fmr_check_holds(w, m, ns, tok, o);
            return;
        }
        FUZZ_RES(r, KVC_OK);
        for (k = 0; k < n_at && s->n_ck < 8; ++k) s->ck[s->n_ck++] = at[k];
        o = end;
        s->n = o;
        fmr_note_evictions(w);
    }
    fmr_check_holds(w, m, ns, tok, n);
    /* a rollback to one of the checkpoints, or by up to R tokens (speculative decoding's
       rejected drafts, through the reserve) */
    if ((s->n_ck > 0 || w->R > 0) && fuzz_int(&w->in, 0, 3) == 0) {
        int32_t target = s->n_ck > 0 && fuzz_int(&w->in, 0, 1) ? s->ck[fuzz_int(&w->in, 0, s->n_ck - 1)]
                                                             : s->n - fuzz_int(&w->in, 0, w->R);
        target = fuzz_max(target, reused);
        int can = 0;
        FUZZ_RES(kvc_memory_can_rewind(m, target, &can), KVC_OK);
        fuzz_note("rollback slot %d to %d (can %d)", i, target, can);
        /* within the reserve of the last batch's end, every group must reach it */
        if (w->R > 0 && target >= s->n - w->R && target > o_last) FUZZ_CHECK(can, "reserve rollback refused");
        if (can) {
            FUZZ_RES(kvc_memory_trim(m, s->n - target), KVC_OK);
            s->n = target;
            for (k = 0; k < s->n_ck && s->ck[k] < target; ++k) {}
            s->n_ck = k;
            fmr_check_holds(w, m, ns, tok, target);
        }
    }
    k = fuzz_int(&w->in, 0, 4);
    if (k < 3) fmr_commit(w, i, s->n, k);
    else if (k == 3) fmr_commit(w, i, s->n + fuzz_int(&w->in, 0, 3), 0); /* more than it holds */
}

static void fmr_pin(fmr_world *w, int unpin) {
    const fmr_ref *e;
    int32_t n;
    kvc_result r, want;
    if (w->n_ref == 0) return;
    e = &w->ref[fuzz_int(&w->in, 0, w->n_ref - 1)];
    n = fuzz_int(&w->in, 1, e->n);
    fuzz_note("%s ns %d, %d tokens", unpin ? "unpin" : "pin", e->ns, n);
    r = unpin ? kvc_radix_unpin(w->t, fmr_ns[e->ns], e->tok, n) : kvc_radix_pin(w->t, fmr_ns[e->ns], e->tok, n);
    if (unpin) {
        FUZZ_CHECK(r == KVC_OK || r == KVC_ERR_NOT_FOUND, "unpin returned %d", (int)r);
        return;
    }
    want = w->approx || fmr_held(w, e->ns, e->tok, n) ? KVC_OK : KVC_ERR_NOT_FOUND;
    if (w->approx) FUZZ_CHECK(r == KVC_OK || r == KVC_ERR_NOT_FOUND, "pin returned %d", (int)r);
    else FUZZ_RES(r, want);
}

static void fmr_save_load(fmr_world *w) {
    const fmr_ref *e;
    kvc_mem mm;
    kvc_io io;
    int32_t n, got = -1;
    kvc_result r;
    kvc_radix_stats before;
    if (w->n_ref == 0) return;
    e = &w->ref[fuzz_int(&w->in, 0, w->n_ref - 1)];
    n = e->n;
    fuzz_note("save and load ns %d, %d tokens", e->ns, n);
    memset(&mm, 0, sizeof(mm));
    kvc_io_memory(&mm, &io);
    r = kvc_radix_save(w->t, fmr_ns[e->ns], e->tok, n, &io);
    if (!w->approx && w->rec >= 0 && e->state[n]) FUZZ_RES(r, KVC_OK);
    if (r != KVC_OK) {
        FUZZ_CHECK(r == KVC_ERR_NOT_FOUND, "save returned %d", (int)r);
        return;
    }
    mm.data = (unsigned char *)malloc(mm.size);
    mm.capacity = mm.size;
    mm.size = 0;
    kvc_io_memory(&mm, &io);
    FUZZ_RES(kvc_radix_save(w->t, fmr_ns[e->ns], e->tok, n, &io), KVC_OK);
    kvc_io_memory(&mm, &io);
    before = fmr_stats(w);
    fmr_arm(FMR_LOAD);
    r = kvc_radix_load(w->t, fmr_ns[e->ns], &io, 0, &got);
    free(mm.data);
    if (fmr_disarm() && r == KVC_ERR_NO_MEMORY) {
        fmr_tree_same(w, &before, "load");
        return;
    }
    if (r == KVC_ERR_FULL) return; /* staging needs pages beside the tree's */
    FUZZ_RES(r, KVC_OK);
    FUZZ_CHECK(got == n, "loaded %d tokens of %d", got, n);
}

static void fmr_hog(fmr_world *w) {
    int32_t tok[16], k, n = fuzz_int(&w->in, 1, 16);
    kvc_result r;
    if (w->hog != NULL) {
        fuzz_note("hog let go");
        FUZZ_RES(kvc_memory_destroy(w->hog), KVC_OK);
        w->hog = NULL;
        return;
    }
    fmr_arm(FMR_FORK);
    r = kvc_memory_fork(w->m0, &w->hog);
    if (fmr_disarm() && r == KVC_ERR_NO_MEMORY) {
        fuzz_note("fork refused an allocation");
        w->hog = NULL;
        return;
    }
    FUZZ_RES(r, KVC_OK);
    for (k = 0; k < n; ++k) tok[k] = 100 + k;
    fuzz_note("hog of %d tokens", n);
    if (fmr_feed(w, w->hog, 0, tok, 0, n, NULL, 0) != KVC_OK) {
        FUZZ_RES(kvc_memory_destroy(w->hog), KVC_OK);
        w->hog = NULL;
    }
    fmr_note_evictions(w);
}

static void fmr_bad(fmr_world *w) {
    int32_t tok[2] = {0, 1}, reused = -1;
    kvc_memory *m = NULL;
    kvc_radix_stats before = fmr_stats(w), after;
    int k = fuzz_int(&w->in, 0, 4);
    fuzz_note("bad call %d", k);
    if (k == 0) FUZZ_RES(kvc_radix_lookup_memory(w->t, fmr_ns[0], tok, -1, &m, &reused), KVC_ERR_INVALID);
    if (k == 1) FUZZ_RES(kvc_radix_lookup_memory(w->t, fmr_ns[0], NULL, 2, &m, &reused), KVC_ERR_NULL);
    if (k == 2) FUZZ_RES(kvc_radix_commit_memory(w->t, fmr_ns[0], w->m0, tok, -1, 0), KVC_ERR_INVALID);
    if (k == 3) FUZZ_RES(kvc_radix_lookup(w->t, fmr_ns[0], tok, 2, (kvc_cache **)&m, &reused), KVC_ERR_UNSUPPORTED);
    if (k == 4) FUZZ_RES(kvc_radix_evict(w->t, -1, NULL), KVC_ERR_INVALID);
    FUZZ_CHECK(m == NULL, "a refused call gave a memory");
    after = fmr_stats(w);
    FUZZ_CHECK(after.n_nodes == before.n_nodes && after.n_pages == before.n_pages &&
                   after.lookups == before.lookups && after.commits == before.commits,
               "a refused call changed the tree");
}

/* ---- direct calls on a group's cache (issue 35) -------------------------------------------
   A slot's memory hands a group's cache out (kvc_memory_group). With two or more groups a
   call that would change it alone is refused (KVC_ERR_OWNED) and the memory keeps what it
   held (fmr_op checks every slot after this); kvc_cache_destroy and kvc_cache_fork are
   refused with one group too. With one group its cache is the memory: a trim on it
   succeeds exactly where kvc_memory_can_rewind says, else KVC_ERR_UNREACHABLE. */
static void fmr_direct(fmr_world *w, int i) {
    fmr_slot *s = &w->s[i];
    kvc_cache *c = NULL, *f = NULL;
    int32_t g, o = -1, k, at[1];
    unsigned x;
    int ok = -1;
    kvc_result r;
    if (s->m == NULL) return;
    g = fuzz_int(&w->in, 0, w->n_groups - 1);
    x = fuzz_byte(&w->in);
    k = fuzz_int(&w->in, 1, 4);
    at[0] = s->n + k;
    FUZZ_RES(kvc_memory_group(s->m, g, &c), KVC_OK);
    fuzz_note("slot %d group %d direct call %u (k %d) at %d", i, g, x % 9, k, s->n);
    FUZZ_RES(kvc_cache_offset(c, &o), KVC_OK);
    FUZZ_CHECK(o == s->n, "group %d offset %d, wanted %d", g, o, s->n);
    switch (x % 9) {
    case 0: FUZZ_RES(kvc_cache_destroy(c), KVC_ERR_OWNED); return;
    case 1: FUZZ_RES(kvc_cache_fork(c, &f), KVC_ERR_OWNED); return;
    default: break;
    }
    if (w->n_groups > 1) {
        switch (x % 9) {
        case 2: FUZZ_RES(kvc_cache_trim(c, fuzz_min(k, s->n)), KVC_ERR_OWNED); break;
        case 3: FUZZ_RES(kvc_cache_restore(c, NULL, fuzz_int(&w->in, 0, s->n)), KVC_ERR_OWNED); break;
        case 4: FUZZ_RES(kvc_cache_clear(c), KVC_ERR_OWNED); break;
        case 5: FUZZ_RES(kvc_begin(c, k, NULL, 0), KVC_ERR_OWNED); break;
        case 6: FUZZ_RES(kvc_begin(c, k, at, 1), KVC_ERR_OWNED); break;
        case 7: FUZZ_RES(kvc_cancel(c), KVC_ERR_OWNED); break;
        default: if (s->n > 0) fmr_commit(w, i, s->n, 0); break; /* the memory's own calls still work */
        }
        return;
    }
    if (k > s->n) return;
    FUZZ_RES(kvc_memory_can_rewind(s->m, s->n - k, &ok), KVC_OK);
    r = kvc_cache_trim(c, k);
    FUZZ_CHECK(r == (ok ? KVC_OK : KVC_ERR_UNREACHABLE), "trim of group %d by %d: %d, can_rewind %d", g, k, (int)r, ok);
    if (r != KVC_OK) return;
    s->n -= k;
    while (s->n_ck > 0 && s->ck[s->n_ck - 1] > s->n) s->n_ck--;
}

static void fmr_op(fmr_world *w, unsigned op) {
    int i = fuzz_int(&w->in, 0, FMR_SLOTS - 1);
    switch (op % 12) {
    case 0: case 1: case 2: case 3: fmr_request(w, i); break;
    case 4:
        if (w->s[i].m != NULL && w->s[i].n > 0) fmr_commit(w, i, fuzz_int(&w->in, 1, w->s[i].n), fuzz_int(&w->in, 0, 2));
        break;
    case 5: fuzz_note("release slot %d", i); if (w->s[i].m) FUZZ_RES(kvc_radix_release_memory(w->s[i].m), KVC_OK); break;
    case 6: fuzz_note("destroy slot %d", i); fmr_drop(w, i); break;
    case 7: fmr_pin(w, 0); break;
    case 8: fmr_pin(w, 1); break;
    case 9: {
        int32_t pages = fuzz_int(&w->in, 0, 8), freed = -1;
        fuzz_note("evict %d pages", pages);
        FUZZ_RES(kvc_radix_evict(w->t, pages, &freed), KVC_OK);
        fmr_note_evictions(w);
        break;
    }
    case 10: fmr_hog(w); break;
    default:
        if (op >= 192) { /* a refusal for the next call of one kind */
            fmr_arm_call = (int)(fuzz_byte(&w->in) % FMR_CALLS);
            fmr_arm_k = fuzz_int(&w->in, 0, 15);
            fuzz_note("refuse allocation %ld of the next %s", fmr_arm_k, fmr_call_name[fmr_arm_call]);
            return;
        }
        if ((op & 96) == 96) fmr_direct(w, i); /* calls on a group's cache (issue 35) */
        else if (op & 16) fmr_save_load(w);
        else fmr_bad(w);
        break;
    }
    fmr_note_evictions(w);
    for (i = 0; i < FMR_SLOTS; ++i)
        if (w->s[i].m != NULL) fmr_check_holds(w, w->s[i].m, w->s[i].ns, w->s[i].tok, w->s[i].n);
}

/* ---- setup ------------------------------------------------------------------------------ */

static void fmr_setup(fmr_world *w) {
    kvc_memory_config mc;
    kvc_group_config g[3];
    int32_t map[6], l = 0, k, mask = fuzz_int(&w->in, 1, 7), tight = fuzz_int(&w->in, 0, 1);
    kvc_type type = fuzz_int(&w->in, 0, 1) ? KVC_TYPE_F16 : KVC_TYPE_F32;
    kvc_radix_config rc;
    memset(g, 0, sizeof(g));
    w->rec = w->rot = w->full = -1;
    w->n_groups = 0;
    w->W = 1 << 20;
    w->S = 0;
    if (mask & 1) { /* RECURRENT */
        int32_t gi = w->n_groups++;
        w->rec = gi;
        w->layers[gi] = fuzz_int(&w->in, 1, 2);
        g[gi].pool.n_layers = w->layers[gi];
        g[gi].pool.state_floats = FMR_NS_FLOATS;
        kvc_cache_config_init(&g[gi].cache, KVC_KIND_RECURRENT);
    }
    if (mask & 2) { /* ROTATING */
        int32_t gi = w->n_groups++;
        w->rot = gi;
        w->W = fuzz_int(&w->in, 2, 9);
        w->S = fuzz_int(&w->in, 0, w->W - 1);
        kvc_cache_config_init(&g[gi].cache, KVC_KIND_ROTATING);
        g[gi].cache.window = w->W;
        g[gi].cache.sinks = w->S;
    }
    if (mask & 4) { /* FULL */
        int32_t gi = w->n_groups++;
        w->full = gi;
        kvc_cache_config_init(&g[gi].cache, KVC_KIND_FULL);
    }
    for (k = 0; k < w->n_groups; ++k) {
        if (k == w->rec) continue;
        w->layers[k] = fuzz_int(&w->in, 1, 2);
        g[k].pool.n_layers = w->layers[k];
        g[k].pool.n_kv_heads = 1;
        g[k].pool.head_dim_k = g[k].pool.head_dim_v = FMR_DIM;
        g[k].pool.type_k = g[k].pool.type_v = type;
        g[k].pool.page_cells = fuzz_int(&w->in, 1, 4);
    }
    for (k = 0; k < w->n_groups; ++k) { /* interleaved layers: 0 1 2 0 1 2 ... */
        int32_t j;
        for (j = 0; j < w->layers[k]; ++j) map[l++] = k;
    }
    { /* sort the map so that each group's layers keep their order (any order is valid) */
        int32_t a, b;
        for (a = 1; a < l; ++a)
            for (b = a; b > 0 && fuzz_int(&w->in, 0, 1); --b) {
                int32_t x = map[b];
                map[b] = map[b - 1];
                map[b - 1] = x;
            }
    }
    w->R = fuzz_int(&w->in, 0, 2) == 0 ? fuzz_int(&w->in, 1, 4) : 0;
    for (k = 0; k < w->n_groups; ++k)
        if (k == w->rec || k == w->rot) g[k].cache.reserve = w->R;
    kvc_memory_config_init(&mc);
    mc.n_layers = l;
    mc.layer_group = map;
    mc.n_groups = w->n_groups;
    mc.groups = g;
    mc.budget_bytes = tight ? (size_t)fuzz_int(&w->in, 1, 8) * 1024 : (size_t)1 << 22;
    mc.runtime.allocator.alloc = fmr_alloc;
    mc.runtime.allocator.free = fmr_free;
    w->alphabet = fuzz_int(&w->in, 2, 4);
    if (kvc_memory_create(&mc, &w->m0) != KVC_OK) { /* a budget too small for one of each */
        mc.budget_bytes = (size_t)1 << 22;
        FUZZ_RES(kvc_memory_create(&mc, &w->m0), KVC_OK);
    }
    kvc_radix_config_init(&rc, KVC_KIND_FULL);
    rc.max_entries = fuzz_int(&w->in, 0, 4) == 0 ? fuzz_int(&w->in, 1, 2) : 0;
    FUZZ_RES(kvc_radix_create_memory(w->m0, &rc, &w->t), KVC_OK);
    if (rc.max_entries > 0) w->approx = 1; /* max_entries evicts by rules this reference skips */
    fuzz_note("groups: recurrent %d rotating %d (W %d S %d) full %d, %d layers, reserve %d, budget %zu, max_entries %d",
              w->rec, w->rot, w->W, w->S, w->full, l, w->R, mc.budget_bytes, rc.max_entries);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fmr_world *w = &fmr_the_world;
    kvc_memory_stats ms;
    int i;
    memset(w, 0, sizeof(*w));
    w->in.p = data;
    w->in.n = size;
    fuzz_log_reset();
    fmr_live = 0;
    fmr_arm_call = -1;
    (void)fmr_disarm();
    fmr_setup(w);
    for (fuzz_step = 0; fuzz_step < FMR_STEPS && w->in.i < w->in.n; ++fuzz_step) fmr_op(w, fuzz_byte(&w->in));
    for (i = 0; i < FMR_SLOTS; ++i) fmr_drop(w, i);
    if (w->hog != NULL) FUZZ_RES(kvc_memory_destroy(w->hog), KVC_OK);
    FUZZ_RES(kvc_radix_destroy(w->t), KVC_OK);
    FUZZ_RES(kvc_memory_stats_get(w->m0, &ms), KVC_OK);
    FUZZ_CHECK(ms.bytes_used == 0, "%zu bytes still used after everything was destroyed", ms.bytes_used);
    FUZZ_RES(kvc_memory_destroy(w->m0), KVC_OK);
    FUZZ_CHECK(fmr_live == 0, "%ld blocks of the counting allocator still live", fmr_live);
    return 0;
}
