/* tinylm.c - end-to-end demo and test of kvcache.h on tiny transformers.

   Loads a tiny model (config.txt + model.safetensors), runs it through the KV cache
   of kvcache.h - chunked prefill, token-by-token decode, prefix reuse,
   snapshot/restore branching, rotating sliding windows - and checks every logit
   against float64 reference logits computed by Hugging Face. Models (read from
   config.txt - `arch`, `layer_types`, `qk_norm`, `conv_L`, ... - never from the
   folder name):
     Llama / Mistral  every layer full attention, or every layer sliding (window)
     Qwen3            q/k RMSNorm per head before RoPE; sliding and full layers mixed
     LFM2             gated short-convolution layers (a recurrent conv state, no KV)
                      beside attention layers with q/k RMSNorm
   The cache side of a model is one model memory of kvcache.h (kvc_memory, section 5):
   its layers in groups that share one cache policy and shape. What runs through what:
     Llama, Mistral   a memory of one group, run with every cache kind that applies:
                      FULL and CAUSAL, ROTATING (window) only with a sliding window;
                      prefix reuse through kvc_prefix_create_memory (CAUSAL: its own
                      rule on sequence 0, kvc_seq_*), branches through memory snapshots
                      (CAUSAL: kvc_seq_snapshot)
     Qwen3            the `hybrid` kind: a ROTATING group (the sliding layers, the
                      model's window) and a FULL group (the full layers)
     LFM2             the `hybrid` kind: a RECURRENT group (the conv layers; a state of
                      the last L-1 vectors s = B*u per layer, updated in place through
                      kvc_memory_state) and a FULL group (the attention layers)
   The hybrid kind names a checkpoint at every multiple of CHECKPOINT_EVERY (64)
   tokens with kvc_memory_begin, wherever it falls inside a chunk (conv layers hand
   their state at it over with kvc_memory_state_checkpoint); prefix reuse goes back
   to one of them when a state cannot be rewound or a window has wrapped, and branches
   go through kvc_memory_snapshot_take / kvc_memory_restore. Every kind runs with each
   storage type, and with q8_0 and q4_0 rotated too (kvc_pool_config.rotate: "+rot").
   Every model also holds a conversation (two turns, then branches) in a radix tree
   over its memory (kvc_radix_create_memory; `radix` rows, section 8), and once more
   through a host-RAM tier (kvc_tier_*: the tree evicted whole, the prefix fetched
   back, the rest's logits checked; the `tier_turn2` row).

   Build (from the repository root):
       cc -std=c99 -O2 -Wall -Wextra -Wpedantic examples/tinylm.c -o tinylm -lm
   Run:
       ./tinylm [--chunk N] [--draft K] [--quiet] [--reference] [--types LIST] [MODEL_DIR ...]
   With no MODEL_DIR it runs every folder of tests/data that holds a config.txt.
   A model folder holds config.txt, model.safetensors, reference.txt and one
   NAME.logits.f32 per case (formats and math: tests/data/README.md).
   What config.txt may say - every value Hugging Face accepts for these architectures,
   except where noted: any sizes (hd even, heads a multiple of kv, at most MAX_LAYERS
   layers), any window, theta and eps; LFM2's conv_L >= 1 and conv_bias (biases on
   in_proj, the depthwise conv and out_proj); tie_embeddings (no lm_head.weight);
   attention_bias (q, k, v, o) and mlp_bias (gate, up, down) of Llama and Qwen3.
   Refused with a message rather than run wrong: act other than silu (Llama's and
   Qwen3's hidden_act; LFM2's MLP is always silu), rope other than neox (the only form
   these architectures use), and rope_scaling other than none (Llama 3's and YaRN's
   scaled frequencies are not implemented). `inter` is the MLP's actual width (LFM2's
   block_auto_adjust_ff_dim already applied); every tensor's shape is checked on load.
   tests/gen_model.py makes models of other shapes with float64 reference logits.

   --chunk N     prefill at most N tokens per forward pass (default 2048)
   --draft K     speculative decoding through a reserve of K tokens: draft K, reject
                 some, trim, continue (see run_speculative; default 4, 0: off)
   --quiet       print only failures, errors and the final verdict
   --reference   skip kvcache.h: one cache-free forward over each whole sequence
                 with naive attention (checks the model math on its own)
   --types LIST  only these storage types' rows (comma-separated: f32, f16, bf16, q8_0,
                 q8_0+rot, q4_0, q4_0+rot; default all; the plain-against-rotated check
                 runs when q8_0, q4_0 and their +rot rows are all there)
   --f16-tail N  the q8_0 / q4_0 rows keep the newest N tokens of their FULL and
                 ROTATING groups in f16 (kvc_cache_config.f16_tail; not with --vk)
   --share-write STORE FILE, --share-read STORE FILE
                 only the model's long prompt, shared by two runs (processes) through a
                 store: the writer evaluates it and publishes its whole blocks, the reader
                 fetches them, computes the rest and checks its logits against the
                 reference and bit for bit against the writer's (FILE); STORE is dir:PATH
                 or, built with -DTINYLM_REDIS (-lhiredis), redis:HOST:PORT (run_shared;
                 tests/share_prompt.sh)
   --vk          the Vulkan backend (kvcache_vk.h): the memory is a device memory
                 (kvc_vk_memory_create: one budget for every group, K/V pages and conv
                 states in device memory that follows use), append and attention on the
                 GPU, everything else the same kvc_memory_* calls (section 5). Adds a
                 save game mid-run per model (run_vk_saveload: saved to a temporary
                 file, loaded into a fresh device memory, the continuation bit-identical
                 to the uninterrupted run's) with the device bytes held. Radix turns and
                 speculative runs stay on the CPU path. Needs a build with -DTINYLM_VK
                 (Vulkan headers; the loader is opened at run time)

   Output: one table row per case x cache kind x storage type:
     rows      reference logits rows compared / rows in the file (rows at positions
               the cache reused are not recomputed, so not compared)
     max|err|  largest |logit - reference| over those rows; rms err likewise
     greedy    greedy tokens equal to the reference's (greedy cases)
     reused    tokens not recomputed: found by prefix reuse, or restored from a
               snapshot (branch_b) or a checkpoint; "a!=b" when it differs from what
               was expected
     tok/s     tokens through the model per CPU second
     result    "ok" or "FAIL:" and why; causal rows add the cells in use at the end,
               hybrid rows the checkpoints every group can go back to
   then one line per memory with its peak use and a leak check after
   teardown; per model a summary of the quantized types over every kind and case,
   plain and rotated side by side (q8_0, q8_0+rot, q4_0, q4_0+rot: max|err|, rms err,
   greedy) with the rotation's checks (ROT_Q8_RATIO, ROT_Q4_RATIO); and a final
   verdict line. Exit status: 0 when every check passed (every type within its error
   bound - s x 5e-4 for f32, s the rms of the reference logits, more for the lossy
   types, see TYPES - every f32 greedy token equal, no leak), 1 otherwise, 2 on bad usage.

   The program is organised top-down:
     1. test matrix      the cache kinds and storage types to run (one line each)
     2. helpers          files, errors, timing
     3. config.txt       the model's hyper-parameters and layer types
     4. safetensors      a minimal reader with a tiny JSON parser
     5. the memory       the model's kvc_memory (--vk: on the device); begin /
                         cancel / attention / conv state / snapshot / restore / free
     6. the model        weights, math and the forward pass through the memory
     7. reference.txt    the test cases and their reference logits
     8. sessions         a memory per (kind, type), the kinds' hooks; the cases
     9. main             argument parsing, the table, the verdict
*/
#if defined(TINYLM_REDIS) && !defined(_POSIX_C_SOURCE)
#define _POSIX_C_SOURCE 200809L /* examples/redis_store.h: clock_gettime */
#endif
#define KVCACHE_IMPLEMENTATION
#include "../kvcache.h"
#ifdef TINYLM_VK /* --vk: the Vulkan backend; VK_NO_PROTOTYPES, the loader opened at run time */
#define VK_NO_PROTOTYPES
#define KVCACHE_VK_IMPLEMENTATION
#define KVCACHE_VK_HELPERS /* the loader, a device of its own, buffers */
#include "../kvcache_vk.h"
#endif
#ifdef TINYLM_REDIS /* --share-* redis:HOST:PORT: the Redis store of examples/redis_store.h (-lhiredis) */
#include "redis_store.h"
#endif

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifndef _WIN32
#include <dirent.h> /* listing tests/data */
#endif

/* ==================================================================================
   1. The test matrix
   ================================================================================== */

/* Cache kinds. Every kind runs with every storage type below; `setup` fills in the
   kind-specific fields of the cache config (window, capacity, ...) for a model.
   A kind that needs_window only runs on models with a sliding window. FULL and
   ROTATING caches get the model's window in kvc_attention (desc.window), so a FULL
   cache applies it as an attention mask while a ROTATING cache also drops what falls
   out of it; a CAUSAL cache has the window in its config and applies it itself.
   These three run on models whose layers are all alike, as a memory of one group;
   the `hybrid` kind runs on hybrid models only (layers of different types), with one
   group per layer type in one memory (section 5).
   The hooks are the cache policy of a session (section 8): how a request reuses
   what the memory holds, and how a branch point is restored. */
typedef struct config config;
typedef struct session session;
typedef struct test_case test_case;
typedef struct score score;
typedef struct kind_spec {
    const char *name;
    kvc_kind kind;            /* unused by the hybrid kind: each group has its own */
    int needs_window;
    int hybrid;               /* 1: only on hybrid models, 0: only on the others */
    /* max_batch: the most tokens one forward pass takes */
    void (*setup)(kvc_cache_config *cc, const config *c, int32_t max_tokens, int32_t max_batch);
    /* keep the longest reusable prefix of prompt[0..n): *reused tokens, *want expected */
    int (*begin_request)(session *s, const int32_t *prompt, int32_t n, int32_t *reused, int32_t *want);
    int (*end_request)(session *s);                  /* record the finished request's tokens */
    int (*restore_branch_point)(session *s, int32_t n); /* back to s->branch, n tokens */
    int (*end_case)(session *s, const test_case *tc, score *sc); /* checks after a case */
} kind_spec;

/* FULL, ROTATING and hybrid: prefix reuse through kvc_prefix over the memory,
   memory snapshots (kvc_memory_snapshot_take / kvc_memory_restore) */
static void setup_full(kvc_cache_config *cc, const config *c, int32_t max_tokens, int32_t max_batch);
static void setup_rotating(kvc_cache_config *cc, const config *c, int32_t max_tokens, int32_t max_batch);
static int begin_request_prefix(session *s, const int32_t *prompt, int32_t n, int32_t *reused, int32_t *want);
static int end_request_prefix(session *s);
static int restore_branch_point_prefix(session *s, int32_t n);
static int end_case_prefix(session *s, const test_case *tc, score *sc);
/* CAUSAL: sequence 0 of a cell cache; the same reuse rule written out, kvc_seq_snapshot */
static void setup_causal(kvc_cache_config *cc, const config *c, int32_t max_tokens, int32_t max_batch);
static int begin_request_causal(session *s, const int32_t *prompt, int32_t n, int32_t *reused, int32_t *want);
static int end_request_causal(session *s);
static int restore_branch_point_causal(session *s, int32_t n);
static int end_case_causal(session *s, const test_case *tc, score *sc);

static const kind_spec KINDS[] = {
    {"full", KVC_KIND_FULL, 0, 0, setup_full, begin_request_prefix, end_request_prefix,
     restore_branch_point_prefix, end_case_prefix},
    {"rotating", KVC_KIND_ROTATING, 1, 0, setup_rotating, begin_request_prefix, end_request_prefix,
     restore_branch_point_prefix, end_case_prefix},
    {"causal", KVC_KIND_CAUSAL, 0, 0, setup_causal, begin_request_causal, end_request_causal,
     restore_branch_point_causal, end_case_causal},
    /* the FULL and ROTATING hooks; prefill names checkpoints (CHECKPOINT_EVERY) to which
       prefix reuse can take a recurrent state or a wrapped window back */
    {"hybrid", KVC_KIND_FULL, 0, 1, NULL, begin_request_prefix, end_request_prefix,
     restore_branch_point_prefix, end_case_prefix},
};

/* Storage types of K and V, with the accuracy each must reach against the float64
   reference, and whether every greedy token must match the reference (for lossy types
   a flipped near-tie is reported, not failed).

   The bound on |logit - ref| follows from the storage type and the model's logit
   scale, not from the numbers of the shipped models (error_bound, section 8):
       bound = s * (F32_REL + ERR_GAIN * step)
   s is the rms of the case's reference logits (errors scale with the logits: a model
   whose logits are 10x larger has 10x larger errors at the same relative precision).
   step is the type's quantisation step relative to the rms of the values it stores:
   2^-10 and 2^-7 for f16 and bf16 (11 and 8 significant bits); a q8_0 / q4_0 block
   stores max|x|/127 and max|x|/8 steps, and the max of a 32-value block of Gaussian-
   like K/V is about 2.4 rms (measured on these models: 2.36-2.41), so 0.019 and 0.30.
   F32_REL (5e-4) covers the float32 arithmetic of the forward itself, 100x what it
   costs on the shipped and generated models (about 5e-6 s). ERR_GAIN: an error of one step in the stored K/V
   moves a logit by at most about 8 s x step on the four shipped models and on
   generated ones (tests/gen_model.py: other shapes, conv biases, tied embeddings with
   9x larger logits) - f16 4.1, bf16 5.4, q8_0 8.0, q4_0 6.0 - alike for every type,
   as the model predicts; 16 leaves a factor 2. A bug (a wrong row, position, scale or
   block) moves logits by O(s): far over the bounds of f32, f16 and bf16 (5e-4 s,
   0.016 s, 0.13 s), 3x over q8_0's (0.30 s); q4_0's (4.8 s) says only that nothing
   blew up - its greedy tokens and the rotation check below watch it more closely. */
#define F32_REL 5e-4
#define ERR_GAIN 16.0

typedef struct type_spec {
    kvc_type type;
    double step;      /* quantisation step / rms of the stored values (0: exact) */
    int exact_greedy;
    uint32_t rotate;  /* kvc_pool_config.rotate of the K/V groups ("+rot": K and V) */
    const char *name; /* in the table */
} type_spec;

static const type_spec TYPES[] = {
    {KVC_TYPE_F32, 0, 1, 0, "f32"},
    {KVC_TYPE_F16, 1.0 / 1024, 0, 0, "f16"},
    {KVC_TYPE_BF16, 1.0 / 128, 0, 0, "bf16"},
    /* q8_0 and q4_0 keys are scored against the query rounded to q8_0: within q8_0's step */
    {KVC_TYPE_Q8_0, 2.4 / 127, 0, 0, "q8_0"},
    {KVC_TYPE_Q8_0, 2.4 / 127, 0, KVC_ROTATE_K | KVC_ROTATE_V, "q8_0+rot"},
    {KVC_TYPE_Q4_0, 2.4 / 8, 0, 0, "q4_0"},
    {KVC_TYPE_Q4_0, 2.4 / 8, 0, KVC_ROTATE_K | KVC_ROTATE_V, "q4_0+rot"},
};

#define COUNT_OF(a) ((int)(sizeof(a) / sizeof((a)[0])))

#define PAGE_CELLS 16                       /* small pages: many page boundaries */
#define BUDGET_BYTES ((size_t)64 << 20)     /* generous: the runs need < 2 MiB   */
#define DEFAULT_CHUNK 2048                  /* ollama's default batch size       */
#define CHECKPOINT_EVERY 64                 /* hybrid kind: a checkpoint each 64 tokens */
#define KEEP_CHECKPOINTS 8                  /* the latest checkpoints a cache keeps   */
#define MAX_LAYERS 64
#define MAX_GROUPS 4                        /* one per layer type at most */

/* ==================================================================================
   2. Helpers
   ================================================================================== */

static int g_quiet = 0;
static size_t g_budget_bytes = BUDGET_BYTES; /* each memory's (bench/bench_tiers.c's long prefixes: more) */
/* the namespace of every radix request (kvc_namespace.model: the model's id); --share-*
   sets it to a hash of the weights, so only the same model finds a shared prefix */
static kvc_namespace g_radix_ns = {1, 0};
static int32_t g_f16_tail = 0; /* --f16-tail */
static int g_type_off[COUNT_OF(TYPES)]; /* --types: the storage types left out */

#ifdef TINYLM_VK
/* --vk: one device for the run, host-visible buffers that carry one layer's q, k, v
   and attention output between host and GPU, and a conv state (a checkpoint's copy) */
static struct {
    int on;
    kvc_vk_loader loader;
    kvc_vk_context *ctx;
    kvc_vk_buffer q, k, v, out, state;
} g_vk;
static kvc_vk_info g_vk_info;

static int vk_buffer(kvc_vk_buffer *b, size_t bytes) {
    if (b->buffer && b->size >= bytes) return 0;
    if (b->buffer) kvc_vk_buffer_destroy(g_vk.ctx, b);
    return kvc_vk_buffer_create(g_vk.ctx, bytes, 1, b) == KVC_OK ? 0 : -1;
}

/* kvc_put + kvc_attention of one layer on the GPU (one submission; a real engine would
   record every layer into one command buffer with its own kernels around these) */
static kvc_result vk_put_attention(kvc_vk_pool *pool, kvc_cache *cache, int32_t layer, const float *k, const float *v,
                                   size_t kv_floats, const kvc_attention_desc *d, size_t q_floats, size_t out_floats) {
    VkCommandBuffer cmd;
    kvc_vk_tensor tk, tv;
    kvc_vk_attention_desc vd;
    kvc_result r;
    if (vk_buffer(&g_vk.k, kv_floats * 4) || vk_buffer(&g_vk.v, kv_floats * 4) || vk_buffer(&g_vk.q, q_floats * 4) ||
        vk_buffer(&g_vk.out, out_floats * 4))
        return KVC_ERR_NO_MEMORY;
    memcpy(g_vk.k.mapped, k, kv_floats * 4);
    memcpy(g_vk.v.mapped, v, kv_floats * 4);
    memcpy(g_vk.q.mapped, d->q, q_floats * 4);
    memset(&tk, 0, sizeof tk);
    memset(&tv, 0, sizeof tv);
    tk.buffer = g_vk.k.buffer;
    tv.buffer = g_vk.v.buffer;
    memset(&vd, 0, sizeof vd);
    vd.n_queries = d->n_queries;
    vd.n_heads = d->n_heads;
    vd.q.buffer = g_vk.q.buffer;
    vd.out.buffer = g_vk.out.buffer;
    vd.pos = d->pos;
    vd.seq = d->seq;
    vd.scale = d->scale;
    vd.window = d->window;
    vd.non_causal = d->non_causal;
    if ((r = kvc_vk_context_begin(g_vk.ctx, &cmd)) != KVC_OK) return r;
    r = kvc_vk_cmd_append(pool, cmd, cache, layer, &tk, &tv);
    if (r == KVC_OK) r = kvc_vk_cmd_attention(pool, cmd, cache, layer, &vd);
    if (r != KVC_OK) { kvc_vk_context_submit_wait(g_vk.ctx, cmd); return r; }
    if ((r = kvc_vk_context_submit_wait(g_vk.ctx, cmd)) != KVC_OK) return r;
    memcpy(d->out, g_vk.out.mapped, out_floats * 4);
    return KVC_OK;
}
#endif

