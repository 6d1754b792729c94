#version 450
// attn_split_q.comp - decode attention, split-K pass, over q8_0 / q4_0 K and V held in the
// planar page layout (kvc_types.glsl: per page, the codes of each kv head's cells side by
// side, then their scales), head dims 64, 128 or 256 for both. A workgroup is one team of
// 32 invocations (a subgroup on NVIDIA) that takes one job, one kv head, GH query heads of
// its GQA group and one chunk of the job's cells. Every code load is a wide, coalesced
// one: invocation t reads 16 values of a head row (q8_0: 16 bytes, q4_0: 8 bytes) of K and
// of V, segment s = t % NSEG of cell t / NSEG of each load row (CPR cells a row); a tile
// is TR such rows (TILE cells), its loads issued a tile before they are used (its V codes
// copied into the invocation's own shared memory as the tile starts, so the next tile's K
// and V loads go out together, after this tile's scores). Per tile:
//   scores   each invocation's packed 8-bit dot products of its K segments with the
//            query's q8_0 codes (as the CPU scores block-typed keys; q4_0: nibbles, less 8
//            times the codes' sum), exact integers, into shared memory (q4_0: two heads
//            to a word); then the owner of a cell (invocation c % 32) adds its segments
//            block by block, times the block scales (one 8-byte load of the cell's scales);
//   softmax  running maxima per head (base 2), moved only by a tile with a score more
//            than SLACK above one (else one vote a tile: no cross-lane maxima, nothing
//            rescaled); the owner's weights times its cell's V scales, per block and head,
//            into shared memory;
//   values   each invocation sums those x the codes of its V segments, for its 16 values;
//            the CPR sums of a segment are added once, at the end of the split.
// Written out as (max, sum, unnormalised output) per query head for attn_merge.comp, as
// attn_split.comp writes them. Built four times: USE_SUBGROUP (subgroups of 32: sums by
// shuffles; otherwise shared memory) by USE_DOT (VK_KHR_shader_integer_dot_product; else
// the same integer sums by shifts and multiplies).
#extension GL_EXT_control_flow_attributes : require
#ifndef USE_DOT
#define USE_DOT 0
#endif
#if USE_SUBGROUP
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#extension GL_KHR_shader_subgroup_vote : require
#endif
#if USE_DOT
#extension GL_EXT_spirv_intrinsics : require
// OpSDot (4450) of two words of four signed bytes (PackedVectorFormat4x8Bit = 0)
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6018, 6019], id = 4450)
int sdot4x8(uint a, uint b, spirv_literal int packed_format);
int sdot(uint a, uint b) { return sdot4x8(a, b, 0); }
#else
int sdot(uint a, uint b) {
    return (int(a << 24) >> 24) * (int(b << 24) >> 24) + (int(a << 16) >> 24) * (int(b << 16) >> 24) +
           (int(a << 8) >> 24) * (int(b << 8) >> 24) + (int(a) >> 24) * (int(b) >> 24);
}
#endif
#include "kvc_shared.glsl"
layout(constant_id = SPLIT_TYPE_K) const uint TYPE_K = 3u;
layout(constant_id = SPLIT_TYPE_V) const uint TYPE_V = 3u;
layout(constant_id = SPLIT_HDK) const uint HD = 128u;   // head dim of K and of V
layout(constant_id = SPLIT_G) const uint G = 4u;        // query heads per kv head
layout(constant_id = SPLIT_KV_HEADS) const uint KV_HEADS = 8u;
layout(constant_id = SPLIT_PAGE_CELLS) const uint PAGE_CELLS = 256u;
layout(constant_id = SPLIT_GH) const uint GH = 4u;      // query heads per workgroup (<= G)
layout(constant_id = SPLIT_ROT_K) const uint ROT_K = 0u; // rotated keys: R's block (q rotated as it is loaded); 0: none
layout(constant_id = SPLIT_HALF) const uint HALF = 0u; // nonzero: unpackHalf2x16 keeps f16 subnormals (half_exact.comp)
layout(local_size_x = 32) in;

const uint NSEG = HD / 16u;      // invocations per cell
const uint CPR = 32u / NSEG;     // cells per load row
const uint NHG = (G + GH - 1u) / GH;
const uint NB = HD / 32u;        // blocks of a head row

// (no volatile loads and no release after them here, unlike attn_split_cm.comp: with
// subgroupMemoryBarrierBuffer() after a tile's loads, or volatile loads and a subgroup-scope
// release of the Vulkan memory model, q8_0 at 128k cells batch 8 took 1479-1486 us on an
// H100 against 1208 without; with the K and V arithmetic removed, 1143-1147 against 957)
layout(set = 0, binding = 0) readonly buffer KB { uvec4 kb[]; };
layout(set = 0, binding = 1) readonly buffer VB { uvec4 vb[]; };
layout(set = 0, binding = 2) readonly buffer MB { uint meta[]; };
layout(set = 0, binding = 3) readonly buffer QB { float qb[]; };
layout(set = 0, binding = 4) writeonly buffer PB { float part[]; };
layout(set = 0, binding = 5) readonly buffer KW { uint kw[]; };
layout(set = 0, binding = 6) readonly buffer VW { uint vw[]; };
layout(set = 0, binding = 7) readonly buffer KD { uvec2 kd[]; };
layout(set = 0, binding = 8) readonly buffer VD { uvec2 vd[]; };

