"""A live feed of records for event-loop clients (server-sent events): any thread publishes, each
subscriber's bounded queue receives on its own loop, and a client too slow to keep up loses
records, counted, rather than holding anyone up."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field

SUBSCRIBER_BACKLOG = 256  # records a client may fall behind by before its next ones are dropped


@dataclass(eq=False)
class Subscriber:
    """A live feed client: its event loop and queue, and the records it lost."""

    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    dropped: int = field(default=0)


class LiveFeed:
    """Subscribers and the records published to them."""

    def __init__(self, backlog: int = SUBSCRIBER_BACKLOG):
        self.backlog = backlog
        self._subscribers: list[Subscriber] = []
        self._lock = threading.Lock()
        self.dropped = 0  # records any subscriber lost, since the start

    def subscribe(self) -> Subscriber:
        """A feed for the calling event loop."""
        subscriber = Subscriber(asyncio.get_running_loop(), asyncio.Queue(maxsize=self.backlog))
        with self._lock:
            self._subscribers.append(subscriber)
        return subscriber

    def unsubscribe(self, subscriber: Subscriber) -> None:
        """The client went away."""
        with self._lock:
            if subscriber in self._subscribers:
                self._subscribers.remove(subscriber)

    def publish(self, record: dict) -> None:
        """Hand `record` to every subscriber, from any thread, never waiting."""
        with self._lock:
            subscribers = list(self._subscribers)
        for subscriber in subscribers:
            try:
                subscriber.loop.call_soon_threadsafe(self._push, subscriber, record)
            except RuntimeError:  # its loop is closed: it is gone
                self.unsubscribe(subscriber)

    def _push(self, subscriber: Subscriber, record: dict) -> None:
        try:
            subscriber.queue.put_nowait(record)
        except asyncio.QueueFull:
            subscriber.dropped += 1
            self.dropped += 1
