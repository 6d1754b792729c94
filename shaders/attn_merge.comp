#version 450
// attn_merge.comp - combine the split-K partials of attn_split.comp by log-sum-exp:
// one workgroup per (job, query head). The splits' weights exp2(m_s - M) / L are found
// once, in parallel, into shared memory; then each invocation sums one output value
// over the splits (loads coalesced across the workgroup). Zeros where no cell was
// visible (kvcache.h's rule).
#extension GL_EXT_control_flow_attributes : require
layout(local_size_x = 128) in;
layout(constant_id = 0) const uint HDV = 128u;
layout(constant_id = 1) const uint N_HEADS = 32u;   // query heads
const uint MAX_SPLITS = 256u;                       // kvcache_vk.h never uses more

layout(set = 0, binding = 0) readonly buffer PB { float part[]; };
layout(set = 0, binding = 1) readonly buffer MB { uint meta[]; };
layout(set = 0, binding = 2) writeonly buffer OB { float outv[]; };

layout(push_constant) uniform PC {
    uint job_off;
    uint n_splits;
} pc;

#include "attn_common.glsl"

shared float w[MAX_SPLITS];
shared float red[128];

void main() {
    uint qh = gl_WorkGroupID.x, jb = gl_WorkGroupID.y, tid = gl_LocalInvocationID.x;
    uint stride = HDV + 2u, at = (jb * N_HEADS + qh) * pc.n_splits * stride;
    const float NEG_INF = -1.0 / 0.0;
    // the common maximum
    float mx = NEG_INF;
    for (uint s = tid; s < pc.n_splits; s += 128u) mx = max(mx, part[at + s * stride]);
    red[tid] = mx;
    barrier();
    [[unroll]] for (uint h = 64u; h > 0u; h >>= 1) {
        if (tid < h) red[tid] = max(red[tid], red[tid + h]);
        barrier();
    }
    float M = red[0];
    barrier();
    // each split's weight and the total
    float sum = 0.0;
    for (uint s = tid; s < pc.n_splits; s += 128u) {
        float ms = part[at + s * stride];
        float f = ms == NEG_INF ? 0.0 : exp2(ms - M);
        w[s] = f;
        sum += part[at + s * stride + 1u] * f;
    }
    red[tid] = sum;
    barrier();
    [[unroll]] for (uint h = 64u; h > 0u; h >>= 1) {
        if (tid < h) red[tid] += red[tid + h];
        barrier();
    }
    float L = red[0];
    Job J = load_job(pc.job_off, jb);
    float inv = L > 0.0 ? 1.0 / L : 0.0;
    for (uint i = tid; i < HDV; i += 128u) {
        float acc = 0.0;
        for (uint s = 0u; s < pc.n_splits; ++s)
            if (w[s] != 0.0) acc += part[at + s * stride + 2u + i] * w[s];
        outv[J.out_off + qh * HDV + i] = acc * inv;
    }
}