layout(push_constant) uniform PC {
    uint job_off;
    uint chunk;       // cells per split (a multiple of TILE)
    uint n_splits;
    uint k_row_bytes;
    uint v_row_bytes;
    uint page_cells;  // (unused: PAGE_CELLS)
    float scale_log2;
    float softcap2;   // logit soft-capping in base 2 (softcap * log2(e)); 0: off
} pc;

uint ldw(uint which, uint w) { return which == 0u ? kw[w] : vw[w]; }
#include "kvc_types.glsl"
#include "attn_common.glsl"
#include "kvc_rotation.glsl"
// load rows per tile (4: 1.2x slower on an H100; q4_0 K and V in 12 or 16, sums packed as
// below: 1.7-2.0x slower than 8 on an H200 at head dim 128, 236 / 248 registers)
const uint TR = 8u;
// q4_0 keys below head dim 256: a segment's sums as biased 16-bit integers, two heads a
// word (|sum| <= 16 x 8 x 127 < 2^14)
const bool PACKED = TYPE_K == T_Q4_0 ? HD < 256u : false;
// the sums in wdv while the tile's scores need them, before its weights go there (a barrier
// between): packed ones, and q8_0's at head dim 64. What this buys is shared memory: H100,
// q4_0 at head dim 128, 128k cells batch 8: 906-912 us with neither (8704 bytes), 945 packed
// in psum (6656), 708-709 packed in wdv (4624); head dim 256, 2688-2712 / 2873-2896 / 2771-
// 2773, so not packed there; q8_0 in wdv (8704 bytes against 10752 at head dim 128): at
// head dim 64 6-9 % faster at 128k cells batch 8, at 128 2.5-3.5 % slower there on the H100
// and 2.4-5 % at 32k cells batch 1 on the H200.
const bool SUMS_IN_WDV = PACKED ? true : HD == 64u;
const uint TILE = CPR * TR;      // cells per tile (kvcache_vk.h: 4096 / HD)
const uint OWN = (TILE + 31u) / 32u; // cells an invocation owns
#define QS_PUT(j, v) qput(j, floatBitsToUint(v)) // for ROT_BUTTERFLIES

// Shared memory sets how many of these workgroups a multiprocessor runs: past about 12 KB a
// workgroup the driver runs fewer (H200, 128k cells batch 8: 12096 bytes 967 us, 14144 1373,
// 20288 1817, 28480 3572; head dim 64 at 13088 bytes ran 1.3-1.6x slower than at 11264). So
// nothing is kept here that registers or another array can hold: the query's prologue uses
// psum (or wdv), and the scales and visibility of a tile's cells stay with their owners.
shared uvec2 caddr[2u * TILE];     // this tile's and the next one's cells: byte offsets of their K and V codes
// the integer sums of GH heads: [cell][segment ^ (cell % NSEG)] (q8_0 keys); packed (q4_0),
// [cell][block ^ (cell % NB)] (xy: segment 2 block, zw: the next one)
const uint NSUMS = TILE * (PACKED ? NB : NSEG);
shared ivec4 psum[SUMS_IN_WDV ? 1u : NSUMS];
// [cell][block]: weight x V scale of GH heads (float bits); first the sums (SUMS_IN_WDV)
const uint NWDV = SUMS_IN_WDV ? (NSUMS > TILE * NB ? NSUMS : TILE * NB) : TILE * NB;
shared uvec4 wdv[SUMS_IN_WDV ? (GH * HD / 4u > NWDV ? GH * HD / 4u : NWDV) : NWDV];
// before the loop, the query's floats (GH * HD), then its q8_0 codes and scales (qcw, qscf),
// in psum, or in wdv where psum holds no sums (qget, qput)
uint qget(uint i) { return SUMS_IN_WDV ? wdv[i >> 2][i & 3u] : uint(psum[i >> 2][i & 3u]); }
void qput(uint i, uint v) {
    if (SUMS_IN_WDV) wdv[i >> 2][i & 3u] = v;
    else psum[i >> 2][i & 3u] = int(v);
}
void sums_put(uint i, ivec4 v) {
    if (SUMS_IN_WDV) wdv[i] = uvec4(v);
    else psum[i] = v;
}
ivec4 sums_get(uint i) { return SUMS_IN_WDV ? ivec4(wdv[i]) : psum[i]; }
// [row][invocation]: each invocation's own copy of a tile's V codes (q4_0: two rows an entry)
shared uvec4 vst[TYPE_V == T_Q8_0 ? TR * 32u : TR * 16u];
#if !USE_SUBGROUP
shared float red[32u * GH];
#endif
const float NEG_INF = -1.0 / 0.0;
// how far (base 2) a score may pass its head's running maximum before the maximum moves:
// a split's first tiles then move it about once instead of at each new maximum (H200, q4_0
// at 32k / 128k cells batch 1: 39.7-40.1 / 105.9-106.5 us with 0, 37.4-37.7 / 102.9-103.1
// with 8; as fast at batch 8, where splits are longer)
const float SLACK = 8.0;

