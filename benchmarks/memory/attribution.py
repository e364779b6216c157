"""Where a worker's peak resident memory comes from (``python -m benchmarks.memory.attribution``).

The memory benchmark's peaks sit above the analytic model (``benchmarks/memory/model.py``),
which counts the model-proportional buffers only. This module splits a run's peak into

* ``libraries``: resident after importing torch, transformers, DeepSpeed and ds_acco;
* ``after set-up``: resident when the engine exists, before the first forward (the
  model, its buffers, optimizer state allocated at start-up);
* the rises of the high-water mark (``VmHWM``) during training, each attributed to
  what was running when it rose: the training thread's phase (``forward``,
  ``backward``, ``step``) and the round's stage on the communication thread
  (``reduce-scatter``, ``shard step``, ``all-gather``; ``-`` when no round runs).

``run`` launches train_lm on two local ranks (``launchers/local_cluster.py
--no-netns``, pinned one core each, as the memory benchmark does) through
``worker``, which installs a sampler thread and wraps the engine's methods; the
sampler reads ``/proc/self/status`` every ``--interval-ms`` and books each rise of
``VmHWM`` to the labels it saw at the end of that interval. The labels are exact
for rises inside one phase; a rise across a boundary is booked to the later phase.

``candidates`` measures, on two spawned gloo ranks, how far each suspect raises the
high-water mark above what is resident (``/proc/self/clear_refs`` resets ``VmHWM``):
the optimizer step on a shard of ``P / N`` elements (DeepSpeed's CPU FusedAdam,
torch AdamW single-tensor and foreach), the round's gloo reduce-scatter and
all-gather of ``P`` fp32 elements, and the same collectives issued from a second
thread (the communication thread: glibc gives it its own malloc arena).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import threading
from typing import Callable, Optional

from .gloo import _status_mb

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# --------------------------------------------------------------------------- in the worker


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                              "fsmblks", "uordblks", "fordblks", "keepcost")]


def malloc_mb() -> dict[str, float]:
    """glibc's heap, all arenas: bytes in use (``uordblks``), free but kept (``fordblks``), and
    in separately mmapped blocks (``hblkhd``, returned to the OS on free). Empty where glibc lacks it."""
    try:
        fn = ctypes.CDLL("libc.so.6").mallinfo2
    except (OSError, AttributeError):
        return {}
    fn.restype = _MallInfo2
    info = fn()
    return {"heap in use": info.uordblks / 2 ** 20, "heap free, kept": info.fordblks / 2 ** 20,
            "mmapped blocks": info.hblkhd / 2 ** 20}


class HighWaterSampler:
    """Books every rise of ``VmHWM`` to the labels current when the sampler saw it."""

    def __init__(self, interval_s: float):
        self.interval_s = interval_s
        self.train = "set-up"
        self.round = "-"
        self.rises: dict[str, float] = {}
        self.peak_label = ""
        self.at_peak: dict[str, float] = {}
        self._hwm = _status_mb("VmHWM")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hwm-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def label(self) -> str:
        return f"{self.train} | {self.round}"

    def _sample(self) -> None:
        hwm = _status_mb("VmHWM")
        if hwm > self._hwm:
            key = self.label()
            self.rises[key] = self.rises.get(key, 0.0) + hwm - self._hwm
            self._hwm, self.peak_label = hwm, key
            self.at_peak = dict(malloc_mb(), rss=_status_mb("VmRSS"))

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()


def install(sampler: HighWaterSampler) -> None:
    """Label the training thread's phases and the rounds' stages for ``sampler``."""
    from deepspeed.runtime.engine import DeepSpeedEngine

    from ds_acco.deepspeed import engine as deepspeed_engine
    from ds_acco.optim import shard_optimizer
    from ds_acco.rounds import engine as round_engine

    for cls in (DeepSpeedEngine, deepspeed_engine.AccoDeepSpeedEngine):
        for name in ("forward", "backward", "step"):
            if name in vars(cls):
                _wrap_outer(cls, name, sampler)
    original_stage = round_engine.RoundEngine._enter_stage

    def enter_stage(self, handle, stage):
        sampler.round = "-" if stage == "done" else f"{stage} (round {min(handle.index, 2)}{'+' * (handle.index >= 2)})"
        return original_stage(self, handle, stage)

    round_engine.RoundEngine._enter_stage = enter_stage
    for name in ("commit", "lookahead"):
        _label_round_call(shard_optimizer.ShardOptimizer, name, sampler)


def _label_round_call(cls, name: str, sampler: HighWaterSampler) -> None:
    """Within the shard step, tell the optimizer's own step (``commit``, ``lookahead``) from the rest."""
    original = getattr(cls, name)

    def wrapped(self, *args, **kwargs):
        outer = sampler.round
        sampler.round = f"{outer}: {name}"
        try:
            return original(self, *args, **kwargs)
        finally:
            sampler.round = outer

    setattr(cls, name, wrapped)


