"""A broker reconnect resets the worker's hub; half-read pool results must carry on, not restart mid-message."""
from __future__ import annotations

import os

from kombu.asynchronous import Hub

from celery_dlq.worker.run.poolfix import keep_half_done_io


class FakeAsynPool:
    def __init__(self, outq: int, inq: int) -> None:
        self._fileno_to_outq = {outq: object()}
        self._fileno_to_inq = {inq: object()}


class FakeTaskPool:
    """What Celery's prefork TaskPool does on (re)registration: a fresh reader per result pipe."""

    def __init__(self, outq: int, inq: int) -> None:
        self._pool = FakeAsynPool(outq, inq)
        self.registrations = 0

    def handle_event(self, fd):
        pass

    def register_with_event_loop(self, hub):
        self.registrations += 1
        for fd in self._pool._fileno_to_outq:
            hub.add_reader(fd, self.handle_event, fd)


def half_read():
    yield   # waiting for the rest of a message


def test_a_half_read_result_is_put_back_after_the_reset_and_the_pools_new_registration():
    out_r, out_w = os.pipe()
    in_r, in_w = os.pipe()
    hub = Hub()
    pool = FakeTaskPool(out_r, in_w)
    try:
        assert keep_half_done_io(hub, pool) is True
        assert keep_half_done_io(hub, pool) is False          # once per worker
        pool.register_with_event_loop(hub)
        assert hub.readers[out_r][0] == pool.handle_event
        reading, writing = half_read(), half_read()
        hub.add_reader(out_r, reading)                        # as AsynPool does mid-message
        hub.add_writer(in_w, writing)
        hub.reset()                                           # the connection was lost
        assert out_r not in hub.readers and in_w not in hub.writers
        pool.register_with_event_loop(hub)                    # the consumer reconnected
        assert hub.readers[out_r][0] is reading, "the half-read message is read on, not restarted"
        assert hub.writers[in_w][0] is writing
        hub.add_reader(out_r, pool.handle_event, out_r)       # the message read whole, as AsynPool then does
        hub.reset()
        pool.register_with_event_loop(hub)                    # nothing half-done: the pool's own reader
        assert hub.readers[out_r][0] == pool.handle_event
    finally:
        hub.close()
        for fd in (out_r, out_w, in_r, in_w):
            os.close(fd)


def test_without_a_hub_or_a_pool_nothing_is_wrapped():
    assert keep_half_done_io(None, object()) is False
    assert keep_half_done_io(Hub(), None) is False
