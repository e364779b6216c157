"""Real 2-process launches of examples.train_lm through launchers/, train_lm's scenarios on pooled ranks, and the
configs.

Each launcher script starts one training run (a module-scoped fixture that several tests read): a launch costs
seconds of CPU on every rank for imports alone, and what it proves is the launcher's part (the ranks it starts,
their variables, exit statuses, DeepSpeed's shared-memory segments). What a config or a train_lm option does
(a resume, a slow rank's clock) is train_lm's and the engine's, and is checked on pooled ranks running train_lm's
own ``main`` (tests/launcher_checks.py). Launches run the tiny model for a few optimizer steps with
OMP_NUM_THREADS=1, on a free port, in their own process group with a hard timeout (the whole group is killed if it
hangs). Assertions are on the numbers a run reports: rank 0's summary line and the per-step JSONL log.
"""

from __future__ import annotations

import copy
import glob
import json
import os
import shutil
import subprocess
import sys

import pytest

from tests import launcher_checks as C
from tests.dist_harness import run_distributed
from tests.launcher_checks import CONFIGS, LAUNCHERS, LN_VOCAB, REPO, STEPS, SUMMARY, TRAIN_ARGS

OWN_CONFIGS = {"zero1_baseline", "zero1_overlap", "acco_fixed", "acco_adaptive", "dpu", "acco_bf16", "zero1_bf16",
               "streaming_int8", "acco_lowbit", "acco_lowbit_bf16"}


def _pooled_train_lm(config: str, *args: str) -> list:
    """train_lm on two pooled ranks; both ranks' output, rank 0's first."""
    runs = run_distributed(C.train_lm_on_rank, 2, argv=["--deepspeed_config", config, *args], timeout=300)
    assert [r["code"] for r in runs] == [0, 0], runs
    return runs


# --------------------------------------------------------------------------- one training launch per launcher


