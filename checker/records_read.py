"""records.jsonl read for the schema stage: its bound, then every line parsed strictly and
validated against the record schema of the bundle's rules version.

A large run's records (tens of thousands of lines) are read in two invocations where ``--jobs`` leaves
the bundle a second core: the second half in a forked process (checker/forked.py), whose records
and messages come back to be joined after the first half's, so that the records, the messages and
where the reading stopped are exactly what one pass gives (tests/unit/checker/test_records_read.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from checker import forked
from checker.rulesets import error_key, schema_message
from mlckpt import strict as loading
from mlckpt.schemas import fast_check, validator
from mlckpt.strict import ParseError
from mlckpt.workload.resume_run import DEFAULT_RESUMES
from mlckpt.workload.serving_run import DEFAULT_LOADS

MAX_MESSAGES = 10  # schema problems reported per file (the reading stops past them)
# Without a configuration's counts (config.yaml unreadable or not a configuration): twice the
# records of the largest canonical run, llama3_1t closed (1,024 ranks, 10 writes and 10 restores).
FALLBACK_RECORDS = 1024 * 20


def records_bound(config: Any) -> tuple[int, str]:
    """The most records the checker reads for the bundle's configuration, and what it rests on:
    twice what the configuration makes (a serving run's: ranks × serving.loads) plus 1,024, so a
    configuration that lies about its counts is still judged by the rules that own them
    (COUNTS-POSITIVE, RECORDS-*, SERVING-PLAN), while 60,000 copies of a record in an 8-record run
    are refused before a line is parsed; with counts that are not plain integers (the schema
    reports them), twice a closed llama3_1t run's."""
    try:
        ranks, ck, serving = config["ranks"], config["checkpoint"], config.get("serving") or {}
        resume = config.get("resume") or {}
        if serving.get("strategy"):  # a serving run (rules 1.13): one record per rank and load
            counts = (ranks, DEFAULT_LOADS if serving.get("loads") is None else serving["loads"], 0)
            what = "serving.loads"
        elif resume.get("from_ranks"):  # a resume run (rules 1.21): one record per rank and resume
            counts = (ranks, DEFAULT_RESUMES if resume.get("resumes") is None else resume["resumes"], 0)
            what = "resume.resumes"
        else:
            counts, what = (ranks, ck["num_writes"], ck["num_reads"]), "(num_writes + num_reads)"
    except (KeyError, TypeError, AttributeError):
        return (2 * FALLBACK_RECORDS + 1024,
                "config.yaml gives no counts: twice the 20,480 of a closed llama3_1t run")
    if len(counts) == 3 and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in counts):
        return 2 * counts[0] * (counts[1] + counts[2]) + 1024, f"twice the ranks × {what} of config.yaml"
    return (2 * FALLBACK_RECORDS + 1024,
            "config.yaml gives no counts: twice the 20,480 of a closed llama3_1t run")


@dataclass(frozen=True)
class Bad:
    """A line that fails the schema: its messages, and how many valid records came before it."""

    after: int
    messages: list[str]


@dataclass(frozen=True)
class Read:
    """What reading some lines gave: the valid records, the lines that fail the schema, a parse
    error that ended the reading, and whether the budget ended it."""

    records: list[dict[str, object]]
    bad: list[Bad]
    parse_error: str | None = None
    over_budget: bool = False

    def messages(self) -> list[str]:
        out = [m for b in self.bad for m in b.messages]
        return [*out, self.parse_error] if self.parse_error is not None else out


def read(data: bytes, version: str, over_budget: Callable[[], bool], workers: int = 1) -> Read:
    """Every line of ``data`` (records.jsonl), as one pass gives it; on two processes where
    ``workers`` allows and the lines are many."""
    cut = data.find(b"\n", len(data) // 2) + 1  # 0: no line ends in the second half
    few = data.count(b"\n") < forked.MIN_RECORDS
    if workers <= 1 or few or not forked.AVAILABLE or not 0 < cut < len(data):
        return _read(data, version, over_budget, 1)
    second = data.count(b"\n", 0, cut) + 1  # the number of the second half's first line
    try:
        child = forked.Forked(lambda: _read(data[cut:], version, over_budget, second))
    except OSError:  # no process to be had (limits, memory): one pass
        return _read(data, version, over_budget, 1)
    with child:
        head = _read(data[:cut], version, over_budget, 1)
        if head.over_budget or head.parse_error is not None or _past(head.bad):
            return head  # one pass stops here too
        done, tail = child.result()
    if not done or tail is None:  # the process died: its half, here
        tail = _read(data[cut:], version, over_budget, second)
    return _joined(head, tail)


def _past(bad: list[Bad]) -> bool:
    """Past the messages reported, where one pass stops reading."""
    return sum(len(b.messages) for b in bad) > MAX_MESSAGES


def _joined(head: Read, tail: Read) -> Read:
    """``head`` then ``tail``, cut where one pass over both would have stopped."""
    bad = list(head.bad)
    for b in tail.bad:
        bad.append(Bad(len(head.records) + b.after, b.messages))
        if _past(bad):  # what follows was never read in one pass
            return Read(head.records + tail.records[:b.after], bad)
    return Read(head.records + tail.records, bad, tail.parse_error, tail.over_budget)


def _read(data: bytes, version: str, over_budget: Callable[[], bool], first_line: int) -> Read:
    fast = fast_check("record", version)  # a large run has tens of thousands of records
    records: list[dict[str, object]] = []
    bad: list[Bad] = []
    seen = loading.integral_floats()
    try:
        for lineno, rec in loading.iter_jsonl(data, first_line=first_line):
            if lineno % 64 == 0 and over_budget():  # a loaded machine: lines can take ms each
                return Read(records, bad, over_budget=True)
            now, seen = seen, loading.integral_floats()
            if fast is not None and fast(rec, seen != now):
                records.append(rec)
                continue
            v = validator("record", version)  # the strict validator decides, and says why
            errs = list(v.iter_errors(rec)) if not v.is_valid(rec) else []
            if errs:
                bad.append(Bad(len(records), [f"line {lineno}: {schema_message(e)}"
                                              for e in sorted(errs, key=error_key)]))
                if _past(bad):
                    break
                continue
            records.append(rec)
    except ParseError as exc:
        return Read(records, bad, str(exc))
    return Read(records, bad)
