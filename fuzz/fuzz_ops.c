/* fuzz/fuzz_ops.c - libFuzzer target: operation sequences on every cache kind, decoded
   from the input bytes and checked against a deliberately simple reference.

   The first bytes choose a pool (1-2 layers, 1-2 kv heads, K and V head sizes 1-8, f32 or
   f16 for K and V, 1-8 cells per page, a budget of 1-48 pages) and how it gets memory:
   the default allocator, an allocator that refuses a pattern of allocations (then every
   call that allocates may answer KVC_ERR_NO_MEMORY, and must then change nothing), or an
   arena whose object part is sometimes tiny. Every later byte starts an operation on up
   to 4 caches of any kind, 6 snapshots and one kvc_prefix; its parameters come from the
   bytes after it (a missing byte reads as 0).

   Reference:
   - FULL / ROTATING: tests/ref_model.h (shared with tests/test_random.c): the tokens at
     positions [0, offset) (a token is a uid; its K/V are a function of it, exact in f16),
     the first token of the last batch (the rotating window's anchor) and whether a
     window page was released (the window "wrapped").
   - CAUSAL: a map (sequence, position) -> token with a cell identity (copy_prefix shares
     cells) and the token's current K (kvc_seq_remove re-rotates it: by a callback that
     adds (new - old) / 8, exact in f16, or by the library's NeoX / interleaved RoPE, which
     the reference repeats in double).
   - snapshots: copies of those states; the prefix object: its token lists.
   Every result code is predicted (KVC_ERR_FULL from page and cell counts, FOREIGN,
   UNREACHABLE, SHARED, NOT_FOUND, ...). After every operation each cache is compared:
   offset, cells, pages, can_trim, kvc_cache_gather of every layer bit-exact (FULL and
   ROTATING), every (sequence, position)'s V bit-exact through a window-1 attention query,
   positions ranges, the batch's gathered cells, mask export and attention against a
   double-precision reference (CAUSAL), pool statistics; at the end every object is
   freed and the pool must be empty (and the counting allocator back to zero blocks).
   A mismatch prints what differs and the last operations, then aborts (a crash for
   libFuzzer; fuzz/fuzz_replay.c prints the input file to replay). */
#define KVCACHE_IMPLEMENTATION
#include "../kvcache.h"
#include "fuzz_util.h"
#include "../tests/ref_model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FZ_L 2
#define FZ_H 2
#define FZ_D 8
#define FZ_ROW (FZ_H * FZ_D)
#define FZ_CACHES 4
#define FZ_SNAPS 6
#define FZ_TOK 160        /* a ROTATING cache is not grown past this (ref_state holds more) */
#define FZ_FULL_CAP 96    /* a FULL cache is not grown past this */
#define FZ_BATCH 8
#define FZ_SEQS 4         /* CAUSAL sequences used (max_seqs is 4 or 256) */
#define FZ_POS 48         /* CAUSAL positions used */
#define FZ_PTOK 32        /* prefix: prompt and max_tokens bound */
#define FZ_STEPS 400      /* operations per input at most */

/* ---- input (this target's reader; the rest of the input and failure handling: fuzz_util.h) */
/* [lo, hi], hi - lo < 65536: reads one byte even when lo >= hi, a second when the span
   exceeds 256 (unlike fuzz_int; the corpus was made with this reader) */
static int fz_int(fuzz_in *in, int lo, int hi) {
    unsigned span = (unsigned)(hi - lo + 1), v = fuzz_byte(in);
    if (lo >= hi) return lo;
    if (span > 256) v |= fuzz_byte(in) << 8;
    return lo + (int)(v % span);
}

/* ---- memory: a counting allocator that refuses a pattern of allocations --------------- */
static long fz_live_blocks, fz_alloc_calls;
static unsigned fz_fail_mask, fz_fail_phase; /* allocation k fails if ((k + phase) & mask) == 0 */
static int fz_may_oom;                       /* calls that allocate may say KVC_ERR_NO_MEMORY */
static void *fz_alloc(size_t n, void *user) {
    void *p;
    (void)user;
    fz_alloc_calls++;
    if (fz_fail_mask && (((unsigned)fz_alloc_calls + fz_fail_phase) & fz_fail_mask) == 0) return NULL;
    p = malloc(n);
    if (p) fz_live_blocks++;
    return p;
}
static void fz_free(void *p, void *user) {
    (void)user;
    if (p) fz_live_blocks--;
    free(p);
}

/* ---- token values ------------------------------------------------------------------- */
static uint32_t fz_hash(uint32_t x) {
    x ^= x >> 16; x *= 0x7feb352du; x ^= x >> 15; x *= 0x846ca68bu; x ^= x >> 16;
    return x;
}
/* K in [-4, 4] and V in [-64, 64], multiples of 1/8: exact in f16. V[0] of layer 0 is
   uid % 2000 + 1, never 0, so a cell's V names its token and a visible cell is never 0. */
static float fz_kval(uint32_t uid, int l, int i) {
    uint32_t x = fz_hash(uid * 0x9e3779b1u ^ fz_hash((uint32_t)(l * 256 + i) + 1u));
    return (float)((int)(x % 65u) - 32) / 8.0f;
}
static float fz_vval(uint32_t uid, int l, int i) {
    uint32_t x = fz_hash(uid * 0x85ebca6bu ^ fz_hash((uint32_t)(l * 256 + i) + 77u));
    if (l == 0 && i == 0) return (float)(uid % 2000u + 1u);
    return (float)((int)(x % 1025u) - 512) / 8.0f;
}

/* ---- reference state ---------------------------------------------------------------- */
typedef struct fz_entry {        /* CAUSAL: one (sequence, position) */
    uint32_t uid;                /* 0: none */
    int32_t cell;                /* identity shared by copy_prefix */
    float k[FZ_L][FZ_ROW];       /* current K (re-rotated by shifts) */
    int rotated;                 /* the library's RoPE rotated it, in any cache it was in */
} fz_entry;

typedef struct fz_seqmap {
    fz_entry e[FZ_SEQS][FZ_POS];
} fz_seqmap;

typedef struct fz_cache {
    kvc_cache *h;
    kvc_kind kind;
    uint32_t serial;
    int32_t W, S;                /* ROTATING */
    ref_state st;
    int32_t cap, window, chunk;  /* CAUSAL */
    int rope;                    /* 0 none, 1 callback, 2 NeoX, 3 interleaved */
    int32_t rope_dims;
    fz_seqmap m;
} fz_cache;

typedef struct fz_snap {
    kvc_snapshot *h;
    uint32_t owner;              /* serial of its cache (CAUSAL: 0, any causal cache) */
    kvc_kind kind;
    int32_t W, S;                /* its cache's window and sinks */
    int32_t from, to;
    ref_state st;
    fz_entry seq[FZ_POS];        /* CAUSAL */
} fz_snap;

typedef struct fz_prefix {
    kvc_prefix *h;
    int n_c;
    uint32_t serial[FZ_CACHES];
    int32_t max_tokens, tok[FZ_PTOK], n, prompt[FZ_PTOK], n_prompt;
    int open;
    uint32_t changes[FZ_CACHES]; /* the caches' ref changes when tok was recorded */
} fz_prefix;

typedef struct fz_world {
    fuzz_in in;
    int L, H, hk, hv, pc;
    kvc_type tk, tv;
    int32_t pages_total;
    kvc_pool *pool;
    void *arena;
    fz_cache c[FZ_CACHES];
    int nc;
    fz_snap s[FZ_SNAPS];
    int ns;
    fz_prefix px;
    uint32_t next_uid, next_serial;
    int32_t next_cell;
    unsigned long long rng;      /* query values: not worth input bytes */
    int rescan;                  /* an operation moved or removed causal cells: scan them all */
    float k[FZ_BATCH * FZ_ROW], v[FZ_BATCH * FZ_ROW];
    float gk[FZ_TOK * FZ_ROW], gv[FZ_TOK * FZ_ROW];
    int32_t gpos[FZ_TOK];
    float q[FZ_BATCH * 3 * FZ_ROW], out[FZ_BATCH * 3 * FZ_ROW];
} fz_world;

static fz_world W_; /* one input at a time; reset for each */

