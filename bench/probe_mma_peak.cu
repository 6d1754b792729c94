// probe_mma_peak.cu - how fast mma.sync (HMMA.16816: f16 inputs, f32 accumulators) runs on an
// NVIDIA GPU at most: every warp issues CHAINS independent m16n8k16 products from registers,
// with no memory traffic in the loop. It is the ceiling for kernels built from the products
// that Vulkan's cooperative matrices compile to on this driver (bench/probe_vk_products.c);
// docs/performance-log.md (issue 37, round 20) compares attn_prefill and SDPA with it.
//   nvcc -O3 -arch=sm_90 bench/probe_mma_peak.cu -o build/probe_mma_peak && build/probe_mma_peak
//   (cuobjdump -sass build/probe_mma_peak | grep HMMA shows the instruction)
#include <cstdio>
#include <cuda_runtime.h>

#define CHAINS 8
#define ITERS 4096

__global__ void products(float *out, unsigned seed) {
    unsigned a[4] = {seed, seed ^ 1u, seed ^ 2u, seed ^ 3u}, b[2] = {seed ^ 5u, seed ^ 6u};
    float c[CHAINS][4] = {};
    for (int i = 0; i < ITERS; ++i) {
#pragma unroll
        for (int j = 0; j < CHAINS; ++j)
            asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                         "{%0,%1,%2,%3};"
                         : "+f"(c[j][0]), "+f"(c[j][1]), "+f"(c[j][2]), "+f"(c[j][3])
                         : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
    float s = 0.0f;
    for (int j = 0; j < CHAINS; ++j) s += c[j][0] + c[j][1] + c[j][2] + c[j][3];
    if (s == 12345.0f) out[threadIdx.x] = s; // (keeps the products)
}

int main() {
    float *out;
    cudaEvent_t e0, e1;
    int sms = 0;
    if (cudaMalloc(&out, 4096) != cudaSuccess) {
        printf("probe_mma_peak: skipped (no CUDA device)\n");
        return 0;
    }
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    for (int warps = 4; warps <= 16; warps *= 2) {
        float ms = 0.0f;
        products<<<sms * 4, 32 * warps>>>(out, 0x3c003c00u); // warm-up
        cudaEventRecord(e0);
        for (int r = 0; r < 10; ++r) products<<<sms * 4, 32 * warps>>>(out, 0x3c003c00u);
        cudaEventRecord(e1);
        cudaEventSynchronize(e1);
        cudaEventElapsedTime(&ms, e0, e1);
        double flop = 10.0 * sms * 4 * warps * (double)ITERS * CHAINS * 2 * 16 * 8 * 16;
        printf("mma.sync m16n8k16 f16 -> f32: %d multiprocessors x 4 blocks x %d warps, %d chains each: %.1f TFLOP/s\n",
               sms, warps, CHAINS, flop / (ms * 1e-3) / 1e12);
    }
    cudaFree(out);
    return 0;
}
