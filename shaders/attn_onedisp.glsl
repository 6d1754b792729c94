// attn_onedisp.glsl - the one-dispatch decode: FUSED builds of the split passes
// (attn_split.comp, attn_split_cm.comp) merge their own partials, so a small decode call is
// one dispatch, with no barrier and no attn_merge after it.
//
// Every workgroup writes its split's partials (max, sum, output row per query head) as in
// the two-pass path, but in rows of HDV + 4 floats whose outputs start 16 bytes in (vector
// loads), then counts itself done on an atomic counter of its (job, kv head); the workgroup
// that brings the count to n_splits merges the head group from every split's partials (the
// rules of attn_merge.comp: sinks, log-sum-exps, rows of NaN) and sets the counter back to
// zero for the next call (whose opening barrier orders it: no fill per call).
//
// The merge is spread so it waits for memory as few times as it can (branch vkdecode's
// merge, one subgroup of a workgroup reading 64 splits in 16 rounds, cost 30 us at 4k cells):
// each invocation takes whole 4-value vectors of the G output rows, and for each loads
// OD_U splits' (max, sum, vector) at once, combining them by an online log-sum-exp, no
// shared memory and no barrier; the host fuses only calls of few splits (kvcache_vk.h,
// KVC_VK__FUSED_SPLITS), and attn_split_cm first merges its subgroups' partials in shared
// memory, so a workgroup holds one split of several subgroups.
//
// Ordering, in GLSL's memory model: the partials and counters are `coherent`; each
// invocation's memoryBarrierBuffer() orders its partial writes before the workgroup's
// barrier() and the count (atomicAdd), and the last workgroup's memoryBarrierBuffer() after
// the count orders its reads of the others' partials after it (CUDA's threadFenceReduction).
//
// A query row holding a NaN or an infinity gives a row of NaN. Every workgroup has read the
// query rows (its prologue), so its invocations note the heads of the bad values they saw
// there (od_query_bad), hand them to od_finish, and the last workgroup merges without
// reading the queries again (it cost the merge a memory round trip and a barrier).
//
// The including shader defines OD_NT (invocations of its workgroup) before including this,
// and declares HDK, HDV, G, KV_HEADS, FUSED, part[] (binding 4, `coherent`), meta[],
// pc.job_off, pc.n_splits and attn_common.glsl; FUSED builds call od_start() first in main.
#ifndef ATTN_ONEDISP_GLSL
#define ATTN_ONEDISP_GLSL

layout(set = 0, binding = 9) coherent buffer OC { uint od_count[]; };       // one per (job, kv head)
layout(set = 0, binding = 10) writeonly buffer OO { float od_out[]; };      // the attention's output
layout(set = 0, binding = 11) writeonly buffer OL { float od_lse[]; };      // log-sum-exps, where asked
layout(set = 0, binding = 12) coherent readonly buffer OP4 { vec4 part4[]; }; // part, as vectors

const uint OD_PO = FUSED != 0u ? 4u : 2u;     // a partial row: max, sum, (FUSED: 2 pads), the values
const uint OD_STRIDE = HDV + OD_PO;
const uint OD_Q = HDV / 4u;                   // vectors of an output row (FUSED: HDV % 4 == 0)
const uint OD_K = (G * OD_Q + OD_NT - 1u) / OD_NT; // vectors per invocation
const uint OD_U = 8u;                         // splits whose loads are in flight together
shared uint od_last;
shared uint od_bad; // bit h: query head h's row holds a NaN or an infinity

// First in main (FUSED builds; a barrier() comes between it and od_finish): no bad row yet.
void od_start() {
    if (gl_LocalInvocationID.x == 0u) od_bad = 0u;
}

// A query value as loaded (not yet scaled or rotated) of head h: its bit of od_finish's mask
uint od_query_bad(float x, uint h) { return nonfinite(x) ? 1u << h : 0u; }

