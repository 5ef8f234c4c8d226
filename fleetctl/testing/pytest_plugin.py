"""pytest fixtures for the namespace lab.

Enable with ``pytest_plugins = ["fleetctl.testing.pytest_plugin"]`` (tests/conftest.py does).

Fixtures:

* ``lab3`` - the shared 3-host lab (2 networks, 2 fake GPUs per host), session-scoped underneath
  (``lab3_session``); after each test every recorded fault is undone, so tests may inject faults.
* ``make_lab(n, **kw)`` - a factory for private labs (same keywords as ``Lab.up``), torn down at
  the end of the test; ``make_lab_module`` - the same, torn down at the end of the module.
* ``lab_required`` - skips (or, with ``FLEETCTL_REQUIRE_LAB=1``, fails) when the machine cannot
  run a lab: not root, or no ``ip netns``/``unshare``/``nsenter``/``sshd``.

Every test that needs something a machine may lack skips through ``skip_or_fail`` /
``import_or_skip``, which fail instead under ``FLEETCTL_REQUIRE_LAB=1`` (CI).

Always on (autouse): ``SSH_AUTH_SOCK`` is removed and ``FLEETCTL_SSH_CONFIG=/dev/null`` is set, so
no test ever depends on (or leaks into) the developer's agent and ``~/.ssh/config``.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import shutil
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

import pytest

from fleetctl.errors import LabError
from fleetctl.lab.constants import REGISTRY
from fleetctl.lab.core import Lab
from fleetctl.lab.registry import _entry_live, _registry_entries

PYTEST_OWNER = "pytest"


def lab_unavailable_reason() -> str | None:
    """Why this machine cannot run a lab, or None when it can."""
    if os.geteuid() != 0:
        return "the namespace lab needs root"
    for tool in ("ip", "unshare", "nsenter", "tc", "ssh"):
        if shutil.which(tool) is None:
            return f"the namespace lab needs `{tool}`"
    if shutil.which("sshd", path="/usr/sbin:/usr/local/sbin:/sbin:/usr/bin") is None:
        return "the namespace lab needs sshd (openssh-server)"
    if not os.path.exists("/proc/self/ns/net"):
        return "no network namespaces in this kernel"
    return None


def skip_or_fail(reason: str, *, allow_module_level: bool = False) -> NoReturn:
    """Skip the calling test for a missing prerequisite (root, a tool, a package) on a
    developer's machine; under ``FLEETCTL_REQUIRE_LAB=1`` (CI) fail instead, so nothing CI is
    meant to test can go quietly untested. The one exception is a plain ``pytest.skip``."""
    if os.environ.get("FLEETCTL_REQUIRE_LAB") == "1":
        pytest.fail(f"FLEETCTL_REQUIRE_LAB=1 but {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=allow_module_level)


def import_or_skip(module: str, reason: str) -> Any:
    """``pytest.importorskip`` that honours ``FLEETCTL_REQUIRE_LAB`` (``skip_or_fail``)."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        skip_or_fail(f"{reason} ({e})")


def require_lab() -> None:
    """Skip the calling test when no lab is possible; fail instead under FLEETCTL_REQUIRE_LAB=1."""
    why = lab_unavailable_reason()
    if why is not None:
        skip_or_fail(why)


def _reap_leaked_test_labs() -> None:
    """Tear down labs a killed pytest left behind (owner pytest, creator process gone)."""
    for e in _registry_entries():
        if e.get("owner") != PYTEST_OWNER:
            continue
        from fleetctl.lab import procs

        if procs.same_process(e.get("creator_pid"), e.get("creator_start")):
            continue  # another pytest run is still using it
        try:
            Lab.load(e["dir"]).down()
        except LabError:
            if not _entry_live(e):
                with contextlib.suppress(OSError):
                    (REGISTRY / f"{e['name']}.json").unlink()


@pytest.fixture(autouse=True)
def _fleetctl_no_user_ssh(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests never use the developer's SSH agent or ~/.ssh/config (fleetctl honours this var)."""
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    monkeypatch.setenv("FLEETCTL_SSH_CONFIG", "/dev/null")


def lab_login() -> dict[str, Any]:
    """How the test labs log in: ``FLEETCTL_LAB_USER=NAME`` makes them non-root (every lab
    and e2e test meaningful as a plain user, as on real fleets), ``FLEETCTL_LAB_SHARED_HOME=1``
    gives that user one home shared by all hosts. Unset: root."""
    user = os.environ.get("FLEETCTL_LAB_USER") or None
    shared = os.environ.get("FLEETCTL_LAB_SHARED_HOME") == "1"
    return {"user": user, "shared_home": shared} if user else {}


@pytest.fixture
def lab_required() -> None:
    require_lab()


class _Factory:
    """Creates labs and always tears all of them down (``close``), newest first."""

    def __init__(self) -> None:
        self.labs: list[Lab] = []

    def __call__(self, n: int, **kw: Any) -> Lab:
        require_lab()
        kw.setdefault("owner", PYTEST_OWNER)
        for k, v in lab_login().items():
            kw.setdefault(k, v)
        lab = Lab.up(n, **kw)
        self.labs.append(lab)
        return lab

    def close(self) -> None:
        errors = []
        while self.labs:
            lab = self.labs.pop()
            try:
                lab.down()
            except LabError as e:
                errors.append(str(e))
        if errors:
            raise LabError("; ".join(errors))


@pytest.fixture(scope="session")
def _lab_session_janitor() -> None:
    if lab_unavailable_reason() is None:
        _reap_leaked_test_labs()


@pytest.fixture
def make_lab(_lab_session_janitor: None) -> Iterator[Callable[..., Lab]]:
    """``make_lab(n, networks=1, gpus=0, name=None, subnet=None, …) -> Lab``; down at test end."""
    factory = _Factory()
    try:
        yield factory
    finally:
        factory.close()


@pytest.fixture(scope="module")
def make_lab_module(_lab_session_janitor: None) -> Iterator[Callable[..., Lab]]:
    """Like ``make_lab`` but the labs live until the end of the module."""
    factory = _Factory()
    try:
        yield factory
    finally:
        factory.close()


@pytest.fixture(scope="session")
def lab3_session(_lab_session_janitor: None) -> Iterator[Lab]:
    """One 3-host lab (2 networks, 2 fake GPUs each) for the whole session."""
    require_lab()
    lab = Lab.up(3, networks=2, gpus=2, owner=PYTEST_OWNER, **lab_login())
    try:
        yield lab
    finally:
        lab.down()


@pytest.fixture
def lab3(lab3_session: Lab) -> Iterator[Lab]:
    """The shared 3-host lab; faults a test injects are undone after it."""
    try:
        yield lab3_session
    finally:
        lab3_session.reset_faults()
        for h in lab3_session.hosts:  # and the GPU counts a test may have changed
            if h.gpus != 2 or not h.fake_smi:
                lab3_session.set_gpus(h.name, 2)
