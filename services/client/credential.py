"""The bearer credential a client carries to the front (an API key or a call token,
docs/auth.md), read from a file: a secret is never a command-line argument (``ps`` shows those
to every user of the host) and never logged."""
from __future__ import annotations

from pathlib import Path

from voiceedge.errors import UserError

MAX_CHARS = 512   # the front refuses longer ones (services/signaling/auth.py)


def read_credential(path: str | Path, flag: str = "--credential-file") -> str:
    """The credential in ``path`` (its first line); UserError, one line naming ``flag``,
    when unusable."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise UserError(f"{flag} {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise UserError(f"{flag} {path}: not text") from None
    value = (text.splitlines() or [""])[0].strip()
    if not value or len(value) > MAX_CHARS or any(c.isspace() for c in value):
        raise UserError(f"{flag} {path}: its first line is not one API key or call token")
    return value


def bearer(credential: str | None) -> dict[str, str]:
    """The ``Authorization`` header for ``credential`` (none without one)."""
    return {} if credential is None else {"Authorization": f"Bearer {credential}"}
