"""Launcher environment dumps, redacted of the variables the user gave fleetctl.

paddle 3.3.1 writes the whole environment of its launcher and workers into the node run folder
(``log/<job>.<pod>.log`` as ``environ({...})``, ``log/envlog.N`` as ``KEY=VALUE`` lines,
``log/backup_env.N.json``), so ``--env-var WANDB_API_KEY=…`` and ``fleetctl_env`` values would
land in every collected run folder. After collection their values are replaced by
``REDACTED`` (the node's own copy stays in its private run folder). Which files are dumps is
the launcher's to say (``Launcher.env_dumps``). Pure text functions.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable

REDACTED = "<redacted by fleetctl>"


def redact_text(text: str, keys: Iterable[str]) -> str:
    """``text`` (one of paddle's dump formats) with the values of ``keys`` replaced."""
    keys = [k for k in keys if k]
    if not keys:
        return text
    stripped = text.lstrip()
    if stripped.startswith("{"):
        try:
            data = json.loads(text)
        except ValueError:
            data = None
        if isinstance(data, dict):
            for k in keys:
                if k in data:
                    data[k] = REDACTED
            return json.dumps(data, indent=4)
    for k in keys:
        key = re.escape(k)
        # KEY=VALUE lines (envlog.N)
        text = re.sub(rf"(?m)^({key}=).*$", lambda m: m.group(1) + REDACTED, text)
        # 'KEY': 'value' / "value" inside a Python repr (environ({...}))
        text = re.sub(
            rf"""(['"]{key}['"]:\s*)('(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")""",
            lambda m: m.group(1) + repr(REDACTED),
            text,
        )
    return text
