#version 450
// attn_split_q.comp - decode attention, split-K pass, over q8_0 / q4_0 K and V held in the
// planar page layout (kvc_types.glsl: per page, the codes of each kv head's cells side by
// side, then their scales), head dims 64, 128, 256 or 512 for both. A workgroup is one
// subgroup-sized team of 32 invocations that takes one job, one kv head, GH query heads of
// its GQA group and one chunk of the job's cells. Every load is a wide, coalesced one:
// invocation t reads 16 values of a head row (q8_0: 16 bytes, q4_0: 8 bytes) of K and of
// V, segment s = t % NSEG of cell t / NSEG of each load row (CPR cells a row), and a tile
// is TR such rows (TILE cells), its loads all issued before any is used. So the cell of
// an invocation's K segment is the cell of its V segment: its softmax weight is where its
// values are, and nothing moves between invocations but the sums:
//   scores   the segment's packed 8-bit dot products with the query's q8_0 codes (as the
//            CPU scores block-typed keys; q4_0: nibbles, less 8 times the codes' sum),
//            times the block scales, summed over the NSEG invocations of the cell;
//   softmax  one maximum per head per tile, running maxima (base 2); rescaling skipped
//            where no maximum moved;
//   values   each invocation sums weight x scale x code for its 16 values over its cells;
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
layout(local_size_x = 32) in;

const uint NSEG = HD / 16u;      // invocations per cell
const uint CPR = 32u / NSEG;     // cells per load row
const uint TR = 8u;              // load rows per tile
const uint TILE = CPR * TR;      // cells per tile (kvcache_vk.h: 4096 / HD)
const uint NHG = (G + GH - 1u) / GH;
const uint NB = HD / 32u;        // blocks of a head row

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
} pc;

uint ldw(uint which, uint w) { return which == 0u ? kw[w] : vw[w]; }
#include "kvc_types.glsl"
#include "attn_common.glsl"

shared float qs[GH * HD];
shared uint qc[GH * HD / 4u];
shared float qsc[GH * NB];
shared uint gids[TILE];
shared bool viss[TILE];
#if !USE_SUBGROUP
shared float red[32u * GH];
#endif
const float NEG_INF = -1.0 / 0.0;

// sums over the NSEG invocations of a cell (every one gets the sum), and maxima and sums
// over the CPR cells of a load row (the invocations of one segment)
void seg_sum(inout float v[GH]) {
#if USE_SUBGROUP
    [[unroll]] for (uint o = 1u; o < NSEG; o <<= 1)
        [[unroll]] for (uint g = 0u; g < GH; ++g) v[g] += subgroupShuffleXor(v[g], o);
#else
    uint t = gl_LocalInvocationID.x, c0 = t - t % NSEG;
    [[unroll]] for (uint g = 0u; g < GH; ++g) red[g * 32u + t] = v[g];
    barrier();
    [[unroll]] for (uint g = 0u; g < GH; ++g) {
        float a = 0.0;
        for (uint k = 0u; k < NSEG; ++k) a += red[g * 32u + c0 + k];
        v[g] = a;
    }
    barrier();
#endif
}
void row_reduce(inout float v[GH], bool is_max) {
#if USE_SUBGROUP
    [[unroll]] for (uint o = NSEG; o < 32u; o <<= 1)
        [[unroll]] for (uint g = 0u; g < GH; ++g) {
            float x = subgroupShuffleXor(v[g], o);
            v[g] = is_max ? max(v[g], x) : v[g] + x;
        }
#else
    uint t = gl_LocalInvocationID.x, s = t % NSEG;
    [[unroll]] for (uint g = 0u; g < GH; ++g) red[g * 32u + t] = v[g];
    barrier();
    [[unroll]] for (uint g = 0u; g < GH; ++g) {
        float a = red[g * 32u + s];
        for (uint k = 1u; k < CPR; ++k) {
            float x = red[g * 32u + k * NSEG + s];
            a = is_max ? max(a, x) : a + x;
        }
        v[g] = a;
    }
    barrier();
#endif
}

// codes to floats without int-to-float conversions: 2^23 + biased code as float bits
float q8f(uint wb, uint k) { return uintBitsToFloat(0x4b000000u | bitfieldExtract(wb, int(8u * k), 8)) - 8388736.0; }
float q4f(uint w, uint k) { return uintBitsToFloat(0x4b000000u | bitfieldExtract(w, int(4u * k), 4)) - 8388616.0; }

