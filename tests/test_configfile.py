"""Reading a typed configuration: YAML, overrides on top, one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict

from polar.configfile import ConfigError, load_config, merge, read_yaml


class Engine(BaseModel):
    model_config = ConfigDict(extra="forbid")

    base_url: str
    model: str = "policy"


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    port: int = 8000
    engine: Engine


def test_overrides_merge_into_nested_sections() -> None:
    base = {"port": 1, "engine": {"base_url": "http://a", "model": "m"}}

    merged = merge(base, {"engine": {"base_url": "http://b"}, "port": 2})

    assert merged == {"port": 2, "engine": {"base_url": "http://b", "model": "m"}}
    assert base["engine"] == {"base_url": "http://a", "model": "m"}


def test_a_file_and_overrides_are_validated_once(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("port: 9000\nengine:\n  base_url: http://a\n")

    settings = load_config(Settings, path, {"engine": {"model": "big"}})

    assert settings == Settings(port=9000, engine=Engine(base_url="http://a", model="big"))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("port: [1,\n", "c.yaml: line 2 not valid YAML"),
        ("- port\n", "c.yaml: expected a mapping at the top level"),
        ("engine: {}\n", "c.yaml: engine.base_url: field required"),
        ("engine: {base_url: x}\nprot: 1\n", "c.yaml: prot: unknown field"),
        ("port: many\nengine: {base_url: x}\n", "c.yaml: port: Input should be a valid integer"),
    ],
)
def test_a_bad_file_is_one_line_naming_it(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text)

    with pytest.raises(ConfigError) as caught:
        load_config(Settings, path, {})

    assert str(caught.value).startswith(f"{tmp_path}/{message}")
    assert "\n" not in str(caught.value)


def test_an_empty_file_is_an_empty_mapping_and_a_missing_one_an_error(tmp_path: Path) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_text("")

    assert read_yaml(empty) == {}
    with pytest.raises(ConfigError, match=r"missing.yaml: cannot read \(No such file"):
        read_yaml(tmp_path / "missing.yaml")


class Pool(BaseModel):
    model_config = ConfigDict(extra="forbid")

    engines: list[Engine] = []
    by_name: dict[str, Engine] = {}
    fallback: Engine | None = None


def test_every_problem_is_listed_at_once_each_unknown_field_with_the_closest_known(
    tmp_path: Path,
) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("port: many\nengine: {base_urll: http://a, modle: m}\nprot: 1\n")

    with pytest.raises(ConfigError) as caught:
        load_config(Settings, path, {})

    assert str(caught.value) == (
        f"{path}: port: Input should be a valid integer, unable to parse string as an integer; "
        "engine.base_url: field required; "
        "engine.base_urll: unknown field (did you mean base_url?); "
        "engine.modle: unknown field (did you mean model?); "
        "prot: unknown field (did you mean port?)"
    )


def test_the_closest_field_is_found_inside_lists_dicts_and_optionals() -> None:
    data = {
        "engines": [{"base_url": "a", "mdoel": "m"}],
        "by_name": {"x": {"base_ulr": "b"}},
        "fallback": {"base_url": "c", "zzz": 1},
        "engins": [],
    }

    with pytest.raises(ConfigError) as caught:
        load_config(Pool, None, data)

    assert str(caught.value).split("; ") == [
        "engines.0.mdoel: unknown field (did you mean model?)",
        "by_name.x.base_url: field required",
        "by_name.x.base_ulr: unknown field (did you mean base_url?)",
        "fallback.zzz: unknown field",
        "engins: unknown field (did you mean engines?)",
    ]
