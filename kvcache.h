/* kvcache.h - v0.1.0 - a key/value cache for LLM inference engines, in one C99 header.

   Storage, bookkeeping, attention over the cache, snapshots and prefix reuse for the
   key/value cache of a transformer, with no dependency beyond libc and libm.

   USAGE
     In exactly one C or C++ file:
         #define KVCACHE_IMPLEMENTATION
         #include "kvcache.h"
     Everywhere else just #include "kvcache.h".

   CONFIGURATION MACROS (define before the #include that has KVCACHE_IMPLEMENTATION)
     KVCACHE_STATIC             make every function static (private to that file).
     KVCACHE_MALLOC(sz, user)   allocator used when the pool config names none;
     KVCACHE_FREE(ptr, user)    define both or neither (default: malloc / free).
     KVCACHE_ASSERT(x)          internal consistency checks (default: assert).

   THE MODEL IN ONE PARAGRAPH
     A kvc_pool owns every K/V byte, cut into pages of `page_cells` token slots
     (a page holds those slots for every layer). Pages are reference counted and
     the pool never takes more than its byte budget. A kvc_cache is a policy over
     pages: FULL (append-only, grows page by page) or ROTATING (a sliding window of
     W tokens plus optional attention-sink tokens). A kvc_snapshot shares the pages
     it covers with the cache it came from; writing into a shared page copies that
     page first (copy-on-write), so a snapshot never changes under you and costs
     O(pages). kvc_prefix is the single-entry prompt reuse of ollama's MLX runner.

   A FORWARD PASS
       kvc_begin(cache, n_tokens);               // reserve cells for the new tokens
       for (layer = 0; layer < n_layers; ++layer) {
           ... compute q, k, v for the n_tokens (rope applied) ...
           kvc_put(cache, layer, k, v);          // [n_tokens][kv_heads][head_dim] f32
           kvc_attention(cache, layer, &attn);   // q over every cell it may see
       }
     Positions of full and rotating caches are the token indices 0, 1, 2, ...

   CONVENTIONS
     Every function returns a kvc_result (KVC_OK == 0) and validates all of its
     arguments before it changes anything: after an error the objects are exactly
     as they were. Nothing is thread-safe; use one pool per thread or lock around.
     The sliding window W means W keys including the current token (Hugging Face,
     MLX). ollama's Causal cache admits W+1: pass W+1 for that behaviour.

   LICENSE: MIT or public domain (Unlicense), at your choice; see the end of file.
*/
#ifndef KVCACHE_H
#define KVCACHE_H

#define KVCACHE_VERSION_MAJOR 0
#define KVCACHE_VERSION_MINOR 1
#define KVCACHE_VERSION_PATCH 0
#define KVCACHE_VERSION_NUMBER \
    (KVCACHE_VERSION_MAJOR * 10000 + KVCACHE_VERSION_MINOR * 100 + KVCACHE_VERSION_PATCH)

#include <stddef.h>
#include <stdint.h>

#ifdef KVCACHE_STATIC
#if defined(__GNUC__) || defined(__clang__)
#define KVCDEF static __attribute__((unused))
#else
#define KVCDEF static
#endif
#else
#ifdef __cplusplus
#define KVCDEF extern "C"
#else
#define KVCDEF extern
#endif
#endif

/* ---- Result codes: one list gives the enum and the strings ---------------------- */
#define KVC_RESULT_LIST(X)                                                              \
    X(KVC_OK, 0, "ok")                                                                  \
    X(KVC_ERR_NULL, -1, "a required pointer argument is NULL")                          \
    X(KVC_ERR_INVALID, -2, "invalid argument value")                                    \
    X(KVC_ERR_RANGE, -3, "layer, index, count or position out of range")                \
    X(KVC_ERR_UNSUPPORTED, -4, "operation not supported by this cache kind or type")    \
    X(KVC_ERR_FULL, -5, "page budget exhausted")                                        \
    X(KVC_ERR_NO_MEMORY, -6, "memory allocation failed")                                \
    X(KVC_ERR_ARENA_TOO_SMALL, -7, "arena smaller than the configuration needs")       \
    X(KVC_ERR_FOREIGN, -8, "object belongs to another cache or pool")                   \
    X(KVC_ERR_UNREACHABLE, -9, "restore target unreachable")                            \
    X(KVC_ERR_STATE, -10, "operation not valid in the current state")                   \
    X(KVC_ERR_BUSY, -11, "object still in use")                                         \
    X(KVC_ERR_OVERFLOW, -12, "size computation overflows")                             \
    X(KVC_ERR_NOT_FOUND, -13, "no such sequence in the cache")                          \
    X(KVC_ERR_SHARED, -14, "a cell to be changed is shared with another sequence")

typedef enum kvc_result {
#define KVC__RESULT_ENUM(name, value, text) name = value,
    KVC_RESULT_LIST(KVC__RESULT_ENUM)
#undef KVC__RESULT_ENUM
    KVC_RESULT_MIN_ = -14
} kvc_result;

/* ---- Storage types ----------------------------------------------------------------- */
typedef enum kvc_type {
    KVC_TYPE_F32 = 0, /* 4 bytes per value */
    KVC_TYPE_F16 = 1, /* IEEE half, 2 bytes per value, round to nearest even */
    KVC_TYPE_COUNT
} kvc_type;

/* ---- Memory --------------------------------------------------------------------- */
typedef struct kvc_allocator {
    void *(*alloc)(size_t size, void *user); /* NULL: KVCACHE_MALLOC */
    void (*free)(void *ptr, void *user);     /* may be called with NULL */
    void *user;
} kvc_allocator;

/* CPU paths chosen at run time (cpuid + xgetbv); KVCACHE_NO_SIMD compiles none. */
#define KVC_CPU_F16C (1u << 0) /* x86: f32 <-> f16 conversion with F16C */

typedef struct kvc_pool_config {
    int32_t n_layers;     /* layers whose K/V live in each page */
    int32_t n_kv_heads;
    int32_t head_dim_k;   /* K and V head sizes may differ */
    int32_t head_dim_v;
    kvc_type type_k;      /* storage type of K and of V, independently */
    kvc_type type_v;
    int32_t page_cells;   /* token slots per page (every layer); default 256 */
    size_t budget_bytes;  /* hard cap on K/V bytes: floor(budget / page_bytes) pages */
    kvc_allocator allocator;
    /* Arena mode: when arena != NULL every byte the pool, its caches, snapshots
       and prefix objects ever use comes from this caller-owned block, and the
       library never calls an allocator. kvc_pool_arena_bytes() says how big it
       must be. arena_object_bytes is the part kept for objects (cache headers,
       page tables, snapshots, token lists); 0 means a default that scales with
       the page count. */
    void *arena;
    size_t arena_bytes;
    size_t arena_object_bytes;
    uint32_t cpu_disable; /* KVC_CPU_* paths not to use (tests compare them with scalar) */
} kvc_pool_config;

typedef struct kvc_pool_stats {
    size_t page_bytes;      /* K+V bytes of one page, all layers */
    size_t k_row_bytes;     /* bytes of one cell's K for one layer (all kv heads) */
    size_t v_row_bytes;
    int32_t page_cells;
    int32_t pages_total;    /* pages the budget allows */
    int32_t pages_used;     /* pages referenced by anything now */
    int32_t pages_peak;
    size_t bytes_used;      /* pages_used * page_bytes */
    size_t bytes_peak;
    size_t budget_bytes;
    int32_t live_caches;    /* objects that must be destroyed before the pool */
    int32_t live_snapshots;
    int32_t live_prefixes;
    uint32_t cpu_features;  /* the KVC_CPU_* paths this pool uses */
} kvc_pool_stats;

typedef struct kvc_pool kvc_pool;

KVCDEF const char *kvc_strerror(kvc_result result);
KVCDEF const char *kvc_type_name(kvc_type type); /* "f32", "f16", or "?" */
KVCDEF kvc_result kvc_pool_config_init(kvc_pool_config *cfg); /* zeros + defaults */
KVCDEF kvc_result kvc_cpu_features(uint32_t *features); /* KVC_CPU_* this CPU and build have */
KVCDEF kvc_result kvc_pool_arena_bytes(const kvc_pool_config *cfg, size_t *bytes);
KVCDEF kvc_result kvc_pool_create(const kvc_pool_config *cfg, kvc_pool **out);
/* KVC_ERR_BUSY while caches, snapshots or prefix objects of the pool are alive. */
KVCDEF kvc_result kvc_pool_destroy(kvc_pool *pool);
KVCDEF kvc_result kvc_pool_stats_get(const kvc_pool *pool, kvc_pool_stats *stats);

/* ---- Caches ---------------------------------------------------------------------- */
typedef enum kvc_kind {
    KVC_KIND_FULL = 0,     /* append-only, trim/rewind anywhere */
    KVC_KIND_ROTATING = 1, /* sliding window of `window` keys, `sinks` first tokens kept */
    KVC_KIND_CAUSAL = 2    /* ollama's multi-sequence cell cache: fixed capacity, cells with
                              a position and a set of sequences */
} kvc_kind;

/* RoPE used to re-rotate stored keys when kvc_seq_remove shifts positions. */
typedef enum kvc_rope_style {
    KVC_ROPE_NONE = 0,        /* no shifting: kvc_seq_remove with a shift is refused */
    KVC_ROPE_NEOX = 1,        /* rotate-half: pairs (i, i + n_dims/2) */
    KVC_ROPE_INTERLEAVED = 2  /* pairs (2i, 2i+1) */
} kvc_rope_style;

/* A caller's own re-rotation: k holds one cell's keys of one layer as f32
   [n_kv_heads][head_dim]; rotate them in place from old_pos to new_pos. */
typedef void (*kvc_rope_shift_fn)(void *user, int32_t layer, float *k, int32_t n_kv_heads,
                                  int32_t head_dim, int32_t old_pos, int32_t new_pos);

typedef struct kvc_rope {
    kvc_rope_style style;
    float theta;            /* base, e.g. 10000; angle = pos * theta^(-2i/n_dims) */
    int32_t n_dims;         /* rotated dimensions per head (even); 0 = head_dim_k */
    kvc_rope_shift_fn shift;/* if set, used instead of `style` */
    void *user;
} kvc_rope;

typedef struct kvc_cache_config {
    kvc_kind kind;
    int32_t window;   /* ROTATING: W keys including the current token (>= 1).
                         CAUSAL: 0 = none, else W keys (ollama's Causal admits W+1: pass W+1) */
    int32_t sinks;    /* ROTATING: first tokens never evicted, counted inside W (0 <= sinks < W) */
    /* the fields below are read only by CAUSAL caches */
    int32_t capacity; /* cells, rounded up to a multiple of `padding` */
    int32_t padding;  /* capacity and exported mask widths are multiples of it; 0 = 1 */
    int32_t max_seqs; /* sequence ids are 0 .. max_seqs-1; 0 = 256 */
    int32_t chunk;    /* chunked attention: a query sees only cells of its own chunk of
                         this many positions; 0 = none */
    kvc_rope rope;    /* how kvc_seq_remove re-rotates shifted keys */
} kvc_cache_config;

typedef struct kvc_cache kvc_cache;
typedef struct kvc_snapshot kvc_snapshot;

KVCDEF kvc_result kvc_cache_config_init(kvc_cache_config *cfg, kvc_kind kind); /* zeros + kind */
/* CAUSAL caches take all their pages at create (KVC_ERR_FULL if the pool lacks them). */
KVCDEF kvc_result kvc_cache_create(kvc_pool *pool, const kvc_cache_config *cfg, kvc_cache **out);
KVCDEF kvc_result kvc_cache_destroy(kvc_cache *cache);
/* A new cache with the same contents, sharing every page (O(pages), no K/V copied). */
KVCDEF kvc_result kvc_cache_fork(const kvc_cache *cache, kvc_cache **out);
KVCDEF kvc_result kvc_cache_clear(kvc_cache *cache); /* offset 0, all pages released */
/* FULL/ROTATING: tokens appended so far (the next position). CAUSAL: cells in use. */
KVCDEF kvc_result kvc_cache_offset(const kvc_cache *cache, int32_t *offset);
/* Cells a kernel reads now: every cell the earliest query of the last batch may see
   (FULL: offset; ROTATING: at most sinks + window - 1 + last batch size). */
KVCDEF kvc_result kvc_cache_cells(const kvc_cache *cache, int32_t *n_cells);
/* Pages this cache references (shared ones included). */
KVCDEF kvc_result kvc_cache_pages(const kvc_cache *cache, int32_t *n_pages);

/* Start a batch of n_tokens new tokens at positions offset .. offset+n_tokens-1:
   allocates (and copies shared tail pages) for every layer at once, so it is the
   only call of a forward pass that can run out of pages. offset grows by n_tokens.
   ROTATING: releases pages no query of this batch can see (the seed's L>1 concat
   and L=1 ring update keep the same window: W-1 older keys + the batch). */
KVCDEF kvc_result kvc_begin(kvc_cache *cache, int32_t n_tokens);
/* Write the batch's keys and values for one layer, f32, [n_tokens][n_kv_heads][head_dim],
   converted to the storage type. Each layer of the batch must be put before its
   attention; a later kvc_begin, snapshot or fork needs every layer put. */
KVCDEF kvc_result kvc_put(kvc_cache *cache, int32_t layer, const float *k, const float *v);
/* CAUSAL: start a forward pass over a batch of (position, sequence) pairs (seed
   StartForward). Cells no sequence of the batch can see any more (sliding window) are
   released first; the batch takes the first run of free cells, after a defrag if there
   is none; KVC_ERR_FULL (nothing changed) when fewer cells are free than the batch needs.
   non_causal (optional) marks tokens that see every cell of their sequence in the
   attention range, later positions too (ollama's image tokens). kvc_begin(cache, n) on
   a CAUSAL cache is a batch of sequence 0 continuing after its last position. */
typedef struct kvc_batch {
    int32_t n_tokens;
    const int32_t *pos;              /* [n_tokens], >= 0 */
    const int32_t *seq;              /* [n_tokens], 0 .. max_seqs-1 */
    const unsigned char *non_causal; /* [n_tokens] or NULL */
} kvc_batch;
KVCDEF kvc_result kvc_begin_batch(kvc_cache *cache, const kvc_batch *batch);
/* Abandon an unfinished batch: offset goes back to where kvc_begin found it. */
KVCDEF kvc_result kvc_cancel(kvc_cache *cache);

/* Trim n tokens from the end (seed CanTrim/Trim); KVC_ERR_STATE while a batch is open
   (kvc_cancel it first), as for kvc_restore. ROTATING caches can trim only
   until the window has wrapped: offset <= window and no page ever released (a
   kvc_cancel after kvc_begin released pages counts as wrapped); otherwise
   KVC_ERR_UNSUPPORTED. */
KVCDEF kvc_result kvc_can_trim(const kvc_cache *cache, int *can_trim);
KVCDEF kvc_result kvc_trim(kvc_cache *cache, int32_t n_tokens);

/* ---- Attention -------------------------------------------------------------------- */
typedef struct kvc_attention_desc {
    int32_t n_queries;    /* query tokens */
    int32_t n_heads;      /* query heads, a multiple of n_kv_heads (GQA) */
    const float *q;       /* [n_queries][n_heads][head_dim_k], rope applied */
    const int32_t *pos;   /* [n_queries] positions; NULL: the last n_queries positions
                             (CAUSAL: NULL means the queries are the current batch, with its
                             positions, sequences and non-causal marks) */
    const int32_t *seq;   /* CAUSAL with pos != NULL: [n_queries] sequence ids */
    float scale;          /* 0: 1/sqrt(head_dim_k) */
    int32_t window;       /* extra window (W keys incl. current), 0: none; a ROTATING
                             cache always applies its own */
    int non_causal;       /* nonzero: no causal mask (keys after the query are seen) */
    float *out;           /* [n_queries][n_heads][head_dim_v]; zeros where nothing is visible */
} kvc_attention_desc;

/* Scaled dot-product attention of the queries over the cache's cells for `layer`,
   masks computed from the cells' positions (no mask tensor). Online softmax. */
KVCDEF kvc_result kvc_attention(const kvc_cache *cache, int32_t layer, const kvc_attention_desc *desc);

