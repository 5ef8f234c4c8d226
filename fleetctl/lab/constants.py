"""Where labs live, what their hosts get, and the lab's limits and timeouts."""

from __future__ import annotations

import re
from pathlib import Path

DEFAULT_PARENT = Path("/var/tmp/fleetctl-lab")
REGISTRY = Path("/run/fleetctl-lab")
#: the machine's neighbour-table limits before a large lab raised them (fleetctl.lab.net)
NEIGH_SAVED = "neighbour-limits.saved"
WORKDIR = "/root/.fleetctl"  # root's default fleetctl workdir, made private per host
USER_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,30}$")  # `lab up --user NAME`: a plain login name
SSHD_PATH_ENV = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
ROOT_BASHRC = "/root/.bashrc"
#: Hosts get this instead of the machine's ~/.bashrc (bash sources it for every SSH command;
#: a `pyenv init`/`conda init` there costs ~0.5 s per command). PATH comes from sshd's SetEnv.
MINIMAL_BASHRC = (
    "# fleetctl lab host: minimal ~/.bashrc (the machine's own is hidden on lab hosts so SSH\n"
    "# commands stay fast; `fleetctl lab up --machine-bashrc` keeps it).\n"
)
MAX_HOSTS = 200
READY_TIMEOUT = 15.0
STOP_TIMEOUT = 10.0
LINK_TIMEOUT = 10.0  # cut/heal: how long the kernel may take to apply a carrier change
SSH_PORT = 22
NAME_RE = re.compile(r"^[a-z][a-z0-9]{0,7}$")
STATE_VERSION = 1
_HERE = Path(__file__).resolve().parent
