"""`make deploy-test`: deploy/overlays/test, rendered with `kustomize build`, played with
`podman kube play` and checked end to end:

1. Renders the overlay and maps its nominal ports (the 17xxx numbers) to free loopback
   ports. podman 4.3 plays Pods, Deployments and ConfigMaps only, so a StatefulSet (etcd,
   one member) is played as a Deployment, a Job as a Pod of its template (restartPolicy
   OnFailure, as the Job's), a Secret is created with `podman secret create` (which
   `secretKeyRef` and `envFrom.secretRef` read), and Services are left out (everything is
   on the host network, at 127.0.0.1). Containers' ports and probes are left out too: on
   the host network podman refuses port mappings, and it runs no readinessProbe; this
   waits on each server's /debug/ready (etcd's /health) itself.
2. Plays etcd and the S3 store, then the three brokers (one per zone), then the summer,
   the counter and the two apply Jobs; waits for each to be ready and the Jobs to exit 0.
3. Runs stream-sum's chunker (from this checkout, against the played broker and summer):
   every stream's sum must be present, correct and once.
4. Checks that the brokers took their zones from their pods' labels (every route spans
   distinct zones), then kills the zone-c broker's pod (SIGKILL) while a second, longer
   chunker runs: every journal must be routed again without it (a primary and full
   replication among the survivors, once its lease expires), and the chunker must still
   verify every sum. Plays the Deployment again (as its controller would) and waits for
   it to be ready.
5. Stops the zone-b broker's pod gracefully (SIGTERM, as a rolling upgrade does) while a
   third chunker runs: it must exit 0 having handed every journal over, and every sum
   must verify. Plays it again; a last, short chunker run checks the healed cluster. A word
   is published and queried through the counter (read-your-writes).
6. Tears everything down (pods, their volumes, secrets), also on failure; on failure prints
   the tail of every container's log.

Prints one JSON summary last; exits 1 on failure.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from tests.deploy.manifests import DEPLOY, REPO, render_text
from tests.support.ports import free_port

CONTAINERS_CONF = DEPLOY / "containers.conf"
IMAGES = ("localhost/pygazette:dev", "localhost/pygazette-tools:dev")
NOMINAL_PORT = re.compile(r"\b17\d{3}\b")


class DeployTestError(RuntimeError):
    """A step of the deploy test failed."""


def podman(
    *args: str, check: bool = True, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, CONTAINERS_CONF=str(CONTAINERS_CONF))
    run = subprocess.run(
        ["podman", "--runtime", "runc", *args],
        capture_output=True, text=True, env=env, timeout=timeout,
    )
    if check and run.returncode != 0:
        raise DeployTestError(f"podman {' '.join(args)} failed:\n{run.stdout}{run.stderr}")
    return run


def step(text: str) -> None:
    print(f"[deploy-test {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def wait_for(what: str, ok: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ok():
            return
        time.sleep(0.5)
    raise DeployTestError(f"timed out after {timeout:.0f}s waiting for {what}")


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def http_answers(url: str) -> bool:
    """Whether anything answers HTTP at `url` (an S3 server refuses anonymous requests)."""
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except urllib.error.HTTPError:
        return True
    except (urllib.error.URLError, OSError):
        return False


def remap_ports(text: str) -> tuple[str, dict[int, int]]:
    """The rendered overlay with each nominal port replaced by a free one."""
    mapping = {int(p): free_port() for p in sorted(set(NOMINAL_PORT.findall(text)))}
    return NOMINAL_PORT.sub(lambda m: str(mapping[int(m.group())]), text), mapping


def as_playable(obj: dict[str, Any]) -> dict[str, Any] | None:
    """What podman 4.3 plays in place of `obj` (None: nothing, a Service)."""
    kind = obj["kind"]
    if kind in ("Deployment", "StatefulSet", "Job"):
        # On the host network podman refuses port mappings (it maps every containerPort), and
        # probes name those ports: this harness waits on readiness itself.
        # podman 4.3 shares an emptyDir among pods that name it alike: give each
        # workload's volumes names of their own.
        obj = json.loads(json.dumps(obj))
        prefix = obj["metadata"]["name"]
        pod = obj["spec"]["template"]["spec"]
        for volume in pod.get("volumes", []):
            volume["name"] = f"{prefix}-{volume['name']}"
        for container in pod["containers"]:
            for key in ("ports", "livenessProbe", "readinessProbe"):
                container.pop(key, None)
            for mount in container.get("volumeMounts", []):
                mount["name"] = f"{prefix}-{mount['name']}"
    if kind == "Deployment":
        return obj
    if kind == "StatefulSet":
        spec = {k: v for k, v in obj["spec"].items()
                if k not in ("serviceName", "podManagementPolicy", "volumeClaimTemplates")}
        return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": obj["metadata"],
                "spec": spec}
    if kind == "Job":
        template = obj["spec"]["template"]
        return {"apiVersion": "v1", "kind": "Pod",
                "metadata": {**template.get("metadata", {}), "name": obj["metadata"]["name"]},
                "spec": template["spec"]}
    if kind == "Service":
        return None
    raise DeployTestError(f"no way to play a {kind} ({obj['metadata']['name']})")


def pod_of(obj: dict[str, Any]) -> str:
    """The name podman gives the (first) pod of a played object."""
    name = str(obj["metadata"]["name"])
    return name if obj["kind"] in ("Pod", "Job") else f"{name}-pod-0"


def env_of(obj: dict[str, Any], var: str) -> str:
    for container in obj["spec"]["template"]["spec"]["containers"]:
        for e in container.get("env", []):
            if e["name"] == var:
                return str(e["value"])
    raise DeployTestError(f"{obj['metadata']['name']} sets no {var}")


class Deployment:
    """The rendered test overlay, played piece by piece, and torn down."""

    def __init__(self, work: Path) -> None:
        self.work = work
        text, self.ports = remap_ports(render_text("test"))
        self.objects = {f"{o['kind']}/{o['metadata']['name']}": o
                        for o in yaml.safe_load_all(text) if o}
        self.played: dict[str, Path] = {}
        self.secrets: list[str] = []

    def get(self, key: str) -> dict[str, Any]:
        return self.objects[key]

    def create_secrets(self) -> None:
        for obj in self.objects.values():
            if obj["kind"] == "Secret":
                name = obj["metadata"]["name"]
                # podman 4.3 reads a podman secret as a JSON object of base64 values (a
                # Kubernetes Secret's data).
                path = self.work / f"secret-{name}.json"
                path.write_text(json.dumps(obj["data"]))
                podman("secret", "rm", name, check=False)
                podman("secret", "create", name, str(path))
                self.secrets.append(name)

    def play(self, key: str) -> None:
        playable = as_playable(self.objects[key])
        assert playable is not None, key
        path = self.work / (key.replace("/", "-") + ".yaml")
        path.write_text(yaml.safe_dump(playable))
        self.played[key] = path
        podman("kube", "play", "--network", "host", str(path))

    def down(self, key: str) -> None:
        path = self.played.pop(key, None)
        if path is not None:
            podman("kube", "down", str(path), check=False)

    def kill(self, key: str) -> None:
        """SIGKILL the pod of `key`, then remove it (a node lost, not a graceful stop)."""
        pod = pod_of(self.objects[key])
        podman("pod", "kill", "--signal", "KILL", pod)
        self.down(key)

    def stop(self, key: str, grace: float) -> None:
        """SIGTERM the pod of `key`, and SIGKILL it after `grace` seconds (a pod deleted)."""
        podman("pod", "stop", "--time", str(int(grace)), pod_of(self.objects[key]),
               timeout=grace + 60)

    def exit_code(self, key: str) -> int | None:
        """The exit code of a played Job's container; None while it runs (or restarts)."""
        obj = self.objects[key]
        container = obj["spec"]["template"]["spec"]["containers"][0]["name"]
        run = podman("inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}",
                     f"{pod_of(obj)}-{container}", check=False)
        status, _, code = run.stdout.strip().partition(" ")
        return int(code) if status == "exited" else None

    def logs(self, tail: int = 40) -> str:
        out = []
        for key in list(self.played):
            run = podman("pod", "inspect", "--format", "{{range .Containers}}{{.Name}} {{end}}",
                         pod_of(self.objects[key]), check=False)
            for name in run.stdout.split():
                if name.endswith("-infra"):
                    continue
                log = podman("logs", "--tail", str(tail), name, check=False)
                out.append(f"--- {name}\n{log.stdout}{log.stderr}")
        return "\n".join(out)

    def teardown(self) -> None:
        # SIGKILL first: brokers with nobody left to drain to would wait out podman's stop
        # timeout one by one.
        for key in reversed(list(self.played)):
            podman("pod", "kill", "--signal", "KILL", pod_of(self.objects[key]), check=False)
        for key in reversed(list(self.played)):
            self.down(key)
        for name in self.secrets:
            podman("secret", "rm", name, check=False)


