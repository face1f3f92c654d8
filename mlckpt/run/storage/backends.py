"""The storage a run's checkpoints and weights live on, behind one small interface (in the spirit
of IOR's ``aiori`` and fio's ``ioengine_ops``): a folder on a filesystem (:class:`Files`, here) or
a prefix in an S3-compatible store (:class:`mlckpt.run.storage.objectstore.Objects`).

A :class:`Storage` is bound to one root (a run folder, a prefix, a node-local tier) and names
everything under it by a relative name (``ckpt-0001/rank-0000-00.bin``).  The run's phases hold
one and never ask which it is: they put and get pieces of memory, evict and count what this host's
page cache still holds, name a location for records and the guardian, and remove what the run
made.  What differs by nature is a property, not a branch in a phase: whether this host's page
cache can hold the bytes (``cached``: eviction, residency and O_DIRECT mean something) and
whether a name needs a folder made first (``folders``).

:func:`durable_kind` is the one place that reads a configured folder to say which storage it is;
:func:`open_durable` opens it.  Adding a backend is a class here (or a module beside this one)
plus its entry in those two functions.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

import numpy as np

from mlckpt import engine
from mlckpt.engine.ranges import RangeIO, read_ranges
from mlckpt.locations import is_object_url


# eq=False: comparing or hashing a frozen dataclass that holds a numpy buffer is meaningless.
@dataclass(frozen=True, eq=False)
class Piece:
    """A whole file: ``nbytes`` of ``buf`` (page-rounded, as the engine wants) at ``name``."""

    name: str
    buf: np.ndarray
    nbytes: int


@dataclass(frozen=True, eq=False)
class Span:
    """``nbytes`` of the file ``name`` (``file_bytes`` in all) from ``offset``, into ``buf``."""

    name: str
    file_bytes: int
    offset: int
    buf: np.ndarray
    nbytes: int


class Storage(Protocol):
    kind: ClassVar[str]  # run.json's storage.kind
    cached: ClassVar[bool]  # this host's page cache can hold its bytes
    folders: ClassVar[bool]  # a name's folder must exist before it is written

    def at(self, name: str = "") -> str:
        """Where ``name`` is, as records, messages and the guardian name it (a path or a URL)."""
        ...

    def below(self, name: str) -> Storage:
        """The same storage rooted at ``name`` (a checkpoint's folder)."""
        ...

    def put(self, pieces: Sequence[Piece], opts: engine.IOOptions) -> None:
        """Write each piece whole; durable on return where ``opts.fsync`` (files: the data and
        the folder entries; objects: once the store acknowledged each)."""
        ...

    def get(self, pieces: Sequence[Piece], opts: engine.IOOptions) -> None:
        """Read each piece whole into its buffer."""
        ...

    def get_spans(self, spans: Sequence[Span], opts: engine.IOOptions) -> int:
        """Read each span into its buffer; the bytes read."""
        ...

    def evict(self, names: Sequence[str]) -> int:
        """Drop ``names`` from this host's page cache; the bytes of them still resident after."""
        ...

    def resident(self, names: Sequence[str]) -> int:
        """The bytes of ``names`` this host's page cache holds now."""
        ...

    def remove(self, locations: Sequence[str]) -> list[str]:
        """Delete these locations (from :meth:`at`); the failures, one line each."""
        ...

    def describe(self) -> dict[str, Any]:
        """run.json's ``storage`` block (run format 6)."""
        ...


@dataclass(frozen=True)
class Files:
    """A folder on a filesystem: ``pwritev``/``preadv`` through the engine's request queue."""

    root: Path
    kind: ClassVar[str] = "posix"
    cached: ClassVar[bool] = True
    folders: ClassVar[bool] = True

    def at(self, name: str = "") -> str:
        return str(self.root / name) if name else str(self.root)

    def below(self, name: str) -> Files:
        return Files(self.root / name)

    def put(self, pieces: Sequence[Piece], opts: engine.IOOptions) -> None:
        files = [engine.FileIO(self.at(p.name), p.buf, p.nbytes) for p in pieces]
        dirs = sorted({os.path.dirname(f.path) for f in files}) if opts.fsync else []
        engine.write_files(files, opts, dir_fsync=dirs)

    def get(self, pieces: Sequence[Piece], opts: engine.IOOptions) -> None:
        engine.read_files([engine.FileIO(self.at(p.name), p.buf, p.nbytes) for p in pieces], opts)

    def get_spans(self, spans: Sequence[Span], opts: engine.IOOptions) -> int:
        return read_ranges([RangeIO(self.at(s.name), s.file_bytes, s.offset, s.buf, s.nbytes) for s in spans],
                           opts)

    def evict(self, names: Sequence[str]) -> int:
        for n in dict.fromkeys(names):
            engine.evict(self.at(n))
        return self.resident(names)

    def resident(self, names: Sequence[str]) -> int:
        return sum(engine.resident_bytes(self.at(n))[0] for n in dict.fromkeys(names))

    def remove(self, locations: Sequence[str]) -> list[str]:
        failed = []
        for path in locations:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            except OSError as exc:
                failed.append(f"{path}: {exc}")
        return failed

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind}


