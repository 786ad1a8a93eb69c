"""Flow values: start limits (behaviour.md 2.13)."""

from __future__ import annotations

import attrs

from pybatch.errors import ZeroStartLimit

__all__ = ["StartLimit"]

_U32_MAX = 4_294_967_295


def _check_limit(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if type(value) is not int or value > _U32_MAX or value < 0:
        raise ValueError("a start limit is 1..4294967295")
    if value == 0:
        raise ZeroStartLimit()


@attrs.frozen
class StartLimit:
    """How many times a node may start in one instance, history included."""

    value: int = attrs.field(validator=_check_limit)

    UNRESTRICTED_VALUE = _U32_MAX

    @classmethod
    def unrestricted(cls) -> StartLimit:
        """No limit in practice: 4294967295 starts."""
        return cls(_U32_MAX)
