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
    orleanspy demo

Global flags (``--redis-url``, ``--storage-url``, ``--membership-url``,
``--reminder-table-url``, ``--cluster-id``, ``--service-id``, ``--secret``,
``--log-level``, ``--log-format``, ``--json``) go before or after the
subcommand. ``--storage-url`` takes a Redis or a PostgreSQL URL
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
done, 1 failed (the message says why), 2 usage error, 3 the silo stopped
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
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from orleanspy import __version__
from orleanspy._cli_config import SETTINGS, SiloConfig, describe, load
from orleanspy._loop import run
from orleanspy.errors import ConfigurationError, OrleansPyError
from orleanspy.observability import JsonFormatter, SiloNameFilter
from orleanspy.options import MessagingOptions, SiloOptions
from orleanspy.reminders.model import FireRecord, MissedReminderAction, ReminderEntry
from orleanspy.schemes import check_redis_url
from orleanspy.tables import table_backend

__all__ = ["main"]

_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class UsageError(Exception):
    """A bad command line: exit status 2."""


@dataclass(frozen=True)
class _Global:
    flag: str
    env: str | None
    default: Any
    help: str
    kwargs: dict[str, Any]

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")


_GLOBALS = (
    _Global("--redis-url", "ORLEANSPY_REDIS_URL", None,
            "Redis of the cluster: redis://HOST:PORT/DB, rediss://... (TLS), "
            "redis+cluster://HOST:PORT,..., redis+sentinel://HOST:PORT,.../MASTER or "
            "unix:///PATH (this or --storage-url is required but for demo)",
            {"metavar": "URL"}),
    _Global("--storage-url", "ORLEANSPY_STORAGE_URL", None,
            "store of the cluster's tables, Redis or postgresql://...; wins over "
            "--redis-url", {"metavar": "URL"}),
    _Global("--membership-url", "ORLEANSPY_MEMBERSHIP_URL", None,
            "membership table elsewhere (Redis or PostgreSQL)", {"metavar": "URL"}),
    _Global("--reminder-table-url", "ORLEANSPY_REMINDER_TABLE_URL", None,
            "reminder table elsewhere (Redis or PostgreSQL)", {"metavar": "URL"}),
    _Global("--cluster-id", "ORLEANSPY_CLUSTER_ID", "dev", "the cluster's id", {"metavar": "ID"}),
    _Global("--service-id", "ORLEANSPY_SERVICE_ID", "default",
            "the service's id (reminders and storage belong to it)", {"metavar": "ID"}),
    _Global("--secret", "ORLEANSPY_CLUSTER_SECRET", None,
            "shared secret every silo and client connection presents", {"metavar": "SECRET"}),
    _Global("--log-level", "ORLEANSPY_LOG_LEVEL", None,
            f"one of {', '.join(_LEVELS)}; default INFO for silo, WARNING otherwise",
            {"metavar": "LEVEL"}),
    _Global("--log-format", "ORLEANSPY_LOG_FORMAT", "text",
            "text, or json for one JSON object per record", {"metavar": "FORMAT"}),
    _Global("--json", None, False, "print JSON instead of a table (read commands; no env)",
            {"action": "store_true"}),
)  # fmt: skip


def _help(text: str, default: Any, env: str | None) -> str:
    shown = "none" if default is None else default
    tail = f"default: {shown}" if not isinstance(default, bool) else "off by default"
    return f"{text} ({tail}; env {env})" if env else f"{text} ({tail})"


def _common() -> argparse.ArgumentParser:
    """The global flags, with suppressed defaults so that a flag given after the
    subcommand is not overwritten by the parent's default (filled in later)."""
    common = argparse.ArgumentParser(add_help=False)
    group = common.add_argument_group("global options (before or after the subcommand)")
    for g in _GLOBALS:
        group.add_argument(
            g.flag,
            dest=g.dest,
            default=argparse.SUPPRESS,
            help=_help(g.help, g.default if g.dest != "log_level" else None, g.env)
            if g.dest != "log_level"
            else f"{g.help} (env {g.env})",
            **g.kwargs,
        )
    return common


