"""``voiceedge bench srtp``: the SRTP crypto floor of one media packet.

Times, in one process, what the media plane's crypto costs per packet through Debian's
libsrtp2 (which runs its ciphers through NSS, one cipher context set up per packet) for both
profiles the plane offers, beside the same AEAD-AES-256-GCM done straight on OpenSSL with one
context kept per session: what an SRTP layer of the plane's own on OpenSSL would pay.
Thread CPU time, the median of the rounds; packets of the given payload behind a 12-byte RTP
header. Builds bench/srtp_floor.c in a temporary folder (gcc, libsrtp2-dev, libssl-dev).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from voiceedge.errors import UserError

SOURCE = Path(__file__).with_name("srtp_floor.c")
BUILD = Path(tempfile.gettempdir()) / f"voiceedge-srtp-floor-{os.getuid()}"
CASES = (("libsrtp_aead_aes_256_gcm", "libsrtp2, AEAD_AES_256_GCM (NSS)"),
         ("libsrtp_aes128_cm_sha1_80", "libsrtp2, AES128_CM_SHA1_80 (NSS)"),
         ("openssl_aes_256_gcm", "OpenSSL EVP AES-256-GCM, context reused"))


def build() -> Path:
    """The microbenchmark's binary, built once per version of its source."""
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    binary = BUILD / f"srtp_floor-{digest}"
    if binary.exists():
        return binary
    if shutil.which("gcc") is None:
        raise UserError("voiceedge bench srtp needs gcc (make deps)")
    for header, package in (("/usr/include/srtp2/srtp.h", "libsrtp2-dev"),
                            ("/usr/include/openssl/evp.h", "libssl-dev")):
        if not Path(header).exists():
            raise UserError(f"voiceedge bench srtp needs {package}: "
                            "make deps (as root)")
    BUILD.mkdir(parents=True, exist_ok=True)
    partial = binary.with_suffix(f".{os.getpid()}")
    proc = subprocess.run(["gcc", "-O2", "-Wall", "-o", str(partial), str(SOURCE), "-lsrtp2",
                           "-lcrypto"], capture_output=True, text=True)
    if proc.returncode != 0:
        raise UserError(f"building {SOURCE.name} failed:\n{proc.stderr.strip()}")
    partial.replace(binary)  # whole or not at all, for a run beside this one
    return binary


def run(packets: int = 20_000, rounds: int = 7, payload: int = 120) -> dict:
    """Per-packet microseconds for each case (see CASES), as the binary prints them."""
    proc = subprocess.run([str(build()), str(packets), str(rounds), str(payload)],
                          capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise UserError(f"srtp_floor failed: {proc.stderr.strip() or proc.returncode}")
    return json.loads(proc.stdout)


def lines(result: dict) -> list[str]:
    out = [f"SRTP per packet ({result['payload_bytes']}-byte payload, {result['packets']} "
           f"packets, median of {result['rounds']} rounds, thread CPU):",
           f"  {'case':<44} {'protect us':>10} {'unprotect us':>12}"]
    for key, label in CASES:
        row = result[key]
        out.append(f"  {label:<44} {row['protect_us']:>10.2f} {row['unprotect_us']:>12.2f}")
    return out


def add_parser(sub) -> None:
    p = sub.add_parser("srtp", help="SRTP crypto per packet: libsrtp2 (NSS) against OpenSSL",
                       description=__doc__.split("\n\n")[1])
    p.add_argument("--packets", type=int, default=20_000, help="packets per round (default 20000)")
    p.add_argument("--rounds", type=int, default=7, help="rounds; medians reported (default 7)")
    p.add_argument("--payload", type=int, default=120,
                   help="payload bytes per packet (default 120, an Opus voice frame)")
    p.add_argument("--json", action="store_true", help="print only JSON")
    p.set_defaults(func=_main)


def _main(args) -> int:
    if not 1 <= args.packets <= 60_000 or not 1 <= args.rounds <= 99 or not 1 <= args.payload <= 1400:
        raise UserError("--packets 1..60000, --rounds 1..99, --payload 1..1400")
    result = run(args.packets, args.rounds, args.payload)
    print(json.dumps(result) if args.json else "\n".join(lines(result)))
    return 0