def durable_kind(folder: object) -> str:
    """Which storage a configured ``checkpoint.folder`` names: run.json's ``storage.kind``."""
    return "s3" if is_object_url(folder) else Files.kind


def takes_page_cache(folder: object) -> bool:
    """Whether the storage ``folder`` names is read through this host's page cache (so O_DIRECT,
    RWF_DONTCACHE, eviction and residency apply), known before anything is opened."""
    return durable_kind(folder) == Files.kind


def local_folder(folder: object) -> Path | None:
    """The configured folder on this host's filesystem, or None for a store."""
    return Path(str(folder)).absolute() if takes_page_cache(folder) else None


def open_durable(config: Mapping[str, Any], name: str) -> Storage:
    """The durable tier of a run: ``checkpoint.folder``'s storage rooted at ``name`` (the run's
    folder or prefix).  A store is opened here (its client built; nothing sent)."""
    folder = config["checkpoint"]["folder"]
    if durable_kind(folder) == Files.kind:
        return Files(Path(str(folder)).absolute() / name)
    from mlckpt.run.storage.objectstore import Objects

    return Objects.open(config).below(name)


def pieces(names: Sequence[str], buf: np.ndarray, offsets: Sequence[int],
           sizes: Sequence[int]) -> list[Piece]:
    """Files laid end to end in ``buf`` (file i at ``offsets[i]``), each a piece."""
    return [Piece(n, buf[a:b], size) for n, (a, b), size in
            zip(names, itertools.pairwise(offsets), sizes, strict=True)]


def sweep(location: str, names: Sequence[str], upto: int, *, keep: bool, s3: Mapping[str, Any] | None = None,
          dirs: Sequence[Path | str] = (), partial: str | None = None) -> str:
    """Remove what a run that cannot finish left at ``location`` (its run folder or prefix, as
    :meth:`Storage.at` names it): the planned files ``ckpt-K/NAME`` of checkpoints 1..upto and what
    the storage keeps of an unfinished write; then ``dirs`` (folders the run made above a run
    folder) and ``partial`` (its unfinished result folder).  ``s3``: the client settings the run
    used.  Returns a short account for the user; never raises."""
    if durable_kind(location) == Files.kind:
        from mlckpt.run.storage.cleanup import sweep_run

        return sweep_run(Path(location), names, upto, keep=keep, dirs=dirs, partial=partial)
    import shutil

    from mlckpt.run.storage.objectstore import sweep as sweep_objects

    note = sweep_objects(location, names, upto, s3 or {}, keep=keep)
    if partial:
        shutil.rmtree(partial, ignore_errors=True)
    return note
