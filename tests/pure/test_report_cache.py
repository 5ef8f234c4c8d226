"""The report's templates are compiled once and kept in the controller's cache folder: a
second report loads them (the same HTML), a template's new source compiles afresh, and a cache
folder that cannot be written or holds a damaged entry never costs the report."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fleetctl.report import build_report, write_report
from tests.pure.test_report_model import make_run


def _entries(cache: Path) -> list[Path]:
    return sorted((cache / "jinja2").glob("*.cache"))


def test_templates_compiled_once_are_loaded_from_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEETCTL_CACHE_DIR", str(tmp_path / "cache"))
    folder = make_run(tmp_path / "runs", hosts=["n1", "n2"])
    first = build_report(folder)
    entries = _entries(tmp_path / "cache")
    assert len(entries) == 3  # report.html.j2, svg.html.j2 and its import
    assert oct((tmp_path / "cache" / "jinja2").stat().st_mode & 0o777) == "0o700"
    stamps = [p.stat().st_mtime_ns for p in entries]

    import jinja2

    compiled: list[str] = []
    real = jinja2.Environment.compile

    def spy(self: jinja2.Environment, source: str, *a: object, **k: object) -> object:
        compiled.append(source[:20])
        return real(self, source, *a, **k)

    monkeypatch.setattr(jinja2.Environment, "compile", spy)
    assert build_report(folder) == first
    assert compiled == [] and [p.stat().st_mtime_ns for p in entries] == stamps


def test_a_damaged_or_unwritable_cache_still_writes_the_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("FLEETCTL_CACHE_DIR", str(cache))
    folder = make_run(tmp_path / "runs", hosts=["n1", "n2"])
    good = build_report(folder)
    for p in _entries(cache):
        p.write_bytes(p.read_bytes()[:40])  # the header, then a cut marshal
    assert build_report(folder) == good
    if os.geteuid() != 0:  # root writes anywhere: the blocked folder below is the test there
        (cache / "jinja2").chmod(0o500)
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    monkeypatch.setenv("FLEETCTL_CACHE_DIR", str(blocked))
    assert write_report(folder).read_text() == good


def test_a_cache_folder_others_may_write_is_not_loaded_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Compiled templates are code: a folder another user could write (or a link to one) is
    never read, and the report is compiled as without a cache."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("FLEETCTL_CACHE_DIR", str(cache))
    folder = make_run(tmp_path / "runs", hosts=["n1", "n2"])
    good = build_report(folder)
    for p in _entries(cache):
        p.write_bytes(b"planted")  # what another user would put there
    (cache / "jinja2").chmod(0o777)
    import jinja2

    loaded: list[str] = []
    real = jinja2.FileSystemBytecodeCache.load_bytecode

    def spy(self: jinja2.FileSystemBytecodeCache, bucket: object) -> None:
        loaded.append("read")
        real(self, bucket)  # type: ignore[arg-type]

    monkeypatch.setattr(jinja2.FileSystemBytecodeCache, "load_bytecode", spy)
    assert build_report(folder) == good and loaded == []
    (cache / "jinja2").chmod(0o700)
    assert build_report(folder) == good and loaded  # its own folder again: read
