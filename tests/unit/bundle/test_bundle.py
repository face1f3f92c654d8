"""Signed result bundles: signing, verification, tamper detection, keys, pack/safe-unpack, CLI."""

from __future__ import annotations

import base64
import gzip
import io
import json
import os
import stat
import subprocess
import sys
import tarfile
import time
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlckpt import bundle as b
from mlckpt import dsse
from mlckpt.bundle import _common as b_common
from mlckpt.bundle import archive as b_archive
from mlckpt.bundle import digest as b_code
from mlckpt.cli import main as cli_main
from mlckpt.errors import BundleIntegrityError, IntegrityError, UsageError

PREDICATE = {
    "run_id": "run-0001",
    "mlckpt_version": "0.1.0",
    "runner_code_sha256": "ab" * 32,
    "rules_version": "1.0",
    "workload": "llama3_8b",
    "division": "closed",
    "started": "2026-11-21T10:00:00Z",
    "ended": "2026-11-21T10:30:00+00:00",
}

FILES = {
    "run.json": b'{"workload": "llama3_8b", "ranks": 8}\n',
    "summary.json": b'{"write_bandwidth_GiBps": 12.5}\n',
    "records/rank0.jsonl": b'{"k": 0, "t0": 1.0, "t1": 2.0}\n{"k": 1, "t0": 3.0, "t1": 4.5}\n',
    "logs/deep/run.log": b"started\nfinished\n",
    "data.bin": os.urandom(1 << 20),
}


# ----------------------------------------------------------------------------------------------
# Helpers and fixtures


def make_folder(root: Path, files: dict[str, bytes] = FILES) -> Path:
    for name, data in files.items():
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    return root


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[object, b.KeyInfo]]:
    """Three unencrypted keys (generating is cheap; loading them back exercises the files)."""
    d = tmp_path_factory.mktemp("keys")
    out = {}
    for name in ("acme", "other", "rogue"):
        info = b.generate_key(d / f"{name}.pem", None)
        out[name] = (b.load_private_key(info.path), info)
    return out


@pytest.fixture
def trusted(tmp_path: Path, keys) -> b.TrustedKeys:
    path = tmp_path / "trusted.yaml"
    path.write_text(
        '# committee registry\nmlckpt_trusted_keys: "1.0"\norganizations:\n'
        f"  acme:\n    - {keys['acme'][1].public_key}\n"
        f"  other:\n    - {keys['other'][1].public_key}\n"
    )
    return b.TrustedKeys.load(path)


@pytest.fixture
def signed(tmp_path: Path, keys) -> Path:
    folder = make_folder(tmp_path / "bundle")
    b.sign_bundle(folder, keys["acme"][0], PREDICATE)
    return folder


def envelope(folder: Path) -> dict:
    return json.loads((folder / b.SIGNATURE_FILE).read_text())


def statement(folder: Path) -> dict:
    return json.loads(base64.b64decode(envelope(folder)["payload"]))


def write_envelope(folder: Path, env: dict) -> None:
    (folder / b.SIGNATURE_FILE).write_text(json.dumps(env))


def resign_statement(folder: Path, stmt: dict, key) -> None:
    write_envelope(folder, b.make_envelope(stmt, key))


def problems_of(folder: Path, trusted=None, **kw) -> BundleIntegrityError:
    with pytest.raises(BundleIntegrityError) as info:
        b.verify_bundle(folder, trusted, **kw)
    return info.value


# ----------------------------------------------------------------------------------------------
# Signing and verifying


def test_sign_then_verify(signed: Path, keys, trusted) -> None:
    v = b.verify_bundle(signed)
    assert sorted(v.files) == sorted(FILES)
    assert v.keyid == keys["acme"][1].keyid
    assert v.public_key == keys["acme"][1].public_key
    assert v.org is None
    assert v.predicate == {
        **PREDICATE,
        "bundle_format": b.BUNDLE_FORMAT,
        "runner_code_hash_alg": b.CODE_DIGEST_ALG,
    }
    assert v.statement["_type"] == b.STATEMENT_TYPE
    assert v.statement["predicateType"] == b.PREDICATE_TYPE
    names = [s["name"] for s in v.statement["subject"]]
    assert names == sorted(names) and b.SIGNATURE_FILE not in names
    env = envelope(signed)
    assert set(env) == {"payloadType", "payload", "signatures"}
    assert env["payloadType"] == "application/vnd.in-toto+json"
    assert set(env["signatures"][0]) == {"keyid", "sig", "public_key"}
    # The signature is over PAE exactly as DSSE defines it.
    payload = base64.b64decode(env["payload"])
    expected_pae = b"DSSEv1 28 application/vnd.in-toto+json %d " % len(payload) + payload
    assert dsse.pae(b.PAYLOAD_TYPE, payload) == expected_pae
    pub = keys["acme"][0].public_key()
    pub.verify(base64.b64decode(env["signatures"][0]["sig"]), expected_pae)

    w = b.verify_bundle(signed, trusted, org="acme")
    assert w.org == "acme" and w.files == v.files


def test_payload_is_deterministic(tmp_path: Path, keys) -> None:
    one = make_folder(tmp_path / "one")
    two = make_folder(tmp_path / "two")
    b.sign_bundle(one, keys["acme"][0], PREDICATE)
    b.sign_bundle(two, keys["acme"][0], b.Predicate(**PREDICATE))
    assert envelope(one)["payload"] == envelope(two)["payload"]
    # Ed25519 is deterministic too, so the whole envelope is reproducible.
    assert envelope(one) == envelope(two)


