/* count_alloc.h - every allocation kvcache.h makes goes through tk_count_malloc and
   tk_count_free, so a test can count them (arena mode must make none, a teardown must
   free all) and make the N-th one fail (tk_fail_after: 0 fails the next, -1 none).

   A program includes this before kvcache.h and gets the definitions. It then compiles
   only kvcache.h's API and links the library object built with these macros
   ("lib-count_alloc", tests/unit.sh), which includes this with
   TK_COUNT_ALLOC_DECLARE_ONLY: the library's calls reach the program's counters. */
#ifndef TK_COUNT_ALLOC_H
#define TK_COUNT_ALLOC_H
#include <stdlib.h>

extern long tk_allocs, tk_frees, tk_fail_after;
void *tk_count_malloc(size_t n);
void tk_count_free(void *p);
#define KVCACHE_MALLOC(sz, user) ((void)(user), tk_count_malloc(sz))
#define KVCACHE_FREE(p, user) ((void)(user), tk_count_free(p))

#ifndef TK_COUNT_ALLOC_DECLARE_ONLY
long tk_allocs, tk_frees, tk_fail_after = -1;
void *tk_count_malloc(size_t n) {
    if (tk_fail_after == 0) return NULL;
    if (tk_fail_after > 0) tk_fail_after--;
    tk_allocs++;
    return malloc(n);
}
void tk_count_free(void *p) {
    if (p != NULL) tk_frees++;
    free(p);
}
#endif
#endif
