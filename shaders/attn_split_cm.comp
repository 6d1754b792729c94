#version 450
// attn_split_cm.comp - decode attention, split-K pass on the tensor cores
// (VK_NV_cooperative_matrix), for f16 keys and values. attn_split.comp's job and output,
// another schedule: a workgroup of NSG subgroups of 32 takes one job, one kv head with its
// whole GQA group of G query heads (G <= 8) and one chunk of cells; each subgroup walks its
// own slice of the chunk in tiles of 16 cells, with its own pieces of shared memory and
// subgroup barriers only, and at the end the subgroups' partials are merged in shared
// memory into the workgroup's (and, FUSED, the last workgroup of the head group merges the
// splits: attn_onedisp.glsl). The products are taken transposed, so that the query side is the narrow
// N = NQ (8 for G <= 4, else 16) dimension of the tensor-core tiles:
//   stage    the tile's K rows, loaded into registers one tile ahead (16 bytes per load),
//            are stored into shared memory; its V rows (loaded as early) take their place
//            once the scores are taken (V rows of cells it may not see: zeros): 5.6 KB of
//            shared memory a subgroup, not 10 (a read-only test kernel of 1024 single-
//            subgroup workgroups read 4.5 TB/s on an H200 with 5 KB each, 4.1 with 10 KB,
//            2.8 with 20 KB: shared memory caps how many run at once);
//   scores   S^T (16 cells x NQ) = K (16 x HDK) x Q^T, where columns 0..G-1 of Q^T hold
//            the queries rounded to multiples of 2^-11 (after scaling each head's row by a
//            power of two into (-1, 1)) and columns G..2G-1 the remainders times 2^12: f16 x f16
//            products are exact and summed in f32, hi + lo * 2^-12 carries each query to
//            about 2^-23 of the largest;
//   softmax  one invocation per (head, cell): mask, running max per head, weights
//            p = exp2(s - m). A tile with no score above its head's maximum (one vote)
//            takes the short way; otherwise the tile's maxima (clustered subgroup max
//            over the 16 cells), and where a maximum grows O^T is rescaled element-wise
//            by a matrix of the same type whose columns hold each column's factor.
//            REGS (a specialization constant, where kvcache_vk.h's check found NVIDIA's
//            element layout): the same on S^T's elements in registers, no S^T, P^T or
//            factors through shared memory (el_col / el_row below);
//   values   O^T (HDV x NQ) += V^T (HDV x 16) x P^T, P split into hi / lo columns the
//            same way (p in [0, 1]: to about 2^-24 absolute).
// Written out as attn_split.comp does: (max, sum, unnormalised output) per query head.
//
// Built a second time with QUANT = 1 for q8_0 / q4_0 K and V on planar pages (kvc_types.glsl's
// layout; head dims 64 or 128): the same schedule over the codes, which are small integers
// and so exact in f16:
//   stage    each tile's codes (8 or 4 bits a value, loaded a tile ahead with the owner's
//            block scales) are turned into f16 as they are stored into shared memory;
//   scores   the query is rounded to q8_0 as on the CPU (attn_split_q.comp's prologue), its
//            codes the columns of Q^T; one product a block of 32 values gives that block's
//            integer sums exactly (|sum| < 2^19 in f32), and the owner of a (head, cell)
//            adds them times the block scales (d_k x d_q, as attn_split_q.comp does; REGS:
//            on S^T's elements, each cell's scales shuffled to its rows). Built with IK = 1
//            too (kvcache_vk.h's KVC_VK_FEATURE_INT8_MATRIX): the keys' codes are staged as
//            they are, 8-bit integers (q4_0's nibbles less 8), and each block's sums come
//            from one 16 x 32 x NQ product of 8-bit integers into 32-bit ones, the same
//            integers without turning the codes into f16 (H200, q8_0, the build run for
//            every size: batch 8 at 4k cells 51.3-51.7 -> 44.1-44.3 us, 128k 1192.6-1194.8 ->
//            969.7-971.5);
//   values   the weights times the cell's V scale of each block, w = p d_v, one P^T a
//            block (V^T's rows of block b take block b's P^T), split hi / lo as p is
//            above after a scaling by a power of two 2^-(R_b + 1) that brings them into [0, 1):
//            R_b is the largest exponent of block b's scales of the visible cells so far
//            (O^T's rows of the block are scaled down by the power of two when it grows,
//            and up by 2^(R_b + 1) at the end). (Rounding w to f16 for hi instead, the
//            driver's compiler took f32 -> f16 -> f32 as no change: hi + lo to 2^-12.)
#extension GL_EXT_control_flow_attributes : require
#extension GL_NV_cooperative_matrix : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_clustered : require
#extension GL_KHR_shader_subgroup_shuffle : require
#extension GL_KHR_shader_subgroup_vote : require
#extension GL_KHR_shader_subgroup_ballot : require
#ifndef IK
#define IK 0
#endif
#if IK
#extension GL_EXT_shader_explicit_arithmetic_types_int8 : require
#extension GL_NV_integer_cooperative_matrix : require
#endif
#extension GL_KHR_memory_scope_semantics : require
#ifndef QUANT
#define QUANT 0
#endif
#include "kvc_shared.glsl"
// attn_split.comp's specialization constants, those this schedule uses
layout(constant_id = SPLIT_TYPE_K) const uint TYPE_K = 1u; // f16; QUANT: q8_0 or q4_0 (kvcache_vk.h picks this shader)
layout(constant_id = SPLIT_TYPE_V) const uint TYPE_V = 1u;
layout(constant_id = SPLIT_HDK) const uint HDK = 128u;     // multiples of 16, at most 128
layout(constant_id = SPLIT_HDV) const uint HDV = 128u;
layout(constant_id = SPLIT_G) const uint G = 4u;           // query heads per kv head, at most 8
layout(constant_id = SPLIT_KV_HEADS) const uint KV_HEADS = 8u;
layout(constant_id = SPLIT_PAGE_CELLS) const uint PAGE_CELLS = 256u;
layout(constant_id = SPLIT_ROT_K) const uint ROT_K = 0u; // rotated keys: R's block (q rotated as it is loaded); 0: none
layout(constant_id = SPLIT_FUSED) const uint FUSED = 0u; // nonzero: the last workgroup of a head group merges (attn_onedisp.glsl)
layout(constant_id = SPLIT_REGS) const uint REGS_SPEC = 0u; // nonzero: the softmax on S^T's elements
const bool REGS = REGS_SPEC != 0u;
layout(constant_id = SPLIT_HALF) const uint HALF_SPEC = 0u; // nonzero: unpackHalf2x16 keeps f16 subnormals (half_exact.comp)
const bool HALF = HALF_SPEC != 0u;
layout(local_size_x_id = SPLIT_WG) in;            // NSG subgroups of 32
const uint WG = gl_WorkGroupSize.x, NSG = WG / 32u;

layout(set = 0, binding = 0) volatile readonly buffer KB { uvec4 kb[]; };
layout(set = 0, binding = 1) volatile readonly buffer VB { uvec4 vb[]; };
layout(set = 0, binding = 2) readonly buffer MB { uint meta[]; };
layout(set = 0, binding = 3) readonly buffer QB { float qb[]; };
layout(set = 0, binding = 4) coherent buffer PB { float part[]; }; // (coherent: FUSED builds read it back)
#if QUANT
// K and V again, as words: the scales (volatile, as kb / vb: loaded where they are issued)
layout(set = 0, binding = 5) volatile readonly buffer KW { uint kw[]; };
layout(set = 0, binding = 6) volatile readonly buffer VW { uint vw[]; };
uint ldw(uint which, uint w) { return which == 0u ? kw[w] : vw[w]; }
#include "kvc_types.glsl"
#endif

