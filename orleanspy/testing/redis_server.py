"""A private ``redis-server`` process for tests: start, kill, restart on the same port."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

__all__ = ["RedisServer", "free_port"]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago on ``host``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class RedisServer:
    """A ``redis-server`` child process on a free port of ``host`` (loopback by
    default; another local address, e.g. a test bridge's, for silos in network
    namespaces).

    Without persistence (the default) ``kill()`` (SIGKILL) loses the store's
    content, as after a crash of a cache. With ``appendonly=True`` every write
    is fsynced to an append-only file before it is acknowledged, so a restart
    after ``kill()`` comes back with every acknowledged write (an outage, not a
    data loss). ``stop()`` shuts down politely; ``start()`` brings the server
    back on the same port.
    """

    def __init__(
        self,
        port: int | None = None,
        *,
        executable: str | None = None,
        appendonly: bool = False,
        host: str = "127.0.0.1",
    ) -> None:
        exe = executable or shutil.which("redis-server")
        if exe is None:
            raise RuntimeError("redis-server is not on PATH; install Redis (apt-get install redis)")
        self.executable = exe
        self.port = port or free_port(host)
        self.host = host
        self.appendonly = appendonly
        self._dir = tempfile.mkdtemp(prefix="orleanspy-redis-")
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    @property
    def pid(self) -> int | None:
        """The server process id while it runs (e.g. to read its CPU time)."""
        return self._proc.pid if self.running and self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, timeout: float = 10.0) -> None:
        """Start the server and return once it answers PING."""
        if self.running:
            return
        self._proc = subprocess.Popen(
            [
                self.executable,
                "--port", str(self.port),
                "--bind", self.host,
                "--save", "",
                *(
                    ("--appendonly", "yes", "--appendfsync", "always")
                    if self.appendonly
                    else ("--appendonly", "no")
                ),
                "--dir", self._dir,
                "--protected-mode", "no",
                "--loglevel", "warning",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self._proc.returncode}")
            if self._ping():
                return
            time.sleep(0.02)
        raise RuntimeError(f"redis-server on port {self.port} did not answer in {timeout}s")

    def _ping(self) -> bool:
        try:
            with socket.create_connection((self.host, self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def kill(self) -> None:
        """SIGKILL the server (no goodbye, data gone) and wait for it to die."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGKILL)
            self._proc.wait(10)
        self._proc = None

    def freeze(self) -> None:
        """SIGSTOP the server: connections stay open, nothing is answered."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        """SIGCONT a frozen server: it works off what queued up meanwhile."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        """Terminate the server politely and wait for it."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGCONT)  # a frozen server cannot stop
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(10)
        self._proc = None

    def close(self) -> None:
        """Stop the server and remove its directory."""
        self.stop()
        with contextlib.suppress(OSError):
            shutil.rmtree(self._dir)

    def flushall(self) -> None:
        """Empty every database (between tests)."""
        with socket.create_connection((self.host, self.port), timeout=5) as s:
            s.sendall(b"FLUSHALL\r\n")
            s.recv(16)

    def __enter__(self) -> RedisServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            with contextlib.suppress(Exception):
                os.kill(self._proc.pid, signal.SIGKILL)