def replay(d: Deployment, key: str, http_base: str) -> None:
    """Play `key` again, as its controller would, and wait for it to be ready."""
    d.down(key)
    d.play(key)
    wait_for(f"{key} ready again", lambda: http_ok(f"{http_base}/debug/ready"), 180)


def run_python(*args: str, timeout: float) -> tuple[int, str, str]:
    run = subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, cwd=REPO, timeout=timeout
    )
    return run.returncode, run.stdout, run.stderr


def routes(broker: str) -> dict[str, tuple[list[str], list[str], int]]:
    """Each journal's route: its members' IDs (suffixes) and zones, and its primary's index."""
    code, out, err = run_python("-m", "pygazette.cli.main", "journals", "list", "--format",
                                "json", "--broker", broker, timeout=120)
    if code != 0:
        raise DeployTestError(f"journals list failed:\n{err}")
    out_routes = {}
    for journal in json.loads(out).get("journals", []):
        members = journal["route"].get("members", [])
        out_routes[journal["spec"]["name"]] = (
            [m["suffix"] for m in members], [m["zone"] for m in members],
            int(journal["route"].get("primary", -1)),
        )
    return out_routes


def recovered_without(broker: str, gone: str, replication: int) -> bool:
    """Whether every journal has a primary and `replication` members, none of them `gone`."""
    try:
        current = routes(broker)
    except DeployTestError:
        return False
    return bool(current) and all(
        primary >= 0 and len(ids) == replication and gone not in ids
        for ids, _, primary in current.values()
    )


