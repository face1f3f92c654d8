"""Resuming at another scale through PyTorch's Distributed Checkpoint, which reshards itself: each
rank's tensors are handed to ``dcp.save`` and ``dcp.load`` as pieces of the checkpoint's global
tensors (mlckpt/workload/resume.py's index), so the checkpoint's metadata records every piece's
place and a load at another layout reads, from the files the old layout saved, the pieces each new
shard overlaps.  Effects on files and on torch.distributed's process group; imported on demand.

A global tensor is handed to DCP flat (one dimension), as FSDP's flat parameters are: a TP shard of
whole rows is a contiguous range of it, so every rank's piece, old or new, is one chunk.  DCP stores a
tensor TP replicates once (the first TP rank's copy, as its own deduplication of replicated tensors
keeps one), so the new ranks read that copy (``rank_resume(spread=False)``).

The checkpoint is saved by the job that resumes it (M ranks), as the N ranks that wrote it would
have saved it: new rank ``r`` hands DCP the pieces of every old rank ``w`` with ``w % M == r``
(several pieces of one global tensor are one object of several chunks), and each old rank's pieces
go to a file of their own, ``__{w}_0.distcp``, as an N-rank save with one writer thread names it.
So the files, their pieces and DCP's ``.metadata`` are an N-rank save's.

DCP reads every stored piece a new shard overlaps whole (``FileSystemReader.read_data``), then
copies the overlap into place: what it read (:class:`Loaded`) is recorded beside the parts of its
time.
"""

from __future__ import annotations

import queue
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mlckpt.engine.frameworks import TORCH_DTYPES
from mlckpt.workload.model import DTYPE_BYTES
from mlckpt.workload.resume import Index, RankResume

METADATA = ".metadata"


def file_name(writer: int) -> str:
    """Old rank ``writer``'s DCP file (an N-rank save's, one writer thread)."""
    return f"__{writer}_0.distcp"


def _pieces_type() -> Any:
    import torch
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex, TensorProperties
    from torch.distributed.checkpoint.planner import TensorWriteData, WriteItem, WriteItemType

    class Pieces(torch.Tensor):
        """A rank's pieces ``[offset, offset + len)`` of a flat global tensor of ``numel`` elements,
        through DCP's checkpointable protocol (as a DTensor is): its size is the global tensor's,
        its write items and its chunks are its pieces, and DCP reads into their local views."""

        g_numel: int
        parts: tuple[tuple[int, Any], ...]  # (global offset, local tensor)

        def size(self, dim: int | None = None) -> Any:
            s = torch.Size((self.g_numel,))
            return s if dim is None else s[dim]

        def _chunks(self) -> list[Any]:
            return [ChunkStorageMetadata(offsets=torch.Size((o,)), sizes=torch.Size((t.numel(),)))
                    for o, t in self.parts]

        def __create_write_items__(self, fqn: str, obj: Any) -> list[Any]:
            return [WriteItem(index=MetadataIndex(fqn, c.offsets), type=WriteItemType.SHARD,
                              tensor_data=TensorWriteData(chunk=c, size=torch.Size((self.g_numel,)),
                                                          properties=TensorProperties.create_from_tensor(t)))
                    for c, (_, t) in zip(self._chunks(), self.parts, strict=True)]

        def __create_chunk_list__(self) -> list[Any]:
            return self._chunks()

        def __get_tensor_shard__(self, index: Any) -> Any:
            return next(t for o, t in self.parts if o == index.offset[0])

    return Pieces


_PIECES: Any = None


def pieces(parts: Sequence[tuple[int, np.ndarray]], dtype: str, numel: int) -> Any:
    """``parts`` (each: a global element offset, and bytes of the rank's memory holding the elements
    from there) as one object: pieces of a flat global tensor of ``numel`` elements of ``dtype``."""
    import torch

    global _PIECES
    if _PIECES is None:
        _PIECES = _pieces_type()
    kind = getattr(torch, TORCH_DTYPES[dtype])
    local = [(o, torch.from_numpy(b).view(kind)) for o, b in parts]
    out = torch.Tensor._make_subclass(_PIECES, local[0][1])
    out.g_numel, out.parts = numel, tuple(local)
    return out


