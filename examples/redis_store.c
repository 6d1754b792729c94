/* redis_store.c - a kvc_store over Redis (hiredis), and a program that shares a long system
   prompt between processes through it.

   The adapter (redis_store_open / redis_store_close, the four callbacks) is
   examples/redis_store.h, what an engine copies (the timeouts it keeps: there). The
   program must ignore SIGPIPE (as main does), or a write to a server that died ends it.

   The program is a toy engine over one pool and radix tree with tiers: a "model" whose K/V
   for the token at position p is an exact function of tokens[0 .. p] (as a real model's),
   so every cache can be checked bit for bit against evaluating its tokens.
     redis_store --port P write [--type f16|f32]
         evaluates the system prompt (+ a question), commits and publishes it to Redis;
         prints "key <hex> tokens <n>".
     redis_store --port P read [--turns N] [--pause-ms MS] [--expect-reuse N] [--max-fetch-ms MS]
         per turn: a fresh question after the same system prompt; fetches the prefix from
         Redis (nothing in the pool: every turn evicts everything), evaluates the rest and
         checks every cell against the reference; prints per turn "turn i reused n fetch
         T ms" and at the end "from-redis A recomputed B refused R store-errors E
         fetch-ms-max T wrong 0". Exit 1 on a wrong cell, a reuse other than expected or
         a fetch (kvc_tier_fetch's wall time; the tier's timeout is 300 ms) over MS.
     redis_store --port P bench [--turns REPS]
         bench/bench_tiers.c's shape (4 layers x 8 kv heads x 128, f16): a 4k and a 32k
         prefix evicted to Redis and fetched back, medians (docs/performance.md).
   Build (needs libhiredis-dev):
     cc -std=c99 -O2 -I. examples/redis_store.c -o build/redis_store -lm -lhiredis
   tests/redis_tiers.sh starts redis-server on 127.0.0.1 (a free port, a temporary
   directory) and runs the scenarios: two processes, a killed server, damaged and foreign
   blobs. */
#define _POSIX_C_SOURCE 200809L
#define KVCACHE_IMPLEMENTATION
#include "kvcache.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "redis_store.h"

/* ---- the toy engine ------------------------------------------------------------------- */

#define LAYERS 4
#define HEADS 2
#define HD 64
#define PAGE 16
#define SYS 1000 /* system prompt tokens: 62 whole blocks of 16 */
#define QUESTION 24
#define MAXT (SYS + QUESTION)

static const kvc_namespace NS = {0x70796d6f64656c31ull, 0}; /* the model's id */

static uint32_t prefix_hash(const int32_t *tokens, int32_t p) {
    uint32_t h = 2166136261u;
    int32_t i;
    for (i = 0; i <= p; ++i) h = (h ^ (uint32_t)tokens[i]) * 16777619u;
    return h;
}
static float kv_value(uint32_t h, int kv, int layer, int i) {
    return (float)((int32_t)((h + (uint32_t)(kv * 523 + layer * 131 + i * 3)) % 512u) - 256) / 8.0f;
}

/* evaluate tokens[from, to): the K/V the model gives */
static kvc_result evaluate(kvc_cache *c, const int32_t *tokens, int32_t from, int32_t to) {
    static float k[MAXT * HEADS * HD], v[MAXT * HEADS * HD];
    int32_t l, p, i;
    kvc_result r;
    if (to <= from) return KVC_OK;
    if ((r = kvc_begin(c, to - from, NULL, 0)) != KVC_OK) return r;
    for (l = 0; l < LAYERS; ++l) {
        for (p = from; p < to; ++p)
            for (i = 0; i < HEADS * HD; ++i) {
                k[(p - from) * HEADS * HD + i] = kv_value(prefix_hash(tokens, p), 0, l, i);
                v[(p - from) * HEADS * HD + i] = kv_value(prefix_hash(tokens, p), 1, l, i);
            }
        if ((r = kvc_put(c, l, k, v)) != KVC_OK) return r;
    }
    return KVC_OK;
}

