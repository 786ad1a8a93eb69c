"""The liveness-lock key of a run: unpredictable without its owner token, stable with it."""

from __future__ import annotations

from pybatch.values.ownership import OwnerToken

INT64 = range(-(2**63), 2**63)


def test_the_liveness_key_depends_on_the_token_and_the_execution() -> None:
    token = OwnerToken(bytes(range(16)))
    key = token.liveness_key(7)
    assert key in INT64
    assert OwnerToken(bytes(range(16))).liveness_key(7) == key  # any process can probe it
    assert token.liveness_key(8) != key
    assert OwnerToken(bytes(range(1, 17))).liveness_key(7) != key


def test_fresh_tokens_give_keys_nobody_can_guess_in_advance() -> None:
    keys = {OwnerToken.generate().liveness_key(1) for _ in range(1000)}
    assert len(keys) == 1000
