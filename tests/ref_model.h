/* ref_model.h - the plain-array reference of FULL and ROTATING caches that
   tests/test_random.c and fuzz/fuzz_ops.c check kvcache.h against, so that the random
   test and the fuzzer predict the same semantics from one definition.

   A cache is the list of its tokens (a token is a uid chosen by the caller; position t
   holds uid[t]) plus, for ROTATING caches, the first token of the last batch (it sets the
   visible window) and whether a window page was ever released (it makes the window
   "wrapped", like offset > window). A snapshot is a copy of that state with its range
   [from, to). The functions take the cache's kind, window W and sinks S (0 and 0 for
   FULL) and say what kvcache.h must show and answer; they never call the library.

   Include after kvcache.h. The header has a guard and its functions are static inline,
   so several fuzz targets can include it in one translation unit (the fuzz_all.c that
   tests/run.sh generates) and a program that uses only some of them builds warning-free. */
#ifndef KVC_REF_MODEL_H
#define KVC_REF_MODEL_H

#include <string.h>

#define REF_MAX_TOKENS 320 /* tokens one reference history can hold */

typedef struct ref_state {
    int32_t off;                  /* tokens held = next position */
    int32_t bb;                   /* first token of the last batch (ROTATING window anchor) */
    int rel;                      /* ROTATING: a window page was released (until emptied) */
    uint32_t changes;             /* calls that added or replaced tokens (a batch, a restore
                                     from a snapshot): kvc_prefix's generation rule */
    uint32_t uid[REF_MAX_TOKENS]; /* the token at each position [0, off) */
} ref_state;

static inline int32_t ref_min(int32_t a, int32_t b) { return a < b ? a : b; }
static inline int32_t ref_max(int32_t a, int32_t b) { return a > b ? a : b; }

/* The cells a cache shows, in kvc_cache_gather order: their positions (indices into
   st->uid). Returns how many. */
static inline int ref_view(kvc_kind kind, int32_t W, int32_t S, const ref_state *st, int32_t *pos) {
    int n = 0;
    int32_t t;
    if (kind == KVC_KIND_FULL) {
        for (t = 0; t < st->off; ++t) pos[n++] = t;
    } else {
        int32_t s0 = ref_min(S, st->off), lo = ref_max(S, st->bb - (W - S) + 1);
        for (t = 0; t < s0; ++t) pos[n++] = t;
        for (t = ref_max(lo, s0); t < st->off; ++t) pos[n++] = t;
    }
    return n;
}

/* Whether a query at position p sees the token at t, with the attention call's window
   and non_causal flag (the documented masks; a ROTATING cache adds its own window). */
static inline int ref_visible(kvc_kind kind, int32_t W, int32_t S, int non_causal, int32_t window, int32_t t, int32_t p) {
    if (!non_causal && t > p) return 0;
    if (window > 0 && t <= p - window) return 0;
    if (kind == KVC_KIND_ROTATING && t >= S && t <= p - (W - S)) return 0;
    return 1;
}

/* trim / live restore to target tokens: what remains reads as a batch of one */
static inline void ref_rewind(ref_state *st, int32_t target) {
    st->off = target;
    st->bb = target > 0 ? target - 1 : 0;
    if (target == 0) st->rel = 0;
}

/* ROTATING: the window has wrapped (no trim, no live rewind, no clamped restore) once it
   held more than W tokens or released a page: a kvc_cancel can bring the offset back to
   W or less after kvc_begin released pages. */
static inline int ref_wrapped(kvc_kind kind, int32_t W, const ref_state *st) {
    return kind == KVC_KIND_ROTATING && (st->off > W || st->rel);
}

/* Whether kvc_begin at offset o releases a window page: the first window page (logical
   page ceil(S/page_cells), held since nothing was released yet) lies wholly before the
   oldest token the batch's first query may see, o - (W - S) + 1. */
static inline int ref_begin_releases(kvc_kind kind, int32_t W, int32_t S, int32_t page_cells, int32_t o) {
    int32_t nsp = (S + page_cells - 1) / page_cells;
    return kind == KVC_KIND_ROTATING && o > nsp * page_cells && (nsp + 1) * page_cells <= o - (W - S) + 1;
}

/* kvc_begin(n) succeeded on a cache in state st: the state once the batch of tokens
   uids[0..n) is put in every layer. */
static inline void ref_begin(kvc_kind kind, int32_t W, int32_t S, int32_t page_cells, const ref_state *st,
                      const uint32_t *uids, int32_t n, ref_state *after) {
    int32_t o = st->off, i;
    *after = *st;
    for (i = 0; i < n; ++i) after->uid[o + i] = uids[i];
    after->off = o + n;
    after->bb = o;
    after->changes = st->changes + 1;
    if (ref_begin_releases(kind, W, S, page_cells, o)) after->rel = 1;
}

