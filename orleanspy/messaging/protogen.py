"""Regenerate ``orleanspy/messaging/_generated`` from ``orleanspy/messaging/protos``.

Run as ``python -m orleanspy.messaging.protogen``. The generated code is committed;
``tests/messaging/test_protos_fresh.py`` fails when it differs from a fresh run.
protoc names the modules after the proto package (``orleanspy.v1``), so the
cross-module imports are rewritten to point into ``_generated``.

Only the messages are generated: ``services.proto`` documents the two services
for other implementations, while ``messaging.grpc`` serves and calls them
through generic handlers by method path, so no generated stub is used.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

__all__ = ["GENERATED_DIR", "PROTOS", "PROTO_ROOT", "generate", "main"]

# The protos travel in the wheel beside the code generated from them; protoc is
# run from their root so the files keep their import path, orleanspy/v1/....
PROTO_ROOT = Path(__file__).resolve().parent / "protos"
PROTOS = ("orleanspy/v1/messages.proto",)
GENERATED_DIR = Path(__file__).resolve().parent / "_generated"

_INIT = (
    '"""Generated from orleanspy/messaging/protos by orleanspy.messaging.protogen; '
    'do not edit."""\n'
)
_PROTO_IMPORT = "from orleanspy.v1 import "
_OUR_IMPORT = "from orleanspy.messaging._generated import "


def _protoc(*args: str) -> None:
    from grpc_tools import protoc  # type: ignore[import-untyped]

    if protoc.main(["grpc_tools.protoc", f"-I{PROTO_ROOT}", *args]) != 0:
        raise RuntimeError(f"protoc failed: {' '.join(args)}")


def generate(out_dir: Path) -> list[str]:
    """Write the generated modules into ``out_dir`` (created if missing); return
    the file names written. Only ``grpc_tools`` is needed, not a system protoc."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp)
        _protoc(f"--python_out={raw}", f"--pyi_out={raw}", *PROTOS)
        written = ["__init__.py"]
        (out_dir / "__init__.py").write_text(_INIT)
        for path in sorted((raw / "orleanspy" / "v1").iterdir()):
            text = path.read_text().replace(_PROTO_IMPORT, _OUR_IMPORT)
            (out_dir / path.name).write_text(text)
            written.append(path.name)
    return written


def main() -> None:
    """Replace ``_generated`` with a fresh generation."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = Path(tmp) / "_generated"
        names = generate(fresh)
        shutil.rmtree(GENERATED_DIR, ignore_errors=True)
        shutil.copytree(fresh, GENERATED_DIR)
    sys.stdout.write(f"wrote {', '.join(names)} to {GENERATED_DIR}\n")


if __name__ == "__main__":
    main()
