"""The reviewer directory: who may answer, and how each is reached.

Read from the TOML or YAML file named by `LAYBY_REVIEWERS_FILE`:

    default_group = "ops"

    [reviewers.alice]
    name = "Alice Martin"
    email = "alice@example.com"

    [reviewers.payments-bot]
    webhook = { url = "https://hooks.example.com/layby", secret = "whsec_…" }

    [groups]
    ops = ["alice", "payments-bot"]

A reviewer away says until when and who takes their new requests:

    [reviewers.alice]
    away_until = 2026-12-31T00:00:00Z
    delegate_to = "bob"

A reviewer on Slack has their Slack user id, and is sent a direct message; a group with a
Slack channel has its requests posted there (its members are not sent direct messages of
what the channel shows):

    [reviewers.alice]
    slack_id = "U024BE7LH"

    [groups.ops]
    members = ["alice", "payments-bot"]
    slack_channel = "C0123ABCD"

An interrupt names people and groups (`ctx.interrupt(reviewers=[...])`); with none, the
default group is asked. Webhook secrets stay in this file: they are never logged, stored
in Redis or sent in a task.
"""

from __future__ import annotations

import base64
import binascii
import tomllib
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from layby.errors import ConfigError


class Webhook(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: str = Field(pattern=r"^https?://")
    # A Standard Webhooks secret: "whsec_" and base64 of 24 to 64 random bytes. It signs
    # what layby sends and verifies what the reviewer's system sends back.
    secret: str = Field(repr=False)

    @field_validator("secret")
    @classmethod
    def _standard_secret(cls, value: str) -> str:
        body = value.removeprefix("whsec_")
        try:
            raw = base64.b64decode(body + "=" * (-len(body) % 4), validate=True)
        except binascii.Error:
            raw = b""
        if not value.startswith("whsec_") or len(raw) < 16:
            raise ValueError("a webhook secret must read 'whsec_' and the base64 of 16 or "
                             "more random bytes (make one with `layby secret webhook`)")
        return value


SLACK_USER = r"^[UW][A-Z0-9]{6,20}$"
SLACK_CHANNEL = r"^[CG][A-Z0-9]{6,20}$"


class Reviewer(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str = ""
    name: str | None = None
    email: str | None = Field(None, pattern=r"^[^@\s]+@[^@\s]+$")
    webhook: Webhook | None = None
    # Away: until then, new requests for this reviewer go to `delegate_to` instead.
    away_until: datetime | None = None
    delegate_to: str | None = None
    # A Slack user id ("U…" or "W…", as Slack shows under the profile's "Copy member ID").
    slack_id: str | None = Field(None, pattern=SLACK_USER)

    @property
    def label(self) -> str:
        return self.name or self.id

    def away(self, now: float) -> bool:
        return bool(self.delegate_to and self.away_until
                    and self.away_until.timestamp() > now)


class Directory(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reviewers: dict[str, Reviewer] = Field(default_factory=dict)
    groups: dict[str, list[str]] = Field(default_factory=dict)
    default_group: str | None = None
    # Group → the Slack channel its requests are posted to (a group written as a table
    # with `members` and `slack_channel`).
    slack_channels: dict[str, Annotated[str, Field(pattern=SLACK_CHANNEL)]] = Field(
        default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _group_tables(cls, data: Any) -> Any:
        """A group is a list of reviewers, or a table: `members` and `slack_channel`."""
        if not isinstance(data, dict) or not isinstance(data.get("groups"), dict):
            return data
        groups, channels = {}, dict(data.get("slack_channels") or {})
        for name, group in data["groups"].items():
            if isinstance(group, dict):
                unknown = set(group) - {"members", "slack_channel"}
                if unknown:
                    raise ValueError(f"group {name!r} has unknown keys {sorted(unknown)}: a "
                                     "group table takes `members` and `slack_channel`")
                groups[name] = group.get("members") or []
                if group.get("slack_channel") is not None:
                    channels[name] = group["slack_channel"]
            else:
                groups[name] = group
        return {**data, "groups": groups, "slack_channels": channels}

    @model_validator(mode="after")
    def _consistent(self) -> Directory:
        for rid, reviewer in self.reviewers.items():
            reviewer.id = rid
        for rid, reviewer in self.reviewers.items():
            if reviewer.delegate_to is not None and (
                    reviewer.delegate_to not in self.reviewers or reviewer.delegate_to == rid):
                raise ValueError(f"reviewer {rid!r}: delegate_to {reviewer.delegate_to!r} "
                                 "is not another reviewer of the directory")
            if reviewer.away_until is not None and reviewer.away_until.tzinfo is None:
                reviewer.away_until = reviewer.away_until.replace(tzinfo=UTC)
        if "*" in self.reviewers or "*" in self.groups:
            # The request index's name for the default group (`parking.store.inbox`).
            raise ValueError("'*' may not name a reviewer or a group: it stands for the "
                             "default group")
        for group, members in self.groups.items():
            unknown = [m for m in members if m not in self.reviewers]
            if unknown:
                raise ValueError(f"group {group!r} names unknown reviewers {unknown}")
            if group in self.reviewers:
                raise ValueError(f"{group!r} is both a reviewer and a group")
        for group in self.slack_channels:
            if group not in self.groups:
                raise ValueError(f"slack_channels names {group!r}, which is not a group")
        if self.default_group and self.default_group not in self.groups:
            raise ValueError(f"default_group {self.default_group!r} is not a group")
        return self

    def resolve(self, names: list[str] | None) -> list[Reviewer]:
        """The people behind a list of people and groups (the default group for none)."""
        wanted = names or ([self.default_group] if self.default_group else [])
        found: dict[str, Reviewer] = {}
        for name in wanted:
            if name in self.groups:
                found.update((m, self.reviewers[m]) for m in self.groups[name])
            elif name in self.reviewers:
                found[name] = self.reviewers[name]
        return list(found.values())

    def by_slack_id(self, slack_id: str) -> Reviewer | None:
        return next((r for r in self.reviewers.values() if r.slack_id == slack_id), None)

    def by_email(self, address: str) -> Reviewer | None:
        address = address.strip().lower()
        return next((r for r in self.reviewers.values()
                     if r.email and r.email.lower() == address), None)


def read_file(path: Path, what: str) -> Any:
    """The data in a TOML or YAML file (by its suffix); ConfigError naming `what` and where
    it breaks. Never quotes the file: a broken line may hold a webhook secret."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read {what}: {exc}") from exc
    try:
        return tomllib.loads(text) if path.suffix == ".toml" else yaml.safe_load(text) or {}
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"{what} is not valid YAML{where}: "
                          f"{exc.problem or exc.context}") from None
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"{what} is invalid: {exc}") from None


def load_directory(path: Path | None) -> Directory:
    if path is None:
        return Directory()
    data = read_file(path, f"the reviewer directory {path}")
    if isinstance(data, dict):
        data.pop("rules", None)  # policy rules may live here too (reviewers.policy)
    try:
        return Directory.model_validate(data)
    except ValidationError as exc:
        # Without the input values: a mistyped webhook secret must not reach any message.
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}"
                             for e in exc.errors(include_input=False, include_url=False))
        raise ConfigError(f"the reviewer directory {path} is invalid: {problems}") from None
    except ValueError as exc:
        raise ConfigError(f"the reviewer directory {path} is invalid: {exc}") from None
