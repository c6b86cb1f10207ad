"""What every runtime backend does (the :class:`polar.runtime.Runtime` contract), shown
against the real things: plain host processes, the bubblewrap sandbox, and a
podman (or docker) container of the image :mod:`support.images` builds."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from polar.runtime import CopyError, ExecResult, Runtime, RuntimeNotStarted

from support import procs
from support.runtimes import ALL_KINDS, Runtimes, SpecMaker, spec_maker

pytestmark = pytest.mark.anyio

PATH = "/usr/local/bin:/usr/bin:/bin"
TREE = """
sleep 300 &
setsid sh -c 'touch .tree-a; exec sleep 300' &
( setsid sh -c 'touch .tree-b; exec sleep 300' & )
while [ ! -e .tree-a ] || [ ! -e .tree-b ]; do sleep 0.02; done
echo started
wait
"""
"""A process tree that tries to outlive its command: background jobs, a ``setsid``'d
child, and a double-forked one re-parented away from the shell."""


@pytest.fixture(params=ALL_KINDS)
def make_spec(request: pytest.FixtureRequest) -> SpecMaker:
    return spec_maker(request.param, request)


async def start_tree(
    runtime: Runtime, timeout_s: float | None = None
) -> tuple[asyncio.Task[ExecResult], dict[str, str], list[int]]:
    """Start :data:`TREE` marked (see :mod:`support.procs`); return once all of it runs."""
    mark = procs.new_mark()
    started = asyncio.Event()

    def on_output(stream: str, line: str) -> None:
        if line == "started\n":
            started.set()

    task = asyncio.ensure_future(
        runtime.exec(
            ["sh", "-c", TREE],
            env={**mark, "PATH": PATH},
            timeout_s=timeout_s,
            on_output=on_output,
        )
    )
    waiter = asyncio.ensure_future(started.wait())
    await asyncio.wait([waiter, task], return_when=asyncio.FIRST_COMPLETED)
    waiter.cancel()
    assert started.is_set(), task.result()
    running = procs.marked(mark)
    # the shell, its two sleeps, the setsid'd one and the double-forked one
    assert len(running) >= 4, running
    return task, mark, running


async def test_exec_returns_the_commands_output_and_exit_status(
    runtimes: Runtimes, make_spec: SpecMaker
) -> None:
    runtime = await runtimes.start(make_spec())

    failed = await runtime.exec(["sh", "-c", "echo out; echo err >&2; echo more; exit 3"])
    succeeded = await runtime.exec(["true"])

    assert (failed.exit_code, failed.stdout, failed.stderr) == (3, "out\nmore\n", "err\n")
    assert not failed.ok and not failed.timed_out and not failed.cancelled
    assert succeeded.ok and succeeded.exit_code == 0


async def test_a_command_that_cannot_start_exits_127(
    runtimes: Runtimes, make_spec: SpecMaker
) -> None:
    runtime = await runtimes.start(make_spec())

    result = await runtime.exec(["/no/such/program", "arg"])

    assert result.exit_code == 127
    assert "/no/such/program" in result.stderr


async def test_a_signalled_command_exits_with_128_plus_the_signal(
    runtimes: Runtimes, make_spec: SpecMaker
) -> None:
    runtime = await runtimes.start(make_spec())

    result = await runtime.exec(["sh", "-c", "kill -TERM $$"])

    assert result.exit_code == 128 + 15 and not result.timed_out


async def test_commands_see_only_the_given_and_the_specs_environment(
    runtimes: Runtimes, make_spec: SpecMaker, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POLAR_TEST_HOST_ONLY", "must not leak")
    runtime = await runtimes.start(make_spec(env={"FROM_SPEC": "spec", "BOTH": "spec"}))

    result = await runtime.exec(
        ["env", "-0"],
        env={"BOTH": "exec", "FROM_EXEC": "a value with spaces = and 'quotes'", "PATH": PATH},
    )

    seen = dict(entry.split("=", 1) for entry in result.stdout.split("\0") if entry)
    given = {
        "FROM_SPEC": "spec",
        "BOTH": "exec",
        "FROM_EXEC": "a value with spaces = and 'quotes'",
        "PATH": PATH,
    }
    if runtime.spec.backend == "local":
        assert seen == given
    else:
        # a container's commands start from the image's environment, never the host's
        assert {name: seen.get(name) for name in given} == given
        assert set(seen) - set(given) <= {"HOME", "HOSTNAME", "TERM", "container"}


async def test_commands_run_in_the_workspace_unless_told_otherwise(
    runtimes: Runtimes, make_spec: SpecMaker
) -> None:
    runtime = await runtimes.start(make_spec())
    logs = str(runtime.session_dir / "logs")

    default = await runtime.exec(["pwd"])
    elsewhere = await runtime.exec(["pwd"], cwd=logs)

    assert runtime.workdir == str(runtime.session_dir / "workspace")
    assert default.stdout == f"{runtime.workdir}\n"
    assert elsewhere.stdout == f"{logs}\n"


async def test_the_specs_workdir_is_the_default_cwd(
    runtimes: Runtimes, make_spec: SpecMaker, tmp_path: Path
) -> None:
    session = tmp_path / "s0"
    runtime = await runtimes.start(make_spec(workdir=str(session / "home")))

    result = await runtime.exec(["pwd"])

    assert result.stdout == f"{session / 'home'}\n"


async def test_output_is_handed_on_line_by_line_while_the_command_runs(
    runtimes: Runtimes, make_spec: SpecMaker
) -> None:
    runtime = await runtimes.start(make_spec())
    go = runtime.session_dir / "workspace" / "go"
    lines: list[tuple[str, str]] = []

    def on_output(stream: str, line: str) -> None:
        lines.append((stream, line))
        if line == "waiting\n":
            go.touch()  # the command only goes on once this line has arrived

    result = await runtime.exec(
        [
            "sh",
            "-c",
            "echo waiting; echo note >&2; while [ ! -e go ]; do sleep 0.02; done; "
            "printf 'done\\nno newline'",
        ],
        env={"PATH": PATH},
        timeout_s=60,
        on_output=on_output,
    )

    assert result.ok
    assert [line for line in lines if line[0] == "stdout"] == [
        ("stdout", "waiting\n"),
        ("stdout", "done\n"),
        ("stdout", "no newline"),
    ]
    assert ("stderr", "note\n") in lines
    assert result.stdout == "waiting\ndone\nno newline"


async def test_a_timeout_kills_the_whole_process_tree(
    runtimes: Runtimes, make_spec: SpecMaker
) -> None:
    runtime = await runtimes.start(make_spec())

    task, mark, _ = await start_tree(runtime, timeout_s=5)
    result = await task

    assert result.timed_out and not result.cancelled and result.exit_code == -1
    assert not result.ok
    assert procs.marked(mark) == []
    assert (await runtime.exec(["true"])).ok  # the runtime itself lives on


async def test_cancel_kills_the_running_commands_trees(
    runtimes: Runtimes, make_spec: SpecMaker
) -> None:
    runtime = await runtimes.start(make_spec())
    task, mark, _ = await start_tree(runtime)

    await runtime.cancel()
    result = await task

    assert result.cancelled and not result.timed_out and result.exit_code == -1
    assert procs.marked(mark) == []
    assert (await runtime.exec(["true"])).ok


async def test_cancelling_the_exec_call_kills_the_tree(
    runtimes: Runtimes, make_spec: SpecMaker
) -> None:
    runtime = await runtimes.start(make_spec())
    task, mark, _ = await start_tree(runtime)

    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    assert procs.marked(mark) == []


async def test_stop_ends_everything_and_is_idempotent(
    runtimes: Runtimes, make_spec: SpecMaker
) -> None:
    runtime = await runtimes.start(make_spec())
    task, mark, _ = await start_tree(runtime)

    await runtime.stop()
    result = await task
    await runtime.stop()

    assert result.cancelled
    assert procs.marked(mark) == []
    with pytest.raises(RuntimeNotStarted):
        await runtime.exec(["true"])


async def test_put_and_get_copy_files_and_directory_trees(
    runtimes: Runtimes, make_spec: SpecMaker, tmp_path: Path
) -> None:
    runtime = await runtimes.start(make_spec())
    source = tmp_path / "source"
    (source / "pkg" / "deep").mkdir(parents=True)
    (source / "pkg" / "deep" / "data.txt").write_text("deep data\n")
    (source / "pkg" / "link").symlink_to("deep/data.txt")
    (tmp_path / "single.txt").write_text("single\n")
    workspace = runtime.workdir

    await runtime.put(tmp_path / "single.txt", f"{workspace}/new/parents/single.txt")
    await runtime.put(source / "pkg", f"{workspace}/pkg")
    listing = await runtime.exec(
        ["sh", "-c", "cat new/parents/single.txt pkg/deep/data.txt pkg/link; readlink pkg/link"]
    )
    await runtime.exec(["sh", "-c", "echo made inside > pkg/deep/made.txt"])
    await runtime.get(f"{workspace}/pkg", tmp_path / "back")
    await runtime.get(f"{workspace}/new/parents/single.txt", tmp_path / "back-single.txt")

    assert listing.stdout == "single\ndeep data\ndeep data\ndeep/data.txt\n"
    assert (tmp_path / "back" / "deep" / "made.txt").read_text() == "made inside\n"
    assert (tmp_path / "back" / "link").readlink() == Path("deep/data.txt")
    assert (tmp_path / "back-single.txt").read_text() == "single\n"


async def test_copying_a_missing_path_raises_copy_error(
    runtimes: Runtimes, make_spec: SpecMaker, tmp_path: Path
) -> None:
    runtime = await runtimes.start(make_spec())

    with pytest.raises(CopyError):
        await runtime.put(tmp_path / "missing", f"{runtime.workdir}/x")
    with pytest.raises(CopyError):
        await runtime.get(f"{runtime.workdir}/missing", tmp_path / "x")


async def test_concurrent_commands_keep_their_own_output(
    runtimes: Runtimes, make_spec: SpecMaker
) -> None:
    runtime = await runtimes.start(make_spec())

    results = await asyncio.gather(
        *(runtime.exec(["sh", "-c", f"for i in 1 2 3; do echo {n}-$i; done"]) for n in range(6))
    )

    assert [result.stdout for result in results] == [f"{n}-1\n{n}-2\n{n}-3\n" for n in range(6)]


async def test_large_binary_output_and_stdin_at_end_of_file(
    runtimes: Runtimes, make_spec: SpecMaker
) -> None:
    runtime = await runtimes.start(make_spec())
    writer = "import sys; sys.stdout.buffer.write(b'x' * 3_000_000 + b'\\xff\\n')"

    large = await runtime.exec(["python3", "-c", writer])
    reader = await runtime.exec(["cat"], timeout_s=60)  # must not wait for input

    assert large.stdout == "x" * 3_000_000 + "\ufffd\n"
    assert reader.ok and reader.stdout == ""