/* kvc_cancel of the batch that took st to after: the offset stays, the cancelled batch's
   start anchors the window, and what kvc_begin released stays released. */
static inline void ref_cancel(ref_state *st, const ref_state *after) {
    st->changes = after->changes; /* kvc_begin counted as a change */
    st->bb = st->off;
    st->rel = st->off > 0 && after->rel;
}

/* What kvc_cache_trim(n) answers. */
static inline kvc_result ref_trim_expect(kvc_kind kind, int32_t W, const ref_state *st, int32_t n) {
    if (n < 0 || n > st->off) return KVC_ERR_RANGE;
    if (n == 0 || !ref_wrapped(kind, W, st) || n == st->off) return KVC_OK; /* by 0: nothing; to 0: clearing */
    return KVC_ERR_UNREACHABLE;
}
/* kvc_cache_trim(n) succeeded: by 0 nothing changes (no re-anchoring at the offset) */
static inline void ref_trim(ref_state *st, int32_t n) {
    if (n > 0) ref_rewind(st, st->off - n);
}

/* What kvc_cache_restore(cache, NULL, target) answers; ref_live_restore applies it. */
static inline kvc_result ref_live_restore_expect(kvc_kind kind, int32_t W, const ref_state *st, int32_t target) {
    if (target < 0 || target > st->off) return KVC_ERR_UNREACHABLE;
    if (kind == KVC_KIND_ROTATING && target == st->off) return KVC_OK; /* nothing to do */
    if (ref_wrapped(kind, W, st) && target > 0) return KVC_ERR_UNREACHABLE; /* 0: clearing */
    return KVC_OK;
}
static inline void ref_live_restore(kvc_kind kind, ref_state *st, int32_t target) {
    if (!(kind == KVC_KIND_ROTATING && target == st->off)) ref_rewind(st, target);
}

/* kvc_snapshot_take(from) on a cache in state st: the snapshot's start, and whether it
   holds anything (the library answers a NULL snapshot when not). */
static inline int32_t ref_take_from(kvc_kind kind, int32_t from) { return kind == KVC_KIND_FULL ? ref_max(from, 0) : from; }
static inline int ref_take_holds(kvc_kind kind, const ref_state *st, int32_t from) {
    return st->off > 0 && st->off > ref_take_from(kind, from);
}

/* What kvc_cache_restore(cache, snapshot [from, to) with state snap, target) answers when the
   snapshot is the cache's own (a foreign one is KVC_ERR_FOREIGN first). */
static inline kvc_result ref_restore_expect(kvc_kind kind, int32_t W, const ref_state *st, int32_t from, int32_t to,
                                     const ref_state *snap, int32_t target) {
    if (target < 0 || target > to) return KVC_ERR_UNREACHABLE;
    if (kind == KVC_KIND_FULL) return st->off < from ? KVC_ERR_UNREACHABLE : KVC_OK;
    return (target < to && (to > W || snap->rel)) ? KVC_ERR_UNREACHABLE : KVC_OK;
}
/* its effect on the cache's state st (a FULL cache keeps its tokens before from) */
static inline void ref_restore(kvc_kind kind, int32_t from, int32_t to, const ref_state *snap, int32_t target, ref_state *st) {
    uint32_t changes = st->changes;
    if (kind == KVC_KIND_FULL) {
        if (target > from) memcpy(st->uid + from, snap->uid + from, sizeof(uint32_t) * (size_t)(target - from));
        st->changes++; /* a restore from a snapshot counts as a change, even to an earlier offset */
        ref_rewind(st, target);
    } else {
        *st = *snap;
        st->changes = changes + 1;
        if (target < to) ref_rewind(st, target);
    }
}

/* FULL: kvc_snapshot_merge of adjacent snapshots parent [pfrom, pto) and child
   [pto, cto): the merged state, [pfrom, cto) (out may be the parent). */
static inline void ref_merge_full(const ref_state *parent, int32_t pfrom, int32_t pto, const ref_state *child, int32_t cto,
                           ref_state *out) {
    if (out != parent) {
        memset(out, 0, sizeof(*out));
        memcpy(out->uid + pfrom, parent->uid + pfrom, sizeof(uint32_t) * (size_t)(pto - pfrom));
    }
    memcpy(out->uid + pto, child->uid + pto, sizeof(uint32_t) * (size_t)(cto - pto));
    out->off = cto;
}

#endif /* KVC_REF_MODEL_H */
