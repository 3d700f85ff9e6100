"""Which replica each request's connection reached, from the node's own connection tracking.

kube-proxy (iptables mode) sends each connection to a Service's ClusterIP to one of its endpoints by DNAT, and
the kernel's connection tracking keeps the choice: the connection's reply comes from the endpoint. ``conntrack
-E`` in the node's network namespace prints each new connection as the kernel confirms it (its first packet),
whether a server then answered it, refused it or cut it off. So a request is attributed to the replica its
connection went to even when no answer came to name one.

A request is matched to its connection by the local port the load tool saw it open (every request whose
connect succeeded); a refused one, whose connect failed and whose port the client never learns, by time: the
connection to the Service first opened after it was sent and claimed by no other request.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from neuronfleet.devcluster.process.waiting import wait_for

#: "[1765100000.123456]   [NEW] tcp  6 120 SYN_SENT src=A dst=SVC sport=P dport=8000 [UNREPLIED] src=POD dst=A ...":
#: the time, the client's port, and the reply's source (the endpoint the connection was sent to).
_EVENT = re.compile(
    r"^\[(?P<at>\d+\.\d+)\]\s+\[NEW\] tcp\s.*?\ssport=(?P<port>\d+) dport=\d+\s.*?src=(?P<server>[\d.]+) dst="
)
#: How long after a request's send its connection may open: the load tool's own scheduling lag.
OPEN_WITHIN_S = 0.25
#: Netlink's protocol number for netfilter (/proc/net/netlink's Eth column).
_NETLINK_NETFILTER = "12"


@dataclass(frozen=True)
class Connection:
    """One connection to the Service: when it opened (Unix seconds), its client port, the endpoint it reached."""

    opened_at: float
    client_port: int
    server: str


def parse_events(text: str) -> list[Connection]:
    """The new connections in ``conntrack -E -o timestamp`` output, in order."""
    found = (_EVENT.match(line) for line in text.splitlines())
    return [Connection(float(m["at"]), int(m["port"]), m["server"]) for m in found if m]


def match_requests(
    requests: Sequence[tuple[float, int | None]], connections: Sequence[Connection]
) -> list[Connection | None]:
    """Each request's connection, for requests given as (sent at, client port or None): by port where the request
    knows it, else the first unclaimed connection opened within :data:`OPEN_WITHIN_S` after it was sent."""
    by_port = {c.client_port: c for c in connections}
    matched: list[Connection | None] = [by_port.get(port) if port is not None else None for _, port in requests]
    claimed = {id(c) for c in matched if c is not None}
    for index, (sent_at, port) in sorted(enumerate(requests), key=lambda item: item[1][0]):
        if port is not None:
            continue
        matched[index] = next(
            (c for c in connections if id(c) not in claimed and sent_at <= c.opened_at < sent_at + OPEN_WITHIN_S),
            None,
        )
        if matched[index] is not None:
            claimed.add(id(matched[index]))
    return matched


class ConnectionLog:
    """``conntrack -E`` on the node, for new TCP connections to ``service_ip:port``, from :meth:`start` to
    :meth:`stop` (or :meth:`close`)."""

    def __init__(self, netns: str, service_ip: str, port: int, path: Path) -> None:
        self.argv = [
            "ip", "netns", "exec", netns,
            "conntrack", "-E", "-e", "NEW", "-p", "tcp",
            "--orig-dst", service_ip, "--orig-port-dst", str(port), "-o", "timestamp",
        ]  # fmt: skip
        self.path = path
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start listening; return once the kernel sends it new connections (its netlink socket subscribed)."""
        with self.path.open("wb") as out:
            self.process = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT)
        process = self.process
        wait_for(
            lambda: process.poll() is not None or _subscribed(process.pid),
            timeout=30,
            what="conntrack subscribed to new connections",
        )
        assert process.poll() is None, f"conntrack exited: {self.path.read_text()}"

    def stop(self) -> list[Connection]:
        """Stop listening (conntrack writes out what it has at SIGTERM) and read the connections."""
        assert self.process is not None, "never started"
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        finally:
            self.process.kill()
        return parse_events(self.path.read_text())

    def close(self) -> None:
        """Stop listening if it still does (a load that failed before :meth:`stop`)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)


def _subscribed(pid: int) -> bool:
    """Whether process ``pid`` holds a netfilter netlink socket subscribed to a group (conntrack's events)."""
    try:
        inodes = {
            target[len("socket:[") : -1]
            for fd in os.listdir(f"/proc/{pid}/fd")
            if (target := os.readlink(f"/proc/{pid}/fd/{fd}")).startswith("socket:[")
        }
        table = Path(f"/proc/{pid}/net/netlink").read_text().splitlines()[1:]
    except OSError:
        return False
    return any(
        cols[1] == _NETLINK_NETFILTER and int(cols[3], 16) != 0 and cols[9] in inodes
        for cols in (line.split() for line in table)
    )
