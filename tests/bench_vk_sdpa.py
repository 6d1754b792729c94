"""bench_vk_sdpa.py - PyTorch's scaled_dot_product_attention on bench_vk's decode shapes.

32 query heads / 8 kv heads (enable_gqa), head dim 128, one query token, f16 K/V,
batch 1 and 8, 4k / 32k / 128k cells. CUDA-event times around 50 back-to-back calls,
median of 5 runs, after at least 1 s of the same calls (an H200 lowers its SM clock after
about 2 s idle and needs 0.2-0.5 s of load to raise it again; 5 warm-up calls left the
first row up to 1.6x slow); GB/s counts the f16 K+V bytes, as bench_vk does.
"""
import statistics
import sys
import time

import torch
import torch.nn.functional as F


def main():
    if not torch.cuda.is_available():
        print("bench_vk_sdpa: skipped (no CUDA device)")
        return
    cells = [4096, 32768, 131072]
    batches = [1, 8]
    reps = 50
    print(f"bench_vk_sdpa: torch {torch.__version__}, {torch.cuda.get_device_name()}, {reps} calls per timing, medians of 5")
    print("\n| SDPA f16 | batch | cells | time (us) | K+V read | GB/s |")
    print("|---|---|---|---|---|---|")
    torch.manual_seed(0)
    for b in batches:
        for n in cells:
            q = torch.randn(b, 32, 1, 128, dtype=torch.float16, device="cuda")
            k = torch.randn(b, 8, n, 128, dtype=torch.float16, device="cuda")
            v = torch.randn(b, 8, n, 128, dtype=torch.float16, device="cuda")
            t0 = time.perf_counter()
            while time.perf_counter() - t0 < 1.0:
                for _ in range(reps):
                    F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
                torch.cuda.synchronize()
            times = []
            for _ in range(5):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(reps):
                    F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end) * 1000.0 / reps)
            us = statistics.median(times)
            nbytes = b * n * 8 * 128 * 2 * 2
            print(f"| sdpa | {b} | {n} | {us:.1f} | {nbytes / 1e6:.1f} MB | {nbytes / (us * 1e-6) / 1e9:.0f} |")
            sys.stdout.flush()
            del q, k, v
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
