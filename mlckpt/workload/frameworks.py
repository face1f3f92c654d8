"""Which writer makes and restores each checkpoint: mlckpt's own engine, or a training framework's
library through its real API (rules 1.11, open division).  Pure: the runner, the rules and the
checker derive these facts from here.

Writers (``framework.writer``):

* ``mlckpt``: the engine (O_DIRECT where asked, aligned buffers, ``io.threads`` requests in
  flight): the storage's best case, and the reference the others are measured against.
* ``torch_save``: ``torch.save`` of one tensor per planned file into an open file, as DLIO's
  PyTorch checkpointing and DeepSpeed do; restored by ``torch.load(weights_only=True)`` and a copy
  into the state.  torch.save does not fsync: mlckpt fsyncs each file inside the op (recorded).
* ``torch_dcp``: PyTorch Distributed Checkpoint, ``torch.distributed.checkpoint.save`` with its
  ``FileSystemWriter`` (``framework.threads``, ``framework.sync_files``), one file per rank and the
  coordinator's ``.metadata``; restored in place by ``torch.distributed.checkpoint.load``.  The
  process group is made from the MPI world (gloo).  With ``checkpoint.mode=async`` the write is
  ``async_save``: training waits while DCP stages the state, the persist runs in DCP's thread.
* ``safetensors``: ``safetensors.torch.save_file`` of one tensor per planned file; restored by
  ``load_file`` and a copy into the state.  save_file does not fsync: mlckpt does, inside the op.

A library's op is durable only where every file and the folder were fsynced inside the timed op:
by the library where it does so (DCP with ``sync_files``), else by mlckpt right after the
library returned (records: ``synced_by``).  Every byte is verified after the library's load.

With ``framework.reference`` (the default) the library's checkpoints alternate with the engine's,
round by round on the same storage in the same run: odd checkpoints by the library, even ones by
the engine, each restored by the writer that wrote it (an odd count gives the library one more; one
write leaves no engine checkpoint, and no ratio).  The headline figures are the library's;
the summary's ``framework`` block holds the engine's and the ratio of each (the framework's
efficiency on this storage).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mlckpt.locations import is_object_url

ENGINE = "mlckpt"
SYNCED_BY = ("library", "mlckpt")  # who fsynced a library op's files inside the op


@dataclass(frozen=True)
class Writer:
    """What a writer is, as the runner, the rules and the checker ask it: one instance per writer,
    registered once in :data:`WRITERS`; nothing else compares a writer's name.  Its effects (save,
    load, the files it keeps) are the matching class of ``mlckpt.engine.frameworks``."""

    name: str
    library: str | None  # the distribution whose version run.json records (None: mlckpt's own)
    module: str | None  # what the runner imports for it
    syncs: str | None  # the setting under which the library fsyncs its own files (None: never)
    asynchronous: bool  # has an async save path (checkpoint.mode=async)
    suffix: str = ""  # a library file's suffix in place of the planned one's ("": the planned name)
    own_settings: tuple[tuple[str, object], ...] = ()  # what run.json records of its settings, fixed
    # the library names its own files (known once it made them) and saves and loads collectively,
    # over torch.distributed's process group (DCP)
    collective: bool = False
    needs: tuple[str, ...] = ()  # every top-level package its module imports (checked before any rank)

    def settings(self, framework: Framework) -> dict[str, object]:
        """What run.json records of the library's settings (those that change what it does)."""
        return dict(self.own_settings)

    def library_name(self, planned: str) -> str:
        """A planned file's name as a one-file-per-planned-file library writes it: torch.save keeps
        it (DeepSpeed's .pt files), safetensors puts its own suffix in place of the planned one."""
        return planned.rsplit(".", 1)[0] + self.suffix if self.suffix else planned

    def file_names(self, framework: Framework, rank: int, planned: Sequence[str]) -> list[str]:
        """The names of this writer's files of rank ``rank`` beside the planned ones."""
        return [self.library_name(n) for n in planned] if self.suffix else []


@dataclass(frozen=True)
class DistributedCheckpoint(Writer):
    """PyTorch DCP: one file per rank and FileSystemWriter thread, and the coordinator's metadata."""

    def settings(self, framework: Framework) -> dict[str, object]:
        return {"thread_count": framework.threads, "sync_files": framework.sync_files,
                "single_file_per_rank": True}

    def file_names(self, framework: Framework, rank: int, planned: Sequence[str]) -> list[str]:
        return ([f"__{rank}_{i}.distcp" for i in range(framework.threads)]
                + (list(DCP_METADATA) if rank == 0 else []))


DCP_METADATA = (".metadata", ".metadata.tmp")  # the coordinator's (rank 0's), and its file before the rename

