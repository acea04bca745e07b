"""CPU time to decode one long SSE event read 64 KiB at a time (issue 21: the figure the test used to
assert as a ratio; tests/core/test_core_robustness.py now counts the bytes searched instead).

Run: python benchmarks/sse_long_event.py [--sizes-mib 1,4,16] [--repeats 3]

For each size: best-of-``--repeats`` CPU seconds (``time.process_time``) and MB/s for one ``data:`` event
of that many bytes, plus the ratio to the smallest size (linear: the size ratio; quadratic: its square).
Prints the load average beside the figures.
"""

from __future__ import annotations

import argparse
import os
import time

from servelens.core.sse import SSEDecoder

READ = 65536


def decode_cpu_s(size: int) -> float:
    """CPU seconds to decode one ``size``-byte event in 64 KiB reads (checked whole)."""
    data = b"data: " + b"x" * size + b"\r\n\r\ndata: [DONE]\n\n"
    dec = SSEDecoder()
    blocks = []
    t0 = time.process_time()
    for i in range(0, len(data), READ):
        blocks.extend(dec.decode(data[i : i + READ]))
    cpu = time.process_time() - t0
    blocks.extend(dec.flush())
    assert len(blocks) == 2 and blocks[0].data is not None and len(blocks[0].data) == size
    return cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes-mib", default="1,4,16")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    sizes = [int(s) * 1024 * 1024 for s in args.sizes_mib.split(",")]
    best = {s: min(decode_cpu_s(s) for _ in range(args.repeats)) for s in sizes}
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    base = sizes[0]
    for s in sizes:
        ratio = best[s] / max(best[base], 1e-6)
        print(f"{s // (1024 * 1024):>4} MiB  {best[s] * 1e3:8.1f} ms CPU  {s / max(best[s], 1e-9) / 1e6:8.0f} MB/s  "
              f"x{ratio:5.1f} the {base // (1024 * 1024)} MiB time (size x{s / base:.0f})")


if __name__ == "__main__":
    main()
