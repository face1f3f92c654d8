"""The witness service: a real `mlckpt witness serve` on the loopback address,
its journal, its receipts and transcript, restarts, bad requests, concurrent runs.  (Strangers,
floods, quotas, slow clients, a full disk and TLS: test_witness_attacks.py.)"""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.witnessbed import ORG, Witness

from mlckpt import bundle
from mlckpt.errors import EnvelopeError
from mlckpt.witness.client import Client, WitnessError, receipt_of, transcript_of

PLAN = "ab" * 32


@pytest.fixture
def witness(tmp_path: Path) -> Iterator[Witness]:
    w = Witness(tmp_path)
    w.start()
    yield w
    w.stop()


def a_run(c: Client, writes: int = 2, reads: int = 1) -> list[dict[str, Any]]:
    answers = [c.open(PLAN, {"workload": "llama3_8b", "ranks": 4})]
    answers.append(c.round_trip())
    for op, n in (("write", writes), ("read", reads)):
        for k in range(1, n + 1):
            answers.append(c.event("start", op, k))
            answers.append(c.event("end", op, k, nbytes=1 << 20))
    return answers


def test_a_witnessed_run_gets_signed_receipts_and_a_transcript(witness: Witness) -> None:
    c = witness.client()
    keyid = c.info()["keyid"]
    assert keyid == witness.keyid  # the key the witnessing party made with `mlckpt keygen`
    answers = a_run(c)
    receipts = [receipt_of(a, keyid) for a in answers]
    assert [r["seq"] for r in receipts] == list(range(1, len(receipts) + 1))
    assert [r["kind"] for r in receipts] == ["open", "rtt", "start", "end", "start", "end", "start", "end"]
    # the witness's clocks only, never going back; a nonce for each write's start and nothing else
    monos = [r["t_mono_ns"] for r in receipts]
    assert monos == sorted(monos) and all(r["t_wall_ns"] > 1.7e18 for r in receipts)
    assert [bool(r.get("nonce")) for r in receipts] == [False, False, True, False, True, False, False, False]
    assert answers[2]["nonce"] == receipts[2]["nonce"] and answers[2]["nonce"] != answers[4]["nonce"]
    assert receipts[1]["rtt_ns"] > 0
    closing = c.close()
    t = transcript_of(closing, keyid)
    assert t["run"] == c.run and t["witness_keyid"] == keyid
    assert [e["seq"] for e in t["entries"]] == list(range(1, 10)) and t["entries"][-1]["kind"] == "close"
    assert t["entries"][0]["plan_digest"] == PLAN and t["entries"][0]["config"]["ranks"] == 4
    # who opened it: the trusted key that signed the open, and its organisation in the witness's file
    assert t["witness_format"] == 2
    opener = (t["entries"][0]["opened_by"], t["entries"][0]["org"])
    assert opener == (bundle.keyid_of_key(witness.org_key), ORG)
    # the transcript again, from the journal: the same signed bytes
    assert c.call("GET", f"/v1/runs/{c.run}/transcript") == closing["transcript"]
    with pytest.raises(EnvelopeError, match="not by the witness") as info:
        transcript_of(closing, "0" * 64)
    assert info.value.kind == EnvelopeError.KEY


def test_a_client_states_no_time_and_follows_the_order(witness: Witness) -> None:
    c = witness.client()
    c.open(PLAN, {})
    before = witness.lines()
    timed = {"kind": "start", "op": "write", "index": 1, "t_wall_ns": 5}
    for body, says in ((timed, "unknown key(s) t_wall_ns"),
                       ({"kind": "end", "op": "write", "index": 1}, "not the op in progress"),
                       ({"kind": "start", "op": "write", "index": 2}, "the next write is 1"),
                       ({"kind": "start", "op": "copy", "index": 1}, "is not one of")):
        with pytest.raises(WitnessError, match=re.escape(says)) as exc:
            c.call("POST", f"/v1/runs/{c.run}/events", body)
        assert exc.value.status in (400, 409)
    assert witness.lines() == before  # nothing refused reaches the journal
    c.event("start", "write", 1)
    with pytest.raises(WitnessError, match="starts while write 1 is in progress"):
        c.event("start", "read", 1)
    with pytest.raises(WitnessError, match="no witnessed run 0000000000000000") as exc:
        c.call("POST", "/v1/runs/0000000000000000/close", {})
    assert exc.value.status == 404


