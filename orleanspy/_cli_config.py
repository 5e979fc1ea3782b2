"""The settings of ``orleanspy silo``: a TOML file, the environment and flags.

Every option of ``SiloOptions`` and of its ``membership``, ``reminders``,
``messaging`` (``tls`` included) and ``redis`` is a *key*, named as in the file::

    cluster_id = "prod"
    host = "0.0.0.0"
    advertised_host = "10.0.0.5"
    storage_url = "redis://10.0.0.2:6379/0"
    import = ["myapp.grains"]        # the command's own keys: import, log_level, log_format

    [membership]
    probe_interval = "2s"            # a duration: seconds, or "500ms", "5s", "2m", "1h", "7d"

    [messaging]
    cluster_secret_file = "/run/secrets/orleanspy"   # or cluster_secret = "..."

    [messaging.tls]
    cert_file = "silo.pem"
    key_file = "silo.key"
    ca_file = "ca.pem"

    [redis]
    wait_replicas = 1                # writes that must survive wait for a replica

    [storage]                        # grain storage providers: name = URL
    default = "postgresql://app@db/app"

Each key has an environment variable, ``ORLEANSPY_`` and the key in capitals with
``_`` for ``.`` (``ORLEANSPY_MEMBERSHIP_PROBE_INTERVAL``); the keys that had a
variable before keep its name (``ENV_NAMES``). Flags set keys too: the silo's own
(``--host``...) and ``--set KEY=VALUE`` for any. A key takes the first value found
in: flags, environment, file, the command's defaults, the options' defaults.

An unknown key in the file, a value of the wrong type and an option the options
refuse are each a ``ConfigurationError`` that names the key and where its value
came from. Unknown ``ORLEANSPY_`` variables are ignored: other commands and
tools use that prefix too.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import tomllib
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from orleanspy.errors import ConfigurationError
from orleanspy.options import (
    MembershipOptions,
    MessagingOptions,
    RedisOptions,
    ReminderOptions,
    SiloOptions,
    TlsOptions,
)
from orleanspy.tables import table_backend

__all__ = [
    "CONNECTION_KEYS",
    "SETTINGS",
    "Setting",
    "SiloConfig",
    "client_messaging",
    "connection_values",
    "describe",
    "load",
]

# The options classes and where their keys live.
_SECTIONS: tuple[tuple[str, type[Any]], ...] = (
    ("", SiloOptions),
    ("membership.", MembershipOptions),
    ("reminders.", ReminderOptions),
    ("messaging.", MessagingOptions),
    ("messaging.tls.", TlsOptions),
    ("redis.", RedisOptions),
)
_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

# Variables older than this module keep their names.
ENV_NAMES = {
    "name": "ORLEANSPY_SILO_NAME",
    "advertised_host": "ORLEANSPY_ADVERTISE_HOST",
    "storage_start_timeout": "ORLEANSPY_STORAGE_TIMEOUT",
    "messaging.cluster_secret": "ORLEANSPY_CLUSTER_SECRET",
    "messaging.cluster_secret_file": "ORLEANSPY_CLUSTER_SECRET_FILE",
    "storage.default": "ORLEANSPY_GRAIN_STORAGE",
}

# Where the command differs from the options' defaults: a silo run from the
# command line always has a gateway.
COMMAND_DEFAULTS: dict[str, object] = {"gateway_port": 0}


@dataclass(frozen=True, slots=True)
class Setting:
    """One key: its value kind, whether it takes ``none``, its default and variable."""

    key: str
    kind: str  # duration, int, float, bool, str, modules
    optional: bool
    default: object
    help: str = ""

    @property
    def env(self) -> str:
        return ENV_NAMES.get(self.key) or "ORLEANSPY_" + self.key.upper().replace(".", "_")


@dataclass(frozen=True, slots=True)
class SiloConfig:
    """What ``load`` made of every source: the options and the command's own keys."""

    options: SiloOptions
    imports: tuple[str, ...]
    log_level: str
    log_format: str


_KINDS: dict[object, str] = {
    timedelta: "duration", bool: "bool", int: "int", float: "float", str: "str",
}  # fmt: skip


def _kind(hint: object) -> tuple[str, bool] | None:
    """The kind of a field's type and whether it is optional; ``None``: not a key."""
    optional = False
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        parts = [a for a in typing.get_args(hint) if a is not type(None)]
        optional = len(parts) < len(typing.get_args(hint))
        if len(parts) != 1:
            return None
        hint = parts[0]
    kind = _KINDS.get(hint)
    return None if kind is None else (kind, optional)


