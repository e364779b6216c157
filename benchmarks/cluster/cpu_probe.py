"""A fixed CPU workload timed before each run, so that a table mixing runs from machines (or days) of different
speed can say so.

The long-run tables gather rows measured in different sessions, and the machines they ran on are not alike: sync
low-bit at half the batch, on real compute at 100 Mbit/s, committed in 0.92-1.0 s a step in one session's auto runs
and 1.05-1.16 s in an earlier session's, the code on that path unchanged. A ratio between two rows is only as good
as the machines were alike, and neither the platform string nor the core count tells them apart; a timed workload
does. It is the training's kind of work (single-thread float32 matrix products, as each rank is pinned to a core)
and short (about a quarter of a second), the median of a few repeats so that a stray wake-up does not decide.
"""

from __future__ import annotations

import statistics
import time

REPEATS = 5
SIZE, PRODUCTS = 256, 100


def probe_ms() -> float:
    """Median milliseconds of :data:`PRODUCTS` ``SIZE x SIZE`` float32 products on one thread (lower: faster)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        gen = torch.Generator().manual_seed(0)
        a, b = torch.rand(SIZE, SIZE, generator=gen), torch.rand(SIZE, SIZE, generator=gen)
        times = []
        for _ in range(REPEATS):
            start = time.perf_counter()
            for _ in range(PRODUCTS):
                a = torch.mm(a, b)
                a = a / a.norm()  # keep it finite
            times.append(time.perf_counter() - start)
        return round(statistics.median(times) * 1e3, 2)
    finally:
        torch.set_num_threads(threads)
