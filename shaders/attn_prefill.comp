#version 450
// attn_prefill.comp - attention for many queries of one cache (prefill), f16 keys and values:
// flash attention over query tiles. attn_split.comp's partials, another schedule: a
// workgroup takes one kv head, a tile of up to TQ consecutive jobs (queries) of one cache
// that share its view (kvcache_vk.h's tile records: first job, count, cells walked, cells
// every query sees), with every query head of the kv head's GQA group, and one chunk of
// cells (split-K as attn_split; the merge is attn_merge, unchanged). Its rows are (query,
// head) pairs, row R = query R / G, head R % G, 16 rows per subgroup of 32 invocations (RB
// of them: TQ = 16 RB / G), and it walks its chunk in tiles of TC cells, K and V read once
// per tile for all its rows:
//   cells    one invocation per cell: where it is (page table) and its position; then per
//            (query, cell) the mask rules of attn_common.glsl's cell_visible, as bit words
//            (a tile no query sees is skipped; V rows no query sees are zeros), except in
//            the leading cells every query sees (no masks made or read there);
//   stage    the tile's K and V rows into shared memory, 16 bytes per load;
//   scores   S = Q K^T for each subgroup's 16 rows (the cooperative-matrix build, USE_CM:
//            16 x 16 x 16 f16 products into f32 on the tensor cores, the queries split into
//            hi + lo * 2^-12 halves as attn_split_cm.comp does, each row scaled by its own
//            power of two into (-1, 1); the plain build: f32 dot products);
//   softmax  running max, weights p = exp2(s - m), rescale factors (attn_split_cm.comp's
//            rules, non-finite scores +inf); USE_CM: on S's accumulators in registers, each
//            row's maximum across the four lanes that hold it (the layout that
//            shaders/cm_layout.comp checks); plain: two invocations per row through shared
//            memory, each half of its cells;
//   values   O += P V (USE_CM: P split hi / lo the same way, converted from accumulators to
//            the product's operands in registers, O in accumulators rescaled element by
//            element; plain: each invocation holds half of its row's values).
// Written out as attn_split.comp does: (max, sum, unnormalised output) per query head, for
// attn_merge or (rows 16 bytes longer) attn_merge_rows; or, where the call has one split (and
// values not rotated), as the output itself (attn_merge.comp's rules: the head's sink, the
// log-sum-exp, a row of NaN), and the host records no merge pass after it.
// The tensor-core build is made twice: on VK_NV_cooperative_matrix (attn_prefill_cm) and, with
// -DKHR=1, on VK_KHR_cooperative_matrix's typed matrices (attn_prefill_khr, where the device has
// them: KVC_VK_FEATURE_KHR_MATRIX), whose K and V fragments need no transposes in registers.
#extension GL_EXT_control_flow_attributes : require
#ifndef KHR
#define KHR 0
#endif
#if USE_CM
#if KHR // (glslang 15 or later: shaders/embed.sh)
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_NV_cooperative_matrix2 : require
#else
#extension GL_NV_cooperative_matrix : require
#endif
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_ballot : require
#extension GL_KHR_shader_subgroup_shuffle : require
#extension GL_KHR_shader_subgroup_vote : require
#extension GL_KHR_memory_scope_semantics : require
#endif
#include "kvc_shared.glsl"
layout(constant_id = PREFILL_HDK) const uint HDK = 128u;  // multiples of 8 (USE_CM: 16), at most 128
layout(constant_id = PREFILL_HDV) const uint HDV = 128u;
layout(constant_id = PREFILL_G) const uint G = 4u;        // query heads per kv head, at most 16 RB
layout(constant_id = PREFILL_KV_HEADS) const uint KV_HEADS = 8u;
layout(constant_id = PREFILL_PAGE_CELLS) const uint PAGE_CELLS = 256u;
// The tile shape is fixed at compile time (kvcache_vk.h's KVC_VK__PREFILL_TC / _RB hold the
// same numbers): the shared arrays are sized by constants, for head dims up to 128 and any
// group (lavapipe gave arrays sized by specialization constants 8 bytes of shared memory)
#ifndef PF_TC
#define PF_TC 32
#endif
#ifndef PF_RB
#define PF_RB 4
#endif
#ifndef PF_NOLO
#define PF_NOLO 0 // (timing only: 1 drops the lo halves' products, at f16 accuracy)
#endif
const uint TC = PF_TC;                                    // cells per tile: 16, 32 or 64
const uint RB = PF_RB;                                    // blocks of 16 rows (subgroups)
layout(local_size_x = 32 * PF_RB) in;

