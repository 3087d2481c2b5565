"""Typed payloads without a database: what a pydantic model and a dataclass check at enqueue,
what a stored payload becomes on the worker, their JSON Schema, and their registration."""

from __future__ import annotations

import enum
import json
import uuid
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time
from decimal import Decimal
from typing import Any, Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter
from pydantic.dataclasses import dataclass as pydantic_dataclass

from cronlock import App, ConfigurationError, DuplicateName, InvalidPayload
from cronlock.queue.enqueue import prepare
from cronlock.queue.payloads import SHOWN_ERRORS, model_of

# -- pydantic ---------------------------------------------------------------------------------


class SendEmail(BaseModel):
    to: str
    subject: str = Field(alias="Subject")
    user_id: int
    tags: list[str] = []


class Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")

    at: datetime
    score: float = 0.0


class Defaults(BaseModel):
    n: int = 1


@pydantic_dataclass
class Point:
    x: int
    y: int = 0


def _refused(model: Any, value: Any) -> InvalidPayload:
    with pytest.raises(InvalidPayload) as refused:
        model.dump(value, "the payload")
    return refused.value


def test_a_dict_is_checked_and_stored_as_given() -> None:
    model = model_of(SendEmail, "send_email", "payload")
    text = model.dump({"to": "a@b.c", "Subject": "Hi", "user_id": 3}, "the payload")
    assert json.loads(text) == {"to": "a@b.c", "Subject": "Hi", "user_id": 3}
    loaded = model.load(json.loads(text), "its payload")
    assert loaded == SendEmail(to="a@b.c", Subject="Hi", user_id=3)


def test_an_instance_is_stored_by_alias_and_loads_back_equal() -> None:
    model = model_of(SendEmail, "send_email", "payload")
    sent = SendEmail(to="a@b.c", Subject="Hi", user_id=3, tags=["x"])
    text = model.dump(sent, "the payload")
    assert json.loads(text) == {"to": "a@b.c", "Subject": "Hi", "user_id": 3, "tags": ["x"]}
    assert model.load(json.loads(text), "its payload") == sent


def test_a_wrong_field_is_one_error_naming_it() -> None:
    model = model_of(SendEmail, "send_email", "payload")
    refused = _refused(model, {"to": "a@b.c", "Subject": "Hi", "user_id": "three"})
    assert str(refused) == (
        "the payload does not fit SendEmail: user_id: Input should be a valid integer, unable "
        "to parse string as an integer"
    )
    assert refused.errors == [
        {
            "loc": ["user_id"],
            "msg": "Input should be a valid integer, unable to parse string as an integer",
            "type": "int_parsing",
        }
    ]
    missing = _refused(model, {"Subject": "Hi"})
    assert str(missing) == (
        "the payload does not fit SendEmail: to: Field required; user_id: Field required"
    )
    assert [error["type"] for error in missing.errors] == ["missing", "missing"]


def test_many_wrong_fields_show_the_first_few_and_keep_all() -> None:
    fields: dict[str, Any] = {f"f{i}": (int, ...) for i in range(SHOWN_ERRORS + 2)}
    from pydantic import create_model

    Many = create_model("Many", **fields)
    refused = _refused(model_of(Many, "many", "payload"), {})
    assert str(refused).endswith("f4: Field required (and 2 more)")
    assert len(refused.errors) == SHOWN_ERRORS + 2


def test_unknown_keys_follow_the_models_extra() -> None:
    lax = model_of(SendEmail, "send_email", "payload")
    lax.dump({"to": "a", "Subject": "s", "user_id": 1, "cc": "b"}, "the payload")  # ignored
    strict = model_of(Strict, "strict", "payload")
    refused = _refused(strict, {"at": "2026-12-02T10:00:00Z", "when": 1})
    assert refused.errors == [
        {"loc": ["when"], "msg": "Extra inputs are not permitted", "type": "extra_forbidden"}
    ]


