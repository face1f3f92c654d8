"""The leader's end of its host's guardian: :meth:`Guardian.start` forks the guardian process
before MPI starts; the leader then tells it, over a socket pair, its host's ranks, the run's
planned paths and the step in progress, and says goodbye at the end."""

from __future__ import annotations

import json
import os
import socket
from typing import Any

from mlckpt.run.guardian import link
from mlckpt.run.guardian.process import guardian_main
from mlckpt.run.guardian.processes import launcher_rank, local_rank


class Guardian:
    """The leader's end of the control socket."""

    def __init__(self, sock: socket.socket | None = None, port: int = 0, pid: int = 0) -> None:
        self.sock, self.port, self.pid = sock, port, pid  # pid: the guardian process

    @property
    def hub(self) -> bool:
        return self.port != 0

    @classmethod
    def start(cls) -> Guardian | None:
        rank, local = launcher_rank(), local_rank()
        leader = local == 0 if local is not None else rank == 0
        if rank is None or not leader or not hasattr(os, "pidfd_open"):
            return None
        try:
            listener = link.listen() if rank == 0 else None
            ours, theirs = socket.socketpair()
        except OSError:
            return None
        parent, proxy = os.getpid(), os.getppid()
        try:
            pid = os.fork()
        except OSError:
            ours.close()
            theirs.close()
            return None
        if pid == 0:  # the guardian
            code = 0
            try:
                ours.close()
                guardian_main(theirs, parent, proxy, listener)
            except BaseException:
                code = 1
            finally:
                os._exit(code)
        theirs.close()
        port = listener.getsockname()[1] if listener is not None else 0
        if listener is not None:
            listener.close()
        return cls(ours, port, pid)

    def send(self, **msg: object) -> None:
        if self.sock is None:
            return
        try:
            self.sock.sendall(link.encode(msg))
        except OSError:  # the guardian is gone: carry on without it
            self.close()

    def ask(self, timeout_s: float, **msg: Any) -> dict[str, Any] | None:
        """Send ``msg`` and wait for the guardian's one-line answer."""
        self.send(**msg)
        if self.sock is None:
            return None
        buf = b""
        self.sock.settimeout(timeout_s)
        try:
            while b"\n" not in buf:
                data = self.sock.recv(1 << 16)
                if not data:
                    return None
                buf += data
        except OSError:
            return None
        finally:
            if self.sock is not None:
                self.sock.settimeout(None)
        answer = json.loads(buf.split(b"\n", 1)[0])
        return answer if isinstance(answer, dict) else None

    def addresses(self) -> list[tuple[str, int]]:
        return link.hub_addresses(self.port) if self.hub else []

    def end(self, how: str) -> None:
        """Goodbye: ``clean`` (the leader finished, cleaned up) or ``reported`` (rank 0 is aborting)."""
        self.send(end=how)
        self.close()

    def close(self) -> None:
        if self.sock is not None:
            sock, self.sock = self.sock, None
            try:
                sock.close()
            except OSError:
                pass
