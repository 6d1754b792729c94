#version 450
// half_exact.comp - does unpackHalf2x16 give every f16 subnormal its exact value? The Vulkan
// spec lets a driver flush them to zero; q8_0 / q4_0 block scales are f16 and go subnormal
// in blocks whose largest magnitude is under 127 x 2^-14 (q8_0) or 8 x 2^-14 (q4_0), so the
// kernels that convert scales that way (attn_split.comp's q8_0 rows, attn_split_cm.comp's
// QUANT builds) do so only where this check passed (the HALF specialization constant), by
// integer operations otherwise (kvc_types.glsl's h2f). kvcache_vk.h's kvc_vk__probe_halves
// runs it once a context, one subgroup-sized workgroup. Word 0 of the output: 1 where all of
// f16 bits h = 0 .. 1023 (zero and the subnormals, h 2^-24) and 1024 .. 2047 (the smallest
// normals, the same formula) came out exact, through both halves of the word.
layout(local_size_x = 32) in;
layout(set = 0, binding = 0) buffer OB { uint ok[]; }; // (host-cleared: 0)

shared uint bad;

void main() {
    uint t = gl_LocalInvocationID.x;
    if (t == 0u) bad = 0u;
    barrier();
    // from the invocation's index, so the driver's compiler cannot fold the conversions
    for (uint k = 0u; k < 32u; ++k) {
        uint h = 32u * k + t;
        vec2 v = unpackHalf2x16(h | ((h + 1024u) << 16)), w = unpackHalf2x16((h + 1024u) | (h << 16));
        if (v.x != float(h) * (1.0 / 16777216.0) || v.y != float(h + 1024u) * (1.0 / 16777216.0) ||
            w.x != v.y || w.y != v.x)
            atomicOr(bad, 1u);
    }
    barrier();
    if (t == 0u) ok[0] = bad == 0u ? 1u : 0u;
}
