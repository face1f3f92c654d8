"""Rules 1.11's framework writers, the pure parts: who writes which checkpoint, what a library
writer is refused with before any I/O (FRAMEWORK-SCOPE), how the configuration refuses it under an
older rule set, and the summary's library/engine split with its ratios."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from mlckpt.errors import ConfigError, RuleError
from mlckpt.metrics import summarize
from mlckpt.plan.config import setup
from mlckpt.rules import Context, load_rules
from mlckpt.workload.frameworks import ENGINE, Framework, scope_problems

RS = load_rules("1.11")
BASE = ("rules_version=1.11", "workload=llama3_8b", "division=open", "scale=0.001", "ranks=2",
        "checkpoint.num_writes=2", "checkpoint.num_reads=2")


def ctx(*overrides: str) -> Callable[[], Context]:
    return lambda: setup([*BASE, *overrides]).context(None)


# (rule ID, context, what the finding's message says): the coverage test reads this table
NEGATIVE: list[tuple[str, Callable[[], Context], str]] = [
    ("FRAMEWORK-SCOPE", ctx("framework.writer=safetensors", "checkpoint.mode=async"),
     "checkpoint.mode=async (only torch_dcp has an async save)"),
    ("FRAMEWORK-SCOPE", ctx("framework.writer=torch_save", "checkpoint.tiers.fast=/dev/shm/x"),
     "checkpoint.tiers.fast (one tier)"),
    ("FRAMEWORK-SCOPE", ctx("framework.writer=torch_dcp", "residency=stream"),
     "residency=stream (the whole state)"),
    ("FRAMEWORK-SCOPE", ctx("framework.writer=torch_dcp", "witness.url=http://127.0.0.1:8470"),
     "witness.url (unwitnessed)"),
    ("FRAMEWORK-SCOPE", ctx("framework.writer=torch_save", "checkpoint.folder=s3://bucket/p"),
     "an s3:// folder (files only)"),
    ("FRAMEWORK-SCOPE", ctx("framework.writer=torch_save", "checkpoint.restore=repopulate"),
     "checkpoint.restore=repopulate (own)"),
]


@pytest.mark.parametrize(("rule_id", "make", "says"), NEGATIVE)
def test_a_library_writer_is_refused_what_it_cannot_run_with(rule_id: str, make: Callable[[], Context],
                                                             says: str) -> None:
    ev = RS.evaluate(make(), ("config",))
    found = [f for f in ev.findings if f.rule == rule_id]
    assert found and found[0].severity == "invalid"
    assert says in found[0].message, found[0].message


def test_a_resume_through_dcp_is_judged_as_a_dcp_run_is_from_rules_1_22() -> None:
    overrides = ["workload=llama3_8b", "division=open", "scale=0.01", "ranks=4", "resume.from_ranks=8",
                 "framework.writer=torch_dcp", "checkpoint.folder=s3://bucket/p"]
    ev = load_rules("1.22").evaluate(setup([*overrides, "rules_version=1.22"]).context(None), ("config",))
    [found] = [f for f in ev.findings if f.rule == "FRAMEWORK-SCOPE"]
    assert found.severity == "invalid" and "an s3:// folder (files only)" in found.message
    assert not [f for f in ev.findings if f.rule == "RESUME-SCOPE"]  # DCP may resume
    with pytest.raises(RuleError) as refused:  # rules 1.21: the writer refused, not by a framework rule
        setup([*overrides, "rules_version=1.21"])
    assert str(refused.value).startswith("[RESUME-SCOPE]") and "FRAMEWORK-SCOPE" not in str(refused.value)


def test_what_a_library_writer_runs_with_passes() -> None:
    for writer in ("torch_save", "torch_dcp", "safetensors"):
        ev = RS.evaluate(ctx(f"framework.writer={writer}")(), ("config",))
        assert not [f for f in ev.findings if f.rule == "FRAMEWORK-SCOPE"], writer
    ev = RS.evaluate(ctx("framework.writer=torch_dcp", "checkpoint.mode=async")(), ("config",))
    assert not [f for f in ev.findings if f.rule == "FRAMEWORK-SCOPE"]
    # an odd count gives the library one checkpoint more than the engine (the laptop preset's 3)
    ev = RS.evaluate(ctx("framework.writer=torch_save", "checkpoint.num_writes=3",
                         "checkpoint.num_reads=3")(), ("config",))
    assert not [f for f in ev.findings if f.rule == "FRAMEWORK-SCOPE"]


def test_a_closed_run_with_a_library_is_open_by_closed_overrides() -> None:
    ev = RS.evaluate(setup(["rules_version=1.11", "framework.writer=torch_save"]).context(None), ("config",))
    [f] = [f for f in ev.findings if f.rule == "CLOSED-OVERRIDES"]
    assert f.severity == "open" and "'framework.writer' is not allowed" in f.message


def test_an_older_rule_set_refuses_a_library_writer_in_one_line() -> None:
    with pytest.raises(ConfigError, match=r"^framework.writer: library writers need rules_version 1.11 or "
                                          r"later \(got 1.10\)$"):
        setup(["division=open", "rules_version=1.10", "framework.writer=torch_save"])
    with pytest.raises(ConfigError, match=r"framework\.writer"):
        setup([*BASE, "framework.writer=pickle"])  # not a writer: the schema names the key


def test_the_engine_alternates_with_the_library_round_by_round() -> None:
    fw = Framework("torch_dcp")
    assert [fw.writer_of(k) for k in (1, 2, 3, 4)] == ["torch_dcp", ENGINE, "torch_dcp", ENGINE]
    alone = Framework("torch_dcp", reference=False)
    assert [alone.writer_of(k) for k in (1, 2, 3)] == ["torch_dcp"] * 3
    assert [Framework().writer_of(k) for k in (1, 2)] == [ENGINE, ENGINE]
    assert Framework("torch_dcp").synced_by() == "library"
    assert Framework("torch_dcp", sync_files=False).synced_by() == "mlckpt"
    assert Framework("safetensors").synced_by() == "mlckpt"  # save_file never fsyncs
    assert Framework.of({"framework": {"writer": None, "reference": None, "threads": None,
                                       "sync_files": None}}) == Framework()
    assert scope_problems({"framework": {"writer": None}, "checkpoint": {"mode": "async"}}) == []


def _rec(op: str, k: int, rank: int, writer: str, dur_ms: float, nbytes: int = 1 << 30) -> dict[str, Any]:
    rec: dict[str, Any] = {"op": op, "index": k, "checkpoint": k, "rank": rank, "host": "h", "t0_ns": 0,
                           "t1_ns": int(dur_ms * 1e6), "bytes": nbytes, "files": 1, "fsync": True,
                           "writer": writer, "cpu_ns": int(dur_ms * 1e6)}
    if op == "write":
        rec.update(mode="sync", staged_ns=rec["t1_ns"], backpressure_ns=0, exposed_ns=0, compute_ns=0,
                   stages=[{"tier": "durable", "t0_ns": 0, "t1_ns": rec["t1_ns"], "bytes": nbytes}])
    else:
        rec.update(resident_bytes=0, cached_check_bytes=nbytes, verified_bytes=nbytes, mismatches=0,
                   tier="durable")
    return rec


def test_the_summary_heads_with_the_library_and_sets_the_engine_beside_it() -> None:
    # 2 ranks × 1 GiB: the library writes in 1 s and restores in 0.5 s, the engine in 0.5 and 0.25
    ms = {("write", "torch_save"): 1000, ("write", ENGINE): 500, ("read", "torch_save"): 500,
          ("read", ENGINE): 250}
    records = [_rec(op, k, r, w, ms[op, w]) for op in ("write", "read")
               for k, w in ((1, "torch_save"), (2, ENGINE)) for r in (0, 1)]
    s = summarize(records, max_resident_fraction=0.01)
    assert s["num_writes"] == 1 and s["num_reads"] == 1  # the headline is the library's ops alone
    assert s["write_bandwidth_mean_gib_s"] == pytest.approx(2.0)
    assert s["read_bandwidth_mean_gib_s"] == pytest.approx(4.0)
    fw = s["framework"]
    assert fw["writer"] == "torch_save" and fw["write_bandwidth_mean_gib_s"] == pytest.approx(2.0)
    ref = fw["reference"]
    assert ref["write_bandwidth_mean_gib_s"] == pytest.approx(4.0)
    assert ref["read_bandwidth_mean_gib_s"] == pytest.approx(8.0)
    assert ref["write_ratio"] == pytest.approx(0.5) and ref["read_ratio"] == pytest.approx(0.5)
    # records before format 8, or a summary format before 7: no split (what older bundles recompute)
    old = summarize(records, max_resident_fraction=0.01, records_format=7, summary_format=6)
    assert "framework" not in old and old["num_writes"] == 2
    alone = summarize([r for r in records if r["writer"] != ENGINE], max_resident_fraction=0.01)
    assert alone["framework"]["reference"] is None


@pytest.mark.parametrize(("writer", "absent", "said"), [
    ("torch_dcp", {"torch"}, "torch is not installed"),
    ("torch_save", {"torch"}, "torch is not installed"),
    ("safetensors", {"safetensors"}, "safetensors is not installed"),
    ("safetensors", {"torch"}, "torch is not installed"),  # safetensors.torch imports PyTorch
    ("safetensors", {"safetensors", "torch"}, "safetensors and torch are not installed"),
])
def test_a_writer_whose_library_is_missing_is_refused_before_io(monkeypatch: pytest.MonkeyPatch, writer: str,
                                                               absent: set[str], said: str) -> None:
    from mlckpt.plan import config

    asked: list[str] = []
    monkeypatch.setattr(config, "library_installed",
                        lambda module: asked.append(module) or module not in absent)
    with pytest.raises(ConfigError) as got:
        setup([*BASE, f"framework.writer={writer}"])
    cpu = config.CPU_TORCH if "torch" in absent else ""
    assert str(got.value) == (f"framework.writer={writer}: {said}: pip install 'mlckpt[frameworks]'{cpu}")
    assert got.value.key == "framework.writer" and set(asked) >= absent
    assert ("download.pytorch.org/whl/cpu" in str(got.value)) == ("torch" in absent)
    monkeypatch.setattr(config, "library_installed", lambda module: True)
    assert setup([*BASE, f"framework.writer={writer}"]).config["framework"]["writer"] == writer
