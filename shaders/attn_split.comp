#version 450
// attn_split.comp - decode attention, split-K pass (FlashDecoding-style). A workgroup
// takes one job (a query of one cache), one kv head with its whole GQA group of G query
// heads, and one chunk of the job's cells, so each K/V row is read from memory once for
// the group. The chunk is walked in blocks of WG cells:
//   scores   invocation i takes cell i of the block: its key row against the G queries
//            (queries in shared memory), masks from the cell metadata; q8_0/q4_0 key
//            rows of head dim 64 or 128 are loaded whole, then decoded (KROW);
//   softmax  one maximum per head per block (subgroup or shared-memory reductions), the
//            block's weights into shared memory, running maxima kept by everyone; each
//            invocation sums its own cells' weights, and those sums are added once, at
//            the end of the split;
//   values   invocation i takes EVT output values of one head and sums the block's
//            V rows weighted.
// Written out as (max, sum, unnormalised output) per query head for attn_merge.comp.
// Built three times: USE_SUBGROUP reduces with subgroup arithmetic, otherwise shared
// memory; USE_DOT (with subgroups) scores q8_0 keys of head dim 64 / 128 by packed 8-bit
// dot products (VK_KHR_shader_integer_dot_product) against the query's q8_0 codes.
#extension GL_EXT_control_flow_attributes : require
#ifndef USE_DOT
#define USE_DOT 0
#endif
#if USE_SUBGROUP
#extension GL_KHR_shader_subgroup_arithmetic : require
#endif
#if USE_DOT
#extension GL_EXT_spirv_intrinsics : require
// OpSDot (4450) of two words of four signed bytes (PackedVectorFormat4x8Bit = 0); glslc of
// Debian 12 (shaderc 2023.2) has no GL_EXT_integer_dot_product to spell it
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6018, 6019], id = 4450)
int sdot4x8(uint a, uint b, spirv_literal int packed_format);
#endif
#include "kvc_shared.glsl"
layout(constant_id = SPLIT_TYPE_K) const uint TYPE_K = 1u;
layout(constant_id = SPLIT_TYPE_V) const uint TYPE_V = 1u;
layout(constant_id = SPLIT_HDK) const uint HDK = 128u;
layout(constant_id = SPLIT_HDV) const uint HDV = 128u;
layout(constant_id = SPLIT_G) const uint G = 4u;       // query heads per kv head
layout(constant_id = SPLIT_SEGK) const uint SEGK = 8u; // key values decoded at a time (divides HDK)
layout(constant_id = SPLIT_EVT) const uint EVT = 4u;   // output values per invocation (divides HDV)
layout(constant_id = SPLIT_KV_HEADS) const uint KV_HEADS = 8u;
layout(local_size_x_id = SPLIT_WG) in;                 // cells per block
layout(constant_id = SPLIT_PAGE_CELLS) const uint PAGE_CELLS = 256u; // a constant: cell -> page is a multiply
layout(constant_id = SPLIT_ROT_K) const uint ROT_K = 0u; // rotated keys: R's block (q rotated as it is loaded); 0: none
layout(constant_id = SPLIT_FUSED) const uint FUSED = 0u; // nonzero: the last workgroup of a head group merges (attn_onedisp.glsl)
layout(constant_id = SPLIT_HALF) const uint HALF = 0u; // nonzero: unpackHalf2x16 keeps f16 subnormals (half_exact.comp)
const uint WG = gl_WorkGroupSize.x;

layout(set = 0, binding = 0) readonly buffer KB { uvec4 kb[]; };
layout(set = 0, binding = 1) readonly buffer VB { uvec4 vb[]; };
layout(set = 0, binding = 2) readonly buffer MB { uint meta[]; };
layout(set = 0, binding = 3) readonly buffer QB { float qb[]; };
layout(set = 0, binding = 4) coherent buffer PB { float part[]; }; // (coherent: FUSED builds read it back)
// the same K and V buffers as single words: scalar loads without picking a component of
// a 16-byte vector at run time
layout(set = 0, binding = 5) readonly buffer KW { uint kw[]; };
layout(set = 0, binding = 6) readonly buffer VW { uint vw[]; };
layout(set = 0, binding = 7) readonly buffer KD { uvec2 kd[]; }; // and K as 8-byte pieces

