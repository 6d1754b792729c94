#version 450
// attn_merge.comp - combine the split-K partials of attn_split.comp by log-sum-exp:
// one workgroup per (job, query head); zeros where no cell was visible (kvcache.h's rule).
layout(local_size_x = 64) in;
layout(constant_id = 0) const uint HDV = 128u;
layout(constant_id = 1) const uint N_HEADS = 32u;   // query heads

layout(set = 0, binding = 0) readonly buffer PB { float part[]; };
layout(set = 0, binding = 1) readonly buffer MB { uint meta[]; };
layout(set = 0, binding = 2) writeonly buffer OB { float outv[]; };

layout(push_constant) uniform PC {
    uint job_off;
    uint n_splits;
} pc;

#include "attn_common.glsl"

void main() {
    uint qh = gl_WorkGroupID.x, jb = gl_WorkGroupID.y, tid = gl_LocalInvocationID.x;
    Job J = load_job(pc.job_off, jb);
    uint stride = HDV + 2u, at = (jb * N_HEADS + qh) * pc.n_splits * stride;
    float M = -1.0 / 0.0, L = 0.0;
    for (uint s = 0u; s < pc.n_splits; ++s) M = max(M, part[at + s * stride]);
    for (uint s = 0u; s < pc.n_splits; ++s) {
        float ms = part[at + s * stride];
        if (ms != -1.0 / 0.0) L += part[at + s * stride + 1u] * exp2(ms - M);
    }
    for (uint i = tid; i < HDV; i += 64u) {
        float acc = 0.0;
        for (uint s = 0u; s < pc.n_splits; ++s) {
            float ms = part[at + s * stride];
            if (ms != -1.0 / 0.0) acc += part[at + s * stride + 2u + i] * exp2(ms - M);
        }
        outv[J.out_off + qh * HDV + i] = L > 0.0 ? acc / L : 0.0;
    }
}
