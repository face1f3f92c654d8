"""`mlckpt run -m`: a sweep that validates every combination before it launches any, goes on when
a launch fails (Hydra's basic sweeper and launcher run the combinations), and ends with a table of
the combinations (also written as CSV)."""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from mlckpt.errors import MlckptError, UsageError, status_word


@dataclass(frozen=True)
class Done:
    """One combination's launch: its exit status and, when it wrote one, its bundle's headline."""

    combo: tuple[str, ...]
    status: int
    bundle: Path | None
    write_gib_s: float | None
    read_gib_s: float | None


def swept_keys(combos: Sequence[Sequence[str]]) -> list[str]:
    """The keys whose values differ between combinations (the table's first columns)."""
    values: dict[str, set[str]] = {}
    for combo in combos:
        for o in combo:
            key, _, value = o.partition("=")
            values.setdefault(key, set()).add(value)
    return [k for k, v in values.items() if len(v) > 1]


def _values(combo: Sequence[str], keys: Sequence[str]) -> list[str]:
    found = dict(o.partition("=")[::2] for o in combo)
    return [found.get(k, "") for k in keys]


def validate_all(combos: Sequence[Sequence[str]],
                 validate: Callable[[list[str]], Any]) -> dict[frozenset[str], Any]:
    """Every combination's validated setup, keyed by its overrides; the sweep is refused before
    any launch, with one line per refused combination (each named by its swept values)."""
    keys = swept_keys(combos)
    bad, setups = [], {}
    for i, combo in enumerate(combos, 1):
        try:
            setups[frozenset(combo)] = validate(list(combo))
        except MlckptError as exc:
            named = " ".join(f"{k}={v}" for k, v in zip(keys, _values(combo, keys), strict=True))
            bad.append(f"combination {i} ({named}): {str(exc).splitlines()[0]}")
    if bad:
        raise UsageError(f"the sweep is refused before any launch: {bad[0]}"
                         + "".join(f"\n  also: {line}" for line in bad[1:]))
    return setups


def _bundle(results: Path, before: set[Path]) -> tuple[Path | None, float | None, float | None]:
    entries = results.iterdir() if results.is_dir() else iter(())
    new = sorted(p for p in entries if p.is_dir() and p not in before and not p.name.startswith("."))
    if not new:
        return None, None, None
    summary = json.loads((new[-1] / "summary.json").read_text())
    return new[-1], summary.get("write_bandwidth_mean_gib_s"), summary.get("read_bandwidth_mean_gib_s")


def table(done: Sequence[Done], root: Path | None = None) -> tuple[list[str], list[list[str]]]:
    """The closing table: swept values, status, write and read GiB/s, each rate's ratio to the
    best ok result of the sweep, and the bundle (relative to the sweep's ``root``). A row that is
    not ok (disturbed, invalid) shows its rates but no ratio: it is neither a reference nor ranked
    against one, so no ratio exceeds 1.00."""
    keys = swept_keys([d.combo for d in done])
    valid = [d for d in done if d.status == 0]
    best_w = max((d.write_gib_s for d in valid if d.write_gib_s), default=None)
    best_r = max((d.read_gib_s for d in valid if d.read_gib_s), default=None)
    head = [*keys, "status", "write GiB/s", "write vs best", "read GiB/s", "read vs best", "bundle"]
    rows = []
    for d in done:
        ok = d.status == 0
        rows.append([*_values(d.combo, keys), f"{d.status} {status_word(d.status)}".strip(),
                     *_rate(d.write_gib_s, best_w, ok), *_rate(d.read_gib_s, best_r, ok),
                     _shown(d.bundle, root)])
    return head, rows


def _rate(v: float | None, best: float | None, ok: bool) -> list[str]:
    if v is None:
        return ["", ""]
    return [f"{v:.2f}", f"{v / best:.2f}" if best and ok else ""]


def _shown(bundle: Path | None, root: Path | None) -> str:
    if bundle is None:
        return ""
    return str(bundle.relative_to(root)) if root and bundle.is_relative_to(root) else bundle.name


def launched(combo: Sequence[str], results: Path, launch: Callable[[], int]) -> Done:
    """Launch one combination whose bundle goes to ``results``; what it left there."""
    before = set(results.iterdir()) if results.is_dir() else set()
    return Done(tuple(combo), launch(), *_bundle(results, before))


def finish(done: Sequence[Done], root: Path) -> int:
    """Print the table, write it as CSV under the sweep's results folder; the sweep's status is
    the worst of its launches."""
    from tabulate import tabulate

    head, rows = table(done, root)
    print(f"--- sweep of {len(done)}: {sum(d.status == 0 for d in done)} ok", flush=True)
    print(tabulate(rows, headers=head, tablefmt="simple", disable_numparse=True), flush=True)
    out = root / f"sweep-{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%SZ')}.csv"
    with open(out, "w", newline="") as fh:
        csv.writer(fh).writerows([head, *rows])
    print(f"sweep table: {out}", flush=True)
    return max((d.status for d in done), default=0)
