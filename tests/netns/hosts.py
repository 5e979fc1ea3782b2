"""Test hosts: network namespaces on a bridge of the test's own, and the silo,
Redis and client processes that run on them.

``TestNet`` makes a bridge in the root namespace with the first address of a
private ``/24`` no interface of this machine uses, and one namespace per host,
joined to the bridge by a veth pair, with the next addresses. Nothing routes
beyond that ``/24``: every packet goes to an address the test assigned, or to
loopback. Names carry the pytest process id and a letter per net
(``odt<pid><c>n<i>``, ``odb<pid><c>``, ``odv<pid><c><i>``), so parallel runs and
successive tests do not collide, and a later run removes what a killed one
left. ``close()`` kills every process the net started and removes every
namespace and the bridge; fixtures call it even when the test failed.

Faults: ``cut(a, b)`` adds blackhole routes both ways between two hosts (a
connect fails at once), ``isolate(h)`` sets the host's veth down (packets
vanish; connects time out), ``heal`` undoes both and flushes the neighbour
caches, so the first packets after the heal are not held up by stale ARP.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from orleanspy.testing.redis_server import RedisServer
from tests.ready import read_ready

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PREFIX = "odt"
_nets = iter("abcdefghijklmnopqrstuvwxyz")  # one letter per net of this process


def ip(*args: str, ns: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``ip ARGS`` (inside namespace ``ns`` when given)."""
    cmd = ["ip", *(("netns", "exec", ns, "ip") if ns else ()), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=False)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {proc.stderr.strip()}")
    return proc


def unavailable() -> str | None:
    """Why namespaces cannot be made here (``None``: they can)."""
    if shutil.which("ip") is None:
        return "no `ip` command (install iproute2)"
    if os.geteuid() != 0:
        return "network namespaces need root"
    probe = f"{PREFIX}{os.getpid()}probe"
    made = ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"`ip netns add` is not permitted here: {made.stderr.strip()}"
    ip("netns", "del", probe, check=False)
    return None


def _gone(name: str) -> bool:
    """Whether the pytest process named in ``name`` (digits after the prefix) is gone."""
    digits = re.match(r"[a-z]{3}(\d+)", name)
    return digits is not None and not Path(f"/proc/{digits[1]}").exists()


def _remove_leftovers() -> None:
    """Namespaces, veths and bridges of runs whose pytest process is gone."""
    for entry in Path("/run/netns").glob(f"{PREFIX}*") if Path("/run/netns").is_dir() else ():
        if _gone(entry.name):
            ip("netns", "del", entry.name, check=False)
    for line in ip("-o", "link", "show").stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        if name.startswith(("odb", "odv")) and _gone(name):
            ip("link", "del", name, check=False)


def _free_subnet() -> ipaddress.IPv4Network:
    """A private /24 that no address or route of this machine overlaps."""
    used = [
        ipaddress.ip_network(word, strict=False)
        for line in ip("-o", "-4", "addr", "show").stdout.splitlines()
        + ip("-4", "route", "show", "table", "all").stdout.splitlines()
        for word in line.split()
        if "/" in word and word[0].isdigit()
    ]
    rng = random.Random()
    for _ in range(200):
        net = ipaddress.ip_network(f"10.{rng.randrange(100, 250)}.{rng.randrange(256)}.0/24")
        if not any(net.overlaps(u) for u in used):
            return net
    raise RuntimeError("no free private /24 for the test bridge")


@dataclass
class Host:
    """One namespace on the bridge."""

    index: int
    ns: str
    veth: str
    address: str


@dataclass
class Proc:
    """A child process of the net, its output file and, once ready, its READY fields."""

    name: str
    popen: subprocess.Popen[str]
    ready: list[str] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.popen.pid


