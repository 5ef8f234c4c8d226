"""Many nodes at once: the fan-out engine and ad-hoc commands (one node's link: transport/)."""
