#!/usr/bin/env python3
"""Run a distributed command on N emulated hosts on this machine; see benchmarks/cluster/.

    python launchers/local_cluster.py --hosts 2 --rate 100mbit [--delay 1ms] [--cpu-quota host1=50] \
        -- python -m examples.train_lm --deepspeed_config ds_configs/acco_adaptive.json --steps 20

Every host is a network namespace with one veth to a bridge (in a namespace of its
own), shaped with tc tbf at --rate in both directions; --cpu-quota puts a host in a
cgroup-v1 cpu group (percent of one CPU); --delay adds one-way latency (netem, or a
user-space switch in place of the bridge where the kernel has no netem). Each host gets RANK, WORLD_SIZE, LOCAL_RANK=0,
MASTER_ADDR (host0, 10.77.0.1), MASTER_PORT and GLOO_SOCKET_IFNAME=eth0. Needs root and
iproute2 (ip, tc); --no-netns runs on loopback instead. Exits with the first failing
host's status; namespaces, veths and cgroups are removed on exit, on Ctrl-C/SIGTERM and
on failure (and stale ones from a killed launcher at the next start).
"""

import os
import sys

if __name__ == "__main__":
    # The cluster modules import nothing outside benchmarks/ (not torch: seconds saved per launch).
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from benchmarks.cluster import cli

    sys.exit(cli.main())
