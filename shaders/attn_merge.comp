#version 450
// attn_merge.comp - combine the split-K partials of attn_split.comp by log-sum-exp. A
// workgroup takes one query head of one job and DV of its output values (the z of the
// dispatch picks which), so a batch-1 call still spreads over HDV / DV times more SMs:
//   loads    every load the workgroup needs goes out first, together: invocation s's
//            split s (max, sum), and each invocation's first U splits' values and maxima,
//            so a merge of up to NG x U splits waits for memory once (the weights are
//            computed by each invocation from the maxima it loaded, not shared);
//   weights  the common maximum M and the total L: in the subgroup build (USE_SUBGROUP)
//            each subgroup's (max, rescaled sum, bad-row flag) by subgroup arithmetic, one
//            barrier, then every invocation combines them; otherwise shared-memory
//            reductions;
//   values   NG groups of DV invocations, group g summing splits g, g + NG, ... for its
//            value, U splits' loads in flight at a time; then the groups' sums are added.
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
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#endif
#include "kvc_shared.glsl"
layout(local_size_x = 256) in;
layout(constant_id = MERGE_HDV) const uint HDV = 128u;
layout(constant_id = MERGE_N_HEADS) const uint N_HEADS = 32u; // query heads
layout(constant_id = MERGE_HDK) const uint HDK = 128u; // head dim of K: the query rows
layout(constant_id = MERGE_ROT_V) const uint ROT_V = 0u; // rotated values: R's block; 0: none
layout(constant_id = MERGE_SG) const uint SG = 0u; // (subgroup build) R^T in a subgroup of SG lanes; 0: in shared memory
const uint MAX_SPLITS = 256u; // kvcache_vk.h never uses more (invocation s loads split s)
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

#if USE_SUBGROUP
shared float sg_m[256], sg_l[256]; // per subgroup: its maximum, its sum rescaled to it
shared uint sg_bad[256];          // per subgroup: a split saw a score not finite, or the query row is bad
#endif

void main() {
    uint qh = gl_WorkGroupID.x, jb = gl_WorkGroupID.y, tid = gl_LocalInvocationID.x;
    uint stride = HDV + 2u, at = (jb * N_HEADS + qh) * pc.n_splits * stride, n = pc.n_splits;
    uint g = tid / DV;
    const float NEG_INF = -1.0 / 0.0;
    Job J = load_job(pc.job_off, jb);
    // the dispatch's slice of DV values, or (rotated values) every slice in turn
    uint z0 = ROT_V != 0u ? 0u : gl_WorkGroupID.z, z1 = ROT_V != 0u ? (HDV + DV - 1u) / DV : z0 + 1u;
    bool act = g < NG; // (g = NG: the spare invocations where DV does not divide 256)
    // the loads, all at once: this invocation's split (max, sum), its first U splits'
    // maxima and values of the first slice, the head's sink and whether its query row holds
    // a NaN or an infinity (exponent all ones)
    float mx = NEG_INF, lx = 0.0;
    if (tid < n) { mx = part[at + tid * stride]; lx = part[at + tid * stride + 1u]; }
    // (splits past n load nothing: a batch-8 call of 16 splits would issue four times the
    // loads it uses)
    float x[U], mu[U];
    {
        uint d = z0 * DV + tid % DV;
        [[unroll]] for (uint u = 0u; u < U; ++u) {
            uint s = g + u * NG;
            bool ok = act && d < HDV && s < n;
            mu[u] = ok ? part[at + s * stride] : NEG_INF;
            x[u] = ok ? part[at + s * stride + 2u + d] : 0.0;
        }
    }
    uint jw = pc.job_off + jb * JOB_STRIDE, so = meta[jw + JOB_SINK_OFF], lo = meta[jw + JOB_LSE_OFF];
    float sk = head_sink(so, qh);
    uint bad = tid < n && mx == POS_INF ? 1u : 0u; // the split saw a score not finite (attn_common.glsl)
    for (uint i = tid; i < HDK; i += 256u)
        if ((qw[J.q_off + qh * HDK + i] & 0x7f800000u) == 0x7f800000u) bad = 1u;
#if USE_SUBGROUP
    {
        float ms = subgroupMax(mx);
        float ls = subgroupAdd(mx == NEG_INF ? 0.0 : lx * exp2(mx - ms));
        uint bs = subgroupMax(bad);
        if (subgroupElect()) { sg_m[gl_SubgroupID] = ms; sg_l[gl_SubgroupID] = ls; sg_bad[gl_SubgroupID] = bs; }
    }
    barrier();
    float M = NEG_INF, L = 0.0;
    uint qbad_ = 0u;
    for (uint i = 0u; i < gl_NumSubgroups; ++i) { M = max(M, sg_m[i]); qbad_ |= sg_bad[i]; }
    for (uint i = 0u; i < gl_NumSubgroups; ++i) L += sg_m[i] == NEG_INF ? 0.0 : sg_l[i] * exp2(sg_m[i] - M);
    bool isbad = qbad_ != 0u;
#else
    if (tid == 0u) qbad = 0u;
    float M = reduce(mx, 0u); // (its barriers publish qbad's zero)
    if (bad != 0u) atomicOr(qbad, 1u);
    float L = reduce(mx == NEG_INF ? 0.0 : lx * exp2(mx - M), 1u); // also the barrier that publishes qbad
    bool isbad = qbad != 0u;
#endif
    // the head's sink joins the denominator
    float fM, Lt, lse = softmax_end(M, L, sk, fM, Lt);
    float nan_ = uintBitsToFloat(0x7fc00000u);
    for (uint z = z0; z < z1; ++z) {
        uint d = z * DV + tid % DV;
        // a zero weight adds nothing, whatever its partial holds
        float acc = 0.0;
        if (d < HDV && act)
            for (uint s0 = g; s0 < n; s0 += NG * U) {
                if (z != z0 || s0 != g) // (the first round's loads went out at the start)
                    [[unroll]] for (uint u = 0u; u < U; ++u) {
                        uint s = s0 + u * NG;
                        mu[u] = s < n ? part[at + s * stride] : NEG_INF;
                        x[u] = s < n ? part[at + s * stride + 2u + d] : 0.0;
                    }
                [[unroll]] for (uint u = 0u; u < U; ++u) {
                    float ws = mu[u] != NEG_INF ? exp2(mu[u] - M) : 0.0; // (past n: -inf)
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
            else outv[J.out_off + qh * HDV + d] = isbad ? nan_ : o;
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
            outv[J.out_off + qh * HDV + i] = isbad ? nan_ : rot_neg(i) ? -a : a;
        }
    }
    if (tid == 0u && (ROT_V != 0u || gl_WorkGroupID.z == 0u) && lo != 0xffffffffu)
        lsev[lo + qh] = isbad ? nan_ : lse;
}
