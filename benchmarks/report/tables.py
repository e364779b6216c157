"""The tables ``python -m benchmarks report`` prints: throughput, bytes, slow host, memory, convergence,
time to loss, streaming, FSDP2, and the targets with their verdicts."""

from __future__ import annotations

import sys

from benchmarks.memory import model as memory
from benchmarks.sweep import configs as cfgs

from . import fsdp
from .curves import rates_in_order
from .streaming import print_streaming
from .time_to_loss import print_table as print_time_to_loss


def _fmt(x, spec=".0f", none="-"):
    return none if x is None else format(x, spec)


def report(result: dict, out=sys.stdout) -> None:
    """Print the tables: throughput per config and rate, slow host, memory, convergence, targets."""
    a = result.get("analysis") or {}
    runs = [r for r in result["runs"] if r.get("ok")]
    bw = [r for r in runs if r["scenario"] == "bandwidth"]
    p = lambda *s: print(*s, file=out)  # noqa: E731
    if bw:
        rates = rates_in_order(bw)
        p("\n## tokens/s per config and link rate (comm exposed %: ZeRO-1 estimated, ds_acco measured wait; "
          "hidden %: ds_acco telemetry)")
        p("| config | " + " | ".join(rates) + " |")
        p("|---|" + "---|" * len(rates))
        for cfg in [c for c in cfgs.CONFIGS if any(x["config"] == c for x in bw)]:
            cells = []
            for rate in rates:
                r = next((x for x in bw if x["config"] == cfg and x["rate"] == rate), None)
                if r is None:
                    cells.append("-")
                    continue
                extra = f" / exp {_fmt(r.get('comm_frac') and 100 * r['comm_frac'])}%"
                if r.get("comm_hidden_pct") is not None:
                    extra += f" / hid {r['comm_hidden_pct']:.0f}%"
                cells.append(f"{_fmt(r.get('tokens_per_s'))}{extra}")
            p(f"| {cfg} | " + " | ".join(cells) + " |")
        p("\n## bytes on the wire per optimizer step per worker (interface tx / ds_acco ring model), "
          "optimizer steps/s, micro-batches per commit")
        p("| config | rate | iface tx MB/step | ring MB/step | steps/s | mb/commit (all ranks) | qdisc drops |")
        p("|---|---|---|---|---|---|---|")
        for r in bw:
            p(f"| {r['config']} | {r['rate']} | {_fmt(r.get('iface_tx_bytes_per_step') and r['iface_tx_bytes_per_step'] / 1e6, '.2f')} "
              f"| {_fmt(r.get('ring_bytes_sent_per_step') and r['ring_bytes_sent_per_step'] / 1e6, '.2f')} "
              f"| {_fmt(r.get('steps_per_s'), '.2f')} | {_fmt(r.get('mean_counts_per_commit'), '.1f')} "
              f"| {_fmt(r.get('qdisc_drops'), 'd')} |")
    for key in ("slow_host", "slow_host_small"):
        _slow_table(a.get(key) or {}, key, p)
    mem = a.get("memory") or []
    if mem:
        p("\n## peak memory per worker (MB): measured VmHWM vs analytic model of the model-proportional buffers")
        p("| config | formula (bytes) | analytic MB | measured peak RSS MB | peak - baseline MB "
          "| measured - ZeRO-1 | analytic - ZeRO-1 |")
        p("|---|---|---|---|---|---|---|")
        for m in mem:
            p(f"| {m['config']} | {m['formula']} | {m['analytic_mb']:.0f} | {_fmt(m['peak_rss_mb'])} "
              f"| {_fmt(m['train_rss_mb'])} | {_fmt(m.get('measured_delta_vs_zero1_mb'), '+.0f')} "
              f"| {_fmt(m.get('analytic_delta_vs_zero1_mb'), '+.0f')} |")
    conv = a.get("convergence") or {}
    if conv:
        p("\n## validation loss at equal tokens")
        p("| config | tokens | val loss | ZeRO-1 val loss | rel. diff | final train loss |")
        p("|---|---|---|---|---|---|")
        for cfg, v in conv.items():
            p(f"| {cfg} | {v['tokens']:.0f} | {_fmt(v['val_loss'], '.4f')} | {_fmt(v['zero1_val_loss'], '.4f')} "
              f"| {_fmt(v['rel_diff'] and 100 * v['rel_diff'], '+.2f')}% | {_fmt(v['final_train_loss'], '.4f')} |")
    print_streaming(a.get("streaming") or [], p)
    print_time_to_loss(a.get("time_to_loss") or {}, p)
    if fsdp.fsdp_rows(result):
        p("\n## FSDP2: tokens/s against stock FSDP2, seconds to the target validation loss")
        fsdp.report(result, out)
    if a.get("targets"):
        p("\n## targets")
        for t in a["targets"]:
            status = {True: "MET", False: "MISSED", None: "n/a"}[t["met"]]
            p(f"- [{status}] {t['target']}: {t['value']} (target {t['op']} {t['threshold']}; {t['detail']})")
    if a.get("failed_runs"):
        p(f"\nfailed runs: {', '.join(a['failed_runs'])}")


def _slow_table(sh: dict, key: str, p) -> None:
    if not sh:
        return
    p(f"\n## one host slowed ({key}; host1: 50% of a CPU)")
    p(f"host0 alone {_fmt(sh.get('alone_host0_tokens_per_s'))} tokens/s, host1 alone "
      f"{_fmt(sh.get('alone_host1_tokens_per_s'))} tokens/s")
    p("| config | tokens/s | per-rank tokens/s | micro-batches per rank |")
    p("|---|---|---|---|")
    for cfg, v in sh.items():
        if isinstance(v, dict):
            p(f"| {cfg} | {_fmt(v['tokens_per_s'])} | {', '.join(_fmt(x) for x in v['local_tokens_per_s'])} "
              f"| {v['micro_batches']} |")


def print_memory_model(params: float, world: int, packed: bool = False) -> None:
    print(f"\nAnalytic memory model per worker, P = {params / 1e6:.2f}M parameters, N = {world} "
          f"(fp32; bf16 parameters with bf16 or fp32 accumulation){'; FSDP2 front end' if packed else ''}:")
    for cfg in memory.DTYPE_BYTES:
        kw = {"packed": packed} if cfg not in memory.STOCK else {}
        total = memory.total(cfg, world, int(params), **kw)
        base = memory.baseline(cfg)
        delta = "" if cfg in memory.STOCK else f"  ({(total - memory.total(base, world, int(params))) / 2 ** 20:+.1f} MB vs {base})"
        print(f"  {cfg:18s} {memory.formula(cfg, **kw):18s} = {total / 2 ** 20:8.1f} MB{delta}")
        for k, v in memory.components(cfg, world, int(params), **kw).items():
            print(f"      {k:34s} {v / 2 ** 20:8.1f} MB")
