#version 450
// rows_read.comp - decode rows of one tensor to f32, optionally re-rotating them (RoPE
// shift): kvc_vk_cmd_gather, and the first half of a RoPE shift. One invocation per value.
#include "kvc_shared.glsl"
layout(local_size_x = 64) in;
layout(constant_id = ROWS_READ_TYPE) const uint TYPE = 1u;
layout(constant_id = ROWS_READ_HD) const uint HD = 128u; // head dim of this tensor
layout(constant_id = ROWS_READ_PLANAR) const uint PLANAR = 0u; // nonzero: the planar page layout
layout(constant_id = ROWS_READ_KV_HEADS) const uint KV_HEADS = 1u;
layout(constant_id = ROWS_READ_PAGE_CELLS) const uint PAGE_CELLS = 256u;

layout(set = 0, binding = 0) readonly buffer Data { uint data[]; };
layout(set = 0, binding = 1) writeonly buffer Out { float outv[]; };
layout(set = 0, binding = 2) readonly buffer Meta { uint meta[]; };

layout(push_constant) uniform PC {
    uint n_rows;
    uint row_elems;   // kv heads * HD
    uint row_bytes;
    uint out_off;     // first output float
    uint list_off;    // word offset in meta of n_rows source cell ids
    uint rope;        // 0: none, 1: NeoX pairs (i, i+n/2), 2: interleaved pairs (2i, 2i+1)
    uint rope_dims;   // rotated dimensions per head
    uint table_off;   // word offset in meta of rope_dims/2 (cos, sin) float pairs
} pc;

uint ldw(uint which, uint w) { return data[w]; }
#include "kvc_types.glsl"

void main() {
    uint gid = gl_GlobalInvocationID.x + gl_GlobalInvocationID.y * gl_NumWorkGroups.x * 64u;
    if (gid >= pc.n_rows * pc.row_elems) return;
    uint row = gid / pc.row_elems, e = gid % pc.row_elems, h = e / HD, i = e % HD;
    uint cell = meta[pc.list_off + row], base = cell * pc.row_bytes + h * head_bytes(TYPE, HD);
    float x = PLANAR != 0u ? ld_elem_pl(0u, TYPE, HD, KV_HEADS, PAGE_CELLS, cell, h, i) : ld_elem(0u, TYPE, base, i);
    if (pc.rope != 0u && i < pc.rope_dims) {
        uint half_n = pc.rope_dims / 2u, k, partner;
        bool first;
        if (pc.rope == 1u) { first = i < half_n; k = first ? i : i - half_n; partner = first ? i + half_n : k; }
        else { first = (i & 1u) == 0u; k = i >> 1; partner = first ? i + 1u : i - 1u; }
        float c = uintBitsToFloat(meta[pc.table_off + 2u * k]), s = uintBitsToFloat(meta[pc.table_off + 2u * k + 1u]);
        float y = PLANAR != 0u ? ld_elem_pl(0u, TYPE, HD, KV_HEADS, PAGE_CELLS, cell, h, partner)
                               : ld_elem(0u, TYPE, base, partner);
        x = first ? x * c - y * s : x * c + y * s;
    }
    outv[pc.out_off + gid] = x;
}
