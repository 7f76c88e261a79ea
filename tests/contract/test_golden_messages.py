"""Golden wire samples decoded by today's types, and the schema-evolution rules (STYLE 3).

Old consumers must survive new producers: unknown fields are ignored, defaulted fields may be
absent. Anything else (an unknown tag, a missing required field) is a clear rejection.
"""

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

import runbus.messages
from runbus.messages import Message, encode

from ._goldens import GOLDEN_FILES, assert_wire_contains, decoder_for, load, tag_of


def _decode(path: Path, sample: dict[str, Any]) -> Any:
    return decoder_for(path).decode(json.dumps(sample).encode())


def _field_cases(*, required: bool) -> list[Any]:
    """(golden file, top-level field) pairs for every field present in a sample."""
    cases = []
    for path in GOLDEN_FILES:
        sample = load(path)
        decoded = decoder_for(path).decode(path.read_bytes())
        for field in msgspec.structs.fields(type(decoded)):
            if field.encode_name in sample and field.required == required:
                cases.append(pytest.param(path, field, id=f"{path.name}:{field.name}"))
    return cases


def _wire_tags() -> set[str]:
    tags = set()
    pending = list(Message.__subclasses__())
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        if cls.__module__.startswith(runbus.messages.__name__):
            tags.add(str(cls.__struct_config__.tag))
    return tags


GOLDEN_IDS = [p.name for p in GOLDEN_FILES]


def test_every_wire_message_type_has_a_golden_sample() -> None:
    missing = _wire_tags() - {tag_of(p) for p in GOLDEN_FILES}

    assert not missing, f"add a golden sample under tests/contract/golden/ for {sorted(missing)}"


@pytest.mark.parametrize("path", GOLDEN_FILES, ids=GOLDEN_IDS)
def test_golden_sample_decodes_with_todays_decoder_as_its_own_type(path: Path) -> None:
    decoded = decoder_for(path).decode(path.read_bytes())

    assert type(decoded).__struct_config__.tag == tag_of(path)


@pytest.mark.parametrize("path", GOLDEN_FILES, ids=GOLDEN_IDS)
def test_golden_sample_round_trips_through_encode_and_decode_unchanged(path: Path) -> None:
    decoder = decoder_for(path)
    decoded = decoder.decode(path.read_bytes())

    encoded = encode(decoded)

    assert decoder.decode(encoded) == decoded
    assert_wire_contains(json.loads(encoded), load(path))


@pytest.mark.parametrize("path", GOLDEN_FILES, ids=GOLDEN_IDS)
def test_golden_sample_with_a_field_from_a_newer_producer_still_decodes(path: Path) -> None:
    sample = load(path)
    newer = {**sample, "added_in_a_later_version": {"nested": [1, "two", None]}}

    assert _decode(path, newer) == _decode(path, sample)


@pytest.mark.parametrize(("path", "field"), _field_cases(required=False))
def test_golden_sample_without_a_defaulted_field_decodes_with_the_default(
    path: Path, field: msgspec.structs.FieldInfo
) -> None:
    sample = load(path)
    older = {k: v for k, v in sample.items() if k != field.encode_name}
    default = field.default if field.default is not msgspec.NODEFAULT else field.default_factory()

    decoded = _decode(path, older)

    assert getattr(decoded, field.name) == default
    assert decoded == msgspec.structs.replace(_decode(path, sample), **{field.name: default})


@pytest.mark.parametrize(("path", "field"), _field_cases(required=True))
def test_golden_sample_without_a_required_field_is_rejected_naming_the_field(
    path: Path, field: msgspec.structs.FieldInfo
) -> None:
    sample = load(path)
    broken = {k: v for k, v in sample.items() if k != field.encode_name}

    with pytest.raises(msgspec.ValidationError, match=f"missing required field `{field.name}`"):
        _decode(path, broken)


@pytest.mark.parametrize("path", GOLDEN_FILES, ids=GOLDEN_IDS)
def test_golden_sample_with_an_unknown_type_tag_is_rejected_naming_the_tag(path: Path) -> None:
    sample = {**load(path), "type": f"{load(path)['type']}.v2"}

    with pytest.raises(msgspec.ValidationError, match=r"at `\$\.type`"):
        _decode(path, sample)


def test_the_run_request_of_the_design_decodes_to_one_external_user_message() -> None:
    path = next(p for p in GOLDEN_FILES if p.name == "run.request.json")

    request = decoder_for(path).decode(path.read_bytes())

    assert request == runbus.messages.RunRequest(
        run_id="r-7f3a",
        agent="travel",
        session_id="s1",
        input=[
            runbus.messages.ChatMessage(
                role="user", contents=[runbus.messages.TextContent(text="Weather in Sydney?")]
            )
        ],
    )
    assert request.input[0].source == "external"
    assert request.input[0].message_id == ""
