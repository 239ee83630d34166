"""bench: the benchmark harness, one concern only — how much an interrupt cycle costs.

`python -m bench` measures, in one run on one Redis/Valkey and one real worker, layby's
interrupt cycle (start → interrupt → answer → resume → complete, scripted model) against a
bare Celery chain with the same number of task hops, and the time from an answer to the
continuation starting. See bench/README.md.

Nothing here is imported by the product. This package imports no layby module at import
time: the benchmark sets the environment (which Redis, which key prefix) first.
"""


class BenchError(RuntimeError):
    """The benchmark could not finish (a run failed, nothing moved before the timeout, the
    server is unreachable); `python -m bench` prints it and exits with status 1."""
