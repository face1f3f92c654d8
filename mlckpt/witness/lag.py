"""The witness's own scheduling, measured: how late its clock reading of a request could be.

A witness stamps a request when its handler runs, not when the bytes arrived.  Between the two,
the witness's event loop may have been busy (a flood of other requests, a journal's fsync done
inline, a collection) or the whole process off the CPU (a busy host).  An op's end stamped late
makes the witness's interval longer than the op was, and WITNESS-TIMES would read that as a run
claiming a shorter op than it had.  So a tick runs every ``period_ns`` on the witness's loop; a
tick that runs late is a time the loop could not serve anything.  ``lag_ns(t)``: the longest time
up to ``t`` the loop had been unable to run, in a blockage still going on or ending within a
period of ``t`` (a request that arrived during it waited at most that long).  A request that
arrived while the loop was free waited at most one period, which the rules' fixed slack covers.

The tick is the witness's own measurement: a client cannot make it larger except by loading the
witness itself, and then the stamps really are that late.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque

PERIOD_NS = 5_000_000  # 200 ticks a second: a few µs of CPU each
LATE_NS = 1_000_000  # a tick later than this is kept (on-time ticks say nothing)
KEEP = 1024  # the late ticks remembered (only the last period's matter)


class LagMeter:
    def __init__(self, period_ns: int = PERIOD_NS) -> None:
        self.period_ns = period_ns
        self.due_ns: int | None = None  # when the pending tick should run (None: not ticking)
        self.late: deque[tuple[int, int]] = deque(maxlen=KEEP)  # (due, ran) of late ticks
        self.worst_ns = 0  # the largest lateness seen (shown when the witness stops)

    def ran(self, due: int, now: int) -> None:
        """A tick due at ``due`` ran at ``now``."""
        if now - due > LATE_NS:
            self.late.append((due, now))
            self.worst_ns = max(self.worst_ns, now - due)

    def lag_ns(self, t: int) -> int:
        """How long before monotonic time ``t`` the loop may have been unable to run a handler."""
        worst = 0
        if self.due_ns is not None and self.due_ns <= t:  # the pending tick is overdue: blocked now
            worst = t - self.due_ns
        for due, ran in reversed(self.late):
            if ran < t - self.period_ns:
                break
            if due <= t:
                worst = max(worst, min(ran, t) - due)
        return worst

    async def run(self) -> None:
        """Tick until cancelled."""
        while True:
            self.due_ns = time.monotonic_ns() + self.period_ns
            await asyncio.sleep(self.period_ns / 1e9)
            self.ran(self.due_ns, time.monotonic_ns())
