#version 450
// rows_write.comp - encode f32 (or f16) rows into the storage type of one tensor (K or V
// of one layer): the append kernel, and the second half of a RoPE shift. One invocation
// writes one 32-bit word of a destination row, so rows need only be 4-byte multiples
// (a q8_0 block of 34 bytes may straddle words; each word recomputes the scales it needs).
// Workgroups never span two rows: a row takes ceil(row_words / 64) of them.
// kvcache.h's non-finite rule: a (cell, kv head) whose K or V values hold a NaN, an
// infinity or a value beyond what the storage holds finite (the host's limits, pushed) is
// written poisoned, its K head as NaN (q8_0 / q4_0: NaN scales, zero codes) and its V head
// as zeros, bit for bit as kvc_put stores it. Each workgroup first checks the heads its
// words touch, in the values the host would check (the plain inputs of an append, the
// shifted keys of a RoPE shift), so a word costs a few loads more, not a head's.
#include "kvc_shared.glsl"
layout(local_size_x = 64) in;
layout(constant_id = ROWS_WRITE_TYPE) const uint TYPE = 1u;
layout(constant_id = ROWS_WRITE_PLANAR) const uint PLANAR = 0u; // nonzero: the planar page layout
layout(constant_id = ROWS_WRITE_HD) const uint HD = 128u;       // head dim of the tensor
layout(constant_id = ROWS_WRITE_KV_HEADS) const uint KV_HEADS = 1u;   // kv heads
layout(constant_id = ROWS_WRITE_PAGE_CELLS) const uint PAGE_CELLS = 256u;

layout(set = 0, binding = 0) writeonly buffer Dst { uint dst[]; };
layout(set = 0, binding = 1) readonly buffer Src { uint src[]; };   // f32 bits or f16 pairs
layout(set = 0, binding = 2) readonly buffer Meta { uint meta[]; }; // destination cell ids
// the values the non-finite rule checks: K's and V's (f32 bits or f16 pairs)
layout(set = 0, binding = 3) readonly buffer CK { uint ck[]; };
layout(set = 0, binding = 4) readonly buffer CV { uint cv[]; };

layout(push_constant) uniform PC {
    uint n_rows;
    uint row_words;   // destination row bytes / 4
    uint src_off;     // first source element
    uint src_stride;  // source elements from one row to the next
    uint src_f16;     // nonzero: the source holds f16 values
    uint list_off;    // word offset in meta of n_rows destination cell ids (page*page_cells+slot)
    uint chk_off_k;   // first checked K element (row r's at + r * KV_HEADS * chk_hd_k)
    uint chk_off_v;
    uint chk_hd_k;    // head dim of the checked K values (0: none checked)
    uint chk_hd_v;    // head dim of the checked V values (0: none checked)
    uint chk_f16;     // bit 0: the checked K values are f16, bit 1: the V values
    float lim_k;      // a checked value x is bad unless |x| <= lim (NaN: bad)
    float lim_v;
    uint is_k;        // nonzero: this tensor holds keys (poisoned as NaN), else values (zeros)
} pc;

uint ldw(uint which, uint w) { return src[w]; } // unused by this shader's paths
#include "kvc_types.glsl"

float sv(uint row, uint e) {
    uint idx = pc.src_off + row * pc.src_stride + e;
    if (pc.src_f16 != 0u) return h2f((src[idx >> 1] >> ((idx & 1u) << 4)) & 0xffffu);
    return uintBitsToFloat(src[idx]);
}

// kvcache.h quantises with lrintf (nearest, ties to even) and clamps the code; the
// product is rounded before the conversion, as here (no fused multiply-add involved).
int quant_code(float x, int lo, int hi) { return clamp(int(roundEven(x)), lo, hi); }

// q8_0 block b: d = amax/127, code = rint(x/d) in [-127, 127]
float q8_d(uint row, uint b) {
    float amax = 0.0;
    for (uint j = 0u; j < 32u; ++j) amax = max(amax, abs(sv(row, 32u * b + j)));
    return div_rn(amax, 127.0);
}
uint q8_byte(uint row, uint B) {
    uint b = B / 34u, off = B % 34u;
    float d = q8_d(row, b);
    if (off < 2u) return (f2h(d) >> (8u * off)) & 0xffu;
    float id = d > 0.0 ? div_rn(1.0, d) : d < 0.0 ? -div_rn(1.0, -d) : 0.0; /* as the CPU's 1.0f / d */
    return uint(quant_code(sv(row, 32u * b + off - 2u) * id, -127, 127)) & 0xffu;
}
// q4_0 block b: d = extreme/-8 with the extreme the first value of largest magnitude;
// nibble = rint(x/d) in [-8, 7], plus 8
float q4_d(uint row, uint b) {
    float mx = 0.0;
    for (uint j = 0u; j < 32u; ++j) {
        float v = sv(row, 32u * b + j);
        if (abs(v) > abs(mx)) mx = v;
    }
    return mx * -0.125; /* = mx / -8 exactly: no division to approximate */
}
uint q4_byte(uint row, uint B) {
    uint b = B / 18u, off = B % 18u;
    float d = q4_d(row, b);
    if (off < 2u) return (f2h(d) >> (8u * off)) & 0xffu;
    float id = d > 0.0 ? div_rn(1.0, d) : d < 0.0 ? -div_rn(1.0, -d) : 0.0; /* as the CPU's 1.0f / d */
    uint j = off - 2u;
    uint lo = uint(quant_code(sv(row, 32u * b + j) * id, -8, 7) + 8);
    uint hi = uint(quant_code(sv(row, 32u * b + j + 16u) * id, -8, 7) + 8);
    return lo | (hi << 4);
}

