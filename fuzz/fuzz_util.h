/* fuzz_util.h - what the fuzz targets share: reading the input bytes, the ring of the
   last steps a failure prints, the checks that print and abort (a crash for libFuzzer;
   fuzz/fuzz_replay.c names the input to replay).

   tests/run.sh compiles every target into one translation unit (the generated
   fuzz_all.c), so this header has a guard, defines each helper once, and has no state
   of its own beyond the failure log (one target runs per process). The helpers are
   static inline so that a target built alone may leave some unused without a warning.
   Include after kvcache.h. FUZZ_LOG_LINES (default 24) sets how many steps a failure
   prints. */
#ifndef KVC_FUZZ_UTIL_H
#define KVC_FUZZ_UTIL_H

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#ifndef FUZZ_LOG_LINES
#define FUZZ_LOG_LINES 24
#endif
#define FUZZ_LOG_WIDTH 160

/* ---- the input ------------------------------------------------------------------------ */
typedef struct fuzz_in {
    const uint8_t *p;
    size_t n, i;
} fuzz_in;

/* the next byte; a missing byte reads as 0, so every input decodes */
static inline unsigned fuzz_byte(fuzz_in *in) { return in->i < in->n ? in->p[in->i++] : 0u; }

/* [lo, hi] from one byte; lo >= hi reads no byte and gives lo */
static inline int32_t fuzz_int(fuzz_in *in, int32_t lo, int32_t hi) {
    return lo >= hi ? lo : lo + (int32_t)(fuzz_byte(in) % (unsigned)(hi - lo + 1));
}

static inline int32_t fuzz_min(int32_t a, int32_t b) { return a < b ? a : b; }
static inline int32_t fuzz_max(int32_t a, int32_t b) { return a > b ? a : b; }

/* ---- the last steps, printed by a failure ---------------------------------------------- */
static char fuzz_log[FUZZ_LOG_LINES][FUZZ_LOG_WIDTH];
static int fuzz_nlog, fuzz_step; /* fuzz_step: the target's step counter, shown in each line */

static inline void fuzz_log_reset(void) { fuzz_nlog = fuzz_step = 0; }

/* note what a step is about to do (before the call, so a crash in it is named too) */
static inline void fuzz_note(const char *fmt, ...) {
    va_list ap;
    char *dst = fuzz_log[fuzz_nlog++ % FUZZ_LOG_LINES];
    int n = snprintf(dst, FUZZ_LOG_WIDTH, "step %d: ", fuzz_step);
    va_start(ap, fmt);
    if (n > 0 && n < FUZZ_LOG_WIDTH) vsnprintf(dst + n, (size_t)(FUZZ_LOG_WIDTH - n), fmt, ap);
    va_end(ap);
}

static inline void fuzz_fail(const char *file, int line, const char *fmt, ...) {
    va_list ap;
    int i;
    fprintf(stderr, "%s:%d: ", file, line);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\nlast steps:\n");
    for (i = fuzz_nlog > FUZZ_LOG_LINES ? fuzz_nlog - FUZZ_LOG_LINES : 0; i < fuzz_nlog; ++i)
        fprintf(stderr, "  %s\n", fuzz_log[i % FUZZ_LOG_LINES]);
    abort();
}

#define FUZZ_CHECK(cond, ...) do { if (!(cond)) fuzz_fail(__FILE__, __LINE__, __VA_ARGS__); } while (0)
#define FUZZ_RES(expr, want)                                                                    \
    do {                                                                                        \
        int fuzz_r_ = (int)(expr), fuzz_w_ = (int)(want);                                       \
        FUZZ_CHECK(fuzz_r_ == fuzz_w_, "%s returned %d (%s), wanted %d", #expr, fuzz_r_,        \
                   kvc_strerror((kvc_result)fuzz_r_), fuzz_w_);                                 \
    } while (0)

#endif /* KVC_FUZZ_UTIL_H */