def test_resign_replaces_envelope(signed: Path, keys) -> None:
    (signed / "logs" / "late.log").write_text("added after signing\n")
    assert problems_of(signed).problems == [("logs/late.log", "extra file (not listed in the statement)")]
    b.sign_bundle(signed, keys["other"][0], b.read_envelope_predicate(signed))
    v = b.verify_bundle(signed)
    assert "logs/late.log" in v.files and v.keyid == keys["other"][1].keyid
    assert not [p for p in signed.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize("name", sorted(FILES))
def test_one_changed_byte_is_caught(signed: Path, name: str) -> None:
    path = signed / name
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    err = problems_of(signed)
    assert [p for p, _ in err.problems] == [name]
    assert err.problems[0][1].startswith("digest mismatch: signed sha256 ")
    assert err.summary == f"{signed}: 1 integrity problem: {name}: {err.problems[0][1]}"
    assert isinstance(err, IntegrityError) and err.exit_status == 3


def test_added_removed_renamed(signed: Path) -> None:
    (signed / "extra.txt").write_text("sneaked in")
    (signed / "summary.json").unlink()
    (signed / "run.json").rename(signed / "logs" / "run.json")
    err = problems_of(signed)
    assert sorted(err.problems) == [
        ("extra.txt", "extra file (not listed in the statement)"),
        ("logs/run.json", "extra file (not listed in the statement)"),
        ("run.json", "missing (listed in the statement, not in the folder)"),
        ("summary.json", "missing (listed in the statement, not in the folder)"),
    ]
    first_line = str(err).splitlines()[0]
    assert first_line.startswith(f"{signed}: 4 integrity problems: ")
    assert len(str(err).splitlines()) == 5  # the first line, then every problem


def test_removed_single_file(signed: Path) -> None:
    (signed / "logs" / "deep" / "run.log").unlink()
    assert problems_of(signed).problems == [
        ("logs/deep/run.log", "missing (listed in the statement, not in the folder)")
    ]


def test_edited_statement_fails_signature(signed: Path) -> None:
    env = envelope(signed)
    stmt = json.loads(base64.b64decode(env["payload"]))
    stmt["predicate"]["workload"] = "llama3_1t"
    env["payload"] = base64.b64encode(json.dumps(stmt).encode()).decode()
    write_envelope(signed, env)
    err = problems_of(signed)
    assert err.problems == [
        (
            b.SIGNATURE_FILE,
            f"bad signature by key ed25519:{env['signatures'][0]['public_key']} "
            f"(fingerprint {env['signatures'][0]['keyid'][:16]}): "
            "the statement or the signature was altered",
        )
    ]


def test_untrusted_signer(signed: Path, keys, trusted) -> None:
    rogue_key, rogue = keys["rogue"]
    resign_statement(signed, statement(signed), rogue_key)
    b.verify_bundle(signed)  # intact, just signed by someone else
    err = problems_of(signed, trusted)
    assert err.problems == [(b.SIGNATURE_FILE, f"signed by untrusted key {rogue.label}")]
    # One notation: the key as its .pub file and trusted-keys.yaml write it, and a short
    # fingerprint that begins the keyid in the signature file.
    assert rogue.public_key in str(err) and rogue.keyid.startswith(rogue.fingerprint)
    assert envelope(signed)["signatures"][0]["keyid"].startswith(rogue.fingerprint)


def test_key_of_another_org(signed: Path, keys, trusted) -> None:
    err = problems_of(signed, trusted, org="other")
    assert err.problems == [
        (
            b.SIGNATURE_FILE,
            f"signed by key {keys['acme'][1].label} registered for organisation 'acme', not 'other'",
        )
    ]


def test_org_unknown_or_without_trusted_keys_is_usage_error(signed: Path, trusted) -> None:
    with pytest.raises(UsageError, match="organisation 'nobody' has no keys"):
        b.verify_bundle(signed, trusted, org="nobody")
    with pytest.raises(UsageError, match="needs a trusted-keys file"):
        b.verify_bundle(signed, None, org="acme")


def test_embedded_key_must_match_keyid(signed: Path, keys) -> None:
    env = envelope(signed)
    env["signatures"][0]["public_key"] = keys["rogue"][1].public_key.split(":", 1)[1]
    write_envelope(signed, env)
    assert problems_of(signed).problems == [
        (b.SIGNATURE_FILE, "keyid is not the sha256 of the embedded public key")
    ]


def test_signature_by_embedded_rogue_key_does_not_pass_as_trusted(signed: Path, keys, trusted):
    """A rogue signer claiming acme's keyid but embedding its own key is refused."""
    env = b.make_envelope(statement(signed), keys["rogue"][0])
    env["signatures"][0]["keyid"] = keys["acme"][1].keyid
    write_envelope(signed, env)
    err = problems_of(signed, trusted)
    assert err.problems == [(b.SIGNATURE_FILE, "keyid is not the sha256 of the embedded public key")]


@pytest.mark.parametrize(
    ("bad_name", "reason"),
    [
        ("../outside.txt", "contains a '..' component"),
        ("logs/../../etc/passwd", "contains a '..' component"),
        ("/etc/passwd", "absolute path"),
        ("C:/Windows/win.ini", "absolute path"),
        ("logs\\run.log", "contains a backslash"),
        ("a\nb", "contains a control character"),
        ("./run.json", "contains a '.' component"),
        ("logs//run.log", "contains an empty component ('//' or a trailing '/')"),
        ("", "empty path"),
        (b.SIGNATURE_FILE, "the envelope cannot be its own subject"),
    ],
)
def test_bad_subject_names(signed: Path, keys, trusted, bad_name: str, reason: str) -> None:
    stmt = statement(signed)
    stmt["subject"].append({"name": bad_name, "digest": {"sha256": "0" * 64}})
    resign_statement(signed, stmt, keys["acme"][0])  # validly signed: only the path check fires
    err = problems_of(signed, trusted, org="acme")
    assert err.problems == [(bad_name, f"subject name rejected: {reason}")]


def test_nul_in_a_subject_name_is_refused_by_the_strict_loader(signed: Path, keys, trusted) -> None:
    """The statement is parsed by mlckpt.strict, which refuses a NUL in any JSON string before
    subject names are looked at (the checker reads every JSON the same way)."""
    stmt = statement(signed)
    stmt["subject"].append({"name": "a\x00b", "digest": {"sha256": "0" * 64}})
    resign_statement(signed, stmt, keys["acme"][0])
    err = problems_of(signed, trusted, org="acme")
    want = "signed payload is not valid JSON: string holds a NUL character"
    assert err.problems == [(b.SIGNATURE_FILE, want)]
    assert err.problems[0].kind == "signature"


def test_duplicate_subject(signed: Path, keys) -> None:
    stmt = statement(signed)
    stmt["subject"].append(dict(stmt["subject"][0]))
    resign_statement(signed, stmt, keys["acme"][0])
    assert problems_of(signed).problems == [(stmt["subject"][0]["name"], "duplicate subject")]


def test_malformed_subject_digest(signed: Path, keys) -> None:
    stmt = statement(signed)
    stmt["subject"][0]["digest"] = {"sha256": "AB" * 32}
    resign_statement(signed, stmt, keys["acme"][0])
    err = problems_of(signed)
    assert err.problems == [
        (stmt["subject"][0]["name"], "subject digest must be exactly {sha256: 64 lowercase hex}")
    ]


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("_type", "https://in-toto.io/Statement/v0.1", "statement _type must be"),
        ("predicateType", "https://slsa.dev/provenance/v1", "predicateType must be"),
    ],
)
def test_statement_types(signed: Path, keys, field: str, value: str, message: str) -> None:
    stmt = statement(signed)
    stmt[field] = value
    resign_statement(signed, stmt, keys["acme"][0])
    err = problems_of(signed)
    assert err.problems[0][0] == b.SIGNATURE_FILE and err.problems[0][1].startswith(message)


