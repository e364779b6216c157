"""docs/projection.md, written whole from :func:`.fit.fit_all` and :mod:`.grid` (``python -m benchmarks.projection``).

Why a generated page: the projection is only as good as its constants and its check, and both move when a bed is
re-run; ``tests/test_projection.py`` regenerates the page from the raw files and fails on any difference, as
``tests/test_docs.py`` does for BENCHMARKS.md's tables.
"""

from __future__ import annotations

import json

from . import grid
from . import model as m

PAGE = "docs/projection.md"
FIT_JSON = "bench_results/projection/fit.json"
SHORT = {"sync_fp32": "sync fp32", "sync_lowbit": "sync low-bit", "acco_fixed": "acco fixed",
         "acco_adaptive": "acco adaptive", "streaming": "streaming", "torchft_diloco": "torchft DiLoCo",
         "torchft_streaming": "torchft Streaming DiLoCo"}


def md_table(head: list[str], rows: list[list[str]]) -> str:
    return "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(r) + " |" for r in rows])


def dump(fitted: dict) -> str:
    """The JSON under bench_results/projection: the constants, the check and the files they came from."""
    return json.dumps(fitted, indent=1, sort_keys=True) + "\n"


def _pct(x: float) -> str:
    return f"{x:+.0%}"


def _winner(c: grid.Cell, methods=m.METHODS) -> str:
    return SHORT[c.winner(methods)]


def _fastest(c: grid.Cell) -> str:
    """By time per micro-batch alone: no convergence penalty."""
    return SHORT[min((x for x in m.METHODS if c.fits[x]), key=lambda x: c.steps[x].per_micro_batch)]


def summary(cells: list[grid.Cell], hier: list[grid.Cell], name=_winner) -> str:
    """Who wins each model and link, by GPUs (flat, and with hierarchical collectives in brackets where it differs)."""
    rows = []
    for model in grid.MODELS:
        for gbit in grid.LINKS_GBIT:
            row = [model, f"{gbit} Gbit/s"]
            for n in grid.GPUS:
                flat = next(c for c in cells if (c.model, c.gbit, c.gpus) == (model, gbit, n))
                h = next(c for c in hier if (c.model, c.gbit, c.gpus) == (model, gbit, n))
                w, wh = name(flat), name(h)
                row.append(w if w == wh else f"{w} ({wh})")
            rows.append(row)
    return md_table(["model", "node link", *(f"{n} GPUs" for n in grid.GPUS)], rows)


def losses(cells: list[grid.Cell]) -> list[str]:
    """Where ds_acco loses, computed: the cells where a peer wins, and the modes slower than sync fp32."""
    peer = [c for c in cells if c.winner() not in grid.DS_ACCO]
    best = lambda c: min((x for x in grid.DS_ACCO if c.fits[x]), key=c.time_to_loss)  # noqa: E731
    gap = [c.time_to_loss(best(c)) / c.time_to_loss(c.winner()) - 1 for c in peer]
    lowbit = [c.ratio("sync_lowbit", False) for c in cells]
    fixed = [c for c in cells if c.ratio("acco_fixed", True) > 1]
    out = [f"A peer wins {len(peer)} of {len(cells)} cells (" + ", ".join(sorted({SHORT[c.winner()] for c in peer}))
           + (f"); ds_acco's best is {min(gap):.0%} to {max(gap):.0%} slower to the loss there." if peer else ").")]
    out.append(f"sync low-bit is {min(lowbit):.2f}x to {max(lowbit):.2f}x sync fp32's time per micro-batch: its "
               "int8 reduce-scatter is a flat all-to-all, whose bytes on a node's link are 8 (N-8)/N of the buffer "
               "(8 bytes per element at 8 GPUs per node) against a ring's 4 for fp32; the low-bit saving is lost.")
    out.append(f"acco fixed is slower to the loss than sync fp32 in {len(fixed)} of {len(cells)} cells: both of its "
               "rounds carry the all-to-all, and a round that outlasts half a step's compute is not hidden.")
    no_fit = sorted({c.model for c in cells if not c.fits["streaming"]})
    if no_fit:
        out.append(f"ds_acco streaming does not fit an 80 GB GPU at {', '.join(no_fit)} (20 P bytes of state per "
                   "GPU, activations aside); torchft shards its replica over the node and does.")
    return out


