/* kvcache.h - v0.2.0 - a key/value cache for LLM inference engines, in one C99 header.

   Storage, bookkeeping, attention over the cache, snapshots and prefix reuse for the
   key/value cache of a transformer, with no dependency beyond libc and libm.

   USAGE
     In exactly one C or C++ file:
         #define KVCACHE_IMPLEMENTATION
         #include "kvcache.h"
     Everywhere else just #include "kvcache.h".

   CONFIGURATION MACROS (define before the #include that has KVCACHE_IMPLEMENTATION)
     KVCACHE_STATIC             make every function static (private to that file).
     KVCACHE_MALLOC(sz, user)   allocator used when the pool config names none;
     KVCACHE_FREE(ptr, user)    define both or neither (default: malloc / free).
     KVCACHE_ASSERT(x)          internal consistency checks (default: assert).
     KVCACHE_NO_STDIO           leave out kvc_io_stdio / kvc_io_path (no <stdio.h>).
     KVCACHE_NO_SIMD            compile only the scalar C paths.
     KVCACHE_HUGE_PAGES         on Linux, ask for transparent huge pages under a pool's
                                slab from malloc (madvise MADV_HUGEPAGE; off by default:
                                faster attention over large caches, but it can slow the
                                host program's own memory work - see "Resident memory").
     KVCACHE_NO_HUGE_PAGES      never ask (the default; wins over KVCACHE_HUGE_PAGES).
     KVCACHE_THREADS            also compile the small pthread helper (kvc_threads_*).
     KVCACHE_THREADS_SPIN       how many times (default 20000) its idle threads poll
                                for the next job before they sleep (0: sleep at once).
     KVCACHE_IO_CHUNK           bytes (default 8 MiB, at least a page) that saves and
                                loads of device pools (kvc_page_hooks.read_pages /
                                write_pages) move at once: the host memory they stage in.

   THE MODEL IN ONE PARAGRAPH
     A kvc_pool owns every K/V byte, cut into pages of `page_cells` token slots
     (a page holds those slots for every layer). Pages are reference counted and
     the pool never takes more than its byte budget. A kvc_cache is a policy over
     pages: FULL (append-only, grows page by page) or ROTATING (a sliding window of
     W tokens plus optional attention-sink tokens). A kvc_snapshot shares the pages
     it covers with the cache it came from; writing into a shared page copies that
     page first (copy-on-write), so a snapshot never changes under you and costs
     O(pages). kvc_prefix is the single-entry prompt reuse of ollama's MLX runner;
     kvc_radix is a prefix tree on the pool's pages shared by many conversations.
     kvc_*_save / kvc_*_load persist caches, sequences and tree entries.
     kvc_tier_* put a host-RAM tier and a store (a directory, or your callbacks)
     under a tree: what it evicts goes down, kvc_tier_fetch brings it back exact.
     Hybrid models: a RECURRENT cache keeps a fixed-size state per layer and
     sequence on a state pool and goes back only to checkpoints; a kvc_memory puts
     each group of a model's layers (full, sliding, recurrent) in its own pool and
     cache under one budget, every operation all or nothing across the groups.

   A FORWARD PASS
       kvc_begin(cache, n_tokens, NULL, 0);      // reserve cells for the new tokens
       for (layer = 0; layer < n_layers; ++layer) {
           ... compute q, k, v for the n_tokens (rope applied) ...
           kvc_put(cache, layer, k, v);          // [n_tokens][kv_heads][head_dim] f32
           kvc_attention(cache, layer, &attn);   // q over every cell it may see
       }
     Positions of full and rotating caches are the token indices 0, 1, 2, ...;
     kvc_begin_at(cache, pos, n_tokens) is kvc_begin that first checks the engine's
     own position against the cache's offset.

   CONTENTS
     Public API (core first):        Implementation:
       Result codes                    Layer 0   results, sizes, half floats; the storage
       Storage types                             type table; CPU paths
       Pool                            Layer 1a  memory: allocator or arena heap
       Caches                          Layer 1b  the pool of pages
       A forward pass                  Layer 2   cells and page tables
       Attention                       Layer 3   cache kinds (FULL, ROTATING)
       Snapshots                       Layer 3b  the CAUSAL kind
       Single-entry prefix reuse       Layer 3c  the RECURRENT kind
       Radix prefix cache              Layer 4   snapshots
       Persistence                     Layer 4b  checkpoints
       Hybrid models: recurrent        Layer 4c  model memories
         state, checkpoints, memories  Layer 5   single-entry prefix reuse
     Advanced parts:                   Layer 5b  the radix prefix tree
       Views                           Layer 6   attention kernels, the attention
       CAUSAL: sequences, masks                  driver, the pthread helper
       Threads (pthread helper)        Views     runs and gather
       CPU paths                       Layer 7   persistence
       Page events
     Tiers (after the hybrid models):  Layer 9   tiers: keys, host tier, stores

   CONVENTIONS
     Every fallible function returns a kvc_result (KVC_OK == 0) and validates all of
     its arguments before it changes anything: after an error the objects are exactly
     as they were. (kvc_strerror, kvc_type_name, kvc_threads_parallel_for and the
     kvc_mutex callbacks cannot fail.)

   NAMING RULE
     kvc_<object>_<verb>: the object is the type of the first argument -- pool, cache,
     snapshot, prefix, radix, memory, seq (a CAUSAL cache's sequence), io, threads,
     mutex -- and the verb says what happens to it (kvc_cache_trim, kvc_radix_evict,
     kvc_memory_restore). A call on a model memory is its cache call with kvc_memory_
     in front and the same arguments after the object (kvc_cache_trim /
     kvc_memory_trim, kvc_begin / kvc_memory_begin, kvc_snapshot_take /
     kvc_memory_snapshot_take; one exception kept: kvc_state takes (seq, layer),
     kvc_memory_state (layer, seq) -- both are int32_t, so swapping one would still
     compile in every engine that calls it and read the wrong state). The tree and
     prefix calls over a memory end in _memory (kvc_radix_commit_memory) and sit with
     their family.
     Short forms, as stb keeps its hot calls short: the calls of a forward pass on a
     cache drop the object -- kvc_begin (and its CAUSAL and checked forms
     kvc_begin_batch, kvc_begin_at), kvc_put, kvc_attention, kvc_cancel, and a
     recurrent layer's kvc_state, kvc_state_read, kvc_state_checkpoint,
     kvc_batch_checkpoints. Everything else names its object.
     Objects are made by kvc_<object>_create (kvc_<object>_destroy; a NULL object is
     KVC_ERR_NULL, except the *_free calls, where NULL is fine), from a
     kvc_<object>_config that kvc_<object>_config_init fills with zeros and defaults
     and kvc_<object>_config_check checks as create would, naming the first field
     refused. Results come back through the last arguments (out pointers); getters
     are kvc_<object>_<what> (kvc_cache_offset) or kvc_<object>_stats_get. One call
     with one more argument replaces parallel calls (kvc_begin's checkpoints,
     kvc_snapshot_take's `at`, kvc_radix_commit's priority: NULL / 0 / KVC_POS_END
     for the plain case). tools/api_rename.py moves code from older names.

   INDEX (one line per public function; details at each declaration)
     The forward pass
       kvc_pool_config_init(cfg)                   zeros and defaults
       kvc_pool_config_check(cfg, &field)          what kvc_pool_create would say, and which field
       kvc_pool_create(cfg, &pool)                 every K/V byte, in pages, under a budget
       kvc_pool_destroy(pool)
       kvc_pool_stats_get(pool, &stats)            sizes, pages in use and peak, live objects
       kvc_pool_page_bytes(cfg, &bytes)            one page of every layer
       kvc_pool_budget_for_tokens(cfg, n, &bytes)  the budget that holds n tokens
       kvc_pool_budget_for_states(cfg, n, &bytes)  the budget that holds n recurrent states
       kvc_pool_arena_bytes(cfg, &bytes)           the caller-owned block arena mode needs
       kvc_cache_config_init(cfg, kind)            FULL, ROTATING, CAUSAL, RECURRENT
       kvc_cache_config_check(pool, cfg, &field)
       kvc_cache_create(pool, cfg, &cache)
       kvc_cache_destroy(cache)
       kvc_cache_fork(cache, &copy)                shares every page
       kvc_cache_clear(cache)
       kvc_cache_offset(cache, &offset)            tokens held: the next position
       kvc_cache_cells(cache, &n)                  cells a kernel reads now
       kvc_cache_pages(cache, &n)
       kvc_begin(cache, n_tokens, at, n_at)        reserve a batch (at: checkpoints, or NULL, 0)
       kvc_begin_at(cache, pos, n_tokens)          kvc_begin, checking the engine's position
       kvc_put(cache, layer, k, v)                 write a layer's K/V of the batch
       kvc_attention(cache, layer, &desc)          attention of q over the cache
       kvc_attention_scratch_bytes(cache, &desc, &bytes)
       kvc_cancel(cache)                           abandon the open batch
       kvc_cache_trim(cache, n)                    drop the last n tokens
       kvc_cache_can_trim(cache, &ok)              whether a trim by one token succeeds
       kvc_cache_can_rewind(cache, target, &ok)    whether a trim / restore to target succeeds
       kvc_cache_checkpoints(cache, at, max, &n)   the offsets it keeps checkpoints at
       kvc_snapshot_take(cache, from, at, &snap)   [from, at) sharing pages (at: KVC_POS_END)
       kvc_cache_restore(cache, snap, target)      back to target (snap NULL: the live state)
       kvc_snapshot_merge(cache, a, b, &ab)
       kvc_snapshot_split(cache, snap, at, &a, &b)
       kvc_snapshot_info_get(snap, &info)          span, pages, bytes
       kvc_snapshot_free(snap)
     Reuse of prefixes
       kvc_prefix_create(caches, n, max_tokens, &px)  single-entry reuse (ollama's MLX runner)
       kvc_prefix_create_memory(mem, max_tokens, &px)
       kvc_prefix_destroy(px)
       kvc_prefix_begin(px, tokens, n, &n_reused)  trim the caches to the common prefix
       kvc_prefix_close(px, generated, n)          record prompt + generated tokens
       kvc_prefix_tokens(px, &tokens, &n)
       kvc_radix_config_init(cfg, kind)
       kvc_radix_create(pool, cfg, &tree)          a prefix tree shared by many conversations
       kvc_radix_create_memory(mem, cfg, &tree)    the same over a model memory's groups
       kvc_radix_destroy(tree)
       kvc_radix_lookup(tree, ns, tokens, n, &cache, &n_reused)
       kvc_radix_lookup_memory(tree, ns, tokens, n, &mem, &n_reused)
       kvc_radix_lookup_into_memory(tree, ns, tokens, n, mem, &n_reused)
       kvc_radix_commit(tree, ns, cache, tokens, n, priority)
       kvc_radix_commit_memory(tree, ns, mem, tokens, n, priority)
       kvc_radix_release(cache)                    the cache's entry no longer in use
       kvc_radix_release_memory(mem)
       kvc_radix_pin(tree, ns, tokens, n)          never evicted (a system prompt)
       kvc_radix_unpin(tree, ns, tokens, n)
       kvc_radix_evict(tree, n_pages, &n_freed)
       kvc_radix_stats_get(tree, &stats)
     Tiers below a prefix tree (what eviction takes goes down, not away)
       kvc_tier_config_init(cfg)                   zeros
       kvc_tier_attach(tree, cfg)                  a host-RAM tier (own budget) and a store
       kvc_tier_fetch(tree, ns, tokens, n, &n_fetched)  the longest prefix a tier holds, back
       kvc_tier_publish(tree, ns, tokens, n, &n_published)  an entry to the store now
       kvc_tier_flush(tree)                        host-tier blobs to the store
       kvc_tier_stats_get(tree, &stats)
       kvc_tier_key(tree, ns, tokens, n, &key)     a prefix's content address
       kvc_key_hex(key, out)                       the key as 64 hex digits
       kvc_sha256(data, n, out)                    the hash the keys chain
       kvc_store_dir(&state, dir, &store)          a directory as a store (stdio)
     Persistence
       kvc_io_memory(&mem, &io)                    an io over a memory block
       kvc_io_stdio(file, &io)                     an io over an open FILE
       kvc_io_path(&state, path, writing, &io)     a file by name, written atomically
       kvc_cache_save(cache, ns, tokens, n, &io)
       kvc_cache_load(cache, ns, &io, tokens, max, &n)
       kvc_seq_save(cache, seq, ns, tokens, n, &io)      one CAUSAL sequence
       kvc_seq_load(cache, dst, ns, &io, tokens, max, &n)
       kvc_radix_save(tree, ns, tokens, n, &io)    one prefix-tree entry
       kvc_radix_load(tree, ns, &io, pin, &n)
       kvc_memory_save(mem, ns, tokens, n, &io)
       kvc_memory_load(mem, ns, &io, tokens, max, &n)
     Hybrid models: recurrent layers, model memories
       kvc_state(cache, seq, layer, &state)        the live state to update in the batch
       kvc_state_read(cache, seq, layer, &state)   read only, any time
       kvc_state_checkpoint(cache, layer, at, state)   hand a checkpoint's state over
       kvc_batch_checkpoints(cache, at, max, &n)   the offsets the batch wants states for
       kvc_memory_config_init(cfg)
       kvc_memory_config_check(cfg, &field)
       kvc_memory_create(cfg, &mem)                one memory over a model's layer groups
       kvc_memory_destroy(mem)
       kvc_memory_layer(mem, layer, &cache, &group_layer)
       kvc_memory_group(mem, group, &cache)
       kvc_memory_begin(mem, n_tokens, at, n_at)
       kvc_memory_put(mem, layer, k, v)
       kvc_memory_attention(mem, layer, &desc)
       kvc_memory_state(mem, layer, seq, &state)
       kvc_memory_state_read(mem, layer, &state)
       kvc_memory_state_checkpoint(mem, layer, at, state)
       kvc_memory_batch_checkpoints(mem, layer, at, max, &n)
       kvc_memory_cancel(mem)
       kvc_memory_offset(mem, &offset)
       kvc_memory_trim(mem, n)
       kvc_memory_can_rewind(mem, target, &ok)
       kvc_memory_rewind_point(mem, max_target, &target)
       kvc_memory_clear(mem)
       kvc_memory_snapshot_take(mem, from, at, &snap)
       kvc_memory_restore(mem, snap, target)
       kvc_memory_snapshot_free(snap)
       kvc_memory_fork(mem, &copy)
       kvc_memory_stats_get(mem, &stats)
     Threads (KVCACHE_THREADS)
       kvc_threads_create(n_threads, &threads)     a pthread pool for the parallel_for hook
       kvc_threads_destroy(threads)
       kvc_threads_attach(threads, &cfg.runtime)   sets the hook of a pool or memory config
       kvc_threads_parallel_for(threads, n, fn, ctx)   the hook itself
       kvc_mutex_create(&mutex)                    a recursive mutex for the pool lock
       kvc_mutex_destroy(mutex)
       kvc_mutex_attach(mutex, &cfg.runtime)       sets the lock of a pool or memory config
       kvc_mutex_lock(mutex)
       kvc_mutex_unlock(mutex)
     Advanced
       kvc_cache_runs(cache, layer, runs, max, &n)     the cells' stored rows, zero-copy
       kvc_cache_gather(cache, layer, k, v, pos, max, &n)   the same as f32 copies
       kvc_begin_batch(cache, &batch)              CAUSAL: a batch of (position, sequence)
       kvc_mask_export(cache, row_pad, mask, max, &rows, &cols, &first)
       kvc_seq_copy_prefix(cache, src, dst, len)
       kvc_seq_remove(cache, seq, begin, end)      with a RoPE shift of later cells
       kvc_seq_keep(cache, seq)
       kvc_seq_pos_range(cache, seq, &min, &max)
       kvc_seq_can_resume(cache, seq, pos, &ok)
       kvc_seq_snapshot(cache, seq, &snap)
       kvc_seq_restore(cache, snap, dst)
       kvc_cache_defrag(cache, &n_moves)
       kvc_cpu_features(&features)                 the KVC_CPU_* paths this CPU and build have
       kvc_rotation_block(head_dim, &block)        the storage rotation's block
       kvc_rotate_rows(x, head_dim, n_rows, inverse)   its scalar reference
       kvc_strerror(result)
       kvc_type_name(type)
   (end of index)

   THREADS (details: "Threads" among the advanced parts; docs/design.md)
     The library starts no threads. Without a lock a pool and everything made from it
     (caches, snapshots, prefix trees, memories) belong to one thread at a time. Give
     the pool a lock (kvc_pool_config.runtime.lock/unlock, or kvc_mutex_attach) and distinct
     caches on it may be used from different threads at once: the lock guards what
     they share (free pages, refcounts, prefix trees, budget, statistics), and
     kvc_put and kvc_attention, the per-layer calls, never take it. One cache (or
     snapshot, kvc_prefix) is still used by one thread at a time.
     The sliding window W means W keys including the current token (Hugging Face,
     MLX). ollama's Causal cache admits W+1: pass W+1 for that behaviour.

   LICENSE: MIT or public domain (Unlicense), at your choice; see the end of file.
*/
#ifndef KVCACHE_H
#define KVCACHE_H

#define KVCACHE_VERSION_MAJOR 0
#define KVCACHE_VERSION_MINOR 2
#define KVCACHE_VERSION_PATCH 0
#define KVCACHE_VERSION_NUMBER \
    (KVCACHE_VERSION_MAJOR * 10000 + KVCACHE_VERSION_MINOR * 100 + KVCACHE_VERSION_PATCH)

#include <stddef.h>
#include <stdint.h>

#ifdef KVCACHE_STATIC
#if defined(__GNUC__) || defined(__clang__)
#define KVCDEF static __attribute__((unused))
#else
#define KVCDEF static
#endif
#else
#ifdef __cplusplus
#define KVCDEF extern "C"
#else
#define KVCDEF extern
#endif
#endif

/* ---- Result codes: one list gives the enum and the strings ---------------------- */
#define KVC_RESULT_LIST(X)                                                              \
    X(KVC_OK, 0, "ok")                                                                  \
    X(KVC_ERR_NULL, -1, "a required pointer argument is NULL")                          \
    X(KVC_ERR_INVALID, -2, "invalid argument value")                                    \
    X(KVC_ERR_RANGE, -3, "layer, index, count or position out of range")                \
    X(KVC_ERR_UNSUPPORTED, -4, "operation not supported by this cache kind or type")    \
    X(KVC_ERR_FULL, -5, "page budget exhausted")                                        \
    X(KVC_ERR_NO_MEMORY, -6, "memory allocation failed")                                \
    X(KVC_ERR_ARENA_TOO_SMALL, -7, "arena smaller than the configuration needs")       \
    X(KVC_ERR_FOREIGN, -8, "object belongs to another cache or pool")                   \
    X(KVC_ERR_UNREACHABLE, -9, "restore target unreachable")                            \
    X(KVC_ERR_STATE, -10, "operation not valid in the current state")                   \
    X(KVC_ERR_BUSY, -11, "object still in use")                                         \
    X(KVC_ERR_OVERFLOW, -12, "size computation overflows")                             \
    X(KVC_ERR_NOT_FOUND, -13, "not found: no such sequence, tree entry, pin or checkpoint") \
    X(KVC_ERR_SHARED, -14, "a cell to be changed is shared with another sequence")        \
    X(KVC_ERR_IO, -15, "a read, write or file operation failed")                        \
    X(KVC_ERR_FORMAT, -16, "not a saved kvcache object, or a format version not supported") \
    X(KVC_ERR_CORRUPT, -17, "saved data damaged: a checksum, length or value is wrong")  \
    X(KVC_ERR_TRUNCATED, -18, "saved data ends early")                                  \
    X(KVC_ERR_MISMATCH, -19, "saved data is for another configuration, namespace or kind") \
    X(KVC_ERR_POSITION, -20, "the engine's position is not the cache's offset") \
    X(KVC_ERR_RECURRENT, -21, "a recurrent state cannot be rewound, shifted or cut there") \
    X(KVC_ERR_ROTATION, -22, "saved data was stored with another rotation (kvc_pool_config.rotate)") \
    X(KVC_ERR_ALIGNMENT, -23, "the allocator returned a block aligned less than kvc_allocator needs") \
    X(KVC_ERR_OWNED, -24, "the cache is a model memory's group: change it through the kvc_memory_* calls")

/* The codes are 0, -1, -2, ... in the order of the list (test_core checks that each
   has its text), so the lowest is 1 - the number of entries: one +1 per entry. */
#define KVC__RESULT_ONE(name, value, text) +1
typedef enum kvc_result {
#define KVC__RESULT_ENUM(name, value, text) name = value,
    KVC_RESULT_LIST(KVC__RESULT_ENUM)
#undef KVC__RESULT_ENUM
    KVC_RESULT_MIN_ = 1 - (0 KVC_RESULT_LIST(KVC__RESULT_ONE))
} kvc_result;
#undef KVC__RESULT_ONE

/* A static English sentence for a result, "unknown kvc_result" for a value not listed. */
KVCDEF const char *kvc_strerror(kvc_result result);

/* ---- Storage types ----------------------------------------------------------------- */
typedef enum kvc_type {
    KVC_TYPE_F32 = 0, /* 4 bytes per value */
    KVC_TYPE_F16 = 1, /* IEEE half, 2 bytes per value, round to nearest even */
    KVC_TYPE_BF16 = 2, /* bfloat16 (the top half of an f32), round to nearest even */
    /* Block types quantise along head_dim in blocks of 32 values (head dims must be
       multiples of 32); the layouts are llama.cpp's, so its tools read our pages. */
    KVC_TYPE_Q8_0 = 3, /* 34 bytes: f16 scale d, 32 x int8 q; value = q * d, d = max|x| / 127 */
    KVC_TYPE_Q4_0 = 4, /* 18 bytes: f16 scale d, 16 bytes of nibbles (value j in the low
                          nibble of byte j, value j+16 in the high one); value = (q - 8) * d,
                          d = -m / 8 where m is the value of largest magnitude */
    KVC_TYPE_COUNT
} kvc_type;

KVCDEF const char *kvc_type_name(kvc_type type); /* "f32", "f16", "bf16", "q8_0", "q4_0" or "?" */

/* ---- Pool: every K/V byte, in pages, under a byte budget ------------------------ */
/* The alignment kvc_allocator's blocks need: the strictest of double, uint64_t, pointers. */
typedef struct kvc__align_probe { char c; union { double d; uint64_t u; void *p; } x; } kvc__align_probe;
#define KVC_ALLOC_ALIGN (offsetof(kvc__align_probe, x))
/* Blocks must be aligned as malloc's are: at least the alignment of double, uint64_t and
   pointers (8 bytes on 64-bit hosts; KVC_ALLOC_ALIGN). kvc_pool_create refuses an
   allocator whose first block is less aligned (KVC_ERR_ALIGNMENT); a later such block is
   given back and counts as a failed allocation (KVC_ERR_NO_MEMORY). */
typedef struct kvc_allocator {
    void *(*alloc)(size_t size, void *user); /* NULL: KVCACHE_MALLOC */
    void (*free)(void *ptr, void *user);     /* may be called with NULL */
    void *user;
} kvc_allocator;

/* Parallel work goes through the caller's threads: parallel_for runs fn(ctx, task,
   worker) for every task in [0, n_tasks), in any order and on any of n_workers
   workers (worker ids < n_workers, never two tasks at once on one worker id), and
   returns when all are done. Results do not depend on how tasks are spread. */
typedef void (*kvc_task_fn)(void *ctx, int32_t task, int32_t worker);
typedef void (*kvc_parallel_for_fn)(void *user, int32_t n_tasks, kvc_task_fn fn, void *ctx);
/* (kvc_threads_parallel_for, among the advanced parts, is a ready-made one.) */

/* A lock (or unlock) callback of the caller's, given the config's lock_user. */
typedef void (*kvc_lock_fn)(void *user);

/* The runtime block: how the library gets memory, threads and a lock. kvc_pool_config and
   kvc_memory_config both hold one (`runtime`); a memory's applies to every group's pool
   (whose own runtime stays zero). All zero: malloc/free (KVCACHE_MALLOC), the calling
   thread, no lock, every CPU path. */
typedef struct kvc_runtime {
    kvc_allocator allocator;
    kvc_parallel_for_fn parallel_for; /* NULL: the library works on the calling thread */
    void *parallel_user;
    int32_t n_workers;                /* with parallel_for: how many worker ids it uses (>= 1) */
    /* Sharing pools between threads (see "Threads" among the advanced parts): lock and
       unlock (both or neither; NULL: no lock, one thread at a time) guard everything the
       pool's caches share -- free pages, refcounts, prefix trees, budget, statistics.
       The lock must be recursive: a call may take it again on the same thread before
       it lets it go (a recursive mutex; kvc_mutex_attach sets one up with pthreads).
       kvc_put and kvc_attention never take it; the allocator is called under it. A
       memory's lock serves all its groups (they share the budget): a memory and its forks
       may then be used from different threads at once (each by one thread at a time). */
    kvc_lock_fn lock;
    kvc_lock_fn unlock;
    void *lock_user;
    uint32_t cpu_disable; /* KVC_CPU_* paths not to use (tests compare them with scalar); a path
                             needs those below it: no AVX2 means no AVX-512 either */
} kvc_runtime;

/* Page events for a device backend (see "Page events" among the advanced parts);
   all zero, the default, means none. */
typedef struct kvc_page_event kvc_page_event;
typedef struct kvc_page_hooks {
    void (*event)(void *user, const kvc_page_event *ev); /* NULL: no events */
    void *user;
    int external_data;  /* nonzero: no K/V bytes on the host (see "Page events") */
    /* With external_data: the bytes of whole pages for saves and loads (both or neither;
       NULL: saves and loads refuse the pool with KVC_ERR_UNSUPPORTED). pages[0 .. n_pages)
       of layer `layer`'s K (v = 0) or V (v = 1), page i at i * page_cells * row bytes of
       data, in kvcache.h's layout; a failure's kvc_result fails the save or load. */
    kvc_result (*read_pages)(void *user, int32_t layer, int v, const uint32_t *pages, int32_t n_pages, void *data);
    kvc_result (*write_pages)(void *user, int32_t layer, int v, const uint32_t *pages, int32_t n_pages,
                              const void *data);
    /* Optional (NULL: none), for a backend that moves pages while the host works: a save
       announces each read_pages call before it makes it (the same arguments, in the same
       order, at most two announced and not yet read), so the backend can start that copy
       while the host writes the chunk before it; a hint (read_pages must work for calls
       not announced). write_pages may return before its bytes have landed when flush is
       set: a save or load calls flush once its run of read_pages / write_pages calls ends
       (also after a failure), and flush waits for what is still in flight (its failure
       fails the call). */
    kvc_result (*prefetch_pages)(void *user, int32_t layer, int v, const uint32_t *pages, int32_t n_pages);
    kvc_result (*flush)(void *user);
} kvc_page_hooks;

/* Sizing: budget_bytes buys floor(budget_bytes / page_bytes) pages, where a page holds
   page_cells tokens of every layer in the storage types chosen; kvc_pool_page_bytes and
   kvc_pool_budget_for_tokens compute them (a "tokens x f32 row" budget wastes what f16
   or q8_0 save). All of it is allocated at create.
   Resident memory: the library gives the kernel no advice about the slab by default.
   With KVCACHE_HUGE_PAGES on Linux, when the slab comes from the library's own malloc
   (no allocator in the config, no KVCACHE_MALLOC, no arena), it is advised
   MADV_HUGEPAGE (the 2 MiB-aligned part of it; only where <sys/mman.h> declares it,
   e.g. gcc's default gnu modes or _DEFAULT_SOURCE). The trade: attention streams the
   whole cache and saves a TLB miss per 4 KiB (a 16k-cell decode measured 14 % faster
   on one thread), but the first write into a 2 MiB granule makes the whole granule
   resident (the first token touches each layer's K and V regions: up to 2 x n_layers
   x 2 MiB at once), where the kernel's THP defrag setting is "madvise" (its default)
   advised faults may compact memory synchronously, and the host program's own memory
   work can suffer: an adopter's engine saw its weight matmuls 3-41 % slower,
   erratically (bench/bench_host.c on a 2-core machine: 1-3 % slower, within its noise,
   and the cache no faster at 27 MiB; docs/performance-log.md). So it is opt-in: turn
   it on where the cache is most of the process's memory traffic. Under
   THP "always" the kernel may use huge pages without the advice; an allocator that
   advises MADV_NOHUGEPAGE avoids that. */
typedef struct kvc_pool_config {
    int32_t n_layers;     /* layers whose K/V live in each page */
    int32_t n_kv_heads;
    int32_t head_dim_k;   /* K and V head sizes may differ */
    int32_t head_dim_v;
    kvc_type type_k;      /* storage type of K and of V, independently */
    kvc_type type_v;
    int32_t page_cells;   /* token slots per page (every layer); default 256 */
    size_t budget_bytes;  /* hard cap on K/V bytes: floor(budget / page_bytes) pages */
    kvc_runtime runtime;  /* allocator, parallel_for, lock, cpu_disable (see kvc_runtime) */
    /* Arena mode: when arena != NULL every byte the pool, its caches, snapshots
       and prefix objects ever use comes from this caller-owned block, and the
       library never calls an allocator. kvc_pool_arena_bytes() says how big it
       must be. arena_object_bytes is the part kept for objects (cache headers,
       page tables, snapshots, token lists); 0 means a default that scales with
       the page count. */
    void *arena;
    size_t arena_bytes;
    size_t arena_object_bytes;
    kvc_page_hooks hooks; /* page events for a device backend; zero = none */
    /* A state pool (for RECURRENT caches) when nonzero: a page holds one sequence's state
       of every layer, state_floats f32 per layer. n_kv_heads and the head dims must be 0;
       type_k, type_v and page_cells are not used (a page is one state). */
    int32_t state_floats;
    /* KVC_ROTATE_K | KVC_ROTATE_V (0: none): store K (V) rotated along the head by the
       fixed orthonormal rotation of kvc_rotate_rows before converting it to its type, so
       that outlier channels no longer set the block scales of q8_0 / q4_0. Callers see
       the same math: kvc_put takes plain K/V, kvc_attention plain q and gives plain out
       (it rotates q and un-rotates out), kvc_cache_gather returns plain rows, a RoPE
       shift un-rotates, shifts and re-rotates; only kvc_cache_runs exposes the stored
       (rotated) rows. Head dims whose rotation block would be < 16 are refused
       ("rotate"), and so are state pools. Saved with a cache; a load into a pool with
       another rotate is KVC_ERR_ROTATION. */
    uint32_t rotate;
} kvc_pool_config;

#define KVC_ROTATE_K 1u /* kvc_pool_config.rotate: K stored rotated */
#define KVC_ROTATE_V 2u /* kvc_pool_config.rotate: V stored rotated */

typedef struct kvc_pool_stats {
    size_t page_bytes;      /* K+V bytes of one page, all layers */
    size_t k_row_bytes;     /* bytes of one cell's K for one layer (all kv heads) */
    size_t v_row_bytes;
    int32_t page_cells;
    int32_t pages_total;    /* pages the budget allows */
    int32_t pages_used;     /* pages referenced by anything now */
    int32_t pages_peak;
    size_t bytes_used;      /* pages_used * page_bytes */
    size_t bytes_peak;
    size_t budget_bytes;
    int32_t live_caches;    /* objects that must be destroyed before the pool */
    int32_t live_snapshots;
    int32_t live_prefixes;
    uint32_t cpu_features;  /* the KVC_CPU_* paths this pool uses */
} kvc_pool_stats;

typedef struct kvc_pool kvc_pool;

KVCDEF kvc_result kvc_pool_config_init(kvc_pool_config *cfg); /* zeros + defaults */
/* Checks cfg as kvc_pool_create does and returns what it would (KVC_ERR_INVALID,
   KVC_ERR_OVERFLOW, KVC_ERR_ARENA_TOO_SMALL, ...) without allocating. *field (field may
   be NULL) = the name of the first field refused, in the order kvc_pool_create checks
   them ("n_layers", "head_dim_k", "type_k", "page_cells", "budget_bytes",
   "runtime.allocator", "arena_bytes", "runtime.n_workers", "rotate", ...), or NULL when cfg is valid. E.g. q8_0 or q4_0 with
   head dim 48 -> "head_dim_k" (block types need multiples of 32); a budget below one
   page -> "budget_bytes". */
KVCDEF kvc_result kvc_pool_config_check(const kvc_pool_config *cfg, const char **field);
/* Arena mode: the arena_bytes this configuration needs (see the arena fields). */
KVCDEF kvc_result kvc_pool_arena_bytes(const kvc_pool_config *cfg, size_t *bytes);
/* K+V bytes of one page of this configuration, every layer (kvc_pool_stats.page_bytes);
   cfg is checked as kvc_pool_create checks it, except that budget_bytes may be 0. */
KVCDEF kvc_result kvc_pool_page_bytes(const kvc_pool_config *cfg, size_t *page_bytes);
/* The smallest budget_bytes with which one FULL cache of a pool of this configuration
   holds n_tokens tokens: ceil(n_tokens / page_cells) whole pages (at least one) of
   page_bytes each, in the configured storage types (budget_bytes of cfg is ignored).
   KVC_ERR_RANGE for n_tokens < 0, KVC_ERR_OVERFLOW if it does not fit a size_t. */
KVCDEF kvc_result kvc_pool_budget_for_tokens(const kvc_pool_config *cfg, int32_t n_tokens, size_t *budget_bytes);
/* The same for a state pool (state_floats > 0; a K/V pool: KVC_ERR_INVALID): the budget
   that holds n_states states, one page each (at least one). A RECURRENT cache holds one
   live state per sequence that has consumed a token, one per checkpoint it keeps (at most
   cfg.checkpoints named ones, and with a reserve R up to R + 1 more), and while a batch
   runs one per offset it asks for (kvc_batch_checkpoints) and a copy of a live state that
   a checkpoint or snapshot shares. A model memory's budget_bytes is the sum over its
   groups (kvc_pool_budget_for_tokens for K/V groups). */
KVCDEF kvc_result kvc_pool_budget_for_states(const kvc_pool_config *cfg, int32_t n_states, size_t *budget_bytes);
/* A pool of floor(budget_bytes / page_bytes) pages, all allocated (or laid out in the
   arena) now: no later call allocates K/V memory. kvc_pool_config_check names the field
   of an invalid cfg. */
KVCDEF kvc_result kvc_pool_create(const kvc_pool_config *cfg, kvc_pool **out);
/* KVC_ERR_BUSY while caches, snapshots or prefix objects of the pool are alive, and for
   a pool another object made and owns (a model memory's, kvc_vk_pool_host()'s). */
KVCDEF kvc_result kvc_pool_destroy(kvc_pool *pool);
/* Sizes, page use (now and peak), live objects and the CPU paths in use. */
KVCDEF kvc_result kvc_pool_stats_get(const kvc_pool *pool, kvc_pool_stats *stats);

/* The storage rotation (KVC_ROTATE_K / KVC_ROTATE_V), exactly; every backend applies
   this map (up to the order of its additions). For a head vector x[0..d) (d = head_dim_k
   for K, head_dim_v for V; the same for every layer, kv head and cell):
     n = the largest power of two dividing d, capped at 256 (refused when n < 16);
     s(i) = -1 if bit (i mod 256) of KVC_ROTATION_SIGNS_INIT is set (bit j = bit j % 32 of
            word j / 32), else +1, for i the index within the head;
     for each block x[b*n .. b*n+n): y[i] = s(i) x[i]; then the unnormalised fast
            Walsh-Hadamard transform of the block in Sylvester (natural) order,
            z[j] = sum_i (-1)^popcount(i & j) y[b*n+i]; then z[j] *= (float)(1/sqrt(n)).
   R = (1/sqrt n) H S per block is orthonormal; the inverse (inverse != 0) is
   R^T = S H (1/sqrt n): the transform and scaling first, then the signs. Stored K = R k,
   stored V = R v; scores use (R q).(R k) = q.k, outputs out = R^T sum p_i (R v_i). */
#define KVC_ROTATION_MAX_BLOCK 256 /* n of the rule above is at most this */
#define KVC_ROTATION_MIN_BLOCK 16  /* head dims whose n would be smaller are refused */
/* The 256 signs of the rule, bit j of the table = sign of values i with i % 256 == j. */
#define KVC_ROTATION_SIGNS_INIT {0x16E6060Eu, 0x778C5721u, 0x8BF5716Au, 0x3A28247Bu, \
                                 0xF53ADB1Fu, 0x0B1599BEu, 0x88F886E3u, 0xD1251A7Fu}
/* *block = n of the rule for this head dim; KVC_ERR_INVALID (and *block = 0) when the
   rule refuses it (n < 16, or head_dim < 1). */
KVCDEF kvc_result kvc_rotation_block(int32_t head_dim, int32_t *block);
/* The scalar reference of the rotation: rows n_rows x head_dim, in place, forward
   (inverse == 0: x = R x) or back (x = R^T x). KVC_ERR_INVALID for a head dim the rule
   refuses or n_rows < 0. */
KVCDEF kvc_result kvc_rotate_rows(float *x, int32_t head_dim, int32_t n_rows, int inverse);

/* ---- Caches ---------------------------------------------------------------------- */
typedef enum kvc_kind {
    KVC_KIND_FULL = 0,     /* append-only, trim/rewind anywhere */
    KVC_KIND_ROTATING = 1, /* sliding window of `window` keys, `sinks` first tokens kept */
    KVC_KIND_CAUSAL = 2,   /* ollama's multi-sequence cell cache: fixed capacity, cells with
                              a position and a set of sequences */
    KVC_KIND_RECURRENT = 3 /* a fixed-size state per layer and sequence (convolution, state-space
                              or delta-rule layers of hybrid models), on a state pool; it cannot
                              be rewound, only restored to checkpoints and snapshots */
} kvc_kind;

/* RoPE used to re-rotate stored keys when kvc_seq_remove shifts positions. */
typedef enum kvc_rope_style {
    KVC_ROPE_NONE = 0,        /* no shifting: kvc_seq_remove with a shift is refused */
    KVC_ROPE_NEOX = 1,        /* rotate-half: pairs (i, i + n_dims/2) */
    KVC_ROPE_INTERLEAVED = 2  /* pairs (2i, 2i+1) */
} kvc_rope_style;

/* A caller's own re-rotation: k holds one cell's keys of one layer as f32
   [n_kv_heads][head_dim]; rotate them in place from old_pos to new_pos. */
typedef void (*kvc_rope_shift_fn)(void *user, int32_t layer, float *k, int32_t n_kv_heads,
                                  int32_t head_dim, int32_t old_pos, int32_t new_pos);

typedef struct kvc_rope kvc_rope;
struct kvc_rope {
    kvc_rope_style style;
    float theta;            /* base, e.g. 10000; angle = pos * theta^(-2i/n_dims) */
    int32_t n_dims;         /* rotated dimensions per head (even); 0 = head_dim_k */
    kvc_rope_shift_fn shift;/* if set, used instead of `style` */
    void *user;
};

typedef struct kvc_cache_config {
    kvc_kind kind;
    int32_t window;   /* ROTATING: W keys including the current token (>= 1).
                         CAUSAL: 0 = none, else W keys (ollama's Causal admits W+1: pass W+1) */
    int32_t sinks;    /* ROTATING: first tokens never evicted, counted inside W (0 <= sinks < W) */
    /* the fields below are read only by CAUSAL caches */
    int32_t capacity; /* cells, rounded up to a multiple of `padding` */
    int32_t padding;  /* capacity and exported mask widths are multiples of it; 0 = 1 */
    int32_t max_seqs; /* sequence ids are 0 .. max_seqs-1; 0 = 256 */
    int32_t chunk;    /* chunked attention: a query sees only cells of its own chunk of
                         this many positions; 0 = none */
    kvc_rope rope;    /* how kvc_seq_remove re-rotates shifted keys */
    /* ROTATING and RECURRENT: how many checkpoints (kvc_begin) the cache keeps,
       the latest ones; 0 = 8. RECURRENT: max_seqs above is its number of sequences (0 = 1). */
    int32_t checkpoints;
    /* FULL and ROTATING caches on a pool whose K or V type is q8_0 or q4_0: the newest
       f16_tail tokens are also kept in f16 and attention reads them in place of their
       quantized rows (mlx-lm's quantized_kv_start, KIVI's residual); the pages hold every
       token exactly as without a tail, so a token leaving the tail is quantized as it would
       be anyway. The f16 rows (f16_tail x n_layers rows of K and V) are part of the cache
       object, from the pool's allocator, outside budget_bytes. Tokens a restore or prefix
       lookup brings are read as stored until new tokens refill the tail; a fork copies it,
       and kvc_cache_save / kvc_memory_save save it (a TAIL section: attention after the
       load is bit-identical; a target with a shorter tail keeps the newest tokens). 0: off. Negative, or > 0 on a pool with no quantized type:
       KVC_ERR_INVALID; CAUSAL, RECURRENT or device-backed pools: KVC_ERR_UNSUPPORTED
       (field "f16_tail"). */
    int32_t f16_tail;
    /* Rollback for speculative decoding: a reserve of R tokens (0 = none, the default;
       FULL and CAUSAL must leave it 0; ROTATING up to 1 << 24, RECURRENT up to 4096).
       kvc_cache_trim, kvc_cache_restore(cache, NULL, t), kvc_cache_can_rewind, kvc_snapshot_take and the
       memory calls then reach every t >= m - R, m being the furthest offset the cache has
       reached (while drafts only go forward: the offset), across batches and after a
       ROTATING window has wrapped: reject drafted tokens without a snapshot per token.
       ROTATING: kvc_begin releases only pages whose tokens are all more than R older
       than the oldest its first query sees, so it holds up to R tokens beyond the window
       (in the budget; attention still reads exactly the window). A target t is reachable
       exactly when every page of its window -- the sinks and the W - sinks tokens before
       t -- is still held. RECURRENT: a batch of n <= R tokens keeps the state at its start
       as a checkpoint (sharing the live state's page until the batch writes it), and the
       offsets among the batch's last R (start < t < end) are checkpoints as if named in
       kvc_begin: the engine hands each layer's state there over with
       kvc_state_checkpoint (kvc_batch_checkpoints lists them; a call for an offset inside the
       batch not asked for is KVC_ERR_NOT_FOUND, harmless).
       These reserve checkpoints are kept while within R of the offset, beside the latest
       `checkpoints` named ones: at most R + cfg.checkpoints, each one state page. */
    int32_t reserve;
} kvc_cache_config;

typedef struct kvc_cache kvc_cache;
typedef struct kvc_snapshot kvc_snapshot;
typedef struct kvc_memory kvc_memory; /* a model memory: "Hybrid models" */

KVCDEF kvc_result kvc_cache_config_init(kvc_cache_config *cfg, kvc_kind kind); /* zeros + kind */
/* CAUSAL caches take all their pages at create (KVC_ERR_FULL if the pool lacks them). */
KVCDEF kvc_result kvc_cache_create(kvc_pool *pool, const kvc_cache_config *cfg, kvc_cache **out);
/* Checks cfg against pool as kvc_cache_create does and returns what it would, creating
   nothing. *field (field may be NULL) = the first field refused ("kind", "window",
   "sinks", "capacity", "padding", "max_seqs", "chunk", "rope.style", "rope.theta",
   "rope.n_dims", "checkpoints", "reserve", "f16_tail"), or NULL when valid. KVC_ERR_FULL
   ("capacity") says that the pool cannot give a CAUSAL cache of that capacity its pages
   now. */
KVCDEF kvc_result kvc_cache_config_check(const kvc_pool *pool, const kvc_cache_config *cfg, const char **field);
/* Gives the cache's page references back to the pool (pages shared with snapshots,
   forks or prefix trees stay with them) and frees the cache. */
KVCDEF kvc_result kvc_cache_destroy(kvc_cache *cache);
/* A new cache with the same contents, sharing every page (O(pages), no K/V copied). */
KVCDEF kvc_result kvc_cache_fork(const kvc_cache *cache, kvc_cache **out);
KVCDEF kvc_result kvc_cache_clear(kvc_cache *cache); /* offset 0, all pages released */
/* FULL/ROTATING: tokens appended so far (the next position). CAUSAL: cells in use.
   RECURRENT: tokens sequence 0 has consumed. */
KVCDEF kvc_result kvc_cache_offset(const kvc_cache *cache, int32_t *offset);
/* Cells a kernel reads now: every cell the earliest query of the last batch may see
   (FULL: offset; ROTATING: at most sinks + window - 1 + last batch size). */
KVCDEF kvc_result kvc_cache_cells(const kvc_cache *cache, int32_t *n_cells);
/* Pages this cache references (shared ones included). */
KVCDEF kvc_result kvc_cache_pages(const kvc_cache *cache, int32_t *n_pages);

/* ---- A forward pass: reserve, write, attend; cancel and trim --------------------- */
/* "Up to the end": kvc_snapshot_take's `at` (the offset), kvc_seq_remove's end. */
#define KVC_POS_END INT32_MAX
/* Start a batch of n_tokens new tokens at positions offset .. offset+n_tokens-1:
   allocates (and copies shared tail pages) for every layer at once, so it is the
   only call of a forward pass that can run out of pages (KVC_ERR_FULL, after evicting
   unused prefix-tree entries) or memory (KVC_ERR_NO_MEMORY: the page table grows past
   its first 8 entries by doubling). offset grows by n_tokens.
   ROTATING: releases pages no query of this batch can see (the L>1 concat and L=1
   ring update of ollama's MLX runner keep the same window: W-1 older keys + the batch).
   at[0 .. n_at) (at may be NULL with n_at 0, the usual call) names checkpoints inside
   the batch, offsets the cache must be able to return to afterwards (see "Hybrid
   models": checkpoints); kvc_memory_begin takes the same arguments. */
KVCDEF kvc_result kvc_begin(kvc_cache *cache, int32_t n_tokens, const int32_t *at, int32_t n_at);
/* kvc_begin, after checking that pos -- the position the engine believes its first new
   token has -- is the cache's offset (CAUSAL: sequence 0's next position, one past the
   largest it holds); KVC_ERR_POSITION, with nothing changed, when it is not. Catches an
   engine whose own position count drifted from the cache's. */
KVCDEF kvc_result kvc_begin_at(kvc_cache *cache, int32_t pos, int32_t n_tokens);
/* Write the batch's keys and values for one layer, f32, [n_tokens][n_kv_heads][head_dim],
   converted to the storage type. Each layer of the batch must be put before its
   attention; a later kvc_begin, snapshot or fork needs every layer put.
   Non-finite K/V, one rule for every storage type, rotation and CPU path:
   a (token, kv head) whose K or V holds a NaN, an infinity, or a value its storage cannot
   hold finite (f16 rows and an f16_tail: |x| > 65504; q8_0: > 65504 x 127, q4_0: > 65504
   x 8, the reach of their f16 block scale; f32, bf16: their range; a rotated side: that
   bound / sqrt(rotation block)) is stored poisoned: its K as NaN, its V as zeros
   (kvc_cache_gather reads them so). Each query row (query, head of that kv head) that sees
   it gets NaN in every output value and its lse, like PyTorch's attention with a NaN key;
   other rows, and queries masked from it, are exactly as without it. So a bad value never
   turns its block or rotation neighbours NaN and is never dropped. kvcache_vk.h follows
   the same rule (kvc_vk_cmd_append, its attention and RoPE shifts). */
KVCDEF kvc_result kvc_put(kvc_cache *cache, int32_t layer, const float *k, const float *v);
/* Abandon an unfinished batch: offset goes back to where kvc_begin found it. */
KVCDEF kvc_result kvc_cancel(kvc_cache *cache);

/* Trim n tokens from the end (CanTrim/Trim of ollama's MLX runner); KVC_ERR_STATE
   while a batch is open (kvc_cancel it first), as for kvc_cache_restore. ROTATING caches can
   trim only until the window has wrapped: offset <= window and no page ever released (a
   kvc_cancel after kvc_begin released pages counts as wrapped); after that only onto a
   checkpoint, within a reserve (cfg.reserve, which keeps trims of up to R tokens
   possible) or to 0 (clearing). RECURRENT caches likewise go back only onto a checkpoint,
   within the reserve or to 0. A trim by 0 always succeeds and changes nothing (FULL,
   ROTATING, RECURRENT; wrapped, after a kvc_cancel, anything). A target the cache
   cannot reach is KVC_ERR_UNREACHABLE, nothing changed: the result kvc_cache_restore(cache,
   NULL, target) and kvc_memory_trim give (kvc_cache_can_rewind says which targets are
   reachable; 0 always is). CAUSAL caches: KVC_ERR_UNSUPPORTED. With a reserve,
   kvc_cache_can_trim says whether a trim by one token succeeds. */
KVCDEF kvc_result kvc_cache_can_trim(const kvc_cache *cache, int *can_trim);
KVCDEF kvc_result kvc_cache_trim(kvc_cache *cache, int32_t n_tokens);

/* ---- Attention -------------------------------------------------------------------- */
/* Layouts are row-major f32: q [n_queries][n_heads][head_dim_k] and out
   [n_queries][n_heads][head_dim_v]. Grouped-query attention: query head h reads kv head
   h / (n_heads / n_kv_heads), so each run of n_heads / n_kv_heads consecutive query heads
   shares one kv head (n_heads == n_kv_heads: ordinary multi-head attention). */
typedef struct kvc_attention_desc {
    int32_t n_queries;    /* query tokens */
    int32_t n_heads;      /* query heads, a multiple of n_kv_heads (GQA, see above) */
    const float *q;       /* [n_queries][n_heads][head_dim_k], rope applied */
    const int32_t *pos;   /* [n_queries] positions; NULL: the last n_queries positions
                             (CAUSAL: NULL means the queries are the current batch, with its
                             positions, sequences and non-causal marks) */
    const int32_t *seq;   /* CAUSAL with pos != NULL: [n_queries] sequence ids */
    float scale;          /* scores are scale * q.k; 0: the default 1/sqrt(head_dim_k) */
    int32_t window;       /* extra window (W keys incl. current), 0: none; a ROTATING
                             cache always applies its own */
    int non_causal;       /* nonzero: no causal mask (keys after the query are seen) */
    float *out;           /* [n_queries][n_heads][head_dim_v]; zeros where nothing is visible */
    void *scratch;        /* optional working memory of kvc_attention_scratch_bytes(); NULL:
                             calls needing up to 16 KiB use the stack, larger ones ask the
                             pool's allocator (arena mode: the arena's object heap, which
                             may be too small, and is not safe to share across threads).
                             With scratch a call takes about 4 KiB of stack (3.9 KiB
                             measured with gcc -O2 on x86-64, test_kernels), without it
                             16 KiB more */
    size_t scratch_bytes;
    /* Attention variants (zero = off). Order of operations: s = scale * q.k; if softcap,
       s = softcap * tanh(s / softcap); softmax over the visible keys, with the sink's e^sink
       added to the denominator. */
    const float *sinks;   /* [n_heads] or NULL: a learned logit per query head that joins each
                             query's softmax denominator (gpt-oss): out = sum(e^s_i v_i) /
                             (e^sink + sum e^s_i), computed with the usual max subtraction;
                             -INFINITY: no sink for that head; NaN or +INFINITY:
                             KVC_ERR_INVALID */
    float softcap;        /* 0: off; > 0 and finite: scores = softcap * tanh(scores / softcap)
                             before the softmax (Gemma 2), applied after `scale`; < 0, NaN or
                             infinite: KVC_ERR_INVALID */
    float *lse;           /* [n_queries][n_heads] or NULL: the natural-log log-sum-exp of each
                             query's final scores (the sink included when given), for merging
                             attention over several caches (cascade decoding); -INFINITY where
                             nothing is visible (and no sink), NaN for a non-finite query row */
} kvc_attention_desc;

/* Scaled dot-product attention of the queries over the cache's cells for `layer`,
   masks computed from the cells' positions (no mask tensor). Online softmax. out must
   not overlap q (KVC_ERR_INVALID); queries x heads must fit an int32 (KVC_ERR_OVERFLOW).
   A query row (one query, one head) holding a NaN or an infinity gives a row of NaN
   in out (and a NaN lse), whatever the storage types (other rows are unaffected); so
   does a row that sees a cell kvc_put stored poisoned (non-finite K or V, see kvc_put). */
KVCDEF kvc_result kvc_attention(const kvc_cache *cache, int32_t layer, const kvc_attention_desc *desc);
/* The scratch a call with this desc needs now (q, out and scratch are not looked at);
   it changes as the cache grows. KVC_ERR_OVERFLOW where it does not fit a size_t. */
KVCDEF kvc_result kvc_attention_scratch_bytes(const kvc_cache *cache, const kvc_attention_desc *desc,
                                              size_t *bytes);

/* ---- Snapshots (Snapshot / Restore / Merge / Split of ollama's MLX runner) -------- */
typedef struct kvc_snapshot_info {
    int32_t from, to;     /* FULL: the tokens [from, to) it holds; ROTATING: the whole window */
    int32_t n_pages;      /* pages it keeps alive */
    size_t bytes;         /* n_pages * page_bytes */
} kvc_snapshot_info;

/* Snapshot of [from, at), the cache as it was after `at` tokens; at = KVC_POS_END: the
   offset, the usual call (any other `at`: see "Hybrid models", snapshots at an offset).
   *out = NULL (and KVC_OK) when at <= from or the cache is empty, as in ollama's MLX
   runner. FULL: from < 0 counts as 0. ROTATING: the whole window state is kept.
   kvc_memory_snapshot_take takes the same arguments. */
KVCDEF kvc_result kvc_snapshot_take(kvc_cache *cache, int32_t from, int32_t at, kvc_snapshot **out);
/* Bring the cache to `target`. snap == NULL rewinds using the live state.
   KVC_ERR_UNREACHABLE is the `false` of the MLX runner's Restore: FULL: target < 0, target > offset
   (live) or > snap->to, or offset < snap->from. ROTATING: target > offset (live) or
   > snap->to, a live rewind once the window has wrapped (see kvc_cache_trim), or a snapshot
   clamped below its end when its window had wrapped -- unless the cache has a reserve and
   the cache (live) or the snapshot holds every page of the window at target (a snapshot
   holds the pages the cache held, the reserve's too). The snapshot is not consumed. */
KVCDEF kvc_result kvc_cache_restore(kvc_cache *cache, const kvc_snapshot *snap, int32_t target);
/* Merge [a,b) and [b,c) into [a,c). Consumes both on success; if either is NULL
   both are freed and *out = NULL (as the MLX runner does). ROTATING: the child
   supersedes the parent. */
KVCDEF kvc_result kvc_snapshot_merge(kvc_cache *cache, kvc_snapshot *parent, kvc_snapshot *child,
                                     kvc_snapshot **out);
/* Split [a,c) at b into [a,b) and [b,c). Consumes snap on success. At or before a:
   (NULL, snap); at or after c: (snap, NULL). ROTATING: (NULL, snap) always. */
KVCDEF kvc_result kvc_snapshot_split(kvc_cache *cache, kvc_snapshot *snap, int32_t at,
                                     kvc_snapshot **parent, kvc_snapshot **child);
/* The span a snapshot holds and the pages (bytes) it keeps alive. */
KVCDEF kvc_result kvc_snapshot_info_get(const kvc_snapshot *snap, kvc_snapshot_info *info);
KVCDEF kvc_result kvc_snapshot_free(kvc_snapshot *snap); /* NULL is fine */

/* ---- Single-entry prefix reuse (findRemaining / begin / close of ollama's MLX runner) */
typedef struct kvc_prefix kvc_prefix;
/* Tracks the tokens held by a set of caches (one per layer group, kinds may mix).
   max_tokens bounds the recorded token list. The caches must outlive the object. Other
   calls on the caches between kvc_prefix_close and the next begin: cutting tokens off
   the end (trim, cancel, clear, restore to an earlier offset) only clips what is reused;
   adding or replacing contents (a batch, a load, a restore from a snapshot) makes that
   begin reuse nothing (it clears every cache). */
KVCDEF kvc_result kvc_prefix_create(kvc_cache *const *caches, int32_t n_caches, int32_t max_tokens,
                                    kvc_prefix **out);
/* Frees the object; the caches and what they hold stay as they are. */
KVCDEF kvc_result kvc_prefix_destroy(kvc_prefix *prefix);
/* New request: longest common prefix with the recorded tokens, always leaving at least
   one token to evaluate; trims every cache to it, or clears them all when one cannot
   trim there (a wrapped rotating window). *n_reused = tokens already in the caches:
   evaluate tokens[*n_reused ..]. The prompt is remembered for kvc_prefix_close. An
   empty prompt (n_tokens 0, tokens may be NULL) reuses nothing: the caches start over. */
KVCDEF kvc_result kvc_prefix_begin(kvc_prefix *prefix, const int32_t *tokens, int32_t n_tokens,
                                   int32_t *n_reused);
/* After generation: record prompt + generated tokens, clipped to the smallest cache
   offset (what every cache really holds) and to max_tokens. */
KVCDEF kvc_result kvc_prefix_close(kvc_prefix *prefix, const int32_t *generated, int32_t n_generated);
/* The recorded tokens (what the caches hold). *tokens points into the object: it stays
   valid until kvc_prefix_destroy, and what it shows (and *n_tokens) until the next
   kvc_prefix_begin or kvc_prefix_close. */
KVCDEF kvc_result kvc_prefix_tokens(const kvc_prefix *prefix, const int32_t **tokens, int32_t *n_tokens);
/* Single-entry prompt reuse (kvc_prefix) over the memory's groups: reuses up to the
   longest offset every group can return to. The memory must outlive it. */
KVCDEF kvc_result kvc_prefix_create_memory(kvc_memory *mem, int32_t max_tokens, kvc_prefix **out);

/* ---- Radix prefix cache: many conversations share cached prefixes ---------------- */
/* A tree over token ids on one pool. Each node is a span of tokens and holds the pool
   pages of that span (a page whose first cells belong to the parent is the node's own
   copy, or the page it shares with the parent since a split). A lookup stitches the
   pages of the longest cached prefix into a ready cache without copying K/V; a commit
   inserts a conversation's prompt + generated tokens, sharing its pages with the tree.
   When the pool runs out of pages (kvc_begin, a CAUSAL create, a snapshot merge), the
   trees on the pool evict their least recently used unreferenced leaves first, all or
   nothing: a call that cannot succeed even after eviction (out of pages, or an
   allocation refused) fails with nothing evicted. Loads never evict (see Persistence).
   Entries in use (a cache looked up from or committed to them, until it is destroyed,
   cleared or released) and pinned entries are never evicted. With max_entries = 1 the
   tree keeps only the latest conversation: the MLX runner's single entry (kvc_prefix is the
   same rule applied in place to caches you keep). Trees count as live_prefixes. */
typedef struct kvc_radix kvc_radix;

/* Entries committed under one namespace are found only by lookups under the same one. */
typedef struct kvc_namespace {
    uint64_t model; /* e.g. a hash of the model file: two models never match */
    uint64_t salt;  /* e.g. a tenant id: 0 when everyone may share prefixes */
} kvc_namespace;

typedef struct kvc_radix_config {
    kvc_cache_config cache; /* FULL, or ROTATING (window, sinks): the caches lookups return
                               and commits take */
    int32_t max_entries;    /* 0: keep as much as the pool holds; N: after a commit keep only
                               the N latest committed sequences (and entries in use or
                               pinned); 1 = the MLX runner's single entry */
} kvc_radix_config;

typedef struct kvc_radix_stats {
    uint64_t lookups;         /* successful kvc_radix_lookup calls */
    uint64_t tokens_queried;  /* tokens they were given */
    uint64_t tokens_hit;      /* tokens their ready caches held */
    uint64_t commits;
    uint64_t entries_evicted; /* nodes removed by eviction (pool pressure, max_entries, evict) */
    uint64_t pages_evicted;   /* page references those nodes gave up */
    int32_t n_nodes;          /* spans of tokens */
    int32_t n_entries;        /* leaves: cached sequences that are no prefix of another */
    int32_t n_pages;          /* distinct pool pages the tree references */
    int32_t n_in_use;         /* caches holding an entry in use */
    int32_t n_pinned;         /* pins over all entries */
    int32_t n_states;         /* a memory's tree: distinct RECURRENT states it holds (in n_pages) */
    size_t bytes;             /* the bytes of those pages (a memory's groups' pages differ in size) */
} kvc_radix_stats;

KVCDEF kvc_result kvc_radix_config_init(kvc_radix_config *cfg, kvc_kind kind); /* zeros + kind */
/* An empty tree on pool; it counts among the pool's live_prefixes until destroyed. */
KVCDEF kvc_result kvc_radix_create(kvc_pool *pool, const kvc_radix_config *cfg, kvc_radix **out);
/* KVC_ERR_BUSY while a cache still holds an entry in use (destroy or release it first). */
KVCDEF kvc_result kvc_radix_destroy(kvc_radix *tree);
/* The longest cached prefix of tokens under ns as a new cache of the tree's kind that
   shares the tree's pages (O(pages), nothing copied; the first write into a shared
   page copies that page). Always leaves at least one token to evaluate: evaluate
   tokens[*n_reused ..]; an empty prompt (n_tokens 0, tokens may be NULL) reuses nothing. ROTATING: the prefix is shortened until the tree holds every
   page its window needs (sinks + the last window - 1 keys). On a miss the cache is
   empty. The entry it came from is in use until the cache is destroyed, cleared,
   released or committed elsewhere. */
KVCDEF kvc_result kvc_radix_lookup(kvc_radix *tree, kvc_namespace ns, const int32_t *tokens, int32_t n_tokens,
                                   kvc_cache **out, int32_t *n_reused);
/* After generation: insert tokens[0 .. min(n_tokens, offset)) — the prompt AND the
   generated tokens — with the K/V the cache holds for them (cache positions 0, 1, ...).
   What the tree already holds is kept (only the new part's pages are shared with the
   tree); the cache must be of the tree's pool and config, with no batch open. The new
   entry is in use by the cache (as for a lookup). priority (0 when all are equal):
   eviction takes the entries of the lowest priority first, least recently used first
   among equals (e.g. system prompt 2 > user turn 1 > assistant turn 0, the order
   mlx-lm's server keeps). A node keeps the highest priority of the commits through it;
   pins still win. */
KVCDEF kvc_result kvc_radix_commit(kvc_radix *tree, kvc_namespace ns, kvc_cache *cache, const int32_t *tokens,
                                   int32_t n_tokens, int32_t priority);
/* The cache no longer holds an entry in use (it stays valid; no-op if it held none). */
KVCDEF kvc_result kvc_radix_release(kvc_cache *cache);
/* Pin the cached sequence tokens[0 .. n_tokens) (a system prompt) so that eviction never
   takes it; pins nest. KVC_ERR_NOT_FOUND if the tree does not hold all of it. */
KVCDEF kvc_result kvc_radix_pin(kvc_radix *tree, kvc_namespace ns, const int32_t *tokens, int32_t n_tokens);
/* Undo one kvc_radix_pin of the same tokens (KVC_ERR_NOT_FOUND if they are not pinned). */
KVCDEF kvc_result kvc_radix_unpin(kvc_radix *tree, kvc_namespace ns, const int32_t *tokens, int32_t n_tokens);
/* Evict unreferenced leaves (lowest priority, then least recently used, first) until
   n_pages pages went back to the pool or nothing more can be evicted; *n_freed (may be
   NULL) = pages freed. */
KVCDEF kvc_result kvc_radix_evict(kvc_radix *tree, int32_t n_pages, int32_t *n_freed);
/* Counters since create and the tree's size now (walks the tree: O(nodes + pages)). */
KVCDEF kvc_result kvc_radix_stats_get(const kvc_radix *tree, kvc_radix_stats *stats);

/* The same family over a model memory (kvc_memory, "Hybrid models" below). */
/* A radix prefix tree over a memory's groups (no CAUSAL group): one tree, one lookup,
   one budget. An entry holds each group's share: FULL groups' pages, ROTATING groups'
   pages of the positions their window needs, RECURRENT groups' states at node ends. A
   lookup reuses the longest prefix every group can serve (FULL: any length; ROTATING:
   its window's pages are held; RECURRENT: a state at exactly that length), leaving one
   token to evaluate. A commit inserts every group and ends nodes at the checkpoints
   every RECURRENT group kept (kvc_memory_begin's checkpoints, e.g. the end of the
   system prompt), so a later request that branches there resumes from them. Eviction
   (kvc_memory_begin running short, kvc_radix_evict, max_entries) takes whole entries
   across the groups, states included. Pins, namespaces, priorities, counters and
   kvc_radix_destroy as for a pool's tree; the memory's pools live until the tree is
   destroyed. kvc_radix_lookup / _commit on it (and the _memory calls on a pool's tree)
   are KVC_ERR_UNSUPPORTED. cfg->cache is not used (the groups' policies are). */
KVCDEF kvc_result kvc_radix_create_memory(const kvc_memory *mem, const kvc_radix_config *cfg, kvc_radix **out);
/* A new memory on the tree's pools holding the longest cached prefix of tokens (every
   group's pages and states shared with the tree, nothing copied): evaluate
   tokens[*n_reused ..]. Its entry stays in use until the memory is destroyed, cleared,
   released or committed elsewhere. One token always remains to evaluate, and a
   RECURRENT group resumes only from a state the tree holds at exactly the reused length:
   looking up exactly the history a memory committed (no new token) reuses n_tokens - 1
   only if a checkpoint sat at n_tokens - 1 (name it in the last kvc_memory_begin, e.g.
   with a reserve), else it falls back to the last checkpoint before, or to 0. */
KVCDEF kvc_result kvc_radix_lookup_memory(kvc_radix *tree, kvc_namespace ns, const int32_t *tokens, int32_t n_tokens,
                                          kvc_memory **out, int32_t *n_reused);
/* kvc_radix_lookup_memory into a memory the engine already holds: mem's contents (every
   group; its checkpoints and the entry it held in use) are replaced by the same prefix
   that call would give -- the same pages and states, the same attention bits -- all or
   nothing (after an error mem is as it was). mem must be on the tree's pools: the memory
   the tree was made from, a fork of it, or a memory of its lookups (else
   KVC_ERR_FOREIGN); no batch open (KVC_ERR_STATE). mem's snapshots stay valid. One
   memory per conversation slot then lives as long as the engine; kvc_radix_destroy still
   waits for it to release its entry (kvc_radix_release_memory, clear or destroy). */
KVCDEF kvc_result kvc_radix_lookup_into_memory(kvc_radix *tree, kvc_namespace ns, const int32_t *tokens,
                                               int32_t n_tokens, kvc_memory *mem, int32_t *n_reused);
/* Insert tokens[0 .. min(n_tokens, offset)) with every group's K/V and states (the
   memory must be on the tree's pools: one of its lookups, or a fork of the memory the
   tree was made from; no batch open); priority as kvc_radix_commit. */
KVCDEF kvc_result kvc_radix_commit_memory(kvc_radix *tree, kvc_namespace ns, kvc_memory *mem, const int32_t *tokens,
                                          int32_t n_tokens, int32_t priority);
/* The memory no longer holds an entry in use (kvc_radix_release for every group). */
KVCDEF kvc_result kvc_radix_release_memory(kvc_memory *mem);

/* ---- Persistence: save and load caches, sequences, prefix-tree entries ------------ */
/* The format (docs/format.md): a header (magic, version, what) and the sections, in
   this order, CONF (layers, heads, dims, types, page size, cache config, namespace),
   META (counts: tokens, cells, and the window state), TOKS (your token ids), CELL
   (positions; a whole CAUSAL cache also each cell's index and sequence set) and KVDT
   (the storage bytes: per layer the cells' K rows, then their V rows), each with its
   tag, its length and an XXH64 checksum. A load checks the
   configuration and namespace against its target, reads everything into free pool
   pages and verifies every checksum before it changes the target: damaged, truncated
   or mismatched input returns an error and leaves the target as it was (a pool whose
   kvc_pool_config.rotate differs from the saved one: KVC_ERR_ROTATION). A load needs
   the pages it reads into free in the pool (it never evicts prefix-tree entries). On
   a big-endian host saving and loading return KVC_ERR_UNSUPPORTED. A load can tell its
   input is sound only after reading it, so a failed load must not have evicted anything:
   short of free pages it returns KVC_ERR_FULL with the trees untouched (kvc_radix_evict,
   then load again). */

/* Where bytes go and come from. write / read return the bytes moved: fewer than n means
   failure (write) or the end of the input (read). finish (may be NULL) is called once at
   the end of every save or load given this io, with ok = 1 on success; a nonzero return
   turns success into KVC_ERR_IO (the path io renames there). */
typedef struct kvc_io {
    size_t (*write)(void *user, const void *data, size_t n);
    size_t (*read)(void *user, void *data, size_t n);
    int (*finish)(void *user, int ok);
    void *user;
} kvc_io;

/* Memory: a save appends at size (data == NULL only counts: the bytes a save needs;
   past capacity it fails with KVC_ERR_IO); a load reads from pos up to size. */
typedef struct kvc_mem {
    unsigned char *data;
    size_t capacity, size, pos;
} kvc_mem;
/* An io over mem (which must outlive the saves and loads given this io). */
KVCDEF kvc_result kvc_io_memory(kvc_mem *mem, kvc_io *io);

#ifndef KVCACHE_NO_STDIO
#include <stdio.h>
#define KVC_PATH_MAX 4096
/* An open FILE (the caller closes it; finish flushes after a save). */
KVCDEF kvc_result kvc_io_stdio(FILE *file, kvc_io *io);
/* A file by name: a save writes a temporary file "<path>.kvctmp-<16 hex digits>" (a
   name of its own: saves to one path at once do not collide; tmp holds it) and renames
   it onto path when it succeeded (removes it when not), so readers never see a
   half-written file and the last save to finish wins; a load opens path and closes it
   at the end. `state` is yours: keep it until that save or load returns. KVC_ERR_IO if
   the file cannot be opened, KVC_ERR_RANGE for a path of KVC_PATH_MAX bytes or more. */
typedef struct kvc_path_io {
    FILE *file;
    int writing;
    char path[KVC_PATH_MAX];
    char tmp[KVC_PATH_MAX + 32];
} kvc_path_io;
KVCDEF kvc_result kvc_io_path(kvc_path_io *state, const char *path, int writing, kvc_io *io);
#endif

/* A cache of any kind (no batch open), with your token ids (any n_tokens >= 0; e.g. the
   tokens at positions 0 .. offset-1), under namespace ns. ROTATING: every page held is
   saved, the reserve's too; the reserve itself is not part of the saved configuration, so
   a cache of any reserve loads it (one without a reserve drops the extra pages at its next
   kvc_begin). RECURRENT: every sequence's state and the tokens it consumed. ROTATING and
   RECURRENT: the checkpoints are saved with it (each page once), so the loaded cache
   rewinds and is reused exactly as this one. A pool whose K/V live on a device
   (kvcache_vk.h) saves and loads the same bytes through its page hooks. */
KVCDEF kvc_result kvc_cache_save(const kvc_cache *cache, kvc_namespace ns, const int32_t *tokens,
                                 int32_t n_tokens, const kvc_io *io);
/* Replace the cache's contents with a saved cache of the same pool configuration, kind
   and window/sinks (CAUSAL: window and chunk; its capacity and max_seqs must hold the
   saved cells; RECURRENT: its max_seqs must hold the saved sequences). The saved tokens
   go to tokens[0 .. *n_tokens) (tokens may be NULL; KVC_ERR_RANGE if max_tokens is too
   small; n_tokens may be NULL). The result is bit-exact: same offset, window state,
   positions, sequence sets, states and K/V bytes, and the saved checkpoints replace the
   cache's (a cache keeps at most its own cfg.checkpoints of them: the newest). */
KVCDEF kvc_result kvc_cache_load(kvc_cache *cache, kvc_namespace ns, const kvc_io *io, int32_t *tokens,
                                 int32_t max_tokens, int32_t *n_tokens);
/* One sequence of a CAUSAL cache: its cells' positions and K/V. Loading puts them into
   free cells of any CAUSAL cache of the same configuration as sequence dst (dst's old
   cells dropped first), as kvc_seq_restore does. */
KVCDEF kvc_result kvc_seq_save(const kvc_cache *cache, int32_t seq, kvc_namespace ns, const int32_t *tokens,
                               int32_t n_tokens, const kvc_io *io);
KVCDEF kvc_result kvc_seq_load(kvc_cache *cache, int32_t dst, kvc_namespace ns, const kvc_io *io, int32_t *tokens,
                               int32_t max_tokens, int32_t *n_tokens);
/* A prefix-tree entry: the cached sequence tokens[0 .. n_tokens) under ns with its K/V
   (ROTATING: the sinks and window a lookup would use; a memory's tree: every group's
   share, RECURRENT states included). KVC_ERR_NOT_FOUND if the tree does not hold it
   whole (a memory's tree: unless a lookup could reuse exactly n_tokens, states
   included). Loading commits it to a tree of the same configuration (pinned if pin !=
   0: a system prompt loaded at start-up); *n_tokens (may be NULL) = its length. */
KVCDEF kvc_result kvc_radix_save(kvc_radix *tree, kvc_namespace ns, const int32_t *tokens, int32_t n_tokens,
                                 const kvc_io *io);
KVCDEF kvc_result kvc_radix_load(kvc_radix *tree, kvc_namespace ns, const kvc_io *io, int pin, int32_t *n_tokens);

/* ---- Hybrid models: recurrent state, checkpoints, one memory over layer groups ----- */
/* Models that mix layer kinds (sliding-window beside full attention: Gemma, gpt-oss,
   Qwen3 variants; recurrent beside attention: LFM2, Qwen3-Next, Granite 4 H) keep each
   kind of layer in its own cache: a kvc_memory groups them under one budget, and every
   operation on it is all or nothing across the groups.

   RECURRENT caches live on a state pool (kvc_pool_config.state_floats): per layer and
   sequence a fixed-size f32 state that the engine updates in place. A state cannot be
   rewound, so it goes back only to checkpoints (offsets named when a batch begins) and
   snapshots; any other target is KVC_ERR_UNREACHABLE (kvc_cache_trim, kvc_cache_restore,
   kvc_snapshot_take, and the kvc_memory_* calls alike), with nothing changed;
   KVC_ERR_RECURRENT is for cutting tokens out of a state's middle (kvc_seq_remove) and
   for abandoning a batch whose states were handed out. ROTATING caches keep checkpoints the
   same way, which lets a wrapped window go back to them. For speculative decoding, a
   reserve of R tokens (kvc_cache_config.reserve) lets both kinds go back by up to R
   tokens without naming checkpoints. */

/* Checkpoints: kvc_begin's at[0 .. n_at) names offsets inside the batch (offset < at[i]
   <= offset + n_tokens, increasing, at most cfg.checkpoints of them) to which the cache
   must be able to return afterwards: kvc_cache_trim, kvc_cache_restore(cache, NULL, at), kvc_snapshot_take and
   prefix reuse then reach them. FULL caches reach every offset anyway (accepted, nothing
   kept); CAUSAL caches refuse checkpoints (KVC_ERR_UNSUPPORTED). RECURRENT: the engine
   hands each layer's state at an offset inside the batch over with kvc_state_checkpoint
   while it scans (the batch's end is taken from the live state); a checkpoint missing a
   layer is not kept. ROTATING: the library keeps the window as it was at `at`. A cache
   keeps its latest cfg.checkpoints checkpoints and drops those past a rewind; a RECURRENT
   reserve (kvc_cache_config.reserve) adds its own on sequence 0 (kvc_begin_batch adds
   none), and an offset both named and the reserve's is one checkpoint. */
/* RECURRENT, during a batch (kvc_begin or kvc_begin_batch): the live f32 state of
   (seq, layer), state_floats values, to update in place for the batch's tokens of seq.
   Asking for a layer counts as its kvc_put; the pointers stay writable until the next
   call on this cache other than kvc_state and kvc_state_checkpoint. KVC_ERR_STATE when
   no batch is open or seq is not in it. A new sequence's state is all zeros. */
KVCDEF kvc_result kvc_state(kvc_cache *cache, int32_t seq, int32_t layer, float **state);
/* RECURRENT, any time: the state of (seq, layer), read only; *state = NULL while the
   sequence has consumed no token (all zeros). Valid until the cache changes. */
KVCDEF kvc_result kvc_state_read(const kvc_cache *cache, int32_t seq, int32_t layer, const float **state);
/* RECURRENT, during a batch named with kvc_begin: copy layer's state as it
   is after `at` tokens (the engine's scan at that point) into the checkpoint `at`.
   KVC_ERR_RANGE if `at` lies outside the batch (at <= its start or at > its end);
   KVC_ERR_NOT_FOUND (harmless, nothing done) for an offset inside it that the batch
   does not ask for (kvc_batch_checkpoints lists those it asks for). The batch's end is
   taken from the live state: KVC_OK, nothing copied, when it is asked for. */
KVCDEF kvc_result kvc_state_checkpoint(kvc_cache *cache, int32_t layer, int32_t at, const float *state);
/* RECURRENT, during a batch (after kvc_begin, until the next call
   other than kvc_state and kvc_state_checkpoint): the offsets inside the batch, increasing,
   whose state the engine must hand over with kvc_state_checkpoint for every layer -- the
   ones kvc_begin named and, with a reserve (kvc_cache_config.reserve), the
   reserve's (the batch's last R offsets) -- the batch's end left out (taken from the live
   state). A checkpoint some layer never gets is dropped when the batch ends (counted in
   kvc_memory_stats.checkpoints_dropped). at may be NULL with max_at 0 to count them;
   KVC_ERR_RANGE (with *n_at set) if max_at is too small. KVC_ERR_STATE when no batch is
   open. Other kinds: *n_at = 0 (nothing to hand over). */
KVCDEF kvc_result kvc_batch_checkpoints(const kvc_cache *cache, int32_t *at, int32_t max_at, int32_t *n_at);
/* Snapshots at an offset: kvc_snapshot_take's `at` may be, besides KVC_POS_END (the
   offset): FULL any at <= offset; ROTATING at the
   offset, inside the last batch, or at a checkpoint; RECURRENT at the offset or a
   checkpoint (else KVC_ERR_UNREACHABLE, as kvc_cache_trim and kvc_cache_restore answer for a target
   out of reach; once KVC_ERR_RECURRENT for a RECURRENT cache). A ROTATING or
   RECURRENT snapshot also carries the cache's checkpoints at or before `at`, which a
   restore to target brings back up to target (a restore to `at` keeps the one at `at`,
   as a rewind to `at` does). */
/* Whether kvc_cache_restore(cache, NULL, target) and a kvc_cache_trim to target would succeed now (no
   batch open); 0 always for every kind but CAUSAL (clearing). */
KVCDEF kvc_result kvc_cache_can_rewind(const kvc_cache *cache, int32_t target, int *can_rewind);
/* The offsets of the cache's checkpoints, oldest first; at may be NULL with max_at 0 to
   count them; KVC_ERR_RANGE (with *n_at set) if max_at is too small. */
KVCDEF kvc_result kvc_cache_checkpoints(const kvc_cache *cache, int32_t *at, int32_t max_at, int32_t *n_at);

/* A model memory: every model layer belongs to one group; a group is a pool of its own
   shape (kv heads, head dims, storage types, page size; or state_floats) and one cache
   of its policy (FULL, ROTATING with its window and sinks, CAUSAL, RECURRENT), and all
   groups draw pages from one budget. Each group's pool reserves address space for the
   whole budget from the allocator but only pages in use are touched; arena mode is not
   offered for memories. */
typedef struct kvc_memory_snapshot kvc_memory_snapshot;

typedef struct kvc_group_config {
    kvc_pool_config pool;   /* n_layers = the model layers in this group; shapes and types,
                               or state_floats; hooks for a device backend (kvcache_vk.h).
                               budget_bytes, runtime and arena stay 0: the memory's apply */
    kvc_cache_config cache; /* the group's policy */
} kvc_group_config;

typedef struct kvc_memory_config {
    int32_t n_layers;               /* the model's layers */
    const int32_t *layer_group;     /* [n_layers] the group of each layer; a group's layers
                                       are its layers 0, 1, ... in model order */
    int32_t n_groups;               /* 1 .. KVC_MAX_GROUPS */
    const kvc_group_config *groups; /* [n_groups] */
    size_t budget_bytes;            /* one hard cap for every group's pages */
    kvc_runtime runtime;            /* every group's allocator, parallel_for, lock (one lock:
                                       they share the budget), cpu_disable */
} kvc_memory_config;
#define KVC_MAX_GROUPS 64

typedef struct kvc_memory_stats {
    size_t budget_bytes, bytes_used;
    int32_t n_groups;
    int32_t offset;                 /* tokens held (kvc_memory_offset) */
    int32_t n_checkpoints;          /* offsets below `offset` every group can return to (the
                                       current offset, always reachable, is not counted) */
    size_t checkpoint_bytes;        /* pages held only by checkpoints, all groups */
    uint64_t checkpoints_dropped;   /* since create (or fork): checkpoints a batch asked for
                                       (named in kvc_memory_begin, or a reserve's) that a
                                       RECURRENT group dropped when the batch ended, because
                                       some layer's state never came (kvc_memory_state_checkpoint),
                                       summed over groups; 0 while the engine hands every
                                       offset of kvc_memory_batch_checkpoints over */
} kvc_memory_stats;

KVCDEF kvc_result kvc_memory_config_init(kvc_memory_config *cfg); /* zeros */
/* Validate a configuration without creating anything: KVC_OK, or the result
   kvc_memory_create would give with *field (may be NULL) naming what is wrong, e.g.
   "layer_group" (a layer maps to no group, or a group gets no layer), "groups.pool.n_layers"
   (a group's layer count differs from the layers mapped to it), "groups.pool" (a memory
   field set in a group, or an invalid shape), "groups.cache" (a policy its pool cannot
   take; "groups.cache.reserve": a reserve the group's kind refuses), "budget_bytes"
   (too small for one page of every group and one state per sequence of every RECURRENT
   group). */
KVCDEF kvc_result kvc_memory_config_check(const kvc_memory_config *cfg, const char **field);
/* The memory copies cfg and what it points to (layer_group[], groups[] and the pool and
   cache configs in them): they need not outlive the call. */
KVCDEF kvc_result kvc_memory_create(const kvc_memory_config *cfg, kvc_memory **out);
/* Destroys the memory's caches; the pools go with the last memory (forks share them)
   or memory snapshot that uses them. KVC_ERR_BUSY, nothing destroyed, where the pools
   would go while something made directly on a group's cache or pool is alive (a
   kvc_snapshot_take of kvc_memory_group's cache, a tree or prefix object): free it first
   (as kvc_vk_memory_destroy asks). */
KVCDEF kvc_result kvc_memory_destroy(kvc_memory *mem);
/* The cache holding model layer `layer`, and that layer's index within it; a group's
   cache. The memory keeps owning it, and keeps its groups in step: on a memory of two or
   more groups, a call on such a cache that would change it alone -- kvc_begin*,
   kvc_cancel, kvc_cache_trim, kvc_cache_restore, kvc_cache_clear, kvc_seq_* changes, kvc_cache_defrag,
   kvc_cache_load, kvc_seq_load, kvc_prefix_create -- returns KVC_ERR_OWNED and changes
   nothing (the kvc_memory_* calls do these for every group). kvc_cache_destroy and
   kvc_cache_fork are refused on any memory's cache (kvc_memory_destroy, kvc_memory_fork).
   Reads (kvc_attention, kvc_state_read, kvc_cache_gather, kvc_cache_can_rewind, ...), snapshots
   and the per-layer calls of a memory batch (kvc_put, kvc_state, kvc_state_checkpoint) work
   on it. A memory of one group has nothing to keep in step: its cache takes every call
   but those two (a CAUSAL engine's kvc_seq_* on sequence 0, say). */
KVCDEF kvc_result kvc_memory_layer(const kvc_memory *mem, int32_t layer, kvc_cache **cache, int32_t *group_layer);
KVCDEF kvc_result kvc_memory_group(const kvc_memory *mem, int32_t group, kvc_cache **cache);
/* A batch of n_tokens in every group, with checkpoints as kvc_begin; all or
   nothing: KVC_ERR_FULL when the groups' pages together exceed the budget (after evicting
   unused tree entries) or a CAUSAL group has no room, KVC_ERR_NO_MEMORY when an
   allocation is refused; then no group changed and no entry was evicted. */
KVCDEF kvc_result kvc_memory_begin(kvc_memory *mem, int32_t n_tokens, const int32_t *at, int32_t n_at);
/* The per-layer calls by model layer: kvc_put, kvc_attention, kvc_state,
   kvc_state_checkpoint on the layer's group. */
KVCDEF kvc_result kvc_memory_put(kvc_memory *mem, int32_t layer, const float *k, const float *v);
KVCDEF kvc_result kvc_memory_attention(const kvc_memory *mem, int32_t layer, const kvc_attention_desc *desc);
KVCDEF kvc_result kvc_memory_state(kvc_memory *mem, int32_t layer, int32_t seq, float **state);
KVCDEF kvc_result kvc_memory_state_checkpoint(kvc_memory *mem, int32_t layer, int32_t at, const float *state);
/* kvc_state_read and kvc_batch_checkpoints by model layer (sequence 0's state; a layer
   of a group that is not RECURRENT: KVC_ERR_UNSUPPORTED, resp. *n_at = 0). */
KVCDEF kvc_result kvc_memory_state_read(const kvc_memory *mem, int32_t layer, const float **state);
KVCDEF kvc_result kvc_memory_batch_checkpoints(const kvc_memory *mem, int32_t layer, int32_t *at, int32_t max_at,
                                               int32_t *n_at);
/* Abandon the batch in every group, also in groups whose layers were all put already.
   KVC_ERR_RECURRENT (nothing changed) once a RECURRENT group has handed out a state. */
KVCDEF kvc_result kvc_memory_cancel(kvc_memory *mem);
/* Tokens the memory holds (every group agrees). */
KVCDEF kvc_result kvc_memory_offset(const kvc_memory *mem, int32_t *offset);
/* Whether every group can go back to target (0 always: clearing), i.e. whether
   kvc_memory_trim and kvc_memory_restore(mem, NULL, target) succeed; the largest such
   target <= max_target. */
KVCDEF kvc_result kvc_memory_can_rewind(const kvc_memory *mem, int32_t target, int *can_rewind);
KVCDEF kvc_result kvc_memory_rewind_point(const kvc_memory *mem, int32_t max_target, int32_t *target);
/* Drop the last n_tokens in every group; KVC_ERR_UNREACHABLE (nothing changed) unless
   every group can go back there (RECURRENT and wrapped ROTATING groups: a checkpoint, the
   reserve, or 0 -- dropping everything is always possible). */
KVCDEF kvc_result kvc_memory_trim(kvc_memory *mem, int32_t n_tokens);
KVCDEF kvc_result kvc_memory_clear(kvc_memory *mem);
/* Snapshot of every group as after `at` tokens (kvc_snapshot_take per group; at =
   KVC_POS_END: the offset);
   *out = NULL when at <= from or at == 0. O(pages), nothing copied. `from` bounds only
   what FULL groups hold (their tokens [from, at); a restore keeps the memory's own tokens
   below from). A RECURRENT group holds its whole state at `at` whatever from is (a state
   sums up every token before it: there is no part of it to leave out), a ROTATING group
   its whole window at `at`; both also carry their checkpoints before `at`. */
KVCDEF kvc_result kvc_memory_snapshot_take(kvc_memory *mem, int32_t from, int32_t at, kvc_memory_snapshot **out);
/* Bring every group to target from the snapshot (NULL: from the memory itself), all or
   nothing. The snapshot restores into any memory sharing its pools (itself or a fork).
   A FULL group whose page at the snapshot's `from` is no longer the snapshot's needs a
   copy of it: as kvc_memory_begin, the restore evicts unused tree entries for that room
   if it must, once everything else it allocates has succeeded; KVC_ERR_FULL (the budget
   holds it even so) or KVC_ERR_NO_MEMORY leave every group as it was and evict nothing. */
KVCDEF kvc_result kvc_memory_restore(kvc_memory *mem, const kvc_memory_snapshot *snap, int32_t target);
KVCDEF kvc_result kvc_memory_snapshot_free(kvc_memory_snapshot *snap); /* NULL is fine */
/* A new memory on the same pools with the same contents, sharing every page. */
KVCDEF kvc_result kvc_memory_fork(const kvc_memory *mem, kvc_memory **out);
KVCDEF kvc_result kvc_memory_stats_get(const kvc_memory *mem, kvc_memory_stats *stats);
/* The whole memory (no batch open) with your token ids, and back, checkpoints included;
   a load replaces every group or none (the groups are read into fresh pages first: the
   budget must hold them beside the memory's current pages). */
KVCDEF kvc_result kvc_memory_save(const kvc_memory *mem, kvc_namespace ns, const int32_t *tokens, int32_t n_tokens,
                                  const kvc_io *io);
KVCDEF kvc_result kvc_memory_load(kvc_memory *mem, kvc_namespace ns, const kvc_io *io, int32_t *tokens,
                                  int32_t max_tokens, int32_t *n_tokens);

/* ---- Tiers: prefixes that outlive the pool ----------------------------------------- */
/* Below a prefix tree (a pool's or a memory's), what eviction takes goes down a tier
   instead of away: a host-RAM tier with its own hard byte budget, then a store -- byte
   blobs by key, through callbacks you supply (kvc_store_dir below: a directory; a Redis
   adapter is examples/redis_store.c). kvc_tier_fetch brings the longest prefix a tier
   holds back into the tree, bit for bit as it was; then kvc_radix_lookup (or _memory)
   reuses it as usual.

   A blob is the entry as kvc_radix_save writes it (docs/format.md: what 3, or 5 for a
   memory's tree), so it carries its configuration, namespace, tokens and a checksum per
   section. Its key is a hash chain (SHA-256) over the tree's fingerprint -- namespace,
   every group's shape, types, page size, cache kind, window, sinks, rotation, RoPE, the
   memory's layer map, block_tokens: everything that makes two caches compatible, as
   little-endian fields, never a pointer -- and the tokens in blocks of block_tokens:
   K_0 = SHA-256(fingerprint), K_i = SHA-256(K_{i-1} || block i's tokens as u32 LE), and
   the prefix of i blocks is stored under K_i. Any process with the same model and
   configuration finds the same keys; no other one does. Entries are kept at block
   boundaries only (an evicted entry of L tokens is kept as its longest prefix of whole
   blocks that the tree can save: ROTATING parts need their window's pages, RECURRENT
   parts a state at that length -- name checkpoints at multiples of block_tokens), so a
   fetch probes at most n_tokens / block_tokens keys.

   On the way up a blob is checked before it touches the pool: its header and token
   section must hold exactly the tokens looked up, then the load checks configuration,
   namespace and every checksum; a damaged, truncated, foreign or missing blob is
   refused whole (counted in kvc_tier_stats.refused) and the fetch goes on with a
   shorter prefix or nothing: a failing store costs recomputation, never a wrong answer.
   On the way down a refused write (budget, allocation, store error) only loses the copy:
   the tree changes exactly as eviction without tiers would. The store is called under
   the pool's lock, with the timeout you set: each call must return by then (the library
   cannot interrupt it). After a store call fails or times out the tier makes no more
   until the next kvc_tier_fetch, kvc_tier_publish or kvc_tier_flush (each tries again),
   so a store that is down or hangs costs a request at most one timeout, then a
   recompute -- not one per probed block or evicted entry. Under a device pool's or
   memory's tree (kvcache_vk.h) the pages move through the backend's page hooks, bounded
   staging, synchronous (kvc_vk_pool_cmd_fetch, kvc_vk_memory_cmd_fetch: a fetch's copies
   recorded into your command buffer instead): kvcache_vk.h, "Saves and loads", says why
   and what it asks of you. */
typedef struct kvc_key {
    unsigned char bytes[32]; /* SHA-256 */
} kvc_key;

/* Byte blobs by key; every call returns a kvc_result (KVC_ERR_NOT_FOUND: no such blob;
   anything else that is not KVC_OK is a failure the tier counts and works around). */
typedef struct kvc_store {
    /* Store data[0 .. size) under key, replacing what is there (readers must never see
       part of a blob: write, then publish). */
    kvc_result (*put)(void *user, const kvc_key *key, const void *data, size_t size, int32_t timeout_ms);
    /* *size = the blob's bytes. */
    kvc_result (*exists)(void *user, const kvc_key *key, size_t *size, int32_t timeout_ms);
    /* The blob into data[0 .. capacity), *size = its bytes (KVC_ERR_RANGE if it does not
       fit). */
    kvc_result (*get)(void *user, const kvc_key *key, void *data, size_t capacity, size_t *size,
                      int32_t timeout_ms);
    kvc_result (*erase)(void *user, const kvc_key *key, int32_t timeout_ms); /* may be NULL */
    void *user;
} kvc_store;

typedef struct kvc_tier_config {
    size_t host_bytes;     /* the host-RAM tier's hard budget (the blobs' bytes, from the pool's
                              allocator: in arena mode its object heap); 0: none */
    int32_t block_tokens;  /* key granularity; 0: the largest page_cells of the tree's K/V pools */
    kvc_store store;       /* put, exists and get all NULL: no store */
    int32_t timeout_ms;    /* given to every store call, which must return by then (0: the
                              store's default) */
    size_t max_blob_bytes; /* a store blob larger than this is refused; 0: 1 << 30 */
} kvc_tier_config;

typedef struct kvc_tier_stats {
    uint64_t kept_host;      /* evicted entries kept in the host tier */
    uint64_t kept_store;     /* blobs written to the store (evicted, spilled or published) */
    uint64_t dropped;        /* evicted entries no tier kept (no whole block, budget, errors) */
    uint64_t fetched_host;   /* blobs brought back into the tree from the host tier */
    uint64_t fetched_store;  /* ... from the store */
    uint64_t tokens_fetched; /* the tokens those blobs held */
    uint64_t refused;        /* blobs refused on the way up: damaged, truncated, foreign, other tokens */
    uint64_t store_errors;   /* store calls that failed (not counting KVC_ERR_NOT_FOUND) */
    int32_t host_blobs;      /* in the host tier now */
    size_t host_bytes;       /* their bytes (<= kvc_tier_config.host_bytes) */
} kvc_tier_stats;

/* SHA-256 of data[0 .. n) (FIPS 180-4) into out[32]. */
KVCDEF kvc_result kvc_sha256(const void *data, size_t n, unsigned char out[32]);
/* The key as 64 lowercase hex digits and a NUL. */
KVCDEF kvc_result kvc_key_hex(const kvc_key *key, char out[65]);
KVCDEF kvc_result kvc_tier_config_init(kvc_tier_config *cfg); /* zeros */
/* Give tree its tiers (once; they go with kvc_radix_destroy, the host tier's blobs with
   them: kvc_tier_flush first to keep those). The store's callbacks and user must outlive
   the tree. KVC_ERR_STATE if it has tiers already; KVC_ERR_INVALID for a negative
   block_tokens or timeout. */
KVCDEF kvc_result kvc_tier_attach(kvc_radix *tree, const kvc_tier_config *cfg);
/* The key of tokens[0 .. n_tokens) under ns in the tree's tiers (n_tokens a positive
   multiple of block_tokens, else KVC_ERR_INVALID; a tree without tiers: KVC_ERR_STATE). */
KVCDEF kvc_result kvc_tier_key(const kvc_radix *tree, kvc_namespace ns, const int32_t *tokens, int32_t n_tokens,
                               kvc_key *key);
/* Bring back the longest prefix of tokens[0 .. n_tokens) under ns that a tier holds and
   that is longer than what the tree serves now: host tier first, then the store, at
   each block boundary from the longest down. The entry is committed to the tree (its
   blob leaves the host tier; the store keeps its copy); when the pool is short of pages
   the tree evicts its least recently used entries (down the tiers) to make room, once.
   *n_fetched = the tokens of the entry brought back (0: none; then the tree is as it
   was). A failing store or refused blob is not an error of the fetch: KVC_OK with a
   shorter or no prefix. */
KVCDEF kvc_result kvc_tier_fetch(kvc_radix *tree, kvc_namespace ns, const int32_t *tokens, int32_t n_tokens,
                                 int32_t *n_fetched);
/* Write the entry tokens[0 .. n_tokens) under ns -- its longest prefix of whole blocks
   that the tree holds -- to the store now (write-through: another process serving the
   same prompt finds it without waiting for this one to evict it). *n_published (may be
   NULL) = its tokens (0: no whole block held). KVC_ERR_STATE without a store; the
   store's error if the write failed. */
KVCDEF kvc_result kvc_tier_publish(kvc_radix *tree, kvc_namespace ns, const int32_t *tokens, int32_t n_tokens,
                                   int32_t *n_published);
/* Move every host-tier blob to the store (before kvc_radix_destroy, to keep them);
   blobs the store refuses stay. */
KVCDEF kvc_result kvc_tier_flush(kvc_radix *tree);
KVCDEF kvc_result kvc_tier_stats_get(const kvc_radix *tree, kvc_tier_stats *stats);

#ifndef KVCACHE_NO_STDIO
/* A store in a directory (which must exist): one file per blob, "<dir>/<key hex>.kvc",
   written to a temporary file of its own name and renamed into place (kvc_io_path), so
   several processes may share the directory: readers see a whole blob or none, and a
   blob's content is fixed by its key. Uses only C stdio, which has no timeout: for a
   local file system (one that can hang, e.g. over a network, wants a store of your own
   that keeps to timeout_ms). `state` must outlive the store. KVC_ERR_RANGE for a dir
   too long for KVC_PATH_MAX. */
typedef struct kvc_store_dir_state {
    char dir[KVC_PATH_MAX];
} kvc_store_dir_state;
KVCDEF kvc_result kvc_store_dir(kvc_store_dir_state *state, const char *dir, kvc_store *store);
#endif

/* ================================================================================= */
/* Advanced parts: views, CAUSAL multi-sequence calls, the pthread helper, CPU paths,
   page events. An engine that uses FULL or ROTATING caches with kvc_attention needs
   none of them. */
/* ================================================================================= */

/* ---- Views for callers with their own attention ---------------------------------- */
typedef struct kvc_run {
    const void *k;        /* n_cells rows of k_row_bytes, storage type type_k */
    const void *v;        /* n_cells rows of v_row_bytes */
    const int32_t *pos;   /* n_cells positions */
    int32_t n_cells;
} kvc_run;
/* Zero-copy: the cells of kvc_cache_cells() as contiguous runs, in position order.
   Pass runs = NULL (and max_runs 0) to learn *n_runs. KVC_ERR_RANGE (with *n_runs set)
   if max_runs is too small. Pointers stay valid until the next call that changes the
   cache. The rows are the stored ones: with kvc_pool_config.rotate, R k / R v (rotate
   q the same way for scores, and the output back, with kvc_rotate_rows). */
KVCDEF kvc_result kvc_cache_runs(const kvc_cache *cache, int32_t layer, kvc_run *runs,
                                 int32_t max_runs, int32_t *n_runs);
/* Copy: the same cells converted to f32 (and rotated back: plain k and v whatever
   kvc_pool_config.rotate), k [n][n_kv_heads][head_dim_k], v likewise,
   pos [n] (any of the three may be NULL; all three NULL only counts). KVC_ERR_RANGE
   (with *n_cells set) if max_cells is too small. */
KVCDEF kvc_result kvc_cache_gather(const kvc_cache *cache, int32_t layer, float *k, float *v,
                                   int32_t *pos, int32_t max_cells, int32_t *n_cells);

/* ---- CAUSAL: sequences, masks, defrag (ollama's kvcache.Causal) ----------------- */
/* CAUSAL: start a forward pass over a batch of (position, sequence) pairs (StartForward
   of ollama's causal cache, kvcache.Causal). Cells no sequence of the batch can see any
   more (sliding window) are released first; the batch takes the first run of free
   cells, after a defrag if there is none; KVC_ERR_FULL (nothing changed) when fewer
   cells are free than the batch needs.
   non_causal (optional) marks tokens that see every cell of their sequence in the
   attention range, later positions too (ollama's image tokens). kvc_begin(cache, n, NULL, 0) on
   a CAUSAL cache is a batch of sequence 0 continuing after its last position. */
typedef struct kvc_batch {
    int32_t n_tokens;
    const int32_t *pos;              /* [n_tokens], >= 0 */
    const int32_t *seq;              /* [n_tokens], 0 .. max_seqs-1 */
    const unsigned char *non_causal; /* [n_tokens] or NULL */
} kvc_batch;
KVCDEF kvc_result kvc_begin_batch(kvc_cache *cache, const kvc_batch *batch);


/* The mask of the current batch for callers with their own attention: rows = batch
   tokens padded up to a multiple of row_pad (padding rows all -inf), cols = the cells
   the batch reads, [*first_cell, *first_cell + *n_cols), a multiple of the cache's
   padding. 0 where the token may see the cell, -INFINITY elsewhere. Pass mask = NULL
   to learn the sizes; KVC_ERR_RANGE if max_floats is too small. The K/V of those cells
   are kvc_cache_runs / kvc_cache_gather of the same cache. */
KVCDEF kvc_result kvc_mask_export(const kvc_cache *cache, int32_t row_pad, float *mask, size_t max_floats,
                                  int32_t *n_rows, int32_t *n_cols, int32_t *first_cell);
/* dst shares src's cells with position < len (no K/V copied); dst's old cells are dropped. */
KVCDEF kvc_result kvc_seq_copy_prefix(kvc_cache *cache, int32_t src, int32_t dst, int32_t len);
/* Drop seq from cells with position in [begin, end); its later cells move back by
   end - begin and their keys are re-rotated (config rope). KVC_ERR_SHARED, with nothing
   changed, if a cell that would move is shared with another sequence. RECURRENT: only the
   whole sequence, [0, KVC_POS_END), which drops its state; any other range is
   KVC_ERR_RECURRENT (a state cannot lose some of its tokens). */
KVCDEF kvc_result kvc_seq_remove(kvc_cache *cache, int32_t seq, int32_t begin, int32_t end);
KVCDEF kvc_result kvc_seq_keep(kvc_cache *cache, int32_t seq); /* drop every other sequence */
/* Smallest and largest position held for seq; both -1 if it holds none (RECURRENT: 0 and
   the last token its state consumed). */
KVCDEF kvc_result kvc_seq_pos_range(const kvc_cache *cache, int32_t seq, int32_t *min_pos, int32_t *max_pos);
/* Whether seq can continue at pos: with a window, the cells that position needs are all held. */
KVCDEF kvc_result kvc_seq_can_resume(const kvc_cache *cache, int32_t seq, int32_t pos, int *can_resume);
/* Move live cells to the front in as few block moves as possible. *n_moves may be NULL. */
KVCDEF kvc_result kvc_cache_defrag(kvc_cache *cache, int32_t *n_moves);
/* Per-sequence state, like llama.cpp's: the sequence's cells (positions and K/V of every
   layer) copied into pages of the pool; restore puts them back into free cells of any
   CAUSAL cache of the same pool, as sequence dst (dst's old cells are dropped first). */
KVCDEF kvc_result kvc_seq_snapshot(kvc_cache *cache, int32_t seq, kvc_snapshot **out);
KVCDEF kvc_result kvc_seq_restore(kvc_cache *cache, const kvc_snapshot *snap, int32_t dst);

/* ---- Threads: what may run at once; a pool lock; a pthread pool (KVCACHE_THREADS) --
   The contract. Without a lock (the default) a pool and everything made from it belong
   to one thread at a time. With a pool lock (kvc_pool_config.runtime.lock/unlock, recursive;
   kvc_memory_config's for a memory's pools):
   - distinct caches of the pool may be used from different threads at once: every
     call, prefix-tree calls (lookup, commit, release, pin, evict, stats, save, load)
     and eviction under page pressure included;
   - one cache (snapshot, kvc_prefix, kvc_memory) is used by one thread at a time, the
     const getters included while another thread changes it: the lock guards what caches
     share, not a cache's own state;
   - kvc_put, kvc_attention, kvc_state and kvc_state_checkpoint take no lock (the pages
     a batch writes are the cache's own since kvc_begin, which does the copy-on-write);
     every other call that touches pages, refcounts, trees or counters takes it, once per
     call (kvc_begin: once per batch). Pool and tree getters (kvc_pool_stats_get,
     kvc_radix_stats_get) take it too;
   - the allocator, parallel_for and page-event hooks are called as before; the allocator
     and page events under the lock, parallel_for never;
   - kvc_pool_destroy, kvc_radix_destroy: when no other thread uses the object any more.
   The Vulkan backend (kvcache_vk.h) takes no lock: one thread at a time per device pool.
   Reading pages that other caches share (a prefix-tree hit, a fork) is safe: nothing
   writes a page that more than one holder references.

   Optional, #define KVCACHE_THREADS where the implementation is compiled (link with
   -lpthread): kvc_threads, a small pthread pool that serves as the parallel_for hook,
   and kvc_mutex, a recursive mutex that serves as the pool lock. n_threads counts the
   calling thread, which works too. A thread that runs out of work polls briefly before
   it sleeps (KVCACHE_THREADS_SPIN), so back-to-back calls do not wait for the kernel to
   wake it. One kvc_threads may serve several pools and threads: jobs given to it at
   once run one after the other (a task must not give it a job of its own). */
#ifdef KVCACHE_THREADS
typedef struct kvc_threads kvc_threads;
KVCDEF kvc_result kvc_threads_create(int32_t n_threads, kvc_threads **out);
KVCDEF kvc_result kvc_threads_destroy(kvc_threads *threads); /* after every pool using it */
/* Sets runtime->parallel_for, parallel_user and n_workers (a pool's or a memory's). */
KVCDEF kvc_result kvc_threads_attach(kvc_threads *threads, kvc_runtime *runtime);
/* The hook itself (user = the kvc_threads): what kvc_threads_attach puts in the config. */
KVCDEF void kvc_threads_parallel_for(void *threads, int32_t n_tasks, kvc_task_fn fn, void *ctx);

typedef struct kvc_mutex kvc_mutex;
/* A recursive mutex (a thread may take it again while it holds it) for pool locks. */
KVCDEF kvc_result kvc_mutex_create(kvc_mutex **out);
KVCDEF kvc_result kvc_mutex_destroy(kvc_mutex *mutex); /* after every pool using it */
/* Sets runtime->lock, unlock and lock_user to this mutex (a pool's or a memory's). */
KVCDEF kvc_result kvc_mutex_attach(kvc_mutex *mutex, kvc_runtime *runtime);
/* The callbacks themselves (user = the kvc_mutex). */
KVCDEF void kvc_mutex_lock(void *mutex);
KVCDEF void kvc_mutex_unlock(void *mutex);
#endif

/* ---- CPU paths ------------------------------------------------------------------- */
/* CPU paths chosen at run time (cpuid + xgetbv); KVCACHE_NO_SIMD compiles none. */
#define KVC_CPU_F16C (1u << 0)        /* x86: f32 <-> f16 conversion with F16C */
#define KVC_CPU_AVX2 (1u << 1)        /* x86: AVX2 + FMA kernels, bf16/q8_0/q4_0 conversion */
#define KVC_CPU_AVX512 (1u << 2)      /* x86: AVX-512 F/DQ/BW/VL kernels */
#define KVC_CPU_AVX512_VNNI (1u << 3) /* x86: AVX-512 VNNI integer scores of q8_0/q4_0 keys */
#define KVC_CPU_NEON (1u << 4)        /* aarch64: NEON kernels and conversions */
#define KVC_CPU_SSE2 (1u << 5)        /* x86: SSE2 kernels, for CPUs (or VMs) without AVX2 */
#define KVC_CPU_NEON_DOTPROD (1u << 6) /* aarch64: SDOT integer scores of q8_0/q4_0 keys */

KVCDEF kvc_result kvc_cpu_features(uint32_t *features); /* KVC_CPU_* this CPU and build have */

/* ---- Page events (for backends that keep K/V elsewhere, e.g. kvcache_vk.h) -------
   The pool does all bookkeeping (pages, refcounts, cells, positions, page tables) on the
   host. Every time it changes K/V bytes of pages itself -- copy-on-write, defrag and
   per-sequence snapshot copies, zeroing the pages of a new CAUSAL cache, re-rotating keys
   in kvc_seq_remove -- it reports the change through `event`, in order, so a backend
   holding a mirror of the pages can replay it. With `external_data` set the pool holds
   no K/V bytes at all (only positions and bookkeeping): kvc_put takes k = v = NULL and
   only marks the layer written (the backend writes it), and kvc_attention,
   kvc_cache_runs, kvc_cache_gather, kvc_state, kvc_state_read and kvc_state_checkpoint
   return KVC_ERR_UNSUPPORTED (kvcache_vk.h has their device forms); saves and loads
   move the bytes through read_pages / write_pages (refused without them). Unused (all
   zero, the default), nothing changes. */
typedef enum kvc_page_event_kind {
    KVC_PAGE_COPY = 0, /* cells [src_cell, +n) of src_page -> [cell, +n) of page, every layer, K and V */
    KVC_PAGE_ZERO = 1, /* cells [cell, +n) of page set to zero bytes, every layer, K and V */
    KVC_PAGE_ROPE = 2  /* keys of cells [cell, +n) of page, every layer, re-rotated by
                          new_pos - old_pos with `rope` (a rope->shift callback is refused
                          with external_data); with KVC_ROTATE_K the stored keys are R k:
                          rotate back, shift, rotate again (kvc_rotate_rows) */
} kvc_page_event_kind;

struct kvc_page_event {
    kvc_page_event_kind kind;
    uint32_t page;      /* the page whose cells change */
    int32_t cell, n_cells;
    uint32_t src_page;  /* COPY */
    int32_t src_cell;
    int32_t old_pos, new_pos; /* ROPE */
    const kvc_rope *rope;     /* ROPE: the cache's configuration */
};

#endif /* KVCACHE_H */

/* ================================================================================= */
/*                                IMPLEMENTATION                                     */
/* ================================================================================= */
#ifdef KVCACHE_IMPLEMENTATION
#ifndef KVCACHE_IMPLEMENTATION_DONE
#define KVCACHE_IMPLEMENTATION_DONE

#include <string.h>
#include <math.h>

#if defined(KVCACHE_MALLOC) && defined(KVCACHE_FREE)
/* the user's allocator */
#elif !defined(KVCACHE_MALLOC) && !defined(KVCACHE_FREE)
#include <stdlib.h>
#define KVCACHE_MALLOC(sz, user) ((void)(user), malloc(sz))
#define KVCACHE_FREE(p, user) ((void)(user), free(p))
#define KVC__LIBC_MALLOC
#if defined(__linux__) && defined(KVCACHE_HUGE_PAGES) && !defined(KVCACHE_NO_HUGE_PAGES)
#include <sys/mman.h> /* madvise: declared in gcc's default gnu modes (_DEFAULT_SOURCE) */
#define KVC__HUGE_PAGES
#endif
#else
#error "kvcache.h: define both KVCACHE_MALLOC and KVCACHE_FREE, or neither"
#endif

#ifndef KVCACHE_ASSERT
#include <assert.h>
#define KVCACHE_ASSERT(x) assert(x)
#endif

#define KVC__MIN(a, b) ((a) < (b) ? (a) : (b))
#define KVC__MAX(a, b) ((a) > (b) ? (a) : (b))
#define KVC__NO_PAGE 0xffffffffu
#define KVC__DEFAULT_PAGE_CELLS 256
#define KVC__SLAB_ALIGN 64

/* ---- Layer 0: results, sizes, half floats ---------------------------------------- */

KVCDEF const char *kvc_strerror(kvc_result result) {
    switch (result) {
#define KVC__RESULT_CASE(name, value, text) \
    case name: return text;
        KVC_RESULT_LIST(KVC__RESULT_CASE)
#undef KVC__RESULT_CASE
    default: return "unknown kvc_result";
    }
}

/* a*b, or 0 with *overflow set; sizes are checked once at create time */
static size_t kvc__mul(size_t a, size_t b, int *overflow) {
    if (a != 0 && b > (size_t)-1 / a) { *overflow = 1; return 0; }
    return a * b;
}
static size_t kvc__add(size_t a, size_t b, int *overflow) {
    if (b > (size_t)-1 - a) { *overflow = 1; return 0; }
    return a + b;
}
static size_t kvc__align_up(size_t n, size_t a, int *overflow) {
    return kvc__add(n, a - 1, overflow) & ~(a - 1);
}

static uint16_t kvc__f32_to_f16(float f) {
    uint32_t x, sign, exp, mant, h, rem;
    int32_t e;
    memcpy(&x, &f, 4);
    sign = (x >> 16) & 0x8000u;
    exp = (x >> 23) & 0xffu;
    mant = x & 0x7fffffu;
    if (exp == 0xffu) return (uint16_t)(sign | 0x7c00u | (mant ? 0x200u | (mant >> 13) : 0u));
    e = (int32_t)exp - 127 + 15;
    if (e >= 31) return (uint16_t)(sign | 0x7c00u);
    if (e <= 0) { /* subnormal half: count units of 2^-24, round to nearest even */
        uint32_t shift, half, mid;
        if (e < -10) return (uint16_t)sign;
        mant |= 0x800000u;
        shift = (uint32_t)(14 - e);
        half = mant >> shift;
        rem = mant & ((1u << shift) - 1u);
        mid = 1u << (shift - 1u);
        if (rem > mid || (rem == mid && (half & 1u))) half++;
        return (uint16_t)(sign | half);
    }
    h = ((uint32_t)e << 10) | (mant >> 13);
    rem = mant & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++; /* a carry into the exponent is right */
    return (uint16_t)(sign | h);
}

static float kvc__f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, x;
    float f;
    if (exp == 0) {
        f = (float)mant * (1.0f / 16777216.0f);
        return sign ? -f : f;
    }
    if (exp == 31) x = sign | 0x7f800000u | (mant << 13);
    else x = sign | ((exp + 112u) << 23) | (mant << 13);
    memcpy(&f, &x, 4);
    return f;
}

/* ---- Layer 0: the storage type table ---------------------------------------------
   Adding a type is one row here plus its two converters. Rows are converted whole
   (n values, a multiple of `block`), so block-quantised types fit the same slots. */

typedef void (*kvc__from_f32_fn)(const float *src, void *dst, int32_t n);
typedef void (*kvc__to_f32_fn)(const void *src, float *dst, int32_t n);

typedef struct kvc__type_info {
    const char *name;
    int32_t block;      /* values per block */
    size_t block_bytes; /* bytes per block */
    kvc__from_f32_fn from_f32;
    kvc__to_f32_fn to_f32;
} kvc__type_info;

static void kvc__f32_from_f32(const float *src, void *dst, int32_t n) {
    memcpy(dst, src, (size_t)n * sizeof(float));
}
static void kvc__f32_to_f32(const void *src, float *dst, int32_t n) {
    memcpy(dst, src, (size_t)n * sizeof(float));
}
static void kvc__f16_from_f32(const float *src, void *dst, int32_t n) {
    uint16_t *d = (uint16_t *)dst;
    int32_t i;
    for (i = 0; i < n; ++i) d[i] = kvc__f32_to_f16(src[i]);
}
static void kvc__f16_to_f32_row(const void *src, float *dst, int32_t n) {
    const uint16_t *s = (const uint16_t *)src;
    int32_t i;
    for (i = 0; i < n; ++i) dst[i] = kvc__f16_to_f32(s[i]);
}

static uint16_t kvc__f32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u); /* NaN stays NaN (quiet) */
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);                  /* nearest, ties to even */
}
static float kvc__bf16_to_f32(uint16_t h) {
    uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, 4);
    return f;
}
static void kvc__bf16_from_f32(const float *src, void *dst, int32_t n) {
    uint16_t *d = (uint16_t *)dst;
    int32_t i;
    for (i = 0; i < n; ++i) d[i] = kvc__f32_to_bf16(src[i]);
}
static void kvc__bf16_to_f32_row(const void *src, float *dst, int32_t n) {
    const uint16_t *s = (const uint16_t *)src;
    int32_t i;
    for (i = 0; i < n; ++i) dst[i] = kvc__bf16_to_f32(s[i]);
}

/* Block quantisation. Rounding is lrintf's (to nearest, ties to even, in the default
   rounding mode), which SIMD conversions reproduce exactly; a product is rounded
   before it is converted, so no fused multiply-add can change a result. Non-finite
   inputs give unspecified codes but never undefined behaviour: codes are clamped. */
#define KVC__QBLOCK 32
typedef struct kvc__block_q8_0 {
    uint8_t d[2]; /* f16 scale, little-endian bytes: blocks are not 2-byte aligned */
    int8_t q[KVC__QBLOCK];
} kvc__block_q8_0;
typedef struct kvc__block_q4_0 {
    uint8_t d[2];
    uint8_t q[KVC__QBLOCK / 2];
} kvc__block_q4_0;

static float kvc__load_scale(const uint8_t *d) { return kvc__f16_to_f32((uint16_t)(d[0] | (d[1] << 8))); }
static void kvc__store_scale(uint8_t *d, float scale) {
    uint16_t h = kvc__f32_to_f16(scale);
    d[0] = (uint8_t)(h & 0xffu);
    d[1] = (uint8_t)(h >> 8);
}
static int32_t kvc__quant_code(float x, int32_t lo, int32_t hi) {
    long q = lrintf(x);
    return q < lo ? lo : q > hi ? hi : (int32_t)q;
}

/* The scales of one block, computed the same way by every path. */
static float kvc__q8_scale(float amax) { return amax / 127.0f; }
static float kvc__q4_scale(float extreme) { return extreme / -8.0f; }
static float kvc__inverse(float d) { return d != 0.0f ? 1.0f / d : 0.0f; }

static void kvc__q8_0_from_f32(const float *src, void *dst, int32_t n) {
    kvc__block_q8_0 *b = (kvc__block_q8_0 *)dst;
    int32_t i, j;
    for (i = 0; i < n / KVC__QBLOCK; ++i, src += KVC__QBLOCK) {
        float amax = 0.0f, d, id;
        for (j = 0; j < KVC__QBLOCK; ++j) amax = fmaxf(amax, fabsf(src[j]));
        d = kvc__q8_scale(amax);
        id = kvc__inverse(d);
        kvc__store_scale(b[i].d, d);
        for (j = 0; j < KVC__QBLOCK; ++j) b[i].q[j] = (int8_t)kvc__quant_code(src[j] * id, -127, 127);
    }
}
static void kvc__q8_0_to_f32(const void *src, float *dst, int32_t n) {
    const kvc__block_q8_0 *b = (const kvc__block_q8_0 *)src;
    int32_t i, j;
    for (i = 0; i < n / KVC__QBLOCK; ++i, dst += KVC__QBLOCK) {
        float d = kvc__load_scale(b[i].d);
        for (j = 0; j < KVC__QBLOCK; ++j) dst[j] = (float)b[i].q[j] * d;
    }
}
static void kvc__q4_0_from_f32(const float *src, void *dst, int32_t n) {
    kvc__block_q4_0 *b = (kvc__block_q4_0 *)dst;
    int32_t i, j;
    for (i = 0; i < n / KVC__QBLOCK; ++i, src += KVC__QBLOCK) {
        float extreme = 0.0f, d, id;
        for (j = 0; j < KVC__QBLOCK; ++j)
            if (fabsf(src[j]) > fabsf(extreme)) extreme = src[j];
        d = kvc__q4_scale(extreme);
        id = kvc__inverse(d);
        kvc__store_scale(b[i].d, d);
        for (j = 0; j < KVC__QBLOCK / 2; ++j) {
            int32_t lo = kvc__quant_code(src[j] * id, -8, 7) + 8;
            int32_t hi = kvc__quant_code(src[j + KVC__QBLOCK / 2] * id, -8, 7) + 8;
            b[i].q[j] = (uint8_t)(lo | (hi << 4));
        }
    }
}
static void kvc__q4_0_to_f32(const void *src, float *dst, int32_t n) {
    const kvc__block_q4_0 *b = (const kvc__block_q4_0 *)src;
    int32_t i, j;
    for (i = 0; i < n / KVC__QBLOCK; ++i, dst += KVC__QBLOCK) {
        float d = kvc__load_scale(b[i].d);
        for (j = 0; j < KVC__QBLOCK / 2; ++j) {
            dst[j] = (float)((int32_t)(b[i].q[j] & 0x0fu) - 8) * d;
            dst[j + KVC__QBLOCK / 2] = (float)((int32_t)(b[i].q[j] >> 4) - 8) * d;
        }
    }
}

static const kvc__type_info kvc__types[KVC_TYPE_COUNT] = {
    {"f32", 1, 4, kvc__f32_from_f32, kvc__f32_to_f32},
    {"f16", 1, 2, kvc__f16_from_f32, kvc__f16_to_f32_row},
    {"bf16", 1, 2, kvc__bf16_from_f32, kvc__bf16_to_f32_row},
    {"q8_0", KVC__QBLOCK, sizeof(kvc__block_q8_0), kvc__q8_0_from_f32, kvc__q8_0_to_f32},
    {"q4_0", KVC__QBLOCK, sizeof(kvc__block_q4_0), kvc__q4_0_from_f32, kvc__q4_0_to_f32},
};

static int kvc__type_valid(kvc_type t) { return (int)t >= 0 && (int)t < (int)KVC_TYPE_COUNT; }

/* ---- Layer 0: CPU paths, chosen per pool at run time --------------------------------
   Functions carry target attributes, so one binary serves every x86-64 CPU; each is
   used only when cpuid says the CPU (and the OS, via xgetbv) supports it. */
#if !defined(KVCACHE_NO_SIMD) && (defined(__x86_64__) || defined(__i386__)) && \
    (defined(__GNUC__) || defined(__clang__)) && !defined(__TINYC__)
#define KVC__X86 1
#include <cpuid.h>
#include <immintrin.h>

static uint32_t kvc__cpu_detect(void) {
    unsigned a, b, c, d, b7 = 0, c7 = 0, d7 = 0; /* d7: unused today */
    uint32_t xcr0_lo, xcr0_hi, f = 0;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    if (d & (1u << 26)) f |= KVC_CPU_SSE2; /* edx 26; every x86-64 CPU has it */
    /* AVX registers are usable only if the OS saves them (OSXSAVE, ecx 27; XCR0 bits 1-2) */
    if (!(c & (1u << 27)) || !(c & (1u << 28))) return f;
    __asm__ __volatile__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
    (void)xcr0_hi;
    if ((xcr0_lo & 6u) != 6u) return f;
    if (c & (1u << 29)) f |= KVC_CPU_F16C;
    if (__get_cpuid_max(0, NULL) >= 7) __cpuid_count(7, 0, a, b7, c7, d7);
    (void)d7;
    /* AVX2 (leaf 7 ebx 5) with FMA (leaf 1 ecx 12) and F16C */
    if ((b7 & (1u << 5)) && (c & (1u << 12)) && (f & KVC_CPU_F16C)) f |= KVC_CPU_AVX2;
    /* AVX-512 F, DQ, BW, VL (ebx 16, 17, 30, 31), with opmask and ZMM state saved (XCR0 bits 5-7) */
    if ((f & KVC_CPU_AVX2) && (xcr0_lo & 0xe0u) == 0xe0u && (b7 & (1u << 16)) && (b7 & (1u << 17)) &&
        (b7 & (1u << 30)) && (b7 & (1u << 31)))
        f |= KVC_CPU_AVX512;
    if ((f & KVC_CPU_AVX512) && (c7 & (1u << 11))) f |= KVC_CPU_AVX512_VNNI; /* leaf 7 ecx 11 */
    return f;
}

#define KVC__F16C __attribute__((target("avx,f16c")))
#define KVC__AVX2 __attribute__((target("avx,avx2,fma,f16c")))

KVC__F16C static void kvc__f16_from_f32_f16c(const float *src, void *dst, int32_t n) {
    uint16_t *d = (uint16_t *)dst;
    int32_t i = 0;
    for (; i + 8 <= n; i += 8) /* imm 0: round to nearest even, as the scalar path */
        _mm_storeu_si128((__m128i *)(void *)(d + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), 0));
    for (; i < n; ++i) d[i] = kvc__f32_to_f16(src[i]);
}

KVC__F16C static void kvc__f16_to_f32_f16c(const void *src, float *dst, int32_t n) {
    const uint16_t *s = (const uint16_t *)src;
    int32_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(s + i))));
    for (; i < n; ++i) dst[i] = kvc__f16_to_f32(s[i]);
}

KVC__AVX2 static void kvc__bf16_to_f32_avx2(const void *src, float *dst, int32_t n) {
    const uint16_t *s = (const uint16_t *)src;
    int32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)(s + i)));
        _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
    }
    for (; i < n; ++i) dst[i] = kvc__bf16_to_f32(s[i]);
}

/* The scalar rounding in integer lanes (VCVTNEPS2BF16 would flush subnormals). */
KVC__AVX2 static void kvc__bf16_from_f32_avx2(const float *src, void *dst, int32_t n) {
    uint16_t *d = (uint16_t *)dst;
    const __m256i one = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(0x7fff);
    const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
    const __m256i quiet = _mm256_set1_epi32(0x40);
    int32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i x = _mm256_loadu_si256((const __m256i *)(const void *)(src + i));
        __m256i hi = _mm256_srli_epi32(x, 16);
        __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(x, bias), _mm256_and_si256(hi, one)), 16);
        __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, abs_mask), inf);
        r = _mm256_blendv_epi8(r, _mm256_or_si256(hi, quiet), nan);
        r = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08); /* 8 x u16 in the low half */
        _mm_storeu_si128((__m128i *)(void *)(d + i), _mm256_castsi256_si128(r));
    }
    for (; i < n; ++i) d[i] = kvc__f32_to_bf16(src[i]);
}

KVC__AVX2 static float kvc__hmax_avx2(__m256 m) {
    m = _mm256_max_ps(m, _mm256_permute2f128_ps(m, m, 1));
    m = _mm256_max_ps(m, _mm256_shuffle_ps(m, m, 0x4e));
    m = _mm256_max_ps(m, _mm256_shuffle_ps(m, m, 0xb1));
    return _mm256_cvtss_f32(m);
}

/* 32 codes, clamped to [lo, hi], of x * id rounded as lrintf does (MXCSR: nearest even) */
KVC__AVX2 static void kvc__codes_avx2(const float *x, float id, int32_t lo, int32_t hi, __m256i c[4]) {
    const __m256 iv = _mm256_set1_ps(id);
    const __m256i vlo = _mm256_set1_epi32(lo), vhi = _mm256_set1_epi32(hi);
    int32_t j;
    for (j = 0; j < 4; ++j) {
        __m256i q = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * j), iv));
        c[j] = _mm256_min_epi32(_mm256_max_epi32(q, vlo), vhi);
    }
}

KVC__AVX2 static void kvc__q8_0_from_f32_avx2(const float *src, void *dst, int32_t n) {
    kvc__block_q8_0 *b = (kvc__block_q8_0 *)dst;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    int32_t i;
    for (i = 0; i < n / KVC__QBLOCK; ++i, src += KVC__QBLOCK) {
        __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(src)),
                                               _mm256_andnot_ps(sign, _mm256_loadu_ps(src + 8))),
                                 _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(src + 16)),
                                               _mm256_andnot_ps(sign, _mm256_loadu_ps(src + 24))));
        float d = kvc__q8_scale(kvc__hmax_avx2(m));
        __m256i c[4], bytes;
        kvc__store_scale(b[i].d, d);
        kvc__codes_avx2(src, kvc__inverse(d), -127, 127, c);
        bytes = _mm256_packs_epi16(_mm256_packs_epi32(c[0], c[1]), _mm256_packs_epi32(c[2], c[3]));
        _mm256_storeu_si256((__m256i *)(void *)b[i].q, _mm256_permutevar8x32_epi32(bytes, order));
    }
}

KVC__AVX2 static void kvc__q8_0_to_f32_avx2(const void *src, float *dst, int32_t n) {
    const kvc__block_q8_0 *b = (const kvc__block_q8_0 *)src;
    int32_t i, j;
    for (i = 0; i < n / KVC__QBLOCK; ++i, dst += KVC__QBLOCK) {
        __m256 d = _mm256_set1_ps(kvc__load_scale(b[i].d));
        for (j = 0; j < KVC__QBLOCK; j += 8) {
            __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(b[i].q + j)));
            _mm256_storeu_ps(dst + j, _mm256_mul_ps(_mm256_cvtepi32_ps(q), d));
        }
    }
}

KVC__AVX2 static void kvc__q4_0_from_f32_avx2(const float *src, void *dst, int32_t n) {
    kvc__block_q4_0 *b = (kvc__block_q4_0 *)dst;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256i eight = _mm256_set1_epi32(8);
    int32_t i, j;
    for (i = 0; i < n / KVC__QBLOCK; ++i, src += KVC__QBLOCK) {
        __m256 a[4], m, am;
        uint32_t first = 0;
        float d;
        __m256i c[4], lo, hi, p;
        for (j = 0; j < 4; ++j) a[j] = _mm256_andnot_ps(sign, _mm256_loadu_ps(src + 8 * j));
        m = _mm256_max_ps(_mm256_max_ps(a[0], a[1]), _mm256_max_ps(a[2], a[3]));
        am = _mm256_set1_ps(kvc__hmax_avx2(m));
        for (j = 3; j >= 0; --j) /* the first value of largest magnitude, as the scalar loop picks */
            first = (first << 8) | (uint32_t)_mm256_movemask_ps(_mm256_cmp_ps(a[j], am, _CMP_EQ_OQ));
        d = kvc__q4_scale(first ? src[__builtin_ctz(first)] : 0.0f);
        kvc__store_scale(b[i].d, d);
        kvc__codes_avx2(src, kvc__inverse(d), -8, 7, c);
        lo = _mm256_add_epi32(_mm256_add_epi32(c[0], eight), _mm256_slli_epi32(_mm256_add_epi32(c[2], eight), 4));
        hi = _mm256_add_epi32(_mm256_add_epi32(c[1], eight), _mm256_slli_epi32(_mm256_add_epi32(c[3], eight), 4));
        p = _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), 0xd8); /* 16 x u16 in order */
        _mm_storeu_si128((__m128i *)(void *)b[i].q,
                         _mm_packus_epi16(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1)));
    }
}

KVC__AVX2 static void kvc__q4_0_to_f32_avx2(const void *src, float *dst, int32_t n) {
    const kvc__block_q4_0 *b = (const kvc__block_q4_0 *)src;
    const __m128i low4 = _mm_set1_epi8(0x0f), eight = _mm_set1_epi8(8);
    int32_t i, j;
    for (i = 0; i < n / KVC__QBLOCK; ++i, dst += KVC__QBLOCK) {
        __m256 d = _mm256_set1_ps(kvc__load_scale(b[i].d));
        __m128i x = _mm_loadu_si128((const __m128i *)(const void *)b[i].q), q[2];
        q[0] = _mm_sub_epi8(_mm_and_si128(x, low4), eight);
        q[1] = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(x, 4), low4), eight);
        for (j = 0; j < 2; ++j) {
            _mm256_storeu_ps(dst + 16 * j, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q[j])), d));
            _mm256_storeu_ps(dst + 16 * j + 8,
                             _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q[j], 8))), d));
        }
    }
}

#elif !defined(KVCACHE_NO_SIMD) && defined(__aarch64__) && defined(__ARM_NEON)
#define KVC__NEON 1
#include <arm_neon.h>

/* NEON is part of aarch64; the dot-product extension is optional before ARMv8.4: the
   compiler may promise it, else Linux's auxiliary vector says */
#if defined(__ARM_FEATURE_DOTPROD) || !defined(__clang__)
#define KVC__NEON_DOT 1 /* the SDOT kernels are compiled */
#endif
#if defined(KVC__NEON_DOT) && defined(__linux__) && !defined(__ARM_FEATURE_DOTPROD)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1ul << 20)
#endif
#endif
static uint32_t kvc__cpu_detect(void) {
#if defined(__ARM_FEATURE_DOTPROD)
    return KVC_CPU_NEON | KVC_CPU_NEON_DOTPROD;
#elif defined(KVC__NEON_DOT) && defined(__linux__)
    return KVC_CPU_NEON | ((getauxval(AT_HWCAP) & HWCAP_ASIMDDP) ? KVC_CPU_NEON_DOTPROD : 0u);
#else
    return KVC_CPU_NEON;
#endif
}

static void kvc__f16_from_f32_neon(const float *src, void *dst, int32_t n) {
    uint16_t *d = (uint16_t *)dst;
    int32_t i = 0;
    for (; i + 4 <= n; i += 4) /* FPCR's default: nearest even, subnormals kept */
        vst1_u16(d + i, vreinterpret_u16_f16(vcvt_f16_f32(vld1q_f32(src + i))));
    for (; i < n; ++i) d[i] = kvc__f32_to_f16(src[i]);
}
static void kvc__f16_to_f32_neon(const void *src, float *dst, int32_t n) {
    const uint16_t *s = (const uint16_t *)src;
    int32_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(dst + i, vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(s + i))));
    for (; i < n; ++i) dst[i] = kvc__f16_to_f32(s[i]);
}
static void kvc__bf16_to_f32_neon(const void *src, float *dst, int32_t n) {
    const uint16_t *s = (const uint16_t *)src;
    int32_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(dst + i, vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(s + i), 16)));
    for (; i < n; ++i) dst[i] = kvc__bf16_to_f32(s[i]);
}
static void kvc__q8_0_to_f32_neon(const void *src, float *dst, int32_t n) {
    const kvc__block_q8_0 *b = (const kvc__block_q8_0 *)src;
    int32_t i, j;
    for (i = 0; i < n / KVC__QBLOCK; ++i, dst += KVC__QBLOCK) {
        float d = kvc__load_scale(b[i].d);
        for (j = 0; j < KVC__QBLOCK; j += 8) {
            int16x8_t q = vmovl_s8(vld1_s8(b[i].q + j));
            vst1q_f32(dst + j, vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(q))), d));
            vst1q_f32(dst + j + 4, vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_high_s16(q))), d));
        }
    }
}
static void kvc__q4_0_to_f32_neon(const void *src, float *dst, int32_t n) {
    const kvc__block_q4_0 *b = (const kvc__block_q4_0 *)src;
    int32_t i, j, h;
    for (i = 0; i < n / KVC__QBLOCK; ++i, dst += KVC__QBLOCK) {
        float d = kvc__load_scale(b[i].d);
        uint8x16_t x = vld1q_u8(b[i].q);
        int8x16_t q[2];
        q[0] = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(x, vdupq_n_u8(0x0f))), vdupq_n_s8(8));
        q[1] = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(x, 4)), vdupq_n_s8(8));
        for (h = 0; h < 2; ++h)
            for (j = 0; j < 2; ++j) {
                int16x8_t w = vmovl_s8(j ? vget_high_s8(q[h]) : vget_low_s8(q[h]));
                float *o = dst + 16 * h + 8 * j;
                vst1q_f32(o, vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(w))), d));
                vst1q_f32(o + 4, vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_high_s16(w))), d));
            }
    }
}
/* Quantisers, bit for bit the scalar ones on this CPU: lrintf is fcvtns here, as
   vcvtnq (nearest, ties to even, NaN to 0, saturating); fmaxf is vmaxnm (NaN ignored). */
static void kvc__bf16_from_f32_neon(const float *src, void *dst, int32_t n) {
    uint16_t *d = (uint16_t *)dst;
    int32_t i = 0;
    for (; i + 4 <= n; i += 4) {
        uint32x4_t x = vreinterpretq_u32_f32(vld1q_f32(src + i)), hi = vshrq_n_u32(x, 16);
        uint32x4_t r = vshrq_n_u32(vaddq_u32(vaddq_u32(x, vdupq_n_u32(0x7fff)), vandq_u32(hi, vdupq_n_u32(1))), 16);
        uint32x4_t nan = vcgtq_u32(vandq_u32(x, vdupq_n_u32(0x7fffffff)), vdupq_n_u32(0x7f800000));
        vst1_u16(d + i, vmovn_u32(vbslq_u32(nan, vorrq_u32(hi, vdupq_n_u32(0x40)), r)));
    }
    for (; i < n; ++i) d[i] = kvc__f32_to_bf16(src[i]);
}
/* 32 codes rint(x * id) clamped to [lo, hi] */
static void kvc__codes_neon(const float *x, float id, int32_t lo, int32_t hi, int8_t *out) {
    int32_t j;
    for (j = 0; j < KVC__QBLOCK; j += 8) {
        int32x4_t a = vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(x + j), id));
        int32x4_t b = vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(x + j + 4), id));
        a = vmaxq_s32(vminq_s32(a, vdupq_n_s32(hi)), vdupq_n_s32(lo));
        b = vmaxq_s32(vminq_s32(b, vdupq_n_s32(hi)), vdupq_n_s32(lo));
        vst1_s8(out + j, vmovn_s16(vcombine_s16(vmovn_s32(a), vmovn_s32(b))));
    }
}
static void kvc__q8_0_from_f32_neon(const float *src, void *dst, int32_t n) {
    kvc__block_q8_0 *b = (kvc__block_q8_0 *)dst;
    int32_t i, j;
    for (i = 0; i < n / KVC__QBLOCK; ++i, src += KVC__QBLOCK) {
        float32x4_t m = vdupq_n_f32(0.0f);
        float d;
        for (j = 0; j < KVC__QBLOCK; j += 4) m = vmaxnmq_f32(m, vabsq_f32(vld1q_f32(src + j)));
        d = kvc__q8_scale(vmaxnmvq_f32(m));
        kvc__store_scale(b[i].d, d);
        kvc__codes_neon(src, kvc__inverse(d), -127, 127, b[i].q);
    }
}
static void kvc__q4_0_from_f32_neon(const float *src, void *dst, int32_t n) {
    kvc__block_q4_0 *b = (kvc__block_q4_0 *)dst;
    int32_t i, j;
    for (i = 0; i < n / KVC__QBLOCK; ++i, src += KVC__QBLOCK) {
        float extreme = 0.0f, d;
        int8_t c[KVC__QBLOCK];
        for (j = 0; j < KVC__QBLOCK; ++j) /* the first value of largest magnitude, sign kept */
            if (fabsf(src[j]) > fabsf(extreme)) extreme = src[j];
        d = kvc__q4_scale(extreme);
        kvc__store_scale(b[i].d, d);
        kvc__codes_neon(src, kvc__inverse(d), -8, 7, c);
        {
            int8x16_t lo = vaddq_s8(vld1q_s8(c), vdupq_n_s8(8)), hi = vaddq_s8(vld1q_s8(c + 16), vdupq_n_s8(8));
            vst1q_u8(b[i].q, vorrq_u8(vreinterpretq_u8_s8(lo), vshlq_n_u8(vreinterpretq_u8_s8(hi), 4)));
        }
    }
}
#else
static uint32_t kvc__cpu_detect(void) { return 0; }
#endif

KVCDEF kvc_result kvc_cpu_features(uint32_t *features) {
    if (features == NULL) return KVC_ERR_NULL;
    *features = kvc__cpu_detect();
    return KVC_OK;
}

/* The converters a pool uses for a type: the table's, or a faster path. */
static kvc__type_info kvc__pick_type(kvc_type t, uint32_t features) {
    kvc__type_info info = kvc__types[t];
#ifdef KVC__X86
    if (t == KVC_TYPE_F16 && (features & KVC_CPU_F16C)) {
        info.from_f32 = kvc__f16_from_f32_f16c;
        info.to_f32 = kvc__f16_to_f32_f16c;
    }
    if (features & KVC_CPU_AVX2) {
        if (t == KVC_TYPE_BF16) { info.from_f32 = kvc__bf16_from_f32_avx2; info.to_f32 = kvc__bf16_to_f32_avx2; }
        if (t == KVC_TYPE_Q8_0) { info.from_f32 = kvc__q8_0_from_f32_avx2; info.to_f32 = kvc__q8_0_to_f32_avx2; }
        if (t == KVC_TYPE_Q4_0) { info.from_f32 = kvc__q4_0_from_f32_avx2; info.to_f32 = kvc__q4_0_to_f32_avx2; }
    }
#endif
#ifdef KVC__NEON
    if (features & KVC_CPU_NEON) {
        if (t == KVC_TYPE_F16) { info.from_f32 = kvc__f16_from_f32_neon; info.to_f32 = kvc__f16_to_f32_neon; }
        if (t == KVC_TYPE_BF16) { info.from_f32 = kvc__bf16_from_f32_neon; info.to_f32 = kvc__bf16_to_f32_neon; }
        if (t == KVC_TYPE_Q8_0) { info.from_f32 = kvc__q8_0_from_f32_neon; info.to_f32 = kvc__q8_0_to_f32_neon; }
        if (t == KVC_TYPE_Q4_0) { info.from_f32 = kvc__q4_0_from_f32_neon; info.to_f32 = kvc__q4_0_to_f32_neon; }
    }
#endif
    (void)features;
    return info;
}

KVCDEF const char *kvc_type_name(kvc_type type) {
    return kvc__type_valid(type) ? kvc__types[type].name : "?";
}

/* The storage rotation (KVC_ROTATE_K / KVC_ROTATE_V; the rule is at kvc_rotation_block):
   signs, then an in-place fast Walsh-Hadamard transform per block (n log2 n additions),
   then 1/sqrt(n); the inverse in the other order. kvc__rot_one is the scalar reference
   (kvc_rotate_rows); the AVX2 path gives the same bits. */
static int32_t kvc__rot_block(int32_t d) {
    int32_t n = 1;
    if (d < 1) return 0;
    while (n < KVC_ROTATION_MAX_BLOCK && d % (2 * n) == 0) n *= 2;
    return n < KVC_ROTATION_MIN_BLOCK ? 0 : n;
}

/* the signs as floats, +-1 ([j] for values i with i % 256 == j): the words of
   KVC_ROTATION_SIGNS_INIT again (test_rotate checks them against it) */
#define KVC__SG(w, b) (((w) >> (b)) & 1u ? -1.0f : 1.0f)
#define KVC__SG4(w, b) KVC__SG(w, b), KVC__SG(w, b + 1), KVC__SG(w, b + 2), KVC__SG(w, b + 3)
#define KVC__SG32(w) KVC__SG4(w, 0), KVC__SG4(w, 4), KVC__SG4(w, 8), KVC__SG4(w, 12), KVC__SG4(w, 16), \
                     KVC__SG4(w, 20), KVC__SG4(w, 24), KVC__SG4(w, 28)
static const float kvc__rot_sign_f[256] = {KVC__SG32(0x16E6060Eu), KVC__SG32(0x778C5721u), KVC__SG32(0x8BF5716Au),
                                           KVC__SG32(0x3A28247Bu), KVC__SG32(0xF53ADB1Fu), KVC__SG32(0x0B1599BEu),
                                           KVC__SG32(0x88F886E3u), KVC__SG32(0xD1251A7Fu)};
#undef KVC__SG32
#undef KVC__SG4
#undef KVC__SG

/* one block of n values (16 <= n <= 256): the unnormalised transform, butterflies of
   growing span; spans 1 and 2 together on groups of four, the longer spans as loops of
   independent pairs over two halves (which compilers vectorise) */
static void kvc__wht(float *x, int32_t n) {
    int32_t len, i, j;
    for (i = 0; i < n; i += 4) {
        float a = x[i] + x[i + 1], b = x[i] - x[i + 1], c = x[i + 2] + x[i + 3], d = x[i + 2] - x[i + 3];
        x[i] = a + c;
        x[i + 1] = b + d;
        x[i + 2] = a - c;
        x[i + 3] = b - d;
    }
    for (len = 4; len < n; len *= 2)
        for (i = 0; i < n; i += 2 * len) {
            float *lo = x + i, *hi = x + i + len;
            for (j = 0; j < len; j += 4) { /* loads before stores: one vector step */
                float a0 = lo[j], a1 = lo[j + 1], a2 = lo[j + 2], a3 = lo[j + 3];
                float b0 = hi[j], b1 = hi[j + 1], b2 = hi[j + 2], b3 = hi[j + 3];
                lo[j] = a0 + b0; lo[j + 1] = a1 + b1; lo[j + 2] = a2 + b2; lo[j + 3] = a3 + b3;
                hi[j] = a0 - b0; hi[j + 1] = a1 - b1; hi[j + 2] = a2 - b2; hi[j + 3] = a3 - b3;
            }
        }
}

/* x = R x (inverse: R^T x) for one block x[0..n) at index i0 of the head (a multiple
   of n, so its signs are sg[0..n)); multiplies in steps of four, which vectorise */
static void kvc__rot_one(float *x, int32_t i0, int32_t n, int inverse) {
    const float *sg = kvc__rot_sign_f + (i0 & 255);
    float r = (float)(1.0 / sqrt((double)n));
    int32_t i;
    if (!inverse)
        for (i = 0; i < n; i += 4) { x[i] *= sg[i]; x[i + 1] *= sg[i + 1]; x[i + 2] *= sg[i + 2]; x[i + 3] *= sg[i + 3]; }
    kvc__wht(x, n);
    if (!inverse) /* the scale after the transform */
        for (i = 0; i < n; i += 4) { x[i] *= r; x[i + 1] *= r; x[i + 2] *= r; x[i + 3] *= r; }
    else /* scale, then sign: one exact product r * s(i) */
        for (i = 0; i < n; i += 4) {
            x[i] *= r * sg[i]; x[i + 1] *= r * sg[i + 1]; x[i + 2] *= r * sg[i + 2]; x[i + 3] *= r * sg[i + 3];
        }
}

typedef void (*kvc__rot_fn)(float *x, int32_t i0, int32_t n, int inverse); /* kvc__rot_one or a CPU path */

#ifdef KVC__X86
/* kvc__rot_one on 8 lanes, bit for bit: the same additions and products per value
   (spans 1, 2 and 4 inside a vector: the value and its partner swapped in, the sum kept
   in the lower and the difference in the upper positions) */
KVC__AVX2 static void kvc__rot_one_avx2(float *x, int32_t i0, int32_t n, int inverse) {
    const float *sg = kvc__rot_sign_f + (i0 & 255);
    const __m256 r = _mm256_set1_ps((float)(1.0 / sqrt((double)n)));
    int32_t i, j, len;
    for (i = 0; i < n; i += 8) {
        __m256 v = _mm256_loadu_ps(x + i), t;
        if (!inverse) v = _mm256_mul_ps(v, _mm256_loadu_ps(sg + i));
        t = _mm256_permute_ps(v, 0xB1);
        v = _mm256_blend_ps(_mm256_add_ps(v, t), _mm256_sub_ps(t, v), 0xAA);
        t = _mm256_permute_ps(v, 0x4E);
        v = _mm256_blend_ps(_mm256_add_ps(v, t), _mm256_sub_ps(t, v), 0xCC);
        t = _mm256_permute2f128_ps(v, v, 1);
        v = _mm256_blend_ps(_mm256_add_ps(v, t), _mm256_sub_ps(t, v), 0xF0);
        _mm256_storeu_ps(x + i, v);
    }
    for (len = 8; len < n; len *= 2)
        for (i = 0; i < n; i += 2 * len)
            for (j = i; j < i + len; j += 8) {
                __m256 a = _mm256_loadu_ps(x + j), b = _mm256_loadu_ps(x + j + len);
                _mm256_storeu_ps(x + j, _mm256_add_ps(a, b));
                _mm256_storeu_ps(x + j + len, _mm256_sub_ps(a, b));
            }
    for (i = 0; i < n; i += 8) {
        __m256 f = inverse ? _mm256_mul_ps(r, _mm256_loadu_ps(sg + i)) : r;
        _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), f));
    }
}
#endif

static kvc__rot_fn kvc__pick_rot(uint32_t features) {
#ifdef KVC__X86
    if (features & KVC_CPU_AVX2) return kvc__rot_one_avx2;
#endif
    (void)features;
    return kvc__rot_one;
}

/* rows of d values, n the rule's block for d (never 0 here) */
static void kvc__rot_rows(kvc__rot_fn fn, float *x, int32_t d, int32_t n, size_t rows, int inverse) {
    size_t r;
    int32_t b;
    for (r = 0; r < rows; ++r)
        for (b = 0; b < d; b += n) fn(x + r * (size_t)d + b, b, n, inverse);
}

KVCDEF kvc_result kvc_rotation_block(int32_t head_dim, int32_t *block) {
    if (block == NULL) return KVC_ERR_NULL;
    *block = kvc__rot_block(head_dim);
    return *block ? KVC_OK : KVC_ERR_INVALID;
}

/* One cell's row of n values (whole heads of d) into storage: rotated block by block
   through a stack buffer when n_rot (the rule's block for d) is nonzero. */
static void kvc__store_row(const kvc__type_info *t, kvc__rot_fn fn, const float *x, unsigned char *dst, int32_t n,
                           int32_t d, int32_t n_rot) {
    float buf[KVC_ROTATION_MAX_BLOCK];
    int32_t i;
    if (n_rot == 0) { t->from_f32(x, dst, n); return; }
    for (i = 0; i < n; i += n_rot) { /* n_rot is a multiple of the type's block */
        memcpy(buf, x + i, sizeof(float) * (size_t)n_rot);
        fn(buf, i % d, n_rot, 0);
        t->from_f32(buf, dst + (size_t)(i / t->block) * t->block_bytes, n_rot);
    }
}

/* ---- Non-finite keys and values: one rule for every type and path -------------------
   A (cell, kv head) whose K or V values put in hold a NaN, an infinity or a value its
   storage cannot hold finite (beyond f16's 65504 for f16 rows and f16 tails, beyond what
   the f16 block scale of q8_0 / q4_0 reaches; with a storage rotation the bound is divided
   by sqrt(block), as a rotated value reaches sqrt(block) times the largest input) is
   stored "poisoned": its K head row as NaN, its V head row as zeros. Attention gives NaN
   (every value, and a NaN log-sum-exp) to each query row that sees such a cell, and
   leaves every other row as it would be: a NaN key makes the row's scores NaN, and a
   masked cell's zero values add nothing. So one bad value never turns its neighbours
   into NaN (a block's scale, a rotation block), is never dropped, and never depends on
   the storage type or the CPU path. (kvcache_vk.h applies it in its shaders: rows_write
   checks with these limits, the split passes take a score that is not finite as +inf.) */
static float kvc__finite_limit(kvc_type t, int32_t n_rot) {
    float lim = t == KVC_TYPE_F16    ? 65504.0f                /* the largest finite f16 */
                : t == KVC_TYPE_Q8_0 ? 65504.0f * 127.0f       /* scale amax / 127, an f16 */
                : t == KVC_TYPE_Q4_0 ? 65504.0f * 8.0f         /* scale extreme / -8 */
                : t == KVC_TYPE_BF16 ? 3.38953139e38f          /* the largest finite bf16 */
                                     : 3.40282347e38f;         /* FLT_MAX */
    return n_rot > 0 ? lim / sqrtf((float)n_rot) : lim;
}
/* Whether a head's d values break the limit (a NaN does). */
static int kvc__over_scalar(const float *x, int32_t n, float limit);
static int kvc__head_bad(const float *x, int32_t d, float limit) { return kvc__over_scalar(x, d, limit); }
/* One kv head's stored K row as NaN (block types: a NaN scale) or its V row as zeros. */
static void kvc__poison_row(kvc_type t, unsigned char *dst, int32_t d, int nan) {
    size_t bytes = (size_t)d * kvc__types[t].block_bytes / (size_t)kvc__types[t].block;
    int32_t i;
    memset(dst, 0, bytes);
    if (!nan) return;
    if (t == KVC_TYPE_F32) {
        float x = NAN;
        for (i = 0; i < d; ++i) memcpy(dst + 4 * (size_t)i, &x, 4);
    } else if (t == KVC_TYPE_F16 || t == KVC_TYPE_BF16) {
        uint16_t h = t == KVC_TYPE_F16 ? 0x7e00u : 0x7fc0u;
        for (i = 0; i < d; ++i) memcpy(dst + 2 * (size_t)i, &h, 2);
    } else {
        for (i = 0; i < d / KVC__QBLOCK; ++i) kvc__store_scale(dst + (size_t)i * kvc__types[t].block_bytes, NAN);
    }
}
/* The limits of one cache's K and V rows (types, rotation, and an f16_tail's types). */
typedef struct kvc__limits {
    int32_t n_heads, hk, hv;
    float k, v;
    int (*over)(const float *x, int32_t n, float limit); /* the pool's CPU path */
} kvc__limits;
/* Whether a cell's K or V values (n_heads heads each) break the limits: one pass. */
static int kvc__cell_bad(const kvc__limits *L, const float *k, const float *v) {
    return L->over(k, L->n_heads * L->hk, L->k) || L->over(v, L->n_heads * L->hv, L->v);
}
/* After a cell's rows were stored (K in type tk at kd, V in tv at vd): poison the heads
   whose K or V values break the limits. */
static void kvc__poison_cell(const kvc__limits *L, const float *k, const float *v, kvc_type tk, unsigned char *kd,
                             kvc_type tv, unsigned char *vd) {
    size_t kb = (size_t)L->hk * kvc__types[tk].block_bytes / (size_t)kvc__types[tk].block;
    size_t vb = (size_t)L->hv * kvc__types[tv].block_bytes / (size_t)kvc__types[tv].block;
    int32_t h;
    for (h = 0; h < L->n_heads; ++h)
        if (kvc__head_bad(k + (size_t)h * L->hk, L->hk, L->k) || kvc__head_bad(v + (size_t)h * L->hv, L->hv, L->v)) {
            kvc__poison_row(tk, kd + (size_t)h * kb, L->hk, 1);
            kvc__poison_row(tv, vd + (size_t)h * vb, L->hv, 0);
        }
}

KVCDEF kvc_result kvc_rotate_rows(float *x, int32_t head_dim, int32_t n_rows, int inverse) {
    int32_t n = kvc__rot_block(head_dim);
    if (n == 0 || n_rows < 0) return KVC_ERR_INVALID;
    if (x == NULL && n_rows > 0) return KVC_ERR_NULL;
    kvc__rot_rows(kvc__rot_one, x, head_dim, n, (size_t)n_rows, inverse); /* the scalar reference */
    return KVC_OK;
}

/* RoPE re-rotation of one key row by a fixed angle per pair (the RoPE shift of
   kvc_seq_remove): cs/sn hold, per pair, cos/sin of the shift's angles. NeoX pairs
   (i, i + n/2) take cs[i], sn[i] for i < n/2; interleaved pairs (2i, 2i + 1) take
   cs[2i] = cs[2i + 1] (the tables are laid out for the style). In float, so paths
   differ only by fused multiply-adds (the result is stored as f16 or coarser, or f32
   within 1e-6 of the exact rotation). */
typedef void (*kvc__rotate_fn)(float *x, const float *cs, const float *sn, int32_t n, int interleaved);
static void kvc__rotate_tail(float *x, const float *cs, const float *sn, int32_t n, int interleaved, int32_t i) {
    int32_t half = n / 2;
    for (; interleaved ? i + 1 < n : i < half; i += interleaved ? 2 : 1) { /* an odd n leaves its last value */
        int32_t j = interleaved ? i + 1 : i + half;
        float a = x[i], b = x[j];
        x[i] = a * cs[i] - b * sn[i];
        x[j] = b * cs[i] + a * sn[i];
    }
}
static void kvc__rotate_scalar(float *x, const float *cs, const float *sn, int32_t n, int interleaved) {
    kvc__rotate_tail(x, cs, sn, n, interleaved, 0);
}
#ifdef KVC__X86
KVC__AVX2 static void kvc__rotate_avx2(float *x, const float *cs, const float *sn, int32_t n, int interleaved) {
    int32_t i = 0, half = n / 2;
    if (interleaved) { /* (a, b) pairs: a c - b s, b c + a s = fmaddsub(x, c, swapped x * s) */
        for (; i + 8 <= n; i += 8) {
            __m256 v = _mm256_loadu_ps(x + i), sw = _mm256_permute_ps(v, 0xb1);
            _mm256_storeu_ps(x + i, _mm256_fmaddsub_ps(v, _mm256_loadu_ps(cs + i), _mm256_mul_ps(sw, _mm256_loadu_ps(sn + i))));
        }
    } else {
        for (; i + 8 <= half; i += 8) {
            __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + half);
            __m256 c = _mm256_loadu_ps(cs + i), s = _mm256_loadu_ps(sn + i);
            _mm256_storeu_ps(x + i, _mm256_fmsub_ps(a, c, _mm256_mul_ps(b, s)));
            _mm256_storeu_ps(x + i + half, _mm256_fmadd_ps(b, c, _mm256_mul_ps(a, s)));
        }
    }
    kvc__rotate_tail(x, cs, sn, n, interleaved, i);
}
#endif
#ifdef KVC__NEON
static void kvc__rotate_neon(float *x, const float *cs, const float *sn, int32_t n, int interleaved) {
    int32_t i = 0, half = n / 2;
    if (interleaved) {
        static const float sign[4] = {-1.0f, 1.0f, -1.0f, 1.0f};
        float32x4_t sg = vld1q_f32(sign);
        for (; i + 4 <= n; i += 4) {
            float32x4_t v = vld1q_f32(x + i), sw = vrev64q_f32(v);
            vst1q_f32(x + i, vfmaq_f32(vmulq_f32(vmulq_f32(sw, vld1q_f32(sn + i)), sg), v, vld1q_f32(cs + i)));
        }
    } else {
        for (; i + 4 <= half; i += 4) {
            float32x4_t a = vld1q_f32(x + i), b = vld1q_f32(x + i + half), c = vld1q_f32(cs + i), s = vld1q_f32(sn + i);
            vst1q_f32(x + i, vfmsq_f32(vmulq_f32(a, c), b, s));
            vst1q_f32(x + i + half, vfmaq_f32(vmulq_f32(b, c), a, s));
        }
    }
    kvc__rotate_tail(x, cs, sn, n, interleaved, i);
}
#endif
/* Whether any of n values is NaN or beyond limit in magnitude (kvc_put's check of the
   non-finite rule, every value it is given: on every CPU path). The scalar one compares
   bit patterns: |x|'s bits exceed limit's exactly when |x| > limit or x is NaN. */
typedef int (*kvc__over_fn)(const float *x, int32_t n, float limit);
static int kvc__over_scalar(const float *x, int32_t n, float limit) {
    uint32_t lim, u, acc = 0;
    int32_t i;
    memcpy(&lim, &limit, 4);
    for (i = 0; i < n; ++i) {
        memcpy(&u, x + i, 4);
        acc |= lim - (u & 0x7fffffffu); /* wraps (bit 31) when |x| is the larger */
    }
    return (int)(acc >> 31);
}
#ifdef KVC__X86
KVC__AVX2 static int kvc__over_avx2(const float *x, int32_t n, float limit) {
    const __m256 lim = _mm256_set1_ps(limit), absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 a0 = _mm256_setzero_ps(), a1 = a0;
    int32_t i = 0;
    for (; i + 16 <= n; i += 16) { /* not (|x| <= limit): NaN too */
        a0 = _mm256_or_ps(a0, _mm256_cmp_ps(_mm256_and_ps(_mm256_loadu_ps(x + i), absm), lim, _CMP_NLE_UQ));
        a1 = _mm256_or_ps(a1, _mm256_cmp_ps(_mm256_and_ps(_mm256_loadu_ps(x + i + 8), absm), lim, _CMP_NLE_UQ));
    }
    return _mm256_movemask_ps(_mm256_or_ps(a0, a1)) != 0 || kvc__over_scalar(x + i, n - i, limit);
}
#endif
#ifdef KVC__NEON
static int kvc__over_neon(const float *x, int32_t n, float limit) {
    const float32x4_t lim = vdupq_n_f32(limit);
    uint32x4_t ok = vdupq_n_u32(0xffffffffu);
    int32_t i = 0;
    for (; i + 4 <= n; i += 4) ok = vandq_u32(ok, vcleq_f32(vabsq_f32(vld1q_f32(x + i)), lim)); /* NaN: 0 */
    return vminvq_u32(ok) == 0 || kvc__over_scalar(x + i, n - i, limit);
}
#endif
static kvc__over_fn kvc__pick_over(uint32_t features) {
#ifdef KVC__X86
    if (features & KVC_CPU_AVX2) return kvc__over_avx2;
#endif
#ifdef KVC__NEON
    if (features & KVC_CPU_NEON) return kvc__over_neon;
#endif
    (void)features;
    return kvc__over_scalar;
}

static kvc__rotate_fn kvc__pick_rotate(uint32_t features) {
#ifdef KVC__X86
    if (features & KVC_CPU_AVX2) return kvc__rotate_avx2;
#endif
#ifdef KVC__NEON
    if (features & KVC_CPU_NEON) return kvc__rotate_neon;
#endif
    (void)features;
    return kvc__rotate_scalar;
}

/* ---- Layer 1a: memory: the user's allocator, or a first-fit heap in the arena ----- */

typedef struct kvc__chunk { /* a free block of the arena heap; size includes the header */
    size_t size;
    struct kvc__chunk *next;
} kvc__chunk;

#define KVC__HEAP_HDR ((size_t)16) /* keeps payloads 16-byte aligned; >= sizeof(kvc__chunk) */

typedef struct kvc__heap {
    kvc__chunk *free_list; /* sorted by address, neighbours coalesced */
} kvc__heap;

static void kvc__heap_init(kvc__heap *h, void *base, size_t bytes) {
    h->free_list = NULL;
    if (bytes >= 2 * KVC__HEAP_HDR) {
        h->free_list = (kvc__chunk *)base;
        h->free_list->size = bytes & ~(KVC__HEAP_HDR - 1);
        h->free_list->next = NULL;
    }
}

static void *kvc__heap_alloc(kvc__heap *h, size_t n) {
    kvc__chunk **link, *c;
    size_t need;
    if (n > (size_t)-1 / 2) return NULL;
    need = (n + 2 * KVC__HEAP_HDR - 1) & ~(KVC__HEAP_HDR - 1);
    for (link = &h->free_list; (c = *link) != NULL; link = &c->next) {
        if (c->size < need) continue;
        if (c->size - need >= 2 * KVC__HEAP_HDR) { /* split, keep the tail free */
            kvc__chunk *rest = (kvc__chunk *)((unsigned char *)c + need);
            rest->size = c->size - need;
            rest->next = c->next;
            *link = rest;
            c->size = need;
        } else {
            *link = c->next;
        }
        return (unsigned char *)c + KVC__HEAP_HDR;
    }
    return NULL;
}

static void kvc__heap_free(kvc__heap *h, void *p) {
    kvc__chunk *c = (kvc__chunk *)((unsigned char *)p - KVC__HEAP_HDR), *prev = NULL, *next = h->free_list;
    while (next != NULL && next < c) { prev = next; next = next->next; }
    c->next = next;
    if (next != NULL && (unsigned char *)c + c->size == (unsigned char *)next) {
        c->size += next->size;
        c->next = next->next;
    }
    if (prev != NULL) {
        prev->next = c;
        if ((unsigned char *)prev + prev->size == (unsigned char *)c) {
            prev->size += c->size;
            prev->next = c->next;
        }
    } else {
        h->free_list = c;
    }
}

static void *kvc__default_alloc(size_t size, void *user) { return KVCACHE_MALLOC(size, user); }
/* a block of the allocator's aligned less than kvc_allocator's comment asks */
static int kvc__misaligned(const void *ptr) { return ((uintptr_t)ptr & (KVC_ALLOC_ALIGN - 1)) != 0; }
static void kvc__default_free(void *ptr, void *user) { KVCACHE_FREE(ptr, user); }

/* With KVCACHE_HUGE_PAGES, ask Linux for transparent huge pages under a slab from
   libc's malloc: attention streams the whole cache, and with 4 KiB pages every 4 KiB
   of K/V costs a TLB miss (measured: a 16k-cell decode 14 % faster on one thread, and
   the machine's streaming read 28 -> 34 GB/s). Off by default: it can slow the host
   program (see "Resident memory" at kvc_pool_config). Only where <sys/mman.h> declares
   MADV_HUGEPAGE (gcc's default gnu modes; not -std=c99 alone). A hint only: madvise's
   result changes nothing here. */
static void kvc__advise_huge_pages(void *block, size_t bytes) {
#if defined(KVC__LIBC_MALLOC) && defined(KVC__HUGE_PAGES) && defined(MADV_HUGEPAGE)
    uintptr_t huge = (uintptr_t)1 << 21, lo = ((uintptr_t)block + huge - 1) & ~(huge - 1);
    uintptr_t hi = ((uintptr_t)block + bytes) & ~(huge - 1);
    if (hi > lo) (void)madvise((void *)lo, (size_t)(hi - lo), MADV_HUGEPAGE);
#else
    (void)block; (void)bytes;
#endif
}

/* ---- Layer 1b: the pool of pages ---------------------------------------------------
   Page p of layer l has its K rows at k_region + (l*max_pages + p)*page_k_bytes, so
   consecutive page ids are one contiguous tensor per layer; V likewise after all K.
   Each cell also has a position (-1 = never written) in pos[p*page_cells + cell]. */

struct kvc__kernels;
static const struct kvc__kernels *kvc__pick_kernels(uint32_t features); /* Layer 6 */

/* The bytes a pool's pages may take. A pool has its own; the pools of one model memory
   (Layer 4b) point to one they share, so that their groups draw on one budget. */
typedef struct kvc__budget {
    size_t cap, used;
    kvc_radix *trees;        /* prefix trees on these pools: they give pages back under pressure */
    uint64_t clock;          /* their lookups and commits, in order: LRU ticks */
} kvc__budget;

struct kvc_pool {
    kvc_pool_config cfg;
    kvc_allocator alloc;     /* resolved: never NULL functions in allocator mode */
    int arena_mode;
    kvc__heap heap;          /* arena mode: where objects come from */
    void *slab_block;        /* allocator mode: the block to free */
    unsigned char *slab;     /* K regions of every layer, then V regions */
    size_t v_region;         /* byte offset of the V regions in the slab */
    size_t k_row, v_row;     /* bytes of one cell, one layer, all kv heads */
    size_t page_k_bytes, page_v_bytes; /* one page, one layer */
    size_t page_bytes;       /* one page, every layer, K+V */
    int32_t page_cells, max_pages;
    uint32_t *refcount;      /* [max_pages] */
    int32_t *pos;            /* [max_pages * page_cells] */
    uint32_t *free_pages;    /* stack of free page ids, lowest on top at start */
    int32_t n_free, pages_peak;
    int32_t page_hw;         /* 1 + the highest page id acquired since creation (or since a
                                device backend lowered it: kvcache_vk.h's trim) */
    uint32_t next_cache_id;
    int32_t live_caches, live_snapshots, live_prefixes;
    uint32_t *tree_count;    /* [max_pages] scratch of the prefix trees on this pool, zero between uses */
    int32_t tree_refs;       /* those trees */
    uint32_t cpu;            /* KVC_CPU_* paths in use */
    kvc__type_info tk, tv;   /* converters of K and V: the type table's or a CPU path */
    kvc__rotate_fn rotate;   /* the RoPE shift's rotation */
    int32_t rot_k, rot_v;    /* cfg.rotate: the storage rotation's block for K / V, 0: none */
    kvc__rot_fn rot_fn;      /* the storage rotation of one block (bit-identical on every path) */
    kvc__over_fn over_fn;    /* kvc_put's check of the non-finite rule */
    int external;            /* hooks.external_data: no K/V bytes here (slab unused) */
    const struct kvc__kernels *kern; /* attention kernels of the best enabled path */
    kvc__budget own_budget;
    kvc__budget *budget;     /* &own_budget, or a model memory's shared one */
    int owned;               /* made for another object (a model memory, kvcache_vk.h's
                                device pool): kvc_pool_destroy refuses it (KVC_ERR_BUSY),
                                its owner clears this and destroys it */
};

typedef struct kvc__layout {
    size_t k_row, v_row, page_bytes;
    int32_t page_cells, max_pages;
    size_t meta_bytes;   /* pool struct + metadata arrays */
    size_t slab_bytes;
    size_t object_bytes; /* arena mode: the object heap */
    size_t arena_bytes;  /* everything, alignment slack included */
} kvc__layout;

static size_t kvc__row_bytes(kvc_type t, int32_t n_heads, int32_t head_dim) {
    return (size_t)n_heads * (size_t)(head_dim / kvc__types[t].block) * kvc__types[t].block_bytes;
}

/* The pool configuration's validator: every check of kvc_pool_create, in its order, is
   here or in the two layout functions below, each naming the field it refuses in *field
   (for kvc_pool_config_check; never NULL here). */
#define KVC__REFUSE(result, name) do { *field = (name); return (result); } while (0)

static kvc_result kvc__check_config(const kvc_pool_config *c, const char **field) {
    if (c->n_layers < 1) KVC__REFUSE(KVC_ERR_INVALID, "n_layers");
    if (c->n_kv_heads < 1) KVC__REFUSE(KVC_ERR_INVALID, "n_kv_heads");
    if (c->head_dim_k < 1) KVC__REFUSE(KVC_ERR_INVALID, "head_dim_k");
    if (c->head_dim_v < 1) KVC__REFUSE(KVC_ERR_INVALID, "head_dim_v");
    if (c->page_cells < 0) KVC__REFUSE(KVC_ERR_INVALID, "page_cells");
    if (!kvc__type_valid(c->type_k)) KVC__REFUSE(KVC_ERR_INVALID, "type_k");
    if (!kvc__type_valid(c->type_v)) KVC__REFUSE(KVC_ERR_INVALID, "type_v");
    /* block types (q8_0, q4_0) quantise blocks of 32 values along the head */
    if (c->head_dim_k % kvc__types[c->type_k].block != 0) KVC__REFUSE(KVC_ERR_INVALID, "head_dim_k");
    if (c->head_dim_v % kvc__types[c->type_v].block != 0) KVC__REFUSE(KVC_ERR_INVALID, "head_dim_v");
    if ((c->rotate & ~(KVC_ROTATE_K | KVC_ROTATE_V)) != 0 ||
        ((c->rotate & KVC_ROTATE_K) && kvc__rot_block(c->head_dim_k) == 0) ||
        ((c->rotate & KVC_ROTATE_V) && kvc__rot_block(c->head_dim_v) == 0))
        KVC__REFUSE(KVC_ERR_INVALID, "rotate");
    if ((c->runtime.allocator.alloc == NULL) != (c->runtime.allocator.free == NULL)) KVC__REFUSE(KVC_ERR_INVALID, "runtime.allocator");
    if (c->arena == NULL && c->arena_bytes != 0) KVC__REFUSE(KVC_ERR_INVALID, "arena_bytes");
    if (c->runtime.parallel_for != NULL && c->runtime.n_workers < 1) KVC__REFUSE(KVC_ERR_INVALID, "runtime.n_workers");
    if ((c->runtime.lock == NULL) != (c->runtime.unlock == NULL)) KVC__REFUSE(KVC_ERR_INVALID, "runtime.lock");
    return KVC_OK;
}

/* A state pool is a K/V pool in disguise: one cell per page, one "kv head" whose K row
   is a layer's state (f32) and a V row of one float that nothing reads. So pages,
   refcounts, copy-on-write, page events and persistence serve states unchanged. */
static kvc_result kvc__effective_config(const kvc_pool_config *in, kvc_pool_config *out) {
    *out = *in;
    if (in->state_floats == 0) return KVC_OK;
    if (in->state_floats < 0 || in->n_kv_heads != 0 || in->head_dim_k != 0 || in->head_dim_v != 0)
        return KVC_ERR_INVALID;
    out->n_kv_heads = 1;
    out->head_dim_k = in->state_floats;
    out->head_dim_v = 1;
    out->type_k = out->type_v = KVC_TYPE_F32;
    out->page_cells = 1;
    return KVC_OK;
}

/* The page geometry alone (rows, page size): everything of the layout that does not
   depend on the budget. kvc_pool_page_bytes and kvc_pool_budget_for_tokens stop here. */
static kvc_result kvc__page_layout(const kvc_pool_config *cin, kvc__layout *L, const char **field) {
    int of = 0;
    size_t per_page_layer;
    kvc_pool_config eff, *c = &eff;
    kvc_result r = kvc__effective_config(cin, &eff);
    if (r != KVC_OK) { *field = "state_floats"; return r; }
    if (cin->state_floats != 0 && cin->rotate != 0) KVC__REFUSE(KVC_ERR_INVALID, "rotate"); /* states: f32, no heads */
    r = kvc__check_config(c, field);
    if (r != KVC_OK) return r;
    memset(L, 0, sizeof(*L));
    L->page_cells = c->page_cells ? c->page_cells : KVC__DEFAULT_PAGE_CELLS;
    /* rows are at most 4 bytes a value: bound that before computing them */
    kvc__mul((size_t)c->n_kv_heads, kvc__mul((size_t)c->head_dim_k + (size_t)c->head_dim_v, 4, &of), &of);
    if (of) KVC__REFUSE(KVC_ERR_OVERFLOW, "n_kv_heads");
    /* kvc_put, the converters and the kernels count a row's values (n_kv_heads * head_dim)
       in int32: 65536 heads of 65536 would wrap there */
    if ((int64_t)c->n_kv_heads * KVC__MAX(c->head_dim_k, c->head_dim_v) > INT32_MAX)
        KVC__REFUSE(KVC_ERR_OVERFLOW, "n_kv_heads");
    L->k_row = kvc__row_bytes(c->type_k, c->n_kv_heads, c->head_dim_k);
    L->v_row = kvc__row_bytes(c->type_v, c->n_kv_heads, c->head_dim_v);
    per_page_layer = kvc__mul(kvc__add(L->k_row, L->v_row, &of), (size_t)L->page_cells, &of);
    if (of) KVC__REFUSE(KVC_ERR_OVERFLOW, "page_cells");
    L->page_bytes = kvc__mul(per_page_layer, (size_t)c->n_layers, &of);
    if (of) KVC__REFUSE(KVC_ERR_OVERFLOW, "n_layers");
    return KVC_OK;
}

static kvc_result kvc__layout_for(const kvc_pool_config *c, kvc__layout *L, const char **field) {
    int of = 0;
    size_t cells_total, pages;
    kvc_result r = kvc__page_layout(c, L, field);
    if (r != KVC_OK) return r;
    pages = c->budget_bytes / L->page_bytes;
    if (pages < 1) KVC__REFUSE(KVC_ERR_INVALID, "budget_bytes"); /* not a single page */
    /* every cell index must fit an int32 */
    if (pages > (size_t)(INT32_MAX / L->page_cells)) pages = (size_t)(INT32_MAX / L->page_cells);
    L->max_pages = (int32_t)pages;
    cells_total = pages * (size_t)L->page_cells;
    L->meta_bytes = kvc__align_up(sizeof(kvc_pool), 16, &of);
    L->meta_bytes = kvc__add(L->meta_bytes, kvc__mul(pages, 2 * sizeof(uint32_t), &of), &of);
    L->meta_bytes = kvc__add(L->meta_bytes, kvc__mul(cells_total, sizeof(int32_t), &of), &of);
    L->slab_bytes = c->hooks.external_data ? 0 : kvc__mul(pages, L->page_bytes, &of);
    if (of) KVC__REFUSE(KVC_ERR_OVERFLOW, "budget_bytes");
    L->object_bytes = c->arena_object_bytes;
    if (L->object_bytes == 0) /* room for ~32 caches or snapshots spanning the whole pool */
        L->object_bytes = kvc__add(65536, kvc__mul(32, kvc__add(kvc__mul(pages, 4, &of),
                                   (size_t)c->n_layers + 512, &of), &of), &of);
    L->arena_bytes = kvc__align_up(L->meta_bytes, KVC__SLAB_ALIGN, &of);
    L->arena_bytes = kvc__add(L->arena_bytes, L->slab_bytes, &of);
    L->arena_bytes = kvc__add(L->arena_bytes, kvc__align_up(L->object_bytes, 16, &of), &of);
    L->arena_bytes = kvc__add(L->arena_bytes, KVC__SLAB_ALIGN + 16, &of); /* base alignment */
    if (of) KVC__REFUSE(KVC_ERR_OVERFLOW, c->arena_object_bytes ? "arena_object_bytes" : "budget_bytes");
    return KVC_OK;
}

/* Everything kvc_pool_create checks before it allocates. */
static kvc_result kvc__check_pool(const kvc_pool_config *c, kvc__layout *L, const char **field) {
    kvc_result r = kvc__layout_for(c, L, field);
    if (r != KVC_OK) return r;
    if (c->arena != NULL && c->arena_bytes < L->arena_bytes) KVC__REFUSE(KVC_ERR_ARENA_TOO_SMALL, "arena_bytes");
    return KVC_OK;
}

KVCDEF kvc_result kvc_pool_config_init(kvc_pool_config *cfg) {
    if (cfg == NULL) return KVC_ERR_NULL;
    memset(cfg, 0, sizeof(*cfg));
    cfg->type_k = KVC_TYPE_F32;
    cfg->type_v = KVC_TYPE_F32;
    cfg->page_cells = KVC__DEFAULT_PAGE_CELLS;
    return KVC_OK;
}

KVCDEF kvc_result kvc_pool_config_check(const kvc_pool_config *cfg, const char **field) {
    kvc__layout L;
    const char *name = NULL;
    kvc_result r;
    if (field != NULL) *field = NULL;
    if (cfg == NULL) return KVC_ERR_NULL;
    r = kvc__check_pool(cfg, &L, &name);
    if (field != NULL && r != KVC_OK) *field = name;
    return r;
}

KVCDEF kvc_result kvc_pool_arena_bytes(const kvc_pool_config *cfg, size_t *bytes) {
    kvc__layout L;
    const char *field;
    kvc_result r;
    if (cfg == NULL || bytes == NULL) return KVC_ERR_NULL;
    r = kvc__layout_for(cfg, &L, &field);
    if (r == KVC_OK) *bytes = L.arena_bytes;
    return r;
}

KVCDEF kvc_result kvc_pool_page_bytes(const kvc_pool_config *cfg, size_t *page_bytes) {
    kvc__layout L;
    const char *field;
    kvc_result r;
    if (cfg == NULL || page_bytes == NULL) return KVC_ERR_NULL;
    r = kvc__page_layout(cfg, &L, &field);
    if (r == KVC_OK) *page_bytes = L.page_bytes;
    return r;
}

KVCDEF kvc_result kvc_pool_budget_for_tokens(const kvc_pool_config *cfg, int32_t n_tokens, size_t *budget_bytes) {
    kvc__layout L;
    const char *field;
    kvc_result r;
    int of = 0;
    size_t pages, bytes;
    if (cfg == NULL || budget_bytes == NULL) return KVC_ERR_NULL;
    if (n_tokens < 0) return KVC_ERR_RANGE;
    r = kvc__page_layout(cfg, &L, &field);
    if (r != KVC_OK) return r;
    pages = ((size_t)n_tokens + (size_t)L.page_cells - 1) / (size_t)L.page_cells;
    if (pages < 1) pages = 1; /* a pool holds at least one page */
    /* a pool never has more pages than int32 cell indices reach (kvc__layout_for) */
    if (pages > (size_t)(INT32_MAX / L.page_cells)) return KVC_ERR_OVERFLOW;
    bytes = kvc__mul(pages, L.page_bytes, &of);
    if (of) return KVC_ERR_OVERFLOW;
    *budget_bytes = bytes;
    return KVC_OK;
}

KVCDEF kvc_result kvc_pool_budget_for_states(const kvc_pool_config *cfg, int32_t n_states, size_t *budget_bytes) {
    if (cfg == NULL || budget_bytes == NULL) return KVC_ERR_NULL;
    if (cfg->state_floats <= 0) return KVC_ERR_INVALID; /* a K/V pool: kvc_pool_budget_for_tokens */
    return kvc_pool_budget_for_tokens(cfg, n_states, budget_bytes); /* a state pool's page is one cell */
}

static unsigned char *kvc__align_ptr(void *p, size_t a) {
    uintptr_t u = (uintptr_t)p;
    return (unsigned char *)(u + ((a - (u % a)) % a));
}

/* Lay the pool struct and its arrays out in `meta`, the page storage at `slab`. */
static kvc_pool *kvc__pool_init(unsigned char *meta, unsigned char *slab, const kvc_pool_config *user_cfg,
                                const kvc__layout *L) {
    kvc_pool *p = (kvc_pool *)meta;
    int32_t i;
    unsigned char *cursor = meta + ((sizeof(kvc_pool) + 15) & ~(size_t)15);
    kvc_pool_config eff, *cfg = &eff;
    (void)kvc__effective_config(user_cfg, &eff); /* checked by kvc__layout_for */
    memset(p, 0, sizeof(*p));
    p->cfg = *cfg;
    p->cfg.page_cells = L->page_cells;
    p->page_cells = L->page_cells;
    p->max_pages = L->max_pages;
    p->k_row = L->k_row;
    p->v_row = L->v_row;
    p->page_k_bytes = L->k_row * (size_t)L->page_cells;
    p->page_v_bytes = L->v_row * (size_t)L->page_cells;
    p->page_bytes = L->page_bytes;
    p->slab = slab;
    p->v_region = p->page_k_bytes * (size_t)L->max_pages * (size_t)cfg->n_layers;
    p->refcount = (uint32_t *)cursor;
    cursor += sizeof(uint32_t) * (size_t)L->max_pages;
    p->free_pages = (uint32_t *)cursor;
    cursor += sizeof(uint32_t) * (size_t)L->max_pages;
    p->pos = (int32_t *)cursor;
    for (i = 0; i < L->max_pages; ++i) {
        p->refcount[i] = 0;
        p->free_pages[i] = (uint32_t)(L->max_pages - 1 - i); /* page 0 pops first */
    }
    memset(p->pos, 0xff, sizeof(int32_t) * (size_t)L->max_pages * (size_t)L->page_cells);
    p->n_free = L->max_pages;
    p->cpu = kvc__cpu_detect() & ~cfg->runtime.cpu_disable;
    /* a path needs the ones it builds on: disabling AVX2 disables AVX-512 too, etc. */
    if (!(p->cpu & KVC_CPU_F16C)) p->cpu &= ~KVC_CPU_AVX2;
    if (!(p->cpu & KVC_CPU_AVX2)) p->cpu &= ~KVC_CPU_AVX512;
    if (!(p->cpu & KVC_CPU_AVX512)) p->cpu &= ~KVC_CPU_AVX512_VNNI;
    if (!(p->cpu & KVC_CPU_NEON)) p->cpu &= ~KVC_CPU_NEON_DOTPROD;
    p->tk = kvc__pick_type(cfg->type_k, p->cpu);
    p->tv = kvc__pick_type(cfg->type_v, p->cpu);
    p->rotate = kvc__pick_rotate(p->cpu);
    p->rot_k = (cfg->rotate & KVC_ROTATE_K) ? kvc__rot_block(cfg->head_dim_k) : 0;
    p->rot_v = (cfg->rotate & KVC_ROTATE_V) ? kvc__rot_block(cfg->head_dim_v) : 0;
    p->rot_fn = kvc__pick_rot(p->cpu);
    p->over_fn = kvc__pick_over(p->cpu);
    p->external = cfg->hooks.external_data != 0;
    p->kern = kvc__pick_kernels(p->cpu);
    p->own_budget.cap = (size_t)L->max_pages * L->page_bytes;
    p->budget = &p->own_budget;
    return p;
}

KVCDEF kvc_result kvc_pool_create(const kvc_pool_config *cfg, kvc_pool **out) {
    kvc__layout L;
    const char *field;
    kvc_result r;
    kvc_pool *p;
    if (cfg == NULL || out == NULL) return KVC_ERR_NULL;
    r = kvc__check_pool(cfg, &L, &field);
    if (r != KVC_OK) return r;
    if (cfg->arena != NULL) {
        unsigned char *meta = kvc__align_ptr(cfg->arena, 16), *slab, *objects;
        slab = kvc__align_ptr(meta + L.meta_bytes, KVC__SLAB_ALIGN);
        objects = kvc__align_ptr(slab + L.slab_bytes, 16);
        p = kvc__pool_init(meta, slab, cfg, &L);
        p->arena_mode = 1;
        kvc__heap_init(&p->heap, objects,
                       (size_t)((unsigned char *)cfg->arena + cfg->arena_bytes - objects));
    } else {
        kvc_allocator a = cfg->runtime.allocator;
        void *meta, *slab_block;
        if (a.alloc == NULL) { a.alloc = kvc__default_alloc; a.free = kvc__default_free; }
        meta = a.alloc(L.meta_bytes, a.user);
        if (meta == NULL) return KVC_ERR_NO_MEMORY;
        if (kvc__misaligned(meta)) { a.free(meta, a.user); return KVC_ERR_ALIGNMENT; }
        slab_block = a.alloc(L.slab_bytes + KVC__SLAB_ALIGN, a.user);
        if (slab_block == NULL) { a.free(meta, a.user); return KVC_ERR_NO_MEMORY; }
        if (a.alloc == kvc__default_alloc) kvc__advise_huge_pages(slab_block, L.slab_bytes + KVC__SLAB_ALIGN);
        p = kvc__pool_init((unsigned char *)meta, kvc__align_ptr(slab_block, KVC__SLAB_ALIGN), cfg, &L);
        p->alloc = a;
        p->slab_block = slab_block;
    }
    *out = p;
    return KVC_OK;
}

/* The pool lock (kvc_pool_config.runtime.lock): around everything the pool's caches share.
   Recursive, so a locked call may make others. No lock configured: nothing. */
static void kvc__pool_lock(const kvc_pool *p) {
    if (p->cfg.runtime.lock != NULL) p->cfg.runtime.lock(p->cfg.runtime.lock_user);
}
static void kvc__pool_unlock(const kvc_pool *p) {
    if (p->cfg.runtime.unlock != NULL) p->cfg.runtime.unlock(p->cfg.runtime.lock_user);
}
/* A public call that changes what a pool holds is its _held body under the pool's lock: the
   call's whole body is KVC__POOL_LOCKED(obj, pool, body_call), which returns the body's
   result. A NULL obj goes to the body unlocked (it reports KVC_ERR_NULL); the pool is read
   before the body runs, since the body may free obj. */
#define KVC__POOL_LOCKED(obj, pool_of_obj, held_call) \
    do {                                              \
        const kvc_pool *lp_;                          \
        kvc_result r_;                                \
        if ((obj) == NULL) return held_call;          \
        lp_ = (pool_of_obj);                          \
        kvc__pool_lock(lp_);                          \
        r_ = held_call;                               \
        kvc__pool_unlock(lp_);                        \
        return r_;                                    \
    } while (0)

KVCDEF kvc_result kvc_pool_destroy(kvc_pool *pool) {
    kvc_allocator a;
    int busy;
    if (pool == NULL) return KVC_ERR_NULL;
    kvc__pool_lock(pool);
    busy = pool->owned || pool->live_caches || pool->live_snapshots || pool->live_prefixes;
    kvc__pool_unlock(pool);
    if (busy) return KVC_ERR_BUSY;
    KVCACHE_ASSERT(pool->n_free == pool->max_pages);
    if (pool->arena_mode) return KVC_OK; /* the caller owns the arena */
    a = pool->alloc;
    a.free(pool->slab_block, a.user);
    a.free(pool, a.user);
    return KVC_OK;
}

KVCDEF kvc_result kvc_pool_stats_get(const kvc_pool *pool, kvc_pool_stats *s) {
    if (pool == NULL || s == NULL) return KVC_ERR_NULL;
    kvc__pool_lock(pool);
    memset(s, 0, sizeof(*s));
    s->page_bytes = pool->page_bytes;
    s->k_row_bytes = pool->k_row;
    s->v_row_bytes = pool->v_row;
    s->page_cells = pool->page_cells;
    s->pages_total = pool->max_pages;
    s->pages_used = pool->max_pages - pool->n_free;
    s->pages_peak = pool->pages_peak;
    s->bytes_used = (size_t)s->pages_used * pool->page_bytes;
    s->bytes_peak = (size_t)s->pages_peak * pool->page_bytes;
    s->budget_bytes = pool->cfg.budget_bytes;
    s->live_caches = pool->live_caches;
    s->live_snapshots = pool->live_snapshots;
    s->live_prefixes = pool->live_prefixes;
    s->cpu_features = pool->cpu;
    kvc__pool_unlock(pool);
    return KVC_OK;
}

/* Objects: from the arena's heap or the allocator, under the pool lock (the heap is the
   pool's; the caller's allocator need not be thread-safe). */
static void *kvc__alloc(kvc_pool *p, size_t n) {
    void *ptr;
    kvc__pool_lock(p);
    ptr = p->arena_mode ? kvc__heap_alloc(&p->heap, n) : p->alloc.alloc(n, p->alloc.user);
    if (ptr != NULL && !p->arena_mode && kvc__misaligned(ptr)) {
        p->alloc.free(ptr, p->alloc.user);
        ptr = NULL;
    }
    kvc__pool_unlock(p);
    return ptr;
}
static void kvc__free(kvc_pool *p, void *ptr) {
    if (ptr == NULL) return;
    kvc__pool_lock(p);
    if (p->arena_mode) kvc__heap_free(&p->heap, ptr);
    else p->alloc.free(ptr, p->alloc.user);
    kvc__pool_unlock(p);
}

/* Page reference counting. Callers check kvc__pages_free first, so acquire never fails. */
/* A state pool's page is a K/V page of one cell whose V row (one float per layer) no
   state uses: zeroed when the page is taken, so that saves write no stale bytes. */
static unsigned char *kvc__v_at(const kvc_pool *p, int32_t layer, uint32_t page, int32_t cell);
static void kvc__zero_state_pad(kvc_pool *p, uint32_t page) {
    int32_t l;
    for (l = 0; l < p->cfg.n_layers; ++l) memset(kvc__v_at(p, l, page, 0), 0, p->v_row);
}
static uint32_t kvc__page_acquire(kvc_pool *p) {
    uint32_t page;
    KVCACHE_ASSERT(p->n_free > 0 && p->budget->cap - p->budget->used >= p->page_bytes);
    page = p->free_pages[--p->n_free];
    KVCACHE_ASSERT(p->refcount[page] == 0);
    p->refcount[page] = 1;
    p->budget->used += p->page_bytes;
    if (p->max_pages - p->n_free > p->pages_peak) p->pages_peak = p->max_pages - p->n_free;
    if ((int32_t)page >= p->page_hw) p->page_hw = (int32_t)page + 1;
    if (p->cfg.state_floats > 0 && !p->external) kvc__zero_state_pad(p, page);
    return page;
}
static void kvc__page_retain(kvc_pool *p, uint32_t page) {
    KVCACHE_ASSERT(p->refcount[page] > 0);
    p->refcount[page]++;
}
static void kvc__page_release(kvc_pool *p, uint32_t page) {
    KVCACHE_ASSERT(p->refcount[page] > 0);
    if (--p->refcount[page] == 0) {
        p->free_pages[p->n_free++] = page;
        p->budget->used -= p->page_bytes;
    }
}

/* Pages that can be acquired now: free in the pool and within the budget it draws on. */
static int32_t kvc__pages_free(const kvc_pool *p) {
    size_t by_budget = (p->budget->cap - p->budget->used) / p->page_bytes;
    return by_budget < (size_t)p->n_free ? (int32_t)by_budget : p->n_free;
}

static unsigned char *kvc__k_at(const kvc_pool *p, int32_t layer, uint32_t page, int32_t cell) {
    return p->slab + ((size_t)layer * (size_t)p->max_pages + page) * p->page_k_bytes +
           (size_t)cell * p->k_row;
}
static unsigned char *kvc__v_at(const kvc_pool *p, int32_t layer, uint32_t page, int32_t cell) {
    return p->slab + p->v_region + ((size_t)layer * (size_t)p->max_pages + page) * p->page_v_bytes +
           (size_t)cell * p->v_row;
}
static int32_t *kvc__pos_at(const kvc_pool *p, uint32_t page, int32_t cell) {
    return p->pos + (size_t)page * (size_t)p->page_cells + (size_t)cell;
}

/* Page events: tell a device backend (config hooks) which K/V bytes changed. */
static void kvc__page_event(const kvc_pool *p, kvc_page_event_kind kind, uint32_t page, int32_t cell,
                            int32_t n, uint32_t src_page, int32_t src_cell) {
    kvc_page_event ev;
    if (p->cfg.hooks.event == NULL) return;
    memset(&ev, 0, sizeof(ev));
    ev.kind = kind;
    ev.page = page;
    ev.cell = cell;
    ev.n_cells = n;
    ev.src_page = src_page;
    ev.src_cell = src_cell;
    p->cfg.hooks.event(p->cfg.hooks.user, &ev);
}

/* Copy cells [c0, c1) of every layer (and their positions) from one page to another. */
static void kvc__page_copy_cells(kvc_pool *p, uint32_t dst, uint32_t src, int32_t c0, int32_t c1) {
    int32_t l, n = c1 - c0;
    if (n <= 0) return;
    kvc__page_event(p, KVC_PAGE_COPY, dst, c0, n, src, c0);
    for (l = 0; l < p->cfg.n_layers && !p->external; ++l) {
        memcpy(kvc__k_at(p, l, dst, c0), kvc__k_at(p, l, src, c0), (size_t)n * p->k_row);
        memcpy(kvc__v_at(p, l, dst, c0), kvc__v_at(p, l, src, c0), (size_t)n * p->v_row);
    }
    memcpy(kvc__pos_at(p, dst, c0), kvc__pos_at(p, src, c0), (size_t)n * sizeof(int32_t));
}

/* ---- Layer 2: cells and page tables --------------------------------------------------
   A FULL or ROTATING cache maps token t (its position) to logical page t / page_cells,
   slot t % page_cells. pages[] lists the logical pages it holds in order: the first
   n_sink_pages entries are logical pages 0.. (ROTATING sinks, never released), the
   rest are consecutive logical pages starting at first_lpage. A FULL cache has no
   sinks and first_lpage 0; a ROTATING cache releases window pages from the front. */

struct kvc_cache {
    kvc_pool *pool;
    struct kvc__mpools *owner; /* the memory's pools once kvc_memory_group/_layer handed it out */
    uint32_t id;             /* unique within the pool: snapshots name their cache */
    kvc_cache_config cfg;
    int32_t offset;          /* tokens held so far = the next position */
    int32_t batch_begin;     /* first token of the current (or last) batch */
    int32_t batch_pending;   /* layers of the current batch not put yet */
    unsigned char *batch_put;/* [n_layers] */
    int32_t n_sink_pages;
    int32_t first_lpage;
    int32_t n_pages;
    uint32_t *pages;         /* [pages_cap]: after the struct (CAUSAL: its fixed pages; FULL,
                                ROTATING: KVC__PAGE_TABLE_INLINE), then for FULL and
                                ROTATING a block that grows with the cache (doubling) */
    int32_t pages_cap;
    int pages_heap;          /* pages is a block of its own */
    /* CAUSAL: cell i is slot i % page_cells of pages[i / page_cells] */
    int32_t capacity, words; /* cells; 32-bit words per cell's set of sequences */
    int32_t n_used;          /* cells holding at least one sequence */
    uint32_t *seqs;          /* [capacity * words] */
    int32_t *seq_lo, *seq_hi;/* [max_seqs] cells [lo, hi) hold the sequence (lo >= hi: none) */
    int32_t *seq_n, *seq_top;/* [max_seqs] cells holding the sequence; no position of its
                                cells is above seq_top (exact once its bounds are tightened) */
    int32_t batch_loc, batch_n;          /* cells of the current (or last) batch */
    int32_t *batch_pos, *batch_seq;      /* [capacity] */
    int32_t *in_pos, *in_seq;            /* [capacity] kvc_begin's batch */
    unsigned char *batch_nc;             /* [capacity] non-causal marks */
    int32_t range_lo, range_hi;          /* cells the batch reads, padded */
    int32_t *scratch;                    /* [max_seqs] */
    float *row;                          /* one K row as f32, for re-rotation */
    float *rope_cos, *rope_sin;          /* [head_dim_k] one shift's, laid out for kvc__rotate_fn */
    uint64_t gen;                        /* bumped by every call that adds or replaces
                                            contents (not by one that only cuts tokens off
                                            the end); the cache's id in the high half from
                                            creation: kvc_prefix notices changes behind
                                            its back */
    uint64_t cells_gen;                  /* CAUSAL: bumped by every change of a cell's
                                            sequences or position (kvcache_vk.h keeps the
                                            device's copy of them while it is unchanged);
                                            the cache's id in the high half */
    int32_t *cells_log;                  /* [2 KVC__CELLS_LOG] CAUSAL: the cells [lo, hi)
                                            each of the latest cells_gen bumps changed,
                                            entry gen % KVC__CELLS_LOG (kvcache_vk.h reads them) */
    struct kvc__rnode *lease;            /* the prefix-tree entry this cache keeps in use */
    kvc_radix *lease_tree;
    /* RECURRENT (Layer 3c): sequence s's state is page state_page[s] (KVC__NO_PAGE: all
       zeros) after state_off[s] tokens; batch_has[s]: s is in the current batch */
    uint32_t *state_page;
    int32_t *state_off;
    int32_t *batch_has;      /* [max_seqs] tokens of s in the current batch */
    /* ROTATING and RECURRENT (Layer 4b): checkpoints, oldest first, and those the
       current batch named (pend: filled while it runs, kept once it has ended) */
    int32_t max_ckpt, n_ckpt, n_pend;    /* max_ckpt: named ones kept (cfg.checkpoints) */
    int32_t cap_ckpt;                    /* slots of ckpt and pend (kvc__ckpt_slots) */
    kvc_snapshot **ckpt;                 /* [cap_ckpt] */
    kvc_snapshot **pend;                 /* [cap_ckpt] */
    unsigned char *pend_done;            /* [cap_ckpt][n_layers] RECURRENT: layers handed over */
    uint64_t ckpt_dropped;               /* RECURRENT: pend ones settled without every layer */
    kvc_snapshot *start;                 /* RECURRENT with a reserve: the batch start's checkpoint,
                                            allocated before the batch begins */
    int states_open;                     /* RECURRENT: kvc_state may still give the batch's states */
    /* f16_tail (FULL, ROTATING): the K and V rows of tokens [tail_lo, min(tail_hi, offset))
       kept beside the pages (which hold every token quantized, as without a tail), token t
       in ring slot t % f16_tail; a quantized side in f16, the other in its own type */
    unsigned char *tail;                 /* [n_layers][f16_tail K rows, then f16_tail V rows] */
    size_t tail_krow, tail_vrow;         /* bytes of a K / V row of the ring */
    kvc_type tail_tk, tail_tv;
    int32_t tail_lo, tail_hi;
};

struct kvc_snapshot {
    kvc_pool *pool;
    uint32_t cache_id;
    kvc_kind kind;
    int32_t window, sinks;   /* the configuration a cache must have to take it */
    int counted;             /* in the pool's live_snapshots (not a cache's own checkpoint) */
    struct kvc_snapshot *carried; /* ROTATING, RECURRENT: the cache's checkpoints up to `to`,
                                     which a restore brings back with it (a chain) */
    int ckflags;             /* as a checkpoint: KVC__CK_NAMED and/or KVC__CK_RESERVE */
    int32_t from, to;
    int32_t first_lpage;     /* FULL: logical page of pages[0]; ROTATING: the cache's */
    int32_t batch_begin;     /* ROTATING: the window anchor at snapshot time */
    int32_t n_cells;         /* CAUSAL: cells of the sequence, packed from pages[0] slot 0 */
    int32_t n_pages;
    uint32_t *pages;
};

#define KVC__PAGE_TABLE_INLINE 8 /* page-table entries in a cache's own block */
#define KVC__CELLS_LOG 64 /* cells_gen bumps whose cells a CAUSAL cache remembers */

/* Room for n entries in the page table (FULL, ROTATING): it grows by doubling, up to the
   pool's page count (a cache never holds more distinct pages; a larger n is clamped and
   the page count then refuses the call). KVC_ERR_NO_MEMORY leaves the cache as it was.
   Every caller that adds entries reserves first; the table also keeps room for every
   checkpoint the cache holds (kvc__pages_wanted), so that going back to one cannot fail. */
static kvc_result kvc__page_table_reserve(kvc_cache *c, int64_t n) {
    kvc_pool *p = c->pool;
    int64_t cap;
    uint32_t *b;
    if (n <= c->pages_cap) return KVC_OK;
    if (n > p->max_pages) n = p->max_pages;
    cap = KVC__MAX(KVC__MAX(n, 2 * (int64_t)c->pages_cap), 8);
    if (cap > p->max_pages) cap = p->max_pages;
    if (cap <= c->pages_cap) return KVC_OK;
    b = (uint32_t *)kvc__alloc(p, sizeof(uint32_t) * (size_t)cap); /* cap <= max_pages: the pool's arrays fit */
    if (b == NULL) return KVC_ERR_NO_MEMORY;
    if (c->n_pages > 0) memcpy(b, c->pages, sizeof(uint32_t) * (size_t)c->n_pages);
    if (c->pages_heap) kvc__free(p, c->pages);
    c->pages = b;
    c->pages_cap = (int32_t)cap;
    c->pages_heap = 1;
    return KVC_OK;
}

/* Where logical page lp sits in pages[], or -1. */
static int32_t kvc__lpage_index(const kvc_cache *c, int32_t lp) {
    int32_t idx;
    if (lp < 0) return -1;
    if (lp < c->n_sink_pages) return lp < c->n_pages ? lp : -1;
    if (lp < c->first_lpage) return -1;
    idx = c->n_sink_pages + (lp - c->first_lpage);
    return idx < c->n_pages ? idx : -1;
}

static int32_t kvc__entry_lpage(const kvc_cache *c, int32_t idx) {
    return idx < c->n_sink_pages ? idx : c->first_lpage + (idx - c->n_sink_pages);
}

static int32_t kvc__recent_window(const kvc_cache *c) { return c->cfg.window - c->cfg.sinks; }

/* The oldest non-sink token a query at position p of a ROTATING cache may see. */
static int64_t kvc__window_lo(const kvc_cache *c, int64_t p) { return p - kvc__recent_window(c) + 1; }

/* ROTATING with a reserve (cfg.reserve > 0): whether pages held -- the sink pages, then
   logical pages first_lpage .. up to the one holding token target - 1 -- include every
   token the window at `target` reads (the view after a rewind there: the sinks and the
   tokens target - (W - sinks) .. target - 1). The tokens never held are those of logical
   pages n_sink_pages .. first_lpage - 1. Without a reserve: 0 (a wrapped window goes back
   only to checkpoints, as before). */
static int kvc__reserve_holds(const kvc_cache *c, int32_t first_lpage, int32_t target) {
    int64_t pc = c->pool->page_cells, gap_lo = (int64_t)c->n_sink_pages * pc, gap_hi = (int64_t)first_lpage * pc;
    int64_t lo = KVC__MAX((int64_t)c->cfg.sinks, (int64_t)target - kvc__recent_window(c));
    if (c->cfg.kind != KVC_KIND_ROTATING || c->cfg.reserve <= 0) return 0;
    return lo >= target || gap_hi <= gap_lo || lo >= gap_hi || target <= gap_lo;
}

/* The tokens a kernel reads: at most two ranges, [b0,e0) then [b1,e1). */
typedef struct kvc__ranges {
    int32_t b[2], e[2];
} kvc__ranges;

static kvc__ranges kvc__view(const kvc_cache *c) {
    kvc__ranges r;
    r.b[0] = r.e[0] = r.b[1] = r.e[1] = 0;
    if (c->cfg.kind == KVC_KIND_CAUSAL) { /* cell indices, not positions */
        r.b[1] = c->range_lo;
        r.e[1] = c->range_hi;
    } else if (c->cfg.kind == KVC_KIND_ROTATING) {
        /* kvc_begin released only pages older than this, so every cell here is held */
        int64_t lo = kvc__window_lo(c, c->batch_begin);
        int32_t s = KVC__MIN(c->cfg.sinks, c->offset);
        r.e[0] = s;
        lo = KVC__MAX(lo, (int64_t)s);
        r.b[1] = (int32_t)KVC__MIN(lo, (int64_t)c->offset);
        r.e[1] = c->offset;
    } else if (c->cfg.kind == KVC_KIND_FULL) {
        r.e[1] = c->offset;
    } /* RECURRENT: no cells */
    return r;
}

/* A run of cells of one page, [c0, c1). */
typedef struct kvc__run {
    uint32_t page;
    int32_t c0, c1;
    int32_t t0;     /* the token (CAUSAL: cell index) at slot c0 */
} kvc__run;

typedef struct kvc__iter {
    const kvc_cache *c;
    kvc__ranges r;
    int32_t part, t;
} kvc__iter;

static void kvc__iter_init(kvc__iter *it, const kvc_cache *c) {
    it->c = c;
    it->r = kvc__view(c);
    it->part = 0;
    it->t = it->r.b[0];
}

/* CAUSAL: iterate the cells [lo, hi) instead of the batch's view. */
static void kvc__iter_init_cells(kvc__iter *it, const kvc_cache *c, int32_t lo, int32_t hi) {
    it->c = c;
    it->r.b[0] = it->r.e[0] = 0;
    it->r.b[1] = lo;
    it->r.e[1] = hi;
    it->part = 0;
    it->t = 0;
}

static int kvc__iter_next(kvc__iter *it, kvc__run *run) {
    int32_t pc = it->c->pool->page_cells;
    while (it->part < 2) {
        if (it->t < it->r.e[it->part]) {
            int32_t lp = it->t / pc, idx = kvc__lpage_index(it->c, lp), end;
            KVCACHE_ASSERT(idx >= 0);
            end = (int32_t)KVC__MIN((int64_t)it->r.e[it->part], (int64_t)lp * pc + pc);
            run->page = it->c->pages[idx];
            run->t0 = it->t;
            run->c0 = it->t - lp * pc;
            run->c1 = end - lp * pc;
            it->t = end;
            return 1;
        }
        if (++it->part < 2) it->t = KVC__MAX(it->r.b[1], it->r.e[0]);
    }
    return 0;
}

/* Release the pages that hold no token below n_tokens (from the back). */
static void kvc__release_from(kvc_cache *c, int32_t n_tokens) {
    int32_t pc = c->pool->page_cells;
    while (c->n_pages > 0 && (int64_t)kvc__entry_lpage(c, c->n_pages - 1) * pc >= n_tokens) {
        kvc__page_release(c->pool, c->pages[--c->n_pages]);
    }
    /* first_lpage > n_sink_pages remembers that window pages were released (kvc__wrapped);
       with a reserve, a rewind into the sink pages holds every token below it again */
    if (n_tokens == 0 || (c->cfg.reserve > 0 && c->n_pages <= c->n_sink_pages)) c->first_lpage = c->n_sink_pages;
}

/* Go back to `target` tokens. `anchor` becomes batch_begin, which sets the ROTATING
   view: target - 1 (a batch of one token) unless the caller knows better. */
static void kvc__rewind_to(kvc_cache *c, int32_t target, int32_t anchor) {
    kvc__release_from(c, target);
    c->tail_hi = KVC__MIN(c->tail_hi, target); /* the tail keeps the rows it still has */
    c->offset = target;
    c->batch_begin = anchor;
    c->batch_pending = 0;
}
static void kvc__rewind(kvc_cache *c, int32_t target) {
    kvc__rewind_to(c, target, target > 0 ? target - 1 : 0);
}

/* ---- Layer 3: cache kinds ----------------------------------------------------------- */

static int kvc__batch_open(const kvc_cache *c) { return c->batch_pending > 0; }

/* the RECURRENT kind and checkpoints (Layers 3c, 4b) */
static int kvc__is_recurrent(const kvc_cache *c) { return c->cfg.kind == KVC_KIND_RECURRENT; }
static int kvc__has_ckpts(const kvc_cache *c) {
    return c->cfg.kind == KVC_KIND_ROTATING || c->cfg.kind == KVC_KIND_RECURRENT;
}
/* A checkpoint was named by kvc_begin, and/or is one of a RECURRENT reserve's. */
#define KVC__CK_NAMED 1
#define KVC__CK_RESERVE 2
/* Slots for checkpoints and for a batch's pending ones: the named ones; with a RECURRENT
   reserve R, also up to R + 1 reserve ones kept (offsets offset - R .. offset), twice,
   as a batch's pending ones are pushed before the list is pruned (kvc__ckpt_prune). */
static int32_t kvc__ckpt_slots(const kvc_cache_config *cc) {
    if (cc->kind != KVC_KIND_RECURRENT || cc->reserve == 0) return cc->checkpoints;
    return 2 * (cc->checkpoints + cc->reserve + 1); /* named + reserve kept, and a batch's */
}
static void kvc__settle(kvc_cache *c);
static int32_t kvc__pages_wanted(const kvc_cache *c);
static int32_t kvc__chain_pages(const kvc_snapshot *s);
static void kvc__ckpt_drop_all(kvc_cache *c);
static void kvc__ckpt_drop_after(kvc_cache *c, int32_t target);
static void kvc__pend_drop(kvc_cache *c);
static kvc_result kvc__ckpt_clone_all(const kvc_cache *src, kvc_cache *dst);
static void kvc__states_release(kvc_cache *c);
static kvc_result kvc__recurrent_begin(kvc_cache *c, int32_t n_tokens);
static kvc_result kvc__pend_alloc(kvc_cache *c, const int32_t *at, int32_t n_at, int32_t n_tokens);
static void kvc__ckpt_push(kvc_cache *c, kvc_snapshot *s);
static void kvc__ckpt_prune(kvc_cache *c);
static void kvc__ckpt_prune_at(kvc_cache *c, int64_t offset);
static int64_t kvc__recurrent_net(const kvc_cache *c, int32_t n, int32_t inside);
static int kvc__reserve_start(const kvc_cache *c, int32_t n);
static void kvc__snapshot_drop(kvc_snapshot *s);
static int32_t kvc__ckpt_find(const kvc_cache *c, int32_t at);
static int kvc__reachable(const kvc_cache *c, int32_t target);
static void kvc__rewind_any(kvc_cache *c, int32_t target);
static kvc_result kvc__recurrent_begin_batch(kvc_cache *c, const kvc_batch *b);
/* the CAUSAL kind's parts of the common calls (Layer 3b) */
static kvc_result kvc__begin_seq0(kvc_cache *c, int32_t n);
static kvc_result kvc__seq0_batch(kvc_cache *c, int32_t n, kvc_batch *b);
static kvc_result kvc__causal_admits(kvc_cache *c, const kvc_batch *b);
static int32_t kvc__seq0_next(const kvc_cache *c);
static void kvc__causal_cancel(kvc_cache *c);
static void kvc__causal_clear(kvc_cache *c);
static void kvc__seq_none(kvc_cache *c, int32_t seq);
static int32_t *kvc__cell_pos(const kvc_cache *c, int32_t cell);
/* prefix trees (Layer 5b): a cache's entry in use; pages given back under pressure */
static void kvc__lease_drop(kvc_cache *c);
static int kvc__can_reclaim(kvc_pool *p, int64_t need);
static int kvc__reclaim(kvc_pool *p, int64_t need);
static int kvc__reclaim_for(kvc_pool *p, int64_t need, int64_t need_bytes);

KVCDEF kvc_result kvc_cache_config_init(kvc_cache_config *cfg, kvc_kind kind) {
    if (cfg == NULL) return KVC_ERR_NULL;
    memset(cfg, 0, sizeof(*cfg));
    cfg->kind = kind;
    return KVC_OK;
}

/* The reserve (speculative rollback) of a config: ROTATING and RECURRENT only, bounded. */
static int kvc__reserve_ok(const kvc_cache_config *c) {
    if (c->kind == KVC_KIND_ROTATING) return c->reserve >= 0 && c->reserve <= (1 << 24);
    if (c->kind == KVC_KIND_RECURRENT) return c->reserve >= 0 && c->reserve <= 4096;
    return c->reserve == 0;
}

static kvc_result kvc__check_causal(const kvc_pool *pool, const kvc_cache_config *c, const char **field) {
    const kvc_rope *r = &c->rope;
    if (c->capacity < 1) KVC__REFUSE(KVC_ERR_INVALID, "capacity");
    if (c->padding < 0) KVC__REFUSE(KVC_ERR_INVALID, "padding");
    if (c->max_seqs < 0 || c->max_seqs > (1 << 20)) KVC__REFUSE(KVC_ERR_INVALID, "max_seqs");
    if (c->chunk < 0) KVC__REFUSE(KVC_ERR_INVALID, "chunk");
    if (c->window < 0) KVC__REFUSE(KVC_ERR_INVALID, "window");
    if (c->capacity > INT32_MAX - KVC__MAX(c->padding, 1)) KVC__REFUSE(KVC_ERR_RANGE, "capacity");
    if ((int)r->style < (int)KVC_ROPE_NONE || (int)r->style > (int)KVC_ROPE_INTERLEAVED)
        KVC__REFUSE(KVC_ERR_INVALID, "rope.style");
    if (r->shift == NULL && r->style != KVC_ROPE_NONE) {
        if (!(r->theta > 0.0f)) KVC__REFUSE(KVC_ERR_INVALID, "rope.theta");
        if (r->n_dims < 0 || r->n_dims % 2 != 0 || r->n_dims > pool->cfg.head_dim_k)
            KVC__REFUSE(KVC_ERR_INVALID, "rope.n_dims");
    }
    return KVC_OK;
}

/* f16_tail: whether t is a block type, and the bytes of a ring row of K (is_k) or V */
static int kvc__type_quantized(kvc_type t) { return t == KVC_TYPE_Q8_0 || t == KVC_TYPE_Q4_0; }
static size_t kvc__tail_row(const kvc_pool *p, int is_k) {
    kvc_type t = is_k ? p->cfg.type_k : p->cfg.type_v;
    return kvc__row_bytes(kvc__type_quantized(t) ? KVC_TYPE_F16 : t, p->cfg.n_kv_heads,
                          is_k ? p->cfg.head_dim_k : p->cfg.head_dim_v);
}
/* layer's ring: K rows, then V rows */
static unsigned char *kvc__tail_k(const kvc_cache *c, int32_t layer) {
    return c->tail + (size_t)layer * (size_t)c->cfg.f16_tail * (c->tail_krow + c->tail_vrow);
}
static unsigned char *kvc__tail_v(const kvc_cache *c, int32_t layer) {
    return kvc__tail_k(c, layer) + (size_t)c->cfg.f16_tail * c->tail_krow;
}

/* The causal cache's own arrays, after the common part of the struct. *of is set when
   they do not fit a size_t: capacity x max_seqs bits exceed 4 GiB on 32-bit hosts. */
static size_t kvc__causal_bytes(const kvc_pool *p, int32_t capacity, int32_t max_seqs, int32_t words, int *of) {
    size_t n = kvc__mul((size_t)capacity, (size_t)words * 4 + 4 * sizeof(int32_t) + 1, of);
    n = kvc__add(n, (size_t)max_seqs * 5 * sizeof(int32_t) + 2 * KVC__CELLS_LOG * sizeof(int32_t), of);
    n = kvc__add(n, kvc__mul(sizeof(float) * (size_t)p->cfg.n_kv_heads, (size_t)p->cfg.head_dim_k, of), of);
    n = kvc__add(n, kvc__mul(sizeof(double), (size_t)p->cfg.head_dim_k + 2, of), of);
    return kvc__add(n, 64 + sizeof(double), of);
}

/* What kvc_cache_create decides before it allocates: the resolved config (defaults
   filled in, fields of other kinds zeroed), the pages a CAUSAL cache takes now, its
   sequence-set words and the block size. The cache config's validator: every check of
   kvc_cache_create, naming the field it refuses (kvc_cache_config_check). */
typedef struct kvc__cache_plan {
    kvc_cache_config cc;
    int32_t pages, words;
    size_t bytes;
} kvc__cache_plan;

/* Everything but whether the pool has a CAUSAL cache's pages now: it reads the pool's
   geometry only (cfg, page_cells, max_pages, external), so kvc_memory_config_check runs it
   on a group's pool before the pool exists (kvc__pool_geometry). */
static kvc_result kvc__check_cache_plan(const kvc_pool *pool, const kvc_cache_config *cfg, kvc__cache_plan *plan,
                                        const char **field) {
    kvc_cache_config cc = *cfg;
    int32_t pages = 0, words = 0;
    int of = 0;
    size_t bytes;
    if ((cc.kind == KVC_KIND_RECURRENT) != (pool->cfg.state_floats > 0)) /* state pools */
        KVC__REFUSE(KVC_ERR_INVALID, "kind");
    if ((cc.kind == KVC_KIND_ROTATING || cc.kind == KVC_KIND_RECURRENT) &&
        (cc.checkpoints < 0 || cc.checkpoints > 4096))
        KVC__REFUSE(KVC_ERR_INVALID, "checkpoints");
    if (!kvc__reserve_ok(&cc)) KVC__REFUSE(KVC_ERR_INVALID, "reserve");
    if (cc.kind == KVC_KIND_RECURRENT) {
        if (cc.window != 0) KVC__REFUSE(KVC_ERR_INVALID, "window");
        if (cc.sinks != 0) KVC__REFUSE(KVC_ERR_INVALID, "sinks");
        if (cc.capacity != 0 || cc.padding != 0 || cc.chunk != 0) KVC__REFUSE(KVC_ERR_INVALID, "capacity");
        if (cc.max_seqs < 0 || cc.max_seqs > (1 << 20)) KVC__REFUSE(KVC_ERR_INVALID, "max_seqs");
        if (cc.max_seqs == 0) cc.max_seqs = 1;
        if (cc.max_seqs > pool->max_pages) KVC__REFUSE(KVC_ERR_FULL, "max_seqs"); /* a state per sequence */
    } else if (cc.kind == KVC_KIND_FULL) {
        if (cc.window != 0) KVC__REFUSE(KVC_ERR_INVALID, "window");
        if (cc.sinks != 0) KVC__REFUSE(KVC_ERR_INVALID, "sinks");
    } else if (cc.kind == KVC_KIND_ROTATING) {
        if (cc.window < 1) KVC__REFUSE(KVC_ERR_INVALID, "window");
        if (cc.sinks < 0 || cc.sinks >= cc.window) KVC__REFUSE(KVC_ERR_INVALID, "sinks");
    } else if (cc.kind == KVC_KIND_CAUSAL) {
        kvc_result r = kvc__check_causal(pool, &cc, field);
        if (r != KVC_OK) return r;
        if (cc.sinks != 0) KVC__REFUSE(KVC_ERR_INVALID, "sinks");
        if (cc.padding == 0) cc.padding = 1;
        if (cc.max_seqs == 0) cc.max_seqs = 256;
        if (cc.rope.n_dims == 0) cc.rope.n_dims = pool->cfg.head_dim_k;
        cc.capacity = (cc.capacity + cc.padding - 1) / cc.padding * cc.padding;
        pages = (int32_t)(((int64_t)cc.capacity + pool->page_cells - 1) / pool->page_cells);
        words = (cc.max_seqs + 31) / 32;
    } else {
        KVC__REFUSE(KVC_ERR_INVALID, "kind");
    }
    if (cc.kind != KVC_KIND_CAUSAL) { /* the causal-only fields mean nothing here */
        memset(&cc.rope, 0, sizeof(cc.rope));
        cc.capacity = cc.padding = cc.chunk = 0;
        if (cc.kind != KVC_KIND_RECURRENT) cc.max_seqs = 0;
    }
    if (cc.f16_tail != 0) { /* quantized FULL / ROTATING caches with host K/V only */
        if (cc.f16_tail < 0) KVC__REFUSE(KVC_ERR_INVALID, "f16_tail");
        if ((cc.kind != KVC_KIND_FULL && cc.kind != KVC_KIND_ROTATING) || pool->external)
            KVC__REFUSE(KVC_ERR_UNSUPPORTED, "f16_tail");
        if (!kvc__type_quantized(pool->cfg.type_k) && !kvc__type_quantized(pool->cfg.type_v))
            KVC__REFUSE(KVC_ERR_INVALID, "f16_tail");
    }
    if (cc.kind == KVC_KIND_ROTATING || cc.kind == KVC_KIND_RECURRENT) {
        if (cc.checkpoints == 0) cc.checkpoints = 8;
    } else {
        cc.checkpoints = 0;
    }
    /* checked: a wrapped size would be a small block written far past its end */
    /* the page table: CAUSAL's pages, or the first entries of one that grows */
    bytes = kvc__add(sizeof(kvc_cache) + 16, sizeof(uint32_t) * (size_t)KVC__MAX(pages, KVC__PAGE_TABLE_INLINE), &of);
    bytes = kvc__add(bytes, (size_t)pool->cfg.n_layers, &of);
    if (cc.kind == KVC_KIND_CAUSAL)
        bytes = kvc__add(bytes, kvc__causal_bytes(pool, cc.capacity, cc.max_seqs, words, &of), &of);
    /* checkpoints and RECURRENT states, pointer-aligned after the rest */
    bytes = kvc__add(bytes, sizeof(void *) + (size_t)kvc__ckpt_slots(&cc) * (2 * sizeof(void *) +
                             (size_t)pool->cfg.n_layers), &of);
    if (cc.kind == KVC_KIND_RECURRENT)
        bytes = kvc__add(bytes, kvc__mul((size_t)cc.max_seqs, 3 * sizeof(int32_t), &of), &of);
    if (cc.f16_tail > 0) /* the ring, 64-aligned */
        bytes = kvc__add(bytes, kvc__add(64, kvc__mul(kvc__mul((size_t)cc.f16_tail, (size_t)pool->cfg.n_layers, &of),
                                                      kvc__tail_row(pool, 1) + kvc__tail_row(pool, 0), &of), &of), &of);
    if (of && cc.f16_tail > 0) KVC__REFUSE(KVC_ERR_OVERFLOW, "f16_tail");
    if (of) KVC__REFUSE(KVC_ERR_OVERFLOW, cc.kind == KVC_KIND_CAUSAL ? "capacity" : "kind");
    plan->cc = cc;
    plan->pages = pages;
    plan->words = words;
    plan->bytes = bytes;
    return KVC_OK;
}

static kvc_result kvc__check_cache(kvc_pool *pool, const kvc_cache_config *cfg, kvc__cache_plan *plan,
                                   const char **field) {
    kvc_result r = kvc__check_cache_plan(pool, cfg, plan, field);
    if (r != KVC_OK) return r;
    if (plan->pages > 0 && !kvc__can_reclaim(pool, plan->pages)) KVC__REFUSE(KVC_ERR_FULL, "capacity"); /* the pool now */
    return KVC_OK;
}

static kvc_result kvc__cache_config_check_held(const kvc_pool *pool, const kvc_cache_config *cfg, const char **field) {
    kvc__cache_plan plan;
    const char *name = NULL;
    kvc_result r;
    if (field != NULL) *field = NULL;
    if (pool == NULL || cfg == NULL) return KVC_ERR_NULL;
    /* the pool is not changed: counting what its trees could give back uses their
       scratch and leaves it as it was (as kvc_radix_stats_get does) */
    r = kvc__check_cache((kvc_pool *)pool, cfg, &plan, &name);
    if (field != NULL && r != KVC_OK) *field = name;
    return r;
}

KVCDEF kvc_result kvc_cache_config_check(const kvc_pool *pool, const kvc_cache_config *cfg, const char **field) {
    KVC__POOL_LOCKED(pool, pool, kvc__cache_config_check_held(pool, cfg, field));
}

static kvc_result kvc__cache_create_held(kvc_pool *pool, const kvc_cache_config *cfg, kvc_cache **out) {
    kvc_cache *c;
    kvc_cache_config cc;
    kvc__cache_plan plan;
    const char *field;
    kvc_result r;
    size_t bytes;
    int32_t pages, i, words;
    unsigned char *cursor;
    if (pool == NULL || cfg == NULL || out == NULL) return KVC_ERR_NULL;
    if ((r = kvc__check_cache(pool, cfg, &plan, &field)) != KVC_OK) return r;
    cc = plan.cc;
    pages = plan.pages;
    words = plan.words;
    bytes = plan.bytes;
    c = (kvc_cache *)kvc__alloc(pool, bytes);
    if (c == NULL) return KVC_ERR_NO_MEMORY;
    memset(c, 0, sizeof(*c));
    c->pool = pool;
    c->id = ++pool->next_cache_id;
    c->gen = c->cells_gen = (uint64_t)c->id << 32;
    c->cfg = cc;
    c->pages = (uint32_t *)(c + 1);
    c->pages_cap = cc.kind == KVC_KIND_CAUSAL ? pages : KVC__MIN(KVC__PAGE_TABLE_INLINE, pool->max_pages);
    cursor = (unsigned char *)(c->pages + KVC__MAX(pages, KVC__PAGE_TABLE_INLINE));
    if (cc.kind == KVC_KIND_CAUSAL) { /* 4-byte arrays first, then bytes */
        c->capacity = cc.capacity;
        c->words = words;
        cursor = kvc__align_ptr(cursor, sizeof(double)); /* the page table may end 4-aligned */
        c->rope_cos = (float *)(void *)cursor;
        c->rope_sin = c->rope_cos + pool->cfg.head_dim_k;
        cursor += sizeof(double) * (size_t)(pool->cfg.head_dim_k + 2); /* the size before floats: layouts unchanged */
        c->row = (float *)cursor;
        cursor += sizeof(float) * (size_t)pool->cfg.n_kv_heads * (size_t)pool->cfg.head_dim_k;
        c->seqs = (uint32_t *)cursor;
        cursor += sizeof(uint32_t) * (size_t)words * (size_t)cc.capacity;
        c->seq_lo = (int32_t *)cursor;
        c->seq_hi = c->seq_lo + cc.max_seqs;
        c->seq_n = c->seq_hi + cc.max_seqs;
        c->seq_top = c->seq_n + cc.max_seqs;
        c->scratch = c->seq_top + cc.max_seqs;
        c->cells_log = c->scratch + cc.max_seqs;
        c->batch_pos = c->cells_log + 2 * KVC__CELLS_LOG;
        c->batch_seq = c->batch_pos + cc.capacity;
        c->in_pos = c->batch_seq + cc.capacity;
        c->in_seq = c->in_pos + cc.capacity;
        cursor = (unsigned char *)(c->in_seq + cc.capacity);
        c->batch_nc = cursor;
        cursor += cc.capacity;
        kvc__reclaim(pool, pages); /* checked above: frees enough pages */
        memset(c->seqs, 0, sizeof(uint32_t) * (size_t)words * (size_t)cc.capacity);
        for (i = 0; i < cc.max_seqs; ++i) kvc__seq_none(c, i);
        for (i = 0; i < pages; ++i) { /* zeroed: masked cells of a padded view must not hold NaNs */
            int32_t l;
            c->pages[i] = kvc__page_acquire(pool);
            memset(kvc__pos_at(pool, c->pages[i], 0), 0xff, sizeof(int32_t) * (size_t)pool->page_cells);
            kvc__page_event(pool, KVC_PAGE_ZERO, c->pages[i], 0, pool->page_cells, 0, 0);
            for (l = 0; l < pool->cfg.n_layers && !pool->external; ++l) {
                memset(kvc__k_at(pool, l, c->pages[i], 0), 0, pool->page_k_bytes);
                memset(kvc__v_at(pool, l, c->pages[i], 0), 0, pool->page_v_bytes);
            }
        }
        c->n_pages = pages;
    }
    c->batch_put = cursor;
    cursor = kvc__align_ptr(cursor + pool->cfg.n_layers, sizeof(void *));
    c->max_ckpt = cc.checkpoints;
    c->cap_ckpt = kvc__ckpt_slots(&cc);
    c->ckpt = (kvc_snapshot **)(void *)cursor;
    c->pend = c->ckpt + c->cap_ckpt;
    cursor = (unsigned char *)(c->pend + c->cap_ckpt);
    if (cc.kind == KVC_KIND_RECURRENT) {
        c->state_page = (uint32_t *)(void *)cursor;
        c->state_off = (int32_t *)(c->state_page + cc.max_seqs);
        c->batch_has = c->state_off + cc.max_seqs;
        cursor = (unsigned char *)(c->batch_has + cc.max_seqs);
        for (i = 0; i < cc.max_seqs; ++i) { c->state_page[i] = KVC__NO_PAGE; c->state_off[i] = c->batch_has[i] = 0; }
    }
    c->pend_done = cursor;
    if (cc.f16_tail > 0) {
        cursor += (size_t)cc.checkpoints * (size_t)pool->cfg.n_layers;
        c->tail = kvc__align_ptr(cursor, 64);
        c->tail_krow = kvc__tail_row(pool, 1);
        c->tail_vrow = kvc__tail_row(pool, 0);
        c->tail_tk = kvc__type_quantized(pool->cfg.type_k) ? KVC_TYPE_F16 : pool->cfg.type_k;
        c->tail_tv = kvc__type_quantized(pool->cfg.type_v) ? KVC_TYPE_F16 : pool->cfg.type_v;
    }
    /* in 64 bits: sinks + page_cells - 1 overflows int32 for sinks near INT32_MAX */
    c->n_sink_pages = cc.kind == KVC_KIND_ROTATING
                          ? (int32_t)(((int64_t)cc.sinks + pool->page_cells - 1) / pool->page_cells) : 0;
    c->first_lpage = c->n_sink_pages;
    pool->live_caches++;
    *out = c;
    return KVC_OK;
}

KVCDEF kvc_result kvc_cache_create(kvc_pool *pool, const kvc_cache_config *cfg, kvc_cache **out) {
    KVC__POOL_LOCKED(pool, pool, kvc__cache_create_held(pool, cfg, out));
}

/* A call from outside a memory that would change one of its groups (kvc_memory_group):
   KVC_ERR_OWNED, else KVC_OK (Layer 4c). `always`: also for a memory of one group. */
static kvc_result kvc__owned(const kvc_cache *c, int always);

static kvc_result kvc__cache_destroy_held(kvc_cache *cache) {
    kvc_pool *p;
    if (cache == NULL) return KVC_ERR_NULL;
    p = cache->pool;
    kvc__lease_drop(cache);
    kvc__pend_drop(cache);
    kvc__ckpt_drop_all(cache);
    kvc__states_release(cache);
    kvc__rewind(cache, 0);
    p->live_caches--;
    if (cache->pages_heap) kvc__free(p, cache->pages);
    kvc__free(p, cache);
    return KVC_OK;
}

KVCDEF kvc_result kvc_cache_destroy(kvc_cache *cache) {
    KVC__POOL_LOCKED(cache, cache->pool, kvc__owned(cache, 1) != KVC_OK ? KVC_ERR_OWNED : kvc__cache_destroy_held(cache));
}

static kvc_result kvc__cache_fork_held(const kvc_cache *cache, kvc_cache **out) {
    kvc_cache *c;
    int32_t i;
    kvc_result r;
    if (cache == NULL || out == NULL) return KVC_ERR_NULL;
    if (cache->cfg.kind == KVC_KIND_CAUSAL) return KVC_ERR_UNSUPPORTED;
    if (kvc__batch_open(cache)) return KVC_ERR_STATE;
    kvc__settle((kvc_cache *)cache); /* the ended batch's checkpoints: no visible change */
    r = kvc_cache_create(cache->pool, &cache->cfg, &c);
    if (r != KVC_OK) return r;
    if ((r = kvc__page_table_reserve(c, kvc__pages_wanted(cache))) != KVC_OK ||
        (r = kvc__ckpt_clone_all(cache, c)) != KVC_OK) { kvc_cache_destroy(c); return r; }
    for (i = 0; kvc__is_recurrent(cache) && i < cache->cfg.max_seqs; ++i) {
        c->state_page[i] = cache->state_page[i];
        c->state_off[i] = cache->state_off[i];
        if (c->state_page[i] != KVC__NO_PAGE) kvc__page_retain(cache->pool, c->state_page[i]);
    }
    for (i = 0; i < cache->n_pages; ++i) {
        kvc__page_retain(cache->pool, cache->pages[i]);
        c->pages[i] = cache->pages[i];
    }
    c->n_pages = cache->n_pages;
    c->first_lpage = cache->first_lpage;
    c->offset = cache->offset;
    c->batch_begin = cache->batch_begin;
    if (cache->tail != NULL) { /* O(f16_tail) bytes: the fork reads what the cache reads */
        memcpy(c->tail, cache->tail, (size_t)cache->cfg.f16_tail * (size_t)cache->pool->cfg.n_layers *
                                         (cache->tail_krow + cache->tail_vrow));
        c->tail_lo = cache->tail_lo;
        c->tail_hi = cache->tail_hi;
    }
    *out = c;
    return KVC_OK;
}

KVCDEF kvc_result kvc_cache_fork(const kvc_cache *cache, kvc_cache **out) {
    KVC__POOL_LOCKED(cache, cache->pool, kvc__owned(cache, 1) != KVC_OK ? KVC_ERR_OWNED : kvc__cache_fork_held(cache, out));
}

static kvc_result kvc__cache_clear_held(kvc_cache *cache) {
    if (cache == NULL) return KVC_ERR_NULL;
    kvc__lease_drop(cache);
    kvc__pend_drop(cache);
    kvc__ckpt_drop_all(cache);
    kvc__states_release(cache);
    if (cache->cfg.kind == KVC_KIND_CAUSAL) kvc__causal_clear(cache);
    else kvc__rewind(cache, 0);
    return KVC_OK;
}

KVCDEF kvc_result kvc_cache_clear(kvc_cache *cache) {
    KVC__POOL_LOCKED(cache, cache->pool, kvc__owned(cache, 0) != KVC_OK ? KVC_ERR_OWNED : kvc__cache_clear_held(cache));
}

KVCDEF kvc_result kvc_cache_offset(const kvc_cache *cache, int32_t *offset) {
    if (cache == NULL || offset == NULL) return KVC_ERR_NULL;
    *offset = cache->cfg.kind == KVC_KIND_CAUSAL ? cache->n_used : cache->offset;
    return KVC_OK;
}

KVCDEF kvc_result kvc_cache_cells(const kvc_cache *cache, int32_t *n_cells) {
    kvc__ranges r;
    if (cache == NULL || n_cells == NULL) return KVC_ERR_NULL;
    r = kvc__view(cache);
    *n_cells = (r.e[0] - r.b[0]) + (r.e[1] - KVC__MAX(r.b[1], r.e[0]));
    return KVC_OK;
}

KVCDEF kvc_result kvc_cache_pages(const kvc_cache *cache, int32_t *n_pages) {
    int32_t s;
    if (cache == NULL || n_pages == NULL) return KVC_ERR_NULL;
    *n_pages = cache->n_pages;
    for (s = 0; cache->cfg.kind == KVC_KIND_RECURRENT && s < cache->cfg.max_seqs; ++s)
        *n_pages += cache->state_page[s] != KVC__NO_PAGE;
    return KVC_OK;
}

/* Pages a ROTATING batch starting at o frees: leading window pages whose every
   token is older than the oldest token the batch's first query may see, less the
   reserve (cfg.reserve tokens before that stay held). */
static int32_t kvc__dead_pages(const kvc_cache *c, int32_t o, int32_t *freed) {
    int32_t idx, n = 0, pc = c->pool->page_cells;
    int64_t lo = kvc__window_lo(c, o) - c->cfg.reserve;
    *freed = 0;
    if (c->cfg.kind != KVC_KIND_ROTATING) return 0;
    for (idx = c->n_sink_pages; idx < c->n_pages; ++idx) {
        if (((int64_t)kvc__entry_lpage(c, idx) + 1) * pc > lo) break;
        n++;
        if (c->pool->refcount[c->pages[idx]] == 1) (*freed)++;
    }
    return n;
}

static void kvc__drop_front(kvc_cache *c, int32_t n) {
    int32_t i, s = c->n_sink_pages;
    if (n <= 0) return;
    for (i = 0; i < n; ++i) kvc__page_release(c->pool, c->pages[s + i]);
    memmove(c->pages + s, c->pages + s + n, sizeof(uint32_t) * (size_t)(c->n_pages - s - n));
    c->n_pages -= n;
    c->first_lpage += n;
}

/* Make the page holding token o-1 (partly filled) private before writing after it. */
static void kvc__unshare_tail(kvc_cache *c, int32_t o) {
    kvc_pool *p = c->pool;
    int32_t idx, pc = p->page_cells;
    uint32_t fresh;
    if (o % pc == 0) return;
    idx = kvc__lpage_index(c, o / pc);
    KVCACHE_ASSERT(idx >= 0);
    if (p->refcount[c->pages[idx]] == 1) return;
    fresh = kvc__page_acquire(p);
    kvc__page_copy_cells(p, fresh, c->pages[idx], 0, o % pc);
    kvc__page_release(p, c->pages[idx]);
    c->pages[idx] = fresh;
}

static int kvc__tail_shared(const kvc_cache *c, int32_t o) {
    int32_t idx;
    if (o % c->pool->page_cells == 0) return 0;
    idx = kvc__lpage_index(c, o / c->pool->page_cells);
    return idx >= 0 && c->pool->refcount[c->pages[idx]] > 1;
}

/* FULL and ROTATING: page-table room for a batch of n_tokens (kvc__begin_kv's entries
   after it dropped the window's dead pages); changes nothing visible. */
static kvc_result kvc__begin_kv_reserve(kvc_cache *cache, int32_t n_tokens) {
    int32_t pc = cache->pool->page_cells, o = cache->offset, freed;
    int64_t n_new = (int64_t)(o + n_tokens - 1) / pc - ((int64_t)o + pc - 1) / pc + 1;
    int32_t n_dead = kvc__dead_pages(cache, o, &freed);
    return kvc__page_table_reserve(cache, (int64_t)cache->n_pages - n_dead + n_new);
}

/* FULL and ROTATING: cells for n_tokens new tokens (checked by the caller). */
static kvc_result kvc__begin_kv(kvc_cache *cache, int32_t n_tokens) {
    kvc_pool *p;
    int32_t o, e, pc, first_new, last, n_new, n_dead, freed, lp, t;
    p = cache->pool;
    pc = p->page_cells;
    o = cache->offset;
    e = o + n_tokens;
    first_new = (int32_t)(((int64_t)o + pc - 1) / pc);
    last = (e - 1) / pc;
    n_new = last - first_new + 1;
    n_dead = kvc__dead_pages(cache, o, &freed);
    /* allocate first, evict after: a refused table leaves the trees as they were */
    if (kvc__begin_kv_reserve(cache, n_tokens) != KVC_OK) return KVC_ERR_NO_MEMORY;
    if (!kvc__reclaim(p, (int64_t)n_new + kvc__tail_shared(cache, o) - freed)) return KVC_ERR_FULL;
    /* from here on nothing can fail */
    kvc__drop_front(cache, n_dead);
    kvc__unshare_tail(cache, o);
    for (lp = first_new; lp <= last; ++lp) {
        if (cache->n_pages == cache->n_sink_pages && lp >= cache->n_sink_pages) cache->first_lpage = lp;
        cache->pages[cache->n_pages++] = kvc__page_acquire(p);
    }
    for (t = o; t < e; ++t) *kvc__pos_at(p, cache->pages[kvc__lpage_index(cache, t / pc)], t % pc) = t;
    if (cache->cfg.f16_tail > 0) { /* the batch joins the tail (contiguous with what it has) */
        int32_t lo = cache->tail_hi >= o && cache->tail_lo <= o ? cache->tail_lo : o;
        cache->tail_lo = KVC__MAX(lo, e - cache->cfg.f16_tail);
        cache->tail_hi = e;
    }
    cache->offset = e;
    cache->gen++; /* contents added or replaced (kvc_prefix checks) */
    cache->batch_begin = o;
    cache->batch_pending = p->cfg.n_layers;
    memset(cache->batch_put, 0, (size_t)p->cfg.n_layers);
    return KVC_OK;
}

static kvc_result kvc__begin_checkpoints_held(kvc_cache *cache, int32_t n_tokens, const int32_t *at, int32_t n_at) {
    int32_t i, o;
    kvc_result r;
    if (cache == NULL || (at == NULL && n_at > 0)) return KVC_ERR_NULL;
    if (n_tokens < 1 || n_at < 0) return KVC_ERR_INVALID;
    if (kvc__batch_open(cache)) return KVC_ERR_STATE;
    if (cache->cfg.kind == KVC_KIND_CAUSAL) return n_at > 0 ? KVC_ERR_UNSUPPORTED : kvc__begin_seq0(cache, n_tokens);
    o = cache->offset;
    if (n_tokens > INT32_MAX - o) return KVC_ERR_RANGE;
    if (kvc__has_ckpts(cache) && n_at > cache->max_ckpt) return KVC_ERR_RANGE;
    for (i = 0; i < n_at; ++i) /* inside the batch, in order */
        if (at[i] <= (i > 0 ? at[i - 1] : o) || at[i] > o + n_tokens) return KVC_ERR_RANGE;
    kvc__settle(cache);
    if (kvc__has_ckpts(cache) && (r = kvc__pend_alloc(cache, at, n_at, n_tokens)) != KVC_OK) return r;
    r = kvc__is_recurrent(cache) ? kvc__recurrent_begin(cache, n_tokens) : kvc__begin_kv(cache, n_tokens);
    if (r != KVC_OK) kvc__pend_drop(cache);
    return r;
}

KVCDEF kvc_result kvc_begin(kvc_cache *cache, int32_t n_tokens, const int32_t *at, int32_t n_at) {
    KVC__POOL_LOCKED(cache, cache->pool, kvc__owned(cache, 0) != KVC_OK ? KVC_ERR_OWNED : kvc__begin_checkpoints_held(cache, n_tokens, at, n_at));
}

KVCDEF kvc_result kvc_begin_at(kvc_cache *cache, int32_t pos, int32_t n_tokens) {
    int32_t expected;
    if (cache == NULL) return KVC_ERR_NULL;
    if (n_tokens < 1) return KVC_ERR_INVALID;
    if (kvc__batch_open(cache)) return KVC_ERR_STATE;
    expected = cache->cfg.kind == KVC_KIND_CAUSAL ? kvc__seq0_next(cache) : cache->offset;
    if (pos != expected) return KVC_ERR_POSITION;
    return kvc_begin(cache, n_tokens, NULL, 0);
}

KVCDEF kvc_result kvc_put(kvc_cache *cache, int32_t layer, const float *k, const float *v) {
    kvc_pool *p;
    const kvc__type_info *tk, *tv;
    kvc__limits L;
    int32_t t, pc, nk, nv;
    if (cache == NULL) return KVC_ERR_NULL;
    if (kvc__is_recurrent(cache)) return KVC_ERR_UNSUPPORTED; /* kvc_state */
    p = cache->pool;
    if (p->external ? (k != NULL || v != NULL) : (k == NULL || v == NULL))
        return p->external ? KVC_ERR_INVALID : KVC_ERR_NULL; /* external: the backend wrote it */
    if (layer < 0 || layer >= p->cfg.n_layers) return KVC_ERR_RANGE;
    if (!kvc__batch_open(cache)) return KVC_ERR_STATE;
    pc = p->page_cells;
    tk = &p->tk;
    tv = &p->tv;
    nk = p->cfg.n_kv_heads * p->cfg.head_dim_k;
    nv = p->cfg.n_kv_heads * p->cfg.head_dim_v;
    L.n_heads = p->cfg.n_kv_heads;
    L.hk = p->cfg.head_dim_k;
    L.hv = p->cfg.head_dim_v;
    L.k = kvc__finite_limit(p->cfg.type_k, p->rot_k);
    L.v = kvc__finite_limit(p->cfg.type_v, p->rot_v);
    L.over = p->over_fn;
    if (cache->tail != NULL) { /* the tail's types bound them too */
        L.k = KVC__MIN(L.k, kvc__finite_limit(cache->tail_tk, p->rot_k));
        L.v = KVC__MIN(L.v, kvc__finite_limit(cache->tail_tv, p->rot_v));
    }
    /* the batch's cells: tokens batch_begin.. (CAUSAL: cells batch_loc..) */
    for (t = 0; !p->external && t < (cache->cfg.kind == KVC_KIND_CAUSAL ? cache->batch_n : cache->offset - cache->batch_begin); ++t) {
        int32_t cell = cache->cfg.kind == KVC_KIND_CAUSAL ? cache->batch_loc + t : cache->batch_begin + t;
        uint32_t page = cache->pages[kvc__lpage_index(cache, cell / pc)];
        const float *kt = k + (size_t)t * (size_t)nk, *vt = v + (size_t)t * (size_t)nv;
        int bad = kvc__cell_bad(&L, kt, vt);
        KVCACHE_ASSERT(p->refcount[page] == 1);
        kvc__store_row(tk, p->rot_fn, kt, kvc__k_at(p, layer, page, cell % pc), nk, p->cfg.head_dim_k, p->rot_k);
        kvc__store_row(tv, p->rot_fn, vt, kvc__v_at(p, layer, page, cell % pc), nv, p->cfg.head_dim_v, p->rot_v);
        if (bad) /* the non-finite rule: NaN keys, zero values */
            kvc__poison_cell(&L, kt, vt, p->cfg.type_k, kvc__k_at(p, layer, page, cell % pc), p->cfg.type_v,
                             kvc__v_at(p, layer, page, cell % pc));
        if (cache->tail != NULL && cell >= cache->tail_lo) { /* the tail's copy, from the same f32 */
            /* stored rotated like the pages: attention rotates q once for every key it reads
               and rotates the output back once for every value */
            size_t slot = (size_t)(cell % cache->cfg.f16_tail);
            kvc__type_info ttk = kvc__pick_type(cache->tail_tk, p->cpu), ttv = kvc__pick_type(cache->tail_tv, p->cpu);
            kvc__store_row(&ttk, p->rot_fn, k + (size_t)t * (size_t)nk,
                           kvc__tail_k(cache, layer) + slot * cache->tail_krow, nk, p->cfg.head_dim_k, p->rot_k);
            kvc__store_row(&ttv, p->rot_fn, v + (size_t)t * (size_t)nv,
                           kvc__tail_v(cache, layer) + slot * cache->tail_vrow, nv, p->cfg.head_dim_v, p->rot_v);
            if (bad)
                kvc__poison_cell(&L, kt, vt, cache->tail_tk, kvc__tail_k(cache, layer) + slot * cache->tail_krow,
                                 cache->tail_tv, kvc__tail_v(cache, layer) + slot * cache->tail_vrow);
        }
    }
    if (!cache->batch_put[layer]) {
        cache->batch_put[layer] = 1;
        cache->batch_pending--;
    }
    cache->gen++;
    return KVC_OK;
}

static kvc_result kvc__cancel_held(kvc_cache *cache) {
    if (cache == NULL) return KVC_ERR_NULL;
    if (!kvc__batch_open(cache)) return KVC_ERR_STATE;
    if (cache->cfg.kind == KVC_KIND_CAUSAL) { kvc__causal_cancel(cache); return KVC_OK; }
    if (kvc__is_recurrent(cache)) {
        int32_t s;
        /* a state handed out may have been updated in place: there is no way back */
        if (cache->batch_pending < cache->pool->cfg.n_layers) return KVC_ERR_RECURRENT;
        for (s = 0; s < cache->cfg.max_seqs; ++s) { cache->state_off[s] -= cache->batch_has[s]; cache->batch_has[s] = 0; }
        cache->offset = cache->state_off[0];
        cache->batch_pending = 0;
        cache->states_open = 0;
        kvc__pend_drop(cache);
        return KVC_OK;
    }
    kvc__pend_drop(cache);
    /* keep batch_begin: the window kvc_begin kept is exactly the one it anchors */
    kvc__rewind_to(cache, cache->batch_begin, cache->batch_begin);
    return KVC_OK;
}

KVCDEF kvc_result kvc_cancel(kvc_cache *cache) {
    KVC__POOL_LOCKED(cache, cache->pool, kvc__owned(cache, 0) != KVC_OK ? KVC_ERR_OWNED : kvc__cancel_held(cache));
}

/* A ROTATING window has wrapped once it has held more than W tokens (the rule of
   ollama's MLX runner), or released a page (a kvc_cancel can bring the offset back below
   W after that). */
static int kvc__wrapped(const kvc_cache *c) {
    return c->offset > c->cfg.window || c->first_lpage > c->n_sink_pages;
}

static int kvc__can_trim(const kvc_cache *c) {
    if (c->cfg.kind == KVC_KIND_CAUSAL || c->cfg.kind == KVC_KIND_RECURRENT) return 0; /* see kvc_cache_can_rewind */
    /* with a reserve: a trim by one token at least (kvc_cache_can_rewind says how far) */
    return c->cfg.kind != KVC_KIND_ROTATING || !kvc__wrapped(c) ||
           (c->offset > 0 && kvc__reserve_holds(c, c->first_lpage, c->offset - 1));
}

KVCDEF kvc_result kvc_cache_can_trim(const kvc_cache *cache, int *can_trim) {
    if (cache == NULL || can_trim == NULL) return KVC_ERR_NULL;
    *can_trim = kvc__can_trim(cache);
    return KVC_OK;
}

static kvc_result kvc__trim_held(kvc_cache *cache, int32_t n_tokens) {
    if (cache == NULL) return KVC_ERR_NULL;
    if (cache->cfg.kind == KVC_KIND_CAUSAL) return KVC_ERR_UNSUPPORTED;
    if (kvc__batch_open(cache)) return KVC_ERR_STATE; /* kvc_cancel first */
    if (n_tokens < 0 || n_tokens > cache->offset) return KVC_ERR_RANGE;
    /* by 0: the offset is always reachable, and nothing changes (a rewind there would
       re-anchor a ROTATING window at offset - 1), as kvc_cache_restore(cache, NULL, offset) */
    if (n_tokens == 0) return KVC_OK;
    /* a wrapped window or a state goes back only onto a checkpoint (or to 0): the result
       kvc_cache_restore(cache, NULL, t) and kvc_memory_trim give */
    if (!kvc__reachable(cache, cache->offset - n_tokens)) return KVC_ERR_UNREACHABLE;
    kvc__rewind_any(cache, cache->offset - n_tokens);
    return KVC_OK;
}

KVCDEF kvc_result kvc_cache_trim(kvc_cache *cache, int32_t n_tokens) {
    KVC__POOL_LOCKED(cache, cache->pool, kvc__owned(cache, 0) != KVC_OK ? KVC_ERR_OWNED : kvc__trim_held(cache, n_tokens));
}

/* ---- Layer 3b: the CAUSAL kind (ollama's kvcache.Causal) ---------------------------
   A fixed set of cells, each with a position (in the pool, -1 when empty) and a set of
   sequences (a bitset). A batch takes a run of free cells; copy_prefix shares cells by
   adding a sequence to their sets; nothing about it is copied. */

static int kvc__is_causal(const kvc_cache *c) { return c->cfg.kind == KVC_KIND_CAUSAL; }

static int32_t *kvc__cell_pos(const kvc_cache *c, int32_t cell) {
    int32_t pc = c->pool->page_cells;
    return kvc__pos_at(c->pool, c->pages[cell / pc], cell % pc);
}
static int kvc__cell_has(const kvc_cache *c, int32_t cell, int32_t seq) {
    return (c->seqs[(size_t)cell * c->words + (size_t)(seq >> 5)] >> (seq & 31)) & 1u;
}
static int kvc__cell_empty(const kvc_cache *c, int32_t cell) {
    int32_t w;
    for (w = 0; w < c->words; ++w)
        if (c->seqs[(size_t)cell * c->words + w]) return 0;
    return 1;
}
/* the only sequence of a cell, or -1 when it has none or several */
static int32_t kvc__cell_only(const kvc_cache *c, int32_t cell) {
    int32_t w, found = -1;
    for (w = 0; w < c->words; ++w) {
        uint32_t bits = c->seqs[(size_t)cell * c->words + w];
        if (!bits) continue;
        if (found >= 0 || (bits & (bits - 1u))) return -1;
        for (found = 0; !((bits >> found) & 1u); ++found) {}
        found += w * 32;
    }
    return found;
}
/* Cells [lo, hi) changed their sequences or positions: a new cells_gen, logged with them */
static void kvc__cells_changed(kvc_cache *c, int32_t lo, int32_t hi) {
    int32_t *e = c->cells_log + 2 * (size_t)(++c->cells_gen % KVC__CELLS_LOG);
    e[0] = lo;
    e[1] = hi;
}
static void kvc__seq_none(kvc_cache *c, int32_t seq) {
    c->seq_lo[seq] = INT32_MAX;
    c->seq_hi[seq] = 0;
    c->seq_n[seq] = 0;
    c->seq_top[seq] = INT32_MIN;
}
/* (the cell's position is set first) */
static void kvc__cell_add(kvc_cache *c, int32_t cell, int32_t seq) {
    if (kvc__cell_empty(c, cell)) c->n_used++;
    kvc__cells_changed(c, cell, cell + 1);
    c->seq_n[seq] += !kvc__cell_has(c, cell, seq);
    c->seqs[(size_t)cell * c->words + (size_t)(seq >> 5)] |= 1u << (seq & 31);
    if (cell < c->seq_lo[seq]) c->seq_lo[seq] = cell;
    if (cell + 1 > c->seq_hi[seq]) c->seq_hi[seq] = cell + 1;
    c->seq_top[seq] = KVC__MAX(c->seq_top[seq], *kvc__cell_pos(c, cell));
}
/* bounds may stay loose after a delete; kvc__seq_bounds tightens them */
static void kvc__cell_del(kvc_cache *c, int32_t cell, int32_t seq) {
    if (!kvc__cell_has(c, cell, seq)) return;
    kvc__cells_changed(c, cell, cell + 1);
    c->seq_n[seq]--;
    c->seqs[(size_t)cell * c->words + (size_t)(seq >> 5)] &= ~(1u << (seq & 31));
    if (kvc__cell_empty(c, cell)) {
        c->n_used--;
        *kvc__cell_pos(c, cell) = -1;
    }
}
static void kvc__seq_bounds(kvc_cache *c, int32_t seq) {
    int32_t i, lo = INT32_MAX, hi = 0, top = INT32_MIN;
    for (i = KVC__MAX(c->seq_lo[seq], 0); i < c->seq_hi[seq]; ++i)
        if (kvc__cell_has(c, i, seq)) {
            if (lo == INT32_MAX) lo = i;
            hi = i + 1;
            top = KVC__MAX(top, *kvc__cell_pos(c, i));
        }
    c->seq_lo[seq] = lo;
    c->seq_hi[seq] = hi;
    c->seq_top[seq] = top;
}
/* every sequence's bookkeeping from the cells (after they were moved or written whole) */
static void kvc__all_bounds(kvc_cache *c) {
    int32_t i, s;
    for (s = 0; s < c->cfg.max_seqs; ++s) kvc__seq_none(c, s);
    for (i = 0; i < c->capacity; ++i)
        for (s = 0; s < c->cfg.max_seqs; ++s)
            if (kvc__cell_has(c, i, s)) {
                if (i < c->seq_lo[s]) c->seq_lo[s] = i;
                c->seq_hi[s] = i + 1;
                c->seq_n[s]++;
                c->seq_top[s] = KVC__MAX(c->seq_top[s], *kvc__cell_pos(c, i));
            }
}
static int kvc__seq_known(const kvc_cache *c, int32_t seq) { return c->seq_lo[seq] < c->seq_hi[seq]; }

/* The mask rule: may a query (pos p, seq s) see cell `cell`? */
static int kvc__causal_visible(const kvc_cache *c, int32_t cell, int32_t p, int32_t s, int non_causal, int32_t window) {
    int32_t key;
    if (!kvc__cell_has(c, cell, s)) return 0;
    key = *kvc__cell_pos(c, cell);
    if (!non_causal && key > p) return 0;
    if (c->cfg.window > 0 && (int64_t)key <= (int64_t)p - c->cfg.window) return 0;
    if (window > 0 && (int64_t)key <= (int64_t)p - window) return 0;
    if (c->cfg.chunk > 0 && key / c->cfg.chunk != p / c->cfg.chunk) return 0;
    return 1;
}

static kvc_result kvc__check_seq(const kvc_cache *c, int32_t seq) {
    if (!kvc__is_causal(c)) return KVC_ERR_UNSUPPORTED;
    return seq >= 0 && seq < c->cfg.max_seqs ? KVC_OK : KVC_ERR_RANGE;
}

/* Copy n cells (K/V of every layer and positions) between two cell indices of caches
   on the same pool, page by page. */
static void kvc__copy_cells(kvc_pool *p, const uint32_t *dst_pages, int32_t dst, const uint32_t *src_pages,
                            int32_t src, int32_t n) {
    int32_t pc = p->page_cells;
    while (n > 0) {
        int32_t k = KVC__MIN(n, KVC__MIN(pc - dst % pc, pc - src % pc)), l;
        uint32_t dp = dst_pages[dst / pc], sp = src_pages[src / pc];
        kvc__page_event(p, KVC_PAGE_COPY, dp, dst % pc, k, sp, src % pc);
        for (l = 0; l < p->cfg.n_layers && !p->external; ++l) {
            memcpy(kvc__k_at(p, l, dp, dst % pc), kvc__k_at(p, l, sp, src % pc), (size_t)k * p->k_row);
            memcpy(kvc__v_at(p, l, dp, dst % pc), kvc__v_at(p, l, sp, src % pc), (size_t)k * p->v_row);
        }
        memcpy(kvc__pos_at(p, dp, dst % pc), kvc__pos_at(p, sp, src % pc), (size_t)k * sizeof(int32_t));
        dst += k;
        src += k;
        n -= k;
    }
}

/* Move the live cells into [0, n_used): only cells beyond that move, each into the
   lowest hole, in ascending order, so runs of neighbours move as one block. */
static int32_t kvc__defrag(kvc_cache *c) {
    int32_t hole = 0, src, moves = 0, run_src = -1, run_dst = -1, run_n = 0;
    for (src = c->n_used; src < c->capacity; ++src) {
        if (kvc__cell_empty(c, src)) continue;
        while (!kvc__cell_empty(c, hole)) hole++;
        KVCACHE_ASSERT(hole < c->n_used);
        if (run_n > 0 && src == run_src + run_n && hole == run_dst + run_n) {
            run_n++;
        } else {
            if (run_n > 0) { kvc__copy_cells(c->pool, c->pages, run_dst, c->pages, run_src, run_n); moves++; }
            run_src = src;
            run_dst = hole;
            run_n = 1;
        }
        /* the metadata moves now; the K/V of the run when it ends */
        memcpy(c->seqs + (size_t)hole * c->words, c->seqs + (size_t)src * c->words, sizeof(uint32_t) * (size_t)c->words);
        memset(c->seqs + (size_t)src * c->words, 0, sizeof(uint32_t) * (size_t)c->words);
        hole++;
    }
    if (run_n > 0) { kvc__copy_cells(c->pool, c->pages, run_dst, c->pages, run_src, run_n); moves++; }
    for (src = c->n_used; src < c->capacity; ++src) *kvc__cell_pos(c, src) = -1;
    kvc__all_bounds(c);
    kvc__cells_changed(c, 0, c->capacity);
    return moves;
}

static kvc_result kvc__defrag_held(kvc_cache *cache, int32_t *n_moves) {
    int32_t moves;
    if (cache == NULL) return KVC_ERR_NULL;
    if (!kvc__is_causal(cache)) return KVC_ERR_UNSUPPORTED;
    if (kvc__batch_open(cache)) return KVC_ERR_STATE;
    moves = kvc__defrag(cache);
    cache->range_lo = cache->range_hi = cache->batch_n = 0; /* cell indices changed */
    if (n_moves) *n_moves = moves;
    return KVC_OK;
}

KVCDEF kvc_result kvc_cache_defrag(kvc_cache *cache, int32_t *n_moves) {
    KVC__POOL_LOCKED(cache, cache->pool, kvc__owned(cache, 0) != KVC_OK ? KVC_ERR_OWNED : kvc__defrag_held(cache, n_moves));
}

/* Sliding-window memory: the lowest batch position of each sequence (scratch, INT32_MAX
   for sequences not in the batch); a cell of s older than that position's window is
   invisible to the batch and to everything after it. */
static int kvc__window_dead(const kvc_cache *c, int32_t cell, int32_t seq) {
    return c->cfg.window > 0 && c->scratch[seq] != INT32_MAX &&
           (int64_t)*kvc__cell_pos(c, cell) <= (int64_t)c->scratch[seq] - c->cfg.window;
}

/* How many cells the window release would free (without changing anything). */
static int32_t kvc__window_freeable(const kvc_cache *c) {
    int32_t cell, s, n = 0;
    if (c->cfg.window <= 0) return 0;
    for (cell = 0; cell < c->capacity; ++cell) {
        int any = 0, all = 1;
        for (s = 0; s < c->cfg.max_seqs && all; ++s)
            if (kvc__cell_has(c, cell, s)) { any = 1; all = kvc__window_dead(c, cell, s); }
        n += any && all;
    }
    return n;
}

static void kvc__window_release(kvc_cache *c) {
    int32_t cell, s;
    if (c->cfg.window <= 0) return;
    for (s = 0; s < c->cfg.max_seqs; ++s) {
        if (c->scratch[s] == INT32_MAX || !kvc__seq_known(c, s)) continue;
        for (cell = c->seq_lo[s]; cell < c->seq_hi[s]; ++cell)
            if (kvc__cell_has(c, cell, s) && kvc__window_dead(c, cell, s)) kvc__cell_del(c, cell, s);
        kvc__seq_bounds(c, s);
    }
}

static int32_t kvc__find_run(const kvc_cache *c, int32_t n) {
    int32_t i, count = 0;
    for (i = 0; i < c->capacity; ++i) {
        if (!kvc__cell_empty(c, i)) { count = 0; continue; }
        if (++count == n) return i - n + 1;
    }
    return -1;
}

static kvc_result kvc__check_batch(const kvc_cache *c, const kvc_batch *b) {
    int32_t i;
    if (b->n_tokens < 1) return KVC_ERR_INVALID;
    if (b->pos == NULL || b->seq == NULL) return KVC_ERR_NULL;
    for (i = 0; i < b->n_tokens; ++i) {
        if (b->pos[i] < 0 || b->pos[i] == INT32_MAX) return KVC_ERR_RANGE;
        if (b->seq[i] < 0 || b->seq[i] >= c->cfg.max_seqs) return KVC_ERR_RANGE;
    }
    return KVC_OK;
}

/* Whether a CAUSAL cache with no batch open takes batch b (its result, nothing changed
   but the scratch: each sequence's lowest batch position, for kvc__window_release). */
static kvc_result kvc__causal_admits(kvc_cache *c, const kvc_batch *b) {
    int32_t i;
    kvc_result r = kvc__check_batch(c, b);
    if (r != KVC_OK) return r;
    if (b->n_tokens > c->capacity) return KVC_ERR_FULL;
    for (i = 0; i < c->cfg.max_seqs; ++i) c->scratch[i] = INT32_MAX;
    for (i = 0; i < b->n_tokens; ++i) c->scratch[b->seq[i]] = KVC__MIN(c->scratch[b->seq[i]], b->pos[i]);
    if (c->capacity - c->n_used + kvc__window_freeable(c) < b->n_tokens) return KVC_ERR_FULL;
    return KVC_OK;
}

static kvc_result kvc__begin_batch_held(kvc_cache *c, const kvc_batch *b) {
    int32_t i, loc, pad, lo = INT32_MAX, hi = 0;
    kvc_result r;
    if (c == NULL || b == NULL) return KVC_ERR_NULL;
    if (kvc__is_recurrent(c)) return kvc__batch_open(c) ? KVC_ERR_STATE : kvc__recurrent_begin_batch(c, b);
    if (!kvc__is_causal(c)) return KVC_ERR_UNSUPPORTED;
    if (kvc__batch_open(c)) return KVC_ERR_STATE;
    if ((r = kvc__causal_admits(c, b)) != KVC_OK) return r;
    /* from here on it succeeds */
    kvc__window_release(c);
    loc = kvc__find_run(c, b->n_tokens);
    if (loc < 0) {
        kvc__defrag(c);
        loc = kvc__find_run(c, b->n_tokens);
        KVCACHE_ASSERT(loc >= 0);
    }
    for (i = 0; i < b->n_tokens; ++i) {
        *kvc__cell_pos(c, loc + i) = b->pos[i];
        kvc__cell_add(c, loc + i, b->seq[i]);
        c->batch_pos[i] = b->pos[i];
        c->batch_seq[i] = b->seq[i];
        c->batch_nc[i] = b->non_causal ? (b->non_causal[i] != 0) : 0;
    }
    for (i = 0; i < b->n_tokens; ++i) { /* what the batch reads: its sequences' cells */
        lo = KVC__MIN(lo, c->seq_lo[b->seq[i]]);
        hi = KVC__MAX(hi, c->seq_hi[b->seq[i]]);
    }
    pad = c->cfg.padding;
    c->range_lo = lo / pad * pad;
    c->range_hi = (int32_t)KVC__MIN((int64_t)(hi + pad - 1) / pad * pad, (int64_t)c->capacity);
    c->batch_loc = loc;
    c->batch_n = b->n_tokens;
    c->batch_pending = c->pool->cfg.n_layers;
    memset(c->batch_put, 0, (size_t)c->pool->cfg.n_layers);
    return KVC_OK;
}

KVCDEF kvc_result kvc_begin_batch(kvc_cache *c, const kvc_batch *b) {
    KVC__POOL_LOCKED(c, c->pool, kvc__owned(c, 0) != KVC_OK ? KVC_ERR_OWNED : kvc__begin_batch_held(c, b));
}

/* kvc_begin on a CAUSAL cache: sequence 0, after its last position. */
/* Sequence 0's next position: one past the largest it holds, 0 when it holds none. */
static int32_t kvc__seq0_next(const kvc_cache *c) {
    int32_t i, next = 0;
    for (i = KVC__MAX(c->seq_lo[0], 0); i < c->seq_hi[0]; ++i)
        if (kvc__cell_has(c, i, 0)) next = KVC__MAX(next, *kvc__cell_pos(c, i) + 1);
    return next;
}

/* Sequence 0's batch of n tokens after its last position, in *b (over the cache's
   input scratch). */
static kvc_result kvc__seq0_batch(kvc_cache *c, int32_t n, kvc_batch *b) {
    int32_t i, next;
    if (n > c->capacity) return KVC_ERR_FULL;
    next = kvc__seq0_next(c);
    if (n > INT32_MAX - 1 - next) return KVC_ERR_RANGE;
    for (i = 0; i < n; ++i) { c->in_pos[i] = next + i; c->in_seq[i] = 0; }
    b->n_tokens = n;
    b->pos = c->in_pos;
    b->seq = c->in_seq;
    b->non_causal = NULL;
    return KVC_OK;
}

static kvc_result kvc__begin_seq0(kvc_cache *c, int32_t n) {
    kvc_batch b;
    kvc_result r = kvc__seq0_batch(c, n, &b);
    return r != KVC_OK ? r : kvc_begin_batch(c, &b);
}

static void kvc__causal_cancel(kvc_cache *c) {
    int32_t i;
    for (i = 0; i < c->batch_n; ++i) {
        int32_t s = c->batch_seq[i];
        kvc__cell_del(c, c->batch_loc + i, s);
    }
    for (i = 0; i < c->batch_n; ++i) kvc__seq_bounds(c, c->batch_seq[i]);
    c->batch_n = 0;
    c->range_lo = c->range_hi = 0;
    c->batch_pending = 0;
}

static void kvc__causal_clear(kvc_cache *c) {
    int32_t i;
    memset(c->seqs, 0, sizeof(uint32_t) * (size_t)c->words * (size_t)c->capacity);
    for (i = 0; i < c->capacity; ++i) *kvc__cell_pos(c, i) = -1;
    kvc__cells_changed(c, 0, c->capacity);
    for (i = 0; i < c->cfg.max_seqs; ++i) kvc__seq_none(c, i);
    c->n_used = 0;
    c->batch_n = c->batch_pending = 0;
    c->range_lo = c->range_hi = 0;
}

KVCDEF kvc_result kvc_mask_export(const kvc_cache *c, int32_t row_pad, float *mask, size_t max_floats,
                                  int32_t *n_rows, int32_t *n_cols, int32_t *first_cell) {
    int32_t rows, cols, i, j;
    if (c == NULL || n_rows == NULL || n_cols == NULL || first_cell == NULL) return KVC_ERR_NULL;
    if (!kvc__is_causal(c)) return KVC_ERR_UNSUPPORTED;
    if (row_pad < 0) return KVC_ERR_INVALID;
    if (row_pad == 0) row_pad = 1;
    if (c->batch_n > INT32_MAX - row_pad) return KVC_ERR_RANGE;
    rows = (c->batch_n + row_pad - 1) / row_pad * row_pad;
    cols = c->range_hi - c->range_lo;
    *n_rows = rows;
    *n_cols = cols;
    *first_cell = c->range_lo;
    if (mask == NULL) return KVC_OK;
    /* in 64 bits: 2^30 rows x 4 columns wraps a 32-bit size_t to 0 */
    if ((uint64_t)rows * (uint64_t)cols > (uint64_t)max_floats) return KVC_ERR_RANGE;
    for (i = 0; i < rows; ++i)
        for (j = 0; j < cols; ++j)
            mask[(size_t)i * cols + j] =
                i < c->batch_n && kvc__causal_visible(c, c->range_lo + j, c->batch_pos[i], c->batch_seq[i], c->batch_nc[i], 0)
                    ? 0.0f : -INFINITY;
    return KVC_OK;
}

static kvc_result kvc__seq_copy_prefix_held(kvc_cache *c, int32_t src, int32_t dst, int32_t len) {
    int32_t i;
    kvc_result r;
    if (c == NULL) return KVC_ERR_NULL;
    if ((r = kvc__check_seq(c, src)) != KVC_OK || (r = kvc__check_seq(c, dst)) != KVC_OK) return r;
    if (src == dst || len < 0) return KVC_ERR_INVALID;
    if (kvc__batch_open(c)) return KVC_ERR_STATE;
    for (i = 0; i < c->capacity; ++i) {
        kvc__cell_del(c, i, dst);
        if (kvc__cell_has(c, i, src) && *kvc__cell_pos(c, i) < len) kvc__cell_add(c, i, dst);
    }
    kvc__seq_bounds(c, dst);
    return KVC_OK;
}

KVCDEF kvc_result kvc_seq_copy_prefix(kvc_cache *c, int32_t src, int32_t dst, int32_t len) {
    KVC__POOL_LOCKED(c, c->pool, kvc__owned(c, 0) != KVC_OK ? KVC_ERR_OWNED : kvc__seq_copy_prefix_held(c, src, dst, len));
}

/* Re-rotate one cell's keys of every layer from old_pos to new_pos, with the cos/sin
   table of kvc__rope_table (one table serves every cell of a shift). */
static void kvc__rope_cell(kvc_cache *c, int32_t cell, int32_t old_pos, int32_t new_pos) {
    kvc_pool *p = c->pool;
    const kvc__type_info *tk = &p->tk;
    const kvc_rope *rope = &c->cfg.rope;
    int32_t pc = p->page_cells, hk = p->cfg.head_dim_k, nk = p->cfg.n_kv_heads * hk, l, h;
    uint32_t page = c->pages[cell / pc];
    if (p->cfg.hooks.event != NULL) {
        kvc_page_event ev;
        memset(&ev, 0, sizeof(ev));
        ev.kind = KVC_PAGE_ROPE;
        ev.page = page;
        ev.cell = cell % pc;
        ev.n_cells = 1;
        ev.old_pos = old_pos;
        ev.new_pos = new_pos;
        ev.rope = rope;
        p->cfg.hooks.event(p->cfg.hooks.user, &ev);
    }
    for (l = 0; l < p->cfg.n_layers && !p->external; ++l) {
        unsigned char *k = kvc__k_at(p, l, page, cell % pc);
        tk->to_f32(k, c->row, nk);
        if (p->rot_k) kvc__rot_rows(p->rot_fn, c->row, hk, p->rot_k, (size_t)p->cfg.n_kv_heads, 1); /* plain keys */
        if (rope->shift) {
            rope->shift(rope->user, l, c->row, p->cfg.n_kv_heads, hk, old_pos, new_pos);
        } else {
            for (h = 0; h < p->cfg.n_kv_heads; ++h)
                p->rotate(c->row + (size_t)h * hk, c->rope_cos, c->rope_sin, rope->n_dims,
                          rope->style == KVC_ROPE_INTERLEAVED);
        }
        if (p->rot_k) kvc__rot_rows(p->rot_fn, c->row, hk, p->rot_k, (size_t)p->cfg.n_kv_heads, 0);
        tk->from_f32(c->row, k, nk);
        for (h = 0; h < p->cfg.n_kv_heads; ++h) /* a poisoned key stays one (quantising drops a NaN) */
            if (kvc__head_bad(c->row + (size_t)h * hk, hk, kvc__finite_limit(p->cfg.type_k, 0))) {
                kvc__poison_row(p->cfg.type_k, k + kvc__row_bytes(p->cfg.type_k, h, hk), hk, 1);
                kvc__poison_row(p->cfg.type_v, kvc__v_at(p, l, page, cell % pc) + kvc__row_bytes(p->cfg.type_v, h,
                                p->cfg.head_dim_v), p->cfg.head_dim_v, 0);
            }
    }
}

/* cos/sin of one shift's angles (in double, then rounded), laid out for the style */
static void kvc__rope_table(kvc_cache *c, int32_t delta) {
    int32_t i, n = c->cfg.rope.n_dims, inter = c->cfg.rope.style == KVC_ROPE_INTERLEAVED;
    for (i = 0; i < n / 2; ++i) {
        double angle = (double)delta * pow((double)c->cfg.rope.theta, -2.0 * i / n);
        int32_t at = inter ? 2 * i : i;
        c->rope_cos[at] = (float)cos(angle);
        c->rope_sin[at] = (float)sin(angle);
        if (inter) {
            c->rope_cos[at + 1] = c->rope_cos[at];
            c->rope_sin[at + 1] = c->rope_sin[at];
        }
    }
}

/* RECURRENT: a sequence's state goes as a whole, or not at all. */
static kvc_result kvc__state_seq_op(kvc_cache *c, int32_t seq, int keep_only) {
    int32_t s;
    if (seq < 0 || seq >= c->cfg.max_seqs) return KVC_ERR_RANGE;
    if (kvc__batch_open(c)) return KVC_ERR_STATE;
    kvc__settle(c);
    for (s = 0; s < c->cfg.max_seqs; ++s) {
        if (keep_only ? s == seq : s != seq) continue;
        if (c->state_page[s] != KVC__NO_PAGE) kvc__page_release(c->pool, c->state_page[s]);
        c->state_page[s] = KVC__NO_PAGE;
        c->state_off[s] = 0;
        if (s == 0) { /* sequence 0's checkpoints went with it */
            kvc__ckpt_drop_all(c);
            c->offset = c->batch_begin = 0;
        }
    }
    return KVC_OK;
}

static kvc_result kvc__seq_remove_held(kvc_cache *c, int32_t seq, int32_t begin, int32_t end) {
    int32_t i, shift = 0;
    kvc_result r;
    if (c == NULL) return KVC_ERR_NULL;
    if (kvc__is_recurrent(c)) { /* only the whole sequence: a state cannot lose some tokens */
        if (begin < 0 || end < begin) return KVC_ERR_INVALID;
        if (begin != 0 || end != KVC_POS_END) return seq < 0 || seq >= c->cfg.max_seqs ? KVC_ERR_RANGE : KVC_ERR_RECURRENT;
        return kvc__state_seq_op(c, seq, 0);
    }
    if ((r = kvc__check_seq(c, seq)) != KVC_OK) return r;
    if (begin < 0 || end < begin) return KVC_ERR_INVALID;
    if (kvc__batch_open(c)) return KVC_ERR_STATE;
    if (!kvc__seq_known(c, seq)) return KVC_ERR_NOT_FOUND;
    if (end != KVC_POS_END) /* later cells move back: each must be this sequence's alone */
        for (i = c->seq_lo[seq]; i < c->seq_hi[seq]; ++i)
            if (kvc__cell_has(c, i, seq) && *kvc__cell_pos(c, i) >= end) {
                if (kvc__cell_only(c, i) != seq) return KVC_ERR_SHARED;
                shift = 1;
            }
    if (shift && begin < end && c->cfg.rope.shift == NULL && c->cfg.rope.style == KVC_ROPE_NONE)
        return KVC_ERR_UNSUPPORTED;
    if (shift && begin < end && c->cfg.rope.shift != NULL && c->pool->external)
        return KVC_ERR_UNSUPPORTED; /* a host callback cannot reach device-held keys */
    if (shift && begin < end && c->cfg.rope.shift == NULL) kvc__rope_table(c, begin - end);
    for (i = c->seq_lo[seq]; i < c->seq_hi[seq]; ++i) {
        int32_t pos;
        if (!kvc__cell_has(c, i, seq)) continue;
        pos = *kvc__cell_pos(c, i);
        if (pos >= begin && pos < end) {
            kvc__cell_del(c, i, seq);
        } else if (shift && pos >= end && begin < end) {
            kvc__rope_cell(c, i, pos, pos - (end - begin));
            *kvc__cell_pos(c, i) = pos - (end - begin);
            kvc__cells_changed(c, i, i + 1);
        }
    }
    kvc__seq_bounds(c, seq);
    return KVC_OK;
}

KVCDEF kvc_result kvc_seq_remove(kvc_cache *c, int32_t seq, int32_t begin, int32_t end) {
    KVC__POOL_LOCKED(c, c->pool, kvc__owned(c, 0) != KVC_OK ? KVC_ERR_OWNED : kvc__seq_remove_held(c, seq, begin, end));
}

static kvc_result kvc__seq_keep_held(kvc_cache *c, int32_t seq) {
    int32_t i, s;
    kvc_result r;
    if (c == NULL) return KVC_ERR_NULL;
    if (kvc__is_recurrent(c)) return kvc__state_seq_op(c, seq, 1);
    if ((r = kvc__check_seq(c, seq)) != KVC_OK) return r;
    if (kvc__batch_open(c)) return KVC_ERR_STATE;
    for (i = 0; i < c->capacity; ++i)
        for (s = 0; s < c->cfg.max_seqs; ++s)
            if (s != seq) kvc__cell_del(c, i, s);
    kvc__all_bounds(c);
    return KVC_OK;
}

KVCDEF kvc_result kvc_seq_keep(kvc_cache *c, int32_t seq) {
    KVC__POOL_LOCKED(c, c->pool, kvc__owned(c, 0) != KVC_OK ? KVC_ERR_OWNED : kvc__seq_keep_held(c, seq));
}

KVCDEF kvc_result kvc_seq_pos_range(const kvc_cache *c, int32_t seq, int32_t *min_pos, int32_t *max_pos) {
    int32_t i, lo = -1, hi = -1;
    kvc_result r;
    if (c == NULL || min_pos == NULL || max_pos == NULL) return KVC_ERR_NULL;
    if (kvc__is_recurrent(c)) { /* the tokens its state has consumed */
        if (seq < 0 || seq >= c->cfg.max_seqs) return KVC_ERR_RANGE;
        *min_pos = c->state_off[seq] > 0 ? 0 : -1;
        *max_pos = c->state_off[seq] - 1;
        return KVC_OK;
    }
    if ((r = kvc__check_seq(c, seq)) != KVC_OK) return r;
    for (i = c->seq_lo[seq]; i < c->seq_hi[seq]; ++i)
        if (kvc__cell_has(c, i, seq)) {
            int32_t p = *kvc__cell_pos(c, i);
            if (lo < 0 || p < lo) lo = p;
            if (p > hi) hi = p;
        }
    *min_pos = lo;
    *max_pos = hi;
    return KVC_OK;
}

KVCDEF kvc_result kvc_seq_can_resume(const kvc_cache *c, int32_t seq, int32_t pos, int *can_resume) {
    int32_t lo, hi;
    kvc_result r;
    if (c == NULL || can_resume == NULL) return KVC_ERR_NULL;
    if ((r = kvc_seq_pos_range(c, seq, &lo, &hi)) != KVC_OK) return r;
    if (pos < 0) return KVC_ERR_RANGE;
    if (c->cfg.window == 0) *can_resume = 1;
    else *can_resume = hi >= 0 && KVC__MAX(0, (int64_t)pos - c->cfg.window + 1) >= lo && pos <= (int64_t)hi + 1;
    return KVC_OK;
}

/* ---- Layer 3c: the RECURRENT kind -----------------------------------------------------
   A state pool's page is one sequence's state of every layer (Layer 1b: the K row of
   its only cell). Sequence s's state is page state_page[s] after state_off[s] tokens;
   KVC__NO_PAGE means all zeros (nothing consumed since create or clear). A batch makes
   each of its sequences' pages private -- a fresh zeroed page, or a copy of the page a
   snapshot or checkpoint shares -- so that the engine updates the states in place. A
   state cannot be rewound: it goes back only to checkpoints and snapshots (Layer 4b). */

static float *kvc__state_at(const kvc_pool *p, uint32_t page, int32_t layer) {
    return (float *)(void *)kvc__k_at(p, layer, page, 0);
}

static void kvc__state_zero(kvc_pool *p, uint32_t page) {
    int32_t l;
    kvc__page_event(p, KVC_PAGE_ZERO, page, 0, 1, 0, 0);
    for (l = 0; l < p->cfg.n_layers && !p->external; ++l) {
        memset(kvc__k_at(p, l, page, 0), 0, p->k_row);
        memset(kvc__v_at(p, l, page, 0), 0, p->v_row);
    }
}

/* 1 if sequence s needs a page before it can be written: it has none, or shares it */
static int32_t kvc__state_need(const kvc_cache *c, int32_t s) {
    uint32_t pg = c->state_page[s];
    return pg == KVC__NO_PAGE || c->pool->refcount[pg] > 1;
}

static void kvc__state_own(kvc_cache *c, int32_t s) {
    kvc_pool *p = c->pool;
    uint32_t pg = c->state_page[s], fresh;
    if (!kvc__state_need(c, s)) return;
    fresh = kvc__page_acquire(p);
    if (pg == KVC__NO_PAGE) {
        kvc__state_zero(p, fresh);
    } else {
        kvc__page_copy_cells(p, fresh, pg, 0, 1);
        kvc__page_release(p, pg);
    }
    c->state_page[s] = fresh;
}

static void kvc__states_release(kvc_cache *c) {
    int32_t s;
    if (!kvc__is_recurrent(c)) return;
    for (s = 0; s < c->cfg.max_seqs; ++s) {
        if (c->state_page[s] != KVC__NO_PAGE) kvc__page_release(c->pool, c->state_page[s]);
        c->state_page[s] = KVC__NO_PAGE;
        c->state_off[s] = c->batch_has[s] = 0;
    }
    c->offset = c->batch_begin = c->batch_pending = 0;
    c->states_open = 0;
}

/* The batch is open: the engine's kvc_state calls count as its puts. */
static void kvc__states_opened(kvc_cache *c) {
    c->batch_pending = c->pool->cfg.n_layers;
    memset(c->batch_put, 0, (size_t)c->pool->cfg.n_layers);
    c->states_open = 1;
}

/* kvc_begin on sequence 0; c->pend holds the checkpoints the batch named. */
static kvc_result kvc__recurrent_begin(kvc_cache *c, int32_t n_tokens) {
    kvc_pool *p = c->pool;
    int32_t i, end = c->state_off[0] + n_tokens, inside = 0;
    for (i = 0; i < c->n_pend; ++i) inside += c->pend[i]->to < end;
    /* a reserve's start checkpoint shares the live state, which the batch then copies;
       its checkpoints more than R before the batch's end go first */
    if (!kvc__reclaim(p, kvc__recurrent_net(c, n_tokens, inside))) return KVC_ERR_FULL;
    kvc__ckpt_prune_at(c, end);
    if (c->start != NULL) { /* the state at the batch's start, as a reserve checkpoint */
        int32_t k = kvc__ckpt_find(c, c->state_off[0]);
        if (k >= 0) {
            c->ckpt[k]->ckflags |= KVC__CK_RESERVE;
            kvc__snapshot_drop(c->start);
        } else {
            c->start->pages[0] = c->state_page[0];
            c->start->n_pages = 1;
            kvc__page_retain(p, c->start->pages[0]);
            kvc__ckpt_push(c, c->start);
        }
        c->start = NULL;
    }
    kvc__state_own(c, 0);
    for (i = 0; i < c->n_pend; ++i) /* the engine hands these over while it scans */
        if (c->pend[i]->to < end) {
            c->pend[i]->pages[0] = kvc__page_acquire(p);
            c->pend[i]->n_pages = 1;
        }
    memset(c->pend_done, 0, (size_t)c->n_pend * (size_t)p->cfg.n_layers);
    memset(c->batch_has, 0, sizeof(int32_t) * (size_t)c->cfg.max_seqs);
    c->batch_has[0] = n_tokens;
    c->batch_begin = c->state_off[0];
    c->state_off[0] = c->offset = end;
    c->gen++; /* contents added or replaced (kvc_prefix checks) */
    kvc__ckpt_prune(c); /* reserve checkpoints older than R before the new offset go */
    kvc__states_opened(c);
    return KVC_OK;
}

/* kvc_begin_batch: each sequence continues at its own offset (pos must say so). */
static kvc_result kvc__recurrent_begin_batch(kvc_cache *c, const kvc_batch *b) {
    int32_t i, s, need = 0;
    if (b->n_tokens < 1) return KVC_ERR_INVALID;
    if (b->pos == NULL || b->seq == NULL) return KVC_ERR_NULL;
    kvc__settle(c);
    for (i = 0; i < b->n_tokens; ++i)
        if (b->seq[i] < 0 || b->seq[i] >= c->cfg.max_seqs) return KVC_ERR_RANGE;
    memset(c->batch_has, 0, sizeof(int32_t) * (size_t)c->cfg.max_seqs);
    for (i = 0; i < b->n_tokens; ++i) { /* consecutive positions from where each sequence is */
        s = b->seq[i];
        if ((int64_t)b->pos[i] != (int64_t)c->state_off[s] + c->batch_has[s] || b->pos[i] == INT32_MAX) {
            memset(c->batch_has, 0, sizeof(int32_t) * (size_t)c->cfg.max_seqs);
            return KVC_ERR_RANGE;
        }
        c->batch_has[s]++;
    }
    for (s = 0; s < c->cfg.max_seqs; ++s) need += c->batch_has[s] > 0 && kvc__state_need(c, s);
    if (!kvc__reclaim(c->pool, need)) {
        memset(c->batch_has, 0, sizeof(int32_t) * (size_t)c->cfg.max_seqs);
        return KVC_ERR_FULL;
    }
    for (s = 0; s < c->cfg.max_seqs; ++s)
        if (c->batch_has[s] > 0) {
            kvc__state_own(c, s);
            c->state_off[s] += c->batch_has[s];
        }
    c->batch_begin = c->state_off[0] - c->batch_has[0];
    c->offset = c->state_off[0];
    c->gen++; /* contents added or replaced (kvc_prefix checks) */
    kvc__states_opened(c);
    return KVC_OK;
}

KVCDEF kvc_result kvc_state(kvc_cache *cache, int32_t seq, int32_t layer, float **state) {
    if (cache == NULL || state == NULL) return KVC_ERR_NULL;
    if (!kvc__is_recurrent(cache)) return KVC_ERR_UNSUPPORTED;
    if (seq < 0 || seq >= cache->cfg.max_seqs || layer < 0 || layer >= cache->pool->cfg.n_layers)
        return KVC_ERR_RANGE;
    if (cache->pool->external) return KVC_ERR_UNSUPPORTED; /* the states live in a device backend */
    if (!cache->states_open || cache->batch_has[seq] == 0) return KVC_ERR_STATE;
    if (!cache->batch_put[layer]) {
        cache->batch_put[layer] = 1;
        cache->batch_pending--;
    }
    *state = kvc__state_at(cache->pool, cache->state_page[seq], layer);
    return KVC_OK;
}

KVCDEF kvc_result kvc_state_read(const kvc_cache *cache, int32_t seq, int32_t layer, const float **state) {
    if (cache == NULL || state == NULL) return KVC_ERR_NULL;
    if (!kvc__is_recurrent(cache)) return KVC_ERR_UNSUPPORTED;
    if (seq < 0 || seq >= cache->cfg.max_seqs || layer < 0 || layer >= cache->pool->cfg.n_layers)
        return KVC_ERR_RANGE;
    if (cache->pool->external) return KVC_ERR_UNSUPPORTED; /* the states live in a device backend */
    *state = cache->state_page[seq] == KVC__NO_PAGE ? NULL : kvc__state_at(cache->pool, cache->state_page[seq], layer);
    return KVC_OK;
}

KVCDEF kvc_result kvc_state_checkpoint(kvc_cache *cache, int32_t layer, int32_t at, const float *state) {
    int32_t i;
    kvc_pool *p;
    if (cache == NULL || state == NULL) return KVC_ERR_NULL;
    if (!kvc__is_recurrent(cache)) return KVC_ERR_UNSUPPORTED;
    p = cache->pool;
    if (layer < 0 || layer >= p->cfg.n_layers) return KVC_ERR_RANGE;
    if (p->external) return KVC_ERR_UNSUPPORTED; /* the states live in a device backend */
    if (!cache->states_open || cache->batch_has[0] == 0) return KVC_ERR_STATE;
    if (at <= cache->batch_begin || at > cache->offset) return KVC_ERR_RANGE; /* not inside the batch */
    for (i = 0; i < cache->n_pend && cache->pend[i]->to != at; ++i) {}
    if (i == cache->n_pend) return KVC_ERR_NOT_FOUND; /* inside, but not asked for */
    if (at == cache->offset) return KVC_OK;     /* the batch's end: taken from the live state */
    memcpy(kvc__state_at(p, cache->pend[i]->pages[0], layer), state, (size_t)p->cfg.head_dim_k * sizeof(float));
    cache->pend_done[(size_t)i * (size_t)p->cfg.n_layers + (size_t)layer] = 1;
    return KVC_OK;
}

/* ---- Layer 4: snapshots ------------------------------------------------------------- */

static kvc_snapshot *kvc__snapshot_alloc(kvc_pool *p, int32_t n_pages, int counted) {
    kvc_snapshot *s = (kvc_snapshot *)kvc__alloc(p, sizeof(kvc_snapshot) + sizeof(uint32_t) * (size_t)KVC__MAX(n_pages, 1));
    if (s == NULL) return NULL;
    memset(s, 0, sizeof(*s));
    s->pool = p;
    s->pages = (uint32_t *)(s + 1);
    s->n_pages = n_pages;
    s->counted = counted;
    p->live_snapshots += counted;
    return s;
}

/* Free the struct only; the caller has dealt with the page references. */
static void kvc__snapshot_drop(kvc_snapshot *s) {
    s->pool->live_snapshots -= s->counted;
    kvc__free(s->pool, s);
}

static void kvc__snapshot_release(kvc_snapshot *s) {
    while (s != NULL) {
        kvc_snapshot *next = s->carried;
        int32_t i;
        for (i = 0; i < s->n_pages; ++i) kvc__page_release(s->pool, s->pages[i]);
        kvc__snapshot_drop(s);
        s = next;
    }
}

/* A snapshot restores into any cache of its pool with the same kind and window (the
   MLX runner's snapshots are not tied to the cache that took them either). */
static kvc_result kvc__check_snapshot(const kvc_cache *c, const kvc_snapshot *s) {
    return (s->pool == c->pool && s->kind == c->cfg.kind && s->window == c->cfg.window &&
            s->sinks == c->cfg.sinks) ? KVC_OK : KVC_ERR_FOREIGN;
}

static int32_t kvc__ckpt_find(const kvc_cache *c, int32_t at);
static kvc_snapshot *kvc__snapshot_clone(const kvc_snapshot *src, int counted);
static void kvc__rotating_fill(const kvc_cache *c, int32_t at, kvc_snapshot *s);
static kvc_result kvc__ckpt_chain(const kvc_cache *src, int32_t before, kvc_snapshot **chain);
static kvc_result kvc__chain_clone(const kvc_snapshot *first, int32_t max_to, kvc_snapshot **chain);
static void kvc__restore_recurrent(kvc_cache *c, const kvc_snapshot *s);
static void kvc__ckpt_install(kvc_cache *c, kvc_snapshot *chain);

static kvc_result kvc__snapshot_take_at_held(kvc_cache *cache, int32_t from, int32_t at, kvc_snapshot **out) {
    kvc_snapshot *s;
    int32_t i, first = 0, n, pc, k = -1;
    kvc_result r;
    if (cache == NULL || out == NULL) return KVC_ERR_NULL;
    if (cache->cfg.kind == KVC_KIND_CAUSAL) return KVC_ERR_UNSUPPORTED; /* kvc_seq_snapshot */
    if (kvc__batch_open(cache)) return KVC_ERR_STATE;
    if (at < 0 || at > cache->offset) return KVC_ERR_RANGE;
    kvc__settle(cache);
    if (at <= from || at == 0) { *out = NULL; return KVC_OK; } /* nothing to hold */
    pc = cache->pool->page_cells;
    if (cache->cfg.kind == KVC_KIND_FULL) {
        from = KVC__MAX(from, 0);
        first = from / pc;
        n = (at - 1) / pc - first + 1;
    } else if (at == cache->offset) { /* the whole window, or the live state */
        n = kvc__is_recurrent(cache) ? 1 : cache->n_pages;
    } else if (cache->cfg.kind == KVC_KIND_ROTATING && (at > cache->batch_begin || !kvc__wrapped(cache) ||
                                                        kvc__reserve_holds(cache, cache->first_lpage, at))) {
        n = cache->n_pages; /* inside the last batch, nothing released yet, or in the reserve: held */
    } else if ((k = kvc__ckpt_find(cache, at)) >= 0) {
        n = cache->ckpt[k]->n_pages;
    } else {
        return KVC_ERR_UNREACHABLE; /* the result a rewind there gives (kvc_cache_can_rewind) */
    }
    s = k >= 0 ? kvc__snapshot_clone(cache->ckpt[k], 1) : kvc__snapshot_alloc(cache->pool, n, 1);
    if (s == NULL) return KVC_ERR_NO_MEMORY;
    /* the checkpoints up to `at`, the one at `at` too: a restore to `at` keeps it, as a
       rewind to `at` does */
    if (kvc__has_ckpts(cache) && (r = kvc__ckpt_chain(cache, at < INT32_MAX ? at + 1 : at, &s->carried)) != KVC_OK) {
        if (k < 0) s->n_pages = 0; /* a fresh one holds no page yet (a clone holds its own) */
        kvc__snapshot_release(s);
        return r;
    }
    s->cache_id = cache->id;
    s->kind = cache->cfg.kind;
    s->window = cache->cfg.window;
    s->sinks = cache->cfg.sinks;
    s->from = kvc__is_recurrent(cache) ? at : from;
    if (k >= 0) { *out = s; return KVC_OK; }
    s->to = at;
    if (cache->cfg.kind == KVC_KIND_ROTATING) {
        kvc__rotating_fill(cache, at, s);
    } else if (kvc__is_recurrent(cache)) {
        s->pages[0] = cache->state_page[0];
        kvc__page_retain(cache->pool, s->pages[0]);
    } else {
        s->first_lpage = first;
        s->batch_begin = cache->batch_begin;
        for (i = 0; i < n; ++i) {
            s->pages[i] = cache->pages[first + i];
            kvc__page_retain(cache->pool, s->pages[i]);
        }
    }
    *out = s;
    return KVC_OK;
}

KVCDEF kvc_result kvc_snapshot_take(kvc_cache *cache, int32_t from, int32_t at, kvc_snapshot **out) {
    if (cache == NULL || out == NULL) return KVC_ERR_NULL;
    if (at == KVC_POS_END) at = cache->offset;
    KVC__POOL_LOCKED(cache, cache->pool, kvc__snapshot_take_at_held(cache, from, at, out));
}

static kvc_result kvc__snapshot_free_held(kvc_snapshot *snap) {
    kvc__snapshot_release(snap);
    return KVC_OK;
}

KVCDEF kvc_result kvc_snapshot_free(kvc_snapshot *snap) {
    KVC__POOL_LOCKED(snap, snap->pool, kvc__snapshot_free_held(snap));
}

KVCDEF kvc_result kvc_snapshot_info_get(const kvc_snapshot *snap, kvc_snapshot_info *info) {
    if (snap == NULL || info == NULL) return KVC_ERR_NULL;
    info->from = snap->from;
    info->to = snap->to;
    info->n_pages = snap->n_pages;
    info->bytes = (size_t)snap->n_pages * snap->pool->page_bytes;
    return KVC_OK;
}

/* FULL: keep the cache's tokens [0, from), take [from, target) from the snapshot.
   The page holding `from` mid-page is the only one that may need a copy. */
static kvc_result kvc__restore_full(kvc_cache *c, const kvc_snapshot *s, int32_t target) {
    kvc_pool *p = c->pool;
    int32_t pc = p->page_cells, keep = s->from / pc, cut = s->from % pc, idx, freed = 0, lp, last;
    int need_copy;
    uint32_t boundary = KVC__NO_PAGE;
    if (target <= s->from) { kvc__rewind(c, target); c->gen++; return KVC_OK; } /* a restore: a change */
    c->tail_hi = KVC__MIN(c->tail_hi, s->from); /* the snapshot's tokens: as stored */
    need_copy = cut != 0 && c->pages[keep] != s->pages[0];
    for (idx = keep + 1; idx < c->n_pages; ++idx) freed += p->refcount[c->pages[idx]] == 1;
    if (!cut && keep < c->n_pages) freed += p->refcount[c->pages[keep]] == 1;
    if (need_copy && !kvc__reclaim(p, 1 - freed)) return KVC_ERR_FULL;
    /* release the cache's pages after the boundary, then build the boundary page */
    while (c->n_pages > keep + (cut ? 1 : 0)) kvc__page_release(p, c->pages[--c->n_pages]);
    if (need_copy) {
        boundary = kvc__page_acquire(p);
        kvc__page_copy_cells(p, boundary, c->pages[keep], 0, cut);
        kvc__page_copy_cells(p, boundary, s->pages[0], cut, KVC__MIN(pc, target - keep * pc));
        kvc__page_release(p, c->pages[keep]);
        c->pages[keep] = boundary;
    }
    last = (target - 1) / pc;
    for (lp = keep + (cut ? 1 : 0); lp <= last; ++lp) {
        uint32_t page = s->pages[lp - s->first_lpage];
        kvc__page_retain(p, page);
        c->pages[c->n_pages++] = page;
    }
    c->offset = target;
    c->gen++; /* contents added or replaced (kvc_prefix checks) */
    c->batch_begin = target - 1;
    c->batch_pending = 0;
    return KVC_OK;
}

/* ROTATING: the snapshot's window replaces the cache's, then clamps to target. */
static void kvc__restore_rotating(kvc_cache *c, const kvc_snapshot *s, int32_t target) {
    int32_t i;
    for (i = 0; i < s->n_pages; ++i) kvc__page_retain(c->pool, s->pages[i]);
    for (i = 0; i < c->n_pages; ++i) kvc__page_release(c->pool, c->pages[i]);
    memcpy(c->pages, s->pages, sizeof(uint32_t) * (size_t)s->n_pages);
    c->n_pages = s->n_pages;
    c->first_lpage = s->first_lpage;
    c->tail_lo = c->tail_hi = 0; /* the snapshot's tokens: as stored */
    c->offset = s->to;
    c->batch_begin = s->batch_begin;
    c->batch_pending = 0;
    if (target < s->to) kvc__rewind(c, target);
}

/* ROTATING, RECURRENT: a checked restore from a snapshot with its carried checkpoints
   already copied (chain); cannot fail. */
static void kvc__restore_apply(kvc_cache *cache, const kvc_snapshot *snap, int32_t target, kvc_snapshot *chain) {
    kvc__settle(cache);
    kvc__pend_drop(cache);
    if (kvc__is_recurrent(cache)) kvc__restore_recurrent(cache, snap);
    else kvc__restore_rotating(cache, snap, target);
    kvc__ckpt_install(cache, chain);
    cache->gen++; /* a snapshot's contents (a checkpoint of the cache's own: a rewind, no change) */
}

static kvc_result kvc__restore_held(kvc_cache *cache, const kvc_snapshot *snap, int32_t target) {
    kvc_snapshot *chain = NULL;
    kvc_result r;
    if (cache == NULL) return KVC_ERR_NULL;
    if (cache->cfg.kind == KVC_KIND_CAUSAL) return KVC_ERR_UNSUPPORTED; /* kvc_seq_restore */
    if (snap != NULL && kvc__check_snapshot(cache, snap) != KVC_OK) return KVC_ERR_FOREIGN;
    if (kvc__batch_open(cache)) return KVC_ERR_STATE; /* kvc_cancel first */
    if (target < 0) return KVC_ERR_UNREACHABLE;
    if (snap == NULL) {
        if (!kvc__reachable(cache, target)) return KVC_ERR_UNREACHABLE;
        if (cache->cfg.kind == KVC_KIND_ROTATING && target == cache->offset) return KVC_OK; /* as it is */
        kvc__rewind_any(cache, target);
        return KVC_OK;
    }
    if (target > snap->to) return KVC_ERR_UNREACHABLE;
    if (cache->cfg.kind == KVC_KIND_FULL) {
        if (cache->offset < snap->from) return KVC_ERR_UNREACHABLE;
        if (target > 0 && kvc__page_table_reserve(cache, (target - 1) / cache->pool->page_cells + 1) != KVC_OK)
            return KVC_ERR_NO_MEMORY;
        return kvc__restore_full(cache, snap, target);
    }
    if (target < snap->to && (kvc__is_recurrent(cache) || snap->to > cache->cfg.window ||
                              snap->first_lpage > cache->n_sink_pages) &&
        !kvc__reserve_holds(cache, snap->first_lpage, target))
        return KVC_ERR_UNREACHABLE; /* a state, or a wrapped window, is only what it is */
    if (!kvc__is_recurrent(cache) && kvc__page_table_reserve(cache, kvc__chain_pages(snap)) != KVC_OK)
        return KVC_ERR_NO_MEMORY;
    /* the snapshot's checkpoints come with it: copied first, so a failure changes nothing */
    if ((r = kvc__chain_clone(snap->carried, target, &chain)) != KVC_OK) return r;
    kvc__restore_apply(cache, snap, target, chain);
    return KVC_OK;
}

KVCDEF kvc_result kvc_cache_restore(kvc_cache *cache, const kvc_snapshot *snap, int32_t target) {
    KVC__POOL_LOCKED(cache, cache->pool, kvc__owned(cache, 0) != KVC_OK ? KVC_ERR_OWNED : kvc__restore_held(cache, snap, target));
}

static kvc_result kvc__snapshot_merge_held(kvc_cache *cache, kvc_snapshot *parent, kvc_snapshot *child,
                                     kvc_snapshot **out) {
    kvc_pool *p;
    kvc_snapshot *m;
    int32_t pc, cut, shared, n, fresh_pages;
    if (cache == NULL || out == NULL) return KVC_ERR_NULL;
    if (cache->cfg.kind == KVC_KIND_CAUSAL) return KVC_ERR_UNSUPPORTED;
    if (parent != NULL && kvc__check_snapshot(cache, parent) != KVC_OK) return KVC_ERR_FOREIGN;
    if (child != NULL && kvc__check_snapshot(cache, child) != KVC_OK) return KVC_ERR_FOREIGN;
    if (parent == child && parent != NULL) return KVC_ERR_INVALID;
    if (cache->cfg.kind != KVC_KIND_FULL) { /* the child holds the whole window or state */
        kvc_snapshot_free(parent);
        *out = child;
        return KVC_OK;
    }
    if (parent == NULL || child == NULL) {
        kvc_snapshot_free(parent);
        kvc_snapshot_free(child);
        *out = NULL;
        return KVC_OK;
    }
    if (parent->to != child->from) return KVC_ERR_INVALID;
    p = cache->pool;
    pc = p->page_cells;
    cut = parent->to % pc;
    shared = cut != 0; /* parent's last page and child's first page are the same logical page */
    n = parent->n_pages + child->n_pages - shared;
    fresh_pages = shared && parent->pages[parent->n_pages - 1] != child->pages[0];
    if (!kvc__can_reclaim(p, fresh_pages)) return KVC_ERR_FULL; /* evicting prefix-tree entries if need be */
    m = kvc__snapshot_alloc(p, n, 1);
    if (m == NULL) return KVC_ERR_NO_MEMORY;
    kvc__reclaim(p, fresh_pages); /* checked above: frees enough pages */
    m->cache_id = parent->cache_id;
    m->kind = parent->kind;
    m->window = parent->window;
    m->sinks = parent->sinks;
    m->from = parent->from;
    m->to = child->to;
    m->first_lpage = parent->first_lpage;
    memcpy(m->pages, parent->pages, sizeof(uint32_t) * (size_t)parent->n_pages);
    memcpy(m->pages + parent->n_pages - shared, child->pages, sizeof(uint32_t) * (size_t)child->n_pages);
    if (shared) { /* one page where two were: combine their halves unless they are one page */
        uint32_t a = parent->pages[parent->n_pages - 1], b = child->pages[0];
        if (a != b) {
            uint32_t fresh = kvc__page_acquire(p);
            int32_t end = (int32_t)KVC__MIN((int64_t)pc, (int64_t)child->to - (int64_t)(child->from / pc) * pc);
            kvc__page_copy_cells(p, fresh, a, 0, cut);
            kvc__page_copy_cells(p, fresh, b, cut, end);
            kvc__page_release(p, a);
            m->pages[parent->n_pages - 1] = fresh;
        }
        kvc__page_release(p, b);
    }
    kvc__snapshot_drop(parent);
    kvc__snapshot_drop(child);
    *out = m;
    return KVC_OK;
}

KVCDEF kvc_result kvc_snapshot_merge(kvc_cache *cache, kvc_snapshot *parent, kvc_snapshot *child,
                                     kvc_snapshot **out) {
    kvc_result r;
    const kvc_pool *lp;
    if (cache == NULL) return kvc__snapshot_merge_held(cache, parent, child, out);
    lp = cache->pool;
    kvc__pool_lock(lp);
    r = kvc__snapshot_merge_held(cache, parent, child, out);
    kvc__pool_unlock(lp);
    return r;
}

static kvc_result kvc__snapshot_split_held(kvc_cache *cache, kvc_snapshot *snap, int32_t at,
                                     kvc_snapshot **parent, kvc_snapshot **child) {
    kvc_pool *p;
    kvc_snapshot *a, *b;
    int32_t pc, na, first_b;
    if (cache == NULL || parent == NULL || child == NULL) return KVC_ERR_NULL;
    if (cache->cfg.kind == KVC_KIND_CAUSAL) return KVC_ERR_UNSUPPORTED;
    if (snap != NULL && kvc__check_snapshot(cache, snap) != KVC_OK) return KVC_ERR_FOREIGN;
    if (snap == NULL) { *parent = *child = NULL; return KVC_OK; }
    if (cache->cfg.kind != KVC_KIND_FULL || at <= snap->from) { /* cannot split a state */
        *parent = NULL;
        *child = snap;
        return KVC_OK;
    }
    if (at >= snap->to) {
        *parent = snap;
        *child = NULL;
        return KVC_OK;
    }
    p = cache->pool;
    pc = p->page_cells;
    na = (at - 1) / pc - snap->first_lpage + 1;  /* pages holding [from, at) */
    first_b = at / pc - snap->first_lpage;       /* index of the page holding `at` */
    a = kvc__snapshot_alloc(p, na, 1);
    if (a == NULL) return KVC_ERR_NO_MEMORY;
    b = kvc__snapshot_alloc(p, snap->n_pages - first_b, 1);
    if (b == NULL) { kvc__snapshot_drop(a); return KVC_ERR_NO_MEMORY; }
    a->cache_id = b->cache_id = snap->cache_id;
    a->kind = b->kind = snap->kind;
    a->window = b->window = snap->window;
    a->sinks = b->sinks = snap->sinks;
    a->from = snap->from;
    a->to = b->from = at;
    b->to = snap->to;
    a->first_lpage = snap->first_lpage;
    b->first_lpage = snap->first_lpage + first_b;
    memcpy(a->pages, snap->pages, sizeof(uint32_t) * (size_t)na);
    memcpy(b->pages, snap->pages + first_b, sizeof(uint32_t) * (size_t)b->n_pages);
    if (first_b < na) kvc__page_retain(p, snap->pages[first_b]); /* both halves hold it */
    kvc__snapshot_drop(snap);
    *parent = a;
    *child = b;
    return KVC_OK;
}

KVCDEF kvc_result kvc_snapshot_split(kvc_cache *cache, kvc_snapshot *snap, int32_t at,
                                     kvc_snapshot **parent, kvc_snapshot **child) {
    kvc_result r;
    const kvc_pool *lp;
    if (cache == NULL) return kvc__snapshot_split_held(cache, snap, at, parent, child);
    lp = cache->pool;
    kvc__pool_lock(lp);
    r = kvc__snapshot_split_held(cache, snap, at, parent, child);
    kvc__pool_unlock(lp);
    return r;
}

/* CAUSAL: one sequence's cells, packed into pages of its own. */
static kvc_result kvc__seq_snapshot_held(kvc_cache *c, int32_t seq, kvc_snapshot **out) {
    kvc_snapshot *s;
    int32_t i, n = 0, pages, lo = -1, hi = -1;
    kvc_result r;
    if (c == NULL || out == NULL) return KVC_ERR_NULL;
    if ((r = kvc__check_seq(c, seq)) != KVC_OK) return r;
    if (kvc__batch_open(c)) return KVC_ERR_STATE;
    for (i = c->seq_lo[seq]; i < c->seq_hi[seq]; ++i) n += kvc__cell_has(c, i, seq);
    if (n == 0) return KVC_ERR_NOT_FOUND;
    pages = (int32_t)(((int64_t)n + c->pool->page_cells - 1) / c->pool->page_cells); /* pages of 2^31 cells */
    if (!kvc__can_reclaim(c->pool, pages)) return KVC_ERR_FULL; /* evicting prefix-tree entries if need be */
    s = kvc__snapshot_alloc(c->pool, pages, 1);
    if (s == NULL) return KVC_ERR_NO_MEMORY;
    kvc__reclaim(c->pool, pages); /* checked above: frees enough pages */
    for (i = 0; i < pages; ++i) s->pages[i] = kvc__page_acquire(c->pool);
    s->kind = KVC_KIND_CAUSAL;
    s->n_cells = n;
    n = 0;
    for (i = c->seq_lo[seq]; i < c->seq_hi[seq]; ++i) {
        int32_t p;
        if (!kvc__cell_has(c, i, seq)) continue;
        kvc__copy_cells(c->pool, s->pages, n++, c->pages, i, 1);
        p = *kvc__cell_pos(c, i);
        if (lo < 0 || p < lo) lo = p;
        hi = KVC__MAX(hi, p);
    }
    s->from = lo;
    s->to = hi + 1;
    *out = s;
    return KVC_OK;
}

KVCDEF kvc_result kvc_seq_snapshot(kvc_cache *c, int32_t seq, kvc_snapshot **out) {
    KVC__POOL_LOCKED(c, c->pool, kvc__seq_snapshot_held(c, seq, out));
}

static kvc_result kvc__seq_restore_held(kvc_cache *c, const kvc_snapshot *s, int32_t dst) {
    int32_t i, cell = 0, freed = 0;
    kvc_result r;
    if (c == NULL || s == NULL) return KVC_ERR_NULL;
    if ((r = kvc__check_seq(c, dst)) != KVC_OK) return r;
    if (s->pool != c->pool || s->kind != KVC_KIND_CAUSAL) return KVC_ERR_FOREIGN;
    if (kvc__batch_open(c)) return KVC_ERR_STATE;
    for (i = 0; i < c->capacity; ++i) freed += kvc__cell_only(c, i) == dst;
    if (c->capacity - c->n_used + freed < s->n_cells) return KVC_ERR_FULL;
    for (i = 0; i < c->capacity; ++i) kvc__cell_del(c, i, dst);
    for (i = 0; i < s->n_cells; ++i) {
        while (!kvc__cell_empty(c, cell)) cell++;
        kvc__copy_cells(c->pool, c->pages, cell, s->pages, i, 1);
        kvc__cell_add(c, cell, dst);
    }
    kvc__seq_bounds(c, dst);
    return KVC_OK;
}

KVCDEF kvc_result kvc_seq_restore(kvc_cache *c, const kvc_snapshot *s, int32_t dst) {
    KVC__POOL_LOCKED(c, c->pool, kvc__owned(c, 0) != KVC_OK ? KVC_ERR_OWNED : kvc__seq_restore_held(c, s, dst));
}

/* ---- Layer 4b: checkpoints --------------------------------------------------------------
   A state cannot be rewound and a wrapped window has dropped the keys it would need, so
   ROTATING and RECURRENT caches keep checkpoints: snapshots of their own, at offsets the
   engine named in kvc_begin (the latest max_ckpt of them). A checkpoint
   inside a batch is filled while the batch runs (RECURRENT: the engine hands each
   layer's state over; ROTATING: the window at that offset is still held when the batch
   ends) and kept once the batch has ended ("settled" at the next call that needs it, so
   that a state handed out by kvc_state may be written until then). Rewinds, trims and
   prefix reuse go back to checkpoints (and to 0); snapshots carry the checkpoints up to them.
   A RECURRENT reserve (cfg.reserve = R) adds checkpoints of its own: the state at a
   short batch's start (c->start, shared with the live state) and the batch's last R
   offsets (pending ones the engine fills). kvc__ckpt_prune keeps the latest max_ckpt
   named checkpoints and the reserve's within R of the offset. (A ROTATING reserve needs
   no checkpoints: kvc__dead_pages keeps R more tokens' pages.) */

static void kvc__snapshot_release(kvc_snapshot *s); /* pages, carried chain and struct */

static kvc_snapshot *kvc__snapshot_clone(const kvc_snapshot *src, int counted) {
    kvc_snapshot *s = kvc__snapshot_alloc(src->pool, src->n_pages, counted);
    int32_t i;
    if (s == NULL) return NULL;
    s->cache_id = src->cache_id;
    s->kind = src->kind;
    s->window = src->window;
    s->sinks = src->sinks;
    s->from = src->from;
    s->to = src->to;
    s->first_lpage = src->first_lpage;
    s->batch_begin = src->batch_begin;
    s->n_cells = src->n_cells;
    s->ckflags = src->ckflags;
    for (i = 0; i < src->n_pages; ++i) {
        s->pages[i] = src->pages[i];
        kvc__page_retain(src->pool, s->pages[i]);
    }
    return s;
}

/* Appends a checkpoint (the newest); kvc__ckpt_prune then applies the rule of what is kept. */
static void kvc__ckpt_push(kvc_cache *c, kvc_snapshot *s) {
    if (c->n_ckpt == c->cap_ckpt) kvc__ckpt_prune(c); /* (a chain from a cache of a larger reserve) */
    if (c->n_ckpt == c->cap_ckpt) { /* the oldest goes (without a reserve: the latest max_ckpt stay) */
        kvc__snapshot_release(c->ckpt[0]);
        memmove(c->ckpt, c->ckpt + 1, sizeof(kvc_snapshot *) * (size_t)(c->n_ckpt - 1));
        c->n_ckpt--;
    }
    c->ckpt[c->n_ckpt++] = s;
}

/* What a cache at `offset` keeps: the latest max_ckpt named checkpoints, and the
   reserve's at most cfg.reserve tokens before the offset (RECURRENT). */
static int kvc__ckpt_kept_at(const kvc_cache *c, const kvc_snapshot *k, int32_t later_named, int64_t offset) {
    return ((k->ckflags & KVC__CK_NAMED) && later_named < c->max_ckpt) ||
           ((k->ckflags & KVC__CK_RESERVE) && (int64_t)k->to >= offset - c->cfg.reserve);
}
static int kvc__ckpt_kept(const kvc_cache *c, const kvc_snapshot *k, int32_t later_named) {
    return kvc__ckpt_kept_at(c, k, later_named, c->offset);
}

/* The state pages kvc__recurrent_begin takes for n tokens with `inside` checkpoints
   inside the batch (sequence 0): a private live state (a copy when it is shared, also
   with the reserve's start checkpoint) and one per checkpoint, net of the pages that
   the reserve checkpoints it drops first (more than R before the batch's end) held. */
static int64_t kvc__recurrent_net(const kvc_cache *c, int32_t n, int32_t inside) {
    int32_t i, later = 0, freed = 0, live_refs = 0;
    uint32_t live = c->state_page[0];
    int own;
    for (i = c->n_ckpt - 1; i >= 0 && c->cfg.reserve > 0; --i) {
        const kvc_snapshot *k = c->ckpt[i];
        if (!kvc__ckpt_kept_at(c, k, later, (int64_t)c->offset + n) && k->n_pages == 1) {
            if (k->pages[0] == live) live_refs++; /* the live state is then less shared */
            else freed += c->pool->refcount[k->pages[0]] == 1;
        }
        later += (k->ckflags & KVC__CK_NAMED) != 0;
    }
    own = live == KVC__NO_PAGE || kvc__reserve_start(c, n) || c->pool->refcount[live] - live_refs > 1;
    return (int64_t)own + inside - freed;
}

static void kvc__ckpt_prune(kvc_cache *c) { kvc__ckpt_prune_at(c, c->offset); }

static void kvc__ckpt_prune_at(kvc_cache *c, int64_t offset) {
    int32_t i, n = 0, later = 0;
    for (i = c->n_ckpt - 1; i >= 0; --i) { /* newest first */
        kvc_snapshot *k = c->ckpt[i];
        int keep = kvc__ckpt_kept_at(c, k, later, offset);
        later += (k->ckflags & KVC__CK_NAMED) != 0;
        if (!keep) { kvc__snapshot_release(k); c->ckpt[i] = NULL; }
    }
    for (i = 0; i < c->n_ckpt; ++i)
        if (c->ckpt[i] != NULL) c->ckpt[n++] = c->ckpt[i];
    c->n_ckpt = n;
}

static int32_t kvc__ckpt_find(const kvc_cache *c, int32_t at) {
    int32_t i;
    for (i = 0; i < c->n_ckpt; ++i)
        if (c->ckpt[i]->to == at) return i;
    return -1;
}

/* Checkpoints after target belong to a history the cache is leaving. */
static void kvc__ckpt_drop_after(kvc_cache *c, int32_t target) {
    while (c->n_ckpt > 0 && c->ckpt[c->n_ckpt - 1]->to > target) kvc__snapshot_release(c->ckpt[--c->n_ckpt]);
}
static void kvc__ckpt_drop_all(kvc_cache *c) { kvc__ckpt_drop_after(c, -1); }

static void kvc__pend_drop(kvc_cache *c) {
    while (c->n_pend > 0) kvc__snapshot_release(c->pend[--c->n_pend]);
    if (c->start != NULL) kvc__snapshot_drop(c->start); /* no page yet */
    c->start = NULL;
}

/* RECURRENT with a reserve R: a batch of n tokens keeps the state at its start as a
   checkpoint when that start lies within R of the batch's end (and there is a state). */
static int kvc__reserve_start(const kvc_cache *c, int32_t n) {
    return kvc__is_recurrent(c) && c->cfg.reserve > 0 && n <= c->cfg.reserve && c->state_page[0] != KVC__NO_PAGE;
}

/* RECURRENT with a reserve R: the first offset of a batch of n tokens that is a reserve
   checkpoint (they run to the batch's end, exclusive); the end when there is none. */
static int32_t kvc__reserve_first(const kvc_cache *c, int32_t n) {
    int32_t e = c->offset + n;
    if (!kvc__is_recurrent(c) || c->cfg.reserve <= 0) return e;
    return (int32_t)KVC__MAX((int64_t)c->offset + 1, (int64_t)e - c->cfg.reserve);
}

/* The reserve checkpoints of a batch of n tokens that at[] (increasing) does not name. */
static int32_t kvc__reserve_extra(const kvc_cache *c, int32_t n, const int32_t *at, int32_t n_at) {
    int32_t t, i = 0, extra = 0, e = c->offset + n;
    for (t = kvc__reserve_first(c, n); t < e; ++t) {
        while (i < n_at && at[i] < t) ++i;
        extra += !(i < n_at && at[i] == t);
    }
    return extra;
}

static kvc_snapshot *kvc__pend_new(kvc_cache *c, int32_t cap, int32_t at, int flags) {
    kvc_snapshot *s = kvc__snapshot_alloc(c->pool, cap, 0);
    if (s == NULL) return NULL;
    s->n_pages = 0;
    s->cache_id = c->id;
    s->kind = c->cfg.kind;
    s->window = c->cfg.window;
    s->sinks = c->cfg.sinks;
    s->to = s->from = at;
    s->ckflags = flags;
    return s;
}

/* Structs for the checkpoints a batch names (RECURRENT with a reserve: and its reserve
   ones, merged in order), allocated before the batch changes anything. */
static kvc_result kvc__pend_alloc(kvc_cache *c, const int32_t *at, int32_t n_at, int32_t n_tokens) {
    int32_t i = 0, cap = 1, a = kvc__reserve_first(c, n_tokens), e = c->offset + n_tokens;
    if (c->cfg.kind == KVC_KIND_ROTATING) /* every page the window can hold after the batch */
        cap = (int32_t)KVC__MIN((int64_t)c->pool->max_pages,
                                (int64_t)c->n_pages + n_tokens / c->pool->page_cells + 2);
    if (kvc__reserve_start(c, n_tokens) &&
        (c->start = kvc__pend_new(c, 1, c->offset, KVC__CK_RESERVE)) == NULL)
        return KVC_ERR_NO_MEMORY;
    while (i < n_at || a < e) {
        kvc_snapshot *s;
        int32_t t;
        int flags = KVC__CK_NAMED;
        if (i < n_at && (a >= e || at[i] <= a)) {
            t = at[i++];
            if (a < e && t == a) { flags |= KVC__CK_RESERVE; a++; }
        } else {
            t = a++;
            flags = KVC__CK_RESERVE;
        }
        if ((s = kvc__pend_new(c, cap, t, flags)) == NULL) { kvc__pend_drop(c); return KVC_ERR_NO_MEMORY; }
        c->pend[c->n_pend++] = s;
    }
    return KVC_OK;
}

/* ROTATING: the window as it was after `at` tokens, from the pages the cache holds now
   (at lies in the last batch, or is the offset: every page that window needs is held). */
static void kvc__rotating_fill(const kvc_cache *c, int32_t at, kvc_snapshot *s) {
    int32_t i, last = at > 0 ? (at - 1) / c->pool->page_cells : -1;
    s->n_pages = 0;
    for (i = 0; i < c->n_pages && kvc__entry_lpage(c, i) <= last; ++i) {
        s->pages[s->n_pages++] = c->pages[i];
        kvc__page_retain(c->pool, c->pages[i]);
    }
    s->to = at;
    s->first_lpage = c->first_lpage;
    s->batch_begin = at == c->offset ? c->batch_begin : at - 1;
}

static void kvc__settle(kvc_cache *c) {
    int32_t i, l;
    if (kvc__batch_open(c)) return;
    c->states_open = 0;
    for (i = 0; i < c->n_pend; ++i) {
        kvc_snapshot *s = c->pend[i];
        int complete = 1;
        if (c->cfg.kind == KVC_KIND_ROTATING) {
            kvc__rotating_fill(c, s->to, s);
        } else if (s->to == c->offset) { /* the batch's end: share the live state */
            s->pages[0] = c->state_page[0];
            s->n_pages = 1;
            kvc__page_retain(c->pool, s->pages[0]);
        } else {
            for (l = 0; l < c->pool->cfg.n_layers; ++l)
                complete &= c->pend_done[(size_t)i * (size_t)c->pool->cfg.n_layers + (size_t)l];
        }
        if (complete) kvc__ckpt_push(c, s);
        else { /* a layer was never handed over: counted (kvc_memory_stats) */
            kvc__snapshot_release(s);
            c->ckpt_dropped++;
        }
    }
    if (c->n_pend > 0) kvc__ckpt_prune(c);
    c->n_pend = 0;
}

/* Whether the ended batch's checkpoint pend[i] will be kept when the batch settles. */
static int kvc__pend_complete(const kvc_cache *c, int32_t i) {
    int32_t l, done = 1;
    if (kvc__batch_open(c)) return 0;
    if (c->cfg.kind == KVC_KIND_ROTATING || c->pend[i]->to == c->offset) return 1;
    for (l = 0; l < c->pool->cfg.n_layers; ++l)
        done &= c->pend_done[(size_t)i * (size_t)c->pool->cfg.n_layers + (size_t)l];
    return done;
}

/* Whether checkpoint k (of c->ckpt, or an ended batch's kept one) is still kept once
   the ended batch has settled (kvc__ckpt_prune's rule over both lists). */
static int kvc__ckpt_stays(const kvc_cache *c, const kvc_snapshot *k) {
    int32_t i, later = 0;
    for (i = 0; i < c->n_ckpt; ++i) later += (c->ckpt[i]->ckflags & KVC__CK_NAMED) && c->ckpt[i]->to > k->to;
    for (i = 0; i < c->n_pend; ++i)
        later += (c->pend[i]->ckflags & KVC__CK_NAMED) && c->pend[i]->to > k->to && kvc__pend_complete(c, i);
    return kvc__ckpt_kept(c, k, later);
}

/* Whether a live rewind to target can succeed (a cache with no batch open). */
static int kvc__reachable(const kvc_cache *c, int32_t target) {
    int32_t i;
    if (target < 0 || target > c->offset) return 0;
    if (target == c->offset || c->cfg.kind == KVC_KIND_FULL) return 1;
    if (c->cfg.kind == KVC_KIND_CAUSAL) return 0;
    if (target == 0) return 1; /* clearing: always possible */
    if (c->cfg.kind == KVC_KIND_ROTATING && (!kvc__wrapped(c) || kvc__reserve_holds(c, c->first_lpage, target)))
        return 1;
    i = kvc__ckpt_find(c, target);
    if (i >= 0) return kvc__ckpt_stays(c, c->ckpt[i]); /* not one the ended batch pushes out */
    for (i = 0; i < c->n_pend; ++i) /* an ended batch's, not settled yet */
        if (c->pend[i]->to == target) return kvc__pend_complete(c, i) && kvc__ckpt_stays(c, c->pend[i]);
    return 0;
}

static void kvc__restore_rotating(kvc_cache *c, const kvc_snapshot *s, int32_t target);

/* Put sequence 0's state of a RECURRENT cache to the one snapshot s holds. */
static void kvc__restore_recurrent(kvc_cache *c, const kvc_snapshot *s) {
    kvc__page_retain(c->pool, s->pages[0]);
    if (c->state_page[0] != KVC__NO_PAGE) kvc__page_release(c->pool, c->state_page[0]);
    c->state_page[0] = s->pages[0];
    c->state_off[0] = c->offset = s->to;
    c->batch_begin = s->to > 0 ? s->to - 1 : 0;
    c->batch_pending = 0;
}

/* A live rewind that kvc__reachable allowed; cannot fail. */
static void kvc__rewind_any(kvc_cache *c, int32_t target) {
    int32_t i;
    kvc__settle(c);
    if (c->cfg.kind == KVC_KIND_FULL || (c->cfg.kind == KVC_KIND_ROTATING &&
                                         (!kvc__wrapped(c) || kvc__reserve_holds(c, c->first_lpage, target)))) {
        kvc__rewind(c, target); /* at the offset too: the window's anchor becomes offset - 1 */
    } else if (target == 0) { /* a state or a wrapped window: cleared (a tree's lease stays) */
        kvc__pend_drop(c);
        kvc__ckpt_drop_all(c);
        kvc__states_release(c);
        kvc__rewind(c, 0);
    } else if (target != c->offset) {
        i = kvc__ckpt_find(c, target);
        KVCACHE_ASSERT(i >= 0);
        if (c->cfg.kind == KVC_KIND_ROTATING) kvc__restore_rotating(c, c->ckpt[i], target);
        else kvc__restore_recurrent(c, c->ckpt[i]);
    }
    kvc__ckpt_drop_after(c, target);
}

/* Appends a clone of k to the chain ending at *tail; 0 when out of memory. */
static int kvc__chain_append(kvc_snapshot **head, kvc_snapshot **tail, const kvc_snapshot *k) {
    kvc_snapshot *c = kvc__snapshot_clone(k, 0);
    if (c == NULL) {
        kvc__snapshot_release(*head);
        *head = *tail = NULL;
        return 0;
    }
    if (*tail != NULL) (*tail)->carried = c;
    else *head = c;
    *tail = c;
    return 1;
}

/* Clones of src's checkpoints before `before` (all: INT32_MAX), oldest first; all or none. */
static kvc_result kvc__ckpt_chain(const kvc_cache *src, int32_t before, kvc_snapshot **chain) {
    kvc_snapshot *tail = NULL;
    int32_t i;
    *chain = NULL;
    for (i = 0; i < src->n_ckpt; ++i)
        if (src->ckpt[i]->to < before && !kvc__chain_append(chain, &tail, src->ckpt[i])) return KVC_ERR_NO_MEMORY;
    return KVC_OK;
}

/* Clones of a carried chain's snapshots at or before max_to; all or none. */
static kvc_result kvc__chain_clone(const kvc_snapshot *first, int32_t max_to, kvc_snapshot **chain) {
    kvc_snapshot *tail = NULL;
    *chain = NULL;
    for (; first != NULL; first = first->carried)
        if (first->to <= max_to && !kvc__chain_append(chain, &tail, first)) return KVC_ERR_NO_MEMORY;
    return KVC_OK;
}

/* The page-table entries a snapshot and the checkpoints it carries may bring back. */
static int32_t kvc__chain_pages(const kvc_snapshot *s) {
    int32_t n = 0;
    for (; s != NULL; s = s->carried) n = KVC__MAX(n, s->n_pages);
    return n;
}

/* The page-table room a cache keeps: its pages and those of every checkpoint it holds
   (FULL and ROTATING; a RECURRENT cache's states are not in the table). */
static int32_t kvc__pages_wanted(const kvc_cache *c) {
    int32_t n = c->n_pages, i;
    if (c->cfg.kind != KVC_KIND_ROTATING) return n;
    for (i = 0; i < c->n_ckpt; ++i) n = KVC__MAX(n, kvc__chain_pages(c->ckpt[i]));
    for (i = 0; i < c->n_pend; ++i) n = KVC__MAX(n, kvc__chain_pages(c->pend[i]));
    return n;
}

/* Replace c's checkpoints by a chain (taken over, not copied). */
static void kvc__ckpt_install(kvc_cache *c, kvc_snapshot *chain) {
    kvc__ckpt_drop_all(c);
    while (chain != NULL) {
        kvc_snapshot *next = chain->carried;
        chain->carried = NULL;
        kvc__ckpt_push(c, chain);
        chain = next;
    }
    kvc__ckpt_prune(c);
}

static kvc_result kvc__ckpt_clone_all(const kvc_cache *src, kvc_cache *dst) {
    kvc_snapshot *chain;
    kvc_result r;
    if (!kvc__has_ckpts(src)) return KVC_OK;
    if ((r = kvc__ckpt_chain(src, INT32_MAX, &chain)) != KVC_OK) return r;
    kvc__ckpt_install(dst, chain);
    return KVC_OK;
}

KVCDEF kvc_result kvc_cache_can_rewind(const kvc_cache *cache, int32_t target, int *can_rewind) {
    if (cache == NULL || can_rewind == NULL) return KVC_ERR_NULL;
    *can_rewind = !kvc__batch_open(cache) && kvc__reachable(cache, target);
    return KVC_OK;
}

KVCDEF kvc_result kvc_cache_checkpoints(const kvc_cache *cache, int32_t *at, int32_t max_at, int32_t *n_at) {
    int32_t i, n = 0;
    if (cache == NULL || n_at == NULL || (at == NULL && max_at > 0)) return KVC_ERR_NULL;
    if (max_at < 0) return KVC_ERR_INVALID;
    for (i = 0; i < cache->n_ckpt; ++i) /* settling drops some (the oldest named ones) */
        if (kvc__ckpt_stays(cache, cache->ckpt[i])) {
            if (n < max_at) at[n] = cache->ckpt[i]->to;
            n++;
        }
    for (i = 0; i < cache->n_pend; ++i)
        if (kvc__pend_complete(cache, i) && kvc__ckpt_stays(cache, cache->pend[i])) {
            if (n < max_at) at[n] = cache->pend[i]->to;
            n++;
        }
    *n_at = n;
    return n > max_at && at != NULL ? KVC_ERR_RANGE : KVC_OK;
}

KVCDEF kvc_result kvc_batch_checkpoints(const kvc_cache *cache, int32_t *at, int32_t max_at, int32_t *n_at) {
    int32_t i, n = 0;
    if (cache == NULL || n_at == NULL || (at == NULL && max_at > 0)) return KVC_ERR_NULL;
    if (max_at < 0) return KVC_ERR_INVALID;
    if (kvc__is_recurrent(cache)) {
        if (!cache->states_open || cache->batch_has[0] == 0) return KVC_ERR_STATE;
        for (i = 0; i < cache->n_pend; ++i) /* pend is increasing; its end comes from the live state */
            if (cache->pend[i]->to < cache->offset) {
                if (n < max_at) at[n] = cache->pend[i]->to;
                n++;
            }
    }
    *n_at = n;
    return n > max_at && at != NULL ? KVC_ERR_RANGE : KVC_OK;
}

/* ---- Layer 4c: model memories ------------------------------------------------------------
   One pool and one cache per layer group; the pools' budgets point to one shared
   kvc__budget, so every group's pages count against the memory's budget. Forks and
   memory snapshots share the pools (and the layer map) through kvc__mpools, which the
   last of them frees. Every call checks every group before it changes any. */

typedef struct kvc__mpools {
    kvc__budget budget;
    kvc_allocator alloc;
    kvc_lock_fn lock, unlock; /* the memory config's: every group's pool has the same */
    void *lock_user;
    int32_t refs, n_groups, n_layers;
    int32_t inside; /* memory calls under way (under the lock): they may change the groups */
    int32_t *layer_group, *group_layer; /* [n_layers] */
    kvc_pool *pool[KVC_MAX_GROUPS];
} kvc__mpools;

struct kvc_memory {
    kvc__mpools *mp;
    kvc_cache *cache[KVC_MAX_GROUPS];
};

struct kvc_memory_snapshot {
    kvc__mpools *mp;
    int32_t to;
    kvc_snapshot *snap[KVC_MAX_GROUPS]; /* NULL: the group had nothing to hold */
};

/* The memory's lock (its pools' lock) around a call; `unlock` is kept aside, since a
   call may free the kvc__mpools. */
typedef struct kvc__mlock {
    kvc_lock_fn unlock;
    void *user;
    kvc__mpools *mp; /* its `inside` count, or NULL */
} kvc__mlock;
static kvc__mlock kvc__memory_lock(const kvc__mpools *mp) {
    kvc__mlock k;
    k.unlock = mp->unlock;
    k.user = mp->lock_user;
    k.mp = (kvc__mpools *)mp;
    if (mp->lock != NULL) mp->lock(mp->lock_user);
    k.mp->inside++;
    return k;
}
static void kvc__memory_unlock(kvc__mlock k) {
    /* the call may have let go of the last reference: kvc__mpools_unref left the
       struct to us */
    if (k.mp != NULL && --k.mp->inside == 0 && k.mp->refs == 0) k.mp->alloc.free(k.mp, k.mp->alloc.user);
    if (k.unlock != NULL) k.unlock(k.user);
}

/* The rule for a memory's caches (kvc_memory_group): a memory of two or more groups
   keeps them in step, so what would change one group alone is refused unless a memory
   call does it; kvc_cache_destroy and kvc_cache_fork (a cache that would outlive the
   memory's pools) are refused for every memory. Checked under the pools' lock, which
   memory calls hold while `inside` is counted. */
static kvc_result kvc__owned(const kvc_cache *c, int always) {
    if (c == NULL || c->owner == NULL || c->owner->inside > 0) return KVC_OK;
    return always || c->owner->n_groups > 1 ? KVC_ERR_OWNED : KVC_OK;
}
/* KVC__POOL_LOCKED for the calls on a memory: under its pools' lock */
/* (kvc__memory_lock counts the call in `inside`: the memory's own changes to its groups
   pass kvc__owned) */
#define KVC__MEMORY_LOCKED(obj, mpools_of_obj, held_call)      \
    do {                                                       \
        kvc__mlock lk_;                                        \
        kvc_result r_;                                         \
        if ((obj) == NULL) return held_call;                   \
        lk_ = kvc__memory_lock(mpools_of_obj);                 \
        r_ = held_call;                                        \
        kvc__memory_unlock(lk_);                               \
        return r_;                                             \
    } while (0)

KVCDEF kvc_result kvc_memory_config_init(kvc_memory_config *cfg) {
    if (cfg == NULL) return KVC_ERR_NULL;
    memset(cfg, 0, sizeof(*cfg));
    return KVC_OK;
}

/* A group's pool config as the memory creates it: the memory's budget and hooks. */
static kvc_pool_config kvc__group_pool(const kvc_memory_config *m, int32_t g) {
    kvc_pool_config pc = m->groups[g].pool;
    pc.budget_bytes = m->budget_bytes;
    pc.runtime.allocator = m->runtime.allocator;
    pc.runtime.cpu_disable = m->runtime.cpu_disable;
    pc.runtime.parallel_for = m->runtime.parallel_for;
    pc.runtime.parallel_user = m->runtime.parallel_user;
    pc.runtime.n_workers = m->runtime.n_workers;
    pc.runtime.lock = m->runtime.lock;
    pc.runtime.unlock = m->runtime.unlock;
    pc.runtime.lock_user = m->runtime.lock_user;
    return pc;
}

/* Pages a group takes at least: a CAUSAL cache all of its cells, a RECURRENT one a
   state per sequence, the others one page. */
static int64_t kvc__group_min_pages(const kvc_group_config *g, int32_t page_cells) {
    const kvc_cache_config *c = &g->cache;
    if (c->kind == KVC_KIND_RECURRENT) return c->max_seqs > 0 ? c->max_seqs : 1;
    if (c->kind == KVC_KIND_CAUSAL) {
        int64_t pad = c->padding > 0 ? c->padding : 1, cap = ((int64_t)c->capacity + pad - 1) / pad * pad;
        return (cap + page_cells - 1) / page_cells;
    }
    return 1;
}

/* A group's pool as kvc_pool_create would lay it out, for kvc__check_cache_plan: only
   its geometry (no pages, no arrays), as kvc__pool_init sets it. */
static void kvc__pool_geometry(const kvc_pool_config *pc, const kvc__layout *L, kvc_pool *p) {
    memset(p, 0, sizeof(*p));
    (void)kvc__effective_config(pc, &p->cfg); /* checked by kvc__check_pool */
    p->cfg.page_cells = L->page_cells;
    p->page_cells = L->page_cells;
    p->max_pages = L->max_pages;
    p->external = pc->hooks.external_data != 0;
}

/* kvc_memory_create's validation, and kvc_memory_config_check's: the memory's own rules,
   then for each group the checks kvc_pool_create (kvc__check_pool) and kvc_cache_create
   (kvc__check_cache_plan) run on what the memory will create, then the budget. */
static kvc_result kvc__memory_check(const kvc_memory_config *m, const char **field) {
    int32_t l, g, count[KVC_MAX_GROUPS];
    size_t need = 0;
    const char *dummy;
    if (field == NULL) field = &dummy;
    *field = NULL;
    if (m->layer_group == NULL) { *field = "layer_group"; return KVC_ERR_NULL; }
    if (m->groups == NULL) { *field = "groups"; return KVC_ERR_NULL; }
    if (m->n_layers < 1) { *field = "n_layers"; return KVC_ERR_INVALID; }
    if (m->n_groups < 1 || m->n_groups > KVC_MAX_GROUPS) { *field = "n_groups"; return KVC_ERR_INVALID; }
    if ((m->runtime.allocator.alloc == NULL) != (m->runtime.allocator.free == NULL)) { *field = "runtime.allocator"; return KVC_ERR_INVALID; }
    if (m->runtime.parallel_for != NULL && m->runtime.n_workers < 1) { *field = "runtime.n_workers"; return KVC_ERR_INVALID; }
    if ((m->runtime.lock == NULL) != (m->runtime.unlock == NULL)) { *field = "runtime.lock"; return KVC_ERR_INVALID; }
    memset(count, 0, sizeof(count));
    for (l = 0; l < m->n_layers; ++l) {
        if (m->layer_group[l] < 0 || m->layer_group[l] >= m->n_groups) { *field = "layer_group"; return KVC_ERR_RANGE; }
        count[m->layer_group[l]]++;
    }
    for (g = 0; g < m->n_groups; ++g) {
        const kvc_pool_config *p = &m->groups[g].pool;
        kvc_pool_config pc = kvc__group_pool(m, g);
        kvc_pool geometry;
        kvc__cache_plan plan;
        kvc__layout L;
        kvc_result r;
        const char *inner = "";
        int64_t pages;
        if (count[g] == 0) { *field = "layer_group"; return KVC_ERR_INVALID; } /* a group with no layer */
        if (p->n_layers != count[g]) { *field = "groups.pool.n_layers"; return KVC_ERR_INVALID; }
        if (p->budget_bytes != 0 || p->arena != NULL || p->arena_bytes != 0 || p->arena_object_bytes != 0 ||
            p->runtime.allocator.alloc != NULL || p->runtime.allocator.free != NULL || p->runtime.parallel_for != NULL ||
            p->runtime.cpu_disable != 0 || p->runtime.lock != NULL || p->runtime.unlock != NULL || p->runtime.lock_user != NULL) {
            *field = "groups.pool";
            return KVC_ERR_INVALID;
        }
        if ((r = kvc__check_pool(&pc, &L, &inner)) != KVC_OK) {
            *field = strcmp(inner, "budget_bytes") == 0 ? "budget_bytes" : "groups.pool";
            return r;
        }
        kvc__pool_geometry(&pc, &L, &geometry);
        if ((r = kvc__check_cache_plan(&geometry, &m->groups[g].cache, &plan, &inner)) != KVC_OK) {
            *field = strcmp(inner, "reserve") == 0 ? "groups.cache.reserve" : "groups.cache";
            return r;
        }
        pages = kvc__group_min_pages(&m->groups[g], L.page_cells);
        need += (size_t)pages * L.page_bytes;
        if (need / L.page_bytes < (size_t)pages) {
            *field = "budget_bytes";
            return KVC_ERR_OVERFLOW;
        }
    }
    if (need > m->budget_bytes) { *field = "budget_bytes"; return KVC_ERR_INVALID; }
    return KVC_OK;
}

KVCDEF kvc_result kvc_memory_config_check(const kvc_memory_config *cfg, const char **field) {
    if (cfg == NULL) return KVC_ERR_NULL;
    return kvc__memory_check(cfg, field);
}

static void kvc__mpools_unref(kvc__mpools *mp) {
    int32_t g;
    if (--mp->refs > 0) return;
    for (g = 0; g < mp->n_groups; ++g)
        if (mp->pool[g] != NULL) { mp->pool[g]->owned = 0; (void)kvc_pool_destroy(mp->pool[g]); }
    if (mp->inside == 0) mp->alloc.free(mp, mp->alloc.user); /* else kvc__memory_unlock frees it */
}

static kvc_memory *kvc__memory_alloc(kvc__mpools *mp) {
    kvc_memory *m = (kvc_memory *)mp->alloc.alloc(sizeof(kvc_memory), mp->alloc.user);
    if (m == NULL) return NULL;
    memset(m, 0, sizeof(*m));
    m->mp = mp;
    mp->refs++;
    return m;
}

static kvc_result kvc__memory_destroy_held(kvc_memory *mem) {
    int32_t g;
    kvc__mpools *mp;
    if (mem == NULL) return KVC_ERR_NULL;
    mp = mem->mp;
    for (g = 0; mp->refs == 1 && g < mp->n_groups; ++g) { /* the last: its pools go too */
        const kvc_pool *p = mp->pool[g];
        if (p != NULL && (p->live_caches != (mem->cache[g] != NULL) || p->live_snapshots || p->live_prefixes))
            return KVC_ERR_BUSY; /* made directly on a group's cache or pool, and alive */
    }
    for (g = 0; g < mp->n_groups; ++g)
        if (mem->cache[g] != NULL) (void)kvc_cache_destroy(mem->cache[g]);
    mp->alloc.free(mem, mp->alloc.user);
    kvc__mpools_unref(mp);
    return KVC_OK;
}

KVCDEF kvc_result kvc_memory_destroy(kvc_memory *mem) {
    KVC__MEMORY_LOCKED(mem, mem->mp, kvc__memory_destroy_held(mem));
}

KVCDEF kvc_result kvc_memory_create(const kvc_memory_config *cfg, kvc_memory **out) {
    kvc_allocator a;
    kvc__mpools *mp;
    kvc_memory *m;
    int32_t l, g, seen[KVC_MAX_GROUPS];
    size_t bytes;
    kvc_result r;
    if (cfg == NULL || out == NULL) return KVC_ERR_NULL;
    if ((r = kvc__memory_check(cfg, NULL)) != KVC_OK) return r;
    a = cfg->runtime.allocator;
    if (a.alloc == NULL) { a.alloc = kvc__default_alloc; a.free = kvc__default_free; }
    bytes = sizeof(kvc__mpools) + 2 * sizeof(int32_t) * (size_t)cfg->n_layers;
    if ((mp = (kvc__mpools *)a.alloc(bytes, a.user)) == NULL) return KVC_ERR_NO_MEMORY;
    memset(mp, 0, sizeof(*mp));
    mp->alloc = a;
    mp->lock = cfg->runtime.lock;
    mp->unlock = cfg->runtime.unlock;
    mp->lock_user = cfg->runtime.lock_user;
    mp->refs = 1;
    mp->n_groups = cfg->n_groups;
    mp->n_layers = cfg->n_layers;
    mp->budget.cap = cfg->budget_bytes;
    mp->layer_group = (int32_t *)(mp + 1);
    mp->group_layer = mp->layer_group + cfg->n_layers;
    memset(seen, 0, sizeof(seen));
    for (l = 0; l < cfg->n_layers; ++l) {
        mp->layer_group[l] = cfg->layer_group[l];
        mp->group_layer[l] = seen[cfg->layer_group[l]]++;
    }
    m = kvc__memory_alloc(mp);
    mp->refs--; /* the memory holds the only reference */
    if (m == NULL) { a.free(mp, a.user); return KVC_ERR_NO_MEMORY; }
    for (g = 0; g < cfg->n_groups && r == KVC_OK; ++g) {
        kvc_pool_config pc = kvc__group_pool(cfg, g);
        r = kvc_pool_create(&pc, &mp->pool[g]);
        if (r != KVC_OK) break;
        mp->pool[g]->budget = &mp->budget; /* empty, so nothing to carry over */
        mp->pool[g]->owned = 1;            /* destroyed with the memory only */
        r = kvc_cache_create(mp->pool[g], &cfg->groups[g].cache, &m->cache[g]);
    }
    if (r != KVC_OK) { kvc_memory_destroy(m); return r; }
    *out = m;
    return KVC_OK;
}

static kvc_result kvc__memory_map(const kvc_memory *m, int32_t layer, kvc_cache **c, int32_t *gl) {
    if (m == NULL) return KVC_ERR_NULL;
    if (layer < 0 || layer >= m->mp->n_layers) return KVC_ERR_RANGE;
    *c = m->cache[m->mp->layer_group[layer]];
    *gl = m->mp->group_layer[layer];
    return KVC_OK;
}

/* A group's cache handed out: from now on it refuses changes from outside (kvc__owned). */
static kvc_cache *kvc__memory_hand_out(const kvc_memory *mem, int32_t group) {
    kvc__mlock lk = kvc__memory_lock(mem->mp);
    kvc_cache *c = mem->cache[group];
    c->owner = mem->mp;
    kvc__memory_unlock(lk);
    return c;
}

KVCDEF kvc_result kvc_memory_layer(const kvc_memory *mem, int32_t layer, kvc_cache **cache, int32_t *group_layer) {
    kvc_cache *c;
    int32_t gl;
    kvc_result r;
    if (cache == NULL || group_layer == NULL) return KVC_ERR_NULL;
    if ((r = kvc__memory_map(mem, layer, &c, &gl)) != KVC_OK) return r;
    *cache = kvc__memory_hand_out(mem, mem->mp->layer_group[layer]);
    *group_layer = gl;
    return KVC_OK;
}

KVCDEF kvc_result kvc_memory_group(const kvc_memory *mem, int32_t group, kvc_cache **cache) {
    if (mem == NULL || cache == NULL) return KVC_ERR_NULL;
    if (group < 0 || group >= mem->mp->n_groups) return KVC_ERR_RANGE;
    *cache = kvc__memory_hand_out(mem, group);
    return KVC_OK;
}

KVCDEF kvc_result kvc_memory_put(kvc_memory *mem, int32_t layer, const float *k, const float *v) {
    kvc_cache *c;
    int32_t gl;
    kvc_result r = kvc__memory_map(mem, layer, &c, &gl);
    return r != KVC_OK ? r : kvc_put(c, gl, k, v);
}
KVCDEF kvc_result kvc_memory_attention(const kvc_memory *mem, int32_t layer, const kvc_attention_desc *desc) {
    kvc_cache *c;
    int32_t gl;
    kvc_result r = kvc__memory_map(mem, layer, &c, &gl);
    return r != KVC_OK ? r : kvc_attention(c, gl, desc);
}
KVCDEF kvc_result kvc_memory_state(kvc_memory *mem, int32_t layer, int32_t seq, float **state) {
    kvc_cache *c;
    int32_t gl;
    kvc_result r = kvc__memory_map(mem, layer, &c, &gl);
    return r != KVC_OK ? r : kvc_state(c, seq, gl, state);
}
KVCDEF kvc_result kvc_memory_state_checkpoint(kvc_memory *mem, int32_t layer, int32_t at, const float *state) {
    kvc_cache *c;
    int32_t gl;
    kvc_result r = kvc__memory_map(mem, layer, &c, &gl);
    return r != KVC_OK ? r : kvc_state_checkpoint(c, gl, at, state);
}
KVCDEF kvc_result kvc_memory_state_read(const kvc_memory *mem, int32_t layer, const float **state) {
    kvc_cache *c;
    int32_t gl;
    kvc_result r = kvc__memory_map(mem, layer, &c, &gl);
    return r != KVC_OK ? r : kvc_state_read(c, 0, gl, state);
}
KVCDEF kvc_result kvc_memory_batch_checkpoints(const kvc_memory *mem, int32_t layer, int32_t *at, int32_t max_at,
                                               int32_t *n_at) {
    kvc_cache *c;
    int32_t gl;
    kvc_result r = kvc__memory_map(mem, layer, &c, &gl);
    return r != KVC_OK ? r : kvc_batch_checkpoints(c, at, max_at, n_at);
}

/* The tokens a cache holds, as the memory counts them (CAUSAL: sequence 0's). */
static int32_t kvc__cache_tokens(const kvc_cache *c) {
    int32_t lo, hi;
    if (c->cfg.kind != KVC_KIND_CAUSAL) return c->offset;
    if (kvc_seq_pos_range(c, 0, &lo, &hi) != KVC_OK) return 0;
    return hi + 1;
}

KVCDEF kvc_result kvc_memory_offset(const kvc_memory *mem, int32_t *offset) {
    if (mem == NULL || offset == NULL) return KVC_ERR_NULL;
    *offset = kvc__cache_tokens(mem->cache[0]);
    return KVC_OK;
}

static int kvc__memory_open(const kvc_memory *m) {
    int32_t g;
    for (g = 0; g < m->mp->n_groups; ++g)
        if (kvc__batch_open(m->cache[g])) return 1;
    return 0;
}

/* Pages (net of those it releases first) kvc__begin_kv or kvc__recurrent_begin will
   take for n tokens with `inside` checkpoints before the batch's end. */
static int64_t kvc__begin_net_pages(const kvc_cache *c, int32_t n, int32_t inside) {
    int32_t pc = c->pool->page_cells, o = c->offset, freed;
    if (c->cfg.kind == KVC_KIND_RECURRENT) return kvc__recurrent_net(c, n, inside);
    if (c->cfg.kind == KVC_KIND_CAUSAL) return 0; /* its pages are all its own already */
    (void)kvc__dead_pages(c, o, &freed);
    return ((int64_t)(o + n - 1) / pc - ((int64_t)o + pc - 1) / pc + 1) + kvc__tail_shared(c, o) - freed;
}

static kvc_result kvc__memory_begin_held(kvc_memory *mem, int32_t n_tokens, const int32_t *at, int32_t n_at) {
    kvc__mpools *mp;
    int32_t g, i, k, o, order[KVC_MAX_GROUPS];
    int64_t net[KVC_MAX_GROUPS], total = 0;
    kvc_result r = KVC_OK;
    if (mem == NULL || (at == NULL && n_at > 0)) return KVC_ERR_NULL;
    if (n_tokens < 1 || n_at < 0) return KVC_ERR_INVALID;
    mp = mem->mp;
    if (kvc__memory_open(mem)) return KVC_ERR_STATE;
    o = kvc__cache_tokens(mem->cache[0]);
    if (n_tokens > INT32_MAX - o) return KVC_ERR_RANGE;
    for (i = 0; i < n_at; ++i)
        if (at[i] <= (i > 0 ? at[i - 1] : o) || at[i] > o + n_tokens) return KVC_ERR_RANGE;
    for (g = 0; g < mp->n_groups; ++g) { /* every argument before any resource */
        const kvc_cache *c = mem->cache[g];
        if (n_at > 0 && c->cfg.kind == KVC_KIND_CAUSAL) return KVC_ERR_UNSUPPORTED;
        if (kvc__has_ckpts(c) && n_at > c->max_ckpt) return KVC_ERR_RANGE;
    }
    for (g = 0; g < mp->n_groups; ++g) {
        kvc_cache *c = mem->cache[g];
        int32_t inside = 0;
        for (i = 0; i < n_at; ++i) inside += at[i] < o + n_tokens;
        kvc__settle(c);
        net[g] = kvc__begin_net_pages(c, n_tokens, c->cfg.kind == KVC_KIND_RECURRENT
                                                       ? inside + kvc__reserve_extra(c, n_tokens, at, n_at) : 0);
        total += net[g] * (int64_t)c->pool->page_bytes;
    }
    /* everything that allocates or may refuse, before anything is evicted or changes:
       page-table room (FULL, ROTATING), the checkpoints' structs, CAUSAL admission */
    for (g = 0; g < mp->n_groups && r == KVC_OK; ++g) {
        kvc_cache *c = mem->cache[g];
        kvc_batch b;
        if (c->cfg.kind == KVC_KIND_FULL || c->cfg.kind == KVC_KIND_ROTATING) r = kvc__begin_kv_reserve(c, n_tokens);
        if (r == KVC_OK && kvc__has_ckpts(c)) r = kvc__pend_alloc(c, at, n_at, n_tokens);
        if (r == KVC_OK && c->cfg.kind == KVC_KIND_CAUSAL && (r = kvc__seq0_batch(c, n_tokens, &b)) == KVC_OK)
            r = kvc__causal_admits(c, &b);
    }
    /* then the budget, after evicting prefix-tree entries if it must (all or nothing); a
       group's own pool then has the pages too (it reserves the whole budget) */
    if (r == KVC_OK && !kvc__reclaim_for(mem->cache[0]->pool, 0, KVC__MAX(total, 0))) r = KVC_ERR_FULL;
    for (g = 0; g < mp->n_groups && r == KVC_OK; ++g)
        if (net[g] > (int64_t)mem->cache[g]->pool->n_free) r = KVC_ERR_FULL;
    if (r != KVC_OK) {
        for (g = 0; g < mp->n_groups; ++g) kvc__pend_drop(mem->cache[g]);
        return r;
    }
    /* from here on nothing fails: CAUSAL groups first (they take no pages) */
    for (g = 0; g < mp->n_groups; ++g)
        if (mem->cache[g]->cfg.kind == KVC_KIND_CAUSAL) {
            r = kvc__begin_seq0(mem->cache[g], n_tokens);
            KVCACHE_ASSERT(r == KVC_OK); /* admitted above */
        }
    /* then the others, those that give pages back first: every prefix of the order then
       fits the budget, since the whole does */
    for (g = 0, k = 0; g < mp->n_groups; ++g)
        if (mem->cache[g]->cfg.kind != KVC_KIND_CAUSAL) order[k++] = g;
    for (i = 1; i < k; ++i) {
        int32_t x = order[i], j = i;
        while (j > 0 && net[order[j - 1]] > net[x]) { order[j] = order[j - 1]; --j; }
        order[j] = x;
    }
    for (i = 0; i < k; ++i) {
        kvc_cache *c = mem->cache[order[i]];
        r = kvc__is_recurrent(c) ? kvc__recurrent_begin(c, n_tokens) : kvc__begin_kv(c, n_tokens);
        KVCACHE_ASSERT(r == KVC_OK); /* the budget and the tables were checked for all of them */
    }
    (void)r;
    return KVC_OK;
}

KVCDEF kvc_result kvc_memory_begin(kvc_memory *mem, int32_t n_tokens, const int32_t *at, int32_t n_at) {
    KVC__MEMORY_LOCKED(mem, mem->mp, kvc__memory_begin_held(mem, n_tokens, at, n_at));
}

static kvc_result kvc__memory_cancel_held(kvc_memory *mem) {
    int32_t g;
    if (mem == NULL) return KVC_ERR_NULL;
    /* groups whose layers were all put have ended their part of the batch: they are
       taken back too, so the memory's batch is open while any group's is */
    if (!kvc__memory_open(mem)) return KVC_ERR_STATE;
    for (g = 0; g < mem->mp->n_groups; ++g) {
        const kvc_cache *c = mem->cache[g];
        if (kvc__is_recurrent(c) && (c->batch_pending < c->pool->cfg.n_layers || !kvc__batch_open(c)))
            return KVC_ERR_RECURRENT; /* a state was handed out and may have changed */
    }
    for (g = 0; g < mem->mp->n_groups; ++g) {
        kvc_cache *c = mem->cache[g];
        if (kvc__batch_open(c)) {
            (void)kvc_cancel(c);
        } else if (c->cfg.kind == KVC_KIND_CAUSAL) {
            kvc__causal_cancel(c); /* takes the ended batch's cells back */
        } else {
            kvc__pend_drop(c);
            kvc__rewind_to(c, c->batch_begin, c->batch_begin);
        }
    }
    return KVC_OK;
}

KVCDEF kvc_result kvc_memory_cancel(kvc_memory *mem) {
    KVC__MEMORY_LOCKED(mem, mem->mp, kvc__memory_cancel_held(mem));
}

KVCDEF kvc_result kvc_memory_can_rewind(const kvc_memory *mem, int32_t target, int *can_rewind) {
    int32_t g;
    if (mem == NULL || can_rewind == NULL) return KVC_ERR_NULL;
    *can_rewind = !kvc__memory_open(mem);
    if (target == 0) return KVC_OK; /* clearing: always possible (CAUSAL groups too) */
    for (g = 0; g < mem->mp->n_groups && *can_rewind; ++g)
        *can_rewind = kvc__reachable(mem->cache[g], target);
    return KVC_OK;
}

KVCDEF kvc_result kvc_memory_rewind_point(const kvc_memory *mem, int32_t max_target, int32_t *target) {
    int32_t t;
    if (mem == NULL || target == NULL) return KVC_ERR_NULL;
    if (max_target < 0) return KVC_ERR_RANGE;
    t = KVC__MIN(max_target, kvc__cache_tokens(mem->cache[0]));
    for (; t > 0; --t) {
        int ok;
        (void)kvc_memory_can_rewind(mem, t, &ok);
        if (ok) break;
    }
    *target = t; /* 0: clearing is always possible */
    return KVC_OK;
}

static void kvc__memory_rewind(kvc_memory *m, int32_t target) {
    int32_t g;
    for (g = 0; g < m->mp->n_groups; ++g) {
        if (target == 0) (void)kvc_cache_clear(m->cache[g]);
        else if (target != m->cache[g]->offset) kvc__rewind_any(m->cache[g], target);
        else kvc__settle(m->cache[g]); /* at it: as it is, the ended batch settled */
    }
}

static kvc_result kvc__memory_trim_held(kvc_memory *mem, int32_t n_tokens) {
    int32_t o;
    int ok;
    if (mem == NULL) return KVC_ERR_NULL;
    if (kvc__memory_open(mem)) return KVC_ERR_STATE;
    o = kvc__cache_tokens(mem->cache[0]);
    if (n_tokens < 0 || n_tokens > o) return KVC_ERR_RANGE;
    (void)kvc_memory_can_rewind(mem, o - n_tokens, &ok);
    if (!ok) return KVC_ERR_UNREACHABLE;
    kvc__memory_rewind(mem, o - n_tokens);
    return KVC_OK;
}

KVCDEF kvc_result kvc_memory_trim(kvc_memory *mem, int32_t n_tokens) {
    KVC__MEMORY_LOCKED(mem, mem->mp, kvc__memory_trim_held(mem, n_tokens));
}

static kvc_result kvc__memory_clear_held(kvc_memory *mem) {
    int32_t g;
    if (mem == NULL) return KVC_ERR_NULL;
    for (g = 0; g < mem->mp->n_groups; ++g) (void)kvc_cache_clear(mem->cache[g]);
    return KVC_OK;
}

KVCDEF kvc_result kvc_memory_clear(kvc_memory *mem) {
    KVC__MEMORY_LOCKED(mem, mem->mp, kvc__memory_clear_held(mem));
}

static kvc_result kvc__memory_snapshot_free_held(kvc_memory_snapshot *snap) {
    int32_t g;
    kvc__mpools *mp;
    if (snap == NULL) return KVC_OK;
    mp = snap->mp;
    for (g = 0; g < mp->n_groups; ++g) kvc__snapshot_release(snap->snap[g]);
    mp->alloc.free(snap, mp->alloc.user);
    kvc__mpools_unref(mp);
    return KVC_OK;
}

KVCDEF kvc_result kvc_memory_snapshot_free(kvc_memory_snapshot *snap) {
    KVC__MEMORY_LOCKED(snap, snap->mp, kvc__memory_snapshot_free_held(snap));
}

static kvc_result kvc__memory_snapshot_take_held(kvc_memory *mem, int32_t from, int32_t at, kvc_memory_snapshot **out) {
    kvc__mpools *mp;
    kvc_memory_snapshot *s;
    int32_t g, o;
    kvc_result r = KVC_OK;
    if (mem == NULL || out == NULL) return KVC_ERR_NULL;
    mp = mem->mp;
    if (kvc__memory_open(mem)) return KVC_ERR_STATE;
    o = kvc__cache_tokens(mem->cache[0]);
    if (at == KVC_POS_END) at = o; /* as kvc_snapshot_take: the offset */
    if (at < 0 || at > o) return KVC_ERR_RANGE;
    for (g = 0; g < mp->n_groups; ++g)
        if (mem->cache[g]->cfg.kind == KVC_KIND_CAUSAL) return KVC_ERR_UNSUPPORTED; /* kvc_seq_snapshot */
    if (at <= from || at == 0) { *out = NULL; return KVC_OK; }
    if ((s = (kvc_memory_snapshot *)mp->alloc.alloc(sizeof(*s), mp->alloc.user)) == NULL) return KVC_ERR_NO_MEMORY;
    memset(s, 0, sizeof(*s));
    s->mp = mp;
    mp->refs++;
    s->to = at;
    for (g = 0; g < mp->n_groups && r == KVC_OK; ++g) r = kvc_snapshot_take(mem->cache[g], from, at, &s->snap[g]);
    if (r != KVC_OK) { kvc_memory_snapshot_free(s); return r; }
    *out = s;
    return KVC_OK;
}

KVCDEF kvc_result kvc_memory_snapshot_take(kvc_memory *mem, int32_t from, int32_t at, kvc_memory_snapshot **out) {
    KVC__MEMORY_LOCKED(mem, mem->mp, kvc__memory_snapshot_take_held(mem, from, at, out));
}

static kvc_result kvc__memory_restore_held(kvc_memory *mem, const kvc_memory_snapshot *snap, int32_t target) {
    kvc__mpools *mp;
    kvc_snapshot *chains[KVC_MAX_GROUPS] = {NULL}; /* a FULL group's stays NULL */
    int64_t copies = 0;
    int32_t g;
    int ok;
    if (mem == NULL) return KVC_ERR_NULL;
    mp = mem->mp;
    if (snap != NULL && snap->mp != mp) return KVC_ERR_FOREIGN;
    if (kvc__memory_open(mem)) return KVC_ERR_STATE;
    if (target < 0) return KVC_ERR_UNREACHABLE;
    if (snap == NULL) {
        (void)kvc_memory_can_rewind(mem, target, &ok);
        if (!ok) return KVC_ERR_UNREACHABLE;
        kvc__memory_rewind(mem, target);
        return KVC_OK;
    }
    if (target > snap->to) return KVC_ERR_UNREACHABLE;
    for (g = 0; g < mp->n_groups; ++g) { /* every group must accept it before any changes */
        const kvc_cache *c = mem->cache[g];
        const kvc_snapshot *s = snap->snap[g];
        if (c->cfg.kind == KVC_KIND_CAUSAL) return KVC_ERR_UNSUPPORTED;
        if (s == NULL) return KVC_ERR_UNREACHABLE;
        if (c->cfg.kind == KVC_KIND_FULL && c->offset < s->from) return KVC_ERR_UNREACHABLE;
        if (c->cfg.kind != KVC_KIND_FULL && target < s->to &&
            (kvc__is_recurrent(c) || s->to > c->cfg.window || s->first_lpage > c->n_sink_pages))
            return KVC_ERR_UNREACHABLE;
        if (c->cfg.kind == KVC_KIND_FULL && s->from % c->pool->page_cells != 0 && target > s->from &&
            c->pages[s->from / c->pool->page_cells] != s->pages[0])
            copies += (int64_t)c->pool->page_bytes; /* the page at `from` needs a copy (kvc__restore_full) */
    }
    for (g = 0; g < mp->n_groups; ++g) { /* page-table room: reserving changes nothing visible */
        kvc_cache *c = mem->cache[g];
        int64_t want = c->cfg.kind == KVC_KIND_FULL ? (target > 0 ? (target - 1) / c->pool->page_cells + 1 : 0)
                     : c->cfg.kind == KVC_KIND_ROTATING ? kvc__chain_pages(snap->snap[g]) : 0;
        if (kvc__page_table_reserve(c, want) != KVC_OK) return KVC_ERR_NO_MEMORY;
    }
    for (g = 0; g < mp->n_groups; ++g) /* the carried checkpoints, copied before anything changes */
        if (mem->cache[g]->cfg.kind != KVC_KIND_FULL &&
            kvc__chain_clone(snap->snap[g]->carried, target, &chains[g]) != KVC_OK) {
            while (g-- > 0) kvc__snapshot_release(chains[g]);
            return KVC_ERR_NO_MEMORY;
        }
    /* then the budget for the copies, after evicting prefix-tree entries if it must, as
       kvc_memory_begin does: only once everything else that may fail has succeeded, and
       all or nothing (a call that fails evicts nothing) */
    if (!kvc__reclaim_for(mem->cache[0]->pool, 0, copies)) {
        for (g = 0; g < mp->n_groups; ++g) kvc__snapshot_release(chains[g]);
        return KVC_ERR_FULL;
    }
    for (g = 0; g < mp->n_groups; ++g) {
        kvc_cache *c = mem->cache[g];
        if (c->cfg.kind == KVC_KIND_FULL) {
            kvc_result r = kvc__restore_full(c, snap->snap[g], target);
            KVCACHE_ASSERT(r == KVC_OK); /* its page was counted above */
            (void)r;
        } else {
            kvc__restore_apply(c, snap->snap[g], target, chains[g]);
        }
    }
    return KVC_OK;
}

KVCDEF kvc_result kvc_memory_restore(kvc_memory *mem, const kvc_memory_snapshot *snap, int32_t target) {
    KVC__MEMORY_LOCKED(mem, mem->mp, kvc__memory_restore_held(mem, snap, target));
}

static kvc_result kvc__memory_fork_held(const kvc_memory *mem, kvc_memory **out) {
    kvc_memory *m;
    int32_t g;
    kvc_result r = KVC_OK;
    if (mem == NULL || out == NULL) return KVC_ERR_NULL;
    if (kvc__memory_open(mem)) return KVC_ERR_STATE;
    for (g = 0; g < mem->mp->n_groups; ++g)
        if (mem->cache[g]->cfg.kind == KVC_KIND_CAUSAL) return KVC_ERR_UNSUPPORTED;
    if ((m = kvc__memory_alloc(mem->mp)) == NULL) return KVC_ERR_NO_MEMORY;
    for (g = 0; g < mem->mp->n_groups && r == KVC_OK; ++g) r = kvc_cache_fork(mem->cache[g], &m->cache[g]);
    if (r != KVC_OK) { kvc_memory_destroy(m); return r; }
    *out = m;
    return KVC_OK;
}

KVCDEF kvc_result kvc_memory_fork(const kvc_memory *mem, kvc_memory **out) {
    KVC__MEMORY_LOCKED(mem, mem->mp, kvc__memory_fork_held(mem, out));
}

static kvc_result kvc__memory_stats_get_held(const kvc_memory *mem, kvc_memory_stats *st) {
    int32_t g;
    const kvc_cache *with = NULL; /* a group that keeps checkpoints */
    if (mem == NULL || st == NULL) return KVC_ERR_NULL;
    memset(st, 0, sizeof(*st));
    st->budget_bytes = mem->mp->budget.cap;
    st->bytes_used = mem->mp->budget.used;
    st->n_groups = mem->mp->n_groups;
    st->offset = kvc__cache_tokens(mem->cache[0]);
    for (g = 0; g < mem->mp->n_groups; ++g) {
        const kvc_cache *c = mem->cache[g];
        int32_t i, j;
        if (with == NULL && kvc__has_ckpts(c)) with = c;
        st->checkpoints_dropped += c->ckpt_dropped;
        for (i = 0; kvc__is_recurrent(c) && !kvc__batch_open(c) && i < c->n_pend; ++i)
            st->checkpoints_dropped += !kvc__pend_complete(c, i); /* the ended batch drops it when it settles */
        for (i = 0; i < c->n_ckpt + c->n_pend; ++i) { /* pages nothing but checkpoints hold */
            const kvc_snapshot *k = i < c->n_ckpt ? c->ckpt[i] : c->pend[i - c->n_ckpt];
            for (j = 0; j < k->n_pages; ++j)
                if (c->pool->refcount[k->pages[j]] == 1) st->checkpoint_bytes += c->pool->page_bytes;
        }
    }
    /* offsets below the current one every group can go back to */
    for (g = 0; with != NULL && g < with->n_ckpt + with->n_pend; ++g) {
        int ok;
        const kvc_snapshot *k = g < with->n_ckpt ? with->ckpt[g] : with->pend[g - with->n_ckpt];
        int32_t at = k->to;
        if (g >= with->n_ckpt && !kvc__pend_complete(with, g - with->n_ckpt)) continue; /* the ones it keeps */
        if (!kvc__ckpt_stays(with, k)) continue; /* settling drops it */
        (void)kvc_memory_can_rewind(mem, at, &ok);
        st->n_checkpoints += ok && at < st->offset;
    }
    return KVC_OK;
}

KVCDEF kvc_result kvc_memory_stats_get(const kvc_memory *mem, kvc_memory_stats *st) {
    KVC__MEMORY_LOCKED(mem, mem->mp, kvc__memory_stats_get_held(mem, st));
}

/* ---- Layer 5: single-entry prefix reuse (findRemaining / close of ollama's MLX runner) */

struct kvc_prefix {
    kvc_pool *pool;          /* where this object's memory comes from */
    kvc_cache **caches;
    uint64_t *gen;           /* [n_caches] the caches' generations when tokens was recorded */
    int32_t n_caches, max_tokens;
    int32_t *tokens, n_tokens;   /* what the caches hold */
    int32_t *prompt, n_prompt;   /* the request between begin and close */
    int open;
};

KVCDEF kvc_result kvc_prefix_create(kvc_cache *const *caches, int32_t n_caches, int32_t max_tokens,
                                    kvc_prefix **out) {
    kvc_prefix *x;
    kvc_pool *p;
    int32_t i;
    size_t bytes;
    if (caches == NULL || out == NULL) return KVC_ERR_NULL;
    if (n_caches < 1 || max_tokens < 1 || max_tokens > INT32_MAX / 8) return KVC_ERR_INVALID;
    for (i = 0; i < n_caches; ++i) {
        int32_t j;
        if (caches[i] == NULL) return KVC_ERR_NULL;
        if (caches[i]->cfg.kind == KVC_KIND_CAUSAL) return KVC_ERR_UNSUPPORTED;
        for (j = 0; j < i; ++j) if (caches[j] == caches[i]) return KVC_ERR_INVALID;
    }
    for (i = 0; i < n_caches; ++i) /* a memory's groups: kvc_prefix_create_memory takes them all */
        if (kvc__owned(caches[i], 0) != KVC_OK) return KVC_ERR_OWNED;
    p = caches[0]->pool;
    bytes = sizeof(kvc_prefix) + (sizeof(kvc_cache *) + sizeof(uint64_t)) * (size_t)n_caches +
            2 * sizeof(int32_t) * (size_t)max_tokens;
    kvc__pool_lock(p); /* the pool's counter and allocations: trees change them under it too */
    x = (kvc_prefix *)kvc__alloc(p, bytes);
    if (x == NULL) { kvc__pool_unlock(p); return KVC_ERR_NO_MEMORY; }
    memset(x, 0, sizeof(*x));
    x->pool = p;
    x->gen = (uint64_t *)(void *)(x + 1); /* 8-byte entries first: aligned after the struct */
    x->caches = (kvc_cache **)(void *)(x->gen + n_caches);
    x->tokens = (int32_t *)(x->caches + n_caches);
    x->prompt = x->tokens + max_tokens;
    x->n_caches = n_caches;
    x->max_tokens = max_tokens;
    for (i = 0; i < n_caches; ++i) { x->caches[i] = caches[i]; x->gen[i] = caches[i]->gen; }
    p->live_prefixes++;
    kvc__pool_unlock(p);
    *out = x;
    return KVC_OK;
}

KVCDEF kvc_result kvc_prefix_destroy(kvc_prefix *prefix) {
    kvc_pool *p;
    if (prefix == NULL) return KVC_ERR_NULL;
    p = prefix->pool;
    kvc__pool_lock(p);
    p->live_prefixes--;
    kvc__free(p, prefix);
    kvc__pool_unlock(p);
    return KVC_OK;
}

static int kvc__all_reach(kvc_cache *const *c, int32_t n, int32_t t) {
    int32_t i;
    for (i = 0; i < n; ++i)
        if (!kvc__reachable(c[i], t)) return 0;
    return 1;
}

/* The largest offset <= limit every cache can go back to (0: start over). Candidates
   are limit itself and the caches' offsets and checkpoints below it. */
static int32_t kvc__common_point(kvc_cache *const *c, int32_t n, int32_t limit) {
    int32_t i, j, best = 0;
    if (kvc__all_reach(c, n, limit)) return limit;
    for (i = 0; i < n; ++i) {
        if (c[i]->offset < limit && c[i]->offset > best && kvc__all_reach(c, n, c[i]->offset)) best = c[i]->offset;
        for (j = 0; j < c[i]->n_ckpt + c[i]->n_pend; ++j) {
            int32_t t = j < c[i]->n_ckpt ? c[i]->ckpt[j]->to : c[i]->pend[j - c[i]->n_ckpt]->to;
            if (t < limit && t > best && kvc__all_reach(c, n, t)) best = t;
        }
    }
    return best;
}

static int32_t kvc__min_offset(const kvc_prefix *x) {
    int32_t i, m = x->caches[0]->offset;
    for (i = 1; i < x->n_caches; ++i) m = KVC__MIN(m, x->caches[i]->offset);
    return m;
}

KVCDEF kvc_result kvc_prefix_begin(kvc_prefix *x, const int32_t *tokens, int32_t n_tokens, int32_t *n_reused) {
    int32_t i, prefix = 0;
    if (x == NULL || n_reused == NULL) return KVC_ERR_NULL;
    if (n_tokens < 0) return KVC_ERR_INVALID;
    if (tokens == NULL && n_tokens > 0) return KVC_ERR_NULL;
    for (i = 0; i < x->n_caches; ++i)
        if (kvc__batch_open(x->caches[i])) return KVC_ERR_STATE;
    for (i = 0; i < x->n_caches && !x->open; ++i) /* changed since close: its tokens say nothing */
        if (x->caches[i]->gen != x->gen[i]) x->n_tokens = 0;
    while (prefix < n_tokens && prefix < x->n_tokens && tokens[prefix] == x->tokens[prefix]) prefix++;
    if (prefix > 0 && prefix == n_tokens) prefix--; /* always evaluate one token to start generation from */
    /* the longest prefix every cache can go back to: a wrapped window or a recurrent state
       only to a checkpoint; 0 when none, and then every cache starts over */
    prefix = kvc__common_point(x->caches, x->n_caches, KVC__MIN(prefix, kvc__min_offset(x)));
    for (i = 0; i < x->n_caches; ++i) {
        kvc__pool_lock(x->caches[i]->pool);
        if (prefix == 0) (void)kvc__cache_clear_held(x->caches[i]); /* also a memory's groups */
        else if (x->caches[i]->offset > prefix) kvc__rewind_any(x->caches[i], prefix);
        else kvc__settle(x->caches[i]); /* at it already: as it is */
        kvc__pool_unlock(x->caches[i]->pool);
    }
    x->n_tokens = prefix;
    for (i = 0; i < x->n_caches; ++i) x->gen[i] = x->caches[i]->gen;
    x->n_prompt = KVC__MIN(n_tokens, x->max_tokens);
    if (x->n_prompt > 0) memcpy(x->prompt, tokens, sizeof(int32_t) * (size_t)x->n_prompt);
    x->open = 1;
    *n_reused = prefix;
    return KVC_OK;
}

KVCDEF kvc_result kvc_prefix_close(kvc_prefix *x, const int32_t *generated, int32_t n_generated) {
    int32_t keep, from_prompt;
    if (x == NULL) return KVC_ERR_NULL;
    if (n_generated < 0) return KVC_ERR_INVALID;
    if (n_generated > 0 && generated == NULL) return KVC_ERR_NULL;
    if (!x->open) return KVC_ERR_STATE;
    keep = KVC__MIN(kvc__min_offset(x), x->max_tokens);
    keep = (int32_t)KVC__MIN((int64_t)keep, (int64_t)x->n_prompt + n_generated);
    from_prompt = KVC__MIN(keep, x->n_prompt);
    memcpy(x->tokens, x->prompt, sizeof(int32_t) * (size_t)from_prompt);
    if (keep > from_prompt && generated != NULL) /* (n_generated > 0 there: checked) */
        memcpy(x->tokens + from_prompt, generated, sizeof(int32_t) * (size_t)(keep - from_prompt));
    x->n_tokens = keep;
    for (keep = 0; keep < x->n_caches; ++keep) x->gen[keep] = x->caches[keep]->gen;
    x->open = 0;
    return KVC_OK;
}

KVCDEF kvc_result kvc_prefix_create_memory(kvc_memory *mem, int32_t max_tokens, kvc_prefix **out) {
    if (mem == NULL || out == NULL) return KVC_ERR_NULL;
    KVC__MEMORY_LOCKED(mem, mem->mp, kvc_prefix_create(mem->cache, mem->mp->n_groups, max_tokens, out));
}

KVCDEF kvc_result kvc_prefix_tokens(const kvc_prefix *x, const int32_t **tokens, int32_t *n_tokens) {
    if (x == NULL || tokens == NULL || n_tokens == NULL) return KVC_ERR_NULL;
    *tokens = x->tokens;
    *n_tokens = x->n_tokens;
    return KVC_OK;
}

/* ---- Layer 5b: the radix prefix tree ---------------------------------------------------
   A node is a span of tokens [start, start + len) of the path from the root. A tree has
   parts: one for a tree on a pool, one per group for a tree over a model memory (Layer
   4c). An attention part (FULL, ROTATING) holds, per node, the pages of the logical pages
   start / page_cells .. (end - 1) / page_cells of its pool. Its page of a logical page
   holds valid K/V for every token of the path in that page up to the node's end, its
   ancestors' tokens included: the first page is the committing cache's own (it held the
   same tokens) or, after a split, the page shared with the other half. So the page for
   logical page lp of a prefix is the deepest node's that covers lp. ROTATING parts hold
   only the pages the committed caches (or their checkpoints) still had (KVC__NO_PAGE
   where a window released them). A RECURRENT part holds, per node, one state page: the
   state after the node's last token (KVC__NO_PAGE: none), so it serves a prefix only
   where a node with a state ends; commits end nodes at the offsets where every
   RECURRENT group kept a checkpoint. */

typedef struct kvc__rpart {
    kvc_pool *pool;
    kvc_cache_config cfg; /* the caches lookups give and commits take */
} kvc__rpart;

typedef struct kvc__rnode {
    struct kvc__rnode *parent, *child, *next; /* first child, next sibling */
    kvc_namespace ns;
    int32_t start, len;   /* the path's tokens [start, start + len) */
    uint32_t users;       /* caches keeping this entry in use */
    uint32_t pins;
    int32_t priority;     /* the highest priority of the commits through it */
    uint64_t tick;        /* last lookup or commit through it: LRU order */
    uint64_t entry_tick;  /* last commit that ended at its end (0: none) */
    int blocked;          /* scratch: it or a descendant is in use or pinned */
    int kept;             /* scratch: on the path of one of the max_entries latest commits */
    int32_t *tokens;      /* [len] */
    uint32_t **pages;     /* [n_parts]: see kvc__rnode_np */
} kvc__rnode;

struct kvc_radix {
    kvc_radix_config cfg;
    int32_t n_parts;
    kvc__rpart part[KVC_MAX_GROUPS];
    kvc__mpools *mp;      /* a memory's tree: the pools it keeps alive; NULL on a pool */
    kvc__budget *budget;  /* the parts' pools' one budget: its trees evict together */
    kvc__rnode root;      /* len 0; its children start the namespaces' sequences */
    kvc_radix *next;      /* the budget's list of trees */
    int32_t n_leases;
    kvc_radix_stats stats;
    struct kvc__tier *tier; /* kvc_tier_attach: where eviction sends entries (NULL: away) */
};
static void kvc__tier_keep(kvc_radix *t, const kvc__rnode *leaf);
static void kvc__tier_free(kvc_radix *t);

static int kvc__ns_equal(kvc_namespace a, kvc_namespace b) { return a.model == b.model && a.salt == b.salt; }
static int32_t kvc__rnode_end(const kvc__rnode *n) { return n->start + n->len; }
static int kvc__part_state(const kvc_radix *t, int32_t g) { return t->part[g].cfg.kind == KVC_KIND_RECURRENT; }
static int kvc__radix_has_states(const kvc_radix *t) {
    int32_t g;
    for (g = 0; g < t->n_parts; ++g)
        if (kvc__part_state(t, g)) return 1;
    return 0;
}

/* Entries of part g of a node spanning [start, start + len): its logical pages, or one
   state. */
static int32_t kvc__rnode_np(const kvc_radix *t, int32_t g, int32_t start, int32_t len) {
    int32_t pc;
    if (kvc__part_state(t, g)) return 1;
    pc = t->part[g].pool->page_cells;
    return (start + len - 1) / pc - start / pc + 1;
}

/* Pre-order successor of n within the tree of `root` (NULL after the last node). */
static kvc__rnode *kvc__rnode_next(const kvc__rnode *root, const kvc__rnode *n) {
    if (n->child) return n->child;
    while (n != root) {
        if (n->next) return n->next;
        n = n->parent;
    }
    return NULL;
}

/* A fresh node (no pages, no states); its size is checked in 64 bits. */
static kvc__rnode *kvc__rnode_new(kvc_radix *t, int32_t start, int32_t len) {
    uint64_t bytes = sizeof(kvc__rnode) + sizeof(uint32_t *) * (uint64_t)t->n_parts + 4 * (uint64_t)len;
    int32_t g, i, np;
    uint32_t *at;
    kvc__rnode *n;
    for (g = 0; g < t->n_parts; ++g) bytes += 4 * (uint64_t)kvc__rnode_np(t, g, start, len);
    if (bytes > (uint64_t)SIZE_MAX) return NULL;
    n = (kvc__rnode *)kvc__alloc(t->part[0].pool, (size_t)bytes);
    if (n == NULL) return NULL;
    memset(n, 0, sizeof(*n));
    n->start = start;
    n->len = len;
    n->pages = (uint32_t **)(n + 1);
    at = (uint32_t *)(n->pages + t->n_parts);
    for (g = 0; g < t->n_parts; ++g) {
        n->pages[g] = at;
        np = kvc__rnode_np(t, g, start, len);
        for (i = 0; i < np; ++i) at[i] = KVC__NO_PAGE;
        at += np;
    }
    n->tokens = (int32_t *)at;
    return n;
}

static void kvc__rnode_link(kvc__rnode *parent, kvc__rnode *n) {
    n->parent = parent;
    n->next = parent->child;
    parent->child = n;
}
static void kvc__rnode_unlink(kvc__rnode *n) {
    kvc__rnode **link = &n->parent->child;
    while (*link != n) link = &(*link)->next;
    *link = n->next;
    n->next = NULL;
}

/* Drop the node's page and state references; returns how many pages went back to
   their pools; *held (may be NULL) = the references it had. */
static int32_t kvc__rnode_release_pages(kvc_radix *t, kvc__rnode *n, int32_t *held) {
    int32_t g, i, freed = 0, np;
    if (held) *held = 0;
    for (g = 0; g < t->n_parts; ++g) {
        kvc_pool *p = t->part[g].pool;
        np = kvc__rnode_np(t, g, n->start, n->len);
        for (i = 0; i < np; ++i) {
            if (n->pages[g][i] == KVC__NO_PAGE) continue;
            if (held) (*held)++;
            freed += p->refcount[n->pages[g][i]] == 1;
            kvc__page_release(p, n->pages[g][i]);
        }
    }
    return freed;
}

/* Follow tokens[0 .. n) down from the root under ns. Returns the node holding the last
   matching token (the root when none matches) and *matched; the match may end inside
   that node. */
static kvc__rnode *kvc__radix_walk(kvc_radix *t, kvc_namespace ns, const int32_t *tokens, int32_t n,
                                   int32_t *matched) {
    kvc__rnode *at = &t->root, *c;
    int32_t m = 0, k;
    while (m < n) {
        for (c = at->child; c != NULL; c = c->next)
            if (c->tokens[0] == tokens[m] && kvc__ns_equal(c->ns, ns)) break;
        if (c == NULL) break;
        for (k = 1; k < c->len && m + k < n && c->tokens[k] == tokens[m + k]; ++k) {}
        m += k;
        at = c;
        if (k < c->len) break;
    }
    *matched = m;
    return at;
}

/* The node of the path through `deep` that holds token m - 1 (the root when m == 0). */
static kvc__rnode *kvc__rnode_holding(kvc__rnode *deep, int32_t m) {
    while (deep->parent != NULL && deep->start >= m) deep = deep->parent;
    return deep;
}

/* Split n at token `at` (start < at < end): `head` (fresh, [start, at)) takes n's place
   and n keeps the tail, so entries in use or pinned at n stay where they were, and so do
   its states (they are after its end). A page holding both sides is shared by the two
   halves; nothing is copied. */
static void kvc__rnode_split(kvc_radix *t, kvc__rnode *n, kvc__rnode *head, int32_t at) {
    int32_t cut = at - n->start, g, i, np, drop;
    kvc__rnode **link = &n->parent->child;
    while (*link != n) link = &(*link)->next;
    *link = head;
    head->parent = n->parent;
    head->next = n->next;
    head->child = n;
    head->ns = n->ns;
    head->tick = n->tick;
    head->priority = n->priority;
    n->parent = head;
    n->next = NULL;
    memcpy(head->tokens, n->tokens, sizeof(int32_t) * (size_t)cut);
    for (g = 0; g < t->n_parts; ++g) {
        kvc_pool *p = t->part[g].pool;
        if (kvc__part_state(t, g)) continue; /* the head's end has no state yet */
        np = kvc__rnode_np(t, g, n->start, n->len);
        drop = at / p->page_cells - n->start / p->page_cells;
        for (i = 0; i < kvc__rnode_np(t, g, head->start, head->len); ++i) {
            head->pages[g][i] = n->pages[g][i];
            if (head->pages[g][i] != KVC__NO_PAGE) kvc__page_retain(p, head->pages[g][i]);
        }
        for (i = 0; i < drop; ++i)
            if (n->pages[g][i] != KVC__NO_PAGE) kvc__page_release(p, n->pages[g][i]);
        memmove(n->pages[g], n->pages[g] + drop, sizeof(uint32_t) * (size_t)(np - drop));
    }
    memmove(n->tokens, n->tokens + cut, sizeof(int32_t) * (size_t)(n->len - cut));
    n->len -= cut;
    n->start = at;
}

/* Where a cache of part g at offset m needs pages: logical pages [0, *sink_end) and
   [*first, last]; FULL: all of them. ROTATING: the sinks and the window of the next
   query (the keys after max(sinks, m - window + sinks) - 1). */
static void kvc__needed_pages(const kvc_radix *t, int32_t g, int32_t m, int32_t *sink_end, int32_t *first) {
    int32_t pc = t->part[g].pool->page_cells, last = (m - 1) / pc, nsp, lo;
    const kvc_cache_config *cc = &t->part[g].cfg;
    if (cc->kind != KVC_KIND_ROTATING) { *sink_end = 0; *first = 0; return; }
    nsp = (cc->sinks + pc - 1) / pc;
    lo = (int32_t)KVC__MAX((int64_t)cc->sinks, (int64_t)m - cc->window + cc->sinks);
    *sink_end = KVC__MIN(nsp, last + 1);
    *first = KVC__MAX(nsp, lo / pc);
}

/* Part g's page of logical page lp on the path of *at: the deepest node covering it.
   Called with lp descending, *at (holding the prefix's last token at first) moves up the
   path as lp goes below its nodes: one pass over the path for all of a prefix's pages.
   No table indexed by logical page: a ROTATING path can span far more logical pages than
   the pool has pages (its windows released them), so such a table could not be bounded. */
static uint32_t kvc__path_page(const kvc__rnode **at, int32_t g, int32_t lp, int32_t pc) {
    while ((*at)->start / pc > lp) *at = (*at)->parent;
    return (*at)->pages[g][lp - (*at)->start / pc];
}

/* The longest prefix below m that part g might serve, given what the path of `at` (which
   holds token m - 1) lacks; m when it lacks nothing. A page lp missing from node X (the
   deepest covering lp) is missing for every prefix that still needs lp and still ends
   past X's start: the next candidate is the larger of lp's first token and X's start,
   where an ancestor's page for lp may serve. */
static int32_t kvc__radix_missing(const kvc_radix *t, int32_t g, const kvc__rnode *at, int32_t m) {
    int32_t pc = t->part[g].pool->page_cells, lp, sink_end, first;
    kvc__needed_pages(t, g, m, &sink_end, &first);
    for (lp = (m - 1) / pc; lp >= first; --lp)
        if (kvc__path_page(&at, g, lp, pc) == KVC__NO_PAGE) return KVC__MAX(lp * pc, at->start);
    for (lp = sink_end - 1; lp >= 0; --lp)
        if (kvc__path_page(&at, g, lp, pc) == KVC__NO_PAGE) return KVC__MAX(lp * pc, at->start);
    return m;
}

/* The longest prefix of at most m tokens ending in `*at`'s path that every part can
   serve: ROTATING parts shrink it below their highest missing page (kvc__radix_missing)
   until their window is whole, RECURRENT parts to the end of a node that holds their
   states. Leaves *at
   holding its last token. */
static int32_t kvc__radix_usable(kvc_radix *t, kvc__rnode **at, int32_t m) {
    int32_t g, next;
    while (m > 0) {
        *at = kvc__rnode_holding(*at, m);
        next = m;
        for (g = 0; g < t->n_parts; ++g) {
            if (kvc__part_state(t, g)) {
                if (kvc__rnode_end(*at) != m || (*at)->pages[g][0] == KVC__NO_PAGE) next = KVC__MIN(next, (*at)->start);
            } else {
                next = KVC__MIN(next, kvc__radix_missing(t, g, *at, m));
            }
        }
        if (next == m) break;
        m = next;
    }
    if (m == 0) *at = &t->root;
    return m;
}

/* Give an empty cache of part g the pages (or the state) of the path of `at` for offset
   m (m > 0, a usable prefix: every page it needs is there, distinct pool pages, so at
   most max_pages of them), as if it had appended m tokens and then rewound to m (anchor
   m - 1). */
static void kvc__radix_fill(kvc_radix *t, int32_t g, kvc_cache *c, const kvc__rnode *at, int32_t m) {
    int32_t pc, last, sink_end, first, lp, idx;
    kvc_pool *p = t->part[g].pool;
    c->offset = m;
    c->batch_begin = m - 1;
    if (kvc__part_state(t, g)) { /* at ends at m with a state (kvc__radix_usable) */
        c->state_page[0] = at->pages[g][0];
        c->state_off[0] = m;
        kvc__page_retain(p, c->state_page[0]);
        return;
    }
    pc = p->page_cells;
    last = (m - 1) / pc;
    kvc__needed_pages(t, g, m, &sink_end, &first);
    c->n_pages = sink_end + (first <= last ? last - first + 1 : 0);
    KVCACHE_ASSERT(c->n_pages <= c->pages_cap); /* reserved by the caller: (m - 1) / pc + 1 */
    idx = c->n_pages; /* filled from the back: window pages, then sink pages */
    for (lp = last; lp >= first; --lp) c->pages[--idx] = kvc__path_page(&at, g, lp, pc);
    for (lp = sink_end - 1; lp >= 0; --lp) c->pages[--idx] = kvc__path_page(&at, g, lp, pc);
    c->first_lpage = first <= last ? first : c->n_sink_pages;
    for (lp = 0; lp < c->n_pages; ++lp) kvc__page_retain(p, c->pages[lp]);
    c->tail_lo = c->tail_hi = 0; /* the tree's tokens: as stored (no f16 tail rows) */
}

/* Mark the entry at n (and so its path) as used now, by a commit of `priority`. */
static void kvc__radix_touch(kvc_radix *t, kvc__rnode *n, int32_t priority, int commit) {
    uint64_t tick = ++t->budget->clock;
    for (; n->parent != NULL; n = n->parent) {
        n->tick = tick;
        if (commit && priority > n->priority) n->priority = priority;
    }
}

static void kvc__lease_set(kvc_cache *c, kvc_radix *t, kvc__rnode *n) {
    kvc__lease_drop(c);
    if (n == &t->root) return;
    n->users++;
    t->n_leases++;
    c->lease = n;
    c->lease_tree = t;
}

static void kvc__lease_drop(kvc_cache *c) {
    if (c->lease == NULL) return;
    c->lease->users--;
    c->lease_tree->n_leases--;
    c->lease = NULL;
    c->lease_tree = NULL;
}

/* ---- eviction ---- */

/* blocked = the node or one of its descendants is in use or pinned: never evicted. */
static void kvc__radix_mark_blocked(kvc_radix *t) {
    kvc__rnode *n, *up;
    for (n = t->root.child; n != NULL; n = kvc__rnode_next(&t->root, n)) n->blocked = 0;
    for (n = t->root.child; n != NULL; n = kvc__rnode_next(&t->root, n))
        if (n->users || n->pins)
            for (up = n; up->parent != NULL && !up->blocked; up = up->parent) up->blocked = 1;
}

/* What evicting everything evictable in the trees drawing on p's budget would give back:
   *bytes over all their pools, *pages of p: the pages whose every reference comes from
   unblocked nodes. Counted in each pool's tree_count scratch, left zeroed. */
static void kvc__reclaimable(kvc_pool *p, int64_t *bytes, int64_t *pages) {
    kvc_radix *t;
    kvc__rnode *n;
    int32_t g, i, np, pass;
    *bytes = *pages = 0;
    for (t = p->budget->trees; t != NULL; t = t->next) kvc__radix_mark_blocked(t);
    for (pass = 0; pass < 2; ++pass) /* count references, then compare and reset */
        for (t = p->budget->trees; t != NULL; t = t->next)
            for (n = t->root.child; n != NULL; n = kvc__rnode_next(&t->root, n)) {
                if (n->blocked) continue;
                for (g = 0; g < t->n_parts; ++g) {
                    kvc_pool *q = t->part[g].pool;
                    np = kvc__rnode_np(t, g, n->start, n->len);
                    for (i = 0; i < np; ++i) {
                        uint32_t pg = n->pages[g][i];
                        if (pg == KVC__NO_PAGE) continue;
                        if (pass == 0) { q->tree_count[pg]++; continue; }
                        if (q->tree_count[pg] == 0) continue; /* already compared */
                        if (q->tree_count[pg] == q->refcount[pg]) {
                            *bytes += (int64_t)q->page_bytes;
                            *pages += q == p;
                        }
                        q->tree_count[pg] = 0;
                    }
                }
            }
}

/* Eviction order: the lowest priority first, then the least recently used. */
static int kvc__evict_before(const kvc__rnode *a, const kvc__rnode *b) {
    return b == NULL || a->priority < b->priority || (a->priority == b->priority && a->tick < b->tick);
}

/* The next leaf of t to evict (neither in use nor pinned), or NULL. */
static kvc__rnode *kvc__radix_lru_leaf(kvc_radix *t) {
    kvc__rnode *n, *best = NULL;
    for (n = t->root.child; n != NULL; n = kvc__rnode_next(&t->root, n))
        if (n->child == NULL && n->users == 0 && n->pins == 0 && kvc__evict_before(n, best)) best = n;
    return best;
}

static int32_t kvc__radix_evict_node(kvc_radix *t, kvc__rnode *n) {
    int32_t freed, held;
    if (t->tier != NULL) kvc__tier_keep(t, n); /* a copy down the tiers first */
    kvc__rnode_unlink(n);
    freed = kvc__rnode_release_pages(t, n, &held);
    t->stats.pages_evicted += (uint64_t)held;
    t->stats.entries_evicted++;
    kvc__free(t->part[0].pool, n);
    return freed;
}

/* Whether p could have `need` pages free (need_bytes of its budget, when the caller
   asks for bytes of several pools at once) after evicting what can be evicted. */
static int kvc__can_reclaim_for(kvc_pool *p, int64_t need, int64_t need_bytes) {
    int64_t bytes, pages, by_budget;
    size_t free_bytes = p->budget->cap - p->budget->used;
    if (need <= kvc__pages_free(p) && (uint64_t)need_bytes <= free_bytes) return 1;
    if (p->budget->trees == NULL) return 0;
    kvc__reclaimable(p, &bytes, &pages);
    by_budget = (int64_t)(((uint64_t)free_bytes + (uint64_t)bytes) / p->page_bytes);
    return KVC__MIN(by_budget, (int64_t)p->n_free + pages) >= need &&
           (uint64_t)need_bytes <= (uint64_t)free_bytes + (uint64_t)bytes;
}
static int kvc__can_reclaim(kvc_pool *p, int64_t need) { return kvc__can_reclaim_for(p, need, 0); }

/* Evict the next leaf of the trees on budget b, in eviction order. */
static void kvc__evict_one(kvc__budget *b) {
    kvc_radix *t, *best_t = NULL;
    kvc__rnode *leaf, *best = NULL;
    for (t = b->trees; t != NULL; t = t->next) {
        leaf = kvc__radix_lru_leaf(t);
        if (leaf != NULL && kvc__evict_before(leaf, best)) { best = leaf; best_t = t; }
    }
    KVCACHE_ASSERT(best != NULL); /* the callers counted these pages */
    kvc__radix_evict_node(best_t, best);
}

/* Make kvc__pages_free(p) >= need and the budget's free bytes >= need_bytes by evicting
   leaves of the trees on p's budget (every group of a memory); all or nothing. */
static int kvc__reclaim_for(kvc_pool *p, int64_t need, int64_t need_bytes) {
    if (!kvc__can_reclaim_for(p, need, need_bytes)) return 0;
    while (kvc__pages_free(p) < need || (uint64_t)(p->budget->cap - p->budget->used) < (uint64_t)need_bytes)
        kvc__evict_one(p->budget);
    return 1;
}
static int kvc__reclaim(kvc_pool *p, int64_t need) { return kvc__reclaim_for(p, need, 0); }

/* ---- creating and destroying trees ---- */

KVCDEF kvc_result kvc_radix_config_init(kvc_radix_config *cfg, kvc_kind kind) {
    if (cfg == NULL) return KVC_ERR_NULL;
    memset(cfg, 0, sizeof(*cfg));
    cfg->cache.kind = kind;
    return KVC_OK;
}

/* A pool's scratch for counting references per page, shared by the trees on it. */
static int kvc__tree_scratch_ref(kvc_pool *p) {
    if (p->tree_refs == 0) {
        p->tree_count = (uint32_t *)kvc__alloc(p, sizeof(uint32_t) * (size_t)p->max_pages);
        if (p->tree_count == NULL) return 0;
        memset(p->tree_count, 0, sizeof(uint32_t) * (size_t)p->max_pages);
    }
    p->tree_refs++;
    return 1;
}
static void kvc__tree_scratch_unref(kvc_pool *p) {
    if (--p->tree_refs > 0) return;
    kvc__free(p, p->tree_count);
    p->tree_count = NULL;
}

/* The tree t (its parts set) on the budget's list, its pools' scratch and counts. */
static kvc_result kvc__radix_register(kvc_radix *t) {
    int32_t g;
    for (g = 0; g < t->n_parts; ++g)
        if (!kvc__tree_scratch_ref(t->part[g].pool)) {
            while (g-- > 0) kvc__tree_scratch_unref(t->part[g].pool);
            return KVC_ERR_NO_MEMORY;
        }
    for (g = 0; g < t->n_parts; ++g) t->part[g].pool->live_prefixes++;
    t->next = t->budget->trees;
    t->budget->trees = t;
    return KVC_OK;
}

static kvc_result kvc__radix_new(kvc_pool *alloc_from, const kvc_radix_config *cfg, kvc_radix **out) {
    kvc_radix *t;
    if (cfg->max_entries < 0) return KVC_ERR_INVALID;
    t = (kvc_radix *)kvc__alloc(alloc_from, sizeof(kvc_radix));
    if (t == NULL) return KVC_ERR_NO_MEMORY;
    memset(t, 0, sizeof(*t));
    t->cfg = *cfg;
    *out = t;
    return KVC_OK;
}

static kvc_result kvc__radix_create_held(kvc_pool *pool, const kvc_radix_config *cfg, kvc_radix **out) {
    kvc_radix *t;
    const kvc_cache_config *cc;
    kvc_result r;
    if (pool == NULL || cfg == NULL || out == NULL) return KVC_ERR_NULL;
    cc = &cfg->cache;
    if (cfg->max_entries < 0) return KVC_ERR_INVALID;
    if (pool->cfg.state_floats > 0) return KVC_ERR_UNSUPPORTED; /* a state pool: a memory's tree serves it */
    if (cc->kind == KVC_KIND_FULL) {
        if (cc->window != 0 || cc->sinks != 0) return KVC_ERR_INVALID;
    } else if (cc->kind == KVC_KIND_ROTATING) {
        if (cc->window < 1 || cc->sinks < 0 || cc->sinks >= cc->window) return KVC_ERR_INVALID;
    } else {
        return cc->kind == KVC_KIND_CAUSAL ? KVC_ERR_UNSUPPORTED : KVC_ERR_INVALID;
    }
    if ((r = kvc__radix_new(pool, cfg, &t)) != KVC_OK) return r;
    memset(&t->cfg.cache, 0, sizeof(t->cfg.cache)); /* only what a FULL/ROTATING cache reads */
    t->cfg.cache.kind = cc->kind;
    t->cfg.cache.window = cc->window;
    t->cfg.cache.sinks = cc->sinks;
    t->n_parts = 1;
    t->part[0].pool = pool;
    t->part[0].cfg = t->cfg.cache;
    t->budget = pool->budget;
    if ((r = kvc__radix_register(t)) != KVC_OK) { kvc__free(pool, t); return r; }
    *out = t;
    return KVC_OK;
}

static kvc_result kvc__radix_create_memory_held(const kvc_memory *mem, const kvc_radix_config *cfg,
                                                kvc_radix **out) {
    kvc_radix *t;
    kvc_result r;
    int32_t g;
    if (mem == NULL || cfg == NULL || out == NULL) return KVC_ERR_NULL;
    for (g = 0; g < mem->mp->n_groups; ++g)
        if (mem->cache[g]->cfg.kind == KVC_KIND_CAUSAL) return KVC_ERR_UNSUPPORTED;
    if ((r = kvc__radix_new(mem->mp->pool[0], cfg, &t)) != KVC_OK) return r;
    memset(&t->cfg.cache, 0, sizeof(t->cfg.cache)); /* the groups' configs serve instead */
    t->n_parts = mem->mp->n_groups;
    for (g = 0; g < t->n_parts; ++g) {
        t->part[g].pool = mem->mp->pool[g];
        t->part[g].cfg = mem->cache[g]->cfg;
    }
    t->budget = &mem->mp->budget;
    t->mp = mem->mp;
    if ((r = kvc__radix_register(t)) != KVC_OK) { kvc__free(mem->mp->pool[0], t); return r; }
    mem->mp->refs++; /* the pools stay while the tree holds their pages */
    *out = t;
    return KVC_OK;
}

KVCDEF kvc_result kvc_radix_create_memory(const kvc_memory *mem, const kvc_radix_config *cfg, kvc_radix **out) {
    /* the groups share one lock */
    KVC__POOL_LOCKED(mem, mem->mp->pool[0], kvc__radix_create_memory_held(mem, cfg, out));
}

KVCDEF kvc_result kvc_radix_create(kvc_pool *pool, const kvc_radix_config *cfg, kvc_radix **out) {
    KVC__POOL_LOCKED(pool, pool, kvc__radix_create_held(pool, cfg, out));
}

static kvc_result kvc__radix_destroy_held(kvc_radix *t) {
    kvc_radix **link;
    kvc__mpools *mp;
    int32_t g;
    if (t == NULL) return KVC_ERR_NULL;
    if (t->n_leases > 0) return KVC_ERR_BUSY;
    while (t->root.child != NULL) { /* leaves first */
        kvc__rnode *n = t->root.child;
        while (n->child != NULL) n = n->child;
        kvc__rnode_unlink(n);
        kvc__rnode_release_pages(t, n, NULL);
        kvc__free(t->part[0].pool, n);
    }
    for (link = &t->budget->trees; *link != t; link = &(*link)->next) {}
    *link = t->next;
    for (g = 0; g < t->n_parts; ++g) {
        t->part[g].pool->live_prefixes--;
        kvc__tree_scratch_unref(t->part[g].pool);
    }
    mp = t->mp;
    kvc__tier_free(t);
    kvc__free(t->part[0].pool, t);
    if (mp != NULL) kvc__mpools_unref(mp);
    return KVC_OK;
}

KVCDEF kvc_result kvc_radix_destroy(kvc_radix *t) {
    kvc_result r;
    kvc__mlock lk;
    const kvc_pool_config *pc;
    if (t == NULL) return kvc__radix_destroy_held(t);
    pc = &t->part[0].pool->cfg; /* a memory's tree may take the pools with it: keep the unlock */
    lk.unlock = pc->runtime.unlock;
    lk.user = pc->runtime.lock_user;
    lk.mp = NULL;
    if (pc->runtime.lock != NULL) pc->runtime.lock(pc->runtime.lock_user);
    r = kvc__radix_destroy_held(t);
    kvc__memory_unlock(lk);
    return r;
}

/* ---- lookups ---- */

static kvc_result kvc__check_tokens(const int32_t *tokens, int32_t n_tokens, int32_t min) {
    if (n_tokens < min) return KVC_ERR_INVALID;
    return tokens == NULL && n_tokens > 0 ? KVC_ERR_NULL : KVC_OK;
}

/* The prefix of tokens a lookup reuses: the longest every part can serve, leaving at
   least one token to evaluate (none for an empty prompt). */
static int32_t kvc__radix_find(kvc_radix *t, kvc_namespace ns, const int32_t *tokens, int32_t n_tokens,
                               kvc__rnode **at) {
    int32_t m;
    *at = kvc__radix_walk(t, ns, tokens, n_tokens - 1, &m);
    return kvc__radix_usable(t, at, m);
}

/* A lookup that succeeded, in the counters. */
static void kvc__radix_count(kvc_radix *t, int32_t n_tokens, int32_t m) {
    t->stats.lookups++;
    t->stats.tokens_queried += (uint64_t)n_tokens;
    t->stats.tokens_hit += (uint64_t)m;
}

static kvc_result kvc__radix_lookup_held(kvc_radix *t, kvc_namespace ns, const int32_t *tokens, int32_t n_tokens,
                                   kvc_cache **out, int32_t *n_reused) {
    kvc__rnode *at;
    kvc_cache *c;
    int32_t m;
    kvc_result r;
    if (t == NULL || out == NULL || n_reused == NULL) return KVC_ERR_NULL;
    if ((r = kvc__check_tokens(tokens, n_tokens, 0)) != KVC_OK) return r;
    if (t->mp != NULL) return KVC_ERR_UNSUPPORTED; /* a memory's tree: kvc_radix_lookup_memory */
    if ((r = kvc_cache_create(t->part[0].pool, &t->part[0].cfg, &c)) != KVC_OK) return r;
    m = kvc__radix_find(t, ns, tokens, n_tokens, &at);
    if (m > 0 && (r = kvc__page_table_reserve(c, (m - 1) / t->part[0].pool->page_cells + 1)) != KVC_OK) {
        kvc_cache_destroy(c);
        return r;
    }
    kvc__radix_count(t, n_tokens, m);
    if (m > 0) {
        kvc__radix_fill(t, 0, c, at, m);
        kvc__radix_touch(t, at, 0, 0);
        kvc__lease_set(c, t, at);
    }
    *n_reused = m;
    *out = c;
    return KVC_OK;
}

KVCDEF kvc_result kvc_radix_lookup(kvc_radix *t, kvc_namespace ns, const int32_t *tokens, int32_t n_tokens,
                                   kvc_cache **out, int32_t *n_reused) {
    kvc_result r;
    const kvc_pool *lp;
    if (t == NULL) return kvc__radix_lookup_held(t, ns, tokens, n_tokens, out, n_reused);
    lp = t->part[0].pool;
    kvc__pool_lock(lp);
    r = kvc__radix_lookup_held(t, ns, tokens, n_tokens, out, n_reused);
    kvc__pool_unlock(lp);
    return r;
}

/* Room in the page tables of a memory's attention groups for a prefix of m tokens. */
static kvc_result kvc__radix_reserve_tables(const kvc_radix *t, kvc_memory *mem, int32_t m) {
    int32_t g;
    kvc_result r;
    for (g = 0; g < t->n_parts && m > 0; ++g)
        if (!kvc__part_state(t, g) &&
            (r = kvc__page_table_reserve(mem->cache[g], (m - 1) / t->part[g].pool->page_cells + 1)) != KVC_OK)
            return r;
    return KVC_OK;
}

/* Fill the caches of mem (emptied, with room in their page tables for m tokens) with the
   prefix of length m ending at `at`, which mem then holds in use. */
static void kvc__radix_fill_memory(kvc_radix *t, kvc_memory *mem, kvc__rnode *at, int32_t m) {
    int32_t g;
    if (m == 0) return;
    for (g = 0; g < t->n_parts; ++g) kvc__radix_fill(t, g, mem->cache[g], at, m);
    kvc__radix_touch(t, at, 0, 0);
    for (g = 0; g < t->n_parts; ++g) kvc__lease_set(mem->cache[g], t, at);
}

static kvc_result kvc__radix_lookup_memory_held(kvc_radix *t, kvc_namespace ns, const int32_t *tokens,
                                                int32_t n_tokens, kvc_memory **out, int32_t *n_reused) {
    kvc__rnode *at;
    kvc_memory *mem;
    int32_t m, g;
    kvc_result r = KVC_OK;
    if (t == NULL || out == NULL || n_reused == NULL) return KVC_ERR_NULL;
    if ((r = kvc__check_tokens(tokens, n_tokens, 0)) != KVC_OK) return r;
    if (t->mp == NULL) return KVC_ERR_UNSUPPORTED; /* a pool's tree: kvc_radix_lookup */
    if ((mem = kvc__memory_alloc(t->mp)) == NULL) return KVC_ERR_NO_MEMORY;
    for (g = 0; g < t->n_parts && r == KVC_OK; ++g)
        r = kvc_cache_create(t->part[g].pool, &t->part[g].cfg, &mem->cache[g]);
    if (r != KVC_OK) { kvc_memory_destroy(mem); return r; }
    m = kvc__radix_find(t, ns, tokens, n_tokens, &at);
    if ((r = kvc__radix_reserve_tables(t, mem, m)) != KVC_OK) { kvc_memory_destroy(mem); return r; }
    kvc__radix_count(t, n_tokens, m);
    kvc__radix_fill_memory(t, mem, at, m);
    *n_reused = m;
    *out = mem;
    return KVC_OK;
}

static kvc_result kvc__radix_lookup_into_held(kvc_radix *t, kvc_namespace ns, const int32_t *tokens,
                                              int32_t n_tokens, kvc_memory *mem, int32_t *n_reused) {
    kvc__rnode *at;
    int32_t m;
    kvc_result r;
    if (t == NULL || mem == NULL || n_reused == NULL) return KVC_ERR_NULL;
    if ((r = kvc__check_tokens(tokens, n_tokens, 0)) != KVC_OK) return r;
    if (t->mp == NULL) return KVC_ERR_UNSUPPORTED; /* a pool's tree: kvc_radix_lookup */
    if (mem->mp != t->mp) return KVC_ERR_FOREIGN;
    if (kvc__memory_open(mem)) return KVC_ERR_STATE;
    m = kvc__radix_find(t, ns, tokens, n_tokens, &at);
    /* the one step that can fail comes first: mem is untouched when it does */
    if ((r = kvc__radix_reserve_tables(t, mem, m)) != KVC_OK) return r;
    mem->mp->inside++; /* a memory call: its own changes to its groups pass kvc__owned */
    (void)kvc__memory_clear_held(mem); /* evicts nothing: the entry found stays */
    mem->mp->inside--;
    kvc__radix_count(t, n_tokens, m);
    kvc__radix_fill_memory(t, mem, at, m);
    *n_reused = m;
    return KVC_OK;
}

KVCDEF kvc_result kvc_radix_lookup_into_memory(kvc_radix *t, kvc_namespace ns, const int32_t *tokens,
                                               int32_t n_tokens, kvc_memory *mem, int32_t *n_reused) {
    kvc_result r;
    const kvc_pool *lp;
    if (t == NULL) return kvc__radix_lookup_into_held(t, ns, tokens, n_tokens, mem, n_reused);
    lp = t->part[0].pool;
    kvc__pool_lock(lp);
    r = kvc__radix_lookup_into_held(t, ns, tokens, n_tokens, mem, n_reused);
    kvc__pool_unlock(lp);
    return r;
}

KVCDEF kvc_result kvc_radix_lookup_memory(kvc_radix *t, kvc_namespace ns, const int32_t *tokens, int32_t n_tokens,
                                          kvc_memory **out, int32_t *n_reused) {
    kvc_result r;
    const kvc_pool *lp;
    if (t == NULL) return kvc__radix_lookup_memory_held(t, ns, tokens, n_tokens, out, n_reused);
    lp = t->part[0].pool;
    kvc__pool_lock(lp);
    r = kvc__radix_lookup_memory_held(t, ns, tokens, n_tokens, out, n_reused);
    kvc__pool_unlock(lp);
    return r;
}

/* ---- commits ---- */

/* max_entries: keep the paths of the max_entries latest commits (and what is in use or
   pinned); evict every other leaf, in eviction order, until none is left. */
static void kvc__radix_trim_entries(kvc_radix *t) {
    kvc__rnode *n, *best, *up;
    int32_t k;
    if (t->cfg.max_entries == 0) return;
    for (n = t->root.child; n != NULL; n = kvc__rnode_next(&t->root, n)) n->kept = 0;
    for (k = 0; k < t->cfg.max_entries; ++k) { /* the k-th latest commit end */
        best = NULL;
        for (n = t->root.child; n != NULL; n = kvc__rnode_next(&t->root, n))
            if (n->entry_tick && !n->kept && (best == NULL || n->entry_tick > best->entry_tick)) best = n;
        if (best == NULL) break;
        for (up = best; up->parent != NULL; up = up->parent) up->kept = 1;
    }
    for (;;) {
        best = NULL;
        for (n = t->root.child; n != NULL; n = kvc__rnode_next(&t->root, n))
            if (n->child == NULL && !n->kept && n->users == 0 && n->pins == 0 && kvc__evict_before(n, best))
                best = n;
        if (best == NULL) break;
        kvc__radix_evict_node(t, best);
    }
}

/* The offsets a commit ends nodes at, ascending: where every RECURRENT cache kept a
   checkpoint the engine named, below n (the states a later request that branches there
   resumes from). */
typedef struct kvc__bounds {
    int32_t n, at[64];
} kvc__bounds;

static void kvc__commit_bounds(const kvc_radix *t, kvc_cache *const *c, int32_t n, kvc__bounds *b) {
    int32_t g, i, first = -1;
    b->n = 0;
    for (g = 0; g < t->n_parts && first < 0; ++g)
        if (kvc__part_state(t, g)) first = g;
    if (first < 0) return;
    for (i = 0; i < c[first]->n_ckpt; ++i) {
        int32_t at = c[first]->ckpt[i]->to;
        /* named ones only: a reserve's per-token checkpoints are for rollback, not reuse */
        int ok = at > 0 && at < n && (c[first]->ckpt[i]->ckflags & KVC__CK_NAMED);
        for (g = first + 1; g < t->n_parts && ok; ++g)
            if (kvc__part_state(t, g)) ok = kvc__ckpt_find(c[g], at) >= 0;
        if (ok && b->n < 64) b->at[b->n++] = at; /* checkpoints are kept oldest first */
        else if (ok) { memmove(b->at, b->at + 1, sizeof(int32_t) * 63); b->at[63] = at; }
    }
}

/* Part g's state after `at` tokens of cache c: live at its offset, else a named
   checkpoint's (as kvc__commit_bounds: the tree keeps the states the engine chose). */
static uint32_t kvc__commit_state(const kvc_cache *c, int32_t at) {
    int32_t k;
    if (at == c->offset) return c->state_page[0];
    k = kvc__ckpt_find(c, at);
    return k >= 0 && (c->ckpt[k]->ckflags & KVC__CK_NAMED) ? c->ckpt[k]->pages[0] : KVC__NO_PAGE;
}

/* A page of cache c for logical page lp whose tokens below `limit` are valid: the
   cache's own, or one of its checkpoints' at `limit` or later (ROTATING: the window
   may have released the page since). */
static uint32_t kvc__commit_page(const kvc_cache *c, int32_t lp, int32_t limit) {
    int32_t idx = kvc__lpage_index(c, lp), k;
    if (idx >= 0) return c->pages[idx];
    for (k = c->n_ckpt - 1; k >= 0; --k) {
        const kvc_snapshot *s = c->ckpt[k];
        int32_t j;
        if (s->to < limit) break;
        if (lp < c->n_sink_pages) j = lp < s->n_pages ? lp : -1;
        else j = lp >= s->first_lpage ? c->n_sink_pages + (lp - s->first_lpage) : -1;
        if (j >= 0 && j < s->n_pages) return s->pages[j];
    }
    return KVC__NO_PAGE;
}

/* Fill node n's missing pages and state from the committing caches: what the tree lacks
   (a window released it, or an earlier commit kept no state there) and they hold for the
   same tokens, all below `valid` (the tokens the caches and the path share). */
static void kvc__commit_fill_node(kvc_radix *t, kvc__rnode *n, kvc_cache *const *c, int32_t valid) {
    int32_t g, i, np, end = kvc__rnode_end(n);
    for (g = 0; g < t->n_parts; ++g) {
        kvc_pool *p = t->part[g].pool;
        uint32_t pg;
        if (kvc__part_state(t, g)) {
            if (n->pages[g][0] != KVC__NO_PAGE || end > valid) continue;
            if ((pg = kvc__commit_state(c[g], end)) == KVC__NO_PAGE) continue;
            n->pages[g][0] = pg;
            kvc__page_retain(p, pg);
            continue;
        }
        np = kvc__rnode_np(t, g, n->start, n->len);
        for (i = 0; i < np; ++i) {
            int32_t lp = n->start / p->page_cells + i;
            int32_t limit = (int32_t)KVC__MIN((int64_t)end, ((int64_t)lp + 1) * p->page_cells);
            if (n->pages[g][i] != KVC__NO_PAGE || limit > valid) continue;
            if ((pg = kvc__commit_page(c[g], lp, limit)) == KVC__NO_PAGE) continue;
            n->pages[g][i] = pg;
            kvc__page_retain(p, pg);
        }
    }
}

/* Where a commit of tokens[0 .. n) ends nodes: the bounds at or below the match m that
   fall inside a node, and the end of the shared part m (n > m, or when the entry must end
   exactly at n). *heads gets one fresh node per split, *chain the new nodes for [m, n)
   (cut at the bounds above m), all allocated before anything changes. */
typedef struct kvc__commit_plan {
    int32_t n_split, split_at[66];
    kvc__rnode *head[66];
    int32_t n_chain;
    kvc__rnode *chain[66];
} kvc__commit_plan;

static void kvc__plan_free(kvc_radix *t, kvc__commit_plan *pl) {
    int32_t i;
    for (i = 0; i < pl->n_split; ++i) kvc__free(t->part[0].pool, pl->head[i]);
    for (i = 0; i < pl->n_chain; ++i) kvc__free(t->part[0].pool, pl->chain[i]);
}

static kvc_result kvc__commit_prepare(kvc_radix *t, kvc__rnode *deep, int32_t m, int32_t n, const kvc__bounds *b,
                                      int end_exact, kvc__commit_plan *pl) {
    int32_t cut[66], n_cut = 0, i, s, e, prev = -1, lo;
    pl->n_split = pl->n_chain = 0;
    for (i = 0; i < b->n && b->at[i] <= m; ++i) cut[n_cut++] = b->at[i];
    if (m > 0 && (m < n || end_exact) && (n_cut == 0 || cut[n_cut - 1] != m)) cut[n_cut++] = m;
    for (i = 0; i < n_cut; ++i) { /* the node holding cut[i] after the splits before it */
        kvc__rnode *h = kvc__rnode_holding(deep, cut[i]);
        if (h->parent == NULL || cut[i] >= kvc__rnode_end(h)) continue; /* a node ends there */
        lo = KVC__MAX(h->start, prev);
        pl->split_at[pl->n_split] = cut[i];
        if ((pl->head[pl->n_split++] = kvc__rnode_new(t, lo, cut[i] - lo)) == NULL) goto no_memory;
        prev = cut[i];
    }
    for (s = m, i = 0; s < n; s = e) { /* the new nodes [m, n), cut at the bounds */
        while (i < b->n && b->at[i] <= s) ++i;
        e = i < b->n && b->at[i] < n ? b->at[i] : n;
        if ((pl->chain[pl->n_chain++] = kvc__rnode_new(t, s, e - s)) == NULL) goto no_memory;
    }
    return KVC_OK;
no_memory:
    if (pl->n_split > 0 && pl->head[pl->n_split - 1] == NULL) pl->n_split--;
    if (pl->n_chain > 0 && pl->chain[pl->n_chain - 1] == NULL) pl->n_chain--;
    kvc__plan_free(t, pl);
    return KVC_ERR_NO_MEMORY;
}

/* kvc_radix_commit and kvc_radix_commit_memory: c[g] is part g's cache; pin: also pin
   the committed sequence (loads). */
static kvc_result kvc__radix_commit(kvc_radix *t, kvc_namespace ns, kvc_cache *const *c, const int32_t *tokens,
                                    int32_t n_tokens, int32_t priority, int pin) {
    kvc__rnode *at, *deep;
    kvc__commit_plan plan;
    kvc__bounds bounds;
    int32_t n, m, g, i, lp, pc;
    int end_exact;
    kvc_result r;
    for (g = 0; g < t->n_parts; ++g) kvc__settle(c[g]); /* no visible change */
    n = KVC__MIN(n_tokens, kvc__cache_tokens(c[0])); /* only evaluated tokens have K/V */
    kvc__commit_bounds(t, c, n, &bounds);
    deep = kvc__radix_walk(t, ns, tokens, n, &m);
    /* the entry ends exactly at n when entries are limited (the MLX runner's single entry),
       pinned, or when the caches' states at n are to be kept there */
    end_exact = t->cfg.max_entries > 0 || pin || kvc__radix_has_states(t);
    if ((r = kvc__commit_prepare(t, deep, m, n, &bounds, end_exact, &plan)) != KVC_OK) return r;
    /* from here on it succeeds */
    for (i = 0; i < plan.n_split; ++i) {
        kvc__rnode *h = kvc__rnode_holding(deep, plan.split_at[i]);
        kvc__rnode_split(t, h, plan.head[i], plan.split_at[i]);
    }
    at = m > 0 ? kvc__rnode_holding(deep, m) : &t->root; /* ends at m now, if anything does */
    for (i = 0; i < plan.n_chain; ++i) { /* the new part: the caches' pages and states */
        kvc__rnode *leaf = plan.chain[i];
        int32_t s = leaf->start, e = kvc__rnode_end(leaf);
        leaf->ns = ns;
        memcpy(leaf->tokens, tokens + s, sizeof(int32_t) * (size_t)(e - s));
        for (g = 0; g < t->n_parts; ++g) {
            if (kvc__part_state(t, g)) continue;
            pc = t->part[g].pool->page_cells;
            for (lp = s / pc; lp <= (e - 1) / pc; ++lp) {
                int32_t idx = kvc__lpage_index(c[g], lp);
                if (idx < 0) continue; /* released by a rotating window: kvc__commit_fill_node */
                leaf->pages[g][lp - s / pc] = c[g]->pages[idx];
                kvc__page_retain(t->part[g].pool, c[g]->pages[idx]);
            }
        }
        kvc__rnode_link(at, leaf);
        at = leaf;
    }
    for (deep = at; deep->parent != NULL; deep = deep->parent) kvc__commit_fill_node(t, deep, c, n);
    if (n > 0) kvc__radix_touch(t, at, priority, 1);
    if (n > 0 && kvc__rnode_end(at) == n) at->entry_tick = t->budget->clock;
    if (n > 0 && pin) at->pins++;
    for (g = 0; g < t->n_parts; ++g) kvc__lease_set(c[g], t, n > 0 ? at : &t->root);
    t->stats.commits++;
    kvc__radix_trim_entries(t);
    return KVC_OK;
}

/* The checks of a commit of cache c into t, before anything changes. */
static kvc_result kvc__radix_commit_check(const kvc_radix *t, const kvc_cache *c, const int32_t *tokens,
                                          int32_t n_tokens) {
    kvc_result r;
    if (t == NULL || c == NULL) return KVC_ERR_NULL;
    if ((r = kvc__check_tokens(tokens, n_tokens, 0)) != KVC_OK) return r;
    if (t->mp != NULL) return KVC_ERR_UNSUPPORTED; /* a memory's tree: kvc_radix_commit_memory */
    if (c->pool != t->part[0].pool) return KVC_ERR_FOREIGN;
    if (c->cfg.kind != t->part[0].cfg.kind || c->cfg.window != t->part[0].cfg.window ||
        c->cfg.sinks != t->part[0].cfg.sinks)
        return KVC_ERR_INVALID;
    return kvc__batch_open(c) ? KVC_ERR_STATE : KVC_OK;
}

static kvc_result kvc__radix_commit_priority_held(kvc_radix *t, kvc_namespace ns, kvc_cache *c,
                                                 const int32_t *tokens, int32_t n_tokens, int32_t priority) {
    kvc_result r = kvc__radix_commit_check(t, c, tokens, n_tokens);
    return r != KVC_OK ? r : kvc__radix_commit(t, ns, &c, tokens, n_tokens, priority, 0);
}

KVCDEF kvc_result kvc_radix_commit(kvc_radix *t, kvc_namespace ns, kvc_cache *c, const int32_t *tokens,
                                   int32_t n_tokens, int32_t priority) {
    kvc_result r;
    const kvc_pool *lp;
    if (t == NULL) return kvc__radix_commit_priority_held(t, ns, c, tokens, n_tokens, priority);
    lp = t->part[0].pool;
    kvc__pool_lock(lp);
    r = kvc__radix_commit_priority_held(t, ns, c, tokens, n_tokens, priority);
    kvc__pool_unlock(lp);
    return r;
}


static kvc_result kvc__radix_commit_memory_held(kvc_radix *t, kvc_namespace ns, kvc_memory *mem,
                                               const int32_t *tokens, int32_t n_tokens, int32_t priority) {
    kvc_result r;
    if (t == NULL || mem == NULL) return KVC_ERR_NULL;
    if ((r = kvc__check_tokens(tokens, n_tokens, 0)) != KVC_OK) return r;
    if (t->mp == NULL) return KVC_ERR_UNSUPPORTED; /* a pool's tree: kvc_radix_commit */
    if (mem->mp != t->mp) return KVC_ERR_FOREIGN;
    if (kvc__memory_open(mem)) return KVC_ERR_STATE;
    return kvc__radix_commit(t, ns, mem->cache, tokens, n_tokens, priority, 0);
}

KVCDEF kvc_result kvc_radix_commit_memory(kvc_radix *t, kvc_namespace ns, kvc_memory *mem, const int32_t *tokens,
                                          int32_t n_tokens, int32_t priority) {
    kvc_result r;
    const kvc_pool *lp;
    if (t == NULL) return kvc__radix_commit_memory_held(t, ns, mem, tokens, n_tokens, priority);
    lp = t->part[0].pool;
    kvc__pool_lock(lp);
    r = kvc__radix_commit_memory_held(t, ns, mem, tokens, n_tokens, priority);
    kvc__pool_unlock(lp);
    return r;
}

static kvc_result kvc__radix_release_held(kvc_cache *cache) {
    if (cache == NULL) return KVC_ERR_NULL;
    kvc__lease_drop(cache);
    return KVC_OK;
}

KVCDEF kvc_result kvc_radix_release(kvc_cache *cache) {
    KVC__POOL_LOCKED(cache, cache->pool, kvc__radix_release_held(cache));
}

KVCDEF kvc_result kvc_radix_release_memory(kvc_memory *mem) {
    const kvc_pool *lp;
    int32_t g;
    if (mem == NULL) return KVC_ERR_NULL;
    lp = mem->mp->pool[0]; /* the groups share one lock */
    kvc__pool_lock(lp);
    for (g = 0; g < mem->mp->n_groups; ++g) kvc__lease_drop(mem->cache[g]);
    kvc__pool_unlock(lp);
    return KVC_OK;
}

/* ---- pins, eviction, statistics ---- */

/* The node ending exactly at n_tokens on the path of tokens, or NULL. */
static kvc__rnode *kvc__radix_find_end(kvc_radix *t, kvc_namespace ns, const int32_t *tokens, int32_t n_tokens) {
    int32_t m;
    kvc__rnode *at = kvc__radix_walk(t, ns, tokens, n_tokens, &m);
    return m == n_tokens && at->parent != NULL && kvc__rnode_end(at) == n_tokens ? at : NULL;
}

static kvc_result kvc__radix_pin_held(kvc_radix *t, kvc_namespace ns, const int32_t *tokens, int32_t n_tokens) {
    kvc__rnode *at, *head = NULL;
    int32_t m;
    kvc_result r;
    if (t == NULL) return KVC_ERR_NULL;
    if ((r = kvc__check_tokens(tokens, n_tokens, 1)) != KVC_OK) return r;
    at = kvc__radix_walk(t, ns, tokens, n_tokens, &m);
    if (m < n_tokens) return KVC_ERR_NOT_FOUND;
    if (m < kvc__rnode_end(at) && (head = kvc__rnode_new(t, at->start, m - at->start)) == NULL)
        return KVC_ERR_NO_MEMORY;
    if (head != NULL) { /* pin exactly these tokens: what follows stays evictable */
        kvc__rnode_split(t, at, head, m);
        at = head;
    }
    at->pins++;
    return KVC_OK;
}

KVCDEF kvc_result kvc_radix_pin(kvc_radix *t, kvc_namespace ns, const int32_t *tokens, int32_t n_tokens) {
    KVC__POOL_LOCKED(t, t->part[0].pool, kvc__radix_pin_held(t, ns, tokens, n_tokens));
}

static kvc_result kvc__radix_unpin_held(kvc_radix *t, kvc_namespace ns, const int32_t *tokens, int32_t n_tokens) {
    kvc__rnode *at;
    kvc_result r;
    if (t == NULL) return KVC_ERR_NULL;
    if ((r = kvc__check_tokens(tokens, n_tokens, 1)) != KVC_OK) return r;
    at = kvc__radix_find_end(t, ns, tokens, n_tokens);
    if (at == NULL || at->pins == 0) return KVC_ERR_NOT_FOUND;
    at->pins--;
    return KVC_OK;
}

KVCDEF kvc_result kvc_radix_unpin(kvc_radix *t, kvc_namespace ns, const int32_t *tokens, int32_t n_tokens) {
    KVC__POOL_LOCKED(t, t->part[0].pool, kvc__radix_unpin_held(t, ns, tokens, n_tokens));
}

static kvc_result kvc__radix_evict_held(kvc_radix *t, int32_t n_pages, int32_t *n_freed) {
    int32_t freed = 0;
    kvc__rnode *leaf;
    if (t == NULL) return KVC_ERR_NULL;
    if (n_pages < 0) return KVC_ERR_INVALID;
    while (freed < n_pages && (leaf = kvc__radix_lru_leaf(t)) != NULL) freed += kvc__radix_evict_node(t, leaf);
    if (n_freed) *n_freed = freed;
    return KVC_OK;
}

KVCDEF kvc_result kvc_radix_evict(kvc_radix *t, int32_t n_pages, int32_t *n_freed) {
    KVC__POOL_LOCKED(t, t->part[0].pool, kvc__radix_evict_held(t, n_pages, n_freed));
}

static kvc_result kvc__radix_stats_get_held(const kvc_radix *tree, kvc_radix_stats *s) {
    const kvc__rnode *n;
    int32_t g, i, np, pass;
    if (tree == NULL || s == NULL) return KVC_ERR_NULL;
    *s = tree->stats;
    s->n_nodes = s->n_entries = s->n_pages = s->n_pinned = s->n_states = 0;
    s->bytes = 0;
    s->n_in_use = tree->n_leases;
    for (pass = 0; pass < 2; ++pass) /* count distinct pages, then reset the pools' scratch */
        for (n = tree->root.child; n != NULL; n = kvc__rnode_next(&tree->root, n))
            for (g = 0; g < tree->n_parts; ++g) {
                kvc_pool *q = tree->part[g].pool;
                np = kvc__rnode_np(tree, g, n->start, n->len);
                for (i = 0; i < np; ++i) {
                    uint32_t pg = n->pages[g][i];
                    if (pg == KVC__NO_PAGE) continue;
                    if (pass == 1) { q->tree_count[pg] = 0; continue; }
                    if (q->tree_count[pg]++ != 0) continue;
                    s->n_pages++;
                    s->bytes += q->page_bytes;
                    s->n_states += kvc__part_state(tree, g);
                }
            }
    for (n = tree->root.child; n != NULL; n = kvc__rnode_next(&tree->root, n)) {
        s->n_nodes++;
        s->n_entries += n->child == NULL;
        s->n_pinned += (int32_t)n->pins;
    }
    return KVC_OK;
}

KVCDEF kvc_result kvc_radix_stats_get(const kvc_radix *tree, kvc_radix_stats *s) {
    KVC__POOL_LOCKED(tree, tree->part[0].pool, kvc__radix_stats_get_held(tree, s));
}

/* ---- Layer 6: attention kernels ----------------------------------------------------
   One driver, small kernels per path (scalar, SSE2, AVX2, AVX-512, AVX-512 VNNI, NEON,
   NEON with SDOT) chosen per pool.
   The driver walks the visible cells in blocks of KVC__BLOCK; in each block it reads
   every K row once for all the query heads of its GQA group (fused kernels convert
   the storage type in registers; the others through a small f32 tile), updates each
   row's online softmax once per block and accumulates V the same way. Work is split into tasks (a block of queries x a chunk
   of cells) whose sizes depend only on the shape, never on the thread count; split-K
   partials are merged by log-sum-exp in chunk order, so 1 and N threads agree bit for
   bit. */

#define KVC__BLOCK 32            /* cells scored together: one online-softmax step per row (16 was 5 % slower) */
#define KVC__CHUNK 1024          /* cells per split-K task (decode); 512 was 4 % slower at 16k cells on 2 threads */
#define KVC__DECODE_QUERIES 8    /* up to this many queries a call splits the cells */
#define KVC__PREFILL_QUERIES 16  /* otherwise tasks take this many queries over all cells */
#define KVC__STRIP 16            /* cells (whole rows) per fused kernel call, at most */
#define KVC__STRIP_BYTES 32768   /* a strip's K (or V) rows fill about this much (the L1) */
#define KVC__STACK_SCRATCH 16384 /* bytes of scratch a call keeps on its stack */
#define KVC__SCALES 32           /* block scales per row a fused kernel holds: head dims <= 1024 */

/* Lines [lo, hi) (64-byte aligned) that a fused kernel asks for (into L2) while it
   works: the driver hands each call its kv head's share of the rows the next strip
   reads; the AVX-512 kernels ask for a few lines at a time between their loads (one
   burst before each call was 5 % slower at 16k cells: 4.33 against 4.10 ms), the
   others for all of them first, and the driver asks for whatever a kernel left. */
typedef struct kvc__pf {
    uintptr_t lo, hi;
} kvc__pf;
/* ask for up to `lines` of them */
static inline void kvc__pf_some(kvc__pf *pf, int32_t lines) {
#if defined(__GNUC__) || defined(__clang__)
    for (; lines > 0 && pf->lo < pf->hi; --lines, pf->lo += 64) __builtin_prefetch((const void *)pf->lo, 0, 2);
#else
    pf->lo = KVC__MAX(pf->lo, pf->hi);
    (void)lines;
#endif
}
/* lines per step that spread them over `steps` steps */
static inline int32_t kvc__pf_pace(const kvc__pf *pf, int32_t steps) {
    return (int32_t)(((pf->hi - pf->lo) / 64 + (uintptr_t)steps - 1) / (uintptr_t)KVC__MAX(steps, 1));
}

typedef struct kvc__kernels {
    const char *name;
    /* s[c] = q . k[c] for c < n <= KVC__BLOCK, rows of d floats `stride` floats apart */
    void (*dot)(const float *q, const float *k, int32_t d, size_t stride, int32_t n, float *s);
    /* For rows r < nr <= 4 (s[r][c], c < n): max[r] = the largest s[r][c] whose bit is set
       in vis[r] (-inf if none); then s[r][c] = exp(s[r][c] * scale - m[r]) where vis[r]
       has bit c, else 0, and sum[r] = their sum. Four rows a call, so that kernels can
       reduce them together. */
    void (*masked_max)(float *const *s, const uint32_t *vis, int32_t nr, int32_t n, float *max);
    void (*exp_sum)(float *const *s, const uint32_t *vis, int32_t nr, int32_t n, float scale, const float *m,
                    float *sum);
    /* acc += sum over c < n of p[c] * v[c], rows of d floats `stride` floats apart */
    void (*axpy)(float *acc, const float *p, const float *v, int32_t d, size_t stride, int32_t n);
    void (*scale)(float *x, int32_t n, float a);
    /* Fused kernels by storage type (NULL: convert rows to an f32 tile, then dot/axpy),
       for head dims that are multiples of `lanes`. nr rows (1..4; the driver pads to 4
       with harmless rows when it has 2 or 3), n <= KVC__BLOCK cells `row` bytes apart:
       scores: s[r][c] = q[r] . k[c];  values: acc[r] += sum_c p[r][c] v[c]. */
    int32_t lanes;
    void (*scores[KVC_TYPE_COUNT])(const float *const *q, int32_t nr, const unsigned char *k, size_t k_row,
                                   int32_t d, int32_t n, float *const *s, kvc__pf *pf);
    void (*values[KVC_TYPE_COUNT])(float *const *acc, int32_t nr, const float *const *p, const unsigned char *v,
                                   size_t v_row, int32_t d, int32_t n, kvc__pf *pf);
    /* Scores of q8_0 / q4_0 keys (NULL for the other types) against query rows
       quantised to q8_0, any head dim: s[r][c] = sum_b dq[r][b] dk[c][b] idot(b). A
       row is its q8_0 blocks, or with i8_prepare the kernel's own layout of them
       (i8_row_bytes(t, d) bytes, a multiple of 64, 64-aligned). */
    void (*scores_i8[KVC_TYPE_COUNT])(const void *const *q, int32_t nr, const unsigned char *k, size_t k_row,
                                      int32_t d, int32_t n, float *const *s, kvc__pf *pf);
    size_t (*i8_row_bytes)(kvc_type t, int32_t d);
    void (*i8_prepare)(kvc_type t, int32_t d, const kvc__block_q8_0 *blocks, void *row);
    /* Logit soft-capping of rows r < nr (s[r][c], c < n): s = cap * tanh(s * scale / cap),
       each cell computed alike wherever it sits in the block */
    void (*softcap)(float *const *s, int32_t nr, int32_t n, float scale, float cap);
} kvc__kernels;

/* -- scalar: the reference -- */
static void kvc__dot_scalar(const float *q, const float *k, int32_t d, size_t stride, int32_t n, float *s) {
    int32_t c, i;
    for (c = 0; c < n; ++c) {
        float acc = 0.0f;
        for (i = 0; i < d; ++i) acc += q[i] * k[(size_t)c * stride + i];
        s[c] = acc;
    }
}
/* The largest visible score, or NaN when a visible score is not finite (the non-finite
   rule: a poisoned key's NaN scores give the row NaN; every path's masked_max does the
   same, through x - x, which is 0 for a finite x and NaN for the rest). */
static float kvc__masked_max_scalar(const float *s, int32_t n, uint32_t vis) {
    float m = -INFINITY;
    int32_t c;
    for (c = 0; c < n; ++c)
        if ((vis >> c) & 1u) {
            if (!(s[c] - s[c] == 0.0f)) return NAN;
            if (s[c] > m) m = s[c];
        }
    return m;
}
static float kvc__exp_sum_scalar(float *s, int32_t n, uint32_t vis, float scale, float m) {
    float sum = 0.0f;
    int32_t c;
    for (c = 0; c < n; ++c) {
        s[c] = (vis >> c) & 1u ? expf(s[c] * scale - m) : 0.0f;
        sum += s[c];
    }
    return sum;
}
/* masked_max / exp_sum of a kernel table from a path's one-row functions */
#define KVC__SOFTMAX_ROWS(ATTR, name, max1, exp1)                                                                   \
    ATTR static void kvc__masked_max_rows_##name(float *const *s, const uint32_t *vis, int32_t nr, int32_t n,       \
                                                 float *max) {                                                      \
        int32_t r;                                                                                                  \
        for (r = 0; r < nr; ++r) max[r] = max1(s[r], n, vis[r]);                                                    \
    }                                                                                                               \
    ATTR static void kvc__exp_sum_rows_##name(float *const *s, const uint32_t *vis, int32_t nr, int32_t n,          \
                                              float scale, const float *m, float *sum) {                            \
        int32_t r;                                                                                                  \
        for (r = 0; r < nr; ++r) sum[r] = exp1(s[r], n, vis[r], scale, m[r]);                                       \
    }
static void kvc__axpy_scalar(float *acc, const float *p, const float *v, int32_t d, size_t stride, int32_t n) {
    int32_t c, i;
    for (c = 0; c < n; ++c)
        for (i = 0; i < d; ++i) acc[i] += p[c] * v[(size_t)c * stride + i];
}
static void kvc__scale_scalar(float *x, int32_t n, float a) {
    int32_t i;
    for (i = 0; i < n; ++i) x[i] *= a;
}
static void kvc__softcap_scalar(float *const *s, int32_t nr, int32_t n, float scale, float cap) {
    float k = scale / cap;
    int32_t r, c;
    for (r = 0; r < nr; ++r)
        for (c = 0; c < n; ++c) s[r][c] = cap * tanhf(s[r][c] * k);
}
/* Keys stored as q8_0 or q4_0 are scored in integers, as llama.cpp does: the query
   row is quantised to q8_0 with the storage quantiser, each 32-value block's dot
   product of codes is exact, and s = the sum over blocks, in order, of
   (dq * dk) * idot. Every path computes this; they differ only in the order of the
   float sums. The query's rounding is part of the result (see the accuracy bounds). */
static int32_t kvc__idot_scalar(kvc_type t, const int8_t *q, const unsigned char *kb) {
    int32_t j, s = 0;
    if (t == KVC_TYPE_Q8_0) {
        const kvc__block_q8_0 *b = (const kvc__block_q8_0 *)(const void *)kb;
        for (j = 0; j < KVC__QBLOCK; ++j) s += (int32_t)q[j] * b->q[j];
    } else {
        const kvc__block_q4_0 *b = (const kvc__block_q4_0 *)(const void *)kb;
        for (j = 0; j < KVC__QBLOCK / 2; ++j)
            s += (int32_t)q[j] * ((b->q[j] & 15) - 8) + (int32_t)q[j + KVC__QBLOCK / 2] * ((b->q[j] >> 4) - 8);
    }
    return s;
}
typedef int32_t (*kvc__idot_fn)(kvc_type t, const int8_t *q, const unsigned char *kb);
static void kvc__scores_i8_rows(kvc_type t, kvc__idot_fn idot, const void *const *rows, int32_t nr,
                                const unsigned char *k, size_t k_row, int32_t d, int32_t n, float *const *s) {
    const kvc__block_q8_0 *const *q = (const kvc__block_q8_0 *const *)rows;
    size_t bb = t == KVC_TYPE_Q8_0 ? sizeof(kvc__block_q8_0) : sizeof(kvc__block_q4_0);
    int32_t r, c, b;
    for (r = 0; r < nr; ++r)
        for (c = 0; c < n; ++c) {
            const unsigned char *row = k + (size_t)c * k_row;
            float acc = 0.0f;
            for (b = 0; b < d / KVC__QBLOCK; ++b) {
                const unsigned char *kb = row + (size_t)b * bb;
                float scale = kvc__load_scale(q[r][b].d) * kvc__load_scale(kb);
                acc += scale * (float)idot(t, q[r][b].q, kb); /* exact: |idot| < 2^24 */
            }
            s[r][c] = acc;
        }
}
/* a path's scores_i8 kernels for both block types through kvc__scores_i8_rows and its idot */
#define KVC__SCORES_I8_ROWS(ATTR, name, idot)                                                                     \
    ATTR static void kvc__scores_i8_##name##_q8_0(const void *const *q, int32_t nr, const unsigned char *k,       \
                                                  size_t k_row, int32_t d, int32_t n, float *const *s,            \
                                                  kvc__pf *pf) {                                                  \
        kvc__pf_some(pf, INT32_MAX);                                                                              \
        kvc__scores_i8_rows(KVC_TYPE_Q8_0, idot, q, nr, k, k_row, d, n, s);                                       \
    }                                                                                                             \
    ATTR static void kvc__scores_i8_##name##_q4_0(const void *const *q, int32_t nr, const unsigned char *k,       \
                                                  size_t k_row, int32_t d, int32_t n, float *const *s,            \
                                                  kvc__pf *pf) {                                                  \
        kvc__pf_some(pf, INT32_MAX);                                                                              \
        kvc__scores_i8_rows(KVC_TYPE_Q4_0, idot, q, nr, k, k_row, d, n, s);                                       \
    }
#define KVC__NO_ATTR
KVC__SCORES_I8_ROWS(KVC__NO_ATTR, scalar, kvc__idot_scalar)
KVC__SOFTMAX_ROWS(KVC__NO_ATTR, scalar, kvc__masked_max_scalar, kvc__exp_sum_scalar)

static const kvc__kernels kvc__kernels_scalar = {"scalar", kvc__dot_scalar, kvc__masked_max_rows_scalar,
                                                 kvc__exp_sum_rows_scalar, kvc__axpy_scalar,
                                                 kvc__scale_scalar, 1, {NULL, NULL, NULL, NULL, NULL},
                                                 {NULL, NULL, NULL, NULL, NULL},
                                                 {NULL, NULL, NULL, kvc__scores_i8_scalar_q8_0,
                                                  kvc__scores_i8_scalar_q4_0},
                                                 NULL, NULL, kvc__softcap_scalar};

/* exp(x) for x <= 0 in SIMD lanes: Cephes' expf (range reduction by ln 2, a degree-6
   polynomial), within 2 ulp of expf; lanes below -87 (where expf underflows) give 0. */
#define KVC__EXP_C1 0.693359375f
#define KVC__EXP_C2 -2.12194440e-4f
#define KVC__EXP_P0 1.9875691500e-4f
#define KVC__EXP_P1 1.3981999507e-3f
#define KVC__EXP_P2 8.3334519073e-3f
#define KVC__EXP_P3 4.1665795894e-2f
#define KVC__EXP_P4 1.6666665459e-1f
#define KVC__EXP_P5 5.0000001201e-1f

#ifdef KVC__X86
/* -- SSE2: 4 lanes, through an f32 tile (no fused kernels) -- */
#define KVC__SSE2 __attribute__((target("sse2")))
KVC__SSE2 static __m128 kvc__exp_sse2(__m128 x) {
    __m128 keep = _mm_cmpge_ps(x, _mm_set1_ps(-87.0f)), n, y;
    __m128i e;
    x = _mm_max_ps(x, _mm_set1_ps(-87.0f));
    e = _mm_cvtps_epi32(_mm_mul_ps(x, _mm_set1_ps(1.44269504088896341f))); /* nearest, MXCSR's default */
    n = _mm_cvtepi32_ps(e);
    x = _mm_sub_ps(x, _mm_mul_ps(n, _mm_set1_ps(KVC__EXP_C1)));
    x = _mm_sub_ps(x, _mm_mul_ps(n, _mm_set1_ps(KVC__EXP_C2)));
    y = _mm_set1_ps(KVC__EXP_P0);
    y = _mm_add_ps(_mm_mul_ps(y, x), _mm_set1_ps(KVC__EXP_P1));
    y = _mm_add_ps(_mm_mul_ps(y, x), _mm_set1_ps(KVC__EXP_P2));
    y = _mm_add_ps(_mm_mul_ps(y, x), _mm_set1_ps(KVC__EXP_P3));
    y = _mm_add_ps(_mm_mul_ps(y, x), _mm_set1_ps(KVC__EXP_P4));
    y = _mm_add_ps(_mm_mul_ps(y, x), _mm_set1_ps(KVC__EXP_P5));
    y = _mm_add_ps(_mm_mul_ps(y, _mm_mul_ps(x, x)), _mm_add_ps(x, _mm_set1_ps(1.0f)));
    e = _mm_slli_epi32(_mm_add_epi32(e, _mm_set1_epi32(127)), 23);
    return _mm_and_ps(_mm_mul_ps(y, _mm_castsi128_ps(e)), keep);
}
/* the sums of four vectors, one per lane */
KVC__SSE2 static __m128 kvc__hsum4_sse2(__m128 a, __m128 b, __m128 c, __m128 d) {
    __m128 t0 = _mm_unpacklo_ps(a, b), t1 = _mm_unpackhi_ps(a, b), t2 = _mm_unpacklo_ps(c, d), t3 = _mm_unpackhi_ps(c, d);
    __m128 s0 = _mm_add_ps(t0, t1), s1 = _mm_add_ps(t2, t3); /* a01 b01 a23 b23 / c.. d.. */
    return _mm_add_ps(_mm_movelh_ps(s0, s1), _mm_movehl_ps(s1, s0));
}
KVC__SSE2 static void kvc__dot_sse2(const float *q, const float *k, int32_t d, size_t stride, int32_t n, float *s) {
    int32_t c, i, j, full = d & ~3;
    for (c = 0; c < n; c += 4) {
        const float *r[4];
        __m128 a0 = _mm_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        float t[4];
        for (j = 0; j < 4; ++j) r[j] = k + (size_t)KVC__MIN(c + j, n - 1) * stride;
        for (i = 0; i < full; i += 4) {
            __m128 qv = _mm_loadu_ps(q + i);
            a0 = _mm_add_ps(a0, _mm_mul_ps(qv, _mm_loadu_ps(r[0] + i)));
            a1 = _mm_add_ps(a1, _mm_mul_ps(qv, _mm_loadu_ps(r[1] + i)));
            a2 = _mm_add_ps(a2, _mm_mul_ps(qv, _mm_loadu_ps(r[2] + i)));
            a3 = _mm_add_ps(a3, _mm_mul_ps(qv, _mm_loadu_ps(r[3] + i)));
        }
        _mm_storeu_ps(t, kvc__hsum4_sse2(a0, a1, a2, a3));
        for (j = 0; j < 4 && c + j < n; ++j) {
            for (i = full; i < d; ++i) t[j] += q[i] * r[j][i];
            s[c + j] = t[j];
        }
    }
}
KVC__SSE2 static float kvc__exp_sum_sse2(float *s, int32_t n, uint32_t vis, float scale, float m) {
    __m128 sum = _mm_setzero_ps();
    float t[4];
    int32_t c;
    for (c = 0; c < n; ++c)
        if (!((vis >> c) & 1u)) s[c] = -INFINITY; /* gives 0 below */
    for (c = 0; c < n; c += 4) { /* a tail in a padded vector: each weight computed alike */
        int32_t j;
        for (j = 0; j < 4; ++j) t[j] = c + j < n ? s[c + j] : -INFINITY;
        _mm_storeu_ps(t, kvc__exp_sse2(_mm_sub_ps(_mm_mul_ps(_mm_loadu_ps(t), _mm_set1_ps(scale)), _mm_set1_ps(m))));
        for (j = 0; j < 4 && c + j < n; ++j) s[c + j] = t[j];
        sum = _mm_add_ps(sum, _mm_loadu_ps(t));
    }
    _mm_storeu_ps(t, sum);
    return (t[0] + t[1]) + (t[2] + t[3]);
}
KVC__SSE2 static void kvc__axpy_sse2(float *acc, const float *p, const float *v, int32_t d, size_t stride, int32_t n) {
    int32_t i = 0, c;
    for (; i + 16 <= d; i += 16) {
        __m128 a0 = _mm_loadu_ps(acc + i), a1 = _mm_loadu_ps(acc + i + 4);
        __m128 a2 = _mm_loadu_ps(acc + i + 8), a3 = _mm_loadu_ps(acc + i + 12);
        for (c = 0; c < n; ++c) {
            const float *r = v + (size_t)c * stride + i;
            __m128 w = _mm_set1_ps(p[c]);
            a0 = _mm_add_ps(a0, _mm_mul_ps(w, _mm_loadu_ps(r)));
            a1 = _mm_add_ps(a1, _mm_mul_ps(w, _mm_loadu_ps(r + 4)));
            a2 = _mm_add_ps(a2, _mm_mul_ps(w, _mm_loadu_ps(r + 8)));
            a3 = _mm_add_ps(a3, _mm_mul_ps(w, _mm_loadu_ps(r + 12)));
        }
        _mm_storeu_ps(acc + i, a0);
        _mm_storeu_ps(acc + i + 4, a1);
        _mm_storeu_ps(acc + i + 8, a2);
        _mm_storeu_ps(acc + i + 12, a3);
    }
    for (; i < d; ++i)
        for (c = 0; c < n; ++c) acc[i] += p[c] * v[(size_t)c * stride + i];
}
KVC__SSE2 static void kvc__scale_sse2(float *x, int32_t n, float a) {
    int32_t i = 0;
    for (; i + 4 <= n; i += 4) _mm_storeu_ps(x + i, _mm_mul_ps(_mm_loadu_ps(x + i), _mm_set1_ps(a)));
    for (; i < n; ++i) x[i] *= a;
}
/* cap * tanh(x * k) in lanes: tanh|y| = (1 - e^-2|y|) / (1 + e^-2|y|), the sign put back
   (absolute error about 1e-7 * cap against tanhf) */
KVC__SSE2 static __m128 kvc__tanh_cap_sse2(__m128 x, __m128 k, __m128 cap) {
    __m128 sign = _mm_set1_ps(-0.0f), one = _mm_set1_ps(1.0f), y = _mm_mul_ps(x, k);
    __m128 e = kvc__exp_sse2(_mm_mul_ps(_mm_andnot_ps(sign, y), _mm_set1_ps(-2.0f)));
    __m128 t = _mm_div_ps(_mm_sub_ps(one, e), _mm_add_ps(one, e));
    return _mm_mul_ps(_mm_or_ps(t, _mm_and_ps(sign, y)), cap);
}
KVC__SSE2 static void kvc__softcap_sse2(float *const *s, int32_t nr, int32_t n, float scale, float cap) {
    __m128 k = _mm_set1_ps(scale / cap), vc = _mm_set1_ps(cap);
    float t[4];
    int32_t r, c, j;
    for (r = 0; r < nr; ++r)
        for (c = 0; c < n; c += 4) {
            for (j = 0; j < 4; ++j) t[j] = c + j < n ? s[r][c + j] : 0.0f;
            _mm_storeu_ps(t, kvc__tanh_cap_sse2(_mm_loadu_ps(t), k, vc));
            for (j = 0; j < 4 && c + j < n; ++j) s[r][c + j] = t[j];
        }
}
/* a block's integer dot product: codes widened to 16 bits, pmaddwd into 32 */
KVC__SSE2 static __m128i kvc__widen_lo_sse2(__m128i x) { return _mm_unpacklo_epi8(x, _mm_cmpgt_epi8(_mm_setzero_si128(), x)); }
KVC__SSE2 static __m128i kvc__widen_hi_sse2(__m128i x) { return _mm_unpackhi_epi8(x, _mm_cmpgt_epi8(_mm_setzero_si128(), x)); }
KVC__SSE2 static int32_t kvc__idot_sse2(kvc_type t, const int8_t *q, const unsigned char *kb) {
    __m128i q0 = _mm_loadu_si128((const __m128i *)(const void *)q), q1 = _mm_loadu_si128((const __m128i *)(const void *)(q + 16));
    __m128i k0, k1, acc;
    int32_t r[4];
    if (t == KVC_TYPE_Q8_0) {
        const int8_t *c = ((const kvc__block_q8_0 *)(const void *)kb)->q;
        k0 = _mm_loadu_si128((const __m128i *)(const void *)c);
        k1 = _mm_loadu_si128((const __m128i *)(const void *)(c + 16));
    } else {
        __m128i x = _mm_loadu_si128((const __m128i *)(const void *)((const kvc__block_q4_0 *)(const void *)kb)->q);
        __m128i m = _mm_set1_epi8(15), eight = _mm_set1_epi8(8);
        k0 = _mm_sub_epi8(_mm_and_si128(x, m), eight);
        k1 = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(x, 4), m), eight);
    }
    acc = _mm_add_epi32(_mm_madd_epi16(kvc__widen_lo_sse2(q0), kvc__widen_lo_sse2(k0)),
                        _mm_madd_epi16(kvc__widen_hi_sse2(q0), kvc__widen_hi_sse2(k0)));
    acc = _mm_add_epi32(acc, _mm_add_epi32(_mm_madd_epi16(kvc__widen_lo_sse2(q1), kvc__widen_lo_sse2(k1)),
                                           _mm_madd_epi16(kvc__widen_hi_sse2(q1), kvc__widen_hi_sse2(k1))));
    _mm_storeu_si128((__m128i *)(void *)r, acc);
    return r[0] + r[1] + r[2] + r[3];
}
KVC__SCORES_I8_ROWS(KVC__SSE2, sse2, kvc__idot_sse2)
KVC__SOFTMAX_ROWS(KVC__SSE2, sse2, kvc__masked_max_scalar, kvc__exp_sum_sse2)
static const kvc__kernels kvc__kernels_sse2 = {"sse2", kvc__dot_sse2, kvc__masked_max_rows_sse2, kvc__exp_sum_rows_sse2,
                                               kvc__axpy_sse2, kvc__scale_sse2, 4, {NULL, NULL, NULL, NULL, NULL},
                                               {NULL, NULL, NULL, NULL, NULL},
                                               {NULL, NULL, NULL, kvc__scores_i8_sse2_q8_0, kvc__scores_i8_sse2_q4_0},
                                               NULL, NULL, kvc__softcap_sse2};

/* -- AVX2 + FMA: 8 lanes -- */
KVC__AVX2 static __m256 kvc__exp_avx2(__m256 x) {
    __m256 n, y, z, keep = _mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_GE_OQ);
    __m256i e;
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
    n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    x = _mm256_fnmadd_ps(n, _mm256_set1_ps(KVC__EXP_C1), x);
    x = _mm256_fnmadd_ps(n, _mm256_set1_ps(KVC__EXP_C2), x);
    y = _mm256_set1_ps(KVC__EXP_P0);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(KVC__EXP_P1));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(KVC__EXP_P2));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(KVC__EXP_P3));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(KVC__EXP_P4));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(KVC__EXP_P5));
    z = _mm256_mul_ps(x, x);
    y = _mm256_fmadd_ps(y, z, _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
    e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(_mm256_mul_ps(y, _mm256_castsi256_ps(e)), keep);
}
/* the sums of eight vectors, one per lane */
KVC__AVX2 static __m256 kvc__hsum8_avx2(const __m256 *a) {
    __m256 t0 = _mm256_hadd_ps(a[0], a[1]), t1 = _mm256_hadd_ps(a[2], a[3]);
    __m256 t2 = _mm256_hadd_ps(a[4], a[5]), t3 = _mm256_hadd_ps(a[6], a[7]);
    __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}
KVC__AVX2 static __m256i kvc__tail_mask_avx2(int32_t left) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(left), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
/* Eight cells at a time with eight named accumulators (arrays would live in memory);
   past the last cell the rows repeat the last one and their sums are not stored. */
#define KVC__ROWS8(r, k, c, n, stride)                                                  \
    for (j = 0; j < 8; ++j) r[j] = k + (size_t)KVC__MIN(c + j, n - 1) * stride
KVC__AVX2 static void kvc__dot_avx2(const float *q, const float *k, int32_t d, size_t stride, int32_t n, float *s) {
    int32_t c, i, j, full = d & ~7;
    __m256i tail = kvc__tail_mask_avx2(d - full);
    for (c = 0; c < n; c += 8) {
        const float *r[8];
        __m256 a[8], a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0, qv;
        float t[8];
        KVC__ROWS8(r, k, c, n, stride);
        for (i = 0; i < full; i += 8) {
            qv = _mm256_loadu_ps(q + i);
            a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(r[0] + i), a0);
            a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(r[1] + i), a1);
            a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(r[2] + i), a2);
            a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(r[3] + i), a3);
            a4 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(r[4] + i), a4);
            a5 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(r[5] + i), a5);
            a6 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(r[6] + i), a6);
            a7 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(r[7] + i), a7);
        }
        if (full < d) {
            qv = _mm256_maskload_ps(q + full, tail);
            a0 = _mm256_fmadd_ps(qv, _mm256_maskload_ps(r[0] + full, tail), a0);
            a1 = _mm256_fmadd_ps(qv, _mm256_maskload_ps(r[1] + full, tail), a1);
            a2 = _mm256_fmadd_ps(qv, _mm256_maskload_ps(r[2] + full, tail), a2);
            a3 = _mm256_fmadd_ps(qv, _mm256_maskload_ps(r[3] + full, tail), a3);
            a4 = _mm256_fmadd_ps(qv, _mm256_maskload_ps(r[4] + full, tail), a4);
            a5 = _mm256_fmadd_ps(qv, _mm256_maskload_ps(r[5] + full, tail), a5);
            a6 = _mm256_fmadd_ps(qv, _mm256_maskload_ps(r[6] + full, tail), a6);
            a7 = _mm256_fmadd_ps(qv, _mm256_maskload_ps(r[7] + full, tail), a7);
        }
        a[0] = a0; a[1] = a1; a[2] = a2; a[3] = a3; a[4] = a4; a[5] = a5; a[6] = a6; a[7] = a7;
        _mm256_storeu_ps(t, kvc__hsum8_avx2(a));
        for (j = 0; j < 8 && c + j < n; ++j) s[c + j] = t[j];
    }
}
/* the lanes of cells c .. c + 7 whose bit is set in vis */
KVC__AVX2 static __m256i kvc__vis_mask_avx2(uint32_t vis, int32_t c) {
    const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    return _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32((int)((vis >> c) & 0xffu)), bit), bit);
}
/* Softmax of up to four rows (nr) at once, as the AVX-512 kernels do: their vectors are
   reduced as one set (row 0's result in lane 0, row 1's in lane 4, row 2's in lane 2,
   row 3's in lane 6), where each row alone took its own reduction and, for the sums, a
   round trip through memory. */
#define KVC__REDUCE4_AVX2(op, x0, x1, x2, x3, e)                                                                    \
    do {                                                                                                            \
        __m256 t0_ = op(_mm256_permute2f128_ps(x0, x1, 0x20), _mm256_permute2f128_ps(x0, x1, 0x31));                 \
        __m256 t1_ = op(_mm256_permute2f128_ps(x2, x3, 0x20), _mm256_permute2f128_ps(x2, x3, 0x31));                 \
        e = op(_mm256_shuffle_ps(t0_, t1_, 0x44), _mm256_shuffle_ps(t0_, t1_, 0xee));                               \
        e = op(e, _mm256_permute_ps(e, 0xb1));                                                                      \
    } while (0)
KVC__AVX2 static void kvc__lanes4_avx2(__m256 e, float *out) {
    float t[8];
    _mm256_storeu_ps(t, e);
    out[0] = t[0]; out[1] = t[4]; out[2] = t[2]; out[3] = t[6];
}
/* 8 scores from s + c, -inf where vis has no bit (the masked load stays in s: vis has
   no bit at or past n) */
KVC__AVX2 static __m256 kvc__row_load_avx2(const float *s, uint32_t vis, int32_t c) {
    __m256i k = kvc__vis_mask_avx2(vis, c);
    return _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), _mm256_maskload_ps(s + c, k), _mm256_castsi256_ps(k));
}
/* (with a NaN where the row has a visible score that is not finite: kvc__masked_max_scalar;
   masked lanes load 0) */
#define KVC__MAX_ROW_AVX2(r, m, b)                                                                                  \
    if (r < nr) {                                                                                                   \
        __m256i k_ = kvc__vis_mask_avx2(vis[r], c);                                                                 \
        __m256 x_ = _mm256_maskload_ps(s[r] + c, k_);                                                               \
        m = _mm256_max_ps(m, _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), x_, _mm256_castsi256_ps(k_)));             \
        b = _mm256_add_ps(b, _mm256_sub_ps(x_, x_));                                                                \
    }
KVC__AVX2 static void kvc__masked_max4_avx2(float *const *s, const uint32_t *vis, int32_t nr, int32_t n, float *max) {
    __m256 m0 = _mm256_set1_ps(-INFINITY), m1 = m0, m2 = m0, m3 = m0, e;
    __m256 b0 = _mm256_setzero_ps(), b1 = b0, b2 = b0, b3 = b0;
    float bad[4];
    int32_t c, r;
    for (c = 0; c < n; c += 8) {
        KVC__MAX_ROW_AVX2(0, m0, b0)
        KVC__MAX_ROW_AVX2(1, m1, b1)
        KVC__MAX_ROW_AVX2(2, m2, b2)
        KVC__MAX_ROW_AVX2(3, m3, b3)
    }
    KVC__REDUCE4_AVX2(_mm256_max_ps, m0, m1, m2, m3, e);
    kvc__lanes4_avx2(e, max);
    KVC__REDUCE4_AVX2(_mm256_add_ps, b0, b1, b2, b3, e);
    kvc__lanes4_avx2(e, bad);
    for (r = 0; r < 4; ++r)
        if (bad[r] != bad[r]) max[r] = NAN;
}
#undef KVC__MAX_ROW_AVX2
/* row r's weights over cells [c, c + 8), stored and added to a (rows past nr: none) */
#define KVC__EXP_ROW_AVX2(r, a)                                                                                     \
    if (r < nr) {                                                                                                   \
        __m256 x_ = _mm256_mul_ps(kvc__row_load_avx2(s[r], vis[r], c), vs);                                         \
        __m256 p_ = kvc__exp_avx2(_mm256_sub_ps(x_, _mm256_set1_ps(m[r]))); /* -inf lanes give 0 */                 \
        _mm256_maskstore_ps(s[r] + c, kvc__tail_mask_avx2(n - c), p_);                                              \
        a = _mm256_add_ps(a, p_);                                                                                   \
    }
KVC__AVX2 static void kvc__exp_sum4_avx2(float *const *s, const uint32_t *vis, int32_t nr, int32_t n, float scale,
                                         const float *m, float *sum) {
    __m256 vs = _mm256_set1_ps(scale), a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, e;
    int32_t c;
    for (c = 0; c < n; c += 8) {
        KVC__EXP_ROW_AVX2(0, a0)
        KVC__EXP_ROW_AVX2(1, a1)
        KVC__EXP_ROW_AVX2(2, a2)
        KVC__EXP_ROW_AVX2(3, a3)
    }
    KVC__REDUCE4_AVX2(_mm256_add_ps, a0, a1, a2, a3, e);
    kvc__lanes4_avx2(e, sum);
}
#undef KVC__EXP_ROW_AVX2
#undef KVC__REDUCE4_AVX2
KVC__AVX2 static void kvc__softcap_avx2(float *const *s, int32_t nr, int32_t n, float scale, float cap) {
    __m256 k = _mm256_set1_ps(scale / cap), vc = _mm256_set1_ps(cap), sign = _mm256_set1_ps(-0.0f);
    __m256 one = _mm256_set1_ps(1.0f);
    int32_t r, c;
    for (r = 0; r < nr; ++r)
        for (c = 0; c < n; c += 8) { /* as kvc__tanh_cap_sse2 */
            __m256i m = kvc__tail_mask_avx2(n - c);
            __m256 y = _mm256_mul_ps(_mm256_maskload_ps(s[r] + c, m), k);
            __m256 e = kvc__exp_avx2(_mm256_mul_ps(_mm256_andnot_ps(sign, y), _mm256_set1_ps(-2.0f)));
            __m256 t = _mm256_div_ps(_mm256_sub_ps(one, e), _mm256_add_ps(one, e));
            _mm256_maskstore_ps(s[r] + c, m, _mm256_mul_ps(_mm256_or_ps(t, _mm256_and_ps(sign, y)), vc));
        }
}
KVC__AVX2 static void kvc__axpy_avx2(float *acc, const float *p, const float *v, int32_t d, size_t stride, int32_t n) {
    int32_t i = 0, c;
    for (; i + 32 <= d; i += 32) { /* four accumulators stay in registers across the cells */
        __m256 a0 = _mm256_loadu_ps(acc + i), a1 = _mm256_loadu_ps(acc + i + 8);
        __m256 a2 = _mm256_loadu_ps(acc + i + 16), a3 = _mm256_loadu_ps(acc + i + 24);
        for (c = 0; c < n; ++c) {
            __m256 w = _mm256_set1_ps(p[c]);
            const float *row = v + (size_t)c * stride + i;
            a0 = _mm256_fmadd_ps(w, _mm256_loadu_ps(row), a0);
            a1 = _mm256_fmadd_ps(w, _mm256_loadu_ps(row + 8), a1);
            a2 = _mm256_fmadd_ps(w, _mm256_loadu_ps(row + 16), a2);
            a3 = _mm256_fmadd_ps(w, _mm256_loadu_ps(row + 24), a3);
        }
        _mm256_storeu_ps(acc + i, a0);
        _mm256_storeu_ps(acc + i + 8, a1);
        _mm256_storeu_ps(acc + i + 16, a2);
        _mm256_storeu_ps(acc + i + 24, a3);
    }
    for (; i < d; i += 8) {
        __m256i m = kvc__tail_mask_avx2(d - i);
        __m256 a = _mm256_maskload_ps(acc + i, m);
        for (c = 0; c < n; ++c) a = _mm256_fmadd_ps(_mm256_set1_ps(p[c]), _mm256_maskload_ps(v + (size_t)c * stride + i, m), a);
        _mm256_maskstore_ps(acc + i, m, a);
    }
}
KVC__AVX2 static void kvc__scale_avx2(float *x, int32_t n, float a) {
    __m256 va = _mm256_set1_ps(a);
    int32_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), va));
    for (; i < n; ++i) x[i] *= a;
}

/* Fused kernels take at most KVC__STRIP cells a call; a block type's f16 scales of
   those cells are converted once into sc[cell * KVC__SCALES + block] (nothing for the
   float types), so the inner loops broadcast them from memory. */
KVC__F16C static inline __attribute__((always_inline)) void kvc__strip_scales(kvc_type t, const unsigned char *row,
                                                                              size_t row_bytes, int32_t d, int32_t n,
                                                                              float *sc) {
    size_t bb = t == KVC_TYPE_Q8_0 ? sizeof(kvc__block_q8_0) : sizeof(kvc__block_q4_0);
    int32_t c, b;
    if (t != KVC_TYPE_Q8_0 && t != KVC_TYPE_Q4_0) return;
    for (c = 0; c < n; ++c)
        for (b = 0; b < d / KVC__QBLOCK; ++b) {
            const unsigned char *p = row + (size_t)c * row_bytes + (size_t)b * bb;
            sc[c * KVC__SCALES + b] = _cvtsh_ss((unsigned short)(p[0] | (p[1] << 8)));
        }
}

/* Fused AVX2 kernels, the same shapes as AVX-512's with 8 lanes (head dims multiples of 8). */
#define KVC__AVX2_INLINE KVC__AVX2 static inline __attribute__((always_inline))

KVC__AVX2_INLINE __m256 kvc__load8_avx2(kvc_type t, const unsigned char *row, int32_t i, const float *sc) {
    if (t == KVC_TYPE_F32) return _mm256_loadu_ps((const float *)(const void *)row + i);
    if (t == KVC_TYPE_F16) return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(row + 2 * i)));
    if (t == KVC_TYPE_BF16)
        return _mm256_castsi256_ps(
            _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)(row + 2 * i))), 16));
    if (t == KVC_TYPE_Q8_0) {
        const kvc__block_q8_0 *b = (const kvc__block_q8_0 *)(const void *)row + i / KVC__QBLOCK;
        __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(b->q + (i & 31))));
        return _mm256_mul_ps(_mm256_cvtepi32_ps(q), _mm256_set1_ps(sc[i / KVC__QBLOCK]));
    } else {
        const kvc__block_q4_0 *b = (const kvc__block_q4_0 *)(const void *)row + i / KVC__QBLOCK;
        __m128i x = _mm_loadl_epi64((const __m128i *)(const void *)(b->q + (i & 15)));
        __m256i q;
        if (i & 16) x = _mm_srli_epi16(x, 4); /* values 16..31 are the high nibbles */
        q = _mm256_sub_epi32(_mm256_cvtepu8_epi32(_mm_and_si128(x, _mm_set1_epi8(0x0f))), _mm256_set1_epi32(8));
        return _mm256_mul_ps(_mm256_cvtepi32_ps(q), _mm256_set1_ps(sc[i / KVC__QBLOCK]));
    }
}

/* one cell's four row sums (in hsum8's order of additions) into s[r][c] */
KVC__AVX2_INLINE void kvc__store_cell4_avx2(__m256 a0, __m256 a1, __m256 a2, __m256 a3, float *const *s, int32_t c) {
    __m256 x = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    float sum[4];
    int32_t r;
    _mm_storeu_ps(sum, _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1)));
    for (r = 0; r < 4; ++r) s[r][c] = sum[r];
}
/* four rows, three cells at a time: twelve sums in flight (FMA latency x two per
   cycle needs eight), the fourth row's query read with each multiply-add as sixteen
   registers hold no more (two cells at a time, eight sums, took 6-13 % longer at 4k
   cells); the last cells of a strip one at a time */
#define KVC__S4_CELL_AVX2(x, kr, sr, a0, a1, a2, a3)                                                                \
    x = kvc__load8_avx2(t, kr, i, sr);                                                                              \
    a0 = _mm256_fmadd_ps(q0, x, a0); a1 = _mm256_fmadd_ps(q1, x, a1);                                               \
    a2 = _mm256_fmadd_ps(q2, x, a2); a3 = _mm256_fmadd_ps(_mm256_loadu_ps(q[3] + i), x, a3)
KVC__AVX2_INLINE void kvc__scores4_avx2(kvc_type t, const float *const *q, const unsigned char *k, size_t k_row, int32_t d,
                                        int32_t n, float *const *s) {
    int32_t c, i;
    float sc[KVC__STRIP * KVC__SCALES];
    __m256 x;
    kvc__strip_scales(t, k, k_row, d, n, sc);
    for (c = 0; c + 3 <= n; c += 3) {
        const unsigned char *k0 = k + (size_t)c * k_row, *k1 = k0 + k_row, *k2 = k1 + k_row;
        const float *s0 = sc + c * KVC__SCALES, *s1 = s0 + KVC__SCALES, *s2 = s1 + KVC__SCALES;
        __m256 a[8], a00 = _mm256_setzero_ps(), a10 = a00, a20 = a00, a30 = a00, a01 = a00, a11 = a00, a21 = a00, a31 = a00;
        __m256 a02 = a00, a12 = a00, a22 = a00, a32 = a00;
        __m128 lo, hi, u0, u1;
        for (i = 0; i < d; i += 8) {
            __m256 q0 = _mm256_loadu_ps(q[0] + i), q1 = _mm256_loadu_ps(q[1] + i), q2 = _mm256_loadu_ps(q[2] + i);
            KVC__S4_CELL_AVX2(x, k0, s0, a00, a10, a20, a30);
            KVC__S4_CELL_AVX2(x, k1, s1, a01, a11, a21, a31);
            KVC__S4_CELL_AVX2(x, k2, s2, a02, a12, a22, a32);
        }
        a[0] = a00; a[1] = a10; a[2] = a20; a[3] = a30; a[4] = a01; a[5] = a11; a[6] = a21; a[7] = a31;
        x = kvc__hsum8_avx2(a); /* row r: lane r (cell c), lane 4 + r (cell c + 1) */
        lo = _mm256_castps256_ps128(x); hi = _mm256_extractf128_ps(x, 1);
        u0 = _mm_unpacklo_ps(lo, hi); u1 = _mm_unpackhi_ps(lo, hi);
        _mm_storel_pi((__m64 *)(void *)(s[0] + c), u0); _mm_storeh_pi((__m64 *)(void *)(s[1] + c), u0);
        _mm_storel_pi((__m64 *)(void *)(s[2] + c), u1); _mm_storeh_pi((__m64 *)(void *)(s[3] + c), u1);
        kvc__store_cell4_avx2(a02, a12, a22, a32, s, c + 2);
    }
    for (; c < n; ++c) {
        const unsigned char *k0 = k + (size_t)c * k_row;
        const float *s0 = sc + c * KVC__SCALES;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (i = 0; i < d; i += 8) {
            __m256 q0 = _mm256_loadu_ps(q[0] + i), q1 = _mm256_loadu_ps(q[1] + i), q2 = _mm256_loadu_ps(q[2] + i);
            KVC__S4_CELL_AVX2(x, k0, s0, a0, a1, a2, a3);
        }
        kvc__store_cell4_avx2(a0, a1, a2, a3, s, c);
    }
}
#undef KVC__S4_CELL_AVX2

KVC__AVX2_INLINE void kvc__scores1_avx2(kvc_type t, const float *q, const unsigned char *k, size_t k_row, int32_t d,
                                        int32_t n, float *s) {
    int32_t c, i, j;
    float sc[KVC__STRIP * KVC__SCALES];
    kvc__strip_scales(t, k, k_row, d, n, sc);
    for (c = 0; c < n; c += 8) {
        const unsigned char *r[8];
        __m256 a[8], a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
        float sum[8];
        KVC__ROWS8(r, k, c, n, k_row);
        for (i = 0; i < d; i += 8) {
            __m256 qv = _mm256_loadu_ps(q + i);
            a0 = _mm256_fmadd_ps(qv, kvc__load8_avx2(t, r[0], i, sc + KVC__MIN(c + 0, n - 1) * KVC__SCALES), a0);
            a1 = _mm256_fmadd_ps(qv, kvc__load8_avx2(t, r[1], i, sc + KVC__MIN(c + 1, n - 1) * KVC__SCALES), a1);
            a2 = _mm256_fmadd_ps(qv, kvc__load8_avx2(t, r[2], i, sc + KVC__MIN(c + 2, n - 1) * KVC__SCALES), a2);
            a3 = _mm256_fmadd_ps(qv, kvc__load8_avx2(t, r[3], i, sc + KVC__MIN(c + 3, n - 1) * KVC__SCALES), a3);
            a4 = _mm256_fmadd_ps(qv, kvc__load8_avx2(t, r[4], i, sc + KVC__MIN(c + 4, n - 1) * KVC__SCALES), a4);
            a5 = _mm256_fmadd_ps(qv, kvc__load8_avx2(t, r[5], i, sc + KVC__MIN(c + 5, n - 1) * KVC__SCALES), a5);
            a6 = _mm256_fmadd_ps(qv, kvc__load8_avx2(t, r[6], i, sc + KVC__MIN(c + 6, n - 1) * KVC__SCALES), a6);
            a7 = _mm256_fmadd_ps(qv, kvc__load8_avx2(t, r[7], i, sc + KVC__MIN(c + 7, n - 1) * KVC__SCALES), a7);
        }
        a[0] = a0; a[1] = a1; a[2] = a2; a[3] = a3; a[4] = a4; a[5] = a5; a[6] = a6; a[7] = a7;
        _mm256_storeu_ps(sum, kvc__hsum8_avx2(a));
        for (j = 0; j < 8 && c + j < n; ++j) s[c + j] = sum[j];
    }
}

/* acc[r] += sum_c p[r][c] v[c] for four rows: 16 values at a time (eight accumulators,
   each cell's four weights broadcast once for both halves; 8 at a time broadcast them
   twice as often), then 8 */
KVC__AVX2_INLINE void kvc__values4_avx2(kvc_type t, float *const *acc, const float *const *p, const unsigned char *v,
                                        size_t v_row, int32_t d, int32_t n) {
    int32_t i = 0, c;
    float sc[KVC__STRIP * KVC__SCALES];
    kvc__strip_scales(t, v, v_row, d, n, sc);
    for (; i + 16 <= d; i += 16) {
        __m256 a00 = _mm256_loadu_ps(acc[0] + i), a10 = _mm256_loadu_ps(acc[1] + i);
        __m256 a20 = _mm256_loadu_ps(acc[2] + i), a30 = _mm256_loadu_ps(acc[3] + i);
        __m256 a01 = _mm256_loadu_ps(acc[0] + i + 8), a11 = _mm256_loadu_ps(acc[1] + i + 8);
        __m256 a21 = _mm256_loadu_ps(acc[2] + i + 8), a31 = _mm256_loadu_ps(acc[3] + i + 8);
        for (c = 0; c < n; ++c) {
            const unsigned char *r = v + (size_t)c * v_row;
            __m256 x0 = kvc__load8_avx2(t, r, i, sc + c * KVC__SCALES);
            __m256 x1 = kvc__load8_avx2(t, r, i + 8, sc + c * KVC__SCALES);
            __m256 w0 = _mm256_set1_ps(p[0][c]), w1 = _mm256_set1_ps(p[1][c]);
            __m256 w2 = _mm256_set1_ps(p[2][c]), w3 = _mm256_set1_ps(p[3][c]);
            a00 = _mm256_fmadd_ps(w0, x0, a00); a10 = _mm256_fmadd_ps(w1, x0, a10);
            a20 = _mm256_fmadd_ps(w2, x0, a20); a30 = _mm256_fmadd_ps(w3, x0, a30);
            a01 = _mm256_fmadd_ps(w0, x1, a01); a11 = _mm256_fmadd_ps(w1, x1, a11);
            a21 = _mm256_fmadd_ps(w2, x1, a21); a31 = _mm256_fmadd_ps(w3, x1, a31);
        }
        _mm256_storeu_ps(acc[0] + i, a00); _mm256_storeu_ps(acc[1] + i, a10);
        _mm256_storeu_ps(acc[2] + i, a20); _mm256_storeu_ps(acc[3] + i, a30);
        _mm256_storeu_ps(acc[0] + i + 8, a01); _mm256_storeu_ps(acc[1] + i + 8, a11);
        _mm256_storeu_ps(acc[2] + i + 8, a21); _mm256_storeu_ps(acc[3] + i + 8, a31);
    }
    for (; i < d; i += 8) {
        __m256 a0 = _mm256_loadu_ps(acc[0] + i), a1 = _mm256_loadu_ps(acc[1] + i);
        __m256 a2 = _mm256_loadu_ps(acc[2] + i), a3 = _mm256_loadu_ps(acc[3] + i);
        for (c = 0; c < n; ++c) {
            __m256 x = kvc__load8_avx2(t, v + (size_t)c * v_row, i, sc + c * KVC__SCALES);
            a0 = _mm256_fmadd_ps(_mm256_set1_ps(p[0][c]), x, a0);
            a1 = _mm256_fmadd_ps(_mm256_set1_ps(p[1][c]), x, a1);
            a2 = _mm256_fmadd_ps(_mm256_set1_ps(p[2][c]), x, a2);
            a3 = _mm256_fmadd_ps(_mm256_set1_ps(p[3][c]), x, a3);
        }
        _mm256_storeu_ps(acc[0] + i, a0);
        _mm256_storeu_ps(acc[1] + i, a1);
        _mm256_storeu_ps(acc[2] + i, a2);
        _mm256_storeu_ps(acc[3] + i, a3);
    }
}

/* one row, in values4's order of operations (batch-invariant), four chains at a time */
KVC__AVX2_INLINE void kvc__values1_avx2(kvc_type t, float *acc, const float *p, const unsigned char *v, size_t v_row,
                                        int32_t d, int32_t n) {
    int32_t i = 0, c;
    float sc[KVC__STRIP * KVC__SCALES];
    kvc__strip_scales(t, v, v_row, d, n, sc);
    for (; i + 32 <= d; i += 32) {
        __m256 a0 = _mm256_loadu_ps(acc + i), a1 = _mm256_loadu_ps(acc + i + 8);
        __m256 a2 = _mm256_loadu_ps(acc + i + 16), a3 = _mm256_loadu_ps(acc + i + 24);
        for (c = 0; c < n; ++c) {
            const unsigned char *r = v + (size_t)c * v_row;
            __m256 w = _mm256_set1_ps(p[c]);
            a0 = _mm256_fmadd_ps(w, kvc__load8_avx2(t, r, i, sc + c * KVC__SCALES), a0);
            a1 = _mm256_fmadd_ps(w, kvc__load8_avx2(t, r, i + 8, sc + c * KVC__SCALES), a1);
            a2 = _mm256_fmadd_ps(w, kvc__load8_avx2(t, r, i + 16, sc + c * KVC__SCALES), a2);
            a3 = _mm256_fmadd_ps(w, kvc__load8_avx2(t, r, i + 24, sc + c * KVC__SCALES), a3);
        }
        _mm256_storeu_ps(acc + i, a0);
        _mm256_storeu_ps(acc + i + 8, a1);
        _mm256_storeu_ps(acc + i + 16, a2);
        _mm256_storeu_ps(acc + i + 24, a3);
    }
    for (; i < d; i += 8) {
        __m256 a0 = _mm256_loadu_ps(acc + i);
        for (c = 0; c < n; ++c) a0 = _mm256_fmadd_ps(_mm256_set1_ps(p[c]), kvc__load8_avx2(t, v + (size_t)c * v_row, i, sc + c * KVC__SCALES), a0);
        _mm256_storeu_ps(acc + i, a0);
    }
}

#define KVC__FUSED_AVX2(T, name)                                                                                     \
    KVC__AVX2 static void kvc__scores_avx2_##name(const float *const *q, int32_t nr, const unsigned char *k,         \
                                                  size_t k_row, int32_t d, int32_t n, float *const *s,               \
                                                  kvc__pf *pf) {                                                     \
        kvc__pf_some(pf, INT32_MAX);                                                                                 \
        if (nr == 1) kvc__scores1_avx2(T, q[0], k, k_row, d, n, s[0]);                                               \
        else kvc__scores4_avx2(T, q, k, k_row, d, n, s);                                                             \
    }                                                                                                                \
    KVC__AVX2 static void kvc__values_avx2_##name(float *const *acc, int32_t nr, const float *const *p,              \
                                                  const unsigned char *v, size_t v_row, int32_t d, int32_t n,        \
                                                  kvc__pf *pf) {                                                     \
        kvc__pf_some(pf, INT32_MAX);                                                                                 \
        if (nr == 1) kvc__values1_avx2(T, acc[0], p[0], v, v_row, d, n);                                             \
        else kvc__values4_avx2(T, acc, p, v, v_row, d, n);                                                           \
    }
KVC__FUSED_AVX2(KVC_TYPE_F32, f32)
KVC__FUSED_AVX2(KVC_TYPE_F16, f16)
KVC__FUSED_AVX2(KVC_TYPE_BF16, bf16)
KVC__FUSED_AVX2(KVC_TYPE_Q8_0, q8_0)
KVC__FUSED_AVX2(KVC_TYPE_Q4_0, q4_0)

/* Integer scores, AVX2: a key block's 32 codes in one vector (q4_0's nibbles minus 8);
   |k| times q with k's sign moved onto it through maddubs (a pair of products stays
   below 2^15: |q|, |k| <= 127), then madd into 8 int32 lanes, exact. */
KVC__AVX2_INLINE __m256i kvc__kcodes_avx2(kvc_type t, const unsigned char *kb) {
    if (t == KVC_TYPE_Q8_0) return _mm256_loadu_si256((const __m256i *)(const void *)((const kvc__block_q8_0 *)(const void *)kb)->q);
    {
        __m128i x = _mm_loadu_si128((const __m128i *)(const void *)((const kvc__block_q4_0 *)(const void *)kb)->q);
        __m128i m = _mm_set1_epi8(15);
        __m256i c = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_and_si128(x, m)),
                                            _mm_and_si128(_mm_srli_epi16(x, 4), m), 1);
        return _mm256_sub_epi8(c, _mm256_set1_epi8(8));
    }
}
KVC__AVX2_INLINE __m256 kvc__idot_avx2(__m256i k, const int8_t *q) {
    __m256i qv = _mm256_loadu_si256((const __m256i *)(const void *)q);
    __m256i pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(k, k), _mm256_sign_epi8(qv, k));
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}
/* a[r][c] += idot lanes * (dq * dk) over the blocks; four rows x two cells, or one row
   x eight cells with the same operations per (row, cell), then one hsum8 */
KVC__AVX2_INLINE void kvc__iscores_avx2(kvc_type t, const void *const *rows, int32_t nr, const unsigned char *k,
                                        size_t k_row, int32_t d, int32_t n, float *const *s) {
    const kvc__block_q8_0 *const *q = (const kvc__block_q8_0 *const *)rows;
    size_t bb = t == KVC_TYPE_Q8_0 ? sizeof(kvc__block_q8_0) : sizeof(kvc__block_q4_0);
    int32_t nb = d / KVC__QBLOCK, c, b, i, r;
    float sc[KVC__STRIP * KVC__SCALES], dq[4][KVC__SCALES], sum[8];
    __m256 h[8];
    kvc__strip_scales(t, k, k_row, d, n, sc);
    for (r = 0; r < nr; ++r)
        for (b = 0; b < nb; ++b) dq[r][b] = _cvtsh_ss((unsigned short)(q[r][b].d[0] | (q[r][b].d[1] << 8)));
#define KVC__IDOT_AVX2(a, x, r, cell) \
    a = _mm256_fmadd_ps(kvc__idot_avx2(x, q[r][b].q), _mm256_set1_ps(dq[r][b] * sc[(cell) * KVC__SCALES + b]), a)
    if (nr == 1) {
        for (c = 0; c < n; c += 8) {
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
            int32_t ci[8];
            for (i = 0; i < 8; ++i) ci[i] = KVC__MIN(c + i, n - 1);
            for (b = 0; b < nb; ++b) {
                const unsigned char *kb = k + (size_t)b * bb;
                KVC__IDOT_AVX2(a0, kvc__kcodes_avx2(t, kb + (size_t)ci[0] * k_row), 0, ci[0]);
                KVC__IDOT_AVX2(a1, kvc__kcodes_avx2(t, kb + (size_t)ci[1] * k_row), 0, ci[1]);
                KVC__IDOT_AVX2(a2, kvc__kcodes_avx2(t, kb + (size_t)ci[2] * k_row), 0, ci[2]);
                KVC__IDOT_AVX2(a3, kvc__kcodes_avx2(t, kb + (size_t)ci[3] * k_row), 0, ci[3]);
                KVC__IDOT_AVX2(a4, kvc__kcodes_avx2(t, kb + (size_t)ci[4] * k_row), 0, ci[4]);
                KVC__IDOT_AVX2(a5, kvc__kcodes_avx2(t, kb + (size_t)ci[5] * k_row), 0, ci[5]);
                KVC__IDOT_AVX2(a6, kvc__kcodes_avx2(t, kb + (size_t)ci[6] * k_row), 0, ci[6]);
                KVC__IDOT_AVX2(a7, kvc__kcodes_avx2(t, kb + (size_t)ci[7] * k_row), 0, ci[7]);
            }
            h[0] = a0; h[1] = a1; h[2] = a2; h[3] = a3; h[4] = a4; h[5] = a5; h[6] = a6; h[7] = a7;
            _mm256_storeu_ps(sum, kvc__hsum8_avx2(h));
            for (i = 0; i < 8 && c + i < n; ++i) s[0][c + i] = sum[i];
        }
        return;
    }
    for (c = 0; c < n; c += 2) {
        int32_t c1 = KVC__MIN(c + 1, n - 1);
        __m256 a00 = _mm256_setzero_ps(), a10 = a00, a20 = a00, a30 = a00, a01 = a00, a11 = a00, a21 = a00, a31 = a00;
        for (b = 0; b < nb; ++b) {
            __m256i x0 = kvc__kcodes_avx2(t, k + (size_t)c * k_row + (size_t)b * bb);
            __m256i x1 = kvc__kcodes_avx2(t, k + (size_t)c1 * k_row + (size_t)b * bb);
            KVC__IDOT_AVX2(a00, x0, 0, c); KVC__IDOT_AVX2(a10, x0, 1, c);
            KVC__IDOT_AVX2(a20, x0, 2, c); KVC__IDOT_AVX2(a30, x0, 3, c);
            KVC__IDOT_AVX2(a01, x1, 0, c1); KVC__IDOT_AVX2(a11, x1, 1, c1);
            KVC__IDOT_AVX2(a21, x1, 2, c1); KVC__IDOT_AVX2(a31, x1, 3, c1);
        }
        h[0] = a00; h[1] = a10; h[2] = a20; h[3] = a30; h[4] = a01; h[5] = a11; h[6] = a21; h[7] = a31;
        _mm256_storeu_ps(sum, kvc__hsum8_avx2(h));
        for (i = 0; i < 2 && c + i < n; ++i) /* sum[4 * cell + row] */
            for (r = 0; r < 4; ++r) s[r][c + i] = sum[4 * i + r];
    }
#undef KVC__IDOT_AVX2
}
KVC__AVX2 static void kvc__scores_i8_avx2_q8_0(const void *const *q, int32_t nr, const unsigned char *k,
                                               size_t k_row, int32_t d, int32_t n, float *const *s, kvc__pf *pf) {
    kvc__pf_some(pf, INT32_MAX);
    kvc__iscores_avx2(KVC_TYPE_Q8_0, q, nr, k, k_row, d, n, s);
}
KVC__AVX2 static void kvc__scores_i8_avx2_q4_0(const void *const *q, int32_t nr, const unsigned char *k,
                                               size_t k_row, int32_t d, int32_t n, float *const *s, kvc__pf *pf) {
    kvc__pf_some(pf, INT32_MAX);
    kvc__iscores_avx2(KVC_TYPE_Q4_0, q, nr, k, k_row, d, n, s);
}

static const kvc__kernels kvc__kernels_avx2 = {
    "avx2", kvc__dot_avx2, kvc__masked_max4_avx2, kvc__exp_sum4_avx2, kvc__axpy_avx2, kvc__scale_avx2, 8,
    {kvc__scores_avx2_f32, kvc__scores_avx2_f16, kvc__scores_avx2_bf16, kvc__scores_avx2_q8_0, kvc__scores_avx2_q4_0},
    {kvc__values_avx2_f32, kvc__values_avx2_f16, kvc__values_avx2_bf16, kvc__values_avx2_q8_0, kvc__values_avx2_q4_0},
    {NULL, NULL, NULL, kvc__scores_i8_avx2_q8_0, kvc__scores_i8_avx2_q4_0},
    NULL, NULL, kvc__softcap_avx2};

/* -- AVX-512: 16 lanes, masked tails -- */
#if defined(__GNUC__) && !defined(__clang__) /* g++ 12 flags _mm512_undefined_* inside the intrinsics */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#define KVC__AVX512 __attribute__((target("avx,avx2,fma,f16c,avx512f,avx512dq,avx512bw,avx512vl")))
#define KVC__AVX512_INLINE KVC__AVX512 static inline __attribute__((always_inline))
KVC__AVX512_INLINE __m512 kvc__exp_avx512(__m512 x) {
    __mmask16 keep = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_GE_OQ);
    __m512 n, y;
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                             _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    x = _mm512_fnmadd_ps(n, _mm512_set1_ps(KVC__EXP_C1), x);
    x = _mm512_fnmadd_ps(n, _mm512_set1_ps(KVC__EXP_C2), x);
    y = _mm512_set1_ps(KVC__EXP_P0);
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(KVC__EXP_P1));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(KVC__EXP_P2));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(KVC__EXP_P3));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(KVC__EXP_P4));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(KVC__EXP_P5));
    y = _mm512_fmadd_ps(y, _mm512_mul_ps(x, x), _mm512_add_ps(x, _mm512_set1_ps(1.0f)));
    return _mm512_maskz_scalef_ps(keep, y, n); /* y * 2^n: one instruction for the exponent */
}
KVC__AVX512 static __mmask16 kvc__tail_mask_avx512(int32_t left) {
    return left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1u);
}
KVC__AVX512 static __m256 kvc__fold_avx512(__m512 x) {
    return _mm256_add_ps(_mm512_castps512_ps256(x), _mm512_extractf32x8_ps(x, 1));
}
/* the sums of eight vectors' lanes, in their order */
KVC__AVX512_INLINE __m256 kvc__sum8_avx512(__m512 a0, __m512 a1, __m512 a2, __m512 a3, __m512 a4, __m512 a5, __m512 a6,
                                           __m512 a7) {
    __m256 h[8];
    h[0] = kvc__fold_avx512(a0); h[1] = kvc__fold_avx512(a1); h[2] = kvc__fold_avx512(a2); h[3] = kvc__fold_avx512(a3);
    h[4] = kvc__fold_avx512(a4); h[5] = kvc__fold_avx512(a5); h[6] = kvc__fold_avx512(a6); h[7] = kvc__fold_avx512(a7);
    return kvc__hsum8_avx2(h);
}
/* The sums of sixteen vectors' lanes: lane 4k + j of the result is the sum of a[4j + k]
   (so four rows' sums for four cells, passed cell by cell, come out row by row). Each
   vector is added as halves of halves (lane i + i + 8, then + 4, + 2, + 1), pairs of
   vectors sharing every shuffle: 45 operations, where folding each vector alone and
   then adding across them took 74. */
#define KVC__PAIR256(x, y) _mm512_add_ps(_mm512_shuffle_f32x4(x, y, 0x44), _mm512_shuffle_f32x4(x, y, 0xee))
#define KVC__PAIR128(x, y) _mm512_add_ps(_mm512_shuffle_f32x4(x, y, 0x88), _mm512_shuffle_f32x4(x, y, 0xdd))
#define KVC__PAIR64(x, y) _mm512_add_ps(_mm512_shuffle_ps(x, y, 0x44), _mm512_shuffle_ps(x, y, 0xee))
#define KVC__PAIR32(x, y) _mm512_add_ps(_mm512_shuffle_ps(x, y, 0x88), _mm512_shuffle_ps(x, y, 0xdd))
KVC__AVX512_INLINE __m512 kvc__sum16_avx512(__m512 a0, __m512 a1, __m512 a2, __m512 a3, __m512 a4, __m512 a5,
                                            __m512 a6, __m512 a7, __m512 a8, __m512 a9, __m512 a10, __m512 a11,
                                            __m512 a12, __m512 a13, __m512 a14, __m512 a15) {
    __m512 c0 = KVC__PAIR256(a0, a1), c1 = KVC__PAIR256(a2, a3), c2 = KVC__PAIR256(a4, a5), c3 = KVC__PAIR256(a6, a7);
    __m512 c4 = KVC__PAIR256(a8, a9), c5 = KVC__PAIR256(a10, a11), c6 = KVC__PAIR256(a12, a13);
    __m512 c7 = KVC__PAIR256(a14, a15);
    __m512 e0 = KVC__PAIR128(c0, c1), e1 = KVC__PAIR128(c2, c3), e2 = KVC__PAIR128(c4, c5), e3 = KVC__PAIR128(c6, c7);
    return KVC__PAIR32(KVC__PAIR64(e0, e1), KVC__PAIR64(e2, e3));
}
#undef KVC__PAIR256
#undef KVC__PAIR128
#undef KVC__PAIR64
#undef KVC__PAIR32
/* four rows' sums for four cells (sum16's order) into s[r][c..c + 3], the first `cells` */
KVC__AVX512_INLINE void kvc__store4x4_avx512(__m512 sum, float *const *s, int32_t c, int32_t cells) {
    __mmask8 keep = (__mmask8)((1u << KVC__MIN(4, cells)) - 1u);
    _mm_mask_storeu_ps(s[0] + c, keep, _mm512_castps512_ps128(sum));
    _mm_mask_storeu_ps(s[1] + c, keep, _mm512_extractf32x4_ps(sum, 1));
    _mm_mask_storeu_ps(s[2] + c, keep, _mm512_extractf32x4_ps(sum, 2));
    _mm_mask_storeu_ps(s[3] + c, keep, _mm512_extractf32x4_ps(sum, 3));
}
/* one row's sums for sixteen cells (sum16's order) into s[c..c + 15], the first `cells` */
KVC__AVX512_INLINE void kvc__store16_avx512(__m512 sum, float *s, int32_t cells) {
    __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    _mm512_mask_storeu_ps(s, kvc__tail_mask_avx512(cells), _mm512_permutexvar_ps(order, sum));
}
KVC__AVX512 static void kvc__dot_avx512(const float *q, const float *k, int32_t d, size_t stride, int32_t n, float *s) {
    int32_t c, i, j, full = d & ~15;
    __mmask16 tail = kvc__tail_mask_avx512(d - full);
    for (c = 0; c < n; c += 8) {
        const float *r[8];
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0, qv;
        KVC__ROWS8(r, k, c, n, stride);
        for (i = 0; i < full; i += 16) {
            qv = _mm512_loadu_ps(q + i);
            a0 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(r[0] + i), a0);
            a1 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(r[1] + i), a1);
            a2 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(r[2] + i), a2);
            a3 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(r[3] + i), a3);
            a4 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(r[4] + i), a4);
            a5 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(r[5] + i), a5);
            a6 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(r[6] + i), a6);
            a7 = _mm512_fmadd_ps(qv, _mm512_loadu_ps(r[7] + i), a7);
        }
        if (full < d) {
            qv = _mm512_maskz_loadu_ps(tail, q + full);
            a0 = _mm512_fmadd_ps(qv, _mm512_maskz_loadu_ps(tail, r[0] + full), a0);
            a1 = _mm512_fmadd_ps(qv, _mm512_maskz_loadu_ps(tail, r[1] + full), a1);
            a2 = _mm512_fmadd_ps(qv, _mm512_maskz_loadu_ps(tail, r[2] + full), a2);
            a3 = _mm512_fmadd_ps(qv, _mm512_maskz_loadu_ps(tail, r[3] + full), a3);
            a4 = _mm512_fmadd_ps(qv, _mm512_maskz_loadu_ps(tail, r[4] + full), a4);
            a5 = _mm512_fmadd_ps(qv, _mm512_maskz_loadu_ps(tail, r[5] + full), a5);
            a6 = _mm512_fmadd_ps(qv, _mm512_maskz_loadu_ps(tail, r[6] + full), a6);
            a7 = _mm512_fmadd_ps(qv, _mm512_maskz_loadu_ps(tail, r[7] + full), a7);
        }
        _mm256_mask_storeu_ps(s + c, (__mmask8)((1u << KVC__MIN(8, n - c)) - 1u),
                              kvc__sum8_avx512(a0, a1, a2, a3, a4, a5, a6, a7));
    }
}
/* Four rows' vectors reduced together, each as halves of halves: lanes 4r..4r+3 of
   the result all hold row r's maximum (or sum). */
#define KVC__REDUCE4_AVX512(op, x0, x1, x2, x3, e)                                                                  \
    do {                                                                                                            \
        __m512 c0_ = op(_mm512_shuffle_f32x4(x0, x1, 0x44), _mm512_shuffle_f32x4(x0, x1, 0xee));                     \
        __m512 c1_ = op(_mm512_shuffle_f32x4(x2, x3, 0x44), _mm512_shuffle_f32x4(x2, x3, 0xee));                     \
        e = op(_mm512_shuffle_f32x4(c0_, c1_, 0x88), _mm512_shuffle_f32x4(c0_, c1_, 0xdd));                          \
        e = op(e, _mm512_permute_ps(e, 0x4e));                                                                      \
        e = op(e, _mm512_permute_ps(e, 0xb1));                                                                      \
    } while (0)
/* lanes 0, 4, 8 and 12 of e into out[0..3] */
KVC__AVX512_INLINE void kvc__lanes4_avx512(__m512 e, float *out) {
    _mm_storeu_ps(out, _mm512_castps512_ps128(_mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0,
                                                                                      0, 0, 0, 0, 0), e)));
}
/* 16 scores, -inf where vis has no bit */
KVC__AVX512_INLINE __m512 kvc__row_load_avx512(const float *s, uint32_t vis) {
    return _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), (__mmask16)vis, s);
}
#define KVC__MAX_ROW_AVX512(r, m, b)                                                                                \
    if (r < nr) {                                                                                                   \
        __mmask16 k_ = (__mmask16)(vis[r] >> c);                                                                    \
        __m512 x_ = _mm512_maskz_loadu_ps(k_, s[r] + c); /* masked: 0 */                                            \
        m = _mm512_max_ps(m, _mm512_mask_blend_ps(k_, _mm512_set1_ps(-INFINITY), x_));                              \
        b = _mm512_add_ps(b, _mm512_sub_ps(x_, x_));                                                                \
    }
KVC__AVX512 static void kvc__masked_max4_avx512(float *const *s, const uint32_t *vis, int32_t nr, int32_t n,
                                                float *max) {
    __m512 m0 = _mm512_set1_ps(-INFINITY), m1 = m0, m2 = m0, m3 = m0, e;
    __m512 b0 = _mm512_setzero_ps(), b1 = b0, b2 = b0, b3 = b0; /* x - x: NaN where a visible x is not finite */
    float bad[4];
    int32_t c, r;
    for (c = 0; c < n; c += 16) { /* vis has no bit at or past n */
        KVC__MAX_ROW_AVX512(0, m0, b0)
        KVC__MAX_ROW_AVX512(1, m1, b1)
        KVC__MAX_ROW_AVX512(2, m2, b2)
        KVC__MAX_ROW_AVX512(3, m3, b3)
    }
    KVC__REDUCE4_AVX512(_mm512_max_ps, m0, m1, m2, m3, e);
    kvc__lanes4_avx512(e, max);
    KVC__REDUCE4_AVX512(_mm512_add_ps, b0, b1, b2, b3, e);
    kvc__lanes4_avx512(e, bad);
    for (r = 0; r < 4; ++r)
        if (bad[r] != bad[r]) max[r] = NAN; /* (kvc__masked_max_scalar) */
}
#undef KVC__MAX_ROW_AVX512
/* row r's weights over cells [c, c + 16), stored and added to a (rows past nr: none) */
#define KVC__EXP_ROW_AVX512(r, a)                                                                                     \
    if (r < nr) {                                                                                                   \
        __m512 x_ = _mm512_mul_ps(kvc__row_load_avx512(s[r] + c, vis[r] >> c), vs);                                  \
        __m512 p_ = kvc__exp_avx512(_mm512_sub_ps(x_, _mm512_set1_ps(m[r]))); /* -inf lanes give 0 */              \
        _mm512_mask_storeu_ps(s[r] + c, kvc__tail_mask_avx512(n - c), p_);                                          \
        a = _mm512_add_ps(a, p_);                                                                                   \
    }
KVC__AVX512 static void kvc__exp_sum4_avx512(float *const *s, const uint32_t *vis, int32_t nr, int32_t n, float scale,
                                             const float *m, float *sum) {
    __m512 vs = _mm512_set1_ps(scale), a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, e;
    int32_t c;
    for (c = 0; c < n; c += 16) {
        KVC__EXP_ROW_AVX512(0, a0)
        KVC__EXP_ROW_AVX512(1, a1)
        KVC__EXP_ROW_AVX512(2, a2)
        KVC__EXP_ROW_AVX512(3, a3)
    }
    KVC__REDUCE4_AVX512(_mm512_add_ps, a0, a1, a2, a3, e);
    kvc__lanes4_avx512(e, sum);
}
#undef KVC__EXP_ROW_AVX512
#undef KVC__REDUCE4_AVX512
KVC__AVX512 static void kvc__softcap_avx512(float *const *s, int32_t nr, int32_t n, float scale, float cap) {
    __m512 k = _mm512_set1_ps(scale / cap), vc = _mm512_set1_ps(cap), one = _mm512_set1_ps(1.0f);
    int32_t r, c;
    for (r = 0; r < nr; ++r)
        for (c = 0; c < n; c += 16) { /* as kvc__tanh_cap_sse2 */
            __mmask16 m = kvc__tail_mask_avx512(n - c);
            __m512 y = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, s[r] + c), k);
            __m512 e = kvc__exp_avx512(_mm512_mul_ps(_mm512_abs_ps(y), _mm512_set1_ps(-2.0f)));
            __m512 t = _mm512_div_ps(_mm512_sub_ps(one, e), _mm512_add_ps(one, e));
            __m512i sy = _mm512_and_si512(_mm512_castps_si512(y), _mm512_set1_epi32((int)0x80000000u));
            t = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(t), sy));
            _mm512_mask_storeu_ps(s[r] + c, m, _mm512_mul_ps(t, vc));
        }
}
KVC__AVX512 static void kvc__axpy_avx512(float *acc, const float *p, const float *v, int32_t d, size_t stride, int32_t n) {
    int32_t i = 0, c;
    for (; i + 64 <= d; i += 64) { /* four accumulators stay in registers across the cells */
        __m512 a0 = _mm512_loadu_ps(acc + i), a1 = _mm512_loadu_ps(acc + i + 16);
        __m512 a2 = _mm512_loadu_ps(acc + i + 32), a3 = _mm512_loadu_ps(acc + i + 48);
        for (c = 0; c < n; ++c) {
            __m512 w = _mm512_set1_ps(p[c]);
            const float *row = v + (size_t)c * stride + i;
            a0 = _mm512_fmadd_ps(w, _mm512_loadu_ps(row), a0);
            a1 = _mm512_fmadd_ps(w, _mm512_loadu_ps(row + 16), a1);
            a2 = _mm512_fmadd_ps(w, _mm512_loadu_ps(row + 32), a2);
            a3 = _mm512_fmadd_ps(w, _mm512_loadu_ps(row + 48), a3);
        }
        _mm512_storeu_ps(acc + i, a0);
        _mm512_storeu_ps(acc + i + 16, a1);
        _mm512_storeu_ps(acc + i + 32, a2);
        _mm512_storeu_ps(acc + i + 48, a3);
    }
    for (; i < d; i += 16) {
        __mmask16 m = kvc__tail_mask_avx512(d - i);
        __m512 a = _mm512_maskz_loadu_ps(m, acc + i);
        for (c = 0; c < n; ++c) a = _mm512_fmadd_ps(_mm512_set1_ps(p[c]), _mm512_maskz_loadu_ps(m, v + (size_t)c * stride + i), a);
        _mm512_mask_storeu_ps(acc + i, m, a);
    }
}
KVC__AVX512 static void kvc__scale_avx512(float *x, int32_t n, float a) {
    __m512 va = _mm512_set1_ps(a);
    int32_t i;
    for (i = 0; i < n; i += 16) {
        __mmask16 m = kvc__tail_mask_avx512(n - i);
        _mm512_mask_storeu_ps(x + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), va));
    }
}

/* Fused AVX-512 kernels: K and V are read in their storage type and converted in
   registers, once for up to four query rows (a GQA group), never written to a tile.
   The storage type is a constant after inlining, so each wrapper below is its own
   specialised loop. Head dims must be multiples of 16 (others take the tile path). */

/* 16 values of a head row from value i (a multiple of 16) as f32; sc: the row's block
   scales as floats (block types) */
KVC__AVX512_INLINE __m512 kvc__load16_avx512(kvc_type t, const unsigned char *row, int32_t i, const float *sc) {
    if (t == KVC_TYPE_F32) return _mm512_loadu_ps((const float *)(const void *)row + i);
    if (t == KVC_TYPE_F16) return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(row + 2 * i)));
    if (t == KVC_TYPE_BF16)
        return _mm512_castsi512_ps(
            _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(const void *)(row + 2 * i))), 16));
    if (t == KVC_TYPE_Q8_0) {
        const kvc__block_q8_0 *b = (const kvc__block_q8_0 *)(const void *)row + i / KVC__QBLOCK;
        __m512i q = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(const void *)(b->q + (i & 31))));
        return _mm512_mul_ps(_mm512_cvtepi32_ps(q), _mm512_set1_ps(sc[i / KVC__QBLOCK]));
    } else {
        const kvc__block_q4_0 *b = (const kvc__block_q4_0 *)(const void *)row + i / KVC__QBLOCK;
        __m128i x = _mm_loadu_si128((const __m128i *)(const void *)b->q);
        __m512i q;
        if (i & 31) x = _mm_srli_epi16(x, 4); /* values 16..31 are the high nibbles */
        q = _mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm_and_si128(x, _mm_set1_epi8(0x0f))), _mm512_set1_epi32(8));
        return _mm512_mul_ps(_mm512_cvtepi32_ps(q), _mm512_set1_ps(sc[i / KVC__QBLOCK]));
    }
}

/* s[r][c] = q[r] . k[c] for four rows and n cells, four cells at a time */
KVC__AVX512_INLINE void kvc__scores4_avx512(kvc_type t, const float *const *q, const unsigned char *k, size_t k_row,
                                            int32_t d, int32_t n, float *const *s, kvc__pf *pf) {
    int32_t c, i, per = kvc__pf_pace(pf, (n + 3) / 4);
    float sc[KVC__STRIP * KVC__SCALES];
    kvc__strip_scales(t, k, k_row, d, n, sc);
    for (c = 0; c < n; c += 4) {
        const unsigned char *k0 = k + (size_t)c * k_row, *k1 = k + (size_t)KVC__MIN(c + 1, n - 1) * k_row;
        const unsigned char *k2 = k + (size_t)KVC__MIN(c + 2, n - 1) * k_row, *k3 = k + (size_t)KVC__MIN(c + 3, n - 1) * k_row;
        const float *s0 = sc + c * KVC__SCALES, *s1 = sc + KVC__MIN(c + 1, n - 1) * KVC__SCALES;
        const float *s2 = sc + KVC__MIN(c + 2, n - 1) * KVC__SCALES, *s3 = sc + KVC__MIN(c + 3, n - 1) * KVC__SCALES;
        __m512 a00 = _mm512_setzero_ps(), a10 = a00, a20 = a00, a30 = a00, a01 = a00, a11 = a00, a21 = a00, a31 = a00;
        __m512 a02 = a00, a12 = a00, a22 = a00, a32 = a00, a03 = a00, a13 = a00, a23 = a00, a33 = a00;
        kvc__pf_some(pf, per);
        for (i = 0; i < d; i += 16) {
            __m512 q0 = _mm512_loadu_ps(q[0] + i), q1 = _mm512_loadu_ps(q[1] + i);
            __m512 q2 = _mm512_loadu_ps(q[2] + i), q3 = _mm512_loadu_ps(q[3] + i), x;
            x = kvc__load16_avx512(t, k0, i, s0);
            a00 = _mm512_fmadd_ps(q0, x, a00); a10 = _mm512_fmadd_ps(q1, x, a10);
            a20 = _mm512_fmadd_ps(q2, x, a20); a30 = _mm512_fmadd_ps(q3, x, a30);
            x = kvc__load16_avx512(t, k1, i, s1);
            a01 = _mm512_fmadd_ps(q0, x, a01); a11 = _mm512_fmadd_ps(q1, x, a11);
            a21 = _mm512_fmadd_ps(q2, x, a21); a31 = _mm512_fmadd_ps(q3, x, a31);
            x = kvc__load16_avx512(t, k2, i, s2);
            a02 = _mm512_fmadd_ps(q0, x, a02); a12 = _mm512_fmadd_ps(q1, x, a12);
            a22 = _mm512_fmadd_ps(q2, x, a22); a32 = _mm512_fmadd_ps(q3, x, a32);
            x = kvc__load16_avx512(t, k3, i, s3);
            a03 = _mm512_fmadd_ps(q0, x, a03); a13 = _mm512_fmadd_ps(q1, x, a13);
            a23 = _mm512_fmadd_ps(q2, x, a23); a33 = _mm512_fmadd_ps(q3, x, a33);
        }
        kvc__store4x4_avx512(kvc__sum16_avx512(a00, a10, a20, a30, a01, a11, a21, a31, a02, a12, a22, a32, a03, a13, a23,
                                               a33),
                             s, c, n - c);
    }
}

/* one row: eight cells at a time, each cell's sum in the order of a row of scores4
   (sixteen rows a call, 8 KB apart with 32 kv heads, took 15 % longer: rows at such
   strides share the L1's sets, and sixteen of them overflow its eight ways) */
KVC__AVX512_INLINE void kvc__scores1_avx512(kvc_type t, const float *q, const unsigned char *k, size_t k_row, int32_t d,
                                            int32_t n, float *s, kvc__pf *pf) {
    int32_t c, i, j, per = kvc__pf_pace(pf, (n + 7) / 8);
    float sc[KVC__STRIP * KVC__SCALES];
    kvc__strip_scales(t, k, k_row, d, n, sc);
    for (c = 0; c < n; c += 8) {
        const unsigned char *r[8];
        const float *rs[8];
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0, z = a0;
        kvc__pf_some(pf, per);
        for (j = 0; j < 8; ++j) { /* past the last cell the rows repeat it; their sums are not stored */
            r[j] = k + (size_t)KVC__MIN(c + j, n - 1) * k_row;
            rs[j] = sc + KVC__MIN(c + j, n - 1) * KVC__SCALES;
        }
        for (i = 0; i < d; i += 16) {
            __m512 qv = _mm512_loadu_ps(q + i);
            a0 = _mm512_fmadd_ps(qv, kvc__load16_avx512(t, r[0], i, rs[0]), a0);
            a1 = _mm512_fmadd_ps(qv, kvc__load16_avx512(t, r[1], i, rs[1]), a1);
            a2 = _mm512_fmadd_ps(qv, kvc__load16_avx512(t, r[2], i, rs[2]), a2);
            a3 = _mm512_fmadd_ps(qv, kvc__load16_avx512(t, r[3], i, rs[3]), a3);
            a4 = _mm512_fmadd_ps(qv, kvc__load16_avx512(t, r[4], i, rs[4]), a4);
            a5 = _mm512_fmadd_ps(qv, kvc__load16_avx512(t, r[5], i, rs[5]), a5);
            a6 = _mm512_fmadd_ps(qv, kvc__load16_avx512(t, r[6], i, rs[6]), a6);
            a7 = _mm512_fmadd_ps(qv, kvc__load16_avx512(t, r[7], i, rs[7]), a7);
        }
        kvc__store16_avx512(kvc__sum16_avx512(a0, a1, a2, a3, a4, a5, a6, a7, z, z, z, z, z, z, z, z), s + c,
                            KVC__MIN(8, n - c));
    }
}

/* acc[r] += sum_c p[r][c] v[c] for four rows: 64 values at a time (16 accumulators,
   each cell's four weights broadcast once), then 16 at a time */
#define KVC__V4_LOAD(j)                                                                                              \
    __m512 a0##j = _mm512_loadu_ps(acc[0] + i + 16 * j), a1##j = _mm512_loadu_ps(acc[1] + i + 16 * j);               \
    __m512 a2##j = _mm512_loadu_ps(acc[2] + i + 16 * j), a3##j = _mm512_loadu_ps(acc[3] + i + 16 * j);
#define KVC__V4_FMA(j)                                                                                               \
    x = kvc__load16_avx512(t, r, i + 16 * j, s);                                                                     \
    a0##j = _mm512_fmadd_ps(w0, x, a0##j); a1##j = _mm512_fmadd_ps(w1, x, a1##j);                                    \
    a2##j = _mm512_fmadd_ps(w2, x, a2##j); a3##j = _mm512_fmadd_ps(w3, x, a3##j);
#define KVC__V4_STORE(j)                                                                                             \
    _mm512_storeu_ps(acc[0] + i + 16 * j, a0##j); _mm512_storeu_ps(acc[1] + i + 16 * j, a1##j);                      \
    _mm512_storeu_ps(acc[2] + i + 16 * j, a2##j); _mm512_storeu_ps(acc[3] + i + 16 * j, a3##j);
KVC__AVX512_INLINE void kvc__values4_avx512(kvc_type t, float *const *acc, const float *const *p, const unsigned char *v,
                                            size_t v_row, int32_t d, int32_t n, kvc__pf *pf) {
    int32_t i = 0, c, per = kvc__pf_pace(pf, d / 64 * n);
    float sc[KVC__STRIP * KVC__SCALES];
    kvc__strip_scales(t, v, v_row, d, n, sc);
    for (; i + 64 <= d; i += 64) {
        KVC__V4_LOAD(0) KVC__V4_LOAD(1) KVC__V4_LOAD(2) KVC__V4_LOAD(3)
        for (c = 0; c < n; ++c) {
            const unsigned char *r = v + (size_t)c * v_row;
            const float *s = sc + c * KVC__SCALES;
            __m512 w0 = _mm512_set1_ps(p[0][c]), w1 = _mm512_set1_ps(p[1][c]);
            __m512 w2 = _mm512_set1_ps(p[2][c]), w3 = _mm512_set1_ps(p[3][c]), x;
            KVC__V4_FMA(0) KVC__V4_FMA(1) KVC__V4_FMA(2) KVC__V4_FMA(3)
            kvc__pf_some(pf, per);
        }
        KVC__V4_STORE(0) KVC__V4_STORE(1) KVC__V4_STORE(2) KVC__V4_STORE(3)
    }
    for (; i < d; i += 16) {
        __m512 a0 = _mm512_loadu_ps(acc[0] + i), a1 = _mm512_loadu_ps(acc[1] + i);
        __m512 a2 = _mm512_loadu_ps(acc[2] + i), a3 = _mm512_loadu_ps(acc[3] + i);
        for (c = 0; c < n; ++c) {
            __m512 x = kvc__load16_avx512(t, v + (size_t)c * v_row, i, sc + c * KVC__SCALES);
            a0 = _mm512_fmadd_ps(_mm512_set1_ps(p[0][c]), x, a0);
            a1 = _mm512_fmadd_ps(_mm512_set1_ps(p[1][c]), x, a1);
            a2 = _mm512_fmadd_ps(_mm512_set1_ps(p[2][c]), x, a2);
            a3 = _mm512_fmadd_ps(_mm512_set1_ps(p[3][c]), x, a3);
        }
        _mm512_storeu_ps(acc[0] + i, a0);
        _mm512_storeu_ps(acc[1] + i, a1);
        _mm512_storeu_ps(acc[2] + i, a2);
        _mm512_storeu_ps(acc[3] + i, a3);
    }
}

/* one row: the same order of operations as a row of values4, so a query's result
   does not depend on how many rows shared its call (four 16-value chains at a time) */
KVC__AVX512_INLINE void kvc__values1_avx512(kvc_type t, float *acc, const float *p, const unsigned char *v,
                                            size_t v_row, int32_t d, int32_t n, kvc__pf *pf) {
    int32_t i = 0, c;
    float sc[KVC__STRIP * KVC__SCALES];
    kvc__pf_some(pf, INT32_MAX); /* at once, before its short loop (spreading them was not measured faster here) */
    kvc__strip_scales(t, v, v_row, d, n, sc);
    for (; i + 64 <= d; i += 64) {
        __m512 a0 = _mm512_loadu_ps(acc + i), a1 = _mm512_loadu_ps(acc + i + 16);
        __m512 a2 = _mm512_loadu_ps(acc + i + 32), a3 = _mm512_loadu_ps(acc + i + 48);
        for (c = 0; c < n; ++c) {
            const unsigned char *r = v + (size_t)c * v_row;
            __m512 w = _mm512_set1_ps(p[c]);
            a0 = _mm512_fmadd_ps(w, kvc__load16_avx512(t, r, i, sc + c * KVC__SCALES), a0);
            a1 = _mm512_fmadd_ps(w, kvc__load16_avx512(t, r, i + 16, sc + c * KVC__SCALES), a1);
            a2 = _mm512_fmadd_ps(w, kvc__load16_avx512(t, r, i + 32, sc + c * KVC__SCALES), a2);
            a3 = _mm512_fmadd_ps(w, kvc__load16_avx512(t, r, i + 48, sc + c * KVC__SCALES), a3);
        }
        _mm512_storeu_ps(acc + i, a0);
        _mm512_storeu_ps(acc + i + 16, a1);
        _mm512_storeu_ps(acc + i + 32, a2);
        _mm512_storeu_ps(acc + i + 48, a3);
    }
    for (; i < d; i += 16) {
        __m512 a0 = _mm512_loadu_ps(acc + i);
        for (c = 0; c < n; ++c) a0 = _mm512_fmadd_ps(_mm512_set1_ps(p[c]), kvc__load16_avx512(t, v + (size_t)c * v_row, i, sc + c * KVC__SCALES), a0);
        _mm512_storeu_ps(acc + i, a0);
    }
}

#define KVC__FUSED_AVX512(T, name)                                                                                   \
    KVC__AVX512 static void kvc__scores_avx512_##name(const float *const *q, int32_t nr, const unsigned char *k,     \
                                                      size_t k_row, int32_t d, int32_t n, float *const *s,           \
                                                      kvc__pf *pf) {                                                 \
        if (nr == 1) kvc__scores1_avx512(T, q[0], k, k_row, d, n, s[0], pf);                                         \
        else kvc__scores4_avx512(T, q, k, k_row, d, n, s, pf);                                                       \
    }                                                                                                                \
    KVC__AVX512 static void kvc__values_avx512_##name(float *const *acc, int32_t nr, const float *const *p,          \
                                                      const unsigned char *v, size_t v_row, int32_t d, int32_t n,    \
                                                      kvc__pf *pf) {                                                 \
        if (nr == 1) kvc__values1_avx512(T, acc[0], p[0], v, v_row, d, n, pf);                                       \
        else kvc__values4_avx512(T, acc, p, v, v_row, d, n, pf);                                                     \
    }
KVC__FUSED_AVX512(KVC_TYPE_F32, f32)
KVC__FUSED_AVX512(KVC_TYPE_F16, f16)
KVC__FUSED_AVX512(KVC_TYPE_BF16, bf16)
KVC__FUSED_AVX512(KVC_TYPE_Q8_0, q8_0)
KVC__FUSED_AVX512(KVC_TYPE_Q4_0, q4_0)


/* Integer scores with AVX-512 VNNI: vpdpbusd multiplies unsigned by signed bytes, 64
   at a time, so a pair of key blocks is made unsigned (q8_0 codes + 128; q4_0's
   nibbles as stored) and a prepared query row holds, per pair of blocks, its codes in
   the key's lane order, the bias that undoes the offset (-offset x the sum of each
   lane's four codes) and its block scales spread over their lanes (kvc__i8_prepare_vnni,
   once per task). Lanes of a pair: q8_0 blocks in lanes 0-7 and 8-15; q4_0 low nibbles
   of both blocks then high nibbles, so block b has lanes 0-3 and 8-11, block b + 1
   lanes 4-7 and 12-15. Head dims above 256 take the AVX2 kernels (plain rows). */
#define KVC__VNNI __attribute__((target("avx,avx2,fma,f16c,avx512f,avx512dq,avx512bw,avx512vl,avx512vnni")))
#define KVC__VNNI_INLINE KVC__VNNI static inline __attribute__((always_inline))
#define KVC__VNNI_MAX_DIM 256

static size_t kvc__i8_row_bytes_vnni(kvc_type t, int32_t d) {
    (void)t;
    if (d > KVC__VNNI_MAX_DIM) return (size_t)(d / KVC__QBLOCK) * sizeof(kvc__block_q8_0);
    return (size_t)((d / KVC__QBLOCK + 1) / 2) * 3 * 64;
}
/* two 16-bit words over the lanes of blocks b and b + 1 of a pair */
KVC__VNNI_INLINE __m256i kvc__spread16_vnni(kvc_type t, uint16_t h0, uint16_t h1) {
    long long w0 = (long long)(0x0001000100010001ull * h0), w1 = (long long)(0x0001000100010001ull * h1);
    return t == KVC_TYPE_Q8_0 ? _mm256_set_epi64x(w1, w1, w0, w0) : _mm256_set_epi64x(w1, w0, w1, w0);
}
KVC__VNNI static void kvc__i8_prepare_vnni(kvc_type t, int32_t d, const kvc__block_q8_0 *q, void *row) {
    int32_t nb = d / KVC__QBLOCK, j;
    __m512i *out = (__m512i *)row;
    if (d > KVC__VNNI_MAX_DIM) {
        memcpy(row, q, (size_t)nb * sizeof(kvc__block_q8_0));
        return;
    }
    for (j = 0; 2 * j < nb; ++j, q += 2, out += 3) {
        int one = 2 * j + 1 >= nb;
        __m256i lo = _mm256_loadu_si256((const __m256i *)(const void *)q[0].q);
        __m256i hi = one ? _mm256_setzero_si256() : _mm256_loadu_si256((const __m256i *)(const void *)q[1].q);
        __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
        uint16_t h0 = (uint16_t)(q[0].d[0] | (q[0].d[1] << 8)), h1 = one ? 0 : (uint16_t)(q[1].d[0] | (q[1].d[1] << 8));
        if (t == KVC_TYPE_Q4_0) z = _mm512_shuffle_i64x2(z, z, _MM_SHUFFLE(3, 1, 2, 0)); /* lo b, lo b+1, hi b, hi b+1 */
        out[0] = z;
        out[1] = _mm512_sub_epi32(_mm512_setzero_si512(),
                                  _mm512_dpbusd_epi32(_mm512_setzero_si512(),
                                                      _mm512_set1_epi8(t == KVC_TYPE_Q8_0 ? (char)0x80 : 8), z));
        out[2] = _mm512_castps_si512(_mm512_cvtph_ps(kvc__spread16_vnni(t, h0, h1)));
    }
}
/* a pair of key blocks (only b when `one`) as unsigned bytes in the lane order above */
KVC__VNNI_INLINE __m512i kvc__kpair_vnni(kvc_type t, const unsigned char *kb, size_t bb, int one) {
    if (t == KVC_TYPE_Q8_0) {
        __m256i lo = _mm256_loadu_si256((const __m256i *)(const void *)(kb + 2));
        __m256i hi = one ? _mm256_setzero_si256() : _mm256_loadu_si256((const __m256i *)(const void *)(kb + bb + 2));
        return _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1), _mm512_set1_epi8((char)0x80));
    } else {
        __m128i lo = _mm_loadu_si128((const __m128i *)(const void *)(kb + 2));
        __m128i hi = one ? _mm_setzero_si128() : _mm_loadu_si128((const __m128i *)(const void *)(kb + bb + 2));
        __m256i x = _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1), m = _mm256_set1_epi8(15);
        return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(x, m)),
                                  _mm256_and_si256(_mm256_srli_epi16(x, 4), m), 1);
    }
}
/* the pair's key scales over their lanes, converted from f16 in the vector unit */
KVC__VNNI_INLINE __m512 kvc__kscale_vnni(kvc_type t, const unsigned char *kb, size_t bb, int one) {
    __m128i h0 = _mm_set1_epi16((short)(kb[0] | (kb[1] << 8)));
    __m128i h1 = one ? _mm_setzero_si128() : _mm_set1_epi16((short)(kb[bb] | (kb[bb + 1] << 8)));
    if (t == KVC_TYPE_Q8_0) return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(h0), h1, 1));
    h0 = _mm_unpacklo_epi64(h0, h1);
    return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(h0), h0, 1));
}
/* f += (idot lanes of row r, pair j) * dq * dk */
#define KVC__ISTEP_VNNI(f, x, dk, r)                                                                                 \
    f = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_dpbusd_epi32(q[r][3 * j + 1], x, q[r][3 * j])),       \
                                      _mm512_castsi512_ps(q[r][3 * j + 2])),                                         \
                        dk, f)
#define KVC__KPAIR_VNNI(x, dk, cell)                                                                                  \
    kb = k + (size_t)(cell) * k_row + (size_t)(2 * j) * bb;                                                          \
    x = kvc__kpair_vnni(t, kb, bb, one);                                                                             \
    dk = kvc__kscale_vnni(t, kb, bb, one)
/* odd: the head has an odd number of blocks (a constant after inlining, so even ones
   pay nothing for the half pair at the end) */
KVC__VNNI_INLINE void kvc__iscores_vnni(kvc_type t, int odd, const void *const *rows, int32_t nr,
                                        const unsigned char *k, size_t k_row, int32_t d, int32_t n, float *const *s,
                                        kvc__pf *pf) {
    size_t bb = t == KVC_TYPE_Q8_0 ? sizeof(kvc__block_q8_0) : sizeof(kvc__block_q4_0);
    int32_t nb = d / KVC__QBLOCK, np = (nb + 1) / 2, c, i, j, r;
    int32_t per = kvc__pf_pace(pf, nr == 1 ? (n + 7) / 8 : (n + 3) / 4);
    const __m512i *q[4];
    const unsigned char *kb;
    for (r = 0; r < nr; ++r) q[r] = (const __m512i *)rows[r];
    if (nr == 1) { /* eight cells at a time (as scores1_avx512), each cell's sum in the order of a row below */
        for (c = 0; c < n; c += 8) {
            __m512 f0 = _mm512_setzero_ps(), f1 = f0, f2 = f0, f3 = f0, f4 = f0, f5 = f0, f6 = f0, f7 = f0, z = f0, dk;
            __m512i x;
            int32_t ci[8];
            kvc__pf_some(pf, per);
            for (i = 0; i < 8; ++i) ci[i] = KVC__MIN(c + i, n - 1);
            for (j = 0; j < np; ++j) {
                int one = odd && 2 * j + 1 == nb;
                KVC__KPAIR_VNNI(x, dk, ci[0]); KVC__ISTEP_VNNI(f0, x, dk, 0);
                KVC__KPAIR_VNNI(x, dk, ci[1]); KVC__ISTEP_VNNI(f1, x, dk, 0);
                KVC__KPAIR_VNNI(x, dk, ci[2]); KVC__ISTEP_VNNI(f2, x, dk, 0);
                KVC__KPAIR_VNNI(x, dk, ci[3]); KVC__ISTEP_VNNI(f3, x, dk, 0);
                KVC__KPAIR_VNNI(x, dk, ci[4]); KVC__ISTEP_VNNI(f4, x, dk, 0);
                KVC__KPAIR_VNNI(x, dk, ci[5]); KVC__ISTEP_VNNI(f5, x, dk, 0);
                KVC__KPAIR_VNNI(x, dk, ci[6]); KVC__ISTEP_VNNI(f6, x, dk, 0);
                KVC__KPAIR_VNNI(x, dk, ci[7]); KVC__ISTEP_VNNI(f7, x, dk, 0);
            }
            kvc__store16_avx512(kvc__sum16_avx512(f0, f1, f2, f3, f4, f5, f6, f7, z, z, z, z, z, z, z, z), s[0] + c,
                                KVC__MIN(8, n - c));
        }
        return;
    }
    for (c = 0; c < n; c += 4) { /* four rows x four cells */
        int32_t c1 = KVC__MIN(c + 1, n - 1), c2 = KVC__MIN(c + 2, n - 1), c3 = KVC__MIN(c + 3, n - 1);
        __m512 f00 = _mm512_setzero_ps(), f10 = f00, f20 = f00, f30 = f00, f01 = f00, f11 = f00, f21 = f00, f31 = f00;
        __m512 f02 = f00, f12 = f00, f22 = f00, f32 = f00, f03 = f00, f13 = f00, f23 = f00, f33 = f00;
        __m512 d0, d1;
        __m512i x0, x1;
        kvc__pf_some(pf, per);
        for (j = 0; j < np; ++j) {
            int one = odd && 2 * j + 1 == nb;
            KVC__KPAIR_VNNI(x0, d0, c);
            KVC__KPAIR_VNNI(x1, d1, c1);
            KVC__ISTEP_VNNI(f00, x0, d0, 0); KVC__ISTEP_VNNI(f10, x0, d0, 1);
            KVC__ISTEP_VNNI(f20, x0, d0, 2); KVC__ISTEP_VNNI(f30, x0, d0, 3);
            KVC__ISTEP_VNNI(f01, x1, d1, 0); KVC__ISTEP_VNNI(f11, x1, d1, 1);
            KVC__ISTEP_VNNI(f21, x1, d1, 2); KVC__ISTEP_VNNI(f31, x1, d1, 3);
            KVC__KPAIR_VNNI(x0, d0, c2);
            KVC__KPAIR_VNNI(x1, d1, c3);
            KVC__ISTEP_VNNI(f02, x0, d0, 0); KVC__ISTEP_VNNI(f12, x0, d0, 1);
            KVC__ISTEP_VNNI(f22, x0, d0, 2); KVC__ISTEP_VNNI(f32, x0, d0, 3);
            KVC__ISTEP_VNNI(f03, x1, d1, 0); KVC__ISTEP_VNNI(f13, x1, d1, 1);
            KVC__ISTEP_VNNI(f23, x1, d1, 2); KVC__ISTEP_VNNI(f33, x1, d1, 3);
        }
        kvc__store4x4_avx512(kvc__sum16_avx512(f00, f10, f20, f30, f01, f11, f21, f31, f02, f12, f22, f32, f03, f13, f23,
                                               f33),
                             s, c, n - c);
    }
}
#undef KVC__ISTEP_VNNI
#undef KVC__KPAIR_VNNI
KVC__VNNI static void kvc__scores_i8_vnni_q8_0(const void *const *q, int32_t nr, const unsigned char *k, size_t k_row,
                                               int32_t d, int32_t n, float *const *s, kvc__pf *pf) {
    if (d > KVC__VNNI_MAX_DIM) kvc__scores_i8_avx2_q8_0(q, nr, k, k_row, d, n, s, pf);
    else if (d % (2 * KVC__QBLOCK)) kvc__iscores_vnni(KVC_TYPE_Q8_0, 1, q, nr, k, k_row, d, n, s, pf);
    else kvc__iscores_vnni(KVC_TYPE_Q8_0, 0, q, nr, k, k_row, d, n, s, pf);
}
KVC__VNNI static void kvc__scores_i8_vnni_q4_0(const void *const *q, int32_t nr, const unsigned char *k, size_t k_row,
                                               int32_t d, int32_t n, float *const *s, kvc__pf *pf) {
    if (d > KVC__VNNI_MAX_DIM) kvc__scores_i8_avx2_q4_0(q, nr, k, k_row, d, n, s, pf);
    else if (d % (2 * KVC__QBLOCK)) kvc__iscores_vnni(KVC_TYPE_Q4_0, 1, q, nr, k, k_row, d, n, s, pf);
    else kvc__iscores_vnni(KVC_TYPE_Q4_0, 0, q, nr, k, k_row, d, n, s, pf);
}

/* AVX-512 without VNNI scores block keys with the AVX2 integer kernels */
#define KVC__KERNELS_AVX512(name, i8_q8_0, i8_q4_0, i8_row_bytes, i8_prepare)                                                                  \
    {name, kvc__dot_avx512, kvc__masked_max4_avx512, kvc__exp_sum4_avx512, kvc__axpy_avx512, kvc__scale_avx512, 16,  \
     {kvc__scores_avx512_f32, kvc__scores_avx512_f16, kvc__scores_avx512_bf16, kvc__scores_avx512_q8_0,              \
      kvc__scores_avx512_q4_0},                                                                                     \
     {kvc__values_avx512_f32, kvc__values_avx512_f16, kvc__values_avx512_bf16, kvc__values_avx512_q8_0,              \
      kvc__values_avx512_q4_0},                                                                                     \
     {NULL, NULL, NULL, i8_q8_0, i8_q4_0}, i8_row_bytes, i8_prepare, kvc__softcap_avx512}
static const kvc__kernels kvc__kernels_avx512 =
    KVC__KERNELS_AVX512("avx512", kvc__scores_i8_avx2_q8_0, kvc__scores_i8_avx2_q4_0, NULL, NULL);
static const kvc__kernels kvc__kernels_avx512_vnni =
    KVC__KERNELS_AVX512("avx512-vnni", kvc__scores_i8_vnni_q8_0, kvc__scores_i8_vnni_q4_0, kvc__i8_row_bytes_vnni,
                        kvc__i8_prepare_vnni);
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif /* KVC__X86 */

#ifdef KVC__NEON
/* -- NEON: 4 lanes -- */
static float32x4_t kvc__exp_neon(float32x4_t x) {
    uint32x4_t keep = vcgeq_f32(x, vdupq_n_f32(-87.0f));
    float32x4_t n, y;
    int32x4_t e;
    x = vmaxq_f32(x, vdupq_n_f32(-87.0f));
    n = vrndnq_f32(vmulq_n_f32(x, 1.44269504088896341f));
    x = vfmsq_f32(x, n, vdupq_n_f32(KVC__EXP_C1));
    x = vfmsq_f32(x, n, vdupq_n_f32(KVC__EXP_C2));
    y = vdupq_n_f32(KVC__EXP_P0);
    y = vfmaq_f32(vdupq_n_f32(KVC__EXP_P1), y, x);
    y = vfmaq_f32(vdupq_n_f32(KVC__EXP_P2), y, x);
    y = vfmaq_f32(vdupq_n_f32(KVC__EXP_P3), y, x);
    y = vfmaq_f32(vdupq_n_f32(KVC__EXP_P4), y, x);
    y = vfmaq_f32(vdupq_n_f32(KVC__EXP_P5), y, x);
    y = vfmaq_f32(vaddq_f32(x, vdupq_n_f32(1.0f)), y, vmulq_f32(x, x));
    e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
    return vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(vmulq_f32(y, vreinterpretq_f32_s32(e))), keep));
}
static void kvc__dot_neon(const float *q, const float *k, int32_t d, size_t stride, int32_t n, float *s) {
    int32_t c, i, j, full = d & ~3;
    for (c = 0; c < n; c += 4) {
        float32x4_t acc[4];
        int32_t m = KVC__MIN(4, n - c);
        float t[4];
        for (j = 0; j < 4; ++j) acc[j] = vdupq_n_f32(0.0f);
        for (i = 0; i < full; i += 4) {
            float32x4_t qv = vld1q_f32(q + i);
            for (j = 0; j < m; ++j) acc[j] = vfmaq_f32(acc[j], qv, vld1q_f32(k + (size_t)(c + j) * stride + i));
        }
        vst1q_f32(t, vpaddq_f32(vpaddq_f32(acc[0], acc[1]), vpaddq_f32(acc[2], acc[3])));
        for (j = 0; j < m; ++j) {
            for (i = full; i < d; ++i) t[j] += q[i] * k[(size_t)(c + j) * stride + i];
            s[c + j] = t[j];
        }
    }
}
static float kvc__exp_sum_neon(float *s, int32_t n, uint32_t vis, float scale, float m) {
    float32x4_t sum = vdupq_n_f32(0.0f);
    float total;
    int32_t c = 0;
    for (c = 0; c < n; ++c)
        if (!((vis >> c) & 1u)) s[c] = -INFINITY; /* gives 0 below */
    for (c = 0; c + 4 <= n; c += 4) {
        float32x4_t p = kvc__exp_neon(vsubq_f32(vmulq_n_f32(vld1q_f32(s + c), scale), vdupq_n_f32(m)));
        vst1q_f32(s + c, p);
        sum = vaddq_f32(sum, p);
    }
    if (c < n) { /* the tail in a padded vector too: every cell's weight is computed the
                    same way whatever n is, so a query's result does not depend on its block */
        float t[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
        int32_t j;
        for (j = 0; c + j < n; ++j) t[j] = s[c + j];
        vst1q_f32(t, kvc__exp_neon(vsubq_f32(vmulq_n_f32(vld1q_f32(t), scale), vdupq_n_f32(m))));
        for (j = 0; c + j < n; ++j) s[c + j] = t[j];
        sum = vaddq_f32(sum, vld1q_f32(t));
    }
    total = vaddvq_f32(sum);
    return total;
}
static void kvc__axpy_neon(float *acc, const float *p, const float *v, int32_t d, size_t stride, int32_t n) {
    int32_t i = 0, c, j;
    for (; i + 16 <= d; i += 16) {
        float32x4_t a[4];
        for (j = 0; j < 4; ++j) a[j] = vld1q_f32(acc + i + 4 * j);
        for (c = 0; c < n; ++c)
            for (j = 0; j < 4; ++j) a[j] = vfmaq_n_f32(a[j], vld1q_f32(v + (size_t)c * stride + i + 4 * j), p[c]);
        for (j = 0; j < 4; ++j) vst1q_f32(acc + i + 4 * j, a[j]);
    }
    for (; i < d; ++i)
        for (c = 0; c < n; ++c) acc[i] += p[c] * v[(size_t)c * stride + i];
}
static void kvc__scale_neon(float *x, int32_t n, float a) {
    int32_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(x + i, vmulq_n_f32(vld1q_f32(x + i), a));
    for (; i < n; ++i) x[i] *= a;
}
static void kvc__softcap_neon(float *const *s, int32_t nr, int32_t n, float scale, float cap) {
    float32x4_t one = vdupq_n_f32(1.0f);
    float t[4];
    int32_t r, c, j;
    for (r = 0; r < nr; ++r)
        for (c = 0; c < n; c += 4) { /* as kvc__tanh_cap_sse2, the tail in a padded vector */
            float32x4_t y, e, th;
            for (j = 0; j < 4; ++j) t[j] = c + j < n ? s[r][c + j] : 0.0f;
            y = vmulq_n_f32(vld1q_f32(t), scale / cap);
            e = kvc__exp_neon(vmulq_n_f32(vabsq_f32(y), -2.0f));
            th = vdivq_f32(vsubq_f32(one, e), vaddq_f32(one, e));
            th = vreinterpretq_f32_u32(vorrq_u32(vreinterpretq_u32_f32(th),
                                                 vandq_u32(vreinterpretq_u32_f32(y), vdupq_n_u32(0x80000000u))));
            vst1q_f32(t, vmulq_n_f32(th, cap));
            for (j = 0; j < 4 && c + j < n; ++j) s[r][c + j] = t[j];
        }
}

/* Fused NEON kernels: rows read in their storage type 16 values at a time (a q4_0
   block's nibble half, half a q8_0 block), so head dims must be multiples of 16 (others
   take the f32 tile). As on x86, one accumulator per (row, cell) summed once at the end
   for scores, and every lane of a values accumulator sums its cells in order, so one row
   alone gets the same result as in a group of four. */
#define KVC__NEON_INLINE static inline __attribute__((always_inline))

/* the block scales of n rows (0 for unquantised types), sc[cell * KVC__SCALES + block] */
KVC__NEON_INLINE void kvc__row_scales_neon(kvc_type t, const unsigned char *row, size_t stride, int32_t d, int32_t n,
                                           float *sc) {
    size_t bb = t == KVC_TYPE_Q8_0 ? sizeof(kvc__block_q8_0) : sizeof(kvc__block_q4_0);
    int32_t c, b;
    if (t != KVC_TYPE_Q8_0 && t != KVC_TYPE_Q4_0) return;
    for (c = 0; c < n; ++c)
        for (b = 0; b < d / KVC__QBLOCK; ++b) sc[c * KVC__SCALES + b] = kvc__load_scale(row + (size_t)c * stride + (size_t)b * bb);
}

/* values i .. i + 15 of a head row (i a multiple of 16) as f32; sc: the row's scales */
KVC__NEON_INLINE void kvc__load16_neon(kvc_type t, const unsigned char *row, int32_t i, const float *sc, float32x4_t *x) {
    int32_t j;
    if (t == KVC_TYPE_F32) {
        for (j = 0; j < 4; ++j) x[j] = vld1q_f32((const float *)(const void *)row + i + 4 * j);
    } else if (t == KVC_TYPE_F16) {
        for (j = 0; j < 4; ++j)
            x[j] = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)(const void *)row + i + 4 * j)));
    } else if (t == KVC_TYPE_BF16) {
        for (j = 0; j < 4; ++j)
            x[j] = vreinterpretq_f32_u32(vshll_n_u16(vld1_u16((const uint16_t *)(const void *)row + i + 4 * j), 16));
    } else {
        int8x16_t q;
        int16x8_t lo, hi;
        float scale = sc[i / KVC__QBLOCK];
        if (t == KVC_TYPE_Q8_0) {
            q = vld1q_s8(((const kvc__block_q8_0 *)(const void *)row + i / KVC__QBLOCK)->q + (i & 31));
        } else { /* values 16..31 of a block are the high nibbles */
            uint8x16_t b = vld1q_u8(((const kvc__block_q4_0 *)(const void *)row + i / KVC__QBLOCK)->q);
            b = (i & 16) ? vshrq_n_u8(b, 4) : vandq_u8(b, vdupq_n_u8(15));
            q = vsubq_s8(vreinterpretq_s8_u8(b), vdupq_n_s8(8));
        }
        lo = vmovl_s8(vget_low_s8(q));
        hi = vmovl_s8(vget_high_s8(q));
        x[0] = vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo))), scale);
        x[1] = vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_high_s16(lo))), scale);
        x[2] = vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi))), scale);
        x[3] = vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_high_s16(hi))), scale);
    }
}

/* s[r][c] = q[r] . k[c] for nr (1 or 4) rows, four cells at a time */
KVC__NEON_INLINE void kvc__scores_neon(kvc_type t, const float *const *q, int32_t nr, const unsigned char *k,
                                       size_t k_row, int32_t d, int32_t n, float *const *s) {
    float sc[KVC__STRIP * KVC__SCALES];
    int32_t c, i, j, r, m;
    kvc__row_scales_neon(t, k, k_row, d, n, sc);
    for (c = 0; c < n; c += 4) {
        float32x4_t a[4][4]; /* [row][cell] */
        m = KVC__MIN(4, n - c);
        for (r = 0; r < 4; ++r)
            for (j = 0; j < 4; ++j) a[r][j] = vdupq_n_f32(0.0f);
        for (i = 0; i < d; i += 16)
            for (j = 0; j < m; ++j) {
                float32x4_t x[4];
                int32_t u;
                kvc__load16_neon(t, k + (size_t)(c + j) * k_row, i, sc + (c + j) * KVC__SCALES, x);
                for (r = 0; r < nr; ++r)
                    for (u = 0; u < 4; ++u) a[r][j] = vfmaq_f32(a[r][j], vld1q_f32(q[r] + i + 4 * u), x[u]);
            }
        for (r = 0; r < nr; ++r)
            for (j = 0; j < m; ++j) s[r][c + j] = vaddvq_f32(a[r][j]);
    }
}

/* acc[r] += sum_c p[r][c] v[c] for nr (1 or 4) rows, 16 values at a time */
KVC__NEON_INLINE void kvc__values_neon(kvc_type t, float *const *acc, int32_t nr, const float *const *p,
                                       const unsigned char *v, size_t v_row, int32_t d, int32_t n) {
    float sc[KVC__STRIP * KVC__SCALES];
    int32_t c, i, r, u;
    kvc__row_scales_neon(t, v, v_row, d, n, sc);
    for (i = 0; i < d; i += 16) {
        float32x4_t a[4][4];
        for (r = 0; r < nr; ++r)
            for (u = 0; u < 4; ++u) a[r][u] = vld1q_f32(acc[r] + i + 4 * u);
        for (c = 0; c < n; ++c) {
            float32x4_t x[4];
            kvc__load16_neon(t, v + (size_t)c * v_row, i, sc + c * KVC__SCALES, x);
            for (r = 0; r < nr; ++r)
                for (u = 0; u < 4; ++u) a[r][u] = vfmaq_n_f32(a[r][u], x[u], p[r][c]);
        }
        for (r = 0; r < nr; ++r)
            for (u = 0; u < 4; ++u) vst1q_f32(acc[r] + i + 4 * u, a[r][u]);
    }
}

#define KVC__FUSED_NEON(T, name)                                                                                     \
    static void kvc__scores_neon_##name(const float *const *q, int32_t nr, const unsigned char *k, size_t k_row,     \
                                        int32_t d, int32_t n, float *const *s, kvc__pf *pf) {                        \
        kvc__pf_some(pf, INT32_MAX);                                                                                 \
        if (nr == 1) kvc__scores_neon(T, q, 1, k, k_row, d, n, s);                                                   \
        else kvc__scores_neon(T, q, 4, k, k_row, d, n, s);                                                           \
    }                                                                                                                \
    static void kvc__values_neon_##name(float *const *acc, int32_t nr, const float *const *p, const unsigned char *v, \
                                        size_t v_row, int32_t d, int32_t n, kvc__pf *pf) {                           \
        kvc__pf_some(pf, INT32_MAX);                                                                                 \
        if (nr == 1) kvc__values_neon(T, acc, 1, p, v, v_row, d, n);                                                 \
        else kvc__values_neon(T, acc, 4, p, v, v_row, d, n);                                                         \
    }
KVC__FUSED_NEON(KVC_TYPE_F32, f32)
KVC__FUSED_NEON(KVC_TYPE_F16, f16)
KVC__FUSED_NEON(KVC_TYPE_BF16, bf16)
KVC__FUSED_NEON(KVC_TYPE_Q8_0, q8_0)
KVC__FUSED_NEON(KVC_TYPE_Q4_0, q4_0)
/* a key block's 32 codes as signed bytes (q4_0: nibbles minus 8), values 0-15 and 16-31 */
KVC__NEON_INLINE void kvc__kblock_neon(kvc_type t, const unsigned char *kb, int8x16_t *k0, int8x16_t *k1) {
    if (t == KVC_TYPE_Q8_0) {
        const int8_t *c = ((const kvc__block_q8_0 *)(const void *)kb)->q;
        *k0 = vld1q_s8(c);
        *k1 = vld1q_s8(c + 16);
    } else {
        uint8x16_t x = vld1q_u8(((const kvc__block_q4_0 *)(const void *)kb)->q);
        *k0 = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(x, vdupq_n_u8(15))), vdupq_n_s8(8));
        *k1 = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(x, 4)), vdupq_n_s8(8));
    }
}
/* a block's integer dot product: 8-bit products widened to 16 bits (two per lane stay
   below 2^15), then pairwise into 32 bits */
static int32_t kvc__idot_neon(kvc_type t, const int8_t *q, const unsigned char *kb) {
    int8x16_t q0 = vld1q_s8(q), q1 = vld1q_s8(q + 16), k0, k1;
    int16x8_t a, b;
    kvc__kblock_neon(t, kb, &k0, &k1);
    a = vmlal_s8(vmull_s8(vget_low_s8(q0), vget_low_s8(k0)), vget_high_s8(q0), vget_high_s8(k0));
    b = vmlal_s8(vmull_s8(vget_low_s8(q1), vget_low_s8(k1)), vget_high_s8(q1), vget_high_s8(k1));
    return vaddvq_s32(vpadalq_s16(vpaddlq_s16(a), b));
}
KVC__SCORES_I8_ROWS(KVC__NO_ATTR, neon, kvc__idot_neon)

/* The same integer dot product with the dot-product extension (ARMv8.2 SDOT, optional
   before ARMv8.4): four 8-bit products summed into each 32-bit lane, exact as well.
   GCC compiles it for any aarch64 target (checked at run time); clang's arm_neon.h
   (to 14 at least) declares vdotq_s32 only when the whole build targets the extension. */
#ifdef KVC__NEON_DOT
#ifdef __ARM_FEATURE_DOTPROD
#define KVC__DOTPROD
#else
#define KVC__DOTPROD __attribute__((target("arch=armv8.2-a+dotprod")))
#endif
KVC__DOTPROD static int32_t kvc__idot_neon_dot(kvc_type t, const int8_t *q, const unsigned char *kb) {
    int8x16_t k0, k1;
    kvc__kblock_neon(t, kb, &k0, &k1);
    return vaddvq_s32(vdotq_s32(vdotq_s32(vdupq_n_s32(0), vld1q_s8(q), k0), vld1q_s8(q + 16), k1));
}
KVC__SCORES_I8_ROWS(KVC__NO_ATTR, neon_dot, kvc__idot_neon_dot)
#endif /* KVC__NEON_DOT */

KVC__SOFTMAX_ROWS(KVC__NO_ATTR, neon, kvc__masked_max_scalar, kvc__exp_sum_neon)
#define KVC__KERNELS_NEON(name, i8_q8_0, i8_q4_0)                                                                      \
    {name, kvc__dot_neon, kvc__masked_max_rows_neon, kvc__exp_sum_rows_neon, kvc__axpy_neon, kvc__scale_neon, 16,    \
     {kvc__scores_neon_f32, kvc__scores_neon_f16, kvc__scores_neon_bf16, kvc__scores_neon_q8_0, kvc__scores_neon_q4_0}, \
     {kvc__values_neon_f32, kvc__values_neon_f16, kvc__values_neon_bf16, kvc__values_neon_q8_0, kvc__values_neon_q4_0}, \
     {NULL, NULL, NULL, i8_q8_0, i8_q4_0}, NULL, NULL, kvc__softcap_neon}
static const kvc__kernels kvc__kernels_neon =
    KVC__KERNELS_NEON("neon", kvc__scores_i8_neon_q8_0, kvc__scores_i8_neon_q4_0);
#ifdef KVC__NEON_DOT
static const kvc__kernels kvc__kernels_neon_dotprod =
    KVC__KERNELS_NEON("neon-dotprod", kvc__scores_i8_neon_dot_q8_0, kvc__scores_i8_neon_dot_q4_0);
#endif
#endif /* KVC__NEON */

static const kvc__kernels *kvc__pick_kernels(uint32_t features) {
#ifdef KVC__X86
    if (features & KVC_CPU_AVX512_VNNI) return &kvc__kernels_avx512_vnni;
    if (features & KVC_CPU_AVX512) return &kvc__kernels_avx512;
    if (features & KVC_CPU_AVX2) return &kvc__kernels_avx2;
    if (features & KVC_CPU_SSE2) return &kvc__kernels_sse2;
#endif
#ifdef KVC__NEON_DOT
    if (features & KVC_CPU_NEON_DOTPROD) return &kvc__kernels_neon_dotprod;
#endif
#ifdef KVC__NEON
    if (features & KVC_CPU_NEON) return &kvc__kernels_neon;
#endif
    (void)features;
    return &kvc__kernels_scalar;
}

/* ---- Layer 6: the attention driver ------------------------------------------------- */

/* One query of an attention call, and where it may look. FULL/ROTATING keys are
   positions in token order: visible iff 0 <= key <= hi, key >= lo, and (key < sink_end
   or key >= wlo). */
typedef struct kvc__query {
    int32_t pos, seq;
    int non_causal;
    int32_t window; /* the call's extra window, 0: none */
    int64_t hi, lo, sink_end, wlo;
} kvc__query;

/* The rows (query x head of one kv head's group) that see something in a block,
   padded to whole groups of four with rows of zero weight; arrays of `cap` entries in
   the worker's memory. */
typedef struct kvc__rows {
    int32_t n;
    const float **q;
    const void **qb;       /* the rows quantised (and prepared), for block-typed keys */
    float **s, **acc, **ml;
    uint32_t *vis;
} kvc__rows;

typedef struct kvc__attn {
    const kvc_cache *c;
    const kvc_pool *p;
    const kvc_attention_desc *d;
    const kvc__kernels *kern;
    int32_t layer, group, n_heads, n_kv, hk, hv;
    float scale;
    float softcap;         /* 0: off; else the scores are capped in place, scale applied */
    /* f16_tail: tokens [tail_lo, tail_hi) are read from the cache's ring (in a block after
       the pages' cells, which skip them); tail_lo = tail_hi = 0 without one */
    int64_t tail_lo, tail_hi;
    const unsigned char *tail_k, *tail_v;
    kvc__to_f32_fn tail_k_f32, tail_v_f32;
    kvc__run *runs;        /* the cells the call reads, in order */
    int32_t *run_start;    /* run r holds cells [run_start[r], run_start[r + 1]) of that order */
    int32_t n_runs, n_cells;
    int32_t per_task, n_qtasks, chunk, n_chunks; /* queries per task; cells per chunk */
    int32_t rows_max;      /* per_task * n_heads */
    int fused_k, fused_v;  /* the kernels read K / V in their storage type */
    int32_t strip;         /* cells per fused kernel call (8..KVC__STRIP) */
    /* block-typed keys: integer scores against query rows quantised to q8_0 */
    void (*scores_i8)(const void *const *q, int32_t nr, const unsigned char *k, size_t k_row, int32_t d, int32_t n,
                      float *const *s, kvc__pf *pf);
    void (*i8_prepare)(kvc_type t, int32_t d, const kvc__block_q8_0 *blocks, void *row);
    kvc__from_f32_fn quantise;
    size_t qb_row;         /* bytes of a quantised (prepared) query row, a multiple of 64 */
    size_t qb_floats;      /* where a worker's quantised rows start in its work */
    float *ml;             /* [task][row][2]: running max and sum */
    float *part;           /* split-K partial outputs [task][row][hv]; NULL with one chunk */
    float *work;           /* [worker]: K tile, V tile, scores */
    size_t work_floats;
    size_t tile_floats;    /* the f32 tile of paths without fused kernels (0 with both) */
    size_t rows_floats;    /* where a worker's row lists start in its work */
    int32_t rows_cap;      /* entries of a row list */
} kvc__attn;

/* a worker's row lists: one per kv head, n_kv * (sizeof(kvc__rows) + rows_cap * (5
   pointers + a uint32_t)) bytes (kvc__attn_plan) */
static kvc__rows *kvc__rows_carve(const kvc__attn *A, void *mem) {
    kvc__rows *R = (kvc__rows *)mem;
    unsigned char *p = (unsigned char *)(R + A->n_kv);
    size_t cap = (size_t)A->rows_cap;
    int32_t h;
    for (h = 0; h < A->n_kv; ++h) {
        R[h].q = (const float **)(void *)p; p += cap * sizeof(void *);
        R[h].s = (float **)(void *)p; p += cap * sizeof(void *);
        R[h].acc = (float **)(void *)p; p += cap * sizeof(void *);
        R[h].ml = (float **)(void *)p; p += cap * sizeof(void *);
        R[h].qb = (const void **)(void *)p; p += cap * sizeof(void *);
    }
    for (h = 0; h < A->n_kv; ++h) { /* after every pointer array: they stay aligned */
        R[h].vis = (uint32_t *)(void *)p;
        p += cap * sizeof(uint32_t);
    }
    return R;
}

static kvc_result kvc__check_attention(const kvc_cache *c, int32_t layer, const kvc_attention_desc *d) {
    const kvc_pool *p;
    int32_t i;
    if (c == NULL || d == NULL) return KVC_ERR_NULL;
    if (c->cfg.kind == KVC_KIND_RECURRENT) return KVC_ERR_UNSUPPORTED; /* no keys: kvc_state */
    p = c->pool;
    if (layer < 0 || layer >= p->cfg.n_layers) return KVC_ERR_RANGE;
    if (d->n_queries < 1 || d->n_heads < 1 || d->n_heads % p->cfg.n_kv_heads != 0) return KVC_ERR_INVALID;
    if (d->window < 0 || !(d->scale >= 0.0f) || d->scale == INFINITY) return KVC_ERR_INVALID;
    if (d->scratch == NULL && d->scratch_bytes != 0) return KVC_ERR_INVALID;
    if (!(d->softcap >= 0.0f) || d->softcap == INFINITY) return KVC_ERR_INVALID;
    if (d->sinks != NULL)
        for (i = 0; i < d->n_heads; ++i)
            if (d->sinks[i] != d->sinks[i] || d->sinks[i] == INFINITY) return KVC_ERR_INVALID;
    if (kvc__batch_open(c) && !c->batch_put[layer]) return KVC_ERR_STATE;
    if (c->cfg.kind != KVC_KIND_CAUSAL) return d->pos == NULL && d->n_queries > c->offset ? KVC_ERR_RANGE : KVC_OK;
    if (d->pos == NULL) return d->n_queries == c->batch_n ? KVC_OK : KVC_ERR_RANGE;
    if (d->seq == NULL) return KVC_ERR_NULL;
    for (i = 0; i < d->n_queries; ++i)
        if (d->seq[i] < 0 || d->seq[i] >= c->cfg.max_seqs) return KVC_ERR_RANGE;
    return KVC_OK;
}

/* Query qi of a call: its position, sequence, causality and span. */
static kvc__query kvc__query_of(const kvc_cache *c, const kvc_attention_desc *d, int32_t qi) {
    kvc__query q;
    q.window = d->window;
    q.non_causal = d->non_causal;
    q.seq = 0;
    if (c->cfg.kind == KVC_KIND_CAUSAL && d->pos == NULL) { /* the current batch */
        q.pos = c->batch_pos[qi];
        q.seq = c->batch_seq[qi];
        q.non_causal = d->non_causal || c->batch_nc[qi];
    } else {
        q.pos = d->pos ? d->pos[qi] : c->offset - d->n_queries + qi;
        if (d->seq) q.seq = d->seq[qi];
    }
    q.hi = q.non_causal ? INT64_MAX : q.pos;
    q.lo = q.window > 0 ? (int64_t)q.pos - q.window + 1 : INT64_MIN;
    q.sink_end = c->cfg.kind == KVC_KIND_ROTATING ? c->cfg.sinks : 0;
    q.wlo = c->cfg.kind == KVC_KIND_ROTATING ? kvc__window_lo(c, q.pos) : INT64_MIN;
    return q;
}

/* The bit mask of the n cells from page slot `slot` (the call's cell `index`) that
   query q may see. */
static uint32_t kvc__visible_mask(const kvc__attn *A, const kvc__query *q, uint32_t page, int32_t slot,
                                  int32_t index, int32_t n) {
    uint32_t m = 0;
    int32_t i;
    if (A->c->cfg.kind == KVC_KIND_CAUSAL) {
        for (i = 0; i < n; ++i)
            m |= (uint32_t)kvc__causal_visible(A->c, index + i, q->pos, q->seq, q->non_causal, q->window) << i;
    } else {
        const int32_t *key = kvc__pos_at(A->p, page, slot);
        for (i = 0; i < n; ++i) {
            int64_t k = key[i];
            m |= (uint32_t)(k >= 0 && k <= q->hi && k >= q->lo && (k < q->sink_end || k >= q->wlo) &&
                            (k < A->tail_lo || k >= A->tail_hi)) << i;
        }
    }
    return m;
}

/* The cells a call reads: the view (FULL/ROTATING), or for CAUSAL the cells between
   the first and last cell of the queries' sequences. */
static void kvc__attn_iter(const kvc_cache *c, const kvc_attention_desc *d, kvc__iter *it) {
    if (c->cfg.kind == KVC_KIND_CAUSAL) {
        int32_t lo = INT32_MAX, hi = 0, i;
        for (i = 0; i < d->n_queries; ++i) {
            int32_t s = d->pos == NULL ? c->batch_seq[i] : d->seq[i];
            lo = KVC__MIN(lo, c->seq_lo[s]);
            hi = KVC__MAX(hi, c->seq_hi[s]);
        }
        /* from a multiple of the chunk size: blocks and chunks then sit at the same cells
           whatever the other queries' sequences, so a query's result does not depend on them */
        if (lo < hi) lo -= lo % KVC__CHUNK;
        kvc__iter_init_cells(it, c, lo, KVC__MAX(lo, hi));
    } else {
        kvc__iter_init(it, c);
    }
}

static size_t kvc__floats_aligned(size_t n) { return (n + 15) & ~(size_t)15; } /* 64-byte pieces */

/* Task shapes and scratch layout; with base == NULL only *bytes is computed. Every size
   in 64 bits or checked size_t sums: KVC_ERR_OVERFLOW when the rows of a task, the task
   count (ints in the kernels and the parallel_for hook) or the bytes do not fit; the
   call with base != NULL repeats one that succeeded and cannot fail. */
static kvc_result kvc__attn_plan(kvc__attn *A, unsigned char *base, size_t *bytes) {
    const kvc_attention_desc *d = A->d;
    size_t off = 0, n_tasks, n_workers, sz;
    int64_t rows_max, n_qtasks, tasks;
    int of = 0;
    kvc__iter it;
    kvc__run run;
    int32_t r = 0;
    A->n_cells = A->n_runs = 0;
    kvc__attn_iter(A->c, d, &it);
    while (kvc__iter_next(&it, &run)) {
        A->n_runs++;
        A->n_cells += run.c1 - run.c0;
    }
    if (d->n_queries <= KVC__DECODE_QUERIES) { /* few queries: split the cells */
        A->per_task = d->n_queries;
        A->chunk = KVC__CHUNK;
    } else { /* many: blocks of queries over every cell */
        A->per_task = KVC__PREFILL_QUERIES;
        A->chunk = KVC__MAX(A->n_cells, 1);
    }
    A->n_chunks = (int32_t)KVC__MAX(1, ((int64_t)A->n_cells + A->chunk - 1) / A->chunk);
    n_qtasks = ((int64_t)d->n_queries + A->per_task - 1) / A->per_task;
    rows_max = (int64_t)A->per_task * A->n_heads;
    tasks = n_qtasks * A->n_chunks;
    /* the call's rows (query x head: rows of q and out) and a task's rows with their
       padding (rows_max + 1, rows_cap + 4, row * 2) and the task count stay ints */
    if ((int64_t)d->n_queries * A->n_heads > INT32_MAX || rows_max > INT32_MAX / 2 - 8 || tasks > INT32_MAX)
        return KVC_ERR_OVERFLOW;
    A->n_qtasks = (int32_t)n_qtasks;
    A->rows_max = (int32_t)rows_max;
    n_tasks = (size_t)tasks;
    n_workers = A->p->cfg.runtime.parallel_for ? (size_t)A->p->cfg.runtime.n_workers : 1;
    /* an f16 tail is read through the tile: room for it whenever the cache has one (empty
       or not), so a scratch size asked for once does not fall short when the tail fills */
    A->tile_floats = A->fused_k && A->fused_v && A->c->tail == NULL ? 0 : (size_t)KVC__BLOCK * (size_t)KVC__MAX(A->hk, A->hv);
    A->rows_cap = A->per_task * A->group + 4; /* <= rows_max + 4 */
    sz = kvc__add(kvc__mul((size_t)A->rows_max, KVC__BLOCK, &of), A->tile_floats, &of); /* scores, tile */
    sz = kvc__add(sz, KVC__BLOCK + (size_t)A->hv + 15, &of);                             /* padding rows */
    A->rows_floats = sz & ~(size_t)15;
    sz = kvc__mul((size_t)A->n_kv, kvc__add(sizeof(kvc__rows), kvc__mul((size_t)A->rows_cap,
                                                    5 * sizeof(void *) + sizeof(uint32_t), &of), &of), &of);
    sz = kvc__add(sz / sizeof(float) + 1, 15, &of) & ~(size_t)15; /* the row lists, in floats */
    A->qb_floats = kvc__add(A->rows_floats, sz, &of);
    sz = kvc__mul((size_t)A->rows_max + 1, A->qb_row, &of) / sizeof(float);
    A->work_floats = kvc__add(A->qb_floats, kvc__add(sz, 15, &of) & ~(size_t)15, &of);
    if (of) return KVC_ERR_OVERFLOW;
    A->runs = (kvc__run *)(void *)(base ? base + off : NULL);
    off += kvc__floats_aligned(sizeof(kvc__run) * (size_t)A->n_runs) * sizeof(float);
    A->run_start = (int32_t *)(void *)(base ? base + off : NULL);
    off += kvc__floats_aligned((size_t)A->n_runs + 1) * sizeof(float);
    A->ml = (float *)(void *)(base ? base + off : NULL);
    sz = kvc__mul(kvc__mul(n_tasks, (size_t)A->rows_max * 2, &of), sizeof(float), &of);
    off = kvc__add(off, kvc__align_up(sz, 64, &of), &of);
    A->part = NULL;
    if (A->n_chunks > 1) {
        A->part = (float *)(void *)(base ? base + off : NULL);
        sz = kvc__mul(kvc__mul(kvc__mul(n_tasks, (size_t)A->rows_max, &of), (size_t)A->hv, &of), sizeof(float), &of);
        off = kvc__add(off, kvc__align_up(sz, 64, &of), &of);
    }
    A->work = (float *)(void *)(base ? base + off : NULL);
    off = kvc__add(off, kvc__mul(kvc__mul(n_workers, A->work_floats, &of), sizeof(float), &of), &of);
    off = kvc__add(off, 64, &of);
    if (of) return KVC_ERR_OVERFLOW;
    *bytes = off; /* 64 of it: room to align the base */
    if (base == NULL) return KVC_OK;
    kvc__attn_iter(A->c, d, &it);
    A->run_start[0] = 0;
    while (kvc__iter_next(&it, &A->runs[r])) {
        A->run_start[r + 1] = A->run_start[r] + A->runs[r].c1 - A->runs[r].c0;
        ++r;
    }
    return KVC_OK;
}


/* Fused kernel calls take strips of KVC__STRIP whole rows, so that the kv heads'
   slices of those rows are read one after another and the reads stream. */

static void kvc__rows_of_head(const kvc__attn *A, int32_t h, int32_t q0, int32_t nq, const uint32_t *vis, float *ml,
                              float *acc, float *s, float *pad_s, float *pad_acc, const unsigned char *qb, kvc__rows *R) {
    int32_t q, g, r;
    R->n = 0;
    for (q = 0; q < nq; ++q) {
        if (vis[q] == 0) continue;
        for (g = 0; g < A->group; ++g) {
            int32_t head = h * A->group + g, row = q * A->n_heads + head;
            R->q[R->n] = A->d->q + ((size_t)(q0 + q) * (size_t)A->n_heads + (size_t)head) * (size_t)A->hk;
            R->s[R->n] = s + (size_t)row * KVC__BLOCK;
            R->acc[R->n] = acc + (size_t)row * A->hv;
            R->ml[R->n] = ml + 2 * (size_t)row;
            R->qb[R->n] = qb + (size_t)row * A->qb_row;
            R->vis[R->n++] = vis[q];
        }
    }
    for (r = R->n; r % 4 != 0 && R->n > 1; ++r) {
        R->q[r] = R->q[0];
        R->qb[r] = R->qb[0];
        R->s[r] = pad_s;
        R->acc[r] = pad_acc;
    }
}

/* Mask the scores of rows [r0, r0 + 4) of R (those it has), fold the block into
   their online softmax; the scores become the weights of the V accumulation. */
static void kvc__attn_softmax(const kvc__attn *A, const kvc__rows *R, int32_t r0, int32_t n) {
    int32_t nr = KVC__MIN(4, R->n - r0), r;
    float bm[4], m[4], sum[4], scale = A->scale;
    int poisoned[4] = {0, 0, 0, 0};
    if (A->softcap > 0.0f) { /* s = cap * tanh(scale * s / cap), already scaled */
        A->kern->masked_max(R->s + r0, R->vis + r0, nr, n, bm); /* a NaN before tanh may not last */
        for (r = 0; r < nr; ++r) poisoned[r] = bm[r] != bm[r];
        A->kern->softcap(R->s + r0, nr, n, scale, A->softcap);
        scale = 1.0f;
    }
    A->kern->masked_max(R->s + r0, R->vis + r0, nr, n, bm);
    for (r = 0; r < nr; ++r) {
        float *ml = R->ml[r0 + r], b = bm[r] * scale;
        if (b != b || poisoned[r]) ml[1] = NAN; /* the row saw a poisoned key: NaN to the end */
        if (b > ml[0]) { /* a new maximum: rescale what the row has */
            if (ml[0] != -INFINITY) {
                float f = expf(ml[0] - b);
                ml[1] *= f;
                A->kern->scale(R->acc[r0 + r], A->hv, f);
            }
            ml[0] = b;
        }
        m[r] = ml[0];
    }
    A->kern->exp_sum(R->s + r0, R->vis + r0, nr, n, scale, m, sum);
    for (r = 0; r < nr; ++r) R->ml[r0 + r][1] += sum[r];
}

/* The lines of part `part` of `parts` of the whole rows [c, c + m), of the `rows` rows
   that follow `base` in the same page (rows past them: none), for a kernel to ask for.
   The kv heads of a strip each ask for one part, in address order: spread out, the
   requests do not overflow the miss queue (one burst per block left a thread at 60 %
   of its bandwidth), and in order they also train the hardware's stream prefetcher
   (asking for each head's own slices, 2 KB apart, was 4 % slower at 16k cells). */
static kvc__pf kvc__pf_part(const unsigned char *base, size_t row, int32_t c, int32_t m, int32_t rows, int32_t part,
                            int32_t parts) {
    kvc__pf pf = {0, 0};
    int32_t e = KVC__MIN(c + m, rows);
    if (c < e) {
        uintptr_t a = (uintptr_t)(base + (size_t)c * row) & ~(uintptr_t)63, end = (uintptr_t)(base + (size_t)e * row);
        uintptr_t span = ((end - a) / (uintptr_t)parts + 63) & ~(uintptr_t)63;
        pf.lo = a + span * (uintptr_t)part; /* each line once: asking twice stalls */
        pf.hi = KVC__MAX(pf.lo, KVC__MIN(pf.lo + span, end));
    }
    return pf;
}

/* What the next block reads first: the rows after this block in its run, or at the
   run's end the next run's (the first block of every page was read cold otherwise:
   6 % of the time at 16k cells with 256-cell pages). */
typedef struct kvc__ahead {
    const unsigned char *k, *v;
    int32_t rows;
} kvc__ahead;

/* Part `part` of `parts` of rows [c, c + m) counted from the block's first row (base,
   n rows), past its end continuing with `next` (rows of the following run). Where it
   takes rows of both (once a page), the next run's are asked for at once. */
static kvc__pf kvc__pf_ahead(const unsigned char *base, int32_t n, const unsigned char *next, int32_t next_rows,
                             size_t row, int32_t c, int32_t m, int32_t part, int32_t parts) {
    kvc__pf in = {0, 0}, past = {0, 0};
    if (c < n) in = kvc__pf_part(base, row, c, KVC__MIN(m, n - c), n, part, parts);
    if (c + m > n) past = kvc__pf_part(next, row, KVC__MAX(c, n) - n, c + m - KVC__MAX(c, n), next_rows, part, parts);
    if (in.lo == in.hi) return past;
    kvc__pf_some(&past, INT32_MAX);
    return in;
}

/* Fused scores of every head's rows against cells [c, c + m) of the block (n cells
   from k0): each head asks meanwhile for its part of the rows a strip ahead. */
static void kvc__fused_scores(const kvc__attn *A, const kvc__rows *R, const unsigned char *k0, int32_t n,
                              const kvc__ahead *next, int32_t c, int32_t m) {
    const kvc_pool *p = A->p;
    size_t slice = kvc__row_bytes(p->cfg.type_k, 1, A->hk);
    int32_t h, r, j;
    for (h = 0; h < A->n_kv; ++h) {
        const unsigned char *k = k0 + (size_t)c * p->k_row + (size_t)h * slice;
        kvc__pf pf = kvc__pf_ahead(k0, n, next->k, next->rows, p->k_row, c + A->strip, m, h, A->n_kv);
        for (r = 0; r < R[h].n; r += 4) {
            float *s[4];
            for (j = 0; j < 4; ++j) s[j] = R[h].s[R[h].n == 1 ? 0 : r + j] + c; /* one row: not padded */
            if (A->scores_i8) A->scores_i8(R[h].qb + r, R[h].n - r == 1 ? 1 : 4, k, p->k_row, A->hk, m, s, &pf);
            else A->kern->scores[p->cfg.type_k](R[h].q + r, R[h].n - r == 1 ? 1 : 4, k, p->k_row, A->hk, m, s, &pf);
        }
        kvc__pf_some(&pf, INT32_MAX);
    }
}

static void kvc__fused_values(const kvc__attn *A, const kvc__rows *R, const unsigned char *v0, int32_t n,
                              const kvc__ahead *next, int32_t c, int32_t m) {
    const kvc_pool *p = A->p;
    size_t slice = kvc__row_bytes(p->cfg.type_v, 1, A->hv);
    int32_t h, r, j;
    for (h = 0; h < A->n_kv; ++h) {
        const unsigned char *v = v0 + (size_t)c * p->v_row + (size_t)h * slice;
        kvc__pf pf = kvc__pf_ahead(v0, n, next->v, next->rows, p->v_row, c + A->strip, m, h, A->n_kv);
        for (r = 0; r < R[h].n; r += 4) {
            const float *w[4];
            for (j = 0; j < 4; ++j) w[j] = R[h].s[R[h].n == 1 ? 0 : r + j] + c;
            A->kern->values[p->cfg.type_v](R[h].acc + r, R[h].n - r == 1 ? 1 : 4, w, v, p->v_row, A->hv, m, &pf);
        }
        kvc__pf_some(&pf, INT32_MAX);
    }
}

/* One block of n cells (page slots [slot, slot + n)) for every kv head: scores, online
   softmax and V accumulation of the rows of the task's queries that see any of them.
   Fused kernels walk the block in whole-row strips; otherwise each kv head's slice is
   converted into an f32 tile first. */
/* Ask for bytes the next block will read (into L2): the hardware prefetchers alone
   leave a single thread well below its streaming bandwidth here. */
static void kvc__prefetch(const unsigned char *p, size_t bytes) {
    kvc__pf pf;
    pf.lo = (uintptr_t)p & ~(uintptr_t)63;
    pf.hi = bytes ? (uintptr_t)p + bytes : pf.lo;
    kvc__pf_some(&pf, INT32_MAX);
}

static void kvc__attn_block(const kvc__attn *A, uint32_t page, int32_t slot, int32_t n, const kvc__ahead *next, int32_t q0,
                            int32_t nq, const uint32_t *vis, float *ml, float *acc, float *work, kvc__rows *R) {
    const kvc_pool *p = A->p;
    float *s = work, *tile = s + (size_t)A->rows_max * KVC__BLOCK;
    float *pad_s = tile + A->tile_floats, *pad_acc = pad_s + KVC__BLOCK;
    const unsigned char *k0 = kvc__k_at(p, A->layer, page, slot), *v0 = kvc__v_at(p, A->layer, page, slot);
    int32_t h, r, c, i;
    const unsigned char *qb = (const unsigned char *)(work + A->qb_floats);
    for (h = 0; h < A->n_kv; ++h) kvc__rows_of_head(A, h, q0, nq, vis, ml, acc, s, pad_s, pad_acc, qb, &R[h]);
    if (R[0].n == 0) return;
    if (A->fused_k) {
        for (c = 0; c < n; c += A->strip) kvc__fused_scores(A, R, k0, n, next, c, KVC__MIN(A->strip, n - c));
    } else {
        kvc__prefetch(next->k, (size_t)KVC__MIN(next->rows, KVC__BLOCK) * p->k_row);
        for (h = 0; h < A->n_kv; ++h) {
            size_t off = kvc__row_bytes(p->cfg.type_k, h, A->hk);
            for (i = 0; i < n; ++i) p->tk.to_f32(k0 + (size_t)i * p->k_row + off, tile + (size_t)i * A->hk, A->hk);
            for (r = 0; r < R[h].n; ++r) A->kern->dot(R[h].q[r], tile, A->hk, (size_t)A->hk, n, R[h].s[r]);
        }
    }
    for (h = 0; h < A->n_kv; ++h)
        for (r = 0; r < R[h].n; r += 4) kvc__attn_softmax(A, &R[h], r, n);
    memset(pad_s, 0, sizeof(float) * KVC__BLOCK);
    if (A->fused_v) {
        for (c = 0; c < n; c += A->strip) kvc__fused_values(A, R, v0, n, next, c, KVC__MIN(A->strip, n - c));
    } else {
        kvc__prefetch(next->v, (size_t)KVC__MIN(next->rows, KVC__BLOCK) * p->v_row);
        for (h = 0; h < A->n_kv; ++h) {
            size_t off = kvc__row_bytes(p->cfg.type_v, h, A->hv);
            for (i = 0; i < n; ++i) p->tv.to_f32(v0 + (size_t)i * p->v_row + off, tile + (size_t)i * A->hv, A->hv);
            for (r = 0; r < R[h].n; ++r) A->kern->axpy(R[h].acc[r], R[h].s[r], tile, A->hv, (size_t)A->hv, n);
        }
    }
}

/* The rows from cell `cell` (of run lo or the next) to the end of their run, at most
   to the chunk's end */
static void kvc__ahead_of(const kvc__attn *A, int32_t lo, int32_t cell, int32_t end, kvc__ahead *next) {
    const kvc__run *run;
    if (cell == A->run_start[lo + 1]) ++lo;
    next->rows = lo < A->n_runs ? KVC__MIN(end, A->run_start[lo + 1]) - cell : 0;
    if (next->rows <= 0) {
        next->k = next->v = NULL;
        next->rows = 0;
        return;
    }
    run = &A->runs[lo];
    next->k = kvc__k_at(A->p, A->layer, run->page, run->c0 + cell - A->run_start[lo]);
    next->v = kvc__v_at(A->p, A->layer, run->page, run->c0 + cell - A->run_start[lo]);
}

/* Row `row` (query row / n_heads, head row % n_heads) done: out holds sum_i e^(s_i - m) v_i
   and l = sum_i e^(s_i - m) (m = -inf, l = 0: nothing visible). Divides out by the
   denominator, the head's sink joining it, and writes the row's log-sum-exp if asked. */
static void kvc__attn_finish(const kvc__attn *A, size_t row, float m, float l, float *out) {
    const kvc_attention_desc *d = A->d;
    float sink = d->sinks ? d->sinks[row % (size_t)A->n_heads] : -INFINITY;
    if (l != l) { /* a poisoned key was visible (kvc__attn_softmax) */
        int32_t i;
        for (i = 0; i < A->hv; ++i) out[i] = NAN;
        if (d->lse) d->lse[row] = NAN;
        return;
    }
    if (sink != -INFINITY) { /* M = max(m, sink); L = l e^(m - M) + e^(sink - M) */
        float M = KVC__MAX(m, sink), w = m == -INFINITY ? 0.0f : expf(m - M), L = l * w + expf(sink - M);
        if (l > 0.0f) A->kern->scale(out, A->hv, w / L);
        m = M;
        l = L;
    } else if (l > 0.0f) {
        A->kern->scale(out, A->hv, 1.0f / l);
    }
    if (d->lse) d->lse[row] = l > 0.0f ? m + logf(l) : -INFINITY;
}

/* f16_tail: the tokens of the cache's ring after the pages' cells, in blocks through the
   f32 tile (a ring row is the f16 of the f32 put, or for an unquantized side the stored
   row), folded into the same online softmax. */
static void kvc__attn_tail(const kvc__attn *A, int32_t q0, int32_t nq, const kvc__query *qs, float *ml, float *acc,
                           float *work, kvc__rows *R) {
    const kvc_cache *c = A->c;
    float *s = work, *tile = s + (size_t)A->rows_max * KVC__BLOCK;
    float *pad_s = tile + A->tile_floats, *pad_acc = pad_s + KVC__BLOCK;
    const unsigned char *qb = (const unsigned char *)(work + A->qb_floats);
    int64_t t;
    int32_t n, h, r, i, q, T = c->cfg.f16_tail;
    uint32_t vis[KVC__PREFILL_QUERIES];
    for (t = A->tail_lo; t < A->tail_hi; t += n) {
        int32_t slot = (int32_t)(t % T);
        uint32_t any = 0;
        n = (int32_t)KVC__MIN((int64_t)KVC__MIN(KVC__BLOCK, T - slot), A->tail_hi - t);
        for (q = 0; q < nq; ++q) {
            const kvc__query *qq = &qs[q];
            uint32_t m = 0;
            for (i = 0; i < n; ++i) {
                int64_t k = t + i;
                m |= (uint32_t)(k <= qq->hi && k >= qq->lo && (k < qq->sink_end || k >= qq->wlo)) << i;
            }
            any |= vis[q] = m;
        }
        if (!any) continue;
        for (h = 0; h < A->n_kv; ++h) kvc__rows_of_head(A, h, q0, nq, vis, ml, acc, s, pad_s, pad_acc, qb, &R[h]);
        for (h = 0; h < A->n_kv; ++h) {
            size_t off = kvc__row_bytes(c->tail_tk, h, A->hk);
            for (i = 0; i < n; ++i) A->tail_k_f32(A->tail_k + (size_t)(slot + i) * c->tail_krow + off, tile + (size_t)i * A->hk, A->hk);
            for (r = 0; r < R[h].n; ++r) A->kern->dot(R[h].q[r], tile, A->hk, (size_t)A->hk, n, R[h].s[r]);
        }
        for (h = 0; h < A->n_kv; ++h)
            for (r = 0; r < R[h].n; r += 4) kvc__attn_softmax(A, &R[h], r, n);
        for (h = 0; h < A->n_kv; ++h) {
            size_t off = kvc__row_bytes(c->tail_tv, h, A->hv);
            for (i = 0; i < n; ++i) A->tail_v_f32(A->tail_v + (size_t)(slot + i) * c->tail_vrow + off, tile + (size_t)i * A->hv, A->hv);
            for (r = 0; r < R[h].n; ++r) A->kern->axpy(R[h].acc[r], R[h].s[r], tile, A->hv, (size_t)A->hv, n);
        }
    }
}

/* Task t: the queries of block t / n_chunks over the cells of chunk t % n_chunks. */
static void kvc__attn_task(void *ctx, int32_t task, int32_t worker) {
    const kvc__attn *A = (const kvc__attn *)ctx;
    const kvc_attention_desc *d = A->d;
    int32_t qt = task / A->n_chunks, ch = task % A->n_chunks, q0 = qt * A->per_task;
    int32_t nq = KVC__MIN(A->per_task, d->n_queries - q0), rows = nq * A->n_heads;
    int32_t cell = ch * A->chunk, end = KVC__MIN(A->n_cells, cell + A->chunk), lo = 0, hi = A->n_runs, i, q;
    float *ml = A->ml + (size_t)task * (size_t)A->rows_max * 2;
    float *acc = A->part ? A->part + (size_t)task * (size_t)A->rows_max * (size_t)A->hv
                         : d->out + (size_t)q0 * (size_t)A->n_heads * (size_t)A->hv;
    float *work = A->work + (size_t)worker * A->work_floats;
    kvc__rows *lists = kvc__rows_carve(A, work + A->rows_floats);
    kvc__query qs[KVC__PREFILL_QUERIES];
    uint32_t vis[KVC__PREFILL_QUERIES];
    for (i = 0; i < rows; ++i) { ml[2 * i] = -INFINITY; ml[2 * i + 1] = 0.0f; }
    memset(acc, 0, sizeof(float) * (size_t)rows * (size_t)A->hv);
    for (q = 0; q < nq; ++q) qs[q] = kvc__query_of(A->c, d, q0 + q);
    if (A->quantise != NULL) { /* the task's query rows, for integer scores (the last slot: blocks to prepare) */
        unsigned char *qb = (unsigned char *)(work + A->qb_floats), *tmp = qb + (size_t)A->rows_max * A->qb_row;
        for (i = 0; i < rows; ++i) {
            const float *row = d->q + ((size_t)q0 * (size_t)A->n_heads + (size_t)i) * (size_t)A->hk;
            A->quantise(row, A->i8_prepare ? tmp : qb + (size_t)i * A->qb_row, A->hk);
            if (A->i8_prepare) A->i8_prepare(A->p->cfg.type_k, A->hk, (const kvc__block_q8_0 *)(void *)tmp, qb + (size_t)i * A->qb_row);
        }
    }
    while (hi - lo > 1) { /* the run holding the chunk's first cell */
        int32_t mid = (lo + hi) / 2;
        if (A->run_start[mid] <= cell) lo = mid; else hi = mid;
    }
    while (cell < end) {
        const kvc__run *run = &A->runs[lo];
        int32_t off = cell - A->run_start[lo], n = KVC__MIN(KVC__BLOCK, KVC__MIN(end, A->run_start[lo + 1]) - cell);
        uint32_t any = 0;
        for (q = 0; q < nq; ++q) any |= vis[q] = kvc__visible_mask(A, &qs[q], run->page, run->c0 + off, run->t0 + off, n);
        if (any) {
            kvc__ahead next;
            kvc__ahead_of(A, lo, cell + n, end, &next);
            kvc__attn_block(A, run->page, run->c0 + off, n, &next, q0, nq, vis, ml, acc, work, lists);
        }
        cell += n;
        if (cell == A->run_start[lo + 1]) ++lo;
    }
    if (A->tail_hi > A->tail_lo && ch == A->n_chunks - 1) kvc__attn_tail(A, q0, nq, qs, ml, acc, work, lists);
    if (A->part == NULL) /* the only chunk: normalise in place */
        for (i = 0; i < rows; ++i)
            kvc__attn_finish(A, (size_t)q0 * (size_t)A->n_heads + (size_t)i, ml[2 * i], ml[2 * i + 1],
                             acc + (size_t)i * A->hv);
}

/* Split-K: out = sum_k exp(m_k - M) acc_k / sum_k exp(m_k - M) l_k, chunks in order. */
static void kvc__attn_merge(const kvc__attn *A) {
    const kvc_attention_desc *d = A->d;
    int32_t qt, row, ch;
    for (qt = 0; qt < A->n_qtasks; ++qt) {
        int32_t q0 = qt * A->per_task, rows = KVC__MIN(A->per_task, d->n_queries - q0) * A->n_heads;
        for (row = 0; row < rows; ++row) {
            float *out = d->out + ((size_t)q0 * (size_t)A->n_heads + (size_t)row) * (size_t)A->hv, M = -INFINITY, L = 0.0f;
            int poisoned = 0;
            memset(out, 0, sizeof(float) * (size_t)A->hv);
            for (ch = 0; ch < A->n_chunks; ++ch) {
                const float *ml = A->ml + ((size_t)qt * A->n_chunks + ch) * (size_t)A->rows_max * 2 + 2 * (size_t)row;
                M = KVC__MAX(M, ml[0]);
                poisoned |= ml[1] != ml[1]; /* a chunk saw a poisoned key */
            }
            if (M == -INFINITY || poisoned) { /* nothing visible, or NaN */
                kvc__attn_finish(A, (size_t)q0 * (size_t)A->n_heads + (size_t)row, M, poisoned ? NAN : 0.0f, out);
                continue;
            }
            for (ch = 0; ch < A->n_chunks; ++ch) {
                size_t t = (size_t)qt * A->n_chunks + ch;
                const float *ml = A->ml + t * (size_t)A->rows_max * 2 + 2 * (size_t)row;
                float w;
                if (ml[0] == -INFINITY) continue;
                w = expf(ml[0] - M);
                L += w * ml[1];
                A->kern->axpy(out, &w, A->part + (t * (size_t)A->rows_max + (size_t)row) * (size_t)A->hv, A->hv, 0, 1);
            }
            kvc__attn_finish(A, (size_t)q0 * (size_t)A->n_heads + (size_t)row, M, L, out);
        }
    }
}

static void kvc__attn_init(kvc__attn *A, const kvc_cache *c, int32_t layer, const kvc_attention_desc *d) {
    memset(A, 0, sizeof(*A));
    A->c = c;
    A->p = c->pool;
    A->d = d;
    A->kern = c->pool->kern;
    A->layer = layer;
    A->n_heads = d->n_heads;
    A->n_kv = c->pool->cfg.n_kv_heads;
    A->group = d->n_heads / A->n_kv;
    A->hk = c->pool->cfg.head_dim_k;
    A->hv = c->pool->cfg.head_dim_v;
    A->scale = d->scale > 0.0f ? d->scale : 1.0f / sqrtf((float)A->hk);
    A->softcap = d->softcap;
    if (c->tail != NULL && KVC__MIN(c->tail_hi, c->offset) > c->tail_lo) {
        A->tail_lo = c->tail_lo;
        A->tail_hi = KVC__MIN(c->tail_hi, c->offset);
        A->tail_k = kvc__tail_k(c, layer);
        A->tail_v = kvc__tail_v(c, layer);
        A->tail_k_f32 = kvc__pick_type(c->tail_tk, c->pool->cpu).to_f32;
        A->tail_v_f32 = kvc__pick_type(c->tail_tv, c->pool->cpu).to_f32;
    }
    A->fused_k = A->kern->scores[c->pool->cfg.type_k] != NULL && A->hk % A->kern->lanes == 0 && A->hk <= 1024;
    if (A->kern->scores_i8[c->pool->cfg.type_k] != NULL) { /* every path has them for block types */
        const kvc__kernels *ik = A->hk <= KVC__SCALES * KVC__QBLOCK ? A->kern : &kvc__kernels_scalar;
        size_t row = ik->i8_row_bytes ? ik->i8_row_bytes(c->pool->cfg.type_k, A->hk)
                                      : (size_t)(A->hk / KVC__QBLOCK) * sizeof(kvc__block_q8_0);
        A->scores_i8 = ik->scores_i8[c->pool->cfg.type_k];
        A->i8_prepare = ik->i8_prepare;
        A->quantise = kvc__pick_type(KVC_TYPE_Q8_0, c->pool->cpu).from_f32;
        A->qb_row = (row + 63) & ~(size_t)63;
        A->fused_k = 1;
    }
    A->fused_v = A->kern->values[c->pool->cfg.type_v] != NULL && A->hv % A->kern->lanes == 0 && A->hv <= 1024;
    /* strips of about KVC__STRIP_BYTES, 8 to 16 rows: 16 rows of f16 at 8 x 128 (2 KB rows)
       took 34 ns per cell and kv head in L3 against 36 with 8, but from memory 16 rows of 4 KB
       (f32) were 40 % slower than 8, and 8 rows of 8 KB (32 kv heads) 15 % faster than 4 */
    A->strip = (int32_t)(KVC__STRIP_BYTES / KVC__MAX(KVC__MAX(c->pool->k_row, c->pool->v_row), 1));
    A->strip = KVC__MAX(8, KVC__MIN(KVC__STRIP, A->strip)) & ~3;
}

/* Rotated keys (kvc_pool_config.rotate): the bytes of the call's rotated queries, which
   come first in the scratch (a multiple of 64). */
static size_t kvc__rot_q_bytes(const kvc_cache *c, const kvc_attention_desc *d, int *of) {
    if (c->pool->rot_k == 0) return 0;
    return kvc__mul(kvc__floats_aligned(kvc__mul(kvc__mul((size_t)d->n_queries, (size_t)d->n_heads, of),
                                                 (size_t)c->pool->cfg.head_dim_k, of)), sizeof(float), of);
}

KVCDEF kvc_result kvc_attention_scratch_bytes(const kvc_cache *cache, const kvc_attention_desc *desc, size_t *bytes) {
    kvc__attn A;
    kvc_attention_desc d;
    kvc_result r;
    int of = 0;
    if (bytes == NULL) return KVC_ERR_NULL;
    if (desc == NULL) return KVC_ERR_NULL;
    d = *desc;
    d.scratch = NULL;
    d.scratch_bytes = 0;
    r = kvc__check_attention(cache, 0, &d);
    if (r != KVC_OK) return r;
    kvc__attn_init(&A, cache, 0, &d);
    if ((r = kvc__attn_plan(&A, NULL, bytes)) != KVC_OK) return r;
    *bytes = kvc__add(*bytes, kvc__rot_q_bytes(cache, &d, &of), &of);
    return of ? KVC_ERR_OVERFLOW : KVC_OK;
}

/* The rule for non-finite queries, the same for every storage type and path: a query
   row (one query, one head) holding a NaN or an infinity gives a row of NaN, and a NaN
   log-sum-exp where asked (kvcache_vk.h's merge applies the same rule). (Left to
   the kernels, float keys gave zeros and block keys NaN or numbers: the row's scores
   are NaN or infinite, and quantising the row drops or clamps the value.) One pass over
   q; the other rows never depend on such a row. */
static void kvc__attn_nonfinite(const kvc__attn *A) {
    const kvc_attention_desc *d = A->d;
    size_t rows = (size_t)d->n_queries * (size_t)A->n_heads, r, i;
    for (r = 0; r < rows; ++r) {
        const float *q = d->q + r * (size_t)A->hk;
        uint32_t bad = 0, u;
        for (i = 0; i < (size_t)A->hk; ++i) { /* exponent all ones: NaN or infinite */
            memcpy(&u, q + i, 4);
            bad |= (uint32_t)((u & 0x7f800000u) == 0x7f800000u);
        }
        if (!bad) continue;
        for (i = 0; i < (size_t)A->hv; ++i) d->out[r * (size_t)A->hv + i] = NAN;
        if (d->lse) d->lse[r] = NAN; /* not -INFINITY (nothing visible), which a merge would drop */
    }
}

/* Lay the plan out in mem (aligned here) and run its tasks. Rotated keys
   (kvc_pool_config.rotate): the scratch begins with the queries rotated the same way,
   qr_bytes of them, which rd (A's desc) then points to; rotated values: the output is
   rotated back at the end, out = R^T (sum p_i R v_i). The kernels never know. */
static kvc_result kvc__attn_exec(kvc__attn *A, kvc_attention_desc *rd, unsigned char *mem, size_t qr_bytes) {
    const kvc_pool *p = A->p;
    size_t bytes, rows = (size_t)rd->n_queries * (size_t)rd->n_heads;
    int32_t n_tasks, t;
    unsigned char *base = mem + ((64 - ((uintptr_t)mem & 63)) & 63);
    if (qr_bytes) {
        memcpy(base, rd->q, rows * (size_t)A->hk * sizeof(float));
        kvc__rot_rows(p->rot_fn, (float *)(void *)base, A->hk, p->rot_k, rows, 0);
        rd->q = (const float *)(void *)base;
        base += qr_bytes;
    }
    (void)kvc__attn_plan(A, base, &bytes); /* the size query of the same plan succeeded */
    n_tasks = A->n_qtasks * A->n_chunks;
    if (p->cfg.runtime.parallel_for != NULL && n_tasks > 1)
        p->cfg.runtime.parallel_for(p->cfg.runtime.parallel_user, n_tasks, kvc__attn_task, A);
    else
        for (t = 0; t < n_tasks; ++t) kvc__attn_task(A, t, 0);
    if (A->part != NULL) kvc__attn_merge(A);
    if (p->rot_v) kvc__rot_rows(p->rot_fn, rd->out, A->hv, p->rot_v, rows, 1);
    kvc__attn_nonfinite(A); /* a NaN or infinite query (the rotation keeps it one) */
    return KVC_OK;
}

/* Small calls without caller scratch need no allocation: their scratch is this frame's,
   never inlined, so that a call with caller scratch keeps no large buffer on its stack. */
#if defined(__GNUC__) || defined(__clang__)
__attribute__((noinline))
#elif defined(_MSC_VER)
__declspec(noinline)
#endif
static kvc_result kvc__attn_on_stack(kvc__attn *A, kvc_attention_desc *rd, size_t qr_bytes) {
    double small[KVC__STACK_SCRATCH / sizeof(double)];
    return kvc__attn_exec(A, rd, (unsigned char *)small, qr_bytes);
}

/* q and out overlap: the kernels write out while later rows of q are still to be read */
static int kvc__attn_overlap(const kvc__attn *A, const kvc_attention_desc *d) {
    uint64_t rows = (uint64_t)d->n_queries * (uint64_t)d->n_heads; /* < 2^31 (kvc__attn_plan) */
    uint64_t qa = (uint64_t)(uintptr_t)d->q, qe = qa + rows * (uint64_t)A->hk * sizeof(float);
    uint64_t oa = (uint64_t)(uintptr_t)d->out, oe = oa + rows * (uint64_t)A->hv * sizeof(float);
    return qa < oe && oa < qe;
}

KVCDEF kvc_result kvc_attention(const kvc_cache *cache, int32_t layer, const kvc_attention_desc *desc) {
    kvc__attn A;
    kvc_attention_desc rd; /* desc with the rotated queries (kvc_pool_config.rotate) */
    size_t bytes, qr_bytes;
    unsigned char *mem;
    int of = 0;
    kvc_result r = kvc__check_attention(cache, layer, desc);
    if (r != KVC_OK) return r;
    if (desc->q == NULL || desc->out == NULL) return KVC_ERR_NULL;
    if (cache->pool->external) return KVC_ERR_UNSUPPORTED; /* the K/V live in a device backend */
    rd = *desc;
    qr_bytes = kvc__rot_q_bytes(cache, desc, &of);
    kvc__attn_init(&A, cache, layer, &rd);
    if ((r = kvc__attn_plan(&A, NULL, &bytes)) != KVC_OK) return r;
    bytes = kvc__add(bytes, qr_bytes, &of);
    if (of) return KVC_ERR_OVERFLOW;
    if (kvc__attn_overlap(&A, desc)) return KVC_ERR_INVALID;
    if (desc->scratch != NULL) {
        if (desc->scratch_bytes < bytes) return KVC_ERR_RANGE;
        return kvc__attn_exec(&A, &rd, (unsigned char *)desc->scratch, qr_bytes);
    }
    if (bytes <= KVC__STACK_SCRATCH) return kvc__attn_on_stack(&A, &rd, qr_bytes);
    mem = (unsigned char *)kvc__alloc(cache->pool, bytes);
    if (mem == NULL) return KVC_ERR_NO_MEMORY;
    r = kvc__attn_exec(&A, &rd, mem, qr_bytes);
    kvc__free(cache->pool, mem);
    return r;
}

/* ---- Layer 6: the optional pthread helper (KVCACHE_THREADS) ------------------------ */
#ifdef KVCACHE_THREADS
#include <pthread.h>

/* Before sleeping on a condition variable, a worker waiting for a job and the caller
   waiting for the workers poll for KVCACHE_THREADS_SPIN rounds: waking a sleeping thread
   took about 30 us here, which left f16 decode over 4k cells on two threads 6 % slower
   (0.603-0.613 against 0.571-0.576 ms). The polled fields are written with atomic stores (under the
   lock as well); without GCC/clang atomics nobody polls. */
#ifndef KVCACHE_THREADS_SPIN
#define KVCACHE_THREADS_SPIN 20000
#endif
#if KVCACHE_THREADS_SPIN > 0 && (defined(__GNUC__) || defined(__clang__)) && !defined(__TINYC__)
#define KVC__SPIN KVCACHE_THREADS_SPIN
#define KVC__POLL(x) __atomic_load_n(&(x), __ATOMIC_ACQUIRE)
#define KVC__PUBLISH(x, v) __atomic_store_n(&(x), (v), __ATOMIC_RELEASE)
#else
#define KVC__SPIN 0
#define KVC__POLL(x) (x)
#define KVC__PUBLISH(x, v) ((x) = (v))
#endif
static void kvc__cpu_relax(void) {
#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
    __builtin_ia32_pause();
#elif (defined(__GNUC__) || defined(__clang__)) && defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

struct kvc_threads {
    pthread_mutex_t submit;     /* held by the caller whose job runs: jobs given at once queue */
    pthread_mutex_t lock;
    pthread_cond_t wake, done;
    pthread_t *threads;
    int32_t n_threads, started; /* workers, the caller included; background threads running */
    kvc_task_fn fn;             /* the job being run */
    void *ctx;
    int32_t n_tasks, next_task, busy; /* busy: background workers still in this job */
    uint32_t generation;        /* bumped per job, so a worker takes each job once */
    int stop;
};
typedef struct kvc__thread_arg {
    kvc_threads *pool;
    int32_t worker;
} kvc__thread_arg;

/* take tasks until none is left */
static void kvc__threads_drain(kvc_threads *t, int32_t worker) {
    for (;;) {
        int32_t task;
        pthread_mutex_lock(&t->lock);
        task = t->next_task < t->n_tasks ? t->next_task++ : -1;
        pthread_mutex_unlock(&t->lock);
        if (task < 0) return;
        t->fn(t->ctx, task, worker);
    }
}

static void *kvc__thread_main(void *arg) {
    kvc_threads *t = ((kvc__thread_arg *)arg)->pool;
    int32_t worker = ((kvc__thread_arg *)arg)->worker;
    uint32_t seen = 0;
    KVCACHE_FREE(arg, NULL);
    for (;;) {
        long spin;
        for (spin = 0; spin < KVC__SPIN && KVC__POLL(t->generation) == seen && !KVC__POLL(t->stop); ++spin)
            kvc__cpu_relax();
        pthread_mutex_lock(&t->lock);
        while (!t->stop && t->generation == seen) pthread_cond_wait(&t->wake, &t->lock);
        if (t->stop) { pthread_mutex_unlock(&t->lock); return NULL; }
        seen = t->generation;
        pthread_mutex_unlock(&t->lock);
        kvc__threads_drain(t, worker);
        pthread_mutex_lock(&t->lock);
        KVC__PUBLISH(t->busy, t->busy - 1);
        if (t->busy == 0) pthread_cond_signal(&t->done);
        pthread_mutex_unlock(&t->lock);
    }
}

/* Jobs from several callers (pools or threads sharing the helper) run one after the
   other: fn, ctx and the task counter are the one job's. */
KVCDEF void kvc_threads_parallel_for(void *threads, int32_t n_tasks, kvc_task_fn fn, void *ctx) {
    kvc_threads *t = (kvc_threads *)threads;
    pthread_mutex_lock(&t->submit);
    pthread_mutex_lock(&t->lock);
    t->fn = fn;
    t->ctx = ctx;
    t->n_tasks = n_tasks;
    t->next_task = 0;
    KVC__PUBLISH(t->busy, t->started);
    KVC__PUBLISH(t->generation, t->generation + 1);
    pthread_cond_broadcast(&t->wake);
    pthread_mutex_unlock(&t->lock);
    kvc__threads_drain(t, 0); /* the caller is worker 0 */
    {
        long spin;
        for (spin = 0; spin < KVC__SPIN && KVC__POLL(t->busy) > 0; ++spin) kvc__cpu_relax();
    }
    pthread_mutex_lock(&t->lock);
    while (t->busy > 0) pthread_cond_wait(&t->done, &t->lock);
    pthread_mutex_unlock(&t->lock);
    pthread_mutex_unlock(&t->submit);
}

KVCDEF kvc_result kvc_threads_destroy(kvc_threads *t) {
    int32_t i;
    if (t == NULL) return KVC_ERR_NULL;
    pthread_mutex_lock(&t->lock);
    KVC__PUBLISH(t->stop, 1);
    pthread_cond_broadcast(&t->wake);
    pthread_mutex_unlock(&t->lock);
    for (i = 0; i < t->started; ++i) pthread_join(t->threads[i], NULL);
    pthread_cond_destroy(&t->done);
    pthread_cond_destroy(&t->wake);
    pthread_mutex_destroy(&t->lock);
    pthread_mutex_destroy(&t->submit);
    KVCACHE_FREE(t->threads, NULL);
    KVCACHE_FREE(t, NULL);
    return KVC_OK;
}

KVCDEF kvc_result kvc_threads_create(int32_t n_threads, kvc_threads **out) {
    kvc_threads *t;
    int32_t i;
    if (out == NULL) return KVC_ERR_NULL;
    if (n_threads < 1 || n_threads > 1024) return KVC_ERR_INVALID;
    t = (kvc_threads *)KVCACHE_MALLOC(sizeof(*t), NULL);
    if (t == NULL) return KVC_ERR_NO_MEMORY;
    memset(t, 0, sizeof(*t));
    t->threads = (pthread_t *)KVCACHE_MALLOC(sizeof(pthread_t) * (size_t)n_threads, NULL);
    if (t->threads == NULL || pthread_mutex_init(&t->lock, NULL) != 0) {
        KVCACHE_FREE(t->threads, NULL);
        KVCACHE_FREE(t, NULL);
        return KVC_ERR_NO_MEMORY;
    }
    if (pthread_mutex_init(&t->submit, NULL) != 0) {
        pthread_mutex_destroy(&t->lock);
        KVCACHE_FREE(t->threads, NULL);
        KVCACHE_FREE(t, NULL);
        return KVC_ERR_NO_MEMORY;
    }
    pthread_cond_init(&t->wake, NULL);
    pthread_cond_init(&t->done, NULL);
    t->n_threads = n_threads;
    for (i = 1; i < n_threads; ++i) {
        kvc__thread_arg *arg = (kvc__thread_arg *)KVCACHE_MALLOC(sizeof(*arg), NULL);
        if (arg == NULL) break;
        arg->pool = t;
        arg->worker = i;
        if (pthread_create(&t->threads[t->started], NULL, kvc__thread_main, arg) != 0) {
            KVCACHE_FREE(arg, NULL);
            break;
        }
        t->started++;
    }
    if (t->started != n_threads - 1) {
        kvc_threads_destroy(t);
        return KVC_ERR_NO_MEMORY;
    }
    *out = t;
    return KVC_OK;
}

KVCDEF kvc_result kvc_threads_attach(kvc_threads *t, kvc_runtime *rt) {
    if (t == NULL || rt == NULL) return KVC_ERR_NULL;
    rt->parallel_for = kvc_threads_parallel_for;
    rt->parallel_user = t;
    rt->n_workers = t->n_threads;
    return KVC_OK;
}

/* A recursive mutex out of a plain one (PTHREAD_MUTEX_RECURSIVE needs _XOPEN_SOURCE,
   which strict C99 builds do not define): the owner and a depth, and a condition
   variable for the threads waiting for it. */
struct kvc_mutex {
    pthread_mutex_t m;
    pthread_cond_t free;
    pthread_t owner;
    int32_t depth; /* 0: free */
};

KVCDEF void kvc_mutex_lock(void *mutex) {
    kvc_mutex *x = (kvc_mutex *)mutex;
    pthread_t self = pthread_self();
    pthread_mutex_lock(&x->m);
    if (x->depth > 0 && pthread_equal(x->owner, self)) {
        x->depth++;
    } else {
        while (x->depth > 0) pthread_cond_wait(&x->free, &x->m);
        x->owner = self;
        x->depth = 1;
    }
    pthread_mutex_unlock(&x->m);
}

KVCDEF void kvc_mutex_unlock(void *mutex) {
    kvc_mutex *x = (kvc_mutex *)mutex;
    pthread_mutex_lock(&x->m);
    KVCACHE_ASSERT(x->depth > 0 && pthread_equal(x->owner, pthread_self()));
    if (--x->depth == 0) pthread_cond_signal(&x->free);
    pthread_mutex_unlock(&x->m);
}

KVCDEF kvc_result kvc_mutex_create(kvc_mutex **out) {
    kvc_mutex *x;
    if (out == NULL) return KVC_ERR_NULL;
    x = (kvc_mutex *)KVCACHE_MALLOC(sizeof(*x), NULL);
    if (x == NULL) return KVC_ERR_NO_MEMORY;
    memset(x, 0, sizeof(*x));
    if (pthread_mutex_init(&x->m, NULL) != 0) {
        KVCACHE_FREE(x, NULL);
        return KVC_ERR_NO_MEMORY;
    }
    if (pthread_cond_init(&x->free, NULL) != 0) {
        pthread_mutex_destroy(&x->m);
        KVCACHE_FREE(x, NULL);
        return KVC_ERR_NO_MEMORY;
    }
    *out = x;
    return KVC_OK;
}

KVCDEF kvc_result kvc_mutex_destroy(kvc_mutex *x) {
    if (x == NULL) return KVC_ERR_NULL;
    if (x->depth > 0) return KVC_ERR_BUSY; /* held */
    pthread_cond_destroy(&x->free);
    pthread_mutex_destroy(&x->m);
    KVCACHE_FREE(x, NULL);
    return KVC_OK;
}

KVCDEF kvc_result kvc_mutex_attach(kvc_mutex *x, kvc_runtime *rt) {
    if (x == NULL || rt == NULL) return KVC_ERR_NULL;
    rt->lock = kvc_mutex_lock;
    rt->unlock = kvc_mutex_unlock;
    rt->lock_user = x;
    return KVC_OK;
}
#endif /* KVCACHE_THREADS */

/* ---- Views for callers with their own attention ---------------------------------- */

KVCDEF kvc_result kvc_cache_runs(const kvc_cache *cache, int32_t layer, kvc_run *runs, int32_t max_runs,
                                 int32_t *n_runs) {
    const kvc_pool *p;
    kvc__iter it;
    kvc__run run;
    kvc_run cur;
    int32_t n = 0;
    if (cache == NULL || n_runs == NULL) return KVC_ERR_NULL;
    p = cache->pool;
    if (layer < 0 || layer >= p->cfg.n_layers) return KVC_ERR_RANGE;
    if (max_runs < 0 || (runs == NULL && max_runs > 0)) return KVC_ERR_INVALID;
    if (p->external) return KVC_ERR_UNSUPPORTED;
    memset(&cur, 0, sizeof(cur));
    kvc__iter_init(&it, cache);
    while (kvc__iter_next(&it, &run)) {
        const unsigned char *k = kvc__k_at(p, layer, run.page, run.c0);
        /* consecutive page ids are one contiguous block per layer: extend the run */
        if (cur.n_cells > 0 && (const unsigned char *)cur.k + (size_t)cur.n_cells * p->k_row == k &&
            cur.pos + cur.n_cells == kvc__pos_at(p, run.page, run.c0)) {
            cur.n_cells += run.c1 - run.c0;
            continue;
        }
        if (cur.n_cells > 0 && n++ < max_runs) runs[n - 1] = cur;
        cur.k = k;
        cur.v = kvc__v_at(p, layer, run.page, run.c0);
        cur.pos = kvc__pos_at(p, run.page, run.c0);
        cur.n_cells = run.c1 - run.c0;
    }
    if (cur.n_cells > 0 && n++ < max_runs) runs[n - 1] = cur;
    *n_runs = n;
    return n > max_runs && runs != NULL ? KVC_ERR_RANGE : KVC_OK;
}

KVCDEF kvc_result kvc_cache_gather(const kvc_cache *cache, int32_t layer, float *k, float *v, int32_t *pos,
                                   int32_t max_cells, int32_t *n_cells) {
    const kvc_pool *p;
    kvc__iter it;
    kvc__run run;
    int32_t n, cell, nk, nv;
    if (cache == NULL || n_cells == NULL) return KVC_ERR_NULL;
    p = cache->pool;
    if (layer < 0 || layer >= p->cfg.n_layers) return KVC_ERR_RANGE;
    if (max_cells < 0) return KVC_ERR_INVALID;
    if (p->external) return KVC_ERR_UNSUPPORTED;
    kvc_cache_cells(cache, &n);
    *n_cells = n;
    if (k == NULL && v == NULL && pos == NULL) return KVC_OK; /* only the count was asked */
    if (n > max_cells) return KVC_ERR_RANGE;
    nk = p->cfg.n_kv_heads * p->cfg.head_dim_k;
    nv = p->cfg.n_kv_heads * p->cfg.head_dim_v;
    n = 0;
    kvc__iter_init(&it, cache);
    while (kvc__iter_next(&it, &run)) {
        for (cell = run.c0; cell < run.c1; ++cell, ++n) {
            if (k) p->tk.to_f32(kvc__k_at(p, layer, run.page, cell), k + (size_t)n * nk, nk);
            if (v) p->tv.to_f32(kvc__v_at(p, layer, run.page, cell), v + (size_t)n * nv, nv);
            if (k && p->rot_k) /* plain rows */
                kvc__rot_rows(p->rot_fn, k + (size_t)n * nk, p->cfg.head_dim_k, p->rot_k, (size_t)p->cfg.n_kv_heads, 1);
            if (v && p->rot_v)
                kvc__rot_rows(p->rot_fn, v + (size_t)n * nv, p->cfg.head_dim_v, p->rot_v, (size_t)p->cfg.n_kv_heads, 1);
            if (pos) pos[n] = *kvc__pos_at(p, run.page, cell);
        }
    }
    return KVC_OK;
}

/* ---- Layer 7: persistence ------------------------------------------------------------
   A saved object: "KVCACHE\x1a", u32 version, u32 what, then the sections CONF, META,
   TOKS, CELL and KVDT, each u32 tag, u32 0, u64 length, the payload and the XXH64 (seed 0)
   of everything from the tag to the payload's end. Integers are little-endian. The
   layout of each section is in docs/format.md. A load reads into fresh
   pages and scratch memory and changes its target only after the last checksum. */

#define KVC__FORMAT_VERSION 1u
#define KVC__WHAT_CACHE 1u
#define KVC__WHAT_SEQ 2u
#define KVC__WHAT_ENTRY 3u
#define KVC__WHAT_MEMORY 4u        /* a model memory (its MEMO section, then each group) */
#define KVC__WHAT_MEMORY_ENTRY 5u  /* an entry of a memory's prefix tree */
#define KVC__TAG(a, b, c, d) ((uint32_t)(a) | (uint32_t)(b) << 8 | (uint32_t)(c) << 16 | (uint32_t)(d) << 24)
#define KVC__CONF_BYTES 80u
#define KVC__META_BYTES 24u
#define KVC__CONF_CKPT 1u          /* CONF word 15: the CKPT and CKDT sections follow KVDT */
#define KVC__CONF_TAIL 2u          /* CONF word 15: a TAIL section (f16_tail rows) comes last */
/* Pools with external data (a device backend) move K/V bytes through the hooks'
   read_pages / write_pages in chunks of at most this many bytes (at least one page). */
#ifndef KVCACHE_IO_CHUNK
#define KVCACHE_IO_CHUNK ((size_t)8 << 20)
#endif

static const unsigned char kvc__magic[8] = {'K', 'V', 'C', 'A', 'C', 'H', 'E', 0x1a};

static int kvc__little_endian(void) {
    const uint16_t one = 1;
    unsigned char b;
    memcpy(&b, &one, 1);
    return b == 1;
}

/* XXH64, streaming (the reference algorithm; seed 0). */
#define KVC__P1 0x9E3779B185EBCA87ull
#define KVC__P2 0xC2B2AE3D27D4EB4Full
#define KVC__P3 0x165667B19E3779F9ull
#define KVC__P4 0x85EBCA77C2B2AE63ull
#define KVC__P5 0x27D4EB2F165667C5ull

typedef struct kvc__xxh {
    uint64_t v[4], total;
    unsigned char buf[32];
    size_t n_buf;
} kvc__xxh;

static uint64_t kvc__rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
static uint64_t kvc__le64(const unsigned char *p) {
    return (uint64_t)p[0] | (uint64_t)p[1] << 8 | (uint64_t)p[2] << 16 | (uint64_t)p[3] << 24 |
           (uint64_t)p[4] << 32 | (uint64_t)p[5] << 40 | (uint64_t)p[6] << 48 | (uint64_t)p[7] << 56;
}
static uint32_t kvc__le32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static void kvc__put32(unsigned char *p, uint32_t x) {
    p[0] = (unsigned char)x; p[1] = (unsigned char)(x >> 8); p[2] = (unsigned char)(x >> 16); p[3] = (unsigned char)(x >> 24);
}
static void kvc__put64(unsigned char *p, uint64_t x) {
    kvc__put32(p, (uint32_t)x);
    kvc__put32(p + 4, (uint32_t)(x >> 32));
}
static uint64_t kvc__xxh_round(uint64_t acc, uint64_t in) { return kvc__rotl(acc + in * KVC__P2, 31) * KVC__P1; }

static void kvc__xxh_init(kvc__xxh *h) {
    memset(h, 0, sizeof(*h));
    h->v[0] = KVC__P1 + KVC__P2;
    h->v[1] = KVC__P2;
    h->v[2] = 0;
    h->v[3] = 0 - KVC__P1;
}

/* Whole 32-byte stripes of p[0 .. n): the lanes live in locals, not behind h (the byte
   loads could alias them), which keeps the loop at memory speed. */
static void kvc__xxh_stripes(kvc__xxh *h, const unsigned char *p, size_t n) {
    uint64_t v0 = h->v[0], v1 = h->v[1], v2 = h->v[2], v3 = h->v[3], w[4];
    int le = kvc__little_endian(), i;
    for (; n >= 32; p += 32, n -= 32) {
        memcpy(w, p, 32); /* one load per lane (kvc__le64 is a call at -O2) */
        if (!le)
            for (i = 0; i < 4; ++i) w[i] = kvc__le64(p + 8 * i);
        v0 = kvc__xxh_round(v0, w[0]);
        v1 = kvc__xxh_round(v1, w[1]);
        v2 = kvc__xxh_round(v2, w[2]);
        v3 = kvc__xxh_round(v3, w[3]);
    }
    h->v[0] = v0;
    h->v[1] = v1;
    h->v[2] = v2;
    h->v[3] = v3;
}

static void kvc__xxh_update(kvc__xxh *h, const void *data, size_t n) {
    const unsigned char *p = (const unsigned char *)data;
    h->total += n;
    if (h->n_buf > 0) {
        size_t k = KVC__MIN(n, 32 - h->n_buf);
        memcpy(h->buf + h->n_buf, p, k);
        h->n_buf += k;
        p += k;
        n -= k;
        if (h->n_buf < 32) return;
        kvc__xxh_stripes(h, h->buf, 32);
        h->n_buf = 0;
    }
    kvc__xxh_stripes(h, p, n);
    p += n & ~(size_t)31;
    n &= 31;
    memcpy(h->buf, p, n);
    h->n_buf = n;
}

static uint64_t kvc__xxh_digest(const kvc__xxh *h) {
    uint64_t x;
    const unsigned char *p = h->buf;
    size_t n = h->n_buf, i;
    if (h->total >= 32) {
        x = kvc__rotl(h->v[0], 1) + kvc__rotl(h->v[1], 7) + kvc__rotl(h->v[2], 12) + kvc__rotl(h->v[3], 18);
        for (i = 0; i < 4; ++i) x = (x ^ kvc__xxh_round(0, h->v[i])) * KVC__P1 + KVC__P4;
    } else {
        x = KVC__P5;
    }
    x += h->total;
    for (; n >= 8; p += 8, n -= 8) x = kvc__rotl(x ^ kvc__xxh_round(0, kvc__le64(p)), 27) * KVC__P1 + KVC__P4;
    if (n >= 4) { x = kvc__rotl(x ^ (uint64_t)kvc__le32(p) * KVC__P1, 23) * KVC__P2 + KVC__P3; p += 4; n -= 4; }
    for (; n > 0; ++p, --n) x = kvc__rotl(x ^ (uint64_t)*p * KVC__P5, 11) * KVC__P1;
    x ^= x >> 33;
    x *= KVC__P2;
    x ^= x >> 29;
    x *= KVC__P3;
    return x ^ (x >> 32);
}

/* ---- writing ---- */

typedef struct kvc__wr {
    const kvc_io *io;
    kvc__xxh h;
    int failed;
    kvc_result dev;  /* a failure other than the io's (a device's read_pages, no memory) */
} kvc__wr;

static void kvc__w_bytes(kvc__wr *w, const void *data, size_t n) {
    if (w->failed || n == 0) return;
    kvc__xxh_update(&w->h, data, n);
    if (w->io->write(w->io->user, data, n) != n) w->failed = 1;
}
static void kvc__w_u32(kvc__wr *w, uint32_t x) {
    unsigned char b[4];
    kvc__put32(b, x);
    kvc__w_bytes(w, b, 4);
}
static void kvc__w_section(kvc__wr *w, uint32_t tag, uint64_t length) {
    unsigned char b[16];
    kvc__put32(b, tag);
    kvc__put32(b + 4, 0);
    kvc__put64(b + 8, length);
    kvc__xxh_init(&w->h);
    kvc__w_bytes(w, b, 16);
}
static void kvc__w_end(kvc__wr *w) { /* the checksum is not part of what it covers */
    unsigned char b[8];
    kvc__put64(b, kvc__xxh_digest(&w->h));
    if (!w->failed && w->io->write(w->io->user, b, 8) != 8) w->failed = 1;
}

/* The header and the CONF section: everything a load checks before reading data.
   flags: CONF word 15 (KVC__CONF_CKPT). */
static void kvc__w_head(kvc__wr *w, const kvc_cache *c, uint32_t what, kvc_namespace ns, uint32_t flags) {
    const kvc_pool_config *pc = &c->pool->cfg;
    const kvc_cache_config *cc = &c->cfg;
    unsigned char b[16];
    memcpy(b, kvc__magic, 8);
    kvc__put32(b + 8, KVC__FORMAT_VERSION);
    kvc__put32(b + 12, what);
    if (w->io->write(w->io->user, b, 16) != 16) w->failed = 1;
    kvc__w_section(w, KVC__TAG('C', 'O', 'N', 'F'), KVC__CONF_BYTES);
    kvc__w_u32(w, (uint32_t)pc->n_layers);
    kvc__w_u32(w, (uint32_t)pc->n_kv_heads);
    kvc__w_u32(w, (uint32_t)pc->head_dim_k);
    kvc__w_u32(w, (uint32_t)pc->head_dim_v);
    kvc__w_u32(w, (uint32_t)pc->type_k);
    kvc__w_u32(w, (uint32_t)pc->type_v);
    kvc__w_u32(w, (uint32_t)c->pool->page_cells);
    kvc__w_u32(w, (uint32_t)cc->kind);
    kvc__w_u32(w, (uint32_t)cc->window);
    kvc__w_u32(w, (uint32_t)cc->sinks);
    kvc__w_u32(w, (uint32_t)cc->capacity);
    kvc__w_u32(w, (uint32_t)cc->max_seqs);
    kvc__w_u32(w, (uint32_t)cc->chunk);
    kvc__w_u32(w, (uint32_t)cc->padding);
    kvc__w_u32(w, pc->rotate); /* 0 in files from before the option */
    kvc__w_u32(w, flags);      /* 0 in files from before checkpoints were saved */
    kvc__put64(b, ns.model);
    kvc__put64(b + 8, ns.salt);
    kvc__w_bytes(w, b, 16);
    kvc__w_end(w);
}

static void kvc__w_meta(kvc__wr *w, const int32_t m[6]) {
    int i;
    kvc__w_section(w, KVC__TAG('M', 'E', 'T', 'A'), KVC__META_BYTES);
    for (i = 0; i < 6; ++i) kvc__w_u32(w, (uint32_t)m[i]);
    kvc__w_end(w);
}

static void kvc__w_tokens(kvc__wr *w, const int32_t *tokens, int32_t n) {
    int32_t i;
    kvc__w_section(w, KVC__TAG('T', 'O', 'K', 'S'), 4 * (uint64_t)n);
    for (i = 0; i < n; ++i) kvc__w_u32(w, (uint32_t)tokens[i]);
    kvc__w_end(w);
}

/* The cells a save writes: n runs of consecutive cells, each one page's [c0, c1). */
typedef struct kvc__cellset {
    const kvc_cache *c;
    int32_t n_cells;
    int32_t seq;      /* CAUSAL sequence save: only its cells; -1: every used cell */
    const uint32_t *ids; /* CKDT: the checkpoints' own pages, page ids[j]'s cells [0, cells[j]) */
    const int32_t *cells;
    int32_t n_ids;
} kvc__cellset;

/* Visit the saved cells in order: FULL/ROTATING the held pages' tokens below offset,
   CAUSAL the used cells (of one sequence). */
static int kvc__cell_next(const kvc__cellset *s, int32_t *i, uint32_t *page, int32_t *slot) {
    const kvc_cache *c = s->c;
    int32_t pc = c->pool->page_cells;
    while (s->ids != NULL) { /* *i = index in ids * pc + slot */
        int32_t j = *i / pc, sl = *i % pc;
        if (j >= s->n_ids) return 0;
        if (sl < s->cells[j]) {
            *page = s->ids[j];
            *slot = sl;
            (*i)++;
            return 1;
        }
        *i = (j + 1) * pc;
    }
    if (c->cfg.kind == KVC_KIND_RECURRENT) { /* *i = sequence: the states there are */
        for (; *i < c->cfg.max_seqs; ++*i)
            if (c->state_page[*i] != KVC__NO_PAGE) {
                *page = c->state_page[*i];
                *slot = 0;
                (*i)++;
                return 1;
            }
        return 0;
    }
    if (c->cfg.kind != KVC_KIND_CAUSAL) { /* *i = page-table index * pc + slot */
        for (;;) {
            int32_t idx = *i / pc, sl = *i % pc;
            if (idx >= c->n_pages) return 0;
            if ((int64_t)kvc__entry_lpage(c, idx) * pc + sl < c->offset) {
                *page = c->pages[idx];
                *slot = sl;
                (*i)++;
                return 1;
            }
            *i = (idx + 1) * pc;
        }
    }
    for (; *i < c->capacity; ++*i) {
        int used = s->seq >= 0 ? kvc__cell_has(c, *i, s->seq) : !kvc__cell_empty(c, *i);
        if (used) {
            *page = c->pages[*i / pc];
            *slot = *i % pc;
            (*i)++;
            return 1;
        }
    }
    return 0;
}

static int32_t kvc__cell_count(const kvc__cellset *s) {
    int32_t i = 0, n = 0, slot;
    uint32_t page;
    while (kvc__cell_next(s, &i, &page, &slot)) n++;
    return n;
}

/* CELL: per cell its position; a CAUSAL cache also its index and sequence set words. */
static void kvc__w_cells(kvc__wr *w, const kvc__cellset *s, int with_seqs) {
    const kvc_cache *c = s->c;
    int32_t i = 0, slot, k;
    uint32_t page;
    uint64_t per = with_seqs ? 8 + 4 * (uint64_t)c->words : 4;
    if (c->cfg.kind == KVC_KIND_RECURRENT) { /* a state: its sequence and the tokens it consumed */
        kvc__w_section(w, KVC__TAG('C', 'E', 'L', 'L'), 8 * (uint64_t)s->n_cells);
        while (kvc__cell_next(s, &i, &page, &slot)) {
            kvc__w_u32(w, (uint32_t)(i - 1));
            kvc__w_u32(w, (uint32_t)c->state_off[i - 1]);
        }
        kvc__w_end(w);
        return;
    }
    kvc__w_section(w, KVC__TAG('C', 'E', 'L', 'L'), per * (uint64_t)s->n_cells);
    while (kvc__cell_next(s, &i, &page, &slot)) {
        if (with_seqs) kvc__w_u32(w, (uint32_t)(i - 1));
        kvc__w_u32(w, (uint32_t)*kvc__pos_at(c->pool, page, slot));
        if (with_seqs)
            for (k = 0; k < c->words; ++k) kvc__w_u32(w, c->seqs[(size_t)(i - 1) * c->words + k]);
    }
    kvc__w_end(w);
}

/* Pages per chunk of a pool with external data, and the chunk's bytes (K or V). */
static int32_t kvc__io_chunk_pages(const kvc_pool *p, size_t *bytes) {
    size_t page = (size_t)p->page_cells * KVC__MAX(p->k_row, p->v_row);
    int32_t n = (int32_t)KVC__MIN((size_t)p->max_pages, KVC__MAX((size_t)1, KVCACHE_IO_CHUNK / page));
    *bytes = page * (size_t)n;
    return n;
}

/* A chunk of a save's cells for read_pages: layer l's K (kv 0) or V, the cells between
   cursors start and end (kvc__cell_next's), on pages ids[0 .. n). */
typedef struct kvc__io_chunk {
    int32_t l, kv, start, end, n;
} kvc__io_chunk;

/* The chunk after *k into *out (its pages into ids, max_ids at most): the next cells of the
   same layer and side, else the first of the next side or layer. 0 when there is none. */
static int kvc__io_chunk_after(const kvc__cellset *s, const kvc__io_chunk *k, kvc__io_chunk *out, uint32_t *ids,
                               int32_t max_ids) {
    int32_t j, slot;
    uint32_t page;
    *out = *k;
    out->start = k->end;
    for (;;) {
        out->n = 0;
        for (j = out->end = out->start; kvc__cell_next(s, &j, &page, &slot); out->end = j)
            if (out->n == 0 || ids[out->n - 1] != page) {
                if (out->n == max_ids) break;
                ids[out->n++] = page;
            }
        if (out->n > 0) return 1;
        if (++out->kv == 2) {
            out->kv = 0;
            if (++out->l == s->c->pool->cfg.n_layers) return 0;
        }
        out->start = 0;
    }
}

/* KVDT of a pool with external data: for each layer's K, then V, the pages of up to a
   chunk's worth of the cells come from read_pages into one buffer, then their rows are
   written as the host path writes them. The next chunk is announced (prefetch_pages)
   before the current one is read, so a backend can move it while the host writes this
   one; flush ends the run. */
static void kvc__w_kv_external(kvc__wr *w, const kvc__cellset *s) {
    const kvc_pool *p = s->c->pool;
    const kvc_page_hooks *h = &p->cfg.hooks;
    size_t bytes;
    int32_t max_ids = kvc__io_chunk_pages(p, &bytes), j, k, slot, run_k = 0, run_slot = 0, run_n = 0, b = 0;
    uint32_t *ids = (uint32_t *)kvc__alloc((kvc_pool *)(uintptr_t)p, 2 * sizeof(uint32_t) * (size_t)max_ids + bytes), page;
    unsigned char *buf;
    kvc__io_chunk cur, next;
    kvc_result e = KVC_OK;
    int have;
    if (ids == NULL) { w->dev = KVC_ERR_NO_MEMORY; w->failed = 1; return; }
    buf = (unsigned char *)(ids + 2 * max_ids); /* only past the check: no arithmetic on NULL */
    memset(&cur, 0, sizeof(cur));
    have = kvc__io_chunk_after(s, &cur, &cur, ids, max_ids);
    if (have && h->prefetch_pages != NULL) e = h->prefetch_pages(h->user, cur.l, cur.kv, ids, cur.n);
    while (have && e == KVC_OK && !w->failed) {
        uint32_t *cur_ids = ids + (size_t)b * (size_t)max_ids;
        size_t row = cur.kv ? p->v_row : p->k_row, pbytes = row * (size_t)p->page_cells;
        int more = kvc__io_chunk_after(s, &cur, &next, ids + (size_t)(1 - b) * (size_t)max_ids, max_ids);
        if (more && h->prefetch_pages != NULL &&
            (e = h->prefetch_pages(h->user, next.l, next.kv, ids + (size_t)(1 - b) * (size_t)max_ids, next.n)) != KVC_OK)
            break;
        if ((e = h->read_pages(h->user, cur.l, cur.kv, cur_ids, cur.n, buf)) != KVC_OK) break;
        for (j = cur.start, k = -1; j < cur.end && kvc__cell_next(s, &j, &page, &slot);) { /* its cells again */
            if (k < 0 || cur_ids[k] != page) k++;
            if (run_n > 0 && (k != run_k || slot != run_slot + run_n)) {
                kvc__w_bytes(w, buf + (size_t)run_k * pbytes + (size_t)run_slot * row, (size_t)run_n * row);
                run_n = 0;
            }
            if (run_n == 0) { run_k = k; run_slot = slot; }
            run_n++;
        }
        if (run_n > 0) kvc__w_bytes(w, buf + (size_t)run_k * pbytes + (size_t)run_slot * row, (size_t)run_n * row);
        run_n = 0;
        cur = next;
        b = 1 - b;
        have = more;
    }
    if (h->flush != NULL) { /* also after a failure: nothing of the save stays in flight */
        kvc_result f = h->flush(h->user);
        if (e == KVC_OK) e = f;
    }
    if (e != KVC_OK && !w->failed) {
        w->dev = e;
        w->failed = 1;
    }
    kvc__free((kvc_pool *)(uintptr_t)p, ids);
}

/* KVDT (or CKDT): layer by layer, the K rows of the cells then their V rows, runs of
   one page at a time. */
static void kvc__w_kv(kvc__wr *w, const kvc__cellset *s, uint32_t tag) {
    const kvc_pool *p = s->c->pool;
    int32_t l, kv, i, slot, run_slot = 0, run_n = 0;
    uint32_t page, run_page = 0;
    kvc__w_section(w, tag, (uint64_t)p->cfg.n_layers * (uint64_t)s->n_cells * (p->k_row + p->v_row));
    if (p->external) {
        kvc__w_kv_external(w, s);
        kvc__w_end(w);
        return;
    }
    for (l = 0; l < p->cfg.n_layers; ++l)
        for (kv = 0; kv < 2; ++kv) {
            size_t row = kv ? p->v_row : p->k_row;
            i = 0;
            run_n = 0;
            for (;;) {
                int more = kvc__cell_next(s, &i, &page, &slot);
                if (run_n > 0 && (!more || page != run_page || slot != run_slot + run_n)) {
                    const unsigned char *src = kv ? kvc__v_at(p, l, run_page, run_slot) : kvc__k_at(p, l, run_page, run_slot);
                    kvc__w_bytes(w, src, (size_t)run_n * row);
                    run_n = 0;
                }
                if (!more) break;
                if (run_n == 0) { run_page = page; run_slot = slot; }
                run_n++;
            }
        }
    kvc__w_end(w);
}

/* ---- checkpoints (ROTATING, RECURRENT) ----
   CKPT lists the checkpoints and the pages they hold that the saved cache does not (each
   once, however many checkpoints share it); CKDT holds those pages' cells. A page a
   checkpoint holds is named by its index among the saved pages: the KVDT pages (in
   their order there), then CKPT's own. */

/* Page idx of a page list that ends at `to` tokens (a ROTATING cache's or checkpoint's:
   sink pages, then window pages from logical page first): its logical page. A
   RECURRENT cache's state is one page, logical page 0. */
static int32_t kvc__list_lpage(const kvc_cache *c, int32_t idx, int32_t to, int32_t first) {
    int32_t pc = c->pool->page_cells, sink_end = KVC__MIN(c->n_sink_pages, to > 0 ? (to - 1) / pc + 1 : 0);
    return idx < sink_end ? idx : first + (idx - sink_end);
}
/* The cells of logical page lp below `to` (a state: its one cell). */
static int32_t kvc__list_cells(const kvc_cache *c, int32_t lp, int32_t to) {
    int64_t pc = c->pool->page_cells;
    if (kvc__is_recurrent(c)) return 1;
    return (int32_t)KVC__MAX(0, KVC__MIN(pc, (int64_t)to - (int64_t)lp * pc));
}

/* A save's view of the cache's checkpoints: which saved page each page id is. */
typedef struct kvc__ckmap {
    uint32_t *ref;        /* [max_pages] page id -> 1 + its saved index; 0: not saved yet */
    uint32_t *extra;      /* [max_pages] the checkpoints' own pages, by id */
    int32_t *extra_lp, *extra_cells; /* [max_pages] their logical page and cells saved */
    int32_t n_live, n_extra;
    uint64_t extra_cells_sum, bytes; /* CKPT's payload bytes */
} kvc__ckmap;

static kvc_result kvc__ckmap_build(const kvc_cache *c, kvc__ckmap *m) {
    kvc_pool *p = c->pool;
    size_t n = (size_t)p->max_pages;
    int32_t i, k, s;
    memset(m, 0, sizeof(*m));
    m->ref = (uint32_t *)kvc__alloc(p, 4 * sizeof(uint32_t) * KVC__MAX(n, 1));
    if (m->ref == NULL) return KVC_ERR_NO_MEMORY;
    memset(m->ref, 0, sizeof(uint32_t) * n);
    m->extra = m->ref + n;
    m->extra_lp = (int32_t *)(void *)(m->extra + n);
    m->extra_cells = m->extra_lp + n;
    if (kvc__is_recurrent(c)) { /* KVDT's states, sequences ascending */
        for (s = 0; s < c->cfg.max_seqs; ++s)
            if (c->state_page[s] != KVC__NO_PAGE) m->ref[c->state_page[s]] = (uint32_t)++m->n_live;
    } else {
        for (i = 0; i < c->n_pages; ++i) m->ref[c->pages[i]] = (uint32_t)++m->n_live;
    }
    m->bytes = 8;
    for (k = 0; k < c->n_ckpt; ++k) {
        const kvc_snapshot *ck = c->ckpt[k];
        m->bytes += 20 + 4 * (uint64_t)ck->n_pages;
        for (i = 0; i < ck->n_pages; ++i) {
            int32_t lp = kvc__list_lpage(c, i, ck->to, ck->first_lpage), need = kvc__list_cells(c, lp, ck->to);
            uint32_t id = ck->pages[i], e;
            if (m->ref[id] == 0) {
                e = (uint32_t)m->n_extra++;
                m->ref[id] = (uint32_t)m->n_live + e + 1;
                m->extra[e] = id;
                m->extra_lp[e] = lp;
                m->extra_cells[e] = 0;
                m->bytes += 8;
            }
            e = m->ref[id] - 1;
            if (e >= (uint32_t)m->n_live) {
                e -= (uint32_t)m->n_live;
                m->extra_cells_sum += (uint64_t)KVC__MAX(0, need - m->extra_cells[e]);
                m->extra_cells[e] = KVC__MAX(m->extra_cells[e], need);
            }
        }
    }
    return KVC_OK;
}

/* CKPT: u32 n_ckpt, u32 n_extra; per extra page i32 logical page, i32 cells; per
   checkpoint (oldest first) i32 to, i32 first_lpage, i32 batch_begin, u32 flags,
   i32 n_pages and n_pages u32 saved-page indices. Then CKDT: the extra pages' cells. */
static void kvc__w_ckpts(kvc__wr *w, const kvc_cache *c) {
    kvc__ckmap m;
    kvc__cellset set;
    kvc_result e;
    int32_t i, k;
    if ((e = kvc__ckmap_build(c, &m)) != KVC_OK) { w->dev = e; w->failed = 1; return; }
    kvc__w_section(w, KVC__TAG('C', 'K', 'P', 'T'), m.bytes);
    kvc__w_u32(w, (uint32_t)c->n_ckpt);
    kvc__w_u32(w, (uint32_t)m.n_extra);
    for (i = 0; i < m.n_extra; ++i) {
        kvc__w_u32(w, (uint32_t)m.extra_lp[i]);
        kvc__w_u32(w, (uint32_t)m.extra_cells[i]);
    }
    for (k = 0; k < c->n_ckpt; ++k) {
        const kvc_snapshot *ck = c->ckpt[k];
        kvc__w_u32(w, (uint32_t)ck->to);
        kvc__w_u32(w, (uint32_t)ck->first_lpage);
        kvc__w_u32(w, (uint32_t)ck->batch_begin);
        kvc__w_u32(w, (uint32_t)ck->ckflags);
        kvc__w_u32(w, (uint32_t)ck->n_pages);
        for (i = 0; i < ck->n_pages; ++i) kvc__w_u32(w, m.ref[ck->pages[i]] - 1);
    }
    kvc__w_end(w);
    memset(&set, 0, sizeof(set));
    set.c = c;
    set.ids = m.extra;
    set.cells = m.extra_cells;
    set.n_ids = m.n_extra;
    set.n_cells = (int32_t)m.extra_cells_sum;
    kvc__w_kv(w, &set, KVC__TAG('C', 'K', 'D', 'T'));
    kvc__free(c->pool, m.ref);
}

/* Every save ends here: finish the io, turn its failure into KVC_ERR_IO. */
static kvc_result kvc__io_end(const kvc_io *io, kvc_result r) {
    if (io->finish != NULL && io->finish(io->user, r == KVC_OK) != 0 && r == KVC_OK) r = KVC_ERR_IO;
    return r;
}

/* Whether saves and loads can reach the pool's K/V bytes (a device backend's through
   its hooks). */
static int kvc__persistable(const kvc_pool *p) {
    return !p->external || (p->cfg.hooks.read_pages != NULL && p->cfg.hooks.write_pages != NULL);
}

static kvc_result kvc__check_io(const kvc_io *io, int writing) {
    if (writing ? io->write == NULL : io->read == NULL) return KVC_ERR_NULL;
    return kvc__little_endian() ? KVC_OK : KVC_ERR_UNSUPPORTED;
}

/* TAIL: the f16_tail rows of tokens [lo, hi): u32 lo, u32 hi, then layer by layer the K
   rows of those tokens, then their V rows (in the tail's types). */
static void kvc__w_tail(kvc__wr *w, const kvc_cache *c, int32_t lo, int32_t hi) {
    int32_t l, t;
    size_t n = (size_t)(hi - lo);
    kvc__w_section(w, KVC__TAG('T', 'A', 'I', 'L'), 8 + (uint64_t)c->pool->cfg.n_layers * n * (c->tail_krow + c->tail_vrow));
    kvc__w_u32(w, (uint32_t)lo);
    kvc__w_u32(w, (uint32_t)hi);
    for (l = 0; l < c->pool->cfg.n_layers; ++l) {
        for (t = lo; t < hi; ++t) kvc__w_bytes(w, kvc__tail_k(c, l) + (size_t)(t % c->cfg.f16_tail) * c->tail_krow, c->tail_krow);
        for (t = lo; t < hi; ++t) kvc__w_bytes(w, kvc__tail_v(c, l) + (size_t)(t % c->cfg.f16_tail) * c->tail_vrow, c->tail_vrow);
    }
    kvc__w_end(w);
}

static kvc_result kvc__save(const kvc_cache *c, uint32_t what, int32_t seq, kvc_namespace ns, const int32_t *tokens,
                            int32_t n_tokens, const kvc_io *io) {
    kvc__wr w;
    kvc__cellset set;
    int32_t meta[6] = {0, 0, 0, 0, 0, 0};
    uint32_t flags = 0;
    if (!kvc__persistable(c->pool)) return KVC_ERR_UNSUPPORTED; /* device bytes it cannot reach */
    if (what == KVC__WHAT_CACHE && kvc__has_ckpts(c)) {
        kvc__settle((kvc_cache *)(uintptr_t)c); /* the ended batch's checkpoints: no visible change */
        if (c->n_ckpt > 0) flags = KVC__CONF_CKPT;
    }
    if (what == KVC__WHAT_CACHE && c->tail != NULL && KVC__MIN(c->tail_hi, c->offset) > c->tail_lo)
        flags |= KVC__CONF_TAIL; /* the f16 rows attention reads for the newest tokens */
    memset(&set, 0, sizeof(set));
    set.c = c;
    set.seq = seq;
    set.n_cells = kvc__cell_count(&set);
    meta[0] = n_tokens;
    meta[1] = set.n_cells;
    if (c->cfg.kind == KVC_KIND_RECURRENT) {
        meta[2] = c->offset;
    } else if (c->cfg.kind != KVC_KIND_CAUSAL) {
        meta[2] = c->offset;
        meta[3] = c->batch_begin;
        meta[4] = c->first_lpage;
        meta[5] = c->n_pages;
    } else if (what == KVC__WHAT_CACHE) {
        meta[2] = c->words;
    }
    memset(&w, 0, sizeof(w));
    w.io = io;
    kvc__w_head(&w, c, what, ns, flags);
    kvc__w_meta(&w, meta);
    kvc__w_tokens(&w, tokens, n_tokens);
    kvc__w_cells(&w, &set, c->cfg.kind == KVC_KIND_CAUSAL && what == KVC__WHAT_CACHE);
    kvc__w_kv(&w, &set, KVC__TAG('K', 'V', 'D', 'T'));
    if (flags & KVC__CONF_CKPT) kvc__w_ckpts(&w, c);
    if (flags & KVC__CONF_TAIL) kvc__w_tail(&w, c, c->tail_lo, KVC__MIN(c->tail_hi, c->offset));
    if (w.dev != KVC_OK) return w.dev;
    return w.failed ? KVC_ERR_IO : KVC_OK;
}

KVCDEF kvc_result kvc_cache_save(const kvc_cache *c, kvc_namespace ns, const int32_t *tokens, int32_t n_tokens,
                                 const kvc_io *io) {
    kvc_result r;
    if (io == NULL) return KVC_ERR_NULL;
    if (c == NULL) r = KVC_ERR_NULL;
    else if ((r = kvc__check_io(io, 1)) != KVC_OK || (r = kvc__check_tokens(tokens, n_tokens, 0)) != KVC_OK) {}
    else if (kvc__batch_open(c)) r = KVC_ERR_STATE;
    else r = kvc__save(c, KVC__WHAT_CACHE, -1, ns, tokens, n_tokens, io);
    return kvc__io_end(io, r);
}

KVCDEF kvc_result kvc_seq_save(const kvc_cache *c, int32_t seq, kvc_namespace ns, const int32_t *tokens,
                               int32_t n_tokens, const kvc_io *io) {
    kvc_result r;
    if (io == NULL) return KVC_ERR_NULL;
    if (c == NULL) r = KVC_ERR_NULL;
    else if ((r = kvc__check_io(io, 1)) != KVC_OK || (r = kvc__check_tokens(tokens, n_tokens, 0)) != KVC_OK ||
             (r = kvc__check_seq(c, seq)) != KVC_OK) {}
    else if (kvc__batch_open(c)) r = KVC_ERR_STATE;
    else if (!kvc__seq_known(c, seq)) r = KVC_ERR_NOT_FOUND;
    else r = kvc__save(c, KVC__WHAT_SEQ, seq, ns, tokens, n_tokens, io);
    return kvc__io_end(io, r);
}

/* ---- reading ---- */

typedef struct kvc__rd {
    const kvc_io *io;
    kvc__xxh h;
    uint64_t left;      /* payload bytes of the current section not read yet */
    kvc_result err;     /* the first error; every later read is a no-op */
} kvc__rd;

static void kvc__r_fail(kvc__rd *r, kvc_result e) { if (r->err == KVC_OK) r->err = e; }

static void kvc__r_raw(kvc__rd *r, void *dst, size_t n) {
    if (r->err != KVC_OK || n == 0) return;
    if (r->io->read(r->io->user, dst, n) != n) kvc__r_fail(r, KVC_ERR_TRUNCATED);
}

/* Payload bytes of the current section, hashed. */
static void kvc__r_bytes(kvc__rd *r, void *dst, size_t n) {
    if (r->err != KVC_OK) return;
    if (n > r->left) { kvc__r_fail(r, KVC_ERR_CORRUPT); return; }
    kvc__r_raw(r, dst, n);
    kvc__xxh_update(&r->h, dst, n);
    r->left -= n;
}
static uint32_t kvc__r_u32(kvc__rd *r) {
    unsigned char b[4] = {0, 0, 0, 0};
    kvc__r_bytes(r, b, 4);
    return kvc__le32(b);
}

/* A section header: its tag and length must be what this object needs. */
static void kvc__r_section(kvc__rd *r, uint32_t tag, uint64_t length) {
    unsigned char b[16];
    memset(b, 0, sizeof(b));
    kvc__r_raw(r, b, 16);
    if (r->err != KVC_OK) return;
    kvc__xxh_init(&r->h);
    kvc__xxh_update(&r->h, b, 16);
    if (kvc__le32(b) != tag || kvc__le32(b + 4) != 0 || kvc__le64(b + 8) != length) kvc__r_fail(r, KVC_ERR_CORRUPT);
    r->left = length;
}
static void kvc__r_end(kvc__rd *r) {
    unsigned char b[8];
    memset(b, 0, sizeof(b));
    if (r->err == KVC_OK && r->left != 0) kvc__r_fail(r, KVC_ERR_CORRUPT);
    kvc__r_raw(r, b, 8);
    if (r->err == KVC_OK && kvc__le64(b) != kvc__xxh_digest(&r->h)) kvc__r_fail(r, KVC_ERR_CORRUPT);
}

/* What a load learns before it reads data. */
typedef struct kvc__saved {
    uint32_t what;
    int32_t shape[7];          /* layers, kv heads, head dims, types, page cells */
    kvc_cache_config cc;       /* kind, window, sinks, capacity, max_seqs, chunk, padding */
    kvc_namespace ns;
    int32_t meta[6];           /* n_tokens, n_cells, then per kind (see kvc__save) */
    uint32_t flags;            /* CONF word 15: KVC__CONF_CKPT, KVC__CONF_TAIL */
} kvc__saved;

/* Header, CONF and META, checked against the pool, the expected object and namespace. */
static void kvc__r_head(kvc__rd *r, const kvc_pool *p, uint32_t what, kvc_namespace ns, kvc__saved *s) {
    unsigned char b[16];
    uint32_t f[16];
    int32_t i;
    memset(b, 0, sizeof(b));
    kvc__r_raw(r, b, 16);
    if (r->err != KVC_OK) return;
    if (memcmp(b, kvc__magic, 8) != 0 || kvc__le32(b + 8) != KVC__FORMAT_VERSION) { kvc__r_fail(r, KVC_ERR_FORMAT); return; }
    s->what = kvc__le32(b + 12);
    if (s->what < KVC__WHAT_CACHE || s->what > KVC__WHAT_MEMORY_ENTRY) { kvc__r_fail(r, KVC_ERR_FORMAT); return; }
    if (s->what > KVC__WHAT_ENTRY) { kvc__r_fail(r, KVC_ERR_MISMATCH); return; } /* a memory's */
    kvc__r_section(r, KVC__TAG('C', 'O', 'N', 'F'), KVC__CONF_BYTES);
    for (i = 0; i < 16; ++i) f[i] = kvc__r_u32(r);
    kvc__r_bytes(r, b, 16);
    kvc__r_end(r);
    if (r->err != KVC_OK) return;
    for (i = 0; i < 7; ++i) s->shape[i] = (int32_t)f[i];
    s->cc.kind = (kvc_kind)f[7];
    s->cc.window = (int32_t)f[8];
    s->cc.sinks = (int32_t)f[9];
    s->cc.capacity = (int32_t)f[10];
    s->cc.max_seqs = (int32_t)f[11];
    s->cc.chunk = (int32_t)f[12];
    s->cc.padding = (int32_t)f[13];
    s->ns.model = kvc__le64(b);
    s->ns.salt = kvc__le64(b + 8);
    s->flags = f[15];
    if (s->flags & ~(KVC__CONF_CKPT | KVC__CONF_TAIL)) { kvc__r_fail(r, KVC_ERR_FORMAT); return; } /* a later format's */
    if (s->shape[0] != p->cfg.n_layers || s->shape[1] != p->cfg.n_kv_heads || s->shape[2] != p->cfg.head_dim_k ||
        s->shape[3] != p->cfg.head_dim_v || s->shape[4] != (int32_t)p->cfg.type_k ||
        s->shape[5] != (int32_t)p->cfg.type_v || s->shape[6] != p->page_cells || !kvc__ns_equal(s->ns, ns) ||
        s->what != what) {
        kvc__r_fail(r, KVC_ERR_MISMATCH);
        return;
    }
    if (f[14] != p->cfg.rotate) { kvc__r_fail(r, KVC_ERR_ROTATION); return; } /* stored rows differ */
    if ((s->flags & KVC__CONF_CKPT) && (s->what != KVC__WHAT_CACHE || (s->cc.kind != KVC_KIND_ROTATING &&
                                                                      s->cc.kind != KVC_KIND_RECURRENT))) {
        kvc__r_fail(r, KVC_ERR_CORRUPT); /* only these have checkpoints */
        return;
    }
    if ((s->flags & KVC__CONF_TAIL) && (s->what != KVC__WHAT_CACHE || (s->cc.kind != KVC_KIND_FULL &&
                                                                      s->cc.kind != KVC_KIND_ROTATING) ||
                                        (!kvc__type_quantized(p->cfg.type_k) && !kvc__type_quantized(p->cfg.type_v)))) {
        kvc__r_fail(r, KVC_ERR_CORRUPT); /* only these have an f16_tail */
        return;
    }
    kvc__r_section(r, KVC__TAG('M', 'E', 'T', 'A'), KVC__META_BYTES);
    for (i = 0; i < 6; ++i) s->meta[i] = (int32_t)kvc__r_u32(r);
    kvc__r_end(r);
    if (r->err == KVC_OK && (s->meta[0] < 0 || s->meta[1] < 0)) kvc__r_fail(r, KVC_ERR_CORRUPT);
}

/* TOKS: n tokens into a block of the pool's (*dst, which the caller frees; dst == NULL:
   read and check only). The block grows by doubling as tokens arrive, so what a load
   asks for is bounded by what the input holds, never by the count it declares. The
   caller's own array is written only once the whole load has succeeded. */
static void kvc__r_tokens(kvc__rd *r, kvc_pool *p, int32_t **dst, int32_t n) {
    int32_t i, cap = 0;
    if (dst != NULL) *dst = NULL;
    kvc__r_section(r, KVC__TAG('T', 'O', 'K', 'S'), 4 * (uint64_t)n);
    for (i = 0; i < n && r->err == KVC_OK; ++i) {
        uint32_t t = kvc__r_u32(r);
        if (dst == NULL || r->err != KVC_OK) continue;
        if (i == cap) {
            int32_t grown = cap == 0 ? KVC__MIN(n, 1024) : (int32_t)KVC__MIN((int64_t)n, 2 * (int64_t)cap);
            int32_t *b = (int32_t *)kvc__alloc(p, sizeof(int32_t) * (size_t)grown);
            if (b == NULL) { kvc__r_fail(r, KVC_ERR_NO_MEMORY); break; }
            if (i > 0) memcpy(b, *dst, sizeof(int32_t) * (size_t)i);
            kvc__free(p, *dst);
            *dst = b;
            cap = grown;
        }
        (*dst)[i] = (int32_t)t;
    }
    kvc__r_end(r);
    if (r->err != KVC_OK && dst != NULL) { kvc__free(p, *dst); *dst = NULL; }
}

/* Fresh pages for n cells, packed from slot 0 (the load's staging area): pages free
   under the budget now. A load never evicts prefix-tree entries: it can tell that its
   input is sound only after reading it into these pages, and a failed load must leave
   the trees as they were (KVC_ERR_FULL; kvc_radix_evict makes room). */
static kvc_result kvc__stage_pages(kvc_pool *p, int32_t n_cells, uint32_t **pages, int32_t *n_pages) {
    int32_t n = (int32_t)(((int64_t)n_cells + p->page_cells - 1) / p->page_cells), i;
    *pages = NULL;
    *n_pages = n;
    if (n > kvc__pages_free(p)) return KVC_ERR_FULL;
    *pages = (uint32_t *)kvc__alloc(p, sizeof(uint32_t) * (size_t)KVC__MAX(n, 1));
    if (*pages == NULL) return KVC_ERR_NO_MEMORY;
    for (i = 0; i < n; ++i) (*pages)[i] = kvc__page_acquire(p);
    return KVC_OK;
}
static void kvc__unstage_pages(kvc_pool *p, uint32_t *pages, int32_t n) {
    int32_t i;
    if (pages == NULL) return;
    for (i = 0; i < n; ++i) kvc__page_release(p, pages[i]);
    kvc__free(p, pages);
}

/* The cells read into page j: cells[j], or (cells == NULL) packed n_cells from page 0. */
static int32_t kvc__rows_of(const kvc_pool *p, const int32_t *cells, int32_t n_cells, int32_t j) {
    return cells != NULL ? cells[j] : (int32_t)KVC__MIN((int64_t)p->page_cells, (int64_t)n_cells - (int64_t)j * p->page_cells);
}

/* Rows into pages of a pool with external data: up to a chunk of pages at a time read
   into one buffer (the rest of each page zero), then handed to write_pages (which may
   return before the bytes land: flush ends the run). The pages are fresh ones of the
   load: a failing checksum later leaves nothing behind. */
static void kvc__r_rows_external(kvc__rd *r, kvc_pool *p, const uint32_t *pages, const int32_t *cells,
                                 int32_t n_pages, int32_t n_cells) {
    size_t bytes;
    int32_t max_ids = kvc__io_chunk_pages(p, &bytes), l, kv, j0, j;
    unsigned char *buf = (unsigned char *)kvc__alloc(p, bytes);
    if (buf == NULL) { kvc__r_fail(r, KVC_ERR_NO_MEMORY); return; }
    for (l = 0; l < p->cfg.n_layers; ++l)
        for (kv = 0; kv < 2; ++kv)
            for (j0 = 0; j0 < n_pages && r->err == KVC_OK; j0 += max_ids) {
                size_t row = kv ? p->v_row : p->k_row, pbytes = row * (size_t)p->page_cells, got;
                int32_t n = KVC__MIN(max_ids, n_pages - j0);
                kvc_result e;
                for (j = 0; j < n; ++j) {
                    got = (size_t)kvc__rows_of(p, cells, n_cells, j0 + j) * row;
                    kvc__r_bytes(r, buf + (size_t)j * pbytes, got);
                    memset(buf + (size_t)j * pbytes + got, 0, pbytes - got);
                }
                if (r->err == KVC_OK && (e = p->cfg.hooks.write_pages(p->cfg.hooks.user, l, kv, pages + j0, n, buf)) != KVC_OK)
                    kvc__r_fail(r, e);
            }
    if (p->cfg.hooks.flush != NULL) { /* the writes still in flight land (or fail the load) */
        kvc_result e = p->cfg.hooks.flush(p->cfg.hooks.user);
        if (e != KVC_OK && r->err == KVC_OK) kvc__r_fail(r, e);
    }
    kvc__free(p, buf);
}

/* KVDT (or CKDT) into pages: page j gets the rows of kvc__rows_of(j) cells from slot 0. */
static void kvc__r_rows(kvc__rd *r, kvc_pool *p, uint32_t tag, const uint32_t *pages, const int32_t *cells,
                        int32_t n_pages, int32_t n_cells) {
    int32_t l, kv, j;
    kvc__r_section(r, tag, (uint64_t)p->cfg.n_layers * (uint64_t)n_cells * (p->k_row + p->v_row));
    if (r->err != KVC_OK) return;
    if (p->external) {
        kvc__r_rows_external(r, p, pages, cells, n_pages, n_cells);
    } else {
        for (l = 0; l < p->cfg.n_layers; ++l)
            for (kv = 0; kv < 2; ++kv)
                for (j = 0; j < n_pages; ++j) {
                    unsigned char *dst = kv ? kvc__v_at(p, l, pages[j], 0) : kvc__k_at(p, l, pages[j], 0);
                    kvc__r_bytes(r, dst, (size_t)kvc__rows_of(p, cells, n_cells, j) * (kv ? p->v_row : p->k_row));
                }
    }
    kvc__r_end(r);
}

/* KVDT into the staged pages: cell i at page i / pc, slot i % pc. */
static void kvc__r_kv(kvc__rd *r, kvc_pool *p, const uint32_t *pages, int32_t n_cells) {
    int32_t n_pages = (int32_t)(((int64_t)n_cells + p->page_cells - 1) / p->page_cells);
    kvc__r_rows(r, p, KVC__TAG('K', 'V', 'D', 'T'), pages, NULL, n_pages, n_cells);
}

/* FULL/ROTATING: is (offset, batch_begin, first_lpage, n_pages, n_cells) a state the
   cache kind can be in, with every cell its view reads held? */
static int kvc__linear_state_ok(const kvc_cache *c, const int32_t *m) {
    int32_t pc = c->pool->page_cells, off = m[2], bb = m[3], first = m[4], np = m[5], n_cells = m[1];
    int32_t nsp = c->n_sink_pages, last = off > 0 ? (off - 1) / pc : -1, sink_end, cells = 0, idx;
    if (off < 0 || bb < 0 || bb > off || first < nsp || np < 0 || np > c->pool->max_pages) return 0;
    if (c->cfg.kind == KVC_KIND_FULL && first != 0) return 0;
    sink_end = KVC__MIN(nsp, last + 1);
    if (first > KVC__MAX(last + 1, nsp)) return 0;
    if (np != sink_end + KVC__MAX(0, last - first + 1)) return 0;
    for (idx = 0; idx < np; ++idx) { /* cells below offset of each held page */
        int32_t lp = idx < sink_end ? idx : first + (idx - sink_end);
        cells += (int32_t)KVC__MIN((int64_t)pc, (int64_t)off - (int64_t)lp * pc);
    }
    if (cells != n_cells) return 0;
    if (c->cfg.kind == KVC_KIND_ROTATING) { /* the view [b1, off) after the sinks is held */
        int64_t lo = (int64_t)bb - (c->cfg.window - c->cfg.sinks) + 1, s = KVC__MIN(c->cfg.sinks, off);
        int64_t b1 = KVC__MIN(KVC__MAX(lo, s), (int64_t)off);
        if (b1 < off && KVC__MAX(b1 / pc, (int64_t)sink_end) <= KVC__MIN((int64_t)first - 1, (int64_t)last)) return 0;
    }
    return 1;
}

/* CELL of a FULL/ROTATING cache: positions must be the tokens the page table implies. */
static void kvc__r_linear_cells(kvc__rd *r, const kvc_cache *c, const kvc__saved *s, const uint32_t *pages) {
    int32_t pc = c->pool->page_cells, sink_end = KVC__MIN(c->n_sink_pages, s->meta[2] > 0 ? (s->meta[2] - 1) / pc + 1 : 0);
    int32_t idx, k, cell = 0;
    kvc__r_section(r, KVC__TAG('C', 'E', 'L', 'L'), 4 * (uint64_t)s->meta[1]);
    for (idx = 0; idx < s->meta[5] && r->err == KVC_OK; ++idx) {
        int32_t lp = idx < sink_end ? idx : s->meta[4] + (idx - sink_end);
        int32_t n = (int32_t)KVC__MIN((int64_t)pc, (int64_t)s->meta[2] - (int64_t)lp * pc);
        for (k = 0; k < n; ++k, ++cell) {
            int32_t pos = (int32_t)kvc__r_u32(r);
            if (r->err == KVC_OK && pos != lp * pc + k) kvc__r_fail(r, KVC_ERR_CORRUPT);
            *kvc__pos_at(c->pool, pages[cell / pc], cell % pc) = pos;
        }
    }
    kvc__r_end(r);
}

/* Reading CONF..KVDT of a FULL/ROTATING cache or entry into staged pages. */
typedef struct kvc__staged {
    uint32_t *pages;   /* packed cells */
    int32_t n_pages;
    kvc__saved s;
    int32_t *tokens;   /* an entry's tokens (scratch) */
} kvc__staged;

static void kvc__staged_free(kvc_pool *p, kvc__staged *st) {
    kvc__unstage_pages(p, st->pages, st->n_pages);
    if (st->tokens != NULL) kvc__free(p, st->tokens);
    st->pages = NULL;
    st->tokens = NULL;
}

static void kvc__r_linear(kvc__rd *r, const kvc_cache *c, uint32_t what, kvc_namespace ns, kvc__staged *st,
                          int want_tokens, int32_t max_tokens) {
    kvc_pool *p = c->pool;
    kvc_result e;
    kvc__r_head(r, p, what, ns, &st->s);
    if (r->err != KVC_OK) return;
    if (st->s.cc.kind != c->cfg.kind || st->s.cc.window != c->cfg.window || st->s.cc.sinks != c->cfg.sinks) {
        kvc__r_fail(r, KVC_ERR_MISMATCH);
        return;
    }
    if (!kvc__linear_state_ok(c, st->s.meta) || (what == KVC__WHAT_ENTRY && st->s.meta[0] != st->s.meta[2])) {
        kvc__r_fail(r, KVC_ERR_CORRUPT);
        return;
    }
    if (what != KVC__WHAT_ENTRY && want_tokens && st->s.meta[0] > max_tokens) {
        kvc__r_fail(r, KVC_ERR_RANGE);
        return;
    }
    if ((e = kvc__stage_pages(p, st->s.meta[1], &st->pages, &st->n_pages)) != KVC_OK) { kvc__r_fail(r, e); return; }
    /* an entry's tokens are needed to commit it */
    kvc__r_tokens(r, p, what == KVC__WHAT_ENTRY || want_tokens ? &st->tokens : NULL, st->s.meta[0]);
    kvc__r_linear_cells(r, c, &st->s, st->pages);
    kvc__r_kv(r, p, st->pages, st->s.meta[1]);
}

/* Install staged cells as the cache's pages. Every held page but the last is full
   (sink pages, then consecutive window pages), so the packed staging pages line up with
   the page table one to one: the cache takes them over. */
static void kvc__install_linear(kvc_cache *c, kvc__staged *st) {
    const int32_t *m = st->s.meta;
    kvc__lease_drop(c);
    kvc__rewind(c, 0); /* the old pages go */
    KVCACHE_ASSERT(st->n_pages == m[5]);
    memcpy(c->pages, st->pages, sizeof(uint32_t) * (size_t)m[5]);
    c->n_pages = m[5];
    c->first_lpage = m[4];
    c->offset = m[2];
    c->gen++; /* contents added or replaced (kvc_prefix checks) */
    c->batch_begin = m[3];
    c->batch_pending = 0;
    kvc__free(c->pool, st->pages);
    st->pages = NULL;
}

/* ---- checkpoints ---- */

/* The checkpoints a load read: a chain of snapshots (oldest first, holding their pages)
   and the staged pages that only they hold (a reference of the load's each). */
typedef struct kvc__ckload {
    kvc_snapshot *chain;
    uint32_t *pages;
    int32_t n_pages;
} kvc__ckload;

static void kvc__ckload_free(kvc_pool *p, kvc__ckload *ck) {
    kvc__snapshot_release(ck->chain);
    kvc__unstage_pages(p, ck->pages, ck->n_pages);
    memset(ck, 0, sizeof(*ck));
}

/* A section header whose length the reader learns from the section itself (CKPT):
   what the payload holds is checked as it is read, and all of it must be used. */
static void kvc__r_section_any(kvc__rd *r, uint32_t tag) {
    unsigned char b[16];
    memset(b, 0, sizeof(b));
    kvc__r_raw(r, b, 16);
    if (r->err != KVC_OK) return;
    kvc__xxh_init(&r->h);
    kvc__xxh_update(&r->h, b, 16);
    if (kvc__le32(b) != tag || kvc__le32(b + 4) != 0) kvc__r_fail(r, KVC_ERR_CORRUPT);
    r->left = kvc__le64(b + 8);
}

/* A saved page's logical page and cells: live[0 .. n_live) are KVDT's pages (a cache
   of `off` tokens whose window starts at logical page `first`), then the extra ones. */
typedef struct kvc__ckpages {
    int32_t n_live, off, first, n_extra;
    int32_t *lp, *cells;   /* the extra pages' */
} kvc__ckpages;
static void kvc__ck_page_of(const kvc_cache *c, const kvc__ckpages *cp, uint32_t ref, int32_t *lp, int32_t *cells) {
    if (ref >= (uint32_t)cp->n_live) {
        *lp = cp->lp[ref - (uint32_t)cp->n_live];
        *cells = cp->cells[ref - (uint32_t)cp->n_live];
        return;
    }
    *lp = kvc__is_recurrent(c) ? 0 : kvc__list_lpage(c, (int32_t)ref, cp->off, cp->first);
    *cells = kvc__list_cells(c, *lp, cp->off);
}

/* One CKPT record: a checkpoint at `to` (after prev_to, at most the offset) whose pages
   are saved pages of the right logical page holding the cells below `to`. *refs is a
   scratch of max_pages entries. */
static kvc_snapshot *kvc__r_ckpt(kvc__rd *r, const kvc_cache *c, const kvc__ckpages *cp, const uint32_t *staged,
                                 const uint32_t *live, int32_t prev_to, uint32_t *refs) {
    kvc_pool *p = c->pool;
    int32_t to = (int32_t)kvc__r_u32(r), first = (int32_t)kvc__r_u32(r), bb = (int32_t)kvc__r_u32(r);
    int32_t flags = (int32_t)kvc__r_u32(r), np = (int32_t)kvc__r_u32(r), i, pc = p->page_cells;
    int32_t last = to > 0 ? (to - 1) / pc : -1, cells = 0, lp, have, want, need;
    kvc_snapshot *k;
    if (r->err != KVC_OK) return NULL;
    if (to <= prev_to || to > cp->off || flags < 1 || flags > 3 || np < 0 || np > p->max_pages ||
        (kvc__is_recurrent(c) && (np != 1 || first != 0 || bb < 0 || bb > to)) ||
        (!kvc__is_recurrent(c) && (first < 0 || first > KVC__MAX(last + 1, c->n_sink_pages)))) {
        kvc__r_fail(r, KVC_ERR_CORRUPT);
        return NULL;
    }
    for (i = 0; i < np && r->err == KVC_OK; ++i) {
        refs[i] = kvc__r_u32(r);
        if (r->err != KVC_OK) break;
        if (refs[i] >= (uint32_t)(cp->n_live + cp->n_extra)) { kvc__r_fail(r, KVC_ERR_CORRUPT); break; }
        want = kvc__is_recurrent(c) ? 0 : kvc__list_lpage(c, i, to, first);
        need = kvc__list_cells(c, want, to);
        kvc__ck_page_of(c, cp, refs[i], &lp, &have);
        if (lp != want || have < need) kvc__r_fail(r, KVC_ERR_CORRUPT); /* another page, or too few cells */
        cells += need;
    }
    if (r->err != KVC_OK) return NULL;
    if (!kvc__is_recurrent(c)) { /* a window state the cache can be in */
        int32_t m[6];
        m[0] = 0; m[1] = cells; m[2] = to; m[3] = bb; m[4] = first; m[5] = np;
        if (!kvc__linear_state_ok(c, m)) { kvc__r_fail(r, KVC_ERR_CORRUPT); return NULL; }
    }
    if ((k = kvc__snapshot_alloc(p, np, 0)) == NULL) { kvc__r_fail(r, KVC_ERR_NO_MEMORY); return NULL; }
    k->cache_id = c->id;
    k->kind = c->cfg.kind;
    k->window = c->cfg.window;
    k->sinks = c->cfg.sinks;
    k->ckflags = flags;
    k->from = k->to = to;
    k->first_lpage = first;
    k->batch_begin = bb;
    for (i = 0; i < np; ++i) {
        k->pages[i] = refs[i] < (uint32_t)cp->n_live ? live[refs[i]] : staged[refs[i] - (uint32_t)cp->n_live];
        kvc__page_retain(p, k->pages[i]);
    }
    return k;
}

/* CKPT and CKDT (see kvc__w_ckpts) into fresh pages of c's pool, after KVDT was read
   into live[0 .. n_live) for a cache of `off` tokens whose window starts at `first`. */
static void kvc__r_ckpts(kvc__rd *r, const kvc_cache *c, const uint32_t *live, int32_t n_live, int32_t off,
                         int32_t first, kvc__ckload *out) {
    kvc_pool *p = c->pool;
    kvc__ckpages cp;
    kvc_snapshot *tail = NULL;
    uint32_t *refs = NULL;
    int32_t n_ck, i, prev = -1, pc = p->page_cells;
    int64_t sum = 0;
    memset(out, 0, sizeof(*out));
    memset(&cp, 0, sizeof(cp));
    cp.n_live = n_live;
    cp.off = off;
    cp.first = first;
    kvc__r_section_any(r, KVC__TAG('C', 'K', 'P', 'T'));
    n_ck = (int32_t)kvc__r_u32(r);
    cp.n_extra = (int32_t)kvc__r_u32(r);
    if (r->err != KVC_OK) return;
    if (n_ck < 1 || cp.n_extra < 0 || cp.n_extra > p->max_pages) { kvc__r_fail(r, KVC_ERR_CORRUPT); return; }
    if (!kvc__can_reclaim(p, cp.n_extra)) { kvc__r_fail(r, KVC_ERR_FULL); return; }
    refs = (uint32_t *)kvc__alloc(p, sizeof(uint32_t) * (3 * (size_t)KVC__MAX(cp.n_extra, 1) + (size_t)p->max_pages));
    out->pages = (uint32_t *)kvc__alloc(p, sizeof(uint32_t) * (size_t)KVC__MAX(cp.n_extra, 1));
    if (refs == NULL || out->pages == NULL) {
        kvc__free(p, refs);
        kvc__free(p, out->pages);
        out->pages = NULL;
        kvc__r_fail(r, KVC_ERR_NO_MEMORY);
        return;
    }
    cp.lp = (int32_t *)(void *)(refs + p->max_pages);
    cp.cells = cp.lp + KVC__MAX(cp.n_extra, 1);
    kvc__reclaim(p, cp.n_extra); /* unused prefix-tree entries go first, as for any pages */
    for (out->n_pages = 0; out->n_pages < cp.n_extra; ++out->n_pages) out->pages[out->n_pages] = kvc__page_acquire(p);
    for (i = 0; i < cp.n_extra && r->err == KVC_OK; ++i) {
        int32_t k;
        cp.lp[i] = (int32_t)kvc__r_u32(r);
        cp.cells[i] = (int32_t)kvc__r_u32(r);
        if (r->err == KVC_OK && (cp.cells[i] < 1 || cp.cells[i] > pc || cp.lp[i] < 0 ||
                                 (int64_t)cp.lp[i] * pc + cp.cells[i] > INT32_MAX ||
                                 (kvc__is_recurrent(c) && (cp.lp[i] != 0 || cp.cells[i] != 1))))
            kvc__r_fail(r, KVC_ERR_CORRUPT);
        for (k = 0; k < cp.cells[i] && r->err == KVC_OK && !kvc__is_recurrent(c); ++k)
            *kvc__pos_at(p, out->pages[i], k) = cp.lp[i] * pc + k;
        sum += cp.cells[i];
    }
    for (i = 0; i < n_ck && r->err == KVC_OK; ++i) {
        kvc_snapshot *k = kvc__r_ckpt(r, c, &cp, out->pages, live, prev, refs);
        if (k == NULL) break;
        if (tail != NULL) tail->carried = k;
        else out->chain = k;
        tail = k;
        prev = k->to;
    }
    kvc__r_end(r);
    if (r->err == KVC_OK && sum > INT32_MAX) kvc__r_fail(r, KVC_ERR_CORRUPT);
    if (r->err == KVC_OK) kvc__r_rows(r, p, KVC__TAG('C', 'K', 'D', 'T'), out->pages, cp.cells, cp.n_extra, (int32_t)sum);
    kvc__free(p, refs);
    if (r->err != KVC_OK) kvc__ckload_free(p, out);
}

/* RECURRENT: CELL is (sequence, tokens consumed) per state, KVDT the states, then the
   checkpoints when CONF says so (sequence 0's: CKPT, CKDT). */
static kvc_result kvc__load_recurrent(kvc_cache *c, kvc_namespace ns, const kvc_io *io, int32_t **tokens,
                                      int32_t max_tokens, int32_t *n_tokens) {
    kvc_pool *p = c->pool;
    kvc__rd r;
    kvc__saved s;
    kvc__ckload ck;
    uint32_t *pages = NULL;
    int32_t *seq_of = NULL, *off_of, n_pages = 0, i, n, prev = -1;
    memset(&r, 0, sizeof(r));
    memset(&s, 0, sizeof(s));
    memset(&ck, 0, sizeof(ck));
    r.io = io;
    kvc__r_head(&r, p, KVC__WHAT_CACHE, ns, &s);
    if (r.err != KVC_OK) return r.err;
    if (s.cc.kind != KVC_KIND_RECURRENT) return KVC_ERR_MISMATCH;
    n = s.meta[1];
    if (n > c->cfg.max_seqs) return KVC_ERR_MISMATCH; /* more states than sequences here */
    if (tokens != NULL && s.meta[0] > max_tokens) {
        *n_tokens = s.meta[0];
        return KVC_ERR_RANGE;
    }
    seq_of = (int32_t *)kvc__alloc(p, 2 * sizeof(int32_t) * (size_t)KVC__MAX(n, 1));
    if (seq_of == NULL) return KVC_ERR_NO_MEMORY;
    off_of = seq_of + KVC__MAX(n, 1);
    if ((r.err = kvc__stage_pages(p, n, &pages, &n_pages)) == KVC_OK) {
        kvc__r_tokens(&r, p, tokens, s.meta[0]);
        kvc__r_section(&r, KVC__TAG('C', 'E', 'L', 'L'), 8 * (uint64_t)n);
        for (i = 0; i < n && r.err == KVC_OK; ++i) {
            seq_of[i] = (int32_t)kvc__r_u32(&r);
            off_of[i] = (int32_t)kvc__r_u32(&r);
            if (r.err == KVC_OK && (seq_of[i] <= prev || off_of[i] < 1)) kvc__r_fail(&r, KVC_ERR_CORRUPT);
            if (r.err == KVC_OK && seq_of[i] >= c->cfg.max_seqs) kvc__r_fail(&r, KVC_ERR_MISMATCH);
            prev = seq_of[i];
        }
        kvc__r_end(&r);
        kvc__r_kv(&r, p, pages, n);
        if (r.err == KVC_OK && (s.flags & KVC__CONF_CKPT)) kvc__r_ckpts(&r, c, pages, n, s.meta[2], 0, &ck);
    }
    if (r.err == KVC_OK && s.meta[2] != (n > 0 && seq_of[0] == 0 ? off_of[0] : 0)) r.err = KVC_ERR_CORRUPT;
    if (r.err == KVC_OK) { /* the cache takes the staged pages over */
        kvc__lease_drop(c);
        kvc__pend_drop(c);
        kvc__ckpt_drop_all(c);
        kvc__states_release(c);
        for (i = 0; i < n; ++i) {
            c->state_page[seq_of[i]] = pages[i];
            c->state_off[seq_of[i]] = off_of[i];
        }
        c->offset = c->state_off[0];
        c->gen++; /* contents added or replaced (kvc_prefix checks) */
        c->batch_begin = c->offset > 0 ? c->offset - 1 : 0;
        kvc__ckpt_install(c, ck.chain); /* the saved checkpoints (none: none) */
        ck.chain = NULL;
        n_pages = 0;
        *n_tokens = s.meta[0];
    } else if (tokens != NULL) {
        kvc__free(p, *tokens);
        *tokens = NULL;
    }
    kvc__ckload_free(p, &ck); /* the load's references of the checkpoints' own pages */
    kvc__unstage_pages(p, pages, n_pages);
    kvc__free(p, seq_of);
    return r.err;
}

static kvc_result kvc__load_causal(kvc_cache *c, kvc_namespace ns, const kvc_io *io, int32_t **tokens,
                                   int32_t max_tokens, int32_t *n_tokens);

/* TAIL of a cache of `off` tokens into *ring (c->tail's size, from the pool's allocator)
   and [*lo, *hi): the newest tokens that c's own f16_tail holds; all of it is read (and
   checked), and a cache without a tail keeps none (*ring NULL). */
static void kvc__r_tail(kvc__rd *r, const kvc_cache *c, int32_t off, unsigned char **ring, int32_t *lo, int32_t *hi) {
    const kvc_pool *p = c->pool;
    size_t krow = kvc__tail_row(p, 1), vrow = kvc__tail_row(p, 0), row;
    unsigned char *scratch;
    int32_t l, t, kv, keep;
    kvc__r_section_any(r, KVC__TAG('T', 'A', 'I', 'L'));
    *lo = (int32_t)kvc__r_u32(r);
    *hi = (int32_t)kvc__r_u32(r);
    if (r->err != KVC_OK) return;
    if (*lo < 0 || *hi <= *lo || *hi > off ||
        r->left != (uint64_t)p->cfg.n_layers * (uint64_t)(*hi - *lo) * (krow + vrow)) {
        kvc__r_fail(r, KVC_ERR_CORRUPT);
        return;
    }
    keep = c->tail != NULL ? KVC__MAX(*lo, *hi - c->cfg.f16_tail) : *hi; /* the tokens kept: [keep, hi) */
    scratch = (unsigned char *)kvc__alloc((kvc_pool *)(uintptr_t)p, KVC__MAX(krow, vrow) +
                                          (c->tail != NULL ? (size_t)c->cfg.f16_tail * (size_t)p->cfg.n_layers * (krow + vrow) : 0));
    if (scratch == NULL) { kvc__r_fail(r, KVC_ERR_NO_MEMORY); return; }
    *ring = c->tail != NULL ? scratch + KVC__MAX(krow, vrow) : NULL;
    if (*ring != NULL) memset(*ring, 0, (size_t)c->cfg.f16_tail * (size_t)p->cfg.n_layers * (krow + vrow));
    for (l = 0; l < p->cfg.n_layers; ++l)
        for (kv = 0; kv < 2; ++kv)
            for (t = *lo, row = kv ? vrow : krow; t < *hi; ++t) {
                unsigned char *dst = scratch;
                if (t >= keep && *ring != NULL)
                    dst = *ring + (size_t)l * (size_t)c->cfg.f16_tail * (krow + vrow) +
                          (kv ? (size_t)c->cfg.f16_tail * krow : 0) + (size_t)(t % c->cfg.f16_tail) * row;
                kvc__r_bytes(r, dst, row);
            }
    kvc__r_end(r);
    *lo = keep;
    if (*ring == NULL || r->err != KVC_OK) {
        kvc__free((kvc_pool *)(uintptr_t)p, scratch);
        *ring = NULL;
    } else {
        *ring = scratch; /* the caller frees it: the ring is at scratch + max(krow, vrow) */
    }
}

/* Load entry points end here: release what is staged, finish the io. */
static kvc_result kvc__load_end(const kvc_io *io, kvc_pool *p, kvc__staged *st, kvc_result r) {
    if (p != NULL) kvc__staged_free(p, st);
    return kvc__io_end(io, r);
}

/* kvc_cache_load after its checks, without finishing the io: with tokens != NULL the
   saved tokens come back in a block of the pool's (*tokens, which the caller frees)
   and *n_tokens is their count (also with KVC_ERR_RANGE). */
static kvc_result kvc__cache_load(kvc_cache *c, kvc_namespace ns, const kvc_io *io, int32_t **tokens,
                                  int32_t max_tokens, int32_t *n_tokens) {
    kvc__rd r;
    kvc__staged st;
    kvc__ckload ck;
    unsigned char *tail = NULL; /* a TAIL section's rows for c's tail */
    int32_t tail_lo = 0, tail_hi = 0;
    if (tokens != NULL) *tokens = NULL;
    if (kvc__is_causal(c)) return kvc__load_causal(c, ns, io, tokens, max_tokens, n_tokens);
    if (kvc__is_recurrent(c)) return kvc__load_recurrent(c, ns, io, tokens, max_tokens, n_tokens);
    memset(&st, 0, sizeof(st));
    memset(&r, 0, sizeof(r));
    memset(&ck, 0, sizeof(ck));
    r.io = io;
    kvc__r_linear(&r, c, KVC__WHAT_CACHE, ns, &st, tokens != NULL, max_tokens);
    if (r.err == KVC_ERR_RANGE) *n_tokens = st.s.meta[0];
    if (r.err == KVC_OK && (st.s.flags & KVC__CONF_CKPT))
        kvc__r_ckpts(&r, c, st.pages, st.n_pages, st.s.meta[2], st.s.meta[4], &ck);
    if (r.err == KVC_OK && (st.s.flags & KVC__CONF_TAIL))
        kvc__r_tail(&r, c, st.s.meta[2], &tail, &tail_lo, &tail_hi);
    if (r.err == KVC_OK) /* room for the pages and every checkpoint's (kvc__pages_wanted) */
        r.err = kvc__page_table_reserve(c, KVC__MAX(st.s.meta[5], kvc__chain_pages(ck.chain)));
    if (r.err == KVC_OK) {
        kvc__install_linear(c, &st);
        if (tail != NULL) { /* the f16 rows of the newest tokens, as saved */
            size_t krow = kvc__tail_row(c->pool, 1), vrow = kvc__tail_row(c->pool, 0);
            memcpy(c->tail, tail + KVC__MAX(krow, vrow),
                   (size_t)c->cfg.f16_tail * (size_t)c->pool->cfg.n_layers * (c->tail_krow + c->tail_vrow));
            c->tail_lo = tail_lo;
            c->tail_hi = tail_hi;
        }
        kvc__pend_drop(c);
        kvc__ckpt_install(c, ck.chain); /* the saved checkpoints (none: the old ones go) */
        ck.chain = NULL;
        *n_tokens = st.s.meta[0];
        if (tokens != NULL) { *tokens = st.tokens; st.tokens = NULL; }
    }
    kvc__ckload_free(c->pool, &ck);
    kvc__staged_free(c->pool, &st);
    kvc__free(c->pool, tail);
    return r.err;
}

static kvc_result kvc__cache_load_held(kvc_cache *c, kvc_namespace ns, const kvc_io *io, int32_t *tokens, int32_t max_tokens,
                                 int32_t *n_tokens) {
    kvc_result e;
    int32_t *got = NULL, n = 0;
    if (io == NULL) return KVC_ERR_NULL;
    if (c == NULL) return kvc__io_end(io, KVC_ERR_NULL);
    if (!kvc__persistable(c->pool)) return kvc__io_end(io, KVC_ERR_UNSUPPORTED); /* device backend */
    if ((e = kvc__check_io(io, 0)) != KVC_OK) return kvc__io_end(io, e);
    if (max_tokens < 0) return kvc__io_end(io, KVC_ERR_INVALID);
    if (kvc__batch_open(c)) return kvc__io_end(io, KVC_ERR_STATE);
    e = kvc__cache_load(c, ns, io, tokens != NULL ? &got : NULL, max_tokens, &n);
    if (e == KVC_OK && tokens != NULL && n > 0) memcpy(tokens, got, sizeof(int32_t) * (size_t)n);
    if ((e == KVC_OK || e == KVC_ERR_RANGE) && n_tokens != NULL) *n_tokens = n;
    kvc__free(c->pool, got);
    return kvc__io_end(io, e);
}

KVCDEF kvc_result kvc_cache_load(kvc_cache *c, kvc_namespace ns, const kvc_io *io, int32_t *tokens, int32_t max_tokens,
                                 int32_t *n_tokens) {
    kvc_result r;
    const kvc_pool *lp;
    if (c == NULL) return kvc__cache_load_held(c, ns, io, tokens, max_tokens, n_tokens);
    lp = c->pool;
    kvc__pool_lock(lp);
    r = kvc__owned(c, 0) != KVC_OK ? KVC_ERR_OWNED : kvc__cache_load_held(c, ns, io, tokens, max_tokens, n_tokens);
    kvc__pool_unlock(lp);
    return r;
}

/* ---- CAUSAL: a whole cache, or one sequence ---- */

/* CELL of a CAUSAL cache: cell index (ascending, inside the target), position, the
   saved sequence set (words of the saved max_seqs), converted to the target's words. */
static void kvc__r_causal_cells(kvc__rd *r, const kvc_cache *c, const kvc__saved *s, const uint32_t *pages,
                                int32_t *cell_of, uint32_t *seqs) {
    kvc_pool *p = c->pool;
    int32_t n = s->meta[1], w_saved = s->meta[2], i, k, prev = -1;
    kvc__r_section(r, KVC__TAG('C', 'E', 'L', 'L'), (8 + 4 * (uint64_t)w_saved) * (uint64_t)n);
    for (i = 0; i < n && r->err == KVC_OK; ++i) {
        int32_t cell = (int32_t)kvc__r_u32(r), pos = (int32_t)kvc__r_u32(r);
        uint32_t any = 0;
        if (r->err == KVC_OK && (cell <= prev || pos < 0 || pos == INT32_MAX)) kvc__r_fail(r, KVC_ERR_CORRUPT);
        if (r->err == KVC_OK && cell >= c->capacity) kvc__r_fail(r, KVC_ERR_MISMATCH);
        prev = cell;
        cell_of[i] = cell;
        *kvc__pos_at(p, pages[i / p->page_cells], i % p->page_cells) = pos;
        for (k = 0; k < w_saved; ++k) {
            uint32_t bits = kvc__r_u32(r), keep = bits;
            if (k >= c->words) keep = 0;
            else if (k == c->words - 1 && c->cfg.max_seqs % 32) keep &= (1u << (c->cfg.max_seqs % 32)) - 1u;
            if (r->err == KVC_OK && keep != bits) kvc__r_fail(r, KVC_ERR_MISMATCH); /* a sequence the target lacks */
            if (k < c->words) seqs[(size_t)i * c->words + k] = keep;
            any |= bits;
        }
        for (k = w_saved; k < c->words; ++k) seqs[(size_t)i * c->words + k] = 0;
        if (r->err == KVC_OK && !any) kvc__r_fail(r, KVC_ERR_CORRUPT);
    }
    kvc__r_end(r);
}

/* The causal configuration a saved cache or sequence must share with the target. */
static int kvc__causal_conf_ok(const kvc_cache *c, const kvc__saved *s) {
    return s->cc.kind == KVC_KIND_CAUSAL && s->cc.window == c->cfg.window && s->cc.chunk == c->cfg.chunk;
}

static kvc_result kvc__load_causal(kvc_cache *c, kvc_namespace ns, const kvc_io *io, int32_t **tokens,
                                   int32_t max_tokens, int32_t *n_tokens) {
    kvc_pool *p = c->pool;
    kvc__rd r;
    kvc__saved s;
    uint32_t *pages = NULL, *seqs = NULL;
    int32_t *cell_of = NULL, n_pages = 0, i, n;
    memset(&r, 0, sizeof(r));
    memset(&s, 0, sizeof(s));
    r.io = io;
    kvc__r_head(&r, p, KVC__WHAT_CACHE, ns, &s);
    if (r.err != KVC_OK) return r.err;
    if (!kvc__causal_conf_ok(c, &s)) return KVC_ERR_MISMATCH;
    n = s.meta[1];
    if (s.meta[2] < 1 || s.meta[2] > (1 << 15) || n > c->capacity) return n > c->capacity ? KVC_ERR_MISMATCH : KVC_ERR_CORRUPT;
    if (tokens != NULL && s.meta[0] > max_tokens) {
        *n_tokens = s.meta[0];
        return KVC_ERR_RANGE;
    }
    cell_of = (int32_t *)kvc__alloc(p, sizeof(int32_t) * (size_t)KVC__MAX(n, 1) * (size_t)(1 + c->words));
    if (cell_of == NULL) return KVC_ERR_NO_MEMORY;
    seqs = (uint32_t *)(cell_of + KVC__MAX(n, 1));
    if ((r.err = kvc__stage_pages(p, n, &pages, &n_pages)) == KVC_OK) {
        kvc__r_tokens(&r, p, tokens, s.meta[0]);
        kvc__r_causal_cells(&r, c, &s, pages, cell_of, seqs);
        kvc__r_kv(&r, p, pages, n);
    }
    if (r.err == KVC_OK) { /* replace every cell */
        kvc__causal_clear(c);
        for (i = 0; i < n; ++i) {
            kvc__copy_cells(p, c->pages, cell_of[i], pages, i, 1);
            memcpy(c->seqs + (size_t)cell_of[i] * c->words, seqs + (size_t)i * c->words, sizeof(uint32_t) * (size_t)c->words);
        }
        c->n_used = n;
        kvc__all_bounds(c);
        *n_tokens = s.meta[0];
    } else if (tokens != NULL) {
        kvc__free(p, *tokens);
        *tokens = NULL;
    }
    kvc__unstage_pages(p, pages, n_pages);
    kvc__free(p, cell_of);
    return r.err;
}

static kvc_result kvc__seq_load_held(kvc_cache *c, int32_t dst, kvc_namespace ns, const kvc_io *io, int32_t *tokens,
                               int32_t max_tokens, int32_t *n_tokens) {
    kvc__rd r;
    kvc__saved s;
    kvc_snapshot *snap = NULL;
    kvc_pool *p;
    int32_t i, n, freed = 0, pc, *got = NULL;
    if (io == NULL) return KVC_ERR_NULL;
    if (c == NULL) return kvc__io_end(io, KVC_ERR_NULL);
    if (!kvc__persistable(c->pool)) return kvc__io_end(io, KVC_ERR_UNSUPPORTED); /* device backend */
    if ((r.err = kvc__check_io(io, 0)) != KVC_OK || (r.err = kvc__check_seq(c, dst)) != KVC_OK) return kvc__io_end(io, r.err);
    if (max_tokens < 0) return kvc__io_end(io, KVC_ERR_INVALID);
    if (kvc__batch_open(c)) return kvc__io_end(io, KVC_ERR_STATE);
    p = c->pool;
    pc = p->page_cells;
    memset(&r, 0, sizeof(r));
    memset(&s, 0, sizeof(s));
    r.io = io;
    kvc__r_head(&r, p, KVC__WHAT_SEQ, ns, &s);
    if (r.err == KVC_OK && !kvc__causal_conf_ok(c, &s)) r.err = KVC_ERR_MISMATCH;
    n = s.meta[1];
    for (i = 0; r.err == KVC_OK && i < c->capacity; ++i) freed += kvc__cell_only(c, i) == dst;
    if (r.err == KVC_OK && c->capacity - c->n_used + freed < n) r.err = KVC_ERR_FULL;
    if (r.err == KVC_OK && tokens != NULL && s.meta[0] > max_tokens) {
        if (n_tokens != NULL) *n_tokens = s.meta[0];
        r.err = KVC_ERR_RANGE;
    }
    if (r.err == KVC_OK && (n + pc - 1) / pc > kvc__pages_free(p)) r.err = KVC_ERR_FULL; /* never evicts */
    if (r.err == KVC_OK && (snap = kvc__snapshot_alloc(p, (n + pc - 1) / pc, 1)) == NULL) r.err = KVC_ERR_NO_MEMORY;
    if (r.err == KVC_OK) { /* the cells go into a sequence snapshot's pages, then kvc_seq_restore */
        snap->kind = KVC_KIND_CAUSAL;
        snap->n_cells = n;
        for (i = 0; i < snap->n_pages; ++i) snap->pages[i] = kvc__page_acquire(p); /* free: checked above */
        kvc__r_tokens(&r, p, tokens != NULL ? &got : NULL, s.meta[0]);
        kvc__r_section(&r, KVC__TAG('C', 'E', 'L', 'L'), 4 * (uint64_t)n);
        for (i = 0; i < n && r.err == KVC_OK; ++i) {
            int32_t pos = (int32_t)kvc__r_u32(&r);
            if (r.err == KVC_OK && (pos < 0 || pos == INT32_MAX)) kvc__r_fail(&r, KVC_ERR_CORRUPT);
            *kvc__pos_at(p, snap->pages[i / pc], i % pc) = pos;
        }
        kvc__r_end(&r);
        kvc__r_kv(&r, p, snap->pages, n);
    }
    if (r.err == KVC_OK) {
        r.err = kvc_seq_restore(c, snap, dst); /* checked above: cannot fail */
        if (tokens != NULL && s.meta[0] > 0) memcpy(tokens, got, sizeof(int32_t) * (size_t)s.meta[0]);
        if (n_tokens != NULL) *n_tokens = s.meta[0];
    }
    kvc__free(p, got);
    kvc_snapshot_free(snap);
    return kvc__io_end(io, r.err);
}

KVCDEF kvc_result kvc_seq_load(kvc_cache *c, int32_t dst, kvc_namespace ns, const kvc_io *io, int32_t *tokens,
                               int32_t max_tokens, int32_t *n_tokens) {
    kvc_result r;
    const kvc_pool *lp;
    if (c == NULL) return kvc__seq_load_held(c, dst, ns, io, tokens, max_tokens, n_tokens);
    lp = c->pool;
    kvc__pool_lock(lp);
    r = kvc__owned(c, 0) != KVC_OK ? KVC_ERR_OWNED : kvc__seq_load_held(c, dst, ns, io, tokens, max_tokens, n_tokens);
    kvc__pool_unlock(lp);
    return r;
}

/* ---- prefix-tree entries ---- */

static kvc_result kvc__radix_save_memory(kvc_radix *t, kvc_namespace ns, const int32_t *tokens, int32_t n,
                                         const kvc_io *io);
static kvc_result kvc__radix_load_memory(kvc_radix *t, kvc_namespace ns, const kvc_io *io, int pin,
                                         int32_t *n_tokens);

static kvc_result kvc__radix_save_held(kvc_radix *t, kvc_namespace ns, const int32_t *tokens, int32_t n_tokens,
                                 const kvc_io *io) {
    kvc__rnode *at;
    kvc_cache *c = NULL;
    int32_t m;
    kvc_result r;
    if (io == NULL) return KVC_ERR_NULL;
    if (t == NULL) return kvc__io_end(io, KVC_ERR_NULL);
    if ((r = kvc__check_io(io, 1)) != KVC_OK || (r = kvc__check_tokens(tokens, n_tokens, 1)) != KVC_OK)
        return kvc__io_end(io, r);
    if (t->mp != NULL) return kvc__io_end(io, kvc__radix_save_memory(t, ns, tokens, n_tokens, io));
    at = kvc__radix_walk(t, ns, tokens, n_tokens, &m);
    if (m < n_tokens || kvc__radix_usable(t, &at, m) < n_tokens) return kvc__io_end(io, KVC_ERR_NOT_FOUND);
    if ((r = kvc_cache_create(t->part[0].pool, &t->part[0].cfg, &c)) != KVC_OK) return kvc__io_end(io, r);
    if ((r = kvc__page_table_reserve(c, (n_tokens - 1) / t->part[0].pool->page_cells + 1)) != KVC_OK) {
        kvc_cache_destroy(c);
        return kvc__io_end(io, r);
    }
    kvc__radix_fill(t, 0, c, at, n_tokens); /* the ready cache a lookup would give, all n tokens */
    r = kvc__save(c, KVC__WHAT_ENTRY, -1, ns, tokens, n_tokens, io);
    kvc_cache_destroy(c);
    return kvc__io_end(io, r);
}

KVCDEF kvc_result kvc_radix_save(kvc_radix *t, kvc_namespace ns, const int32_t *tokens, int32_t n_tokens,
                                 const kvc_io *io) {
    kvc_result r;
    const kvc_pool *lp;
    if (t == NULL) return kvc__radix_save_held(t, ns, tokens, n_tokens, io);
    lp = t->part[0].pool;
    kvc__pool_lock(lp);
    r = kvc__radix_save_held(t, ns, tokens, n_tokens, io);
    kvc__pool_unlock(lp);
    return r;
}

static kvc_result kvc__radix_load_held(kvc_radix *t, kvc_namespace ns, const kvc_io *io, int pin, int32_t *n_tokens) {
    kvc__rd r;
    kvc__staged st;
    kvc_cache *c = NULL;
    kvc_result e;
    memset(&st, 0, sizeof(st));
    if (io == NULL) return KVC_ERR_NULL;
    if (t == NULL) return kvc__io_end(io, KVC_ERR_NULL);
    if (!kvc__persistable(t->part[0].pool)) return kvc__io_end(io, KVC_ERR_UNSUPPORTED); /* device backend */
    if ((e = kvc__check_io(io, 0)) != KVC_OK) return kvc__io_end(io, e);
    if (t->mp != NULL) return kvc__io_end(io, kvc__radix_load_memory(t, ns, io, pin, n_tokens));
    if ((e = kvc_cache_create(t->part[0].pool, &t->part[0].cfg, &c)) != KVC_OK) return kvc__io_end(io, e);
    memset(&r, 0, sizeof(r));
    r.io = io;
    kvc__r_linear(&r, c, KVC__WHAT_ENTRY, ns, &st, 0, 0);
    if (r.err == KVC_OK) r.err = kvc__page_table_reserve(c, st.s.meta[5]);
    if (r.err == KVC_OK) {
        kvc__install_linear(c, &st);
        r.err = kvc__radix_commit(t, ns, &c, st.tokens, st.s.meta[0], 0, pin); /* NO_MEMORY: tree unchanged */
    }
    if (r.err == KVC_OK && n_tokens != NULL) *n_tokens = st.s.meta[0];
    kvc_cache_destroy(c);
    return kvc__load_end(io, t->part[0].pool, &st, r.err);
}

KVCDEF kvc_result kvc_radix_load(kvc_radix *t, kvc_namespace ns, const kvc_io *io, int pin, int32_t *n_tokens) {
    KVC__POOL_LOCKED(t, t->part[0].pool, kvc__radix_load_held(t, ns, io, pin, n_tokens));
}

/* ---- model memories ---- */
/* A memory is saved as a MEMO section (its layer map and each group's kind) followed by
   one saved cache per group (kvc_cache_save's format; the tokens go with group 0). A load
   reads every group into a fresh cache of its pool first and moves them into the
   memory's caches only when all of them were read and checked. */


/* The io a group's save or load goes through: the caller's, finished once at the end. */
static size_t kvc__fwd_write(void *user, const void *data, size_t n) {
    const kvc_io *io = (const kvc_io *)user;
    return io->write(io->user, data, n);
}
static size_t kvc__fwd_read(void *user, void *data, size_t n) {
    const kvc_io *io = (const kvc_io *)user;
    return io->read(io->user, data, n);
}
static kvc_io kvc__unfinished(const kvc_io *io) {
    kvc_io f;
    f.write = io->write != NULL ? kvc__fwd_write : NULL;
    f.read = io->read != NULL ? kvc__fwd_read : NULL;
    f.finish = NULL;
    f.user = (void *)(uintptr_t)io; /* never written through */
    return f;
}

static void kvc__w_memo(kvc__wr *w, const kvc_memory *m) {
    const kvc__mpools *mp = m->mp;
    unsigned char b[16];
    int32_t i;
    memcpy(b, kvc__magic, 8);
    kvc__put32(b + 8, KVC__FORMAT_VERSION);
    kvc__put32(b + 12, KVC__WHAT_MEMORY);
    if (w->io->write(w->io->user, b, 16) != 16) w->failed = 1;
    kvc__w_section(w, KVC__TAG('M', 'E', 'M', 'O'), 8 + 4 * ((uint64_t)mp->n_layers + (uint64_t)mp->n_groups));
    kvc__w_u32(w, (uint32_t)mp->n_groups);
    kvc__w_u32(w, (uint32_t)mp->n_layers);
    for (i = 0; i < mp->n_layers; ++i) kvc__w_u32(w, (uint32_t)mp->layer_group[i]);
    for (i = 0; i < mp->n_groups; ++i) kvc__w_u32(w, (uint32_t)m->cache[i]->cfg.kind);
    kvc__w_end(w);
}

static kvc_result kvc__memory_persistable(const kvc_memory *m) {
    int32_t g;
    if (kvc__memory_open(m)) return KVC_ERR_STATE;
    for (g = 0; g < m->mp->n_groups; ++g) {
        if (m->cache[g]->cfg.kind == KVC_KIND_CAUSAL) return KVC_ERR_UNSUPPORTED;
        if (!kvc__persistable(m->cache[g]->pool)) return KVC_ERR_UNSUPPORTED; /* bytes on a device */
    }
    return KVC_OK;
}

static kvc_result kvc__memory_save_held(const kvc_memory *mem, kvc_namespace ns, const int32_t *tokens, int32_t n_tokens,
                                  const kvc_io *io) {
    kvc__wr w;
    kvc_io fwd;
    int32_t g;
    kvc_result r;
    if (io == NULL) return KVC_ERR_NULL;
    if (mem == NULL) return kvc__io_end(io, KVC_ERR_NULL);
    if ((r = kvc__check_io(io, 1)) != KVC_OK || (r = kvc__check_tokens(tokens, n_tokens, 0)) != KVC_OK ||
        (r = kvc__memory_persistable(mem)) != KVC_OK)
        return kvc__io_end(io, r);
    for (g = 0; g < mem->mp->n_groups; ++g) kvc__settle(mem->cache[g]); /* no visible change */
    memset(&w, 0, sizeof(w));
    w.io = io;
    kvc__w_memo(&w, mem);
    if (w.failed) return kvc__io_end(io, KVC_ERR_IO);
    fwd = kvc__unfinished(io);
    for (g = 0; g < mem->mp->n_groups && r == KVC_OK; ++g)
        r = kvc__save(mem->cache[g], KVC__WHAT_CACHE, -1, ns, tokens, g == 0 ? n_tokens : 0, &fwd);
    return kvc__io_end(io, r);
}

KVCDEF kvc_result kvc_memory_save(const kvc_memory *mem, kvc_namespace ns, const int32_t *tokens, int32_t n_tokens,
                                  const kvc_io *io) {
    kvc_result r;
    kvc__mlock lk;
    if (mem == NULL) return kvc__memory_save_held(mem, ns, tokens, n_tokens, io);
    lk = kvc__memory_lock(mem->mp);
    r = kvc__memory_save_held(mem, ns, tokens, n_tokens, io);
    kvc__memory_unlock(lk);
    return r;
}

/* Move src's contents (FULL, ROTATING, RECURRENT; same pool and config) into dst, whose
   old contents go; src is left empty. Cannot fail (dst's page table has room for
   kvc__pages_wanted(src)). */
static void kvc__cache_move(kvc_cache *dst, kvc_cache *src) {
    int32_t s;
    kvc__lease_drop(dst);
    kvc__pend_drop(dst);
    kvc__ckpt_drop_all(dst);
    kvc__states_release(dst);
    kvc__rewind(dst, 0);
    memcpy(dst->pages, src->pages, sizeof(uint32_t) * (size_t)src->n_pages);
    dst->n_pages = src->n_pages;
    dst->first_lpage = src->first_lpage;
    dst->offset = src->offset;
    dst->gen++; /* contents added or replaced (kvc_prefix checks) */
    dst->batch_begin = src->batch_begin;
    dst->batch_pending = 0;
    for (s = 0; kvc__is_recurrent(src) && s < src->cfg.max_seqs; ++s) {
        dst->state_page[s] = src->state_page[s];
        dst->state_off[s] = src->state_off[s];
        src->state_page[s] = KVC__NO_PAGE;
    }
    for (s = 0; s < src->n_ckpt; ++s) { /* the checkpoints too (the same config: as many slots) */
        dst->ckpt[s] = src->ckpt[s];
        dst->ckpt[s]->cache_id = dst->id;
    }
    dst->n_ckpt = src->n_ckpt;
    src->n_ckpt = 0;
    if (dst->tail != NULL && src->tail != NULL) { /* the same config: the same ring */
        memcpy(dst->tail, src->tail, (size_t)dst->cfg.f16_tail * (size_t)dst->pool->cfg.n_layers *
                                         (dst->tail_krow + dst->tail_vrow));
        dst->tail_lo = src->tail_lo;
        dst->tail_hi = src->tail_hi;
    }
    src->n_pages = 0;
    src->first_lpage = src->n_sink_pages;
    src->offset = 0;
}

static kvc_result kvc__memory_load_held(kvc_memory *mem, kvc_namespace ns, const kvc_io *io, int32_t *tokens,
                                  int32_t max_tokens, int32_t *n_tokens) {
    kvc__mpools *mp;
    kvc__rd rd;
    kvc_io fwd;
    kvc_cache *tmp[KVC_MAX_GROUPS];
    unsigned char b[16];
    int32_t g, i, n0 = 0, *got = NULL;
    int other;
    kvc_result r;
    if (io == NULL) return KVC_ERR_NULL;
    if (mem == NULL) return kvc__io_end(io, KVC_ERR_NULL);
    if ((r = kvc__check_io(io, 0)) != KVC_OK || (r = kvc__memory_persistable(mem)) != KVC_OK)
        return kvc__io_end(io, r);
    if (max_tokens < 0) return kvc__io_end(io, KVC_ERR_INVALID);
    mp = mem->mp;
    memset(&rd, 0, sizeof(rd));
    memset(b, 0, sizeof(b));
    rd.io = io;
    kvc__r_raw(&rd, b, 16);
    if (rd.err == KVC_OK && (memcmp(b, kvc__magic, 8) != 0 || kvc__le32(b + 8) != KVC__FORMAT_VERSION))
        rd.err = KVC_ERR_FORMAT;
    if (rd.err == KVC_OK && kvc__le32(b + 12) != KVC__WHAT_MEMORY) rd.err = KVC_ERR_MISMATCH;
    /* the whole section is read and its checksum verified before its values are judged:
       damage is CORRUPT, a truncation TRUNCATED, only a sound other memory MISMATCH */
    kvc__r_section(&rd, KVC__TAG('M', 'E', 'M', 'O'), 8 + 4 * ((uint64_t)mp->n_layers + (uint64_t)mp->n_groups));
    other = kvc__r_u32(&rd) != (uint32_t)mp->n_groups;
    other |= kvc__r_u32(&rd) != (uint32_t)mp->n_layers;
    for (i = 0; i < mp->n_layers && rd.err == KVC_OK; ++i) other |= kvc__r_u32(&rd) != (uint32_t)mp->layer_group[i];
    for (g = 0; g < mp->n_groups && rd.err == KVC_OK; ++g) other |= kvc__r_u32(&rd) != (uint32_t)mem->cache[g]->cfg.kind;
    kvc__r_end(&rd);
    if (rd.err == KVC_OK && other) rd.err = KVC_ERR_MISMATCH;
    if (rd.err != KVC_OK) return kvc__io_end(io, rd.err);
    memset(tmp, 0, sizeof(tmp));
    fwd = kvc__unfinished(io);
    for (g = 0; g < mp->n_groups && r == KVC_OK; ++g) {
        int32_t n = 0;
        r = kvc_cache_create(mem->cache[g]->pool, &mem->cache[g]->cfg, &tmp[g]);
        /* group 0's tokens into a block of its pool: the caller's array only on success */
        if (r == KVC_OK) r = kvc__cache_load(tmp[g], ns, &fwd, g == 0 && tokens != NULL ? &got : NULL, g == 0 ? max_tokens : 0, &n);
        if (r == KVC_OK && g > 0 && (n != 0 || tmp[g]->offset != tmp[0]->offset)) r = KVC_ERR_CORRUPT;
        if (g == 0) n0 = n;
    }
    if (r == KVC_ERR_RANGE && n_tokens != NULL) *n_tokens = n0;
    for (g = 0; g < mp->n_groups && r == KVC_OK; ++g) /* room first: the moves cannot fail */
        r = kvc__page_table_reserve(mem->cache[g], kvc__pages_wanted(tmp[g]));
    if (r == KVC_OK) {
        for (g = 0; g < mp->n_groups; ++g) kvc__cache_move(mem->cache[g], tmp[g]);
        if (tokens != NULL && n0 > 0) memcpy(tokens, got, sizeof(int32_t) * (size_t)n0);
        if (n_tokens != NULL) *n_tokens = n0;
    }
    if (got != NULL) kvc__free(tmp[0]->pool, got);
    for (g = 0; g < mp->n_groups; ++g)
        if (tmp[g] != NULL) kvc_cache_destroy(tmp[g]);
    return kvc__io_end(io, r);
}

KVCDEF kvc_result kvc_memory_load(kvc_memory *mem, kvc_namespace ns, const kvc_io *io, int32_t *tokens,
                                  int32_t max_tokens, int32_t *n_tokens) {
    kvc_result r;
    kvc__mlock lk;
    if (mem == NULL) return kvc__memory_load_held(mem, ns, io, tokens, max_tokens, n_tokens);
    lk = kvc__memory_lock(mem->mp);
    r = kvc__memory_load_held(mem, ns, io, tokens, max_tokens, n_tokens);
    kvc__memory_unlock(lk);
    return r;
}

/* ---- a memory tree's entries ---- */
/* An entry of a memory's tree is saved as a header (what: KVC__WHAT_MEMORY_ENTRY), an
   ENTN section (its token count), an ETOK section (its tokens) and the memory a lookup
   of exactly those tokens would give (kvc_memory_save's format, without tokens). A load
   reads the tokens into a buffer that grows only as they arrive (a declared count alone
   allocates nothing), reads the memory into fresh caches on the tree's pools, and
   commits it. */

/* A new memory on the tree's pools, empty. */
static kvc_result kvc__radix_memory(kvc_radix *t, kvc_memory **out) {
    kvc_memory *m;
    kvc_result r = KVC_OK;
    int32_t g;
    if ((m = kvc__memory_alloc(t->mp)) == NULL) return KVC_ERR_NO_MEMORY;
    for (g = 0; g < t->n_parts && r == KVC_OK; ++g) r = kvc_cache_create(t->part[g].pool, &t->part[g].cfg, &m->cache[g]);
    if (r != KVC_OK) { kvc_memory_destroy(m); return r; }
    *out = m;
    return KVC_OK;
}

static kvc_result kvc__radix_save_memory(kvc_radix *t, kvc_namespace ns, const int32_t *tokens, int32_t n,
                                         const kvc_io *io) {
    kvc__rnode *at;
    kvc_memory *m = NULL;
    kvc__wr w;
    kvc_io fwd;
    unsigned char b[16];
    int32_t g, i, matched;
    kvc_result r;
    at = kvc__radix_walk(t, ns, tokens, n, &matched);
    if (matched < n || kvc__radix_usable(t, &at, matched) < n) return KVC_ERR_NOT_FOUND;
    if ((r = kvc__radix_memory(t, &m)) != KVC_OK) return r;
    if ((r = kvc__radix_reserve_tables(t, m, n)) != KVC_OK) { kvc_memory_destroy(m); return r; }
    for (g = 0; g < t->n_parts; ++g) kvc__radix_fill(t, g, m->cache[g], at, n);
    memset(&w, 0, sizeof(w));
    w.io = io;
    memcpy(b, kvc__magic, 8);
    kvc__put32(b + 8, KVC__FORMAT_VERSION);
    kvc__put32(b + 12, KVC__WHAT_MEMORY_ENTRY);
    if (io->write(io->user, b, 16) != 16) w.failed = 1;
    kvc__w_section(&w, KVC__TAG('E', 'N', 'T', 'N'), 4);
    kvc__w_u32(&w, (uint32_t)n);
    kvc__w_end(&w);
    kvc__w_section(&w, KVC__TAG('E', 'T', 'O', 'K'), 4 * (uint64_t)n);
    for (i = 0; i < n; ++i) kvc__w_u32(&w, (uint32_t)tokens[i]);
    kvc__w_end(&w);
    fwd = kvc__unfinished(io);
    r = w.failed ? KVC_ERR_IO : kvc_memory_save(m, ns, NULL, 0, &fwd);
    kvc_memory_destroy(m);
    return r;
}

/* The ETOK section's n tokens into *tokens (allocated from pool p, at most twice the
   bytes read so far). */
static void kvc__r_grow_tokens(kvc__rd *r, kvc_pool *p, int32_t n, int32_t **tokens) {
    int32_t cap = 0, i;
    kvc__r_section(r, KVC__TAG('E', 'T', 'O', 'K'), 4 * (uint64_t)n);
    for (i = 0; i < n && r->err == KVC_OK; ++i) {
        uint32_t tok = kvc__r_u32(r);
        if (r->err != KVC_OK) break;
        if (i == cap) {
            int32_t next = cap == 0 ? KVC__MIN(n, 1024) : (int32_t)KVC__MIN((int64_t)n, 2 * (int64_t)cap);
            int32_t *grown = (int32_t *)kvc__alloc(p, sizeof(int32_t) * (size_t)next);
            if (grown == NULL) { kvc__r_fail(r, KVC_ERR_NO_MEMORY); break; }
            if (cap > 0) memcpy(grown, *tokens, sizeof(int32_t) * (size_t)cap);
            kvc__free(p, *tokens);
            *tokens = grown;
            cap = next;
        }
        (*tokens)[i] = (int32_t)tok;
    }
    kvc__r_end(r);
}

static kvc_result kvc__radix_load_memory(kvc_radix *t, kvc_namespace ns, const kvc_io *io, int pin,
                                         int32_t *n_tokens) {
    kvc_pool *p = t->part[0].pool;
    kvc_memory *m = NULL;
    kvc__rd rd;
    kvc_io fwd;
    unsigned char b[16];
    int32_t *tokens = NULL, n = 0, off = -1;
    kvc_result r;
    memset(&rd, 0, sizeof(rd));
    memset(b, 0, sizeof(b));
    rd.io = io;
    kvc__r_raw(&rd, b, 16);
    if (rd.err == KVC_OK && (memcmp(b, kvc__magic, 8) != 0 || kvc__le32(b + 8) != KVC__FORMAT_VERSION))
        rd.err = KVC_ERR_FORMAT;
    if (rd.err == KVC_OK && kvc__le32(b + 12) != KVC__WHAT_MEMORY_ENTRY) rd.err = KVC_ERR_MISMATCH;
    kvc__r_section(&rd, KVC__TAG('E', 'N', 'T', 'N'), 4);
    n = (int32_t)kvc__r_u32(&rd);
    kvc__r_end(&rd);
    if (rd.err == KVC_OK && n < 1) rd.err = KVC_ERR_CORRUPT;
    kvc__r_grow_tokens(&rd, p, n, &tokens);
    r = rd.err;
    if (r == KVC_OK) r = kvc__radix_memory(t, &m);
    if (r == KVC_OK) {
        fwd = kvc__unfinished(io);
        r = kvc_memory_load(m, ns, &fwd, NULL, 0, NULL);
    }
    if (r == KVC_OK && (kvc_memory_offset(m, &off) != KVC_OK || off != n)) r = KVC_ERR_CORRUPT;
    if (r == KVC_OK) r = kvc__radix_commit(t, ns, m->cache, tokens, n, 0, pin); /* NO_MEMORY: tree unchanged */
    if (r == KVC_OK && n_tokens != NULL) *n_tokens = n;
    if (m != NULL) kvc_memory_destroy(m);
    kvc__free(p, tokens);
    return r;
}

/* ---- the ios ---- */

static size_t kvc__mem_write(void *user, const void *data, size_t n) {
    kvc_mem *m = (kvc_mem *)user;
    if (m->data == NULL) { m->size += n; return n; } /* counting only */
    if (m->size > m->capacity || n > m->capacity - m->size) return 0;
    memcpy(m->data + m->size, data, n);
    m->size += n;
    return n;
}
static size_t kvc__mem_read(void *user, void *data, size_t n) {
    kvc_mem *m = (kvc_mem *)user;
    size_t k;
    if (m->pos >= m->size) return 0;
    k = KVC__MIN(n, m->size - m->pos);
    memcpy(data, m->data + m->pos, k);
    m->pos += k;
    return k;
}

KVCDEF kvc_result kvc_io_memory(kvc_mem *mem, kvc_io *io) {
    if (mem == NULL || io == NULL) return KVC_ERR_NULL;
    memset(io, 0, sizeof(*io));
    io->write = kvc__mem_write;
    io->read = kvc__mem_read;
    io->user = mem;
    return KVC_OK;
}

#ifndef KVCACHE_NO_STDIO
#include <time.h> /* time, clock: the names of temporary files */
static size_t kvc__file_write(void *user, const void *data, size_t n) { return fwrite(data, 1, n, (FILE *)user); }
static size_t kvc__file_read(void *user, void *data, size_t n) { return fread(data, 1, n, (FILE *)user); }
static int kvc__file_finish(void *user, int ok) { (void)ok; return ferror((FILE *)user) != 0; }

KVCDEF kvc_result kvc_io_stdio(FILE *file, kvc_io *io) {
    if (file == NULL || io == NULL) return KVC_ERR_NULL;
    memset(io, 0, sizeof(*io));
    io->write = kvc__file_write;
    io->read = kvc__file_read;
    io->finish = kvc__file_finish;
    io->user = file;
    return KVC_OK;
}

/* Close; a successful save's temporary file becomes the file, a failed one is removed. */
static int kvc__path_finish(void *user, int ok) {
    kvc_path_io *s = (kvc_path_io *)user;
    int bad;
    if (s->file == NULL) return 1;
    bad = ferror(s->file) != 0;
    bad |= fclose(s->file) != 0;
    s->file = NULL;
    if (!s->writing) return bad;
    if (ok && !bad) bad = rename(s->tmp, s->path) != 0;
    if (!ok || bad) remove(s->tmp);
    return bad;
}
/* a path io used again after its save or load finished (closed) moves nothing */
static size_t kvc__path_write(void *user, const void *data, size_t n) {
    FILE *f = ((kvc_path_io *)user)->file;
    return f != NULL ? fwrite(data, 1, n, f) : 0;
}
static size_t kvc__path_read(void *user, void *data, size_t n) {
    FILE *f = ((kvc_path_io *)user)->file;
    return f != NULL ? fread(data, 1, n, f) : 0;
}

/* A save's temporary file, of a name of its own: path + ".kvctmp-" + 16 hex digits mixed
   from the state's address (distinct for saves at once in one process), the time and
   the processor clock (other processes), and the attempt. Created exclusively where
   fopen has the "x" mode (C11, glibc, musl, MSVC): a name that exists is never opened,
   the next attempt takes another. Elsewhere (C99 has no exclusive create) a name that
   exists is skipped, but a file made between that check and fopen could still be
   truncated: there the names' 64 mixed bits are what keep saves apart. */
#if (defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L) || defined(__GLIBC__) || defined(_MSC_VER) || \
    defined(__APPLE__) || defined(__FreeBSD__)
#define KVC__FOPEN_EXCL "wbx"
#endif
static FILE *kvc__tmp_open(kvc_path_io *s, size_t len) {
    static const char hex[] = "0123456789abcdef";
    uint64_t x;
    int attempt, i;
    for (attempt = 0; attempt < 16; ++attempt) {
        FILE *f;
        x = (uint64_t)(uintptr_t)s ^ (uint64_t)time(NULL) << 32 ^ (uint64_t)clock() * KVC__P1 ^ (uint64_t)attempt * KVC__P2;
        x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull; /* splitmix64's finaliser */
        x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
        x ^= x >> 31;
        memcpy(s->tmp, s->path, len);
        memcpy(s->tmp + len, ".kvctmp-", 8);
        for (i = 0; i < 16; ++i) s->tmp[len + 8 + (size_t)i] = hex[(x >> (60 - 4 * i)) & 15];
        s->tmp[len + 24] = 0;
#ifdef KVC__FOPEN_EXCL
        if ((f = fopen(s->tmp, KVC__FOPEN_EXCL)) != NULL) return f;
#else
        if ((f = fopen(s->tmp, "rb")) != NULL) { fclose(f); continue; } /* taken */
        if ((f = fopen(s->tmp, "wb")) != NULL) return f;
#endif
    }
    s->tmp[0] = 0;
    return NULL;
}

KVCDEF kvc_result kvc_io_path(kvc_path_io *s, const char *path, int writing, kvc_io *io) {
    size_t len;
    if (s == NULL || path == NULL || io == NULL) return KVC_ERR_NULL;
    len = strlen(path);
    if (len == 0) return KVC_ERR_INVALID;
    if (len >= KVC_PATH_MAX) return KVC_ERR_RANGE;
    memset(s, 0, sizeof(*s));
    memcpy(s->path, path, len + 1);
    s->writing = writing != 0;
    if (s->writing) s->file = kvc__tmp_open(s, len);
    else s->file = fopen(s->path, "rb");
    if (s->file == NULL) return KVC_ERR_IO;
    memset(io, 0, sizeof(*io));
    io->write = kvc__path_write;
    io->read = kvc__path_read;
    io->finish = kvc__path_finish;
    io->user = s;
    return KVC_OK;
}
#endif


/* ---- Layer 9: tiers ------------------------------------------------------------------
   Below a prefix tree: a host-RAM tier (blobs in memory from the pool's allocator, a
   list newest first, its own byte budget) and a store (the caller's callbacks). A blob
   is the entry as kvc_radix_save writes it; its key is the SHA-256 chain of
   kvc__tier_chain. Eviction (kvc__radix_evict_node) calls kvc__tier_keep on the leaf
   about to go; kvc_tier_fetch brings blobs back through kvc_radix_load. */

/* SHA-256 (FIPS 180-4), streaming. */
typedef struct kvc__sha {
    uint32_t h[8];
    uint64_t total;
    unsigned char buf[64];
    size_t n_buf;
} kvc__sha;

static const uint32_t kvc__sha_k[64] = {
    0x428a2f98u, 0x71374491u, 0xb5c0fbcfu, 0xe9b5dba5u, 0x3956c25bu, 0x59f111f1u, 0x923f82a4u, 0xab1c5ed5u,
    0xd807aa98u, 0x12835b01u, 0x243185beu, 0x550c7dc3u, 0x72be5d74u, 0x80deb1feu, 0x9bdc06a7u, 0xc19bf174u,
    0xe49b69c1u, 0xefbe4786u, 0x0fc19dc6u, 0x240ca1ccu, 0x2de92c6fu, 0x4a7484aau, 0x5cb0a9dcu, 0x76f988dau,
    0x983e5152u, 0xa831c66du, 0xb00327c8u, 0xbf597fc7u, 0xc6e00bf3u, 0xd5a79147u, 0x06ca6351u, 0x14292967u,
    0x27b70a85u, 0x2e1b2138u, 0x4d2c6dfcu, 0x53380d13u, 0x650a7354u, 0x766a0abbu, 0x81c2c92eu, 0x92722c85u,
    0xa2bfe8a1u, 0xa81a664bu, 0xc24b8b70u, 0xc76c51a3u, 0xd192e819u, 0xd6990624u, 0xf40e3585u, 0x106aa070u,
    0x19a4c116u, 0x1e376c08u, 0x2748774cu, 0x34b0bcb5u, 0x391c0cb3u, 0x4ed8aa4au, 0x5b9cca4fu, 0x682e6ff3u,
    0x748f82eeu, 0x78a5636fu, 0x84c87814u, 0x8cc70208u, 0x90befffau, 0xa4506cebu, 0xbef9a3f7u, 0xc67178f2u};

static uint32_t kvc__ror32(uint32_t x, int r) { return (x >> r) | (x << (32 - r)); }

static void kvc__sha_block(uint32_t h[8], const unsigned char *p) {
    uint32_t w[64], a, b, c, d, e, f, g, k, t1, t2;
    int i;
    for (i = 0; i < 16; ++i)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
    for (i = 16; i < 64; ++i)
        w[i] = w[i - 16] + (kvc__ror32(w[i - 15], 7) ^ kvc__ror32(w[i - 15], 18) ^ (w[i - 15] >> 3)) + w[i - 7] +
               (kvc__ror32(w[i - 2], 17) ^ kvc__ror32(w[i - 2], 19) ^ (w[i - 2] >> 10));
    a = h[0]; b = h[1]; c = h[2]; d = h[3]; e = h[4]; f = h[5]; g = h[6]; k = h[7];
    for (i = 0; i < 64; ++i) {
        t1 = k + (kvc__ror32(e, 6) ^ kvc__ror32(e, 11) ^ kvc__ror32(e, 25)) + ((e & f) ^ (~e & g)) + kvc__sha_k[i] + w[i];
        t2 = (kvc__ror32(a, 2) ^ kvc__ror32(a, 13) ^ kvc__ror32(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        k = g; g = f; f = e; e = d + t1; d = c; c = b; b = a; a = t1 + t2;
    }
    h[0] += a; h[1] += b; h[2] += c; h[3] += d; h[4] += e; h[5] += f; h[6] += g; h[7] += k;
}

static void kvc__sha_init(kvc__sha *s) {
    static const uint32_t h0[8] = {0x6a09e667u, 0xbb67ae85u, 0x3c6ef372u, 0xa54ff53au,
                                   0x510e527fu, 0x9b05688cu, 0x1f83d9abu, 0x5be0cd19u};
    memcpy(s->h, h0, sizeof(h0));
    s->total = 0;
    s->n_buf = 0;
}

static void kvc__sha_update(kvc__sha *s, const void *data, size_t n) {
    const unsigned char *p = (const unsigned char *)data;
    s->total += n;
    while (n > 0) {
        size_t k = KVC__MIN(n, 64 - s->n_buf);
        memcpy(s->buf + s->n_buf, p, k);
        s->n_buf += k;
        p += k;
        n -= k;
        if (s->n_buf == 64) { kvc__sha_block(s->h, s->buf); s->n_buf = 0; }
    }
}

static void kvc__sha_final(kvc__sha *s, unsigned char out[32]) {
    uint64_t bits = s->total * 8;
    unsigned char pad = 0x80, len[8];
    int i;
    kvc__sha_update(s, &pad, 1);
    pad = 0;
    while (s->n_buf != 56) kvc__sha_update(s, &pad, 1);
    for (i = 0; i < 8; ++i) len[i] = (unsigned char)(bits >> (56 - 8 * i)); /* big-endian length */
    kvc__sha_update(s, len, 8);
    for (i = 0; i < 8; ++i) {
        out[4 * i] = (unsigned char)(s->h[i] >> 24);
        out[4 * i + 1] = (unsigned char)(s->h[i] >> 16);
        out[4 * i + 2] = (unsigned char)(s->h[i] >> 8);
        out[4 * i + 3] = (unsigned char)s->h[i];
    }
}

static void kvc__sha_u32(kvc__sha *s, uint32_t x) {
    unsigned char b[4];
    kvc__put32(b, x);
    kvc__sha_update(s, b, 4);
}
static void kvc__sha_u64(kvc__sha *s, uint64_t x) {
    unsigned char b[8];
    kvc__put64(b, x);
    kvc__sha_update(s, b, 8);
}

KVCDEF kvc_result kvc_sha256(const void *data, size_t n, unsigned char out[32]) {
    kvc__sha s;
    if ((data == NULL && n > 0) || out == NULL) return KVC_ERR_NULL;
    kvc__sha_init(&s);
    if (n > 0) kvc__sha_update(&s, data, n);
    kvc__sha_final(&s, out);
    return KVC_OK;
}

KVCDEF kvc_result kvc_key_hex(const kvc_key *key, char out[65]) {
    static const char hex[] = "0123456789abcdef";
    int i;
    if (key == NULL || out == NULL) return KVC_ERR_NULL;
    for (i = 0; i < 32; ++i) {
        out[2 * i] = hex[key->bytes[i] >> 4];
        out[2 * i + 1] = hex[key->bytes[i] & 15];
    }
    out[64] = '\0';
    return KVC_OK;
}

typedef struct kvc__tblob {
    struct kvc__tblob *prev, *next; /* the host tier's list, newest first */
    kvc_key key;
    int32_t n_tokens;
    size_t size;
    unsigned char *data; /* the entry as kvc_radix_save wrote it */
} kvc__tblob;

typedef struct kvc__tier {
    kvc_tier_config cfg;
    int32_t block;         /* block_tokens, the default applied */
    int has_store;
    kvc__tblob *newest, *oldest;
    size_t host_used;
    kvc_tier_stats stats;
    int store_down;        /* a store call failed: none until the next fetch, publish or flush */
    /* called before each load a fetch tries (a tier, then the next after a refusal; again
       after evicting for room): kvcache_vk.h's recorded fetch starts its capture afresh, so
       what it holds at the end is the last load's pages, every section of it */
    void (*load_begin)(void *user);
    void *load_begin_user;
} kvc__tier;

/* The fingerprint (docs/format.md, "Tier keys"), hashed: K_0. */
static void kvc__tier_k0(const kvc_radix *t, kvc_namespace ns, kvc_key *k0) {
    static const unsigned char magic[8] = {'K', 'V', 'C', 'T', 'I', 'E', 'R', '1'};
    kvc__sha s;
    int32_t g, i;
    uint32_t theta;
    kvc__sha_init(&s);
    kvc__sha_update(&s, magic, 8);
    kvc__sha_u32(&s, KVC__FORMAT_VERSION);
    kvc__sha_u32(&s, (uint32_t)t->tier->block);
    kvc__sha_u64(&s, ns.model);
    kvc__sha_u64(&s, ns.salt);
    kvc__sha_u32(&s, t->mp != NULL ? KVC__WHAT_MEMORY_ENTRY : KVC__WHAT_ENTRY);
    kvc__sha_u32(&s, (uint32_t)t->n_parts);
    if (t->mp != NULL) {
        kvc__sha_u32(&s, (uint32_t)t->mp->n_layers);
        for (i = 0; i < t->mp->n_layers; ++i) kvc__sha_u32(&s, (uint32_t)t->mp->layer_group[i]);
    }
    for (g = 0; g < t->n_parts; ++g) {
        const kvc_pool *p = t->part[g].pool;
        const kvc_cache_config *cc = &t->part[g].cfg;
        kvc__sha_u32(&s, (uint32_t)p->cfg.n_layers);
        kvc__sha_u32(&s, (uint32_t)p->cfg.n_kv_heads);
        kvc__sha_u32(&s, (uint32_t)p->cfg.head_dim_k);
        kvc__sha_u32(&s, (uint32_t)p->cfg.head_dim_v);
        kvc__sha_u32(&s, (uint32_t)p->cfg.type_k);
        kvc__sha_u32(&s, (uint32_t)p->cfg.type_v);
        kvc__sha_u32(&s, (uint32_t)p->page_cells);
        kvc__sha_u32(&s, (uint32_t)p->cfg.state_floats);
        kvc__sha_u32(&s, p->cfg.rotate);
        kvc__sha_u32(&s, (uint32_t)cc->kind);
        kvc__sha_u32(&s, (uint32_t)cc->window);
        kvc__sha_u32(&s, (uint32_t)cc->sinks);
        kvc__sha_u32(&s, (uint32_t)cc->rope.style);
        memcpy(&theta, &cc->rope.theta, 4);
        kvc__sha_u32(&s, theta);
        kvc__sha_u32(&s, (uint32_t)cc->rope.n_dims);
        kvc__sha_u32(&s, cc->rope.shift != NULL); /* a callback: only whether there is one */
    }
    kvc__sha_final(&s, k0->bytes);
}

/* K_{i+1} from K_i and block i's tokens. */
static void kvc__tier_next(const kvc_key *k, const int32_t *block, int32_t n, kvc_key *out) {
    kvc__sha s;
    int32_t i;
    kvc__sha_init(&s);
    kvc__sha_update(&s, k->bytes, 32);
    for (i = 0; i < n; ++i) kvc__sha_u32(&s, (uint32_t)block[i]);
    kvc__sha_final(&s, out->bytes);
}

/* The key of the first n_blocks blocks of tokens. */
static void kvc__tier_key_of(const kvc_radix *t, kvc_namespace ns, const int32_t *tokens, int32_t n_blocks,
                             kvc_key *key) {
    int32_t i, b = t->tier->block;
    kvc__tier_k0(t, ns, key);
    for (i = 0; i < n_blocks; ++i) kvc__tier_next(key, tokens + (size_t)i * (size_t)b, b, key);
}

/* A blob: bytes from the pool's allocator. */
typedef struct kvc__blob {
    unsigned char *data;
    size_t size;
} kvc__blob;

/* The longest prefix of whole blocks of tokens[0 .. n) above `above` tokens that the
   tree can save (kvc_radix_save's test: held, usable at that length); 0 if none. */
static int32_t kvc__tier_savable(kvc_radix *t, kvc_namespace ns, const int32_t *tokens, int32_t n, int32_t above) {
    int32_t b = t->tier->block, x, m;
    kvc__rnode *at;
    for (x = n / b * b; x > above; x -= b) {
        at = kvc__radix_walk(t, ns, tokens, x, &m);
        if (m == x && kvc__radix_usable(t, &at, x) == x) return x;
    }
    return 0;
}

/* The entry tokens[0 .. x) saved as a blob (out->data from the pool's allocator): a
   counting save first (no copy), then one allocation of exactly that size -- growing a
   buffer of hundreds of MiB by doubling costs more in page faults than the save. */
static kvc_result kvc__tier_save(kvc_radix *t, kvc_namespace ns, const int32_t *tokens, int32_t x, kvc__blob *out) {
    kvc_pool *p = t->part[0].pool;
    kvc_mem mem;
    kvc_io io;
    kvc_result r;
    memset(out, 0, sizeof(*out));
    memset(&mem, 0, sizeof(mem));
    kvc_io_memory(&mem, &io);
    if ((r = kvc__radix_save_held(t, ns, tokens, x, &io)) != KVC_OK) return r;
    if ((mem.data = (unsigned char *)kvc__alloc(p, mem.size)) == NULL) return KVC_ERR_NO_MEMORY;
    mem.capacity = mem.size;
    mem.size = 0;
    if ((r = kvc__radix_save_held(t, ns, tokens, x, &io)) != KVC_OK || mem.size != mem.capacity) {
        kvc__free(p, mem.data);
        return r != KVC_OK ? r : KVC_ERR_IO;
    }
    out->data = mem.data;
    out->size = mem.size;
    return KVC_OK;
}

/* A store call that fails (or times out) marks the store down: the calls after it, until
   the next fetch, publish or flush, are not made -- so a hanging store costs a request at
   most one timeout, however many entries its evictions or probes would send there. */
static kvc_result kvc__store_put(kvc__tier *tr, const kvc_key *key, const void *data, size_t size) {
    kvc_result r;
    if (tr->store_down) return KVC_ERR_IO;
    r = tr->cfg.store.put(tr->cfg.store.user, key, data, size, tr->cfg.timeout_ms);
    if (r == KVC_OK) tr->stats.kept_store++;
    else tr->stats.store_errors++, tr->store_down = 1;
    return r;
}

static void kvc__tblob_unlink(kvc__tier *tr, kvc__tblob *b) {
    if (b->prev) b->prev->next = b->next; else tr->newest = b->next;
    if (b->next) b->next->prev = b->prev; else tr->oldest = b->prev;
    b->prev = b->next = NULL;
    tr->host_used -= b->size;
    tr->stats.host_blobs--;
}
static void kvc__tblob_free(kvc_pool *p, kvc__tblob *b) {
    if (b == NULL) return;
    kvc__free(p, b->data);
    kvc__free(p, b);
}

/* The host tier's blob of key, or NULL. */
static kvc__tblob *kvc__tier_host_find(kvc__tier *tr, const kvc_key *key) {
    kvc__tblob *b;
    for (b = tr->newest; b != NULL; b = b->next)
        if (memcmp(b->key.bytes, key->bytes, 32) == 0) return b;
    return NULL;
}

/* Take blob b (owned, not listed) into the host tier, moving the oldest blobs to the
   store (or away) until it fits; one larger than the whole budget goes to the store.
   Takes b in every case (freed when nothing keeps it). */
static void kvc__tier_host_put(kvc_radix *t, kvc__tblob *b) {
    kvc__tier *tr = t->tier;
    kvc_pool *p = t->part[0].pool;
    kvc__tblob *old;
    if (b->size > tr->cfg.host_bytes) {
        if (!tr->has_store || kvc__store_put(tr, &b->key, b->data, b->size) != KVC_OK) tr->stats.dropped++;
        kvc__tblob_free(p, b);
        return;
    }
    while (tr->cfg.host_bytes - tr->host_used < b->size) {
        old = tr->oldest;
        kvc__tblob_unlink(tr, old);
        if (!tr->has_store || kvc__store_put(tr, &old->key, old->data, old->size) != KVC_OK) tr->stats.dropped++;
        kvc__tblob_free(p, old);
    }
    b->next = tr->newest;
    if (tr->newest) tr->newest->prev = b; else tr->oldest = b;
    tr->newest = b;
    tr->host_used += b->size;
    tr->stats.host_blobs++;
    tr->stats.kept_host++;
}

/* The path's tokens [0, end of n) into a fresh array (NULL: no memory). */
static int32_t *kvc__rnode_path_tokens(kvc_radix *t, const kvc__rnode *n) {
    int32_t *tokens = (int32_t *)kvc__alloc(t->part[0].pool, sizeof(int32_t) * (size_t)kvc__rnode_end(n));
    const kvc__rnode *up;
    if (tokens == NULL) return NULL;
    for (up = n; up->parent != NULL; up = up->parent)
        memcpy(tokens + up->start, up->tokens, sizeof(int32_t) * (size_t)up->len);
    return tokens;
}

/* Eviction is about to take `leaf`: keep its entry's longest prefix of whole blocks
   that reaches into the leaf (what its ancestors hold stays in the tree) down a tier.
   Nothing here changes the tree; any failure only loses the copy. */
static void kvc__tier_keep(kvc_radix *t, const kvc__rnode *leaf) {
    kvc__tier *tr = t->tier;
    kvc_pool *p = t->part[0].pool;
    int32_t *tokens, x;
    kvc__blob blob;
    kvc__tblob *b;
    kvc_key key;
    if ((tokens = kvc__rnode_path_tokens(t, leaf)) == NULL) { tr->stats.dropped++; return; }
    x = kvc__tier_savable(t, leaf->ns, tokens, kvc__rnode_end(leaf), leaf->start);
    if (x == 0) { tr->stats.dropped++; kvc__free(p, tokens); return; }
    kvc__tier_key_of(t, leaf->ns, tokens, x / tr->block, &key);
    if ((b = kvc__tier_host_find(tr, &key)) != NULL) { /* kept already: now the newest */
        kvc__tblob_unlink(tr, b);
        tr->stats.kept_host--;
        kvc__tier_host_put(t, b);
        kvc__free(p, tokens);
        return;
    }
    if (kvc__tier_save(t, leaf->ns, tokens, x, &blob) != KVC_OK) { tr->stats.dropped++; kvc__free(p, tokens); return; }
    kvc__free(p, tokens);
    if (tr->cfg.host_bytes == 0) {
        if (!tr->has_store || kvc__store_put(tr, &key, blob.data, blob.size) != KVC_OK) tr->stats.dropped++;
        kvc__free(p, blob.data);
        return;
    }
    if ((b = (kvc__tblob *)kvc__alloc(p, sizeof(kvc__tblob))) == NULL) {
        tr->stats.dropped++;
        kvc__free(p, blob.data);
        return;
    }
    memset(b, 0, sizeof(*b));
    b->key = key;
    b->n_tokens = x;
    b->size = blob.size;
    b->data = blob.data;
    kvc__tier_host_put(t, b);
}

static void kvc__tier_free(kvc_radix *t) {
    kvc__tier *tr = t->tier;
    kvc__tblob *b;
    if (tr == NULL) return;
    while ((b = tr->newest) != NULL) {
        kvc__tblob_unlink(tr, b);
        kvc__tblob_free(t->part[0].pool, b);
    }
    kvc__free(t->part[0].pool, tr);
    t->tier = NULL;
}

KVCDEF kvc_result kvc_tier_config_init(kvc_tier_config *cfg) {
    if (cfg == NULL) return KVC_ERR_NULL;
    memset(cfg, 0, sizeof(*cfg));
    return KVC_OK;
}

static kvc_result kvc__tier_attach_held(kvc_radix *t, const kvc_tier_config *cfg) {
    kvc__tier *tr;
    int any, all;
    int32_t g, block = 0;
    if (t == NULL || cfg == NULL) return KVC_ERR_NULL;
    if (t->tier != NULL) return KVC_ERR_STATE;
    if (cfg->block_tokens < 0 || cfg->timeout_ms < 0) return KVC_ERR_INVALID;
    any = cfg->store.put != NULL || cfg->store.exists != NULL || cfg->store.get != NULL;
    all = cfg->store.put != NULL && cfg->store.exists != NULL && cfg->store.get != NULL;
    if (any && !all) return KVC_ERR_NULL; /* a store needs all three */
    if ((tr = (kvc__tier *)kvc__alloc(t->part[0].pool, sizeof(kvc__tier))) == NULL) return KVC_ERR_NO_MEMORY;
    memset(tr, 0, sizeof(*tr));
    tr->cfg = *cfg;
    if (tr->cfg.max_blob_bytes == 0) tr->cfg.max_blob_bytes = (size_t)1 << 30;
    tr->block = cfg->block_tokens;
    for (g = 0; g < t->n_parts && tr->block == 0; ++g) /* the K/V pools' largest page (a state pool's is 1) */
        if (!kvc__part_state(t, g)) block = KVC__MAX(block, t->part[g].pool->page_cells);
    if (tr->block == 0) tr->block = KVC__MAX(block, 1);
    tr->has_store = all;
    t->tier = tr;
    return KVC_OK;
}

KVCDEF kvc_result kvc_tier_attach(kvc_radix *t, const kvc_tier_config *cfg) {
    KVC__POOL_LOCKED(t, t->part[0].pool, kvc__tier_attach_held(t, cfg));
}

static kvc_result kvc__tier_key_held(const kvc_radix *t, kvc_namespace ns, const int32_t *tokens, int32_t n,
                                     kvc_key *key) {
    if (t == NULL || key == NULL || (tokens == NULL && n > 0)) return KVC_ERR_NULL;
    if (t->tier == NULL) return KVC_ERR_STATE;
    if (n <= 0 || n % t->tier->block != 0) return KVC_ERR_INVALID;
    kvc__tier_key_of(t, ns, tokens, n / t->tier->block, key);
    return KVC_OK;
}

KVCDEF kvc_result kvc_tier_key(const kvc_radix *t, kvc_namespace ns, const int32_t *tokens, int32_t n_tokens,
                               kvc_key *key) {
    KVC__POOL_LOCKED(t, t->part[0].pool, kvc__tier_key_held(t, ns, tokens, n_tokens, key));
}

/* The tokens a blob declares, checked against want[0 .. x) before anything is loaded:
   the header (magic, version, what of this tree) and the token section (what 3: TOKS
   after CONF and META; what 5: ENTN then ETOK). Checksums and the rest: the load. */
static kvc_result kvc__tier_check_tokens(const kvc_radix *t, const unsigned char *b, size_t size,
                                         const int32_t *want, int32_t x) {
    size_t at, i;
    uint32_t what = t->mp != NULL ? KVC__WHAT_MEMORY_ENTRY : KVC__WHAT_ENTRY;
    if (size < 16) return KVC_ERR_TRUNCATED;
    if (memcmp(b, kvc__magic, 8) != 0 || kvc__le32(b + 8) != KVC__FORMAT_VERSION) return KVC_ERR_FORMAT;
    if (kvc__le32(b + 12) != what) return KVC_ERR_MISMATCH;
    if (what == KVC__WHAT_ENTRY) {
        at = 16 + (16 + KVC__CONF_BYTES + 8) + (16 + KVC__META_BYTES + 8);
        if (size < at + 16) return KVC_ERR_TRUNCATED;
        if (kvc__le32(b + at) != KVC__TAG('T', 'O', 'K', 'S')) return KVC_ERR_CORRUPT;
    } else {
        at = 16;
        if (size < at + 28 + 16) return KVC_ERR_TRUNCATED;
        if (kvc__le32(b + at) != KVC__TAG('E', 'N', 'T', 'N') || kvc__le64(b + at + 8) != 4 ||
            kvc__le32(b + at + 16) != (uint32_t)x)
            return KVC_ERR_MISMATCH;
        at += 28;
        if (kvc__le32(b + at) != KVC__TAG('E', 'T', 'O', 'K')) return KVC_ERR_CORRUPT;
    }
    if (kvc__le64(b + at + 8) != 4 * (uint64_t)x) return KVC_ERR_MISMATCH;
    at += 16;
    if ((size - at) / 4 < (size_t)x) return KVC_ERR_TRUNCATED;
    for (i = 0; i < (size_t)x; ++i)
        if (kvc__le32(b + at + 4 * i) != (uint32_t)want[i]) return KVC_ERR_MISMATCH;
    return KVC_OK;
}

/* Load a blob of the entry want[0 .. x) into the tree: the tokens checked first, then
   kvc_radix_load (every checksum, the configuration, the namespace); short of pages,
   evict (down the tiers) and try once more. KVC_OK: the tree holds it. */
static kvc_result kvc__tier_load(kvc_radix *t, kvc_namespace ns, const unsigned char *b, size_t size,
                                 const int32_t *want, int32_t x) {
    kvc_mem mem;
    kvc_io io;
    kvc_result r;
    int32_t got = 0, g, try_;
    size_t page = SIZE_MAX;
    if ((r = kvc__tier_check_tokens(t, b, size, want, x)) != KVC_OK) return r;
    for (try_ = 0; try_ < 2; ++try_) {
        memset(&mem, 0, sizeof(mem));
        mem.data = (unsigned char *)(uintptr_t)b; /* only read */
        mem.size = mem.capacity = size;
        kvc_io_memory(&mem, &io);
        if (t->tier->load_begin != NULL) t->tier->load_begin(t->tier->load_begin_user);
        r = kvc__radix_load_held(t, ns, &io, 0, &got);
        if (r != KVC_ERR_FULL || try_ == 1) break;
        for (g = 0; g < t->n_parts; ++g) page = KVC__MIN(page, t->part[g].pool->page_bytes);
        kvc__radix_evict_held(t, (int32_t)KVC__MIN((uint64_t)(size / page + 1), (uint64_t)INT32_MAX), NULL);
    }
    if (r == KVC_OK && got != x) r = KVC_ERR_CORRUPT; /* cannot be: the tokens were checked */
    return r;
}

/* A load's failure the blob is to blame for (refused) rather than the pool. */
static int kvc__tier_refusal(kvc_result r) {
    return r == KVC_ERR_FORMAT || r == KVC_ERR_CORRUPT || r == KVC_ERR_TRUNCATED || r == KVC_ERR_MISMATCH ||
           r == KVC_ERR_ROTATION || r == KVC_ERR_RANGE || r == KVC_ERR_INVALID;
}

/* Try the host tier's blob of key (the prefix want[0 .. x)): it leaves the tier while it
   loads; back into it when the pool could not take it, freed when loaded or refused. */
static kvc_result kvc__tier_from_host(kvc_radix *t, kvc_namespace ns, const kvc_key *key, const int32_t *want,
                                      int32_t x) {
    kvc__tier *tr = t->tier;
    kvc__tblob *b = kvc__tier_host_find(tr, key);
    kvc_result r;
    if (b == NULL) return KVC_ERR_NOT_FOUND;
    kvc__tblob_unlink(tr, b); /* eviction while it loads must not free it */
    r = kvc__tier_load(t, ns, b->data, b->size, want, x);
    if (r == KVC_OK) {
        tr->stats.fetched_host++;
        tr->stats.tokens_fetched += (uint64_t)x;
        kvc__tblob_free(t->part[0].pool, b);
    } else if (kvc__tier_refusal(r)) {
        tr->stats.refused++;
        kvc__tblob_free(t->part[0].pool, b);
    } else {
        tr->stats.kept_host--; /* not a new keep */
        kvc__tier_host_put(t, b);
    }
    return r;
}

static kvc_result kvc__tier_from_store(kvc_radix *t, kvc_namespace ns, const kvc_key *key, const int32_t *want,
                                       int32_t x) {
    kvc__tier *tr = t->tier;
    kvc_pool *p = t->part[0].pool;
    size_t size = 0, got = 0;
    unsigned char *data;
    kvc_result r;
    if (tr->store_down) return KVC_ERR_IO;
    r = tr->cfg.store.exists(tr->cfg.store.user, key, &size, tr->cfg.timeout_ms);
    if (r != KVC_OK) {
        if (r != KVC_ERR_NOT_FOUND) tr->stats.store_errors++, tr->store_down = 1;
        return r;
    }
    if (size == 0 || size > tr->cfg.max_blob_bytes) { tr->stats.refused++; return KVC_ERR_RANGE; }
    if ((data = (unsigned char *)kvc__alloc(p, size)) == NULL) return KVC_ERR_NO_MEMORY;
    r = tr->cfg.store.get(tr->cfg.store.user, key, data, size, &got, tr->cfg.timeout_ms);
    if (r == KVC_OK && got > size) r = KVC_ERR_RANGE; /* a store that does not keep to capacity */
    if (r != KVC_OK) {
        if (r != KVC_ERR_NOT_FOUND) tr->stats.store_errors++, tr->store_down = 1;
        kvc__free(p, data);
        return r;
    }
    r = kvc__tier_load(t, ns, data, got, want, x);
    if (r == KVC_OK) {
        tr->stats.fetched_store++;
        tr->stats.tokens_fetched += (uint64_t)x;
    } else if (kvc__tier_refusal(r)) {
        tr->stats.refused++;
    }
    kvc__free(p, data);
    return r;
}

static kvc_result kvc__tier_fetch_held(kvc_radix *t, kvc_namespace ns, const int32_t *tokens, int32_t n,
                                       int32_t *n_fetched) {
    kvc__tier *tr;
    kvc__rnode *at;
    kvc_key *keys;
    int32_t m, nb, i, b;
    kvc_result r = KVC_ERR_NOT_FOUND;
    if (t == NULL || n_fetched == NULL) return KVC_ERR_NULL;
    if (kvc__check_tokens(tokens, n, 0) != KVC_OK) return kvc__check_tokens(tokens, n, 0);
    *n_fetched = 0;
    if ((tr = t->tier) == NULL) return KVC_ERR_STATE;
    tr->store_down = 0; /* one more try per fetch: a store back up is used again */
    b = tr->block;
    nb = n / b;
    at = kvc__radix_walk(t, ns, tokens, n, &m);
    m = kvc__radix_usable(t, &at, m); /* what the tree serves now */
    if (nb * b <= m || (tr->newest == NULL && !tr->has_store)) return KVC_OK;
    keys = (kvc_key *)kvc__alloc(t->part[0].pool, sizeof(kvc_key) * ((size_t)nb + 1));
    if (keys == NULL) return KVC_ERR_NO_MEMORY;
    kvc__tier_k0(t, ns, &keys[0]);
    for (i = 0; i < nb; ++i) kvc__tier_next(&keys[i], tokens + (size_t)i * (size_t)b, b, &keys[i + 1]);
    for (i = nb; i > 0 && i * b > m; --i) {
        r = kvc__tier_from_host(t, ns, &keys[i], tokens, i * b);
        if (r != KVC_OK && tr->has_store) r = kvc__tier_from_store(t, ns, &keys[i], tokens, i * b);
        if (r == KVC_OK) { *n_fetched = i * b; break; }
        if (r == KVC_ERR_FULL || r == KVC_ERR_NO_MEMORY) break; /* a shorter one would not fit either */
    }
    kvc__free(t->part[0].pool, keys);
    return r == KVC_ERR_NO_MEMORY ? r : KVC_OK;
}

KVCDEF kvc_result kvc_tier_fetch(kvc_radix *t, kvc_namespace ns, const int32_t *tokens, int32_t n_tokens,
                                 int32_t *n_fetched) {
    KVC__POOL_LOCKED(t, t->part[0].pool, kvc__tier_fetch_held(t, ns, tokens, n_tokens, n_fetched));
}

static kvc_result kvc__tier_publish_held(kvc_radix *t, kvc_namespace ns, const int32_t *tokens, int32_t n,
                                         int32_t *n_published) {
    kvc__tier *tr;
    kvc__blob blob;
    kvc_key key;
    kvc_result r;
    int32_t x;
    if (t == NULL) return KVC_ERR_NULL;
    if ((r = kvc__check_tokens(tokens, n, 0)) != KVC_OK) return r;
    if (n_published) *n_published = 0;
    if ((tr = t->tier) == NULL || !tr->has_store) return KVC_ERR_STATE;
    tr->store_down = 0;
    if ((x = kvc__tier_savable(t, ns, tokens, n, 0)) == 0) return KVC_OK;
    if ((r = kvc__tier_save(t, ns, tokens, x, &blob)) != KVC_OK) return r;
    kvc__tier_key_of(t, ns, tokens, x / tr->block, &key);
    r = kvc__store_put(tr, &key, blob.data, blob.size);
    kvc__free(t->part[0].pool, blob.data);
    if (r == KVC_OK && n_published) *n_published = x;
    return r;
}

KVCDEF kvc_result kvc_tier_publish(kvc_radix *t, kvc_namespace ns, const int32_t *tokens, int32_t n_tokens,
                                   int32_t *n_published) {
    KVC__POOL_LOCKED(t, t->part[0].pool, kvc__tier_publish_held(t, ns, tokens, n_tokens, n_published));
}

static kvc_result kvc__tier_flush_held(kvc_radix *t) {
    kvc__tier *tr;
    kvc__tblob *b, *prev;
    kvc_result r, first = KVC_OK;
    if (t == NULL) return KVC_ERR_NULL;
    if ((tr = t->tier) == NULL || !tr->has_store) return KVC_ERR_STATE;
    tr->store_down = 0;
    for (b = tr->oldest; b != NULL; b = prev) {
        prev = b->prev;
        r = kvc__store_put(tr, &b->key, b->data, b->size);
        if (r != KVC_OK) { if (first == KVC_OK) first = r; continue; }
        kvc__tblob_unlink(tr, b);
        kvc__tblob_free(t->part[0].pool, b);
    }
    return first;
}

KVCDEF kvc_result kvc_tier_flush(kvc_radix *t) {
    KVC__POOL_LOCKED(t, t->part[0].pool, kvc__tier_flush_held(t));
}

static kvc_result kvc__tier_stats_held(const kvc_radix *t, kvc_tier_stats *s) {
    if (t == NULL || s == NULL) return KVC_ERR_NULL;
    if (t->tier == NULL) return KVC_ERR_STATE;
    *s = t->tier->stats;
    s->host_bytes = t->tier->host_used;
    return KVC_OK;
}

KVCDEF kvc_result kvc_tier_stats_get(const kvc_radix *t, kvc_tier_stats *s) {
    KVC__POOL_LOCKED(t, t->part[0].pool, kvc__tier_stats_held(t, s));
}

#ifndef KVCACHE_NO_STDIO
/* The directory store: "<dir>/<key hex>.kvc". */
static kvc_result kvc__dir_path(void *user, const kvc_key *key, char *path) {
    const kvc_store_dir_state *s = (const kvc_store_dir_state *)user;
    size_t len = strlen(s->dir);
    if (len + 1 + 64 + 4 >= KVC_PATH_MAX) return KVC_ERR_RANGE;
    memcpy(path, s->dir, len);
    path[len] = '/';
    kvc_key_hex(key, path + len + 1);
    memcpy(path + len + 65, ".kvc", 5);
    return KVC_OK;
}

static kvc_result kvc__dir_put(void *user, const kvc_key *key, const void *data, size_t size, int32_t timeout_ms) {
    char path[KVC_PATH_MAX];
    kvc_path_io st;
    kvc_io io;
    kvc_result r;
    int ok;
    (void)timeout_ms;
    if ((r = kvc__dir_path(user, key, path)) != KVC_OK) return r;
    if ((r = kvc_io_path(&st, path, 1, &io)) != KVC_OK) return r;
    ok = io.write(io.user, data, size) == size;
    if (io.finish(io.user, ok) != 0) ok = 0; /* renames it into place, or removes it */
    return ok ? KVC_OK : KVC_ERR_IO;
}

/* Opens the blob's file; *size its bytes. */
static kvc_result kvc__dir_open(void *user, const kvc_key *key, FILE **f, size_t *size) {
    char path[KVC_PATH_MAX];
    long end;
    kvc_result r;
    if ((r = kvc__dir_path(user, key, path)) != KVC_OK) return r;
    if ((*f = fopen(path, "rb")) == NULL) return KVC_ERR_NOT_FOUND;
    if (fseek(*f, 0, SEEK_END) != 0 || (end = ftell(*f)) < 0 || fseek(*f, 0, SEEK_SET) != 0) {
        fclose(*f);
        return KVC_ERR_IO;
    }
    *size = (size_t)end;
    return KVC_OK;
}

static kvc_result kvc__dir_exists(void *user, const kvc_key *key, size_t *size, int32_t timeout_ms) {
    FILE *f;
    kvc_result r;
    (void)timeout_ms;
    if ((r = kvc__dir_open(user, key, &f, size)) != KVC_OK) return r;
    fclose(f);
    return KVC_OK;
}

static kvc_result kvc__dir_get(void *user, const kvc_key *key, void *data, size_t capacity, size_t *size,
                               int32_t timeout_ms) {
    FILE *f;
    kvc_result r;
    (void)timeout_ms;
    if ((r = kvc__dir_open(user, key, &f, size)) != KVC_OK) return r;
    if (*size > capacity) r = KVC_ERR_RANGE;
    else if (fread(data, 1, *size, f) != *size) r = KVC_ERR_IO;
    fclose(f);
    return r;
}

static kvc_result kvc__dir_erase(void *user, const kvc_key *key, int32_t timeout_ms) {
    char path[KVC_PATH_MAX];
    kvc_result r;
    (void)timeout_ms;
    if ((r = kvc__dir_path(user, key, path)) != KVC_OK) return r;
    return remove(path) == 0 ? KVC_OK : KVC_ERR_NOT_FOUND;
}

KVCDEF kvc_result kvc_store_dir(kvc_store_dir_state *state, const char *dir, kvc_store *store) {
    size_t len;
    if (state == NULL || dir == NULL || store == NULL) return KVC_ERR_NULL;
    len = strlen(dir);
    if (len == 0) return KVC_ERR_INVALID;
    if (len + 1 + 64 + 4 + 32 >= KVC_PATH_MAX) return KVC_ERR_RANGE; /* + kvc_io_path's temporary suffix */
    memset(state, 0, sizeof(*state));
    memcpy(state->dir, dir, len + 1);
    memset(store, 0, sizeof(*store));
    store->put = kvc__dir_put;
    store->exists = kvc__dir_exists;
    store->get = kvc__dir_get;
    store->erase = kvc__dir_erase;
    store->user = state;
    return KVC_OK;
}
#endif
/* ==== The backend interface: what kvcache_vk.h may touch ==============================
   kvcache_vk.h is compiled in the same file as this implementation and reads the host
   bookkeeping directly (it keeps pool, pages, cells and page tables here and mirrors only
   K/V bytes and the metadata its shaders read). This block is the whole of what it uses
   besides the public API and the page events; a change to anything named here is a change
   to the backend too (make check builds test_vk's code; the prototypes below must match
   their definitions above, so a changed signature fails to compile here first).
   Macros: KVC__MIN, KVC__MAX, KVC__NO_PAGE. Types: kvc__iter and kvc__run (a cache's
   cells as runs of pages), kvc__ranges (kvc__view), kvc__query (kvc__query_of).
   struct kvc_pool (a vk pool's `host`): cfg (its shape and rotate), page_cells, max_pages,
     k_row, v_row, tk / tv (the storage types' converters), rot_k / rot_v, refcount,
     free_pages, n_free, page_hw (kvc_vk_pool_cmd_trim lowers the high-water mark and
     restacks the free pages lowest first), live_caches / live_snapshots / live_prefixes,
     owned (a vk pool owns its host pool), alloc.
   struct kvc_cache: pool, cfg (kind, window, sinks, chunk, max_seqs), offset, pages,
     n_pages, capacity, words, seqs, seq_lo / seq_hi, batch_begin, batch_loc / batch_n,
     batch_pending / batch_put (kvc_vk_cmd_append marks a layer put), batch_has,
     state_page, states_open, pend / n_pend / pend_done (a RECURRENT batch's checkpoints:
     kvc_vk_cmd_state_checkpoint fills them as kvc_state_checkpoint does).
   struct kvc_snapshot: to, pages (a pending checkpoint's state page).
   struct kvc_memory / kvc__mpools: mp, refs, pool[], layer_group[] (kvc_vk_memory_* map
     layers and groups to device pools, and refuse a destroy while forks live).
   Functions: */
static void *kvc__default_alloc(size_t size, void *user);
static void kvc__default_free(void *ptr, void *user);
static void kvc__rot_one(float *x, int32_t i0, int32_t n, int inverse); /* its rounding, which the shaders copy */
static int32_t *kvc__pos_at(const kvc_pool *p, uint32_t page, int32_t cell);
static int32_t *kvc__cell_pos(const kvc_cache *c, int32_t cell);
static int32_t kvc__lpage_index(const kvc_cache *c, int32_t lp);
static int32_t kvc__recent_window(const kvc_cache *c);
static kvc__ranges kvc__view(const kvc_cache *c);
static void kvc__iter_init(kvc__iter *it, const kvc_cache *c);
static int kvc__iter_next(kvc__iter *it, kvc__run *run);
static int kvc__batch_open(const kvc_cache *c);
static int kvc__is_recurrent(const kvc_cache *c);
static kvc_result kvc__check_attention(const kvc_cache *c, int32_t layer, const kvc_attention_desc *d);
static kvc__query kvc__query_of(const kvc_cache *c, const kvc_attention_desc *d, int32_t qi);
/* ==== end of the backend interface ==================================================== */

#endif /* KVCACHE_IMPLEMENTATION_DONE */
#endif /* KVCACHE_IMPLEMENTATION */

/*
------------------------------------------------------------------------------
This software is available under 2 licenses -- choose whichever you prefer.
------------------------------------------------------------------------------
ALTERNATIVE A - MIT License
Copyright (c) 2026 the kvcache.h authors
Permission is hereby granted, free of charge, to any person obtaining a copy of
this software and associated documentation files (the "Software"), to deal in
the Software without restriction, including without limitation the rights to
use, copy, modify, merge, publish, distribute, sublicense, and/or sell copies
of the Software, and to permit persons to whom the Software is furnished to do
so, subject to the following conditions:
The above copyright notice and this permission notice shall be included in all
copies or substantial portions of the Software.
THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,
FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE
AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER
LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,
OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE
SOFTWARE.
------------------------------------------------------------------------------
ALTERNATIVE B - Public Domain (www.unlicense.org)
This is free and unencumbered software released into the public domain.
Anyone is free to copy, modify, publish, use, compile, sell, or distribute this
software, either in source code form or as a compiled binary, for any purpose,
commercial or non-commercial, and by any means.
In jurisdictions that recognize copyright laws, the author or authors of this
software dedicate any and all copyright interest in the software to the public
domain. We make this dedication for the benefit of the public at large and to
the detriment of our heirs and successors. We intend this dedication to be an
overt act of relinquishment in perpetuity of all present and future rights to
this software under copyright law.
THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,
FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE
AUTHORS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER LIABILITY, WHETHER IN AN
ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM, OUT OF OR IN CONNECTION
WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE SOFTWARE.
For more information, please refer to <https://unlicense.org>
------------------------------------------------------------------------------
*/
