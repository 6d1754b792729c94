/* savegame.c - a save game: an NPC's conversation saved to a file and continued by
   another process, on the GPU (kvcache_vk.h) when there is one, else on the CPU.

   Build (from the repository root):
       cc -std=c99 -O2 -Wall -Wextra -Wpedantic examples/savegame.c -o savegame -lm
   With the Vulkan headers installed the GPU path is built in (the loader is opened at run
   time, nothing more to link; -DSAVEGAME_CPU leaves it out) and used when a device is
   found (KVC_NO_VK=1 in the environment: the CPU anyway).

   The first process plays two turns of a conversation through a toy two-layer model
   whose keys and values live in a ROTATING cache (a window of 16 tokens after 2 sink
   tokens, so the window has wrapped), naming a checkpoint at the end of each turn, and
   saves the cache with the conversation's tokens (kvc_cache_save; the checkpoints go
   with it). Then it runs itself again with "--load FILE". The second process loads the
   file, plays turn 3 and checks it bit for bit against a run that never stopped; then it
   goes back to the checkpoint after turn 1 (the window had dropped those keys: only the
   saved checkpoint makes that possible) and plays turn 2 again, which must give the
   tokens the first process saved. */
#if !defined(_WIN32) && !defined(_POSIX_C_SOURCE)
#define _POSIX_C_SOURCE 200809L /* fork, execv, waitpid under -std=c99 */
#endif
#define KVCACHE_IMPLEMENTATION
#include "../kvcache.h"

#if !defined(SAVEGAME_CPU) && defined(__has_include)
#if __has_include(<vulkan/vulkan.h>)
#define SAVEGAME_VK 1
#define VK_NO_PROTOTYPES
#define KVCACHE_VK_IMPLEMENTATION
#define KVCACHE_VK_HELPERS /* the loader opened at run time, a device of our own, buffers */
#include "../kvcache_vk.h"
#endif
#endif

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifndef _WIN32
#include <sys/wait.h>
#include <unistd.h>
#endif

#define D 16      /* model width = 2 query heads x head dim 8 */
#define HD 8
#define VOCAB 32
#define LAYERS 2
#define GEN 8     /* tokens the NPC says per turn */
#define MAX_TOK 64

static const kvc_namespace NS = {0x5a7e6a11ull, 1}; /* the model a file belongs to */

#define CHECK(call)                                                                     \
    do {                                                                                \
        kvc_result r_ = (call);                                                         \
        if (r_ != KVC_OK) {                                                             \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, kvc_strerror(r_)); \
            exit(1);                                                                    \
        }                                                                               \
    } while (0)

/* ---- where the cache lives: a kvc_vk_pool on the GPU, or a CPU pool ---- */
typedef struct engine {
    kvc_pool *pool; /* the pool caches are made on (the device pool's host pool on the GPU) */
#ifdef SAVEGAME_VK
    kvc_vk_loader loader;
    kvc_vk_context *ctx;
    kvc_vk_pool *vk;
    kvc_vk_buffer io; /* host-visible: k, v, q, out of one call */
#endif
} engine;

static void engine_open(engine *e) {
    kvc_pool_config pc;
    memset(e, 0, sizeof(*e));
    kvc_pool_config_init(&pc);
    pc.n_layers = LAYERS;
    pc.n_kv_heads = 1;
    pc.head_dim_k = pc.head_dim_v = HD;
    pc.type_k = pc.type_v = KVC_TYPE_F16;
    pc.page_cells = 4;
    CHECK(kvc_pool_budget_for_tokens(&pc, 4 * MAX_TOK, &pc.budget_bytes));
#ifdef SAVEGAME_VK
    if (getenv("KVC_NO_VK") == NULL && kvc_vk_loader_open(&e->loader) == KVC_OK) {
        kvc_vk_device_options o;
        memset(&o, 0, sizeof(o));
        o.get_instance_proc_addr = e->loader.get_instance_proc_addr;
        o.device_index = -1;
        if (kvc_vk_device_create(&o, &e->ctx) == KVC_OK) {
            CHECK(kvc_vk_pool_create(e->ctx, &pc, NULL, &e->vk));
            CHECK(kvc_vk_buffer_create(e->ctx, 4 * sizeof(float) * MAX_TOK * D, 1, &e->io));
            e->pool = kvc_vk_pool_host(e->vk);
            return;
        }
        kvc_vk_loader_close(&e->loader);
    }
#endif
    CHECK(kvc_pool_create(&pc, &e->pool));
}

static const char *engine_name(const engine *e) {
#ifdef SAVEGAME_VK
    if (e->vk != NULL) return "GPU";
#endif
    (void)e;
    return "CPU";
}

static void engine_close(engine *e) {
#ifdef SAVEGAME_VK
    if (e->vk != NULL) {
        kvc_vk_buffer_destroy(e->ctx, &e->io);
        CHECK(kvc_vk_pool_destroy(e->vk));
        CHECK(kvc_vk_context_destroy(e->ctx));
        kvc_vk_loader_close(&e->loader);
        return;
    }
#endif
    CHECK(kvc_pool_destroy(e->pool));
}

