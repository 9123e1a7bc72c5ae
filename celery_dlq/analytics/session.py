"""The SparkSession of a report: quiet and local by default, spark-submit's own when launched by it.

Started from the command line (``celery dlq report`` or ``python -m
celery_dlq.analytics``) with no ``--master``, Spark runs in this process as
``local[*]`` with its UI off, bound to 127.0.0.1, logging errors only, few
shuffle partitions, and the JVM's C1 compiler only (:data:`LOCAL_JAVA_OPTIONS`).
Under ``spark-submit`` (which starts the JVM first and
tells PySpark through ``PYSPARK_GATEWAY_PORT``) nothing about the master,
memory, binding or logging is set here: the cluster's configuration and the
``--conf`` flags of spark-submit decide. Either way the SQL settings the
report's correctness depends on (:data:`REQUIRED`) are set on the report's
own session (``newSession()``), never on a caller's.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from importlib import resources

from pyspark.sql import SparkSession

logger = logging.getLogger(__name__)

DEFAULT_MASTER = "local[*]"
APP_NAME = "celery-dlq-report"

#: Correctness, set on every run (runtime SQL settings).
REQUIRED = {
    "spark.sql.session.timeZone": "UTC",                   # days and hours are UTC ones
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",  # readable as UTC by pyarrow
}
#: Quiet local defaults, only when this process starts a local Spark; --conf overrides them.
LOCAL_DEFAULTS = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.driver.host": "127.0.0.1",
    "spark.sql.shuffle.partitions": "4",
    "spark.sql.adaptive.enabled": "true",
}
#: JVM options of a local driver this process starts (before the user's, which win): a report is a short
#: batch job, so the C1 compiler alone (no C2 threads competing for a few cores); BENCHMARKS.md has the figures.
LOCAL_JAVA_OPTIONS = ("-XX:TieredStopAtLevel=1",)
#: Quiet logging for a driver this process starts (any master).
LOG_CONF = "log4j2.properties"


def launched_by_spark_submit() -> bool:
    """True when spark-submit (or the pyspark shell) started the JVM this Python talks to."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def log_config_option() -> str:
    path = resources.files("celery_dlq.analytics").joinpath(LOG_CONF)
    return f"-Dlog4j2.configurationFile=file:{path}"


def session_conf(master: str | None, conf: Iterable[tuple[str, str]] = ()) -> dict[str, str]:
    """Settings for a session this process starts: defaults, then ``conf`` on top."""
    master = master or DEFAULT_MASTER
    settings: dict[str, str] = {"spark.master": master}
    local = master.startswith("local")
    if local:
        settings.update(LOCAL_DEFAULTS)
    settings.update(REQUIRED)
    user = dict(conf)
    java = " ".join(filter(None, [log_config_option(), *(LOCAL_JAVA_OPTIONS if local else ()),
                                  user.pop("spark.driver.extraJavaOptions", "")]))
    settings["spark.driver.extraJavaOptions"] = java
    settings.update(user)
    return settings


def build_session(master: str | None = None, conf: Iterable[tuple[str, str]] = (),
                  app_name: str = APP_NAME) -> SparkSession:
    """The active session if there is one (spark-submit, a test), else a new quiet one."""
    conf = tuple(conf)
    active = SparkSession.getActiveSession()
    if active is not None or launched_by_spark_submit():
        if master:
            logger.warning("celery-dlq report: --master %s ignored: Spark is already running", master)
        builder = SparkSession.builder.appName(app_name)
        for key, value in conf:
            builder = builder.config(key, value)
        return builder.getOrCreate()
    settings = session_conf(master, conf)
    if settings["spark.master"].startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder.appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def report_session(spark: SparkSession) -> SparkSession:
    """A session of its own for the report (same SparkContext), with :data:`REQUIRED` set."""
    session = spark.newSession()
    for key, value in REQUIRED.items():
        session.conf.set(key, value)
    return session