/* ---- Views for callers with their own attention ---------------------------------- */
typedef struct kvc_run {
    const void *k;        /* n_cells rows of k_row_bytes, storage type type_k */
    const void *v;        /* n_cells rows of v_row_bytes */
    const int32_t *pos;   /* n_cells positions */
    int32_t n_cells;
} kvc_run;
/* Zero-copy: the cells of kvc_cache_cells() as contiguous runs, in position order.
   Pass runs = NULL (and max_runs 0) to learn *n_runs. KVC_ERR_RANGE (with *n_runs set)
   if max_runs is too small. Pointers stay valid until the next call that changes the
   cache. */
KVCDEF kvc_result kvc_cache_runs(const kvc_cache *cache, int32_t layer, kvc_run *runs,
                                 int32_t max_runs, int32_t *n_runs);
/* Copy: the same cells converted to f32, k [n][n_kv_heads][head_dim_k], v likewise,
   pos [n] (any of the three may be NULL; all three NULL only counts). KVC_ERR_RANGE
   (with *n_cells set) if max_cells is too small. */
KVCDEF kvc_result kvc_cache_gather(const kvc_cache *cache, int32_t layer, float *k, float *v,
                                   int32_t *pos, int32_t max_cells, int32_t *n_cells);

/* ---- CAUSAL: sequences, masks, defrag (ollama's kvcache.Causal) ----------------- */
#define KVC_POS_END INT32_MAX /* kvc_seq_remove(..., begin, KVC_POS_END): to the end */

/* The mask of the current batch for callers with their own attention: rows = batch
   tokens padded up to a multiple of row_pad (padding rows all -inf), cols = the cells
   the batch reads, [*first_cell, *first_cell + *n_cols), a multiple of the cache's
   padding. 0 where the token may see the cell, -INFINITY elsewhere. Pass mask = NULL
   to learn the sizes; KVC_ERR_RANGE if max_floats is too small. The K/V of those cells
   are kvc_cache_runs / kvc_cache_gather of the same cache. */
KVCDEF kvc_result kvc_mask_export(const kvc_cache *cache, int32_t row_pad, float *mask, size_t max_floats,
                                  int32_t *n_rows, int32_t *n_cols, int32_t *first_cell);
/* dst shares src's cells with position < len (no K/V copied); dst's old cells are dropped. */
KVCDEF kvc_result kvc_seq_copy_prefix(kvc_cache *cache, int32_t src, int32_t dst, int32_t len);
/* Drop seq from cells with position in [begin, end); its later cells move back by
   end - begin and their keys are re-rotated (config rope). KVC_ERR_SHARED, with nothing
   changed, if a cell that would move is shared with another sequence. */
KVCDEF kvc_result kvc_seq_remove(kvc_cache *cache, int32_t seq, int32_t begin, int32_t end);
KVCDEF kvc_result kvc_seq_keep(kvc_cache *cache, int32_t seq); /* drop every other sequence */
/* Smallest and largest position held for seq; both -1 if it holds none. */
KVCDEF kvc_result kvc_seq_pos_range(const kvc_cache *cache, int32_t seq, int32_t *min_pos, int32_t *max_pos);
/* Whether seq can continue at pos: with a window, the cells that position needs are all held. */
KVCDEF kvc_result kvc_seq_can_resume(const kvc_cache *cache, int32_t seq, int32_t pos, int *can_resume);
/* Move live cells to the front in as few block moves as possible. *n_moves may be NULL. */
KVCDEF kvc_result kvc_defrag(kvc_cache *cache, int32_t *n_moves);
/* Per-sequence state, like llama.cpp's: the sequence's cells (positions and K/V of every
   layer) copied into pages of the pool; restore puts them back into free cells of any
   CAUSAL cache of the same pool, as sequence dst (dst's old cells are dropped first). */
KVCDEF kvc_result kvc_seq_snapshot(kvc_cache *cache, int32_t seq, kvc_snapshot **out);
KVCDEF kvc_result kvc_seq_restore(kvc_cache *cache, const kvc_snapshot *snap, int32_t dst);

/* ---- Snapshots (the seed's Snapshot / Restore / Merge / Split) ------------------ */
typedef struct kvc_snapshot_info {
    int32_t from, to;     /* FULL: the tokens [from, to) it holds; ROTATING: the whole window */
    int32_t n_pages;      /* pages it keeps alive */
    size_t bytes;         /* n_pages * page_bytes */
} kvc_snapshot_info;

/* Snapshot of [from, offset). *out = NULL (and KVC_OK) when offset <= from or the cache
   is empty, as in the seed. FULL: from < 0 counts as 0. ROTATING: the whole window state is kept. */
KVCDEF kvc_result kvc_snapshot_take(kvc_cache *cache, int32_t from, kvc_snapshot **out);
/* Bring the cache to `target`. snap == NULL rewinds using the live state.
   KVC_ERR_UNREACHABLE is the seed's `false`: FULL: target < 0, target > offset
   (live) or > snap->to, or offset < snap->from. ROTATING: target > offset (live) or
   > snap->to, a live rewind once the window has wrapped (see kvc_trim), or a snapshot
   clamped below its end when its window had wrapped. The snapshot is not consumed. */
KVCDEF kvc_result kvc_restore(kvc_cache *cache, const kvc_snapshot *snap, int32_t target);
/* Merge [a,b) and [b,c) into [a,c). Consumes both on success; if either is NULL
   both are freed and *out = NULL (seed). ROTATING: the child supersedes the parent. */
KVCDEF kvc_result kvc_snapshot_merge(kvc_cache *cache, kvc_snapshot *parent, kvc_snapshot *child,
                                     kvc_snapshot **out);
/* Split [a,c) at b into [a,b) and [b,c). Consumes snap on success. At or before a:
   (NULL, snap); at or after c: (snap, NULL). ROTATING: (NULL, snap) always. */
KVCDEF kvc_result kvc_snapshot_split(kvc_cache *cache, kvc_snapshot *snap, int32_t at,
                                     kvc_snapshot **parent, kvc_snapshot **child);
KVCDEF kvc_result kvc_snapshot_info_get(const kvc_snapshot *snap, kvc_snapshot_info *info);
KVCDEF kvc_result kvc_snapshot_free(kvc_snapshot *snap); /* NULL is fine */

/* ---- Single-entry prefix reuse (seed findRemaining / begin / close) -------------- */
typedef struct kvc_prefix kvc_prefix;
/* Tracks the tokens held by a set of caches (one per layer group, kinds may mix).
   max_tokens bounds the recorded token list. The caches must outlive the object. */
KVCDEF kvc_result kvc_prefix_create(kvc_cache *const *caches, int32_t n_caches, int32_t max_tokens,
                                    kvc_prefix **out);
KVCDEF kvc_result kvc_prefix_destroy(kvc_prefix *prefix);
/* New request: longest common prefix with the recorded tokens, always leaving at least
   one token to evaluate; trims every cache to it, or clears them all when one cannot
   trim there (a wrapped rotating window). *n_reused = tokens already in the caches:
   evaluate tokens[*n_reused ..]. The prompt is remembered for kvc_prefix_close. */
KVCDEF kvc_result kvc_prefix_begin(kvc_prefix *prefix, const int32_t *tokens, int32_t n_tokens,
                                   int32_t *n_reused);
/* After generation: record prompt + generated tokens, clipped to the smallest cache
   offset (what every cache really holds) and to max_tokens. */
KVCDEF kvc_result kvc_prefix_close(kvc_prefix *prefix, const int32_t *generated, int32_t n_generated);
KVCDEF kvc_result kvc_prefix_tokens(const kvc_prefix *prefix, const int32_t **tokens, int32_t *n_tokens);

#endif /* KVCACHE_H */

/* ================================================================================= */
/*                                IMPLEMENTATION                                     */
/* ================================================================================= */
#ifdef KVCACHE_IMPLEMENTATION
#ifndef KVCACHE_IMPLEMENTATION_DONE
#define KVCACHE_IMPLEMENTATION_DONE

#include <string.h>
#include <math.h>

#if defined(KVCACHE_MALLOC) && defined(KVCACHE_FREE)
/* the user's allocator */
#elif !defined(KVCACHE_MALLOC) && !defined(KVCACHE_FREE)
#include <stdlib.h>
#define KVCACHE_MALLOC(sz, user) ((void)(user), malloc(sz))
#define KVCACHE_FREE(p, user) ((void)(user), free(p))
#else
#error "kvcache.h: define both KVCACHE_MALLOC and KVCACHE_FREE, or neither"
#endif

#ifndef KVCACHE_ASSERT
#include <assert.h>
#define KVCACHE_ASSERT(x) assert(x)
#endif

#define KVC__MIN(a, b) ((a) < (b) ? (a) : (b))
#define KVC__MAX(a, b) ((a) > (b) ? (a) : (b))
#define KVC__NO_PAGE 0xffffffffu
#define KVC__DEFAULT_PAGE_CELLS 256
#define KVC__SLAB_ALIGN 64

/* ---- Layer 0: results, sizes, half floats ---------------------------------------- */

KVCDEF const char *kvc_strerror(kvc_result result) {
    switch (result) {
#define KVC__RESULT_CASE(name, value, text) \
    case name: return text;
        KVC_RESULT_LIST(KVC__RESULT_CASE)
#undef KVC__RESULT_CASE
    default: return "unknown kvc_result";
    }
}

/* a*b, or 0 with *overflow set; sizes are checked once at create time */
static size_t kvc__mul(size_t a, size_t b, int *overflow) {
    if (a != 0 && b > (size_t)-1 / a) { *overflow = 1; return 0; }
    return a * b;
}
static size_t kvc__add(size_t a, size_t b, int *overflow) {
    if (b > (size_t)-1 - a) { *overflow = 1; return 0; }
    return a + b;
}
static size_t kvc__align_up(size_t n, size_t a, int *overflow) {
    return kvc__add(n, a - 1, overflow) & ~(a - 1);
}

static uint16_t kvc__f32_to_f16(float f) {
    uint32_t x, sign, exp, mant, h, rem;
    int32_t e;
    memcpy(&x, &f, 4);
    sign = (x >> 16) & 0x8000u;
    exp = (x >> 23) & 0xffu;
    mant = x & 0x7fffffu;
    if (exp == 0xffu) return (uint16_t)(sign | 0x7c00u | (mant ? 0x200u | (mant >> 13) : 0u));
    e = (int32_t)exp - 127 + 15;
    if (e >= 31) return (uint16_t)(sign | 0x7c00u);
    if (e <= 0) { /* subnormal half: count units of 2^-24, round to nearest even */
        uint32_t shift, half, mid;
        if (e < -10) return (uint16_t)sign;
        mant |= 0x800000u;
        shift = (uint32_t)(14 - e);
        half = mant >> shift;
        rem = mant & ((1u << shift) - 1u);
        mid = 1u << (shift - 1u);
        if (rem > mid || (rem == mid && (half & 1u))) half++;
        return (uint16_t)(sign | half);
    }
    h = ((uint32_t)e << 10) | (mant >> 13);
    rem = mant & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++; /* a carry into the exponent is right */
    return (uint16_t)(sign | h);
}

static float kvc__f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, x;
    float f;
    if (exp == 0) {
        f = (float)mant * (1.0f / 16777216.0f);
        return sign ? -f : f;
    }
    if (exp == 31) x = sign | 0x7f800000u | (mant << 13);
    else x = sign | ((exp + 112u) << 23) | (mant << 13);
    memcpy(&f, &x, 4);
    return f;
}

/* ---- Layer 0: the storage type table ---------------------------------------------
   Adding a type is one row here plus its two converters. Rows are converted whole
   (n values, a multiple of `block`), so block-quantised types fit the same slots. */

typedef void (*kvc__from_f32_fn)(const float *src, void *dst, int32_t n);
typedef void (*kvc__to_f32_fn)(const void *src, float *dst, int32_t n);

typedef struct kvc__type_info {
    const char *name;
    int32_t block;      /* values per block */
    size_t block_bytes; /* bytes per block */
    kvc__from_f32_fn from_f32;
    kvc__to_f32_fn to_f32;
} kvc__type_info;

static void kvc__f32_from_f32(const float *src, void *dst, int32_t n) {
    memcpy(dst, src, (size_t)n * sizeof(float));
}
static void kvc__f32_to_f32(const void *src, float *dst, int32_t n) {
    memcpy(dst, src, (size_t)n * sizeof(float));
}
static void kvc__f16_from_f32(const float *src, void *dst, int32_t n) {
    uint16_t *d = (uint16_t *)dst;
    int32_t i;
    for (i = 0; i < n; ++i) d[i] = kvc__f32_to_f16(src[i]);
}
static void kvc__f16_to_f32_row(const void *src, float *dst, int32_t n) {
    const uint16_t *s = (const uint16_t *)src;
    int32_t i;
    for (i = 0; i < n; ++i) dst[i] = kvc__f16_to_f32(s[i]);
}

static const kvc__type_info kvc__types[KVC_TYPE_COUNT] = {
    {"f32", 1, 4, kvc__f32_from_f32, kvc__f32_to_f32},
    {"f16", 1, 2, kvc__f16_from_f32, kvc__f16_to_f32_row},
};

static int kvc__type_valid(kvc_type t) { return (int)t >= 0 && (int)t < (int)KVC_TYPE_COUNT; }

/* ---- Layer 0: CPU paths, chosen per pool at run time --------------------------------
   Functions carry target attributes, so one binary serves every x86-64 CPU; each is
   used only when cpuid says the CPU (and the OS, via xgetbv) supports it. */
#if !defined(KVCACHE_NO_SIMD) && (defined(__x86_64__) || defined(__i386__)) && \
    (defined(__GNUC__) || defined(__clang__)) && !defined(__TINYC__)
#define KVC__X86 1
#include <cpuid.h>
#include <immintrin.h>

static uint32_t kvc__cpu_detect(void) {
    unsigned a, b, c, d;
    uint32_t xcr0_lo, xcr0_hi, f = 0;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    /* F16C (ecx 29) uses AVX registers: the OS must save them (OSXSAVE, ecx 27; XCR0 bits 1-2) */
    if (!(c & (1u << 27)) || !(c & (1u << 28))) return 0;
    __asm__ __volatile__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
    (void)xcr0_hi;
    if ((xcr0_lo & 6u) == 6u && (c & (1u << 29))) f |= KVC_CPU_F16C;
    return f;
}

__attribute__((target("avx,f16c"))) static void kvc__f16_from_f32_f16c(const float *src, void *dst, int32_t n) {
    uint16_t *d = (uint16_t *)dst;
    int32_t i = 0;
    for (; i + 8 <= n; i += 8) /* imm 0: round to nearest even, as the scalar path */
        _mm_storeu_si128((__m128i *)(void *)(d + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), 0));
    for (; i < n; ++i) d[i] = kvc__f32_to_f16(src[i]);
}

__attribute__((target("avx,f16c"))) static void kvc__f16_to_f32_f16c(const void *src, float *dst, int32_t n) {
    const uint16_t *s = (const uint16_t *)src;
    int32_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(s + i))));
    for (; i < n; ++i) dst[i] = kvc__f16_to_f32(s[i]);
}
#else
static uint32_t kvc__cpu_detect(void) { return 0; }
#endif

KVCDEF kvc_result kvc_cpu_features(uint32_t *features) {
    if (features == NULL) return KVC_ERR_NULL;
    *features = kvc__cpu_detect();
    return KVC_OK;
}

/* The converters a pool uses for a type: the table's, or a faster path. */
static kvc__type_info kvc__pick_type(kvc_type t, uint32_t features) {
    kvc__type_info info = kvc__types[t];
#ifdef KVC__X86
    if (t == KVC_TYPE_F16 && (features & KVC_CPU_F16C)) {
        info.from_f32 = kvc__f16_from_f32_f16c;
        info.to_f32 = kvc__f16_to_f32_f16c;
    }
#endif
    (void)features;
    return info;
}

KVCDEF const char *kvc_type_name(kvc_type type) {
    return kvc__type_valid(type) ? kvc__types[type].name : "?";
}

/* ---- Layer 1a: memory: the user's allocator, or a first-fit heap in the arena ----- */

typedef struct kvc__chunk { /* a free block of the arena heap; size includes the header */
    size_t size;
    struct kvc__chunk *next;
} kvc__chunk;

#define KVC__HEAP_HDR ((size_t)16) /* keeps payloads 16-byte aligned; >= sizeof(kvc__chunk) */

typedef struct kvc__heap {
    kvc__chunk *free_list; /* sorted by address, neighbours coalesced */
} kvc__heap;