/* cells of c whose K/V differ from the reference (values are exact in f16 and f32) */
static int wrong_cells(const kvc_cache *c, const int32_t *tokens) {
    static float k[MAXT * HEADS * HD], v[MAXT * HEADS * HD];
    static int32_t pos[MAXT];
    int32_t l, n = 0, j, i, bad = 0;
    for (l = 0; l < LAYERS; ++l) {
        if (kvc_cache_gather(c, l, k, v, pos, MAXT, &n) != KVC_OK) return -1;
        for (j = 0; j < n; ++j)
            for (i = 0; i < HEADS * HD; ++i)
                if (k[j * HEADS * HD + i] != kv_value(prefix_hash(tokens, pos[j]), 0, l, i) ||
                    v[j * HEADS * HD + i] != kv_value(prefix_hash(tokens, pos[j]), 1, l, i)) {
                    bad++;
                    break;
                }
    }
    return bad;
}

static void prompt(int32_t *tokens, int32_t question) {
    int32_t i;
    for (i = 0; i < SYS; ++i) tokens[i] = (i * 7919 + 13) % 32000; /* the shared system prompt */
    for (i = 0; i < QUESTION; ++i) tokens[SYS + i] = (int32_t)(((uint32_t)question * 131u + (uint32_t)i * 17u) % 32000u);
}

static void sleep_ms(int ms) {
    struct timespec ts;
    ts.tv_sec = ms / 1000;
    ts.tv_nsec = (long)(ms % 1000) * 1000000L;
    nanosleep(&ts, NULL);
}

#define TRY(call)                                                                     \
    do {                                                                              \
        kvc_result r_ = (call);                                                       \
        if (r_ != KVC_OK) {                                                           \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, kvc_strerror(r_)); \
            exit(1);                                                                  \
        }                                                                             \
    } while (0)

/* ---- bench: time to a ready cache from Redis on the bench_tiers shape --------------- */
/* 4 layers x 8 kv heads x head dim 128, f16, 256 cells per page (bench/bench_tiers.c's):
   the prefix committed and published, then per rep evicted (nothing in the pool, no host
   tier) and brought back by kvc_tier_fetch from Redis + kvc_radix_lookup; medians. */