void main() {
    uint kvh = gl_WorkGroupID.x / NHG, hg = gl_WorkGroupID.x % NHG, split = gl_WorkGroupID.y, jb = gl_WorkGroupID.z;
    uint t = gl_LocalInvocationID.x, s = t % NSEG, r = t / NSEG;
    Job J = load_job(pc.job_off, jb);
    uint h0 = hg * GH; // first query head of the group
    // the query rounded to q8_0 as on the CPU (as attn_split.comp does it): per block of 32,
    // d = amax / 127 stored as f16, codes rint(x / d) in +-127, four to a word
    for (uint i = t; i < GH * HD; i += 32u)
        qs[i] = h0 + i / HD < G ? qb[J.q_off + (kvh * G + h0) * HD + i] : 0.0;
    barrier();
    for (uint b = t; b < GH * NB; b += 32u) {
        float amax = 0.0;
        for (uint j = 0u; j < 32u; ++j) amax = max(amax, abs(qs[32u * b + j]));
        float d = div_rn(amax, 127.0), id = d != 0.0 ? div_rn(1.0, d) : 0.0;
        for (uint w = 0u; w < 8u; ++w) {
            uint packed = 0u;
            for (uint c = 0u; c < 4u; ++c) {
                int code = clamp(int(roundEven(qs[32u * b + 4u * w + c] * id)), -127, 127);
                packed |= (uint(code) & 0xffu) << (8u * c);
            }
            qc[8u * b + w] = packed;
        }
        qsc[b] = h2f(f2h(d)) * pc.scale_log2;
    }
    barrier();
    // this invocation's query words: q8_0, the 16 codes of segment s; q4_0, the 8 codes of
    // the low nibbles (values 8 (s % 2) .. of block s / 2) and the 8 of the high ones (16 on)
    uint qw[GH][4];
    float qf[GH], qbias[GH];
    const uint kblk = TYPE_K == T_Q8_0 ? s / 2u : s / 2u;
    [[unroll]] for (uint g = 0u; g < GH; ++g) {
        uint w0 = g * HD / 4u + 8u * kblk;
        if (TYPE_K == T_Q8_0) {
            [[unroll]] for (uint k = 0u; k < 4u; ++k) qw[g][k] = qc[w0 + 4u * (s & 1u) + k];
        } else {
            uint lo = w0 + 2u * (s & 1u);
            qw[g][0] = qc[lo]; qw[g][1] = qc[lo + 1u]; qw[g][2] = qc[lo + 4u]; qw[g][3] = qc[lo + 5u];
        }
        int qsum = 0;
        [[unroll]] for (uint k = 0u; k < 4u; ++k) qsum += sdot(qw[g][k], 0x01010101u);
        qbias[g] = float(8 * qsum);
        qf[g] = qsc[g * NB + kblk];
    }

    const uint kcb = TYPE_K == T_Q8_0 ? HD : HD / 2u, vcb = TYPE_V == T_Q8_0 ? HD : HD / 2u;
    // page p's K planes: codes at p * P * row, scales after the P * KV_HEADS code rows
    uint kpage = PAGE_CELLS * pc.k_row_bytes, vpage = PAGE_CELLS * pc.v_row_bytes;
    uint kcode0 = (kvh * PAGE_CELLS) * kcb, vcode0 = (kvh * PAGE_CELLS) * vcb;
    uint kscl0 = PAGE_CELLS * KV_HEADS * kcb + (kvh * PAGE_CELLS) * (HD / 16u);
    uint vscl0 = PAGE_CELLS * KV_HEADS * vcb + (kvh * PAGE_CELLS) * (HD / 16u);

    float acc[GH][16];
    [[unroll]] for (uint g = 0u; g < GH; ++g) [[unroll]] for (uint k = 0u; k < 16u; ++k) acc[g][k] = 0.0;
    float m[GH], l[GH];
    [[unroll]] for (uint g = 0u; g < GH; ++g) { m[g] = NEG_INF; l[g] = 0.0; }

    uint c0 = split * pc.chunk, c1 = min(c0 + pc.chunk, J.n_view);
    [[dont_unroll]] for (uint base = c0; base < c1; base += TILE) { // uniform trip count
        for (uint c = t; c < TILE; c += 32u) {
            uint vi = base + c, gid = 0u;
            bool vis = vi < c1 && cell_visible(J, vi, PAGE_CELLS, gid);
            gids[c] = vis ? gid : 0u;
            viss[c] = vis;
        }
        barrier();
        // every load of the tile first
        uvec4 kx[TR], vx[TR];
        uint kh[TR], vh[TR];
        bool vis[TR];
        [[unroll]] for (uint j = 0u; j < TR; ++j) {
            uint c = j * CPR + r, gid = gids[c], page = gid / PAGE_CELLS, slot = gid % PAGE_CELLS;
            vis[j] = viss[c];
            uint kc = page * kpage + kcode0 + slot * kcb, vc = page * vpage + vcode0 + slot * vcb;
            if (TYPE_K == T_Q8_0) kx[j] = kb[(kc >> 4) + s];
            else { uvec2 x = kd[(kc >> 3) + s]; kx[j] = uvec4(x, 0u, 0u); }
            if (TYPE_V == T_Q8_0) vx[j] = vb[(vc >> 4) + s];
            else { uvec2 x = vd[(vc >> 3) + s]; vx[j] = uvec4(x, 0u, 0u); }
            uint ks = page * kpage + kscl0 + slot * (HD / 16u) + 2u * (s / 2u);
            uint vs = page * vpage + vscl0 + slot * (HD / 16u) + 2u * (s / 2u);
            kh[j] = kw[ks >> 2] >> ((ks & 2u) << 3);
            vh[j] = vw[vs >> 2] >> ((vs & 2u) << 3);
        }
        // scores
        float sc[TR][GH];
        float mx[GH];
        [[unroll]] for (uint g = 0u; g < GH; ++g) mx[g] = NEG_INF;
        [[unroll]] for (uint j = 0u; j < TR; ++j) {
            float dk = h2f(kh[j] & 0xffffu);
            float v[GH];
            [[unroll]] for (uint g = 0u; g < GH; ++g) {
                int is;
                if (TYPE_K == T_Q8_0)
                    is = sdot(kx[j].x, qw[g][0]) + sdot(kx[j].y, qw[g][1]) + sdot(kx[j].z, qw[g][2]) + sdot(kx[j].w, qw[g][3]);
                else
                    is = sdot(kx[j].x & 0x0f0f0f0fu, qw[g][0]) + sdot(kx[j].y & 0x0f0f0f0fu, qw[g][1]) +
                         sdot((kx[j].x >> 4) & 0x0f0f0f0fu, qw[g][2]) + sdot((kx[j].y >> 4) & 0x0f0f0f0fu, qw[g][3]);
                float fi = TYPE_K == T_Q8_0 ? float(is) : float(is) - qbias[g];
                v[g] = vis[j] ? fi * (dk * qf[g]) : 0.0;
            }
            seg_sum(v);
            [[unroll]] for (uint g = 0u; g < GH; ++g) {
                sc[j][g] = vis[j] ? v[g] : NEG_INF;
                mx[g] = max(mx[g], sc[j][g]);
            }
        }
        row_reduce(mx, true);
        bool moved = false;
        [[unroll]] for (uint g = 0u; g < GH; ++g) moved = moved || mx[g] > m[g];
        if (moved) { // uniform: every invocation holds the same maxima
            [[unroll]] for (uint g = 0u; g < GH; ++g) {
                float mn = max(m[g], mx[g]);
                float a = mn == NEG_INF ? 1.0 : exp2(m[g] - mn);
                m[g] = mn;
                l[g] *= a;
                [[unroll]] for (uint k = 0u; k < 16u; ++k) acc[g][k] *= a;
            }
        }
        // the weighted values
        [[unroll]] for (uint j = 0u; j < TR; ++j) {
            float dv = h2f(vh[j] & 0xffffu);
            float x[16];
            if (TYPE_V == T_Q8_0) {
                uvec4 wb = vx[j] ^ uvec4(0x80808080u);
                [[unroll]] for (uint k = 0u; k < 4u; ++k) {
                    x[k] = q8f(wb.x, k); x[4u + k] = q8f(wb.y, k); x[8u + k] = q8f(wb.z, k); x[12u + k] = q8f(wb.w, k);
                }
            } else { // low nibbles: values 0-7 of the half block, high: 16-23
                [[unroll]] for (uint k = 0u; k < 4u; ++k) {
                    x[k] = q4f(vx[j].x, 2u * k); x[4u + k] = q4f(vx[j].y, 2u * k);
                    x[8u + k] = q4f(vx[j].x, 2u * k + 1u); x[12u + k] = q4f(vx[j].y, 2u * k + 1u);
                }
            }
            [[unroll]] for (uint g = 0u; g < GH; ++g) {
                float p = vis[j] ? exp2(sc[j][g] - m[g]) : 0.0;
                l[g] += p;
                float wd = vis[j] ? p * dv : 0.0; // a masked cell's row may hold anything
                [[unroll]] for (uint k = 0u; k < 16u; ++k) acc[g][k] += wd * x[k];
            }
        }
        barrier(); // gids and viss are rewritten by the next tile
    }

    // the CPR cells of a row: their sums (each cell's weights were added by all NSEG
    // invocations of the cell, the same values)
    row_reduce(l, false);
    [[unroll]] for (uint k = 0u; k < 16u; ++k) {
        float v[GH];
        [[unroll]] for (uint g = 0u; g < GH; ++g) v[g] = acc[g][k];
        row_reduce(v, false);
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
