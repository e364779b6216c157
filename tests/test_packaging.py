"""``pip install .`` ships the library alone: no benchmarks, no examples, every subpackage of ds_acco.

The wheel pip would install is built from a copy of the tracked files (so the checkout gets no
``build/`` or ``*.egg-info``) and its file list compared with the package folder.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_the_wheel_holds_ds_acco_and_nothing_else(tmp_path):
    out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    tracked = [rel for rel in out.decode().split("\0") if rel]
    src = tmp_path / "src"
    for rel in tracked:
        if (REPO / rel).is_file():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            (src / rel).write_bytes((REPO / rel).read_bytes())
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "--no-build-isolation", "-q",
                           "-w", str(tmp_path / "dist")], cwd=src, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("ds_acco-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    tops = {n.split("/")[0] for n in names}
    assert tops == {"ds_acco", f"{wheel.name.split('-')[0]}-{wheel.name.split('-')[1]}.dist-info"}, tops
    library = {rel for rel in tracked if rel.startswith("ds_acco/") and rel.endswith(".py")}
    assert library == {n for n in names if n.endswith(".py")}
    assert not any(n.startswith(("benchmarks/", "examples/", "tests/")) for n in names)