shared uint bad[KV_HEADS]; // the row's heads the workgroup checked: nonzero poisons

// the head of byte B of a row in planar order (B < KV_HEADS * head_bytes), or in
// llama.cpp's order
uint head_of(uint B) {
    uint hb = head_bytes(TYPE, HD);
    if (PLANAR == 0u) return B / hb;
    uint cb = pl_cb(TYPE, HD);
    return B < KV_HEADS * cb ? B / cb : (B - KV_HEADS * cb) / (HD / 16u);
}
// one checked value: bad unless |x| <= lim (so NaN is bad)
bool over(uint word, uint idx, uint f16, float lim) {
    float x = f16 != 0u ? h2f((word >> ((idx & 1u) << 4)) & 0xffffu) : uintBitsToFloat(word);
    return !(abs(x) <= lim);
}
// byte k (0-3) of a poisoned head's word: K NaN (f32 0x7fc00000, f16 0x7e00, bf16 0x7fc0;
// q8_0 / q4_0: the scale an f16 NaN, the codes 0), V zeros; B: the byte in llama.cpp's order
uint poison_byte(uint B, uint k) {
    if (pc.is_k == 0u) return 0u;
    if (TYPE == T_F32) return k == 3u ? 0x7fu : k == 2u ? 0xc0u : 0u;
    if (TYPE == T_F16) return (k & 1u) != 0u ? 0x7eu : 0u;
    if (TYPE == T_BF16) return (k & 1u) != 0u ? 0x7fu : 0xc0u;
    uint o = (B % head_bytes(TYPE, HD)) % (TYPE == T_Q8_0 ? 34u : 18u);
    return o == 1u ? 0x7eu : 0u;
}

void main() {
    uint wpr = (pc.row_words + 63u) / 64u; // workgroups a row
    uint wg = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x, lid = gl_LocalInvocationID.x;
    uint row = wg / wpr, w0 = (wg % wpr) * 64u, w = w0 + lid, word = 0u;
    if (row >= pc.n_rows) return; // (the whole workgroup)
    // the heads of the workgroup's bytes [4 w0, 4 w1): a range, or every head where the
    // bytes cross from the planar codes into the scales
    uint w1 = min(w0 + 64u, pc.row_words), h0 = head_of(4u * w0), h1 = head_of(4u * w1 - 1u);
    uint codes = PLANAR != 0u ? KV_HEADS * pl_cb(TYPE, HD) : 0u;
    if (4u * w0 < codes && 4u * w1 > codes) { h0 = 0u; h1 = KV_HEADS - 1u; }
    for (uint h = h0 + lid; h <= h1; h += 64u) bad[h] = 0u;
    barrier();
    uint nk = pc.chk_hd_k * (h1 - h0 + 1u), nv = pc.chk_hd_v * (h1 - h0 + 1u);
    for (uint i = lid; i < nk + nv; i += 64u) {
        bool v = i >= nk;
        uint hd = v ? pc.chk_hd_v : pc.chk_hd_k, j = v ? i - nk : i, h = h0 + j / hd;
        uint idx = (v ? pc.chk_off_v : pc.chk_off_k) + row * KV_HEADS * hd + h * hd + j % hd;
        uint f16 = (pc.chk_f16 >> (v ? 1u : 0u)) & 1u, wd = v ? cv[f16 != 0u ? idx >> 1 : idx] : ck[f16 != 0u ? idx >> 1 : idx];
        if (over(wd, idx, f16, v ? pc.lim_v : pc.lim_k)) atomicOr(bad[h], 1u);
    }
    barrier();
    if (w >= pc.row_words) return;
    if (TYPE == T_F32 || TYPE == T_F16 || TYPE == T_BF16) { // a word inside one head
        if (bad[head_of(4u * w)] != 0u) {
            for (uint k = 0u; k < 4u; ++k) word |= poison_byte(4u * w, k) << (8u * k);
        } else if (TYPE == T_F32) {
            word = floatBitsToUint(sv(row, w));
        } else if (TYPE == T_F16) {
            word = f2h(sv(row, 2u * w)) | (f2h(sv(row, 2u * w + 1u)) << 16);
        } else {
            word = f2bf(sv(row, 2u * w)) | (f2bf(sv(row, 2u * w + 1u)) << 16);
        }
    } else if (PLANAR != 0u) { // word w of the row in planar order: 4 bytes of one plane
        for (uint k = 0u; k < 4u; ++k) {
            uint B = pl_block_byte(TYPE, HD, KV_HEADS, 4u * w + k);
            uint x = bad[head_of(4u * w + k)] != 0u ? poison_byte(B, k) : TYPE == T_Q8_0 ? q8_byte(row, B) : q4_byte(row, B);
            word |= x << (8u * k);
        }
        dst[pl_dev_byte(TYPE, HD, KV_HEADS, PAGE_CELLS, meta[pc.list_off + row], 4u * w) >> 2] = word;
        return;
    } else {
        for (uint k = 0u; k < 4u; ++k) {
            uint B = 4u * w + k;
            uint x = bad[head_of(B)] != 0u ? poison_byte(B, k) : TYPE == T_Q8_0 ? q8_byte(row, B) : q4_byte(row, B);
            word |= x << (8u * k);
        }
    }
    dst[meta[pc.list_off + row] * pc.row_words + w] = word;
}
