"""The bad-input table: every value a command or file takes is refused where it is read.

The cases are GENERATED from the real definitions, not listed by hand: every option and
argument of every ``fleetctl`` command (the click tree), every key of the role job file
(docs/roles.md's key table), every ``fleetctl_*`` host variable (docs/inventory.md's table) and
every checked ``RunSpec`` field (``RunSpec.build``). A new option, key or variable is in the
table the day it is defined. Each bad value goes through the real entry point in this process
(``run --dry-run``, or against an inventory of closed loopback ports with a 1 s connect
timeout: nothing leaves loopback) and must end in exit 2, ONE ``fleetctl: error:`` line on
stderr that names the option / file / host, no traceback, nothing left in the runs folder.

Values by type: numbers nan, inf, -1, 1e309, "", abc; text a valid sample with a newline,
carriage return, NUL or escape in it, empty, or a leading "-"; paths missing, a directory
where a file is needed, a symlink loop, "/". ``PASS_THROUGH`` names the values handed on
verbatim to the user's own program (script arguments, a shell command): they are not checked.
The ``lab`` tree creates namespaces and containers: its values are checked where click
parses them (``make_context``), never invoked. docs/security.md states the rule.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import click
import pytest

from fleetctl.errors import FleetctlError
from fleetctl.testing.cli_runner import all_commands, run_cli

DOCS = Path(__file__).resolve().parents[2] / "docs"

NUMBERS = ("nan", "inf", "-1", "1e309", "", "abc")
# a valid sample spoiled: (suffix for the case id, how)
TEXT = (
    ("empty", lambda v: ""),
    ("newline", lambda v: v + "\n"),
    ("cr", lambda v: v + "\rx"),
    ("nul", lambda v: v[:1] + "\x00" + v[1:]),
    ("esc", lambda v: v + "\x1b[2J"),
    ("dash", lambda v: "-" + v),
)
PATHS = ("missing", "dir", "loop", "root")
TREE_READERS = {"code_dir", "inventory"}  # "/" there reads the whole filesystem

# Values handed verbatim to the user's program or shell: the user's to choose, not checked.
PASS_THROUGH = {
    "run script_args": "the script's own arguments",
    "exec command": "a shell command line (newlines and dashes are shell syntax)",
    "provision ansible_args": "ansible-playbook's own arguments",
    "lab ssh command": "a shell command line on a lab host",
}
# The value is an argument where a leading "-" or an empty string is a meaning of its own.
DASH_OK = {
    "run launcher_args": "the launcher's own flags",
    "run sbatch_args": "sbatch's own flags",
}
# A valid value per text option (else "x"), so a spoiled one differs by the spoiling alone.
SAMPLE = {
    "env_vars": "A=1",
    "image": "img:1",
    "gres": "gpu:1",
    "time": "10",
    "partition": "p",
    "account": "a",
    "sbatch_args": "--comment=a",
    "collect_max": "1M",
    "tail": "all",
    "retry_on": "exit:1",
    "no_retry_on": "exit:1",
    "metrics_addr": "127.0.0.1:0",
    "before": "fabfile.py:task",
    "limit": "a",
    "group": "all",
    "on_failure": "true",
    "on_end": "true",
    "container_runtime": "podman",
}


@dataclass(frozen=True)
class Case:
    """One generated bad input: ``argv`` with ``{ws}`` for the workspace, and the words one of
    which the error line must contain (the option, argument, key or variable)."""

    id: str
    argv: tuple[str, ...]
    names: tuple[str, ...]
    parse_only: bool = False


# How each command is reached safely: the arguments around the bad one.
INVENTORY_CMDS = ("check", "exec", "push", "provision", "inventory", "health")
RUNS_CMDS = ("collect", "logs", "monitor", "report", "runs", "stacks", "status", "stop")


def _base(path: str, param: click.Parameter) -> tuple[list[str], list[str]]:
    """(before, after) the bad option, so the command would otherwise run or plan."""
    top = path.split()[0]
    inv = ["-i", "{ws}/hosts.yml", "--connect-timeout", "1"]
    if top == "run":
        pre = ["run", "--dry-run", "-i", "{ws}/hosts.yml", "--runs-dir", "{ws}/runs"]
        if param.name in _slurm_params():
            pre += ["--slurm", "--nodes", "1"]
        return pre, ["{ws}/train.py"]
    if top in ("exec",):
        return [top, *inv, "--timeout", "5"], ["--", "true"]
    if top == "provision":
        return [top, "-i", "{ws}/hosts.yml", "--timeout", "5"], ["{ws}/play.yml"]
    if top in INVENTORY_CMDS:
        return [top, "-i", "{ws}/hosts.yml"] + (
            ["--connect-timeout", "1"] if top != "inventory" and top != "health" else []
        ), []
    if top in RUNS_CMDS:
        job = [] if top == "runs" else ["nojob"]
        return [top, "--runs-dir", "{ws}/runs"], job
    return path.split(), _with_argument(path, cmd_of(path), None, [], [], "")


@functools.cache
def _tree() -> dict[str, click.Command]:
    return dict(all_commands())


def cmd_of(path: str) -> click.Command:
    return _tree()[path]


_SLURM: set[str] = set()


def _slurm_params() -> set[str]:
    if not _SLURM:
        from dataclasses import fields

        from fleetctl.api.runspec import Slurm, keyword

        _SLURM.update(f.metadata.get("param") or keyword(f) for f in fields(Slurm))
    return _SLURM


def _values(param: click.Parameter) -> Iterator[tuple[str, str]]:
    t = param.type
    if isinstance(t, click.Path):
        # missing: where it must exist; a folder: where a file is needed; a loop: always;
        # "/": where a whole tree would be read
        for p in PATHS:
            if (p == "missing" and not t.exists) or (p == "dir" and t.dir_okay):
                continue
            if p == "root" and param.name not in TREE_READERS:
                continue
            yield p, "{" + p + "}"
        return
    if isinstance(t, click.types._NumberParamTypeBase) or t.name in ("seconds", "number", "N|auto"):
        for v in NUMBERS:
            yield v or "empty", v
        return
    if isinstance(t, click.Choice):
        yield "empty", ""
        yield "newline", t.choices[0] + "\n"
        yield "dash", "-" + t.choices[0]
        return
    sample = SAMPLE.get(param.name or "", "x")
    head, _, tail = sample.partition("=") if param.name == "env_vars" else (sample, "", "")
    for how, spoil in TEXT:  # an --env-var's name is spoiled, not its value (any text)
        yield how, spoil(head) + _ + tail if how != "empty" else ""


def _cli_cases() -> list[Case]:
    cases: list[Case] = []
    seen: set[tuple] = set()
    for path, cmd in all_commands():
        for p in cmd.params:
            if isinstance(p, click.Option) and (p.is_flag or (p.hidden and p.name != "spec_file")):
                continue
            if p.name in ("help",):
                continue
            key = f"{path} {p.name}"
            if key in PASS_THROUGH:
                continue
            t = p.type
            # the same shared option on another command: equivalent, once per definition
            same = (tuple(p.opts), type(t).__name__, repr(vars(t)), path.split()[0] in RUNS_CMDS)
            pre, post = _base(path, p)
            is_arg = isinstance(p, click.Argument)
            parse_only = path.startswith("lab")
            for how, value in _values(p):
                if (is_arg and value.startswith("-")) or (how == "dash" and key in DASH_OK):
                    continue  # an argument's "-x" is an unknown option to click: refused
                if (same, how) in seen and not is_arg:
                    continue
                seen.add((same, how))
                if is_arg:
                    argv = _with_argument(path, cmd, p, pre, post, value)
                else:
                    opt = p.opts[0]
                    if opt.startswith("--"):
                        argv = [*pre, f"{opt}={value}", *post]
                    else:
                        argv = [*pre, opt, value, *post]
                names = (*p.opts, *p.secondary_opts, (p.name or "").upper(), p.human_readable_name)
                if value.startswith("{"):  # a path: the message may name the path itself
                    names += (value,)
                cases.append(Case(f"{key}-{how}", tuple(argv), names, parse_only))
    return cases


def _with_argument(
    path: str,
    cmd: click.Command,
    p: click.Argument | None,
    pre: list[str],
    post: list[str],
    value: str,
) -> list[str]:
    """The command's arguments with ``p`` bad and the others valid."""
    args: list[str] = []
    for q in cmd.params:
        if not isinstance(q, click.Argument):
            continue
        if q is p:
            args.append(value)
        elif q.nargs == -1 or (not q.required and p is None):
            continue
        elif q.name in ("job",):
            args.append("nojob")
        elif q.name == "script":
            args.append("{ws}/train.py")
        elif q.name == "playbook":
            args.append("{ws}/play.yml")
        elif isinstance(q.type, click.types._NumberParamTypeBase):
            args.append("1")
        else:
            args.append("x")
    fixed = [a for a in post if a in ("--", "true")] if path.startswith("exec") else []
    return [*pre, *args, *fixed]