# The silo's own flags: flag, the key it sets (see _cli_config), help.
_SILO_FLAGS = (
    ("--name", "name", "the silo's name in logs and cluster status"),
    ("--host", "host", "address the silo, gateway and metrics ports listen on"),
    ("--advertise-host", "advertised_host",
     "address or DNS name peers and clients dial; with a wildcard --host, the address "
     "this host reaches the membership store from"),
    ("--silo-port", "silo_port", "silo-to-silo port, 0 for any free port"),
    ("--gateway-port", "gateway_port", "port clients connect to, 0 for any free port, none for no "
     "gateway"),
    ("--metrics-port", "metrics_port",
     "HTTP port of /metrics, /healthz and /readyz, 0 for any free port"),
    ("--dashboard-port", "dashboard_port",
     "HTTP port of the dashboard (off unless set), 0 for any free port"),
    ("--dashboard-host", "dashboard_host",
     "address the dashboard listens on; other than loopback it needs a token or TLS"),
    ("--dashboard-token", "dashboard_token",
     "bearer token the dashboard requires (16+ characters)"),
    ("--storage-timeout", "storage_start_timeout",
     "how long start-up retries an unreachable Redis, in seconds or with a unit"),
    ("--storage", "storage.default",
     'grain state storage "default": a redis:// or postgresql:// URL'),
)  # fmt: skip
_SHOWN: dict[str, object] = {"name": "silo-<id>", "storage_start_timeout": 30.0,
                             "storage.default": "the cluster's store"}  # fmt: skip
_METAVARS = {"--silo-port": "PORT", "--gateway-port": "PORT", "--metrics-port": "PORT",
             "--storage-timeout": "SECONDS", "--storage": "URL", "--host": "ADDRESS",
             "--advertise-host": "ADDRESS", "--dashboard-port": "PORT",
             "--dashboard-host": "ADDRESS", "--dashboard-token": "TOKEN"}  # fmt: skip
# Global flags that are silo settings too.
_GLOBAL_KEYS = {
    "redis_url": "redis_url", "storage_url": "storage_url", "membership_url": "membership_url",
    "reminder_table_url": "reminder_table_url", "cluster_id": "cluster_id",
    "service_id": "service_id", "secret": "messaging.cluster_secret",
    "log_level": "log_level", "log_format": "log_format",
}  # fmt: skip


def _env_help(text: str, default: Any, env: str) -> dict[str, Any]:
    return {"default": os.environ.get(env, default), "help": _help(text, default, env)}


