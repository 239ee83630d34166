"""Task and queue names, defined once. They are public and stable: other services enqueue by
name with `send_task`, and operators read them in Flower.

| task                    | queue        | arguments                                  |
|-------------------------|--------------|--------------------------------------------|
| layby.start_run         | layby.turns  | agent, input, metadata?, run_id?           |
| layby.run_turn          | layby.turns  | run_id, version                            |
| layby.resume_run        | layby.turns  | run_id, version                            |
| (a pinned run's steps)  | layby.turns@<version> | run_id, version                   |
| layby.sweep             | layby.sweep  | (none)                                     |
| layby.notify.interrupts | layby.notify | run_id, version (plans the announcements)  |
| layby.notify.deliver    | layby.notify | run_id, notification_id                    |
| layby.notify.slack      | layby.notify | run_id, interrupt_ids, approval (Slack updates)|

Background jobs (users' own tasks) run on `layby.jobs`, Celery's default queue for this app.
The steps of a run whose agent pins its version (`on_change="pin"`) go to
`layby.turns@<version>`, read by the workers that host that version (`pinned_queue`).
"""

TURNS = "layby.turns"
NOTIFY = "layby.notify"
SWEEP = "layby.sweep"
JOBS = "layby.jobs"
QUEUES = (TURNS, NOTIFY, SWEEP, JOBS)


def pinned_queue(version: str) -> str:
    """The queue of the steps of runs pinned to agent version `version`."""
    return f"{TURNS}@{version}"


START_RUN = "layby.start_run"
RUN_TURN = "layby.run_turn"
RESUME_RUN = "layby.resume_run"
SWEEP_TASK = "layby.sweep"
NOTIFY_TASK = "layby.notify.interrupts"
DELIVER_TASK = "layby.notify.deliver"
SLACK_TASK = "layby.notify.slack"
