"""bench_vk_sdpa.py - PyTorch's scaled_dot_product_attention on bench_vk's decode shapes.

32 query heads / 8 kv heads (enable_gqa), head dim 128, one query token, f16 K/V,
batch 1 and 8, 4k / 32k / 128k cells. CUDA-event times around 50 back-to-back calls,
median of 5 runs, after at least 1 s of the same calls (an H200 lowers its SM clock after
about 2 s idle and needs 0.2-0.5 s of load to raise it again; 5 warm-up calls left the
first row up to 1.6x slow); GB/s counts the f16 K+V bytes, as bench_vk does.

Then prefill: 512 queries over 4k cells, causal (the queries are the last 512 positions:
lower-right causal alignment), f16, on SDPA's flash kernel, as bench_vk's prefill row.

The sizes take bench_vk's options of the same names: `--cells LIST` and `--batch LIST` (the
decode rows), `--prefill-queries LIST`, `--prefill-heads LIST` (query heads over 8 kv heads)
and `--prefill-cells LIST`; `--prefill-only` skips the decode rows, `--no-prefill` the
prefill rows.

Two columns: the 50 calls launched from Python ("eager": small shapes then wait for the
host's launches), and the same 50 calls captured once in a CUDA graph and replayed
("graph": the GPU's own time, as bench_vk's timestamps around one command buffer are).
"""
import statistics
import sys
import time

import torch
import torch.nn.functional as F


def timed(run, reps):
    """median microseconds per call of run() (which makes `reps` calls), after 1 s of it"""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 1.0:
        run()
        torch.cuda.synchronize()
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1000.0 / reps)
    return statistics.median(times)


def graph_of(call, reps):
    """`reps` calls captured in a CUDA graph, or None where capture fails"""
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                call()
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(reps):
                call()
        return g
    except RuntimeError as e:
        print(f"bench_vk_sdpa: no CUDA graph ({e})")
        return None


def main():
    args = sys.argv[1:]
    lists = {"--cells": [4096, 32768, 131072], "--batch": [1, 8], "--prefill-queries": [512],
             "--prefill-heads": [32], "--prefill-cells": [4096]}
    at = 0
    while at < len(args):
        a = args[at]
        if a in lists and at + 1 < len(args):
            try:
                lists[a] = [int(x) for x in args[at + 1].split(",")]
            except ValueError:
                sys.exit(f"bench_vk_sdpa: {a}: a comma-separated list of integers")
            at += 2
        elif a in ("--prefill-only", "--no-prefill"):
            at += 1
        else:
            sys.exit("usage: bench_vk_sdpa.py [--cells LIST] [--batch LIST] [--prefill-queries LIST]\n"
                     "       [--prefill-heads LIST] [--prefill-cells LIST] [--prefill-only] [--no-prefill]")
    cells, batches = lists["--cells"], lists["--batch"]
    if any(h < 8 or h % 8 for h in lists["--prefill-heads"]):
        sys.exit("bench_vk_sdpa: --prefill-heads: multiples of 8 (the kv heads)")
    if not torch.cuda.is_available():
        print("bench_vk_sdpa: skipped (no CUDA device)")
        return
    reps = 50
    print(f"bench_vk_sdpa: torch {torch.__version__}, {torch.cuda.get_device_name()}, {reps} calls per timing, medians of 5")
    torch.manual_seed(0)
    if "--prefill-only" in args:
        batches = []
    else:
        print("\n| SDPA f16 | batch | cells | eager (us) | graph (us) | K+V read | GB/s (graph) |")
        print("|---|---|---|---|---|---|---|")
    for b in batches:
        for n in cells:
            q = torch.randn(b, 32, 1, 128, dtype=torch.float16, device="cuda")
            k = torch.randn(b, 8, n, 128, dtype=torch.float16, device="cuda")
            v = torch.randn(b, 8, n, 128, dtype=torch.float16, device="cuda")

            def call():
                return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)

            def eager():
                for _ in range(reps):
                    call()

            us = timed(eager, reps)
            g = graph_of(call, reps)
            gus = timed(g.replay, reps) if g is not None else float("nan")
            nbytes = b * n * 8 * 128 * 2 * 2
            print(f"| sdpa | {b} | {n} | {us:.1f} | {gus:.1f} | {nbytes / 1e6:.1f} MB | {nbytes / (gus * 1e-6) / 1e9:.0f} |")
            sys.stdout.flush()
            del q, k, v, g
            torch.cuda.empty_cache()

    if "--no-prefill" in args:
        return
    print("\n| SDPA f16 prefill | queries | q / kv heads | cells | eager (us) | graph (us) | graph TFLOP/s |")
    print("|---|---|---|---|---|---|---|")
    for nq in lists["--prefill-queries"]:
        for nh in lists["--prefill-heads"]:
            for n in lists["--prefill-cells"]:
                if n >= nq:
                    prefill(reps, nq, nh, n)


def prefill(reps, nq, nh, n):
    """nq causal queries of nh heads over n cells (the last nq positions), flash backend"""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right
    q = torch.randn(1, nh, nq, 128, dtype=torch.float16, device="cuda")
    k = torch.randn(1, 8, n, 128, dtype=torch.float16, device="cuda")
    v = torch.randn(1, 8, n, 128, dtype=torch.float16, device="cuda")
    # flash takes GQA as heads repeated (causal_lower_right does not pass enable_gqa on in
    # every torch version): the same arithmetic, K and V read from L2 either way
    kx, vx = k.repeat_interleave(nh // 8, dim=1), v.repeat_interleave(nh // 8, dim=1)
    mask = causal_lower_right(nq, n)

    def call():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q, kx, vx, attn_mask=mask)

    def eager():
        for _ in range(reps):
            call()

    # query i sees n - nq + 1 + i cells: 4 * 128 FLOPs a (query head, cell), QK and PV
    flops = 4 * 128 * nh * (nq * (n - nq + 1) + nq * (nq - 1) / 2)
    try:
        us = timed(eager, reps)
    except RuntimeError as e:
        print(f"bench_vk_sdpa: prefill on flash failed ({e})")
        return
    g = graph_of(call, reps)
    gus = timed(g.replay, reps) if g is not None else float("nan")
    print(f"| sdpa flash, causal lower right | {nq} | {nh} / 8 | {n} | {us:.1f} | {gus:.1f} | {flops / gus * 1e-6:.1f} |")
    sys.stdout.flush()
    del q, k, v, kx, vx, g
    torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
