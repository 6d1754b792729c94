/* tk.h - the tiny test kit shared by the test programs (include it after kvcache.h).
   Each program counts its checks and ends by printing one line
       RESULT <name> <passed> <failed>
   which tests/run.sh sums into the suite's final "N passed, N failed" line. */
#ifndef TK_H
#define TK_H
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__GNUC__) || defined(__clang__)
#define TK_UNUSED __attribute__((unused))
#else
#define TK_UNUSED
#endif

static int tk_passed, tk_failed;

#define TK_CHECK(cond)                                                                  \
    do {                                                                                \
        if (cond) tk_passed++;                                                          \
        else { tk_failed++; fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); } \
    } while (0)

/* an integer comparison that prints both sides when it fails */
#define TK_EQ(a, b)                                                                     \
    do {                                                                                \
        long long tk_a_ = (long long)(a), tk_b_ = (long long)(b);                       \
        if (tk_a_ == tk_b_) tk_passed++;                                                \
        else { tk_failed++; fprintf(stderr, "%s:%d: %s == %s failed: %lld != %lld\n", __FILE__, __LINE__, #a, #b, tk_a_, tk_b_); } \
    } while (0)

/* a call that must return the given kvc_result */
#define TK_RES(expr, want)                                                              \
    do {                                                                                \
        int tk_r_ = (int)(expr);                                                        \
        if (tk_r_ == (int)(want)) tk_passed++;                                          \
        else { tk_failed++; fprintf(stderr, "%s:%d: %s returned %d (%s), wanted %d\n", __FILE__, __LINE__, #expr, tk_r_, kvc_strerror((kvc_result)tk_r_), (int)(want)); } \
    } while (0)
#define TK_OK(expr) TK_RES(expr, KVC_OK)

/* |a-b| <= tol, printing both */
#define TK_NEAR(a, b, tol)                                                              \
    do {                                                                                \
        double tk_x_ = (double)(a), tk_y_ = (double)(b);                                \
        if (fabs(tk_x_ - tk_y_) <= (tol)) tk_passed++;                                   \
        else { tk_failed++; fprintf(stderr, "%s:%d: |%s - %s| = |%g - %g| > %g\n", __FILE__, __LINE__, #a, #b, tk_x_, tk_y_, (double)(tol)); } \
    } while (0)

/* kvcache.h's KVC__MIN/KVC__MAX are private: a test that names them gets the whole
   library in its unit (tests/unit.sh) */
#define TK_MIN(a, b) ((a) < (b) ? (a) : (b))
#define TK_MAX(a, b) ((a) > (b) ? (a) : (b))

TK_UNUSED static int tk_report(const char *name) {
    printf("RESULT %s %d %d\n", name, tk_passed, tk_failed);
    return tk_failed ? 1 : 0;
}

/* deterministic xorshift random numbers; the random seed comes from the command line or the clock */
typedef struct tk_rng { unsigned long long s; } tk_rng;
TK_UNUSED static unsigned long long tk_next(tk_rng *r) {
    unsigned long long x = r->s ? r->s : 0x9e3779b97f4a7c15ull;
    x ^= x << 13; x ^= x >> 7; x ^= x << 17;
    return r->s = x;
}
TK_UNUSED static int tk_int(tk_rng *r, int lo, int hi) { /* [lo, hi] */
    return lo + (int)(tk_next(r) % (unsigned long long)(hi - lo + 1));
}
TK_UNUSED static float tk_float(tk_rng *r) { /* [-1, 1) */
    return (float)((double)(tk_next(r) >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

TK_UNUSED static int tk_pct(tk_rng *r, int percent) { return tk_int(r, 0, 99) < percent; }
/* n values uniform in [-amp, amp) */
TK_UNUSED static void tk_fill(tk_rng *r, float *x, size_t n, float amp) {
    size_t i;
    for (i = 0; i < n; ++i) x[i] = tk_float(r) * amp;
}

/* The attention paths this CPU and build have, as kvc_pool_config.runtime.cpu_disable masks, and
   their names; [0] is scalar. Returns how many. */
TK_UNUSED static int tk_cpu_paths(uint32_t *disable, const char **names) {
    uint32_t f = 0;
    int n = 0;
    kvc_cpu_features(&f);
    disable[n] = ~0u; names[n++] = "scalar";
    if (f & KVC_CPU_SSE2) { disable[n] = ~(uint32_t)KVC_CPU_SSE2; names[n++] = "sse2"; }
    if (f & KVC_CPU_AVX2) { disable[n] = KVC_CPU_AVX512; names[n++] = "avx2"; }
    if (f & KVC_CPU_AVX512) { disable[n] = KVC_CPU_AVX512_VNNI; names[n++] = "avx512"; }
    if (f & KVC_CPU_AVX512_VNNI) { disable[n] = 0; names[n++] = "avx512-vnni"; }
    if (f & KVC_CPU_NEON) { disable[n] = KVC_CPU_NEON_DOTPROD; names[n++] = "neon"; }
    if (f & KVC_CPU_NEON_DOTPROD) { disable[n] = 0; names[n++] = "neon-dotprod"; }
    return n;
}

/* Test scale: KVC_TEST_SCALE=0.1 under valgrind, 1 by default. */
TK_UNUSED static double tk_scale(void) {
    const char *s = getenv("KVC_TEST_SCALE");
    double v = s ? atof(s) : 1.0;
    return v > 0 ? v : 1.0;
}
/* n scaled by KVC_TEST_SCALE, at least 1 */
TK_UNUSED static int tk_scaled(int n) {
    int v = (int)(n * tk_scale() + 0.5);
    return v > 0 ? v : 1;
}
#endif
