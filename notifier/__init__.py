"""notifier: channels out (email, webhook) and answers in (email replies, signed callbacks).

Not built yet: interrupts are announced on each run's event stream (`run.interrupted`) and
answered through `/v1` or the `layby` command. Email and webhooks come with the reviewer
work (issue 3).
"""
