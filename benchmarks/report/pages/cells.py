"""How the pages' tables name beds and configs and write seconds and ratios (shared by :mod:`.tables` and
:mod:`.projection`, which import this and never each other)."""

from __future__ import annotations

from typing import Optional

BEDS = {("real", "100mbit"): "real compute, 100 Mbit/s", ("real-mtu9000", "100mbit"): "real compute, 100 Mbit/s, MTU 9000",
        ("real-host1@50%", "100mbit"): "real compute, one host at half speed, 100 Mbit/s",
        ("real", "25mbit"): "real compute, 25 Mbit/s", ("sleep", "100mbit"): "compute off the CPU (sleep bed), 100 Mbit/s",
        ("real", "unshaped"): "real compute, unshaped link"}
SET_OF = {("real", "unshaped"): "fast_link"}
"""The set a bed's table reads where it is not ``five_beds``."""
LABELS = {"sync": "sync fp32 (the fair baseline)", "sync_lowbit": "sync low-bit", "sync_lowbit_half":
          "sync low-bit, half the batch", "acco_lowbit_int4_fixed": "acco fixed", "acco_lowbit_int4_adaptive":
          "acco adaptive", "auto_lowbit_int4": "auto (`auto_lowbit.json`)", "auto_lowbit_int4_streaming":
          "auto with `auto.streaming`", "streaming_int8": "streaming by hand", "zero1": "stock ZeRO-1",
          "torchft_diloco": "torchft DiLoCo", "torchft_streaming_diloco": "torchft Streaming DiLoCo",
          "torchft_diloco_half": "torchft DiLoCo, half the batch"}
HAND = ("sync", "sync_lowbit", "acco_lowbit_int4_fixed", "acco_lowbit_int4_adaptive", "streaming_int8")
"""The modes a user picks by hand at the bench's batch (what auto is compared with)."""


def bed_name(key) -> str:
    return BEDS.get(tuple(key), f"{key[0]}, {key[1]}")


def label(config: str) -> str:
    return LABELS.get(config, config)


def s(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.1f} s"


def x(v: Optional[float], bold: bool = False) -> str:
    if v is None:
        return "-"
    return f"**{v:.2f}x**" if bold else f"{v:.2f}x"


def span(values: list[float], fmt: str = ".3f") -> str:
    """The range of ``values`` ("1.007-1.016"), one number where both ends print alike."""
    lo, hi = min(values), max(values)
    return format(lo, fmt) if format(lo, fmt) == format(hi, fmt) else f"{lo:{fmt}}-{hi:{fmt}}"


def ratio_of(a: Optional[dict], b: Optional[dict]) -> Optional[float]:
    return a["median_s"] / b["median_s"] if a and b and a["median_s"] and b["median_s"] else None


def md_table(head: list[str], rows: list[list[str]]) -> str:
    return "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(r) + " |" for r in rows])
