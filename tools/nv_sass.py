#!/usr/bin/env python3
"""tools/nv_sass.py - the machine code (SASS) of a Vulkan pipeline, from NVIDIA's shader cache.

How round 9 of issue 37 read attn_prefill's SASS (docs/performance-log.md, 2026-11-29), as a
tool. NVIDIA's driver (580) keeps the pipelines it compiled in ~/.cache/nvidia/GLCache/*/*/*.bin:
a sequence of zstd frames; a compiled pipeline's frame starts with b"NVDA", and its code is
as many bytes as the pipeline's "Binary Size" statistic (VK_KHR_pipeline_executable_properties;
bench_vk prints it with BENCH_VK_STATS=1), at byte H + 24 of the frame, where H is the frame's
32-bit word 12, and word 8 is H + 208 + that size (so the frame is found by the size alone).
Seen in two pipelines (H 384 and 416); nvdisasm read the first as a raw instruction binary
to its last instruction.

  1. On the GPU machine: empty the cache (rm -rf ~/.cache/nvidia), run the program once, copy
     the .bin it left back here (the GPU machines here have no zstd).
  2. Here: python3 tools/nv_sass.py CACHE.bin SIZE OUT   (zstd must be installed)
     writes OUT.N.bin, the code of each NVDA frame whose words say SIZE bytes of code.
  3. On the GPU machine: nvdisasm -b SM90 OUT.N.bin (SM90: Hopper).

The layout is the driver's and undocumented: a frame whose code does not disassemble cleanly
to its end is the wrong frame or a changed layout. (Round 15 of issue 37: the frames of
attn_split_cm's 8-bit builds had word 8 16 bytes larger, and nvdisasm stopped ("Unrecognized
operation") a few hundred bytes before the end; the code up to that address read cleanly.
Round 16: word 8 was up to 224 bytes larger, and each frame's first SIZE bytes read cleanly.)
"""
import struct
import subprocess
import sys

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def frames(blob):
    """The decompressed zstd frames of blob, in order (each up to the next frame's magic)."""
    starts = []
    at = blob.find(ZSTD_MAGIC)
    while at >= 0:
        starts.append(at)
        at = blob.find(ZSTD_MAGIC, at + 1)
    for i, s in enumerate(starts):
        end = starts[i + 1] if i + 1 < len(starts) else len(blob)
        out = subprocess.run(["zstd", "-d", "-c", "-q"], input=blob[s:end], capture_output=True).stdout
        if out:
            yield out


def main(argv):
    if len(argv) != 4:
        sys.stderr.write("usage: nv_sass.py CACHE.bin SIZE OUT\n")
        return 2
    blob = open(argv[1], "rb").read()
    size = int(argv[2])
    n = 0
    for f in frames(blob):
        if f[:4] != b"NVDA" or len(f) < 64:
            continue
        words = struct.unpack("<16I", f[:64])
        at = words[12] + 24
        # (word 8 is 0-512 bytes more than that, in steps of 16: round 15's 8-bit pipelines 16,
        # round 16's 32, 208 and 224; a frame's code then disassembles cleanly to its NOPs)
        extra = words[8] - at - 184 - size
        if 0 <= extra <= 512 and extra % 16 == 0 and len(f) >= at + size:
            name = "%s.%d.bin" % (argv[3], n)
            open(name, "wb").write(f[at:at + size])
            print("%s: %d bytes at %d of a %d-byte frame" % (name, size, at, len(f)))
            n += 1
    if n == 0:
        sys.stderr.write("nv_sass.py: no NVDA frame of %d bytes of code (is zstd installed?)\n" % size)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
