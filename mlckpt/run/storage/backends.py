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

Which storage a configured folder or a recorded location names, and opening it, is
:mod:`mlckpt.run.storage.kinds`.  Adding a backend is a class here (or a module beside this one)
plus its entry there.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Protocol

import numpy as np

from mlckpt import engine
from mlckpt.engine.ranges import RangeIO, read_ranges


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

    def describe(self) -> dict[str, object]:
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

    def describe(self) -> dict[str, object]:
        return {"kind": self.kind}


def pieces(names: Sequence[str], buf: np.ndarray, offsets: Sequence[int],
           sizes: Sequence[int]) -> list[Piece]:
    """Files laid end to end in ``buf`` (file i at ``offsets[i]``), each a piece."""
    return [Piece(n, buf[a:b], size) for n, (a, b), size in
            zip(names, itertools.pairwise(offsets), sizes, strict=True)]

