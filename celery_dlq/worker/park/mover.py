"""The consumer bootstep that moves due parked messages back to their queues.

Every worker runs one, but only the leader moves (the worker holding the
leader's lease: :mod:`celery_dlq.worker.leader.lease`, :mod:`~celery_dlq.worker.park.turns`),
so the movers' Redis work does not grow with the number of workers. This
step also runs the leader's lease (its beats) and the duties that go with
it (``worker/leader/lease.py``'s ``DUTIES``). Several movers would still be
safe (a rolling deploy with older workers, a holder that stalled past its
lease): a claim is a lease of its own (claim, publish, then delete; an
expired lease makes the entry due again), so they neither lose nor
duplicate a message unless one dies between publish and delete, when the
lease expiry redelivers it (at least once). It runs in its own thread so a
slow Redis never stalls the consumer's event loop.
"""
from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections import Counter
from dataclasses import replace
from typing import Any

from celery import bootsteps
from kombu.utils.uuid import uuid

from celery_dlq import headers as H
from celery_dlq.errors import BrokerNotSupported
from celery_dlq.headers import Reason
from celery_dlq.message import Envelope, decode_raw
from celery_dlq.storage.client import blocking_client, broker_url, listener_client
from celery_dlq.storage.inflight import InFlight
from celery_dlq.storage.keys import Keys, Stat
from celery_dlq.storage.lists import push_element
from celery_dlq.storage.shards import Shard
from celery_dlq.storage.store import DirectPayload
from celery_dlq.storage.wake import DueWake
from celery_dlq.worker.config import Config
from celery_dlq.worker.connections import Connections
from celery_dlq.worker.fetch.listener import FetchListener
from celery_dlq.worker.fetch.setup import uses_fetch
from celery_dlq.worker.leader.inflight import Beats
from celery_dlq.worker.leader.lease import FETCH_LISTENER, Leader, LeaderLease
from celery_dlq.worker.park.turns import MAX_BLOCK, REFRESH, MoverTurns
from celery_dlq.worker.runtime import Runtime

logger = logging.getLogger(__name__)

MAX_BACKOFF = 5.0


