"""The choices the commands offer, as the library names them: launchers, backends, defaults.
Cheap to import (the launcher table and the rank plan's constants), for option parsers."""

from __future__ import annotations

from fleetctl.plan.launchers import DEFAULT_LAUNCHER, LAUNCHER_NAMES
from fleetctl.plan.rankplan import BACKENDS, DEFAULT_MASTER_PORT, ENV_KEY_RE

LAUNCHERS = LAUNCHER_NAMES  # torchrun, paddle, deepspeed, plain, accelerate, …

__all__ = ["BACKENDS", "DEFAULT_LAUNCHER", "DEFAULT_MASTER_PORT", "ENV_KEY_RE", "LAUNCHERS"]
