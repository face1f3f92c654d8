"""Who reads what when replicas load a model: the byte ranges each GPU (MPI rank) of a serving
layout reads from the storage, from its host's node-local tier, and receives from other GPUs, under
each loading strategy (mlckpt/workload/serving.py).  Pure.

Rank ``r`` of a loading run is GPU ``r % tp`` of replica ``r // tp``, and holds tensor-parallel
shard ``r % tp`` once loaded; ``hosts[r]`` is the host it runs on.  A shard is its files one after
another (``ServingLayout.shard_files``); a :class:`Piece` is a byte range of one of them.

* ``direct``: each rank reads its shard's files from the storage.
* ``fanout``: the ranks that hold the same shard (one in each replica) split its bytes into
  near-equal parts of whole pages, in rank order; each reads its part from the storage and
  receives the others' over the network (an all-gather among them).  The storage serves each shard once.
* ``nodecache``: the first rank of each host reads every shard its host's ranks hold from the
  storage into the node-local tier; then every rank reads its shard from that tier.  The storage
  serves each shard once per host that holds it.

Whatever the strategy, every rank ends holding exactly its shard: the pieces it reads and the parts
it receives cover it once (tests/unit/plan/test_serving_load.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mlckpt.errors import ConfigError
from mlckpt.workload.serving import (
    FANOUT_CHUNK_BYTES,
    STRATEGIES,
    ServingLayout,
    Strategy,
    fanout_round_count,
    part,
)


@dataclass(frozen=True)
class Piece:
    """``length`` bytes at ``offset`` of file ``file`` of shard ``shard``."""

    shard: int
    file: int
    offset: int
    length: int


@dataclass(frozen=True)
class RankLoad:
    """What one rank does to hold its shard."""

    rank: int
    replica: int
    shard: int
    host: str
    storage: tuple[Piece, ...]  # read from the shared storage
    node_tier: tuple[Piece, ...]  # read from its host's node-local tier (nodecache)
    received_bytes: int  # from other ranks over the network (fanout)

    @property
    def storage_bytes(self) -> int:
        return sum(p.length for p in self.storage)

    @property
    def node_tier_bytes(self) -> int:
        return sum(p.length for p in self.node_tier)


@dataclass(frozen=True)
class LoadPlan:
    layout: ServingLayout
    strategy: Strategy
    shard_files: tuple[tuple[int, ...], ...]  # the sizes of each shard's files, at the run's scale
    ranks: tuple[RankLoad, ...]

    def shard_bytes(self, shard: int) -> int:
        return sum(self.shard_files[shard])

    @property
    def storage_bytes(self) -> int:
        """Bytes the storage serves to bring every replica up."""
        return sum(r.storage_bytes for r in self.ranks)

    @property
    def placed_bytes(self) -> int:
        """Bytes held in the replicas once loaded: every rank's shard."""
        return sum(self.shard_bytes(r.shard) for r in self.ranks)

    @property
    def received_bytes(self) -> int:
        return sum(r.received_bytes for r in self.ranks)

    def host_storage_bytes(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.ranks:
            out[r.host] = out.get(r.host, 0) + r.storage_bytes
        return out

    def fanout_group(self, shard: int) -> tuple[int, ...]:
        """The ranks that hold ``shard`` (one in each replica), in rank order."""
        return tuple(r.rank for r in self.ranks if r.shard == shard)

    def pieces(self, shard: int, start: int, length: int) -> tuple[Piece, ...]:
        """The byte range [start, start + length) of the shard, per file."""
        return _pieces(shard, self.shard_files[shard], start, length)

    def fanout_rounds(self, shard: int,
                      chunk_bytes: int = FANOUT_CHUNK_BYTES) -> tuple[tuple[Span, ...], ...]:
        """Fan-out's exchange, pipelined: in round j every holder of ``shard`` (in
        :meth:`fanout_group`'s order) sends the j-th chunk of its part, ``(start, length)`` in the
        shard, while it reads the next.  Every holder's part in the same number of rounds, its
        chunks whole pages of at most ``chunk_bytes`` (the largest part's), covering it once."""
        total, holders = self.shard_bytes(shard), len(self.fanout_group(shard))
        parts = [fanout_part(total, holders, i) for i in range(holders)]
        rounds = fanout_round_count(total, holders, chunk_bytes)
        out = []
        for j in range(rounds):
            row = []
            for start, n in parts:
                share = -(-n // rounds)
                size = -(-share // PAGE) * PAGE  # a round's share, whole pages
                lo = min(n, j * size)
                row.append((start + lo, min(n, lo + size) - lo))
            out.append(tuple(row))
        return tuple(out)


PAGE = 4096  # a scaled file stays a whole number of pages (O_DIRECT reads it in whole pages)
Span = tuple[int, int]  # (start, length) in a shard


def scaled_files(layout: ServingLayout, shard: int, scale: float) -> tuple[int, ...]:
    """The shard's files at ``scale``: as many files as at full size, near-equal, whole pages."""
    full = layout.shard_files(shard)
    if scale >= 1:
        return full
    pages = max(len(full), int(layout.shard_bytes(shard) * scale) // PAGE)
    return tuple(part(pages, len(full), i) * PAGE for i in range(len(full)))


def _pieces(shard: int, files: Sequence[int], start: int, length: int) -> tuple[Piece, ...]:
    """The byte range [start, start + length) of the shard's files laid end to end, per file."""
    out: list[Piece] = []
    base = 0
    for i, size in enumerate(files):
        lo, hi = max(start, base), min(start + length, base + size)
        if lo < hi:
            out.append(Piece(shard, i, lo - base, hi - lo))
        base += size
    return tuple(out)


def fanout_part(total: int, holders: int, index: int) -> tuple[int, int]:
    """Where holder ``index`` of ``holders`` starts in a shard of ``total`` bytes, and how much it
    reads: near-equal parts in whole pages (so that O_DIRECT reads them in place), the last part
    ending at the shard's end."""
    pages = -(-total // PAGE)
    start = PAGE * (index * (pages // holders) + min(index, pages % holders))  # the parts before it
    end = min(total, start + PAGE * part(pages, holders, index))
    return min(start, total), max(0, end - start)


def load_plan(layout: ServingLayout, strategy: str, hosts: Sequence[str], scale: float = 1.0) -> LoadPlan:
    """Every rank's part of loading ``layout.replicas`` replicas with ``strategy``; ``hosts[r]`` is
    rank r's host.  ConfigError naming the key where the ranks or the strategy do not fit."""
    if strategy not in STRATEGIES:
        raise ConfigError(f"serving.strategy: unknown {strategy!r}; known: {', '.join(STRATEGIES)}",
                          key="serving.strategy")
    tp, want = layout.tp, layout.replicas * layout.tp
    if len(hosts) != want:
        raise ConfigError(f"ranks: {layout.replicas} replicas of TP {tp} are {want} ranks, got {len(hosts)}",
                          key="ranks")
    if not 0 < scale <= 1:
        raise ConfigError(f"scale: expected 0 < scale <= 1, got {scale}", key="scale")
    files = tuple(scaled_files(layout, s, scale) for s in range(tp))
    first_on_host: dict[str, int] = {}
    for r, h in enumerate(hosts):
        first_on_host.setdefault(h, r)
    host_shards: dict[str, list[int]] = {}
    for r, h in enumerate(hosts):
        if r % tp not in host_shards.setdefault(h, []):
            host_shards[h].append(r % tp)
    totals = [sum(f) for f in files]
    wholes = [_pieces(s, files[s], 0, totals[s]) for s in range(tp)]  # each shard's files, whole
    loads = []
    for r, h in enumerate(hosts):
        shard, replica = r % tp, r // tp
        storage, received = wholes[shard], 0
        tier: tuple[Piece, ...] = ()
        if strategy == "fanout":
            start, mine = fanout_part(totals[shard], layout.replicas, replica)
            storage, received = _pieces(shard, files[shard], start, mine), totals[shard] - mine
        elif strategy == "nodecache":
            tier = wholes[shard]
            first = first_on_host[h] == r  # the host's first rank fills its tier
            storage = tuple(p for s in sorted(host_shards[h]) for p in wholes[s]) if first else ()
        loads.append(RankLoad(r, replica, shard, h, storage, tier, received))
    return LoadPlan(layout, strategy, files, tuple(loads))


def placement(layout: ServingLayout) -> tuple[str, ...]:
    """Each rank's host, named host0, host1, ...: whole replicas to a host (``replicas_per_host``
    of them), or a replica over ``hosts_per_replica`` whole hosts; what `mlckpt plan` and `size`
    assume (mlckpt/workload/serving.py: ``ServingLayout.hosts``) before a run says where its ranks ran."""
    per_host = layout.replicas_per_host * layout.tp or layout.gpus_per_host
    return tuple(f"host{r // per_host}" for r in range(layout.replicas * layout.tp))