def test_a_strict_model_takes_json_as_its_json_mode_does() -> None:
    # Python mode refuses a string for a strict datetime; the stored payload is JSON, so the
    # check is pydantic's JSON mode, at enqueue and on the worker alike.
    model = model_of(Strict, "strict", "payload")
    moment = datetime(2026, 12, 2, 10, 0, tzinfo=UTC)
    for value in ({"at": moment}, {"at": "2026-12-02T10:00:00Z"}, Strict(at=moment)):
        text = model.dump(value, "the payload")
        assert model.load(json.loads(text), "its payload").at == moment


class Constants(BaseModel):
    model_config = ConfigDict(ser_json_inf_nan="constants")

    score: float


def test_what_json_cannot_hold_is_refused_as_for_any_payload() -> None:
    strict = model_of(Strict, "strict", "payload")
    at = datetime.now(UTC)
    nan = _refused(strict, {"at": at, "score": float("nan")})
    assert str(nan).startswith("the payload is not JSON") and nan.errors == []
    # An instance is written as pydantic writes it: NaN as null by default, which the model
    # then refuses (its field named), or as a bare NaN, which jsonb refuses: refused here.
    written = _refused(strict, Strict(at=at, score=float("nan")))
    assert written.errors[0]["loc"] == ["score"]
    constants = _refused(model_of(Constants, "c", "payload"), Constants(score=float("inf")))
    assert str(constants).startswith("the payload is not JSON") and constants.errors == []
    email = model_of(SendEmail, "send_email", "payload")
    assert "NUL" in str(_refused(email, {"to": "a\x00", "Subject": "s", "user_id": 1}))
    assert "NUL" in str(_refused(email, SendEmail(to="a\x00", Subject="s", user_id=1)))
    lone = SendEmail(to="a\ud800", Subject="s", user_id=1)
    assert "lone surrogate" in str(_refused(email, lone))


def test_an_unvalidated_instance_is_checked_too() -> None:
    model = model_of(SendEmail, "send_email", "payload")
    built = SendEmail.model_construct(to=5, subject="s", user_id=1)
    refused = _refused(model, built)
    assert refused.errors[0]["loc"] == ["to"]


def test_other_values_are_refused_and_none_is_the_empty_object() -> None:
    model = model_of(SendEmail, "send_email", "payload")
    assert str(_refused(model, Point(x=1))) == (
        "the payload must be an instance of SendEmail or a JSON object (a dict), not Point"
    )
    assert str(_refused(model, None)).startswith("the payload does not fit SendEmail: to:")
    assert model_of(Defaults, "defaults", "payload").dump(None, "the payload") == "{}"


def test_a_stale_row_names_its_fields() -> None:
    model = model_of(SendEmail, "send_email", "payload")
    with pytest.raises(InvalidPayload) as stale:
        model.load({"to": "a", "subject": "renamed"}, "its payload")
    assert str(stale.value) == (
        "its payload does not fit SendEmail: Subject: Field required; user_id: Field required"
    )
    with pytest.raises(InvalidPayload, match="Input should be an object"):
        model.load([1, 2], "its payload")


def test_a_pydantic_dataclass_is_a_pydantic_model() -> None:
    model = model_of(Point, "point", "payload")
    assert model.load(json.loads(model.dump(Point(x=1), "p")), "p") == Point(x=1, y=0)
    assert _refused(model, {"x": "one"}).errors[0]["loc"] == ["x"]
    assert model.json_schema() == TypeAdapter(Point).json_schema()


def test_the_json_schema_is_pydantics_own() -> None:
    model = model_of(SendEmail, "send_email", "payload")
    assert model.json_schema() == SendEmail.model_json_schema()
    assert model.json_schema()["required"] == ["to", "Subject", "user_id"]


# -- dataclasses ------------------------------------------------------------------------------


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


@dataclass
class Address:
    city: str
    zip: str | None = None


@dataclass
class Order:
    to: str
    count: int
    at: datetime
    amount: Decimal
    color: Color
    ref: uuid.UUID
    kind: Literal["a", "b"] = "a"
    ratio: float = 1.0
    urgent: bool = False
    on: date | None = None
    until: time | None = None
    address: Address | None = None
    tags: list[str] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    anything: Any = None
    computed: int = field(default=0, init=False)