static void kvc__heap_init(kvc__heap *h, void *base, size_t bytes) {
    h->free_list = NULL;
    if (bytes >= 2 * KVC__HEAP_HDR) {
        h->free_list = (kvc__chunk *)base;
        h->free_list->size = bytes & ~(KVC__HEAP_HDR - 1);
        h->free_list->next = NULL;
    }
}

static void *kvc__heap_alloc(kvc__heap *h, size_t n) {
    kvc__chunk **link, *c;
    size_t need;
    if (n > (size_t)-1 / 2) return NULL;
    need = (n + 2 * KVC__HEAP_HDR - 1) & ~(KVC__HEAP_HDR - 1);
    for (link = &h->free_list; (c = *link) != NULL; link = &c->next) {
        if (c->size < need) continue;
        if (c->size - need >= 2 * KVC__HEAP_HDR) { /* split, keep the tail free */
            kvc__chunk *rest = (kvc__chunk *)((unsigned char *)c + need);
            rest->size = c->size - need;
            rest->next = c->next;
            *link = rest;
            c->size = need;
        } else {
            *link = c->next;
        }
        return (unsigned char *)c + KVC__HEAP_HDR;
    }
    return NULL;
}

static void kvc__heap_free(kvc__heap *h, void *p) {
    kvc__chunk *c = (kvc__chunk *)((unsigned char *)p - KVC__HEAP_HDR), *prev = NULL, *next = h->free_list;
    while (next != NULL && next < c) { prev = next; next = next->next; }
    c->next = next;
    if (next != NULL && (unsigned char *)c + c->size == (unsigned char *)next) {
        c->size += next->size;
        c->next = next->next;
    }
    if (prev != NULL) {
        prev->next = c;
        if ((unsigned char *)prev + prev->size == (unsigned char *)c) {
            prev->size += c->size;
            prev->next = c->next;
        }
    } else {
        h->free_list = c;
    }
}

static void *kvc__default_alloc(size_t size, void *user) { return KVCACHE_MALLOC(size, user); }
static void kvc__default_free(void *ptr, void *user) { KVCACHE_FREE(ptr, user); }

/* ---- Layer 1b: the pool of pages ---------------------------------------------------
   Page p of layer l has its K rows at k_region + (l*max_pages + p)*page_k_bytes, so
   consecutive page ids are one contiguous tensor per layer; V likewise after all K.
   Each cell also has a position (-1 = never written) in pos[p*page_cells + cell]. */

struct kvc_pool {
    kvc_pool_config cfg;
    kvc_allocator alloc;     /* resolved: never NULL functions in allocator mode */
    int arena_mode;
    kvc__heap heap;          /* arena mode: where objects come from */
    void *slab_block;        /* allocator mode: the block to free */
    unsigned char *slab;     /* K regions of every layer, then V regions */
    size_t v_region;         /* byte offset of the V regions in the slab */
    size_t k_row, v_row;     /* bytes of one cell, one layer, all kv heads */
    size_t page_k_bytes, page_v_bytes; /* one page, one layer */
    size_t page_bytes;       /* one page, every layer, K+V */
    int32_t page_cells, max_pages;
    uint32_t *refcount;      /* [max_pages] */
    int32_t *pos;            /* [max_pages * page_cells] */
    uint32_t *free_pages;    /* stack of free page ids, lowest on top at start */
    int32_t n_free, pages_peak;
    uint32_t next_cache_id;
    int32_t live_caches, live_snapshots, live_prefixes;
    uint32_t cpu;            /* KVC_CPU_* paths in use */
    kvc__type_info tk, tv;   /* converters of K and V: the type table's or a CPU path */
};

typedef struct kvc__layout {
    size_t k_row, v_row, page_bytes;
    int32_t page_cells, max_pages;
    size_t meta_bytes;   /* pool struct + metadata arrays */
    size_t slab_bytes;
    size_t object_bytes; /* arena mode: the object heap */
    size_t arena_bytes;  /* everything, alignment slack included */
} kvc__layout;

static size_t kvc__row_bytes(kvc_type t, int32_t n_heads, int32_t head_dim) {
    return (size_t)n_heads * (size_t)(head_dim / kvc__types[t].block) * kvc__types[t].block_bytes;
}

static kvc_result kvc__check_config(const kvc_pool_config *c) {
    if (c->n_layers < 1 || c->n_kv_heads < 1 || c->head_dim_k < 1 || c->head_dim_v < 1 ||
        c->page_cells < 0)
        return KVC_ERR_INVALID;
    if (!kvc__type_valid(c->type_k) || !kvc__type_valid(c->type_v)) return KVC_ERR_INVALID;
    if (c->head_dim_k % kvc__types[c->type_k].block != 0 ||
        c->head_dim_v % kvc__types[c->type_v].block != 0)
        return KVC_ERR_INVALID;
    if ((c->allocator.alloc == NULL) != (c->allocator.free == NULL)) return KVC_ERR_INVALID;
    if (c->arena == NULL && c->arena_bytes != 0) return KVC_ERR_INVALID;
    return KVC_OK;
}

static kvc_result kvc__layout_for(const kvc_pool_config *c, kvc__layout *L) {
    int of = 0;
    size_t cells_total, per_page_layer, pages;
    kvc_result r = kvc__check_config(c);
    if (r != KVC_OK) return r;
    memset(L, 0, sizeof(*L));
    L->page_cells = c->page_cells ? c->page_cells : KVC__DEFAULT_PAGE_CELLS;
    /* rows are at most 4 bytes a value: bound that before computing them */
    kvc__mul((size_t)c->n_kv_heads, kvc__mul((size_t)c->head_dim_k + (size_t)c->head_dim_v, 4, &of), &of);
    if (of) return KVC_ERR_OVERFLOW;
    /* kvc_put, the converters and the kernels count a row's values (n_kv_heads * head_dim)
       in int32: 65536 heads of 65536 would wrap there */
    if ((int64_t)c->n_kv_heads * KVC__MAX(c->head_dim_k, c->head_dim_v) > INT32_MAX) return KVC_ERR_OVERFLOW;
    L->k_row = kvc__row_bytes(c->type_k, c->n_kv_heads, c->head_dim_k);
    L->v_row = kvc__row_bytes(c->type_v, c->n_kv_heads, c->head_dim_v);
    per_page_layer = kvc__mul(kvc__add(L->k_row, L->v_row, &of), (size_t)L->page_cells, &of);
    L->page_bytes = kvc__mul(per_page_layer, (size_t)c->n_layers, &of);
    if (of) return KVC_ERR_OVERFLOW;
    pages = c->budget_bytes / L->page_bytes;
    if (pages < 1) return KVC_ERR_INVALID; /* the budget does not hold a single page */
    /* every cell index must fit an int32 */
    if (pages > (size_t)(INT32_MAX / L->page_cells)) pages = (size_t)(INT32_MAX / L->page_cells);
    L->max_pages = (int32_t)pages;
    cells_total = pages * (size_t)L->page_cells;
    L->meta_bytes = kvc__align_up(sizeof(kvc_pool), 16, &of);
    L->meta_bytes = kvc__add(L->meta_bytes, kvc__mul(pages, 2 * sizeof(uint32_t), &of), &of);
    L->meta_bytes = kvc__add(L->meta_bytes, kvc__mul(cells_total, sizeof(int32_t), &of), &of);
    L->slab_bytes = kvc__mul(pages, L->page_bytes, &of);
    L->object_bytes = c->arena_object_bytes;
    if (L->object_bytes == 0) /* room for ~32 caches or snapshots spanning the whole pool */
        L->object_bytes = kvc__add(65536, kvc__mul(32, kvc__add(kvc__mul(pages, 4, &of),
                                   (size_t)c->n_layers + 512, &of), &of), &of);
    L->arena_bytes = kvc__align_up(L->meta_bytes, KVC__SLAB_ALIGN, &of);
    L->arena_bytes = kvc__add(L->arena_bytes, L->slab_bytes, &of);
    L->arena_bytes = kvc__add(L->arena_bytes, kvc__align_up(L->object_bytes, 16, &of), &of);
    L->arena_bytes = kvc__add(L->arena_bytes, KVC__SLAB_ALIGN + 16, &of); /* base alignment */
    return of ? KVC_ERR_OVERFLOW : KVC_OK;
}

KVCDEF kvc_result kvc_pool_config_init(kvc_pool_config *cfg) {
    if (cfg == NULL) return KVC_ERR_NULL;
    memset(cfg, 0, sizeof(*cfg));
    cfg->type_k = KVC_TYPE_F32;
    cfg->type_v = KVC_TYPE_F32;
    cfg->page_cells = KVC__DEFAULT_PAGE_CELLS;
    return KVC_OK;
}

KVCDEF kvc_result kvc_pool_arena_bytes(const kvc_pool_config *cfg, size_t *bytes) {
    kvc__layout L;
    kvc_result r;
    if (cfg == NULL || bytes == NULL) return KVC_ERR_NULL;
    r = kvc__layout_for(cfg, &L);
    if (r == KVC_OK) *bytes = L.arena_bytes;
    return r;
}

static unsigned char *kvc__align_ptr(void *p, size_t a) {
    uintptr_t u = (uintptr_t)p;
    return (unsigned char *)(u + ((a - (u % a)) % a));
}

/* Lay the pool struct and its arrays out in `meta`, the page storage at `slab`. */
static kvc_pool *kvc__pool_init(unsigned char *meta, unsigned char *slab, const kvc_pool_config *cfg,
                                const kvc__layout *L) {
    kvc_pool *p = (kvc_pool *)meta;
    int32_t i;
    unsigned char *cursor = meta + ((sizeof(kvc_pool) + 15) & ~(size_t)15);
    memset(p, 0, sizeof(*p));
    p->cfg = *cfg;
    p->cfg.page_cells = L->page_cells;
    p->page_cells = L->page_cells;
    p->max_pages = L->max_pages;
    p->k_row = L->k_row;
    p->v_row = L->v_row;
    p->page_k_bytes = L->k_row * (size_t)L->page_cells;
    p->page_v_bytes = L->v_row * (size_t)L->page_cells;
    p->page_bytes = L->page_bytes;
    p->slab = slab;
    p->v_region = p->page_k_bytes * (size_t)L->max_pages * (size_t)cfg->n_layers;
    p->refcount = (uint32_t *)cursor;
    cursor += sizeof(uint32_t) * (size_t)L->max_pages;
    p->free_pages = (uint32_t *)cursor;
    cursor += sizeof(uint32_t) * (size_t)L->max_pages;
    p->pos = (int32_t *)cursor;
    for (i = 0; i < L->max_pages; ++i) {
        p->refcount[i] = 0;
        p->free_pages[i] = (uint32_t)(L->max_pages - 1 - i); /* page 0 pops first */
    }
    memset(p->pos, 0xff, sizeof(int32_t) * (size_t)L->max_pages * (size_t)L->page_cells);
    p->n_free = L->max_pages;
    p->cpu = kvc__cpu_detect() & ~cfg->cpu_disable;
    p->tk = kvc__pick_type(cfg->type_k, p->cpu);
    p->tv = kvc__pick_type(cfg->type_v, p->cpu);
    return p;
}

KVCDEF kvc_result kvc_pool_create(const kvc_pool_config *cfg, kvc_pool **out) {
    kvc__layout L;
    kvc_result r;
    kvc_pool *p;
    if (cfg == NULL || out == NULL) return KVC_ERR_NULL;
    r = kvc__layout_for(cfg, &L);
    if (r != KVC_OK) return r;
    if (cfg->arena != NULL) {
        unsigned char *meta = kvc__align_ptr(cfg->arena, 16), *slab, *objects;
        if (cfg->arena_bytes < L.arena_bytes) return KVC_ERR_ARENA_TOO_SMALL;
        slab = kvc__align_ptr(meta + L.meta_bytes, KVC__SLAB_ALIGN);
        objects = kvc__align_ptr(slab + L.slab_bytes, 16);
        p = kvc__pool_init(meta, slab, cfg, &L);
        p->arena_mode = 1;
        kvc__heap_init(&p->heap, objects,
                       (size_t)((unsigned char *)cfg->arena + cfg->arena_bytes - objects));
    } else {
        kvc_allocator a = cfg->allocator;
        void *meta, *slab_block;
        if (a.alloc == NULL) { a.alloc = kvc__default_alloc; a.free = kvc__default_free; }
        meta = a.alloc(L.meta_bytes, a.user);
        if (meta == NULL) return KVC_ERR_NO_MEMORY;
        slab_block = a.alloc(L.slab_bytes + KVC__SLAB_ALIGN, a.user);
        if (slab_block == NULL) { a.free(meta, a.user); return KVC_ERR_NO_MEMORY; }
        p = kvc__pool_init((unsigned char *)meta, kvc__align_ptr(slab_block, KVC__SLAB_ALIGN), cfg, &L);
        p->alloc = a;
        p->slab_block = slab_block;
    }
    *out = p;
    return KVC_OK;
}

KVCDEF kvc_result kvc_pool_destroy(kvc_pool *pool) {
    kvc_allocator a;
    if (pool == NULL) return KVC_ERR_NULL;
    if (pool->live_caches || pool->live_snapshots || pool->live_prefixes) return KVC_ERR_BUSY;
    KVCACHE_ASSERT(pool->n_free == pool->max_pages);
    if (pool->arena_mode) return KVC_OK; /* the caller owns the arena */
    a = pool->alloc;
    a.free(pool->slab_block, a.user);
    a.free(pool, a.user);
    return KVC_OK;
}

KVCDEF kvc_result kvc_pool_stats_get(const kvc_pool *pool, kvc_pool_stats *s) {
    if (pool == NULL || s == NULL) return KVC_ERR_NULL;
    memset(s, 0, sizeof(*s));
    s->page_bytes = pool->page_bytes;
    s->k_row_bytes = pool->k_row;
    s->v_row_bytes = pool->v_row;
    s->page_cells = pool->page_cells;
    s->pages_total = pool->max_pages;
    s->pages_used = pool->max_pages - pool->n_free;
    s->pages_peak = pool->pages_peak;
    s->bytes_used = (size_t)s->pages_used * pool->page_bytes;
    s->bytes_peak = (size_t)s->pages_peak * pool->page_bytes;
    s->budget_bytes = pool->cfg.budget_bytes;
    s->live_caches = pool->live_caches;
    s->live_snapshots = pool->live_snapshots;
    s->live_prefixes = pool->live_prefixes;
    s->cpu_features = pool->cpu;
    return KVC_OK;
}

static void *kvc__alloc(kvc_pool *p, size_t n) {
    if (p->arena_mode) return kvc__heap_alloc(&p->heap, n);
    return p->alloc.alloc(n, p->alloc.user);
}
static void kvc__free(kvc_pool *p, void *ptr) {
    if (ptr == NULL) return;
    if (p->arena_mode) kvc__heap_free(&p->heap, ptr);
    else p->alloc.free(ptr, p->alloc.user);
}

/* Page reference counting. Callers check n_free first, so acquire never fails. */
static uint32_t kvc__page_acquire(kvc_pool *p) {
    uint32_t page;
    KVCACHE_ASSERT(p->n_free > 0);
    page = p->free_pages[--p->n_free];
    KVCACHE_ASSERT(p->refcount[page] == 0);
    p->refcount[page] = 1;
    if (p->max_pages - p->n_free > p->pages_peak) p->pages_peak = p->max_pages - p->n_free;
    return page;
}
static void kvc__page_retain(kvc_pool *p, uint32_t page) {
    KVCACHE_ASSERT(p->refcount[page] > 0);
    p->refcount[page]++;
}
static void kvc__page_release(kvc_pool *p, uint32_t page) {
    KVCACHE_ASSERT(p->refcount[page] > 0);
    if (--p->refcount[page] == 0) p->free_pages[p->n_free++] = page;
}

static unsigned char *kvc__k_at(const kvc_pool *p, int32_t layer, uint32_t page, int32_t cell) {
    return p->slab + ((size_t)layer * (size_t)p->max_pages + page) * p->page_k_bytes +
           (size_t)cell * p->k_row;
}
static unsigned char *kvc__v_at(const kvc_pool *p, int32_t layer, uint32_t page, int32_t cell) {
    return p->slab + p->v_region + ((size_t)layer * (size_t)p->max_pages + page) * p->page_v_bytes +
           (size_t)cell * p->v_row;
}
static int32_t *kvc__pos_at(const kvc_pool *p, uint32_t page, int32_t cell) {
    return p->pos + (size_t)page * (size_t)p->page_cells + (size_t)cell;
}

