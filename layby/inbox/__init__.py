"""layby.inbox: answers from reviewers. The answer page's forms and pages, email replies (the
SMTP listener and the inbound-mail webhook's reading of them), token checks, and the local
mail catcher; every answer goes through `layby.control`."""
