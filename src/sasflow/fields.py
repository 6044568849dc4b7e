"""Field-by-field conversions of a unit's values, compiled once from the types.

A unit's values travel by field name between a transition's row (UnitChange),
the snapshot's records (StepRecord, CompensationRecord) and a store's row, so a
field declared on the types is carried everywhere with nothing else to change
(docs/architecture.md, "Adding a field"). A loop naming each field costs about
1.5 µs a copy, several times on the path of every step; so each conversion is
compiled once into one expression that names the fields, as dataclasses and
attrs compile the `__init__` of a class.

A store row holds an enum as its value, a bool as 0 or 1, and a value of any
type (a result) as JSON text; `as_row` and `from_row` say so once.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from typing import Any, cast

import msgspec
from msgspec import inspect

__all__ = ["as_row", "copier", "from_row"]

_encode = msgspec.json.encode
_decode = msgspec.json.decode


def _compile(name: str, parameters: str, expression: str, names: dict[str, Any]
             ) -> Callable[..., Any]:
    scope: dict[str, Any] = {}
    exec(f"def {name}({parameters}):\n    return {expression}", names, scope)
    return cast(Callable[..., Any], scope[name])


def _fields(struct: type[msgspec.Struct]) -> tuple[inspect.Field, ...]:
    info = inspect.type_info(struct)
    assert isinstance(info, inspect.StructType)
    return info.fields


def _kinds(struct: type[msgspec.Struct]) -> dict[str, str]:
    """Each field's kind as a row holds it: str enum, enum, bool, json or plain."""
    kinds = {}
    for field in _fields(struct):
        kind = field.type
        if isinstance(kind, inspect.UnionType):  # X | None
            kinds_of = [t for t in kind.types if not isinstance(t, inspect.NoneType)]
            kind = kinds_of[0] if len(kinds_of) == 1 else kind
        kinds[field.name] = ("str enum" if isinstance(kind, inspect.EnumType)
                             and issubclass(kind.cls, str) else
                             "enum" if isinstance(kind, inspect.EnumType) else
                             "bool" if isinstance(kind, inspect.BoolType) else
                             "json" if isinstance(kind, inspect.AnyType) else "plain")
    return kinds


def copier(source: type[msgspec.Struct], target: type[msgspec.Struct],
           fields: Iterable[str], *given: str) -> Callable[..., Any]:
    """`copy(value, *given)`: a `target` with `fields` taken from `value` (a `source`)
    and the `given` fields passed alongside."""
    taken = ", ".join(f"{f}=value.{f}" for f in fields if f not in given)
    passed = "".join(f", {f}={f}" for f in given)
    parameters = ", ".join(("value", *given))
    return _compile(f"{source.__name__}_to_{target.__name__}", parameters,
                    f"Target({taken}{passed})", {"Target": target})


def as_row(source: type[msgspec.Struct], columns: Iterable[str], **given: str
           ) -> Callable[..., dict[str, Any]]:
    """`row(value, **given)`: the dict of `columns`, each the field of `value` of that
    name as a row holds it, but those `given`: a column named there is the
    parameter of that name, or (`column="field"`) another field of `value`."""
    kinds = _kinds(source)
    parameters = [p for p in given.values() if p not in kinds]
    items = []
    for column in columns:
        if column in given and given[column] not in kinds:
            items.append(f"{column!r}: {given[column]}")
            continue
        field = given.get(column, column)
        value = f"value.{field}"
        items.append(f"{column!r}: " + {
            # a str enum is its value already (and `.value` is a slow descriptor)
            "str enum": value, "enum": f"{value}.value", "bool": f"int({value})",
            "json": f"None if {value} is None else encode({value}).decode()",
            "plain": value}[kinds[field]])
    return _compile(f"{source.__name__}_row", ", ".join(("value", *parameters)),
                    "{" + ", ".join(items) + "}", {"encode": _encode})


def from_row(target: type[msgspec.Struct], columns: Iterable[str], *,
             by_position: bool = False) -> Callable[..., Any]:
    """`record(row)`: a `target` from a row read by name, its fields that are columns;
    with `by_position`, from a row whose values come in the order of `columns` (a
    tuple, a JSON array), each read at the position its column's name has there."""
    position = {column: i for i, column in enumerate(columns)}
    kinds = _kinds(target)
    types = {field.name: field.type for field in _fields(target)}
    names: dict[str, Any] = {"Target": target, "decode": _decode}
    items = []
    for field in kinds:
        if field not in position:
            continue
        value = f"row[{position[field] if by_position else repr(field)}]"
        if kinds[field] in ("enum", "str enum"):
            kind = types[field]
            names[f"{field}_enum"] = _enum_of(kind)
            value = f"{field}_enum({value})"
        elif kinds[field] == "bool":
            value = f"bool({value})"
        elif kinds[field] == "json":
            value = f"None if {value} is None else decode({value})"
        items.append(f"{field}={value}")
    return _compile(f"{target.__name__}_from_{'values' if by_position else 'row'}", "row",
                    f"Target({', '.join(items)})", names)


def _enum_of(kind: Any) -> type[enum.Enum]:
    if isinstance(kind, inspect.UnionType):
        kind = next(t for t in kind.types if isinstance(t, inspect.EnumType))
    return cast(type[enum.Enum], kind.cls)