/* Copy cells [c0, c1) of every layer (and their positions) from one page to another. */
static void kvc__page_copy_cells(kvc_pool *p, uint32_t dst, uint32_t src, int32_t c0, int32_t c1) {
    int32_t l, n = c1 - c0;
    if (n <= 0) return;
    for (l = 0; l < p->cfg.n_layers; ++l) {
        memcpy(kvc__k_at(p, l, dst, c0), kvc__k_at(p, l, src, c0), (size_t)n * p->k_row);
        memcpy(kvc__v_at(p, l, dst, c0), kvc__v_at(p, l, src, c0), (size_t)n * p->v_row);
    }
    memcpy(kvc__pos_at(p, dst, c0), kvc__pos_at(p, src, c0), (size_t)n * sizeof(int32_t));
}

/* ---- Layer 2: cells and page tables --------------------------------------------------
   A FULL or ROTATING cache maps token t (its position) to logical page t / page_cells,
   slot t % page_cells. pages[] lists the logical pages it holds in order: the first
   n_sink_pages entries are logical pages 0.. (ROTATING sinks, never released), the
   rest are consecutive logical pages starting at first_lpage. A FULL cache has no
   sinks and first_lpage 0; a ROTATING cache releases window pages from the front. */

struct kvc_cache {
    kvc_pool *pool;
    uint32_t id;             /* unique within the pool: snapshots name their cache */
    kvc_cache_config cfg;
    int32_t offset;          /* tokens held so far = the next position */
    int32_t batch_begin;     /* first token of the current (or last) batch */
    int32_t batch_pending;   /* layers of the current batch not put yet */
    unsigned char *batch_put;/* [n_layers] */
    int32_t n_sink_pages;
    int32_t first_lpage;
    int32_t n_pages;
    uint32_t *pages;         /* [pool->max_pages] */
    /* CAUSAL: cell i is slot i % page_cells of pages[i / page_cells] */
    int32_t capacity, words; /* cells; 32-bit words per cell's set of sequences */
    int32_t n_used;          /* cells holding at least one sequence */
    uint32_t *seqs;          /* [capacity * words] */
    int32_t *seq_lo, *seq_hi;/* [max_seqs] cells [lo, hi) hold the sequence (lo >= hi: none) */
    int32_t batch_loc, batch_n;          /* cells of the current (or last) batch */
    int32_t *batch_pos, *batch_seq;      /* [capacity] */
    int32_t *in_pos, *in_seq;            /* [capacity] kvc_begin's batch */
    unsigned char *batch_nc;             /* [capacity] non-causal marks */
    int32_t range_lo, range_hi;          /* cells the batch reads, padded */
    int32_t *scratch;                    /* [max_seqs] */
    float *row;                          /* one K row as f32, for re-rotation */
    double *rope_cos, *rope_sin;         /* [head_dim_k / 2 + 1] the angles of one shift */
};

struct kvc_snapshot {
    kvc_pool *pool;
    uint32_t cache_id;
    kvc_kind kind;
    int32_t from, to;
    int32_t first_lpage;     /* FULL: logical page of pages[0]; ROTATING: the cache's */
    int32_t batch_begin;     /* ROTATING: the window anchor at snapshot time */
    int32_t n_cells;         /* CAUSAL: cells of the sequence, packed from pages[0] slot 0 */
    int32_t n_pages;
    uint32_t *pages;
};

/* Where logical page lp sits in pages[], or -1. */
static int32_t kvc__lpage_index(const kvc_cache *c, int32_t lp) {
    int32_t idx;
    if (lp < 0) return -1;
    if (lp < c->n_sink_pages) return lp < c->n_pages ? lp : -1;
    if (lp < c->first_lpage) return -1;
    idx = c->n_sink_pages + (lp - c->first_lpage);
    return idx < c->n_pages ? idx : -1;
}

static int32_t kvc__entry_lpage(const kvc_cache *c, int32_t idx) {
    return idx < c->n_sink_pages ? idx : c->first_lpage + (idx - c->n_sink_pages);
}

static int32_t kvc__recent_window(const kvc_cache *c) { return c->cfg.window - c->cfg.sinks; }

/* The oldest non-sink token a query at position p of a ROTATING cache may see. */
static int64_t kvc__window_lo(const kvc_cache *c, int64_t p) { return p - kvc__recent_window(c) + 1; }

/* The tokens a kernel reads: at most two ranges, [b0,e0) then [b1,e1). */
typedef struct kvc__ranges {
    int32_t b[2], e[2];
} kvc__ranges;

static kvc__ranges kvc__view(const kvc_cache *c) {
    kvc__ranges r;
    r.b[0] = r.e[0] = r.b[1] = r.e[1] = 0;
    if (c->cfg.kind == KVC_KIND_CAUSAL) { /* cell indices, not positions */
        r.b[1] = c->range_lo;
        r.e[1] = c->range_hi;
    } else if (c->cfg.kind == KVC_KIND_ROTATING) {
        /* kvc_begin released only pages older than this, so every cell here is held */
        int64_t lo = kvc__window_lo(c, c->batch_begin);
        int32_t s = KVC__MIN(c->cfg.sinks, c->offset);
        r.e[0] = s;
        lo = KVC__MAX(lo, (int64_t)s);
        r.b[1] = (int32_t)KVC__MIN(lo, (int64_t)c->offset);
        r.e[1] = c->offset;
    } else {
        r.e[1] = c->offset;
    }
    return r;
}

/* A run of cells of one page, [c0, c1). */
typedef struct kvc__run {
    uint32_t page;
    int32_t c0, c1;
    int32_t t0;     /* the token (CAUSAL: cell index) at slot c0 */
} kvc__run;

typedef struct kvc__iter {
    const kvc_cache *c;
    kvc__ranges r;
    int32_t part, t;
} kvc__iter;

static void kvc__iter_init(kvc__iter *it, const kvc_cache *c) {
    it->c = c;
    it->r = kvc__view(c);
    it->part = 0;
    it->t = it->r.b[0];
}

/* CAUSAL: iterate the cells [lo, hi) instead of the batch's view. */
static void kvc__iter_init_cells(kvc__iter *it, const kvc_cache *c, int32_t lo, int32_t hi) {
    it->c = c;
    it->r.b[0] = it->r.e[0] = 0;
    it->r.b[1] = lo;
    it->r.e[1] = hi;
    it->part = 0;
    it->t = 0;
}

static int kvc__iter_next(kvc__iter *it, kvc__run *run) {
    int32_t pc = it->c->pool->page_cells;
    while (it->part < 2) {
        if (it->t < it->r.e[it->part]) {
            int32_t lp = it->t / pc, idx = kvc__lpage_index(it->c, lp), end;
            KVCACHE_ASSERT(idx >= 0);
            end = (int32_t)KVC__MIN((int64_t)it->r.e[it->part], (int64_t)lp * pc + pc);
            run->page = it->c->pages[idx];
            run->t0 = it->t;
            run->c0 = it->t - lp * pc;
            run->c1 = end - lp * pc;
            it->t = end;
            return 1;
        }
        if (++it->part < 2) it->t = KVC__MAX(it->r.b[1], it->r.e[0]);
    }
    return 0;
}

/* Release the pages that hold no token below n_tokens (from the back). */
static void kvc__release_from(kvc_cache *c, int32_t n_tokens) {
    int32_t pc = c->pool->page_cells;
    while (c->n_pages > 0 && (int64_t)kvc__entry_lpage(c, c->n_pages - 1) * pc >= n_tokens) {
        kvc__page_release(c->pool, c->pages[--c->n_pages]);
    }
    /* first_lpage > n_sink_pages remembers that window pages were released (kvc__wrapped) */
    if (n_tokens == 0) c->first_lpage = c->n_sink_pages;
}

/* Go back to `target` tokens. `anchor` becomes batch_begin, which sets the ROTATING
   view: target - 1 (a batch of one token) unless the caller knows better. */
static void kvc__rewind_to(kvc_cache *c, int32_t target, int32_t anchor) {
    kvc__release_from(c, target);
    c->offset = target;
    c->batch_begin = anchor;
    c->batch_pending = 0;
}
static void kvc__rewind(kvc_cache *c, int32_t target) {
    kvc__rewind_to(c, target, target > 0 ? target - 1 : 0);
}

/* ---- Layer 3: cache kinds ----------------------------------------------------------- */

static int kvc__batch_open(const kvc_cache *c) { return c->batch_pending > 0; }

/* the CAUSAL kind's parts of the common calls (Layer 3b) */
static kvc_result kvc__begin_seq0(kvc_cache *c, int32_t n);
static void kvc__causal_cancel(kvc_cache *c);
static void kvc__causal_clear(kvc_cache *c);
static int32_t *kvc__cell_pos(const kvc_cache *c, int32_t cell);

KVCDEF kvc_result kvc_cache_config_init(kvc_cache_config *cfg, kvc_kind kind) {
    if (cfg == NULL) return KVC_ERR_NULL;
    memset(cfg, 0, sizeof(*cfg));
    cfg->kind = kind;
    return KVC_OK;
}

static kvc_result kvc__check_causal(const kvc_pool *pool, const kvc_cache_config *c) {
    const kvc_rope *r = &c->rope;
    if (c->capacity < 1 || c->padding < 0 || c->max_seqs < 0 || c->max_seqs > (1 << 20) || c->chunk < 0 ||
        c->window < 0)
        return KVC_ERR_INVALID;
    if (c->capacity > INT32_MAX - KVC__MAX(c->padding, 1)) return KVC_ERR_RANGE;
    if ((int)r->style < (int)KVC_ROPE_NONE || (int)r->style > (int)KVC_ROPE_INTERLEAVED) return KVC_ERR_INVALID;
    if (r->shift == NULL && r->style != KVC_ROPE_NONE) {
        if (!(r->theta > 0.0f) || r->n_dims < 0 || r->n_dims % 2 != 0 || r->n_dims > pool->cfg.head_dim_k)
            return KVC_ERR_INVALID;
    }
    return KVC_OK;
}

/* The causal cache's own arrays, after the common part of the struct. *of is set when
   they do not fit a size_t: capacity x max_seqs bits exceed 4 GiB on 32-bit hosts. */
static size_t kvc__causal_bytes(const kvc_pool *p, int32_t capacity, int32_t max_seqs, int32_t words, int *of) {
    size_t n = kvc__mul((size_t)capacity, (size_t)words * 4 + 4 * sizeof(int32_t) + 1, of);
    n = kvc__add(n, (size_t)max_seqs * 3 * sizeof(int32_t), of);
    n = kvc__add(n, kvc__mul(sizeof(float) * (size_t)p->cfg.n_kv_heads, (size_t)p->cfg.head_dim_k, of), of);
    n = kvc__add(n, kvc__mul(sizeof(double), (size_t)p->cfg.head_dim_k + 2, of), of);
    return kvc__add(n, 64 + sizeof(double), of);
}

KVCDEF kvc_result kvc_cache_create(kvc_pool *pool, const kvc_cache_config *cfg, kvc_cache **out) {
    kvc_cache *c;
    kvc_cache_config cc;
    size_t bytes;
    int32_t pages = 0, i, words = 0;
    unsigned char *cursor;
    if (pool == NULL || cfg == NULL || out == NULL) return KVC_ERR_NULL;
    cc = *cfg;
    if (cc.kind == KVC_KIND_FULL) {
        if (cc.window != 0 || cc.sinks != 0) return KVC_ERR_INVALID;
    } else if (cc.kind == KVC_KIND_ROTATING) {
        if (cc.window < 1 || cc.sinks < 0 || cc.sinks >= cc.window) return KVC_ERR_INVALID;
    } else if (cc.kind == KVC_KIND_CAUSAL) {
        kvc_result r = kvc__check_causal(pool, &cc);
        if (r != KVC_OK) return r;
        if (cc.sinks != 0) return KVC_ERR_INVALID;
        if (cc.padding == 0) cc.padding = 1;
        if (cc.max_seqs == 0) cc.max_seqs = 256;
        if (cc.rope.n_dims == 0) cc.rope.n_dims = pool->cfg.head_dim_k;
        cc.capacity = (cc.capacity + cc.padding - 1) / cc.padding * cc.padding;
        pages = (int32_t)(((int64_t)cc.capacity + pool->page_cells - 1) / pool->page_cells);
        if (pages > pool->n_free) return KVC_ERR_FULL;
        words = (cc.max_seqs + 31) / 32;
    } else {
        return KVC_ERR_INVALID;
    }
    if (cc.kind != KVC_KIND_CAUSAL) { /* the causal-only fields mean nothing here */
        memset(&cc.rope, 0, sizeof(cc.rope));
        cc.capacity = cc.padding = cc.max_seqs = cc.chunk = 0;
    }
    {   /* checked: a wrapped size would be a small block written far past its end */
        int of = 0;
        bytes = kvc__add(sizeof(kvc_cache) + 16, sizeof(uint32_t) * (size_t)pool->max_pages, &of);
        bytes = kvc__add(bytes, (size_t)pool->cfg.n_layers, &of);
        if (cc.kind == KVC_KIND_CAUSAL)
            bytes = kvc__add(bytes, kvc__causal_bytes(pool, cc.capacity, cc.max_seqs, words, &of), &of);
        if (of) return KVC_ERR_OVERFLOW;
    }
    c = (kvc_cache *)kvc__alloc(pool, bytes);
    if (c == NULL) return KVC_ERR_NO_MEMORY;
    memset(c, 0, sizeof(*c));
    c->pool = pool;
    c->id = ++pool->next_cache_id;
    c->cfg = cc;
    c->pages = (uint32_t *)(c + 1);
    cursor = (unsigned char *)(c->pages + pool->max_pages);
    if (cc.kind == KVC_KIND_CAUSAL) { /* 4-byte arrays first, then bytes */
        c->capacity = cc.capacity;
        c->words = words;
        cursor = kvc__align_ptr(cursor, sizeof(double)); /* the page table may end 4-aligned */
        c->rope_cos = (double *)cursor;
        c->rope_sin = c->rope_cos + pool->cfg.head_dim_k / 2 + 1;
        cursor += sizeof(double) * (size_t)(pool->cfg.head_dim_k + 2);
        c->row = (float *)cursor;
        cursor += sizeof(float) * (size_t)pool->cfg.n_kv_heads * (size_t)pool->cfg.head_dim_k;
        c->seqs = (uint32_t *)cursor;
        cursor += sizeof(uint32_t) * (size_t)words * (size_t)cc.capacity;
        c->seq_lo = (int32_t *)cursor;
        c->seq_hi = c->seq_lo + cc.max_seqs;
        c->scratch = c->seq_hi + cc.max_seqs;
        c->batch_pos = c->scratch + cc.max_seqs;
        c->batch_seq = c->batch_pos + cc.capacity;
        c->in_pos = c->batch_seq + cc.capacity;
        c->in_seq = c->in_pos + cc.capacity;
        cursor = (unsigned char *)(c->in_seq + cc.capacity);
        c->batch_nc = cursor;
        cursor += cc.capacity;
        memset(c->seqs, 0, sizeof(uint32_t) * (size_t)words * (size_t)cc.capacity);
        for (i = 0; i < cc.max_seqs; ++i) { c->seq_lo[i] = INT32_MAX; c->seq_hi[i] = 0; }
        for (i = 0; i < pages; ++i) { /* zeroed: masked cells of a padded view must not hold NaNs */
            int32_t l;
            c->pages[i] = kvc__page_acquire(pool);
            memset(kvc__pos_at(pool, c->pages[i], 0), 0xff, sizeof(int32_t) * (size_t)pool->page_cells);
            for (l = 0; l < pool->cfg.n_layers; ++l) {
                memset(kvc__k_at(pool, l, c->pages[i], 0), 0, pool->page_k_bytes);
                memset(kvc__v_at(pool, l, c->pages[i], 0), 0, pool->page_v_bytes);
            }
        }
        c->n_pages = pages;
    }
    c->batch_put = cursor;
    /* in 64 bits: sinks + page_cells - 1 overflows int32 for sinks near INT32_MAX */
    c->n_sink_pages = cc.kind == KVC_KIND_ROTATING
                          ? (int32_t)(((int64_t)cc.sinks + pool->page_cells - 1) / pool->page_cells) : 0;
    c->first_lpage = c->n_sink_pages;
    pool->live_caches++;
    *out = c;
    return KVC_OK;
}

