"""Structured output through the official SDK: `chat.completions.parse` with a pydantic model
against random weights. Constrained decoding must make every reply parse and conform, whatever
the weights; the schema's bounds (string length, integer range, enum) keep a random model's
answer short enough to finish within max_tokens."""

from typing import Literal

import pytest
from pydantic import BaseModel, Field


class Pet(BaseModel):
    name: str = Field(max_length=10)
    age: int = Field(ge=0, le=30)
    kind: Literal["cat", "dog"]
    vaccinated: bool


class Household(BaseModel):
    city: str = Field(max_length=8)
    pets: list[Pet] = Field(max_length=2)


MESSAGES = [{"role": "user", "content": "Describe a pet as JSON."}]


def _parse(client, **kw):
    parse = getattr(client.chat.completions, "parse", None) or client.beta.chat.completions.parse
    return parse(**kw)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_parse_pydantic_model_thinking_off(client, model, seed):
    r = _parse(
        client, model=model, messages=MESSAGES, response_format=Pet, max_tokens=400, temperature=1, seed=seed,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    choice = r.choices[0]
    assert choice.finish_reason == "stop", choice
    pet = choice.message.parsed
    assert isinstance(pet, Pet)
    assert 0 <= pet.age <= 30 and pet.kind in ("cat", "dog") and len(pet.name) <= 10
    assert Pet.model_validate_json(choice.message.content) == pet


def test_parse_nested_model_with_thinking(client, model):
    # Thinking on (the default): reasoning is free, the answer after </think> is constrained.
    r = _parse(client, model=model, messages=MESSAGES, response_format=Household, max_tokens=800, temperature=1, seed=7)
    choice = r.choices[0]
    assert choice.finish_reason == "stop", choice
    assert isinstance(choice.message.parsed, Household)
    assert len(choice.message.parsed.pets) <= 2


def test_json_object_streaming(client, model):
    import json

    stream = client.chat.completions.create(
        model=model, messages=MESSAGES, max_tokens=300, temperature=1, seed=5, stream=True,
        response_format={"type": "json_object"},
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    text, finish = "", None
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
    if finish == "stop":
        assert isinstance(json.loads(text), dict), text
    else:
        # An unbounded object may run out of tokens; what was produced must still be a JSON prefix.
        assert finish == "length" and text.lstrip().startswith("{"), (finish, text)


def test_invalid_schema_is_a_400_naming_response_format(client, model):
    import openai

    bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "properties": {"a": {"$ref": "#/$defs/Nope"}}, "required": ["a"]}}}
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=10, response_format=bad)
    assert e.value.body["param"] == "response_format"
