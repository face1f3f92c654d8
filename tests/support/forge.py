"""The dishonest vendor's toolbox (test-only): edit a real bundle's documents as a forger with the
project's own code would, recompute what the runner would have written, and re-sign.

Used by tests/adversarial/test_forgeries.py (the forgery suite) and tests/e2e/test_checker.py
(``disguise``: the negative cases are all made from the same few runs, so each gets timings of its
own, or the checker would rightly call them one run submitted many times).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

from mlckpt import bundle
from mlckpt.rules import load_rules, resume_summarized
from mlckpt.rules.checks.evidence import recomputed_summary
from mlckpt.rules.checks.serving import summarized
from mlckpt.rules.rundata import RunData
from mlckpt.workload.layout import make_plan
from mlckpt.workload.model import workload_from_config
from mlckpt.workload.resume_run import ResumeRun
from mlckpt.workload.serving_run import ServingRun

Rec = dict[str, Any]


def read_json(folder: Path, name: str) -> Any:
    return json.loads((folder / name).read_text())


def edit_json(folder: Path, name: str, fn: Callable[[Any], Any]) -> None:
    p = folder / name
    doc = json.loads(p.read_text())
    new = fn(doc)
    p.write_text(json.dumps(doc if new is None else new, indent=1, sort_keys=True) + "\n")


def edit_yaml(folder: Path, name: str, fn: Callable[[Any], Any]) -> None:
    p = folder / name
    doc = yaml.safe_load(p.read_text())
    new = fn(doc)
    p.write_text(yaml.safe_dump(doc if new is None else new, sort_keys=False))


def read_records(folder: Path) -> list[Rec]:
    return [json.loads(line) for line in (folder / "records.jsonl").read_text().splitlines()]


def edit_records(folder: Path, fn: Callable[[list[Rec]], Any]) -> None:
    recs = read_records(folder)
    new = fn(recs)
    (folder / "records.jsonl").write_text(
        "".join(json.dumps(r, sort_keys=True) + "\n" for r in (recs if new is None else new))
    )


def resummarize(folder: Path) -> None:
    """summary.json as the runner would write it for the (edited) records and configuration."""
    config = yaml.safe_load((folder / "config.yaml").read_text())
    run = read_json(folder, "run.json")
    resume = ResumeRun.of(config)
    if resume is not None:
        data = RunData(run, config, {}, read_records(folder))
        doc = resume_summarized(load_rules(run["rules_version"]), data, resume)
        edit_json(folder, "summary.json", lambda _: doc)
        return
    serving = ServingRun.of(config)
    if serving is not None:
        data = RunData(run, config, {}, read_records(folder))
        doc = summarized(load_rules(run["rules_version"]), data, serving)
        edit_json(folder, "summary.json", lambda _: doc)
        return
    plan = make_plan(workload_from_config(config["workload"]), int(config["ranks"]), float(config["scale"]))
    data = RunData(run, config, {}, read_records(folder), read_json(folder, "system.json"))
    summary = recomputed_summary(load_rules(run["rules_version"]), data, plan)
    edit_json(folder, "summary.json", lambda _: summary)


def resign(folder: Path, key: Any, **predicate: Any) -> None:
    """Sign again with ``key`` through the project's own signing, the predicate updated."""
    pred = bundle.read_envelope_predicate(folder)
    pred.update(predicate)
    bundle.sign_bundle(folder, key, pred)


# ------------------------------------------------------------------------------ record surgery
def ns_fields(r: Rec) -> Iterator[tuple[Any, str | int]]:
    """Every (container, key) of a record holding a reading of its host's monotonic clock."""
    for k in ("t0_ns", "t1_ns", "staged_ns"):
        if k in r:
            yield r, k
    for st in r.get("stages", ()):
        yield st, "t0_ns"
        yield st, "t1_ns"
    hc = r.get("host_counters")
    if hc:
        yield hc["before"], "t_ns"
        yield hc["after"], "t_ns"
        for sample in hc.get("samples", ()):  # records format 7: [t_ns, read_bytes, written_bytes]
            yield sample, 0


def shift(r: Rec, delta_ns: int, *, wall: bool = True) -> None:
    """Move a record in time by ``delta_ns`` (its wall-clock start too, unless ``wall`` is False)."""
    for box, k in ns_fields(r):
        box[k] += delta_ns  # type: ignore[index]
    if wall:
        r["wall_start"] += delta_ns / 1e9


def end_of(r: Rec) -> int:
    return int(r["staged_ns"]) if r["op"] == "write" else int(r["t1_ns"])


def set_duration(r: Rec, new_ns: int, *, from_start: bool = False) -> None:
    """Make a record's timed op last ``new_ns``: its end moves (or, ``from_start``, its start and
    wall-clock start), stages and training bookkeeping kept consistent for sync one-tier writes and
    reads."""
    old = end_of(r) - int(r["t0_ns"])
    delta = old - new_ns
    if from_start:
        r["t0_ns"] += delta
        r["wall_start"] += delta / 1e9
        if r["op"] == "write" and r["stages"][0]["t0_ns"] == r["t0_ns"] - delta:
            r["stages"][0]["t0_ns"] += delta
        return
    sync_end = r["op"] == "write" and r["t1_ns"] == r["staged_ns"]
    if r["op"] == "write":
        r["staged_ns"] -= delta
        r["compute_ns"] = max(0, r["compute_ns"] + delta)  # training resumes earlier: same next barrier
        if sync_end:
            r["t1_ns"] -= delta
            r["stages"][-1]["t1_ns"] -= delta
        else:
            r["stages"][0]["t1_ns"] -= delta
    else:
        r["t1_ns"] -= delta


def scale_requests(r: Rec, factor: float) -> None:
    """A record's requests and phases scaled by ``factor`` as a forger who shortened its op would
    recompute them (records format 7): every request's latency and every phase, in proportion."""
    from mlckpt import latency

    if "phases_ns" in r:
        r["phases_ns"] = {k: int(v * factor) for k, v in r["phases_ns"].items()}
    if "requests" in r:
        values: list[int] = []
        for item in latency.decode(r["requests"]).get_recorded_iterator():
            values += [int(item.value_iterated_to * factor)] * item.count_at_value_iterated_to
        r["requests"] = latency.encode(values)


def disguise(folder: Path, n: int) -> None:
    """Give a copied bundle timings of its own without changing what any rule sees: every clock
    reading moves by n µs, every op lasts n ns longer; summary.json recomputed."""

    def edit(recs: list[Rec]) -> None:
        for r in recs:
            shift(r, (n + 1) * 1000, wall=False)
            r["t1_ns"] += n + 1
            if r["op"] == "write":
                r["stages"][-1]["t1_ns"] += n + 1
                if r["staged_ns"] == r["t1_ns"] - n - 1:
                    r["staged_ns"] += n + 1
            if "host_counters" in r:
                r["host_counters"]["after"]["t_ns"] += n + 1

    edit_records(folder, edit)
    resummarize(folder)