def _wrap_outer(cls, name: str, sampler: HighWaterSampler) -> None:
    """Label ``cls.name`` calls on the training thread; a nested call keeps the outer label."""
    original = getattr(cls, name)

    def wrapped(self, *args, **kwargs):
        outer = sampler.train
        if outer in ("forward", "backward", "step"):
            return original(self, *args, **kwargs)
        sampler.train = name
        try:
            return original(self, *args, **kwargs)
        finally:
            sampler.train = "between"

    setattr(cls, name, wrapped)


def worker(out_dir: str, train_argv: list[str], interval_s: float) -> int:
    import deepspeed  # noqa: F401 - the libraries first, as benchmarks.sweep.worker does
    import torch  # noqa: F401
    import transformers  # noqa: F401

    import ds_acco.deepspeed.engine  # noqa: F401
    from examples import train_lm

    rank = int(os.environ.get("RANK", "0"))
    libraries = _status_mb("VmRSS")
    sampler = HighWaterSampler(interval_s)
    install(sampler)
    marks: dict[str, float] = {}
    from deepspeed.runtime.engine import DeepSpeedEngine

    first_forward = DeepSpeedEngine.forward

    def forward(self, *args, **kwargs):
        if "after set-up" not in marks:
            marks["after set-up"] = _status_mb("VmRSS")
            marks.update({f"after set-up: {k}": v for k, v in malloc_mb().items()})
            marks["after set-up: rss"] = marks["after set-up"]
        return first_forward(self, *args, **kwargs)

    DeepSpeedEngine.forward = forward
    sampler.start()
    try:
        code = train_lm.main(train_argv) or 0
    finally:
        sampler.stop()
        record = {"rank": rank, "libraries_mb": libraries, "peak_mb": _status_mb("VmHWM"),
                  "marks_mb": marks, "rises_mb": sampler.rises, "peak_label": sampler.peak_label,
                  "at_peak_mb": sampler.at_peak, "at_end_mb": dict(malloc_mb(), rss=_status_mb("VmRSS"))}
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, f"attribution_rank{rank}.json"), "w", encoding="utf-8") as f:
            json.dump(record, f, indent=1)
    return code


# --------------------------------------------------------------------------- launching


