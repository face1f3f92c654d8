"""Witnessed runs end to end: a real `mlckpt witness serve` on the loopback address, real
runs under mpiexec that it witnesses, and the checker holding their bundles against its signed
transcripts, honest and forged."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.cli import CHECKER_DESCRIPTION, MLCKPT, cli_env
from support.forge import (
    edit_json,
    edit_records,
    edit_yaml,
    read_json,
    read_records,
    resign,
    resummarize,
    scale_requests,
    set_duration,
)
from support.runs import printed_bundle
from support.witnessbed import Witness

from checker.tree_check import check_tree
from mlckpt import bundle
from mlckpt.witness.protocol import TRANSCRIPT_TYPE

ORG, SYSTEM = "example-org", "laptop-ext4"
RUN = ("workload=llama3_8b", "division=open", "scale=0.004", "ranks=4", "checkpoint.num_writes=2",
       "checkpoint.num_reads=2", "io.direct=false", f"system={SYSTEM}.yaml", "output.root=results")


def run(d: Path, *extra: str, timeout: float = 400) -> subprocess.CompletedProcess[str]:
    """A run these tests need valid: beside a busy disk a try may come out disturbed, so it is
    tried up to six times (each try keeps its bundle; the one printed last is the result's)."""
    return subprocess.run([str(MLCKPT), "run", *RUN, f"signing.key={d / 'org.pem'}", *extra], cwd=d,
                          env={**cli_env(), "XDG_CONFIG_HOME": str(d / "xdg"), "MLCKPT_RETRY_DISTURBED": "5"},
                          text=True, capture_output=True, timeout=timeout, check=False)


def started(d: Path, until: str, *extra: str) -> tuple[subprocess.Popen[str], list[str]]:
    """A run in the background, its output read up to the line starting with ``until``."""
    proc = subprocess.Popen([str(MLCKPT), "run", *RUN, f"signing.key={d / 'org.pem'}", *extra], cwd=d,
                            env={**cli_env(), "XDG_CONFIG_HOME": str(d / "xdg")}, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith(until):
            break
    return proc, lines


def findings(stdout: str) -> list[str]:
    """A run's finding and note lines (stdout), to say why it was not valid."""
    return [ln for ln in stdout.splitlines() if ln.startswith(("finding:", "note:"))]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Two witnessed runs and an unwitnessed one of the same workload, the witness, the keys."""
    d = tmp_path_factory.mktemp("witnessed")
    org = bundle.generate_key(d / "org.pem")
    (d / f"{SYSTEM}.yaml").write_text(CHECKER_DESCRIPTION)
    (d / "witness").mkdir()
    w = Witness(d / "witness", org_key=d / "org.pem")
    w.start()
    try:
        out: dict[str, Any] = {"dir": d, "witness": w, "org": org}
        for name in ("a", "b"):
            proc = run(d, f"witness.url={w.url}")
            assert proc.returncode == 0, (proc.stderr, findings(proc.stdout))
            out[name], out[f"{name}_out"] = printed_bundle(proc), proc.stdout
        proc = run(d)
        assert proc.returncode == 0, (proc.stderr, findings(proc.stdout))
        out["plain"] = printed_bundle(proc)
        yield out
    finally:
        w.stop()


def tree(r: dict[str, Any], root: Path, *bundles: Path, trusted_witness: str | None = "committee",
         witness: Witness | None = None) -> Path:
    (root / "open" / ORG / "systems").mkdir(parents=True)
    shutil.copy(r["dir"] / f"{SYSTEM}.yaml", root / "open" / ORG / "systems")
    for b in bundles:
        shutil.copytree(b, root / "open" / ORG / "results" / SYSTEM / "llama3_8b" / b.name)
    (root / "trusted-keys.yaml").write_text(
        f'mlckpt_trusted_keys: "1.0"\norganizations:\n  {ORG}: ["{r["org"].public_key}"]\n')
    if trusted_witness:
        pub = ((witness or r["witness"]).key.parent / "witness.pem.pub").read_text().strip()
        (root / "trusted-witnesses.yaml").write_text(
            f'mlckpt_trusted_witnesses: "1.0"\nwitnesses:\n  {trusted_witness}: ["{pub}"]\n')
    return root


def checked(root: Path) -> list[dict[str, Any]]:
    from checker.tree_check import load_witnesses

    report = check_tree(root, bundle.TrustedKeys.load(root / "trusted-keys.yaml"),
                        witnesses=load_witnesses(root, None))
    return list(report["bundles"])


def rules_of(b: dict[str, Any]) -> set[str]:
    return {f["rule"] for f in b["findings"]}


def transcript_doc(folder: Path) -> dict[str, Any]:
    env = json.loads((folder / "witness.dsse.json").read_text())
    return dict(json.loads(base64.b64decode(env["payload"])))


# --------------------------------------------------------------------------------------- honest


def test_a_witnessed_run_passes_and_counts_as_witnessed(runs: dict[str, Any], tmp_path: Path) -> None:
    a = runs["a"]
    claim = read_json(a, "run.json")["witness"]
    doc = transcript_doc(a)
    assert claim["status"] == "witnessed" and claim["transcript"] == "witness.dsse.json"
    assert claim["keyid"] == runs["witness"].keyid == doc["witness_keyid"] and claim["run"] == doc["run"]
    kinds = [(e["kind"], e.get("op"), e.get("index")) for e in doc["entries"]]
    assert kinds[0] == ("open", None, None) and kinds[-1] == ("close", None, None)
    assert [k for k in kinds if k[0] in ("start", "end")] == [
        (k, op, i) for op in ("write", "read") for i in (1, 2) for k in ("start", "end")]
    issued = [e["nonce"] for e in doc["entries"] if e["kind"] == "start" and e["op"] == "write"]
    assert claim["nonces"] == issued
    assert len(set(claim["nonces"])) == 2
    assert f"witnessed by {runs['witness'].url}" in runs["a_out"]
    pub = (runs["witness"].key.parent / "witness.pem.pub").read_text().strip()
    assert runs["witness"].entry == f'trusted-witnesses entry: NAME: ["{pub}"]\n'  # paste-ready
    [b] = checked(tree(runs, tmp_path / "t", a))
    assert b["verdict"] == "open" and not b["findings"], b["findings"]
    w = b["witness"]
    assert (w["by"], w["counted"], w["keyid"]) == ("committee", True, runs["witness"].keyid)
    # The witness-conservative bandwidth: the same bytes over a longer interval, never faster.
    assert 0 < w["write_bandwidth_witnessed_mean_gib_s"] <= b["metrics"]["write_bandwidth_mean_gib_s"]
    assert 0 < w["read_bandwidth_witnessed_mean_gib_s"] <= b["metrics"]["read_bandwidth_mean_gib_s"]
    assert "WITNESS-TRUSTED" not in {n["rule"] for n in b["not_checked"]}


def test_the_page_tags_carry_the_witness_nonce(runs: dict[str, Any]) -> None:
    """The restores verified every page against tags sealed with the nonce of its write: a write
    whose nonce were different would have failed verification (see test_engine's seal test)."""
    recs = read_records(runs["a"])
    reads = [r for r in recs if r["op"] == "read"]
    assert reads and all(r["verified_bytes"] == r["bytes"] and r["mismatches"] == 0 for r in reads)


def test_without_trusted_witnesses_a_witnessed_run_passes_uncounted(runs: dict[str, Any],
                                                                     tmp_path: Path) -> None:
    [b] = checked(tree(runs, tmp_path / "t", runs["a"], trusted_witness=None))
    assert b["verdict"] == "open" and not b["findings"]
    assert b["witness"]["counted"] is False and b["witness"]["by"] is None
    assert "WITNESS-TRUSTED" in {n["rule"] for n in b["not_checked"]}


def test_an_unwitnessed_run_says_so_and_passes(runs: dict[str, Any], tmp_path: Path) -> None:
    assert read_json(runs["plain"], "run.json")["witness"] is None
    assert not (runs["plain"] / "witness.dsse.json").exists()
    [b] = checked(tree(runs, tmp_path / "t", runs["plain"]))
    assert b["verdict"] == "open" and not b["findings"] and b["witness"] is None


# --------------------------------------------------------------------------------------- forged
# Each forgery edits a copy of witnessed run "a" as a dishonest vendor with the project's own code
# would, and re-signs it with the vendor's trusted key: only the witness can contradict it.

Edit = Callable[[Path, dict[str, Any], Path], None]


def past_the_bound(work: Path) -> dict[int, float]:
    """The share of each witnessed write a forger cuts: three quarters, or 5 ms past the witness's
    bound where that is more (a busy host's allowance can exceed three quarters of the tests' short
    ops, and a cut within it is what the witness cannot see).  A write whose bound is nearly its
    whole length is left out: the report names it unbounded."""
    recs = read_records(work)
    out = {}
    for a in _accounts(work):
        k = a["index"]
        longest = max(r["t1_ns"] - r["t0_ns"] for r in recs if r["op"] == "write" and r["index"] == k) / 1e9
        share = max(0.75, (a["room_s"] + 0.005) / longest)
        if share < 0.95:
            out[k] = share
    assert out, "every write is within the witness's bound: nothing a witness could catch"
    return out


def cut_writes(cut: dict[int, float], requests: bool = False) -> Callable[[list[dict[str, Any]]], None]:
    """Each write ``k`` of ``cut`` shorter by ``cut[k]`` on every rank (its end earlier), and each
    host's last counter reading moved as much earlier as the host's last end; ``requests``: the
    requests' latencies scaled alike (RECORDS-REQUESTS)."""

    def edit(recs: list[dict[str, Any]]) -> None:
        writes: dict[tuple[int, str], list[dict[str, Any]]] = {}
        for r in recs:
            if r["op"] == "write" and r["index"] in cut:
                writes.setdefault((r["index"], r["host"]), []).append(r)
        for (k, _), host_recs in writes.items():
            old_last = max(r["t1_ns"] for r in host_recs)
            for r in host_recs:
                set_duration(r, int((r["t1_ns"] - r["t0_ns"]) * (1 - cut[k])))
                if requests:
                    scale_requests(r, 1 - cut[k])
            for r in host_recs:
                if "host_counters" in r:
                    r["host_counters"]["after"]["t_ns"] -= old_last - max(x["t1_ns"] for x in host_recs)
    return edit


def shrunk_writes(work: Path, runs: dict[str, Any], tmp: Path) -> dict[int, float]:
    """A witnessed run's writes cut past the witness's bound; an unwitnessed run's by three quarters."""
    witnessed = (work / "witness.dsse.json").exists()
    cut = past_the_bound(work) if witnessed else {1: 0.75, 2: 0.75}
    edit_records(work, cut_writes(cut))
    resummarize(work)
    return cut


def quartered_writes(work: Path, runs: dict[str, Any], tmp: Path) -> None:
    """Writes cut past the witness's bound, their requests recomputed, run.json's verdict the one
    the rules give (disturbed: a forger who left it open would fail RESULT-VERDICT as well)."""
    edit_records(work, cut_writes(past_the_bound(work), requests=True))
    resummarize(work)
    edit_json(work, "run.json", lambda r: r.update(verdict="disturbed"))


def account_inflated(work: Path, runs: dict[str, Any], tmp: Path) -> None:
    """Rank 0 says it spent a second before its first write that the witness never saw."""
    edit_records(work, lambda recs: [r["witness_host_ns"].__setitem__(0, r["witness_host_ns"][0] + 10**9)
                                     for r in recs if r.get("witness_host_ns") and r["op"] == "write"
                                     and r["index"] == 1] and None)


def shorten_writes_into_the_host(by: Callable[[dict[str, Any]], int]
                                 ) -> Callable[[list[dict[str, Any]]], None]:
    """Every write record ``by(rank 0's record)`` ns shorter, its end earlier, and rank 0 claiming
    the time it lost as its own after the op (records' witness_host_ns): rank 0's account of the
    witness's interval still holds."""

    def edit(recs: list[dict[str, Any]]) -> None:
        cut = {r["index"]: by(r) for r in recs if r["op"] == "write" and r["rank"] == 0}
        # the op (its slowest rank) ends cut ns earlier (and a few µs): every rank longer than that is
        # capped there; a rank already shorter (a busy host spreads them) keeps its own times
        longest = {k: max(r["t1_ns"] - r["t0_ns"] for r in recs if r["op"] == "write" and r["index"] == k)
                   for k in cut}
        writes = [r for r in recs if r["op"] == "write"]
        old_last = _host_ends(writes)
        for r in writes:
            old_end, old = r["t1_ns"], r["t1_ns"] - r["t0_ns"]
            # capped ranks end a few µs apart, as no two real ranks end together (RECORDS-COPIES)
            new = min(old, longest[r["index"]] - cut[r["index"]] - 1_013 * (r["rank"] + 1))
            assert new > 0, "the witness's room is longer than the op: nothing to shorten"
            set_duration(r, new)
            scale_requests(r, new / old)  # RECORDS-REQUESTS: recomputed too
            if r["rank"] == 0:  # its end moved earlier by as much: claimed as its own time after it
                r["witness_host_ns"][1] += old_end - r["t1_ns"]
        # each host's last counters move as much earlier as its last end (DEVICE-COUNTERS): on a busy
        # host an uncapped rank, started late, can be the host's last to end
        new_last = _host_ends(writes)
        for r in writes:
            if "host_counters" in r:
                key = (r["index"], r["host"])
                r["host_counters"]["after"]["t_ns"] -= old_last[key] - new_last[key]
    return edit


def _host_ends(recs: list[dict[str, Any]]) -> dict[tuple[int, str], int]:
    """Each (op index, host)'s last end."""
    ends: dict[tuple[int, str], int] = {}
    for r in recs:
        key = (r["index"], r["host"])
        ends[key] = max(ends.get(key, 0), r["t1_ns"])
    return ends


def shrunk_past_the_host_bound(work: Path, runs: dict[str, Any], tmp: Path) -> None:
    """Each write 5 ms shorter than the witness's bound allows, rank 0 claiming the time as its
    own; run.json's verdict the one the rules give (a forger who left it would fail
    RESULT-VERDICT)."""
    room = {a["index"]: a["room_s"] for a in _accounts(work)}
    edit_records(work, shorten_writes_into_the_host(lambda r: int((room[r["index"]] + 0.005) * 1e9)))
    resummarize(work)
    edit_json(work, "run.json", lambda r: r.update(verdict="disturbed"))


def host_times_dropped(work: Path, runs: dict[str, Any], tmp: Path) -> None:
    edit_records(work, lambda recs: [r.pop("witness_host_ns", None) for r in recs] and None)


def another_runs_transcript(work: Path, runs: dict[str, Any], tmp: Path) -> None:
    shutil.copy(runs["b"] / "witness.dsse.json", work / "witness.dsse.json")
    other = read_json(runs["b"], "run.json")["witness"]
    edit_json(work, "run.json", lambda r: r["witness"].update(run=other["run"], nonces=other["nonces"]))


def edited_transcript_time(work: Path, runs: dict[str, Any], tmp: Path) -> None:
    env = json.loads((work / "witness.dsse.json").read_text())
    doc = transcript_doc(work)
    end = next(e for e in doc["entries"] if e["kind"] == "end" and e["op"] == "write")
    end["t_mono_ns"] -= 10_000_000
    env["payload"] = base64.b64encode(json.dumps(doc).encode()).decode()
    (work / "witness.dsse.json").write_text(json.dumps(env))


def rogue_witness(work: Path, runs: dict[str, Any], tmp: Path) -> None:
    """The forger's own witness key (nobody trusts it) re-signs the transcript, named in run.json:
    the signature holds, the key is nobody's."""
    rogue = bundle.generate_key(tmp / "rogue.pem")
    doc = transcript_doc(work)
    doc["witness_keyid"] = rogue.keyid
    env = bundle.make_envelope(doc, bundle.load_private_key(tmp / "rogue.pem"), TRANSCRIPT_TYPE)
    (work / "witness.dsse.json").write_text(json.dumps(env))
    edit_json(work, "run.json", lambda r: r["witness"].update(keyid=rogue.keyid))


def transcript_removed(work: Path, runs: dict[str, Any], tmp: Path) -> None:
    (work / "witness.dsse.json").unlink()


def said_lost(work: Path, runs: dict[str, Any], tmp: Path) -> None:
    edit_json(work, "run.json", lambda r: r["witness"].update(status="lost", reason="forged"))


def nonce_replaced(work: Path, runs: dict[str, Any], tmp: Path) -> None:
    edit_json(work, "run.json",
              lambda r: r["witness"].update(nonces=["00" * 16, r["witness"]["nonces"][1]]))


def an_hour_earlier(work: Path, runs: dict[str, Any], tmp: Path) -> None:
    """Every wall-clock field an hour earlier (records, run.json, summary, statement): coherent,
    but not when the witness's clock saw the run (the monotonic clocks stay)."""

    def earlier(stamp: str) -> str:
        t = datetime.fromisoformat(stamp.replace("Z", "+00:00")) - timedelta(hours=1)
        return t.isoformat(timespec="milliseconds").replace("+00:00", "Z")

    edit_records(work, lambda recs: [r.update(wall_start=r["wall_start"] - 3600) for r in recs] and None)
    edit_json(work, "run.json", lambda r: r.update(started=earlier(r["started"]), ended=earlier(r["ended"])))
    resummarize(work)


# rule -> (edit, a fragment of the finding's message, whether it is the only finding)
FORGERIES: dict[str, list[tuple[Edit, str, bool]]] = {
    "WITNESS-TIMES": [(account_inflated, "more than the witness saw", True),
                      (host_times_dropped, "rank 0's witness_host_ns", True)],
    # disturbed, not invalid: an honest host that stalled looks the same; never a result either
    # a quarter of each write leaves the counters' allowance, which shrinks with the op, short on
    # a busy host as well: COUNTERS-LATE (rules 1.12), disturbed too
    "WITNESS-HOST": [(shrunk_past_the_host_bound, "ms from its end to reporting it", True),
                     (quartered_writes, "the witness's interval longer than the op by at most", False)],
    # another run's intervals are not this run's either (WITNESS-TIMES too)
    "WITNESS-RUN": [(another_runs_transcript, "expected run_id", False)],
    "WITNESS-SIGNATURE": [(edited_transcript_time, "bad signature by key", True)],
    "WITNESS-TRUSTED": [(rogue_witness, "(not a trusted witness)", True)],
    "WITNESS-TRANSCRIPT": [(transcript_removed, "run.json: a run that says it was witnessed", True),
                           (said_lost, "got witness.dsse.json present", True)],
    "WITNESS-EVENTS": [(nonce_replaced, "run.json's witness.nonces", True)],
    "WITNESS-CLOCK": [(an_hour_earlier, "the witness opened", False)],
}
CASES = [(rule, *case) for rule, cases in FORGERIES.items() for case in cases]


def forged_and_checked(source: Path, edit: Edit, runs: dict[str, Any], tmp: Path) -> dict[str, Any]:
    """A copy of ``source`` edited, re-signed with the vendor's trusted key, and checked in a tree."""
    work = tmp / "work" / source.name
    shutil.copytree(source, work)
    edit(work, runs, tmp)
    run_doc = read_json(work, "run.json")
    resign(work, bundle.load_private_key(runs["dir"] / "org.pem"), started=run_doc["started"],
           ended=run_doc["ended"], verdict=run_doc["verdict"])
    [b] = checked(tree(runs, tmp / "t", work))
    return b


@pytest.mark.parametrize(("rule", "edit", "fragment", "alone"), CASES,
                         ids=[f"{c[0]}-{c[1].__name__}" for c in CASES])
def test_a_forged_witnessed_bundle_fails_its_witness_rule(runs: dict[str, Any], tmp_path: Path, rule: str,
                                                          edit: Edit, fragment: str, alone: bool) -> None:
    b = forged_and_checked(runs["a"], edit, runs, tmp_path)
    found = [f for f in b["findings"] if f["rule"] == rule]
    assert found and fragment in found[0]["message"], b["findings"]
    if alone:
        assert rules_of(b) == {rule}, b["findings"]
    if rule == "WITNESS-HOST":
        assert b["verdict"] == "disturbed" and rules_of(b) <= {rule, "COUNTERS-LATE"}, b["findings"]
    else:
        assert b["verdict"] == "invalid" and b["integrity"] == "failed"
    assert not (b.get("witness") or {}).get("counted"), b["witness"]  # never reported as witnessed


def test_the_witness_bounds_each_op_to_what_the_report_says(runs: dict[str, Any], tmp_path: Path) -> None:
    """The report names the ops the witness bounds only loosely and by how much (its unbounded_s).
    A forger who moves part of each write into rank 0's own time after it keeps the witness's
    interval accounted for, and can go as far as the witness's bound and no further: 5 ms past it the
    result is disturbed (FORGERIES: WITNESS-HOST), 5 ms short of it still valid (the bound is the
    bound, not a guess, and within the unbounded_s the report states)."""
    [honest] = checked(tree(runs, tmp_path / "h", runs["a"]))
    loose = {(o["op"], o["index"]): o["unbounded_s"] for o in honest["witness"]["unbounded"]}
    # The tests' ops last ~0.2 s: every one is short beside the witness's ~60 ms it cannot time
    # (more on a busy host: its allowance grows with the host's measured lag, so no upper bound here).
    assert {("write", 1), ("write", 2), ("read", 1), ("read", 2)} <= set(loose), honest["witness"]
    assert all(u > 0.05 for u in loose.values()), loose
    recs = read_records(runs["a"])
    for o in honest["witness"]["unbounded"]:  # the report's op is its slowest rank's, as recorded
        slowest = max(r["t1_ns"] - r["t0_ns"] for r in recs
                      if r["op"] == o["op"] and r["index"] == o["index"])
        assert abs(o["duration_s"] - slowest / 1e9) < 2e-6, (o, slowest)
    for name, extra_ms, valid in (("past", 5, False), ("within", -5, True)):
        work = tmp_path / name / runs["a"].name
        shutil.copytree(runs["a"], work)
        room = {a["index"]: a["room_s"] for a in _accounts(work)}
        assert all(0 < room[k] < loose[("write", k)] for k in room), (room, loose)
        edit_records(work, shorten_writes_into_the_host(
            lambda r, room=room, extra_ms=extra_ms: int((room[r["index"]] + extra_ms / 1e3) * 1e9)))
        resummarize(work)
        edit_json(work, "run.json", lambda r, valid=valid: r.update(verdict="open" if valid else "disturbed"))
        run_doc = read_json(work, "run.json")
        resign(work, bundle.load_private_key(runs["dir"] / "org.pem"), started=run_doc["started"],
               ended=run_doc["ended"], verdict=run_doc["verdict"])
        [b] = checked(tree(runs, tmp_path / f"t-{name}", work))
        assert (b["verdict"] == "open") is valid, (name, b["findings"])
        assert rules_of(b) == (set() if valid else {"WITNESS-HOST"}), b["findings"]


def _accounts(folder: Path) -> list[dict[str, Any]]:
    """Each write's room: how much more of the witness's interval may lie outside the op (the
    bound less what already does)."""
    from mlckpt.rules.checks import witness as wc
    from mlckpt.rules.registry import load_rules

    rs = load_rules("1.10")
    facts = wc.WitnessFacts(read_json(folder, "run.json")["witness"], True, transcript=transcript_doc(folder),
                            run=read_json(folder, "run.json"), records=read_records(folder))
    return [{"index": a.span.index, "room_s": a.bound_s - a.excess_s}
            for a in wc.accounts(facts, rs) if isinstance(a, wc.Account) and a.span.op == "write"]


def test_a_witnessed_bundle_signed_by_another_key_than_its_opener_fails_witness_run(
        runs: dict[str, Any], tmp_path: Path) -> None:
    """Another trusted key re-signs a witnessed bundle (a second organisation presenting the run as
    its own, here a second key of the same one): the transcript says which key opened the run."""
    work = tmp_path / "work" / runs["a"].name
    shutil.copytree(runs["a"], work)
    second = bundle.generate_key(tmp_path / "second.pem")
    resign(work, bundle.load_private_key(tmp_path / "second.pem"))
    root = tree(runs, tmp_path / "t", work)
    (root / "trusted-keys.yaml").write_text(f'mlckpt_trusted_keys: "1.0"\norganizations:\n  {ORG}: '
                                            f'["{runs["org"].public_key}", "{second.public_key}"]\n')
    [b] = checked(root)
    [finding] = [f for f in b["findings"] if f["rule"] == "WITNESS-RUN"]
    assert (f"expected opened by the bundle's signing key {second.keyid}, got opened by the bundle's "
            f"signing key {runs['org'].keyid} in the transcript") in finding["message"], finding
    assert rules_of(b) == {"WITNESS-RUN"} and b["verdict"] == "invalid"
    assert b["witness"]["counted"] is False  # the witness saw another key's run


def test_shrunk_durations_name_the_op_and_the_bounds(runs: dict[str, Any], tmp_path: Path) -> None:
    work = tmp_path / "work" / runs["a"].name
    shutil.copytree(runs["a"], work)
    cut = shrunk_writes(work, runs, tmp_path)
    resign(work, bundle.load_private_key(runs["dir"] / "org.pem"))
    [b] = checked(tree(runs, tmp_path / "t", work))
    msgs = [f["message"] for f in b["findings"] if f["rule"] == "WITNESS-HOST"]
    # every write cut past its bound is named, and only those (never a restore)
    assert {int(m.group(1)) for m in (re.search(r"expected write (\d):", x) for x in msgs) if m} == set(cut)
    for msg in msgs:
        assert re.search(r"records\.jsonl: .*expected write [12]: the witness's interval longer than the op "
                         r"by at most [0-9]+ ms, got [0-9]+ ms longer \(rank 0: [0-9]+ ms from the witness's "
                         r"answer to its start, [0-9]+ ms from its end to reporting it; [0-9]+ ms in "
                         r"transit, the witness's own lag [0-9]+ ms; an op of [0-9.]+ s\)", msg), msg
    # The same surgery on the unwitnessed run: nothing but a witness could have said it.
    plain = tmp_path / "plain" / runs["plain"].name
    shutil.copytree(runs["plain"], plain)
    shrunk_writes(plain, runs, tmp_path)
    resign(plain, bundle.load_private_key(runs["dir"] / "org.pem"))
    [p] = checked(tree(runs, tmp_path / "tp", plain))
    assert not {r for r in rules_of(p) if r.startswith("WITNESS-")}


# ------------------------------------------------------------------------------- witness faults


def test_a_witness_restarted_mid_run_loses_nothing_and_the_run_stays_witnessed(tmp_path: Path,
                                                                               runs: dict[str, Any]) -> None:
    """The witness is killed (SIGKILL) while the run trains between checkpoints and started again
    on the same port and journal: the runner's next report waits for it (within witness.timeout_s),
    the journal holds every acknowledged event once, and the bundle is witnessed and passes."""
    d = runs["dir"]
    (tmp_path / "w").mkdir()
    w = Witness(tmp_path / "w", org_key=d / "org.pem")
    w.start()
    port = int(w.url.rsplit(":", 1)[1])
    try:
        proc, lines = started(d, "write 1/3", f"witness.url={w.url}", "witness.timeout_s=20",
                              "checkpoint.num_writes=3", "checkpoint.compute_interval_s=1.5")
        before = len(w.lines())
        w.kill()
        time.sleep(0.5)
        w.start(port)
        out, err = proc.communicate(timeout=240)
        lines.append(out)
        assert proc.returncode == 0, err
        assert "failed at" not in "".join(lines) and "will not be witnessed" not in "".join(lines)
    finally:
        w.stop()
    entries = w.lines()
    assert before >= 3 and len(entries) > before
    seqs = [e["seq"] for e in entries]
    assert seqs == list(range(1, len(entries) + 1))  # nothing lost, nothing twice
    folder = printed_bundle(subprocess.CompletedProcess([], 0, "".join(lines), ""))
    assert read_json(folder, "run.json")["witness"]["status"] == "witnessed"
    [b] = checked(tree(runs, tmp_path / "t", folder, witness=w))
    # (the witness's rules only: the evidence rules' bounds are exercised elsewhere, and this run
    # trains between checkpoints on a loaded 2-core machine)
    assert not {r for r in rules_of(b) if r.startswith("WITNESS-")}, b["findings"]
    assert b["witness"]["counted"] is True, b["findings"]


def test_a_witness_that_stops_answering_does_not_hang_the_run(tmp_path: Path, runs: dict[str, Any]) -> None:
    """SIGSTOP after the open: the next report times out (witness.timeout_s=1), the run says so
    once and goes on unwitnessed; its bundle passes, not counted as witnessed."""
    d = runs["dir"]
    (tmp_path / "w").mkdir()
    w = Witness(tmp_path / "w", org_key=d / "org.pem")
    w.start()
    assert w.proc is not None
    try:
        proc, lines = started(d, "write 1/2", f"witness.url={w.url}", "witness.timeout_s=1",
                              "checkpoint.compute_interval_s=1")
        os.kill(w.proc.pid, signal.SIGSTOP)
        t0 = time.monotonic()
        out, err = proc.communicate(timeout=120)
        took = time.monotonic() - t0
        os.kill(w.proc.pid, signal.SIGCONT)
    finally:
        w.stop()
    text = "".join(lines) + out
    assert proc.returncode == 0, err
    assert text.count("will not be witnessed") == 1
    assert took < 15, took  # one timeout of 1 s, then the rest of the run at its own pace
    folder = printed_bundle(subprocess.CompletedProcess([], 0, text, ""))
    claim = read_json(folder, "run.json")["witness"]
    assert claim["status"] == "lost" and claim["transcript"] is None and "write 2 start" in claim["reason"]
    assert not (folder / "witness.dsse.json").exists()
    [b] = checked(tree(runs, tmp_path / "t", folder))
    assert not b["findings"] and b["witness"]["counted"] is False


def test_a_witness_that_never_answers_refuses_the_run_in_bounded_time(tmp_path: Path,
                                                                      runs: dict[str, Any]) -> None:
    """A listener that accepts connections and never answers: the open times out after
    witness.timeout_s; one line, exit 2, nothing written."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    stop = threading.Event()
    held: list[socket.socket] = []

    def accept() -> None:
        sock.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(sock.accept()[0])
            except OSError:
                pass

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    cwd = tmp_path / "c"
    cwd.mkdir()
    shutil.copy(runs["dir"] / f"{SYSTEM}.yaml", cwd)
    shutil.copy(runs["dir"] / "org.pem", cwd)
    try:
        t0 = time.monotonic()
        proc = subprocess.run([str(MLCKPT), "run", *RUN, f"signing.key={cwd / 'org.pem'}",
                               f"witness.url=http://127.0.0.1:{sock.getsockname()[1]}",
                               "witness.timeout_s=2"],
                              cwd=cwd, env=cli_env(), text=True, capture_output=True, timeout=120)
        took = time.monotonic() - t0
    finally:
        stop.set()
        t.join()
        for c in held:
            c.close()
        sock.close()
    assert proc.returncode == 2, proc.stderr
    [line] = [ln for ln in proc.stderr.splitlines() if ln.startswith("mlckpt: error:")]
    assert line.startswith("mlckpt: error: witness.url: cannot open a witnessed run at http://127.0.0.1:")
    assert "timed out" in line and took < 30
    assert not (cwd / "results").exists() or not any((cwd / "results").iterdir())
    assert not (cwd / "mlckpt-checkpoints").exists() or not any((cwd / "mlckpt-checkpoints").iterdir())


def test_a_witnessed_run_beside_a_flood_of_strangers_passes_the_checker(tmp_path: Path,
                                                                         runs: dict[str, Any]) -> None:
    """Strangers post unsigned opens as fast as the witness refuses them while a run, which expects
    the witness's own key, is witnessed: the run completes, witnessed, and passes the checker; the
    flood left nothing in the journal."""
    import http.client

    w, d = runs["witness"], runs["dir"]
    files = len(w.files())
    host, port = w.url.removeprefix("http://").split(":")
    stop, refused = threading.Event(), []

    def flood() -> None:
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        n = 0
        while not stop.is_set():
            conn.request("POST", "/v1/runs", body=b'{"plan_digest": "00", "config": {}}')
            resp = conn.getresponse()
            resp.read()
            assert resp.status == 401
            n += 1
        refused.append(n)

    flooders = [threading.Thread(target=flood) for _ in range(2)]
    for t in flooders:
        t.start()
    try:
        proc = run(d, f"witness.url={w.url}", f"witness.public_key={w.public_key}")
    finally:
        stop.set()
        for t in flooders:
            t.join(30)
    assert proc.returncode == 0, (proc.stderr, findings(proc.stdout))
    assert len(refused) == 2 and sum(refused) > 100, refused
    folder = printed_bundle(proc)
    assert transcript_doc(folder)["entries"][0]["opened_by"] == runs["org"].keyid
    [b] = checked(tree(runs, tmp_path / "t", folder))
    assert not {r for r in rules_of(b) if r.startswith("WITNESS-")}, b["findings"]
    assert b["witness"]["counted"] is True
    tries = 1 + proc.stdout.count("running it again in")  # a busy host: disturbed tries retried
    assert len(w.files()) == files + tries  # each try's own archive, nothing of the flood


@pytest.mark.parametrize("setting, says", [
    ("signing.key=none", "witness.url: a witness opens a run only for a key it trusts, and signing.key=none "
                         "signs nothing: give signing.key (auto, or a key path)"),
    ("witness.public_key=OTHER", "not the expected ed25519:"),
    ("signing.key=STRANGER", "is not in this witness's trusted keys"),
    ("rules_version=1.9", "witness.url: this runner's witness transcripts of a checkpoint run are witness "
                          "format 2, which rules_version 1.9 cannot check: use rules 1.10 or later"),
])
def test_a_witness_that_will_not_witness_this_run_refuses_it_before_any_io(
        setting: str, says: str, tmp_path: Path, runs: dict[str, Any]) -> None:
    cwd = tmp_path / "c"
    cwd.mkdir()
    shutil.copy(runs["dir"] / f"{SYSTEM}.yaml", cwd)
    if "OTHER" in setting:
        setting = setting.replace("OTHER", bundle.generate_key(cwd / "other.pem").public_key)
    if "STRANGER" in setting:
        bundle.generate_key(cwd / "stranger.pem")
        setting = setting.replace("STRANGER", str(cwd / "stranger.pem"))
    files = runs["witness"].files()
    key = [] if setting.startswith("signing.key=") else [f"signing.key={runs['dir'] / 'org.pem'}"]
    proc = subprocess.run([str(MLCKPT), "run", *RUN, *key, f"witness.url={runs['witness'].url}", setting],
                          cwd=cwd, env=cli_env(), text=True, capture_output=True, timeout=120)
    [line] = [ln for ln in proc.stderr.splitlines() if ln.startswith("mlckpt: error:")]
    assert proc.returncode == 2 and says in line, proc.stderr
    assert not (cwd / "results").exists() or not any((cwd / "results").iterdir())
    assert not (cwd / "mlckpt-checkpoints").exists() or not any((cwd / "mlckpt-checkpoints").iterdir())
    assert runs["witness"].files() == files  # the witness stored nothing


def test_a_witnessed_asynchronous_run_is_refused_before_any_io(tmp_path: Path, runs: dict[str, Any]) -> None:
    cwd = tmp_path / "c"
    cwd.mkdir()
    shutil.copy(runs["dir"] / f"{SYSTEM}.yaml", cwd)
    proc = subprocess.run([str(MLCKPT), "run", *RUN, "signing.key=none", "checkpoint.mode=async",
                           f"witness.url={runs['witness'].url}"],
                          cwd=cwd, env=cli_env(), text=True, capture_output=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "[WITNESS-MODE]" in proc.stderr
    assert "expected checkpoint.mode=sync with no fast tier" in proc.stderr
    assert not (cwd / "results").exists()


# ------------------------------------------------------------------------------ serving runs
SERVING = ("workload=llama3_8b", "division=open", "scale=0.002", "ranks=4", "serving.tp=2", "serving.loads=2",
           "serving.strategy=direct", "checkpoint.folder=ck", f"system={SYSTEM}.yaml", "output.root=results")


def serve(d: Path, cwd: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    cwd.mkdir(exist_ok=True)
    shutil.copy(d / f"{SYSTEM}.yaml", cwd)
    return subprocess.run([str(MLCKPT), "run", *SERVING, f"signing.key={d / 'org.pem'}", *extra], cwd=cwd,
                          env={**cli_env(), "XDG_CONFIG_HOME": str(d / "xdg"), "MLCKPT_RETRY_DISTURBED": "5"},
                          text=True, capture_output=True, timeout=400, check=False)


@pytest.fixture(scope="module")
def served(runs: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A serving run (2 replicas of TP 2, direct, 2 loads) witnessed by the tests' witness."""
    proc = serve(runs["dir"], tmp_path_factory.mktemp("served"), f"witness.url={runs['witness'].url}")
    assert proc.returncode == 0, (proc.stderr, findings(proc.stdout))
    return printed_bundle(proc)


def test_a_witnessed_serving_run_reports_each_load_and_passes(runs: dict[str, Any], served: Path,
                                                              tmp_path: Path) -> None:
    doc, recs = transcript_doc(served), read_records(served)
    assert doc["witness_format"] == 3 and read_json(served, "run.json")["records_format"] == 14
    assert [(e["kind"], e["op"], e["index"]) for e in doc["entries"] if e["kind"] in ("start", "end")] == [
        (k, "load", i) for i in (0, 1) for k in ("start", "end")]
    # rank 0 accounts for its own time around each witnessed load, as around a checkpoint op
    assert [len(r["witness_host_ns"]) for r in recs if r["rank"] == 0] == [2, 2]
    assert not any("witness_host_ns" in r for r in recs if r["rank"] != 0)
    [b] = checked(tree(runs, tmp_path / "t", served))
    assert b["verdict"] == "open" and not b["findings"], b["findings"]
    w = b["witness"]
    assert w["counted"] is True and w["by"] == "committee"
    judged = {f["rule"] for f in b["findings"]} | {n["rule"] for n in b["not_checked"]}
    assert not judged & {"WITNESS-TIMES", "WITNESS-EVENTS", "WITNESS-RUN", "WITNESS-CLOCK", "WITNESS-HOST"}
    # the witness-conservative rate: the loads' bytes over the witness's own intervals, never faster
    assert 0 < w["load_bandwidth_witnessed_mean_gib_s"]


def load_account_inflated(work: Path, runs: dict[str, Any], tmp: Path) -> None:
    """Rank 0 says it spent a second before its first load that the witness never saw."""
    edit_records(work, lambda recs: [r["witness_host_ns"].__setitem__(0, r["witness_host_ns"][0] + 10**9)
                                     for r in recs if r.get("witness_host_ns") and r["index"] == 0] and None)


def checkpoint_transcript(work: Path, runs: dict[str, Any], tmp: Path) -> None:
    """A witnessed checkpoint run's transcript put in the serving bundle, run.json naming its run."""
    shutil.copy(runs["a"] / "witness.dsse.json", work / "witness.dsse.json")
    other = read_json(runs["a"], "run.json")["witness"]
    edit_json(work, "run.json", lambda r: r["witness"].update(run=other["run"], nonces=other["nonces"]))


def load_dropped(work: Path, runs: dict[str, Any], tmp: Path) -> None:
    """The slower of the two loads dropped, the run claiming one load: a faster median."""
    recs = read_records(work)
    slow = max((0, 1), key=lambda i: max(r["t1_ns"] - r["t0_ns"] for r in recs if r["index"] == i))
    edit_records(work, lambda recs: recs.__setitem__(slice(None), [
        {**r, "index": 0} for r in recs if r["index"] != slow]))
    edit_yaml(work, "config.yaml", lambda c: c["serving"].update(loads=1))
    edit_json(work, "run.json", lambda r: r["serving"].update(loads=1))
    resummarize(work)


@pytest.mark.parametrize(("edit", "rule", "fragment"), [
    (load_account_inflated, "WITNESS-TIMES", "more than the witness saw"),
    (checkpoint_transcript, "WITNESS-EVENTS", "start load 0"),
    (load_dropped, "WITNESS-EVENTS", "2 op events"),
], ids=["account_inflated", "checkpoint_transcript", "load_dropped"])
def test_a_forged_witnessed_serving_bundle_fails_its_witness_rule(runs: dict[str, Any], served: Path,
                                                                  tmp_path: Path, edit: Edit, rule: str,
                                                                  fragment: str) -> None:
    b = forged_and_checked(served, edit, runs, tmp_path)
    found = [f for f in b["findings"] if f["rule"] == rule]
    assert found and fragment in found[0]["message"], b["findings"]
    assert b["verdict"] == "invalid" and not (b.get("witness") or {}).get("counted")


def test_a_witnessed_serving_run_under_rules_before_1_16_is_refused_before_any_io(
        runs: dict[str, Any], tmp_path: Path) -> None:
    proc = serve(runs["dir"], tmp_path / "c", f"witness.url={runs['witness'].url}", "rules_version=1.15")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].endswith(
        "witness.url: this runner's witness transcripts of a serving run are witness format 3, which "
        "rules_version 1.15 cannot check: use rules 1.16 or later"), proc.stderr
    assert not (tmp_path / "c" / "results").exists() and not (tmp_path / "c" / "ck").exists()


# ------------------------------------------------------------------------- leaderboard, compare


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(MLCKPT.parent / "mlckpt-check"), *args], env=cli_env(), text=True,
                          capture_output=True, timeout=120)