CLI_CASES = _cli_cases()


# Values that mean something documented ("" is unset, as in Ansible, and so not generated):
VALID = {
    ("fleetctl_env", "mapping"): "a mapping is its shape",
    ("min_failed", "negative"): "-1: never fails the job (docs/roles.md)",
    ("min_succeeded", "negative"): "-1: no minimum",
    ("command", "*"): "a shell command line, the user's own (newlines are shell syntax)",
}


# --- the inventory's fleetctl_* host variables (docs/inventory.md's table) --------------------


def _documented_vars() -> list[str]:
    text = (DOCS / "inventory.md").read_text()
    own = text.split("### fleetctl's own", 1)[1].split("\n#", 1)[0]
    return sorted(set(re.findall(r"^\| `(fleetctl_\w+)`", own, re.M)))


HOST_VALUES = (
    ("newline", '"a\\nb"'),
    ("nul", '"a\\0b"'),
    ("esc", '"a\\e[2J"'),
    ("list", "[1, [2]]"),
    ("mapping", "{a: 1}"),
    ("negative", "-1"),
    ("nan", ".nan"),
)


def _inventory_cases() -> list[Case]:
    cases = []
    for var in _documented_vars():
        for how, value in HOST_VALUES:
            if (var, how) in VALID:
                continue
            body = f"all:\n  hosts:\n    a: {{ansible_host: 127.0.0.2, {var}: {value}}}\n"
            cases.append(Case(f"inventory {var}-{how}", ("@inv", body), (var,)))
    return cases


