"""Finding a runtime backend by name or by ``package.module:factory``."""

from __future__ import annotations

from pathlib import Path

import pytest

from polar.runtime import BACKENDS, Runtime, RuntimeSpec, UnknownRuntime, create_runtime
from polar.runtime.apptainer import ApptainerRuntime
from polar.runtime.docker import DockerRuntime
from polar.runtime.local import LocalRuntime


@pytest.mark.parametrize(
    ("backend", "kind"),
    [("local", LocalRuntime), ("docker", DockerRuntime), ("apptainer", ApptainerRuntime)],
)
def test_built_in_backends_are_found_by_name_and_implement_the_protocol(
    backend: str, kind: type, tmp_path: Path
) -> None:
    runtime = create_runtime(RuntimeSpec(backend=backend, image="img"), tmp_path)

    assert type(runtime) is kind and isinstance(runtime, Runtime)
    assert runtime.session_dir == tmp_path.resolve()
    assert runtime.workdir == str(tmp_path.resolve() / "workspace")
    assert runtime.gateway_url is None  # not started, no gateway
    assert set(BACKENDS) == {"local", "docker", "apptainer"}


def test_a_plug_in_is_any_module_and_factory(tmp_path: Path) -> None:
    spec = RuntimeSpec(backend="polar.runtime.local:LocalRuntime", sandbox=False, network="host")

    assert isinstance(create_runtime(spec, tmp_path), LocalRuntime)


@pytest.mark.parametrize(
    ("backend", "message"),
    [
        ("kubernetes", "unknown runtime 'kubernetes'"),
        ("no_such_package.runtime:Factory", "cannot import no_such_package.runtime"),
        ("polar.runtime.local:Missing", "has no callable 'Missing'"),
    ],
)
def test_unknown_backends_are_refused_with_the_reason(
    backend: str, message: str, tmp_path: Path
) -> None:
    with pytest.raises(UnknownRuntime, match=message):
        create_runtime(RuntimeSpec(backend=backend), tmp_path)
