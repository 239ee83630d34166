"""The `layby` command as a person at a shell (without a terminal on stdin) uses it, on the
same Redis as the shared system: start a run, list, answer, show, cancel, read events."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.support import forkserver
from tests.support.harness import ROOT, LaybySystem

LAYBY = str(Path(sys.executable).parent / "layby")
USER = "ada"


def layby(system: LaybySystem, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {**system.env, "USER": USER}
    return forkserver.run([LAYBY, *args], env, ROOT, timeout)


def _clean_failure(done: subprocess.CompletedProcess[str], *expected: str) -> None:
    """Failed with a message a person can act on, and without a Python traceback."""
    assert done.returncode != 0, done.stdout
    assert "Traceback" not in done.stderr + done.stdout, done.stderr
    assert done.stderr.startswith("error: "), done.stderr
    for text in expected:
        assert text in done.stderr, done.stderr


def _start_parked(system: LaybySystem) -> tuple[str, str]:
    done = layby(system, "run", "demo.trivia", "Ask me a movie question")
    assert done.returncode == 0, done.stderr
    match = re.match(r"run (run_\w+) \(demo\.trivia\) queued", done.stdout)
    assert match, done.stdout
    return match.group(1), done.stdout


def test_run_list_answer_show(system: LaybySystem) -> None:
    run_id, out = _start_parked(system)
    question = system.open_interrupts(system.run(run_id))[0]
    assert f"waiting: {question['id']} [input_required]" in out
    assert "Don't go in the water" in out
    assert '"enum": ["Jaws", "Alien"' in out  # what the answer must be
    assert f"answer with: layby runs answer {run_id} {question['id']} --text Jaws" in out
    assert "<interrupt id>" not in out
    assert system.run(run_id)["status"] == "interrupted"

    listed = layby(system, "runs", "ls", "--status", "interrupted")
    assert listed.returncode == 0, listed.stderr
    (line,) = [ln for ln in listed.stdout.splitlines() if ln.startswith(run_id)]
    assert "interrupted" in line and "demo.trivia" in line and "1 open" in line
    everything = layby(system, "runs", "ls", "--status", "completed")
    assert run_id not in everything.stdout

    answered = layby(system, "runs", "answer", run_id, "--text", "Jaws")  # no interrupt id
    assert answered.returncode == 0, answered.stderr
    assert answered.stdout.strip() == f"answered {question['id']}; the run resumes"
    done = system.wait_status(run_id, "completed")
    assert done["result"].startswith("Right!")
    assert done["interrupts"][0]["answer"]["answeredBy"] == f"cli:{USER}"
    assert done["interrupts"][0]["answer"]["channel"] == "cli"

    shown = layby(system, "runs", "show", run_id)
    assert shown.returncode == 0, shown.stderr
    assert f"{run_id}  demo.trivia  completed" in shown.stdout
    assert f"interrupt {question['id']} [input_required] resolved by cli:{USER} via cli" \
        in shown.stdout
    assert "ask_question → \"Jaws\"" in shown.stdout
    assert "result: Right! It was Jaws (1975)." in shown.stdout
    as_json = json.loads(layby(system, "runs", "show", run_id, "--json").stdout)
    assert as_json["status"] == "completed" and as_json["id"] == run_id

    events = layby(system, "runs", "events", run_id)
    assert events.returncode == 0, events.stderr
    parsed = [json.loads(line) for line in events.stdout.splitlines()]
    kinds = [e["type"] for e in parsed]
    assert kinds[0] == "run.created" and kinds[-1] == "run.completed", kinds
    assert "interrupt.answered" in kinds
    answer_event = parsed[kinds.index("interrupt.answered")]["data"]
    assert answer_event["answeredBy"] == f"cli:{USER}" and answer_event["payload"] == "Jaws"


def test_refused_answers_are_clear_errors(system: LaybySystem) -> None:
    run_id, _ = _start_parked(system)
    wrong = layby(system, "runs", "answer", run_id, "--text", "Titanic")
    _clean_failure(wrong, "does not match", "'Titanic' is not one of ['Jaws'")
    assert system.run(run_id)["status"] == "interrupted"

    not_json = layby(system, "runs", "answer", run_id, "--payload", '{"oops": ')
    _clean_failure(not_json, "--payload is not valid JSON")
    nothing = layby(system, "runs", "answer", run_id)
    _clean_failure(nothing, "give exactly one of --approve, --decline, --text, --payload")
    unknown_interrupt = layby(system, "runs", "answer", run_id, "int_nope", "--text", "Jaws")
    _clean_failure(unknown_interrupt, "has no interrupt 'int_nope'")
    unknown_run = layby(system, "runs", "answer", "run_nobody_made", "--text", "Jaws")
    _clean_failure(unknown_run, "no run 'run_nobody_made'")
    unknown_agent = layby(system, "run", "demo.nope", "hello")
    _clean_failure(unknown_agent, "no agent named 'demo.nope'", "demo.trivia")

    assert system.open_interrupts(system.run(run_id))[0].get("answer") is None
    assert layby(system, "runs", "answer", run_id, "--text", "Alien").returncode == 0
    assert "you said Alien" in system.wait_status(run_id, "completed")["result"]
    again = layby(system, "runs", "answer", run_id, "--text", "Jaws")
    # Nothing is open any more: the command says so instead of guessing an interrupt.
    _clean_failure(again, f"run {run_id} is completed: no interrupt is waiting for an answer")


def test_cancel_from_the_command_line(system: LaybySystem) -> None:
    run_id, _ = _start_parked(system)
    cancelled = layby(system, "runs", "cancel", run_id, "--reason", "wrong quiz")
    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.stdout.strip() == f"run {run_id} is cancelled"
    run: dict[str, Any] = system.run(run_id)
    assert run["status"] == "cancelled"
    assert run["error"]["message"] == "wrong quiz" and run["error"]["by"] == f"cli:{USER}"
    twice = layby(system, "runs", "cancel", run_id)
    _clean_failure(twice, f"run {run_id} is already cancelled")
    late = layby(system, "runs", "answer", run_id, "--text", "Jaws")
    _clean_failure(late, f"run {run_id} is cancelled: no interrupt is waiting")


def test_run_that_fails_exits_non_zero(system: LaybySystem) -> None:
    done = layby(system, "run", "test.loop", "go round")
    assert done.returncode == 1, done.stdout
    assert "run.failed: agent 'test.loop' reached its limit of 3 model turns" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr


def _hinted(out: str) -> list[str]:
    """The `layby runs answer …` commands the parked-run hint prints, as a person would
    paste them (up to the note in parentheses)."""
    return [shlex.split(line.split("answer with: layby ", 1)[1].split("   (")[0])
            for line in out.splitlines() if line.startswith("answer with: ")]


def test_the_parked_run_hint_prints_real_ids_and_runs_as_pasted(system: LaybySystem) -> None:
    """What was observed: the hint printed `<interrupt id>` although it knew the id. Now it
    prints, per open interrupt, a command with both ids and the option that fits; pasted,
    each answers."""
    done = layby(system, "run", "demo.parallel", "Pay Carol")
    assert done.returncode == 0, done.stderr
    run_id = re.match(r"run (run_\w+) ", done.stdout).group(1)  # type: ignore[union-attr]
    waiting = {i["id"]: i for i in system.open_interrupts(system.run(run_id))}
    commands = _hinted(done.stdout)
    assert len(commands) == len(waiting) == 2, done.stdout
    assert "<interrupt id>" not in done.stdout and "<run id>" not in done.stdout
    for argv in commands:
        assert argv[:3] == ["runs", "answer", run_id] and argv[3] in waiting, argv
        flags = argv[4:]
        if waiting[argv[3]]["reason"] == "confirmation":
            assert flags == ["--approve"], argv
        else:
            assert flags[0] == "--text", argv
        answered = layby(system, *argv)
        assert answered.returncode == 0, answered.stderr
    assert system.wait_status(run_id, "completed")["status"] == "completed"


def test_the_timeline_shows_each_step_its_calls_the_wait_and_who_answered(
        system: LaybySystem) -> None:
    """`layby runs show RUN --timeline`: the transfer's first step parks on the approval,
    the key approves it a while later, the resumed step sends the money and the run ends;
    each with when, how long, on which worker and by whom."""
    run_id = system.start_run("demo.transfer", "Send 250 to Bob")["id"]
    run = system.wait_status(run_id, "interrupted")
    [interrupt] = system.open_interrupts(run)
    assert system.answer(run_id, interrupt["id"], payload={"approved": True}).status_code == 200
    system.wait_status(run_id, "completed")
    shown = system.layby("runs", "show", run_id, "--timeline")
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0].startswith(f"{run_id}  demo.transfer  completed")
    # Each line: the time since the run was created (10 wide; none for a step's calls),
    # then what happened.
    kinds = [line[12:].split()[0] for line in lines[1:]]
    assert kinds == ["created", "step", "parked", "answered", "resuming", "step", "tool",
                     "committed", "model", "completed"], shown.stdout
    parked = next(line for line in lines if " parked " in line)
    assert f"waits for {interrupt['id']} (confirmation)" in parked
    answered = next(line for line in lines if " answered " in line)
    assert f"{interrupt['id']} resolved" in answered and "via api" in answered
    assert re.search(r"by api-key:\w+", answered)
    tool = next(line for line in lines if line[12:].split()[0] == "tool")
    assert re.search(r"transfer_funds \(\w+\)\s+\d+ ms", tool), tool
    completed = lines[-1]
    assert re.search(r"on [\w.-]+:\d+$", completed), completed
    # As data, for scripts: the same entries, with times in ms.
    as_json = json.loads(system.layby("runs", "show", run_id, "--timeline", "--json").stdout)
    assert [e["what"] for e in as_json] == kinds
    waited = next(e for e in as_json if e["what"] == "answered")
    assert waited["channel"] == "api" and waited["tookMs"] >= 0
