"""layby.reviewers: who reviewers are and how they prove it. The reviewer directory, signed
tokens, and the configuration that loads them; shared by the way out (`layby.notifier`) and
the way in (`layby.inbox`)."""
