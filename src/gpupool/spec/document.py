"""From user input to a spec model: YAML text or a mapping in, a model or the first SpecError out.

YAML is read with YAML 1.2 scalar rules, not PyYAML's 1.1 defaults: only true/false are booleans (so the
key `on:` in `retry: {on: [preemption]}` stays the string "on", and `no`/`off` stay text), there are no
base-60 numbers (`1:30` is text) and no dates. A key given twice in one mapping is an error.
"""

from __future__ import annotations

import difflib
import re
import types
import typing
from collections.abc import Mapping
from typing import Any, Final, TypeVar

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from gpupool.spec.errors import MISSING, SpecError

ModelT = TypeVar("ModelT", bound=BaseModel)

YAML_FIELD: Final = "<yaml>"
TOP_LEVEL_FIELD: Final = "<spec>"

_BOOL_TAG: Final = "tag:yaml.org,2002:bool"
_INT_TAG: Final = "tag:yaml.org,2002:int"
_FLOAT_TAG: Final = "tag:yaml.org,2002:float"
_TIMESTAMP_TAG: Final = "tag:yaml.org,2002:timestamp"
_MERGE_TAG: Final = "tag:yaml.org,2002:merge"


class _SpecLoader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2 core-schema scalars and duplicate keys refused."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[tuple[str, str], int] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == _MERGE_TAG:
                continue
            key = (key_node.tag, key_node.value)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise SpecError(
                    YAML_FIELD,
                    key_node.value,
                    f"is given twice in one mapping (lines {seen[key]} and {line}); keep one",
                    "'queue: nlp' once",
                )
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def _yaml12_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    text = str(loader.construct_scalar(node))
    try:
        return int(text.replace("_", ""), 10)  # "010" is ten, not PyYAML's octal eight
    except ValueError:
        return int(loader.construct_yaml_int(node))  # an explicit `!!int 0x1f`


