"""A stand-in ``journalctl`` and ``dmesg`` for lab hosts: print this host's fake kernel log.

Lab hosts share this machine's kernel, so its real log is no host's own. Installed (as both
names, first on the host's SSH ``PATH``) beside the fake ``nvidia-smi``; it prints
``kernel.log`` next to itself, lines as dmesg writes them (``[ 1234.567890] NVRM: Xid …``),
which ``fleetctl lab fault gpu-xid`` appends to. As ``journalctl`` it adds the host and
``kernel:`` as ``-o short-monotonic`` does. Stdlib only.
"""

from __future__ import annotations

import os
import socket
import sys

HERE = os.path.dirname(os.path.realpath(__file__))


def main(argv: list[str]) -> int:
    try:
        with open(os.path.join(HERE, "kernel.log")) as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        lines = []
    journal = os.path.basename(argv[0]) == "journalctl"
    host = socket.gethostname()
    for line in lines:
        if journal and line.startswith("[") and "]" in line:
            stamp, _, rest = line.partition("] ")
            line = f"{stamp}] {host} kernel: {rest}"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
