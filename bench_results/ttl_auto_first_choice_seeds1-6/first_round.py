import json, glob, statistics, sys
for pat in sys.argv[1:]:
    for f in sorted(glob.glob(pat)):
        recs=[json.loads(l) for l in open(f)]
        recs=[r for r in recs if r.get("kind") in ("commit","estimate")]
        if len(recs) < 6: continue
        first=recs[0]["round_s"]-recs[0]["stage_s"].get("count all-gather",0)
        rest=statistics.median(r["round_s"]-r["stage_s"].get("count all-gather",0) for r in recs[1:6])
        print("/".join(f.split("/")[2:4]), f.split("/")[-2].replace("time_to_loss-",""), f"first {first:.2f} s, rounds 2-6 median {rest:.2f} s")
