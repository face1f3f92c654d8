"""``mlckpt-check leaderboard ROOT``: check the tree, publish the passing results."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from checker import TRUSTED_WITNESSES_FILE
from checker.leaderboard import render
from checker.leaderboard.collect import collect, is_archive
from checker.leaderboard.tables import Leaderboard
from checker.tree_check import budget_of, load_trusted, load_witnesses, max_records_of
from mlckpt.errors import ExitStatus, UsageError


def cmd_leaderboard(args: argparse.Namespace) -> int:
    root: Path = args.root
    if not root.is_dir():
        raise UsageError(f"{root}: not a folder (expected a submission tree)")
    jobs = args.jobs if args.jobs is not None else (os.cpu_count() or 1)
    if jobs < 1:
        raise UsageError(f"--jobs: must be at least 1, got {jobs}")
    if args.out is not None and args.out.is_dir():
        raise UsageError(f"--out {args.out}: a folder; give the file to write "
                         f"(e.g. {args.out / 'index.html'})")
    check_budget, max_records = budget_of(args), max_records_of(args)
    published, unread = published_results(args.published, args.witnessed_only)
    trusted = load_trusted(root, args.trusted_keys)
    witnesses = load_witnesses(root, args.trusted_witnesses)
    if args.witnessed_only and witnesses is None:
        raise UsageError("--witnessed-only: no trusted witnesses (give --trusted-witnesses FILE or put "
                         f"{TRUSTED_WITNESSES_FILE} in {root})")
    board = collect(root, trusted, jobs=jobs, witnesses=witnesses, witnessed_only=args.witnessed_only,
                    published=published, budget_s=check_budget, max_records=max_records)
    base = Path(os.path.abspath(args.out)).parent if args.out is not None else Path(os.path.abspath("."))
    links = {e.path: _link(Path(os.path.abspath(root)) / e.path, base, is_archive(Path(e.path)))
             for t in board.tables for e in t.entries}
    reports = run_pages(board, root, args.out) if args.format == "html" and args.out is not None else {}
    text = render.render(board, args.format, links=links, reports=reports)
    if args.out is None:
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        try:
            args.out.parent.mkdir(parents=True, exist_ok=True)  # `--out site/index.html` makes site/
            with open(args.out, "w", encoding="utf-8", newline="") as fh:
                fh.write(text)
        except OSError as exc:
            raise UsageError(f"--out {args.out}: cannot write: {exc.strerror or exc}") from None
    n, k = board.results, len(board.tables)
    note = f"leaderboard: {n} result{'s' if n != 1 else ''} in {k} class{'es' if k != 1 else ''}"
    if board.excluded:
        note += (f"; {len(board.excluded)} bundle{'s' if len(board.excluded) != 1 else ''} excluded "
                 f"(run `mlckpt-check {root}` for the findings)")
    if args.published:
        note += (f"; and {len(published)} published elsewhere, UNVERIFIED"
                 + (f" ({len(unread)} folder{'s' if len(unread) != 1 else ''} not read: "
                    f"`mlckpt-check import DIR` says why)" if unread else ""))
    if args.out is not None:
        note += f"; wrote {args.out}"
    print(note, file=sys.stderr)
    return ExitStatus.OK


def published_results(folders: list[Path], witnessed_only: bool) -> tuple[list[Any], list[tuple[str, str]]]:
    """The --published folders' results (unverified entries) and the folders that could not be read."""
    from checker.imported import published_entries

    if folders and witnessed_only:
        raise UsageError("--published with --witnessed-only: a published DLIO / mlpstorage result has no "
                         "witness; drop one of the two")
    entries: list[Any] = []
    unread: list[tuple[str, str]] = []
    for folder in folders:
        if not folder.is_dir():
            raise UsageError(f"--published {folder}: not a folder (expected a published results tree)")
        found, problems = published_entries(folder)
        if not found:
            raise UsageError(f"--published {folder}: no DLIO / mlpstorage result under it "
                             f"(`mlckpt-check import {folder}` lists what it could not read)")
        entries += found
        unread += problems
    return entries, unread


def run_pages(board: Leaderboard, root: Path, out: Path) -> dict[str, str]:
    """Each result's own page (mlckpt report) in ``OUT-runs/`` beside the leaderboard, sharing one
    copy of plotly.js; bundle path -> href relative to the leaderboard.  A result kept as an
    archive gets none (its records are not unpacked here)."""
    from mlckpt.report import files, page

    folder = out.with_name(out.stem + "-runs")
    entries = [e for t in board.tables for e in t.entries
               if not is_archive(Path(e.path)) and not e.unverified]  # a published result has no records
    if not entries:
        return {}
    try:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "plotly.min.js").write_text(render.plotly_bundle(), encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"--out {out}: cannot write the run pages in {folder}: "
                         f"{exc.strerror or exc}") from None
    out_links = {}
    for e in entries:
        rid = e.result_id
        bundle = Path(os.path.abspath(root)) / e.path
        try:
            rep = files.read(bundle)
        except ValueError:
            continue  # a result the checker passed always reads; nothing to link otherwise
        href = os.path.relpath(bundle, folder).replace(os.sep, "/") + "/"
        (folder / f"{rid}.html").write_text(page.render(rep, plotly_src="plotly.min.js", bundle_href=href),
                                            encoding="utf-8")
        out_links[e.path] = f"{folder.name}/{rid}.html"
    return out_links


def _link(target: Path, base: Path, archive: bool) -> str:
    rel = os.path.relpath(target, base).replace(os.sep, "/")
    return rel if archive else rel + "/"

