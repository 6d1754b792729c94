#version 450
// attn_merge.comp - combine the split-K partials of attn_split.comp by log-sum-exp:
// one workgroup per (job, query head). The splits' weights exp2(m_s - M) / L are found
// once, in parallel, into shared memory; then four groups of 64 invocations each sum
// every fourth split's output values (loads coalesced across a group, four splits in
// flight per invocation), and the groups' sums are added. Zeros where no cell was
// visible (kvcache.h's rule).
#extension GL_EXT_control_flow_attributes : require
layout(local_size_x = 256) in;
layout(constant_id = 0) const uint HDV = 128u;
layout(constant_id = 1) const uint N_HEADS = 32u;   // query heads
const uint MAX_SPLITS = 256u;                       // kvcache_vk.h never uses more
const uint NG = 4u, GL = 64u;                       // split groups, invocations per group

layout(set = 0, binding = 0) readonly buffer PB { float part[]; };
layout(set = 0, binding = 1) readonly buffer MB { uint meta[]; };
layout(set = 0, binding = 2) writeonly buffer OB { float outv[]; };

layout(push_constant) uniform PC {
    uint job_off;
    uint n_splits;
} pc;

#include "attn_common.glsl"

shared float w[MAX_SPLITS];
shared float red[256];
shared float sums[NG * 256u];

void main() {
    uint qh = gl_WorkGroupID.x, jb = gl_WorkGroupID.y, tid = gl_LocalInvocationID.x;
    uint stride = HDV + 2u, at = (jb * N_HEADS + qh) * pc.n_splits * stride, n = pc.n_splits;
    const float NEG_INF = -1.0 / 0.0;
    // the common maximum (n <= 256: one split per invocation)
    float mx = tid < n ? part[at + tid * stride] : NEG_INF;
    red[tid] = mx;
    barrier();
    [[unroll]] for (uint h = 128u; h > 0u; h >>= 1) {
        if (tid < h) red[tid] = max(red[tid], red[tid + h]);
        barrier();
    }
    float M = red[0];
    barrier();
    // each split's weight and the total
    float f = mx == NEG_INF ? 0.0 : exp2(mx - M);
    if (tid < n) w[tid] = f;
    red[tid] = tid < n ? part[at + tid * stride + 1u] * f : 0.0;
    barrier();
    [[unroll]] for (uint h = 128u; h > 0u; h >>= 1) {
        if (tid < h) red[tid] += red[tid + h];
        barrier();
    }
    float L = red[0];
    Job J = load_job(pc.job_off, jb);
    float inv = L > 0.0 ? 1.0 / L : 0.0;
    // group sg sums splits sg, sg + 4, ... for values d = dl, dl + 64, ...; a zero weight
    // adds nothing, whatever its partial holds
    uint sg = tid / GL, dl = tid % GL;
    for (uint d0 = 0u; d0 < HDV; d0 += 256u) {
        [[unroll]] for (uint k = 0u; k < 4u; ++k) {
            uint d = d0 + dl + k * GL;
            float acc[4];
            [[unroll]] for (uint j = 0u; j < 4u; ++j) acc[j] = 0.0;
            if (d < HDV) {
                uint s = sg;
                for (; s + 3u * NG < n; s += 4u * NG)
                    [[unroll]] for (uint j = 0u; j < 4u; ++j) {
                        float x = part[at + (s + j * NG) * stride + 2u + d], ws = w[s + j * NG];
                        acc[j] += ws != 0.0 ? x * ws : 0.0;
                    }
                for (; s < n; s += NG)
                    if (w[s] != 0.0) acc[0] += part[at + s * stride + 2u + d] * w[s];
            }
            sums[sg * 256u + dl + k * GL] = (acc[0] + acc[1]) + (acc[2] + acc[3]);
        }
        barrier();
        if (d0 + tid < HDV)
            outv[J.out_off + qh * HDV + d0 + tid] =
                ((sums[tid] + sums[256u + tid]) + (sums[512u + tid] + sums[768u + tid])) * inv;
        barrier();
    }
}
