"""What one op's requests took: each request's latency and the rank's time in each phase of the
op (records format 7; the formulas that use them are in mlckpt/latency.py).

The runner opens a collection for a pool's op before its barrier and takes it back after the op:
the engine's timed paths append to whichever collection is open for their pool (the training
side's "main" pool and a background persist's pool never mix).  A request is timed from its issue
to its last byte, short transfers continued included; appending is one list append, safe across
the pool's threads.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass
class Requests:
    latencies_ns: list[int] = field(default_factory=list)
    phases_ns: dict[str, int] = field(default_factory=dict)


_open: dict[str, Requests] = {}


def collect(pool: str = "main") -> Requests:
    """Start collecting the requests of ``pool``'s next op."""
    _open[pool] = out = Requests()
    return out


def collected(pool: str = "main") -> Requests | None:
    """Stop collecting ``pool``'s requests; what was collected (None if nothing was open)."""
    return _open.pop(pool, None)


def recorder(pool: str) -> tuple[Requests | None, Callable[[int], None]]:
    """The open collection of ``pool`` (or None) and where a request's latency goes."""
    req = _open.get(pool)
    return req, (req.latencies_ns.append if req is not None else _discard)


def _discard(_: int) -> None:
    return None


@contextmanager
def phase(req: Requests | None, name: str) -> Iterator[None]:
    """Add the block's wall time to phase ``name`` of an open collection."""
    if req is None:
        yield
        return
    t0 = time.perf_counter_ns()
    try:
        yield
    finally:
        req.phases_ns[name] = req.phases_ns.get(name, 0) + time.perf_counter_ns() - t0
