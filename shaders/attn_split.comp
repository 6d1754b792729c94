#version 450
// attn_split.comp - decode attention, split-K pass. A workgroup takes one job (a query of
// one cache), one kv head with its whole GQA group of G query heads, and one chunk of the
// job's cells, so each K/V row is read once for the group. The workgroup is NG cell groups
// of LANES lanes; a lane holds HDK/LANES query values per head and HDV/LANES output
// values per head. Online softmax per cell group, merged inside the workgroup, written as
// (max, sum, unnormalised output) per query head for attn_merge.comp.
// Built twice: with USE_SUBGROUP the lanes of a cell reduce their dot products with
// subgroup shuffles (LANES <= the subgroup size); without, through shared memory.
#extension GL_EXT_control_flow_attributes : require
#if USE_SUBGROUP
#extension GL_KHR_shader_subgroup_shuffle : require
#endif
layout(constant_id = 0) const uint TYPE_K = 1u;
layout(constant_id = 1) const uint TYPE_V = 1u;
layout(constant_id = 2) const uint HDK = 128u;
layout(constant_id = 3) const uint HDV = 128u;
layout(constant_id = 4) const uint G = 4u;        // query heads per kv head
layout(constant_id = 5) const uint LANES = 16u;   // lanes per cell
layout(constant_id = 6) const uint NG = 8u;       // cell groups per workgroup
layout(constant_id = 7) const uint KV_HEADS = 8u;
layout(local_size_x_id = 8) in;                   // NG * LANES
layout(constant_id = 9) const uint PAGE_CELLS = 256u; // a constant: cell -> page is a multiply, not a division
const uint EK = HDK / LANES, EV = HDV / LANES;

layout(set = 0, binding = 0) readonly buffer KB { uvec4 kb[]; };
layout(set = 0, binding = 1) readonly buffer VB { uvec4 vb[]; };
layout(set = 0, binding = 2) readonly buffer MB { uint meta[]; };
layout(set = 0, binding = 3) readonly buffer QB { float qb[]; };
layout(set = 0, binding = 4) writeonly buffer PB { float part[]; };

layout(push_constant) uniform PC {
    uint job_off;     // word offset of the job table in meta
    uint chunk;       // cells per split (a multiple of NG)
    uint n_splits;
    uint k_row_bytes;
    uint v_row_bytes;
    uint page_cells;
    float scale_log2; // softmax scale * log2(e): scores live in base 2
} pc;

uint ldw(uint which, uint w) { return which == 0u ? kb[w >> 2][w & 3u] : vb[w >> 2][w & 3u]; }
#include "kvc_types.glsl"
#include "attn_common.glsl"

// EK (EV) consecutive values of one head starting at value e0; base = the head's first byte
#define SEG_LOADER(NAME, WHICH, TYPE, E, BUF)                                                   \
void NAME(uint base, uint e0, out float v[E]) {                                                 \
    if (TYPE == T_F16 || TYPE == T_BF16) {                                                      \
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
        float d = unpackHalf2x16(ld_u16(WHICH, blk)).x;                                        \
        uint w0 = s >> 2, sh = (s & 3u) * 8u;                                                   \
        uint cur = ldw(WHICH, w0);                                                              \
        [[unroll]] for (uint k = 0u; k < E; k += 4u) {                                                     \
            uint nxt = ldw(WHICH, w0 + k / 4u + 1u);                                            \
            uint w = sh == 0u ? cur : (cur >> sh) | (nxt << (32u - sh));                        \
            [[unroll]] for (uint c = 0u; c < 4u && k + c < E; ++c)                                         \
                v[k + c] = float(int(w << (24u - 8u * c)) >> 24) * d;                           \
            cur = nxt;                                                                          \
        }                                                                                       \
    } else {                                                                                    \
        [[unroll]] for (uint k = 0u; k < E; ++k) v[k] = ld_elem(WHICH, TYPE, base, e0 + k);                \
    }                                                                                           \
}
SEG_LOADER(load_k, 0u, TYPE_K, EK, kb)
SEG_LOADER(load_v, 1u, TYPE_V, EV, vb)

#if !USE_SUBGROUP
shared float red[NG * LANES * G];
#endif
shared float wg_m[NG * G], wg_l[NG * G];
shared float wg_o[G * HDV];

