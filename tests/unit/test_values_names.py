"""Validated text values: order of checks, bounds, white space, control characters (A1, A2, A9)."""

from __future__ import annotations

import pickle

import pytest

from pybatch import errors
from pybatch.errors import TextRule
from pybatch.values.names import (
    UNICODE_WHITE_SPACE,
    ActorRef,
    ClassifierRevision,
    DefinitionRevision,
    DefinitionUpgradeKey,
    ExitCode,
    JobName,
    NodeId,
    OperationId,
    ParameterName,
    ReasonCode,
    StateSchemaId,
    StepName,
)
from tests.support.text_rules import broken_rule

NAME_KINDS = [(JobName, "job"), (StepName, "step"), (ParameterName, "parameter")]


@pytest.mark.parametrize(("cls", "kind"), NAME_KINDS)
def test_names_are_refused_empty_too_long_padded_or_with_control_characters(
    cls: type[JobName], kind: str
) -> None:
    """Scenario A1."""
    with broken_rule(errors.NameInvalid, TextRule.EMPTY) as empty:
        cls("")
    assert empty.value.kind == kind
    with broken_rule(errors.NameInvalid, TextRule.TOO_LONG) as long:
        cls("a" * 129)
    assert (long.value.kind, long.value.max_bytes) == (kind, 128)
    with broken_rule(errors.NameInvalid, TextRule.SURROUNDING_WHITESPACE):
        cls(" a")
    with broken_rule(errors.NameInvalid, TextRule.SURROUNDING_WHITESPACE):
        cls("a\u3000")
    with broken_rule(errors.NameInvalid, TextRule.CONTROL_CHARACTER) as control:
        cls("a\x07b")
    assert control.value.character_index == 1
    assert "\x07" not in str(control.value)


def test_a_multibyte_name_counts_bytes_not_characters() -> None:
    """Scenario A1."""
    accepted = "가" * 42 + "ab"  # 42 * 3 + 2 = 128 bytes
    assert len(accepted.encode()) == 128
    assert JobName(accepted).value == accepted
    with broken_rule(errors.NameInvalid, TextRule.TOO_LONG):
        JobName("가" * 43)  # 129 bytes, 43 characters


def test_order_too_long_wins_over_whitespace_and_control() -> None:
    with broken_rule(errors.NameInvalid, TextRule.TOO_LONG):
        JobName(" " + "\x07" * 200)
    with broken_rule(errors.NameInvalid, TextRule.SURROUNDING_WHITESPACE):
        JobName(" a\x07")


def test_whitespace_uses_the_unicode_white_space_set_not_str_strip() -> None:
    # U+001C..U+001F are stripped by str.strip() but are not White_Space: they are controls.
    with broken_rule(errors.NameInvalid, TextRule.CONTROL_CHARACTER) as error:
        JobName("\x1ca")
    assert error.value.character_index == 0
    for character in [
        "\t",
        "\n",
        "\x0b",
        "\x0c",
        "\r",
        " ",
        "\x85",
        "\xa0",
        "\u1680",
        "\u2000",
        "\u200a",
        "\u2028",
        "\u2029",
        "\u202f",
        "\u205f",
        "\u3000",
    ]:
        assert character in UNICODE_WHITE_SPACE
        with broken_rule(errors.NameInvalid, TextRule.SURROUNDING_WHITESPACE):
            JobName(f"a{character}")
    assert "\u200b" not in UNICODE_WHITE_SPACE  # zero width space is not White_Space
    assert JobName("a\u200b").value == "a\u200b"


def test_inner_whitespace_is_allowed_and_control_index_is_a_character_index() -> None:
    assert JobName("daily load").value == "daily load"
    with broken_rule(errors.NameInvalid, TextRule.CONTROL_CHARACTER) as error:
        JobName("서울\x7fx")
    assert error.value.character_index == 2


def test_unpaired_surrogate_is_refused() -> None:
    with pytest.raises(errors.TextNotUtf8):
        JobName("a\ud800")


def test_the_exit_code_bound_is_64_bytes() -> None:
    """Scenario A2."""
    assert ExitCode("E" * 64).value == "E" * 64
    with broken_rule(errors.NameInvalid, TextRule.TOO_LONG) as error:
        ExitCode("E" * 65)
    assert (error.value.kind, error.value.max_bytes) == ("exit code", 64)


