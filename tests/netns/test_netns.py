"""The network fault suite: silos on test hosts (network namespaces on a bridge
of the test's own, ``hosts.py``), each an ``orleanspy silo --config`` process
bound to ``0.0.0.0``, with Redis on the bridge address and a client process in
the root namespace.

Each scenario breaks the network or the store as a real deployment meets it (a
silo cut from its peers but not from Redis, a host isolated for 15 s and
brought back, a silo started with the wrong cluster secret, Redis restarted
empty, kill -9 with default options) and asserts the properties that must hold:

- the isolated or minority silo is the one declared Dead, never a majority silo;
- no reminder is stranded past detection + 2 periods;
- the Dead silo stops within 5 s of reaching the table again, with a non-zero exit status
  (an exit code, not a crash by a signal);
- client calls on the majority side succeed >= 95 % after detection;
- no reminder ticks on two silos for more than 5 s after the Dead write;
- a SKIP reminder never gets more than one delivery per catch-up;
- no slot is applied twice in a grain's state: each tick is committed with the
  state (``write(tick=...)``), so a slot that two silos delivered, or one
  delivered again after a fail-over, is in the state once.

Ticks are read from the files the silos append to (``netns_grains.py``), calls
from the client's file, membership from Redis by a poller that notes when each
row first reads Dead. Membership is fast (death in about two seconds) except in
the kill -9 scenario, which runs every option at its default; the reminder
service runs with its defaults but for more permits (a five-minute look-ahead:
a silo cut off from the table still holds every row due soon, as in production).
Measured figures are printed (``pytest -s``).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import time
import urllib.error
import urllib.request
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field

import pytest

from orleanspy.identity import GrainId, SiloAddress
from orleanspy.membership.model import SiloStatus
from orleanspy.membership.redis import RedisMembershipTable
from orleanspy.serialization import Codec
from orleanspy.state import decode_state
from orleanspy.storage.redis import RedisGrainStorage
from orleanspy.testing.cluster import wait_for
from tests.netns.hosts import Host, Proc, TestNet

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

SECRET = "netns-cluster-secret"
FIRE, SKIP = 48, 16  # one-second FIRE_IMMEDIATELY reminders, two-second SKIP reminders
FAST = """
[membership]
probe_interval = "0.5s"
probe_timeout = "0.5s"
num_missed_probes_limit = 2
i_am_alive_interval = "1s"
table_refresh_interval = "0.5s"

