"""Signed result bundles: layout, in-toto statement, DSSE envelope, Ed25519 keys, pack/unpack.

The public surface is this package's ``__all__``, what the runner, the checker, the witness and
the tests use: ``sign`` (signing a folder), ``verify`` (verification in named steps), ``keys`` (key
files and trusted keys), ``archive`` (pack, ``safe_unpack``), ``documents`` (reading what was
verified), ``models`` and ``digest`` (the runner code digest); modules starting with ``_`` are
internal.  The envelope itself is :mod:`mlckpt.dsse`'s, which the witness shares.

Format
------
``BUNDLE_FORMAT`` 1.0 (its history, with the code digest's and the trusted-keys file's, is in
``mlckpt/formats.py``): a folder whose regular files are all listed, with their sha256, as the
subjects of an in-toto Statement v1 (predicateType ``https://mlckpt.dev/result-bundle/v1``),
serialised as sorted-key compact UTF-8 JSON, carried in a DSSE envelope
(``application/vnd.in-toto+json``) in ``bundle.dsse.json`` with exactly one Ed25519 signature
whose entry also embeds the signer's raw public key (``public_key``, base64).

Bundle layout
-------------
A bundle is a folder.  The runner decides what goes in it (typically ``run.json``,
``summary.json``, ``system.json``, ``records/*.jsonl``, ``logs/...``); this module only requires:

- ``bundle.dsse.json`` at the top level: the DSSE envelope, the only file not listed as a subject
  (a ``bundle.dsse.json`` deeper in the tree is an ordinary subject);
- every other entry is a regular file or a directory: no symlinks, hard-link tricks are harmless
  (content is hashed), no devices, FIFOs or sockets.  Empty directories carry no data and are
  ignored;
- every regular file is a subject ``{"name": relative/posix/path, "digest": {"sha256": hex}}``,
  sorted by name.  Names are UTF-8, relative, without ``.``/``..``/empty components,
  backslashes, NUL or control characters, at most 4096 bytes (255 per component).

Envelope (``bundle.dsse.json``)::

    {"payloadType": "application/vnd.in-toto+json",
     "payload": "<base64 of the statement bytes>",
     "signatures": [{"keyid": "<sha256 hex of the raw 32-byte public key>",
                     "sig": "<base64 Ed25519 signature over PAE(payloadType, payload bytes)>",
                     "public_key": "<base64 raw 32-byte public key>"}]}

``PAE(type, body) = "DSSEv1" SP len(type) SP type SP len(body) SP body`` (lengths in bytes, ASCII
decimal).  Verification never re-serialises the statement: it checks the signature over the
decoded payload bytes exactly as stored and only then parses them, so the serialisation need
only be deterministic for reproducibility, not canonical for security (no RFC 8785 needed).

Statement::

    {"_type": "https://in-toto.io/Statement/v1",
     "subject": [...],
     "predicateType": "https://mlckpt.dev/result-bundle/v1",
     "predicate": {"bundle_format": "1.0", "run_id": ..., "mlckpt_version": ...,
                   "runner_code_sha256": ..., "runner_code_hash_alg": "mlckpt-tree-sha256-v1",
                   "rules_version": ..., "workload": ..., "division": "closed"|"open",
                   "started": ISO-8601 UTC, "ended": ISO-8601 UTC, ...extra keys...}}

Keys and trust
--------------
Private keys are PKCS8 PEM files (mode 0600, encrypted with the best available scheme when a
passphrase is given, read from ``$MLCKPT_KEY_PASSPHRASE`` by default).  The public key is written
next to it as ``<key>.pub``: one line ``ed25519:<base64 raw key>``.  ``keyid`` is the sha256 hex of
the raw public key (as go-securesystemslib ``dsse.SHA256KeyID``).

The trusted-keys file is YAML (a ``.json`` suffix selects strict JSON instead)::

    mlckpt_trusted_keys: "1.0"
    organizations:
      acme-storage:
        - ed25519:9f1b...=          # one line per key, as printed by `mlckpt keygen`
      other-org: [ "ed25519:..." ]

A key may belong to one organisation only.  Without a trusted-keys file, :func:`verify_bundle`
checks the signature against the key embedded in the envelope: that proves the bundle is
unchanged since it was signed, not who signed it.  With one, the signer's keyid must be
registered (for ``org`` when given) and the registered key is used.

What a signature does not prove: that the numbers are honest, that the runner was unmodified
(``runner_code_sha256`` is self-reported by the runner; the checker can only compare it to the
hashes of released versions), that the hardware matches the system description, or that the
timestamps are true.

Concurrency and trust boundaries: files are opened beneath a directory descriptor of the bundle
with ``O_NOFOLLOW`` at every component, so a path swapped for a symlink while verifying is refused
rather than followed.  Archives are extracted only by :func:`safe_unpack`, which never calls
``tarfile``'s extraction and bounds every read.
"""

