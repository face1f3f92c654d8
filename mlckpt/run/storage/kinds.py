"""Which storage a configured ``checkpoint.folder`` or a recorded location names, and opening it:
the one place that reads a folder to tell files from a store (the phases hold a
:class:`~mlckpt.run.storage.backends.Storage` and never ask)."""

from __future__ import annotations

import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mlckpt.locations import is_object_url
from mlckpt.run.storage.backends import Files, Storage
from mlckpt.run.storage.cleanup import sweep_run
from mlckpt.run.storage.objectstore import Objects
from mlckpt.run.storage.objectstore import sweep as sweep_objects


def durable_kind(folder: object) -> str:
    """Which storage a configured ``checkpoint.folder`` names: run.json's ``storage.kind``."""
    return Objects.kind if is_object_url(folder) else Files.kind


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
    return Objects.open(config).below(name)


def sweep(location: str, names: Sequence[str], upto: int, *, keep: bool, s3: Mapping[str, Any] | None = None,
          dirs: Sequence[Path | str] = (), partial: str | None = None) -> str:
    """Remove what a run that cannot finish left at ``location`` (its run folder or prefix, as
    :meth:`Storage.at` names it): the planned files ``ckpt-K/NAME`` of checkpoints 1..upto and what
    the storage keeps of an unfinished write; then ``dirs`` (folders the run made above a run
    folder) and ``partial`` (its unfinished result folder).  ``s3``: the client settings the run
    used.  Returns a short account for the user; never raises."""
    if durable_kind(location) == Files.kind:
        return sweep_run(Path(location), names, upto, keep=keep, dirs=dirs, partial=partial)
    note = sweep_objects(location, names, upto, s3 or {}, keep=keep)
    if partial:
        shutil.rmtree(partial, ignore_errors=True)
    return note
