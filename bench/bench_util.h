/* bench_util.h - what the benchmarks share: a monotonic clock, medians, a check that
   exits on a library error, and a parser for comma-separated option lists.

   Include after kvcache.h, with _POSIX_C_SOURCE (199309L or later) defined before the
   first system header so that clock_gettime is declared. The helpers are static inline
   so that a benchmark may leave some unused without a warning. */
#ifndef KVC_BENCH_UTIL_H
#define KVC_BENCH_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

/* exit(1) with the call, its place and the library's message when it did not succeed */
#define CHECK(call)                                                                              \
    do {                                                                                         \
        kvc_result r_ = (call);                                                                  \
        if (r_ != KVC_OK) {                                                                      \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, kvc_strerror(r_));      \
            exit(1);                                                                             \
        }                                                                                        \
    } while (0)

/* seconds on the monotonic clock */
static inline double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* the median of t[0..n) (n >= 1; the mean of the middle two when n is even); sorts t */
static inline double median(double *t, int n) {
    qsort(t, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

/* "4096,32768" -> out[0..n): up to max integers; returns n */
static inline int parse_list(const char *s, int32_t *out, int max) {
    int n = 0;
    while (*s && n < max) {
        out[n++] = (int32_t)strtol(s, (char **)&s, 10);
        if (*s == ',') s++;
    }
    return n;
}

#endif /* KVC_BENCH_UTIL_H */
