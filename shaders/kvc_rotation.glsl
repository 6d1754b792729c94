// kvc_rotation.glsl - kvcache.h's storage rotation (kvc_pool_config.rotate; the rule is at
// kvc_rotation_block, its scalar reference kvc__rot_one): the signs and the scale, for
// rotate.comp and the attention passes that fold the rotation in (attn_split.comp and
// attn_split_q.comp rotate q as they load it, attn_merge.comp rotates the output back).
// Forward R: signs, the Walsh-Hadamard butterflies (len = 1, 2, ..., n/2, blocks of n along
// the head, pair (j, j + len) with j = (p / len) 2 len + p % len), then the product by
// rot_scale(n); R^T: the butterflies, then the product by rot_scale(n) and the sign. Every
// step is one correctly rounded f32 operation (`precise` products: no fusing), so the
// results are kvc_rotate_rows' bits.
#ifndef KVC_ROTATION_GLSL
#define KVC_ROTATION_GLSL

// The butterflies of n values in shared memory, blocks of BLOCK, by the invocations TID,
// TID + STEP, ...; a barrier after each round. GET(j) reads value j and PUT(j, v) writes it
// (macros of the caller: its values may be packed).
#define ROT_BUTTERFLIES(GET, PUT, n, BLOCK, TID, STEP)                  \
    for (uint len_ = 1u; len_ < (BLOCK); len_ <<= 1) {                 \
        for (uint p_ = (TID); p_ < (n) / 2u; p_ += (STEP)) {           \
            uint j_ = (p_ / len_) * 2u * len_ + p_ % len_;              \
            precise float a_ = GET(j_), b_ = GET(j_ + len_);            \
            precise float s_ = a_ + b_, d_ = a_ - b_;                   \
            PUT(j_, s_);                                                \
            PUT(j_ + len_, d_);                                         \
        }                                                               \
        barrier();                                                      \
    }

// One round (pairs LEN apart) of the same butterflies on values held in a subgroup's
// registers: lane LANE holds X[0 .. NV), values LANE NV .. LANE NV + NV - 1 of the row. A
// pair closer than NV is the lane's own; a farther one spans lanes LANE and LANE ^ (LEN / NV),
// the lower keeping a + b and the upper a - b: the operations above, so the same bits. (For
// shaders with GL_KHR_shader_subgroup_shuffle and GL_EXT_control_flow_attributes.)
#define ROT_ROUND_REGS(X, NV, LEN, LANE)                                 \
    if ((LEN) < (NV)) {                                                  \
        [[unroll]] for (uint v_ = 0u; v_ < (NV); ++v_)                   \
            if ((v_ & (LEN)) == 0u) {                                    \
                precise float a_ = X[v_], b_ = X[v_ + (LEN)];            \
                precise float s_ = a_ + b_, d_ = a_ - b_;                \
                X[v_] = s_;                                              \
                X[v_ + (LEN)] = d_;                                      \
            }                                                            \
    } else {                                                             \
        bool up_ = ((LANE) & ((LEN) / (NV))) != 0u;                      \
        [[unroll]] for (uint v_ = 0u; v_ < (NV); ++v_) {                 \
            precise float y_ = subgroupShuffleXor(X[v_], (LEN) / (NV));  \
            precise float s_ = X[v_] + y_, d_ = y_ - X[v_];              \
            X[v_] = up_ ? d_ : s_;                                       \
        }                                                                \
    }

// KVC_ROTATION_SIGNS_INIT: s(i) = -1 where bit (i mod 256) is set (i: the index in the head)
const uint ROT_SIGNS[8] = uint[](0x16E6060Eu, 0x778C5721u, 0x8BF5716Au, 0x3A28247Bu, 0xF53ADB1Fu, 0x0B1599BEu,
                                 0x88F886E3u, 0xD1251A7Fu);

bool rot_neg(uint i) { return ((ROT_SIGNS[(i & 255u) >> 5] >> (i & 31u)) & 1u) != 0u; }

// (float)(1 / sqrt(n)) as kvcache.h rounds it, n = 2^k: 2^-(k/2), times sqrt(1/2) rounded to
// f32 (0x3f3504f3) where k is odd (a power of two times a rounded value is that value rounded)
float rot_scale(uint n) {
    uint k = uint(findMSB(n));
    float p = uintBitsToFloat((127u - k / 2u) << 23);
    return (k & 1u) != 0u ? p * uintBitsToFloat(0x3f3504f3u) : p;
}
#endif
