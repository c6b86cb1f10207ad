"""Installing pinned CLIs into the cache: layout, idempotency, failures.

npm itself is replaced by a small script (the registry is the edge); the last
tests check the real installs in the project cache.
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from polar.harness import (
    InstallError,
    NpmPackage,
    PythonPackage,
    Toolchain,
    executable_path,
    install,
    installed_version,
    is_installed,
    load_harness,
    run_process,
)
from polar.harness.install import (
    INSTALL_STAMP,
    LAUNCHER,
    node_executable,
    npm_prefix,
    venv_dir,
)

FAKE_NPM = """#!{python}
import json, pathlib, sys, time
here = pathlib.Path(__file__).parent
args = sys.argv[1:]
with open(here / "calls.jsonl", "a") as log:
    log.write(json.dumps(args) + "\\n")
settings = here / "control.json"
control = json.loads(settings.read_text()) if settings.exists() else {{}}
if control.get("fail"):
    print("npm warn something harmless", file=sys.stderr)
    print("npm error 404 Not Found - GET https://registry.npmjs.org/nope", file=sys.stderr)
    sys.exit(1)
if args[0] == "install":
    time.sleep(control.get("sleep", 0))
    prefix = pathlib.Path(args[args.index("--prefix") + 1])
    name, _, version = args[-1].rpartition("@")
    package = prefix / "node_modules" / name
    package.mkdir(parents=True, exist_ok=True)
    version = control.get("version", version)
    (package / "package.json").write_text(json.dumps({{"name": name, "version": version}}))
    bin_dir = prefix / "node_modules" / ".bin"
    bin_dir.mkdir(exist_ok=True)
    command = bin_dir / control.get("bin", "fake")
    command.write_text("#!/bin/sh\\necho fake\\n")
    command.chmod(0o755)
    for vendored in control.get("vendored", []):  # published without the execute bit
        path = package / vendored
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("#!/bin/sh\\necho vendored\\n")
        path.chmod(0o644)
