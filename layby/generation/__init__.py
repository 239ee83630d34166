"""generation: messages, tools, interrupts, agents, models and one turn of the loop.

Pure: no Celery, no Redis, no HTTP. Everything a user needs to declare agents is exported
here; `tests/test_public_api.py` checks the list is complete.
"""

from layby.errors import (
    ConfigError,
    Conflict,
    Forbidden,
    Invalid,
    InvalidAnswer,
    LaybyError,
    NotFound,
    RequestError,
    ResumeError,
    RunFailed,
    TooLarge,
    Unauthorized,
    Unavailable,
    UnknownToolCall,
    UnresolvedToolCall,
)
from layby.generation.agents import (
    Agent,
    OnChange,
    fingerprint,
    hosted,
    hosted_versions,
    load_agents,
)
from layby.generation.answers import (
    MAX_JSON_DEPTH,
    check_answer,
    check_storable,
    schema_errors,
    to_resume,
)
from layby.generation.interrupts import (
    BACKGROUND_JOB,
    CONFIRMATION,
    INPUT_REQUIRED,
    TOOL_CALL,
    Escalation,
    ExpiryAction,
    Interrupt,
    OnExpire,
    ResumeEntry,
    ResumeMode,
)
from layby.generation.messages import (
    Message,
    Part,
    ToolRequest,
    ToolResponse,
    text_message,
    why_not_a_start,
)
from layby.generation.models import Model, ModelRequest, ModelResponse
from layby.generation.retries import DEFAULT_RETRY, RetryCall, RetryLater, RetryPolicy, Tried
from layby.generation.scripted import Call, Case, Choose, Reply, ScriptedModel
from layby.generation.stored_run import StoredRun
from layby.generation.tools import (
    AGENT_RETRY,
    Approval,
    Ask,
    EndRun,
    JobRequest,
    Tool,
    ToolContext,
    ToolInterrupt,
    interrupt_tool,
    tool,
)
from layby.generation.turn import (
    Continue,
    Fail,
    Finish,
    Outcome,
    Park,
    Resume,
    Retry,
    Step,
    model_turn,
    resume_turn,
)
from layby.generation.versions import (
    AGENT_CHANGED,
    Changed,
    migrated,
    parked_version,
    what_changed,
)

__all__ = [
    "AGENT_CHANGED", "AGENT_RETRY", "BACKGROUND_JOB", "CONFIRMATION", "DEFAULT_RETRY",
    "INPUT_REQUIRED", "MAX_JSON_DEPTH",
    "TOOL_CALL", "Agent", "Approval", "Ask", "Call", "Case", "Changed", "Choose",
    "ConfigError", "Conflict", "Continue", "EndRun", "Escalation", "ExpiryAction", "Fail",
    "Finish", "Forbidden", "Interrupt", "Invalid", "InvalidAnswer", "JobRequest", "LaybyError",
    "Message", "Model", "ModelRequest", "ModelResponse", "NotFound", "OnChange", "OnExpire",
    "Outcome", "Park", "Part", "Reply", "RequestError", "Resume", "ResumeEntry", "ResumeError",
    "ResumeMode", "Retry", "RetryCall", "RetryLater", "RetryPolicy", "RunFailed",
    "ScriptedModel", "Step", "StoredRun", "TooLarge", "Tool",
    "ToolContext", "ToolInterrupt", "ToolRequest", "ToolResponse", "Tried", "Unauthorized",
    "Unavailable", "UnknownToolCall", "UnresolvedToolCall", "check_answer", "check_storable",
    "fingerprint", "hosted", "hosted_versions", "interrupt_tool", "load_agents", "migrated",
    "model_turn", "parked_version", "resume_turn", "schema_errors", "text_message",
    "to_resume", "tool", "what_changed", "why_not_a_start",
]
