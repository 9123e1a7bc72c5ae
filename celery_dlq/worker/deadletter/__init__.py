"""Dead letters: published once to the DLQ, recorded once, trimmed by the DLQ's limits."""