[reminders]
# Ticks to grains on an unreachable peer hold a permit until the response
# timeout; enough permits that those do not hide what the silo does with the
# rest (the kill -9 scenario keeps the default).
permits = 64
"""


def period(key: str) -> float:
    """Seconds between the slots of reminder ``key`` (``s*``: SKIP, 2 s; else 1 s)."""
    return 2.0 if key.startswith("s") else 1.0


def settings(net: TestNet, *, secret: str = SECRET, fast: bool = True) -> str:
    """A silo's TOML file: every interface, the bridge's Redis, the secret."""
    return (
        f'redis_url = "{net.redis_url}"\nhost = "0.0.0.0"\nmetrics_port = 0\n'
        f'log_level = "WARNING"\n'
        f'[messaging]\ncluster_secret = "{secret}"\n' + (FAST if fast else "")
    )


# ------------------------------------------------------------------ observing


@dataclass
class Silo:
    host: Host
    proc: Proc
    address: SiloAddress
    gateway: str
    metrics: int

    @property
    def running(self) -> bool:
        return self.proc.popen.poll() is None


@dataclass
class Observer:
    """Reads the membership table every 100 ms: when each row first read Dead,
    and every silo address ever seen."""

    table: RedisMembershipTable
    dead_at: dict[SiloAddress, float] = field(default_factory=dict)
    seen: set[SiloAddress] = field(default_factory=set)
    active: set[SiloAddress] = field(default_factory=set)
    read_at: float = 0.0  # when ``active`` was read (it is empty while reads fail)

    async def run(self) -> None:
        while True:
            try:
                snapshot = await self.table.read_all()
            except Exception:  # Redis may be down: nothing known, try again
                self.active = set()
                await asyncio.sleep(0.1)
                continue
            now = time.time()
            self.active, self.read_at = set(snapshot.active_silos()), now
            for address, (entry, _) in snapshot.entries.items():
                self.seen.add(address)
                if entry.status is SiloStatus.DEAD:
                    self.dead_at.setdefault(address, now)
            await asyncio.sleep(0.1)


@asynccontextmanager
async def observing(net: TestNet) -> AsyncIterator[Observer]:
    async with AsyncExitStack() as stack:
        table = RedisMembershipTable(net.redis_url, cluster_id="dev", service_id="default")
        await table.start(stack)
        observer = Observer(table)
        task = asyncio.ensure_future(observer.run())
        try:
            yield observer
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


@dataclass(frozen=True)
class Tick:
    at: float
    pid: int
    key: str
    name: str
    slot: float
    missed: int
    silo: str


def read_ticks(net: TestNet, names: Iterable[str]) -> list[Tick]:
    out = []
    for name in names:
        path = net.ticks_file(name)
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 6:  # a line being written is skipped
                at, pid, key, rname, slot, missed = parts
                out.append(Tick(float(at), int(pid), key, rname, float(slot), int(missed), name))
    return sorted(out, key=lambda t: t.at)


def read_calls(net: TestNet) -> list[tuple[float, bool]]:
    path = net.workdir / "calls.log"
    if not path.exists():
        return []
    calls = []
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 2:
            calls.append((float(parts[0]), parts[1] == "ok"))
    return calls


def readyz(silo: Silo) -> int | None:
    """``/readyz``'s status code, ``None`` when nothing answers."""
    url = f"http://{silo.host.address}:{silo.metrics}/readyz"
    try:
        with urllib.request.urlopen(url, timeout=1) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return None


# ------------------------------------------------------------------ set-up


async def start_silos(
    net: TestNet, hosts: Iterable[Host], *, text: str, names: Callable[[Host], str] | None = None
) -> list[Silo]:
    """Start a silo on each host (in parallel) and wait until each is READY, and
    advertising its host's bridge address although bound to 0.0.0.0."""
    procs = [
        (h, net.start_silo(h, text, name=(names or (lambda h: f"silo{h.index}"))(h))) for h in hosts
    ]
    silos = []
    for host, proc in procs:
        address, gateway, metrics = await asyncio.to_thread(net.wait_ready, proc)
        parsed = SiloAddress.parse(address)
        assert parsed.host == host.address, (parsed, host)  # the default advertised address
        silos.append(Silo(host, proc, parsed, f"{host.address}:{gateway}", int(metrics)))
    return silos


async def all_active(observer: Observer, silos: Iterable[Silo]) -> None:
    wanted = {s.address for s in silos}
    await wait_for(lambda: wanted <= observer.active, 30, what="every silo Active")


async def start_load(net: TestNet, gateways: Iterable[Silo]) -> Proc:
    """The client: reminders registered, then calls through ``gateways`` only."""
    client = net.start_client(
        [s.gateway for s in gateways], "--secret", SECRET, "--fire", str(FIRE), "--skip", str(SKIP)
    )
    await asyncio.to_thread(net.wait_line, client, "REGISTERED")
    return client


REMINDER_KEYS = [f"f{i}" for i in range(FIRE)] + [f"s{i}" for i in range(SKIP)]


async def steady(net: TestNet, names: list[str]) -> None:
    """Every reminder has ticked."""

    def ticked() -> bool:
        return {t.key for t in read_ticks(net, names)} >= set(REMINDER_KEYS)

    await wait_for(ticked, 30, interval=0.2, what="every reminder ticking")


def stop_client(client: Proc) -> None:
    if client.popen.poll() is None:
        client.popen.send_signal(signal.SIGTERM)
        try:
            client.popen.wait(15)
        except Exception:
            client.popen.kill()


# ------------------------------------------------------------------ properties


