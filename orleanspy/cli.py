"""The ``orleanspy`` command: run a silo, inspect and operate a cluster.

This is the only module that reads the environment, command-line flags and
signals (``_cli_config`` turns what it read, and a ``--config`` file, into the
silo's options); everything else takes options as values.

::

    orleanspy silo --redis-url redis://127.0.0.1:6379/0 --import myapp.grains \\
                   --silo-port 11111 --gateway-port 30000 --metrics-port 9100 \\
                   --storage postgresql://app@db/app    # grain state (default: Redis)
    orleanspy silo --config silo.toml --host 0.0.0.0 --advertise-host 10.0.0.5 \\
                   --set membership.probe_interval=2s
    orleanspy cluster status --redis-url redis://127.0.0.1:6379/0
    orleanspy cluster status --storage-url postgresql://app@db/app --watch
    orleanspy dashboard --storage-url redis://127.0.0.1:6379/0 --port 8787
    orleanspy reminders upcoming --minutes 10 --redis-url redis://127.0.0.1:6379/0
    orleanspy reminders get Type/key name --json
    orleanspy audit --principal dashboard:ops --since 2h --json
    orleanspy demo

Global flags (``--config``, ``--redis-url``, ``--storage-url``, ``--membership-url``,
``--reminder-table-url``, ``--cluster-id``, ``--service-id``, ``--secret``,
``--log-level``, ``--log-format``, ``--json``) go before or after the
subcommand. ``--config FILE`` (``ORLEANSPY_CONFIG``) is the silos' TOML file;
every command that talks to a cluster takes the store URLs, the ids, the
secret (or its file), TLS (``messaging.*``) and logging from it, below the
flags and their variables, so an operator points the commands at the file the
silos run with. ``--storage-url`` takes a Redis or a PostgreSQL URL
(``postgresql://...``) for the cluster's tables and means the same as
``--redis-url``; ``--membership-url`` and ``--reminder-table-url`` put one
table elsewhere; ``silo --storage`` picks where grain state lives. Every flag
with an environment variable names it in ``--help``; a flag given wins over its
variable. ``silo`` takes each option from its flag or ``--set KEY=VALUE``, else
its ``ORLEANSPY_...`` variable, else the ``--config FILE`` (TOML), else the
default (``silo --help`` lists every key). ``silo`` prints ``READY <address>
<gateway port>`` (and ``<metrics port>`` with ``--metrics-port``) once the silo
is Active and stops gracefully on SIGTERM or SIGINT. Read commands print
tables, or JSON with ``--json``; the reminder commands say on stderr whether
they went through a gateway or straight to the reminder table (Redis or
PostgreSQL; ``cluster status`` reads membership from either, ``--watch`` repeats
it). ``dashboard`` serves the dashboard on its own (``--port``, ``--host``,
``--token``). Exit status: 0
done; 1 failed, with a message that says why and no usage text (a data error:
a file that cannot be read or is not what the command takes, such as a
malformed import file; a bad setting; what the cluster refused); 2 usage error
(a bad command line: the usage line, then what is wrong); 3 the silo stopped
itself (declared Dead by the cluster, or its membership store lost its data:
restart it).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import logging
import os
import signal
import sys
from collections.abc import Callable, Container, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

from orleanspy import __version__
from orleanspy._cli_config import SiloConfig, client_messaging, connection_values, load
from orleanspy._cli_output import (
    history_table,
    print_json,
    row_detail,
    rows_table,
    status_text,
    table,
)
from orleanspy._cli_parser import GLOBAL_KEYS, GLOBALS, LEVELS, SILO_FLAGS, build
from orleanspy._loop import run
from orleanspy.errors import ConfigurationError, OrleansPyError
from orleanspy.observability import JsonFormatter, SiloNameFilter
from orleanspy.options import MessagingOptions, SiloOptions
from orleanspy.reminders.letters import DeadLetter
from orleanspy.reminders.model import ReminderEntry
from orleanspy.schemes import check_redis_url
from orleanspy.tables import table_backend

__all__ = ["main"]


class UsageError(Exception):
    """A bad command line: exit status 2, after the usage line."""


class DataError(Exception):
    """The command line was sound but what it named was not (a file that cannot be
    read or written, an import file that is not an export): exit status 1, with
    the message alone."""


def _fill_globals(args: argparse.Namespace, file: Mapping[str, tuple[object, str]]) -> None:
    """Flags given win, then their environment variables, then the ``--config``
    file's keys (``file``: key -> (value, where), ``_cli_config.connection_values``),
    then the defaults. A bad value from the command line or the environment is a
    usage error; one from the file names the file."""
    came_from: dict[str, str] = {}
    for g in GLOBALS:
        if hasattr(args, g.dest):
            came_from[g.dest] = g.flag
            continue
        value: object = os.environ.get(g.env) if g.env else None
        came_from[g.dest] = f"env {g.env}"
        key = GLOBAL_KEYS.get(g.dest)
        if value is None and key is not None and key in file:
            value, came_from[g.dest] = file[key]
        setattr(args, g.dest, g.default if value is None else value)
    level = args.log_level or ("INFO" if args.command == "silo" else "WARNING")
    if not isinstance(level, str) or level.upper() not in LEVELS:
        _bad_global(came_from["log_level"], "--log-level",
                    f"unknown log level {level!r}: use one of {', '.join(LEVELS)}")  # fmt: skip
    args.log_level = level.upper()
    if args.log_format not in ("text", "json"):
        _bad_global(came_from["log_format"], "--log-format",
                    f"unknown log format {args.log_format!r}: text or json")  # fmt: skip


def _bad_global(where: str, flag: str, what: str) -> None:
    if where.startswith("-") or where.startswith("env "):
        head, _, tail = what.partition(":")
        raise UsageError(f"{head} ({flag}):{tail}")
    raise ConfigurationError(f"{flag.lstrip('-').replace('-', '_')} ({where}): {what}")


def _checked(url: str, flag: str) -> str:
    try:
        table_backend(url)
    except ConfigurationError as exc:
        raise UsageError(f"{flag}: {exc}") from None
    return url


def storage_url(args: argparse.Namespace) -> str:
    """The store of the cluster's tables (``--storage-url``, else ``--redis-url``),
    checked: the one place that knows which URL schemes the command accepts."""
    if args.storage_url:
        return _checked(args.storage_url, "--storage-url")
    if not args.redis_url:
        raise UsageError(
            "--storage-url or --redis-url (or ORLEANSPY_STORAGE_URL, ORLEANSPY_REDIS_URL) "
            "is required"
        )
    url: str = args.redis_url
    try:
        table_backend(url)  # --redis-url may name PostgreSQL too, as SiloOptions.redis_url
    except ConfigurationError:
        try:
            check_redis_url(url, "--redis-url")
        except ConfigurationError as exc:
            raise UsageError(f"{exc} (PostgreSQL: --storage-url postgresql://...)") from None
    return url


def membership_url(args: argparse.Namespace) -> str:
    """Where the membership table lives (gateways are found there)."""
    if args.membership_url:
        return _checked(args.membership_url, "--membership-url")
    return storage_url(args)


def reminders_url(args: argparse.Namespace) -> str:
    """Where the reminder table lives."""
    if args.reminder_table_url:
        return _checked(args.reminder_table_url, "--reminder-table-url")
    return storage_url(args)


def _logging(args: argparse.Namespace) -> SiloNameFilter:
    handler = logging.StreamHandler(sys.stderr)
    names = SiloNameFilter(getattr(args, "name", None) or "-")
    handler.addFilter(names)
    if args.log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)s %(silo)s %(name)s %(message)s")
        )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(args.log_level)
    return names


def _messaging(args: argparse.Namespace) -> MessagingOptions:
    """How a command connects to the cluster's gateways: ``--secret``, else its
    variable, else ``--config``'s ``messaging.*`` keys (the secret, its file, TLS;
    ``_cli_config.client_messaging``, read in ``main``)."""
    messaging: MessagingOptions = args.messaging
    return messaging


# -- silo -----------------------------------------------------------------------------


def silo_config(args: argparse.Namespace, given: Mapping[str, object]) -> SiloConfig:
    """The silo's settings: flags given (``given`` holds the global ones), then the
    environment, then ``--config``, then the defaults (``_cli_config``)."""
    flags: dict[str, tuple[object, str]] = {}
    for dest, value in given.items():
        if dest in GLOBAL_KEYS:
            flags[GLOBAL_KEYS[dest]] = (value, "--" + dest.replace("_", "-"))
    for flag, key, _ in SILO_FLAGS:
        value = getattr(args, "flag_" + key.replace(".", "__"))
        if value is not None:
            flags[key] = (value, flag)
    if args.imports:
        flags["import"] = (",".join(args.imports), "--import")
    config = load(_config_file(args), os.environ, flags, args.assignments)
    if not config.options.clustered:
        raise UsageError(
            "--storage-url or --redis-url (or ORLEANSPY_STORAGE_URL, ORLEANSPY_REDIS_URL, "
            "or storage_url in the --config file) is required"
        )
    return config


def _config_file(args: argparse.Namespace) -> Path | None:
    """``--config`` (or ``ORLEANSPY_CONFIG``), for every command."""
    path = getattr(args, "config", None) or os.environ.get("ORLEANSPY_CONFIG")
    return Path(path) if path else None


def _import_grains(modules: Sequence[str]) -> None:
    # `python -m` puts the current directory on the path; a console script does not.
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    for module in modules:
        try:
            importlib.import_module(module.strip())
        except ModuleNotFoundError as exc:
            raise UsageError(
                f"cannot import {module!r} (--import): {exc}; run from the directory that "
                "holds it, or add its directory to PYTHONPATH"
            ) from None


#: Exit status of a silo that stopped itself: declared Dead by the cluster, or
#: its membership store lost its data. A restart joins it as a new incarnation.
EXIT_STOPPED_BY_CLUSTER = 3


async def _run_silo(options: SiloOptions, names: SiloNameFilter) -> int:
    from orleanspy.runtime.silo import Silo

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    silo = Silo(options)
    names.silo_name = silo.name
    async with silo:
        extra = f" {silo.metrics_port}" if silo.metrics_port is not None else ""
        if silo.dashboard_port is not None:
            extra += f" dashboard={silo.dashboard_port}"
        print(f"READY {silo.address} {silo.gateway_port}{extra}", flush=True)
        stopped = asyncio.ensure_future(stop.wait())
        # A silo declared dead by the cluster stops on its own; so do we.
        while not stopped.done() and not silo.declared_dead:
            await asyncio.wait([stopped], timeout=0.5)
        stopped.cancel()
    if silo.declared_dead:
        print(f"orleanspy: silo stopped: {silo.stop_reason}", file=sys.stderr)
        return EXIT_STOPPED_BY_CLUSTER
    return 0


# -- cluster status -------------------------------------------------------------------


async def _cluster_status(args: argparse.Namespace) -> int:
    from contextlib import AsyncExitStack

    from orleanspy.cluster_status import open_status_reader

    url = membership_url(args)
    async with AsyncExitStack() as stack:
        reader = await open_status_reader(
            stack, url, cluster_id=args.cluster_id, service_id=args.service_id
        )
        while True:
            status = await reader.read()
            if args.json:
                print(json.dumps(status.to_json(), sort_keys=True), flush=True)
            else:
                if args.watch is not None:
                    print("\x1b[2J\x1b[H", end="")  # clear the terminal between rounds
                print(status_text(status), flush=True)
            if args.watch is None:
                break
            await asyncio.sleep(max(0.2, args.watch))
    if not any(s.status == "active" for s in status.silos):
        if table_backend(url) == "redis":
            from orleanspy.cluster_status import explain_no_gateway

            why = await explain_no_gateway(
                url, cluster_id=args.cluster_id, service_id=args.service_id
            )
        else:
            why = (f"the membership table holds {len(status.silos)} silos for cluster id "
                   f"{args.cluster_id!r}, service id {args.service_id!r}, none Active")  # fmt: skip
        print(f"orleanspy: no Active silo: {why}", file=sys.stderr)
    return 0


# -- dashboard ------------------------------------------------------------------------


async def _run_dashboard(args: argparse.Namespace) -> int:
    from contextlib import AsyncExitStack

    from orleanspy.options import dashboard_exposure_error
    from orleanspy.runtime.ops_http import HTTP_HINT, HttpServer, http_available

    why = dashboard_exposure_error(args.dashboard_host, args.dashboard_token, False)
    if why is not None:
        raise UsageError(f"--host: {why}")
    if not http_available():
        raise OrleansPyError(HTTP_HINT.replace("[metrics]", "[dashboard]"))
    from orleanspy.client import ClusterClient
    from orleanspy.dashboard import Dashboard, StoreSource

    messaging = _messaging(args)
    members = membership_url(args)

    async def open_client(stack: AsyncExitStack) -> Any:
        client = ClusterClient(membership_url=members, cluster_id=args.cluster_id,
                               service_id=args.service_id, options=messaging)  # fmt: skip
        await client.start()
        stack.push_async_callback(client.aclose)
        return client

    source = StoreSource(
        members, cluster_id=args.cluster_id, service_id=args.service_id,
        reminders_url=reminders_url(args), client_factory=open_client,
    )  # fmt: skip
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with AsyncExitStack() as stack:
        stack.push_async_callback(source.aclose)
        app = Dashboard(source, token=args.dashboard_token).asgi()
        server = HttpServer(app, args.dashboard_host, int(args.dashboard_port))
        await server.start(stack, what="--port")
        print(f"READY http://{args.dashboard_host}:{server.port}/", flush=True)
        await stop.wait()
    return 0


# -- reminders ------------------------------------------------------------------------


async def _reminders(args: argparse.Namespace) -> int:
    from orleanspy._cli_reminders import open_reminders, parse_grain_id

    gateway_url = membership_url(args)
    table_url = reminders_url(args)
    grain = None
    if getattr(args, "grain", None) is not None:
        try:
            grain = parse_grain_id(args.grain)
        except (ValueError, TypeError) as exc:
            raise UsageError(str(exc)) from None
    if getattr(args, "key_prefix", None) is not None and not args.type_name:
        raise UsageError("--prefix needs --type")
    if args.what == "import":
        # Read and checked whole before the cluster is asked anything: a bad
        # file writes nothing.
        args.items = _read_export(args.input)
    async with open_reminders(
        gateway_url,
        args.cluster_id,
        args.service_id,
        _messaging(args),
        table_url=table_url,
        create=args.what == "import",
    ) as access:
        print(f"orleanspy: via {access.via}", file=sys.stderr)
        return await _reminder_command(args, access, grain)


def _read_export(path: str) -> list[ReminderEntry | DeadLetter]:
    """The rows and dead letters of an export file (``-``: stdin); ``DataError``
    naming the file for one that is not an export."""
    from orleanspy._cli_reminders import parse_export_all
    from orleanspy.errors import ReminderError

    src = sys.stdin if path == "-" else _open_text(path, "r")
    try:
        return list(parse_export_all(src))
    except ReminderError as exc:
        raise DataError(f"{'stdin' if path == '-' else path}: {exc}") from None
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    finally:
        if src is not sys.stdin:
            src.close()


def _open_text(path: str, mode: str) -> Any:
    # A CLI command is the only task of its loop: a blocking open costs nobody.
    try:
        return open(path, mode, encoding="utf-8")
    except OSError as exc:
        raise DataError(f"cannot open {path!r}: {exc.strerror}") from None


async def _reminder_command(args: argparse.Namespace, access: Any, grain: Any) -> int:
    from orleanspy._cli_reminders import (
        FOREVER,
        counters_json,
        describe_json,
        describe_text,
        entry_json,
        export_line,
        fire_json,
        letter_line,
        run_schedule_command,
    )

    what = args.what
    handled = await run_schedule_command(args, access, grain)
    if handled is not None:
        return handled
    labels = getattr(args, "labels", None)
    if what == "count":
        n = await access.count(args.type_name, args.key_prefix, labels)
        print_json({"count": n}) if args.json else print(n)
        return 0
    if what == "orphans":
        orphans = await access.orphans()
        if args.json:
            print_json(orphans)
        else:
            print(table(("GRAIN TYPE", "ROWS"), sorted(orphans.items())))
        return 0
    if what == "delete-many":
        if not args.type_name and not labels:
            raise UsageError("delete-many needs --type or --label (it never empties the table)")
        n = await access.delete_where(args.type_name, args.key_prefix, args.dry_run, labels)
        verb = "would delete" if args.dry_run else "deleted"
        print_json({"deleted": n, "dry_run": args.dry_run}) if args.json else print(
            f"{verb} {n} rows"
        )
        return 0
    if what == "export":
        out = sys.stdout if not args.output else _open_text(args.output, "w")
        n = 0
        letters = 0
        try:
            cursor = None
            while True:
                page = await access.page(cursor, 500, args.type_name, args.key_prefix, labels)
                for row in page.rows:
                    out.write(export_line(row) + "\n")
                    n += 1
                cursor = page.cursor
                if cursor is None:
                    break
            while args.dead_letters:
                part = await access.dead_letters(None, None, cursor, 500)
                for letter in part.letters:
                    out.write(letter_line(letter) + "\n")
                    letters += 1
                if (cursor := part.cursor) is None:
                    break
        finally:
            if out is not sys.stdout:
                out.close()
        more = f" and {letters} dead letters" if args.dead_letters else ""
        print(f"orleanspy: exported {n} rows{more}", file=sys.stderr)
        return 0
    if what == "import":
        rows = [r for r in args.items if isinstance(r, ReminderEntry)]
        dead = [d for d in args.items if not isinstance(d, ReminderEntry)]
        done = {"created": 0, "exist": 0, "replaced": 0, "conflicts": 0}
        for i in range(0, len(rows), 500):
            result = await access.import_rows(rows[i : i + 500], args.replace, args.dry_run)
            for k in done:
                done[k] += getattr(result, k)
        if dead:
            done["dead_letters"] = 0
            for i in range(0, len(dead), 500):
                chunk = dead[i : i + 500]
                done["dead_letters"] += await access.import_dead_letters(chunk, args.dry_run)
        if args.json:
            print_json(dict(done, dry_run=args.dry_run))
        else:
            head = "would import" if args.dry_run else "imported"
            print(f"{head}: " + ", ".join(f"{k} {v}" for k, v in done.items()))
        return 0
    if what in ("list", "upcoming"):
        orphaned: Container[str] = ()
        if what == "upcoming":
            rows = await access.upcoming(timedelta(minutes=args.minutes), args.limit)
        elif grain is not None:
            rows = (await access.list_for_grain(grain))[: args.limit]
        elif args.type_name or args.all or labels:
            rows, keys = [], set()
            cursor = None
            while len(rows) < args.limit:
                page = await access.page(
                    cursor,
                    min(500, args.limit - len(rows)),
                    args.type_name,
                    args.key_prefix,
                    labels,
                )
                rows.extend(page.rows)
                keys.update(page.orphaned)
                cursor = page.cursor
                if cursor is None:
                    break
            orphaned = keys
        else:
            rows = await access.upcoming(FOREVER, args.limit)
        if args.json:
            flag = (lambda r: r.key in orphaned) if what == "list" and orphaned else None
            print_json([entry_json(r, orphaned=None if flag is None else flag(r)) for r in rows])
        else:
            print(rows_table(rows, orphaned))
        return 0
    if what in ("dead-letters", "replay", "discard"):
        return await _dead_letters(args, access, grain)
    assert grain is not None
    if what == "describe":
        described = await access.describe(grain, args.name, args.count, args.after)
        print_json(describe_json(described)) if args.json else print(describe_text(described))
        return 0
    if what == "counters":
        doc = counters_json(await access.counters(grain, args.name))
        if args.json:
            print_json(doc)
        else:
            width = max(len(k) for k in doc)
            print("\n".join(f"{k.ljust(width)}  {'-' if v is None else v}" for k, v in doc.items()))
        return 0
    if what == "delete":
        if not await access.delete(grain, args.name):
            print(f"orleanspy: {grain} has no reminder {args.name!r}", file=sys.stderr)
            return 1
        print(f"deleted {grain} {args.name}")
        return 0
    if what == "trigger":
        status = await access.trigger(grain, args.name)
        at = status.delivered_at.isoformat()
        print_json({"triggered": True, "delivered_at": at}) if args.json else print(
            f"triggered {grain} {args.name} at {at}"
        )
        return 0
    ops: dict[str, Callable[[], Any]] = {
        "get": lambda: access.get(grain, args.name),
        "set-priority": lambda: access.set_priority(grain, args.name, args.priority),
        "set-action": lambda: access.set_action(grain, args.name, args.action),
        "set-grace": lambda: access.set_grace(grain, args.name, args.grace),
        "repair": lambda: access.repair(grain, args.name),
        "pause": lambda: access.pause(grain, args.name),
        "resume": lambda: access.resume(grain, args.name),
    }
    row = await ops[what]()
    history = await access.history(grain, args.name) if what == "get" else None
    if args.json:
        doc = entry_json(row)
        if history is not None:
            doc["history"] = [fire_json(r) for r in history]
        print_json(doc)
    else:
        print(row_detail(row))
        if history:
            print()
            print(history_table(history))
    return 0


async def _dead_letters(args: argparse.Namespace, access: Any, grain: Any) -> int:
    """``reminders dead-letters``, ``replay ID`` and ``discard ID``."""
    from orleanspy._cli_reminders import letter_json

    what = args.what
    if what == "replay":
        status = await access.replay(args.letter_id)
        at = status.delivered_at.isoformat()
        print_json({"replayed": args.letter_id, "delivered_at": at}) if args.json else print(
            f"replayed {args.letter_id} (slot {status.current_tick_time.isoformat()}) at {at}"
        )
        return 0
    if what == "discard":
        letter = await access.discard(args.letter_id)
        print_json({"discarded": letter_json(letter)}) if args.json else print(
            f"discarded {letter.id} ({letter.grain_id} {letter.name}, slot "
            f"{letter.slot.isoformat()})"
        )
        return 0
    page = await access.dead_letters(grain, args.name, args.cursor, args.limit)
    if args.json:
        print_json({"letters": [letter_json(d) for d in page.letters], "cursor": page.cursor})
        return 0
    if args.show:
        for d in page.letters:
            doc = letter_json(d)
            tb = doc.pop("traceback")
            width = max(len(k) for k in doc)
            print("\n".join(f"{k.ljust(width)}  {'-' if v is None else v}" for k, v in doc.items()))
            print(tb.rstrip(), end="\n\n")
    else:
        print(
            table(
                ("ID", "GRAIN", "NAME", "SLOT", "ATTEMPTS", "ERROR", "DEAD-LETTERED"),
                [
                    (
                        d.id,
                        str(d.grain_id),
                        d.name,
                        f"{d.slot:%Y-%m-%d %H:%M:%S}Z",
                        d.attempts,
                        f"{d.error_type}: {d.message}"[:80],
                        f"{d.at:%Y-%m-%d %H:%M:%S}Z",
                    )
                    for d in page.letters
                ],
            )
        )
    if page.cursor is not None:
        print(f"orleanspy: more: --cursor {page.cursor}", file=sys.stderr)
    return 0


async def _audit(args: argparse.Namespace) -> int:
    from datetime import UTC, datetime

    from orleanspy._cli_audit import query_of, run_audit
    from orleanspy._cli_reminders import open_reminders

    try:
        query = query_of(args, datetime.now(UTC))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    async with open_reminders(
        membership_url(args), args.cluster_id, args.service_id, _messaging(args),
        table_url=reminders_url(args),
    ) as access:  # fmt: skip
        print(f"orleanspy: via {access.via}", file=sys.stderr)
        return await run_audit(access, query, args.json)


async def _migrate(args: argparse.Namespace) -> int:
    from orleanspy._redis import redacted
    from orleanspy.migration import migrate_storage

    url = args.storage or args.storage_url or args.redis_url
    if url is None:
        raise UsageError("migrate needs --storage URL (or --storage-url / --redis-url)")
    reports = await migrate_storage(url, service_id=args.service_id, cluster_id=args.cluster_id)
    if args.json:
        print_json(
            [
                {"store": r.store, "component": r.component, "before": r.before,
                 "after": r.after, "applied": r.applied}
                for r in reports
            ]
        )  # fmt: skip
        return 0
    print(f"orleanspy {__version__}: {redacted(url)}")
    for report in reports:
        print(report.line())
    return 0


# -- entry point ----------------------------------------------------------------------


async def _dispatch(args: argparse.Namespace, names: SiloNameFilter) -> int:
    if args.command == "silo":
        return await _run_silo(args.silo_options, names)
    if args.command == "cluster":
        return await _cluster_status(args)
    if args.command == "dashboard":
        return await _run_dashboard(args)
    if args.command == "migrate":
        return await _migrate(args)
    if args.command == "audit":
        return await _audit(args)
    if args.command == "demo":
        from orleanspy.demo import main as demo

        await demo(args.seconds)
        return 0
    return await _reminders(args)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``orleanspy`` command; returns the exit status."""
    # gRPC's C core stays quiet unless GRPC_VERBOSITY asks (orleanspy.messaging).
    parser = build()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version (0) and usage errors (2)
        return int(exc.code or 0)
    try:
        given = {g.dest: getattr(args, g.dest) for g in GLOBALS if hasattr(args, g.dest)}
        file = _config_file(args)
        # A silo reads the whole file itself (silo_config); the other commands
        # take the cluster's connection from it.
        _fill_globals(args, connection_values(file) if args.command != "silo" else {})
        if args.command not in ("silo", "demo"):
            args.messaging = client_messaging(file, os.environ, given.get("secret"))
        if args.command == "silo":
            config = silo_config(args, given)
            args.silo_options = config.options
            args.name, args.log_level, args.log_format = (
                config.options.name,
                config.log_level,
                config.log_format,
            )
            _import_grains(config.imports)
        names = _logging(args)
        return run(_dispatch(args, names))
    except UsageError as exc:
        parser.print_usage(sys.stderr)
        print(f"orleanspy: {exc}", file=sys.stderr)
        return 2
    except DataError as exc:
        print(f"orleanspy: {exc}", file=sys.stderr)
        return 1
    except OrleansPyError as exc:
        print(f"orleanspy: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:  # invalid values the options or the management refused
        print(f"orleanspy: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
