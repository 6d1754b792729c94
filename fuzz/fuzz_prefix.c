/* fuzz/fuzz_prefix.c - libFuzzer target: prefix reuse driven by request sequences
   decoded from the input bytes, checked against a reference.

   The first byte picks a prefix-cache backend from fp_backends[] (the
   single-entry kvc_prefix of ollama's MLX runner; the radix tree has its own target, fuzz/fuzz_radix.c,
   whose reference is a trie of committed tokens rather than caches kept in place),
   the next bytes a pool and 1-3 caches (FULL or ROTATING, small windows so they
   wrap), then every byte starts a step: a request (prompt = some prefix of what was
   recorded + new token ids; begin; evaluate the rest of the prompt in chunks;
   generate; close; sometimes left open), a disturbance that only shrinks a cache
   (trim, live rewind, clear: what was recorded stays true for the tokens still held),
   a bad call (each must change nothing), or destroying and recreating the prefix
   object.

   The property checked after every begin: every cache holds, at each position below
   n_reused, K/V computed for the prompt's token at that position (the reference records
   which token id each cell was evaluated for), n_reused is the MLX runner's value (longest
   common prefix, at least one token left, at most the smallest offset, 0 when a wrapped
   window cannot trim), and the recorded token list is what kvc_prefix_tokens says.
   Failures print the last steps and abort (fuzz/fuzz_replay.c prints the input). */
#define KVCACHE_IMPLEMENTATION
#include "../kvcache.h"
#include "fuzz_util.h"
#include "../tests/ref_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FP_CACHES 3
#define FP_TOK 200      /* positions a cache's reference can hold */
#define FP_PTOK 48      /* prompt length and max_tokens bound */
#define FP_STEPS 200
#define FP_ROW 4        /* n_kv_heads 1, head_dim 4 */

/* ---- the world: caches whose cells remember the token id they were evaluated for ----- */
typedef struct fp_cache {
    kvc_cache *h;
    kvc_kind kind;
    int32_t W, S;
    int32_t off, bb;
    int rel;                       /* a window page was released (the window "wrapped") */
    int32_t tok[FP_TOK];           /* token id evaluated at each position */
    uint32_t uid[FP_TOK];          /* which evaluation: K/V are a function of it */
} fp_cache;

typedef struct fp_world {
    fuzz_in in;
    int pc;
    kvc_pool *pool;
    fp_cache c[FP_CACHES];
    int nc;
    uint32_t next_uid;
    float k[16 * FP_ROW], v[16 * FP_ROW], gk[FP_TOK * FP_ROW], gv[FP_TOK * FP_ROW];
    int32_t gpos[FP_TOK];
    /* the single-entry backend's reference */
    kvc_prefix *px;
    int32_t max_tokens, rec[FP_PTOK], n_rec, prompt[FP_PTOK], n_prompt;
    int open;
} fp_world;

static fp_world FW_;

/* K/V of an evaluation: exact in f16; V[0] names the evaluation */
static float fp_val(uint32_t uid, int kv, int i) {
    uint32_t x = uid * 2654435761u ^ (uint32_t)(kv * 16 + i) * 40503u;
    x ^= x >> 15;
    if (kv == 1 && i == 0) return (float)(uid % 2000u + 1u);
    return (float)((int)(x % 129u) - 64) / 8.0f;
}

static int fp_wrapped(const fp_cache *c) { return c->kind == KVC_KIND_ROTATING && (c->off > c->W || c->rel); }
static void fp_rewind(fp_cache *c, int32_t target) {
    c->off = target;
    c->bb = target > 0 ? target - 1 : 0;
    if (target == 0) c->rel = 0;
}
static int fp_begin_releases(const fp_cache *c, int32_t pc, int32_t o) {
    return ref_begin_releases(c->kind, c->W, c->S, pc, o); /* tests/ref_model.h */
}

/* evaluate tokens tok[0..n) at the end of cache ci; 0 when the pool is full */
static int fp_eval(fp_world *w, int ci, const int32_t *tok, int32_t n) {
    fp_cache *c = &w->c[ci];
    int32_t o = c->off, i, j;
    int r;
    if (o + n > FP_TOK) return 0;
    r = kvc_begin(c->h, n, NULL, 0);
    if (r == KVC_ERR_FULL) return 0;
    FUZZ_RES(r, KVC_OK);
    if (fp_begin_releases(c, w->pc, o)) c->rel = 1;
    for (i = 0; i < n; ++i) {
        c->tok[o + i] = tok[i];
        c->uid[o + i] = ++w->next_uid;
        for (j = 0; j < FP_ROW; ++j) {
            w->k[i * FP_ROW + j] = fp_val(c->uid[o + i], 0, j);
            w->v[i * FP_ROW + j] = fp_val(c->uid[o + i], 1, j);
        }
    }
    FUZZ_RES(kvc_put(c->h, 0, w->k, w->v), KVC_OK);
    c->off = o + n;
    c->bb = o;
    return 1;
}

