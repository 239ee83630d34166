"""layby.notifier: the way out to reviewers. Planning who hears of which interrupt, and
delivering each notification once by email or signed webhook, with retries, reminders and
a record of how it went."""
