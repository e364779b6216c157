"""``launchers/local_cluster.py``: run a distributed command on N emulated hosts, then tear them down.

The command line of :class:`~benchmarks.cluster.hosts.LocalCluster`: parse the hosts' links,
quotas and pinning, start the command on every host, pass on the first failing host's exit
status, and remove namespaces and cgroups whatever ends the run (Ctrl-C, SIGTERM, a timeout).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Optional, Sequence

from .hosts import SUBNET, LocalCluster
from .system import PREFIX, clean_stale, missing_requirements
from .units import ClusterError, format_rate, parse_cpu_list, parse_delay, parse_host_map, parse_rate


class _Interrupted(BaseException):
    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _raise_interrupt(signum, _frame):
    raise _Interrupted(signum)


def build_parser():
    import argparse

    p = argparse.ArgumentParser(
        prog="local_cluster.py",
        description="Run a distributed command on N emulated hosts (network namespaces joined by a bridge, "
                    "tbf-shaped links, optional cgroup CPU quotas) and tear everything down afterwards.",
        epilog="example: python launchers/local_cluster.py --hosts 2 --rate 100mbit --cpu-quota host1=50 -- "
               "python -m examples.train_lm --deepspeed_config ds_configs/acco_adaptive.json --steps 20",
    )
    p.add_argument("--hosts", type=int, default=2, help="emulated hosts = ranks (default 2)")
    p.add_argument("--rate", default=None,
                   help="link rate per host and direction, tc units (100mbit, 1gbit); default unshaped")
    p.add_argument("--mtu", type=int, default=None,
                   help="MTU of every link in bytes (default 1500; 9000 emulates jumbo frames)")
    p.add_argument("--delay", default=None,
                   help="one-way latency host -> switch, e.g. 25ms (netem; where the kernel has none, a user-space "
                   "switch that holds each frame)")
    p.add_argument("--cpu-quota", action="append", default=[], metavar="hostI=PCT",
                   help="CPU quota of a host in percent of one CPU (cgroup cpu.cfs_quota_us); repeatable")
    p.add_argument("--cpus", action="append", default=[], metavar="hostI=LIST",
                   help="pin a host to CPUs, e.g. host0=0 host1=1 or host0=0:1; repeatable")
    p.add_argument("--pin", action="store_true", help="pin host i to CPU i mod (number of CPUs)")
    p.add_argument("--no-netns", action="store_true",
                   help="loopback mode: no namespaces, no shaping (for machines without root or iproute2)")
    p.add_argument("--log-dir", default=None, help="per-host logs host<i>.log (default: a new folder in /tmp)")
    p.add_argument("--quiet", action="store_true", help="do not copy host output to the console")
    p.add_argument("--timeout", type=float, default=None, help="stop every host after this many seconds (exit 124)")
    p.add_argument("--port", type=int, default=None, help="MASTER_PORT (default: chosen)")
    p.add_argument("--stats-json", default=None, help="write hosts, exit codes and interface counters here")
    p.add_argument("--prefix", default=PREFIX, help=f"name prefix of namespaces and cgroups (default {PREFIX})")
    p.add_argument("--clean", action="store_true", help="only remove stale resources of dead launchers, then exit")
    p.add_argument("command", nargs="*", help="the command to run on every host (after --)")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if args.clean:
        if os.geteuid() != 0:
            print("local_cluster.py: --clean needs root", file=sys.stderr)
            return 2
        clean_stale(args.prefix)
        return 0
    if not args.command:
        print("local_cluster.py: give the command to run after --, e.g. -- python -m examples.train_lm ...",
              file=sys.stderr)
        return 2
    try:
        rate, delay = parse_rate(args.rate), parse_delay(args.delay)
        quota = parse_host_map(args.cpu_quota, args.hosts, "--cpu-quota", float)
        cpus = parse_host_map(args.cpus, args.hosts, "--cpus", parse_cpu_list)
        if args.pin:
            n = os.cpu_count() or 1
            cpus = {i: cpus.get(i, (i % n,)) for i in range(args.hosts)}
        log_dir = args.log_dir or os.path.join("/tmp", f"local_cluster_{os.getpid()}")
        cluster = LocalCluster(args.hosts, rate=rate, delay=delay, cpu_quota=quota, cpus=cpus,
                               netns=not args.no_netns, log_dir=log_dir, echo=None if args.quiet else sys.stdout,
                               prefix=args.prefix, master_port=args.port, mtu=args.mtu)
    except ValueError as exc:
        print(f"local_cluster.py: {exc}", file=sys.stderr)
        return 2
    problems = missing_requirements(cluster.netns, bool(quota))
    if problems:
        print("local_cluster.py: " + "; ".join(problems), file=sys.stderr)
        return 2

    handlers = {s: signal.signal(s, _raise_interrupt) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    rc = 1
    try:
        cluster.setup()
        desc = (f"{args.hosts} host(s) on {SUBNET}.0/24, link {format_rate(rate)}"
                + (f", delay {args.delay}" if delay else "") + (f", MTU {args.mtu}" if args.mtu else "") if cluster.netns else f"{args.hosts} host(s) on loopback")
        if quota:
            desc += ", CPU quota " + ", ".join(f"host{i}={q:g}%" for i, q in sorted(quota.items()))
        print(f"[local_cluster] {desc}; logs in {log_dir}", file=sys.stderr, flush=True)
        cluster.launch(args.command)
        rc = cluster.wait(timeout=args.timeout)
    except _Interrupted as exc:
        rc = 128 + exc.signum
        print(f"[local_cluster] interrupted by signal {exc.signum}; tearing down", file=sys.stderr, flush=True)
    except ClusterError as exc:
        rc = 2
        print(f"local_cluster.py: {exc}", file=sys.stderr, flush=True)
    finally:
        # No second Ctrl-C may cut the teardown short.
        signal.pthread_sigmask(signal.SIG_BLOCK, set(handlers))
        try:
            if cluster.started_at is not None and cluster.wall_s is None:
                cluster.stop(grace_s=3.0)
                for h, p in zip(cluster.hosts, cluster._procs):
                    if p is not None and h.exit_code is None:
                        h.exit_code = p.poll()
                    h.counters_end = cluster.read_counters(h)
            if args.stats_json:
                stats = cluster.stats(args.command)
                stats["exit_code"] = rc
                os.makedirs(os.path.dirname(os.path.abspath(args.stats_json)), exist_ok=True)
                with open(args.stats_json, "w", encoding="utf-8") as f:
                    json.dump(stats, f, indent=1)
        finally:
            problems = cluster.teardown()
            for msg in problems:
                print(f"[local_cluster] teardown: {msg}", file=sys.stderr, flush=True)
            for s, h in handlers.items():
                signal.signal(s, h)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, set(handlers))
    if rc:
        print(f"[local_cluster] exit status {rc}", file=sys.stderr, flush=True)
    return rc
