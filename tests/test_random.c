/* tests/test_random.c - randomized model-based test of kvcache.h (FULL and ROTATING caches,
   snapshots, kvc_prefix).

   Each episode makes a pool with a random configuration (1-3 layers, 1-3 kv heads, K and V
   head sizes 1-9, f32/f16 for K and V independently, 1-7 cells per page, a budget that is
   usually ample and sometimes a few pages, the default allocator, a counting allocator or
   an arena), one or two FULL caches and a ROTATING one (window 1-12, sinks 0..window-1)
   on it, snapshots and a kvc_prefix, and applies 20-220 random operations to them and,
   side by side, to a deliberately simple reference: a cache is the list of its tokens
   (a token is a uid; its K/V values are a function of the uid, small multiples of 1/8,
   exact in f16), plus, for ROTATING caches, the first token of the last batch (it sets
   the visible window) and whether a window page was ever released (it makes the window
   "wrapped", like offset > window). A snapshot is a copy of that reference state.
   Operations: begin + put of every layer (sometimes kvc_cancel midway), trim, live
   rewind, snapshot take / restore (valid and unreachable targets) / merge (adjacent,
   not, NULL sides, foreign) / split / free, fork, destroy, create, clear, and the
   prefix request cycle (begin, evaluate, generate, close).
   After every operation every cache is compared with its reference: offset, cells,
   pages, can_trim, kvc_cache_gather of every layer (values and positions, bit-exact),
   kvc_cache_runs (converted here) and the pool statistics; every few operations
   kvc_attention is compared with a double-precision attention computed from the
   reference tokens with the documented masks. KVC_ERR_FULL must leave everything as it
   was, and only happen when the free pages could really be too few.

   Usage: test_random [seed [episode]]. The random seed (printed first) replays a run; an
   episode number runs only that episode, in this process (for a debugger).
   On POSIX systems the episodes run in forked children (25 per child), so a crash is
   reported as a failure of the episode it happened in (with its replay command and the
   episode's last operations) and the other episodes still run. KVC_RANDOM_NOFORK=1 runs
   everything in one process. KVC_TEST_SCALE scales the number of episodes (3000 at 1). */
#if !defined(_WIN32) && (defined(__unix__) || defined(__unix) || defined(__APPLE__))
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
#define TR_POSIX 1
#else
#define TR_POSIX 0
#endif

#if defined(__SANITIZE_ADDRESS__)
#define TR_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TR_ASAN 1
#endif
#endif
#ifndef TR_ASAN
#define TR_ASAN 0
#endif

#define KVCACHE_IMPLEMENTATION
#include "kvcache.h"
#include "tk.h"
#include "ref_model.h"

#include <signal.h>
#include <stdarg.h>
#include <time.h>
#if TR_POSIX
#include <fcntl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>
#endif

/* ---- limits ------------------------------------------------------------------------ */
#define TR_EPISODES 3000   /* at scale 1 */
#define TR_MAX_L 3
#define TR_MAX_H 3
#define TR_MAX_D 9
#define TR_ROW (TR_MAX_H * TR_MAX_D)
#define TR_MAX_TOK REF_MAX_TOKENS /* tokens one reference history can hold */
#define TR_FULL_CAP 72     /* a FULL cache is not grown past this many tokens */
#define TR_ROT_CAP 300     /* nor a ROTATING one past this */
#define TR_MAX_BATCH 10
#define TR_MAX_CACHES 4
#define TR_MAX_SNAPS 10
#define TR_MAX_PTOK 64     /* prefix: max_tokens and prompt lengths */
#define TR_MAX_Q 4
#define TR_MAX_G 3
#define TR_LOG 40
#define TR_LOGW 120

/* ---- reference model (the state and its rules: ref_model.h) ---------------------- */
typedef struct tr_cache {
    kvc_cache *h;
    kvc_kind kind;
    int32_t W, S;                /* ROTATING window and sinks */
    uint32_t serial;             /* identity: snapshots name the cache they came from */
    ref_state st;
} tr_cache;

typedef struct tr_snap {
    kvc_snapshot *h;
    uint32_t owner;              /* serial of the cache it came from */
    kvc_kind kind;
    int32_t from, to;            /* as kvc_snapshot_info should report them */
    int32_t page_bound;          /* ROTATING: the most pages it may hold */
    int32_t W, S;                /* the window and sinks of the cache it came from */
    ref_state st;                 /* FULL: uid[from, to) meaningful; ROTATING: the whole state */
} tr_snap;

typedef struct tr_prefix {
    kvc_prefix *h;
    int n_c;
    uint32_t serial[TR_MAX_CACHES]; /* the caches it tracks, by serial */
    int32_t max_tokens;
    int32_t tok[TR_MAX_PTOK], n;
    int32_t prompt[TR_MAX_PTOK], n_prompt;
    int open;
    uint32_t changes[TR_MAX_CACHES]; /* the caches' ref changes when tok was recorded */
} tr_prefix;

typedef struct tr_ep {
    tk_rng rng;
    unsigned long long seed;
    int index;
    /* pool */
    int L, H, hk, hv, pc;
    kvc_type tk, tv;
    int mode;                    /* 0 default allocator, 1 counting allocator, 2 arena */
    void *arena;
    kvc_pool *pool;
    int32_t pages_total;
    size_t page_bytes;
    /* objects */
    tr_cache c[TR_MAX_CACHES];
    int nc;
    tr_snap *s[TR_MAX_SNAPS];
    int ns;
    tr_prefix px;
    uint32_t next_serial;
    /* token values: uid -> [L][H][hk] K then [L][H][hv] V */
    float *vals;
    uint32_t n_uid, cap_uid;
    int tok_floats;
    /* bookkeeping */
    int step;
    char log[TR_LOG][TR_LOGW];
    int nlog;
    char sentinel[16];
    /* scratch */
    int32_t view[TR_MAX_TOK];
    float gk[TR_MAX_TOK * TR_ROW], gv[TR_MAX_TOK * TR_ROW];
    int32_t gpos[TR_MAX_TOK];
    float bk[TR_MAX_BATCH * TR_ROW], bv[TR_MAX_BATCH * TR_ROW];
    float row[TR_ROW];
    kvc_run runs[TR_MAX_TOK + 2];
    float q[TR_MAX_Q * TR_MAX_H * TR_MAX_G * TR_MAX_D];
    float out[TR_MAX_Q * TR_MAX_H * TR_MAX_G * TR_MAX_D];
    int32_t qpos[TR_MAX_Q];
} tr_ep;

/* ---- helpers ----------------------------------------------------------------------- */
static long tr_live_allocs; /* the counting allocator's live blocks */
static void *tr_count_alloc(size_t n, void *user) {
    (void)user;
    tr_live_allocs++;
    return malloc(n);
}
static void tr_count_free(void *p, void *user) {
    (void)user;
    if (p != NULL) tr_live_allocs--;
    free(p);
}

static unsigned long long tr_mix(unsigned long long x) { /* splitmix64 */
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}
static uint32_t tr_hash(uint32_t x) {
    x ^= x >> 16; x *= 0x7feb352du; x ^= x >> 15; x *= 0x846ca68bu; x ^= x >> 16;
    return x;
}
static int tr_int(tr_ep *e, int lo, int hi) { return lo > hi ? lo : tk_int(&e->rng, lo, hi); }
static int tr_pct(tr_ep *e, int pct) { return tk_int(&e->rng, 0, 99) < pct; }
static int32_t tr_ceil_div(int32_t a, int32_t b) { return a <= 0 ? 0 : (a + b - 1) / b; }
static int32_t tr_min(int32_t a, int32_t b) { return a < b ? a : b; }
static int32_t tr_max(int32_t a, int32_t b) { return a > b ? a : b; }

static void tr_logf(tr_ep *e, const char *fmt, ...) {
    va_list ap;
    char *dst = e->log[e->nlog % TR_LOG];
    int n = snprintf(dst, TR_LOGW, "step %d: ", e->step);
    va_start(ap, fmt);
    if (n > 0 && n < TR_LOGW) vsnprintf(dst + n, (size_t)(TR_LOGW - n), fmt, ap);
    va_end(ap);
    e->nlog++;
}
/* append to the last entry: operations are logged before the call, results after */
static void tr_loga(tr_ep *e, const char *fmt, ...) {
    va_list ap;
    char *dst = e->log[(e->nlog + TR_LOG - 1) % TR_LOG];
    size_t n = strlen(dst);
    va_start(ap, fmt);
    if (n + 1 < TR_LOGW) vsnprintf(dst + n, TR_LOGW - n, fmt, ap);
    va_end(ap);
}

static float tr_f16_to_f32(uint16_t h) { /* an independent converter for kvc_cache_runs */
    int exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    double v;
    if (exp == 0) v = ldexp((double)mant, -24);
    else if (exp == 31) v = mant ? NAN : INFINITY;
    else v = ldexp((double)(mant | 0x400), exp - 25);
    return (float)((h & 0x8000) ? -v : v);
}

/* A fresh token: its values are small multiples of 1/8, exact in f16. V of layer 0,
   head 0, dim 0 is the uid itself (mod 1025) so consecutive tokens always differ. */
