"""Resuming at another scale: which bytes of a checkpoint written at N ranks each of M new ranks
reads, and where they land in its state.  Pure.

A checkpoint's **index** is what a framework keeps as its metadata (DCP's ``.metadata``): every
global tensor of the model and of its optimizer, and where each piece of it is stored, built from
the writing plan's named tensors (``mlckpt/workload/tensors.py``).  A global tensor is what the
checkpoint's pieces of it make together:

* a tensor that tensor parallelism splits (every matrix: the embedding, each layer's attention and
  MLP weights, the LM head, and their optimizer states) is its TP shards one after another, each
  a block of whole rows (this model splits every matrix along its first dimension, so a new shard
  is one contiguous range of each old one; a row-parallel layer's real split is strided);
* a tensor TP replicates (the norms and their optimizer states) is stored once per TP rank: each
  copy is the whole tensor, and a new rank reads the copy of old TP rank ``new tp % old TP``;
* a tensor sharded over data parallelism (model states under ZeRO 3, the optimizer under ZeRO 1-3)
  is its flat DP shards one after another; one replicated over data parallelism is stored by the
  ``dp == 0`` ranks only.

A new rank's **state** is its shard of every global tensor of its new pipeline stage, under the new
TP and DP with the same ZeRO stage: model parameters first, then their optimizer states, end to end.
It holds the checkpoint's tensors re-split, so the new ranks together hold the bytes the old ones
wrote (less each file's ``.rest``, which is no tensor), not what DLIO's averaged file sizes would
give at M ranks.  A rank replicated over data parallelism (ZeRO 0, and the model states under
ZeRO 1/2) reads its whole TP shard, as every replica must.

What a new rank needs (:class:`Need`) is byte ranges of old files; what it reads
(:meth:`RankResume.reads`) is those ranges rounded out to whole pages and merged, file by file, as
an O_DIRECT reader must read them: the page-rounding is the resume's read amplification.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cached_property

from mlckpt import formats
from mlckpt.errors import ConfigError
from mlckpt.workload.layout import PAGE, Plan, rank_coords, stage_layers
from mlckpt.workload.model import DTYPE_BYTES, Workload
from mlckpt.workload.serving import part
from mlckpt.workload.tensors import TensorSpec, layer_params, rank_tensors


@dataclass(frozen=True)
class Stored:
    """Elements ``[start, start + numel)`` of a global tensor, at byte ``offset`` of the ``index``-th
    file of old rank ``writer``."""

    start: int
    numel: int
    writer: int
    index: int
    offset: int


@dataclass(frozen=True)
class GlobalTensor:
    name: str
    dtype: str
    cols: int  # elements in a row (1: a vector or a flat shard)
    numel: int
    tp_split: bool
    copies: tuple[tuple[Stored, ...], ...]  # each covers [0, numel) in order

    @property
    def optimizer(self) -> bool:
        return self.name.startswith("optimizer.")


@dataclass(frozen=True)
class StoredFile:
    writer: int
    index: int
    name: str
    bytes: int


@dataclass(frozen=True)
class Index:
    """A checkpoint's metadata: the writing layout, its files and its global tensors."""

    workload: str
    ranks: int
    tp: int
    pp: int
    zero: int
    files: tuple[StoredFile, ...]
    tensors: tuple[GlobalTensor, ...]

    @cached_property
    def by_name(self) -> dict[str, GlobalTensor]:
        return {t.name: t for t in self.tensors}

    @cached_property
    def file_bytes(self) -> dict[tuple[int, int], int]:
        return {(f.writer, f.index): f.bytes for f in self.files}

    @property
    def tensor_bytes(self) -> int:
        """One copy of every global tensor: what a full resume holds once."""
        return sum(t.numel * DTYPE_BYTES[t.dtype] for t in self.tensors)

    def to_json(self) -> bytes:
        doc = {"resume_index_format": formats.RESUME_INDEX.version, "workload": self.workload,
               "ranks": self.ranks, "tp": self.tp, "pp": self.pp, "zero": self.zero,
               "files": [[f.writer, f.index, f.name, f.bytes] for f in self.files],
               "tensors": [[t.name, t.dtype, t.cols, t.numel, t.tp_split,
                            [[[s.start, s.numel, s.writer, s.index, s.offset] for s in c] for c in t.copies]]
                           for t in self.tensors]}
        return json.dumps(doc, separators=(",", ":")).encode()

    @staticmethod
    def from_json(raw: bytes) -> Index:
        doc = json.loads(raw)
        if doc.get("resume_index_format") not in formats.RESUME_INDEX.reads:
            raise ConfigError(f"checkpoint index: format {doc.get('resume_index_format')!r} is not one this "
                              f"mlckpt reads ({formats.RESUME_INDEX.reads})", key="resume_index_format")
        return Index(doc["workload"], doc["ranks"], doc["tp"], doc["pp"], doc["zero"],
                     tuple(StoredFile(*f) for f in doc["files"]),
                     tuple(GlobalTensor(n, d, c, e, s, tuple(tuple(Stored(*p) for p in cp) for cp in copies))
                           for n, d, c, e, s, copies in doc["tensors"]))