/* the cells a cache shows, bit-exact: positions and the K/V of their evaluation */
static void fp_check_cache(fp_world *w, int ci) {
    fp_cache *c = &w->c[ci];
    int32_t n = -1, off = -1, j, i, lo, want_n = 0, t, s0;
    FUZZ_RES(kvc_cache_offset(c->h, &off), KVC_OK);
    FUZZ_CHECK(off == c->off, "cache %d: offset %d, reference %d", ci, off, c->off);
    FUZZ_RES(kvc_cache_gather(c->h, 0, w->gk, w->gv, w->gpos, FP_TOK, &n), KVC_OK);
    s0 = c->kind == KVC_KIND_ROTATING ? fuzz_min(c->S, c->off) : 0;
    lo = c->kind == KVC_KIND_ROTATING ? fuzz_max(s0, fuzz_max(c->S, c->bb - (c->W - c->S) + 1)) : 0;
    for (t = 0; t < c->off; ++t) {
        if (t >= s0 && t < lo) continue;
        FUZZ_CHECK(want_n < n && w->gpos[want_n] == t, "cache %d: cell %d is not position %d", ci, want_n, t);
        for (i = 0; i < FP_ROW; ++i) {
            j = want_n * FP_ROW + i;
            FUZZ_CHECK(w->gk[j] == fp_val(c->uid[t], 0, i) && w->gv[j] == fp_val(c->uid[t], 1, i),
                     "cache %d position %d: K/V are not those of its evaluation", ci, t);
        }
        want_n++;
    }
    FUZZ_CHECK(n == want_n, "cache %d: %d cells, reference %d", ci, n, want_n);
}

static void fp_check_all(fp_world *w) {
    int i;
    for (i = 0; i < w->nc; ++i) fp_check_cache(w, i);
}

/* a shrinking disturbance: what the prefix object recorded stays true below the offset */
static void fp_disturb(fp_world *w) {
    int ci = fuzz_int(&w->in, 0, w->nc - 1), how = fuzz_int(&w->in, 0, 2);
    fp_cache *c = &w->c[ci];
    int32_t n = fuzz_int(&w->in, 0, 6);
    if (how == 0) {
        fuzz_note("trim cache %d by %d (offset %d)", ci, n, c->off);
        /* by 0: nothing changes; a wrapped window goes back to 0 (clearing) only */
        int want = n > c->off ? KVC_ERR_RANGE : n == 0 || !fp_wrapped(c) || n == c->off ? KVC_OK : KVC_ERR_UNREACHABLE;
        FUZZ_RES(kvc_cache_trim(c->h, n), want);
        if (want == KVC_OK && n > 0) fp_rewind(c, c->off - n);
    } else if (how == 1) {
        int32_t target = c->off - n;
        int want = target < 0 ? KVC_ERR_UNREACHABLE : c->kind == KVC_KIND_ROTATING && target == c->off ? KVC_OK
                   : fp_wrapped(c) && target > 0 ? KVC_ERR_UNREACHABLE : KVC_OK;
        fuzz_note("rewind cache %d to %d (offset %d)", ci, target, c->off);
        FUZZ_RES(kvc_cache_restore(c->h, NULL, target), want);
        if (want == KVC_OK && !(c->kind == KVC_KIND_ROTATING && target == c->off)) fp_rewind(c, target);
    } else {
        fuzz_note("clear cache %d", ci);
        FUZZ_RES(kvc_cache_clear(c->h), KVC_OK);
        c->off = c->bb = c->rel = 0;
    }
}

/* ---- backend: the single-entry kvc_prefix (findRemaining / close of ollama's MLX runner) -- */
static int se_setup(fp_world *w) {
    kvc_cache *hs[FP_CACHES];
    int i, r;
    w->max_tokens = fuzz_int(&w->in, 1, FP_PTOK);
    for (i = 0; i < w->nc; ++i) hs[i] = w->c[i].h;
    fuzz_note("kvc_prefix_create over %d caches, max_tokens %d", w->nc, w->max_tokens);
    r = kvc_prefix_create(hs, w->nc, w->max_tokens, &w->px);
    FUZZ_RES(r, KVC_OK);
    w->n_rec = w->n_prompt = 0;
    w->open = 0;
    return r == KVC_OK;
}

static void se_check(fp_world *w) {
    const int32_t *toks = NULL;
    int32_t n = -1;
    FUZZ_RES(kvc_prefix_tokens(w->px, &toks, &n), KVC_OK);
    FUZZ_CHECK(n == w->n_rec && (n == 0 || memcmp(toks, w->rec, sizeof(int32_t) * (size_t)n) == 0),
             "recorded %d tokens, reference %d", n, w->n_rec);
}