WRITERS: dict[str, Writer] = {w.name: w for w in (
    Writer(ENGINE, None, None, None, True),
    Writer("torch_save", "torch", "torch", None, False,
           own_settings=(("weights_only_load", True), ("one_file_per", "planned file")), needs=("torch",)),
    DistributedCheckpoint("torch_dcp", "torch", "torch.distributed.checkpoint", "sync_files", True,
                          collective=True, needs=("torch",)),
    Writer("safetensors", "safetensors", "safetensors.torch", None, False, ".safetensors",
           own_settings=(("one_file_per", "planned file"),), needs=("safetensors", "torch")),
)}
LIBRARIES = tuple(n for n in WRITERS if n != ENGINE)


@dataclass(frozen=True)
class Framework:
    """A run's ``framework`` settings."""

    writer: str = ENGINE
    reference: bool = True
    threads: int = 1  # torch_dcp: FileSystemWriter thread_count
    sync_files: bool = True  # torch_dcp: FileSystemWriter sync_files
    # what a library is handed (rules 1.19, mlckpt/workload/tensors.py): model | flat; runs judged
    # by an earlier rules version hand it flat tensors whatever this says (their records count none)
    tensors: str = "model"

    @classmethod
    def of(cls, config: Mapping[str, Any]) -> Framework:
        fw = config.get("framework") or {}  # null: the default (rules before 1.11 know no such key)
        return cls(writer=str(fw.get("writer") or ENGINE),
                   reference=fw.get("reference") is not False,
                   threads=int(fw.get("threads") or 1), sync_files=fw.get("sync_files") is not False,
                   tensors=str(fw.get("tensors") or "model"))

    @property
    def spec(self) -> Writer:
        """The writer, as registered."""
        return WRITERS[self.writer]

    @property
    def library(self) -> bool:
        return self.spec.library is not None

    @property
    def alternates(self) -> bool:
        """Library and engine checkpoints alternate (the reference measured in the same run)."""
        return self.library and self.reference

    def writer_of(self, checkpoint: int) -> str:
        """Who writes (and restores) checkpoint ``checkpoint`` (1-based)."""
        return self.writer if self.by_library(checkpoint) else ENGINE

    def by_library(self, checkpoint: int) -> bool:
        """Whether the library writes (and restores) checkpoint ``checkpoint`` (1-based)."""
        return self.library and (not self.reference or checkpoint % 2 == 1)

    def synced_by(self) -> str:
        """Who fsyncs this library's files inside a write."""
        return "library" if self.spec.syncs and self.sync_files else "mlckpt"

    def settings(self) -> dict[str, object]:
        """What run.json records of the library's settings (those that change what it does)."""
        return self.spec.settings(self)


def file_names(framework: Framework, rank: int, planned: Sequence[str]) -> list[str]:
    """Every name rank ``rank``'s checkpoint files may have in a checkpoint folder, the engine's
    and the library's: what a run that cannot finish sweeps (only those names are ever touched)."""
    return [*planned, *framework.spec.file_names(framework, rank, planned)]


def library_name(writer: str, planned: str) -> str:
    """A planned file's name as ``writer`` writes it (:meth:`Writer.library_name`)."""
    return WRITERS[writer].library_name(planned)


def scope_problems(config: Mapping[str, Any]) -> list[str]:
    """What a library writer cannot be run with (FRAMEWORK-SCOPE), each as "key=value"."""
    fw = Framework.of(config)
    if not fw.library:
        return []
    ck = config.get("checkpoint") or {}
    bad: list[str] = []
    mode = str(ck.get("mode", "sync"))
    if mode == "async" and not WRITERS[fw.writer].asynchronous:
        able = ", ".join(n for n in LIBRARIES if WRITERS[n].asynchronous)
        bad.append(f"checkpoint.mode=async (only {able} has an async save)")
    if (ck.get("tiers") or {}).get("fast") is not None:
        bad.append("checkpoint.tiers.fast (one tier)")
    if is_object_url(ck.get("folder")):
        bad.append("an s3:// folder (files only)")
    if (config.get("state") or {}).get("source") is not None:
        bad.append("state.source (host memory only)")
    if str(config.get("residency", "full")) != "full":
        bad.append("residency=stream (the whole state)")
    if (config.get("witness") or {}).get("url"):
        bad.append("witness.url (unwitnessed)")
    if str(ck.get("restore", "own")) != "own":
        bad.append("checkpoint.restore=repopulate (own)")
    if ck.get("restore_from") or int(ck.get("num_writes", 1) or 0) == 0:
        bad.append("a read-only invocation (writes and restores in one run)")
    return bad