@dataclass
class Figures:
    """What a scenario measured, printed whatever the outcome."""

    lines: list[str] = field(default_factory=list)

    def add(self, text: str) -> None:
        self.lines.append(text)
        print(text)


def only_victim_dead(observer: Observer, victim: Silo, majority: list[Silo]) -> list[str]:
    return [f"majority silo {s.proc.name} declared Dead" for s in majority
            if s.address in observer.dead_at]  # fmt: skip


def stranded(ticks: list[Tick], t0: float, detection: float, victim: str) -> dict[str, float]:
    """Reminders whose first tick after ``t0`` on a silo other than the victim
    came later than detection + 2 periods (or never): key -> seconds after t0."""
    first: dict[str, float] = {}
    for t in ticks:
        if t.at > t0 and t.silo != victim and t.key not in first:
            first[t.key] = t.at - t0
    return {
        k: first.get(k, float("inf"))
        for k in REMINDER_KEYS
        if first.get(k, float("inf")) > detection + 2 * period(k)
    }


def double_ticks(ticks: list[Tick], dead: float, victim: str) -> dict[str, float]:
    """Reminders that ticked on the victim more than 5 s after its Dead write
    while ticking elsewhere too: key -> the victim's last tick, seconds after it."""
    elsewhere = {t.key for t in ticks if t.at > dead and t.silo != victim}
    late: dict[str, float] = {}
    for t in ticks:
        if t.silo == victim and t.at > dead + 5 and t.key in elsewhere:
            late[t.key] = round(t.at - dead, 2)
    return late


def skip_bursts(ticks: list[Tick]) -> list[str]:
    """SKIP deliveries on one silo that belong to one catch-up: the second's slot
    had already passed when the first was delivered."""
    by: dict[tuple[str, str], list[Tick]] = defaultdict(list)
    for t in ticks:
        if t.key.startswith("s"):
            by[t.key, t.silo].append(t)
    bursts = []
    for (key, silo), run in by.items():
        for a, b in itertools.pairwise(run):
            if b.slot < a.at - 0.1 * period(key):
                bursts.append(
                    f"{key} on {silo}: slot {b.slot - a.at:+.1f}s delivered "
                    f"{(b.at - a.at) * 1000:.0f} ms after the previous delivery"
                )
    return bursts


@dataclass
class _Applied:  # netns_grains.Applied (that module opens the silos' tick file)
    slots: list[float] = field(default_factory=list)


async def applied_twice(net: TestNet) -> dict[str, list[float]]:
    """Reminders whose grain state holds a slot more than once: key -> those slots
    (read from the silos' Redis, where their states are)."""
    twice: dict[str, list[float]] = {}
    async with AsyncExitStack() as stack:
        storage = RedisGrainStorage(net.redis_url, service_id="default")
        await storage.start(stack)
        codec = Codec()
        for key in REMINDER_KEYS:
            stored = await storage.read(GrainId("NetTickGrain", key), "applied")
            if stored is None:
                continue
            slots = decode_state(stored.data, _Applied, codec, what=key).slots
            repeated = [slot for slot, n in Counter(slots).items() if n > 1]
            if repeated:
                twice[key] = repeated
    return twice


def success_after(calls: list[tuple[float, bool]], since: float) -> tuple[int, float]:
    after = [ok for at, ok in calls if at >= since]
    return len(after), (sum(after) / len(after) if after else 0.0)