def test_the_leaderboard_marks_witnessed_results_and_can_list_only_them(runs: dict[str, Any],
                                                                        tmp_path: Path) -> None:
    root = tree(runs, tmp_path / "t", runs["a"], runs["plain"])
    proc = cli("leaderboard", str(root), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    rows = {r["result_id"]: r for t in json.loads(proc.stdout)["classes"] for r in t["rows"]}
    marks = sorted(r["verification"] for r in rows.values())
    assert len(marks) == 2 and marks[0] == "verified, cold"
    assert re.fullmatch(r"verified, cold; witnessed by committee \(write ≥ [0-9.]+, read ≥ [0-9.]+ GiB/s\)",
                        marks[1]), marks
    only = cli("leaderboard", str(root), "--witnessed-only", "--format", "md")
    assert only.returncode == 0, only.stderr
    assert only.stdout.count("witnessed by committee (write ≥") == 1
    assert f"`open/{ORG}/results/{SYSTEM}/llama3_8b/{runs['plain'].name}`: not witnessed" in only.stdout
    assert "leaderboard: 1 result in 1 class; 1 bundle excluded" in only.stderr
    (root / "trusted-witnesses.yaml").unlink()
    refused = cli("leaderboard", str(root), "--witnessed-only")
    assert refused.returncode == 2
    assert refused.stderr.startswith("mlckpt-check: error: --witnessed-only: no trusted")


def test_compare_says_who_witnessed_each_side(runs: dict[str, Any], tmp_path: Path) -> None:
    tw = tree(runs, tmp_path / "t") / "trusted-witnesses.yaml"
    proc = cli("compare", str(runs["a"]), str(runs["plain"]), "--trusted-witnesses", str(tw))
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"note: A witnessed by committee \(a trusted witness\): write ≥ [0-9.]+ GiB/s, "
                     r"read ≥ [0-9.]+ GiB/s by the witness's clock", proc.stdout), proc.stdout
    assert "note: B" not in proc.stdout  # not witnessed: nothing to say
    js = json.loads(cli("compare", str(runs["a"]), str(runs["plain"]), "--json").stdout)
    assert js["a"]["witness"]["transcript"] == "signature holds" and js["a"]["witness"]["by"] is None
    assert js["b"]["witness"] is None


