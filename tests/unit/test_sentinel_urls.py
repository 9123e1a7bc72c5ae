"""``sentinel://`` URLs as kombu writes them: parsed, folded into one string, shown without secrets."""
from __future__ import annotations

import pytest
from celery import Celery

from celery_dlq.errors import ConfigurationError
from celery_dlq.settings import DLQSettings
from celery_dlq.storage.client import broker_url
from celery_dlq.urls import canonical, parse, sanitize

KOMBU = "sentinel://:s3cret@10.0.0.1:26379;sentinel://:s3cret@10.0.0.2:26380;sentinel://10.0.0.3/2"


def test_every_sentinel_the_db_and_the_master_name_from_the_transport_options():
    spec = parse(KOMBU, {"master_name": "mymaster", "sentinel_kwargs": {"password": "sentpw"}})
    assert spec.sentinels == (("10.0.0.1", 26379), ("10.0.0.2", 26380), ("10.0.0.3", 26379))
    assert (spec.master_name, spec.db, spec.password, spec.sentinel_password) == ("mymaster", 2, "s3cret", "sentpw")
    again = parse(spec.url())
    assert again == spec


def test_the_query_wins_and_a_missing_master_name_is_a_clear_error():
    assert parse("sentinel://h:1/0?master_name=a", {"master_name": "b"}).master_name == "a"
    with pytest.raises(ConfigurationError, match="master_name"):
        parse("sentinel://h:1")
    with pytest.raises(ConfigurationError, match="sentinel://"):
        parse("sentinel://h:1;redis://h:2")


def test_shown_urls_hide_every_password():
    shown = sanitize(canonical(KOMBU, {"master_name": "m", "sentinel_kwargs": {"password": "sentpw"}}))
    assert "s3cret" not in shown and "sentpw" not in shown and "10.0.0.2:26380" in shown


def test_the_store_follows_a_sentinel_broker_and_dlq_redis_url_may_be_one():
    app = Celery("t", broker=KOMBU, set_as_current=False)
    app.conf.broker_transport_options = {"master_name": "mymaster"}
    settings = DLQSettings.from_conf(app.conf)
    assert settings.redis_url == broker_url(app.conf)
    assert parse(settings.redis_url).master_name == "mymaster"
    assert "s3cret" not in settings.safe_redis_url
    app.conf.broker_url = "amqp://guest@localhost//"
    app.conf.dlq_redis_url = "sentinel://h1:26379;sentinel://h2:26379/0?master_name=store"
    assert parse(DLQSettings.from_conf(app.conf).redis_url).sentinels == (("h1", 26379), ("h2", 26379))


def test_dlq_redis_cluster_needs_a_store_url_of_its_own():
    app = Celery("t", broker="redis://localhost:6379/0", set_as_current=False)
    app.conf.dlq_redis_cluster = True
    with pytest.raises(ConfigurationError, match="dlq_redis_cluster = True needs dlq_redis_url"):
        DLQSettings.from_conf(app.conf)
    app.conf.dlq_redis_url = "redis://10.0.0.5:7000/0"
    assert DLQSettings.from_conf(app.conf).redis_cluster is True
