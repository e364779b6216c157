"""Figures of call1_head/trace_int4.json.gz (torch.profiler, all threads, two optimizer steps of acco int4
fixed on an H100): per thread and stream, inside and outside the comm thread's active stretches.

    python bench_results/gpu_overlap/h100_session21/scripts/trace_analysis.py
"""
import collections
import gzip
import json
import os

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
t = json.load(gzip.open(os.path.join(HERE, "call1_head", "trace_int4.json.gz")))
ev = [e for e in t["traceEvents"] if e.get("ph") == "X"]
t0 = min(e["ts"] for e in ev)
n_ops = collections.Counter(e.get("tid") for e in ev if e.get("cat") == "cpu_op")
kern = collections.Counter(e.get("tid") for e in ev if e.get("cat") == "kernel")
comm_tid = min((tid for tid in n_ops), key=lambda tid: n_ops[tid])  # the thread with the fewest ops: the round's
# (the training thread launches the forward, autograd's device thread the backward)
streams = sorted(kern, key=lambda s: -kern[s])
compute_stream, comm_stream = streams[0], streams[1]
print("cpu ops per thread:", dict(n_ops), "| kernels per stream:", dict(kern))
acts = sorted((e for e in ev if e.get("tid") == comm_tid and e.get("cat") in ("cpu_op", "cuda_runtime")),
              key=lambda e: e["ts"])
rounds, cur = [], None
for e in acts:
    if cur and e["ts"] - cur[1] < 5000:
        cur[1] = max(cur[1], e["ts"] + e["dur"])
    else:
        cur = [e["ts"], e["ts"] + e["dur"]]
        rounds.append(cur)
rounds = [r for r in rounds if r[1] - r[0] > 1000]
span = max(e["ts"] + e.get("dur", 0) for e in ev) - t0
inside = sum(b - a for a, b in rounds)
print(f"span {span / 1e3:.1f} ms; the round thread active {len(rounds)} times:",
      [(round((a - t0) / 1e3, 1), round((b - a) / 1e3, 1)) for a, b in rounds], "(start ms, length ms)")


def within(ts):
    return any(a <= ts <= b for a, b in rounds)


for name, sel in (("compute stream kernels", lambda e: e.get("tid") == compute_stream and e.get("cat") == "kernel"),
                  ("comm stream kernels", lambda e: e.get("tid") == comm_stream and e.get("cat") == "kernel")):
    xs = [e for e in ev if sel(e)]
    busy_in = sum(e["dur"] for e in xs if within(e["ts"]))
    busy_out = sum(e["dur"] for e in xs) - busy_in
    print(f"{name}: busy {busy_in / inside:.2f} of the time the round thread is active, "
          f"{busy_out / (span - inside):.2f} otherwise; {sum(e['dur'] for e in xs) / 1e3:.1f} ms in all")
slow = sorted((e for e in ev if e.get("cat") in ("cpu_op", "cuda_runtime") and e["dur"] > 2500
               and e.get("tid") != comm_tid and e["name"] not in ("cudaStreamSynchronize",)), key=lambda e: e["ts"])
print("training-side kernel launches and data indexing over 2.5 ms:")
for e in slow:
    if e["name"] in ("cudaLaunchKernel", "aten::index"):
        print(f"  t={(e['ts'] - t0) / 1e3:.1f} ms {e['name']} {e['dur'] / 1e3:.2f} ms, inside a round: {within(e['ts'])}")
idx = [e["dur"] / 1e3 for e in ev if e.get("tid") != comm_tid and e["name"] == "aten::index"]
print("every aten::index of the data (ms):", [round(x, 2) for x in idx])