static uint32_t tr_new_uid(tr_ep *e) {
    uint32_t uid = e->n_uid++, x;
    int l, h, d;
    float *dst;
    if (uid >= e->cap_uid) {
        e->cap_uid = e->cap_uid ? e->cap_uid * 2 : 1024;
        e->vals = (float *)realloc(e->vals, sizeof(float) * (size_t)e->cap_uid * (size_t)e->tok_floats);
        if (e->vals == NULL) { fprintf(stderr, "out of memory\n"); exit(2); }
    }
    dst = e->vals + (size_t)uid * (size_t)e->tok_floats;
    for (l = 0; l < e->L; ++l)
        for (h = 0; h < e->H; ++h)
            for (d = 0; d < e->hk; ++d) {
                x = tr_hash(uid * 0x9e3779b1u ^ tr_hash((uint32_t)(l * 4096 + h * 64 + d) + 1u));
                *dst++ = (float)((int)(x % 65u) - 32) / 8.0f; /* K in [-4, 4] */
            }
    for (l = 0; l < e->L; ++l)
        for (h = 0; h < e->H; ++h)
            for (d = 0; d < e->hv; ++d) {
                x = tr_hash(uid * 0x85ebca6bu ^ tr_hash((uint32_t)(l * 4096 + h * 64 + d) + 77u));
                if (l == 0 && h == 0 && d == 0) x = uid;
                *dst++ = (float)((int)(x % 1025u) - 512) / 8.0f; /* V in [-64, 64] */
            }
    return uid;
}
static const float *tr_krow(const tr_ep *e, uint32_t uid, int l) {
    return e->vals + (size_t)uid * (size_t)e->tok_floats + (size_t)l * (size_t)(e->H * e->hk);
}
static const float *tr_vrow(const tr_ep *e, uint32_t uid, int l) {
    return e->vals + (size_t)uid * (size_t)e->tok_floats + (size_t)e->L * (size_t)(e->H * e->hk) +
           (size_t)l * (size_t)(e->H * e->hv);
}

/* ---- reference semantics (ref_model.h, with this cache's kind, window and sinks) -- */
static int tr_view(const tr_cache *c, const ref_state *st, int32_t *pos) { return ref_view(c->kind, c->W, c->S, st, pos); }
static int tr_wrapped(const tr_cache *c, const ref_state *st) { return ref_wrapped(c->kind, c->W, st); }

static int tr_find_cache(const tr_ep *e, uint32_t serial) {
    int i;
    for (i = 0; i < e->nc; ++i)
        if (e->c[i].serial == serial) return i;
    return -1;
}

static int32_t tr_cap(const tr_cache *c) { return c->kind == KVC_KIND_FULL ? TR_FULL_CAP : TR_ROT_CAP; }

static int32_t tr_rot_page_bound(const tr_ep *e, const tr_cache *c) {
    return tr_ceil_div(c->S, e->pc) + tr_ceil_div(c->W - c->S - 1 + TR_MAX_BATCH, e->pc) + 2;
}

static void tr_stats(tr_ep *e, kvc_pool_stats *st) {
    TK_OK(kvc_pool_stats_get(e->pool, st));
}
static int32_t tr_free_pages(tr_ep *e) {
    kvc_pool_stats st;
    tr_stats(e, &st);
    return st.pages_total - st.pages_used;
}

/* ---- comparisons ------------------------------------------------------------------- */
static int tr_row_eq(const float *a, const float *b, int n) { return memcmp(a, b, sizeof(float) * (size_t)n) == 0; }

/* Compare a cache with a reference state (used for live caches and for probes). */
static void tr_check_cache_state(tr_ep *e, int ci, const ref_state *st) {
    tr_cache *c = &e->c[ci];
    int32_t off = -1, cells = -1, pages = -1, n = -1, nr = -1, l, j, r;
    int nview = tr_view(c, st, e->view), can = -1;
    int nk = e->H * e->hk, nv = e->H * e->hv;
    size_t szk = e->tk == KVC_TYPE_F32 ? 4 : 2, szv = e->tv == KVC_TYPE_F32 ? 4 : 2;

    TK_OK(kvc_cache_offset(c->h, &off));
    TK_EQ(off, st->off);
    TK_OK(kvc_cache_cells(c->h, &cells));
    TK_EQ(cells, nview);
    TK_OK(kvc_cache_pages(c->h, &pages));
    if (c->kind == KVC_KIND_FULL) TK_EQ(pages, tr_ceil_div(st->off, e->pc));
    else TK_CHECK(pages <= tr_rot_page_bound(e, c));
    TK_OK(kvc_cache_can_trim(c->h, &can));
    TK_EQ(can != 0, !tr_wrapped(c, st));

    for (l = 0; l < e->L; ++l) {
        int bad = 0;
        n = -1;
        r = kvc_cache_gather(c->h, l, e->gk, e->gv, e->gpos, TR_MAX_TOK, &n);
        TK_OK(r);
        TK_EQ(n, nview);
        if (r != KVC_OK || n != nview) continue;
        for (j = 0; j < n && !bad; ++j) {
            uint32_t uid = st->uid[e->view[j]];
            if (e->gpos[j] != e->view[j]) {
                fprintf(stderr, "cache %d layer %d cell %d: pos %d, want %d\n", ci, l, j, e->gpos[j], e->view[j]);
                bad = 1;
            } else if (!tr_row_eq(e->gk + (size_t)j * nk, tr_krow(e, uid, l), nk) ||
                       !tr_row_eq(e->gv + (size_t)j * nv, tr_vrow(e, uid, l), nv)) {
                fprintf(stderr, "cache %d layer %d cell %d (pos %d): K/V differ from token uid %u"
                        " (got v[0]=%g, want %g)\n", ci, l, j, e->view[j], (unsigned)uid,
                        (double)e->gv[(size_t)j * nv], (double)tr_vrow(e, uid, l)[0]);
                bad = 1;
            }
        }
        TK_CHECK(!bad);

        /* the zero-copy runs, concatenated, are the same cells */
        nr = -1;
        r = kvc_cache_runs(c->h, l, NULL, 0, &nr);
        TK_CHECK(r == KVC_OK || (r == KVC_ERR_RANGE && nr > 0));
        TK_CHECK(nr >= 0 && nr <= TR_MAX_TOK + 2 && (nr > 0 || n == 0));
        if (nr < 0 || nr > TR_MAX_TOK + 2) continue;
        {
            int32_t nr2 = -1, total = 0, i, x;
            TK_OK(kvc_cache_runs(c->h, l, e->runs, nr, &nr2));
            TK_EQ(nr2, nr);
            if (nr > 0 && tr_pct(e, 10)) { /* too small: KVC_ERR_RANGE with the count */
                int32_t nr3 = -1;
                TK_RES(kvc_cache_runs(c->h, l, e->runs + nr, nr - 1, &nr3), KVC_ERR_RANGE);
                TK_EQ(nr3, nr);
            }
            bad = 0;
            for (i = 0; i < nr && !bad; ++i) {
                const kvc_run *run = &e->runs[i];
                if (run->n_cells <= 0 || total + run->n_cells > n) { bad = 1; break; }
                for (j = 0; j < run->n_cells && !bad; ++j, ++total) {
                    const unsigned char *kp = (const unsigned char *)run->k + (size_t)j * (size_t)nk * szk;
                    const unsigned char *vp = (const unsigned char *)run->v + (size_t)j * (size_t)nv * szv;
                    if (run->pos[j] != e->gpos[total]) bad = 2;
                    for (x = 0; x < nk; ++x) {
                        if (e->tk == KVC_TYPE_F32) memcpy(&e->row[x], kp + 4 * (size_t)x, 4);
                        else { uint16_t hb; memcpy(&hb, kp + 2 * (size_t)x, 2); e->row[x] = tr_f16_to_f32(hb); }
                    }
                    if (!tr_row_eq(e->row, e->gk + (size_t)total * nk, nk)) bad = 3;
                    for (x = 0; x < nv; ++x) {
                        if (e->tv == KVC_TYPE_F32) memcpy(&e->row[x], vp + 4 * (size_t)x, 4);
                        else { uint16_t hb; memcpy(&hb, vp + 2 * (size_t)x, 2); e->row[x] = tr_f16_to_f32(hb); }
                    }
                    if (!tr_row_eq(e->row, e->gv + (size_t)total * nv, nv)) bad = 4;
                }
            }
            if (bad || total != n)
                fprintf(stderr, "cache %d layer %d: kvc_cache_runs differ from gather (%d, cells %d of %d)\n",
                        ci, l, bad, total, n);
            TK_CHECK(!bad && total == n);
        }
    }
    /* a too small gather buffer: KVC_ERR_RANGE with the count */
    if (nview > 0 && tr_pct(e, 5)) {
        n = -1;
        TK_RES(kvc_cache_gather(c->h, 0, NULL, NULL, e->gpos, nview - 1, &n), KVC_ERR_RANGE);
        TK_EQ(n, nview);
    }
}

static void tr_check_snap(tr_ep *e, const tr_snap *s) {
    kvc_snapshot_info info;
    memset(&info, 0xab, sizeof(info));
    TK_OK(kvc_snapshot_info_get(s->h, &info));
    TK_EQ(info.from, s->from);
    TK_EQ(info.to, s->to);
    if (s->kind == KVC_KIND_FULL) /* exactly the pages that hold [from, to) */
        TK_EQ(info.n_pages, (s->to - 1) / e->pc - s->from / e->pc + 1);
    else
        TK_CHECK(info.n_pages >= 0 && info.n_pages <= s->page_bound);
    TK_CHECK(info.bytes == (size_t)info.n_pages * e->page_bytes);
}

