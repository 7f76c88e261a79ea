"""Tool-call arguments as models write them: JSON objects, and the near misses worth repairing."""

import pytest

from runbus_model_router.repair import ArgumentsError, parse_arguments


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ('{"city": "Sydney"}', {"city": "Sydney"}),
        ("", {}),
        ("   ", {}),
        ('"{\\"city\\": \\"Perth\\"}"', {"city": "Perth"}),
    ],
)
def test_valid_arguments_are_read_without_repair(raw: str, expected: dict[str, object]) -> None:
    assert parse_arguments(raw) == (expected, False)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ('```json\n{"city": "Sydney"}\n```', {"city": "Sydney"}),
        ('{"city": "Sydney",}', {"city": "Sydney"}),
        ('{"cities": ["Sydney", "Perth",]}', {"cities": ["Sydney", "Perth"]}),
        ('{"city": "Syd', {"city": "Syd"}),
        ('{"a": {"b": [1, 2', {"a": {"b": [1, 2]}}),
        ('{"text": "a } inside"', {"text": "a } inside"}),
    ],
)
def test_almost_json_is_repaired(raw: str, expected: dict[str, object]) -> None:
    assert parse_arguments(raw) == (expected, True)


@pytest.mark.parametrize("raw", ["{'city': 'Sydney'}", "[1, 2]", "42", "city=Sydney", '"Sydney"'])
def test_anything_that_is_not_an_object_is_refused_with_the_reason(raw: str) -> None:
    with pytest.raises(ArgumentsError) as raised:
        parse_arguments(raw)

    assert str(raised.value)
