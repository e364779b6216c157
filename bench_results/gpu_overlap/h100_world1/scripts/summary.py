"""Every H100 run of this folder: compute per micro-batch in sync rounds and with a round in flight
(medians over the round records, the first two of each kind left out, as benchmarks/gpu_overlap.py),
the forward gate's wait per overlapped round, and seconds per step after warm-up.

    python bench_results/gpu_overlap/h100_world1/scripts/summary.py
"""
import glob
import json
import os
import statistics as st

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VARIANT = {"call1_head/base": "HEAD b3a79ef", "call1_head/swi": "HEAD, sys.setswitchinterval(0.0005)",
           "call2_gate_forward_only/new": "gate: the forward only", "call3_gate_launch_to_forward_end/base":
           "HEAD b3a79ef", "call3_gate_launch_to_forward_end/new": "gate: launch to the next forward's end"}
print("| machine (call) | variant | config | sync ms/mb | in flight ms/mb | ratio | gate wait ms/round | s/step |")
print("|---|---|---|---|---|---|---|---|")
for tel in sorted(glob.glob(os.path.join(HERE, "call*", "*", "*.telemetry.jsonl.rank0"))):
    rel = os.path.relpath(tel, HERE)
    call, run, name = rel.split(os.sep)
    key = f"{call}/{run.rstrip('0123456789')}"
    rs = [json.loads(line) for line in open(tel)]
    per = lambda sel: [r["compute_s"] / r["counts"][0] * 1e3 for r in rs if sel(r) and r["counts"][0]][2:]
    sync, ov = per(lambda r: r["mode"] == "sync"), per(lambda r: r["mode"] != "sync")
    wait = st.median(r["stage_s"].get("forward wait", 0.0) * 1e3 for r in rs if r["mode"] != "sync")
    steps = [json.loads(line) for line in open(tel.replace(".telemetry.jsonl.rank0", ".steps.jsonl"))]
    late = [s for s in steps if "step" in s and "event" not in s and s["step"] > 12]
    sps = (late[-1]["train_s"] - late[0]["train_s"]) / (len(late) - 1)
    cfg = name.split("_r")[0]
    print(f"| {call.split('_')[0]} | {VARIANT[key]} ({run}) | {cfg} | {st.median(sync):.2f} | {st.median(ov):.2f} | "
          f"{st.median(ov) / st.median(sync):.3f} | {wait:.1f} | {sps:.4f} |")
