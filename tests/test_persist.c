/* test_persist.c - saving and loading (Layer 7): round trips of every kind through every
   io (memory, FILE*, callbacks, a path written atomically), bit-exact (every held cell's
   position, sequence set and K/V bytes, the window state, then identical behaviour on the
   next batch); every damaged byte, every truncation and every mismatch is an error that
   leaves the target exactly as it was and leaks no page; prefix-tree entries move
   between trees and pools.

   Usage: test_persist [seed]                 the tests (the random seed picks the contents)
          test_persist --write-corpus DIR     writes the loader fuzz target's seed corpus */
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#define KVCACHE_IMPLEMENTATION
#include "../kvcache.h"
#include "tk.h"
#include "load_fixture.h"
#include "format_bytes.h"

/* The file the path tests write: the program's own path + ".tmp" (set in main), so that
   builds of this test run side by side (tests/run.sh runs configurations at once) do
   not share it; the library's temporary files are that + ".kvctmp-" + 16 hex digits. */
static char g_tmp_path[1024] = "build/test_persist.tmp", g_tmp_side[1040];
#define TMP_PATH g_tmp_path

/* ---- helpers ----------------------------------------------------------------------- */

typedef struct blob { unsigned char *data; size_t size; } blob;

/* Save into memory (sized by a counting pass first). */
typedef kvc_result (*save_fn)(void *what, const kvc_io *io);
static blob save_blob(save_fn fn, void *what) {
    kvc_mem m;
    kvc_io io;
    blob b = {NULL, 0};
    memset(&m, 0, sizeof(m));
    TK_OK(kvc_io_memory(&m, &io));
    TK_OK(fn(what, &io));                     /* data == NULL: counts */
    b.data = (unsigned char *)malloc(m.size ? m.size : 1);
    m.data = b.data;
    m.capacity = m.size;
    m.size = 0;
    TK_OK(fn(what, &io));
    TK_EQ(m.size, m.capacity);
    b.size = m.size;
    return b;
}

static int32_t g_tokens[64];
static kvc_result save_cache(void *c, const kvc_io *io) { return kvc_cache_save((kvc_cache *)c, LF_NS, g_tokens, 7, io); }
static kvc_result save_seq1(void *c, const kvc_io *io) { return kvc_seq_save((kvc_cache *)c, 1, LF_NS, g_tokens, 3, io); }
static kvc_result save_entry(void *t, const kvc_io *io) {
    int32_t tok[9], i;
    for (i = 0; i < 9; ++i) tok[i] = 100 + i;
    return kvc_radix_save((kvc_radix *)t, LF_NS, tok, 9, io);
}
static kvc_result save_rentry(void *t, const kvc_io *io) { /* the ROTATING tree's entry */
    int32_t tok[20], i;
    for (i = 0; i < 20; ++i) tok[i] = 200 + i;
    return kvc_radix_save((kvc_radix *)t, LF_NS, tok, 20, io);
}

/* A crafted ROTATING entry (issue 23): a valid header, CONF and META (checksums right)
   declaring an offset near 2^31 with 9 cells in 3 pages, then a TOKS section declaring
   those 2^31 tokens of which 16 follow. `entry` is a saved entry of w->rtree (its
   header and CONF are kept). Writes LF_CRAFTED_BYTES bytes. */
#define LF_CRAFTED_BYTES 248
static void lf_craft_rotating_entry(const unsigned char *entry, unsigned char *out) {
    /* offset 2^31 - 3: logical pages 0 (sink), 536870910 and 536870911 (window);
       9 cells (4 + 4 + 1); the batch began at offset - 1, so the window is held */
    const uint32_t off = 2147483645u, meta[6] = {2147483645u, 9, 2147483645u, 2147483644u, 536870910u, 3};
    unsigned char *m = out + 120, *t = out + 168;
    int i;
    memcpy(out, entry, 120); /* header 16, CONF 16 + 80 + 8 */
    tk_put32(m, TK_TAG('M', 'E', 'T', 'A'));
    tk_put32(m + 4, 0);
    tk_put64(m + 8, 24);
    for (i = 0; i < 6; ++i) tk_put32(m + 16 + 4 * i, meta[i]);
    tk_put64(m + 40, tk_xxh64(m, 40));
    tk_put32(t, TK_TAG('T', 'O', 'K', 'S'));
    tk_put32(t + 4, 0);
    tk_put64(t + 8, 4 * (uint64_t)off);
    for (i = 0; i < 16; ++i) tk_put32(t + 16 + 4 * i, (uint32_t)(200 + i));
}

static kvc_io mem_reader(kvc_mem *m, const blob *b) {
    kvc_io io;
    memset(m, 0, sizeof(*m));
    m->data = b->data;
    m->size = m->capacity = b->size;
    kvc_io_memory(m, &io);
    return io;
}

static int32_t tree_pinned(const kvc_radix *t) {
    kvc_radix_stats s;
    kvc_radix_stats_get(t, &s);
    return s.n_pinned;
}

static int32_t pool_pages(const kvc_pool *p) {
    kvc_pool_stats s;
    memset(&s, 0, sizeof(s)); /* g++ -O2 cannot see that the call always fills it */
    TK_OK(kvc_pool_stats_get(p, &s));
    return s.pages_used;
}

/* The same batch on two causal caches must give the same masks and the same K/V views. */
static void same_next_batch(kvc_cache *a, kvc_cache *b) {
    static float ma[4096], mb[4096];
    int32_t ra, ca, fa, rb, cb, fb, l, na, nb, i;
    kvc_run runs_a[16], runs_b[16];
    TK_OK(lf_causal_append(a, 1, 8, 2, 9));
    TK_OK(lf_causal_append(b, 1, 8, 2, 9));
    TK_OK(kvc_mask_export(a, 1, ma, 4096, &ra, &ca, &fa));
    TK_OK(kvc_mask_export(b, 1, mb, 4096, &rb, &cb, &fb));
    TK_EQ(ra, rb);
    TK_EQ(ca, cb);
    TK_EQ(fa, fb);
    TK_EQ(memcmp(ma, mb, sizeof(float) * (size_t)(ra * ca)), 0);
    for (l = 0; l < LF_LAYERS; ++l) {
        TK_OK(kvc_cache_runs(a, l, runs_a, 16, &na));
        TK_OK(kvc_cache_runs(b, l, runs_b, 16, &nb));
        TK_EQ(na, nb);
        for (i = 0; i < na && i < nb; ++i) {
            TK_EQ(runs_a[i].n_cells, runs_b[i].n_cells);
            TK_EQ(memcmp(runs_a[i].pos, runs_b[i].pos, 4 * (size_t)runs_a[i].n_cells), 0);
            TK_EQ(memcmp(runs_a[i].k, runs_b[i].k, a->pool->k_row * (size_t)runs_a[i].n_cells), 0);
            TK_EQ(memcmp(runs_a[i].v, runs_b[i].v, a->pool->v_row * (size_t)runs_a[i].n_cells), 0);
        }
    }
}

/* ---- round trips ------------------------------------------------------------------- */

