#version 450
// attn_merge.comp - combine the split-K partials of attn_split.comp by log-sum-exp. A
// workgroup takes one query head of one job and DV of its output values (the z of the
// dispatch picks which), so a batch-1 call still spreads over HDV / DV times more SMs:
//   weights  invocation s loads split s's (max, sum); the common maximum M and the total
//            L by shared-memory reductions; split s's weight exp2(m_s - M) into shared;
//   values   NG groups of DV invocations, group g summing splits g, g + NG, ... for its
//            value, U splits' loads in flight at a time (every load of an invocation is
//            independent, so a 128-split merge waits for memory twice, not eight times);
//            then the groups' sums are added.
// Rotated values (ROT_V, kvc_pool_config.rotate): the workgroup takes the head's whole row
// at once (DV = the head dim up to 256, NG = 256 / DV groups of U = 64 / NG loads in
// flight, so a split's loads still wait for memory once per 64 splits), into shared memory,
// and writes out = R^T out' (kvc_rotation.glsl; the butterflies in one subgroup's registers
// in the subgroup build, USE_SUBGROUP); the dispatch's z is then 1. (H200, 32k
// cells, q8_0: its 32-value slices one after the other added 15 us to a call.)
// The merge is latency-bound: a few hundred KB in all, read once. Zeros where no cell
// was visible, and a row of NaN (log-sum-exp NaN too) where the head's query row holds a
// NaN or an infinity, or where a split saw a visible score that is not finite, its maximum
// +inf (a poisoned key: kvcache.h's rules; the split passes leave such a row to chance).
#extension GL_EXT_control_flow_attributes : require
#if USE_SUBGROUP
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#endif
#include "kvc_shared.glsl"
layout(local_size_x = 256) in;
layout(constant_id = MERGE_HDV) const uint HDV = 128u;
layout(constant_id = MERGE_N_HEADS) const uint N_HEADS = 32u; // query heads
layout(constant_id = MERGE_HDK) const uint HDK = 128u; // head dim of K: the query rows
layout(constant_id = MERGE_ROT_V) const uint ROT_V = 0u; // rotated values: R's block; 0: none
layout(constant_id = MERGE_SG) const uint SG = 0u; // (subgroup build) R^T in a subgroup of SG lanes; 0: in shared memory
const uint MAX_SPLITS = 256u;                       // kvcache_vk.h never uses more
const uint DV = ROT_V != 0u ? (HDV < 256u ? HDV : 256u) : 32u; // values per workgroup
const uint NG = 256u / DV;                          // split groups
const uint U = 64u / NG;                            // loads in flight per invocation

layout(set = 0, binding = 0) readonly buffer PB { float part[]; };
layout(set = 0, binding = 1) readonly buffer MB { uint meta[]; };
layout(set = 0, binding = 2) writeonly buffer OB { float outv[]; };
layout(set = 0, binding = 3) writeonly buffer LB { float lsev[]; }; // log-sum-exps, where asked
layout(set = 0, binding = 4) readonly buffer QB { uint qw[]; };     // the queries, as f32 bits

layout(push_constant) uniform PC {
    uint job_off;
    uint n_splits;
} pc;

#include "attn_common.glsl"
#include "kvc_rotation.glsl"
#define ROW_GET(j) row[j]
#define ROW_PUT(j, v) row[j] = (v) // for ROT_BUTTERFLIES

shared float w[MAX_SPLITS];
shared float red[256];
shared float sums[256];
shared uint qbad; // nonzero: the query row holds a NaN or an infinity
shared float row[ROT_V != 0u ? HDV : 1u]; // rotated values: the head's output row before R^T

// the workgroup's sum (op 1) or maximum (op 0) of one value per invocation
float reduce(float v, uint op) {
    uint tid = gl_LocalInvocationID.x;
    red[tid] = v;
    barrier();
    [[unroll]] for (uint h = 128u; h > 0u; h >>= 1) {
        if (tid < h) red[tid] = op == 0u ? max(red[tid], red[tid + h]) : red[tid] + red[tid + h];
        barrier();
    }
    float r = red[0];
    barrier(); // red is reused
    return r;
}

#if USE_SUBGROUP
// R^T's butterflies over the row in one subgroup's registers, lane l holding values l QV ..
// l QV + QV - 1 (kvc_rotation.glsl's ROT_ROUND_REGS), back into row: one barrier after them
// instead of one a round. (q4_0+rot at 32k cells batch 1, medians: H200 41.4 -> 39.7 us, H100
// 41.1 -> 40.8. Stored to the output straight from the lanes, the writes were not coalesced:
// 227-230 us against 188 at batch 8 on the H200, the output in host-visible memory.) The host
// sets SG where the head dim is a power of two of at least SG.
const uint QV = SG != 0u ? HDV / SG : 1u;
void rotate_row_subgroup() {
    uint l = gl_SubgroupInvocationID;
    float x[QV];
    [[unroll]] for (uint v = 0u; v < QV; ++v) x[v] = row[l * QV + v];
    [[unroll]] for (uint e = 0u; e < 8u; ++e) { // len = 2^e < ROT_V <= 256
        uint len = 1u << e;
        if (len >= ROT_V) continue;
        ROT_ROUND_REGS(x, QV, len, l)
    }
    [[unroll]] for (uint v = 0u; v < QV; ++v) row[l * QV + v] = x[v];
}
#endif