def _default(f: dataclasses.Field[Any]) -> object:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def _build() -> dict[str, Setting]:
    out: dict[str, Setting] = {}
    for prefix, cls in _SECTIONS:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            kind = _kind(hints[f.name])
            if kind is not None:
                key = prefix + f.name
                out[key] = Setting(key, kind[0], kind[1], COMMAND_DEFAULTS.get(key, _default(f)))
    extra = (
        Setting("messaging.cluster_secret_file", "str", True, None,
                "file holding the cluster secret (instead of messaging.cluster_secret)"),
        Setting("storage.default", "str", True, None,
                "grain storage \"default\" (storage.NAME names others)"),
        Setting("import", "modules", False, (), "modules defining grain classes"),
        Setting("log_level", "str", True, None, "DEBUG, INFO, WARNING, ERROR or CRITICAL"),
        Setting("log_format", "str", False, "text", "text or json"),
    )  # fmt: skip
    out.update((s.key, s) for s in extra)
    return out


SETTINGS: Mapping[str, Setting] = _build()
"""Every key, by name (``storage.NAME`` keys other than ``default`` are made on use)."""


def _setting(key: str) -> Setting | None:
    if key in SETTINGS:
        return SETTINGS[key]
    if key.startswith("storage.") and len(key) > len("storage."):
        return Setting(key, "str", True, None)
    return None


_DURATION = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|min|h|d)?\s*")
_UNIT = {None: 1.0, "ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}
_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")


def _bad(s: Setting, where: str, what: str) -> ConfigurationError:
    return ConfigurationError(f"{s.key} ({where}): {what}")


def _coerce(s: Setting, value: object, where: str) -> object:
    """``value`` (text from a variable or flag, or a TOML value) as ``s`` wants it."""
    if isinstance(value, str) and s.optional and s.kind != "str" and value.lower() == "none":
        return None
    if s.kind == "str":
        if not isinstance(value, str):
            raise _bad(s, where, f"give a string, got {value!r}")
        return value
    if s.kind == "modules":
        if isinstance(value, str):
            return tuple(m.strip() for m in value.split(",") if m.strip())
        if isinstance(value, list) and all(isinstance(m, str) for m in value):
            return tuple(value)
        raise _bad(s, where, f"give module names (a list, or comma-separated), got {value!r}")
    if s.kind == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in _TRUE + _FALSE:
            return value.lower() in _TRUE
        raise _bad(s, where, f"give true or false, got {value!r}")
    if s.kind == "duration":
        return _duration(s, value, where)
    if s.kind == "int":
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str) and re.fullmatch(r"\s*[-+]?\d+\s*", value):
            return int(value)
        raise _bad(s, where, f"give a whole number, got {value!r}")
    if isinstance(value, int | float) and not isinstance(value, bool):  # a float key
        return float(value)
    if isinstance(value, str) and re.fullmatch(r"\s*[-+]?(\d+\.?\d*|\.\d+)\s*", value):
        return float(value)
    raise _bad(s, where, f"give a number, got {value!r}")


def _duration(s: Setting, value: object, where: str) -> timedelta:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return timedelta(seconds=value)
    match = _DURATION.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        raise _bad(
            s, where, f"not a duration: {value!r} (give seconds, or a number with ms, s, m, "
            "h or d: 500ms, 5s, 2m, 1h, 7d)",
        )  # fmt: skip
    return timedelta(seconds=float(match[1]) * _UNIT[match[2]])


# -- sources --------------------------------------------------------------------------

Values = dict[str, tuple[object, str]]  # key -> (value, where it came from)


