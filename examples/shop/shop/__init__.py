"""The shop's agents."""