INVENTORY_CASES = _inventory_cases()


# --- the role job file (docs/roles.md's key table) --------------------------------------------


def _documented_keys() -> dict[str, list[str]]:
    text = (DOCS / "roles.md").read_text()
    rows = dict(re.findall(r"^\| (job|role|`retry`) \| (.*) \|$", text, re.M))
    out = {}
    for level, row in rows.items():
        keys = re.findall(r"`(\w+)`", re.sub(r"\(.*?\)", "", row))
        out[level.strip("`")] = sorted(set(keys) - {"true", "paddle"})
    return out


JOB_VALUES = (
    ("newline", '"a\\nb"'),
    ("nul", '"a\\0b"'),
    ("empty", '""'),
    ("dash", '"-x"'),
    ("list", "[[1]]"),
    ("nan", ".nan"),
    ("negative", "-1"),
)


def _job_cases() -> list[Case]:
    cases = []
    for level, keys in _documented_keys().items():
        for key in keys:
            if (key, "*") in VALID:
                continue
            for how, value in JOB_VALUES:
                if (key, how) in VALID:
                    continue
                if level == "job":
                    body = f"{key}: {value}\nroles:\n  w:\n    script: train.py\n"
                elif level == "role":
                    own = "" if key in ("script", "command") else "    script: train.py\n"
                    body = f"roles:\n  w:\n{own}    {key}: {value}\n"
                else:
                    body = f"retry:\n  {key}: {value}\nroles:\n  w:\n    script: train.py\n"
                cases.append(Case(f"job {level}.{key}-{how}", ("@job", body), ("job.yml:",)))
    return cases


JOB_CASES = _job_cases()


