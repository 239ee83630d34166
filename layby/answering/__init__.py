"""layby.answering: the ways answers come in from reviewers. The answer page's forms and
pages, email replies (the SMTP listener and the inbound-mail webhook's reading of them),
webhook callbacks, Slack's interactions (`slack_interactions`; the messages going out are
`layby.notifier.slack_messages`), token checks, and the local mail catcher; every answer
goes through `layby.control`. The reviewers' inbox at `/inbox` is `layby.inbox`."""