static void roundtrip_linear(kvc_type tk, kvc_type tv) {
    lf_world a, b;
    blob bf, br;
    kvc_mem m;
    kvc_io io;
    int32_t toks[64], n = -1, can_a, can_b;
    TK_EQ(lf_make(&a, tk, tv, 1), 1);
    TK_EQ(lf_make(&b, tk, tv, 0), 1);
    TK_OK(lf_append(b.full, 3, 3, 7)); /* something to be replaced */
    bf = save_blob(save_cache, a.full);
    br = save_blob(save_cache, a.rot);
    io = mem_reader(&m, &bf);
    TK_OK(kvc_cache_load(b.full, LF_NS, &io, toks, 64, &n));
    TK_EQ(n, 7);
    TK_EQ(memcmp(toks, g_tokens, 7 * sizeof(int32_t)), 0);
    TK_EQ(lf_fingerprint(b.full), lf_fingerprint(a.full));
    io = mem_reader(&m, &br);
    TK_OK(kvc_cache_load(b.rot, LF_NS, &io, NULL, 0, NULL));
    TK_EQ(lf_fingerprint(b.rot), lf_fingerprint(a.rot));
    TK_OK(kvc_cache_can_trim(a.rot, &can_a));
    TK_OK(kvc_cache_can_trim(b.rot, &can_b));
    TK_EQ(can_a, 0);
    TK_EQ(can_b, 0);
    /* both continue the same way */
    TK_OK(lf_append(a.full, 5, 2, 8));
    TK_OK(lf_append(b.full, 5, 2, 8));
    TK_OK(lf_append(a.rot, 5, 2, 8));
    TK_OK(lf_append(b.rot, 5, 2, 8));
    TK_EQ(lf_fingerprint(b.full), lf_fingerprint(a.full));
    TK_EQ(lf_fingerprint(b.rot), lf_fingerprint(a.rot));
    free(bf.data);
    free(br.data);
    lf_free(&a);
    { /* no page leaked: the pool holds exactly b's pages (nothing is shared there) */
        int32_t pf = 0, pr = 0, pc = 0;
        kvc_cache_pages(b.full, &pf);
        kvc_cache_pages(b.rot, &pr);
        kvc_cache_pages(b.causal, &pc);
        TK_EQ(pool_pages(b.pool), pf + pr + pc);
    }
    lf_free(&b);
}

/* ROTATING states around the window: empty, unwrapped, exactly W, a cancelled batch
   after a release, a long batch (L > W), snapshots restored. Each round-trips exactly. */
static void roundtrip_rotating_states(void) {
    int sinks, step;
    for (sinks = 0; sinks < 3; ++sinks)
        for (step = 0; step < 9; ++step) {
            kvc_pool *p = lf_pool(KVC_TYPE_F16, KVC_TYPE_F16);
            kvc_cache_config cc;
            kvc_cache *c = NULL, *d = NULL;
            blob b;
            kvc_mem m;
            kvc_io io;
            kvc_cache_config_init(&cc, KVC_KIND_ROTATING);
            cc.window = 7;
            cc.sinks = sinks;
            TK_OK(kvc_cache_create(p, &cc, &c));
            TK_OK(kvc_cache_create(p, &cc, &d));
            if (step >= 1) TK_OK(lf_append(c, 3 + step, 1, 1));
            if (step >= 3) TK_OK(lf_append(c, 2 * step, step, 2));
            if (step % 2 == 1) { TK_OK(kvc_begin(c, 2, NULL, 0)); TK_OK(kvc_cancel(c)); }
            if (step == 8) TK_OK(lf_append(c, 20, 20, 3));
            b = save_blob(save_cache, c);
            io = mem_reader(&m, &b);
            TK_OK(kvc_cache_load(d, LF_NS, &io, NULL, 0, NULL));
            TK_EQ(lf_fingerprint(d), lf_fingerprint(c));
            TK_OK(lf_append(c, 3, 1, 4));
            TK_OK(lf_append(d, 3, 1, 4));
            TK_EQ(lf_fingerprint(d), lf_fingerprint(c));
            free(b.data);
            TK_OK(kvc_cache_destroy(c));
            TK_OK(kvc_cache_destroy(d));
            TK_EQ(pool_pages(p), 0);
            TK_OK(kvc_pool_destroy(p));
        }
}

static void roundtrip_causal(void) {
    lf_world a, b;
    blob bc, bs;
    kvc_mem m;
    kvc_io io;
    int32_t lo, hi, n = -1, toks[8];
    TK_EQ(lf_make(&a, KVC_TYPE_F16, KVC_TYPE_F32, 1), 1);
    TK_EQ(lf_make(&b, KVC_TYPE_F16, KVC_TYPE_F32, 0), 1);
    TK_OK(lf_causal_append(b.causal, 2, 0, 4, 6)); /* replaced by the load */
    bc = save_blob(save_cache, a.causal);
    bs = save_blob(save_seq1, a.causal);
    io = mem_reader(&m, &bc);
    TK_OK(kvc_cache_load(b.causal, LF_NS, &io, NULL, 0, NULL));
    TK_EQ(lf_fingerprint(b.causal), lf_fingerprint(a.causal));
    TK_OK(kvc_seq_pos_range(b.causal, 1, &lo, &hi));
    TK_EQ(lo, 0);
    TK_EQ(hi, 7);
    same_next_batch(a.causal, b.causal);
    /* one sequence into another cache, as sequence 3 */
    TK_OK(kvc_cache_clear(b.causal));
    io = mem_reader(&m, &bs);
    TK_OK(kvc_seq_load(b.causal, 3, LF_NS, &io, toks, 8, &n));
    TK_EQ(n, 3);
    TK_OK(kvc_seq_pos_range(b.causal, 3, &lo, &hi));
    TK_EQ(lo, 0);
    TK_EQ(hi, 7); /* sequence 1 as saved: positions 0..7 */
    free(bc.data);
    free(bs.data);
    lf_free(&a);
    lf_free(&b);
}

static void roundtrip_entry(void) {
    lf_world a, b;
    blob be;
    kvc_mem m;
    kvc_io io;
    kvc_cache *c = NULL, *ref = NULL;
    int32_t tok[12], i, reused, n = -1;
    TK_EQ(lf_make(&a, KVC_TYPE_F32, KVC_TYPE_F16, 1), 1);
    TK_EQ(lf_make(&b, KVC_TYPE_F32, KVC_TYPE_F16, 0), 1);
    be = save_blob(save_entry, a.tree);
    io = mem_reader(&m, &be);
    TK_OK(kvc_radix_load(b.tree, LF_NS, &io, 1, &n));
    TK_EQ(n, 9);
    TK_EQ(tree_pinned(b.tree), 1);
    for (i = 0; i < 12; ++i) tok[i] = 100 + i;
    TK_OK(kvc_radix_lookup(b.tree, LF_NS, tok, 12, &c, &reused));
    TK_EQ(reused, 9);
    TK_OK(kvc_radix_lookup(a.tree, LF_NS, tok, 12, &ref, &reused));
    TK_EQ(reused, 9);
    TK_EQ(lf_fingerprint(c), lf_fingerprint(ref));
    TK_OK(kvc_cache_destroy(c));
    TK_OK(kvc_cache_destroy(ref));
    /* a sequence the tree does not hold whole */
    tok[3] = 5;
    {
        kvc_mem cm;
        kvc_io cio;
        memset(&cm, 0, sizeof(cm));
        kvc_io_memory(&cm, &cio);
        TK_RES(kvc_radix_save(a.tree, LF_NS, tok, 9, &cio), KVC_ERR_NOT_FOUND);
        TK_RES(kvc_radix_save(a.tree, LF_NS, tok, 0, &cio), KVC_ERR_INVALID);
    }
    free(be.data);
    lf_free(&a);
    lf_free(&b);
}

/* A ROTATING tree's entry is its sinks + window: it loads into another tree and a
   lookup continues from it. */
