"""The credentials a run's clients carry to fronts that check API keys (docs/auth.md): files in
a private folder (0700, each file 0600) outside the results, removed when the run is done, so
that no key or token is in a run's results, logs or any command line.

- An emulated edge (``EdgeCredentials``): one key generated per edge (a run's architecture),
  in the fronts' ``--api-keys`` file, and a call token per client process, minted from it.
- A deployment (``--target URL --api-key-file FILE``): the run's key is the operator's; the
  run asks the target's front for a token (``POST /v1/client_secrets``), as an application
  server would, and its clients carry that.
"""
from __future__ import annotations

import shutil
from pathlib import Path

from services.signaling.auth import TOKEN_TTL_S, ApiKey, Caller, KeyRing
from services.turn.credentials import write_secret
from voiceedge.reaper import temp_dir, untrack_dir

KEY_ID = "testbed"
TOKEN_LIFE_S = TOKEN_TTL_S[1]   # an hour: more than any architecture's run of clients


class PrivateFiles:
    """A private folder of secret files; ``close()`` removes it."""

    def __init__(self) -> None:
        # 0700; the command's reaper removes it too if the command is interrupted before
        # close() (voiceedge/reaper.py)
        self._dir = temp_dir("voiceedge-keys-")

    def write(self, name: str, text: str) -> Path:
        return write_secret(self._dir / name, text)   # 0600 from the start

    def close(self) -> None:
        shutil.rmtree(self._dir, ignore_errors=True)
        untrack_dir(self._dir)


class EdgeCredentials:
    """``key_file`` for the fronts (``--api-keys``), ``token_file(name)`` for a client process
    (``--credential-file``), ``operator`` for the testbed's own reads of ``/metrics``."""

    def __init__(self) -> None:
        self._files = PrivateFiles()
        self._key = ApiKey.new(KEY_ID)
        self._ring = KeyRing([self._key])
        self.key_file = self._files.write("api-keys", self._key.text)

    @property
    def operator(self) -> dict[str, str]:
        """The header that reads a front's internals (its ``/metrics``, ``/healthz`` details)."""
        return {"Authorization": f"Bearer {self._key.text}"}

    def token_file(self, name: str) -> Path:
        """A new call token for one client process (``name``)."""
        token = self._ring.mint(Caller(KEY_ID), TOKEN_LIFE_S)
        return self._files.write(f"token-{name}", token.value)

    def close(self) -> None:
        self._files.close()
