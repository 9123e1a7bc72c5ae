"""The dead-letter analytics pipeline on Spark (the ``spark`` extra).

* :mod:`~celery_dlq.analytics.report` computes the failure report and the
  replay plan from an exported archive with the DataFrame API;
* :mod:`~celery_dlq.analytics.session` builds a quiet local SparkSession, or
  takes the one ``spark-submit`` made;
* :mod:`~celery_dlq.analytics.render` draws the charts and the HTML page;
* :mod:`~celery_dlq.analytics.plan` reads a replay plan with pyarrow alone,
  so ``celery dlq replay --plan`` needs no JVM.

pyspark is imported by ``report`` and ``session`` only, never by the rest of
celery_dlq, and never by importing this package.
"""
