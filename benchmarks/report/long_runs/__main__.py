"""``python -m benchmarks.report.long_runs``: :func:`benchmarks.report.long_runs.cli.main`."""

from .cli import main

raise SystemExit(main())
