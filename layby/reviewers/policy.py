"""Reviewer policies: ordered rules that decide, when a run parks, what happens to each
interrupt: answered by rule (`approve`, `decline`) or asked of people (`ask`: whom, how many
approvals, who next when nobody answers, how often to remind).

Rules live in the reviewer directory file (`[[rules]]`) or in their own file
(`LAYBY_POLICY_FILE`), TOML or YAML:

    [[rules]]
    name = "small-refunds"
    tool = "refund"
    when = "input.amount <= 100 && metadata.tier == 'gold'"
    action = "approve"

    [[rules]]
    name = "large-refunds"
    tool = "refund"
    when = "input.amount > 1000"
    reviewers = ["finance"]
    required_approvals = 2
    remind_every = "1h"
    escalate = [{ after = "30m", to = ["leads"] }, { after = "2h", to = ["oncall"] }]

    [[rules]]
    name = "default"        # no condition: routes the rest as the tool asks

`agent`, `tool` and `reason` match exactly or as shell patterns (`shop.*`); `when` is a CEL
expression (cel-python: no Python `eval`) over `input` (the tool's input), `metadata` (the
run's), `agent`, `tool` and `reason`. The first rule that matches decides; an interrupt
no rule matches is asked as its tool asked it. Background jobs are never subject to rules.
"""

from __future__ import annotations

import fnmatch
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)

from layby.errors import ConfigError
from layby.generation.answers import check_answer
from layby.generation.interrupts import BACKGROUND_JOB, Escalation, Interrupt, ResumeEntry
from layby.generation.tools import Tool
from layby.reviewers.directory import Directory, read_file
from layby.reviewers.schemas import has_approved

if TYPE_CHECKING:
    import celpy

log = logging.getLogger(__name__)

MAX_RULES = 500
MAX_REQUIRED_APPROVALS = 50
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")


def seconds(value: Any) -> float:
    """A duration as written in a rule file: a number of seconds, or "90s", "30m", "2h",
    "1d"."""
    if isinstance(value, bool):
        # ValueError, not TypeError: pydantic reports only ValueErrors as validation errors.
        raise ValueError("a duration is a number of seconds or text like '30m', '2h', '1d'")  # noqa: TRY004
    if isinstance(value, int | float):
        found = float(value)
    else:
        match = _DURATION.match(str(value))
        if not match:
            raise ValueError(f"{value!r} is not a duration: write a number of seconds or "
                             "text like '90s', '30m', '2h', '1d'")
        found = float(match.group(1)) * _UNITS[match.group(2) or "s"]
    if found <= 0:
        raise ValueError(f"a duration must be more than zero, not {value!r}")
    return found


Duration = Annotated[float, BeforeValidator(seconds)]
Names = Annotated[list[str], BeforeValidator(lambda v: [v] if isinstance(v, str) else v)]


class Level(BaseModel):
    """`after` this long unanswered, `to` these reviewers and groups are asked too."""

    model_config = ConfigDict(extra="forbid")

    after: Duration
    to: Names = Field(min_length=1)


