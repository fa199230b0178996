"""Failed authentications per client address: a sliding window of failure times, so that
guessing API keys (over the API or the console's sign-in) runs at a bounded rate. Per process
and in memory: each API process behind a load balancer counts its own."""

from __future__ import annotations

import collections
import math
import threading
from collections.abc import Callable


def client_address(scope: dict) -> str:
    """The client's address as the server saw it (behind a proxy, the one its forwarded
    headers name when the server trusts them: uvicorn's ``--forwarded-allow-ips``)."""
    client = scope.get("client")
    return str(client[0]) if client else "unknown"


class FailureLimiter:
    """At most ``max_failures`` failed authentications per address in any ``window_s``
    seconds; an address over it waits until its oldest failure in the window is older than
    ``window_s``. ``max_failures`` 0: no limit. At most ``max_addresses`` addresses are
    remembered (the least recently failed are forgotten first), so the table is bounded."""

    def __init__(self, max_failures: int, window_s: float, clock: Callable[[], float],
                 max_addresses: int = 65_536):
        self.max_failures, self.window_s, self.clock = max_failures, window_s, clock
        self.max_addresses = max_addresses
        self._failures: collections.OrderedDict[str, collections.deque[float]] = \
            collections.OrderedDict()
        self._lock = threading.Lock()

    def _recent(self, addr: str, now: float) -> collections.deque[float] | None:
        times = self._failures.get(addr)
        while times and times[0] <= now - self.window_s:
            times.popleft()
        if times is not None and not times:
            del self._failures[addr]
            return None
        return times

    def retry_after(self, addr: str) -> int | None:
        """Whole seconds until ``addr`` may try again (at least 1); None: it may now."""
        if self.max_failures <= 0:
            return None
        with self._lock:
            now = self.clock()
            times = self._recent(addr, now)
            if times is None or len(times) < self.max_failures:
                return None
            return max(1, math.ceil(times[-self.max_failures] + self.window_s - now))

    def fail(self, addr: str) -> None:
        """Record a failed authentication from ``addr``."""
        if self.max_failures <= 0:
            return
        with self._lock:
            now = self.clock()
            times = self._recent(addr, now)
            if times is None:
                times = self._failures[addr] = collections.deque(maxlen=self.max_failures)
            times.append(now)
            self._failures.move_to_end(addr)
            while len(self._failures) > self.max_addresses:
                self._failures.popitem(last=False)

    def refusal(self, wait: int) -> str:
        """The detail of a 429: the limit and when to retry."""
        return (f"too many failed API keys or sign-ins from this address "
                f"(max_auth_failures={self.max_failures} in auth_failure_window_s="
                f"{self.window_s:g}); retry in {wait} s")
