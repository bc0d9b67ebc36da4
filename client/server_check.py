"""Checking a local server's socket file before requests, again only when the connection changed.

A local server's socket file is gone when the server is: a request says so at once instead of timing out.
A socket made by a user we do not trust, or a symbolic link, is refused (``paths.check_server_socket``).
While the connection's monitor reads no connection made or lost (``LinkWatch.changes``), its peer is the
server whose socket was found trustworthy last time, and a request does not look at the file again
(``check_changed``: no ``lstat`` per request); any connection made or lost makes the next request look.
"""

from __future__ import annotations

from . import paths
from .link_watch import LinkWatch

__all__ = ["ServerCheck"]


class ServerCheck:
    """The socket file of the server at ``ipc_path`` ("" for a TCP server: nothing to check)."""

    def __init__(self, ipc_path: str, server_uid: int | None, link: LinkWatch) -> None:
        self._path = ipc_path
        self._uid = server_uid
        self._link = link
        self._seen: paths.SocketIdentity | None = None  # the server socket last found trustworthy
        self._checked_at = -1  # ``link.changes`` when it was found so

    def check(self) -> None:
        """Raise ``ConnectionFailed`` unless the socket file is there and trustworthy."""
        if self._path:
            changes = self._link.changes  # read before the look: a change after it is looked at next time
            self._seen = paths.check_server_socket(self._path, self._uid, self._seen)
            self._checked_at = changes

    def check_changed(self) -> None:
        """``check``, unless no connection was made or lost since the last check passed (the link is polled
        first, so what it has to report is counted)."""
        self._link.poll()
        if self._path and (self._checked_at != self._link.changes or self._seen is None):
            self.check()
