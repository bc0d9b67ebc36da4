"""The broker's descriptor limit, raised at start (moved out of ``server`` unchanged)."""

from __future__ import annotations

import logging
import resource

log = logging.getLogger(__name__)

__all__ = ["raise_fd_limit"]


def raise_fd_limit() -> None:
    """Raise the soft descriptor limit to the hard one (workers inherit it): the broker holds one descriptor
    per registered region, a worker one per mapped region."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as exc:
            log.warning("event=fd_limit_unchanged soft=%d hard=%d error=%r", soft, hard, str(exc))