def run(configs: list[str], out_dir: str, interval_ms: float, timeout_s: float = 600.0) -> dict:
    """One memory-benchmark workload per config on two local ranks; returns ``{config: [rank records]}``."""
    from benchmarks.sweep import configs as cfgs
    from benchmarks.sweep.commands import LAUNCHER, train_args
    from benchmarks.sweep.specs import Workload

    wl = Workload(model_size="medium", seq_len=32, micro_batch=1, grad_accum=4, steps=4, warmup_steps=1,
                  eval_batches=2)  # the memory benchmark's workload (benchmarks/sweep/plans.py)
    results = {}
    for name in configs:
        run_dir = os.path.join(os.path.abspath(out_dir), name)
        os.makedirs(run_dir, exist_ok=True)
        cfg = cfgs.make_config(name, micro_batch=wl.micro_batch, grad_accum=wl.grad_accum,
                               warmup_steps=wl.warmup_steps)
        config_path = os.path.join(run_dir, "config.json")
        with open(config_path, "w", encoding="utf-8") as f:
            json.dump(cfg, f, indent=1)
        cmd = [sys.executable, LAUNCHER, "--hosts", "2", "--no-netns", "--quiet", "--log-dir", run_dir,
               "--timeout", str(int(timeout_s)), "--cpus", "host0=0", "--cpus", "host1=1", "--",
               sys.executable, "-m", "benchmarks.memory.attribution", "worker", "--out", run_dir,
               "--interval-ms", str(interval_ms), "--"] + train_args(wl, config_path, run_dir)
        env = dict(os.environ, OMP_NUM_THREADS="1")
        env["PYTHONPATH"] = REPO + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        subprocess.run(cmd, cwd=REPO, env=env, check=True, timeout=timeout_s + 60,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        results[name] = [json.load(open(os.path.join(run_dir, f"attribution_rank{r}.json"), encoding="utf-8"))
                         for r in range(2)]
    return results


def report(results: dict, params: int = 25_370_000, world: int = 2) -> None:
    """Print each config's peak split, and its excess over zero1 against the analytic model's."""
    from . import model as memory

    mb = 2 ** 20
    for name, ranks in results.items():
        for rec in ranks:
            setup = rec["marks_mb"].get("after set-up", float("nan"))
            print(f"{name:12s} rank {rec['rank']}: peak {rec['peak_mb']:7.1f} MB = libraries {rec['libraries_mb']:6.1f}"
                  f" + set-up {setup - rec['libraries_mb']:6.1f} + training rises {rec['peak_mb'] - setup:6.1f}"
                  f" (analytic buffers {memory.total(name, world, params) / mb:6.1f}); peak reached in "
                  f"[{rec['peak_label']}]")
            for when, key in (("after set-up", "marks_mb"), ("at the peak", "at_peak_mb"), ("at exit", "at_end_mb")):
                d = {k.split(": ")[-1]: v for k, v in rec[key].items() if k != "after set-up"}
                print(f"      {when:13s} " + ", ".join(f"{k} {v:6.1f}" for k, v in d.items()))
            for label, rise in sorted(rec["rises_mb"].items(), key=lambda kv: -kv[1]):
                if rise >= 0.5:
                    print(f"      {label:34s} +{rise:6.1f} MB")
    if "zero1" not in results:
        return
    base = max(r["peak_mb"] for r in results["zero1"])
    print("\nexcess over zero1 (MB; peaks: max over ranks): measured, analytic, gap; the gap's rises in the round's "
          "collectives and in its optimizer step, per rank")
    for name, ranks in results.items():
        if name == "zero1":
            continue
        measured = max(r["peak_mb"] for r in ranks) - base
        analytic = (memory.total(name, world, params) - memory.total(memory.baseline(name), world, params)) / mb
        split = []
        for rec in ranks:
            rises = rec["rises_mb"]
            coll = sum(v for k, v in rises.items() if "reduce-scatter" in k or "all-gather" in k)
            step = sum(v for k, v in rises.items() if ": commit" in k or ": lookahead" in k)
            split.append(f"rank {rec['rank']}: collectives {coll:5.1f}, step {step:5.1f}")
        print(f"  {name:12s} {measured:+7.1f} {analytic:+7.1f} {measured - analytic:+7.1f}   " + "; ".join(split))


# --------------------------------------------------------------------------- isolated candidates


def _reset_hwm() -> float:
    with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
        f.write("5")  # VmHWM := VmRSS
    return _status_mb("VmRSS")


def _rise(fn: Callable[[], None], on_thread: bool = False) -> float:
    """How far ``fn`` raises the high-water mark above the resident set, run here or on a new thread."""
    import gc

    gc.collect()
    before = _reset_hwm()
    if on_thread:
        t = threading.Thread(target=fn)
        t.start()
        t.join()
    else:
        fn()
    return _status_mb("VmHWM") - before


def _candidates(rank: int, world: int, params: int, port: int, repeats: int) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from deepspeed.ops.adam import FusedAdam

    from ds_acco.comm.collectives import MAX_PIECE_NUMEL, RoundCollectives
    from ds_acco.optim.shard_optimizer import ShardOptimizer

    shard_n = params // world
    out: dict[str, tuple[float, float]] = {}  # name: (first call, later calls)

    def optimizer_case(name, make, commit=False):
        master = torch.randn(shard_n)
        opt = make([master])
        grad = torch.randn(shard_n)
        if commit:
            so = ShardOptimizer(opt, [master])
            step = lambda: so.commit([grad])  # noqa: E731
        else:
            master.grad = grad
            step = opt.step
        first = _rise(step)  # allocates the state (persistent, counted by the model) and scratch
        out[name] = (first, max(_rise(step) for _ in range(repeats)))

    adamw = lambda ps: torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.1)  # noqa: E731 - single-tensor on CPU
    optimizer_case("torch AdamW step (single-tensor)", adamw)
    optimizer_case("torch AdamW step, foreach",
                   lambda ps: torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.1, foreach=True))
    optimizer_case("ds_acco commit, torch AdamW (chunked)", adamw, commit=True)
    optimizer_case("DeepSpeed FusedAdam step (CPU kernel)", lambda ps: FusedAdam(ps, lr=1e-3, weight_decay=0.1))
    groups = []
    out["a second gloo process group (the rounds' own)"] = (
        _rise(lambda: groups.append(RoundCollectives(None, 120.0)) or groups[-1].barrier()), 0.0)
    groups[0].destroy()
    full = torch.randn(world * shard_n)
    shard = torch.empty(shard_n)
    for thread in (False, True):
        where = "comm thread" if thread else "main thread"
        for name in ("reduce-scatter", "all-gather"):
            coll = RoundCollectives(None, 120.0)  # fresh piece scratch

            def once(coll=coll, name=name):
                coll.barrier()
                if name == "reduce-scatter":
                    coll.reduce_scatter_sum(shard, full)
                else:
                    coll.all_gather(full, full[rank * shard_n:(rank + 1) * shard_n])
                coll.barrier()

            first = _rise(once, thread)
            out[f"gloo {name} of P fp32, {where}"] = (first, max(_rise(once, thread) for _ in range(repeats)))
            scratch = sum(b.numel() * b.element_size() for b in coll._a2a_scratch.values()) / 2 ** 20
            out[f"  of which ds_acco's piece scratch ({name}, {where})"] = (scratch, 0.0)
            coll.destroy()
    dist.destroy_process_group()
    if rank == 0:
        print(f"isolated candidates: P = {params / 1e6:.2f}M fp32, N = {world}, shard {shard_n / 1e6:.2f}M "
              f"elements ({shard_n * 4 / 2 ** 20:.1f} MB); gloo pieces of {MAX_PIECE_NUMEL} elements per rank; "
              f"VmHWM above the resident set (MB): first call, then the largest of {repeats} more")
        for name, (first, later) in out.items():
            print(f"  {name:62s} {first:+7.1f} {later:+7.1f}")


