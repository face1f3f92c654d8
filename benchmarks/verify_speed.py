"""How fast is bundle verification compared with `sha256sum`?

Creates 1 GiB of random files (8 x 128 MiB by default) in a temporary folder on the current
filesystem (or --dir), signs them as a bundle, then times, with a warm page cache and best of
--repeat runs, ``sha256sum`` over the files and :func:`mlckpt.bundle.verify_bundle` over the
bundle, and prints both rates and their ratio (target: verify >= 0.80 x sha256sum).

    .venv/bin/python benchmarks/verify_speed.py [--files 8] [--mib 128] [--repeat 3] [--dir .]

Exit status 0 when the ratio meets --target, 1 otherwise.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from mlckpt import __version__, bundle
from mlckpt.bundle import _common as bundle_common
from mlckpt.bundle import _fs as bundle_fs


def make_files(folder: Path, count: int, mib: int) -> list[Path]:
    paths = []
    chunk = 8 << 20
    for i in range(count):
        p = folder / "data" / f"file_{i:02d}.bin"
        p.parent.mkdir(parents=True, exist_ok=True)
        with open(p, "wb") as f:
            left = mib << 20
            while left:
                n = min(chunk, left)
                f.write(os.urandom(n))
                left -= n
        paths.append(p)
    (folder / "run.json").write_text('{"benchmark": "verify_speed"}\n')
    return paths


def best_of(repeat: int, fn) -> float:  # type: ignore[no-untyped-def]
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--mib", type=int, default=128, help="size of each file in MiB")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=Path.cwd(), help="where to create the temp folder")
    ap.add_argument("--target", type=float, default=0.80)
    args = ap.parse_args(argv)

    sha256sum = shutil.which("sha256sum")
    if not sha256sum:
        print("sha256sum not found", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="mlckpt-verify-speed-", dir=args.dir))
    try:
        folder = tmp / "bundle"
        folder.mkdir()
        paths = make_files(folder, args.files, args.mib)
        total = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
        key = Ed25519PrivateKey.generate()
        predicate = bundle.Predicate(
            run_id="verify-speed",
            mlckpt_version=__version__,
            runner_code_sha256=bundle.code_digest(),
            rules_version="1.0",
            workload="llama3_8b",
            division="open",
            started="2026-01-01T00:00:00Z",
            ended="2026-01-01T00:00:01Z",
        )
        t_sign = best_of(1, lambda: bundle.sign_bundle(folder, key, predicate))
        # Warm the page cache for both contenders.
        subprocess.run([sha256sum, *map(str, paths)], check=True, capture_output=True)

        def run_sha256sum() -> None:
            subprocess.run([sha256sum, *map(str, paths)], check=True, capture_output=True)

        def run_verify() -> None:
            bundle.verify_bundle(folder)

        def run_single_thread() -> None:  # for reference: one hashlib stream, no pool
            for p in paths:
                h = hashlib.sha256()
                with open(p, "rb", buffering=0) as f:
                    buf = bytearray(bundle_common.HASH_CHUNK)
                    view = memoryview(buf)
                    while n := f.readinto(view):
                        h.update(view[:n])

        t_sum = best_of(args.repeat, run_sha256sum)
        t_ver = best_of(args.repeat, run_verify)
        t_one = best_of(args.repeat, run_single_thread)
        gb = total / 1e9
        ratio = t_sum / t_ver
        try:
            cpus = len(os.sched_getaffinity(0))
        except AttributeError:
            cpus = os.cpu_count() or 1
        print(f"data: {args.files} files x {args.mib} MiB = {total / 2**30:.3f} GiB in {tmp}")
        print(
            f"cpus: {cpus}; hash threads: {bundle_fs._hash_workers()}; "
            f"read size {bundle_common.HASH_CHUNK >> 20} MiB"
        )
        print(f"sign (cold-ish, once):          {gb / t_sign:6.2f} GB/s  ({t_sign:.3f} s)")
        print(f"sha256sum (best of {args.repeat}):         {gb / t_sum:6.2f} GB/s  ({t_sum:.3f} s)")
        print(f"verify_bundle (best of {args.repeat}):     {gb / t_ver:6.2f} GB/s  ({t_ver:.3f} s)")
        print(f"hashlib 1 thread (best of {args.repeat}):  {gb / t_one:6.2f} GB/s  ({t_one:.3f} s)")
        verdict = "OK" if ratio >= args.target else "BELOW TARGET"
        print(f"ratio verify/sha256sum: {ratio:.2f} (target >= {args.target:.2f}) {verdict}")
        return 0 if ratio >= args.target else 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
