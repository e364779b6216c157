"""What tests/test_torchft_peer.py runs on pooled ranks and reads back: examples.train_lm_torchft's own ``main``.

The pooled ranks already hold a gloo process group, which the script takes as a launched rank's (for its
validation sums); each job starts its own lighthouse, stores and torchft Managers and shuts them down.
"""

from __future__ import annotations

import json
import os

from benchmarks.sweep import configs as cfgs


def write_config(path, name: str, *, sync_every: int, micro_batch: int = 2, grad_accum: int = 2, **zero1) -> str:
    """The sweep's config of torchft config ``name`` (zero1's optimizer and schedule; ``zero1`` goes to
    make_config), written to ``path``."""
    base = cfgs.make_config("zero1", micro_batch=micro_batch, grad_accum=grad_accum, **zero1)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(cfgs.make_torchft_config(name, base, sync_every=sync_every), f)
    return str(path)


def torchft_on_rank(rank, world, *, argv):
    """``examples.train_lm_torchft.main(argv)`` on a pooled rank; its exit code and what it printed."""
    import contextlib
    import io

    from examples import train_lm_torchft

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = train_lm_torchft.main(argv)
    return {"code": code, "stdout": out.getvalue()}


def fragment_splits(rank, world) -> dict:
    """``{(size, P): (ours, ds_acco's)}``: each fragment's parameters by position in ``model.parameters()``."""
    from ds_acco.layout.fragments import default_fragments
    from examples.models import build_gpt
    from examples.train_lm_torchft import gpt_fragments

    out = {}
    for size in ("tiny", "small"):
        model = build_gpt(size, seq_len=32)
        where = {id(p): i for i, p in enumerate(model.parameters())}
        for p in (1, 2, 4):
            out[size, p] = ([[where[id(x)] for x in f.parameters()] for f in gpt_fragments(model, p)],
                            [[where[id(x)] for x in f] for f in default_fragments(model, p)])
    return out


def read_run(folder, world: int) -> dict:
    """Every rank's ``torchft_rank<r>.json``, ``settings.json`` and rank 0's JSONL log of a run in ``folder``."""
    def load(name):
        with open(os.path.join(folder, name), encoding="utf-8") as f:
            return json.load(f)

    with open(os.path.join(folder, "train.jsonl"), encoding="utf-8") as f:
        log = [json.loads(line) for line in f if line.strip()]
    return {"ranks": [load(f"torchft_rank{r}.json") for r in range(world)], "settings": load("settings.json"),
            "steps": [x for x in log if "event" not in x], "summary": [x for x in log if x.get("event") == "summary"]}


def increments(values: list) -> list[tuple[int, int]]:
    """``(index + 1, increase)`` wherever a running counter grows: 1-based step and by how much."""
    out, prev = [], 0
    for i, v in enumerate(values):
        if v > prev:
            out.append((i + 1, v - prev))
        prev = v
    return out
