"""Benchmarks of ds_acco against stock DeepSpeed ZeRO-1 on an emulated cluster (``python -m ds_acco.bench``).

Modules: :mod:`~ds_acco.bench.cluster` (network namespaces, tc shaping, cgroup CPU
quotas; also ``launchers/local_cluster.py``; helpers in ``cluster_units`` and
``cluster_system``, which import nothing outside this folder), :mod:`~ds_acco.bench.worker`
(train_lm plus memory and interface counters), :mod:`~ds_acco.bench.configs` (the compared
DeepSpeed configs), :mod:`~ds_acco.bench.runner` (sweeps), :mod:`~ds_acco.bench.parse`
(result rows), :mod:`~ds_acco.bench.analysis` (derived figures and targets),
:mod:`~ds_acco.bench.streaming_report` (the streaming comparison),
:mod:`~ds_acco.bench.memory` (analytic memory model), :mod:`~ds_acco.bench.plots` (PNGs).
"""