static void roundtrip_rotating_entry(void) {
    kvc_pool *p = lf_pool(KVC_TYPE_F16, KVC_TYPE_F16);
    kvc_radix_config rc;
    kvc_radix *t1 = NULL, *t2 = NULL;
    kvc_cache *c = NULL, *d = NULL;
    kvc_mem m;
    kvc_io io;
    unsigned char buf[8192];
    int32_t tok[21], i, reused, n;
    kvc_radix_config_init(&rc, KVC_KIND_ROTATING);
    rc.cache.window = 6;
    rc.cache.sinks = 2;
    TK_OK(kvc_radix_create(p, &rc, &t1));
    TK_OK(kvc_radix_create(p, &rc, &t2));
    for (i = 0; i < 21; ++i) tok[i] = 7 * i;
    TK_OK(kvc_radix_lookup(t1, LF_NS, tok, 20, &c, &reused));
    TK_OK(lf_append(c, 20, 1, 3));
    TK_OK(kvc_radix_commit(t1, LF_NS, c, tok, 20, 0));
    memset(&m, 0, sizeof(m));
    m.data = buf;
    m.capacity = sizeof(buf);
    kvc_io_memory(&m, &io);
    TK_OK(kvc_radix_save(t1, LF_NS, tok, 20, &io));
    TK_RES(kvc_radix_save(t1, LF_NS, tok, 12, &io), KVC_ERR_NOT_FOUND); /* its window is gone */
    m.pos = 0;
    TK_OK(kvc_radix_load(t2, LF_NS, &io, 0, &n));
    TK_EQ(n, 20);
    TK_OK(kvc_radix_lookup(t2, LF_NS, tok, 21, &d, &reused));
    TK_EQ(reused, 20);
    TK_EQ(lf_fingerprint(d), lf_fingerprint(c));
    TK_OK(kvc_cache_destroy(c));
    TK_OK(kvc_cache_destroy(d));
    TK_OK(kvc_radix_destroy(t1));
    TK_OK(kvc_radix_destroy(t2));
    TK_EQ(pool_pages(p), 0);
    TK_OK(kvc_pool_destroy(p));
}

/* Every storage type round-trips bit-exactly (blocks of quantised types included). */
static void roundtrip_types(void) {
    kvc_type types[3] = {KVC_TYPE_BF16, KVC_TYPE_Q8_0, KVC_TYPE_Q4_0};
    int a, b;
    for (a = 0; a < 3; ++a)
        for (b = 0; b < 3; ++b) {
            kvc_pool_config pc;
            kvc_pool *p = NULL;
            kvc_cache_config cc;
            kvc_cache *c = NULL, *d = NULL;
            static float k[12 * 64], v[12 * 64];
            int32_t i, l;
            blob bl;
            kvc_mem m;
            kvc_io io;
            kvc_pool_config_init(&pc);
            pc.n_layers = 2;
            pc.n_kv_heads = 2;
            pc.head_dim_k = pc.head_dim_v = 32;
            pc.type_k = types[a];
            pc.type_v = types[b];
            pc.page_cells = 4;
            pc.budget_bytes = 64 * 4 * 2 * 2 * 32 * 4;
            TK_OK(kvc_pool_create(&pc, &p));
            kvc_cache_config_init(&cc, KVC_KIND_FULL);
            TK_OK(kvc_cache_create(p, &cc, &c));
            TK_OK(kvc_cache_create(p, &cc, &d));
            for (i = 0; i < 12 * 64; ++i) {
                k[i] = (float)((i * 37) % 101) / 50.0f - 1.0f;
                v[i] = (float)((i * 53) % 97) / 40.0f - 1.2f;
            }
            TK_OK(kvc_begin(c, 11, NULL, 0));
            for (l = 0; l < 2; ++l) TK_OK(kvc_put(c, l, k, v));
            bl = save_blob(save_cache, c);
            io = mem_reader(&m, &bl);
            TK_OK(kvc_cache_load(d, LF_NS, &io, NULL, 0, NULL));
            TK_EQ(lf_fingerprint(d), lf_fingerprint(c));
            free(bl.data);
            TK_OK(kvc_cache_destroy(c));
            TK_OK(kvc_cache_destroy(d));
            TK_OK(kvc_pool_destroy(p));
        }
}

/* ---- the ios ------------------------------------------------------------------------- */

/* caller callbacks: a byte array written and read in whatever pieces the library asks */
typedef struct cb_buf { unsigned char data[8192]; size_t size, pos, calls; } cb_buf;
static size_t cb_write(void *u, const void *d, size_t n) {
    cb_buf *b = (cb_buf *)u;
    if (n > sizeof(b->data) - b->size) return 0;
    memcpy(b->data + b->size, d, n);
    b->size += n;
    b->calls++;
    return n;
}
static size_t cb_read(void *u, void *d, size_t n) {
    cb_buf *b = (cb_buf *)u;
    size_t k = n < b->size - b->pos ? n : b->size - b->pos;
    memcpy(d, b->data + b->pos, k);
    b->pos += k;
    b->calls++;
    return k;
}
static int g_finished, g_finish_ok;
static int cb_finish(void *u, int ok) { (void)u; g_finished++; g_finish_ok = ok; return 0; }

static void test_ios(void) {
    lf_world a, b;
    cb_buf *cb = (cb_buf *)calloc(1, sizeof(cb_buf));
    kvc_io io;
    kvc_path_io path_state;
    FILE *f;
    char longpath[KVC_PATH_MAX + 2];
    TK_EQ(lf_make(&a, KVC_TYPE_F16, KVC_TYPE_F16, 1), 1);
    TK_EQ(lf_make(&b, KVC_TYPE_F16, KVC_TYPE_F16, 0), 1);
    /* callbacks, with finish told the outcome */
    io.write = cb_write;
    io.read = cb_read;
    io.finish = cb_finish;
    io.user = cb;
    g_finished = 0;
    TK_OK(kvc_cache_save(a.causal, LF_NS, NULL, 0, &io));
    TK_EQ(g_finished, 1);
    TK_EQ(g_finish_ok, 1);
    TK_OK(kvc_cache_load(b.causal, LF_NS, &io, NULL, 0, NULL));
    TK_EQ(g_finished, 2);
    TK_EQ(lf_fingerprint(b.causal), lf_fingerprint(a.causal));
    TK_RES(kvc_cache_load(b.causal, LF_NS, &io, NULL, 0, NULL), KVC_ERR_TRUNCATED); /* input used up */
    TK_EQ(g_finished, 3);
    TK_EQ(g_finish_ok, 0);
    TK_RES(kvc_cache_save(NULL, LF_NS, NULL, 0, &io), KVC_ERR_NULL);   /* finish still called */
    TK_EQ(g_finished, 4);
    /* FILE*: two objects one after the other in one stream */
    f = tmpfile();
    TK_EQ(f != NULL, 1);
    if (f != NULL) {
        TK_OK(kvc_io_stdio(f, &io));
        TK_OK(kvc_cache_save(a.full, LF_NS, g_tokens, 7, &io));
        TK_OK(kvc_cache_save(a.rot, LF_NS, NULL, 0, &io));
        rewind(f);
        TK_OK(kvc_cache_load(b.full, LF_NS, &io, NULL, 0, NULL));
        TK_OK(kvc_cache_load(b.rot, LF_NS, &io, NULL, 0, NULL));
        TK_EQ(lf_fingerprint(b.full), lf_fingerprint(a.full));
        TK_EQ(lf_fingerprint(b.rot), lf_fingerprint(a.rot));
        fclose(f);
    }
    /* a path: written to a temporary file and renamed; a failed save keeps the old file */
    remove(TMP_PATH);
    TK_OK(kvc_io_path(&path_state, TMP_PATH, 1, &io));
    TK_CHECK(strncmp(path_state.tmp, g_tmp_side, strlen(g_tmp_side)) == 0 && strlen(path_state.tmp) == strlen(g_tmp_side) + 16);
    TK_OK(kvc_radix_save(a.tree, LF_NS, (const int32_t[]){100, 101, 102, 103, 104, 105, 106, 107, 108}, 9, &io));
    TK_EQ((f = fopen(path_state.tmp, "rb")) == NULL, 1);
    if (f) fclose(f);
    TK_OK(kvc_io_path(&path_state, TMP_PATH, 1, &io));
    TK_RES(kvc_radix_save(a.tree, LF_NS, (const int32_t[]){1, 2}, 2, &io), KVC_ERR_NOT_FOUND);
    TK_EQ((f = fopen(path_state.tmp, "rb")) == NULL, 1);
    if (f) fclose(f);
    TK_OK(kvc_io_path(&path_state, TMP_PATH, 0, &io));
    TK_OK(kvc_radix_load(b.tree, LF_NS, &io, 0, NULL));
    TK_EQ(path_state.file == NULL, 1);                                  /* closed */
    {
        kvc_radix_stats s;
        kvc_radix_stats_get(b.tree, &s);
        TK_EQ(s.n_entries, 1);
    }
    { /* two saves to one path at once (issue 23: they shared one temporary name, and the
         second failed with KVC_ERR_IO after writing over the first's file): each has its
         own, both succeed, the last to finish wins */
        kvc_path_io s1, s2;
        kvc_io io1, io2;
        TK_OK(kvc_io_path(&s1, TMP_PATH, 1, &io1));
        TK_OK(kvc_io_path(&s2, TMP_PATH, 1, &io2));
        TK_CHECK(strcmp(s1.tmp, s2.tmp) != 0);
        TK_OK(kvc_cache_save(a.full, LF_NS, g_tokens, 7, &io1));
        TK_OK(kvc_cache_save(a.rot, LF_NS, g_tokens, 3, &io2));
        TK_OK(kvc_io_path(&s1, TMP_PATH, 0, &io1));
        TK_OK(kvc_cache_load(b.rot, LF_NS, &io1, NULL, 0, NULL));
        TK_EQ(lf_fingerprint(b.rot), lf_fingerprint(a.rot));
        TK_OK(kvc_cache_clear(b.rot));
    }
    remove(TMP_PATH);
    TK_RES(kvc_io_path(&path_state, TMP_PATH, 0, &io), KVC_ERR_IO);      /* no such file */
    memset(longpath, 'a', sizeof(longpath) - 1);
    longpath[sizeof(longpath) - 1] = 0;
    TK_RES(kvc_io_path(&path_state, longpath, 1, &io), KVC_ERR_RANGE);
    TK_RES(kvc_io_path(&path_state, "", 1, &io), KVC_ERR_INVALID);
    TK_RES(kvc_io_path(NULL, TMP_PATH, 1, &io), KVC_ERR_NULL);
    TK_RES(kvc_io_stdio(NULL, &io), KVC_ERR_NULL);
    TK_RES(kvc_io_memory(NULL, &io), KVC_ERR_NULL);
    TK_RES(kvc_io_memory((kvc_mem *)cb, NULL), KVC_ERR_NULL);
    free(cb);
    lf_free(&a);
    lf_free(&b);
}

