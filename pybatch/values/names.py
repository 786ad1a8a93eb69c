"""Validated names, definition tokens, state schema ids and request fields.

Names and tokens check empty -> too long (UTF-8 bytes) -> surrounding white space -> control
character, in that order; the first rule broken is reported, never the value.
"""

from __future__ import annotations

import re
from typing import ClassVar, NoReturn

import attrs

from pybatch import errors as e

#: Characters with the Unicode White_Space property (what Rust's `str::trim` strips). Python's
#: `str.strip()` also strips U+001C..U+001F, which would change the reported error.
UNICODE_WHITE_SPACE = frozenset(
    "\t\n\x0b\x0c\r \x85\xa0\u1680"
    + "".join(chr(code) for code in range(0x2000, 0x200B))
    + "\u2028\u2029\u202f\u205f\u3000"
)


#: Unicode categories Cc (control characters) and Cs (surrogates), which are fixed ranges: a
#: search in C instead of a category lookup per character (names are decoded on every read).
_CONTROL_CHARACTER = re.compile("[\x00-\x1f\x7f-\x9f]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def first_violation(value: str, max_bytes: int) -> tuple[e.TextRule | None, int] | None:
    """The first broken rule and a control character's index; (None, 0) is a lone surrogate."""
    if type(value) is not str:
        raise TypeError("a validated text value takes a str")
    if not value:
        return (e.TextRule.EMPTY, 0)
    # surrogatepass: a lone surrogate counts its 3 bytes here and is refused below.
    if len(value.encode("utf-8", "surrogatepass")) > max_bytes:
        return (e.TextRule.TOO_LONG, 0)
    if value[0] in UNICODE_WHITE_SPACE or value[-1] in UNICODE_WHITE_SPACE:
        return (e.TextRule.SURROUNDING_WHITESPACE, 0)
    if (control := _CONTROL_CHARACTER.search(value)) is not None:
        return (e.TextRule.CONTROL_CHARACTER, control.start())
    return (None, 0) if _SURROGATE.search(value) else None


@attrs.frozen(order=True)
class _Text:
    """Base of every validated text value (a name by default): one `value`, `str()` returns it."""

    value: str

    _KIND: ClassVar[str] = "name"
    _MAX_BYTES: ClassVar[int] = 128

    def __attrs_post_init__(self) -> None:
        type(self)._validate(self.value)

    @classmethod
    def _validate(cls, value: str) -> None:
        violation = first_violation(value, cls._MAX_BYTES)
        if violation is not None:
            rule, index = violation
            bound = cls._MAX_BYTES if rule is e.TextRule.TOO_LONG else None
            cls._refuse(rule, bound, index if rule is e.TextRule.CONTROL_CHARACTER else None)

    @classmethod
    def _refuse(cls, rule: e.TextRule | None, bound: int | None, index: int | None) -> NoReturn:
        """Raise the error of a broken `rule` (None: a lone surrogate, not UTF-8)."""
        if rule is None:
            raise e.TextNotUtf8(kind=f"{cls._KIND} name")
        raise e.NameInvalid(kind=cls._KIND, rule=rule, max_bytes=bound, character_index=index)

    def __str__(self) -> str:
        return self.value


class JobName(_Text):
    """The name of a job: at most 128 bytes, no surrounding white space, no control character."""

    _KIND = "job"


class StepName(_Text):
    """The name of a step within a job execution (same rules as JobName)."""

    _KIND = "step"


class ParameterName(_Text):
    """A job parameter name; its repr is redacted because names can describe values."""

    _KIND = "parameter"

    def __repr__(self) -> str:
        return "ParameterName(<redacted>)"


class ExitCode(_Text):
    """A flow- and operator-facing exit code (at most 64 bytes); applications may add codes."""

    _KIND = "exit code"
    _MAX_BYTES = 64


class _DefinitionToken(_Text):
    """A definition token validated with the DefinitionError leaves."""

    _KIND = "definition token"

    @classmethod
    def _refuse(cls, rule: e.TextRule | None, bound: int | None, index: int | None) -> NoReturn:
        if rule is None:
            raise e.TextNotUtf8(kind=cls._KIND)
        raise e.TokenInvalid(kind=cls._KIND, rule=rule, max_bytes=bound)


class NodeId(_DefinitionToken):
    """The stable logical id of a step, independent of its StepName."""

    _KIND = "node id"


class DefinitionRevision(_DefinitionToken):
    """An application-owned audit label of one restart-relevant definition."""

    _KIND = "definition revision"


class DefinitionUpgradeKey(_DefinitionToken):
    """An application-owned key naming one directed definition upgrade edge."""

    _KIND = "definition upgrade key"


class ClassifierRevision(_DefinitionToken):
    """A revision token of one bounded fault classifier (fault-state entries carry it)."""

    _KIND = "classifier revision"


class StateSchemaId(_DefinitionToken):
    """The application schema id of a checkpoint or execution context (a token's rules)."""

    _KIND = "state schema identifier"

    @classmethod
    def _refuse(cls, rule: e.TextRule | None, bound: int | None, index: int | None) -> NoReturn:
        if rule is not None:
            raise e.SchemaIdInvalid(rule=rule, max_bytes=bound)
        super()._refuse(rule, bound, index)


class _RequestField(_Text):
    """An operator request field: non-empty, bounded, restricted ASCII charset."""

    _CHARSET: ClassVar[re.Pattern[str]]

    @classmethod
    def _validate(cls, value: str) -> None:
        if type(value) is not str:
            raise TypeError("a validated text value takes a str")
        if not value:
            raise e.RequestFieldInvalid(field=cls._KIND, rule=e.TextRule.EMPTY)
        if len(value.encode("utf-8", "surrogatepass")) > cls._MAX_BYTES:
            raise e.RequestFieldInvalid(
                field=cls._KIND, rule=e.TextRule.TOO_LONG, max_bytes=cls._MAX_BYTES
            )
        if cls._CHARSET.fullmatch(value) is None:
            raise e.RequestFieldInvalid(field=cls._KIND, rule=e.TextRule.INVALID_CHARACTER)


class ActorRef(_RequestField):
    """An audit correlation of who asked (never a credential): `[A-Za-z0-9._:@-]`, 128 bytes."""

    _KIND = "actor reference"
    _CHARSET = re.compile(r"[A-Za-z0-9._:@-]+")


class ReasonCode(_RequestField):
    """A machine reason code for audit rows: `[A-Z0-9_]`, 64 bytes."""

    _KIND = "reason code"
    _MAX_BYTES = 64
    _CHARSET = re.compile(r"[A-Z0-9_]+")


class OperationId(_RequestField):
    """An idempotency key of an operator or retention request: `[A-Za-z0-9._:-]`, 64 bytes."""

    _KIND = "operation id"
    _MAX_BYTES = 64
    _CHARSET = re.compile(r"[A-Za-z0-9._:-]+")
