#!/bin/bash
# device call: wheels, env, CUDA tests, gpu_overlap, profiler trace, switch-interval variant
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
R=$OUT/r; mkdir -p $R
python3 -c "import torch, transformers, deepspeed, sys; print(sys.version, torch.__version__, transformers.__version__, deepspeed.__version__, torch.cuda.get_device_name(0))" 2>&1 | tail -1 | tee $R/env.txt
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv | tee -a $R/env.txt
echo "== gpu_overlap base $(date +%T)"
timeout 170 python3 -m benchmarks.gpu_overlap --out $R/base --configs acco_fixed,acco_lowbit_int4_fixed --repeats 2 --steps 30 --warmup 10 2>&1 | tail -8
echo "== switch 0.0005 $(date +%T)"
DS_EXP_SWITCH=0.0005 PYTHONPATH=$PWD/.devwork/site:$PYTHONPATH timeout 80 python3 -m benchmarks.gpu_overlap --out $R/swi --configs acco_lowbit_int4_fixed --repeats 1 --steps 30 --warmup 10 2>&1 | tail -4
echo "== profile $(date +%T)"
cfg=$R/prof_cfg.json; python3 -c "import json,sys; c=json.load(open('$R/base/acco_lowbit_int4_fixed_r0.json')); c['acco']['telemetry']['jsonl_path']='$R/prof.telemetry.jsonl'; json.dump(c,open('$cfg','w'))"
RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29533 PROF_START=14 PROF_STOP=16 PROF_OUT=$R/trace_int4.json \
  timeout 90 python3 .devwork/prof.py --model-size medium --seq-len 512 --steps 18 --eval-every 0 --no-progress --deepspeed_config $cfg > $R/prof.log 2>&1; tail -3 $R/prof.log
echo "== test_cuda $(date +%T)"
timeout 150 python3 -m pytest -q -x tests/test_cuda.py 2>&1 | tee $R/test_cuda.log | tail -15
echo "== done $(date +%T)"
cd $OUT && tar czf r.tgz r && rm -rf r && ls -la
