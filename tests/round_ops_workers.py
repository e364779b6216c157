"""A profiled DeepSpeed job of the small GPT with int4 estimates (issue 49's bed), for tests/test_round_ops.py and
for measuring a round's host operations by hand (``python -m tests.round_ops_workers``).

Real DeepSpeed ZeRO-1 engine, real gloo collectives on two ranks, torch's profiler on every thread; the trace is
read by benchmarks/report/round_trace.py, the reader the benchmarks use.
"""

from __future__ import annotations

import os
import statistics
import sys

import torch

SEQ = 32


def config(name: str = "acco_lowbit_int4_fixed", micro_batch: int = 1, grad_accum: int = 4) -> dict:
    from benchmarks.sweep.configs import make_config

    cfg = make_config(name, micro_batch=micro_batch, grad_accum=grad_accum, warmup_steps=1)
    cfg["gradient_clipping"] = 1.0
    return cfg


def profile_rounds(rank, world, *, out_dir: str, model_size: str = "small", steps: int = 5, window=(2, 4),
                   name: str = "acco_lowbit_int4_fixed") -> dict:
    """Train ``steps`` optimizer steps; profile steps ``window[0] + 1`` to ``window[1]`` (every thread) into
    ``out_dir/rank<r>.json`` (kept where ``ROUND_OPS_KEEP`` is set); return round_trace's summary, each marked
    round's top-level operation names, and the rounds' own times (telemetry, after the warm-up)."""
    from torch.profiler import ProfilerActivity, profile
    from torch._C._profiler import _ExperimentalConfig

    import ds_acco
    from benchmarks.report import round_trace
    from ds_acco.comm.thread_policy import policy_of
    from examples.models import build_gpt

    model = build_gpt(model_size, seq_len=SEQ, seed=0)
    before = _threads()
    engine, _, _, _ = ds_acco.initialize(model=model, model_parameters=model.parameters(), config=config(name))
    threads = {"before": before, "started": {t: v for t, v in _threads().items() if t not in before},
               "comm": engine.acco._comm._thread.native_id}
    # the link here is loopback: a busy host must not make the pacer cut collectives into more pieces
    engine.acco.coll.pacer.piece_seconds = float("inf")
    g = torch.Generator().manual_seed(rank)
    prof = None
    path = os.path.join(out_dir, f"rank{rank}.json")
    try:
        while engine.global_steps < steps:
            if engine.global_steps == window[0] and prof is None:
                prof = profile(activities=[ProfilerActivity.CPU],
                               experimental_config=_ExperimentalConfig(profile_all_threads=True))
                prof.__enter__()
            ids = torch.randint(0, 256, (1, SEQ), generator=g)
            loss = engine(input_ids=ids, labels=ids).loss
            engine.backward(loss)
            engine.step()
            if engine.global_steps == window[1] and prof is not None:
                prof.__exit__(None, None, None)
                prof.export_chrome_trace(path)
                prof = None
        records = [r for r in engine.acco.telemetry.records if r.mode != "sync"]
    finally:
        if prof is not None:  # a pooled worker runs the next job: leave no profiler on
            prof.__exit__(None, None, None)
        engine.acco.close()
        engine.destroy()
    summary = round_trace.summarize(path)
    names = marked_round_ops(path)
    if not os.environ.get("ROUND_OPS_KEEP"):
        os.remove(path)
    round_ms = {kind: statistics.median(1e3 * r.round_s for r in records[2:] if r.kind == kind) for kind in
                ("estimate", "commit")}
    threads["training"] = policy_of(0)
    return {"summary": summary, "ops": names, "round_ms": round_ms, "threads": threads}


def _threads() -> dict:
    """Every thread of this process: its id, name and scheduling policy (ds_acco.comm.thread_policy)."""
    from ds_acco.comm.thread_policy import policy_of

    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm", encoding="utf-8") as f:
                out[int(tid)] = (f.read().strip(), policy_of(int(tid)))
        except OSError:
            continue  # the thread ended between listdir and reading it
    return out