/* Every error message goes to stderr, prefixed with the program name. */
static void errorf(const char *fmt, ...)
{
    va_list ap;
    fflush(stdout); /* keep the table and the messages in order */
    va_start(ap, fmt);
    fputs("tinylm: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

/* Run a kvcache.h call; on failure print what failed and why, and jump to the
   enclosing function's `fail:` label (which frees what the function owns). */
#define KVC_CHECK(call)                                                             \
    do {                                                                            \
        kvc_result kvc_check_r_ = (call);                                           \
        if (kvc_check_r_ != KVC_OK) {                                               \
            errorf("%s failed: %s (%s:%d)", #call, kvc_strerror(kvc_check_r_),      \
                  __FILE__, __LINE__);                                              \
            goto fail;                                                              \
        }                                                                           \
    } while (0)

static float *alloc_floats(size_t n)
{
    float *p = (float *)malloc((n ? n : 1) * sizeof(float));
    if (!p) errorf("out of memory (%lu floats)", (unsigned long)n);
    return p;
}

/* Reads a whole file into memory. Returns NULL (after a message) on failure. */
static unsigned char *read_file(const char *path, size_t *size)
{
    FILE *f = fopen(path, "rb");
    unsigned char *buf = NULL;
    long len;
    if (!f) {
        errorf("cannot open %s: %s", path, strerror(errno));
        return NULL;
    }
    if (fseek(f, 0, SEEK_END) != 0 || (len = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {
        errorf("cannot determine the size of %s", path);
        fclose(f);
        return NULL;
    }
    buf = (unsigned char *)malloc((size_t)len + 1);
    if (!buf) {
        errorf("out of memory reading %s (%ld bytes)", path, len);
        fclose(f);
        return NULL;
    }
    if (fread(buf, 1, (size_t)len, f) != (size_t)len) {
        errorf("cannot read %s", path);
        free(buf);
        fclose(f);
        return NULL;
    }
    fclose(f);
    buf[len] = 0; /* lets text files be parsed as C strings */
    *size = (size_t)len;
    return buf;
}

static void join_path(char *out, size_t cap, const char *dir, const char *name)
{
    snprintf(out, cap, "%s/%s", dir, name);
}

static double seconds_now(void) { return (double)clock() / CLOCKS_PER_SEC; }

/* Next whitespace-separated word of *s into buf; 0 at the end of the text. */
static int next_word(const char **s, char *buf, size_t cap)
{
    size_t n = 0;
    while (**s == ' ' || **s == '\t' || **s == '\n' || **s == '\r') ++*s;
    if (!**s) return 0;
    while (**s && !(**s == ' ' || **s == '\t' || **s == '\n' || **s == '\r')) {
        if (n + 1 < cap) buf[n++] = **s;
        ++*s;
    }
    buf[n] = 0;
    return 1;
}

/* Decodes a little-endian float32 whatever the host byte order. */
static float load_f32_le(const unsigned char *p)
{
    uint32_t u = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* ==================================================================================
   3. config.txt: `key value` lines
   ================================================================================== */

/* What a layer does; config.txt `layer_types` words. */
typedef enum layer_type { LAYER_FULL, LAYER_SLIDING, LAYER_CONV } layer_type;
static const char *const LAYER_TYPE_NAMES[] = {"full_attention", "sliding_attention", "conv"};

/* Architectures: the weight names and which blocks exist. */
typedef enum model_arch { ARCH_LLAMA, ARCH_QWEN3, ARCH_LFM2 } model_arch;

struct config {
    int vocab, hidden, layers, heads, kv, hd, inter;
    int window;     /* sliding window in keys (including the current token), 0: none */
    double theta;   /* RoPE base */
    double eps;     /* RMSNorm epsilon (the q/k norms' too) */
    model_arch arch; /* `arch`: absent, llama or mistral = ARCH_LLAMA */
    int qk_norm;    /* q and k RMS-normalised per head before RoPE */
    int conv_L;     /* LFM2 short convolution: kernel length (HF conv_L_cache) */
    int conv_bias;  /* LFM2: in_proj, conv and out_proj of the conv layers have biases */
    int tied;       /* tie_embeddings: no lm_head.weight, the logits use the embedding */
    int attn_bias;  /* attention_bias: q, k, v and o projections have biases */
    int mlp_bias;   /* mlp_bias: gate, up and down projections have biases */
    layer_type type[MAX_LAYERS]; /* `layer_types`; absent: all full, or all sliding with a window */
};

/* The floats of a conv layer's recurrent state: the last L-1 vectors s. With L = 1 (a
   kernel that sees only the current token, which Hugging Face accepts) there is no past,
   but a RECURRENT group needs a state: one vector, never read. */
static int32_t conv_state_floats(const config *c)
{
    return (c->conv_L > 1 ? c->conv_L - 1 : 1) * c->hidden;
}

/* A hybrid model has layers of more than one type: one layer group per type. */
static int model_is_hybrid(const config *c)
{
    for (int l = 1; l < c->layers; ++l)
        if (c->type[l] != c->type[0]) return 1;
    return c->type[0] == LAYER_CONV;
}

static int load_config(const char *dir, config *c)
{
    char path[1024], key[64], value[64], line[4096];
    unsigned char *text;
    const char *next;
    size_t size;
    int seen = 0, ok = 1, n_types = -1;
    /* The keys we need, each with a bit in `seen`. */
    static const char *const keys[] = {"vocab", "hidden", "layers", "heads", "kv",  "hd",
                                       "inter", "theta",  "window", "rms_eps", "rope", "act"};
    const int n_keys = COUNT_OF(keys);
    layer_type types[MAX_LAYERS];

    join_path(path, sizeof path, dir, "config.txt");
    if (!(text = read_file(path, &size))) return -1;
    memset(c, 0, sizeof *c);
    for (next = (const char *)text; *next;) {
        /* copy one line, so that sscanf cannot read on into the next one */
        size_t len = strcspn(next, "\n");
        int k;
        snprintf(line, sizeof line, "%.*s", (int)(len < sizeof line ? len : sizeof line - 1), next);
        next += len + (next[len] == '\n');
        if (sscanf(line, "%63s %63s", key, value) != 2) continue; /* blank line */
        /* the optional keys of the hybrid models */
        if (!strcmp(key, "arch")) {
            if (!strcmp(value, "llama") || !strcmp(value, "mistral")) c->arch = ARCH_LLAMA;
            else if (!strcmp(value, "qwen3")) c->arch = ARCH_QWEN3;
            else if (!strcmp(value, "lfm2")) c->arch = ARCH_LFM2;
            else {
                errorf("%s: arch '%s' not supported (llama, mistral, qwen3, lfm2)", path, value);
                ok = 0;
            }
            continue;
        }
        if (!strcmp(key, "layer_types")) {
            const char *w = line + strlen("layer_types");
            char word[64];
            n_types = 0;
            while (next_word(&w, word, sizeof word)) {
                int t = 0;
                while (t < COUNT_OF(LAYER_TYPE_NAMES) && strcmp(word, LAYER_TYPE_NAMES[t]) != 0) ++t;
                if (t == COUNT_OF(LAYER_TYPE_NAMES) || n_types == MAX_LAYERS) {
                    errorf("%s: layer type '%s' not supported, or more than %d layers", path, word, MAX_LAYERS);
                    ok = 0;
                    break;
                }
                types[n_types++] = (layer_type)t;
            }
            continue;
        }
        if (!strcmp(key, "qk_norm")) { c->qk_norm = atoi(value); continue; }
        if (!strcmp(key, "conv_L")) { c->conv_L = atoi(value); continue; }
        if (!strcmp(key, "conv_bias")) { c->conv_bias = atoi(value) != 0; continue; }
        if (!strcmp(key, "tie_embeddings")) { c->tied = atoi(value) != 0; continue; }
        if (!strcmp(key, "attention_bias")) { c->attn_bias = atoi(value) != 0; continue; }
        if (!strcmp(key, "mlp_bias")) { c->mlp_bias = atoi(value) != 0; continue; }
        if (!strcmp(key, "rope_scaling")) {
            if (strcmp(value, "0") != 0 && strcmp(value, "none") != 0) { /* would change the math */
                errorf("%s: %s %s not supported (0 or none only)", path, key, value);
                ok = 0;
            }
            continue;
        }
        for (k = 0; k < n_keys && strcmp(key, keys[k]) != 0; ++k) {}
        if (k == n_keys) continue; /* unknown keys are ignored */
        seen |= 1 << k;
        if (!strcmp(key, "vocab")) c->vocab = atoi(value);
        else if (!strcmp(key, "hidden")) c->hidden = atoi(value);
        else if (!strcmp(key, "layers")) c->layers = atoi(value);
        else if (!strcmp(key, "heads")) c->heads = atoi(value);
        else if (!strcmp(key, "kv")) c->kv = atoi(value);
        else if (!strcmp(key, "hd")) c->hd = atoi(value);
        else if (!strcmp(key, "inter")) c->inter = atoi(value);
        else if (!strcmp(key, "window")) c->window = atoi(value);
        else if (!strcmp(key, "theta")) c->theta = atof(value);
        else if (!strcmp(key, "rms_eps")) c->eps = atof(value);
        else if (!strcmp(key, "rope") && strcmp(value, "neox") != 0) {
            errorf("%s: rope '%s' not supported (only neox)", path, value);
            ok = 0;
        } else if (!strcmp(key, "act") && strcmp(value, "silu") != 0) {
            errorf("%s: act '%s' not supported (only silu)", path, value);
            ok = 0;
        }
    }
    free(text);
    for (int k = 0; k < n_keys; ++k)
        if (!(seen & (1 << k))) {
            errorf("%s: missing key '%s'", path, keys[k]);
            ok = 0;
        }
    if (ok && (c->vocab <= 0 || c->hidden <= 0 || c->layers <= 0 || c->layers > MAX_LAYERS || c->heads <= 0 ||
               c->kv <= 0 || c->hd <= 0 || c->hd % 2 != 0 || c->inter <= 0 || c->heads % c->kv != 0 ||
               c->window < 0 || !(c->theta > 0) || !(c->eps > 0))) {
        errorf("%s: inconsistent values (need positive sizes, even hd, heads %% kv == 0, at most %d layers)",
               path, MAX_LAYERS);
        ok = 0;
    }
    if (!ok) return -1;
    /* Layer types: Llama/Mistral configs have none, the window decides for every layer. */
    if (n_types >= 0 && n_types != c->layers) {
        errorf("%s: layer_types names %d layers, layers is %d", path, n_types, c->layers);
        return -1;
    }
    for (int l = 0; l < c->layers; ++l)
        c->type[l] = n_types < 0 ? (c->window ? LAYER_SLIDING : LAYER_FULL) : types[l];
    for (int l = 0; l < c->layers; ++l) {
        if (c->type[l] == LAYER_SLIDING && c->window == 0) {
            errorf("%s: layer %d is sliding_attention but window is 0", path, l);
            return -1;
        }
        if (c->type[l] == LAYER_CONV && (c->arch != ARCH_LFM2 || c->conv_L < 1)) {
            errorf("%s: layer %d is conv: needs arch lfm2 and conv_L >= 1", path, l);
            return -1;
        }
    }
    return 0;
}

/* ==================================================================================
   4. safetensors: 8-byte little-endian header length, a JSON header
      {name: {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...},
      then the raw data (offsets relative to the end of the header).
   ================================================================================== */

#define ST_MAX_DIMS 8

typedef struct st_tensor {
    char name[128];
    char dtype[16];
    uint64_t shape[ST_MAX_DIMS];
    int ndim;
    uint64_t begin, end;
} st_tensor;

typedef struct st_file {
    const char *path;
    unsigned char *bytes;       /* the whole file */
    const unsigned char *data;  /* start of the raw data */
    uint64_t data_size;
    st_tensor *tensors;
    int n_tensors;
} st_file;

/* --- A tiny JSON parser: just enough for the header ------------------------------ */

typedef struct json {
    const char *p, *end;
    const char *path; /* for messages */
    int failed;
} json;

static int json_fail(json *j, const char *what)
{
    if (!j->failed)
        errorf("%s: malformed safetensors header: %s", j->path, what);
    j->failed = 1;
    return -1;
}

static void json_ws(json *j)
{
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r')) ++j->p;
}

/* Consumes character c (after whitespace) if it is next; returns whether it did. */
static int json_eat(json *j, char c)
{
    json_ws(j);
    if (j->p < j->end && *j->p == c) {
        ++j->p;
        return 1;
    }
    return 0;
}

/* A string into out[cap] (escapes decoded; non-ASCII \u escapes become '?'). */
static int json_string(json *j, char *out, size_t cap)
{
    size_t n = 0;
    if (!json_eat(j, '"')) return json_fail(j, "expected a string");
    while (j->p < j->end && *j->p != '"') {
        char c = *j->p++;
        if (c == '\\') {
            if (j->p >= j->end) break;
            c = *j->p++;
            switch (c) {
            case 'b': c = '\b'; break;
            case 'f': c = '\f'; break;
            case 'n': c = '\n'; break;
            case 'r': c = '\r'; break;
            case 't': c = '\t'; break;
            case 'u': {
                unsigned v = 0;
                for (int i = 0; i < 4; ++i, ++j->p) {
                    char h = j->p < j->end ? *j->p : 0;
                    int d = h >= '0' && h <= '9' ? h - '0'
                          : h >= 'a' && h <= 'f' ? h - 'a' + 10
                          : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
                    if (d < 0) return json_fail(j, "bad \\u escape");
                    v = v * 16 + (unsigned)d;
                }
                c = v < 0x80 ? (char)v : '?';
                break;
            }
            default: break; /* \" \\ \/ stand for themselves */
            }
        }
        if (n + 1 >= cap) return json_fail(j, "string too long");
        out[n++] = c;
    }
    if (j->p >= j->end) return json_fail(j, "unterminated string");
    ++j->p; /* closing quote */
    out[n] = 0;
    return 0;
}

/* A non-negative integer (shapes and offsets). */
static int json_uint(json *j, uint64_t *out)
{
    uint64_t v = 0;
    json_ws(j);
    if (j->p >= j->end || *j->p < '0' || *j->p > '9') return json_fail(j, "expected a non-negative integer");
    while (j->p < j->end && *j->p >= '0' && *j->p <= '9') {
        unsigned d = (unsigned)(*j->p++ - '0');
        if (v > (UINT64_MAX - d) / 10) return json_fail(j, "integer overflow");
        v = v * 10 + d;
    }
    *out = v;
    return 0;
}

/* An array of non-negative integers into out[max]; *n receives the count. */
static int json_uint_array(json *j, uint64_t *out, int max, int *n)
{
    *n = 0;
    if (!json_eat(j, '[')) return json_fail(j, "expected '['");
    if (json_eat(j, ']')) return 0;
    do {
        if (*n == max) return json_fail(j, "array too long");
        if (json_uint(j, &out[(*n)++]) != 0) return -1;
    } while (json_eat(j, ','));
    if (!json_eat(j, ']')) return json_fail(j, "expected ']'");
    return 0;
}

/* Skips any value (used for __metadata__ and unknown keys). */
static int json_skip(json *j, int depth)
{
    char buf[256];
    json_ws(j);
    if (depth > 32) return json_fail(j, "nested too deeply");
    if (j->p >= j->end) return json_fail(j, "unexpected end");
    if (*j->p == '"') return json_string(j, buf, sizeof buf);
    if (*j->p == '{' || *j->p == '[') {
        char close = *j->p == '{' ? '}' : ']';
        int is_object = close == '}';
        ++j->p;
        if (json_eat(j, close)) return 0;
        do {
            if (is_object && (json_string(j, buf, sizeof buf) != 0 || !json_eat(j, ':')))
                return json_fail(j, "expected \"key\":");
            if (json_skip(j, depth + 1) != 0) return -1;
        } while (json_eat(j, ','));
        if (!json_eat(j, close)) return json_fail(j, "expected '}' or ']'");
        return 0;
    }
    /* number, true, false, null */
    {
        const char *start = j->p;
        while (j->p < j->end && strchr("+-.0123456789eEtruefalsn", *j->p)) ++j->p;
        if (j->p == start) return json_fail(j, "unexpected character");
    }
    return 0;
}

/* One tensor entry: {"dtype": .., "shape": [..], "data_offsets": [b, e]}. */
static int json_tensor(json *j, st_tensor *t)
{
    char key[64];
    int have = 0;
    if (!json_eat(j, '{')) return json_fail(j, "expected '{' for a tensor");
    if (!json_eat(j, '}')) {
        do {
            if (json_string(j, key, sizeof key) != 0 || !json_eat(j, ':')) return json_fail(j, "expected \"key\":");
            if (!strcmp(key, "dtype")) {
                if (json_string(j, t->dtype, sizeof t->dtype) != 0) return -1;
                have |= 1;
            } else if (!strcmp(key, "shape")) {
                if (json_uint_array(j, t->shape, ST_MAX_DIMS, &t->ndim) != 0) return -1;
                have |= 2;
            } else if (!strcmp(key, "data_offsets")) {
                uint64_t off[2];
                int n;
                if (json_uint_array(j, off, 2, &n) != 0) return -1;
                if (n != 2) return json_fail(j, "data_offsets needs two numbers");
                t->begin = off[0];
                t->end = off[1];
                have |= 4;
            } else if (json_skip(j, 1) != 0) {
                return -1;
            }
        } while (json_eat(j, ','));
        if (!json_eat(j, '}')) return json_fail(j, "expected '}' after a tensor");
    }
    if (have != 7) {
        errorf("%s: tensor '%s' lacks dtype, shape or data_offsets", j->path, t->name);
        j->failed = 1;
        return -1;
    }
    return 0;
}

static void st_close(st_file *f)
{
    free(f->bytes);
    free(f->tensors);
    memset(f, 0, sizeof *f);
}

static int st_open(st_file *f, const char *path)
{
    json j;
    uint64_t header_len = 0;
    size_t size = 0;
    int cap = 0;

    memset(f, 0, sizeof *f);
    f->path = path;
    if (!(f->bytes = read_file(path, &size))) return -1;
    if (size < 8) {
        errorf("%s: too short for a safetensors file", path);
        goto fail;
    }
    for (int i = 7; i >= 0; --i) header_len = header_len << 8 | f->bytes[i];
    if (header_len > size - 8) {
        errorf("%s: header length %llu exceeds the file size %lu", path,
              (unsigned long long)header_len, (unsigned long)size);
        goto fail;
    }
    f->data = f->bytes + 8 + header_len;
    f->data_size = size - 8 - header_len;

    j.p = (const char *)f->bytes + 8;
    j.end = j.p + header_len;
    j.path = path;
    j.failed = 0;
    if (!json_eat(&j, '{')) {
        json_fail(&j, "expected '{'");
        goto fail;
    }
    if (!json_eat(&j, '}')) {
        do {
            st_tensor t;
            memset(&t, 0, sizeof t);
            if (json_string(&j, t.name, sizeof t.name) != 0 || !json_eat(&j, ':')) {
                json_fail(&j, "expected \"name\":");
                goto fail;
            }
            if (!strcmp(t.name, "__metadata__")) {
                if (json_skip(&j, 1) != 0) goto fail;
                continue;
            }
            if (json_tensor(&j, &t) != 0) goto fail;
            if (f->n_tensors == cap) {
                st_tensor *grown;
                cap = cap ? 2 * cap : 64;
                grown = (st_tensor *)realloc(f->tensors, (size_t)cap * sizeof *grown);
                if (!grown) {
                    errorf("out of memory");
                    goto fail;
                }
                f->tensors = grown;
            }
            f->tensors[f->n_tensors++] = t;
        } while (json_eat(&j, ','));
        if (!json_eat(&j, '}')) {
            json_fail(&j, "expected '}' at the end");
            goto fail;
        }
    }
    json_ws(&j);
    if (j.p != j.end) {
        json_fail(&j, "trailing characters after the header");
        goto fail;
    }
    return 0;
fail:
    st_close(f);
    return -1;
}

/* Copies tensor `name` into a new float array after checking it is F32, has the
   expected shape (dims[ndim]) and lies inside the file. NULL on any problem. */
static float *st_load(const st_file *f, const char *name, int ndim, const int *dims)
{
    const st_tensor *t = NULL;
    uint64_t count = 1;
    float *out;
    for (int i = 0; i < f->n_tensors; ++i)
        if (!strcmp(f->tensors[i].name, name)) t = &f->tensors[i];
    if (!t) {
        errorf("%s: tensor '%s' is missing", f->path, name);
        return NULL;
    }
    if (strcmp(t->dtype, "F32") != 0) {
        errorf("%s: tensor '%s' has dtype %s, only F32 is supported", f->path, name, t->dtype);
        return NULL;
    }
    if (t->ndim != ndim) {
        errorf("%s: tensor '%s' has %d dimensions, expected %d", f->path, name, t->ndim, ndim);
        return NULL;
    }
    for (int i = 0; i < ndim; ++i) {
        if (t->shape[i] != (uint64_t)dims[i]) {
            errorf("%s: tensor '%s' dimension %d is %llu, config.txt implies %d", f->path, name, i,
                  (unsigned long long)t->shape[i], dims[i]);
            return NULL;
        }
        count *= (uint64_t)dims[i];
    }
    if (t->begin > t->end || t->end > f->data_size || t->end - t->begin != count * 4) {
        errorf("%s: tensor '%s' data_offsets [%llu, %llu] do not fit %llu floats in %llu data bytes",
              f->path, name, (unsigned long long)t->begin, (unsigned long long)t->end,
              (unsigned long long)count, (unsigned long long)f->data_size);
        return NULL;
    }
    if (!(out = alloc_floats((size_t)count))) return NULL;
    for (uint64_t i = 0; i < count; ++i) out[i] = load_f32_le(f->data + t->begin + 4 * i);
    return out;
}

/* ==================================================================================
   5. The model's memory
      The layers of a model fall into groups that share one cache policy and shape:
      a model whose layers are all alike is one group, of the kind under test; a
      hybrid model gets one group per layer type - sliding layers in a ROTATING cache
      of the model's window, full layers in a FULL cache, conv layers' states in a
      RECURRENT cache (per layer the last L-1 vectors s = B*u, all a conv layer needs
      of the past). On the CPU the groups are one kvc_memory: one budget, each call
      all or nothing across the groups, checkpoints named inside a batch, prefix reuse
      over every group (kvc_prefix_create_memory).
      --vk: the same memory on the device (kvc_vk_memory_create: one budget, each
      group's pages in device memory that follows use, the conv states in a device
      state pool), driven by the same kvc_memory_* calls on its host side; only the
      per-layer data goes through kvcache_vk.h (append + attention per KV layer, the
      conv state read, advanced on the host and written back, checkpoints handed over
      with kvc_vk_cmd_state_checkpoint). Only memory_create / _free / _attention /
      _state* know which of the two a session has.
   ================================================================================== */

typedef struct mem_group {
    layer_type type;       /* of its layers */
    kvc_kind kind;         /* its cache's kind */
    int32_t window;        /* the window kvc_attention applies (desc.window), 0: none */
    int32_t n_layers;
    int32_t layers[MAX_LAYERS]; /* the model layers, in order */
    int32_t capacity;      /* CAUSAL: cells */
    kvc_cache *cache;      /* the memory's (kvc_memory_group) */
} mem_group;

typedef struct memory {
    kvc_memory *mem;              /* --vk: the device memory's host side */
#ifdef TINYLM_VK
    kvc_vk_memory *vm;            /* --vk: the device memory; NULL on the CPU */
    kvc_vk_tensor live;           /* --vk: the conv layer's live state memory_state read */
    float *state;                 /* --vk: ... into this host copy (state floats) */
    size_t state_floats;
#endif
    int n;
    mem_group g[MAX_GROUPS];
    int32_t group_of[MAX_LAYERS]; /* model layer -> its group */
    int32_t index_of[MAX_LAYERS]; /* model layer -> layer within the group */
    size_t idle_bytes;            /* CPU: bytes in use when empty (a CAUSAL cache's cells) */
    size_t peak_bytes;            /* CPU: the most bytes in use seen after a begin */
} memory;

/* Every group's state at one position (a branch point). */
typedef struct memory_snapshot {
    int32_t offset;                 /* the position it restores; -1: none held */
    kvc_memory_snapshot *ms;        /* not for a CAUSAL group */
    kvc_snapshot *snap[MAX_GROUPS]; /* a CAUSAL group: its kvc_seq_snapshot of sequence 0 */
} memory_snapshot;

static void setup_rotating(kvc_cache_config *cc, const config *c, int32_t max_tokens, int32_t max_batch);

/* Layers "0,1,3" of a group into buf. */
static const char *group_layers(const mem_group *g, char *buf, size_t cap)
{
    size_t len = 0;
    buf[0] = 0;
    for (int i = 0; i < g->n_layers && len + 1 < cap; ++i)
        len += (size_t)snprintf(buf + len, cap - len, "%s%d", i ? "," : "", (int)g->layers[i]);
    return buf;
}

static const char *group_kind_name(const mem_group *g)
{
    return g->kind == KVC_KIND_FULL ? "full" : g->kind == KVC_KIND_ROTATING ? "rotating"
         : g->kind == KVC_KIND_CAUSAL ? "causal" : "recurrent";
}

/* Which layers go in which group, and each group's kind: with uniform == NULL one
   group per layer type - sliding layers ROTATING, full layers FULL, conv layers
   RECURRENT - otherwise one group of uniform->kind for every layer. */
static void memory_layout(memory *M, const config *c, const kind_spec *uniform)
{
    memset(M, 0, sizeof *M);
    for (int l = 0; l < c->layers; ++l) {
        int i = 0;
        mem_group *g;
        while (!uniform && i < M->n && M->g[i].type != c->type[l]) ++i;
        if (i == M->n) {
            M->g[i].type = c->type[l];
            M->g[i].kind = uniform ? uniform->kind
                         : c->type[l] == LAYER_SLIDING ? KVC_KIND_ROTATING
                         : c->type[l] == LAYER_CONV ? KVC_KIND_RECURRENT : KVC_KIND_FULL;
            M->n++;
        }
        g = &M->g[i];
        M->group_of[l] = i;
        M->index_of[l] = g->n_layers;
        g->layers[g->n_layers++] = l;
    }
}

/* Builds the memory of model config c for kind ks (a hybrid kind: one group per layer
   type; otherwise one group of ks->kind), storage type `type` for K and V. */
static int memory_create(memory *M, const config *c, const kind_spec *ks, kvc_type type, uint32_t rotate,
                         int32_t max_tokens, int32_t max_batch)
{
    kvc_group_config gc[MAX_GROUPS];
    memory_layout(M, c, ks->hybrid ? NULL : ks);
    memset(gc, 0, sizeof gc);
    for (int i = 0; i < M->n; ++i) {
        mem_group *g = &M->g[i];
        kvc_pool_config *pc = &gc[i].pool;
        kvc_cache_config *cc = &gc[i].cache;
        KVC_CHECK(kvc_pool_config_init(pc));
        pc->n_layers = g->n_layers;
        if (g->kind == KVC_KIND_RECURRENT) {
            pc->state_floats = conv_state_floats(c); /* the last L-1 vectors s */
        } else { /* K/V in pages of PAGE_CELLS tokens of the group's layers */
            pc->n_kv_heads = c->kv;
            pc->head_dim_k = c->hd;
            pc->head_dim_v = c->hd;
            pc->type_k = type;
            pc->type_v = type;
            pc->rotate = rotate;
            pc->page_cells = PAGE_CELLS;
        }
        KVC_CHECK(kvc_cache_config_init(cc, g->kind));
        if (!ks->hybrid) ks->setup(cc, c, max_tokens, max_batch);
        else if (g->kind == KVC_KIND_ROTATING) setup_rotating(cc, c, max_tokens, max_batch);
        if (g->kind == KVC_KIND_ROTATING || g->kind == KVC_KIND_RECURRENT) cc->checkpoints = KEEP_CHECKPOINTS;
        if ((g->kind == KVC_KIND_FULL || g->kind == KVC_KIND_ROTATING) && (type == KVC_TYPE_Q8_0 || type == KVC_TYPE_Q4_0))
            cc->f16_tail = g_f16_tail;
#ifdef TINYLM_VK
        if (g_vk.on) cc->f16_tail = 0; /* device pools keep no tail */
#endif
        g->capacity = cc->capacity;
        /* a causal cache applies its own window; the others get the layers' in desc.window */
        g->window = g->kind != KVC_KIND_CAUSAL && g->type == LAYER_SLIDING ? c->window : 0;
    }
    {
        kvc_memory_config mc;
        const char *field = NULL;
        kvc_result r;
        KVC_CHECK(kvc_memory_config_init(&mc));
        mc.n_layers = c->layers;
        mc.layer_group = M->group_of;
        mc.n_groups = M->n;
        mc.groups = gc;
        mc.budget_bytes = g_budget_bytes;
        if ((r = kvc_memory_config_check(&mc, &field)) != KVC_OK) {
            errorf("kvc_memory_config_check: %s (field %s)", kvc_strerror(r), field ? field : "?");
            goto fail;
        }
#ifdef TINYLM_VK
        if (g_vk.on) { /* the same bookkeeping on the host, the pages and states on the GPU */
            KVC_CHECK(kvc_vk_memory_create(g_vk.ctx, &mc, NULL, &M->vm));
            M->mem = kvc_vk_memory_host(M->vm);
            M->state_floats = (size_t)conv_state_floats(c);
            if (M->state_floats && !(M->state = alloc_floats(M->state_floats))) goto fail;
        } else
#endif
            KVC_CHECK(kvc_memory_create(&mc, &M->mem));
        for (int i = 0; i < M->n; ++i) KVC_CHECK(kvc_memory_group(M->mem, i, &M->g[i].cache));
        {
            kvc_memory_stats st; /* a CAUSAL cache has taken all its pages already */
            KVC_CHECK(kvc_memory_stats_get(M->mem, &st));
            M->idle_bytes = M->peak_bytes = st.bytes_used;
        }
    }
    return 0;
fail:
    errorf("cannot create the model's memory");
    return -1;
}

/* Destroys the memory (every snapshot and prefix object on it must be gone) after
   checking that nothing but its caches held pages: the memory cleared, the bytes in
   use those it had when created.
   (A snapshot still alive keeps a kvc_memory's pools alive after kvc_memory_destroy:
   a leak the sanitizer builds report.) Prints one line labelled
   with the kind and type. Returns the number of failures (a leak or an error). */
static int memory_free(memory *M, const char *kind_name, const char *type_name)
{
    int failures = 0;
    if (M->mem) {
        kvc_memory_stats st;
        char groups[160] = "", layers[64];
        size_t len = 0;
        int leak;
        if (kvc_memory_clear(M->mem) != KVC_OK || kvc_memory_stats_get(M->mem, &st) != KVC_OK) {
            errorf("kvc_memory_clear or kvc_memory_stats_get failed");
            failures++;
        } else {
            for (int i = 0; i < M->n && len + 1 < sizeof groups; ++i)
                len += (size_t)snprintf(groups + len, sizeof groups - len, "%s%s %s", i ? ", " : "",
                                        group_kind_name(&M->g[i]), group_layers(&M->g[i], layers, sizeof layers));
            leak = st.bytes_used != M->idle_bytes;
            if (!g_quiet || leak)
                printf("  %-9s %-9s %-8s memory (%s): peak %.0f KiB of %.0f KiB, after teardown %lu bytes%s\n", "",
                       kind_name, type_name, groups, M->peak_bytes / 1024.0, st.budget_bytes / 1024.0,
                       (unsigned long)st.bytes_used, leak ? "  FAIL: leak" : "  ok");
            failures += leak;
        }
#ifdef TINYLM_VK
        if (M->vm) {
            if (kvc_vk_memory_destroy(M->vm) != KVC_OK) failures++, errorf("kvc_vk_memory_destroy failed");
            free(M->state);
        } else
#endif
        if (kvc_memory_destroy(M->mem) != KVC_OK) failures++, errorf("kvc_memory_destroy failed");
    }
    memset(M, 0, sizeof *M);
    return failures;
}

/* The tokens the memory holds: the position of the next token. */
static int memory_offset(const memory *M, int32_t *offset)
{
    KVC_CHECK(kvc_memory_offset(M->mem, offset));
    return 0;
fail:
    return -1;
}

/* Opens a forward pass of n tokens on every group, all or nothing, naming the
   checkpoints at[0..n_at) inside it: the only call of the pass that takes pages
   (a CAUSAL cache: sequence 0's next positions). */
static int memory_begin(memory *M, int32_t n, const int32_t *at, int32_t n_at)
{
    kvc_memory_stats st;
    KVC_CHECK(kvc_memory_begin(M->mem, n, at, n_at));
    KVC_CHECK(kvc_memory_stats_get(M->mem, &st));
    if (st.bytes_used > M->peak_bytes) M->peak_bytes = st.bytes_used;
    return 0;
fail:
    return -1;
}

/* Abandons the pass memory_begin opened. Refused (KVC_ERR_RECURRENT) once a conv
   layer has updated its state in place: a recurrent state has no way back. */
static int memory_cancel(memory *M)
{
    KVC_CHECK(kvc_memory_cancel(M->mem));
    return 0;
fail:
    return -1;
}

/* kvc_put + kvc_attention of model layer `layer`; desc->pos and desc->window are set
   here from its group (the q, k, v, out sizes in floats are for the Vulkan path's
   buffers). */
static int memory_attention(memory *M, int32_t layer, const float *k, const float *v, kvc_attention_desc *desc,
                            size_t kv_floats, size_t q_floats, size_t out_floats)
{
    const mem_group *g = &M->g[M->group_of[layer]];
    if (g->kind == KVC_KIND_CAUSAL) desc->pos = NULL; /* NULL = the batch's own queries */
    desc->window = g->window;
    (void)kv_floats, (void)q_floats, (void)out_floats;
#ifdef TINYLM_VK
    if (M->vm) { /* the group's device pool, cache and layer */
        kvc_vk_pool *pool;
        kvc_cache *cache;
        int32_t gl;
        KVC_CHECK(kvc_vk_memory_layer(M->vm, NULL, layer, &pool, &cache, &gl));
        KVC_CHECK(vk_put_attention(pool, cache, gl, k, v, kv_floats, desc, q_floats, out_floats));
        return 0;
    }
#endif
    KVC_CHECK(kvc_memory_put(M->mem, layer, k, v));
    KVC_CHECK(kvc_memory_attention(M->mem, layer, desc));
    return 0;
fail:
    return -1;
}

/* The live (L-1) x hidden state of conv layer `layer`, to read and advance in place
   during the open pass (counts as the layer's put). */
static int memory_state(memory *M, int32_t layer, float **state)
{
#ifdef TINYLM_VK
    if (M->vm) { /* where the live state is (made private for the pass), copied to the host */
        VkCommandBuffer cmd;
        kvc_vk_pool *pool;
        kvc_cache *cache;
        int32_t gl;
        kvc_result r;
        KVC_CHECK(kvc_vk_memory_layer(M->vm, NULL, layer, &pool, &cache, &gl));
        KVC_CHECK(kvc_vk_context_begin(g_vk.ctx, &cmd));
        r = kvc_vk_cmd_state(pool, cmd, cache, 0, gl, &M->live);
        KVC_CHECK(kvc_vk_context_submit_wait(g_vk.ctx, cmd));
        KVC_CHECK(r);
        KVC_CHECK(kvc_vk_buffer_download(g_vk.ctx, M->live.buffer, M->live.offset, M->state, M->state_floats * sizeof(float)));
        *state = M->state;
        return 0;
    }
#endif
    KVC_CHECK(kvc_memory_state(M->mem, layer, 0, state));
    return 0;
fail:
    return -1;
}

/* The pass has advanced the state memory_state gave (--vk: written back to the device). */
static int memory_state_done(memory *M)
{
#ifdef TINYLM_VK
    if (M->vm) KVC_CHECK(kvc_vk_buffer_upload(g_vk.ctx, M->live.buffer, M->live.offset, M->state, M->state_floats * sizeof(float)));
    return 0;
fail:
    return -1;
#else
    (void)M;
    return 0;
#endif
}

/* Hands a copy of conv layer `layer`'s state after `at` tokens (a checkpoint named
   inside the open pass) to the memory. */
static int memory_state_checkpoint(memory *M, int32_t layer, int32_t at, const float *state)
{
#ifdef TINYLM_VK
    if (M->vm) { /* from a host-visible buffer of ours */
        VkCommandBuffer cmd;
        kvc_vk_pool *pool;
        kvc_cache *cache;
        kvc_vk_tensor src;
        int32_t gl;
        kvc_result r;
        if (vk_buffer(&g_vk.state, M->state_floats * sizeof(float)) != 0) return -1;
        memcpy(g_vk.state.mapped, state, M->state_floats * sizeof(float));
        memset(&src, 0, sizeof src);
        src.buffer = g_vk.state.buffer;
        KVC_CHECK(kvc_vk_memory_layer(M->vm, NULL, layer, &pool, &cache, &gl));
        KVC_CHECK(kvc_vk_context_begin(g_vk.ctx, &cmd));
        r = kvc_vk_cmd_state_checkpoint(pool, cmd, cache, gl, at, &src);
        KVC_CHECK(kvc_vk_context_submit_wait(g_vk.ctx, cmd));
        KVC_CHECK(r);
        return 0;
    }
#endif
    KVC_CHECK(kvc_memory_state_checkpoint(M->mem, layer, at, state));
    return 0;
fail:
    return -1;
}

/* Prefix reuse over every group (not for CAUSAL: see the causal kind's hooks). */
static int memory_prefix_create(memory *M, int32_t max_tokens, kvc_prefix **out)
{
    KVC_CHECK(kvc_prefix_create_memory(M->mem, max_tokens, out));
    return 0;
fail:
    return -1;
}

/* Offsets below the current one that every group can go back to (-1 on error). */
static int32_t memory_checkpoints(const memory *M)
{
    kvc_memory_stats st;
    if (kvc_memory_stats_get(M->mem, &st) != KVC_OK) return -1;
    return st.n_checkpoints;
}

/* Frees a snapshot's parts; *snap holds none after. */
static int memory_snapshot_free(memory_snapshot *snap)
{
    int rc = kvc_memory_snapshot_free(snap->ms) != KVC_OK;
    for (int i = 0; i < MAX_GROUPS; ++i) rc |= kvc_snapshot_free(snap->snap[i]) != KVC_OK;
    memset(snap, 0, sizeof *snap);
    snap->offset = -1;
    return rc ? -1 : 0;
}

/* Every group's state at the current position into *out (freed first): O(pages),
   pages shared (a CAUSAL cache: kvc_seq_snapshot copies sequence 0's cells). */
static int memory_snapshot_take(memory *M, memory_snapshot *out)
{
    int32_t offset;
    if (memory_snapshot_free(out) != 0 || memory_offset(M, &offset) != 0) return -1;
    if (M->g[0].kind != KVC_KIND_CAUSAL) KVC_CHECK(kvc_memory_snapshot_take(M->mem, 0, offset, &out->ms));
    else KVC_CHECK(kvc_seq_snapshot(M->g[0].cache, 0, &out->snap[0]));
    out->offset = offset;
    return 0;
fail:
    memory_snapshot_free(out); /* all or nothing */
    return -1;
}

/* Every group back to snapshot *snap, at its position (kvc_memory_restore: all or
   nothing; a CAUSAL memory is one group). */
static int memory_restore(memory *M, const memory_snapshot *snap)
{
    if (snap->offset < 0) {
        errorf("no snapshot to restore");
        return -1;
    }
    if (M->g[0].kind != KVC_KIND_CAUSAL) {
        if (snap->ms) KVC_CHECK(kvc_memory_restore(M->mem, snap->ms, snap->offset));
        else KVC_CHECK(kvc_memory_clear(M->mem));
        return 0;
    }
    if (snap->snap[0]) KVC_CHECK(kvc_seq_restore(M->g[0].cache, snap->snap[0], 0)); /* drops what seq 0 had */
    else KVC_CHECK(kvc_seq_remove(M->g[0].cache, 0, 0, KVC_POS_END));
    return 0;
fail:
    return -1;
}

/* ==================================================================================
   6. The model
   ================================================================================== */

typedef struct layer_weights {
    float *attn_norm;           /* [hidden]: the norm before the attention or conv block */
    float *wq, *wk, *wv, *wo;   /* [heads*hd][hidden], [kv*hd][hidden] x2, [hidden][heads*hd] */
    float *bq, *bk, *bv, *bo;   /* attention_bias: [heads*hd], [kv*hd] x2, [hidden] */
    float *bgate, *bup, *bdown; /* mlp_bias: [inter] x2, [hidden] */
    float *q_norm, *k_norm;     /* [hd] each, with qk_norm */
    float *conv_in;             /* conv layers: [3*hidden][hidden], rows B, C, u */
    float *conv_w;              /* [hidden][1][L] depthwise kernel */
    float *conv_out;            /* [hidden][hidden] */
    float *conv_in_b, *conv_b, *conv_out_b; /* conv_bias: [3*hidden], [hidden], [hidden] */
    float *mlp_norm;            /* [hidden] */
    float *gate, *up, *down;    /* [inter][hidden] x2, [hidden][inter] */
} layer_weights;

typedef struct model {
    config c;
    float *embed;               /* [vocab][hidden] */
    float *norm;                /* [hidden] */
    float *lm_head;             /* [vocab][hidden]; tied: the embedding itself */
    layer_weights *layers;
} model;

/* Hugging Face tensor names: model.layers.N.<name>.weight, and the final norm. */
typedef struct weight_names {
    const char *attn_norm, *q, *k, *v, *o, *q_norm, *k_norm, *mlp_norm, *gate, *up, *down, *final_norm;
} weight_names;

static const weight_names LLAMA_NAMES = { /* Llama, Mistral, Qwen3 */
    "input_layernorm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
    "self_attn.q_norm", "self_attn.k_norm", "post_attention_layernorm", "mlp.gate_proj", "mlp.up_proj",
    "mlp.down_proj", "model.norm.weight"};
static const weight_names LFM2_NAMES = { /* w1 gates, w3 is up, w2 down; embedding_norm is the final norm */
    "operator_norm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.out_proj",
    "self_attn.q_layernorm", "self_attn.k_layernorm", "ffn_norm", "feed_forward.w1", "feed_forward.w3",
    "feed_forward.w2", "model.embedding_norm.weight"};

static void model_free(model *m)
{
    if (m->layers)
        for (int l = 0; l < m->c.layers; ++l) {
            layer_weights *w = &m->layers[l];
            free(w->attn_norm), free(w->wq), free(w->wk), free(w->wv), free(w->wo);
            free(w->q_norm), free(w->k_norm), free(w->conv_in), free(w->conv_w), free(w->conv_out);
            free(w->conv_in_b), free(w->conv_b), free(w->conv_out_b);
            free(w->bq), free(w->bk), free(w->bv), free(w->bo), free(w->bgate), free(w->bup), free(w->bdown);
            free(w->mlp_norm), free(w->gate), free(w->up), free(w->down);
        }
    free(m->layers);
    if (m->lm_head != m->embed) free(m->lm_head);
    free(m->embed), free(m->norm);
    memset(m, 0, sizeof *m);
}

static int model_load(model *m, const char *dir)
{
    char path[1024], name[160];
    st_file f;
    const config *c = &m->c;
    const weight_names *nm;
    int ok;

    memset(m, 0, sizeof *m);
    if (load_config(dir, &m->c) != 0) return -1;
    nm = c->arch == ARCH_LFM2 ? &LFM2_NAMES : &LLAMA_NAMES;
    join_path(path, sizeof path, dir, "model.safetensors");
    if (st_open(&f, path) != 0) return -1;
    m->layers = (layer_weights *)calloc((size_t)c->layers, sizeof *m->layers);
    {
        const int d_vocab[2] = {c->vocab, c->hidden}, d_hidden[1] = {c->hidden}, d_hd[1] = {c->hd};
        const int d_q[2] = {c->heads * c->hd, c->hidden}, d_kv[2] = {c->kv * c->hd, c->hidden};
        const int d_o[2] = {c->hidden, c->heads * c->hd};
        const int d_up[2] = {c->inter, c->hidden}, d_down[2] = {c->hidden, c->inter};
        const int d_conv_in[2] = {3 * c->hidden, c->hidden}, d_conv_w[3] = {c->hidden, 1, c->conv_L};
        const int d_conv_out[2] = {c->hidden, c->hidden}, d_conv_in_b[1] = {3 * c->hidden};
        const int d_qb[1] = {c->heads * c->hd}, d_kvb[1] = {c->kv * c->hd}, d_inter[1] = {c->inter};
        ok = m->layers != NULL;
        ok = ok && (m->embed = st_load(&f, "model.embed_tokens.weight", 2, d_vocab)) != NULL;
        ok = ok && (m->norm = st_load(&f, nm->final_norm, 1, d_hidden)) != NULL;
        if (c->tied) m->lm_head = m->embed;
        else ok = ok && (m->lm_head = st_load(&f, "lm_head.weight", 2, d_vocab)) != NULL;
        /* LOAD: tensor model.layers.<l>.<suffix>.weight of shape dims into w->field;
           LOAD_AS: model.layers.<l>.<suffix>.<what> (a bias) */
#define LOAD(field, suffix, dims)                                                    \
    LOAD_AS(field, suffix, "weight", dims)
#define LOAD_AS(field, suffix, what, dims)                                           \
    (snprintf(name, sizeof name, "model.layers.%d.%s.%s", l, suffix, what),         \
     (w->field = st_load(&f, name, (int)(sizeof dims / sizeof dims[0]), dims)) != NULL)
        for (int l = 0; ok && l < c->layers; ++l) {
            layer_weights *w = &m->layers[l];
            ok = LOAD(attn_norm, nm->attn_norm, d_hidden) && LOAD(mlp_norm, nm->mlp_norm, d_hidden) &&
                 LOAD(gate, nm->gate, d_up) && LOAD(up, nm->up, d_up) && LOAD(down, nm->down, d_down) &&
                 (!c->mlp_bias || (LOAD_AS(bgate, nm->gate, "bias", d_inter) &&
                                   LOAD_AS(bup, nm->up, "bias", d_inter) && LOAD_AS(bdown, nm->down, "bias", d_hidden)));
            if (ok && c->type[l] == LAYER_CONV)
                ok = LOAD(conv_in, "conv.in_proj", d_conv_in) && LOAD(conv_w, "conv.conv", d_conv_w) &&
                     LOAD(conv_out, "conv.out_proj", d_conv_out) &&
                     (!c->conv_bias || (LOAD_AS(conv_in_b, "conv.in_proj", "bias", d_conv_in_b) &&
                                        LOAD_AS(conv_b, "conv.conv", "bias", d_hidden) &&
                                        LOAD_AS(conv_out_b, "conv.out_proj", "bias", d_hidden)));
            else if (ok)
                ok = LOAD(wq, nm->q, d_q) && LOAD(wk, nm->k, d_kv) && LOAD(wv, nm->v, d_kv) && LOAD(wo, nm->o, d_o) &&
                     (!c->qk_norm || (LOAD(q_norm, nm->q_norm, d_hd) && LOAD(k_norm, nm->k_norm, d_hd))) &&
                     (!c->attn_bias || (LOAD_AS(bq, nm->q, "bias", d_qb) && LOAD_AS(bk, nm->k, "bias", d_kvb) &&
                                        LOAD_AS(bv, nm->v, "bias", d_kvb) && LOAD_AS(bo, nm->o, "bias", d_hidden)));
        }
#undef LOAD
#undef LOAD_AS
    }
    st_close(&f);
    if (!ok) {
        if (!m->layers) errorf("out of memory");
        model_free(m);
        return -1;
    }
    return 0;
}

/* --- The math ------------------------------------------------------------------- */

/* y[n][out] = x[n][in] . W^T, with W [out][in] row-major (a Linear without bias). */
static void matmul(float *y, const float *x, const float *w, int n, int in, int out)
{
    for (int i = 0; i < n; ++i)
        for (int o = 0; o < out; ++o) {
            const float *a = x + (size_t)i * in, *b = w + (size_t)o * in;
            float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0}, s = 0; /* 8 partial sums: vectorizes */
            int k = 0;
            for (; k + 8 <= in; k += 8)
                for (int u = 0; u < 8; ++u) acc[u] += a[k + u] * b[k + u];
            for (; k < in; ++k) s += a[k] * b[k];
            for (int u = 0; u < 8; ++u) s += acc[u];
            y[(size_t)i * out + o] = s;
        }
}

/* y[n][d] += b[d] (a Linear's bias; b == NULL: none). */
static void add_bias(float *y, const float *b, int n, int d)
{
    for (int i = 0; b && i < n; ++i)
        for (int k = 0; k < d; ++k) y[(size_t)i * d + k] += b[k];
}

/* y = x / sqrt(mean(x^2) + eps) * g for each of n rows of size d. */
static void rmsnorm(float *y, const float *x, const float *g, int n, int d, double eps)
{
    for (int i = 0; i < n; ++i) {
        const float *xi = x + (size_t)i * d;
        double ss = 0;
        for (int k = 0; k < d; ++k) ss += (double)xi[k] * xi[k];
        {
            float r = (float)(1.0 / sqrt(ss / d + eps));
            for (int k = 0; k < d; ++k) y[(size_t)i * d + k] = xi[k] * r * g[k];
        }
    }
}

/* NeoX ("rotate half") RoPE, in place, on v [n][n_heads][hd]: for i < hd/2 the
   pair (v[i], v[i+hd/2]) turns by pos * theta^(-2i/hd). */
static void rope(float *v, int n, int n_heads, int hd, const int32_t *pos, double theta)
{
    const int half = hd / 2;
    for (int t = 0; t < n; ++t)
        for (int i = 0; i < half; ++i) {
            double angle = pos[t] * pow(theta, -2.0 * i / hd);
            float c = (float)cos(angle), s = (float)sin(angle);
            for (int h = 0; h < n_heads; ++h) {
                float *x = v + ((size_t)t * n_heads + h) * hd;
                float a = x[i], b = x[i + half];
                x[i] = a * c - b * s;
                x[i + half] = b * c + a * s;
            }
        }
}

static float silu(float x) { return x / (1.0f + expf(-x)); }

static int argmax(const float *x, int n)
{
    int best = 0;
    for (int i = 1; i < n; ++i)
        if (x[i] > x[best]) best = i;
    return best;
}

/* Cache-free attention (the --reference mode): the n tokens of the batch attend
   to each other only, causally and within the sliding window. q [n][heads][hd],
   k, v [n][kv][hd], out [n][heads][hd]; window: the layer's (0: none). */
static void naive_attention(float *out, const float *q, const float *k, const float *v,
                            const int32_t *pos, int n, const config *c, int window)
{
    const int group = c->heads / c->kv;
    const double scale = 1.0 / sqrt((double)c->hd);
    double *w = (double *)malloc((size_t)n * sizeof *w);
    if (!w) abort(); /* the reference mode is a debugging aid: keep it short */
    for (int i = 0; i < n; ++i)
        for (int h = 0; h < c->heads; ++h) {
            const float *qi = q + ((size_t)i * c->heads + h) * c->hd;
            float *oi = out + ((size_t)i * c->heads + h) * c->hd;
            double max = -INFINITY, sum = 0;
            for (int j = 0; j < n; ++j) {
                const float *kj = k + ((size_t)j * c->kv + h / group) * c->hd;
                int visible = pos[j] <= pos[i] && (window == 0 || pos[i] - pos[j] < window);
                double s = 0;
                for (int d = 0; visible && d < c->hd; ++d) s += (double)qi[d] * kj[d];
                w[j] = visible ? s * scale : -INFINITY;
                if (w[j] > max) max = w[j];
            }
            for (int j = 0; j < n; ++j) sum += w[j] = w[j] == -INFINITY ? 0 : exp(w[j] - max);
            for (int d = 0; d < c->hd; ++d) {
                double acc = 0;
                for (int j = 0; j < n; ++j)
                    if (w[j] != 0) acc += w[j] * v[((size_t)j * c->kv + h / group) * c->hd + d];
                oi[d] = (float)(acc / sum);
            }
        }
    free(w);
}

/* LFM2's gated short convolution of n tokens, h [n][hidden] -> y [n][hidden] (before
   out_proj): [B | C | u] = in_proj h, s = B * u per channel, a causal depthwise
   convolution over the last L vectors s of each channel (plus conv.bias, which Hugging
   Face's Conv1d adds inside the convolution), y = C * conv. `state` holds
   the L-1 vectors s before this batch (oldest first) and is advanced to the batch's
   last L-1. bcu [n][3*hidden] and s_all [L-1+n][hidden] are working memory. */
static void short_conv(float *y, const float *h, const layer_weights *w, float *state, int n,
                       const config *c, float *bcu, float *s_all)
{
    const int H = c->hidden, L = c->conv_L;
    const size_t past = (size_t)(L - 1) * H;
    matmul(bcu, h, w->conv_in, n, H, 3 * H);
    add_bias(bcu, w->conv_in_b, n, 3 * H);
    memcpy(s_all, state, past * sizeof *s_all);
    for (int t = 0; t < n; ++t)
        for (int ch = 0; ch < H; ++ch)
            s_all[past + (size_t)t * H + ch] = bcu[(size_t)t * 3 * H + ch] * bcu[(size_t)t * 3 * H + 2 * H + ch];
    /* token t sees s rows t .. t+L-1 of s_all; w[ch][0][L-1] weighs the current one */
    for (int t = 0; t < n; ++t)
        for (int ch = 0; ch < H; ++ch) {
            float acc = w->conv_b ? w->conv_b[ch] : 0;
            for (int k = 0; k < L; ++k) acc += w->conv_w[(size_t)ch * L + k] * s_all[(size_t)(t + k) * H + ch];
            y[(size_t)t * H + ch] = bcu[(size_t)t * 3 * H + H + ch] * acc;
        }
    memcpy(state, s_all + (size_t)n * H, past * sizeof *state);
}

/* One forward pass over n tokens at positions pos0 .. pos0+n-1.

   With a memory M, attention goes through kvcache.h: memory_begin opens the pass on
   every group (kvc_memory_begin), naming the checkpoints at[0..n_at) inside it; then
   per attention layer the batch's K and V are put and the queries attend to every
   cell they may see, and a conv layer advances its state in place (kvc_memory_state)
   and hands over a copy of it at each checkpoint inside the batch
   (kvc_memory_state_checkpoint; the batch's end is the live state). With M == NULL
   the batch must be the whole sequence (pos0 == 0): naive attention, conv states
   from zeros.

   Logits are computed for the batch rows first_row .. n-1 only (prefill needs just
   the last one) into logits [n - first_row][vocab]; logits == NULL: none. */
static int forward(const model *m, memory *M, const int32_t *tokens, int n, int32_t pos0, const int32_t *at,
                   int n_at, int first_row, float *logits)
{
    const config *c = &m->c;
    const int H = c->hidden, QD = c->heads * c->hd, KD = c->kv * c->hd;
    const int has_conv = c->conv_L > 0;
    const size_t state_floats = has_conv ? (size_t)(c->conv_L - 1) * H : 0;
    float *x = alloc_floats((size_t)n * H), *h = alloc_floats((size_t)n * H);
    float *q = alloc_floats((size_t)n * QD), *att = alloc_floats((size_t)n * (QD > H ? QD : H));
    float *k = alloc_floats((size_t)n * KD), *v = alloc_floats((size_t)n * KD);
    float *gate = alloc_floats((size_t)n * c->inter), *up = alloc_floats((size_t)n * c->inter);
    float *bcu = has_conv ? alloc_floats((size_t)n * 3 * H) : NULL;
    float *s_all = has_conv ? alloc_floats(state_floats + (size_t)n * H) : NULL;
    /* --reference: each conv layer's state, from zeros */
    float *ref_state = has_conv && !M ? (float *)calloc((size_t)c->layers * state_floats + 1, sizeof *ref_state) : NULL;
    int32_t *pos = (int32_t *)malloc((size_t)n * sizeof *pos);
    int32_t offset;
    int begun = 0, rc = -1;

    if (!x || !h || !q || !att || !k || !v || !gate || !up || !pos ||
        (has_conv && (!bcu || !s_all || (!M && !ref_state))))
        goto fail;
    for (int i = 0; i < n; ++i) {
        pos[i] = pos0 + i;
        memcpy(x + (size_t)i * H, m->embed + (size_t)tokens[i] * H, (size_t)H * sizeof *x);
    }
    if (M) {
        if (memory_offset(M, &offset) != 0) goto fail;
        if (offset != pos0) { /* the engine's position count and the memory's must agree */
            errorf("the memory holds %d tokens, the batch starts at position %d", (int)offset, (int)pos0);
            goto fail;
        }
        if (memory_begin(M, n, at, n_at) != 0) goto fail; /* the only call that takes pages */
        begun = 1;
    }
    for (int l = 0; l < c->layers; ++l) {
        const layer_weights *w = &m->layers[l];
        rmsnorm(h, x, w->attn_norm, n, H, c->eps);
        if (c->type[l] == LAYER_CONV) {
            /* conv block: the state in place; s_all row t.. holds the state after t tokens */
            float *state;
            if (!M) state = ref_state + (size_t)l * state_floats;
            else if (memory_state(M, l, &state) != 0) goto fail;
            short_conv(att, h, w, state, n, c, bcu, s_all);
            if (M && memory_state_done(M) != 0) goto fail;
            for (int i = 0; M && i < n_at && at[i] < pos0 + n; ++i)
                if (memory_state_checkpoint(M, l, at[i], s_all + (size_t)(at[i] - pos0) * H) != 0) goto fail;
            matmul(h, att, w->conv_out, n, H, H);
            add_bias(h, w->conv_out_b, n, H);
        } else {
            /* attention block */
            const int window = c->type[l] == LAYER_SLIDING ? c->window : 0;
            matmul(q, h, w->wq, n, H, QD);
            matmul(k, h, w->wk, n, H, KD);
            matmul(v, h, w->wv, n, H, KD);
            add_bias(q, w->bq, n, QD), add_bias(k, w->bk, n, KD), add_bias(v, w->bv, n, KD);
            if (c->qk_norm) { /* per head, before RoPE: the cache holds normalised keys */
                rmsnorm(q, q, w->q_norm, n * c->heads, c->hd, c->eps);
                rmsnorm(k, k, w->k_norm, n * c->kv, c->hd, c->eps);
            }
            rope(q, n, c->heads, c->hd, pos, c->theta);
            rope(k, n, c->kv, c->hd, pos, c->theta);
            if (M) {
                kvc_attention_desc desc;
                memset(&desc, 0, sizeof desc);
                desc.n_queries = n;
                desc.n_heads = c->heads;
                desc.q = q;
                desc.pos = pos;   /* a causal group: NULL, set by memory_attention */
                desc.scale = 0;   /* 1/sqrt(head_dim) */
                desc.out = att;   /* desc.window: the group's, set by memory_attention */
                if (memory_attention(M, l, k, v, &desc, (size_t)n * KD, (size_t)n * QD, (size_t)n * QD) != 0)
                    goto fail;
            } else {
                naive_attention(att, q, k, v, pos, n, c, window);
            }
            matmul(h, att, w->wo, n, QD, H);
            add_bias(h, w->bo, n, H);
        }
        for (size_t i = 0; i < (size_t)n * H; ++i) x[i] += h[i];
        /* MLP block: down(silu(gate(h)) * up(h)) */
        rmsnorm(h, x, w->mlp_norm, n, H, c->eps);
        matmul(gate, h, w->gate, n, H, c->inter);
        matmul(up, h, w->up, n, H, c->inter);
        add_bias(gate, w->bgate, n, c->inter), add_bias(up, w->bup, n, c->inter);
        for (size_t i = 0; i < (size_t)n * c->inter; ++i) gate[i] = silu(gate[i]) * up[i];
        matmul(h, gate, w->down, n, c->inter, H);
        add_bias(h, w->bdown, n, H);
        for (size_t i = 0; i < (size_t)n * H; ++i) x[i] += h[i];
    }
    if (logits && first_row < n) {
        const size_t skip = (size_t)first_row * H;
        rmsnorm(h, x + skip, m->norm, n - first_row, H, c->eps);
        matmul(logits, h, m->lm_head, n - first_row, H, c->vocab);
    }
    rc = 0;
fail:
    if (rc != 0 && begun && memory_cancel(M) != 0) /* leave the memory as it was, if it can be */
        errorf("the memory cannot take the batch back: its state is lost");
    free(x), free(h), free(q), free(att), free(k), free(v), free(gate), free(up), free(pos);
    free(bcu), free(s_all), free(ref_state);
    return rc;
}

/* ==================================================================================
   7. reference.txt and NAME.logits.f32
      case NAME kind greedy|forced prompt_len N total_len T rows R min_top2_margin M
      tokens t0 t1 ... t(T-1)
   Row r of NAME.logits.f32 holds the logits at position N-1+r (R = T-N+1).
   ================================================================================== */

struct test_case {
    char name[64];
    int greedy;               /* 1: greedy, the tokens after the prompt are argmaxes */
    int32_t prompt_len;       /* N */
    int32_t total_len;        /* T */
    int32_t rows;             /* R */
    int32_t *tokens;          /* [T] */
    float *ref;               /* [R][vocab] */
    double ref_rms;           /* rms of ref: the logit scale s of error_bound */
};

static void cases_free(test_case *cases, int n)
{
    for (int i = 0; i < n; ++i) free(cases[i].tokens), free(cases[i].ref);
    free(cases);
}

static int load_cases(const char *dir, int vocab, test_case **out, int *n_out)
{
    char path[1024], word[64];
    unsigned char *text;
    const char *s;
    size_t size;
    test_case *cases = NULL;
    int n = 0;

    join_path(path, sizeof path, dir, "reference.txt");
    if (!(text = read_file(path, &size))) return -1;
    s = (const char *)text;
    while (next_word(&s, word, sizeof word)) {
        test_case *tc;
        char kind[64] = "";
        if (strcmp(word, "case") != 0) {
            errorf("%s: expected 'case', found '%s'", path, word);
            goto fail;
        }
        {
            test_case *grown = (test_case *)realloc(cases, (size_t)(n + 1) * sizeof *grown);
            if (!grown) {
                errorf("out of memory");
                goto fail;
            }
            cases = grown;
        }
        tc = &cases[n++];
        memset(tc, 0, sizeof *tc);
        tc->prompt_len = tc->total_len = tc->rows = -1;
        if (!next_word(&s, tc->name, sizeof tc->name)) goto truncated;
        /* key value pairs up to "tokens" */
        while (next_word(&s, word, sizeof word) && strcmp(word, "tokens") != 0) {
            char value[64];
            if (!next_word(&s, value, sizeof value)) goto truncated;
            if (!strcmp(word, "kind")) snprintf(kind, sizeof kind, "%s", value);
            else if (!strcmp(word, "prompt_len")) tc->prompt_len = atoi(value);
            else if (!strcmp(word, "total_len")) tc->total_len = atoi(value);
            else if (!strcmp(word, "rows")) tc->rows = atoi(value);
            /* min_top2_margin and unknown keys: informational */
        }
        if (strcmp(kind, "greedy") != 0 && strcmp(kind, "forced") != 0) {
            errorf("%s: case %s: kind must be greedy or forced, not '%s'", path, tc->name, kind);
            goto fail;
        }
        tc->greedy = !strcmp(kind, "greedy");
        if (tc->prompt_len < 1 || tc->total_len < tc->prompt_len ||
            tc->rows != tc->total_len - tc->prompt_len + 1) {
            errorf("%s: case %s: need 1 <= prompt_len <= total_len and rows = total_len - prompt_len + 1",
                  path, tc->name);
            goto fail;
        }
        if (!(tc->tokens = (int32_t *)malloc((size_t)tc->total_len * sizeof *tc->tokens))) goto fail;
        for (int i = 0; i < tc->total_len; ++i) {
            char *end;
            long t;
            if (!next_word(&s, word, sizeof word)) goto truncated;
            t = strtol(word, &end, 10);
            if (*end || t < 0 || t >= vocab) {
                errorf("%s: case %s: bad token '%s' (vocab %d)", path, tc->name, word, vocab);
                goto fail;
            }
            tc->tokens[i] = (int32_t)t;
        }
        /* the reference logits */
        {
            char lpath[1024], lname[96];
            unsigned char *raw;
            size_t lsize, count = (size_t)tc->rows * (size_t)vocab;
            snprintf(lname, sizeof lname, "%s.logits.f32", tc->name);
            join_path(lpath, sizeof lpath, dir, lname);
            if (!(raw = read_file(lpath, &lsize))) goto fail;
            if (lsize != count * 4) {
                errorf("%s: %lu bytes, expected rows %d x vocab %d x 4 = %lu", lpath, (unsigned long)lsize,
                      tc->rows, vocab, (unsigned long)(count * 4));
                free(raw);
                goto fail;
            }
            if (!(tc->ref = alloc_floats(count))) {
                free(raw);
                goto fail;
            }
            for (size_t i = 0; i < count; ++i) {
                tc->ref[i] = load_f32_le(raw + 4 * i);
                tc->ref_rms += (double)tc->ref[i] * tc->ref[i];
            }
            tc->ref_rms = sqrt(tc->ref_rms / (double)count);
            free(raw);
        }
    }
    free(text);
    if (n == 0) {
        errorf("%s: no cases", path);
        cases_free(cases, n);
        return -1;
    }
    *out = cases;
    *n_out = n;
    return 0;
truncated:
    errorf("%s: truncated", path);
fail:
    free(text);
    cases_free(cases, n);
    return -1;
}

/* ==================================================================================
   8. Sessions: one memory (its groups' caches) and its token record per (kind,
      type), through which every case of the model runs in order - so `reuse` finds
      what `base` left in the memory, and `branch_b` continues `branch_a` from its
      snapshot.
   ================================================================================== */

/* What a case measured against the reference. */
struct score {
    double max_err, sum_sq;   /* over every compared logit */
    long n_values;
    int rows;                 /* reference rows compared */
    int tok_ok, tok_total;    /* greedy tokens that matched */
    long tokens_run;          /* tokens pushed through the model */
    double seconds;
    int reused, reused_want;  /* tokens not recomputed, and what we expected */
    float *keep;              /* not NULL: every compared row's logits, at its row (--share-*) */
    char note[40];            /* printed after the result (causal: cells in use) */
};

struct session {
    const model *m;
    const kind_spec *ks;      /* the kind's hooks; NULL in --reference mode */
    int chunk;                /* prefill chunk size */
    memory mem;               /* the model's memory (unused in --reference mode) */
    kvc_cache *cache;         /* causal: the one group's cache */
    int32_t capacity;         /* causal: cells of the cache */
    kvc_prefix *prefix;       /* full, rotating, hybrid: the tokens the memory holds */
    int32_t *held;            /* causal: the same list kept here (kvc_prefix takes no */
    int32_t n_held, max_held; /* CAUSAL cache), the tokens held by position */
    /* The request in flight: its tokens are recorded (kvc_prefix_close) when the
       next one starts (or the session ends), so that a branch can still continue it. */
    int open;
    const int32_t *prompt;
    int32_t n_prompt;
    const int32_t *generated;
    int32_t n_generated;
    /* The branch point: a snapshot taken after a prompt, that prompt and its last logits. */
    memory_snapshot branch;   /* offset -1: none */
    const int32_t *snap_prompt;
    int32_t snap_prompt_len;
    float *snap_logits;       /* [vocab] */
};

/* Compares one computed logits row with reference row `row` of the case; for
   greedy cases also checks that its argmax is the reference's next token. */
static void score_row(score *sc, const test_case *tc, int vocab, int row, const float *logits)
{
    const float *ref = tc->ref + (size_t)row * vocab;
    for (int i = 0; i < vocab; ++i) {
        double d = fabs((double)logits[i] - ref[i]);
        if (!(d <= sc->max_err)) sc->max_err = d; /* also catches NaN */
        sc->sum_sq += d * d;
    }
    sc->n_values += vocab;
    sc->rows++;
    if (sc->keep) memcpy(sc->keep + (size_t)row * vocab, logits, (size_t)vocab * sizeof *logits);
    if (tc->greedy && row + 1 < tc->rows) {
        sc->tok_total++;
        sc->tok_ok += argmax(logits, vocab) == tc->tokens[tc->prompt_len + row];
    }
}

/* The checkpoints a batch of len tokens from position p names (hybrid kind): every
   multiple of CHECKPOINT_EVERY in (p, p+len], at most KEEP_CHECKPOINTS (the latest:
   the caches keep no more). Returns how many, in at[]. */
static int checkpoints_in(int32_t p, int32_t len, int32_t at[KEEP_CHECKPOINTS])
{
    int32_t last = (p + len) / CHECKPOINT_EVERY * CHECKPOINT_EVERY, first;
    int n = 0;
    if (last <= p) return 0;
    first = last - (KEEP_CHECKPOINTS - 1) * CHECKPOINT_EVERY;
    for (int32_t t = first > p ? first : (p / CHECKPOINT_EVERY + 1) * CHECKPOINT_EVERY; t <= last;
         t += CHECKPOINT_EVERY)
        at[n++] = t;
    return n;
}

/* Runs toks[0..n) at positions pos0.. in chunks of s->chunk tokens, scoring the
   logits of every position >= prompt_len - 1 against the reference. The logits of
   the last position go to last[vocab]. The hybrid kind names a checkpoint at every
   multiple of CHECKPOINT_EVERY, wherever it falls inside a chunk. */
static int run_tokens(session *s, const test_case *tc, const int32_t *toks, int32_t pos0, int32_t n,
                      score *sc, float *last)
{
    const int vocab = s->m->c.vocab;
    const int32_t first_scored = tc->prompt_len - 1;
    const int checkpoints = s->ks && s->ks->hybrid;
    float *logits = alloc_floats((size_t)s->chunk * vocab);
    if (!logits) return -1;
    for (int32_t done = 0; done < n;) {
        const int32_t p = pos0 + done;                       /* position of toks[done] */
        const int32_t len = n - done < s->chunk ? n - done : s->chunk;
        int32_t first, at[KEEP_CHECKPOINTS];
        const int n_at = checkpoints ? checkpoints_in(p, len, at) : 0;
        first = first_scored > p ? first_scored - p : 0;     /* first row with logits */
        if (first > len - 1) first = len - 1;                /* always keep the last row */
        if (forward(s->m, s->ks ? &s->mem : NULL, toks + done, len, p, at, n_at, first, logits) != 0) {
            free(logits);
            return -1;
        }
        for (int32_t r = first; r < len; ++r)
            if (p + r >= first_scored)
                score_row(sc, tc, vocab, p + r - first_scored, logits + (size_t)(r - first) * vocab);
        memcpy(last, logits + (size_t)(len - 1 - first) * vocab, (size_t)vocab * sizeof *last);
        sc->tokens_run += len;
        done += len;
    }
    free(logits);
    return 0;
}

/* --- The cache policy of a session: requests, prefix reuse and branch points ---
   (the only code that depends on how a kind reuses tokens; everything else is the
   memory's begin / attention / state in forward()). The generic steps come first,
   then each kind's hooks. */

/* Ends the request in flight: record prompt + generated tokens for reuse. */
static int end_request(session *s)
{
    if (!s->open) return 0;
    s->open = 0;
    return s->ks->end_request(s);
}

/* Starts a request for prompt[0..n): the cache keeps the longest prefix it can
   reuse, *reused tokens (*want: what the rule should give), and the caller
   evaluates prompt[*reused ..]. */
static int begin_request(session *s, const int32_t *prompt, int32_t n, int32_t *reused, int32_t *want)
{
    if (end_request(s) != 0 || s->ks->begin_request(s, prompt, n, reused, want) != 0) return -1;
    s->open = 1;
    s->prompt = prompt;
    s->n_prompt = n;
    s->generated = NULL;
    s->n_generated = 0;
    return 0;
}

static int drop_branch_point(session *s)
{
    return memory_snapshot_free(&s->branch);
}

/* Remembers the state of every group after prompt[0..n) (and that prompt's last logits). */
static int save_branch_point(session *s, const int32_t *prompt, int32_t n, const float *logits)
{
    if (memory_snapshot_take(&s->mem, &s->branch) != 0) return -1;
    s->snap_prompt = prompt;
    s->snap_prompt_len = n;
    memcpy(s->snap_logits, logits, (size_t)s->m->c.vocab * sizeof *logits);
    return 0;
}

/* Whether the saved branch point is right after prompt[0..n). */
static int have_branch_point(const session *s, const int32_t *prompt, int32_t n)
{
    return s->branch.offset >= 0 && s->snap_prompt_len == n &&
           !memcmp(s->snap_prompt, prompt, (size_t)n * sizeof *prompt);
}

/* The longest common prefix of held[0..n_held) and prompt[0..n), leaving at least
   one prompt token to evaluate (its logits are the request's first output). */
static int32_t common_prefix(const int32_t *held, int32_t n_held, const int32_t *prompt, int32_t n)
{
    int32_t lcp = 0;
    while (lcp < n_held && lcp < n && held[lcp] == prompt[lcp]) ++lcp;
    return lcp < n - 1 ? lcp : n - 1;
}

/* --- FULL, ROTATING and hybrid: kvc_prefix over the memory, memory snapshots --- */

/* Tokens kvc_prefix_begin should find reusable for `prompt`, by the rule of each
   group's kind: the common prefix with what the memory holds when no group has to go
   back, or when every group can trim there (a FULL cache always, a ROTATING one until
   its window has wrapped, a RECURRENT state never); otherwise, with the hybrid kind's
   checkpoints, the latest multiple of CHECKPOINT_EVERY at or before it; otherwise 0
   (the memory starts over). */
static int expected_reuse(const session *s, const int32_t *prompt, int32_t n, int32_t *want)
{
    const int32_t *held;
    int32_t n_held, offset, lcp;
    int can_trim = 1;
    KVC_CHECK(kvc_prefix_tokens(s->prefix, &held, &n_held));
    if (memory_offset(&s->mem, &offset) != 0) return -1;
    for (int i = 0; i < s->mem.n; ++i) {
        int ok;
        KVC_CHECK(kvc_cache_can_trim(s->mem.g[i].cache, &ok));
        can_trim &= ok;
    }
    lcp = common_prefix(held, n_held, prompt, n);
    *want = lcp == offset || can_trim ? lcp : s->ks->hybrid ? lcp / CHECKPOINT_EVERY * CHECKPOINT_EVERY : 0;
    return 0;
fail:
    return -1;
}

static int begin_request_prefix(session *s, const int32_t *prompt, int32_t n, int32_t *reused, int32_t *want)
{
    int32_t offset;
    if (expected_reuse(s, prompt, n, want) != 0) return -1;
    KVC_CHECK(kvc_prefix_begin(s->prefix, prompt, n, reused));
    if (memory_offset(&s->mem, &offset) != 0) return -1;
    if (offset != *reused || *reused < 0 || *reused >= n) {
        errorf("kvc_prefix_begin reused %d of %d tokens, memory offset %d", (int)*reused, (int)n, (int)offset);
        return -1;
    }
    return 0;
fail:
    return -1;
}

static int end_request_prefix(session *s)
{
    KVC_CHECK(kvc_prefix_close(s->prefix, s->generated, s->n_generated));
    return 0;
fail:
    return -1;
}

/* A memory snapshot (kvc_memory_snapshot_take) shares its pages: O(pages); restoring
   it is kvc_memory_restore to the snapshot's end, every group or none. */
static int restore_branch_point_prefix(session *s, int32_t n)
{
    int32_t offset;
    if (memory_restore(&s->mem, &s->branch) != 0 || memory_offset(&s->mem, &offset) != 0) return -1;
    if (offset != n) {
        errorf("branch point restored at %d tokens, expected %d", (int)offset, (int)n);
        return -1;
    }
    return 0;
}

/* After a case of T tokens the memory holds all of them: offset T. The hybrid kind
   notes the offsets below it every group can go back to (its checkpoints). */
static int end_case_prefix(session *s, const test_case *tc, score *sc)
{
    int32_t offset;
    if (memory_offset(&s->mem, &offset) != 0) return -1;
    if (s->ks->hybrid && memory_checkpoints(&s->mem) >= 0)
        snprintf(sc->note, sizeof sc->note, "  checkpoints %d", (int)memory_checkpoints(&s->mem));
    if (offset != tc->total_len) {
        errorf("case %s: memory offset %d at the end, expected %d", tc->name, (int)offset, (int)tc->total_len);
        return -1;
    }
    return 0;
}

/* --- CAUSAL: sequence 0 of a cell cache --- */

/* kvc_prefix takes no CAUSAL cache, so its rule is written out here: keep the longest
   common prefix of the prompt and the tokens sequence 0 holds (leaving one token to
   evaluate) and drop the rest with kvc_seq_remove to the end (nothing after it moves,
   so no RoPE shift). With a sliding window, cells older than the window have been
   released: the prefix is kept only if the sequence still has every key its next
   token sees (kvc_seq_can_resume), and otherwise the sequence starts over. */
static int begin_request_causal(session *s, const int32_t *prompt, int32_t n, int32_t *reused, int32_t *want)
{
    const int32_t W = s->m->c.window;
    int32_t lo, hi, keep;
    int ok = 1;
    KVC_CHECK(kvc_seq_pos_range(s->cache, 0, &lo, &hi)); /* -1, -1 when empty */
    keep = common_prefix(s->held, hi + 1 < s->n_held ? hi + 1 : s->n_held, prompt, n);
    /* The expectation, from the positions held: the token at `keep` sees the keys
       keep-W+1 .. keep-1 (W with itself), which must all still be there. */
    *want = W == 0 || lo <= (keep - W + 1 > 0 ? keep - W + 1 : 0) ? keep : 0;
    if (hi >= 0) {
        KVC_CHECK(kvc_seq_can_resume(s->cache, 0, keep, &ok));
        if (!ok) keep = 0;
        KVC_CHECK(kvc_seq_remove(s->cache, 0, keep, KVC_POS_END)); /* keep == 0: all */
    }
    *reused = keep;
    KVC_CHECK(kvc_seq_pos_range(s->cache, 0, &lo, &hi));
    if (hi != keep - 1 || (W == 0 && keep > 0 && lo != 0)) {
        errorf("kept %d of %d tokens, but sequence 0 holds positions %d..%d", (int)keep, (int)n, (int)lo, (int)hi);
        return -1;
    }
    return 0;
fail:
    return -1;
}

/* Records prompt + generated tokens, as far as the sequence goes. */
static int end_request_causal(session *s)
{
    int32_t lo, hi, n = 0;
    KVC_CHECK(kvc_seq_pos_range(s->cache, 0, &lo, &hi));
    for (int32_t i = 0; i <= hi && i < s->max_held && i < s->n_prompt + s->n_generated; ++i)
        s->held[n++] = i < s->n_prompt ? s->prompt[i] : s->generated[i - s->n_prompt];
    s->n_held = n;
    return 0;
fail:
    return -1;
}

/* A sequence snapshot (kvc_seq_snapshot) copies the sequence's cells into pages of
   the pool; kvc_seq_restore puts them back, dropping what sequence 0 had. */
static int restore_branch_point_causal(session *s, int32_t n)
{
    int32_t lo, hi;
    if (memory_restore(&s->mem, &s->branch) != 0) return -1;
    KVC_CHECK(kvc_seq_pos_range(s->cache, 0, &lo, &hi));
    if (hi != n - 1) {
        errorf("kvc_seq_restore: sequence 0 ends at position %d, expected %d", (int)hi, (int)n - 1);
        return -1;
    }
    return 0;
fail:
    return -1;
}

/* kvc_cache_offset counts the cells in use, not positions. After a case of T tokens
   sequence 0 ends at position T-1, each position in one cell; without a window it
   holds all of 0..T-1. With a window W, the last batch (n tokens from position p0)
   released every cell at or before p0-W, leaving p0-W+1 .. p0+n-1: at most W-1+n
   cells with n <= chunk, however long the case (the long case ends with a decode
   step, n = 1: exactly W cells, not its 230 tokens). */
static int end_case_causal(session *s, const test_case *tc, score *sc)
{
    const int32_t W = s->m->c.window, T = tc->total_len;
    const int32_t bound = W ? W - 1 + (s->chunk < T ? s->chunk : T) : T;
    int32_t lo, hi, used;
    KVC_CHECK(kvc_seq_pos_range(s->cache, 0, &lo, &hi));
    KVC_CHECK(kvc_cache_offset(s->cache, &used));
    snprintf(sc->note, sizeof sc->note, "  cells %d/%d", (int)used, (int)s->capacity);
    if (hi != T - 1 || used != hi - lo + 1 || (W == 0 && lo != 0) || used > bound) {
        errorf("case %s: sequence 0 holds positions %d..%d in %d cells; expected ..%d in at most %d",
               tc->name, (int)lo, (int)hi, (int)used, (int)T - 1, (int)bound);
        return -1;
    }
    return 0;
fail:
    return -1;
}

/* Runs one case through the session's cache.

   - A case named branch_* whose prompt matches the branch point left by the
     previous branch restores it and decodes its own continuation from there.
   - Otherwise it is a new request: begin_request finds how much of the prompt
     the cache already holds, the rest is prefilled in chunks, and the remaining
     tokens are decoded one at a time. Greedy cases feed back the argmax; forced
     cases feed the given tokens. A forced case that is not a branch sends all its
     tokens as the prompt (like scoring a text), so `reuse` reuses 64 tokens and
     prefills the other 32; a branch prompt stops at prompt_len, where the
     branch point is saved.
   Rows the cache did not recompute (reused positions) are not compared. */
static int run_case_cached(session *s, const test_case *tc, score *sc)
{
    const int vocab = s->m->c.vocab;
    const int is_branch = !strncmp(tc->name, "branch_", 7);
    const int32_t N = tc->prompt_len, T = tc->total_len;
    const int32_t plen = tc->greedy || is_branch ? N : T; /* the request's prompt */
    float *last = alloc_floats((size_t)vocab);            /* the latest logits */
    int32_t pos;
    int rc = -1;

    if (!last) return -1;
    if (is_branch && have_branch_point(s, tc->tokens, N)) {
        /* continue the open request from the branch point after its prompt */
        if (s->ks->restore_branch_point(s, N) != 0) goto fail; /* every group */
        sc->reused = sc->reused_want = N;
        score_row(sc, tc, vocab, 0, s->snap_logits); /* row 0: the prompt's last logits */
        memcpy(last, s->snap_logits, (size_t)vocab * sizeof *last);
    } else {
        if (drop_branch_point(s) != 0) goto fail;
        if (begin_request(s, tc->tokens, plen, &sc->reused, &sc->reused_want) != 0) goto fail;
        /* chunked prefill of what is not in the cache yet */
        if (run_tokens(s, tc, tc->tokens + sc->reused, sc->reused, plen - sc->reused, sc, last) != 0)
            goto fail;
        if (is_branch && save_branch_point(s, tc->tokens, N, last) != 0) goto fail;
    }
    /* token-by-token decode */
    for (pos = plen; pos < T; ++pos) {
        int32_t next = tc->tokens[pos];
        if (tc->greedy) {
            next = argmax(last, vocab); /* greedy sampling */
            /* A mismatch was counted by score_row. Continue with the reference
               token so that the remaining rows stay comparable. */
            if (next != tc->tokens[pos]) next = tc->tokens[pos];
        }
        if (run_tokens(s, tc, &next, pos, 1, sc, last) != 0) goto fail;
    }
    /* what the request generated after its prompt, recorded when it ends */
    s->generated = tc->tokens + plen;
    s->n_generated = T - plen;
    if (s->ks->end_case(s, tc, sc) != 0) goto fail;
    rc = 0;
fail:
    if (rc != 0) errorf("case %s failed", tc->name);
    free(last);
    return rc;
}

/* --reference: one cache-free forward over the whole sequence gives every row. */
static int run_case_reference(session *s, const test_case *tc, score *sc)
{
    session whole = *s;
    float *last = alloc_floats((size_t)s->m->c.vocab);
    int rc;
    if (!last) return -1;
    whole.chunk = tc->total_len; /* no chunking without a cache */
    rc = run_tokens(&whole, tc, tc->tokens, 0, tc->total_len, sc, last);
    free(last);
    return rc;
}

/* --- The table -------------------------------------------------------------------- */

static void print_header(void)
{
    if (g_quiet) return;
    printf("  %-9s %-9s %-8s %7s %9s %9s %7s %7s %9s  %s\n", "case", "kind", "type", "rows", "max|err|",
           "rms err", "greedy", "reused", "tok/s", "result");
}

/* The largest |logit - ref| allowed for storage type ts on case tc (see TYPES). */
static double error_bound(const type_spec *ts, const test_case *tc)
{
    return tc->ref_rms * (F32_REL + ERR_GAIN * ts->step);
}

static int report(const test_case *tc, const char *kind, const char *type, const type_spec *ts,
                  const score *sc, int run_ok)
{
    char rows[24], greedy[24], reused[32], why[160] = "";
    const double rms = sc->n_values ? sqrt(sc->sum_sq / sc->n_values) : 0;
    int ok = run_ok;

    if (!run_ok) strcat(why, " error");
    if (!(sc->max_err <= error_bound(ts, tc))) {
        ok = 0;
        snprintf(why + strlen(why), sizeof why - strlen(why), " err>%.3g", error_bound(ts, tc));
    }
    if (tc->greedy && sc->tok_ok != sc->tok_total && ts->exact_greedy) {
        ok = 0;
        strcat(why, " tokens");
    }
    if (sc->reused != sc->reused_want) {
        ok = 0;
        strcat(why, " reuse");
    }
    if (run_ok && sc->rows == 0) {
        ok = 0;
        strcat(why, " no-rows");
    }
    if (!g_quiet || !ok) {
        snprintf(rows, sizeof rows, "%d/%d", sc->rows, (int)tc->rows);
        if (tc->greedy) snprintf(greedy, sizeof greedy, "%d/%d", sc->tok_ok, sc->tok_total);
        else snprintf(greedy, sizeof greedy, "-");
        if (sc->reused == sc->reused_want) snprintf(reused, sizeof reused, "%d", sc->reused);
        else snprintf(reused, sizeof reused, "%d!=%d", sc->reused, sc->reused_want);
        printf("  %-9s %-9s %-8s %7s %9.2e %9.2e %7s %7s %9.0f  %s%s%s\n", tc->name, kind, type, rows,
               sc->max_err, rms, greedy, reused, sc->seconds > 0 ? sc->tokens_run / sc->seconds : 0.0,
               ok ? "ok" : "FAIL:", why, sc->note);
    }
    return ok;
}

/* The kind-specific cache settings of the KINDS table. */
static void setup_full(kvc_cache_config *cc, const config *c, int32_t max_tokens, int32_t max_batch)
{
    (void)cc, (void)c, (void)max_tokens, (void)max_batch; /* nothing: grows as needed, window via desc */
}

static void setup_rotating(kvc_cache_config *cc, const config *c, int32_t max_tokens, int32_t max_batch)
{
    (void)max_tokens, (void)max_batch;
    cc->window = c->window; /* W keys including the current token, like the model */
    cc->sinks = 0;
}

/* A causal cache has a fixed number of cells, all taken at create. Without a window
   a sequence keeps every token: room for the longest case. With a window W, a batch
   of n tokens at p0 needs its n cells plus the W-1 keys before p0 (older cells are
   released when the batch begins), so W-1+max_batch cells do whatever the length;
   at least 64, so that with small chunks the long case (230 tokens) goes round the
   cells several times. With the default chunk its 200-token prompt is one batch,
   which needs 200 cells at once. */
static void setup_causal(kvc_cache_config *cc, const config *c, int32_t max_tokens, int32_t max_batch)
{
    cc->window = c->window;   /* W keys including the current token, like the model (0: none) */
    cc->capacity = c->window ? (c->window - 1 + max_batch > 64 ? c->window - 1 + max_batch : 64) : max_tokens;
    cc->max_seqs = 1;         /* only sequence 0 */
    cc->rope.style = KVC_ROPE_NEOX; /* for kvc_seq_remove shifts, which we never make */
    cc->rope.theta = (float)c->theta;
}

/* Runs every case of a model with one (kind, type): builds the memory and the prefix
   tracker, runs the cases, then destroys everything and checks that no page was left
   behind. Returns the number of failed rows. */
static int run_session(const model *m, const test_case *cases, int n_cases, const kind_spec *ks,
                       const type_spec *ts, int chunk, score *total)
{
    const config *c = &m->c;
    session s;
    int32_t max_tokens = 0;
    int failures = 0, setup_ok = 0;

    memset(&s, 0, sizeof s);
    s.m = m;
    s.ks = ks;
    s.chunk = chunk;
    s.branch.offset = -1;
    if (!(s.snap_logits = alloc_floats((size_t)c->vocab))) return n_cases;
    for (int i = 0; i < n_cases; ++i)
        if (cases[i].total_len > max_tokens) max_tokens = cases[i].total_len;

    if (memory_create(&s.mem, c, ks, ts->type, ts->rotate, max_tokens, chunk < max_tokens ? chunk : max_tokens) != 0)
        goto fail;
    if (ks->hybrid || ks->kind != KVC_KIND_CAUSAL) {
        if (memory_prefix_create(&s.mem, max_tokens, &s.prefix) != 0) goto fail;
    } else if (!(s.held = (int32_t *)malloc((size_t)max_tokens * sizeof *s.held))) {
        errorf("out of memory");
        goto fail;
    }
    s.cache = s.mem.g[0].cache;
    s.capacity = s.mem.g[0].capacity;
    s.max_held = max_tokens;
    setup_ok = 1;

    for (int i = 0; i < n_cases; ++i) {
        score sc;
        double t0;
        int run_ok;
        memset(&sc, 0, sizeof sc);
        t0 = seconds_now();
        run_ok = run_case_cached(&s, &cases[i], &sc) == 0;
        sc.seconds = seconds_now() - t0;
        failures += !report(&cases[i], ks->name, ts->name, ts, &sc, run_ok);
        if (!(sc.max_err <= total->max_err)) total->max_err = sc.max_err;
        total->sum_sq += sc.sum_sq;
        total->n_values += sc.n_values;
        total->tok_ok += sc.tok_ok;
        total->tok_total += sc.tok_total;
        if (!run_ok) break; /* the memory's state is unknown: stop this session */
    }
    if (end_request(&s) != 0) failures++;

fail:
    if (!setup_ok) failures++;
    /* tear down in reverse order, then check that no page is left behind */
    if (drop_branch_point(&s) != 0) failures++, errorf("kvc_snapshot_free failed");
    if (s.prefix && kvc_prefix_destroy(s.prefix) != KVC_OK) failures++, errorf("kvc_prefix_destroy failed");
    failures += memory_free(&s.mem, ks->name, ts->name);
    free(s.snap_logits);
    free(s.held);
    return failures;
}

/* Rotated storage (kvc_pool_config.rotate) against plain, over every kind and case of a
   model (teacher-forced: greedy cases go on with the reference token): the rms logit
   error of q8_0+rot at most ROT_Q8_RATIO of q8_0's, q4_0+rot's at most ROT_Q4_RATIO of
   q4_0's. The rotation is a statistical gain, not a per-model guarantee: it helps where
   outlier channels set the block scales (real models; test_rotate holds the strict
   bound on outlier data, q4_0 rms 2.2e-2 -> 9e-3), but these random-weight models have
   none - the max / rms of a 32-value block of their K and V is 2.36-2.41 before and
   after the rotation, as for Gaussian noise - and an orthogonal rotation of Gaussian
   data leaves the expected error unchanged: the ratio is 1 plus noise. Measured
   (chunk 2048 and 7 alike), lfm2 / llama / mistral / qwen3: q8_0 0.971 / 0.995 / 0.972
   / 0.984, q4_0 1.000 / 0.943 / 1.043 / 0.981; eight models from tests/gen_model.py
   (seeds 1-8): q8_0 0.89-1.007, q4_0 0.92-1.023 - a spread of about 0.04 around 1.
   1.15 is over 3 times that spread, while a rotation that is wrong (not inverted,
   another block's signs, a query left unrotated) gives O(1) errors: ratios of 10 and
   more. So the check asks "no worse than plain, within noise", not "better". */
#define ROT_Q8_RATIO 1.15
#define ROT_Q4_RATIO 1.15

static double total_rms(const score *t) { return t->n_values ? sqrt(t->sum_sq / (double)t->n_values) : 0.0; }

/* The quantized types of a model side by side, plain and rotated, then the two checks
   (counted in *runs; failures returned). */
static int rotation_summary(const score *total, int *runs)
{
    int failures = 0, q8 = -1, q8r = -1, q4 = -1, q4r = -1;
    for (int t = 0; t < COUNT_OF(TYPES); ++t) {
        if (g_type_off[t]) continue;
        if (TYPES[t].type == KVC_TYPE_Q8_0) *(TYPES[t].rotate ? &q8r : &q8) = t;
        if (TYPES[t].type == KVC_TYPE_Q4_0) *(TYPES[t].rotate ? &q4r : &q4) = t;
    }
    if (!g_quiet) {
        printf("  quantized K/V over every kind and case, teacher-forced:\n");
        printf("  %-9s %9s %9s %9s\n", "type", "max|err|", "rms err", "greedy");
        for (int t = 0; t < COUNT_OF(TYPES); ++t) {
            char greedy[32];
            if (g_type_off[t] || (TYPES[t].type != KVC_TYPE_Q8_0 && TYPES[t].type != KVC_TYPE_Q4_0)) continue;
            snprintf(greedy, sizeof greedy, "%d/%d", total[t].tok_ok, total[t].tok_total);
            printf("  %-9s %9.2e %9.2e %9s\n", TYPES[t].name, total[t].max_err, total_rms(&total[t]), greedy);
        }
    }
    if (q8 >= 0 && q8r >= 0 && q4 >= 0 && q4r >= 0) {
        const double r4 = total_rms(&total[q4r]) / total_rms(&total[q4]);
        const double r8 = total_rms(&total[q8r]) / total_rms(&total[q8]);
        const int ok4 = r4 <= ROT_Q4_RATIO, ok8 = r8 <= ROT_Q8_RATIO;
        *runs += 2;
        failures += !ok4 + !ok8;
        if (!g_quiet || !ok4 || !ok8)
            printf("  rotation: rms q4_0+rot / q4_0 = %.3f (at most %.3f: %s), q8_0+rot / q8_0 = %.3f (at most %.3f: %s)\n",
                   r4, ROT_Q4_RATIO, ok4 ? "ok" : "FAIL", r8, ROT_Q8_RATIO, ok8 ? "ok" : "FAIL");
    }
    return failures;
}

/* --- Conversations through a radix tree over the memory (kvc_radix_create_memory) ---
   One tree shared by every request of a model, each request a memory of its own from
   kvc_radix_lookup_memory, committed back with kvc_radix_commit_memory (prompt and
   generated tokens). Every model runs it with one group per layer type (f32): the
   hybrid kind's layout, one FULL or ROTATING group on Llama and Mistral.
     turn1     base's prompt, then TURN1_GENERATED greedy tokens; committed
     turn2     turn 1's tokens + the next reference tokens as one prompt: reuses all of
               turn 1 (its RECURRENT states at turn 1's end, its window's pages)
     branch_a  base's prompt + other tokens: resumes at the end of turn 1's prompt,
     branch_b  where turn 1 named a checkpoint (and its commit ended a tree node)
     reuse     base's first 64 tokens + other tokens: resumes at the checkpoint at 64
   Every request names checkpoints at the multiples of CHECKPOINT_EVERY and at the end
   of its prompt. The logits of every evaluated position are checked against the
   reference (rows the tree served are not recomputed, so not compared), and each
   lookup must reuse exactly the expected length. */
#define TURN1_GENERATED 20

/* Evaluates toks[pos0 .. pos0 + n) (one request's tokens at positions pos0..) through
   M in chunks of `chunk`, naming checkpoints at the multiples of CHECKPOINT_EVERY and
   at `mark` (-1: none); scores rows as run_tokens does; the last logits go to last. */
static int radix_tokens(const model *m, memory *M, const test_case *tc, const int32_t *toks, int32_t pos0,
                        int32_t n, int32_t mark, int chunk, score *sc, float *last)
{
    const int vocab = m->c.vocab;
    const int32_t first_scored = tc->prompt_len - 1;
    float *logits = alloc_floats((size_t)chunk * vocab);
    if (!logits) return -1;
    for (int32_t done = 0; done < n;) {
        const int32_t p = pos0 + done, len = n - done < chunk ? n - done : chunk;
        int32_t at[KEEP_CHECKPOINTS + 1], first = first_scored > p ? first_scored - p : 0;
        int n_at = checkpoints_in(p, len, at);
        if (mark > p && mark <= p + len && (n_at == 0 || at[n_at - 1] != mark)) at[n_at++] = mark;
        if (first > len - 1) first = len - 1;
        if (forward(m, M, toks + p, len, p, at, n_at, first, logits) != 0) {
            free(logits);
            return -1;
        }
        for (int32_t r = first; r < len; ++r)
            if (p + r >= first_scored)
                score_row(sc, tc, vocab, p + r - first_scored, logits + (size_t)(r - first) * vocab);
        memcpy(last, logits + (size_t)(len - 1 - first) * vocab, (size_t)vocab * sizeof *last);
        sc->tokens_run += len;
        done += len;
    }
    free(logits);
    return 0;
}

/* One request through the tree: lookup_memory of toks[0..n_prompt) (reuse must be
   `want`), the rest of the prompt evaluated (a checkpoint at its end), then
   toks[n_prompt..n_total) decoded one at a time (greedy cases: the argmax, checked,
   then the reference token), and commit_memory of all n_total tokens. */
static int radix_request(const model *m, kvc_radix *tree, memory *tmpl, const test_case *tc, const int32_t *toks,
                         int32_t n_prompt, int32_t n_total, int32_t want, int chunk, score *sc)
{
    const kvc_namespace ns = g_radix_ns;
    const config *c = &m->c;
    float *last = alloc_floats((size_t)c->vocab);
    kvc_memory *km = NULL;
    memory M;
    int32_t reused = -1, offset = -1;
    int rc = -1;
    if (!last) return -1;
    KVC_CHECK(kvc_radix_lookup_memory(tree, ns, toks, n_prompt, &km, &reused));
    memory_layout(&M, c, NULL); /* the template's groups, on the tree's pools */
    M.mem = km;
    for (int i = 0; i < M.n; ++i) {
        KVC_CHECK(kvc_memory_group(km, i, &M.g[i].cache));
        M.g[i].window = M.g[i].type == LAYER_SLIDING ? c->window : 0;
    }
    sc->reused = reused;
    sc->reused_want = want;
    if (memory_offset(&M, &offset) != 0 || offset != reused) {
        errorf("%s: the looked-up memory holds %d tokens, the lookup reused %d", tc->name, (int)offset, (int)reused);
        goto fail;
    }
    if (radix_tokens(m, &M, tc, toks, reused, n_prompt - reused, n_prompt, chunk, sc, last) != 0) goto fail;
    /* decode: score_row has checked a greedy case's argmax; the reference token follows */
    for (int32_t pos = n_prompt; pos < n_total; ++pos)
        if (radix_tokens(m, &M, tc, toks, pos, 1, -1, chunk, sc, last) != 0) goto fail;
    KVC_CHECK(kvc_radix_commit_memory(tree, ns, km, toks, n_total, 0));
    if (M.peak_bytes > tmpl->peak_bytes) tmpl->peak_bytes = M.peak_bytes; /* the one budget's */
    rc = 0;
fail:
    if (km && kvc_memory_destroy(km) != KVC_OK) rc = -1, errorf("kvc_memory_destroy failed");
    free(last);
    return rc;
}

/* The requests above on a fresh tree; one table row each, then the memory's line.
   Returns the number of failures; *runs counts the checks. */
static int run_radix_turns(const model *m, const test_case *cases, int n_cases, int chunk, int *runs)
{
    static const struct {
        const char *row, *from; /* the table row, the reference case it follows */
    } REQS[] = {{"turn1", "base"}, {"turn2", "base"}, {"branch_a", "branch_a"}, {"branch_b", "branch_b"},
                {"reuse", "reuse"}};
    const kind_spec *hybrid = NULL;
    const test_case *base = NULL;
    memory tmpl;
    kvc_radix_config rc;
    kvc_radix *tree = NULL;
    int32_t max_tokens = 0, turn1;
    int failures = 0;

    for (int k = 0; k < COUNT_OF(KINDS); ++k)
        if (KINDS[k].hybrid) hybrid = &KINDS[k];
    for (int i = 0; i < n_cases; ++i) {
        if (!strcmp(cases[i].name, "base")) base = &cases[i];
        if (cases[i].total_len > max_tokens) max_tokens = cases[i].total_len;
    }
    if (!base || base->prompt_len + TURN1_GENERATED >= base->total_len) {
        if (!g_quiet) printf("  (radix turns skipped: no base case of more than %d tokens)\n", TURN1_GENERATED);
        return 0;
    }
    turn1 = base->prompt_len + TURN1_GENERATED;
    if (memory_create(&tmpl, &m->c, hybrid, KVC_TYPE_F32, 0, max_tokens, chunk < max_tokens ? chunk : max_tokens) != 0) {
        ++*runs;
        return 1;
    }
    kvc_radix_config_init(&rc, KVC_KIND_FULL); /* cache: unused by a memory's tree */
    if (kvc_radix_create_memory(tmpl.mem, &rc, &tree) != KVC_OK) {
        errorf("kvc_radix_create_memory failed");
        failures++;
    }
    for (int r = 0; tree && r < COUNT_OF(REQS); ++r) {
        const test_case *tc = NULL;
        test_case row;
        score sc;
        double t0;
        int32_t n_prompt, n_total, want;
        int ok;
        for (int i = 0; i < n_cases; ++i)
            if (!strcmp(cases[i].name, REQS[r].from)) tc = &cases[i];
        if (!tc) continue;
        row = *tc;
        snprintf(row.name, sizeof row.name, "%s", REQS[r].row);
        /* turn 1: base's prompt + generated tokens; turn 2: all of base as its prompt;
           the others: their whole sequence as the prompt, resuming where they leave base */
        n_prompt = r == 0 ? base->prompt_len : tc->total_len;
        n_total = r == 0 ? turn1 : tc->total_len;
        want = r == 0 ? 0 : r == 1 ? turn1 : tc->prompt_len;
        memset(&sc, 0, sizeof sc);
        t0 = seconds_now();
        ok = radix_request(m, tree, &tmpl, &row, tc->tokens, n_prompt, n_total, want, chunk, &sc) == 0;
        sc.seconds = seconds_now() - t0;
        if (ok && r == COUNT_OF(REQS) - 1) {
            kvc_radix_stats st;
            if (kvc_radix_stats_get(tree, &st) == KVC_OK)
                snprintf(sc.note, sizeof sc.note, "  tree: %d nodes, %d states", (int)st.n_nodes, (int)st.n_states);
        }
        failures += !report(&row, "radix", "f32", &TYPES[0], &sc, ok);
        ++*runs;
        if (!ok) break;
    }
    if (tree && kvc_radix_destroy(tree) != KVC_OK) failures++, errorf("kvc_radix_destroy failed");
    failures += memory_free(&tmpl, "radix", "f32"); /* every page back once the tree is gone */
    ++*runs;
    return failures;
}

/* --- A prefix that outlived the pool (kvc_tier_*) ---
   turn1 (base's prompt + generated tokens) on a tree with a host-RAM tier (blocks of
   TIER_BLOCK tokens); then the whole tree is evicted, so the prefix lives only in the
   tier (as the evicted entries' whole-block prefixes, kvc_radix_save's bytes); then
   tier_turn2 (all of base as its prompt) brings the longest one back with
   kvc_tier_fetch and evaluates the rest: every logit it computes is checked against the
   reference, and the lookup must reuse exactly what came back (96 of base's tokens: the
   end of its prompt). */
#define TIER_BLOCK 32

static int run_radix_tier(const model *m, const test_case *cases, int n_cases, int chunk, int *runs)
{
    const kvc_namespace ns = g_radix_ns; /* radix_request's */
    const kind_spec *hybrid = NULL;
    const test_case *base = NULL;
    memory tmpl;
    kvc_radix_config rc;
    kvc_radix *tree = NULL;
    kvc_tier_config tcfg;
    kvc_radix_stats st;
    int32_t max_tokens = 0, turn1, fetched = -1;
    int failures = 0, r;

    for (int k = 0; k < COUNT_OF(KINDS); ++k)
        if (KINDS[k].hybrid) hybrid = &KINDS[k];
    for (int i = 0; i < n_cases; ++i) {
        if (!strcmp(cases[i].name, "base")) base = &cases[i];
        if (cases[i].total_len > max_tokens) max_tokens = cases[i].total_len;
    }
    if (!base || base->prompt_len + TURN1_GENERATED >= base->total_len || base->prompt_len < TIER_BLOCK) return 0;
    turn1 = base->prompt_len + TURN1_GENERATED;
    if (memory_create(&tmpl, &m->c, hybrid, KVC_TYPE_F32, 0, max_tokens, chunk < max_tokens ? chunk : max_tokens) != 0) {
        ++*runs;
        return 1;
    }
    kvc_radix_config_init(&rc, KVC_KIND_FULL);
    kvc_tier_config_init(&tcfg);
    tcfg.host_bytes = (size_t)64 << 20;
    tcfg.block_tokens = TIER_BLOCK;
    if (kvc_radix_create_memory(tmpl.mem, &rc, &tree) != KVC_OK || kvc_tier_attach(tree, &tcfg) != KVC_OK) {
        errorf("a tree with a tier could not be made");
        failures++;
    }
    for (r = 0; tree && r < 2; ++r) {
        test_case row = *base;
        score sc;
        double t0;
        int32_t n_prompt = r == 0 ? base->prompt_len : base->total_len, n_total = r == 0 ? turn1 : base->total_len;
        int32_t want = 0;
        int ok = 1;
        snprintf(row.name, sizeof row.name, "%s", r == 0 ? "turn1" : "tier_turn2");
        memset(&sc, 0, sizeof sc);
        t0 = seconds_now();
        if (r == 1) { /* nothing in the pool: the tier or nothing */
            ok = kvc_radix_evict(tree, INT32_MAX, NULL) == KVC_OK && kvc_radix_stats_get(tree, &st) == KVC_OK &&
                 st.n_pages == 0 && kvc_tier_fetch(tree, ns, base->tokens, n_prompt, &fetched) == KVC_OK &&
                 fetched == base->prompt_len / TIER_BLOCK * TIER_BLOCK;
            if (!ok) errorf("tier: the evicted prefix came back with %d tokens, wanted %d", (int)fetched,
                            (int)(base->prompt_len / TIER_BLOCK * TIER_BLOCK));
            want = fetched;
        }
        ok = ok && radix_request(m, tree, &tmpl, &row, base->tokens, n_prompt, n_total, want, chunk, &sc) == 0;
        sc.seconds = seconds_now() - t0;
        failures += !report(&row, "radix", "f32", &TYPES[0], &sc, ok);
        ++*runs;
        if (!ok) break;
    }
    if (tree && kvc_radix_destroy(tree) != KVC_OK) failures++, errorf("kvc_radix_destroy failed");
    failures += memory_free(&tmpl, "radix", "f32");
    ++*runs;
    return failures;
}

/* --- A long prompt shared by two processes through a store (--share-write / -read) ---
   Two runs of tinylm, one after the other, share the longest prompt of the model's
   cases (`long`: 160 or 200 tokens) through a store, as two engines serving one system
   prompt would: a directory (dir:PATH, kvc_store_dir) or Redis (redis:HOST:PORT, in a
   build with -DTINYLM_REDIS: examples/redis_store.h). Each builds the radix turns' tree
   (one group per layer type, f32) with a store tier under it (blocks of TIER_BLOCK
   tokens; the namespace's model id a hash of the weights, so only the same model finds
   the prefix), and runs the case as one request:
     --share-write STORE FILE  evaluates every token (reuses nothing), publishes the
                               prompt's whole blocks (kvc_tier_publish) and writes the
                               logits of every reference row to FILE
     --share-read STORE FILE   a fresh process: fetches the prefix from the store
                               (kvc_tier_fetch: must bring back every whole block of the
                               prompt), evaluates only the rest, and checks its logits
                               against the reference (the usual f32 bound) and bit for bit
                               against FILE's
   One table row each (share_write / share_read) and a line "share: ...". */
typedef struct share_opts {
    int role;           /* 0: off, 1: --share-write, 2: --share-read */
    const char *store;  /* dir:PATH or redis:HOST:PORT */
    const char *logits; /* the writer's logits */
} share_opts;

typedef struct share_store {
    kvc_store_dir_state dir;
#ifdef TINYLM_REDIS
    redis_store redis;
    int is_redis;
#endif
} share_store;

/* The store STORE names into *store; -1 when it names none this build has. */
static int share_store_open(share_store *b, const char *spec, kvc_store *store)
{
    memset(b, 0, sizeof *b);
    if (!strncmp(spec, "dir:", 4)) return kvc_store_dir(&b->dir, spec + 4, store) == KVC_OK ? 0 : -1;
#ifdef TINYLM_REDIS
    if (!strncmp(spec, "redis:", 6)) {
        char host[256];
        const char *colon = strrchr(spec + 6, ':');
        const size_t n = colon ? (size_t)(colon - (spec + 6)) : 0;
        const int port = colon ? atoi(colon + 1) : 0;
        if (n == 0 || n >= sizeof host || port <= 0 || port > 65535) return -1;
        memcpy(host, spec + 6, n);
        host[n] = 0;
        redis_store_open(&b->redis, host, port, store);
        b->is_redis = 1;
        return 0;
    }
#endif
    return -1;
}

static void share_store_close(share_store *b)
{
#ifdef TINYLM_REDIS
    if (b->is_redis) redis_store_close(&b->redis);
#else
    (void)b;
#endif
}

/* The model's id: FNV-1a (64 bits) of its weights file; 0 if it cannot be read. */
static uint64_t weights_id(const char *dir)
{
    char path[1024];
    size_t size = 0;
    uint64_t h = 14695981039346656037ull;
    unsigned char *data;
    join_path(path, sizeof path, dir, "model.safetensors");
    if (!(data = read_file(path, &size))) return 0;
    for (size_t i = 0; i < size; ++i) h = (h ^ data[i]) * 1099511628211ull;
    free(data);
    return h ? h : 1;
}

static int run_shared(const model *m, const char *dir, const test_case *cases, int n_cases, int chunk,
                      const share_opts *so, int *runs)
{
    const kind_spec *hybrid = NULL;
    const test_case *tc = NULL;
    memory tmpl;
    kvc_radix_config rc;
    kvc_radix *tree = NULL;
    kvc_tier_config tcfg;
    share_store sb;
    score sc;
    test_case row;
    FILE *f = NULL;
    unsigned char *theirs = NULL;
    float *mine = NULL;
    size_t n_floats, size = 0;
    int32_t max_tokens = 0, blocks, fetched = 0, published = 0;
    int failures = 0, ok = 0, opened = 0, same = 0;
    double t0;

    for (int k = 0; k < COUNT_OF(KINDS); ++k)
        if (KINDS[k].hybrid) hybrid = &KINDS[k];
    for (int i = 0; i < n_cases; ++i) {
        if (!tc || cases[i].prompt_len > tc->prompt_len) tc = &cases[i];
        if (cases[i].total_len > max_tokens) max_tokens = cases[i].total_len;
    }
    *runs += 2; /* the request, then the teardown (leak) check */
    blocks = tc ? tc->prompt_len / TIER_BLOCK * TIER_BLOCK : 0;
    if (blocks == 0 || (g_radix_ns.model = weights_id(dir)) == 0) {
        errorf("share: no case with a prompt of %d tokens or more, or no weights", TIER_BLOCK);
        return 2;
    }
    n_floats = (size_t)tc->rows * m->c.vocab;
    if (!(mine = alloc_floats(n_floats))) return 2;
    if (memory_create(&tmpl, &m->c, hybrid, KVC_TYPE_F32, 0, max_tokens, chunk < max_tokens ? chunk : max_tokens) != 0) {
        free(mine);
        return 2;
    }
    row = *tc;
    snprintf(row.name, sizeof row.name, "%s", so->role == 1 ? "share_write" : "share_read");
    memset(&sc, 0, sizeof sc);
    sc.keep = mine;
    kvc_radix_config_init(&rc, KVC_KIND_FULL);
    kvc_tier_config_init(&tcfg);
    tcfg.block_tokens = TIER_BLOCK;
    tcfg.timeout_ms = 2000;
    if (share_store_open(&sb, so->store, &tcfg.store) != 0) {
        errorf("share: cannot use the store %s", so->store);
        goto fail;
    }
    opened = 1;
    KVC_CHECK(kvc_radix_create_memory(tmpl.mem, &rc, &tree));
    KVC_CHECK(kvc_tier_attach(tree, &tcfg));
    t0 = seconds_now();
    if (so->role == 2) { /* a fresh process: the pool is empty, the store has the prefix */
        KVC_CHECK(kvc_tier_fetch(tree, g_radix_ns, tc->tokens, tc->prompt_len, &fetched));
        if (fetched != blocks) {
            errorf("share: the store gave back %d tokens of the prompt, wanted %d (written by --share-write?)",
                   (int)fetched, (int)blocks);
            goto fail;
        }
    }
    /* the lookup reuses all that came back but the prompt's last token (its logits are wanted) */
    if (radix_request(m, tree, &tmpl, &row, tc->tokens, tc->prompt_len, tc->total_len,
                      fetched < tc->prompt_len ? fetched : tc->prompt_len - 1, chunk, &sc) != 0)
        goto fail;
    sc.seconds = seconds_now() - t0;
    if (sc.rows != tc->rows) {
        errorf("share: %d of %d reference rows computed", sc.rows, (int)tc->rows);
        goto fail;
    }
    if (so->role == 1) {
        KVC_CHECK(kvc_tier_publish(tree, g_radix_ns, tc->tokens, tc->prompt_len, &published));
        if (published != blocks) {
            errorf("share: published %d tokens of the prompt, wanted %d", (int)published, (int)blocks);
            goto fail;
        }
        if (!(f = fopen(so->logits, "wb")) || fwrite(mine, sizeof *mine, n_floats, f) != n_floats) {
            errorf("share: cannot write %s", so->logits);
            goto fail;
        }
        printf("share: published %d of the %d prompt tokens to %s; %d logits rows to %s\n", (int)published,
               (int)tc->prompt_len, so->store, sc.rows, so->logits);
    } else {
        theirs = read_file(so->logits, &size);
        same = theirs && size == n_floats * sizeof *mine && memcmp(theirs, mine, size) == 0;
        printf("share: fetched %d tokens from %s, reused %d of the %d prompt tokens, computed %d of %d; %d logits "
               "rows, %s the writer's\n", (int)fetched, so->store, sc.reused, (int)tc->prompt_len,
               (int)tc->total_len - sc.reused, (int)tc->total_len, sc.rows, same ? "bit-identical to" : "DIFFERENT from");
        if (!same) goto fail;
    }
    ok = 1;
fail:
    failures += !report(&row, "radix", "f32", &TYPES[0], &sc, ok);
    if (f && fclose(f) != 0 && ok) failures++, errorf("share: cannot write %s", so->logits);
    if (tree && kvc_radix_destroy(tree) != KVC_OK) failures++, errorf("kvc_radix_destroy failed");
    failures += memory_free(&tmpl, "radix", "f32");
    if (opened) share_store_close(&sb);
    free(mine);
    free(theirs);
    return failures;
}

#ifdef TINYLM_VK
/* The device bytes a --vk memory holds (kvc_vk_memory_device_stats), in KiB. */
static double vk_kib(memory *M)
{
    kvc_vk_device_stats st;
    return kvc_vk_memory_device_stats(M->vm, &st) == KVC_OK ? st.device_bytes / 1024.0 : -1.0;
}

/* Runs toks[from..to) one forward pass per chunk tokens (checkpoints named when
   `checkpoints`, as the hybrid kind does); the logits of every position into
   logits[(p - from) * vocab] when not NULL. */
static int run_span(const model *m, memory *M, int checkpoints, const int32_t *toks, int32_t from, int32_t to,
                    int chunk, float *logits)
{
    const int vocab = m->c.vocab;
    for (int32_t p = from; p < to;) {
        const int32_t len = to - p < chunk ? to - p : chunk;
        int32_t at[KEEP_CHECKPOINTS];
        const int n_at = checkpoints ? checkpoints_in(p, len, at) : 0;
        if (forward(m, M, toks + p, len, p, at, n_at, logits ? 0 : len, logits ? logits + (size_t)(p - from) * vocab : NULL) != 0)
            return -1;
        p += len;
    }
    return 0;
}

/* --vk: a save game mid-run. The model's own memory (one group per layer type, f32)
   runs the first case's prompt and half its continuation, is saved (kvc_memory_save,
   checkpoints included) to a temporary file, and goes on to the end; a fresh device
   memory loads the file and runs the same tokens: its logits must be bit-identical to
   the uninterrupted run's (and so its greedy tokens), its tokens and checkpoints those
   saved. Also prints the device bytes the memory holds (kvc_vk_memory_device_stats):
   empty, after the prompt, after the save point, and cleared and trimmed
   (kvc_vk_memory_cmd_trim). Returns the number of failures; *runs counts the checks. */
static int run_vk_saveload(const model *m, const test_case *tc, int chunk, int *runs)
{
    const int vocab = m->c.vocab;
    const int32_t N = tc->prompt_len, T = tc->total_len, S = N + (T - N) / 2;
    const kind_spec *ks = &KINDS[model_is_hybrid(&m->c) ? 3 : 0]; /* hybrid, or full */
    memory a, b;
    kvc_namespace ns;
    kvc_io io;
    FILE *file = NULL;
    float *la = alloc_floats((size_t)(T - S) * vocab), *lb = alloc_floats((size_t)(T - S) * vocab);
    int32_t *got = (int32_t *)malloc((size_t)T * sizeof *got), n_got = -1, ck_a = -1, ck_b = -2;
    double kib[4] = {0, 0, 0, 0};
    int failures = 0, same = 0;
    memset(&a, 0, sizeof a);
    memset(&b, 0, sizeof b);
    memset(&ns, 0, sizeof ns);
    *runs += 3;
    if (!la || !lb || !got || !(file = tmpfile())) {
        errorf("saveload: out of memory or no temporary file");
        failures = 3;
        goto done;
    }
    if (memory_create(&a, &m->c, ks, KVC_TYPE_F32, 0, T, chunk < T ? chunk : T) != 0) { failures = 3; goto done; }
    kib[0] = vk_kib(&a);
    if (run_span(m, &a, ks->hybrid, tc->tokens, 0, N, chunk, NULL) != 0) { failures = 3; goto done; }
    kib[1] = vk_kib(&a);
    if (run_span(m, &a, ks->hybrid, tc->tokens, N, S, chunk, NULL) != 0) { failures = 3; goto done; }
    kib[2] = vk_kib(&a);
    ck_a = memory_checkpoints(&a);
    KVC_CHECK(kvc_io_stdio(file, &io));
    KVC_CHECK(kvc_memory_save(a.mem, ns, tc->tokens, S, &io));
    if (run_span(m, &a, ks->hybrid, tc->tokens, S, T, 1, la) != 0) goto fail; /* token by token, as decode */
    { /* cleared and trimmed: the device memory gives back what it held */
        VkCommandBuffer cmd;
        kvc_result r;
        KVC_CHECK(kvc_memory_clear(a.mem));
        KVC_CHECK(kvc_vk_context_begin(g_vk.ctx, &cmd));
        r = kvc_vk_memory_cmd_trim(a.vm, cmd);
        KVC_CHECK(kvc_vk_context_submit_wait(g_vk.ctx, cmd));
        KVC_CHECK(r);
        kib[3] = vk_kib(&a);
    }
    /* a fresh device memory from the file */
    if (memory_create(&b, &m->c, ks, KVC_TYPE_F32, 0, T, chunk < T ? chunk : T) != 0) goto fail;
    rewind(file);
    KVC_CHECK(kvc_io_stdio(file, &io));
    KVC_CHECK(kvc_memory_load(b.mem, ns, &io, got, T, &n_got));
    ck_b = memory_checkpoints(&b);
    if (n_got != S || memcmp(got, tc->tokens, (size_t)S * sizeof *got) != 0) {
        errorf("saveload: the loaded memory holds other tokens (%d, %d saved)", (int)n_got, (int)S);
        failures++;
    }
    if (ck_b != ck_a) {
        errorf("saveload: %d checkpoints after the load, %d saved", (int)ck_b, (int)ck_a);
        failures++;
    }
    if (run_span(m, &b, ks->hybrid, tc->tokens, S, T, 1, lb) != 0) goto fail;
    same = memcmp(la, lb, (size_t)(T - S) * vocab * sizeof *la) == 0;
    if (!same) {
        errorf("saveload: the logits after the load differ from the uninterrupted run's");
        failures++;
    }
    goto done;
fail:
    failures = 3;
done:
    if (!g_quiet || failures)
        printf("  vk save/load at %d of %d tokens (%s, f32): %d tokens and %d checkpoints back, continuation %s; "
               "device KiB empty %.0f, prompt %.0f, save point %.0f, cleared + trimmed %.0f%s\n",
               (int)S, (int)T, ks->name, (int)n_got, (int)ck_b, same ? "bit-identical" : "DIFFERENT", kib[0], kib[1],
               kib[2], kib[3], failures ? "  FAIL" : "  ok");
    if (a.mem) failures += memory_free(&a, ks->name, "f32");
    if (b.mem) failures += memory_free(&b, ks->name, "f32");
    if (file) fclose(file);
    free(la), free(lb), free(got);
    return failures;
}
#endif

/* The groups a hybrid model's memory gets, for the header line. */
static void print_groups(const model *m)
{
    memory G;
    memory_layout(&G, &m->c, NULL);
    printf("  memory groups:");
    for (int i = 0; i < G.n; ++i) {
        char layers[64];
        printf("%s %s (layers %s", i ? "," : "", group_kind_name(&G.g[i]), group_layers(&G.g[i], layers, sizeof layers));
        if (G.g[i].type == LAYER_SLIDING) printf(", window %d", m->c.window);
        if (G.g[i].type == LAYER_CONV) printf(", state %d x %d floats", m->c.conv_L - 1, m->c.hidden);
        printf(")");
    }
    printf("; checkpoints at every multiple of %d tokens\n", CHECKPOINT_EVERY);
}

/* Speculative decoding (--draft K, default 4; 0: off): rollback through the memory's
   reserve (kvc_cache_config.reserve = K in its ROTATING and RECURRENT groups), on
   models whose memory has such a group. Teacher-forced on the first case with more
   than 2K reference rows: prefill its prompt, then in rounds draft the reference's
   next k <= K tokens of which the last j (0, 1, .., k in turn) are replaced by wrong
   ids, feed them (in one batch, or one token a batch), compare the logits of the
   positions whose prefix is right with the reference, reject the j wrong tokens with
   kvc_memory_trim (after the window has wrapped: only the reserve makes that
   possible) and continue from the first of them with the right one. Every reference
   row must be compared and within the type's bound (f32 and f16). A draft of a
   recurrent group in one batch needs each drafted token's state handed over
   (kvc_state_checkpoint), which forward() does only for named checkpoints, so
   recurrent models draft one token a batch (tests/test_reserve.c covers the rest).
   Prints one line per run; returns the failures and adds the runs to *runs. */
static int run_speculative(const model *m, const test_case *cases, int n_cases, int draft, int chunk, int *runs)
{
    const config *c = &m->c;
    const int vocab = c->vocab;
    const test_case *tc = NULL;
    memory L;
    int failures = 0, rolls = 0, recurrent = 0;
    memory_layout(&L, c, NULL);
    for (int i = 0; i < L.n; ++i) {
        rolls |= L.g[i].kind == KVC_KIND_ROTATING || L.g[i].kind == KVC_KIND_RECURRENT;
        recurrent |= L.g[i].kind == KVC_KIND_RECURRENT;
    }
    for (int i = 0; i < n_cases && !tc; ++i)
        if (cases[i].rows > 2 * draft) tc = &cases[i];
    if (draft < 1 || !rolls || !tc) return 0;
    for (int t = 0; t < 2; ++t) {
        for (int one_batch = recurrent ? 0 : 1; one_batch >= 0; --one_batch) {
            const type_spec *ts = &TYPES[t];
            const int32_t N = tc->prompt_len, T = tc->total_len;
            const int32_t max_batch = chunk > draft ? chunk : draft;
            kvc_group_config gc[MAX_GROUPS];
            kvc_memory_config mc;
            memory M;
            float *logits = alloc_floats((size_t)max_batch * vocab);
            unsigned char *seen = (unsigned char *)calloc((size_t)tc->rows, 1);
            double max_err = 0;
            int32_t pos, drafted = 0, rejected = 0, rounds = 0, compared = 0, len;
            int ok = 0;
            memory_layout(&M, c, NULL);
            memset(gc, 0, sizeof gc);
            if (!logits || !seen) goto fail;
            for (int i = 0; i < M.n; ++i) { /* the hybrid layout of memory_create, with a reserve */
                mem_group *g = &M.g[i];
                kvc_pool_config *pc = &gc[i].pool;
                KVC_CHECK(kvc_pool_config_init(pc));
                pc->n_layers = g->n_layers;
                if (g->kind == KVC_KIND_RECURRENT) {
                    pc->state_floats = conv_state_floats(c);
                } else {
                    pc->n_kv_heads = c->kv;
                    pc->head_dim_k = pc->head_dim_v = c->hd;
                    pc->type_k = pc->type_v = ts->type;
                    pc->page_cells = PAGE_CELLS;
                }
                KVC_CHECK(kvc_cache_config_init(&gc[i].cache, g->kind));
                if (g->kind == KVC_KIND_ROTATING) setup_rotating(&gc[i].cache, c, T, max_batch);
                if (g->kind == KVC_KIND_ROTATING || g->kind == KVC_KIND_RECURRENT) gc[i].cache.reserve = draft;
                g->window = g->type == LAYER_SLIDING ? c->window : 0;
            }
            KVC_CHECK(kvc_memory_config_init(&mc));
            mc.n_layers = c->layers;
            mc.layer_group = M.group_of;
            mc.n_groups = M.n;
            mc.groups = gc;
            mc.budget_bytes = BUDGET_BYTES;
            KVC_CHECK(kvc_memory_create(&mc, &M.mem));
            for (int i = 0; i < M.n; ++i) KVC_CHECK(kvc_memory_group(M.mem, i, &M.g[i].cache));
            for (pos = 0; pos < N; pos += len) { /* the prompt, in chunks; row 0: its last logits */
                len = N - pos < chunk ? N - pos : chunk;
                if (forward(m, &M, tc->tokens + pos, len, pos, NULL, 0, len - 1, logits) != 0) goto fail;
            }
            { /* row 0 */
                for (int v = 0; v < vocab; ++v) {
                    double d = fabs((double)logits[v] - tc->ref[v]);
                    if (!(d <= max_err)) max_err = d;
                }
                seen[0] = 1;
                compared++;
            }
            for (pos = N; pos < T; ++rounds) { /* tokens [0, pos) are right and in the memory */
                const int32_t k = T - pos < draft ? T - pos : draft, j = rounds % (k + 1);
                int32_t toks[64];
                for (int32_t i = 0; i < k; ++i) /* the reference's next k, the last j wrong */
                    toks[i] = i < k - j ? tc->tokens[pos + i] : (tc->tokens[pos + i] + 1 + i) % vocab;
                if (one_batch) {
                    if (forward(m, &M, toks, k, pos, NULL, 0, 0, logits) != 0) goto fail;
                } else {
                    for (int32_t i = 0; i < k; ++i)
                        if (forward(m, &M, toks + i, 1, pos + i, NULL, 0, 0, logits + (size_t)i * vocab) != 0)
                            goto fail;
                }
                for (int32_t i = 0; i < k - j; ++i) { /* logits after a right prefix: reference row */
                    const int32_t row = pos + i - (N - 1);
                    const float *ref = tc->ref + (size_t)row * vocab, *got = logits + (size_t)i * vocab;
                    for (int v = 0; v < vocab; ++v) {
                        double d = fabs((double)got[v] - ref[v]);
                        if (!(d <= max_err)) max_err = d;
                    }
                    seen[row] = 1;
                    compared++;
                }
                if (j > 0) KVC_CHECK(kvc_memory_trim(M.mem, j)); /* reject the wrong ones */
                drafted += k;
                rejected += j;
                pos += k - j;
            }
            ok = 1;
            for (int32_t r = 0; r < tc->rows; ++r) ok &= seen[r];
            ok &= max_err <= error_bound(ts, tc);
        fail:
            if (M.mem) {
                kvc_memory_stats st;
                if (kvc_memory_clear(M.mem) != KVC_OK || kvc_memory_stats_get(M.mem, &st) != KVC_OK ||
                    st.bytes_used != 0)
                    ok = 0, errorf("speculative: the cleared memory still holds pages");
                if (kvc_memory_destroy(M.mem) != KVC_OK) ok = 0;
            }
            if (!g_quiet || !ok)
                printf("  speculative %s: draft %d %s, %s, reserve %d: %d rows compared (all %d), max|err| %.2e, "
                       "%d of %d drafted tokens rejected and trimmed  %s\n",
                       tc->name, draft, one_batch ? "in one batch" : "one token a batch", kvc_type_name(ts->type),
                       draft, (int)compared, (int)tc->rows, max_err, (int)rejected, (int)drafted,
                       ok ? "ok" : "FAIL");
            failures += !ok;
            ++*runs;
            free(logits);
            free(seen);
        }
    }
    return failures;
}

/* ==================================================================================
   9. main
   ================================================================================== */

static void usage(void)
{
    fprintf(stderr, "usage: tinylm [--chunk N] [--draft K] [--quiet] [--reference] [--vk] [--f16-tail N] [--types LIST] [MODEL_DIR ...]\n"
                    "       tinylm --share-write|--share-read STORE FILE [--chunk N] [--quiet] MODEL_DIR\n"
                    "  runs every folder of tests/data with a config.txt by default, and every storage type\n"
                    "  (--types f32,q4_0+rot: only those; the rotation check needs q8_0, q4_0 and their +rot)\n"
                    "  --share-*: the long prompt shared by two runs through STORE (dir:PATH, or redis:HOST:PORT\n"
                    "  in a build with -DTINYLM_REDIS), the writer's logits in FILE\n");
}

/* --types: keep the named storage types (a comma-separated list of TYPES' names) */
static int select_types(const char *list)
{
    int on[COUNT_OF(TYPES)] = {0}, any = 0;
    while (*list) {
        size_t n = strcspn(list, ",");
        int found = 0;
        for (int t = 0; t < COUNT_OF(TYPES); ++t)
            if (strlen(TYPES[t].name) == n && !strncmp(TYPES[t].name, list, n)) on[t] = found = any = 1;
        if (!found) return -1;
        list += n + (list[n] == ',');
    }
    if (!any) return -1;
    for (int t = 0; t < COUNT_OF(TYPES); ++t) g_type_off[t] = !on[t];
    return 0;
}

static int compare_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The folders of `root` that hold a config.txt, sorted, as "root/NAME" strings in
   *out (free each and the array). Returns the count, -1 on error. */
static int list_model_dirs(const char *root, char ***out)
{
    char **dirs = NULL;
    int n = 0;
#ifndef _WIN32
    DIR *d = opendir(root);
    struct dirent *e;
    if (!d) {
        errorf("cannot list %s: %s", root, strerror(errno));
        return -1;
    }
    while ((e = readdir(d)) != NULL) {
        char dir[1024], path[1100];
        FILE *f;
        char **grown;
        if (e->d_name[0] == '.') continue;
        snprintf(dir, sizeof dir, "%s/%s", root, e->d_name);
        join_path(path, sizeof path, dir, "config.txt");
        if (!(f = fopen(path, "rb"))) continue;
        fclose(f);
        if (!(grown = (char **)realloc(dirs, (size_t)(n + 1) * sizeof *dirs)) ||
            !(grown[n] = (char *)malloc(strlen(dir) + 1))) {
            if (grown) dirs = grown;
            errorf("out of memory");
            for (int i = 0; i < n; ++i) free(dirs[i]);
            free(dirs);
            closedir(d);
            return -1;
        }
        dirs = grown;
        memcpy(dirs[n++], dir, strlen(dir) + 1);
    }
    closedir(d);
    if (n > 1) qsort(dirs, (size_t)n, sizeof *dirs, compare_names);
#else
    (void)root;
#endif
    *out = dirs;
    return n;
}

int main(int argc, char **argv)
{
    const char *const *dirs = NULL;
    char **listed = NULL;
    const char **given = (const char **)malloc((size_t)argc * sizeof *given);
    int n_dirs = 0, n_given = 0, n_listed = 0, chunk = DEFAULT_CHUNK, reference = 0, draft = 4;
    int runs = 0, failures = 0;
    share_opts share = {0, NULL, NULL};

    if (!given) return 2;
    for (int i = 1; i < argc; ++i) {
        if (!strcmp(argv[i], "--chunk")) {
            char *end = NULL;
            long v = i + 1 < argc ? strtol(argv[++i], &end, 10) : 0;
            if (!end || *end || v < 1 || v > 1 << 20) {
                errorf("--chunk needs a number between 1 and %d", 1 << 20);
                free(given);
                return 2;
            }
            chunk = (int)v;
        } else if (!strcmp(argv[i], "--f16-tail")) {
            char *end = NULL;
            long v = i + 1 < argc ? strtol(argv[++i], &end, 10) : -1;
            if (!end || *end || v < 0 || v > 1 << 20) {
                errorf("--f16-tail needs a number between 0 and %d", 1 << 20);
                free(given);
                return 2;
            }
            g_f16_tail = (int32_t)v;
        } else if (!strcmp(argv[i], "--types")) {
            if (i + 1 >= argc || select_types(argv[++i]) != 0) {
                errorf("--types needs a comma-separated list of f32, f16, bf16, q8_0, q8_0+rot, q4_0, q4_0+rot");
                free(given);
                return 2;
            }
        } else if (!strcmp(argv[i], "--draft")) {
            char *end = NULL;
            long v = i + 1 < argc ? strtol(argv[++i], &end, 10) : -1;
            if (!end || *end || v < 0 || v > 32) {
                errorf("--draft needs a number between 0 and 32");
                free(given);
                return 2;
            }
            draft = (int)v;
        } else if (!strcmp(argv[i], "--share-write") || !strcmp(argv[i], "--share-read")) {
            share.role = !strcmp(argv[i], "--share-write") ? 1 : 2;
            if (i + 2 >= argc || (strncmp(argv[i + 1], "dir:", 4) && strncmp(argv[i + 1], "redis:", 6))) {
                errorf("%s needs a store (dir:PATH or redis:HOST:PORT) and a file", argv[i]);
                free(given);
                return 2;
            }
            share.store = argv[++i];
            share.logits = argv[++i];
        } else if (!strcmp(argv[i], "--quiet")) {
            g_quiet = 1;
        } else if (!strcmp(argv[i], "--vk")) {
#ifdef TINYLM_VK
            g_vk.on = 1;
#else
            errorf("--vk needs a build with -DTINYLM_VK (and the Vulkan headers)");
            return 2;
#endif
        } else if (!strcmp(argv[i], "--reference")) {
            reference = 1;
        } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage();
            free(given);
            return 0;
        } else if (argv[i][0] == '-' && argv[i][1]) {
            errorf("unknown option %s", argv[i]);
            usage();
            free(given);
            return 2;
        } else {
            given[n_given++] = argv[i];
        }
    }
    if (n_given) {
        dirs = given, n_dirs = n_given;
    } else {
        if ((n_listed = list_model_dirs("tests/data", &listed)) <= 0) {
            if (n_listed == 0) errorf("no model folder (with a config.txt) in tests/data: name one");
            free(given);
            return 2;
        }
        dirs = (const char *const *)listed, n_dirs = n_listed;
    }
#ifdef TINYLM_VK
    if (g_vk.on) { /* a compute device of our own, with the validation layer when installed */
        kvc_vk_device_options o;
        memset(&o, 0, sizeof o);
        o.validation = 1;
        o.device_index = -1;
        if (kvc_vk_loader_open(&g_vk.loader) == KVC_OK) o.get_instance_proc_addr = g_vk.loader.get_instance_proc_addr;
        if (o.get_instance_proc_addr == NULL || kvc_vk_device_create(&o, &g_vk.ctx) != KVC_OK) {
            errorf("--vk: no Vulkan loader or device with compute and VK_KHR_push_descriptor");
            return 2;
        }
        kvc_vk_context_info(g_vk.ctx, &g_vk_info);
        if (!g_quiet) printf("Vulkan backend: %s, validation %s\n", g_vk_info.device_name, g_vk_info.validation ? "on" : "off");
    }
#endif

    for (int d = 0; d < n_dirs; ++d) {
        model m;
        test_case *cases = NULL;
        int n_cases = 0;
        if (model_load(&m, dirs[d]) != 0) {
            errorf("%s: cannot load the model", dirs[d]);
            failures++, runs++;
            continue;
        }
        if (load_cases(dirs[d], m.c.vocab, &cases, &n_cases) != 0) {
            errorf("%s: cannot load the reference cases", dirs[d]);
            model_free(&m);
            failures++, runs++;
            continue;
        }
        if (!g_quiet) {
            printf("%s: %d layers, %d heads / %d kv heads, head_dim %d, hidden %d, vocab %d, ", dirs[d],
                   m.c.layers, m.c.heads, m.c.kv, m.c.hd, m.c.hidden, m.c.vocab);
            if (model_is_hybrid(&m.c)) {
                printf("layers");
                for (int l = 0; l < m.c.layers; ++l) printf(" %s", LAYER_TYPE_NAMES[m.c.type[l]]);
            } else if (m.c.window) {
                printf("sliding window %d", m.c.window);
            } else {
                printf("no sliding window");
            }
            if (m.c.qk_norm) printf(", q/k norm");
            printf(", %d cases, chunk %d\n", n_cases, chunk);
            if (model_is_hybrid(&m.c) && !reference) print_groups(&m);
            print_header();
        }
        if (share.role) {
            failures += run_shared(&m, dirs[d], cases, n_cases, chunk, &share, &runs);
        } else if (reference) {
            /* cache-free check of the model math alone */
            const type_spec ts = {KVC_TYPE_F32, 0, 1, 0, "f32"};
            session s;
            memset(&s, 0, sizeof s);
            s.m = &m;
            for (int i = 0; i < n_cases; ++i) {
                score sc;
                double t0 = seconds_now();
                int run_ok;
                memset(&sc, 0, sizeof sc);
                run_ok = run_case_reference(&s, &cases[i], &sc) == 0;
                sc.seconds = seconds_now() - t0;
                failures += !report(&cases[i], "none", "f32", &ts, &sc, run_ok);
                runs++;
            }
        } else {
            score total[COUNT_OF(TYPES)]; /* per type, over every kind and case */
            memset(total, 0, sizeof total);
            for (int k = 0; k < COUNT_OF(KINDS); ++k) {
                if (KINDS[k].needs_window && m.c.window == 0) continue;
                if (KINDS[k].hybrid != model_is_hybrid(&m.c)) continue;
                for (int t = 0; t < COUNT_OF(TYPES); ++t) {
                    if (g_type_off[t]) continue;
                    failures += run_session(&m, cases, n_cases, &KINDS[k], &TYPES[t], chunk, &total[t]);
                    runs += n_cases + 1; /* the cases, then the teardown (leak) check */
                }
            }
            failures += rotation_summary(total, &runs);
#ifdef TINYLM_VK
            if (g_vk.on) {
                failures += run_vk_saveload(&m, &cases[0], chunk, &runs);
                if (!g_quiet) printf("  (radix turns and speculative runs: CPU only)\n");
            } else
#endif
                failures += run_radix_turns(&m, cases, n_cases, chunk, &runs);
#ifdef TINYLM_VK
            if (!g_vk.on)
#endif
                failures += run_radix_tier(&m, cases, n_cases, chunk, &runs);
#ifdef TINYLM_VK
            if (!g_vk.on) /* the speculative runs build a host memory of their own */
#endif
                failures += run_speculative(&m, cases, n_cases, draft, chunk, &runs);
        }
        cases_free(cases, n_cases);
        model_free(&m);
    }
    free(given);
    for (int i = 0; i < n_listed; ++i) free(listed[i]);
    free(listed);
#ifdef TINYLM_VK
    if (g_vk.on) { /* the validation layer must have said nothing */
        kvc_vk_context_info(g_vk.ctx, &g_vk_info);
        runs++;
        if (g_vk_info.validation_messages) {
            failures++;
            errorf("Vulkan validation: %u messages, last: %s", g_vk_info.validation_messages, g_vk_info.last_message);
        }
        kvc_vk_buffer_destroy(g_vk.ctx, &g_vk.q);
        kvc_vk_buffer_destroy(g_vk.ctx, &g_vk.k);
        kvc_vk_buffer_destroy(g_vk.ctx, &g_vk.v);
        kvc_vk_buffer_destroy(g_vk.ctx, &g_vk.out);
        kvc_vk_buffer_destroy(g_vk.ctx, &g_vk.state);
        kvc_vk_context_destroy(g_vk.ctx);
        kvc_vk_loader_close(&g_vk.loader);
    }
#endif
    printf("tinylm: %s: %d of %d checks failed (%d model%s, chunk %d%s%s)\n", failures ? "FAIL" : "PASS",
           failures, runs, n_dirs, n_dirs == 1 ? "" : "s", chunk, reference ? ", reference mode" : "",
#ifdef TINYLM_VK
           g_vk.on ? ", Vulkan backend" :
#endif
           "");
    return failures ? 1 : 0;
}
