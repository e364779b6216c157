"""Run an unmodified DeepSpeed (or HF Trainer) script with ACCO taken from its config.

    python -m ds_acco.run train.py --deepspeed_config ds_configs/acco_fixed.json
    deepspeed --num_gpus 2 --module ds_acco.run train.py --deepspeed_config ds_configs/acco_fixed.json
    torchrun --nproc_per_node 2 -m ds_acco.run train.py ...
    mpiexec -n 2 python -m ds_acco.run train.py ...
    ds_acco-run train.py ...                      # the same, as an installed command

It installs :func:`ds_acco.patch_deepspeed` and then runs the script as ``__main__`` (``-m package.module`` runs a
module instead), so every call to ``deepspeed.initialize`` (including the one HF Accelerate makes for ``Trainer``)
builds an ACCO engine when the config has an enabled ``"acco"`` block, and a stock engine otherwise.
"""

from __future__ import annotations

import runpy
import sys


def _split_launcher_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """The deepspeed launcher puts ``--local_rank=N`` before the script; move it after."""
    leading = []
    while argv and argv[0].startswith("--local_rank"):
        leading.append(argv.pop(0))
        if leading[-1] == "--local_rank" and argv:
            leading.append(argv.pop(0))
    return argv, leading


def main(argv: list[str] | None = None) -> None:
    argv, launcher_args = _split_launcher_args(list(sys.argv[1:] if argv is None else argv))
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        raise SystemExit(0 if argv else 2)
    from ds_acco.comm.engine_lifecycle import EXIT_ORDER
    from ds_acco.deepspeed.initialize import patch_deepspeed

    patch_deepspeed()
    # The runner owns the process: whoever created the default group (the script, HF Accelerate, DeepSpeed),
    # it is destroyed after the script, engines first (see ds_acco.comm.engine_lifecycle._ExitOrder).
    EXIT_ORDER.owns_default_group = True
    if argv[0] == "-m":
        if len(argv) < 2:
            raise SystemExit("ds_acco.run: -m needs a module name")
        sys.argv = [argv[1], *argv[2:], *launcher_args]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = [argv[0], *argv[1:], *launcher_args]
        runpy.run_path(argv[0], run_name="__main__")
    EXIT_ORDER.teardown()  # the script finished: tear down now, while everything it built is alive


if __name__ == "__main__":
    main()