layout(push_constant) uniform PC {
    uint job_off;     // word offset of the job table in meta
    uint chunk;       // cells per split (a multiple of WG)
    uint n_splits;
    uint k_row_bytes;
    uint v_row_bytes;
    uint page_cells;  // (unused: PAGE_CELLS)
    float scale_log2; // softmax scale * log2(e): scores live in base 2
    float softcap2;   // logit soft-capping in base 2 (softcap * log2(e)); 0: off
} pc;

uint ldw(uint which, uint w) { return which == 0u ? kw[w] : vw[w]; }
#include "kvc_types.glsl"
#include "attn_common.glsl"
#include "kvc_rotation.glsl"
#define OD_NT WG
#include "attn_onedisp.glsl"
#define QS_GET(j) qs[j]
#define QS_PUT(j, v) qs[j] = (v) // for ROT_BUTTERFLIES

#define SEG_LOADER(NAME, WHICH, TYPE, E, BUF)                                                   \
void NAME(uint base, uint e0, out float v[E]) {                                                 \
    if ((TYPE == T_F16 || TYPE == T_BF16) && (E % 2u) == 0u) {                                  \
        uint b = base + 2u * e0;                                                                \
        if ((E % 8u) == 0u && (b & 15u) == 0u) {                                                \
            [[unroll]] for (uint k = 0u; k < E; k += 8u) {                                                 \
                uvec4 w = BUF[(b >> 4) + k / 8u];                                               \
                [[unroll]] for (uint c = 0u; c < 4u; ++c) {                                                \
                    if (TYPE == T_F16) { vec2 f = unpackHalf2x16(w[c]); v[k + 2u * c] = f.x; v[k + 2u * c + 1u] = f.y; } \
                    else { v[k + 2u * c] = uintBitsToFloat(w[c] << 16); v[k + 2u * c + 1u] = uintBitsToFloat(w[c] & 0xffff0000u); } \
                }                                                                               \
            }                                                                                   \
        } else {                                                                                \
            [[unroll]] for (uint k = 0u; k < E; k += 2u) {                                                 \
                uint w = ldw(WHICH, (b >> 2) + k / 2u);                                         \
                if (TYPE == T_F16) { vec2 f = unpackHalf2x16(w); v[k] = f.x; v[k + 1u] = f.y; } \
                else { v[k] = uintBitsToFloat(w << 16); v[k + 1u] = uintBitsToFloat(w & 0xffff0000u); } \
            }                                                                                   \
        }                                                                                       \
    } else if (TYPE == T_F32) {                                                                 \
        uint b = base + 4u * e0;                                                                \
        if ((E % 4u) == 0u && (b & 15u) == 0u) {                                                \
            [[unroll]] for (uint k = 0u; k < E; k += 4u) {                                                 \
                vec4 f = uintBitsToFloat(BUF[(b >> 4) + k / 4u]);                               \
                v[k] = f.x; v[k + 1u] = f.y; v[k + 2u] = f.z; v[k + 3u] = f.w;                  \
            }                                                                                   \
        } else {                                                                                \
            [[unroll]] for (uint k = 0u; k < E; ++k) v[k] = uintBitsToFloat(ldw(WHICH, (b >> 2) + k));    \
        }                                                                                       \
    } else if (TYPE == T_Q8_0 && (E <= 32u && (32u % E) == 0u)) {                               \
        /* the segment lies inside one block: one scale, E bytes through whole words */       \
        uint blk = base + 34u * (e0 >> 5), s = blk + 2u + (e0 & 31u);                           \
        float d = f16_half(ld_u16(WHICH, blk), 0u, HALF != 0u);                                \
        uint w0 = s >> 2, sh = (s & 3u) * 8u;                                                   \
        uint cur = ldw(WHICH, w0);                                                              \
        [[unroll]] for (uint k = 0u; k < E; k += 4u) {                                                     \
            /* (the word after the segment only when the codes straddle it) */                 \
            uint nxt = sh != 0u || k + 4u < E ? ldw(WHICH, w0 + k / 4u + 1u) : 0u;             \
            uint w = sh == 0u ? cur : (cur >> sh) | (nxt << (32u - sh));                        \
            [[unroll]] for (uint c = 0u; c < 4u && k + c < E; ++c)                                         \
                v[k + c] = q8_code(w, c) * d;                                                   \
            cur = nxt;                                                                          \
        }                                                                                       \
    } else {                                                                                    \
        [[unroll]] for (uint k = 0u; k < E; ++k) v[k] = ld_elem(WHICH, TYPE, base, e0 + k);                \
    }                                                                                           \
}
SEG_LOADER(load_k, 0u, TYPE_K, SEGK, kb)
SEG_LOADER(load_v, 1u, TYPE_V, EVT, vb)