REF = uuid.UUID("12345678-1234-5678-1234-567812345678")
GOOD: dict[str, Any] = {
    "to": "a@b.c",
    "count": 2,
    "at": "2026-12-02T10:00:00+00:00",
    "amount": "12.30",
    "color": "red",
    "ref": str(REF),
}


def _order() -> Any:
    return model_of(Order, "order", "payload")


def test_a_dataclass_dict_is_checked_and_loaded_with_its_types() -> None:
    model = _order()
    text = model.dump({**GOOD, "ratio": 2, "address": {"city": "Lyon"}}, "the payload")
    order = model.load(json.loads(text), "its payload")
    assert order == Order(
        to="a@b.c",
        count=2,
        at=datetime(2026, 12, 2, 10, 0, tzinfo=UTC),
        amount=Decimal("12.30"),
        color=Color.RED,
        ref=REF,
        ratio=2.0,
        address=Address("Lyon"),
    )
    assert isinstance(order.ratio, float) and isinstance(order.address, Address)


def test_a_dataclass_instance_is_checked_and_stored_in_field_order() -> None:
    model = _order()
    order = Order(
        to="a@b.c",
        count=2,
        at=datetime(2026, 12, 2, 10, 0, tzinfo=UTC),
        amount=Decimal("12.30"),
        color=Color.BLUE,
        ref=REF,
        on=date(2026, 12, 2),
        until=time(10, 30),
        address=Address("Lyon", "69001"),
    )
    stored = json.loads(model.dump(order, "the payload"))
    assert list(stored) == [f for f in Order.__dataclass_fields__ if f != "computed"]
    assert stored["color"] == "blue" and stored["address"] == {"city": "Lyon", "zip": "69001"}
    assert model.load(stored, "its payload") == order
    # A dataclass does not check its types when built: the dump does.
    wrong = Order(**{**GOOD, "count": "2"})
    assert _refused(model, wrong).errors[0]["loc"] == ["count"]


@pytest.mark.parametrize(
    ("name", "value", "kind"),
    [
        ("to", 3, "string_type"),
        ("count", True, "int_type"),
        ("count", 2.0, "int_type"),
        ("ratio", "1", "float_type"),
        ("urgent", 1, "bool_type"),
        ("at", "yesterday", "datetime_type"),
        ("at", date(2026, 12, 2), "datetime_type"),
        ("on", datetime(2026, 12, 2, tzinfo=UTC), "date_type"),
        ("until", "25:00", "time_type"),
        ("amount", "NaN", "decimal_type"),
        ("amount", "twelve", "decimal_type"),
        ("ref", "not-a-uuid", "uuid_type"),
        ("color", "green", "enum"),
        ("kind", "c", "literal_error"),
        ("tags", "a,b", "list_type"),
        ("meta", [1], "dict_type"),
        ("address", "Lyon", "dataclass_type"),
    ],
)
def test_a_dataclass_checks_its_simple_fields(name: str, value: Any, kind: str) -> None:
    refused = _refused(_order(), {**GOOD, name: value})
    [error] = refused.errors
    assert (error["loc"], error["type"]) == ([name], kind)
    assert str(refused).startswith(f"the payload does not fit Order: {name}: Input should be")


def test_a_dataclass_refuses_unknown_and_missing_fields_naming_them() -> None:
    refused = _refused(_order(), {**{k: v for k, v in GOOD.items() if k != "to"}, "cc": "x"})
    assert refused.errors == [
        {"loc": ["to"], "msg": "Field required", "type": "missing"},
        {"loc": ["cc"], "msg": "Extra inputs are not permitted", "type": "extra_forbidden"},
    ]
    nested = _refused(_order(), {**GOOD, "address": {"zip": 69001}})
    assert [error["loc"] for error in nested.errors] == [["address", "city"], ["address", "zip"]]
    assert str(nested) == (
        "the payload does not fit Order: address.city: Field required; address.zip: Input "
        "should be a valid string (got int)"
    )
    assert _refused(_order(), {**GOOD, "computed": 1}).errors[0]["loc"] == ["computed"]


