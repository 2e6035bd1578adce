"""Process lifecycle helpers shared by the worker and the node agent."""

from __future__ import annotations

import asyncio
import signal


def stop_on_signals() -> asyncio.Event:
    """An event set by SIGTERM or SIGINT, so a worker can leave ``async with Worker`` and shut down gracefully."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop
