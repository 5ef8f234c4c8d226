"""What to do about a failed rank's well-known error (fleetctl.job.diagnose.hints): a golden table
of real errors (the first captured from pytorch/examples' ddp-tutorial-series/multinode.py run on
CPU lab hosts), errors that must get no hint, and one real local run of a CUDA-only script."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetctl.job.diagnose.hints import hint_for

CUDA_ONLY = [  # pytorch/examples multinode.py under torchrun on a CPU-only torch 2.13
    "Traceback (most recent call last):",
    '  File "/root/.fleetctl/work/j/multinode.py", line 14, in ddp_setup',
    '    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))',
    "AttributeError: module 'torch._C' has no attribute '_cuda_setDevice'",
]

CASES = [
    ("cuda-only script, CPU torch", CUDA_ONLY, "the script uses CUDA"),
    (
        "cuda asked, torch without it",
        ["AssertionError: Torch not compiled with CUDA enabled"],
        "the script uses CUDA",
    ),
    (
        "nccl on a CPU node",
        ["RuntimeError: ProcessGroupNCCL is only supported with GPUs, no GPUs found!"],
        "backend='gloo'",
    ),
    (
        "a module the node lacks",
        ["ModuleNotFoundError: No module named 'transformers'"],
        "cannot import transformers",
    ),
    (
        "a port taken",
        [
            "torch.distributed.DistNetworkError: The server socket has failed to listen on any "
            "local network address. port: 29500, useIpv6: false, code: -98, name: EADDRINUSE, "
            "message: address already in use"
        ],
        "a port the job binds was taken",
    ),
    ("a full disk", ["OSError: [Errno 28] No space left on device"], "disk is full"),
    (
        "GPU memory",
        ["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"],
        "ran out of memory",
    ),
    ("the script's own error", ["RuntimeError: <loss is nan> on node rank 1"], None),
    ("a plain exit", ["epoch 3 done", "exiting with 5"], None),
    ("nothing", [], None),
]


@pytest.mark.parametrize(("lines", "words"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_hint(lines: list[str], words: str | None) -> None:
    got = hint_for(lines)
    if words is None:
        assert got is None
    else:
        assert got is not None and words in got and "\n" not in got


def test_the_error_that_ended_the_rank_gives_the_hint() -> None:
    """A rank that survived a missing optional module, then ran out of disk: the disk."""
    lines = ["ModuleNotFoundError: No module named 'apex'", "OSError: [Errno 28] No space"]
    assert "disk is full" in (hint_for(lines) or "")


def test_a_cuda_only_script_run_on_a_cpu_torch_says_what_to_do(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from fleetctl.api import Fleet

    code = tmp_path / "code"
    code.mkdir()
    (code / "cuda_only.py").write_text("import torch\ntorch.cuda.set_device(0)\n")
    fleet = Fleet.local(runs_dir=tmp_path / "runs")
    r = fleet.run(str(code / "cuda_only.py"), launcher="plain", code=code).wait(timeout=120)
    assert r.exit_code == 3
    [failed] = r.failed_ranks
    assert failed["hint"].startswith("the script uses CUDA"), failed
    html = (r.run_folder / "report.html").read_text()  # the report's culprit says it too
    assert "<th>hint</th><td>the script uses CUDA" in html
