"""Shared test wiring. The lab fixtures (``lab3``, ``make_lab``, …) and the autouse fixture that
hides the developer's SSH agent and ~/.ssh/config come from the plugin below."""

from __future__ import annotations

import os

import pytest

from fleetctl.testing.envbuild import EnvCache

pytest_plugins = ["fleetctl.testing.pytest_plugin"]


@pytest.fixture(autouse=True)
def _private_caches(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch):
    """Each test gets its own check cache and controller push cache, so a passing check or a
    hashed snapshot cached by one test can never hide a fault that a later test injects."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache")))
    monkeypatch.setenv("FLEETCTL_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    # the health ledger and each host's last-check figures: one test's sick host is not the next's
    monkeypatch.setenv("FLEETCTL_STATE_DIR", str(tmp_path_factory.mktemp("state")))


@pytest.fixture(scope="session")
def envs(tmp_path_factory: pytest.TempPathFactory) -> EnvCache:
    """Conda-pack test environments, built once per session (fleetctl.testing.envbuild)."""
    return EnvCache(tmp_path_factory.getbasetemp() / "push-envs")


def pytest_ignore_collect(collection_path, config: pytest.Config) -> bool | None:
    """tests/infra checks real fleets named with ``--hosts``; the lab tests run them against lab
    hosts through a nested pytest. A plain suite run leaves them out instead of skipping them;
    so it does tests/vms (minutes of VMs) unless ``FLEETCTL_VMS=1``."""
    if collection_path.name == "infra" and collection_path.parent.name == "tests":
        return not config.getoption("hosts", default=None) or None
    if collection_path.name == "vms" and collection_path.parent.name == "tests":
        return os.environ.get("FLEETCTL_VMS") != "1" or None  # the VM tier: docs/lab.md
    return None


def pytest_configure(config: pytest.Config) -> None:
    """Tests press Ctrl-C (SIGINT to a fleetctl run, or to this process during collection).
    A suite started in the background by a non-interactive shell inherits SIGINT ignored, and
    so would every fleetctl it starts: a real handler here lets them receive it (a child
    inherits "ignored", never a handler)."""
    import signal

    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