def test_unsupported_bundle_format(signed: Path, keys) -> None:
    stmt = statement(signed)
    stmt["predicate"]["bundle_format"] = "9.0"
    resign_statement(signed, stmt, keys["acme"][0])
    assert "unsupported bundle_format '9.0'" in problems_of(signed).problems[0][1]


def test_symlinks_and_special_files(signed: Path) -> None:
    (signed / "link.json").symlink_to(signed / "run.json")
    target = signed / "logs" / "deep" / "run.log"
    moved = signed.parent / "elsewhere.log"
    target.rename(moved)
    target.symlink_to(moved)  # same content, but through a link
    os.mkfifo(signed / "pipe")  # must not hang the verifier
    err = problems_of(signed)
    assert sorted(err.problems) == [
        ("link.json", "is a symlink (not allowed in bundles)"),
        ("logs/deep/run.log", "is a symlink (not allowed in bundles)"),
        ("pipe", "is not a regular file (device, FIFO or socket)"),
    ]


def test_symlinked_folder(signed: Path, tmp_path: Path) -> None:
    outside = make_folder(tmp_path / "outside", {"x.txt": b"x"})
    (signed / "logs" / "deep" / "run.log").unlink()
    (signed / "logs" / "deep").rmdir()
    (signed / "logs" / "deep").symlink_to(outside, target_is_directory=True)
    err = problems_of(signed)
    assert ("logs/deep", "is a symlink (not allowed in bundles)") in err.problems
    assert all("x.txt" not in p for p, _ in err.problems)  # never followed


def test_sign_refuses_links_and_bad_predicates(tmp_path: Path, keys) -> None:
    folder = make_folder(tmp_path / "b", {"a.json": b"{}"})
    (folder / "l").symlink_to(folder / "a.json")
    with pytest.raises(BundleIntegrityError) as info:
        b.sign_bundle(folder, keys["acme"][0], PREDICATE)
    assert info.value.problems == [("l", "is a symlink (not allowed in bundles)")]
    assert not (folder / b.SIGNATURE_FILE).exists()
    (folder / "l").unlink()
    with pytest.raises(UsageError, match="lacks required keys: run_id, workload"):
        b.sign_bundle(
            folder, keys["acme"][0], {k: v for k, v in PREDICATE.items() if k not in ("run_id", "workload")}
        )
    with pytest.raises(UsageError, match="'started' must be an ISO-8601 UTC time"):
        b.sign_bundle(folder, keys["acme"][0], {**PREDICATE, "started": "2026-11-21T10:00:00"})
    with pytest.raises(UsageError, match="'division' must be one of closed, open"):
        b.sign_bundle(folder, keys["acme"][0], {**PREDICATE, "division": "premium"})
    with pytest.raises(UsageError, match="ended' is before 'started'"):
        b.sign_bundle(folder, keys["acme"][0], {**PREDICATE, "ended": "2026-11-21T09:00:00Z"})


# ----------------------------------------------------------------------------------------------
# Broken envelopes


def test_missing_envelope(signed: Path) -> None:
    (signed / b.SIGNATURE_FILE).unlink()
    assert problems_of(signed).problems == [(b.SIGNATURE_FILE, "missing: the bundle is not signed")]


