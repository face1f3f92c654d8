"""What a run created on the storage, and how it is removed: in order at the normal end
(:class:`Created`), or swept from the plan when the run cannot finish (:func:`sweep_run`, used by
the op watch and the guardian).  Only paths this run created are ever touched."""

from __future__ import annotations

import os
import shutil
import stat
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from mlckpt.run.storage.backends import Files, Storage
from mlckpt.run.storage.folderlock import release

RUN_MARKER = ".mlckpt-run"  # marks a checkpoint run folder as ours (see the folder gate)


class Created:
    """The files and folders this rank created, in creation order, and the run folders (one per
    tier) that carry RUN_MARKER.  A context manager that owns every path it lists: on the way out
    (success or failure) it removes its files, calls ``between`` (the runner's last barrier: no
    rank removes folders while another still has files in them), then its folders, unless
    ``keep``.  It touches nothing else and leaves a folder that is not empty in place."""

    def __init__(self, keep: bool, between: Callable[[], None] = lambda: None,
                 stage: Callable[[str | None], None] = lambda _: None) -> None:
        self.keep = keep
        self.between = between
        self.stage = stage  # rank 0's progress lines (Console.stage)
        self.files: list[str] = []
        self.dirs: list[Path] = []
        self.roots: list[Path] = []
        self.storage: Storage = Files(Path("/"))  # the storage ``files`` are on: it removes them
        self.locks: list[tuple[Path, str]] = []  # (checkpoint folder, run): released once files are gone

    def __enter__(self) -> Created:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.keep:
            unique = len(set(self.files))
            what = "file" if self.storage.folders else "object"
            self.stage(f"cleanup: removing this rank's {unique} checkpoint {what}{'s' * (unique != 1)}")
            t0 = time.monotonic()
            self.remove_files()
            self.stage(f"cleanup: removed them in {time.monotonic() - t0:.1f} s")
            self.stage(None)
        try:
            self.between()
        finally:
            for folder, run in self.locks:  # before the folders: the lock sits in one of them
                release(folder, run)
            if not self.keep:
                self.remove_dirs()

    def missing_above(self, folder: Path) -> list[Path]:
        """The folders above ``folder`` that do not exist yet, remembered as this run's (its
        ``mkdir -p`` will create them; the guardian is told them before the first mkdir)."""
        missing = [p for p in (folder.parent, *folder.parent.parents) if not p.exists()]
        self.dirs.extend(missing)
        return missing

    def add_dir(self, folder: Path, *, root: bool = False) -> None:
        self.dirs.append(folder)
        if root:
            self.roots.append(folder)

    def add_files(self, paths: Sequence[str]) -> None:
        self.files.extend(paths)

    def remove_files(self) -> None:
        for line in self.storage.remove(self.files):
            print(f"mlckpt: warning: could not remove {line}", file=sys.stderr)

    def remove_dirs(self) -> None:
        for d in sorted(set(self.dirs), key=lambda p: len(p.parts), reverse=True):
            try:
                if d in self.roots:
                    (d / RUN_MARKER).unlink(missing_ok=True)
                d.rmdir()
            except FileNotFoundError:
                pass
            except OSError:
                if any(d.is_relative_to(r) for r in self.roots):
                    print(f"mlckpt: warning: left {d} in place (not empty)", file=sys.stderr)

    def outside(self, root: Path) -> list[Path]:
        """The folders this run created that are not inside ``root`` (those above it)."""
        return [d for d in self.dirs if not d.is_relative_to(root)]


def sweep_run(
    root: Path,
    names: Sequence[str],
    upto: int,
    *,
    keep: bool,
    dirs: Sequence[Path | str] = (),
    partial: str | None = None,
) -> str:
    """Remove what a run that cannot finish normally left: the planned checkpoint files
    ``root/ckpt-K/NAME`` (K = 1..upto, NAME one of ``names``; regular files only), the emptied
    checkpoint folders, the run marker and ``root`` once nothing else is in it, the checkpoint
    folder's lock if this run holds it (:mod:`mlckpt.run.storage.folderlock`), then ``dirs`` (the
    folders the run created above ``root``) when empty, and ``partial`` (the run's unfinished
    result folder).  Nothing else is touched.  Returns a short account for the user."""
    if partial:
        shutil.rmtree(partial, ignore_errors=True)
    if keep:
        release(root.parent, root.name)
        return f"checkpoint.keep=true: checkpoint files kept in {root}"
    removed, left = 0, 0
    wanted = set(names)
    for k in range(1, upto + 1):
        cdir = root / f"ckpt-{k:04d}"
        for name in wanted:
            path = cdir / name
            try:
                if stat.S_ISREG(path.lstat().st_mode):
                    path.unlink()
                    removed += 1
            except FileNotFoundError:
                pass
            except OSError:
                left += 1
        try:
            cdir.rmdir()
        except OSError:
            pass
    try:
        if [e.name for e in os.scandir(root)] == [RUN_MARKER]:
            (root / RUN_MARKER).unlink()
        root.rmdir()
    except FileNotFoundError:
        pass
    except OSError:
        left += 1
    release(root.parent, root.name)  # the folder is free for the next run only now
    for d in sorted((Path(x) for x in dirs), key=lambda p: len(p.parts), reverse=True):
        try:
            d.rmdir()
        except OSError:
            pass
    note = f"removed {removed} checkpoint file{'s' if removed != 1 else ''} of this run"
    if left or root.exists():
        note += f"; some entries could not be removed, see {root}"
    return note


# MPI libraries' shared-memory segments (MPICH's, Open MPI's): unlinked by MPI_Finalize, left
# behind by ranks that were killed (Ctrl-C, a failed rank, scancel), 4-8 MiB of RAM each.  Only the
# segments this run's own ranks were seen to map are ever removed: /dev/shm may be shared with
# processes this host's guardian cannot see (another pid namespace, another container).
SHM = Path("/dev/shm")


def shm_mapped_by(pids: Sequence[int], shm: Path = SHM) -> set[str]:
    """The files in ``shm`` these processes map now (read from /proc; what cannot be read is
    skipped)."""
    inside, out = f"{shm}/", set[str]()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as f:
                out.update(line.split(None, 5)[5].strip().removesuffix(" (deleted)")
                           for line in f if inside in line and len(line.split(None, 5)) == 6)
        except OSError:
            continue
    return out


def remove_shm(paths: Iterable[str]) -> int:
    """Remove these segments (a run's, once its ranks are gone); how many were there."""
    removed = 0
    for path in paths:
        try:
            os.unlink(path)
            removed += 1
        except OSError:
            pass
    return removed
