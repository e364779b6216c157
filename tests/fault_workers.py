"""Worker bodies for the error-path tests: each returns what it observed instead of raising."""

from __future__ import annotations

import threading
import time

import torch

from tests import workloads as W


class FailingAdamW(torch.optim.AdamW):
    """AdamW that raises on its ``fail_at``-th step (only where ``fail_at`` is set)."""

    def __init__(self, params, fail_at=None, **kw):
        super().__init__(params, **kw)
        self.fail_at, self.calls = fail_at, 0

    def step(self, closure=None):
        self.calls += 1
        if self.fail_at is not None and self.calls == self.fail_at:
            raise RuntimeError("injected optimizer failure")
        return super().step(closure)


_BASELINE: set = set()


def comm_threads():
    """ds_acco threads started by the current job (pooled workers may hold earlier jobs' threads)."""
    return [t.name for t in threading.enumerate() if t.name.startswith("ds_acco") and t not in _BASELINE]


def _mark_baseline():
    _BASELINE.clear()
    _BASELINE.update(threading.enumerate())


def train_until_error(rank, world, *, config, G=4, fail_rank=None, fail_at=None, stall_rank=None,
                      stall_after=None, stall_s=0.0, raised_flag=None, max_micro_batches=200):
    """Train the tiny job; report the first exception's type/message and how long the raise took.

    ``stall_rank`` sleeps ``stall_s`` before its micro-batch ``stall_after``, or until a peer has raised, which it
    says by creating the file ``raised_flag``: a stall only has to outlast the time-out it proves, and what the
    stalled rank does after the peer gave up is not the observation."""
    from ds_acco import plain

    _mark_baseline()
    model = W.make_model()
    kw = dict(W.OPT_KWARGS, fail_at=fail_at if rank == fail_rank else None)
    engine = plain.build(W.param_groups(model), FailingAdamW, kw, config=config, gradient_accumulation_steps=G)
    observed = {"error": None, "message": "", "seconds_to_raise": None}
    t_mark = time.monotonic()
    try:
        for k in range(max_micro_batches):
            if rank == stall_rank and k == stall_after:
                _stall(stall_s, raised_flag)
            x, y = W.batch(rank, k)
            W.loss_fn(model(x), y).backward()
            t_mark = time.monotonic()
            engine.after_micro_batch()
    except Exception as exc:  # noqa: BLE001 - the observation is the point
        observed.update(error=type(exc).__name__, message=str(exc), seconds_to_raise=time.monotonic() - t_mark,
                        raised_at=time.time())
        if raised_flag is not None:
            open(raised_flag, "a").close()  # noqa: SIM115 - the file's existence is the message
    engine.close(drain=observed["error"] is None)
    time.sleep(0.2)
    observed["threads_after_close"] = comm_threads()
    observed["commits"] = engine.commits
    return observed


def _stall(seconds: float, raised_flag) -> None:
    import os

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not (raised_flag is not None and os.path.exists(raised_flag)):
        time.sleep(0.05)


def start_with_config(rank, world, *, configs):
    """Each rank builds an engine from its own config; report the start-up error, if any."""
    from ds_acco import plain

    model = W.make_model()
    try:
        engine = plain.build(W.param_groups(model), config=configs[rank], gradient_accumulation_steps=4)
    except Exception as exc:  # noqa: BLE001
        return {"error": type(exc).__name__, "message": str(exc)}
    engine.close()
    return {"error": None, "message": ""}


def telemetry_run(rank, world, *, config, G=4, steps=4, sleep_s=0.0):
    import logging

    from ds_acco import plain

    records = []
    handler = logging.Handler()
    handler.emit = lambda r: records.append(r.getMessage())
    logging.getLogger("ds_acco").addHandler(handler)
    logging.getLogger("ds_acco").setLevel(logging.INFO)
    model = W.make_model()
    engine = plain.build(W.param_groups(model), config=config, gradient_accumulation_steps=G)
    k = 0
    while engine.commits < steps:
        x, y = W.batch(rank, k)
        k += 1
        time.sleep(sleep_s)
        W.loss_fn(model(x), y).backward()
        engine.after_micro_batch()
    engine.close()
    return {"records": list(engine.telemetry.records), "summary": engine.telemetry.summary(),
            "hidden": engine.telemetry.hidden_fraction, "log": records,
            "layout": [g.layout.padded_numel for g in engine.groups]}


