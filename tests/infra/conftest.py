"""testinfra checks of real nodes: ``pytest tests/infra --hosts=ssh://user@gpu01,…``.

They only run against hosts you name (``--hosts``, or ``--ansible-inventory`` with
``--hosts='ansible://all'``); a plain ``pytest`` run of the whole suite skips them. Options
(also settable per fleet in a pytest.ini ``addopts``):

  --workdir PATH       fleetctl workdir on the nodes (default ~/.fleetctl)
  --job-id ID          clean checks: only this job's processes and run folder (default: any job)
  --sshd-config PATH   config ``sshd -T -f`` reads (default /etc/ssh/sshd_config)
  --sshd PATH          sshd binary (default /usr/sbin/sshd)
  --node-python CMD    python on the nodes (default python3)
"""

from __future__ import annotations

import pytest

from fleetctl.node import DEFAULT_WORKDIR


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("fleetctl-infra", "fleetctl node checks (tests/infra)")
    group.addoption("--workdir", default=DEFAULT_WORKDIR, help="fleetctl workdir on the nodes")
    group.addoption("--job-id", default=None, help="check only this fleetctl job")
    group.addoption("--sshd-config", default="/etc/ssh/sshd_config", help="for `sshd -T -f`")
    group.addoption("--sshd", default="/usr/sbin/sshd", help="sshd binary on the nodes")
    group.addoption("--node-python", default="python3", help="python on the nodes")


def _opt(config: pytest.Config, name: str, default: str | None) -> str | None:
    # Options exist only when this folder is on the command line (pytest reads a conftest's
    # options only from the folders it was given); fall back to the defaults otherwise.
    return config.getoption(name, default=default)


@pytest.fixture(autouse=True)
def _only_named_hosts_with_verified_keys(request: pytest.FixtureRequest) -> None:
    if not request.config.getoption("hosts", default=None):
        pytest.skip("tests/infra check real nodes: name them with --hosts=ssh://user@host,…")
    host = request.getfixturevalue("host")
    if host.backend.NAME == "paramiko":
        # testinfra's paramiko backend (a host given without scheme) accepts any host key
        pytest.fail(
            f"{host.backend.hostname}: use --hosts=ssh://… (OpenSSH checks known_hosts); "
            "testinfra's paramiko backend does not verify host keys",
            pytrace=False,
        )


@pytest.fixture
def workdir(request: pytest.FixtureRequest) -> str:
    return str(_opt(request.config, "--workdir", DEFAULT_WORKDIR))


@pytest.fixture
def job_id(request: pytest.FixtureRequest) -> str | None:
    return _opt(request.config, "--job-id", None)


@pytest.fixture
def sshd_config(request: pytest.FixtureRequest) -> str:
    return str(_opt(request.config, "--sshd-config", "/etc/ssh/sshd_config"))


@pytest.fixture
def sshd_binary(request: pytest.FixtureRequest) -> str:
    return str(_opt(request.config, "--sshd", "/usr/sbin/sshd"))


@pytest.fixture
def node_python(request: pytest.FixtureRequest) -> str:
    return str(_opt(request.config, "--node-python", "python3"))