# --- running a case ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The workspace: a script, a playbook, an inventory of closed loopback ports, the path
    shapes (missing, a folder, a symlink loop), an empty runs folder."""
    ws = tmp_path_factory.mktemp("bad-input")
    (ws / "train.py").write_text("print('hi')\n")
    (ws / "play.yml").write_text("- hosts: all\n  tasks: []\n")
    (ws / "hosts.yml").write_text(
        "all:\n  hosts:\n"
        "    a: {ansible_host: 127.0.0.2, ansible_port: 9}\n"
        "    b: {ansible_host: 127.0.0.3, ansible_port: 9}\n"
    )
    (ws / "dir").mkdir()
    os.symlink(ws / "loop", ws / "loop")
    (ws / "runs").mkdir()
    return ws


def _fill(arg: str, ws: Path) -> str:
    for p, target in (
        ("missing", ws / "missing"),
        ("dir", ws / "dir"),
        ("loop", ws / "loop"),
        ("root", Path("/")),
    ):
        arg = arg.replace("{" + p + "}", str(target))
    return arg.replace("{ws}", str(ws))


def _argv(case: Case, ws: Path, tmp_path: Path) -> list[str]:
    if case.argv[0] == "@inv":
        (tmp_path / "inv.yml").write_text(case.argv[1])
        return ["inventory", "-i", str(tmp_path / "inv.yml"), "--json"]
    if case.argv[0] == "@job":
        (tmp_path / "job.yml").write_text(case.argv[1])
        (tmp_path / "train.py").write_text("print('hi')\n")
        return [
            *("run", "--dry-run", "-i", str(ws / "hosts.yml"), "--runs-dir", str(ws / "runs")),
            *("--job", str(tmp_path / "job.yml")),
        ]
    return [_fill(a, ws) for a in case.argv]


def _names(case: Case, ws: Path) -> tuple[str, ...]:
    return tuple(_fill(n, ws) for n in case.names)


def _parse(argv: list[str]) -> tuple[int, str]:
    """Parse-only (the lab tree): click's conversion of every value, nothing invoked."""
    from fleetctl.cli import cli

    ctx = click.Context(cli)
    cmd: click.Command = cli
    words = list(argv)
    while isinstance(cmd, click.Group) and words and words[0] in cmd.list_commands(ctx):
        cmd = cmd.get_command(ctx, words.pop(0))
    try:
        cmd.make_context(argv[0], words)
    except click.ClickException as e:
        return 2 if e.exit_code == 2 else e.exit_code, f"fleetctl: error: {e.format_message()}"
    except FleetctlError as e:
        return e.exit_code, f"fleetctl: error: {e.one_line()}"
    return 0, ""


def _failure(case: Case, ws: Path, tmp_path: Path) -> str | None:
    """Why ``case`` is not refused as the rule says, or None."""
    argv = _argv(case, ws, tmp_path)
    if case.parse_only:
        code, stderr = _parse(argv)
    else:
        slurm = "--slurm" in argv  # no sbatch: a case Slurm's client would see goes nowhere
        res = run_cli(*argv, cwd=tmp_path, env={"PATH": str(ws / "dir")} if slurm else None)
        code, stderr = res.exit_code, res.stderr
    lines = [x for x in stderr.splitlines() if x.strip()]
    names = _names(case, ws)
    if code != 2:
        return f"exit {code} for {argv!r}: {stderr!r}"
    if "Traceback" in stderr or len(lines) != 1 or not lines[0].startswith("fleetctl: error: "):
        return f"not one error line for {argv!r}: {stderr!r}"
    if not any(n and n in lines[0] for n in names):
        return f"{lines[0]!r} names none of {names}"
    if any((ws / "runs").iterdir()) or any(p.name == "fleet-runs" for p in tmp_path.iterdir()):
        return f"{argv!r} left a run folder"
    return None


ALL = CLI_CASES + INVENTORY_CASES + JOB_CASES


def _groups() -> dict[str, list[Case]]:
    """The cases of one option, key or variable together: one test each (fast), every bad
    value of it in the failure message."""
    out: dict[str, list[Case]] = {}
    for c in ALL:
        out.setdefault(c.id.rsplit("-", 1)[0], []).append(c)
    return out


GROUPS = _groups()


@pytest.mark.parametrize("name", sorted(GROUPS))
def test_a_bad_value_is_refused_where_it_is_read(name: str, ws: Path, tmp_path: Path) -> None:
    failures = []
    for i, case in enumerate(GROUPS[name]):
        folder = tmp_path / str(i)
        folder.mkdir()
        why = _failure(case, ws, folder)
        if why:
            failures.append(f"{case.id}: {why}")
    assert not failures, "\n".join(failures)


# --- RunSpec's fields through the library ------------------------------------------------------


def _library_values(f) -> list[tuple[str, object]]:
    from fleetctl.api import checks as c

    check = f.metadata.get("check")
    if isinstance(f.default, bool):
        return [("str", "yes"), ("int", 1)]
    if isinstance(f.default, tuple):
        return [("str", "a"), ("item", ("a\nb",) if check is c.TEXT else (float("nan"),))]
    if isinstance(check, c.Number):
        out = [("nan", float("nan")), ("inf", float("inf")), ("huge", 1e309), ("abc", "abc")]
        out += [("bool", True)]
        if check.min is not None and check.min >= 0:
            out.append(("negative", -1))
        return out
    if isinstance(check, c.OneOf):
        return [("bogus", "bogus"), ("newline", check.words()[0] + "\n")]
    if check in (c.TEXT, c.image, c.before, c.runtime):
        return [("newline", "a\nb"), ("nul", "a\x00b"), ("list", ["a"])]
    return []