/* ---- damage, truncation, mismatch: an error and the target untouched ------------------- */

typedef struct target_state { uint64_t fp; int32_t pages; kvc_radix_stats ts, rs; } target_state;

static target_state snap_state(const lf_world *w, const kvc_cache *c) {
    target_state s;
    s.fp = c ? lf_fingerprint(c) : 0;
    s.pages = pool_pages(w->pool) + pool_pages(w->spool);
    kvc_radix_stats_get(w->tree, &s.ts);
    kvc_radix_stats_get(w->rtree, &s.rs);
    return s;
}
static int same_tree(const kvc_radix_stats *a, const kvc_radix_stats *b) {
    return a->n_nodes == b->n_nodes && a->n_pages == b->n_pages && a->commits == b->commits && a->n_pinned == b->n_pinned;
}
static int same_state(const target_state *a, const target_state *b) {
    return a->fp == b->fp && a->pages == b->pages && same_tree(&a->ts, &b->ts) && same_tree(&a->rs, &b->rs);
}

static int load_error(kvc_result r) {
    return r == KVC_ERR_FORMAT || r == KVC_ERR_CORRUPT || r == KVC_ERR_TRUNCATED || r == KVC_ERR_MISMATCH;
}

/* kind: 0 cache into full, 1 into rot, 2 into causal, 3 seq into causal, 4 entry into tree,
   5 ROTATING entry into rtree, 6 RECURRENT cache into rec.
   The caller's token array and count are g_out_tokens / g_out_n: a load that fails must
   leave them as they were (tokens_kept() checks the sentinel). */
static int32_t g_out_tokens[64], g_out_n;
static void tokens_sentinel(void) {
    int32_t i;
    for (i = 0; i < 64; ++i) g_out_tokens[i] = -7 - i;
    g_out_n = -99;
}
static int tokens_kept(void) {
    int32_t i;
    for (i = 0; i < 64; ++i)
        if (g_out_tokens[i] != -7 - i) return 0;
    return g_out_n == -99;
}
static kvc_result load_into(lf_world *w, int kind, const unsigned char *data, size_t size) {
    kvc_mem m;
    kvc_io io;
    blob b;
    b.data = (unsigned char *)data;
    b.size = size;
    io = mem_reader(&m, &b);
    tokens_sentinel();
    switch (kind) {
    case 0: return kvc_cache_load(w->full, LF_NS, &io, g_out_tokens, 64, &g_out_n);
    case 1: return kvc_cache_load(w->rot, LF_NS, &io, g_out_tokens, 64, &g_out_n);
    case 2: return kvc_cache_load(w->causal, LF_NS, &io, g_out_tokens, 64, &g_out_n);
    case 3: return kvc_seq_load(w->causal, 2, LF_NS, &io, g_out_tokens, 64, &g_out_n);
    case 4: return kvc_radix_load(w->tree, LF_NS, &io, 0, &g_out_n);
    case 5: return kvc_radix_load(w->rtree, LF_NS, &io, 0, &g_out_n);
    default: return kvc_cache_load(w->rec, LF_NS, &io, g_out_tokens, 64, &g_out_n);
    }
}
static kvc_cache *target_of(lf_world *w, int kind) {
    return kind == 0 ? w->full : kind == 1 ? w->rot : kind == 4 || kind == 5 ? NULL : kind == 6 ? w->rec : w->causal;
}

