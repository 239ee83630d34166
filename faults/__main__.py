"""`python -m faults [--short] [--only NAME …] [--json FILE]`: run the scenarios, print
each one's figures and targets, exit 1 if a target was missed."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from faults.common import Outcome, Size

ROOT = Path(__file__).resolve().parent.parent


def scenarios() -> dict[str, Callable[[Size, Path], Outcome]]:
    from faults import answers, cluster, failover, hostile, logscan, retries, store, storm

    return {"storm": storm.run, "store": store.run, "hostile": hostile.run,
            "failover": failover.run, "cluster": cluster.run, "retries": retries.run,
            "answers": answers.run, "logscan": logscan.run}


def main(argv: list[str] | None = None) -> int:
    found = scenarios()
    p = argparse.ArgumentParser(prog="python -m faults", description=(
        "layby's fault suite: its parts killed, its store restarted, its gateway fed "
        "hostile input; figures against targets."))
    p.add_argument("--short", action="store_true", help="the small version CI runs")
    p.add_argument("--only", nargs="+", choices=sorted(found), help="these scenarios only")
    p.add_argument("--json", type=Path, help="also write the outcomes here")
    args = p.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    # Each process from a new interpreter, as a deployment starts it, not forked by the
    # tests' fork server (tests/support/forkserver.py): a worker started again after a
    # kill must take as long to be ready as it would in production.
    os.environ["LAYBY_TEST_FORKSERVER"] = "0"
    # The suite's callers (its httpx clients, thousands of them in `answers`) take one TLS
    # context, as the tests' do (tests/support/tls.py): built for each, they cost this
    # process more CPU than layby's processes it measures on the same cores.
    from tests.support.tls import share

    share()
    outcomes = []
    with tempfile.TemporaryDirectory(prefix="layby-faults-") as tmp:
        for name in args.only or found:
            started = time.monotonic()
            print(f"faults: {name} …", file=sys.stderr, flush=True)
            outcome = found[name](Size(args.short), Path(tmp) / name)
            outcome.figures["scenario took (s)"] = round(time.monotonic() - started)
            outcomes.append(outcome)
            print(report(outcome), flush=True)
    if args.json:
        args.json.write_text(json.dumps([o.__dict__ for o in outcomes], indent=2) + "\n")
    return 0 if all(o.ok for o in outcomes) else 1


def report(outcome: Outcome) -> str:
    lines = [f"## {outcome.name}: {'ok' if outcome.ok else 'MISSED'}"]
    lines += [f"  {k:<40} {v}" for k, v in outcome.figures.items()]
    lines += [f"  [{'x' if met else ' '}] {target}" for target, met in outcome.targets.items()]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