def test_truncated_envelope(signed: Path) -> None:
    path = signed / b.SIGNATURE_FILE
    path.write_bytes(path.read_bytes()[:-40])
    err = problems_of(signed)
    assert err.problems[0][0] == b.SIGNATURE_FILE
    assert err.problems[0][1].startswith("not valid JSON (") and "truncated" in err.problems[0][1]


def test_envelope_symlink_and_oversize(signed: Path, tmp_path: Path) -> None:
    path = signed / b.SIGNATURE_FILE
    elsewhere = tmp_path / "env.json"
    path.rename(elsewhere)
    path.symlink_to(elsewhere)
    assert problems_of(signed).problems == [(b.SIGNATURE_FILE, "is a symlink (not allowed in bundles)")]
    path.unlink()
    with open(path, "wb") as f:
        f.truncate(b_common.MAX_ENVELOPE_BYTES + 1)  # sparse: no real I/O
    assert problems_of(signed).problems == [(b.SIGNATURE_FILE, "larger than 16 MiB")]


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda e: e.update(extra=1), "envelope fields must be exactly payloadType, payload, signatures"),
        (lambda e: e.pop("signatures"), "envelope fields must be exactly"),
        (lambda e: e.update(payloadType="application/json"), "payloadType must be"),
        (lambda e: e.update(payload="not base64!"), "payload is not valid base64"),
        (lambda e: e.update(signatures=[]), "signatures must be a list of exactly one"),
        (lambda e: e["signatures"].append(e["signatures"][0]), "signatures must be a list of exactly one"),
        (lambda e: e["signatures"][0].pop("public_key"), "the signature entry must have exactly"),
        (lambda e: e["signatures"][0].update(sig="AAAA"), "an Ed25519 signature has 64 bytes"),
        (lambda e: e["signatures"][0].update(keyid="XYZ"), "keyid must be 64 lowercase hex digits"),
    ],
)
def test_malformed_envelopes(signed: Path, mutate, message: str) -> None:
    env = envelope(signed)
    mutate(env)
    write_envelope(signed, env)
    err = problems_of(signed)
    assert err.problems[0][0] == b.SIGNATURE_FILE and message in err.problems[0][1]


def test_duplicate_keys_in_envelope_are_rejected(signed: Path) -> None:
    text = (signed / b.SIGNATURE_FILE).read_text()
    (signed / b.SIGNATURE_FILE).write_text(text.replace("{", '{"payloadType": "x",', 1))
    assert "duplicate key 'payloadType'" in problems_of(signed).problems[0][1]


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=15,
)
b64 = st.binary(max_size=80).map(lambda d: base64.b64encode(d).decode())
envelope_like = st.fixed_dictionaries(
    {
        "payloadType": st.sampled_from([b.PAYLOAD_TYPE, "text/plain"]) | st.text(max_size=5),
        "payload": b64 | st.text(max_size=20) | json_values,
        "signatures": st.lists(
            st.fixed_dictionaries(
                {"keyid": st.text(max_size=64) | json_values, "sig": b64, "public_key": b64}
            ),
            max_size=2,
        )
        | json_values,
    }
)
statement_like = st.fixed_dictionaries(
    {
        "_type": st.just(b.STATEMENT_TYPE) | st.text(max_size=5),
        "predicateType": st.just(b.PREDICATE_TYPE) | json_values,
        "predicate": st.just({**PREDICATE, "bundle_format": "1.0"})
        | st.dictionaries(st.sampled_from([*sorted(PREDICATE), "bundle_format"]), json_values)
        | json_values,
        "subject": st.lists(
            st.fixed_dictionaries(
                {
                    "name": st.sampled_from(sorted(FILES)) | st.text(max_size=12) | json_values,
                    "digest": st.fixed_dictionaries({"sha256": st.text(max_size=64)}) | json_values,
                }
            )
            | json_values,
            max_size=5,
        )
        | json_values,
    }
)
hyp = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture
def small_signed(tmp_path: Path, keys) -> Path:
    folder = make_folder(tmp_path / "small", {k: v for k, v in FILES.items() if k != "data.bin"})
    b.sign_bundle(folder, keys["acme"][0], PREDICATE)
    return folder


@hyp
@given(
    data=st.binary(max_size=600)
    | json_values.map(lambda v: json.dumps(v).encode())
    | envelope_like.map(lambda v: json.dumps(v).encode())
)
def test_garbage_envelope_is_only_ever_integrity_error(small_signed: Path, data: bytes) -> None:
    (small_signed / b.SIGNATURE_FILE).write_bytes(data)
    with pytest.raises(BundleIntegrityError) as info:
        b.verify_bundle(small_signed)
    assert info.value.problems and info.value.problems[0][0] == b.SIGNATURE_FILE


@hyp
@given(stmt=statement_like | json_values)
def test_garbage_signed_statement_is_only_ever_integrity_error(small_signed: Path, keys, stmt) -> None:
    """Garbage that passes the signature check (signed by the right key) still cannot crash."""
    resign_statement(small_signed, stmt, keys["acme"][0])
    with pytest.raises(BundleIntegrityError) as info:
        b.verify_bundle(small_signed)
    assert info.value.problems


# ----------------------------------------------------------------------------------------------
# Keys and trusted keys


