"""fleetctl check bootstrap: run the probe, or say the node's python is too old.

``python -c BOOTSTRAP <install path> <base64 zlib of probe.py> <json args>``: the probe runs from
its installed file (``W/bin/probe_<sha12>.py``, bytecode cached) or, when missing, is unpacked
and installed there first by the installer (``fleetctl.remote.INSTALLER``), whose text follows
this one. A python older than 3.7 (which cannot run the probe) answers one frame,
``V "<version>"``, and exits 9. Kept parseable by any python, 2.7 included.
"""

import sys

if sys.version_info < (3, 7):  # noqa: UP036 - this file is what tells old pythons apart
    sys.stdout.write('V "' + sys.version.split()[0] + '"\n')
    sys.exit(9)

PACKED = sys.argv.pop(2)
NAME = "fleetctl-probe"


def SOURCE():  # the installer calls it when the probe is not installed yet
    import base64
    import zlib

    return zlib.decompress(base64.b64decode(PACKED)).decode("utf-8")
