/* test_vk.c - the Vulkan backend against the CPU reference.

   Every random episode runs the same operations on two pools with the same configuration:
   a CPU pool (kvcache.h alone) and a kvc_vk_pool (bookkeeping on the host, K/V on the
   GPU). Both make the same bookkeeping decisions, so their page ids match. After every
   append and RoPE shift the GPU's stored values are compared with the CPU's (bit-exact
   for f32/f16/bf16, within one quantisation step for q8_0/q4_0, within a rounding step
   after a float-vs-double rotation), then the CPU pool takes the GPU's bytes, so that
   GPU attention is compared with kvc_attention over identical data (5e-5), and the GPU
   gather with kvc_cache_gather after every kind of page move (copy-on-write, restore,
   merge, defrag, per-sequence snapshots). Validation layers are on when installed and
   must report nothing.

   No Vulkan headers, loader or device: prints a skip and RESULT vk 0 0.
   usage: test_vk [seed]        KVC_TEST_SCALE scales the episode count (3 at least, one
   per cache kind); the page buffers grow in small steps here (KVC_VK__GROW_BYTES), so the
   episodes copy them into larger ones often, and trim them now and then; KVC_VK_EPISODE=e runs episode e alone (make test does under valgrind);
   KVC_VK_PART=mask runs only some parts: 1 the unit tests (errors, page round trips, rotated
   decode), 2 the episodes, 4 the hybrid-model episodes (default 7); KVC_VK_HOST_ONLY=1 the
   host side alone (errors, saves and loads: what make test runs under valgrind);
   KVC_VK_TIERS_ONLY=1 the tiers under device trees alone (=2: without the append kernel);
   KVC_VK_VALIDATION=0 without the validation layers (make test under ASan);
   KVC_VK_PREFILL_ONLY=1 the prefill checks alone (test_prefill). */
#define _POSIX_C_SOURCE 200809L /* mkdtemp, rmdir: the tiers' directory store */
#define KVCACHE_IMPLEMENTATION
#include "kvcache.h"
#include "tk.h"
#include <time.h>
#include <stdlib.h>
#include <unistd.h>

#if defined(__has_include)
#if __has_include(<vulkan/vulkan.h>)
#define HAVE_VK 1
#endif
#endif

#ifndef HAVE_VK
int main(void) {
    printf("skip: no Vulkan headers (install libvulkan-dev)\n");
    return tk_report("vk");
}
#else
#define VK_NO_PROTOTYPES
#ifndef KVC_VK__GROW_BYTES
#define KVC_VK__GROW_BYTES 4096 /* page buffers grow a page or two at a time: every episode replaces them */
#endif
#define KVC_VK__CHECK_CELLS /* every CAUSAL cell span an attention call skips is checked against a rebuild */
#define KVCACHE_VK_IMPLEMENTATION
#define KVCACHE_VK_HELPERS /* the loader, a device of its own, buffers, transfers */
#include "kvcache_vk.h"

static kvc_vk_context *ctx;
static kvc_vk_loader loader;

/* the backend's host memory and its pools' go through this: everything must come back
   (the driver's own allocations are its business; LeakSanitizer is off for this test) */
static long live_allocs;
static void *count_alloc(size_t n, void *user) { (void)user; live_allocs++; return malloc(n); }
static void count_free(void *p, void *user) { (void)user; if (p) { live_allocs--; free(p); } }
static uint64_t g_seed, run_seed;
static int types_avail; /* storage types this kvcache.h has */
static int cpu_device;  /* the device is a CPU driver (lavapipe): pipelines are slow to make */

/* host-visible scratch buffers for inputs and outputs */
static kvc_vk_buffer in_buf, q_buf, out_buf, gk_buf, gv_buf;

static void ensure(kvc_vk_buffer *b, size_t bytes) {
    if (b->buffer && b->size >= bytes) return;
    if (b->buffer) kvc_vk_buffer_destroy(ctx, b);
    if (kvc_vk_buffer_create(ctx, bytes < 256 ? 256 : bytes, 1, b) != KVC_OK) {
        fprintf(stderr, "buffer of %zu bytes failed\n", bytes);
        exit(2);
    }
    /* defined contents: a kernel given a buffer the test never filled (the error tests)
       branches on its values (the non-finite check of an append), which valgrind reports */
    if (b->mapped) memset(b->mapped, 0, (size_t)b->size);
}

typedef struct side {
    kvc_pool *pool;
    kvc_vk_pool *vk; /* NULL: the CPU side */
    kvc_cache *cache;
    kvc_snapshot *snap[2];
    int rotated; /* keys went through a RoPE shift: float rounding of the rotation differs */
} side;

#define GROW_MAX 64.0 /* shape.growing: the largest factor on a key */

typedef struct shape {
    int32_t layers, kv_heads, hdk, hdv, group, page_cells;
    kvc_type tk, tv;
    kvc_kind kind;
    int32_t window, sinks;
    int no_subgroup;
    uint32_t disable_features; /* KVC_VK_FEATURE_* the pool does not use */
    int host_layout;           /* kvc_vk_pool_options.host_layout: no planar q8_0/q4_0 pages */
    uint32_t rotate;           /* kvc_pool_config.rotate (rotated storage) of both pools */
    /* keys and queries constant over each run of 32 values: every q4_0 key code 0 (value -8)
       and q8_0 code +-127, so attn_split_q's integer sums reach their largest magnitudes
       (q4_0 keys: 16 x 8 x 127, packed two to a word) */
    int extreme;
    /* keys that grow along the view: 2^(c / growing) times for the key put at cell (CAUSAL) or
       token c, up to GROW_MAX times, so a split's later tiles pass its running maxima by far (the
       split passes' rescale of what they have summed; random scores alone stay within
       attn_split_q's slack of the first tile's maxima); 0: plain keys */
    float growing;
    /* keys and values 2^12 times smaller (queries 2^12 times larger, the attention's tolerance
       2^12 times smaller): q8_0 / q4_0 block scales are f16 subnormals, which a driver may
       flush in unpackHalf2x16 (kvcache_vk.h's kvc_vk__probe_halves) */
    int tiny;
    int halves_off; /* the episode's pools take the scales by integer operations (h2f) even where
                       unpackHalf2x16 keeps subnormals */
    /* attn_split_cm's small calls give each subgroup up to 4 tiles (64 cells) instead of
       spreading over about 512 subgroups of one tile: below a few thousand cells only this
       runs its tile loop's carried state (the next tile's loads, maxima, R_b) */
    int long_tiles;
    int wide; /* small calls on the large calls' attn_split_cm workgroups (kvc_vk_context.cm_wide) */
    int prefill; /* kvc_vk_pool_options.prefill_min_queries = 8 (test_prefill) */
} shape;

static VkCommandBuffer begin_cmd(void) {
    VkCommandBuffer cmd;
    if (kvc_vk_context_begin(ctx, &cmd) != KVC_OK) { fprintf(stderr, "kvc_vk_context_begin failed\n"); exit(2); }
    return cmd;
}

/* tolerance of a stored type against the CPU's conversion of the same input */
static double store_tol(kvc_type t) {
    if ((int)t == 3) return 1.0 / 127 * 1.01; /* q8_0: one step of the block scale (relative to amax <= 1) */
    if ((int)t == 4) return 1.0 / 8 * 1.01;   /* q4_0: one step */
    return 0.0;                               /* f32/f16/bf16: bit-exact */
}

static double rot_tol(kvc_type t) {
    static const double tol[5] = {4e-6, 2e-3, 1.6e-2, 1.0 / 127 * 2.02, 1.0 / 8 * 2.02};
    return tol[(int)t];
}

static const kvc_namespace SL_NS = {0x736176ull, 36};

/* ---- saves and loads (issue 36): kvcache.h's files, from and into device pools ---- */

typedef struct blob { unsigned char *data; size_t size; } blob;
typedef kvc_result (*save_fn)(const void *what, const kvc_io *io);
static kvc_result save_cache_fn(const void *c, const kvc_io *io) {
    static const int32_t toks[3] = {5, 6, 7};
    return kvc_cache_save((const kvc_cache *)c, SL_NS, toks, 3, io);
}
static int32_t sl_seq; /* the sequence save_seq_fn saves */
static kvc_result save_seq_fn(const void *c, const kvc_io *io) {
    return kvc_seq_save((const kvc_cache *)c, sl_seq, SL_NS, NULL, 0, io);
}
static kvc_result save_memory_fn(const void *m, const kvc_io *io) {
    return kvc_memory_save((const kvc_memory *)m, SL_NS, NULL, 0, io);
}
static int32_t g_tree_n; /* the entry save_tree_fn saves: tokens 7 i % 50, i < g_tree_n */
static int g_tree_saved; /* memory-tree entries saved and loaded on the device */
static kvc_result save_tree_fn(const void *t, const kvc_io *io) {
    int32_t toks[96], i;
    for (i = 0; i < 96; ++i) toks[i] = 7 * i % 50;
    return kvc_radix_save((kvc_radix *)(uintptr_t)t, SL_NS, toks, g_tree_n, io);
}
/* whether fn saves what (a counting pass) */
static int save_blob_ok(save_fn fn, const void *what) {
    kvc_mem m;
    kvc_io io;
    memset(&m, 0, sizeof(m));
    kvc_io_memory(&m, &io);
    return fn(what, &io) == KVC_OK;
}
/* into memory, sized by a counting pass first */
static blob save_blob(save_fn fn, const void *what) {
    kvc_mem m;
    kvc_io io;
    blob b = {NULL, 0};
    memset(&m, 0, sizeof(m));
    TK_OK(kvc_io_memory(&m, &io));
    TK_OK(fn(what, &io));
    b.data = (unsigned char *)malloc(m.size ? m.size : 1);
    m.data = b.data;
    m.capacity = m.size;
    m.size = 0;
    TK_OK(fn(what, &io));
    b.size = m.size;
    return b;
}
static kvc_io blob_reader(kvc_mem *m, const blob *b, size_t size) {
    kvc_io io;
    memset(m, 0, sizeof(*m));
    m->data = b->data;
    m->size = m->capacity = size;
    kvc_io_memory(m, &io);
    return io;
}
static kvc_result load_cache(kvc_cache *c, const blob *b) {
    kvc_mem m;
    kvc_io io = blob_reader(&m, b, b->size);
    return kvc_cache_load(c, SL_NS, &io, NULL, 0, NULL);
}
static int same_blob(const blob *a, const blob *b) {
    return a->size == b->size && memcmp(a->data, b->data, a->size) == 0;
}

/* gather and raw page bytes */
static void compare_data(side *s, const shape *sh) {
    int32_t n0, n1, l, i;
    int32_t nk = sh->kv_heads * sh->hdk, nv = sh->kv_heads * sh->hdv;
    TK_OK(kvc_vk_cmd_gather(s[1].vk, VK_NULL_HANDLE, s[1].cache, 0, NULL, NULL, NULL, 0, &n1));
    TK_OK(kvc_cache_gather(s[0].cache, 0, NULL, NULL, NULL, 0, &n0));
    TK_EQ(n0, n1);
    if (n0 != n1 || n0 == 0) return;
    for (l = 0; l < sh->layers; ++l) {
        float *k0 = (float *)malloc(sizeof(float) * (size_t)n0 * (size_t)(nk + nv)), *v0 = k0 + (size_t)n0 * nk;
        int32_t *p0 = (int32_t *)malloc(sizeof(int32_t) * 2 * (size_t)n0), *p1 = p0 + n0, bad = 0;
        kvc_vk_tensor gk, gv;
        VkCommandBuffer cmd;
        const float *k1, *v1;
        double tk = store_tol(sh->tk), tv = store_tol(sh->tv);
        /* rotated storage, quantised: a step of the rotated block (its amax below 4 here)
           comes back spread over the head by R^T; float types stay bit-exact (the same f32
           sums and products on both sides) */
        if (sh->rotate & KVC_ROTATE_K) tk *= 4;
        if (sh->rotate & KVC_ROTATE_V) tv *= 4;
        if (sh->growing > 0) tk *= GROW_MAX; /* keys up to GROW_MAX times larger */
        /* the GPU rotates in float, kvcache.h in double: a rounding step of the type apart */
        if (s[0].rotated) {
            double r = rot_tol(sh->tk) * (sh->growing > 0 ? GROW_MAX : 1);
            tk = tk > r ? tk : r;
        }
        TK_OK(kvc_cache_gather(s[0].cache, l, k0, v0, p0, n0, &n0));
        ensure(&gk_buf, sizeof(float) * (size_t)n0 * nk);
        ensure(&gv_buf, sizeof(float) * (size_t)n0 * nv);
        memset(&gk, 0, sizeof(gk));
        memset(&gv, 0, sizeof(gv));
        gk.buffer = gk_buf.buffer;
        gv.buffer = gv_buf.buffer;
        cmd = begin_cmd();
        TK_OK(kvc_vk_cmd_gather(s[1].vk, cmd, s[1].cache, l, &gk, &gv, p1, n0, &n1));
        TK_OK(kvc_vk_context_submit_wait(ctx, cmd));
        k1 = (const float *)gk_buf.mapped;
        v1 = (const float *)gv_buf.mapped;
        for (i = 0; i < n0; ++i) bad += p0[i] != p1[i];
        for (i = 0; i < n0 * nk; ++i) bad += tk == 0 ? memcmp(&k0[i], &k1[i], 4) != 0 : !(fabs(k0[i] - k1[i]) <= tk);
        for (i = 0; i < n0 * nv; ++i) bad += tv == 0 ? memcmp(&v0[i], &v1[i], 4) != 0 : !(fabs(v0[i] - v1[i]) <= tv);
        if (bad) {
            double w = 0;
            for (i = 0; i < n0 * nk; ++i) w = fabs(k0[i] - k1[i]) > w ? fabs(k0[i] - k1[i]) : w;
            fprintf(stderr, "gather layer %d: %d values differ (K worst %g)\n", l, bad, w);
        }
        TK_EQ(bad, 0);
        free(k0);
        free(p0);
    }
}

/* Make the CPU pool's bytes the GPU's (same page ids, same layout): attention is then
   compared over identical data, whatever rounding the two quantisers or rotations differ
   by (compare_data checked that difference first). */
static void sync_cpu_from_gpu(side *s, const shape *sh) {
    int32_t l;
    kvc_pool *cp = s[0].pool;
    size_t kb = cp->page_k_bytes * (size_t)cp->max_pages, vb = cp->page_v_bytes * (size_t)cp->max_pages;
    VkCommandBuffer cmd = begin_cmd();
    TK_OK(kvc_vk_pool_cmd_sync(s[1].vk, cmd)); /* page events still queued are part of the state */
    TK_OK(kvc_vk_context_submit_wait(ctx, cmd));
    (void)kb; (void)vb;
    for (l = 0; l < sh->layers; ++l) { /* in kvcache.h's layout, whatever the device's; the
                                           pages handed out (the others are never read) */
        int32_t n = kvc_vk_pool_host(s[1].vk)->page_hw;
        TK_OK(kvc_vk_pool_download(s[1].vk, l, 0, n, kvc__k_at(cp, l, 0, 0), kvc__v_at(cp, l, 0, 0)));
        /* and back now and then: the later comparisons see what the upload converted */
        if (g_seed % 3 == (uint64_t)l)
            TK_OK(kvc_vk_pool_upload(s[1].vk, l, 0, n, kvc__k_at(cp, l, 0, 0), kvc__v_at(cp, l, 0, 0)));
    }
    s[0].rotated = 0;
}

/* The free pages lowest on top, as kvc_vk_pool_cmd_trim leaves a device pool's: the CPU pool
   then hands out the same page ids. */
static void sort_free_pages(kvc_pool *p) {
    int32_t i, n = 0;
    for (i = p->max_pages - 1; i >= 0; --i)
        if (p->refcount[i] == 0) p->free_pages[n++] = (uint32_t)i;
    TK_EQ(n, p->n_free);
}

/* kvc_vk_pool_cmd_trim on the GPU side: its page buffers shrink to the pages in use, whose
   data the next comparisons check */
static void trim_both(side *s) {
    VkCommandBuffer cmd = begin_cmd();
    kvc_vk_device_stats st;
    memset(&st, 0, sizeof(st)); /* (gcc -O2 cannot see that the stats call fills it) */
    TK_OK(kvc_vk_pool_cmd_trim(s[1].vk, cmd));
    TK_OK(kvc_vk_context_submit_wait(ctx, cmd));
    sort_free_pages(s[0].pool);
    TK_OK(kvc_vk_pool_device_stats(s[1].vk, &st));
    TK_EQ(st.retiring_bytes, 0);
    TK_CHECK(st.pages_capacity >= kvc_vk_pool_host(s[1].vk)->page_hw);
}

static void put_both(side *s, const shape *sh, int32_t n, tk_rng *rng) {
    int32_t nk = sh->kv_heads * sh->hdk, nv = sh->kv_heads * sh->hdv, l, i;
    float *k = (float *)malloc(sizeof(float) * (size_t)n * (size_t)(nk + nv)), *v = k + (size_t)n * nk;
    uint32_t *cells = (uint32_t *)malloc(sizeof(uint32_t) * (size_t)n); /* the batch's cells (page * page_cells + slot) */
    const kvc_cache *c1 = s[1].cache;
    int32_t first = c1->cfg.kind == KVC_KIND_CAUSAL ? c1->batch_loc : c1->batch_begin; /* in the attention's view order */
    for (i = 0; i < n; ++i) cells[i] = kvc_vk__gid(c1, first + i);
    for (l = 0; l < sh->layers; ++l) {
        VkCommandBuffer cmd;
        kvc_vk_tensor tk_, tv_;
        int f16in = (tk_int(rng, 0, 3) == 0);
        for (i = 0; i < n * (nk + nv); ++i) k[i] = tk_float(rng);
        if (sh->extreme) /* each block of 32 keys one value, of either sign, 0.25 to 1 in magnitude */
            for (i = 0; i < n * nk; i += 32) {
                float a = (tk_pct(rng, 50) ? 1.0f : -1.0f) * (0.625f + 0.375f * tk_float(rng));
                int32_t j;
                for (j = i; j < i + 32 && j < n * nk; ++j) k[j] = a;
            }
        if (sh->tiny)
            for (i = 0; i < n * (nk + nv); ++i) k[i] *= 1.0f / 4096.0f;
        if (sh->growing > 0)
            for (i = 0; i < n; ++i) {
                int32_t j;
                float f = (float)fmin(pow(2.0, (first + i) / sh->growing), GROW_MAX);
                for (j = 0; j < nk; ++j) k[(size_t)i * nk + j] *= f;
            }
        if (f16in) /* f16 inputs: the CPU gets the same values */
            for (i = 0; i < n * (nk + nv); ++i) k[i] = kvc__f16_to_f32(kvc__f32_to_f16(k[i]));
        TK_OK(kvc_put(s[0].cache, l, k, v));
        ensure(&in_buf, sizeof(float) * (size_t)n * (size_t)(nk + nv));
        if (f16in) {
            uint16_t *h = (uint16_t *)in_buf.mapped;
            for (i = 0; i < n * (nk + nv); ++i) h[i] = kvc__f32_to_f16(k[i]);
        } else {
            memcpy(in_buf.mapped, k, sizeof(float) * (size_t)n * (size_t)(nk + nv));
        }
        tk_.buffer = tv_.buffer = in_buf.buffer;
        tk_.offset = 0;
        tv_.offset = (VkDeviceSize)n * nk * (f16in ? 2 : 4);
        tk_.f16 = tv_.f16 = f16in;
        cmd = begin_cmd();
        TK_OK(kvc_vk_cmd_append(s[1].vk, cmd, s[1].cache, l, &tk_, &tv_));
        TK_OK(kvc_vk_context_submit_wait(ctx, cmd));
    }
    free(k);
    if ((int)sh->tk <= 2 && (int)sh->tv <= 2) { /* float types: the rows appended are kvc_put's bytes, R k and R v too */
        kvc_pool *cp = s[0].pool;
        size_t kb = cp->page_k_bytes * (size_t)cp->max_pages, vb = cp->page_v_bytes * (size_t)cp->max_pages;
        unsigned char *buf = (unsigned char *)malloc(kb + vb);
        VkCommandBuffer cmd = begin_cmd();
        int32_t bad = 0;
        TK_OK(kvc_vk_pool_cmd_sync(s[1].vk, cmd));
        TK_OK(kvc_vk_context_submit_wait(ctx, cmd));
        for (l = 0; l < sh->layers; ++l) {
            TK_OK(kvc_vk_pool_download(s[1].vk, l, 0, cp->max_pages, buf, buf + kb));
            for (i = 0; i < n; ++i) {
                size_t g = cells[i];
                bad += memcmp(buf + g * cp->k_row, kvc__k_at(cp, l, 0, 0) + g * cp->k_row, cp->k_row) != 0;
                bad += memcmp(buf + kb + g * cp->v_row, kvc__v_at(cp, l, 0, 0) + g * cp->v_row, cp->v_row) != 0;
            }
        }
        TK_EQ(bad, 0);
        free(buf);
    }
    free(cells);
    compare_data(s, sh); /* the conversion: bit-exact, or within a quantisation step */
    sync_cpu_from_gpu(s, sh);
}

/* the GPU's attention with q_buf's queries into got (and the lse buffer, where vd has it) */
static void gpu_attention(side *s, int32_t layer, const kvc_vk_attention_desc *vd, float *got, size_t nov) {
    VkCommandBuffer cmd;
    memset(out_buf.mapped, 0x7f, sizeof(float) * nov);
    if (vd->lse.buffer) memset(gk_buf.mapped, 0x7f, sizeof(float) * (size_t)vd->n_queries * (size_t)vd->n_heads + 64);
    cmd = begin_cmd();
    TK_OK(kvc_vk_cmd_attention(s[1].vk, cmd, s[1].cache, layer, vd));
    TK_OK(kvc_vk_context_submit_wait(ctx, cmd));
    memcpy(got, out_buf.mapped, sizeof(float) * nov);
}

/* GPU attention vs kvc_attention for the given queries. Now and then a few query rows (one
   query, one head) get a NaN, +inf or -inf: those rows must be all NaN on both sides (and
   their log-sum-exps NaN), the other rows the GPU's bits without the bad values. */
static void compare_attention(side *s, const shape *sh, int32_t layer, int32_t nq, const int32_t *pos,
                              const int32_t *seq, int32_t window, int nc, tk_rng *rng) {
    int32_t nh = sh->kv_heads * sh->group, i, bad = 0, n_poison, nan_bad = 0, moved = 0;
    size_t nqv = (size_t)nq * nh * sh->hdk, nov = (size_t)nq * nh * sh->hdv;
    float *q = (float *)malloc(sizeof(float) * (nqv + 3 * nov)), *ref = q + nqv, *got = ref + nov, *clean = got + nov;
    float clean_lse[4 * 128];
    unsigned char *poison = (unsigned char *)calloc((size_t)nq * nh, 1); /* rows with a NaN or an infinity */
    kvc_attention_desc d;
    kvc_vk_attention_desc vd;
    double worst = 0, tol = 5e-5;
    /* the attention variants now and then: sinks (some heads without), softcap, log-sum-exps */
    float sinks[128], *lse_ref = NULL, softcap = tk_pct(rng, 30) ? 0.5f + 4.0f * (float)(tk_float(rng) + 1.0) : 0.0f;
    int use_sinks = tk_pct(rng, 30), use_lse = tk_pct(rng, 40);
    for (i = 0; i < nh && i < 128; ++i) sinks[i] = tk_pct(rng, 20) ? -INFINITY : 3.0f * tk_float(rng);
    if (use_lse) lse_ref = (float *)malloc(sizeof(float) * 2 * (size_t)nq * (size_t)nh);
    for (i = 0; i < (int32_t)nqv; ++i) q[i] = tk_float(rng) * 2.0f;
    if (sh->extreme)
        for (i = 0; i < (int32_t)nqv; ++i) q[i] = q[i & ~31];
    if (sh->tiny) {
        for (i = 0; i < (int32_t)nqv; ++i) q[i] *= 4096.0f;
        tol /= 4096.0;
    }
    n_poison = tk_pct(rng, 30) ? tk_int(rng, 1, 3) : 0;
    ensure(&q_buf, sizeof(float) * nqv);
    ensure(&out_buf, sizeof(float) * nov);
    memcpy(q_buf.mapped, q, sizeof(float) * nqv);
    memset(&vd, 0, sizeof(vd));
    vd.n_queries = nq; vd.n_heads = nh; vd.q.buffer = q_buf.buffer; vd.out.buffer = out_buf.buffer;
    vd.pos = pos; vd.seq = seq; vd.window = window; vd.non_causal = nc;
    vd.sinks = use_sinks && nh <= 128 ? sinks : NULL;
    vd.softcap = softcap;
    if (use_lse) {
        ensure(&gk_buf, sizeof(float) * (size_t)nq * (size_t)nh + 64);
        vd.lse.buffer = gk_buf.buffer;
        vd.lse.offset = 64;
    }
    if (n_poison) { /* the GPU without the bad values first, then a few rows poisoned */
        static const float vals[3] = {NAN, INFINITY, -INFINITY};
        gpu_attention(s, layer, &vd, clean, nov);
        if (use_lse && nq * nh <= 4 * 128) memcpy(clean_lse, (const char *)gk_buf.mapped + 64, sizeof(float) * (size_t)nq * nh);
        for (i = 0; i < n_poison; ++i) {
            int32_t row = tk_int(rng, 0, nq * nh - 1);
            poison[row] = 1;
            q[(size_t)row * sh->hdk + (size_t)tk_int(rng, 0, sh->hdk - 1)] = vals[tk_int(rng, 0, 2)];
        }
        memcpy(q_buf.mapped, q, sizeof(float) * nqv);
    }
    memset(&d, 0, sizeof(d));
    d.n_queries = nq; d.n_heads = nh; d.q = q; d.out = ref; d.pos = pos; d.seq = seq; d.window = window; d.non_causal = nc;
    d.sinks = vd.sinks;
    d.softcap = softcap;
    d.lse = lse_ref;
    TK_OK(kvc_attention(s[0].cache, layer, &d));
    gpu_attention(s, layer, &vd, got, nov);
    for (i = 0; i < (int32_t)nov; ++i) {
        double e = fabs((double)got[i] - ref[i]);
        if (poison[(size_t)i / sh->hdv]) { /* a NaN row, on both sides */
            nan_bad += !(got[i] != got[i]) + !(ref[i] != ref[i]);
            continue;
        }
        if (n_poison) moved += memcmp(&got[i], &clean[i], 4) != 0;
        if (!(e <= tol)) bad++;
        if (e > worst || e != e) worst = e;
    }
    if (bad) fprintf(stderr, "attention: %d of %zu values off, worst %g (layer %d, nq %d, sinks %d, softcap %g)\n", bad, nov,
                     worst, layer, nq, d.sinks != NULL, softcap);
    if (nan_bad || moved)
        fprintf(stderr, "non-finite queries (%d rows): %d values of theirs not NaN, %d of the other rows changed\n", n_poison,
                nan_bad, moved);
    TK_EQ(bad, 0);
    TK_EQ(nan_bad, 0);
    TK_EQ(moved, 0);
    if (use_lse) { /* -INFINITY where the CPU has it, NaN for poisoned rows, within 1e-4 elsewhere */
        const float *gl = (const float *)((const char *)gk_buf.mapped + 64);
        int lbad = 0;
        for (i = 0; i < nq * nh; ++i)
            lbad += poison[i] ? !(gl[i] != gl[i]) + !(lse_ref[i] != lse_ref[i])
                    : isinf(lse_ref[i]) ? !(isinf(gl[i]) && gl[i] < 0)
                                        : !(fabs((double)gl[i] - lse_ref[i]) <= 1e-4 * (1 + fabs(lse_ref[i])));
        if (n_poison && nq * nh <= 4 * 128)
            for (i = 0; i < nq * nh; ++i) lbad += !poison[i] && memcmp(&gl[i], &clean_lse[i], 4) != 0;
        if (lbad) fprintf(stderr, "lse: %d of %d values off (first %g against %g)\n", lbad, nq * nh, gl[0], lse_ref[0]);
        TK_EQ(lbad, 0);
        free(lse_ref);
    }
    free(poison);
    free(q);
}

