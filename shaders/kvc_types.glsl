// kvc_types.glsl - the storage types of kvcache.h, decoded and encoded on the GPU.
// Type codes are kvc_type's values. Rows are byte arrays read through uint words, so no
// 8/16-bit storage feature is needed; a shader that includes this defines
//     uint ldw(uint which, uint word)   - word `word` of tensor `which` (0 = K, 1 = V)
// before the include. Layouts (llama.cpp's for the quantised ones):
//   f32, f16, bf16: plain arrays; q8_0: blocks of 32 = {f16 d; int8 qs[32]} (34 bytes),
//   value qs[i]*d; q4_0: {f16 d; uint8 qs[16]} (18 bytes), qs[j] low nibble = element j,
//   high nibble = element j+16, value (nibble-8)*d.
// kvcache_vk.h may hold q8_0 / q4_0 pages in the planar layout instead (pl_* below).
#define T_F32 0u
#define T_F16 1u
#define T_BF16 2u
#define T_Q8_0 3u
#define T_Q4_0 4u

// q8_0's signed code in byte b (0-3) of a word; q4_0's value before its scale in nibble n
// (0-7) of a word (the low nibble of a byte first)
float q8_code(uint w, uint b) { return float(int(w << (24u - 8u * b)) >> 24); }
float q4_code(uint w, uint n) { return float(int((w >> (4u * n)) & 15u)) - 8.0; }

uint ld_u8(uint which, uint byte_off) { return (ldw(which, byte_off >> 2) >> ((byte_off & 3u) << 3)) & 0xffu; }
// byte_off even
uint ld_u16(uint which, uint byte_off) { return (ldw(which, byte_off >> 2) >> ((byte_off & 2u) << 3)) & 0xffffu; }

// f16 -> f32 exactly, subnormals included (some drivers flush them in unpackHalf2x16)
float h2f(uint h) {
    uint sgn = (h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0u) { float f = float(m) * (1.0 / 16777216.0); return sgn != 0u ? -f : f; }
    if (e == 31u) return uintBitsToFloat(sgn | 0x7f800000u | (m << 13));
    return uintBitsToFloat(sgn | ((e + 112u) << 23) | (m << 13));
}
// the f16 in half h (0 low, 1 high) of word w as f32: by unpackHalf2x16 where `exact` (the
// kernels' HALF: half_exact.comp found it keeps subnormals; faster), else by h2f
float f16_half(uint w, uint h, bool exact) { return exact ? unpackHalf2x16(w)[h] : h2f((w >> (16u * h)) & 0xffffu); }
float bf2f(uint h) { return uintBitsToFloat(h << 16); }

// a - b q for q near a / b, with one rounding at the end: b q = p + e exactly (Dekker's
// product through Veltkamp's halves, so no fused multiply-add is needed: Vulkan gives
// fma() only the precision of a multiply then an add, and on lavapipe an fma residual
// chose the wrong neighbour below - one query code of a test_vk seed, 1795316161, whose
// x / d fell on a tie), and a - p is exact (p is within a few ulp of a).
// Halves of b or q past 2^115 would overflow: there the fma stands in.
float residual(float a, float b, float q) {
    precise float p = b * q, cb = 4097.0 * b, cq = 4097.0 * q;
    if (isinf(cb) || isinf(cq)) return fma(-b, q, a);
    precise float bh = cb - (cb - b), bl = b - bh, qh = cq - (cq - q), ql = q - qh;
    precise float e = ((bh * qh - p) + bh * ql + bl * qh) + bl * ql;
    precise float r = (a - p) - e;
    return r;
}

// a / b rounded to nearest as the CPU's division (a >= 0, b > 0, finite): drivers may
// divide through an approximate reciprocal (lavapipe does; GLSL allows 2.5 ulp), which
// moves a quantisation scale or code now and then. Of a quotient and its two float
// neighbours, the nearest to a / b leaves the smallest residual a - b q; two such steps
// reach it from up to 2 ulp away.
float nearer_quotient(float a, float b, float q) {
    float up = uintBitsToFloat(floatBitsToUint(q) + 1u), dn = q > 0.0 ? uintBitsToFloat(floatBitsToUint(q) - 1u) : q;
    precise float e = abs(residual(a, b, q)), eu = abs(residual(a, b, up)), ed = abs(residual(a, b, dn));
    return eu < e && eu <= ed ? up : ed < e ? dn : q;
}
float div_rn(float a, float b) {
    precise float q = a / b;
    if (isinf(q)) return q;
    return nearer_quotient(a, b, nearer_quotient(a, b, q));
}