_SpecLoader.yaml_implicit_resolvers = {
    first: [
        (tag, rx) for tag, rx in resolvers if tag not in {_BOOL_TAG, _INT_TAG, _FLOAT_TAG, _TIMESTAMP_TAG}
    ]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_SpecLoader.add_implicit_resolver(
    _BOOL_TAG, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)
_SpecLoader.add_implicit_resolver(_INT_TAG, re.compile(r"^[-+]?[0-9]+$"), list("-+0123456789"))
_SpecLoader.add_implicit_resolver(
    _FLOAT_TAG,
    re.compile(
        r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+.0123456789"),
)
_SpecLoader.add_constructor(_INT_TAG, _yaml12_int)


def load_yaml(text: str, example: str) -> object:
    """The data in YAML text; SpecError at field "<yaml>" (with the line number) if it is not valid YAML."""
    try:
        return yaml.load(text, Loader=_SpecLoader)  # a SafeLoader subclass: no arbitrary objects
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or exc.context or "unreadable"
        if mark is None:
            raise SpecError(YAML_FIELD, text, f"is not valid YAML: {problem}", example) from None
        lines = text.splitlines()
        shown = lines[min(mark.line, len(lines) - 1)].strip() if lines else text
        raise SpecError(
            YAML_FIELD,
            shown,
            f"is not valid YAML: line {mark.line + 1}, column {mark.column + 1}: {problem}",
            example,
        ) from None
    except yaml.YAMLError as exc:
        raise SpecError(YAML_FIELD, text, f"is not valid YAML: {exc}", example) from None
    except RecursionError:
        raise SpecError(YAML_FIELD, text, "is not usable YAML: it is nested too deeply", example) from None


def load_mapping(data: object, what: str, example: str) -> dict[str, Any]:
    """The top-level mapping of a spec given as YAML text (str or UTF-8 bytes) or as a mapping."""
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise SpecError(YAML_FIELD, data[:40], f"is not UTF-8 text ({exc.reason})", example) from None
    if isinstance(data, str):
        data = load_yaml(data, example)
    if data is None:
        raise SpecError(TOP_LEVEL_FIELD, MISSING, f"is empty: a {what} needs its fields", example)
    if not isinstance(data, Mapping):
        raise SpecError(
            TOP_LEVEL_FIELD, data, f"is not a {what}: the top level must be a mapping of fields", example
        )
    for key in data:
        if not isinstance(key, str):
            raise SpecError(
                TOP_LEVEL_FIELD, key, f"is not a field name of a {what}: it must be text", example
            )
    return dict(data)


def validate_spec(model: type[ModelT], data: object, examples: Mapping[str, str], what: str) -> ModelT:
    """Load `data` and validate it as `model`, raising the first problem as a SpecError."""
    mapping = load_mapping(data, what, examples[""])
    try:
        return model.model_validate(mapping)
    except ValidationError as exc:
        raise spec_error(exc, model, examples, what) from None


def spec_error(
    exc: ValidationError, model: type[BaseModel], examples: Mapping[str, str], what: str
) -> SpecError:
    """The first problem of a pydantic ValidationError as a SpecError; unknown fields come first."""
    errors = exc.errors(include_url=False)
    # A misspelt field also makes its correct name "missing"; the misspelling is the helpful report.
    first = min(enumerate(errors), key=lambda pair: (pair[1]["type"] != "extra_forbidden", pair[0]))[1]
    return _convert(first, model, examples, what)


def example_for(path: str, examples: Mapping[str, str]) -> str:
    """The example for a dotted field path ("retry.on[0]" uses "retry.on"; "env.FOO" uses "env")."""
    key = re.sub(r"\[[^\]]*\]", "", path)
    while key:
        if key in examples:
            return examples[key]
        key = key.rpartition(".")[0]
    return examples[""]


def _path(loc: tuple[int | str, ...]) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text


def _join(loc: tuple[int | str, ...], field: str) -> str:
    """The full path of a SpecError raised by a validator at `loc` (see fields.py for the convention)."""
    if loc and isinstance(loc[-1], str) and re.match(re.escape(loc[-1]) + r"(?:$|[.\[])", field):
        loc = loc[:-1]
    prefix = _path(loc)
    if not prefix:
        return field
    return prefix + field if field.startswith("[") else f"{prefix}.{field}"


_PHRASES: Final[dict[str, str]] = {
    "int_type": "is not a whole number",
    "int_parsing": "is not a whole number",
    "int_from_float": "is not a whole number",
    "float_type": "is not a number",
    "float_parsing": "is not a number",
    "finite_number": "is not a finite number",
    "bool_type": "is not true or false",
    "bool_parsing": "is not true or false",
    "string_type": "is not text",
    "list_type": "is not a list",
    "dict_type": "is not a mapping",
    "model_type": "is not a mapping of fields",
    "model_attributes_type": "is not a mapping of fields",
    "string_too_short": "must not be empty",
    "too_short": "must not be empty",
}
_BOUNDS: Final[dict[str, tuple[str, str]]] = {
    "greater_than": ("gt", "must be greater than"),
    "greater_than_equal": ("ge", "must be at least"),
    "less_than": ("lt", "must be less than"),
    "less_than_equal": ("le", "must be at most"),
    "string_too_long": ("max_length", "is too long: at most this many characters:"),
}


def _whole(value: Any) -> Any:
    """A float that is a whole number as the integer people wrote (a quota of -2, not -2.0); a huge one
    as written (1e+18, not its nineteen digits)."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return int(value)
    return value


def _convert(
    error: ErrorDetails, model: type[BaseModel], examples: Mapping[str, str], what: str
) -> SpecError:
    loc = tuple(error["loc"])
    kind = error["type"]
    ctx = error.get("ctx", {})
    cause = ctx.get("error")
    if isinstance(cause, SpecError):
        field = _join(loc, cause.field)
        return SpecError(field, cause.value, cause.message, cause.example or example_for(field, examples))
    path = _path(loc) or TOP_LEVEL_FIELD
    if kind == "extra_forbidden":
        return _unknown_field(loc, model, examples, what)
    if kind == "missing":
        return SpecError(path, MISSING, "is required", example_for(path, examples))
    if kind == "literal_error":
        allowed = re.findall(r"'([^']*)'", str(ctx.get("expected", "")))
        close = difflib.get_close_matches(str(error["input"]), allowed, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        message = f"is not one of {', '.join(map(repr, allowed))}{hint}"
        return SpecError(path, error["input"], message, example_for(path, examples))
    if kind in _BOUNDS:
        key, phrase = _BOUNDS[kind]
        bound, given = _whole(ctx.get(key)), _whole(error["input"])
        return SpecError(path, given, f"{phrase} {bound}", example_for(path, examples))
    message = _PHRASES.get(kind) or "is not valid: " + error["msg"][:1].lower() + error["msg"][1:]
    return SpecError(path, error["input"], message, example_for(path, examples))


def _unknown_field(
    loc: tuple[int | str, ...], model: type[BaseModel], examples: Mapping[str, str], what: str
) -> SpecError:
    name = str(loc[-1])
    parent_loc = loc[:-1]
    parent = _model_at(model, parent_loc)
    parent_path = _path(parent_loc)
    where = f"a {what}" if not parent_path else repr(parent_path)
    valid = list(parent.model_fields) if parent is not None else []
    close = difflib.get_close_matches(name, valid, n=1, cutoff=0.6)
    if close:
        suggestion = close[0]
        full = f"{parent_path}.{suggestion}" if parent_path else suggestion
        message = f"is not a field of {where} (did you mean {suggestion!r}?)"
        example = f"{suggestion}: {example_for(full, examples)}"
    else:
        message = f"is not a field of {where} (its fields: {', '.join(valid)})"
        example = example_for(parent_path, examples) if parent_path else examples[""]
    path = f"{parent_path}.{name}" if parent_path else name
    return SpecError(path, name, message, example)


def _model_at(model: type[BaseModel], loc: tuple[int | str, ...]) -> type[BaseModel] | None:
    """The spec model found at `loc` inside `model` (through optional fields and list items), if any."""
    current = model
    items = False  # the last field was a list: an index comes next
    for part in loc:
        if items and isinstance(part, int):
            items = False
            continue
        if not isinstance(part, str) or part not in current.model_fields:
            return None
        annotation = current.model_fields[part].annotation
        candidates = typing.get_args(annotation) if _is_union(annotation) else (annotation,)
        if len(candidates) == 1 and typing.get_origin(candidates[0]) is list:
            candidates, items = typing.get_args(candidates[0]), True
        models = [c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)]
        if not models:
            return None
        current = models[0]
    return None if items else current


def _is_union(annotation: object) -> bool:
    return typing.get_origin(annotation) in {typing.Union, types.UnionType}