static void se_request(fp_world *w) {
    int32_t tok[FP_PTOK], n = 0, p = 0, min_off = INT32_MAX, reused = -1, gen[8], g, i, j, keep;
    int trimmable = 1;
    unsigned shape = fuzz_byte(&w->in);
    /* a prompt: some of what was recorded (sometimes with one token changed), then new ids */
    keep = fuzz_int(&w->in, 0, w->n_rec);
    for (i = 0; i < keep && n < FP_PTOK; ++i) tok[n++] = w->rec[i];
    if (shape % 5 == 0 && n > 0) tok[fuzz_int(&w->in, 0, n - 1)] ^= 1;
    for (i = fuzz_int(&w->in, 0, 10); i > 0 && n < FP_PTOK; --i) tok[n++] = fuzz_int(&w->in, 0, 5);
    if (n == 0) tok[n++] = 7;
    /* the MLX runner's findRemaining rule */
    while (p < n && p < w->n_rec && tok[p] == w->rec[p]) p++;
    if (p == n) p--;
    for (i = 0; i < w->nc; ++i) min_off = fuzz_min(min_off, w->c[i].off);
    p = fuzz_min(p, min_off);
    for (i = 0; i < w->nc; ++i)
        if (w->c[i].off > p && fp_wrapped(&w->c[i])) trimmable = 0;
    if (!trimmable) p = 0;
    fuzz_note("begin n %d (recorded %d, open %d), want reuse %d", n, w->n_rec, w->open, p);
    FUZZ_RES(kvc_prefix_begin(w->px, tok, n, &reused), KVC_OK);
    FUZZ_CHECK(reused == p, "reused %d, reference %d", reused, p);
    for (i = 0; i < w->nc; ++i) {
        fp_cache *c = &w->c[i];
        if (c->off > p) fp_rewind(c, p);
        /* the point of it all: every reused cell was evaluated for this prompt's token */
        for (j = 0; j < p; ++j)
            FUZZ_CHECK(c->tok[j] == tok[j], "cache %d reuses position %d evaluated for token %d, prompt has %d", i, j,
                     c->tok[j], tok[j]);
    }
    w->n_rec = p;
    w->n_prompt = fuzz_min(n, w->max_tokens);
    memcpy(w->prompt, tok, sizeof(int32_t) * (size_t)w->n_prompt);
    w->open = 1;
    fp_check_all(w);
    se_check(w);
    if (shape % 7 == 1) return; /* left open: the next begin starts over from here */
    g = fuzz_int(&w->in, 0, 8);
    for (i = 0; i < w->nc; ++i) { /* evaluate the rest, in chunks */
        int32_t done = p;
        while (done < n) {
            int32_t b = fuzz_min(n - done, fuzz_int(&w->in, 1, 16));
            if (!fp_eval(w, i, tok + done, b)) break;
            done += b;
        }
        if (done < n) g = 0; /* out of pages: like an engine, stop the request here */
    }
    for (j = 0; j < g; ++j) { /* generate: each token evaluated by every cache (sometimes by
                                 the first only: close keeps what every cache holds) */
        int ok = 1;
        gen[j] = fuzz_int(&w->in, 0, 5);
        for (i = 0; i < (shape % 11 == 2 ? 1 : w->nc); ++i) ok &= fp_eval(w, i, &gen[j], 1);
        if (!ok) { g = j; break; } /* out of pages: token j was not generated */
    }
    fuzz_note("close generated %d", g);
    FUZZ_RES(kvc_prefix_close(w->px, gen, g), KVC_OK);
    keep = w->max_tokens;
    for (i = 0; i < w->nc; ++i) keep = fuzz_min(keep, w->c[i].off);
    keep = fuzz_min(keep, w->n_prompt + g);
    j = fuzz_min(keep, w->n_prompt);
    memcpy(w->rec, w->prompt, sizeof(int32_t) * (size_t)j);
    if (keep > j) memcpy(w->rec + j, gen, sizeof(int32_t) * (size_t)(keep - j));
    w->n_rec = keep;
    w->open = 0;
}

