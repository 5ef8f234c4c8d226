"""``remote/programs/image_probe.py`` as an image's python runs it in the ``--image`` check (issue
25), here by Python 3.8 from memory (``remote.inline``, as shipped): the launcher's module imported
for real (its error in the host check's words), torch's version from the package's metadata,
NCCL found where torch finds it; exit 3 for a failing answer (the node never keeps it). And
the program in a container of the lab's test image (Debian's python3, no torch, no NCCL)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from fleetctl import remote
from fleetctl.plan.runtimes import runtime
from fleetctl.testing.pytest_plugin import skip_or_fail


def _probe(py: str, args: dict, env: dict | None = None) -> tuple[int, dict, str]:
    out = subprocess.run(
        [py, "-c", remote.inline("image_probe.py"), json.dumps(args)],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=60,
        cwd="/",
    )
    frames = [ln for ln in out.stdout.splitlines() if ln.startswith("D ")]
    assert out.stdout.splitlines() == frames[-1:], out.stdout  # one frame, nothing else
    return out.returncode, json.loads(frames[-1][2:]), out.stderr


def _site(tmp_path: Path) -> Path:
    """A python package folder: a fake torch 2.13.0 (its launcher module prints on import,
    which must not reach stdout) and pip's NCCL."""
    site = tmp_path / "site"
    run = site / "torch" / "distributed"
    run.mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text("__version__ = '2.13.0'\n")
    (run / "__init__.py").write_text("")
    (run / "run.py").write_text("print('chatty import')\n")
    lib = site / "nvidia" / "nccl" / "lib"
    lib.mkdir(parents=True)
    (lib / "libnccl.so.2").write_bytes(b"")
    return site


def test_the_image_probe_imports_the_launcher_and_finds_nccl(py38: str, tmp_path: Path) -> None:
    site = _site(tmp_path)
    args = {"module": "torch.distributed.run", "nccl": True}
    code, data, err = _probe(py38, args, {"PYTHONPATH": str(site)})
    assert code == 0, err
    assert data["module"] == "torch.distributed.run" and data["python"].startswith("3.8.")
    assert (data["version"], data["torch"]) == ("2.13.0", "2.13.0")
    assert data["nccl"] == str(site / "nvidia" / "nccl" / "lib" / "libnccl.so.2")
    assert "error" not in data and "chatty import" in err


def test_the_image_probe_says_what_does_not_import_and_exits_3(py38: str) -> None:
    code, data, _ = _probe(py38, {"module": "no_such_pkg_25.run", "nccl": False})
    assert code == 3
    assert data["error"] == "ModuleNotFoundError: No module named 'no_such_pkg_25'"
    assert "nccl" not in data


def test_the_image_probe_of_a_plain_job_reads_torchs_version(py38: str, tmp_path: Path) -> None:
    """No module to import (plain): torch's version from its installed metadata, not imported."""
    dist = tmp_path / "site" / "torch-2.11.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.11.0\n")
    code, data, err = _probe(py38, {"module": None}, {"PYTHONPATH": str(tmp_path / "site")})
    assert code == 0, err
    assert (data["module"], data["torch"]) == (None, "2.11.0")
    assert "version" not in data and "nccl" not in data


# Debian's python3-minimal has no ctypes: an image with only it must pass a CPU job's check
NO_CTYPES = "import sys\nsys.modules['ctypes'] = None\nsys.modules['ctypes.util'] = None\n"


def test_the_image_probe_runs_on_a_python_without_ctypes(py38: str, tmp_path: Path) -> None:
    """A CPU job asks nothing that needs ctypes; a GPU job's NCCL is still found by path."""
    src = NO_CTYPES + remote.inline("image_probe.py")
    for args, env in (
        ({"module": "json.decoder", "nccl": False}, {}),
        ({"module": None, "nccl": True}, {"PYTHONPATH": str(_site(tmp_path))}),
    ):
        out = subprocess.run(
            [py38, "-c", src, json.dumps(args)],
            capture_output=True,
            text=True,
            env={**os.environ, **env},
            timeout=60,
            cwd="/",
        )
        assert out.returncode == 0, out.stderr
        data = json.loads(out.stdout.splitlines()[-1][2:])
        assert "error" not in data, data
        if args["nccl"]:
            assert data["nccl"].endswith("nvidia/nccl/lib/libnccl.so.2"), data


def test_the_image_probe_in_the_test_image_finds_no_torch_nor_nccl() -> None:
    """In a container of the lab's test image (Debian's python3): torchrun's module does not
    import and there is no NCCL: one failing answer, exit 3."""
    image = "fleetctl-test:py3"
    if shutil.which("podman") is None:
        skip_or_fail("podman is not installed (apt-get install podman runc)")
    if subprocess.run(["podman", "image", "exists", image], timeout=60).returncode != 0:
        skip_or_fail(f"{image} is not imported (tests/lab/test_containers.py builds it)")
    args = json.dumps({"module": "torch.distributed.run", "nccl": True})
    argv = runtime("podman").exec_argv(
        image, ["python3", "-c", remote.inline("image_probe.py"), args]
    )
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert out.returncode == 3, out.stderr
    data = json.loads(out.stdout.splitlines()[-1][2:])
    assert data["error"] == "ModuleNotFoundError: No module named 'torch'"
    assert (data["torch"], data["nccl"]) == ("", "-")
