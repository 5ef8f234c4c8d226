"""paddle's environment dumps lose the values the user handed fleetctl (all three formats)."""

from __future__ import annotations

import json

from fleetctl.job.records.redact import REDACTED, redact_text

KEYS = ("WANDB_API_KEY", "DB_PASS")


def test_key_value_lines_of_envlog() -> None:
    text = "A=1\nWANDB_API_KEY=abc123\nWANDB_API_KEY_OLD=keep\nDB_PASS=p=w\n"
    assert redact_text(text, KEYS) == (
        f"A=1\nWANDB_API_KEY={REDACTED}\nWANDB_API_KEY_OLD=keep\nDB_PASS={REDACTED}\n"
    )


def test_json_of_backup_env() -> None:
    text = json.dumps({"A": "1", "WANDB_API_KEY": "abc123", "DB_PASS": "x"}, indent=4)
    assert json.loads(redact_text(text, KEYS)) == {
        "A": "1",
        "WANDB_API_KEY": REDACTED,
        "DB_PASS": REDACTED,
    }


def test_python_repr_of_the_launcher_log_with_either_quote() -> None:
    text = "environ({'A': '1', 'WANDB_API_KEY': 'abc123', 'DB_PASS': \"it's\"})\nother line\n"
    out = redact_text(text, KEYS)
    assert "abc123" not in out and "it's" not in out
    assert f"'WANDB_API_KEY': '{REDACTED}'" in out and "'A': '1'" in out
    assert out.endswith("other line\n")


def test_nothing_to_redact_leaves_the_text_alone() -> None:
    text = "A=1\n"
    assert redact_text(text, ()) == text and redact_text(text, KEYS) == text
