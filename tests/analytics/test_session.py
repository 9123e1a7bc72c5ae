"""Spark settings: quiet and local by default, nothing of ours under spark-submit (no JVM started here)."""
from __future__ import annotations

from celery_dlq.analytics import session as S


def test_local_defaults_are_quiet_bound_to_loopback_and_utc():
    conf = S.session_conf(None)
    assert conf["spark.master"] == "local[*]"
    assert conf["spark.ui.enabled"] == "false" and conf["spark.ui.showConsoleProgress"] == "false"
    assert conf["spark.driver.bindAddress"] == conf["spark.driver.host"] == "127.0.0.1"
    assert conf["spark.sql.session.timeZone"] == "UTC"
    assert int(conf["spark.sql.shuffle.partitions"]) <= 8
    java = conf["spark.driver.extraJavaOptions"].split(" ")
    assert java[0].startswith("-Dlog4j2.configurationFile=file:") and java[0].endswith("log4j2.properties")
    assert java[1:] == ["-XX:TieredStopAtLevel=1"]
    assert "spark.driver.memory" not in conf and "spark.executor.memory" not in conf


def test_user_conf_wins_and_java_options_are_merged():
    conf = S.session_conf("local[2]", [("spark.sql.shuffle.partitions", "16"), ("spark.ui.enabled", "true"),
                                       ("spark.driver.extraJavaOptions", "-Duser.timezone=Asia/Tokyo")])
    assert conf["spark.master"] == "local[2]"
    assert conf["spark.sql.shuffle.partitions"] == "16" and conf["spark.ui.enabled"] == "true"
    # the user's options come last, so that theirs win (-XX:TieredStopAtLevel=4 brings C2 back)
    assert conf["spark.driver.extraJavaOptions"].endswith(" -XX:TieredStopAtLevel=1 -Duser.timezone=Asia/Tokyo")
    assert "-Dlog4j2.configurationFile=" in conf["spark.driver.extraJavaOptions"]


def test_a_cluster_master_gets_no_local_binding():
    conf = S.session_conf("spark://master:7077")
    assert "spark.driver.bindAddress" not in conf and "spark.ui.enabled" not in conf
    assert "TieredStopAtLevel" not in conf["spark.driver.extraJavaOptions"]
    assert conf["spark.sql.session.timeZone"] == "UTC"


def test_spark_submit_is_detected_by_its_gateway(monkeypatch):
    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    assert not S.launched_by_spark_submit()
    monkeypatch.setenv("PYSPARK_GATEWAY_PORT", "40000")
    assert S.launched_by_spark_submit()
