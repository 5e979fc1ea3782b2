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
from collections.abc import Iterator
from typing import Any

__all__ = [
    "RedisClusterServer",
    "RedisSentinelSet",
    "RedisServer",
    "free_cluster_port",
    "free_port",
]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago on ``host``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def free_cluster_port(host: str = "127.0.0.1") -> int:
    """A free port whose cluster bus port (port + 10000) is free too and below 65536."""
    import random

    for _ in range(200):
        port = random.randrange(20000, 45000)
        try:
            for p in (port, port + 10000):
                with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                    s.bind((host, p))
        except OSError:
            continue
        return port
    raise RuntimeError("no free port pair for a Redis Cluster node")


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
        extra_args: tuple[str, ...] = (),
        host: str = "127.0.0.1",
    ) -> None:
        exe = executable or shutil.which("redis-server")
        if exe is None:
            raise RuntimeError("redis-server is not on PATH; install Redis (apt-get install redis)")
        self.executable = exe
        self.port = port or free_port(host)
        self.host = host
        self.appendonly = appendonly
        self.extra_args = extra_args
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
                *self.extra_args,
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

    def clients(self) -> list[dict[str, str]]:
        """The server's client connections (``CLIENT LIST``, one dict per
        connection), less replication links and the connection asking."""
        return _clients(self.host, self.port)

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


def _send(host: str, port: int, *args: str, timeout: float = 2.0) -> bytes:
    """One RESP command on a fresh socket; the reply's text (bulk strings and
    simple replies as is; arrays as their items joined by CRLF)."""
    payload = b"*%d\r\n" % len(args) + b"".join(
        b"$%d\r\n%s\r\n" % (len(a.encode()), a.encode()) for a in args
    )
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.sendall(payload)
        with s.makefile("rb") as f:
            return _read_reply(f)


def _clients(host: str, port: int) -> list[dict[str, str]]:
    """``CLIENT LIST`` of ``host:port`` as dicts, without replication links
    (flags ``S``/``M``) and without the connection that asked (``CLIENT ID``
    and ``CLIENT LIST`` go on one socket)."""
    payload = b"".join(
        b"*%d\r\n" % len(cmd) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in cmd)
        for cmd in ((b"CLIENT", b"ID"), (b"CLIENT", b"LIST"))
    )
    with socket.create_connection((host, port), timeout=2.0) as s:
        s.sendall(payload)
        with s.makefile("rb") as f:
            own = _read_reply(f)[1:].decode()
            listing = _read_reply(f).decode(errors="replace")
    out: list[dict[str, str]] = []
    for line in listing.splitlines():
        fields = dict(item.partition("=")[::2] for item in line.split())
        if fields.get("id") == own or {"S", "M"} & set(fields.get("flags", "")):
            continue
        out.append(fields)
    return out


def _read_reply(f: Any) -> bytes:
    line = f.readline()
    if not line:
        raise OSError("connection closed")
    kind, rest = line[:1], line[1:-2]
    if kind == b"$":
        n = int(rest)
        return b"" if n < 0 else bytes(f.read(n + 2)[:-2])
    if kind == b"*":
        n = int(rest)
        return b"\r\n".join(_read_reply(f) for _ in range(max(n, 0)))
    return bytes(line[:-2])


def _info(host: str, port: int, section: str) -> dict[str, str]:
    raw = _send(host, port, "INFO", section).decode(errors="replace")
    out: dict[str, str] = {}
    for line in raw.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            out[key.strip()] = value.strip()
    return out


