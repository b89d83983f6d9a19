"""The OpenAI Agents SDK (`openai-agents`) against `hostd serve` on the tiny fixture: the two
failures issue 39 found with it. Random weights make every free choice meaningless, so both
runs force what matters (`tool_choice="required"`, constrained decoding) and bound every string.

- A function tool with an optional string argument (`Optional[str]`, which the SDK's strict
  schema writes as `anyOf: [string, null]`) must receive the value itself, never the value
  wrapped in literal quotes; before the fix every such call reached the tool as '"text"'.
- An agent with an `output_type` and `tool_choice="required"` sends a response format and a
  forced tool choice together; the server refused that with 400, so the agent could not run.
"""

import os
from typing import Annotated, Optional

import pytest
from pydantic import BaseModel, Field

from agents import (  # noqa: E402
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI  # noqa: E402

set_tracing_disabled(True)  # no export to OpenAI's tracing endpoint
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")


def chat_model(model: str) -> OpenAIChatCompletionsModel:
    client = AsyncOpenAI(
        base_url=os.environ["SLUICE_BASE_URL"],
        api_key=os.environ.get("SLUICE_API_KEY", "unused"),
        max_retries=0,
        timeout=120,
    )
    return OpenAIChatCompletionsModel(model=model, openai_client=client)


def test_optional_string_arguments_reach_the_tool_unquoted(model):
    seen = []

    @function_tool
    def lookup(
        name: Annotated[str, Field(max_length=10)],
        note: Annotated[Optional[str], Field(max_length=10)] = None,
    ) -> str:
        """Look a name up."""
        seen.append((name, note))
        return "found"

    agent = Agent(
        name="looker",
        instructions="Use the lookup tool.",
        tools=[lookup],
        model=chat_model(model),
        model_settings=ModelSettings(tool_choice="required", max_tokens=120, temperature=0, extra_body=NO_THINKING),
        tool_use_behavior="stop_on_first_tool",
    )
    for prompt in ["Find Ada.", "Find Bob, with a note.", "Look up Cy."]:
        result = Runner.run_sync(agent, prompt, max_turns=2)
        assert result.final_output == "found", "the tool ran and its output ended the run"
    assert len(seen) >= 3
    for name, note in seen:
        assert isinstance(name, str) and not name.startswith('"'), name
        assert note is None or (isinstance(note, str) and not note.startswith('"')), note


class Answer(BaseModel):
    city: str = Field(max_length=10)
    days: int = Field(ge=1, le=7)


def test_output_type_with_required_tool_choice_runs(model):
    calls = []

    @function_tool
    def weather(city: Annotated[str, Field(max_length=10)]) -> str:
        """The weather of a city."""
        calls.append(city)
        return "sunny"

    agent = Agent(
        name="forecaster",
        instructions="Call the weather tool, then answer.",
        tools=[weather],
        output_type=Answer,
        model=chat_model(model),
        model_settings=ModelSettings(tool_choice="required", max_tokens=120, temperature=0, extra_body=NO_THINKING),
    )
    # Turn 1: response format + forced call -> the call; the SDK then resets tool_choice, and
    # turn 2 answers in the output type's schema.
    result = Runner.run_sync(agent, "Weather in Oslo for 3 days?", max_turns=4)
    assert calls, "the forced turn called the tool"
    assert isinstance(result.final_output, Answer)
    assert 1 <= result.final_output.days <= 7
