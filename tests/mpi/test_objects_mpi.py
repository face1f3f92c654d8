"""Checkpoints on object storage, end to end: real ``mpiexec`` ranks, a real S3 store (OpenStack
Swift's all-in-one with its S3 API on the loopback address, started by the session fixture
``s3_store``), real signed bundles, the real checker.

Every test checks what a user and a storage owner would: the exit status and the one line, the
bundle (or its absence), and the bucket afterwards: nothing of the run left behind (no object, no
unfinished multipart upload), and an object the run did not write untouched.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.cli import S3_BUCKET, mlckpt_command, s3_client
from support.runs import printed_bundle

from mlckpt import bundle
from mlckpt.plan.config import setup

pytestmark = pytest.mark.mpi

BIN = Path(sys.executable).parent
CHECK = BIN / "mlckpt-check"
TIMEOUT_S = 180
ORG, SYSTEM = "example-org", "swift-loopback"
BASE = [
    "workload=llama3_8b",
    "ranks=4",
    "scale=0.0005",
    "division=open",
    "checkpoint.rank_shift=1",
    "storage.s3.part_size=5242880",
    "storage.s3.inflight=4",
]
DESCRIPTION = """\
description_format: 1
system_name: swift-loopback
submitter: Example Org
availability: available
storage: {product: OpenStack Swift all-in-one (s3api), type: object, usable_capacity_tib: 0.5,
          max_write_gib_s: 100, max_read_gib_s: 100}
clients: {count: 1, model: test VM, memory_gib: 24}
network: {type: loopback}
"""


@pytest.fixture(scope="module")
def world(s3_store: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A signing key the checker trusts, a system description, a private config home, and a
    foreign object under the runs' prefix that no run may touch."""
    d = tmp_path_factory.mktemp("objects")
    info = bundle.generate_key(d / "org.pem")
    (d / "trusted-keys.yaml").write_text(
        f'mlckpt_trusted_keys: "1.0"\norganizations:\n  {ORG}: ["{info.public_key}"]\n'
    )
    (d / f"{SYSTEM}.yaml").write_text(DESCRIPTION)
    prefix = f"runs-{uuid.uuid4().hex[:8]}"
    c = s3_client(s3_store.env)
    c.put_object(Bucket=S3_BUCKET, Key=f"{prefix}/not-mlckpt/keep-me", Body=b"someone else's object\n")
    env = {
        **{k: v for k, v in os.environ.items()
           if not k.startswith(("MLCKPT_", "AWS_")) or k == "MLCKPT_RETRY_DISTURBED"},
        **s3_store.env,
        "XDG_CONFIG_HOME": str(d / "xdg"),
    }
    yield {"dir": d, "env": env, "prefix": prefix, "client": c, "folder": f"s3://{S3_BUCKET}/{prefix}"}
    assert (
        c.get_object(Bucket=S3_BUCKET, Key=f"{prefix}/not-mlckpt/keep-me")["Body"].read()
        == b"someone else's object\n"
    )


def run(
    w: dict[str, Any],
    args: list[str],
    cwd: Path,
    extra_env: dict[str, str] | None = None,
    timeout: float = TIMEOUT_S,
) -> subprocess.CompletedProcess[str]:
    env = {**w["env"], **(extra_env or {})}
    return subprocess.run(
        [*mlckpt_command(env), "run", *args],
        cwd=cwd,
        env=env,
        text=True,
        capture_output=True,
        timeout=timeout,
        check=False,
    )


def keys_under(w: dict[str, Any], prefix: str) -> list[str]:
    """Every object and unfinished upload under ``prefix`` (the tests' own listing)."""
    c = w["client"]
    objs = [o["Key"] for o in c.list_objects_v2(Bucket=S3_BUCKET, Prefix=prefix).get("Contents", [])]
    ups = [
        f"upload:{u['Key']}"
        for u in c.list_multipart_uploads(Bucket=S3_BUCKET, Prefix=prefix).get("Uploads", [])
    ]
    return objs + ups


def mine(w: dict[str, Any]) -> list[str]:
    """What is under the runs' prefix besides the foreign object."""
    return [k for k in keys_under(w, w["prefix"] + "/") if "not-mlckpt/" not in k]