async def check_all(
    figures: Figures,
    net: TestNet,
    observer: Observer,
    victim: Silo,
    majority: list[Silo],
    *,
    t0: float,
    names: list[str],
) -> list[str]:
    """The properties every partition scenario shares; returns the violations."""
    dead = observer.dead_at.get(victim.address)
    problems = only_victim_dead(observer, victim, majority)
    ticks = read_ticks(net, names)
    if dead is None:
        return [*problems, f"{victim.proc.name} never declared Dead"]
    detection = dead - t0
    late = stranded(ticks, t0, detection, victim.proc.name)
    doubled = double_ticks(ticks, dead, victim.proc.name)
    victim_after = sum(1 for t in ticks if t.silo == victim.proc.name and t.at > dead)
    bursts = skip_bursts([t for t in ticks if t.at > t0 - 1])
    n, ratio = success_after(read_calls(net), dead)
    twice = await applied_twice(net)
    figures.add(
        f"detection {detection:.2f}s; stranded {len(late)} (worst "
        f"{max(late.values(), default=0):.2f}s); victim ticks after Dead {victim_after}, "
        f"{len(doubled)} reminders on two silos > 5 s after it (latest "
        f"{max(doubled.values(), default=0):.2f}s); SKIP bursts {len(bursts)}; "
        f"calls after detection {n} at {ratio:.1%}; slots applied twice {len(twice)}"
    )
    if twice:
        problems.append(f"slots applied twice in a grain's state: {twice}")
    if late:
        problems.append(f"stranded past detection + 2 periods: {late}")
    if doubled:
        problems.append(f"ticking on two silos > 5 s after the Dead write: {doubled}")
    if bursts:
        problems.append(f"SKIP catch-up bursts: {bursts[:5]}")
    if n < 30:
        problems.append(f"only {n} calls after detection")
    elif ratio < 0.95:
        problems.append(f"calls on the majority side after detection: {ratio:.1%} < 95%")
    return problems


def exit_code(status: int | None) -> bool:
    """Whether ``status`` is the non-zero exit code of a silo that stopped itself:
    neither 0 (a restart policy would not restart it) nor a signal (a crash, which
    is no verdict: Popen reports death by signal N as -N)."""
    return status is not None and status > 0


async def wait_exit(silo: Silo, since: float, bound: float) -> tuple[float | None, int | None]:
    """Seconds from ``since`` until the silo's process exited (``None``: not within
    ``bound`` + 5 s), and its exit status."""
    with contextlib.suppress(TimeoutError):
        await wait_for(lambda: not silo.running, max(0.0, since + bound + 5 - time.time()),
                       interval=0.05)  # fmt: skip
    if silo.running:
        return None, None
    return time.time() - since, silo.proc.popen.returncode


# ------------------------------------------------------------------ scenarios


async def test_a_silo_cut_from_its_peers_but_not_from_redis(make_net) -> None:
    net = make_net(3)
    figures = Figures()
    async with observing(net) as observer:
        silos = await start_silos(net, net.hosts, text=settings(net))
        victim, majority = silos[0], silos[1:]
        await all_active(observer, silos)
        names = [s.proc.name for s in silos]
        client = await start_load(net, majority)
        await steady(net, names)
        t0 = time.time()
        for peer in majority:
            net.cut(victim.host, peer.host)
        with contextlib.suppress(TimeoutError):
            await wait_for(lambda: victim.address in observer.dead_at, 30, interval=0.05)
        dead = observer.dead_at.get(victim.address, time.time())
        stopped, status = await wait_exit(victim, dead, 5)
        await asyncio.sleep(max(0.0, dead + 6 - time.time()))  # ticks and calls after it
        stop_client(client)
        problems = await check_all(figures, net, observer, victim, majority, t0=t0, names=names)
    figures.add(f"partition: victim stopped {stopped}s after its Dead write, status {status}")
    if stopped is None or stopped > 5:
        problems.append(f"the Dead silo did not stop within 5 s of its Dead write ({stopped})")
    if not exit_code(status):
        problems.append(f"the Dead silo's exit status is {status}, not an exit code > 0")
    assert not problems, problems