layout(push_constant) uniform PC {
    uint job_off;
    uint chunk;       // cells per split (a multiple of 16)
    uint n_splits;
    uint k_row_bytes;
    uint v_row_bytes;
    uint page_cells;  // (unused: PAGE_CELLS)
    float scale_log2;
    float softcap2;   // logit soft-capping in base 2 (softcap * log2(e)); 0: off
} pc;

#include "attn_common.glsl"
#include "cm_layout.glsl"
#include "kvc_rotation.glsl"
#define OD_NT WG
#include "attn_onedisp.glsl"

const int SG = 3;                                 // gl_ScopeSubgroup
const uint NQ = 2u * G <= 8u ? 8u : 16u;          // query columns (hi, lo, zero padding)
#define MATA fcoopmatNV<16, SG, 16, 16>
#define MATB fcoopmatNV<16, SG, 16, NQ>
#define MATC fcoopmatNV<32, SG, 16, NQ>
#if IK
#define IMATA icoopmatNV<8, SG, 16, 32>
#define IMATB icoopmatNV<8, SG, 32, NQ>
#define IMATC icoopmatNV<32, SG, 16, NQ>
#endif
const uint TC = 16u;                              // cells per tile
const uint CK = HDK / 8u, CV = HDV / 8u;          // 16-byte pieces of a head row
const uint SK = CK + 1u, SV = CV + 1u;            // shared row strides (+16 bytes: no bank conflicts)
const uint NK = TC * CK / 32u, NV = TC * CV / 32u;// pieces per invocation per tile
const uint KV_WORDS = TC * (SK > SV ? SK : SV);  // a tile's K, then its V (uvec4); also Q, then O
const uint O_WORDS = NQ * HDV / 4u;
const float LO = 4096.0, INV_LO = 1.0 / 4096.0;
const float NEG_INF = -1.0 / 0.0;
const uint NT = (G + 1u) / 2u;                    // heads per invocation in the softmax

// QUANT: 16-byte pieces of a head row's codes (K, V), pieces per invocation per tile, words
// of a cell's block scales
const uint NB = HDK / 32u;                        // blocks of 32 values of a head row
#if QUANT
const uint KQ = (TYPE_K == T_Q8_0 ? HDK : HDK / 2u) / 16u, VQ = (TYPE_V == T_Q8_0 ? HDV : HDV / 2u) / 16u;
const uint NKQ = TC * KQ / 32u, NVQ = TC * VQ / 32u;
const uint NSW = HDK / 64u;
#else
const uint NKQ = NK, NVQ = NV;
#endif
const uint NSS = QUANT != 0 ? NB : 1u;            // S^T and P^T matrices a tile (QUANT: one a block)

// Each subgroup has its own piece of every array: kv from KO, am from SO, ss and ps from SP
const uint KVW = KV_WORDS > O_WORDS ? KV_WORDS : O_WORDS;
shared uvec4 kv[NSG * KVW];
// (REGS: S^T, P^T and the factors stay in registers; ss holds only the QUANT query's scales)
shared float ss[REGS ? G * NB : NSG * NSS * TC * NQ];  // S^T, row-major (cell, column)
shared float am[REGS ? 1u : NSG * 16u * NQ];          // rescale factors: column n holds column n's
shared float16_t ps[REGS ? 1u : NSG * NSS * TC * NQ]; // P^T, row-major (cell, column)
shared float om[NSG * G], ol[NSG * G];            // each subgroup's maxima and sums per head
uint KO, SO, SP;                                  // this subgroup's pieces

uvec4 kr[NKQ], vr[NVQ];
#if QUANT
uint ksw[NSW], vsw[NSW];                          // the block scales (f16 pairs) of this invocation's cell
#endif

// The subgroup's barrier for shared memory only.
void sync_shared() {
    controlBarrier(gl_ScopeSubgroup, gl_ScopeSubgroup, gl_StorageSemanticsShared, gl_SemanticsAcquireRelease);
}

// This invocation's cell of the tile at base (lane & 15): visible? and where (a cell it
// may not see: cell 0 of page 0, in bounds, its row masked later).
bool cell_at(Job J, uint base, uint c1, uint lane, out uint g) {
    uint vi = base + (lane & 15u), gid = 0u;
    bool vis = vi < c1 && cell_visible(J, vi, PAGE_CELLS, gid);
    g = vis ? gid : 0u;
    return vis;
}

// Load the K rows, or the V rows, of a tile's cells (g: this invocation's cell) into kr / vr
// (QUANT: their codes, and this invocation's cell's scales into ksw / vsw).
#if QUANT
void fetch_k(uint g, uint kvh, uint lane) {
    uint a = pl_codes(TYPE_K, HDK, KV_HEADS, PAGE_CELLS, g, kvh) / 16u;
    [[unroll]] for (uint j = 0u; j < NKQ; ++j) {
        uint i = lane + 32u * j;
        kr[j] = kb[subgroupShuffle(a, i / KQ) + i % KQ];
    }
    uint s = pl_scale(TYPE_K, HDK, KV_HEADS, PAGE_CELLS, g, kvh, 0u) / 4u;
    [[unroll]] for (uint w = 0u; w < NSW; ++w) ksw[w] = kw[s + w];
}
void fetch_v(uint g, uint kvh, uint lane) {
    uint a = pl_codes(TYPE_V, HDV, KV_HEADS, PAGE_CELLS, g, kvh) / 16u;
    [[unroll]] for (uint j = 0u; j < NVQ; ++j) {
        uint i = lane + 32u * j;
        vr[j] = vb[subgroupShuffle(a, i / VQ) + i % VQ];
    }
    uint s = pl_scale(TYPE_V, HDV, KV_HEADS, PAGE_CELLS, g, kvh, 0u) / 4u;
    [[unroll]] for (uint w = 0u; w < NSW; ++w) vsw[w] = vw[s + w];
}