def chunker(broker: str, summer: str, streams: int, chunks: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "examples.stream_sum.chunker", "--broker", broker,
         "--consumer", summer, "--streams", str(streams), "--chunks", str(chunks),
         "--workers", "2", "--timeout", "180"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def verified(proc: subprocess.Popen[str], timeout: float, streams: int) -> dict[str, Any]:
    out, err = proc.communicate(timeout=timeout)
    if proc.returncode != 0:
        raise DeployTestError(f"chunker failed ({proc.returncode}):\n{out}\n{err[-3000:]}")
    summary: dict[str, Any] = json.loads(out)
    if not summary["ok"] or summary["verified"] != streams:
        raise DeployTestError(f"chunker verified {summary['verified']} of {streams}: {summary}")
    return summary


def run(args: argparse.Namespace) -> dict[str, Any]:
    for image in IMAGES:
        if podman("image", "exists", image, check=False).returncode != 0:
            raise DeployTestError(f"no image {image}: run `make image` first")
    summary: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="pygazette-deploy-test-") as tmp:
        d = Deployment(Path(tmp))
        started = time.monotonic()
        try:
            summary = exercise(d, args)
        except BaseException:
            step("failed; container logs follow")
            print(d.logs(), file=sys.stderr)
            raise
        finally:
            step("tearing down")
            d.teardown()
        summary["elapsed_s"] = round(time.monotonic() - started, 1)
    return summary