def time_rounds(rank, world, *, model_size: str = "small", steps: int = 12,
                name: str = "acco_lowbit_int4_fixed") -> dict:
    """Train without a profiler; each overlapped round's communication-thread CPU ms (its stages' sum) and wall
    ms, by kind, the first two of each kind left out (allocator warm-up)."""
    import ds_acco
    from examples.models import build_gpt

    model = build_gpt(model_size, seq_len=SEQ, seed=0)
    engine, _, _, _ = ds_acco.initialize(model=model, model_parameters=model.parameters(), config=config(name))
    engine.acco.coll.pacer.piece_seconds = float("inf")
    g = torch.Generator().manual_seed(rank)
    try:
        while engine.global_steps < steps:
            ids = torch.randint(0, 256, (1, SEQ), generator=g)
            engine.backward(engine(input_ids=ids, labels=ids).loss)
            engine.step()
        records = [r for r in engine.acco.telemetry.records if r.mode != "sync"]
    finally:
        engine.acco.close()
        engine.destroy()
    out: dict = {}
    for kind in ("estimate", "commit"):
        mine = [r for r in records if r.kind == kind][2:]
        out[kind] = {"cpu_ms": [1e3 * sum(r.stage_cpu_s.values()) for r in mine],
                     "wall_ms": [1e3 * r.round_s for r in mine]}
    return out


