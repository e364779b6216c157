"""A switch that holds every frame for a fixed time: one-way latency for the emulated cluster where the kernel has no
``netem`` qdisc.

Why in user space: ``tc``'s only delaying qdisc is ``netem``, and kernels built without it (the machines these
benchmarks ran on) cannot add latency to a link, so the beds had none, while the links ds_acco is for (between sites,
across regions) have tens of milliseconds. This process runs inside the cluster's switch namespace in place of its
bridge: a raw packet socket on every host's switch port, a learning switch between them, and each frame released
``delay`` seconds after it arrived, so a host's one-way latency to another is ``delay`` and a round trip twice that,
as with ``netem`` on the host side. The ports' ``tbf`` qdiscs shape the link as before: a frame leaves through its
port's queue, released on time.

Frames carry the kernel's virtio-net header (``PACKET_VNET_HDR``): segmentation-offloaded frames and frames whose
checksum the sender left to the hardware pass through whole, as the bridge passed them, so a 100 Mbit/s link costs
this process a few thousand frames a second, not one per MTU. It takes a share of a core at high rates; the
benchmark that uses it says so beside its figures.

    python -m benchmarks.cluster.delay_switch --ports p0,p1 --delay 0.025   (inside the switch namespace)

It prints ``ready`` once every port is open, and on SIGTERM exits with a line of what it forwarded and dropped.
"""

from __future__ import annotations

import argparse
import heapq
import os
import select
import signal
import socket
import subprocess
import sys
import time

ETH_P_ALL = 0x0003
SOL_PACKET = 263
PACKET_VNET_HDR = 15
PACKET_OUTGOING = 4
"""``sll_pkttype`` of a frame this host sent: the socket sees its own sends, which are not the port's traffic."""
VNET_HDR = 10
"""Bytes of ``struct virtio_net_hdr`` before each frame."""
SOCKET_BYTES = 64 << 20
"""Send and receive buffers of each port's socket: a send waits in the port's ``tbf`` queue (half a second of the
link) and counts against the socket until it leaves, so the buffer must hold that queue or frames are dropped."""
BROADCAST = b"\xff" * 6


class DelaySwitch:
    """A learning switch between ``ports`` (interface names in this namespace) that delivers each frame ``delay``
    seconds after it arrived."""

    def __init__(self, ports: list[str], delay: float):
        if delay < 0:
            raise ValueError(f"delay: got {delay}; allowed: >= 0 seconds")
        if len(ports) < 2:
            raise ValueError(f"ports: got {ports}; a switch needs two or more")
        self.delay = delay
        self.socks = [self._open(p) for p in ports]
        self.where: dict[bytes, int] = {}  # MAC -> port it was last seen on
        self.due: list = []  # (release time, sequence, port, frame)
        self.seq = self.forwarded = self.dropped = 0
        self.poll = select.poll()
        self.port_of = {}
        for i, s in enumerate(self.socks):
            self.poll.register(s, select.POLLIN)
            self.port_of[s.fileno()] = i
        self.running = True

    @staticmethod
    def _open(port: str) -> socket.socket:
        s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        s.setsockopt(SOL_PACKET, PACKET_VNET_HDR, 1)
        for opt in (33, 32):  # SO_RCVBUFFORCE, SO_SNDBUFFORCE (root: above net.core.*mem_max)
            s.setsockopt(socket.SOL_SOCKET, opt, SOCKET_BYTES)
        s.bind((port, ETH_P_ALL))
        s.setblocking(False)
        return s

    def _receive(self, i: int) -> None:
        s = self.socks[i]
        while True:
            try:
                frame, addr = s.recvfrom(1 << 17)
            except (BlockingIOError, InterruptedError):
                return
            if addr[2] == PACKET_OUTGOING or len(frame) < VNET_HDR + 14:
                continue
            dst, src = frame[VNET_HDR:VNET_HDR + 6], frame[VNET_HDR + 6:VNET_HDR + 12]
            self.where[src] = i
            out = self.where.get(dst) if dst != BROADCAST else None
            release = time.monotonic() + self.delay
            for j in ([out] if out is not None else range(len(self.socks))):
                if j != i:
                    self.seq += 1
                    heapq.heappush(self.due, (release, self.seq, j, frame))

    def _release(self) -> None:
        now = time.monotonic()
        while self.due and self.due[0][0] <= now:
            _, _, j, frame = heapq.heappop(self.due)
            try:
                self.socks[j].send(frame)
                self.forwarded += 1
            except OSError:  # the port's queue is full: a loss, as a full tbf queue would drop it
                self.dropped += 1

    def serve(self) -> None:
        while self.running:
            self._release()
            wait_ms = 1000 if not self.due else max(0, (self.due[0][0] - time.monotonic()) * 1000)
            for fd, _ in self.poll.poll(wait_ms):
                self._receive(self.port_of[fd])


def start_delay_switch(netns: str, ports: list[str], delay: float, timeout_s: float = 15.0) -> subprocess.Popen:
    """Start the switch in ``netns`` between ``ports``; returns once it is forwarding."""
    from .units import ClusterError

    proc = subprocess.Popen(["ip", "netns", "exec", netns, sys.executable, os.path.abspath(__file__),
                             "--ports", ",".join(ports), "--delay", repr(delay)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True, text=True)
    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    line = proc.stdout.readline().strip() if ready else ""
    if line != "ready":
        proc.kill()
        rest = proc.communicate()[0]
        raise ClusterError(f"the delaying switch did not start in {netns} ({line} {rest}".strip() + ")")
    return proc


def stop_delay_switch(proc: subprocess.Popen) -> list[str]:
    """Stop the switch; returns the problems (it had died, or would not stop)."""
    early = proc.poll()
    if early is None:
        proc.terminate()
    try:
        out = proc.communicate(timeout=5)[0]
    except subprocess.TimeoutExpired:
        proc.kill()
        out = proc.communicate()[0]
    if early is not None:
        return [f"the delaying switch had exited with {early} before the end: {out.strip()[-500:]}"]
    return []


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ports", required=True, help="comma-separated interfaces in this namespace")
    p.add_argument("--delay", type=float, required=True, help="seconds each frame is held")
    args = p.parse_args(argv)
    switch = DelaySwitch(args.ports.split(","), args.delay)

    def stop(*_):
        switch.running = False
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print("ready", flush=True)
    switch.serve()
    print(f"delay_switch: forwarded {switch.forwarded} frames, dropped {switch.dropped}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