static void tr_check_all(tr_ep *e) {
    kvc_pool_stats st;
    int i;
    int32_t sum = 0, mx = 0, p;
    for (i = 0; i < e->nc; ++i) {
        tr_check_cache_state(e, i, &e->c[i].st);
        p = 0;
        kvc_cache_pages(e->c[i].h, &p);
        sum += p;
        mx = tr_max(mx, p);
    }
    for (i = 0; i < e->ns; ++i) {
        kvc_snapshot_info info;
        tr_check_snap(e, e->s[i]);
        if (kvc_snapshot_info_get(e->s[i]->h, &info) == KVC_OK) { sum += info.n_pages; mx = tr_max(mx, info.n_pages); }
    }
    tr_stats(e, &st);
    TK_CHECK(st.pages_used >= 0 && st.pages_used <= st.pages_total);
    TK_EQ(st.pages_total, e->pages_total);
    TK_CHECK(st.pages_used <= sum); /* every used page is held by someone */
    TK_CHECK(st.pages_used >= mx);
    TK_CHECK(st.pages_peak >= st.pages_used && st.pages_peak <= st.pages_total);
    TK_CHECK(st.bytes_used == (size_t)st.pages_used * e->page_bytes);
    TK_EQ(st.live_caches, e->nc);
    TK_EQ(st.live_snapshots, e->ns);
    TK_EQ(st.live_prefixes, e->px.h != NULL);
    if (e->px.h != NULL) {
        const int32_t *toks = NULL;
        int32_t nt = -1;
        TK_OK(kvc_prefix_tokens(e->px.h, &toks, &nt));
        TK_EQ(nt, e->px.n);
        TK_CHECK(nt == e->px.n && (nt == 0 || memcmp(toks, e->px.tok, sizeof(int32_t) * (size_t)nt) == 0));
    }
}

/* ---- attention ------------------------------------------------------------------------ */
/* kvc_attention of random queries against a double-precision reference over the
   reference tokens with the documented mask. */
static void tr_check_attention(tr_ep *e, int ci, const ref_state *st, int layer) {
    tr_cache *c = &e->c[ci];
    kvc_attention_desc d;
    int32_t nq, g, nh, lo, hi, qi, h, i, t, kvh;
    int use_null_pos = 0, bad = 0;
    double scale;
    memset(&d, 0, sizeof(d));
    g = tr_int(e, 1, TR_MAX_G);
    nh = e->H * g;
    nq = tr_int(e, 1, TR_MAX_Q);
    if (c->kind == KVC_KIND_FULL) { lo = tr_max(0, st->off - 12); hi = st->off + 1; }
    else { lo = st->bb; hi = st->off + 1; } /* queries of (or after) the last batch */
    if (tr_pct(e, 35) && nq <= st->off - lo) use_null_pos = 1;
    for (qi = 0; qi < nq; ++qi) e->qpos[qi] = use_null_pos ? st->off - nq + qi : tr_int(e, lo, hi);
    for (i = 0; i < nq * nh * e->hk; ++i) e->q[i] = tk_float(&e->rng);
    for (i = 0; i < nq * nh * e->hv; ++i) e->out[i] = 1e30f;
    d.n_queries = nq;
    d.n_heads = nh;
    d.q = e->q;
    d.pos = use_null_pos ? NULL : e->qpos;
    d.scale = tr_pct(e, 50) ? 0.0f : (float)tr_int(e, 1, 16) / 16.0f;
    d.window = tr_pct(e, 60) ? 0 : tr_int(e, 1, 15);
    d.non_causal = tr_pct(e, 15);
    d.out = e->out;
    TK_OK(kvc_attention(c->h, layer, &d));
    scale = d.scale > 0.0f ? (double)d.scale : 1.0 / sqrt((double)e->hk);
    for (qi = 0; qi < nq && !bad; ++qi) {
        int32_t p = e->qpos[qi];
        for (h = 0; h < nh && !bad; ++h) {
            const float *q = e->q + ((size_t)qi * nh + h) * e->hk;
            const float *o = e->out + ((size_t)qi * nh + h) * e->hv;
            double m = -1e300, sum = 0.0, acc[TR_MAX_D], vmax = 0.0;
            int any = 0;
            kvh = h / g;
            for (i = 0; i < e->hv; ++i) acc[i] = 0.0;
            for (t = 0; t < st->off; ++t) { /* pass 1: the max score */
                double s = 0.0;
                const float *k;
                if (!ref_visible(c->kind, c->W, c->S, d.non_causal, d.window, t, p)) continue;
                k = tr_krow(e, st->uid[t], layer) + (size_t)kvh * e->hk;
                for (i = 0; i < e->hk; ++i) s += (double)q[i] * (double)k[i];
                s *= scale;
                if (s > m) m = s;
                any = 1;
            }
            for (t = 0; any && t < st->off; ++t) { /* pass 2: weights */
                double s = 0.0, w;
                const float *k, *v;
                if (!ref_visible(c->kind, c->W, c->S, d.non_causal, d.window, t, p)) continue;
                k = tr_krow(e, st->uid[t], layer) + (size_t)kvh * e->hk;
                v = tr_vrow(e, st->uid[t], layer) + (size_t)kvh * e->hv;
                for (i = 0; i < e->hk; ++i) s += (double)q[i] * (double)k[i];
                w = exp(s * scale - m);
                sum += w;
                for (i = 0; i < e->hv; ++i) {
                    acc[i] += w * (double)v[i];
                    if (fabs((double)v[i]) > vmax) vmax = fabs((double)v[i]);
                }
            }
            for (i = 0; i < e->hv; ++i) {
                double want = any ? acc[i] / sum : 0.0;
                double tol = 1e-4 * (1.0 + vmax);
                if (!(fabs((double)o[i] - want) <= tol)) {
                    fprintf(stderr, "attention cache %d layer %d query %d (pos %d) head %d dim %d: got %.9g want %.9g"
                            " (window %d, non_causal %d, offset %d, bb %d)\n", ci, layer, qi, p, h, i,
                            (double)o[i], want, d.window, d.non_causal, st->off, st->bb);
                    bad = 1;
                    break;
                }
            }
        }
    }
    TK_CHECK(!bad);
}

/* ---- operations ------------------------------------------------------------------------ */
static void tr_fill_batch(tr_ep *e, const uint32_t *uids, int n, int l) {
    int i, nk = e->H * e->hk, nv = e->H * e->hv;
    for (i = 0; i < n; ++i) {
        memcpy(e->bk + (size_t)i * nk, tr_krow(e, uids[i], l), sizeof(float) * (size_t)nk);
        memcpy(e->bv + (size_t)i * nv, tr_vrow(e, uids[i], l), sizeof(float) * (size_t)nv);
    }
}

/* kvc_begin + kvc_put of every layer (random order, sometimes a layer put twice, checks
   while the batch is open, sometimes kvc_cancel midway). Returns 1 when the tokens were
   appended, 0 on KVC_ERR_FULL, a cancel or the cap. */
static int tr_op_append(tr_ep *e, int ci, int n, int allow_cancel) {
    tr_cache *c = &e->c[ci];
    ref_state after;
    uint32_t uids[TR_MAX_BATCH], junk[TR_MAX_BATCH];
    int order[TR_MAX_L], put[TR_MAX_L];
    int32_t o = c->st.off, free_before, need_lo, need_hi, off = -1;
    int i, j, r, cancel_at = -1;
    kvc_pool_stats st0, st1;
    if (o + n > tr_cap(c)) return 0;
    tr_stats(e, &st0);
    free_before = st0.pages_total - st0.pages_used;
    need_lo = tr_ceil_div(o + n, e->pc) - tr_ceil_div(o, e->pc);
    need_hi = need_lo + (o % e->pc != 0);
    tr_logf(e, "append cache %d n %d (offset %d, free pages %d)", ci, n, o, free_before);
    r = kvc_begin(c->h, n, NULL, 0);
    tr_loga(e, " -> %d", r);
    if (r == KVC_ERR_FULL) {
        if (!(free_before < need_hi))
            fprintf(stderr, "kvc_begin(%d) said FULL with %d free pages (needs at most %d)\n", n, free_before, need_hi);
        TK_CHECK(free_before < need_hi);
        tr_stats(e, &st1);
        TK_EQ(st1.pages_used, st0.pages_used);
        return 0;
    }
    TK_OK(r);
    if (r != KVC_OK) return 0;
    if (c->kind == KVC_KIND_FULL) TK_CHECK(free_before >= need_lo);
    for (i = 0; i < n; ++i) uids[i] = tr_new_uid(e);
    ref_begin(c->kind, c->W, c->S, e->pc, &c->st, uids, n, &after);
    for (i = 0; i < e->L; ++i) { order[i] = i; put[i] = 0; }
    for (i = e->L - 1; i > 0; --i) { j = tr_int(e, 0, i); r = order[i]; order[i] = order[j]; order[j] = r; }
    if (allow_cancel && tr_pct(e, 12)) cancel_at = tr_int(e, 0, e->L - 1);
    for (j = 0; j < e->L; ++j) {
        int l = order[j];
        if (j == cancel_at) {
            TK_OK(kvc_cancel(c->h));
            tr_logf(e, "  cancel after %d of %d layers", j, e->L);
            ref_cancel(&c->st, &after);
            return 0;
        }
        if (j < e->L - 1 && tr_pct(e, 8)) { /* junk first, the second put wins (the last put closes the batch) */
            for (i = 0; i < n; ++i) junk[i] = tr_new_uid(e);
            tr_fill_batch(e, junk, n, l);
            TK_OK(kvc_put(c->h, l, e->bk, e->bv));
        }
        tr_fill_batch(e, uids, n, l);
        TK_OK(kvc_put(c->h, l, e->bk, e->bv));
        put[l] = 1;
        if (j < e->L - 1 && tr_pct(e, 6)) { /* while the batch is still open */
            kvc_snapshot *snap = (kvc_snapshot *)(void *)e->sentinel;
            kvc_cache *fk = NULL;
            int32_t reused = -1, tok = 1;
            TK_OK(kvc_cache_offset(c->h, &off));
            TK_EQ(off, o + n);
            TK_RES(kvc_begin(c->h, 1, NULL, 0), KVC_ERR_STATE);
            TK_RES(kvc_snapshot_take(c->h, 0, KVC_POS_END, &snap), KVC_ERR_STATE);
            TK_RES(kvc_cache_fork(c->h, &fk), KVC_ERR_STATE);
            if (e->px.h != NULL)
                for (i = 0; i < e->px.n_c; ++i)
                    if (e->px.serial[i] == c->serial) {
                        TK_RES(kvc_prefix_begin(e->px.h, &tok, 1, &reused), KVC_ERR_STATE);
                        break;
                    }
            for (i = 0; i < e->L; ++i)
                if (!put[i]) {
                    kvc_attention_desc d;
                    memset(&d, 0, sizeof(d));
                    d.n_queries = 1;
                    d.n_heads = e->H;
                    d.q = e->q;
                    d.out = e->out;
                    memset(e->q, 0, sizeof(e->q));
                    TK_RES(kvc_attention(c->h, i, &d), KVC_ERR_STATE);
                    break;
                }
        }
        if (tr_pct(e, 10)) tr_check_attention(e, ci, &after, l); /* the forward pass pattern */
    }
    c->st = after;
    if (tr_pct(e, 5)) {
        TK_RES(kvc_cancel(c->h), KVC_ERR_STATE);
        TK_RES(kvc_put(c->h, 0, e->bk, e->bv), KVC_ERR_STATE);
    }
    return 1;
}

