"""What the report says the clients verified per architecture, read from sessions.csv only
(``verifies``, ``verified``, ``datachannel_echo``; older runs: the two booleans)."""
from __future__ import annotations

import csv

from analysis import verification
from analysis.load import load_results
from analysis.report import write_report
from tests.test_analysis import write_run

ALL3 = "audio,datachannel,envelope"


def rewrite_sessions(directory, change) -> None:
    """Apply ``change(row, i)`` to every sessions.csv row (i counts each architecture's rows)."""
    path = directory / "sessions.csv"
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        fields, rows = reader.fieldnames, list(reader)
    seen: dict[str, int] = {}
    for row in rows:
        i = seen[row["architecture"]] = seen.get(row["architecture"], -1) + 1
        change(row, i)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)


def test_the_report_says_what_each_architecture_verified(tmp_path):
    directory = write_run(tmp_path / "run", n=5)  # 5 sessions per region, 2 regions: 10 each

    def change(row, i):
        if row["architecture"] == "port-per-session":   # the project's edge, one echo lost
            row.update(verifies=ALL3, verified="audio" if i == 0 else ALL3,
                       datachannel_echo="" if i == 0 else "envelope")
        elif row["architecture"] == "cluster-relay":    # an edge that echoes events raw
            row.update(verifies="audio,datachannel", verified="audio,datachannel",
                       datachannel_echo="raw")
        else:                                           # one that does not echo events
            row.update(verifies="audio", verified="audio" if i < 7 else "",
                       datachannel_echo="")
    rewrite_sessions(directory, change)

    s = verification.summary(load_results(directory))
    assert s["port-per-session"]["asked"] == {ALL3: 10}
    assert s["port-per-session"]["checks"] == {"audio": {"asked": 10, "passed": 10},
                                               "datachannel": {"asked": 10, "passed": 9},
                                               "envelope": {"asked": 10, "passed": 9}}
    assert s["port-per-session"]["fully_verified"] == 9
    assert s["port-per-session"]["datachannel_echo"] == {"envelope": 9, "none": 1}
    # cluster-relay: one failed session per region (write_run); counts are over the ok ones
    assert s["cluster-relay"]["checks"] == {"audio": {"asked": 8, "passed": 8},
                                            "datachannel": {"asked": 8, "passed": 8}}
    assert s["cluster-relay"]["datachannel_echo"] == {"raw": 8}
    assert s["global-relay"]["asked"] == {"audio": 10}
    assert s["global-relay"]["fully_verified"] == 7

    rows = {r[0]: r for r in verification.table(load_results(directory)).rows}
    assert rows["cluster-relay"] == ["cluster-relay", "audio,datachannel", "8/8", "8/8",
                                     "not asked", "8/8", "raw 8"]
    assert rows["global-relay"][1:6] == ["audio", "7/10", "not asked", "not asked", "7/10"]
    written = write_report(directory)
    md = (directory / "report.md").read_text()
    assert "## What the clients verified" in md and "| cluster-relay | audio,datachannel |" in md
    assert "What the clients verified" in (directory / "report.html").read_text()
    assert written is not None


def test_an_older_run_reads_as_asked_for_all_three_from_its_booleans(tmp_path):
    directory = write_run(tmp_path / "old", n=2)

    def change(row, i):
        row["datachannel_verified"] = "False" if i == 0 else "True"
    rewrite_sessions(directory, change)
    # an older sessions.csv: no verifies, verified or datachannel_echo column at all
    path = directory / "sessions.csv"
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    keep = [k for k in rows[0] if k not in ("verifies", "verified", "datachannel_echo")]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keep, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)

    s = verification.summary(load_results(directory))
    assert s["port-per-session"]["asked"] == {ALL3: 4}
    assert s["port-per-session"]["checks"]["envelope"] == {"asked": 4, "passed": 3}
    assert s["port-per-session"]["checks"]["audio"] == {"asked": 4, "passed": 4}
    assert s["port-per-session"]["fully_verified"] == 3