// Two words of f16 1024 + c (0x6400 | c: c a code, or a q8_0 code biased by 128) less `off`:
// both exact, c - off an integer.
uvec2 half_pair(uint a, uint b, float off) {
    f16vec2 o = f16vec2(off);
    return uvec2(packFloat2x16(unpackFloat2x16(a) - o), packFloat2x16(unpackFloat2x16(b) - o));
}
#if !IK
// Four biased codes, the bytes of u, as f16 less `off`, in order, two to a word
uvec2 byte_halves(uint u, float off) {
    return half_pair((u & 0xffu) | ((u << 8) & 0xff0000u) | 0x64006400u,
                     ((u >> 16) & 0xffu) | ((u >> 8) & 0xff0000u) | 0x64006400u, off);
}
// A 16-byte piece x of a head row's K codes (piece p of the row) into row r of kv, in order:
// q8_0, 16 codes; q4_0, a block (low nibbles values 0-15, high 16-31).
void stage_k_codes(uvec4 x, uint r, uint p) {
    uint at = KO + r * SK;
    if (TYPE_K == T_Q8_0) {
        uvec4 u = x ^ uvec4(0x80808080u);
        kv[at + 2u * p] = uvec4(byte_halves(u.x, 1152.0), byte_halves(u.y, 1152.0));
        kv[at + 2u * p + 1u] = uvec4(byte_halves(u.z, 1152.0), byte_halves(u.w, 1152.0));
    } else {
        uvec4 lo = x & uvec4(0x0f0f0f0fu), hi = (x >> 4) & uvec4(0x0f0f0f0fu);
        kv[at + 4u * p] = uvec4(byte_halves(lo.x, 1032.0), byte_halves(lo.y, 1032.0));
        kv[at + 4u * p + 1u] = uvec4(byte_halves(lo.z, 1032.0), byte_halves(lo.w, 1032.0));
        kv[at + 4u * p + 2u] = uvec4(byte_halves(hi.x, 1032.0), byte_halves(hi.y, 1032.0));
        kv[at + 4u * p + 3u] = uvec4(byte_halves(hi.z, 1032.0), byte_halves(hi.w, 1032.0));
    }
}
#endif
// The same for V, but every group of 4 values in the order 0, 2, 1, 3: masks pick bytes 0 and
// 2, then 1 and 3, of a word, so a word costs two masks instead of byte shuffles (H200, q8_0,
// batch 8, 128k cells: 690 / 684 us against 757 / 760 in order). O^T's rows come out in that
// order, and the epilogue reads them back through in_order. (q8_0's bias: ^ 0x80 beside 0x64
// is ^ 0x6480.) The constant sits in a register, g_vb, set opaquely in main: as an immediate
// the driver spends two LOP3 a mask (one immediate each), with a register one (H200, q8_0,
// batch 8, 128k cells: with dvf below, 673-687 us against 701-709).
uint g_vb; // 0x64806480 (q8_0) or 0x64006400 (q4_0)
uint nib_pair(uint u, uint sh) { return ((u >> sh) & 0x000f000fu) ^ g_vb; }
void stage_v_codes(uvec4 x, uint r, uint p) {
    uint at = KO + r * SV;
    if (TYPE_V == T_Q8_0) {
        uvec4 a = (x & uvec4(0x00ff00ffu)) ^ uvec4(g_vb), b = ((x >> 8) & uvec4(0x00ff00ffu)) ^ uvec4(g_vb);
        kv[at + 2u * p] = uvec4(half_pair(a.x, b.x, 1152.0), half_pair(a.y, b.y, 1152.0));
        kv[at + 2u * p + 1u] = uvec4(half_pair(a.z, b.z, 1152.0), half_pair(a.w, b.w, 1152.0));
    } else {
        [[unroll]] for (uint w = 0u; w < 4u; w += 2u) {
            uint x0 = x[w], x1 = x[w + 1u];
            kv[at + 4u * p + w / 2u] = uvec4(half_pair(nib_pair(x0, 0u), nib_pair(x0, 8u), 1032.0),
                                             half_pair(nib_pair(x1, 0u), nib_pair(x1, 8u), 1032.0));
            kv[at + 4u * p + 2u + w / 2u] = uvec4(half_pair(nib_pair(x0, 4u), nib_pair(x0, 12u), 1032.0),
                                                  half_pair(nib_pair(x1, 4u), nib_pair(x1, 12u), 1032.0));
        }
    }
}
// value d's place in a row staged by stage_v_codes (0, 2, 1, 3 swapped back)
uint in_order(uint d) { return (d & ~3u) | (d & 1u) << 1 | (d >> 1) & 1u; }
#if IK
// IK: a 16-byte piece x of a head row's K codes (piece p) into row r of kv as 8-bit integers:
// q8_0's bytes are its codes; q4_0's nibbles n become the bytes n - 8 (each byte biased by
// 128 first, so that none borrows from the next)
uvec4 nibbles_i8(uvec4 n) { return ((n | uvec4(0x80808080u)) - uvec4(0x08080808u)) ^ uvec4(0x80808080u); }
void stage_k_i8(uvec4 x, uint r, uint p) {
    uint at = KO + r * SK;
    if (TYPE_K == T_Q8_0) {
        kv[at + p] = x;
    } else {
        kv[at + 2u * p] = nibbles_i8(x & uvec4(0x0f0f0f0fu));
        kv[at + 2u * p + 1u] = nibbles_i8((x >> 4) & uvec4(0x0f0f0f0fu));
    }
}
#endif
// f16 bits to f32 as kvc_types.glsl's h2f, by selects instead of its branches (H200, q8_0 at
// 128k cells batch 8 in a build that ran every size here: 1675 us with h2f, 1382 with
// unpackHalf2x16, which some drivers flush to zero below 2^-14: used where HALF, the
// context's check, found it exact)
float h2f_sel(uint h) {
    uint e = (h >> 10) & 0x1fu, m = h & 0x3ffu, s = (h & 0x8000u) << 16;
    float sub = uintBitsToFloat(s | floatBitsToUint(float(m) * (1.0 / 16777216.0)));
    uint big = e == 31u ? 0x7f800000u | (m << 13) : ((e + 112u) << 23) | (m << 13);
    return e == 0u ? sub : uintBitsToFloat(s | big);
}
// block b's scale of a cell's scale words
#define BLOCK_SCALE(w, b) (HALF ? unpackHalf2x16((w)[(b) / 2u])[(b) & 1u] : h2f_sel(((w)[(b) / 2u] >> (16u * ((b) & 1u))) & 0xffffu))
// 2^e as a float, e in [-126, 127]
float pow2(int e) { return uintBitsToFloat(uint(e + 127) << 23); }
#else
void fetch_k(uint g, uint kvh, uint lane) {
    [[unroll]] for (uint j = 0u; j < NK; ++j) {
        uint i = lane + 32u * j, cg = subgroupShuffle(g, i / CK);
        kr[j] = kb[(cg * pc.k_row_bytes + kvh * (HDK * 2u)) / 16u + i % CK];
    }
}
void fetch_v(uint g, uint kvh, uint lane) {
    [[unroll]] for (uint j = 0u; j < NV; ++j) {
        uint i = lane + 32u * j, cg = subgroupShuffle(g, i / CV);
        vr[j] = vb[(cg * pc.v_row_bytes + kvh * (HDV * 2u)) / 16u + i % CV];
    }
}
#endif

// Keep the loads just issued ahead of the work that follows: without this the driver's
// compiler sank them to their use (the next tile's staging, seen in its SASS) and nothing
// overlapped them; with volatile K/V loads and this release the kernel ran 15 % faster (H200)
void loads_issued() {
    memoryBarrier(gl_ScopeSubgroup, gl_StorageSemanticsBuffer, gl_SemanticsRelease);
}