const uint NRED = WG; // partial results per head (subgroups, or invocations)
// q8_0 / q4_0 keys of head dim 64 or 128 (rows of 68 / 136 or 36 / 72 bytes, starting on
// a word): the words of a head row, loaded whole for the scores
const bool KROW = (TYPE_K == T_Q8_0 || TYPE_K == T_Q4_0) && (HDK == 64u || HDK == 128u);
const uint KBB = TYPE_K == T_Q8_0 ? 34u : 18u;  // bytes of a block
const uint KROW_BYTES = KBB * (HDK / 32u), KROW_WORDS = KROW_BYTES / 4u;
// q8_0 / q4_0 values: invocation (cell group cg, slice sl) sums 8 values of every head of
// the group over every NCG-th cell of a block: one scale and two or three words a cell for
// 8 G products, instead of three loads for every 4 products of one head (q4_0: two loads
// for every value). The cell groups' sums are added once, at the end of the split.
// kvcache_vk.h sets VQ for q8_0 and q4_0 V rows when HDV % 32 == 0, G <= 8 and
// WG / (HDV / 8) >= 2.
layout(constant_id = SPLIT_VQ) const uint VQ = 0u;
const uint NS = HDV / 8u;       // slices of 8 values
const uint NCG = WG / NS;       // cell groups
const uint VSUM = VQ != 0u ? WG * 8u : 1u;
shared float qs[G * HDK];
shared float pw[G * WG];       // the block's weights, [head][cell]
shared uint gids[WG];          // the block's cells (page * page_cells + slot)
shared float red[G * NRED];
shared float qa[G * HDK / 4u + 1u];         // query rounding: maxima of 4 values
shared float qd[2u * (G * HDK / 32u) + 2u]; // per query block: 1 / d, d as f16
// USE_DOT: the query's codes, four to a word, and each block's d (as f16) * scale_log2
#if USE_DOT
shared uint qc[G * HDK / 4u];
shared float qsc[G * HDK / 32u + 1u];
#endif
shared float vsum[VSUM];                    // VQ: the cell groups' sums of one head
const float NEG_INF = -1.0 / 0.0;

// block-wide max (op 0) or sum (op 1) of one value per invocation, for each head
void reduce(inout float v[G], uint op) {
    uint tid = gl_LocalInvocationID.x;
#if USE_SUBGROUP
    [[unroll]] for (uint g = 0u; g < G; ++g) {
        float r = op == 0u ? subgroupMax(v[g]) : subgroupAdd(v[g]);
        if (gl_SubgroupInvocationID == 0u) red[g * NRED + gl_SubgroupID] = r;
    }
    barrier();
    [[unroll]] for (uint g = 0u; g < G; ++g) {
        float r = red[g * NRED];
        for (uint i = 1u; i < gl_NumSubgroups; ++i) r = op == 0u ? max(r, red[g * NRED + i]) : r + red[g * NRED + i];
        v[g] = r;
    }
#else
    [[unroll]] for (uint g = 0u; g < G; ++g) red[g * NRED + tid] = v[g];
    barrier();
    for (uint h = WG / 2u; h > 0u; h >>= 1) {
        if (tid < h)
            [[unroll]] for (uint g = 0u; g < G; ++g) {
                float a = red[g * NRED + tid], b = red[g * NRED + tid + h];
                red[g * NRED + tid] = op == 0u ? max(a, b) : a + b;
            }
        barrier();
    }
    [[unroll]] for (uint g = 0u; g < G; ++g) v[g] = red[g * NRED];
#endif
    barrier(); // red is reused
}

