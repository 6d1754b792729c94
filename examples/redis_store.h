/* redis_store.h - a kvc_store over Redis (hiredis): what an engine copies.

   Blobs live under "kvc:<key hex>" (SET, STRLEN, GET, DEL). Every call ends within the
   tier's timeout_ms (plus scheduling slack): it is the deadline of the connect and the
   socket's timeout, and a connection found broken is retried once in what is left of it
   (a server restarted between calls costs nothing; one that hangs costs one timeout, no
   retry). With the tier making no more store calls after a failing one until the next
   fetch (kvcache.h), a server that dies or hangs costs a request at most about one
   timeout and then a recompute, never a wrong answer. A program using it must ignore
   SIGPIPE, or a write to a server that died ends it; it needs _POSIX_C_SOURCE 199309L or
   later defined before the first system header (clock_gettime).

   Include after kvcache.h; link with -lhiredis. Used by examples/redis_store.c and by
   examples/tinylm.c built with -DTINYLM_REDIS (its --share-* options).
     redis_store rs; kvc_store store;
     redis_store_open(&rs, "127.0.0.1", 6379, &store);   (connects on the first call)
     ... cfg.store = store; kvc_tier_attach(tree, &cfg); ... kvc_radix_destroy(tree);
     redis_store_close(&rs); */
#ifndef REDIS_STORE_H
#define REDIS_STORE_H

#include <hiredis/hiredis.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

typedef struct redis_store {
    redisContext *ctx;
    char host[256];
    int port;
} redis_store;

static struct timeval tv_of(int32_t ms) {
    struct timeval tv;
    if (ms <= 0) ms = 1000;
    tv.tv_sec = ms / 1000;
    tv.tv_usec = (ms % 1000) * 1000;
    return tv;
}

static double redis_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return 1e3 * (double)ts.tv_sec + 1e-6 * (double)ts.tv_nsec;
}

/* A live connection whose socket times out at `end` (ms on redis_now_ms's clock),
   connecting afresh (by then) if the last one broke; 0 when none or no time is left. */
static int redis_ready(redis_store *s, double end) {
    int32_t left = (int32_t)(end - redis_now_ms());
    if (left <= 0) return 0;
    if (s->ctx == NULL || s->ctx->err != 0) {
        if (s->ctx != NULL) redisFree(s->ctx);
        s->ctx = redisConnectWithTimeout(s->host, s->port, tv_of(left));
        if (s->ctx == NULL || s->ctx->err) return 0;
        if ((left = (int32_t)(end - redis_now_ms())) <= 0) return 0;
    }
    redisSetTimeout(s->ctx, tv_of(left));
    return 1;
}

/* One command, all of it within ms (a connection found broken is retried once in what
   is left); NULL (and a dropped connection) on any transport error or timeout. */
static redisReply *redis_call(redis_store *s, int32_t ms, const char *fmt, const void *a, size_t na, const void *b,
                              size_t nb) {
    const double end = redis_now_ms() + (ms > 0 ? ms : 1000);
    redisReply *r;
    int attempt;
    for (attempt = 0; attempt < 2; ++attempt) {
        if (!redis_ready(s, end)) continue;
        r = (redisReply *)(b != NULL ? redisCommand(s->ctx, fmt, a, na, b, nb) : redisCommand(s->ctx, fmt, a, na));
        if (r != NULL) return r;
    }
    return NULL;
}

static void key_name(const kvc_key *key, char name[70]) {
    memcpy(name, "kvc:", 4);
    kvc_key_hex(key, name + 4);
}

static kvc_result redis_put(void *user, const kvc_key *key, const void *data, size_t size, int32_t ms) {
    char name[70];
    redisReply *r;
    kvc_result res;
    key_name(key, name);
    r = redis_call((redis_store *)user, ms, "SET %b %b", name, strlen(name), data, size);
    if (r == NULL) return KVC_ERR_IO;
    res = r->type == REDIS_REPLY_STATUS ? KVC_OK : KVC_ERR_IO;
    freeReplyObject(r);
    return res;
}

static kvc_result redis_exists(void *user, const kvc_key *key, size_t *size, int32_t ms) {
    char name[70];
    redisReply *r;
    kvc_result res = KVC_ERR_IO;
    key_name(key, name);
    r = redis_call((redis_store *)user, ms, "STRLEN %b", name, strlen(name), NULL, 0);
    if (r == NULL) return KVC_ERR_IO;
    if (r->type == REDIS_REPLY_INTEGER) {
        res = r->integer > 0 ? KVC_OK : KVC_ERR_NOT_FOUND; /* a missing key has length 0 */
        *size = (size_t)r->integer;
    }
    freeReplyObject(r);
    return res;
}

static kvc_result redis_get(void *user, const kvc_key *key, void *data, size_t capacity, size_t *size, int32_t ms) {
    char name[70];
    redisReply *r;
    kvc_result res = KVC_ERR_IO;
    key_name(key, name);
    r = redis_call((redis_store *)user, ms, "GET %b", name, strlen(name), NULL, 0);
    if (r == NULL) return KVC_ERR_IO;
    if (r->type == REDIS_REPLY_NIL) res = KVC_ERR_NOT_FOUND;
    else if (r->type == REDIS_REPLY_STRING) {
        *size = r->len;
        if (r->len > capacity) res = KVC_ERR_RANGE;
        else {
            memcpy(data, r->str, r->len);
            res = KVC_OK;
        }
    }
    freeReplyObject(r);
    return res;
}

static kvc_result redis_erase(void *user, const kvc_key *key, int32_t ms) {
    char name[70];
    redisReply *r;
    key_name(key, name);
    r = redis_call((redis_store *)user, ms, "DEL %b", name, strlen(name), NULL, 0);
    if (r == NULL) return KVC_ERR_IO;
    freeReplyObject(r);
    return KVC_OK;
}

/* The store over host:port (connected lazily, on the first call). */
static void redis_store_open(redis_store *s, const char *host, int port, kvc_store *store) {
    memset(s, 0, sizeof(*s));
    snprintf(s->host, sizeof(s->host), "%s", host);
    s->port = port;
    memset(store, 0, sizeof(*store));
    store->put = redis_put;
    store->exists = redis_exists;
    store->get = redis_get;
    store->erase = redis_erase;
    store->user = s;
}
static void redis_store_close(redis_store *s) {
    if (s->ctx != NULL) redisFree(s->ctx);
    s->ctx = NULL;
}

#endif
