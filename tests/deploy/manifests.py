"""deploy/'s kustomize overlays rendered with `kustomize build` (interop/bin/kustomize, built
by deploy/build-kustomize), as lists of Kubernetes objects, and what a container of them runs."""

from __future__ import annotations

import functools
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
KUSTOMIZE = REPO / "interop" / "bin" / "kustomize"
OVERLAYS = ("production", "examples", "tls-auth", "test")
WORKLOADS = ("Deployment", "StatefulSet", "Job")

__all__ = [
    "DEPLOY",
    "OVERLAYS",
    "REPO",
    "Container",
    "containers",
    "kustomize_binary",
    "render",
    "render_text",
]


@functools.cache
def kustomize_binary() -> Path:
    """interop/bin/kustomize, built (once, cached) if missing or out of date."""
    subprocess.run([str(DEPLOY / "build-kustomize")], check=True)
    return KUSTOMIZE


def render_text(overlay: str | Path) -> str:
    """`kustomize build` of an overlay (a name under deploy/overlays, or a directory)."""
    path = overlay if isinstance(overlay, Path) else DEPLOY / "overlays" / overlay
    run = subprocess.run(
        [str(kustomize_binary()), "build", str(path)], capture_output=True, text=True
    )
    if run.returncode != 0:
        raise RuntimeError(f"kustomize build {path} failed:\n{run.stderr}")
    return run.stdout


def render(overlay: str | Path) -> list[dict[str, Any]]:
    """The overlay's objects."""
    return [doc for doc in yaml.safe_load_all(render_text(overlay)) if doc]


@dataclass
class Container:
    """One container of a workload, with what its shell script runs."""

    workload: dict[str, Any]
    spec: dict[str, Any]

    @property
    def kind(self) -> str:
        return str(self.workload["kind"])

    @property
    def name(self) -> str:
        return str(self.workload["metadata"]["name"])

    @property
    def pod(self) -> dict[str, Any]:
        return self.workload["spec"]["template"]  # type: ignore[no-any-return]

    @property
    def script(self) -> str:
        """Its shell script ("" when it runs a program directly, as etcd does)."""
        command = self.spec.get("command", [])
        return str(command[2]) if command[:2] == ["/bin/sh", "-ec"] else ""

    def env(self) -> dict[str, dict[str, Any]]:
        """Its environment by name (each entry as written: value or valueFrom)."""
        return {e["name"]: e for e in self.spec.get("env", [])}

    def ports(self) -> dict[str, int]:
        return {p["name"]: int(p["containerPort"]) for p in self.spec.get("ports", [])}

    def commands(self, program: str) -> list[list[str]]:
        """Each command line of its script that runs `program` (continuations joined), as
        words (quotes removed, variables left as written)."""
        joined = re.sub(r"\\\n", " ", self.script)
        out = []
        for line in joined.splitlines():
            words = [w.strip('"') for w in line.split()]
            if words and words[0] == "exec":
                words = words[1:]
            if words and words[0] == program:
                out.append(words)
        return out


def containers(objects: list[dict[str, Any]]) -> list[Container]:
    out = []
    for obj in objects:
        if obj["kind"] in WORKLOADS:
            for spec in obj["spec"]["template"]["spec"]["containers"]:
                out.append(Container(obj, spec))
    return out