static void test_damage(void) {
    lf_world a, w;
    blob objs[7];
    int kind, bad_err = 0, changed = 0, accepted = 0, truncated_ok = 0, tokens_changed = 0;
    size_t i, len;
    TK_EQ(lf_make(&a, KVC_TYPE_F16, KVC_TYPE_F32, 1), 1);
    TK_EQ(lf_make(&w, KVC_TYPE_F16, KVC_TYPE_F32, 1), 1); /* targets with contents of their own */
    TK_OK(lf_append(w.full, 2, 2, 11));
    objs[0] = save_blob(save_cache, a.full);
    objs[1] = save_blob(save_cache, a.rot);
    objs[2] = save_blob(save_cache, a.causal);
    objs[3] = save_blob(save_seq1, a.causal);
    objs[4] = save_blob(save_entry, a.tree);
    objs[5] = save_blob(save_rentry, a.rtree);
    objs[6] = save_blob(save_cache, a.rec);
    { /* the entries go into trees that lack them */
        int32_t freed;
        TK_OK(kvc_radix_evict(w.tree, 1000, &freed));
        TK_OK(kvc_radix_evict(w.rtree, 1000, &freed));
    }
    for (kind = 0; kind < 7; ++kind) {
        unsigned char *copy = (unsigned char *)malloc(objs[kind].size);
        target_state before = snap_state(&w, target_of(&w, kind)), after;
        for (i = 0; i < objs[kind].size; ++i) { /* every byte, two different damages */
            int flip;
            for (flip = 0; flip < 2; ++flip) {
                kvc_result r;
                memcpy(copy, objs[kind].data, objs[kind].size);
                copy[i] ^= flip ? 0x80 : 0x01;
                r = load_into(&w, kind, copy, objs[kind].size);
                after = snap_state(&w, target_of(&w, kind));
                if (!load_error(r)) { bad_err++; fprintf(stderr, "kind %d byte %zu flip %d: %s\n", kind, i, flip, kvc_strerror(r)); }
                changed += !same_state(&before, &after);
                tokens_changed += r != KVC_OK && !tokens_kept();
            }
        }
        for (len = 0; len < objs[kind].size; ++len) { /* every truncation */
            kvc_result r = load_into(&w, kind, objs[kind].data, len);
            after = snap_state(&w, target_of(&w, kind));
            truncated_ok += r == KVC_ERR_TRUNCATED;
            changed += !same_state(&before, &after);
            tokens_changed += r != KVC_OK && !tokens_kept();
        }
        TK_EQ(truncated_ok, (int)objs[kind].size);
        truncated_ok = 0;
        /* the intact object loads */
        accepted += load_into(&w, kind, objs[kind].data, objs[kind].size) == KVC_OK;
        if (kind == 4) TK_OK(kvc_radix_evict(w.tree, 1000, NULL));
        if (kind == 5) TK_OK(kvc_radix_evict(w.rtree, 1000, NULL));
        free(copy);
    }
    TK_EQ(bad_err, 0);
    TK_EQ(changed, 0);
    TK_EQ(tokens_changed, 0); /* nothing the caller owns changes unless the load succeeds */
    TK_EQ(accepted, 7);
    /* mismatches: another object kind, namespace, window, pool shape, capacity */
    {
        kvc_namespace other = LF_NS;
        kvc_mem m;
        kvc_io io;
        lf_world x;
        kvc_cache *small = NULL;
        kvc_cache_config cc;
        target_state before = snap_state(&w, w.full), after;
        TK_RES(load_into(&w, 0, objs[1].data, objs[1].size), KVC_ERR_MISMATCH); /* rotating into full */
        TK_RES(load_into(&w, 1, objs[0].data, objs[0].size), KVC_ERR_MISMATCH);
        TK_RES(load_into(&w, 0, objs[3].data, objs[3].size), KVC_ERR_MISMATCH); /* a sequence as a cache */
        TK_RES(load_into(&w, 3, objs[2].data, objs[2].size), KVC_ERR_MISMATCH);
        TK_RES(load_into(&w, 4, objs[0].data, objs[0].size), KVC_ERR_MISMATCH); /* a cache as an entry */
        other.salt++;
        io = mem_reader(&m, &objs[0]);
        TK_RES(kvc_cache_load(w.full, other, &io, NULL, 0, NULL), KVC_ERR_MISMATCH);
        after = snap_state(&w, w.full);
        TK_EQ(same_state(&before, &after), 1);
        TK_EQ(lf_make(&x, KVC_TYPE_F32, KVC_TYPE_F32, 0), 1);  /* other storage types */
        io = mem_reader(&m, &objs[0]);
        TK_RES(kvc_cache_load(x.full, LF_NS, &io, NULL, 0, NULL), KVC_ERR_MISMATCH);
        lf_cache_configs(&cc, &cc, &cc);
        cc.capacity = 8;                                       /* cells up to index 10 */
        kvc_cache_create(w.pool, &cc, &small);
        io = mem_reader(&m, &objs[2]);
        TK_RES(kvc_cache_load(small, LF_NS, &io, NULL, 0, NULL), KVC_ERR_MISMATCH);
        cc.max_seqs = 1;                                       /* sequence 1 has no room */
        kvc_cache_destroy(small);
        cc.capacity = 32;
        kvc_cache_create(w.pool, &cc, &small);
        io = mem_reader(&m, &objs[2]);
        TK_RES(kvc_cache_load(small, LF_NS, &io, NULL, 0, NULL), KVC_ERR_MISMATCH);
        kvc_cache_destroy(small);
        lf_free(&x);
    }
    for (kind = 0; kind < 7; ++kind) free(objs[kind].data);
    lf_free(&a);
    lf_free(&w);
}

/* ---- checkpoints (issue 36): saved with ROTATING and RECURRENT caches ---------------- */

/* Variant v: 0, 1 ROTATING (window 6, sinks 0 / 2), 2, 3 RECURRENT (sequence 0; reserve
   0 / 2). Every cache keeps up to 4 named checkpoints. */
#define CK_VARIANTS 4
static kvc_pool *ck_pool(int v) {
    kvc_pool_config pc;
    kvc_pool *p = NULL;
    if (v < 2) return lf_pool(KVC_TYPE_F16, KVC_TYPE_F32);
    kvc_pool_config_init(&pc);
    pc.n_layers = LF_LAYERS;
    pc.state_floats = LF_STATE;
    pc.budget_bytes = (size_t)64 * LF_LAYERS * (LF_STATE + 1) * 4;
    TK_OK(kvc_pool_create(&pc, &p));
    return p;
}
static kvc_cache *ck_cache(kvc_pool *p, int v) {
    kvc_cache_config cc;
    kvc_cache *c = NULL;
    kvc_cache_config_init(&cc, v < 2 ? KVC_KIND_ROTATING : KVC_KIND_RECURRENT);
    if (v < 2) {
        cc.window = 6;
        cc.sinks = 2 * v;
    }
    cc.checkpoints = 4;
    cc.reserve = v == 3 ? 2 : 0;
    TK_OK(kvc_cache_create(p, &cc, &c));
    return c;
}
/* One batch of n tokens naming at[0 .. n_at) (RECURRENT: every offset inside the batch is
   handed over; those not asked for are refused harmlessly, KVC_ERR_RANGE). */
static kvc_result ck_feed(kvc_cache *c, int32_t n, const int32_t *at, int32_t n_at, int salt) {
    int32_t pos[64], off = 0, l, t, i;
    kvc_result r;
    kvc_cache_offset(c, &off);
    for (i = 0; i < n; ++i) pos[i] = off + i;
    if ((r = kvc_begin(c, n, at, n_at)) != KVC_OK) return r;
    if (c->cfg.kind != KVC_KIND_RECURRENT) return lf_put_all(c, n, pos, salt);
    for (l = 0; l < LF_LAYERS; ++l) {
        float *st;
        if ((r = kvc_state(c, 0, l, &st)) != KVC_OK) return r;
        for (t = off; t < off + n; ++t) {
            for (i = 0; i < LF_STATE; ++i) st[i] = st[i] * 0.5f + lf_val(0, l, t, i, salt);
            r = t + 1 < off + n ? kvc_state_checkpoint(c, l, t + 1, st) : KVC_OK;
            if (r != KVC_OK && r != KVC_ERR_NOT_FOUND) return r; /* (one not asked for) */
        }
    }
    return KVC_OK;
}
/* The history every test cache goes through (19 tokens; ROTATING: wrapped). */
static void ck_build(kvc_cache *c, int salt) {
    static const int32_t n[6] = {5, 3, 6, 1, 3, 1}, n_at[6] = {2, 2, 2, 0, 1, 0};
    static const int32_t at[6][2] = {{2, 4}, {7, 8}, {10, 12}, {0, 0}, {17, 0}, {0, 0}};
    int32_t b;
    for (b = 0; b < 6; ++b) TK_OK(ck_feed(c, n[b], at[b], n_at[b], salt));
}
static int32_t ck_list(const kvc_cache *c, int32_t *at) {
    int32_t n = 0;
    TK_OK(kvc_cache_checkpoints(c, at, 16, &n));
    return n;
}
static blob ck_blob(kvc_cache *c) { return save_blob(save_cache, c); }
static void ck_load(kvc_cache *c, const blob *b) {
    kvc_mem m;
    kvc_io io = mem_reader(&m, b);
    TK_OK(kvc_cache_load(c, LF_NS, &io, NULL, 0, NULL));
}

/* Save, load into a cache with a history of its own, and every checkpoint the saved
   cache had is there: a rewind to each gives the bits a cache that never saved has
   there, and both go on alike. The load shares pages as the saved cache did. */
