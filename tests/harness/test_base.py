"""RunSpec validation and the environment every harness process starts from."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from polar.harness import InvalidRunSpec, RunSpec, base_env


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"gateway_url": "127.0.0.1:8000"}, "must start with http:// or https://"),
        ({"api_key": ""}, "API key is empty"),
        ({"model": ""}, "model name is empty"),
        ({"timeout_s": 0}, "timeout must be positive"),
    ],
)
def test_a_spec_that_cannot_run_is_refused(
    fields: dict[str, object], message: str, make_spec: Callable[..., RunSpec]
) -> None:
    with pytest.raises(InvalidRunSpec, match=message):
        make_spec(**fields)


def test_base_urls_per_client_family(make_spec: Callable[..., RunSpec]) -> None:
    spec = make_spec(gateway_url="https://gw.example:9/")
    assert spec.openai_base_url == "https://gw.example:9/v1"
    assert spec.anthropic_base_url == "https://gw.example:9"


def test_the_key_is_not_in_the_spec_repr(make_spec: Callable[..., RunSpec]) -> None:
    spec = make_spec(api_key="sk-very-secret")
    assert "sk-very-secret" not in repr(spec)


def test_base_env_isolates_home_and_config_dirs(make_spec: Callable[..., RunSpec]) -> None:
    spec = make_spec(path="/usr/bin:/bin")
    env = base_env(spec)
    home = str(spec.home)
    assert env["HOME"] == home
    assert env["PATH"] == "/usr/bin:/bin"
    for variable in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_CACHE_HOME"):
        assert Path(env[variable]).is_relative_to(home)
    assert not any("KEY" in name for name in env)
