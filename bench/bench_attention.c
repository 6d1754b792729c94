/* bench_attention.c - the CPU kernels of kvcache.h (run by `make bench`), one table.

   - Read bandwidth of this machine, measured here: a streaming read (sum of floats)
     over a 1 GiB buffer, with 1 and 2 threads, the ceiling for decode attention. On
     Linux the buffer gets transparent huge pages, as kvcache.h asks for its slab.
   - Decode attention: 1 query token, 32 query heads / 8 kv heads (GQA 4) and also
     32 / 32 (GQA 1), head dim 128, 4k / 16k / 32k cells of a FULL cache, each storage
     type (K and V the same), 1 and 2 threads (kvc_threads): median time, GB/s of K+V
     read, the ratio to the read bandwidth of the same thread count, the ratio to the
     scalar path (cpu_disable = all; measured with 1 thread, fewer reps), and for f16
     and q8_0 the ratio to llama.cpp's CPU flash attention on this machine as the
     issue quotes it (f16 2.4 ms at 4k, 12 ms at 16k; q8_0 3.4 / 13.8 ms).
     At 4k cells the f16 K+V (16 MiB) fits in the 32 MiB L3; 16k (64 MiB) does not.
     For the float types, 'vs FMA' is the share of this machine's 512-bit FMA throughput
     (measured here too) that the call reaches: every kernel of this design needs
     n_heads x (hk + hv) f32 multiply-adds per cell, so that is the compute floor.
   - Prefill attention: 512 queries at the last positions of 4k cells, causal,
     f16 and q8_0: GFLOP/s counting 4 flops per (query head, visible cell, dim)
     (llama.cpp: 60 and 18 GFLOP/s).
   - Append (f32 in, converted / quantised at kvc_put) and the RoPE shift of
     kvc_seq_remove (dequantise, rotate, requantise): GB/s of stored K+V bytes.
   Times are medians of --reps runs; nothing is asserted.

   Build:  cc -std=c99 -O2 bench/bench_attention.c -o bench_attention -lm -lpthread
   Usage:  bench_attention [--reps N] [--quick] [--disable MASK]
           --quick: 4k cells only; --disable: the pools' cpu_disable (0xc: the AVX2 path on
           an AVX-512 machine, as CPUs without AVX-512 run it) */
