"""Benchmarks of ds_acco against stock DeepSpeed ZeRO-1 on an emulated cluster (``python -m benchmarks``).

Modules: :mod:`~benchmarks.cluster` (network namespaces, tc shaping, cgroup CPU
quotas; also ``launchers/local_cluster.py``; helpers in ``cluster_units`` and
``cluster_system``, which import nothing outside this folder), :mod:`~benchmarks.worker`
(train_lm plus memory and interface counters), :mod:`~benchmarks.configs` (the compared
DeepSpeed configs), :mod:`~benchmarks.runner` (sweeps), :mod:`~benchmarks.parse`
(result rows), :mod:`~benchmarks.analysis` (derived figures and targets),
:mod:`~benchmarks.streaming_report` (the streaming comparison),
:mod:`~benchmarks.memory` (analytic memory model), :mod:`~benchmarks.plots` (PNGs).
"""
