"""A server that answers as no API server does is asked again only after a pause that grows.

Informers back off each on its own, and a target has several (its summary, pods, config maps,
secrets, services); a list whose page is too large is asked again in smaller pages before it
fails. So a server that sent 100 MB for every list was still read 6 GB in its first 30 seconds.
A bad answer (:class:`BadResponse`: too large, not JSON, not a list or an event) therefore
pauses every request to that server: one second after the first, doubling with each that
follows, up to five minutes; ten minutes without one and it starts again from a second.
Meanwhile requests fail at once, with no connection made, repeating the last bad answer.

Errors a real API server gives (statuses, refused connections, timeouts) are not counted: they
have their own back-off in the informer and the workqueue.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from .errors import BadResponse

log = logging.getLogger(__name__)

FIRST_PAUSE = 1.0
LONGEST_PAUSE = 300.0
FORGET_AFTER = 600.0


class BadAnswers:
    """The pause before a server that gave bad answers is asked again."""

    def __init__(
        self,
        name: str,
        *,
        first: float = FIRST_PAUSE,
        longest: float = LONGEST_PAUSE,
        forget_after: float = FORGET_AFTER,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.first = first
        self.longest = longest
        self.forget_after = forget_after
        self.clock = clock
        self.pause = 0.0
        self.until = 0.0  # no request before this time
        self.last: BadResponse | None = None

    def check(self, context: str) -> None:
        """Raise :class:`BadResponse` while the server is paused."""
        left = self.until - self.clock()
        if left > 0 and self.last is not None:
            raise BadResponse(
                f"{context}: not asked for another {left:.0f}s, since the server answered as no"
                f" API server does: {self.last}"
            )

    def record(self, error: BadResponse) -> float:
        """A bad answer: pause the server; return for how long. Answers to requests made before
        the pause began do not lengthen it."""
        now = self.clock()
        if now < self.until:
            return self.until - now
        recent = self.last is not None and now - self.until < self.forget_after
        self.pause = min(self.longest, self.pause * 2) if recent else self.first
        self.until = now + self.pause
        # Its text only: the error's frames hold what was read (up to a whole answer).
        self.last = BadResponse(str(error))
        log.warning(
            "bad answer, server paused cluster=%s pause=%.0fs error=%s",
            self.name,
            self.pause,
            error,
        )
        return self.pause