def saved_state(index: Index, writers: Sequence[int], files: Mapping[tuple[int, int], np.ndarray]
                ) -> dict[str, Any]:
    """Old ranks ``writers``' pieces of every global tensor (the first copy of a replicated one),
    each a view of ``files[(w, i)]``, the bytes of old rank ``w``'s ``i``-th planned file."""
    mine, out = set(writers), {}
    for g in index.tensors:
        parts = [(s.start, files[(s.writer, s.index)][s.offset: s.offset + s.numel * DTYPE_BYTES[g.dtype]])
                 for s in g.copies[0] if s.writer in mine]
        if parts:
            out[g.name] = pieces(parts, g.dtype, g.numel)
    return out


def owners(index: Index) -> dict[tuple[str, int], int]:
    """Each stored piece's old rank, by its tensor's name and its first element."""
    return {(g.name, s.start): s.writer for g in index.tensors for s in g.copies[0]}


def _writer(cdir: Path, owner: Mapping[tuple[str, int], int]) -> Any:
    import torch.distributed.checkpoint as dcp

    class ByOldRank(dcp.FileSystemWriter):
        """DCP's file writer (one thread, its files fsynced), each old rank's pieces in a file of
        their own, named as that rank's own save would name it."""

        def write_data(self, plan: Any, planner: Any) -> Any:
            groups: dict[int, list[Any]] = defaultdict(list)
            for item in plan.items:
                groups[owner[(item.index.fqn, int(item.index.offset[0]))]].append(item)
            files: queue.Queue[Any] = queue.Queue()
            for w, items in sorted(groups.items()):
                files.put((self.fs.concat_path(self.path, file_name(w)), file_name(w), items))
            return self._write_data(planner, files)

    return ByOldRank(str(cdir), thread_count=1, sync_files=True)


def save(index: Index, writers: Sequence[int], files: Mapping[tuple[int, int], np.ndarray], cdir: Path
         ) -> None:
    """Collective: every rank saves old ranks ``writers``' pieces (none: it calls in all the same)."""
    import torch.distributed.checkpoint as dcp

    dcp.save(saved_state(index, writers, files), storage_writer=_writer(cdir, owners(index)))


def resumed_state(index: Index, rr: RankResume, state: np.ndarray) -> dict[str, Any]:
    """New rank ``rr``'s shard of every global tensor, each a view of its place in ``state``."""
    return {t.name: pieces([(a, state[t.offset: t.offset + t.nbytes])], t.dtype, index.by_name[t.name].numel)
            for t, a in zip(rr.tensors, rr.starts, strict=True)}


@dataclass(frozen=True)
class Loaded:
    """One rank's ``dcp.load``: the parts of its time (ns), and what DCP read from its files."""

    metadata_ns: int  # reading and unpickling .metadata
    planning_ns: int  # the rest: its planner, and the plans' exchange between ranks
    read_ns: int  # read_data: reading each stored piece and copying the overlap into place
    reads: int  # the stored pieces read (each whole)
    read_bytes: int  # their bytes as stored (each a torch.save of the piece)
    files: int  # the files they are in
    metadata_bytes: int


def load(index: Index, rr: RankResume, state: np.ndarray, cdir: Path) -> Loaded:
    """``dcp.load`` of new rank ``rr``'s shard into ``state``, collective."""
    import torch.distributed.checkpoint as dcp

    seen = {"metadata": 0, "read": 0, "reads": 0, "bytes": 0}
    files: set[str] = set()

    class Timed(dcp.FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            t0 = time.monotonic_ns()
            try:
                return super().read_metadata(*args, **kwargs)
            finally:
                seen["metadata"] += time.monotonic_ns() - t0

        def read_data(self, plan: Any, planner: Any) -> Any:
            t0 = time.monotonic_ns()
            try:
                out = super().read_data(plan, planner)
                out.wait()
                return out
            finally:
                seen["read"] += time.monotonic_ns() - t0
                for item in plan.items:
                    md = self.storage_data[item.storage_index]
                    seen["reads"] += 1
                    seen["bytes"] += int(md.length)
                    files.add(str(md.relative_path))

    t0 = time.monotonic_ns()
    dcp.load(resumed_state(index, rr, state), storage_reader=Timed(str(cdir)))
    total = time.monotonic_ns() - t0
    return Loaded(seen["metadata"], total - seen["metadata"] - seen["read"], seen["read"], seen["reads"],
                  seen["bytes"], len(files), (cdir / METADATA).stat().st_size)

