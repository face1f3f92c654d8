"""The fault seam: the few points of a run where a test may change the world.

Production code runs with :data:`NO_FAULTS`, whose every hook does nothing.  A test passes its own
:class:`Faults` subclass to :func:`mlckpt.run.runner.mpi_main` from a launcher that lives in
``tests/`` (``tests/support/fault_launcher.py``); no environment variable or switch in the product turns
a fault on, so an ordinary bundle can never have been made with one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol


class Place(Protocol):
    """Where a run's files are, as a storage names them (mlckpt.run.storage.backends.Storage)."""

    def at(self, name: str = "") -> str: ...


class Faults:
    """Hooks called by the runner.  Each default does nothing (or returns its input)."""

    def timed_action(self, rank: int, op: str, index: int,
                     action: Callable[[], object]) -> Callable[[], object]:
        """Called before each timed op (``write``, ``read``, ``drain``, a serving run's ``load``); the
        returned callable runs inside the timed region, after t0."""
        return action

    def after_writes(self, rank: int, durable: Place, fast_root: Path | None, plan: object, nw: int) -> None:
        """Between the write phase and the restores, after the post-write cache eviction;
        ``durable``: the run's place on the durable tier."""

    def before_drain(self, rank: int, k: int, fast_root: Path, names: Sequence[str]) -> None:
        """In the background thread, before checkpoint k's fast copy is drained to durable."""


NO_FAULTS = Faults()