def _parser() -> argparse.ArgumentParser:
    common = _common()
    parser = argparse.ArgumentParser(
        prog="orleanspy", description=__doc__.splitlines()[0].replace("``", ""), parents=[common]
    )
    parser.add_argument("--version", action="version", version=f"orleanspy {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def sub(owner: Any, name: str, text: str) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = owner.add_parser(
            name, help=text, description=text, parents=[common]
        )
        return p

    silo = commands.add_parser(
        "silo", help="run one silo until SIGTERM/SIGINT", parents=[common],
        description="run one silo until SIGTERM/SIGINT. Each setting takes the first value "
        "found in: its flag (or --set), its environment variable, the --config file, the "
        "default.", epilog=describe(), formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    silo.add_argument("--config", metavar="FILE", default=os.environ.get("ORLEANSPY_CONFIG"),
                      help="TOML file of settings, keys as listed below (default: none; "
                      "env ORLEANSPY_CONFIG)")  # fmt: skip
    silo.add_argument("--set", dest="assignments", action="append", default=[],
                      metavar="KEY=VALUE", help="set any key listed below, e.g. "
                      "membership.probe_interval=2s (repeatable)")  # fmt: skip
    silo.add_argument(
        "--import", dest="imports", action="append", metavar="MODULE",
        help="module defining grain classes, found from the current directory too "
        "(repeatable; default: none; env ORLEANSPY_IMPORT, comma-separated)",
    )  # fmt: skip
    for flag, key, text in _SILO_FLAGS:
        setting = SETTINGS[key]
        shown = _SHOWN.get(key, setting.default)
        silo.add_argument(flag, dest="flag_" + key.replace(".", "__"), metavar=_METAVARS.get(flag),
                          help=_help(text, shown, setting.env))  # fmt: skip

    cluster = sub(commands, "cluster", "look at the cluster")
    what = cluster.add_subparsers(dest="what", metavar="WHAT", required=True)
    status = sub(what, "status", "silos: status, address, version, uptime, ring share, load, "
                 "membership events (from the store: Redis or PostgreSQL)")  # fmt: skip
    status.add_argument("--watch", type=float, nargs="?", const=2.0, default=None,
                        metavar="SECONDS", help="print again every SECONDS (default 2) until "
                        "interrupted (default: once; no env)")  # fmt: skip

    dash = sub(commands, "dashboard", "serve the dashboard on its own, reading the store "
               "(actions go through a gateway)")  # fmt: skip
    _dashboard_args(dash, "--port", "--host", "--token")

    rem = sub(commands, "reminders", "inspect and change reminder rows")
    ops = rem.add_subparsers(dest="what", metavar="WHAT", required=True)
    p = sub(ops, "list", "rows in the due order: priority first (higher first), then next "
            "due time; paused rows are left out. With --type or --all: every row (paused "
            "too) in the table's order, orphaned rows flagged; with --grain: that grain's "
            "rows")  # fmt: skip
    p.add_argument(
        "--grain",
        metavar="GRAIN",
        help="only this grain's rows, TYPE/KEY (TYPE/ for the empty key; no env)",
    )
    _filter_args(p)
    p.add_argument("--all", action="store_true", help="every row in the table's order (no env)")
    p.add_argument("--limit", type=int, metavar="N",
                   **_env_help("at most this many rows", 100, "ORLEANSPY_LIMIT"))  # fmt: skip
    p = sub(ops, "get", "one row in full")
    _row_args(p)
    p = sub(ops, "upcoming", "rows due within --minutes")
    p.add_argument("--minutes", type=float, metavar="M",
                   **_env_help("horizon", 10.0, "ORLEANSPY_MINUTES"))  # fmt: skip
    p.add_argument("--limit", type=int, metavar="N",
                   **_env_help("at most this many rows", 100, "ORLEANSPY_LIMIT"))  # fmt: skip
    p = sub(ops, "count", "how many rows the table holds (of --type, --prefix)")
    _filter_args(p)
    sub(ops, "orphans", "rows per grain type that no silo of the cluster hosts (needs a silo)")
    p = sub(ops, "delete-many",
            "remove every row of a grain type (and key prefix), a page at a time")  # fmt: skip
    _filter_args(p, required=True)
    p.add_argument("--dry-run", action="store_true", help="count what would go; remove nothing")
    p = sub(ops, "export", "write rows as JSON lines (of --type, --prefix) to stdout or --output")
    _filter_args(p)
    p.add_argument("--output", metavar="FILE", help="write here instead of stdout (no env)")
    p = sub(ops, "import", "write exported JSON lines into the table, keeping their schedules")
    p.add_argument("input", metavar="FILE", help="an export file, or - for stdin")
    p.add_argument("--dry-run", action="store_true",
                   help="say what would be written; write nothing")  # fmt: skip
    p.add_argument("--replace", action="store_true",
                   help="replace rows that exist (each on the etag read); "
                        "default: keep them")  # fmt: skip
    p = sub(ops, "set-priority", "change a row's priority (-128..127)")
    _row_args(p)
    p.add_argument("priority", type=_priority, help="a number, or critical, normal, background")
    p = sub(ops, "set-action", "change what a row does with missed ticks")
    _row_args(p)
    p.add_argument("action", type=_action, help="fire_immediately, skip or notify")
    p = sub(ops, "set-grace", "change how late a row's ticks may be and still be on time")
    _row_args(p)
    p.add_argument(
        "grace",
        type=_grace,
        help="seconds (e.g. 2.5), or default for ReminderOptions.missed_tick_grace (10 s)",
    )
    p = sub(ops, "repair", "move a row's next due time to its first slot after now")
    _row_args(p)
    p = sub(ops, "delete", "remove a row")
    _row_args(p)
    p = sub(ops, "pause", "keep a row but deliver nothing until resume")
    _row_args(p)
    p = sub(ops, "resume", "deliver a paused row again (missed slots follow its action)")
    _row_args(p)
    p = sub(ops, "trigger", "deliver one tick now, off the schedule (needs a running silo)")
    _row_args(p)

    demo = sub(commands, "demo", "run the embedded demo (one process, in memory)")
    demo.add_argument("--seconds", type=float, metavar="S", **_env_help(
        "how long the demo runs", 5.0, "ORLEANSPY_DEMO_SECONDS"))  # fmt: skip
    return parser


def _filter_args(p: argparse.ArgumentParser, *, required: bool = False) -> None:
    p.add_argument("--type", dest="type_name", metavar="TYPE", required=required,
                   help="only rows of this grain type (no env)")  # fmt: skip
    p.add_argument("--prefix", dest="key_prefix", metavar="PREFIX",
                   help="only string keys starting with this (needs --type; no env)")  # fmt: skip


def _dashboard_args(p: argparse.ArgumentParser, port: str, host: str, token: str) -> None:
    standalone = port == "--port"
    p.add_argument(port, dest="dashboard_port", type=int, metavar="PORT", **_env_help(
        "HTTP port of the dashboard, 0 for any free port", 8787 if standalone else None,
        "ORLEANSPY_DASHBOARD_PORT"))  # fmt: skip
    p.add_argument(host, dest="dashboard_host", metavar="HOST", **_env_help(
        "address the dashboard listens on; off loopback it needs a token or TLS",
        "127.0.0.1", "ORLEANSPY_DASHBOARD_HOST"))  # fmt: skip
    p.add_argument(token, dest="dashboard_token", metavar="TOKEN", **_env_help(
        "token the dashboard asks for (16+ characters; Authorization: Bearer, or ?token= "
        "once in the browser)", None, "ORLEANSPY_DASHBOARD_TOKEN"))  # fmt: skip


def _row_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "grain",
        metavar="GRAIN",
        help="TYPE/KEY (string key; TYPE/ is the empty key), TYPE/i:42, TYPE/u:UUID",
    )
    p.add_argument("name", metavar="NAME", help="the reminder's name")


