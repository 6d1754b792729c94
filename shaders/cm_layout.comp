#version 450
// cm_layout.comp - checks the element layout attn_prefill.comp's tensor-core build reads its
// 16 x 16 matrices by (kvcache_vk.h's kvc_vk__probe_cm_layout runs it once a context): one
// subgroup computes D = A I (A's element (r, c) = 16 r + c, loaded row-major; I loaded
// column-major, as attn_prefill loads K^T) and converts D to f16, as attn_prefill converts
// P. Word 0 of the output: 1 if every lane holds 8 elements of each and its element i sits at
// row lane / 4 + 8 (i / 4), column 2 (lane % 4) + (i & 1) + 8 ((i >> 1) & 1) in both, else 0.
#extension GL_NV_cooperative_matrix : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_shader_subgroup_vote : require
#extension GL_KHR_memory_scope_semantics : require
layout(local_size_x = 32) in;
layout(set = 0, binding = 0) writeonly buffer OB { uint ok[]; };

#define MATA fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>
#define MATC fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>
shared float16_t a_s[256], i_s[256];

void main() {
    uint lane = gl_LocalInvocationID.x;
    for (uint e = lane; e < 256u; e += 32u) {
        a_s[e] = float16_t(float(e)); // (integers up to 2048 are exact in f16)
        i_s[e] = float16_t(e / 16u == e % 16u ? 1.0 : 0.0);
    }
    barrier();
    MATA a, id;
    coopMatLoadNV(a, a_s, 0u, 16u, false);
    coopMatLoadNV(id, i_s, 0u, 16u, true);
    MATC d = coopMatMulAddNV(a, id, MATC(0.0));
    MATA p = MATA(d);
    bool good = d.length() == 8 && p.length() == 8;
    if (good)
        for (int i = 0; i < 8; ++i) {
            uint e = uint(i), want = 16u * (lane / 4u + 8u * (e / 4u)) + 2u * (lane % 4u) + (e & 1u) + 8u * ((e >> 1u) & 1u);
            good = good && d[i] == float(want) && float(p[i]) == float(want);
        }
    good = subgroupAll(good);
    if (lane == 0u) ok[0] = good ? 1u : 0u;
}
