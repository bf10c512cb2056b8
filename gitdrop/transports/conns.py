"""Connection limits for gitdrop's uvicorn servers: MCP over HTTP (`gitdrop serve`)
and the web board (`gitdrop web`).

A connection that has sent no whole request (headers and body) within HEAD_SECONDS
of its opening, or of its last answer's end, is closed, one
address holds at most PER_ADDRESS (this machine's: no cap), and all together stay
below what the open-file limit leaves. Connections left half-sent piled up until
an accept failed for want of a file descriptor: that ended the MCP server, and
left the board answering nobody while it logged a traceback per failed accept.
"""

import collections
import os

from .httpd import is_local

HEAD_SECONDS = 30.0
PER_ADDRESS = 256
RESERVED_FILES = 128     # descriptors kept for the hub, the log, the notifier
BACKLOG = 64             # connections accepted in one go (asyncio accepts up to the backlog
                         # at once, each holding a descriptor until its close has run)


def _seconds(text: str, default: float) -> float:
    try:
        value = float(text)
    except ValueError:
        return default
    return value if 0 < value < 86400 else default


def _file_limit() -> int:
    try:
        import resource
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        return 1024
    return 1 << 20 if soft == resource.RLIM_INFINITY else soft


def http_protocol():
    """uvicorn's HTTP protocol class with the connection limits above
    (GITDROP_REQUEST_SECONDS, if set, for HEAD_SECONDS)."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol as Base
    most = max(32, _file_limit() - RESERVED_FILES - BACKLOG)
    wait = _seconds(os.environ.get("GITDROP_REQUEST_SECONDS", ""), HEAD_SECONDS)
    per = collections.Counter()

    class Guarded(Base):
        _host, _timer, _armed_for = None, None, None

        def connection_made(self, transport):
            super().connection_made(transport)
            self._host = (self.client or ("",))[0]
            per[self._host] += 1
            if len(self.connections) > most or (
                    per[self._host] > PER_ADDRESS and not is_local(self._host)):
                transport.close()   # at once: its descriptor is what is short
                return
            self._arm()

        def _arm(self):
            """A whole request, headers and body, within `wait` seconds: of the
            connection's opening, then of each answer's end (a kept-alive connection
            whose next request was begun and never finished, or whose body never
            came, held its descriptor for ever)."""
            if self._timer is not None:
                self._timer.cancel()
            self._armed_for = self.cycle
            self._timer = self.loop.call_later(wait, self._no_request)

        def _no_request(self):
            cycle = self.cycle
            if cycle is None or cycle is self._armed_for or getattr(cycle, "more_body", False):
                self.transport.close()   # no new request whole since: headers or body
            # else: a request came whole; its answer may stream as long as it needs

        def on_response_complete(self):
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()

        def connection_lost(self, exc):
            if self._timer is not None:
                self._timer.cancel()
            if self._host is not None:
                per[self._host] -= 1
                if per[self._host] <= 0:
                    del per[self._host]
            super().connection_lost(exc)
    return Guarded