def test_keygen_mode_and_no_overwrite(tmp_path: Path) -> None:
    path = tmp_path / "cfg" / "mlckpt" / "signing-key.pem"
    info = b.generate_key(path, None)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    pub_text = (tmp_path / "cfg" / "mlckpt" / "signing-key.pem.pub").read_text()
    assert pub_text == info.public_key + "\n" and pub_text.startswith("ed25519:")
    assert len(base64.b64decode(info.public_key.split(":", 1)[1])) == 32
    assert info.keyid == b.keyid_of(base64.b64decode(info.public_key[8:]))
    before = path.read_bytes()
    with pytest.raises(UsageError, match=f"{path}: already exists; refusing to overwrite"):
        b.generate_key(path, None)
    assert path.read_bytes() == before
    other = tmp_path / "k2.pem"
    (tmp_path / "k2.pem.pub").write_text("stale")
    with pytest.raises(UsageError, match=r"k2\.pem\.pub: already exists"):
        b.generate_key(other, None)
    assert not other.exists()


def test_encrypted_key_needs_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "enc.pem"
    info = b.generate_key(path, b"correct horse")
    assert b"ENCRYPTED PRIVATE KEY" in path.read_bytes()
    monkeypatch.delenv("MLCKPT_KEY_PASSPHRASE", raising=False)
    with pytest.raises(UsageError, match="encrypted; set MLCKPT_KEY_PASSPHRASE"):
        b.load_private_key(path)
    monkeypatch.setenv("MLCKPT_KEY_PASSPHRASE", "wrong")
    with pytest.raises(
        UsageError, match="cannot decrypt the key with the passphrase in MLCKPT_KEY_PASSPHRASE"
    ):
        b.load_private_key(path)
    monkeypatch.setenv("MY_PASS", "correct horse")
    key = b.load_private_key(path, passphrase_env="MY_PASS")
    assert b.public_key_text(key) == info.public_key
    with pytest.raises(UsageError, match="empty passphrase"):
        b.generate_key(tmp_path / "e2.pem", b"")


