#version 450
// attn_merge_rows.comp - attn_prefill's split-K partials merged a workgroup per (job, kv
// head): the G query heads of the head group at once, by attn_onedisp.glsl's od_merge (the
// one-dispatch decode's merge: each invocation whole 4-value vectors of the G output rows,
// OD_U splits' loads in flight at a time, the rules of attn_merge.comp: sinks, log-sum-exps,
// rows of NaN). attn_merge takes a workgroup of 256 invocations per (query head, job, 32
// values), which for a prefill call of many queries is tens of thousands of workgroups (65536
// for 512 queries of 32 heads) that each wait for memory a few times over; here a call of 128
// queries over 8 kv heads is 1024 workgroups of 128.
//
// The partials are attn_prefill's in attn_onedisp.glsl's rows (HDV + 4 floats, the values 16
// bytes in; kvcache_vk.h asks attn_prefill for them with its out_mode 2). Values that are
// stored rotated keep attn_merge, which rotates them back.
#extension GL_EXT_control_flow_attributes : require
#include "kvc_shared.glsl"
// (attn_prefill's specialization constants, the same ids: kvcache_vk.h makes both pipelines
// from one list)
layout(constant_id = PREFILL_HDK) const uint HDK = 128u;
layout(constant_id = PREFILL_HDV) const uint HDV = 128u;  // a multiple of 4
layout(constant_id = PREFILL_G) const uint G = 4u;
layout(constant_id = PREFILL_KV_HEADS) const uint KV_HEADS = 8u;
const uint FUSED = 1u; // attn_onedisp.glsl's partial rows
layout(local_size_x = 128) in;

layout(set = 0, binding = 2) readonly buffer MB { uint meta[]; };
layout(set = 0, binding = 3) readonly buffer QB { float qb[]; };
layout(set = 0, binding = 4) coherent readonly buffer PB { float part[]; };

layout(push_constant) uniform PC { // attn_prefill's first four words
    uint job_off;
    uint tile_off; // (unused)
    uint chunk;    // (unused)
    uint n_splits;
} pc;

#include "attn_common.glsl"
#define OD_NT 128u
#include "attn_onedisp.glsl"

void main() {
    uint kvh = gl_WorkGroupID.x, jb = gl_WorkGroupID.y, tid = gl_LocalInvocationID.x;
    Job J = load_job(pc.job_off, jb);
    od_start();
    // the G query rows: a NaN or an infinity gives its head's row of NaN
    uint bad = 0u;
    for (uint i = tid; i < G * HDK; i += OD_NT) bad |= od_query_bad(qb[J.q_off + kvh * G * HDK + i], i / HDK);
    barrier(); // od_bad's zero
    if (bad != 0u) atomicOr(od_bad, bad);
    barrier();
    od_merge(J, jb, kvh);
}