// maxima (or sums) over all 32 invocations, and sums over the CPR cells of a load row
// (the invocations of one segment)
void all_reduce(inout float v[GH], bool is_max) {
#if USE_SUBGROUP
    [[unroll]] for (uint o = 1u; o < 32u; o <<= 1)
        [[unroll]] for (uint g = 0u; g < GH; ++g) {
            float x = subgroupShuffleXor(v[g], o);
            v[g] = is_max ? max(v[g], x) : v[g] + x;
        }
#else
    uint t = gl_LocalInvocationID.x;
    [[unroll]] for (uint g = 0u; g < GH; ++g) red[g * 32u + t] = v[g];
    barrier();
    [[unroll]] for (uint g = 0u; g < GH; ++g) {
        float a = red[g * 32u];
        for (uint k = 1u; k < 32u; ++k) a = is_max ? max(a, red[g * 32u + k]) : a + red[g * 32u + k];
        v[g] = a;
    }
    barrier();
#endif
}
// whether any of the 32 invocations holds true
bool any_lane(bool b) {
#if USE_SUBGROUP
    return subgroupAny(b);
#else
    uint t = gl_LocalInvocationID.x;
    red[t] = b ? 1.0 : 0.0;
    barrier();
    float a = 0.0;
    for (uint k = 0u; k < 32u; ++k) a += red[k];
    barrier();
    return a != 0.0;
#endif
}
void row_sum(inout float v[GH]) {
#if USE_SUBGROUP
    [[unroll]] for (uint o = NSEG; o < 32u; o <<= 1)
        [[unroll]] for (uint g = 0u; g < GH; ++g) v[g] += subgroupShuffleXor(v[g], o);
#else
    uint t = gl_LocalInvocationID.x, s = t % NSEG;
    [[unroll]] for (uint g = 0u; g < GH; ++g) red[g * 32u + t] = v[g];
    barrier();
    [[unroll]] for (uint g = 0u; g < GH; ++g) {
        float a = red[g * 32u + s];
        for (uint k = 1u; k < CPR; ++k) a += red[g * 32u + k * NSEG + s];
        v[g] = a;
    }
    barrier();
#endif
}

// codes to floats without int-to-float conversions: 2^23 + biased code as float bits
float q8f(uint wb, uint k) { return uintBitsToFloat(0x4b000000u | bitfieldExtract(wb, int(8u * k), 8)) - 8388736.0; }
float q4b(uint wb, uint k) { return uintBitsToFloat(0x4b000000u | bitfieldExtract(wb, int(8u * k), 8)) - 8388616.0; }
// a block's f16 scale in half h of word w (HALF: by unpackHalf2x16, 1.1x faster at q4_0
// batch 8, 128k cells on an H200)
float scale_half(uint w, uint h) { return f16_half(w, h, HALF != 0u); }

// The cells [base, base + TILE) of the view: where their codes are, into caddr from `at`;
// where the scales of the cells this invocation owns are, and whether the query sees them,
// into its registers (only the owner reads them). A cell the query may not see: cell 0 of
// page 0, its weights zeros.
uint kso[OWN], vso[OWN]; // the next tile's owned cells: byte offsets of their K and V scales
bool seen_next[OWN], seen[OWN]; // visible? (the next tile's, this tile's)
void cells_at(Job J, uint base, uint c1, uint at, uint kcb, uint vcb, uint kpage, uint vpage, uint kcode0, uint vcode0,
              uint kscl0, uint vscl0) {
    [[unroll]] for (uint o = 0u; o < OWN; ++o) {
        uint c = gl_LocalInvocationID.x + 32u * o;
        uint vi = base + c, gid = 0u;
        bool vis = c < TILE && vi < c1 && cell_visible(J, vi, PAGE_CELLS, gid);
        gid = vis ? gid : 0u;
        uint page = gid / PAGE_CELLS, slot = gid % PAGE_CELLS;
        if (c < TILE) caddr[at + c] = uvec2(page * kpage + kcode0 + slot * kcb, page * vpage + vcode0 + slot * vcb);
        kso[o] = page * kpage + kscl0 + slot * (HD / 16u);
        vso[o] = page * vpage + vscl0 + slot * (HD / 16u);
        seen_next[o] = vis;
    }
}
// A tile's K (V) codes of this invocation's segments, and its owned cells' K (V) scales.
uvec4 kx[TR], vx[TR];                 // a tile's codes of this invocation's segments
uint kh[OWN][NB / 2u], vh[OWN][NB / 2u]; // its owned cells' scales
void fetch_k(uint at) {
    uint t = gl_LocalInvocationID.x, s = t % NSEG, r = t / NSEG;
    [[unroll]] for (uint j = 0u; j < TR; ++j) {
        uint a = caddr[at + j * CPR + r].x;
        if (TYPE_K == T_Q8_0) kx[j] = kb[(a >> 4) + s];
        else { uvec2 x = kd[(a >> 3) + s]; kx[j] = uvec4(x, 0u, 0u); }
    }
    [[unroll]] for (uint o = 0u; o < OWN; ++o)
        [[unroll]] for (uint b = 0u; b < NB / 2u; ++b) kh[o][b] = kw[(kso[o] >> 2) + b];
}
void fetch_v(uint at) {
    uint t = gl_LocalInvocationID.x, s = t % NSEG, r = t / NSEG;
    [[unroll]] for (uint j = 0u; j < TR; ++j) {
        uint a = caddr[at + j * CPR + r].y;
        if (TYPE_V == T_Q8_0) vx[j] = vb[(a >> 4) + s];
        else { uvec2 x = vd[(a >> 3) + s]; vx[j] = uvec4(x, 0u, 0u); }
    }
    [[unroll]] for (uint o = 0u; o < OWN; ++o)
        [[unroll]] for (uint b = 0u; b < NB / 2u; ++b) vh[o][b] = vw[(vso[o] >> 2) + b];
}

