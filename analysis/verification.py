"""What the clients verified, per architecture: the checks each session was asked for and those
that passed (sessions.csv ``verifies`` and ``verified``, comma-separated check names as the
clients wrote them), and how the data-channel echo came back (``datachannel_echo``).

What a session checks is the architecture's to declare (an external edge may echo data-channel
events raw, or not at all); the headline counts a session ok whether or not its checks passed,
so this table says what "ok" covered. Runs from before these columns asked every session for
the project's edge's three checks and recorded two booleans; they are read as such.
"""
from __future__ import annotations

import pandas as pd

from analysis.load import Results, as_bool
from analysis.tables import Table

# The checks of the runs before the ``verifies`` column: the project's edge, whose agent
# echoes audio and wraps data-channel events (the names are the clients' own, from the files).
OLDER_RUNS = ("audio", "datachannel", "envelope")


def _checks(cell) -> tuple[str, ...]:
    if cell is None or (isinstance(cell, float) and cell != cell) or pd.isna(cell):
        return ()
    return tuple(name for name in str(cell).split(",") if name)


def _frame(results: Results) -> pd.DataFrame:
    """The sessions with ``asked`` and ``passed`` as tuples of check names."""
    frame = results.sessions.copy()
    if "verifies" in frame.columns and "verified" in frame.columns:
        frame["asked"] = frame["verifies"].map(_checks)
        frame["passed"] = frame["verified"].map(_checks)
    else:  # an older run: two booleans, the envelope implied by the data channel's
        echo = as_bool(frame.get("echo_verified", pd.Series(False, index=frame.index)))
        channel = as_bool(frame.get("datachannel_verified",
                                    pd.Series(False, index=frame.index)))
        frame["asked"] = [OLDER_RUNS] * len(frame)
        frame["passed"] = [tuple(c for c, ok in zip(OLDER_RUNS, (a, d, d)) if ok)
                           for a, d in zip(echo, channel)]
    if "datachannel_echo" not in frame:
        frame["datachannel_echo"] = None
    return frame


def summary(results: Results) -> dict:
    """Per architecture: the check sets asked for (with their session counts), and per check
    the ok sessions asked for it and those where it passed; data-channel echo forms seen."""
    frame = _frame(results)
    out: dict = {}
    for arch in results.architectures:
        group = frame[frame.architecture == arch]
        ok = group[group.ok]
        asked: dict[str, int] = {}
        for checks in group.asked:
            key = ",".join(checks) or "nothing"
            asked[key] = asked.get(key, 0) + 1
        names = list(dict.fromkeys(c for checks in group.asked for c in checks))
        checks = {name: {"asked": int(sum(name in a for a in ok.asked)),
                         "passed": int(sum(name in a and name in p
                                           for a, p in zip(ok.asked, ok.passed)))}
                  for name in names}
        forms = ok["datachannel_echo"].fillna("none").astype(str).value_counts()
        out[arch] = {"asked": asked, "checks": checks,
                     "fully_verified": int(sum(set(a) <= set(p)
                                               for a, p in zip(ok.asked, ok.passed))),
                     "ok": len(ok), "datachannel_echo": {k: int(v) for k, v in forms.items()}}
    return out


def table(results: Results) -> Table:
    """One row per architecture: what its clients were asked to verify and, of its ok
    sessions, how many verified each check and all of them."""
    s = summary(results)
    names = list(dict.fromkeys(c for a in s.values() for c in a["checks"]))
    table = Table(["architecture", "asked to verify"] + [f"{n} verified" for n in names]
                  + ["all verified", "data-channel echo (ok sessions)"],
                  note="Counts over each architecture's successful sessions: a session is ok "
                       "once its call ran, whether or not its checks passed. audio: the tone's "
                       "echo came back; datachannel: the event sent came back, raw or wrapped; "
                       "envelope: wrapped in the agent's agent.echo (docs/client.md, "
                       "Verification). What a session is asked to verify is its "
                       "architecture's to declare.")
    for arch, a in s.items():
        cells = [f"{a['checks'][n]['passed']}/{a['checks'][n]['asked']}"
                 if n in a["checks"] else "not asked" for n in names]
        asked = "; ".join(k if len(a["asked"]) == 1 else f"{k} ({v})"
                          for k, v in a["asked"].items())
        forms = ", ".join(f"{k} {v}" for k, v in a["datachannel_echo"].items()) or "-"
        table.rows.append([arch, asked, *cells, f"{a['fully_verified']}/{a['ok']}", forms])
    return table
