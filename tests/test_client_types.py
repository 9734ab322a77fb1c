"""Client types as plug-ins (scenarios/clients/): a scenario's ``clients`` mix, resolved through
the registry into one command per client type and region, which the clients' own parsers
accept; and what a session verifies (services/client/verify.py). No network."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from scenarios.clients import (CLIENT_TYPES, REGISTRY, RegionClients, client_type, commands,
                               needs_browser, parse_mix)
from scenarios.spec import Scenario, ScenarioError
from services.client.cli import config_from_args
from services.client.verify import (ENVELOPE, RAW, echo_form, parse_verifies, verified)
from tests.conftest import REPO, scenario_file
from voiceedge.cli import build_parser

BASE = ("name: mix\nclusters: [na-east]\ncall_duration_s: 4\nstart_rate: 2\n"
        "client: {media_timeout_s: 2.5, reconnect_attempts: 1}\n")
LOGS = Path("/run/logs")


def load(tmp_path, text: str) -> Scenario:
    return scenario_file(tmp_path, BASE + text)


def test_the_registry_names_the_client_types_that_sessions_csv_carries():
    assert CLIENT_TYPES == ("aiortc", "chromium")
    assert [REGISTRY[n].process for n in CLIENT_TYPES] == ["client", "browser"]
    assert [REGISTRY[n].needs_browser for n in CLIENT_TYPES] == [False, True]
    with pytest.raises(KeyError, match="unknown client type 'firefox'"):
        client_type("firefox")


def test_sessions_per_region_is_shorthand_for_an_aiortc_only_mix(tmp_path):
    short = load(tmp_path, "sessions_per_region: 5\nfull_clients_per_region: 1\n")
    mix = load(tmp_path, "clients: {aiortc: 5}\nfull_clients_per_region: 1\n")
    assert short.clients == mix.clients == {"aiortc": 5}
    assert short == mix.__class__(**{**mix.__dict__, "source": short.source})
    assert not short.needs_browser and short.total_per_region == 5
    # config.json keeps the older names beside the mix
    d = short.to_dict()
    assert (d["clients"], d["sessions_per_region"], d["chromium_per_region"]) == (
        {"aiortc": 5}, 5, 0)


def test_a_mix_is_put_in_the_registrys_order_and_its_zero_counts_dropped():
    assert list(parse_mix({"chromium": 2, "aiortc": 3})) == ["aiortc", "chromium"]
    assert parse_mix({"aiortc": 0, "chromium": 1}) == {"chromium": 1}
    assert needs_browser({"chromium": 1}) and not needs_browser({"aiortc": 4})
    for bad, message in (({}, "a mapping"), ({"aiortc": 201}, "aiortc: 0..200"),
                         ({"chromium": 21}, "chromium: at most 20 per region"),
                         ({"aiortc": True}, "aiortc: 0..200"), ({"aiortc": 0}, "at least one")):
        with pytest.raises(ValueError, match=message):
            parse_mix(bad)


def test_one_command_per_client_type_browsers_first_sessions_numbered_across_types(tmp_path):
    sc = load(tmp_path, "clients: {chromium: 2, aiortc: 6}\nfull_clients_per_region: 2\n")
    where = RegionClients("http://203.0.113.10:8080/v1/calls", "apac-se", LOGS, number=1,
                          regions=2, retry_setup=True, rx_log=Path("/run/cap/client3.rx.jsonl"))
    browser, aiortc = commands(sc, where, extra_args=["--ice-from-signaling"])

    assert (browser.client_type, browser.name, browser.sessions) == ("chromium",
                                                                     "browser-apac-se", 2)
    assert browser.ready_event == "browser_ready" and browser.ready_timeout_s == 30
    # a renderer stays ordinary; the aiortc clients take the clients' real-time priority
    assert (browser.realtime, aiortc.realtime) == (False, True)
    # 2 browser sessions over the 6 aiortc sessions' 3 s window: 0.667/s; region 1 of 2
    # starts at (1 + 0.5) / (2 * 0.667) s; its indices follow the aiortc sessions' 0..5
    assert list(browser.argv) == [
        "browser", "--url", "http://203.0.113.10:8080/v1/calls", "-n", "2", "--rate", "0.667",
        "--start-delay", "1.125", "--duration", "4.0", "--offer", "alternate",
        "--index-base", "6", "--results", "/run/logs/sessions-apac-se-chromium.jsonl",
        "--samples", "/run/logs/samples-apac-se-chromium.jsonl", "-q", "--ice-from-signaling"]
    assert (aiortc.name, aiortc.ready_event, aiortc.log_path(LOGS)) == (
        "client-apac-se", None, LOGS / "client-apac-se.log")
    assert list(aiortc.argv) == [
        "client", "--url", "http://203.0.113.10:8080/v1/calls", "-n", "6", "--rate", "2.0",
        "--full-clients", "2", "--phase", "0.5", "--duration", "4.0",
        "--media-timeout", "2.5",
        "--reconnect-attempts", "1", "--retry-setup", "--rx-log", "/run/cap/client3.rx.jsonl",
        "--results", "/run/logs/sessions-apac-se.jsonl",
        "--samples", "/run/logs/samples-apac-se.jsonl", "--ice-from-signaling"]


def test_the_commands_are_what_the_clients_own_parsers_take(tmp_path):
    sc = load(tmp_path, "clients: {aiortc: 3, chromium: 1}\nlight_path: native\n")
    where = RegionClients("http://127.0.0.1:8080/v1/calls", "eu-west", LOGS)
    by_type = {c.client_type: c for c in commands(sc, where, ("audio", "datachannel"))}
    aiortc = build_parser().parse_args(list(by_type["aiortc"].argv))
    assert aiortc.light_path == "native"   # the scenario's light_path reaches the pump
    config = config_from_args(aiortc)
    assert (aiortc.sessions, config.full_sessions, config.duration_s) == (3, 2, 4.0)
    assert config.verifies == ("audio", "datachannel") and not config.retry_setup
    browser = build_parser().parse_args(list(by_type["chromium"].argv))
    assert (browser.sessions, browser.index_base, browser.verify) == (1, 3, "audio,datachannel")
    assert browser.offer == "gathered"   # one browser session, first region
    assert config.start_at_unix is None      # no clock given: calls start once it is up


def test_a_conversation_reaches_both_kinds_of_caller_with_a_folder_each(tmp_path):
    from services.browser.cli import config_from_args as browser_config

    sc = load(tmp_path, "clients: {aiortc: 3, chromium: 1}\nlight_path: native\n"
                        "conversation: {turns: 3, barge_in_share: 0.5}\n")
    where = RegionClients("http://127.0.0.1:8080/v1/calls", "eu-west", LOGS)
    by_type = {c.client_type: c for c in commands(sc, where)}
    aiortc = config_from_args(build_parser().parse_args(list(by_type["aiortc"].argv)))
    browser = browser_config(build_parser().parse_args(list(by_type["chromium"].argv)))
    for config in (aiortc, browser):
        assert (config.conversation.turns, config.conversation.barge_in_share) == (3, 0.5)
    assert aiortc.audio_dir == str(LOGS / "audio-eu-west")
    assert browser.audio_dir == str(LOGS / "audio-eu-west-chromium")


def test_a_fault_runs_clock_reaches_the_client_as_its_first_calls_time(tmp_path):
    sc = load(tmp_path, "clients: {aiortc: 3}\n")
    where = RegionClients("http://127.0.0.1:8080/v1/calls", "eu-west", LOGS,
                          start_at_unix=1796543728.254737)
    [aiortc] = commands(sc, where)
    config = config_from_args(build_parser().parse_args(list(aiortc.argv)))
    assert config.start_at_unix == 1796543728.254737


def test_a_runs_start_file_reaches_the_client(tmp_path):
    sc = load(tmp_path, "clients: {aiortc: 3}\n")
    where = RegionClients("http://127.0.0.1:8080/v1/calls", "eu-west", LOGS,
                          start_file=LOGS / "calls-start")
    [aiortc] = commands(sc, where)
    config = config_from_args(build_parser().parse_args(list(aiortc.argv)))
    assert config.start_file == str(LOGS / "calls-start") and config.start_at_unix is None


def test_a_scenarios_mix_is_checked_with_the_registrys_words(tmp_path):
    with pytest.raises(ScenarioError, match="clients: .*types aiortc, chromium"):
        load(tmp_path, "clients: {aiortc: 2, webkit: 1}\n")
    with pytest.raises(ScenarioError, match="full_clients_per_region: 0..sessions_per_region"):
        load(tmp_path, "clients: {aiortc: 2}\nfull_clients_per_region: 3\n")


# -- what a session verifies ---------------------------------------------------------------------

SENT = {"type": "conversation.item.create", "item": {"type": "message", "role": "user"}}


def test_verify_names_are_checked_and_envelope_brings_datachannel():
    assert parse_verifies("audio,datachannel,envelope") == ("audio", "datachannel", "envelope")
    assert parse_verifies("envelope, audio") == ("audio", "datachannel", "envelope")
    assert parse_verifies("") == ()
    with pytest.raises(ValueError, match="unknown check.*video"):
        parse_verifies("audio,video")


def test_a_raw_or_wrapped_echo_is_told_apart():
    raw = '{"item": {"role": "user", "type": "message"}, "type": "conversation.item.create"}'
    assert echo_form(SENT, raw) == RAW   # the same event, keys in another order
    assert echo_form(SENT, '{"type": "agent.echo", "event": ' + raw + '}') == ENVELOPE
    assert echo_form(SENT, '{"type": "agent.echo", "event": {"type": "other"}}') is None
    assert echo_form(SENT, "not json") is None and echo_form(None, raw) is None


@pytest.mark.parametrize("verifies, audio, echo, expected", [
    (("audio", "datachannel", "envelope"), True, ENVELOPE, ["audio", "datachannel", "envelope"]),
    (("audio", "datachannel", "envelope"), True, RAW, ["audio"]),   # today's rule
    (("audio", "datachannel"), True, RAW, ["audio", "datachannel"]),  # an edge echoing raw
    (("audio", "datachannel"), False, ENVELOPE, ["datachannel"]),
    (("audio",), True, None, ["audio"]),                            # no data-channel echo
])
def test_what_passed_of_what_was_asked(verifies, audio, echo, expected):
    assert verified(verifies, audio, echo) == expected


def test_verify_of_the_scenario_command_is_for_a_target_only():
    proc = subprocess.run([sys.executable, "-m", "voiceedge", "scenario",
                           str(REPO / "scenarios" / "ci.yaml"), "--verify", "audio"],
                          capture_output=True, text=True, cwd=REPO, timeout=60)
    assert proc.returncode == 2 and "--verify is for --target" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("key", ["media_path", "light_path"])
def test_a_media_path_other_than_python_or_native_is_one_line(tmp_path, key):
    with pytest.raises(ScenarioError, match=f"{key}: python or native \\('rust'\\)"):
        load(tmp_path, f"clients: {{aiortc: 2}}\n{key}: rust\n")
    assert getattr(load(tmp_path, f"clients: {{aiortc: 2}}\n{key}: native\n"), key) == "native"
    assert getattr(load(tmp_path, "clients: {aiortc: 2}\n"), key) == "python"