// this invocation's query words (q8_0: the 16 codes of segment s; q4_0: the 8 codes of
// the low nibbles, values 8 (s % 2) .. of block s / 2, and the 8 of the high ones, 16 on)
// and, for q4_0 keys, 8 x their sum (the codes' offset)
uint qw[GH][4];
int qbias[GH];

// A tile's integer sums of this invocation's K segments with the query, into psum or wdv.
void tile_sums() {
    uint t = gl_LocalInvocationID.x, s = t % NSEG, r = t / NSEG;
    [[unroll]] for (uint j = 0u; j < TR; ++j) {
        int is[4] = int[4](0, 0, 0, 0);
        [[unroll]] for (uint g = 0u; g < GH; ++g) {
            if (TYPE_K == T_Q8_0)
                is[g] = sdot(kx[j].x, qw[g][0]) + sdot(kx[j].y, qw[g][1]) + sdot(kx[j].z, qw[g][2]) + sdot(kx[j].w, qw[g][3]);
            else
                is[g] = sdot(kx[j].x & 0x0f0f0f0fu, qw[g][0]) + sdot(kx[j].y & 0x0f0f0f0fu, qw[g][1]) +
                        sdot((kx[j].x >> 4) & 0x0f0f0f0fu, qw[g][2]) + sdot((kx[j].y >> 4) & 0x0f0f0f0fu, qw[g][3]) - qbias[g];
        }
        uint c = j * CPR + r;
        if (PACKED) { // biased by 2^14, so two segments' fields add without carries
            uint e = c * NB + ((s >> 1) ^ (c % NB)), h = 2u * (s & 1u);
            wdv[e][h] = uint(is[0] + 16384) | (uint(is[1] + 16384) << 16);
            wdv[e][h + 1u] = uint(is[2] + 16384) | (uint(is[3] + 16384) << 16);
        } else
            sums_put(c * NSEG + (s ^ (c % NSEG)), ivec4(is[0], is[1], is[2], is[3]));
    }
}
// A tile's V codes, out of the registers the next tile's are loaded into, into this
// invocation's own entries of vst (no barrier: it alone reads them; q4_0: two rows to an
// entry).
void stage_v() {
    uint t = gl_LocalInvocationID.x;
    [[unroll]] for (uint j = 0u; j < TR; ++j) {
        if (TYPE_V == T_Q8_0) vst[j * 32u + t] = vx[j];
        else if ((j & 1u) == 1u) vst[(j / 2u) * 32u + t] = uvec4(vx[j - 1u].xy, vx[j].xy);
    }
}

// the query before the loop (qput): value i as a float; then, each block of 32 rounded in
// place, word wi of its q8_0 codes and block b's scale (the first 9 words of the block's 32)
float qsf(uint i) { return uintBitsToFloat(qget(i)); }
uint qcw(uint wi) { return qget(32u * (wi / 8u) + wi % 8u); }
float qscf(uint b) { return uintBitsToFloat(qget(32u * b + 8u)); }

