/* bench_attention.c - the CPU kernels of kvcache.h (run by `make bench`), one table.

   - Read bandwidth of this machine, measured here: a streaming read (sum of floats)
     over a 1 GiB buffer, with 1 and 2 threads, the ceiling for decode attention. On
     Linux the buffer gets transparent huge pages, as the pool's slab does here
     (KVCACHE_HUGE_PAGES: a benchmark of attention over large caches is where that
     opt-in pays; the library's default gives no advice).
   - Decode attention: 1 query token, 32 query heads / 8 kv heads (GQA 4) and also
     32 / 32 (GQA 1), head dim 128, 4k / 16k / 32k cells of a FULL cache, each storage
     type (K and V the same), 1 and 2 threads (kvc_threads): median time, GB/s of K+V
     read, the ratio to the read bandwidth of the same thread count and the ratio to the
     scalar path (cpu_disable = all; measured with 1 thread, fewer reps). Every ratio
     printed is measured in this run; the comparison with llama.cpp's CPU flash
     attention is in docs/performance.md with its method (both built and run
     alternately on one machine).
     At 4k cells the f16 K+V (16 MiB) fits in the 32 MiB L3; 16k (64 MiB) does not.
     For the float types, 'vs FMA' is the share of this machine's 512-bit FMA throughput
     (measured here too) that the call reaches: every kernel of this design needs
     n_heads x (hk + hv) f32 multiply-adds per cell, so that is the compute floor.
   - Prefill attention: 512 queries at the last positions of 4k cells, causal,
     f16 and q8_0: GFLOP/s counting 4 flops per (query head, visible cell, dim).
   - Rotated storage (kvc_pool_config.rotate, K and V: "+rot" types): q8_0+rot and
     q4_0+rot in the decode and append tables, and the time of the rotation a decode
     call adds (q forward, out back: 32 heads x 128).
   - Append (f32 in, converted / quantised at kvc_put) and the RoPE shift of
     kvc_seq_remove (dequantise, rotate, requantise): GB/s of stored K+V bytes.
   - Attention variants (--parts variants, not in the default table): decode at 16k
     cells, 1 thread, GQA 4, f16 / q8_0 / q4_0: plain, with per-head sinks, softcap 50,
     the LSE output, all three, and (quantized types) an f16 tail of --f16-tail tokens
     (default 128), the configurations alternated within each repetition; medians and
     the ratio to plain. --sinks, --softcap X, --lse and --f16-tail N also apply to the
     other parts.
   Times are medians of --reps runs; nothing is asserted.

   Build:  cc -std=c99 -O2 -I. bench/bench_attention.c -o bench_attention -lm -lpthread
   Usage:  bench_attention [options]; with none, the whole table above. `--help` lists
           the options; they select one shape (or a few) to rerun alone, e.g.
           bench_attention --parts decode --types q8_0 --cells 16384 --threads 1 --gqa 4 */
#define _DEFAULT_SOURCE /* madvise: the pool's slab and the read buffer both get huge pages */
#define _POSIX_C_SOURCE 199309L
#define KVCACHE_HUGE_PAGES
#define KVCACHE_THREADS
#define KVCACHE_IMPLEMENTATION
#include "../kvcache.h"
#include "bench_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_REPS 51
#define MAX_THREADS 64 /* reader.sum */
#define MAX_LIST 16
static int g_reps = 7;
static kvc_threads *g_threads[MAX_THREADS + 1]; /* [n]: a pool of n workers, for each n > 1 asked for */

/* a storage type of the tables (K and V the same), stored rotated (kvc_pool_config.rotate,
   K and V: "+rot") or not */
typedef struct btype {
    kvc_type t;
    uint32_t rot;
} btype;
static const char *btype_name(btype b) {
    static const char *const rot[KVC_TYPE_COUNT] = {"f32+rot", "f16+rot", "bf16+rot", "q8_0+rot", "q4_0+rot"};
    return b.rot ? rot[b.t] : kvc_type_name(b.t);
}

/* what to run: the lists of the options (see usage()); n_... 0 = the default */
typedef struct options {
    int32_t cells[MAX_LIST], threads[MAX_LIST], gqa[MAX_LIST];
    btype types[MAX_LIST];
    int n_cells, n_threads, n_gqa, n_types;
    int decode, prefill, append, variants; /* --parts */
    int32_t queries;             /* prefill queries */
    int quick, scalar, roofline;
    int gqa_default;             /* no --gqa: GQA 1 only where the default table has it */
} options;

