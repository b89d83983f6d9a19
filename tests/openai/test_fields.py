"""The field policy and the smaller features of issue 13 through the official `openai` client:
the agent loop that appends `message.model_dump()` to the history, the fields newer SDKs send
(`reasoning_effort`, `prompt_cache_key`, `safety_identifier`, `verbosity`, `store`, `metadata`),
`n` choices, `logit_bias`, and fill-in-the-middle with `suffix`."""

import json
import os

import openai
import pytest

USER = [{"role": "user", "content": "Say something."}]
OFF = {"chat_template_kwargs": {"enable_thinking": False}}


def test_agent_loop_appends_model_dump(client, model):
    messages = list(USER)
    for turn in range(2):
        r = client.chat.completions.create(model=model, messages=messages, max_tokens=4, temperature=0)
        dumped = r.choices[0].message.model_dump()
        # What the SDK dumps: refusal, annotations, audio, function_call, tool_calls (None) and
        # the server's reasoning_content as an extra field.
        assert {"refusal", "audio", "function_call", "tool_calls"} <= dumped.keys()
        messages.append(dumped)
        messages.append({"role": "user", "content": f"And then? ({turn})"})
    assert len(messages) == 5


def test_newer_sdk_fields_are_accepted(client, model):
    r = client.chat.completions.create(
        model=model,
        messages=USER,
        max_tokens=3,
        temperature=0,
        reasoning_effort="none",
        prompt_cache_key="session-1",
        safety_identifier="user-1",
        store=False,
        metadata={"app": "test"},
        verbosity="low",
        stream=True,
        stream_options={"include_usage": True, "include_obfuscation": False},
    )
    chunks = list(r)
    assert chunks[-1].usage is not None
    # reasoning_effort "none" turns thinking off: no reasoning in any chunk.
    assert all(not (c.delta.model_extra or {}).get("reasoning_content") for ch in chunks for c in ch.choices)


def test_refused_field_names_itself(client, model):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model, messages=USER, max_tokens=1, extra_body={"use_beam_search": True})
    assert e.value.body["param"] == "use_beam_search"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model, messages=USER, max_tokens=1, temperature="hot")
    assert e.value.body["param"] == "temperature"


def _token_id(text):
    """The id of a special token in the served model's tokenizer.json (run.sh's model)."""
    model_dir = os.environ.get("SLUICE_TEST_MODEL", "tests/fixtures/models/tiny")
    with open(os.path.join(model_dir, "tokenizer.json")) as f:
        return next(t["id"] for t in json.load(f)["added_tokens"] if t["content"] == text)


def test_n_choices_and_logit_bias(client, model):
    r = client.chat.completions.create(
        model=model, messages=USER, max_tokens=5, temperature=1.0, seed=3, n=3, extra_body={"ignore_eos": True, **OFF}
    )
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert r.usage.completion_tokens == 15
    # Forcing the end-of-turn token: the reply ends at once and counts that one token.
    now = client.chat.completions.create(
        model=model, messages=USER, max_tokens=4, temperature=0, logit_bias={str(_token_id("<|im_end|>")): 100}, extra_body=OFF
    )
    assert (now.choices[0].message.content, now.choices[0].finish_reason, now.usage.completion_tokens) == ("", "stop", 1)
    # A forced special token is skipped in content unless skip_special_tokens is false.
    bias = {str(_token_id("<|vision_end|>")): 100}
    kw = dict(model=model, messages=USER, max_tokens=2, temperature=0, logit_bias=bias)
    assert client.chat.completions.create(**kw, extra_body={"ignore_eos": True, **OFF}).choices[0].message.content == ""
    kept = client.chat.completions.create(**kw, extra_body={"ignore_eos": True, "skip_special_tokens": False, **OFF})
    assert kept.choices[0].message.content == "<|vision_end|>" * 2


def test_fill_in_the_middle(client, model):
    kw = dict(model=model, max_tokens=4, temperature=0, extra_body={"ignore_eos": True})
    fim = client.completions.create(prompt="def f(x):\n    ", suffix="\n    return y\n", **kw)
    by_hand = client.completions.create(prompt="<|fim_prefix|>def f(x):\n    <|fim_suffix|>\n    return y\n<|fim_middle|>", **kw)
    assert fim.choices[0].text == by_hand.choices[0].text
    assert fim.usage.prompt_tokens == by_hand.usage.prompt_tokens
