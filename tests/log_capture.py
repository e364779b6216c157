"""ds_acco's log lines while a block of a test worker runs."""

from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def ds_acco_lines(level: int = logging.WARNING) -> Iterator[list[str]]:
    """Yield a list that fills with the messages ds_acco logs at ``level`` or above until the block ends;
    a worker may clear it (``del lines[:]``) between the phases it checks."""
    lines: list[str] = []
    handler = logging.Handler(level)
    handler.emit = lambda record: lines.append(record.getMessage())
    logger = logging.getLogger("ds_acco")
    logger.addHandler(handler)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)