static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void bench(const char *host, int port, int32_t n, int reps) {
    kvc_pool_config pc;
    kvc_pool *pool;
    kvc_radix_config rc;
    kvc_radix *tree;
    kvc_tier_config tc;
    redis_store rs;
    kvc_cache *c;
    kvc_key key;
    size_t size = 0, i;
    int32_t *tok = (int32_t *)malloc(sizeof(int32_t) * ((size_t)n + 1)), j, got = 0, reused = 0, done, l;
    float *k = (float *)malloc(sizeof(float) * 512 * 8 * 128), *v = (float *)malloc(sizeof(float) * 512 * 8 * 128);
    double t[64], t0;
    int r;
    for (i = 0; i < (size_t)512 * 8 * 128; ++i) k[i] = v[i] = (float)(i % 2001) / 1000.0f - 1.0f;
    for (j = 0; j <= n; ++j) tok[j] = (j * 7919 + n) % 50000;
    kvc_pool_config_init(&pc);
    pc.n_layers = 4;
    pc.n_kv_heads = 8;
    pc.head_dim_k = pc.head_dim_v = 128;
    pc.type_k = pc.type_v = KVC_TYPE_F16;
    pc.page_cells = 256;
    TRY(kvc_pool_budget_for_tokens(&pc, n + 512, &pc.budget_bytes));
    TRY(kvc_pool_create(&pc, &pool));
    kvc_radix_config_init(&rc, KVC_KIND_FULL);
    TRY(kvc_radix_create(pool, &rc, &tree));
    kvc_tier_config_init(&tc);
    tc.timeout_ms = 10000;
    redis_store_open(&rs, host, port, &tc.store);
    TRY(kvc_tier_attach(tree, &tc));
    TRY(kvc_radix_lookup(tree, NS, tok, n, &c, &reused));
    for (done = 0; done < n; done += 512) {
        TRY(kvc_begin(c, n - done < 512 ? n - done : 512, NULL, 0));
        for (l = 0; l < 4; ++l) TRY(kvc_put(c, l, k, v));
    }
    TRY(kvc_radix_commit(tree, NS, c, tok, n, 0));
    TRY(kvc_cache_destroy(c));
    if (reps > 64) reps = 64;
    for (r = 0; r < reps; ++r) {
        TRY(kvc_radix_evict(tree, 1 << 30, NULL)); /* down to Redis */
        t0 = now_s();
        TRY(kvc_tier_fetch(tree, NS, tok, n + 1, &got));
        TRY(kvc_radix_lookup(tree, NS, tok, n + 1, &c, &reused));
        t[r] = now_s() - t0;
        TRY(kvc_cache_destroy(c));
        if (got != n || reused != n) {
            fprintf(stderr, "fetched %d, reused %d of %d\n", (int)got, (int)reused, (int)n);
            exit(1);
        }
    }
    qsort(t, (size_t)reps, sizeof(double), cmp_double);
    TRY(kvc_tier_key(tree, NS, tok, n, &key));
    TRY(tc.store.exists(tc.store.user, &key, &size, 1000));
    printf("redis (127.0.0.1): kvc_tier_fetch + lookup of %d tokens: median %.2f ms of %d, %.0f bytes/token\n",
           (int)n, 1e3 * t[reps / 2], reps, (double)size / n);
    tc.store.erase(tc.store.user, &key, 1000);
    TRY(kvc_radix_destroy(tree));
    TRY(kvc_pool_destroy(pool));
    redis_store_close(&rs);
    free(tok);
    free(k);
    free(v);
}

