"""Checkpoints through a training framework's own library (rules 1.11; the writers and what each
does: mlckpt/workload/frameworks.py).  Effects on files and on torch.distributed's process group;
the runner times the calls.  Imported on demand: PyTorch and safetensors load only in a run that
names a library.

Each planned file is handed to the library as its tensors (``mlckpt/workload/tensors.py``: the
shard's named tensors, or one uint8 tensor of the file), zero-copy views of the rank's state that
tile the file's bytes, so the library writes exactly the content mlckpt's engine would, in its own
file format, and a restore lands in the state where the same verification reads it.
"""

from __future__ import annotations

import glob
import importlib.metadata
import os
import socket
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlckpt.errors import VerificationError
from mlckpt.workload.frameworks import DCP_METADATA, WRITERS, Framework, library_name
from mlckpt.workload.tensors import TensorSpec

# a tensor's element type (mlckpt.workload.model.DTYPE_BYTES) as torch names it
TORCH_DTYPES = {"int8": "int8", "uint8": "uint8", "fp16": "float16", "bf16": "bfloat16", "fp32": "float32",
                "fp64": "float64"}


@dataclass(frozen=True)
class Item:
    """One planned file as a library sees it: its key in the state dict, its file (one file per
    planned file), the state's bytes for it and the tensors that tile them."""

    key: str
    name: str
    buf: Any  # numpy uint8 view of the state
    tensors: tuple[TensorSpec, ...]

    def state(self) -> dict[str, Any]:
        """The file's tensors by key, each a view of the state with its own storage object
        (safetensors refuses tensors that share one); a flat file's one tensor keeps its key."""
        import torch

        out = {}
        for t in self.tensors:
            raw = torch.from_numpy(self.buf[t.offset : t.offset + t.nbytes])
            key = self.key if t.name == self.name else f"{self.key}/{t.name}"
            out[key] = raw.view(getattr(torch, TORCH_DTYPES[t.dtype])).view(t.shape)
        return out


@dataclass(frozen=True)
class Saved:
    files: tuple[str, ...]  # the library files this rank made
    file_bytes: int  # their size on disk
    synced_by: str  # library | mlckpt


def key_of(rank: int, name: str) -> str:
    """A planned file's key in the state dict (unique across ranks: DCP merges every rank's)."""
    return f"rank{rank}/{name}"


def library_version(writer: str) -> str | None:
    lib = WRITERS[writer].library
    return importlib.metadata.version(lib) if lib else None


def load_library(writer: str) -> None:
    """Import the library now, outside every timed op (PyTorch takes seconds to import)."""
    module = WRITERS[writer].module
    if module:
        importlib.import_module(module)


def join_process_group(comm: Any, single_host: bool) -> None:
    """torch.distributed's default process group (gloo) over the MPI world, no torchrun needed:
    rank 0 picks a free port and every rank connects to it.  On one host, over loopback."""
    import torch.distributed as dist

    if dist.is_initialized():
        return
    addr = port = None
    if comm.Get_rank() == 0:
        addr = "127.0.0.1" if single_host else socket.gethostbyname(socket.gethostname())
        with socket.socket() as s:
            s.bind((addr, 0))
            port = s.getsockname()[1]
    addr, port = comm.bcast((addr, port), root=0)
    dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}", rank=comm.Get_rank(),
                            world_size=comm.Get_size())


def leave_process_group() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def _state(items: Sequence[Item]) -> dict[str, Any]:
    """A rank's state dict: every item's tensors (their keys are unique across ranks)."""
    return {k: v for it in items for k, v in it.state().items()}


def tensor_count(items: Sequence[Item]) -> int:
    """How many tensors the library handles for ``items`` (records format 12)."""
    return sum(len(it.tensors) for it in items)


def _fsync(paths: Sequence[str]) -> None:
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _dcp_writer(framework: Framework, cdir: Path) -> Any:
    import torch.distributed.checkpoint as dcp

    return dcp.FileSystemWriter(str(cdir), single_file_per_rank=True, sync_files=framework.sync_files,
                                thread_count=framework.threads)


def _durable(framework: Framework, cdir: Path, paths: Sequence[str]) -> Saved:
    by = framework.synced_by()
    if by == "mlckpt":
        _fsync(paths)
    _fsync([str(cdir)])  # no library here fsyncs the folder that names its files
    return Saved(tuple(paths), sum(os.stat(p).st_size for p in paths), by)


class Library:
    """One library writer's effects (its facts: ``mlckpt.workload.frameworks.WRITERS``): a save of a
    rank's items under a checkpoint folder, made durable; a load back into the state; the files it
    keeps.  This base is the one-tensor-per-planned-file library; a subclass names how it writes
    and reads one file.  Registered once in :data:`LIBRARIES`."""

    name = ""

    def paths(self, cdir: Path, names: Sequence[str]) -> list[str]:
        """The files it keeps under ``cdir`` for these planned files."""
        return [str(cdir / library_name(self.name, n)) for n in names]

    def save(self, framework: Framework, cdir: Path, items: Sequence[Item], rank: int) -> Saved:
        paths = self.paths(cdir, [it.name for it in items])
        for it, path in zip(items, paths, strict=True):
            self.write_one(it, path)
        return _durable(framework, cdir, paths)

    def load(self, cdir: Path, items: Sequence[Item], rank: int) -> None:
        for it, path in zip(items, self.paths(cdir, [it.name for it in items]), strict=True):
            loaded = self.read_one(path)
            for key, dst in it.state().items():
                src = loaded.get(key)
                if src is None or src.numel() != dst.numel() or src.dtype != dst.dtype:
                    got = "nothing" if src is None else f"{src.numel()} {src.dtype}"
                    raise VerificationError(f"{path}: the library loaded {got} for {key}, where "
                                            f"{dst.numel()} {dst.dtype} were written", rank=rank, file=path,
                                            offset=0)
                dst.copy_(src)  # into the state, as load_state_dict copies into parameters

    def write_one(self, item: Item, path: str) -> None:
        raise NotImplementedError

    def read_one(self, path: str) -> Mapping[str, Any]:
        raise NotImplementedError

    def start_async(self, framework: Framework, cdir: Path, items: Sequence[Item]) -> Future[object]:
        raise ValueError(f"{self.name} has no async save")  # FRAMEWORK-SCOPE refuses it before I/O

    def finish_async(self, framework: Framework, cdir: Path, future: Future[object], rank: int) -> Saved:
        raise ValueError(f"{self.name} has no async save")


