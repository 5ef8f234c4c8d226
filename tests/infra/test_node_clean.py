"""After any job (or ``--job-id ID``), nothing of fleetctl is left on the node.

    pytest tests/infra/test_node_clean.py --hosts=ssh://root@gpu01 [--job-id 20250101-…]

Run it as root (or as the user jobs run as) so every job process is visible in /proc.
"""

from __future__ import annotations

import pytest

from fleetctl.testing.infra import Leftovers, node_leftovers


@pytest.fixture
def leftovers(host, job_id: str | None, workdir: str, node_python: str) -> Leftovers:
    return node_leftovers(host, job_id, workdir=workdir, python=node_python)


def test_no_process_of_a_fleetctl_job_is_left(leftovers: Leftovers) -> None:
    assert not leftovers.processes, leftovers.describe()


def test_no_temp_files_are_left_in_the_workdir(leftovers: Leftovers) -> None:
    assert not leftovers.temp_files, leftovers.describe()