def candidates(params: int, world: int = 2, port: int = 29561, repeats: int = 3) -> None:
    import torch.multiprocessing as mp

    mp.spawn(_candidates, args=(world, params, port, repeats), nprocs=world)


def main(argv: Optional[list[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "worker":  # python -m ... worker --out DIR --interval-ms X -- <train_lm args>
        split = argv.index("--")
        w = argparse.ArgumentParser(prog="memory_attribution worker")
        w.add_argument("--out", required=True)
        w.add_argument("--interval-ms", type=float, default=1.0)
        args = w.parse_args(argv[1:split])
        return worker(args.out, argv[split + 1:], args.interval_ms / 1000)
    p = argparse.ArgumentParser(prog="python -m benchmarks.memory.attribution", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="the memory benchmark's runs, with the peak attributed (two local ranks)")
    r.add_argument("--configs", default="zero1,sync,dpu,acco_fixed")
    r.add_argument("--out", default="/tmp/ds_acco_memory_attribution")
    r.add_argument("--interval-ms", type=float, default=1.0)
    c = sub.add_parser("candidates", help="isolated working memory of the suspects")
    c.add_argument("--params", type=float, default=25.37e6)
    c.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    if args.cmd == "run":
        report(run(args.configs.split(","), args.out, args.interval_ms))
    else:
        candidates(int(args.params), repeats=args.repeats)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
