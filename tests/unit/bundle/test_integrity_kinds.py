"""Integrity problems are typed where mlckpt.bundle raises them, and the checker routes each to its
rule by that type alone: rewording a message never changes the rule a submitter sees.  Also: the
bundle kept from v0.1.0 (tests/fixtures) still verifies and checks under its rules version."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from support import paths

import checker.bundle_check
from checker.tree_check import check_tree
from mlckpt import bundle
from mlckpt.errors import BundleIntegrityError, IntegrityKind, IntegrityProblem

FIXTURE = paths.FIXTURES / "tree-v0.1.0-fdb2ed2"
SYNC = "open/example-org/results/laptop-ext4/llama3_8b/20261124T152112Z-llama3_8b-4r-b713dbbba1e1a305"
RULE = {
    IntegrityKind.SIGNATURE: "BUNDLE-SIGNATURE",
    IntegrityKind.KEY: "BUNDLE-KEY",
    IntegrityKind.FILES: "BUNDLE-FILES",
    IntegrityKind.PATHS: "BUNDLE-PATHS",
}


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "tree"
    shutil.copytree(FIXTURE, root, symlinks=True)
    return root


def kinds_of(folder: Path, trusted: bundle.TrustedKeys | None = None) -> list[tuple[str, str]]:
    with pytest.raises(BundleIntegrityError) as info:
        bundle.verify_bundle(folder, trusted)
    return [(p[0], p.kind) for p in info.value.problems]


def test_the_v0_1_0_bundles_still_verify_and_check(tree: Path) -> None:
    trusted = bundle.TrustedKeys.load(tree / "trusted-keys.yaml")
    report = check_tree(tree, trusted)
    assert [(b["verdict"], b["rules_version"], b["findings"]) for b in report["bundles"]] == [
        ("open", "1.0", [])
    ] * 3
    vb = bundle.verify_bundle(tree / SYNC, trusted)
    assert vb.org == "example-org" and vb.predicate["rules_version"] == "1.0"


def test_kinds_set_at_the_raise_site(tree: Path) -> None:
    folder = tree / SYNC
    (folder / "extra.txt").write_text("not signed")
    (folder / "run.log").unlink()
    (folder / "run.log").symlink_to(folder / "run.json")
    assert sorted(kinds_of(folder)) == [("extra.txt", IntegrityKind.FILES), ("run.log", IntegrityKind.PATHS)]


def test_signing_keeps_every_kind_beside_a_symlinked_envelope(tree: Path, tmp_path: Path) -> None:
    """Signing a folder whose envelope and one file are links: each problem keeps its kind."""
    folder = tree / SYNC
    (folder / "run.log").unlink()
    (folder / "run.log").symlink_to(folder / "run.json")
    env = folder / bundle.SIGNATURE_FILE
    env.rename(tmp_path / "env.json")
    env.symlink_to(tmp_path / "env.json")
    info = bundle.generate_key(tmp_path / "k.pem", None)
    assert info.path is not None
    predicate = {"run_id": "r", "mlckpt_version": "0.1.0", "runner_code_sha256": "ab" * 32,
                 "rules_version": "1.0", "workload": "llama3_8b", "division": "closed",
                 "started": "2026-11-21T10:00:00Z", "ended": "2026-11-21T10:30:00Z"}
    with pytest.raises(BundleIntegrityError) as raised:
        bundle.sign_bundle(folder, bundle.load_private_key(info.path), predicate)
    assert sorted((p[0], p.kind) for p in raised.value.problems) == [
        (bundle.SIGNATURE_FILE, IntegrityKind.PATHS), ("run.log", IntegrityKind.PATHS)]


def test_key_and_signature_kinds(tree: Path, tmp_path: Path) -> None:
    folder = tree / SYNC
    other = bundle.TrustedKeys.from_mapping(
        {
            "mlckpt_trusted_keys": "1.0",
            "organizations": {"someone": [bundle.generate_key(tmp_path / "k.pem").public_key]},
        }
    )
    assert kinds_of(folder, other) == [(bundle.SIGNATURE_FILE, IntegrityKind.KEY)]
    env = (folder / bundle.SIGNATURE_FILE).read_text()
    (folder / bundle.SIGNATURE_FILE).write_text(env.replace('"sig": "', '"sig": "AAAA', 1))
    assert kinds_of(folder) == [(bundle.SIGNATURE_FILE, IntegrityKind.SIGNATURE)]


def test_integrity_problem_is_a_pair_with_a_kind() -> None:
    p = IntegrityProblem("a", "m", IntegrityKind.PATHS)
    assert p == ("a", "m") and p.kind == "paths"
    with pytest.raises(ValueError):
        IntegrityProblem("a", "m", "wording")


@pytest.mark.parametrize("kind", IntegrityKind.ALL)
def test_the_rule_follows_the_kind_not_the_wording(
    tree: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every problem carries a message full of another kind's words; the rule is the kind's."""
    misleading = "is a symlink, untrusted key, digest mismatch, bad signature"

    def verify(folder: Path, trusted: object = None, **_: object) -> None:
        raise BundleIntegrityError(
            f"{folder}: 1 integrity problem", [IntegrityProblem("run.json", misleading, kind)]
        )

    monkeypatch.setattr(checker.bundle_check.bundle, "verify_bundle", verify)
    report = check_tree(tree, bundle.TrustedKeys.load(tree / "trusted-keys.yaml"))
    rules = {f["rule"] for b in report["bundles"] for f in b["findings"] if f["message"].endswith(misleading)}
    assert rules == {RULE[kind]}


def test_one_set_of_archive_limits_for_every_reader(tree: Path, tmp_path: Path) -> None:
    """A packed bundle over the limits is refused alike by verify, the checker, compare and the
    leaderboard (they all unpack through mlckpt.bundle.open_bundle / safe_unpack)."""
    import tarfile

    from checker.leaderboard.collect import read_bundle

    archive = tmp_path / "wide.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for i in range(1001):
            info = tarfile.TarInfo(f"b/f{i:04d}")
            tar.addfile(info)
    with pytest.raises(BundleIntegrityError, match="more than 1000 members"):
        read_bundle(archive)  # compare and the leaderboard
    with pytest.raises(BundleIntegrityError, match="more than 1000 members"):
        with bundle.open_bundle(archive):
            pass
    leaf = tree / "open/example-org/results/laptop-ext4/llama_7b"
    for old in leaf.iterdir():
        old.unlink()
    shutil.copy(archive, leaf / "20261124T152115Z-llama_7b-4r-144e9ea777a4efd5.tar.gz")
    report = check_tree(tree, bundle.TrustedKeys.load(tree / "trusted-keys.yaml"))
    found = [f for b in report["bundles"] for f in b["findings"] if "more than 1000 members" in f["message"]]
    assert [f["rule"] for f in found] == ["BUNDLE-FILES"]


def test_documents_are_read_as_signed(tree: Path) -> None:
    """bundle.read_document: the one way the checker, compare and the leaderboard read a verified
    bundle's files; a file swapped after verification is refused, not read."""
    from mlckpt import strict

    folder = tree / SYNC
    vb = bundle.verify_bundle(folder)
    run = bundle.parse_document("run.json", bundle.read_document(folder, "run.json", vb))
    assert run["rules_version"] == "1.0"
    (folder / "run.json").write_text((folder / "run.json").read_text().replace('"open"', '"closed"'))
    with pytest.raises(strict.ParseError, match="changed since it was verified"):
        bundle.read_document(folder, "run.json", vb)
    with pytest.raises(strict.ParseError, match="not in the bundle"):
        bundle.read_document(folder, "extra.json", vb)
