"""An emulated multi-host cluster on one Linux machine: network namespaces, shaped links, CPU quotas.

Topology (``N`` hosts, names ``<prefix>_<pid>_h<i>`` and ``<prefix>_<pid>_sw``)::

    ns h0: eth0 10.77.0.1/24 --veth-- p0 \
    ns h1: eth0 10.77.0.2/24 --veth-- p1 -- br0   (bridge in ns sw)
    ...                                 /

Every interface lives inside a namespace this module creates, so nothing is added
to the machine's own network namespace and 10.77.0.0/24 is never routed outside.
Each host's link is full duplex at ``rate``: a ``tbf`` qdisc on the host's ``eth0``
shapes host -> switch and one on the switch port ``p<i>`` shapes switch -> host.
``delay`` adds ``netem`` one-way latency on the host side; on kernels without
``sch_netem`` a user-space switch holds the frames instead of the bridge
(:mod:`benchmarks.cluster.delay_switch`; ``stats()["delay_via"]`` says which).

A host may be CPU-throttled with a cgroup-v1 ``cpu`` group (``cpu.cfs_quota_us``
= percent of one CPU) and pinned to CPUs (``sched_setaffinity``), to emulate a
slower machine. A CPU quota slows only CPU work: a ``time.sleep`` standing in for
accelerator compute is not slowed by it.

The command runs once per host with ``RANK``/``WORLD_SIZE``/``LOCAL_RANK=0``/
``MASTER_ADDR``/``MASTER_PORT`` (torch.distributed's ``env://``, which
``deepspeed.init_distributed`` reads) and ``GLOO_SOCKET_IFNAME=eth0``.

Loopback mode (``netns=False``) runs the same command on 127.0.0.1 with no
namespaces and no shaping (CPU quotas still apply when root): for machines where
namespaces are not available, and for tests.

Teardown is unconditional: :meth:`LocalCluster.teardown` kills every process the
cluster started (and anything left inside its namespaces), deletes the namespaces
(which deletes their veths) and removes the cgroups. :func:`clean_stale` removes
resources of the same prefix whose owning process is gone (a launcher killed by
SIGKILL cannot clean up after itself).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import IO, Optional, Sequence

from .delay_switch import start_delay_switch, stop_delay_switch
from .system import (CPU_CGROUP_ROOT, PREFIX, clean_stale, delete_netns, free_port, link_state, missing_requirements,
                     remove_cgroup, run_command)
from .units import ClusterError, format_rate

SUBNET = "10.77.0"  # /24, only ever configured inside namespaces this module creates
IFACE = "eth0"
CFS_PERIOD_US = 100_000
LAUNCHER_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "LOCAL_SIZE", "GROUP_RANK",
                "MASTER_ADDR", "MASTER_PORT", "CROSS_RANK", "CROSS_SIZE", "CUDA_VISIBLE_DEVICES",
                "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME", "TORCHELASTIC_RUN_ID")

# --------------------------------------------------------------------------- the cluster


@dataclass
class Host:
    index: int
    ip: str
    netns: Optional[str] = None
    iface: str = IFACE
    cpu_quota_pct: Optional[float] = None
    cpus: Optional[tuple[int, ...]] = None
    cgroup: Optional[str] = None
    log_path: Optional[str] = None
    exit_code: Optional[int] = None
    counters_start: dict = field(default_factory=dict)
    counters_end: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"host{self.index}"


class LocalCluster:
    """Build, use and tear down an emulated cluster; see the module docstring.

    Args:
        hosts: number of emulated hosts (ranks).
        rate: link rate in bits/s per direction per host (None: unshaped).
        delay: one-way host -> switch latency in seconds, via netem or the delaying switch (None: none).
        cpu_quota: ``{host index: percent of one CPU}``.
        cpus: ``{host index: CPU ids}`` to pin each host to.
        netns: False for loopback mode (no namespaces, no shaping).
        log_dir: per-host logs ``host<i>.log`` go here.
        echo: copy every host's output to this stream, prefixed ``[h<i>]`` (None: files only).
        prefix: namespace/cgroup name prefix (stale ones with it are cleaned at setup).
        master_port: rendezvous port (default: random in netns mode, a free one on loopback).
        mtu: every link's MTU in bytes (None: the kernel's 1500). The shaped link hands the receiver one
            packet per MTU, so the network stack's CPU per byte falls with it: 9000 emulates jumbo frames.
    """

    def __init__(self, hosts: int, *, rate: Optional[float] = None, delay: Optional[float] = None,
                 cpu_quota: Optional[dict] = None, cpus: Optional[dict] = None, netns: bool = True,
                 log_dir: str = ".", echo: Optional[IO] = sys.stdout, prefix: str = PREFIX,
                 master_port: Optional[int] = None, mtu: Optional[int] = None):
        if hosts < 1 or hosts > 250:
            raise ValueError(f"hosts: got {hosts}; allowed: 1..250")
        if not re.fullmatch(r"[a-z][a-z0-9]{0,11}", prefix):
            raise ValueError(f"prefix: got {prefix!r}; allowed: 1-12 lowercase letters/digits, starting with a letter")
        if not netns and (rate is not None or delay is not None or mtu is not None):
            raise ValueError("rate/delay/mtu need network namespaces; loopback mode (--no-netns) cannot shape links")
        if mtu is not None and not 576 <= mtu <= 65535:
            raise ValueError(f"mtu: got {mtu}; allowed: 576..65535 bytes")
        self.rate, self.delay, self.netns, self.mtu = rate, delay, netns, mtu
        self.prefix = prefix
        self.tag = f"{prefix}_{os.getpid()}"
        self.log_dir = os.path.abspath(log_dir)
        self.echo = echo
        cpu_quota, cpus = dict(cpu_quota or {}), dict(cpus or {})
        for i, pct in cpu_quota.items():
            if not 1 <= float(pct) <= 100 * (os.cpu_count() or 1):
                raise ValueError(f"cpu-quota host{i}: got {pct}; allowed: 1..{100 * (os.cpu_count() or 1)} "
                                 "(percent of one CPU)")
        self.hosts = [
            Host(index=i,
                 ip=f"{SUBNET}.{i + 1}" if netns else "127.0.0.1",
                 netns=f"{self.tag}_h{i}" if netns else None,
                 iface=IFACE if netns else "lo",
                 cpu_quota_pct=float(cpu_quota[i]) if i in cpu_quota else None,
                 cpus=tuple(cpus[i]) if i in cpus else None)
            for i in range(hosts)
        ]
        self.switch_ns = f"{self.tag}_sw" if netns else None
        self.master_port = master_port or (29400 + os.getpid() % 20000 if netns else free_port())
        self._procs: list[Optional[subprocess.Popen]] = [None] * hosts
        self._readers: list[threading.Thread] = []
        self._created_ns: list[str] = []
        self._created_cg: list[str] = []
        self.netem_ok: Optional[bool] = None
        self.delay_via: Optional[str] = None
        """``"netem"`` or ``"switch"`` (:mod:`.delay_switch`) where ``delay`` is set."""
        self._switch: Optional[subprocess.Popen] = None
        self.started_at: Optional[float] = None
        self.wall_s: Optional[float] = None

    # ------------------------------------------------------------------ set-up
    def setup(self) -> None:
        need_cg = any(h.cpu_quota_pct is not None for h in self.hosts)
        problems = missing_requirements(self.netns, need_cg)
        if problems:
            raise ClusterError("; ".join(problems))
        if self.netns or need_cg:
            clean_stale(self.prefix)
        os.makedirs(self.log_dir, exist_ok=True)
        if self.netns:
            self._setup_network()
        for h in self.hosts:
            if h.cpu_quota_pct is not None:
                h.cgroup = os.path.join(CPU_CGROUP_ROOT, f"{self.tag}_h{h.index}")
                os.makedirs(h.cgroup, exist_ok=False)
                self._created_cg.append(h.cgroup)
                with open(os.path.join(h.cgroup, "cpu.cfs_period_us"), "w") as f:
                    f.write(str(CFS_PERIOD_US))
                with open(os.path.join(h.cgroup, "cpu.cfs_quota_us"), "w") as f:
                    f.write(str(int(CFS_PERIOD_US * h.cpu_quota_pct / 100)))
            h.log_path = os.path.join(self.log_dir, f"{h.name}.log")

    def _add_ns(self, name: str) -> None:
        run_command(["ip", "netns", "add", name])
        self._created_ns.append(name)
        run_command(["ip", "-n", name, "link", "set", "lo", "up"])

    def _shape(self, ns: str, dev: str, with_delay: bool) -> None:
        rate = self.rate
        parent = ["root"]
        if with_delay and self.delay is not None and self.delay_via != "switch":
            proc = run_command(["tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "handle", "1:", "netem",
                         "delay", f"{self.delay * 1e6:.0f}us", "limit", "100000"], check=False)
            self.netem_ok = proc.returncode == 0
            if self.netem_ok:
                self.delay_via = "netem"
                parent = ["parent", "1:1", "handle", "10:"]
            elif self.delay_via == "netem":
                raise ClusterError(f"netem failed on {dev} in {ns} after working on another host: "
                                   f"{proc.stderr.strip()}")
            else:
                # No netem in this kernel: the switch holds the frames instead (decided on the first host, before
                # any port joins the bridge).
                self.delay_via = "switch"
        if rate is None:
            return
        rate_bytes = rate / 8
        burst = int(max(32 * 1024, rate_bytes * 0.004))  # >= 4 ms of traffic: accurate at 250 Hz timers
        limit = int(max(1 << 20, rate_bytes * 0.5))  # deep queue: host-side drops would make TCP back off
        run_command(["tc", "-n", ns, "qdisc", "add", "dev", dev, *parent, "tbf", "rate", f"{int(rate)}bit",
              "burst", str(burst), "limit", str(limit)])

    def _setup_network(self) -> None:
        sw = self.switch_ns
        self._add_ns(sw)
        run_command(["ip", "-n", sw, "link", "add", "br0", "type", "bridge", "forward_delay", "0", "stp_state", "0"])
        run_command(["ip", "-n", sw, "link", "set", "br0", "up"])
        for h in self.hosts:
            self._add_ns(h.netns)
            port = f"p{h.index}"
            # Both ends are created directly inside their namespaces: nothing appears in ours.
            run_command(["ip", "link", "add", "name", port, "netns", sw, "type", "veth", "peer", "name", h.iface,
                  "netns", h.netns])
            if self.mtu is not None:
                run_command(["ip", "-n", sw, "link", "set", port, "mtu", str(self.mtu)])
                run_command(["ip", "-n", h.netns, "link", "set", h.iface, "mtu", str(self.mtu)])
            self._shape(h.netns, h.iface, with_delay=True)  # host -> switch
            self._shape(sw, port, with_delay=False)         # switch -> host
            if self.delay_via != "switch":
                run_command(["ip", "-n", sw, "link", "set", port, "master", "br0"])
            run_command(["ip", "-n", sw, "link", "set", port, "up"])
            run_command(["ip", "-n", h.netns, "addr", "add", f"{h.ip}/24", "dev", h.iface])
            run_command(["ip", "-n", h.netns, "link", "set", h.iface, "up"])
        # Links come up asynchronously; wait until both ends of every veth say UP.
        deadline = time.monotonic() + 10
        for ns, dev in [(sw, f"p{h.index}") for h in self.hosts] + [(h.netns, h.iface) for h in self.hosts]:
            while link_state(ns, dev) != "UP":
                if time.monotonic() > deadline:
                    raise ClusterError(f"link {dev} in namespace {ns} did not come up: {link_state(ns, dev)}")
                time.sleep(0.05)
        if self.delay_via == "switch":
            self._switch = start_delay_switch(sw, [f"p{h.index}" for h in self.hosts], self.delay)

    # ------------------------------------------------------------------ counters
    def read_counters(self, h: Host) -> dict:
        """Interface byte/packet counters of a host's link and its qdisc drops (netns mode only)."""
        if not self.netns:
            return {}
        out: dict = {}
        proc = run_command(["ip", "-n", h.netns, "-j", "-s", "link", "show", "dev", h.iface], check=False)
        try:
            stats = json.loads(proc.stdout)[0]["stats64"]
            out.update(tx_bytes=stats["tx"]["bytes"], rx_bytes=stats["rx"]["bytes"],
                       tx_packets=stats["tx"]["packets"], rx_packets=stats["rx"]["packets"])
        except (ValueError, LookupError):
            pass
        drops = 0
        for ns, dev in ((h.netns, h.iface), (self.switch_ns, f"p{h.index}")):
            proc = run_command(["tc", "-n", ns, "-s", "-j", "qdisc", "show", "dev", dev], check=False)
            try:
                drops += sum(int(q.get("drops", 0)) for q in json.loads(proc.stdout))
            except ValueError:
                pass
        out["qdisc_drops"] = drops
        return out

    # ------------------------------------------------------------------ processes
    def host_env(self, h: Host, base: Optional[dict] = None) -> dict:
        env = {k: v for k, v in (base if base is not None else os.environ).items() if k not in LAUNCHER_ENV}
        n = len(self.hosts)
        threads = len(h.cpus) if h.cpus else max(1, (os.cpu_count() or 1) // n)
        env.setdefault("OMP_NUM_THREADS", str(threads))
        env.update(RANK=str(h.index), WORLD_SIZE=str(n), LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", LOCAL_SIZE="1",
                   GROUP_RANK=str(h.index), MASTER_ADDR=self.hosts[0].ip, MASTER_PORT=str(self.master_port),
                   GLOO_SOCKET_IFNAME=h.iface, TP_SOCKET_IFNAME=h.iface, PYTHONUNBUFFERED="1",
                   DS_ACCO_CLUSTER_HOST=h.name, DS_ACCO_CLUSTER_IFACE=h.iface,
                   DS_ACCO_CLUSTER_NETNS="1" if self.netns else "0")
        return env

    def launch(self, command: Sequence[str], env: Optional[dict] = None) -> None:
        """Start ``command`` on every host (own session, so the whole tree can be killed)."""
        if not command:
            raise ValueError("command: empty; give the training command after --")
        for h in self.hosts:
            h.counters_start = self.read_counters(h)
        self.started_at = time.monotonic()
        for h in self.hosts:
            argv = (["ip", "netns", "exec", h.netns] if self.netns else []) + list(command)
            log = open(h.log_path, "w", encoding="utf-8", errors="replace")
            proc = subprocess.Popen(argv, env=self.host_env(h, env), stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                    preexec_fn=_child_setup(h.cgroup, h.cpus))
            self._procs[h.index] = proc
            t = threading.Thread(target=_pump, args=(proc.stdout, log, self.echo, f"[h{h.index}] "), daemon=True)
            t.start()
            self._readers.append(t)

    def wait(self, timeout: Optional[float] = None, poll_s: float = 0.2) -> int:
        """Wait for every host; when one fails, stop the others. Returns the first failure's
        exit status (128+signal for a signal), 124 on timeout, 0 when all succeed."""
        first_fail: Optional[int] = None
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            running = False
            for h, p in zip(self.hosts, self._procs):
                if p is None or h.exit_code is not None:
                    continue
                rc = p.poll()
                if rc is None:
                    running = True
                    continue
                h.exit_code = rc if rc >= 0 else 128 - rc
                if rc != 0 and first_fail is None:
                    first_fail = h.exit_code
                    print(f"[local_cluster] {h.name} exited with {h.exit_code}; stopping the other hosts "
                          f"(log: {h.log_path})", file=sys.stderr, flush=True)
                    self.stop(grace_s=5.0)
            if not running:
                break
            if self._switch is not None and self._switch.poll() is not None and first_fail is None:
                print("[local_cluster] the delaying switch exited; stopping every host", file=sys.stderr, flush=True)
                self.stop(grace_s=3.0)
                first_fail = 1
                continue
            if deadline is not None and time.monotonic() > deadline:
                print(f"[local_cluster] timeout after {timeout:.0f}s; stopping every host", file=sys.stderr,
                      flush=True)
                self.stop(grace_s=3.0)
                for h, p in zip(self.hosts, self._procs):
                    if p is not None and h.exit_code is None:
                        h.exit_code = 124
                first_fail = first_fail or 124
                break
            time.sleep(poll_s)
        self.wall_s = time.monotonic() - (self.started_at or time.monotonic())
        for t in self._readers:
            t.join(timeout=5)
        for h in self.hosts:
            h.counters_end = self.read_counters(h)
        return first_fail or 0

    def stop(self, grace_s: float = 5.0) -> None:
        """SIGTERM every host's process group, then SIGKILL what is left after ``grace_s``."""
        live = [p for p in self._procs if p is not None and p.poll() is None]
        for p in live:
            _signal_group(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for p in live:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for p in self._procs:
            if p is not None:
                _signal_group(p.pid, signal.SIGKILL)  # also children that outlived their leader
                try:
                    p.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass

    # ------------------------------------------------------------------ teardown
    def teardown(self) -> list[str]:
        """Kill everything, delete namespaces and cgroups. Never raises; returns the problems."""
        problems = []
        try:
            self.stop(grace_s=2.0)
        except Exception as exc:  # noqa: BLE001 - keep tearing down
            problems.append(f"stopping processes: {exc}")
        if self._switch is not None:
            problems += stop_delay_switch(self._switch)
            self._switch = None
        for ns in reversed(self._created_ns):
            try:
                err = delete_netns(ns)
            except Exception as exc:  # noqa: BLE001
                err = f"ip netns del {ns}: {exc}"
            if err:
                problems.append(err)
        self._created_ns.clear()
        for cg in self._created_cg:
            err = remove_cgroup(cg)
            if err:
                problems.append(err)
        self._created_cg.clear()
        return problems

    def stats(self, command: Sequence[str] = ()) -> dict:
        hosts = []
        for h in self.hosts:
            d = asdict(h)
            d["name"] = h.name
            d["delta"] = {k: h.counters_end[k] - h.counters_start.get(k, 0)
                          for k in h.counters_end if isinstance(h.counters_end[k], int)}
            hosts.append(d)
        return {"netns": self.netns, "rate_bit_s": self.rate, "rate": format_rate(self.rate), "mtu": self.mtu or 1500,
                "delay_s": self.delay, "delay_via": self.delay_via, "master_addr": self.hosts[0].ip,
                "master_port": self.master_port,
                "wall_s": self.wall_s, "command": list(command), "hosts": hosts}


def _child_setup(cgroup: Optional[str], cpus: Optional[tuple[int, ...]]):
    """Runs in the child between fork and exec: join the cgroup and pin CPUs, inherited by everything it starts."""

    def setup() -> None:
        if cgroup:
            with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
        if cpus:
            os.sched_setaffinity(0, cpus)

    return setup


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _pump(src: IO, log: IO, echo: Optional[IO], prefix: str) -> None:
    try:
        for raw in iter(src.readline, b""):
            line = raw.decode("utf-8", errors="replace")
            log.write(line)
            log.flush()
            if echo is not None:
                echo.write(prefix + line)
                echo.flush()
    except (OSError, ValueError):
        pass
    finally:
        log.close()


# --------------------------------------------------------------------------- CLI