/* One layer of the open batch: append its n tokens' k and v, then attention of their
   queries q (n x 2 heads x HD) into out. */
static void engine_layer(engine *e, kvc_cache *c, int32_t layer, int32_t n, const float *k, const float *v,
                         const float *q, float *out) {
#ifdef SAVEGAME_VK
    if (e->vk != NULL) {
        float *m = (float *)e->io.mapped; /* k at 0, v, q, out after it */
        size_t kv = sizeof(float) * (size_t)n * HD, qb = sizeof(float) * (size_t)n * D;
        kvc_vk_tensor tk, tv;
        kvc_vk_attention_desc d;
        VkCommandBuffer cmd;
        memcpy(m, k, kv);
        memcpy((char *)m + kv, v, kv);
        memcpy((char *)m + 2 * kv, q, qb);
        memset(&tk, 0, sizeof(tk));
        memset(&tv, 0, sizeof(tv));
        tk.buffer = tv.buffer = e->io.buffer;
        tv.offset = kv;
        memset(&d, 0, sizeof(d));
        d.n_queries = n;
        d.n_heads = 2;
        d.q.buffer = d.out.buffer = e->io.buffer;
        d.q.offset = 2 * kv;
        d.out.offset = 2 * kv + qb;
        CHECK(kvc_vk_context_begin(e->ctx, &cmd));
        CHECK(kvc_vk_cmd_append(e->vk, cmd, c, layer, &tk, &tv));
        CHECK(kvc_vk_cmd_attention(e->vk, cmd, c, layer, &d)); /* sees the append: its barrier */
        CHECK(kvc_vk_context_submit_wait(e->ctx, cmd));
        memcpy(out, (char *)m + 2 * kv + qb, qb);
        return;
    }
#endif
    {
        kvc_attention_desc d;
        (void)e;
        CHECK(kvc_put(c, layer, k, v));
        memset(&d, 0, sizeof(d));
        d.n_queries = n;
        d.n_heads = 2;
        d.q = q;
        d.out = out;
        CHECK(kvc_attention(c, layer, &d));
    }
}

/* ---- the toy model: token embeddings through two attention layers ---- */
static float weight(int32_t layer, int32_t which, int32_t i) { return 0.5f + 0.25f * sinf((float)(layer * 31 + which * 7 + i)); }
static void embed(int32_t token, float *x) {
    int32_t i;
    for (i = 0; i < D; ++i) x[i] = sinf(0.7f * (float)token + 0.3f * (float)i);
}

/* A batch of n tokens through the model; the output vector of the last one in last[D].
   at > 0 names a checkpoint at that offset (the batch's end). Returns the next token. */
static int32_t feed(engine *e, kvc_cache *c, const int32_t *tokens, int32_t n, int32_t at, float *last) {
    static float x[MAX_TOK][D], k[MAX_TOK * HD], v[MAX_TOK * HD], q[MAX_TOK * D], o[MAX_TOK * D];
    int32_t t, l, i, best = 0;
    float best_s = -1e30f;
    CHECK(kvc_begin(c, n, at > 0 ? &at : NULL, at > 0 ? 1 : 0));
    for (t = 0; t < n; ++t) embed(tokens[t], x[t]);
    for (l = 0; l < LAYERS; ++l) {
        for (t = 0; t < n; ++t)
            for (i = 0; i < D; ++i) {
                q[t * D + i] = x[t][i] * weight(l, 0, i);
                if (i < HD) {
                    k[t * HD + i] = x[t][i] * weight(l, 1, i) + x[t][i + HD] * weight(l, 2, i);
                    v[t * HD + i] = x[t][i] * weight(l, 3, i) - x[t][i + HD] * weight(l, 4, i);
                }
            }
        engine_layer(e, c, l, n, k, v, q, o);
        for (t = 0; t < n; ++t)
            for (i = 0; i < D; ++i) x[t][i] += 0.5f * o[t * D + i];
    }
    memcpy(last, x[n - 1], sizeof(float) * D);
    for (t = 0; t < VOCAB; ++t) { /* greedy: the token whose embedding fits best (not the last) */
        float e_[D], s = 0;
        if (t == tokens[n - 1]) continue;
        embed(t, e_);
        for (i = 0; i < D; ++i) s += e_[i] * last[i];
        if (s > best_s) { best_s = s; best = t; }
    }
    return best;
}

static const int32_t prompts[3][6] = {{1, 5, 9, 2, 7, 3}, {4, 4, 8, 1, 0, 6}, {2, 9, 9, 5, 3, 1}};

/* One turn: the player's 6 tokens, then GEN tokens of the NPC's (each fed back; the turn
   ends with a checkpoint). Appends every token to conv; the last output vector in last. */
