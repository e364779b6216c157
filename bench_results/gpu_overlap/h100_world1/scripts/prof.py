"""One-off: torch.profiler trace of optimizer steps PROF_START..PROF_STOP of examples.train_lm."""
import os, sys, gzip, shutil
sys.path.insert(0, os.getcwd())
import torch
from torch.profiler import profile, ProfilerActivity
import examples.train_metrics as tm
import examples.train_lm as tl
START, STOP, OUTF = int(os.environ["PROF_START"]), int(os.environ["PROF_STOP"]), os.environ["PROF_OUT"]
orig = tm.StepMeter.end_step
st = {"n": 0, "p": None}
def end_step(self):
    r = orig(self)
    st["n"] += 1
    if st["n"] == START:
        (torch.cuda.synchronize() if torch.cuda.is_available() else None)
        try:
            from torch._C._profiler import _ExperimentalConfig
            xc = _ExperimentalConfig(profile_all_threads=True, enable_cuda_sync_events=True)
        except Exception as e:
            print("no all-threads config", e, flush=True); xc = None
        st["p"] = profile(experimental_config=xc, activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else []))
        st["p"].__enter__()
    elif st["n"] == STOP and st["p"] is not None:
        (torch.cuda.synchronize() if torch.cuda.is_available() else None)
        st["p"].__exit__(None, None, None)
        st["p"].export_chrome_trace(OUTF)
        with open(OUTF, "rb") as a, gzip.open(OUTF + ".gz", "wb") as b:
            shutil.copyfileobj(a, b)
        os.remove(OUTF)
        print("trace written", flush=True)
    return r
tm.StepMeter.end_step = end_step
sys.exit(tl.cli(sys.argv[1:]))
