"""Small file trees for tests (what a code folder holds, written in one call)."""

from __future__ import annotations

from pathlib import Path


def tree(root: Path, files: dict[str, str]) -> Path:
    """Write ``files`` (relative path -> text) under ``root``; returns ``root``."""
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return root