static void turn(engine *e, kvc_cache *c, int32_t k, int32_t *conv, int32_t *n_conv, float *last) {
    int32_t i, next, off = 0;
    memcpy(conv + *n_conv, prompts[k], sizeof(prompts[k]));
    next = feed(e, c, prompts[k], 6, 0, last);
    *n_conv += 6;
    for (i = 0; i < GEN; ++i) {
        CHECK(kvc_cache_offset(c, &off));
        conv[(*n_conv)++] = next;
        next = feed(e, c, &conv[*n_conv - 1], 1, i == GEN - 1 ? off + 1 : 0, last);
    }
}

static kvc_cache *new_cache(engine *e) {
    kvc_cache_config cc;
    kvc_cache *c = NULL;
    kvc_cache_config_init(&cc, KVC_KIND_ROTATING);
    cc.window = 16;
    cc.sinks = 2;
    cc.checkpoints = 4;
    CHECK(kvc_cache_create(e->pool, &cc, &c));
    return c;
}

static int save_game(const char *path) {
    engine e;
    kvc_cache *c;
    kvc_path_io st;
    kvc_io io;
    int32_t conv[MAX_TOK], n = 0;
    float last[D];
    engine_open(&e);
    c = new_cache(&e);
    turn(&e, c, 0, conv, &n, last);
    turn(&e, c, 1, conv, &n, last);
    CHECK(kvc_io_path(&st, path, 1, &io));
    CHECK(kvc_cache_save(c, NS, conv, n, &io)); /* written to a temporary file, then renamed */
    printf("[%s] played 2 turns (%d tokens), saved to %s\n", engine_name(&e), n, path);
    CHECK(kvc_cache_destroy(c));
    engine_close(&e);
    return 0;
}

static int load_game(const char *path) {
    engine e;
    kvc_cache *c, *ref;
    kvc_path_io st;
    kvc_io io;
    int32_t saved[MAX_TOK], n_saved = 0, conv[MAX_TOK], n = 0, ref_conv[MAX_TOK], n_ref = 0, end1, i, ok = 1;
    float last[D], ref_last[D];
    engine_open(&e);
    c = new_cache(&e);
    CHECK(kvc_io_path(&st, path, 0, &io));
    CHECK(kvc_cache_load(c, NS, &io, saved, MAX_TOK, &n_saved));
    printf("[%s] loaded %s: %d tokens\n", engine_name(&e), path, n_saved);
    /* turn 3 after the load, against a run that never stopped */
    memcpy(conv, saved, sizeof(int32_t) * (size_t)n_saved);
    n = n_saved;
    turn(&e, c, 2, conv, &n, last);
    ref = new_cache(&e);
    for (i = 0; i < 3; ++i) turn(&e, ref, i, ref_conv, &n_ref, ref_last);
    ok &= n == n_ref && memcmp(conv, ref_conv, sizeof(int32_t) * (size_t)n) == 0;
    ok &= memcmp(last, ref_last, sizeof(last)) == 0;
    printf("turn 3 after the load: %s the uninterrupted run (NPC said", ok ? "same as" : "DIFFERS from");
    for (i = n - GEN; i < n; ++i) printf(" %d", conv[i]);
    printf(")\n");
    /* back to the end of turn 1 (a saved checkpoint), turn 2 again */
    end1 = 6 + GEN;
    CHECK(kvc_cache_restore(c, NULL, end1));
    n = end1;
    turn(&e, c, 1, conv, &n, last);
    ok &= n == n_saved && memcmp(conv, saved, sizeof(int32_t) * (size_t)n) == 0;
    printf("turn 2 again from the checkpoint at %d: %s\n", end1, n == n_saved && memcmp(conv, saved, sizeof(int32_t) * (size_t)n) == 0 ? "same as saved" : "DIFFERS");
    CHECK(kvc_cache_destroy(c));
    CHECK(kvc_cache_destroy(ref));
    engine_close(&e);
    return ok ? 0 : 1;
}

int main(int argc, char **argv) {
    char path[1100];
    int r;
    if (argc == 3 && strcmp(argv[1], "--load") == 0) return load_game(argv[2]);
    snprintf(path, sizeof(path), "%.1000s.sav", argc > 0 ? argv[0] : "savegame");
    if (save_game(path) != 0) return 1;
    fflush(stdout);
#ifndef _WIN32
    { /* a second process: this program again */
        pid_t pid = fork();
        int status = 1;
        if (pid == 0) {
            char *args[4];
            args[0] = argv[0];
            args[1] = (char *)"--load";
            args[2] = path;
            args[3] = NULL;
            execv(argv[0], args);
            _exit(127);
        }
        r = pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) ? WEXITSTATUS(status) : 1;
    }
#else
    r = load_game(path); /* no fork: the same process */
#endif
    remove(path);
    printf("%s\n", r == 0 ? "ok: the conversation went on as if never saved" : "FAILED");
    return r;
}