// Rotated keys: R q of the G query rows (from qb at q0) into kv as floats (index g HDK + i).
// The rows are taken as rounds of 32 QV values, invocation t holding values t QV ..
// t QV + QV - 1 of a round in registers (QV = ROT_K / 32, or 1 for blocks of 16, two to a
// round): a butterfly pair closer than QV is the invocation's own, a farther one spans
// lanes t and t ^ (len / QV). The lower of a pair keeps a + b, the upper a - b: the same
// operations as kvc_rotate_rows, so the same bits. Every loop has constant bounds once
// ROT_K is specialised. (It was a rotate.comp pass and a barrier before the split: H100,
// 32k cells batch 1, 8 us of a 58 us call.)
const uint QV = ROT_K >= 32u ? ROT_K / 32u : 1u;
const uint QR = (G * HDK + 32u * QV - 1u) / (32u * QV); // rounds
// Returns the od_query_bad bits of the values it loaded.
uint rotate_query(uint q0, uint lane) {
    float x[QR][QV];
    uint bad = 0u;
    [[unroll]] for (uint r = 0u; r < QR; ++r)
        [[unroll]] for (uint v = 0u; v < QV; ++v) {
            uint i = (32u * r + lane) * QV + v;
            float q = i < G * HDK ? qb[q0 + i] : 0.0;
            bad |= od_query_bad(q, i / HDK);
            x[r][v] = rot_neg(i % HDK) ? -q : q;
        }
    [[unroll]] for (uint e = 0u; e < 7u; ++e) { // len = 2^e < ROT_K <= 128
        uint len = 1u << e;
        if (len >= ROT_K) continue;
        if (len < QV) {
            [[unroll]] for (uint r = 0u; r < QR; ++r)
                [[unroll]] for (uint v = 0u; v < QV; ++v)
                    if ((v & len) == 0u) {
                        precise float a = x[r][v], b = x[r][v + len];
                        precise float su = a + b, di = a - b;
                        x[r][v] = su;
                        x[r][v + len] = di;
                    }
        } else {
            uint o = len / QV;
            bool upper = (lane & o) != 0u;
            [[unroll]] for (uint r = 0u; r < QR; ++r)
                [[unroll]] for (uint v = 0u; v < QV; ++v) {
                    precise float y = subgroupShuffleXor(x[r][v], o);
                    precise float su = x[r][v] + y, di = y - x[r][v];
                    x[r][v] = upper ? di : su;
                }
        }
    }
    float sc = rot_scale(ROT_K);
    [[unroll]] for (uint r = 0u; r < QR; ++r)
        [[unroll]] for (uint v = 0u; v < QV; ++v) {
            uint i = (32u * r + lane) * QV + v;
            precise float a = x[r][v] * sc;
            if (i < G * HDK) kv[KO + (i >> 2)][i & 3u] = floatBitsToUint(a);
        }
    return bad;
}
// the rotated query's value i (g HDK + d), from kv
float rotated_query_at(uint i) { return uintBitsToFloat(kv[KO + (i >> 2)][i & 3u]); }

// x (|x| <= 1) as hi + lo * 2^-12 with hi a multiple of 2^-11: both exact in f16 but
// lo's last bits. x + 6144 lies in [4096, 8192), where a float's ulp is 2^-11, so the sum
// rounds x to hi (precise: not folded away); one instruction fewer than a floor (H200, q8_0
// batch 8 at 128k cells: 740-745 us against 757-760).
vec2 split(float x) {
    precise float t = x + 6144.0;
    precise float hi = t - 6144.0;
    return vec2(hi, (x - hi) * LO);
}

// S^T, P^T and O^T's elements by place (REGS): a 16 x NQ matrix's element i of a lane, as
// cm_layout.glsl places them (NCB = NQ / 8 blocks of 8 columns). Lanes l and l ^ 4, l ^ 8,
// l ^ 16 hold the same columns; slot k = i % (2 NCB) names a lane's column.
const uint NCB = NQ / 8u, NSL = 2u * NCB, NE = NQ / 2u;
uint el_col(uint lane, uint i) { return cm_col(lane, i, NCB); }
uint el_row(uint lane, uint i) { return cm_row(lane, i, NCB); }
// each element's partner: the same row's element in the column of the other half (hi <-> lo)
// of its head
void partners(float s[NE], uint lane, out float y[NE]) {
    if (2u * G == NQ && NCB == 1u) {
        [[unroll]] for (uint i = 0u; i < NE; ++i) y[i] = subgroupShuffleXor(s[i], 2u);
    } else if (2u * G == NQ) {
        [[unroll]] for (uint i = 0u; i < NE; ++i) y[i] = s[i ^ 2u];
    } else {
        [[unroll]] for (uint i = 0u; i < NE; ++i) {
            uint c = el_col(lane, i), cp = c < G ? c + G : c < 2u * G ? c - G : c;
            uint src = (lane & ~3u) | ((cp % 8u) >> 1), kp = (cp & 1u) + 2u * (cp / 8u), rh = i / NSL;
            float v = 0.0;
            [[unroll]] for (uint k = 0u; k < NSL; ++k) {
                float w = subgroupShuffle(s[rh * NSL + k], src);
                v = k == kp ? w : v;
            }
            y[i] = v;
        }
    }
}
// the maximum over a column's 16 rows (the lane's two, then the 8 lanes of its column)
float column_max(float a, float b) {
    float v = max(a, b);
    v = max(v, subgroupShuffleXor(v, 4u));
    v = max(v, subgroupShuffleXor(v, 8u));
    return max(v, subgroupShuffleXor(v, 16u));
}