void od_merge(Job J, uint jb, uint kvh) {
    const float NEG_INF = -1.0 / 0.0;
    uint tid = gl_LocalInvocationID.x, n = pc.n_splits;
    uint jw = pc.job_off + jb * JOB_STRIDE, so = meta[jw + JOB_SINK_OFF], lo = meta[jw + JOB_LSE_OFF];
    float nan_ = uintBitsToFloat(0x7fc00000u);
    float M[OD_K], L[OD_K];
    vec4 acc[OD_K];
    bool bad[OD_K];
    [[unroll]] for (uint k = 0u; k < OD_K; ++k) {
        uint v = tid + k * OD_NT, h = v / OD_Q;
        M[k] = NEG_INF; L[k] = 0.0; acc[k] = vec4(0.0); bad[k] = false;
        if (h >= G) continue;
        uint r0 = ((jb * KV_HEADS + kvh) * G + h) * n; // the head's split 0
        for (uint s0 = 0u; s0 < n; s0 += OD_U) {
            float mu[OD_U], lu[OD_U];
            vec4 xu[OD_U];
            [[unroll]] for (uint u = 0u; u < OD_U; ++u) {
                uint s = s0 + u, at = (r0 + s) * OD_STRIDE;
                mu[u] = s < n ? part[at] : NEG_INF;
                lu[u] = s < n ? part[at + 1u] : 0.0;
                xu[u] = s < n ? part4[at / 4u + 1u + v % OD_Q] : vec4(0.0);
            }
            float mc = M[k];
            [[unroll]] for (uint u = 0u; u < OD_U; ++u) {
                mc = max(mc, mu[u]);
                bad[k] = bad[k] || mu[u] == POS_INF; // the split saw a score not finite
            }
            float a = M[k] == NEG_INF ? 0.0 : exp2(M[k] - mc);
            acc[k] *= a;
            L[k] *= a;
            [[unroll]] for (uint u = 0u; u < OD_U; ++u) {
                // a zero weight adds nothing, whatever its partial holds
                float w = mu[u] == NEG_INF ? 0.0 : exp2(mu[u] - mc);
                if (w != 0.0) { acc[k] += xu[u] * w; L[k] += lu[u] * w; }
            }
            M[k] = mc;
        }
    }
    [[unroll]] for (uint k = 0u; k < OD_K; ++k) {
        uint v = tid + k * OD_NT, h = v / OD_Q;
        if (h >= G) continue;
        // the head's sink (a natural-log logit) joins the denominator; the maxima are base 2
        float sk = so != 0xffffffffu ? uintBitsToFloat(meta[so + kvh * G + h]) * 1.4426950408889634 : NEG_INF;
        float Ms = max(M[k], sk);
        float fM = Ms == NEG_INF ? 0.0 : exp2(M[k] - Ms), fS = Ms == NEG_INF ? 0.0 : exp2(sk - Ms);
        float Lt = L[k] * fM + fS;
        bool isbad = bad[k] || ((od_bad >> h) & 1u) != 0u;
        vec4 o = Lt > 0.0 ? acc[k] * fM / Lt : vec4(0.0);
        uint d = (v % OD_Q) * 4u, oa = J.out_off + (kvh * G + h) * HDV + d;
        [[unroll]] for (uint e = 0u; e < 4u; ++e) od_out[oa + e] = isbad ? nan_ : o[e];
        if (d == 0u && lo != 0xffffffffu)
            od_lse[lo + kvh * G + h] = isbad ? nan_ : Lt > 0.0 ? (Ms + log2(Lt)) * 0.6931471805599453 : NEG_INF;
    }
}

// At the end of main, by every invocation (uniform control flow), once the workgroup's
// partials are written: the last workgroup of the (job, kv head) merges its G query heads.
// qbad: the od_query_bad bits of the query values this invocation loaded.
void od_finish(Job J, uint jb, uint kvh, uint qbad) {
    uint tid = gl_LocalInvocationID.x;
    if (qbad != 0u) atomicOr(od_bad, qbad);
    memoryBarrierBuffer(); // this invocation's partials before the count
    barrier();
    if (tid == 0u) {
        uint ci = jb * KV_HEADS + kvh;
        uint done = atomicAdd(od_count[ci], 1u) + 1u;
        od_last = done == pc.n_splits ? 1u : 0u;
        if (done == pc.n_splits) atomicExchange(od_count[ci], 0u); // all counted: ready for the next call
    }
    barrier();
    if (od_last == 0u) return;
    memoryBarrierBuffer(); // the others' partials after the count
    od_merge(J, jb, kvh);
}
#endif
