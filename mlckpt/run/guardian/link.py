"""The guardians' links across hosts: one TCP connection from each host's guardian to rank 0's.

Rank 0's guardian (the hub) listens; every other host's guardian (a spoke) connects to it once the
job has started and says which host it is.  Over each link both ends send JSON lines: a heartbeat
every :data:`HEARTBEAT_S`, a rank's death the moment it is seen, the hub's verdict on which death
came first, and the job's end.  A link on which nothing arrived for :data:`CONTACT_S` is *lost*: a
partition, or a host that went down (a guardian that merely ended closes its link: not a loss).
On a healthy network one second of silence is already far outside anything TCP does on its own,
so five of them mean the other host cannot take part in the job any more.

:class:`Contact` is the pure part (who was heard when, who is due a heartbeat, who is lost);
:class:`Link` is the thin socket around one connection.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

HEARTBEAT_S = 1.0  # how often each end of a link says it is alive
CONTACT_S = 5.0  # silence after which a link is lost (docs: When things go wrong)
CONNECT_S = 10.0  # how long a spoke tries to reach the hub at start-up, before any I/O
MAX_LINE = 1 << 16  # a peer that sends longer lines is not a guardian


@dataclass
class Contact:
    """When each peer was last heard from and last sent to (monotonic seconds).  Pure."""

    heard: dict[str, float] = field(default_factory=dict)
    sent: dict[str, float] = field(default_factory=dict)

    def add(self, peer: str, now: float) -> None:
        self.heard[peer] = now
        self.sent[peer] = now

    def drop(self, peer: str) -> None:
        self.heard.pop(peer, None)
        self.sent.pop(peer, None)

    def due(self, now: float) -> list[str]:
        """Peers that are owed a heartbeat now."""
        return sorted(p for p, t in self.sent.items() if now - t >= HEARTBEAT_S)

    def lost(self, now: float) -> list[str]:
        return sorted(p for p, t in self.heard.items() if now - t >= CONTACT_S)

    def wait_s(self, now: float) -> float:
        """How long the guardian may sleep before something here is due."""
        times = [t + HEARTBEAT_S for t in self.sent.values()] + [t + CONTACT_S for t in self.heard.values()]
        return max(0.0, min(times) - now) if times else 3600.0


def encode(msg: dict[str, object]) -> bytes:
    return (json.dumps(msg, separators=(",", ":")) + "\n").encode()


def lines(buf: bytearray, data: bytes) -> Iterator[dict[str, Any]]:
    """Append ``data`` to ``buf`` and yield each complete JSON line (consumed from ``buf``)."""
    buf.extend(data)
    while (end := buf.find(b"\n")) >= 0:
        line = bytes(buf[:end])
        del buf[: end + 1]
        msg = json.loads(line)
        if isinstance(msg, dict):
            yield msg
    if len(buf) > MAX_LINE:
        raise ValueError("a line longer than any guardian message")


class Link:
    """One guardian-to-guardian connection (non-blocking once up)."""

    def __init__(self, sock: socket.socket, peer: str = "") -> None:
        self.sock, self.peer, self.buf = sock, peer, bytearray()
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, msg: dict[str, object]) -> bool:
        """Best effort: a message that does not fit in the socket's buffer now is dropped (only
        heartbeats and short notices travel here, and a link that cannot take them is dying)."""
        try:
            self.sock.send(encode(msg))
            return True
        except OSError:
            return False

    def receive(self) -> list[dict[str, object]] | None:
        """The messages that arrived; None when the peer closed the connection or it broke."""
        try:
            data = self.sock.recv(1 << 16)
        except BlockingIOError:
            return []
        except OSError:
            return None
        if not data:
            return None
        try:
            return list(lines(self.buf, data))
        except ValueError:
            return None

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def listen() -> socket.socket:
    """The hub's listening socket, on every address of this host, on a free port."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("0.0.0.0", 0))
    sock.listen(256)
    return sock


def hub_addresses(port: int) -> list[tuple[str, int]]:
    """Where other hosts may reach this host's hub: its name first, then its addresses."""
    name = socket.gethostname()
    found = [name]
    try:
        for info in socket.getaddrinfo(name, port, socket.AF_INET, socket.SOCK_STREAM):
            addr = str(info[4][0])
            if addr not in found and not addr.startswith("127."):
                found.append(addr)
    except OSError:
        pass
    return [(a, port) for a in found]


def connect(addresses: list[tuple[str, int]], within_s: float = CONNECT_S) -> Link | str:
    """Reach the hub at one of ``addresses``; the link, or why not."""
    until = time.monotonic() + within_s
    why = "no address"
    while True:
        for addr in addresses:
            left = until - time.monotonic()
            if left <= 0:
                return why
            try:
                sock = socket.create_connection((addr[0], addr[1]), timeout=min(left, 2.0))
            except OSError as exc:
                why = f"{addr[0]}:{addr[1]}: {exc.strerror or exc}"
                continue
            return Link(sock, "hub")
        time.sleep(0.2)
