"""RecoveryRequest refuses bad fields with the contract's RecoveryRequestError variants."""

from __future__ import annotations

import pickle

import pytest

from pybatch import errors
from pybatch.errors import TextRule
from pybatch.values.ids import FailureId
from pybatch.values.recovery import RecoveryRequest
from pybatch.values.status import FailureCategory, FailureSummary
from tests.support.text_rules import broken_rule

DIGEST = bytes(32)
FAILURE = FailureSummary(FailureCategory.ILLEGAL_TRANSITION, FailureId(1))


@pytest.mark.parametrize(
    ("reason", "operator", "rule", "field"),
    [
        ("", "ops", TextRule.EMPTY, "reason code"),
        ("x" * 65, "ops", TextRule.TOO_LONG, "reason code"),
        (" lost", "ops", TextRule.SURROUNDING_WHITESPACE, "reason code"),
        ("lo\x07st", "ops", TextRule.CONTROL_CHARACTER, "reason code"),
        ("lost", "", TextRule.EMPTY, "operator reference"),
        ("lost", "o" * 129, TextRule.TOO_LONG, "operator reference"),
        ("lost", "ops\u2028", TextRule.SURROUNDING_WHITESPACE, "operator reference"),
        ("lost", "o\x00ps", TextRule.CONTROL_CHARACTER, "operator reference"),
    ],
)
def test_each_text_rule_is_named_by_the_error(
    reason: str, operator: str, rule: TextRule, field: str
) -> None:
    def mark_failed() -> RecoveryRequest:
        return RecoveryRequest(0, reason, operator, DIGEST, FAILURE)

    def abandon() -> RecoveryRequest:
        return RecoveryRequest(0, reason, operator, DIGEST)

    for build in (mark_failed, abandon):
        with broken_rule(errors.RecoveryFieldInvalid, rule) as caught:
            build()
        assert isinstance(caught.value, errors.RecoveryRequestError)
        assert isinstance(caught.value, errors.RecoveryFieldInvalid)
        assert caught.value.field == field
        assert str(pickle.loads(pickle.dumps(caught.value))) == str(caught.value)
        bound = (64 if field == "reason code" else 128) if rule is TextRule.TOO_LONG else None
        assert caught.value.max_bytes == bound


@pytest.mark.parametrize("digest", [b"", bytes(31), bytes(33)])
def test_an_evidence_digest_of_the_wrong_length_is_a_typed_error(digest: bytes) -> None:
    with pytest.raises(errors.RecoveryEvidenceDigestInvalid):
        RecoveryRequest(0, "lost", "ops", digest)