static float fz_rand(fz_world *w) { /* [-1, 1) */
    unsigned long long x = w->rng;
    x ^= x << 13; x ^= x >> 7; x ^= x << 17;
    w->rng = x;
    return (float)((double)(x >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* parameters of checks come from here, so that checking does not eat operation bytes */
static int fz_rint(fz_world *w, int lo, int hi) {
    float r = fz_rand(w);
    int v = lo + (int)((r + 1.0f) * 0.5f * (float)(hi - lo + 1));
    return v > hi ? hi : v;
}

static int32_t fz_ceil_div(int32_t a, int32_t b) { return a <= 0 ? 0 : (a + b - 1) / b; }

static int32_t fz_free_pages(fz_world *w) {
    kvc_pool_stats st;
    FUZZ_RES(kvc_pool_stats_get(w->pool, &st), KVC_OK);
    return st.pages_total - st.pages_used;
}

/* f32 -> storage type -> f32, for the reference's copy of re-rotated keys */
static float fz_store_k(const fz_world *w, float x) {
    return w->tk == KVC_TYPE_F16 ? kvc__f16_to_f32(kvc__f32_to_f16(x)) : x;
}

/* ---- FULL / ROTATING semantics (tests/ref_model.h, with this cache's window and sinks) */
static int fz_view(const fz_cache *c, const ref_state *st, int32_t *pos) { return ref_view(c->kind, c->W, c->S, st, pos); }
static int fz_wrapped(const fz_cache *c, const ref_state *st) { return ref_wrapped(c->kind, c->W, st); }
static int fz_find_cache(const fz_world *w, uint32_t serial) {
    int i;
    for (i = 0; i < w->nc; ++i)
        if (w->c[i].serial == serial) return i;
    return -1;
}

/* ---- CAUSAL semantics (as tests/test_causal.c) ------------------------------------------- */
static int fz_has(const fz_cache *c, int s, int p) { return c->m.e[s][p].uid != 0; }
static int fz_cells_used(const fz_cache *c) { /* distinct cell identities */
    int32_t seen[FZ_SEQS * FZ_POS];
    int n = 0, s, p, j;
    for (s = 0; s < FZ_SEQS; ++s)
        for (p = 0; p < FZ_POS; ++p)
            if (fz_has(c, s, p)) {
                for (j = 0; j < n && seen[j] != c->m.e[s][p].cell; ++j) {}
                if (j == n) seen[n++] = c->m.e[s][p].cell;
            }
    return n;
}
static int fz_cell_shared(const fz_cache *c, int s, int32_t cell) {
    int t, p;
    for (t = 0; t < FZ_SEQS; ++t)
        for (p = 0; p < FZ_POS; ++p)
            if (t != s && fz_has(c, t, p) && c->m.e[t][p].cell == cell) return 1;
    return 0;
}
static int fz_max_pos(const fz_cache *c, int s) {
    int p, hi = -1;
    for (p = 0; p < FZ_POS; ++p) if (fz_has(c, s, p)) hi = p;
    return hi;
}
static int fz_min_pos(const fz_cache *c, int s) {
    int p;
    for (p = 0; p < FZ_POS; ++p) if (fz_has(c, s, p)) return p;
    return -1;
}
static int fz_dead(const fz_cache *c, const int *minpos, int s, int p) {
    return c->window > 0 && minpos[s] >= 0 && p <= minpos[s] - c->window;
}
/* cells whose every holder is out of the window of its sequence's first batch token */
static int fz_freeable(const fz_cache *c, const int *minpos) {
    int s, p, t, q, n = 0;
    for (s = 0; s < FZ_SEQS; ++s)
        for (p = 0; p < FZ_POS; ++p) {
            int first = 1, all = 1;
            if (!fz_has(c, s, p)) continue;
            for (t = 0; t < FZ_SEQS && first; ++t)   /* count each cell at its first holder */
                for (q = 0; q < FZ_POS; ++q)
                    if ((t < s || (t == s && q < p)) && fz_has(c, t, q) && c->m.e[t][q].cell == c->m.e[s][p].cell) {
                        first = 0;
                        break;
                    }
            if (!first) continue;
            for (t = 0; t < FZ_SEQS; ++t)
                for (q = 0; q < FZ_POS; ++q)
                    if (fz_has(c, t, q) && c->m.e[t][q].cell == c->m.e[s][p].cell && !fz_dead(c, minpos, t, q)) all = 0;
            n += all;
        }
    return n;
}
static int fz_visible(const fz_cache *c, int key, int p, int nc, int window) {
    if (!nc && key > p) return 0;
    if (c->window > 0 && key <= p - c->window) return 0;
    if (window > 0 && key <= p - window) return 0;
    if (c->chunk > 0 && key / c->chunk != p / c->chunk) return 0;
    return 1;
}

/* a caller's own re-rotation: every key value moves by (new - old) / 8, exact in f16 */
static void fz_shift_cb(void *user, int32_t layer, float *k, int32_t heads, int32_t dim, int32_t old_pos,
                        int32_t new_pos) {
    int32_t i;
    (void)user;
    (void)layer;
    for (i = 0; i < heads * dim; ++i) k[i] += (float)(new_pos - old_pos) / 8.0f;
}

/* the reference's re-rotation of one entry's keys, the library's formula in double */
static void fz_rotate(const fz_world *w, const fz_cache *c, fz_entry *e, int32_t delta) {
    int l, h, i, n = c->rope_dims, half = n / 2;
    for (l = 0; l < w->L; ++l)
        for (h = 0; h < w->H; ++h) {
            float *x = e->k[l] + h * w->hk;
            if (c->rope == 1) {
                for (i = 0; i < w->hk; ++i) x[i] = fz_store_k(w, x[i] + (float)delta / 8.0f);
                continue;
            }
            e->rotated = 1;
            for (i = 0; i < half; ++i) {
                double angle = (double)delta * pow(10000.0, -2.0 * i / n);
                int i0 = c->rope == 2 ? i : 2 * i, i1 = c->rope == 2 ? i + half : 2 * i + 1;
                double a = x[i0], b = x[i1];
                x[i0] = fz_store_k(w, (float)(a * cos(angle) - b * sin(angle)));
                x[i1] = fz_store_k(w, (float)(b * cos(angle) + a * sin(angle)));
            }
        }
}

/* keys equal, exactly unless the library's RoPE rotated them, then within rounding: it
   rotates in float, the reference in double. The entry remembers, so a key restored from
   another cache's snapshot into one without RoPE keeps the tolerance. */
static int fz_k_close(const fz_entry *e, float got, float want) {
    if (!e->rotated) return got == want;
    return fabs((double)got - (double)want) <= 2e-3 * (1.0 + fabs((double)want));
}

/* ---- checks --------------------------------------------------------------------------- */
static void fz_check_lin(fz_world *w, int ci) {
    fz_cache *c = &w->c[ci];
    int32_t view[FZ_TOK], off = -1, cells = -1, pages = -1, n = -1, nr = -1;
    int nview = fz_view(c, &c->st, view), can = -1, l, j, i, nk = w->H * w->hk, nv = w->H * w->hv;
    FUZZ_RES(kvc_cache_offset(c->h, &off), KVC_OK);
    FUZZ_CHECK(off == c->st.off, "cache %d: offset %d, reference %d", ci, off, c->st.off);
    FUZZ_RES(kvc_cache_cells(c->h, &cells), KVC_OK);
    FUZZ_CHECK(cells == nview, "cache %d: %d cells, reference %d", ci, cells, nview);
    FUZZ_RES(kvc_cache_pages(c->h, &pages), KVC_OK);
    if (c->kind == KVC_KIND_FULL)
        FUZZ_CHECK(pages == fz_ceil_div(c->st.off, w->pc), "cache %d: %d pages for %d tokens", ci, pages, c->st.off);
    FUZZ_RES(kvc_cache_can_trim(c->h, &can), KVC_OK);
    FUZZ_CHECK((can != 0) == !fz_wrapped(c, &c->st), "cache %d: can_trim %d", ci, can);
    for (l = 0; l < w->L; ++l) {
        FUZZ_RES(kvc_cache_gather(c->h, l, w->gk, w->gv, w->gpos, FZ_TOK, &n), KVC_OK);
        FUZZ_CHECK(n == nview, "cache %d: gather %d cells, reference %d", ci, n, nview);
        for (j = 0; j < n; ++j) {
            uint32_t uid = c->st.uid[view[j]];
            FUZZ_CHECK(w->gpos[j] == view[j], "cache %d layer %d cell %d: pos %d, want %d", ci, l, j, w->gpos[j], view[j]);
            for (i = 0; i < nk; ++i)
                FUZZ_CHECK(w->gk[j * nk + i] == fz_kval(uid, l, i), "cache %d layer %d pos %d: K[%d] %g, want %g", ci, l,
                         view[j], i, (double)w->gk[j * nk + i], (double)fz_kval(uid, l, i));
            for (i = 0; i < nv; ++i)
                FUZZ_CHECK(w->gv[j * nv + i] == fz_vval(uid, l, i), "cache %d layer %d pos %d: V[%d] %g, want %g", ci, l,
                         view[j], i, (double)w->gv[j * nv + i], (double)fz_vval(uid, l, i));
        }
        FUZZ_RES(kvc_cache_runs(c->h, l, NULL, 0, &nr), KVC_OK);
        FUZZ_CHECK(nr >= (n > 0) && nr <= n, "cache %d: %d runs for %d cells", ci, nr, n);
    }
}

/* Whether a FULL / ROTATING query at p sees token t (the documented masks). */
static int fz_lin_visible(const fz_cache *c, const kvc_attention_desc *d, int32_t t, int32_t p) {
    return ref_visible(c->kind, c->W, c->S, d->non_causal, d->window, t, p);
}

/* Attention of a few queries against a double reference (FULL / ROTATING). */
static void fz_check_lin_attention(fz_world *w, int ci, int layer) {
    fz_cache *c = &w->c[ci];
    kvc_attention_desc d;
    int32_t qpos[4], nq = fz_rint(w, 1, 4), g = fz_rint(w, 1, 3), nh = w->H * g, lo, qi, h, i, t;
    double scale;
    if (c->st.off == 0) return;
    memset(&d, 0, sizeof(d));
    lo = c->kind == KVC_KIND_FULL ? fuzz_max(0, c->st.off - 12) : c->st.bb; /* cells the cache still holds */
    for (qi = 0; qi < nq; ++qi) qpos[qi] = fz_rint(w, lo, c->st.off);
    for (i = 0; i < nq * nh * w->hk; ++i) w->q[i] = fz_rand(w);
    d.n_queries = nq; d.n_heads = nh; d.q = w->q; d.pos = qpos; d.out = w->out;
    d.window = fz_rint(w, 0, 12);
    d.non_causal = fz_rint(w, 0, 7) == 0;
    FUZZ_RES(kvc_attention(c->h, layer, &d), KVC_OK);
    scale = 1.0 / sqrt((double)w->hk);
    for (qi = 0; qi < nq; ++qi)
        for (h = 0; h < nh; ++h) {
            const float *q = w->q + (qi * nh + h) * w->hk, *o = w->out + (qi * nh + h) * w->hv;
            double m = -1e300, sum = 0.0, acc[FZ_D], vmax = 0.0, sc[FZ_TOK];
            int kvh = h / g, any = 0;
            for (i = 0; i < w->hv; ++i) acc[i] = 0.0;
            for (t = 0; t < c->st.off; ++t) {
                if (!fz_lin_visible(c, &d, t, qpos[qi])) continue;
                sc[t] = 0.0;
                for (i = 0; i < w->hk; ++i) sc[t] += (double)q[i] * fz_kval(c->st.uid[t], layer, kvh * w->hk + i);
                sc[t] *= scale;
                if (sc[t] > m) m = sc[t];
                any = 1;
            }
            for (t = 0; any && t < c->st.off; ++t) {
                double e;
                if (!fz_lin_visible(c, &d, t, qpos[qi])) continue;
                e = exp(sc[t] - m);
                sum += e;
                for (i = 0; i < w->hv; ++i) {
                    double v = fz_vval(c->st.uid[t], layer, kvh * w->hv + i);
                    acc[i] += e * v;
                    if (fabs(v) > vmax) vmax = fabs(v);
                }
            }
            for (i = 0; i < w->hv; ++i) {
                double want = any ? acc[i] / sum : 0.0;
                FUZZ_CHECK(fabs((double)o[i] - want) <= 1e-4 * (1.0 + vmax),
                         "cache %d layer %d query pos %d head %d dim %d: attention %.9g, reference %.9g (window %d nc %d)",
                         ci, layer, qpos[qi], h, i, (double)o[i], want, d.window, d.non_causal);
            }
        }
}

/* CAUSAL: attention of one query (seq s, pos p) against the reference map */
static void fz_causal_ref_attend(const fz_world *w, const fz_cache *c, int s, int p, int nc, int window, int layer,
                                 const float *q, int nh, const float *o) {
    int g = nh / w->H, h, key, i;
    double kulp = w->tk == KVC_TYPE_F16 ? 1.0 / 1024.0 : 1.0 / 8388608.0; /* a rounding step, relative */
    for (h = 0; h < nh; ++h) {
        double m = -1e300, sum = 0.0, acc[FZ_D], vmax = 0.0, sc[FZ_POS], ds = 0.0;
        int kvh = h / g, any = 0;
        for (i = 0; i < w->hv; ++i) acc[i] = 0.0;
        for (key = 0; key < FZ_POS; ++key) {
            const fz_entry *e = &c->m.e[s][key];
            double dk = 0.0;
            sc[key] = -1e301;
            if (!fz_has(c, s, key) || !fz_visible(c, key, p, nc, window)) continue;
            sc[key] = 0.0;
            for (i = 0; i < w->hk; ++i) {
                double k = e->k[layer][kvh * w->hk + i];
                sc[key] += (double)q[h * w->hk + i] * k;
                dk += fabs((double)q[h * w->hk + i]) * (kulp * fabs(k) + 1e-6);
            }
            sc[key] /= sqrt((double)w->hk);
            if (e->rotated && dk / sqrt((double)w->hk) > ds) ds = dk / sqrt((double)w->hk);
            if (sc[key] > m) m = sc[key];
            any = 1;
        }
        for (key = 0; any && key < FZ_POS; ++key) {
            double e;
            if (sc[key] < -1e300) continue;
            e = exp(sc[key] - m);
            sum += e;
            for (i = 0; i < w->hv; ++i) {
                double v = fz_vval(c->m.e[s][key].uid, layer, kvh * w->hv + i);
                acc[i] += e * v;
                if (fabs(v) > vmax) vmax = fabs(v);
            }
        }
        /* a key the library's RoPE rotated (in float, then stored) may be the reference's
           (double, then stored) one rounding step of the storage type apart, so each score
           within ds: the weights move by at most 2 ds in sum (to first order), the output by
           at most 2 ds vmax */
        for (i = 0; i < w->hv; ++i) {
            double want = any ? acc[i] / sum : 0.0;
            FUZZ_CHECK(fabs((double)o[h * w->hv + i] - want) <= 1e-4 * (1.0 + vmax) + 2.0 * ds * vmax,
                     "causal attention seq %d pos %d layer %d head %d dim %d: %.9g, reference %.9g (nc %d window %d)", s,
                     p, layer, h, i, (double)o[h * w->hv + i], want, nc, window);
        }
    }
}

static void fz_check_causal(fz_world *w, int ci) {
    fz_cache *c = &w->c[ci];
    kvc_attention_desc d;
    int32_t used = -1, lo, hi, s, i, qs, qp;
    int layer = fz_rint(w, 0, w->L - 1);
    FUZZ_RES(kvc_cache_offset(c->h, &used), KVC_OK);
    FUZZ_CHECK(used == fz_cells_used(c), "causal cache %d: %d cells used, reference %d", ci, used, fz_cells_used(c));
    for (s = 0; s < FZ_SEQS; ++s) {
        FUZZ_RES(kvc_seq_pos_range(c->h, s, &lo, &hi), KVC_OK);
        FUZZ_CHECK(lo == fz_min_pos(c, s) && hi == fz_max_pos(c, s), "causal cache %d seq %d: pos range [%d, %d], want [%d, %d]",
                 ci, s, lo, hi, fz_min_pos(c, s), fz_max_pos(c, s));
    }
    /* every (sequence, position) up to one past its last (the ranges above say nothing
       lies beyond): a window-1 query sees exactly that cell, so the output is its V,
       bit-exact, or zeros when the sequence holds no such position. It is the costly
       check: after operations that move or drop cells, and every 4th step otherwise. */
    memset(&d, 0, sizeof(d));
    for (i = 0; i < w->H * w->hk; ++i) w->q[i] = 0.0f;
    d.n_queries = 1; d.n_heads = w->H; d.q = w->q; d.out = w->out; d.window = 1;
    d.pos = &qp; d.seq = &qs;
    for (qs = 0; qs < FZ_SEQS && (w->rescan || fuzz_step % 4 == 0); ++qs)
        for (qp = 0; qp <= fz_max_pos(c, qs) + 1 && qp < FZ_POS; ++qp) {
            FUZZ_RES(kvc_attention(c->h, layer, &d), KVC_OK);
            for (i = 0; i < w->H * w->hv; ++i) {
                float want = fz_has(c, qs, qp) ? fz_vval(c->m.e[qs][qp].uid, layer, i) : 0.0f;
                FUZZ_CHECK(w->out[i] == want, "causal cache %d seq %d pos %d layer %d: V[%d] %g, want %g", ci, qs, qp, layer,
                         i, (double)w->out[i], (double)want);
            }
        }
    /* one query against the double reference (K matters here) */
    {
        int nh = w->H * fz_rint(w, 1, 3);
        qs = fz_rint(w, 0, FZ_SEQS - 1);
        qp = fz_rint(w, 0, FZ_POS - 1);
        for (i = 0; i < nh * w->hk; ++i) w->q[i] = fz_rand(w);
        d.n_heads = nh;
        d.window = fz_rint(w, 0, 8);
        d.non_causal = fz_rint(w, 0, 5) == 0;
        FUZZ_RES(kvc_attention(c->h, layer, &d), KVC_OK);
        fz_causal_ref_attend(w, c, qs, qp, d.non_causal, d.window, layer, w->q, nh, w->out);
    }
}

static void fz_check_all(fz_world *w) {
    kvc_pool_stats st;
    int i;
    for (i = 0; i < w->nc; ++i) {
        if (w->c[i].kind == KVC_KIND_CAUSAL) fz_check_causal(w, i);
        else fz_check_lin(w, i);
    }
    FUZZ_RES(kvc_pool_stats_get(w->pool, &st), KVC_OK);
    FUZZ_CHECK(st.live_caches == w->nc && st.live_snapshots == w->ns && st.live_prefixes == (w->px.h != NULL),
             "live objects %d %d %d, reference %d %d %d", st.live_caches, st.live_snapshots, st.live_prefixes, w->nc,
             w->ns, w->px.h != NULL);
    FUZZ_CHECK(st.pages_used >= 0 && st.pages_used <= st.pages_total && st.pages_total == w->pages_total,
             "pages used %d of %d", st.pages_used, st.pages_total);
    for (i = 0; i < w->ns; ++i) {
        kvc_snapshot_info info;
        FUZZ_RES(kvc_snapshot_info_get(w->s[i].h, &info), KVC_OK);
        if (w->s[i].kind != KVC_KIND_ROTATING)
            FUZZ_CHECK(info.from == w->s[i].from && info.to == w->s[i].to, "snapshot %d: [%d, %d), want [%d, %d)", i,
                     info.from, info.to, w->s[i].from, w->s[i].to);
        if (w->s[i].kind == KVC_KIND_FULL)
            FUZZ_CHECK(info.n_pages == (w->s[i].to - 1) / w->pc - w->s[i].from / w->pc + 1, "snapshot %d: %d pages", i,
                     info.n_pages);
    }
    if (w->px.h != NULL) {
        const int32_t *toks = NULL;
        int32_t nt = -1;
        FUZZ_RES(kvc_prefix_tokens(w->px.h, &toks, &nt), KVC_OK);
        FUZZ_CHECK(nt == w->px.n && (nt == 0 || memcmp(toks, w->px.tok, sizeof(int32_t) * (size_t)nt) == 0),
                 "prefix tokens: %d, reference %d", nt, w->px.n);
    }
}

/* ---- operations: FULL / ROTATING ------------------------------------------------------- */
static void fz_fill(fz_world *w, const uint32_t *uids, int n, int l) {
    int i, j, nk = w->H * w->hk, nv = w->H * w->hv;
    for (i = 0; i < n; ++i) {
        for (j = 0; j < nk; ++j) w->k[i * nk + j] = fz_kval(uids[i], l, j);
        for (j = 0; j < nv; ++j) w->v[i * nv + j] = fz_vval(uids[i], l, j);
    }
}

/* begin + put every layer (maybe cancelled); 1 when appended */
static int fz_append(fz_world *w, int ci, int n) {
    fz_cache *c = &w->c[ci];
    ref_state after;
    uint32_t uids[FZ_BATCH];
    int32_t o = c->st.off, free0 = fz_free_pages(w), need_lo, need_hi;
    int r, l, i, cancel_at = -1, mode = (int)fuzz_byte(&w->in);
    if (o + n > (c->kind == KVC_KIND_FULL ? FZ_FULL_CAP : FZ_TOK)) return 0;
    need_lo = fz_ceil_div(o + n, w->pc) - fz_ceil_div(o, w->pc);
    need_hi = need_lo + (o % w->pc != 0);
    fuzz_note("append cache %d n %d (offset %d, free %d)", ci, n, o, free0);
    r = kvc_begin(c->h, n, NULL, 0);
    if (r == KVC_ERR_NO_MEMORY && fz_may_oom) { /* its page table could not grow */
        FUZZ_CHECK(fz_free_pages(w) == free0, "a refused kvc_begin changed the free pages");
        return 0;
    }
    if (r == KVC_ERR_FULL) {
        FUZZ_CHECK(free0 < need_hi, "kvc_begin(%d) said FULL with %d free pages (needs at most %d)", n, free0, need_hi);
        FUZZ_CHECK(fz_free_pages(w) == free0, "a refused kvc_begin changed the free pages");
        return 0;
    }
    FUZZ_RES(r, KVC_OK);
    if (c->kind == KVC_KIND_FULL) FUZZ_CHECK(free0 >= need_lo, "kvc_begin found pages that were not free");
    for (i = 0; i < n; ++i) uids[i] = ++w->next_uid;
    ref_begin(c->kind, c->W, c->S, w->pc, &c->st, uids, n, &after);
    if (mode % 8 == 0) cancel_at = (int)(mode / 8) % w->L;
    for (l = 0; l < w->L; ++l) {
        if (l == cancel_at) {
            FUZZ_RES(kvc_cancel(c->h), KVC_OK);
            ref_cancel(&c->st, &after);
            fuzz_note("  cancelled after %d layers", l);
            return 0;
        }
        if (mode % 16 == 3 && l + 1 < w->L) { /* junk first: the second put wins (the last layer's put closes the batch) */
            uint32_t junk[FZ_BATCH];
            for (i = 0; i < n; ++i) junk[i] = 0x80000000u + uids[i];
            fz_fill(w, junk, n, l);
            FUZZ_RES(kvc_put(c->h, l, w->k, w->v), KVC_OK);
        }
        fz_fill(w, uids, n, l);
        FUZZ_RES(kvc_put(c->h, l, w->k, w->v), KVC_OK);
        if (l + 1 < w->L && mode % 16 == 5) { /* an open batch refuses what needs it closed */
            kvc_snapshot *sn = NULL;
            kvc_cache *fk = NULL;
            FUZZ_RES(kvc_begin(c->h, 1, NULL, 0), KVC_ERR_STATE);
            FUZZ_RES(kvc_snapshot_take(c->h, 0, KVC_POS_END, &sn), KVC_ERR_STATE);
            FUZZ_RES(kvc_cache_fork(c->h, &fk), KVC_ERR_STATE);
            FUZZ_RES(kvc_cache_trim(c->h, 0), KVC_ERR_STATE);
            FUZZ_RES(kvc_cache_restore(c->h, NULL, 0), KVC_ERR_STATE);
        }
    }
    c->st = after;
    if (mode % 4 == 1) fz_check_lin_attention(w, ci, (int)(mode / 4) % w->L);
    return 1;
}

static void fz_op_trim(fz_world *w, int ci) {
    fz_cache *c = &w->c[ci];
    int32_t n = fz_int(&w->in, -1, 14);
    int r, want;
    fuzz_note("trim cache %d n %d (offset %d)", ci, n, c->st.off);
    r = kvc_cache_trim(c->h, n);
    want = ref_trim_expect(c->kind, c->W, &c->st, n);
    FUZZ_RES(r, want);
    if (r == KVC_OK) ref_trim(&c->st, n);
}

static void fz_op_live_restore(fz_world *w, int ci) {
    fz_cache *c = &w->c[ci];
    int32_t off = c->st.off, target = off - fz_int(&w->in, -2, 12);
    int r, want = ref_live_restore_expect(c->kind, c->W, &c->st, target);
    fuzz_note("live restore cache %d target %d (offset %d)", ci, target, off);
    r = kvc_cache_restore(c->h, NULL, target);
    FUZZ_RES(r, want);
    if (r == KVC_OK) ref_live_restore(c->kind, &c->st, target);
}

static void fz_snap_drop(fz_world *w, int si) {
    w->s[si] = w->s[--w->ns];
}
static void fz_op_snap_free(fz_world *w, int si) {
    fuzz_note("snapshot free %d", si);
    FUZZ_RES(kvc_snapshot_free(w->s[si].h), KVC_OK);
    fz_snap_drop(w, si);
}

static void fz_op_take(fz_world *w, int ci) {
    fz_cache *c = &w->c[ci];
    kvc_snapshot *out = NULL;
    int32_t from = fz_int(&w->in, -2, c->st.off + 1), f0;
    int r;
    if (w->ns == FZ_SNAPS) fz_op_snap_free(w, 0);
    fuzz_note("snapshot take cache %d from %d (offset %d)", ci, from, c->st.off);
    r = kvc_snapshot_take(c->h, from, KVC_POS_END, &out);
    if (r == KVC_ERR_NO_MEMORY && fz_may_oom) return;
    FUZZ_RES(r, KVC_OK);
    f0 = ref_take_from(c->kind, from);
    if (!ref_take_holds(c->kind, &c->st, from)) {
        FUZZ_CHECK(out == NULL, "a snapshot of nothing");
        return;
    }
    FUZZ_CHECK(out != NULL, "no snapshot");
    memset(&w->s[w->ns], 0, sizeof(w->s[w->ns]));
    w->s[w->ns].h = out;
    w->s[w->ns].owner = c->serial;
    w->s[w->ns].kind = c->kind;
    w->s[w->ns].W = c->W;
    w->s[w->ns].S = c->S;
    w->s[w->ns].from = f0;
    w->s[w->ns].to = c->st.off;
    w->s[w->ns].st = c->st;
    w->ns++;
}

/* A snapshot serves any cache of the pool with its kind, window and sinks. */
static int fz_fits(const fz_cache *c, const fz_snap *s) {
    return s->kind == c->kind && s->W == c->W && s->S == c->S;
}

static void fz_op_restore(fz_world *w, int ci) {
    fz_cache *c = &w->c[ci];
    fz_snap *s;
    int32_t target, free0;
    int r, want;
    if (w->ns == 0) return;
    s = &w->s[fz_int(&w->in, 0, w->ns - 1)];
    target = fuzz_byte(&w->in) % 4 ? s->to - fz_int(&w->in, -1, 8) : fz_int(&w->in, -2, s->to + 2);
    if (c->kind == KVC_KIND_CAUSAL) want = KVC_ERR_UNSUPPORTED;
    else if (!fz_fits(c, s)) want = KVC_ERR_FOREIGN;
    else want = ref_restore_expect(c->kind, c->W, &c->st, s->from, s->to, &s->st, target);
    free0 = fz_free_pages(w);
    fuzz_note("restore cache %d (offset %d) from snapshot [%d, %d) target %d, want %d", ci, c->st.off, s->from, s->to,
            target, want);
    r = kvc_cache_restore(c->h, s->h, target);
    if (r == KVC_ERR_NO_MEMORY && fz_may_oom && want == KVC_OK) { /* its page table could not grow */
        FUZZ_CHECK(fz_free_pages(w) == free0, "a refused kvc_cache_restore changed the free pages");
        return;
    }
    if (r == KVC_ERR_FULL && want == KVC_OK && c->kind == KVC_KIND_FULL) { /* only a boundary copy needs a page */
        FUZZ_CHECK(free0 < 1 && fz_free_pages(w) == free0, "restore said FULL with %d free pages", free0);
        return;
    }
    FUZZ_RES(r, want);
    if (r != KVC_OK) return;
    ref_restore(c->kind, s->from, s->to, &s->st, target, &c->st);
}

static void fz_op_merge(fz_world *w, int ci) {
    fz_cache *c = &w->c[ci];
    int pi = (int)fuzz_byte(&w->in) % (w->ns + 1) - 1, chi = (int)fuzz_byte(&w->in) % (w->ns + 1) - 1, r, want, i;
    kvc_snapshot *out = NULL;
    int32_t free0 = fz_free_pages(w);
    if (fuzz_byte(&w->in) % 2) /* usually look for an adjacent pair of this cache */
        for (i = 0; i < w->ns * w->ns; ++i)
            if (i / w->ns != i % w->ns && w->s[i / w->ns].owner == c->serial && w->s[i % w->ns].owner == c->serial &&
                w->s[i / w->ns].to == w->s[i % w->ns].from) { pi = i / w->ns; chi = i % w->ns; break; }
    if (c->kind == KVC_KIND_CAUSAL) want = KVC_ERR_UNSUPPORTED;
    else if ((pi >= 0 && !fz_fits(c, &w->s[pi])) || (chi >= 0 && !fz_fits(c, &w->s[chi]))) want = KVC_ERR_FOREIGN;
    else if (pi >= 0 && pi == chi) want = KVC_ERR_INVALID;
    else if (c->kind == KVC_KIND_FULL && pi >= 0 && chi >= 0 && w->s[pi].to != w->s[chi].from) want = KVC_ERR_INVALID;
    else want = KVC_OK;
    fuzz_note("merge cache %d parent %d child %d, want %d", ci, pi, chi, want);
    r = kvc_snapshot_merge(c->h, pi >= 0 ? w->s[pi].h : NULL, chi >= 0 ? w->s[chi].h : NULL, &out);
    if (want == KVC_OK && c->kind == KVC_KIND_FULL && pi >= 0 && chi >= 0) {
        if (r == KVC_ERR_FULL) { FUZZ_CHECK(free0 < 1, "merge said FULL with %d free pages", free0); return; }
        if (r == KVC_ERR_NO_MEMORY && fz_may_oom) return;
    }
    FUZZ_RES(r, want);
    if (r != KVC_OK) return;
    if (c->kind == KVC_KIND_ROTATING) { /* the child supersedes the parent */
        FUZZ_CHECK(out == (chi >= 0 ? w->s[chi].h : NULL), "rotating merge must give the child");
        if (pi >= 0) fz_snap_drop(w, pi);
        return;
    }
    if (pi < 0 || chi < 0) { /* a missing side frees the other */
        FUZZ_CHECK(out == NULL, "merge with a NULL side gave a snapshot");
        if (pi >= 0) fz_snap_drop(w, pi);
        if (chi >= 0) fz_snap_drop(w, chi);
        return;
    }
    FUZZ_CHECK(out != NULL, "merge gave nothing");
    {
        fz_snap m = w->s[pi];
        m.h = out;
        m.to = w->s[chi].to;
        ref_merge_full(&m.st, m.from, w->s[chi].from, &w->s[chi].st, m.to, &m.st);
        if (pi > chi) { fz_snap_drop(w, pi); fz_snap_drop(w, chi); }
        else { fz_snap_drop(w, chi); fz_snap_drop(w, pi); }
        w->s[w->ns++] = m;
    }
}

static void fz_op_split(fz_world *w, int ci) {
    fz_cache *c = &w->c[ci];
    kvc_snapshot *a = NULL, *b = NULL;
    fz_snap *s;
    int si, r, want;
    int32_t at;
    if (w->ns == 0) return;
    if (w->ns == FZ_SNAPS) fz_op_snap_free(w, 0);
    if (w->ns == 0) return;
    si = fz_int(&w->in, 0, w->ns - 1);
    s = &w->s[si];
    at = s->from + fz_int(&w->in, -2, s->to - s->from + 2);
    want = c->kind == KVC_KIND_CAUSAL ? KVC_ERR_UNSUPPORTED : !fz_fits(c, s) ? KVC_ERR_FOREIGN : KVC_OK;
    fuzz_note("split snapshot %d [%d, %d) at %d with cache %d, want %d", si, s->from, s->to, at, ci, want);
    r = kvc_snapshot_split(c->h, s->h, at, &a, &b);
    if (r == KVC_ERR_NO_MEMORY && fz_may_oom && want == KVC_OK) return;
    FUZZ_RES(r, want);
    if (r != KVC_OK) return;
    if (s->kind == KVC_KIND_ROTATING || at <= s->from) { FUZZ_CHECK(a == NULL && b == s->h, "split before the start"); return; }
    if (at >= s->to) { FUZZ_CHECK(a == s->h && b == NULL, "split after the end"); return; }
    FUZZ_CHECK(a != NULL && b != NULL, "split gave a NULL half");
    w->s[w->ns] = *s;
    w->s[w->ns].h = b;
    w->s[w->ns].from = at;
    w->ns++;
    s->h = a;
    s->to = at;
    s->st.off = at;
}

/* ---- operations: CAUSAL --------------------------------------------------------------- */
static void fz_causal_put(fz_world *w, fz_cache *c, int n, const uint32_t *uids) {
    int l;
    for (l = 0; l < w->L; ++l) {
        fz_fill(w, uids, n, l);
        FUZZ_RES(kvc_put(c->h, l, w->k, w->v), KVC_OK);
    }
}

/* checks that need an open (fully put) batch: its queries' attention, its mask, the
   K/V/positions of the cells it reads */
static void fz_check_batch(fz_world *w, int ci, int n, const int32_t *pos, const int32_t *seq, const unsigned char *nc) {
    fz_cache *c = &w->c[ci];
    static float mask[FZ_BATCH * 4 * 300];
    kvc_attention_desc d;
    int32_t rows, cols, first, i, j, l = fz_rint(w, 0, w->L - 1), ng, nk = w->H * w->hk, nv = w->H * w->hv;
    int row_pad = fz_rint(w, 0, 4);
    memset(&d, 0, sizeof(d));
    for (i = 0; i < n * w->H * w->hk; ++i) w->q[i] = fz_rand(w);
    d.n_queries = n; d.n_heads = w->H; d.q = w->q; d.out = w->out;
    FUZZ_RES(kvc_attention(c->h, l, &d), KVC_OK);
    for (i = 0; i < n; ++i)
        fz_causal_ref_attend(w, c, seq[i], pos[i], nc[i], 0, l, w->q + i * nk, w->H, w->out + i * nv);
    FUZZ_RES(kvc_mask_export(c->h, row_pad, NULL, 0, &rows, &cols, &first), KVC_OK);
    FUZZ_CHECK(rows >= n && rows < n + (row_pad ? row_pad : 1) && cols >= 0 && first >= 0 && first + cols <= c->cap,
             "mask export %d x %d at %d for %d tokens", rows, cols, first, n);
    if ((size_t)rows * (size_t)cols <= sizeof(mask) / sizeof(mask[0])) {
        FUZZ_RES(kvc_mask_export(c->h, row_pad, mask, sizeof(mask) / sizeof(mask[0]), &rows, &cols, &first), KVC_OK);
        for (i = 0; i < rows; ++i) {
            int vis = 0, want = 0, key;
            for (j = 0; j < cols; ++j) vis += mask[i * cols + j] == 0.0f;
            if (i < n)
                for (key = 0; key < FZ_POS; ++key) want += fz_has(c, seq[i], key) && fz_visible(c, key, pos[i], nc[i], 0);
            FUZZ_CHECK(vis == want, "mask row %d: %d visible cells, reference %d", i, vis, want);
        }
    }
    /* the gathered cells: each non-empty one is some entry of the map, by its V */
    FUZZ_RES(kvc_cache_gather(c->h, l, NULL, NULL, NULL, 0, &ng), KVC_OK);
    FUZZ_CHECK(ng == cols, "gather %d cells, mask %d columns", ng, cols);
    if (ng > FZ_TOK) return;
    FUZZ_RES(kvc_cache_gather(c->h, l, w->gk, w->gv, w->gpos, FZ_TOK, &ng), KVC_OK);
    for (j = 0; j < ng; ++j) {
        int s, found = 0;
        int32_t p = w->gpos[j];
        if (p < 0) continue;
        FUZZ_CHECK(p < FZ_POS, "gathered cell %d: position %d", j, p);
        for (s = 0; s < FZ_SEQS && !found; ++s) {
            const fz_entry *e = &c->m.e[s][p];
            if (!e->uid || w->gv[j * nv] != fz_vval(e->uid, l, 0)) continue;
            found = 1;
            for (i = 0; i < nv; ++i)
                FUZZ_CHECK(w->gv[j * nv + i] == fz_vval(e->uid, l, i), "gathered cell %d (seq %d pos %d): V[%d]", j, s, p, i);
            for (i = 0; i < nk; ++i)
                FUZZ_CHECK(fz_k_close(e, w->gk[j * nk + i], e->k[l][i]), "gathered cell %d (seq %d pos %d): K[%d] %.9g, want %.9g",
                         j, s, p, i, (double)w->gk[j * nk + i], (double)e->k[l][i]);
        }
        FUZZ_CHECK(found, "gathered cell %d (pos %d, V0 %g) is in no sequence", j, p, (double)w->gv[j * nv]);
    }
}

/* a batch of (position, sequence) tokens, or kvc_begin's sequence-0 continuation */
static void fz_op_batch(fz_world *w, int ci, int seq0) {
    fz_cache *c = &w->c[ci];
    int32_t pos[FZ_BATCH], seq[FZ_BATCH], n = 0, i, j, s, p, r, want, want_n;
    int minpos[FZ_SEQS], next[FZ_SEQS], mode;
    unsigned char nc[FZ_BATCH];
    uint32_t uids[FZ_BATCH];
    kvc_batch b;
    want_n = fz_int(&w->in, 1, FZ_BATCH);
    for (s = 0; s < FZ_SEQS; ++s) { minpos[s] = -1; next[s] = fz_max_pos(c, s) + 1; }
    if (seq0) {
        if (next[0] + want_n > FZ_POS) return;
        for (i = 0; i < want_n; ++i) { pos[i] = next[0] + i; seq[i] = 0; nc[i] = 0; }
        n = want_n;
    } else {
        for (i = 0; i < want_n; ++i) {
            unsigned x = fuzz_byte(&w->in);
            s = (int)(x % FZ_SEQS);
            p = x & 0x80 ? (int)fuzz_byte(&w->in) % FZ_POS : next[s]; /* a hole, or the next position */
            if (p >= FZ_POS || fz_has(c, s, p)) continue;
            for (j = 0; j < n && !(seq[j] == s && pos[j] == p); ++j) {}
            if (j < n) continue; /* one cell per (sequence, position) */
            pos[n] = p; seq[n] = s; nc[n] = (x & 0x70) == 0x70; n++;
            if (p == next[s]) next[s]++;
        }
        if (n == 0) return;
    }
    for (i = 0; i < n; ++i)
        if (minpos[seq[i]] < 0 || pos[i] < minpos[seq[i]]) minpos[seq[i]] = pos[i];
    want = n > c->cap || c->cap - fz_cells_used(c) + fz_freeable(c, minpos) < n ? KVC_ERR_FULL : KVC_OK;
    fuzz_note("%s causal cache %d n %d (used %d of %d), want %d", seq0 ? "begin" : "batch", ci, n, fz_cells_used(c), c->cap,
            want);
    if (seq0) r = kvc_begin(c->h, n, NULL, 0);
    else {
        b.n_tokens = n; b.pos = pos; b.seq = seq; b.non_causal = nc;
        r = kvc_begin_batch(c->h, &b);
    }
    FUZZ_RES(r, want);
    if (r != KVC_OK) return;
    w->rescan |= c->window > 0;
    for (s = 0; s < FZ_SEQS; ++s) /* the window release */
        for (p = 0; p < FZ_POS; ++p)
            if (fz_has(c, s, p) && fz_dead(c, minpos, s, p)) c->m.e[s][p].uid = 0;
    for (i = 0; i < n; ++i) uids[i] = ++w->next_uid;
    mode = (int)fuzz_byte(&w->in);
    if (mode % 8 == 0 && w->L > 1) { /* cancel midway: the release stays, the batch goes */
        fz_fill(w, uids, n, 0);
        FUZZ_RES(kvc_put(c->h, 0, w->k, w->v), KVC_OK);
        FUZZ_RES(kvc_seq_remove(c->h, 0, 0, 1), KVC_ERR_STATE);
        FUZZ_RES(kvc_cache_defrag(c->h, NULL), KVC_ERR_STATE);
        FUZZ_RES(kvc_cancel(c->h), KVC_OK);
        fuzz_note("  cancelled");
        return;
    }
    fz_causal_put(w, c, n, uids);
    for (i = 0; i < n; ++i) {
        fz_entry *e = &c->m.e[seq[i]][pos[i]];
        int l, k;
        e->uid = uids[i];
        e->cell = ++w->next_cell;
        e->rotated = 0;
        for (l = 0; l < w->L; ++l)
            for (k = 0; k < w->H * w->hk; ++k) e->k[l][k] = fz_kval(uids[i], l, k);
    }
    if (mode % 2) fz_check_batch(w, ci, n, pos, seq, nc);
}

static void fz_op_seq_remove(fz_world *w, int ci) {
    fz_cache *c = &w->c[ci];
    int s = fz_int(&w->in, 0, FZ_SEQS - 1), j, shift = 0, want = KVC_OK;
    int32_t b = fz_int(&w->in, -1, FZ_POS), e, x = (int32_t)fuzz_byte(&w->in);
    e = x % 4 == 0 ? KVC_POS_END : b + (x / 4) % 9 - 1;
    if (b < 0 || e < b) want = KVC_ERR_INVALID;
    else if (fz_max_pos(c, s) < 0) want = KVC_ERR_NOT_FOUND;
    else if (e != KVC_POS_END) {
        for (j = fuzz_max(e, 0); j < FZ_POS; ++j)
            if (fz_has(c, s, j)) {
                shift = 1;
                if (fz_cell_shared(c, s, c->m.e[s][j].cell)) want = KVC_ERR_SHARED;
            }
        if (want == KVC_OK && shift && b < e && c->rope == 0) want = KVC_ERR_UNSUPPORTED;
    }
    fuzz_note("seq_remove cache %d seq %d [%d, %d), want %d", ci, s, b, e, want);
    w->rescan = 1;
    FUZZ_RES(kvc_seq_remove(c->h, s, b, e), want);
    if (want != KVC_OK) return;
    for (j = b; j < FZ_POS && j < e; ++j) c->m.e[s][j].uid = 0;
    if (shift && b < e)
        for (j = e; j < FZ_POS; ++j)
            if (fz_has(c, s, j)) {
                fz_entry moved = c->m.e[s][j];
                fz_rotate(w, c, &moved, b - e);
                c->m.e[s][j].uid = 0;
                c->m.e[s][j - (e - b)] = moved;
            }
}

static void fz_op_copy_prefix(fz_world *w, int ci) {
    fz_cache *c = &w->c[ci];
    int src = fz_int(&w->in, 0, FZ_SEQS - 1), dst = fz_int(&w->in, 0, FZ_SEQS - 1), j;
    int32_t len = fz_int(&w->in, -1, FZ_POS);
    int want = src == dst || len < 0 ? KVC_ERR_INVALID : KVC_OK;
    fuzz_note("copy_prefix cache %d %d -> %d len %d", ci, src, dst, len);
    w->rescan = 1;
    FUZZ_RES(kvc_seq_copy_prefix(c->h, src, dst, len), want);
    if (want != KVC_OK) return;
    for (j = 0; j < FZ_POS; ++j) {
        c->m.e[dst][j].uid = 0;
        if (fz_has(c, src, j) && j < len) c->m.e[dst][j] = c->m.e[src][j];
    }
}

static void fz_op_seq_snapshot(fz_world *w, int ci) {
    fz_cache *c = &w->c[ci];
    kvc_snapshot *out = NULL;
    int s = fz_int(&w->in, 0, FZ_SEQS - 1), n = 0, j, want, r;
    for (j = 0; j < FZ_POS; ++j) n += fz_has(c, s, j);
    if (w->ns == FZ_SNAPS) fz_op_snap_free(w, 0);
    want = n == 0 ? KVC_ERR_NOT_FOUND : fz_ceil_div(n, w->pc) > fz_free_pages(w) ? KVC_ERR_FULL : KVC_OK;
    fuzz_note("seq_snapshot cache %d seq %d (%d cells), want %d", ci, s, n, want);
    r = kvc_seq_snapshot(c->h, s, &out);
    if (r == KVC_ERR_NO_MEMORY && fz_may_oom && want == KVC_OK) return;
    FUZZ_RES(r, want);
    if (r != KVC_OK) return;
    memset(&w->s[w->ns], 0, sizeof(w->s[w->ns]));
    w->s[w->ns].h = out;
    w->s[w->ns].kind = KVC_KIND_CAUSAL;
    w->s[w->ns].from = fz_min_pos(c, s);
    w->s[w->ns].to = fz_max_pos(c, s) + 1;
    memcpy(w->s[w->ns].seq, c->m.e[s], sizeof(c->m.e[s]));
    w->ns++;
}

static void fz_op_seq_restore(fz_world *w, int ci) {
    fz_cache *c = &w->c[ci];
    fz_snap *s;
    int dst = fz_int(&w->in, 0, FZ_SEQS - 1), n = 0, only = 0, j, want;
    if (w->ns == 0) return;
    s = &w->s[fz_int(&w->in, 0, w->ns - 1)];
    for (j = 0; j < FZ_POS; ++j) n += s->seq[j].uid != 0;
    for (j = 0; j < FZ_POS; ++j) /* cells only dst holds come free (an entry per cell: no sharing within a seq) */
        only += fz_has(c, dst, j) && !fz_cell_shared(c, dst, c->m.e[dst][j].cell);
    if (c->kind != KVC_KIND_CAUSAL) want = KVC_ERR_UNSUPPORTED;
    else if (s->kind != KVC_KIND_CAUSAL) want = KVC_ERR_FOREIGN;
    else want = c->cap - fz_cells_used(c) + only < n ? KVC_ERR_FULL : KVC_OK;
    fuzz_note("seq_restore cache %d dst %d (%d cells), want %d", ci, dst, n, want);
    w->rescan = 1;
    FUZZ_RES(kvc_seq_restore(c->h, s->h, dst), want);
    if (want != KVC_OK) return;
    for (j = 0; j < FZ_POS; ++j) {
        c->m.e[dst][j] = s->seq[j];
        if (s->seq[j].uid) c->m.e[dst][j].cell = ++w->next_cell;
    }
}

/* ---- caches, fork, prefix ---------------------------------------------------------------- */
static void fz_op_create(fz_world *w) {
    fz_cache *c = &w->c[w->nc];
    kvc_cache_config cc;
    int r, want = KVC_OK;
    unsigned x = fuzz_byte(&w->in);
    if (w->nc == FZ_CACHES) return;
    memset(c, 0, sizeof(*c));
    kvc_cache_config_init(&cc, (kvc_kind)(x % 3));
    c->kind = cc.kind;
    if (cc.kind == KVC_KIND_ROTATING) {
        cc.window = fz_int(&w->in, 1, 12);
        cc.sinks = fuzz_byte(&w->in) % 2 ? 0 : fz_int(&w->in, 0, cc.window - 1);
        c->W = cc.window;
        c->S = cc.sinks;
    } else if (cc.kind == KVC_KIND_CAUSAL) {
        int32_t pad = fz_int(&w->in, 0, 4), pages;
        cc.capacity = fz_int(&w->in, 1, 40);
        cc.padding = pad;
        cc.max_seqs = x & 0x40 ? 0 : FZ_SEQS;
        cc.window = x & 0x80 ? fz_int(&w->in, 1, 12) : 0;
        cc.chunk = x & 0x20 ? fz_int(&w->in, 2, 9) : 0;
        c->rope = (int)(x >> 3) % 4;
        if (c->rope == 1) { cc.rope.shift = fz_shift_cb; }
        else if (c->rope > 1) {
            cc.rope.style = c->rope == 2 ? KVC_ROPE_NEOX : KVC_ROPE_INTERLEAVED;
            cc.rope.theta = 10000.0f;
            cc.rope.n_dims = 2 * fz_int(&w->in, 0, w->hk / 2);
        }
        if (pad == 0) pad = 1;
        c->cap = (cc.capacity + pad - 1) / pad * pad;
        c->window = cc.window;
        c->chunk = cc.chunk;
        c->rope_dims = cc.rope.n_dims ? cc.rope.n_dims : w->hk;
        pages = fz_ceil_div(c->cap, w->pc);
        if (pages > fz_free_pages(w)) want = KVC_ERR_FULL;
    }
    fuzz_note("create cache %d kind %d window %d sinks %d capacity %d rope %d, want %d", w->nc, (int)cc.kind, cc.window,
            cc.sinks, c->cap, c->rope, want);
    r = kvc_cache_create(w->pool, &cc, &c->h);
    if (r == KVC_ERR_NO_MEMORY && fz_may_oom && want == KVC_OK) return;
    FUZZ_RES(r, want);
    if (r != KVC_OK) return;
    c->serial = ++w->next_serial;
    w->nc++;
}

static void fz_prefix_drop(fz_world *w) {
    if (w->px.h == NULL) return;
    fuzz_note("prefix destroy");
    FUZZ_RES(kvc_prefix_destroy(w->px.h), KVC_OK);
    memset(&w->px, 0, sizeof(w->px));
}
static int fz_in_prefix(const fz_world *w, uint32_t serial) {
    int i;
    for (i = 0; w->px.h != NULL && i < w->px.n_c; ++i)
        if (w->px.serial[i] == serial) return 1;
    return 0;
}

static void fz_op_destroy(fz_world *w, int ci) {
    if (fz_in_prefix(w, w->c[ci].serial)) fz_prefix_drop(w); /* the caches must outlive it */
    fuzz_note("destroy cache %d", ci);
    FUZZ_RES(kvc_cache_destroy(w->c[ci].h), KVC_OK);
    w->c[ci] = w->c[--w->nc]; /* its snapshots stay, foreign to every other cache */
}

static void fz_op_fork(fz_world *w, int ci) {
    kvc_cache *f = NULL;
    int r, want = w->c[ci].kind == KVC_KIND_CAUSAL ? KVC_ERR_UNSUPPORTED : KVC_OK;
    if (w->nc == FZ_CACHES) return;
    fuzz_note("fork cache %d, want %d", ci, want);
    r = kvc_cache_fork(w->c[ci].h, &f);
    if (r == KVC_ERR_NO_MEMORY && fz_may_oom && want == KVC_OK) return;
    FUZZ_RES(r, want);
    if (r != KVC_OK) return;
    w->c[w->nc] = w->c[ci];
    w->c[w->nc].h = f;
    w->c[w->nc].serial = ++w->next_serial;
    w->nc++;
}

static void fz_op_clear(fz_world *w, int ci) {
    fz_cache *c = &w->c[ci];
    fuzz_note("clear cache %d", ci);
    FUZZ_RES(kvc_cache_clear(c->h), KVC_OK);
    c->st.off = c->st.bb = c->st.rel = 0;
    memset(&c->m, 0, sizeof(c->m));
}

/* kvc_prefix remembers its caches' generations with its tokens: a cache that took new or
   replaced tokens since (not one only cut back) makes the next begin reuse nothing */
static void fz_prefix_record(fz_world *w) {
    int i;
    for (i = 0; i < w->px.n_c; ++i) w->px.changes[i] = w->c[fz_find_cache(w, w->px.serial[i])].st.changes;
}

static void fz_op_prefix_create(fz_world *w) {
    kvc_cache *hs[FZ_CACHES];
    int i, n = 0, r, want = KVC_OK;
    unsigned pick = fuzz_byte(&w->in);
    int32_t maxt = fz_int(&w->in, 1, FZ_PTOK);
    kvc_prefix *x = NULL;
    if (w->px.h != NULL || w->nc == 0) return;
    memset(&w->px, 0, sizeof(w->px));
    for (i = 0; i < w->nc; ++i)
        if ((pick >> i) & 1) {
            hs[n] = w->c[i].h;
            w->px.serial[n++] = w->c[i].serial;
            if (w->c[i].kind == KVC_KIND_CAUSAL) want = KVC_ERR_UNSUPPORTED;
        }
    if (n == 0) return;
    fuzz_note("prefix create over %d caches, max_tokens %d, want %d", n, maxt, want);
    r = kvc_prefix_create(hs, n, maxt, &x);
    if (r == KVC_ERR_NO_MEMORY && fz_may_oom && want == KVC_OK) return;
    FUZZ_RES(r, want);
    if (r != KVC_OK) { memset(&w->px, 0, sizeof(w->px)); return; }
    w->px.h = x;
    w->px.n_c = n;
    w->px.max_tokens = maxt;
    fz_prefix_record(w);
}

/* ollama's MLX runner's request cycle: begin, evaluate the rest of the prompt, generate, close */
static void fz_op_prefix_session(fz_world *w) {
    fz_prefix *x = &w->px;
    int32_t tok[FZ_PTOK], n = 0, keep, p = 0, min_off = INT32_MAX, reused = -1, gen[8], g, i, j;
    int trimmable = 1, r;
    if (x->h == NULL) return;
    keep = fz_int(&w->in, 0, x->n);
    for (i = 0; i < keep && n < FZ_PTOK; ++i) tok[n++] = x->tok[i];
    for (i = 0; i < x->n_c && !x->open; ++i) /* changed behind its back: the recorded tokens say nothing */
        if (w->c[fz_find_cache(w, x->serial[i])].st.changes != x->changes[i]) x->n = 0;
    for (i = fz_int(&w->in, 0, 12); i > 0 && n < FZ_PTOK; --i) tok[n++] = fz_int(&w->in, 0, 3);
    if (n == 0) tok[n++] = 1;
    while (p < n && p < x->n && tok[p] == x->tok[p]) p++;
    if (p == n) p--;
    for (i = 0; i < x->n_c; ++i) min_off = fuzz_min(min_off, w->c[fz_find_cache(w, x->serial[i])].st.off);
    p = fuzz_min(p, min_off);
    for (i = 0; i < x->n_c; ++i) {
        fz_cache *c = &w->c[fz_find_cache(w, x->serial[i])];
        if (c->st.off > p && fz_wrapped(c, &c->st)) trimmable = 0;
    }
    if (!trimmable) p = 0;
    fuzz_note("prefix begin n %d (recorded %d), want reuse %d", n, x->n, p);
    r = kvc_prefix_begin(x->h, tok, n, &reused);
    FUZZ_RES(r, KVC_OK);
    FUZZ_CHECK(reused == p, "prefix reused %d, reference %d", reused, p);
    for (i = 0; i < x->n_c; ++i) {
        fz_cache *c = &w->c[fz_find_cache(w, x->serial[i])];
        if (c->st.off > p) ref_rewind(&c->st, p);
    }
    x->n = p;
    fz_prefix_record(w);
    x->n_prompt = fuzz_min(n, x->max_tokens);
    memcpy(x->prompt, tok, sizeof(int32_t) * (size_t)x->n_prompt);
    x->open = 1;
    if (fuzz_byte(&w->in) % 8 == 0) return; /* left open */
    for (i = 0; i < x->n_c; ++i) {
        int ci = fz_find_cache(w, x->serial[i]);
        int32_t done = p;
        while (done < n) {
            int32_t b = fuzz_min(n - done, fz_int(&w->in, 1, FZ_BATCH));
            if (!fz_append(w, ci, b)) break;
            done += b;
        }
    }
    g = fz_int(&w->in, 0, 6);
    for (j = 0; j < g; ++j) {
        gen[j] = fz_int(&w->in, 0, 3);
        for (i = 0; i < x->n_c; ++i) fz_append(w, fz_find_cache(w, x->serial[i]), 1);
    }
    fuzz_note("prefix close generated %d", g);
    FUZZ_RES(kvc_prefix_close(x->h, gen, g), KVC_OK);
    keep = x->max_tokens;
    for (i = 0; i < x->n_c; ++i) keep = fuzz_min(keep, w->c[fz_find_cache(w, x->serial[i])].st.off);
    keep = fuzz_min(keep, x->n_prompt + g);
    j = fuzz_min(keep, x->n_prompt);
    memcpy(x->tok, x->prompt, sizeof(int32_t) * (size_t)j);
    if (keep > j) memcpy(x->tok + j, gen, sizeof(int32_t) * (size_t)(keep - j));
    x->n = keep;
    fz_prefix_record(w);
    x->open = 0;
}

/* ---- one input ---------------------------------------------------------------------------- */
static int fz_setup(fz_world *w) {
    kvc_pool_config cfg;
    size_t page_bytes, bytes = 0;
    unsigned mem;
    int r;
    w->L = fz_int(&w->in, 1, FZ_L);
    w->H = fz_int(&w->in, 1, FZ_H);
    w->hk = fz_int(&w->in, 1, FZ_D);
    w->hv = fz_int(&w->in, 1, FZ_D);
    mem = fuzz_byte(&w->in);
    w->tk = mem & 1 ? KVC_TYPE_F16 : KVC_TYPE_F32;
    w->tv = mem & 2 ? KVC_TYPE_F16 : KVC_TYPE_F32;
    w->pc = fz_int(&w->in, 1, 8);
    w->pages_total = fz_int(&w->in, 1, 48);
    kvc_pool_config_init(&cfg);
    cfg.n_layers = w->L; cfg.n_kv_heads = w->H; cfg.head_dim_k = w->hk; cfg.head_dim_v = w->hv;
    cfg.type_k = w->tk; cfg.type_v = w->tv; cfg.page_cells = w->pc;
    FUZZ_RES(kvc_pool_page_bytes(&cfg, &page_bytes), KVC_OK);
    cfg.budget_bytes = (size_t)w->pages_total * page_bytes + (mem >> 4) % page_bytes; /* rounds down */
    cfg.runtime.cpu_disable = mem & 4 ? KVC_CPU_F16C : 0;
    w->rng = 0x9e3779b97f4a7c15ull ^ (unsigned long long)mem;
    fz_may_oom = 0;
    fz_fail_mask = 0;
    if ((mem >> 3) % 4 == 1) { /* refuse allocations k with (k + phase) % 2^m == 0 */
        cfg.runtime.allocator.alloc = fz_alloc;
        cfg.runtime.allocator.free = fz_free;
        fz_fail_mask = (1u << fz_int(&w->in, 1, 4)) - 1u;
        fz_fail_phase = fuzz_byte(&w->in);
        fz_may_oom = 1;
    } else if ((mem >> 3) % 4 == 2) { /* an arena, its object part sometimes tiny */
        unsigned obj = fuzz_byte(&w->in);
        cfg.arena_object_bytes = obj < 128 ? 0 : (size_t)(obj - 128) * 64;
        fz_may_oom = cfg.arena_object_bytes != 0;
        FUZZ_RES(kvc_pool_arena_bytes(&cfg, &bytes), KVC_OK);
        w->arena = malloc(bytes);
        if (w->arena == NULL) return 0;
        cfg.arena = w->arena;
        cfg.arena_bytes = bytes;
    } else if ((mem >> 3) % 4 == 3) { /* counting only */
        cfg.runtime.allocator.alloc = fz_alloc;
        cfg.runtime.allocator.free = fz_free;
    }
    r = kvc_pool_create(&cfg, &w->pool);
    fuzz_note("pool L %d H %d hk %d hv %d %s/%s page_cells %d pages %d memory %u -> %d", w->L, w->H, w->hk, w->hv,
            kvc_type_name(w->tk), kvc_type_name(w->tv), w->pc, w->pages_total, (mem >> 3) % 4, r);
    if (r == KVC_ERR_NO_MEMORY && fz_may_oom) return 0;
    FUZZ_RES(r, KVC_OK);
    return 1;
}

static void fz_teardown(fz_world *w) {
    kvc_pool_stats st;
    if (w->nc + w->ns > 0) FUZZ_RES(kvc_pool_destroy(w->pool), KVC_ERR_BUSY);
    fz_prefix_drop(w);
    while (w->ns > 0) fz_op_snap_free(w, w->ns - 1);
    while (w->nc > 0) fz_op_destroy(w, w->nc - 1);
    FUZZ_RES(kvc_pool_stats_get(w->pool, &st), KVC_OK);
    FUZZ_CHECK(st.pages_used == 0 && st.live_caches == 0 && st.live_snapshots == 0 && st.live_prefixes == 0,
             "after teardown: %d pages, %d caches, %d snapshots, %d prefixes", st.pages_used, st.live_caches,
             st.live_snapshots, st.live_prefixes);
    FUZZ_RES(kvc_pool_destroy(w->pool), KVC_OK);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_world *w = &W_;
    memset(w, 0, sizeof(*w));
    w->in.p = data;
    w->in.n = size;
    fuzz_log_reset();
    fz_live_blocks = fz_alloc_calls = 0;
    if (fz_setup(w)) {
        fz_op_create(w); /* a first cache of the kind the input names */
        for (fuzz_step = 0; fuzz_step < FZ_STEPS && w->in.i < w->in.n; ++fuzz_step) {
            unsigned op = fuzz_byte(&w->in) % 20;
            int ci;
            if (w->nc == 0 || op == 0) { fz_op_create(w); if (w->nc == 0) continue; }
            ci = fz_int(&w->in, 0, w->nc - 1);
            if (w->c[ci].kind == KVC_KIND_CAUSAL) {
                switch (op) {
                case 1: case 2: case 3: case 4: fz_op_batch(w, ci, 0); break;
                case 5: fz_op_batch(w, ci, 1); break;
                case 6: case 7: fz_op_seq_remove(w, ci); break;
                case 8: fz_op_copy_prefix(w, ci); break;
                case 9: { int s = fz_int(&w->in, 0, FZ_SEQS - 1), t, p;
                          fuzz_note("seq_keep cache %d seq %d", ci, s);
                          FUZZ_RES(kvc_seq_keep(w->c[ci].h, s), KVC_OK);
                          w->rescan = 1;
                          for (t = 0; t < FZ_SEQS; ++t) if (t != s) for (p = 0; p < FZ_POS; ++p) w->c[ci].m.e[t][p].uid = 0;
                          break; }
                case 10: fuzz_note("defrag cache %d", ci); FUZZ_RES(kvc_cache_defrag(w->c[ci].h, NULL), KVC_OK); w->rescan = 1; break;
                case 11: fz_op_seq_snapshot(w, ci); break;
                case 12: case 13: fz_op_seq_restore(w, ci); break;
                case 14: fz_op_clear(w, ci); break;
                case 15: fz_op_destroy(w, ci); break;
                case 16: fz_op_fork(w, ci); break;                   /* refused */
                case 17: fz_op_restore(w, ci); break;                /* refused */
                case 18: fz_op_prefix_create(w); break;
                default: if (w->ns > 0) fz_op_snap_free(w, fz_int(&w->in, 0, w->ns - 1)); break;
                }
            } else {
                switch (op) {
                case 1: case 2: case 3: case 4: fz_append(w, ci, fz_int(&w->in, 1, FZ_BATCH)); break;
                case 5: fz_op_trim(w, ci); break;
                case 6: fz_op_live_restore(w, ci); break;
                case 7: case 8: fz_op_take(w, ci); break;
                case 9: case 10: fz_op_restore(w, ci); break;
                case 11: fz_op_merge(w, ci); break;
                case 12: fz_op_split(w, ci); break;
                case 13: fz_op_fork(w, ci); break;
                case 14: fz_op_clear(w, ci); break;
                case 15: fz_op_destroy(w, ci); break;
                case 16: fz_op_prefix_create(w); break;
                case 17: case 18: fz_op_prefix_session(w); break;
                default: if (w->ns > 0) fz_op_snap_free(w, fz_int(&w->in, 0, w->ns - 1)); else fz_op_seq_restore(w, ci); break;
                }
            }
            fz_check_all(w);
            w->rescan = 0;
        }
        w->rescan = 1; /* everything, once more, before the teardown */
        fz_check_all(w);
        fz_teardown(w);
    }
    free(w->arena);
    FUZZ_CHECK(fz_live_blocks == 0, "%ld blocks of the counting allocator still live", fz_live_blocks);
    return 0;
}
