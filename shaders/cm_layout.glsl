// cm_layout.glsl - where NVIDIA's driver keeps a subgroup's elements of a 16 x N cooperative
// matrix (f32 accumulators, and f16 matrices converted from them or loaded row-major), N = 8
// ncb: element i of lane `lane` sits at row cm_row(lane, i, ncb), column cm_col(lane, i, ncb).
// Read off an H200 (docs/performance-log.md, 2026-11-29); cm_layout.comp checks it once a
// context (kvcache_vk.h's kvc_vk__probe_cm_layout), and attn_prefill.comp's tensor-core build
// and attn_split_cm.comp's REGS build run only where it holds. A row's elements are in lanes
// 4 (lane / 4) + 0..3; lanes lane ^ 4, ^ 8 and ^ 16 hold the same columns.
uint cm_row(uint lane, uint i, uint ncb) { return lane / 4u + 8u * (i / (2u * ncb)); }
uint cm_col(uint lane, uint i, uint ncb) { return 2u * (lane % 4u) + (i & 1u) + 8u * ((i >> 1u) % ncb); }
