"""Model providers: adapters from layby's model interface to real LLM APIs.

    from layby.generation.providers import OpenAIChatModel, AnthropicModel

    local = OpenAIChatModel(model="llama3.2", base_url="http://127.0.0.1:11434/v1")  # Ollama
    claude = AnthropicModel(model="claude-sonnet-4-5")  # key from LAYBY_ANTHROPIC_API_KEY
    agent = Agent(name="support", model=local, tools=(...))

Each adapter translates the Genkit-shaped history to its provider's messages and back without
loss (tool call ids are the refs of the history), and raises `ProviderError` with a message
that says what is wrong and what to do. The SDKs (`openai`, `anthropic`) are imported when a
model is first called, so this package imports without them. This is the one part of
`generation` that talks HTTP.
"""

from layby.generation.providers.anthropic_messages import AnthropicModel
from layby.generation.providers.common import ProviderError
from layby.generation.providers.openai_chat import OpenAIChatModel
from layby.generation.providers.settings import AnthropicSettings, OpenAISettings, ProviderSettings

__all__ = ["AnthropicModel", "AnthropicSettings", "OpenAIChatModel", "OpenAISettings",
           "ProviderError", "ProviderSettings"]
