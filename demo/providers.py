"""demo.assistant: the demo tools driven by a real model on an OpenAI-compatible server.

    LAYBY_OPENAI_MODEL=llama3.2 LAYBY_OPENAI_BASE_URL=http://127.0.0.1:11434/v1 \\
    LAYBY_AGENT_MODULES=demo.agents,demo.providers layby up

The model may ask a question (`ask_question`), ask for a transfer that needs approval
(`transfer_funds`) and look up a balance (`check_balance`), several in one turn. Without
`LAYBY_OPENAI_MODEL` the module still imports and the agent is still listed, but each run of
it fails at once with a message that says what to set.
"""

from __future__ import annotations

from demo.agents import ask_question, check_balance, transfer_funds
from generation import Agent, ConfigError, ModelRequest, ModelResponse
from generation.providers import OpenAIChatModel, OpenAISettings

NAME = "demo.assistant"
SYSTEM = (
    "You are a careful banking assistant. Use the tools: ask_question when you need the user "
    "to choose or tell you something, transfer_funds to send money (the account holder "
    "approves it first; a declined transfer is not an error, say that no money was sent), "
    "check_balance to look up a balance. You may call several tools at once. Answer briefly.")
UNSET = ("demo.assistant needs a model: set LAYBY_OPENAI_MODEL (and LAYBY_OPENAI_BASE_URL for "
         "a server other than OpenAI, e.g. http://127.0.0.1:11434/v1 for a local Ollama, or "
         "LAYBY_OPENAI_API_KEY for OpenAI) where the workers run, then restart them")


class Unconfigured:
    """Stands in for the model when none is configured: every call says what to set."""

    name = "openai:(unset)"

    def generate(self, request: ModelRequest) -> ModelResponse:
        raise ConfigError(UNSET)


def build_assistant(settings: OpenAISettings | None = None) -> Agent:
    settings = settings or OpenAISettings()
    model = OpenAIChatModel.from_settings(settings) if settings.model else Unconfigured()
    return Agent(name=NAME, model=model, system=SYSTEM,
                 tools=(ask_question, transfer_funds, check_balance), max_turns=8,
                 description="An LLM (LAYBY_OPENAI_MODEL on an OpenAI-compatible server) with "
                             "the demo tools: questions, approved transfers, balances.")


assistant = build_assistant()
