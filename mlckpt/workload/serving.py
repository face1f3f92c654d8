"""Loading a model for inference: the weights only, sharded by tensor parallelism, read by many
replicas at once.  Pure.

A serving replica holds the model's weights (bf16: 2 B a parameter; no optimizer state) over ``tp``
GPUs, each GPU one tensor-parallel shard, as serving stacks shard them (Megatron's and vLLM's
layout): the embedding and the LM head split by vocabulary rows, each attention and MLP matrix
split by heads or columns, the norms replicated; with more GPUs than key/value heads each GPU
holds one whole key/value head.  Each shard is stored as files of at most ``shard_file_bytes``
(Hugging Face's ``save_pretrained`` writes shards of at most 5 GB by default).

Bringing replicas up is a read workload unlike a training restore: every new replica needs the
same bytes, and what counts is the time until the last one holds them.  Three ways to load (the
seed talk's direct and hierarchical loading, and a node-local cache), modelled here for sizing:

* ``direct``: every replica's GPUs read their shards from the storage.
* ``fanout``: the new replicas split the reads of each shard among the hosts that need it and
  exchange the parts over the network (hierarchical loading): the storage serves each byte once.
* ``nodecache``: one reader per host reads what the host's replicas need into a node-local tier;
  the replicas read it from there.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from mlckpt.errors import ConfigError
from mlckpt.units import GB, fmt_duration
from mlckpt.workload.model import DTYPE_BYTES, ModelShape

Strategy = Literal["direct", "fanout", "nodecache"]
STRATEGIES: tuple[Strategy, ...] = ("direct", "fanout", "nodecache")
DEFAULT_SHARD_FILE_BYTES = 5 * GB  # transformers' save_pretrained(max_shard_size="5GB")
DEFAULT_DTYPE = "bf16"


def fmt_gb(n: float) -> str:
    """Decimal units, as NICs, storage data sheets and serving stacks' shard sizes are given."""
    return f"{n / GB:,.2f} GB"


# Fan-out reads a holder's part in chunks of at most this, each sent to the other holders while
# the next is read (mlckpt/workload/serving_load.py: LoadPlan.fanout_rounds); the sizer's model too.
FANOUT_CHUNK_BYTES = 16 * 2**20


