"""Identities: grain ids, silo addresses, and the stable 32-bit hash.

``uniform_hash`` is the one hash used for the ring, the reminder shards and the
directory shards. It must give the same value in every process and every Python
run, so it is built on BLAKE2b over a canonical byte form, never on ``hash()``
(which is salted per process for ``str``).
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass, field
from typing import TypeAlias

__all__ = ["GrainId", "GrainKey", "SiloAddress", "uniform_hash"]

GrainKey: TypeAlias = str | int | uuid.UUID

_KEY_TAG = {str: "s", int: "i", uuid.UUID: "u"}


def uniform_hash(data: bytes | str) -> int:
    """A 32-bit unsigned hash, identical across processes, runs and platforms."""
    if isinstance(data, str):
        data = data.encode()
    return int.from_bytes(hashlib.blake2b(data, digest_size=4).digest(), "big")


@dataclass(frozen=True, slots=True, order=True)
class GrainId:
    """The identity of a grain: its type name and its key.

    Printed as ``type/key``. ``canonical`` is an unambiguous text form (the key's
    kind is tagged, so the int key ``1`` and the str key ``"1"`` differ) used in
    storage keys; ``GrainId.parse`` reads it back.
    """

    type_name: str
    key: GrainKey
    _hash: int = field(default=-1, init=False, compare=False, repr=False)
    _py_hash: int = field(default=0, init=False, compare=False, repr=False)
    _canonical: str = field(default="", init=False, compare=False, repr=False)

    # Grain ids key every hot dictionary (catalog, directory cache, pending
    # calls): a cached hash and an identity shortcut beat the generated methods.
    def __hash__(self) -> int:
        h = self._py_hash
        if not h:
            h = hash((self.type_name, self.key)) or 1
            object.__setattr__(self, "_py_hash", h)
        return h

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if type(other) is not GrainId:
            return NotImplemented
        return self.key == other.key and self.type_name == other.type_name

    def __post_init__(self) -> None:
        if not self.type_name or "/" in self.type_name or "|" in self.type_name:
            raise ValueError(
                f"invalid grain type name {self.type_name!r}: non-empty, no '/' or '|'"
            )
        key = self.key
        if isinstance(key, bool) or type(key) not in _KEY_TAG:
            raise TypeError(f"a grain key is str, int or uuid.UUID, not {type(key).__name__}")

    @property
    def canonical(self) -> str:
        """``type/<tag>:key`` with tag ``s`` (str), ``i`` (int) or ``u`` (UUID) (cached)."""
        text = self._canonical
        if not text:
            text = f"{self.type_name}/{_KEY_TAG[type(self.key)]}:{self.key}"
            object.__setattr__(self, "_canonical", text)
        return text

    @classmethod
    def parse(cls, text: str) -> GrainId:
        """Read back the ``canonical`` form."""
        type_name, sep, rest = text.partition("/")
        tag, colon, raw = rest.partition(":")
        if not sep or not colon or tag not in ("s", "i", "u"):
            raise ValueError(f"not a canonical grain id: {text!r}")
        key: GrainKey
        if tag == "s":
            key = raw
        elif tag == "i":
            key = int(raw)
        else:
            key = uuid.UUID(raw)
        return cls(type_name, key)

    def uniform_hash(self) -> int:
        """The grain's position on the ring and in the reminder shards (cached)."""
        h = self._hash
        if h < 0:
            h = uniform_hash(self.canonical)
            object.__setattr__(self, "_hash", h)
        return h

    def __str__(self) -> str:
        return f"{self.type_name}/{self.key}"


@dataclass(frozen=True, slots=True, order=True)
class SiloAddress:
    """A silo: host, silo port and generation (its start time in ms, unique per run).

    Two runs of a silo on the same endpoint differ by generation, so a restarted
    silo is never mistaken for its dead predecessor.
    """

    host: str
    port: int
    generation: int = 0
    _py_hash: int = field(default=0, init=False, compare=False, repr=False)

    # Silo addresses key the hot dictionaries of every send (links, liveness,
    # address text): cache the hash, as GrainId does.
    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if type(other) is not SiloAddress:
            return NotImplemented
        return (
            self.port == other.port
            and self.generation == other.generation
            and self.host == other.host
        )

    def __hash__(self) -> int:
        h = self._py_hash
        if not h:
            h = hash((self.port, self.generation, self.host)) or 1
            object.__setattr__(self, "_py_hash", h)
        return h

    @property
    def endpoint(self) -> str:
        """``host:port`` for dialing (IPv6 hosts in brackets)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def uniform_hash(self) -> int:
        return uniform_hash(str(self))

    def __str__(self) -> str:
        return f"{self.endpoint}@{self.generation}"

    @classmethod
    def parse(cls, text: str) -> SiloAddress:
        """Read back ``str(address)``.

        Equal texts give the same object (see ``intern``), so the addresses a
        silo reads from membership, the directory and the wire compare by
        identity in its hot paths.
        """
        address = _interned.get(text)
        if address is None:
            endpoint, sep, gen = text.rpartition("@")
            host, colon, port = endpoint.rpartition(":")
            if not sep or not colon:
                raise ValueError(f"not a silo address: {text!r}")
            address = cls(host.strip("[]"), int(port), int(gen)).intern()
        return address

    def intern(self) -> SiloAddress:
        """The one shared object equal to this address (this one, if it is the first)."""
        text = str(self)
        address = _interned.get(text)
        if address is None:
            if len(_interned) >= _INTERN_LIMIT:
                _interned.clear()  # bounded; a cleared address is merely re-made
            address = _interned[text] = self
        return address


# A process meets few silos (one per silo run), so this stays small; the limit
# only guards against a peer sending ever new addresses.
_INTERN_LIMIT = 4096
_interned: dict[str, SiloAddress] = {}
