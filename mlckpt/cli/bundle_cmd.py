"""`mlckpt keygen | sign | verify | pack`: signing keys and signed result bundles.

Thin wrappers over :mod:`mlckpt.bundle`.  Failures are raised as ``mlckpt.errors`` exceptions;
the dispatcher prints one line and exits with their status (2 usage, 3 integrity).  ``verify``
also lists every integrity problem on stdout before that one line.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from mlckpt import bundle
from mlckpt.bundle import default_key_path
from mlckpt.errors import BundleIntegrityError, ExitStatus, IntegrityError, UsageError


def register(subparsers: Any) -> None:
    """keygen, sign, verify, pack and digest, in the order ``mlckpt --help`` lists them."""
    for name, summary, description, options, func in _commands():
        p = subparsers.add_parser(name, help=summary, description=description)
        options(p)
        p.set_defaults(func=func)


def _commands() -> list[tuple[str, str, str, Any, Any]]:
    """(name, one-line help, description, its options, its handler) of each command."""
    return [
        ("keygen", "create an Ed25519 signing key for result bundles",
         "Create an Ed25519 signing key (PKCS8 PEM, mode 0600; never overwrites) and its one-line "
         "public key PATH.pub to register with the committee.", _keygen_options, cmd_keygen),
        ("sign", "(re-)sign a result bundle folder",
         f"Hash every file of BUNDLE and write its signed envelope {bundle.SIGNATURE_FILE}, replacing "
         "any existing one.", _sign_options, cmd_sign),
        ("verify", "verify a result bundle folder or .tar.gz",
         "Check the bundle's signature, paths and every file's digest.", _verify_options, cmd_verify),
        ("pack", "verify a bundle and pack it into a deterministic .tar.gz",
         "Verify BUNDLE (signature and digests) and write it as a .tar.gz.", _pack_options, cmd_pack),
        ("digest", "print this runner's code digest (what a committee lists in released-runners.yaml)",
         "Print the code digest that this installed runner signs into every bundle "
         "(runner_code_sha256), and the released-runners.yaml entry that lists it.", _digest_options,
         cmd_digest),
    ]


def _keygen_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=None, help=f"key path (default {default_key_path()})")
    parser.add_argument("--passphrase-env", metavar="NAME", default=None,
                   help="encrypt the key with the passphrase held in environment variable NAME (mlckpt "
                   f"run reads it from ${bundle.DEFAULT_PASSPHRASE_ENV}: "
                   f"NAME={bundle.DEFAULT_PASSPHRASE_ENV} keeps one variable)")
    parser.add_argument("--org", default=None, metavar="NAME",
                   help="your organisation's name in the submission tree (for the printed "
                   "trusted-keys entry)")


def _sign_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("bundle", type=Path, metavar="BUNDLE")
    parser.add_argument("--key", type=Path, default=None, help="private key (default: keygen's path)")
    parser.add_argument("--passphrase-env", metavar="NAME", default=bundle.DEFAULT_PASSPHRASE_ENV,
                   help="environment variable holding the key's passphrase (default %(default)s)")
    parser.add_argument("--predicate", type=Path, default=None, metavar="FILE",
                   help="JSON object to sign as the predicate (default: the existing envelope's)")


def _verify_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("bundle", type=Path, metavar="BUNDLE", help="bundle folder or .tar.gz")
    parser.add_argument("--trusted-keys", type=Path, default=None, metavar="FILE",
                   help="organisation -> public keys (YAML, or JSON by suffix); without it only "
                   "integrity is checked, not who signed")
    parser.add_argument("--org", default=None, help="require a key registered for this organisation")


def _pack_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("bundle", type=Path, metavar="BUNDLE")
    parser.add_argument("--out", type=Path, default=None, help="archive path (default BUNDLE.tar.gz)")


def _digest_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--entry", action="store_true", help="print only the paste-ready YAML entry")


def cmd_digest(args: argparse.Namespace) -> int:
    import datetime

    from mlckpt import __version__
    from mlckpt.bundle.released import entry

    digest = bundle.code_digest()
    text = entry(__version__, digest, datetime.date.today().isoformat())
    if args.entry:
        print(text, end="")
        return ExitStatus.OK
    print(f"runner_code_sha256: {digest} (mlckpt {__version__})")
    print("entry for released-runners.yaml (under runners:):")
    print(text, end="")
    return ExitStatus.OK


def cmd_keygen(args: argparse.Namespace) -> int:
    path = args.out or default_key_path()
    passphrase = None
    if args.passphrase_env:
        value = os.environ.get(args.passphrase_env)
        if not value:
            raise UsageError(
                f"--passphrase-env: environment variable {args.passphrase_env} is unset or empty"
            )
        passphrase = os.fsencode(value)
    info = bundle.existing_key(path, args.passphrase_env or bundle.DEFAULT_PASSPHRASE_ENV)
    made = info is None
    if info is not None:  # e.g. made by the first `mlckpt run` (signing.key=auto): never overwritten
        print(f"private key: {info.path} (it exists already: kept, never overwritten)")
    else:
        info = bundle.generate_key(path, passphrase)
        print(f"private key: {info.path}" + (" (encrypted)" if passphrase else ""))
    print(f"public key: {info.public_path or '(no .pub beside it)'}: {info.public_key}")
    print(f"fingerprint: {info.fingerprint} (how messages, the checker and the signature's keyid "
          "name this key)")
    if made and passphrase and args.passphrase_env != bundle.DEFAULT_PASSPHRASE_ENV:
        print(f"mlckpt run reads the passphrase from ${bundle.DEFAULT_PASSPHRASE_ENV}: set it to "
              f"${args.passphrase_env}'s value (mlckpt sign: --passphrase-env {args.passphrase_env})")
    org = args.org or "YOUR-ORG"
    print("give the committee this entry for their trusted-keys.yaml (under organizations:):")
    print(f'  {org}: ["{info.public_key}"]  # fingerprint {info.fingerprint}')
    return ExitStatus.OK


def _load_predicate(path: Path) -> dict[str, object]:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UsageError(f"--predicate {path}: {exc.strerror or exc}") from None
    try:
        pred = json.loads(data)
    except ValueError as exc:
        raise UsageError(f"--predicate {path}: not valid JSON: {exc}") from None
    if not isinstance(pred, dict):
        raise UsageError(f"--predicate {path}: must be a JSON object")
    return pred


def cmd_sign(args: argparse.Namespace) -> int:
    folder: Path = args.bundle
    if not folder.is_dir():
        raise UsageError(f"{folder}: not a bundle folder")
    if args.predicate is not None:
        pred = _load_predicate(args.predicate)
    elif (folder / bundle.SIGNATURE_FILE).exists():
        pred = bundle.read_envelope_predicate(folder)
    else:
        raise UsageError(f"{folder}: not signed yet; give the predicate with --predicate FILE (JSON object)")
    key = bundle.load_private_key(args.key or default_key_path(), args.passphrase_env)
    out = bundle.sign_bundle(folder, key, pred)
    v = bundle.verify_bundle(folder)
    print(f"signed: {out} ({len(v.files)} files, key {v.key_label})")
    return ExitStatus.OK


def _verify_any(path: Path, trusted: bundle.TrustedKeys | None, org: str | None) -> Any:
    if not path.is_dir() and not path.is_file():
        raise UsageError(f"{path}: no such bundle folder or archive")
    with bundle.open_bundle(path) as folder:
        return bundle.verify_bundle(folder, trusted, org=org)


def _report(err: BundleIntegrityError) -> IntegrityError:
    for where, message in err.problems:
        print(f"problem: {bundle.display_name(where)}: {message}")
    return IntegrityError(err.summary)


def cmd_verify(args: argparse.Namespace) -> int:
    trusted = bundle.TrustedKeys.load(args.trusted_keys) if args.trusted_keys else None
    if args.org and trusted is None:
        raise UsageError("--org needs --trusted-keys")
    try:
        v = _verify_any(args.bundle, trusted, args.org)
    except BundleIntegrityError as err:
        raise _report(err) from None
    org = v.org if v.org is not None else "unknown (no --trusted-keys: integrity only)"
    print(f"verified: {len(v.files)} files, key {v.key_label}, org {org}")
    return ExitStatus.OK


def cmd_pack(args: argparse.Namespace) -> int:
    folder: Path = args.bundle
    if not folder.is_dir():
        raise UsageError(f"{folder}: not a bundle folder")
    out: Path = args.out or folder.parent / (folder.resolve().name + ".tar.gz")
    if os.path.lexists(out):
        raise UsageError(f"{out}: already exists; choose another --out or remove it")
    try:
        v = bundle.verify_bundle(folder)
    except BundleIntegrityError as err:
        raise _report(err) from None
    bundle.pack(folder, out)
    h = hashlib.sha256()
    with open(out, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    print(f"packed: {out} ({len(v.files) + 1} members, sha256 {h.hexdigest()})")
    return ExitStatus.OK
