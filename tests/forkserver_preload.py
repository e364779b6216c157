"""Imported once by the test workers' forkserver (tests/dist_harness.py): what a worker's first DeepSpeed engine
would otherwise import or load itself.

Why: a DeepSpeed engine's first build imports torch's compiler stack (DeepSpeed's Muon module and
``torch.optim``'s first optimizer reach ``torch._dynamo``/``torch._inductor``): 5-8 s of CPU per new worker
on a busy 2-core machine, against 0.1 s for the same job once warm. Imported here, every forked worker
has them. These imports start no thread (checked: the forkserver must stay single-threaded to fork).
And DeepSpeed's CPU communication backend loads its shared-memory all-reduce op in every process that
initialises it; each load runs ninja to check the build and imports the extension, seconds of CPU per
process (5-12 s per new pool on a busy 2-core machine). DeepSpeed keeps loaded ops in a class-level cache
(``OpBuilder._loaded_ops``), so loading them here once lets every forked worker find them there.
"""

import contextlib
import io

import deepspeed.runtime.engine  # noqa: F401
import deepspeed.runtime.zero.muon.muon_optimizer  # noqa: F401
import deepspeed.runtime.zero.stage_1_and_2  # noqa: F401
import torch._dynamo  # noqa: F401
import torch._inductor.compile_fx  # noqa: F401
from deepspeed.accelerator import get_accelerator

for _name in ("ShareMemCommBuilder",):
    _builder = get_accelerator().create_op_builder(_name)
    if _builder is not None:
        with contextlib.suppress(Exception), contextlib.redirect_stdout(io.StringIO()):
            _builder.load(verbose=False)  # a failure here only means the worker loads (or fails) it itself