def test_str_repr_equality_and_kinds() -> None:
    assert str(JobName("load")) == "load"
    assert repr(JobName("load")) == "JobName(value='load')"
    assert repr(ParameterName("secret_name")) == "ParameterName(<redacted>)"
    assert str(ParameterName("secret_name")) == "secret_name"
    job: object = JobName("a")
    assert job != StepName("a")
    assert sorted([StepName("b"), StepName("a")]) == [StepName("a"), StepName("b")]
    assert hash(JobName("a")) == hash(JobName("a"))


def test_non_str_is_a_programmer_error() -> None:
    with pytest.raises(TypeError):
        JobName(5)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("cls", "kind"),
    [
        (NodeId, "node id"),
        (DefinitionRevision, "definition revision"),
        (DefinitionUpgradeKey, "definition upgrade key"),
        (ClassifierRevision, "classifier revision"),
    ],
)
def test_definition_tokens_raise_definition_errors(cls: type[NodeId], kind: str) -> None:
    with broken_rule(errors.TokenInvalid, TextRule.EMPTY) as empty:
        cls("")
    assert empty.value.kind == kind
    with broken_rule(errors.TokenInvalid, TextRule.TOO_LONG) as long:
        cls("x" * 129)
    assert long.value.max_bytes == 128
    with broken_rule(errors.TokenInvalid, TextRule.SURROUNDING_WHITESPACE):
        cls("x ")
    with broken_rule(errors.TokenInvalid, TextRule.CONTROL_CHARACTER):
        cls("x\ny")
    assert isinstance(long.value, errors.DefinitionError)
    assert cls("x" * 128).value == "x" * 128


def test_state_schema_id_raises_state_errors() -> None:
    with broken_rule(errors.SchemaIdInvalid, TextRule.EMPTY):
        StateSchemaId("")
    with broken_rule(errors.SchemaIdInvalid, TextRule.TOO_LONG) as long:
        StateSchemaId("s" * 129)
    assert long.value.max_bytes == 128
    with broken_rule(errors.SchemaIdInvalid, TextRule.SURROUNDING_WHITESPACE):
        StateSchemaId(" s")
    with broken_rule(errors.SchemaIdInvalid, TextRule.CONTROL_CHARACTER):
        StateSchemaId("s\x00")
    assert isinstance(long.value, errors.StateError)
    assert StateSchemaId("oxide_batch.empty.v1").value == "oxide_batch.empty.v1"


def test_reason_codes_operation_ids_and_actor_refs_enforce_their_length_and_alphabet() -> None:
    """Scenario A9."""
    assert ReasonCode("OPS_1").value == "OPS_1"
    with broken_rule(errors.RequestFieldInvalid, TextRule.INVALID_CHARACTER) as invalid:
        ReasonCode("ops")
    assert invalid.value.field == "reason code"
    with broken_rule(errors.RequestFieldInvalid, TextRule.TOO_LONG) as long:
        OperationId("o" * 65)
    assert long.value.max_bytes == 64
    assert OperationId("op-1.a:b_c").value == "op-1.a:b_c"
    with broken_rule(errors.RequestFieldInvalid, TextRule.INVALID_CHARACTER):
        OperationId("a@b")
    assert ActorRef("svc@ops:1").value == "svc@ops:1"
    with broken_rule(errors.RequestFieldInvalid, TextRule.EMPTY):
        ActorRef("")
    with broken_rule(errors.RequestFieldInvalid, TextRule.TOO_LONG):
        ActorRef("a" * 129)
    with broken_rule(errors.RequestFieldInvalid, TextRule.INVALID_CHARACTER):
        ActorRef("a b")
    with broken_rule(errors.RequestFieldInvalid, TextRule.INVALID_CHARACTER):
        ActorRef("é")


def test_values_and_errors_pickle() -> None:
    assert pickle.loads(pickle.dumps(JobName("a"))) == JobName("a")
    error = errors.NameInvalid(kind="job", rule=TextRule.CONTROL_CHARACTER, character_index=3)
    assert str(pickle.loads(pickle.dumps(error))) == str(error)
