#version 450
// rows_write.comp - encode f32 (or f16) rows into the storage type of one tensor (K or V
// of one layer): the append kernel, and the second half of a RoPE shift. One invocation
// writes one 32-bit word of a destination row, so rows need only be 4-byte multiples
// (a q8_0 block of 34 bytes may straddle words; each word recomputes the scales it needs).
#include "kvc_shared.glsl"
layout(local_size_x = 64) in;
layout(constant_id = ROWS_WRITE_TYPE) const uint TYPE = 1u;
layout(constant_id = ROWS_WRITE_PLANAR) const uint PLANAR = 0u; // nonzero: the planar page layout
layout(constant_id = ROWS_WRITE_HD) const uint HD = 128u;       // (planar) head dim
layout(constant_id = ROWS_WRITE_KV_HEADS) const uint KV_HEADS = 1u;
layout(constant_id = ROWS_WRITE_PAGE_CELLS) const uint PAGE_CELLS = 256u;

layout(set = 0, binding = 0) writeonly buffer Dst { uint dst[]; };
layout(set = 0, binding = 1) readonly buffer Src { uint src[]; };   // f32 bits or f16 pairs
layout(set = 0, binding = 2) readonly buffer Meta { uint meta[]; }; // destination cell ids

layout(push_constant) uniform PC {
    uint n_rows;
    uint row_words;   // destination row bytes / 4
    uint src_off;     // first source element
    uint src_stride;  // source elements from one row to the next
    uint src_f16;     // nonzero: the source holds f16 values
    uint list_off;    // word offset in meta of n_rows destination cell ids (page*page_cells+slot)
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

void main() {
    uint gid = gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * 64u;
    if (gid >= pc.n_rows * pc.row_words) return;
    uint row = gid / pc.row_words, w = gid % pc.row_words, word = 0u;
    if (TYPE == T_F32) {
        word = floatBitsToUint(sv(row, w));
    } else if (TYPE == T_F16) {
        word = f2h(sv(row, 2u * w)) | (f2h(sv(row, 2u * w + 1u)) << 16);
    } else if (TYPE == T_BF16) {
        word = f2bf(sv(row, 2u * w)) | (f2bf(sv(row, 2u * w + 1u)) << 16);
    } else if (PLANAR != 0u) { // word w of the row in planar order: 4 bytes of one plane
        for (uint k = 0u; k < 4u; ++k) {
            uint B = pl_block_byte(TYPE, HD, KV_HEADS, 4u * w + k);
            word |= (TYPE == T_Q8_0 ? q8_byte(row, B) : q4_byte(row, B)) << (8u * k);
        }
        dst[pl_dev_byte(TYPE, HD, KV_HEADS, PAGE_CELLS, meta[pc.list_off + row], 4u * w) >> 2] = word;
        return;
    } else {
        for (uint k = 0u; k < 4u; ++k)
            word |= (TYPE == T_Q8_0 ? q8_byte(row, 4u * w + k) : q4_byte(row, 4u * w + k)) << (8u * k);
    }
    dst[meta[pc.list_off + row] * pc.row_words + w] = word;
}
