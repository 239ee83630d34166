"""Provider settings from the environment: `LAYBY_OPENAI_*` and `LAYBY_ANTHROPIC_*`.

    LAYBY_OPENAI_MODEL=llama3.2 LAYBY_OPENAI_BASE_URL=http://127.0.0.1:11434/v1   # Ollama
    LAYBY_OPENAI_MODEL=gpt-4.1-mini LAYBY_OPENAI_API_KEY=sk-…                      # OpenAI
    LAYBY_ANTHROPIC_MODEL=claude-sonnet-4-5 LAYBY_ANTHROPIC_API_KEY=sk-ant-…

`OpenAIChatModel.from_settings()` and `AnthropicModel.from_settings()` build adapters from them.
"""

from __future__ import annotations

from pydantic import BaseModel, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class OpenAISettings(BaseSettings):
    """An OpenAI-compatible chat completions server (OpenAI, Ollama, vLLM, LM Studio, …)."""

    model_config = SettingsConfigDict(env_prefix="LAYBY_OPENAI_", extra="ignore")

    model: str | None = None
    base_url: str | None = Field(None, description="the API root, e.g. http://127.0.0.1:11434/v1")
    api_key: SecretStr | None = None
    timeout_s: float = 60.0
    max_retries: int = 2
    temperature: float | None = None


class AnthropicSettings(BaseSettings):
    """Anthropic's Messages API (or a server that speaks it)."""

    model_config = SettingsConfigDict(env_prefix="LAYBY_ANTHROPIC_", extra="ignore")

    model: str | None = None
    base_url: str | None = Field(None, description="the API root, without /v1")
    api_key: SecretStr | None = None
    timeout_s: float = 60.0
    max_retries: int = 2
    temperature: float | None = None
    max_tokens: int = 4096


class ProviderSettings(BaseModel):
    """Both providers' settings, each read from its own `LAYBY_<PROVIDER>_` variables."""

    openai: OpenAISettings = Field(default_factory=OpenAISettings)
    anthropic: AnthropicSettings = Field(default_factory=AnthropicSettings)