static void tr_op_trim(tr_ep *e, int ci) {
    tr_cache *c = &e->c[ci];
    int32_t n = tr_pct(e, 10) ? tr_int(e, -2, c->st.off + 2) : tr_int(e, 0, tr_min(c->st.off, 12));
    int r, want = ref_trim_expect(c->kind, c->W, &c->st, n);
    tr_logf(e, "trim cache %d n %d (offset %d)", ci, n, c->st.off);
    r = kvc_cache_trim(c->h, n);
    tr_loga(e, " -> %d (want %d)", r, want);
    TK_RES(r, want);
    if (r == KVC_OK && want == KVC_OK) ref_trim(&c->st, n);
}

static void tr_op_live_restore(tr_ep *e, int ci) {
    tr_cache *c = &e->c[ci];
    int32_t off = c->st.off, target = tr_pct(e, 15) ? tr_int(e, -2, off + 2) : tr_int(e, tr_max(0, off - 10), off);
    int r, want = ref_live_restore_expect(c->kind, c->W, &c->st, target);
    tr_logf(e, "live restore cache %d target %d (offset %d)", ci, target, off);
    r = kvc_cache_restore(c->h, NULL, target);
    tr_loga(e, " -> %d", r);
    TK_RES(r, want);
    if (r == KVC_OK && want == KVC_OK) ref_live_restore(c->kind, &c->st, target);
}

static void tr_snap_remove(tr_ep *e, int si) {
    free(e->s[si]);
    e->s[si] = e->s[--e->ns];
}
static void tr_snap_remove_ptr(tr_ep *e, const tr_snap *s) {
    int i;
    for (i = 0; i < e->ns; ++i)
        if (e->s[i] == s) { tr_snap_remove(e, i); return; }
}

static void tr_op_snap_free(tr_ep *e, int si) {
    tr_logf(e, "snapshot_free %d [%d,%d)", si, e->s[si]->from, e->s[si]->to);
    TK_OK(kvc_snapshot_free(e->s[si]->h));
    tr_snap_remove(e, si);
}

static tr_snap *tr_snap_new(void) {
    tr_snap *s = (tr_snap *)malloc(sizeof(tr_snap));
    if (s == NULL) { fprintf(stderr, "out of memory\n"); exit(2); }
    memset(s, 0, sizeof(*s));
    return s;
}

static int32_t tr_pick_from(tr_ep *e, int ci) {
    tr_cache *c = &e->c[ci];
    int32_t from, off = c->st.off;
    int i, k = tr_int(e, 0, 9);
    if (k == 0) from = tr_int(e, -3, -1);
    else if (k <= 3) from = 0;
    else if (k <= 6) { /* continue a chain: from = the end of the latest snapshot of this cache */
        from = tr_int(e, 0, off);
        for (i = 0; i < e->ns; ++i)
            if (e->s[i]->owner == c->serial && e->s[i]->to <= off && (from > off - 1 || e->s[i]->to > from || tr_pct(e, 20)))
                from = e->s[i]->to;
    } else from = tr_int(e, 0, off + 2);
    return from;
}

/* kvc_snapshot_take; returns the new reference snapshot, or NULL */
static tr_snap *tr_op_take(tr_ep *e, int ci, int32_t from) {
    tr_cache *c = &e->c[ci];
    kvc_snapshot *out = (kvc_snapshot *)(void *)e->sentinel;
    int32_t off = c->st.off;
    int r;
    if (e->ns == TR_MAX_SNAPS) tr_op_snap_free(e, tr_int(e, 0, e->ns - 1));
    tr_logf(e, "snapshot_take cache %d (kind %d) from %d (offset %d)", ci, (int)c->kind, from, off);
    r = kvc_snapshot_take(c->h, from, KVC_POS_END, &out);
    tr_loga(e, " -> %d %s", r, out ? "snap" : "NULL");
    TK_OK(r);
    if (r != KVC_OK) return NULL;
    if (!ref_take_holds(c->kind, &c->st, from)) {
        TK_CHECK(out == NULL);
        if (out != NULL && out != (kvc_snapshot *)(void *)e->sentinel) kvc_snapshot_free(out);
        return NULL;
    }
    TK_CHECK(out != NULL && out != (kvc_snapshot *)(void *)e->sentinel);
    if (out == NULL || out == (kvc_snapshot *)(void *)e->sentinel) return NULL;
    {
        tr_snap *s = tr_snap_new();
        s->h = out;
        s->owner = c->serial;
        s->kind = c->kind;
        s->W = c->W;
        s->S = c->S;
        s->from = ref_take_from(c->kind, from);
        s->to = off;
        s->st = c->st;
        s->page_bound = c->kind == KVC_KIND_ROTATING ? tr_rot_page_bound(e, c) : 0;
        e->s[e->ns++] = s;
        tr_check_snap(e, s);
        return s;
    }
}

/* A snapshot serves any cache of the pool with its kind, window and sinks (the
   MLX runner's snapshots are not tied to the cache that took them either). */
static int tr_compatible(const tr_cache *c, const tr_snap *s) {
    return s->kind == c->kind && s->W == c->W && s->S == c->S;
}

/* What kvc_cache_restore(c, s, target) must return (ref_model.h, after the compatibility check). */
static int tr_restore_expect(const tr_cache *c, const tr_snap *s, int32_t target) {
    if (!tr_compatible(c, s)) return KVC_ERR_FOREIGN;
    return ref_restore_expect(c->kind, c->W, &c->st, s->from, s->to, &s->st, target);
}

static int32_t tr_pick_target(tr_ep *e, const tr_snap *s) {
    int k = tr_int(e, 0, 9);
    if (k < 4) return s->to;
    if (k < 8) return tr_int(e, tr_max(-1, s->from - 2), s->to + 2);
    return tr_int(e, -3, s->to + 5);
}

/* restore: returns 1 when the cache now holds the snapshot's contents */
static int tr_do_restore(tr_ep *e, int ci, int si, int32_t target) {
    tr_cache *c = &e->c[ci];
    tr_snap *s = e->s[si];
    int32_t free_before = tr_free_pages(e);
    int want = tr_restore_expect(c, s, target);
    int r;
    tr_logf(e, "restore cache %d (kind %d, offset %d) from snap %d [%d,%d) target %d", ci, (int)c->kind, c->st.off,
            si, s->from, s->to, target);
    r = kvc_cache_restore(c->h, s->h, target);
    tr_loga(e, " -> %d (want %d)", r, want);
    if (r == KVC_ERR_FULL && want == KVC_OK && c->kind == KVC_KIND_FULL) {
        TK_CHECK(free_before < 1); /* at most the page at `from` is copied */
        TK_EQ(tr_free_pages(e), free_before);
        return 0;
    }
    TK_RES(r, want);
    if (r != KVC_OK || want != KVC_OK) return 0;
    ref_restore(c->kind, s->from, s->to, &s->st, target, &c->st);
    return 1;
}

static int tr_pick_snap_of(tr_ep *e, uint32_t serial) {
    int i, cand[TR_MAX_SNAPS], n = 0;
    for (i = 0; i < e->ns; ++i)
        if (e->s[i]->owner == serial) cand[n++] = i;
    return n ? cand[tr_int(e, 0, n - 1)] : -1;
}

