"""Published sweep folders hold ``results.json.gz`` (benchmarks/results_file.py): the same results, read the same way,
byte for byte reproducible, and a checkout small enough to copy to a lent GPU machine."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
from pathlib import Path

import pytest

from benchmarks import results_file
from benchmarks.__main__ import main

ROOT = Path(__file__).resolve().parents[1]
DEVICE_TREE_MIB = 64
"""What the device tool copies at most (the tracked files); the test keeps a margin under it."""


def test_a_packed_folder_reads_as_it_was_written_and_stays_packed_when_a_sweep_resumes_in_it(tmp_path):
    result = {"runs": [{"id": "a", "ok": True, "loss": 2.5}], "sweep": "full"}
    assert results_file.path_of(str(tmp_path)) is None and not results_file.exists(str(tmp_path))
    plain = results_file.save(str(tmp_path), result, separators=(",", ":"))
    assert plain.endswith("results.json") and results_file.load(str(tmp_path)) == result
    text = Path(plain).read_text()
    assert main(["pack", str(tmp_path)]) == 0
    packed = tmp_path / "results.json.gz"
    assert not Path(plain).exists() and gzip.decompress(packed.read_bytes()).decode() == text
    first = packed.read_bytes()
    results_file.pack(str(tmp_path))  # packed already: nothing changes
    assert packed.read_bytes() == first and results_file.load(str(tmp_path)) == result
    again = tmp_path / "again"
    again.mkdir()
    (again / "results.json").write_text(text)
    assert results_file.pack(str(again)) and (again / "results.json.gz").read_bytes() == first  # no time stamp
    result["runs"].append({"id": "b", "ok": True})  # a resumed sweep writes the folder in the form it found
    assert results_file.save(str(tmp_path), result) == str(packed)
    assert sorted(os.listdir(tmp_path)) == ["again", "results.json.gz"]
    assert results_file.load_file(str(packed)) == result
    with pytest.raises(FileNotFoundError, match="no results.json to pack"):
        results_file.pack(str(tmp_path / "empty"))


def tracked() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the tracked files are unknown")
    return [p for p in out.decode().split("\0") if p]


def test_every_published_folder_is_packed_and_the_checkout_fits_the_device_machine():
    files = tracked()
    plain = [p for p in files if p.startswith("bench_results/") and p.endswith("/" + results_file.PLAIN)]
    assert not plain, f"pack them before committing (python -m benchmarks pack FOLDER...): {plain[:5]}"
    assert any(p.endswith("/" + results_file.PACKED) for p in files)
    mib = sum(os.path.getsize(ROOT / p) for p in files if (ROOT / p).is_file()) / 2**20
    assert mib < DEVICE_TREE_MIB - 8, f"the tracked files take {mib:.1f} MiB"
    one = json.loads(gzip.decompress((ROOT / "bench_results/long_runs/workers_4_seed1/results.json.gz").read_bytes()))
    assert len(one["runs"]) == 3 and all(r["ok"] for r in one["runs"])