def tp_split(name: str) -> bool:
    """Whether tensor parallelism splits the tensor ``name`` names (every one but the norms')."""
    return "norm.weight" not in name


def checkpoint_index(plan: Plan) -> Index:
    """The index of the checkpoint ``plan`` writes (ConfigError where a file is too small to hold
    the model's tensors: then it holds one flat tensor and no name can be found in it)."""
    Held = dict[int, list[tuple[int, TensorSpec, int, int]]]  # TP rank: (dp, tensor, writer, file index)
    held: dict[str, Held] = defaultdict(lambda: defaultdict(list))
    files = []
    for rp in plan.rank_plans:
        for i, (f, specs) in enumerate(zip(rp.files, rank_tensors(plan, rp.rank), strict=True)):
            files.append(StoredFile(rp.rank, i, f.name, f.bytes))
            for t in specs:
                if t.name == f.name:
                    raise ConfigError(f"scale={plan.scale}: file {f.name} of rank {rp.rank} is too small to "
                                      "hold one row of each of its tensors, so a resume cannot find them by "
                                      "name; raise scale", key="scale")
                if t.name != f"{f.name}.rest":
                    held[t.name][rp.tp].append((rp.dp, t, rp.rank, i))
    tensors = []
    for name, by_tp in held.items():
        split = tp_split(name)
        first = by_tp[min(by_tp)][0][1]
        cols = first.shape[1] if len(first.shape) == 2 else 1
        runs = [sorted(by_tp[tp], key=lambda p: p[0]) for tp in sorted(by_tp)]
        groups = [[p for run in runs for p in run]] if split else runs
        copies = []
        for group in groups:
            out, start = [], 0
            for _, t, writer, index in group:
                n = t.nbytes // DTYPE_BYTES[t.dtype]
                out.append(Stored(start, n, writer, index, t.offset))
                start += n
            copies.append(tuple(out))
        numel = sum(s.numel for s in copies[0])
        if any(sum(s.numel for s in c) != numel for c in copies):
            raise ValueError(f"{name}: copies of unequal size")  # the layout gives TP ranks equal files
        tensors.append(GlobalTensor(name, first.dtype, cols, numel, split, tuple(copies)))
    return Index(plan.workload.name, plan.ranks, plan.tp, plan.pp, plan.zero_stage, tuple(files),
                 tuple(tensors))


@dataclass(frozen=True)
class Need:
    """``length`` bytes at ``offset`` of old rank ``writer``'s ``index``-th file, which go to byte
    ``dest`` of the new rank's state."""

    writer: int
    index: int
    offset: int
    length: int
    dest: int


@dataclass(frozen=True)
class Read:
    """A page-rounded range of an old file that a new rank reads (O_DIRECT's unit)."""

    writer: int
    index: int
    offset: int
    length: int


