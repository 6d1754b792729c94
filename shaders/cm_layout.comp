#version 450
// cm_layout.comp - checks the element layout that attn_prefill.comp's tensor-core build and
// attn_split_cm.comp's REGS build read their matrices by (kvcache_vk.h's
// kvc_vk__probe_cm_layout runs it once a context). One subgroup computes D = A I for a 16 x 16
// identity (loaded column-major, as attn_prefill loads K^T) and for a 16 x 8 one (A's element
// (r, c) = 16 r + c, loaded row-major), and converts each D to f16, as both kernels convert
// P. A 16 x N matrix (N = 8 NCB) is in the expected layout if every lane holds 4 NCB elements
// and its element i sits where cm_layout.glsl says, in the f32 D and in its f16 conversion
// alike. Word 0 of the output: bit 0 for the 16 x 16 matrices, bit 1 for the 16 x 8 ones.
// KHR: the same with VK_KHR_cooperative_matrix's typed matrices (attn_prefill's KHR build), whose
// A operands are never read by element: there the f16 conversion (an A operand) is checked by
// its product with the identity, which must give the accumulator back in the same places.
#ifndef KHR
#define KHR 0
#endif
#if KHR // (glslang 15 or later: shaders/embed.sh)
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_NV_cooperative_matrix2 : require
#else
#extension GL_NV_cooperative_matrix : require
#endif
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_shader_subgroup_vote : require
#extension GL_KHR_memory_scope_semantics : require
#include "cm_layout.glsl"
layout(local_size_x = 32) in;
layout(set = 0, binding = 0) writeonly buffer OB { uint ok[]; };

#if KHR
#define MATA coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA>
#define MATB coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB>
#define MATC coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>
#define MATB8 coopmat<float16_t, gl_ScopeSubgroup, 16, 8, gl_MatrixUseB>
#define MATC8 coopmat<float, gl_ScopeSubgroup, 16, 8, gl_MatrixUseAccumulator>
#else
#define MATA fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>
#define MATB MATA
#define MATC fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>
#define MATB8 fcoopmatNV<16, gl_ScopeSubgroup, 16, 8>
#define MATC8 fcoopmatNV<32, gl_ScopeSubgroup, 16, 8>
#endif
shared float16_t a_s[256], i_s[256], i8_s[128];

// element i of `lane` in a 16 x (8 ncb) matrix, as 16 row + column
uint expected(uint lane, uint i, uint ncb) {
    return 16u * cm_row(lane, i, ncb) + cm_col(lane, i, ncb);
}

void main() {
    uint lane = gl_LocalInvocationID.x;
    for (uint e = lane; e < 256u; e += 32u) {
        a_s[e] = float16_t(float(e)); // (integers up to 2048 are exact in f16)
        i_s[e] = float16_t(e / 16u == e % 16u ? 1.0 : 0.0);
        if (e < 128u) i8_s[e] = float16_t(e / 8u == e % 8u ? 1.0 : 0.0);
    }
    barrier();
#if KHR
    MATA a;
    MATB id;
    MATB8 id8;
    coopMatLoad(a, a_s, 0u, 16u, gl_CooperativeMatrixLayoutRowMajor);
    coopMatLoad(id, i_s, 0u, 16u, gl_CooperativeMatrixLayoutColumnMajor);
    coopMatLoad(id8, i8_s, 0u, 8u, gl_CooperativeMatrixLayoutRowMajor);
    MATC d = coopMatMulAdd(a, id, MATC(0.0));
    MATC p = coopMatMulAdd(MATA(d), id, MATC(0.0)); // (the f16 conversion, by its product)
    MATC8 d8 = coopMatMulAdd(a, id8, MATC8(0.0));
    MATC8 p8 = coopMatMulAdd(MATA(d), id8, MATC8(0.0));
#else
    MATA a, id;
    MATB8 id8;
    coopMatLoadNV(a, a_s, 0u, 16u, false);
    coopMatLoadNV(id, i_s, 0u, 16u, true);
    coopMatLoadNV(id8, i8_s, 0u, 8u, false);
    MATC d = coopMatMulAddNV(a, id, MATC(0.0));
    MATA p = MATA(d);
    MATC8 d8 = coopMatMulAddNV(a, id8, MATC8(0.0));
    MATB8 p8 = MATB8(d8);
#endif
    bool good = d.length() == 8 && p.length() == 8;
    if (good)
        for (int i = 0; i < 8; ++i) {
            float want = float(expected(lane, uint(i), 2u));
            good = good && d[i] == want && float(p[i]) == want;
        }
    bool good8 = d8.length() == 4 && p8.length() == 4;
    if (good8)
        for (int i = 0; i < 4; ++i) {
            float want = float(expected(lane, uint(i), 1u));
            good8 = good8 && d8[i] == want && float(p8[i]) == want;
        }
    good = subgroupAll(good);
    good8 = subgroupAll(good8);
    if (lane == 0u) ok[0] = (good ? 1u : 0u) | (good8 ? 2u : 0u);
}