layout(set = 0, binding = 0) readonly buffer KB { uvec4 kb[]; };
layout(set = 0, binding = 1) readonly buffer VB { uvec4 vb[]; };
layout(set = 0, binding = 2) readonly buffer MB { uint meta[]; };
layout(set = 0, binding = 3) readonly buffer QB { float qb[]; };
layout(set = 0, binding = 4) writeonly buffer PB { float part[]; };
layout(set = 0, binding = 5) writeonly buffer OB { float outv[]; }; // (one split) the output
layout(set = 0, binding = 6) writeonly buffer LB { float lsev[]; }; //   and the log-sum-exps, where asked

layout(push_constant) uniform PC {
    uint job_off;
    uint tile_off;    // meta word of the tile records (first job, jobs, cells walked, cells all see), four words a tile
    uint chunk;       // cells per split (a multiple of TC)
    uint n_splits;
    uint k_row_bytes;
    uint v_row_bytes;
    float scale_log2;
    float softcap2;   // logit soft-capping in base 2 (softcap * log2(e)); 0: off
    uint out_mode;    // 0: partials for attn_merge (rows of HDV + 2 floats), 1: the call's one split,
                      // its output written here (no merge pass), 2: partials for attn_merge_rows
                      // (attn_onedisp.glsl's rows: HDV + 4 floats, the values 16 bytes in)
} pc;

#include "attn_common.glsl"
#if USE_CM
#include "cm_layout.glsl"
#endif

const uint NT = 32u * RB;                         // invocations
const uint ROWS = 16u * RB;                       // rows (query, head) of the workgroup
const uint TQ = ROWS / G;                         // queries of a tile at most (ROWS for the arrays)
const uint WQ = (TC + 31u) / 32u;                 // mask words per query
const uint CK = HDK / 8u, CV = HDV / 8u;          // 16-byte pieces of a head row
const uint SK = CK + 1u, SV = CV + 1u;            // shared row strides (+16 bytes: no bank conflicts)
const uint SMAX = 17u;                            // ... at head dim 128
const uint KV_WORDS = TC * 2u * SMAX;             // the tile's K rows, then its V rows (at TC SK)
#if USE_CM
const uint QP = RB < 4u ? RB : 4u;                // subgroups staging their queries at once (kv's size)
const uint Q_WORDS = 16u * QP * SMAX;             // the queries' halves, staged
#else
const uint Q_WORDS = 0u;
#endif
const uint PW = TC / 2u;                          // cells of a row per invocation in the softmax
const float NEG_INF = -1.0 / 0.0;
const float HI = 2048.0, INV_HI = 1.0 / 2048.0, LO = 4096.0, INV_LO = 1.0 / 4096.0;

const uint SST = TC + 4u;                         // ss row stride (+16 bytes: 2-way bank conflicts, not 16)
const uint PK = (TC * 16u + NT - 1u) / NT;        // K (V) pieces a thread stages at most (head dims <= 128)

shared uvec4 kv[KV_WORDS > Q_WORDS ? KV_WORDS : Q_WORDS];
#if !USE_CM
shared float ss[ROWS * SST];                      // S, row-major (row, cell); then P over it
#endif
// Two tiles in flight: tile t's cells and masks are made while tile t - 1 is multiplied
// (buffer t % 2), its K and V rows are loaded into registers then and staged at tile t.
shared uint cgid[2 * TC];                         // the tile's cells: where
shared int ckey[2 * TC];                          //   their positions
shared uint cok[2 * TC];                          //   nonzero: in the chunk and of the tile's sequence
shared uint vis[2 * ROWS * WQ];                   // (query, cell) visible: bit c % 32 of word q WQ + c / 32
shared uint sseen[2 * WQ];                        // the cells some query sees (the OR of the tile's vis words)
shared int jpos[ROWS], jwin[ROWS];                // the tile's queries: positions, windows
shared uint jnc[ROWS];                            //   non-causal
#if USE_CM
#if KHR
// (VK_KHR_cooperative_matrix) matrices typed by their place in a product, so that K^T and V are
// loaded as the product reads its B operand; NV_cooperative_matrix's untyped ones were loaded,
// then transposed in registers (a MOVM per register on the H200, 143 a tile); P's conversion
// from an accumulator to an A operand is VK_NV_cooperative_matrix2's
#define MATA coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA>
#define MATB coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB>
#define MATC coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>
#define LOAD_ROWS(m, buf, at, stride) coopMatLoad(m, buf, at, stride, gl_CooperativeMatrixLayoutRowMajor)
#define LOAD_COLS(m, buf, at, stride) coopMatLoad(m, buf, at, stride, gl_CooperativeMatrixLayoutColumnMajor)
#define MUL_ADD coopMatMulAdd
#else
#define MATA fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>
#define MATB MATA
#define MATC fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>
#define LOAD_ROWS(m, buf, at, stride) coopMatLoadNV(m, buf, at, stride, false)
#define LOAD_COLS(m, buf, at, stride) coopMatLoadNV(m, buf, at, stride, true)
#define MUL_ADD coopMatMulAddNV
#endif
shared float rsc[ROWS];                           // each row's query scale (a power of two)
shared uint rbad[ROWS];                           // nonzero: the row's query holds a NaN or an infinity
void sync_sg() {
    controlBarrier(gl_ScopeSubgroup, gl_ScopeSubgroup, gl_StorageSemanticsShared, gl_SemanticsAcquireRelease);
}
#else
shared float red[NT];                             // the row partner's max / sum
#endif

