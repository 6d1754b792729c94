// attn_common.glsl - one attention job (a query over the cells of one cache) as
// kvcache_vk.h lays it out in the meta buffer (the words named in kvc_shared.glsl), and
// the mask rules of kvcache.h.
#include "kvc_shared.glsl"
struct Job {
    uint kind;            // 0: FULL/ROTATING (token ranges), 1: CAUSAL (cell range), 2: CAUSAL, all of it visible
    uint n_view;          // cells the job may read
    uint b0, e0, b1, e1;  // kind 0: tokens [b0,e0) then [b1,e1); kind 1: cells [b1,e1)
    uint pt_off;          // page table: kind 0 logical pages [0,nsink) then [lp_base, ...)
    uint nsink, lp_base;
    int qpos; uint qseq, nc; int win; int sinks; int recent;
    int cwin; int chunk; uint cpos_off, cseq_off, words; // words: JOB_SEQ_WORDS
    uint q_off, out_off;
};

Job load_job(uint off, uint j) {
    uint b = off + j * JOB_STRIDE;
    Job J;
    // (JOB_KIND is word 0: meta[b + JOB_KIND] would add an instruction to attn_split_cm's
    // unoptimised SPIR-V)
    J.kind = meta[b]; J.n_view = meta[b + JOB_N_VIEW];
    J.b0 = meta[b + JOB_B0]; J.e0 = meta[b + JOB_E0]; J.b1 = meta[b + JOB_B1]; J.e1 = meta[b + JOB_E1];
    J.pt_off = meta[b + JOB_PT_OFF]; J.nsink = meta[b + JOB_NSINK]; J.lp_base = meta[b + JOB_LP_BASE];
    J.qpos = int(meta[b + JOB_QPOS]); J.qseq = meta[b + JOB_QSEQ]; J.nc = meta[b + JOB_NC]; J.win = int(meta[b + JOB_WIN]);
    J.sinks = int(meta[b + JOB_SINKS]); J.recent = int(meta[b + JOB_RECENT]);
    J.cwin = int(meta[b + JOB_CWIN]); J.chunk = int(meta[b + JOB_CHUNK]);
    J.cpos_off = meta[b + JOB_CPOS_OFF]; J.cseq_off = meta[b + JOB_CSEQ_OFF]; J.words = meta[b + JOB_SEQ_WORDS];
    J.q_off = meta[b + JOB_Q_OFF]; J.out_off = meta[b + JOB_OUT_OFF];
    return J;
}

// The vi-th cell of the job's view: may the query see it? gid = page * page_cells + slot.
bool cell_visible(Job J, uint vi, uint pcells, out uint gid) {
    int key;
    if (J.kind == 0u) {
        uint n0 = J.e0 - J.b0, t = vi < n0 ? J.b0 + vi : J.b1 + (vi - n0), lp = t / pcells;
        uint idx = lp < J.nsink ? lp : J.nsink + (lp - J.lp_base);
        gid = meta[J.pt_off + idx] * pcells + t % pcells;
        key = int(t);
        if (J.recent > 0 && key >= J.sinks && key < J.qpos - J.recent + 1) return false;
    } else {
        uint cell = J.b1 + vi;
        gid = meta[J.pt_off + cell / pcells] * pcells + cell % pcells;
        if (J.kind == 2u) return true; // every cell of the range is visible (kvcache_vk.h's kvc_vk__all_seen)
        if (((meta[J.cseq_off + cell * J.words + (J.qseq >> 5)] >> (J.qseq & 31u)) & 1u) == 0u) return false;
        key = int(meta[J.cpos_off + cell]);
        if (J.cwin > 0 && key <= J.qpos - J.cwin) return false;
        if (J.chunk > 0 && key / J.chunk != J.qpos / J.chunk) return false;
    }
    if (J.nc == 0u && key > J.qpos) return false;
    if (J.win > 0 && key <= J.qpos - J.win) return false;
    return true;
}

// kvcache.h's non-finite rule: a visible score that is not finite (a poisoned key's NaN,
// an overflow of q.k) gives its query row NaN, soft-capped or not. The split passes take
// such a score as +inf (a GPU's max() may drop a NaN, never an infinity), so the split's
// maximum is +inf, and attn_merge writes the row (and its log-sum-exp) as NaN.
const float POS_INF = 1.0 / 0.0;
bool nonfinite(float x) { return (floatBitsToUint(x) & 0x7f800000u) == 0x7f800000u; }
// a visible cell's score, +inf if not finite; score_capped after the soft-cap (cap > 0, in
// base 2). Callers branch on the cap outside their loops (a uniform branch): a select
// inside would evaluate tanh for every score, which cost the quantized kernels 5-9 % on an
// H100 when the cap was off.
float score_finite(float s) { return nonfinite(s) ? POS_INF : s; }
float score_capped(float s, float cap) { return nonfinite(s) ? POS_INF : cap * tanh(s / cap); }

// The end of a query head's row (attn_merge.comp's rules, which attn_prefill's one-split
// output follows): the head's sink, a natural-log logit (f32 bits at meta word so + head; so
// ~0u: none), in base 2, -inf for none; then, from the row's base-2 maximum M and sum L with
// the sink joining the denominator, the factor fM of its unnormalised values and the
// denominator Lt (values x fM / Lt; Lt = 0: zeros, nothing seen), and the row's log-sum-exp
// (natural log; -inf where nothing was seen), returned.
float head_sink(uint so, uint head) {
    return so != 0xffffffffu ? uintBitsToFloat(meta[so + head]) * 1.4426950408889634 : -POS_INF;
}
float softmax_end(float M, float L, float sk, out float fM, out float Lt) {
    float Ms = max(M, sk);
    fM = Ms == -POS_INF ? 0.0 : exp2(M - Ms);
    float fS = Ms == -POS_INF ? 0.0 : exp2(sk - Ms);
    Lt = L * fM + fS;
    return Lt > 0.0 ? (Ms + log2(Lt)) * 0.6931471805599453 : -POS_INF;
}
