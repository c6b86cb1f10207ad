"""One grammar across every ``polar`` command: short flags, ``-h``, ``--version``,
config errors, exit statuses and defaults read the same everywhere.

Each rule is checked through the real entry point (a subprocess, as a user
types it) and, where it is a claim about every command, over the whole command
tree as Typer builds it.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from polar import __version__
from polar.cli import app

POLAR = Path(sys.executable).with_name("polar")
"""The console script the package installs (``polar = polar.cli:main``)."""


def polar(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(POLAR), *args],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


def commands() -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every command and group of ``polar``, with its path of names."""
    stack: list[tuple[tuple[str, ...], Any]] = [((), typer.main.get_command(app))]
    while stack:
        path, command = stack.pop()
        yield path, command
        for name, sub in sorted(getattr(command, "commands", {}).items()):
            stack.append(((*path, name), sub))


def options(command: Any) -> list[Any]:
    return [p for p in command.params if p.param_type_name == "option"]


# ------------------------------------------------------------------ short flags


def test_every_short_flag_means_one_long_flag_in_every_command() -> None:
    meanings: dict[str, set[str]] = {}
    for _, command in commands():
        for option in options(command):
            shorts = [o for o in option.opts if not o.startswith("--")]
            longs = [o for o in option.opts if o.startswith("--")]
            for short in shorts:
                meanings.setdefault(short, set()).update(longs)
    assert {short: sorted(longs) for short, longs in meanings.items()} == {
        "-c": ["--config"],
        "-f": ["--format"],
        "-o": ["--output"],
    }


def test_o_is_output_in_build_and_not_an_option_elsewhere() -> None:
    assert "-o, --output" in polar("build", "-h").stdout
    result = polar("harness", "run", "shell", "-o", "command=true")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "polar harness run: error: No such option: -o (see polar harness run -h)"
    ]


# ------------------------------------------------------------------ -h and --version


def test_version_prints_the_package_version() -> None:
    result = polar("--version")
    assert (result.returncode, result.stdout) == (0, f"polar {__version__}\n")


def test_version_after_any_command_prints_it_too() -> None:
    for args in (("build", "--version"), ("harness", "list", "--version"), ("engine", "--version")):
        result = polar(*args)
        assert (result.returncode, result.stdout) == (0, f"polar {__version__}\n"), args


def test_a_group_alone_prints_its_help() -> None:
    result = polar("harness")
    assert result.returncode == 2
    assert result.stderr.startswith("Usage: polar harness [OPTIONS] COMMAND")
    assert "list" in result.stderr and "install" in result.stderr


def test_dash_h_is_help_in_every_command() -> None:
    assert polar("harness", "run", "-h").stdout.startswith("Usage: polar harness run ")
    runner = CliRunner()
    for path, _ in commands():
        result = runner.invoke(app, [*path, "-h"], prog_name="polar")
        assert result.exit_code == 0, (path, result.output)
        assert result.output.startswith(f"Usage: {' '.join(('polar', *path))} "), path


# ------------------------------------------------------------------ configuration errors


def test_a_config_file_reports_every_error_at_once_with_the_closest_field(
    tmp_path: Path,
) -> None:
    config = tmp_path / "serve.yaml"
    config.write_text(
        "server: {port: many}\n"
        "node:\n"
        "  gateway:\n"
        "    engine: {base_urll: 'http://127.0.0.1:9', model: m}\n"
    )
    result = polar("serve", "-c", str(config), "--check", "--token", "t" * 24)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "polar serve: error: server.port: Input should be a valid integer, unable to parse "
        "string as an integer; node.gateway.engine.base_url: field required; "
        "node.gateway.engine.base_urll: unknown field (did you mean base_url?)"
    ]


# ------------------------------------------------------------------ exit statuses


@pytest.mark.parametrize(
    ("args", "code", "line"),
    [
        # usage: a flag the command does not have, a missing argument
        (("records", "s", "--colour"), 2, "polar records: error: No such option: --colour"),
        (("build",), 2, "polar build: error: Missing argument 'session' (see polar build -h)"),
        # configuration: a value the command refuses
        (("build", "s", "--builder", "nope"), 2, "polar build: error: unknown builder 'nope'"),
        # run time: the store is not there
        (("records", "s", "--store", "{tmp}/none.db"), 1, "polar records: error: "),
    ],
)
def test_usage_and_configuration_exit_2_and_run_time_failures_1(
    args: tuple[str, ...], code: int, line: str, tmp_path: Path
) -> None:
    result = polar(*(a.format(tmp=tmp_path) for a in args))
    assert result.returncode == code, result.stderr
    (only,) = result.stderr.splitlines()
    assert only.startswith(line)


# ------------------------------------------------------------------ defaults


def test_every_default_reads_default_in_brackets_never_in_the_help_text() -> None:
    for path, command in commands():
        for param in command.params:
            help_text = getattr(param, "help", None) or ""
            assert "default:" not in help_text and "(default" not in help_text, (path, param.name)
    shown = polar("gateway", "-h").stdout
    assert "[default: (8000)]" in " ".join(shown.split())  # set by the file, else this
    assert "[default: runs/gateway/records.db]" not in shown
    assert "[default: 8400]" in " ".join(polar("dashboard", "-h").stdout.split())