void main() {
    uint qh = gl_WorkGroupID.x, jb = gl_WorkGroupID.y, tid = gl_LocalInvocationID.x;
    uint stride = HDV + 2u, at = (jb * N_HEADS + qh) * pc.n_splits * stride, n = pc.n_splits;
    uint g = tid / DV;
    const float NEG_INF = -1.0 / 0.0;
    Job J = load_job(pc.job_off, jb);
    float mx = NEG_INF, lx = 0.0;
    if (tid < n) { mx = part[at + tid * stride]; lx = part[at + tid * stride + 1u]; }
    if (tid == 0u) qbad = 0u;
    float M = reduce(mx, 0u); // (its barriers publish qbad's zero)
    if (tid < n && mx == POS_INF) atomicOr(qbad, 1u); // the split saw a score not finite (attn_common.glsl)
    for (uint i = tid; i < HDK; i += 256u) // exponent all ones: NaN or infinite
        if ((qw[J.q_off + qh * HDK + i] & 0x7f800000u) == 0x7f800000u) atomicOr(qbad, 1u);
    float f = mx == NEG_INF ? 0.0 : exp2(mx - M);
    if (tid < n) w[tid] = f;
    float L = reduce(lx * f, 1u); // also the barrier that publishes w and qbad
    // the head's sink (a natural-log logit) joins the denominator; the maxima are base 2
    uint jw = pc.job_off + jb * JOB_STRIDE, so = meta[jw + JOB_SINK_OFF], lo = meta[jw + JOB_LSE_OFF];
    float sk = so != 0xffffffffu ? uintBitsToFloat(meta[so + qh]) * 1.4426950408889634 : NEG_INF;
    float Ms = max(M, sk);
    float fM = Ms == NEG_INF ? 0.0 : exp2(M - Ms), fS = Ms == NEG_INF ? 0.0 : exp2(sk - Ms);
    float Lt = L * fM + fS;
    float nan_ = uintBitsToFloat(0x7fc00000u);
    // the dispatch's slice of DV values, or (rotated values) every slice in turn
    uint z0 = ROT_V != 0u ? 0u : gl_WorkGroupID.z, z1 = ROT_V != 0u ? (HDV + DV - 1u) / DV : z0 + 1u;
    for (uint z = z0; z < z1; ++z) {
        uint d = z * DV + tid % DV;
        // a zero weight adds nothing, whatever its partial holds
        float acc = 0.0;
        if (d < HDV && g < NG) // (g = NG: the spare invocations where DV does not divide 256)
            for (uint s0 = g; s0 < n; s0 += NG * U) {
                float x[U];
                [[unroll]] for (uint u = 0u; u < U; ++u) {
                    uint s = min(s0 + u * NG, n - 1u);
                    x[u] = part[at + s * stride + 2u + d];
                }
                [[unroll]] for (uint u = 0u; u < U; ++u) {
                    uint s = s0 + u * NG;
                    float ws = s < n ? w[s] : 0.0;
                    acc += ws != 0.0 ? x[u] * ws : 0.0;
                }
            }
        sums[tid] = acc;
        barrier();
        if (tid < DV && d < HDV) {
            float t = 0.0;
            [[unroll]] for (uint k = 0u; k < NG; ++k) t += sums[k * DV + tid];
            float o = Lt > 0.0 ? t * fM / Lt : 0.0;
            if (ROT_V != 0u) row[d] = o;
            else outv[J.out_off + qh * HDV + d] = qbad != 0u ? nan_ : o;
        }
        barrier(); // sums is the next slice's; (rotated) row is whole after the last
    }
    if (ROT_V != 0u) { // out = R^T out': the butterflies over the row's blocks of ROT_V, then scale and sign
#if USE_SUBGROUP
        if (SG != 0u && gl_SubgroupSize == SG) { // (uniform)
            if (gl_SubgroupID == 0u) rotate_row_subgroup();
            barrier();
        } else
#endif
        {
            ROT_BUTTERFLIES(ROW_GET, ROW_PUT, HDV, ROT_V, tid, 256u)
        }
        float r = rot_scale(ROT_V);
        for (uint i = tid; i < HDV; i += 256u) {
            precise float a = row[i] * r;
            outv[J.out_off + qh * HDV + i] = qbad != 0u ? nan_ : rot_neg(i) ? -a : a;
        }
    }
    if (tid == 0u && (ROT_V != 0u || gl_WorkGroupID.z == 0u) && lo != 0xffffffffu)
        lsev[lo + qh] = qbad != 0u ? nan_ : Lt > 0.0 ? (Ms + log2(Lt)) * 0.6931471805599453 : NEG_INF;
}