async def test_a_host_isolated_for_15_seconds_and_brought_back(make_net) -> None:
    net = make_net(3)
    figures = Figures()
    async with observing(net) as observer:
        silos = await start_silos(net, net.hosts, text=settings(net))
        victim, majority = silos[0], silos[1:]
        await all_active(observer, silos)
        names = [s.proc.name for s in silos]
        client = await start_load(net, majority)
        await steady(net, names)
        t0 = time.time()
        net.isolate(victim.host)
        with contextlib.suppress(TimeoutError):
            await wait_for(lambda: victim.address in observer.dead_at, 14, interval=0.05)
        await asyncio.sleep(max(0.0, t0 + 15 - time.time()))
        net.heal(victim.host)
        healed = time.time()
        stopped, status = await wait_exit(victim, healed, 5)
        stop_client(client)
        problems = await check_all(figures, net, observer, victim, majority, t0=t0, names=names)
    figures.add(f"isolation: victim stopped {stopped}s after the heal, status {status}")
    if stopped is None or stopped > 5:
        problems.append(f"the Dead silo did not stop within 5 s of the heal ({stopped})")
    if not exit_code(status):
        problems.append(f"the Dead silo's exit status is {status}, not an exit code > 0")
    assert not problems, problems


async def test_a_silo_with_the_wrong_cluster_secret_cannot_harm_the_cluster(make_net) -> None:
    """The mis-deployed silo starts next to one healthy silo (the worst case: one
    vote declares a silo Dead). It must be refused before it writes a row, exit
    with a non-zero status, and the healthy silo must go on as if nothing happened."""
    net = make_net(2)
    figures = Figures()
    async with observing(net) as observer:
        (healthy,) = await start_silos(net, net.hosts[:1], text=settings(net))
        await all_active(observer, [healthy])
        names = [healthy.proc.name, "rogue"]
        client = await start_load(net, [healthy])
        await steady(net, names)
        t0 = time.time()
        rogue = net.start_silo(net.hosts[1], settings(net, secret="a-wrong-secret"), name="rogue")
        with contextlib.suppress(TimeoutError):
            await wait_for(lambda: rogue.popen.poll() is not None, 10, interval=0.05)
        settled = time.time()
        exited = settled - t0 if rogue.popen.poll() is not None else None
        # The healthy silo goes on for two periods of every reminder after the rogue
        # is gone (or has had 10 s to do harm).
        await asyncio.sleep(max(0.0, settled + 4 - time.time()))
        stop_client(client)
        ticks = read_ticks(net, names)
        rows = {a for a in observer.seen if a.host == net.hosts[1].address}
        problems = [] if healthy.address not in observer.dead_at else ["healthy silo Dead"]
        if not healthy.running:
            problems.append(f"healthy silo stopped (status {healthy.proc.popen.returncode})")
        gaps = {}
        for key in REMINDER_KEYS:
            times = [t0] + [t.at for t in ticks if t.key == key and t.silo == "silo0" and t.at > t0]
            times.append(time.time())
            worst = max(b - a for a, b in itertools.pairwise(times))
            if worst > 2 * period(key) + 0.5:
                gaps[key] = round(worst, 2)
        n, ratio = success_after(read_calls(net), t0)
        rogue_ticks = sum(1 for t in ticks if t.silo == "rogue")
    status = rogue.popen.returncode
    figures.add(
        f"mis-deployed: rogue exited after {exited}s with status {status}; rows it wrote "
        f"{len(rows)}; its ticks {rogue_ticks}; healthy Dead "
        f"{healthy.address in observer.dead_at}; reminders gapped {len(gaps)}; calls {n} at "
        f"{ratio:.1%}; rogue said: {net.log('rogue').strip().splitlines()[-1:]}"
    )
    if exited is None or not exit_code(status):
        problems.append(f"the rogue silo did not exit with an exit code > 0 (status {status})")
    if rows:
        problems.append(f"the rogue silo wrote membership rows: {sorted(map(str, rows))}")
    if gaps:
        problems.append(f"reminders stranded on the healthy silo: {gaps}")
    if ratio < 0.95 or n < 30:
        problems.append(f"calls through the healthy silo: {n} at {ratio:.1%}")
    assert not problems, problems


