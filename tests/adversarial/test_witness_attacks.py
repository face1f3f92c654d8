"""The witness as a hostile client sees it: floods of unsigned and of over-quota signed opens,
replays, slow clients, oversized requests, runs left open, a full journal disk, and TLS; each
beside an honest witnessed run that must still complete with a transcript that holds.
(`mlckpt run` witnessed beside a flood, through the checker: test_witness_run.py.)"""

from __future__ import annotations

import base64
import gzip
import http.client
import json
import os
import resource
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.witnessbed import Witness, trusted_keys_file

from mlckpt import bundle
from mlckpt.witness import protocol
from mlckpt.witness.client import Client, WitnessError, transcript_of

PLAN = "cd" * 32


def honest_run(c: Client, writes: int = 3, pause_s: float = 0.0) -> dict[str, Any]:
    """A whole witnessed run; its transcript, checked against the witness's key."""
    c.open(PLAN, {"workload": "llama3_8b", "ranks": 4})
    for op in ("write", "read"):
        for k in range(1, writes + 1):
            c.event("start", op, k)
            time.sleep(pause_s)
            c.event("end", op, k, nbytes=1 << 20)
    c.round_trip()
    return transcript_of(c.close(), c.keyid)


def beside(work: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    """``work`` in a thread; its result or exception lands in the list."""
    out: list[Any] = []

    def go() -> None:
        try:
            out.append(work())
        except BaseException as exc:  # reported by the test
            out.append(exc)

    t = threading.Thread(target=go)
    t.start()
    return t, out


def post(conn: http.client.HTTPConnection, path: str, body: bytes) -> tuple[int, str]:
    conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    return resp.status, json.loads(resp.read())["error"]


@pytest.fixture
def witness(tmp_path: Path) -> Iterator[Witness]:
    w = Witness(tmp_path / "w")
    w.start()
    yield w
    w.stop()


def test_a_flood_of_unsigned_opens_writes_nothing_and_keeps_memory_flat(witness: Witness,
                                                                        tmp_path: Path) -> None:
    stranger = bundle.load_private_key(bundle.generate_key(tmp_path / "stranger.pem").path)  # type: ignore[arg-type]
    signed_by_stranger = json.dumps(bundle.make_envelope({"_type": "mlckpt-witness-open"}, stranger,
                                                         protocol.OPEN_TYPE)).encode()
    plain = json.dumps({"plan_digest": PLAN, "config": {}}).encode()  # a format-1 open: no signature
    host, port = witness.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)

    def flood(n: int) -> dict[tuple[int, str], int]:
        seen: dict[tuple[int, str], int] = {}
        for i in range(n):
            status, error = post(conn, "/v1/runs", signed_by_stranger if i % 2 else plain)
            key = (status, error.split(":")[0])
            seen[key] = seen.get(key, 0) + 1
        return seen

    flood(500)  # the interpreter's own caches warm up
    rss0 = witness.rss_kib()
    t, out = beside(lambda: honest_run(witness.client(), writes=3, pause_s=0.05))
    t0 = time.monotonic()
    seen = flood(4000)
    rate = 4000 / (time.monotonic() - t0)
    t.join(60)
    rss1 = witness.rss_kib()
    assert seen == {
        (401, "an open must be signed by a trusted key (mlckpt run signs it with signing.key)"): 2000,
        (403, f"the key with fingerprint {bundle.keyid_of_key(stranger)[:16]} is not in this witness's "
              "trusted keys"): 2000}, seen
    [transcript] = out
    assert not isinstance(transcript, BaseException), transcript
    assert [e["kind"] for e in transcript["entries"]].count("end") == 6  # the honest run, whole
    # nothing of the flood was stored: the honest run's archive is the journal's only file
    assert [p.name for p in witness.files()] == [f"{transcript['run']}.jsonl.gz"]
    assert rss1 - rss0 < 2048, (rss0, rss1, f"{rate:.0f} refusals/s")
    assert "(4500 requests refused before anything was stored; its loop ran at worst" in witness.stop()


