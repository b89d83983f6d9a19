"""Third-party clients against `hostd serve` on the tiny fixture (random weights): litellm and
langchain-openai, as agents use them. Free-form text from random weights means nothing, so the
tests check what a client relies on: replies parse into each library's types, tool calls that
the server forces (`tool_choice`, constrained decoding) come back as valid calls, the agent loop
(call → tool result → next turn) is accepted, and structured output parses into the schema.
Schemas are bounded (string lengths, enums, ranges) so random weights finish within max_tokens.
"""

import json
import os

import pytest
from pydantic import BaseModel, Field

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network fetch at import

import litellm  # noqa: E402
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage  # noqa: E402
from langchain_openai import ChatOpenAI  # noqa: E402

NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}
# The libraries' own deprecation and pydantic warnings are not ours to fix.
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")


class GetWeather(BaseModel):
    """Current weather for a city."""

    city: str = Field(max_length=12)
    days: int = Field(ge=1, le=7)


class Pet(BaseModel):
    name: str = Field(max_length=10)
    kind: str = Field(json_schema_extra={"enum": ["cat", "dog"]})
    age: int = Field(ge=0, le=30)


WEATHER_TOOL = {
    "type": "function",
    "function": {"name": "GetWeather", "description": "Current weather for a city.", "parameters": GetWeather.model_json_schema()},
}


@pytest.fixture(scope="module")
def base_url() -> str:
    return os.environ["SLUICE_BASE_URL"]


@pytest.fixture(scope="module")
def api_key() -> str:
    return os.environ.get("SLUICE_API_KEY", "unused")


def test_litellm_chat_stream_and_forced_tool_call(base_url, api_key, model):
    kw = dict(model=f"openai/{model}", api_base=base_url, api_key=api_key, num_retries=0)
    # Thinking off, so that the 8 tokens reach the content and the stream comparison means something.
    r = litellm.completion(messages=[{"role": "user", "content": "Say hi."}], max_tokens=8, temperature=0, extra_body=NO_THINKING, **kw)
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.completion_tokens >= 1
    text = "".join(
        (c.choices[0].delta.content or "")
        for c in litellm.completion(
            messages=[{"role": "user", "content": "Say hi."}], max_tokens=8, temperature=0, stream=True, extra_body=NO_THINKING, **kw
        )
        if c.choices
    )
    # Greedy on a fixed fixture: the streamed deltas join to the non-streamed reply's content.
    assert text and text == r.choices[0].message.content
    r = litellm.completion(
        messages=[{"role": "user", "content": "Weather in Oslo?"}],
        tools=[WEATHER_TOOL],
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=300,
        temperature=0.8,
        seed=3,
        extra_body=NO_THINKING,
        **kw,
    )
    call = r.choices[0].message.tool_calls[0]
    assert r.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "GetWeather"
    GetWeather.model_validate(json.loads(call.function.arguments))


def llm(base_url, api_key, model, **kw) -> ChatOpenAI:
    return ChatOpenAI(
        model=model, base_url=base_url, api_key=api_key, max_retries=0, temperature=0.8, seed=5, max_tokens=300, extra_body=NO_THINKING, **kw
    )


def test_langchain_bind_tools_agent_loop(base_url, api_key, model):
    chat = llm(base_url, api_key, model)
    forced = chat.bind_tools([GetWeather], tool_choice="GetWeather", parallel_tool_calls=False)
    question = HumanMessage("What is the weather in Oslo for 3 days?")
    ai = forced.invoke([question])
    assert isinstance(ai, AIMessage) and len(ai.tool_calls) == 1, ai
    call = ai.tool_calls[0]
    assert call["name"] == "GetWeather"
    GetWeather.model_validate(call["args"])
    # The tool's result goes back as a ToolMessage; the next turn (tools offered, not forced)
    # must be accepted and answer.
    answer = chat.bind_tools([GetWeather]).invoke([question, ai, ToolMessage(content="Sunny, 21 °C", tool_call_id=call["id"])])
    assert isinstance(answer, AIMessage)
    assert isinstance(answer.content, str)


def test_langchain_with_structured_output(base_url, api_key, model):
    chat = llm(base_url, api_key, model)
    for method in ("json_schema", "function_calling"):
        pet = chat.with_structured_output(Pet, method=method).invoke("Describe a pet.")
        assert isinstance(pet, Pet), (method, pet)
        assert pet.kind in ("cat", "dog") and 0 <= pet.age <= 30 and len(pet.name) <= 10
