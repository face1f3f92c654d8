"""A real `mlckpt witness serve` on the loopback address for the tests: its own key, a committee's
trusted-keys file naming the organisation keys that may open runs, and its journal."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from mlckpt import bundle
from mlckpt.witness.client import Client

BIN = Path(sys.executable).parent
ORG = "example-org"


def trusted_keys_file(path: Path, orgs: dict[str, list[str]]) -> Path:
    body = "".join(f'  {org}: [{", ".join(json.dumps(k) for k in keys)}]\n' for org, keys in orgs.items())
    path.write_text(f'mlckpt_trusted_keys: "1.0"\norganizations:\n{body}')
    return path


class Witness:
    """A witness process; ``start`` again runs it on the same journal (a new port)."""

    def __init__(self, tmp: Path, *extra: str, org_key: Path | None = None) -> None:
        tmp.mkdir(parents=True, exist_ok=True)
        self.key = tmp / "witness.pem"
        self.keyid = bundle.generate_key(self.key).keyid
        self.public_key = (tmp / "witness.pem.pub").read_text().strip()
        self.org_pem = org_key or tmp / "org.pem"
        if not self.org_pem.exists():
            bundle.generate_key(self.org_pem)
        self.org_key = bundle.load_private_key(self.org_pem)
        self.trusted = trusted_keys_file(tmp / "witness-trusted-keys.yaml",
                                         {ORG: [bundle.public_key_text(self.org_key)]})
        self.journal = tmp / "journal"
        self.extra = extra
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""
        self.banner = ""

    def command(self, port: int = 0) -> list[str]:
        return [str(BIN / "mlckpt"), "witness", "serve", "--listen", f"127.0.0.1:{port}", "--key",
                str(self.key), "--trusted-keys", str(self.trusted), "--journal", str(self.journal),
                *self.extra]

    def start(self, port: int = 0) -> None:
        self.proc = subprocess.Popen(self.command(port), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
        assert self.proc.stdout is not None
        self.banner = self.proc.stdout.readline()
        self.entry = self.proc.stdout.readline()
        m = re.search(r"listening on (https?://127\.0\.0\.1:\d+)", self.banner)
        assert m, (self.banner, self.proc.stderr.read() if self.proc.stderr and self.proc.poll() is not None
                   else "")
        self.url = m.group(1)

    def client(self, **kw: Any) -> Client:
        """A client that opens runs with the trusted organisation's key."""
        return Client(self.url, key=self.org_key, **kw)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> str:
        """Stop it; what it said on stderr."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
        return self.proc.stderr.read() if self.proc is not None and self.proc.stderr else ""

    def rss_kib(self) -> int:
        assert self.proc is not None
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        return int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1))  # type: ignore[union-attr]

    def files(self) -> list[Path]:
        return sorted(p for p in self.journal.rglob("*") if p.is_file())

    def lines(self) -> list[dict[str, Any]]:
        """Every journal line: open runs' files, then closed runs' archives."""
        import gzip

        out = [json.loads(line) for p in sorted(self.journal.glob("*.jsonl"))
               for line in p.read_text().splitlines()]
        for p in sorted((self.journal / "closed").glob("*.jsonl.gz")):
            out += [json.loads(line) for line in gzip.decompress(p.read_bytes()).decode().splitlines()]
        return out