# ------------------------------------------------------------------------------ hostile transcripts

_entry = st.fixed_dictionaries(
    {"seq": st.integers(-2, 10), "t_wall_ns": st.integers(-5, 2**63 - 1), "t_mono_ns": st.integers(-5, 2**64),
     "kind": st.sampled_from(["open", "start", "end", "rtt", "close", "oops"]),
     "prev": st.sampled_from(["0" * 64, "x"])},
    optional={"op": st.sampled_from(["write", "read", 3]), "index": st.integers(-1, 4),
              "nonce": st.sampled_from(["0f" * 16, "zz"]), "rtt_ns": st.integers(-1, 10**12),
              "start_service_ns": st.integers(0, 10**12), "plan_digest": st.sampled_from(["ab" * 32]),
              "config": st.dictionaries(st.sampled_from(["run_id", "name"]), st.text(max_size=20))})


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(entries=st.lists(_entry, max_size=12), run_id=st.sampled_from(["00" * 8, "zz"]),
       keep_claim=st.booleans())
def test_a_hostile_transcript_never_breaks_the_checker(runs: dict[str, Any], entries: list[Any], run_id: str,
                                                       keep_claim: bool) -> None:
    """Any transcript a witness key (here the trusted one: the worst case) might sign: findings
    under the WITNESS-* rules or none, never a checker fault."""
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        work = tmp / "work" / runs["a"].name
        shutil.copytree(runs["a"], work)
        doc = {"_type": "mlckpt-witness-transcript", "witness_format": 1, "run": run_id,
               "witness_keyid": runs["witness"].keyid, "entries": entries}
        key = bundle.load_private_key(runs["witness"].key)
        (work / "witness.dsse.json").write_text(json.dumps(bundle.make_envelope(doc, key, TRANSCRIPT_TYPE)))
        if not keep_claim:
            edit_json(work, "run.json", lambda r: r["witness"].update(nonces=[]))
        resign(work, bundle.load_private_key(runs["dir"] / "org.pem"))
        [b] = checked(tree(runs, tmp / "t", work))
    assert b["verdict"] != "internal-error" and "INTERNAL" not in rules_of(b), b["findings"]
    assert rules_of(b) <= {"WITNESS-SIGNATURE", "WITNESS-RUN", "WITNESS-EVENTS", "WITNESS-TIMES",
                           "WITNESS-CLOCK", "WITNESS-TRANSCRIPT"}, b["findings"]
    assert rules_of(b), "a transcript that is not the run's never passes"


