#version 450
// rotate.comp - kvcache.h's storage rotation (kvc_pool_config.rotate; the rule is at
// kvc_rotation_block) on head vectors of f32 (or f16) values:
//   mode 0  forward R: the append's K / V before they are encoded, and q before the split
//           pass of attn_split_cm.comp (the other split passes rotate q themselves)
//   mode 1  inverse R^T: gathered rows (attn_merge.comp rotates the attention output itself)
//   mode 2  R^T, the RoPE shift of rows_read.comp, then R: a RoPE shift of rotated keys
// A workgroup takes one head vector at a time into shared memory (a loop over vectors, so
// any count fits one dispatch): signs, the Walsh-Hadamard butterflies in kvcache.h's order
// (len = 1, 2, ..., n/2, blocks of n along the head), then the product by 1/sqrt(n) -- the
// same sums and products as kvcache.h's kvc__rot_one, so an f32 result is kvc_rotate_rows'
// bit for bit (every step is one correctly rounded f32 operation; `precise` forbids fusing).
#include "kvc_shared.glsl"
layout(local_size_x = 64) in;
layout(constant_id = ROTATE_HD) const uint HD = 128u; // head dim of the vectors
layout(constant_id = ROTATE_N) const uint N = 128u;   // the rotation's block (a power of two dividing HD)

layout(set = 0, binding = 0) readonly buffer Src { uint src[]; };   // f32 bits or f16 pairs
layout(set = 0, binding = 1) buffer Dst { float dst[]; };           // may be the source buffer
layout(set = 0, binding = 2) readonly buffer Meta { uint meta[]; }; // mode 2: the RoPE table

layout(push_constant) uniform PC {
    uint n_vec;     // head vectors
    uint src_off;   // first source element (f16: in halves)
    uint dst_off;   // first destination float
    uint mode;      // 0, 1 or 2 (above)
    uint src_f16;   // nonzero: the source holds f16 values
    uint rope;      // mode 2: 1 NeoX pairs (i, i+n/2), 2 interleaved pairs (2i, 2i+1)
    uint rope_dims; // mode 2: rotated dimensions per head
    uint table_off; // mode 2: word offset in meta of rope_dims/2 (cos, sin) float pairs
    float r;        // (float)(1 / sqrt(N)), as kvcache.h rounds it
} pc;

uint ldw(uint which, uint w) { return src[w]; } // (kvc_types.glsl's loads: unused here)
#include "kvc_types.glsl"

#include "kvc_rotation.glsl"
#define X_GET(j) x[j]
#define X_PUT(j, v) x[j] = (v) // for ROT_BUTTERFLIES

shared float x[HD];
shared float y[HD];

void wht() {
    uint tid = gl_LocalInvocationID.x;
    ROT_BUTTERFLIES(X_GET, X_PUT, HD, N, tid, 64u)
}

void main() {
    uint tid = gl_LocalInvocationID.x;
    for (uint v = gl_WorkGroupID.x; v < pc.n_vec; v += gl_NumWorkGroups.x) {
        uint s0 = pc.src_off + v * HD, d0 = pc.dst_off + v * HD;
        for (uint i = tid; i < HD; i += 64u) {
            uint s = s0 + i;
            float a = pc.src_f16 != 0u ? h2f((src[s >> 1] >> ((s & 1u) << 4)) & 0xffffu) : uintBitsToFloat(src[s]);
            if (pc.mode == 0u && rot_neg(i)) a = -a;
            x[i] = a;
        }
        barrier();
        if (pc.mode != 0u) { // R^T: the transform, then the scale and the sign (one exact product r * s)
            wht();
            for (uint i = tid; i < HD; i += 64u) {
                precise float a = x[i] * pc.r;
                x[i] = rot_neg(i) ? -a : a;
            }
            barrier();
        }
        if (pc.mode == 2u) { // RoPE of the plain keys, as rows_read.comp computes it
            for (uint i = tid; i < HD; i += 64u) {
                float a = x[i];
                if (i < pc.rope_dims) {
                    uint half_n = pc.rope_dims / 2u, k, partner;
                    bool first;
                    if (pc.rope == 1u) { first = i < half_n; k = first ? i : i - half_n; partner = first ? i + half_n : k; }
                    else { first = (i & 1u) == 0u; k = i >> 1; partner = first ? i + 1u : i - 1u; }
                    float c = uintBitsToFloat(meta[pc.table_off + 2u * k]), sn = uintBitsToFloat(meta[pc.table_off + 2u * k + 1u]);
                    float b = x[partner];
                    a = first ? a * c - b * sn : a * c + b * sn;
                }
                y[i] = a;
            }
            barrier();
            for (uint i = tid; i < HD; i += 64u) x[i] = rot_neg(i) ? -y[i] : y[i]; // and R again: the signs first
            barrier();
        }
        if (pc.mode != 1u) { // R: (signs applied above) the transform, then the scale
            wht();
            for (uint i = tid; i < HD; i += 64u) {
                precise float a = x[i] * pc.r;
                x[i] = a;
            }
            barrier();
        }
        for (uint i = tid; i < HD; i += 64u) dst[d0 + i] = x[i];
        barrier(); // x is the next vector's
    }
}