static unsigned long long g_rng = 0x243f6a8885a308d3ull;
static float rnd(void) {
    g_rng ^= g_rng << 13; g_rng ^= g_rng >> 7; g_rng ^= g_rng << 17;
    return (float)((double)(g_rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* ---- read bandwidth ---- */
typedef struct reader {
    const float *buf;
    size_t n;
    float sum[64];
} reader;
static int32_t g_read_tasks; /* the read is cut into this many parts */
static void read_part(void *ctx, int32_t task, int32_t worker) {
    reader *r = (reader *)ctx;
    size_t per = r->n / (size_t)g_read_tasks / 8 * 8, i, end = task == g_read_tasks - 1 ? r->n : per * (size_t)(task + 1);
    float s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0, s6 = 0, s7 = 0;
    for (i = per * (size_t)task; i < end; i += 8) { /* eight chains: the compiler vectorises none, */
        s0 += r->buf[i]; s1 += r->buf[i + 1]; s2 += r->buf[i + 2]; s3 += r->buf[i + 3]; /* but 8 loads */
        s4 += r->buf[i + 4]; s5 += r->buf[i + 5]; s6 += r->buf[i + 6]; s7 += r->buf[i + 7]; /* a line */
    }
    r->sum[worker] += s0 + s1 + s2 + s3 + s4 + s5 + s6 + s7;
    (void)worker;
}
static double read_bandwidth(int threads) {
    reader r;
    double t[MAX_REPS];
    int i;
    memset(&r, 0, sizeof(r));
    r.n = (size_t)256 << 20; /* 1 GiB of floats */
    r.buf = (const float *)malloc(r.n * sizeof(float));
    if (r.buf == NULL) return 0;
#ifdef MADV_HUGEPAGE /* as KVCACHE_HUGE_PAGES asks for the pool's slab: the same TLB cost on both sides */
    madvise((void *)(((uintptr_t)r.buf + ((uintptr_t)1 << 21) - 1) & ~(((uintptr_t)1 << 21) - 1)),
            r.n * sizeof(float) - ((size_t)1 << 21), MADV_HUGEPAGE);
#endif
    memset((void *)r.buf, 1, r.n * sizeof(float)); /* real pages (calloc's could all be the zero page) */
    for (i = 0; i < g_reps; ++i) {
        double t0 = now();
        g_read_tasks = threads == 1 ? 2 : threads;
        if (threads == 1) { read_part(&r, 0, 0); read_part(&r, 1, 0); }
        else kvc_threads_parallel_for(g_threads[threads], threads, read_part, &r);
        t[i] = now() - t0;
    }
    free((void *)r.buf);
    return (double)r.n * sizeof(float) / median(t, g_reps);
}

/* ---- the FMA floor ---- */
/* 512-bit FMAs per second on one thread (12 independent chains, so throughput, not
   latency, bounds it); 0 where the CPU or compiler has no AVX-512. Decode in float
   arithmetic needs n_heads x (hk + hv) / 16 of them per cell (512 for 32 heads of 128),
   whatever the GQA group: that time is the floor no kernel of this design can pass. */
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define FMA_CHAIN(a) a = _mm512_fmadd_ps(a, x, y);
__attribute__((target("avx512f"))) static double fma512_rate(void) {
    __m512 x = _mm512_set1_ps(0.999999f), y = _mm512_set1_ps(1e-6f), a0 = _mm512_set1_ps(1.0f), a1 = a0, a2 = a0;
    __m512 a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0, a8 = a0, a9 = a0, a10 = a0, a11 = a0;
    double t[MAX_REPS], t0;
    long n = 20000000, i;
    int r;
    for (r = 0; r < g_reps; ++r) {
        t0 = now();
        for (i = 0; i < n; ++i) {
            FMA_CHAIN(a0) FMA_CHAIN(a1) FMA_CHAIN(a2) FMA_CHAIN(a3) FMA_CHAIN(a4) FMA_CHAIN(a5)
            FMA_CHAIN(a6) FMA_CHAIN(a7) FMA_CHAIN(a8) FMA_CHAIN(a9) FMA_CHAIN(a10) FMA_CHAIN(a11)
        }
        __asm__ volatile("" : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4), "+v"(a5), "+v"(a6), "+v"(a7),
                         "+v"(a8), "+v"(a9), "+v"(a10), "+v"(a11)); /* done before the clock is read */
        t[r] = now() - t0;
    }
    return 12.0 * (double)n / median(t, g_reps);
}
#else
static double fma512_rate(void) { return 0; }
#endif

/* ---- a FULL cache of n cells, 1 layer ---- */
typedef struct bcache {
    kvc_pool *pool;
    kvc_cache *cache;
    size_t kv_bytes; /* K+V bytes of the cells */
} bcache;

static uint32_t g_disable; /* --disable: cpu_disable of every pool but the scalar one's */
/* --sinks, --softcap, --lse, --f16-tail: the attention variants every timed call uses */
static int g_sinks, g_lse;
static float g_softcap;
static int32_t g_f16_tail;
static float g_sink_values[32];
static float g_lse_out[512 * 32];

/* the variants of the options on a desc of nq queries of 32 heads */
static void apply_variants(kvc_attention_desc *d, int sinks, float softcap, int lse) {
    int i;
    for (i = 0; i < 32; ++i) g_sink_values[i] = 0.5f * (float)(i % 5) - 1.0f;
    d->sinks = sinks ? g_sink_values : NULL;
    d->softcap = softcap;
    d->lse = lse && d->n_queries <= 512 ? g_lse_out : NULL;
}

static void make_cache_tail(bcache *b, btype t, int32_t n_kv, int32_t cells, uint32_t disable, int threads,
                            int32_t tail) {
    kvc_pool_config pc;
    kvc_cache_config cc;
    kvc_pool_stats st;
    int32_t done = 0, chunk = 1024, i;
    size_t row = (size_t)n_kv * 128;
    float *k = (float *)malloc(sizeof(float) * row * (size_t)chunk), *v = (float *)malloc(sizeof(float) * row * (size_t)chunk);
    for (i = 0; i < (int32_t)(row * (size_t)chunk); ++i) { k[i] = rnd(); v[i] = rnd(); }
    kvc_pool_config_init(&pc);
    pc.n_layers = 1; pc.n_kv_heads = n_kv; pc.head_dim_k = pc.head_dim_v = 128;
    pc.type_k = pc.type_v = t.t;
    pc.rotate = t.rot ? KVC_ROTATE_K | KVC_ROTATE_V : 0;
    CHECK(kvc_pool_budget_for_tokens(&pc, cells, &pc.budget_bytes));
    pc.runtime.cpu_disable = disable;
    if (threads > 1) CHECK(kvc_threads_attach(g_threads[threads], &pc.runtime));
    CHECK(kvc_pool_create(&pc, &b->pool));
    kvc_cache_config_init(&cc, KVC_KIND_FULL);
    if (t.t == KVC_TYPE_Q8_0 || t.t == KVC_TYPE_Q4_0) cc.f16_tail = tail;
    CHECK(kvc_cache_create(b->pool, &cc, &b->cache));
    while (done < cells) {
        int32_t n = cells - done < chunk ? cells - done : chunk;
        CHECK(kvc_begin(b->cache, n, NULL, 0));
        CHECK(kvc_put(b->cache, 0, k, v));
        done += n;
    }
    CHECK(kvc_pool_stats_get(b->pool, &st));
    b->kv_bytes = (size_t)cells * (st.k_row_bytes + st.v_row_bytes);
    free(k);
    free(v);
}
static void make_cache(bcache *b, btype t, int32_t n_kv, int32_t cells, uint32_t disable, int threads) {
    make_cache_tail(b, t, n_kv, cells, disable, threads, g_f16_tail);
}
static void free_cache(bcache *b) {
    CHECK(kvc_cache_destroy(b->cache));
    CHECK(kvc_pool_destroy(b->pool));
}

/* median seconds of kvc_attention for nq queries (the last nq positions) */
static double time_attention(bcache *b, int32_t nq, int32_t n_heads, int reps) {
    size_t nqf = (size_t)nq * (size_t)n_heads * 128, i;
    float *q = (float *)malloc(sizeof(float) * nqf), *out = (float *)malloc(sizeof(float) * nqf);
    kvc_attention_desc d;
    double t[MAX_REPS];
    size_t scratch_bytes;
    void *scratch;
    int r;
    for (i = 0; i < nqf; ++i) q[i] = rnd();
    memset(&d, 0, sizeof(d));
    d.n_queries = nq; d.n_heads = n_heads; d.q = q; d.out = out;
    apply_variants(&d, g_sinks, g_softcap, g_lse);
    CHECK(kvc_attention_scratch_bytes(b->cache, &d, &scratch_bytes));
    scratch = malloc(scratch_bytes); /* the caller's scratch: no allocation in the loop */
    d.scratch = scratch; d.scratch_bytes = scratch_bytes;
    CHECK(kvc_attention(b->cache, 0, &d)); /* warm */
    for (r = 0; r < reps; ++r) {
        double t0 = now();
        CHECK(kvc_attention(b->cache, 0, &d));
        t[r] = now() - t0;
    }
    free(scratch); free(q); free(out);
    return median(t, reps);
}

/* bw[th]: read bandwidth with th threads (0: not measured) */
static void bench_decode(const options *o, const double *bw, double fma) {
    int si, ti, thi, gi;
    printf("\ndecode attention, 1 query, head dim 128, FULL cache, medians of %d (scalar: %d)\n", g_reps, 3);
    printf("%-8s %5s %6s %3s %9s %8s %8s %8s %9s\n", "type", "GQA", "cells", "thr", "time", "K+V GB/s", "vs read",
           "vs FMA", "vs scalar");
    for (gi = 0; gi < o->n_gqa; ++gi)
        for (ti = 0; ti < o->n_types; ++ti)
            for (si = 0; si < o->n_cells; ++si) {
                int32_t gqa = o->gqa[gi], n_kv = 32 / gqa, cells = o->cells[si];
                btype bt = o->types[ti];
                kvc_type type = bt.t;
                double scalar_s = 0;
                /* the default table: GQA 1 only for f16 and q8_0 at 16k */
                if (o->gqa_default && gqa == 1 && ((type != KVC_TYPE_F16 && type != KVC_TYPE_Q8_0) || cells != 16384 || bt.rot)) continue;
                for (thi = 0; thi < o->n_threads; ++thi) {
                    int th = o->threads[thi];
                    bcache b;
                    double s, gbs;
                    make_cache(&b, bt, n_kv, cells, g_disable, th);
                    s = time_attention(&b, 1, 32, g_reps);
                    gbs = (double)b.kv_bytes / s / 1e9;
                    free_cache(&b);
                    if (o->scalar && th == 1 && (gqa == 4 || type == KVC_TYPE_F16)) {
                        make_cache(&b, bt, n_kv, cells, ~0u, 1);
                        scalar_s = time_attention(&b, 1, 32, 3);
                        free_cache(&b);
                    }
                    printf("%-8s %5d %6d %3d %7.3fms %8.1f ", btype_name(bt), (int)gqa, (int)cells, th, s * 1e3, gbs);
                    if (bw[th] > 0) printf("%7.0f%% ", 100.0 * gbs * 1e9 / bw[th]); else printf("%8s ", "-");
                    if (fma > 0 && (type == KVC_TYPE_F16 || type == KVC_TYPE_BF16 || type == KVC_TYPE_F32))
                        printf("%7.0f%% ", 100.0 * (double)cells * 512.0 / (th * fma) / s); /* float types */
                    else
                        printf("%8s ", "-");
                    if (scalar_s > 0) printf("%8.1fx", scalar_s / s); else printf("%9s", "-");
                    printf("\n");
                }
            }
}

/* the work rotated storage adds to a decode call (q rotated, out rotated back: 32 heads x
   128): kvc_attention over 16 cells of q8_0, rotated against plain, medians of many */
static void bench_rotation(void) {
    btype plain = {KVC_TYPE_Q8_0, 0}, rot = {KVC_TYPE_Q8_0, 1};
    double tp[5], tr[5];
    int r;
    for (r = 0; r < 5; ++r) { /* alternating */
        bcache b;
        make_cache(&b, plain, 8, 16, g_disable, 1);
        tp[r] = time_attention(&b, 1, 32, MAX_REPS);
        free_cache(&b);
        make_cache(&b, rot, 8, 16, g_disable, 1);
        tr[r] = time_attention(&b, 1, 32, MAX_REPS);
        free_cache(&b);
    }
    printf("rotation's cost in a decode call (32 heads x 128, one thread): %.2f us (attention over 16 cells of\n"
           "q8_0: %.2f us plain, %.2f us rotated; medians of 5 alternating medians of %d)\n",
           (median(tr, 5) - median(tp, 5)) * 1e6, median(tp, 5) * 1e6, median(tr, 5) * 1e6, MAX_REPS);
}

static void bench_prefill(const options *o) {
    int ti, thi, si, gi;
    int32_t nq = o->queries;
    printf("\nprefill attention, %d queries at the last positions (causal), 32 q heads, head dim 128\n", (int)nq);
    printf("%-8s %5s %6s %3s %9s %9s\n", "type", "GQA", "cells", "thr", "time", "GFLOP/s");
    for (gi = 0; gi < o->n_gqa; ++gi)
        for (ti = 0; ti < o->n_types; ++ti)
            for (si = 0; si < o->n_cells; ++si)
                for (thi = 0; thi < o->n_threads; ++thi) {
                    int32_t gqa = o->gqa[gi], cells = o->cells[si], qi;
                    btype bt = o->types[ti];
                    int th = o->threads[thi];
                    double s, flops = 0;
                    bcache b;
                    if (nq > cells) continue;
                    make_cache(&b, bt, 32 / gqa, cells, g_disable, th);
                    s = time_attention(&b, nq, 32, g_reps < 5 ? g_reps : 5);
                    for (qi = 0; qi < nq; ++qi) flops += 4.0 * 32 * 128 * (double)(cells - nq + qi + 1);
                    printf("%-8s %5d %6d %3d %7.1fms %9.1f\n", btype_name(bt), (int)gqa, (int)cells, th, s * 1e3,
                           flops / s / 1e9);
                    free_cache(&b);
                }
}

/* append: 4096 tokens of 32 layers x 8 x 128 f32 K and V, converted at kvc_put */
static void bench_append_and_rope(const btype *types, int n_types) {
    enum { TOK = 4096, BATCH = 512, LAYERS = 8, ROW = 8 * 128 };
    float *k = (float *)malloc(sizeof(float) * BATCH * ROW), *v = (float *)malloc(sizeof(float) * BATCH * ROW);
    int ti, i, r;
    for (i = 0; i < BATCH * ROW; ++i) { k[i] = rnd(); v[i] = rnd(); }
    printf("\nappend (f32 in, %d tokens x %d layers x 8 x 128, batches of %d) and RoPE shift (kvc_seq_remove of\n"
           "the first 16 positions: every later key of every layer re-rotated), GB/s of f32 K+V in / of keys moved\n",
           TOK, LAYERS, BATCH);
    printf("%-8s %12s %12s %12s\n", "type", "append GB/s", "shift ms", "shift GB/s");
    for (ti = 0; ti < n_types; ++ti) {
        kvc_pool_config pc;
        kvc_cache_config cc;
        kvc_pool *p;
        kvc_cache *c;
        double ta[MAX_REPS], ts[MAX_REPS];
        for (r = 0; r < g_reps; ++r) {
            int32_t done, l, pos[BATCH], seq[BATCH];
            kvc_batch b;
            double t0;
            kvc_pool_config_init(&pc);
            pc.n_layers = LAYERS; pc.n_kv_heads = 8; pc.head_dim_k = pc.head_dim_v = 128;
            pc.type_k = pc.type_v = types[ti].t;
            pc.rotate = types[ti].rot ? KVC_ROTATE_K | KVC_ROTATE_V : 0;
            CHECK(kvc_pool_budget_for_tokens(&pc, TOK, &pc.budget_bytes)); /* the causal cache's TOK cells */
            CHECK(kvc_pool_create(&pc, &p));
            kvc_cache_config_init(&cc, KVC_KIND_CAUSAL);
            cc.capacity = TOK;
            cc.max_seqs = 1;
            cc.rope.n_dims = 128;
            cc.rope.theta = 10000.0f;
            cc.rope.style = KVC_ROPE_NEOX;
            CHECK(kvc_cache_create(p, &cc, &c));
            memset(&b, 0, sizeof(b));
            b.n_tokens = BATCH; b.pos = pos; b.seq = seq;
            t0 = now();
            for (done = 0; done < TOK; done += BATCH) {
                for (i = 0; i < BATCH; ++i) { pos[i] = done + i; seq[i] = 0; }
                CHECK(kvc_begin_batch(c, &b));
                for (l = 0; l < LAYERS; ++l) CHECK(kvc_put(c, l, k, v));
            }
            ta[r] = now() - t0;
            t0 = now();
            CHECK(kvc_seq_remove(c, 0, 0, 16));
            ts[r] = now() - t0;
            CHECK(kvc_cache_destroy(c));
            CHECK(kvc_pool_destroy(p));
        }
        {
            double a = median(ta, g_reps), s = median(ts, g_reps);
            kvc_pool_stats st;
            size_t kbytes;
            CHECK(kvc_pool_create(&pc, &p));
            CHECK(kvc_pool_stats_get(p, &st));
            kbytes = (size_t)(TOK - 16) * st.k_row_bytes * LAYERS;
            CHECK(kvc_pool_destroy(p));
            printf("%-8s %12.2f %12.2f %12.2f\n", btype_name(types[ti]), (double)TOK * ROW * 8 * LAYERS / a / 1e9, s * 1e3,
                   (double)kbytes / s / 1e9);
        }
    }
    free(k);
    free(v);
}

/* decode with each variant, the configurations alternated within every repetition */
static void bench_variants(const options *o) {
    enum { NV = 6 };
    static const char *names[NV] = {"plain", "+sinks", "+softcap", "+lse", "+all3", "+f16_tail"};
    int ti, si, v, r;
    int32_t tail = g_f16_tail > 0 ? g_f16_tail : 128;
    printf("\nattention variants: decode, 1 query, 32 q heads / 8 kv heads, head dim 128, 1 thread, medians of %d\n"
           "alternated runs (softcap 50; f16_tail %d tokens, quantized types)\n", g_reps, (int)tail);
    printf("%-8s %6s %-10s %9s %9s\n", "type", "cells", "variant", "time", "vs plain");
    for (ti = 0; ti < o->n_types; ++ti)
        for (si = 0; si < o->n_cells; ++si) {
            btype type = o->types[ti];
            int32_t cells = o->cells[si], quant = type.t == KVC_TYPE_Q8_0 || type.t == KVC_TYPE_Q4_0;
            bcache b, bt;
            kvc_attention_desc d[NV];
            float *q = (float *)malloc(sizeof(float) * 32 * 128), *out = (float *)malloc(sizeof(float) * 32 * 128);
            double t[NV][MAX_REPS], med[NV];
            size_t bytes, most = 0;
            void *scratch;
            for (v = 0; v < 32 * 128; ++v) q[v] = rnd();
            make_cache_tail(&b, type, 8, cells, g_disable, 1, 0);
            if (quant) make_cache_tail(&bt, type, 8, cells, g_disable, 1, tail);
            for (v = 0; v < NV; ++v) {
                memset(&d[v], 0, sizeof(d[v]));
                d[v].n_queries = 1; d[v].n_heads = 32; d[v].q = q; d[v].out = out;
                apply_variants(&d[v], v == 1 || v == 4, v == 2 || v == 4 ? 50.0f : 0.0f, v == 3 || v == 4);
                if (v == 5 && !quant) continue;
                CHECK(kvc_attention_scratch_bytes(v == 5 ? bt.cache : b.cache, &d[v], &bytes));
                most = bytes > most ? bytes : most;
            }
            scratch = malloc(most);
            for (v = 0; v < NV; ++v) { d[v].scratch = scratch; d[v].scratch_bytes = most; }
            for (r = -1; r < g_reps; ++r) /* r = -1 warms every configuration */
                for (v = 0; v < NV; ++v) {
                    double t0;
                    if (v == 5 && !quant) continue;
                    t0 = now();
                    CHECK(kvc_attention(v == 5 ? bt.cache : b.cache, 0, &d[v]));
                    if (r >= 0) t[v][r] = now() - t0;
                }
            for (v = 0; v < NV; ++v) {
                if (v == 5 && !quant) continue;
                med[v] = median(t[v], g_reps);
                printf("%-8s %6d %-10s %7.3fms %8.3fx\n", btype_name(type), (int)cells, names[v], med[v] * 1e3,
                       med[v] / med[0]);
            }
            free(scratch); free(q); free(out);
            free_cache(&b);
            if (quant) free_cache(&bt);
        }
}


/* the default decode table's types; --types also takes any type with "+rot" */
static const btype g_all_types[7] = {{KVC_TYPE_F16, 0},  {KVC_TYPE_Q8_0, 0}, {KVC_TYPE_Q8_0, 1}, {KVC_TYPE_Q4_0, 0},
                                     {KVC_TYPE_Q4_0, 1}, {KVC_TYPE_BF16, 0}, {KVC_TYPE_F32, 0}};

static void usage(FILE *f, const char *argv0) {
    fprintf(f,
            "usage: %s [options]   (no options: the whole table)\n"
            "  --parts LIST     decode,prefill,append,variants (default the first three)\n"
            "  --types LIST     storage types, K and V the same: f16,q8_0,q4_0,bf16,f32, each also with\n"
            "                   +rot (K and V stored rotated, kvc_pool_config.rotate), e.g. q4_0+rot\n"
            "                   (default: f16,q8_0,q8_0+rot,q4_0,q4_0+rot,bf16,f32 for decode and append,\n"
            "                   f16,q8_0 for prefill)\n"
            "  --cells LIST     cells of the FULL cache (default 4096,16384,32768 for decode, 4096 for prefill)\n"
            "  --threads LIST   thread counts, each up to %d (default 1,2)\n"
            "  --gqa LIST       query heads per kv head, dividing 32 (default 4, and 1 for f16 and q8_0 at 16k\n"
            "                   in decode; 4 in prefill)\n"
            "  --queries N      prefill queries (default 512)\n"
            "  --reps N         repetitions per timing, the median printed (default 7, at most %d)\n"
            "  --quick          a smoke run in seconds: decode only, 4096 cells, f16,q8_0,q4_0+rot,\n"
            "                   1 thread, 3 reps, no scalar or roofline (other options still apply)\n"
            "  --no-scalar      skip the scalar-path comparison\n"
            "  --no-roofline    skip measuring read bandwidth and FMA throughput (their columns show -)\n"
            "  --disable MASK   the pools' cpu_disable (0xc: the AVX2 path on an AVX-512 machine, as CPUs\n"
            "                   without AVX-512 run it)\n"
            "  --sinks          every timed call with per-head sinks (kvc_attention_desc.sinks)\n"
            "  --softcap X      every timed call with logit soft-capping X\n"
            "  --lse            every timed call writes the log-sum-exp output\n"
            "  --f16-tail N     q8_0 / q4_0 caches keep their newest N tokens in f16 (variants: the\n"
            "                   tail's size, default 128)\n",
            argv0, MAX_THREADS, MAX_REPS);
}

static int parse_types(const char *s, btype *out) {
    int n = 0, i;
    while (*s && n < MAX_LIST) {
        size_t len = strcspn(s, ",");
        for (i = 0; i < 2 * KVC_TYPE_COUNT; ++i) {
            btype b;
            b.t = (kvc_type)(i / 2);
            b.rot = (uint32_t)(i & 1);
            if (strlen(btype_name(b)) == len && strncmp(s, btype_name(b), len) == 0) {
                out[n++] = b;
                break;
            }
        }
        if (i == 2 * KVC_TYPE_COUNT) return -1;
        s += len;
        if (*s == ',') s++;
    }
    return n;
}

static int parse_ints(const char *s, int32_t *out, int32_t lo, int32_t hi) {
    int n = parse_list(s, out, MAX_LIST), i;
    for (i = 0; i < n; ++i)
        if (out[i] < lo || out[i] > hi) return -1;
    return n;
}

int main(int argc, char **argv) {
    static const int32_t decode_cells[3] = {4096, 16384, 32768}, one_thread_two[2] = {1, 2}, gqa_default[2] = {4, 1};
    options o, d;
    int i, n, parts_given = 0, reps_given = 0;
    double bw[MAX_THREADS + 1], fma = 0;
    const char *kernels;
    uint32_t f = 0;
    memset(&o, 0, sizeof(o));
    memset(bw, 0, sizeof(bw));
    o.decode = o.prefill = o.append = 1;
    o.queries = 512;
    o.scalar = o.roofline = 1;
    for (i = 1; i < argc; ++i) {
        const char *a = argv[i], *v = NULL;
        int bad = 0;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) { usage(stdout, argv[0]); return 0; }
        if (strcmp(a, "--quick") == 0) { o.quick = 1; continue; }
        if (strcmp(a, "--no-scalar") == 0) { o.scalar = 0; continue; }
        if (strcmp(a, "--no-roofline") == 0) { o.roofline = 0; continue; }
        if (strcmp(a, "--sinks") == 0) { g_sinks = 1; continue; }
        if (strcmp(a, "--lse") == 0) { g_lse = 1; continue; }
        if (i + 1 < argc) v = argv[++i]; /* every other option takes a value */
        if (v == NULL) bad = 1;
        else if (strcmp(a, "--reps") == 0) { g_reps = atoi(v); bad = g_reps < 1 || g_reps > MAX_REPS; reps_given = 1; }
        else if (strcmp(a, "--disable") == 0) g_disable = (uint32_t)strtoul(v, NULL, 0);
        else if (strcmp(a, "--queries") == 0) { o.queries = atoi(v); bad = o.queries < 1; }
        else if (strcmp(a, "--softcap") == 0) { g_softcap = (float)atof(v); bad = !(g_softcap >= 0); }
        else if (strcmp(a, "--f16-tail") == 0) { g_f16_tail = atoi(v); bad = g_f16_tail < 0; }
        else if (strcmp(a, "--types") == 0) bad = (o.n_types = parse_types(v, o.types)) <= 0;
        else if (strcmp(a, "--cells") == 0) bad = (o.n_cells = parse_ints(v, o.cells, 1, 1 << 24)) <= 0;
        else if (strcmp(a, "--threads") == 0) bad = (o.n_threads = parse_ints(v, o.threads, 1, MAX_THREADS)) <= 0;
        else if (strcmp(a, "--gqa") == 0) {
            bad = (o.n_gqa = parse_ints(v, o.gqa, 1, 32)) <= 0;
            for (n = 0; n < o.n_gqa; ++n) bad |= 32 % o.gqa[n] != 0;
        } else if (strcmp(a, "--parts") == 0) {
            parts_given = 1;
            o.decode = strstr(v, "decode") != NULL;
            o.prefill = strstr(v, "prefill") != NULL;
            o.append = strstr(v, "append") != NULL;
            o.variants = strstr(v, "variants") != NULL;
            bad = !(o.decode || o.prefill || o.append || o.variants);
        } else bad = 1;
        if (bad) {
            fprintf(stderr, "%s: bad option %s%s%s\n", argv[0], a, v ? " " : "", v ? v : "");
            usage(stderr, argv[0]);
            return 2;
        }
    }
    if (o.quick) { /* what no option chose: the smallest run that still goes through each path */
        if (!parts_given) o.prefill = o.append = o.variants = 0;
        if (o.n_types == 0) o.n_types = parse_types("f16,q8_0,q4_0+rot", o.types);
        if (o.n_cells == 0) { o.n_cells = 1; o.cells[0] = 4096; }
        if (o.n_threads == 0) { o.n_threads = 1; o.threads[0] = 1; }
        if (!reps_given) g_reps = 3;
        o.scalar = o.roofline = 0;
    }
    if (o.n_threads == 0) { o.n_threads = 2; memcpy(o.threads, one_thread_two, sizeof(one_thread_two)); }
    for (i = 0; i < o.n_threads; ++i) {
        n = o.threads[i];
        if (n > 1 && g_threads[n] == NULL) CHECK(kvc_threads_create(n, &g_threads[n]));
    }
    CHECK(kvc_cpu_features(&f));
    f &= ~g_disable;
    kernels = f & KVC_CPU_AVX512_VNNI ? "avx512-vnni" : f & KVC_CPU_AVX512 ? "avx512" : f & KVC_CPU_AVX2 ? "avx2"
              : f & KVC_CPU_SSE2 ? "sse2" : f & KVC_CPU_NEON_DOTPROD ? "neon-dotprod" : f & KVC_CPU_NEON ? "neon" : "scalar";
    printf("cpu features %#x (kernels: %s)", f, kernels);
    if (o.roofline) {
        printf("; read bandwidth over 1 GiB:");
        for (i = 0; i < o.n_threads; ++i) {
            n = o.threads[i];
            if (bw[n] == 0) bw[n] = read_bandwidth(n);
            printf("%s %.1f GB/s (%d thread%s)", i ? "," : "", bw[n] / 1e9, n, n > 1 ? "s" : "");
        }
        fma = f & KVC_CPU_AVX512 ? fma512_rate() : 0;
    }
    printf("\n");
    if (fma > 0)
        printf("512-bit FMAs: %.2f G/s on one thread; decode in float needs 512 per cell (32 heads, head dim 128):\n"
               "'vs FMA' is that floor's time over the measured time (%.2f ms at 16k cells on 1 thread)\n",
               fma / 1e9, 16384.0 * 512.0 / fma * 1e3);
    if (o.decode) {
        d = o;
        if (d.n_types == 0) { d.n_types = 7; memcpy(d.types, g_all_types, sizeof(g_all_types)); }
        if (d.n_cells == 0) { d.n_cells = o.quick ? 1 : 3; memcpy(d.cells, decode_cells, sizeof(decode_cells)); }
        if (d.n_gqa == 0) { d.n_gqa = 2; d.gqa_default = 1; memcpy(d.gqa, gqa_default, sizeof(gqa_default)); }
        bench_decode(&d, bw, fma);
        for (i = 0; i < d.n_types; ++i)
            if (d.types[i].rot) { bench_rotation(); break; }
    }
    if (o.prefill) {
        d = o;
        if (d.n_types == 0) { d.n_types = 2; memcpy(d.types, g_all_types, 2 * sizeof(btype)); }
        if (d.n_cells == 0) { d.n_cells = 1; d.cells[0] = 4096; }
        if (d.n_gqa == 0) { d.n_gqa = 1; d.gqa[0] = 4; }
        bench_prefill(&d);
    }
    if (o.variants) {
        static const kvc_type variant_types[3] = {KVC_TYPE_F16, KVC_TYPE_Q8_0, KVC_TYPE_Q4_0};
        d = o;
        if (d.n_types == 0) { d.n_types = 3; memcpy(d.types, variant_types, sizeof(variant_types)); }
        if (d.n_cells == 0) { d.n_cells = 1; d.cells[0] = 16384; }
        bench_variants(&d);
    }
    if (o.append) {
        static const btype append_types[7] = {{KVC_TYPE_F32, 0},  {KVC_TYPE_F16, 0},  {KVC_TYPE_BF16, 0}, {KVC_TYPE_Q8_0, 0},
                                              {KVC_TYPE_Q8_0, 1}, {KVC_TYPE_Q4_0, 0}, {KVC_TYPE_Q4_0, 1}};
        if (o.n_types > 0) bench_append_and_rope(o.types, o.n_types);
        else bench_append_and_rope(append_types, 7);
    }
    for (i = 0; i <= MAX_THREADS; ++i)
        if (g_threads[i] != NULL) CHECK(kvc_threads_destroy(g_threads[i]));
    return 0;
}
