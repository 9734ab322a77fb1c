"""``voiceedge token``: a call token for trying the edge by hand, minted from an API key file
as a front would (services/signaling/auth.py); ``--new-key ID`` prints a new key for the
file instead."""
from __future__ import annotations

import argparse
import json

from voiceedge.errors import UserError


def add_parser(sub) -> None:
    p = sub.add_parser("token", help="mint a call token (or a new API key) for trying the "
                                     "edge by hand",
                       description="Print a call token for one of the keys in an API key "
                                   "file (any front holding the same file accepts it), or "
                                   "with --new-key a new key to add to that file (docs/auth.md).")
    p.add_argument("--api-keys", metavar="FILE", help="the fronts' API key file")
    p.add_argument("--key", metavar="ID", help="which key mints it (default: the file's first)")
    p.add_argument("--expires-in", type=int, default=600, metavar="S",
                   help="seconds the token is valid, 10-3600 (default 600)")
    p.add_argument("--max-calls", type=int, default=None, metavar="N",
                   help="calls it may place (counted by each front; default no limit)")
    p.add_argument("--json", action="store_true", help="the token, its id and expiry as JSON")
    p.add_argument("--new-key", metavar="ID",
                   help="print a new API key with this id (a-z, 0-9, -) instead")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from services.signaling.auth import ApiKey, Caller, KeyRing

    if args.new_key:
        try:
            print(ApiKey.new(args.new_key).text)
        except ValueError as exc:
            raise UserError(f"--new-key: {exc}") from None
        return 0
    if not args.api_keys:
        raise UserError("give --api-keys FILE (or --new-key ID to make a key)")
    try:
        ring = KeyRing.load(args.api_keys)
        key = args.key or ring.ids[0]
        if key not in ring.ids:
            raise ValueError(f"no key {key!r} in the file ({', '.join(ring.ids)})")
        token = ring.mint(Caller(key), args.expires_in, args.max_calls)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    if args.json:
        print(json.dumps({"value": token.value, "id": token.id, "expires_at": token.expires,
                          "max_calls": token.max_calls}))
    else:
        print(token.value)
    return 0
