"""Checkpoint sizing: which rank writes which files, and how many bytes.  Pure functions.

The formulas are DLIO's, reproduced exactly so that full-scale totals match the
published MLPerf Storage sizes (llama3_8b = 112,425,623,552 B):

* Rank mapping, TP innermost: ``tp = r % TP``, ``pp = (r // TP) % PP``, ``dp = r // (TP*PP)``.
* Stage ``pp`` holds ``L // PP`` blocks, the first ``L % PP`` stages one more; stage 0 also holds
  layer 0 (embedding), the last stage layers L+1 (lm_head) and L+2 (final norm).
* Under ZeRO 3 model tensors are sharded ``s = DP`` ways; the optimizer (3 fp32 copies) is always
  sharded over every rank when ZeRO > 0.
* File names follow DeepSpeed.  ZeRO 1/2: model states only on dp == 0 ranks (one file per layer
  when PP > 1).  ZeRO 3: one sharded model file per rank.  ZeRO 0: only dp == 0 ranks write
  (replicas are identical), as DLIO does.

``scale`` (open division) shrinks every file proportionally, rounded to whole 4 KiB pages (at
least one page), keeping the layout and file count.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import Literal

from mlckpt.errors import ConfigError
from mlckpt.workload.model import Workload

PAGE = 4096


def file_requests(nbytes: int, block_size: int, direct: bool) -> int:
    """The requests the engine issues for one file of ``nbytes``: one per ``io.block_size`` piece of
    its length on the storage, which O_DIRECT pads to a whole page (mlckpt/engine/files.py's
    ``RequestPlan``; a short transfer's continuation is the same request)."""
    length = -(-nbytes // PAGE) * PAGE if direct else nbytes
    return -(-length // block_size)
RestorePattern = Literal["own", "repopulate"]
RESTORE_PATTERNS: tuple[RestorePattern, ...] = ("own", "repopulate")


def restore_pattern(text: str) -> RestorePattern:
    """``checkpoint.restore`` as the pattern it names (the schema allows no other)."""
    for pattern in RESTORE_PATTERNS:
        if text == pattern:
            return pattern
    raise ConfigError(f"checkpoint.restore: expected own or repopulate, got {text!r}",
                      key="checkpoint.restore")


@dataclass(frozen=True)
class FileSpec:
    name: str
    bytes: int
    kind: Literal["model", "optimizer"]


@dataclass(frozen=True)
class RankPlan:
    rank: int
    tp: int
    pp: int
    dp: int
    mp_rank: int
    files: tuple[FileSpec, ...]

    @property
    def bytes(self) -> int:
        return sum(f.bytes for f in self.files)

    @property
    def model_bytes(self) -> int:
        return sum(f.bytes for f in self.files if f.kind == "model")

    @property
    def optimizer_bytes(self) -> int:
        return sum(f.bytes for f in self.files if f.kind == "optimizer")

    def layout_key(self) -> tuple[tuple[str, int], ...]:
        """Files with the rank-specific parts of their names masked: equal keys = same layout."""
        return tuple((_mask(f.name, self), f.bytes) for f in self.files)


def _mask(name: str, rp: RankPlan) -> str:
    return (name.replace(f"zero_pp_rank_{rp.dp}_", "zero_pp_rank_{dp}_")
                .replace(f"mp_rank_{rp.mp_rank}_", "mp_rank_{mp}_")
                .replace(f"model_{rp.mp_rank}_", "model_{mp}_"))


@dataclass(frozen=True)
class RestoreRead:
    """One file a rank reads on restore: the ``index``-th file of ``writer``'s plan."""

    writer: int
    index: int
    file: FileSpec


@dataclass(frozen=True)
class Plan:
    workload: Workload
    ranks: int
    scale: float
    rank_plans: tuple[RankPlan, ...]

    @property
    def tp(self) -> int:
        return self.workload.parallelism.tensor

    @property
    def pp(self) -> int:
        return self.workload.parallelism.pipeline

    @property
    def mp(self) -> int:
        return self.tp * self.pp

    @property
    def dp(self) -> int:
        return self.ranks // self.mp

    @property
    def zero_stage(self) -> int:
        return self.workload.parallelism.zero_stage

    @cached_property
    def digest(self) -> str:
        """SHA-256 of the layout (workload, ranks, scale, every rank's file names and sizes): what
        a witness is told at a run's start, recomputed by the checker from the bundle's config."""
        doc = [self.workload.name, self.ranks, self.scale,
               [[rp.rank, [[f.name, f.bytes] for f in rp.files]] for rp in self.rank_plans]]
        return hashlib.sha256(json.dumps(doc, separators=(",", ":")).encode()).hexdigest()

    @cached_property
    def model_bytes(self) -> int:
        return sum(r.model_bytes for r in self.rank_plans)

    @cached_property
    def optimizer_bytes(self) -> int:
        return sum(r.optimizer_bytes for r in self.rank_plans)

    @property
    def total_bytes(self) -> int:
        return self.model_bytes + self.optimizer_bytes

    @property
    def num_files(self) -> int:
        return sum(len(r.files) for r in self.rank_plans)

    @property
    def max_rank_bytes(self) -> int:
        return max(r.bytes for r in self.rank_plans)

    @property
    def imbalance(self) -> float:
        """max / mean bytes per rank: 1.0 is perfectly balanced."""
        return self.max_rank_bytes * self.ranks / self.total_bytes

    def restore_reads(self, rank: int, pattern: RestorePattern, shift: int = 0) -> tuple[RestoreRead, ...]:
        """What ``rank`` reads on restore.

        ``own``: exactly what it wrote.  ``repopulate``: a rank with no model-state files of its
        own (dp != 0 under ZeRO 0/1/2) also reads the model-state files of the dp == 0 rank with
        the same (tp, pp) coordinates, because restore must refill every replica.
        ``shift`` (IOR's -C): rank r restores what rank (r + shift) mod ranks would restore, so
        that with shift >= ranks per host no host reads data it wrote itself.
        """
        role = (rank + shift) % self.ranks
        rp = self.rank_plans[role]
        reads = [RestoreRead(role, i, f) for i, f in enumerate(rp.files)]
        if pattern == "repopulate" and rp.dp != 0 and self.zero_stage < 3:
            src = self.rank_plans[rp.mp_rank]  # dp == 0, same mp_rank
            model = [RestoreRead(src.rank, i, f) for i, f in enumerate(src.files) if f.kind == "model"]
            optim = [RestoreRead(src.rank, i, f) for i, f in enumerate(src.files) if f.kind == "optimizer"]
            reads = model + (reads if self.zero_stage != 0 else optim)
        return tuple(reads)

    def restore_bytes(self, pattern: RestorePattern) -> int:
        return sum(rd.file.bytes for r in range(self.ranks) for rd in self.restore_reads(r, pattern))

    def own_resident_bytes(self, rank: int) -> int:
        """Page-rounded bytes of the files ``rank`` writes (one copy of its shard)."""
        return sum(pages(f.bytes) for f in self.rank_plans[rank].files) * PAGE

    def resident_bytes(self, rank: int, pattern: RestorePattern = "own", shift: int = 0) -> int:
        """State a rank holds in memory under full residency: page-rounded buffers for its shard,
        or for what it restores if that is larger (one arena serves both phases)."""
        own = sum(pages(f.bytes) for f in self.rank_plans[rank].files)
        reads = sum(pages(rd.file.bytes) for rd in self.restore_reads(rank, pattern, shift))
        return max(own, reads) * PAGE

    def layout_groups(self) -> list[tuple[list[int], RankPlan]]:
        """Ranks with identical layouts grouped (for readable reports at 1024 ranks)."""
        groups: dict[tuple[tuple[str, int], ...], tuple[list[int], RankPlan]] = {}
        for rp in self.rank_plans:
            groups.setdefault(rp.layout_key(), ([], rp))[0].append(rp.rank)
        return list(groups.values())


def pages(nbytes: int) -> int:
    """Whole 4 KiB pages needed to hold ``nbytes``."""
    return -(-nbytes // PAGE)


def auto_rank_shift(ranks_per_host: list[int]) -> int:
    """IOR -C style shift: the largest host's rank count when there are several hosts, else 0."""
    return max(ranks_per_host) if len(ranks_per_host) > 1 else 0


def rank_coords(rank: int, tp: int, pp: int) -> tuple[int, int, int, int]:
    """(tp, pp, dp, mp_rank) of ``rank``, TP innermost (as DLIO)."""
    mp = tp * pp
    return rank % tp, (rank // tp) % pp, rank // mp, rank % mp


def stage_layers(num_layers: int, pp: int, stage: int) -> range:
    """Layer indices (0..L+2) held by pipeline ``stage``."""
    per, rem = divmod(num_layers, pp)
    if stage < rem:
        start = stage * (per + 1) + 1
        end = start + per + 1
    else:
        start = rem * (per + 1) + (stage - rem) * per + 1
        end = start + per
    if stage == pp - 1:
        end = num_layers + 3  # lm_head (L+1) and final norm (L+2)
    if stage == 0:
        start = 0
    return range(start, end)


def layer_elements(workload: Workload, layer: int, dp: int) -> int:
    m, tp = workload.model, workload.parallelism.tensor
    h, V, L, f = m.hidden_size, m.vocab_size, m.num_layers, m.ffn_hidden_size
    s = dp if workload.parallelism.zero_stage >= 3 else 1
    if layer in (0, L + 1):
        return h * V // tp // s
    if layer == L + 2:
        return h // s
    return (h // s + h * (h + 2 * m.kv_dim) // tp // s + h * h // tp // s + h // s
            + h * 2 * f // tp // s + h * f // tp // s)


def optimizer_bytes_per_rank(workload: Workload, dp: int) -> int:
    m, mp = workload.model, workload.parallelism.model_parallel
    n = m.num_parameters // (dp * mp) if workload.parallelism.zero_stage > 0 else m.num_parameters // mp
    return (3 * n + 15 * m.hidden_size) * m.optimizer_dtype_bytes


def scale_bytes(nbytes: int, scale: float) -> int:
    """Nearest whole 4 KiB pages (at least one), never more than the full size: monotone in
    ``scale`` and a file never grows (a full-size file need not be a page multiple)."""
    if scale == 1.0:
        return nbytes
    return min(nbytes, max(PAGE, round(nbytes * scale / PAGE) * PAGE))


def _rank_files(workload: Workload, rank: int, dp_size: int, stage_cache: dict[int, list[tuple[int, int]]],
                optim: int, scale: float) -> Iterator[FileSpec]:
    tp, pp = workload.parallelism.tensor, workload.parallelism.pipeline
    zero = workload.parallelism.zero_stage
    _, stage, dp, mp_rank = rank_coords(rank, tp, pp)
    if zero == 0 and dp != 0:
        return
    layers = stage_cache[stage]
    dtype = workload.model.model_dtype_bytes
    if zero in (1, 2):
        if dp == 0:
            if pp > 1:
                for layer, elems in layers:
                    yield FileSpec(f"layer_{layer}-model_{mp_rank}_model_states.pt",
                                   scale_bytes(elems * dtype, scale), "model")
            else:
                yield FileSpec(f"model_{mp_rank}_model_states.pt",
                               scale_bytes(sum(e for _, e in layers) * dtype, scale), "model")
    else:
        yield FileSpec(f"zero_pp_rank_{dp}_mp_rank_{mp_rank}_model_states.pt",
                       scale_bytes(sum(e for _, e in layers) * dtype, scale), "model")
    yield FileSpec(f"zero_pp_rank_{dp}_mp_rank_{mp_rank}_optim_states.pt",
                   scale_bytes(optim, scale), "optimizer")


def make_plan(workload: Workload, ranks: int, scale: float = 1.0) -> Plan:
    """Plan every rank's files.  Preconditions (the structural rules RANKS-MULTIPLE,
    ZERO3-PIPELINE, LAYERS-PIPELINE, SCALE-RANGE) are checked by :mod:`mlckpt.rules` first."""
    tp, pp = workload.parallelism.tensor, workload.parallelism.pipeline
    mp = tp * pp
    if ranks <= 0 or ranks % mp or not 0 < scale <= 1 or workload.model.num_layers < pp:
        raise ValueError("make_plan called with a structurally invalid configuration")
    dp = ranks // mp
    stage_cache = {
        s: [(layer, layer_elements(workload, layer,
                                   dp)) for layer in stage_layers(workload.model.num_layers, pp, s)]
        for s in range(pp)
    }
    optim = optimizer_bytes_per_rank(workload, dp)
    plans = []
    for r in range(ranks):
        rtp, rpp, rdp, mp_rank = rank_coords(r, tp, pp)
        files = tuple(_rank_files(workload, r, dp, stage_cache, optim, scale))
        plans.append(RankPlan(r, rtp, rpp, rdp, mp_rank, files))
    return Plan(workload, ranks, scale, tuple(plans))