void main() {
    uint kvh = gl_WorkGroupID.x, split_id = gl_WorkGroupID.y, jb = gl_WorkGroupID.z;
    uint tid = gl_LocalInvocationID.x, sg = tid / 32u, lane = tid % 32u, lc = lane & 15u, hb = lane >> 4;
    KO = sg * KVW;
    SO = sg * TC * NQ;
    SP = sg * NSS * TC * NQ;
    if (FUSED != 0u) od_start();
    Job J = load_job(pc.job_off, jb);
#if QUANT
    // (a job's kind never has bit 31; the driver cannot know that, so g_vb stays a register)
    g_vb = (TYPE_V == T_Q8_0 ? 0x64806480u : 0x64006400u) ^ (J.kind & 0x80000000u);
#endif
    // the workgroup's split: pc.chunk cells, a slice of pc.chunk / NSG (whole tiles) a subgroup
    uint sub = pc.chunk / NSG, c0 = split_id * pc.chunk + sg * sub, c1 = min(c0 + sub, J.n_view);
    // The query's values first (rotated keys: R q, later), kept in registers until split:
    // their loads are then on the way while the first tile's page table entry is read, not
    // after it (H200, f16 batch 1, 256 / 4k cells: 0.2-0.5 us a call)
    uint q0 = J.q_off + kvh * G * HDK;
    uint qbad = 0u; // (FUSED) heads whose query values this invocation loaded not finite
#if QUANT
    // The query's blocks of 32 a subgroup rounds: rotated keys, all of them (R q is taken in
    // registers a subgroup); otherwise the workgroup rounds one Q for its subgroups, subgroup
    // sg blocks sg, sg + NSG, ... (a block's maximum stays within one subgroup; H200, q8_0 /
    // q4_0 batch 1 at 256 cells 10.2-10.3 -> 9.7-9.8 us, at 1k 11.0-11.2 -> 10.4-10.7)
    const uint NBLK = G * NB;                    // (at most 32)
    const bool SHARED_Q = ROT_K == 0u;
    const uint NBS = (NBLK + NSG - 1u) / NSG, NBN = SHARED_Q ? NBS : NBLK;
    uint QO = SHARED_Q ? 0u : KO;
    float xs[NBLK];                              // value `lane` of each
    if (ROT_K == 0u)
        [[unroll]] for (uint bi = 0u; bi < NBN; ++bi) {
            uint b = sg + NSG * bi;
            xs[bi] = b < NBLK ? qb[q0 + 32u * b + lane] : 0.0;
            qbad |= b < NBLK ? od_query_bad(xs[bi], b / NB) : 0u;
        }
#else
    // Pairs of query values an invocation takes: rotated keys, every subgroup all of them
    // (QP, index lane + 32 j; R q is taken in registers a subgroup); otherwise the workgroup
    // prepares one Q for its subgroups, QPW pairs an invocation (index tid + WG j)
    const bool SHARED_Q = ROT_K == 0u;
    const uint QP = (G * HDK / 2u + 31u) / 32u, QPW = (G * HDK / 2u + WG - 1u) / WG;
    const uint QN = SHARED_Q ? QPW : QP, QS = SHARED_Q ? WG : 32u;
    uint qi0 = SHARED_Q ? tid : lane;
    vec2 qv[QP];
    if (ROT_K == 0u)
        [[unroll]] for (uint j = 0u; j < QN; ++j) {
            uint i = qi0 + QS * j;
            qv[j] = i < G * HDK / 2u ? vec2(qb[q0 + 2u * i], qb[q0 + 2u * i + 1u]) : vec2(0.0);
            qbad |= od_query_bad(qv[j].x, 2u * i / HDK) | od_query_bad(qv[j].y, 2u * i / HDK);
        }
#endif
    // the first tile's rows are on their way while Q is prepared; the cells of the tile
    // after it are looked up one tile ahead (the page table read is off the critical path)
    uint gid0, gid1;
    bool vis0 = cell_at(J, c0, c1, lane, gid0);
    fetch_k(gid0, kvh, lane);
    fetch_v(gid0, kvh, lane);
    bool vis1 = cell_at(J, c0 + TC, c1, lane, gid1);

#if QUANT
    // Q: R q first for rotated keys; then every block rounded to q8_0 as attn_split_q.comp's
    // prologue does it (the same operations, so the same codes and scales): the blocks'
    // maxima by shuffles, invocation b block b's scale, each code into Q's rows as f16
    if (ROT_K != 0u) {
        qbad = rotate_query(q0, lane);
        sync_shared();
        [[unroll]] for (uint b = 0u; b < NBLK; ++b) xs[b] = rotated_query_at(32u * b + lane);
        sync_shared(); // R q is read out of kv before it is cleared
    }
    float amax[NBLK];
    [[unroll]] for (uint b = 0u; b < NBN; ++b) amax[b] = abs(xs[b]);
    [[unroll]] for (uint o = 1u; o < 32u; o <<= 1)
        [[unroll]] for (uint b = 0u; b < NBN; ++b) amax[b] = max(amax[b], subgroupShuffleXor(amax[b], o));
    float mine = 0.0; // (invocation bi: the subgroup's block bi)
    [[unroll]] for (uint b = 0u; b < NBN; ++b) mine = lane == b ? amax[b] : mine;
    float qd = div_rn(mine, 127.0), qid = qd != 0.0 ? div_rn(1.0, qd) : 0.0;
    if (SHARED_Q) {
        for (uint i = tid; i < NQ * SK; i += WG) kv[i] = uvec4(0u);
        barrier();
    } else {
        for (uint i = lane; i < NQ * SK; i += 32u) kv[KO + i] = uvec4(0u);
        sync_shared();
    }
    [[unroll]] for (uint bi = 0u; bi < NBN; ++bi) {
        uint b = SHARED_Q ? sg + NSG * bi : bi;
        float code = float(clamp(int(roundEven(xs[bi] * subgroupShuffle(qid, bi))), -127, 127));
        float next = subgroupShuffleXor(code, 1u);
        uint g = b / NB, d = 32u * (b % NB) + lane;
#if IK // (four codes a word, as bytes)
        uint c2 = uint(int(subgroupShuffleXor(code, 2u))) & 0xffu, c3 = uint(int(subgroupShuffleXor(code, 3u))) & 0xffu;
        uint word = (uint(int(code)) & 0xffu) | (uint(int(next)) & 0xffu) << 8 | c2 << 16 | c3 << 24;
        if ((lane & 3u) == 0u && b < NBLK) kv[QO + g * SK + d / 16u][(d / 4u) % 4u] = word;
#else
        if ((lane & 1u) == 0u && b < NBLK) kv[QO + g * SK + d / 8u][(d / 2u) % 4u] = packHalf2x16(vec2(code, next));
#endif
    }
    // the owner's query scales (d_q x scale_log2) of its heads hb, hb + 2, ..., [head][block]
    // (SHARED_Q: through ss, which holds nothing yet, once every subgroup has put its own)
    float qs = h2f(f2h(qd)) * pc.scale_log2, qsc[NT][NB];
    if (SHARED_Q) {
        if (lane < NBS && sg + NSG * lane < NBLK) ss[sg + NSG * lane] = qs;
    } else {
        [[unroll]] for (uint t = 0u; t < NT; ++t)
            [[unroll]] for (uint b = 0u; b < NB; ++b) qsc[t][b] = subgroupShuffle(qs, min(hb + 2u * t, G - 1u) * NB + b);
    }
#else
    // Q: scaled to base 2, each head's row by a power of two into (-1, 1) (its own: a row
    // holding a NaN or an infinity, whose output is NaN, must not change the other heads'
    // bits; kvcache.h's rule), split hi / lo into rows of kv
    uint qm[G];                                  // each head's largest finite |q|, as bits
    [[unroll]] for (uint g = 0u; g < G; ++g) qm[g] = 0u;
    if (ROT_K != 0u) {
        qbad = rotate_query(q0, lane);
        sync_shared();
    }
    [[unroll]] for (uint j = 0u; j < QN; ++j) {
        uint i = qi0 + QS * j;
        if (ROT_K != 0u)
            qv[j] = i < G * HDK / 2u ? vec2(rotated_query_at(2u * i), rotated_query_at(2u * i + 1u)) : vec2(0.0);
        qv[j] *= pc.scale_log2;
        uvec2 a = floatBitsToUint(abs(qv[j]));   // (non-negative floats order as their bits)
        uint mx = max(a.x < 0x7f800000u ? a.x : 0u, a.y < 0x7f800000u ? a.y : 0u);
        [[unroll]] for (uint g = 0u; g < G; ++g)
            if (i < G * HDK / 2u && g == (2u * i) / HDK) qm[g] = max(qm[g], mx);
    }
    if (ROT_K != 0u) sync_shared(); // R q is read out of kv before it is cleared
    // each head's largest |q| over the workgroup (SHARED_Q: the subgroups' maxima through om,
    // which holds nothing yet) or the subgroup, with Q's rows cleared (SHARED_Q: subgroup 0's
    // piece of kv, QO). One Q a workgroup instead of one a subgroup: H200, batch 1 / 8 at 256
    // cells 9.4-9.5 -> 8.9-9.0 / 12.3 -> 11.9-12.0 us, at 4k 15.1-15.2 -> 14.8-14.9 / 44.9-45.2
    // -> 44.2-44.3 (three rounds alternating; 32k and 128k unchanged)
    float qmaxv[G];
    uint QO = SHARED_Q ? 0u : KO;
    if (SHARED_Q) {
        [[unroll]] for (uint g = 0u; g < G; ++g) {
            uint v = subgroupMax(qm[g]);
            if (lane == 0u) om[sg * G + g] = uintBitsToFloat(v);
        }
        for (uint i = tid; i < NQ * SK; i += WG) kv[i] = uvec4(0u);
        barrier();
        [[unroll]] for (uint g = 0u; g < G; ++g) {
            float v = 0.0; // (non-negative finite floats order as their bits)
            [[unroll]] for (uint k = 0u; k < NSG; ++k) v = max(v, om[k * G + g]);
            qmaxv[g] = v;
        }
    } else {
        [[unroll]] for (uint g = 0u; g < G; ++g) qmaxv[g] = uintBitsToFloat(subgroupMax(qm[g]));
        for (uint i = lane; i < NQ * SK; i += 32u) kv[KO + i] = uvec4(0u);
        sync_shared();
    }
    // 2^-qe as a float multiplies exactly where it is one (qe >= -126: every query but one
    // made of subnormals); ldexp, the general case, compiles to a long branchy sequence per
    // value (H200, 4k cells, batch 1: 15.6-15.7 -> 14.6 us)
    int qe[G];
    float down[G];
    [[unroll]] for (uint g = 0u; g < G; ++g) {
        float qmax = qmaxv[g];
        qe[g] = 0;
        if (qmax > 0.0) frexp(qmax, qe[g]);
        down[g] = qe[g] >= -126 ? uintBitsToFloat(qe[g] <= 126 ? uint(127 - qe[g]) << 23 : 1u << uint(149 - qe[g])) : 0.0;
    }
    [[unroll]] for (uint j = 0u; j < QN; ++j) {
        uint i = qi0 + QS * j, g = (2u * i) / HDK, d = (2u * i) % HDK;
        if (i >= G * HDK / 2u) break;
        int e = 0;
        float dn = 0.0;
        [[unroll]] for (uint h = 0u; h < G; ++h) // (selects, not an indexed register array)
            if (h == g) { e = qe[h]; dn = down[h]; }
        vec2 q = e >= -126 ? qv[j] * dn : ldexp(qv[j], ivec2(-e));
        vec2 a = split(q.x), b = split(q.y);
        kv[QO + g * SK + d / 8u][(d / 2u) % 4u] = packHalf2x16(vec2(a.x, b.x));
        kv[QO + (G + g) * SK + d / 8u][(d / 2u) % 4u] = packHalf2x16(vec2(a.y, b.y));
    }
#endif
    if (!REGS) {
        for (uint i = lane; i < 16u * NQ; i += 32u) am[SO + i] = 1.0;
        for (uint i = lane; i < NSS * TC * NQ; i += 32u) ps[SP + i] = float16_t(0.0);
    }
    if (SHARED_Q) barrier(); else sync_shared();
#if IK
    IMATB qi[NB];
    [[unroll]] for (uint b = 0u; b < NB; ++b) coopMatLoadNV(qi[b], kv, QO + 2u * b, SK, true);
#else
    MATB qf[HDK / 16u];
    [[unroll]] for (uint k = 0u; k < HDK / 16u; ++k) coopMatLoadNV(qf[k], kv, QO + 2u * k, SK, true);
#endif
#if QUANT
    if (SHARED_Q)
        [[unroll]] for (uint t = 0u; t < NT; ++t)
            [[unroll]] for (uint b = 0u; b < NB; ++b) qsc[t][b] = ss[min(hb + 2u * t, G - 1u) * NB + b];
    float qsl[NSL][NB]; // REGS: the query scales of a lane's columns (a lo column: its head's)
    [[unroll]] for (uint k = 0u; k < NSL; ++k) {
        uint c = el_col(lane, k), hc = min(c < G ? c : c - G, G - 1u);
        [[unroll]] for (uint b = 0u; b < NB; ++b)
            qsl[k][b] = SHARED_Q ? ss[hc * NB + b] : subgroupShuffle(qs, hc * NB + b);
    }
#endif
    MATC o[HDV / 16u];
    [[unroll]] for (uint t = 0u; t < HDV / 16u; ++t) o[t] = MATC(0.0);
    float m[NT], l[NT];
    [[unroll]] for (uint t = 0u; t < NT; ++t) { m[t] = NEG_INF; l[t] = 0.0; }
#if QUANT
    int rb[NB];    // R_b: O^T's rows of block b are in units of 2^(R_b + 1)
    float fw[NB];  // 2^-(R_b + 1)
    [[unroll]] for (uint b = 0u; b < NB; ++b) { rb[b] = -125; fw[b] = pow2(124); }
#endif
#if !QUANT
    float escale[NT]; // the query scalings undone: this invocation's heads hb, hb + 2, ...
    [[unroll]] for (uint t = 0u; t < NT; ++t) {
        escale[t] = 1.0;
        [[unroll]] for (uint h = 0u; h < G; ++h)
            if (h == hb + 2u * t) escale[t] = ldexp(1.0, qe[h]);
    }
    float esc[NSL]; // REGS: the query scalings undone, a lane's columns (slots)
    [[unroll]] for (uint k = 0u; k < NSL; ++k) {
        uint c = el_col(lane, k), hc = c < G ? c : c < 2u * G ? c - G : G;
        esc[k] = 1.0;
        [[unroll]] for (uint h = 0u; h < G; ++h)
            if (h == hc) esc[k] = ldexp(1.0, qe[h]);
    }
#endif
    float ms[NSL], ls[NSL]; // REGS: running maxima and sums of a lane's columns
    [[unroll]] for (uint k = 0u; k < NSL; ++k) { ms[k] = NEG_INF; ls[k] = 0.0; }

    if (SHARED_Q) barrier(); else sync_shared(); // everyone has read Q out of kv (SHARED_Q: subgroup 0 stages K there next)
    [[dont_unroll]] for (uint base = c0; base < c1; base += TC) {
        // stage this tile's K and start loading the next tile's (past the end: cell 0, never
        // used); its V waits in registers until the scores are taken, then goes where K was
#if QUANT
#if IK
        [[unroll]] for (uint j = 0u; j < NKQ; ++j) { uint i = lane + 32u * j; stage_k_i8(kr[j], i / KQ, i % KQ); }
#else
        [[unroll]] for (uint j = 0u; j < NKQ; ++j) { uint i = lane + 32u * j; stage_k_codes(kr[j], i / KQ, i % KQ); }
#endif
        float dk[NB], dv[NB]; // this tile's scales of this invocation's cell (the next tile's load into ksw / vsw)
        int ev[NB];           // their V scales' exponents (visible cells; scales are not negative:
        bool wider = false;   // a NaN or an infinity counts as 2^128, and its row is NaN)
        [[unroll]] for (uint b = 0u; b < NB; ++b) {
            dk[b] = BLOCK_SCALE(ksw, b);
            dv[b] = BLOCK_SCALE(vsw, b);
            ev[b] = vis0 ? clamp(int((floatBitsToUint(dv[b]) >> 23) & 0xffu) - 127, -125, 125) : -125;
            wider = wider || ev[b] > rb[b];
        }
        // R_b grows (one vote; after the first tiles it seldom does): the blocks' maxima
        if (subgroupAny(wider))
            [[unroll]] for (uint b = 0u; b < NB; ++b) {
                int e = subgroupMax(ev[b]);
                if (e > rb[b]) { // (uniform)
                    float f = rb[b] - e >= -126 ? pow2(rb[b] - e) : 0.0;
                    [[unroll]] for (uint t = 2u * b; t < 2u * b + 2u; ++t)
                        for (int i = 0; i < o[t].length(); ++i) o[t][i] *= f;
                    rb[b] = e;
                    fw[b] = pow2(-e - 1);
                }
            }
#else
        [[unroll]] for (uint j = 0u; j < NK; ++j) { uint i = lane + 32u * j; kv[KO + (i / CK) * SK + i % CK] = kr[j]; }
#endif
        fetch_k(gid1, kvh, lane);
        loads_issued();
        sync_shared();

#if QUANT
        // REGS: the scales of the cells of a lane's two rows (cell r: lane r's)
        float dkr[2][NB], dvr[2][NB], xs[NE];
        if (REGS) {
            [[unroll]] for (uint h = 0u; h < 2u; ++h)
                [[unroll]] for (uint b = 0u; b < NB; ++b) {
                    dkr[h][b] = subgroupShuffle(dk[b], el_row(lane, h * NSL));
                    dvr[h][b] = subgroupShuffle(dv[b], el_row(lane, h * NSL));
                }
            [[unroll]] for (uint i = 0u; i < NE; ++i) xs[i] = 0.0;
        }
        // each block's integer sums: its two products of 16 values (IK: one of 32 8-bit
        // integers; REGS: added into the scores times the block scales here, in the order the
        // shared-memory path adds them)
        [[unroll]] for (uint b = 0u; b < NB; ++b) {
#if IK
            IMATA kt;
            coopMatLoadNV(kt, kv, KO + 2u * b, SK, false);
            MATC sb = MATC(coopMatMulAddNV(kt, qi[b], IMATC(0))); // (exact in f32: |sum| <= 32 x 127 x 127)
#else
            MATA kt;
            MATC sb = MATC(0.0);
            coopMatLoadNV(kt, kv, KO + 4u * b, SK, false);
            sb = coopMatMulAddNV(kt, qf[2u * b], sb);
            coopMatLoadNV(kt, kv, KO + 4u * b + 2u, SK, false);
            sb = coopMatMulAddNV(kt, qf[2u * b + 1u], sb);
#endif
            if (REGS)
                [[unroll]] for (uint i = 0u; i < NE; ++i) xs[i] += sb[i] * (dkr[i / NSL][b] * qsl[i % NSL][b]);
            else
                coopMatStoreNV(sb, ss, SP + b * TC * NQ, NQ, false);
        }
#else
        // scores, two accumulators for a shorter dependency chain
        MATC s0 = MATC(0.0), s1 = MATC(0.0);
        [[unroll]] for (uint k = 0u; k < HDK / 16u; k += 2u) {
            MATA kt;
            coopMatLoadNV(kt, kv, KO + 2u * k, SK, false);
            s0 = coopMatMulAddNV(kt, qf[k], s0);
            if (k + 1u < HDK / 16u) {
                coopMatLoadNV(kt, kv, KO + 2u * k + 2u, SK, false);
                s1 = coopMatMulAddNV(kt, qf[k + 1u], s1);
            }
        }
        for (int i = 0; i < s0.length(); ++i) s0[i] += s1[i]; // (same layout: element-wise)
        if (!REGS) coopMatStoreNV(s0, ss, SP, NQ, false);
#endif
        sync_shared(); // (the K tile is read)

        // stage V (rows of cells it may not see: zeros, their weight is 0 but their bytes
        // anything), start loading the next tile's, look up the cells of the one after it
        bool vis = vis0;
#if QUANT // (codes are finite: a hidden cell's row times its zero weights adds nothing)
        [[unroll]] for (uint j = 0u; j < NVQ; ++j) { uint i = lane + 32u * j; stage_v_codes(vr[j], i / VQ, i % VQ); }
#else
        uint hidden = subgroupBallot(!vis).x & 0xffffu; // (lanes 16-31 repeat lanes 0-15's cells)
        [[unroll]] for (uint j = 0u; j < NV; ++j) {
            uint i = lane + 32u * j;
            kv[KO + (i / CV) * SV + i % CV] = (hidden & (1u << (i / CV))) != 0u ? uvec4(0u) : vr[j];
        }
#endif
        fetch_v(gid1, kvh, lane);
        loads_issued();
        vis0 = vis1;
        vis1 = cell_at(J, base + 2u * TC, c1, lane, gid1);

        MATB pb[NSS];
        if (REGS) {
            // softmax on S^T's elements: a lane's two rows (cells) and NSL columns, each head's hi
            // column with its lo partner's score (QUANT: a lo column takes its head's score)
            float y[NE], x[NE];
#if QUANT
            uint hidden = subgroupBallot(!vis).x & 0xffffu;
            // each of the lane's two rows' V scale times fw, once a tile; zero for a hidden
            // row (its scale may be anything), so its weights are zero, not a product
            float dvf[2][NB];
            [[unroll]] for (uint h = 0u; h < 2u; ++h) {
                bool rv = ((hidden >> el_row(lane, h * NSL)) & 1u) == 0u;
                [[unroll]] for (uint b = 0u; b < NB; ++b) dvf[h][b] = rv ? dvr[h][b] * fw[b] : 0.0;
            }
            partners(xs, lane, y);
            [[unroll]] for (uint i = 0u; i < NE; ++i) x[i] = el_col(lane, i) < G ? xs[i] : y[i];
#else
            [[unroll]] for (uint i = 0u; i < NE; ++i) x[i] = s0[i];
            partners(x, lane, y);
            [[unroll]] for (uint i = 0u; i < NE; ++i) {
                uint c = el_col(lane, i);
                x[i] = (c < G ? s0[i] + y[i] * INV_LO : y[i] + s0[i] * INV_LO) * esc[i % NSL];
            }
#endif
            if (pc.softcap2 > 0.0) [[unroll]] for (uint i = 0u; i < NE; ++i) x[i] = score_capped(x[i], pc.softcap2);
            else [[unroll]] for (uint i = 0u; i < NE; ++i) x[i] = score_finite(x[i]);
            bool above = false, seen[NE];
            [[unroll]] for (uint i = 0u; i < NE; ++i) {
                seen[i] = ((hidden >> el_row(lane, i)) & 1u) == 0u && el_col(lane, i) < 2u * G;
                x[i] = seen[i] ? x[i] : NEG_INF;
                above = above || x[i] > ms[i % NSL];
            }
            float alpha[NSL];
            bool grew = false;
            if (subgroupAny(above)) {
                [[unroll]] for (uint k = 0u; k < NSL; ++k) {
                    float mn = max(ms[k], column_max(x[k], x[k + NSL]));
                    alpha[k] = mn == NEG_INF ? 1.0 : exp2(ms[k] - mn);
                    ms[k] = mn;
                    ls[k] *= alpha[k];
                    grew = grew || alpha[k] != 1.0;
                }
                grew = subgroupAny(grew);
            }
            MATC pm[NSS];
            [[unroll]] for (uint i = 0u; i < NE; ++i) {
                float p = x[i] == NEG_INF ? 0.0 : exp2(x[i] - ms[i % NSL]);
                ls[i % NSL] += p;
                bool hi = el_col(lane, i) < G;
#if QUANT
                [[unroll]] for (uint b = 0u; b < NB; ++b) {
                    vec2 h = split(p * dvf[i / NSL][b]); // (p is 0 where !seen[i])
                    pm[b][i] = hi ? h.x : h.y;
                }
#else
                vec2 h = split(p);
                pm[0][i] = hi ? h.x : h.y;
#endif
            }
            // O^T rescaled every tile, by 1 where no maximum grew (the same bits): without a
            // branch here the driver's compiler schedules the tile better (not read in its
            // SASS; H200, f16, batch 1 at 4k cells 12.7-12.8 -> 12.3-12.5 us, batch 8 at 1k
            // 15.5 -> 14.8-14.9; q8_0 batch 1 at 4k 14.1-14.3 -> 13.7-13.8)
            [[unroll]] for (uint k = 0u; k < NSL; ++k) alpha[k] = grew ? alpha[k] : 1.0;
            [[unroll]] for (uint t = 0u; t < HDV / 16u; ++t)
                [[unroll]] for (uint i = 0u; i < NE; ++i) o[t][i] *= alpha[i % NSL];
            [[unroll]] for (uint b = 0u; b < NSS; ++b) pb[b] = MATB(pm[b]);
            sync_shared(); // (V staged)
        } else {
            // softmax: this invocation takes cell lc for heads hb, hb + 2, ...
            float x[NT];
            bool above = false;
            [[unroll]] for (uint t = 0u; t < NT; ++t) {
                uint a = lc * NQ + hb + 2u * t;
#if QUANT
                x[t] = 0.0; // (as attn_split_q.comp adds them)
                [[unroll]] for (uint b = 0u; b < NB; ++b) x[t] += ss[SP + b * TC * NQ + a] * (dk[b] * qsc[t][b]);
#else
                x[t] = (ss[SP + a] + ss[SP + a + G] * INV_LO) * escale[t];
#endif
            }
            // soft-capped in base 2; +inf if not finite (attn_common.glsl: the cap's branch outside the loops)
            if (pc.softcap2 > 0.0) [[unroll]] for (uint t = 0u; t < NT; ++t) x[t] = score_capped(x[t], pc.softcap2);
            else [[unroll]] for (uint t = 0u; t < NT; ++t) x[t] = score_finite(x[t]);
            [[unroll]] for (uint t = 0u; t < NT; ++t) {
                x[t] = vis && hb + 2u * t < G ? x[t] : NEG_INF;
                above = above || x[t] > m[t];
            }
            // A tile with no score above its head's running maximum (after the first tiles, most
            // tiles) keeps the maxima and has nothing to rescale: it skips the cross-lane maxima,
            // the factors and the rescale's round trip (what the general path gives then, alpha = 1)
            float p[NT];
            bool grew = false;
            if (subgroupAny(above)) {
                [[unroll]] for (uint t = 0u; t < NT; ++t) {
                    uint g = hb + 2u * t;
                    float mb = subgroupClusteredMax(x[t], 16u);
                    float mn = max(m[t], mb);
                    float alpha = mn == NEG_INF ? 1.0 : exp2(m[t] - mn);
                    p[t] = x[t] == NEG_INF ? 0.0 : exp2(x[t] - mn);
                    l[t] = l[t] * alpha + p[t];
                    m[t] = mn;
                    grew = grew || alpha != 1.0;
                    if (g < G) {
                        am[SO + lc * NQ + g] = alpha;
                        am[SO + lc * NQ + G + g] = alpha;
                    }
                }
                grew = subgroupAny(grew);
            } else {
                [[unroll]] for (uint t = 0u; t < NT; ++t) {
                    p[t] = x[t] == NEG_INF ? 0.0 : exp2(x[t] - m[t]);
                    l[t] += p[t];
                }
            }
            [[unroll]] for (uint t = 0u; t < NT; ++t) {
                uint g = hb + 2u * t;
                if (g < G) {
#if QUANT
                    [[unroll]] for (uint b = 0u; b < NB; ++b) {
                        // a hidden cell's scale may be anything: its weight is zero, not a product
                        float w = vis ? p[t] * dv[b] : 0.0;
                        vec2 h = split(w * fw[b]); // (exact: a power of two)
                        ps[SP + b * TC * NQ + lc * NQ + g] = float16_t(h.x);
                        ps[SP + b * TC * NQ + lc * NQ + G + g] = float16_t(h.y);
                    }
#else
                    vec2 h = split(p[t]);
                    ps[SP + lc * NQ + g] = float16_t(h.x);
                    ps[SP + lc * NQ + G + g] = float16_t(h.y);
#endif
                }
            }
            sync_shared();
            if (grew) {
                MATC a;
                coopMatLoadNV(a, am, SO, NQ, false);
                [[unroll]] for (uint t = 0u; t < HDV / 16u; ++t)
                    for (int i = 0; i < o[t].length(); ++i) o[t][i] *= a[i];
            }
            [[unroll]] for (uint b = 0u; b < NSS; ++b) coopMatLoadNV(pb[b], ps, SP + b * TC * NQ, NQ, false);
        }

        // values
        [[unroll]] for (uint t = 0u; t < HDV / 16u; ++t) {
            MATA vt;
            coopMatLoadNV(vt, kv, KO + 2u * t, SV, true);
            o[t] = coopMatMulAddNV(vt, pb[QUANT != 0 ? t / 2u : 0u], o[t]);
        }
        sync_shared(); // kv, ss, ps are rewritten by the next tile
    }

    // out: O^T columns through shared memory (column n at n * HDV floats from KO), hi + lo *
    // 2^-12, and each head's (max, sum) into om / ol; then the workgroup's subgroups merged
    // into one partial (log-sum-exp: weights 2^(m_s - M), a subgroup with no cell adds nothing)
#if QUANT
    [[unroll]] for (uint t = 0u; t < HDV / 16u; ++t)
        for (int i = 0; i < o[t].length(); ++i) o[t][i] *= pow2(rb[t / 2u] + 1);
#endif
    [[unroll]] for (uint t = 0u; t < HDV / 16u; ++t) coopMatStoreNV(o[t], kv, KO + 4u * t, HDV / 4u, true);
    if (REGS) {
        [[unroll]] for (uint k = 0u; k < NSL; ++k) {
            float lt = ls[k];
            lt += subgroupShuffleXor(lt, 4u);
            lt += subgroupShuffleXor(lt, 8u);
            lt += subgroupShuffleXor(lt, 16u);
            uint c = el_col(lane, k);
            if (lane < 4u && c < G) {
                om[sg * G + c] = ms[k];
                ol[sg * G + c] = lt;
            }
        }
    } else {
        [[unroll]] for (uint t = 0u; t < NT; ++t) {
            float lt = subgroupClusteredAdd(l[t], 16u);
            uint g = hb + 2u * t;
            if (lc == 0u && g < G) {
                om[sg * G + g] = m[t];
                ol[sg * G + g] = lt;
            }
        }
    }
    barrier();
    uint stride = OD_STRIDE, at0 = ((jb * KV_HEADS * G + kvh * G) * pc.n_splits + split_id) * stride;
    for (uint i = tid; i < G * HDV; i += WG) {
        uint g = i / HDV, d = i % HDV;
        float mx = NEG_INF, acc = 0.0;
        [[unroll]] for (uint s = 0u; s < NSG; ++s) mx = max(mx, om[s * G + g]);
        [[unroll]] for (uint s = 0u; s < NSG; ++s) {
            float w = NSG == 1u ? 1.0 : om[s * G + g] == NEG_INF ? 0.0 : exp2(om[s * G + g] - mx);
            uint b = s * KVW + g * (HDV / 4u) + d / 4u, bl = s * KVW + (G + g) * (HDV / 4u) + d / 4u;
#if QUANT
            uint e = in_order(d) % 4u; // (stage_v_codes's order)
#else
            uint e = d % 4u;
#endif
            float hi = uintBitsToFloat(kv[b][e]), lo = uintBitsToFloat(kv[bl][e]);
            if (w != 0.0) acc += (hi + lo * INV_LO) * w;
        }
        part[at0 + g * pc.n_splits * stride + OD_PO + d] = acc;
    }
    if (tid < G) {
        float mx = NEG_INF, sum = 0.0;
        [[unroll]] for (uint s = 0u; s < NSG; ++s) mx = max(mx, om[s * G + tid]);
        [[unroll]] for (uint s = 0u; s < NSG; ++s) {
            float w = NSG == 1u ? 1.0 : om[s * G + tid] == NEG_INF ? 0.0 : exp2(om[s * G + tid] - mx);
            if (w != 0.0) sum += ol[s * G + tid] * w;
        }
        part[at0 + tid * pc.n_splits * stride] = mx;
        part[at0 + tid * pc.n_splits * stride + 1u] = sum;
    }
    if (FUSED != 0u) od_finish(J, jb, kvh, qbad);
}
