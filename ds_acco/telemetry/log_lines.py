"""The lines ds_acco logs, and the handler that makes them visible when nobody configured logging.

A user must be able to tell an ACCO run from a stock one without enabling telemetry, under
DeepSpeed's and HF's default logging (neither configures the root logger, so an INFO line on
``ds_acco`` would otherwise be dropped): the start-up line and ``telemetry.log_every`` lines go
through :func:`ensure_log_output`, which adds a handler only when nobody configured logging.
"""

from __future__ import annotations

import logging

logger = logging.getLogger("ds_acco")


def ensure_log_output() -> None:
    """Make ds_acco's INFO lines visible when nobody configured logging, as DeepSpeed's own logger does; an
    application that configured logging (a handler on ``ds_acco`` or on the root logger) keeps full control."""
    if logger.handlers or logging.getLogger().handlers:
        if logger.level == logging.NOTSET and logging.getLogger().level > logging.INFO:
            logger.setLevel(logging.INFO)  # handlers exist, but the lines would be filtered out
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)


def announce(front_end: str, rank: int, fields: dict) -> None:
    """Log ``ds_acco: ACCO on (<front end>): k=v ...`` once, on rank 0."""
    if rank != 0:
        return
    ensure_log_output()
    logger.info("ds_acco: ACCO on (%s): %s", front_end, " ".join(f"{k}={v}" for k, v in fields.items()))
