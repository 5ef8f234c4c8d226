"""fleetctl check bootstrap: run the packed probe, or say the node's python is too old.

``python -c BOOTSTRAP <base64 zlib of probe.py> <json args>``: one remote command ships the
probe compressed. A python older than 3.7 (which cannot run the probe) answers one frame,
``V "<version>"``, and exits 9. Kept parseable by any python, 2.7 included.
"""

import base64
import sys
import zlib

if sys.version_info < (3, 7):  # noqa: UP036 - this file is what tells old pythons apart
    sys.stdout.write('V "' + sys.version.split()[0] + '"\n')
    sys.exit(9)

probe = zlib.decompress(base64.b64decode(sys.argv[1]))
exec(compile(probe, "fleetctl-probe", "exec"), {"__name__": "__main__"})
