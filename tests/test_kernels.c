/* test_kernels.c - every CPU path against the scalar reference, on random data.
   Today: the F16C f32 <-> f16 conversions (bit-exact on all 65536 halves and on
   millions of floats, ties and subnormals included), and whole pools with the path
   on and off giving identical K/V and identical attention. */
#define KVCACHE_IMPLEMENTATION
#include "../kvcache.h"
#include "tk.h"

#include <time.h>

TK_UNUSED static uint32_t bits_of(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
TK_UNUSED static float float_of(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

#ifdef KVC__X86
static void test_f16c_conversions(tk_rng *rng) {
    static uint16_t half[65536], back[65536];
    static float fast[65536], ref[65536], src[1 << 16];
    int32_t i, bad = 0, round;
    for (i = 0; i < 65536; ++i) half[i] = (uint16_t)i;
    kvc__f16_to_f32_f16c(half, fast, 65536);
    for (i = 0; i < 65536; ++i) {
        ref[i] = kvc__f16_to_f32(half[i]);
        if (ref[i] != ref[i]) bad += fast[i] == fast[i]; /* NaN stays NaN */
        else bad += bits_of(ref[i]) != bits_of(fast[i]);
    }
    TK_EQ(bad, 0);
    /* f32 -> f16: random bit patterns, values near every f16 rounding boundary, ties */
    for (round = 0; round < 40; ++round) {
        for (i = 0; i < 65536; ++i) {
            uint32_t u = (uint32_t)tk_next(rng);
            switch (round % 4) {
            case 0: break;                                                 /* any float */
            case 1: u = (u & 0x80000000u) | ((uint32_t)(103 + u % 40) << 23) | (u & 0x7fffffu); break; /* f16 range */
            case 2: u = (u & 0x80001000u) | ((uint32_t)(103 + u % 40) << 23) | (u & 0x7fe000u); break; /* exact ties */
            default: u = bits_of(ref[u & 0xffffu]) + (uint32_t)(u % 3) - 1u; break;  /* halves and neighbours */
            }
            src[i] = float_of(u);
        }
        kvc__f16_from_f32_f16c(src, back, 65536);
        for (i = 0; i < 65536; ++i) {
            uint16_t want = kvc__f32_to_f16(src[i]);
            int nan = (want & 0x7c00u) == 0x7c00u && (want & 0x3ffu);
            if (nan) bad += !((back[i] & 0x7c00u) == 0x7c00u && (back[i] & 0x3ffu));
            else bad += back[i] != want;
        }
    }
    TK_EQ(bad, 0);
    /* odd lengths use the scalar tail */
    kvc__f16_from_f32_f16c(src, back, 13);
    for (i = 0; i < 13; ++i) TK_EQ(back[i], kvc__f32_to_f16(src[i]) | 0);
}
#endif

/* the same random batches in two pools, one without the CPU paths: identical bits */
static void test_pools_agree(tk_rng *rng) {
    kvc_pool_config cfg;
    kvc_pool *p[2];
    kvc_cache *c[2];
    kvc_cache_config cc;
    kvc_pool_stats st;
    static float k[64 * 4 * 24], v[64 * 4 * 24], q[64 * 8 * 24], out[2][64 * 8 * 24], gk[2][128 * 4 * 24], gv[2][128 * 4 * 24];
    int32_t n[2], i, j, b, l;
    kvc_pool_config_init(&cfg);
    cfg.n_layers = 2; cfg.n_kv_heads = 4; cfg.head_dim_k = 24; cfg.head_dim_v = 20;
    cfg.type_k = cfg.type_v = KVC_TYPE_F16;
    cfg.page_cells = 7;
    cfg.budget_bytes = 1 << 22;
    kvc_cache_config_init(&cc, KVC_KIND_FULL);
    for (i = 0; i < 2; ++i) {
        cfg.cpu_disable = i ? ~0u : 0u;
        TK_OK(kvc_pool_create(&cfg, &p[i]));
        TK_OK(kvc_cache_create(p[i], &cc, &c[i]));
    }
    TK_OK(kvc_pool_stats_get(p[1], &st));
    TK_EQ(st.cpu_features, 0);
    for (b = 0; b < 6; ++b) {
        int32_t len = tk_int(rng, 1, 23);
        for (i = 0; i < 2; ++i) TK_OK(kvc_begin(c[i], len));
        for (l = 0; l < 2; ++l) {
            for (j = 0; j < len * 4 * 24; ++j) k[j] = tk_float(rng) * 8.0f;
            for (j = 0; j < len * 4 * 20; ++j) v[j] = tk_float(rng) * (b == 3 ? 1e-5f : 1.0f); /* subnormal halves */
            for (i = 0; i < 2; ++i) TK_OK(kvc_put(c[i], l, k, v));
        }
    }
    for (l = 0; l < 2; ++l) {
        kvc_attention_desc d;
        for (i = 0; i < 2; ++i) TK_OK(kvc_cache_gather(c[i], l, gk[i], gv[i], NULL, 128, &n[i]));
        TK_EQ(n[0], n[1]);
        TK_CHECK(memcmp(gk[0], gk[1], sizeof(float) * (size_t)n[0] * 4 * 24) == 0);
        TK_CHECK(memcmp(gv[0], gv[1], sizeof(float) * (size_t)n[0] * 4 * 20) == 0);
        memset(&d, 0, sizeof(d));
        for (j = 0; j < 5 * 8 * 24; ++j) q[j] = tk_float(rng);
        d.n_queries = 5; d.n_heads = 8; d.q = q;
        for (i = 0; i < 2; ++i) { d.out = out[i]; TK_OK(kvc_attention(c[i], l, &d)); }
        TK_CHECK(memcmp(out[0], out[1], sizeof(float) * 5 * 8 * 20) == 0);
    }
    for (i = 0; i < 2; ++i) { TK_OK(kvc_cache_destroy(c[i])); TK_OK(kvc_pool_destroy(p[i])); }
}

int main(int argc, char **argv) {
    tk_rng rng;
    uint32_t f = 0;
    rng.s = argc > 1 ? strtoull(argv[1], NULL, 10) : (unsigned long long)time(NULL) * 2654435761ull;
    printf("seed %llu\n", rng.s);
    TK_OK(kvc_cpu_features(&f));
    TK_RES(kvc_cpu_features(NULL), KVC_ERR_NULL);
    printf("cpu features: %s\n", (f & KVC_CPU_F16C) ? "f16c" : "none (scalar only)");
#ifdef KVC__X86
    if (f & KVC_CPU_F16C) test_f16c_conversions(&rng);
#endif
    test_pools_agree(&rng);
    return tk_report("kernels");
}