class MoverThread(threading.Thread):
    """Claims due entries in batches and publishes them until stopped, when this worker's turn (``turns``)."""

    def __init__(self, app: Any, config: Config, redis: Connections, hostname: str = "") -> None:
        super().__init__(name="celery-dlq-mover", daemon=True)
        self.app, self.config, self.redis = app, config, redis
        #: The worker's name, written into the dead letters of messages that expired while parked.
        self.hostname = hostname
        settings = config.settings
        self.interval = settings.mover_interval
        self.batch_size = settings.mover_batch_size
        self.lease = settings.claim_lease
        self._stop_event = threading.Event()
        self._turn = -1
        ident = f"{socket.gethostname()}:{os.getpid()}:{uuid()[:8]}"
        blocking = blocking_client(settings.redis_url, MAX_BLOCK, settings.redis_cluster) \
            if len(self.redis.sharded.all) == 1 else None   # with several shards the holder never blocks
        home = self.redis.sharded.home.keys
        lease = LeaderLease(self.redis.client, home.mover_lease, ident, settings.mover_lease,
                            settings.heartbeat_interval)
        self.beats = in_flight_beats(config, self.redis)
        self.leader = Leader(lease, on_role=self._on_role,
                             each=self.beats.tick if self.beats is not None else lambda holds: None)
        self.turns = MoverTurns(DueWake(self.redis.client, home, blocking), self._stop_event, self.interval,
                                self.leader.holder)
        self.listener: FetchListener | None = None

    def start(self) -> None:
        self.leader.start()
        super().start()

    def _on_role(self, holds: bool) -> None:
        """The leader also runs the fetch listener (``worker/fetch/listener.py``), where fetches use it."""
        if self.listener is not None:
            self.listener.stop()
            self.listener = None
        if holds and FETCH_LISTENER.on(self.config.settings) and uses_fetch(self.app):
            url = broker_url(self.app.conf)
            lists = self.config.lists
            self.listener = FetchListener(lambda: listener_client(url),
                                          Keys(self.config.settings.key_prefix, lists.global_keyprefix), lists,
                                          holds=self.config.direct and self.config.breakers)
            self.listener.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop_event.set()
        try:
            self.turns.stop_waiting()
        except Exception:   # Redis down: the wait ends at its timeout
            logger.debug("celery-dlq mover: could not end the mover's wait", exc_info=True)
        if self.is_alive():
            self.join(timeout)
        self.leader.stop(timeout)   # gives the lease up: another worker takes over at its next beat

    def run(self) -> None:
        """Move due entries whenever this worker leads (:mod:`~celery_dlq.worker.park.turns`).

        The holder makes a pass when an entry is due (it learns the earliest
        due time after each pass, and a park of an earlier one wakes it), so a
        message's lateness is about a pass's own time; everyone else waits
        its turn. After a Redis error the wait backs off. On a warm stop the
        leader gives the lease up, so another worker takes over at its next beat.
        Moving is all it does: counters are flushed by their own bootstep.
        """
        wait = 0.0
        turns, sharded = self.turns, self.redis.sharded
        while not self._stop_event.is_set():
            try:
                if not turns.take_turn():
                    continue
                if turns.due():
                    started = time.monotonic()
                    self.move_due()
                    turns.passed(started)
                turns.wait_for_due(lambda: sharded.next_due(self.interval, 2 * REFRESH), len(sharded.all) == 1)
                wait = 0.0
            except Exception:
                wait = min(MAX_BACKOFF, max(wait * 2, self.interval))
                turns.passed(time.monotonic())
                logger.exception("celery-dlq mover: failed against redis %s; retrying in %.1fs",
                                 self.config.settings.safe_redis_url, wait)
                self._stop_event.wait(wait)

    def move_due(self) -> int:
        """Move every due entry now, a batch per round trip; returns how many were moved or published.

        On a Redis broker that is also the store (``Config.direct``) due
        entries move inside Redis, one script per batch (``lua/move_due.lua``);
        entries in the publish format (parked before an upgrade) are then
        claimed and published as on any other broker.

        With ``dlq_store_shards`` > 1 every shard is served in turn, starting
        one further each pass, so no shard always waits for the others; a
        shard that fails (its master down) does not stop the others: the
        first error is raised once every shard has had its turn.
        """
        shards = self.redis.sharded.all
        self._turn = (self._turn + 1) % len(shards)
        moved, error = 0, None
        for shard in shards[self._turn:] + shards[:self._turn]:
            try:
                moved += self._move_shard(shard)
            except Exception as exc:
                if len(shards) == 1:
                    raise
                error = error or exc
        if error is not None:
            raise error
        return moved

    def _move_shard(self, shard: Shard) -> int:
        moved, left = self._move_inside_redis(shard) if self.config.direct else (0, 1)
        return moved + (self._claim_and_publish(shard) if left else 0)

    def _move_inside_redis(self, shard: Shard) -> tuple[int, int]:
        """Move every due entry of the shard inside Redis, a script per batch; ``redelivered_total`` is
        written once for the pass (the ``stats`` counter and the events are in each batch's script)."""
        store, batch = shard.store, self.batch_size
        lists = [key for queue in store.counts_by_queue() for key in self.config.lists.keys(queue)]
        moved = left = 0
        tally: Counter[tuple[str, str]] = Counter()
        try:
            while not self._stop_event.is_set():
                n, left = store.move_due(lists, limit=batch, events_max_length=shard.archive.max_length,
                                         counter=Stat.REDELIVERED, tally=tally)
                moved += n
                if n + left < batch or n == 0:
                    break
        finally:
            self._count_moved(store, tally)
        return moved, left

    @staticmethod
    def _count_moved(store: Any, tally: Counter[tuple[str, str]]) -> None:
        try:
            store.count_redelivered(tally)
        except Exception:   # the moves stand; only the exporter's counter misses them
            logger.exception("celery-dlq mover: could not count %d redelivered message(s)", sum(tally.values()))

    def _claim_and_publish(self, shard: Shard) -> int:
        moved = 0
        while not self._stop_event.is_set():
            claimed = shard.store.claim_due(limit=self.batch_size, lease=self.lease)
            if not claimed:
                break
            moved += self._publish(shard, claimed)
            if len(claimed) < self.batch_size:
                break
        return moved

    def _publish(self, shard: Shard, claimed: list) -> int:
        """Publish the claimed entries and dead-letter the expired ones; returns how many were handled.

        An entry whose message expired while parked (Celery's ``expires``
        passed) is dead-lettered with reason ``expired`` (or dropped: policy
        field ``expired``) instead of published: Celery would discard it.
        """
        now = time.time()
        pairs = [(entry, _envelope_of(entry.payload)) for entry in claimed]
        due = [pair for pair in pairs if not H.expires_before(pair[1].headers, now)]
        expired = [pair for pair in pairs if H.expires_before(pair[1].headers, now)]
        try:
            published = self._publish_due(shard, due) if due else 0
        except Exception:
            self._release(shard, [entry for entry, _ in expired])
            raise
        return published + (self._dead_letter_expired(shard, expired) if expired else 0)

    def _publish_due(self, shard: Shard, due: list) -> int:
        """Publish the entries, then ack them in one call; on a failure give back what was not sent and raise.

        Where kombu offers publish batches (``Producer.batch``, kombu >= 5.7;
        on Redis one pipeline per batch instead of a round trip per message)
        the batch goes to the broker whole when the block ends, or not at all.
        Without them (kombu < 5.7) each message is sent as it is published, as
        is a direct-format entry's LPUSH: on an error, what was already sent is
        acked and counted and only the rest is released, so nothing is
        published twice. A mover that dies mid-batch leaves its entries leased:
        they are delivered again when the lease expires (at least once, never
        lost). Released entries come due again after a back-off, not at once,
        so a broker outage does not turn the mover into a busy loop.
        """
        sent: list[tuple[Any, Envelope]] = []
        try:
            with self.app.producer_or_acquire() as producer:
                batched = getattr(producer, "batch", None) is not None
                with _batch(producer, len(due)):
                    for entry, envelope in due:
                        if self._publish_one(producer, entry.payload, envelope) or not batched:
                            sent.append((entry, envelope))   # on the broker already
                sent = list(due)
        except Exception:
            gone = {id(entry) for entry, _ in sent}
            self._release(shard, [entry for entry, _ in due if id(entry) not in gone])
            raise
        finally:
            if sent:
                published = [envelope for _, envelope in sent]
                shard.store.ack_many([entry for entry, _ in sent], Stat.REDELIVERED, len(published))
                self._count(shard, published)
                shard.archive.redelivered(published)
        return len(sent)

    def _dead_letter_expired(self, shard: Shard, expired: list) -> int:
        """Dead-letter (or drop) entries whose message expired while parked, then ack them; on a failure
        give the rest back and raise.

        The dead letter says delivery ``n`` (the last that ran) and carries
        the failure of that delivery; its audit marker is keyed by the entry,
        so a mover that dies between the dead letter and the ack does not
        dead-letter it twice. The result backend gets what Celery records for
        a message it discards as expired (:meth:`_record_revoked`).
        """
        done = []
        try:
            for entry, envelope in expired:
                headers = envelope.headers
                self.redis.dead_letter(replace(envelope, delivery_tag=entry.entry_id),
                                       delivery=max(1, H.delivery_count_of(headers) - 1),
                                       policy=self.config.policy(envelope.task_name or "", envelope.queue),
                                       reason=Reason.EXPIRED, failure=H.last_failure(headers), worker=self.hostname)
                done.append(entry)
                self._record_revoked(envelope)
        except Exception:
            self._release(shard, [entry for entry, _ in expired[len(done):]])
            raise
        finally:
            if done:
                shard.store.ack_many(done)
        return len(done)

    def _record_revoked(self, envelope: Envelope) -> None:
        """REVOKED with reason ``expired``, as Celery's worker records a message it discards as expired.

        Honours ``ignore_result`` as Celery does; a backend error is logged, never raised (the dead
        letter is what keeps the message).
        """
        task = self.app.tasks.get(envelope.task_name or "")
        ignored = envelope.headers.get("ignore_result", getattr(task, "ignore_result", False))
        if not envelope.task_id or (ignored and not getattr(task, "store_errors_even_if_ignored", False)):
            return
        try:
            backend = task.backend if task is not None else self.app.backend
            backend.mark_as_revoked(envelope.task_id, "expired")
        except Exception:
            logger.exception("celery-dlq mover: could not record %s[%s] as revoked (expired) in the result backend",
                             envelope.task_name, envelope.task_id)

    def _release(self, shard: Shard, entries: list) -> None:
        retry_at = time.time() + max(1.0, self.interval)
        for entry in entries:
            shard.store.release(entry, due=retry_at)

    def _count(self, shard: Shard, published: list[Envelope]) -> None:
        """``redelivered_total`` and the trends for what the publish path moved (never raises)."""
        try:
            shard.store.count_redelivered(Counter((envelope.queue, envelope.task_name or "") for envelope in published))
        except Exception:
            logger.exception("celery-dlq mover: could not count %d redelivered message(s)", len(published))

    def _publish_one(self, producer: Any, payload: bytes, envelope: Envelope) -> bool:
        """Publish one parked payload; a direct-format one goes onto its list as it is (on the broker's Redis),
        at once: True then."""
        direct = DirectPayload.loads(payload)
        if direct is None:
            envelope.publish(producer)
            return False
        push_element(self.redis.broker, direct.dest, direct.element)
        return True


