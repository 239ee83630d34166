"""Who may do what: the rights a caller may hold, the identity every call carries, and the
rules that decide (start an agent, read, answer, approve, cancel; four eyes).

An `Identity` is a key's (its tenant and rights), or a run token's (one run, rights no
more than the key that minted it). A right missing is `Forbidden` (403, code
`forbidden`), naming the right; a run of another tenant is `NotFound` (404), never a hint
that it exists.
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase

from layby.errors import Forbidden, NotFound

START, READ, ANSWER, APPROVE, CANCEL = "start", "read", "answer", "approve", "cancel"
SELF_APPROVE, ADMIN = "self-approve", "admin"
DEFAULT_RIGHTS = frozenset({START, READ, ANSWER, APPROVE, CANCEL})
RIGHTS = DEFAULT_RIGHTS | {SELF_APPROVE, ADMIN}
SELF_APPROVAL = "self_approval"  # the code of a refused approval of one's own run
KEY_REVIEWER = "api:"  # a tool's `reviewers=` naming a key: "api:<name>"


@dataclass(frozen=True)
class Identity:
    """Who calls: `caller` as answers and the audit record it (`api:<name>`), the tenant
    whose runs it sees, its rights, the agents it may start (fnmatch patterns), and for a
    run token the one run it is for."""

    caller: str
    tenant: str
    rights: frozenset[str]
    agents: tuple[str, ...] = ("*",)
    run: str | None = None
    issued_ms: int | None = None  # a run token's: when it was minted (revocation is by time)

    def has(self, right: str) -> bool:
        return right in self.rights or ADMIN in self.rights

    def require(self, right: str, what: str = "") -> None:
        if not self.has(right):
            raise Forbidden(f"{self.caller} may not {right}{' ' + what if what else ''}: its "
                            f"rights are {sorted(self.rights)}", detail={"right": right})

    def may_start(self, agent: str) -> None:
        self.require(START, f"runs of {agent!r}")
        if self.run is not None:
            raise Forbidden("a run token is for its run alone: it starts nothing",
                            detail={"right": START})
        if not any(fnmatchcase(agent, pattern) for pattern in self.agents):
            raise Forbidden(f"{self.caller} may not start {agent!r}: it may start "
                            f"{list(self.agents)}", detail={"agent": agent})

    def may_start_named(self, agent: str) -> bool:
        """Whether this identity may start runs of `agent` (no refusal: for listings)."""
        return self.has(START) and self.run is None and any(
            fnmatchcase(agent, pattern) for pattern in self.agents)

    def sees(self, run_id: str, tenant: str | None) -> bool:
        """Whether a run of `tenant` (None: `default`) exists for this caller."""
        if self.run is not None and self.run != run_id:
            return False
        return ADMIN in self.rights or (tenant or "default") == self.tenant

    def reach(self, run_id: str, tenant: str | None) -> None:
        """NotFound for a run this caller may not see, as for a run that does not exist."""
        if not self.sees(run_id, tenant):
            raise NotFound(f"no run {run_id!r} (unknown, or finished and past retention)",
                           run_id=run_id)

    def may_approve(self, run_id: str, started_by: str | None) -> None:
        """Four eyes: the caller that started a run does not approve its interrupts, unless
        it holds `self-approve`."""
        self.require(APPROVE, "(an approval)")
        if started_by is not None and started_by == self.caller \
                and not self.has(SELF_APPROVE):
            raise Forbidden(f"{self.caller} started run {run_id}, so it may not approve it: "
                            "another caller must (four eyes), or give this key the right "
                            "`self-approve`", run_id=run_id, code=SELF_APPROVAL,
                            detail={"startedBy": started_by})


def keys_named(names: list[str] | None) -> set[str]:
    """The keys among an interrupt's reviewers (`api:<name>`): a service made a reviewer on
    purpose."""
    return {name for name in names or () if name.startswith(KEY_REVIEWER)}


def may_review(who: Identity, interrupt_id: str, named: set[str]) -> None:
    """An interrupt that names keys among its reviewers is answered through the API by
    those keys alone (each still within its rights); one that names none, by any key with
    the right."""
    if named and who.caller not in named:
        raise Forbidden(f"interrupt {interrupt_id} is for the reviewers it names, and of the "
                        f"keys only {sorted(named)}: {who.caller} is not one of them",
                        detail={"reviewers": sorted(named)})


# Everything, in tenant `default`: the layby command on the store's own machine.
OPERATOR = Identity("operator", "default", RIGHTS)