#if USE_SUBGROUP
// R q of the GH heads' query rows (from qb at qoff) into qput's array, in registers: invocation t
// loads values t QV .. t QV + QV - 1 of each row, signs on, and runs the butterflies in
// registers (ROT_ROUND_REGS: the same operations as kvc_rotate_rows, so the same bits). Every
// loop has constant bounds once ROT_K is specialised, so all of it unrolls into registers:
// the rows' loads first, then each round's shuffles of every head at once. (H200, 32k
// cells batch 1: the shared-memory butterflies, seven rounds of barriers over 512 values,
// added 12-14 us to a call; these in a loop over len inside a loop over the heads, 4-8 us;
// without the butterflies at all (wrong results) the rotated call was within 0.6 us of the
// plain one.)
const uint QV = HD / 32u;
void rotate_query_subgroup(uint qoff, uint h0) {
    uint t = gl_LocalInvocationID.x;
    float x[GH][QV];
    [[unroll]] for (uint g = 0u; g < GH; ++g)
        [[unroll]] for (uint v = 0u; v < QV; ++v) {
            uint i = t * QV + v;
            float q = h0 + g < G ? qb[qoff + g * HD + i] : 0.0;
            x[g][v] = rot_neg(i) ? -q : q;
        }
    [[unroll]] for (uint e = 0u; e < 8u; ++e) { // len = 2^e < ROT_K <= 256
        uint len = 1u << e;
        if (len >= ROT_K) continue;
        [[unroll]] for (uint g = 0u; g < GH; ++g) { ROT_ROUND_REGS(x[g], QV, len, t) }
    }
    float r = rot_scale(ROT_K);
    [[unroll]] for (uint g = 0u; g < GH; ++g)
        [[unroll]] for (uint v = 0u; v < QV; ++v) {
            uint i = g * HD + t * QV + v;
            precise float a = x[g][v] * r;
            qput(i, floatBitsToUint(a));
        }
}
#endif