import importlib
from typing import TYPE_CHECKING

from mlckpt.bundle._common import (
    BUNDLE_FORMAT,
    CODE_DIGEST_ALG,
    DEFAULT_PASSPHRASE_ENV,
    PAYLOAD_TYPE,
    PREDICATE_TYPE,
    SIGNATURE_FILE,
    STATEMENT_TYPE,
    default_key_path,
    display_name,
)

# Everything else loads on first use (PEP 562): the command line lists `mlckpt keygen` and reads the
# names above without paying for the cryptography and schema libraries.
_LAZY = {
    "find_bundle_root": "mlckpt.bundle.archive",
    "open_bundle": "mlckpt.bundle.archive",
    "pack": "mlckpt.bundle.archive",
    "safe_unpack": "mlckpt.bundle.archive",
    "code_digest": "mlckpt.bundle.digest",
    "DOCUMENTS": "mlckpt.bundle.documents",
    "parse_document": "mlckpt.bundle.documents",
    "read_document": "mlckpt.bundle.documents",
    "WITNESSES": "mlckpt.bundle.keys",
    "TrustedKeys": "mlckpt.bundle.keys",
    "generate_key": "mlckpt.bundle.keys",
    "existing_key": "mlckpt.bundle.keys",
    "parse_public_key_text": "mlckpt.bundle.keys",
    "keyid_of_key": "mlckpt.bundle.keys",
    "load_private_key": "mlckpt.bundle.keys",
    "key_label": "mlckpt.dsse",
    "keyid_of": "mlckpt.dsse",
    "public_key_text": "mlckpt.dsse",
    "KeyInfo": "mlckpt.bundle.models",
    "Predicate": "mlckpt.bundle.models",
    "VerifiedBundle": "mlckpt.bundle.models",
    "make_envelope": "mlckpt.bundle.sign",
    "sign_bundle": "mlckpt.bundle.sign",
    "read_envelope_predicate": "mlckpt.bundle.verify",
    "verify_bundle": "mlckpt.bundle.verify",
}

if TYPE_CHECKING:
    from mlckpt.bundle.archive import find_bundle_root, open_bundle, pack, safe_unpack
    from mlckpt.bundle.digest import code_digest
    from mlckpt.bundle.documents import DOCUMENTS, parse_document, read_document
    from mlckpt.bundle.keys import (
        WITNESSES,
        TrustedKeys,
        existing_key,
        generate_key,
        keyid_of_key,
        load_private_key,
        parse_public_key_text,
    )
    from mlckpt.bundle.models import KeyInfo, Predicate, VerifiedBundle
    from mlckpt.bundle.sign import make_envelope, sign_bundle
    from mlckpt.bundle.verify import read_envelope_predicate, verify_bundle
    from mlckpt.dsse import key_label, keyid_of, public_key_text


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "BUNDLE_FORMAT",
    "CODE_DIGEST_ALG",
    "DEFAULT_PASSPHRASE_ENV",
    "DOCUMENTS",
    "PAYLOAD_TYPE",
    "PREDICATE_TYPE",
    "SIGNATURE_FILE",
    "STATEMENT_TYPE",
    "WITNESSES",
    "KeyInfo",
    "Predicate",
    "TrustedKeys",
    "VerifiedBundle",
    "code_digest",
    "default_key_path",
    "display_name",
    "existing_key",
    "find_bundle_root",
    "generate_key",
    "key_label",
    "keyid_of",
    "keyid_of_key",
    "load_private_key",
    "make_envelope",
    "open_bundle",
    "pack",
    "parse_document",
    "parse_public_key_text",
    "public_key_text",
    "read_document",
    "read_envelope_predicate",
    "safe_unpack",
    "sign_bundle",
    "verify_bundle",
]