def test_load_private_key_errors(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no such key file"):
        b.load_private_key(tmp_path / "nope.pem")
    (tmp_path / "junk.pem").write_text("hello")
    with pytest.raises(UsageError, match="not a PEM private key"):
        b.load_private_key(tmp_path / "junk.pem")


def test_trusted_keys_file(tmp_path: Path, keys) -> None:
    acme, other = keys["acme"][1], keys["other"][1]
    doc = {
        "mlckpt_trusted_keys": "1.0",
        "organizations": {"acme": [acme.public_key], "other": [other.public_key]},
    }
    (tmp_path / "t.json").write_text(json.dumps(doc))
    t = b.TrustedKeys.load(tmp_path / "t.json")
    assert t.org_for(acme.keyid) == "acme" and t.org_for(keys["rogue"][1].keyid) is None
    assert [k.keyid for k in t.keys_for("other")] == [other.keyid]
    assert t.keys_for("nobody") == ()
    assert t.organisations == ("acme", "other")

    (tmp_path / "t.yaml").write_text(
        f"mlckpt_trusted_keys: 1.0\norganizations:\n  acme: [{acme.public_key}]\n"
    )
    assert b.TrustedKeys.load(tmp_path / "t.yaml").org_for(acme.keyid) == "acme"

    bad = [
        # the schema (rules/1.0/schemas/trusted-keys.schema.json) is the one definition of the format
        ({**doc, "mlckpt_trusted_keys": "2.0"}, "mlckpt_trusted_keys: '1.0' was expected"),
        ({**doc, "extra": 1}, "extra: unknown key"),
        ({"mlckpt_trusted_keys": "1.0"}, "'organizations' is a required property"),
        ({**doc, "organizations": {"acme": acme.public_key}}, "organizations.acme: .* is not of type"),
        ({**doc, "organizations": {"acme": ["rsa:AAAA"]}}, r"organizations.acme.0: 'rsa:AAAA' does not"),
        ({**doc, "organizations": {"acme": ["ed25519:AAAA"]}}, r"acme.0: 'ed25519:AAAA' does not"),
        ({**doc, "organizations": {"bad name": [acme.public_key]}}, "organizations: 'bad name' does not"),
        (
            {**doc, "organizations": {"a": [acme.public_key], "b": [acme.public_key]}},
            "registered for both 'a' and 'b'",
        ),
    ]
    for i, (content, message) in enumerate(bad):
        p = tmp_path / f"bad{i}.json"
        p.write_text(json.dumps(content))
        with pytest.raises(UsageError, match=message):
            b.TrustedKeys.load(p)
    (tmp_path / "broken.yaml").write_text("organizations: [unclosed\n")
    with pytest.raises(UsageError, match="cannot parse trusted keys"):
        b.TrustedKeys.load(tmp_path / "broken.yaml")


def test_code_digest() -> None:
    digest = b.code_digest()
    assert len(digest) == 64 and int(digest, 16) >= 0
    names = [n for n, _ in b_code._code_files()]
    assert "bundle/sign.py" in names and "cli/bundle_cmd.py" in names
    assert names == sorted(names)
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    assert any(n.startswith("_data/rules/") for n in names)


# ----------------------------------------------------------------------------------------------
# Pack and safe unpack


def test_pack_is_deterministic_and_round_trips(signed: Path, tmp_path: Path, keys, trusted) -> None:
    a = b.pack(signed, tmp_path / "a.tar.gz")
    os.utime(signed / "run.json", (12345, 12345))  # mtimes must not matter
    bb = b.pack(signed, tmp_path / "b.tar.gz")
    assert a.read_bytes() == bb.read_bytes()
    with tarfile.open(a, "r:gz") as tar:
        members = tar.getmembers()
    assert [m.name for m in members] == sorted([*FILES, b.SIGNATURE_FILE])
    assert all(m.isreg() and m.mtime == 0 and m.uid == 0 and m.gid == 0 and m.mode == 0o644 for m in members)
    out = b.safe_unpack(a, tmp_path / "unpacked")
    v = b.verify_bundle(out, trusted, org="acme")
    assert v.files == b.verify_bundle(signed).files
    with pytest.raises(UsageError, match="already exists"):
        b.safe_unpack(a, tmp_path / "unpacked")
    with pytest.raises(UsageError, match="cannot be written inside the bundle"):
        b.pack(signed, signed / "self.tar.gz")


def make_tar(
    path: Path, members: list[tuple[tarfile.TarInfo, bytes | io.RawIOBase | None]], level: int = 6
) -> Path:
    with tarfile.open(path, "w:gz", compresslevel=level, format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            if isinstance(data, bytes):
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            else:
                tar.addfile(info, data)
    return path


def reg(name: str, data: bytes = b"x") -> tuple[tarfile.TarInfo, bytes]:
    return tarfile.TarInfo(name), data


def special(name: str, kind: bytes, linkname: str = "") -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    return info, None


@pytest.mark.parametrize(
    ("member", "message"),
    [
        (reg("../evil.txt"), "member name rejected: contains a '..' component"),
        (reg("logs/../../evil.txt"), "member name rejected: contains a '..' component"),
        (reg("/etc/cron.d/evil"), "member name rejected: absolute path"),
        (reg("a\\b"), "member name rejected: contains a backslash"),
        (special("link", tarfile.SYMTYPE, "/etc/passwd"), "symlink member (-> /etc/passwd) not allowed"),
        (special("hard", tarfile.LNKTYPE, "run.json"), "hard-link member (-> run.json) not allowed"),
        (special("fifo", tarfile.FIFOTYPE), "device, FIFO or other special member not allowed"),
        (special("dev", tarfile.CHRTYPE), "device, FIFO or other special member not allowed"),
        (reg("run.json", b"second copy"), "duplicate member"),
    ],
)
def test_unsafe_tar_members(tmp_path: Path, member, message: str) -> None:
    archive = make_tar(tmp_path / "x.tar.gz", [reg("run.json", b"{}"), reg("logs/a.log"), member])
    dest = tmp_path / "out"
    with pytest.raises(BundleIntegrityError) as info:
        b.safe_unpack(archive, dest)
    assert info.value.problems == [(member[0].name, message)]
    assert not dest.exists() and not (tmp_path / "evil.txt").exists()


def dir_member(name: str) -> tuple[tarfile.TarInfo, None]:
    return special(name, tarfile.DIRTYPE)


def test_member_order_and_conflicts(tmp_path: Path) -> None:
    # Contents before their folder's own entry is fine (some tools write that order) ...
    archive = make_tar(tmp_path / "ok.tar.gz", [reg("x/y.txt", b"y"), dir_member("x"), reg("./z", b"z")])
    out = b.safe_unpack(archive, tmp_path / "ok")
    assert (out / "x" / "y.txt").read_bytes() == b"y" and (out / "z").read_bytes() == b"z"
    assert stat.S_IMODE(out.stat().st_mode) == 0o755
    # ... but a file cannot also be a folder, nor a folder be listed twice.
    cases = [
        ([reg("a"), reg("a/b")], ("a/b", "parent a is a file member")),
        ([reg("a/b"), reg("a")], ("a", "a file member named like a folder of earlier members")),
        ([dir_member("d"), dir_member("d")], ("d", "duplicate member")),
        ([reg("z"), reg("./z")], ("./z", "duplicate member")),
    ]
    for i, (members, problem) in enumerate(cases):
        archive = make_tar(tmp_path / f"bad{i}.tar.gz", members)
        with pytest.raises(BundleIntegrityError) as info:
            b.safe_unpack(archive, tmp_path / f"bad{i}")
        assert info.value.problems == [problem]
        assert not (tmp_path / f"bad{i}").exists()


def test_too_many_members(tmp_path: Path) -> None:
    archive = make_tar(tmp_path / "x.tar.gz", [reg(f"f{i:02d}") for i in range(6)])
    with pytest.raises(BundleIntegrityError) as info:
        b.safe_unpack(archive, tmp_path / "out", max_members=5)
    assert info.value.problems == [("f05", "more than 5 members")]
    assert not (tmp_path / "out").exists()
    assert b.safe_unpack(archive, tmp_path / "ok", max_members=6).is_dir()


def test_member_and_total_limits(tmp_path: Path) -> None:
    archive = make_tar(tmp_path / "x.tar.gz", [reg(f"f{i}", bytes(1000)) for i in range(5)])
    with pytest.raises(BundleIntegrityError) as info:
        b.safe_unpack(archive, tmp_path / "o1", max_member_bytes=999)
    assert info.value.problems == [("f0", "member of 1000 bytes exceeds 999")]
    with pytest.raises(BundleIntegrityError) as info:
        b.safe_unpack(archive, tmp_path / "o2", max_total_bytes=3500)
    assert info.value.problems == [("f3", "total uncompressed size would exceed 3500 bytes")]
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()


class Zeros(io.RawIOBase):
    def __init__(self, n: int) -> None:
        self.left = n

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        n = min(len(buf), self.left)
        buf[:n] = bytes(n)
        self.left -= n
        return n


@pytest.fixture(scope="module")
def zero_bomb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tar.gz of a 200 MiB file of zeros: a fraction of a MiB compressed."""
    info = tarfile.TarInfo("zeros.bin")
    info.size = 200 << 20
    path = tmp_path_factory.mktemp("bomb") / "bomb.tar.gz"
    make_tar(path, [reg("run.json", b"{}"), (info, Zeros(info.size))], level=1)
    assert path.stat().st_size < 2 << 20
    return path


def test_gzip_bomb_is_stopped_fast_and_bounded(zero_bomb: Path, tmp_path: Path) -> None:
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        with pytest.raises(BundleIntegrityError) as info:
            b.safe_unpack(zero_bomb, tmp_path / "out", max_total_bytes=10 << 20)
        elapsed = time.perf_counter() - t0
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert info.value.problems == [("zeros.bin", f"total uncompressed size would exceed {10 << 20} bytes")]
    assert elapsed < 2.0 and peak < 16 << 20
    assert not (tmp_path / "out").exists()


def test_gzip_bomb_in_a_metadata_header(tmp_path: Path) -> None:
    """A pax header claiming 200 MiB would be read into memory whole by tarfile: refused first."""
    path = tmp_path / "pax.tar.gz"
    info = tarfile.TarInfo("././@PaxHeader")
    info.type = tarfile.XHDTYPE
    info.size = 200 << 20
    with gzip.open(path, "wb", compresslevel=1) as gz:
        gz.write(info.tobuf(format=tarfile.USTAR_FORMAT))
        chunk = bytes(4 << 20)
        for _ in range(50):
            gz.write(chunk)
    t0 = time.perf_counter()
    with pytest.raises(BundleIntegrityError) as info_:
        b.safe_unpack(path, tmp_path / "out")
    assert time.perf_counter() - t0 < 2.0
    assert info_.value.problems == [("././@PaxHeader", f"metadata header of {200 << 20} bytes exceeds 32768")]


def test_bounded_reader_caps_every_read() -> None:
    reader = b_archive._BoundedReader(io.BytesIO(bytes(5 << 20)), 1 << 20, "x.tar.gz")
    got = 0
    with pytest.raises(BundleIntegrityError, match="decompressed stream exceeds 1048576 bytes"):
        while True:
            chunk = reader.read(64 << 20)
            assert len(chunk) <= 1 << 20
            got += len(chunk)
    assert got <= 1 << 20


def test_not_a_tar_gz(tmp_path: Path) -> None:
    (tmp_path / "x.tar.gz").write_bytes(b"PK\x03\x04 this is a zip")
    with pytest.raises(BundleIntegrityError) as info:
        b.safe_unpack(tmp_path / "x.tar.gz", tmp_path / "out")
    assert info.value.problems[0][0] == "(archive)" and "not a valid .tar.gz" in info.value.problems[0][1]
    assert not (tmp_path / "out").exists()


def test_archive_with_top_folder_and_dot_slash(signed: Path, tmp_path: Path) -> None:
    top = tmp_path / "top.tar.gz"
    with tarfile.open(top, "w:gz") as tar:
        tar.add(signed, arcname="./mybundle")
    root = b.find_bundle_root(b.safe_unpack(top, tmp_path / "u"))
    assert root.name == "mybundle"
    b.verify_bundle(root)


# ----------------------------------------------------------------------------------------------
# Command line


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        cli_main([str(a) for a in args])
    out, err = capsys.readouterr()
    return int(info.value.code or 0), out, err


def test_cli_flow(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("MLCKPT_KEY_PASSPHRASE", raising=False)
    monkeypatch.delenv("MLCKPT_DEBUG", raising=False)
    key = tmp_path / "xdg" / "mlckpt" / "signing-key.pem"

    status, out, err = cli(capsys, "keygen")
    assert status == 0 and str(key) in out and "fingerprint: " in out and not err
    fp = out.split("fingerprint: ")[1].split()[0]
    label = f"{(key.parent / 'signing-key.pem.pub').read_text().strip()} (fingerprint {fp})"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    # again (as after a first `mlckpt run` made the key): the key kept, its entry printed again
    status, again, err = cli(capsys, "keygen", "--org", "acme")
    assert status == 0 and not err and "it exists already: kept, never overwritten" in again
    assert f"fingerprint: {fp} " in again and f'acme: ["{label.split()[0]}"]' in again
    (key.parent / "signing-key.pem.pub").write_text("ed25519:" + "A" * 43 + "=\n")  # another key's
    status, _, err = cli(capsys, "keygen")
    assert status == 2 and err.count("\n") == 1 and "not the public key of" in err
    (key.parent / "signing-key.pem.pub").write_text(label.split()[0] + "\n")

    folder = make_folder(tmp_path / "bundle", {k: v for k, v in FILES.items() if k != "data.bin"})
    status, out, err = cli(capsys, "sign", folder)
    assert status == 2 and err.count("\n") == 1 and "--predicate" in err
    (tmp_path / "pred.json").write_text(json.dumps(PREDICATE))
    status, out, err = cli(capsys, "sign", folder, "--predicate", tmp_path / "pred.json")
    assert status == 0 and out.startswith(f"signed: {folder / b.SIGNATURE_FILE} (4 files"), (out, err)
    status, out, err = cli(capsys, "sign", folder)  # re-sign reuses the envelope's predicate
    assert status == 0, err

    status, out, err = cli(capsys, "verify", folder)
    assert status == 0 and out.startswith(f"verified: 4 files, key {label}, org unknown"), out
    trusted = tmp_path / "trusted.yaml"
    pub = (key.parent / "signing-key.pem.pub").read_text().strip()
    trusted.write_text(f'mlckpt_trusted_keys: "1.0"\norganizations:\n  acme: [{pub}]\n')
    status, out, err = cli(capsys, "verify", folder, "--trusted-keys", trusted, "--org", "acme")
    assert status == 0 and out == f"verified: 4 files, key {label}, org acme\n"
    status, out, err = cli(capsys, "verify", folder, "--org", "acme")
    assert status == 2 and err == "mlckpt: error: --org needs --trusted-keys\n"

    status, out, err = cli(capsys, "pack", folder, "--out", tmp_path / "b.tar.gz")
    assert status == 0 and out.startswith(f"packed: {tmp_path / 'b.tar.gz'} (5 members, sha256 ")
    status, out, err = cli(capsys, "verify", tmp_path / "b.tar.gz", "--trusted-keys", trusted)
    assert status == 0 and out.startswith("verified: 4 files") and out.endswith("org acme\n")

    (folder / "summary.json").write_text('{"write_bandwidth_GiBps": 99.0}\n')
    (folder / "extra.txt").write_text("x")
    status, out, err = cli(capsys, "verify", folder)
    assert status == 3
    assert err.count("\n") == 1 and err.startswith(
        f"mlckpt: error: {folder}: 2 integrity problems: extra.txt"
    )
    assert "problem: summary.json: digest mismatch" in out and "problem: extra.txt: extra file" in out
    status, out, err = cli(capsys, "pack", folder, "--out", tmp_path / "c.tar.gz")
    assert status == 3 and not (tmp_path / "c.tar.gz").exists()

    status, out, err = cli(capsys, "verify", tmp_path / "nope")
    assert status == 2 and "no such bundle folder or archive" in err


def test_cli_encrypted_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MLCKPT_KEY_PASSPHRASE", raising=False)
    key = tmp_path / "k.pem"
    status, _, err = cli(capsys, "keygen", "--out", key, "--passphrase-env", "PASS_FOR_TEST")
    assert status == 2 and "PASS_FOR_TEST is unset or empty" in err and not key.exists()
    monkeypatch.setenv("PASS_FOR_TEST", "s3cret")
    status, out, _ = cli(capsys, "keygen", "--out", key, "--passphrase-env", "PASS_FOR_TEST")
    assert status == 0 and "(encrypted)" in out
    made = out.split("fingerprint: ")[1].split()[0]
    monkeypatch.delenv("PASS_FOR_TEST")  # without its passphrase, the .pub says which key it is
    status, again, _ = cli(capsys, "keygen", "--out", key)
    assert status == 0 and "kept" in again and f"fingerprint: {made} " in again
    monkeypatch.setenv("PASS_FOR_TEST", "s3cret")
    folder = make_folder(tmp_path / "bundle", {"run.json": b"{}"})
    (tmp_path / "pred.json").write_text(json.dumps(PREDICATE))
    status, _, err = cli(capsys, "sign", folder, "--key", key, "--predicate", tmp_path / "pred.json")
    assert status == 2 and err.count("\n") == 1 and "set MLCKPT_KEY_PASSPHRASE" in err
    status, _, err = cli(
        capsys,
        "sign",
        folder,
        "--key",
        key,
        "--predicate",
        tmp_path / "pred.json",
        "--passphrase-env",
        "PASS_FOR_TEST",
    )
    assert status == 0, err


def test_console_script_end_to_end(tmp_path: Path, keys) -> None:
    """The installed `mlckpt` script: exit statuses and a one-line stderr."""
    script = Path(sys.executable).parent / "mlckpt"
    env = {k: v for k, v in os.environ.items() if k != "MLCKPT_DEBUG"}
    folder = make_folder(tmp_path / "bundle", {"run.json": b"{}", "logs/a.log": b"a"})
    b.sign_bundle(folder, keys["acme"][0], PREDICATE)

    def run(*args: object) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(script), *map(str, args)], capture_output=True, text=True, env=env, timeout=60, check=False
        )

    ok = run("verify", folder)
    assert ok.returncode == 0 and ok.stdout.startswith("verified: 2 files"), ok.stderr
    (folder / "logs" / "a.log").write_text("b")
    bad = run("verify", folder)
    assert bad.returncode == 3 and bad.stderr.count("\n") == 1
    assert bad.stderr.startswith(f"mlckpt: error: {folder}: 1 integrity problem: logs/a.log: digest mismatch")
    usage = run("verify")
    assert usage.returncode == 2 and usage.stderr.count("\n") == 1


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        (b'"x": 1e999', "overflow"),
        (b'"x": 123456789012345678901234567890', "64-bit"),
        (b'"x": "\\ud800"', "surrogate"),
    ],
)
def test_the_statement_is_parsed_by_the_one_strict_loader(signed: Path, keys, raw: bytes, says: str) -> None:
    """What mlckpt-check's parser refuses, signature verification refuses too (one loader: before,
    the bundle code accepted 1e999, a 30-digit integer and a lone surrogate)."""
    from cryptography.hazmat.primitives import serialization

    from mlckpt.dsse import canonical_json

    key = keys["acme"][0]
    body = canonical_json(statement(signed))
    payload = body[:-1] + b"," + raw + b"}"  # a signed payload no json.dumps would write
    raw_pub = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    env = {"payloadType": b.PAYLOAD_TYPE, "payload": base64.b64encode(payload).decode(),
           "signatures": [{"keyid": b.keyid_of(raw_pub),
                           "sig": base64.b64encode(key.sign(dsse.pae(b.PAYLOAD_TYPE, payload))).decode(),
                           "public_key": base64.b64encode(raw_pub).decode()}]}
    write_envelope(signed, env)
    err = problems_of(signed)
    assert len(err.problems) == 1 and err.problems[0][0] == b.SIGNATURE_FILE
    assert err.problems[0][1].startswith("signed payload is not valid JSON") and says in err.problems[0][1]
