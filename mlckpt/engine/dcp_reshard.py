"""Resuming at another scale through PyTorch's Distributed Checkpoint, which reshards itself: each
rank's tensors are handed to ``dcp.save`` and ``dcp.load`` as pieces of the checkpoint's global
tensors (mlckpt/workload/resume.py's index), so the checkpoint's metadata records every piece's
place and a load at another layout reads, from the files the old layout saved, the pieces each new
shard overlaps.  Effects on files and on torch.distributed's process group; imported on demand.

A global tensor is handed to DCP flat (one dimension), as FSDP's flat parameters are: a TP shard of
whole rows is a contiguous range of it, so every rank's piece, old or new, is one chunk.  DCP stores a
tensor TP replicates once (the first TP rank's copy, as its own deduplication of replicated tensors
keeps one), so the new ranks read that copy (``rank_resume(spread=False)``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mlckpt.engine.frameworks import TORCH_DTYPES
from mlckpt.workload.model import DTYPE_BYTES
from mlckpt.workload.resume import Index, RankResume


def _chunk_type() -> Any:
    import torch
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex, TensorProperties
    from torch.distributed.checkpoint.planner import TensorWriteData, WriteItem, WriteItemType

    class Chunk(torch.Tensor):
        """A rank's contiguous piece ``[offset, offset + len)`` of a flat global tensor of ``numel``
        elements, through DCP's checkpointable protocol (as a DTensor is): its size is the global
        tensor's, its write item and its chunk are its piece, and DCP reads into its local view."""

        g_offset: int
        g_numel: int

        def size(self, dim: int | None = None) -> Any:
            s = torch.Size((self.g_numel,))
            return s if dim is None else s[dim]

        def _chunk(self) -> Any:
            return ChunkStorageMetadata(offsets=torch.Size((self.g_offset,)),
                                        sizes=torch.Size((super().size(0),)))

        def __create_write_items__(self, fqn: str, obj: Any) -> list[Any]:
            c, local = self._chunk(), self.as_subclass(torch.Tensor)
            data = TensorWriteData(chunk=c, properties=TensorProperties.create_from_tensor(local),
                                   size=torch.Size((self.g_numel,)))
            index = MetadataIndex(fqn, c.offsets)
            return [WriteItem(index=index, type=WriteItemType.SHARD, tensor_data=data)]

        def __create_chunk_list__(self) -> list[Any]:
            return [self._chunk()]

        def __get_tensor_shard__(self, index: Any) -> Any:
            return self.as_subclass(torch.Tensor)

    return Chunk


_CHUNK: Any = None


def chunk(buf: np.ndarray, dtype: str, offset: int, numel: int) -> Any:
    """``buf`` (bytes of the rank's state) as the piece from element ``offset`` of a flat global
    tensor of ``numel`` elements of ``dtype``."""
    import torch

    global _CHUNK
    if _CHUNK is None:
        _CHUNK = _chunk_type()
    local = torch.from_numpy(buf).view(getattr(torch, TORCH_DTYPES[dtype]))
    out = torch.Tensor._make_subclass(_CHUNK, local)
    out.g_offset, out.g_numel = offset, numel
    return out


def saved_state(index: Index, rank: int, files: Mapping[int, np.ndarray]) -> dict[str, Any]:
    """Old rank ``rank``'s pieces of every global tensor (the first copy of a replicated one), each a
    view of ``files[i]``, the bytes of its ``i``-th planned file."""
    out = {}
    for g in index.tensors:
        for s in g.copies[0]:
            if s.writer == rank:
                n = s.numel * DTYPE_BYTES[g.dtype]
                out[g.name] = chunk(files[s.index][s.offset: s.offset + n], g.dtype, s.start, g.numel)
    return out


def save(index: Index, rank: int, files: Mapping[int, np.ndarray], cdir: Path) -> None:
    import torch.distributed.checkpoint as dcp

    dcp.save(saved_state(index, rank, files), storage_writer=dcp.FileSystemWriter(str(cdir)))


def resumed_state(index: Index, rr: RankResume, state: np.ndarray) -> dict[str, Any]:
    """New rank ``rr``'s shard of every global tensor, each a view of its place in ``state``."""
    return {t.name: chunk(state[t.offset: t.offset + t.nbytes], t.dtype, a, index.by_name[t.name].numel)
            for t, a in zip(rr.tensors, rr.starts, strict=True)}


def load(index: Index, rr: RankResume, state: np.ndarray, cdir: Path) -> dict[str, int]:
    """``dcp.load`` of new rank ``rr``'s shard into ``state``; the parts of its time (ns): reading the
    metadata, reading and placing the data (DCP does both in ``read_data``), and the rest (its
    planning and the plan's exchange between ranks)."""
    import torch.distributed.checkpoint as dcp

    parts = {"metadata": 0, "read": 0}

    class Timed(dcp.FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            t0 = time.monotonic_ns()
            try:
                return super().read_metadata(*args, **kwargs)
            finally:
                parts["metadata"] += time.monotonic_ns() - t0

        def read_data(self, plan: Any, planner: Any) -> Any:
            t0 = time.monotonic_ns()
            try:
                out = super().read_data(plan, planner)
                out.wait()
                return out
            finally:
                parts["read"] += time.monotonic_ns() - t0

    t0 = time.monotonic_ns()
    dcp.load(resumed_state(index, rr, state), storage_reader=Timed(str(cdir)))
    total = time.monotonic_ns() - t0
    return {"metadata_ns": parts["metadata"], "planning_ns": total - parts["metadata"] - parts["read"],
            "read_ns": parts["read"], "placing_ns": 0}


def files_of(cdir: Path) -> Sequence[str]:
    """The files DCP saved (its data files and ``.metadata``)."""
    return sorted(str(p) for p in cdir.iterdir() if p.is_file())
