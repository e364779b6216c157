"""Copy an earlier sweep's results.json and replace the runs re-measured in a new sweep (by id)."""
import json, os, sys
old, new, dest = sys.argv[1:4]
o = json.load(open(os.path.join(old, "results.json")))
n = json.load(open(os.path.join(new, "results.json")))
fresh = {r["id"]: r for r in n["runs"]}
o["runs"] = [fresh.pop(r["id"], r) for r in o["runs"]] + list(fresh.values())
o["merged_from"] = {"earlier": old, "rerun": new, "rerun_ids": sorted(r["id"] for r in n["runs"])}
os.makedirs(dest, exist_ok=True)
json.dump(o, open(os.path.join(dest, "results.json"), "w"), indent=1)
print(dest, len(o["runs"]))
