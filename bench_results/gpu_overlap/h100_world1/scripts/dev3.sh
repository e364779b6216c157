#!/bin/bash
# device call 3: forward gate (closed from launch to the next forward's end) A/B against HEAD b3a79ef, then its CUDA test
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
R=$OUT/r; mkdir -p $R; NEW=$PWD; BASE=$PWD/.devwork/base
A="--configs acco_fixed,acco_lowbit_int4_fixed --repeats 1 --steps 30 --warmup 10"
pack() { (cd $OUT && tar czf r.tgz r); }
for v in new0 base0 new1; do
  case $v in base*) D=$BASE;; *) D=$NEW;; esac
  echo "== $v $(date +%T)"; (cd $D && timeout 80 python3 -m benchmarks.gpu_overlap --out $R/$v $A 2>&1 | tail -3); pack
done
echo "== test_cuda $(date +%T)"
timeout 60 python3 -m pytest -q tests/test_cuda.py -k large_buffers 2>&1 | tee $R/test_cuda_gate.log | tail -4; pack
echo "== done $(date +%T)"
