"""The API server's egress proxy: HTTP CONNECT over a unix socket, to allowed networks only.

The API server (``--egress-selector-config-file``) sends its traffic to nodes, pods and services here
(``kubectl logs``, ``exec``, ``port-forward``, the pod and service proxy). It runs inside the real node's
network namespace, so what it dials stays there; any target outside ``--allow`` gets 403.

    python -m neuronfleet.devcluster.realnode.egress_proxy SOCKET --allow 10.245.0.0/24 --allow ...
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import os
from collections.abc import Sequence
from pathlib import Path

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

#: The most connections relayed at once; more wait.
MAX_CONNECTIONS = 64
_HEAD_LIMIT = 8192
_TIMEOUT = 10.0


def connect_target(head: bytes) -> tuple[str, int] | None:
    """The ``host, port`` of a ``CONNECT host:port HTTP/1.1`` request head, or None for anything else."""
    words = head.split(b"\r\n", 1)[0].decode("latin-1").split()
    if len(words) < 2 or words[0] != "CONNECT":
        return None
    host, _, port = words[1].rpartition(":")
    if not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def allowed(host: str, networks: Sequence[IPNetwork]) -> bool:
    """Whether ``host`` is an IP address inside one of ``networks`` (names are never resolved)."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return any(address in network for network in networks)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    with contextlib.suppress(OSError):
        writer.close()


async def _handle(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    networks: Sequence[IPNetwork],
    slots: asyncio.Semaphore,
) -> None:
    async with slots:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), _TIMEOUT)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, OSError):
            writer.close()
            return
        target = connect_target(head)
        if target is None:
            writer.write(b"HTTP/1.1 405 Method Not Allowed\r\n\r\n")
        elif not allowed(target[0], networks):
            writer.write(b"HTTP/1.1 403 Forbidden\r\n\r\n")
        else:
            try:
                up_reader, up_writer = await asyncio.wait_for(asyncio.open_connection(*target), _TIMEOUT)
            except (OSError, TimeoutError) as error:
                writer.write(f"HTTP/1.1 502 Bad Gateway\r\n\r\n{error}".encode())
            else:
                writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
                await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
                return
        with contextlib.suppress(OSError):
            await writer.drain()
        writer.close()


async def serve(socket: Path, networks: Sequence[IPNetwork]) -> None:
    """Relay CONNECT requests arriving on ``socket`` to ``networks``, until cancelled."""
    socket.unlink(missing_ok=True)
    slots = asyncio.Semaphore(MAX_CONNECTIONS)
    server = await asyncio.start_unix_server(
        lambda r, w: _handle(r, w, networks, slots), path=str(socket), limit=_HEAD_LIMIT
    )
    os.chmod(socket, 0o600)
    async with server:
        await server.serve_forever()


def main(argv: Sequence[str] | None = None) -> None:
    """Parse the command line and serve until killed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("socket", type=Path)
    parser.add_argument("--allow", action="append", default=[], type=ipaddress.ip_network)
    args = parser.parse_args(argv)
    asyncio.run(serve(args.socket, args.allow))


if __name__ == "__main__":
    main()
