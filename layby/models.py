"""Models an agent can run on: the scripted model (deterministic turns written as data, for
demos and tests) and adapters for real providers, and the interface any model implements. ::

    from layby.models import ScriptedModel, Reply, Call           # scripted
    from layby.models import OpenAIChatModel, AnthropicModel      # OpenAI-compatible, Anthropic

A model is any object with a `name` and `generate(ModelRequest) -> ModelResponse`.
"""

from layby.generation.models import Model, ModelRequest, ModelResponse
from layby.generation.providers import (
    AnthropicModel,
    AnthropicSettings,
    OpenAIChatModel,
    OpenAISettings,
    ProviderError,
)
from layby.generation.scripted import Call, Case, Choose, Reply, ScriptedModel

__all__ = ["AnthropicModel", "AnthropicSettings", "Call", "Case", "Choose", "Model",
           "ModelRequest", "ModelResponse", "OpenAIChatModel", "OpenAISettings",
           "ProviderError", "Reply", "ScriptedModel"]
