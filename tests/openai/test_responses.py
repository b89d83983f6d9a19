"""The Responses API through the official openai SDK (`client.responses`) against `hostd serve` on
the tiny fixture (random weights): `create` and its typed `Response`, the `.stream()` accumulator
(which checks item identities and event order itself) against `create`, `.parse()` with a
pydantic model under constrained decoding, `previous_response_id`, `retrieve`/`delete`, and a
forced function call sent back with its `function_call_output`. Random weights never stop on
their own in time, so replies either end by a grammar (structured output, forced calls) or are
cut by `max_output_tokens` (status `incomplete`)."""

import json

import openai
import pytest
from openai.types.responses import Response
from pydantic import BaseModel, Field
from schemas import WEATHER_ARGUMENTS

NO_THINKING = {"effort": "none"}
GREEDY = {"temperature": 0}
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather for a city.",
    "parameters": {**WEATHER_ARGUMENTS, "additionalProperties": False},
    "strict": True,
}
FORCED = {"type": "function", "name": "get_weather"}


class Pet(BaseModel):
    name: str = Field(max_length=10)
    age: int = Field(ge=0, le=30)


def _check_call(call) -> dict:
    assert call.type == "function_call" and call.name == "get_weather" and call.status == "completed"
    assert call.id.startswith("fc_") and call.call_id.startswith("call_")
    args = json.loads(call.arguments)
    assert isinstance(args["city"], str) and len(args["city"]) <= 12
    assert isinstance(args["days"], int) and 1 <= args["days"] <= 7
    return args


def test_create_returns_a_typed_response(client, model):
    r = client.responses.create(
        model=model, input="Say hi.", instructions="Be brief.", max_output_tokens=8, reasoning=NO_THINKING,
        extra_body={"ignore_eos": True}, **GREEDY,
    )
    assert isinstance(r, Response)
    assert r.id.startswith("resp_") and r.object == "response" and r.model == model
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    assert [o.type for o in r.output] == ["message"]
    assert r.output_text == r.output[0].content[0].text and r.output_text
    assert r.usage.output_tokens == 8 and r.usage.total_tokens == r.usage.input_tokens + 8
    assert r.usage.output_tokens_details.reasoning_tokens == 0
    assert r.instructions == "Be brief."


def test_thinking_comes_back_as_a_reasoning_item(client, model):
    r = client.responses.create(model=model, input="Think.", max_output_tokens=6, reasoning={"effort": "high"}, **GREEDY)
    assert r.output[0].type == "reasoning" and r.output[0].summary == []
    assert r.output[0].content[0].type == "reasoning_text"
    assert r.usage.output_tokens_details.reasoning_tokens >= 1


def test_raw_stream_events_in_order(client, model):
    kw = dict(model=model, input="Say hi.", max_output_tokens=8, reasoning=NO_THINKING, extra_body={"ignore_eos": True}, **GREEDY)
    whole = client.responses.create(**kw)
    events = list(client.responses.create(stream=True, **kw))
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] == "response.incomplete"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == whole.output_text
    assert events[-1].response.output_text == whole.output_text


def test_stream_accumulates_a_parsed_response(client, model):
    kw = dict(model=model, input="Describe a pet.", text_format=Pet, max_output_tokens=200, reasoning=NO_THINKING, **GREEDY)
    parsed = client.responses.parse(**kw)
    assert parsed.status == "completed"
    assert isinstance(parsed.output_parsed, Pet) and len(parsed.output_parsed.name) <= 10
    with client.responses.stream(**kw) as stream:
        text = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
        final = stream.get_final_response()
    assert final.output_text == text == parsed.output_text
    assert final.output_parsed == parsed.output_parsed


def test_previous_response_id_retrieve_and_delete(client, model):
    kw = dict(model=model, max_output_tokens=4, reasoning=NO_THINKING, extra_body={"ignore_eos": True}, **GREEDY)
    first = client.responses.create(input="Remember the number 7.", **kw)
    second = client.responses.create(input="Which number?", previous_response_id=first.id, **kw)
    assert second.previous_response_id == first.id
    assert second.usage.input_tokens > first.usage.input_tokens + 3
    got = client.responses.retrieve(first.id)
    assert got.id == first.id and got.output_text == first.output_text
    client.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(input="x", previous_response_id=first.id, **kw)
    assert e.value.code == "previous_response_not_found"
    unstored = client.responses.create(input="x", store=False, **kw)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)


def test_forced_function_call_round_trip(client, model):
    question = [{"role": "user", "content": "What's the weather in Oslo?"}]
    kw = dict(model=model, tools=[WEATHER], reasoning=NO_THINKING, **GREEDY)
    r = client.responses.create(input=question, tool_choice=FORCED, parallel_tool_calls=False, max_output_tokens=200, **kw)
    assert r.status == "completed"
    calls = [o for o in r.output if o.type == "function_call"]
    assert len(calls) == 1
    args = _check_call(calls[0])

    # The stream's accumulator builds the same call from the argument deltas.
    with client.responses.stream(input=question, tool_choice=FORCED, parallel_tool_calls=False, max_output_tokens=200, **kw) as s:
        deltas = "".join(e.delta for e in s if e.type == "response.function_call_arguments.delta")
        final = s.get_final_response()
    streamed = [o for o in final.output if o.type == "function_call"]
    assert json.loads(deltas) == json.loads(streamed[0].arguments) == args

    # The agent loop: the output items appended as the SDK returned them, then the call's output.
    history = question + r.output + [{"type": "function_call_output", "call_id": calls[0].call_id, "output": "-3 C, snow"}]
    by_hand = client.responses.create(input=history, max_output_tokens=4, **kw)
    assert by_hand.status in ("completed", "incomplete")
    # The same by previous_response_id: the same prompt.
    chained = client.responses.create(
        previous_response_id=r.id, max_output_tokens=4,
        input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "-3 C, snow"}], **kw,
    )
    assert chained.usage.input_tokens == by_hand.usage.input_tokens
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(
            previous_response_id=r.id, max_output_tokens=4,
            input=[{"type": "function_call_output", "call_id": "call_nobody", "output": "x"}], **kw,
        )
    assert e.value.param == "input[0].call_id"
