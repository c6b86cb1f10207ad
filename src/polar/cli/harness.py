"""``polar harness``: install agent CLIs into the project cache and run them headless."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Annotated

import typer

from polar.cli.errors import fail
from polar.harness import (
    DEFAULT_CACHE_DIR,
    DEFAULT_PATH,
    INSTALLABLE,
    PRESETS,
    HarnessError,
    InstallError,
    RunSpec,
    Stream,
    Toolchain,
    install,
    installed_version,
    is_installed,
    load_harness,
    run_harness,
)
from polar.harness.install import DEFAULT_PYTHON

app = typer.Typer(
    help="Install and run agent CLIs (harnesses) against the gateway.",
    no_args_is_help=True,
    rich_markup_mode=None,
)

TIMEOUT_EXIT_CODE = 124
"""Exit status of a run that hit --timeout-s (as timeout(1) reports it)."""

CacheOption = Annotated[
    Path, typer.Option("--cache", help="Directory the harness CLIs are installed into.")
]
PythonOption = Annotated[
    str, typer.Option("--python", help="Interpreter for the virtualenvs of PyPI harnesses.")
]


@app.command("list")
def list_command(cache: CacheOption = DEFAULT_CACHE_DIR) -> None:
    """List the harness presets: the pinned CLI of each and whether the cache has it."""
    rows = []
    for name in PRESETS:
        package = load_harness(name).package if name in INSTALLABLE else None
        if package is None:
            rows.append((name, "-", "nothing to install"))
            continue
        found = installed_version(package, cache)
        state = "installed" if found == package.version else "not installed"
        if found is not None and found != package.version:
            state = f"{found} installed"
        rows.append((name, f"{package.name} {package.version}", state))
    width = [max(len(row[i]) for row in rows) for i in range(2)]
    for name, pinned, state in rows:
        print(f"{name:<{width[0]}}  {pinned:<{width[1]}}  {state}")


@app.command("install")
def install_command(
    name: Annotated[str, typer.Argument(help=f"A harness ({', '.join(INSTALLABLE)}) or 'all'.")],
    cache: CacheOption = DEFAULT_CACHE_DIR,
    python: PythonOption = DEFAULT_PYTHON,
) -> None:
    """Install pinned harness CLIs into the cache (skipped when already there)."""
    toolchain = Toolchain(python=python)
    names = INSTALLABLE if name == "all" else (name,)
    for each in names:
        if each in PRESETS and each not in INSTALLABLE:
            print(f"{each}: nothing to install")
            continue
        try:
            harness = load_harness(each)
            package = harness.package
            if package is None:
                print(f"{each}: nothing to install")
                continue
            kept = is_installed(package, cache)
            path = install(package, cache, toolchain, progress=_say("harness install"))
        except InstallError as exc:
            fail("harness install", str(exc), code=1)
        except HarnessError as exc:
            fail("harness install", str(exc))
        print(f"{'kept' if kept else 'installed'} {each} {package.version} {path}")


@app.command("run")
def run_command(
    name: Annotated[
        str, typer.Argument(help=f"A harness ({', '.join(PRESETS)}) or package.module:factory.")
    ],
    instruction: Annotated[str, typer.Option(help="The task given to the agent.")],
    gateway: Annotated[str, typer.Option(help="Gateway root URL, e.g. http://127.0.0.1:8000.")],
    api_key: Annotated[
        str,
        typer.Option(envvar="POLAR_API_KEY", help="Session key (or set POLAR_API_KEY)."),
    ],
    model: Annotated[str, typer.Option(help="Model name the harness asks for.")] = "policy",
    workdir: Annotated[Path, typer.Option(help="Directory the agent works in.")] = Path("."),
    timeout_s: Annotated[
        float, typer.Option(help="Kill the harness (and its children) after this long.")
    ] = 600.0,
    cache: CacheOption = DEFAULT_CACHE_DIR,
    python: PythonOption = DEFAULT_PYTHON,
    option: Annotated[
        list[str] | None,
        typer.Option(
            "--option",
            help="Harness setting KEY=VALUE (repeatable), e.g. command='my-agent {instruction}' "
            "for shell, api=openai-responses for pi.",
        ),
    ] = None,
    home: Annotated[
        Path | None,
        typer.Option(help="HOME for the harness.", show_default="a fresh temporary directory"),
    ] = None,
) -> None:
    """Run one instruction through a harness headless (stdin closed) and exit with its status."""
    options: dict[str, str] = {}
    for item in option or ():
        key, sep, value = item.partition("=")
        if not sep or not key:
            fail("harness run", f"--option expects KEY=VALUE, got {item!r}")
        options[key] = value
    with ExitStack() as stack:
        if home is None:
            home = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="polar-home-")))
        try:
            harness = load_harness(name, options)
            if harness.package is not None:  # first, saying how far it got
                install(
                    harness.package,
                    cache,
                    Toolchain(python=python),
                    progress=_say("harness run"),
                )
            spec = RunSpec(
                gateway_url=gateway,
                api_key=api_key,
                model=model,
                instruction=instruction,
                workdir=workdir.resolve(),
                home=home.resolve(),
                timeout_s=timeout_s,
                path=os.environ.get("PATH", DEFAULT_PATH),
            )
            run = run_harness(
                harness, spec, cache_dir=cache, toolchain=Toolchain(python=python), on_output=_echo
            )
        except InstallError as exc:
            fail("harness run", str(exc), code=1)
        except HarnessError as exc:  # an unknown harness, its options, the run's flags
            fail("harness run", str(exc))
    result = run.result
    if result.timed_out:
        fail("harness run", f"{name} timed out after {timeout_s:g} s", code=TIMEOUT_EXIT_CODE)
    code = result.exit_code
    raise typer.Exit(code if code >= 0 else 128 - code)


def _say(command: str) -> Callable[[str], None]:
    """Progress lines of an install, on stderr."""
    return lambda line: print(f"polar {command}: {line}", file=sys.stderr, flush=True)


def _echo(stream: Stream, line: str) -> None:
    out = sys.stdout if stream is Stream.STDOUT else sys.stderr
    out.write(line)
    out.flush()