// The vi-th cell of the view (J: the tile's first job) in two steps, so that its loads are
// not waited for where they are issued: cell_raw reads its words (kind 0: the page-table
// entry; kind 1: the page-table entry, the sequence word, the position), cell_where makes
// them where the cell is, its position, and whether it is of the query's sequence (CAUSAL;
// every query of a tile has the same one). The per-query rules are query_sees's: together
// cell_visible's.
uvec3 cell_raw(Job J, uint vi) {
    if (J.kind == 0u) {
        uint n0 = J.e0 - J.b0, t = vi < n0 ? J.b0 + vi : J.b1 + (vi - n0), lp = t / PAGE_CELLS;
        uint idx = lp < J.nsink ? lp : J.nsink + (lp - J.lp_base);
        return uvec3(meta[J.pt_off + idx], 0u, 0u);
    }
    uint cell = J.b1 + vi;
    return uvec3(meta[J.pt_off + cell / PAGE_CELLS], meta[J.cseq_off + cell * J.words + (J.qseq >> 5)],
                 meta[J.cpos_off + cell]);
}
bool cell_where(Job J, uint vi, uvec3 raw, out uint gid, out int key) {
    if (J.kind == 0u) {
        uint n0 = J.e0 - J.b0, t = vi < n0 ? J.b0 + vi : J.b1 + (vi - n0);
        gid = raw.x * PAGE_CELLS + t % PAGE_CELLS;
        key = int(t);
        return true;
    }
    gid = raw.x * PAGE_CELLS + (J.b1 + vi) % PAGE_CELLS;
    key = int(raw.z);
    return ((raw.y >> (J.qseq & 31u)) & 1u) != 0u;
}
bool query_sees(Job J, int key, int qpos, uint nc, int win) {
    if (J.kind == 0u) {
        if (J.recent > 0 && key >= J.sinks && key < qpos - J.recent + 1) return false;
    } else {
        if (J.cwin > 0 && key <= qpos - J.cwin) return false;
        if (J.chunk > 0 && key / J.chunk != qpos / J.chunk) return false;
    }
    if (nc == 0u && key > qpos) return false;
    if (win > 0 && key <= qpos - win) return false;
    return true;
}
bool sees(Job J, uint b, uint q, uint c) { // b: the tile's buffer
    return c < TC && cok[b * TC + c] != 0u && query_sees(J, ckey[b * TC + c], jpos[q], jnc[q], jwin[q]);
}

// x (|x| <= 1) as hi + lo * 2^-12 with hi a multiple of 2^-11: both exact in f16 but lo's last bits
vec2 split(float x) {
    float hi = floor(x * HI + 0.5) * INV_HI;
    return vec2(hi, (x - hi) * LO);
}

float half_at(uvec4 w, uint i) { // value i (0..7) of 8 halves
    vec2 v = unpackHalf2x16(w[i / 2u]);
    return (i & 1u) != 0u ? v.y : v.x;
}

// Tile `base`'s cells from their raw words (threads tid < TC), into buffer b; its seen word zeroed
void stage_cells(Job J, uint b, uint base, uint c1, uint tid, uvec3 raw) {
    if (tid < TC) {
        uint vi = base + tid, g = 0u;
        int key = 0;
        bool ok = vi < c1 && cell_where(J, vi, raw, g, key);
        cgid[b * TC + tid] = ok ? g : 0u; // (a cell no query sees: cell 0 of page 0, in bounds)
        ckey[b * TC + tid] = key;
        cok[b * TC + tid] = ok ? 1u : 0u;
    }
    if (tid < WQ) sseen[b * WQ + tid] = 0u;
}

