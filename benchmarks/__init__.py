"""Benchmarks of ds_acco on an emulated cluster: ``python -m benchmarks --help``.

Not part of the installed package (``pip install .`` ships ``ds_acco`` alone); run from a
checkout. Folders: ``cluster/`` (emulated hosts: network namespaces, tc-shaped links, cgroup CPU
quotas; also ``launchers/local_cluster.py``), ``sweep/`` (what runs: configs, workloads, the one
sweep driver for the DeepSpeed and FSDP2 front ends, parsing a run's files), ``report/`` (derived
figures, targets, tables and plots), ``memory/`` (the analytic memory model and its
measurements); ``checkpoint_cost.py`` and ``soak.py`` are benchmarks of their own. May import
``ds_acco`` and ``examples``; nothing imports it but its own CLI and the tests.
"""
