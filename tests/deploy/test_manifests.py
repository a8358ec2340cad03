"""deploy/'s overlays render with `kustomize build`, and what they declare holds together:
every `pygazette` command line uses flags the CLI has and variables the container sets;
probes, ports, Prometheus annotations, zones and advertised addresses are wired as the
README says; Services select pods; production runs three etcd members; tls-auth gives every
process TLS and auth keys from Secrets."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import click
import pytest

from pygazette.cli.main import cli
from pygazette.stores.store_url import parse_store_url
from tests.deploy.manifests import OVERLAYS, Container, containers, render


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    with ThreadPoolExecutor(len(OVERLAYS)) as pool:  # kustomize builds take seconds each.
        return dict(zip(OVERLAYS, pool.map(render, OVERLAYS), strict=True))


def _command(words: list[str]) -> tuple[click.Command, list[str]]:
    """The click command a `pygazette ...` line runs, and its flags (root ones included)."""
    command: click.Command = cli
    flags = []
    ctx = click.Context(cli)
    for word in words[1:]:
        if word.startswith("--"):
            flags.append(word.split("=", 1)[0])
        elif isinstance(command, click.Group) and word in command.list_commands(ctx):
            sub = command.get_command(ctx, word)
            assert sub is not None, f"pygazette has no command {word!r}: {words}"
            command = sub
    return command, flags


def _options(command: click.Command) -> set[str]:
    return {opt for p in command.params for opt in p.opts if opt.startswith("--")}


def _pygazette_lines(c: Container) -> list[list[str]]:
    return c.commands("pygazette")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_command_lines_use_real_flags_and_set_variables(
    rendered: dict[str, list[dict[str, Any]]], overlay: str
) -> None:
    lines = 0
    root_options = _options(cli)
    for c in containers(rendered[overlay]):
        env = c.env()
        used = set(re.findall(r"\$\{?([A-Z_][A-Z0-9_]*)", c.script))
        missing = used - set(env)
        assert not missing, f"{overlay}/{c.name}: script uses unset {sorted(missing)}"
        for words in _pygazette_lines(c):
            lines += 1
            command, flags = _command(words)
            unknown = set(flags) - _options(command) - root_options
            assert not unknown, f"{overlay}/{c.name}: {command.name} has no {sorted(unknown)}"
    assert lines >= 3


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_servers_probe_ready_and_export_metrics(
    rendered: dict[str, list[dict[str, Any]]], overlay: str
) -> None:
    servers = [c for c in containers(rendered[overlay]) if c.kind == "Deployment"
               and c.spec["image"].split(":")[0].endswith("/pygazette")]
    kinds = {("serve" if w[1] == "serve" else "consumer") for c in servers
             for w in _pygazette_lines(c)}
    assert kinds == ({"serve"} if overlay == "production" else {"serve", "consumer"})
    for c in servers:
        ports = c.ports()
        assert set(ports) == {"grpc", "http"}, c.name
        env = c.env()
        http_var = "BROKER_HTTP_PORT" if "BROKER_HTTP_PORT" in env else "CONSUMER_HTTP_PORT"
        assert int(env[http_var]["value"]) == ports["http"], c.name
        ready, live = c.spec["readinessProbe"]["httpGet"], c.spec["livenessProbe"]["httpGet"]
        assert (ready["path"], ready["port"]) == ("/debug/ready", "http"), c.name
        assert (live["path"], live["port"]) == ("/debug/live", "http"), c.name
        notes = c.pod["metadata"]["annotations"]
        assert notes["prometheus.io/scrape"] == "true"
        assert notes["prometheus.io/path"] == "/metrics"
        assert int(notes["prometheus.io/port"]) == ports["http"], c.name
        # --advertise is the pod's address (loopback on the test's host network), and the
        # zone comes from the pod's own label.
        (words,) = _pygazette_lines(c)
        advertise = words[words.index("--advertise") + 1]
        assert re.fullmatch(r"\$(BROKER|CONSUMER)_SCHEME://\$POD_IP:\$(BROKER|CONSUMER)_PORT",
                            advertise), advertise
        pod_ip = env["POD_IP"]
        if overlay == "test":
            assert pod_ip["value"] == "127.0.0.1" and c.pod["spec"]["hostNetwork"] is True
        else:
            assert pod_ip["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
        assert words[words.index("--zone") + 1] == "$ZONE"
        label = env["ZONE"]["valueFrom"]["fieldRef"]["fieldPath"]
        key = re.fullmatch(r"metadata\.labels\['(.+)'\]", label)
        assert key and key.group(1) in c.pod["metadata"]["labels"], c.name


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_brokers_drain_within_their_grace_period(
    rendered: dict[str, list[dict[str, Any]]], overlay: str
) -> None:
    brokers = [c for c in containers(rendered[overlay])
               if any(w[1] == "serve" for w in _pygazette_lines(c))]
    zones = {c.pod["metadata"]["labels"]["pygazette.dev/zone"] for c in brokers}
    assert zones == {"zone-a", "zone-b", "zone-c"}
    for c in brokers:
        (words,) = _pygazette_lines(c)
        assert words[words.index("--drain-timeout") + 1] == "$DRAIN_TIMEOUT"
        drain = c.env()["DRAIN_TIMEOUT"]["value"]
        assert drain.endswith("s")
        assert c.pod["spec"]["terminationGracePeriodSeconds"] > int(drain[:-1]) + 10
        assert c.workload["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
        assert c.pod["spec"]["securityContext"]["runAsNonRoot"] is True


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_services_select_pods_and_their_ports(
    rendered: dict[str, list[dict[str, Any]]], overlay: str
) -> None:
    objects = rendered[overlay]
    pods = [c for c in containers(objects) if c.kind != "Job"]
    for svc in (o for o in objects if o["kind"] == "Service"):
        selector = svc["spec"]["selector"]
        matched = [c for c in pods
                   if selector.items() <= c.pod["metadata"]["labels"].items()]
        assert matched, f"{overlay}: Service {svc['metadata']['name']} selects no pod"
        for port in svc["spec"]["ports"]:
            target = port.get("targetPort", port["name"])
            assert all(target in c.ports() for c in matched), (svc["metadata"]["name"], target)
    for c in pods:
        selector = c.workload["spec"]["selector"]["matchLabels"]
        assert selector.items() <= c.pod["metadata"]["labels"].items(), c.name


def test_etcd_members(rendered: dict[str, list[dict[str, Any]]]) -> None:
    for overlay, members in (("production", 3), ("test", 1)):
        (etcd,) = [c for c in containers(rendered[overlay]) if c.name == "etcd"]
        assert etcd.spec["command"] == ["etcd"]  # etcd's images have no shell.
        assert etcd.workload["spec"]["replicas"] == members
        env = {k: v.get("value") for k, v in etcd.env().items()}
        cluster = dict(m.split("=", 1) for m in env["ETCD_INITIAL_CLUSTER"].split(","))
        assert len(cluster) == members
        if overlay == "production":
            # Member i is pod etcd-i, reached through the headless Service.
            assert cluster == {f"etcd-{i}": f"http://etcd-{i}.etcd:2380" for i in range(3)}
            assert env["ETCD_NAME"] == "$(POD_NAME)"
            assert env["ETCD_INITIAL_ADVERTISE_PEER_URLS"] == "http://$(POD_NAME).etcd:2380"
        else:
            assert cluster[env["ETCD_NAME"]] == env["ETCD_INITIAL_ADVERTISE_PEER_URLS"]
    (etcd,) = [c for c in containers(rendered["production"]) if c.name == "etcd"]
    assert [t["metadata"]["name"] for t in etcd.workload["spec"]["volumeClaimTemplates"]] == [
        "data"
    ]
    assert not etcd.pod["spec"].get("volumes")
    services = [o for o in rendered["production"] if o["kind"] == "Service"
                and o["metadata"]["name"] == etcd.workload["spec"]["serviceName"]]
    assert services and services[0]["spec"]["clusterIP"] == "None"


@pytest.mark.parametrize("overlay", ["examples", "tls-auth", "test"])
def test_apply_jobs(rendered: dict[str, list[dict[str, Any]]], overlay: str) -> None:
    jobs = [c for c in containers(rendered[overlay]) if c.kind == "Job"]
    assert {c.name for c in jobs} == {"stream-sum-apply-specs", "word-count-apply-specs"}
    for c in jobs:
        env = c.env()
        parse_store_url(env["FRAGMENT_STORE"]["value"])
        example = "stream_sum" if c.name.startswith("stream-sum") else "word_count"
        assert env["JOURNALSPACE"]["value"].endswith(f"examples/{example}/journalspace.yaml")
        assert env["SHARDSPACE"]["value"].endswith(f"examples/{example}/shards.yaml")
        consumer = env["CONSUMER_ADDRESS"]["value"]
        app = [d for d in containers(rendered[overlay])
               if d.kind == "Deployment" and d.name == c.name.replace("apply-specs", "consumer")]
        assert len(app) == 1
        port = app[0].ports()["grpc"]
        assert consumer.endswith(f":{port}") or consumer.endswith(":8081"), consumer
        assert c.pod["spec"]["restartPolicy"] == "OnFailure"
        assert "pygazette.cli.deploy_specs" in c.script


def test_tls_and_auth_keys_from_secrets(rendered: dict[str, list[dict[str, Any]]]) -> None:
    for c in containers(rendered["tls-auth"]):
        if not c.spec["image"].split(":")[0].endswith("/pygazette"):
            continue
        env = c.env()
        assert env["AUTH_KEYS"]["valueFrom"]["secretKeyRef"]["name"] == "pygazette-auth-keys"
        volumes = {v["name"]: v for v in c.pod["spec"]["volumes"]}
        assert volumes["tls"]["secret"]["secretName"] == "pygazette-tls"
        files = {k: v["value"] for k, v in env.items() if k.endswith("_FILE")}
        assert files and all(f.startswith("/etc/pygazette/tls/") for f in files.values())
        for address in ("BROKER_ADDRESS", "CONSUMER_ADDRESS"):
            if address in env:
                assert env[address]["value"].startswith("https://")
        if c.kind == "Deployment":
            assert c.spec["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
            scheme = env.get("BROKER_SCHEME", env.get("CONSUMER_SCHEME"))
            assert scheme is not None and scheme["value"] == "https"


def test_test_overlay_runs_local_images(rendered: dict[str, list[dict[str, Any]]]) -> None:
    images = {c.spec["image"] for c in containers(rendered["test"])}
    assert images == {"localhost/pygazette:dev", "localhost/pygazette-tools:dev"}
