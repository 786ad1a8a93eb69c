"""Field helpers shared by the value modules: durable-code enums and attrs validators."""

from __future__ import annotations

import enum
from typing import Any, Self

import attrs

from pybatch.values.ids import Validator, check_version


class Code(enum.Enum):
    """An enum whose values are durable codes; `str()` is the code itself."""

    def __str__(self) -> str:
        return str(self.value)

    @classmethod
    def from_durable_code(cls, code: object) -> Self | None:
        """The member stored as `code`, or None for anything else (never coerced)."""
        return next((member for member in cls if member.value == code), None)


def is_(cls: type[Any]) -> Validator:
    return attrs.validators.instance_of(cls)


def maybe(cls: type[Any]) -> Validator:
    return attrs.validators.optional(attrs.validators.instance_of(cls))


def version(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    """An optimistic version 0..2^63-1 (an int, never a bool)."""
    if type(value) is not int:
        raise TypeError(f"{attribute.name} is an int")
    check_version(value)


def fixed_bytes(length: int) -> Validator:
    """A byte string of exactly `length` bytes (a digest, a token)."""

    def check(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
        if type(value) is not bytes or len(value) != length:
            raise ValueError(f"{attribute.name} is exactly {length} bytes")

    return check


#: A SHA-256 digest.
digest = fixed_bytes(32)


def optional_version(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None:
        version(instance, attribute, value)