// Tile b's masks: vis words per (query, 32 cells), and their OR into sseen
void make_masks(Job J, uint b, uint nq, uint tid) {
#if USE_CM
    uint sg = tid / 32u, lane = tid % 32u;
    for (uint w = sg; w < TQ * WQ; w += RB) {
        uint q = w / WQ, c = (w % WQ) * 32u + lane;
        uint bits = subgroupBallot(q < nq && sees(J, b, q, c)).x;
        if (lane == 0u) {
            vis[b * ROWS * WQ + w] = bits;
            if (bits != 0u) atomicOr(sseen[b * WQ + w % WQ], bits);
        }
    }
#else
    for (uint w = tid; w < TQ * WQ; w += NT) {
        uint q = w / WQ, bits = 0u;
        for (uint k = 0u; k < 32u; ++k)
            if (q < nq && sees(J, b, q, (w % WQ) * 32u + k)) bits |= 1u << k;
        vis[b * ROWS * WQ + w] = bits;
        if (bits != 0u) atomicOr(sseen[b * WQ + w % WQ], bits);
    }
#endif
}

// A row's end where the call has one split (out_mode 1), by attn_merge.comp's rules
// (attn_common.glsl's softmax_end) from M and L (the row's base-2 maximum and sum): f, the
// factor of its unnormalised values (zero where nothing was seen, NaN for a bad row: its
// query, or a score, not finite); its log-sum-exp written where the job asks for it (by one
// invocation of the row: lse_lane). Returns the output's first float.
uint row_end(uint jb, uint head, float M, float L, bool bad, bool lse_lane, out float f) {
    uint jw = pc.job_off + jb * JOB_STRIDE, so = meta[jw + JOB_SINK_OFF], lo = meta[jw + JOB_LSE_OFF];
    float fM, Lt, lse = softmax_end(M, L, head_sink(so, head), fM, Lt), nan_ = uintBitsToFloat(0x7fc00000u);
    bad = bad || M == POS_INF;
    if (lse_lane && lo != 0xffffffffu) lsev[lo + head] = bad ? nan_ : lse;
    f = bad ? nan_ : Lt > 0.0 ? fM / Lt : 0.0;
    return meta[jw + JOB_OUT_OFF] + head * HDV;
}