static void tr_op_restore(tr_ep *e) {
    int si, ci;
    if (e->ns == 0) return;
    si = tr_int(e, 0, e->ns - 1);
    ci = tr_find_cache(e, e->s[si]->owner);
    if (ci < 0 || tr_pct(e, 8)) { /* another cache: it takes the snapshot if compatible */
        int32_t target;
        ci = tr_int(e, 0, e->nc - 1);
        if (e->c[ci].serial == e->s[si]->owner) return;
        target = tr_int(e, 0, e->s[si]->to);
        if (tr_compatible(&e->c[ci], e->s[si])) { tr_do_restore(e, ci, si, target); return; }
        tr_logf(e, "restore cache %d from foreign snap %d target %d", ci, si, target);
        TK_RES(kvc_cache_restore(e->c[ci].h, e->s[si]->h, target), KVC_ERR_FOREIGN);
        return;
    }
    tr_do_restore(e, ci, si, tr_pick_target(e, e->s[si]));
}

/* Restore a snapshot, compare, and bring the live state back from a snapshot of it. */
static void tr_op_probe(tr_ep *e) {
    int si, ci, r;
    tr_cache *c;
    ref_state saved;
    kvc_snapshot *tmp = NULL;
    if (e->ns == 0) return;
    si = tr_int(e, 0, e->ns - 1);
    ci = tr_find_cache(e, e->s[si]->owner);
    if (ci < 0) return;
    c = &e->c[ci];
    saved = c->st;
    tr_logf(e, "probe: snapshot_take cache %d from 0 (offset %d)", ci, c->st.off);
    r = kvc_snapshot_take(c->h, 0, KVC_POS_END, &tmp);
    tr_loga(e, " -> %d", r);
    TK_OK(r);
    if (r != KVC_OK) return;
    TK_CHECK((tmp == NULL) == (c->st.off == 0));
    if (tr_do_restore(e, ci, si, tr_pick_target(e, e->s[si]))) {
        tr_check_cache_state(e, ci, &c->st);
        if (tr_pct(e, 50)) tr_check_attention(e, ci, &c->st, tr_int(e, 0, e->L - 1));
        if (tmp != NULL) {
            tr_logf(e, "probe: restore cache %d back to %d", ci, saved.off);
            r = kvc_cache_restore(c->h, tmp, saved.off);
            tr_loga(e, " -> %d", r);
            TK_OK(r);
            if (r == KVC_OK) { /* a restore from a snapshot counts as a change (kvc_prefix) */
                uint32_t changes = c->st.changes;
                c->st = saved;
                c->st.changes = changes + 1;
            }
        } else {
            TK_OK(kvc_cache_clear(c->h));
            c->st.off = c->st.bb = c->st.rel = 0;
            tr_logf(e, "probe: clear cache %d", ci);
        }
    }
    TK_OK(kvc_snapshot_free(tmp));
}

static void tr_do_merge(tr_ep *e, int ci, int pi, int chi);
static int tr_snap_index(const tr_ep *e, const tr_snap *s) {
    int i;
    for (i = 0; i < e->ns; ++i)
        if (e->s[i] == s) return i;
    return -1;
}

static void tr_op_merge(tr_ep *e) {
    int ci = tr_int(e, 0, e->nc - 1), pi = -1, chi = -1, i, j, k = tr_int(e, 0, 19);
    tr_cache *c;
    if (e->ns > 0 && tr_pct(e, 85)) { /* usually a cache that has snapshots */
        int owner = tr_find_cache(e, e->s[tr_int(e, 0, e->ns - 1)]->owner);
        if (owner >= 0) ci = owner;
    }
    c = &e->c[ci];
    if (k < 9) { /* an adjacent pair of this cache, if there is one */
        for (i = 0; i < e->ns && pi < 0; ++i)
            for (j = 0; j < e->ns; ++j)
                if (i != j && e->s[i]->owner == c->serial && e->s[j]->owner == c->serial &&
                    e->s[i]->to == e->s[j]->from && tr_pct(e, 60)) { pi = i; chi = j; break; }
    }
    if (pi < 0) {
        pi = tr_pick_snap_of(e, c->serial);
        chi = tr_pick_snap_of(e, c->serial);
    }
    if (k == 10 || k == 11) pi = -1;                     /* NULL parent */
    else if (k == 12) chi = -1;                          /* NULL child */
    else if (k == 13 && e->ns > 0) chi = tr_int(e, 0, e->ns - 1); /* maybe foreign */
    else if (k == 14) chi = pi;                          /* the same one twice */
    tr_do_merge(e, ci, pi, chi);
}

/* kvc_snapshot_merge of held snapshots pi and chi (-1: NULL) with cache ci */
static void tr_do_merge(tr_ep *e, int ci, int pi, int chi) {
    tr_cache *c = &e->c[ci];
    kvc_snapshot *ph, *chh, *out = (kvc_snapshot *)(void *)e->sentinel;
    int32_t free_before;
    int r, want;
    ph = pi >= 0 ? e->s[pi]->h : NULL;
    chh = chi >= 0 ? e->s[chi]->h : NULL;
    if ((pi >= 0 && !tr_compatible(c, e->s[pi])) || (chi >= 0 && !tr_compatible(c, e->s[chi]))) want = KVC_ERR_FOREIGN;
    else if (pi >= 0 && pi == chi) want = KVC_ERR_INVALID;
    else if (c->kind == KVC_KIND_FULL && pi >= 0 && chi >= 0 && e->s[pi]->to != e->s[chi]->from) want = KVC_ERR_INVALID;
    else want = KVC_OK;
    free_before = tr_free_pages(e);
    tr_logf(e, "merge cache %d (kind %d) parent %d [%d,%d) child %d [%d,%d)", ci, (int)c->kind, pi,
            pi >= 0 ? e->s[pi]->from : 0, pi >= 0 ? e->s[pi]->to : 0, chi,
            chi >= 0 ? e->s[chi]->from : 0, chi >= 0 ? e->s[chi]->to : 0);
    r = kvc_snapshot_merge(c->h, ph, chh, &out);
    tr_loga(e, " -> %d (want %d)", r, want);
    if (r == KVC_ERR_FULL && want == KVC_OK && c->kind == KVC_KIND_FULL && pi >= 0 && chi >= 0) {
        TK_CHECK(free_before < 1);
        TK_EQ(tr_free_pages(e), free_before);
        return; /* nothing consumed */
    }
    TK_RES(r, want);
    if (r != KVC_OK || want != KVC_OK) return; /* nothing consumed (the checks see it) */
    if (c->kind == KVC_KIND_ROTATING) {
        /* the child supersedes the parent: the parent is freed, out is the child */
        TK_CHECK(out == chh);
        if (pi >= 0) tr_snap_remove(e, pi);
        return;
    }
    if (pi < 0 || chi < 0) {
        TK_CHECK(out == NULL);
        if (pi >= 0) tr_snap_remove_ptr(e, e->s[pi]);
        if (chi >= 0) tr_snap_remove_ptr(e, e->s[chi]);
        return;
    }
    TK_CHECK(out != NULL && out != (kvc_snapshot *)(void *)e->sentinel);
    if (out == NULL || out == (kvc_snapshot *)(void *)e->sentinel) return;
    {
        tr_snap *m = tr_snap_new(), *p = e->s[pi], *ch = e->s[chi];
        m->h = out;
        m->owner = c->serial;
        m->kind = KVC_KIND_FULL;
        m->W = c->W;
        m->S = c->S;
        m->from = p->from;
        m->to = ch->to;
        ref_merge_full(&p->st, p->from, p->to, &ch->st, ch->to, &m->st);
        tr_snap_remove_ptr(e, p);
        tr_snap_remove_ptr(e, ch);
        e->s[e->ns++] = m;
        tr_check_snap(e, m);
    }
}

/* ollama's pattern: snapshot, evaluate more, snapshot from the previous end, merge the
   two (their boundary page differs once the cache wrote after the first), restore. */
static void tr_op_chain(tr_ep *e, int ci) {
    tr_cache *c = &e->c[ci];
    tr_snap *a, *b;
    int pi, chi, k;
    while (e->ns > TR_MAX_SNAPS - 2) tr_op_snap_free(e, tr_int(e, 0, e->ns - 1));
    if (c->st.off == 0 && !tr_op_append(e, ci, tr_int(e, 1, TR_MAX_BATCH), 0)) return;
    a = tr_op_take(e, ci, tr_int(e, -1, c->st.off - 1));
    if (a == NULL) return;
    for (k = tr_int(e, 1, 3); k > 0; --k) tr_op_append(e, ci, tr_int(e, 1, TR_MAX_BATCH), 0);
    b = tr_op_take(e, ci, a->to);
    if (b == NULL) return;
    if (tr_pct(e, 30)) tr_op_append(e, ci, tr_int(e, 1, 4), 0);
    pi = tr_snap_index(e, a);
    chi = tr_snap_index(e, b);
    if (pi < 0 || chi < 0) return;
    tr_do_merge(e, ci, pi, chi);
    if (tr_pct(e, 50) && e->ns > 0 && e->s[e->ns - 1]->owner == c->serial)
        tr_do_restore(e, ci, e->ns - 1, e->s[e->ns - 1]->to);
}