def test_a_dataclass_takes_each_simple_type_or_its_stored_form() -> None:
    model = _order()
    for value in (
        {**GOOD, "at": datetime(2026, 12, 2, 10, tzinfo=UTC), "ref": REF},
        {**GOOD, "amount": Decimal("12.30"), "color": Color.RED},
        {**GOOD, "amount": 12, "on": "2026-12-02", "until": "10:30:00"},
        {**GOOD, "amount": 12.5, "on": None, "address": None, "anything": {"x": [1]}},
    ):
        model.load(json.loads(model.dump(value, "the payload")), "its payload")


def test_a_stale_dataclass_row_names_its_fields() -> None:
    with pytest.raises(InvalidPayload) as stale:
        _order().load({**GOOD, "count": "2", "gone": 1}, "its payload")
    assert [error["loc"] for error in stale.value.errors] == [["count"], ["gone"]]
    assert str(stale.value).startswith("its payload does not fit Order: count: Input should")
    with pytest.raises(InvalidPayload, match="Input should be an instance of Order"):
        _order().load("text", "its payload")


@dataclass
class Node:
    name: str
    parent: Node | None = None


def test_a_dataclass_that_holds_itself_leaves_itself_unchecked() -> None:
    model = model_of(Node, "node", "payload")
    assert _refused(model, {"name": 1}).errors[0]["loc"] == ["name"]
    # Its own type inside it is passed through as a JSON value (no checking without end).
    loaded = model.load({"name": "a", "parent": {"name": 2}}, "its payload")
    assert loaded == Node("a", {"name": 2})  # type: ignore[arg-type]
    assert model.json_schema()["properties"]["parent"] == {"default": None}


@dataclass
class Unresolved:
    when: Later  # type: ignore[name-defined]  # noqa: F821 - on purpose: it does not resolve


def test_registration_refuses_what_is_no_model() -> None:
    app = App()
    with pytest.raises(ConfigurationError, match="payload must be a pydantic model or a dataclass"):
        app.job("t", payload=dict)
    with pytest.raises(ConfigurationError, match="result must be a pydantic model or a"):
        app.declare_job("t", result=Order(**GOOD))  # type: ignore[arg-type]  # an instance
    with pytest.raises(ConfigurationError, match="Unresolved's annotations do not resolve"):
        app.job("u", payload=Unresolved)


def test_a_declaration_and_its_handler_agree_on_their_models() -> None:
    app = App()
    app.declare_job("send", payload=Order)

    async def handler(session: Any, payload: Any) -> None:
        return None

    with pytest.raises(DuplicateName, match="declared with payload Order, but its handler has"):
        app.job("send", payload=Address)(handler)
    with pytest.raises(DuplicateName, match="declared with payload Order, but its handler has"):
        app.job("send")(handler)
    app.job("send", payload=Order)(handler)
    other = App()
    other.job("send", payload=Order, result=Address)(handler)
    with pytest.raises(DuplicateName, match="result none, but its handler has Address"):
        other.declare_job("send", payload=Order)


def test_enqueue_many_names_the_payload_that_does_not_fit() -> None:
    app = App()
    app.declare_job("order", payload=Order)
    with pytest.raises(InvalidPayload) as refused:
        prepare(app.job_types, "order", [GOOD, GOOD, {**GOOD, "count": "x"}])
    assert str(refused.value).startswith("payload 2 does not fit Order: count:")
    batch = prepare(app.job_types, "order", [GOOD])
    assert batch is not None and json.loads(batch.texts[0]) == GOOD


def test_a_dataclass_json_schema() -> None:
    assert model_of(Address, "a", "payload").json_schema() == {
        "title": "Address",
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "zip": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None},
        },
        "required": ["city"],
        "additionalProperties": False,
    }
    schema = _order().json_schema()
    assert schema["required"] == ["to", "count", "at", "amount", "color", "ref"]
    assert schema["properties"]["color"] == {"enum": ["red", "blue"]}
    assert schema["properties"]["kind"] == {"enum": ["a", "b"], "default": "a"}
    assert schema["properties"]["at"] == {"type": "string", "format": "date-time"}
    assert schema["properties"]["address"]["anyOf"][0]["title"] == "Address"
    assert schema["properties"]["anything"] == {"default": None}
    assert "computed" not in schema["properties"]
