"""Clean-exit stress: launch short finished jobs many times under a CPU hog, count non-zero exits.

Why: a finished job that exits non-zero makes schedulers retry it and pipelines discard its
output. The abort this guards against (gloo groups alive at interpreter finalization: see
``ds_acco.comm.engine_lifecycle``) is load-dependent, so every launch runs while busy loops
occupy every core, and each case goes through a real launcher (``deepspeed``, ``torchrun``,
``mpiexec``) as users run it.

    python -m benchmarks.clean_exit --launches 200 --out clean_exit_results     # BENCHMARKS.md
    python -m benchmarks.clean_exit --launches 3 --cases ds_acco_deepspeed,fsdp_acco_torchrun,hf_streaming_deepspeed

Writes ``launches.jsonl`` (one line per launch: case, rc, seconds, abort seen), each launch's
output (``launch_<i>.log``) and ``summary.md`` under ``--out``; the exit status is 1 when any
launch failed.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import re
import signal
import subprocess
import sys
import time

from benchmarks.cluster.system import free_port

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--model-size", "tiny", "--seq-len", "64", "--steps", "3", "--eval-every", "0", "--eval-batches", "2",
        "--no-progress"]
FSDP_TINY = ["--model-size", "tiny", "--seq-len", "32", "--steps", "3", "--eval-every", "3", "--eval-batches", "2"]
ABORT = re.compile(r"terminate called|Aborted|core dumped|Fatal Python error|SIGABRT|exits with return code = -6")


def _launcher(script: str, config: str, extra: list[str]):
    return lambda port: ["bash", os.path.join(REPO, "launchers", script), "-n", "2", "-p", str(port),
                         os.path.join(REPO, "ds_configs", config), *extra]


def _hf(launcher: str, config: str):
    cfg = os.path.join(REPO, "ds_configs", config)
    tail = ["examples/train_hf.py", "--deepspeed", cfg, "--steps", "3"]
    if launcher == "deepspeed":
        return lambda port: ["deepspeed", "--num_gpus", "2", "--master_port", str(port), "--module", "ds_acco.run",
                             *tail]
    return lambda port: ["torchrun", "--nproc_per_node", "2", "--master_port", str(port), "-m", "ds_acco.run", *tail]


CASES = {
    "ds_acco_deepspeed": _launcher("deepspeed_local.sh", "acco_lowbit.json", TINY),
    "ds_streaming_torchrun": _launcher("torchrun.sh", "streaming_int8.json", TINY),
    "ds_adaptive_mpiexec": _launcher("mpirun.sh", "acco_adaptive.json", TINY),
    "ds_stock_mpiexec": _launcher("mpirun.sh", "zero1_baseline.json", TINY),
    "hf_streaming_deepspeed": _hf("deepspeed", "hf_trainer_streaming.json"),
    "hf_streaming_torchrun": _hf("torchrun", "hf_trainer_streaming.json"),
    "fsdp_acco_torchrun": _launcher("fsdp_torchrun.sh", "fsdp_acco.json", FSDP_TINY),
    "fsdp_acco_mpiexec": _launcher("fsdp_mpirun.sh", "fsdp_acco.json", FSDP_TINY),
}


def _spin() -> None:
    while True:
        pass


def _env() -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
           and not k.startswith(("PMI_", "OMPI_"))}
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONPATH"] = REPO + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def launch(case: str, timeout: float, extra: tuple = (), log: str | None = None) -> dict:
    """One launch of ``case`` (``extra``: more arguments for its training script; ``log``: where its whole output
    goes); never hangs (the launcher's process group is killed at ``timeout``)."""
    cmd = CASES[case](free_port()) + list(extra)
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=REPO, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        rc = "timeout"
    if log:
        with open(log, "w", encoding="utf-8") as f:
            f.write(out)
    abort = ABORT.search(out)
    return {"case": case, "rc": rc, "seconds": round(time.monotonic() - t0, 2), "abort": abort.group(0) if abort
            else None, "tail": out[-1500:] if rc != 0 or abort else ""}


def summarize(rows: list[dict], hog: int) -> str:
    lines = [f"clean exit under a CPU hog ({hog} busy loops on {os.cpu_count()} cores)", "",
             "| case | launches | non-zero exits | aborts seen | median s |", "|---|---|---|---|---|"]
    for case in dict.fromkeys(r["case"] for r in rows):
        mine = [r for r in rows if r["case"] == case]
        secs = sorted(r["seconds"] for r in mine)
        lines.append(f"| {case} | {len(mine)} | {sum(r['rc'] != 0 for r in mine)} | {sum(bool(r['abort']) for r in mine)}"
                     f" | {secs[len(secs) // 2]:.1f} |")
    bad = sum(r["rc"] != 0 or bool(r["abort"]) for r in rows)
    lines += ["", f"total: {len(rows)} launches, {bad} failed"]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--launches", type=int, default=200, help="launches in all, spread round-robin over the cases")
    p.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of: {', '.join(CASES)}")
    p.add_argument("--hog", type=int, default=os.cpu_count(), help="busy-loop processes (default: one per core)")
    p.add_argument("--timeout", type=float, default=300, help="seconds per launch before it counts as a hang")
    p.add_argument("--out", default="clean_exit_results")
    p.add_argument("--extra", default="", help="more arguments for every launch's training script (one string)")
    args = p.parse_args(argv)
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        p.error(f"--cases: unknown {unknown}; allowed: {', '.join(CASES)}")
    os.makedirs(args.out, exist_ok=True)
    hogs = [mp.Process(target=_spin, daemon=True) for _ in range(args.hog)]
    for h in hogs:
        h.start()
    rows = []
    try:
        with open(os.path.join(args.out, "launches.jsonl"), "w") as f:
            for i in range(args.launches):
                row = launch(cases[i % len(cases)], args.timeout, tuple(args.extra.split()),
                             log=os.path.join(args.out, f"launch_{i + 1}.log"))
                rows.append(row)
                f.write(json.dumps(row) + "\n")
                f.flush()
                flag = "" if row["rc"] == 0 and not row["abort"] else f"  FAILED ({row['abort'] or 'rc'})"
                print(f"[clean_exit] {i + 1}/{args.launches} {row['case']}: rc {row['rc']} in {row['seconds']} s{flag}",
                      flush=True)
    finally:
        for h in hogs:
            h.terminate()
    text = summarize(rows, args.hog)
    with open(os.path.join(args.out, "summary.md"), "w") as f:
        f.write(text + "\n")
    print(text)
    return 1 if any(r["rc"] != 0 or r["abort"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