def test_a_serving_runs_loads_count_from_zero_and_make_a_format_3_transcript(witness: Witness) -> None:
    c = witness.client()
    keyid = c.info()["keyid"]
    c.open(PLAN, {"workload": "llama3_8b", "ranks": 4})
    with pytest.raises(WitnessError, match="the next write is 1"):
        c.event("start", "write", 0)  # a checkpoint run's ops still count from 1
    with pytest.raises(WitnessError, match="the next load is 0"):
        c.event("start", "load", 1)
    starts = [c.event("start", "load", k) if i == 0 else c.event("end", "load", k)
              for k in (0, 1) for i in (0, 1)]
    assert not any(a.get("nonce") for a in starts)  # only a write's content carries a nonce
    with pytest.raises(WitnessError, match="the next load is 2"):
        c.event("start", "load", 4)
    t = transcript_of(c.close(), keyid)
    assert t["witness_format"] == 3  # a transcript with loads; rules before 1.16 cannot check it
    assert [(e["kind"], e.get("op"), e.get("index")) for e in t["entries"][1:-1]] == [
        ("start", "load", 0), ("end", "load", 0), ("start", "load", 1), ("end", "load", 1)]


def test_malformed_and_oversized_requests_leave_the_journal_intact(witness: Witness) -> None:
    import urllib.request

    c = witness.client()
    a_run(c, 1, 0)
    before = witness.lines()
    for data, status, says in ((b"{not json", 400, "not JSON"), (b"[1, 2]", 400, "is not of type 'object'"),
                               (b"x" * (70 << 10), 413, "larger than 65536 bytes")):
        req = urllib.request.Request(f"{witness.url}/v1/runs/{c.run}/events", data=data, method="POST")
        with pytest.raises(urllib.error.HTTPError) as exc:
            urllib.request.urlopen(req, timeout=5)
        assert exc.value.code == status and says in json.loads(exc.value.read())["error"]
    assert witness.lines() == before
    c.event("start", "read", 1)  # the run goes on


def test_a_restarted_witness_loses_nothing_it_acknowledged(witness: Witness) -> None:
    c = witness.client()
    acked = a_run(c, 2, 0)
    witness.kill()  # SIGKILL mid-run: no chance to flush anything
    witness.start()
    assert "1 runs open" in witness.banner
    c.url = witness.url
    c.event("start", "read", 1)
    c.event("end", "read", 1)
    t = transcript_of(c.close())
    got = [(e["seq"], e["kind"]) for e in t["entries"]]
    assert got[:len(acked)] == [(receipt_of(a)["seq"], receipt_of(a)["kind"]) for a in acked]
    assert [k for _, k in got] == ["open", "rtt", "start", "end", "start", "end", "start", "end", "close"]


def test_a_torn_last_line_is_dropped_and_an_edited_journal_refused(witness: Witness) -> None:
    c = witness.client()
    a_run(c, 1, 0)
    witness.stop()
    [path] = witness.journal.glob("*.jsonl")
    whole = path.read_bytes()
    path.write_bytes(whole + b'{"seq": 99, "kind": "end"')  # a crash mid-write: never acknowledged
    witness.start()
    assert path.read_bytes() == whole
    witness.stop()
    path.write_bytes(whole.replace(b'"kind":"start"', b'"kind":"end"', 1))
    proc = subprocess.run(witness.command(), capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2
    assert proc.stderr.strip() == (f"mlckpt: error: witness journal {path} line 4: the hash chain is broken "
                                   "(edited?)")


def test_many_runs_at_once_keep_their_own_events(tmp_path: Path) -> None:
    busy = Witness(tmp_path / "w", "--max-open-per-key", "32", "--opens-per-minute", "100")
    busy.start()
    errors: list[BaseException] = []
    runs: list[str] = []

    def one() -> None:
        try:
            c = busy.client()
            a_run(c, 3, 2)
            c.close()
            runs.append(str(c.run))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=one) for _ in range(24)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    busy.stop()
    assert not errors and len(set(runs)) == 24
    assert not list(busy.journal.glob("*.jsonl"))  # closed runs leave for their archives
    for run in runs:
        archive = busy.journal / "closed" / f"{run}.jsonl.gz"
        lines = gzip.decompress(archive.read_bytes()).decode().splitlines()
        kinds = [json.loads(line)["kind"] for line in lines]
        assert kinds == ["open", "rtt", *["start", "end"] * 5, "close"], run
        assert [json.loads(line)["seq"] for line in lines] == list(range(1, 14))