KVCDEF kvc_result kvc_cache_destroy(kvc_cache *cache) {
    kvc_pool *p;
    if (cache == NULL) return KVC_ERR_NULL;
    p = cache->pool;
    kvc__rewind(cache, 0);
    p->live_caches--;
    kvc__free(p, cache);
    return KVC_OK;
}

KVCDEF kvc_result kvc_cache_fork(const kvc_cache *cache, kvc_cache **out) {
    kvc_cache *c;
    int32_t i;
    kvc_result r;
    if (cache == NULL || out == NULL) return KVC_ERR_NULL;
    if (cache->cfg.kind == KVC_KIND_CAUSAL) return KVC_ERR_UNSUPPORTED;
    if (kvc__batch_open(cache)) return KVC_ERR_STATE;
    r = kvc_cache_create(cache->pool, &cache->cfg, &c);
    if (r != KVC_OK) return r;
    for (i = 0; i < cache->n_pages; ++i) {
        kvc__page_retain(cache->pool, cache->pages[i]);
        c->pages[i] = cache->pages[i];
    }
    c->n_pages = cache->n_pages;
    c->first_lpage = cache->first_lpage;
    c->offset = cache->offset;
    c->batch_begin = cache->batch_begin;
    *out = c;
    return KVC_OK;
}

KVCDEF kvc_result kvc_cache_clear(kvc_cache *cache) {
    if (cache == NULL) return KVC_ERR_NULL;
    if (cache->cfg.kind == KVC_KIND_CAUSAL) kvc__causal_clear(cache);
    else kvc__rewind(cache, 0);
    return KVC_OK;
}

KVCDEF kvc_result kvc_cache_offset(const kvc_cache *cache, int32_t *offset) {
    if (cache == NULL || offset == NULL) return KVC_ERR_NULL;
    *offset = cache->cfg.kind == KVC_KIND_CAUSAL ? cache->n_used : cache->offset;
    return KVC_OK;
}

KVCDEF kvc_result kvc_cache_cells(const kvc_cache *cache, int32_t *n_cells) {
    kvc__ranges r;
    if (cache == NULL || n_cells == NULL) return KVC_ERR_NULL;
    r = kvc__view(cache);
    *n_cells = (r.e[0] - r.b[0]) + (r.e[1] - KVC__MAX(r.b[1], r.e[0]));
    return KVC_OK;
}

KVCDEF kvc_result kvc_cache_pages(const kvc_cache *cache, int32_t *n_pages) {
    if (cache == NULL || n_pages == NULL) return KVC_ERR_NULL;
    *n_pages = cache->n_pages;
    return KVC_OK;
}

/* Pages a ROTATING batch starting at o frees: leading window pages whose every
   token is older than the oldest token the batch's first query may see. */
static int32_t kvc__dead_pages(const kvc_cache *c, int32_t o, int32_t *freed) {
    int32_t idx, n = 0, pc = c->pool->page_cells;
    int64_t lo = kvc__window_lo(c, o);
    *freed = 0;
    if (c->cfg.kind != KVC_KIND_ROTATING) return 0;
    for (idx = c->n_sink_pages; idx < c->n_pages; ++idx) {
        if (((int64_t)kvc__entry_lpage(c, idx) + 1) * pc > lo) break;
        n++;
        if (c->pool->refcount[c->pages[idx]] == 1) (*freed)++;
    }
    return n;
}

static void kvc__drop_front(kvc_cache *c, int32_t n) {
    int32_t i, s = c->n_sink_pages;
    if (n <= 0) return;
    for (i = 0; i < n; ++i) kvc__page_release(c->pool, c->pages[s + i]);
    memmove(c->pages + s, c->pages + s + n, sizeof(uint32_t) * (size_t)(c->n_pages - s - n));
    c->n_pages -= n;
    c->first_lpage += n;
}

/* Make the page holding token o-1 (partly filled) private before writing after it. */
static void kvc__unshare_tail(kvc_cache *c, int32_t o) {
    kvc_pool *p = c->pool;
    int32_t idx, pc = p->page_cells;
    uint32_t fresh;
    if (o % pc == 0) return;
    idx = kvc__lpage_index(c, o / pc);
    KVCACHE_ASSERT(idx >= 0);
    if (p->refcount[c->pages[idx]] == 1) return;
    fresh = kvc__page_acquire(p);
    kvc__page_copy_cells(p, fresh, c->pages[idx], 0, o % pc);
    kvc__page_release(p, c->pages[idx]);
    c->pages[idx] = fresh;
}

static int kvc__tail_shared(const kvc_cache *c, int32_t o) {
    int32_t idx;
    if (o % c->pool->page_cells == 0) return 0;
    idx = kvc__lpage_index(c, o / c->pool->page_cells);
    return idx >= 0 && c->pool->refcount[c->pages[idx]] > 1;
}

KVCDEF kvc_result kvc_begin(kvc_cache *cache, int32_t n_tokens) {
    kvc_pool *p;
    int32_t o, e, pc, first_new, last, n_new, n_dead, freed, lp, t;
    if (cache == NULL) return KVC_ERR_NULL;
    if (n_tokens < 1) return KVC_ERR_INVALID;
    if (kvc__batch_open(cache)) return KVC_ERR_STATE;
    if (cache->cfg.kind == KVC_KIND_CAUSAL) return kvc__begin_seq0(cache, n_tokens);
    p = cache->pool;
    pc = p->page_cells;
    o = cache->offset;
    if (n_tokens > INT32_MAX - o) return KVC_ERR_RANGE;
    e = o + n_tokens;
    first_new = (int32_t)(((int64_t)o + pc - 1) / pc);
    last = (e - 1) / pc;
    n_new = last - first_new + 1;
    n_dead = kvc__dead_pages(cache, o, &freed);
    if ((int64_t)n_new + kvc__tail_shared(cache, o) > (int64_t)p->n_free + freed) return KVC_ERR_FULL;
    /* from here on nothing can fail */
    kvc__drop_front(cache, n_dead);
    kvc__unshare_tail(cache, o);
    for (lp = first_new; lp <= last; ++lp) {
        if (cache->n_pages == cache->n_sink_pages && lp >= cache->n_sink_pages) cache->first_lpage = lp;
        cache->pages[cache->n_pages++] = kvc__page_acquire(p);
    }
    for (t = o; t < e; ++t) *kvc__pos_at(p, cache->pages[kvc__lpage_index(cache, t / pc)], t % pc) = t;
    cache->offset = e;
    cache->batch_begin = o;
    cache->batch_pending = p->cfg.n_layers;
    memset(cache->batch_put, 0, (size_t)p->cfg.n_layers);
    return KVC_OK;
}

KVCDEF kvc_result kvc_put(kvc_cache *cache, int32_t layer, const float *k, const float *v) {
    kvc_pool *p;
    const kvc__type_info *tk, *tv;
    int32_t t, pc, nk, nv;
    if (cache == NULL || k == NULL || v == NULL) return KVC_ERR_NULL;
    p = cache->pool;
    if (layer < 0 || layer >= p->cfg.n_layers) return KVC_ERR_RANGE;
    if (!kvc__batch_open(cache)) return KVC_ERR_STATE;
    pc = p->page_cells;
    tk = &p->tk;
    tv = &p->tv;
    nk = p->cfg.n_kv_heads * p->cfg.head_dim_k;
    nv = p->cfg.n_kv_heads * p->cfg.head_dim_v;
    /* the batch's cells: tokens batch_begin.. (CAUSAL: cells batch_loc..) */
    for (t = 0; t < (cache->cfg.kind == KVC_KIND_CAUSAL ? cache->batch_n : cache->offset - cache->batch_begin); ++t) {
        int32_t cell = cache->cfg.kind == KVC_KIND_CAUSAL ? cache->batch_loc + t : cache->batch_begin + t;
        uint32_t page = cache->pages[kvc__lpage_index(cache, cell / pc)];
        KVCACHE_ASSERT(p->refcount[page] == 1);
        tk->from_f32(k + (size_t)t * (size_t)nk, kvc__k_at(p, layer, page, cell % pc), nk);
        tv->from_f32(v + (size_t)t * (size_t)nv, kvc__v_at(p, layer, page, cell % pc), nv);
    }
    if (!cache->batch_put[layer]) {
        cache->batch_put[layer] = 1;
        cache->batch_pending--;
    }
    return KVC_OK;
}

KVCDEF kvc_result kvc_cancel(kvc_cache *cache) {
    if (cache == NULL) return KVC_ERR_NULL;
    if (!kvc__batch_open(cache)) return KVC_ERR_STATE;
    if (cache->cfg.kind == KVC_KIND_CAUSAL) { kvc__causal_cancel(cache); return KVC_OK; }
    /* keep batch_begin: the window kvc_begin kept is exactly the one it anchors */
    kvc__rewind_to(cache, cache->batch_begin, cache->batch_begin);
    return KVC_OK;
}

/* A ROTATING window has wrapped once it has held more than W tokens (the seed's rule),
   or released a page (a kvc_cancel can bring the offset back below W after that). */
static int kvc__wrapped(const kvc_cache *c) {
    return c->offset > c->cfg.window || c->first_lpage > c->n_sink_pages;
}

static int kvc__can_trim(const kvc_cache *c) {
    if (c->cfg.kind == KVC_KIND_CAUSAL) return 0; /* use kvc_seq_remove */
    return c->cfg.kind != KVC_KIND_ROTATING || !kvc__wrapped(c);
}

KVCDEF kvc_result kvc_can_trim(const kvc_cache *cache, int *can_trim) {
    if (cache == NULL || can_trim == NULL) return KVC_ERR_NULL;
    *can_trim = kvc__can_trim(cache);
    return KVC_OK;
}

KVCDEF kvc_result kvc_trim(kvc_cache *cache, int32_t n_tokens) {
    if (cache == NULL) return KVC_ERR_NULL;
    if (cache->cfg.kind == KVC_KIND_CAUSAL) return KVC_ERR_UNSUPPORTED;
    if (kvc__batch_open(cache)) return KVC_ERR_STATE; /* kvc_cancel first */
    if (n_tokens < 0 || n_tokens > cache->offset) return KVC_ERR_RANGE;
    if (!kvc__can_trim(cache)) return KVC_ERR_UNSUPPORTED;
    kvc__rewind(cache, cache->offset - n_tokens);
    return KVC_OK;
}

/* ---- Layer 3b: the CAUSAL kind (ollama's kvcache.Causal) ---------------------------
   A fixed set of cells, each with a position (in the pool, -1 when empty) and a set of
   sequences (a bitset). A batch takes a run of free cells; copy_prefix shares cells by
   adding a sequence to their sets; nothing about it is copied. */

static int kvc__is_causal(const kvc_cache *c) { return c->cfg.kind == KVC_KIND_CAUSAL; }

static int32_t *kvc__cell_pos(const kvc_cache *c, int32_t cell) {
    int32_t pc = c->pool->page_cells;
    return kvc__pos_at(c->pool, c->pages[cell / pc], cell % pc);
}
static int kvc__cell_has(const kvc_cache *c, int32_t cell, int32_t seq) {
    return (c->seqs[(size_t)cell * c->words + (size_t)(seq >> 5)] >> (seq & 31)) & 1u;
}
static int kvc__cell_empty(const kvc_cache *c, int32_t cell) {
    int32_t w;
    for (w = 0; w < c->words; ++w)
        if (c->seqs[(size_t)cell * c->words + w]) return 0;
    return 1;
}
/* the only sequence of a cell, or -1 when it has none or several */
static int32_t kvc__cell_only(const kvc_cache *c, int32_t cell) {
    int32_t w, found = -1;
    for (w = 0; w < c->words; ++w) {
        uint32_t bits = c->seqs[(size_t)cell * c->words + w];
        if (!bits) continue;
        if (found >= 0 || (bits & (bits - 1u))) return -1;
        for (found = 0; !((bits >> found) & 1u); ++found) {}
        found += w * 32;
    }
    return found;
}
static void kvc__cell_add(kvc_cache *c, int32_t cell, int32_t seq) {
    if (kvc__cell_empty(c, cell)) c->n_used++;
    c->seqs[(size_t)cell * c->words + (size_t)(seq >> 5)] |= 1u << (seq & 31);
    if (cell < c->seq_lo[seq]) c->seq_lo[seq] = cell;
    if (cell + 1 > c->seq_hi[seq]) c->seq_hi[seq] = cell + 1;
}
/* bounds may stay loose after a delete; kvc__seq_bounds tightens them */
static void kvc__cell_del(kvc_cache *c, int32_t cell, int32_t seq) {
    if (!kvc__cell_has(c, cell, seq)) return;
    c->seqs[(size_t)cell * c->words + (size_t)(seq >> 5)] &= ~(1u << (seq & 31));
    if (kvc__cell_empty(c, cell)) {
        c->n_used--;
        *kvc__cell_pos(c, cell) = -1;
    }
}
static void kvc__seq_bounds(kvc_cache *c, int32_t seq) {
    int32_t i, lo = INT32_MAX, hi = 0;
    for (i = KVC__MAX(c->seq_lo[seq], 0); i < c->seq_hi[seq]; ++i)
        if (kvc__cell_has(c, i, seq)) { if (lo == INT32_MAX) lo = i; hi = i + 1; }
    c->seq_lo[seq] = lo;
    c->seq_hi[seq] = hi;
}
static void kvc__all_bounds(kvc_cache *c) {
    int32_t i, s;
    for (s = 0; s < c->cfg.max_seqs; ++s) { c->seq_lo[s] = INT32_MAX; c->seq_hi[s] = 0; }
    for (i = 0; i < c->capacity; ++i)
        for (s = 0; s < c->cfg.max_seqs; ++s)
            if (kvc__cell_has(c, i, s)) {
                if (i < c->seq_lo[s]) c->seq_lo[s] = i;
                c->seq_hi[s] = i + 1;
            }
}
static int kvc__seq_known(const kvc_cache *c, int32_t seq) { return c->seq_lo[seq] < c->seq_hi[seq]; }

/* The mask rule: may a query (pos p, seq s) see cell `cell`? */
static int kvc__causal_visible(const kvc_cache *c, int32_t cell, int32_t p, int32_t s, int non_causal, int32_t window) {
    int32_t key;
    if (!kvc__cell_has(c, cell, s)) return 0;
    key = *kvc__cell_pos(c, cell);
    if (!non_causal && key > p) return 0;
    if (c->cfg.window > 0 && (int64_t)key <= (int64_t)p - c->cfg.window) return 0;
    if (window > 0 && (int64_t)key <= (int64_t)p - window) return 0;
    if (c->cfg.chunk > 0 && key / c->cfg.chunk != p / c->cfg.chunk) return 0;
    return 1;
}

static kvc_result kvc__check_seq(const kvc_cache *c, int32_t seq) {
    if (!kvc__is_causal(c)) return KVC_ERR_UNSUPPORTED;
    return seq >= 0 && seq < c->cfg.max_seqs ? KVC_OK : KVC_ERR_RANGE;
}

/* Copy n cells (K/V of every layer and positions) between two cell indices of caches
   on the same pool, page by page. */
static void kvc__copy_cells(kvc_pool *p, const uint32_t *dst_pages, int32_t dst, const uint32_t *src_pages,
                            int32_t src, int32_t n) {
    int32_t pc = p->page_cells;
    while (n > 0) {
        int32_t k = KVC__MIN(n, KVC__MIN(pc - dst % pc, pc - src % pc)), l;
        uint32_t dp = dst_pages[dst / pc], sp = src_pages[src / pc];
        for (l = 0; l < p->cfg.n_layers; ++l) {
            memcpy(kvc__k_at(p, l, dp, dst % pc), kvc__k_at(p, l, sp, src % pc), (size_t)k * p->k_row);
            memcpy(kvc__v_at(p, l, dp, dst % pc), kvc__v_at(p, l, sp, src % pc), (size_t)k * p->v_row);
        }
        memcpy(kvc__pos_at(p, dp, dst % pc), kvc__pos_at(p, sp, src % pc), (size_t)k * sizeof(int32_t));
        dst += k;
        src += k;
        n -= k;
    }
}

/* Move the live cells into [0, n_used): only cells beyond that move, each into the
   lowest hole, in ascending order, so runs of neighbours move as one block. */