static void tr_op_split(tr_ep *e) {
    int si, ci, r, want;
    tr_snap *s;
    kvc_snapshot *a = (kvc_snapshot *)(void *)e->sentinel, *b = (kvc_snapshot *)(void *)e->sentinel;
    int32_t at;
    if (tr_pct(e, 3)) {
        TK_OK(kvc_snapshot_split(e->c[0].h, NULL, 3, &a, &b));
        TK_CHECK(a == NULL && b == NULL);
        return;
    }
    if (e->ns == 0) return;
    if (e->ns == TR_MAX_SNAPS) tr_op_snap_free(e, tr_int(e, 0, e->ns - 1));
    if (e->ns == 0) return;
    si = tr_int(e, 0, e->ns - 1);
    s = e->s[si];
    ci = tr_find_cache(e, s->owner);
    if (ci < 0 || tr_pct(e, 5)) ci = tr_int(e, 0, e->nc - 1);
    at = tr_pct(e, 15) ? tr_int(e, s->from - 3, s->to + 3) : tr_int(e, s->from + 1, s->to - 1);
    want = tr_compatible(&e->c[ci], s) ? KVC_OK : KVC_ERR_FOREIGN;
    tr_logf(e, "split snap %d [%d,%d) with cache %d at %d", si, s->from, s->to, ci, at);
    r = kvc_snapshot_split(e->c[ci].h, s->h, at, &a, &b);
    tr_loga(e, " -> %d (want %d)", r, want);
    TK_RES(r, want);
    if (r != KVC_OK || want != KVC_OK) return;
    if (s->kind == KVC_KIND_ROTATING || at <= s->from) {
        TK_CHECK(a == NULL && b == s->h);
        return;
    }
    if (at >= s->to) {
        TK_CHECK(a == s->h && b == NULL);
        return;
    }
    TK_CHECK(a != NULL && b != NULL && a != (kvc_snapshot *)(void *)e->sentinel &&
             b != (kvc_snapshot *)(void *)e->sentinel);
    if (a == NULL || b == NULL || a == (kvc_snapshot *)(void *)e->sentinel || b == (kvc_snapshot *)(void *)e->sentinel)
        return;
    {
        tr_snap *t = tr_snap_new();
        *t = *s;
        t->h = b;
        t->from = at;
        s->h = a;
        s->to = at;
        s->st.off = at;
        e->s[e->ns++] = t;
        tr_check_snap(e, s);
        tr_check_snap(e, t);
    }
}

static void tr_op_clear(tr_ep *e, int ci) {
    tr_logf(e, "clear cache %d", ci);
    TK_OK(kvc_cache_clear(e->c[ci].h));
    e->c[ci].st.off = 0;
    e->c[ci].st.bb = 0;
    e->c[ci].st.rel = 0;
}

static void tr_prefix_drop(tr_ep *e) {
    if (e->px.h == NULL) return;
    tr_logf(e, "prefix destroy");
    TK_OK(kvc_prefix_destroy(e->px.h));
    memset(&e->px, 0, sizeof(e->px));
}

static int tr_in_prefix(const tr_ep *e, uint32_t serial) {
    int i;
    if (e->px.h == NULL) return 0;
    for (i = 0; i < e->px.n_c; ++i)
        if (e->px.serial[i] == serial) return 1;
    return 0;
}

static void tr_new_cache(tr_ep *e, kvc_kind kind) {
    tr_cache *c = &e->c[e->nc];
    kvc_cache_config cc;
    int r;
    memset(c, 0, sizeof(*c));
    memset(&cc, 0, sizeof(cc));
    cc.kind = kind;
    if (kind == KVC_KIND_ROTATING) {
        cc.window = tr_int(e, 1, 12);
        cc.sinks = tr_pct(e, 40) ? 0 : tr_int(e, 0, cc.window - 1);
    }
    tr_logf(e, "create cache %d kind %d window %d sinks %d", e->nc, (int)kind, cc.window, cc.sinks);
    r = kvc_cache_create(e->pool, &cc, &c->h);
    tr_loga(e, " -> %d", r);
    TK_OK(r);
    if (r != KVC_OK) return;
    c->kind = kind;
    c->W = cc.window;
    c->S = cc.sinks;
    c->serial = ++e->next_serial;
    e->nc++;
}

static void tr_destroy_cache(tr_ep *e, int ci) {
    if (tr_in_prefix(e, e->c[ci].serial)) tr_prefix_drop(e); /* caches must outlive it */
    tr_logf(e, "destroy cache %d", ci);
    TK_OK(kvc_cache_destroy(e->c[ci].h));
    e->c[ci] = e->c[--e->nc]; /* its snapshots stay, foreign to every cache now */
}

static void tr_op_fork(tr_ep *e, int ci) {
    kvc_cache *f = NULL;
    int r;
    if (e->nc == TR_MAX_CACHES) return;
    tr_logf(e, "fork cache %d into new cache %d", ci, e->nc);
    r = kvc_cache_fork(e->c[ci].h, &f);
    tr_loga(e, " -> %d", r);
    TK_OK(r);
    if (r != KVC_OK) return;
    e->c[e->nc] = e->c[ci];
    e->c[e->nc].h = f;
    e->c[e->nc].serial = ++e->next_serial;
    e->nc++;
    if (tr_pct(e, 50)) { /* write into one side right away: copy-on-write */
        int side = tr_pct(e, 50) ? ci : e->nc - 1;
        tr_op_append(e, side, tr_int(e, 1, 4), 0);
    }
}

/* ---- prefix ---------------------------------------------------------------------------- */

/* kvc_prefix's generation rule: the caches' ref changes when its tokens were recorded */
static void tr_prefix_record(tr_ep *e) {
    int i;
    for (i = 0; i < e->px.n_c; ++i) e->px.changes[i] = e->c[tr_find_cache(e, e->px.serial[i])].st.changes;
}

static void tr_op_prefix_create(tr_ep *e) {
    kvc_cache *hs[TR_MAX_CACHES + 1];
    int i, n, r, perm[TR_MAX_CACHES], j, t;
    int32_t maxt;
    kvc_prefix *x = NULL;
    if (e->px.h != NULL) return;
    for (i = 0; i < e->nc; ++i) perm[i] = i;
    for (i = e->nc - 1; i > 0; --i) { j = tr_int(e, 0, i); t = perm[i]; perm[i] = perm[j]; perm[j] = t; }
    n = tr_int(e, 1, e->nc);
    maxt = tr_pct(e, 70) ? TR_MAX_PTOK : tr_int(e, 1, TR_MAX_PTOK);
    for (i = 0; i < n; ++i) hs[i] = e->c[perm[i]].h;
    if (tr_pct(e, 5)) { /* a cache twice */
        hs[n] = hs[0];
        TK_RES(kvc_prefix_create(hs, n + 1, maxt, &x), KVC_ERR_INVALID);
    }
    tr_logf(e, "prefix create over %d caches, max_tokens %d", n, maxt);
    r = kvc_prefix_create(hs, n, maxt, &x);
    tr_loga(e, " -> %d", r);
    TK_OK(r);
    if (r != KVC_OK) return;
    memset(&e->px, 0, sizeof(e->px));
    e->px.h = x;
    e->px.n_c = n;
    for (i = 0; i < n; ++i) e->px.serial[i] = e->c[perm[i]].serial;
    e->px.max_tokens = maxt;
    tr_prefix_record(e);
}

/* A prompt sharing a random prefix with what the prefix object recorded. */
static int32_t tr_make_prompt(tr_ep *e, int32_t *tok) {
    int32_t n = 0, keep, extra, i;
    const int32_t *base = tr_pct(e, 70) ? e->px.tok : e->px.prompt;
    int32_t nbase = base == e->px.tok ? e->px.n : e->px.n_prompt;
    keep = tr_pct(e, 30) ? nbase : tr_int(e, 0, nbase);
    for (i = 0; i < keep && n < 48; ++i) tok[n++] = base[i];
    extra = tr_int(e, 0, 14);
    for (i = 0; i < extra && n < 48; ++i) tok[n++] = tr_int(e, 0, 3);
    if (n == 0) tok[n++] = tr_int(e, 0, 3);
    return n;
}

static void tr_prefix_begin(tr_ep *e, const int32_t *tok, int32_t n, int32_t *reused_out) {
    tr_prefix *x = &e->px;
    int32_t p = 0, min_off = INT32_MAX, reused = -7, i;
    int trimmable = 1, r, ci;
    for (i = 0; i < x->n_c && !x->open; ++i) /* a cache changed behind its back: nothing recorded holds */
        if (e->c[tr_find_cache(e, x->serial[i])].st.changes != x->changes[i]) x->n = 0;
    while (p < n && p < x->n && tok[p] == x->tok[p]) p++;
    if (p == n) p--;
    for (i = 0; i < x->n_c; ++i) min_off = tr_min(min_off, e->c[tr_find_cache(e, x->serial[i])].st.off);
    p = tr_min(p, min_off);
    for (i = 0; i < x->n_c; ++i) {
        tr_cache *c = &e->c[tr_find_cache(e, x->serial[i])];
        if (c->st.off > p && tr_wrapped(c, &c->st)) trimmable = 0;
    }
    if (!trimmable) p = 0;
    tr_logf(e, "prefix begin n %d (recorded %d)", n, x->n);
    r = kvc_prefix_begin(x->h, tok, n, &reused);
    tr_loga(e, " -> %d reused %d (want %d)", r, reused, p);
    TK_OK(r);
    TK_EQ(reused, p);
    *reused_out = p;
    if (r != KVC_OK) return;
    for (i = 0; i < x->n_c; ++i) {
        ci = tr_find_cache(e, x->serial[i]);
        if (e->c[ci].st.off > p) ref_rewind(&e->c[ci].st, p);
    }
    x->n = p;
    tr_prefix_record(e);
    x->n_prompt = tr_min(n, x->max_tokens);
    memcpy(x->prompt, tok, sizeof(int32_t) * (size_t)x->n_prompt);
    x->open = 1;
}