def _library_cases() -> list[tuple[str, str, object]]:
    from dataclasses import fields

    from fleetctl.api.runspec import GROUPS as SPEC_GROUPS
    from fleetctl.api.runspec import keyword

    out = []
    for cls in SPEC_GROUPS.values():
        for f in fields(cls):
            for how, value in _library_values(f):
                if keyword(f) == "args" and how != "str":
                    continue  # the script's own arguments: any text (PASS_THROUGH)
                out.append((f"{keyword(f)}-{how}", keyword(f), value))
    return out


LIBRARY = _library_cases()


def test_runspec_refuses_every_bad_field_value_in_one_line() -> None:
    """``RunSpec.build`` (what ``Fleet.run`` and every command build): UsageError, exit 2,
    one line naming the field's option or keyword."""
    from fleetctl.api.runspec import RunSpec, field_of, hint
    from fleetctl.errors import FleetctlError

    failures = []
    for case, kw, value in LIBRARY:
        try:
            RunSpec.build("train.py").replace(**{kw: value})
        except FleetctlError as e:
            line = e.one_line()
            if e.exit_code != 2 or "\n" in str(e).strip() or hint(field_of(kw)) not in line:
                failures.append(f"{case}: exit {e.exit_code}: {line!r}")
            continue
        except Exception as e:  # what the table is for: any other error
            failures.append(f"{case}: {type(e).__name__}: {e}")
            continue
        failures.append(f"{case}: accepted {value!r}")
    assert len(LIBRARY) > 150
    assert not failures, "\n".join(failures)


def test_fleet_run_dry_run_refuses_them_the_same_way() -> None:
    """One bad value per kind through ``Fleet.run(dry_run=True)``: the library's entry."""
    from fleetctl.api import Fleet
    from fleetctl.errors import UsageError

    fleet = Fleet.local()
    for kw, value in (("timeout", float("nan")), ("image", "-x"), ("env", {"A\n": "1"})):
        with pytest.raises(UsageError) as ei:
            fleet.run("train.py", dry_run=True, **{kw: value})
        assert ei.value.exit_code == 2 and "\n" not in str(ei.value), ei.value


# --- the issue's named cases, each on its own ---------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (("push", "--code", "/"), "whole filesystem"),
        (("run", "--dry-run", "--code-dir", "/", "{ws}/train.py"), "whole filesystem"),
        (("run", "--dry-run", "{ws}/loop"), "symlink loop"),
        (("push", "--code", "{ws}/loop"), "--code"),
        (("run", "--dry-run", "--env-var", "A\n=1", "{ws}/train.py"), "'--env-var'"),
        (("run", "--dry-run", "--image", "bad:name::", "{ws}/train.py"), "not an image name"),
        (("run", "--dry-run", "--slurm", "--nodes", "1", "--gres", "gpu:-1", "x.py"), "--gres"),
        (("run", "--dry-run", "--slurm", "--nodes", "1", "--gres", "gpu:1e309", "x.py"), "--gres"),
        (("run", "--dry-run", "--slurm", "--nodes", "1", "--partition", "p\nx", "x.py"), "--part"),
        (("status", "--runs-dir", "{ws}/runs", "nojob"), "no job nojob"),
    ],
)
def test_the_issues_cases(ws: Path, tmp_path: Path, argv: tuple[str, ...], words: str) -> None:
    """Issue 40's bad inputs: refused at once (``--code /`` hung silently, a looping script
    path gave a traceback, a name with a newline, an image name and Slurm values in a dry run
    were taken, an unknown JOB exited 1)."""
    res = run_cli(*[_fill(a, ws) for a in argv], cwd=tmp_path, env={"PATH": str(ws / "dir")})
    lines = res.stderr.strip().splitlines()
    assert res.exit_code == 2 and len(lines) == 1, res.stderr
    assert words in lines[0] and "Traceback" not in res.stderr, res.stderr


def test_the_table_covers_every_definition() -> None:
    """The generator finds the options, keys and variables the docs and the tree define."""
    opts = set(GROUPS)
    # push's --image is run's definition (RunSpec's Container field): tried once, under push
    for want in ("run env_vars", "push image", "run code_dir", "push code_dir", "run partition"):
        assert want in opts, want
    assert {"fleetctl_image", "fleetctl_gpus", "fleetctl_env"} <= set(_documented_vars())
    keys = _documented_keys()
    assert {"image", "script", "timeout"} <= set(keys["job"]) and "ports" in keys["role"]
    assert len(ALL) > 600
