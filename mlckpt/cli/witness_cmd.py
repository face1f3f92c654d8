"""`mlckpt witness serve --listen HOST:PORT --key KEYFILE --trusted-keys FILE [...]`: the witness
service, run by the witnessing party (a benchmark committee, or the buyer in a proof of concept)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from mlckpt.units import parse_duration, parse_size

DEFAULT_KEEP = "90d"
T = TypeVar("T")


def _arg(parse: Callable[[str], T]) -> Callable[[str], T]:
    """An argparse type from one of mlckpt.units' parsers (its ValueError is argparse's message)."""
    def convert(text: str) -> T:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return convert


def register(sub: argparse._SubParsersAction) -> None:
    from mlckpt.witness.admission import Limits

    d = Limits()
    p = sub.add_parser("witness", help="run a witness: an independent clock for runs, on the network",
                       description="The witness stamps a run's ops with its own clock, journals them "
                       "durably, and signs receipts and a transcript with its own key.")
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)
    serve = verbs.add_parser("serve", help="serve witnessed runs until SIGINT or SIGTERM",
                             description="Serve witnessed runs. Only a client whose open request is signed "
                             "by a key of --trusted-keys opens a run; every bound below protects the runs "
                             "already open from the others (docs: Witnessed runs, Deploying a witness).")
    serve.add_argument("--listen", required=True, metavar="HOST:PORT",
                       help="address to listen on, e.g. 0.0.0.0:8470 (port 0: any free port, printed)")
    serve.add_argument("--key", required=True, type=Path, metavar="KEYFILE",
                       help="the witness's Ed25519 private key (made with `mlckpt keygen`)")
    serve.add_argument("--trusted-keys", required=True, type=Path, metavar="FILE",
                       help="the keys that may open runs: a trusted-keys file (the committee's, the same "
                       "format as mlckpt-check's); each run's transcript names the key that opened it")
    serve.add_argument("--journal", type=Path, default=Path("mlckpt-witness"), metavar="DIR",
                       help="the append-only journal, one file per open run, closed runs gzip'ed under "
                       "DIR/closed (default: ./mlckpt-witness); a restarted witness reloads every open run")
    b = serve.add_argument_group("bounds (per opener key, and for the whole witness)")
    b.add_argument("--max-open-per-key", type=int, default=d.max_open_per_key, metavar="N",
                   help="runs one key holds open at once (default %(default)s)")
    b.add_argument("--opens-per-minute", type=int, default=d.opens_per_minute, metavar="N",
                   help="runs one key may open in any minute (default %(default)s)")
    b.add_argument("--journal-bytes-per-key", type=_arg(parse_size), default=d.journal_bytes_per_key,
                   metavar="SIZE", help="journal bytes of one key's open runs (default 64MiB)")
    b.add_argument("--max-open", type=int, default=d.max_open, metavar="N",
                   help="runs open at once, all keys together (default %(default)s)")
    b.add_argument("--expire-after", type=_arg(parse_duration), default=d.expire_after_s, metavar="TIME",
                   help="a run without an event for this long expires, marked so in its journal "
                   "(default 24h)")
    b.add_argument("--min-free", type=_arg(parse_size), default=d.min_free_bytes, metavar="SIZE",
                   help="free space the journal's filesystem keeps for the runs already open: under it, "
                   "new runs are refused (default 256MiB)")
    b.add_argument("--keep", type=_arg(parse_duration), default=parse_duration(DEFAULT_KEEP), metavar="TIME",
                   help=f"closed runs' archives kept this long (default {DEFAULT_KEEP})")
    b.add_argument("--keep-runs", type=int, default=None, metavar="N",
                   help="at most this many closed runs' archives, the oldest removed first (default: no "
                   "count bound)")
    b.add_argument("--max-connections", type=int, default=512, metavar="N",
                   help="connections held at once; past it, new ones are closed at once "
                   "(default %(default)s)")
    b.add_argument("--header-timeout", type=_arg(parse_duration), default=10.0, metavar="TIME",
                   help="a connection must deliver its request within this (default 10s)")
    t = serve.add_argument_group("transport")
    t.add_argument("--tls-cert", type=Path, default=None, metavar="PEM",
                   help="serve https with this certificate chain (and --tls-key); or serve http behind a "
                   "TLS-terminating reverse proxy")
    t.add_argument("--tls-key", type=Path, default=None, metavar="PEM", help="the certificate's private key")
    serve.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    from mlckpt.witness.admission import Limits
    from mlckpt.witness.server import Options, serve

    limits = Limits(max_open_per_key=args.max_open_per_key, opens_per_minute=args.opens_per_minute,
                    max_open=args.max_open, journal_bytes_per_key=args.journal_bytes_per_key,
                    expire_after_s=args.expire_after, min_free_bytes=args.min_free)
    return serve(Options(listen=args.listen, key=args.key, journal=args.journal,
                         trusted_keys=args.trusted_keys, limits=limits, keep_s=args.keep,
                         keep_runs=args.keep_runs, tls_cert=args.tls_cert, tls_key=args.tls_key,
                         max_connections=args.max_connections, header_timeout_s=args.header_timeout))
