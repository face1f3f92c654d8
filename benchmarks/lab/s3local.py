"""A real S3-compatible object store on the loopback address: OpenStack Swift's all-in-one (Debian's
``swift-proxy``/``swift-object``/``swift-container``/``swift-account`` packages) with its built-in
S3 API (the ``s3api`` middleware, multipart uploads through SLO) and ``tempauth`` accounts.

One device folder, one replica, rings built here; every server on its own loopback port.  Used by
the tests and the object-storage benchmarks, and by hand for a local try::

    .venv/bin/python benchmarks/lab/s3local.py /tmp/s3store --bucket ckpt  # prints AWS_* exports

Swift runs under Debian's own Python (``/usr/bin/python3``), not the project's virtual
environment.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ACCESS_KEY = "test:tester"  # tempauth's account:user, as S3 access key
SECRET_KEY = "testing"
REGION = "us-east-1"
SERVERS = ("account", "container", "object")
PROXY = "/usr/bin/swift-proxy-server"


def unavailable() -> str | None:
    """Why no Swift store can be started here, or None."""
    missing = [
        p
        for p in (PROXY, *(f"/usr/bin/swift-{s}-server" for s in SERVERS), "/usr/bin/swift-ring-builder")
        if not os.path.exists(p)
    ]
    if missing:
        return (
            f"OpenStack Swift is not installed ({missing[0]} missing; "
            "apt-get install swift-proxy swift-object "
            "swift-container swift-account)"
        )
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Store:
    """A running store; ``env`` is what an AWS SDK (and mlckpt) reads."""

    root: Path
    port: int
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": REGION,
        }

    def stop(self, grace_s: float = 5.0) -> None:
        """SIGTERM to every server's process group at once, SIGKILL to what is left after one
        shared grace period: bounded on a busy machine, where each server's own shutdown (its
        workers, a last fsync) can take seconds."""
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while any(p.poll() is None for p in self.procs) and time.monotonic() < deadline:
            time.sleep(0.05)
        for p in self.procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(10)
        self.procs.clear()

    def logs(self) -> str:
        return "".join(
            (self.root / f"{n}.log").read_text(errors="replace")[-3000:]
            for n in (*SERVERS, "proxy")
            if (self.root / f"{n}.log").exists()
        )


_COMMON = """[DEFAULT]
bind_ip = 127.0.0.1
bind_port = {port}
swift_dir = {etc}
devices = {srv}
mount_check = false
disable_fallocate = true
workers = {workers}
log_facility = LOG_LOCAL2
log_level = WARNING
log_name = {name}
# Swift drops privileges to this user: the one running the store owns its data.
user = {user}
"""

_SERVER = (
    _COMMON
    + """
[pipeline:main]
pipeline = {name}-server

[app:{name}-server]
use = egg:swift#{name}
"""
)

_PROXY = (
    _COMMON
    + """
[pipeline:main]
pipeline = catch_errors gatekeeper healthcheck proxy-logging cache listing_formats bulk s3api tempauth
    copy slo dlo proxy-logging proxy-server

[app:proxy-server]
use = egg:swift#proxy
account_autocreate = true
allow_account_management = true

[filter:s3api]
use = egg:swift#s3api
location = {region}
# Part sizes of the benchmarks (up to 5 GiB per part and 10,000 parts, as on AWS).
max_upload_part_num = 10000

[filter:tempauth]
use = egg:swift#tempauth
user_test_tester = {secret} .admin
user_other_reader = other .admin

[filter:catch_errors]
use = egg:swift#catch_errors
[filter:gatekeeper]
use = egg:swift#gatekeeper
[filter:healthcheck]
use = egg:swift#healthcheck
[filter:proxy-logging]
use = egg:swift#proxy_logging
[filter:cache]
use = egg:swift#memcache
memcache_servers = 127.0.0.1:{memcache}
[filter:listing_formats]
use = egg:swift#listing_formats
[filter:bulk]
use = egg:swift#bulk
[filter:copy]
use = egg:swift#copy
[filter:slo]
use = egg:swift#slo
max_manifest_segments = 10000
[filter:dlo]
use = egg:swift#dlo
"""
)

_SWIFT_CONF = """[swift-hash]
swift_hash_path_suffix = mlckpt-test
swift_hash_path_prefix = mlckpt-test

[storage-policy:0]
name = Policy-0
default = yes