def adaptive_note(cells: list[grid.Cell]) -> str:
    """Acco adaptive's batch here against the batch its tokens were measured at, and what the table charges it."""
    batch = [c.adaptive_batch() for c in cells]
    charged = sum(b >= 1.0 for b in batch)
    wins = [c for c in cells if c.winner() == "acco_adaptive"]
    won = (f"it wins {len(wins)} cells, {sum(c.adaptive_batch() >= 1.0 for c in wins)} of them at that lower bound"
           if wins else "it wins no cell even so")
    return (f"* acco adaptive's commits here carry {min(batch):.1f}-{max(batch):.1f}x sync's batch (last but one "
            f"column of the table): its rounds are long against a step's compute. Its tokens were measured at smaller "
            f"commits, so in the {charged} cells where its batch is sync's or larger it is charged acco fixed's "
            f"penalty, a lower bound (a larger batch never needs fewer tokens; how many more depends on the noise "
            f"scale at that size, not measured here): {won}.")


def full_table(cells: list[grid.Cell]) -> str:
    head = ["model", "GPUs", "link", "sync fp32 s/step", *(SHORT[x] for x in m.METHODS[1:]), "adaptive batch / sync's",
            "wins"]
    rows = []
    for c in cells:
        cols = [f"{c.ratio(x, False):.2f} / {c.ratio(x, True):.2f}" + ("" if c.fits[x] else " (no fit)")
                for x in m.METHODS[1:]]
        ad = c.steps["acco_adaptive"].micro_batches / c.steps["sync_fp32"].micro_batches
        rows.append([c.model, str(c.gpus), f"{c.gbit} Gbit/s", f"{c.steps['sync_fp32'].seconds:.2f}", *cols,
                     f"{ad:.1f}x", _winner(c)])
    return md_table(head, rows)


def constants(fitted: dict) -> str:
    c, g = fitted["cpu"], fitted["gpu"]
    rows = [["link efficiency", f"{c['efficiency']:.3f}", "-", "least squares over the beds' rounds"],
            ["latency per algorithm step a", f"{c['hop_s'] * 1e3:.2f} ms", f"{grid.HOP_S * 1e6:.0f} us (assumed)",
             "median count all-gather of sync rounds"],
            ["round host cost h", f"{c['round_host_s'] * 1e3:.1f} ms", f"{g['round_host_s'] * 1e3:.1f} ms",
             "intercept (CPU); the round's stages but its element passes and the wait for the gradients (GPU)"],
            ["round cost per element e", f"{c['round_s_per_elem'] * 1e9:.2f} ns", f"{g['round_s_per_elem'] * 1e12:.0f} ps",
             "slope over elements (CPU); quantise, shard step, all-gather stages over P (GPU)"],
            ["inner optimizer per element", f"{c['inner_s_per_elem'] * 1e9:.2f} ns",
             f"{g['inner_s_per_elem'] * 1e12:.0f} ps", "shard step stage over its elements"],
            ["slowdown k", "per bed (acco fixed's)", f"{g['slowdown']:.3f} ({g['slowdown_range'][0]:.3f}-"
             f"{g['slowdown_range'][1]:.3f})", "compute per micro-batch with a round in flight over without (GPU: "
             "counted whole, the device pacing the step)"]]
    return md_table(["constant", "CPU beds", "GPU (the table)", "how"], rows)