def _priority(text: str) -> int:
    names = {"critical": 100, "normal": 0, "background": -100}
    if text.lower() in names:
        return names[text.lower()]
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a priority: {text!r} (a number in -128..127, or critical, normal, background)"
        ) from None
    if not -128 <= value <= 127:
        raise argparse.ArgumentTypeError(f"priority {value} is outside -128..127")
    return value


def _grace(text: str) -> timedelta | None:
    if text.lower() == "default":
        return None
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a grace: {text!r} (seconds, e.g. 2.5, or default)"
        ) from None
    if not 0 <= seconds <= 366 * 86400:
        raise argparse.ArgumentTypeError(f"grace {text} s is outside 0 .. 366 days")
    return timedelta(seconds=seconds)


def _action(text: str) -> MissedReminderAction:
    try:
        return MissedReminderAction[text.upper().replace("-", "_")]
    except KeyError:
        raise argparse.ArgumentTypeError(
            f"not an action: {text!r} (fire_immediately, skip or notify)"
        ) from None


def _fill_globals(args: argparse.Namespace) -> None:
    """Flags given win, then their environment variables, then the defaults."""
    for g in _GLOBALS:
        if not hasattr(args, g.dest):
            value = os.environ.get(g.env) if g.env else None
            setattr(args, g.dest, g.default if value is None else value)
    level = args.log_level or ("INFO" if args.command == "silo" else "WARNING")
    if level.upper() not in _LEVELS:
        raise UsageError(f"unknown log level {level!r} (--log-level): use one of "
                         f"{', '.join(_LEVELS)}")  # fmt: skip
    args.log_level = level.upper()
    if args.log_format not in ("text", "json"):
        raise UsageError(f"unknown log format {args.log_format!r} (--log-format): text or json")


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
    return MessagingOptions(cluster_secret=args.secret) if args.secret else MessagingOptions()


# -- silo -----------------------------------------------------------------------------


def silo_config(args: argparse.Namespace, given: Mapping[str, object]) -> SiloConfig:
    """The silo's settings: flags given (``given`` holds the global ones), then the
    environment, then ``--config``, then the defaults (``_cli_config``)."""
    flags: dict[str, tuple[object, str]] = {}
    for dest, value in given.items():
        if dest in _GLOBAL_KEYS:
            flags[_GLOBAL_KEYS[dest]] = (value, "--" + dest.replace("_", "-"))
    for flag, key, _ in _SILO_FLAGS:
        value = getattr(args, "flag_" + key.replace(".", "__"))
        if value is not None:
            flags[key] = (value, flag)
    if args.imports:
        flags["import"] = (",".join(args.imports), "--import")
    config = load(Path(args.config) if args.config else None, os.environ, flags, args.assignments)
    if not config.options.clustered:
        raise UsageError(
            "--storage-url or --redis-url (or ORLEANSPY_STORAGE_URL, ORLEANSPY_REDIS_URL, "
            "or storage_url in the --config file) is required"
        )
    return config


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


# -- output ---------------------------------------------------------------------------


