"""Hostile submissions, end to end through the ``mlckpt-check`` command: tar bombs (size, member
count, a header that claims gigabytes), path traversal, absolute, symlink and hard-link members,
JSON/YAML bombs (deep nesting, huge arrays, billion laughs, huge integers), duplicate keys, files
and envelopes over their caps, symlinks inside a bundle and a symlinked bundle.

All of them sit in one submission tree next to an honest bundle, and the checker runs once, as a
user would run it (a subprocess, ``--jobs 1``), under a wrapper that measures its peak memory.
Each hostile bundle must come out with a finding naming its rule and what is wrong; the honest
neighbour must still pass; the whole run must stay within a time and a memory bound; nothing may
be written outside the checker's own temporary folders (which it removes).

The JSON/YAML bombs are signed with the organisation's trusted key (an insider's bundle), so they
get past the signature check into parsing; the archive bombs need no signature (they are refused
while unpacking, before anything is verified).
"""

from __future__ import annotations

import gzip
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from mlckpt import bundle

BIN = Path(sys.executable).parent
CHECK = BIN / "mlckpt-check"
ORG, SYSTEM = "example-org", "laptop-ext4"
MiB, GiB = 1 << 20, 1 << 30
TIME_BOUND_S = 60  # the whole hostile tree, one checker process
MEMORY_BOUND_MIB = 600  # peak RSS of the checker (imports alone are ~100 MiB)
TOKEN = uuid.uuid4().hex[:12]  # in the names of files an escaping member would create
ESCAPES = [Path(tempfile.gettempdir()) / f"hostile-escape-{TOKEN}.txt", Path(f"/hostile-abs-{TOKEN}.txt")]

pytestmark = pytest.mark.mpi  # the honest bundles come from real runner runs


# ---------------------------------------------------------------------------------------------
# archives


def _tar_header(info: tarfile.TarInfo) -> bytes:
    return info.tobuf(format=tarfile.PAX_FORMAT, encoding="utf-8", errors="strict")


def _reg(name: str, size: int = 0, data: bytes = b"") -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = size or len(data)
    info.mode = 0o644
    return info, data


def _write_tar(path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]]) -> None:
    with tarfile.open(path, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None and info.isreg() else None)


def size_bomb(path: Path) -> None:
    """Three members of 500 MiB of zeros in a ~1.5 MiB file: each under the member limit, together
    over the 1 GiB total.  Built as concatenated gzip members (one compressed MiB of zeros repeated)
    so the test does not spend seconds compressing."""
    zeros = gzip.compress(bytes(MiB), compresslevel=9, mtime=0)
    with open(path, "wb") as out:
        for i in range(3):
            info = tarfile.TarInfo(f"zeros-{i}.bin")
            info.size = 500 * MiB
            out.write(gzip.compress(_tar_header(info), mtime=0))
            for _ in range(500):
                out.write(zeros)
        out.write(gzip.compress(bytes(2 * tarfile.BLOCKSIZE), mtime=0))


def count_bomb(path: Path) -> None:
    _write_tar(path, [_reg(f"f{i:05d}", data=b"") for i in range(3000)])


def header_bomb(path: Path) -> None:
    """One member whose header claims 8 GiB (and no data behind it)."""
    info = tarfile.TarInfo("run.json")
    info.size = 8 * GiB
    path.write_bytes(gzip.compress(_tar_header(info), mtime=0))


def traversal(path: Path) -> None:
    _write_tar(path, [_reg("run.json", data=b"{}"), _reg(f"../../../{ESCAPES[0].name}", data=b"pwned\n")])


def absolute(path: Path) -> None:
    _write_tar(path, [_reg(str(ESCAPES[1]), data=b"pwned\n")])


def symlink_member(path: Path) -> None:
    info = tarfile.TarInfo("run.json")
    info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
    _write_tar(path, [(info, None)])


def symlinked_folder_member(path: Path) -> None:
    info = tarfile.TarInfo("logs")
    info.type, info.linkname = tarfile.SYMTYPE, tempfile.gettempdir()
    _write_tar(path, [(info, None), _reg(f"logs/{ESCAPES[0].name}", data=b"pwned\n")])


