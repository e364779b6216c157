"""Build the two DeepSpeed C++ ops the tests load, before the tests run (part of the set-up).

Why: DeepSpeed compiles its ops on first use (``~/.cache/torch_extensions``). On a fresh
2-core machine FusedAdam's CPU kernel takes about 70 s and the shared-memory all-reduce the
``deepspeed`` launcher's CPU ranks load about 35 s; inside the suite that time lands on
whichever test happens to load them first, behind its timeout. Built here, both at once,
every later load is a cache hit. ``python3 tests/build_deepspeed_ops.py [NAME ...]`` builds the ones named.
"""

from __future__ import annotations

import subprocess
import sys
import time

BUILDERS = {"fused_adam": "from deepspeed.ops.op_builder import FusedAdamBuilder as B",
            "deepspeed_shm_comm": "from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder as B"}


def main(argv=None) -> int:
    """Build the ops named in ``argv`` (default: both)."""
    names = list(argv if argv is not None else sys.argv[1:]) or list(BUILDERS)
    unknown = [n for n in names if n not in BUILDERS]
    if unknown:
        print(f"unknown op(s) {unknown}; allowed: {', '.join(BUILDERS)}", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    procs = {name: subprocess.Popen([sys.executable, "-c", f"{BUILDERS[name]}; B().load()"], stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True) for name in names}
    failed = 0
    for name, proc in procs.items():
        out, _ = proc.communicate()
        if proc.returncode:
            failed += 1
            print(f"building DeepSpeed's {name} failed (exit {proc.returncode}):\n{out[-3000:]}", file=sys.stderr)
    print(f"DeepSpeed ops {', '.join(names)}: {'built' if not failed else 'FAILED'} in {time.monotonic() - t0:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