void main() {
    // kv heads vary fastest across workgroups: the heads of one cell range run side by
    // side and read whole K/V rows ([cell][kv head][dim]) between them
    uint kvh = gl_WorkGroupID.x, split = gl_WorkGroupID.y, jb = gl_WorkGroupID.z;
    uint tid = gl_LocalInvocationID.x;
    if (FUSED != 0u) od_start();
    Job J = load_job(pc.job_off, jb);
    uint hbk = head_bytes(TYPE_K, HDK), hbv = head_bytes(TYPE_V, HDV);
    uint qbad = 0u; // (FUSED) heads whose query values this invocation saw not finite
    for (uint i = tid; i < G * HDK; i += WG) {
        float x = qb[J.q_off + kvh * G * HDK + i];
        qbad |= od_query_bad(x, i / HDK);
        qs[i] = ROT_K != 0u && rot_neg(i % HDK) ? -x : x;
    }
    if (ROT_K != 0u) {
        // rotated keys (kvc_pool_config.rotate): scores of R q against the stored R k. The
        // signs went on above; the butterflies over every head's blocks of ROT_K, then the
        // scale (kvc_rotation.glsl: kvc_rotate_rows' bits)
        barrier();
        ROT_BUTTERFLIES(QS_GET, QS_PUT, G * HDK, ROT_K, tid, WG)
        float r = rot_scale(ROT_K);
        for (uint i = tid; i < G * HDK; i += WG) {
            precise float a = qs[i] * r;
            qs[i] = a; // (the same invocation scales it below, or a barrier comes first)
        }
    }
    if (TYPE_K == T_Q8_0 || TYPE_K == T_Q4_0) {
        // block-typed keys score against the query rounded to q8_0, as on the CPU (kvcache.h
        // scores them in integers): d = amax / 127 stored as f16, codes rint(x / d) in +-127.
        // Spread over the whole workgroup: maxima of 4 values, then one invocation per
        // block of 32 for its scale, then every value.
        barrier();
        for (uint i = tid; i < G * HDK / 4u; i += WG)
            qa[i] = max(max(abs(qs[4u * i]), abs(qs[4u * i + 1u])), max(abs(qs[4u * i + 2u]), abs(qs[4u * i + 3u])));
        barrier();
        for (uint b = tid; b < G * HDK / 32u; b += WG) {
            float amax = 0.0;
            [[unroll]] for (uint j = 0u; j < 8u; ++j) amax = max(amax, qa[8u * b + j]);
            float d = div_rn(amax, 127.0);
            qd[2u * b] = d != 0.0 ? div_rn(1.0, d) : 0.0;
            qd[2u * b + 1u] = h2f(f2h(d));
        }
        barrier();
#if USE_DOT
        if (TYPE_K == T_Q8_0) { // the codes also four to a word, for the dot products
            for (uint w = tid; w < G * HDK / 4u; w += WG) {
                uint packed = 0u;
                [[unroll]] for (uint c = 0u; c < 4u; ++c) {
                    uint i = 4u * w + c;
                    int code = clamp(int(roundEven(qs[i] * qd[2u * (i / 32u)])), -127, 127);
                    packed |= (uint(code) & 0xffu) << (8u * c);
                    qs[i] = float(code) * qd[2u * (i / 32u) + 1u];
                }
                qc[w] = packed;
            }
            for (uint b = tid; b < G * HDK / 32u; b += WG) qsc[b] = qd[2u * b + 1u] * pc.scale_log2;
            barrier(); // the scaling below takes each value in another invocation
        } else
#endif
        for (uint i = tid; i < G * HDK; i += WG)
            qs[i] = float(clamp(int(roundEven(qs[i] * qd[2u * (i / 32u)])), -127, 127)) * qd[2u * (i / 32u) + 1u];
    }
    for (uint i = tid; i < G * HDK; i += WG) qs[i] *= pc.scale_log2;
    // the value invocations: head gv, values [ev0, ev0 + EVT)
    const uint per_head = HDV / EVT;
    uint gv = tid / per_head, ev0 = (tid % per_head) * EVT;
    bool has_v = tid < G * per_head;
    float o[EVT];
    [[unroll]] for (uint k = 0u; k < EVT; ++k) o[k] = 0.0;
    uint sl = tid % NS, cg = tid / NS;
    float oq[G][8];
    [[unroll]] for (uint g = 0u; g < G; ++g) [[unroll]] for (uint k = 0u; k < 8u; ++k) oq[g][k] = 0.0;
    float m[G], l[G];
    [[unroll]] for (uint g = 0u; g < G; ++g) { m[g] = NEG_INF; l[g] = 0.0; }
    barrier();

    uint c0 = split * pc.chunk, c1 = min(c0 + pc.chunk, J.n_view);
    [[dont_unroll]] for (uint base = c0; base < c1; base += WG) { // uniform trip count
        // scores of this invocation's cell
        uint vi = base + tid, gid = 0u;
        bool vis = vi < c1 && cell_visible(J, vi, PAGE_CELLS, gid);
        float s[G];
        [[unroll]] for (uint g = 0u; g < G; ++g) s[g] = 0.0;
        if (vis && KROW) {
            // q8_0 / q4_0 keys, head dims 64 or 128: the head row's KROW_WORDS loaded whole
            // (8 bytes at a time where rows are 8-byte aligned), then decoded with constant
            // shifts, as load_k decodes them; load_k reads each 8-value segment's scale and
            // words again (q4_0: each value's)
            uint kbase = gid * pc.k_row_bytes + kvh * hbk, wr[34u * HDK / 128u + 1u];
            if (KROW_BYTES % 8u == 0u)
                [[unroll]] for (uint j = 0u; j < KROW_WORDS / 2u; ++j) {
                    uvec2 x = kd[(kbase >> 3) + j];
                    wr[2u * j] = x.x; wr[2u * j + 1u] = x.y;
                }
            else
                [[unroll]] for (uint j = 0u; j < KROW_WORDS; ++j) wr[j] = kw[(kbase >> 2) + j];
            [[unroll]] for (uint b = 0u; b < HDK / 32u; ++b) {
                uint o = KBB * b, dh = (wr[o >> 2] >> ((o & 2u) << 3)) & 0xffffu; // a row starts on a word
                float d = f16_half(dh, 0u, TYPE_K == T_Q8_0 && HALF != 0u);
#if USE_DOT
                if (TYPE_K == T_Q8_0) { // the block's 32 codes start 2 bytes past a word in even blocks
                    uint c0 = o + 2u;
                    int isum[G];
                    [[unroll]] for (uint g = 0u; g < G; ++g) isum[g] = 0;
                    [[unroll]] for (uint j = 0u; j < 8u; ++j) {
                        uint w = (c0 & 3u) == 0u ? wr[(c0 >> 2) + j]
                                                 : (wr[(c0 >> 2) + j] >> 16) | (wr[(c0 >> 2) + j + 1u] << 16);
                        [[unroll]] for (uint g = 0u; g < G; ++g) isum[g] += sdot4x8(w, qc[g * (HDK / 4u) + 8u * b + j], 0);
                    }
                    [[unroll]] for (uint g = 0u; g < G; ++g) s[g] += float(isum[g]) * (d * qsc[g * (HDK / 32u) + b]);
                } else
#endif
                [[unroll]] for (uint e = 0u; e < 32u; e += SEGK) {
                    float kv[SEGK];
                    [[unroll]] for (uint k = 0u; k < SEGK; ++k) {
                        uint i = e + k, q = o + 2u + (TYPE_K == T_Q8_0 ? i : i & 15u);
                        kv[k] = (TYPE_K == T_Q8_0 ? q8_code(wr[q >> 2], q & 3u)
                                                  : q4_code(wr[q >> 2], 2u * (q & 3u) + (i < 16u ? 0u : 1u))) * d;
                    }
                    [[unroll]] for (uint g = 0u; g < G; ++g)
                        [[unroll]] for (uint k = 0u; k < SEGK; ++k) s[g] += qs[g * HDK + 32u * b + e + k] * kv[k];
                }
            }
        } else if (vis) {
            uint kbase = gid * pc.k_row_bytes + kvh * hbk;
            [[unroll]] for (uint e = 0u; e < HDK; e += SEGK) {
                float kv[SEGK];
                load_k(kbase, e, kv);
                [[unroll]] for (uint g = 0u; g < G; ++g)
                    [[unroll]] for (uint k = 0u; k < SEGK; ++k) s[g] += qs[g * HDK + e + k] * kv[k];
            }
        }
        gids[tid] = gid;
        // s = cap tanh(s / cap), in base 2 as the scores are; +inf if not finite (attn_common.glsl)
        if (pc.softcap2 > 0.0) [[unroll]] for (uint g = 0u; g < G; ++g) s[g] = score_capped(s[g], pc.softcap2);
        else [[unroll]] for (uint g = 0u; g < G; ++g) s[g] = score_finite(s[g]);
        // one max per head for the block, then the weights
        float mb[G];
        [[unroll]] for (uint g = 0u; g < G; ++g) mb[g] = vis ? s[g] : NEG_INF;
        reduce(mb, 0u);
        float alpha[G], p[G];
        [[unroll]] for (uint g = 0u; g < G; ++g) {
            float mn = max(m[g], mb[g]);
            alpha[g] = mn == NEG_INF ? 1.0 : exp2(m[g] - mn);
            p[g] = vis ? exp2(s[g] - mn) : 0.0;
            pw[g * WG + tid] = p[g];
            m[g] = mn;
        }
        barrier(); // publishes pw and gids
        [[unroll]] for (uint g = 0u; g < G; ++g) l[g] = l[g] * alpha[g] + p[g];
        // the weighted V rows
        if (VQ != 0u) {
            [[unroll]] for (uint g = 0u; g < G; ++g) [[unroll]] for (uint k = 0u; k < 8u; ++k) oq[g][k] *= alpha[g];
            // slice sl: values 8 (sl % 4) .. + 8 of block sl / 4; q8_0: 8 bytes of codes from
            // that value on; q4_0: bytes 8 (sl % 2) .. + 8, low nibbles for values 0-15 of
            // the block, high nibbles for 16-31
            uint bbv = TYPE_V == T_Q8_0 ? 34u : 18u, boff = kvh * hbv + bbv * (sl >> 2);
            uint n = min(WG, c1 - base), coff = boff + 2u + (TYPE_V == T_Q8_0 ? 8u * (sl & 3u) : 8u * (sl & 1u));
            bool high = (sl & 2u) != 0u;
            // VJ cells loaded before any is used (4 was 5-6 % faster than 2 on the H200, 8
            // no better); a cell whose weights are all zero (masked or past the end) adds
            // nothing, whatever its row holds
            const uint VJ = 4u;
            for (uint c = cg; c < n; c += VJ * NCG) {
                uint wd[VJ][3], hw[VJ];
                bool odd[VJ];
                float w[VJ][G];
                [[unroll]] for (uint j = 0u; j < VJ; ++j) {
                    uint cc = min(c + j * NCG, n - 1u), row = gids[cc] * pc.v_row_bytes;
                    uint h = row + boff, s0 = (row + coff) >> 2;
                    // the 8 codes start 0 or 2 bytes into a word: two or three words
                    odd[j] = ((row + coff) & 2u) != 0u;
                    hw[j] = vw[h >> 2] >> ((h & 2u) << 3);
                    wd[j][0] = vw[s0]; wd[j][1] = vw[s0 + 1u]; wd[j][2] = odd[j] ? vw[s0 + 2u] : 0u;
                    [[unroll]] for (uint g = 0u; g < G; ++g) w[j][g] = c + j * NCG < n ? pw[g * WG + cc] : 0.0;
                }
                [[unroll]] for (uint j = 0u; j < VJ; ++j) {
                    bool any = false;
                    [[unroll]] for (uint g = 0u; g < G; ++g) any = any || w[j][g] != 0.0;
                    if (!any) continue;
                    float d = f16_half(hw[j] & 0xffffu, 0u, TYPE_V == T_Q8_0 && HALF != 0u);
                    uint lo = odd[j] ? (wd[j][0] >> 16) | (wd[j][1] << 16) : wd[j][0];
                    uint hi = odd[j] ? (wd[j][1] >> 16) | (wd[j][2] << 16) : wd[j][1];
                    float x[8];
                    [[unroll]] for (uint k = 0u; k < 4u; ++k) {
                        uint n = 2u * k + (high ? 1u : 0u);
                        x[k] = TYPE_V == T_Q8_0 ? q8_code(lo, k) : q4_code(lo, n);
                        x[k + 4u] = TYPE_V == T_Q8_0 ? q8_code(hi, k) : q4_code(hi, n);
                    }
                    [[unroll]] for (uint g = 0u; g < G; ++g) {
                        float wg = w[j][g] * d;
                        [[unroll]] for (uint k = 0u; k < 8u; ++k) oq[g][k] += wg * x[k];
                    }
                }
            }
        } else if (has_v) {
            float a = 1.0;
            [[unroll]] for (uint g = 0u; g < G; ++g) if (g == gv) a = alpha[g];
            [[unroll]] for (uint k = 0u; k < EVT; ++k) o[k] *= a;
            uint n = min(WG, c1 - base);
            // eight rows loaded before any is used; a zero weight (masked or past the
            // end) adds nothing, whatever the row holds
            for (uint c = 0u; c < n; c += 8u) {
                float vv[8][EVT], w8[8];
                [[unroll]] for (uint j = 0u; j < 8u; ++j) {
                    uint cc = min(c + j, n - 1u);
                    w8[j] = c + j < n ? pw[gv * WG + cc] : 0.0;
                    load_v(gids[cc] * pc.v_row_bytes + kvh * hbv, ev0, vv[j]);
                }
                [[unroll]] for (uint j = 0u; j < 8u; ++j)
                    if (w8[j] != 0.0)
                        [[unroll]] for (uint k = 0u; k < EVT; ++k) o[k] += w8[j] * vv[j][k];
            }
        }
        barrier(); // pw and gids are rewritten by the next block
    }

    reduce(l, 1u); // each invocation's share of the sums
    uint stride = OD_STRIDE;
    if (VQ != 0u) {
        // add the cell groups' sums, one head at a time
        [[unroll]] for (uint g = 0u; g < G; ++g) {
            [[unroll]] for (uint k = 0u; k < 8u; ++k) vsum[tid * 8u + k] = oq[g][k];
            barrier();
            uint at = ((jb * KV_HEADS * G + kvh * G + g) * pc.n_splits + split) * stride;
            for (uint e = tid; e < HDV; e += WG) {
                float acc = 0.0;
                for (uint q = 0u; q < NCG; ++q) acc += vsum[(q * NS + e / 8u) * 8u + e % 8u];
                part[at + OD_PO + e] = acc;
            }
            if (tid == 0u) {
                part[at] = m[g];
                part[at + 1u] = l[g];
            }
            barrier();
        }
    } else if (has_v) {
        uint at = ((jb * KV_HEADS * G + kvh * G + gv) * pc.n_splits + split) * stride;
        [[unroll]] for (uint k = 0u; k < EVT; ++k) part[at + OD_PO + ev0 + k] = o[k];
        if (ev0 == 0u) {
            float mm = NEG_INF, ll = 0.0;
            [[unroll]] for (uint g = 0u; g < G; ++g) if (g == gv) { mm = m[g]; ll = l[g]; }
            part[at] = mm;
            part[at + 1u] = ll;
        }
    }
    if (FUSED != 0u) od_finish(J, jb, kvh, qbad);
}