def hardlink_member(path: Path) -> None:
    info = tarfile.TarInfo("run.json")
    info.type, info.linkname = tarfile.LNKTYPE, "/etc/shadow"
    _write_tar(path, [(info, None)])


# ---------------------------------------------------------------------------------------------
# signed folder bundles with hostile content


def _deep(n: int) -> str:
    return "[" * n + "]" * n


def deep_nesting(folder: Path) -> None:
    (folder / "summary.json").write_text(_deep(500_000))


def huge_array(folder: Path) -> None:
    doc = json.loads((folder / "run.json").read_text())
    doc["overrides"] = [0] * 1_200_000  # 2.4 MB of text, 1.2 million values
    (folder / "run.json").write_text(json.dumps(doc))


def duplicate_keys(folder: Path) -> None:
    text = (folder / "run.json").read_text()
    (folder / "run.json").write_text(text.replace('"ranks": 4', '"ranks": 4, "ranks": 4000000', 1))


def huge_integer(folder: Path) -> None:
    text = (folder / "run.json").read_text()
    (folder / "run.json").write_text(text.replace('"ranks": 4', '"ranks": ' + "9" * 200_000, 1))


def billion_laughs(folder: Path) -> None:
    lol = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, 9):
        prev, cur = chr(ord("a") + i - 1), chr(ord("a") + i)
        lol.append(f"{cur}: &{cur} [{', '.join(['*' + prev] * 9)}]")
    (folder / "config.yaml").write_text("\n".join(lol) + "\n" + (folder / "config.yaml").read_text())


def _stages_times(n: int) -> Callable[[Path], None]:
    """Every write record of the async run with its stages repeated ``n`` times."""
    def build(folder: Path) -> None:
        p = folder / "records.jsonl"
        recs = [json.loads(line) for line in p.read_text().splitlines()]
        for r in recs:
            if r["op"] == "write":
                r["stages"] = r["stages"] * n
        p.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return build


def oversized_file(folder: Path) -> None:
    """summary.json 17 MiB (its cap is 16 MiB): valid JSON followed by spaces."""
    p = folder / "summary.json"
    data = p.read_bytes()
    p.write_bytes(data + b" " * (17 * MiB - len(data)))


@dataclass(frozen=True)
class Hostile:
    leaf: str  # name under results/<system>/llama3_8b/
    build: Callable[[Path], None]
    rule: str
    says: str  # a fragment of that finding's message
    signed: bool = False  # a folder bundle re-signed with the trusted key after build()
    source: str = "llama3_8b"  # the honest bundle a folder case starts from


def _after_signing(fn: Callable[[Path], None]) -> Callable[[Path], None]:
    fn.after_signing = True  # type: ignore[attr-defined]
    return fn


@_after_signing
def symlink_inside(folder: Path) -> None:
    p = folder / "summary.json"
    p.unlink()
    p.symlink_to("/etc/passwd")


@_after_signing
def oversized_envelope(folder: Path) -> None:
    p = folder / bundle.SIGNATURE_FILE
    data = p.read_bytes()
    p.write_bytes(data + b" " * (17 * MiB))