static void tr_prefix_close(tr_ep *e, const int32_t *gen, int32_t g) {
    tr_prefix *x = &e->px;
    int32_t keep = x->max_tokens, i, from_prompt;
    int r;
    tr_logf(e, "prefix close generated %d (open %d)", g, x->open);
    r = kvc_prefix_close(x->h, gen, g);
    tr_loga(e, " -> %d", r);
    if (!x->open) { TK_RES(r, KVC_ERR_STATE); return; }
    TK_OK(r);
    for (i = 0; i < x->n_c; ++i) keep = tr_min(keep, e->c[tr_find_cache(e, x->serial[i])].st.off);
    keep = tr_min(keep, x->n_prompt + g);
    from_prompt = tr_min(keep, x->n_prompt);
    memcpy(x->tok, x->prompt, sizeof(int32_t) * (size_t)from_prompt);
    if (keep > from_prompt) memcpy(x->tok + from_prompt, gen, sizeof(int32_t) * (size_t)(keep - from_prompt));
    x->n = keep;
    tr_prefix_record(e);
    x->open = 0;
}

/* ollama's MLX runner's request cycle: begin, evaluate the rest of the prompt, generate, close */
static void tr_op_prefix_session(tr_ep *e) {
    int32_t tok[48], n, reused = 0, gen[8], g, i, j;
    int ci;
    if (e->px.h == NULL) return;
    n = tr_make_prompt(e, tok);
    tr_prefix_begin(e, tok, n, &reused);
    if (tr_pct(e, 10)) return; /* left open; a later close or begin deals with it */
    for (i = 0; i < e->px.n_c; ++i) {
        int32_t done = reused;
        ci = tr_find_cache(e, e->px.serial[i]);
        while (done < n) {
            int32_t b = tr_min(n - done, tr_int(e, 1, TR_MAX_BATCH));
            if (!tr_op_append(e, ci, b, 0)) break;
            done += b;
        }
    }
    g = tr_int(e, 0, 6);
    for (j = 0; j < g; ++j) {
        gen[j] = tr_int(e, 0, 3);
        for (i = 0; i < e->px.n_c; ++i) tr_op_append(e, tr_find_cache(e, e->px.serial[i]), 1, 0);
    }
    tr_prefix_close(e, gen, g);
}

/* ---- argument checks: every one of these changes nothing ---------------------------- */
static void tr_op_invalid(tr_ep *e, int ci) {
    tr_cache *c = &e->c[ci];
    kvc_attention_desc d;
    int32_t n = -1;
    int k = tr_int(e, 0, 9);
    tr_logf(e, "invalid-argument call %d on cache %d", k, ci);
    memset(&d, 0, sizeof(d));
    d.n_queries = 1;
    d.n_heads = e->H;
    d.q = e->q;
    d.out = e->out;
    memset(e->q, 0, sizeof(e->q));
    switch (k) {
    case 0: TK_RES(kvc_begin(c->h, 0, NULL, 0), KVC_ERR_INVALID); TK_RES(kvc_begin(c->h, -3, NULL, 0), KVC_ERR_INVALID); break;
    case 1: TK_RES(kvc_put(c->h, 0, e->bk, e->bv), KVC_ERR_STATE); TK_RES(kvc_cancel(c->h), KVC_ERR_STATE); break;
    case 2: {
        TK_RES(kvc_cache_trim(c->h, c->st.off + 1), ref_trim_expect(c->kind, c->W, &c->st, c->st.off + 1));
        break;
    }
    case 3: TK_RES(kvc_attention(c->h, e->L, &d), KVC_ERR_RANGE); TK_RES(kvc_attention(c->h, -1, &d), KVC_ERR_RANGE); break;
    case 4:
        if (e->H > 1) { d.n_heads = e->H + 1; TK_RES(kvc_attention(c->h, 0, &d), KVC_ERR_INVALID); }
        d.n_heads = e->H; d.window = -1; TK_RES(kvc_attention(c->h, 0, &d), KVC_ERR_INVALID);
        break;
    case 5: d.n_queries = c->st.off + 1; TK_RES(kvc_attention(c->h, 0, &d), KVC_ERR_RANGE); break;
    case 6: TK_RES(kvc_cache_gather(c->h, e->L, NULL, NULL, NULL, 0, &n), KVC_ERR_RANGE);
            TK_RES(kvc_cache_gather(c->h, 0, NULL, NULL, NULL, -1, &n), KVC_ERR_INVALID); break;
    case 7: TK_RES(kvc_cache_restore(c->h, NULL, -1), KVC_ERR_UNREACHABLE);
            TK_RES(kvc_cache_restore(c->h, NULL, c->st.off + 1), KVC_ERR_UNREACHABLE); break;
    case 8: if (e->px.h != NULL && !e->px.open) TK_RES(kvc_prefix_close(e->px.h, NULL, 0), KVC_ERR_STATE);
            if (e->px.h != NULL) { int32_t t = 0, r2 = 0; TK_RES(kvc_prefix_begin(e->px.h, &t, -1, &r2), KVC_ERR_INVALID); }
            break;
    default: {
        kvc_snapshot *o = NULL;
        TK_RES(kvc_snapshot_merge(NULL, NULL, NULL, &o), KVC_ERR_NULL);
        TK_RES(kvc_snapshot_take(NULL, 0, KVC_POS_END, &o), KVC_ERR_NULL);
        TK_RES(kvc_snapshot_free(NULL), KVC_OK);
        break;
    }
    }
}

/* ---- an episode ---------------------------------------------------------------------- */
static int tr_setup(tr_ep *e) {
    kvc_pool_config cfg;
    size_t bytes = 0;
    int32_t pages;
    int r, i, nfull;
    e->L = tr_int(e, 1, TR_MAX_L);
    e->H = tr_int(e, 1, TR_MAX_H);
    e->hk = tr_int(e, 1, TR_MAX_D);
    e->hv = tr_int(e, 1, TR_MAX_D);
    e->tk = tr_pct(e, 50) ? KVC_TYPE_F32 : KVC_TYPE_F16;
    e->tv = tr_pct(e, 50) ? KVC_TYPE_F32 : KVC_TYPE_F16;
    e->pc = tr_int(e, 1, 7);
    e->tok_floats = e->L * e->H * (e->hk + e->hv);
    if (tr_pct(e, 75)) pages = 14 * (82 / e->pc + 3); /* enough for everything the episode holds */
    else pages = tr_int(e, 1, 24);
    e->pages_total = pages;
    TK_OK(kvc_pool_config_init(&cfg));
    cfg.n_layers = e->L;
    cfg.n_kv_heads = e->H;
    cfg.head_dim_k = e->hk;
    cfg.head_dim_v = e->hv;
    cfg.type_k = e->tk;
    cfg.type_v = e->tv;
    cfg.page_cells = e->pc;
    TK_OK(kvc_pool_page_bytes(&cfg, &e->page_bytes));
    cfg.budget_bytes = (size_t)pages * e->page_bytes + (size_t)tr_int(e, 0, (int)e->page_bytes - 1);
    e->mode = tr_int(e, 0, 3);
    if (e->mode == 3) e->mode = 0;
    if (e->mode == 1) {
        cfg.runtime.allocator.alloc = tr_count_alloc;
        cfg.runtime.allocator.free = tr_count_free;
    } else if (e->mode == 2) {
        TK_OK(kvc_pool_arena_bytes(&cfg, &bytes));
        e->arena = malloc(bytes);
        if (e->arena == NULL) { fprintf(stderr, "out of memory\n"); exit(2); }
        cfg.arena = e->arena;
        cfg.arena_bytes = bytes;
    }
    r = kvc_pool_create(&cfg, &e->pool);
    tr_logf(e, "pool L %d H %d hk %d hv %d %s/%s page_cells %d pages %d mode %d -> %d", e->L, e->H, e->hk, e->hv,
            kvc_type_name(e->tk), kvc_type_name(e->tv), e->pc, pages, e->mode, r);
    TK_OK(r);
    if (r != KVC_OK) return 0;
    nfull = tr_int(e, 1, 2);
    for (i = 0; i < nfull; ++i) tr_new_cache(e, KVC_KIND_FULL);
    tr_new_cache(e, KVC_KIND_ROTATING);
    if (tr_pct(e, 60)) tr_op_prefix_create(e);
    return e->nc == nfull + 1;
}

static void tr_teardown(tr_ep *e) {
    kvc_pool_stats st;
    if (e->pool == NULL) return;
    if (e->nc + e->ns > 0) TK_RES(kvc_pool_destroy(e->pool), KVC_ERR_BUSY);
    tr_prefix_drop(e);
    while (e->ns > 0) tr_op_snap_free(e, tr_int(e, 0, e->ns - 1));
    while (e->nc > 0) tr_destroy_cache(e, tr_int(e, 0, e->nc - 1));
    tr_stats(e, &st);
    TK_EQ(st.pages_used, 0);
    TK_EQ(st.bytes_used, 0);
    TK_EQ(st.live_caches, 0);
    TK_EQ(st.live_snapshots, 0);
    TK_EQ(st.live_prefixes, 0);
    TK_OK(kvc_pool_destroy(e->pool));
    e->pool = NULL;
    if (e->mode == 1) TK_EQ(tr_live_allocs, 0);
    free(e->arena);
    e->arena = NULL;
}

