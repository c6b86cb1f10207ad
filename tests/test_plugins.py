"""The one plug-in loader: built-ins by name, anything else by ``package.module:factory``,
and every way a reference or its options can be wrong as one clear line."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest

from polar.plugins import build, load_factory


class PluginError(Exception):
    """A caller's own error class: the loader raises it, not one of its own."""


@dataclass(frozen=True)
class Widget:
    size: int
    colour: str = "red"


def make_gadget(name: str) -> dict[str, str]:
    return {"name": name}


NOT_CALLABLE = 42

KNOWN: dict[str, object] = {
    "widget": f"{__name__}:Widget",
    "gadget": make_gadget,
}


def load(ref: str) -> object:
    return load_factory(ref, kind="widget", known=KNOWN, error=PluginError)


def test_a_builtin_is_found_by_its_dotted_path_or_as_itself() -> None:
    assert load("widget") is Widget
    assert load("gadget") is make_gadget


def test_any_dotted_path_is_a_plugin() -> None:
    assert load(f"{__name__}:make_gadget") is make_gadget
    assert load("polar.plugins:build") is build


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        (
            "widgit",
            "unknown widget 'widgit'; use one of ['gadget', 'widget'] or 'package.module:factory'",
        ),
        (
            ":Widget",
            "unknown widget ':Widget'; use one of ['gadget', 'widget'] or 'package.module:factory'",
        ),
        (
            f"{__name__}:",
            f"unknown widget '{__name__}:'; use one of ['gadget', 'widget'] "
            "or 'package.module:factory'",
        ),
        (
            "no_such_package_xyz.widgets:Widget",
            "widget no_such_package_xyz.widgets:Widget: cannot import "
            "no_such_package_xyz.widgets (No module named 'no_such_package_xyz')",
        ),
        (
            f"{__name__}:Missing",
            f"widget {__name__}:Missing: {__name__} has no callable 'Missing'",
        ),
        (
            f"{__name__}:NOT_CALLABLE",
            f"widget {__name__}:NOT_CALLABLE: {__name__} has no callable 'NOT_CALLABLE'",
        ),
    ],
)
def test_a_bad_reference_is_one_line_in_the_callers_error(ref: str, message: str) -> None:
    with pytest.raises(PluginError) as caught:
        load(ref)

    assert str(caught.value) == message
    assert "\n" not in str(caught.value)


def test_a_dataclass_gets_its_options_validated_and_converted() -> None:
    widget = build(Widget, {"size": "3"}, label="widget w", noun="options", error=PluginError)

    assert widget == Widget(size=3)


@pytest.mark.parametrize(
    ("factory", "options", "message"),
    [
        (Widget, {"size": 1, "shape": "round"}, "w: unknown options ['shape']; it takes "),
        (Widget, {"size": "big"}, "w: size: Input should be a valid integer"),
        (Widget, {}, "w: size: Field required"),
        (make_gadget, {"nom": "x"}, "w: make_gadget() got an unexpected keyword argument 'nom'"),
    ],
)
def test_options_a_factory_refuses_are_one_line(
    factory: Callable[..., object], options: dict[str, object], message: str
) -> None:
    with pytest.raises(PluginError) as caught:
        build(factory, options, label="w", noun="options", error=PluginError)

    assert str(caught.value).startswith(message)
    assert "\n" not in str(caught.value)


def test_a_factorys_own_errors_pass_through() -> None:
    def refuse() -> None:
        raise LookupError("not today")

    with pytest.raises(LookupError, match="not today"):
        build(refuse, {}, label="w", noun="options", error=PluginError)
