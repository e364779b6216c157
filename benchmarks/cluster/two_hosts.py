"""A benchmark's worker on two emulated hosts, one core each, and the README its table goes in: what the collective
benchmarks (``benchmarks.pieces_in_flight``, ``benchmarks.pacing_latency``) share."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Optional, Sequence

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAUNCHER = os.path.join(REPO, "launchers", "local_cluster.py")


def run_worker(module: str, out_json: str, link: Sequence[str], worker_args: Sequence[str]) -> Optional[dict]:
    """``python -m module --worker out_json worker_args...`` on two hosts pinned to a core each, linked as ``link``
    says (``local_cluster.py`` options: ``--rate``, ``--delay``); returns what rank 0 wrote, or None where the run
    failed (it says so). The cluster's own record goes beside it, ``<name>.cluster.json``."""
    cmd = [sys.executable, LAUNCHER, "--hosts", "2", *link, "--quiet", "--timeout", "900",
           "--stats-json", out_json[:-len(".json")] + ".cluster.json", "--cpus", "host0=0", "--cpus", "host1=1", "--",
           sys.executable, "-m", module, "--worker", out_json, *worker_args]
    proc = subprocess.run(cmd, check=False, cwd=REPO)
    if proc.returncode != 0:
        print(f"{module}: the run with {' '.join(link)} failed (exit {proc.returncode})", file=sys.stderr)
        return None
    with open(out_json, encoding="utf-8") as f:
        return json.load(f)


def write_readme(out_dir: str, title: str, module: str, argv: Optional[Sequence[str]], text: str) -> None:
    """``README.md``: the title, the command that wrote it and its table."""
    with open(os.path.join(out_dir, "README.md"), "w", encoding="utf-8") as f:
        f.write(f"# {title}\n\n`python -m {module} "
                + " ".join(argv if argv is not None else sys.argv[1:]) + "` (as root)\n\n" + text)
