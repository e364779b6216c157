"""docs/gpu.md's table: the operations a round's optimizer step issues on an accelerator, elementwise against
torch's fused kernel (``python -m benchmarks.round_launches``; its raw file under bench_results/round_launches/)."""

from __future__ import annotations

import json
import os

from . import sets as rs

RAW = os.path.join("bench_results", "round_launches", "round_launches.json")


def round_launches() -> str:
    from benchmarks.round_launches import table

    with open(os.path.join(rs.ROOT, RAW), encoding="utf-8") as f:
        result = json.load(f)
    return (table(result["rows"]) + f"\n\n`{result['command']}` (torch {result['torch']}; raw file: "
            f"[{os.path.basename(RAW)}](../{RAW}))")
