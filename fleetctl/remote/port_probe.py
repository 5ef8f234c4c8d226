"""Which of a host's candidate ports are free now (role jobs reserve ports before launch).

``python -c SOURCE '{"candidates": [...], "need": N}'``: binds each candidate (TCP, all
interfaces, no SO_REUSEADDR: a port in TIME_WAIT or LISTEN fails) and answers the first N that
bind as one frame, ``D {"free": [...]}``. Stdlib only; a separate program because it runs
before the supervisor is on the node.
"""

from __future__ import annotations

import json
import socket
import sys


def free_ports(candidates: list[int], need: int) -> list[int]:
    free: list[int] = []
    for port in candidates:
        if len(free) >= need:
            break
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.bind(("0.0.0.0", port))
            free.append(port)
        except OSError:
            pass
        finally:
            s.close()
    return free


def main() -> None:
    args = json.loads(sys.argv[1])
    free = free_ports([int(p) for p in args["candidates"]], int(args["need"]))
    sys.stdout.write("D " + json.dumps({"free": free}) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