def test_a_read_only_invocation_restores_a_witnessed_write_invocation(runs: dict[str, Any],
                                                                     tmp_path: Path) -> None:
    """The write invocation witnessed (its pages carry its nonces); the read-only invocation
    verifies every page against the tags run.json's witness.nonces give, unwitnessed or witnessed itself."""
    d = runs["dir"]
    base = ("checkpoint.folder=split-ck",)
    w = run(d, *base, "checkpoint.num_reads=0", "checkpoint.keep=true", f"witness.url={runs['witness'].url}")
    assert w.returncode == 0, w.stderr
    written = printed_bundle(w)
    assert all(read_json(written, "run.json")["witness"]["nonces"])
    r = run(d, *base, "checkpoint.num_writes=0", "checkpoint.num_reads=2",
            f"checkpoint.restore_from={written}", f"witness.url={runs['witness'].url}")
    assert r.returncode == 0, r.stderr
    reads = [x for x in read_records(printed_bundle(r)) if x["op"] == "read"]
    assert reads and all(x["verified_bytes"] == x["bytes"] for x in reads)
    claim = read_json(printed_bundle(r), "run.json")["witness"]
    assert claim["status"] == "witnessed" and claim["nonces"] == []
    both = checked(tree(runs, tmp_path / "t", written, printed_bundle(r)))
    assert [b["findings"] for b in both] == [[], []]
    assert all(b["witness"]["counted"] for b in both)