class TorchSave(Library):
    """``torch.save`` of one tensor per planned file into an open file; ``torch.load(weights_only)``."""

    name = "torch_save"

    def write_one(self, item: Item, path: str) -> None:
        import torch

        with open(path, "wb") as fh:
            torch.save(item.state(), fh)

    def read_one(self, path: str) -> Mapping[str, Any]:
        import torch

        loaded: Mapping[str, Any] = torch.load(path, weights_only=True)
        return loaded


class Safetensors(Library):
    """``safetensors.torch.save_file`` of one tensor per planned file; ``load_file``."""

    name = "safetensors"

    def write_one(self, item: Item, path: str) -> None:
        from safetensors.torch import save_file

        save_file(item.state(), path)

    def read_one(self, path: str) -> Mapping[str, Any]:
        from safetensors.torch import load_file

        loaded: Mapping[str, Any] = load_file(path)
        return loaded


class DistributedCheckpoint(Library):
    """PyTorch DCP: ``save``/``async_save`` with its FileSystemWriter, ``load`` in place; collective
    over the process group.  It names its own files: every file of the checkpoint holds keys of any
    rank, and a rank's own are known once it made them."""

    name = "torch_dcp"

    def paths(self, cdir: Path, names: Sequence[str]) -> list[str]:
        return sorted([*glob.glob(str(cdir / "__*_*.distcp")), str(cdir / DCP_METADATA[0])])

    @staticmethod
    def own(cdir: Path, rank: int) -> list[str]:
        mine = sorted(glob.glob(str(cdir / f"__{rank}_*.distcp")))
        return mine + ([str(cdir / DCP_METADATA[0])] if rank == 0 else [])

    def save(self, framework: Framework, cdir: Path, items: Sequence[Item], rank: int) -> Saved:
        import torch.distributed.checkpoint as dcp

        dcp.save(_state(items), storage_writer=_dcp_writer(framework, cdir))
        return _durable(framework, cdir, self.own(cdir, rank))

    def load(self, cdir: Path, items: Sequence[Item], rank: int) -> None:
        import torch.distributed.checkpoint as dcp

        dcp.load(_state(items), storage_reader=dcp.FileSystemReader(str(cdir)))

    def start_async(self, framework: Framework, cdir: Path, items: Sequence[Item]) -> Future[Any]:
        import torch.distributed.checkpoint as dcp

        out = dcp.async_save(_state(items),
                             storage_writer=_dcp_writer(framework, cdir))
        return out if isinstance(out, Future) else out.upload_completion

    def finish_async(self, framework: Framework, cdir: Path, future: Future[object], rank: int) -> Saved:
        future.result()
        return _durable(framework, cdir, self.own(cdir, rank))


LIBRARIES: dict[str, Library] = {lib.name: lib for lib in (TorchSave(), DistributedCheckpoint(),
                                                             Safetensors())}


def library(writer: str) -> Library:
    lib = LIBRARIES.get(writer)
    if lib is None:
        raise ValueError(f"not a library writer: {writer}")
    return lib


# What the run's phases call (each the writer's own, from the registry).
def paths_of(writer: str, cdir: Path, names: Sequence[str]) -> list[str]:
    """The files a writer keeps under ``cdir`` for these planned files (for DCP: every file of the
    checkpoint, since a rank's keys may sit in any rank's file)."""
    return library(writer).paths(cdir, names)


def save(framework: Framework, cdir: Path, items: Sequence[Item], rank: int) -> Saved:
    """Write ``items`` under ``cdir`` through the library, then make every file and the folder
    durable (the library's own fsync where it does one, mlckpt's otherwise).  Collective for DCP."""
    return library(framework.writer).save(framework, cdir, items, rank)


def start_async_save(framework: Framework, cdir: Path, items: Sequence[Item]) -> Future[object]:
    """DCP's ``async_save``: returns once DCP staged the state (what training waits for); the
    future is done once the library wrote every file.  Collective."""
    return library(framework.writer).start_async(framework, cdir, items)


def finish_async_save(framework: Framework, cdir: Path, future: Future[object], rank: int) -> Saved:
    """Wait for an async save's files, then make them and the folder durable."""
    return library(framework.writer).finish_async(framework, cdir, future, rank)


def load(writer: str, cdir: Path, items: Sequence[Item], rank: int) -> None:
    """Restore ``items`` (each into its ``buf`` in the state) through the library's own load.
    Collective for DCP."""
    library(writer).load(cdir, items, rank)
