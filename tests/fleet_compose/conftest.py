"""The fleet the container-fleet tier runs against, chosen by ``FLEETCTL_TEST_FLEET``:

* ``containers`` (default): 3 podman sshd containers on one internal network, started for the
  session (``fleetctl.lab.container_fleet``) and removed by label at its end;
* ``netns``: the namespace lab (root), the same tests on the usual hosts;
* a path to an inventory: a fleet already running, e.g. the one ``docker compose`` started from
  fleetctl/data/compose.yaml (docs/lab.md, "A container fleet").

The tests use nothing but the inventory (SSH, host keys verified), so all three are the same to
them; the container-only checks skip on the others.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from fleetctl.testing.pytest_plugin import PYTEST_OWNER, lab_login, require_lab, skip_or_fail


@dataclass
class FleetUnderTest:
    kind: str  # "containers" | "netns" | "inventory"
    inventory_path: Path
    handle: Any = None  # ContainerFleet or Lab


def fleet_kind() -> str:
    return os.environ.get("FLEETCTL_TEST_FLEET") or "containers"


def require_podman() -> None:
    if os.geteuid() != 0:
        skip_or_fail("the podman container fleet needs root (rootful podman)")
    for tool in ("podman", "runc", "mmdebstrap", "ip", "ssh-keygen"):
        if shutil.which(tool) is None:
            skip_or_fail(f"{tool} is not installed (apt-get install podman runc mmdebstrap)")


@pytest.fixture(scope="session")
def fleet3() -> Iterator[FleetUnderTest]:
    kind = fleet_kind()
    if kind == "containers":
        require_podman()
        from fleetctl.lab.container_fleet import ContainerFleet, reap_orphans

        reap_orphans(PYTEST_OWNER)
        fleet = ContainerFleet.up(3, owner=PYTEST_OWNER)
        try:
            yield FleetUnderTest("containers", fleet.inventory_path, fleet)
        finally:
            fleet.down()
    elif kind == "netns":
        require_lab()
        from fleetctl.lab import Lab

        lab = Lab.up(3, owner=PYTEST_OWNER, **lab_login())
        try:
            yield FleetUnderTest("netns", lab.inventory_path, lab)
        finally:
            lab.down()
    else:
        inv = Path(kind)
        if not inv.is_file():
            pytest.fail(f"FLEETCTL_TEST_FLEET={kind}: no such inventory", pytrace=False)
        yield FleetUnderTest("inventory", inv)
