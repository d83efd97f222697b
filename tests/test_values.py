"""qkv._values: the one value parser of the command line, the runs and the benchmarks."""

import typing

import pytest

from qkv import UserError
from qkv._values import guess_value, parse_value


@pytest.mark.parametrize("annotation,text,expected", [
    (int, "3", 3),
    (float, "1e-3", 1e-3),
    (bool, "off", False),
    (typing.Optional[int], "null", None),
    (typing.Optional[int], "7", 7),
    (typing.Optional[str], "none", None),
    (typing.Tuple[float, float], "0.9,0.98", (0.9, 0.98)),
    (typing.Tuple[int, ...], "[1, 2, 3]", (1, 2, 3)),
    (typing.List[int], "4,5", [4, 5]),
    (list, "a,b", ["a", "b"]),
    (typing.Dict[str, typing.Any], '{"radius": 4}', {"radius": 4}),
    (typing.Literal["a", "b"], "b", "b"),
    (str, " spaced ", " spaced "),
])
def test_typed(annotation, text, expected):
    assert parse_value(annotation, text, "x") == expected


@pytest.mark.parametrize("annotation,text,message", [
    (int, "3.5", "x must be an int, got '3.5'"),
    (float, "nan", "x must be a finite float"),
    (bool, "maybe", "x must be a bool"),
    (typing.Tuple[int, int], "1,2,3", "x needs 2 comma-separated values"),
    (typing.Dict[str, int], "[1]", "x must be a JSON object"),
    (typing.Literal["a", "b"], "c", r"x must be one of \['a', 'b'\]"),
    (typing.Optional[int], "many", "x must be an int"),
])
def test_typed_refusals_name_the_value_and_are_user_errors(annotation, text, message):
    with pytest.raises(UserError, match=message):
        parse_value(annotation, text, "x")
    assert issubclass(UserError, ValueError)  # callers that catch ValueError keep working


@pytest.mark.parametrize("text,expected", [
    ("true", True), ("False", False), ("None", None), ("null", None), ("3", 3), ("-2.5", -2.5), ("1e-3", 1e-3),
    ("(8, 8)", (8, 8)), ("[1, 2]", [1, 2]), ("'a'", "a"), ('{"a": true}', {"a": True}), ("causal", "causal"),
    (" word ", "word"), ("", ""),
])
def test_untyped_values_are_guessed(text, expected):
    assert guess_value(text) == expected
    assert parse_value(typing.Any, text, "x") == expected  # no declared type: the same guess


def test_the_benchmarks_use_the_same_parser():
    from qkv.bench import common

    for text in ("true", "(8, 8)", "1e-3", "none", "window", '{"a": null}'):
        assert common.parse_value(text) == guess_value(text)


def test_kernel_kwargs_are_parsed_on_the_low_floor():
    from qkv._values import parse_kernel_kwargs

    assert parse_kernel_kwargs(["window:radius=128,block=64", "local-2d:image_size=(32,32)", "window:causal=true"]) == {
        "window": {"radius": 128, "block": 64, "causal": True}, "local-2d": {"image_size": (32, 32)}}
    with pytest.raises(UserError, match="name:key=value"):
        parse_kernel_kwargs(["radius=3"])
    with pytest.raises(UserError, match="key=value"):
        parse_kernel_kwargs(["window:radius"])
