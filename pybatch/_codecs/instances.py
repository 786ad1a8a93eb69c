"""Job instances: identifying-parameter documents and job_instance rows (docs/tables.md 3.8)."""

from __future__ import annotations

from pybatch._codecs import _primitives as p
from pybatch._codecs._jsonb import to_jsonb
from pybatch.errors import JsonNotEncodable, PyBatchError, Unavailable
from pybatch.values import parameters as pv
from pybatch.values._canonical import canonical_json
from pybatch.values.ids import JobInstanceId
from pybatch.values.names import JobName, ParameterName
from pybatch.values.records import JobInstance

IDENTIFYING_PARAMETERS_MAX_BYTES = 1024 * 1024

JOB_INSTANCE_COLUMNS = ("id", "job_name", "instance_key", "identifying_parameters", "created_at")

_ENVELOPE_MEMBERS = frozenset({"type", "identifying", "value"})
_KINDS_BY_TAG = {kind.json_tag: kind for kind in pv.ParameterValueKind}


def encode_identifying_parameters(key: pv.JobInstanceKey) -> dict[str, object]:
    """The `identifying_parameters` document of a key (docs/tables.md 3.8; at most 1 MiB)."""
    document: dict[str, object] = {
        name.value: {"type": param.kind.json_tag, "identifying": True, "value": param.value.value}
        for name, param in key.parameters.items()
    }
    if len(canonical_json(document)) > IDENTIFYING_PARAMETERS_MAX_BYTES:
        raise Unavailable()
    return document


def decode_identifying_parameters(
    document: object, *, column: str = "identifying_parameters"
) -> pv.JobParameters:
    """Decode an identifying-parameter document (1 MiB; exactly type, identifying=true, value)."""
    members = p.decode_json_object(document, column=column)
    try:
        size = len(canonical_json(members))
    except JsonNotEncodable:
        raise p.DecodeError(column) from None
    if size > IDENTIFYING_PARAMETERS_MAX_BYTES:
        raise p.DecodeError(column)
    pairs: list[tuple[ParameterName | str, pv.JobParameter]] = []
    for raw_name, envelope in members.items():
        name = p.decode_text_value(ParameterName, raw_name, column=column)
        if not isinstance(envelope, dict) or set(envelope) != _ENVELOPE_MEMBERS:
            raise p.DecodeError(column)
        tag = envelope["type"]
        kind = _KINDS_BY_TAG.get(tag) if type(tag) is str else None
        if kind is None or envelope["identifying"] is not True:
            raise p.DecodeError(column)
        try:
            value = pv.ParameterValue(kind, envelope["value"])
        except (PyBatchError, TypeError):
            raise p.DecodeError(column) from None
        pairs.append((name, pv.JobParameter(value, identifying=True)))
    return pv.JobParameters.from_pairs(pairs)  # a JSON object names each parameter once


def encode_job_instance_key(key: pv.JobInstanceKey) -> dict[str, object]:
    """Column values of a new job_instance row: job_name, instance_key, identifying_parameters."""
    return {
        "job_name": key.job_name.value,
        "instance_key": key.digest(),
        "identifying_parameters": to_jsonb(encode_identifying_parameters(key)),
    }


def decode_job_instance(row: p.Row) -> JobInstance:
    """Decode a job_instance row; `instance_key` must equal the digest recomputed from it."""
    values = p.row_columns(row, JOB_INSTANCE_COLUMNS)
    try:
        return JobInstance(
            id=JobInstanceId(p.int64_at(values, "id")),
            job_name=p.text_value_at(JobName, values, "job_name"),
            instance_key=p.digest_at(values, "instance_key"),
            created_at=p.aware_at(values, "created_at"),
            parameters=decode_identifying_parameters(values["identifying_parameters"]),
        )
    except ValueError:  # JobInstance recomputed the key from the name and parameters
        raise p.DecodeError("instance_key") from None