async def test_redis_restarted_empty(make_net) -> None:
    """Redis without persistence restarts empty: every silo either joins again (its
    row back, ``/readyz`` 200, the declared reminders ticking again) or stops with a
    non-zero status. A silo missing from membership never answers ``/readyz`` 200
    for long."""
    net = make_net(3)
    figures = Figures()
    assert net.redis is not None
    async with observing(net) as observer:
        silos = await start_silos(net, net.hosts, text=settings(net))
        await all_active(observer, silos)
        names = [s.proc.name for s in silos]
        declared = [f"d{i}" for i in range(4)]
        await wait_for(lambda: {t.key for t in read_ticks(net, names)} >= set(declared), 30,
                       interval=0.2, what="the declared reminders ticking")  # fmt: skip
        net.redis.kill()
        net.redis.start()
        t0 = time.time()
        zombie: dict[str, float] = {}  # running, not in the table, /readyz 200: since when
        worst: dict[str, float] = defaultdict(float)
        back: dict[str, float] = {}
        await wait_for(lambda: observer.read_at > t0, 5, what="a table read after the restart")
        while time.time() < t0 + 15:
            rows = {a.host for a in observer.active}
            for s in silos:
                if not s.running:
                    continue
                ready = await asyncio.to_thread(readyz, s)
                if s.host.address in rows and ready == 200:
                    back.setdefault(s.proc.name, time.time() - t0)
                    zombie.pop(s.proc.name, None)
                elif ready == 200 and s.host.address not in rows:
                    since = zombie.setdefault(s.proc.name, time.time())
                    worst[s.proc.name] = max(worst[s.proc.name], time.time() - since)
            if all(not s.running or s.proc.name in back for s in silos):
                break  # every silo settled: back, or stopped
            await asyncio.sleep(0.2)
        ticks = read_ticks(net, names)
        resumed = {t.key: t.at - t0 for t in reversed(ticks) if t.key in declared and t.at > t0}
    statuses = {s.proc.name: s.proc.popen.poll() for s in silos}
    figures.add(
        f"redis restarted empty: back after {back}; exit statuses {statuses}; running "
        f"unlisted with /readyz 200 for up to {dict(worst)}; declared reminders resumed "
        f"after {resumed}"
    )
    problems = []
    for s in silos:
        name = s.proc.name
        if s.running and name not in back:
            problems.append(f"{name} runs but is not back in membership with /readyz 200")
        if not s.running and not exit_code(statuses[name]):
            problems.append(f"{name} stopped with status {statuses[name]}, not an exit code > 0")
        if worst.get(name, 0) > 5:
            problems.append(f"{name} answered /readyz 200 while missing from membership for "
                            f"{worst[name]:.1f}s")  # fmt: skip
    if back:
        # Detection is the last silo back; the declared reminders (1 s) tick within
        # two periods of it.
        bound = max(back.values()) + 2 * 1.0
        late = {k: resumed.get(k) for k in declared if resumed.get(k, float("inf")) > bound}
        if late:
            problems.append(f"declared reminders not ticking within {bound:.1f}s: {late}")
    assert not problems, problems


async def test_kill9_with_default_options(make_net) -> None:
    """Every option at its default (no membership or reminder settings at all)."""
    net = make_net(3)
    figures = Figures()
    async with observing(net) as observer:
        silos = await start_silos(net, net.hosts, text=settings(net, fast=False))
        victim, majority = silos[0], silos[1:]
        await all_active(observer, silos)
        names = [s.proc.name for s in silos]
        client = await start_load(net, majority)
        await steady(net, names)
        os.kill(victim.proc.pid, signal.SIGKILL)
        t0 = time.time()
        with contextlib.suppress(TimeoutError):
            await wait_for(lambda: victim.address in observer.dead_at, 60, interval=0.05)
        dead = observer.dead_at.get(victim.address, time.time())
        await asyncio.sleep(max(0.0, dead + 5 - time.time()))  # two SKIP periods and more
        stop_client(client)
        problems = await check_all(figures, net, observer, victim, majority, t0=t0, names=names)
    detection = dead - t0
    figures.add(f"kill -9 with defaults: declared Dead after {detection:.2f}s")
    if detection > 3:
        problems.append(f"kill -9 with default options: Dead after {detection:.1f}s, target 3 s")
    assert not problems, problems