static void roundtrip_checkpoints(void) {
    int v;
    for (v = 0; v < CK_VARIANTS; ++v) {
        kvc_pool *p = ck_pool(v);
        kvc_cache *a = ck_cache(p, v), *b = ck_cache(p, v);
        int32_t at_a[16], at_b[16], na, nb, j, pages_a;
        blob bl;
        ck_build(a, 1);
        pages_a = pool_pages(p);
        bl = ck_blob(a);
        na = ck_list(a, at_a);
        TK_EQ(na >= 3, 1);
        TK_EQ(na <= 4 + 3, 1); /* the named ones, and a reserve's R + 1 */
        ck_load(b, &bl);
        nb = ck_list(b, at_b);
        TK_EQ(nb, na);
        TK_EQ(memcmp(at_a, at_b, sizeof(int32_t) * (size_t)na), 0);
        TK_EQ(lf_fingerprint(b), lf_fingerprint(a));
        TK_EQ(pool_pages(p), 2 * pages_a); /* the checkpoints' pages shared as in a */
        TK_OK(kvc_cache_destroy(b));
        b = ck_cache(p, v);
        ck_build(b, 2); /* a history of its own, checkpoints too: replaced */
        ck_load(b, &bl);
        TK_EQ(ck_list(b, at_b), na);
        TK_EQ(memcmp(at_a, at_b, sizeof(int32_t) * (size_t)na), 0);
        TK_EQ(pool_pages(p), 2 * pages_a);
        for (j = 0; j < na; ++j) { /* each checkpoint, against a cache that never saved */
            kvc_cache *ref = ck_cache(p, v), *got = ck_cache(p, v);
            int32_t next = at_a[j] + 2, x[16], y[16];
            ck_build(ref, 1);
            ck_load(got, &bl);
            TK_OK(kvc_cache_restore(ref, NULL, at_a[j]));
            TK_OK(kvc_cache_restore(got, NULL, at_a[j]));
            TK_EQ(lf_fingerprint(got), lf_fingerprint(ref));
            TK_EQ(ck_list(got, y), ck_list(ref, x));
            TK_EQ(memcmp(x, y, sizeof(int32_t) * (size_t)ck_list(ref, x)), 0);
            TK_OK(ck_feed(ref, 3, &next, 1, 3)); /* on alike, and back to the new checkpoint */
            TK_OK(ck_feed(got, 3, &next, 1, 3));
            TK_EQ(lf_fingerprint(got), lf_fingerprint(ref));
            TK_OK(kvc_cache_restore(ref, NULL, next));
            TK_OK(kvc_cache_restore(got, NULL, next));
            TK_EQ(lf_fingerprint(got), lf_fingerprint(ref));
            TK_OK(kvc_cache_destroy(ref));
            TK_OK(kvc_cache_destroy(got));
        }
        TK_OK(kvc_cache_destroy(a));
        TK_OK(kvc_cache_destroy(b));
        TK_EQ(pool_pages(p), 0); /* nothing leaked */
        TK_OK(kvc_pool_destroy(p));
        free(bl.data);
    }
}

/* A load replaces the target's checkpoints: a file of a cache without any leaves none
   (the old code kept the replaced history's, past the new offset). */
static void load_drops_checkpoints(void) {
    kvc_pool *p = ck_pool(0);
    kvc_cache *a = ck_cache(p, 0), *b = ck_cache(p, 0);
    int32_t at[16];
    blob bl;
    TK_OK(lf_append(a, 5, 5, 1)); /* no checkpoints */
    bl = ck_blob(a);
    ck_build(b, 2);
    TK_EQ(ck_list(b, at) > 0, 1);
    ck_load(b, &bl);
    TK_EQ(ck_list(b, at), 0);
    TK_RES(kvc_cache_restore(b, NULL, 12), KVC_ERR_UNREACHABLE);
    TK_EQ(lf_fingerprint(b), lf_fingerprint(a));
    free(bl.data);
    TK_OK(kvc_cache_destroy(a));
    TK_OK(kvc_cache_destroy(b));
    TK_OK(kvc_pool_destroy(p));
}

/* A model memory (ROTATING + RECURRENT groups) keeps its checkpoints through a save. */
static void roundtrip_memory_checkpoints(void) {
    kvc_memory_config mc;
    kvc_group_config gc[2];
    kvc_memory *a = NULL, *b = NULL;
    int32_t layer_group[2] = {0, 1}, at = 3, i, l, na, nb, ata[8], atb[8], off = 0;
    kvc_mem m;
    kvc_io io;
    blob bl;
    kvc_memory_config_init(&mc);
    mc.n_layers = 2;
    mc.layer_group = layer_group;
    mc.n_groups = 2;
    memset(gc, 0, sizeof(gc));
    mc.groups = gc;
    gc[0].pool.n_layers = 1;
    gc[0].pool.n_kv_heads = LF_HEADS;
    gc[0].pool.head_dim_k = LF_HK;
    gc[0].pool.head_dim_v = LF_HV;
    gc[0].pool.page_cells = LF_PAGE;
    kvc_cache_config_init(&gc[0].cache, KVC_KIND_ROTATING);
    gc[0].cache.window = 5;
    gc[1].pool.n_layers = 1;
    gc[1].pool.state_floats = LF_STATE;
    kvc_cache_config_init(&gc[1].cache, KVC_KIND_RECURRENT);
    mc.budget_bytes = 1 << 20;
    TK_OK(kvc_memory_create(&mc, &a));
    TK_OK(kvc_memory_create(&mc, &b));
    for (i = 0; i < 4; ++i, at += 4) { /* batches of 4 tokens, a checkpoint inside each */
        float k[4 * LF_HEADS * LF_HK], v[4 * LF_HEADS * LF_HV], *st;
        int32_t t;
        TK_OK(kvc_memory_begin(a, 4, &at, 1));
        for (t = 0; t < 4 * LF_HEADS * LF_HK; ++t) k[t] = lf_val(0, 0, off, t, i);
        for (t = 0; t < 4 * LF_HEADS * LF_HV; ++t) v[t] = lf_val(1, 0, off, t, i);
        TK_OK(kvc_memory_put(a, 0, k, v));
        TK_OK(kvc_memory_state(a, 1, 0, &st));
        for (t = off; t < off + 4; ++t) {
            for (l = 0; l < LF_STATE; ++l) st[l] += lf_val(0, 1, t, l, i);
            if (t + 1 == at) TK_OK(kvc_memory_state_checkpoint(a, 1, at, st));
        }
        off += 4;
    }
    bl.data = NULL;
    {
        kvc_memory_stats sa, sb;
        memset(&m, 0, sizeof(m));
        TK_OK(kvc_io_memory(&m, &io));
        TK_OK(kvc_memory_save(a, LF_NS, g_tokens, 16, &io));
        bl.data = (unsigned char *)malloc(m.size);
        bl.size = m.capacity = m.size;
        m.data = bl.data;
        m.size = 0;
        TK_OK(kvc_memory_save(a, LF_NS, g_tokens, 16, &io));
        io = mem_reader(&m, &bl);
        TK_OK(kvc_memory_load(b, LF_NS, &io, NULL, 0, NULL));
        TK_OK(kvc_memory_stats_get(a, &sa));
        TK_OK(kvc_memory_stats_get(b, &sb));
        TK_EQ(sb.n_checkpoints, sa.n_checkpoints);
        TK_EQ(sa.n_checkpoints >= 3, 1);
    }
    for (i = 0; i < 2; ++i) {
        kvc_cache *ca = a->cache[i], *cb = b->cache[i];
        na = ck_list(ca, ata);
        nb = ck_list(cb, atb);
        TK_EQ(na, nb);
        TK_EQ(memcmp(ata, atb, sizeof(int32_t) * (size_t)na), 0);
    }
    TK_OK(kvc_memory_restore(a, NULL, 7)); /* back to a checkpoint in both groups */
    TK_OK(kvc_memory_restore(b, NULL, 7));
    for (i = 0; i < 2; ++i) TK_EQ(lf_fingerprint(b->cache[i]), lf_fingerprint(a->cache[i]));
    free(bl.data);
    TK_OK(kvc_memory_destroy(a));
    TK_OK(kvc_memory_destroy(b));
}

