"""The provider adapters against local servers that speak each provider's protocol.

A stdlib HTTP server on loopback answers `POST /v1/chat/completions` (OpenAI-compatible) and
`POST /v1/messages` (Anthropic) with recorded-looking replies, and keeps every request it got.

The first tests check translation in-process: generation's pure turn functions with the real
SDKs in between, and tools of the tests' own that touch nothing. The last ones run whole
interrupt-and-resume cycles on a real layby system (worker, sweeper, gateway, Redis) whose
worker calls the fake servers: runs are started and answered over HTTP, and the demo tools
record to the real ledger, so what is asserted is what went over the wire and what happened.
"""

from __future__ import annotations

import json
import re
import threading
import traceback
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Annotated, Any

import pytest
from pydantic import Field

from layby.demo import providers as demo_providers
from layby.demo.agents import ask_question
from layby.generation import (
    CONFIRMATION,
    Agent,
    ConfigError,
    Continue,
    Finish,
    Message,
    ModelRequest,
    Park,
    Part,
    ResumeEntry,
    ResumeMode,
    Step,
    ToolContext,
    ToolRequest,
    ToolResponse,
    load_agents,
    model_turn,
    resume_turn,
    text_message,
    to_resume,
    tool,
)
from layby.generation.messages import dump_messages, load_messages
from layby.generation.providers import (
    AnthropicModel,
    AnthropicSettings,
    OpenAIChatModel,
    OpenAISettings,
    ProviderError,
    ProviderSettings,
)
from layby.generation.providers.anthropic_messages import safe_id, to_anthropic_messages
from layby.generation.providers.openai_chat import to_chat_messages
from tests.support.harness import LaybySystem

RUN = "run-p"
KEY = "sk-layby-test-0123456789abcdef"
SYSTEM = "You are a careful banking assistant."


# Tools of the tests' own, shaped like the demo's but touching nothing (the demo's record to
# the ledger in Redis): the in-process tests check translation only. Whole runs with the
# demo's tools go through a real system below.
@tool
def transfer_funds(ctx: ToolContext, to: str, amount: Annotated[int, Field(gt=0)]) -> dict:
    """Send money. Needs the account holder's approval first."""
    if not ctx.restarted:
        ctx.interrupt(f"Send {amount} to {to}?", reason=CONFIRMATION,
                      response_schema={"type": "object",
                                       "properties": {"approved": {"type": "boolean"}},
                                       "required": ["approved"]})
    approved = isinstance(ctx.resumed, dict) and ctx.resumed.get("approved")
    return {"status": "approved" if approved else "not_approved", "to": to, "amount": amount}


@tool
def check_balance(account: str = "main") -> dict:
    """Look up an account balance (a plain tool: it never interrupts)."""
    return {"account": account, "balance": 1000}


TOOLS = (ask_question, transfer_funds, check_balance)


# --- a server that speaks the providers' protocols --------------------------------------------


class FakeProvider:
    """Answers POSTs with the replies queued, in order; records every request."""

    def __init__(self) -> None:
        self.replies: list[tuple[int, Any, dict[str, str]]] = []
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("content-length") or 0))
                with provider._lock:
                    provider.requests.append({
                        "path": self.path, "headers": {k.lower(): v for k, v in
                                                       self.headers.items()},
                        "json": json.loads(raw) if raw else None})
                    reply = provider.replies.pop(0) if provider.replies else (
                        500, {"error": {"message": "no reply queued"}},
                        {"x-should-retry": "false"})
                status, body, headers = reply
                data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,),
                                       daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def reply(self, body: Any, status: int = 200, **headers: str) -> None:
        self.replies.append((status, body, {k.replace("_", "-"): v for k, v in headers.items()}))

    def bodies(self) -> list[dict[str, Any]]:
        return [r["json"] for r in self.requests]


@pytest.fixture
def server() -> Iterator[FakeProvider]:
    fake = FakeProvider()
    fake.thread.start()
    yield fake
    fake.server.shutdown()
    fake.server.server_close()


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL",
                 "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_CUSTOM_HEADERS", "HTTP_PROXY", "HTTPS_PROXY",
                 "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    for field in ("MODEL", "BASE_URL", "API_KEY", "TIMEOUT_S", "MAX_RETRIES", "TEMPERATURE",
                  "MAX_TOKENS"):
        monkeypatch.delenv(f"LAYBY_OPENAI_{field}", raising=False)
        monkeypatch.delenv(f"LAYBY_ANTHROPIC_{field}", raising=False)


# --- helpers ------------------------------------------------------------------------------------


def stored(messages: list[Message]) -> list[Message]:
    """The history as another process reads it back: through JSON."""
    return load_messages(json.loads(json.dumps(dump_messages(messages))))


def openai_model(server: FakeProvider, **fields: Any) -> OpenAIChatModel:
    return OpenAIChatModel(**{"model": "gpt-test", "base_url": f"{server.url}/v1",
                              "api_key": KEY, **fields})


def anthropic_model(server: FakeProvider, **fields: Any) -> AnthropicModel:
    return AnthropicModel(**{"model": "claude-test", "base_url": server.url, "api_key": KEY,
                             **fields})


