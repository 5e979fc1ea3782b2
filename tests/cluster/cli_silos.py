"""Silo processes started with the ``orleanspy silo`` command, default options, on
one store: for the tests that run a cluster as an operator would (rolling
upgrades, effectively-once ticks under kills). Silos import a grain module of
this directory (``--import``) and get the environment given; each writes its
stderr to ``<logs>/<name>.log`` (a pipe nobody reads could fill and block it)."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import IO

import pytest

from orleanspy.identity import SiloAddress
from tests.ready import read_ready, stop_processes

HERE = Path(__file__).resolve().parent
#: The silos' log level; ``ORLEANSPY_TEST_SILO_LOG=INFO`` keeps more for a diagnosis.
SILO_LOG_LEVEL = os.environ.get("ORLEANSPY_TEST_SILO_LOG", "WARNING")


class Silos:
    """Silo processes of either release on one store, by name."""

    def __init__(self, store_url: str, grains: str, env: Mapping[str, str], logs: Path) -> None:
        self.store_url = store_url
        self.logs = logs
        self.grains = grains
        self.env = {**os.environ, **env, "GRPC_ENABLE_FORK_SUPPORT": "0"}
        self.procs: dict[str, subprocess.Popen[str]] = {}
        self.addresses: dict[str, SiloAddress] = {}
        #: What each silo's READY line said after its address: gateway port, then
        #: its metrics port and ``dashboard=<port>`` when it serves them.
        self.ready: dict[str, list[str]] = {}
        self._handles: list[IO[str]] = []

    def start(self, name: str, python: Path, *settings: str) -> None:
        """Start silo ``name`` on ``python`` with the defaults but ``settings``
        (``--set`` assignments); return once it is Active."""
        extra = [arg for setting in settings for arg in ("--set", setting)]
        proc = subprocess.Popen(
            [str(python), "-P", "-m", "orleanspy", "--storage-url", self.store_url,
             "--log-level", SILO_LOG_LEVEL, "silo", "--import", self.grains,
             "--name", name, "--silo-port", "0", "--gateway-port", "0", *extra],
            stdout=subprocess.PIPE, stderr=self._log(name), text=True, cwd=HERE, env=self.env,
        )  # fmt: skip
        self.procs[name] = proc
        try:
            address, *rest = read_ready(proc, timeout=60)
        except RuntimeError:
            proc.kill()
            proc.wait(10)
            pytest.fail(f"silo {name} ({python}) did not start:\n{self.log(name)[-3000:]}")
        self.addresses[name] = SiloAddress.parse(address)
        self.ready[name] = rest

    def gateway(self, name: str) -> str:
        """Silo ``name``'s gateway endpoint."""
        return f"127.0.0.1:{self.ready[name][0]}"

    def dashboard(self, name: str) -> str:
        """The base URL of silo ``name``'s dashboard (started with a dashboard port)."""
        (port,) = [f.split("=", 1)[1] for f in self.ready[name] if f.startswith("dashboard=")]
        return f"http://127.0.0.1:{port}/"

    def stop(self, name: str) -> None:
        """SIGTERM: a graceful stop, which must exit 0 with no traceback."""
        proc = self.procs.pop(name)
        stop_processes([proc], timeout=40)
        err = self.log(name)
        assert proc.returncode == 0, f"silo {name} exited {proc.returncode}:\n{err[-3000:]}"
        assert "Traceback" not in err, f"silo {name}:\n{err[-3000:]}"

    def kill(self, name: str) -> None:
        """SIGKILL: a crash, mid-whatever."""
        proc = self.procs.pop(name)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()

    def _log(self, name: str) -> IO[str]:
        handle = (self.logs / f"{name}.log").open("a")
        self._handles.append(handle)
        return handle

    def log(self, name: str) -> str:
        """What silo ``name`` wrote to stderr so far."""
        path = self.logs / f"{name}.log"
        return path.read_text() if path.exists() else ""

    def tracebacks(self) -> dict[str, str]:
        """The logs of every silo started that hold a traceback (killed ones too:
        a traceback before the kill is a bug all the same)."""
        found = {}
        for path in sorted(self.logs.glob("*.log")):
            text = path.read_text()
            if "Traceback" in text:
                found[path.stem] = text[-3000:]
        return found

    def close(self) -> None:
        stop_processes(list(self.procs.values()), timeout=40)
        for handle in self._handles:
            handle.close()


@contextmanager
def silos(store_url: str, grains: str, env: Mapping[str, str], logs: Path) -> Iterator[Silos]:
    logs.mkdir(parents=True, exist_ok=True)
    group = Silos(store_url, grains, env, logs)
    try:
        yield group
    finally:
        group.close()
