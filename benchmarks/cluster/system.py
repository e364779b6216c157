"""System plumbing of the emulated cluster: commands, namespaces, cgroups, stale-resource cleanup.

Every resource the cluster creates is named ``<prefix>_<owner pid>_<role>``, so
:func:`clean_stale` can tell a live cluster's resources from those of a launcher
that was SIGKILLed and could not clean up after itself.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from typing import IO, Optional, Sequence

from .units import ClusterError

PREFIX = "dsacco"
CPU_CGROUP_ROOT = "/sys/fs/cgroup/cpu"


def run_command(cmd: Sequence[str], check: bool = True, timeout: float = 30.0) -> subprocess.CompletedProcess:
    proc = subprocess.run(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise ClusterError(f"`{' '.join(cmd)}` failed ({proc.returncode}): {proc.stderr.strip() or proc.stdout.strip()}")
    return proc


def missing_requirements(netns: bool = True, need_cgroup: bool = False) -> list[str]:
    """What this machine lacks for a cluster of the given kind (empty: nothing)."""
    problems = []
    needs_root = netns or need_cgroup
    if needs_root and os.geteuid() != 0:
        problems.append("root is required (network namespaces, tc and cgroups); run as root, or use "
                        "--no-netns (loopback, no shaping, no CPU quota)")
    if netns:
        for tool in ("ip", "tc"):
            if shutil.which(tool) is None:
                problems.append(f"`{tool}` not found: install iproute2 (apt-get install -y iproute2)")
    if need_cgroup and not os.path.isfile(os.path.join(CPU_CGROUP_ROOT, "cpu.cfs_quota_us")):
        problems.append(f"no cgroup-v1 cpu controller at {CPU_CGROUP_ROOT} (needed for a CPU quota)")
    return problems


def netns_available() -> bool:
    """True when this process can build namespaced clusters (root, ``ip`` and ``tc`` present)."""
    return not missing_requirements(netns=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _netns_list() -> list[str]:
    if shutil.which("ip") is None:
        return []
    out = run_command(["ip", "netns", "list"], check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _kill_pids(pids: Sequence[int], sig: int = signal.SIGKILL) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _netns_pids(ns: str) -> list[int]:
    out = run_command(["ip", "netns", "pids", ns], check=False).stdout
    return [int(p) for p in out.split() if p.isdigit()]


def delete_netns(ns: str) -> Optional[str]:
    _kill_pids(_netns_pids(ns))
    proc = run_command(["ip", "netns", "del", ns], check=False)
    return None if proc.returncode == 0 else f"ip netns del {ns}: {proc.stderr.strip()}"


def link_state(ns: str, dev: str) -> str:
    proc = run_command(["ip", "-n", ns, "-j", "link", "show", "dev", dev], check=False)
    try:
        return json.loads(proc.stdout)[0].get("operstate", "?")
    except (ValueError, LookupError):
        return "missing"


def remove_cgroup(path: str, attempts: int = 50) -> Optional[str]:
    if not os.path.isdir(path):
        return None
    for _ in range(attempts):
        try:
            with open(os.path.join(path, "cgroup.procs")) as f:
                _kill_pids([int(p) for p in f.read().split()])
            os.rmdir(path)
            return None
        except FileNotFoundError:
            return None
        except OSError:
            time.sleep(0.1)  # tasks still exiting
    return f"could not remove cgroup {path}"


def _owner_pid(name: str, prefix: str) -> Optional[int]:
    m = re.fullmatch(rf"{re.escape(prefix)}_(\d+)_\w+", name)
    return int(m.group(1)) if m else None


def clean_stale(prefix: str = PREFIX, log: IO = sys.stderr) -> list[str]:
    """Delete namespaces and cgroups named ``<prefix>_<pid>_*`` whose ``pid`` is gone.

    Resources of a live launcher (another cluster running right now) are left alone.
    Returns the names removed.
    """
    removed = []
    for ns in _netns_list():
        pid = _owner_pid(ns, prefix)
        if pid is not None and not _pid_alive(pid):
            err = delete_netns(ns)
            if err:
                print(f"[local_cluster] stale namespace {ns}: {err}", file=log)
            else:
                removed.append(ns)
    if os.path.isdir(CPU_CGROUP_ROOT) and os.geteuid() == 0:
        for name in os.listdir(CPU_CGROUP_ROOT):
            pid = _owner_pid(name, prefix)
            if pid is not None and not _pid_alive(pid):
                err = remove_cgroup(os.path.join(CPU_CGROUP_ROOT, name))
                if err:
                    print(f"[local_cluster] {err}", file=log)
                else:
                    removed.append(name)
    if removed:
        print(f"[local_cluster] removed stale resources of dead launchers: {', '.join(removed)}", file=log)
    return removed


EPHEMERAL_MARGIN = 12000
"""How far below the ephemeral range :func:`free_port` picks from (20768-32767 with Linux's default range)."""


_GIVEN: set = set()
"""The ports this process's :func:`free_port` has returned: never twice."""


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux's default where it cannot be read)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A port free now. It is released here and bound later by a job, so where several pytest-xdist workers pick
    ports at once (the test suite runs benchmarks and launchers side by side), each worker only gets ports whose
    residue modulo the worker count is its index: no two workers' calls return the same port. And it lies below the
    kernel's ephemeral range, so no connection made meanwhile (gloo's, a store's client side) is given it as its own
    local port: one such collision left a job's store unable to listen (EADDRINUSE) in a CI run."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", "gw0"), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", 1))
    index = int(worker[2:])
    low = _ephemeral_low()
    rng = random.Random()
    for _ in range(100):
        port = rng.randrange(max(1024, low - EPHEMERAL_MARGIN), low)
        port += (index - port) % count
        if port >= low or port in _GIVEN:  # (a port given earlier may not be bound yet)
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            _GIVEN.add(port)
            return port
    raise RuntimeError("no free port found in 100 tries")
