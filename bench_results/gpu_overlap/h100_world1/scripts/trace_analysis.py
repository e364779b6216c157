"""Figures of call1_head/trace_int4.json.gz (torch.profiler, all threads, two optimizer steps of acco int4
fixed on an H100): the round's operations and launches and the compute stream's busy share, as
benchmarks/report/round_trace.py reads them, then the training thread's slow calls while a round ran.

    python bench_results/gpu_overlap/h100_world1/scripts/trace_analysis.py
"""
import gzip
import json
import os
import sys

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(HERE))))
from benchmarks.report.round_trace import JOIN_US, _bursts, describe, summarize  # noqa: E402

path = os.path.join(HERE, "call1_head", "trace_int4.json.gz")
print(describe(summarize(path)))
ev = [e for e in json.load(gzip.open(path))["traceEvents"] if e.get("ph") == "X" and "dur" in e]
t0 = min(e["ts"] for e in ev)
comms = {e["tid"] for e in ev if e.get("cat") == "cpu_op" and e["name"].startswith("c10d::")}
spans = _bursts([e for e in ev if e["tid"] in comms and e.get("cat") in ("cpu_op", "cuda_runtime")])
print(f"rounds (start ms, length ms; gaps under {JOIN_US / 1e3:.0f} ms joined):",
      [(round((a - t0) / 1e3, 1), round((b - a) / 1e3, 1)) for a, b in spans])
print("training-side kernel launches and data indexing over 2.5 ms:")
for e in sorted(ev, key=lambda e: e["ts"]):
    if e["tid"] not in comms and e["name"] in ("cudaLaunchKernel", "aten::index") and e["dur"] > 2500:
        inside = any(a <= e["ts"] <= b for a, b in spans)
        print(f"  t={(e['ts'] - t0) / 1e3:.1f} ms {e['name']} {e['dur'] / 1e3:.2f} ms, inside a round: {inside}")
print("every aten::index of the data (ms):",
      [round(e["dur"] / 1e3, 2) for e in ev if e["tid"] not in comms and e["name"] == "aten::index"])