static int32_t kvc__defrag(kvc_cache *c) {
    int32_t hole = 0, src, moves = 0, run_src = -1, run_dst = -1, run_n = 0;
    for (src = c->n_used; src < c->capacity; ++src) {
        if (kvc__cell_empty(c, src)) continue;
        while (!kvc__cell_empty(c, hole)) hole++;
        KVCACHE_ASSERT(hole < c->n_used);
        if (run_n > 0 && src == run_src + run_n && hole == run_dst + run_n) {
            run_n++;
        } else {
            if (run_n > 0) { kvc__copy_cells(c->pool, c->pages, run_dst, c->pages, run_src, run_n); moves++; }
            run_src = src;
            run_dst = hole;
            run_n = 1;
        }
        /* the metadata moves now; the K/V of the run when it ends */
        memcpy(c->seqs + (size_t)hole * c->words, c->seqs + (size_t)src * c->words, sizeof(uint32_t) * (size_t)c->words);
        memset(c->seqs + (size_t)src * c->words, 0, sizeof(uint32_t) * (size_t)c->words);
        hole++;
    }
    if (run_n > 0) { kvc__copy_cells(c->pool, c->pages, run_dst, c->pages, run_src, run_n); moves++; }
    for (src = c->n_used; src < c->capacity; ++src) *kvc__cell_pos(c, src) = -1;
    kvc__all_bounds(c);
    return moves;
}

KVCDEF kvc_result kvc_defrag(kvc_cache *cache, int32_t *n_moves) {
    int32_t moves;
    if (cache == NULL) return KVC_ERR_NULL;
    if (!kvc__is_causal(cache)) return KVC_ERR_UNSUPPORTED;
    if (kvc__batch_open(cache)) return KVC_ERR_STATE;
    moves = kvc__defrag(cache);
    cache->range_lo = cache->range_hi = cache->batch_n = 0; /* cell indices changed */
    if (n_moves) *n_moves = moves;
    return KVC_OK;
}

/* Sliding-window memory: the lowest batch position of each sequence (scratch, INT32_MAX
   for sequences not in the batch); a cell of s older than that position's window is
   invisible to the batch and to everything after it. */
static int kvc__window_dead(const kvc_cache *c, int32_t cell, int32_t seq) {
    return c->cfg.window > 0 && c->scratch[seq] != INT32_MAX &&
           (int64_t)*kvc__cell_pos(c, cell) <= (int64_t)c->scratch[seq] - c->cfg.window;
}

/* How many cells the window release would free (without changing anything). */
static int32_t kvc__window_freeable(const kvc_cache *c) {
    int32_t cell, s, n = 0;
    if (c->cfg.window <= 0) return 0;
    for (cell = 0; cell < c->capacity; ++cell) {
        int any = 0, all = 1;
        for (s = 0; s < c->cfg.max_seqs && all; ++s)
            if (kvc__cell_has(c, cell, s)) { any = 1; all = kvc__window_dead(c, cell, s); }
        n += any && all;
    }
    return n;
}

static void kvc__window_release(kvc_cache *c) {
    int32_t cell, s;
    if (c->cfg.window <= 0) return;
    for (s = 0; s < c->cfg.max_seqs; ++s) {
        if (c->scratch[s] == INT32_MAX || !kvc__seq_known(c, s)) continue;
        for (cell = c->seq_lo[s]; cell < c->seq_hi[s]; ++cell)
            if (kvc__cell_has(c, cell, s) && kvc__window_dead(c, cell, s)) kvc__cell_del(c, cell, s);
        kvc__seq_bounds(c, s);
    }
}

static int32_t kvc__find_run(const kvc_cache *c, int32_t n) {
    int32_t i, count = 0;
    for (i = 0; i < c->capacity; ++i) {
        if (!kvc__cell_empty(c, i)) { count = 0; continue; }
        if (++count == n) return i - n + 1;
    }
    return -1;
}

static kvc_result kvc__check_batch(const kvc_cache *c, const kvc_batch *b) {
    int32_t i;
    if (b->n_tokens < 1) return KVC_ERR_INVALID;
    if (b->pos == NULL || b->seq == NULL) return KVC_ERR_NULL;
    for (i = 0; i < b->n_tokens; ++i) {
        if (b->pos[i] < 0 || b->pos[i] == INT32_MAX) return KVC_ERR_RANGE;
        if (b->seq[i] < 0 || b->seq[i] >= c->cfg.max_seqs) return KVC_ERR_RANGE;
    }
    return KVC_OK;
}

KVCDEF kvc_result kvc_begin_batch(kvc_cache *c, const kvc_batch *b) {
    int32_t i, loc, pad, lo = INT32_MAX, hi = 0;
    kvc_result r;
    if (c == NULL || b == NULL) return KVC_ERR_NULL;
    if (!kvc__is_causal(c)) return KVC_ERR_UNSUPPORTED;
    if (kvc__batch_open(c)) return KVC_ERR_STATE;
    r = kvc__check_batch(c, b);
    if (r != KVC_OK) return r;
    if (b->n_tokens > c->capacity) return KVC_ERR_FULL;
    for (i = 0; i < c->cfg.max_seqs; ++i) c->scratch[i] = INT32_MAX;
    for (i = 0; i < b->n_tokens; ++i) c->scratch[b->seq[i]] = KVC__MIN(c->scratch[b->seq[i]], b->pos[i]);
    if (c->capacity - c->n_used + kvc__window_freeable(c) < b->n_tokens) return KVC_ERR_FULL;
    /* from here on it succeeds */
    kvc__window_release(c);
    loc = kvc__find_run(c, b->n_tokens);
    if (loc < 0) {
        kvc__defrag(c);
        loc = kvc__find_run(c, b->n_tokens);
        KVCACHE_ASSERT(loc >= 0);
    }
    for (i = 0; i < b->n_tokens; ++i) {
        *kvc__cell_pos(c, loc + i) = b->pos[i];
        kvc__cell_add(c, loc + i, b->seq[i]);
        c->batch_pos[i] = b->pos[i];
        c->batch_seq[i] = b->seq[i];
        c->batch_nc[i] = b->non_causal ? (b->non_causal[i] != 0) : 0;
    }
    for (i = 0; i < b->n_tokens; ++i) { /* what the batch reads: its sequences' cells */
        lo = KVC__MIN(lo, c->seq_lo[b->seq[i]]);
        hi = KVC__MAX(hi, c->seq_hi[b->seq[i]]);
    }
    pad = c->cfg.padding;
    c->range_lo = lo / pad * pad;
    c->range_hi = (int32_t)KVC__MIN((int64_t)(hi + pad - 1) / pad * pad, (int64_t)c->capacity);
    c->batch_loc = loc;
    c->batch_n = b->n_tokens;
    c->batch_pending = c->pool->cfg.n_layers;
    memset(c->batch_put, 0, (size_t)c->pool->cfg.n_layers);
    return KVC_OK;
}

/* kvc_begin on a CAUSAL cache: sequence 0, after its last position. */
static kvc_result kvc__begin_seq0(kvc_cache *c, int32_t n) {
    kvc_batch b;
    int32_t i, next = 0;
    if (n > c->capacity) return KVC_ERR_FULL;
    for (i = KVC__MAX(c->seq_lo[0], 0); i < c->seq_hi[0]; ++i)
        if (kvc__cell_has(c, i, 0)) next = KVC__MAX(next, *kvc__cell_pos(c, i) + 1);
    if (n > INT32_MAX - 1 - next) return KVC_ERR_RANGE;
    for (i = 0; i < n; ++i) { c->in_pos[i] = next + i; c->in_seq[i] = 0; }
    b.n_tokens = n;
    b.pos = c->in_pos;
    b.seq = c->in_seq;
    b.non_causal = NULL;
    return kvc_begin_batch(c, &b);
}

static void kvc__causal_cancel(kvc_cache *c) {
    int32_t i;
    for (i = 0; i < c->batch_n; ++i) {
        int32_t s = c->batch_seq[i];
        kvc__cell_del(c, c->batch_loc + i, s);
    }
    for (i = 0; i < c->batch_n; ++i) kvc__seq_bounds(c, c->batch_seq[i]);
    c->batch_n = 0;
    c->range_lo = c->range_hi = 0;
    c->batch_pending = 0;
}

static void kvc__causal_clear(kvc_cache *c) {
    int32_t i;
    memset(c->seqs, 0, sizeof(uint32_t) * (size_t)c->words * (size_t)c->capacity);
    for (i = 0; i < c->capacity; ++i) *kvc__cell_pos(c, i) = -1;
    for (i = 0; i < c->cfg.max_seqs; ++i) { c->seq_lo[i] = INT32_MAX; c->seq_hi[i] = 0; }
    c->n_used = 0;
    c->batch_n = c->batch_pending = 0;
    c->range_lo = c->range_hi = 0;
}

KVCDEF kvc_result kvc_mask_export(const kvc_cache *c, int32_t row_pad, float *mask, size_t max_floats,
                                  int32_t *n_rows, int32_t *n_cols, int32_t *first_cell) {
    int32_t rows, cols, i, j;
    if (c == NULL || n_rows == NULL || n_cols == NULL || first_cell == NULL) return KVC_ERR_NULL;
    if (!kvc__is_causal(c)) return KVC_ERR_UNSUPPORTED;
    if (row_pad < 0) return KVC_ERR_INVALID;
    if (row_pad == 0) row_pad = 1;
    if (c->batch_n > INT32_MAX - row_pad) return KVC_ERR_RANGE;
    rows = (c->batch_n + row_pad - 1) / row_pad * row_pad;
    cols = c->range_hi - c->range_lo;
    *n_rows = rows;
    *n_cols = cols;
    *first_cell = c->range_lo;
    if (mask == NULL) return KVC_OK;
    /* in 64 bits: 2^30 rows x 4 columns wraps a 32-bit size_t to 0 */
    if ((uint64_t)rows * (uint64_t)cols > (uint64_t)max_floats) return KVC_ERR_RANGE;
    for (i = 0; i < rows; ++i)
        for (j = 0; j < cols; ++j)
            mask[(size_t)i * cols + j] =
                i < c->batch_n && kvc__causal_visible(c, c->range_lo + j, c->batch_pos[i], c->batch_seq[i], c->batch_nc[i], 0)
                    ? 0.0f : -INFINITY;
    return KVC_OK;
}

KVCDEF kvc_result kvc_seq_copy_prefix(kvc_cache *c, int32_t src, int32_t dst, int32_t len) {
    int32_t i;
    kvc_result r;
    if (c == NULL) return KVC_ERR_NULL;
    if ((r = kvc__check_seq(c, src)) != KVC_OK || (r = kvc__check_seq(c, dst)) != KVC_OK) return r;
    if (src == dst || len < 0) return KVC_ERR_INVALID;
    if (kvc__batch_open(c)) return KVC_ERR_STATE;
    for (i = 0; i < c->capacity; ++i) {
        kvc__cell_del(c, i, dst);
        if (kvc__cell_has(c, i, src) && *kvc__cell_pos(c, i) < len) kvc__cell_add(c, i, dst);
    }
    kvc__seq_bounds(c, dst);
    return KVC_OK;
}

/* Re-rotate one cell's keys of every layer from old_pos to new_pos, with the cos/sin
   table of kvc__rope_table (one table serves every cell of a shift). */
static void kvc__rope_cell(kvc_cache *c, int32_t cell, int32_t old_pos, int32_t new_pos) {
    kvc_pool *p = c->pool;
    const kvc__type_info *tk = &p->tk;
    const kvc_rope *rope = &c->cfg.rope;
    int32_t pc = p->page_cells, hk = p->cfg.head_dim_k, nk = p->cfg.n_kv_heads * hk, l, h, i, half = rope->n_dims / 2;
    int neox = rope->style == KVC_ROPE_NEOX;
    uint32_t page = c->pages[cell / pc];
    for (l = 0; l < p->cfg.n_layers; ++l) {
        unsigned char *k = kvc__k_at(p, l, page, cell % pc);
        tk->to_f32(k, c->row, nk);
        if (rope->shift) {
            rope->shift(rope->user, l, c->row, p->cfg.n_kv_heads, hk, old_pos, new_pos);
        } else {
            for (h = 0; h < p->cfg.n_kv_heads; ++h) {
                float *x = c->row + (size_t)h * hk;
                for (i = 0; i < half; ++i) {
                    int32_t i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
                    double a = x[i0], b = x[i1];
                    x[i0] = (float)(a * c->rope_cos[i] - b * c->rope_sin[i]);
                    x[i1] = (float)(b * c->rope_cos[i] + a * c->rope_sin[i]);
                }
            }
        }
        tk->from_f32(c->row, k, nk);
    }
}

static void kvc__rope_table(kvc_cache *c, int32_t delta) {
    int32_t i, n = c->cfg.rope.n_dims;
    for (i = 0; i < n / 2; ++i) {
        double angle = (double)delta * pow((double)c->cfg.rope.theta, -2.0 * i / n);
        c->rope_cos[i] = cos(angle);
        c->rope_sin[i] = sin(angle);
    }
}

KVCDEF kvc_result kvc_seq_remove(kvc_cache *c, int32_t seq, int32_t begin, int32_t end) {
    int32_t i, shift = 0;
    kvc_result r;
    if (c == NULL) return KVC_ERR_NULL;
    if ((r = kvc__check_seq(c, seq)) != KVC_OK) return r;
    if (begin < 0 || end < begin) return KVC_ERR_INVALID;
    if (kvc__batch_open(c)) return KVC_ERR_STATE;
    if (!kvc__seq_known(c, seq)) return KVC_ERR_NOT_FOUND;
    if (end != KVC_POS_END) /* later cells move back: each must be this sequence's alone */
        for (i = c->seq_lo[seq]; i < c->seq_hi[seq]; ++i)
            if (kvc__cell_has(c, i, seq) && *kvc__cell_pos(c, i) >= end) {
                if (kvc__cell_only(c, i) != seq) return KVC_ERR_SHARED;
                shift = 1;
            }
    if (shift && begin < end && c->cfg.rope.shift == NULL && c->cfg.rope.style == KVC_ROPE_NONE)
        return KVC_ERR_UNSUPPORTED;
    if (shift && begin < end && c->cfg.rope.shift == NULL) kvc__rope_table(c, begin - end);
    for (i = c->seq_lo[seq]; i < c->seq_hi[seq]; ++i) {
        int32_t pos;
        if (!kvc__cell_has(c, i, seq)) continue;
        pos = *kvc__cell_pos(c, i);
        if (pos >= begin && pos < end) {
            kvc__cell_del(c, i, seq);
        } else if (shift && pos >= end && begin < end) {
            kvc__rope_cell(c, i, pos, pos - (end - begin));
            *kvc__cell_pos(c, i) = pos - (end - begin);
        }
    }
    kvc__seq_bounds(c, seq);
    return KVC_OK;
}

KVCDEF kvc_result kvc_seq_keep(kvc_cache *c, int32_t seq) {
    int32_t i, s;
    kvc_result r;
    if (c == NULL) return KVC_ERR_NULL;
    if ((r = kvc__check_seq(c, seq)) != KVC_OK) return r;
    if (kvc__batch_open(c)) return KVC_ERR_STATE;
    for (i = 0; i < c->capacity; ++i)
        for (s = 0; s < c->cfg.max_seqs; ++s)
            if (s != seq) kvc__cell_del(c, i, s);
    kvc__all_bounds(c);
    return KVC_OK;
}

KVCDEF kvc_result kvc_seq_pos_range(const kvc_cache *c, int32_t seq, int32_t *min_pos, int32_t *max_pos) {
    int32_t i, lo = -1, hi = -1;
    kvc_result r;
    if (c == NULL || min_pos == NULL || max_pos == NULL) return KVC_ERR_NULL;
    if ((r = kvc__check_seq(c, seq)) != KVC_OK) return r;
    for (i = c->seq_lo[seq]; i < c->seq_hi[seq]; ++i)
        if (kvc__cell_has(c, i, seq)) {
            int32_t p = *kvc__cell_pos(c, i);
            if (lo < 0 || p < lo) lo = p;
            if (p > hi) hi = p;
        }
    *min_pos = lo;
    *max_pos = hi;
    return KVC_OK;
}

KVCDEF kvc_result kvc_seq_can_resume(const kvc_cache *c, int32_t seq, int32_t pos, int *can_resume) {
    int32_t lo, hi;
    kvc_result r;
    if (c == NULL || can_resume == NULL) return KVC_ERR_NULL;
    if ((r = kvc_seq_pos_range(c, seq, &lo, &hi)) != KVC_OK) return r;
    if (pos < 0) return KVC_ERR_RANGE;
    if (c->cfg.window == 0) *can_resume = 1;
    else *can_resume = hi >= 0 && KVC__MAX(0, (int64_t)pos - c->cfg.window + 1) >= lo && pos <= (int64_t)hi + 1;
    return KVC_OK;
}

