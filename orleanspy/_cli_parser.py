"""The ``orleanspy`` command's flags: the global ones (before or after the
subcommand, each with its variable), ``silo``'s own, and every subcommand's
(``build``); ``cli`` runs what they parse into."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from orleanspy._cli_audit import add_arguments as audit_arguments
from orleanspy._cli_config import SETTINGS, describe
from orleanspy._cli_reminders import add_schedule_commands, instant_arg, label_item
from orleanspy.reminders.model import MissedReminderAction
from orleanspy.versions import OLDEST_PROTOCOL, PROTOCOL, __version__

__all__ = ["GLOBALS", "GLOBAL_KEYS", "LEVELS", "SILO_FLAGS", "build"]

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


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


GLOBALS = (
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
    _Global("--config", "ORLEANSPY_CONFIG", None,
            "TOML file of settings (the keys orleanspy silo --help lists): a silo takes "
            "every key from it, the other commands the cluster's store URLs, ids, "
            "secret and TLS (messaging.*) and logging", {"metavar": "FILE"}),
    _Global("--secret", "ORLEANSPY_CLUSTER_SECRET", None,
            "shared secret every silo and client connection presents", {"metavar": "SECRET"}),
    _Global("--log-level", "ORLEANSPY_LOG_LEVEL", None,
            f"one of {', '.join(LEVELS)}; default INFO for silo, WARNING otherwise",
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
    for g in GLOBALS:
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
SILO_FLAGS = (
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
    ("--dashboard-token-name", "dashboard_token_name",
     "who holds the token: the audit log records dashboard actions as dashboard:NAME"),
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
             "--dashboard-host": "ADDRESS", "--dashboard-token": "TOKEN",
             "--dashboard-token-name": "NAME"}  # fmt: skip
# Global flags that are silo settings too.
GLOBAL_KEYS = {
    "redis_url": "redis_url", "storage_url": "storage_url", "membership_url": "membership_url",
    "reminder_table_url": "reminder_table_url", "cluster_id": "cluster_id",
    "service_id": "service_id", "secret": "messaging.cluster_secret",
    "log_level": "log_level", "log_format": "log_format",
}  # fmt: skip


def _env_help(text: str, default: Any, env: str) -> dict[str, Any]:
    return {"default": os.environ.get(env, default), "help": _help(text, default, env)}


def build() -> argparse.ArgumentParser:
    """The parser of every subcommand and flag."""
    common = _common()
    parser = argparse.ArgumentParser(
        prog="orleanspy",
        description="The orleanspy command: run a silo, inspect and operate a cluster.",
        parents=[common],
    )
    parser.add_argument(
        "--version",
        action="version",
        version=f"orleanspy {__version__} (wire protocols {OLDEST_PROTOCOL}-{PROTOCOL})",
    )
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
    silo.add_argument("--set", dest="assignments", action="append", default=[],
                      metavar="KEY=VALUE", help="set any key listed below, e.g. "
                      "membership.probe_interval=2s (repeatable)")  # fmt: skip
    silo.add_argument(
        "--import", dest="imports", action="append", metavar="MODULE",
        help="module defining grain classes, found from the current directory too "
        "(repeatable; default: none; env ORLEANSPY_IMPORT, comma-separated)",
    )  # fmt: skip
    for flag, key, text in SILO_FLAGS:
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

    mig = sub(commands, "migrate", "bring the store's schemas to this release's (what the "
              "first silo of a new release does by itself), and say what was done; safe "
              "while the previous release runs")  # fmt: skip
    mig.add_argument("--storage", metavar="URL", default=None,
                     help="the store: Redis or postgresql://... (default: --storage-url, "
                     "else --redis-url)")  # fmt: skip

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
            "remove every row of a grain type (and key prefix) or of --label, a page at a "
            "time")  # fmt: skip
    _filter_args(p)
    p.add_argument("--dry-run", action="store_true", help="count what would go; remove nothing")
    for verb, doing in (("pause-many", "pause"), ("resume-many", "resume")):
        p = sub(ops, verb, f"{doing} every row of --label (and --type, --prefix)")
        _filter_args(p)
        p.add_argument("--dry-run", action="store_true", help=f"count what would {doing}")
    p = sub(ops, "export", "write rows as JSON lines (of --type, --prefix) to stdout or --output")
    _filter_args(p)
    p.add_argument("--output", metavar="FILE", help="write here instead of stdout (no env)")
    p.add_argument("--dead-letters", action="store_true",
                   help="the dead letters too, after the rows (no env)")  # fmt: skip
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
    p = sub(ops, "counters", "what became of a row's slots: delivered, failed, skipped by reason")
    _row_args(p)
    p = sub(ops, "describe", "a row, its next fire times, its counters, latest deliveries, "
            "backfill and dead letters")  # fmt: skip
    _row_args(p)
    p.add_argument("--count", type=int, default=10, metavar="N",
                   help="how many next fire times (1..1000; default 10)")  # fmt: skip
    p.add_argument("--after", metavar="WHEN", type=instant_arg,
                   help="fire times after this ISO 8601 instant (default now)")  # fmt: skip
    p = sub(ops, "dead-letters", "ticks that failed their last attempt, newest first")
    p.add_argument("--grain", metavar="GRAIN", help="only this grain's, TYPE/KEY (no env)")
    p.add_argument("--name", metavar="NAME", help="only this reminder's (no env)")
    p.add_argument("--limit", type=int, metavar="N",
                   **_env_help("at most this many letters", 100, "ORLEANSPY_LIMIT"))  # fmt: skip
    p.add_argument("--cursor", metavar="CURSOR",
                   help="the next page: the cursor the previous page printed (no env)")  # fmt: skip
    p.add_argument("--show", action="store_true",
                   help="each letter in full, its traceback too (no env)")  # fmt: skip
    p = sub(ops, "replay", "deliver a dead letter again as its slot, and remove it once that "
            "succeeds (needs a running silo)")  # fmt: skip
    p.add_argument("letter_id", metavar="ID", help="the letter's id (dead-letters prints it)")
    p = sub(ops, "discard", "remove a dead letter without delivering it")
    p.add_argument("letter_id", metavar="ID", help="the letter's id (dead-letters prints it)")
    add_schedule_commands(ops, sub, _row_args)

    audit = sub(commands, "audit", "the operator audit log: who paused, triggered, changed, "
                "deleted or imported reminders, when, the row before and after, the outcome "
                "(newest first)")  # fmt: skip
    audit_arguments(audit)

    demo = sub(commands, "demo", "run the embedded demo (one process, in memory)")
    demo.add_argument("--seconds", type=float, metavar="S", **_env_help(
        "how long the demo runs", 5.0, "ORLEANSPY_DEMO_SECONDS"))  # fmt: skip
    return parser


def _filter_args(p: argparse.ArgumentParser, *, required: bool = False) -> None:
    p.add_argument("--type", dest="type_name", metavar="TYPE", required=required,
                   help="only rows of this grain type (no env)")  # fmt: skip
    p.add_argument("--prefix", dest="key_prefix", metavar="PREFIX",
                   help="only string keys starting with this (needs --type; no env)")  # fmt: skip
    p.add_argument("--label", dest="labels", metavar="KEY=VALUE", action="append",
                   type=label_item, help="only rows with this label (repeat for more; "
                   "no env)")  # fmt: skip


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