def completion(*, content: str | None = None, calls: list[tuple[str, str, Any]] = (),
               finish: str | None = None) -> dict[str, Any]:
    """A chat completion as OpenAI sends it; `calls` are (id, name, arguments)."""
    message: dict[str, Any] = {"role": "assistant", "content": content, "refusal": None}
    if calls:
        message["tool_calls"] = [
            {"id": cid, "type": "function",
             "function": {"name": name,
                          "arguments": args if isinstance(args, str) else json.dumps(args)}}
            for cid, name, args in calls]
    return {"id": "chatcmpl-AbC123", "object": "chat.completion", "created": 1767225600,
            "model": "gpt-test-2026-01-01", "system_fingerprint": "fp_4a8c2d",
            "choices": [{"index": 0, "message": message, "logprobs": None,
                         "finish_reason": finish or ("tool_calls" if calls else "stop")}],
            "usage": {"prompt_tokens": 412, "completion_tokens": 87, "total_tokens": 499}}


def anthropic_message(blocks: list[dict[str, Any]], stop: str | None = None) -> dict[str, Any]:
    uses_tools = any(b["type"] == "tool_use" for b in blocks)
    return {"id": "msg_01XyZ", "type": "message", "role": "assistant", "model": "claude-test",
            "content": blocks, "stop_reason": stop or ("tool_use" if uses_tools else "end_turn"),
            "stop_sequence": None, "usage": {"input_tokens": 512, "output_tokens": 96}}


def by_tool(interrupts: list) -> dict[str, Any]:
    return {i.tool_name: i for i in interrupts}


