"""Link rates, delays and per-host option values as the emulated cluster's command line spells them.

Rates use ``tc``'s units ("bit" suffixes are bits/s, "bps" suffixes are *bytes*/s),
so a value means the same here as in a ``tc qdisc`` command a user might copy.
"""

from __future__ import annotations

import re
from typing import Optional, Sequence


class ClusterError(RuntimeError):
    """The emulated cluster could not be built; the message says what is missing."""


_RATE_UNITS = {  # tc's units: "bit" suffixes are bits/s, "bps" suffixes are BYTES/s
    "bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12,
    "bps": 8, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9,
}
_TIME_UNITS = {"s": 1.0, "sec": 1.0, "ms": 1e-3, "msec": 1e-3, "us": 1e-6, "usec": 1e-6}


def parse_rate(text: Optional[str]) -> Optional[float]:
    """``"100mbit"`` -> 1e8 bits/s; ``None``, ``""``, ``"unshaped"``, ``"none"`` -> None (no shaping).

    Raises:
        ValueError: not a positive number with one of tc's units (bit, kbit, mbit, gbit, bps, kbps, ...).
    """
    if text is None or str(text).strip().lower() in ("", "none", "unshaped", "off"):
        return None
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]+)\s*", str(text))
    unit = m.group(2).lower() if m else None
    if not m or unit not in _RATE_UNITS or float(m.group(1)) <= 0:
        raise ValueError(f"rate: got {text!r}; allowed: a positive number with a unit "
                         f"({', '.join(_RATE_UNITS)}), e.g. 100mbit, or 'unshaped'")
    return float(m.group(1)) * _RATE_UNITS[unit]


def parse_delay(text: Optional[str]) -> Optional[float]:
    """``"1ms"`` -> 0.001 s; None/empty/"0" -> None."""
    if text is None or str(text).strip() in ("", "0"):
        return None
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-z]+)\s*", str(text))
    if not m or m.group(2) not in _TIME_UNITS:
        raise ValueError(f"delay: got {text!r}; allowed: a number with a unit ({', '.join(_TIME_UNITS)}), e.g. 1ms")
    value = float(m.group(1)) * _TIME_UNITS[m.group(2)]
    return value if value > 0 else None


def format_rate(bits_per_s: Optional[float]) -> str:
    if bits_per_s is None:
        return "unshaped"
    for unit, scale in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3)):
        if bits_per_s >= scale:
            return f"{bits_per_s / scale:g}{unit}"
    return f"{bits_per_s:g}bit"


def parse_host_map(items: Sequence[str], hosts: int, what: str, cast=float) -> dict[int, object]:
    """``["host1=50"]`` or ``["1=50", "h0=25"]`` or ``["host0=1,host1=0"]`` -> ``{1: 50.0, ...}``."""
    out: dict[int, object] = {}
    for item in items:
        for part in filter(None, str(item).split(",") if cast is not str else [item]):
            m = re.fullmatch(r"\s*(?:host|h)?(\d+)\s*=\s*(.+?)\s*", part)
            if not m:
                raise ValueError(f"{what}: got {part!r}; allowed: host<i>=VALUE, e.g. host1=50")
            index = int(m.group(1))
            if not 0 <= index < hosts:
                raise ValueError(f"{what}: host{index} does not exist; hosts are host0..host{hosts - 1}")
            try:
                out[index] = cast(m.group(2))
            except ValueError:
                raise ValueError(f"{what}: got {part!r}; the value is not valid") from None
    return out


def parse_cpu_list(text: str) -> tuple[int, ...]:
    """``"0"``, ``"0-1"``, ``"0:2"`` (colon-separated, since commas separate hosts) -> CPU ids."""
    cpus: list[int] = []
    for part in text.replace(":", " ").split():
        if "-" in part:
            lo, hi = part.split("-", 1)
            cpus.extend(range(int(lo), int(hi) + 1))
        else:
            cpus.append(int(part))
    if not cpus:
        raise ValueError(f"cpus: got {text!r}; allowed: CPU ids such as 0, 0-1 or 0:2")
    return tuple(cpus)
