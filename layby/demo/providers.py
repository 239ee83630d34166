"""demo.assistant and demo.assistant_anthropic: the demo tools driven by a real model.

    LAYBY_OPENAI_MODEL=llama3.2 LAYBY_OPENAI_BASE_URL=http://127.0.0.1:11434/v1 \\
    LAYBY_AGENT_MODULES=layby.demo.agents,layby.demo.providers layby up

    LAYBY_ANTHROPIC_MODEL=claude-sonnet-4-5 LAYBY_ANTHROPIC_API_KEY=sk-ant-… \\
    LAYBY_AGENT_MODULES=layby.demo.agents,layby.demo.providers layby up

`demo.assistant` talks to an OpenAI-compatible server (`LAYBY_OPENAI_*`),
`demo.assistant_anthropic` to Anthropic's Messages API (`LAYBY_ANTHROPIC_*`). The model may ask
a question (`ask_question`), ask for a transfer that needs approval (`transfer_funds`) and look
up a balance (`check_balance`), several in one turn. Without its model setting each module
still imports and each agent is still listed, but each run of it fails at once with a message
that says what to set.
"""

from __future__ import annotations

from layby import Agent
from layby.demo.agents import ask_question, check_balance, transfer_funds
from layby.errors import ConfigError
from layby.models import (
    AnthropicModel,
    AnthropicSettings,
    ModelRequest,
    ModelResponse,
    OpenAIChatModel,
    OpenAISettings,
)

NAME = "demo.assistant"
ANTHROPIC_NAME = "demo.assistant_anthropic"
TOOLS = (ask_question, transfer_funds, check_balance)
SYSTEM = (
    "You are a careful banking assistant. Use the tools: ask_question when you need the user "
    "to choose or tell you something, transfer_funds to send money (the account holder "
    "approves it first; a declined transfer is not an error, say that no money was sent), "
    "check_balance to look up a balance. You may call several tools at once. Answer briefly.")
UNSET = ("demo.assistant needs a model: set LAYBY_OPENAI_MODEL (and LAYBY_OPENAI_BASE_URL for "
         "a server other than OpenAI, e.g. http://127.0.0.1:11434/v1 for a local Ollama, or "
         "LAYBY_OPENAI_API_KEY for OpenAI) where the workers run, then restart them")
ANTHROPIC_UNSET = ("demo.assistant_anthropic needs a model: set LAYBY_ANTHROPIC_MODEL and "
                   "LAYBY_ANTHROPIC_API_KEY (and LAYBY_ANTHROPIC_BASE_URL for a server other "
                   "than Anthropic's) where the workers run, then restart them")


class Unconfigured:
    """Stands in for the model when none is configured: every call says what to set."""

    def __init__(self, name: str = "openai:(unset)", message: str = UNSET) -> None:
        self.name = name
        self.message = message

    def generate(self, request: ModelRequest) -> ModelResponse:
        raise ConfigError(self.message)


def build_assistant(settings: OpenAISettings | None = None) -> Agent:
    settings = settings or OpenAISettings()
    model = OpenAIChatModel.from_settings(settings) if settings.model else Unconfigured()
    return Agent(name=NAME, model=model, system=SYSTEM, tools=TOOLS, max_turns=8,
                 description="An LLM (LAYBY_OPENAI_MODEL on an OpenAI-compatible server) with "
                             "the demo tools: questions, approved transfers, balances.")


def build_anthropic_assistant(settings: AnthropicSettings | None = None) -> Agent:
    settings = settings or AnthropicSettings()
    model = (AnthropicModel.from_settings(settings) if settings.model
             else Unconfigured("anthropic:(unset)", ANTHROPIC_UNSET))
    return Agent(name=ANTHROPIC_NAME, model=model, system=SYSTEM, tools=TOOLS, max_turns=8,
                 description="Claude (LAYBY_ANTHROPIC_MODEL on Anthropic's Messages API) with "
                             "the demo tools: questions, approved transfers, balances.")


assistant = build_assistant()
assistant_anthropic = build_anthropic_assistant()