def parsed_chat(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat messages with their JSON strings (arguments, tool results) parsed, to compare."""
    out = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            m["tool_calls"] = [{**c, "function": {**c["function"], "arguments": json.loads(
                c["function"]["arguments"])}} for c in m["tool_calls"]]
        if m["role"] == "tool":
            m["content"] = json.loads(m["content"])
        out.append(m)
    return out


def leaks(text: str) -> bool:
    return KEY in text or any(KEY[i:i + 8] in text for i in range(len(KEY) - 7))


PARALLEL_CALLS = [
    ("call_Qk3Lw9", "ask_question", {"question": "Which account should we pay from?",
                                     "choices": ["main", "savings"]}),
    ("call_Tr8mXa", "transfer_funds", {"to": "Carol", "amount": 40}),
    ("call_Bal2Zp", "check_balance", {"account": "main"}),
]


# --- OpenAI-compatible: a whole interrupt and resume --------------------------------------------


def test_openai_parallel_calls_park_then_resume_sends_the_translated_history(server):
    server.reply(completion(content="Let me sort this out.", calls=PARALLEL_CALLS))
    server.reply(completion(content="Paying from savings was not possible: the transfer was "
                                    "declined, so no money was sent. Main holds 1000."))
    agent = Agent("llm.parallel", openai_model(server), system=SYSTEM, tools=TOOLS,
                  config={"temperature": 0.2, "maxOutputTokens": 300})

    parked = model_turn(agent, Step(RUN, 1, [text_message("user", "Pay Carol 40")]))

    # the turn parks on both interrupts; the plain tool has run and its output waits
    assert isinstance(parked, Park)
    asked = by_tool(parked.interrupts)
    assert set(asked) == {"ask_question", "transfer_funds"}
    assert asked["ask_question"].tool_call_id == "call_Qk3Lw9"
    assert asked["ask_question"].mode is ResumeMode.RESPOND
    assert asked["transfer_funds"].tool_call_id == "call_Tr8mXa"
    assert asked["transfer_funds"].mode is ResumeMode.RESTART
    assert asked["transfer_funds"].tool_input == {"to": "Carol", "amount": 40}
    model_message = parked.messages[-1]
    assert [p.tool_request.ref for p in model_message.tool_requests] == [
        "call_Qk3Lw9", "call_Tr8mXa", "call_Bal2Zp"]
    assert model_message.tool_requests[2].meta("pendingOutput") == {"account": "main",
                                                                   "balance": 1000}

    [first] = server.requests
    assert first["path"] == "/v1/chat/completions"
    assert first["headers"]["authorization"] == f"Bearer {KEY}"
    body = first["json"]
    assert body["model"] == "gpt-test"
    assert body["temperature"] == 0.2 and body["max_tokens"] == 300
    assert body["messages"] == [{"role": "system", "content": SYSTEM},
                                {"role": "user", "content": "Pay Carol 40"}]
    assert [t["type"] for t in body["tools"]] == ["function"] * 3
    functions = {t["function"]["name"]: t["function"] for t in body["tools"]}
    assert set(functions) == {"ask_question", "transfer_funds", "check_balance"}
    assert functions["transfer_funds"]["parameters"] == transfer_funds.input_schema
    assert functions["transfer_funds"]["description"].startswith("Send money.")

    # answer the question, decline the transfer
    answers = {asked["ask_question"].id: ResumeEntry(interrupt_id=asked["ask_question"].id,
                                                     status="resolved", payload="savings"),
               asked["transfer_funds"].id: ResumeEntry(
                   interrupt_id=asked["transfer_funds"].id, status="cancelled",
                   metadata={"reason": "not this month"})}
    resumed = resume_turn(agent, Step(RUN, 2, stored(parked.messages)),
                          to_resume(parked.interrupts, answers))
    assert isinstance(resumed, Continue)
    assert len(server.requests) == 1  # a resume does not call the model

    done = model_turn(agent, Step(RUN, 2, stored(resumed.messages)))

    assert isinstance(done, Finish)
    assert done.result.startswith("Paying from savings was not possible")
    assert [m.role for m in done.messages] == ["user", "model", "tool", "model"]
    second = server.requests[1]["json"]
    assert parsed_chat(second["messages"]) == [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Pay Carol 40"},
        {"role": "assistant", "content": "Let me sort this out.", "tool_calls": [
            {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}
            for cid, name, args in PARALLEL_CALLS]},
        {"role": "tool", "tool_call_id": "call_Qk3Lw9", "content": "savings"},
        {"role": "tool", "tool_call_id": "call_Tr8mXa",
         "content": {"status": "declined", "reason": "not this month"}},
        {"role": "tool", "tool_call_id": "call_Bal2Zp",
         "content": {"account": "main", "balance": 1000}},
    ]
    # tool results are JSON text: a string answer is a JSON string
    assert second["messages"][3]["content"] == '"savings"'


def test_openai_calls_without_ids_get_refs_from_the_turn_and_keep_them(server):
    calls = completion(calls=[("", "check_balance", {"account": "main"}),
                              ("", "check_balance", {"account": "savings"})])
    for call in calls["choices"][0]["message"]["tool_calls"]:
        del call["id"]  # some OpenAI-compatible servers send none
    server.reply(calls)
    server.reply(completion(content="Both hold 1000."))
    agent = Agent("llm.balances", openai_model(server), tools=(check_balance,))

    went_on = model_turn(agent, Step(RUN, 1, [text_message("user", "balances?")]))

    assert isinstance(went_on, Continue)
    refs = [p.tool_request.ref for p in went_on.messages[1].tool_requests]
    assert refs == ["call_0_0", "call_0_1"]
    assert [p.tool_response.ref for p in went_on.messages[2].content] == refs
    done = model_turn(agent, Step(RUN, 2, stored(went_on.messages)))
    assert isinstance(done, Finish)
    sent = server.requests[1]["json"]["messages"]
    assert [c["id"] for c in sent[1]["tool_calls"]] == refs
    assert [m["tool_call_id"] for m in sent[2:]] == refs


def test_openai_response_keeps_finish_reason_and_usage(server):
    server.reply(completion(content="Hello.", calls=PARALLEL_CALLS[2:]))
    reply = openai_model(server).generate(ModelRequest(messages=[text_message("user", "hi")]))
    assert reply.finish_reason == "tool_calls"
    assert reply.usage == {"inputTokens": 412, "outputTokens": 87, "totalTokens": 499}
    assert reply.message.role == "model"
    assert reply.message.text == "Hello."
    [call] = reply.message.tool_requests
    assert call.tool_request == ToolRequest(name="check_balance", ref="call_Bal2Zp",
                                            input={"account": "main"})
    assert "tools" not in server.requests[0]["json"]  # none declared, none sent


def test_history_without_refs_pairs_calls_and_results_with_stable_ids():
    history = [
        text_message("user", "hi"),
        Message(role="model", content=[
            Part(tool_request=ToolRequest(name="check_balance", input={"account": "a"})),
            Part(tool_request=ToolRequest(name="check_balance", input={"account": "b"}))]),
        Message(role="tool", content=[
            Part(tool_response=ToolResponse(name="check_balance", output=1)),
            Part(tool_response=ToolResponse(name="check_balance", output=2))]),
    ]
    chat = to_chat_messages(history)
    ids = [c["id"] for c in chat[1]["tool_calls"]]
    assert len(set(ids)) == 2
    assert [m["tool_call_id"] for m in chat[2:]] == ids
    assert to_chat_messages(history) == chat  # the same ids every time
    _, anthropic = to_anthropic_messages(history)
    assert [b["id"] for b in anthropic[1]["content"]] == [
        b["tool_use_id"] for b in anthropic[2]["content"]]


# --- OpenAI-compatible: errors ------------------------------------------------------------------


def test_openai_401_says_what_to_set_and_never_shows_the_key(server):
    server.reply({"error": {"message": f"Incorrect API key provided: {KEY}. You can find your "
                                       "API key at https://platform.openai.com/account.",
                            "type": "invalid_request_error", "param": None,
                            "code": "invalid_api_key"}}, status=401)
    agent = Agent("llm", openai_model(server), tools=TOOLS)

    with pytest.raises(ProviderError) as caught:
        model_turn(agent, Step(RUN, 1, [text_message("user", "hi")]))

    error = caught.value
    message = str(error)
    assert f"the OpenAI-compatible server at {server.url}/v1 refused the API key (401)" in message
    assert "set LAYBY_OPENAI_API_KEY" in message
    assert "Incorrect API key provided" in message  # the server's words, key blanked out
    assert not leaks(message)
    assert not leaks("".join(traceback.format_exception(error)))
    assert not leaks(repr(agent.model))
    assert error.status_code == 401 and error.transient is False
    assert len(server.requests) == 1  # not retried


def test_openai_500_is_retried_by_the_sdk_then_raised(server):
    for _ in range(3):
        server.reply({"error": {"message": "The server had an error while processing your "
                                           "request.", "type": "server_error"}},
                     status=500, retry_after_ms="5")
    model = openai_model(server, max_retries=2)

    with pytest.raises(ProviderError) as caught:
        model.generate(ModelRequest(messages=[text_message("user", "hi")]))

    assert len(server.requests) == 3
    message = str(caught.value)
    assert "failed with a server error (500)" in message and "after 3 tries" in message
    assert caught.value.transient is True


def test_openai_500_then_success_is_just_slower(server):
    server.reply({"error": {"message": "overloaded"}}, status=503, retry_after_ms="5")
    server.reply(completion(content="fine"))
    reply = openai_model(server).generate(ModelRequest(messages=[text_message("user", "hi")]))
    assert reply.message.text == "fine"
    assert len(server.requests) == 2


@pytest.mark.parametrize(("status", "body", "expected", "transient"), [
    (404, {"error": {"message": 'model "gpt-test" not found, try pulling it first',
                     "type": "api_error"}}, "has no model 'gpt-test'", False),
    (400, {"error": {"message": "The model `gpt-test` does not exist or you do not have "
                                "access to it.", "type": "invalid_request_error"}},
     "check LAYBY_OPENAI_MODEL", False),
    (400, {"error": {"message": "gpt-test does not support tools",
                     "type": "invalid_request_error"}},
     "rejected the request for model 'gpt-test' (400)", False),
    (403, {"error": {"message": "Project does not have access to model gpt-test"}},
     "denied this API key access to model 'gpt-test' (403)", False),
    (429, {"error": {"message": "Rate limit reached", "type": "requests"}},
     "is rate limiting requests (429)", True),
])
def test_openai_status_errors_are_explained(server, status, body, expected, transient):
    for _ in range(2):
        server.reply(body, status=status, retry_after_ms="5")
    with pytest.raises(ProviderError) as caught:
        openai_model(server, max_retries=1).generate(
            ModelRequest(messages=[text_message("user", "hi")]))
    assert expected in str(caught.value)
    assert caught.value.transient is transient
    assert len(server.requests) == (2 if transient else 1)


def test_openai_malformed_tool_arguments_are_a_clear_error(server):
    server.reply(completion(calls=[("call_Bad1", "transfer_funds", '{"to": "Bob", "amount": ')],
                            finish="length"))
    agent = Agent("llm", openai_model(server), tools=TOOLS)

    with pytest.raises(ProviderError) as caught:
        model_turn(agent, Step(RUN, 1, [text_message("user", "Send 5 to Bob")]))

    message = str(caught.value)
    assert "called tool 'transfer_funds' (call id 'call_Bad1')" in message
    assert "not valid JSON" in message
    assert '{"to": "Bob", "amount": ' in message
    assert "maxOutputTokens" in message  # the reply was cut off: say how to avoid it
    assert caught.value.transient is True


def test_openai_unreachable_server_and_missing_key():
    closed = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    port = closed.server_address[1]
    closed.server_close()
    model = OpenAIChatModel(model="m", base_url=f"http://127.0.0.1:{port}/v1", max_retries=0,
                            timeout_s=5)
    with pytest.raises(ProviderError) as caught:
        model.generate(ModelRequest(messages=[text_message("user", "hi")]))
    assert f"cannot reach the OpenAI-compatible server at http://127.0.0.1:{port}/v1" \
        in str(caught.value)
    assert "LAYBY_OPENAI_BASE_URL" in str(caught.value) and caught.value.transient

    with pytest.raises(ProviderError, match="set LAYBY_OPENAI_API_KEY"):
        OpenAIChatModel(model="gpt-4.1").generate(
            ModelRequest(messages=[text_message("user", "hi")]))


# --- Anthropic ----------------------------------------------------------------------------------


def test_anthropic_parallel_calls_park_then_resume_sends_the_translated_history(server):
    thinking = {"type": "thinking", "thinking": "Carol needs 40; ask which account.",
                "signature": "EqQBCkYIBxgCKkBsig"}
    server.reply(anthropic_message([
        thinking,
        {"type": "text", "text": "I'll check a few things."},
        *[{"type": "tool_use", "id": cid.replace("call_", "toolu_"), "name": name,
           "input": args} for cid, name, args in PARALLEL_CALLS]]))
    server.reply(anthropic_message([{"type": "text", "text": "Sent 40 to Carol from main."}]))
    agent = Agent("llm.parallel", anthropic_model(server), system=SYSTEM, tools=TOOLS,
                  config={"maxOutputTokens": 1024, "temperature": 0})

    parked = model_turn(agent, Step(RUN, 1, [text_message("user", "Pay Carol 40")]))

    assert isinstance(parked, Park)
    asked = by_tool(parked.interrupts)
    assert asked["ask_question"].tool_call_id == "toolu_Qk3Lw9"
    assert asked["transfer_funds"].tool_call_id == "toolu_Tr8mXa"
    [first] = server.requests
    assert first["path"] == "/v1/messages"
    # the SDK sends the key as x-api-key or, in newer versions, as a bearer token
    assert KEY in (first["headers"].get("x-api-key"), first["headers"].get("authorization",
                                                                         "")[len("Bearer "):])
    body = first["json"]
    assert body["model"] == "claude-test" and body["max_tokens"] == 1024
    assert body["temperature"] == 0
    assert body["system"] == SYSTEM
    assert body["messages"] == [{"role": "user",
                                 "content": [{"type": "text", "text": "Pay Carol 40"}]}]
    tools = {t["name"]: t for t in body["tools"]}
    assert tools["ask_question"]["input_schema"] == ask_question.input_schema
    assert set(tools) == {"ask_question", "transfer_funds", "check_balance"}

    answers = {asked["ask_question"].id: ResumeEntry(interrupt_id=asked["ask_question"].id,
                                                     status="resolved", payload="main"),
               asked["transfer_funds"].id: ResumeEntry(interrupt_id=asked["transfer_funds"].id,
                                                       status="resolved",
                                                       payload={"approved": True})}
    resumed = resume_turn(agent, Step(RUN, 2, stored(parked.messages)),
                          to_resume(parked.interrupts, answers))
    assert isinstance(resumed, Continue)
    done = model_turn(agent, Step(RUN, 2, stored(resumed.messages)))

    assert isinstance(done, Finish) and done.result == "Sent 40 to Carol from main."
    messages = server.requests[1]["json"]["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert messages[1]["content"] == [
        thinking,  # sent back as it came, as extended thinking requires
        {"type": "text", "text": "I'll check a few things."},
        *[{"type": "tool_use", "id": cid.replace("call_", "toolu_"), "name": name,
           "input": args} for cid, name, args in PARALLEL_CALLS]]
    results = messages[2]["content"]
    assert [r["type"] for r in results] == ["tool_result"] * 3
    assert [r["tool_use_id"] for r in results] == ["toolu_Qk3Lw9", "toolu_Tr8mXa",
                                                   "toolu_Bal2Zp"]
    assert [json.loads(r["content"]) for r in results] == [
        "main",
        {"status": "approved", "to": "Carol", "amount": 40},
        {"account": "main", "balance": 1000}]


def test_anthropic_response_keeps_finish_reason_and_usage(server):
    server.reply(anthropic_message([{"type": "text", "text": "cut"}], stop="max_tokens"))
    reply = anthropic_model(server).generate(
        ModelRequest(messages=[text_message("user", "hi")], system="be brief"))
    assert reply.finish_reason == "length"
    assert reply.usage == {"inputTokens": 512, "outputTokens": 96, "totalTokens": 608}
    assert server.requests[0]["json"]["max_tokens"] == 4096


def test_anthropic_401_and_overloaded(server):
    server.reply({"type": "error", "error": {"type": "authentication_error",
                                             "message": "invalid x-api-key"}}, status=401)
    with pytest.raises(ProviderError) as caught:
        anthropic_model(server).generate(ModelRequest(messages=[text_message("user", "hi")]))
    assert f"the Anthropic API at {server.url} refused the API key (401)" in str(caught.value)
    assert "set LAYBY_ANTHROPIC_API_KEY" in str(caught.value)
    assert not leaks(str(caught.value)) and len(server.requests) == 1

    for _ in range(2):
        server.reply({"type": "error", "error": {"type": "overloaded_error",
                                                 "message": "Overloaded"}},
                     status=529, retry_after_ms="5")
    with pytest.raises(ProviderError) as caught:
        anthropic_model(server, max_retries=1).generate(
            ModelRequest(messages=[text_message("user", "hi")]))
    assert "server error (529)" in str(caught.value) and caught.value.transient
    assert len(server.requests) == 3


def test_anthropic_ids_are_made_safe_the_same_way_for_calls_and_results():
    history = [
        text_message("user", "hi"),
        Message(role="model", content=[Part(tool_request=ToolRequest(
            name="check_balance", ref="fc:1/main", input={}))]),
        Message(role="tool", content=[Part(tool_response=ToolResponse(
            name="check_balance", ref="fc:1/main", output={"balance": 1}))]),
        text_message("user", "and now?"),
    ]
    system, messages = to_anthropic_messages([text_message("system", "sys"), *history])
    assert system == ["sys"]
    use = messages[1]["content"][0]
    result = messages[2]["content"][0]
    assert re.fullmatch(r"[A-Za-z0-9_-]+", use["id"]) and use["id"] == result["tool_use_id"]
    assert use["id"] == safe_id("fc:1/main") != safe_id("fc_1/main")
    # a user message after the tool results joins them: the API wants roles in turns
    assert messages[2]["content"][1] == {"type": "text", "text": "and now?"}
    assert len(messages) == 3


# --- settings and the demo agent ----------------------------------------------------------------


def test_settings_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("LAYBY_OPENAI_MODEL", "llama3.2")
    monkeypatch.setenv("LAYBY_OPENAI_BASE_URL", "http://127.0.0.1:11434/v1")
    monkeypatch.setenv("LAYBY_OPENAI_TIMEOUT_S", "5")
    monkeypatch.setenv("LAYBY_ANTHROPIC_MODEL", "claude-test")
    monkeypatch.setenv("LAYBY_ANTHROPIC_API_KEY", KEY)
    settings = ProviderSettings()
    assert settings.openai.model == "llama3.2" and settings.openai.timeout_s == 5
    model = OpenAIChatModel.from_settings()
    assert model.base_url == "http://127.0.0.1:11434/v1" and model.name == "openai:llama3.2"
    claude = AnthropicModel.from_settings(max_tokens=100)
    assert claude.api_key.get_secret_value() == KEY and claude.max_tokens == 100
    assert not leaks(repr(claude)) and not leaks(repr(settings))
    monkeypatch.delenv("LAYBY_OPENAI_MODEL")
    with pytest.raises(ProviderError, match="set LAYBY_OPENAI_MODEL"):
        OpenAIChatModel.from_settings()


def test_demo_assistant_without_settings_imports_and_says_what_to_set():
    agents = load_agents(["layby.demo.providers"])
    assert set(agents) == {"demo.assistant", "demo.assistant_anthropic"}
    unset = demo_providers.build_assistant(OpenAISettings())
    with pytest.raises(ConfigError, match="set LAYBY_OPENAI_MODEL"):
        unset.model.generate(ModelRequest(messages=[text_message("user", "hi")]))
    unset = demo_providers.build_anthropic_assistant(AnthropicSettings())
    with pytest.raises(ConfigError, match="set LAYBY_ANTHROPIC_MODEL"):
        unset.model.generate(ModelRequest(messages=[text_message("user", "hi")]))


def test_demo_assistant_on_an_openai_compatible_server(server, monkeypatch):
    from layby.demo.providers import build_assistant

    monkeypatch.setenv("LAYBY_OPENAI_MODEL", "llama3.2")
    monkeypatch.setenv("LAYBY_OPENAI_BASE_URL", f"{server.url}/v1")
    agent = build_assistant()
    assert agent.name == "demo.assistant"
    assert [t.name for t in agent.tools] == ["ask_question", "transfer_funds", "check_balance"]
    server.reply(completion(calls=[("call_1", "transfer_funds", {"to": "Bob", "amount": 5})]))

    parked = model_turn(agent, Step(RUN, 1, [text_message("user", "Send 5 to Bob")]))

    assert isinstance(parked, Park)
    assert parked.interrupts[0].message == "Send 5 to Bob?"
    request = server.requests[0]
    assert request["json"]["model"] == "llama3.2"
    assert request["json"]["messages"][0]["role"] == "system"
    assert request["headers"]["authorization"] == "Bearer no-key"  # Ollama needs none


# --- on a real system: the worker calls the fake servers -----------------------------------------
#
# A layby system (worker, sweeper, gateway: real subprocesses on their own Redis database) whose
# demo.assistant and demo.assistant_anthropic talk to the fake provider in this process. Runs
# are started and answered over HTTP as users do; the demo tools record to the real ledger.

REAL_DB = 15  # a database of this module's own (the session system is on 0)


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeProvider]:
    provider = FakeProvider()
    provider.thread.start()
    yield provider
    provider.server.shutdown()
    provider.server.server_close()


@pytest.fixture(scope="module")
def real(redis_server: Any, fake: FakeProvider, tmp_path_factory: pytest.TempPathFactory
         ) -> Iterator[LaybySystem]:
    import redis as redis_client

    redis_client.Redis(port=redis_server.port, db=REAL_DB).flushdb()
    system = LaybySystem(f"redis://127.0.0.1:{redis_server.port}/{REAL_DB}",
                         tmp_path_factory.mktemp("providers"), env_overrides={
                             "LAYBY_AGENT_MODULES":
                                 "layby.demo.agents,layby.demo.providers,tests.support.agents",
                             "LAYBY_OPENAI_MODEL": "gpt-test",
                             "LAYBY_OPENAI_BASE_URL": f"{fake.url}/v1",
                             "LAYBY_OPENAI_API_KEY": KEY,
                             "LAYBY_OPENAI_MAX_RETRIES": "2",
                             "LAYBY_OPENAI_TIMEOUT_S": "10",
                             "LAYBY_ANTHROPIC_MODEL": "claude-test",
                             "LAYBY_ANTHROPIC_BASE_URL": fake.url,
                             "LAYBY_ANTHROPIC_API_KEY": KEY,
                             "LAYBY_ANTHROPIC_MAX_RETRIES": "2",
                             "LAYBY_ANTHROPIC_TIMEOUT_S": "10",
                             "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost",
                         })
    try:
        yield system.start()
    finally:
        system.stop()
        redis_client.Redis(port=redis_server.port, db=REAL_DB).flushdb()


@pytest.fixture
def provider(fake: FakeProvider) -> FakeProvider:
    """The module's fake provider with nothing queued and nothing received yet."""
    with fake._lock:
        fake.replies.clear()
        fake.requests.clear()
    return fake


def open_by_tool(system: LaybySystem, run: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {i["toolName"]: i for i in system.open_interrupts(run)}


def ledger_of(system: LaybySystem, run_id: str) -> dict[str, list[dict[str, Any]]]:
    return {kind: [e for e in entries if e["run"] == run_id]
            for kind, entries in system.ledger().items()}


@pytest.mark.integration
def test_real_openai_transfer_parks_then_the_answer_resumes_it_and_sends_once(real, provider):
    provider.reply(completion(calls=[("call_T250", "transfer_funds",
                                      {"to": "Bob", "amount": 250})]))
    provider.reply(completion(content="Sent 250 to Bob."))

    run_id = real.start_run("demo.assistant", "Send 250 to Bob")["id"]
    parked = real.wait_status(run_id, "interrupted")

    [approval] = real.open_interrupts(parked)
    assert approval["toolName"] == "transfer_funds" and approval["toolCallId"] == "call_T250"
    assert approval["reason"] == CONFIRMATION and approval["message"] == "Send 250 to Bob?"
    [first] = provider.requests
    assert first["path"] == "/v1/chat/completions"
    assert first["headers"]["authorization"] == f"Bearer {KEY}"
    assert first["json"]["model"] == "gpt-test"
    assert [m["role"] for m in first["json"]["messages"]] == ["system", "user"]
    assert first["json"]["messages"][1]["content"] == "Send 250 to Bob"
    assert ledger_of(real, run_id)["transfers"] == []  # nothing sent before the approval

    assert real.answer(run_id, approval["id"], payload={"approved": True}).status_code == 200
    done = real.wait_status(run_id, "completed")

    assert done["result"] == "Sent 250 to Bob."
    [transfer] = ledger_of(real, run_id)["transfers"]
    assert (transfer["to"], transfer["amount"]) == ("Bob", 250)
    assert len(provider.requests) == 2
    messages = provider.requests[1]["json"]["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool"]
    assert messages[2]["tool_calls"] == [
        {"id": "call_T250", "type": "function",
         "function": {"name": "transfer_funds", "arguments": '{"to":"Bob","amount":250}'}}]
    assert messages[3]["tool_call_id"] == "call_T250"
    assert json.loads(messages[3]["content"]) == {"status": "sent", "to": "Bob", "amount": 250,
                                                  "id": transfer["key"]}


@pytest.mark.integration
def test_real_openai_several_calls_in_one_turn(real, provider):
    provider.reply(completion(content="Let me sort this out.", calls=PARALLEL_CALLS))
    provider.reply(completion(content="Sent 40 to Carol from savings. Main holds 1000."))

    run_id = real.start_run("demo.assistant", "Pay Carol 40")["id"]
    parked = real.wait_status(run_id, "interrupted")

    asked = open_by_tool(real, parked)
    assert set(asked) == {"ask_question", "transfer_funds"}
    assert asked["ask_question"]["toolCallId"] == "call_Qk3Lw9"
    assert asked["transfer_funds"]["toolCallId"] == "call_Tr8mXa"
    assert len(ledger_of(real, run_id)["calls"]) == 1  # check_balance ran in the turn

    # one answer is not enough to resume
    assert real.answer(run_id, asked["ask_question"]["id"], payload="savings").status_code == 200
    assert real.run(run_id)["status"] == "interrupted"
    assert len(provider.requests) == 1
    assert real.answer(run_id, asked["transfer_funds"]["id"],
                       payload={"approved": True}).status_code == 200
    done = real.wait_status(run_id, "completed")

    assert done["result"] == "Sent 40 to Carol from savings. Main holds 1000."
    ledger = ledger_of(real, run_id)
    assert [(t["to"], t["amount"]) for t in ledger["transfers"]] == [("Carol", 40)]
    assert [c["tool"] for c in ledger["calls"]] == ["check_balance"]  # not run again
    assert len(provider.requests) == 2
    messages = provider.requests[1]["json"]["messages"]
    assert parsed_chat(messages[2:]) == [
        {"role": "assistant", "content": "Let me sort this out.", "tool_calls": [
            {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}
            for cid, name, args in PARALLEL_CALLS]},
        {"role": "tool", "tool_call_id": "call_Qk3Lw9", "content": "savings"},
        {"role": "tool", "tool_call_id": "call_Tr8mXa",
         "content": {"status": "sent", "to": "Carol", "amount": 40,
                     "id": ledger["transfers"][0]["key"]}},
        {"role": "tool", "tool_call_id": "call_Bal2Zp",
         "content": {"account": "main", "balance": 1000}},
    ]


@pytest.mark.integration
def test_real_anthropic_transfer_parks_then_the_answer_resumes_it_and_sends_once(real,
                                                                                  provider):
    provider.reply(anthropic_message([{"type": "tool_use", "id": "toolu_T250",
                                       "name": "transfer_funds",
                                       "input": {"to": "Bob", "amount": 250}}]))
    provider.reply(anthropic_message([{"type": "text", "text": "Sent 250 to Bob."}]))

    run_id = real.start_run("demo.assistant_anthropic", "Send 250 to Bob")["id"]
    parked = real.wait_status(run_id, "interrupted")

    [approval] = real.open_interrupts(parked)
    assert approval["toolCallId"] == "toolu_T250" and approval["message"] == "Send 250 to Bob?"
    [first] = provider.requests
    assert first["path"] == "/v1/messages"
    assert first["json"]["model"] == "claude-test" and first["json"]["system"] == \
        demo_providers.SYSTEM
    assert first["json"]["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Send 250 to Bob"}]}]

    assert real.answer(run_id, approval["id"], payload={"approved": True}).status_code == 200
    done = real.wait_status(run_id, "completed")

    assert done["result"] == "Sent 250 to Bob."
    [transfer] = ledger_of(real, run_id)["transfers"]
    assert (transfer["to"], transfer["amount"]) == ("Bob", 250)
    messages = provider.requests[1]["json"]["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    [result] = messages[2]["content"]
    assert result["type"] == "tool_result" and result["tool_use_id"] == "toolu_T250"
    assert json.loads(result["content"]) == {"status": "sent", "to": "Bob", "amount": 250,
                                             "id": transfer["key"]}


@pytest.mark.integration
def test_real_anthropic_several_calls_in_one_turn(real, provider):
    uses = [{"type": "tool_use", "id": cid.replace("call_", "toolu_"), "name": name,
             "input": args} for cid, name, args in PARALLEL_CALLS]
    provider.reply(anthropic_message([{"type": "text", "text": "I'll check a few things."},
                                      *uses]))
    provider.reply(anthropic_message([{"type": "text", "text": "No money was sent."}]))

    run_id = real.start_run("demo.assistant_anthropic", "Pay Carol 40")["id"]
    asked = open_by_tool(real, real.wait_status(run_id, "interrupted"))
    assert set(asked) == {"ask_question", "transfer_funds"}
    assert real.answer(run_id, asked["ask_question"]["id"], payload="main").status_code == 200
    assert real.answer(run_id, asked["transfer_funds"]["id"], status="cancelled",
                       metadata={"reason": "not this month"}).status_code == 200
    done = real.wait_status(run_id, "completed")

    assert done["result"] == "No money was sent."
    ledger = ledger_of(real, run_id)
    assert ledger["transfers"] == []
    assert [c["tool"] for c in ledger["calls"]] == ["check_balance"]
    messages = provider.requests[1]["json"]["messages"]
    assert messages[1]["content"][1:] == uses
    results = messages[2]["content"]
    assert [r["tool_use_id"] for r in results] == ["toolu_Qk3Lw9", "toolu_Tr8mXa",
                                                   "toolu_Bal2Zp"]
    assert [json.loads(r["content"]) for r in results] == [
        "main", {"status": "declined", "reason": "not this month"},
        {"account": "main", "balance": 1000}]


@pytest.mark.integration
def test_real_401_fails_the_run_at_once_with_a_clear_message_without_the_key(real, provider):
    provider.reply({"error": {"message": f"Incorrect API key provided: {KEY}.",
                              "type": "invalid_request_error", "code": "invalid_api_key"}},
                   status=401)

    run_id = real.start_run("demo.assistant", "Send 250 to Bob")["id"]
    failed = real.wait_status(run_id, "failed", timeout=20)

    error = failed["error"]
    assert error["code"] == "model_error"
    assert f"the OpenAI-compatible server at {provider.url}/v1 refused the API key (401)" \
        in error["message"]
    assert "set LAYBY_OPENAI_API_KEY" in error["message"]
    assert "failed 3 times" not in error["message"]
    assert not leaks(json.dumps(failed))
    assert len(provider.requests) == 1  # neither the SDK nor the worker tried again
    assert not leaks(real.procs["worker"].output())


@pytest.mark.integration
def test_real_500_twice_then_200_is_retried_by_the_sdk_and_the_run_goes_on(real, provider):
    for _ in range(2):
        provider.reply({"error": {"message": "The server had an error."}}, status=500,
                       retry_after_ms="5")
    provider.reply(completion(content="Hello."))

    run_id = real.start_run("demo.assistant", "hi")["id"]

    assert real.wait_status(run_id, "completed")["result"] == "Hello."
    assert len(provider.requests) == 3


@pytest.mark.integration
def test_real_transient_errors_past_the_sdk_retries_are_tried_again_by_the_worker(real,
                                                                                 provider):
    for _ in range(3):  # the SDK's 3 tries (LAYBY_OPENAI_MAX_RETRIES=2) all fail
        provider.reply({"error": {"message": "Overloaded."}}, status=503, retry_after_ms="5")
    provider.reply(completion(content="Hello."))

    run_id = real.start_run("demo.assistant", "hi")["id"]

    assert real.wait_status(run_id, "completed")["result"] == "Hello."
    assert len(provider.requests) == 4
