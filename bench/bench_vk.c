/* bench_vk.c - Vulkan decode attention over the cache, next to a plain Vulkan copy kernel.

   Decode: 32 query heads / 8 kv heads, head dim 128 (--hd 64 or 256: others), one query token
   per sequence, `batch` sequences (each a FULL cache of `cells` tokens, one
   kvc_vk_cmd_attention_batch call), storage f16 and q8_0. Times come from GPU timestamps
   around `reps` calls recorded back to back (each call: split-K pass, barrier, merge pass),
   medians of 5 such runs. GB/s counts the K+V bytes the call must read (the stored bytes). The copy
   kernel (kvc_vk_cmd_copy, 1 GiB -> 1 GiB) gives the device's bandwidth, read + write
   counted, as the yardstick; the call floor (a barrier and a dispatch that copies 256 bytes,
   as each call begins) what any call costs before its work. One query head group of sequence 0 is checked
   against a double-precision reference on the host.
   A type written NAME+rot (q8_0+rot, q4_0+rot) stores K and V rotated (kvc_pool_config.rotate =
   KVC_ROTATE_K | KVC_ROTATE_V): the split pass then rotates q as it loads it and the merge
   rotates the output back (no passes of their own); its row against the plain one's is what
   the rotation costs. --causal: CAUSAL caches (the mask reads each cell's sequence and
   position words) instead of FULL ones, and a `step host (us)` column, the CPU time to record
   a call after each cache lost its last cell (a decode step's first layer); the prefill rows
   then run over a CAUSAL cache too. The queries and outputs are device-local buffers, as an
   engine's (and bench_vk_sdpa.py's) are; --host-io puts them in host-visible memory instead.

   No Vulkan loader or device: prints a skip and exits 0 (make bench runs it everywhere).
   A CPU device (VkPhysicalDeviceProperties.deviceType CPU, e.g. lavapipe) runs the default
   sizes for hours: there, unless --cells, --batch or --reps says otherwise, it runs the
   --quick shape and says so.
   usage: bench_vk [--cells 4096,32768,131072] [--batch 1,8] [--types f16,q8_0,q8_0+rot] [--reps 50]
                   [--splits n (max split-K chunks)] [--hd 128] [--no-copy] [--quick] [--help]
          --quick: 4096 cells, batch 1, 2 reps, a 64 MiB copy (seconds on a GPU, ~a minute on lavapipe)
   bench/bench_vk.sh runs it with PyTorch's scaled_dot_product_attention beside it. */
#define _POSIX_C_SOURCE 199309L /* clock_gettime */
#define KVCACHE_IMPLEMENTATION
#include "kvcache.h"
#include "bench_util.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <time.h>

#if defined(__has_include)
#if __has_include(<vulkan/vulkan.h>)
#define HAVE_VK 1
#endif
#endif

#ifndef HAVE_VK
int main(void) {
    printf("bench_vk: skipped (no Vulkan headers)\n");
    return 0;
}
#else
#define VK_NO_PROTOTYPES
#define KVCACHE_VK_IMPLEMENTATION
#define KVCACHE_VK_HELPERS /* the loader, a device of its own, buffers, transfers, the copy kernel */
#include "kvcache_vk.h"

#define HQ 32
#define HKV 8
#define HD_MAX 256
#define CHUNK 8192 /* tokens appended per call while filling */

static int g_hd = 128; /* head dim of K and V (--hd) */
/* --host-io: the queries and outputs in host-visible memory (what the GPU reads and writes
   through PCIe on a discrete card) instead of device-local buffers. An engine's queries come
   from its own GPU matmuls, and bench_vk_sdpa.py's tensors live on the device, so device-local
   is the default; until 2026-11-29 (issue 37, round 19) every row used host memory. */
static int g_host_io = 0;

static kvc_vk_context *ctx;
static const kvc_vk_functions *fn;
static kvc_vk_info info;

