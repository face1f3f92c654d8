"""Framework writers on real MPI (rules 1.11): torch.save, PyTorch DCP (sync and async_save, over a
gloo process group made from the MPI world) and safetensors, each alternating with mlckpt's own
engine in one run; the signed bundles pass mlckpt-check, and a forged writer label or ratio is
caught."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.cli import cli_env
from support.forge import edit_json, edit_records, edit_yaml, read_json, read_records, resign, resummarize
from support.runs import assert_ran, hard_rules, judged_alone, printed_bundle, signed_run
from support.trees import tree_of

from mlckpt import bundle
from mlckpt.workload.frameworks import Framework, file_names
from mlckpt.workload.layout import make_plan
from mlckpt.workload.model import workload_from_config
from mlckpt.workload.tensors import tensors_of
from mlckpt.written import Written

pytest.importorskip("torch")
pytest.importorskip("safetensors")

BIN = Path(sys.executable).parent
BASE = ("rules_version=1.19", "workload=llama3_8b", "division=open", "scale=0.0005", "ranks=2",
        "checkpoint.num_writes=2", "checkpoint.num_reads=2", "checkpoint.folder=ck", "output.root=results")
RUNS = {
    "torch_save": ("framework.writer=torch_save",),
    "torch_save_flat": ("framework.writer=torch_save", "framework.tensors=flat"),
    "safetensors": ("framework.writer=safetensors",),
    "torch_dcp": ("framework.writer=torch_dcp", "framework.threads=2", "checkpoint.keep=true"),
    "torch_dcp_async": ("framework.writer=torch_dcp", "framework.sync_files=false", "checkpoint.mode=async",
                        "checkpoint.compute_interval_s=0.3"),
}
# Rules whose failing cases are here, on bundles of real framework runs (tests/unit/rules/
# test_rules_coverage.py counts them)
FORGERIES = ("FRAMEWORK-RECORDED", "LIBRARY-VERSION", "FRAMEWORK-TENSORS")


def run(h: dict[str, Path], cwd: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    return signed_run(h, cwd, *BASE, *overrides)


@pytest.fixture(scope="module")
def made(honest_bundles: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    h = honest_bundles
    out: dict[str, Any] = {"h": h}
    for name, overrides in RUNS.items():
        cwd = tmp_path_factory.mktemp(name)
        proc = run(h, cwd, *overrides)
        assert_ran(proc)
        out[name] = {"bundle": printed_bundle(proc), "out": proc.stdout, "cwd": cwd,
                     "status": proc.returncode}
    return out


@pytest.mark.parametrize("name", list(RUNS))
def test_a_library_run_passes_the_checker(made: dict[str, Any], name: str, tmp_path: Path) -> None:
    m = made[name]
    b = judged_alone(made["h"], tree_of(made["h"], tmp_path / "t", m["bundle"]))
    # beside a busy disk every try may come out disturbed: said so, never invalid
    assert b["verdict"] == ("disturbed" if m["status"] == 6 else "open"), b["findings"]
    assert not hard_rules(b), b["findings"]


@pytest.mark.parametrize("name", list(RUNS))
def test_the_library_and_the_engine_alternate_and_every_byte_is_verified(made: dict[str, Any],
                                                                         name: str) -> None:
    m = made[name]
    writer = RUNS[name][0].split("=")[1]
    run_doc, records = read_json(m["bundle"], "run.json"), read_records(m["bundle"])
    fw = run_doc["framework"]
    assert (fw["writer"], fw["library"], fw["reference"]) == (writer, "safetensors" if writer == "safetensors"
                                                              else "torch", True)
    # the formats rules 1.19 write (BASE pins them)
    assert fw["library_version"] and run_doc["run_format"] == Written.of("1.19").run == 12
    assert run_doc["records_format"] == Written.of("1.19").records == 12
    by_ckpt = {(r["op"], r["checkpoint"]): r["writer"] for r in records}
    assert by_ckpt == {("write", 1): writer, ("write", 2): "mlckpt", ("read", 1): writer,
                       ("read", 2): "mlckpt"}
    for r in records:
        if r["writer"] == writer and r["op"] == "write":
            assert r["file_bytes"] >= r["bytes"] and r["fsync"] and not r["direct"]
            assert r["synced_by"] == ("library" if name == "torch_dcp" else "mlckpt")
            assert "requests" not in r  # nothing went through the engine
        if r["op"] == "read":
            assert r["verified_bytes"] == r["bytes"] > 0 and r["mismatches"] == 0
            assert r["resident_bytes"] <= 0.01 * r["bytes"]  # cold
    summary = read_json(m["bundle"], "summary.json")
    ref = summary["framework"]["reference"]
    assert summary["framework"]["writer"] == writer and ref["write_ratio"] > 0 and ref["read_ratio"] > 0
    assert ref["write_ratio"] == pytest.approx(summary["write_bandwidth_mean_gib_s"]
                                               / ref["write_bandwidth_mean_gib_s"])
    assert f"framework {writer}: write {ref['write_ratio']:.2f}× the engine's" in m["out"]
    left = [p for p in (m["cwd"] / "ck").rglob("*") if p.is_file() and p.name != ".mlckpt-run"]
    if "checkpoint.keep=true" not in RUNS[name]:  # the library's files are gone with the run's
        assert not left, left
        return
    # kept: every file the library made has a name a run that cannot finish sweeps (and only those)
    config = yaml.safe_load((m["bundle"] / "config.yaml").read_text())
    plan, fw = make_plan(workload_from_config(config["workload"]), 2, 0.0005), Framework.of(config)
    names = {n for r, rp in enumerate(plan.rank_plans) for n in file_names(fw, r, [f.name for f in rp.files])}
    assert left and {p.name for p in left} <= names, sorted({p.name for p in left} - names)
    first = {p.name for p in left if p.parent.name == "ckpt-0001"}
    assert first >= {"__0_0.distcp", "__1_0.distcp", ".metadata"}, first


def test_dcp_async_save_is_measured_as_the_engine_async_mode_is(made: dict[str, Any]) -> None:
    m = made["torch_dcp_async"]
    summary = read_json(m["bundle"], "summary.json")
    assert summary["mode"] == "async" and summary["tiers"] == ["memory", "durable"]
    records = read_records(m["bundle"])
    w1 = [r for r in records if r["op"] == "write" and r["checkpoint"] == 1]
    for r in w1:  # DCP staged the state in the stall; its own thread made it durable behind training
        assert r["staged_ns"] < r["t1_ns"] and r["synced_by"] == "mlckpt" and r["file_bytes"] >= r["bytes"]
        assert [st["tier"] for st in r["stages"]] == ["memory", "durable"]
    assert summary["framework"]["write_stall_mean_s"] < summary["write_time_to_durable_mean_s"]


@pytest.mark.parametrize("name", list(RUNS))
def test_each_library_op_counts_the_tensors_it_was_handed(made: dict[str, Any], name: str) -> None:
    """Rules 1.19: the library is handed the rank's shard as the model's named tensors (782 per
    rank for llama3_8b's 2 ranks at ZeRO 3 × 0.0005: 195 model shards, 585 optimizer tensors, and
    in each file one uint8 tensor of what whole rows leave over), or one per planned file with
    framework.tensors=flat; the records count what each op handled."""
    config = yaml.safe_load((made[name]["bundle"] / "config.yaml").read_text())
    plan, fw = make_plan(workload_from_config(config["workload"]), 2, 0.0005), Framework.of(config)
    assert fw.tensors == ("flat" if name.endswith("_flat") else "model")
    for r in read_records(made[name]["bundle"]):
        if r["writer"] == "mlckpt":
            assert "tensors" not in r
            continue
        assert r["tensors"] == sum(len(ts) for ts in tensors_of(plan, r["rank"], fw.tensors))
        assert r["tensors"] == (2 if fw.tensors == "flat" else 782)


def test_dcp_planned_and_wrote_every_named_tensor(made: dict[str, Any]) -> None:
    """What DCP itself recorded of the kept checkpoint: every rank's named tensors, with the
    shapes and types the plan gives (the metadata's planning is paid per tensor)."""
    import torch
    from torch.distributed.checkpoint import FileSystemReader

    m = made["torch_dcp"]
    [first] = [p.parent for p in (m["cwd"] / "ck").rglob(".metadata") if p.parent.name == "ckpt-0001"]
    meta = FileSystemReader(str(first)).read_metadata().state_dict_metadata
    config = yaml.safe_load((m["bundle"] / "config.yaml").read_text())
    plan = make_plan(workload_from_config(config["workload"]), 2, 0.0005)
    want = {}
    for rank in range(2):
        for f, ts in zip(plan.rank_plans[rank].files, tensors_of(plan, rank, "model"), strict=True):
            want.update({f"rank{rank}/{f.name}/{t.name}": (t.shape, t.dtype) for t in ts})
    assert len(meta) == len(want) == 2 * 782
    dtypes = {"fp16": torch.float16, "fp32": torch.float32, "uint8": torch.uint8}
    for key, (shape, dtype) in want.items():
        assert tuple(meta[key].size) == shape and meta[key].properties.dtype == dtypes[dtype], key
    assert "rank1/zero_pp_rank_1_mp_rank_0_model_states.pt/model.layers.31.mlp.down_proj.weight" in meta


def test_a_flat_run_claimed_as_the_model_structure_is_caught(made: dict[str, Any], tmp_path: Path) -> None:
    """The forger's aim: the flat (faster) structure's figure shown as the model's. config.yaml
    edited to framework.tensors=model: FRAMEWORK-TENSORS holds each op's count to the model's."""
    h, m = made["h"], made["torch_save_flat"]

    def as_model(work: Path) -> None:
        edit_yaml(work, "config.yaml", lambda c: c["framework"].update(tensors="model"))

    b = judged_alone(h, tree_of(h, tmp_path / "t", _forged(m, h, tmp_path, as_model)))
    assert b["verdict"] == "invalid"
    found = [f["message"] for f in b["findings"] if f["rule"] == "FRAMEWORK-TENSORS"]
    assert found and "expected 782 tensors (framework.tensors=model), got 2" in found[0], b["findings"]


def _forged(m: dict[str, Any], h: dict[str, Path], dest: Path, edit: Any) -> Path:
    work = dest / "b"
    shutil.copytree(m["bundle"], work)
    edit(work)
    resign(work, bundle.load_private_key(h["dir"] / "keys" / "org.pem"))
    return work


def test_an_engine_checkpoint_relabelled_as_the_library_is_caught(made: dict[str, Any],
                                                                  tmp_path: Path) -> None:
    """The forger's aim: the library's figure made of the engine's (faster) checkpoint, the ratio 1."""
    h, m = made["h"], made["torch_save"]

    def relabel(work: Path) -> None:
        def fn(records: list[dict[str, Any]]) -> None:
            for r in records:
                if r["checkpoint"] == 2:
                    r["writer"] = "torch_save"
                    if r["op"] == "write":
                        r.update(file_bytes=r["bytes"] + 4096, synced_by="mlckpt")
        edit_records(work, fn)
        resummarize(work)

    work = _forged(m, h, tmp_path, relabel)
    b = judged_alone(h, tree_of(h, tmp_path / "t", work))
    assert b["verdict"] == "invalid"
    found = [f for f in b["findings"] if f["rule"] == "FRAMEWORK-RECORDED"]
    assert found and "checkpoint 2 by mlckpt" in found[0]["message"], b["findings"]


def test_engine_traces_in_a_library_op_are_caught(made: dict[str, Any], tmp_path: Path) -> None:
    """Even with run.json's reference turned off so every op may be the library's, an op that went
    through the engine (its request histogram, O_DIRECT) cannot be the library's."""
    h, m = made["h"], made["safetensors"]
    engine_write = next(r for r in read_records(m["bundle"])
                        if r["op"] == "write" and r["writer"] == "mlckpt")

    def relabel(work: Path) -> None:
        def fn(records: list[dict[str, Any]]) -> None:
            for r in records:
                r["writer"] = "safetensors"
                if r["op"] == "write" and r["checkpoint"] == 2:
                    r.update(file_bytes=r["bytes"] + 160, synced_by="mlckpt")
        edit_records(work, fn)
        for name in ("config.yaml",):
            text = (work / name).read_text().replace("reference: null", "reference: false")
            (work / name).write_text(text)
        edit_json(work, "run.json", lambda d: d["framework"].update(reference=False))
        resummarize(work)

    work = _forged(m, h, tmp_path, relabel)
    b = judged_alone(h, tree_of(h, tmp_path / "t", work))
    found = [f["message"] for f in b["findings"] if f["rule"] == "FRAMEWORK-RECORDED"]
    assert "requests" in engine_write  # the engine's op carried its histogram
    assert found and "the engine's traces" in found[0], b["findings"]


def test_another_library_version_claimed_is_caught(made: dict[str, Any], tmp_path: Path) -> None:
    """run.json names the version of the library its writer used, and system.json lists the host's
    own (rules 1.18): a run.json edited alone to claim another PyTorch fails LIBRARY-VERSION."""
    h, m = made["h"], made["torch_dcp"]
    import torch

    run_doc = read_json(m["bundle"], "run.json")
    [host] = read_json(m["bundle"], "system.json")["hosts"]
    assert run_doc["framework"]["library_version"] == host["packages"]["torch"] == torch.__version__

    def newer(work: Path) -> None:
        edit_json(work, "run.json", lambda d: d["framework"].update(library_version="9.9.0"))

    b = judged_alone(h, tree_of(h, tmp_path / "t", _forged(m, h, tmp_path, newer)))
    assert b["verdict"] == "invalid"
    found = [f["message"] for f in b["findings"] if f["rule"] == "LIBRARY-VERSION"]
    assert found and f"got torch {torch.__version__} (system.json)" in found[0], b["findings"]


def test_a_forged_ratio_is_caught(made: dict[str, Any], tmp_path: Path) -> None:
    h, m = made["h"], made["torch_dcp"]

    def flatter(work: Path) -> None:
        edit_json(work, "summary.json", lambda s: s["framework"]["reference"].update(write_ratio=0.97))

    b = judged_alone(h, tree_of(h, tmp_path / "t", _forged(m, h, tmp_path, flatter)))
    assert b["verdict"] == "invalid"
    found = [f for f in b["findings"] if f["rule"] == "METRICS-RECOMPUTE"]
    assert found and "framework.reference.write_ratio" in found[0]["message"], b["findings"]


def test_the_checker_shows_the_library_against_the_engine(made: dict[str, Any], tmp_path: Path) -> None:
    h, m = made["h"], made["torch_save"]
    root = tree_of(h, tmp_path / "t", m["bundle"])
    (root / "trusted-keys.yaml").write_text((h["dir"] / "trusted-keys.yaml").read_text())
    proc = subprocess.run([str(BIN / "mlckpt-check"), str(root), "--json", str(tmp_path / "r.json")],
                          env=cli_env(), text=True, capture_output=True, timeout=300, check=False)
    assert proc.returncode in (0, 6), proc.stdout + proc.stderr
    ratio = read_json(m["bundle"], "summary.json")["framework"]["reference"]["write_ratio"]
    assert f"torch_save: write {ratio:.2f}×, read " in proc.stdout, proc.stdout
    report = json.loads((tmp_path / "r.json").read_text())
    [b] = report["bundles"]
    assert b["metrics"]["framework"]["writer"] == "torch_save"


def test_the_report_compare_and_leaderboard_show_the_library_against_the_engine(
        made: dict[str, Any], tmp_path: Path) -> None:
    h, m = made["h"], made["safetensors"]
    ref = read_json(m["bundle"], "summary.json")["framework"]["reference"]
    report = subprocess.run([str(BIN / "mlckpt"), "report", str(m["bundle"])], env=cli_env(), text=True,
                            capture_output=True, timeout=120, check=False)
    assert report.returncode == 0, report.stderr
    assert f"safetensors: write {ref['write_ratio']:.2f}× the engine's" in report.stdout, report.stdout
    keys = ["--trusted-keys", str(h["dir"] / "trusted-keys.yaml")]
    proc = subprocess.run([str(BIN / "mlckpt-check"), "compare", str(h["llama3_8b"]), str(m["bundle"]),
                           "--json", *keys], env=cli_env(), text=True, capture_output=True, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    rows = {r["key"]: r for r in json.loads(proc.stdout)["metrics"]}
    assert (rows["framework"]["a"], rows["framework"]["b"]) == (None, "safetensors")
    assert rows["framework_write_ratio"]["b"] == pytest.approx(ref["write_ratio"])
    assert rows["framework_read_ratio"]["b"] == pytest.approx(ref["read_ratio"])
    if m["status"] == 6:
        return  # a disturbed result is on no leaderboard
    root = tree_of(h, tmp_path / "t", m["bundle"], h["llama3_8b"])
    (root / "trusted-keys.yaml").write_text((h["dir"] / "trusted-keys.yaml").read_text())
    out = tmp_path / "lb.json"
    board = subprocess.run([str(BIN / "mlckpt-check"), "leaderboard", str(root), "--format", "json",
                            "--out", str(out)], env=cli_env(), text=True, capture_output=True, timeout=300,
                           check=False)
    assert board.returncode == 0, board.stdout + board.stderr
    classes = json.loads(out.read_text())["classes"]
    [lib] = [c for c in classes if any("through safetensors" in r["mode"] for r in c["rows"])]
    assert lib["id"].endswith("-sync-safetensors") and len(lib["rows"]) == 1  # a class of its own
    assert f"write {ref['write_ratio']:.2f}×" in lib["rows"][0]["mode"]
