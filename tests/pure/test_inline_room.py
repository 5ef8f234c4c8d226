"""Room under Linux's limit on one argument (MAX_ARG_STRLEN) for every node program, each way
it travels: a program near it fails to start with E2BIG on every node, so the guard fails first,
``ARG_MARGIN`` before, with the way and the size."""

from __future__ import annotations

import base64
import os
import re
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from fleetctl import remote
from fleetctl.phases.frames import last_data
from fleetctl.testing.infra import CLEAN_PROBE

PROGRAMS = sorted(
    p.name for p in remote.path("x.py").parent.glob("*.py") if p.name != "__init__.py"
)


@pytest.mark.parametrize("name", PROGRAMS)
def test_every_way_a_node_program_travels_stays_a_margin_under_one_arguments_limit(
    name: str,
) -> None:
    limit = remote.MAX_ARG_STRLEN - remote.ARG_MARGIN
    over = {way: size for way, size in remote.argument_sizes(name).items() if size > limit}
    assert not over, (
        f"fleetctl/remote/programs/{name}: {over} bytes, within {remote.ARG_MARGIN} of Linux's "
        f"{remote.MAX_ARG_STRLEN}-byte limit on one argument (MAX_ARG_STRLEN); make room "
        "(install it and run it by path, or trim it) before it grows on"
    )


def test_a_large_program_goes_compressed_and_runs_as_its_plain_code_would() -> None:
    """The supervisor is over COMPRESS_OVER: sent compressed, it still runs (here its usage
    line); a small one goes as it is, readable and without the unpacking's imports."""
    code = remote.inline("supervisor.py")
    assert "zlib.decompress" in code and len(code) < remote.MAX_ARG_STRLEN // 2
    assert "zlib" not in remote.inline("envinfo.py")
    res = subprocess.run(
        [sys.executable, remote.NO_SITE, "-c", code, "no-such-mode"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 2 and "unknown mode 'no-such-mode'" in res.stderr, res.stderr


@pytest.mark.parametrize("name", PROGRAMS)
def test_every_node_program_is_named_in_clear_on_its_command_line(name: str) -> None:
    """Compressed or not, ``fleetctl-NAME`` stays readable in the -c code: `ps` on a node, an
    operator and the lab tests find a node program by it."""
    assert f"fleetctl-{name}" in remote.inline(name)


def unpacked_layers(code: str) -> int:
    """How many times ``code`` unpacks itself (a base64 literal zlib-decompressed and run)."""
    found = re.search(r"(?:a2b_base64|b64decode)\(\s*'([A-Za-z0-9+/=]+)'", code)
    if found is None:
        return 0
    inner = zlib.decompress(base64.b64decode(found.group(1))).decode("utf-8")
    return 1 + unpacked_layers(inner)


@pytest.mark.parametrize("name", ["CLEAN_PROBE", *PROGRAMS])
def test_a_node_program_is_compressed_at_most_once_wherever_it_travels(name: str) -> None:
    """Compressing the compressed inline code again gains nothing and unpacks twice at every
    start: the testing probe did once (CLEAN_PROBE, the supervisor's ``clean`` mode)."""
    code = CLEAN_PROBE if name == "CLEAN_PROBE" else remote.inline(name)
    assert unpacked_layers(code) <= 1, f"{name}: compressed {unpacked_layers(code)} times"


def test_the_clean_probe_runs_and_answers_its_frame(tmp_path: Path) -> None:
    """Unpacked once, it is the supervisor's ``clean`` mode (a job id no one runs here)."""
    (tmp_path / "envs").mkdir()
    (tmp_path / "envs" / ".tmp-x").write_text("")
    job = f"no-such-job-{os.getpid()}"
    res = subprocess.run(
        [
            sys.executable,
            "-S",
            "-c",
            CLEAN_PROBE,
            "clean",
            "--workdir",
            str(tmp_path),
            "--job-id",
            job,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    temps = [str(tmp_path / "envs" / ".tmp-x")]
    assert last_data(res.stdout) == {"processes": [], "temp_files": temps, "workdir": str(tmp_path)}
