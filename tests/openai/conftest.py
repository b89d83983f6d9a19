"""Fixtures for the client tests: OpenAI and Anthropic clients pointed at a running `hostd serve`.

The server is started by tests/openai/run.sh, which exports SLUICE_BASE_URL
(http://127.0.0.1:PORT/v1) and SLUICE_MODEL_NAME before running pytest.
"""

import os

import anthropic
import openai
import pytest


@pytest.fixture(scope="session")
def model() -> str:
    return os.environ["SLUICE_MODEL_NAME"]


@pytest.fixture(scope="session")
def client() -> openai.OpenAI:
    # No retries: a 429 or 5xx must surface as the test's error, not be retried away.
    return openai.OpenAI(
        base_url=os.environ["SLUICE_BASE_URL"],
        api_key=os.environ.get("SLUICE_API_KEY", "unused"),
        max_retries=0,
        timeout=120,
    )


@pytest.fixture(scope="session")
def anthropic_client() -> anthropic.Anthropic:
    # The SDK appends /v1/messages to the base URL; no retries, as for the OpenAI client.
    base = os.environ["SLUICE_BASE_URL"].removesuffix("/v1")
    return anthropic.Anthropic(
        base_url=base,
        api_key=os.environ.get("SLUICE_API_KEY", "unused"),
        max_retries=0,
        timeout=120,
    )
