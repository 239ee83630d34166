"""faults: the fault suite, one concern only — what layby does when its parts die.

`python -m faults` starts the parts as separate processes on loopback (Valkey, workers,
the sweeper, the gateway, the reply listener, an SMTP server and a webhook receiver) and
runs the scenarios of issue "recovery in seconds": a SIGKILL storm on the workers, the store
killed in each phase of a run, fifty concurrent answers per interrupt over every channel,
hostile mail under load, a log scan for secrets, and a Sentinel failover. Each scenario is
bounded in time and prints its figures against its targets; `--short` is the version CI
runs (tests/faults/test_faults.py). Nothing here is imported by the product.
"""