void main() {
    uint kvh = gl_WorkGroupID.x / NHG, hg = gl_WorkGroupID.x % NHG, split = gl_WorkGroupID.y, jb = gl_WorkGroupID.z;
    uint t = gl_LocalInvocationID.x, s = t % NSEG, r = t / NSEG;
    Job J = load_job(pc.job_off, jb);
    uint h0 = hg * GH; // first query head of the group
    const uint kcb = TYPE_K == T_Q8_0 ? HD : HD / 2u, vcb = TYPE_V == T_Q8_0 ? HD : HD / 2u;
    // page p's planes: codes at p * P * row, scales after the P * KV_HEADS code rows
    uint kpage = PAGE_CELLS * pc.k_row_bytes, vpage = PAGE_CELLS * pc.v_row_bytes;
    uint kcode0 = (kvh * PAGE_CELLS) * kcb, vcode0 = (kvh * PAGE_CELLS) * vcb;
    uint kscl0 = PAGE_CELLS * KV_HEADS * kcb + kvh * PAGE_CELLS * (HD / 16u);
    uint vscl0 = PAGE_CELLS * KV_HEADS * vcb + kvh * PAGE_CELLS * (HD / 16u);

    uint c0 = split * pc.chunk, c1 = min(c0 + pc.chunk, J.n_view);
    // the first tile's cells looked up and its loads issued before the query's prologue,
    // whose time their latency then hides (H100, q4_0+rot at 128k cells batch 1 / 8: 104.0-
    // 104.5 / 680.7-681.0 us against 106.0-106.2 / 688.7-691.4 with them after it)
    cells_at(J, c0, c1, 0u, kcb, vcb, kpage, vpage, kcode0, vcode0, kscl0, vscl0);
    barrier();
    fetch_k(0u);
    fetch_v(0u);

    // the query rounded to q8_0 as on the CPU (as attn_split.comp does it): per block of 32,
    // d = amax / 127 stored as f16, codes rint(x / d) in +-127, four to a word
    // (rotated keys, kvc_pool_config.rotate: scores of R q against the stored R k, R q as
    // kvc_rotate_rows gives it: the signs, the butterflies over every head's blocks of
    // ROT_K, then the scale; kvc_rotation.glsl)
    uint qoff = J.q_off + (kvh * G + h0) * HD;
#if USE_SUBGROUP
    if (ROT_K != 0u) rotate_query_subgroup(qoff, h0);
    else
#endif
        for (uint i = t; i < GH * HD; i += 32u) {
            float x = h0 + i / HD < G ? qb[qoff + i] : 0.0;
            qput(i, floatBitsToUint(ROT_K != 0u && rot_neg(i % HD) ? -x : x));
        }
    barrier();
#if !USE_SUBGROUP
    if (ROT_K != 0u) {
        ROT_BUTTERFLIES(qsf, QS_PUT, GH * HD, ROT_K, t, 32u)
        float r = rot_scale(ROT_K);
        for (uint i = t; i < GH * HD; i += 32u) {
            precise float a = qsf(i) * r;
            qput(i, floatBitsToUint(a));
        }
        barrier();
    }
#endif
#if USE_SUBGROUP
    // every block at once, value t of each on invocation t: the blocks' maxima by shuffles,
    // invocation b the scale of block b (one division a lane, as below), then each block's
    // codes packed four to a word by shuffles, so no invocation walks a block alone. The same
    // operations, so the same codes and scales. (H200, alternating with the loop below, us:
    // q8_0 / q4_0 batch 1 at 4k cells 15.7-15.8 / 15.6-15.7 against 16.6-17.0 / 16.4-16.9, at
    // 128k 133.7 / 99.1 against 135.7-135.8 / 102.1-102.3, batch 8 at 4k 55.9-56.1 / 38.0-38.7
    // against 57.4-58.0 / 41.2-41.3. The loop without its maxima at all (wrong results) had
    // taken 14.2 at 256 cells against 15.5; a block a round, each with its own divisions, 39.0.)
    {
        const uint NBLK = GH * NB; // (at most 32)
        float xs[NBLK], amax[NBLK]; // every block's value first: the codes then overwrite the floats
        [[unroll]] for (uint b = 0u; b < NBLK; ++b) {
            xs[b] = qsf(32u * b + t);
            amax[b] = abs(xs[b]);
        }
        [[unroll]] for (uint o = 1u; o < 32u; o <<= 1)
            [[unroll]] for (uint b = 0u; b < NBLK; ++b) amax[b] = max(amax[b], subgroupShuffleXor(amax[b], o));
        float mine = 0.0;
        [[unroll]] for (uint b = 0u; b < NBLK; ++b) mine = t == b ? amax[b] : mine;
        float d = div_rn(mine, 127.0), id = d != 0.0 ? div_rn(1.0, d) : 0.0;
        [[unroll]] for (uint b = 0u; b < NBLK; ++b) {
            int code = clamp(int(roundEven(xs[b] * subgroupShuffle(id, b))), -127, 127);
            uint w = (uint(code) & 0xffu) << (8u * (t & 3u)); // word t / 4: codes of invocations 4 (t / 4) ..
            w |= subgroupShuffleXor(w, 1u);
            w |= subgroupShuffleXor(w, 2u);
            if ((t & 3u) == 0u) qput(32u * b + t / 4u, w);
        }
        if (t < NBLK) qput(32u * t + 8u, floatBitsToUint(h2f(f2h(d)) * pc.scale_log2));
    }
#else
    for (uint b = t; b < GH * NB; b += 32u) {
        float amax = 0.0;
        for (uint j = 0u; j < 32u; ++j) amax = max(amax, abs(qsf(32u * b + j)));
        float d = div_rn(amax, 127.0), id = d != 0.0 ? div_rn(1.0, d) : 0.0;
        uint pk[8];
        [[unroll]] for (uint w = 0u; w < 8u; ++w) {
            uint packed = 0u;
            for (uint c = 0u; c < 4u; ++c) {
                int code = clamp(int(roundEven(qsf(32u * b + 4u * w + c) * id)), -127, 127);
                packed |= (uint(code) & 0xffu) << (8u * c);
            }
            pk[w] = packed;
        }
        // in place: block b's codes and scale over its own floats (only this invocation reads
        // those; the codes are packed in registers first)
        [[unroll]] for (uint w = 0u; w < 8u; ++w) qput(32u * b + w, pk[w]);
        qput(32u * b + 8u, floatBitsToUint(h2f(f2h(d)) * pc.scale_log2));
    }
#endif
    barrier();
    // this invocation's query words (qw, qbias)
    [[unroll]] for (uint g = 0u; g < GH; ++g) {
        uint w0 = g * HD / 4u + 8u * (s / 2u);
        if (TYPE_K == T_Q8_0) {
            [[unroll]] for (uint k = 0u; k < 4u; ++k) qw[g][k] = qcw(w0 + 4u * (s & 1u) + k);
        } else {
            uint lo = w0 + 2u * (s & 1u);
            qw[g][0] = qcw(lo); qw[g][1] = qcw(lo + 1u); qw[g][2] = qcw(lo + 4u); qw[g][3] = qcw(lo + 5u);
        }
        int qsum = 0;
        [[unroll]] for (uint k = 0u; k < 4u; ++k) qsum += sdot(qw[g][k], 0x01010101u);
        qbias[g] = TYPE_K == T_Q8_0 ? 0 : 8 * qsum;
    }
    // the owner's query scales (d_q x scale_log2), [head][block]
    float qf[GH][NB];
    [[unroll]] for (uint g = 0u; g < GH; ++g) [[unroll]] for (uint b = 0u; b < NB; ++b) qf[g][b] = qscf(g * NB + b);
    barrier(); // every invocation's query words read before the first tile's sums take their place

    float acc[GH][16];
    [[unroll]] for (uint g = 0u; g < GH; ++g) [[unroll]] for (uint k = 0u; k < 16u; ++k) acc[g][k] = 0.0;
    float m[GH], l[GH];
    [[unroll]] for (uint g = 0u; g < GH; ++g) { m[g] = NEG_INF; l[g] = 0.0; }

    // Software-pipelined: the next tile's cells are looked up before this tile's scores,
    // its K and V codes and scales loaded once this tile's K scales are used (this tile's
    // V codes copied out to vst and its V scales to vhc before), so a tile's loads wait
    // behind a tile's work. (H100, q8_0 at 128k cells batch 8: 1036 us against 1203 with
    // the V loads after the values; K staged the same way as well, with the cells looked up
    // two tiles ahead: 2211 us. q4_0 tiles of 16 rows, two rows' codes to a uvec4 in vst
    // or in a register: 2.3x / 2.6x slower (H200; those three needed 16-20 KB of shared
    // memory, past the limit above). One extra load a tile, of a word of the codes three
    // tiles ahead to warm L2: 1.25-1.3x slower at every shape, as much with every lane's word
    // the same one.)
    uint buf = 0u;
    [[dont_unroll]] for (uint base = c0; base < c1; base += TILE) { // uniform trip count
        bool more = base + TILE < c1;
        [[unroll]] for (uint o = 0u; o < OWN; ++o) seen[o] = seen_next[o];
        // the segments' integer sums and this tile's V codes staged, around the next tile's
        // cell lookups: in this order for q8_0 K and V, sums last otherwise (H100, 128k cells
        // batch 8: q8_0 953.6-960.1 -> 917.2-924.0 us, but q4_0 967.2-973.7 -> 1010.2-1015.7;
        // cells, sums, V: 978 / 984-985; V, sums, cells: 938-947 / 1013-1021)
        bool q8_order = TYPE_K == T_Q8_0 && TYPE_V == T_Q8_0;
        if (q8_order) tile_sums(); else stage_v();
        if (more) cells_at(J, base + TILE, c1, (buf ^ 1u) * TILE, kcb, vcb, kpage, vpage, kcode0, vcode0, kscl0, vscl0);
        if (q8_order) stage_v(); else tile_sums();
        barrier(); // the sums, and the next tile's cells
        // the owners' scores
        float sc[OWN][GH], mx[GH];
        [[unroll]] for (uint g = 0u; g < GH; ++g) mx[g] = NEG_INF;
        [[unroll]] for (uint o = 0u; o < OWN; ++o) {
            uint c = min(t + 32u * o, TILE - 1u);
            bool vis = seen[o];
            float v[GH];
            [[unroll]] for (uint g = 0u; g < GH; ++g) v[g] = 0.0;
            [[unroll]] for (uint b = 0u; b < NB; ++b) {
                float dk = scale_half(kh[o][b / 2u], b & 1u), f[4];
                if (PACKED) { // the block's two segments at once; each field then biased by 2^15
                    uvec4 a = wdv[c * NB + (b ^ (c % NB))];
                    uvec2 w = a.xy + a.zw;
                    [[unroll]] for (uint g = 0u; g < 4u; ++g) // 2^23 + field, less 2^23 + 2^15: exact
                        f[g] = uintBitsToFloat(0x4b000000u | ((w[g / 2u] >> (16u * (g & 1u))) & 0xffffu)) - 8421376.0;
                } else {
                    ivec4 a = sums_get(c * NSEG + ((2u * b) ^ (c % NSEG))), e = sums_get(c * NSEG + ((2u * b + 1u) ^ (c % NSEG)));
                    [[unroll]] for (uint g = 0u; g < 4u; ++g) f[g] = float(a[g] + e[g]);
                }
                [[unroll]] for (uint g = 0u; g < GH; ++g) v[g] += f[g] * (dk * qf[g][b]);
            }
            // s = cap tanh(s / cap), in base 2 as the scores are; +inf if not finite (attn_common.glsl)
            if (pc.softcap2 > 0.0) [[unroll]] for (uint g = 0u; g < GH; ++g) v[g] = score_capped(v[g], pc.softcap2);
            else [[unroll]] for (uint g = 0u; g < GH; ++g) v[g] = score_finite(v[g]);
            [[unroll]] for (uint g = 0u; g < GH; ++g) {
                sc[o][g] = vis ? v[g] : NEG_INF;
                mx[g] = max(mx[g], sc[o][g]);
            }
        }
        // the next tile's K and V codes and scales, issued together once this tile's K scales
        // are used (H200, 128k cells batch 8: q8_0 1024.5 -> 990.2 us, q4_0 1044.8 -> 976.3,
        // against K here and V after the weights)
        uint vhc[OWN][NB / 2u]; // this tile's V scales, for its weights
        [[unroll]] for (uint o = 0u; o < OWN; ++o) [[unroll]] for (uint b = 0u; b < NB / 2u; ++b) vhc[o][b] = vh[o][b];
        if (more) {
            fetch_k((buf ^ 1u) * TILE);
            fetch_v((buf ^ 1u) * TILE);
        }
        // A tile with no score more than SLACK above its head's running maximum (after the
        // first tiles, nearly every tile) keeps the maxima: one vote instead of the cross-lane
        // maxima and the rescale (attn_split_cm.comp votes too, without the slack). Its
        // weights are then up to 2^SLACK, far inside f32's range, and the merge weighs each
        // split by its own maximum, so any maximum at or above the true one less SLACK gives
        // the same result to rounding.
        bool above = false;
        [[unroll]] for (uint g = 0u; g < GH; ++g) above = above || mx[g] > m[g] + SLACK;
        if (any_lane(above)) { // uniform, and so are the maxima after it
            all_reduce(mx, true);
            [[unroll]] for (uint g = 0u; g < GH; ++g) { // only a head whose own maximum passed
                // its slack moves: another head's vote must not change this head's rounding (a
                // row's bits depend on its own query alone, also when another row is NaN)
                float mn = mx[g] > m[g] + SLACK ? mx[g] : m[g];
                float a = mn == NEG_INF ? 1.0 : exp2(m[g] - mn);
                m[g] = mn;
                l[g] *= a;
                [[unroll]] for (uint k = 0u; k < 16u; ++k) acc[g][k] *= a;
            }
        }
        if (SUMS_IN_WDV) barrier(); // the scores' reads of wdv before the weights' writes
        // the owners' weights, times their V scales
        [[unroll]] for (uint o = 0u; o < OWN; ++o) {
            uint c = t + 32u * o;
            if (c >= TILE) continue;
            bool vis = seen[o];
            float p[4] = float[4](0.0, 0.0, 0.0, 0.0);
            [[unroll]] for (uint g = 0u; g < GH; ++g) {
                p[g] = vis ? exp2(sc[o][g] - m[g]) : 0.0;
                l[g] += p[g];
            }
            [[unroll]] for (uint b = 0u; b < NB; ++b) {
                float dv = scale_half(vhc[o][b / 2u], b & 1u);
                // a masked cell's row may hold anything: its weights are zeros, not products
                wdv[c * NB + b] = floatBitsToUint(vis ? vec4(p[0], p[1], p[2], p[3]) * dv : vec4(0.0));
            }
        }
        barrier();
        // the weighted values
        [[unroll]] for (uint j = 0u; j < TR; ++j) {
            vec4 wd = uintBitsToFloat(wdv[(j * CPR + r) * NB + s / 2u]);
            uvec4 vxj = vst[(TYPE_V == T_Q8_0 ? j : j / 2u) * 32u + t];
            if (TYPE_V != T_Q8_0 && (j & 1u) == 1u) vxj.xy = vxj.zw;
            float x[16];
            if (TYPE_V == T_Q8_0) {
                uvec4 wb = vxj ^ uvec4(0x80808080u);
                [[unroll]] for (uint k = 0u; k < 4u; ++k) {
                    x[k] = q8f(wb.x, k); x[4u + k] = q8f(wb.y, k); x[8u + k] = q8f(wb.z, k); x[12u + k] = q8f(wb.w, k);
                }
            } else { // low nibbles: values 0-7 of the half block, high: 16-23; each nibble
                     // moved to a byte of its own first, so a value is one byte select
                uvec4 nb = uvec4(vxj.x, vxj.y, vxj.x >> 4, vxj.y >> 4) & uvec4(0x0f0f0f0fu);
                [[unroll]] for (uint k = 0u; k < 4u; ++k) {
                    x[k] = q4b(nb.x, k); x[4u + k] = q4b(nb.y, k); x[8u + k] = q4b(nb.z, k); x[12u + k] = q4b(nb.w, k);
                }
            }
            [[unroll]] for (uint g = 0u; g < GH; ++g)
                [[unroll]] for (uint k = 0u; k < 16u; ++k) acc[g][k] += wd[g] * x[k];
        }
        buf ^= 1u;
        barrier(); // the sums and wdv are rewritten by the next tile, caddr by the one after
    }

    all_reduce(l, false); // each owner's share
    [[unroll]] for (uint k = 0u; k < 16u; ++k) {
        float v[GH];
        [[unroll]] for (uint g = 0u; g < GH; ++g) v[g] = acc[g][k];
        row_sum(v);
        [[unroll]] for (uint g = 0u; g < GH; ++g) acc[g][k] = v[g];
    }
    if (r == 0u) {
        uint stride = HD + 2u;
        [[unroll]] for (uint g = 0u; g < GH; ++g) {
            if (h0 + g >= G) continue;
            uint at = ((jb * KV_HEADS * G + kvh * G + h0 + g) * pc.n_splits + split) * stride;
            [[unroll]] for (uint k = 0u; k < 16u; ++k) {
                // q8_0: values 16 s + k; q4_0: block s / 2, half s % 2: 8 values from 8 (s % 2),
                // then 8 from 16 + 8 (s % 2)
                uint e = TYPE_V == T_Q8_0 ? 16u * s + k : 32u * (s / 2u) + 8u * (s & 1u) + (k < 8u ? k : 8u + k);
                part[at + 2u + e] = acc[g][k];
            }
            if (s == 0u) {
                part[at] = m[g];
                part[at + 1u] = l[g];
            }
        }
    }
}
