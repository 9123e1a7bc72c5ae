"""The fetch: from the broker's lists to the worker, one script that pops and records each message."""
