"""The structural fuzzer (benchmarks/lab/structural.py), a short seeded run: signed hostile bundles made
from real ones, each judged without a checker fault and within the budget.  The long run is
benchmarks/fuzz_checker.py.  Also the two bounds that keep a hostile bundle's check short: the
records a configuration can produce, and the per-bundle time budget."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml
from lab import structural
from support.cli import CHECKER_ORG, CHECKER_SYSTEM
from support.trees import tree_of

from checker import forked
from checker.tree_check import check_tree
from mlckpt import bundle

CHECK = Path(sys.executable).parent / "mlckpt-check"
CASES = 48
BUDGET_S = 20.0


@pytest.mark.parametrize("seed", [1, 2])
def test_signed_hostile_bundles_are_judged_never_a_fault(honest_bundles: dict[str, Path], tmp_path: Path,
                                                         seed: int) -> None:
    rng = random.Random(seed)
    key = bundle.load_private_key(honest_bundles["dir"] / "keys" / "org.pem")
    trusted = bundle.TrustedKeys.load(honest_bundles["dir"] / "trusted-keys.yaml")
    description = (honest_bundles["dir"] / "laptop-ext4.yaml").read_bytes()
    outcomes = []
    kinds = [k for k in ("llama3_8b", "llama_7b", "async_tiers", "serving", "framework")
             if k in honest_bundles]  # "framework" where PyTorch is installed
    for i in range(CASES // 2):
        source = honest_bundles[rng.choice(kinds)]
        root = tmp_path / f"case{i}"
        folder = structural.fresh_case(source, root, CHECKER_ORG, CHECKER_SYSTEM, description)
        what = structural.mutate(rng, folder, key)
        outcomes.append(structural.check_case(root, trusted, BUDGET_S, what))
        structural.shutil.rmtree(root, ignore_errors=True)
    bad = [(o.what, o.problem) for o in outcomes if o.problem]
    assert not bad, bad
    # The mutations reach past integrity into the rules: not every case stops at the schema.
    verdicts = Counter(o.verdict for o in outcomes)
    deep = [o for o in outcomes if o.rules - {"BUNDLE-SCHEMA", "BUNDLE-FILES", "BUNDLE-SIGNATURE",
                                              "BUNDLE-PATHS", "BUNDLE-LAYOUT"}]
    assert verdicts["invalid"] + verdicts["integrity-failure"] > 0, verdicts
    assert deep, [(o.what, sorted(o.rules)) for o in outcomes]


def test_records_beyond_what_the_configuration_makes_are_refused_before_parsing(
        honest_bundles: dict[str, Path], tmp_path: Path) -> None:
    """60,000 copies of one record in a 4-rank, 1-write, 1-restore run: one schema finding naming
    the bound, found without parsing a line (well under a second)."""
    key = bundle.load_private_key(honest_bundles["dir"] / "keys" / "org.pem")
    source = honest_bundles["llama3_8b"]
    folder = structural.fresh_case(source, tmp_path / "t", CHECKER_ORG, CHECKER_SYSTEM,
                                   (honest_bundles["dir"] / "laptop-ext4.yaml").read_bytes())
    line = (folder / "records.jsonl").read_text().splitlines()[0]
    (folder / "records.jsonl").write_text((line + "\n") * 60000)
    bundle.sign_bundle(folder, key, bundle.read_envelope_predicate(folder))
    trusted = bundle.TrustedKeys.load(honest_bundles["dir"] / "trusted-keys.yaml")
    out = structural.check_case(tmp_path / "t", trusted, BUDGET_S, "60,000 records")
    assert out.problem is None and out.verdict == "invalid" and out.rules == {"BUNDLE-SCHEMA"}, out
    assert out.seconds < 2.0, out
    report = check_tree(tmp_path / "t", trusted)
    [f] = report["findings"]
    assert f["message"].endswith("expected at most 1,040 records (twice the ranks × (num_writes + "
                                 "num_reads) of config.yaml, plus 1,024: a bound on the checker's work, not "
                                 "the count the rules hold the records to), got 60,000 lines"), f


@pytest.mark.parametrize(("source", "strategy", "said"), [
    ("serving", None,
     "record 1: op 'load' in a checkpoint run (config.yaml gives no serving strategy and no resume)"),
    ("llama3_8b", "fanout", "record 1: op 'write' in a serving run (config.yaml gives a serving strategy)"),
])
def test_records_of_another_kind_of_run_are_a_schema_finding(honest_bundles: dict[str, Path], tmp_path: Path,
                                                             source: str, strategy: str | None,
                                                             said: str) -> None:
    """Found by the fuzzer: a serving bundle whose configuration lost serving.strategy is a
    checkpoint run's configuration over load records (the record schema takes either kind), which
    the checkpoint rules read as ops (a checker fault).  Now one schema finding, as is the reverse."""
    key = bundle.load_private_key(honest_bundles["dir"] / "keys" / "org.pem")
    folder = structural.fresh_case(honest_bundles[source], tmp_path / "t", CHECKER_ORG, CHECKER_SYSTEM,
                                   (honest_bundles["dir"] / "laptop-ext4.yaml").read_bytes())
    config = yaml.safe_load((folder / "config.yaml").read_text())
    config["serving"]["strategy"] = strategy
    (folder / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    bundle.sign_bundle(folder, key, bundle.read_envelope_predicate(folder))
    trusted = bundle.TrustedKeys.load(honest_bundles["dir"] / "trusted-keys.yaml")
    out = structural.check_case(tmp_path / "t", trusted, BUDGET_S, "another kind")
    assert out.problem is None and out.verdict == "invalid" and out.rules == {"BUNDLE-SCHEMA"}, out
    [f] = check_tree(tmp_path / "t", trusted)["bundles"][0]["findings"]
    assert f["actual"] == said, f


@pytest.mark.parametrize(("key", "value"), [("scale", {"k": 1}), ("ranks", "four")])
def test_a_serving_configuration_retyped_where_the_structural_rules_look_is_judged(
        honest_bundles: dict[str, Path], tmp_path: Path, key: str, value: object) -> None:
    """Found by benchmarks/fuzz_checker.py (seed 13): a serving bundle's scale retyped to a mapping.
    The structural rules judge a configuration that fails its schema only at ranks, scale or
    counts; SERVING-SCOPE, one of them, read the scale as a number (a checker fault)."""
    key_ = bundle.load_private_key(honest_bundles["dir"] / "keys" / "org.pem")
    folder = structural.fresh_case(honest_bundles["serving"], tmp_path / "t", CHECKER_ORG, CHECKER_SYSTEM,
                                   (honest_bundles["dir"] / "laptop-ext4.yaml").read_bytes())
    config = yaml.safe_load((folder / "config.yaml").read_text())
    config[key] = value
    (folder / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    bundle.sign_bundle(folder, key_, bundle.read_envelope_predicate(folder))
    trusted = bundle.TrustedKeys.load(honest_bundles["dir"] / "trusted-keys.yaml")
    out = structural.check_case(tmp_path / "t", trusted, BUDGET_S, f"retype config.yaml:{key}")
    assert out.problem is None and out.verdict == "invalid" and "BUNDLE-SCHEMA" in out.rules, out


def test_a_library_record_without_its_writer_is_judged(honest_bundles: dict[str, Path],
                                                       tmp_path: Path) -> None:
    """Found by benchmarks/fuzz_checker.py once it drew framework bundles (seed 7, case 354): a
    library op's record without ``writer`` (optional in the schema: records before format 8 have
    none) made the summary's recomputation fault.  Such a record is the engine's, as the schema's
    history says; the recomputed summary then differs from the one signed."""
    if "framework" not in honest_bundles:
        pytest.skip("PyTorch is not installed here: no framework bundle to edit")
    key = bundle.load_private_key(honest_bundles["dir"] / "keys" / "org.pem")
    folder = structural.fresh_case(honest_bundles["framework"], tmp_path / "t", CHECKER_ORG, CHECKER_SYSTEM,
                                   (honest_bundles["dir"] / "laptop-ext4.yaml").read_bytes())
    lines = [json.loads(ln) for ln in (folder / "records.jsonl").read_text().splitlines()]
    assert {r["writer"] for r in lines} == {"torch_dcp"}, lines[0]
    del lines[1]["writer"]
    (folder / "records.jsonl").write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in lines))
    bundle.sign_bundle(folder, key, bundle.read_envelope_predicate(folder))
    trusted = bundle.TrustedKeys.load(honest_bundles["dir"] / "trusted-keys.yaml")
    out = structural.check_case(tmp_path / "t", trusted, BUDGET_S, "drop records.jsonl:2.writer")
    assert out.problem is None and out.verdict == "invalid", out
    assert "SUMMARY-EXACT" in out.rules, out


def test_a_bundle_past_the_budget_is_stopped_and_the_others_are_judged(honest_bundles: dict[str, Path],
                                                                       tmp_path: Path) -> None:
    """With a budget no check can meet, each bundle stops after its first stage with a finding
    that names the budget; the report is whole and the exit status is the findings', not a
    fault's.  --bundle-budget refuses what is not a positive number of seconds."""
    root = tmp_path / "t"
    description = (honest_bundles["dir"] / "laptop-ext4.yaml").read_bytes()
    for name in ("llama3_8b", "llama_7b"):
        structural.fresh_case(honest_bundles[name], tmp_path / name, CHECKER_ORG, CHECKER_SYSTEM, description)
        src = next((tmp_path / name / "open" / CHECKER_ORG / "results").rglob("run.json")).parent
        dest = root / src.relative_to(tmp_path / name)
        structural.shutil.copytree(src, dest)
    (root / "open" / CHECKER_ORG / "systems").mkdir(parents=True)
    (root / "open" / CHECKER_ORG / "systems" / f"{CHECKER_SYSTEM}.yaml").write_bytes(description)
    (root / "trusted-keys.yaml").write_bytes((honest_bundles["dir"] / "trusted-keys.yaml").read_bytes())
    proc = subprocess.run([str(CHECK), str(root), "--bundle-budget", "1e-9", "--json",
                           str(tmp_path / "r.json")], capture_output=True, text=True, timeout=120,
                          check=False)
    report = json.loads((tmp_path / "r.json").read_text())
    assert proc.returncode == 1 and len(report["bundles"]) == 2, proc.stdout
    for b in report["bundles"]:
        assert b["verdict"] == "invalid", b
        [f] = b["findings"]
        assert f["rule"] == "BUNDLE-SCHEMA" and f["message"].startswith("bundle: ") and (
            "expected a bundle the checker judges within its budget of 1e-09 s (mlckpt-check "
            "--bundle-budget), got still in stage layout after ") in f["message"], f
    for bad in ("0", "-1", "nan", "inf"):
        proc = subprocess.run([str(CHECK), str(root), "--bundle-budget", bad], capture_output=True, text=True,
                              timeout=60, check=False)
        assert proc.returncode == 2 and proc.stderr.strip().endswith(
            f"--bundle-budget: a positive number of seconds, got {float(bad)}"), proc.stderr


