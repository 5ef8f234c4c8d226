"""fleetctl check bootstrap: say the node's python is too old, else run the probe.

``python -c BOOTSTRAP <install folder> <base64 bundle> <json args>``: this text, then the
installer's ARGV entrance (``fleetctl.remote.ARGV_HEAD`` + ``INSTALLER``), which runs the probe
from ``W/bin/probe_<sha12>/`` (bytecode cached), installing it there first when missing. A
python older than 3.7 (which cannot run the probe) answers one frame, ``V "<version>"``, and
exits 9. Kept parseable by any python, 2.7 included, as is what follows it.
"""

import sys

if sys.version_info < (3, 7):  # noqa: UP036 - this file is what tells old pythons apart
    sys.stdout.write('V "' + sys.version.split()[0] + '"\n')
    sys.exit(9)