def _rows(rank: int, n: int, dtype=torch.float32, tag: int = 0) -> torch.Tensor:
    """Rank ``rank``'s input: magnitudes that differ by block, an all-zero stretch, a few tiny values."""
    g = torch.Generator().manual_seed(1000 * tag + rank)
    x = torch.randn(n, generator=g) * torch.randn(n, generator=g).exp()
    x[n // 3: n // 3 + 20] = 0.0
    x[-3:] *= 1e-30
    return x.to(dtype)


def _reference_rs(inputs: list, chunk: int, block: int, qmax: int) -> tuple[list, list]:
    """The quantised reduce-scatter by its definition, rank by rank: each rank's rows quantised alone, each
    destination's sum in rank order from zero; and what each rank's quantisation lost."""
    from ds_acco.numerics.quantization import dequantize_blockwise, quantize_blockwise

    N = len(inputs)
    sent = []
    for x in inputs:
        rows = torch.zeros(N * chunk)
        rows[: x.numel()] = x.float()
        q = [quantize_blockwise(r, block, qmax=qmax) for r in rows.view(N, chunk)]
        sent.append([dequantize_blockwise(p, s, block, qmax=qmax).view(-1) for p, s in q])
    outs = []
    for d in range(N):
        acc = torch.zeros(chunk)
        for src in range(N):
            acc.add_(sent[src][d])
        outs.append(acc)
    return outs, sent


def quantised_collectives(rank, world) -> dict:
    """Int8ReduceScatter (int8, int4 with what it lost, error feedback, padding) and Int8DeltaAllGather (int8,
    int4, pieces with a short last block, fp32 and bf16 parameters) against their definition, bit for bit."""
    from ds_acco.comm.collectives import RoundCollectives
    from ds_acco.comm.int8_collectives import Int8DeltaAllGather, Int8ReduceScatter
    from ds_acco.numerics.quantization import dequantize_blockwise, quantize_blockwise

    coll = RoundCollectives(None, 60.0)
    N, out = world, {}
    try:
        for numel, block, bits, ef in ((2 * 1000, 64, 8, False), (2 * 1001, 64, 4, False), (1999, 16, 8, False),
                                       (2 * 777, 256, 8, True), (2 * 513, 7, 4, False)):
            qmax = 127 if bits == 8 else 7
            rs = Int8ReduceScatter(numel, N, block_size=block, bits=bits, error_feedback=ef)
            residuals = [torch.zeros(rs.padded_numel) for _ in range(N)]
            ok = True
            for step in range(3):  # error feedback carries a residual from call to call
                inputs = [_rows(r, numel, tag=step) for r in range(N)]
                lost = torch.empty(numel) if bits == 4 and not ef else None
                got = rs(coll, torch.empty(rs.chunk), inputs[rank], residual_out=lost)
                work = [torch.cat([x, torch.zeros(rs.padded_numel - numel)]) + res for x, res in zip(inputs, residuals)]
                want, sent = _reference_rs(work if ef else inputs, rs.chunk, block, qmax)
                ok &= torch.equal(got.view(torch.int32), want[rank].view(torch.int32))
                if lost is not None:
                    ok &= torch.equal(lost, inputs[rank] - torch.cat(sent[rank])[:numel])
                if ef:
                    residuals = [w - torch.cat(s) for w, s in zip(work, sent)]
            out[f"rs {numel}/{block} int{bits}{' ef' if ef else ''}"] = bool(ok)
        for shard, block, bits, piece, dtype in ((1000, 64, 8, None, torch.float32),
                                                 (1001, 64, 4, 256, torch.float32),
                                                 (1001, 16, 8, 320, torch.bfloat16),
                                                 (999, 256, 4, None, torch.bfloat16)):
            qmax = 127 if bits == 8 else 7
            ag = Int8DeltaAllGather(shard, N, block_size=block, piece_numel=piece, bits=bits)
            base = _rows(99, N * shard, dtype)  # the same on every rank
            news = [base.view(N, shard)[r].float() + 1e-3 * _rows(r, shard, tag=7) for r in range(N)]
            full = torch.empty_like(base)
            ag(coll, full, base, news[rank])
            want = torch.empty(N, shard)
            for r in range(N):
                delta = news[r] - base.view(N, shard)[r].float()
                for a, n in ag.pieces:  # blocks never straddle pieces
                    q = quantize_blockwise(delta[a:a + n], block, qmax=qmax)
                    want[r, a:a + n] = dequantize_blockwise(q.payload, q.scales, block, qmax=qmax).view(-1) + \
                        base.view(N, shard)[r, a:a + n].float()
            out[f"ag {shard}/{block} int{bits} {len(ag.pieces)} pieces {dtype}"] = torch.equal(
                full.view(N, shard).float(), want.to(dtype).float())
    finally:
        coll.destroy()
    return out


def marked_round_ops(path: str) -> dict:
    """``{kind: [[op name, ...] per round]}``: the top-level operations inside each round's mark, counted as
    benchmarks/report/round_trace.py counts them."""
    from collections import Counter

    from benchmarks.report import round_trace as rt

    ev = rt._load(path)
    t1 = max(e["ts"] + e["dur"] for e in ev)
    ops = [e for e in ev if e.get("cat") == "cpu_op" and not e["name"].startswith(rt.MARK)]
    tid = Counter(e["tid"] for e in ops if e["name"].startswith("c10d::")).most_common(1)[0][0]
    top = rt._top_level([e for e in ops if e["tid"] == tid])
    out: dict = {}
    for m in rt._marked([e for e in ev if e["tid"] == tid], t1):
        inside = [e["name"] for e in top if m["ts"] <= e["ts"] <= m["ts"] + m["dur"]]
        out.setdefault(m["name"][len(rt.MARK):], []).append(inside)
    return out


def main(argv=None) -> int:
    """Print one rank's figures and the operations of one estimate and one commit."""
    import argparse
    import tempfile

    from tests.dist_harness import run_distributed

    ap = argparse.ArgumentParser()
    ap.add_argument("--model-size", default="small")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--window", default="2:7")
    ap.add_argument("--config", default="acco_lowbit_int4_fixed")
    ap.add_argument("--time", action="store_true", help="round CPU and wall ms without a profiler instead")
    args = ap.parse_args(argv)
    if args.time:
        res = run_distributed(time_rounds, 2, model_size=args.model_size, steps=args.steps, name=args.config,
                              timeout=900)
        for kind in ("estimate", "commit"):
            print(kind, {k: [round(statistics.median(r[kind][k]), 2) for r in res] for k in ("cpu_ms", "wall_ms")},
                  "rounds", len(res[0][kind]["cpu_ms"]))
        return 0
    a, b = (int(x) for x in args.window.split(":"))
    with tempfile.TemporaryDirectory() as out:
        res = run_distributed(profile_rounds, 2, out_dir=out, model_size=args.model_size, steps=args.steps,
                              window=(a, b), name=args.config, timeout=600)
    from benchmarks.report.round_trace import describe

    for r, got in enumerate(res):
        print(f"rank {r}: {describe(got['summary'])}; round ms {got['round_ms']}")
    for kind, rounds in res[0]["ops"].items():
        one = rounds[len(rounds) // 2]
        print(f"{kind} ({len(one)} ops): {' '.join(n.replace('aten::', '') for n in one)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
