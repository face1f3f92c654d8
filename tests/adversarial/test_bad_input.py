"""Bad input to every command: exit status 2, exactly one line on stderr naming the key or rule, no
traceback, and nothing written anywhere.

Each case runs in a fresh empty working folder with a fresh empty ``XDG_CONFIG_HOME``; afterwards
both must still be empty, and the shared input files (a plain file, a read-only folder, files with
invalid UTF-8, ...) must be exactly as they were.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
MLCKPT = BIN / "mlckpt"
CHECK = BIN / "mlckpt-check"
TIMEOUT_S = 60

# Placeholders in a case's arguments, replaced by paths in the shared inputs folder:
#   {file}     a regular file              {ro}     a folder nobody may write (a read-only mount)
#   {dir}      an empty folder             {bad8}   a file that is not valid UTF-8
#   {array}    a JSON array                {pem}    a file that is not a PEM key
#   {missing}  a path that does not exist


@dataclass(frozen=True)
class Case:
    cmd: str  # "mlckpt" or "mlckpt-check"
    args: tuple[str | bytes, ...]
    says: str  # a fragment the one line must contain (the key, rule or path at fault)
    bug: str | None = None  # a known defect: the case is expected to fail (strict xfail)


def mk(cmd: str, *args: str | bytes, says: str, bug: str | None = None) -> Case:
    return Case(cmd, args, says, bug)


M, C = "mlckpt", "mlckpt-check"
CASES: dict[str, Case] = {
    # ---- plan: unknown keys, wrong types, out-of-range counts, structure rules
    "plan-unknown-key": mk(M, "plan", "bogus=1", says="bogus: unknown key"),
    "plan-unknown-nested-key": mk(M, "plan", "checkpoint.bogus=1", says="checkpoint.bogus: unknown key"),
    "plan-unknown-workload": mk(M, "plan", "workload=llama9_9t",
                                says="workload: unknown workload 'llama9_9t'"),
    "plan-ranks-zero": mk(M, "plan", "ranks=0", says="ranks"),
    "plan-ranks-negative": mk(M, "plan", "ranks=-8", says="ranks"),
    "plan-ranks-absurd": mk(M, "plan", "ranks=99999999999", says="ranks"),
    "plan-ranks-text": mk(M, "plan", "ranks=eight", says="ranks"),
    "plan-ranks-float": mk(M, "plan", "ranks=8.5", says="ranks"),
    "plan-ranks-not-multiple": mk(M, "plan", "workload=llama3_70b", "ranks=12", says="[RANKS-MULTIPLE]"),
    "plan-scale-zero": mk(M, "plan", "division=open", "scale=0", says="scale"),
    "plan-scale-above-one": mk(M, "plan", "division=open", "scale=2", says="scale"),
    "plan-division": mk(M, "plan", "division=semi", says="division"),
    "plan-writes-zero": mk(M, "plan", "checkpoint.num_writes=0", says="[COUNTS-POSITIVE]"),
    "plan-writes-absurd": mk(M, "plan", "checkpoint.num_writes=1000000000", says="checkpoint.num_writes"),
    "plan-reads-negative": mk(M, "plan", "checkpoint.num_reads=-1", says="checkpoint.num_reads"),
    "plan-threads-zero": mk(M, "plan", "io.threads=0", says="io.threads"),
    "plan-block-size": mk(M, "plan", "io.block_size=5000", says="io.block_size"),
    "plan-timeout-negative": mk(M, "plan", "io.timeout_s=-1", says="io.timeout_s"),
    "plan-timeout-text": mk(M, "plan", "io.timeout_s=soon", says="io.timeout_s"),
    "plan-hosts-zero": mk(M, "plan", "hosts=0", says="hosts"),
    "plan-mode-unknown": mk(M, "plan", "checkpoint.mode=lazy", says="checkpoint.mode"),
    "plan-compute-negative": mk(M, "plan", "checkpoint.compute_interval_s=-1",
                                says="checkpoint.compute_interval_s"),
    "plan-compute-text": mk(M, "plan", "checkpoint.compute_interval_s=long",
                            says="checkpoint.compute_interval_s"),
    "plan-fast-keep-negative": mk(M, "plan", "checkpoint.tiers.fast_keep=-1",
                                  says="checkpoint.tiers.fast_keep"),
    "plan-fast-empty": mk(M, "plan", "checkpoint.tiers.fast=''", says="checkpoint.tiers.fast"),
    "plan-tiers-unknown-key": mk(M, "plan", "checkpoint.tiers.slow=/x", says="checkpoint.tiers.slow"),
    "plan-async-stream": mk(M, "plan", "division=open", "checkpoint.mode=async", "residency=stream",
                            says="[ASYNC-RESIDENCY]"),
    "plan-tiers-nested": mk(M, "plan", "division=open", "checkpoint.tiers.fast=./mlckpt-checkpoints/fast",
                            says="[TIERS-DISTINCT]"),
    "plan-memory-negative": mk(M, "plan", "host_memory_gib=-5", says="host_memory_gib"),
    "plan-section-replaced": mk(M, "plan", "checkpoint=5", says="checkpoint"),
    "plan-rules-version": mk(M, "plan", "rules_version=9.9", says="9.9"),
    "plan-no-equals": mk(M, "plan", "ranks", says="expected KEY=VALUE"),
    "plan-unknown-option": mk(M, "plan", "--bogus", says="--bogus"),
    "plan-invalid-utf8-arg": mk(M, "plan", b"workload=llama\xff", says="workload: unknown workload"),
    "plan-zero-pipeline": mk(M, "plan", "workload.parallelism.pipeline=0",
                             says="workload.parallelism.pipeline"),
    # ---- size
    "size-no-interval": mk(M, "size", "--overhead", "5%", says="--interval"),
    "size-interval-zero": mk(M, "size", "--interval", "0", "--overhead", "5%", says="duration: '0'"),
    "size-interval-text": mk(M, "size", "--interval", "soon", "--overhead", "5%", says="soon"),
    "size-overhead-above-100": mk(M, "size", "--interval", "30m", "--overhead", "150%", says="150%"),
    "size-bandwidth-negative": mk(M, "size", "--interval", "30m", "--bandwidth=-1GiB/s", says="-1GiB/s"),
    "size-bandwidth-dash-value": mk(M, "size", "--interval", "30m", "--bandwidth", "-1GiB/s",
                                    says="--bandwidth: expected one argument"),
    "size-both-targets": mk(M, "size", "--interval", "30m", "--overhead", "5%", "--bandwidth", "1GiB/s",
                            says="not allowed with argument"),
    "size-interval-absurd": mk(M, "size", "--interval", "1e400h", "--overhead", "5%", says="1e400h"),
    # ---- config
    "config-unknown-io-key": mk(M, "config", "io.bogus=1", says="io.bogus: unknown key"),
    "config-restore-mode": mk(M, "config", "checkpoint.restore=all", says="checkpoint.restore"),
    "config-stream-buffer": mk(M, "config", "stream_buffer_bytes=1000", says="stream_buffer_bytes"),
    "config-keep-not-bool": mk(M, "config", "checkpoint.keep=maybe", says="checkpoint.keep"),
    # ---- run: refused before anything is spawned or written
    "run-folder-is-a-file": mk(M, "run", "division=open", "scale=0.001", "ranks=4",
                               "checkpoint.folder={file}", says="[FOLDER-USABLE]"),
    "run-folder-under-a-file": mk(M, "run", "division=open", "scale=0.001", "ranks=4",
                                  "checkpoint.folder={file}/ck", says="[FOLDER-USABLE]"),
    "run-folder-read-only": mk(M, "run", "division=open", "scale=0.001", "ranks=4",
                               "checkpoint.folder={ro}/ck", says="not writable"),
    "run-output-is-a-file": mk(M, "run", "division=open", "scale=0.001", "ranks=4",
                               "output.root={file}", says="output.root"),
    "run-output-read-only": mk(M, "run", "division=open", "scale=0.001", "ranks=4",
                               "output.root={ro}/results", says="output.root"),
    "run-system-missing": mk(M, "run", "division=open", "scale=0.001", "ranks=4", "system={missing}",
                             says="missing"),
    "run-system-invalid-utf8": mk(M, "run", "division=open", "scale=0.001", "ranks=4", "system={bad8}",
                                  says="bad8"),
    # the runner reads a system description with the checker's strict loader (mlckpt.strict)
    "run-system-duplicate-key": mk(M, "run", "division=open", "scale=0.001", "ranks=4", "system={dupkey}",
                                   says="duplicate key 'system_name'"),
    "run-system-anchor": mk(M, "run", "division=open", "scale=0.001", "ranks=4", "system={anchor}",
                            says="YAML anchor &'n' is not allowed"),
    "run-signing-key-missing": mk(M, "run", "division=open", "scale=0.001", "ranks=4",
                                  "signing.key={missing}", says="missing"),
    "run-signing-key-garbage": mk(M, "run", "division=open", "scale=0.001", "ranks=4",
                                  "signing.key={pem}", says="not a PEM private key"),
    "run-closed-counts": mk(M, "run", "division=closed", "checkpoint.num_writes=2", says="[CLOSED-COUNTS]"),
    "run-multirun-bad-sweep": mk(M, "run", "-m", "ranks=4,", "division=open", says="cannot parse override"),
    # ---- keygen / sign / verify / pack
    "keygen-exists": mk(M, "keygen", "--out", "{file}", says="{file}"),
    "keygen-under-a-file": mk(M, "keygen", "--out", "{file}/key.pem", says="{file}"),
    "keygen-read-only": mk(M, "keygen", "--out", "{ro}/key.pem", says="{ro}"),
    "keygen-passphrase-unset": mk(M, "keygen", "--out", "{missing}", "--passphrase-env", "MLCKPT_NOPE",
                                  says="MLCKPT_NOPE"),
    "sign-missing": mk(M, "sign", "{missing}", says="{missing}"),
    "sign-a-file": mk(M, "sign", "{file}", says="not a bundle folder"),
    "sign-unsigned-no-predicate": mk(M, "sign", "{dir}", says="--predicate"),
    "sign-predicate-invalid-utf8": mk(M, "sign", "{dir}", "--predicate", "{bad8}", says="--predicate"),
    "sign-predicate-array": mk(M, "sign", "{dir}", "--predicate", "{array}", says="JSON object"),
    "sign-key-garbage": mk(M, "sign", "{dir}", "--predicate", "{obj}", "--key", "{pem}",
                           says="not a PEM private key"),
    "verify-missing": mk(M, "verify", "{missing}", says="{missing}"),
    "verify-org-without-keys": mk(M, "verify", "{dir}", "--org", "acme", says="--trusted-keys"),
    "verify-keys-invalid-utf8": mk(M, "verify", "{dir}", "--trusted-keys", "{bad8}", says="bad8"),
    "verify-keys-missing": mk(M, "verify", "{dir}", "--trusted-keys", "{missing}", says="missing"),
    "pack-missing": mk(M, "pack", "{missing}", says="{missing}"),
    "pack-out-exists": mk(M, "pack", "{dir}", "--out", "{file}", says="already exists"),
    "unknown-command": mk(M, "frobnicate", says="frobnicate"),
    # ---- mlckpt-check
    "check-root-missing": mk(C, "{missing}", says="{missing}"),
    "check-root-a-file": mk(C, "{file}", says="not a folder"),
    "check-no-trusted-keys": mk(C, "{dir}", says="trusted keys"),
    "check-jobs-zero": mk(C, "{dir}", "--jobs", "0", "--trusted-keys", "{keys}", says="--jobs"),
    "check-jobs-text": mk(C, "{dir}", "--jobs", "many", says="--jobs"),
    "check-rules-version": mk(C, "{dir}", "--rules", "9.9", "--trusted-keys", "{keys}", says="9.9"),
    "check-keys-invalid-utf8": mk(C, "{dir}", "--trusted-keys", "{bad8}", says="bad8"),
    "check-keys-array": mk(C, "{dir}", "--trusted-keys", "{array}", says="must be a mapping"),
    "check-keys-anchor": mk(C, "{dir}", "--trusted-keys", "{anchor}", says="YAML anchor &'n' is not allowed"),
    "check-unknown-option": mk(C, "{dir}", "--bogus", says="--bogus"),
    "check-json-under-a-file": mk(C, "{dir}", "--trusted-keys", "{keys}", "--json", "{file}/report.json",
                                  says="--json"),
}


# ---------------------------------------------------------------------------------------------
# running every case (concurrently: each has its own working folder, config home and inputs)


@dataclass
class Outcome:
    returncode: int
    stdout: str
    stderr: str
    paths: dict[str, str]  # placeholder -> path
    changed: list[str]  # what differs afterwards in the working folder, config home and inputs


def _make_inputs(base: Path, ro: Path) -> dict[str, str]:
    base.mkdir()
    (base / "plain.txt").write_text("a plain file\n")
    (base / "empty").mkdir()
    (base / "bad8.yaml").write_bytes(b"system_name: caf\xe9\nvendor: \xff\xfe\n")
    (base / "array.json").write_text("[1, 2, 3]\n")
    (base / "dupkey.yaml").write_text("description_format: 1\nsystem_name: a\nsystem_name: b\n")
    (base / "anchor.yaml").write_text("description_format: 1\nsystem_name: &n a\nsubmitter: *n\n")
    (base / "obj.json").write_text('{"run_id": "x"}\n')
    (base / "garbage.pem").write_text("-----BEGIN PRIVATE KEY-----\nnot base64\n-----END PRIVATE KEY-----\n")
    (base / "keys.yaml").write_text('mlckpt_trusted_keys: "1.0"\norganizations:\n  acme:\n'
                                    '    - ed25519:VY4tXzzi1DatDZCJj6xW6H52mMDwJ2kedmZhhhPJH6Y=\n')
    paths = {"file": base / "plain.txt", "dir": base / "empty", "bad8": base / "bad8.yaml",
             "array": base / "array.json", "obj": base / "obj.json", "pem": base / "garbage.pem",
             "keys": base / "keys.yaml", "ro": ro,
             "dupkey": base / "dupkey.yaml", "anchor": base / "anchor.yaml", "missing": base / "missing"}
    return {k: str(v) for k, v in paths.items()}


def tree(folder: Path) -> dict[str, tuple[int, int, int, bytes]]:
    out = {}
    for p in sorted(folder.rglob("*")):
        st = p.lstat()
        out[str(p.relative_to(folder))] = (st.st_mode, st.st_size, st.st_mtime_ns,
                                           p.read_bytes() if p.is_file() else b"")
    return out


def expand(arg: str | bytes, paths: dict[str, str]) -> str | bytes:
    if isinstance(arg, bytes):
        return arg
    for k, v in paths.items():
        arg = arg.replace("{" + k + "}", v)
    return arg


def _run_case(case: Case, where: Path, ro: Path) -> Outcome:
    cwd, xdg = where / "cwd", where / "xdg"
    where.mkdir()
    cwd.mkdir()
    xdg.mkdir()
    paths = _make_inputs(where / "in", ro)
    before = tree(where)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MLCKPT_", "PMI_", "PMIX_", "OMPI_", "HYDRA_"))}
    env["XDG_CONFIG_HOME"] = str(xdg)
    exe = MLCKPT if case.cmd == M else CHECK
    cp = subprocess.run([str(exe), *(expand(a, paths) for a in case.args)], cwd=cwd, env=env,
                        capture_output=True, timeout=TIMEOUT_S, check=False)
    after = tree(where)
    changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
    return Outcome(cp.returncode, cp.stdout.decode("utf-8", "replace"),
                   cp.stderr.decode("utf-8", "replace"), paths, changed)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Outcome]]:
    base = tmp_path_factory.mktemp("bad-input")
    ro = base / "read-only"
    ro.mkdir()
    mounted = False
    if os.geteuid() == 0:  # root writes through permissions: only a read-only mount stops it
        cp = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64g", "tmpfs", str(ro)],
                            capture_output=True, check=False)
        mounted = cp.returncode == 0
    else:
        ro.chmod(0o555)
    usable = {n: c for n, c in CASES.items()
              if mounted or os.geteuid() != 0 or not any("{ro}" in str(a) for a in c.args)}
    try:
        with ThreadPoolExecutor(max_workers=4) as pool:
            futures = {n: pool.submit(_run_case, c, base / n, ro) for n, c in usable.items()}
            yield {n: f.result() for n, f in futures.items()}
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(ro)], check=False)


# ---------------------------------------------------------------------------------------------
# the table


def test_the_table_is_broad() -> None:
    assert len(CASES) >= 40
    commands = {c.args[0] if c.cmd == M else "check" for c in CASES.values()}
    assert {"plan", "size", "config", "run", "keygen", "sign", "verify", "pack", "check"} <= commands


@pytest.mark.parametrize("name", [
    pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=c.bug)) if c.bug else n
    for n, c in CASES.items()])
def test_bad_input_is_refused_in_one_error_line_and_writes_nothing(name: str,
                                                                   outcomes: dict[str, Outcome]) -> None:
    if name not in outcomes:
        pytest.skip("no read-only folder here (root, and no tmpfs mount)")
    case, out = CASES[name], outcomes[name]
    assert "Traceback" not in out.stderr, out.stderr
    assert out.returncode == 2, f"exit {out.returncode}\nstdout:\n{out.stdout}\nstderr:\n{out.stderr}"
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    # one error line; a refusal for several rules lists each other one on a line of its own
    assert lines[0].startswith(f"{case.cmd}: error: "), lines[0]
    assert all(ln.startswith("  also: [") for ln in lines[1:]), out.stderr
    assert str(expand(case.says, out.paths)) in lines[0], lines[0]
    assert "bundle:" not in out.stdout
    # nothing written: not in the working folder, not in the config home, not among the inputs
    assert out.changed == [], out.changed
