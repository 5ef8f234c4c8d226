"""The wire format: names and markers both ends use (node programs and the controller).

The one module of ``fleetctl/remote/`` the controller imports for the protocol; it imports
nothing, so importing it costs nothing. Node module: stdlib only, Python >= 3.8.
"""

from __future__ import annotations

PROTOCOL = 1  # the supervisor's ``R <protocol>``
STATE_FILE = "supervisor.json"
PROGRESS_FILE = "progress"  # FLEET_PROGRESS_FILE: touched by the job when it moves on
CONSOLE_LOG = "console.log"
STOP_REQUEST = "stop-request.json"  # written by `fleetctl stop` (any terminal) before it stops
RANK_PIDS = "rank_pids.json"  # local rank -> pids of its processes, for ranks.json
RANK_EXITS = "rank_exits.json"  # how rank processes ended, in order: who failed first
RANKS_ENDED = "ranks_ended.json"  # every rank ended (the ``A`` frame's payload), for ``status``
HEARTBEAT_FILE = "controller-heartbeat"
TAR_MARKER = b'T {"stream": "tar"}\n'  # the frame before a tar stream (fleetctl.phases.collect)
COLLECT_MANIFEST = ".fleetctl-collect.json"  # the tar's first member: what is (not) sent, why
EXEC_TIMEOUT_MARK = "fleetctl: exec timed out after"  # exec_timeout's stderr line at the limit
