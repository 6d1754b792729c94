#version 450
// probe_vk_products.comp - flash attention's products on VK_NV_cooperative_matrix2
// workgroup-scope matrices, no softmax (bench/probe_vk_products.c says how to build and run it).
// Each workgroup holds Q (BR x 128); each iteration loads K^T (128 x BC) and V (BC x 128) of
// one tile of the buffers (L2-resident), S = Q K^T, P = f16(S / 1000), O += P V. Timing and
// machine code only: the output is not checked.
//   -DBR=, -DBC=: the tile (multiples of the device's granularity: 32 x 16 at 128
//   invocations, 32 x 32 at 256 on an H200); -DWG=: invocations (a workgroup size the device
//   lists for workgroup scope); -DSTAGE=1: K and V staged into shared memory by the shader,
//   two bytes a load, before the matrix loads (the driver's own loads are the default);
//   -DSCOPE=gl_ScopeSubgroup: subgroup-scope matrices of the same (flexible) sizes.
#extension GL_KHR_cooperative_matrix : require
#extension GL_NV_cooperative_matrix2 : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_memory_scope_semantics : require
#ifndef BR
#define BR 64
#endif
#ifndef BC
#define BC 64
#endif
#ifndef WG
#define WG 128
#endif
#ifndef STAGE
#define STAGE 0
#endif
#ifndef SCOPE
#define SCOPE gl_ScopeWorkgroup
#endif
const uint D = 128u;
layout(local_size_x = WG) in;
layout(set = 0, binding = 0) readonly buffer KB { float16_t kb[]; };
layout(set = 0, binding = 1) readonly buffer VB { float16_t vb[]; };
layout(set = 0, binding = 2) writeonly buffer OB { float ob[]; };
layout(push_constant) uniform PC {
    uint iters;  // iterations
    uint ntiles; // tiles of D x D halves in kb and vb
} pc;
#if STAGE
shared f16vec4 sk[BC * D / 4u], sv[BC * D / 4u];
#endif

void main() {
    coopmat<float16_t, SCOPE, BR, D, gl_MatrixUseA> q;
    coopMatLoad(q, kb, (gl_WorkGroupID.x % pc.ntiles) * BC * D, D, gl_CooperativeMatrixLayoutRowMajor);
    coopmat<float, SCOPE, BR, D, gl_MatrixUseAccumulator> o = coopmat<float, SCOPE, BR, D, gl_MatrixUseAccumulator>(0.0);
    for (uint it = 0u; it < pc.iters; ++it) {
        uint base = ((gl_WorkGroupID.x * 7u + it) % pc.ntiles) * BC * D;
        coopmat<float16_t, SCOPE, D, BC, gl_MatrixUseB> kt;
        coopmat<float16_t, SCOPE, BC, D, gl_MatrixUseB> v;
#if STAGE
        barrier();
        for (uint i = gl_LocalInvocationIndex; i < BC * D / 4u; i += WG) {
            sk[i] = f16vec4(kb[base + 4u * i], kb[base + 4u * i + 1u], kb[base + 4u * i + 2u], kb[base + 4u * i + 3u]);
            sv[i] = f16vec4(vb[base + 4u * i], vb[base + 4u * i + 1u], vb[base + 4u * i + 2u], vb[base + 4u * i + 3u]);
        }
        barrier();
        coopMatLoad(kt, sk, 0u, D / 4u, gl_CooperativeMatrixLayoutColumnMajor); // K's rows as K^T's columns
        coopMatLoad(v, sv, 0u, D / 4u, gl_CooperativeMatrixLayoutRowMajor);
#else
        coopMatLoad(kt, kb, base, D, gl_CooperativeMatrixLayoutColumnMajor);
        coopMatLoad(v, vb, base, D, gl_CooperativeMatrixLayoutRowMajor);
#endif
        coopmat<float, SCOPE, BR, BC, gl_MatrixUseAccumulator> s = coopmat<float, SCOPE, BR, BC, gl_MatrixUseAccumulator>(0.0);
        s = coopMatMulAdd(q, kt, s);
        coopmat<float16_t, SCOPE, BR, BC, gl_MatrixUseA> p = coopmat<float16_t, SCOPE, BR, BC, gl_MatrixUseA>(s * 0.001);
        o = coopMatMulAdd(p, v, o);
    }
    coopMatStore(o, ob, gl_WorkGroupID.x * BR * D, D, gl_CooperativeMatrixLayoutRowMajor);
}