def train_with_fault(rank, world, *, config, victim, stage, round_index, sig, G=4, max_micro_batches=100_000):
    """Rank ``victim`` sends itself ``sig`` when round ``round_index`` enters ``stage``;
    the other ranks train on and report the error they get and when."""
    import os

    from ds_acco import plain

    _mark_baseline()

    def on_stage(index, name):
        if rank == victim and index == round_index and name == stage:
            os.kill(os.getpid(), sig)

    model = W.make_model()
    engine = plain.build(W.param_groups(model), config=config, gradient_accumulation_steps=G, on_stage=on_stage)
    observed = {"error": None, "message": "", "raised_at": None}
    started = time.time()
    try:
        for k in range(max_micro_batches):
            x, y = W.batch(rank, k)
            W.loss_fn(model(x), y).backward()
            engine.after_micro_batch()
            if time.time() - started > 60:
                break
    except Exception as exc:  # noqa: BLE001
        observed.update(error=type(exc).__name__, message=str(exc), raised_at=time.time())
    _close_and_watch(engine, config, observed)
    observed.update(commits=engine.commits, fault_round_launched_at=None)
    return observed


def _close_and_watch(engine, config: dict, observed: dict) -> None:
    """Close without draining (a peer is gone) and record how long the communication thread took to end."""
    closed_at = time.time()
    engine.close(drain=False)
    deadline = time.time() + config.get("timeout_s", 600) + 5
    while comm_threads() and time.time() < deadline:
        time.sleep(0.1)
    observed.update(threads_after_close=comm_threads(), thread_exit_s=time.time() - closed_at)


def streaming_with_fault(rank, world, *, config, victim, sig, when, G=4, max_steps=400):
    """Rank ``victim`` sends itself ``sig`` while streaming rounds run; the others train on and report the error
    they get and when. ``when``: ``"fragment"`` (mode streaming, a fragment round in flight) or ``"switch"`` (mode
    auto just switched to streaming: the optimizer state is being gathered; a 0.5 s sleep per gradient round makes
    the link slow enough for auto to switch)."""
    import os

    from ds_acco import plain, streaming

    _mark_baseline()
    model = W.make_model()
    if when == "fragment":
        engine = streaming.build(model, torch.optim.AdamW, W.OPT_KWARGS, config=config)
        opt = engine.inner_optimizer
    else:
        engine = plain.build(W.param_groups(model), torch.optim.AdamW, W.OPT_KWARGS, config=config,
                             gradient_accumulation_steps=G, model=model,
                             on_stage=lambda index, stage: time.sleep(0.5) if stage == "reduce-scatter" else None)
    observed = {"error": None, "message": "", "raised_at": None, "killed_at": None}
    started = time.time()
    try:
        for k in range(max_steps * G):
            x, y = W.batch(rank, k)
            W.loss_fn(model(x), y).backward()
            if when == "fragment":
                opt.step()
                opt.zero_grad(set_to_none=True)
                engine.after_inner_step()
                hit = engine.in_flight
            else:
                time.sleep(0.05)
                engine.after_micro_batch()
                hit = engine.phase is not None
            if hit and observed["killed_at"] is None:
                observed["killed_at"] = time.time()
                if rank == victim:
                    os.kill(os.getpid(), sig)
            if time.time() - started > 90:
                break
    except Exception as exc:  # noqa: BLE001
        observed.update(error=type(exc).__name__, message=str(exc), raised_at=time.time())
    _close_and_watch(engine, config, observed)
    return observed


def start_alone(log_path: str, env: dict, code: str) -> None:
    """A process of its own running ``code`` as a script would (its output to ``log_path``), with ``env`` as its
    whole environment; forked from the test workers' forkserver, so it starts with torch and DeepSpeed imported."""
    import os
    import sys

    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.environ.clear()
    os.environ.update(env)
    try:
        exec(compile(code, "<start_alone>", "exec"), {"__name__": "__main__"})
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
