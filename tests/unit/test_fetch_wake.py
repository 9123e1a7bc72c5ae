"""The idle fetch's waker: which mode applies, and the token written exactly when a wait can miss a push."""
from __future__ import annotations

import pytest
import redis

from celery_dlq.worker.fetch_wake import Waker, lists_notified, notifications_on


class StubClient:
    """Records the commands a waker sends (no thread is started in these tests)."""

    def __init__(self, flags: str = "", refuse: bool = False) -> None:
        self.flags, self.refuse, self.sent = flags, refuse, []

    def config_get(self, name):
        if self.refuse:
            raise redis.ResponseError("NOPERM this user has no permissions to run the 'config|get' command")
        return {name: self.flags}

    def config_set(self, name, value):
        self.sent.append(("CONFIG SET", name, value))
        self.flags = value

    def pipeline(self, transaction=True):
        return self

    def zadd(self, key, mapping):
        self.sent.append(("ZADD", key))
        return self

    def pexpire(self, key, ms):
        return self

    def execute(self):
        return []


@pytest.mark.parametrize("flags, on", [("", False), ("Kl", True), ("lK", True), ("KA", True), ("El", False),
                                       ("Kg", False), ("AKE", True)])
def test_list_events_need_keyspace_and_list_flags(flags, on):
    assert lists_notified(flags) is on


def test_auto_uses_notifications_only_where_the_server_sends_them_and_never_configures():
    assert notifications_on(StubClient("Kl"), "auto")[0] is True
    client = StubClient("Ex")
    on, why = notifications_on(client, "auto")
    assert not on and "'Ex'" in why and client.sent == []


def test_configure_adds_kl_to_what_is_set():
    client = StubClient("Ex")
    on, why = notifications_on(client, "configure")
    assert on and client.sent == [("CONFIG SET", "notify-keyspace-events", "ExKl")]


def test_off_and_a_refused_config_get_fall_back():
    assert notifications_on(StubClient("Kl"), "off")[0] is False
    on, why = notifications_on(StubClient(refuse=True), "auto")
    assert not on and "refused" in why


def heard(waker: Waker, event: bytes) -> None:
    waker._heard({"type": "message", "channel": f"{waker.prefix}q".encode(), "data": event})


def test_a_push_while_waiting_writes_one_token():
    client = StubClient()
    waker = Waker(client, 0, "wake")
    assert not waker.begin_wait(), "a new waker has heard nothing yet: fetch first"
    waker.begin_fetch()
    assert waker.begin_wait()
    heard(waker, b"rpop")                  # a pop cannot make a list non-empty
    assert client.sent == []
    heard(waker, b"lpush")
    heard(waker, b"lpush")
    assert client.sent == [("ZADD", "wake")], "one token per wait"
    waker.end_wait()
    assert not waker.begin_wait(), "heard since the last fetch began: fetch, not wait"


def test_a_push_during_a_fetch_makes_the_next_start_a_fetch_without_a_token():
    client = StubClient()
    waker = Waker(client, 0, "wake")
    waker.begin_fetch()
    heard(waker, b"lpush")                 # the fetch in flight may have run before the push
    assert client.sent == []
    assert not waker.begin_wait()
    waker.begin_fetch()
    assert waker.begin_wait()


def test_stopping_ends_a_pending_wait():
    client = StubClient()
    waker = Waker(client, 0, "wake")
    waker.begin_fetch()
    waker.stop()
    assert client.sent == [], "no wait pending: nothing to end"
    waker = Waker(client, 0, "wake")
    waker.begin_fetch()
    assert waker.begin_wait()
    waker.stop()
    assert client.sent == [("ZADD", "wake")]
