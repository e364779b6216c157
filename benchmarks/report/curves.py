"""What every report reads off result rows: link order, validation curves, interpolation, target rows.

Shared by the analysis, the time-to-loss table and the streaming comparison, which therefore
import this module and never each other's.
"""

from __future__ import annotations

import math
from typing import Optional

UNSHAPED = "unshaped"


def target(name: str, value: Optional[float], threshold: float, op: str, detail: str) -> dict:
    met = None if value is None else (value >= threshold if op == ">=" else value <= threshold)
    return {"target": name, "value": None if value is None else round(value, 4), "threshold": threshold, "op": op,
            "met": met, "detail": detail}


def rates_in_order(runs: list[dict]) -> list[str]:
    """Rates of the bandwidth scenario from fastest (unshaped) to slowest."""
    seen = {}
    for r in runs:
        if r["scenario"] == "bandwidth":
            seen[r["rate"]] = r.get("rate_bit_s") or math.inf
    return sorted(seen, key=lambda k: -seen[k])


def interp(curve: list[tuple[float, float]], x: float) -> Optional[float]:
    pts = sorted(curve)
    if not pts or x < pts[0][0] or x > pts[-1][0]:
        return None
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x0 <= x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return pts[-1][1]


def val_points(r: dict) -> list[tuple[float, float]]:
    pts = [(c["tokens"], c["val_loss"]) for c in r.get("curve", []) if c.get("val_loss") is not None]
    if r.get("val_loss") is not None and r.get("tokens_last_step"):
        pts.append((r["tokens_last_step"], r["val_loss"]))
    return pts