def test_an_unreachable_witness_fails_in_bounded_time(tmp_path: Path) -> None:
    import socket
    import time

    with socket.socket() as s:  # a port that accepts connections and never answers
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        bundle.generate_key(tmp_path / "org.pem")
        key = bundle.load_private_key(tmp_path / "org.pem")
        c = Client(f"http://127.0.0.1:{port}", timeout_s=0.5, key=key)
        t0 = time.monotonic()
        with pytest.raises(WitnessError, match="unreachable"):
            c.open(PLAN, {})
        assert time.monotonic() - t0 < 2.0
    with pytest.raises(WitnessError, match="unreachable"):
        Client("http://127.0.0.1:1", timeout_s=0.5).info()


def test_serve_refuses_a_bad_address_in_one_line(tmp_path: Path) -> None:
    w = Witness(tmp_path / "w")
    cmd = w.command()
    cmd[cmd.index("--listen") + 1] = "nowhere"
    cmd[cmd.index("--journal") + 1] = str(tmp_path / "mlckpt-witness")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.strip() == (
        "mlckpt: error: --listen: expected HOST:PORT, got 'nowhere'")
    assert not os.listdir(tmp_path / "mlckpt-witness") if (tmp_path / "mlckpt-witness").exists() else True


# ------------------------------------------------------------------------- the witness's own lag

def test_the_lag_meter_reports_a_blockage_around_a_stamp_and_not_one_long_past() -> None:
    from mlckpt.witness.lag import LagMeter

    m = LagMeter(period_ns=5_000_000)
    m.ran(due=1_000_000_000, now=1_300_000_000)  # the loop could not run for 300 ms
    assert m.lag_ns(1_300_000_000) == 300_000_000  # a request stamped as it came back waited that long
    assert m.lag_ns(1_200_000_000) == 200_000_000  # one stamped inside it, as long as it had lasted
    assert m.lag_ns(1_304_000_000) == 300_000_000  # within a period after it: it may have waited
    assert m.lag_ns(1_400_000_000) == 0  # long after: the loop was free, nothing waited
    m.ran(due=1_400_000_000, now=1_400_500_000)  # on time (under 1 ms late): not kept
    assert len(m.late) == 1 and m.worst_ns == 300_000_000
    m.due_ns = 1_500_000_000  # the next tick is overdue at 1.62 s: the loop is blocked right now
    assert m.lag_ns(1_620_000_000) == 120_000_000


def test_an_end_stamped_while_the_witness_could_not_run_says_how_late(tmp_path: Path) -> None:
    """The witness's loop is blocked for 0.3 s (as a flood or a busy host would) while an op's end
    waits in its socket: the end's entry carries lag_ns of at least that, measured by the witness."""
    import asyncio

    from aiohttp import web

    from mlckpt.witness.journal import Journal
    from mlckpt.witness.server import Witness as Server

    bundle.generate_key(tmp_path / "w.pem")
    org = bundle.generate_key(tmp_path / "org.pem")
    (tmp_path / "keys.yaml").write_text(
        f'mlckpt_trusted_keys: "1.0"\norganizations:\n  {ORG}: ["{org.public_key}"]\n')
    server = Server(Journal(tmp_path / "j"), bundle.load_private_key(tmp_path / "w.pem"),
                    bundle.TrustedKeys.load(tmp_path / "keys.yaml"))

    async def main() -> dict[str, Any]:
        runner = web.AppRunner(server.app())
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        c = Client(f"http://127.0.0.1:{port}", key=bundle.load_private_key(tmp_path / "org.pem"))
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, lambda: c.open("0" * 64, {}))
        await loop.run_in_executor(None, lambda: c.event("start", "write", 1))
        await asyncio.sleep(0.05)
        # The end is sent from another thread while the witness's loop is blocked (no await between).
        end = loop.run_in_executor(None, lambda: c.event("end", "write", 1))
        time.sleep(0.3)
        answer = await end
        await runner.cleanup()
        return receipt_of(answer)

    receipt = asyncio.run(main())
    assert receipt["kind"] == "end" and 0.25e9 <= receipt["lag_ns"] < 1e9, receipt