class RedisClusterServer:
    """A real Redis Cluster of ``masters`` masters with ``replicas`` replicas each,
    from ``redis-server --cluster-enabled yes`` children on free loopback ports,
    joined with ``redis-cli --cluster create``.

    ``node_timeout_ms`` is ``--cluster-node-timeout``: a killed master's replica
    is promoted about that long after the kill (plus an election of about a
    second). ``kill(port)`` SIGKILLs one node; ``restart(port)`` brings it back
    (it rejoins as a replica of whoever took its slots).
    """

    def __init__(self, *, masters: int = 3, replicas: int = 1, node_timeout_ms: int = 1000) -> None:
        self.masters = masters
        self.replicas = replicas
        self.node_timeout_ms = node_timeout_ms
        self.host = "127.0.0.1"
        self.nodes: list[RedisServer] = []
        for _ in range(masters * (1 + replicas)):
            node = RedisServer(
                free_cluster_port(),
                extra_args=(
                    "--cluster-enabled", "yes",
                    "--cluster-config-file", "nodes.conf",
                    "--cluster-node-timeout", str(node_timeout_ms),
                    # A replica with no up-to-date data still takes over: tests
                    # kill masters on purpose.
                    "--cluster-replica-validity-factor", "0",
                    "--cluster-require-full-coverage", "yes",
                    "--cluster-allow-reads-when-down", "no",
                    # Replicas sync at once (the default waits 5 s for more).
                    "--repl-diskless-sync-delay", "0",
                ),
            )  # fmt: skip
            self.nodes.append(node)

    @property
    def ports(self) -> list[int]:
        return [n.port for n in self.nodes]

    @property
    def url(self) -> str:
        """A plain ``redis://`` URL naming the first node (cluster mode is detected)."""
        return f"redis://{self.host}:{self.nodes[0].port}/0"

    @property
    def cluster_url(self) -> str:
        """``redis+cluster://`` naming every node."""
        hosts = ",".join(f"{self.host}:{p}" for p in self.ports)
        return f"redis+cluster://{hosts}"

    def start(self, timeout: float = 30.0) -> None:
        """Start every node, create the cluster and return once every slot is served."""
        for node in self.nodes:
            node.start()
        exe = shutil.which("redis-cli")
        if exe is None:
            raise RuntimeError("redis-cli is not on PATH; install Redis (apt-get install redis)")
        cmd = [exe, "--cluster", "create", *(f"{self.host}:{p}" for p in self.ports)]
        cmd += ["--cluster-replicas", str(self.replicas), "--cluster-yes"]
        done = subprocess.run(cmd, capture_output=True, timeout=timeout, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed: {done.stdout!r}")
        self.wait_healthy(timeout)

    def wait_healthy(self, timeout: float = 30.0) -> None:
        """Return once every running node reports ``cluster_state:ok`` with all
        16384 slots served, knows ``masters`` masters, and every running
        replica's link to its master is up (so ``WAIT`` can be met)."""
        deadline = time.monotonic() + timeout
        last: dict[str, str] = {}
        while time.monotonic() < deadline:
            try:
                states = [_info_cluster(self.host, n.port) for n in self.nodes if n.running]
            except OSError:
                states = []
            if (
                states
                and all(
                    s.get("cluster_state") == "ok"
                    and s.get("cluster_slots_ok") == "16384"
                    and s.get("cluster_size") == str(self.masters)
                    for s in states
                )
                and len(self.master_ports()) == self.masters
                and self._replicas_linked()
            ):
                return
            last = states[0] if states else {}
            time.sleep(0.05)
        raise RuntimeError(f"redis cluster did not become healthy in {timeout}s: {last}")

    def _replicas_linked(self) -> bool:
        for n in self.nodes:
            if n.running:
                info = _info(self.host, n.port, "replication")
                if info.get("role") == "slave" and info.get("master_link_status") != "up":
                    return False
        return True

    def roles(self) -> dict[int, str]:
        """``port -> "master" | "slave"`` of the running nodes."""
        out: dict[int, str] = {}
        for n in self.nodes:
            if n.running:
                with contextlib.suppress(OSError):
                    out[n.port] = _info(self.host, n.port, "replication").get("role", "?")
        return out

    def master_ports(self) -> list[int]:
        """Ports of the running masters that serve slots."""
        out = []
        for port, role in sorted(self.roles().items()):
            if role == "master":
                info = _info_cluster(self.host, port)
                if info.get("cluster_state") == "ok" and _owns_slots(self.host, port):
                    out.append(port)
        return out

    def busiest_master(self) -> int:
        """The running master that has processed the most commands (``INFO
        stats``): the one whose loss fails the most work in flight."""
        counts = {
            port: int(_info(self.host, port, "stats").get("total_commands_processed", "0"))
            for port in self.master_ports()
        }
        return max(counts, key=lambda port: counts[port])

    def replica_of(self, master_port: int) -> int | None:
        """The port of a running replica of the master on ``master_port``."""
        for n in self.nodes:
            if n.running and n.port != master_port:
                info = _info(self.host, n.port, "replication")
                if info.get("role") == "slave" and info.get("master_port") == str(master_port):
                    return n.port
        return None

    def node(self, port: int) -> RedisServer:
        for n in self.nodes:
            if n.port == port:
                return n
        raise KeyError(port)

    def kill(self, port: int) -> None:
        """SIGKILL the node on ``port``."""
        self.node(port).kill()

    def restart(self, port: int) -> None:
        """Start a killed node again; it rejoins from its ``nodes.conf``."""
        self.node(port).start()

    def dbsize(self, port: int) -> int:
        """Keys held by the node on ``port``."""
        return int(_send(self.host, port, "DBSIZE")[1:])

    def flushall(self) -> None:
        """Empty every master (replicas follow)."""
        for port in self.master_ports():
            _send(self.host, port, "FLUSHALL")
            # Scripts are per node; empty the caches too, as a fresh cluster has.
            _send(self.host, port, "SCRIPT", "FLUSH")

    def clients(self) -> list[dict[str, str]]:
        """The client connections of every running node (``RedisServer.clients``),
        each with ``port`` naming its node."""
        return [{**c, "port": str(n.port)} for n in self.nodes if n.running for c in n.clients()]

    def close(self) -> None:
        for node in self.nodes:
            node.close()

    def __enter__(self) -> RedisClusterServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _info_cluster(host: str, port: int) -> dict[str, str]:
    raw = _send(host, port, "CLUSTER", "INFO").decode(errors="replace")
    out: dict[str, str] = {}
    for line in raw.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            out[key.strip()] = value.strip()
    return out


def _owns_slots(host: str, port: int) -> bool:
    raw = _send(host, port, "CLUSTER", "NODES").decode(errors="replace")
    for line in raw.splitlines():
        parts = line.split()
        if len(parts) > 2 and "myself" in parts[2]:
            return len(parts) > 8
    return False


class RedisSentinelSet:
    """A primary, ``replicas`` replicas and ``sentinels`` sentinels (quorum 2)
    watching it as ``master_name``, on free loopback ports.

    A sentinel declares the primary down after ``down_after_ms`` without an
    answer and promotes a replica (about a second more). ``primary_port()``
    asks the sentinels where the primary is now; ``kill(port)`` SIGKILLs a
    data node, ``restart(port)`` starts it again (the sentinels turn it into a
    replica of the new primary).
    """

    def __init__(
        self,
        *,
        replicas: int = 1,
        sentinels: int = 3,
        master_name: str = "orleanspy",
        down_after_ms: int = 1000,
    ) -> None:
        self.host = "127.0.0.1"
        self.master_name = master_name
        self.down_after_ms = down_after_ms
        self.primary = RedisServer(extra_args=("--repl-diskless-sync-delay", "0"))
        self.replicas = [
            RedisServer(
                extra_args=(
                    "--replicaof",
                    self.host,
                    str(self.primary.port),
                    "--repl-diskless-sync-delay",
                    "0",
                )
            )
            for _ in range(replicas)
        ]
        self.sentinel_ports = [free_port() for _ in range(sentinels)]
        self._dir = tempfile.mkdtemp(prefix="orleanspy-sentinel-")
        self._sentinels: list[subprocess.Popen[bytes]] = []
        exe = shutil.which("redis-server")
        if exe is None:
            raise RuntimeError("redis-server is not on PATH; install Redis (apt-get install redis)")
        self._exe = exe

    @property
    def data_nodes(self) -> list[RedisServer]:
        return [self.primary, *self.replicas]

    @property
    def url(self) -> str:
        """``redis+sentinel://`` naming every sentinel and the master name."""
        hosts = ",".join(f"{self.host}:{p}" for p in self.sentinel_ports)
        return f"redis+sentinel://{hosts}/{self.master_name}"

    def start(self, timeout: float = 30.0) -> None:
        """Start the data nodes and sentinels; return once every sentinel knows
        the primary, its replicas and the other sentinels."""
        for node in self.data_nodes:
            node.start()
        for port in self.sentinel_ports:
            conf = os.path.join(self._dir, f"sentinel-{port}.conf")
            with open(conf, "w") as f:
                f.write(
                    f"port {port}\nbind {self.host}\nprotected-mode no\ndir {self._dir}\n"
                    f"sentinel monitor {self.master_name} {self.host} {self.primary.port} 2\n"
                    f"sentinel down-after-milliseconds {self.master_name} {self.down_after_ms}\n"
                    f"sentinel failover-timeout {self.master_name} 5000\n"
                    f"sentinel parallel-syncs {self.master_name} 1\n"
                )
            self._sentinels.append(
                subprocess.Popen(
                    [self._exe, conf, "--sentinel", "--loglevel", "warning"],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        self.wait_healthy(timeout)

    def wait_healthy(self, timeout: float = 30.0) -> None:
        """Return once every sentinel reports the primary ``ok`` with its replicas
        and all sentinels, and the primary's replicas are in sync."""
        deadline = time.monotonic() + timeout
        want = f"slaves={len(self.replicas)},sentinels={len(self.sentinel_ports)}"
        last = ""
        while time.monotonic() < deadline:
            try:
                lines = [
                    _info(self.host, p, "sentinel").get("master0", "") for p in self.sentinel_ports
                ]
                port = self.primary_port()
                synced = port is not None and all(
                    _info(self.host, n.port, "replication").get("master_link_status") == "up"
                    for n in self.data_nodes
                    if n.running and n.port != port
                )
            except OSError as exc:
                lines, synced, last = [], False, str(exc)
            if lines and synced and all("status=ok" in x and want in x for x in lines):
                return
            last = "; ".join(lines) or last
            time.sleep(0.05)
        raise RuntimeError(f"sentinel set-up did not become healthy in {timeout}s: {last}")

    def primary_port(self) -> int | None:
        """Where the sentinels say the primary is (the first that answers)."""
        return next(self._named_primaries(), None)

    def _named_primaries(self) -> Iterator[int]:
        """The primary each sentinel that answers names, in sentinel order."""
        for p in self.sentinel_ports:
            with contextlib.suppress(OSError, ValueError, IndexError):
                raw = _send(
                    self.host, p, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.master_name
                ).split(b"\r\n")
                yield int(raw[1])

    def _agreed_primary_port(self, timeout: float = 10.0) -> int | None:
        """The primary every sentinel names, once they agree (news of a failover
        reaches the other sentinels a moment after the leader); ``None`` if they
        do not agree within ``timeout``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            named = set(self._named_primaries())
            if len(named) == 1:
                return named.pop()
            time.sleep(0.05)
        return None

    def node(self, port: int) -> RedisServer:
        for n in self.data_nodes:
            if n.port == port:
                return n
        raise KeyError(port)

    def kill(self, port: int) -> None:
        self.node(port).kill()

    def restart(self, port: int) -> None:
        """Start data node ``port`` again, as a replica of the primary the
        sentinels name now, as an operator brings back a node without persistence:
        started as it was, a former primary would serve an empty data set as a
        primary until the sentinels turn it, and a sentinel that has not yet heard
        of the failover still names it (docs/redis.md, "Sentinel")."""
        node = self.node(port)
        primary = self._agreed_primary_port()
        if primary is not None and primary != port:
            args = list(node.extra_args)
            if "--replicaof" in args:
                i = args.index("--replicaof")
                del args[i : i + 3]
            node.extra_args = (*args, "--replicaof", self.host, str(primary))
        node.start()

    def flushall(self) -> None:
        """Empty the primary (replicas follow) and every node's script cache."""
        port = self.primary_port()
        if port is not None:
            _send(self.host, port, "FLUSHALL")
        for n in self.data_nodes:
            if n.running:
                _send(self.host, n.port, "SCRIPT", "FLUSH")

    def close(self) -> None:
        for proc in self._sentinels:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        self._sentinels = []
        for node in self.data_nodes:
            node.close()
        with contextlib.suppress(OSError):
            shutil.rmtree(self._dir)

    def __enter__(self) -> RedisSentinelSet:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
