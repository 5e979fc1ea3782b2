"""An optional backend that is not installed is one line saying how to install it."""

from __future__ import annotations

import subprocess
import sys

BLOCK_ASYNCPG = "import sys; sys.modules['asyncpg'] = None\n"


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", BLOCK_ASYNCPG + code],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_cli_on_postgresql_without_asyncpg_says_what_to_install_in_one_line() -> None:
    result = _run(
        "from orleanspy.cli import main\n"
        "sys.exit(main(['reminders', 'count', '--storage-url', 'postgresql://u@127.0.0.1:1/x']))\n"
    )
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "needs asyncpg" in lines[0] and "pip install 'orleanspy[postgres]'" in lines[0]
    assert "pip install -e '.[postgres]'" in lines[0]


def test_a_silo_on_postgresql_without_asyncpg_raises_a_configuration_error() -> None:
    result = _run(
        "import asyncio\n"
        "from orleanspy import Silo, SiloOptions\n"
        "from orleanspy.errors import ConfigurationError\n"
        "async def main():\n"
        "    try:\n"
        "        await Silo(SiloOptions(storage_url='postgresql://u@127.0.0.1:1/x')).start()\n"
        "    except ConfigurationError as exc:\n"
        "        print(exc)\n"
        "asyncio.run(main())\n"
    )
    assert result.returncode == 0, result.stderr
    assert "pip install 'orleanspy[postgres]'" in result.stdout
