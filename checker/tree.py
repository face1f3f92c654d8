"""Walk a submission tree (never following a symlink) and list its bundles and system files.
The layout is defined in mlckpt/bundle/tree.py.

Files at the top level (README, trusted keys) and hidden top-level entries (``.git``) are
ignored; every other entry that does not fit the layout is a BUNDLE-LAYOUT problem, as is any
symlink (a symlink where a bundle should be is a BUNDLE-PATHS problem of that bundle).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from mlckpt.bundle import display_name
from mlckpt.bundle.tree import ARCHIVE_SUFFIX, DIVISIONS, NAME, SYSTEM_SUFFIX
from mlckpt.rules import Problem


@dataclass(frozen=True)
class Leaf:
    """Where a bundle sits.  ``path`` is relative to the tree root (POSIX)."""

    path: str
    division: str
    org: str
    system: str
    workload: str
    run_dir: str  # the <run-id> component (without .tar.gz)
    archive: bool
    symlink: bool = False  # the leaf itself is a symlink (never followed)


@dataclass(frozen=True)
class SystemFile:
    path: str  # relative to the root
    division: str
    org: str
    system: str  # file stem


@dataclass
class TreeScan:
    leaves: list[Leaf] = field(default_factory=list)
    systems: list[SystemFile] = field(default_factory=list)
    problems: list[tuple[str, Problem]] = field(default_factory=list)  # (division, problem)


def _entries(folder: Path) -> list[os.DirEntry[str]]:
    with os.scandir(folder) as it:
        return sorted(it, key=lambda e: e.name)


def _kind(entry: os.DirEntry[str]) -> str:
    try:
        mode = entry.stat(follow_symlinks=False).st_mode
    except OSError:
        return "unreadable"
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISREG(mode):
        return "file"
    return "special"


class _Walker:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.scan = TreeScan()

    def problem(self, division: str, rel: str, expected: str, actual: str) -> None:
        self.scan.problems.append((division, Problem(rel, expected, actual)))

    def children(self, division: str, rel: str) -> list[tuple[os.DirEntry[str], str, str]]:
        """(entry, its relative path, kind) of a folder; unusable names are reported here."""
        try:
            entries = _entries(self.root / rel)
        except OSError as exc:
            self.problem(division, rel, "a readable folder", f"cannot list: {exc.strerror or exc}")
            return []
        out = []
        for e in entries:
            child = f"{rel}/{display_name(e.name)}"
            kind = _kind(e)
            if kind == "symlink":
                self.problem(division, child, "no symlinks in the submission tree", "a symlink")
                continue
            out.append((e, child, kind))
        return out

    def walk(self) -> TreeScan:
        for e in _entries(self.root):
            if e.name.startswith(".") or _kind(e) == "file":
                continue
            name = display_name(e.name)
            if e.name not in DIVISIONS:
                kind = _kind(e)
                self.problem("open", name, "closed/ or open/ (and top-level files)",
                             f"unexpected {'symlink' if kind == 'symlink' else 'folder'}")
                continue
            if _kind(e) != "dir":
                self.problem(e.name, name, "a folder", "a symlink or special file")
                continue
            self.division(e.name)
        return self.scan

    def division(self, div: str) -> None:
        for e, rel, kind in self.children(div, div):
            if kind != "dir" or not NAME.fullmatch(e.name):
                self.problem(div, rel, "an organisation folder (letters, digits, '.', '_', '-', '+')",
                             f"unexpected {kind}")
                continue
            self.org(div, e.name, rel)

    def org(self, div: str, org: str, rel: str) -> None:
        for e, child, kind in self.children(div, rel):
            if e.name == "systems" and kind == "dir":
                self.systems(div, org, child)
            elif e.name == "results" and kind == "dir":
                self.results(div, org, child)
            else:
                self.problem(div, child, "systems/ and results/ folders only", f"unexpected {kind}")

    def systems(self, div: str, org: str, rel: str) -> None:
        for e, child, kind in self.children(div, rel):
            stem = e.name[: -len(SYSTEM_SUFFIX)] if e.name.endswith(SYSTEM_SUFFIX) else ""
            if kind != "file" or not NAME.fullmatch(stem):
                self.problem(div, child, "<system>.yaml system descriptions only", f"unexpected {kind}")
                continue
            self.scan.systems.append(SystemFile(child, div, org, stem))

    def results(self, div: str, org: str, rel: str) -> None:
        for e, child, kind in self.children(div, rel):
            if kind != "dir" or not NAME.fullmatch(e.name):
                self.problem(div, child, "results/<system>/ folders only", f"unexpected {kind}")
                continue
            for w, wrel, wkind in self.children(div, child):
                if wkind != "dir" or not NAME.fullmatch(w.name):
                    self.problem(div, wrel, "results/<system>/<workload>/ folders only",
                                 f"unexpected {wkind}")
                    continue
                self.runs(div, org, e.name, w.name, wrel)

    def runs(self, div: str, org: str, system: str, workload: str, rel: str) -> None:
        try:
            entries = _entries(self.root / rel)
        except OSError as exc:
            self.problem(div, rel, "a readable folder", f"cannot list: {exc.strerror or exc}")
            return
        if not entries:
            self.problem(div, rel, "at least one bundle", "an empty workload folder")
        for e in entries:
            child = f"{rel}/{display_name(e.name)}"
            kind = _kind(e)
            archive = e.name.endswith(ARCHIVE_SUFFIX)
            run_dir = e.name[: -len(ARCHIVE_SUFFIX)] if archive else e.name
            if not NAME.fullmatch(run_dir):
                self.problem(div, child, "<run-id>/ bundle folders or <run-id>.tar.gz", f"unexpected {kind}")
                continue
            if kind == "symlink":
                self.scan.leaves.append(Leaf(child, div, org, system, workload, run_dir, archive, True))
            elif (kind == "dir" and not archive) or (kind == "file" and archive):
                self.scan.leaves.append(Leaf(child, div, org, system, workload, run_dir, archive))
            else:
                self.problem(div, child, "<run-id>/ bundle folders or <run-id>.tar.gz", f"unexpected {kind}")


def walk(root: Path) -> TreeScan:
    """Every bundle leaf and system file under ``root``, and every entry out of place."""
    scan = _Walker(Path(root)).walk()
    if not scan.leaves:
        scan.problems.append(("open", Problem(".", "at least one bundle under closed/ or open/",
                                              "no bundles found")))
    return scan