@pytest.fixture(scope="module")
def deepspeed_local_launch(tmp_path_factory):
    """The streaming config with a short sync window (fragment 0 syncs at steps 4, 8; fragment 1 at 2, 6), saved."""
    tmp = tmp_path_factory.mktemp("deepspeed_local")
    config = C.streaming_config(tmp / "streaming.json", sync_every=4, overlap_steps=1)
    run = C.train_launch("deepspeed_local.sh", config, tmp, "--save-dir", str(tmp / "ckpt"))
    return dict(run, ckpt=tmp / "ckpt", min_rounds=STEPS // 2 - 1)  # a round each 2 steps; the last is in flight


@pytest.fixture(scope="module")
def torchrun_launch(tmp_path_factory):
    return C.train_launch("torchrun.sh", os.path.join(CONFIGS, "acco_adaptive.json"),
                         tmp_path_factory.mktemp("torchrun"))


@pytest.mark.parametrize("launcher", ["deepspeed_local", "torchrun"])
def test_launcher_trains_two_ranks(launcher, request):
    """The launcher starts two ranks that find each other from its variables alone (script path and --local_rank,
    torchrun's environment, MPI discovery), and DeepSpeed's segments do not outlive them."""
    run = request.getfixturevalue(f"{launcher}_launch")
    s = C.summary(run["result"])
    # DeepSpeed's CPU shared-memory segments (66 MB per rank) do not outlive the job (ds_acco.deepspeed.shm)
    assert run["leftover_segments"] == [], run["leftover_segments"]
    C.check_trained(s, run["log"], run["config"], min_rounds=run.get("min_rounds", STEPS))


@pytest.mark.parametrize("config", ["acco_lowbit.json"])
def test_train_lm_trains_two_pooled_ranks(config, tmp_path):
    """Configs no launch runs: low-bit ACCO (int8 reduce-scatter and all-gather, error feedback)."""
    log = tmp_path / "steps.jsonl"
    runs = _pooled_train_lm(os.path.join(CONFIGS, config), *TRAIN_ARGS, "--log-jsonl", str(log))
    s = C.summary_of(0, runs[0]["stdout"] + runs[1]["stdout"])  # one summary line: rank 0's
    C.check_trained(s, log, os.path.join(CONFIGS, config))


def test_streaming_launch_logs_its_rounds_and_writes_its_checkpoint(deepspeed_local_launch):
    """ds_acco's log lines and the checkpoint's files as a launched job leaves them (rank 0 alone logs)."""
    launched = deepspeed_local_launch["result"]
    first = C.summary(launched)
    assert first["steps"] == STEPS and first["hidden"] is not None
    # telemetry.log_every = 4 in the config: round 0 (fragment 1, launched at step 2) is logged by rank 0 only
    lines = [line for line in launched.stdout.splitlines() if "[ds_acco] round 0 " in line]
    assert len(lines) == 1 and "fragment 1" in lines[0] and "hidden" in lines[0], launched.stdout[-3000:]
    assert sorted(os.listdir(deepspeed_local_launch["ckpt"] / f"global_step{STEPS}")) == [
        "acco_streaming_state_dp_rank_0.pt", "acco_streaming_state_dp_rank_1.pt", "ds_acco_manifest.json",
        "mp_rank_00_model_states.pt"]


def test_a_launched_streaming_checkpoint_resumes(deepspeed_local_launch, tmp_path):
    """train_lm --resume on pooled ranks, from the checkpoint the deepspeed launch wrote: the data stream and the
    fragment round in flight at the save go on."""
    first = C.summary(deepspeed_local_launch["result"])
    ckpt, log = tmp_path / "ckpt", tmp_path / "steps.jsonl"
    shutil.copytree(deepspeed_local_launch["ckpt"], ckpt)
    runs = _pooled_train_lm(deepspeed_local_launch["config"], "--model-size", "tiny", "--seq-len", "64",
                            "--eval-every", "0", "--no-progress", "--save-dir", str(ckpt), "--steps", str(STEPS + 4),
                            "--resume", "--log-jsonl", str(log))
    out = runs[0]["stdout"] + runs[1]["stdout"]
    assert "resumed" in out and f"at step {STEPS}" in out, out[-3000:]
    second = C.summary_of(0, out)
    assert second["steps"] == STEPS + 4 and second["loss"] < first["loss"] < LN_VOCAB, (first, second)
    summary = [json.loads(line) for line in log.read_text().splitlines()][-1]["acco"]
    # merged after the resume: step 8's round (due at 9) and step 10's (due at 11); step 12's is in flight
    assert summary["rounds"] >= 2 and summary["bytes_sent"] > 0
    assert 0 < summary["peak_round_bytes"] <= summary["bytes_sent"]


def test_a_validation_is_stamped_with_the_slowest_ranks_clock(tmp_path):
    """Streaming ranks run free between fragment rounds (none in these 6 steps: H = 40), so rank 0 runs far ahead of
    rank 1 (150 ms more per micro-batch) and waits for it inside the validation at step 4, off its training clock.
    The loss scored there is both replicas at step 4, which exists once rank 1 gets there: its time is rank 1's
    clock, the figure benchmarks read as seconds to a loss (rank 0's put streaming with a slow host at 0.43x sync
    low-bit's time, 0.93x measured right)."""
    config, log = C.streaming_config(tmp_path / "streaming.json", sync_every=40), tmp_path / "steps.jsonl"
    runs = _pooled_train_lm(config, "--model-size", "tiny", "--seq-len", "64", "--steps", "6", "--eval-every", "4",
                            "--eval-batches", "2", "--no-progress", "--compute-delay-ms", "0,150",
                            "--log-jsonl", str(log))
    C.summary_of(0, runs[0]["stdout"] + runs[1]["stdout"])
    steps = {r["step"]: r for r in map(json.loads, log.read_text().splitlines()) if "step" in r}
    assert "val_loss" in steps[4] and steps[4]["val_train_s"] >= 16 * 0.150, steps[4]  # rank 1: 16 sleeps by step 4
    assert steps[4]["train_s"] < 0.5 * 16 * 0.150, steps[4]  # rank 0's own clock (the curve's): far ahead of rank 1


# --------------------------------------------------------------------------- launches that do not train


def test_failing_workers_fail_the_launch():
    """deepspeed runner -> launch.py -> workers: the longest chain an exit status travels (the workers fail at
    argument parsing, before importing torch: test_an_argument_error_imports_nothing_heavy)."""
    result = C.launch("deepspeed_local.sh", "ds_configs/zero1_baseline.json", "--steps", "-1", timeout=120)
    assert result.returncode != 0, result.stdout[-3000:]
    assert "--steps: must be >= 1, got -1" in result.stdout, result.stdout[-3000:]
    assert not SUMMARY.search(result.stdout)


def test_an_argument_error_imports_nothing_heavy():
    """A fresh interpreter: what a rank imports before an argument error ends it (pooled ranks hold torch already)."""
    probe = ("import runpy, sys\n"
             "sys.argv = ['train_lm', '--deepspeed_config', 'ds_configs/zero1_baseline.json', '--steps', '-1']\n"
             "try:\n    runpy.run_module('examples.train_lm', run_name='__main__')\n"
             "except SystemExit as exc:\n"
             "    heavy = ('torch', 'deepspeed', 'transformers')\n"
             "    print('exit', exc.code, sorted(m for m in heavy if m in sys.modules))\n")
    proc = subprocess.run([sys.executable, "-c", probe], cwd=REPO, env=C.clean_env(), capture_output=True, text=True,
                          timeout=60)
    assert "--steps: must be >= 1, got -1" in proc.stderr, proc.stderr[-3000:]
    assert proc.stdout.strip() == "exit 2 []", proc.stdout + proc.stderr[-3000:]


@pytest.mark.parametrize("launcher", ["deepspeed_local.sh", "torchrun.sh", "mpirun.sh", "fsdp_torchrun.sh",
                                      "fsdp_mpirun.sh", "slurm.sbatch"])
def test_launcher_help(launcher):
    """Each script's usage text, and exit status 2 without a config: what bash does with the script itself."""
    result = subprocess.run(["bash", os.path.join(LAUNCHERS, launcher), "-h"], capture_output=True, text=True,
                            timeout=30)
    assert result.returncode == 0 and "usage:" in result.stdout, result.stdout + result.stderr
    missing = subprocess.run(["bash", os.path.join(LAUNCHERS, launcher)], capture_output=True, text=True,
                             timeout=30)
    assert missing.returncode == 2 and "usage:" in missing.stdout + missing.stderr


# --------------------------------------------------------------------------- scripts


def test_shell_scripts_parse():
    """bash -n on every script: a syntax error in a branch no launch takes fails here."""
    for path in glob.glob(os.path.join(LAUNCHERS, "*.sh")) + [os.path.join(LAUNCHERS, "slurm.sbatch")]:
        result = subprocess.run(["bash", "-n", path], capture_output=True, text=True, timeout=30)
        assert result.returncode == 0, f"{path}: {result.stderr}"


FAKE_SLURM = {
    "srun": '#!/usr/bin/env bash\nwhile [[ $# -gt 0 && "$1" == --* ]]; do shift; done\nSLURM_NODEID=1 exec "$@"\n',
    "scontrol": "#!/usr/bin/env bash\nprintf 'node-a\\nnode-b\\n'\n",
    "torchrun": '#!/usr/bin/env bash\nprintf "%s\\n" torchrun "$@"\n',
    "deepspeed": '#!/usr/bin/env bash\nprintf "%s\\n" deepspeed "$@"\n',
}


@pytest.mark.parametrize("launcher", ["torchrun", "deepspeed"])
def test_slurm_template_dry_run(launcher, tmp_path):
    """slurm.sbatch against stub srun/scontrol/torchrun/deepspeed: the command it would run (bash runs the
    template; no Slurm here)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in FAKE_SLURM.items():
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)
    env = dict(C.clean_env(), PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", LAUNCHER=launcher,
               SLURM_JOB_ID="4242", SLURM_JOB_NODELIST="node-[a-b]", SLURM_JOB_NUM_NODES="2",
               SLURM_SUBMIT_DIR=str(tmp_path), GPUS_PER_NODE="4")
    result = subprocess.run(["bash", os.path.join(LAUNCHERS, "slurm.sbatch"), "ds_configs/acco_fixed.json",
                             "--steps", "3", "--log-jsonl", "a b.jsonl"],
                            env=env, capture_output=True, text=True, timeout=30, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    argv = result.stdout.splitlines()[1:]  # first line: the job banner
    assert argv[0] == launcher
    assert argv[-6:] == ["--deepspeed_config", "ds_configs/acco_fixed.json", "--steps", "3", "--log-jsonl",
                         "a b.jsonl"]
    if launcher == "torchrun":
        assert argv[1:5] == ["--nnodes", "2", "--nproc_per_node", "4"]
        assert "node-a:29500" in argv and "examples.train_lm" in argv
    else:
        hostfile = tmp_path / "hostfile.4242"
        assert hostfile.read_text().split("\n")[:2] == ["node-a slots=4", "node-b slots=4"]
        assert argv[1:7] == ["--hostfile", str(hostfile), "--no_ssh", "--node_rank", "1", "--master_addr"]
        assert "examples/train_lm.py" in argv


# --------------------------------------------------------------------------- configs


HF_FILLS = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 4, "gradient_clipping": 1.0,
            "bf16.enabled": False, "optimizer.params.lr": 1e-3, "optimizer.params.weight_decay": 0.0}
"""The "auto" values HF Trainer fills from its TrainingArguments (transformers' ``trainer_config_process``)."""


def _fill_hf_auto(cfg):
    """What HF Trainer and Accelerate do to "auto" values before DeepSpeed sees them: Accelerate's own
    ``deepspeed_config_process`` fills those it is given and refuses any other ("... not found in kwargs")."""
    from accelerate.utils import DeepSpeedPlugin

    if "auto" not in _leaf_values(cfg):  # a file for DeepSpeed or FSDP directly (FSDP's has no ZeRO block)
        return cfg
    plugin = DeepSpeedPlugin(hf_ds_config=copy.deepcopy(cfg))
    plugin.deepspeed_config_process(must_match=False, **HF_FILLS)
    return plugin.deepspeed_config


def _leaf_values(node):
    if isinstance(node, dict):
        return [v for child in node.values() for v in _leaf_values(child)]
    return [node]


def test_config_files(monkeypatch):
    import deepspeed.comm
    from deepspeed.runtime.config import DeepSpeedConfig

    import ds_acco
    from ds_acco.deepspeed.checks import check_ds_config, resolve_scheduler_warmup

    paths = sorted(glob.glob(os.path.join(CONFIGS, "*.json")))
    names = {os.path.splitext(os.path.basename(p))[0] for p in paths}
    assert OWN_CONFIGS <= names, OWN_CONFIGS - names
    # DeepSpeedConfig asks deepspeed.comm for the world size; pretend to be rank 0 of 2.
    monkeypatch.setattr(deepspeed.comm, "get_rank", lambda *a, **k: 0)
    monkeypatch.setattr(deepspeed.comm, "get_world_size", lambda *a, **k: 2)
    for path in paths:
        with open(path) as f:
            raw = json.load(f)
        name = os.path.basename(path)
        assert "train_batch_size" not in raw, f"{name}: set micro batch and accumulation, not the global batch"
        # HF Trainer's Accelerate refuses an "auto" it cannot fill ("acco.mode not found in kwargs"): every shipped
        # acco block works under it (mode/policy auto are spelled "fastest")
        assert "auto" not in _leaf_values(raw.get("acco")), f"{name}: an 'auto' value in the acco block"
        cfg = _fill_hf_auto(raw)
        block = cfg.get("acco")
        backend = block.get("backend", "deepspeed") if isinstance(block, dict) else "deepspeed"
        if isinstance(block, dict) and "backend" not in ds_acco.AccoConfig.model_fields:
            block = {k: v for k, v in block.items() if k != "backend"}  # read by the front end, not AccoConfig
        # "warmup_steps": "scheduler" is read from the scheduler block by the DeepSpeed front end
        acco = ds_acco.parse_acco_config(resolve_scheduler_warmup(cfg, block) if backend == "deepspeed" else block)
        ds = DeepSpeedConfig(cfg)
        assert ds.world_size == 2, name
        assert ds.train_batch_size == ds.train_micro_batch_size_per_gpu * ds.gradient_accumulation_steps * 2, name
        if backend == "deepspeed":
            assert ds.zero_optimization_stage == (0 if acco.enabled and acco.mode == "streaming" else 1), name
        if acco.enabled and backend == "deepspeed":
            check_ds_config(cfg, acco)
        elif acco.enabled:
            acco.check_accumulation(ds.gradient_accumulation_steps)
        if os.path.splitext(name)[0] in OWN_CONFIGS:
            assert (ds.train_micro_batch_size_per_gpu, ds.gradient_accumulation_steps) == (4, 4), name
            assert ds.gradient_clipping == 1.0, name
            assert raw["optimizer"]["params"].get("torch_adam") is True, f"{name}: would JIT-build FusedAdam"
            assert raw["scheduler"]["type"] == "WarmupLR", name
            assert ds.bfloat16_config.enabled == ("bf16" in name), name
            assert acco.enabled == name.startswith(("acco_", "dpu", "streaming")), name


def test_model_size_choices_match_models():
    """train_lm lists the sizes itself (importing models.py means importing transformers,
    seconds before argparse could reject a typo); read SIZES from the source to compare."""
    import ast

    from examples import train_lm

    tree = ast.parse(open(os.path.join(REPO, "examples", "models.py")).read())
    sizes = next(node.value for node in tree.body if isinstance(node, ast.Assign)
                 and any(getattr(t, "id", None) == "SIZES" for t in node.targets))
    assert tuple(train_lm.MODEL_SIZES) == tuple(ast.literal_eval(k) for k in sizes.keys)


def test_deepspeed_arguments_match_deepspeeds():
    """train_lm writes out deepspeed.add_config_arguments (importing deepspeed means importing torch, seconds on
    every rank before argparse could reject a typo): the same group, the same arguments."""
    import argparse

    import deepspeed

    from examples import train_lm

    def described(parser):
        group = next(g for g in parser._action_groups if g.title == "DeepSpeed")
        return group.description, [(a.option_strings, a.dest, a.default, a.type, a.const, a.nargs, a.help)
                                   for a in group._group_actions]

    ours, theirs = argparse.ArgumentParser(), argparse.ArgumentParser()
    train_lm.add_deepspeed_arguments(ours)
    deepspeed.add_config_arguments(theirs)
    assert described(ours) == described(theirs)
    assert len(described(ours)[1]) == 4


def test_train_lm_rejects_bad_arguments():
    from examples import train_lm

    with pytest.raises(SystemExit):
        train_lm.parse_args(["--deepspeed_config", os.path.join(CONFIGS, "zero1_baseline.json"), "--steps", "0"])
    with pytest.raises(SystemExit):
        train_lm.parse_args(["--deepspeed_config", os.path.join(CONFIGS, "zero1_baseline.json"), "--resume"])
    args = train_lm.parse_args(["--deepspeed", "--deepspeed_config", os.path.join(CONFIGS, "dpu.json"),
                                "--local_rank=1", "--compute-delay-ms", "0,20"])
    assert args.deepspeed and args.local_rank == 1 and args.compute_delay_ms == [0.0, 20.0]
