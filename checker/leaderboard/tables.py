"""The leaderboard's tables: entries grouped into their classes, ranked within each, in the class
order the package docstring gives; and a class's scaling series (the charts').  Pure."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import pandas as pd

from checker.leaderboard.columns import (
    COLUMNS,
    RESUME_COLUMNS,
    RESUME_SORT_NOTE,
    SERVING_COLUMNS,
    SERVING_SORT_NOTE,
    SORT_NOTE,
    Column,
)
from checker.leaderboard.model import DIVISIONS, PIPELINES, RESUME, SCALES, SERVING, ClassKey, Entry, Excluded
from mlckpt.errors import InternalError
from mlckpt.rules import version_order


@dataclass(frozen=True)
class ClassTable:
    key: ClassKey
    frame: pd.DataFrame  # one row per result, its columns' keys + EXTRA_FIELDS, in ranking order
    entries: tuple[Entry, ...]  # same order

    @property
    def columns(self) -> tuple[Column, ...]:
        return columns_of(self.key)

    @property
    def sort_note(self) -> str:
        return {SERVING: SERVING_SORT_NOTE, RESUME: RESUME_SORT_NOTE}.get(self.key.pipeline, SORT_NOTE)


def columns_of(key: ClassKey) -> tuple[Column, ...]:
    """A class's columns: a serving or resume class's are its own (a time to ready or to resume, not
    write bandwidth)."""
    return {SERVING: SERVING_COLUMNS, RESUME: RESUME_COLUMNS}.get(key.pipeline, COLUMNS)


@dataclass(frozen=True)
class Leaderboard:
    tables: tuple[ClassTable, ...]
    excluded: tuple[Excluded, ...] = ()
    rules_versions: tuple[str, ...] = ()

    @property
    def results(self) -> int:
        """The checked results listed (published ones, --published, are :attr:`published`)."""
        return sum(not e.unverified for t in self.tables for e in t.entries)

    @property
    def published(self) -> int:
        return sum(e.unverified for t in self.tables for e in t.entries)

    @property
    def organisations(self) -> tuple[str, ...]:
        """The organisations of the checked results."""
        return tuple(sorted({e.org for t in self.tables for e in t.entries if not e.unverified}))

    def divisions(self) -> list[tuple[str, list[ClassTable]]]:
        return [(d, [t for t in self.tables if t.key.division == d])
                for d in DIVISIONS if any(t.key.division == d for t in self.tables)]


EXTRA_FIELDS = ("bundle", "workload", "scale", "verified", "write_min_gib_s", "write_max_gib_s",
                "read_min_gib_s", "read_max_gib_s")


def _frame(entries: Sequence[Entry], columns: Sequence[Column] = COLUMNS) -> pd.DataFrame:
    rows = []
    for e in entries:
        row = e.row()
        row.update(bundle=e.path, workload=e.workload, scale=e.scale, verified=not e.unverified,
                   write_min_gib_s=e.m("write_bandwidth_min_gib_s"),
                   write_max_gib_s=e.m("write_bandwidth_max_gib_s"),
                   read_min_gib_s=e.m("read_bandwidth_min_gib_s"),
                   read_max_gib_s=e.m("read_bandwidth_max_gib_s"))
        rows.append(row)
    frame = pd.DataFrame(rows, columns=[*(c.key for c in columns), *EXTRA_FIELDS])
    for c in columns:
        if c.kind == "num":
            frame[c.key] = frame[c.key].astype("float64")
        elif c.kind == "int":
            frame[c.key] = frame[c.key].astype("int64")
    return frame


def _workload_order(entries: Iterable[Entry]) -> dict[str, tuple[int, float, str]]:
    out: dict[str, tuple[int, float, str]] = {}
    for e in entries:
        size = e.model_size if math.isfinite(e.model_size) else math.inf
        key = (0 if e.canonical else 1, size, e.workload)
        out[e.workload] = min(out.get(e.workload, key), key)
    return out


def build(entries: Iterable[Entry], excluded: Iterable[Excluded] = (),
          rules_versions: Iterable[str] = ()) -> Leaderboard:
    """Group passing results into classes and rank each class (see the module docstring)."""
    entries = list(entries)
    seen: dict[str, Entry] = {}
    for e in entries:
        other = seen.setdefault(e.result_id, e)
        if other is not e:
            raise InternalError(f"result ID {e.result_id} would name both {other.path} and {e.path}")
    order = _workload_order(entries)
    groups: dict[ClassKey, list[Entry]] = {}
    for e in entries:
        groups.setdefault(e.class_key, []).append(e)

    def class_order(k: ClassKey) -> tuple[object, ...]:
        div = DIVISIONS.index(k.division) if k.division in DIVISIONS else len(DIVISIONS)
        pipe = PIPELINES.index(k.pipeline) if k.pipeline in PIPELINES else len(PIPELINES)
        return (div, k.division, order[k.workload], SCALES.index(k.scale), -k.factor, pipe, k.pipeline)

    tables = []
    for key in sorted(groups, key=class_order):
        frame = _frame(groups[key], columns_of(key))
        # checked results first; published ones (--published) below them, ranked the same way
        order_by = {SERVING: ["verified", "ready_s", "effective_gb_s", "result_id"],
                    RESUME: ["verified", "resume_s", "resume_gb_s", "result_id"]}.get(
            key.pipeline, ["verified", "write_gib_s", "read_gib_s", "result_id"])
        fastest = key.pipeline in (SERVING, RESUME)  # a time, ranked shortest first
        frame = frame.sort_values(order_by, ascending=[False, fastest, False, True],
                                  na_position="last", kind="mergesort").reset_index(drop=True)
        by_id = {e.result_id: e for e in groups[key]}
        tables.append(ClassTable(key, frame, tuple(by_id[i] for i in frame["result_id"])))
    excluded = tuple(sorted(excluded, key=lambda x: x.path))
    return Leaderboard(tuple(tables), excluded, tuple(sorted(set(rules_versions), key=version_order)))


def scaling_series(table: ClassTable) -> dict[tuple[str, str], list[tuple[int, float, float, int]]]:
    """Per (organisation, system) with results at two or more rank counts: (ranks, mean write
    GiB/s, mean read GiB/s, results) per rank count, ranks ascending (means over the results)."""
    by_sys: dict[tuple[str, str], dict[int, list[Entry]]] = {}
    for e in table.entries:
        by_sys.setdefault((e.org, e.system), {}).setdefault(e.ranks, []).append(e)
    out = {}
    for key in sorted(by_sys):
        points = by_sys[key]
        if len(points) < 2:
            continue
        series = []
        for ranks in sorted(points):
            es = points[ranks]
            w = [e.m("write_bandwidth_mean_gib_s") for e in es]
            r = [v for v in (e.m("read_bandwidth_mean_gib_s") for e in es) if math.isfinite(v)]
            series.append((ranks, sum(w) / len(w), sum(r) / len(r) if r else math.nan, len(es)))
        out[key] = series
    return out


