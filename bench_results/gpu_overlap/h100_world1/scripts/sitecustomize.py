import os, sys
_s = os.environ.get("DS_EXP_SWITCH")
if _s:
    sys.setswitchinterval(float(_s))