def test_signed_opens_past_a_keys_quota_are_refused_in_one_line(tmp_path: Path) -> None:
    w = Witness(tmp_path / "w", "--max-open-per-key", "2", "--opens-per-minute", "3")
    w.start()
    try:
        a, b = w.client(), w.client()
        a.open(PLAN, {})
        b.open(PLAN, {})
        files = w.files()
        with pytest.raises(WitnessError) as exc:
            w.client().open(PLAN, {})
        assert (exc.value.status, str(exc.value)) == (
            429, "this key holds 2 open runs, its bound (--max-open-per-key 2): close one, or wait for it to "
                 "expire")
        assert w.files() == files  # a refusal stores nothing
        a.close()
        c = w.client()
        c.open(PLAN, {})  # the closed run's slot is free again: the third open of the minute
        b.close()
        with pytest.raises(WitnessError) as exc:
            w.client().open(PLAN, {})
        assert (exc.value.status, str(exc.value)) == (
            429, "this key opened 3 runs in the last minute, its bound (--opens-per-minute 3): wait")
        # another organisation's key has its own share
        other = bundle.load_private_key(bundle.generate_key(tmp_path / "other.pem").path)  # type: ignore[arg-type]
        trusted_keys_file(w.trusted, {"example-org": [bundle.public_key_text(w.org_key)],
                                      "other-org": [bundle.public_key_text(other)]})
    finally:
        w.stop()
    w.start()  # the trusted keys are read at the start
    try:
        d = Client(w.url, key=other)
        d.open(PLAN, {})
        assert transcript_of(d.close())["entries"][0]["org"] == "other-org"
    finally:
        w.stop()


def test_a_replayed_or_misdirected_open_is_refused(witness: Witness) -> None:
    c = witness.client()
    c.info()
    challenge = c.call("GET", "/v1/challenge")["challenge"]
    doc = protocol.open_document(witness.keyid, challenge, PLAN, {}, "test")
    envelope = bundle.make_envelope(doc, witness.org_key, protocol.OPEN_TYPE)
    c.call("POST", "/v1/runs", envelope)
    files = witness.files()
    for env, says in (
        (envelope, "the challenge was already used (a replayed open)"),
        (bundle.make_envelope({**doc, "witness_keyid": "0" * 64}, witness.org_key, protocol.OPEN_TYPE),
         "the open was signed for another witness"),
        (bundle.make_envelope({**doc, "challenge": challenge[:-1] + ("1" if challenge[-1] == "0" else "0")},
                              witness.org_key, protocol.OPEN_TYPE),
         "the challenge was not issued by this witness"),
        (bundle.make_envelope({**doc, "challenge": f"{time.time_ns() - 10**12:x}.00"}, witness.org_key,
                              protocol.OPEN_TYPE), "the challenge was not issued by this witness"),
        (bundle.make_envelope({**doc, "t_wall_ns": 5}, witness.org_key, protocol.OPEN_TYPE),
         "request: unknown key(s) t_wall_ns"),
    ):
        with pytest.raises(WitnessError) as exc:
            c.call("POST", "/v1/runs", env)
        assert str(exc.value).startswith(says), exc.value
    # a signature over other bytes
    other = json.dumps({**doc, "plan_digest": "ee" * 32}).encode()
    forged = dict(envelope, payload=base64.b64encode(other).decode())
    with pytest.raises(WitnessError, match="bad signature") as exc:
        c.call("POST", "/v1/runs", forged)
    assert exc.value.status == 401
    assert witness.files() == files


