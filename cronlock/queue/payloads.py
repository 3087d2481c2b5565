"""Typed payloads and results: a job type's model, a pydantic v2 model or a dataclass.

``@app.job("send_email", payload=SendEmail)`` (and ``declare_job``) gives the type a model
(``jobs.PayloadModel``, made here by ``model_of``) which every enqueue asks before anything is
written (``enqueue.prepare``, on every surface) and the attempt asks once more, to turn the
stored JSON into what the handler receives (``attempt.py``, every commit and queue mode);
``result=`` checks what the handler returns the same way. Each kind of model answers three
questions:

- ``dump(value, what)``: a payload (an instance of the model, a mapping, or ``None`` for
  ``{}``) as the JSON text to store, or one ``InvalidPayload`` whose line names the fields
  that do not fit (and whose ``errors`` lists them, pydantic's shape);
- ``load(value, what)``: a stored JSON value as the model (an ``InvalidPayload`` when it no
  longer fits: the model changed since the job was enqueued);
- ``json_schema()``: what an HTTP producer in another language checks its payloads with
  (``GET /job-types``).

What each kind checks:

- **pydantic** (a ``BaseModel`` or a pydantic dataclass, through one ``TypeAdapter``): all the
  model says, in pydantic's JSON mode, on the very JSON text that is stored; the worker
  validates that text the same way, so a payload accepted at enqueue loads on the worker
  unless the model changed. An instance is written as pydantic writes it to JSON (by alias;
  a NaN float as pydantic's ``ser_json_inf_nan`` says, ``null`` by default) and that JSON
  validated; a mapping is encoded as every payload is (``jobs.to_json``: NaN refused),
  validated, and stored as given. Unknown keys follow the model's ``extra`` (pydantic
  ignores them unless ``extra="forbid"``).
- **a dataclass** (nothing to install): the field names (an unknown key is refused), the
  required fields (those without a default), and the types of simple fields: ``str``,
  ``int`` (not ``bool``), ``float`` (an int too), ``bool``, ``list``/``list[X]`` and
  ``dict``/``dict[K, V]`` (the container only, not its items), ``datetime``, ``date``,
  ``time``, ``Decimal``, ``UUID``, an ``Enum`` and a ``Literal`` (the value itself or its
  stored JSON form: an ISO string, a number or numeric string, the enum's value), a nested
  dataclass (checked the same way, unless it is one the field is already inside: a tree's
  children are not checked), and ``X | None`` of any of these. Any other annotation is
  passed through unchecked, as the JSON value. The handler gets ``Model(**fields)`` with
  those types restored; ``__post_init__`` runs there, on the worker, not at enqueue.

pydantic is never imported here: a class is a pydantic model only if pydantic is loaded
already (its class statement needed it), so ``import cronlock`` and an app of dataclasses
never load it.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import operator
import sys
import types
import typing
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import date, datetime, time
from decimal import Decimal, InvalidOperation
from typing import Any, Final

from ..errors import ConfigurationError, InvalidPayload
from .jobs import PayloadModel, to_json

__all__ = ["DataclassModel", "PydanticModel", "model_of"]

# How many field errors a line shows (all of them are in InvalidPayload.errors).
SHOWN_ERRORS: Final = 5


def model_of(cls: Any, job_type: str, option: str) -> PayloadModel:
    """The model of ``cls`` for ``job_type``'s ``option`` (``payload``, ``result``); a
    ``ConfigurationError`` in one line for anything but a pydantic model or a dataclass."""
    if _is_pydantic(cls):
        return PydanticModel(cls)
    if isinstance(cls, type) and dataclasses.is_dataclass(cls):
        try:
            return DataclassModel(cls)
        except (NameError, TypeError) as exc:  # an annotation that does not resolve
            raise ConfigurationError(
                f"job type {job_type!r}: the {option} dataclass {cls.__qualname__}'s "
                f"annotations do not resolve: {exc}"
            ) from None
    raise ConfigurationError(
        f"job type {job_type!r}: {option} must be a pydantic model or a dataclass (the "
        f"class), not {cls!r}"
    )


def _is_pydantic(cls: Any) -> bool:
    pydantic = sys.modules.get("pydantic")
    if pydantic is None or not isinstance(cls, type):
        return False
    if not hasattr(pydantic, "TypeAdapter"):  # pydantic 1
        if issubclass(cls, pydantic.BaseModel):
            raise ConfigurationError(
                "typed payloads need pydantic 2: pip install 'cronlock[pydantic]'"
            )
        return False
    from pydantic.dataclasses import is_pydantic_dataclass

    return issubclass(cls, pydantic.BaseModel) or is_pydantic_dataclass(cls)


def _mismatch(what: str, name: str, errors: Sequence[dict[str, Any]]) -> InvalidPayload:
    """One line naming the fields that do not fit (the first few), and all of them."""
    shown = "; ".join(_described(error) for error in errors[:SHOWN_ERRORS])
    more = len(errors) - SHOWN_ERRORS
    tail = f" (and {more} more)" if more > 0 else ""
    return InvalidPayload(f"{what} does not fit {name}: {shown}{tail}", errors)


def _described(error: Mapping[str, Any]) -> str:
    where = ".".join(str(part) for part in error["loc"])
    return f"{where}: {error['msg']}" if where else str(error["msg"])


def _not_a_payload(what: str, name: str, value: Any) -> InvalidPayload:
    return InvalidPayload(
        f"{what} must be an instance of {name} or a JSON object (a dict), not "
        f"{type(value).__name__}"
    )


# -- pydantic ---------------------------------------------------------------------------------


class PydanticModel:
    """A pydantic v2 model (or pydantic dataclass), checked in JSON mode on the stored text."""

    def __init__(self, cls: type[Any]) -> None:
        from pydantic import TypeAdapter, ValidationError

        self.cls = cls
        self.name = cls.__qualname__
        self._adapter: Any = TypeAdapter(cls)
        self._invalid = ValidationError
        self._schema: dict[str, Any] | None = None

    def __repr__(self) -> str:
        return f"PydanticModel({self.name})"

    def dump(self, value: Any, what: str) -> str:
        if value is None:
            text = "{}"
        elif type(value) is dict or (
            isinstance(value, Mapping) and not isinstance(value, self.cls)
        ):
            text = to_json(value, what)
        elif isinstance(value, self.cls):
            text = self._dumped(value, what)
        else:
            raise _not_a_payload(what, self.name, value)
        self._validated(text, what)
        return text

    def _dumped(self, value: Any, what: str) -> str:
        """An instance as pydantic writes it to JSON (by alias), in one pass; the careful way
        (pydantic's JSON-mode Python values, then ``to_json``) only for text jsonb refuses or
        that may hold it, so that it is refused with the line every payload gets."""
        # warnings=False: a field holding the wrong type (model_construct, an assignment)
        # is the validation's to report, just after.
        try:
            text: str = self._adapter.dump_json(value, by_alias=True, warnings=False).decode()
        except ValueError:  # PydanticSerializationError: a lone surrogate, a serializer's
            text = "NaN"  # the careful way says what
        if "NaN" not in text and "Infinity" not in text and "\\u0000" not in text:
            return text
        try:
            plain = self._adapter.dump_python(value, mode="json", by_alias=True, warnings=False)
        except ValueError as exc:
            raise InvalidPayload(f"{what}: {self.name} could not be serialized: {exc}") from None
        return to_json(plain, what)

    def load(self, value: Any, what: str) -> Any:
        return self._validated(to_json(value, what), what)

    def _validated(self, text: str, what: str) -> Any:
        try:
            # The adapter's core validator itself: its wrapper costs a third as much again.
            return self._adapter.validator.validate_json(text)
        except self._invalid as exc:
            errors = [
                {"loc": list(error["loc"]), "msg": error["msg"], "type": error["type"]}
                for error in exc.errors(include_url=False, include_input=False)
            ]
            raise _mismatch(what, self.name, errors) from None

    def json_schema(self) -> dict[str, Any]:
        if self._schema is None:  # made once: pydantic takes milliseconds to build one
            self._schema = self._adapter.json_schema(mode="validation")
        return self._schema


# -- dataclasses ------------------------------------------------------------------------------


class _Wrong(Exception):
    """Values that do not fit, each as (its place below the field, type, message)."""

    def __init__(self, errors: list[dict[str, Any]]) -> None:
        self.errors = errors

    @classmethod
    def one(cls, kind: str, msg: str) -> _Wrong:
        return cls([{"loc": [], "msg": msg, "type": kind}])

    def at(self, *where: Any) -> list[dict[str, Any]]:
        return [{**error, "loc": [*where, *error["loc"]]} for error in self.errors]


class _Kind:
    """How a dataclass field's values are checked at enqueue (``check``: the value, or what
    ``to_json`` can encode in its place) and turned back into its type on the worker
    (``load``); both raise ``_Wrong``. ``passes`` are the types ``check`` returns unchanged
    whatever their value, ``kept`` those ``load`` does: the fields' loops skip the call for
    them (None: every type). This one checks nothing (its schema takes anything)."""

    passes: frozenset[type] | None = None
    kept: frozenset[type] | None = None

    def json_schema(self) -> dict[str, Any]:
        return {}

    def check(self, value: Any) -> Any:
        return value

    def load(self, value: Any) -> Any:
        return value


_ANY: Final = _Kind()  # an annotation this does not check: the JSON value as it is


def _got(value: Any) -> str:
    return type(value).__name__


class _Leaf(_Kind):
    """A simple type: ``accepts`` at enqueue (the type itself, or its stored JSON form),
    ``parse`` of the stored form on the worker (None: the value is the type already)."""

    def __init__(
        self,
        code: str,
        label: str,
        schema: dict[str, Any],
        accepts: Callable[[Any], bool],
        parse: Callable[[Any], Any] | None = None,
        *,
        passes: tuple[type, ...] = (),
        kept: tuple[type, ...] = (),
    ) -> None:
        self.code = code
        self.label = label
        self.schema = schema
        self.accepts = accepts
        self.parse = parse
        self.passes = frozenset(passes)
        self.kept = frozenset(kept)

    def json_schema(self) -> dict[str, Any]:
        return self.schema

    def wrong(self, value: Any) -> _Wrong:
        return _Wrong.one(self.code, f"Input should be {self.label} (got {_got(value)})")

    def check(self, value: Any) -> Any:
        if not self.accepts(value):
            raise self.wrong(value)
        return value

    def load(self, value: Any) -> Any:
        if not self.accepts(value):
            raise self.wrong(value)
        if self.parse is None:
            return value
        try:
            return self.parse(value)
        except (ValueError, TypeError, ArithmeticError):
            raise self.wrong(value) from None


def _reads(parse: Callable[[str], Any], value: Any) -> bool:
    """Whether ``value`` is a string ``parse`` reads."""
    if not isinstance(value, str):
        return False
    try:
        parse(value)
    except (ValueError, TypeError, ArithmeticError):
        return False
    return True


def _parses(parse: Callable[[str], Any], kind: type) -> Callable[[Any], bool]:
    """Accepts a ``kind`` or a string ``parse`` reads."""
    return lambda value: isinstance(value, kind) or _reads(parse, value)


def _loads(parse: Callable[[str], Any], kind: type) -> Callable[[Any], Any]:
    """A ``kind`` as it is, or a string ``parse`` reads as one."""
    return lambda value: value if isinstance(value, kind) else parse(value)


def _finite_decimal(value: Any) -> Decimal:
    number = value if isinstance(value, Decimal) else Decimal(str(value))
    if not number.is_finite():
        raise InvalidOperation(f"{value!r} is not a finite number")
    return number


def _decimal_accepts(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, Decimal | int):
        return not isinstance(value, Decimal) or value.is_finite()
    if isinstance(value, str):
        try:
            _finite_decimal(value)
        except (ValueError, ArithmeticError):
            return False
        return True
    return False


def _date_only(value: Any) -> bool:
    # A datetime is a date too, but not one a date field takes: its time would be lost.
    return type(value) is date or _reads(date.fromisoformat, value)


_STRING: Final = {"type": "string"}
_LEAVES: Final[dict[Any, _Leaf]] = {
    str: _Leaf(
        "string_type",
        "a valid string",
        _STRING,
        lambda v: isinstance(v, str),
        passes=(str,),
        kept=(str,),
    ),
    int: _Leaf(
        "int_type",
        "a valid integer",
        {"type": "integer"},
        lambda v: isinstance(v, int) and not isinstance(v, bool),
        passes=(int,),
        kept=(int,),
    ),
    float: _Leaf(
        "float_type",
        "a valid number",
        {"type": "number"},
        lambda v: isinstance(v, int | float) and not isinstance(v, bool),
        float,
        passes=(int, float),
        kept=(float,),
    ),
    bool: _Leaf(
        "bool_type",
        "a valid boolean",
        {"type": "boolean"},
        lambda v: v is True or v is False,
        passes=(bool,),
        kept=(bool,),
    ),
    list: _Leaf(
        "list_type",
        "a valid list",
        {"type": "array"},
        lambda v: isinstance(v, list | tuple),
        passes=(list, tuple),
        kept=(list,),
    ),
    dict: _Leaf(
        "dict_type",
        "a valid dictionary",
        {"type": "object"},
        lambda v: isinstance(v, Mapping),
        passes=(dict,),
        kept=(dict,),
    ),
    datetime: _Leaf(
        "datetime_type",
        "a valid datetime (or its ISO 8601 string)",
        {"type": "string", "format": "date-time"},
        _parses(datetime.fromisoformat, datetime),
        _loads(datetime.fromisoformat, datetime),
        passes=(datetime,),
    ),
    date: _Leaf(
        "date_type",
        "a valid date (or its ISO 8601 string)",
        {"type": "string", "format": "date"},
        _date_only,
        _loads(date.fromisoformat, date),
        passes=(date,),
    ),
    time: _Leaf(
        "time_type",
        "a valid time (or its ISO 8601 string)",
        {"type": "string", "format": "time"},
        _parses(time.fromisoformat, time),
        _loads(time.fromisoformat, time),
        passes=(time,),
    ),
    Decimal: _Leaf(
        "decimal_type",
        "a valid decimal (a finite number or numeric string)",
        {"anyOf": [{"type": "number"}, {"type": "string"}]},
        _decimal_accepts,
        _finite_decimal,
    ),
    uuid.UUID: _Leaf(
        "uuid_type",
        "a valid UUID",
        {"type": "string", "format": "uuid"},
        _parses(uuid.UUID, uuid.UUID),
        _loads(uuid.UUID, uuid.UUID),
        passes=(uuid.UUID,),
    ),
}


def _choices(values: Sequence[Any]) -> str:
    shown = [repr(v) for v in values]
    return shown[0] if len(shown) == 1 else ", ".join(shown[:-1]) + " or " + shown[-1]


class _Enum(_Kind):
    """A member of the enum, or one of its values (what is stored)."""

    def __init__(self, cls: type[enum.Enum]) -> None:
        self.cls = cls
        self.values = [member.value for member in cls]
        self.passes = frozenset({cls})
        self.kept = frozenset()

    def json_schema(self) -> dict[str, Any]:
        return {"enum": self.values}

    def check(self, value: Any) -> Any:
        self.load(value)
        return value

    def load(self, value: Any) -> Any:
        if isinstance(value, self.cls):
            return value
        try:
            return self.cls(value)
        except (ValueError, TypeError):
            raise _Wrong.one(
                "enum", f"Input should be {_choices(self.values)} (got {value!r})"
            ) from None


class _Literal(_Kind):
    def __init__(self, values: Sequence[Any]) -> None:
        self.values = list(values)
        self.passes = self.kept = frozenset()

    def json_schema(self) -> dict[str, Any]:
        return {"enum": self.values}

    def check(self, value: Any) -> Any:
        # bool is an int: True == 1, so a Literal[1] must not take True (nor 1 a True).
        if not any(value == v and type(value) is type(v) for v in self.values):
            raise _Wrong.one(
                "literal_error", f"Input should be {_choices(self.values)} (got {value!r})"
            )
        return value

    load = check


class _Optional(_Kind):
    def __init__(self, inner: _Kind) -> None:
        self.inner = inner
        none = frozenset({type(None)})
        self.passes = None if inner.passes is None else inner.passes | none
        self.kept = None if inner.kept is None else inner.kept | none

    def json_schema(self) -> dict[str, Any]:
        inner = self.inner.json_schema()
        return {"anyOf": [inner, {"type": "null"}]} if inner else {}

    def check(self, value: Any) -> Any:
        return None if value is None else self.inner.check(value)

    def load(self, value: Any) -> Any:
        return None if value is None else self.inner.load(value)


class _Nested(_Kind):
    def __init__(self, model: DataclassModel) -> None:
        self.model = model
        self.passes = self.kept = frozenset()

    def json_schema(self) -> dict[str, Any]:
        return self.model.json_schema()

    def check(self, value: Any) -> Any:
        return _collected(self.model.checked, value)

    def load(self, value: Any) -> Any:
        return _collected(self.model.loaded, value)


def _collected(walk: Callable[[Any, list[Any], list[dict[str, Any]]], Any], value: Any) -> Any:
    """``walk``'s answer for ``value`` (a ``DataclassModel``'s ``checked`` or ``loaded``), or
    the errors it found as one ``_Wrong``."""
    errors: list[dict[str, Any]] = []
    answer = walk(value, [], errors)
    if errors:
        raise _Wrong(errors)
    return answer


def _kind_of(hint: Any, seen: frozenset[type]) -> _Kind:
    origin = typing.get_origin(hint)
    if origin is typing.Union or origin is types.UnionType:
        rest = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        if len(rest) == 1 and len(typing.get_args(hint)) == 2:
            return _Optional(_kind_of(rest[0], seen))
        return _ANY  # any other union: not checked
    if origin is typing.Literal:
        return _Literal(typing.get_args(hint))
    if origin is list or origin is dict:
        return _LEAVES[origin]
    if not isinstance(hint, type):
        return _ANY
    if hint in _LEAVES:
        return _LEAVES[hint]
    if issubclass(hint, enum.Enum):
        return _Enum(hint)
    if dataclasses.is_dataclass(hint):
        # A dataclass that holds itself (a tree): the inner one is a JSON value, unchecked.
        return _ANY if hint in seen else _Nested(DataclassModel(hint, seen))
    return _ANY


_MISSING: Final = object()
_JSON_DEFAULTS: Final = (str, int, float, bool, type(None))


class DataclassModel:
    """A dataclass, checked by its field names, its required fields and the types of its
    simple fields (this module's paragraph says which)."""

    def __init__(self, cls: type[Any], seen: frozenset[type] = frozenset()) -> None:
        self.cls = cls
        self.name = cls.__qualname__
        hints = typing.get_type_hints(cls)
        inside = seen | {cls}
        fields = [field for field in dataclasses.fields(cls) if field.init]
        self._fields = tuple(
            (
                field.name,
                _kind_of(hints.get(field.name, Any), inside),
                field.default is dataclasses.MISSING
                and field.default_factory is dataclasses.MISSING,
            )
            for field in fields
        )
        self._names = frozenset(field.name for field in fields)
        self._order = tuple(field.name for field in fields)
        # An instance's fields at once (one C call; a tuple, or one value for one field).
        self._values = operator.attrgetter(*self._order) if self._order else None
        self._accepted = (cls, Mapping)
        self._defaults = {
            field.name: field.default
            for field in fields
            if type(field.default) in _JSON_DEFAULTS
            and not (isinstance(field.default, float) and not math.isfinite(field.default))
        }

    def __repr__(self) -> str:
        return f"DataclassModel({self.name})"

    def dump(self, value: Any, what: str) -> str:
        if value is not None and not isinstance(value, self._accepted):
            raise _not_a_payload(what, self.name, value)
        try:
            checked = _collected(self.checked, {} if value is None else value)
        except _Wrong as wrong:
            raise _mismatch(what, self.name, wrong.errors) from None
        return to_json(checked, what)

    def load(self, value: Any, what: str) -> Any:
        try:
            return _collected(self.loaded, value)
        except _Wrong as wrong:
            raise _mismatch(what, self.name, wrong.errors) from None

    def checked(self, value: Any, loc: list[Any], errors: list[dict[str, Any]]) -> Any:
        """``value`` (an instance or a mapping) as ``to_json`` can encode it: the mapping
        itself, or one with nested instances as dicts; what does not fit, in ``errors``."""
        if isinstance(value, self.cls):
            data: Mapping[Any, Any] = self._fields_of(value)
        elif isinstance(value, Mapping):
            data = value
        else:
            errors.append(_not_a_mapping(self.name, value, loc))
            return value
        changed: dict[Any, Any] | None = None
        present = 0
        for name, kind, required in self._fields:
            item = data.get(name, _MISSING)
            if item is _MISSING:
                if required:
                    errors.append({"loc": [*loc, name], "msg": "Field required", "type": "missing"})
                continue
            present += 1
            passes = kind.passes
            if passes is None or type(item) in passes:
                continue
            try:
                checked = kind.check(item)
            except _Wrong as wrong:
                errors.extend(wrong.at(*loc, name))
                continue
            if checked is not item:
                changed = dict(data) if changed is None else changed
                changed[name] = checked
        if present < len(data):
            errors.extend(self._unknown(data, loc))
        return data if changed is None else changed

    def _fields_of(self, value: Any) -> dict[str, Any]:
        """An instance's fields by name, in their order: its own ``__dict__`` when that holds
        as many (read here, never changed: a nested field that changes is copied), else
        read one by one (slots, ``init=False`` fields, attributes added since)."""
        attributes = getattr(value, "__dict__", None)
        if attributes is not None and len(attributes) == len(self._order):
            own: dict[str, Any] = attributes
            return own
        if self._values is None:
            return {}
        got = self._values(value)
        return dict(zip(self._order, got if len(self._order) > 1 else (got,), strict=True))

    def loaded(self, value: Any, loc: list[Any], errors: list[dict[str, Any]]) -> Any:
        """A stored JSON object as an instance (None when something in it does not fit:
        then it is in ``errors``)."""
        if not isinstance(value, Mapping):
            errors.append(_not_a_mapping(self.name, value, loc))
            return None
        before = len(errors)
        fields: dict[str, Any] = {}
        for name, kind, required in self._fields:
            item = value.get(name, _MISSING)
            if item is _MISSING:
                if required:
                    errors.append({"loc": [*loc, name], "msg": "Field required", "type": "missing"})
                continue
            kept = kind.kept
            if kept is None or type(item) in kept:
                fields[name] = item
                continue
            try:
                fields[name] = kind.load(item)
            except _Wrong as wrong:
                errors.extend(wrong.at(*loc, name))
        if len(fields) < len(value):
            errors.extend(self._unknown(value, loc))
        if len(errors) > before:
            return None
        return self.cls(**fields)

    def _unknown(self, data: Mapping[Any, Any], loc: list[Any]) -> list[dict[str, Any]]:
        return [
            {"loc": [*loc, key], "msg": "Extra inputs are not permitted", "type": "extra_forbidden"}
            for key in data
            if key not in self._names
        ]

    def json_schema(self) -> dict[str, Any]:
        properties: dict[str, Any] = {}
        for name, kind, _required in self._fields:
            schema = dict(kind.json_schema())
            if name in self._defaults:
                schema["default"] = self._defaults[name]
            properties[name] = schema
        return {
            "title": self.name,
            "type": "object",
            "properties": properties,
            "required": [name for name, _kind, required in self._fields if required],
            "additionalProperties": False,
        }


def _not_a_mapping(name: str, value: Any, loc: list[Any]) -> dict[str, Any]:
    return {
        "loc": list(loc),
        "msg": f"Input should be an instance of {name} or a dictionary (got {_got(value)})",
        "type": "dataclass_type",
    }