def test_the_checker_holds_no_more_records_than_its_bound(honest_bundles: dict[str, Path],
                                                          tmp_path: Path) -> None:
    """--max-records is the checker's own bound on the records of one bundle it holds in memory,
    whatever the configuration's counts allow: a bundle over it is refused before a line is parsed,
    one at it is judged, and the flag refuses what is not a positive count."""
    root = tree_of(honest_bundles, tmp_path / "t", honest_bundles["llama3_8b"])
    [leaf] = list(root.rglob("records.jsonl"))
    lines = len(leaf.read_bytes().splitlines())
    assert lines == 8  # 4 ranks, 1 write and 1 restore
    keys = honest_bundles["dir"] / "trusted-keys.yaml"
    for bound, refused in ((lines - 1, True), (lines, False)):
        proc = subprocess.run([str(CHECK), str(root), "--max-records", str(bound), "--json",
                               str(tmp_path / "r.json"), "--trusted-keys", str(keys)],
                              capture_output=True, text=True, timeout=120, check=False)
        [b] = json.loads((tmp_path / "r.json").read_text())["bundles"]
        found = [f["message"] for f in b["findings"] if f["rule"] == "BUNDLE-SCHEMA"]
        if refused:
            [message] = found
            assert proc.returncode == 1 and message.startswith("records.jsonl: ") and message.endswith(
                f"expected at most {bound:,} records (mlckpt-check --max-records: the records of one bundle "
                f"this checker holds in memory), got {lines:,} lines"), b["findings"]
        else:
            assert found == [] and b["verdict"] in ("open", "disturbed"), b["findings"]
    for bad in ("0", "-3"):
        proc = subprocess.run([str(CHECK), str(root), "--max-records", bad, "--trusted-keys", str(keys)],
                              capture_output=True, text=True, timeout=60, check=False)
        assert proc.returncode == 2 and proc.stderr.strip().endswith(
            f"--max-records: at least 1, got {bad}"), proc.stderr


