"""Running pytest inside a runtime and reading per-test outcomes.

Outcomes come from a JUnit XML report (``junit_family=xunit1``, whose ``file``
attribute lets the pytest node id be rebuilt exactly: ``path::Class::test[id]``);
when there is no readable report (pytest killed, an old pytest) they come from
the ``-rA`` short summary instead. Collection errors do not stop the other
files (``--continue-on-collection-errors``); a file that failed to collect is
reported as one ERROR entry under its path.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ElementTree
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from polar.reward.base import EvaluatorError
from polar.reward.transfer import eval_path, output, read_file, tail
from polar.runtime.base import Runtime

PYTEST_FLAGS = (
    "-rA",
    "-p",
    "no:cacheprovider",
    "--continue-on-collection-errors",
    "-o",
    "junit_family=xunit1",
)
PYTEST_ENV = {"PYTHONDONTWRITEBYTECODE": "1", "PY_COLORS": "0"}


class Outcome(StrEnum):
    PASSED = "passed"
    FAILED = "failed"
    ERROR = "error"
    SKIPPED = "skipped"


class ReportSource(StrEnum):
    JUNIT = "junit"
    SUMMARY = "summary"


@dataclass(frozen=True, slots=True)
class PytestRun:
    outcomes: Mapping[str, Outcome]
    """Node id -> outcome, for every test pytest reported."""
    exit_code: int
    timed_out: bool
    output: str
    source: ReportSource


async def run_pytest(
    runtime: Runtime,
    *,
    cwd: str,
    command: Sequence[str],
    args: Sequence[str],
    env: Mapping[str, str],
    timeout_s: float,
    report: str = "pytest-report.xml",
) -> PytestRun:
    """Run ``command`` (e.g. ``python -m pytest``) with ``args`` and read the outcomes.

    Raises :class:`EvaluatorError` when pytest itself cannot run (not
    installed, command not found); a run that reports nothing is a result.
    """
    report_path = eval_path(runtime, report)
    await runtime.exec(["rm", "-f", report_path], timeout_s=30)
    result = await runtime.exec(
        [*command, *PYTEST_FLAGS, f"--junitxml={report_path}", *args],
        cwd=cwd,
        env={**PYTEST_ENV, **env},
        timeout_s=timeout_s,
    )
    text = output(result)
    if not result.timed_out and (
        result.exit_code in (126, 127) or re.search(r"No module named '?pytest'?\s*$", text, re.M)
    ):
        raise EvaluatorError(f"cannot run {' '.join(command)}: {' '.join(tail(text, 300).split())}")
    outcomes: dict[str, Outcome] | None = None
    source = ReportSource.JUNIT
    xml = await read_file(runtime, report_path)
    if xml is not None:
        outcomes = parse_junit(xml)
    if outcomes is None:
        outcomes, source = parse_summary(result.stdout), ReportSource.SUMMARY
    return PytestRun(outcomes, result.exit_code, result.timed_out, text, source)


def parse_junit(xml: bytes) -> dict[str, Outcome] | None:
    """Outcomes by node id from a pytest JUnit XML report; None if it is unreadable."""
    try:
        root = ElementTree.fromstring(xml)
    except ElementTree.ParseError:
        return None
    outcomes: dict[str, Outcome] = {}
    for case in root.iter("testcase"):
        node_id = _node_id(case.get("classname", ""), case.get("name", ""), case.get("file"))
        outcomes[node_id] = _worst(outcomes.get(node_id), _case_outcome(case))
    return outcomes


def _case_outcome(case: ElementTree.Element) -> Outcome:
    tags = {child.tag for child in case}
    if "failure" in tags:
        return Outcome.FAILED
    if "error" in tags:
        return Outcome.ERROR
    if "skipped" in tags:
        return Outcome.SKIPPED
    return Outcome.PASSED


_SEVERITY = {Outcome.PASSED: 0, Outcome.SKIPPED: 1, Outcome.FAILED: 2, Outcome.ERROR: 3}


def _worst(old: Outcome | None, new: Outcome) -> Outcome:
    return new if old is None or _SEVERITY[new] >= _SEVERITY[old] else old


def _node_id(classname: str, name: str, file: str | None) -> str:
    """Invert pytest's ``mangle_test_address``: the path's ``/`` became ``.``
    and ``.py`` was dropped, then the classes and the test name follow."""
    if not file:
        return f"{classname.replace('.', '/')}.py::{name}" if classname else name
    if not classname:
        return file  # a collection error: the name is the module, the file its path
    module = file[:-3] if file.endswith(".py") else file
    dotted = module.replace("/", ".")
    if classname == dotted:
        return f"{file}::{name}"
    if classname.startswith(dotted + "."):
        classes = classname[len(dotted) + 1 :].split(".")
        return "::".join([file, *classes, name])
    return f"{file}::{name}"


_SUMMARY_LINE = re.compile(r"^(PASSED|FAILED|ERROR|XFAIL|XPASS) (.+?)(?: - .*)?$")
_SUMMARY_OUTCOME = {
    "PASSED": Outcome.PASSED,
    "XPASS": Outcome.PASSED,
    "FAILED": Outcome.FAILED,
    "ERROR": Outcome.ERROR,
    "XFAIL": Outcome.SKIPPED,
}


def parse_summary(stdout: str) -> dict[str, Outcome]:
    """Outcomes by node id from the ``-rA`` short test summary (the last one printed)."""
    marker = stdout.rfind("short test summary info")
    if marker < 0:
        return {}
    outcomes: dict[str, Outcome] = {}
    for line in stdout[marker:].splitlines()[1:]:
        match = _SUMMARY_LINE.match(line)
        if match:
            node_id = match[2]
            outcomes[node_id] = _worst(outcomes.get(node_id), _SUMMARY_OUTCOME[match[1]])
    return outcomes
