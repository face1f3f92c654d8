"""The checkpoint pipeline a configuration asks for: what training waits for, what runs in the
background, where each checkpoint lives, and which tier a restore reads.  Pure: the runner, the
rules and the checker all derive these facts from here.

Modes (``checkpoint.mode``, ``checkpoint.tiers``):

* sync, one tier: training waits while the checkpoint is written to the durable tier (the
  reference behaviour, and the closed division's only mode).
* async (open): training waits while the state is copied into a host staging area (``memory``
  stage); the persist to storage then runs in the background while training goes on.
* tiered (open; with sync or async): the checkpoint goes to a fast tier first (node-local disk or a
  memory-backed filesystem) and is drained to the durable tier in the background; the drain reads
  the fast copy back and verifies every page before writing it (so the durable copy is made from
  verified bytes).  The newest ``fast_keep`` checkpoints stay on the fast tier once durable.

One staging slot: checkpoint k+1's stall starts by waiting until checkpoint k is durable (that
wait is the *back-pressure*), so at most one checkpoint is in flight.  Consequences used below:
the fast tier holds at most ``min(fast_keep, num_writes - 1) + 1`` checkpoints at once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

MEMORY, FAST, DURABLE = "memory", "fast", "durable"
STAGES = (MEMORY, FAST, DURABLE)
MEMORY_FILESYSTEMS = frozenset({"tmpfs", "ramfs"})  # a fast tier here is host memory



def ring_bytes(threads: int, block_size: int, *, verifying: bool) -> int:
    """The one ring formula: a streaming op's bounded buffer per rank holds one block per thread in
    flight, two when each block is verified (the block read and the expected copy).  Used by the
    stream engine, the drain and the configuration check of ``stream_buffer_bytes``."""
    return block_size * threads * (2 if verifying else 1)

@dataclass(frozen=True)
class Pipeline:
    mode: str = "sync"  # sync | async
    fast: str | None = None  # fast-tier folder; None: one tier
    fast_keep: int = 1
    compute_interval_s: float = 0.0

    @classmethod
    def of(cls, config: Mapping[str, Any]) -> Pipeline:
        ck = config.get("checkpoint") or {}
        tiers = ck.get("tiers") or {}
        return cls(mode=str(ck.get("mode", "sync")), fast=tiers.get("fast"),
                   fast_keep=int(tiers.get("fast_keep", 1)),
                   compute_interval_s=float(ck.get("compute_interval_s", 0.0)))

    @property
    def tiered(self) -> bool:
        return self.fast is not None

    @property
    def blocking(self) -> str:
        """The stage training waits for."""
        return MEMORY if self.mode == "async" else FAST if self.tiered else DURABLE

    @property
    def background(self) -> tuple[str, ...]:
        """The stages that run behind training, in order (the last is always durable)."""
        if self.mode == "async":
            return (FAST, DURABLE) if self.tiered else (DURABLE,)
        return (DURABLE,) if self.tiered else ()

    @property
    def stages(self) -> tuple[str, ...]:
        return (self.blocking, *self.background)

    @property
    def label(self) -> str:
        """Short mode label for reports: sync, async, sync+tiers, async+tiers."""
        return self.mode + ("+tiers" if self.tiered else "")

    def fast_retained(self, num_writes: int) -> range:
        """Checkpoints still on the fast tier when the restores start."""
        if not self.tiered:
            return range(0)
        return range(max(1, num_writes - self.fast_keep + 1), num_writes + 1)

    def evict_after(self, k: int) -> range:
        """Fast-tier copies to remove once checkpoint k is durable (the older ones, oldest first)."""
        if not self.tiered:
            return range(0)
        last = k - self.fast_keep
        return range(max(1, last), last + 1) if last >= 1 else range(0)

    def fast_peak_checkpoints(self, num_writes: int) -> int:
        """Most checkpoints the fast tier holds at once (one slot: see the module docstring)."""
        return min(self.fast_keep, num_writes - 1) + 1 if self.tiered else 0

    def restore_tier(self, ckpt: int, num_writes: int, writer_hosts: Iterable[str], reader_host: str) -> str:
        """The nearest tier holding a copy of everything a rank restores: the fast tier when the
        checkpoint is still there and every file was written on the reader's own host (the fast
        tier is node-local), else the durable tier."""
        if ckpt in self.fast_retained(num_writes) and all(h == reader_host for h in writer_hosts):
            return FAST
        return DURABLE

    def staging_bytes(self, own_resident_bytes: int) -> int:
        """Host staging a rank needs beyond its state: a full copy of its shard in async mode."""
        return own_resident_bytes if self.mode == "async" else 0

    def drain_ring_bytes(self, threads: int, block_size: int) -> int:
        """The drain's bounded buffer per rank (it verifies what it reads: see ring_bytes)."""
        return ring_bytes(threads, block_size, verifying=True) if self.tiered else 0