CASES: dict[str, Hostile] = {h.leaf: h for h in [
    Hostile("tar-size-bomb.tar.gz", size_bomb, "BUNDLE-FILES",
            "total uncompressed size would exceed 1073741824"),
    Hostile("tar-member-count.tar.gz", count_bomb, "BUNDLE-FILES", "more than 1000 members"),
    Hostile("tar-header-claims-8gib.tar.gz", header_bomb, "BUNDLE-FILES",
            f"member of {8 * GiB} bytes exceeds {600 * MiB}"),
    Hostile("tar-path-traversal.tar.gz", traversal, "BUNDLE-PATHS", "member name rejected"),
    Hostile("tar-absolute-path.tar.gz", absolute, "BUNDLE-PATHS", "member name rejected"),
    Hostile("tar-symlink-member.tar.gz", symlink_member, "BUNDLE-PATHS",
            "symlink member (-> /etc/passwd) not allowed"),
    Hostile("tar-symlinked-folder.tar.gz", symlinked_folder_member, "BUNDLE-PATHS", "symlink member"),
    Hostile("tar-hardlink-member.tar.gz", hardlink_member, "BUNDLE-PATHS",
            "hard-link member (-> /etc/shadow) not allowed"),
    Hostile("json-deep-nesting", deep_nesting, "BUNDLE-SCHEMA", "nested deeper than 64 levels", True),
    Hostile("json-huge-array", huge_array, "BUNDLE-SCHEMA", "more than 1000000 values", True),
    Hostile("json-duplicate-keys", duplicate_keys, "BUNDLE-SCHEMA", "duplicate key", True),
    Hostile("json-huge-integer", huge_integer, "BUNDLE-SCHEMA", "64-bit range", True),
    Hostile("yaml-billion-laughs", billion_laughs, "BUNDLE-SCHEMA", "YAML anchor", True),
    Hostile("oversized-summary", oversized_file, "BUNDLE-SCHEMA", "larger than the limit of 16777216 bytes",
            True),
    Hostile("symlink-inside", symlink_inside, "BUNDLE-PATHS", "symlink", True),
    Hostile("oversized-envelope", oversized_envelope, "BUNDLE-SIGNATURE", "larger than 16 MiB", True),
    # records format 2: a write's stages are bounded (memory, fast, durable) and so is a record
    Hostile("records-stages-x10", _stages_times(10), "BUNDLE-SCHEMA", "line 1: stages: ", True,
            "async_tiers"),
    Hostile("records-stages-x100", _stages_times(100), "BUNDLE-SCHEMA", "line 1: more than 1000 values", True,
            "async_tiers"),
    Hostile("records-stages-x2000", _stages_times(2000), "BUNDLE-SCHEMA", "line 1: longer than 65536 bytes",
            True, "async_tiers"),
]}


# ---------------------------------------------------------------------------------------------
# the tree, checked once


@dataclass
class Checked:
    root: Path
    report: dict[str, Any]
    returncode: int
    stdout: str
    stderr: str
    elapsed_s: float
    peak_rss_mib: float
    honest: tuple[str, ...]  # the honest neighbours' paths in the tree (sync, async+tiers)
    tmp_before: set[str]
    tmp_after: set[str]


MEASURE = """
import resource, subprocess, sys, time
t = time.monotonic()
rc = subprocess.run(sys.argv[1:]).returncode
print(f"{time.monotonic() - t} {resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}", file=sys.stderr)
sys.exit(rc)
"""


def _checker_temp_dirs() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob("mlckpt-check-*")}