/* ---- Layer 4: snapshots ------------------------------------------------------------- */

static kvc_snapshot *kvc__snapshot_alloc(kvc_pool *p, int32_t n_pages) {
    kvc_snapshot *s = (kvc_snapshot *)kvc__alloc(p, sizeof(kvc_snapshot) + sizeof(uint32_t) * (size_t)KVC__MAX(n_pages, 1));
    if (s == NULL) return NULL;
    memset(s, 0, sizeof(*s));
    s->pool = p;
    s->pages = (uint32_t *)(s + 1);
    s->n_pages = n_pages;
    p->live_snapshots++;
    return s;
}

/* Free the struct only; the caller has dealt with the page references. */
static void kvc__snapshot_drop(kvc_snapshot *s) {
    s->pool->live_snapshots--;
    kvc__free(s->pool, s);
}

static kvc_result kvc__check_snapshot(const kvc_cache *c, const kvc_snapshot *s) {
    return (s->pool == c->pool && s->cache_id == c->id && s->kind == c->cfg.kind) ? KVC_OK : KVC_ERR_FOREIGN;
}

KVCDEF kvc_result kvc_snapshot_take(kvc_cache *cache, int32_t from, kvc_snapshot **out) {
    kvc_snapshot *s;
    int32_t i, first, n, pc;
    if (cache == NULL || out == NULL) return KVC_ERR_NULL;
    if (cache->cfg.kind == KVC_KIND_CAUSAL) return KVC_ERR_UNSUPPORTED; /* kvc_seq_snapshot */
    if (kvc__batch_open(cache)) return KVC_ERR_STATE;
    if (cache->offset <= from || cache->offset == 0) { *out = NULL; return KVC_OK; } /* nothing to hold */
    pc = cache->pool->page_cells;
    if (cache->cfg.kind == KVC_KIND_ROTATING) { /* the whole window: every page held */
        first = 0;
        n = cache->n_pages;
    } else {
        from = KVC__MAX(from, 0);
        first = from / pc;
        n = (cache->offset - 1) / pc - first + 1;
    }
    s = kvc__snapshot_alloc(cache->pool, n);
    if (s == NULL) return KVC_ERR_NO_MEMORY;
    s->cache_id = cache->id;
    s->kind = cache->cfg.kind;
    s->from = from;
    s->to = cache->offset;
    s->first_lpage = cache->cfg.kind == KVC_KIND_ROTATING ? cache->first_lpage : first;
    s->batch_begin = cache->batch_begin;
    for (i = 0; i < n; ++i) {
        s->pages[i] = cache->pages[first + i];
        kvc__page_retain(cache->pool, s->pages[i]);
    }
    *out = s;
    return KVC_OK;
}

KVCDEF kvc_result kvc_snapshot_free(kvc_snapshot *snap) {
    int32_t i;
    if (snap == NULL) return KVC_OK;
    for (i = 0; i < snap->n_pages; ++i) kvc__page_release(snap->pool, snap->pages[i]);
    kvc__snapshot_drop(snap);
    return KVC_OK;
}

KVCDEF kvc_result kvc_snapshot_info_get(const kvc_snapshot *snap, kvc_snapshot_info *info) {
    if (snap == NULL || info == NULL) return KVC_ERR_NULL;
    info->from = snap->from;
    info->to = snap->to;
    info->n_pages = snap->n_pages;
    info->bytes = (size_t)snap->n_pages * snap->pool->page_bytes;
    return KVC_OK;
}

/* FULL: keep the cache's tokens [0, from), take [from, target) from the snapshot.
   The page holding `from` mid-page is the only one that may need a copy. */
static kvc_result kvc__restore_full(kvc_cache *c, const kvc_snapshot *s, int32_t target) {
    kvc_pool *p = c->pool;
    int32_t pc = p->page_cells, keep = s->from / pc, cut = s->from % pc, idx, freed = 0, lp, last;
    int need_copy;
    uint32_t boundary = KVC__NO_PAGE;
    if (target <= s->from) { kvc__rewind(c, target); return KVC_OK; }
    need_copy = cut != 0 && c->pages[keep] != s->pages[0];
    for (idx = keep + 1; idx < c->n_pages; ++idx) freed += p->refcount[c->pages[idx]] == 1;
    if (!cut && keep < c->n_pages) freed += p->refcount[c->pages[keep]] == 1;
    if (need_copy && p->n_free + freed < 1) return KVC_ERR_FULL;
    /* release the cache's pages after the boundary, then build the boundary page */
    while (c->n_pages > keep + (cut ? 1 : 0)) kvc__page_release(p, c->pages[--c->n_pages]);
    if (need_copy) {
        boundary = kvc__page_acquire(p);
        kvc__page_copy_cells(p, boundary, c->pages[keep], 0, cut);
        kvc__page_copy_cells(p, boundary, s->pages[0], cut, KVC__MIN(pc, target - keep * pc));
        kvc__page_release(p, c->pages[keep]);
        c->pages[keep] = boundary;
    }
    last = (target - 1) / pc;
    for (lp = keep + (cut ? 1 : 0); lp <= last; ++lp) {
        uint32_t page = s->pages[lp - s->first_lpage];
        kvc__page_retain(p, page);
        c->pages[c->n_pages++] = page;
    }
    c->offset = target;
    c->batch_begin = target - 1;
    c->batch_pending = 0;
    return KVC_OK;
}

/* ROTATING: the snapshot's window replaces the cache's, then clamps to target. */
static void kvc__restore_rotating(kvc_cache *c, const kvc_snapshot *s, int32_t target) {
    int32_t i;
    for (i = 0; i < s->n_pages; ++i) kvc__page_retain(c->pool, s->pages[i]);
    for (i = 0; i < c->n_pages; ++i) kvc__page_release(c->pool, c->pages[i]);
    memcpy(c->pages, s->pages, sizeof(uint32_t) * (size_t)s->n_pages);
    c->n_pages = s->n_pages;
    c->first_lpage = s->first_lpage;
    c->offset = s->to;
    c->batch_begin = s->batch_begin;
    c->batch_pending = 0;
    if (target < s->to) kvc__rewind(c, target);
}

KVCDEF kvc_result kvc_restore(kvc_cache *cache, const kvc_snapshot *snap, int32_t target) {
    int rotating;
    if (cache == NULL) return KVC_ERR_NULL;
    if (cache->cfg.kind == KVC_KIND_CAUSAL) return KVC_ERR_UNSUPPORTED; /* kvc_seq_restore */
    if (snap != NULL && kvc__check_snapshot(cache, snap) != KVC_OK) return KVC_ERR_FOREIGN;
    if (kvc__batch_open(cache)) return KVC_ERR_STATE; /* kvc_cancel first */
    rotating = cache->cfg.kind == KVC_KIND_ROTATING;
    if (target < 0) return KVC_ERR_UNREACHABLE;
    if (snap == NULL) {
        if (target > cache->offset) return KVC_ERR_UNREACHABLE;
        if (rotating && target == cache->offset) return KVC_OK;
        if (rotating && kvc__wrapped(cache)) return KVC_ERR_UNREACHABLE;
        kvc__rewind(cache, target);
        return KVC_OK;
    }
    if (target > snap->to) return KVC_ERR_UNREACHABLE;
    if (rotating) {
        if (target < snap->to && (snap->to > cache->cfg.window || snap->first_lpage > cache->n_sink_pages))
            return KVC_ERR_UNREACHABLE;
        kvc__restore_rotating(cache, snap, target);
        return KVC_OK;
    }
    if (cache->offset < snap->from) return KVC_ERR_UNREACHABLE;
    return kvc__restore_full(cache, snap, target);
}

KVCDEF kvc_result kvc_snapshot_merge(kvc_cache *cache, kvc_snapshot *parent, kvc_snapshot *child,
                                     kvc_snapshot **out) {
    kvc_pool *p;
    kvc_snapshot *m;
    int32_t pc, cut, shared, n;
    if (cache == NULL || out == NULL) return KVC_ERR_NULL;
    if (cache->cfg.kind == KVC_KIND_CAUSAL) return KVC_ERR_UNSUPPORTED;
    if (parent != NULL && kvc__check_snapshot(cache, parent) != KVC_OK) return KVC_ERR_FOREIGN;
    if (child != NULL && kvc__check_snapshot(cache, child) != KVC_OK) return KVC_ERR_FOREIGN;
    if (parent == child && parent != NULL) return KVC_ERR_INVALID;
    if (cache->cfg.kind == KVC_KIND_ROTATING) { /* the child holds the whole window */
        kvc_snapshot_free(parent);
        *out = child;
        return KVC_OK;
    }
    if (parent == NULL || child == NULL) {
        kvc_snapshot_free(parent);
        kvc_snapshot_free(child);
        *out = NULL;
        return KVC_OK;
    }
    if (parent->to != child->from) return KVC_ERR_INVALID;
    p = cache->pool;
    pc = p->page_cells;
    cut = parent->to % pc;
    shared = cut != 0; /* parent's last page and child's first page are the same logical page */
    n = parent->n_pages + child->n_pages - shared;
    if (shared && parent->pages[parent->n_pages - 1] != child->pages[0] && p->n_free < 1) return KVC_ERR_FULL;
    m = kvc__snapshot_alloc(p, n);
    if (m == NULL) return KVC_ERR_NO_MEMORY;
    m->cache_id = parent->cache_id;
    m->kind = parent->kind;
    m->from = parent->from;
    m->to = child->to;
    m->first_lpage = parent->first_lpage;
    memcpy(m->pages, parent->pages, sizeof(uint32_t) * (size_t)parent->n_pages);
    memcpy(m->pages + parent->n_pages - shared, child->pages, sizeof(uint32_t) * (size_t)child->n_pages);
    if (shared) { /* one page where two were: combine their halves unless they are one page */
        uint32_t a = parent->pages[parent->n_pages - 1], b = child->pages[0];
        if (a != b) {
            uint32_t fresh = kvc__page_acquire(p);
            int32_t end = (int32_t)KVC__MIN((int64_t)pc, (int64_t)child->to - (int64_t)(child->from / pc) * pc);
            kvc__page_copy_cells(p, fresh, a, 0, cut);
            kvc__page_copy_cells(p, fresh, b, cut, end);
            kvc__page_release(p, a);
            m->pages[parent->n_pages - 1] = fresh;
        }
        kvc__page_release(p, b);
    }
    kvc__snapshot_drop(parent);
    kvc__snapshot_drop(child);
    *out = m;
    return KVC_OK;
}

KVCDEF kvc_result kvc_snapshot_split(kvc_cache *cache, kvc_snapshot *snap, int32_t at,
                                     kvc_snapshot **parent, kvc_snapshot **child) {
    kvc_pool *p;
    kvc_snapshot *a, *b;
    int32_t pc, na, first_b;
    if (cache == NULL || parent == NULL || child == NULL) return KVC_ERR_NULL;
    if (cache->cfg.kind == KVC_KIND_CAUSAL) return KVC_ERR_UNSUPPORTED;
    if (snap != NULL && kvc__check_snapshot(cache, snap) != KVC_OK) return KVC_ERR_FOREIGN;
    if (snap == NULL) { *parent = *child = NULL; return KVC_OK; }
    if (cache->cfg.kind == KVC_KIND_ROTATING || at <= snap->from) {
        *parent = NULL;
        *child = snap;
        return KVC_OK;
    }
    if (at >= snap->to) {
        *parent = snap;
        *child = NULL;
        return KVC_OK;
    }
    p = cache->pool;
    pc = p->page_cells;
    na = (at - 1) / pc - snap->first_lpage + 1;  /* pages holding [from, at) */
    first_b = at / pc - snap->first_lpage;       /* index of the page holding `at` */
    a = kvc__snapshot_alloc(p, na);
    if (a == NULL) return KVC_ERR_NO_MEMORY;
    b = kvc__snapshot_alloc(p, snap->n_pages - first_b);
    if (b == NULL) { kvc__snapshot_drop(a); return KVC_ERR_NO_MEMORY; }
    a->cache_id = b->cache_id = snap->cache_id;
    a->kind = b->kind = snap->kind;
    a->from = snap->from;
    a->to = b->from = at;
    b->to = snap->to;
    a->first_lpage = snap->first_lpage;
    b->first_lpage = snap->first_lpage + first_b;
    memcpy(a->pages, snap->pages, sizeof(uint32_t) * (size_t)na);
    memcpy(b->pages, snap->pages + first_b, sizeof(uint32_t) * (size_t)b->n_pages);
    if (first_b < na) kvc__page_retain(p, snap->pages[first_b]); /* both halves hold it */
    kvc__snapshot_drop(snap);
    *parent = a;
    *child = b;
    return KVC_OK;
}

/* CAUSAL: one sequence's cells, packed into pages of its own. */
KVCDEF kvc_result kvc_seq_snapshot(kvc_cache *c, int32_t seq, kvc_snapshot **out) {
    kvc_snapshot *s;
    int32_t i, n = 0, pages, lo = -1, hi = -1;
    kvc_result r;
    if (c == NULL || out == NULL) return KVC_ERR_NULL;
    if ((r = kvc__check_seq(c, seq)) != KVC_OK) return r;
    if (kvc__batch_open(c)) return KVC_ERR_STATE;
    for (i = c->seq_lo[seq]; i < c->seq_hi[seq]; ++i) n += kvc__cell_has(c, i, seq);
    if (n == 0) return KVC_ERR_NOT_FOUND;
    pages = (int32_t)(((int64_t)n + c->pool->page_cells - 1) / c->pool->page_cells); /* pages of 2^31 cells */
    if (pages > c->pool->n_free) return KVC_ERR_FULL;
    s = kvc__snapshot_alloc(c->pool, pages);
    if (s == NULL) return KVC_ERR_NO_MEMORY;
    for (i = 0; i < pages; ++i) s->pages[i] = kvc__page_acquire(c->pool);
    s->kind = KVC_KIND_CAUSAL;
    s->n_cells = n;
    n = 0;
    for (i = c->seq_lo[seq]; i < c->seq_hi[seq]; ++i) {
        int32_t p;
        if (!kvc__cell_has(c, i, seq)) continue;
        kvc__copy_cells(c->pool, s->pages, n++, c->pages, i, 1);
        p = *kvc__cell_pos(c, i);
        if (lo < 0 || p < lo) lo = p;
        hi = KVC__MAX(hi, p);
    }
    s->from = lo;
    s->to = hi + 1;
    *out = s;
    return KVC_OK;
}

KVCDEF kvc_result kvc_seq_restore(kvc_cache *c, const kvc_snapshot *s, int32_t dst) {
    int32_t i, cell = 0, freed = 0;
    kvc_result r;
    if (c == NULL || s == NULL) return KVC_ERR_NULL;
    if ((r = kvc__check_seq(c, dst)) != KVC_OK) return r;
    if (s->pool != c->pool || s->kind != KVC_KIND_CAUSAL) return KVC_ERR_FOREIGN;
    if (kvc__batch_open(c)) return KVC_ERR_STATE;
    for (i = 0; i < c->capacity; ++i) freed += kvc__cell_only(c, i) == dst;
    if (c->capacity - c->n_used + freed < s->n_cells) return KVC_ERR_FULL;
    for (i = 0; i < c->capacity; ++i) kvc__cell_del(c, i, dst);
    for (i = 0; i < s->n_cells; ++i) {
        while (!kvc__cell_empty(c, cell)) cell++;
        kvc__copy_cells(c->pool, c->pages, cell, s->pages, i, 1);
        kvc__cell_add(c, cell, dst);
    }
    kvc__seq_bounds(c, dst);
    return KVC_OK;
}

/* ---- Layer 5: single-entry prefix reuse (the seeds' findRemaining / close) -------- */

struct kvc_prefix {
    kvc_pool *pool;          /* where this object's memory comes from */
    kvc_cache **caches;
    int32_t n_caches, max_tokens;
    int32_t *tokens, n_tokens;   /* what the caches hold */
    int32_t *prompt, n_prompt;   /* the request between begin and close */
    int open;
};