def residuals(fitted: dict) -> str:
    groups: dict = {}
    for r in fitted["residuals"]:
        groups.setdefault((r["bed"], r["rate"], r["kind"]), []).append(r)
    rows = []
    for (bed, rate, kind), rs in sorted(groups.items()):
        meas = sorted(r["round_s"] for r in rs)[len(rs) // 2]
        pred = rs[0]["predicted_s"] if len({r["predicted_s"] for r in rs}) == 1 else sorted(r["predicted_s"] for r in rs)[len(rs) // 2]
        b = rs[0]["bytes_measured"] / rs[0]["model_bytes"] - 1
        rows.append([f"{bed}, {rate}", kind, f"{meas:.3f} s", f"{pred:.3f} s", _pct(pred / meas - 1), _pct(b)])
    return md_table(["bed", "round", "measured (median of runs)", "fitted model", "error", "bytes: measured over the "
                     "model's"], rows)


def check_table(rows: list[dict]) -> str:
    out = []
    for r in rows:
        mb = "-" if r.get("predicted_mb") is None else f"{r['predicted_mb']:.1f} / {r['measured_mb']:.1f}"
        out.append([f"{r['bed']}, {r['rate']}, {r['hosts']} hosts", SHORT[r["method"]], str(r["runs"]),
                    f"{r['predicted_s']:.3f}", f"{r['measured_s']:.3f}", _pct(r["error"]), mb])
    return md_table(["bed", "method", "runs", "predicted s/step", "measured s/step", "error",
                     "adaptive micro-batches per commit, predicted / measured"], out)


def render(fitted: dict) -> str:
    cells, hier = grid.table(fitted), grid.table(fitted, m.HIERARCHICAL)
    lobo = fitted["leave_one_bed_out"]
    errs = [abs(r["error"]) for r in lobo]
    long_runs = (check_table(fitted["long_runs"]) if fitted["long_runs"] else
                 "**Not run yet**: `bench_results/long_runs/workers_*` does not exist (`python -m benchmarks.protocol` "
                 "has not run). When it does, `python -m benchmarks.projection` predicts each of its runs with the "
                 "constants above and this section shows predicted against measured; until then the model is checked "
                 "only at 2 workers, on beds it was not fitted on (the check above).")
    parts = [
        "# Projection past this machine: 64 to 512 GPUs",
        "Generated by `python -m benchmarks.projection` from `bench_results/` (the five beds of "
        "`bench_results/sets.json`, the long runs' convergence penalties in `bench_results/long_runs/` and the GPU "
        "sessions in `bench_results/gpu_overlap/`); the constants, the check and the files read are in "
        "`bench_results/projection/fit.json`. `tests/test_projection.py` regenerates this page "
        "and fails on any difference. The equations are `benchmarks/projection/model.py`'s docstring.",
        "**Read it as a model, not a measurement**: every number below the check is a prediction from constants "
        "fitted on 2 emulated hosts on one 2-core machine and on single-GPU sessions, with an assumed compute, an "
        "assumed fabric latency and convergence penalties measured at 2 workers on a 3.3 M-parameter model.",
        "## Where each method wins",
        "Fastest to the loss per model, node link and GPU count (a method whose state does not fit 80 GB cannot "
        "win); in brackets the winner if ds_acco's collectives were hierarchical (reduced inside the node first: "
        "a what-if, not what the code does today).",
        summary(cells, hier),
        "The same by time per micro-batch alone (every convergence penalty 1): what the link and the rounds decide, "
        "without the 2-worker penalties:",
        summary(cells, hier, _fastest),
        "## Where ds_acco loses",
        "\n".join(f"* {line}" for line in losses(cells)),
        adaptive_note(cells),
        "## Assumptions",
        "\n".join(f"* {line}" for line in grid.ASSUMPTIONS(fitted)),
        "## Constants",
        constants(fitted),
        "Each round's fit, per bed (the CPU constants predict the four equal-host beds' rounds; at 100 Mbit/s the "
        "fp32 rounds run slower than the fit, the network stack sharing the host's core):",
        residuals(fitted),
        "## The check",
        f"Each equal-host bed predicted from link and round constants fitted on the other three (its own compute per "
        f"micro-batch and slowdown k are inputs, as the assumed compute is in the table); the slow-host bed from all "
        f"four. Median absolute error {sorted(errs)[len(errs) // 2]:.0%}, largest {max(errs):.0%}.",
        check_table(lobo),
        "Fitted on the 100 Mbit/s bed alone, predicting the 25 Mbit/s bed:",
        check_table(fitted["fit_100_predict_25"]),
        "### 2, 4 and 8 workers (the long runs)",
        long_runs,
        "## The table",
        f"Per cell: time per micro-batch / time to the loss, both over sync fp32's (sync fp32's seconds per step of "
        f"{grid.GRAD_ACCUM} micro-batches per GPU in the fourth column); `no fit`: the state exceeds 80 GB per GPU.",
        full_table(cells),
        "## Reproduce",
        "```bash\npython -m benchmarks.projection           # fit, check, table; rewrites this page and the JSON\n"
        "python -m benchmarks.projection --check   # exit 1 if either differs\n```",
    ]
    return "\n\n".join(parts) + "\n"
