"""Everything celery-dlq keeps in Redis: key names, Lua scripts, the parked store, counters, the archive.

Below the worker and the operator tools, above the pure model: nothing here
knows Celery's worker or the command line.
"""