def _swapped_with_records(honest_bundles: dict[str, Path], tmp_path: Path, copies: int) -> bundle.TrustedKeys:
    """config.yaml swapped with summary.json (so the configuration gives no counts) and one record
    repeated ``copies`` times, re-signed: the trusted keys to check it with."""
    key = bundle.load_private_key(honest_bundles["dir"] / "keys" / "org.pem")
    folder = structural.fresh_case(honest_bundles["llama3_8b"], tmp_path / "t", CHECKER_ORG, CHECKER_SYSTEM,
                                   (honest_bundles["dir"] / "laptop-ext4.yaml").read_bytes())
    summary, config = (folder / "summary.json").read_bytes(), (folder / "config.yaml").read_bytes()
    (folder / "summary.json").write_bytes(config)
    (folder / "config.yaml").write_bytes(summary)
    line = (folder / "records.jsonl").read_text().splitlines()[0]
    (folder / "records.jsonl").write_text((line + "\n") * copies)
    bundle.sign_bundle(folder, key, bundle.read_envelope_predicate(folder))
    return bundle.TrustedKeys.load(honest_bundles["dir"] / "trusted-keys.yaml")


def test_many_records_beside_an_unreadable_configuration_are_refused_before_parsing(
        honest_bundles: dict[str, Path], tmp_path: Path) -> None:
    """Found by the fuzzer: 60,000 records beside a config.yaml that gives no counts took 49 s of
    a 60 s budget on a loaded machine.  Without counts the bound is twice a closed llama3_1t run's
    records: refused before a line is parsed."""
    trusted = _swapped_with_records(honest_bundles, tmp_path, 60000)
    out = structural.check_case(tmp_path / "t", trusted, BUDGET_S, "swapped, 60,000 records")
    assert out.problem is None and out.verdict == "invalid" and out.seconds < 2.0, out
    report = check_tree(tmp_path / "t", trusted)
    assert any(f["message"].endswith(
        "expected at most 41,984 records (config.yaml gives no counts: twice the 20,480 of a closed "
        "llama3_1t run, plus 1,024: a bound on the checker's work, not the count the rules hold the "
        "records to), got 60,000 lines") for f in report["findings"]), report["findings"]


