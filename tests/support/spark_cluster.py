"""A standalone Spark cluster on loopback: one master and N workers, each its own JVM started
from the `pyspark` package's own `bin/spark-class` (no Spark download, no `sbin` daemons
scripts: the processes are this harness's children, in process groups of their own, so a
test can kill one and the harness always cleans up).

Each worker offers one core and modest memory (`WORKER_MEMORY`), and keeps its executors'
work directories under the cluster's temp dir. Executors run Python workers with this
interpreter (`PYSPARK_PYTHON`, passed to the workers and asked for by the driver through
`cluster_conf`), so they import pygazette from the same install as the driver.

Ports: the master's RPC port is chosen by tests/support/ports.py and started through
`start_retrying` (Spark's own port+1 retries are off, so a taken port fails the start and
moves); its web UI gets a free port too (`ui_url`). Workers bind port 0 for RPC and UI (the
kernel picks as they bind; nothing needs those ports ahead).

    python -m tests.support.spark_cluster [--workers 2] [--dir DIR]

starts a cluster for people (`make spark-cluster`), prints its master URL and waits for
Ctrl-C.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.ports import (
    PortInUse,
    ServerPort,
    listens_on,
    log_size,
    output_since,
    says_port_taken,
    start_retrying,
)
from tests.support.spark_session import spark_env

WORKER_MEMORY = "1g"  # What each worker offers its executors.
EXECUTOR_MEMORY = "512m"  # What the driver asks for per executor (cluster_conf).
DAEMON_MEMORY = "256m"  # The master's and each worker's own heap.
DAEMON_JAVA_OPTS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
START_TIMEOUT = 180.0  # JVM start-ups on a loaded machine.
_REGISTERED = "Successfully registered with master"


def spark_class() -> Path:
    """The `spark-class` launcher of the installed pyspark package."""
    import pyspark

    path = Path(pyspark.__file__).parent / "bin" / "spark-class"
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: is pyspark installed with its launcher?")
    return path


@dataclass
class _Daemon:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path


@dataclass
class SparkCluster:
    """A master and `workers` workers under `root` (logs, work dirs, an empty conf dir)."""

    root: Path
    workers: int = 2
    faults_dir: Path | None = None
    master_port: ServerPort = field(default_factory=ServerPort)
    ui_port: ServerPort = field(default_factory=ServerPort)
    started_in: float = 0.0  # Seconds from the first JVM's launch to every worker registered.
    _master: _Daemon | None = None
    _workers: list[_Daemon] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.master_port.number}"

    @property
    def ui_url(self) -> str:
        return f"http://127.0.0.1:{self.ui_port.number}"

    def env(self) -> dict[str, str]:
        """The environment of the master, workers (and so executors) and of a driver."""
        conf = self.root / "conf"
        conf.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env.update(spark_env(self.faults_dir or self.root / "no-faults"))
        env["SPARK_CONF_DIR"] = str(conf)  # No spark-defaults.conf from elsewhere.
        env["SPARK_DAEMON_MEMORY"] = DAEMON_MEMORY
        env["SPARK_LOG_DIR"] = str(self.root / "logs")
        env["SPARK_WORKER_DIR"] = str(self.root / "work")
        env["SPARK_NO_DAEMONIZE"] = "1"
        return env

    # Starting.

    def start(self) -> SparkCluster:
        began = time.monotonic()
        self.root.mkdir(parents=True, exist_ok=True)
        try:
            start_retrying(self._start_all, [self.master_port, self.ui_port])
            for w in self._workers:
                self._await_registered(w)
        except BaseException:
            self.stop()
            raise
        self.started_in = time.monotonic() - began
        return self

    def _launch(self, name: str, args: list[str], extra_opts: str = "") -> _Daemon:
        log = self.root / f"{name}.log"
        env = self.env()
        # Daemons do little work: the client compiler and one GC thread start them faster.
        env["SPARK_DAEMON_JAVA_OPTS"] = f"{DAEMON_JAVA_OPTS} {extra_opts}".strip()
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                [str(spark_class()), *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=self.root,
                start_new_session=True,  # Its own group: executors die with their worker.
            )
        return _Daemon(name, proc, log)

    def _start_all(self) -> None:
        """Launch the master and the workers at once (a worker's JVM takes as long to start
        as the master's; one that finds no master yet retries its registration), and wait
        for the master to listen. A taken port stops the workers too: they point at it."""
        self._workers = [self._launch_worker(i) for i in range(self.workers)]
        try:
            self._start_master()
        except BaseException:
            for w in self._workers:
                _kill_group(w.proc)
            raise

    def _start_master(self) -> None:
        port, ui = self.master_port.peek(), self.ui_port.peek()
        offset = log_size(self.root / "master.log")
        master = self._launch(
            "master",
            [
                "org.apache.spark.deploy.master.Master",
                "--host", "127.0.0.1",
                "--port", str(port),
                "--webui-port", str(ui),
            ],
            # A taken port fails the start (and moves) instead of Spark trying port+1; no
            # REST submission server (it would take the fixed port 6066).
            "-Dspark.port.maxRetries=0 -Dspark.master.rest.enabled=false",
        )  # fmt: skip
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if master.proc.poll() is not None:
                output = output_since(master.log, offset)
                if says_port_taken(output):
                    raise PortInUse(f"spark master: port {port} or {ui} was taken")
                raise RuntimeError(f"spark master exited ({master.proc.returncode}):\n{output}")
            if listens_on(master.proc.pid, port):
                self._master = master
                return
            time.sleep(0.1)
        _kill_group(master.proc)
        raise TimeoutError(
            f"spark master did not listen on {port}:\n{output_since(master.log, offset)}"
        )

    def _launch_worker(self, i: int) -> _Daemon:
        work = self.root / f"work-{i}"
        work.mkdir(parents=True, exist_ok=True)
        return self._launch(
            f"worker-{i}",
            [
                "org.apache.spark.deploy.worker.Worker",
                "--host", "127.0.0.1",
                "--port", "0",
                "--webui-port", "0",
                "--cores", "1",
                "--memory", WORKER_MEMORY,
                "--work-dir", str(work),
                f"spark://127.0.0.1:{self.master_port.peek()}",
            ],
        )  # fmt: skip

    def _await_registered(self, w: _Daemon) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if _REGISTERED in output_since(w.log, 0):
                return
            if w.proc.poll() is not None:
                raise RuntimeError(f"spark {w.name} exited:\n{output_since(w.log, 0)[-4000:]}")
            time.sleep(0.1)
        raise TimeoutError(f"spark {w.name} did not register:\n{output_since(w.log, 0)[-4000:]}")

    # Processes.

    def worker_pid(self, i: int) -> int:
        return self._workers[i].proc.pid

    def executor_pids(self, i: int | None = None) -> list[int]:
        """The executor JVMs (CoarseGrainedExecutorBackend) of worker `i`, or of every worker."""
        daemons = self._workers if i is None else [self._workers[i]]
        groups = {d.proc.pid for d in daemons}
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes()
                pgid = os.getpgid(int(entry.name))
            except (OSError, ProcessLookupError):
                continue
            if pgid in groups and b"CoarseGrainedExecutorBackend" in cmdline:
                found.append(int(entry.name))
        return sorted(found)

    def stop_worker(self, i: int) -> None:
        """Stop worker `i` and its executors (the cluster goes on with the others)."""
        _kill_group(self._workers[i].proc)

    def stop(self) -> None:
        for w in self._workers:
            _kill_group(w.proc)
        if self._master is not None:
            _kill_group(self._master.proc)

    def logs(self) -> str:
        """Every daemon's log, for a failing test's message."""
        daemons = ([self._master] if self._master else []) + self._workers
        return "\n".join(f"--- {d.name}\n{output_since(d.log, 0)[-3000:]}" for d in daemons)

    def __enter__(self) -> SparkCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def cluster_conf(cluster: SparkCluster, app: str) -> dict[str, str]:
    """Driver settings for an application on `cluster`: both workers' cores, executors that
    fit a worker, the venv's Python and the fault injection directory on executors."""
    env = cluster.env()
    conf = {
        "spark.master": cluster.url,
        "spark.app.name": app,
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.executor.memory": EXECUTOR_MEMORY,
        "spark.executor.cores": "1",
        "spark.cores.max": str(cluster.workers),
        "spark.pyspark.python": sys.executable,
        "spark.executorEnv.PYSPARK_PYTHON": sys.executable,
        # Python workers (tasks', and the driver's streaming source runner) start slowly on
        # a loaded machine: Spark's 15 s to connect back failed queries there.
        "spark.python.authenticate.socketTimeout": "120s",
    }
    from pygazette.spark.faults import FAULTS_ENV

    conf[f"spark.executorEnv.{FAULTS_ENV}"] = env[FAULTS_ENV]
    return conf


def _kill_group(proc: subprocess.Popen[bytes], grace: float = 5.0) -> None:
    """SIGTERM the process's group (a worker stops its executors), then SIGKILL what is left."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # Executors and Python workers left behind.
    except ProcessLookupError:
        pass
    proc.wait(10)


@contextmanager
def running_cluster(root: Path | None = None, workers: int = 2) -> Iterator[SparkCluster]:
    """A started cluster under `root` (a fresh temp dir, removed afterwards, if None)."""
    with tempfile.TemporaryDirectory(prefix="spark-cluster-") as tmp:
        with SparkCluster(root or Path(tmp), workers=workers) as cluster:
            yield cluster


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Start a standalone Spark cluster on loopback.")
    parser.add_argument("--workers", type=int, default=2, help="workers, one core each")
    parser.add_argument("--dir", type=Path, default=None, help="logs and work dirs (temp)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = _parse_args(argv)
    with running_cluster(args.dir, args.workers) as cluster:
        print(f"Spark master: {cluster.url}  (web UI {cluster.ui_url})", flush=True)
        print(f"{cluster.workers} workers, 1 core each; started in {cluster.started_in:.1f} s")
        print(f"logs and work dirs: {cluster.root}")
        # PYSPARK_PYTHON in spark-submit's environment, not spark.pyspark.python: Spark runs
        # the `gazette` format it finds by itself with that variable (else `python3` on the
        # workers' PATH), whatever the setting says.
        print(
            f"submit with: PYSPARK_PYTHON={sys.executable} .venv/bin/spark-submit --master "
            f"{cluster.url} --conf spark.executor.memory={EXECUTOR_MEMORY} your_job.py"
        )
        print("Ctrl-C stops it.", flush=True)
        try:
            while all(w.proc.poll() is None for w in cluster._workers):
                time.sleep(1)
            print("a worker exited:\n" + cluster.logs(), file=sys.stderr)
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