static void tr_step(tr_ep *e) {
    int k = tr_int(e, 0, 99), ci = tr_int(e, 0, e->nc - 1);
    tr_cache *c = &e->c[ci];
    if (k < 30) {
        int n = tr_pct(e, 40) ? 1 : tr_int(e, 1, TR_MAX_BATCH);
        if (c->st.off + n > tr_cap(c)) {
            if (c->kind == KVC_KIND_FULL && c->st.off > 0 && tr_pct(e, 70)) {
                int32_t t = tr_int(e, 0, c->st.off);
                tr_logf(e, "(cap) trim cache %d to %d", ci, t);
                TK_OK(kvc_cache_trim(c->h, c->st.off - t));
                ref_rewind(&c->st, t);
            } else tr_op_clear(e, ci);
        } else tr_op_append(e, ci, n, 1);
    } else if (k < 36) tr_op_trim(e, ci);
    else if (k < 42) tr_op_live_restore(e, ci);
    else if (k < 49) tr_op_take(e, ci, tr_pick_from(e, ci));
    else if (k < 52) tr_op_chain(e, ci);
    else if (k < 62) tr_op_restore(e);
    else if (k < 66) tr_op_probe(e);
    else if (k < 73) tr_op_merge(e);
    else if (k < 78) tr_op_split(e);
    else if (k < 81) { if (e->ns > 0) tr_op_snap_free(e, tr_int(e, 0, e->ns - 1)); else TK_OK(kvc_snapshot_free(NULL)); }
    else if (k < 84) tr_op_fork(e, ci);
    else if (k < 86) { if (e->nc > 2) tr_destroy_cache(e, ci); else tr_op_fork(e, ci); }
    else if (k < 87) { if (e->nc < TR_MAX_CACHES) tr_new_cache(e, tr_pct(e, 50) ? KVC_KIND_FULL : KVC_KIND_ROTATING); }
    else if (k < 89) tr_op_clear(e, ci);
    else if (k < 94) { if (e->px.h == NULL) tr_op_prefix_create(e); else tr_op_prefix_session(e); }
    else if (k < 96) {
        if (e->px.h == NULL) tr_op_prefix_create(e);
        else if (tr_pct(e, 50)) { int32_t tok[48], n = tr_make_prompt(e, tok), reused; tr_prefix_begin(e, tok, n, &reused); }
        else { int32_t gen[4] = {1, 2, 3, 0}; tr_prefix_close(e, gen, tr_int(e, 0, 4)); }
    } else if (k < 97) { if (tr_pct(e, 50)) tr_prefix_drop(e); else tr_op_prefix_create(e); }
    else tr_op_invalid(e, ci);
}

static void tr_dump_log(tr_ep *e) {
    int i, first = e->nlog > TR_LOG ? e->nlog - TR_LOG : 0;
    fprintf(stderr, "  last operations of episode %d (seed %llu):\n", e->index, e->seed);
    for (i = first; i < e->nlog; ++i) fprintf(stderr, "    %s\n", e->log[i % TR_LOG]);
}

/* A crash (an assert in the library, a bad access) still shows how the episode got there. */
static tr_ep *tr_current;
static void tr_on_signal(int sig) {
    signal(sig, SIG_DFL);
    if (tr_current != NULL) {
        fprintf(stderr, "signal %d in episode %d, step %d\n", sig, tr_current->index, tr_current->step);
        tr_dump_log(tr_current);
    }
    raise(sig);
}

/* One episode; returns 1 when it passed. */
static int tr_episode(unsigned long long seed, int index) {
    tr_ep *e = (tr_ep *)calloc(1, sizeof(tr_ep));
    int steps, failed0 = tk_failed, ok = 1;
    if (e == NULL) { fprintf(stderr, "out of memory\n"); exit(2); }
    e->seed = seed;
    e->index = index;
    e->rng.s = tr_mix(seed ^ tr_mix((unsigned long long)index + 1)) | 1;
    tr_current = e;
    if (tr_setup(e)) {
        tr_check_all(e);
        steps = tr_int(e, 20, 220);
        for (e->step = 1; e->step <= steps; ++e->step) {
            tr_step(e);
            tr_check_all(e);
            if (e->step % 3 == 0 && e->nc > 0) {
                int ci = tr_int(e, 0, e->nc - 1);
                tr_check_attention(e, ci, &e->c[ci].st, tr_int(e, 0, e->L - 1));
            }
            if (tk_failed != failed0) break;
        }
    }
    if (tk_failed != failed0) {
        fprintf(stderr, "episode %d failed at step %d (replay: test_random %llu %d)\n", index, e->step, seed, index);
        tr_dump_log(e);
        ok = 0;
    }
    e->step = -1;
    tr_teardown(e);
    if (ok && tk_failed != failed0) {
        fprintf(stderr, "episode %d failed in teardown (replay: test_random %llu %d)\n", index, seed, index);
        tr_dump_log(e);
        ok = 0;
    }
    tr_current = NULL;
    free(e->vals);
    free(e);
    return ok;
}

#if TR_POSIX
/* Run episodes [first, end) in child processes, a batch per child, so that a crash fails
   only the episode it happened in: the child reports each finished episode through a
   pipe, and after a crash the next child starts after the crashed episode. */
#define TR_BATCH 25
static void tr_run_forked(unsigned long long seed, int first, int end, int *n_bad) {
    int ep = first;
    while (ep < end) {
        int fds[2], status = 0, last = ep - 1, stop = ep + TR_BATCH < end ? ep + TR_BATCH : end;
        long rec[4];
        size_t got = 0;
        pid_t pid;
        if (pipe(fds) != 0) { /* no pipe: run in this process */
            for (; ep < stop; ++ep) *n_bad += !tr_episode(seed, ep);
            continue;
        }
        fflush(stdout);
        fflush(stderr);
        pid = fork();
        if (pid < 0) {
            close(fds[0]);
            close(fds[1]);
            for (; ep < stop; ++ep) *n_bad += !tr_episode(seed, ep);
            continue;
        }
        if (pid == 0) {
            int fd, i;
            close(fds[0]);
            if (*n_bad >= 3 && (fd = open("/dev/null", O_WRONLY)) >= 0) { dup2(fd, 2); close(fd); } /* enough detail */
            for (i = ep; i < stop; ++i) {
                int p0 = tk_passed, f0 = tk_failed, ok = tr_episode(seed, i);
                rec[0] = i;
                rec[1] = tk_passed - p0;
                rec[2] = tk_failed - f0;
                rec[3] = ok;
                if (write(fds[1], rec, sizeof(rec)) != (ssize_t)sizeof(rec)) exit(3);
            }
            close(fds[1]);
            exit(0); /* exit, not _exit: sanitizers and valgrind check the child too */
        }
        close(fds[1]);
        for (;;) {
            ssize_t n = read(fds[0], (char *)rec + got, sizeof(rec) - got);
            if (n <= 0) break;
            got += (size_t)n;
            if (got == sizeof(rec)) {
                tk_passed += (int)rec[1];
                tk_failed += (int)rec[2];
                if (!rec[3]) ++*n_bad;
                last = (int)rec[0];
                got = 0;
            }
        }
        close(fds[0]);
        while (waitpid(pid, &status, 0) < 0) {}
        if (last < stop - 1) { /* the child died in episode last + 1 */
            tk_failed++;
            ++*n_bad;
            if (WIFSIGNALED(status))
                fprintf(stderr, "episode %d crashed with signal %d (replay: test_random %llu %d)\n", last + 1,
                        WTERMSIG(status), seed, last + 1);
            else
                fprintf(stderr, "episode %d ended the process with status %d (replay: test_random %llu %d)\n",
                        last + 1, WIFEXITED(status) ? WEXITSTATUS(status) : -1, seed, last + 1);
            ep = last + 2;
        } else {
            if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) { /* e.g. valgrind or LeakSanitizer at exit */
                tk_failed++;
                ++*n_bad;
                fprintf(stderr, "episodes %d..%d: the process ended with status %d after them\n", ep, stop - 1,
                        WIFEXITED(status) ? WEXITSTATUS(status) : -1);
            }
            ep = stop;
        }
    }
}
#endif

int main(int argc, char **argv) {
    unsigned long long seed;
    int n_ep, ep, only = -1, n_bad = 0, fork_ok = TR_POSIX;
    const char *nf = getenv("KVC_RANDOM_NOFORK");
    if (argc > 1) seed = strtoull(argv[1], NULL, 10);
#if TR_POSIX
    else seed = (unsigned long long)time(NULL) ^ ((unsigned long long)getpid() << 16);
#else
    else seed = (unsigned long long)time(NULL) ^ (unsigned long long)clock();
#endif
    if (argc > 2) only = atoi(argv[2]);
    signal(SIGABRT, tr_on_signal);
    signal(SIGFPE, tr_on_signal);
    signal(SIGILL, tr_on_signal);
#if !TR_ASAN /* AddressSanitizer's own report of a bad access is worth more */
    signal(SIGSEGV, tr_on_signal);
#endif
    if ((nf != NULL && atoi(nf) != 0) || only >= 0) fork_ok = 0;
    printf("seed %llu\n", seed);
    fflush(stdout);
    n_ep = (int)(TR_EPISODES * tk_scale());
    if (n_ep < 1) n_ep = 1;
    if (only >= 0) n_bad = !tr_episode(seed, only);
#if TR_POSIX
    else if (fork_ok) tr_run_forked(seed, 0, n_ep, &n_bad);
#endif
    else
        for (ep = 0; ep < n_ep; ++ep) n_bad += !tr_episode(seed, ep);
    (void)fork_ok;
    if (only < 0) printf("%d episodes, %d failed\n", n_ep, n_bad);
    else printf("episode %d %s\n", only, n_bad ? "failed" : "passed");
    return tk_report("random");
}