def test_a_run_left_open_expires_and_frees_its_keys_slot(tmp_path: Path) -> None:
    # the key's byte bound just above the open and one start: the expire entry goes in past it
    w = Witness(tmp_path / "w", "--expire-after", "1s", "--max-open-per-key", "1", "--journal-bytes-per-key",
                "680")
    w.start()
    try:
        c = w.client()
        c.open(PLAN, {})
        c.event("start", "write", 1)
        time.sleep(2.5)
        with pytest.raises(WitnessError, match=r"^the run expired after \d+ s without an event$") as exc:
            c.event("end", "write", 1)
        assert exc.value.status == 409
        with pytest.raises(WitnessError, match="the run expired"):
            c.call("GET", f"/v1/runs/{c.run}/transcript")
        entries = [json.loads(x) for x in gzip.decompress(
            (w.journal / "closed" / f"{c.run}.jsonl.gz").read_bytes()).decode().splitlines()]
        assert [e["kind"] for e in entries] == ["open", "start", "expire"] and entries[-1]["idle_s"] >= 1.0
        d = w.client()
        d.open(PLAN, {})  # the key's one slot is free again
        assert transcript_of(d.close())["entries"][-1]["kind"] == "close"
    finally:
        w.stop()


def test_slow_clients_are_cut_off_and_cannot_crowd_out_an_honest_run(tmp_path: Path) -> None:
    w = Witness(tmp_path / "w", "--header-timeout", "1s", "--max-connections", "100")
    w.start()
    host, port = w.url.removeprefix("http://").split(":")
    slow = []
    try:
        for _ in range(60):  # slowloris: a request line and part of the headers, then silence
            s = socket.create_connection((host, int(port)))
            s.sendall(b"POST /v1/runs HTTP/1.1\r\nHost: w\r\nContent-Length: 10")
            slow.append(s)
        t0 = time.monotonic()
        transcript = honest_run(w.client(), writes=2)
        assert time.monotonic() - t0 < 5 and transcript["entries"][-1]["kind"] == "close"
        time.sleep(1.5)
        for s in slow:  # every slow connection was closed by the witness
            s.settimeout(2)
            try:
                assert s.recv(100) == b""
            except ConnectionResetError:
                pass
        # past --max-connections a connection is closed at once
        held = [socket.create_connection((host, int(port))) for _ in range(100)]
        extra = socket.create_connection((host, int(port)))
        extra.settimeout(2)
        try:
            assert extra.recv(100) == b""
        except ConnectionResetError:
            pass
        for s in held:
            s.close()
        extra.close()
        time.sleep(0.2)
        assert w.client().info()["keyid"] == w.keyid  # and serving again once they are gone
    finally:
        for s in slow:
            s.close()
        w.stop()


def test_oversized_and_malformed_opens_are_refused_before_anything_is_stored(witness: Witness) -> None:
    host, port = witness.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    for body, status, says in ((b"x" * (70 << 10), 413, "request larger than 65536 bytes"),
                               (b"{not json", 401, "an open must be signed by a trusted key"),
                               (b'{"payloadType": 1}', 401, "an open must be signed by a trusted key")):
        got = post(conn, "/v1/runs", body)
        assert got[0] == status and got[1].startswith(says), got
    assert witness.files() == []


def _fsize_limit(nbytes: int) -> Callable[[], None]:
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, nbytes))


def test_a_journal_that_cannot_grow_refuses_the_event_and_keeps_every_acknowledged_line(
        tmp_path: Path) -> None:
    # The kernel refuses to let the witness's journal file pass 3000 bytes (RLIMIT_FSIZE): the line
    # that crosses it is written in part, then the witness must cut it back.
    w = Witness(tmp_path / "w")
    w.proc = subprocess.Popen(w.command(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              preexec_fn=_fsize_limit(3000))
    assert w.proc.stdout is not None
    w.url = w.proc.stdout.readline().split("listening on ")[1].split(" ")[0]
    try:
        c = w.client()
        c.open(PLAN, {"workload": "llama3_8b"})
        acked = 1
        with pytest.raises(WitnessError) as exc:
            for k in range(1, 100):
                c.event("start", "write", k)
                acked += 1
                c.event("end", "write", k)
                acked += 1
        assert exc.value.status == 507 and str(exc.value).startswith(
            "the witness's journal could not take the event"), exc.value
        [path] = w.journal.glob("*.jsonl")
        assert path.read_bytes().endswith(b"\n") and len(path.read_bytes().splitlines()) == acked
    finally:
        w.stop()
    w.start()  # without the limit: every acknowledged event is there, the chain whole, the run goes on
    c.url = w.url
    try:
        kinds = [e["kind"] for e in w.lines()]
        assert len(kinds) == acked
        if kinds[-1] == "start":
            c.event("end", "write", (acked - 1) // 2 + 1)
        assert transcript_of(c.close())["entries"][-1]["kind"] == "close"
    finally:
        w.stop()


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    where = tmp_path / "small"
    where.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(where)], capture_output=True,
                          text=True, check=False)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a 1 MiB tmpfs here ({proc.stderr.strip()}): the journal-size limit test "
                    "above covers the failed write")
    yield where
    subprocess.run(["umount", "-l", str(where)], check=False)


