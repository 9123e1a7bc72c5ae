"""The dead-letter analytics pipeline: export to Parquet, then a report on Spark (the ``spark`` extra).

* :mod:`~celery_dlq.analytics.export` copies the event archive (and with
  ``--snapshot`` the DLQs) to Parquet with pyarrow alone, no JVM; its Arrow
  schema is derived from :data:`celery_dlq.storage.archive.SCHEMA`;
* :mod:`~celery_dlq.analytics.report` computes the failure report and the
  replay plan from an exported archive with the DataFrame API
  (:mod:`~celery_dlq.analytics.figures`: the numbers and the Spark schema,
  derived from the same ``SCHEMA``);
* :mod:`~celery_dlq.analytics.session` builds a quiet local SparkSession, or
  takes the one ``spark-submit`` made;
* :mod:`~celery_dlq.analytics.render` draws the charts and the HTML page;
* :mod:`~celery_dlq.analytics.plan` reads a replay plan with pyarrow alone,
  so ``celery dlq replay --plan`` needs no JVM;
* :mod:`~celery_dlq.analytics.fs` reads and writes small files on any
  pyarrow filesystem; ``python -m celery_dlq.analytics`` is the ``report``
  verb without a Celery app (and a ``spark-submit`` entry point).

pyspark is imported by ``report``, ``session`` and ``metrics`` only, never by
the rest of celery_dlq, and never by importing this package.
"""
