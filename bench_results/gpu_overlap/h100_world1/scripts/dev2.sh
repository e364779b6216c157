#!/bin/bash
# device call 2: A/B of the forward gate (HEAD b3a79ef copy in .devwork/base vs working tree), then CUDA tests
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
R=$OUT/r; mkdir -p $R; NEW=$PWD; BASE=$PWD/.devwork/base
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv | tee $R/env.txt
A="--configs acco_fixed,acco_lowbit_int4_fixed --repeats 1 --steps 30 --warmup 10"
for i in 0 1; do
  echo "== base $i $(date +%T)"; (cd $BASE && timeout 100 python3 -m benchmarks.gpu_overlap --out $R/base$i $A 2>&1 | tail -3)
  echo "== new $i $(date +%T)"; (cd $NEW && timeout 100 python3 -m benchmarks.gpu_overlap --out $R/new$i $A 2>&1 | tail -3)
done
echo "== test_cuda $(date +%T)"
timeout 170 python3 -m pytest -q tests/test_cuda.py 2>&1 | tee $R/test_cuda.log | tail -8
echo "== done $(date +%T)"
cd $OUT && tar czf r.tgz r && rm -rf r && ls -la
