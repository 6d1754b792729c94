#version 450
// copy.comp - a plain copy kernel, 16 bytes per invocation per step, grid-stride: the
// bandwidth yardstick that bench_vk measures next to attention.
layout(local_size_x = 256) in;
layout(set = 0, binding = 0) readonly buffer Src { uvec4 src[]; };
layout(set = 0, binding = 1) writeonly buffer Dst { uvec4 dst[]; };
layout(push_constant) uniform PC { uint n; } pc; // 16-byte units
void main() {
    uint stride = gl_NumWorkGroups.x * 256u;
    for (uint i = gl_GlobalInvocationID.x; i < pc.n; i += stride) dst[i] = src[i];
}