#define _DEFAULT_SOURCE /* madvise: the pool's slab and the read buffer both get huge pages */
#define _POSIX_C_SOURCE 199309L
#define KVCACHE_THREADS
#define KVCACHE_IMPLEMENTATION
#include "../kvcache.h"
#include "bench_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_REPS 51
static int g_reps = 7;
static kvc_threads *g_threads2;

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
static void read_part(void *ctx, int32_t task, int32_t worker) {
    reader *r = (reader *)ctx;
    size_t per = r->n / 2, i, end = per * (size_t)(task + 1);
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
#ifdef MADV_HUGEPAGE /* as kvcache.h asks for the pool's slab: the same TLB cost on both sides */
    madvise((void *)(((uintptr_t)r.buf + ((uintptr_t)1 << 21) - 1) & ~(((uintptr_t)1 << 21) - 1)),
            r.n * sizeof(float) - ((size_t)1 << 21), MADV_HUGEPAGE);
#endif
    memset((void *)r.buf, 1, r.n * sizeof(float)); /* real pages (calloc's could all be the zero page) */
    for (i = 0; i < g_reps; ++i) {
        double t0 = now();
        if (threads == 1) { read_part(&r, 0, 0); read_part(&r, 1, 0); }
        else kvc_threads_parallel_for(g_threads2, 2, read_part, &r);
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

static void make_cache(bcache *b, kvc_type t, int32_t n_kv, int32_t cells, uint32_t disable, int threads) {
    kvc_pool_config pc;
    kvc_cache_config cc;
    kvc_pool_stats st;
    int32_t done = 0, chunk = 1024, i;
    size_t row = (size_t)n_kv * 128;
    float *k = (float *)malloc(sizeof(float) * row * (size_t)chunk), *v = (float *)malloc(sizeof(float) * row * (size_t)chunk);
    for (i = 0; i < (int32_t)(row * (size_t)chunk); ++i) { k[i] = rnd(); v[i] = rnd(); }
    kvc_pool_config_init(&pc);
    pc.n_layers = 1; pc.n_kv_heads = n_kv; pc.head_dim_k = pc.head_dim_v = 128;
    pc.type_k = pc.type_v = t;
    pc.budget_bytes = (size_t)cells * row * 4 * 2 + ((size_t)4 << 20);
    pc.cpu_disable = disable;
    if (threads == 2) CHECK(kvc_threads_attach(g_threads2, &pc));
    CHECK(kvc_pool_create(&pc, &b->pool));
    kvc_cache_config_init(&cc, KVC_KIND_FULL);
    CHECK(kvc_cache_create(b->pool, &cc, &b->cache));
    while (done < cells) {
        int32_t n = cells - done < chunk ? cells - done : chunk;
        CHECK(kvc_begin(b->cache, n));
        CHECK(kvc_put(b->cache, 0, k, v));
        done += n;
    }
    CHECK(kvc_pool_stats_get(b->pool, &st));
    b->kv_bytes = (size_t)cells * (st.k_row_bytes + st.v_row_bytes);
    free(k);
    free(v);
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

static const double g_llama_ms[2][3] = {{2.4, 12.0, 0}, {3.4, 13.8, 0}}; /* f16, q8_0 at 4k, 16k */

static void bench_decode(double bw1, double bw2, double fma, int quick) {
    static const int32_t sizes[3] = {4096, 16384, 32768};
    static const kvc_type types[5] = {KVC_TYPE_F16, KVC_TYPE_Q8_0, KVC_TYPE_Q4_0, KVC_TYPE_BF16, KVC_TYPE_F32};
    int si, ti, th, gqa;
    printf("\ndecode attention, 1 query, head dim 128, FULL cache, medians of %d (scalar: %d)\n", g_reps, 3);
    printf("%-6s %5s %6s %3s %9s %8s %8s %8s %9s %10s\n", "type", "GQA", "cells", "thr", "time", "K+V GB/s", "vs read",
           "vs FMA", "vs scalar", "vs llama");
    for (gqa = 4; gqa >= 1; gqa -= 3)
        for (ti = 0; ti < 5; ++ti)
            for (si = 0; si < (quick ? 1 : 3); ++si) {
                int32_t n_kv = 32 / gqa;
                double scalar_s = 0;
                if (gqa == 1 && (ti > 1 || si != 1)) continue; /* GQA 1: f16 and q8_0 at 16k */
                for (th = 1; th <= 2; ++th) {
                    bcache b;
                    double s, gbs;
                    make_cache(&b, types[ti], n_kv, sizes[si], g_disable, th);
                    s = time_attention(&b, 1, 32, g_reps);
                    gbs = (double)b.kv_bytes / s / 1e9;
                    free_cache(&b);
                    if (th == 1 && (gqa == 4 || ti == 0)) {
                        make_cache(&b, types[ti], n_kv, sizes[si], ~0u, 1);
                        scalar_s = time_attention(&b, 1, 32, 3);
                        free_cache(&b);
                    }
                    printf("%-6s %5d %6d %3d %7.3fms %8.1f %7.0f%% ", kvc_type_name(types[ti]), gqa, (int)sizes[si], th,
                           s * 1e3, gbs, 100.0 * gbs * 1e9 / (th == 1 ? bw1 : bw2));
                    if (fma > 0 && (types[ti] == KVC_TYPE_F16 || types[ti] == KVC_TYPE_BF16 || types[ti] == KVC_TYPE_F32))
                        printf("%7.0f%% ", 100.0 * (double)sizes[si] * 512.0 / (th * fma) / s); /* float types */
                    else
                        printf("%8s ", "-");
                    if (scalar_s > 0) printf("%8.1fx ", scalar_s / s); else printf("%9s ", "-");
                    if (gqa == 4 && ti < 2 && si < 2) printf("%9.1fx", g_llama_ms[ti][si] * 1e-3 / s);
                    printf("\n");
                }
            }
}

static void bench_prefill(void) {
    static const kvc_type types[2] = {KVC_TYPE_F16, KVC_TYPE_Q8_0};
    static const double llama_gflops[2] = {60, 18};
    int ti, th;
    printf("\nprefill attention, 512 queries over 4096 cells (causal), 32 q / 8 kv heads, head dim 128\n");
    printf("%-6s %3s %9s %9s %9s\n", "type", "thr", "time", "GFLOP/s", "vs llama");
    for (ti = 0; ti < 2; ++ti)
        for (th = 1; th <= 2; ++th) {
            bcache b;
            double s, flops = 0;
            int32_t qi;
            make_cache(&b, types[ti], 8, 4096, g_disable, th);
            s = time_attention(&b, 512, 32, g_reps < 5 ? g_reps : 5);
            for (qi = 0; qi < 512; ++qi) flops += 4.0 * 32 * 128 * (double)(4096 - 512 + qi + 1);
            printf("%-6s %3d %7.1fms %9.1f %8.1fx\n", kvc_type_name(types[ti]), th, s * 1e3, flops / s / 1e9,
                   flops / s / 1e9 / llama_gflops[ti]);
            free_cache(&b);
        }
}

/* append: 4096 tokens of 32 layers x 8 x 128 f32 K and V, converted at kvc_put */
static void bench_append_and_rope(void) {
    static const kvc_type types[5] = {KVC_TYPE_F32, KVC_TYPE_F16, KVC_TYPE_BF16, KVC_TYPE_Q8_0, KVC_TYPE_Q4_0};
    enum { TOK = 4096, BATCH = 512, LAYERS = 8, ROW = 8 * 128 };
    float *k = (float *)malloc(sizeof(float) * BATCH * ROW), *v = (float *)malloc(sizeof(float) * BATCH * ROW);
    int ti, i, r;
    for (i = 0; i < BATCH * ROW; ++i) { k[i] = rnd(); v[i] = rnd(); }
    printf("\nappend (f32 in, %d tokens x %d layers x 8 x 128, batches of %d) and RoPE shift (kvc_seq_remove of\n"
           "the first 16 positions: every later key of every layer re-rotated), GB/s of f32 K+V in / of keys moved\n",
           TOK, LAYERS, BATCH);
    printf("%-6s %12s %12s %12s\n", "type", "append GB/s", "shift ms", "shift GB/s");
    for (ti = 0; ti < 5; ++ti) {
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
            pc.type_k = pc.type_v = types[ti];
            pc.budget_bytes = (size_t)TOK * ROW * 4 * 2 * LAYERS + ((size_t)8 << 20);
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
            printf("%-6s %12.2f %12.2f %12.2f\n", kvc_type_name(types[ti]), (double)TOK * ROW * 8 * LAYERS / a / 1e9, s * 1e3,
                   (double)kbytes / s / 1e9);
        }
    }
    free(k);
    free(v);
}

int main(int argc, char **argv) {
    int i, quick = 0;
    double bw1, bw2, fma;
    const char *kernels;
    uint32_t f = 0;
    for (i = 1; i < argc; ++i) {
        if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) g_reps = atoi(argv[++i]);
        else if (strcmp(argv[i], "--quick") == 0) quick = 1;
        else if (strcmp(argv[i], "--disable") == 0 && i + 1 < argc) g_disable = (uint32_t)strtoul(argv[++i], NULL, 0);
        else { fprintf(stderr, "usage: %s [--reps N] [--quick] [--disable MASK]\n", argv[0]); return 2; }
    }
    if (g_reps < 1 || g_reps > MAX_REPS) g_reps = 7;
    CHECK(kvc_threads_create(2, &g_threads2));
    CHECK(kvc_cpu_features(&f));
    f &= ~g_disable;
    bw1 = read_bandwidth(1);
    bw2 = read_bandwidth(2);
    fma = f & KVC_CPU_AVX512 ? fma512_rate() : 0;
    kernels = f & KVC_CPU_AVX512_VNNI ? "avx512-vnni" : f & KVC_CPU_AVX512 ? "avx512" : f & KVC_CPU_AVX2 ? "avx2"
              : f & KVC_CPU_SSE2 ? "sse2" : f & KVC_CPU_NEON_DOTPROD ? "neon-dotprod" : f & KVC_CPU_NEON ? "neon" : "scalar";
    printf("cpu features %#x (kernels: %s); read bandwidth over 1 GiB: %.1f GB/s (1 thread), %.1f GB/s (2 threads)\n", f,
           kernels, bw1 / 1e9, bw2 / 1e9);
    if (fma > 0)
        printf("512-bit FMAs: %.2f G/s on one thread; decode in float needs 512 per cell (32 heads, head dim 128):\n"
               "'vs FMA' is that floor's time over the measured time (%.2f ms at 16k cells on 1 thread)\n",
               fma / 1e9, 16384.0 * 512.0 / fma * 1e3);
    bench_decode(bw1, bw2, fma, quick);
    bench_prefill();
    bench_append_and_rope();
    CHECK(kvc_threads_destroy(g_threads2));
    return 0;
}
