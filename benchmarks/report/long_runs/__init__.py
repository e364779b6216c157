"""The long-run protocol's report: :mod:`.summary` (the figures), :mod:`.targets` (the issue's targets),
:mod:`.penalty_model` (auto's delay-penalty model against the measured penalty), :mod:`.ceiling` (the most an
overlap could save, and what keeps ACCO from it), :mod:`.plot`
(``delay_penalty.png``), :mod:`.cli` (``python -m benchmarks.report.long_runs``). The names the pages and tests
use are re-exported here.
"""

from .cli import main, print_report, to_json
from .plot import NAME as PLOT
from .summary import (ACCO, AUTO, BASELINE, CHECKPOINTS, FRACTIONS, HOSTS_SUFFIX, MACHINE_SPREAD, ORDER, REFERENCE,
                      SHORT, SHOWN, SYNC_LOWBIT, TOLERANCE, best, collect, folder_samples, seconds, shaped, summarize,
                      two_host_beds, workers)
from .targets import by_seed, targets

__all__ = ["ACCO", "AUTO", "BASELINE", "CHECKPOINTS", "FRACTIONS", "HOSTS_SUFFIX", "MACHINE_SPREAD", "ORDER", "PLOT",
           "REFERENCE", "SHORT", "SHOWN", "SYNC_LOWBIT", "TOLERANCE", "best", "by_seed", "collect", "folder_samples",
           "main", "print_report", "seconds", "shaped", "summarize", "targets", "to_json", "two_host_beds", "workers"]
