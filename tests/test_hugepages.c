/* test_hugepages.c - the pool's memory gets no transparent-huge-page advice by default.

   MADV_HUGEPAGE on the cache's slab made an adopter's own weight matmuls erratically
   3-41 % slower (issue 35), so kvcache.h advises it only with KVCACHE_HUGE_PAGES. On
   Linux a pool is created with the library's own allocator (malloc), a token is put in
   its first and last layer, and every mapping of /proc/self/smaps between those rows
   (the slab) must lack the "hg" VmFlag (advised MADV_HUGEPAGE). Built with
   -DKVCACHE_HUGE_PAGES, the same mappings must have it where the slab covers a 2 MiB-
   aligned range (the opt-in still works). _DEFAULT_SOURCE makes <sys/mman.h> declare
   MADV_HUGEPAGE under -std=c99, as gcc's default gnu modes do for adopters. Elsewhere
   than Linux it checks nothing. `test_hugepages SEED` (the seed is not used). */
#define _DEFAULT_SOURCE
#include <stdio.h>
#include <stdlib.h>

#define KVCACHE_IMPLEMENTATION
#include "../kvcache.h"
#include "tk.h"

#ifdef __linux__
/* Whether the mappings overlapping [lo, hi] are advised MADV_HUGEPAGE: 1 all, 0 none,
   -1 mixed or unreadable; *n the number of mappings seen. */
static int advised_huge(uintptr_t lo, uintptr_t hi, int *n) {
    char line[512];
    unsigned long start = 0, end = 0;
    int inside = 0, with = 0, without = 0;
    FILE *f = fopen("/proc/self/smaps", "r");
    *n = 0;
    if (!f) return -1;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "%lx-%lx ", &start, &end) == 2 && strchr(line, '-') < strchr(line, ' ')) {
            inside = start <= hi && end > lo;
            continue;
        }
        if (inside && !strncmp(line, "VmFlags:", 8)) {
            ++*n;
            if (strstr(line, " hg")) ++with;
            else ++without;
        }
    }
    fclose(f);
    return *n == 0 ? -1 : with == 0 ? 0 : without == 0 ? 1 : -1;
}
#endif

int main(int argc, char **argv) {
#ifdef __linux__
    enum { LAYERS = 4, HEADS = 4, DIM = 128 };
    static float row[HEADS * DIM];
    kvc_pool_config pc;
    kvc_cache_config cc;
    kvc_pool *pool = NULL;
    kvc_cache *cache = NULL;
    kvc_run first, last;
    int32_t n_runs = 0;
    int n = 0, advised;
    (void)argc, (void)argv;
    TK_OK(kvc_pool_config_init(&pc));
    pc.n_layers = LAYERS;
    pc.n_kv_heads = HEADS;
    pc.head_dim_k = pc.head_dim_v = DIM;
    pc.budget_bytes = (size_t)16 << 20; /* 16 MiB: a malloc of its own (mmap), 2 MiB-aligned parts */
    TK_OK(kvc_pool_create(&pc, &pool));
    memset(&cc, 0, sizeof cc);
    cc.kind = KVC_KIND_FULL;
    TK_OK(kvc_cache_create(pool, &cc, &cache));
    TK_OK(kvc_begin(cache, 1, NULL, 0));
    for (int l = 0; l < LAYERS; ++l) TK_OK(kvc_put(cache, l, row, row));
    TK_OK(kvc_cache_runs(cache, 0, &first, 1, &n_runs));
    TK_OK(kvc_cache_runs(cache, LAYERS - 1, &last, 1, &n_runs));
    advised = advised_huge((uintptr_t)first.k, (uintptr_t)last.v, &n);
    printf("slab %p..%p: %d mapping(s), advised MADV_HUGEPAGE: %s\n", first.k, last.v, n,
           advised == 1 ? "all" : advised == 0 ? "none" : "mixed or unknown");
#if defined(KVCACHE_HUGE_PAGES) && defined(MADV_HUGEPAGE)
    TK_CHECK(n >= 1 && advised != 0); /* the opt-in: the aligned part (a mapping of its own) is */
#else
    TK_EQ(advised, 0); /* the default: the host's memory policy is left alone */
#endif
    TK_OK(kvc_cache_destroy(cache));
    TK_OK(kvc_pool_destroy(pool));
#else
    (void)argc, (void)argv;
#endif
    return tk_report("hugepages");
}