"""

PACKAGE = NpmPackage("@acme/fake-cli", "1.2.3", bin="fake")


@pytest.fixture
def npm(tmp_path: Path) -> Path:
    tools = tmp_path / "tools"
    tools.mkdir()
    script = tools / "npm"
    script.write_text(FAKE_NPM.format(python=sys.executable))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def calls(npm: Path) -> list[list[str]]:
    log = npm.parent / "calls.jsonl"
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines()]


def control(npm: Path, **settings: object) -> None:
    (npm.parent / "control.json").write_text(json.dumps(settings))


def test_an_npm_package_gets_its_own_prefix_and_the_shared_download_cache(
    tmp_path: Path, npm: Path
) -> None:
    cache = tmp_path / "cache"
    path = install(PACKAGE, cache, Toolchain(npm=str(npm)))
    assert path == cache / "npm" / "acme-fake-cli" / "node_modules" / ".bin" / "fake"
    assert path.exists()
    (argv,) = calls(npm)
    assert argv[0] == "install"
    assert argv[argv.index("--prefix") + 1] == str(cache / "npm" / "acme-fake-cli")
    assert argv[argv.index("--cache") + 1] == str(cache / "npm-cache")
    assert "--ignore-scripts" in argv and "--save-exact" in argv
    assert argv[-1] == "@acme/fake-cli@1.2.3"
    assert installed_version(PACKAGE, cache) == "1.2.3"


def test_an_install_says_what_it_installs_how_far_it_got_and_how_long_it_took(
    tmp_path: Path, npm: Path
) -> None:
    cache = tmp_path / "cache"
    toolchain = Toolchain(npm=str(npm), progress_every_s=0.2)
    control(npm, sleep=1.0)
    said: list[str] = []

    install(PACKAGE, cache, toolchain, progress=said.append)

    prefix = cache.resolve() / "npm" / "acme-fake-cli"
    assert said[0] == (
        f"installing @acme/fake-cli@1.2.3 into {prefix} "
        "(the first here: no earlier install to estimate from)"
    )
    ticks = said[1:-1]
    assert ticks, "a running install reports how far it got"
    assert all(
        re.fullmatch(r"installing @acme/fake-cli@1\.2\.3: \d+ s, \d+ MB written", t) for t in ticks
    )
    assert re.fullmatch(r"installed @acme/fake-cli@1\.2\.3 in \d+ s", said[-1])

    # The next install of it (another version) is estimated from this one.
    said.clear()
    install(
        NpmPackage("@acme/fake-cli", "1.2.4", bin="fake"), cache, toolchain, progress=said.append
    )
    assert re.fullmatch(
        rf"installing @acme/fake-cli@1\.2\.4 into {re.escape(str(prefix))} "
        r"\(the last install here took 1 s\)",
        said[0],
    ), said[0]
    estimated = r"installing @acme/fake-cli@1\.2\.4: \d+ s, \d+ MB written, "
    estimated += r"(about \d+ s left|longer than the last install \(1 s\))"
    assert said[1:-1] and all(re.fullmatch(estimated, t) for t in said[1:-1]), said


def test_a_second_install_is_skipped(tmp_path: Path, npm: Path) -> None:
    cache = tmp_path / "cache"
    first = install(PACKAGE, cache, Toolchain(npm=str(npm)))
    second = install(PACKAGE, cache, Toolchain(npm=str(npm)))
    assert first == second
    assert len(calls(npm)) == 1


def test_only_the_package_own_install_scripts_run(tmp_path: Path, npm: Path) -> None:
    package = NpmPackage("native-cli", "2.0.0", bin="fake", install_scripts=True)
    install(package, tmp_path / "cache", Toolchain(npm=str(npm)))
    (first, second) = calls(npm)
    assert "--ignore-scripts" in first
    assert second[:2] == ["rebuild", "native-cli"]


def test_files_a_package_runs_get_their_execute_bit_even_in_an_older_install(
    tmp_path: Path, npm: Path
) -> None:
    cache = tmp_path / "cache"
    control(npm, vendored=["vendor/ripgrep/x64-linux/rg", "vendor/ripgrep/arm64-linux/rg"])
    install(PACKAGE, cache, Toolchain(npm=str(npm)))  # an install from before the fix
    vendored = sorted((npm_prefix(PACKAGE, cache) / "node_modules").glob("@acme/*/vendor/*/*/rg"))
    assert [p.stat().st_mode & 0o111 for p in vendored] == [0, 0]
    package = NpmPackage(PACKAGE.name, PACKAGE.version, bin="fake", executables=("vendor/*/*/rg",))
    install(package, cache, Toolchain(npm=str(npm)))
    assert len(calls(npm)) == 1  # nothing reinstalled
    assert [p.stat().st_mode & 0o111 for p in vendored] == [0o111, 0o111]
    assert subprocess.run([vendored[0]], capture_output=True, text=True).stdout == "vendored\n"


def test_qwen_code_marks_its_bundled_ripgrep_executable() -> None:
    package = load_harness("qwen_code").package
    assert isinstance(package, NpmPackage)
    assert package.executables == ("vendor/ripgrep/*/rg",)


def test_another_pinned_version_is_installed_over_the_old_one(tmp_path: Path, npm: Path) -> None:
    cache = tmp_path / "cache"
    install(PACKAGE, cache, Toolchain(npm=str(npm)))
    newer = NpmPackage(PACKAGE.name, "1.3.0", bin=PACKAGE.bin)
    assert not is_installed(newer, cache)
    install(newer, cache, Toolchain(npm=str(npm)))
    assert calls(npm)[-1][-1] == "@acme/fake-cli@1.3.0"
    assert installed_version(newer, cache) == "1.3.0"


def test_an_install_cut_short_is_redone(tmp_path: Path, npm: Path) -> None:
    cache = tmp_path / "cache"
    install(PACKAGE, cache, Toolchain(npm=str(npm)))
    (cache / "npm" / PACKAGE.slug / INSTALL_STAMP).unlink()
    assert not is_installed(PACKAGE, cache)
    install(PACKAGE, cache, Toolchain(npm=str(npm)))
    assert len(calls(npm)) == 2


def test_a_failing_npm_is_one_line_naming_its_error(tmp_path: Path, npm: Path) -> None:
    control(npm, fail=True)
    with pytest.raises(InstallError) as caught:
        install(PACKAGE, tmp_path / "cache", Toolchain(npm=str(npm)))
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("@acme/fake-cli@1.2.3: `")
    assert message.endswith(
        "exited with 1: npm error 404 Not Found - GET https://registry.npmjs.org/nope"
    )
    assert not is_installed(PACKAGE, tmp_path / "cache")


def test_a_different_version_than_pinned_is_an_error(tmp_path: Path, npm: Path) -> None:
    control(npm, version="9.9.9")
    with pytest.raises(InstallError, match=r"installed, but found version 9\.9\.9"):
        install(PACKAGE, tmp_path / "cache", Toolchain(npm=str(npm)))


def test_a_missing_npm_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(InstallError, match="no-such-npm-xyz not found"):
        install(PACKAGE, tmp_path / "cache", Toolchain(npm="no-such-npm-xyz"))


def test_a_virtualenv_counts_as_installed_only_with_the_same_pins(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    package = PythonPackage("Some.Agent", "0.4.0", bin="agent", requirements=("lib==1.0",))
    venv = venv_dir(package, cache)
    (venv / "lib" / "python3.11" / "site-packages" / "some_agent-0.4.0.dist-info").mkdir(
        parents=True
    )
    (venv / "bin").mkdir()
    (venv / "bin" / "agent").touch()
    assert not is_installed(package, cache)
    (venv / INSTALL_STAMP).write_text("Some.Agent==0.4.0\nlib==1.0\n")
    assert is_installed(package, cache)
    repinned = PythonPackage("Some.Agent", "0.4.0", bin="agent", requirements=("lib==2.0",))
    assert not is_installed(repinned, cache)
    assert executable_path(package, cache) == venv / "bin" / "agent"


VERSION_COMMANDS = {
    "codex": (["--version"], "codex-cli 0.169.0"),
    "claude_code": (["--version"], "2.1.331 (Claude Code)"),
    "qwen_code": (["--version"], "0.24.4"),
    "pi": (["--version"], "0.73.1"),
    "opencode": (["--version"], "1.18.33"),
    "gemini_cli": (["--version"], "0.61.0"),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(VERSION_COMMANDS))
def test_the_installed_cli_runs_and_reports_its_pinned_version(
    name: str, installed: Callable[..., Path], tmp_path: Path
) -> None:
    harness = load_harness(name)
    executable = installed(harness)
    args, expected = VERSION_COMMANDS[name]
    result = run_process(
        [str(executable), *args],
        cwd=tmp_path,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path)},
        timeout_s=60,
    )
    assert result.ok, result.stderr
    assert expected in result.stdout + result.stderr


@pytest.mark.slow
def test_the_installed_mini_swe_agent_has_its_pinned_libraries(
    installed: Callable[..., Path], harness_cache: Path, tmp_path: Path
) -> None:
    harness = load_harness("mini_swe_agent")
    installed(harness)
    package = harness.package
    assert isinstance(package, PythonPackage)
    python = venv_dir(package, harness_cache) / "bin" / "python"
    script = (
        "import importlib.metadata as m, minisweagent, mcp; "
        "print(m.version('mini-swe-agent'), m.version('litellm'))"
    )
    result = run_process(
        [str(python), "-c", script],
        cwd=tmp_path,
        env={"HOME": str(tmp_path), "MSWEA_SILENT_STARTUP": "1"},
        timeout_s=120,
    )
    assert result.ok, result.stderr
    assert result.stdout.split() == ["2.4.6", "1.110.2"]


def test_a_node_runtime_names_the_registry_package_for_this_platform() -> None:
    runtime = NpmPackage("some-cli", "1.0.0", bin="some", node="24.21.0").node_package
    assert runtime is not None
    assert runtime.version == "24.21.0"
    assert runtime.spec.startswith("node-") and runtime.spec.endswith("@24.21.0")
    assert NpmPackage("some-cli", "1.0.0", bin="some").node_package is None


def test_a_node_pin_is_part_of_what_counts_as_installed(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    package = NpmPackage("some-cli", "1.0.0", bin="some", node="24.21.0")
    launcher = executable_path(package, cache)
    assert launcher == npm_prefix(package, cache) / "polar-bin" / "some"
    (npm_prefix(package, cache) / "node_modules" / "some-cli").mkdir(parents=True)
    (npm_prefix(package, cache) / "node_modules" / "some-cli" / "package.json").write_text(
        '{"version": "1.0.0"}'
    )
    launcher.parent.mkdir(parents=True)
    launcher.touch()
    (npm_prefix(package, cache) / INSTALL_STAMP).write_text(
        f"some-cli@1.0.0\n{package.node_package.spec}\n"  # type: ignore[union-attr]
    )
    assert not is_installed(package, cache)  # the Node.js release is missing
    node = node_executable(package.node_package, cache)  # type: ignore[arg-type]
    node.parent.mkdir(parents=True)
    node.touch()
    assert is_installed(package, cache)


def test_the_launcher_runs_the_cli_on_the_pinned_node_whatever_path_has(tmp_path: Path) -> None:
    """The launcher (what ``_install_npm`` writes) puts the cache's Node.js
    release first on PATH, found relative to itself, and execs the CLI. The
    release and the CLI are stand-in scripts here: the real ones are the slow
    version test above."""
    cache = tmp_path / "cache"
    package = NpmPackage("some-cli", "1.0.0", bin="some", node="24.21.0")
    bin_dir = npm_prefix(package, cache) / "node_modules" / ".bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "some").write_text('#!/bin/sh\nnode "$@"\n')
    node = node_executable(package.node_package, cache)  # type: ignore[arg-type]
    node.parent.mkdir(parents=True)
    node.write_text('#!/bin/sh\necho "pinned node $*"\n')
    launcher = executable_path(package, cache)
    launcher.parent.mkdir(parents=True)
    launcher.write_text(LAUNCHER.format(spec=package.spec, node=package.node, bin=package.bin))
    for script in (bin_dir / "some", node, launcher):
        script.chmod(0o755)
    result = run_process(
        [str(launcher), "--version"],
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        timeout_s=30,
    )
    assert result.ok, result.stderr
    assert result.stdout == "pinned node --version\n"
