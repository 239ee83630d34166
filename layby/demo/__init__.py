"""demo: the scripted demo agents that `layby up` loads, their tools, ledger and job.

They replay the examples people read about interrupts (a trivia question, a transfer that
needs approval, parallel interrupts, clarifying questions, a background report, an approval
that expires) with the scripted model, so they run anywhere without a model provider.
"""