[swift-constraints]
max_file_size = 5368709122
"""


def _ring(etc: Path, name: str, port: int) -> None:
    builder = str(etc / f"{name}.builder")
    for args in (["create", "6", "1", "1"], ["add", f"r1z1-127.0.0.1:{port}/d1", "1"], ["rebalance"]):
        r = subprocess.run(
            ["/usr/bin/swift-ring-builder", builder, *args], capture_output=True, text=True, check=False
        )
        if r.returncode not in (0, 1):  # 1: rebalance's warnings
            raise RuntimeError(f"swift-ring-builder {name} {args[0]}: {r.stdout}{r.stderr}")


def start(root: Path, workers: int = 2, timeout_s: float = 60.0) -> Store:
    """A fresh store with its data under ``root`` (wiped first), ready to answer S3 requests."""
    why = unavailable()
    if why:
        raise RuntimeError(why)
    shutil.rmtree(root, ignore_errors=True)
    etc, srv = root / "etc", root / "srv"
    (srv / "d1").mkdir(parents=True)
    etc.mkdir()
    (etc / "swift.conf").write_text(_SWIFT_CONF)
    ports = {n: free_port() for n in (*SERVERS, "proxy", "memcache")}
    store = Store(root, ports["proxy"])
    try:
        for name in SERVERS:
            _ring(etc, name, ports[name])
            conf = etc / f"{name}-server.conf"
            conf.write_text(
                _SERVER.format(port=ports[name], etc=etc, srv=srv, name=name, workers=workers, user=_user())
            )
            store.procs.append(
                _spawn([f"/usr/bin/swift-{name}-server", str(conf), "--verbose"], root / f"{name}.log")
            )
        if shutil.which("memcached"):  # tempauth keeps s3api's tokens there; optional
            store.procs.append(
                _spawn(
                    ["memcached", "-l", "127.0.0.1", "-p", str(ports["memcache"]), "-U", "0", "-u", "root"],
                    root / "memcache.log",
                )
            )
        conf = etc / "proxy-server.conf"
        conf.write_text(
            _PROXY.format(
                port=ports["proxy"],
                etc=etc,
                srv=srv,
                name="proxy",
                workers=workers,
                region=REGION,
                secret=SECRET_KEY,
                memcache=ports["memcache"],
                user=_user(),
            )
        )
        store.procs.append(_spawn([PROXY, str(conf), "--verbose"], root / "proxy.log"))
        _wait_healthy(store, timeout_s)
    except BaseException:
        store.stop()
        raise
    return store


def _user() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


def _spawn(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    out = log.open("ab")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env["PATH"] = "/usr/sbin:/usr/bin:/sbin:/bin"
    # Its own process group: stop() ends each server's workers with it.
    return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def _wait_healthy(store: Store, timeout_s: float) -> None:
    until = time.monotonic() + timeout_s
    while True:
        for p in store.procs:
            if p.poll() is not None:
                raise RuntimeError(f"{p.args[0]} exited with status {p.returncode}:\n{store.logs()}")
        try:
            with urllib.request.urlopen(f"{store.endpoint}/healthcheck", timeout=2) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > until:
            raise RuntimeError(f"the Swift proxy did not answer within {timeout_s:g} s:\n{store.logs()}")
        time.sleep(0.2)


@contextlib.contextmanager
def endpoint(root: Path) -> Iterator[str]:
    """The store ``AWS_ENDPOINT_URL`` names (with its credentials from the environment), or else a
    fresh local one under ``root`` whose settings are put into ``os.environ`` until the end."""
    if "AWS_ENDPOINT_URL" in os.environ:
        yield os.environ["AWS_ENDPOINT_URL"]
        return
    store = start(root)
    saved = {k: os.environ.get(k) for k in store.env}
    os.environ.update(store.env)
    try:
        yield store.endpoint
    finally:
        store.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main() -> int:
    import argparse

    p = argparse.ArgumentParser(description="a local S3 store (Swift's all-in-one) until Ctrl-C")
    p.add_argument("folder", nargs="?", default="/tmp/mlckpt-s3", help="its data (wiped first)")
    p.add_argument(
        "--bucket", action="append", default=[], help="create this bucket (repeatable; needs boto3)"
    )
    a = p.parse_args()
    root = Path(a.folder).absolute()
    # Ctrl-C and a test's terminate() stop the servers, even when started from a shell whose
    # background jobs ignore SIGINT (the ignoring is inherited; Python then installs no handler)
    signal.signal(signal.SIGINT, _interrupted)
    signal.signal(signal.SIGTERM, _interrupted)
    store = start(root)
    try:
        if a.bucket:
            import boto3
            from botocore.config import Config

            c = boto3.client(
                "s3",
                endpoint_url=store.endpoint,
                region_name=REGION,
                aws_access_key_id=ACCESS_KEY,
                aws_secret_access_key=SECRET_KEY,
                config=Config(s3={"addressing_style": "path"}),
            )
            for b in a.bucket:
                c.create_bucket(Bucket=b)
        for k, v in store.env.items():
            print(f"export {k}={v}")
        print(f"# an S3 store on {store.endpoint} (data in {root}); Ctrl-C stops it", flush=True)
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        store.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
