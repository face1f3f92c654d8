"""GPU-resident state (rules 1.7, ``state.source=gpu``).

On a machine without CUDA the engine's calls run through PyTorch's CPU tensors (``device=cpu``):
the same uploads, downloads, wiped tags and verification, with no streams to overlap.  Those tests
skip with a reason where PyTorch is not installed (``pip install 'mlckpt[gpu]'``); the CUDA-only
behaviour (pinning, the copy stream, training kernels) was measured on an H200 host
(benchmarks/README.md, gpu_stall.py).  The runs below are real ``mpiexec`` jobs: the CPU fallback
path end to end, its bundle judged invalid as a GPU result, forgeries of a GPU bundle caught by the
checker, and a GPU run refused before any I/O on a host with no CUDA device.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from support.cli import CHECKER_DESCRIPTION, cli_env
from support.forge import edit_json, edit_records, resign
from support.runs import printed_bundle

from mlckpt import bundle, engine
from mlckpt.errors import UsageError

BIN = Path(sys.executable).parent
RUN = [str(BIN / "mlckpt"), "run", "workload=llama3_8b", "division=open", "scale=0.001", "ranks=2",
       "checkpoint.num_writes=2", "checkpoint.num_reads=2", "io.direct=false", "output.root=results"]


def host_name() -> str:
    import socket

    return socket.gethostname()


def _torch() -> Any:
    return pytest.importorskip("torch", reason="PyTorch is not installed (pip install 'mlckpt[gpu]')")


def _no_cuda() -> None:
    if _torch().cuda.is_available():
        pytest.skip("a CUDA device is present: this test is of a host without one")


# --------------------------------------------------------------------------- content (pure numpy)
def test_wipe_tags_zeroes_every_page_tag_and_nothing_else() -> None:
    n = 3 * engine.PAGE + 100  # a final partial page longer than a tag
    buf = engine.alloc(n)
    key, pid = bytes(range(16)), engine.PageId(7, 1, 2, 0)
    engine.fill(buf, n, key, pid)
    before = buf[:n].copy()
    engine.wipe_tags(buf, n)
    for page in range(4):
        start = page * engine.PAGE
        assert not buf[start : start + engine.TAG_BYTES].any()
        end = min(start + engine.PAGE, n)
        assert (buf[start + engine.TAG_BYTES : end] == before[start + engine.TAG_BYTES : end]).all()
    bad = engine.verify(buf, n, key, pid)
    assert bad is not None and bad.offset == 0  # a wiped buffer can never pass as the content


# --------------------------------------------------------------------------- the engine, CPU fallback
def test_device_round_trip_through_wiped_tags() -> None:
    _torch()
    from mlckpt.engine import gpu

    n = 5 * engine.PAGE
    arena = engine.alloc(n)
    key, pid = b"k" * 16, engine.PageId(1, 0, 1, 0)
    engine.fill(arena, n, key, pid)
    dev = gpu.open_state("cpu", 0, n)
    dev.pin(arena)  # nothing to pin on the CPU
    assert dev.pinned == [] and dev.nbytes == n
    dev.upload(arena, n)
    engine.wipe_tags(arena, n)
    assert engine.verify(arena, n, key, pid) is not None
    dev.download(arena, n)  # the device's copy is what comes back
    assert engine.verify(arena, n, key, pid) is None
    d = dev.describe()
    assert (d["library"], d["device"], d["device_type"], d["copy_path"]) == (
        "torch", "cpu", "cpu", gpu.CPU_COPY_PATH)
    rates = dev.probe(arena, nbytes=n, rounds=2)
    assert set(rates) == {"d2h_gib_s", "h2d_gib_s"} and all(v > 0 for v in rates.values())
    dev.close()
    assert dev.state is None


def test_training_on_the_cpu_fallback_waits_out_the_interval() -> None:
    _torch()
    from mlckpt.engine import gpu

    dev = gpu.open_state("cpu", 0, engine.PAGE)
    until = time.perf_counter_ns() + 50_000_000
    assert dev.train(until) == 0  # no kernels: nothing to overlap on a CPU
    assert time.perf_counter_ns() >= until
    assert dev.train(time.perf_counter_ns() - 1) == 0  # an interval already over: returns at once


def test_a_host_without_cuda_is_refused_with_the_reason() -> None:
    _no_cuda()
    from mlckpt.engine import gpu

    facts, problem = gpu.probe_host(None)
    assert facts is None and problem is not None and problem.startswith("no CUDA device (torch ")
    with pytest.raises(UsageError, match=r"^state\.source=gpu: no CUDA device on this host$"):
        gpu.open_state("auto", 0, engine.PAGE)
    facts, problem = gpu.probe_host("cpu")
    assert problem is None and facts is not None and facts["device_type"] == "cpu" and facts["count"] == 0


def test_missing_library_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from mlckpt.engine import gpu

    monkeypatch.setitem(sys.modules, "torch", None)  # import torch now raises ImportError
    facts, problem = gpu.probe_host(None)
    assert facts is None and problem == "PyTorch is not installed on this host (pip install 'mlckpt[gpu]')"


# --------------------------------------------------------------------------- real runs
@pytest.fixture(scope="module")
def gpu_world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    d = tmp_path_factory.mktemp("gpu")
    info = bundle.generate_key(d / "org.pem")
    (d / "trusted-keys.yaml").write_text(
        f'mlckpt_trusted_keys: "1.0"\norganizations:\n  example-org: ["{info.public_key}"]\n')
    (d / "laptop-ext4.yaml").write_text(CHECKER_DESCRIPTION)
    return {"dir": d, "env": {**cli_env(), "XDG_CONFIG_HOME": str(d / "xdg")}}


def _run(w: dict[str, Any], cwd: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    args = [*RUN, f"signing.key={w['dir'] / 'org.pem'}", f"system={w['dir'] / 'laptop-ext4.yaml'}", *extra]
    return subprocess.run(args, cwd=cwd, env=w["env"], text=True, capture_output=True, timeout=240,
                          check=False)


def _check(w: dict[str, Any], folder: Path, tmp: Path) -> dict[str, Any]:
    root = tmp / "tree"
    (root / "open" / "example-org" / "systems").mkdir(parents=True)
    shutil.copy(w["dir"] / "laptop-ext4.yaml", root / "open" / "example-org" / "systems" / "laptop-ext4.yaml")
    dest = root / "open" / "example-org" / "results" / "laptop-ext4" / "llama3_8b"
    dest.mkdir(parents=True)
    shutil.copytree(folder, dest / folder.name)
    proc = subprocess.run([str(BIN / "mlckpt-check"), "check", str(root), "--trusted-keys",
                           str(w["dir"] / "trusted-keys.yaml"), "--json", str(tmp / "r.json"), "-q"],
                          text=True, capture_output=True, timeout=120, check=False)
    [b] = json.loads((tmp / "r.json").read_text())["bundles"]
    return {"exit": proc.returncode, **b}


def _records(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(ln) for ln in (folder / "records.jsonl").read_text().splitlines()]


@pytest.mark.mpi
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_cpu_fallback_runs_the_whole_path_and_is_no_gpu_result(gpu_world: dict[str, Any], tmp_path: Path,
                                                                mode: str) -> None:
    """Every write copies out of the 'device', every restore ends in it and is verified from it;
    the bundle states the CPU fallback, and the runner and the checker both judge it invalid as a
    GPU result (GPU-SOURCE-RECORDED, one finding per rank) and nothing else."""
    _torch()
    extra = ["checkpoint.mode=async", "checkpoint.compute_interval_s=0.3"] if mode == "async" else []
    proc = _run(gpu_world, tmp_path, "state.source=gpu", "state.gpu.device=cpu", *extra)
    assert proc.returncode == 5, proc.stderr
    assert len(re.findall(r"^read \d/2: .* verified, 0\.0% cached before\)$", proc.stdout, re.M)) == 2
    assert "GPU copy rates again" in proc.stdout  # probed again after the last restore
    folder = printed_bundle(proc)
    run = json.loads((folder / "run.json").read_text())
    assert (run["run_format"], run["records_format"], run["verdict"]) == (13, 14, "invalid")
    state = run["state"]
    assert state["source"] == "gpu" and state["library"] == "torch"
    assert [(e["rank"], e["device_type"]) for e in state["ranks"]] == [(0, "cpu"), (1, "cpu")]
    assert all(e["d2h_gib_s"] > 0 and e["h2d_gib_s"] > 0 for e in state["ranks"])
    found = [f for f in run["findings"] if f["severity"] != "ok"]
    assert {f["rule"] for f in found} == {"GPU-SOURCE-RECORDED"}
    assert sorted(f["message"].split(":")[0] + " … " + f["message"].rsplit(": ", 1)[1] for f in found) == [
        "host vm … expected CUDA devices ['cpu'], got cpu []".replace("vm", host_name()),
        "rank 0 … expected a CUDA device, got cpu (cpu)", "rank 1 … expected a CUDA device, got cpu (cpu)"]
    recs = _records(folder)
    assert len(recs) == 8 and all(r["device_copy_ns"] > 0 for r in recs)
    for r in recs:
        inside = r["t1_ns"] - r["t0_ns"]
        if mode == "async" and r["op"] == "write":  # the stall's memory stage is the copy itself
            [stage] = [s for s in r["stages"] if s["tier"] == "memory"]
            inside = stage["t1_ns"] - stage["t0_ns"]
        assert r["device_copy_ns"] <= inside
    host = json.loads((folder / "system.json").read_text())["hosts"][0]
    assert host["gpus"]["device_type"] == "cpu" and host["gpus"]["library"] == "torch"
    verdict = _check(gpu_world, folder, tmp_path)
    assert verdict["verdict"] == "invalid" and verdict["integrity"] == "ok"
    assert {f["rule"] for f in verdict["findings"] if f["severity"] == "invalid"} == {"GPU-SOURCE-RECORDED"}


@pytest.mark.mpi
def test_forged_gpu_bundles_are_caught(gpu_world: dict[str, Any], tmp_path: Path) -> None:
    """A CPU-fallback bundle re-labelled as CUDA passes only while its copies hold up: copies
    faster than 3× the rank's probe (rules 1.8; 1.5× under 1.7), a copy longer than its op, a record
    without its copy, and a host-memory claim over device copies are each named; the honest relabel
    is not."""
    _torch()
    proc = _run(gpu_world, tmp_path, "state.source=gpu", "state.gpu.device=cpu")
    assert proc.returncode == 5, proc.stderr
    src, key = printed_bundle(proc), bundle.load_private_key(gpu_world["dir"] / "org.pem")

    def cuda(run: dict[str, Any], d2h: float = 1e6) -> None:
        for e in run["state"]["ranks"]:
            e.update(device_type="cuda", device="cuda:0", device_name="NVIDIA H200", d2h_gib_s=d2h,
                     h2d_gib_s=1e6)
        run["findings"] = [f for f in run["findings"] if f["rule"] != "GPU-SOURCE-RECORDED"]
        run["verdict"] = "open"

    def first(op: str, fn: Any) -> Any:
        def apply(rs: list[dict[str, Any]]) -> None:
            fn(next(r for r in rs if r["op"] == op))
        return apply

    def gpus(system: dict[str, Any]) -> None:
        system["hosts"][0]["gpus"].update(device_type="cuda", count=1, names=["NVIDIA H200"])

    def relabel(f: Path, d2h: float = 1e6) -> None:
        edit_json(f, "run.json", lambda r: cuda(r, d2h))
        edit_json(f, "system.json", gpus)

    cases = {
        "relabelled": (relabel, None),
        "hosts still say cpu": (lambda f: edit_json(f, "run.json", cuda),
                                "expected CUDA devices ['NVIDIA H200'], got cpu []"),
        "fast copies": (lambda f: relabel(f, d2h=0.001), "a copy at most 3× the rank's 0.001 GiB/s"),
        "copy longer than its op": (lambda f: (relabel(f), edit_records(f, first(
            "write", lambda r: r.update(device_copy_ns=r["t1_ns"] - r["t0_ns"] + 1)))),
            "expected at most the op ("),
        "no copy recorded": (lambda f: (relabel(f), edit_records(f, first(
            "read", lambda r: r.pop("device_copy_ns")))), "expected device_copy_ns on the record, got none"),
        "host memory claimed": (lambda f: edit_json(f, "run.json", lambda r: r.update(state=None)),
                                "expected state.source='gpu', got None"),
    }
    for name, (mutate, fragment) in cases.items():
        folder = tmp_path / name.replace(" ", "-") / src.name
        shutil.copytree(src, folder)
        mutate(folder)
        resign(folder, key)
        v = _check(gpu_world, folder, tmp_path / name.replace(" ", "-"))
        hits = [f["message"] for f in v["findings"] if f["rule"] == "GPU-SOURCE-RECORDED"]
        if fragment is None:
            assert hits == [] and v["integrity"] == "ok", (name, v["findings"])
        else:
            assert v["verdict"] == "invalid" and any(fragment in m for m in hits), (name, hits)


@pytest.mark.mpi
def test_gpu_run_on_a_host_without_cuda_is_refused_before_any_io(gpu_world: dict[str, Any],
                                                                 tmp_path: Path) -> None:
    _no_cuda()
    proc = _run(gpu_world, tmp_path, "state.source=gpu", "checkpoint.folder=ck")
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and re.fullmatch(
        r"mlckpt: error: \[GPU-USABLE\] host \S+: state\.source=gpu needs the array library .* and a CUDA "
        r"device on every host: no CUDA device \(torch .*\)", lines[0]), lines
    assert not (tmp_path / "ck").exists() and not (tmp_path / "results").exists()
    assert "Traceback" not in proc.stderr + proc.stdout
