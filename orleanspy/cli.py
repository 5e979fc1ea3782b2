"""The ``orleanspy`` command: run a silo, look at reminders.

This is the only module that reads the environment, command-line flags and
signals; everything else takes options as values.

::

    orleanspy silo --redis-url redis://127.0.0.1:6379/0 --import myapp.grains \\
                   --silo-port 11111 --gateway-port 30000 \\
                   --storage postgresql://app@db/app    # grain state (default: Redis)
    orleanspy reminders --redis-url redis://127.0.0.1:6379/0 upcoming --minutes 10
    orleanspy reminders --redis-url redis://127.0.0.1:6379/0 count

``--storage-url`` takes a Redis or a PostgreSQL URL (``postgresql://...``) for the
cluster's tables and means the same as ``--redis-url``; ``--membership-url`` and
``--reminder-table-url`` put one table elsewhere; ``--storage`` picks where grain
state lives. ``ORLEANSPY_REDIS_URL``, ``ORLEANSPY_STORAGE_URL``,
``ORLEANSPY_MEMBERSHIP_URL``, ``ORLEANSPY_REMINDER_TABLE_URL``,
``ORLEANSPY_GRAIN_STORAGE``, ``ORLEANSPY_CLUSTER_ID`` and ``ORLEANSPY_SERVICE_ID``
stand in for the flags. ``silo`` prints ``READY <address> <gateway port>`` once the
silo is Active and stops gracefully on SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import os
import signal
import sys
from collections.abc import Sequence
from datetime import timedelta

from orleanspy.client import ClusterClient
from orleanspy.errors import ConfigurationError, OrleansPyError
from orleanspy.options import MessagingOptions, SiloOptions
from orleanspy.run import run
from orleanspy.runtime.silo import Silo

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    env = os.environ.get
    parser = argparse.ArgumentParser(prog="orleanspy", description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", default=env("ORLEANSPY_REDIS_URL"))
    parser.add_argument("--storage-url", default=env("ORLEANSPY_STORAGE_URL"))
    parser.add_argument("--membership-url", default=env("ORLEANSPY_MEMBERSHIP_URL"))
    parser.add_argument("--reminder-table-url", default=env("ORLEANSPY_REMINDER_TABLE_URL"))
    parser.add_argument("--cluster-id", default=env("ORLEANSPY_CLUSTER_ID", "dev"))
    parser.add_argument("--service-id", default=env("ORLEANSPY_SERVICE_ID", "default"))
    parser.add_argument("--secret", default=env("ORLEANSPY_CLUSTER_SECRET"))
    parser.add_argument("--log-level", default="INFO")
    commands = parser.add_subparsers(dest="command", required=True)

    silo = commands.add_parser("silo", help="run one silo until SIGTERM/SIGINT")
    silo.add_argument("--import", dest="imports", action="append", default=[],
                      help="module defining grain classes (repeatable)")  # fmt: skip
    silo.add_argument("--name")
    silo.add_argument("--host", default="127.0.0.1")
    silo.add_argument("--silo-port", type=int, default=0)
    silo.add_argument("--gateway-port", type=int, default=0)
    silo.add_argument("--storage", metavar="URL", default=env("ORLEANSPY_GRAIN_STORAGE"),
                      help="grain state storage \"default\": a redis:// or postgresql:// URL "
                      "(default: the --redis-url Redis)")  # fmt: skip

    rem = commands.add_parser("reminders", help="inspect the reminder table")
    what = rem.add_subparsers(dest="what", required=True)
    upcoming = what.add_parser("upcoming", help="rows due within --minutes")
    upcoming.add_argument("--minutes", type=float, default=10.0)
    upcoming.add_argument("--limit", type=int, default=100)
    what.add_parser("count", help="how many rows the table holds")
    return parser


def _messaging(args: argparse.Namespace) -> MessagingOptions:
    return MessagingOptions(cluster_secret=args.secret) if args.secret else MessagingOptions()


def _grain_storage(url: str | None) -> dict[str, str] | None:
    if url is None:
        return None
    if not url.startswith(("redis://", "rediss://", "unix://", "postgresql://", "postgres://")):
        raise ConfigurationError(f"--storage {url!r}: give a redis:// or postgresql:// URL")
    return {"default": url}


async def _run_silo(args: argparse.Namespace) -> None:
    for module in args.imports:
        importlib.import_module(module)
    options = SiloOptions(
        cluster_id=args.cluster_id,
        service_id=args.service_id,
        name=args.name,
        host=args.host,
        silo_port=args.silo_port,
        gateway_port=args.gateway_port,
        redis_url=args.redis_url,
        storage_url=args.storage_url,
        membership_url=args.membership_url,
        reminder_table_url=args.reminder_table_url,
        messaging=_messaging(args),
        storage=_grain_storage(args.storage),
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with Silo(options) as silo:
        print(f"READY {silo.address} {silo.gateway_port}", flush=True)
        stopped = asyncio.ensure_future(stop.wait())
        # A silo declared dead by the cluster stops on its own; so do we.
        while not stopped.done() and not silo.declared_dead:
            await asyncio.wait([stopped], timeout=0.5)
        stopped.cancel()


async def _reminders(args: argparse.Namespace) -> None:
    async with ClusterClient(
        args.membership_url or args.storage_url or args.redis_url,
        args.cluster_id,
        args.service_id,
        options=_messaging(args),
    ) as client:
        if args.what == "count":
            print(await client.reminders.count_all())
            return
        rows = await client.reminders.upcoming(timedelta(minutes=args.minutes), args.limit)
        for row in rows:
            schedule = f"cron {row.cron!r} {row.tz or 'UTC'}" if row.cron else f"every {row.period}"
            print(f"{row.next_due.isoformat()}  {row.grain_id}  {row.name}  {schedule}")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``orleanspy`` command; returns the exit status."""
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    if (args.membership_url or args.storage_url or args.redis_url) is None:
        print(
            "orleanspy: --storage-url or --redis-url (or ORLEANSPY_STORAGE_URL) is required",
            file=sys.stderr,
        )
        return 2
    try:
        if args.command == "silo":
            run(_run_silo(args))
        else:
            run(_reminders(args))
    except OrleansPyError as exc:
        print(f"orleanspy: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
