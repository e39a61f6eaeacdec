"""Pydantic field types shared by the workload and queue specs: names, numbers, sizes, durations, GPUs.

Validators here raise SpecError whose `field` is the validated field's own name (info.field_name), maybe
followed by a sub-path ("env.FOO"); document.py prefixes the path of the enclosing spec. An empty
`example` means "use the spec's example table".
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Final

from pydantic import BeforeValidator, Field, PlainSerializer, PlainValidator, ValidationInfo

from gpupool.spec.errors import SpecError
from gpupool.spec.quantities import GpuRequest, parse_duration, parse_gpu_request, parse_size

NAME_PATTERN: Final = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
_NAME_RE: Final = re.compile(NAME_PATTERN)


def field_name(info: ValidationInfo, default: str) -> str:
    """The name of the field being validated, for error paths."""
    return info.field_name or default


def check_name(value: Any, field: str) -> str:
    """A DNS-label-like name: 1-63 lowercase letters, digits or '-', first and last a letter or digit, not
    digits alone (the command line reads those as an id: `gpupool cancel 4` is workload 4)."""
    if not isinstance(value, str):
        raise SpecError(field, value, "is not a name: it must be text", "'llama-finetune'")
    if re.fullmatch(r"[0-9]+", value):
        raise SpecError(
            field,
            value,
            "is not a valid name: it is digits alone, which the command line reads as an id; add a letter",
            f"'job-{value}'",
        )
    if _NAME_RE.fullmatch(value):
        return value
    cleaned = re.sub(r"[^a-z0-9-]+", "-", value.strip().lower()).strip("-")[:63].strip("-")
    example = repr(cleaned) if cleaned and _NAME_RE.fullmatch(cleaned) else "'llama-finetune'"
    raise SpecError(
        field,
        value,
        "is not a valid name: use 1-63 lowercase letters, digits or '-', "
        "starting and ending with a letter or digit",
        example,
    )


def _name(value: Any, info: ValidationInfo) -> str:
    return check_name(value, field_name(info, "name"))


def refuse_bool(value: Any, info: ValidationInfo) -> Any:
    # pydantic's lax mode reads true as 1; in a spec that is always a mistake.
    if isinstance(value, bool):
        raise SpecError(field_name(info, "value"), value, "is true/false, not a number", "")
    return value


def _gpu(value: Any, info: ValidationInfo) -> GpuRequest:
    return parse_gpu_request(value, field_name(info, "gpu"))


def _size(value: Any, info: ValidationInfo) -> int:
    return parse_size(value, field_name(info, "memory"))


def _seconds(value: Any, info: ValidationInfo) -> float:
    return parse_duration(value, field_name(info, "duration"))


Name = Annotated[str, BeforeValidator(_name), Field(pattern=NAME_PATTERN)]
"""A DNS-label-like name (workload, queue)."""

Whole = Annotated[int, BeforeValidator(refuse_bool)]
"""An integer; true/false refused."""

Number = Annotated[float, Field(allow_inf_nan=False), BeforeValidator(refuse_bool)]
"""A finite number; true/false refused. (Write Annotated[float, Field(<bounds>, allow_inf_nan=False),
BeforeValidator(refuse_bool)] for bounds inside `| None`, so JSON schema gets them as minimum/maximum.)"""

SizeBytes = Annotated[int, PlainValidator(_size, json_schema_input_type=str | int)]
"""Bytes; input "256GB", "64GiB" or an integer of bytes."""

Seconds = Annotated[float, PlainValidator(_seconds, json_schema_input_type=str | float)]
"""Seconds; input "12h", "1h30m", "90s" or a number of seconds."""

GpuRequestField = Annotated[
    GpuRequest,
    PlainValidator(_gpu, json_schema_input_type=str | int | float),
    PlainSerializer(str, return_type=str),
]
"""GPUs per node; input 8, "H100:8", "A100|H100:2", "80GB:1", 0.5; dumped as its canonical text."""