/* calls that must fail and change nothing */
static void se_bad(fp_world *w) {
    int32_t t = 1, r = -1;
    int k = fuzz_int(&w->in, 0, 3);
    fuzz_note("bad call %d", k);
    if (k == 0) FUZZ_RES(kvc_prefix_begin(w->px, &t, -1, &r), KVC_ERR_INVALID);
    else if (k == 1) FUZZ_RES(kvc_prefix_close(w->px, NULL, 2), KVC_ERR_NULL);
    else if (k == 2) FUZZ_RES(kvc_prefix_close(w->px, &t, -1), KVC_ERR_INVALID);
    else if (!w->open) FUZZ_RES(kvc_prefix_close(w->px, &t, 1), KVC_ERR_STATE);
    else { /* an open batch in one cache: begin refuses */
        int rb = kvc_begin(w->c[0].h, 1, NULL, 0);
        if (rb == KVC_ERR_FULL) return;
        FUZZ_RES(rb, KVC_OK);
        FUZZ_RES(kvc_prefix_begin(w->px, &t, 1, &r), KVC_ERR_STATE);
        FUZZ_RES(kvc_cancel(w->c[0].h), KVC_OK);
        w->c[0].bb = w->c[0].off; /* a cancel anchors the window at the batch start */
        if (fp_begin_releases(&w->c[0], w->pc, w->c[0].off) && w->c[0].off > 0) w->c[0].rel = 1;
    }
    fp_check_all(w);
    se_check(w);
}

static void se_step(fp_world *w, unsigned op) {
    if (op < 6) se_request(w);
    else if (op < 8) fp_disturb(w);
    else if (op < 9) se_bad(w);
    else { /* a new prefix object: it starts with nothing recorded */
        fuzz_note("kvc_prefix_destroy");
        FUZZ_RES(kvc_prefix_destroy(w->px), KVC_OK);
        w->px = NULL;
        se_setup(w);
    }
}

static void se_teardown(fp_world *w) {
    if (w->px != NULL) FUZZ_RES(kvc_prefix_destroy(w->px), KVC_OK);
    w->px = NULL;
}

typedef struct fp_backend {
    const char *name;
    int (*setup)(fp_world *w);
    void (*step)(fp_world *w, unsigned op); /* op in [0, 10) */
    void (*teardown)(fp_world *w);
} fp_backend;

static const fp_backend fp_backends[] = {
    {"single-entry kvc_prefix", se_setup, se_step, se_teardown},
};
#define FP_N_BACKENDS ((unsigned)(sizeof(fp_backends) / sizeof(fp_backends[0])))

/* ---- one input ----------------------------------------------------------------------- */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fp_world *w = &FW_;
    const fp_backend *be;
    kvc_pool_config cfg;
    kvc_pool_stats st;
    size_t page_bytes;
    int i;
    memset(w, 0, sizeof(*w));
    w->in.p = data;
    w->in.n = size;
    fuzz_log_reset();
    be = &fp_backends[fuzz_byte(&w->in) % FP_N_BACKENDS];
    kvc_pool_config_init(&cfg);
    cfg.n_layers = 1; cfg.n_kv_heads = 1; cfg.head_dim_k = cfg.head_dim_v = FP_ROW;
    cfg.type_k = fuzz_byte(&w->in) % 2 ? KVC_TYPE_F16 : KVC_TYPE_F32;
    cfg.type_v = KVC_TYPE_F16;
    w->pc = cfg.page_cells = fuzz_int(&w->in, 1, 8);
    FUZZ_RES(kvc_pool_page_bytes(&cfg, &page_bytes), KVC_OK);
    cfg.budget_bytes = (size_t)fuzz_int(&w->in, 2, 120) * page_bytes;
    FUZZ_RES(kvc_pool_create(&cfg, &w->pool), KVC_OK);
    w->nc = fuzz_int(&w->in, 1, FP_CACHES);
    for (i = 0; i < w->nc; ++i) {
        kvc_cache_config cc;
        unsigned x = fuzz_byte(&w->in);
        kvc_cache_config_init(&cc, x % 3 == 0 ? KVC_KIND_ROTATING : KVC_KIND_FULL);
        if (cc.kind == KVC_KIND_ROTATING) {
            cc.window = 1 + (int32_t)(x / 3) % 24;
            cc.sinks = x & 0x80 ? (int32_t)(x / 3) % cc.window : 0;
        }
        w->c[i].kind = cc.kind;
        w->c[i].W = cc.window;
        w->c[i].S = cc.sinks;
        FUZZ_RES(kvc_cache_create(w->pool, &cc, &w->c[i].h), KVC_OK);
    }
    fuzz_note("backend %s, %d caches, page_cells %d", be->name, w->nc, w->pc);
    if (be->setup(w)) {
        for (fuzz_step = 0; fuzz_step < FP_STEPS && w->in.i < w->in.n; ++fuzz_step) be->step(w, fuzz_byte(&w->in) % 10);
        be->teardown(w);
    }
    for (i = 0; i < w->nc; ++i) FUZZ_RES(kvc_cache_destroy(w->c[i].h), KVC_OK);
    FUZZ_RES(kvc_pool_stats_get(w->pool, &st), KVC_OK);
    FUZZ_CHECK(st.pages_used == 0 && st.live_prefixes == 0, "after teardown: %d pages, %d prefixes", st.pages_used,
             st.live_prefixes);
    FUZZ_RES(kvc_pool_destroy(w->pool), KVC_OK);
    return 0;
}
