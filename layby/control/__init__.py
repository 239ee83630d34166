"""control: the operations every way in shares (start, answer, resume, cancel, requeue),
each a check, one `parking` transition, then a publish of its outbox."""

from layby.control import commands, runtime

__all__ = ["commands", "runtime"]