/* both sides must answer the same */
#define BOTH(call_cpu, call_gpu)                                                       \
    do {                                                                               \
        kvc_result r0_ = (call_cpu), r1_ = (call_gpu);                                 \
        if (r0_ != r1_) fprintf(stderr, "%s: cpu %d gpu %d\n", #call_cpu, r0_, r1_);    \
        TK_EQ(r0_, r1_);                                                               \
    } while (0)

static void make_sides(side *s, const shape *sh) {
    kvc_pool_config pc;
    kvc_cache_config cc;
    kvc_vk_pool_options o;
    int i;
    kvc_pool_config_init(&pc);
    pc.n_layers = sh->layers;
    pc.n_kv_heads = sh->kv_heads;
    pc.head_dim_k = sh->hdk;
    pc.head_dim_v = sh->hdv;
    pc.type_k = sh->tk;
    pc.type_v = sh->tv;
    pc.page_cells = sh->page_cells;
    pc.rotate = sh->rotate;
    TK_OK(kvc_pool_budget_for_tokens(&pc, 64 * sh->page_cells, &pc.budget_bytes)); /* 64 pages */
    memset(s, 0, 2 * sizeof(side));
    memset(&o, 0, sizeof(o));
    o.no_subgroup = sh->no_subgroup;
    o.disable_features = sh->disable_features;
    o.host_layout = sh->host_layout;
    o.max_splits = 4 + (int32_t)(g_seed % 5); /* several splits even on short caches */
    o.prefill_min_queries = sh->prefill ? 8 : -1; /* (-1: the decode kernel for every call) */
    TK_OK(kvc_pool_create(&pc, &s[0].pool));
    pc.runtime.allocator.alloc = count_alloc;
    pc.runtime.allocator.free = count_free;
    TK_OK(kvc_vk_pool_create(ctx, &pc, &o, &s[1].vk));
    s[1].pool = kvc_vk_pool_host(s[1].vk);
    kvc_cache_config_init(&cc, sh->kind);
    cc.window = sh->window;
    cc.sinks = sh->sinks;
    if (sh->kind == KVC_KIND_CAUSAL) {
        cc.capacity = 48;
        cc.max_seqs = 40;
        cc.rope.style = (g_seed & 1) ? KVC_ROPE_NEOX : KVC_ROPE_INTERLEAVED;
        cc.rope.theta = 10000.0f;
    }
    for (i = 0; i < 2; ++i) TK_OK(kvc_cache_create(s[i].pool, &cc, &s[i].cache));
}

static void free_sides(side *s) {
    int i;
    for (i = 0; i < 2; ++i) {
        kvc_snapshot_free(s[i].snap[0]);
        kvc_snapshot_free(s[i].snap[1]);
        kvc_cache_destroy(s[i].cache);
    }
    TK_OK(kvc_pool_destroy(s[0].pool));
    TK_OK(kvc_vk_pool_destroy(s[1].vk));
}

/* The device cache saves the bytes the CPU's saves (once the CPU took the device's),
   each side loads the other's file, the loaded device cache saves that file again, and
   both sides go on alike (issue 36). CAUSAL: one sequence too. */
static void saveload_both(side *s, const shape *sh, tk_rng *rng) {
    blob b0, b1, b2;
    sync_cpu_from_gpu(s, sh);
    b0 = save_blob(save_cache_fn, s[0].cache);
    b1 = save_blob(save_cache_fn, s[1].cache);
    TK_CHECK(same_blob(&b0, &b1));
    BOTH(load_cache(s[0].cache, &b1), load_cache(s[1].cache, &b0)); /* each the other's file */
    compare_data(s, sh);
    b2 = save_blob(save_cache_fn, s[1].cache);
    TK_CHECK(same_blob(&b0, &b2));
    free(b1.data);
    free(b2.data);
    if (sh->kind == KVC_KIND_CAUSAL) {
        int32_t d = tk_int(rng, 0, 5);
        kvc_mem m;
        kvc_io io;
        sl_seq = tk_int(rng, 0, 5);
        memset(&m, 0, sizeof(m));
        TK_OK(kvc_io_memory(&m, &io));
        if (kvc_seq_save(s[0].cache, sl_seq, SL_NS, NULL, 0, &io) == KVC_OK) { /* a sequence it holds */
            blob q0 = save_blob(save_seq_fn, s[0].cache), q1 = save_blob(save_seq_fn, s[1].cache);
            kvc_mem m0, m1;
            kvc_io i0 = blob_reader(&m0, &q1, q1.size), i1 = blob_reader(&m1, &q0, q0.size);
            TK_CHECK(same_blob(&q0, &q1));
            BOTH(kvc_seq_load(s[0].cache, d, SL_NS, &i0, NULL, 0, NULL), kvc_seq_load(s[1].cache, d, SL_NS, &i1, NULL, 0, NULL));
            compare_data(s, sh);
            free(q0.data);
            free(q1.data);
        }
    } else {
        int32_t n = tk_int(rng, 1, 3);
        kvc_result r0 = kvc_begin(s[0].cache, n, NULL, 0), r1 = kvc_begin(s[1].cache, n, NULL, 0);
        TK_EQ(r0, r1);
        if (r0 == KVC_OK) {
            put_both(s, sh, n, rng);
            compare_attention(s, sh, 0, n, NULL, NULL, 0, 0, rng);
        }
    }
    free(b0.data);
}

/* FULL and ROTATING: batches, snapshots, restores, trims, forks */
static void episode_linear(const shape *sh, tk_rng *rng, int steps) {
    side s[2];
    int step, i;
    make_sides(s, sh);
    if (sh->growing > 0 && sh->kind == KVC_KIND_FULL) { /* three tiles of growing keys first */
        int32_t left = (int32_t)(9.0f * sh->growing), n;
        for (; left > 0; left -= n) {
            n = left < 16 ? left : 16;
            BOTH(kvc_begin(s[0].cache, n, NULL, 0), kvc_begin(s[1].cache, n, NULL, 0));
            put_both(s, sh, n, rng);
        }
    }
    for (step = 0; step < steps; ++step) {
        int op = tk_int(rng, 0, 9);
        int32_t off0 = 0, off1 = 0;
        if (op <= 4) { /* a batch, then attention of its queries and of a few positions */
            int32_t n = tk_int(rng, 1, op == 0 ? 2 * sh->page_cells + 3 : 3), layer;
            kvc_result r0 = kvc_begin(s[0].cache, n, NULL, 0), r1 = kvc_begin(s[1].cache, n, NULL, 0);
            TK_EQ(r0, r1);
            if (r0 != KVC_OK) continue;
            put_both(s, sh, n, rng);
            layer = tk_int(rng, 0, sh->layers - 1);
            compare_attention(s, sh, layer, n, NULL, NULL, tk_int(rng, 0, 3) == 0 ? tk_int(rng, 1, 9) : 0,
                              tk_int(rng, 0, 5) == 0, rng);
            if (tk_int(rng, 0, 1)) {
                int32_t pos[3], off = 0;
                kvc_cache_offset(s[0].cache, &off);
                for (i = 0; i < 3; ++i) pos[i] = tk_int(rng, 0, off + 2);
                compare_attention(s, sh, layer, 3, pos, NULL, 0, 0, rng);
            }
        } else if (op == 5) {
            int k = tk_int(rng, 0, 1);
            int32_t from = tk_int(rng, -1, 20);
            for (i = 0; i < 2; ++i) kvc_snapshot_free(s[i].snap[k]), s[i].snap[k] = NULL;
            BOTH(kvc_snapshot_take(s[0].cache, from, KVC_POS_END, &s[0].snap[k]), kvc_snapshot_take(s[1].cache, from, KVC_POS_END, &s[1].snap[k]));
        } else if (op == 6) {
            int k = tk_int(rng, 0, 2);
            int32_t target = tk_int(rng, 0, 40);
            BOTH(kvc_cache_restore(s[0].cache, k < 2 ? s[0].snap[k] : NULL, target),
                 kvc_cache_restore(s[1].cache, k < 2 ? s[1].snap[k] : NULL, target));
        } else if (op == 7) {
            int32_t n = tk_int(rng, 0, 5);
            BOTH(kvc_cache_trim(s[0].cache, n), kvc_cache_trim(s[1].cache, n));
            if (tk_int(rng, 0, 1)) trim_both(s);
        } else if (op == 8) { /* merge or split the two snapshots */
            kvc_snapshot *m[2] = {NULL, NULL}, *a[2] = {NULL, NULL}, *b[2] = {NULL, NULL};
            if (tk_int(rng, 0, 1) && s[0].snap[0] && s[0].snap[1]) {
                kvc_snapshot_info i0, i1;
                kvc_snapshot_info_get(s[0].snap[0], &i0);
                kvc_snapshot_info_get(s[0].snap[1], &i1);
                if (i0.to == i1.from || sh->kind == KVC_KIND_ROTATING) {
                    kvc_result r0 = kvc_snapshot_merge(s[0].cache, s[0].snap[0], s[0].snap[1], &m[0]);
                    kvc_result r1 = kvc_snapshot_merge(s[1].cache, s[1].snap[0], s[1].snap[1], &m[1]);
                    TK_EQ(r0, r1);
                    for (i = 0; i < 2; ++i)
                        if ((i ? r1 : r0) == KVC_OK) { s[i].snap[0] = m[i]; s[i].snap[1] = NULL; }
                }
            } else if (s[0].snap[0]) {
                int32_t at = tk_int(rng, 0, 40);
                kvc_result r0 = kvc_snapshot_split(s[0].cache, s[0].snap[0], at, &a[0], &b[0]);
                kvc_result r1 = kvc_snapshot_split(s[1].cache, s[1].snap[0], at, &a[1], &b[1]);
                TK_EQ(r0, r1);
                for (i = 0; i < 2; ++i) {
                    if ((i ? r1 : r0) != KVC_OK) continue;
                    kvc_snapshot_free(s[i].snap[1]);
                    s[i].snap[0] = a[i];
                    s[i].snap[1] = b[i];
                }
            }
        } else { /* fork and continue on the fork: copy-on-write of the shared tail page */
            kvc_cache *f[2];
            BOTH(kvc_cache_fork(s[0].cache, &f[0]), kvc_cache_fork(s[1].cache, &f[1]));
            for (i = 0; i < 2; ++i) { kvc_cache_destroy(s[i].cache); s[i].cache = f[i]; }
        }
        kvc_cache_offset(s[0].cache, &off0);
        kvc_cache_offset(s[1].cache, &off1);
        TK_EQ(off0, off1);
        if (tk_int(rng, 0, 2) == 0) compare_data(s, sh);
    }
    compare_data(s, sh);
    saveload_both(s, sh, rng);
    free_sides(s);
}

/* CAUSAL: sequences, copy_prefix, remove with RoPE shift, keep, defrag, per-sequence snapshots */
static void episode_causal(const shape *sh, tk_rng *rng, int steps) {
    side s[2];
    int step, i;
    int32_t next[6] = {0, 0, 0, 0, 0, 0};
    make_sides(s, sh);
    for (step = 0; step < steps; ++step) {
        int op = tk_int(rng, 0, 9);
        if (op <= 4) {
            int32_t n = tk_int(rng, 1, 6), pos[6], seq[6];
            unsigned char nc[6];
            kvc_batch b;
            kvc_result r0, r1;
            for (i = 0; i < n; ++i) {
                seq[i] = tk_int(rng, 0, 5);
                pos[i] = next[seq[i]]++;
                nc[i] = tk_int(rng, 0, 7) == 0;
            }
            b.n_tokens = n; b.pos = pos; b.seq = seq; b.non_causal = tk_int(rng, 0, 1) ? nc : NULL;
            r0 = kvc_begin_batch(s[0].cache, &b);
            r1 = kvc_begin_batch(s[1].cache, &b);
            TK_EQ(r0, r1);
            if (r0 != KVC_OK) { for (i = 0; i < n; ++i) next[seq[i]]--; continue; }
            put_both(s, sh, n, rng);
            compare_attention(s, sh, tk_int(rng, 0, sh->layers - 1), n, NULL, NULL, 0, 0, rng);
            { /* explicit queries of other sequences */
                int32_t qp[2], qs[2];
                for (i = 0; i < 2; ++i) { qs[i] = tk_int(rng, 0, 5); qp[i] = tk_int(rng, 0, next[qs[i]] + 1); }
                compare_attention(s, sh, 0, 2, qp, qs, tk_int(rng, 0, 2) ? 0 : 4, 0, rng);
            }
        } else if (op == 5) {
            int32_t a = tk_int(rng, 0, 5), d = tk_int(rng, 0, 5), len = tk_int(rng, 0, 10);
            BOTH(kvc_seq_copy_prefix(s[0].cache, a, d, len), kvc_seq_copy_prefix(s[1].cache, a, d, len));
            if (a != d) next[d] = len < next[a] ? len : next[a];
        } else if (op == 6) { /* remove with shift: keys re-rotated on the GPU */
            int32_t q = tk_int(rng, 0, 5), b0 = tk_int(rng, 0, 8), e0 = b0 + tk_int(rng, 0, 4);
            kvc_result r0 = kvc_seq_remove(s[0].cache, q, b0, e0), r1 = kvc_seq_remove(s[1].cache, q, b0, e0);
            TK_EQ(r0, r1);
            if (r0 == KVC_OK && e0 > b0) {
                s[0].rotated = 1;
                compare_data(s, sh);
                sync_cpu_from_gpu(s, sh);
            }
            if (r0 == KVC_OK) {
                int32_t lo, hi;
                kvc_seq_pos_range(s[0].cache, q, &lo, &hi);
                next[q] = hi + 1;
            }
        } else if (op == 7) {
            int32_t n0 = 0, n1 = 0;
            BOTH(kvc_cache_defrag(s[0].cache, &n0), kvc_cache_defrag(s[1].cache, &n1));
            TK_EQ(n0, n1);
        } else if (op == 8) {
            int32_t q = tk_int(rng, 0, 5);
            for (i = 0; i < 2; ++i) kvc_snapshot_free(s[i].snap[0]), s[i].snap[0] = NULL;
            BOTH(kvc_seq_snapshot(s[0].cache, q, &s[0].snap[0]), kvc_seq_snapshot(s[1].cache, q, &s[1].snap[0]));
        } else if (s[0].snap[0]) {
            int32_t d = tk_int(rng, 0, 5);
            kvc_result r0 = kvc_seq_restore(s[0].cache, s[0].snap[0], d), r1 = kvc_seq_restore(s[1].cache, s[1].snap[0], d);
            TK_EQ(r0, r1);
            if (r0 == KVC_OK) { int32_t lo, hi; kvc_seq_pos_range(s[0].cache, d, &lo, &hi); next[d] = hi + 1; }
        }
        { /* a call of one shape every step: it finds the cells the last step's left in the
             device's metadata unless the step changed them (KVC_VK__CHECK_CELLS checks) */
            int32_t qp[2], qs[2] = {0, 1};
            for (i = 0; i < 2; ++i) qp[i] = next[qs[i]];
            compare_attention(s, sh, 0, 2, qp, qs, 0, 0, rng);
        }
        if (tk_int(rng, 0, 2) == 0) compare_data(s, sh);
    }
    compare_data(s, sh);
    saveload_both(s, sh, rng);
    free_sides(s);
}

static void dummy_shift(void *user, int32_t layer, float *k, int32_t n, int32_t hd, int32_t from, int32_t to) {
    (void)user; (void)layer; (void)k; (void)n; (void)hd; (void)from; (void)to;
}

/* Which of a unit test's pools run. Each pool compiles pipelines of its own, seconds of
   LLVM each on a CPU driver (lavapipe: the unit tests took 223 s CPU with Mesa's shader cache
   empty, 38 s with it full). Under valgrind (scale < 0.1) one pool in one_in; on a CPU driver
   below full scale (tests/run.sh runs 0.5) every other one, the half chosen by the seed, so
   that runs differ; a GPU runs them all at any scale. */
static int pool_case_runs(int *nth, int one_in) {
    uint64_t i = (uint64_t)(*nth)++;
    if (tk_scale() < 0.1) return i % (uint64_t)one_in == run_seed % (uint64_t)one_in;
    if (cpu_device && tk_scale() < 1) return (i + run_seed) % 2 == 0;
    return 1;
}

/* Rotated storage, decode: one query per cache, a batch of 1 and of 3 FULL caches in one
   kvc_vk_cmd_attention_batch call (one q buffer, one out buffer at other offsets), against
   kvc_attention over the same bytes. Every storage type (q8_0 / q4_0 planar and in the
   block layout), K, V or both rotated by turns from a seeded start, GQA groups 1-6, with
   and without subgroups: the split passes rotate q as they load it, the merge rotates
   the output back (attn_split_cm, which lavapipe cannot run, keeps rotate.comp's q pass).
   Below KVC_TEST_SCALE 0.1 (valgrind, where each pool's pipelines take LLVM a long time)
   one of the seven pools, by turns with the seed. */
static void test_rotated_decode(tk_rng *rng) {
    int ti, hl, nth = 0;
    for (ti = 0; ti < types_avail; ++ti)
        for (hl = 0; hl < (ti >= 3 ? 2 : 1); ++hl) {
            kvc_pool_config pc;
            kvc_cache_config cc;
            kvc_vk_pool_options o;
            kvc_vk_pool *vp;
            kvc_pool *cp, *hp;
            kvc_cache *cc0[3], *cc1[3];
            int32_t hd = tk_int(rng, 0, 1) ? 128 : 64, hdv = ti < 3 && tk_pct(rng, 30) ? 32 : hd, group = tk_int(rng, 1, 6);
            int32_t nkv = 2, nh = nkv * group, i, batch, bad = 0, lbad = 0;
            size_t nk = (size_t)nkv * hd, nv = (size_t)nkv * hdv;
            float *k, *q, *ref, lse_ref[3 * 12];
            if (!pool_case_runs(&nth, 7)) continue;
            kvc_pool_config_init(&pc);
            pc.n_layers = 1; pc.n_kv_heads = nkv; pc.head_dim_k = hd; pc.head_dim_v = hdv;
            pc.type_k = pc.type_v = (kvc_type)ti;
            pc.page_cells = 8;
            pc.rotate = 1u + (uint32_t)((run_seed + (uint64_t)ti + (uint64_t)hl) % 3); /* K, V or both */
            TK_OK(kvc_pool_budget_for_tokens(&pc, 3 * 64, &pc.budget_bytes));
            memset(&o, 0, sizeof(o));
            o.host_layout = hl;
            o.no_subgroup = tk_int(rng, 0, 1);
            o.max_splits = tk_int(rng, 1, 6);
            TK_OK(kvc_pool_create(&pc, &cp));
            TK_OK(kvc_vk_pool_create(ctx, &pc, &o, &vp));
            hp = kvc_vk_pool_host(vp);
            TK_EQ(kvc_vk_pool_planar(vp), !hl && ti >= 3 && hd >= 64);
            kvc_cache_config_init(&cc, KVC_KIND_FULL);
            k = (float *)malloc(sizeof(float) * 40 * (nk + nv)); /* a batch's K rows, then its V rows */
            q = (float *)malloc(sizeof(float) * 3 * ((size_t)nh * hd + 2 * (size_t)nh * hdv));
            ref = q + 3 * (size_t)nh * hd;
            for (i = 0; i < 3; ++i) {
                int32_t n = tk_int(rng, 1, 40), j;
                kvc_vk_tensor tk_, tv_;
                VkCommandBuffer cmd;
                TK_OK(kvc_cache_create(cp, &cc, &cc0[i]));
                TK_OK(kvc_cache_create(hp, &cc, &cc1[i]));
                TK_OK(kvc_begin(cc0[i], n, NULL, 0));
                TK_OK(kvc_begin(cc1[i], n, NULL, 0));
                for (j = 0; j < n * (int32_t)(nk + nv); ++j) k[j] = tk_float(rng);
                TK_OK(kvc_put(cc0[i], 0, k, k + (size_t)n * nk));
                ensure(&in_buf, sizeof(float) * (size_t)n * (nk + nv));
                memcpy(in_buf.mapped, k, sizeof(float) * (size_t)n * (nk + nv));
                memset(&tk_, 0, sizeof(tk_));
                memset(&tv_, 0, sizeof(tv_));
                tk_.buffer = tv_.buffer = in_buf.buffer;
                tv_.offset = (VkDeviceSize)n * nk * 4;
                cmd = begin_cmd();
                TK_OK(kvc_vk_cmd_append(vp, cmd, cc1[i], 0, &tk_, &tv_));
                TK_OK(kvc_vk_context_submit_wait(ctx, cmd));
            }
            { /* the CPU pool takes the device's bytes (the same page ids) */
                VkCommandBuffer cmd = begin_cmd();
                TK_OK(kvc_vk_pool_cmd_sync(vp, cmd));
                TK_OK(kvc_vk_context_submit_wait(ctx, cmd));
                TK_OK(kvc_vk_pool_download(vp, 0, 0, cp->max_pages, kvc__k_at(cp, 0, 0, 0), kvc__v_at(cp, 0, 0, 0)));
            }
            for (batch = 1; batch <= 3; batch += 2) {
                kvc_vk_attention_item items[3];
                size_t qn = (size_t)nh * hd, on = (size_t)nh * hdv;
                float *got = ref + 3 * on;
                VkCommandBuffer cmd;
                int use_lse = tk_int(rng, 0, 1);
                for (i = 0; i < batch * (int32_t)qn; ++i) q[i] = 2.0f * tk_float(rng);
                ensure(&q_buf, sizeof(float) * (3 * qn + 16));
                ensure(&out_buf, sizeof(float) * (3 * on + 16));
                ensure(&gk_buf, sizeof(float) * 3 * 12 + 64);
                memcpy((char *)q_buf.mapped + 64, q, sizeof(float) * batch * qn); /* at an offset: q's offsets count */
                memset(out_buf.mapped, 0x7f, sizeof(float) * (3 * on + 16));
                for (i = 0; i < batch; ++i) {
                    kvc_attention_desc d;
                    memset(&d, 0, sizeof(d));
                    d.n_queries = 1; d.n_heads = nh; d.q = q + i * qn; d.out = ref + i * on;
                    d.lse = use_lse ? lse_ref + i * nh : NULL;
                    TK_OK(kvc_attention(cc0[i], 0, &d));
                    memset(&items[i], 0, sizeof(items[i]));
                    items[i].cache = cc1[i];
                    items[i].desc.n_queries = 1;
                    items[i].desc.n_heads = nh;
                    items[i].desc.q.buffer = q_buf.buffer;
                    items[i].desc.q.offset = 64 + (VkDeviceSize)i * qn * 4;
                    items[i].desc.out.buffer = out_buf.buffer;
                    items[i].desc.out.offset = 32 + (VkDeviceSize)i * on * 4;
                    if (use_lse) {
                        items[i].desc.lse.buffer = gk_buf.buffer;
                        items[i].desc.lse.offset = 64 + (VkDeviceSize)i * nh * 4;
                    }
                }
                cmd = begin_cmd();
                TK_OK(kvc_vk_cmd_attention_batch(vp, cmd, 0, items, batch));
                TK_OK(kvc_vk_context_submit_wait(ctx, cmd));
                memcpy(got, (const char *)out_buf.mapped + 32, sizeof(float) * batch * on);
                for (i = 0; i < batch * (int32_t)on; ++i) bad += !(fabs((double)got[i] - ref[i]) <= 5e-5);
                for (i = 0; use_lse && i < batch * nh; ++i) {
                    float g = ((const float *)((const char *)gk_buf.mapped + 64))[i];
                    lbad += !(fabs((double)g - lse_ref[i]) <= 1e-4 * (1 + fabs(lse_ref[i])));
                }
            }
            if (bad || lbad)
                fprintf(stderr, "rotated decode %s%s, rotate %u, dims %d/%d, group %d: %d values, %d lse off\n",
                        kvc_type_name((kvc_type)ti), hl ? " host-layout" : "", pc.rotate, hd, hdv, group, bad, lbad);
            TK_EQ(bad, 0);
            TK_EQ(lbad, 0);
            for (i = 0; i < 3; ++i) { kvc_cache_destroy(cc0[i]); kvc_cache_destroy(cc1[i]); }
            free(k);
            free(q);
            TK_OK(kvc_pool_destroy(cp));
            TK_OK(kvc_vk_pool_destroy(vp));
        }
}

/* Decode over caches long enough for many splits (issue 37): every storage type (q8_0 /
   q4_0 rotated by turns), GQA groups 1-8, batches of 1 and 3 FULL caches of 150-1200 cells
   (up to 12000 where 256 splits are allowed),
   at most 1, 2-9, 64 or 256 split-K chunks (attn_merge takes up to 64 splits in its first
   round of loads, more in later rounds), against kvc_attention over the same bytes. Two calls
   in one command buffer (other queries, other outputs): the second reads what the first left
   behind (the partials buffer, the metadata). */
static void test_decode_splits(tk_rng *rng) {
    int ti, nth = 0;
    static const int32_t split_caps[4] = {1, 5, 64, 256};
    for (ti = 0; ti < types_avail; ++ti) {
        kvc_pool_config pc;
        kvc_cache_config cc;
        kvc_vk_pool_options o;
        kvc_vk_pool *vp;
        kvc_pool *cp, *hp;
        kvc_cache *cc0[3], *cc1[3];
        int32_t hd = tk_int(rng, 0, 1) ? 128 : 64, group = tk_int(rng, 1, 8), cap = split_caps[tk_int(rng, 0, 3)];
        /* at most 256 splits: a first cache of 9000 or more cells, so that even attn_split's
           blocks of 128 cells make more than the merge's first 64 splits at batch 1; 2-24
           splits: up to 3200 cells, so the one-dispatch decode's last workgroup
           (attn_onedisp.glsl) merges them in several rounds of loads */
        int32_t nkv = 2, nh = nkv * group, i, batch, bad = 0, lbad = 0, maxn = cap == 256 ? 12000 : cap == 5 ? 3200 : 1200;
        size_t nk = (size_t)nkv * hd;
        float *k, *q, *ref, lse_ref[2 * 3 * 16];
        if (!pool_case_runs(&nth, 5)) continue;
        if (cap == 5) cap = tk_int(rng, 2, 24);
        kvc_pool_config_init(&pc);
        pc.n_layers = 1; pc.n_kv_heads = nkv; pc.head_dim_k = pc.head_dim_v = hd;
        pc.type_k = pc.type_v = (kvc_type)ti;
        pc.page_cells = 16;
        pc.rotate = ti >= 3 ? (uint32_t)((run_seed + (uint64_t)ti) % 4) : 0u; /* none, K, V or both */
        TK_OK(kvc_pool_budget_for_tokens(&pc, 3 * (maxn + 16), &pc.budget_bytes));
        memset(&o, 0, sizeof(o));
        o.max_splits = cap;
        TK_OK(kvc_pool_create(&pc, &cp));
        TK_OK(kvc_vk_pool_create(ctx, &pc, &o, &vp));
        hp = kvc_vk_pool_host(vp);
        kvc_cache_config_init(&cc, KVC_KIND_FULL);
        k = (float *)malloc(sizeof(float) * (size_t)maxn * 2 * nk); /* a cache's K rows, then its V rows */
        q = (float *)malloc(sizeof(float) * 2 * 3 * (size_t)nh * hd * 3);
        ref = q + 2 * 3 * (size_t)nh * hd;
        for (i = 0; i < 3; ++i) {
            int32_t n = tk_int(rng, i == 0 && maxn > 3200 ? 9000 : 150, maxn), j;
            kvc_vk_tensor tk_, tv_;
            VkCommandBuffer cmd;
            TK_OK(kvc_cache_create(cp, &cc, &cc0[i]));
            TK_OK(kvc_cache_create(hp, &cc, &cc1[i]));
            TK_OK(kvc_begin(cc0[i], n, NULL, 0));
            TK_OK(kvc_begin(cc1[i], n, NULL, 0));
            for (j = 0; j < n * 2 * (int32_t)nk; ++j) k[j] = tk_float(rng);
            TK_OK(kvc_put(cc0[i], 0, k, k + (size_t)n * nk));
            ensure(&in_buf, sizeof(float) * (size_t)n * 2 * nk);
            memcpy(in_buf.mapped, k, sizeof(float) * (size_t)n * 2 * nk);
            memset(&tk_, 0, sizeof(tk_));
            memset(&tv_, 0, sizeof(tv_));
            tk_.buffer = tv_.buffer = in_buf.buffer;
            tv_.offset = (VkDeviceSize)n * nk * 4;
            cmd = begin_cmd();
            TK_OK(kvc_vk_cmd_append(vp, cmd, cc1[i], 0, &tk_, &tv_));
            TK_OK(kvc_vk_context_submit_wait(ctx, cmd));
        }
        { /* the CPU pool takes the device's bytes (the same page ids) */
            VkCommandBuffer cmd = begin_cmd();
            TK_OK(kvc_vk_pool_cmd_sync(vp, cmd));
            TK_OK(kvc_vk_context_submit_wait(ctx, cmd));
            TK_OK(kvc_vk_pool_download(vp, 0, 0, cp->max_pages, kvc__k_at(cp, 0, 0, 0), kvc__v_at(cp, 0, 0, 0)));
        }
        for (batch = 1; batch <= 3; batch += 2) {
            kvc_vk_attention_item items[2][3];
            size_t qn = (size_t)nh * hd, n_q = 2 * 3 * qn; /* two calls' queries; outputs as many */
            float *got = ref + n_q;
            VkCommandBuffer cmd;
            int call, use_lse = tk_int(rng, 0, 1);
            for (i = 0; i < (int32_t)n_q; ++i) q[i] = 2.0f * tk_float(rng);
            ensure(&q_buf, sizeof(float) * (n_q + 16));
            ensure(&out_buf, sizeof(float) * (n_q + 16));
            ensure(&gk_buf, sizeof(float) * 2 * 3 * 16 + 64);
            memcpy((char *)q_buf.mapped + 64, q, sizeof(float) * n_q);
            memset(out_buf.mapped, 0x7f, sizeof(float) * (n_q + 16));
            cmd = begin_cmd();
            for (call = 0; call < 2; ++call) {
                for (i = 0; i < batch; ++i) {
                    size_t at = ((size_t)call * 3 + (size_t)i) * qn;
                    kvc_attention_desc d;
                    memset(&d, 0, sizeof(d));
                    d.n_queries = 1; d.n_heads = nh; d.q = q + at; d.out = ref + at;
                    d.lse = use_lse ? lse_ref + (call * 3 + i) * nh : NULL;
                    TK_OK(kvc_attention(cc0[i], 0, &d));
                    memset(&items[call][i], 0, sizeof(items[call][i]));
                    items[call][i].cache = cc1[i];
                    items[call][i].desc.n_queries = 1;
                    items[call][i].desc.n_heads = nh;
                    items[call][i].desc.q.buffer = q_buf.buffer;
                    items[call][i].desc.q.offset = 64 + (VkDeviceSize)at * 4;
                    items[call][i].desc.out.buffer = out_buf.buffer;
                    items[call][i].desc.out.offset = 32 + (VkDeviceSize)at * 4;
                    if (use_lse) {
                        items[call][i].desc.lse.buffer = gk_buf.buffer;
                        items[call][i].desc.lse.offset = 64 + (VkDeviceSize)(call * 3 + i) * nh * 4;
                    }
                }
                TK_OK(kvc_vk_cmd_attention_batch(vp, cmd, 0, items[call], batch));
            }
            TK_OK(kvc_vk_context_submit_wait(ctx, cmd));
            memcpy(got, (const char *)out_buf.mapped + 32, sizeof(float) * n_q);
            for (call = 0; call < 2; ++call)
                for (i = 0; i < batch * (int32_t)qn; ++i) {
                    size_t at = (size_t)call * 3 * qn + (size_t)i;
                    bad += !(fabs((double)got[at] - ref[at]) <= 5e-5);
                }
            for (call = 0; use_lse && call < 2; ++call)
                for (i = 0; i < batch * nh; ++i) {
                    float g = ((const float *)((const char *)gk_buf.mapped + 64))[call * 3 * nh + i];
                    float r = lse_ref[call * 3 * nh + i];
                    lbad += !(fabs((double)g - r) <= 1e-4 * (1 + fabs(r)));
                }
        }
        if (bad || lbad)
            fprintf(stderr, "decode splits %s, rotate %u, dim %d, group %d, max splits %d: %d values, %d lse off\n",
                    kvc_type_name((kvc_type)ti), pc.rotate, hd, group, cap, bad, lbad);
        TK_EQ(bad, 0);
        TK_EQ(lbad, 0);
        for (i = 0; i < 3; ++i) { kvc_cache_destroy(cc0[i]); kvc_cache_destroy(cc1[i]); }
        free(k);
        free(q);
        TK_OK(kvc_pool_destroy(cp));
        TK_OK(kvc_vk_pool_destroy(vp));
    }
}

/* kvcache.h's non-finite rule on the device (kvc_put; test_kernels' test_nonfinite_kv on the
   CPU): kvc_vk_cmd_append stores a (cell, kv head) whose K or V holds a NaN, an infinity or
   a value its storage cannot hold finite as NaN keys and zero values, exactly as kvc_put does,
   and attention gives NaN (values and lse) to the rows that see it, equal elsewhere. Every
   type, q8_0 / q4_0 planar and in the block layout, plain and rotated storage; a prefill of
   40 queries (one split) and a decode over 300 cells in splits (the merge), soft-capped
   or not; then a RoPE shift
   (kvc_seq_remove) keeps a poisoned key poisoned. Against the CPU: the NaN rows are the
   CPU's, the other rows kvc_attention's over the device's bytes. */
#define NFV_HD 64
static int32_t nfv_row_nan(const float *x) {
    int32_t i, n = 0;
    for (i = 0; i < NFV_HD; ++i) n += x[i] != x[i];
    return n;
}
static void nfv_append(kvc_vk_pool *vp, kvc_cache *c, const float *k, const float *v, int32_t n) {
    size_t nk = (size_t)n * 2 * NFV_HD;
    kvc_vk_tensor tk_, tv_;
    VkCommandBuffer cmd;
    ensure(&in_buf, sizeof(float) * 2 * nk);
    memcpy(in_buf.mapped, k, sizeof(float) * nk);
    memcpy((float *)in_buf.mapped + nk, v, sizeof(float) * nk);
    memset(&tk_, 0, sizeof(tk_));
    memset(&tv_, 0, sizeof(tv_));
    tk_.buffer = tv_.buffer = in_buf.buffer;
    tv_.offset = (VkDeviceSize)nk * 4;
    cmd = begin_cmd();
    TK_OK(kvc_vk_cmd_append(vp, cmd, c, 0, &tk_, &tv_));
    TK_OK(kvc_vk_context_submit_wait(ctx, cmd));
}
/* the CPU pool takes the device's bytes (the same page ids) */
static void nfv_download(kvc_vk_pool *vp, kvc_pool *cp) {
    VkCommandBuffer cmd = begin_cmd();
    TK_OK(kvc_vk_pool_cmd_sync(vp, cmd));
    TK_OK(kvc_vk_context_submit_wait(ctx, cmd));
    TK_OK(kvc_vk_pool_download(vp, 0, 0, cp->max_pages, kvc__k_at(cp, 0, 0, 0), kvc__v_at(cp, 0, 0, 0)));
}
/* head 1 of gathered cell `cell` poisoned (K NaN, V zeros), head 0 finite */
static int nfv_poisoned(const float *gk, const float *gv, int32_t cell) {
    int32_t i, ok = 1;
    for (i = 0; i < NFV_HD; ++i) {
        size_t h1 = ((size_t)cell * 2 + 1) * NFV_HD + (size_t)i, h0 = (size_t)cell * 2 * NFV_HD + (size_t)i;
        ok &= gk[h1] != gk[h1] && gv[h1] == 0.0f && gk[h0] == gk[h0] && gv[h0] == gv[h0];
    }
    return ok;
}
static void test_nonfinite_kv(tk_rng *rng) {
    /* K NaN, K +inf, K -inf, V NaN, V +inf, K 1e6 (bad where the type cannot hold it) */
    static const float limits[5] = {3.4e38f, 65504.0f, 3.38e38f, 65504.0f * 127.0f, 65504.0f * 8.0f};
    static float k[300 * 2 * NFV_HD], v[300 * 2 * NFV_HD], gk[300 * 2 * NFV_HD], gv[300 * 2 * NFV_HD];
    static float q[40 * 4 * NFV_HD], ref[40 * 4 * NFV_HD], dev[40 * 4 * NFV_HD], got[40 * 4 * NFV_HD];
    float lref[160], ldev[160], lgot[160];
    int32_t pos[300];
    int ti, hl, rot, kind, shape, runs = 0, nth = 0;
    for (ti = 0; ti < types_avail; ++ti)
        for (hl = 0; hl < (ti >= 3 ? 2 : 1); ++hl)
            for (rot = 0; rot < 2; ++rot) {
                kvc_pool_config pc;
                kvc_cache_config cc;
                kvc_vk_pool_options o;
                kvc_vk_pool *vp;
                kvc_pool *cp, *hp;
                kvc_cache *c0, *c1;
                if (!pool_case_runs(&nth, 14)) continue;
                kvc_pool_config_init(&pc);
                pc.n_layers = 1; pc.n_kv_heads = 2; pc.head_dim_k = pc.head_dim_v = NFV_HD; pc.page_cells = 16;
                pc.type_k = pc.type_v = (kvc_type)ti;
                pc.rotate = rot ? KVC_ROTATE_K | KVC_ROTATE_V : 0;
                TK_OK(kvc_pool_budget_for_tokens(&pc, 400, &pc.budget_bytes));
                memset(&o, 0, sizeof(o));
                o.host_layout = hl;
                o.max_splits = 4;
                o.no_subgroup = (ti + rot) & 1; /* both builds of the split and merge passes */
                TK_OK(kvc_pool_create(&pc, &cp));
                TK_OK(kvc_vk_pool_create(ctx, &pc, &o, &vp));
                hp = kvc_vk_pool_host(vp);
                for (kind = 0; kind < 6; ++kind)
                    for (shape = 0; shape < 2; ++shape) {
                        int32_t n_tok = shape ? 300 : 40, n_q = shape ? 1 : 40, cell = shape ? 200 : 20, row, i, n = 0;
                        size_t at = ((size_t)cell * 2 + 1) * NFV_HD + 7; /* kv head 1, value 7 */
                        float bad = kind == 5 ? 1e6f : kind % 3 == 0 ? NAN : kind % 3 == 1 ? INFINITY : -INFINITY;
                        int poisoned = !(fabsf(bad) <= limits[ti] / (rot ? 8.0f : 1.0f)); /* block 64: sqrt 8 */
                        int wrong = 0;
                        kvc_attention_desc d;
                        kvc_vk_attention_desc vd;
                        VkCommandBuffer cmd;
                        runs++;
                        tk_fill(rng, k, (size_t)n_tok * 2 * NFV_HD, 1.0f);
                        tk_fill(rng, v, (size_t)n_tok * 2 * NFV_HD, 1.0f);
                        tk_fill(rng, q, (size_t)n_q * 4 * NFV_HD, 1.0f);
                        (kind >= 3 && kind < 5 ? v : k)[at] = bad;
                        kvc_cache_config_init(&cc, KVC_KIND_FULL);
                        TK_OK(kvc_cache_create(cp, &cc, &c0));
                        TK_OK(kvc_cache_create(hp, &cc, &c1));
                        TK_OK(kvc_begin(c0, n_tok, NULL, 0));
                        TK_OK(kvc_begin(c1, n_tok, NULL, 0));
                        TK_OK(kvc_put(c0, 0, k, v));
                        nfv_append(vp, c1, k, v, n_tok);
                        memset(&d, 0, sizeof(d));
                        d.n_queries = n_q; d.n_heads = 4; d.q = q; d.out = ref; d.lse = lref;
                        d.softcap = kind & 1 ? 4.0f : 0.0f; /* a soft-cap must not hide a NaN */
                        TK_OK(kvc_attention(c0, 0, &d)); /* the CPU's own bytes: its NaN rows */
                        nfv_download(vp, cp);
                        d.out = dev; d.lse = ldev;
                        TK_OK(kvc_attention(c0, 0, &d)); /* the device's bytes */
                        TK_OK(kvc_cache_gather(c0, 0, gk, gv, pos, 300, &n));
                        if (poisoned) wrong += !nfv_poisoned(gk, gv, cell);
                        ensure(&q_buf, sizeof(q));
                        ensure(&out_buf, sizeof(got) + sizeof(lgot));
                        memcpy(q_buf.mapped, q, sizeof(float) * (size_t)n_q * 4 * NFV_HD);
                        memset(&vd, 0, sizeof(vd));
                        vd.n_queries = n_q; vd.n_heads = 4; vd.softcap = d.softcap;
                        vd.q.buffer = q_buf.buffer;
                        vd.out.buffer = vd.lse.buffer = out_buf.buffer;
                        vd.lse.offset = sizeof(got);
                        cmd = begin_cmd();
                        TK_OK(kvc_vk_cmd_attention(vp, cmd, c1, 0, &vd));
                        TK_OK(kvc_vk_context_submit_wait(ctx, cmd));
                        memcpy(got, out_buf.mapped, sizeof(float) * (size_t)n_q * 4 * NFV_HD);
                        memcpy(lgot, (const char *)out_buf.mapped + sizeof(got), sizeof(float) * (size_t)n_q * 4);
                        for (row = 0; row < n_q * 4; ++row) {
                            int sees = row % 4 >= 2 && (shape == 1 || row / 4 >= cell); /* heads 2, 3: kv head 1 */
                            int cpu_nan = nfv_row_nan(ref + (size_t)row * NFV_HD) == NFV_HD;
                            wrong += cpu_nan != (poisoned && sees); /* the CPU's rule, as a sanity check */
                            if (cpu_nan) {
                                wrong += nfv_row_nan(got + (size_t)row * NFV_HD) != NFV_HD || lgot[row] == lgot[row];
                                continue;
                            }
                            for (i = 0; i < NFV_HD; ++i) {
                                size_t j = (size_t)row * NFV_HD + (size_t)i;
                                wrong += !(fabs((double)got[j] - dev[j]) <= 5e-5 * (1.0 + fabs((double)dev[j])));
                            }
                            wrong += !(fabs((double)lgot[row] - ldev[row]) <= 1e-4 * (1.0 + fabs((double)ldev[row])));
                        }
                        if (wrong)
                            fprintf(stderr, "non-finite K/V on the device, %s%s rot %d kind %d shape %d: %d wrong\n",
                                    kvc_type_name((kvc_type)ti), hl ? " host-layout" : "", rot, kind, shape, wrong);
                        TK_EQ(wrong, 0);
                        kvc_cache_destroy(c0);
                        kvc_cache_destroy(c1);
                    }
                { /* a RoPE shift keeps a poisoned key poisoned */
                    int32_t n = 0, cell = -1, i;
                    kvc_cache_config_init(&cc, KVC_KIND_CAUSAL);
                    cc.capacity = 16;
                    cc.rope.style = KVC_ROPE_NEOX;
                    cc.rope.theta = 10000.0f;
                    tk_fill(rng, k, 8 * 2 * NFV_HD, 1.0f);
                    tk_fill(rng, v, 8 * 2 * NFV_HD, 1.0f);
                    k[(5 * 2 + 1) * NFV_HD + 3] = NAN; /* token 5, kv head 1 */
                    TK_OK(kvc_cache_create(cp, &cc, &c0));
                    TK_OK(kvc_cache_create(hp, &cc, &c1));
                    TK_OK(kvc_begin(c0, 8, NULL, 0));
                    TK_OK(kvc_begin(c1, 8, NULL, 0));
                    TK_OK(kvc_put(c0, 0, k, v));
                    nfv_append(vp, c1, k, v, 8);
                    TK_OK(kvc_seq_remove(c0, 0, 1, 2)); /* positions 2.. move back by one, keys re-rotated */
                    TK_OK(kvc_seq_remove(c1, 0, 1, 2));
                    nfv_download(vp, cp);
                    TK_OK(kvc_cache_gather(c0, 0, gk, gv, pos, 16, &n));
                    for (i = 0; i < n; ++i)
                        if (pos[i] == 4) cell = i; /* token 5 */
                    TK_CHECK(cell >= 0);
                    if (cell >= 0 && !nfv_poisoned(gk, gv, cell))
                        fprintf(stderr, "non-finite K/V on the device, %s%s rot %d: the RoPE shift unpoisoned a key\n",
                                kvc_type_name((kvc_type)ti), hl ? " host-layout" : "", rot);
                    TK_CHECK(cell >= 0 && nfv_poisoned(gk, gv, cell));
                    kvc_cache_destroy(c0);
                    kvc_cache_destroy(c1);
                }
                TK_OK(kvc_pool_destroy(cp));
                TK_OK(kvc_vk_pool_destroy(vp));
            }
    TK_CHECK(runs > 0);
}

/* calls the backend must refuse, with nothing changed */
/* Pages in and out of the device in kvcache.h's layout: upload then download gives the
   bytes back, every type, planar or not; the planar layout puts codes and scales where
   kvc_vk_pool_page_buffers says; bad arguments change nothing. */
static void test_page_roundtrip(tk_rng *rng) {
    int ti, hl, hi;
    for (ti = 0; ti < types_avail; ++ti)
        for (hl = 0; hl < 2; ++hl)
            for (hi = 0; hi < 2; ++hi) {
                kvc_pool_config pc;
                kvc_vk_pool_options o;
                kvc_vk_pool *vp;
                kvc_pool *hp;
                size_t kb, vb, i;
                int32_t l, hd = hi ? 128 : 64, np;
                unsigned char *a, *b, *c;
                /* under valgrind (scale < 0.1: each pool's pipelines take LLVM 5 s there) one
                   pool a type, the layout and head dim by turns with the seed */
                if (tk_scale() < 0.1 && hl * 2 + hi != (int)((run_seed + (uint64_t)ti) % 4)) continue;
                kvc_pool_config_init(&pc);
                pc.n_layers = 2; pc.n_kv_heads = 2; pc.head_dim_k = pc.head_dim_v = hd;
                pc.type_k = pc.type_v = (kvc_type)ti;
                pc.page_cells = 8;
                pc.rotate = (uint32_t)(ti + hl) % 4; /* rotated storage: the stored bytes move as they are */
                TK_OK(kvc_pool_budget_for_tokens(&pc, 5 * 8, &pc.budget_bytes));
                memset(&o, 0, sizeof(o));
                o.host_layout = hl;
                TK_OK(kvc_vk_pool_create(ctx, &pc, &o, &vp));
                hp = kvc_vk_pool_host(vp);
                np = hp->max_pages;
                TK_EQ(kvc_vk_pool_planar(vp), !hl && ti >= 3);
                kb = hp->page_k_bytes * (size_t)np;
                vb = hp->page_v_bytes * (size_t)np;
                a = (unsigned char *)malloc(2 * (kb + vb) + kb);
                b = a + kb + vb;
                c = b + kb + vb;
                for (l = 0; l < 2; ++l) {
                    for (i = 0; i < kb + vb; ++i) a[i] = (unsigned char)tk_int(rng, 0, 255);
                    TK_OK(kvc_vk_pool_upload(vp, l, 0, np, a, a + kb));
                    memset(b, 0, kb + vb);
                    TK_OK(kvc_vk_pool_download(vp, l, 0, np, b, b + kb));
                    TK_EQ(memcmp(a, b, kb + vb), 0);
                    /* a part: pages [1, 3) of V alone */
                    memset(b, 0, kb + vb);
                    TK_OK(kvc_vk_pool_download(vp, l, 1, 2, NULL, b));
                    TK_EQ(memcmp(a + kb + hp->page_v_bytes, b, 2 * hp->page_v_bytes), 0);
                    /* the device's bytes as kvc_vk_pool_page_buffers describes them */
                    {
                        VkBuffer k = VK_NULL_HANDLE;
                        TK_OK(kvc_vk_pool_page_buffers(vp, l, &k, NULL));
                        TK_OK(kvc_vk_buffer_download(ctx, k, 0, c, kb));
                        if (kvc_vk_pool_planar(vp)) {
                            /* page 1, cell 3, kv head 1, block 1: its scale and its first code byte */
                            size_t row = hp->k_row, P = 8, cb = ti == 3 ? (size_t)hd : (size_t)hd / 2, bb = ti == 3 ? 34 : 18;
                            size_t host = P * row + 3 * row + (size_t)(hd / 32) * bb + bb;
                            size_t dev_s = P * row + P * 2 * cb + (1 * P + 3) * (size_t)(hd / 16) + 2;
                            size_t dev_c = P * row + (1 * P + 3) * cb + (bb - 2);
                            TK_EQ(memcmp(c + dev_s, a + host, 2), 0);
                            TK_EQ(c[dev_c], a[host + 2]);
                        } else {
                            TK_EQ(memcmp(c, a, kb), 0);
                        }
                        /* and the conversion on the host, both ways */
                        TK_OK(kvc_vk_pool_convert_pages(vp, 0, 0, c, b, np));
                        TK_EQ(memcmp(a, b, kb), 0);
                        TK_OK(kvc_vk_pool_convert_pages(vp, 0, 1, a, b, np));
                        TK_EQ(memcmp(c, b, kb), 0);
                    }
                }
                TK_EQ(kvc_vk_pool_download(vp, 2, 0, 1, b, NULL), KVC_ERR_RANGE);
                TK_EQ(kvc_vk_pool_download(vp, 0, np - 1, 2, b, NULL), KVC_ERR_RANGE);
                TK_EQ(kvc_vk_pool_upload(vp, 0, -1, 1, a, NULL), KVC_ERR_RANGE);
                TK_EQ(kvc_vk_pool_download(NULL, 0, 0, 1, b, NULL), KVC_ERR_NULL);
                TK_EQ(kvc_vk_pool_convert_pages(vp, 0, 0, NULL, b, 1), KVC_ERR_NULL);
                TK_EQ(kvc_vk_pool_convert_pages(vp, 0, 0, a, b, np + 1), KVC_ERR_RANGE);
                TK_EQ(kvc_vk_pool_planar(NULL), 0);
                free(a);
                TK_OK(kvc_vk_pool_destroy(vp));
            }
}

static void test_errors(void) {
    { /* rotated storage: a head dim the rule refuses (n < 16) is refused as on the CPU, nothing made */
        kvc_pool_config rc;
        kvc_vk_pool *rp = NULL;
        long allocs = live_allocs;
        kvc_pool_config_init(&rc);
        rc.n_layers = 1; rc.n_kv_heads = 1; rc.head_dim_k = 64; rc.head_dim_v = 8; rc.page_cells = 4;
        TK_OK(kvc_pool_budget_for_tokens(&rc, 16, &rc.budget_bytes));
        rc.runtime.allocator.alloc = count_alloc;
        rc.runtime.allocator.free = count_free;
        rc.rotate = KVC_ROTATE_K | KVC_ROTATE_V;
        TK_EQ(kvc_vk_pool_create(ctx, &rc, NULL, &rp), KVC_ERR_INVALID);
        TK_EQ(rp == NULL, 1);
        TK_EQ(live_allocs, allocs);
        rc.rotate = KVC_ROTATE_K; /* K alone: made */
        TK_OK(kvc_vk_pool_create(ctx, &rc, NULL, &rp));
        TK_OK(kvc_vk_pool_destroy(rp));
    }
    kvc_pool_config pc;
    kvc_vk_pool *vp;
    kvc_pool *hp;
    kvc_cache *c, *other;
    kvc_cache_config cc;
    kvc_pool *cpu;
    float x[64];
    VkCommandBuffer cmd;
    kvc_vk_tensor t;
    int32_t lo, hi;
    kvc_pool_config_init(&pc);
    pc.n_layers = 1; pc.n_kv_heads = 1; pc.head_dim_k = pc.head_dim_v = 8; pc.type_k = pc.type_v = KVC_TYPE_F16;
    pc.page_cells = 4; pc.budget_bytes = 1 << 16;
    pc.hooks.external_data = 1;
    TK_RES(kvc_vk_pool_create(ctx, &pc, NULL, &vp), KVC_ERR_INVALID); /* the backend owns the hooks */
    pc.hooks.external_data = 0;
    TK_OK(kvc_vk_pool_create(ctx, &pc, NULL, &vp));
    hp = kvc_vk_pool_host(vp);
    TK_OK(kvc_pool_create(&pc, &cpu));
    kvc_cache_config_init(&cc, KVC_KIND_CAUSAL);
    cc.capacity = 8; cc.rope.style = KVC_ROPE_NEOX; cc.rope.theta = 10000.0f;
    cc.rope.shift = NULL;
    TK_OK(kvc_cache_create(hp, &cc, &c));
    TK_OK(kvc_cache_create(cpu, &cc, &other));
    memset(x, 0, sizeof(x));
    ensure(&in_buf, 1024);
    t.buffer = in_buf.buffer; t.offset = 0; t.f16 = 0;
    cmd = begin_cmd();
    TK_RES(kvc_vk_cmd_append(vp, cmd, c, 0, &t, &t), KVC_ERR_STATE);      /* no batch open */
    TK_RES(kvc_vk_cmd_append(vp, cmd, other, 0, &t, &t), KVC_ERR_FOREIGN); /* not this pool's */
    TK_OK(kvc_begin(c, 3, NULL, 0));
    TK_RES(kvc_put(c, 0, x, x), KVC_ERR_INVALID);           /* external data: the GPU writes */
    TK_RES(kvc_vk_cmd_append(vp, cmd, c, 1, &t, &t), KVC_ERR_RANGE);
    t.offset = 2;
    TK_RES(kvc_vk_cmd_append(vp, cmd, c, 0, &t, &t), KVC_ERR_INVALID);
    t.offset = 0;
    TK_OK(kvc_vk_cmd_append(vp, cmd, c, 0, &t, &t));
    {
        kvc_attention_desc d;
        memset(&d, 0, sizeof(d));
        d.n_queries = 3; d.n_heads = 1; d.q = x; d.out = x;
        TK_RES(kvc_attention(c, 0, &d), KVC_ERR_UNSUPPORTED); /* no host data */
    }
    TK_OK(kvc_vk_context_submit_wait(ctx, cmd));
    TK_RES(kvc_vk_pool_destroy(vp), KVC_ERR_BUSY);
    kvc_cache_destroy(c);
    /* a host RoPE callback cannot reach device keys: refused before anything changes */
    cc.rope.shift = dummy_shift;
    TK_OK(kvc_cache_create(hp, &cc, &c));
    TK_OK(kvc_begin(c, 4, NULL, 0));
    cmd = begin_cmd();
    TK_OK(kvc_vk_cmd_append(vp, cmd, c, 0, &t, &t));
    TK_OK(kvc_vk_context_submit_wait(ctx, cmd));
    TK_RES(kvc_seq_remove(c, 0, 0, 1), KVC_ERR_UNSUPPORTED);
    TK_OK(kvc_seq_pos_range(c, 0, &lo, &hi));
    TK_EQ(lo, 0);
    TK_EQ(hi, 3);
    TK_OK(kvc_seq_remove(c, 0, 3, KVC_POS_END)); /* nothing moves: fine */
    kvc_cache_destroy(c);
    kvc_cache_destroy(other);
    TK_OK(kvc_pool_destroy(cpu));
    /* the device pool owns its host pool: destroying it under the device pool is refused
       (before: KVC_OK, then kvc_vk_pool_destroy a use-after-free) */
    TK_RES(kvc_pool_destroy(hp), KVC_ERR_BUSY);
    TK_OK(kvc_vk_pool_destroy(vp));
    { /* a context on the engine's own device: it uses the features it is told are enabled
         (where the device can), and refuses bits it does not know */
        kvc_vk_context_desc d;
        kvc_vk_context *borrowed;
        kvc_vk_info own, got;
        TK_OK(kvc_vk_context_info(ctx, &own));
        memset(&d, 0, sizeof(d));
        d.get_instance_proc_addr = loader.get_instance_proc_addr;
        d.instance = own.instance;
        d.physical_device = own.physical_device;
        d.device = own.device;
        d.queue = own.queue;
        d.queue_family = own.queue_family;
        d.enabled_features = 1u << 31;
        TK_RES(kvc_vk_context_create(&d, &borrowed), KVC_ERR_INVALID);
        d.enabled_features = own.active_features;
        TK_OK(kvc_vk_context_create(&d, &borrowed));
        TK_OK(kvc_vk_context_info(borrowed, &got));
        TK_EQ(got.active_features, own.active_features);
        TK_OK(kvc_vk_context_destroy(borrowed));
        d.enabled_features = 0;
        TK_OK(kvc_vk_context_create(&d, &borrowed));
        TK_OK(kvc_vk_context_info(borrowed, &got));
        TK_EQ(got.active_features, 0u);
        TK_OK(kvc_vk_context_destroy(borrowed));
        /* the typed matrices alone: accepted, not active without COOPERATIVE_MATRIX */
        d.enabled_features = KVC_VK_FEATURE_KHR_MATRIX;
        TK_OK(kvc_vk_context_create(&d, &borrowed));
        TK_OK(kvc_vk_context_info(borrowed, &got));
        TK_EQ(got.active_features, 0u);
        TK_OK(kvc_vk_context_destroy(borrowed));
    }
}

/* ---- Hybrid models: a model memory on device pools against the same memory on the CPU ---
   Layers 0 and 2 are RECURRENT (group 0, a state pool), 1 and 3 attention (group 1, FULL
   or ROTATING). A toy recurrence (state = state / 2 + x) runs on the host from the CPU
   memory's state, after the device's state has been checked equal to it; the engine's
   "shader" is a transfer of the new values into the live state kvc_vk_cmd_state gives,
   and checkpoints inside a batch hand the live state over with
   kvc_vk_cmd_state_checkpoint. Both memories take the same calls (batches with
   checkpoints, memory snapshots, restores, trims, forks, prefix reuse); after each, the
   device's states must equal the CPU's bit for bit, its K/V (f32 or f16) likewise, and
   its attention kvc_memory_attention within 5e-5. */
#define HY_NS 12 /* floats of state per layer */
#define HY_HEADS 2
#define HY_HD 16
#define HY_GROUP 2 /* query heads per kv head */

typedef struct hybrid {
    kvc_memory *cpu;
    kvc_vk_memory *vm;
    kvc_memory *gpu; /* the device memory's own host memory, or a fork of it */
    kvc_memory *cpu_own; /* the CPU twin of the device memory's own, while gpu is a fork */
    kvc_memory_snapshot *snap[2][2]; /* [CPU, device][slot] */
} hybrid;

static void cmd_barrier(VkCommandBuffer cmd) {
    const kvc_vk_functions *fn = kvc_vk_context_functions(ctx);
    VkMemoryBarrier mb;
    memset(&mb, 0, sizeof(mb));
    mb.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER;
    mb.srcAccessMask = VK_ACCESS_MEMORY_WRITE_BIT;
    mb.dstAccessMask = VK_ACCESS_MEMORY_READ_BIT | VK_ACCESS_MEMORY_WRITE_BIT;
    fn->vkCmdPipelineBarrier(cmd, VK_PIPELINE_STAGE_ALL_COMMANDS_BIT, VK_PIPELINE_STAGE_ALL_COMMANDS_BIT, 0, 1, &mb, 0,
                             NULL, 0, NULL);
}

/* the engine's write of a state: in_buf's slot-th state into dst */
static void cmd_put_state(VkCommandBuffer cmd, int32_t slot, const kvc_vk_tensor *dst) {
    const kvc_vk_functions *fn = kvc_vk_context_functions(ctx);
    VkBufferCopy rg;
    rg.srcOffset = (VkDeviceSize)slot * HY_NS * 4;
    rg.dstOffset = dst->offset;
    rg.size = HY_NS * 4;
    cmd_barrier(cmd); /* after what wrote or read dst before */
    fn->vkCmdCopyBuffer(cmd, in_buf.buffer, dst->buffer, 1, &rg);
}

static void hy_config(kvc_memory_config *mc, kvc_group_config g[2], int32_t map[4], kvc_kind kind, kvc_type t) {
    int32_t l;
    size_t state_page, kv_page = 0;
    kvc_memory_config_init(mc);
    for (l = 0; l < 4; ++l) map[l] = l % 2;
    memset(g, 0, sizeof(kvc_group_config) * 2);
    g[0].pool.n_layers = 2;
    g[0].pool.state_floats = HY_NS;
    kvc_cache_config_init(&g[0].cache, KVC_KIND_RECURRENT);
    g[0].cache.checkpoints = 3;
    g[1].pool.n_layers = 2;
    g[1].pool.n_kv_heads = HY_HEADS;
    g[1].pool.head_dim_k = g[1].pool.head_dim_v = HY_HD;
    g[1].pool.type_k = g[1].pool.type_v = t;
    g[1].pool.page_cells = 4;
    kvc_cache_config_init(&g[1].cache, kind);
    if (kind == KVC_KIND_ROTATING) {
        g[1].cache.window = 7;
        g[1].cache.sinks = 1;
        g[1].cache.checkpoints = 3;
    }
    state_page = 2 * (HY_NS + 1) * 4;
    TK_OK(kvc_pool_page_bytes(&g[1].pool, &kv_page));
    mc->n_layers = 4;
    mc->layer_group = map;
    mc->n_groups = 2;
    mc->groups = g;
    mc->budget_bytes = 24 * kv_page + 16 * state_page;
}

/* the same batch through both memories; at[] inside it */
static void hy_feed(hybrid *h, kvc_memory *cpu, kvc_memory *gpu, int32_t n, const int32_t *at, int32_t n_at,
                    kvc_type t, tk_rng *rng) {
    int32_t l, i, k, off = 0, nk = HY_HEADS * HY_HD;
    kvc_result r0, r1;
    kvc_memory_offset(cpu, &off);
    r0 = kvc_memory_begin(cpu, n, at, n_at);
    r1 = kvc_memory_begin(gpu, n, at, n_at);
    if (r0 != r1) fprintf(stderr, "kvc_memory_begin(%d, %d checkpoints): cpu %d gpu %d\n", n, n_at, r0, r1);
    TK_EQ(r0, r1);
    if (r0 != KVC_OK) return;
    for (l = 0; l < 4; ++l) {
        kvc_vk_pool *vp;
        kvc_cache *gc;
        int32_t gl;
        VkCommandBuffer cmd;
        TK_OK(kvc_vk_memory_layer(h->vm, gpu, l, &vp, &gc, &gl));
        if (l % 2 == 0) {
            float *st = NULL, dev[HY_NS];
            kvc_vk_tensor live;
            TK_OK(kvc_memory_state(cpu, l, 0, &st));
            cmd = begin_cmd();
            TK_OK(kvc_vk_cmd_state(vp, cmd, gc, 0, gl, &live));
            TK_OK(kvc_vk_context_submit_wait(ctx, cmd));
            /* the state the batch starts from: zeroed or copied on the device by page events */
            TK_OK(kvc_vk_buffer_download(ctx, live.buffer, live.offset, dev, sizeof(dev)));
            TK_CHECK(st != NULL && memcmp(st, dev, sizeof(dev)) == 0);
            if (st == NULL) return;
            ensure(&in_buf, sizeof(float) * HY_NS * (size_t)(n_at + 1));
            cmd = begin_cmd();
            for (i = 0, k = 0; i < n; ++i) {
                int32_t j;
                for (j = 0; j < HY_NS; ++j) st[j] = st[j] * 0.5f + tk_float(rng);
                if (k < n_at && at[k] == off + i + 1) { /* the scan reached a checkpoint */
                    memcpy((float *)in_buf.mapped + (size_t)k * HY_NS, st, sizeof(float) * HY_NS);
                    cmd_put_state(cmd, k, &live);
                    TK_OK(kvc_memory_state_checkpoint(cpu, l, at[k], st));
                    TK_OK(kvc_vk_cmd_state_checkpoint(vp, cmd, gc, gl, at[k], &live));
                    k++;
                }
            }
            memcpy((float *)in_buf.mapped + (size_t)n_at * HY_NS, st, sizeof(float) * HY_NS);
            cmd_put_state(cmd, n_at, &live);
            TK_OK(kvc_vk_context_submit_wait(ctx, cmd));
        } else {
            float *kv = (float *)malloc(sizeof(float) * 2 * (size_t)n * (size_t)nk);
            kvc_vk_tensor tk_, tv_;
            for (i = 0; i < 2 * n * nk; ++i) kv[i] = tk_float(rng);
            if (t == KVC_TYPE_F16) /* the CPU gets the values the f16 input holds */
                for (i = 0; i < 2 * n * nk; ++i) kv[i] = kvc__f16_to_f32(kvc__f32_to_f16(kv[i]));
            TK_OK(kvc_memory_put(cpu, l, kv, kv + (size_t)n * nk));
            ensure(&in_buf, sizeof(float) * 2 * (size_t)n * (size_t)nk);
            memcpy(in_buf.mapped, kv, sizeof(float) * 2 * (size_t)n * (size_t)nk);
            memset(&tk_, 0, sizeof(tk_));
            tk_.buffer = tv_.buffer = in_buf.buffer;
            tv_.offset = sizeof(float) * (size_t)n * (size_t)nk;
            tv_.f16 = 0;
            cmd = begin_cmd();
            TK_OK(kvc_vk_cmd_append(vp, cmd, gc, gl, &tk_, &tv_));
            TK_OK(kvc_vk_context_submit_wait(ctx, cmd));
            free(kv);
        }
    }
}

/* every state and K/V of the device memory against the CPU's, and attention */
static void hy_compare(hybrid *h, kvc_memory *cpu, kvc_memory *gpu, tk_rng *rng) {
    int32_t l, off0 = -1, off1 = -2, nk = HY_HEADS * HY_HD;
    kvc_memory_stats s0, s1;
    VkCommandBuffer cmd = begin_cmd();
    TK_OK(kvc_vk_memory_cmd_sync(h->vm, cmd)); /* queued page events are part of the state */
    TK_OK(kvc_vk_context_submit_wait(ctx, cmd));
    TK_OK(kvc_memory_offset(cpu, &off0));
    TK_OK(kvc_memory_offset(gpu, &off1));
    TK_EQ(off0, off1);
    TK_OK(kvc_memory_stats_get(cpu, &s0));
    TK_OK(kvc_memory_stats_get(gpu, &s1));
    TK_EQ(s0.n_checkpoints, s1.n_checkpoints);
    TK_EQ(s0.bytes_used, s1.bytes_used);
    for (l = 0; l < 4; ++l) {
        kvc_vk_pool *vp;
        kvc_cache *cc = NULL, *gc = NULL;
        int32_t gl = 0, cgl = 0;
        TK_OK(kvc_vk_memory_layer(h->vm, gpu, l, &vp, &gc, &gl));
        TK_OK(kvc_memory_layer(cpu, l, &cc, &cgl));
        if (l % 2 == 0) {
            const float *st = NULL;
            float dev[HY_NS];
            kvc_vk_tensor where;
            TK_OK(kvc_state_read(cc, 0, cgl, &st));
            TK_OK(kvc_vk_state_read(vp, gc, 0, gl, &where));
            TK_EQ(st == NULL, where.buffer == VK_NULL_HANDLE);
            if (st == NULL || where.buffer == VK_NULL_HANDLE) continue;
            TK_OK(kvc_vk_buffer_download(ctx, where.buffer, where.offset, dev, sizeof(dev)));
            TK_CHECK(memcmp(st, dev, sizeof(dev)) == 0);
        } else {
            int32_t n0 = 0, n1 = -1, i, bad = 0, qn = 3, nh = HY_HEADS * HY_GROUP, pos[3];
            float *k0, *q, *ref;
            int32_t *p0, *p1;
            kvc_vk_tensor gk, gv;
            kvc_attention_desc d;
            kvc_vk_attention_desc vd;
            kvc_result r0, r1;
            TK_OK(kvc_cache_gather(cc, cgl, NULL, NULL, NULL, 0, &n0));
            TK_OK(kvc_vk_cmd_gather(vp, VK_NULL_HANDLE, gc, gl, NULL, NULL, NULL, 0, &n1));
            TK_EQ(n0, n1);
            if (n0 != n1 || n0 == 0) continue;
            k0 = (float *)malloc(sizeof(float) * 2 * (size_t)n0 * (size_t)nk);
            p0 = (int32_t *)malloc(sizeof(int32_t) * 2 * (size_t)n0);
            p1 = p0 + n0;
            TK_OK(kvc_cache_gather(cc, cgl, k0, k0 + (size_t)n0 * nk, p0, n0, &n0));
            ensure(&gk_buf, sizeof(float) * (size_t)n0 * nk);
            ensure(&gv_buf, sizeof(float) * (size_t)n0 * nk);
            memset(&gk, 0, sizeof(gk));
            memset(&gv, 0, sizeof(gv));
            gk.buffer = gk_buf.buffer;
            gv.buffer = gv_buf.buffer;
            cmd = begin_cmd();
            TK_OK(kvc_vk_cmd_gather(vp, cmd, gc, gl, &gk, &gv, p1, n0, &n1));
            TK_OK(kvc_vk_context_submit_wait(ctx, cmd));
            bad += memcmp(p0, p1, sizeof(int32_t) * (size_t)n0) != 0;
            bad += memcmp(k0, gk_buf.mapped, sizeof(float) * (size_t)n0 * nk) != 0;
            bad += memcmp(k0 + (size_t)n0 * nk, gv_buf.mapped, sizeof(float) * (size_t)n0 * nk) != 0;
            TK_EQ(bad, 0);
            free(k0);
            free(p0);
            /* queries at the offset and before it */
            q = (float *)malloc(sizeof(float) * (size_t)qn * nh * HY_HD * 2);
            ref = q + (size_t)qn * nh * HY_HD;
            for (i = 0; i < qn * nh * HY_HD; ++i) q[i] = tk_float(rng) * 2.0f;
            for (i = 0; i < qn; ++i) pos[i] = i == 0 ? off0 : tk_int(rng, off0 > 8 ? off0 - 8 : 0, off0);
            memset(&d, 0, sizeof(d));
            d.n_queries = qn; d.n_heads = nh; d.q = q; d.out = ref; d.pos = pos;
            ensure(&q_buf, sizeof(float) * (size_t)qn * nh * HY_HD);
            ensure(&out_buf, sizeof(float) * (size_t)qn * nh * HY_HD);
            memcpy(q_buf.mapped, q, sizeof(float) * (size_t)qn * nh * HY_HD);
            memset(out_buf.mapped, 0x7f, sizeof(float) * (size_t)qn * nh * HY_HD);
            memset(&vd, 0, sizeof(vd));
            vd.n_queries = qn; vd.n_heads = nh; vd.q.buffer = q_buf.buffer; vd.out.buffer = out_buf.buffer; vd.pos = pos;
            r0 = kvc_memory_attention(cpu, l, &d);
            cmd = begin_cmd();
            r1 = kvc_vk_cmd_attention(vp, cmd, gc, gl, &vd);
            TK_OK(kvc_vk_context_submit_wait(ctx, cmd));
            TK_EQ(r0, r1);
            if (r0 == KVC_OK && r1 == KVC_OK) {
                const float *got = (const float *)out_buf.mapped;
                double worst = 0;
                for (i = 0, bad = 0; i < qn * nh * HY_HD; ++i) {
                    double e = fabs((double)got[i] - ref[i]);
                    bad += !(e <= 5e-5);
                    if (e > worst || e != e) worst = e;
                }
                if (bad) fprintf(stderr, "hybrid attention layer %d: %d values off, worst %g\n", l, bad, worst);
                TK_EQ(bad, 0);
            }
            free(q);
        }
    }
}

/* n_at checkpoints inside a batch of n at offset off, increasing */
static int32_t hy_checkpoints(int32_t off, int32_t n, int32_t *at, tk_rng *rng) {
    int32_t n_at = tk_int(rng, 0, 2), i, k = 0;
    for (i = 1; i <= n && k < n_at; ++i)
        if (tk_int(rng, 0, n - 1) < n_at || i == n) at[k++] = off + i;
    return k;
}

static void episode_hybrid(kvc_kind kind, kvc_type t, tk_rng *rng, int steps) {
    kvc_memory_config mc;
    kvc_group_config g[2];
    int32_t map[4], step, i;
    hybrid h;
    kvc_vk_pool_options o;
    memset(&h, 0, sizeof(h));
    hy_config(&mc, g, map, kind, t);
    memset(&o, 0, sizeof(o));
    o.max_splits = 4;
    TK_OK(kvc_memory_create(&mc, &h.cpu));
    TK_OK(kvc_vk_memory_create(ctx, &mc, &o, &h.vm));
    if (h.cpu == NULL || h.vm == NULL) return;
    h.gpu = kvc_vk_memory_host(h.vm);
    for (step = 0; step < steps; ++step) {
        int op = tk_int(rng, 0, 11);
        int32_t off = 0, at[2];
        kvc_memory_offset(h.cpu, &off);
        if (op <= 4) {
            int32_t n = tk_int(rng, 1, 6), n_at = hy_checkpoints(off, n, at, rng);
            if (off + n > 80) { /* room again */
                BOTH(kvc_memory_clear(h.cpu), kvc_memory_clear(h.gpu));
                off = 0;
                n_at = hy_checkpoints(0, n, at, rng);
            }
            hy_feed(&h, h.cpu, h.gpu, n, at, n_at, t, rng);
        } else if (op == 5) {
            int k = tk_int(rng, 0, 1);
            int32_t a = tk_int(rng, 0, off), from = tk_int(rng, -1, 3);
            for (i = 0; i < 2; ++i) kvc_memory_snapshot_free(h.snap[i][k]), h.snap[i][k] = NULL;
            BOTH(kvc_memory_snapshot_take(h.cpu, from, a, &h.snap[0][k]),
                 kvc_memory_snapshot_take(h.gpu, from, a, &h.snap[1][k]));
            TK_EQ(h.snap[0][k] == NULL, h.snap[1][k] == NULL);
        } else if (op == 6) {
            int k = tk_int(rng, 0, 2);
            int32_t target = tk_int(rng, 0, off + 1);
            BOTH(kvc_memory_restore(h.cpu, k < 2 ? h.snap[0][k] : NULL, target),
                 kvc_memory_restore(h.gpu, k < 2 ? h.snap[1][k] : NULL, target));
        } else if (op == 7) {
            int32_t n = tk_int(rng, 0, 6);
            BOTH(kvc_memory_trim(h.cpu, n), kvc_memory_trim(h.gpu, n));
            if (tk_int(rng, 0, 1)) { /* the device memory gives back the pages it no longer uses */
                VkCommandBuffer cmd = begin_cmd();
                int32_t g;
                TK_OK(kvc_vk_memory_cmd_trim(h.vm, cmd));
                TK_OK(kvc_vk_context_submit_wait(ctx, cmd));
                for (g = 0; g < h.cpu->mp->n_groups; ++g) sort_free_pages(h.cpu->mp->pool[g]);
            }
        } else if (op == 8) { /* a snapshot, a detour, then back to it */
            kvc_memory_snapshot *s0 = NULL, *s1 = NULL;
            int32_t a = tk_int(rng, 0, off), n = tk_int(rng, 1, 5), n_at;
            BOTH(kvc_memory_snapshot_take(h.cpu, 0, a, &s0), kvc_memory_snapshot_take(h.gpu, 0, a, &s1));
            kvc_memory_offset(h.cpu, &off);
            n_at = hy_checkpoints(off, n, at, rng);
            if (off + n <= 80) hy_feed(&h, h.cpu, h.gpu, n, at, n_at, t, rng);
            hy_compare(&h, h.cpu, h.gpu, rng);
            BOTH(kvc_memory_restore(h.cpu, s0, a), kvc_memory_restore(h.gpu, s1, a));
            TK_OK(kvc_memory_snapshot_free(s0));
            TK_OK(kvc_memory_snapshot_free(s1));
        } else if (op == 9 || op == 10) { /* a fork goes on; sometimes it becomes the memory */
            kvc_memory *f0 = NULL, *f1 = NULL;
            int32_t n = tk_int(rng, 1, 4), n_at = hy_checkpoints(off, n, at, rng);
            BOTH(kvc_memory_fork(h.cpu, &f0), kvc_memory_fork(h.gpu, &f1));
            if (f0 == NULL || f1 == NULL) continue;
            if (off + n <= 80) hy_feed(&h, f0, f1, n, at, n_at, t, rng);
            hy_compare(&h, f0, f1, rng);
            hy_compare(&h, h.cpu, h.gpu, rng); /* the original kept its pages */
            if (op == 10) {
                kvc_memory *t0 = h.cpu, *t1 = h.gpu;
                h.cpu = f0; h.gpu = f1; f0 = t0; f1 = t1;
            }
            if (f1 == kvc_vk_memory_host(h.vm)) { /* the device memory's own: kept, emptied */
                BOTH(kvc_memory_clear(f0), kvc_memory_clear(f1));
                h.cpu_own = f0;
            } else {
                if (f0 != h.cpu_own) TK_OK(kvc_memory_destroy(f0));
                TK_OK(kvc_memory_destroy(f1));
            }
        } else { /* prefix reuse: a prompt, then one sharing part of it */
            kvc_prefix *x0 = NULL, *x1 = NULL;
            int32_t toks[24], n = tk_int(rng, 4, 12), r0 = -1, r1 = -2, cut, k;
            for (i = 0; i < 24; ++i) toks[i] = tk_int(rng, 0, 50);
            TK_OK(kvc_prefix_create_memory(h.cpu, 64, &x0));
            TK_OK(kvc_prefix_create_memory(h.gpu, 64, &x1));
            for (k = 0; k < 2 && x0 && x1; ++k) {
                BOTH(kvc_prefix_begin(x0, toks, n, &r0), kvc_prefix_begin(x1, toks, n, &r1));
                TK_EQ(r0, r1);
                if (r0 < n) {
                    int32_t n_at = hy_checkpoints(r0, n - r0, at, rng);
                    hy_feed(&h, h.cpu, h.gpu, n - r0, at, n_at, t, rng);
                }
                hy_compare(&h, h.cpu, h.gpu, rng);
                BOTH(kvc_prefix_close(x0, NULL, 0), kvc_prefix_close(x1, NULL, 0));
                cut = tk_int(rng, 1, n); /* the next request shares toks[0, cut) */
                for (i = cut; i < 24; ++i) toks[i] = 60 + tk_int(rng, 0, 50);
                n = tk_int(rng, cut, 16);
            }
            TK_OK(kvc_prefix_destroy(x0));
            TK_OK(kvc_prefix_destroy(x1));
        }
        hy_compare(&h, h.cpu, h.gpu, rng);
    }
    { /* saves and loads (issue 36): the device memory's file is the CPU memory's; each
         loads the other's, checkpoints included (the RECURRENT group's oldest: both go back) */
        blob m0 = save_blob(save_memory_fn, h.cpu), m1 = save_blob(save_memory_fn, h.gpu), m2;
        kvc_mem a, b;
        kvc_io ia = blob_reader(&a, &m1, m1.size), ib = blob_reader(&b, &m0, m0.size);
        kvc_cache *rc = NULL;
        int32_t at0[8], n0 = 0, gl = 0;
        TK_CHECK(same_blob(&m0, &m1));
        BOTH(kvc_memory_load(h.cpu, SL_NS, &ia, NULL, 0, NULL), kvc_memory_load(h.gpu, SL_NS, &ib, NULL, 0, NULL));
        hy_compare(&h, h.cpu, h.gpu, rng);
        m2 = save_blob(save_memory_fn, h.gpu);
        TK_CHECK(same_blob(&m0, &m2));
        TK_OK(kvc_memory_layer(h.cpu, 0, &rc, &gl));
        TK_OK(kvc_cache_checkpoints(rc, at0, 8, &n0));
        if (n0 > 0) {
            BOTH(kvc_memory_restore(h.cpu, NULL, at0[0]), kvc_memory_restore(h.gpu, NULL, at0[0]));
            hy_compare(&h, h.cpu, h.gpu, rng);
        }
        free(m0.data);
        free(m1.data);
        free(m2.data);
    }
    { /* a memory tree's entry: the device tree saves the CPU tree's file; it loads into a
         device tree and saves the same bytes again */
        kvc_radix_config rc;
        kvc_radix *t0 = NULL, *t1 = NULL, *t2 = NULL;
        int32_t toks[96], n = 0, got = 0;
        blob e0, e1, e2;
        kvc_memory_offset(h.cpu, &n);
        for (i = 0; i < 96; ++i) toks[i] = 7 * i % 50;
        kvc_radix_config_init(&rc, KVC_KIND_FULL);
        TK_OK(kvc_radix_create_memory(h.cpu, &rc, &t0));
        TK_OK(kvc_radix_create_memory(h.gpu, &rc, &t1));
        TK_OK(kvc_radix_create_memory(h.gpu, &rc, &t2));
        BOTH(kvc_radix_commit_memory(t0, SL_NS, h.cpu, toks, n, 0), kvc_radix_commit_memory(t1, SL_NS, h.gpu, toks, n, 0));
        g_tree_n = n;
        if (n > 0 && save_blob_ok(save_tree_fn, t0)) { /* (a state at exactly n: in most runs) */
            kvc_mem m;
            kvc_io io;
            kvc_result lr;
            e0 = save_blob(save_tree_fn, t0);
            e1 = save_blob(save_tree_fn, t1);
            TK_CHECK(same_blob(&e0, &e1));
            io = blob_reader(&m, &e0, e0.size);
            lr = kvc_radix_load(t2, SL_NS, &io, 0, &got);
            if (lr == KVC_ERR_FULL) { /* a copy beside the memory's own pages did not fit the
                                         budget, and loads never evict: t2 stays empty */
                kvc_radix_stats st;
                TK_OK(kvc_radix_stats_get(t2, &st));
                TK_EQ(st.n_entries, 0);
                TK_EQ(st.n_pages, 0);
            } else {
                TK_OK(lr);
                TK_EQ(got, n);
                e2 = save_blob(save_tree_fn, t2);
                TK_CHECK(same_blob(&e0, &e2));
                free(e2.data);
                g_tree_saved++;
            }
            free(e0.data);
            free(e1.data);
        }
        BOTH(kvc_radix_release_memory(h.cpu), kvc_radix_release_memory(h.gpu)); /* the commit's lease */
        TK_OK(kvc_radix_destroy(t0));
        TK_OK(kvc_radix_destroy(t1));
        TK_OK(kvc_radix_destroy(t2));
    }
    /* the device memory outlives what shares its pools */
    {
        kvc_memory_snapshot *s = NULL;
        TK_OK(kvc_memory_snapshot_take(h.gpu, 0, 0, &s)); /* nothing to hold: NULL */
        kvc_memory_offset(h.gpu, &i);
        if (i > 0) {
            TK_OK(kvc_memory_snapshot_take(h.gpu, 0, i, &s));
            TK_RES(kvc_vk_memory_destroy(h.vm), KVC_ERR_BUSY);
            TK_OK(kvc_memory_snapshot_free(s));
        }
    }
    for (i = 0; i < 4; ++i) kvc_memory_snapshot_free(h.snap[i / 2][i % 2]);
    if (h.gpu != kvc_vk_memory_host(h.vm)) {
        TK_RES(kvc_vk_memory_destroy(h.vm), KVC_ERR_BUSY); /* a fork is alive */
        TK_OK(kvc_memory_destroy(h.gpu));
        TK_OK(kvc_memory_destroy(h.cpu_own));
    }
    TK_OK(kvc_memory_destroy(h.cpu));
    TK_OK(kvc_vk_memory_destroy(h.vm));
}

/* A ROTATING cache with checkpoints made on the CPU: its file loads into a device pool,
   which saves the same bytes back; at every checkpoint the device cache restores to the
   bytes of a CPU cache that never saved; a prefix tree's entry moves from a CPU tree to
   a device one; every truncation and every damaged byte of the file is refused by a
   device target, which keeps its contents, checkpoints and pages (issue 36). */
#define SL_HD 8
static void sl_build(kvc_cache *c, int salt) {
    static const int32_t n[5] = {5, 4, 3, 6, 2}, n_at[5] = {1, 2, 1, 2, 0};
    static const int32_t at[5][2] = {{3, 0}, {7, 9}, {11, 0}, {15, 17}, {0, 0}};
    float k[6 * 2 * SL_HD], v[6 * 2 * SL_HD];
    int32_t b, i;
    for (b = 0; b < 5; ++b) {
        for (i = 0; i < n[b] * 2 * SL_HD; ++i) {
            k[i] = (float)((i * 7 + salt * 13 + b * 5) % 17) - 8.0f;
            v[i] = (float)((i * 5 + salt * 11 + b * 3) % 19) * 0.25f;
        }
        TK_OK(kvc_begin(c, n[b], at[b], n_at[b]));
        TK_OK(kvc_put(c, 0, k, v));
    }
}
static int32_t sl_pages(const kvc_pool *p) {
    kvc_pool_stats st;
    memset(&st, 0, sizeof(st));
    TK_OK(kvc_pool_stats_get(p, &st));
    return st.pages_used;
}
static uint64_t sl_host_state(const kvc_cache *c) { /* bookkeeping and checkpoints */
    int32_t at[8], n = 0, off = 0, np = 0, i;
    uint64_t h = 1469598103934665603ull;
    kvc_cache_offset(c, &off);
    kvc_cache_pages(c, &np);
    kvc_cache_checkpoints(c, at, 8, &n);
    h = (h ^ (uint64_t)off) * 1099511628211ull;
    h = (h ^ (uint64_t)np) * 1099511628211ull;
    for (i = 0; i < n && i < 8; ++i) h = (h ^ (uint64_t)at[i]) * 1099511628211ull;
    return (h ^ (uint64_t)n) * 1099511628211ull;
}
static void test_saveload(void) {
    kvc_pool_config pc;
    kvc_cache_config cc;
    kvc_vk_pool *vp = NULL;
    kvc_pool *cp = NULL, *hp;
    kvc_cache *a = NULL, *g = NULL, *t = NULL, *x = NULL;
    blob bc, bg, bt, bx;
    int32_t at[8], n_at = 0, j, pages, bad = 0, changed = 0, trunc = 0, tries = 0;
    uint64_t host;
    size_t i;
    kvc_pool_config_init(&pc);
    pc.n_layers = 1;
    pc.n_kv_heads = 2;
    pc.head_dim_k = pc.head_dim_v = SL_HD;
    pc.type_k = KVC_TYPE_F16;
    pc.type_v = KVC_TYPE_F32;
    pc.page_cells = 4;
    TK_OK(kvc_pool_budget_for_tokens(&pc, 48 * 4, &pc.budget_bytes));
    TK_OK(kvc_pool_create(&pc, &cp));
    pc.runtime.allocator.alloc = count_alloc;
    pc.runtime.allocator.free = count_free;
    TK_OK(kvc_vk_pool_create(ctx, &pc, NULL, &vp));
    if (cp == NULL || vp == NULL) return;
    hp = kvc_vk_pool_host(vp);
    kvc_cache_config_init(&cc, KVC_KIND_ROTATING);
    cc.window = 5;
    cc.sinks = 1;
    cc.checkpoints = 3;
    TK_OK(kvc_cache_create(cp, &cc, &a));
    sl_build(a, 1);
    bc = save_blob(save_cache_fn, a);
    TK_OK(kvc_cache_checkpoints(a, at, 8, &n_at));
    TK_EQ(n_at, 3);
    TK_OK(kvc_cache_create(hp, &cc, &g)); /* the CPU's file on the device, and back */
    TK_OK(load_cache(g, &bc));
    bg = save_blob(save_cache_fn, g);
    TK_CHECK(same_blob(&bc, &bg));
    free(bg.data);
    TK_OK(kvc_cache_create(cp, &cc, &x));
    TK_OK(load_cache(x, &bc));
    TK_OK(kvc_cache_destroy(g));
    for (j = 0; j < n_at; ++j) { /* each checkpoint: the device's bytes are the CPU's */
        kvc_cache *ref = NULL, *dev = NULL;
        blob br, bd;
        TK_OK(kvc_cache_create(cp, &cc, &ref));
        TK_OK(kvc_cache_create(hp, &cc, &dev));
        sl_build(ref, 1);
        TK_OK(load_cache(dev, &bc));
        TK_OK(kvc_cache_restore(ref, NULL, at[j]));
        TK_OK(kvc_cache_restore(dev, NULL, at[j]));
        br = save_blob(save_cache_fn, ref);
        bd = save_blob(save_cache_fn, dev);
        TK_CHECK(same_blob(&br, &bd));
        free(br.data);
        free(bd.data);
        TK_OK(kvc_cache_destroy(ref));
        TK_OK(kvc_cache_destroy(dev));
    }
    { /* a prefix tree's entry: CPU tree -> file -> device tree -> the same file */
        kvc_radix_config rc;
        kvc_radix *tc = NULL, *tg = NULL;
        kvc_cache *tmp = NULL;
        int32_t toks[9], reused = 0, got = 0;
        float k[9 * 2 * SL_HD], v[9 * 2 * SL_HD];
        kvc_mem m;
        kvc_io io;
        blob be, be2;
        for (j = 0; j < 9; ++j) toks[j] = 100 + j;
        for (j = 0; j < 9 * 2 * SL_HD; ++j) { k[j] = (float)(j % 13) - 6.0f; v[j] = (float)(j % 7); }
        kvc_radix_config_init(&rc, KVC_KIND_FULL);
        TK_OK(kvc_radix_create(cp, &rc, &tc));
        TK_OK(kvc_radix_create(hp, &rc, &tg));
        TK_OK(kvc_radix_lookup(tc, SL_NS, toks, 9, &tmp, &reused));
        TK_OK(kvc_begin(tmp, 9, NULL, 0));
        TK_OK(kvc_put(tmp, 0, k, v));
        TK_OK(kvc_radix_commit(tc, SL_NS, tmp, toks, 9, 0));
        TK_OK(kvc_cache_destroy(tmp));
        memset(&m, 0, sizeof(m));
        TK_OK(kvc_io_memory(&m, &io));
        TK_OK(kvc_radix_save(tc, SL_NS, toks, 9, &io));
        be.data = (unsigned char *)malloc(m.size);
        m.data = be.data;
        m.capacity = m.size;
        m.size = 0;
        TK_OK(kvc_radix_save(tc, SL_NS, toks, 9, &io));
        be.size = m.size;
        io = blob_reader(&m, &be, be.size);
        TK_OK(kvc_radix_load(tg, SL_NS, &io, 0, &got));
        TK_EQ(got, 9);
        be2.size = be.size;
        be2.data = (unsigned char *)malloc(be.size);
        memset(&m, 0, sizeof(m));
        m.data = be2.data;
        m.capacity = be2.size;
        TK_OK(kvc_io_memory(&m, &io));
        TK_OK(kvc_radix_save(tg, SL_NS, toks, 9, &io));
        TK_CHECK(same_blob(&be, &be2));
        free(be.data);
        free(be2.data);
        TK_OK(kvc_radix_destroy(tc));
        TK_OK(kvc_radix_destroy(tg));
    }
    /* a device target with a history of its own; damaged and truncated files change nothing */
    TK_OK(kvc_cache_create(hp, &cc, &t));
    {
        kvc_cache *other = NULL;
        TK_OK(kvc_cache_create(cp, &cc, &other));
        sl_build(other, 2);
        bx = save_blob(save_cache_fn, other);
        TK_OK(kvc_cache_destroy(other));
    }
    TK_OK(load_cache(t, &bx));
    bt = save_blob(save_cache_fn, t);
    TK_CHECK(same_blob(&bt, &bx));
    host = sl_host_state(t);
    pages = sl_pages(hp);
    for (i = 0; i <= 2 * bc.size; ++i) { /* every truncation, then every byte damaged */
        kvc_mem m;
        kvc_io io;
        kvc_result r;
        if (i < bc.size) {
            io = blob_reader(&m, &bc, i);
            r = kvc_cache_load(t, SL_NS, &io, NULL, 0, NULL);
            trunc += r == KVC_ERR_TRUNCATED;
        } else if (i < 2 * bc.size) {
            blob d;
            d.size = bc.size;
            d.data = (unsigned char *)malloc(bc.size);
            memcpy(d.data, bc.data, bc.size);
            d.data[i - bc.size] ^= (unsigned char)(i % 2 ? 0x80 : 0x01);
            io = blob_reader(&m, &d, d.size);
            r = kvc_cache_load(t, SL_NS, &io, NULL, 0, NULL);
            bad += r != KVC_ERR_CORRUPT && r != KVC_ERR_FORMAT && r != KVC_ERR_TRUNCATED && r != KVC_ERR_MISMATCH;
            free(d.data);
        }
        changed += sl_host_state(t) != host || sl_pages(hp) != pages;
        if (++tries % 97 == 0 || i == 2 * bc.size) { /* and the device's bytes, now and then */
            blob now = save_blob(save_cache_fn, t);
            changed += !same_blob(&now, &bt);
            free(now.data);
        }
    }
    TK_EQ(trunc, (int32_t)bc.size);
    TK_EQ(bad, 0);
    TK_EQ(changed, 0);
    TK_OK(load_cache(t, &bc)); /* the intact file loads */
    free(bc.data);
    free(bt.data);
    free(bx.data);
    TK_OK(kvc_cache_destroy(a));
    TK_OK(kvc_cache_destroy(x));
    TK_OK(kvc_cache_destroy(t));
    TK_EQ(sl_pages(hp), 0);
    TK_OK(kvc_pool_destroy(cp));
    TK_OK(kvc_vk_pool_destroy(vp));
}

/* a state pool on its own (two sequences in a batch) and what the state calls refuse */
static void test_state_errors(void) {
    kvc_pool_config pc;
    kvc_vk_pool *vp = NULL, *kvp = NULL;
    kvc_cache_config cc;
    kvc_cache *c = NULL;
    kvc_vk_tensor s0, s1, rd;
    VkCommandBuffer cmd;
    float a[HY_NS], b[HY_NS], got[HY_NS], *host_st = NULL;
    const float *ro = NULL;
    int32_t pos[3] = {0, 0, 1}, seq[3] = {0, 1, 1}, i, at = 1;
    kvc_batch bt;
    kvc_pool_config_init(&pc);
    pc.n_layers = 2;
    pc.state_floats = HY_NS;
    pc.budget_bytes = 8 * 2 * (HY_NS + 1) * 4;
    TK_OK(kvc_vk_pool_create(ctx, &pc, NULL, &vp));
    if (vp == NULL) return;
    kvc_cache_config_init(&cc, KVC_KIND_RECURRENT);
    cc.max_seqs = 2;
    TK_OK(kvc_cache_create(kvc_vk_pool_host(vp), &cc, &c));
    cmd = begin_cmd();
    TK_RES(kvc_vk_cmd_state(vp, cmd, c, 0, 0, &s0), KVC_ERR_STATE); /* no batch open */
    TK_OK(kvc_vk_state_read(vp, c, 1, 0, &rd));
    TK_CHECK(rd.buffer == VK_NULL_HANDLE); /* nothing consumed: zeros */
    bt.n_tokens = 3; bt.pos = pos; bt.seq = seq; bt.non_causal = NULL;
    TK_OK(kvc_begin_batch(c, &bt));
    TK_RES(kvc_state(c, 0, 0, &host_st), KVC_ERR_UNSUPPORTED); /* no state bytes on the host */
    TK_RES(kvc_state_read(c, 0, 0, &ro), KVC_ERR_UNSUPPORTED);
    TK_RES(kvc_state_checkpoint(c, 0, 1, a), KVC_ERR_UNSUPPORTED);
    TK_RES(kvc_vk_cmd_state(vp, cmd, c, 2, 0, &s0), KVC_ERR_RANGE);
    TK_RES(kvc_vk_cmd_state(vp, cmd, c, 0, 2, &s0), KVC_ERR_RANGE);
    TK_RES(kvc_vk_cmd_state_checkpoint(vp, cmd, c, 0, 1, &rd), KVC_ERR_NULL); /* rd: no buffer */
    for (i = 0; i < HY_NS; ++i) { a[i] = (float)i + 0.25f; b[i] = -(float)i; }
    ensure(&in_buf, sizeof(float) * 2 * HY_NS);
    memcpy(in_buf.mapped, a, sizeof(a));
    memcpy((float *)in_buf.mapped + HY_NS, b, sizeof(b));
    for (i = 0; i < 2; ++i) { /* both layers: seq 0 gets a, seq 1 gets b */
        TK_OK(kvc_vk_cmd_state(vp, cmd, c, 0, i, &s0));
        TK_OK(kvc_vk_cmd_state(vp, cmd, c, 1, i, &s1));
        TK_CHECK(s0.buffer != VK_NULL_HANDLE && (s0.buffer != s1.buffer || s0.offset != s1.offset));
        cmd_put_state(cmd, 0, &s0);
        cmd_put_state(cmd, 1, &s1);
    }
    TK_RES(kvc_vk_cmd_state_checkpoint(vp, cmd, c, 0, 1, &s0), KVC_ERR_NOT_FOUND); /* in the batch, not named */
    TK_RES(kvc_vk_cmd_state_checkpoint(vp, cmd, c, 0, 2, &s0), KVC_ERR_RANGE);     /* past the batch */
    TK_OK(kvc_vk_context_submit_wait(ctx, cmd));
    for (i = 0; i < 2; ++i) {
        TK_OK(kvc_vk_state_read(vp, c, 0, i, &rd));
        TK_OK(kvc_vk_buffer_download(ctx, rd.buffer, rd.offset, got, sizeof(got)));
        TK_CHECK(memcmp(got, a, sizeof(a)) == 0);
        TK_OK(kvc_vk_state_read(vp, c, 1, i, &rd));
        TK_OK(kvc_vk_buffer_download(ctx, rd.buffer, rd.offset, got, sizeof(got)));
        TK_CHECK(memcmp(got, b, sizeof(b)) == 0);
    }
    /* a checkpoint inside the next batch of sequence 0, handed over from a copy */
    TK_OK(kvc_begin(c, 2, &at, 0));
    cmd = begin_cmd();
    TK_RES(kvc_vk_cmd_state(vp, cmd, c, 1, 0, &s1), KVC_ERR_STATE); /* not in the batch */
    TK_RES(kvc_vk_cmd_append(vp, cmd, c, 0, &s0, &s0), KVC_ERR_UNSUPPORTED); /* no K/V here */
    for (i = 0; i < 2; ++i) TK_OK(kvc_vk_cmd_state(vp, cmd, c, 0, i, &s0));
    TK_OK(kvc_vk_context_submit_wait(ctx, cmd));
    TK_OK(kvc_cache_destroy(c));
    /* a K/V pool's cache has no state; a state pool's cache is not the K/V pool's */
    kvc_pool_config_init(&pc);
    pc.n_layers = 1; pc.n_kv_heads = 1; pc.head_dim_k = pc.head_dim_v = 8; pc.page_cells = 4; pc.budget_bytes = 1 << 14;
    TK_OK(kvc_vk_pool_create(ctx, &pc, NULL, &kvp));
    kvc_cache_config_init(&cc, KVC_KIND_FULL);
    TK_OK(kvc_cache_create(kvc_vk_pool_host(kvp), &cc, &c));
    TK_OK(kvc_begin(c, 1, NULL, 0));
    cmd = begin_cmd();
    TK_RES(kvc_vk_cmd_state(kvp, cmd, c, 0, 0, &s0), KVC_ERR_UNSUPPORTED);
    TK_RES(kvc_vk_cmd_state(vp, cmd, c, 0, 0, &s0), KVC_ERR_FOREIGN);
    TK_OK(kvc_vk_context_submit_wait(ctx, cmd));
    TK_OK(kvc_cache_destroy(c));
    TK_OK(kvc_vk_pool_destroy(kvp));
    TK_OK(kvc_vk_pool_destroy(vp));
    { /* memories: the backend owns the hooks; configs are checked as kvc_memory_create does */
        kvc_memory_config mc;
        kvc_group_config g[2];
        int32_t map[4], l, gl;
        kvc_vk_memory *vm = NULL;
        kvc_memory *other = NULL, *fork = NULL;
        kvc_vk_pool *gp = NULL;
        kvc_cache *gc = NULL;
        hy_config(&mc, g, map, KVC_KIND_FULL, KVC_TYPE_F32);
        g[0].pool.hooks.external_data = 1;
        TK_RES(kvc_vk_memory_create(ctx, &mc, NULL, &vm), KVC_ERR_INVALID);
        g[0].pool.hooks.external_data = 0;
        mc.n_groups = 0;
        TK_RES(kvc_vk_memory_create(ctx, &mc, NULL, &vm), KVC_ERR_INVALID);
        mc.n_groups = 2;
        TK_OK(kvc_vk_memory_create(ctx, &mc, NULL, &vm));
        TK_OK(kvc_memory_create(&mc, &other));
        if (vm == NULL || other == NULL) return;
        TK_RES(kvc_vk_memory_layer(vm, other, 0, &gp, &gc, &gl), KVC_ERR_FOREIGN);
        TK_RES(kvc_vk_memory_layer(vm, NULL, 4, &gp, &gc, &gl), KVC_ERR_RANGE);
        TK_RES(kvc_vk_memory_pool(vm, 2, &gp), KVC_ERR_RANGE);
        for (l = 0; l < 4; ++l) {
            kvc_vk_pool *byg = NULL;
            TK_OK(kvc_vk_memory_layer(vm, NULL, l, &gp, &gc, &gl));
            TK_OK(kvc_vk_memory_pool(vm, l % 2, &byg));
            TK_CHECK(gp == byg && gl == l / 2);
            TK_RES(kvc_pool_destroy(kvc_vk_pool_host(byg)), KVC_ERR_BUSY); /* the memory's */
        }
        TK_OK(kvc_memory_begin(kvc_vk_memory_host(vm), 2, NULL, 0));
        TK_RES(kvc_memory_state(kvc_vk_memory_host(vm), 0, 0, &host_st), KVC_ERR_UNSUPPORTED);
        TK_RES(kvc_memory_put(kvc_vk_memory_host(vm), 1, a, a), KVC_ERR_INVALID); /* the device writes */
        TK_OK(kvc_memory_cancel(kvc_vk_memory_host(vm)));
        TK_OK(kvc_memory_fork(kvc_vk_memory_host(vm), &fork));
        TK_OK(kvc_vk_memory_layer(vm, fork, 2, &gp, &gc, &gl));
        TK_RES(kvc_vk_memory_destroy(vm), KVC_ERR_BUSY); /* the fork shares its pools */
        TK_OK(kvc_memory_destroy(fork));
        TK_OK(kvc_memory_destroy(other));
        TK_OK(kvc_vk_memory_destroy(vm));
    }
}

/* ---- Device memory follows use --------------------------------------------------------
   A second context on the same device whose vkAllocateMemory / vkFreeMemory are counted
   (its function table comes through counted_gipa): what the pools and memories made on it
   hold, at any time, against what their device stats say. */
static PFN_vkGetInstanceProcAddr real_gipa;
static PFN_vkGetDeviceProcAddr real_gdpa;
static PFN_vkAllocateMemory real_allocate;
static PFN_vkFreeMemory real_free;
#define DM_MAX 4096
static struct { VkDeviceMemory m; VkDeviceSize n; } dm_live[DM_MAX];
static int dm_n;
static uint64_t dm_bytes, dm_peak;

static long dm_fail_after = -1; /* device allocations left to succeed (-1: all) */
static VKAPI_ATTR VkResult VKAPI_CALL counted_allocate(VkDevice d, const VkMemoryAllocateInfo *ai,
                                                       const VkAllocationCallbacks *a, VkDeviceMemory *m) {
    VkResult r;
    if (dm_fail_after == 0) return VK_ERROR_OUT_OF_DEVICE_MEMORY;
    if (dm_fail_after > 0) dm_fail_after--;
    r = real_allocate(d, ai, a, m);
    if (r == VK_SUCCESS && dm_n < DM_MAX) {
        dm_live[dm_n].m = *m;
        dm_live[dm_n++].n = ai->allocationSize;
        dm_bytes += ai->allocationSize;
        if (dm_bytes > dm_peak) dm_peak = dm_bytes;
    }
    return r;
}
static VKAPI_ATTR void VKAPI_CALL counted_free(VkDevice d, VkDeviceMemory m, const VkAllocationCallbacks *a) {
    int i;
    for (i = 0; i < dm_n; ++i)
        if (dm_live[i].m == m) {
            dm_bytes -= dm_live[i].n;
            dm_live[i] = dm_live[--dm_n];
            break;
        }
    real_free(d, m, a);
}
static VKAPI_ATTR PFN_vkVoidFunction VKAPI_CALL counted_gdpa(VkDevice d, const char *name) {
    if (strcmp(name, "vkAllocateMemory") == 0) {
        real_allocate = (PFN_vkAllocateMemory)real_gdpa(d, name);
        return (PFN_vkVoidFunction)counted_allocate;
    }
    if (strcmp(name, "vkFreeMemory") == 0) {
        real_free = (PFN_vkFreeMemory)real_gdpa(d, name);
        return (PFN_vkVoidFunction)counted_free;
    }
    return real_gdpa(d, name);
}
static VKAPI_ATTR PFN_vkVoidFunction VKAPI_CALL counted_gipa(VkInstance inst, const char *name) {
    if (strcmp(name, "vkGetDeviceProcAddr") == 0) {
        real_gdpa = (PFN_vkGetDeviceProcAddr)real_gipa(inst, name);
        return (PFN_vkVoidFunction)counted_gdpa;
    }
    return real_gipa(inst, name);
}

#define DM_BUDGET ((size_t)64 << 20)
#define DM_CAP (DM_BUDGET + DM_BUDGET / 4 + ((size_t)8 << 20)) /* the target: 1.25 x budget + 8 MiB */
#define DM_HD 64
#define DM_HEADS 4

/* what the counted context holds against what the stats say, after a submitted step */
static void dm_check(kvc_vk_device_stats *st, uint64_t *steady) {
    TK_EQ(st->device_bytes, dm_bytes); /* every byte the context holds is a pool's */
    TK_EQ(st->retiring_bytes, 0);      /* the device ran past the copies */
    TK_CHECK(st->device_bytes <= DM_CAP);
    /* while a grow's copy runs, the old page buffers are held too: a group's at most */
    TK_CHECK(dm_peak <= DM_CAP + DM_BUDGET + DM_BUDGET / 4);
    if (dm_bytes > *steady) *steady = dm_bytes;
}

/* a value each (token, layer, index, K or V) has, exact in f16 */
static float dm_value(int32_t t, int32_t l, int32_t i, int v) {
    return (float)((t * 31 + l * 7 + i * 3 + v * 5) % 61 - 30) / 8.0f;
}

/* K and V of tokens [t0, t0 + n <= 1000) of layer l < 8 into in_buf (a part of its own:
   one command buffer appends every layer), as append tensors */
#define DM_INPUT_FLOATS ((size_t)2 * 1000 * DM_HEADS * DM_HD)
static void dm_input(int32_t t0, int32_t n, int32_t l, kvc_vk_tensor *k, kvc_vk_tensor *v) {
    int32_t i, nk = DM_HEADS * DM_HD;
    float *f = (float *)in_buf.mapped + (size_t)l * DM_INPUT_FLOATS;
    for (i = 0; i < n * nk; ++i) {
        f[i] = dm_value(t0 + i / nk, l, i % nk, 0);
        f[(size_t)n * nk + (size_t)i] = dm_value(t0 + i / nk, l, i % nk, 1);
    }
    memset(k, 0, sizeof(*k));
    memset(v, 0, sizeof(*v));
    k->buffer = v->buffer = in_buf.buffer;
    k->offset = sizeof(float) * (size_t)l * DM_INPUT_FLOATS;
    v->offset = k->offset + sizeof(float) * (size_t)n * (size_t)nk;
}

/* the K and V of layer l that a FULL cache of tokens 0.. holds are dm_value's */
static void dm_check_data(kvc_vk_context *cc, kvc_vk_pool *vp, const kvc_cache *c, int32_t l) {
    int32_t n = 0, i, nk = DM_HEADS * DM_HD, bad = 0;
    kvc_vk_tensor gk, gv;
    VkCommandBuffer cmd;
    TK_OK(kvc_vk_cmd_gather(vp, VK_NULL_HANDLE, c, l, NULL, NULL, NULL, 0, &n));
    ensure(&gk_buf, sizeof(float) * (size_t)n * nk + 16);
    ensure(&gv_buf, sizeof(float) * (size_t)n * nk + 16);
    memset(&gk, 0, sizeof(gk));
    memset(&gv, 0, sizeof(gv));
    gk.buffer = gk_buf.buffer;
    gv.buffer = gv_buf.buffer;
    TK_OK(kvc_vk_context_begin(cc, &cmd));
    TK_OK(kvc_vk_cmd_gather(vp, cmd, c, l, &gk, &gv, NULL, n, &n));
    TK_OK(kvc_vk_context_submit_wait(cc, cmd));
    for (i = 0; i < n * nk; ++i) {
        int wrong = ((float *)gk_buf.mapped)[i] != dm_value(i / nk, l, i % nk, 0) ||
                    ((float *)gv_buf.mapped)[i] != dm_value(i / nk, l, i % nk, 1);
        if (wrong && bad == 0) fprintf(stderr, "layer %d: token %d of %d differs first\n", l, i / nk, n);
        bad += wrong;
    }
    TK_EQ(bad, 0);
}

static void dm_pool_config(kvc_pool_config *pc, int32_t layers) {
    kvc_pool_config_init(pc);
    pc->n_layers = layers;
    pc->n_kv_heads = DM_HEADS;
    pc->head_dim_k = pc->head_dim_v = DM_HD;
    pc->type_k = pc->type_v = KVC_TYPE_F16;
    pc->page_cells = 16;
}

/* One pool of 64 MiB: empty, filled to 90 % in batches of 512 tokens, trimmed back to
   1000 tokens, grown again; the data survives every replacement. */
static void dm_pool(kvc_vk_context *cc) {
    kvc_pool_config pc;
    kvc_cache_config ccfg;
    kvc_vk_pool *vp = NULL;
    kvc_cache *c = NULL;
    kvc_vk_device_stats st;
    kvc_vk_tensor k, v;
    VkCommandBuffer cmd;
    uint64_t steady = 0;
    int32_t t = 0, n, l, cap_full;
    dm_pool_config(&pc, 4);
    pc.budget_bytes = DM_BUDGET;
    dm_peak = dm_bytes;
    TK_OK(kvc_vk_pool_create(cc, &pc, NULL, &vp));
    if (vp == NULL) return;
    kvc_cache_config_init(&ccfg, KVC_KIND_FULL);
    TK_OK(kvc_cache_create(kvc_vk_pool_host(vp), &ccfg, &c));
    TK_OK(kvc_vk_pool_device_stats(vp, &st));
    dm_check(&st, &steady);
    printf("device memory, one pool of 64 MiB (4 layers, f16): empty %.2f MiB", st.device_bytes / 1048576.0);
    TK_CHECK(st.device_bytes <= DM_BUDGET / 16); /* far less than the budget */
    for (; t < 14700; t += n) {
        n = 14700 - t < 512 ? 14700 - t : 512;
        TK_OK(kvc_begin(c, n, NULL, 0));
        TK_OK(kvc_vk_context_begin(cc, &cmd));
        for (l = 0; l < 4; ++l) {
            dm_input(t, n, l, &k, &v);
            TK_OK(kvc_vk_cmd_append(vp, cmd, c, l, &k, &v));
        }
        TK_OK(kvc_vk_context_submit_wait(cc, cmd));
        TK_OK(kvc_vk_pool_device_stats(vp, &st));
        dm_check(&st, &steady);
    }
    cap_full = st.pages_capacity;
    printf(", full (%d of %d pages) %.2f MiB, at most %.2f between batches, %.2f while growing",
           kvc_vk_pool_host(vp)->max_pages - kvc_vk_pool_host(vp)->n_free, kvc_vk_pool_host(vp)->max_pages,
           st.device_bytes / 1048576.0, steady / 1048576.0, dm_peak / 1048576.0);
    dm_check_data(cc, vp, c, 3);
    /* shrink: the pages of the trimmed tokens go back to the pool, then the device */
    TK_OK(kvc_cache_trim(c, 14700 - 1000));
    TK_OK(kvc_vk_context_begin(cc, &cmd));
    TK_OK(kvc_vk_pool_cmd_trim(vp, cmd));
    TK_OK(kvc_vk_context_submit_wait(cc, cmd));
    TK_OK(kvc_vk_pool_device_stats(vp, &st));
    dm_check(&st, &steady);
    printf(", trimmed to 1000 tokens %.2f MiB\n", st.device_bytes / 1048576.0);
    TK_CHECK(st.pages_capacity < cap_full / 8);
    TK_CHECK(st.device_bytes <= DM_BUDGET / 8);
    dm_check_data(cc, vp, c, 0);
    for (t = 1000; t < 4000; t += 1000) { /* and again, grown before each batch */
        TK_OK(kvc_begin(c, 1000, NULL, 0));
        TK_OK(kvc_vk_pool_fit(vp));
        TK_OK(kvc_vk_context_begin(cc, &cmd));
        for (l = 0; l < 4; ++l) {
            dm_input(t, 1000, l, &k, &v);
            TK_OK(kvc_vk_cmd_append(vp, cmd, c, l, &k, &v));
        }
        TK_OK(kvc_vk_context_submit_wait(cc, cmd));
        TK_OK(kvc_vk_pool_device_stats(vp, &st));
        dm_check(&st, &steady);
    }
    dm_check_data(cc, vp, c, 2);
    kvc_cache_destroy(c);
    TK_OK(kvc_vk_pool_destroy(vp));
    TK_EQ(dm_bytes, 0);
}

/* A memory of n_groups groups (FULL, ROTATING of 256 tokens, RECURRENT, FULL of pages
   twice as large; two layers each) under one 64 MiB budget: empty, filled until the budget says
   no, cleared and trimmed, filled again. */
static void dm_memory(kvc_vk_context *cc, int32_t n_groups) {
    kvc_memory_config mc;
    kvc_group_config g[4];
    int32_t map[8], l, t = 0, round;
    kvc_vk_memory *vm = NULL;
    kvc_memory *m;
    kvc_vk_device_stats st;
    uint64_t steady = 0;
    kvc_memory_config_init(&mc);
    memset(g, 0, sizeof(g));
    for (l = 0; l < 2 * n_groups; ++l) map[l] = l / 2;
    for (l = 0; l < n_groups; ++l) {
        static const kvc_kind kinds[4] = {KVC_KIND_FULL, KVC_KIND_ROTATING, KVC_KIND_RECURRENT, KVC_KIND_FULL};
        kvc_pool_config pc;
        dm_pool_config(&pc, 2);
        if (l == 3) pc.page_cells = 32; /* another page size */
        if (kinds[l] == KVC_KIND_RECURRENT) {
            memset(&pc, 0, sizeof(pc));
            pc.n_layers = 2;
            pc.state_floats = 4096;
        }
        g[l].pool = pc;
        kvc_cache_config_init(&g[l].cache, kinds[l]);
        if (kinds[l] == KVC_KIND_ROTATING) g[l].cache.window = 256;
    }
    mc.n_layers = 2 * n_groups;
    mc.layer_group = map;
    mc.n_groups = n_groups;
    mc.groups = g;
    mc.budget_bytes = DM_BUDGET;
    dm_peak = dm_bytes;
    TK_OK(kvc_vk_memory_create(cc, &mc, NULL, &vm));
    if (vm == NULL) return;
    m = kvc_vk_memory_host(vm);
    TK_OK(kvc_vk_memory_device_stats(vm, &st));
    dm_check(&st, &steady);
    printf("device memory, %d groups under 64 MiB: empty %.2f MiB", n_groups, st.device_bytes / 1048576.0);
    TK_CHECK(st.device_bytes <= DM_BUDGET / 16);
    for (round = 0; round < 2; ++round) { /* round 1: the grows before the batches (kvc_vk_memory_fit) */
        VkCommandBuffer cmd;
        dm_peak = dm_bytes;
        for (t = 0;; t += 512) {
            kvc_result r = kvc_memory_begin(m, 512, NULL, 0);
            if (r == KVC_ERR_FULL) break;
            TK_OK(r);
            if (r != KVC_OK) break;
            if (round == 1) TK_OK(kvc_vk_memory_fit(vm));
            TK_OK(kvc_vk_context_begin(cc, &cmd));
            for (l = 0; l < 2 * n_groups; ++l) {
                kvc_vk_pool *vp;
                kvc_cache *c;
                int32_t gl;
                kvc_vk_tensor k, v;
                TK_OK(kvc_vk_memory_layer(vm, NULL, l, &vp, &c, &gl));
                if (map[l] == 2) { /* RECURRENT: the live state (the engine's shader would scan it) */
                    TK_OK(kvc_vk_cmd_state(vp, cmd, c, 0, gl, &k));
                    continue;
                }
                dm_input(t, 512, l, &k, &v);
                TK_OK(kvc_vk_cmd_append(vp, cmd, c, gl, &k, &v));
            }
            TK_OK(kvc_vk_context_submit_wait(cc, cmd));
            TK_OK(kvc_vk_memory_device_stats(vm, &st));
            dm_check(&st, &steady);
        }
        if (round == 0)
            printf(", full (%d tokens) %.2f MiB, at most %.2f between batches, %.2f while growing", t,
                   st.device_bytes / 1048576.0, steady / 1048576.0, dm_peak / 1048576.0);
        else
            printf("; grown by kvc_vk_memory_fit: at most %.2f MiB at any time\n", dm_peak / 1048576.0);
        if (round == 1) TK_CHECK(dm_peak <= DM_CAP); /* the target, at any time */
        TK_OK(kvc_memory_clear(m));
        TK_OK(kvc_vk_context_begin(cc, &cmd));
        TK_OK(kvc_vk_memory_cmd_trim(vm, cmd));
        TK_OK(kvc_vk_context_submit_wait(cc, cmd));
        TK_OK(kvc_vk_memory_device_stats(vm, &st));
        dm_check(&st, &steady);
        TK_CHECK(st.device_bytes <= DM_BUDGET / 16);
        if (round == 0) printf(", cleared and trimmed %.2f MiB", st.device_bytes / 1048576.0);
    }
    TK_OK(kvc_vk_memory_destroy(vm));
    TK_EQ(dm_bytes, 0);
}

static void test_device_memory(void) {
    kvc_vk_info info;
    kvc_vk_context_desc d;
    kvc_vk_context *cc = NULL;
    int32_t n;
    kvc_vk_context_info(ctx, &info);
    memset(&d, 0, sizeof(d));
    real_gipa = loader.get_instance_proc_addr;
    d.get_instance_proc_addr = counted_gipa;
    d.instance = info.instance;
    d.physical_device = info.physical_device;
    d.device = info.device;
    d.queue = info.queue;
    d.queue_family = info.queue_family;
    d.enabled_features = info.active_features;
    d.allocator.alloc = count_alloc;
    d.allocator.free = count_free;
    TK_OK(kvc_vk_context_create(&d, &cc));
    if (cc == NULL) return;
    ensure(&in_buf, sizeof(float) * 8 * DM_INPUT_FLOATS);
    dm_pool(cc);
    /* The memories of 1-3 groups are the first groups of the 4-group one (FULL, ROTATING,
       RECURRENT, FULL of larger pages): below full scale the 4 groups (every kind, every
       check) and one smaller memory by turns with the seed (under ASan the five took 55 s
       of test_vk's 124 s CPU); below 0.1 one of the four (the matrix's runs) */
    for (n = 1; n <= 4; ++n)
        if (tk_scale() >= 1 || (tk_scale() >= 0.1 && n == 4) || n == 1 + (int32_t)(run_seed % (tk_scale() >= 0.1 ? 3 : 4)))
            dm_memory(cc, n);
    TK_OK(kvc_vk_context_destroy(cc));
}

/* ---- Tiers under device trees (issue 39) ---------------------------------------------
   A device pool's (and a device memory's) prefix tree with a host tier and a directory
   store: what eviction takes is read off the device through the page hooks' staging, and
   kvc_tier_fetch writes it back through them. Every byte of an entry -- K/V pages,
   states, checkpoints -- as kvc_radix_save reads it off the device is the same after the
   trip down and up as before, and the same as the CPU's entry of the same evaluation
   (the blobs are made on the CPU and loaded: no kernel runs, so the valgrind run of the
   host side has this too; td_pressure appends with the kernel instead). */
#define TD_PC 4        /* page cells: the tiers' block */
#define TD_N (4 * TD_PC + 2) /* an entry's tokens */
#define TD_X (4 * TD_PC)     /* what a tier keeps of it: its whole blocks */
#define TD_SHORT (TD_PC + 1) /* a shorter entry of the same tokens the tree keeps serving */
static const kvc_namespace TD_NS = {0x7469657273ull, 39};
static const int32_t *td_tok; /* the entry td_save_fn saves: td_tok[0 .. td_n) */
static int32_t td_n;
static char td_dir[256];
static long td_fail_after = -1; /* the device pools' host allocations left to succeed (-1: all) */
static kvc_vk_context *td_cx;   /* where td_device_pool makes its pools (ctx, or a counted one) */

static void *td_alloc(size_t n, void *user) {
    if (td_fail_after == 0) return NULL;
    if (td_fail_after > 0) td_fail_after--;
    return count_alloc(n, user);
}
static kvc_result td_save_fn(const void *t, const kvc_io *io) {
    return kvc_radix_save((kvc_radix *)(uintptr_t)t, TD_NS, td_tok, td_n, io);
}
/* the tree's entry tokens[0 .. n), as kvc_radix_save writes it (read off the device) */
static blob td_entry(const kvc_radix *t, const int32_t *tokens, int32_t n) {
    blob none = {NULL, 0};
    td_tok = tokens;
    td_n = n;
    return save_blob_ok(td_save_fn, t) ? save_blob(td_save_fn, t) : none;
}
/* whether the tree's entry tokens[0 .. n) is b, byte for byte */
static int td_holds(const kvc_radix *t, const int32_t *tokens, int32_t n, const blob *b) {
    blob now = td_entry(t, tokens, n);
    int same = now.data != NULL && same_blob(&now, b);
    free(now.data);
    return same;
}
static kvc_result td_load(kvc_radix *t, const blob *b, int32_t *got) {
    kvc_mem m;
    kvc_io io = blob_reader(&m, b, b->size);
    return kvc_radix_load(t, TD_NS, &io, 0, got);
}
static void td_pool_config(kvc_pool_config *pc, kvc_type t, int32_t pages) {
    size_t page = 0;
    kvc_pool_config_init(pc);
    pc->n_layers = 2;
    pc->n_kv_heads = 2;
    pc->head_dim_k = pc->head_dim_v = 32; /* q8_0: two blocks a row */
    pc->type_k = pc->type_v = t;
    pc->page_cells = TD_PC;
    TK_OK(kvc_pool_page_bytes(pc, &page));
    pc->budget_bytes = (size_t)pages * page;
}
static kvc_vk_pool *td_device_pool(kvc_type t, int32_t pages) {
    kvc_pool_config pc;
    kvc_vk_pool *vp = NULL;
    td_pool_config(&pc, t, pages);
    pc.runtime.allocator.alloc = td_alloc;
    pc.runtime.allocator.free = count_free;
    TK_OK(kvc_vk_pool_create(td_cx, &pc, NULL, &vp));
    return vp;
}
/* t (may be NULL) with tiers: host_bytes of host tier, the directory store or none */
static kvc_radix *td_tiers(kvc_radix *t, size_t host_bytes, int store) {
    kvc_tier_config tc;
    static kvc_store_dir_state st; /* outlives the trees */
    kvc_tier_config_init(&tc);
    tc.host_bytes = host_bytes;
    if (store) TK_OK(kvc_store_dir(&st, td_dir, &tc.store));
    if (t != NULL) TK_OK(kvc_tier_attach(t, &tc));
    return t;
}
/* a tree on the device pool with tiers (td_tiers) */
static kvc_radix *td_tree(kvc_vk_pool *vp, size_t host_bytes, int store) {
    kvc_radix_config rc;
    kvc_radix *t = NULL;
    kvc_radix_config_init(&rc, KVC_KIND_FULL);
    TK_OK(kvc_radix_create(kvc_vk_pool_host(vp), &rc, &t));
    return td_tiers(t, host_bytes, store);
}
static kvc_tier_stats td_stats(const kvc_radix *t) {
    kvc_tier_stats s;
    memset(&s, 0, sizeof(s));
    TK_OK(kvc_tier_stats_get(t, &s));
    return s;
}
/* The CPU's evaluation of tokens[0 .. TD_N) (K/V small integers and halves, every type's
   bits fixed by kvcache.h's conversion), saved whole and as its TD_X and TD_SHORT prefixes. */
static void td_cpu_entries(kvc_type t, const int32_t *tokens, blob *full, blob *x, blob *shrt) {
    static float k[TD_N * 64], v[TD_N * 64];
    kvc_pool_config pc;
    kvc_pool *cp = NULL;
    kvc_radix_config rc;
    kvc_radix *tc = NULL;
    kvc_cache *c = NULL;
    int32_t i, l, reused = -1;
    td_pool_config(&pc, t, 64);
    TK_OK(kvc_pool_create(&pc, &cp));
    kvc_radix_config_init(&rc, KVC_KIND_FULL);
    TK_OK(kvc_radix_create(cp, &rc, &tc));
    TK_OK(kvc_radix_lookup(tc, TD_NS, tokens, TD_N, &c, &reused));
    TK_OK(kvc_begin(c, TD_N, NULL, 0));
    for (l = 0; l < 2; ++l) {
        for (i = 0; i < TD_N * 64; ++i) {
            k[i] = (float)((i * 7 + l * 3 + tokens[i / 64]) % 23) - 11.0f;
            v[i] = (float)((i * 5 + l + tokens[i / 64]) % 19) * 0.5f;
        }
        TK_OK(kvc_put(c, l, k, v));
    }
    TK_OK(kvc_radix_commit(tc, TD_NS, c, tokens, TD_N, 0));
    TK_OK(kvc_cache_destroy(c));
    *full = td_entry(tc, tokens, TD_N);
    if (x) *x = td_entry(tc, tokens, TD_X);
    if (shrt) *shrt = td_entry(tc, tokens, TD_SHORT);
    TK_OK(kvc_radix_destroy(tc));
    TK_OK(kvc_pool_destroy(cp));
}
static void td_fill(tk_rng *rng, int32_t *tokens, int32_t n) {
    int32_t i;
    for (i = 0; i < n; ++i) tokens[i] = tk_int(rng, 0, 50000);
}
/* the directory store's file of the tree's prefix tokens[0 .. n) */
static void td_path(const kvc_radix *t, const int32_t *tokens, int32_t n, char *path, size_t cap) {
    kvc_key key;
    char hex[65];
    TK_OK(kvc_tier_key(t, TD_NS, tokens, n, &key));
    kvc_key_hex(&key, hex);
    snprintf(path, cap, "%s/%s.kvc", td_dir, hex);
}
static void td_write(const char *path, const unsigned char *data, size_t size) {
    FILE *f = fopen(path, "wb");
    TK_CHECK(f != NULL);
    if (f == NULL) return;
    TK_CHECK(fwrite(data, 1, size, f) == size);
    fclose(f);
}

/* f16 or q8_0 pages: host tier, directory store ("another process"), refused blobs, the
   host tier's budget. */
static void td_pool_tree(kvc_type t, kvc_type other, tk_rng *rng) {
    int32_t tok[TD_N + 3], abc[3][TD_N + 3], got = -1, reused = -1, pages, i;
    blob full, x, shrt, foreign, ofull, bad, fx[3], ff[3];
    kvc_vk_pool *vp = td_device_pool(t, 32), *vp2 = td_device_pool(t, 32);
    kvc_radix *tg = td_tree(vp, 1 << 20, 1), *t2 = td_tree(vp2, 0, 1), *t3;
    kvc_pool *hp = kvc_vk_pool_host(vp), *hp2 = kvc_vk_pool_host(vp2);
    kvc_tier_stats s;
    kvc_cache *c = NULL;
    char path[400];
    if (tg == NULL || t2 == NULL) return;
    td_fill(rng, tok, TD_N + 3);
    td_cpu_entries(t, tok, &full, &x, &shrt);
    td_cpu_entries(other, tok, &ofull, &foreign, NULL);
    /* host tier: the entry (loaded from the CPU's file: exact on the device) evicted, fetched */
    TK_OK(td_load(tg, &full, &got));
    TK_EQ(got, TD_N);
    TK_CHECK(td_holds(tg, tok, TD_X, &x));
    TK_OK(kvc_radix_evict(tg, 1000, NULL));
    TK_EQ(sl_pages(hp), 0);
    s = td_stats(tg);
    TK_EQ(s.kept_host, 1);
    TK_CHECK(s.host_bytes == x.size); /* the blob: what the device held, read back */
    TK_OK(kvc_tier_fetch(tg, TD_NS, tok, TD_N + 3, &got));
    TK_EQ(got, TD_X);
    s = td_stats(tg);
    TK_EQ(s.fetched_host, 1);
    TK_EQ(s.host_blobs, 0);
    TK_CHECK(td_holds(tg, tok, TD_X, &x)); /* every page's bytes, read off the device */
    TK_OK(kvc_radix_lookup(tg, TD_NS, tok, TD_N + 3, &c, &reused));
    TK_EQ(reused, TD_X);
    if (c) kvc_cache_destroy(c);
    /* the directory store: published here, fetched by another pool and tree */
    TK_OK(kvc_tier_publish(tg, TD_NS, tok, TD_N, &got));
    TK_EQ(got, TD_X);
    TK_OK(kvc_tier_fetch(t2, TD_NS, tok, TD_N, &got));
    TK_EQ(got, TD_X);
    TK_EQ(td_stats(t2).fetched_store, 1);
    TK_CHECK(td_holds(t2, tok, TD_X, &x));
    /* damaged, truncated and foreign files are refused whole: the device tree keeps
       serving its shorter entry with the same bytes, on the same pages */
    TK_OK(kvc_radix_evict(t2, 1000, NULL)); /* down to the store again: the same file */
    TK_OK(td_load(t2, &shrt, &got));
    pages = sl_pages(hp2);
    td_path(t2, tok, TD_X, path, sizeof(path));
    bad.size = x.size;
    bad.data = (unsigned char *)malloc(x.size);
    for (i = 0; i < 4; ++i) {
        memcpy(bad.data, x.data, x.size);
        if (i == 0) td_write(path, bad.data, bad.size - 7);         /* truncated */
        if (i == 1) { bad.data[bad.size - 40] ^= 0x10; td_write(path, bad.data, bad.size); } /* K/V bits */
        if (i == 2) { bad.data[100] ^= 0x01; td_write(path, bad.data, bad.size); }           /* configuration */
        if (i == 3) td_write(path, foreign.data, foreign.size);     /* another type's entry */
        TK_OK(kvc_tier_fetch(t2, TD_NS, tok, TD_N, &got));
        TK_EQ(got, 0);
        TK_EQ(td_stats(t2).refused, (uint64_t)i + 1);
        TK_EQ(sl_pages(hp2), pages);
        TK_CHECK(td_holds(t2, tok, TD_SHORT, &shrt));
    }
    td_write(path, x.data, x.size); /* the intact file comes up */
    TK_OK(kvc_tier_fetch(t2, TD_NS, tok, TD_N, &got));
    TK_EQ(got, TD_X);
    TK_CHECK(td_holds(t2, tok, TD_X, &x));
    free(bad.data);
    /* the host tier's budget is hard: room for one blob and a half, three entries evicted */
    t3 = td_tree(vp, x.size * 3 / 2, 0);
    for (i = 0; i < 3; ++i) {
        td_fill(rng, abc[i], TD_N + 3);
        td_cpu_entries(t, abc[i], &ff[i], &fx[i], NULL);
        TK_OK(td_load(t3, &ff[i], &got));
        TK_OK(kvc_radix_evict(t3, 1000, NULL)); /* one at a time: the oldest blob goes first */
        s = td_stats(t3);
        TK_CHECK(s.host_bytes <= x.size * 3 / 2);
    }
    TK_EQ(s.host_blobs, 1);
    TK_EQ(s.dropped, 2); /* no store below */
    TK_OK(kvc_tier_fetch(t3, TD_NS, abc[0], TD_N, &got));
    TK_EQ(got, 0);
    TK_OK(kvc_tier_fetch(t3, TD_NS, abc[2], TD_N, &got));
    TK_EQ(got, TD_X);
    TK_CHECK(td_holds(t3, abc[2], TD_X, &fx[2]));
    for (i = 0; i < 3; ++i) { free(ff[i].data); free(fx[i].data); }
    TK_OK(kvc_radix_destroy(t3));
    TK_OK(kvc_radix_destroy(tg));
    TK_OK(kvc_radix_destroy(t2));
    TK_EQ(sl_pages(hp), 0);
    TK_OK(kvc_vk_pool_destroy(vp));
    TK_OK(kvc_vk_pool_destroy(vp2));
    remove(path);
    free(full.data); free(x.data); free(shrt.data); free(foreign.data); free(ofull.data);
}

/* every host allocation of the device pool failing in turn during an eviction and a
   fetch: no crash, no leak, and what the tree holds after is exact */
static void td_alloc_failures(tk_rng *rng) {
    int32_t tok[TD_N], got = -1, k, wrong = 0, exact = 0;
    long live0 = live_allocs;
    blob full, x;
    kvc_vk_pool *vp = td_device_pool(KVC_TYPE_F16, 32);
    kvc_radix *t = td_tree(vp, 1 << 20, 0);
    if (t == NULL) return;
    td_fill(rng, tok, TD_N);
    td_cpu_entries(KVC_TYPE_F16, tok, &full, &x, NULL);
    for (k = 0; k < 400; ++k) {
        int hit;
        TK_OK(td_load(t, &full, &got));
        td_fail_after = k;
        (void)kvc_radix_evict(t, 1000, NULL); /* a failed keep only loses the copy */
        (void)kvc_tier_fetch(t, TD_NS, tok, TD_N, &got);
        hit = td_fail_after == 0;
        td_fail_after = -1;
        if (got == TD_X) { wrong += !td_holds(t, tok, TD_X, &x); exact++; }
        else wrong += got != 0;
        (void)kvc_radix_evict(t, 1000, NULL);
        if (!hit) break; /* every allocation succeeded: all have failed once */
    }
    TK_EQ(wrong, 0);
    TK_CHECK(exact >= 1 && k < 400);
    TK_OK(kvc_radix_destroy(t));
    TK_OK(kvc_vk_pool_destroy(vp));
    TK_EQ(live_allocs, live0);
    free(full.data);
    free(x.data);
}

static long tc_fail_after = -1; /* the counted context's host allocations left to succeed */
static void *tc_alloc(size_t n, void *user) {
    if (tc_fail_after == 0) return NULL;
    if (tc_fail_after > 0) tc_fail_after--;
    return count_alloc(n, user);
}
/* A context whose device allocations are counted (test_device_memory's, on ctx's device). Its host
   allocations can be made to fail: tc_fail_after. */
static kvc_vk_context *td_counted_context(void) {
    kvc_vk_info info;
    kvc_vk_context_desc d;
    kvc_vk_context *cc = NULL;
    kvc_vk_context_info(ctx, &info);
    memset(&d, 0, sizeof(d));
    real_gipa = loader.get_instance_proc_addr;
    d.get_instance_proc_addr = counted_gipa;
    d.instance = info.instance;
    d.physical_device = info.physical_device;
    d.device = info.device;
    d.queue = info.queue;
    d.queue_family = info.queue_family;
    d.enabled_features = info.active_features;
    d.allocator.alloc = tc_alloc;
    d.allocator.free = count_free;
    TK_OK(kvc_vk_context_create(&d, &cc));
    return cc;
}

/* td_cpu_entries' evaluation of tok[0 .. TD_N) on the device: appended by the kernel (f16
   of f16-exact values: the CPU's bytes), committed to t; no staging used */
static void td_append_entry(kvc_vk_context *cc, kvc_vk_pool *vp, kvc_radix *t, const int32_t *tok) {
    const int32_t nk = 64;
    int32_t i, l, reused = -1;
    kvc_cache *c = NULL;
    VkCommandBuffer cmd;
    kvc_vk_tensor k, v;
    ensure(&in_buf, sizeof(float) * 2 * 2 * TD_N * (size_t)nk);
    TK_OK(kvc_radix_lookup(t, TD_NS, tok, TD_N, &c, &reused));
    if (c == NULL) return;
    TK_OK(kvc_begin(c, TD_N, NULL, 0));
    TK_OK(kvc_vk_context_begin(cc, &cmd));
    for (l = 0; l < 2; ++l) {
        float *f = (float *)in_buf.mapped + (size_t)l * 2 * TD_N * nk;
        for (i = 0; i < TD_N * nk; ++i) {
            f[i] = (float)((i * 7 + l * 3 + tok[i / 64]) % 23) - 11.0f;
            f[TD_N * nk + i] = (float)((i * 5 + l + tok[i / 64]) % 19) * 0.5f;
        }
        memset(&k, 0, sizeof(k));
        memset(&v, 0, sizeof(v));
        k.buffer = v.buffer = in_buf.buffer;
        k.offset = sizeof(float) * (size_t)l * 2 * TD_N * nk;
        v.offset = k.offset + sizeof(float) * TD_N * (size_t)nk;
        TK_OK(kvc_vk_cmd_append(vp, cmd, c, l, &k, &v));
    }
    TK_OK(kvc_vk_context_submit_wait(cc, cmd));
    TK_OK(kvc_radix_commit(t, TD_NS, c, tok, TD_N, 0));
    TK_OK(kvc_cache_destroy(c));
}

/* Every device allocation failing in turn: during an eviction (with kernels: the entry
   appended, on a fresh context each time, so that the eviction makes the staging halves)
   and during a fetch (one context and pool, trimmed before each: its page buffers grow
   again). A failed eviction loses the copy; a failed fetch returns KVC_ERR_NO_MEMORY and
   keeps the blob in the host tier; neither loses the pool: the entry comes back whole. */
static void td_device_failures(int kernels, tk_rng *rng) {
    int32_t tok[TD_N], got = -1, k, phase, wrong = 0, lost = 0, failed_calls = 0;
    kvc_vk_context *cc = NULL;
    kvc_vk_pool *vp = NULL;
    kvc_radix *t = NULL;
    blob full, x;
    td_fill(rng, tok, TD_N);
    td_cpu_entries(KVC_TYPE_F16, tok, &full, &x, NULL);
    for (phase = kernels ? 0 : 1; phase < 2; ++phase)
        for (k = 0; k < 64; ++k) {
            VkCommandBuffer cmd;
            int hit;
            kvc_result r;
            if (cc == NULL) { /* a fresh context for each eviction, one for every fetch */
                if ((cc = td_counted_context()) == NULL) return;
                td_cx = cc;
                vp = td_device_pool(KVC_TYPE_F16, 32);
                t = td_tree(vp, 1 << 20, 0);
                td_cx = ctx;
                if (t == NULL) return;
            }
            if (phase == 0) td_append_entry(cc, vp, t, tok);
            else TK_OK(td_load(t, &full, &got));
            dm_fail_after = phase == 0 ? k : -1;
            (void)kvc_radix_evict(t, 1000, NULL);
            hit = dm_fail_after == 0;
            dm_fail_after = -1;
            if (phase == 0 && td_stats(t).host_blobs == 0) { /* the copy lost: the entry again */
                td_append_entry(cc, vp, t, tok);
                TK_OK(kvc_radix_evict(t, 1000, NULL));
            }
            TK_EQ(td_stats(t).host_blobs, 1);
            TK_OK(kvc_vk_context_begin(cc, &cmd)); /* the device memory back: the fetch grows again */
            TK_OK(kvc_vk_pool_cmd_trim(vp, cmd));
            TK_OK(kvc_vk_context_submit_wait(cc, cmd));
            if (phase == 1) dm_fail_after = k;
            r = kvc_tier_fetch(t, TD_NS, tok, TD_N, &got);
            if (phase == 1) hit = dm_fail_after == 0;
            dm_fail_after = -1;
            TK_CHECK(r == KVC_OK || r == KVC_ERR_NO_MEMORY);
            failed_calls += r != KVC_OK;
            if (r != KVC_OK || got != TD_X) {
                TK_EQ(got, 0);
                lost += td_stats(t).host_blobs != 1; /* a failed fetch keeps the blob */
                TK_OK(kvc_tier_fetch(t, TD_NS, tok, TD_N, &got)); /* and the pool works */
            }
            TK_EQ(got, TD_X);
            wrong += !td_holds(t, tok, TD_X, &x);
            TK_OK(kvc_radix_evict(t, 1000, NULL));
            if (phase == 0 || !hit || k == 63) { /* a context an eviction's round; the fetches' at the end */
                TK_OK(kvc_radix_destroy(t));
                TK_OK(kvc_vk_pool_destroy(vp));
                TK_OK(kvc_vk_context_destroy(cc));
                TK_EQ(dm_bytes, 0);
                cc = NULL;
            }
            if (!hit) break;
        }
    TK_EQ(wrong, 0);
    TK_EQ(lost, 0);
    TK_CHECK(failed_calls > 0); /* some fetch did meet a failure */
    free(full.data);
    free(x.data);
}

/* tok[0 .. n) evaluated into the CPU memory m (hy's layers: even ones RECURRENT) in one
   batch: a toy recurrence checkpointed at the blocks' ends, K/V multiples of 1/4 (every
   type's bits fixed by kvcache.h's conversion), token i's the same whatever n. */
static void td_memory_eval(kvc_memory *m, const int32_t *tok, int32_t n) {
    int32_t at[3] = {TD_PC, 2 * TD_PC, 3 * TD_PC}, n_at = 3, l, i, j;
    const int32_t nk = HY_HEADS * HY_HD;
    static float kv[2 * (TD_N + 2) * HY_HEADS * HY_HD];
    while (n_at > 0 && at[n_at - 1] > n) n_at--;
    TK_OK(kvc_memory_begin(m, n, at, n_at));
    for (l = 0; l < 4; ++l) {
        if (l % 2 == 0) {
            float *st = NULL;
            TK_OK(kvc_memory_state(m, l, 0, &st));
            if (st == NULL) return;
            for (i = 0, j = 0; i < n; ++i) {
                int32_t e;
                for (e = 0; e < HY_NS; ++e) st[e] = st[e] * 0.5f + (float)((tok[i] + e * 3 + l) % 9) - 4.0f;
                if (j < n_at && at[j] == i + 1) TK_OK(kvc_memory_state_checkpoint(m, l, at[j++], st));
            }
        } else {
            for (i = 0; i < n * nk; ++i) {
                kv[i] = (float)((i * 3 + l + tok[i / nk]) % 29) * 0.25f;
                kv[n * nk + i] = (float)((i * 5 + l + 1 + tok[i / nk]) % 23) * 0.25f;
            }
            TK_OK(kvc_memory_put(m, l, kv, kv + (size_t)n * nk));
        }
    }
}
/* A CPU memory tree of mc holding tok[0 .. n) (td_memory_eval's) */
static kvc_radix *td_memory_entry(const kvc_memory_config *mc, const int32_t *tok, int32_t n) {
    int32_t reused = -1;
    kvc_memory *cm = NULL, *m = NULL;
    kvc_radix_config rc;
    kvc_radix *tc = NULL;
    TK_OK(kvc_memory_create(mc, &cm));
    kvc_radix_config_init(&rc, KVC_KIND_FULL);
    TK_OK(kvc_radix_create_memory(cm, &rc, &tc));
    TK_OK(kvc_memory_destroy(cm)); /* the tree keeps the pools */
    TK_OK(kvc_radix_lookup_memory(tc, TD_NS, tok, n, &m, &reused));
    if (m == NULL) return tc;
    td_memory_eval(m, tok, n);
    TK_OK(kvc_radix_commit_memory(tc, TD_NS, m, tok, n, 0));
    TK_OK(kvc_memory_destroy(m));
    return tc;
}

/* A device memory (RECURRENT states beside FULL f16 pages, hy_config's): its tree's entry
   with states at the block boundaries goes down node by node and comes back whole. */
static void td_memory_tree(tk_rng *rng) {
    kvc_memory_config mc;
    kvc_group_config g[2];
    int32_t map[4], tok[TD_N + 2], reused = -1, got = -1;
    kvc_memory *m = NULL;
    kvc_vk_memory *vm = NULL;
    kvc_radix_config rc;
    kvc_radix *tc, *tg = NULL;
    kvc_radix_stats rs;
    blob full, x;
    const int32_t n = 3 * TD_PC + 2, xm = 3 * TD_PC;
    hy_config(&mc, g, map, KVC_KIND_FULL, KVC_TYPE_F16);
    td_fill(rng, tok, TD_N + 2);
    tc = td_memory_entry(&mc, tok, n);
    if (tc == NULL) return;
    full = td_entry(tc, tok, n);
    x = td_entry(tc, tok, xm);
    TK_CHECK(full.data != NULL && x.data != NULL);
    TK_OK(kvc_radix_destroy(tc));
    /* the device memory's tree */
    TK_OK(kvc_vk_memory_create(ctx, &mc, NULL, &vm));
    if (vm == NULL || full.data == NULL) return;
    kvc_radix_config_init(&rc, KVC_KIND_FULL);
    TK_OK(kvc_radix_create_memory(kvc_vk_memory_host(vm), &rc, &tg));
    td_tiers(tg, 1 << 20, 0);
    /* a loaded entry is one node with the state at its end: the prefix first, then the
       rest, as the CPU's commit left them (a node ends at each state) */
    TK_OK(td_load(tg, &x, &got));
    TK_EQ(got, xm);
    TK_OK(td_load(tg, &full, &got));
    TK_EQ(got, n);
    TK_CHECK(td_holds(tg, tok, xm, &x));
    TK_CHECK(td_holds(tg, tok, n, &full));
    TK_OK(kvc_radix_evict(tg, 1000, NULL));
    TK_OK(kvc_radix_stats_get(tg, &rs));
    TK_EQ(rs.n_pages, 0);
    TK_CHECK(td_stats(tg).kept_host >= 1);
    { /* the recorded fetch takes pool trees only: a memory's tree is refused, nothing done */
        kvc_vk_pool *gp = NULL;
        VkCommandBuffer cmd = begin_cmd();
        TK_OK(kvc_vk_memory_pool(vm, 0, &gp));
        TK_EQ(kvc_vk_pool_cmd_fetch(gp, cmd, tg, TD_NS, tok, n, 1 << 20, &got), KVC_ERR_FOREIGN);
        TK_EQ(got, 0);
        TK_OK(kvc_vk_context_submit_wait(ctx, cmd));
    }
    TK_OK(kvc_tier_fetch(tg, TD_NS, tok, n, &got));
    TK_EQ(got, xm);
    TK_CHECK(td_holds(tg, tok, xm, &x)); /* pages, states and checkpoints off the device */
    m = NULL;
    TK_OK(kvc_radix_lookup_memory(tg, TD_NS, tok, n, &m, &reused));
    TK_EQ(reused, xm);
    if (m) TK_OK(kvc_memory_destroy(m));
    TK_OK(kvc_radix_destroy(tg));
    TK_OK(kvc_vk_memory_destroy(vm));
    free(full.data);
    free(x.data);
}

/* Eviction from inside kvc_begin on a device pool whose K/V the append kernel wrote (each
   batch submitted and waited for before the next begins: eviction reads the pages off the
   device then): every entry that went down comes back with the bytes it had. */
static void td_pressure(tk_rng *rng) {
    int32_t tok[5][TD_N], got = -1, reused = -1, i, j, l;
    const int32_t nk = 64; /* 2 heads x 32 */
    blob had[5];
    kvc_vk_pool *vp = td_device_pool(KVC_TYPE_F16, 12); /* an entry takes 5 pages: two fit */
    kvc_radix *t = td_tree(vp, 1 << 20, 0);
    kvc_tier_stats s;
    if (t == NULL) return;
    ensure(&in_buf, sizeof(float) * 2 * 2 * TD_N * (size_t)nk);
    for (i = 0; i < 5; ++i) {
        kvc_cache *c = NULL;
        VkCommandBuffer cmd;
        kvc_vk_tensor k, v;
        td_fill(rng, tok[i], TD_N);
        TK_OK(kvc_radix_lookup(t, TD_NS, tok[i], TD_N, &c, &reused));
        if (c == NULL) return;
        TK_OK(kvc_begin(c, TD_N, NULL, 0)); /* from the third on: the oldest entry goes down */
        cmd = begin_cmd();
        for (l = 0; l < 2; ++l) {
            float *f = (float *)in_buf.mapped + (size_t)l * 2 * TD_N * nk;
            for (j = 0; j < 2 * TD_N * nk; ++j) f[j] = (float)((j * 7 + l + tok[i][(j / nk) % TD_N]) % 23) - 11.0f;
            memset(&k, 0, sizeof(k));
            memset(&v, 0, sizeof(v));
            k.buffer = v.buffer = in_buf.buffer;
            k.offset = sizeof(float) * (size_t)l * 2 * TD_N * nk;
            v.offset = k.offset + sizeof(float) * TD_N * (size_t)nk;
            TK_OK(kvc_vk_cmd_append(vp, cmd, c, l, &k, &v));
        }
        TK_OK(kvc_vk_context_submit_wait(ctx, cmd));
        TK_OK(kvc_radix_commit(t, TD_NS, c, tok[i], TD_N, 0));
        TK_OK(kvc_cache_destroy(c));
        had[i] = td_entry(t, tok[i], TD_X);
    }
    s = td_stats(t);
    TK_EQ(s.kept_host, 3);
    for (i = 0, j = 0; i < 5; ++i) { /* each fetch makes room: the least recently used go down */
        TK_OK(kvc_tier_fetch(t, TD_NS, tok[i], TD_N, &got));
        TK_CHECK(got == TD_X || got == 0); /* 0: still in the tree */
        j += got == TD_X;
        TK_CHECK(td_holds(t, tok[i], TD_X, &had[i]));
        free(had[i].data);
    }
    TK_CHECK(j >= 3);
    TK_OK(kvc_radix_destroy(t));
    TK_OK(kvc_vk_pool_destroy(vp));
}

/* ---- kvc_vk_pool_cmd_fetch: a tier's prefix back by copies recorded into the caller's
   command buffer through staging of at most max_staging_bytes; the blob checked whole
   before anything changes. */
static size_t tc_retiring(kvc_vk_pool *vp) { /* the staging of a recorded fetch retires there */
    kvc_vk_device_stats st;
    memset(&st, 0, sizeof(st));
    TK_OK(kvc_vk_pool_device_stats(vp, &st));
    return st.retiring_bytes;
}

/* f16 or q8_0 pages: two prefixes in the host tier (2 and 4 blocks), a cap that takes
   only the shorter, a larger one the rest; bytes read back off the device after the
   caller's submit; refused store files change nothing and record nothing. */
static void tc_fetch(kvc_type t, tk_rng *rng) {
    int32_t tok[TD_N], got = -1, reused = -1, pages, i;
    const int32_t half = 2 * TD_PC;
    blob full, x, shrt, foreign, ofull, b8, bad;
    kvc_pool_config pc;
    size_t page = 0, r0;
    kvc_vk_pool *vp = td_device_pool(t, 32);
    kvc_radix *tg = td_tree(vp, 1 << 20, 0), *ts = td_tree(vp, 0, 1);
    kvc_pool *hp = kvc_vk_pool_host(vp);
    kvc_cache *c = NULL;
    VkCommandBuffer cmd;
    kvc_tier_stats s;
    char path[400];
    if (tg == NULL || ts == NULL) return;
    td_pool_config(&pc, t, 32);
    TK_OK(kvc_pool_page_bytes(&pc, &page));
    td_fill(rng, tok, TD_N);
    td_cpu_entries(t, tok, &full, &x, &shrt);
    td_cpu_entries(t == KVC_TYPE_F16 ? KVC_TYPE_Q8_0 : KVC_TYPE_F16, tok, &ofull, &foreign, NULL);
    /* the host tier: the 2-block prefix (its own entry, evicted), then the 4-block one */
    TK_OK(td_load(tg, &full, &got));
    b8 = td_entry(tg, tok, half);
    TK_OK(kvc_radix_evict(tg, 1000, NULL));
    TK_OK(td_load(tg, &b8, &got));
    TK_EQ(got, half);
    TK_OK(kvc_radix_evict(tg, 1000, NULL));
    TK_OK(td_load(tg, &full, &got));
    TK_OK(kvc_radix_evict(tg, 1000, NULL));
    TK_EQ(td_stats(tg).host_blobs, 2);
    TK_EQ(sl_pages(hp), 0);
    r0 = tc_retiring(vp);
    /* argument checks first: nothing changes */
    cmd = begin_cmd();
    TK_EQ(kvc_vk_pool_cmd_fetch(vp, cmd, tg, TD_NS, tok, TD_N, 0, &got), KVC_ERR_INVALID);
    TK_EQ(kvc_vk_pool_cmd_fetch(vp, VK_NULL_HANDLE, tg, TD_NS, tok, TD_N, page, &got), KVC_ERR_NULL);
    TK_EQ(kvc_vk_pool_cmd_fetch(vp, cmd, tg, TD_NS, tok, -1, page, &got), KVC_ERR_INVALID);
    {
        kvc_radix_config rc;
        kvc_radix *bare = NULL;
        kvc_radix_config_init(&rc, KVC_KIND_FULL);
        TK_OK(kvc_radix_create(hp, &rc, &bare));
        TK_EQ(kvc_vk_pool_cmd_fetch(vp, cmd, bare, TD_NS, tok, TD_N, page, &got), KVC_ERR_STATE); /* no tiers */
        if (bare) TK_OK(kvc_radix_destroy(bare));
    }
    /* a cap of three pages: the 4-block blob does not fit, the 2-block one comes */
    TK_OK(kvc_vk_pool_cmd_fetch(vp, cmd, tg, TD_NS, tok, TD_N, 3 * page, &got));
    TK_EQ(got, half);
    TK_CHECK(tc_retiring(vp) > r0); /* the staging, until the copies have run */
    TK_OK(kvc_vk_context_submit_wait(ctx, cmd));
    TK_EQ(tc_retiring(vp), r0);
    TK_CHECK(td_holds(tg, tok, half, &b8)); /* read back off the device: the same bits */
    s = td_stats(tg);
    TK_EQ(s.fetched_host, 1);
    TK_EQ(s.host_blobs, 1); /* the longer one stays for later */
    /* the same cap again: nothing more fits (KVC_ERR_RANGE: a larger cap would), nothing recorded */
    pages = sl_pages(hp);
    cmd = begin_cmd();
    TK_EQ(kvc_vk_pool_cmd_fetch(vp, cmd, tg, TD_NS, tok, TD_N, 3 * page, &got), KVC_ERR_RANGE);
    TK_EQ(got, 0);
    TK_EQ(tc_retiring(vp), r0);
    TK_EQ(sl_pages(hp), pages);
    /* the rest with a cap of four pages */
    TK_OK(kvc_vk_pool_cmd_fetch(vp, cmd, tg, TD_NS, tok, TD_N, 4 * page, &got));
    TK_EQ(got, TD_X);
    TK_OK(kvc_vk_context_submit_wait(ctx, cmd));
    TK_CHECK(td_holds(tg, tok, TD_X, &x));
    TK_CHECK(td_holds(tg, tok, half, &b8));
    TK_EQ(td_stats(tg).host_blobs, 0);
    TK_OK(kvc_radix_lookup(tg, TD_NS, tok, TD_N, &c, &reused));
    TK_EQ(reused, TD_X);
    if (c) TK_OK(kvc_cache_destroy(c));
    TK_OK(kvc_radix_evict(tg, 1000, NULL));
    /* the store: damaged, truncated and foreign files refused, the pool as it was, nothing
       recorded; then the intact one */
    TK_OK(td_load(ts, &full, &got));
    TK_OK(kvc_radix_evict(ts, 1000, NULL)); /* down to the store */
    TK_OK(td_load(ts, &shrt, &got));
    pages = sl_pages(hp);
    td_path(ts, tok, TD_X, path, sizeof(path));
    bad.size = x.size;
    bad.data = (unsigned char *)malloc(x.size);
    cmd = begin_cmd();
    for (i = 0; i < 4 && bad.data; ++i) {
        memcpy(bad.data, x.data, x.size);
        if (i == 0) td_write(path, bad.data, bad.size - 7);
        if (i == 1) { bad.data[bad.size - 40] ^= 0x10; td_write(path, bad.data, bad.size); } /* K/V bits */
        if (i == 2) { bad.data[100] ^= 0x01; td_write(path, bad.data, bad.size); }           /* configuration */
        if (i == 3) td_write(path, foreign.data, foreign.size);
        TK_OK(kvc_vk_pool_cmd_fetch(vp, cmd, ts, TD_NS, tok, TD_N, 1 << 20, &got));
        TK_EQ(got, 0);
        TK_EQ(td_stats(ts).refused, (uint64_t)i + 1);
        TK_EQ(sl_pages(hp), pages);
        TK_EQ(tc_retiring(vp), r0);
    }
    TK_OK(kvc_vk_context_submit_wait(ctx, cmd)); /* nothing in it */
    TK_CHECK(td_holds(ts, tok, TD_SHORT, &shrt));
    td_write(path, x.data, x.size);
    cmd = begin_cmd();
    TK_OK(kvc_vk_pool_cmd_fetch(vp, cmd, ts, TD_NS, tok, TD_N, 1 << 20, &got));
    TK_EQ(got, TD_X);
    TK_OK(kvc_vk_context_submit_wait(ctx, cmd));
    TK_CHECK(td_holds(ts, tok, TD_X, &x));
    TK_EQ(td_stats(ts).fetched_store, 1);
    remove(path);
    TK_OK(kvc_radix_destroy(tg));
    TK_OK(kvc_radix_destroy(ts));
    TK_EQ(sl_pages(hp), 0);
    TK_OK(kvc_vk_pool_destroy(vp));
    free(bad.data); free(full.data); free(x.data); free(shrt.data); free(foreign.data); free(ofull.data); free(b8.data);
}

/* What a recorded fetch brings an entry into: a device pool's tree (vm NULL, one pool) or
   a device memory's (its groups' pools). */
typedef struct tc_target {
    kvc_vk_memory *vm;
    kvc_vk_pool *pools[3];
    int32_t n_pools;
    kvc_radix *t;
} tc_target;
static kvc_result tc_fetch_into(const tc_target *d, VkCommandBuffer cmd, const int32_t *tok, int32_t n,
                                size_t max_staging, int32_t *got) {
    if (d->vm) return kvc_vk_memory_cmd_fetch(d->vm, cmd, d->t, TD_NS, tok, n, max_staging, got);
    return kvc_vk_pool_cmd_fetch(d->pools[0], cmd, d->t, TD_NS, tok, n, max_staging, got);
}
/* whether d's pools hold pages or retiring staging, or its host tier other than one blob */
static int tc_changed(const tc_target *d) {
    int32_t i, changed = td_stats(d->t).host_blobs != 1;
    for (i = 0; i < d->n_pools; ++i) changed |= sl_pages(kvc_vk_pool_host(d->pools[i])) != 0 || tc_retiring(d->pools[i]) != 0;
    return changed;
}

/* Allocations failing in turn during a recorded fetch of tok[0 .. n) into d, on the counted
   context cc: the context's host allocations, vkAllocateMemory (the staging, the page
   buffers' growth: trimmed before each try) and the pools' host allocations. A failed fetch
   returns its error with everything as it was (no page taken, the blob still in the host
   tier, nothing retiring); the next fetch brings the entry (x, xm tokens) back exact. */
static void tc_fail_each(kvc_vk_context *cc, const tc_target *d, const int32_t *tok, int32_t n, int32_t xm,
                         const blob *x) {
    int32_t got = -1, k, phase, i, wrong = 0, changed = 0, failed_calls = 0;
    TK_OK(td_load(d->t, x, &got));
    TK_OK(kvc_radix_evict(d->t, 1000, NULL));
    for (phase = 0; phase < 3; ++phase)
        for (k = 0; k < 400; ++k) {
            VkCommandBuffer cmd;
            kvc_result r;
            int hit;
            TK_OK(kvc_vk_context_begin(cc, &cmd)); /* the device memory back: the fetch grows again */
            for (i = 0; i < d->n_pools; ++i) TK_OK(kvc_vk_pool_cmd_trim(d->pools[i], cmd));
            TK_OK(kvc_vk_context_submit_wait(cc, cmd));
            TK_OK(kvc_vk_context_begin(cc, &cmd));
            if (phase == 0) tc_fail_after = k;
            if (phase == 1) dm_fail_after = k;
            if (phase == 2) td_fail_after = k;
            r = tc_fetch_into(d, cmd, tok, n, 1 << 20, &got);
            hit = (phase == 0 ? tc_fail_after : phase == 1 ? dm_fail_after : td_fail_after) == 0;
            tc_fail_after = dm_fail_after = td_fail_after = -1;
            failed_calls += r != KVC_OK;
            if (r != KVC_OK || got != xm) {
                TK_EQ(got, 0);
                changed += tc_changed(d);
                TK_OK(tc_fetch_into(d, cmd, tok, n, 1 << 20, &got)); /* the pools work */
            }
            TK_EQ(got, xm);
            TK_OK(kvc_vk_context_submit_wait(cc, cmd));
            wrong += !td_holds(d->t, tok, xm, x);
            TK_OK(kvc_radix_evict(d->t, 1000, NULL));
            if (!hit) break; /* every allocation succeeded: each has failed once */
        }
    TK_EQ(wrong, 0);
    TK_EQ(changed, 0);
    TK_CHECK(failed_calls >= 3);
}

/* tc_fail_each on a device pool's tree */
static void tc_failures(tk_rng *rng) {
    int32_t tok[TD_N];
    long live0 = live_allocs;
    kvc_vk_context *cc;
    tc_target d;
    blob full, x;
    td_fill(rng, tok, TD_N);
    td_cpu_entries(KVC_TYPE_F16, tok, &full, &x, NULL);
    if ((cc = td_counted_context()) == NULL) return;
    memset(&d, 0, sizeof(d));
    td_cx = cc;
    d.pools[0] = td_device_pool(KVC_TYPE_F16, 32);
    d.n_pools = 1;
    d.t = td_tree(d.pools[0], 1 << 20, 0);
    td_cx = ctx;
    if (d.t == NULL) return;
    tc_fail_each(cc, &d, tok, TD_N, TD_X, &x);
    TK_OK(kvc_radix_destroy(d.t));
    TK_OK(kvc_vk_pool_destroy(d.pools[0]));
    TK_OK(kvc_vk_context_destroy(cc));
    TK_EQ(dm_bytes, 0);
    TK_EQ(live_allocs, live0);
    free(full.data);
    free(x.data);
}

/* ---- kvc_vk_memory_cmd_fetch: the same for a device memory's tree. A hybrid memory of
   three groups on hy's shapes: layers 0 and 2 RECURRENT, layer 1 ROTATING (window 7, a
   sink, checkpoints), layer 3 FULL. Its entry loads a section into each group's pool; one
   saved with its checkpoints (tm_checkpointed) two into the state pool (the states' KVDT,
   then the checkpoints' CKDT) and two into the sliding group's. A capture that starts
   afresh at the first write after a flush (the pool fetch's first rule) keeps only the
   last group's pages if shared, only each pool's last section if one a pool. */
static void tm_config(kvc_memory_config *mc, kvc_group_config g[3], int32_t map[4], kvc_type t) {
    hy_config(mc, g, map, KVC_KIND_ROTATING, t);
    g[2] = g[1];
    kvc_cache_config_init(&g[2].cache, KVC_KIND_FULL);
    g[1].pool.n_layers = g[2].pool.n_layers = 1;
    map[3] = 2;
    mc->n_groups = 3;
}
/* tok[0 .. xm) as tm_config's CPU memory tree holds it (td_memory_entry's of xm + 2
   tokens); *x8 (may be NULL) its first two blocks */
static blob tm_entry(const kvc_memory_config *mc, const int32_t *tok, int32_t xm, blob *x8) {
    kvc_radix *tc = td_memory_entry(mc, tok, xm + 2);
    blob x = td_entry(tc, tok, xm);
    if (x8) *x8 = td_entry(tc, tok, 2 * TD_PC);
    TK_OK(kvc_radix_destroy(tc));
    return x;
}
static kvc_result tm_save_fn(const void *m, const kvc_io *io) {
    return kvc_memory_save((const kvc_memory *)m, TD_NS, NULL, 0, io);
}
/* the sections tagged tag in blob b */
static int tm_sections(const blob *b, const char *tag) {
    size_t i;
    int n = 0;
    for (i = 0; b->data != NULL && i + 4 <= b->size; ++i) n += memcmp(b->data + i, tag, 4) == 0;
    return n;
}
/* x (a memory tree's entry: its header, ENTN and ETOK, then the memory's save) with the
   memory's save one of tok[0 .. xm) evaluated with its checkpoints: a sound entry the
   format allows (a tree saves none) whose groups load a second section into their pools */
static blob tm_checkpointed(const kvc_memory_config *mc, const int32_t *tok, int32_t xm, const blob *x) {
    kvc_memory *m = NULL;
    blob mb, out = {NULL, 0};
    size_t at = 16;
    TK_OK(kvc_memory_create(mc, &m));
    if (m == NULL || x->data == NULL) return out;
    td_memory_eval(m, tok, xm);
    mb = save_blob(tm_save_fn, m);
    TK_OK(kvc_memory_destroy(m));
    while (at + 16 <= x->size && memcmp(x->data + at, x->data, 12) != 0) at++; /* the save's magic, version */
    TK_CHECK(at + 16 <= x->size);
    out.size = at + mb.size;
    out.data = (unsigned char *)malloc(out.size);
    if (out.data) {
        memcpy(out.data, x->data, at);
        memcpy(out.data + at, mb.data, mb.size);
    }
    free(mb.data);
    return out;
}
/* a tree of mem (a host memory's, or a device memory's host) with tiers (td_tiers) */
static kvc_radix *tm_tree(kvc_memory *mem, size_t host_bytes, int store) {
    kvc_radix_config rc;
    kvc_radix *t = NULL;
    kvc_radix_config_init(&rc, KVC_KIND_FULL);
    TK_OK(kvc_radix_create_memory(mem, &rc, &t));
    return td_tiers(t, host_bytes, store);
}
static void tm_target(tc_target *d, kvc_vk_memory *vm, kvc_radix *t) {
    int32_t g;
    memset(d, 0, sizeof(*d));
    d->vm = vm;
    d->t = t;
    d->n_pools = 3;
    for (g = 0; g < 3; ++g) TK_OK(kvc_vk_memory_pool(vm, g, &d->pools[g]));
}
/* the device tree tg and the CPU tree tc, each serving tok[0 .. xm), looked up: states,
   gathered K/V and attention of the device against the CPU (hy_compare, its queries from
   rng, a copy); last gets the device's attention output of the last layer */
static void tm_decode(hybrid *h, kvc_radix *tc, kvc_radix *tg, const int32_t *tok, int32_t xm, tk_rng rng,
                      float *last) {
    kvc_memory *cm = NULL, *gm = NULL;
    int32_t r0 = -1, r1 = -1;
    TK_OK(kvc_radix_lookup_memory(tc, TD_NS, tok, xm + 1, &cm, &r0));
    TK_OK(kvc_radix_lookup_memory(tg, TD_NS, tok, xm + 1, &gm, &r1));
    TK_EQ(r0, xm);
    TK_EQ(r1, xm);
    if (cm != NULL && gm != NULL) {
        hy_compare(h, cm, gm, &rng);
        memcpy(last, out_buf.mapped, sizeof(float) * 3 * HY_HEADS * HY_GROUP * HY_HD); /* hy_compare's last */
    }
    if (cm != NULL) TK_OK(kvc_memory_destroy(cm));
    if (gm != NULL) TK_OK(kvc_memory_destroy(gm));
}
/* every page of d's pools overwritten on the device (all bits set): a page the fetch does
   not write cannot hold the entry's bytes by chance (from before its eviction) */
static void tm_clobber(const tc_target *d) {
    const kvc_vk_functions *fn = kvc_vk_context_functions(ctx);
    VkCommandBuffer cmd = begin_cmd();
    int32_t i, l;
    for (i = 0; i < d->n_pools; ++i)
        for (l = 0; l < kvc_vk_pool_host(d->pools[i])->cfg.n_layers; ++l) {
            VkBuffer k = VK_NULL_HANDLE, v = VK_NULL_HANDLE;
            TK_OK(kvc_vk_pool_page_buffers(d->pools[i], l, &k, &v));
            if (k != VK_NULL_HANDLE) fn->vkCmdFillBuffer(cmd, k, 0, VK_WHOLE_SIZE, 0xffffffffu);
            if (v != VK_NULL_HANDLE) fn->vkCmdFillBuffer(cmd, v, 0, VK_WHOLE_SIZE, 0xffffffffu);
        }
    TK_OK(kvc_vk_context_submit_wait(ctx, cmd));
}
/* The bad arguments of kvc_vk_memory_cmd_fetch, then a staging cap that takes some pages
   but not the entry's: nothing changes, nothing is recorded. */
static void tm_refusals(const tc_target *d, VkCommandBuffer cmd, kvc_radix *other, const int32_t *tok, int32_t n) {
    kvc_radix_config rc;
    kvc_radix *bare = NULL, *pt = NULL;
    kvc_vk_memory *vm = d->vm;
    int32_t got = -1;
    kvc_radix_config_init(&rc, KVC_KIND_FULL);
    TK_OK(kvc_radix_create_memory(kvc_vk_memory_host(vm), &rc, &bare)); /* no tiers */
    TK_OK(kvc_radix_create(kvc_vk_pool_host(d->pools[2]), &rc, &pt));  /* a pool's tree on a group's pool */
    TK_EQ(kvc_vk_memory_cmd_fetch(NULL, cmd, d->t, TD_NS, tok, n, 1 << 20, &got), KVC_ERR_NULL);
    TK_EQ(kvc_vk_memory_cmd_fetch(vm, VK_NULL_HANDLE, d->t, TD_NS, tok, n, 1 << 20, &got), KVC_ERR_NULL);
    TK_EQ(kvc_vk_memory_cmd_fetch(vm, cmd, NULL, TD_NS, tok, n, 1 << 20, &got), KVC_ERR_NULL);
    TK_EQ(kvc_vk_memory_cmd_fetch(vm, cmd, d->t, TD_NS, tok, n, 1 << 20, NULL), KVC_ERR_NULL);
    TK_EQ(kvc_vk_memory_cmd_fetch(vm, cmd, other, TD_NS, tok, n, 1 << 20, &got), KVC_ERR_FOREIGN);
    TK_EQ(kvc_vk_memory_cmd_fetch(vm, cmd, pt, TD_NS, tok, n, 1 << 20, &got), pt ? KVC_ERR_FOREIGN : KVC_ERR_NULL);
    TK_EQ(kvc_vk_pool_cmd_fetch(d->pools[0], cmd, d->t, TD_NS, tok, n, 1 << 20, &got), KVC_ERR_FOREIGN);
    TK_EQ(kvc_vk_memory_cmd_fetch(vm, cmd, d->t, TD_NS, tok, n, 0, &got), KVC_ERR_INVALID);
    TK_EQ(kvc_vk_memory_cmd_fetch(vm, cmd, d->t, TD_NS, tok, -1, 1 << 20, &got), KVC_ERR_INVALID);
    TK_EQ(kvc_vk_memory_cmd_fetch(vm, cmd, bare, TD_NS, tok, n, 1 << 20, &got), KVC_ERR_STATE);
    TK_EQ(kvc_vk_memory_cmd_fetch(vm, cmd, d->t, TD_NS, tok, n, 256, &got), KVC_ERR_RANGE);
    TK_EQ(got, 0);
    TK_EQ(tc_changed(d), 0);
    if (pt) TK_OK(kvc_radix_destroy(pt));
    if (bare) TK_OK(kvc_radix_destroy(bare));
}

/* The entry down the host tier, then the store, and back by the recorded call each time:
   pages and states read back off the device the same bits; with kernels, decode on it
   the CPU's (hy_compare) and attention the bits it gave before eviction. Then the store's
   file replaced by the entry with its checkpoints: it comes back exact too. */
static void tm_fetch(int kernels, tk_rng *rng) {
    kvc_memory_config mc;
    kvc_group_config g[3];
    int32_t map[4], tok[TD_N + 2], got = -1, from;
    const int32_t xm = 3 * TD_PC;
    static float had[3 * HY_HEADS * HY_GROUP * HY_HD], now[3 * HY_HEADS * HY_GROUP * HY_HD];
    kvc_memory *cm = NULL;
    kvc_radix *tc;
    tk_rng q = *rng;
    tc_target d;
    hybrid h;
    blob x, x8, ck;
    char path[400];
    tm_config(&mc, g, map, KVC_TYPE_F16);
    td_fill(rng, tok, xm + 2);
    x = tm_entry(&mc, tok, xm, &x8);
    ck = tm_checkpointed(&mc, tok, xm, &x);
    TK_EQ(tm_sections(&x, "CKDT"), 0);
    TK_EQ(tm_sections(&ck, "CKDT"), 2); /* the state pool's and the sliding group's second sections */
    memset(&h, 0, sizeof(h));
    TK_OK(kvc_memory_create(&mc, &cm)); /* the CPU's twin: a tree that holds x */
    tc = tm_tree(cm, 0, 0);
    TK_OK(kvc_memory_destroy(cm));
    TK_OK(td_load(tc, &x, &got));
    TK_OK(kvc_vk_memory_create(ctx, &mc, NULL, &h.vm));
    if (h.vm == NULL || x.data == NULL || ck.data == NULL) return;
    tm_target(&d, h.vm, tm_tree(kvc_vk_memory_host(h.vm), 1 << 20, 1));
    TK_OK(td_load(d.t, &x, &got));
    TK_EQ(got, xm);
    if (kernels) tm_decode(&h, tc, d.t, tok, xm, q, had);
    td_path(d.t, tok, xm, path, sizeof(path));
    for (from = 0; from < 3; ++from) { /* the host tier, the store, the store's checkpointed file */
        VkCommandBuffer cmd;
        TK_OK(kvc_radix_evict(d.t, 1000, NULL));
        tm_clobber(&d);
        cmd = begin_cmd();
        if (from > 0) TK_OK(kvc_tier_flush(d.t));
        if (from == 2) td_write(path, ck.data, ck.size);
        TK_EQ(td_stats(d.t).host_blobs, from == 0);
        if (from == 0) tm_refusals(&d, cmd, tc, tok, xm + 2);
        TK_OK(kvc_vk_memory_cmd_fetch(h.vm, cmd, d.t, TD_NS, tok, xm + 2, 1 << 20, &got));
        TK_EQ(got, xm);
        TK_CHECK(tc_retiring(d.pools[0]) > 0); /* group 0's pool retires the staging */
        TK_OK(kvc_vk_context_submit_wait(ctx, cmd));
        TK_CHECK(td_holds(d.t, tok, xm, &x)); /* read back off the device: the same bits */
        if (from == 2) TK_CHECK(td_holds(d.t, tok, 2 * TD_PC, &x8)); /* a checkpoint's state */
        TK_EQ(td_stats(d.t).fetched_host, 1);
        TK_EQ(td_stats(d.t).fetched_store, (uint64_t)from);
        if (kernels && from < 2) { /* (the checkpoints' states take pages: hy_compare's stats would differ) */
            tm_decode(&h, tc, d.t, tok, xm, q, now);
            TK_CHECK(memcmp(had, now, sizeof(had)) == 0);
        }
    }
    TK_EQ(tc_retiring(d.pools[0]), 0);
    TK_EQ(remove(path), 0);
    TK_OK(kvc_radix_destroy(d.t));
    TK_OK(kvc_radix_destroy(tc));
    TK_OK(kvc_vk_memory_destroy(h.vm));
    free(x.data);
    free(x8.data);
    free(ck.data);
}

/* tc_fail_each on a device memory's tree (tm_config's) */
static void tm_failures(tk_rng *rng) {
    kvc_memory_config mc;
    kvc_group_config g[3];
    int32_t map[4], tok[TD_N + 2];
    const int32_t xm = 3 * TD_PC;
    long live0 = live_allocs;
    kvc_vk_context *cc;
    kvc_vk_memory *vm = NULL;
    tc_target d;
    blob x;
    tm_config(&mc, g, map, KVC_TYPE_F16);
    td_fill(rng, tok, xm + 2);
    x = tm_entry(&mc, tok, xm, NULL);
    if ((cc = td_counted_context()) == NULL) return;
    mc.runtime.allocator.alloc = td_alloc;
    mc.runtime.allocator.free = count_free;
    TK_OK(kvc_vk_memory_create(cc, &mc, NULL, &vm));
    if (vm == NULL || x.data == NULL) return;
    tm_target(&d, vm, tm_tree(kvc_vk_memory_host(vm), 1 << 20, 0));
    if (d.t == NULL) return;
    tc_fail_each(cc, &d, tok, xm + 2, xm, &x);
    TK_OK(kvc_radix_destroy(d.t));
    TK_OK(kvc_vk_memory_destroy(vm));
    TK_OK(kvc_vk_context_destroy(cc));
    TK_EQ(dm_bytes, 0);
    TK_EQ(live_allocs, live0);
    free(x.data);
}

/* kernels: whether the append kernel may run (not in the valgrind run of the host side) */
static void test_tiers_device(int kernels, tk_rng *rng) {
    const char *tmp = getenv("TMPDIR");
    snprintf(td_dir, sizeof(td_dir), "%s/kvc_vk_tiers_XXXXXX", tmp != NULL && tmp[0] != '\0' ? tmp : "/tmp");
    if (mkdtemp(td_dir) == NULL) {
        TK_CHECK(!"mkdtemp");
        return;
    }
    td_cx = ctx;
    /* under valgrind (scale < 0.1) one of the three trees, by turns with the seed: each pool
       made compiles its pipelines, which memcheck makes slow (about 10 s a tree) */
    if (tk_scale() >= 0.1 || run_seed % 3 == 0) td_pool_tree(KVC_TYPE_F16, KVC_TYPE_Q8_0, rng);
    if (tk_scale() >= 0.1 || run_seed % 3 == 1) td_pool_tree(KVC_TYPE_Q8_0, KVC_TYPE_F16, rng);
    if (tk_scale() >= 0.1 || run_seed % 3 == 2) td_memory_tree(rng);
    td_alloc_failures(rng);
    td_device_failures(kernels, rng);
    if (kernels) td_pressure(rng);
    /* the recorded fetch (under valgrind one of the three by turns, as above) */
    if (tk_scale() >= 0.1 || run_seed % 3 == 0) tc_fetch(KVC_TYPE_F16, rng);
    if (tk_scale() >= 0.1 || run_seed % 3 == 1) tc_fetch(KVC_TYPE_Q8_0, rng);
    if (tk_scale() >= 0.1 || run_seed % 3 == 2) tc_failures(rng);
    if (tk_scale() >= 0.1 || run_seed % 3 == 0) tm_fetch(kernels, rng);
    if (tk_scale() >= 0.1 || run_seed % 3 == 1) tm_failures(rng);
    TK_CHECK(rmdir(td_dir) == 0); /* every file went */
}

/* kvc_vk_pool_options.prefill_min_queries as a pool resolves it (kvc_vk_pool_prefill_queries):
   the caller's count on f16 pools attn_prefill takes, never where it is negative or the pool
   is quantised, and by default 17 where it runs on the tensor cores, never on a device
   without them (the plain build loses to the decode kernel). */
static void test_prefill_default(void) {
    static const int32_t asked[4] = {0, -1, 8, 200};
    kvc_vk_info in;
    int ti, k, cm, khr;
    kvc_vk_context_info(ctx, &in);
    cm = (in.active_features & KVC_VK_FEATURE_COOPERATIVE_MATRIX) != 0;
    khr = (in.active_features & KVC_VK_FEATURE_KHR_MATRIX) != 0;
    for (ti = 0; ti < 2; ++ti)
        for (k = 0; k < 5; ++k) { /* k 4: no options at all (the default too) */
            kvc_pool_config pc;
            kvc_vk_pool_options o;
            kvc_vk_pool *p;
            int32_t got, want, a = k < 4 ? asked[k] : 0;
            int ok;
            kvc_pool_config_init(&pc);
            pc.n_layers = 1;
            pc.n_kv_heads = 2;
            pc.head_dim_k = pc.head_dim_v = 128;
            pc.type_k = pc.type_v = ti ? KVC_TYPE_Q8_0 : KVC_TYPE_F16;
            pc.page_cells = 16;
            TK_OK(kvc_pool_budget_for_tokens(&pc, 64, &pc.budget_bytes));
            memset(&o, 0, sizeof(o));
            o.prefill_min_queries = a;
            TK_OK(kvc_vk_pool_create(ctx, &pc, k < 4 ? &o : NULL, &p));
            got = kvc_vk_pool_prefill_queries(p);
            want = ti || a < 0 ? 0 : a > 0 ? a : khr ? 12 : cm ? 17 : 0;
            /* (by default also 0 on tensor cores without attn_prefill's 16 x 16 x 16 shape, and
               17 where the typed matrices' layout check failed) */
            ok = got == want || (a == 0 && !ti && cm && (got == 0 || (khr && got == 17)));
            if (!ok)
                fprintf(stderr, "prefill_min_queries %d (%s) on %s: %d, not %d\n", a, k < 4 ? "options" : "none",
                        ti ? "q8_0" : "f16", got, want);
            TK_CHECK(ok);
            TK_OK(kvc_vk_pool_destroy(p));
        }
    TK_EQ(kvc_vk_pool_prefill_queries(NULL), 0);
}

/* Prefill (attn_prefill, kvc_vk_pool_options.prefill_min_queries = 8: calls of at least 8
   queries a cache on f16 pools): batches of
   8-150 queries against the scalar CPU path, each call the batch's own queries (causal, by
   their positions; now and then a window or non-causal), with the variants of
   compare_attention (sinks, soft-cap, lse, poisoned query rows). FULL, ROTATING (a window
   shorter than the batch, sinks) and CAUSAL (up to three sequences in one batch, in runs or
   interleaved: the tiles of queries break where the sequence changes); GQA groups 1-8, head
   dims 8-128 in steps of 8 (the tensor-core build: multiples of 16), several splits. Now and
   then a batch follows one of 32 k + 30 tokens: its first tile's first query then sees 31
   cells more than a whole number of tiles, where one cell too many in the tile records'
   "cells every query sees" (kvc_vk__prefill_seen_by_all) shows as a cell seen too soon. */
static void test_prefill(tk_rng *rng) {
    static const int32_t dims[] = {8, 16, 24, 32, 48, 64, 96, 128};
    /* (lavapipe below scale 1: half as many, each pool's pipelines being what costs) */
    int ep, n_ep = (int)((cpu_device && tk_scale() < 1 ? 6 : 12) * tk_scale());
    if (n_ep < 3) n_ep = 3;
    for (ep = 0; ep < n_ep; ++ep) {
        shape sh;
        side s[2];
        int before = tk_failed, step, i, small, lead = tk_pct(rng, 50);
        int32_t next[3] = {0, 0, 0}, groups = ctx->pf_groups, rows_min = ctx->pf_rows_min;
        memset(&sh, 0, sizeof(sh));
        sh.kind = (kvc_kind)(ep % 3);
        /* every other episode (the second among them) in one split: its calls write the output
           from attn_prefill, without the merge pass (kvc_vk_context.pf_groups) */
        if (ep % 2 == 1) ctx->pf_groups = 1;
        /* every fourth (the first among them): calls of several splits merge on attn_merge_rows
           whatever their rows (kvc_vk_context.pf_rows_min) */
        if (ep % 4 == 0) ctx->pf_rows_min = 1;
        sh.tk = sh.tv = KVC_TYPE_F16;
        sh.prefill = 1;
        sh.layers = 1;
        sh.kv_heads = tk_int(rng, 1, 3);
        /* lavapipe below scale 1: groups up to 2, head dims 8 and 16 (its plain attn_prefill
           pipeline took 54-78 s to make for groups 6-7 at head dim 48, 4-25 s for groups 1-4;
           GPUs and full-scale runs take every shape) */
        small = cpu_device && tk_scale() < 1;
        sh.group = tk_int(rng, 1, small ? 2 : 8);
        sh.hdk = dims[tk_int(rng, 0, small ? 1 : 7)];
        sh.hdv = tk_pct(rng, 50) ? sh.hdk : dims[tk_int(rng, 0, small ? 1 : 7)];
        sh.page_cells = 8 * tk_int(rng, 1, 4);
        sh.no_subgroup = tk_pct(rng, 30);
        if (sh.kind == KVC_KIND_ROTATING) { sh.window = tk_int(rng, 10, 120); sh.sinks = tk_int(rng, 0, 3); }
        if (ep % 4 == 2) { /* values stored rotated: attn_merge rotates them back, every split count */
            int32_t nb;
            if (kvc_rotation_block(sh.hdv, &nb) == KVC_OK) sh.rotate = KVC_ROTATE_V;
        }
        make_sides(s, &sh);
        for (step = 0; step < 3; ++step) {
            int32_t n, pos[48], seq[48];
            kvc_result r0, r1;
            if (sh.kind == KVC_KIND_CAUSAL) { /* up to 48 cells: one batch of 8-42 tokens in up to 3
                                                 sequences, or (lead) 30 of one then 8-18 more */
                int runs = tk_pct(rng, 50) || lead, n_seq = lead ? 1 : tk_int(rng, 1, 3);
                kvc_batch b;
                if (step > (lead ? 1 : 0)) break;
                n = !lead ? tk_int(rng, 8, 42) : step == 0 ? 30 : tk_int(rng, 8, 18);
                for (i = 0; i < n; ++i) {
                    seq[i] = runs ? i * n_seq / n : tk_int(rng, 0, n_seq - 1);
                    pos[i] = next[seq[i]]++;
                }
                memset(&b, 0, sizeof(b));
                b.n_tokens = n; b.pos = pos; b.seq = seq;
                r0 = kvc_begin_batch(s[0].cache, &b);
                r1 = kvc_begin_batch(s[1].cache, &b);
            } else {
                n = lead && step == 0 ? 30 + 32 * tk_int(rng, 0, 3) : tk_int(rng, 8, 150);
                r0 = kvc_begin(s[0].cache, n, NULL, 0);
                r1 = kvc_begin(s[1].cache, n, NULL, 0);
            }
            TK_EQ(r0, r1);
            if (r0 != KVC_OK) continue;
            put_both(s, &sh, n, rng);
            compare_attention(s, &sh, 0, n, NULL, NULL, tk_pct(rng, 25) ? tk_int(rng, 1, 40) : 0,
                              sh.kind != KVC_KIND_CAUSAL && tk_pct(rng, 15), rng);
        }
        if (tk_failed != before)
            fprintf(stderr, "prefill %d failed: kind %d kv %d group %d dims %d/%d page %d window %d sinks %d%s%s%s%s\n", ep,
                    (int)sh.kind, sh.kv_heads, sh.group, sh.hdk, sh.hdv, sh.page_cells, sh.window, sh.sinks,
                    sh.no_subgroup ? " no-subgroup" : "", ctx->pf_groups == 1 ? " one-split" : "",
                    sh.rotate ? " rotated-v" : "", ctx->pf_rows_min == 1 ? " merge-rows" : "");
        ctx->pf_groups = groups;
        ctx->pf_rows_min = rows_min;
        free_sides(s);
    }
}

static kvc_type pick_type(tk_rng *rng) {
    kvc_type t = (kvc_type)tk_int(rng, 0, types_avail - 1);
    const char *force = getenv("KVC_VK_TYPE"); /* e.g. f16: every K and V of that type */
    int i;
    for (i = 0; force && i < types_avail; ++i)
        if (strcmp(force, kvc_type_name((kvc_type)i)) == 0) t = (kvc_type)i;
    return t;
}

int main(int argc, char **argv) {
    kvc_vk_device_options o;
    kvc_vk_info info;
    tk_rng rng;
    int ep, n_ep, parts = getenv("KVC_VK_PART") ? atoi(getenv("KVC_VK_PART")) : 7;
    g_seed = run_seed = argc > 1 ? strtoull(argv[1], NULL, 10) : (uint64_t)time(NULL);
    if (kvc_vk_loader_open(&loader) != KVC_OK) { printf("skip: no Vulkan loader (libvulkan)\n"); return tk_report("vk"); }
    memset(&o, 0, sizeof(o));
    o.get_instance_proc_addr = loader.get_instance_proc_addr;
    /* KVC_VK_VALIDATION=0: tests/run.sh's ASan run, whose calls the native run of the same seed
       makes with the layers on (under ASan they took 46 of test_vk's 124 s CPU) */
    o.validation = !(getenv("KVC_VK_VALIDATION") && strcmp(getenv("KVC_VK_VALIDATION"), "0") == 0);
    o.allocator.alloc = count_alloc;
    o.allocator.free = count_free;
    o.device_index = getenv("KVC_VK_DEVICE") ? atoi(getenv("KVC_VK_DEVICE")) : -1;
    if (getenv("KVC_VK_BOUNDS_CHECKS")) o.disable_features |= KVC_VK_FEATURE_PIPELINE_ROBUSTNESS; /* the driver's checks stay on */
    if (kvc_vk_device_create(&o, &ctx) != KVC_OK) {
        printf("skip: no Vulkan device with compute and VK_KHR_push_descriptor\n");
        kvc_vk_loader_close(&loader);
        return tk_report("vk");
    }
    kvc_vk_context_info(ctx, &info);
    types_avail = (int)KVC_TYPE_COUNT;
    cpu_device = info.device_type == VK_PHYSICAL_DEVICE_TYPE_CPU;
    printf("device %s, subgroup %u (arithmetic %d), cooperative matrix %d (8-bit %d, KHR %d), bounds checks off %d, integer dot %d, validation %s; seed %llu (test_vk %llu replays it)\n",
           info.device_name, info.subgroup_size, info.subgroup_arithmetic,
           (info.active_features & KVC_VK_FEATURE_COOPERATIVE_MATRIX) != 0,
           (info.active_features & KVC_VK_FEATURE_INT8_MATRIX) != 0,
           (info.active_features & KVC_VK_FEATURE_KHR_MATRIX) != 0,
           (info.active_features & KVC_VK_FEATURE_PIPELINE_ROBUSTNESS) != 0,
           (info.active_features & KVC_VK_FEATURE_INTEGER_DOT_PRODUCT) != 0,
           info.validation ? "on" : o.validation ? "NOT INSTALLED" : "off (KVC_VK_VALIDATION=0)",
           (unsigned long long)g_seed, (unsigned long long)g_seed);
    rng.s = run_seed ^ 0x5bd1e995ull;
    if (getenv("KVC_VK_SAVELOAD_ONLY")) { /* tests/run.sh: the saves and loads of a build with
                                             small KVCACHE_IO_CHUNK (many pipelined chunks) */
        test_saveload();
        test_tiers_device(1, &rng);
        parts = 0;
    }
    if (getenv("KVC_VK_TIERS_ONLY")) {
        test_tiers_device(atoi(getenv("KVC_VK_TIERS_ONLY")) != 2, &rng);
        parts = 0;
    }
    if (getenv("KVC_VK_PREFILL_ONLY")) {
        test_prefill_default();
        test_prefill(&rng);
        parts = 0;
    }
    if (getenv("KVC_VK_HOST_ONLY")) { /* tests/run.sh under valgrind: the backend's host side
                                         (argument checks, saves and loads through the staging
                                         halves); the kernels' pipelines, whose compiling under
                                         memcheck took over 10 minutes, run natively and under ASan */
        test_errors();
        test_state_errors();
        test_saveload();
        test_tiers_device(0, &rng);
        parts = 0;
    }
    if (parts & 1) {
        test_errors();
        test_page_roundtrip(&rng);
        test_rotated_decode(&rng);
        test_decode_splits(&rng);
        test_nonfinite_kv(&rng);
        test_prefill_default();
        test_prefill(&rng);
        test_state_errors();
        test_saveload();
        test_tiers_device(1, &rng);
        test_device_memory();
    }
    n_ep = parts & 2 ? (int)(24 * tk_scale()) : 0;
    if ((parts & 2) && n_ep < 3) n_ep = 3;
    for (ep = 0; ep < n_ep; ++ep) {
        shape sh;
        if (getenv("KVC_VK_EPISODE") && atoi(getenv("KVC_VK_EPISODE")) != ep) continue;
        if (getenv("KVC_VK_FROM") && ep < atoi(getenv("KVC_VK_FROM"))) continue;
        static const int32_t dims[] = {8, 16, 32, 64, 128, 96}; /* 96: a block-diagonal rotation (3 x 32) */
        uint64_t es = run_seed * 1000003ull + (uint64_t)ep;
        rng.s = es ^ 0x9e3779b97f4a7c15ull;
        memset(&sh, 0, sizeof(sh));
        sh.kind = (kvc_kind)(ep % 3);
        sh.tk = pick_type(&rng);
        sh.tv = pick_type(&rng);
        sh.layers = tk_int(&rng, 1, 2);
        sh.kv_heads = tk_int(&rng, 1, 3);
        sh.group = tk_int(&rng, 1, 4);
        sh.hdk = dims[tk_int(&rng, 0, 5)];
        sh.hdv = tk_int(&rng, 0, 1) ? sh.hdk : dims[tk_int(&rng, 0, 5)];
        if (ep % 4 == 1) { /* a shape of the planar layout (attn_split_q, attn_split_cm's QUANT builds) */
            if (!getenv("KVC_VK_TYPE")) {
                sh.tk = (kvc_type)tk_int(&rng, 3, 4);
                sh.tv = (kvc_type)tk_int(&rng, 3, 4);
            }
            sh.hdk = sh.hdv = 64 << tk_int(&rng, 0, 2);
            sh.group = tk_int(&rng, 1, 6); /* more than 4: two workgroups a kv head */
        }
        sh.host_layout = tk_pct(&rng, 25);
        /* subnormal block scales, by turns through unpackHalf2x16 (where the context's check
           passed) and through integer operations */
        sh.tiny = ep % 4 == 2;
        sh.halves_off = sh.tiny && (ep / 4) % 2 == 1;
        sh.long_tiles = ep % 2 == 1;
        sh.wide = ep % 4 == 1; /* (the planar QUANT episodes among them) */
        if (sh.tiny && !getenv("KVC_VK_TYPE")) sh.tv = (kvc_type)tk_int(&rng, 3, 4);
        if ((int)sh.tk >= 3 && sh.hdk < 32) sh.hdk = 32 * tk_int(&rng, 1, 4);
        if ((int)sh.tv >= 3 && sh.hdv < 32) sh.hdv = 32 * tk_int(&rng, 1, 4);
        /* the backend needs rows of 4-byte multiples: an even number of q8_0/q4_0 blocks */
        if (((int)sh.tk >= 3 && (sh.kv_heads * sh.hdk / 32) % 2) || ((int)sh.tv >= 3 && (sh.kv_heads * sh.hdv / 32) % 2))
            sh.kv_heads = 2;
        sh.page_cells = tk_int(&rng, 1, 3) * 4;
        sh.no_subgroup = (ep / 3) % 2;
        /* (and the QUANT build's f16 keys instead of its 8-bit ones, where the device has them) */
        sh.disable_features = ep % 5 == 4 ? KVC_VK_FEATURE_INTEGER_DOT_PRODUCT : ep % 5 == 2 ? KVC_VK_FEATURE_INT8_MATRIX : 0u;
        /* (and attn_prefill on VK_NV_cooperative_matrix where the KHR typed matrices are there) */
        if (ep % 3 == 1) sh.disable_features |= KVC_VK_FEATURE_KHR_MATRIX;
        /* rotated storage: none, K, V, both, by turns from a seeded start (every 12 episodes
           each with every cache kind; a short run still gets some), where the head dims take
           it (kvc_rotation_block) */
        sh.rotate = (uint32_t)((ep + run_seed) % 4);
        {
            int32_t nb;
            if (kvc_rotation_block(sh.hdk, &nb) != KVC_OK) sh.rotate &= ~KVC_ROTATE_K;
            if (kvc_rotation_block(sh.hdv, &nb) != KVC_OK) sh.rotate &= ~KVC_ROTATE_V;
        }
        if (ep % 8 == 1) { /* planar pages, values not rotated: attn_split_cm's QUANT build where
                               the device has cooperative matrices, even in a short run */
            sh.host_layout = 0;
            sh.rotate &= ~KVC_ROTATE_V;
        }
        sh.extreme = ep % 8 == 5;
        /* a planar shape and a random one; keys 8 times larger a tile of attn_split_q (4096 /
           head dim cells; 64 below head dim 64) */
        if (ep % 8 == 1 || ep % 8 == 2) sh.growing = (sh.hdk >= 64 ? 4096.0f / (float)sh.hdk : 64.0f) / 3.0f;
        if (sh.extreme) { /* on planar q4_0 keys, unrotated: attn_split_q's packed sums */
            sh.tk = KVC_TYPE_Q4_0;
            sh.host_layout = 0;
            sh.rotate &= ~KVC_ROTATE_K;
            if (sh.hdk < 32) sh.hdk = sh.hdv = 64;
            if ((sh.kv_heads * sh.hdk / 32) % 2) sh.kv_heads = 2;
        }
        if (sh.kind == KVC_KIND_ROTATING) { sh.window = tk_int(&rng, 2, 20); sh.sinks = tk_int(&rng, 0, sh.window - 1) % 3; }
        g_seed = es;
        {
            int before = tk_failed, halves = ctx->halves;
            int32_t spread = ctx->cm_spread;
            int wide = ctx->cm_wide;
            int steps = tk_scale() < 0.1 ? 12 : 30; /* valgrind's run: fewer, each costs */
            if (sh.halves_off) ctx->halves = KVC_VK__HALVES_PROBED; /* (pools made from now on) */
            if (sh.long_tiles) ctx->cm_spread = 1; /* (read by every call) */
            if (sh.wide) ctx->cm_wide = 1;
            if (sh.kind == KVC_KIND_CAUSAL) episode_causal(&sh, &rng, steps);
            else episode_linear(&sh, &rng, steps);
            if (sh.halves_off) ctx->halves = halves;
            ctx->cm_spread = spread;
            ctx->cm_wide = wide;
            if (tk_failed != before)
                fprintf(stderr, "episode %d failed: kind %d types %s/%s layers %d kv %d group %d dims %d/%d page %d rotate %u%s%s%s%s%s%s%s%s%s%s\n",
                        ep, (int)sh.kind, kvc_type_name(sh.tk), kvc_type_name(sh.tv), sh.layers, sh.kv_heads, sh.group,
                        sh.hdk, sh.hdv, sh.page_cells, sh.rotate, sh.no_subgroup ? " no-subgroup" : "",
                        sh.disable_features & KVC_VK_FEATURE_INTEGER_DOT_PRODUCT ? " no-integer-dot" : "",
                        sh.disable_features & KVC_VK_FEATURE_INT8_MATRIX ? " no-int8-matrix" : "",
                        sh.disable_features & KVC_VK_FEATURE_KHR_MATRIX ? " no-khr-matrix" : "",
                        sh.host_layout ? " host-layout" : "", sh.extreme ? " extreme" : "",
                        sh.growing > 0 ? " growing" : "", sh.tiny ? (sh.halves_off ? " tiny halves-off" : " tiny") : "",
                        sh.long_tiles ? " long-tiles" : "", sh.wide ? " wide" : "");
        }
        g_seed = run_seed;
    }
    /* hybrid models: FULL beside RECURRENT, then ROTATING beside RECURRENT (with
       KVC_VK_EPISODE=e, the one of index e % 2) */
    for (ep = 0; ep < ((parts & 4) ? 2 : 0); ++ep) {
        int before = tk_failed, steps = (int)(40 * tk_scale());
        kvc_type t;
        if (getenv("KVC_VK_EPISODE") && atoi(getenv("KVC_VK_EPISODE")) % 2 != ep) continue;
        rng.s = (run_seed * 1000003ull + 7777ull + (uint64_t)ep) ^ 0x9e3779b97f4a7c15ull;
        t = tk_int(&rng, 0, 1) ? KVC_TYPE_F16 : KVC_TYPE_F32;
        episode_hybrid(ep ? KVC_KIND_ROTATING : KVC_KIND_FULL, t, &rng, steps < 10 ? 10 : steps);
        if (tk_failed != before) fprintf(stderr, "hybrid episode %d failed (%s K/V)\n", ep, kvc_type_name(t));
    }
    if (parts & 4) printf("memory-tree entries saved and loaded on the device: %d of 2\n", g_tree_saved);
    printf("f16 subnormals through unpackHalf2x16: %s\n", !ctx->halves ? "not checked" : ctx->halves & KVC_VK__HALF_EXACT ? "exact" : "not exact");
    kvc_vk_buffer_destroy(ctx, &in_buf);
    kvc_vk_buffer_destroy(ctx, &q_buf);
    kvc_vk_buffer_destroy(ctx, &out_buf);
    kvc_vk_buffer_destroy(ctx, &gk_buf);
    kvc_vk_buffer_destroy(ctx, &gv_buf);
    kvc_vk_context_info(ctx, &info);
    if (info.validation_messages) fprintf(stderr, "validation: %u messages, last: %s\n", info.validation_messages, info.last_message);
    TK_EQ(info.validation_messages, 0);
    TK_OK(kvc_vk_context_destroy(ctx));
    TK_EQ(live_allocs, 0);
    /* the loader goes too: under valgrind nothing of ours is then left reachable at exit
       (the driver's LLVM stays mapped with its state: tests/valgrind-vk.supp) */
    TK_OK(kvc_vk_loader_close(&loader));
    return tk_report("vk");
}
#endif
