"""A stage shows it is alive while a request is long: seconds waiting, and the model's speed.

The embedded model on a loaded machine took 332 s for one reply, and the bar (units done)
stood still all that time. Nothing about the request changes (no streaming: the cache key,
the usage the endpoint reports and the structured output stay as they are); the pool knows
when each request went out (EndpointPool.waiting), the accounting how fast replies came.
On a terminal the bar's last column says it; elsewhere (a log, `make demo > log`) a line
every HEARTBEAT seconds does.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from rich.console import Console
from rich.progress import Progress, ProgressColumn, Task
from rich.table import Column
from rich.text import Text

ALIVE_AFTER = 5.0  # seconds a request waits before the bar says so
HEARTBEAT = 30.0  # seconds between lines about a long request when the console is no terminal


def waiting_text(engine) -> str:
    """'1 request waiting 45 s · model 4.2 tokens/s', or '' when no request is long."""
    count, oldest = engine.pool.waiting()
    if not count or oldest < ALIVE_AFTER:
        return ""
    which = f"{count} requests waiting, the oldest {oldest:.0f} s"
    if count == 1:
        which = f"1 request waiting {oldest:.0f} s"
    return f"{which} · {speed_text(engine)}"


def speed_text(engine) -> str:
    """The model's speed over the replies of this run: completion tokens per second of a request."""
    steps = list(engine.accounting.steps.values())  # read from rich's refresh thread: copy first
    tokens = sum(stats.completion_tokens for stats in steps)
    seconds = sum(stats.seconds for stats in steps)
    if not tokens or not seconds:
        return "model speed not known yet (no reply so far)"
    return f"model {tokens / seconds:.1f} tokens/s"


def fixed() -> Column:
    """A column of the bar that keeps its width (the stage, the bar, units, time)."""
    return Column(no_wrap=True)


def _one_line(text: str, style: str) -> Text:
    """Text that never wraps: cut with an ellipsis where the terminal is narrow. Wrapped, the
    waiting note stood one word a line, 12-14 lines tall at 80 columns, redrawn every second."""
    return Text(text, style=style, no_wrap=True, overflow="ellipsis", end="")


class FieldColumn(ProgressColumn):
    """`task.fields[name]` on one line; the table narrows this column first (it wraps no text)."""

    def __init__(self, name: str, style: str = "") -> None:
        super().__init__(Column(no_wrap=False, overflow="ellipsis"))
        self.name, self.style = name, style

    def render(self, task: Task) -> Text:
        return _one_line(str(task.fields.get(self.name, "")), self.style)


class WaitingColumn(ProgressColumn):
    """The bar's last column: `task.fields["waiting"]()`, the text of waiting_text or '';
    narrowed first, never wrapped."""

    def __init__(self) -> None:
        super().__init__(Column(no_wrap=False, overflow="ellipsis"))

    def render(self, task: Task) -> Text:
        waiting = task.fields.get("waiting")
        text = waiting() if waiting is not None and not task.finished else ""
        return _one_line(text, "progress.elapsed")


@contextlib.contextmanager
def heartbeat(progress: Progress, console: Console, every: float | None = None) -> Iterator[None]:
    """Off a terminal rich draws no bar until the end: a line every `every` seconds while a
    request is long, so a log shows the stage is alive."""
    if console.is_terminal or console.quiet:
        yield
        return
    stop = threading.Event()
    every = HEARTBEAT if every is None else every

    def beat() -> None:
        while not stop.wait(every):
            for task in list(progress.tasks):
                waiting = task.fields.get("waiting")
                text = waiting() if waiting is not None and not task.finished else ""
                if text:
                    total = f"/{task.total:.0f}" if task.total is not None else ""
                    console.print(f"{task.description}: {task.completed:.0f}{total} units · {text}")

    thread = threading.Thread(target=beat, name="personaemp-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
