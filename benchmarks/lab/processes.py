"""Finding the processes of one faulted run: the fault seam (tests/support/fault_launcher.py) tags
each rank it starts with ``MLCKPT_FAULTS_TEST_TOKEN=<token>`` in its environment, so a test or a
benchmark can tell whether any of them outlived the job."""

from __future__ import annotations

import os
from pathlib import Path


def tagged_pids(token: str) -> list[int]:
    """The live (not zombie) processes whose environment carries the fault seam's ``token``."""
    found = []
    needle = f"MLCKPT_FAULTS_TEST_TOKEN={token}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            env = Path(f"/proc/{entry}/environ").read_bytes()
            st = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        if needle in env.split(b"\0") and st[st.rindex(")") + 2] != "Z":
            found.append(int(entry))
    return found