def in_flight_beats(config: Config, redis: Connections) -> Beats | None:
    """This worker's in-flight beats and sweeps, on a Redis broker: a worker fetching with kombu's own
    transport leads as often as any, and must sweep too."""
    try:
        broker = redis.broker
    except BrokerNotSupported:
        return None
    keys = Keys(config.settings.key_prefix, config.lists.global_keyprefix)
    return Beats(InFlight(broker, keys), config.settings.inflight_lease)


def _envelope_of(payload: bytes) -> Envelope:
    """A parked payload (either format) as the message it holds."""
    direct = DirectPayload.loads(payload)
    if direct is None:
        return Envelope.loads(payload)
    return replace(decode_raw(direct.element).as_envelope(), queue=direct.queue)


def _batch(producer: Any, size: int) -> Any:
    """kombu's publish batch for ``size`` messages, or nothing where this kombu has none.

    The batch is sized so that it never flushes early: it goes to the broker
    whole when the block ends, or not at all.
    """
    batch = getattr(producer, "batch", None)
    if batch is None:
        return contextlib.nullcontext()
    return batch(max_size=4 * size + 16)  # a message may take more than one command (fanout)


class Mover(bootsteps.StartStopStep):
    """Consumer bootstep: one mover thread per worker (``runtime`` set by ``steps.bound_steps``), given its
    config and connections."""

    requires = ("celery.worker.consumer.connection:Connection",)
    runtime: Runtime

    def __init__(self, c: Any, **kwargs: Any) -> None:
        self.thread: MoverThread | None = None
        super().__init__(c, **kwargs)

    def start(self, c: Any) -> None:
        config = self.runtime.config
        self.thread = MoverThread(c.app, config, self.runtime.redis(), getattr(c, "hostname", "") or "")
        self.runtime.mover_holder = self.thread.leader.holder
        self.thread.start()
        logger.info("celery-dlq mover: moving due messages from redis %s when this worker leads (holds the "
                    "leader's lease: one worker at a time; another takes over within %.1fs)",
                    config.settings.safe_redis_url, config.settings.mover_lease)

    def stop(self, c: Any) -> None:
        if self.thread is not None:
            self.thread.stop()
            self.thread = None

    shutdown = stop
