#!/bin/bash
# one device call: A/B of torch's fused Adam kernel in a round (HEAD copy in .devwork/base vs working tree),
# a profile of the new tree's acco_fixed rounds, then the CUDA tests
cd "$(dirname "$0")/.."
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
R=$OUT/r; mkdir -p $R
python3 -c "import torch, transformers, deepspeed, sys; print(sys.version.split()[0], torch.__version__, transformers.__version__, deepspeed.__version__, torch.cuda.get_device_name(0))" 2>&1 | tail -1 | tee $R/env.txt
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv | tee -a $R/env.txt
B=$PWD/.devwork/base
echo "== ab fixed $(( $(date +%s) - T0 )) s"
timeout 215 python3 -m benchmarks.gpu_overlap --out $R/ab_fixed --configs acco_fixed --repeats 2 --steps 30 --warmup 10 --baseline $B --profile 14:16 2>&1 | tee $R/ab_fixed.out | tail -9
echo "== ab int4 $(( $(date +%s) - T0 )) s"
timeout 100 python3 -m benchmarks.gpu_overlap --out $R/ab_int4 --configs acco_lowbit_int4_fixed --repeats 1 --steps 30 --warmup 10 --baseline $B 2>&1 | tee $R/ab_int4.out | tail -5
echo "== test_cuda $(( $(date +%s) - T0 )) s"
timeout 150 python3 -m pytest -q tests/test_cuda.py 2>&1 | tee $R/test_cuda.log | tail -15
echo "== done $(( $(date +%s) - T0 )) s"
rm -f $R/*/*.trace.json.gz.tmp
cd $OUT && tar czf r.tgz r && rm -rf r && ls -la
