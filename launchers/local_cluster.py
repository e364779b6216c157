#!/usr/bin/env python3
"""Run a distributed command on N emulated hosts on this machine; see ds_acco/bench/cluster.py.

    python launchers/local_cluster.py --hosts 2 --rate 100mbit [--delay 1ms] [--cpu-quota host1=50] \
        -- python -m ds_acco.examples.train_lm --deepspeed_config ds_configs/acco_adaptive.json --steps 20

Every host is a network namespace with one veth to a bridge (in a namespace of its
own), shaped with tc tbf at --rate in both directions; --cpu-quota puts a host in a
cgroup-v1 cpu group (percent of one CPU). Each host gets RANK, WORLD_SIZE, LOCAL_RANK=0,
MASTER_ADDR (host0, 10.77.0.1), MASTER_PORT and GLOO_SOCKET_IFNAME=eth0. Needs root and
iproute2 (ip, tc); --no-netns runs on loopback instead. Exits with the first failing
host's status; namespaces, veths and cgroups are removed on exit, on Ctrl-C/SIGTERM and
on failure (and stale ones from a killed launcher at the next start).
"""

import importlib.util
import os
import sys

if __name__ == "__main__":
    # Load ds_acco/bench as a package of its own, by path: importing the ds_acco package
    # would import torch (seconds). The cluster modules import nothing outside the folder.
    bench = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "ds_acco", "bench")
    spec = importlib.util.spec_from_file_location("_ds_acco_bench", os.path.join(bench, "__init__.py"),
                                                  submodule_search_locations=[bench])
    package = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = package  # dataclasses and relative imports look modules up by name
    spec.loader.exec_module(package)
    cluster = importlib.import_module("_ds_acco_bench.cluster")
    sys.exit(cluster.main())
