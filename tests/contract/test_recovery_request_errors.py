"""RecoveryRequest refuses bad fields with the contract's RecoveryRequestError variants."""

from __future__ import annotations

import pickle

import pytest

from pybatch import errors
from pybatch.values.ids import FailureId
from pybatch.values.recovery import RecoveryRequest
from pybatch.values.status import FailureCategory, FailureSummary

DIGEST = bytes(32)
FAILURE = FailureSummary(FailureCategory.ILLEGAL_TRANSITION, FailureId(1))


@pytest.mark.parametrize(
    ("reason", "operator", "expected", "field"),
    [
        ("", "ops", errors.RecoveryRequestEmpty, "reason code"),
        ("x" * 65, "ops", errors.RecoveryRequestTooLong, "reason code"),
        (" lost", "ops", errors.RecoveryRequestSurroundingWhitespace, "reason code"),
        ("lo\x07st", "ops", errors.RecoveryRequestControlCharacter, "reason code"),
        ("lost", "", errors.RecoveryRequestEmpty, "operator reference"),
        ("lost", "o" * 129, errors.RecoveryRequestTooLong, "operator reference"),
        ("lost", "ops\u2028", errors.RecoveryRequestSurroundingWhitespace, "operator reference"),
        ("lost", "o\x00ps", errors.RecoveryRequestControlCharacter, "operator reference"),
    ],
)
def test_each_text_rule_has_its_variant(
    reason: str, operator: str, expected: type[errors.RecoveryFieldInvalid], field: str
) -> None:
    def mark_failed() -> RecoveryRequest:
        return RecoveryRequest.mark_failed(0, reason, operator, DIGEST, FAILURE)

    def abandon() -> RecoveryRequest:
        return RecoveryRequest.abandon(0, reason, operator, DIGEST)

    for build in (mark_failed, abandon):
        with pytest.raises(expected) as caught:
            build()
        assert isinstance(caught.value, errors.RecoveryRequestError)
        assert caught.value.field == field
        assert str(pickle.loads(pickle.dumps(caught.value))) == str(caught.value)
    if isinstance(caught.value, errors.RecoveryRequestTooLong):
        assert caught.value.max_bytes == (64 if field == "reason code" else 128)


@pytest.mark.parametrize("digest", [b"", bytes(31), bytes(33)])
def test_an_evidence_digest_of_the_wrong_length_is_a_typed_error(digest: bytes) -> None:
    with pytest.raises(errors.RecoveryEvidenceDigestInvalid):
        RecoveryRequest.abandon(0, "lost", "ops", digest)