class TestNet:
    """A bridge, ``size`` hosts on it and a Redis on the bridge address."""

    __test__ = False  # not a test class, despite its name

    def __init__(self, workdir: Path, size: int) -> None:
        _remove_leftovers()
        self.workdir = workdir
        self.tag = f"{os.getpid()}{next(_nets)}"
        self.bridge = f"odb{self.tag}"
        subnet = _free_subnet()
        hosts = list(subnet.hosts())
        self.bridge_address = str(hosts[0])
        self.hosts: list[Host] = []
        self.procs: list[Proc] = []
        self.redis: RedisServer | None = None
        try:
            ip("link", "add", self.bridge, "type", "bridge")
            ip("addr", "add", f"{self.bridge_address}/24", "dev", self.bridge)
            ip("link", "set", self.bridge, "up")
            for i in range(size):
                self._add_host(i, str(hosts[10 + i]))
            self.redis = RedisServer(host=self.bridge_address)
            self.redis.start()
        except BaseException:
            self.close()
            raise

    def _add_host(self, i: int, address: str) -> None:
        host = Host(i, f"{PREFIX}{self.tag}n{i}", f"odv{self.tag}{i}", address)
        self.hosts.append(host)  # before it exists: close() removes what was made
        ip("netns", "add", host.ns)
        ip("link", "add", host.veth, "type", "veth", "peer", "name", "eth0", "netns", host.ns)
        ip("link", "set", host.veth, "master", self.bridge, "up")
        ip("link", "set", "lo", "up", ns=host.ns)
        ip("addr", "add", f"{address}/24", "dev", "eth0", ns=host.ns)
        ip("link", "set", "eth0", "up", ns=host.ns)

    @property
    def redis_url(self) -> str:
        assert self.redis is not None
        return self.redis.url

    # -- processes --------------------------------------------------------------

    def start_silo(
        self, host: Host, settings: str, *, name: str, env: Mapping[str, str] | None = None
    ) -> Proc:
        """``orleanspy silo --config`` in ``host``'s namespace, the file holding
        ``settings`` (TOML) and the grains of ``netns_grains``; ticks go to
        ``ticks-<name>.log`` in the work directory."""
        config = self.workdir / f"{name}.toml"
        config.write_text(settings)
        cmd = [
            *("ip", "netns", "exec", host.ns),
            *(sys.executable, "-P", "-m", "orleanspy.cli", "silo"),
            *("--config", str(config), "--import", "netns_grains", "--name", name),
        ]
        child_env = {k: v for k, v in os.environ.items() if not k.startswith("ORLEANSPY_")}
        child_env.update(PYTHONPATH=str(ROOT), NETNS_TICKS=str(self.ticks_file(name)))
        child_env.update(env or {})
        log = (self.workdir / f"{name}.log").open("w")
        popen = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=log, text=True, cwd=HERE, env=child_env
        )
        log.close()
        proc = Proc(name, popen)
        self.procs.append(proc)
        return proc

    def ticks_file(self, name: str) -> Path:
        return self.workdir / f"ticks-{name}.log"

    def start_client(self, gateways: Sequence[str], *args: str) -> Proc:
        """``netns_client.py`` in the root namespace; it prints REGISTERED when its
        reminders are registered, then records its calls in ``calls.log``."""
        cmd = [
            *(sys.executable, str(HERE / "netns_client.py")),
            *(a for g in gateways for a in ("--gateway", g)),
            *("--out", str(self.workdir / "calls.log"), *args),
        ]
        log = (self.workdir / "client.log").open("w")
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        popen = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True, env=env)
        log.close()
        proc = Proc("client", popen)
        self.procs.append(proc)
        return proc

    @staticmethod
    def wait_ready(proc: Proc, timeout: float = 60) -> list[str]:
        proc.ready = read_ready(proc.popen, timeout)
        return proc.ready

    @staticmethod
    def wait_line(proc: Proc, text: str, timeout: float = 60) -> None:
        assert proc.popen.stdout is not None
        deadline = time.monotonic() + timeout
        for line in proc.popen.stdout:
            if line.strip() == text:
                return
            if time.monotonic() > deadline:
                break
        raise RuntimeError(f"{proc.name} never printed {text} (rc={proc.popen.poll()})")

    def log(self, name: str) -> str:
        path = self.workdir / f"{name}.log"
        return path.read_text() if path.exists() else ""

    # -- faults -----------------------------------------------------------------

    def cut(self, a: Host, b: Host) -> None:
        """Blackhole routes both ways: ``a`` and ``b`` can no longer reach each other."""
        ip("route", "add", "blackhole", f"{b.address}/32", ns=a.ns)
        ip("route", "add", "blackhole", f"{a.address}/32", ns=b.ns)

    def isolate(self, host: Host) -> None:
        """``host``'s link down: it reaches nothing, nothing reaches it."""
        ip("link", "set", host.veth, "down")

    def heal(self, host: Host) -> None:
        """Link up, blackholes gone, neighbour caches flushed (no stale ARP)."""
        ip("link", "set", host.veth, "master", self.bridge, "up")
        for other in self.hosts:
            for line in ip("route", "show", "type", "blackhole", ns=other.ns).stdout.splitlines():
                ip("route", "del", *line.split(), ns=other.ns, check=False)
            ip("neigh", "flush", "all", ns=other.ns, check=False)
        ip("neigh", "flush", "dev", self.bridge, check=False)

    # -- clean-up ---------------------------------------------------------------

    def close(self) -> None:
        """Kill every process the net started, then remove the namespaces and bridge."""
        for proc in self.procs:
            if proc.popen.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(10)
            if proc.popen.stdout is not None:
                proc.popen.stdout.close()
        if self.redis is not None:
            self.redis.close()
        for host in self.hosts:
            ip("link", "del", host.veth, check=False)  # both ends, at once
            ip("netns", "del", host.ns, check=False)
        ip("link", "del", self.bridge, check=False)