/* Every damaged byte and every truncation of a cache saved with checkpoints is an
   error, and the target (contents, checkpoints, the pool's pages) stays as it was. A
   CONF flag this version does not know is KVC_ERR_FORMAT. */
static void damage_checkpoints(void) {
    int v;
    for (v = 0; v < CK_VARIANTS; v += 1) {
        kvc_pool *p = ck_pool(v);
        kvc_cache *a = ck_cache(p, v), *t = ck_cache(p, v);
        unsigned char *copy;
        int32_t before_at[16], after_at[16], n_before, pages, bad = 0, changed = 0, trunc = 0, j;
        uint64_t fp;
        size_t i, len;
        blob bl;
        ck_build(a, 1);
        bl = ck_blob(a);
        ck_build(t, 2);
        n_before = ck_list(t, before_at);
        fp = lf_fingerprint(t);
        pages = pool_pages(p);
        copy = (unsigned char *)malloc(bl.size);
        for (i = 0; i < bl.size; ++i) {
            int flip;
            for (flip = 0; flip < 2; ++flip) {
                kvc_mem m;
                kvc_io io;
                blob d;
                kvc_result r;
                memcpy(copy, bl.data, bl.size);
                copy[i] ^= flip ? 0x80 : 0x01;
                d.data = copy;
                d.size = bl.size;
                io = mem_reader(&m, &d);
                r = kvc_cache_load(t, LF_NS, &io, NULL, 0, NULL);
                bad += !load_error(r);
                changed += lf_fingerprint(t) != fp || pool_pages(p) != pages || ck_list(t, after_at) != n_before ||
                           memcmp(before_at, after_at, sizeof(int32_t) * (size_t)n_before) != 0;
            }
        }
        for (len = 0; len < bl.size; ++len) {
            kvc_mem m;
            kvc_io io;
            blob d;
            d.data = bl.data;
            d.size = len;
            io = mem_reader(&m, &d);
            trunc += kvc_cache_load(t, LF_NS, &io, NULL, 0, NULL) == KVC_ERR_TRUNCATED;
            changed += lf_fingerprint(t) != fp || pool_pages(p) != pages || ck_list(t, after_at) != n_before;
        }
        TK_EQ(bad, 0);
        TK_EQ(changed, 0);
        TK_EQ(trunc, (int32_t)bl.size);
        for (j = 0; j < 2; ++j) { /* CONF word 15 bit 2: a flag of a later format; bit 1 (a TAIL
                                     section) on a pool with no quantized side: damaged
                                     (checksum made right) */
            kvc_mem m;
            kvc_io io;
            blob d;
            memcpy(copy, bl.data, bl.size);
            tk_put32(copy + 32 + 60, (j ? 2u : 4u) | tk_le32(copy + 32 + 60));
            tk_put64(copy + 112, tk_xxh64(copy + 16, 96));
            d.data = copy;
            d.size = bl.size;
            io = mem_reader(&m, &d);
            TK_RES(kvc_cache_load(t, LF_NS, &io, NULL, 0, NULL), j ? KVC_ERR_CORRUPT : KVC_ERR_FORMAT);
            TK_EQ(lf_fingerprint(t), fp);
        }
        free(copy);
        free(bl.data);
        TK_OK(kvc_cache_destroy(a));
        TK_OK(kvc_cache_destroy(t));
        TK_EQ(pool_pages(p), 0);
        TK_OK(kvc_pool_destroy(p));
    }
}

/* A 248-byte ROTATING entry with valid checksums declaring 2^31 tokens (issue 23): the
   loader must not ask for memory by the declared count before the tokens are there. A
   counting allocator records the largest block the load asked for. */
static size_t g_max_ask;
static void *ask_alloc(size_t n, void *user) { (void)user; if (n > g_max_ask) g_max_ask = n; return n > ((size_t)1 << 30) ? NULL : malloc(n); }
static void ask_free(void *p, void *user) { (void)user; free(p); }
static void test_crafted_entry(void) {
    lf_world a;
    blob entry, crafted;
    kvc_pool_config pc;
    kvc_pool *p = NULL;
    kvc_radix_config rc;
    kvc_radix *t = NULL;
    kvc_cache_config f, r, c;
    kvc_radix_stats before, after;
    unsigned char buf[LF_CRAFTED_BYTES];
    int32_t n = -3;
    TK_EQ(lf_make(&a, KVC_TYPE_F16, KVC_TYPE_F32, 1), 1);
    entry = save_blob(save_rentry, a.rtree);
    TK_CHECK(entry.size > 120);
    lf_craft_rotating_entry(entry.data, buf);
    crafted.data = buf;
    crafted.size = sizeof(buf);
    kvc_pool_config_init(&pc); /* the fixture's pool with a counting allocator */
    pc.n_layers = LF_LAYERS; pc.n_kv_heads = LF_HEADS; pc.head_dim_k = LF_HK; pc.head_dim_v = LF_HV;
    pc.type_k = KVC_TYPE_F16; pc.type_v = KVC_TYPE_F32; pc.page_cells = LF_PAGE;
    TK_OK(kvc_pool_budget_for_tokens(&pc, LF_PAGES * LF_PAGE, &pc.budget_bytes));
    pc.runtime.allocator.alloc = ask_alloc;
    pc.runtime.allocator.free = ask_free;
    TK_OK(kvc_pool_create(&pc, &p));
    lf_cache_configs(&f, &r, &c);
    kvc_radix_config_init(&rc, KVC_KIND_ROTATING);
    rc.cache.window = r.window;
    rc.cache.sinks = r.sinks;
    TK_OK(kvc_radix_create(p, &rc, &t));
    if (t != NULL) {
        kvc_mem m;
        kvc_io io = mem_reader(&m, &crafted);
        TK_OK(kvc_radix_stats_get(t, &before));
        g_max_ask = 0;
        TK_RES(kvc_radix_load(t, LF_NS, &io, 0, &n), KVC_ERR_TRUNCATED);
        printf("crafted 248-byte rotating entry: largest block asked for %lu bytes\n", (unsigned long)g_max_ask);
        TK_CHECK(g_max_ask <= 64 * 1024); /* before: 8589934528 */
        TK_EQ(n, -3);
        TK_OK(kvc_radix_stats_get(t, &after));
        TK_EQ(same_tree(&before, &after), 1);
        TK_EQ(pool_pages(p), 0);
        TK_OK(kvc_radix_destroy(t));
    }
    TK_OK(kvc_pool_destroy(p));
    free(entry.data);
    lf_free(&a);
}