int main(int argc, char **argv) {
    const char *host = "127.0.0.1", *role = NULL;
    int port = 6379, turns = 1, pause_ms = 0, expect = -1, a, t, from_redis = 0, recomputed = 0, wrong = 0;
    double max_fetch_ms = -1, fetch_ms, fetch_ms_max = 0;
    kvc_type type = KVC_TYPE_F16;
    kvc_pool_config pc;
    kvc_pool *pool;
    kvc_radix_config rc;
    kvc_radix *tree;
    kvc_tier_config tc;
    kvc_tier_stats ts;
    redis_store rs;
    kvc_cache *c;
    int32_t tokens[MAXT], got, reused;
    int32_t base = 1 + (int32_t)(((unsigned long)getpid() * 7919u + (unsigned long)time(NULL)) % 400000u) * 64;
    for (a = 1; a < argc; ++a) {
        if (!strcmp(argv[a], "--port") && a + 1 < argc) port = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--host") && a + 1 < argc) host = argv[++a];
        else if (!strcmp(argv[a], "--turns") && a + 1 < argc) turns = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--pause-ms") && a + 1 < argc) pause_ms = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--expect-reuse") && a + 1 < argc) expect = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--max-fetch-ms") && a + 1 < argc) max_fetch_ms = atof(argv[++a]);
        else if (!strcmp(argv[a], "--type") && a + 1 < argc) type = !strcmp(argv[++a], "f32") ? KVC_TYPE_F32 : KVC_TYPE_F16;
        else if (!strcmp(argv[a], "write") || !strcmp(argv[a], "read") || !strcmp(argv[a], "bench")) role = argv[a];
        else role = NULL, a = argc;
    }
    /* a write to a server that died raises SIGPIPE, which would end the engine: the
       adapter wants the write's error instead (any program using hiredis does this) */
    signal(SIGPIPE, SIG_IGN);
    if (role == NULL) {
        fprintf(stderr, "usage: %s [--host H] [--port P] write [--type f16|f32] | read [--turns N] "
                        "[--pause-ms MS] [--expect-reuse N] [--max-fetch-ms MS] | bench [--turns REPS]\n", argv[0]);
        return 2;
    }
    if (!strcmp(role, "bench")) {
        bench(host, port, 4096, turns > 1 ? turns : 5);
        bench(host, port, 32768, turns > 1 ? turns : 5);
        return 0;
    }
    kvc_pool_config_init(&pc);
    pc.n_layers = LAYERS;
    pc.n_kv_heads = HEADS;
    pc.head_dim_k = pc.head_dim_v = HD;
    pc.type_k = pc.type_v = type;
    pc.page_cells = PAGE;
    TRY(kvc_pool_budget_for_tokens(&pc, 4 * MAXT, &pc.budget_bytes));
    TRY(kvc_pool_create(&pc, &pool));
    kvc_radix_config_init(&rc, KVC_KIND_FULL);
    TRY(kvc_radix_create(pool, &rc, &tree));
    kvc_tier_config_init(&tc);
    tc.timeout_ms = 300;
    redis_store_open(&rs, host, port, &tc.store);
    TRY(kvc_tier_attach(tree, &tc));

    if (!strcmp(role, "write")) {
        kvc_key key;
        char hex[65];
        int32_t published = 0;
        prompt(tokens, 0);
        TRY(kvc_radix_lookup(tree, NS, tokens, MAXT, &c, &reused));
        TRY(evaluate(c, tokens, reused, MAXT));
        TRY(kvc_radix_commit(tree, NS, c, tokens, MAXT, 0));
        TRY(kvc_cache_destroy(c));
        TRY(kvc_tier_publish(tree, NS, tokens, SYS, &published));
        TRY(kvc_tier_key(tree, NS, tokens, published, &key));
        kvc_key_hex(&key, hex);
        printf("key %s tokens %d\n", hex, (int)published);
    } else {
        for (t = 0; t < turns; ++t) {
            prompt(tokens, base + t); /* a new question after the same system prompt */
            TRY(kvc_radix_evict(tree, 1 << 30, NULL)); /* nothing in the pool: Redis or recompute */
            fetch_ms = now_s();
            TRY(kvc_tier_fetch(tree, NS, tokens, MAXT, &got));
            fetch_ms = 1e3 * (now_s() - fetch_ms);
            if (fetch_ms > fetch_ms_max) fetch_ms_max = fetch_ms;
            if (max_fetch_ms >= 0 && fetch_ms > max_fetch_ms) {
                fprintf(stderr, "turn %d: the fetch took %.0f ms, more than %.0f\n", t, fetch_ms, max_fetch_ms);
                wrong++;
            }
            TRY(kvc_radix_lookup(tree, NS, tokens, MAXT, &c, &reused));
            if (got > 0) from_redis++;
            else recomputed++;
            TRY(evaluate(c, tokens, reused, MAXT));
            if (wrong_cells(c, tokens) != 0) wrong++;
            printf("turn %d reused %d fetch %.0f ms%s\n", t, (int)reused, fetch_ms, got > 0 ? " (from redis)" : "");
            fflush(stdout);
            if (expect >= 0 && reused != expect) {
                fprintf(stderr, "turn %d reused %d, expected %d\n", t, (int)reused, expect);
                wrong++;
            }
            TRY(kvc_radix_commit(tree, NS, c, tokens, MAXT, 0));
            TRY(kvc_cache_destroy(c));
            if (pause_ms > 0) sleep_ms(pause_ms);
        }
        TRY(kvc_tier_stats_get(tree, &ts));
        printf("from-redis %d recomputed %d refused %d store-errors %d fetch-ms-max %.0f wrong %d\n", from_redis,
               recomputed, (int)ts.refused, (int)ts.store_errors, fetch_ms_max, wrong);
    }
    kvc_radix_evict(tree, 1 << 30, NULL);
    TRY(kvc_radix_destroy(tree));
    TRY(kvc_pool_destroy(pool));
    redis_store_close(&rs);
    return wrong ? 1 : 0;
}