void main() {
    // the tiles last to first: a prompt's last queries see the most cells, so the longest
    // workgroups start first and the short ones fill in behind them
    uint kvh = gl_WorkGroupID.x, split_id = gl_WorkGroupID.y, tile = gl_NumWorkGroups.z - 1u - gl_WorkGroupID.z;
    uint tid = gl_LocalInvocationID.x, R = tid / 2u, h = tid & 1u;
    uint j0 = meta[pc.tile_off + 4u * tile], nq = meta[pc.tile_off + 4u * tile + 1u];
    Job J = load_job(pc.job_off, j0);
    // the cells the tile walks (at most the view's: the view's cells past the tile's last
    // position are skipped, not walked masked, kvc_vk__prefill_bound), and [0, all_see) of
    // them, which every query of the tile sees (kvc_vk__prefill_seen_by_all): a tile within
    // them (base + TC <= all_see) makes no masks
    uint c0 = split_id * pc.chunk, c1 = min(c0 + pc.chunk, meta[pc.tile_off + 4u * tile + 2u]);
    uint all_see = meta[pc.tile_off + 4u * tile + 3u];
    for (uint q = tid; q < TQ; q += NT) {
        uint b = pc.job_off + (j0 + q) * JOB_STRIDE;
        jpos[q] = q < nq ? int(meta[b + JOB_QPOS]) : 0;
        jwin[q] = q < nq ? int(meta[b + JOB_WIN]) : 0;
        jnc[q] = q < nq ? meta[b + JOB_NC] : 0u;
    }
    // the first tile's cells; the second's raw words
    uvec3 raw = tid < TC && c0 + tid < c1 ? cell_raw(J, c0 + tid) : uvec3(0u);
    stage_cells(J, 0u, c0, c1, tid, raw);
    raw = tid < TC && c0 + TC + tid < c1 ? cell_raw(J, c0 + TC + tid) : uvec3(0u);
    // this invocation's row: query rq of the tile, head rg
    uint rq = R / G, rg = R % G;
    bool row_ok = rq < nq;
    uint q0 = row_ok ? meta[pc.job_off + (j0 + rq) * JOB_STRIDE + JOB_Q_OFF] + (kvh * G + rg) * HDK : 0u;
    float rscale = pc.scale_log2;                  // S to base-2 scores

#if USE_CM
    uint sg = tid / 32u, lane = tid % 32u;
    // Q: each row scaled to base 2 and by a power of two into (-1, 1) (its own: a row holding a
    // NaN or an infinity must not change the other rows' bits), split hi / lo, staged through
    // kv one half at a time (the subgroup's 16 rows at (sg % QP) * 16 SK, QP subgroups a
    // pass), kept as fragments
    uint qm = 0u, qbad = 0u;
    for (uint d = h; d < HDK; d += 2u) {
        float x = row_ok ? qb[q0 + d] : 0.0;
        uint a = floatBitsToUint(abs(x * pc.scale_log2));
        if (a < 0x7f800000u) qm = max(qm, a);
        if (nonfinite(x)) qbad = 1u;
    }
    qm = max(qm, subgroupShuffleXor(qm, 1u));
    qbad = max(qbad, subgroupShuffleXor(qbad, 1u));
    int qe = 0;
    float qmax = uintBitsToFloat(qm);
    if (qmax > 0.0) frexp(qmax, qe);
    rscale = ldexp(1.0, qe);
    if (h == 0u) { rsc[R] = rscale; rbad[R] = qbad; }
    MATA qh[HDK / 16u], ql[HDK / 16u];
    for (uint pass = 0u; pass < (RB + QP - 1u) / QP; ++pass) { // QP subgroups at a time (uniform)
        if (sg / QP == pass) {
            uint qr = (sg % QP) * 16u + R % 16u; // the row's place in kv
            [[unroll]] for (uint part_lo = 0u; part_lo < 2u; ++part_lo) {
                for (uint p2 = h; p2 < HDK / 2u; p2 += 2u) {
                    uint d = 2u * p2;
                    vec2 x = row_ok ? vec2(qb[q0 + d], qb[q0 + d + 1u]) * pc.scale_log2 : vec2(0.0);
                    x = ldexp(x, ivec2(-qe));
                    vec2 a = split(x.x), b = split(x.y);
                    kv[qr * SK + d / 8u][(d / 2u) % 4u] = packHalf2x16(part_lo == 0u ? vec2(a.x, b.x) : vec2(a.y, b.y));
                }
                sync_sg();
                [[unroll]] for (uint k = 0u; k < HDK / 16u; ++k) {
                    if (part_lo == 0u) LOAD_ROWS(qh[k], kv, (sg % QP) * 16u * SK + 2u * k, SK);
                    else LOAD_ROWS(ql[k], kv, (sg % QP) * 16u * SK + 2u * k, SK);
                }
                sync_sg();
            }
        }
        if (RB > QP) barrier();
    }
    MATC o[HDV / 16u];
    [[unroll]] for (uint t = 0u; t < HDV / 16u; ++t) o[t] = MATC(0.0);
    // S, P and O stay in registers: this lane's elements of a 16 x 16 accumulator (and of
    // an f16 matrix converted from one) are placed as cm_layout.glsl says: 0-3 in row rlo of
    // the subgroup's 16, 4-7 in row rhi, element i in column c4 + (i & 1) + 8 ((i >> 1) & 1).
    uint rlo = sg * 16u + cm_row(lane, 0u, 2u), rhi = sg * 16u + cm_row(lane, 4u, 2u), c4 = cm_col(lane, 0u, 2u);
    uint qlo = rlo / G, qhi = rhi / G;
    bool oklo = qlo < nq, okhi = qhi < nq;
    float mlo = NEG_INF, mhi = NEG_INF, llo = 0.0, lhi = 0.0;
#else
    float o[64];                                   // values d = h, h + 2, ... of row R (HDV <= 128)
    [[unroll]] for (uint j = 0u; j < (HDV + 1u) / 2u; ++j) o[j] = 0.0;
    float m = NEG_INF, l = 0.0;
#endif

    // the first tile's masks and K / V rows (into registers)
    barrier();
#if USE_CM
    float rslo = rsc[rlo], rshi = rsc[rhi];
#endif
    if (c0 + TC > all_see) make_masks(J, 0u, nq, tid);
    uvec4 kr[PK], vr[PK];
    [[unroll]] for (uint k = 0u; k < PK; ++k) {
        uint i = tid + k * NT;
        if (i < TC * CK) kr[k] = kb[(cgid[i / CK] * pc.k_row_bytes + kvh * (HDK * 2u)) / 16u + i % CK];
        if (i < TC * CV) vr[k] = vb[(cgid[i / CV] * pc.v_row_bytes + kvh * (HDV * 2u)) / 16u + i % CV];
    }

    uint cur = 0u;                                 // the buffer of tile `base`
    for (uint base = c0; base < c1; base += TC, cur ^= 1u) {
        uint nb = cur ^ 1u;
        bool more = base + TC < c1, full = base + TC <= all_see;
        barrier(); // tile base's masks are made; the last tile's K, V, S are read
        // the cells some query sees; none: the tile is skipped (the same answer everywhere)
        uint seen[WQ];
        bool any = false;
        [[unroll]] for (uint w = 0u; w < WQ; ++w) {
            seen[w] = full ? ~0u : sseen[cur * WQ + w];
            any = any || seen[w] != 0u;
        }
        // stage K and V from the registers (V rows no query sees: zeros, their bytes may be anything)
        [[unroll]] for (uint k = 0u; k < PK; ++k) {
            uint i = tid + k * NT;
            if (i < TC * CK) kv[(i / CK) * SK + i % CK] = kr[k];
            if (i < TC * CV) {
                uint c = i / CV;
                bool hid = (seen[c / 32u] & (1u << (c % 32u))) == 0u;
                kv[TC * SK + c * SV + i % CV] = hid ? uvec4(0u) : vr[k];
            }
        }
        // the next tile's cells; the raw words of the one after
        if (more) {
            stage_cells(J, nb, base + TC, c1, tid, raw);
            raw = tid < TC && base + 2u * TC + tid < c1 ? cell_raw(J, base + 2u * TC + tid) : uvec3(0u);
        }
        barrier();
        // the next tile's K / V loads go out, then its masks are made, while this one is multiplied
        if (more) {
            [[unroll]] for (uint k = 0u; k < PK; ++k) {
                uint i = tid + k * NT;
                if (i < TC * CK) kr[k] = kb[(cgid[nb * TC + i / CK] * pc.k_row_bytes + kvh * (HDK * 2u)) / 16u + i % CK];
                if (i < TC * CV) vr[k] = vb[(cgid[nb * TC + i / CV] * pc.v_row_bytes + kvh * (HDV * 2u)) / 16u + i % CV];
            }
        }
        // (the masks in an if of their own, not in the loads': H200, 512 queries of 32 heads
        // over 4096 cells, 781-783 -> 738-742 us)
        if (more && base + 2u * TC > all_see) make_masks(J, nb, nq, tid);
        if (!any) continue;

#if USE_CM
        // S = Q K^T: the subgroup's 16 rows by the tile's cells
        MATC s[TC / 16u];
        [[unroll]] for (uint n = 0u; n < TC / 16u; ++n) {
            MATC sh = MATC(0.0), sl = MATC(0.0);
            [[unroll]] for (uint k = 0u; k < HDK / 16u; ++k) {
                MATB kt; // K^T (d x cell): the staged rows read column-major
                LOAD_COLS(kt, kv, n * 16u * SK + 2u * k, SK);
                sh = MUL_ADD(qh[k], kt, sh);
#if !PF_NOLO
                sl = MUL_ADD(ql[k], kt, sl);
#endif
            }
            s[n] = sh + sl * INV_LO;
        }
        // softmax on the accumulators: base-2 scores, soft-capped (the cap's branch outside
        // the loop), +inf where not finite, -inf where the row's query does not see the cell
        uint vlo[WQ], vhi[WQ];
        [[unroll]] for (uint w = 0u; w < WQ; ++w) {
            vlo[w] = !oklo ? 0u : full ? ~0u : vis[cur * ROWS * WQ + qlo * WQ + w];
            vhi[w] = !okhi ? 0u : full ? ~0u : vis[cur * ROWS * WQ + qhi * WQ + w];
        }
        float blo = NEG_INF, bhi = NEG_INF;
#define TILE_SCORES(SCORE)                                                                      \
        [[unroll]] for (uint n = 0u; n < TC / 16u; ++n)                                         \
            [[unroll]] for (uint i = 0u; i < 8u; ++i) {                                         \
                bool up = i >= 4u;                                                              \
                uint bit = 16u * (n % 2u) + c4 + (i & 1u) + 8u * ((i >> 1u) & 1u);              \
                float v = s[n][i] * (up ? rshi : rslo);                                         \
                float x = (((up ? vhi[n / 2u] : vlo[n / 2u]) >> bit) & 1u) != 0u ? SCORE : NEG_INF; \
                s[n][i] = x;                                                                    \
                if (up) bhi = max(bhi, x); else blo = max(blo, x);                              \
            }
        if (pc.softcap2 > 0.0) {
            TILE_SCORES(score_capped(v, pc.softcap2))
        } else {
            TILE_SCORES(score_finite(v))
        }
        blo = max(blo, subgroupShuffleXor(blo, 1u));
        blo = max(blo, subgroupShuffleXor(blo, 2u));
        bhi = max(bhi, subgroupShuffleXor(bhi, 1u));
        bhi = max(bhi, subgroupShuffleXor(bhi, 2u));
        float nlo = max(mlo, blo), nhi = max(mhi, bhi);
        float alo = nlo == NEG_INF ? 1.0 : exp2(mlo - nlo), ahi = nhi == NEG_INF ? 1.0 : exp2(mhi - nhi);
        mlo = nlo;
        mhi = nhi;
        llo *= alo;
        lhi *= ahi;
        // P = exp2(S - m) as hi + lo * 2^-12 halves, the A operands of P V (converted: an f16
        // matrix keeps its accumulator's element places)
        MATA pa[TC / 16u], pb[TC / 16u];
        [[unroll]] for (uint n = 0u; n < TC / 16u; ++n) {
            MATC plo = s[n];
            [[unroll]] for (uint i = 0u; i < 8u; ++i) {
                bool up = i >= 4u;
                float x = s[n][i], p = x == NEG_INF ? 0.0 : exp2(x - (up ? mhi : mlo));
                if (up) lhi += p; else llo += p;
                float hi = floor(p * HI + 0.5) * INV_HI;
                s[n][i] = hi;
                plo[i] = (p - hi) * LO;
            }
            pa[n] = MATA(s[n]);
            pb[n] = MATA(plo);
        }
        if (subgroupAny(alo != 1.0 || ahi != 1.0)) // the row maxima grew: O rescaled
            [[unroll]] for (uint t = 0u; t < HDV / 16u; ++t)
                [[unroll]] for (uint i = 0u; i < 8u; ++i) o[t][i] *= i >= 4u ? ahi : alo;
        [[unroll]] for (uint t = 0u; t < HDV / 16u; ++t) {
            MATC lo = MATC(0.0);
            [[unroll]] for (uint j = 0u; j < TC / 16u; ++j) {
                MATB vt;
                LOAD_ROWS(vt, kv, TC * SK + 16u * j * SV + 2u * t, SV); // V (cell x d)
                o[t] = MUL_ADD(pa[j], vt, o[t]);
#if !PF_NOLO
                lo = MUL_ADD(pb[j], vt, lo);
#endif
            }
            o[t] = o[t] + lo * INV_LO;
        }
#else
        // scores of the workgroup's rows into ss (row-major, stride SST)
        for (uint i = tid; i < ROWS * TC; i += NT) {
            uint r = i / TC, c = i % TC, qr = r / G;
            float s = 0.0;
            if (qr < nq) {
                uint qa = meta[pc.job_off + (j0 + qr) * JOB_STRIDE + JOB_Q_OFF] + (kvh * G + r % G) * HDK;
                for (uint p = 0u; p < CK; ++p) {
                    uvec4 kw = kv[c * SK + p];
                    [[unroll]] for (uint e = 0u; e < 8u; ++e) s += qb[qa + 8u * p + e] * half_at(kw, e);
                }
            }
            ss[r * SST + c] = s;
        }
        barrier();

        // softmax: this invocation takes cells h PW .. h PW + PW - 1 of row R, soft-capped in
        // base 2 (the cap's branch outside the loop), +inf where not finite
        float x[PW];
        float mb = NEG_INF;
        uint cb = h * PW, vw = !row_ok ? 0u : full ? ~0u : vis[cur * ROWS * WQ + rq * WQ + cb / 32u] >> (cb % 32u);
        if (pc.softcap2 > 0.0) {
            [[unroll]] for (uint i = 0u; i < PW; ++i) {
                float sc = score_capped(ss[R * SST + cb + i] * rscale, pc.softcap2);
                x[i] = ((vw >> i) & 1u) != 0u ? sc : NEG_INF;
                mb = max(mb, x[i]);
            }
        } else {
            [[unroll]] for (uint i = 0u; i < PW; ++i) {
                float sc = score_finite(ss[R * SST + cb + i] * rscale);
                x[i] = ((vw >> i) & 1u) != 0u ? sc : NEG_INF;
                mb = max(mb, x[i]);
            }
        }
        red[tid] = mb;
        barrier();
        mb = max(mb, red[tid ^ 1u]);
        float mn = max(m, mb);
        float alpha = mn == NEG_INF ? 1.0 : exp2(m - mn);
        m = mn;
        l *= alpha;
        barrier(); // ss and red are read
        [[unroll]] for (uint i = 0u; i < PW; ++i) {
            float p = x[i] == NEG_INF ? 0.0 : exp2(x[i] - mn);
            l += p;
            ss[R * SST + cb + i] = p;
        }
        barrier();
        [[unroll]] for (uint j = 0u; j < (HDV + 1u) / 2u; ++j) {
            uint d = 2u * j + h;
            if (d >= HDV) break;
            float acc = o[j] * alpha;
            for (uint c = 0u; c < TC; ++c) acc += ss[R * SST + c] * half_at(kv[TC * SK + c * SV + d / 8u], d % 8u);
            o[j] = acc;
        }
#endif
    }

    // out: each row's (max, sum, values) as attn_split.comp writes them, at its split's
    // partial row (the values po floats in); or (out_mode 1, uniform) its values times
    // row_end's factor, at its output
    bool direct = pc.out_mode == 1u;
    uint po = pc.out_mode == 2u ? 4u : 2u, stride = HDV + po;
#if USE_CM
    llo += subgroupShuffleXor(llo, 1u);
    llo += subgroupShuffleXor(llo, 2u);
    lhi += subgroupShuffleXor(lhi, 1u);
    lhi += subgroupShuffleXor(lhi, 2u);
    float flo = 1.0, fhi = 1.0;
    uint atlo, athi;
    if (direct) {
        atlo = oklo ? row_end(j0 + qlo, kvh * G + rlo % G, mlo, llo, rbad[rlo] != 0u, lane % 4u == 0u, flo) : 0u;
        athi = okhi ? row_end(j0 + qhi, kvh * G + rhi % G, mhi, lhi, rbad[rhi] != 0u, lane % 4u == 0u, fhi) : 0u;
    } else {
        atlo = (((j0 + qlo) * KV_HEADS * G + kvh * G + rlo % G) * pc.n_splits + split_id) * stride;
        athi = (((j0 + qhi) * KV_HEADS * G + kvh * G + rhi % G) * pc.n_splits + split_id) * stride;
        if (lane % 4u == 0u) {
            if (oklo) { part[atlo] = mlo; part[atlo + 1u] = llo; }
            if (okhi) { part[athi] = mhi; part[athi + 1u] = lhi; }
        }
        atlo += po;
        athi += po;
    }
    [[unroll]] for (uint t = 0u; t < HDV / 16u; ++t)
        [[unroll]] for (uint i = 0u; i < 8u; i += 2u) {
            bool up = i >= 4u;
            uint at = (up ? athi : atlo) + 16u * t + c4 + 8u * ((i >> 1u) & 1u);
            float f = up ? fhi : flo;
            if (up ? okhi : oklo) {
                if (direct) {
                    outv[at] = o[t][i] * f;
                    outv[at + 1u] = o[t][i + 1u] * f;
                } else {
                    part[at] = o[t][i];
                    part[at + 1u] = o[t][i + 1u];
                }
            }
        }
#else
    barrier();
    red[tid] = l;
    barrier();
    float lt = l + red[tid ^ 1u], f = 1.0;
    uint at0;
    if (direct) { // the row's query values, read again: a NaN or an infinity
        float bad = 0.0;
        for (uint d = h; d < HDK; d += 2u)
            if (row_ok && nonfinite(qb[q0 + d])) bad = 1.0;
        barrier();
        red[tid] = bad;
        barrier();
        at0 = row_ok ? row_end(j0 + rq, kvh * G + rg, m, lt, bad + red[tid ^ 1u] != 0.0, h == 0u, f) : 0u;
    } else {
        at0 = (((j0 + rq) * KV_HEADS * G + kvh * G + rg) * pc.n_splits + split_id) * stride;
        if (row_ok && h == 0u) {
            part[at0] = m;
            part[at0 + 1u] = lt;
        }
        at0 += po;
    }
    if (row_ok)
        [[unroll]] for (uint j = 0u; j < (HDV + 1u) / 2u; ++j) {
            uint d = 2u * j + h;
            if (d >= HDV) break;
            if (direct) outv[at0 + d] = o[j] * f;
            else part[at0 + d] = o[j];
        }
#endif
}