/* Bad arguments and states: an error, nothing changed. */
static void test_errors(void) {
    lf_world a, w;
    blob b;
    kvc_mem m;
    kvc_io io, noread;
    int32_t toks[4], n = -1;
    target_state before, after;
    TK_EQ(lf_make(&a, KVC_TYPE_F16, KVC_TYPE_F16, 1), 1);
    TK_EQ(lf_make(&w, KVC_TYPE_F16, KVC_TYPE_F16, 0), 1);
    b = save_blob(save_cache, a.full);
    before = snap_state(&w, w.full);
    TK_RES(kvc_cache_save(a.full, LF_NS, NULL, 0, NULL), KVC_ERR_NULL);
    TK_RES(kvc_cache_load(w.full, LF_NS, NULL, NULL, 0, NULL), KVC_ERR_NULL);
    io = mem_reader(&m, &b);
    TK_RES(kvc_cache_load(NULL, LF_NS, &io, NULL, 0, NULL), KVC_ERR_NULL);
    TK_RES(kvc_cache_load(w.full, LF_NS, &io, toks, -1, NULL), KVC_ERR_INVALID);
    io = mem_reader(&m, &b);
    TK_RES(kvc_cache_load(w.full, LF_NS, &io, toks, 4, &n), KVC_ERR_RANGE); /* 7 tokens saved */
    TK_EQ(n, 7);
    memset(&noread, 0, sizeof(noread));
    TK_RES(kvc_cache_load(w.full, LF_NS, &noread, NULL, 0, NULL), KVC_ERR_NULL);
    TK_RES(kvc_cache_save(a.full, LF_NS, NULL, 0, &noread), KVC_ERR_NULL);
    TK_RES(kvc_cache_save(a.full, LF_NS, NULL, 3, &io), KVC_ERR_NULL);
    TK_RES(kvc_cache_save(a.full, LF_NS, toks, -3, &io), KVC_ERR_INVALID);
    TK_OK(kvc_begin(w.full, 1, NULL, 0));
    io = mem_reader(&m, &b);
    TK_RES(kvc_cache_load(w.full, LF_NS, &io, NULL, 0, NULL), KVC_ERR_STATE);
    TK_RES(kvc_cache_save(w.full, LF_NS, NULL, 0, &io), KVC_ERR_STATE);
    TK_OK(kvc_cancel(w.full));
    after = snap_state(&w, w.full);
    TK_EQ(same_state(&before, &after), 1);
    /* a memory io too small for the save */
    {
        unsigned char small[40];
        memset(&m, 0, sizeof(m));
        m.data = small;
        m.capacity = sizeof(small);
        kvc_io_memory(&m, &io);
        TK_RES(kvc_cache_save(a.full, LF_NS, NULL, 0, &io), KVC_ERR_IO);
    }
    /* sequences */
    io = mem_reader(&m, &b);
    TK_RES(kvc_seq_save(a.full, 0, LF_NS, NULL, 0, &io), KVC_ERR_UNSUPPORTED);
    TK_RES(kvc_seq_save(a.causal, 9, LF_NS, NULL, 0, &io), KVC_ERR_RANGE);
    TK_RES(kvc_seq_save(a.causal, 3, LF_NS, NULL, 0, &io), KVC_ERR_NOT_FOUND);
    TK_RES(kvc_seq_load(w.causal, -1, LF_NS, &io, NULL, 0, NULL), KVC_ERR_RANGE);
    TK_RES(kvc_seq_load(w.full, 0, LF_NS, &io, NULL, 0, NULL), KVC_ERR_UNSUPPORTED);
    /* a pool without free pages for the staging: FULL, nothing changed */
    {
        kvc_cache *hog = NULL;
        kvc_cache_config cc;
        kvc_pool_stats ps;
        kvc_cache_config_init(&cc, KVC_KIND_FULL);
        TK_OK(kvc_cache_create(w.pool, &cc, &hog));
        kvc_pool_stats_get(w.pool, &ps);
        TK_OK(lf_append(hog, (ps.pages_total - ps.pages_used) * LF_PAGE, 16, 1));
        TK_EQ(pool_pages(w.pool), ps.pages_total);
        before = snap_state(&w, w.full);
        io = mem_reader(&m, &b);
        TK_RES(kvc_cache_load(w.full, LF_NS, &io, NULL, 0, NULL), KVC_ERR_FULL);
        after = snap_state(&w, w.full);
        TK_EQ(same_state(&before, &after), 1);
        TK_OK(kvc_cache_destroy(hog));
    }
    TK_RES(kvc_radix_load(NULL, LF_NS, &io, 0, NULL), KVC_ERR_NULL);
    TK_RES(kvc_radix_save(NULL, LF_NS, toks, 1, &io), KVC_ERR_NULL);
    free(b.data);
    lf_free(&a);
    lf_free(&w);
}

/* ---- the fuzz target's seed corpus --------------------------------------------------- */

static int write_file(const char *dir, const char *name, const unsigned char *d, size_t n) {
    char path[1024];
    kvc_path_io st;
    kvc_io io;
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    if (kvc_io_path(&st, path, 1, &io) != KVC_OK) return 1;
    if (io.write(io.user, d, n) != n) { io.finish(io.user, 0); return 1; }
    return io.finish(io.user, 1);
}

static int write_corpus(const char *dir) {
    lf_world a;
    blob objs[9];
    const char *names[9] = {"full.kvc", "rotating.kvc", "causal.kvc", "sequence.kvc", "entry.kvc",
                            "rotating-entry.kvc", "recurrent.kvc", "rotating-checkpoints.kvc",
                            "recurrent-checkpoints.kvc"};
    unsigned char crafted[LF_CRAFTED_BYTES];
    int k, bad = 0;
    unsigned char *copy;
    char name[64];
    if (!lf_make(&a, KVC_TYPE_F16, KVC_TYPE_F32, 1)) return 1;
    objs[0] = save_blob(save_cache, a.full);
    objs[1] = save_blob(save_cache, a.rot);
    objs[2] = save_blob(save_cache, a.causal);
    objs[3] = save_blob(save_seq1, a.causal);
    objs[4] = save_blob(save_entry, a.tree);
    objs[5] = save_blob(save_rentry, a.rtree);
    objs[6] = save_blob(save_cache, a.rec);
    for (k = 7; k < 9; ++k) { /* with checkpoints (issue 36): the fixture's rot and rec take them */
        kvc_pool *p = ck_pool(k == 7 ? 1 : 3);
        kvc_cache *c = ck_cache(p, k == 7 ? 1 : 3);
        ck_build(c, 1);
        objs[k] = save_blob(save_cache, c);
        kvc_cache_destroy(c);
        kvc_pool_destroy(p);
    }
    lf_craft_rotating_entry(objs[5].data, crafted); /* issue 23: 2^31 tokens declared, 16 there */
    bad |= write_file(dir, "crafted-rotating-entry.kvc", crafted, sizeof(crafted));
    for (k = 0; k < 9; ++k) {
        bad |= write_file(dir, names[k], objs[k].data, objs[k].size);
        copy = (unsigned char *)malloc(objs[k].size);
        memcpy(copy, objs[k].data, objs[k].size);
        copy[objs[k].size / 2] ^= 0x10; /* damaged in the middle of the data */
        snprintf(name, sizeof(name), "damaged-%s", names[k]);
        bad |= write_file(dir, name, copy, objs[k].size);
        snprintf(name, sizeof(name), "truncated-%s", names[k]);
        bad |= write_file(dir, name, objs[k].data, objs[k].size * 2 / 3);
        free(copy);
        free(objs[k].data);
    }
    lf_free(&a);
    return bad;
}

int main(int argc, char **argv) {
    int32_t i;
    if (argc > 2 && strcmp(argv[1], "--write-corpus") == 0) return write_corpus(argv[2]);
    if (argc > 0 && strlen(argv[0]) + 5 < sizeof(g_tmp_path)) sprintf(g_tmp_path, "%s.tmp", argv[0]);
    sprintf(g_tmp_side, "%s.kvctmp-", g_tmp_path);
    for (i = 0; i < 64; ++i) g_tokens[i] = 1000 + 3 * i;
    roundtrip_linear(KVC_TYPE_F32, KVC_TYPE_F32);
    roundtrip_linear(KVC_TYPE_F16, KVC_TYPE_F32);
    roundtrip_linear(KVC_TYPE_F16, KVC_TYPE_F16);
    roundtrip_rotating_states();
    roundtrip_types();
    roundtrip_causal();
    roundtrip_entry();
    roundtrip_rotating_entry();
    test_ios();
    test_damage();
    roundtrip_checkpoints();
    load_drops_checkpoints();
    roundtrip_memory_checkpoints();
    damage_checkpoints();
    test_crafted_entry();
    test_errors();
    return tk_report("persist");
}