def _unknown(key: str, where: str) -> ConfigurationError:
    close = difflib.get_close_matches(key, list(SETTINGS), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else " (orleanspy silo --help lists every key)"
    return ConfigurationError(f"{where}: unknown key {key!r}{hint}")


def read_file(path: Path) -> Values:
    """The keys set in the TOML file at ``path``, checked."""
    where = str(path)
    try:
        with path.open("rb") as f:
            doc = tomllib.load(f)
    except OSError as exc:
        raise ConfigurationError(
            f"cannot read config file {where}: {exc.strerror or exc}"
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigurationError(f"{where} is not valid TOML: {exc}") from None
    out: Values = {}

    def walk(table: Mapping[str, Any], prefix: str) -> None:
        for name, value in table.items():
            key = prefix + name
            s = _setting(key)
            if isinstance(value, dict) and s is None:
                if not any(k.startswith(key + ".") for k in SETTINGS) and key != "storage":
                    raise _unknown(key, where)
                walk(value, key + ".")
                continue
            if s is None:
                raise _unknown(key, where)
            out[key] = (_coerce(s, value, where), where)

    walk(doc, "")
    return out


def read_env(environ: Mapping[str, str], prefix: str = "") -> Values:
    """The keys set by ``ORLEANSPY_...`` variables (others are not looked at); with
    ``prefix``, only the keys that start with it."""
    out: Values = {}
    for s in SETTINGS.values():
        if not s.key.startswith(prefix):
            continue
        text = environ.get(s.env)
        if text is not None:
            out[s.key] = (_coerce(s, text, f"env {s.env}"), f"env {s.env}")
    return out


def read_flags(flags: Mapping[str, tuple[object, str]], assignments: Sequence[str]) -> Values:
    """Keys set by dedicated flags (``{key: (value, flag)}``) and ``--set KEY=VALUE``."""
    out: Values = {}
    for key, (value, flag) in flags.items():
        s = _setting(key)
        assert s is not None, key
        out[key] = (_coerce(s, value, flag), flag)
    for text in assignments:
        key, eq, value = text.partition("=")
        key = key.strip()
        if not eq:
            raise ConfigurationError(f"--set {text!r}: write KEY=VALUE, e.g. --set "
                                     "membership.probe_interval=2s")  # fmt: skip
        s = _setting(key)
        if s is None:
            raise _unknown(key, "--set")
        if key in out:
            raise ConfigurationError(f"{key} is given twice on the command line "
                                     f"({out[key][1]} and --set)")  # fmt: skip
        out[key] = (_coerce(s, value, "--set"), "--set")
    return out


# -- assembly -------------------------------------------------------------------------


def load(
    file: Path | None,
    environ: Mapping[str, str],
    flags: Mapping[str, tuple[object, str]],
    assignments: Sequence[str] = (),
) -> SiloConfig:
    """Every source merged (flags, then environment, then file, then defaults) into
    the silo's options; ``ConfigurationError`` names the key of a bad value."""
    values: Values = {k: (v, "default") for k, v in COMMAND_DEFAULTS.items()}
    for layer in (
        read_file(file) if file is not None else {},
        read_env(environ),
        read_flags(flags, assignments),
    ):
        values.update(layer)
    kept = {k: v for k, v in values.items() if k not in ("import", "log_level", "log_format")}
    for key, (url, where) in kept.items():
        if key.startswith("storage.") and url is not None:
            _shared_store(key, str(url), where)
    options = _options(kept)
    imports = values.get("import", ((), ""))
    level, level_from = values.get("log_level", (None, ""))
    if level is not None and str(level).upper() not in _LEVELS:
        raise ConfigurationError(f"log_level ({level_from}): unknown log level {level!r}; "
                                 f"use one of {', '.join(_LEVELS)}")  # fmt: skip
    fmt, fmt_from = values.get("log_format", ("text", "default"))
    if fmt not in ("text", "json"):
        raise ConfigurationError(f"log_format ({fmt_from}): give text or json, got {fmt!r}")
    return SiloConfig(
        options=options,
        imports=typing.cast(tuple[str, ...], imports[0]),
        log_level=str(level or "INFO").upper(),
        log_format=str(fmt),
    )


#: The keys a command that talks to a cluster (``cluster status``, ``reminders``,
#: ``dashboard``, ``migrate``) takes from ``--config``: where the tables are, which
#: cluster, and its logging. The same file serves the silos, so its other keys
#: (ports, probes, ...) are checked and then left to them; ``messaging.*`` (the
#: secret, its file, TLS, timeouts) is read by ``client_messaging``.
CONNECTION_KEYS = (
    "redis_url",
    "storage_url",
    "membership_url",
    "reminder_table_url",
    "cluster_id",
    "service_id",
    "messaging.cluster_secret",
    "log_level",
    "log_format",
)


def connection_values(file: Path | None) -> Values:
    """The ``CONNECTION_KEYS`` the TOML file at ``file`` sets, each with where it
    came from; the whole file is checked as ``load`` checks it (an unknown key
    or a bad value is a ``ConfigurationError`` naming it)."""
    if file is None:
        return {}
    return {k: v for k, v in read_file(file).items() if k in CONNECTION_KEYS}


def client_messaging(
    file: Path | None, environ: Mapping[str, str], secret_flag: str | None = None
) -> MessagingOptions:
    """The messaging options of a command that connects to a cluster's gateways, as a
    silo given the same sources would have them: every ``messaging.*`` key (the
    cluster secret or its file, ``messaging.tls.*``) from ``--secret``
    (``secret_flag``), else its variable, else the file."""
    values: Values = {}
    if file is not None:
        values.update((k, v) for k, v in read_file(file).items() if k.startswith("messaging."))
    values.update(read_env(environ, "messaging."))
    if secret_flag is not None:
        values["messaging.cluster_secret"] = (secret_flag, "--secret")
    try:
        return _messaging(values)
    except ConfigurationError as exc:
        raise _sourced(exc, values) from None


def _shared_store(key: str, url: str, where: str) -> None:
    """A silo of a cluster keeps grain state where every silo reads it: in memory it
    would be this silo's alone, and lost when the grain moves."""
    try:
        table_backend(url)
    except ConfigurationError:
        raise ConfigurationError(
            f"{key} ({where}): {url.split('://', 1)[0]!r} is not a shared store; give a "
            "redis:// or postgresql:// URL"
        ) from None


def _section(values: Values, prefix: str) -> dict[str, object]:
    return {
        k[len(prefix) :]: v
        for k, (v, _) in values.items()
        if k.startswith(prefix) and "." not in k[len(prefix) :]
    }


def _options(values: Values) -> SiloOptions:
    try:
        return SiloOptions(
            **_section(values, ""),  # type: ignore[arg-type]
            membership=MembershipOptions(**_section(values, "membership.")),  # type: ignore[arg-type]
            reminders=ReminderOptions(**_section(values, "reminders.")),  # type: ignore[arg-type]
            messaging=_messaging(values),
            redis=RedisOptions(**_section(values, "redis.")),  # type: ignore[arg-type]
            storage=_section(values, "storage.") or None,
        )
    except ConfigurationError as exc:
        raise _sourced(exc, values) from None


def _messaging(values: Values) -> MessagingOptions:
    fields = _section(values, "messaging.")
    secret_file = fields.pop("cluster_secret_file", None)
    if secret_file is not None:
        secret_from = values["messaging.cluster_secret_file"][1]
        other = values.get("messaging.cluster_secret")
        if other is not None and other[0] is not None and other[1] == secret_from:
            raise ConfigurationError(f"messaging.cluster_secret and cluster_secret_file are both "
                                     f"set ({secret_from}): give one")  # fmt: skip
        if other is None or _rank(secret_from) >= _rank(other[1]):
            fields["cluster_secret"] = _secret_from(str(secret_file), secret_from)
    tls = _section(values, "messaging.tls.")
    if tls:
        missing = [n for n in ("cert_file", "key_file", "ca_file") if tls.get(n) is None]
        if missing:
            raise ConfigurationError(
                f"messaging.tls: {', '.join(missing)} missing "
                "(cert_file, key_file and ca_file are all needed)"
            )
        fields["tls"] = TlsOptions(**tls)  # type: ignore[arg-type]
    return MessagingOptions(**fields)  # type: ignore[arg-type]


def _rank(where: str) -> int:
    """How strong a source is: flags over the environment over a file."""
    if where.startswith("-"):
        return 3
    if where.startswith("env "):
        return 2
    return 1


def _secret_from(path: str, where: str) -> str:
    try:
        secret = Path(path).read_text().strip()
    except OSError as exc:
        raise ConfigurationError(f"messaging.cluster_secret_file ({where}): cannot read "
                                 f"{path!r}: {exc.strerror or exc}") from None  # fmt: skip
    if not secret:
        raise ConfigurationError(f"messaging.cluster_secret_file ({where}): {path!r} is empty")
    return secret


_OWNER = {cls.__name__: prefix for prefix, cls in _SECTIONS}


def _sourced(exc: ConfigurationError, values: Values) -> ConfigurationError:
    """Name the key (and where its value came from) in an error the options raised."""
    text = str(exc)
    match = re.search(r"\b(\w+Options)\.(\w+)(?:\['(\w+)'\])?", text)
    if match is None or match[1] not in _OWNER:
        return exc
    key = _OWNER[match[1]] + match[2] + (f".{match[3]}" if match[3] else "")
    where = values.get(key, (None, "the default"))[1]
    return ConfigurationError(f"{key} ({where}): {text}")


def describe() -> str:
    """Every key with its variable and default, for ``orleanspy silo --help``."""
    lines = ["settings (a --config file's keys, --set KEY=VALUE, or the variable):"]
    shown_as = {"storage.default": "the cluster's store", "log_level": "INFO"}
    for s in SETTINGS.values():
        default = s.default
        if s.key in shown_as:
            shown = shown_as[s.key]
        elif isinstance(default, timedelta):
            shown = f"{default.total_seconds():g}s"
        elif default is None or default == ():
            shown = "none"
        else:
            shown = str(default).lower() if isinstance(default, bool) else str(default)
        what = s.help or s.kind
        lines.append(f"  {s.key:<36} {s.env:<44} {what}; default {shown}")
    return "\n".join(lines)