@pytest.fixture(scope="module")
def checked(honest_bundles: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Checked:
    h = honest_bundles
    root = tmp_path_factory.mktemp("hostile") / "tree"
    org = root / "open" / ORG
    (org / "systems").mkdir(parents=True)
    shutil.copy(h["dir"] / "laptop-ext4.yaml", org / "systems" / f"{SYSTEM}.yaml")
    shutil.copy(h["dir"] / "trusted-keys.yaml", root / "trusted-keys.yaml")
    honest = org / "results" / SYSTEM / "llama_7b" / h["llama_7b"].name
    shutil.copytree(h["llama_7b"], honest)
    where = org / "results" / SYSTEM / "llama3_8b"
    where.mkdir(parents=True)
    honest_async = where / h["async_tiers"].name
    shutil.copytree(h["async_tiers"], honest_async)
    key = bundle.load_private_key(h["dir"] / "keys" / "org.pem")
    for name, case in CASES.items():
        leaf = where / name
        if name.endswith(".tar.gz"):
            case.build(leaf)
            continue
        shutil.copytree(h[case.source], leaf)
        predicate = bundle.read_envelope_predicate(leaf)
        if case.source != "llama3_8b":  # its own run id: the honest neighbour of that run is no duplicate
            predicate["run_id"] = f"{0x0badc0de00 + len(list(where.iterdir())):016x}"
            run = json.loads((leaf / "run.json").read_text())
            (leaf / "run.json").write_text(json.dumps({**run, "run_id": predicate["run_id"]}, indent=1))
        after = getattr(case.build, "after_signing", False)
        if not after:
            case.build(leaf)
        bundle.sign_bundle(leaf, key, predicate)
        if after:
            case.build(leaf)
    # and a symlinked bundle (never followed)
    (where / "symlinked-leaf").symlink_to(honest, target_is_directory=True)
    report_path = root.parent / "report.json"
    env = {k: v for k, v in os.environ.items() if k != "MLCKPT_DEBUG"}
    tmp_before = _checker_temp_dirs()
    t = time.monotonic()
    cp = subprocess.run([sys.executable, "-c", MEASURE, str(CHECK), str(root), "--json", str(report_path),
                         "--jobs", "1"], env=env, text=True, capture_output=True, timeout=5 * TIME_BOUND_S,
                        check=False)
    elapsed = time.monotonic() - t
    *err_lines, measured = cp.stderr.strip().splitlines()
    _, rss_kib = measured.split()
    return Checked(root, json.loads(report_path.read_text()), cp.returncode, cp.stdout, "\n".join(err_lines),
                   elapsed, int(rss_kib) / 1024,
                   (str(honest.relative_to(root)), str(honest_async.relative_to(root))), tmp_before,
                   _checker_temp_dirs())


def _bundle(report: dict[str, Any], path: str) -> dict[str, Any]:
    found = [b for b in report["bundles"] if b["path"] == path]
    assert len(found) == 1, [b["path"] for b in report["bundles"]]
    return found[0]


# ---------------------------------------------------------------------------------------------
# tests


@pytest.mark.parametrize("name", list(CASES))
def test_hostile_bundle_is_rejected_with_a_finding(name: str, checked: Checked) -> None:
    case = CASES[name]
    path = f"open/{ORG}/results/{SYSTEM}/llama3_8b/{name}"
    b = _bundle(checked.report, path)
    assert b["verdict"] == "invalid", b
    ours = [f for f in b["findings"] if f["rule"] == case.rule and case.says in f["message"]]
    assert ours, json.dumps(b["findings"], indent=1)
    assert all(f["severity"] != "internal" for f in b["findings"]), b["findings"]
    assert all(f["path"].startswith(path) for f in ours), ours
    # the same finding is in the flat list of the report, and in the human output
    assert any(f["rule"] == case.rule and f["path"].startswith(path) for f in checked.report["findings"])
    assert f"FAIL {path}" in checked.stdout


def test_symlinked_bundle_is_not_followed(checked: Checked) -> None:
    path = f"open/{ORG}/results/{SYSTEM}/llama3_8b/symlinked-leaf"
    b = _bundle(checked.report, path)
    assert b["verdict"] == "invalid"
    assert any(f["rule"] == "BUNDLE-PATHS" and "symlink" in f["message"] for f in b["findings"]), b



@pytest.mark.parametrize("which", [0, 1], ids=["sync", "async_tiers"])
def test_honest_neighbour_still_passes(checked: Checked, which: int) -> None:
    path = checked.honest[which]
    b = _bundle(checked.report, path)
    assert b["verdict"] == "open" and b["findings"] == [], b
    assert f"PASS {path}" in checked.stdout


def test_whole_tree_bounded_in_time_and_memory(checked: Checked) -> None:
    print(f"hostile tree: {checked.elapsed_s:.1f} s, peak RSS {checked.peak_rss_mib:.0f} MiB")
    assert checked.returncode == 3, checked.stderr  # integrity failures (archives, paths, envelope)
    assert checked.report["exit_status"] == 3 and checked.report["verdict"] != "valid"
    assert checked.elapsed_s < TIME_BOUND_S, checked.elapsed_s
    assert checked.peak_rss_mib < MEMORY_BOUND_MIB, checked.peak_rss_mib
    assert "Traceback" not in checked.stderr and checked.stderr == "", checked.stderr
    assert len(checked.report["bundles"]) == len(CASES) + 3  # + the symlinked leaf, 2 honest neighbours


def test_nothing_escaped_and_nothing_left(checked: Checked) -> None:
    for p in ESCAPES:
        assert not p.exists(), p
    assert not list(checked.root.parent.rglob(ESCAPES[0].name))
    assert checked.tmp_after <= checked.tmp_before, checked.tmp_after - checked.tmp_before
