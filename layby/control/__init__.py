"""layby.control: the use cases every way in shares (start, answer, resume, cancel, requeue,
on-call work), each a check, one `layby.parking` transition, then a publish of its outbox;
and the application object they run on (`Runtime`, built by `build()`)."""

from layby.control.runtime import Runtime, build

__all__ = ["Runtime", "build"]