void main() {
    uint split = gl_WorkGroupID.x, kvh = gl_WorkGroupID.y, jb = gl_WorkGroupID.z;
    uint tid = gl_LocalInvocationID.x, grp = tid / LANES, lane = tid % LANES;
    Job J = load_job(pc.job_off, jb);
    uint hbk = head_bytes(TYPE_K, HDK), hbv = head_bytes(TYPE_V, HDV);

    // this lane's slice of the G query heads, pre-scaled into base 2
    float q[G][EK];
    [[unroll]] for (uint g = 0u; g < G; ++g)
        [[unroll]] for (uint k = 0u; k < EK; ++k)
            q[g][k] = qb[J.q_off + (kvh * G + g) * HDK + lane * EK + k] * pc.scale_log2;
    float m[G], l[G], o[G][EV];
    [[unroll]] for (uint g = 0u; g < G; ++g) {
        m[g] = -1.0 / 0.0; l[g] = 0.0;
        [[unroll]] for (uint k = 0u; k < EV; ++k) o[g][k] = 0.0;
    }

    uint c0 = split * pc.chunk, c1 = min(c0 + pc.chunk, J.n_view);
    // Two cells per cell group per step, both loaded before either is used, so each lane
    // keeps four 16-byte loads in flight. The trip count is uniform across the workgroup
    // (the shared-memory variant has barriers inside the loop).
    [[dont_unroll]] for (uint base_c = c0; base_c < c0 + pc.chunk && base_c < J.n_view + 2u * NG; base_c += 2u * NG) {
        bool vis[2];
        uint gid[2];
        float kv[2][EK], vv[2][EV], s[2][G];
        [[unroll]] for (uint u = 0u; u < 2u; ++u) {
            uint vi = base_c + u * NG + grp;
            vis[u] = false;
            gid[u] = 0u;
            if (vi < c1) vis[u] = cell_visible(J, vi, PAGE_CELLS, gid[u]);
        }
        [[unroll]] for (uint u = 0u; u < 2u; ++u) {
            if (vis[u]) {
                load_k(gid[u] * pc.k_row_bytes + kvh * hbk, lane * EK, kv[u]);
                load_v(gid[u] * pc.v_row_bytes + kvh * hbv, lane * EV, vv[u]);
            } else {
                [[unroll]] for (uint k = 0u; k < EK; ++k) kv[u][k] = 0.0;
                [[unroll]] for (uint k = 0u; k < EV; ++k) vv[u][k] = 0.0;
            }
            [[unroll]] for (uint g = 0u; g < G; ++g) {
                float acc = 0.0;
                [[unroll]] for (uint k = 0u; k < EK; ++k) acc += q[g][k] * kv[u][k];
                s[u][g] = acc;
            }
        }
#if USE_SUBGROUP
        [[unroll]] for (uint off = LANES / 2u; off > 0u; off >>= 1)
            [[unroll]] for (uint u = 0u; u < 2u; ++u)
                [[unroll]] for (uint g = 0u; g < G; ++g) s[u][g] += subgroupShuffleXor(s[u][g], off);
#else
        [[unroll]] for (uint u = 0u; u < 2u; ++u) {
            [[unroll]] for (uint g = 0u; g < G; ++g) red[(grp * LANES + lane) * G + g] = s[u][g];
            barrier();
            [[unroll]] for (uint g = 0u; g < G; ++g) {
                float acc = 0.0;
                [[unroll]] for (uint r = 0u; r < LANES; ++r) acc += red[(grp * LANES + r) * G + g];
                s[u][g] = acc;
            }
            barrier();
        }
#endif
        [[unroll]] for (uint u = 0u; u < 2u; ++u) {
            if (!vis[u]) continue;
            [[unroll]] for (uint g = 0u; g < G; ++g) {
                float mn = max(m[g], s[u][g]);
                float a = exp2(m[g] - mn), p = exp2(s[u][g] - mn);
                l[g] = l[g] * a + p;
                [[unroll]] for (uint k = 0u; k < EV; ++k) o[g][k] = o[g][k] * a + p * vv[u][k];
                m[g] = mn;
            }
        }
    }

    // merge the NG cell groups: a common max, then the sums and outputs in group order
    if (lane == 0u)
        [[unroll]] for (uint g = 0u; g < G; ++g) { wg_m[grp * G + g] = m[g]; wg_l[grp * G + g] = l[g]; }
    [[unroll]] for (uint i = tid; i < G * HDV; i += NG * LANES) wg_o[i] = 0.0;
    barrier();
    float M[G];
    [[unroll]] for (uint g = 0u; g < G; ++g) {
        M[g] = -1.0 / 0.0;
        [[unroll]] for (uint r = 0u; r < NG; ++r) M[g] = max(M[g], wg_m[r * G + g]);
    }
    [[unroll]] for (uint r = 0u; r < NG; ++r) {
        if (grp == r)
            [[unroll]] for (uint g = 0u; g < G; ++g) {
                float f = m[g] == -1.0 / 0.0 ? 0.0 : exp2(m[g] - M[g]);
                [[unroll]] for (uint k = 0u; k < EV; ++k) wg_o[g * HDV + lane * EV + k] += o[g][k] * f;
            }
        barrier();
    }
    uint stride = HDV + 2u;
    [[unroll]] for (uint g = 0u; g < G; ++g) {
        uint qh = kvh * G + g;
        uint at = ((jb * KV_HEADS * G + qh) * pc.n_splits + split) * stride;
        if (tid == 0u) {
            float L = 0.0;
            [[unroll]] for (uint r = 0u; r < NG; ++r) {
                float mr = wg_m[r * G + g];
                if (mr != -1.0 / 0.0) L += wg_l[r * G + g] * exp2(mr - M[g]);
            }
            part[at] = M[g];
            part[at + 1u] = L;
        }
        [[unroll]] for (uint i = tid; i < HDV; i += NG * LANES) part[at + 2u + i] = wg_o[g * HDV + i];
    }
}