def fanout_round_count(shard_bytes: int, holders: int, chunk_bytes: int = FANOUT_CHUNK_BYTES) -> int:
    """How many rounds fan-out's pipeline takes for a shard split over ``holders``: its largest
    part (the first: whole pages, ``serving_load.fanout_part``) in chunks of at most ``chunk_bytes``;
    what ``LoadPlan.fanout_rounds`` runs and the sizer models."""
    pages = -(-shard_bytes // 4096)
    largest = min(shard_bytes, 4096 * -(-pages // max(1, holders)))
    return max(1, -(-largest // chunk_bytes))


def part(n: int, ways: int, index: int) -> int:
    """The ``index``-th of ``ways`` near-equal parts of ``n`` (the first ``n % ways`` one larger)."""
    return n // ways + (index < n % ways)


@dataclass(frozen=True)
class ServingLayout:
    """One model served by ``replicas`` replicas of ``tp`` GPUs each, ``gpus_per_host`` to a host."""

    name: str
    model: ModelShape
    tp: int
    replicas: int
    gpus_per_host: int = 8
    shard_file_bytes: int = DEFAULT_SHARD_FILE_BYTES
    dtype: str = DEFAULT_DTYPE

    def __post_init__(self) -> None:
        for key in ("tp", "replicas", "gpus_per_host", "shard_file_bytes"):
            if getattr(self, key) < 1:
                raise ConfigError(f"{key}: must be positive, got {getattr(self, key)}", key=key)
        if self.dtype not in DTYPE_BYTES:
            raise ConfigError(f"dtype: unknown {self.dtype!r}; known: {', '.join(DTYPE_BYTES)}", key="dtype")
        if self.tp > self.gpus_per_host and self.tp % self.gpus_per_host:
            raise ConfigError(f"tp: a replica of {self.tp} GPUs spans whole hosts of {self.gpus_per_host}: "
                              f"give a multiple of {self.gpus_per_host}", key="tp")
        if self.tp > self.model.num_attention_heads:
            raise ConfigError(f"tp: {self.tp} GPUs for {self.model.num_attention_heads} attention heads: at "
                              "most one GPU a head", key="tp")

    def shard_params(self, rank: int) -> int:
        """Parameters tensor-parallel rank ``rank`` holds."""
        m, tp = self.model, self.tp
        h, f, v = m.hidden_size, m.ffn_hidden_size, m.vocab_size
        heads = part(m.num_attention_heads, tp, rank)
        kv_heads = part(m.num_kv_heads, tp, rank) if m.num_kv_heads >= tp else 1
        per_layer = (2 * h  # the two norms, on every rank
                     + 2 * heads * m.head_dim * h  # q and o: this rank's heads
                     + 2 * kv_heads * m.head_dim * h  # k and v
                     + 3 * part(f, tp, rank) * h)  # gate, up and down: this rank's columns
        return 2 * part(v, tp, rank) * h + m.num_layers * per_layer + h

    def shard_bytes(self, rank: int) -> int:
        return self.shard_params(rank) * DTYPE_BYTES[self.dtype]

    def shard_files(self, rank: int) -> tuple[int, ...]:
        """Sizes of the files of one shard: at most ``shard_file_bytes`` each, near-equal."""
        total = self.shard_bytes(rank)
        n = max(1, math.ceil(total / self.shard_file_bytes))
        return tuple(part(total, n, i) for i in range(n))

    @property
    def replica_bytes(self) -> int:
        """What one replica reads: every shard once."""
        return sum(self.shard_bytes(r) for r in range(self.tp))

    @property
    def model_bytes(self) -> int:
        """The unsharded weights (each parameter once)."""
        return self.model.num_parameters * DTYPE_BYTES[self.dtype]

    @property
    def replicas_per_host(self) -> int:
        """Whole replicas on one host (0 when a replica spans hosts)."""
        return self.gpus_per_host // self.tp

    @property
    def hosts_per_replica(self) -> int:
        return max(1, self.tp // self.gpus_per_host)

    def hosts(self, replicas: int | None = None) -> int:
        n = self.replicas if replicas is None else replicas
        if self.replicas_per_host:
            return math.ceil(n / self.replicas_per_host)
        return n * self.hosts_per_replica

    @property
    def host_bytes(self) -> int:
        """What one full host's GPUs read directly: its replicas' shards, or its part of one."""
        if self.replicas_per_host:
            return self.replicas_per_host * self.replica_bytes
        return self.replica_bytes // self.hosts_per_replica

    @property
    def host_distinct_bytes(self) -> int:
        """The distinct bytes one host needs (its replicas share the same shards)."""
        return self.replica_bytes if self.replicas_per_host else self.host_bytes


@dataclass(frozen=True)
class Links:
    """The machine's rates in bytes/s: the storage's aggregate read rate, and optionally each
    host's link to the storage, each host's network to the other hosts, and its node-local
    tier's read rate (None: not a limit)."""

    storage: float
    host_link: float | None = None
    network: float | None = None
    node_tier: float | None = None


@dataclass(frozen=True)
class ScaleUp:
    """Bringing replicas ``from_replicas`` to ``to_replicas`` with one strategy."""

    strategy: Strategy
    new_replicas: int
    new_hosts: int
    replica_bytes: int
    storage_bytes: int
    seconds: float
    bottleneck: str
    steps: tuple[str, ...]
    network_bytes: int = 0  # what each new host receives from the others (fan-out)

    @property
    def placed_bytes_s(self) -> float:
        """Effective loading bandwidth: bytes placed in the new replicas per second."""
        return self.new_replicas * self.replica_bytes / self.seconds

    def to_dict(self) -> dict[str, object]:
        d: dict[str, object] = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "steps"}
        d["placed_bytes_s"] = self.placed_bytes_s
        d["steps"] = list(self.steps)
        return d


Term = tuple[str, float, str]  # (what bounds the load, seconds, the arithmetic)


def _rate(what: str, nbytes: float, rate: float | None, how: str) -> list[Term]:
    if not rate:
        return []
    t = nbytes / rate
    return [(what, t, f"{what}: {how} {fmt_gb(nbytes)}, at {fmt_gb(rate)}/s: {fmt_duration(t)}")]


def _direct(layout: ServingLayout, k: int, hosts: int, links: Links,
            scale: float) -> tuple[float, list[Term]]:
    storage = k * layout.replica_bytes * scale
    return storage, (_rate("storage", storage, links.storage,
                           f"every replica reads its weights, {k} × {fmt_gb(layout.replica_bytes * scale)} =")
                     + _rate("host link", layout.host_bytes * scale, links.host_link, "a host reads"))


def _fanout(layout: ServingLayout, k: int, hosts: int, links: Links,
            scale: float) -> tuple[float, list[Term]]:
    storage = layout.replica_bytes * scale  # the hosts that need a shard split its reads: each byte once
    own = storage / hosts
    return storage, (_rate("storage", storage, links.storage,
                           f"each shard read once, split over {hosts} hosts:")
                     + _rate("host link", own, links.host_link, "a host reads its part,")
                     + _rate("network", _received(layout, hosts, scale), links.network,
                             "a host receives the rest of what it needs,"))


def _received(layout: ServingLayout, hosts: int, scale: float) -> float:
    """What each of fan-out's hosts receives from the others: what it needs, less what it read."""
    return max(0.0, (layout.host_distinct_bytes - layout.replica_bytes / hosts) * scale)


def _nodecache(layout: ServingLayout, k: int, hosts: int, links: Links,
               scale: float) -> tuple[float, list[Term]]:
    need = layout.host_distinct_bytes * scale
    storage = hosts * need
    return storage, (_rate("storage", storage, links.storage,
                           f"one reader a host reads what its replicas need, {hosts} × {fmt_gb(need)} =")
                     + _rate("host link", need, links.host_link, "a host's reader reads"))


_FILL = {"direct": _direct, "fanout": _fanout, "nodecache": _nodecache}


def scale_up(layout: ServingLayout, from_replicas: int, to_replicas: int, links: Links,
             strategy: Strategy, scale: float = 1.0) -> ScaleUp:
    """How long until ``to_replicas - from_replicas`` new replicas, on hosts of their own, all hold
    their weights; the running replicas are not sources.  Each term is a rate bound, the slowest
    the bottleneck; fan-out's exchange overlaps its reads round by round and a node cache's GPUs
    read from its tier after the fill, as the loading code does them.  Within a host the GPUs share
    what the host read (not a bound here).  ``scale``: of the weights' bytes, as a run's ``scale``
    (the rounds of fan-out's pipeline are the scaled shard's)."""
    if not 0 <= from_replicas < to_replicas:
        raise ValueError(f"replicas: expected FROM:TO with 0 <= FROM < TO, "
                         f"got {from_replicas}:{to_replicas}")
    k = to_replicas - from_replicas
    hosts = layout.hosts(k)
    storage, terms = _FILL[strategy](layout, k, hosts, links, scale)
    replica = int(layout.replica_bytes * scale)
    steps = [f"{k} new replicas of {layout.tp} GPUs ({fmt_gb(replica)} each) "
             f"on {hosts} hosts", *(t[2] for t in terms)]
    reads = [t for t in terms if t[0] != "network"]
    name, seconds, _ = max(reads or terms, key=lambda t: t[1])
    exchange = [t for t in terms if t[0] == "network"]
    if strategy == "fanout" and reads and exchange:
        # as mlckpt/run/phases/loads.py does: each holder reads its part in rounds and sends each
        # round's chunk while it reads the next, so one round of the faster is not hidden
        read_s, (_, exchange_s, _) = seconds, exchange[0]
        rounds = fanout_round_count(int(layout.replica_bytes * scale) // layout.tp, k)
        seconds = max(read_s, exchange_s) + min(read_s, exchange_s) / rounds
        name = "network" if exchange_s > read_s else name
        steps.append(f"the reads and the exchange overlapped in {rounds} rounds of at most "
                     f"{FANOUT_CHUNK_BYTES >> 20} MiB a holder: max({fmt_duration(read_s)}, "
                     f"{fmt_duration(exchange_s)}) + 1/{rounds} of the other = {fmt_duration(seconds)}")
    if strategy == "nodecache":
        after = _rate("node tier", layout.host_bytes * scale, links.node_tier,
                      "then the host's GPUs read from it")
        if after:
            steps.append(after[0][2] + " (after the fill)")
            name = after[0][0] if after[0][1] > seconds else name
            seconds += after[0][1]
    steps.append(f"time until every new replica holds its weights: {fmt_duration(seconds)} "
                 f"(bottleneck: {name})")
    received = _received(layout, hosts, scale) if strategy == "fanout" else 0.0
    return ScaleUp(strategy, k, hosts, replica, int(storage), seconds, name, tuple(steps), int(received))