KVCDEF kvc_result kvc_prefix_create(kvc_cache *const *caches, int32_t n_caches, int32_t max_tokens,
                                    kvc_prefix **out) {
    kvc_prefix *x;
    kvc_pool *p;
    int32_t i;
    size_t bytes;
    if (caches == NULL || out == NULL) return KVC_ERR_NULL;
    if (n_caches < 1 || max_tokens < 1 || max_tokens > INT32_MAX / 8) return KVC_ERR_INVALID;
    for (i = 0; i < n_caches; ++i) {
        int32_t j;
        if (caches[i] == NULL) return KVC_ERR_NULL;
        if (caches[i]->cfg.kind == KVC_KIND_CAUSAL) return KVC_ERR_UNSUPPORTED;
        for (j = 0; j < i; ++j) if (caches[j] == caches[i]) return KVC_ERR_INVALID;
    }
    p = caches[0]->pool;
    bytes = sizeof(kvc_prefix) + sizeof(kvc_cache *) * (size_t)n_caches + 2 * sizeof(int32_t) * (size_t)max_tokens;
    x = (kvc_prefix *)kvc__alloc(p, bytes);
    if (x == NULL) return KVC_ERR_NO_MEMORY;
    memset(x, 0, sizeof(*x));
    x->pool = p;
    x->caches = (kvc_cache **)(x + 1);
    x->tokens = (int32_t *)(x->caches + n_caches);
    x->prompt = x->tokens + max_tokens;
    x->n_caches = n_caches;
    x->max_tokens = max_tokens;
    for (i = 0; i < n_caches; ++i) x->caches[i] = caches[i];
    p->live_prefixes++;
    *out = x;
    return KVC_OK;
}

KVCDEF kvc_result kvc_prefix_destroy(kvc_prefix *prefix) {
    if (prefix == NULL) return KVC_ERR_NULL;
    prefix->pool->live_prefixes--;
    kvc__free(prefix->pool, prefix);
    return KVC_OK;
}

static int32_t kvc__min_offset(const kvc_prefix *x) {
    int32_t i, m = x->caches[0]->offset;
    for (i = 1; i < x->n_caches; ++i) m = KVC__MIN(m, x->caches[i]->offset);
    return m;
}

KVCDEF kvc_result kvc_prefix_begin(kvc_prefix *x, const int32_t *tokens, int32_t n_tokens, int32_t *n_reused) {
    int32_t i, prefix = 0;
    int trimmable = 1;
    if (x == NULL || tokens == NULL || n_reused == NULL) return KVC_ERR_NULL;
    if (n_tokens < 1) return KVC_ERR_INVALID;
    for (i = 0; i < x->n_caches; ++i)
        if (kvc__batch_open(x->caches[i])) return KVC_ERR_STATE;
    while (prefix < n_tokens && prefix < x->n_tokens && tokens[prefix] == x->tokens[prefix]) prefix++;
    if (prefix == n_tokens) prefix--; /* always evaluate one token to seed generation */
    prefix = KVC__MIN(prefix, kvc__min_offset(x));
    for (i = 0; i < x->n_caches; ++i)
        if (x->caches[i]->offset > prefix && !kvc__can_trim(x->caches[i])) trimmable = 0;
    if (!trimmable) prefix = 0; /* a wrapped window cannot go back: start over */
    for (i = 0; i < x->n_caches; ++i)
        if (x->caches[i]->offset > prefix) kvc__rewind(x->caches[i], prefix);
    x->n_tokens = prefix;
    x->n_prompt = KVC__MIN(n_tokens, x->max_tokens);
    memcpy(x->prompt, tokens, sizeof(int32_t) * (size_t)x->n_prompt);
    x->open = 1;
    *n_reused = prefix;
    return KVC_OK;
}

KVCDEF kvc_result kvc_prefix_close(kvc_prefix *x, const int32_t *generated, int32_t n_generated) {
    int32_t keep, from_prompt;
    if (x == NULL) return KVC_ERR_NULL;
    if (n_generated < 0) return KVC_ERR_INVALID;
    if (n_generated > 0 && generated == NULL) return KVC_ERR_NULL;
    if (!x->open) return KVC_ERR_STATE;
    keep = KVC__MIN(kvc__min_offset(x), x->max_tokens);
    keep = (int32_t)KVC__MIN((int64_t)keep, (int64_t)x->n_prompt + n_generated);
    from_prompt = KVC__MIN(keep, x->n_prompt);
    memcpy(x->tokens, x->prompt, sizeof(int32_t) * (size_t)from_prompt);
    if (keep > from_prompt) memcpy(x->tokens + from_prompt, generated, sizeof(int32_t) * (size_t)(keep - from_prompt));
    x->n_tokens = keep;
    x->open = 0;
    return KVC_OK;
}

KVCDEF kvc_result kvc_prefix_tokens(const kvc_prefix *x, const int32_t **tokens, int32_t *n_tokens) {
    if (x == NULL || tokens == NULL || n_tokens == NULL) return KVC_ERR_NULL;
    *tokens = x->tokens;
    *n_tokens = x->n_tokens;
    return KVC_OK;
}

/* ---- Layer 6: kernels (scalar reference) ------------------------------------------- */

/* One query of an attention call. */
typedef struct kvc__query {
    int32_t pos, seq;
    int non_causal;
    int32_t window; /* the call's extra window, 0: none */
} kvc__query;

/* May the query see the cell at `index` (token, or CAUSAL cell index) with position key? */
static int kvc__visible(const kvc_cache *c, const kvc__query *q, int32_t index, int32_t key) {
    if (c->cfg.kind == KVC_KIND_CAUSAL) return kvc__causal_visible(c, index, q->pos, q->seq, q->non_causal, q->window);
    if (key < 0) return 0;
    if (!q->non_causal && key > q->pos) return 0;
    if (q->window > 0 && (int64_t)key <= (int64_t)q->pos - q->window) return 0;
    if (c->cfg.kind == KVC_KIND_ROTATING && key >= c->cfg.sinks && (int64_t)key < kvc__window_lo(c, q->pos))
        return 0;
    return 1;
}

static float kvc__dot_f32(const float *a, const float *b, int32_t n) {
    float s = 0.0f;
    int32_t i;
    for (i = 0; i < n; ++i) s += a[i] * b[i];
    return s;
}

/* One query head over every visible cell: online softmax, out[] accumulates V.
   kbuf/vbuf hold one dequantised head of a row at a time. */
static void kvc__attend_one(const kvc_cache *c, int32_t layer, const kvc__query *qy, int32_t kv_head,
                            const float *q, float scale, float *out, float *kbuf, float *vbuf) {
    const kvc_pool *p = c->pool;
    const kvc__type_info *tk = &p->tk, *tv = &p->tv;
    int32_t hk = p->cfg.head_dim_k, hv = p->cfg.head_dim_v;
    size_t k_off = kvc__row_bytes(p->cfg.type_k, kv_head, hk), v_off = kvc__row_bytes(p->cfg.type_v, kv_head, hv);
    float m = -INFINITY, sum = 0.0f;
    kvc__iter it;
    kvc__run run;
    int32_t i, cell;
    for (i = 0; i < hv; ++i) out[i] = 0.0f;
    if (c->cfg.kind == KVC_KIND_CAUSAL) kvc__iter_init_cells(&it, c, c->seq_lo[qy->seq], c->seq_hi[qy->seq]);
    else kvc__iter_init(&it, c);
    while (kvc__iter_next(&it, &run)) {
        for (cell = run.c0; cell < run.c1; ++cell) {
            float s, w;
            if (!kvc__visible(c, qy, run.t0 + (cell - run.c0), *kvc__pos_at(p, run.page, cell))) continue;
            tk->to_f32(kvc__k_at(p, layer, run.page, cell) + k_off, kbuf, hk);
            s = kvc__dot_f32(q, kbuf, hk) * scale;
            if (s > m) { /* rescale what we have to the new maximum */
                float r = expf(m - s);
                sum *= r;
                for (i = 0; i < hv; ++i) out[i] *= r;
                m = s;
            }
            w = expf(s - m);
            sum += w;
            tv->to_f32(kvc__v_at(p, layer, run.page, cell) + v_off, vbuf, hv);
            for (i = 0; i < hv; ++i) out[i] += w * vbuf[i];
        }
    }
    if (sum > 0.0f)
        for (i = 0; i < hv; ++i) out[i] /= sum;
}

static kvc_result kvc__check_attention(const kvc_cache *c, int32_t layer, const kvc_attention_desc *d) {
    const kvc_pool *p;
    int32_t i;
    if (c == NULL || d == NULL) return KVC_ERR_NULL;
    if (d->q == NULL || d->out == NULL) return KVC_ERR_NULL;
    p = c->pool;
    if (layer < 0 || layer >= p->cfg.n_layers) return KVC_ERR_RANGE;
    if (d->n_queries < 1 || d->n_heads < 1 || d->n_heads % p->cfg.n_kv_heads != 0) return KVC_ERR_INVALID;
    if (d->window < 0 || !(d->scale >= 0.0f) || d->scale == INFINITY) return KVC_ERR_INVALID;
    if (kvc__batch_open(c) && !c->batch_put[layer]) return KVC_ERR_STATE;
    if (c->cfg.kind != KVC_KIND_CAUSAL) return d->pos == NULL && d->n_queries > c->offset ? KVC_ERR_RANGE : KVC_OK;
    if (d->pos == NULL) return d->n_queries == c->batch_n ? KVC_OK : KVC_ERR_RANGE;
    if (d->seq == NULL) return KVC_ERR_NULL;
    for (i = 0; i < d->n_queries; ++i)
        if (d->seq[i] < 0 || d->seq[i] >= c->cfg.max_seqs) return KVC_ERR_RANGE;
    return KVC_OK;
}

/* Query qi of a call: its position, sequence and causality. */
static kvc__query kvc__query_of(const kvc_cache *c, const kvc_attention_desc *d, int32_t qi) {
    kvc__query q;
    q.window = d->window;
    q.non_causal = d->non_causal;
    q.seq = 0;
    if (c->cfg.kind == KVC_KIND_CAUSAL && d->pos == NULL) { /* the current batch */
        q.pos = c->batch_pos[qi];
        q.seq = c->batch_seq[qi];
        q.non_causal = d->non_causal || c->batch_nc[qi];
    } else {
        q.pos = d->pos ? d->pos[qi] : c->offset - d->n_queries + qi;
        if (d->seq) q.seq = d->seq[qi];
    }
    return q;
}

KVCDEF kvc_result kvc_attention(const kvc_cache *cache, int32_t layer, const kvc_attention_desc *desc) {
    const kvc_pool *p;
    int32_t qi, h, group, hk, hv;
    float scale, kbuf_small[512], vbuf_small[512], *kbuf = kbuf_small, *vbuf = vbuf_small;
    kvc_result r = kvc__check_attention(cache, layer, desc);
    if (r != KVC_OK) return r;
    p = cache->pool;
    hk = p->cfg.head_dim_k;
    hv = p->cfg.head_dim_v;
    if (hk > 512 || hv > 512) { /* one head of K and of V as f32 */
        kbuf = (float *)kvc__alloc(cache->pool, sizeof(float) * ((size_t)hk + (size_t)hv));
        if (kbuf == NULL) return KVC_ERR_NO_MEMORY;
        vbuf = kbuf + hk;
    }
    scale = desc->scale > 0.0f ? desc->scale : 1.0f / sqrtf((float)hk);
    group = desc->n_heads / p->cfg.n_kv_heads;
    for (qi = 0; qi < desc->n_queries; ++qi) {
        kvc__query q = kvc__query_of(cache, desc, qi);
        for (h = 0; h < desc->n_heads; ++h) {
            size_t row = (size_t)qi * (size_t)desc->n_heads + (size_t)h;
            kvc__attend_one(cache, layer, &q, h / group, desc->q + row * (size_t)hk, scale,
                            desc->out + row * (size_t)hv, kbuf, vbuf);
        }
    }
    if (kbuf != kbuf_small) kvc__free(cache->pool, kbuf);
    return KVC_OK;
}

/* ---- Views for callers with their own attention ---------------------------------- */

KVCDEF kvc_result kvc_cache_runs(const kvc_cache *cache, int32_t layer, kvc_run *runs, int32_t max_runs,
                                 int32_t *n_runs) {
    const kvc_pool *p;
    kvc__iter it;
    kvc__run run;
    kvc_run cur;
    int32_t n = 0;
    if (cache == NULL || n_runs == NULL) return KVC_ERR_NULL;
    p = cache->pool;
    if (layer < 0 || layer >= p->cfg.n_layers) return KVC_ERR_RANGE;
    if (max_runs < 0 || (runs == NULL && max_runs > 0)) return KVC_ERR_INVALID;
    memset(&cur, 0, sizeof(cur));
    kvc__iter_init(&it, cache);
    while (kvc__iter_next(&it, &run)) {
        const unsigned char *k = kvc__k_at(p, layer, run.page, run.c0);
        /* consecutive page ids are one contiguous block per layer: extend the run */
        if (cur.n_cells > 0 && (const unsigned char *)cur.k + (size_t)cur.n_cells * p->k_row == k &&
            cur.pos + cur.n_cells == kvc__pos_at(p, run.page, run.c0)) {
            cur.n_cells += run.c1 - run.c0;
            continue;
        }
        if (cur.n_cells > 0 && n++ < max_runs) runs[n - 1] = cur;
        cur.k = k;
        cur.v = kvc__v_at(p, layer, run.page, run.c0);
        cur.pos = kvc__pos_at(p, run.page, run.c0);
        cur.n_cells = run.c1 - run.c0;
    }
    if (cur.n_cells > 0 && n++ < max_runs) runs[n - 1] = cur;
    *n_runs = n;
    return n > max_runs && runs != NULL ? KVC_ERR_RANGE : KVC_OK;
}

KVCDEF kvc_result kvc_cache_gather(const kvc_cache *cache, int32_t layer, float *k, float *v, int32_t *pos,
                                   int32_t max_cells, int32_t *n_cells) {
    const kvc_pool *p;
    kvc__iter it;
    kvc__run run;
    int32_t n, cell, nk, nv;
    if (cache == NULL || n_cells == NULL) return KVC_ERR_NULL;
    p = cache->pool;
    if (layer < 0 || layer >= p->cfg.n_layers) return KVC_ERR_RANGE;
    if (max_cells < 0) return KVC_ERR_INVALID;
    kvc_cache_cells(cache, &n);
    *n_cells = n;
    if (k == NULL && v == NULL && pos == NULL) return KVC_OK; /* only the count was asked */
    if (n > max_cells) return KVC_ERR_RANGE;
    nk = p->cfg.n_kv_heads * p->cfg.head_dim_k;
    nv = p->cfg.n_kv_heads * p->cfg.head_dim_v;
    n = 0;
    kvc__iter_init(&it, cache);
    while (kvc__iter_next(&it, &run)) {
        for (cell = run.c0; cell < run.c1; ++cell, ++n) {
            if (k) p->tk.to_f32(kvc__k_at(p, layer, run.page, cell), k + (size_t)n * nk, nk);
            if (v) p->tv.to_f32(kvc__v_at(p, layer, run.page, cell), v + (size_t)n * nv, nv);
            if (pos) pos[n] = *kvc__pos_at(p, run.page, cell);
        }
    }
    return KVC_OK;
}

#endif /* KVCACHE_IMPLEMENTATION_DONE */
#endif /* KVCACHE_IMPLEMENTATION */

/*
------------------------------------------------------------------------------
This software is available under 2 licenses -- choose whichever you prefer.
------------------------------------------------------------------------------
ALTERNATIVE A - MIT License
Copyright (c) 2026 the kvcache.h authors
Permission is hereby granted, free of charge, to any person obtaining a copy of
this software and associated documentation files (the "Software"), to deal in
the Software without restriction, including without limitation the rights to
use, copy, modify, merge, publish, distribute, sublicense, and/or sell copies
of the Software, and to permit persons to whom the Software is furnished to do
so, subject to the following conditions:
The above copyright notice and this permission notice shall be included in all
copies or substantial portions of the Software.
THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,
FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE
AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER
LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,
OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE
SOFTWARE.
------------------------------------------------------------------------------
ALTERNATIVE B - Public Domain (www.unlicense.org)
This is free and unencumbered software released into the public domain.
Anyone is free to copy, modify, publish, use, compile, sell, or distribute this
software, either in source code form or as a compiled binary, for any purpose,
commercial or non-commercial, and by any means.
------------------------------------------------------------------------------
*/
