"""Each seed's streaming_int8 and auto_lowbit_int4_streaming validations: (seconds, loss) and auto's lag in seconds."""
import json, os, sys
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # the repository root
from benchmarks.report.time_to_loss import val_time_points
for folder in sys.argv[1:]:
    d = json.load(open(f"{folder}/results.json"))
    runs = {r["config"]: val_time_points(r) for r in d["runs"] if r["config"] in ("streaming_int8", "auto_lowbit_int4_streaming")}
    if len(runs) < 2:
        continue
    s, a = runs["streaming_int8"], runs["auto_lowbit_int4_streaming"]
    print(f"# {folder.rstrip('/').split('/')[-1]}: validation every 5 steps, (s, loss) streaming | auto | auto's lag (s)")
    for (ts, ls), (ta, la) in zip(s, a):
        print(f"{ts:6.1f} {ls:.3f} | {ta:6.1f} {la:.3f} | {ta - ts:+5.1f}")