def _table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(h) for h in headers]] + [["-" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    )


def _print_json(doc: object) -> None:
    print(json.dumps(doc, indent=2, sort_keys=True))


def _schedule(row: ReminderEntry) -> str:
    if row.cron:
        text = f"cron {row.cron} {row.tz or 'UTC'}"
    elif row.period is not None:
        text = f"every {row.period}"
    else:
        text = f"once at {row.start_at:%Y-%m-%d %H:%M:%S}Z"
    if row.jitter is not None:
        text += f", jitter {row.jitter}"
    if row.starts_at is not None:
        text += f", from {row.starts_at:%Y-%m-%d %H:%M:%S}Z"
    if row.ends_at is not None:
        text += f", until {row.ends_at:%Y-%m-%d %H:%M:%S}Z"
    if row.max_ticks is not None:
        text += f", {row.max_ticks} ticks"
    if row.retry is not None:
        text += f", retry {row.retry.max_attempts}x/{row.retry.backoff}"
    return text


def _state(row: ReminderEntry, orphaned: bool = False) -> str:
    parts = ["paused" if row.paused else "active"]
    if row.declared:
        parts.append("declared")
    if orphaned:
        parts.append("orphaned")
    return ",".join(parts)


def _rows_table(rows: Sequence[ReminderEntry], orphaned: Container[str] = ()) -> str:
    return _table(
        ("NEXT DUE", "GRAIN", "NAME", "SCHEDULE", "PRIORITY", "ACTION", "STATE"),
        [
            (
                f"{r.next_due:%Y-%m-%d %H:%M:%S}Z",
                str(r.grain_id),
                r.name,
                _schedule(r),
                int(r.priority),
                r.action.name.lower(),
                _state(r, r.key in orphaned),
            )
            for r in rows
        ],
    )


_OPTIONAL = frozenset(
    {"one_shot", "jitter_seconds", "starts_at", "ends_at", "max_ticks", "final_due", "payload",
     "retry"}
)  # fmt: skip


def _row_detail(row: ReminderEntry) -> str:
    from orleanspy._cli_reminders import entry_json

    # The optional schedule fields only when set: most rows have none of them.
    doc = {k: v for k, v in entry_json(row).items() if k not in _OPTIONAL or v not in (None, False)}
    width = max(len(k) for k in doc)
    return "\n".join(f"{k.ljust(width)}  {'-' if v is None else v}" for k, v in doc.items())


def _history_table(history: Sequence[FireRecord]) -> str:
    return _table(
        ("LAST FIRED SLOT", "AT", "LATENESS", "OUTCOME", "SILO", "ERROR"),
        [
            (
                f"{r.slot:%Y-%m-%d %H:%M:%S}Z",
                f"{r.at:%H:%M:%S.%f}"[:-3],
                f"{r.lateness.total_seconds() * 1000:.0f} ms",
                r.outcome.value
                + (f" (attempt {r.attempt})" if r.attempt > 1 else "")
                + (" (final)" if r.final else "")
                + (" (triggered)" if r.triggered else ""),
                r.silo,
                "" if r.error is None else r.error[:80],
            )
            for r in history
        ],
    )


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
                print(_status_text(status), flush=True)
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


def _status_text(status: Any) -> str:
    head = (f"cluster {status.cluster_id!r} service {status.service_id!r} "
            f"(membership version {status.table_version})")  # fmt: skip
    headers = ("NAME", "STATUS", "ADDRESS", "GATEWAY", "VERSION", "UPTIME", "RING",
               "ACTIVATIONS", "REMINDERS", "CPU", "HEARTBEAT")  # fmt: skip
    rows = [
        (s.name, s.status, s.address, s.gateway, s.version,
         _duration(s.uptime_seconds) if s.status == "active" else None,
         f"{s.ring_share:.1f}%", s.activations, s.reminders,
         None if s.cpu_percent is None else f"{s.cpu_percent:.0f}%",
         None if s.last_heartbeat is None else f"{s.last_heartbeat:%H:%M:%S}Z")
        for s in status.silos
    ]  # fmt: skip
    events = [
        f"  {e.at:%Y-%m-%d %H:%M:%S}Z  {e.kind:<9}  {e.name or e.silo}"
        + (f"  (vote by {e.by})" if e.by else "")
        for e in status.events[-10:]
    ]
    tail = "\n\nrecent membership events:\n" + "\n".join(events) if events else ""
    if status.orphaned_rows:
        tail += (f"\n\norphaned reminder rows: {status.orphaned_rows} (their grain types are "
                 "hosted by no silo: orleanspy reminders orphans)")  # fmt: skip
    return f"{head}\n{_table(headers, rows)}{tail}"


def _duration(seconds: float) -> str:
    s = int(seconds)
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


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


def _open_text(path: str, mode: str) -> Any:
    # A CLI command is the only task of its loop: a blocking open costs nobody.
    try:
        return open(path, mode, encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot open {path!r}: {exc.strerror}") from None


async def _reminder_command(args: argparse.Namespace, access: Any, grain: Any) -> int:
    from orleanspy._cli_reminders import FOREVER, entry_json, export_line, fire_json, parse_export
    from orleanspy.errors import ReminderError

    what = args.what
    if what == "count":
        n = await access.count(args.type_name, args.key_prefix)
        _print_json({"count": n}) if args.json else print(n)
        return 0
    if what == "orphans":
        orphans = await access.orphans()
        if args.json:
            _print_json(orphans)
        else:
            print(_table(("GRAIN TYPE", "ROWS"), sorted(orphans.items())))
        return 0
    if what == "delete-many":
        n = await access.delete_where(args.type_name, args.key_prefix, args.dry_run)
        verb = "would delete" if args.dry_run else "deleted"
        _print_json({"deleted": n, "dry_run": args.dry_run}) if args.json else print(
            f"{verb} {n} rows"
        )
        return 0
    if what == "export":
        out = sys.stdout if not args.output else _open_text(args.output, "w")
        n = 0
        try:
            cursor = None
            while True:
                page = await access.page(cursor, 500, args.type_name, args.key_prefix)
                for row in page.rows:
                    out.write(export_line(row) + "\n")
                    n += 1
                cursor = page.cursor
                if cursor is None:
                    break
        finally:
            if out is not sys.stdout:
                out.close()
        print(f"orleanspy: exported {n} rows", file=sys.stderr)
        return 0
    if what == "import":
        src = sys.stdin if args.input == "-" else _open_text(args.input, "r")
        try:
            rows = list(parse_export(src))
        except ReminderError as exc:
            raise UsageError(f"{args.input}: {exc}") from None
        finally:
            if src is not sys.stdin:
                src.close()
        done = {"created": 0, "exist": 0, "replaced": 0, "conflicts": 0}
        for i in range(0, len(rows), 500):
            result = await access.import_rows(rows[i : i + 500], args.replace, args.dry_run)
            for k in done:
                done[k] += getattr(result, k)
        if args.json:
            _print_json(dict(done, dry_run=args.dry_run))
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
        elif args.type_name or args.all:
            rows, keys = [], set()
            cursor = None
            while len(rows) < args.limit:
                page = await access.page(
                    cursor, min(500, args.limit - len(rows)), args.type_name, args.key_prefix
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
            _print_json([entry_json(r, orphaned=None if flag is None else flag(r)) for r in rows])
        else:
            print(_rows_table(rows, orphaned))
        return 0
    assert grain is not None
    if what == "delete":
        if not await access.delete(grain, args.name):
            print(f"orleanspy: {grain} has no reminder {args.name!r}", file=sys.stderr)
            return 1
        print(f"deleted {grain} {args.name}")
        return 0
    if what == "trigger":
        status = await access.trigger(grain, args.name)
        at = status.delivered_at.isoformat()
        _print_json({"triggered": True, "delivered_at": at}) if args.json else print(
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
        _print_json(doc)
    else:
        print(_row_detail(row))
        if history:
            print()
            print(_history_table(history))
    return 0


# -- entry point ----------------------------------------------------------------------


async def _dispatch(args: argparse.Namespace, names: SiloNameFilter) -> int:
    if args.command == "silo":
        return await _run_silo(args.silo_options, names)
    if args.command == "cluster":
        return await _cluster_status(args)
    if args.command == "dashboard":
        return await _run_dashboard(args)
    if args.command == "demo":
        from orleanspy.demo import main as demo

        await demo(args.seconds)
        return 0
    return await _reminders(args)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``orleanspy`` command; returns the exit status."""
    # gRPC's C core stays quiet unless GRPC_VERBOSITY asks (orleanspy.messaging).
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version (0) and usage errors (2)
        return int(exc.code or 0)
    try:
        given = {g.dest: getattr(args, g.dest) for g in _GLOBALS if hasattr(args, g.dest)}
        _fill_globals(args)
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
