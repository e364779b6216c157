"""Emulated hosts on one machine: network namespaces joined by a bridge, tbf-shaped links, cgroup CPU quotas.

Imports nothing outside this folder and not torch: ``launchers/local_cluster.py`` starts in
milliseconds and the cluster can be torn down from any state (``cpu_probe``, the machine's speed before a run,
imports torch inside its function, when a sweep calls it).
"""