@dataclass(frozen=True)
class RankResume:
    rank: int
    tp: int
    pp: int
    dp: int
    tensors: tuple[TensorSpec, ...]  # its new state, end to end
    starts: tuple[int, ...]  # the global element each of its tensors starts at
    needs: tuple[Need, ...]

    @property
    def bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    def reads(self, file_bytes: Mapping[tuple[int, int], int]) -> tuple[Read, ...]:
        """Its needs rounded out to whole pages (never past a file's end) and merged, file by file."""
        out: list[Read] = []
        by_file: dict[tuple[int, int], list[Need]] = defaultdict(list)
        for n in self.needs:
            by_file[(n.writer, n.index)].append(n)
        for (writer, index), needs in sorted(by_file.items()):
            size = file_bytes[(writer, index)]
            spans: list[list[int]] = []
            for n in sorted(needs, key=lambda n: n.offset):
                a = n.offset // PAGE * PAGE
                b = min(size, -(-(n.offset + n.length) // PAGE) * PAGE)
                if spans and a <= spans[-1][1]:
                    spans[-1][1] = max(spans[-1][1], b)
                else:
                    spans.append([a, b])
            out += [Read(writer, index, a, b - a) for a, b in spans]
        return tuple(out)


@dataclass(frozen=True)
class ResumePlan:
    index: Index
    ranks: int
    tp: int
    pp: int
    rank_resumes: tuple[RankResume, ...]

    @property
    def dp(self) -> int:
        return self.ranks // (self.tp * self.pp)

    @cached_property
    def reads(self) -> tuple[tuple[Read, ...], ...]:
        return tuple(r.reads(self.index.file_bytes) for r in self.rank_resumes)

    @property
    def state_bytes(self) -> int:
        return sum(r.bytes for r in self.rank_resumes)

    @property
    def read_bytes(self) -> int:
        return sum(rd.length for reads in self.reads for rd in reads)


def resume_scope(index: Index, ranks: int, tp: int, pp: int, num_layers: int) -> list[str]:
    """What the new layout cannot be (each "key=value (why)"): the keys are ``resume``'s."""
    bad = []
    if ranks <= 0 or ranks % (tp * pp):
        bad.append(f"ranks={ranks} (a multiple of the new TP x PP = {tp * pp})")
    if pp > num_layers:
        bad.append(f"pipeline={pp} (at most one stage a layer: {num_layers})")
    if index.zero >= 3 and pp > 1:
        bad.append(f"pipeline={pp} (ZeRO 3 runs one pipeline stage, as the writing layout's rules say)")
    return bad


def resume_plan(index: Index, workload: Workload, ranks: int, tp: int, pp: int, spread: bool = True
                ) -> ResumePlan:
    """Each of ``ranks`` new ranks' state and needs, at the new TP ``tp`` and PP ``pp`` (DP what is
    left), from the checkpoint ``index`` lists; ``workload`` gives the model's layers and names
    (``spread``: :func:`rank_resume`'s)."""
    bad = resume_scope(index, ranks, tp, pp, workload.model.num_layers)
    if bad:
        raise ConfigError(f"resume: {bad[0]}", key="resume")
    return ResumePlan(index, ranks, tp, pp, tuple(rank_resume(index, workload, ranks, tp, pp, r, spread)
                                                  for r in range(ranks)))


def rank_resume(index: Index, workload: Workload, ranks: int, tp: int, pp: int, rank: int,
                spread: bool = True) -> RankResume:
    """New rank ``rank``'s state and needs (what :func:`resume_plan` gives it; the layout in scope).
    ``spread=False``: a tensor TP replicates is read from the first copy, as a library that saved it
    once (DCP) stores it."""
    new = replace(workload, parallelism=replace(workload.parallelism, tensor=tp, pipeline=pp))
    return _rank_resume(index, new, rank, ranks // (tp * pp), spread)


def _stage_names(workload: Workload, stage: int) -> list[str]:
    layers = stage_layers(workload.model.num_layers, workload.parallelism.pipeline, stage)
    params = [p.name for layer in layers for p in layer_params(workload, layer, 1)]
    return params + [f"optimizer.{kind}" for p in params
                     for kind in (f"state.{p}.exp_avg", f"state.{p}.exp_avg_sq", f"master.{p}")]


def _rank_resume(index: Index, workload: Workload, rank: int, dp_size: int, spread: bool) -> RankResume:
    tp_size, pp_size = workload.parallelism.tensor, workload.parallelism.pipeline
    tp, pp, dp, _ = rank_coords(rank, tp_size, pp_size)
    tensors: list[TensorSpec] = []
    starts: list[int] = []
    needs: list[Need] = []
    at = 0
    for name in _stage_names(workload, pp):
        g = index.by_name[name]
        a, b = 0, g.numel
        if g.tp_split:
            rows = g.numel // g.cols
            a = sum(part(rows, tp_size, i) for i in range(tp)) * g.cols
            b = a + part(rows, tp_size, tp) * g.cols
        sharded = index.zero > 0 if g.optimizer else index.zero >= 3
        if sharded:
            n = b - a
            a += sum(part(n, dp_size, i) for i in range(dp))
            b = a + part(n, dp_size, dp)
        if b == a:
            continue
        size = DTYPE_BYTES[g.dtype]
        shape = (b - a,) if sharded or g.cols == 1 else ((b - a) // g.cols, g.cols)
        tensors.append(TensorSpec(name, g.dtype, shape, at, (b - a) * size))
        starts.append(a)
        needs += _overlaps(g.copies[tp % len(g.copies) if spread else 0], a, b, size, at)
        at += (b - a) * size
    return RankResume(rank, tp, pp, dp, tuple(tensors), tuple(starts), tuple(needs))


def _overlaps(copy: Sequence[Stored], a: int, b: int, size: int, dest: int) -> Iterator[Need]:
    """The byte ranges of ``copy``'s pieces that hold elements ``[a, b)``, placed from ``dest``."""
    for s in copy:
        lo, hi = max(a, s.start), min(b, s.start + s.numel)
        if lo < hi:
            yield Need(s.writer, s.index, s.offset + (lo - s.start) * size, (hi - lo) * size,
                       dest + (lo - a) * size)


def held_to_plan(plan: ResumePlan, records: Sequence[Mapping[str, object]]) -> list[str]:
    """What a resume's records (one per new rank) claim that the plans do not give: ranks, the bytes
    each holds and reads, its needs, reads, tensors and files, and the index's size; [] if none."""
    out = _ranks_held(plan, records)
    index_bytes = len(plan.index.to_json())
    for r in records:
        k = int(r["rank"])  # type: ignore[call-overload]
        if not 0 <= k < plan.ranks:
            continue
        rr, reads = plan.rank_resumes[k], plan.reads[k]
        want = {"bytes": rr.bytes, "read_bytes": sum(rd.length for rd in reads), "needs": len(rr.needs),
                "reads": len(reads), "tensors": len(rr.tensors),
                "files": len({(rd.writer, rd.index) for rd in reads}), "index_bytes": index_bytes}
        out += _differ(k, r, want) + _verified(k, r, rr)
    return out


def stored_pieces(index: Index, rr: RankResume) -> tuple[tuple[str, int, int, int], ...]:
    """The stored pieces (the first copy's: a library that saves a replicated tensor once) that
    new rank ``rr``'s shard overlaps, each (tensor, first element, old rank, bytes): what a reader
    that reads every piece it needs whole (DCP) reads."""
    out = []
    for t, a in zip(rr.tensors, rr.starts, strict=True):
        g = index.by_name[t.name]
        size = DTYPE_BYTES[g.dtype]
        b = a + t.nbytes // size
        out += [(g.name, s.start, s.writer, s.numel * size) for s in g.copies[0]
                if max(a, s.start) < min(b, s.start + s.numel)]
    return tuple(out)


def distinct_piece_bytes(plan: ResumePlan, ranks: Iterable[int]) -> int:
    """The bytes of the distinct stored pieces the new ``ranks`` of ``plan`` (built with
    ``spread=False``) read whole: what the storage serves where those ranks share one page cache."""
    return sum(p[3] for p in {p for k in ranks for p in stored_pieces(plan.index, plan.rank_resumes[k])})


def held_to_whole_pieces(plan: ResumePlan, records: Sequence[Mapping[str, object]], overhead: int
                         ) -> list[str]:
    """:func:`held_to_plan` for a reader of whole stored pieces (DCP; ``plan``: built with
    ``spread=False``): each rank read the pieces its shard overlaps, from their old ranks' files,
    their bytes as stored within ``overhead`` bytes a piece of their raw size (a library's
    container); every rank read the same metadata."""
    out = _ranks_held(plan, records)
    for r in records:
        k = int(r["rank"])  # type: ignore[call-overload]
        if not 0 <= k < plan.ranks:
            continue
        rr = plan.rank_resumes[k]
        pieces = stored_pieces(plan.index, rr)
        raw = sum(p[3] for p in pieces)
        want = {"bytes": rr.bytes, "needs": len(rr.needs), "reads": len(pieces), "tensors": len(rr.tensors),
                "files": len({p[2] for p in pieces})}
        out += _differ(k, r, want) + _verified(k, r, rr)
        got = r.get("read_bytes")
        if not isinstance(got, int) or not raw <= got <= raw + overhead * len(pieces):
            out.append(f"rank {k}: read_bytes {got!r}, its {len(pieces)} pieces hold {raw} "
                       f"(+ at most {overhead} a piece as stored)")
    sizes = {r.get("index_bytes") for r in records}
    if len(sizes) > 1:
        out.append(f"index_bytes {sorted(map(str, sizes))}: every rank reads the same metadata")
    return out


def _ranks_held(plan: ResumePlan, records: Sequence[Mapping[str, object]]) -> list[str]:
    ranks = sorted(int(r["rank"]) for r in records)  # type: ignore[call-overload]
    if ranks != list(range(plan.ranks)):
        return [f"ranks {ranks[:8]}{'...' if len(ranks) > 8 else ''}: the new layout has {plan.ranks}"]
    return []


def _differ(k: int, r: Mapping[str, object], want: Mapping[str, int]) -> list[str]:
    return [f"rank {k}: {key} {r.get(key)!r}, the plans give {v}"
            for key, v in want.items() if r.get(key) != v]


def _verified(k: int, r: Mapping[str, object], rr: RankResume) -> list[str]:
    if "verified_bytes" in r and r["verified_bytes"] != rr.bytes:
        return [f"rank {k}: verified_bytes {r['verified_bytes']!r}, its state is {rr.bytes}"]
    return []


PARTS = ("metadata", "planning", "read", "placing")

