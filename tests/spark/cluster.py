"""A Spark standalone cluster on this machine, as a team would run one: a master and two workers started from
PySpark's own `spark-class`, each worker with its own work directory, and executors whose Python has PySpark, pyarrow
and pandas but not metaledger (the checkout is hidden from them: `unshare` mounts an empty tmpfs over it for the
executor's Python only). The job's code and dependencies reach executors only through `make spark-dist`'s archive.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import venv
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from app.embedded_pg import free_port

ROOT = Path(__file__).resolve().parents[2]
SITE = Path(sys.prefix) / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
SPARK_HOME = SITE / "pyspark"
# What a cluster image's Python typically has: PySpark (its Python part; the JVM side is the worker's) and pandas.
CLUSTER_PACKAGES = (
    "pyspark",
    "py4j",
    "pyarrow",
    "pandas",
    "numpy",
    "dateutil",
    "python_dateutil",
    "pytz",
    "tzdata",
    "six",
)


def spark_dist() -> tuple[Path, Path]:
    """`make spark-dist` (a no-op when its sources did not change): (the wheel, the dependency archive)."""
    build = subprocess.run(["make", "-s", "spark-dist"], cwd=ROOT, capture_output=True, text=True)
    assert build.returncode == 0, build.stdout + build.stderr
    deps = ROOT / "dist" / "spark" / "metaledger-spark-deps.zip"
    return next((ROOT / "dist" / "spark").glob("metaledger-*.whl")), deps


def cluster_python(base: Path) -> Path:
    """A bare Python outside the checkout with only the cluster image's packages (hard links into this venv's
    files, no copy), and the wrapper executors run: the checkout and this venv are hidden from it."""
    env = base / "cluster-python"
    venv.create(env, with_pip=False, symlinks=True)
    target = env / "lib" / SITE.parent.name / "site-packages"
    for source in sorted(
        {
            p
            for name in CLUSTER_PACKAGES
            for p in SITE.glob(f"{name}*")
            if p.name in (name, f"{name}.py") or p.name.startswith((f"{name}.libs", f"{name}-"))
        }
    ):
        name = source.name
        if source.is_dir():
            # with their compiled modules (__pycache__): an executor's Python does not compile pandas again
            shutil.copytree(source, target / name, copy_function=os.link, ignore=shutil.ignore_patterns("jars"))
        else:
            os.link(source, target / name)
    wrapper = base / "cluster-python.sh"
    wrapper.write_text(
        "#!/bin/sh\n"
        f"exec unshare -m --propagation private sh -c 'mount -t tmpfs none {ROOT} && exec {env}/bin/python \"$@\"' "
        'sh "$@"\n'
    )
    wrapper.chmod(0o755)
    probe = subprocess.run(
        [wrapper, "-c", "import pyspark, pyarrow, pandas\ntry:\n import app\nexcept ImportError:\n print('bare')"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert probe.stdout.strip() == "bare", (probe.stdout, probe.stderr)
    return wrapper


@dataclass
class Cluster:
    base: Path
    master_port: int = field(default_factory=free_port)
    ui_port: int = field(default_factory=free_port)
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.master_port}"

    def _start(self, name: str, *args: str) -> None:
        log = (self.base / f"{name}.log").open("ab")
        env = {
            **os.environ,
            "SPARK_HOME": str(SPARK_HOME),
            "SPARK_LOG_DIR": str(self.base / "logs"),
            "SPARK_NO_DAEMONIZE": "1",
            "SPARK_DAEMON_JAVA_OPTS": "-XX:TieredStopAtLevel=1",
        }  # less JVM CPU
        self.processes[name] = subprocess.Popen(
            [str(SPARK_HOME / "bin" / "spark-class"), *args],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def start(self, workers: int = 2) -> None:
        self._start(
            "master",
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.master_port),
            "--webui-port",
            str(self.ui_port),
        )
        for i in range(workers):
            work = self.base / f"worker-{i}"
            work.mkdir(parents=True, exist_ok=True)
            self._start(
                f"worker-{i}",
                "org.apache.spark.deploy.worker.Worker",
                "--host",
                "127.0.0.1",
                "--cores",
                "1",
                "--memory",
                "1g",
                "--work-dir",
                str(work),
                "--webui-port",
                str(free_port()),
                self.url,
            )
        self.wait(lambda state: sum(w["state"] == "ALIVE" for w in state["workers"]) == workers, "workers alive")

    def state(self) -> dict:
        return httpx.get(f"http://127.0.0.1:{self.ui_port}/json/", timeout=5).json()

    def wait(self, ready, what: str, timeout: float = 90) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            try:
                state = self.state()
                if ready(state):
                    return state
            except (httpx.HTTPError, ValueError):  # not up yet, or its JSON cut short while it starts
                pass
            for name, process in self.processes.items():
                assert process.poll() is None or name.startswith("worker"), (self.base / f"{name}.log").read_text()
            assert time.monotonic() < deadline, f"cluster: no {what} after {timeout} s"
            time.sleep(0.2)

    def kill_worker(self, i: int) -> None:
        """A node lost: the worker's JVM and its executors, SIGKILL."""
        os.killpg(self.processes[f"worker-{i}"].pid, signal.SIGKILL)

    def worker_ran_tasks(self, i: int, app: str) -> bool:
        """Whether an executor of worker i ran a Python task of application `app` (its work directory holds the
        unpacked archive)."""
        return any((self.base / f"worker-{i}" / app).glob("*/metaledger_deps"))

    def stop(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)
        # each executor unpacked the 110 MB archive into its work directory (670 MB for the test's applications):
        # those copies go, the executors' logs beside them stay for a failure's post-mortem
        for unpacked in self.base.glob("worker-*/app-*/*/metaledger_deps"):
            shutil.rmtree(unpacked, ignore_errors=True)