def checked(w: dict[str, Any], folder: Path, tmp: Path) -> dict[str, Any]:
    """The checker's verdict on one bundle placed in a submission tree, as a CI job runs it."""
    root = tmp / "tree"
    (root / "open" / ORG / "systems").mkdir(parents=True)
    shutil.copy(w["dir"] / f"{SYSTEM}.yaml", root / "open" / ORG / "systems" / f"{SYSTEM}.yaml")
    dest = root / "open" / ORG / "results" / SYSTEM / "llama3_8b"
    dest.mkdir(parents=True)
    shutil.copytree(folder, dest / folder.name)
    proc = subprocess.run(
        [
            str(CHECK),
            "check",
            str(root),
            "--trusted-keys",
            str(w["dir"] / "trusted-keys.yaml"),
            "--json",
            str(tmp / "report.json"),
            "-q",
        ],
        text=True,
        capture_output=True,
        timeout=120,
        check=False,
    )
    report = json.loads((tmp / "report.json").read_text())
    assert proc.returncode == report["exit_status"]
    [b] = report["bundles"]
    return {"exit": proc.returncode, **b}


def signed(w: dict[str, Any]) -> list[str]:
    return [f"signing.key={w['dir'] / 'org.pem'}", f"system={w['dir'] / (SYSTEM + '.yaml')}"]


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_run_on_object_storage_passes_the_checker(world: dict[str, Any], tmp_path: Path, mode: str) -> None:
    """2 checkpoints, 3 restores (checkpoint 1 restored twice), every rank restoring what rank r+1
    wrote; signed, checked; the bucket holds nothing of the run afterwards."""
    extra = ["checkpoint.mode=async", "checkpoint.compute_interval_s=0.2"] if mode == "async" else []
    proc = run(
        world,
        [
            *BASE,
            *extra,
            f"checkpoint.folder={world['folder']}",
            "checkpoint.num_writes=2",
            "checkpoint.num_reads=3",
            *signed(world),
            "output.root=results",
        ],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    last = (
        r"^write 2/2: 53.61 MiB from 4 ranks in [\d.]+ s"
        if mode == "sync"
        else r"^checkpoint 2/2: durable [\d.]+ s after it was taken; durable-tier write 53.61 MiB in"
    )
    assert re.search(last, out, re.M), out
    assert len(re.findall(r"^read \d/3: .* verified, 0\.0% cached before\)$", out, re.M)) == 3, out
    folder = printed_bundle(proc)
    run_json = json.loads((folder / "run.json").read_text())
    assert run_json["run_format"] == 13 and run_json["rules_version"] == "1.22"
    storage = run_json["storage"]
    assert storage["kind"] == "s3" and storage["bucket"] == S3_BUCKET and storage["prefix"] == world["prefix"]
    assert storage["client"].startswith("botocore ") and storage["endpoint_host"].startswith("127.0.0.1:")
    assert (storage["part_size"], storage["inflight"]) == (5 << 20, 4)
    assert "testing" not in (folder / "run.json").read_text()  # the secret key is never recorded
    records = [json.loads(ln) for ln in (folder / "records.jsonl").read_text().splitlines()]
    writes = [r for r in records if r["op"] == "write"]
    reads = [r for r in records if r["op"] == "read"]
    assert len(writes) == 8 and len(reads) == 12
    assert all(r["fsync"] is True and r["direct"] is False for r in writes)
    assert all(r["resident_bytes"] == 0 and r["verified_bytes"] == r["bytes"] > 0 for r in reads)
    assert [r["checkpoint"] for r in reads if r["rank"] == 0] == [1, 2, 1]
    plan = setup(BASE).plan
    assert sum(r["bytes"] for r in writes) == 2 * plan.total_bytes
    host = json.loads((folder / "system.json").read_text())["hosts"][0]
    assert host["filesystem"] == {
        "fs_type": "s3",
        "source": storage["endpoint_host"],
        "mount_point": world["folder"],
    }
    verdict = checked(world, folder, tmp_path)
    assert (verdict["exit"], verdict["verdict"]) == (0, "open"), verdict["findings"]
    assert mine(world) == []


def test_a_corrupted_object_is_named(world: dict[str, Any], tmp_path: Path) -> None:
    """Rank 1 flips one bit of its first object of checkpoint 1 between the writes and the
    restores; rank 0 restores it (rank shift 1) and names the rank, the object and the offset."""
    proc = run(
        world,
        [
            *BASE,
            f"checkpoint.folder={world['folder']}",
            "checkpoint.num_writes=1",
            "checkpoint.num_reads=1",
            "output.root=results",
        ],
        tmp_path,
        {"MLCKPT_TEST_FLIP": "1:0:12345"},
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    names = [f.name for f in setup(BASE).plan.rank_plans[1].files]
    url = re.escape(f"{world['folder']}/") + r"\S+-llama3_8b-4r-[0-9a-f]{16}/ckpt-0001/" + re.escape(names[0])
    assert re.search(
        rf"rank 0 on \S+: read 1: verification failed reading {url}: "
        r"byte 12345 \(page 3\): \S.*payload corrupted",
        proc.stderr,
    ), proc.stderr
    assert "Traceback" not in proc.stderr
    assert not list((tmp_path / "results").glob("*/bundle.dsse.json"))
    assert mine(world) == []


def test_a_rank_killed_mid_write_leaves_nothing(world: dict[str, Any], tmp_path: Path) -> None:
    """Rank 2 is killed while its parts are in flight: one line names it, the cleanup says what
    it removed (objects, and the unfinished uploads of the killed rank), and the bucket holds
    nothing of the run."""
    proc = run(
        world,
        [
            "workload=llama3_8b",
            "ranks=4",
            "scale=0.002",
            "division=open",
            "storage.s3.part_size=5242880",
            "storage.s3.inflight=2",
            f"checkpoint.folder={world['folder']}",
            "checkpoint.num_writes=1",
            "checkpoint.num_reads=1",
            "output.root=results",
        ],
        tmp_path,
        {"MLCKPT_TEST_FAULT": "killmid:2:write:1", "MLCKPT_TEST_KILL_AFTER_S": "0.4"},
    )
    assert proc.returncode != 0, proc.stdout
    err = proc.stderr
    url = re.escape(f"{world['folder']}/") + r"\S+-llama3_8b-4r-[0-9a-f]{16}/ckpt-0001/zero_pp_rank_2_\S+"
    assert re.search(
        # the signal is named when the guardian saw the exit before the proxy reaped it (test_faults)
        rf"^mlckpt: error: rank 2 on \S+ \(pid \d+\) died during write 1( \(killed by signal 9, "
        rf"SIGKILL\))?, writing {url} \(\+1 more\); the MPI job was ended; ",
        err,
        re.M,
    ), err
    m = re.search(
        r"removed (\d+) checkpoint objects? of this run(?: and aborted (\d+) unfinished uploads?)?", err
    )
    assert m, err
    assert m.group(2) and int(m.group(2)) >= 1, err  # the killed rank's upload was aborted
    assert "Traceback" not in err
    assert mine(world) == []
    assert not list((tmp_path / "results").glob("*/bundle.dsse.json"))


@pytest.mark.parametrize("case", ["endpoint", "bucket", "credentials", "no-credentials"])
def test_an_unusable_store_is_refused_before_any_io(world: dict[str, Any], tmp_path: Path, case: str) -> None:
    folder, env = world["folder"], {}
    if case == "endpoint":
        env = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9"}
        want = r"the S3 endpoint http://127\.0\.0\.1:9 cannot be reached"
    elif case == "bucket":
        folder = f"s3://no-such-bucket-{uuid.uuid4().hex[:8]}/x"
        want = r"the bucket no-such-bucket-\w+ does not exist at http://127\.0\.0\.1:\d+ \(create it first\)"
    elif case == "credentials":
        env = {"AWS_SECRET_ACCESS_KEY": "wrong"}
        want = rf"the S3 credentials are refused by http://127\.0\.0\.1:\d+ for bucket {S3_BUCKET}"
    else:
        env = {
            "AWS_ACCESS_KEY_ID": "",
            "AWS_SECRET_ACCESS_KEY": "",
            "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
            "AWS_CONFIG_FILE": "/nonexistent",
        }
        want = r"no S3 credentials found"
    before = mine(world)
    proc = run(
        world, [*BASE, f"checkpoint.folder={folder}", "output.root=results"], tmp_path, env, timeout=60
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and re.fullmatch(
        rf"mlckpt: error: \[OBJECT-STORE-USABLE\] host \S+: .*{want}.*", lines[0]
    ), proc.stderr
    assert not (tmp_path / "results").exists() or not any((tmp_path / "results").iterdir())
    assert mine(world) == before == []


@pytest.fixture(scope="module")
def honest_object_bundle(world: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("honest-object")
    proc = run(world, [*BASE, f"checkpoint.folder={world['folder']}", "checkpoint.num_writes=1",
                       "checkpoint.num_reads=1", *signed(world), "output.root=results"], d)
    assert proc.returncode == 0, proc.stderr
    return printed_bundle(proc)


def test_the_honest_object_bundle_passes(world: dict[str, Any], honest_object_bundle: Path,
                                         tmp_path: Path) -> None:
    verdict = checked(world, honest_object_bundle, tmp_path)
    assert (verdict["exit"], verdict["verdict"]) == (0, "open")
    assert [f for f in verdict["findings"] if f["severity"] != "warning"] == []


@pytest.mark.parametrize(("edit", "fragment"), [
    ("bucket", "expected storage.bucket='mlckpt-test', got 'another-bucket'"),
    ("part_size", "expected storage.part_size=5242880, got 16777216"),
    ("posix", "expected storage.kind='s3', got 'posix'"),
    ("fs", "host "),
])
def test_a_forged_storage_claim_is_caught(
    world: dict[str, Any], honest_object_bundle: Path, tmp_path: Path, edit: str, fragment: str
) -> None:
    """A vendor re-signs an honest object run's bundle claiming another bucket, other transfer
    settings, a filesystem, or hosts that wrote to a disk: OBJECT-STORAGE-RECORDED names it."""
    from support.forge import edit_json, resign

    folder = tmp_path / honest_object_bundle.name
    shutil.copytree(honest_object_bundle, folder)
    if edit == "bucket":
        edit_json(folder, "run.json", lambda r: r["storage"].update(bucket="another-bucket"))
    elif edit == "part_size":
        edit_json(folder, "run.json", lambda r: r["storage"].update(part_size=16 << 20))
    elif edit == "posix":
        edit_json(folder, "run.json", lambda r: r.update(storage={"kind": "posix"}))
    else:
        edit_json(folder, "system.json", lambda s: s["hosts"][0].update(
            filesystem={"fs_type": "ext4", "source": "/dev/nvme0n1", "mount_point": "/mnt"}))
    resign(folder, bundle.load_private_key(world["dir"] / "org.pem"))
    verdict = checked(world, folder, tmp_path)
    found = [f["message"] for f in verdict["findings"] if f["rule"] == "OBJECT-STORAGE-RECORDED"]
    assert verdict["verdict"] == "invalid" and found, verdict["findings"]
    assert any(fragment in m for m in found), found
    if edit == "fs":
        assert any("expected filesystem s3 at 127.0.0.1:" in m and "got ext4 at /dev/nvme0n1" in m
                   for m in found)


@pytest.mark.parametrize("strategy", ["direct", "fanout"])
def test_a_serving_run_loads_from_objects_and_passes_the_checker(world: dict[str, Any], tmp_path: Path,
                                                                  strategy: str) -> None:
    """Rules 1.13: the weights as objects, each rank's pieces read with ranged GETs; the bundle
    passes, and the bucket holds nothing of the run afterwards."""
    proc = run(world, ["workload=llama3_8b", "division=open", "scale=0.0005", "ranks=4", "serving.tp=2",
                       f"serving.strategy={strategy}", "serving.loads=2", "storage.s3.part_size=5242880",
                       f"checkpoint.folder={world['folder']}", "output.root=results", *signed(world)],
               tmp_path)
    assert proc.returncode == 0, proc.stderr
    folder = Path(re.findall(r"^bundle: (.+)$", proc.stdout, re.M)[-1])
    run_doc = json.loads((folder / "run.json").read_text())
    assert run_doc["storage"]["kind"] == "s3" and run_doc["serving"]["strategy"] == strategy
    summary = json.loads((folder / "summary.json").read_text())
    served = summary["loads"][0]["storage_bytes"]
    assert served == summary["placed_bytes"] // (1 if strategy == "direct" else 2)
    assert all(load["resident_bytes"] == 0 for load in summary["loads"])
    b = checked(world, folder, tmp_path)
    assert b["exit"] == 0 and b["verdict"] == "open", b["findings"]
    assert mine(world) == []
