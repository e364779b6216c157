"""What several test modules share: the reference trajectories and how to compare with them, and a real
``deepspeed`` launch that never hangs. Test modules never import each other; they import this."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest
import torch

from ds_acco.reference import ReferenceRun, reference_trajectory
from tests import workloads as W
from tests.dist_harness import free_port

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

STEPS = 20
BF16_ATOL = 6e-3
"""How far a run with bf16 compute parameters and fp32 masters may drift from the fp32 reference in 8 steps."""


def reference(mode, world, G, steps=STEPS, clip=0.0, schedule=False, warmup=0, counts=None):
    model = W.make_model()
    run = ReferenceRun(W.ordered_params(model), W.reference_grad_fn(model), W.make_reference_optimizer,
                       world, make_scheduler=W.decay_schedule if schedule else None, clip=clip)
    return reference_trajectory(mode, run, steps, G, warmup_steps=warmup, counts=counts)


def assert_trajectories_equal(got, want, atol=2e-6, rtol=1e-5):
    assert len(got) == len(want)
    for t, (g_step, w_step) in enumerate(zip(got, want)):
        for g, w in zip(g_step, w_step):
            torch.testing.assert_close(g, w, atol=atol, rtol=rtol, msg=lambda m: f"step {t}: {m}")


def distance(got, want) -> float:
    """The largest absolute difference between two trajectories, over every step and parameter."""
    return max(float((g - w).abs().max()) for g_step, w_step in zip(got, want) for g, w in zip(g_step, w_step))


def assert_follows_rules(got, mode, world, G, steps, atol):
    """A run that cannot be exact (bf16 compute parameters) must still follow ``mode``'s rules: within ``atol``
    of its reference and at most half as far from it as from the other mode's (acco against sync: their
    references differ by 1.3e-2 on this job, so a tolerance that size could not tell them apart)."""
    want = reference(mode, world, G, steps=steps)
    other = reference("sync" if mode != "sync" else "acco", world, G, steps=steps)
    assert_trajectories_equal(got, want, atol=atol, rtol=0)
    assert distance(got, want) < 0.5 * distance(got, other), (distance(got, want), distance(got, other))


def run_group(cmd: list[str], env: dict, timeout: float, merge_stderr: bool = True) -> subprocess.CompletedProcess:
    """Run a launcher in a process group of its own, from the repository; past ``timeout`` the whole group (the
    ranks too) is killed and the test fails: a launch never hangs the suite."""
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{' '.join(cmd[:2])} did not finish within {timeout}s:\n{out[-4000:]}{(err or '')[-3000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def launch_deepspeed(script: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                             "MASTER_PORT")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=REPO)
    return run_group(["deepspeed", "--num_gpus", "2", "--master_port", str(free_port()), script, *args], env, timeout)
