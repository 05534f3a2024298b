"""BROKER_TIMEOUT_SECONDS: how long the Celery broker may leave a connect, a reply or a write
unanswered, per transport, and the publish retry policy that goes with it.

Without them a broker that accepts connections and answers nothing (a hung server, a host
that drops packets) holds every `apply_async` for ever: kombu's Redis transport has no
socket timeout by default, py-amqp none on reads and writes, and Celery's publish retry
policy retries three times on top. Read once by the settings (CELERY_BROKER_*); the tests
apply the same to a broker behind a stalling proxy (tests/test_broker_hangs.py).

What each option does was read in the installed kombu 5.7 / py-amqp 5.4 / Celery 5.7:

- Redis: `socket_timeout` and `socket_connect_timeout` go to every redis-py connection of
  the transport (kombu.transport.redis Channel._connparams). The worker's consuming BRPOP
  is not bound by them: it is sent with its own server-side timeout (1 s) and its reply
  is read only once the socket is readable (event loop or MultiChannelPoller), so a
  socket timeout below it does not fail an idle worker.
- AMQP: the transport options are passed to amqp.Connection as they are
  (kombu.transport.pyamqp Transport.establish_connection): `read_timeout` and
  `write_timeout` become SO_RCVTIMEO / SO_SNDTIMEO of its socket; the TCP connect and the
  handshake wait `connect_timeout`, which kombu takes from broker_connection_timeout.
- broker_connection_timeout also bounds, in total, the attempts to open a connection
  before the first publish on it (kombu Connection.default_channel, retry_over_time with
  `timeout`): the last attempt may start just before that and take one timeout more.
- broker_pool_acquire_timeout: an enqueue waits at most this long for one of the
  process's pooled producers (broker_pool_limit, 10) when they are all busy, instead of
  for ever, so enqueues do not pile up behind a hung broker.
- task_publish_retry_policy `max_retries`: each retry of a publish that failed on a
  connection error reopens the connection first, in up to two attempts (kombu
  Connection.ensure: at least one retry of the connect), so one retry costs up to two
  timeouts more against a hung broker. Redis gets none: redis-py itself replaces a pooled
  connection the server closed (a restart) when it takes it from its pool, so a retry
  would only add to the wait. AMQP gets one: py-amqp does not, and the first publish
  after a RabbitMQ restart would fail without it; a publish on an open AMQP connection is
  written to its socket without waiting for the broker (no publisher confirms), so it
  waits only once the socket's send buffer is full.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

REDIS_SCHEMES = ("redis", "rediss", "unix")
AMQP_SCHEMES = ("amqp", "amqps")


@dataclass(frozen=True, slots=True)
class BrokerTimeouts:
    timeout: float
    transport_options: dict[str, Any]
    publish_retry_policy: dict[str, Any]

    @property
    def enqueue_bound_seconds(self) -> float:
        """How long one enqueue (apply_async, delay) waits at most before it raises, against a
        broker that hangs: a publish on an open connection waits one timeout; one that must
        open its connection first spends up to one timeout on the attempts and the last one
        up to one more. (Past it: the producer pool's wait, only when more enqueues of one
        process than broker_pool_limit are under way at once; on AMQP, one retry's two
        connect attempts once a hung connection's send buffer is full.)"""
        return 2 * self.timeout

    def celery_settings(self) -> dict[str, Any]:
        """As Celery's configuration names them (app.conf, or CELERY_ + upper case in the settings)."""
        return {
            "broker_transport_options": dict(self.transport_options),
            "broker_connection_timeout": self.timeout,
            "broker_pool_acquire_timeout": self.timeout,
            "task_publish_retry_policy": dict(self.publish_retry_policy),
        }


def broker_timeouts(url: str, *, timeout: float) -> BrokerTimeouts:
    """The timeouts and the publish retry policy for the broker at `url` (a Redis or an AMQP URL)."""
    scheme = url.partition("://")[0].lower()
    if scheme in REDIS_SCHEMES:
        return BrokerTimeouts(
            timeout=timeout,
            transport_options={"socket_timeout": timeout, "socket_connect_timeout": timeout},
            publish_retry_policy={"max_retries": 0},
        )
    if scheme in AMQP_SCHEMES:
        return BrokerTimeouts(
            timeout=timeout,
            transport_options={"read_timeout": timeout, "write_timeout": timeout},
            publish_retry_policy={"max_retries": 1, "interval_start": 0, "interval_step": 0.2, "interval_max": 0.2},
        )
    raise ValueError(f"no broker timeouts for {scheme!r}: a redis, rediss, unix, amqp or amqps URL")