// f32 -> f16, round to nearest even: the bit pattern kvcache.h's scalar path gives
uint f2h(float f) {
    uint x = floatBitsToUint(f), sgn = (x >> 16) & 0x8000u, e8 = (x >> 23) & 0xffu, m = x & 0x7fffffu;
    if (e8 == 0xffu) return sgn | 0x7c00u | (m != 0u ? (0x200u | (m >> 13)) : 0u);
    int e = int(e8) - 127 + 15;
    if (e >= 31) return sgn | 0x7c00u;
    if (e <= 0) {
        if (e < -10) return sgn;
        m |= 0x800000u;
        uint sh = uint(14 - e), hv = m >> sh, rem = m & ((1u << sh) - 1u), mid = 1u << (sh - 1u);
        if (rem > mid || (rem == mid && (hv & 1u) != 0u)) hv++;
        return sgn | hv;
    }
    uint h = (uint(e) << 10) | (m >> 13), rem = m & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u) != 0u)) h++;
    return sgn | h;
}
// f32 -> bf16, round to nearest even, NaN kept quiet
uint f2bf(float f) {
    uint x = floatBitsToUint(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (x >> 16) | 0x40u;
    return (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
}

// bytes of one head of head_dim values
uint head_bytes(uint type, uint hd) {
    if (type == T_F32) return 4u * hd;
    if (type == T_F16 || type == T_BF16) return 2u * hd;
    if (type == T_Q8_0) return 34u * (hd >> 5);
    return 18u * (hd >> 5);
}

// element i of a row (or head) that starts at byte `base`, exactly as the CPU decodes it
float ld_elem(uint which, uint type, uint base, uint i) {
    if (type == T_F32) return uintBitsToFloat(ldw(which, (base >> 2) + i));
    if (type == T_F16) return h2f(ld_u16(which, base + 2u * i));
    if (type == T_BF16) return bf2f(ld_u16(which, base + 2u * i));
    uint j = i & 31u;
    if (type == T_Q8_0) {
        uint b = base + 34u * (i >> 5);
        return q8_code(ld_u8(which, b + 2u + j), 0u) * h2f(ld_u16(which, b));
    }
    uint b = base + 18u * (i >> 5);
    return q4_code(ld_u8(which, b + 2u + (j & 15u)), j < 16u ? 0u : 1u) * h2f(ld_u16(which, b));
}

// The planar page layout: where kvcache_vk.h chooses it (q8_0 / q4_0 K and V of one head
// dim, 64, 128 or 256), page p of a tensor (K or V of one layer; P cells, H kv heads,
// rows of `row` bytes) takes the same P * row bytes at p * P * row as llama.cpp's layout,
// in two planes:
//   codes   [head][cell][CB bytes]   CB = hd (q8_0: the codes in order) or hd / 2 (q4_0:
//                                    each block's 16 bytes as llama.cpp packs them)
//   scales  [head][cell][hd / 32 f16], after all the codes (at P * H * CB)
// so one kv head's codes of consecutive cells are one run of memory, every head row
// 16-byte aligned (P a multiple of 4).
uint pl_cb(uint type, uint hd) { return type == T_Q8_0 ? hd : hd / 2u; }
uint pl_codes(uint type, uint hd, uint H, uint P, uint gid, uint h) {
    uint page = gid / P, slot = gid % P;
    return page * P * H * head_bytes(type, hd) + (h * P + slot) * pl_cb(type, hd);
}
uint pl_scale(uint type, uint hd, uint H, uint P, uint gid, uint h, uint b) {
    uint page = gid / P, slot = gid % P;
    return page * P * H * head_bytes(type, hd) + P * H * pl_cb(type, hd) + (h * P + slot) * (hd / 16u) + 2u * b;
}
// element i of head h of cell gid, planar, exactly as the CPU decodes it
float ld_elem_pl(uint which, uint type, uint hd, uint H, uint P, uint gid, uint h, uint i) {
    float d = h2f(ld_u16(which, pl_scale(type, hd, H, P, gid, h, i >> 5)));
    uint c = pl_codes(type, hd, H, P, gid, h), j = i & 31u;
    if (type == T_Q8_0) return q8_code(ld_u8(which, c + i), 0u) * d;
    return q4_code(ld_u8(which, c + 16u * (i >> 5) + (j & 15u)), j < 16u ? 0u : 1u) * d;
}
// A cell's row of H heads read in planar order (all codes, then all scales): byte B of it
// is byte pl_block_byte(B) of the row in llama.cpp's layout, and lies at device byte
// pl_dev_byte(B) (codes and scales come in whole words: hd a multiple of 64).
uint pl_block_byte(uint type, uint hd, uint H, uint B) {
    uint cb = pl_cb(type, hd), hb = head_bytes(type, hd), bb = type == T_Q8_0 ? 34u : 18u, sb = hd / 16u;
    if (B < H * cb) {
        uint h = B / cb, o = B % cb, per = type == T_Q8_0 ? 32u : 16u;
        return h * hb + bb * (o / per) + 2u + o % per;
    }
    B -= H * cb;
    uint h = B / sb, o = B % sb;
    return h * hb + bb * (o / 2u) + (o & 1u);
}
uint pl_dev_byte(uint type, uint hd, uint H, uint P, uint gid, uint B) {
    uint cb = pl_cb(type, hd), sb = hd / 16u;
    if (B < H * cb) return pl_codes(type, hd, H, P, gid, B / cb) + B % cb;
    B -= H * cb;
    return pl_scale(type, hd, H, P, gid, B / sb, 0u) + B % sb;
}
