"""A resume run as its configuration gives it (mlckpt/workload/resume_run.py): both layouts, the
plan every rule holds the records to, and what it cannot be run with (RESUME-SCOPE)."""

from __future__ import annotations

from typing import Any

import pytest

from mlckpt.plan.config import compose
from mlckpt.workload.resume_run import ResumeRun, scope_problems

BASE = ("resume.from_ranks=8", "ranks=4", "scale=0.01", "division=open")


def config(*overrides: str) -> dict[str, Any]:
    return compose([*BASE, *overrides])


def test_the_run_reads_both_layouts_from_its_configuration() -> None:
    run = ResumeRun.of(config("workload.parallelism.tensor=2", "resume.from_tensor=1", "resume.resumes=2"))
    assert run is not None and (run.ranks, run.tp, run.pp, run.from_ranks, run.from_tensor, run.resumes) == \
        (4, 2, 1, 8, 1, 2)
    assert run.written.ranks == 8 and run.written.tp == 1
    assert run.plan.ranks == 4 and run.plan.tp == 2 and len(run.plan.rank_resumes) == 4
    assert ResumeRun.of(compose([])) is None  # another kind of run


@pytest.mark.parametrize(("overrides", "says"), [
    (("checkpoint.mode=async",), "checkpoint.mode=async"),
    (("residency=stream",), "residency=stream"),
    (("framework.writer=torch_dcp",), "framework.writer=torch_dcp (the engine resumes; DCP's"),
    (("resume.from_tensor=3",), "resume.from_ranks=8 (a multiple of from_tensor x from_pipeline = 3)"),
    (("resume.from_pipeline=2",), "resume.from_pipeline=2 (ZeRO 3 runs one pipeline stage)"),
    (("scale=0.00001",), "scale=1e-05 ("),
    (("witness.url=http://127.0.0.1:1",), "witness.url"),
])
def test_what_a_resume_run_cannot_be_run_with(overrides: tuple[str, ...], says: str) -> None:
    bad = scope_problems(config(*overrides))
    assert any(says in b for b in bad), bad


def test_an_honest_resume_has_no_scope_problem() -> None:
    assert scope_problems(config()) == []
    assert scope_problems(config("ranks=16")) == []


def test_only_a_library_that_reshards_may_resume_and_under_rules_that_allow_it() -> None:
    dcp = ("torch_dcp",)
    writers = ("mlckpt", "torch_dcp")  # rules 1.22's resume.writers
    assert scope_problems(config("framework.writer=torch_dcp"), writers) == []
    assert scope_problems(config("framework.writer=torch_save"), writers) == [
        "framework.writer=torch_save (a library that reshards: mlckpt, torch_dcp)"]
    assert scope_problems(config("framework.writer=torch_dcp"), dcp) == []


def test_dcp_and_the_engine_alternate_and_dcp_reads_the_first_copy() -> None:
    run = ResumeRun.of(config("framework.writer=torch_dcp", "resume.resumes=3",
                              "workload.parallelism.tensor=2", "resume.from_tensor=1"))
    assert run is not None
    assert [run.writer_of(i) for i in range(3)] == ["torch_dcp", "mlckpt", "torch_dcp"]
    assert run.writers == ("torch_dcp", "mlckpt")
    assert run.plan_of("mlckpt") is run.plan and run.plan_of("torch_dcp") is run.whole_pieces
    # the same states, read from the first copy of a tensor TP replicated
    assert [r.tensors for r in run.whole_pieces.rank_resumes] == [r.tensors for r in run.plan.rank_resumes]
    alone = ResumeRun.of(config("framework.writer=torch_dcp", "framework.reference=false"))
    assert alone is not None and alone.writers == ("torch_dcp",)
    engine = ResumeRun.of(config())
    assert engine is not None and engine.writers == ("mlckpt",)