@pytest.mark.parametrize(("text", "fragment"), [
    ('witnesses:\n  a: ["nope"]\n', "'mlckpt_trusted_witnesses' is a required property"),
    ('committee: ["x"]\n', "witnesses go under witnesses:, next to mlckpt_trusted_witnesses: '1.0'"),
    ('mlckpt_trusted_witnesses: "1.0"\nwitnesses:\n  a: ["ed25519:short"]\n',
     "witnesses.a.0: 'ed25519:short'"),
])
def test_a_bad_trusted_witnesses_file_is_one_line_exit_2(runs: dict[str, Any], tmp_path: Path, text: str,
                                                         fragment: str) -> None:
    root = tree(runs, tmp_path / "t", runs["a"], trusted_witness=None)
    (root / "trusted-witnesses.yaml").write_text(text)
    proc = cli(str(root))
    [line] = proc.stderr.splitlines()
    assert proc.returncode == 2 and line.startswith("mlckpt-check: error: ") and fragment in line, line


@pytest.mark.parametrize("url", ["ftp://witness:8470", "http://user:secret@witness:8470", "witness:8470"])
def test_a_witness_url_that_is_not_plain_http_is_refused_before_anything_runs(url: str,
                                                                             tmp_path: Path) -> None:
    proc = subprocess.run([str(MLCKPT), "run", *RUN, "signing.key=none", f"witness.url={url}"], cwd=tmp_path,
                          env=cli_env(), text=True, capture_output=True, timeout=60)
    [line] = [ln for ln in proc.stderr.splitlines() if ln.startswith("mlckpt: error:")]
    assert proc.returncode == 2 and line.startswith("mlckpt: error: witness.url: "), proc.stderr
    assert not (tmp_path / "mlckpt-checkpoints").exists()