def test_records_under_the_bound_still_stop_at_the_budget(honest_bundles: dict[str, Path],
                                                          tmp_path: Path) -> None:
    """Under the bound, the budget is what holds a check short: it is looked at every 64 lines, so
    the check stops within a few lines of it, with one finding saying so, in whichever process
    ran out."""
    trusted = _swapped_with_records(honest_bundles, tmp_path, 40000)
    out = structural.check_case(tmp_path / "t", trusted, 0.5, "swapped, 40,000 records")
    assert out.problem is None and out.seconds < 1.0, out
    for jobs in (1, 2):  # 2: the second half of the records read in another process, which may run out
        report = check_tree(tmp_path / "t", trusted, budget_s=0.5, jobs=jobs)
        late = [f for f in report["findings"] if "still in stage schema after" in f["message"]]
        assert len(late) == 1, report["findings"]


def test_rules_on_two_workers_judge_as_one_process(honest_bundles: dict[str, Path], tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A tree of one bundle checked with --jobs 2 lends the second job to its records and rules
    (checker/records_read.py, checker/rule_workers.py; here at any size): the report is the one a
    single process writes, for the honest bundles and for hostile ones."""
    monkeypatch.setattr(forked, "MIN_RECORDS", 0)
    forks = []
    fork = os.fork
    monkeypatch.setattr(os, "fork", lambda: forks.append(1) or fork())
    rng = random.Random(5)
    key = bundle.load_private_key(honest_bundles["dir"] / "keys" / "org.pem")
    trusted = bundle.TrustedKeys.load(honest_bundles["dir"] / "trusted-keys.yaml")
    description = (honest_bundles["dir"] / "laptop-ext4.yaml").read_bytes()
    findings = 0
    for i, name in enumerate(("llama3_8b", "llama_7b", "async_tiers", *["async_tiers", "llama3_8b"] * 5)):
        root = tmp_path / f"case{i}"
        folder = structural.fresh_case(honest_bundles[name], root, CHECKER_ORG, CHECKER_SYSTEM, description)
        if i >= 3:
            structural.mutate(rng, folder, key)
        one = check_tree(root, trusted, jobs=1)
        two = check_tree(root, trusted, jobs=2)
        assert two == one
        findings += sum(len(b["findings"]) for b in one["bundles"])
    assert findings > 10 and len(forks) >= 3, (findings, len(forks))