static void die(const char *what, kvc_result r) {
    fprintf(stderr, "bench_vk: %s: %s\n", what, kvc_strerror(r));
    exit(1);
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static float frand(void) {
    rng_state ^= rng_state << 13; rng_state ^= rng_state >> 7; rng_state ^= rng_state << 17;
    return (float)((double)(rng_state >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* GPU time of `reps` repetitions of record() in one command buffer, µs per repetition;
   g_host_us: the host's time to record one repetition (the CPU cost of a call, which a
   GPU timestamp does not show) */
typedef void (*record_fn)(VkCommandBuffer cmd, void *user);
static double g_host_us;
static double time_once(VkQueryPool qp, record_fn record, void *user, int reps) {
    VkCommandBuffer cmd;
    uint64_t ts[2];
    double h0;
    int i;
    CHECK(kvc_vk_context_begin(ctx, &cmd));
    fn->vkCmdResetQueryPool(cmd, qp, 0, 2);
    fn->vkCmdWriteTimestamp(cmd, VK_PIPELINE_STAGE_ALL_COMMANDS_BIT, qp, 0);
    h0 = now();
    for (i = 0; i < reps; ++i) record(cmd, user);
    g_host_us = (now() - h0) * 1e6 / reps;
    fn->vkCmdWriteTimestamp(cmd, VK_PIPELINE_STAGE_ALL_COMMANDS_BIT, qp, 1);
    CHECK(kvc_vk_context_submit_wait(ctx, cmd));
    fn->vkGetQueryPoolResults(info.device, qp, 0, 2, sizeof(ts), ts, 8, VK_QUERY_RESULT_64_BIT | VK_QUERY_RESULT_WAIT_BIT);
    return (double)(ts[1] - ts[0]) * info.timestamp_period / 1000.0 / reps;
}

/* GPU time of `reps` repetitions of record(), µs per repetition, median of 5 runs. The GPU
   lowers its SM clock after about 2 s without work (filling a cache, the f64 check of the
   last row, probably building a new pool's pipelines): on an H200 nvidia-smi read 390-510 MHz
   instead of 1980 MHz, and it took 0.3-0.5 s of work to climb back, through plateaus.
   Rows of a few milliseconds timed in that window measured up to 4x slower (q8_0 batch 1
   at 4k cells, the first row after f16 batch 8 at 128k: 128 instead of 34 us), five
   agreeing runs and all; three calls as warm-up, 0.5 s of 50-call submissions, and 0.5 s
   counted from before the pipelines were built were each not enough. So, after a first
   run (pipelines, metadata uploads), the warm-up keeps the GPU busy with submissions of
   about 20 ms for at least 1 s and until two agree within 2 % (at most 3 s); a CPU device
   (lavapipe) gets the first run only. *spread = slowest / fastest run. */
static double g_wall0;
static double time_gpu(record_fn record, void *user, int reps, double *spread) {
    VkQueryPoolCreateInfo qi;
    VkQueryPool qp;
    double t[5], h[5], t0, last, cur;
    int run;
    memset(&qi, 0, sizeof(qi));
    qi.sType = VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO;
    qi.queryType = VK_QUERY_TYPE_TIMESTAMP;
    qi.queryCount = 2;
    if (fn->vkCreateQueryPool(info.device, &qi, NULL, &qp) != VK_SUCCESS) die("vkCreateQueryPool", KVC_ERR_UNSUPPORTED);
    last = cur = time_once(qp, record, user, 3);
    t0 = now();
    while (info.device_type != VK_PHYSICAL_DEVICE_TYPE_CPU) {
        double el;
        int n = (int)(20000.0 / (last > 1.0 ? last : 1.0));
        cur = time_once(qp, record, user, n < reps ? reps : n > 20000 ? 20000 : n);
        el = now() - t0;
        if (el > 3.0 || (el >= 1.0 && fabs(cur - last) <= 0.02 * last)) break;
        last = cur;
    }
    if (getenv("BENCH_VK_WALL")) fprintf(stderr, "  warm-up %.3f-%.3f s, last %.1f us\n", t0 - g_wall0, now() - g_wall0, cur);
    for (run = 0; run < 5; ++run) {
        t[run] = time_once(qp, record, user, reps);
        h[run] = g_host_us;
    }
    fn->vkDestroyQueryPool(info.device, qp, NULL);
    if (getenv("BENCH_VK_WALL")) fprintf(stderr, "  runs until %.3f s: %.1f %.1f %.1f %.1f %.1f\n", now() - g_wall0, t[0], t[1], t[2], t[3], t[4]);
    qsort(t, 5, sizeof(double), cmp_double);
    qsort(h, 5, sizeof(double), cmp_double);
    g_host_us = h[2];
    if (spread) *spread = t[4] / t[0];
    return t[2];
}

/* the driver's statistics of the attention pipelines (registers, spills, binary size: what
   tools/nv_sass.py needs), if it reports them: the split and merge passes', or with `prefill`
   attn_prefill's */
static void print_stats(const kvc_vk_pool *p, int prefill) {
    PFN_vkGetPipelineExecutablePropertiesKHR props = (PFN_vkGetPipelineExecutablePropertiesKHR)fn->vkGetDeviceProcAddr(
        info.device, "vkGetPipelineExecutablePropertiesKHR");
    PFN_vkGetPipelineExecutableStatisticsKHR stats = (PFN_vkGetPipelineExecutableStatisticsKHR)fn->vkGetDeviceProcAddr(
        info.device, "vkGetPipelineExecutableStatisticsKHR");
    /* every split (or prefill) pipeline the pool made so far, with its key (attn_split_cm's
       builds: KVC_VK__KEY_QCM, subgroups a workgroup << 17, FUSED << 16, the GQA group), then
       its first merge pipeline */
    VkPipeline pipes[KVC_VK__MAX_VARIANTS + 1];
    uint32_t keys[KVC_VK__MAX_VARIANTS + 1];
    const kvc_vk__variant *tab = prefill ? p->prefill_pipes : p->split;
    int k, n_pipes = 0;
    if (!props || !stats || !p->ctx->stats) return;
    for (k = 0; k < KVC_VK__MAX_VARIANTS && tab[k].pipe; ++k) {
        keys[n_pipes] = tab[k].key;
        pipes[n_pipes++] = tab[k].pipe;
    }
    keys[n_pipes] = p->merge[0].key;
    pipes[n_pipes++] = p->merge[0].pipe;
    for (k = 0; k < n_pipes; ++k) {
        VkPipelineInfoKHR pi;
        VkPipelineExecutableInfoKHR ei;
        VkPipelineExecutableStatisticKHR st[32];
        uint32_t n = 32, i;
        memset(&pi, 0, sizeof(pi));
        pi.sType = VK_STRUCTURE_TYPE_PIPELINE_INFO_KHR;
        pi.pipeline = pipes[k];
        memset(&ei, 0, sizeof(ei));
        ei.sType = VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_INFO_KHR;
        ei.pipeline = pipes[k];
        for (i = 0; i < 32; ++i) { memset(&st[i], 0, sizeof(st[i])); st[i].sType = VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_STATISTIC_KHR; }
        if (pipes[k] == VK_NULL_HANDLE || stats(info.device, &ei, &n, st) < 0) continue;
        printf("  %s pipeline (key 0x%x):", k == n_pipes - 1 ? "merge" : prefill ? "prefill" : "split", keys[k]);
        for (i = 0; i < n; ++i) {
            if (st[i].format == VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_UINT64_KHR)
                printf(" %s=%llu", st[i].name, (unsigned long long)st[i].value.u64);
            else if (st[i].format == VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_INT64_KHR)
                printf(" %s=%lld", st[i].name, (long long)st[i].value.i64);
        }
        printf("\n");
    }
}

typedef struct copy_job { kvc_vk_pool *pool; VkBuffer a, b; VkDeviceSize bytes; } copy_job;
static void record_copy(VkCommandBuffer cmd, void *user) {
    copy_job *j = (copy_job *)user;
    CHECK(kvc_vk_cmd_copy(j->pool, cmd, j->a, j->b, j->bytes));
}

/* the floor of a call: the barrier every attention call records first (kvc_vk_pool_cmd_sync),
   then one dispatch that does almost nothing (a 256-byte copy) */
static void record_floor(VkCommandBuffer cmd, void *user) {
    copy_job *j = (copy_job *)user;
    CHECK(kvc_vk_pool_cmd_sync(j->pool, cmd));
    CHECK(kvc_vk_cmd_copy(j->pool, cmd, j->a, j->b, j->bytes));
}

typedef struct attn_job { kvc_vk_pool *pool; kvc_vk_attention_item *items; int32_t n; } attn_job;
static void record_attn(VkCommandBuffer cmd, void *user) {
    attn_job *j = (attn_job *)user;
    CHECK(kvc_vk_cmd_attention_batch(j->pool, cmd, 0, j->items, j->n));
}

/* CAUSAL: the host's time to record a call after each cache lost its last cell (a step's
   first layer, which finds one changed cell a cache), median of 21; the caches end 21
   tokens shorter */
static double step_host_us(attn_job *j, kvc_cache **caches) {
    double t[21], h0;
    int32_t i, s, lo, hi;
    VkCommandBuffer cmd;
    CHECK(kvc_vk_context_begin(ctx, &cmd));
    for (i = 0; i < 21; ++i) {
        for (s = 0; s < j->n; ++s) {
            CHECK(kvc_seq_pos_range(caches[s], 0, &lo, &hi));
            CHECK(kvc_seq_remove(caches[s], 0, hi, hi + 1));
        }
        h0 = now();
        record_attn(cmd, j);
        t[i] = (now() - h0) * 1e6;
    }
    CHECK(kvc_vk_context_submit_wait(ctx, cmd));
    qsort(t, 21, sizeof(double), cmp_double);
    return t[10];
}

/* one stored row of g_hd (head dim) values as attention sees it: quantised (rotated first, and
   back after, where the storage is rotated) */
static void stored(const kvc__type_info *ti, int rot, const float *x, float *y) {
    unsigned char row[HD_MAX * 4];
    float t[HD_MAX];
    memcpy(t, x, sizeof(t));
    if (rot) kvc_rotate_rows(t, g_hd, 1, 0);
    ti->from_f32(t, row, g_hd);
    ti->to_f32(row, y, g_hd);
    if (rot) kvc_rotate_rows(y, g_hd, 1, 1);
}

/* attention of query head group 0 of sequence 0 over the stored values, in double */
static double check_one(kvc_type type, int rot, const float *kin, const float *vin, int32_t cells, const float *q,
                        const float *out) {
    const kvc__type_info *ti = &kvc__types[type];
    float kf[HD_MAX], vf[HD_MAX];
    double worst = 0;
    int g;
    for (g = 0; g < HQ / HKV; ++g) {
        double m = -1e300, sum = 0, acc[HD_MAX], scale = 1.0 / sqrt((double)g_hd);
        int32_t t, i;
        for (i = 0; i < g_hd; ++i) acc[i] = 0;
        for (t = 0; t < cells; ++t) { /* token t holds input row t % CHUNK, kv head 0 */
            double s = 0, w;
            stored(ti, rot, kin + (size_t)(t % CHUNK) * HKV * g_hd, kf);
            for (i = 0; i < g_hd; ++i) s += (double)q[g * g_hd + i] * kf[i];
            s *= scale;
            if (s > m) { double r = exp(m - s); sum *= r; for (i = 0; i < g_hd; ++i) acc[i] *= r; m = s; }
            w = exp(s - m);
            sum += w;
            stored(ti, rot, vin + (size_t)(t % CHUNK) * HKV * g_hd, vf);
            for (i = 0; i < g_hd; ++i) acc[i] += w * vf[i];
        }
        for (i = 0; i < g_hd; ++i) {
            double e = fabs(acc[i] / sum - out[g * g_hd + i]);
            if (e > worst) worst = e;
        }
    }
    return worst;
}

/* --saveload: the wall time of kvc_cache_save of a row's first cache (device -> a host
   buffer, staged in KVCACHE_IO_CHUNK pieces on the context's queue) and of kvc_cache_load of
   that file into a second cache on the same device pool, medians of 5 after one untimed
   pair; in GB/s of the file's bytes (K/V and metadata). */
static void saveload_row(kvc_pool *hp, kvc_cache *c, double *save_gbs, double *load_gbs, double *file_mb) {
    kvc_mem m;
    kvc_io io;
    kvc_namespace ns;
    kvc_cache_config cc;
    kvc_cache *d;
    double ts[6], tl[6], t0;
    int i;
    memset(&m, 0, sizeof(m));
    memset(&ns, 0, sizeof(ns));
    CHECK(kvc_io_memory(&m, &io));
    CHECK(kvc_cache_save(c, ns, NULL, 0, &io)); /* data NULL: counts the bytes */
    m.capacity = m.size;
    m.data = (unsigned char *)malloc(m.capacity);
    if (m.data == NULL) die("saveload: malloc", KVC_ERR_NO_MEMORY);
    kvc_cache_config_init(&cc, KVC_KIND_FULL);
    CHECK(kvc_cache_create(hp, &cc, &d));
    for (i = 0; i < 6; ++i) {
        m.size = m.pos = 0;
        t0 = now();
        CHECK(kvc_cache_save(c, ns, NULL, 0, &io));
        ts[i] = now() - t0;
        m.pos = 0;
        t0 = now();
        CHECK(kvc_cache_load(d, ns, &io, NULL, 0, NULL));
        tl[i] = now() - t0;
    }
    qsort(ts + 1, 5, sizeof(double), cmp_double);
    qsort(tl + 1, 5, sizeof(double), cmp_double);
    *file_mb = (double)m.size / 1e6;
    *save_gbs = (double)m.size / ts[3] / 1e9;
    *load_gbs = (double)m.size / tl[3] / 1e9;
    CHECK(kvc_cache_destroy(d));
    free(m.data);
}

/* Prefill: NQ causal queries (the cache's last NQ positions; 512 unless --prefill-queries says
   otherwise) of NH query heads (32 unless --prefill-heads says otherwise; HKV kv heads) over
   CELLS cells of f16 (4096 unless --prefill-cells says otherwise), one call (issue 37's prefill
   row; bench_vk_sdpa.py times SDPA's flash kernel on the 512-query, 32-head, 4096-cell shape).
   A FULL cache, or with --causal a CAUSAL one (one sequence, positions 0 .. CELLS - 1 in its
   cells).
   The output is not checked against f64 here (test_vk checks prefill-sized calls' values). */
static void prefill_row(const kvc_vk_buffer *kin_buf, const kvc_vk_buffer *vin_buf, int reps, int NQ, int NH, int CELLS,
                        int causal) {
    int32_t filled;
    kvc_pool_config pc;
    kvc_cache_config cc;
    kvc_vk_pool_options po;
    kvc_vk_pool *vp;
    kvc_cache *c;
    kvc_vk_buffer qb, ob;
    kvc_vk_attention_item item;
    kvc_vk_tensor tk_, tv_;
    VkCommandBuffer cmd;
    attn_job aj;
    double us, spread = 1, flops;
    size_t i, n = (size_t)NQ * NH * (size_t)g_hd;
    static int32_t qpos[4096], qseq[4096]; /* (--prefill-queries: at most 4096) */
    kvc_pool_config_init(&pc);
    pc.n_layers = 1; pc.n_kv_heads = HKV; pc.head_dim_k = pc.head_dim_v = g_hd;
    pc.type_k = pc.type_v = KVC_TYPE_F16;
    pc.page_cells = 256;
    CHECK(kvc_pool_budget_for_tokens(&pc, CELLS + 256, &pc.budget_bytes));
    memset(&po, 0, sizeof(po));
    if (getenv("BENCH_VK_NO_CM")) po.disable_features |= KVC_VK_FEATURE_COOPERATIVE_MATRIX;
    /* BENCH_VK_PREFILL=N: kvc_vk_pool_options.prefill_min_queries (8: attn_prefill, -1: the
       decode kernel once a query); unset: the backend's default (attn_prefill from 32 queries
       on the tensor cores, the decode kernel elsewhere) */
    po.prefill_min_queries = getenv("BENCH_VK_PREFILL") ? atoi(getenv("BENCH_VK_PREFILL")) : 0;
    CHECK(kvc_vk_pool_create(ctx, &pc, &po, &vp));
    kvc_cache_config_init(&cc, causal ? KVC_KIND_CAUSAL : KVC_KIND_FULL);
    cc.capacity = CELLS; /* (CAUSAL: its cells) */
    CHECK(kvc_cache_create(kvc_vk_pool_host(vp), &cc, &c));
    memset(&tk_, 0, sizeof(tk_));
    memset(&tv_, 0, sizeof(tv_));
    tk_.buffer = kin_buf->buffer;
    tv_.buffer = vin_buf->buffer;
    CHECK(kvc_vk_context_begin(ctx, &cmd));
    for (filled = 0; filled < CELLS; filled += CHUNK) {
        CHECK(kvc_begin(c, CELLS - filled < CHUNK ? CELLS - filled : CHUNK, NULL, 0));
        CHECK(kvc_vk_cmd_append(vp, cmd, c, 0, &tk_, &tv_));
    }
    CHECK(kvc_vk_context_submit_wait(ctx, cmd));
    CHECK(kvc_vk_buffer_create(ctx, sizeof(float) * n, g_host_io, &qb));
    CHECK(kvc_vk_buffer_create(ctx, sizeof(float) * n, 0, &ob));
    {
        float *qv = (float *)malloc(sizeof(float) * n);
        if (qv == NULL) die("malloc", KVC_ERR_NO_MEMORY);
        for (i = 0; i < n; ++i) qv[i] = frand();
        CHECK(kvc_vk_buffer_upload(ctx, qb.buffer, 0, qv, sizeof(float) * n));
        free(qv);
    }
    memset(&item, 0, sizeof(item));
    item.cache = c;
    item.desc.n_queries = NQ; /* positions: the last NQ of the cache, causal */
    if (causal) { /* (a CAUSAL cache's queries default to its last batch: named here) */
        for (i = 0; i < (size_t)NQ; ++i) {
            qpos[i] = CELLS - NQ + (int32_t)i;
            qseq[i] = 0;
        }
        item.desc.pos = qpos;
        item.desc.seq = qseq;
    }
    item.desc.n_heads = NH;
    item.desc.q.buffer = qb.buffer;
    item.desc.out.buffer = ob.buffer;
    aj.pool = vp; aj.items = &item; aj.n = 1;
    us = time_gpu(record_attn, &aj, reps, &spread);
    if (getenv("BENCH_VK_STATS")) print_stats(vp, 1);
    /* query i sees CELLS - NQ + 1 + i cells: 4 hd FLOPs a (query head, cell), QK and PV */
    flops = 4.0 * g_hd * NH * ((double)NQ * (CELLS - NQ + 1) + (double)NQ * (NQ - 1) / 2);
    printf("\n| prefill f16 (BENCH_VK_PREFILL=%s) | queries | q / kv heads | head dim | cells | time (us) | TFLOP/s | slowest / fastest run |\n"
           "|---|---|---|---|---|---|---|---|\n",
           getenv("BENCH_VK_PREFILL") ? getenv("BENCH_VK_PREFILL") : "unset: the default");
    printf("| causal%s | %d | %d / %d | %d | %d | %.1f | %.1f | %.2f |\n", causal ? " (CAUSAL cache)" : "", NQ, NH, HKV, g_hd, CELLS,
           us, flops / us * 1e-6, spread);
    fflush(stdout);
    kvc_vk_buffer_destroy(ctx, &qb);
    kvc_vk_buffer_destroy(ctx, &ob);
    kvc_cache_destroy(c);
    CHECK(kvc_vk_pool_destroy(vp));
}

int main(int argc, char **argv) {
    int32_t cells_list[8] = {4096, 32768, 131072}, batch_list[8] = {1, 8};
    int n_cells = 3, n_batch = 2, n_types = 0, reps = 50, ai, ti, bi, ci, groups = 0, no_copy = 0, n_kept = 0, k;
    int quick = 0, sized = 0; /* --quick; --cells, --batch or --reps given */
    int saveload = 0, n_sl = 0; /* --saveload: save and load throughput, batch-1 rows */
    int causal = 0;             /* --causal: CAUSAL caches (per-cell sequence and position masks) */
    int32_t causal_pos = 0, causal_seq = 0; /* (--causal: the query's) */
    int no_prefill = 0;         /* --no-prefill: no prefill row */
    int32_t pq_list[8] = {512}; /* --prefill-queries: the prefill rows' queries */
    int n_pq = 1, pi;
    int32_t ph_list[8] = {HQ}; /* --prefill-heads: the prefill rows' query heads */
    int n_ph = 1, hi;
    int32_t pc_list[8] = {4096}; /* --prefill-cells: the prefill rows' cells */
    int n_pc = 1, pci;
    static char sl_rows[64][160];
    /* every pool and its caches stay until the end, and the copy kernel's buffers too. (This
       was against f16 batch 8 rows measured 2.3x / 2.6x slower in runs that freed them; the
       later H200 runs put such slow rows, freed or kept, down to the SM clock: see time_gpu) */
    static kvc_vk_pool *kept_pool[256];
    static kvc_cache *kept_cache[256][8];
    static int32_t kept_n[256];
    kvc_vk_pool_options po;
    kvc_type types[16];
    int rots[16];
    const char *type_arg = "f16,q8_0";
    kvc_vk_loader loader;
    kvc_vk_device_options o;
    kvc_vk_buffer kin_buf, vin_buf, q_buf, out_buf, copy_a, copy_b;
    float *kin, *vin, *qh;
    size_t in_elems;
    kvc_pool_config pc;
    kvc_vk_pool *copy_pool;
    double copy_us, copy_gbs;
    char share[32]; /* the row's share of the copy kernel's bandwidth, "-" with --no-copy */
    g_wall0 = now();
    for (ai = 1; ai < argc; ++ai) {
        if (!strcmp(argv[ai], "--help") || !strcmp(argv[ai], "-h")) {
            printf("usage: %s [options]\n"
                   "  --cells LIST   cells per sequence (default 4096,32768,131072)\n"
                   "  --batch LIST   sequences per call, 1-8 (default 1,8)\n"
                   "  --types LIST   storage types, NAME+rot for rotated storage (default f16,q8_0)\n"
                   "  --reps N       calls recorded back to back per timing (default 50)\n"
                   "  --splits N     at most N split-K chunks (default: the backend's choice)\n"
                   "  --hd N         head dim of K and V: 64, 128 or 256 (default 128)\n"
                   "  --no-copy      skip the copy kernel's bandwidth (the yardstick)\n"
                   "  --no-prefill   skip the prefill row (512 causal queries over 4096 cells, f16)\n"
                   "  --prefill-queries LIST  queries of the prefill rows (default 512; at most 4096)\n"
                   "  --prefill-heads LIST    query heads of the prefill rows, multiples of 8 (the kv heads; default 32)\n"
                   "  --prefill-cells LIST    cells of the prefill rows' caches, at least the queries (default 4096; at most 131072)\n"
                   "  --saveload     also time kvc_cache_save / _load of each batch-1 row's cache\n"
                   "  --causal       decode and prefill rows over CAUSAL caches (default FULL: no per-cell masks)\n"
                   "  --host-io      queries and outputs in host-visible memory (default: device-local buffers)\n"
                   "  --quick        4096 cells, batch 1, 2 reps, a 64 MiB copy\n"
                   "A CPU device (lavapipe) gets the --quick shape unless --cells, --batch or --reps is given.\n"
                   "Environment: KVC_VK_DEVICE (device index), BENCH_VK_BOUNDS_CHECKS, BENCH_VK_NO_DOT,\n"
                   "BENCH_VK_NO_INT8 (the quantised tensor-core build without 8-bit products),\n"
                   "BENCH_VK_NO_KHR (prefill on VK_NV_cooperative_matrix instead of the KHR typed matrices),\n"
                   "BENCH_VK_STATS (each row's pipelines' statistics, printed before the row).\n", argv[0]);
            return 0;
        }
        if (!strcmp(argv[ai], "--quick")) quick = 1;
        else if (!strcmp(argv[ai], "--cells") && ai + 1 < argc) n_cells = parse_list(argv[++ai], cells_list, 8), sized = 1;
        else if (!strcmp(argv[ai], "--batch") && ai + 1 < argc) n_batch = parse_list(argv[++ai], batch_list, 8), sized = 1;
        else if (!strcmp(argv[ai], "--types") && ai + 1 < argc) type_arg = argv[++ai];
        else if (!strcmp(argv[ai], "--reps") && ai + 1 < argc) reps = atoi(argv[++ai]), sized = 1;
        else if (!strcmp(argv[ai], "--splits") && ai + 1 < argc) groups = atoi(argv[++ai]);
        else if (!strcmp(argv[ai], "--hd") && ai + 1 < argc) g_hd = atoi(argv[++ai]);
        else if (!strcmp(argv[ai], "--no-copy")) no_copy = 1;
        else if (!strcmp(argv[ai], "--host-io")) g_host_io = 1;
        else if (!strcmp(argv[ai], "--no-prefill")) no_prefill = 1;
        else if (!strcmp(argv[ai], "--prefill-queries") && ai + 1 < argc) n_pq = parse_list(argv[++ai], pq_list, 8);
        else if (!strcmp(argv[ai], "--prefill-heads") && ai + 1 < argc) n_ph = parse_list(argv[++ai], ph_list, 8);
        else if (!strcmp(argv[ai], "--prefill-cells") && ai + 1 < argc) n_pc = parse_list(argv[++ai], pc_list, 8);
        else if (!strcmp(argv[ai], "--saveload")) saveload = 1;
        else if (!strcmp(argv[ai], "--causal")) causal = 1;
        else { fprintf(stderr, "usage: bench_vk [--cells a,b] [--batch a,b] [--types f16,q8_0] [--reps n] [--splits n] [--hd 64|128|256] [--no-copy] [--no-prefill] [--saveload] [--causal] [--host-io] [--quick] [--help]\n"); return 2; }
    }
    if (g_hd != 64 && g_hd != 128 && g_hd != 256) { fprintf(stderr, "bench_vk: --hd: 64, 128 or 256\n"); return 2; }
    for (bi = 0; bi < n_batch; ++bi)
        if (batch_list[bi] < 1 || batch_list[bi] > 8) { fprintf(stderr, "bench_vk: --batch: 1 to 8 caches a call\n"); return 2; }
    in_elems = (size_t)CHUNK * HKV * g_hd;
    { /* the types in the order given; NAME+rot: rotated storage */
        const char *a = type_arg;
        while (*a && n_types < 16) {
            size_t len = strcspn(a, ","), nl = len;
            int rot = len > 4 && !strncmp(a + len - 4, "+rot", 4);
            if (rot) nl -= 4;
            for (ti = 0; ti < (int)KVC_TYPE_COUNT; ++ti)
                if (strlen(kvc_type_name((kvc_type)ti)) == nl && !strncmp(a, kvc_type_name((kvc_type)ti), nl)) {
                    types[n_types] = (kvc_type)ti;
                    rots[n_types++] = rot;
                }
            a += len + (a[len] == ',');
        }
    }
    if (kvc_vk_loader_open(&loader) != KVC_OK) { printf("bench_vk: skipped (no Vulkan loader)\n"); return 0; }
    memset(&o, 0, sizeof(o));
    o.get_instance_proc_addr = loader.get_instance_proc_addr;
    o.device_index = getenv("KVC_VK_DEVICE") ? atoi(getenv("KVC_VK_DEVICE")) : -1;
    if (getenv("BENCH_VK_BOUNDS_CHECKS")) o.disable_features |= KVC_VK_FEATURE_PIPELINE_ROBUSTNESS;
    if (getenv("BENCH_VK_NO_DOT")) o.disable_features |= KVC_VK_FEATURE_INTEGER_DOT_PRODUCT;
    if (getenv("BENCH_VK_NO_INT8")) o.disable_features |= KVC_VK_FEATURE_INT8_MATRIX;
    if (getenv("BENCH_VK_NO_KHR")) o.disable_features |= KVC_VK_FEATURE_KHR_MATRIX;
    o.pipeline_statistics = getenv("BENCH_VK_STATS") != NULL;
    if (kvc_vk_device_create(&o, &ctx) != KVC_OK) { printf("bench_vk: skipped (no Vulkan device)\n"); return 0; }
    kvc_vk_context_info(ctx, &info);
    fn = kvc_vk_context_functions(ctx);
    if (info.device_type == VK_PHYSICAL_DEVICE_TYPE_CPU && !sized && !quick) { /* lavapipe: a smoke run */
        quick = 1;
        printf("bench_vk: %s is a CPU device: the --quick shape only, not a benchmark (--cells, --batch or "
               "--reps to override)\n", info.device_name);
    }
    if (quick) {
        n_cells = n_batch = 1;
        cells_list[0] = 4096;
        batch_list[0] = 1;
        reps = 2;
    }
    printf("bench_vk: %s (Vulkan %u.%u, subgroup %u, cooperative matrix %d (8-bit %d, KHR %d), bounds checks off %d, integer dot %d), head dim %d, %d reps per timing, medians of 5, queries and outputs in %s memory\n",
           info.device_name, VK_API_VERSION_MAJOR(info.api_version), VK_API_VERSION_MINOR(info.api_version),
           info.subgroup_size, (info.active_features & KVC_VK_FEATURE_COOPERATIVE_MATRIX) != 0,
           (info.active_features & KVC_VK_FEATURE_INT8_MATRIX) != 0,
           (info.active_features & KVC_VK_FEATURE_KHR_MATRIX) != 0,
           (info.active_features & KVC_VK_FEATURE_PIPELINE_ROBUSTNESS) != 0,
           (info.active_features & KVC_VK_FEATURE_INTEGER_DOT_PRODUCT) != 0, g_hd, reps,
           g_host_io ? "host-visible (--host-io)" : "device-local");

    /* inputs: one chunk of K and V rows (f32), repeated through every cache */
    kin = (float *)malloc(sizeof(float) * in_elems * 2);
    vin = kin + in_elems;
    for (ai = 0; ai < (int)(in_elems * 2); ++ai) kin[ai] = frand();
    CHECK(kvc_vk_buffer_create(ctx, sizeof(float) * in_elems, 0, &kin_buf));
    CHECK(kvc_vk_buffer_create(ctx, sizeof(float) * in_elems, 0, &vin_buf));
    CHECK(kvc_vk_buffer_upload(ctx, kin_buf.buffer, 0, kin, sizeof(float) * in_elems));
    CHECK(kvc_vk_buffer_upload(ctx, vin_buf.buffer, 0, vin, sizeof(float) * in_elems));
    qh = (float *)malloc(sizeof(float) * 8 * HQ * g_hd * 2);
    for (ai = 0; ai < 8 * HQ * g_hd; ++ai) qh[ai] = frand();
    CHECK(kvc_vk_buffer_create(ctx, sizeof(float) * 8 * HQ * g_hd, g_host_io, &q_buf));
    CHECK(kvc_vk_buffer_create(ctx, sizeof(float) * 8 * HQ * g_hd, g_host_io, &out_buf));
    CHECK(kvc_vk_buffer_upload(ctx, q_buf.buffer, 0, qh, sizeof(float) * 8 * HQ * g_hd));

    /* the copy kernel: 1 GiB -> 1 GiB */
    kvc_pool_config_init(&pc);
    pc.n_layers = 1; pc.n_kv_heads = 1; pc.head_dim_k = pc.head_dim_v = 4; pc.page_cells = 16; pc.budget_bytes = 4096;
    CHECK(kvc_vk_pool_create(ctx, &pc, NULL, &copy_pool));
    copy_gbs = 1;
    if (!no_copy) {
        copy_job cj;
        VkDeviceSize bytes = (VkDeviceSize)1 << (info.device_type == VK_PHYSICAL_DEVICE_TYPE_CPU || quick ? 26 : 30);
        CHECK(kvc_vk_buffer_create(ctx, bytes, 0, &copy_a));
        CHECK(kvc_vk_buffer_create(ctx, bytes, 0, &copy_b));
        cj.pool = copy_pool; cj.a = copy_a.buffer; cj.b = copy_b.buffer; cj.bytes = bytes;
        copy_us = time_gpu(record_copy, &cj, 20, NULL);
        copy_gbs = 2.0 * (double)bytes / (copy_us * 1e-6) / 1e9;
        printf("copy kernel: %.0f MiB -> %.0f MiB in %.1f us = %.0f GB/s read + write\n", (double)bytes / 1048576.0, (double)bytes / 1048576.0, copy_us, copy_gbs);
    }
    { /* what any call costs before its work: attention rows below are this much above zero */
        copy_job fj;
        kvc_vk_buffer fa, fb;
        CHECK(kvc_vk_buffer_create(ctx, 256, 0, &fa));
        CHECK(kvc_vk_buffer_create(ctx, 256, 0, &fb));
        fj.pool = copy_pool; fj.a = fa.buffer; fj.b = fb.buffer; fj.bytes = 256;
        printf("call floor: a barrier and one dispatch (a 256-byte copy), %.1f us a call\n", time_gpu(record_floor, &fj, reps, NULL));
        kvc_vk_buffer_destroy(ctx, &fa);
        kvc_vk_buffer_destroy(ctx, &fb);
    }
    CHECK(kvc_vk_pool_destroy(copy_pool));

    printf("\n| storage | batch | cells | time (us) | K+V read | GB/s | vs copy kernel | max err vs f64 | slowest / fastest run | host (us) | step host (us) |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (ti = 0; ti < n_types; ++ti)
        for (bi = 0; bi < n_batch; ++bi)
            for (ci = 0; ci < n_cells; ++ci) {
                int32_t batch = batch_list[bi], cells = cells_list[ci], s, filled;
                kvc_vk_pool *vp;
                kvc_pool *hp;
                kvc_cache *caches[8];
                kvc_cache_config cc;
                kvc_vk_attention_item items[8];
                kvc_pool_stats st;
                attn_job aj;
                double us, bytes, err, spread = 1, host_us;
                char step[32];
                VkCommandBuffer cmd;
                kvc_pool_config_init(&pc);
                pc.n_layers = 1; pc.n_kv_heads = HKV; pc.head_dim_k = pc.head_dim_v = g_hd;
                pc.type_k = pc.type_v = types[ti];
                pc.rotate = rots[ti] ? KVC_ROTATE_K | KVC_ROTATE_V : 0u;
                pc.page_cells = 256;
                CHECK(kvc_pool_budget_for_tokens(&pc, cells + 256, &pc.budget_bytes));
                pc.budget_bytes *= (size_t)batch; /* one cache per batch entry */
                if (saveload && batch == 1) pc.budget_bytes *= 3; /* a loaded copy beside it, and its next load */
                memset(&po, 0, sizeof(po));
                po.max_splits = groups;
                if (getenv("BENCH_VK_NO_CM")) po.disable_features |= KVC_VK_FEATURE_COOPERATIVE_MATRIX;
                if (getenv("BENCH_VK_HOST_LAYOUT")) po.host_layout = 1; /* q8_0/q4_0 in llama.cpp's blocks on the device */
                CHECK(kvc_vk_pool_create(ctx, &pc, &po, &vp));
                hp = kvc_vk_pool_host(vp);
                kvc_cache_config_init(&cc, causal ? KVC_KIND_CAUSAL : KVC_KIND_FULL);
                cc.capacity = cells; /* (CAUSAL: its cells; the query, the last token, sees them all) */
                causal_pos = cells - 1;
                for (s = 0; s < batch; ++s) {
                    kvc_vk_tensor tk_, tv_;
                    CHECK(kvc_cache_create(hp, &cc, &caches[s]));
                    memset(&tk_, 0, sizeof(tk_));
                    memset(&tv_, 0, sizeof(tv_));
                    tk_.buffer = kin_buf.buffer;
                    tv_.buffer = vin_buf.buffer;
                    CHECK(kvc_vk_context_begin(ctx, &cmd));
                    for (filled = 0; filled < cells; filled += CHUNK) {
                        int32_t n = cells - filled < CHUNK ? cells - filled : CHUNK;
                        CHECK(kvc_begin(caches[s], n, NULL, 0));
                        CHECK(kvc_vk_cmd_append(vp, cmd, caches[s], 0, &tk_, &tv_));
                    }
                    CHECK(kvc_vk_context_submit_wait(ctx, cmd));
                    memset(&items[s], 0, sizeof(items[s]));
                    items[s].cache = caches[s];
                    items[s].desc.n_queries = 1;
                    items[s].desc.n_heads = HQ;
                    items[s].desc.q.buffer = q_buf.buffer;
                    items[s].desc.q.offset = (VkDeviceSize)s * HQ * g_hd * 4;
                    items[s].desc.out.buffer = out_buf.buffer;
                    items[s].desc.out.offset = (VkDeviceSize)s * HQ * g_hd * 4;
                    if (causal) { /* (a CAUSAL cache's query names its position and sequence) */
                        items[s].desc.pos = &causal_pos;
                        items[s].desc.seq = &causal_seq;
                    }
                }
                aj.pool = vp; aj.items = items; aj.n = batch;
                us = time_gpu(record_attn, &aj, reps, &spread);
                host_us = g_host_us;
                if (getenv("BENCH_VK_STATS")) print_stats(vp, 0); /* (the row's own pool: what it made) */
                /* (sequence 0's output, into qh's second half) */
                CHECK(kvc_vk_buffer_download(ctx, out_buf.buffer, 0, qh + 8 * HQ * g_hd, sizeof(float) * HQ * g_hd));
                err = check_one(types[ti], rots[ti], kin, vin, cells, qh, qh + 8 * HQ * g_hd);
                kvc_pool_stats_get(hp, &st);
                bytes = (double)batch * cells * (double)(st.k_row_bytes + st.v_row_bytes);
                if (causal) snprintf(step, sizeof step, "%.1f", step_host_us(&aj, caches));
                else snprintf(step, sizeof step, "-");
                if (no_copy) snprintf(share, sizeof share, "-");
                else snprintf(share, sizeof share, "%.0f %%", 100.0 * (bytes / (us * 1e-6) / 1e9) / copy_gbs);
                printf("| %s%s | %d | %d | %.1f | %.1f MB | %.0f | %s | %.1e | %.2f | %.1f | %s |\n", kvc_type_name(types[ti]),
                       rots[ti] ? "+rot" : "", batch, cells, us, bytes / 1e6, bytes / (us * 1e-6) / 1e9, share, err,
                       spread, host_us, step);
                fflush(stdout);
                if (saveload && batch == 1 && n_sl < 64) {
                    double sg, lg, mb;
                    saveload_row(hp, caches[0], &sg, &lg, &mb);
                    if (no_copy) snprintf(sl_rows[n_sl++], sizeof sl_rows[0], "| %s%s | %d | %.1f | %.2f | %.2f | - | - |",
                                          kvc_type_name(types[ti]), rots[ti] ? "+rot" : "", cells, mb, sg, lg);
                    else snprintf(sl_rows[n_sl++], sizeof sl_rows[0], "| %s%s | %d | %.1f | %.2f | %.2f | %.2f %% | %.2f %% |",
                                  kvc_type_name(types[ti]), rots[ti] ? "+rot" : "", cells, mb, sg, lg, 100.0 * sg / copy_gbs,
                                  100.0 * lg / copy_gbs);
                }
                if (n_kept < 256) {
                    kept_pool[n_kept] = vp;
                    kept_n[n_kept] = batch;
                    for (s = 0; s < batch; ++s) kept_cache[n_kept][s] = caches[s];
                    n_kept++;
                } else {
                    for (s = 0; s < batch; ++s) kvc_cache_destroy(caches[s]);
                    CHECK(kvc_vk_pool_destroy(vp));
                }
            }
    for (pci = 0; !quick && !no_prefill && pci < n_pc; ++pci)
        for (hi = 0; hi < n_ph; ++hi)
            for (pi = 0; pi < n_pq; ++pi)
                if (pq_list[pi] >= 1 && pq_list[pi] <= 4096 && pq_list[pi] <= pc_list[pci] && pc_list[pci] <= 131072 &&
                    ph_list[hi] >= HKV && ph_list[hi] % HKV == 0 && ph_list[hi] <= 64 * HKV)
                    prefill_row(&kin_buf, &vin_buf, reps < 10 ? reps : 10, pq_list[pi], ph_list[hi], pc_list[pci], causal);
    if (n_sl > 0) {
        printf("\nsave / load of one cache (kvc_cache_save to host memory, kvc_cache_load back to the device; wall time, medians of 5)\n\n");
        printf("| storage | cells | file MB | save GB/s | load GB/s | save vs copy kernel | load vs copy kernel |\n|---|---|---|---|---|---|---|\n");
        for (k = 0; k < n_sl; ++k) printf("%s\n", sl_rows[k]);
    }
    for (k = 0; k < n_kept; ++k) {
        for (ai = 0; ai < kept_n[k]; ++ai) kvc_cache_destroy(kept_cache[k][ai]);
        CHECK(kvc_vk_pool_destroy(kept_pool[k]));
    }
    if (!no_copy) { /* kept until here too */
        kvc_vk_buffer_destroy(ctx, &copy_a);
        kvc_vk_buffer_destroy(ctx, &copy_b);
    }
    kvc_vk_buffer_destroy(ctx, &kin_buf);
    kvc_vk_buffer_destroy(ctx, &vin_buf);
    kvc_vk_buffer_destroy(ctx, &q_buf);
    kvc_vk_buffer_destroy(ctx, &out_buf);
    CHECK(kvc_vk_context_destroy(ctx));
    free(kin);
    free(qh);
    kvc_vk_loader_close(&loader);
    return 0;
}
#endif