class Rule(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$")
    agent: Names | None = None
    tool: Names | None = None
    reason: Names | None = None
    when: str | None = Field(None, max_length=4000)
    action: Literal["approve", "decline", "ask"] = "ask"
    payload: Any = None  # approve: the answer (default: {"approved": true} for approvals)
    note: str | None = Field(None, max_length=2000)  # approve / decline: a reason
    reviewers: Names | None = None
    required_approvals: int | None = Field(None, ge=1, le=MAX_REQUIRED_APPROVALS)
    escalate: list[Level] = Field(default_factory=list, max_length=10)
    remind_every: Duration | None = None

    @model_validator(mode="after")
    def _fits_action(self) -> Rule:
        if self.action != "ask":
            routing = [k for k in ("reviewers", "required_approvals", "escalate",
                                   "remind_every") if getattr(self, k)]
            if routing:
                raise ValueError(f"{', '.join(routing)} only apply to action 'ask'; a rule "
                                 f"that {self.action}s answers without asking anyone")
        elif self.payload is not None:
            raise ValueError("payload only applies to action 'approve'")
        if self.action == "decline" and self.payload is not None:
            raise ValueError("a decline takes a `note` (its reason), not a payload")
        afters = [level.after for level in self.escalate]
        if afters != sorted(afters) or len(set(afters)) != len(afters):
            raise ValueError("escalation levels must come in order of `after`, each later "
                             "than the one before")
        return self

    def names(self) -> list[str]:
        """Every reviewer and group the rule names."""
        return [*(self.reviewers or []), *(n for level in self.escalate for n in level.to)]


class RuleFile(BaseModel):
    model_config = ConfigDict(extra="ignore")  # the directory file holds rules beside it

    rules: list[Rule] = Field(default_factory=list, max_length=MAX_RULES)


@dataclass(frozen=True)
class Check:
    """One rule's verdict on one interrupt, and why."""

    rule: str
    matched: bool
    why: str


@dataclass(frozen=True)
class Decision:
    """What the policy does with one interrupt: the interrupt as it will be asked (routed),
    and for `approve` / `decline` the answer recorded at once."""

    interrupt: Interrupt
    rule: str | None = None
    action: Literal["approve", "decline", "ask"] = "ask"
    answer: ResumeEntry | None = None
    checks: list[Check] = field(default_factory=list)


@dataclass
class _Compiled:
    rule: Rule
    program: Any  # a celpy Runner, or None without a condition


class Policy:
    """Rules, compiled and checked against a reviewer directory."""

    def __init__(self, rules: list[Rule], source: str = "") -> None:
        self.source = source
        self._env: celpy.Environment | None = None
        self._rules = [_Compiled(r, self._compile(r)) for r in rules]

    @property
    def rules(self) -> list[Rule]:
        return [c.rule for c in self._rules]

    def _compile(self, rule: Rule) -> Any:
        if not rule.when:
            return None
        # cel-python and its parser cost every process that starts about 30 ms and 50
        # modules: only a deployment whose rules have conditions loads them.
        import celpy
        from celpy.celparser import CELParseError

        if self._env is None:
            self._env = celpy.Environment()
        try:
            return self._env.program(self._env.compile(rule.when))
        except CELParseError as exc:
            detail = str(exc).strip().splitlines()[0] if str(exc).strip() else "syntax error"
            raise ConfigError(f"rule {rule.name!r}: its condition `{rule.when}` does not "
                              f"parse as CEL: {detail}") from None

    def check(self, directory: Directory) -> None:
        """Refuse rules naming reviewers or groups the directory does not have (a key,
        `api:<name>`, is the keys file's)."""
        known = set(directory.reviewers) | set(directory.groups)
        for rule in self.rules:
            unknown = sorted({n for n in rule.names()
                              if n not in known and not n.startswith("api:")})
            if unknown:
                raise ConfigError(f"rule {rule.name!r} names unknown reviewers or groups "
                                  f"{unknown}; the directory knows {sorted(known)}")

    def evaluate(self, agent: str, tool: str, reason: str, tool_input: Any,
                 metadata: dict[str, Any] | None) -> tuple[Rule | None, list[Check]]:
        """The first rule matching, and each rule's verdict up to it (for `explain`)."""
        context = {"agent": agent, "tool": tool, "reason": reason,
                   "input": tool_input if tool_input is not None else {},
                   "metadata": metadata or {}}
        activation: dict[str, Any] | None = None
        checks: list[Check] = []
        for compiled in self._rules:
            rule = compiled.rule
            miss = next((f"{what} {value!r} is not {patterns}" for what, value, patterns in
                         (("agent", agent, rule.agent), ("tool", tool, rule.tool),
                          ("reason", reason, rule.reason))
                         if patterns is not None and not _matches(value, patterns)), None)
            if miss:
                checks.append(Check(rule.name, False, miss))
                continue
            if compiled.program is None:
                checks.append(Check(rule.name, True, "no condition"))
                return rule, checks
            if activation is None:
                from celpy.adapter import json_to_cel  # loaded by the rule's compiling

                activation = {k: json_to_cel(v) for k, v in context.items()}
            matched, why = _condition(compiled.program, activation, rule.when or "")
            checks.append(Check(rule.name, matched, why))
            if matched:
                return rule, checks
        return None, checks

    def decide(self, agent: str, interrupt: Interrupt, metadata: dict[str, Any] | None,
               tool: Tool | None = None) -> Decision:
        """What happens to `interrupt` of a run of `agent` as it parks."""
        if interrupt.reason == BACKGROUND_JOB:
            return Decision(interrupt)
        rule, checks = self.evaluate(agent, interrupt.tool_name, interrupt.reason,
                                     interrupt.tool_input, metadata)
        if rule is None:
            return Decision(interrupt, checks=checks)
        if rule.action == "ask":
            routed = interrupt.model_copy(update={
                "rule": rule.name,
                "reviewers": rule.reviewers or interrupt.reviewers,
                "required_approvals": rule.required_approvals or interrupt.required_approvals,
                "escalation": [Escalation(after_s=level.after, reviewers=level.to)
                               for level in rule.escalate] or None,
                "remind_every_s": rule.remind_every})
            return Decision(routed, rule.name, "ask", checks=checks)
        entry = _answer_of(rule, interrupt)
        errors = check_answer(interrupt, entry, tool)
        if errors:
            # A person answers instead: an answer the tool cannot take must not be given.
            log.error("rule %r cannot answer interrupt %s of tool %r: its payload does not "
                      "fit what the tool asks (%s: %s); asking as the tool asked instead. "
                      "Give the rule a `payload` that fits, or make it `ask`", rule.name,
                      interrupt.id, interrupt.tool_name, errors[0]["path"],
                      errors[0]["message"])
            checks.append(Check(rule.name, False, "its answer does not fit the tool: asked"))
            return Decision(interrupt, checks=checks)
        return Decision(interrupt.model_copy(update={"rule": rule.name}), rule.name,
                        rule.action, entry, checks)


def _matches(value: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatchcase(value, p) for p in patterns)


def _condition(program: Any, activation: dict[str, Any], text: str) -> tuple[bool, str]:
    import celpy  # loaded by the rule's compiling
    from celpy.evaluation import CELEvalError

    try:
        result = program.evaluate(activation)
    except CELEvalError as exc:
        detail = exc.args[0] if exc.args else str(exc)
        return False, f"`{text}` could not be evaluated ({detail}): taken as false"
    if isinstance(result, CELEvalError):  # cel-python returns some errors as values
        detail = result.args[0] if result.args else str(result)
        return False, f"`{text}` could not be evaluated ({detail}): taken as false"
    if not isinstance(result, celpy.celtypes.BoolType):
        return False, f"`{text}` gives {result!r}, not true or false: taken as false"
    return bool(result), f"`{text}` is {'true' if result else 'false'}"


def _answer_of(rule: Rule, interrupt: Interrupt) -> ResumeEntry:
    if rule.action == "decline":
        return ResumeEntry(interrupt_id=interrupt.id, status="cancelled",
                           metadata={"reason": rule.note or f"declined by rule {rule.name}"})
    payload = rule.payload
    if payload is None and has_approved(interrupt.response_schema):
        payload = {"approved": True, **({"note": rule.note} if rule.note else {})}
    return ResumeEntry(interrupt_id=interrupt.id, status="resolved", payload=payload)


def load_rules(path: Path) -> Policy:
    """The rules in `path` (TOML or YAML), compiled; ConfigError naming the rule and the
    problem when they cannot be used."""
    data = read_file(path, f"the rules file {path}")
    if not isinstance(data, dict):
        raise ConfigError(f"the rules file {path} must be a table with a `rules` list")
    try:
        parsed = RuleFile.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"the rules file {path} is invalid: "
                          f"{_problems(exc, data.get('rules'))}") from None
    names = [r.name for r in parsed.rules]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"the rules file {path} names {twice} more than once; rule names are "
                          "what the audit records, so each must be unique")
    try:
        return Policy(parsed.rules, str(path))
    except ConfigError as exc:
        raise ConfigError(f"the rules file {path} is invalid: {exc.message}") from None


def _problems(exc: ValidationError, raw: Any) -> str:
    """Each error, named by its rule (`rule 'large-refunds': escalate.0.after: …`)."""
    out = []
    for error in exc.errors(include_input=False, include_url=False):
        loc = list(error["loc"])
        where = ".".join(str(p) for p in loc)
        if len(loc) >= 2 and loc[0] == "rules" and isinstance(loc[1], int):
            item = raw[loc[1]] if isinstance(raw, list) and loc[1] < len(raw) else None
            name = item.get("name") if isinstance(item, dict) else None
            label = f"rule {name!r}" if name else f"rule #{loc[1] + 1}"
            where = label + (": " + ".".join(str(p) for p in loc[2:]) if loc[2:] else "")
        out.append(f"{where}: {error['msg']}")
    return "; ".join(out)
