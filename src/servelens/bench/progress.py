"""The bench's progress bar (requests done, errors, elapsed) on stderr."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from rich.console import Console


class Progress:
    """A rich progress bar refreshed at 2 Hz from the loop (not per request)."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.done = 0
        self.errors = 0
        self._enabled = enabled
        self._total = total
        self._bar: Any = None
        self._task_id: Any = None
        self._refresher: asyncio.Task[None] | None = None

    def start(self) -> None:
        if not self._enabled:
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._bar = Progress(
            TextColumn("bench"), BarColumn(), MofNCompleteColumn(), TextColumn("errors {task.fields[errors]}"),
            TimeElapsedColumn(), console=Console(stderr=True), auto_refresh=False, transient=False,
        )
        self._bar.start()
        self._task_id = self._bar.add_task("bench", total=self._total, errors=0)
        self._refresher = asyncio.get_running_loop().create_task(self._refresh())

    def _update(self) -> None:
        self._bar.update(self._task_id, completed=self.done, errors=self.errors)
        self._bar.refresh()

    async def _refresh(self) -> None:
        while True:
            self._update()
            await asyncio.sleep(0.5)

    async def stop(self) -> None:
        if self._refresher is not None:
            self._refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._refresher
        if self._bar is not None:
            self._update()
            self._bar.stop()