def test_a_full_journal_disk_refuses_new_runs_and_loses_nothing(small_disk: Path) -> None:
    w = Witness(small_disk.parent / "w", "--journal", str(small_disk / "journal"), "--min-free", "256k")
    w.journal = small_disk / "journal"
    w.start()
    try:
        c = w.client()
        c.open(PLAN, {})
        c.event("start", "write", 1)
        filler = small_disk / "filler"
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)  # another tenant fills the disk
        try:
            while os.write(fd, b"\0" * 4096):
                pass
        except OSError:
            pass
        finally:
            os.close(fd)
        with pytest.raises(WitnessError) as exc:
            w.client().open(PLAN, {})
        full = "the witness's journal has 0 B free, under its reserve of 256.00 KiB for the runs already open"
        assert exc.value.status == 503 and str(exc.value).startswith(full), exc.value
        acked = 2
        with pytest.raises(WitnessError) as exc:  # the journal's last page fills, then no more
            for _ in range(200):
                c.round_trip()
                acked += 1
        assert exc.value.status == 507 and "No space left on device" in str(exc.value), exc.value
        assert acked > 2
        filler.unlink()
        c.event("end", "write", 1)  # space again: the run goes on where it was
        t = transcript_of(c.close())
        assert [e["kind"] for e in t["entries"]] == ["open", "start", *["rtt"] * (acked - 2), "end", "close"]
    finally:
        w.stop()


def test_tls_and_the_witness_key_the_client_expects(tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path, "127.0.0.1")
    w = Witness(tmp_path / "w", "--tls-cert", str(cert), "--tls-key", str(key))
    w.start()
    try:
        assert w.url.startswith("https://")
        with pytest.raises(WitnessError, match="CERTIFICATE_VERIFY_FAILED"):
            w.client(timeout_s=2).info()  # not a certificate the system trusts
        c = w.client(ca_file=str(cert), expect=w.public_key)
        assert honest_run(c)["witness_keyid"] == w.keyid
        impostor = bundle.generate_key(tmp_path / "impostor.pem").public_key
        with pytest.raises(WitnessError, match=r"has the key .* not the expected ed25519:"):
            w.client(ca_file=str(cert), expect=impostor).info()
    finally:
        w.stop()


def _self_signed(tmp: Path, ip: str) -> tuple[Path, Path]:
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "mlckpt test witness")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(ip))]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp / "witness-cert.pem", tmp / "witness-cert.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


def test_archives_are_kept_for_the_declared_count(tmp_path: Path) -> None:
    w = Witness(tmp_path / "w", "--keep-runs", "2", "--expire-after", "0.4s")
    w.start()
    try:
        runs = []
        for _ in range(4):
            c = w.client()
            c.open(PLAN, {})
            c.close()
            runs.append(c.run)
            time.sleep(0.05)
        time.sleep(0.6)  # housekeeping runs at a quarter of the expiry bound
        kept = sorted(p.name.split(".")[0] for p in (w.journal / "closed").glob("*.jsonl.gz"))
        assert kept == sorted(runs[2:])
        for run in runs[2:]:  # still verifiable: served again from the archive
            assert transcript_of(w.client().call("GET", f"/v1/runs/{run}/transcript"))["run"] == run
        with pytest.raises(WitnessError, match="past retention") as exc:
            w.client().call("GET", f"/v1/runs/{runs[0]}/transcript")
        assert exc.value.status == 404
    finally:
        w.stop()
