"""``python -m celery_dlq.analytics --in PATH --out DIR ...``: the report, without a Celery app.

Also a ``spark-submit`` entry point (give it this file's path; see
docs/analytics.md): under spark-submit the master, memory and logging are
spark-submit's, never set here. A program, not library code: its command
line is the ``report`` verb's (``celery_dlq/cli/analytics.py``), written once.
"""
from celery_dlq.cli.analytics import report

if __name__ == "__main__":
    report.main(prog_name="python -m celery_dlq.analytics")