def exercise(d: Deployment, args: argparse.Namespace) -> dict[str, Any]:
    brokers = [f"Deployment/broker-zone-{z}" for z in "abc"]
    etcd = d.get("StatefulSet/etcd")
    etcd_url = env_of(etcd, "ETCD_ADVERTISE_CLIENT_URLS")
    s3_port = env_of(d.get("Deployment/s3"), "S3_PORT")

    def http(key: str, var: str) -> str:
        return f"http://127.0.0.1:{env_of(d.get(key), var)}"

    broker_url = http(brokers[0], "BROKER_PORT")
    summer_url = http("Deployment/stream-sum-consumer", "CONSUMER_PORT")
    counter_url = http("Deployment/word-count-consumer", "CONSUMER_PORT")
    timings: dict[str, float] = {}
    t0 = time.monotonic()

    step("secrets, etcd and the S3 store")
    d.create_secrets()
    d.play("StatefulSet/etcd")
    d.play("Deployment/s3")
    wait_for("etcd /health", lambda: http_ok(f"{etcd_url}/health"), 120)
    wait_for("the S3 store", lambda: http_answers(f"http://127.0.0.1:{s3_port}/"), 120)

    step("brokers in zones a, b, c")
    for key in brokers:
        d.play(key)
    for key in brokers:
        ready = http(key, "BROKER_HTTP_PORT") + "/debug/ready"
        wait_for(f"{key} ready", lambda ready=ready: http_ok(ready), 180)
    timings["brokers_ready_s"] = round(time.monotonic() - t0, 1)

    step("consumers and the apply Jobs")
    for key in ("Deployment/stream-sum-consumer", "Deployment/word-count-consumer",
                "Job/stream-sum-apply-specs", "Job/word-count-apply-specs"):
        d.play(key)
    for key in ("Job/stream-sum-apply-specs", "Job/word-count-apply-specs"):
        wait_for(f"{key} to succeed", lambda key=key: d.exit_code(key) == 0, 300)
    for key in ("Deployment/stream-sum-consumer", "Deployment/word-count-consumer"):
        ready = http(key, "CONSUMER_HTTP_PORT") + "/debug/ready"
        wait_for(f"{key} ready", lambda ready=ready: http_ok(ready), 180)
    timings["all_ready_s"] = round(time.monotonic() - t0, 1)

    step(f"stream-sum: {args.streams} streams of {args.chunks} chunks")
    first = verified(chunker(broker_url, summer_url, args.streams, args.chunks), 600,
                     args.streams)

    # Brokers are in the zones their pods' labels name, and replicas spread over them.
    replication = int(env_of(d.get("Job/stream-sum-apply-specs"), "REPLICATION"))
    before = routes(broker_url)
    victim = f"{brokers[2].split('/')[1]}-pod-0"  # --id is the pod's name.
    zones = {z for _, zs, _ in before.values() for z in zs}
    if zones != {"zone-a", "zone-b", "zone-c"}:
        raise DeployTestError(f"brokers' zones: {sorted(zones)}")
    if any(len(set(zs)) != replication for _, zs, _ in before.values()):
        raise DeployTestError(f"a route's replicas share a zone: {before}")
    held = sorted(j for j, (ids, _, _) in before.items() if victim in ids)
    if not held:
        raise DeployTestError(f"{victim} holds no journal: {before}")

    step(f"stream-sum ({args.kill_streams} streams) across a kill of {victim} "
         f"({len(held)} of {len(before)} journals)")
    proc = chunker(broker_url, summer_url, args.kill_streams, args.chunks)
    time.sleep(args.kill_after)  # Let the run get going: the kill lands mid-stream.
    if proc.poll() is not None:
        raise DeployTestError("the chunker finished before the kill: raise --kill-streams")
    killed_at = time.monotonic()
    d.kill(brokers[2])
    wait_for(f"every journal routed without {victim}",
             lambda: recovered_without(broker_url, victim, replication), 300)
    timings["kill_to_rerouted_s"] = round(time.monotonic() - killed_at, 1)
    across = verified(proc, 900, args.kill_streams)
    timings["kill_to_verified_s"] = round(time.monotonic() - killed_at, 1)

    step("broker-zone-c played again")
    replay(d, brokers[2], http(brokers[2], "BROKER_HTTP_PORT"))

    # An upgrade's way out: SIGTERM. The broker hands its journals over before it exits.
    drained = f"{brokers[1].split('/')[1]}-pod-0"
    step(f"stream-sum ({args.kill_streams} streams) across a SIGTERM of {drained}")
    proc = chunker(broker_url, summer_url, args.kill_streams, args.chunks)
    time.sleep(args.kill_after)
    if proc.poll() is not None:
        raise DeployTestError("the chunker finished before the SIGTERM: raise --kill-streams")
    stop_at = time.monotonic()
    d.stop(brokers[1], grace=90)
    timings["sigterm_to_exit_s"] = round(time.monotonic() - stop_at, 1)
    code = d.exit_code(brokers[1])
    if code != 0:
        raise DeployTestError(f"{drained} exited {code} on SIGTERM")
    # Handed over, not waiting for its lease (10 s) to expire.
    wait_for(f"every journal routed without {drained}",
             lambda: recovered_without(broker_url, drained, replication), 5)
    drained_run = verified(proc, 900, args.kill_streams)
    replay(d, brokers[1], http(brokers[1], "BROKER_HTTP_PORT"))
    healed = verified(chunker(broker_url, summer_url, max(1, args.streams // 4), args.chunks),
                      600, max(1, args.streams // 4))

    step("word-count: publish and query (read-your-writes)")
    with tempfile.NamedTemporaryFile(suffix=".json") as offsets:
        code, out, err = run_python("-m", "examples.word_count.publish", "--broker", broker_url,
                                    "--text", "deploy the deploy test", "--offsets",
                                    offsets.name, timeout=300)
        if code != 0:
            raise DeployTestError(f"word-count publish failed:\n{out}{err}")
        code, out, err = run_python("-m", "examples.word_count.query", "deploy", "--broker",
                                    broker_url, "--consumer", counter_url, "--offsets",
                                    offsets.name, timeout=300)
        if code != 0:
            raise DeployTestError(f"word-count query failed:\n{out}{err}")
        answer = json.loads(out)
        if answer.get("count") != 2:
            raise DeployTestError(f"word-count: expected count 2 for 'deploy', got {answer}")

    def brief(s: dict[str, Any]) -> dict[str, Any]:
        return {k: s.get(k) for k in ("streams", "verified", "duplicates", "mismatches",
                                      "missing", "elapsed")}

    return {
        "ok": True,
        "ports": {str(k): v for k, v in d.ports.items()},
        "timings": timings,
        "stream_sum": brief(first),
        "stream_sum_across_broker_kill": {**brief(across), "killed": victim,
                                          "journals_it_held": len(held)},
        "stream_sum_across_broker_sigterm": {**brief(drained_run), "stopped": drained},
        "stream_sum_after_replay": brief(healed),
        "word_count": answer,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.deploy.play")
    parser.add_argument("--streams", type=int, default=40)
    parser.add_argument("--chunks", type=int, default=30)
    parser.add_argument("--kill-streams", type=int, default=300,
                        help="streams of the chunker run across the broker kill")
    parser.add_argument("--kill-after", type=float, default=3.0,
                        help="seconds into the second chunker run to kill a broker")
    args = parser.parse_args(argv)
    try:
        summary = run(args)
    except (DeployTestError, subprocess.TimeoutExpired) as exc:
        print(f"deploy-test: {exc}", file=sys.stderr)
        print(json.dumps({"ok": False, "error": str(exc)[:2000]}))
        return 1
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
