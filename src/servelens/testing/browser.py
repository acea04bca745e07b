"""Looking at an HTML report in a real browser: headless Chromium screenshots, and what the page
holds once its JavaScript ran (each plotly chart's title, drawn traces and points), read from the
rendered DOM (``--dump-dom``) so a test can assert that charts rendered without comparing pixels.

Chromium: Debian's ``chromium`` (or ``chromium-browser``, ``google-chrome``) on PATH, or
``$SERVELENS_CHROMIUM``. Every call runs one headless process with a fresh profile and a time
limit; ``--virtual-time-budget`` lets the page's scripts (plotly's drawing) finish first.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
SCRIPT_BUDGET_MS = 10_000
"""Virtual time the page's scripts get before the screenshot or the DOM dump (ms)."""


class BrowserError(Exception):
    """No Chromium, or it failed (the message is one line)."""


def find_chromium() -> str:
    """The Chromium executable (``$SERVELENS_CHROMIUM``, else the first of :data:`CANDIDATES` on
    PATH). Raises BrowserError when there is none."""
    env = os.environ.get("SERVELENS_CHROMIUM")
    if env:
        found = shutil.which(env)
        if found is None:
            raise BrowserError(f"SERVELENS_CHROMIUM={env} is not an executable program")
        return found
    for name in CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    raise BrowserError("no Chromium on PATH (Debian: apt-get install chromium; or set SERVELENS_CHROMIUM)")


def _run(chromium: str, args: list[str], timeout_s: float) -> str:
    with tempfile.TemporaryDirectory(prefix="servelens-chromium-") as profile:
        cmd = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
               "--no-first-run", "--disable-extensions", f"--user-data-dir={profile}",
               f"--virtual-time-budget={SCRIPT_BUDGET_MS}", *args]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired:
            raise BrowserError(f"chromium did not finish in {timeout_s:g} s") from None
        except OSError as exc:
            raise BrowserError(f"cannot run {chromium}: {exc.strerror or exc}") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise BrowserError(f"chromium exited with status {done.returncode}: {last}")
    return done.stdout


def screenshot(chromium: str, html: Path, png: Path, width: int, height: int, timeout_s: float = 120.0) -> Path:
    """Save ``html`` rendered in a ``width`` x ``height`` CSS-px viewport (the page from its top) as
    ``png``. Raises BrowserError when Chromium fails or writes nothing."""
    png.unlink(missing_ok=True)
    _run(chromium, [f"--window-size={width},{height}", f"--screenshot={png.resolve()}",
                    html.resolve().as_uri()], timeout_s)
    if not png.is_file() or png.stat().st_size == 0:
        raise BrowserError(f"chromium wrote no screenshot {png}")
    return png


def rendered_dom(chromium: str, html: Path, width: int = 1440, timeout_s: float = 120.0) -> str:
    """The page's DOM (HTML text) after its scripts ran, at viewport ``width`` px."""
    return _run(chromium, [f"--window-size={width},4000", "--dump-dom", html.resolve().as_uri()], timeout_s)


@dataclass(frozen=True)
class RenderedPlot:
    """One plotly chart as drawn: its title, the traces drawn (bar or scatter groups) and the
    points drawn (bars with a non-empty path, markers, line segments)."""

    title: str
    traces: int
    points: int


class _PlotParser(HTMLParser):
    """Walks the dumped DOM; plotly draws each chart into ``div.js-plotly-plot`` with SVG inside."""

    def __init__(self) -> None:
        super().__init__()
        self.plots: list[dict[str, object]] = []
        self._stack: list[tuple[str, set[str]]] = []
        self._plot_depth: int | None = None
        self._in_title = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        classes = set((a.get("class") or "").split())
        self._stack.append((tag, classes))
        if tag == "div" and "js-plotly-plot" in classes and self._plot_depth is None:
            self._plot_depth = len(self._stack)
            self.plots.append({"title": "", "traces": 0, "points": 0})
            return
        if self._plot_depth is None:
            return
        plot = self.plots[-1]
        if tag == "text" and "gtitle" in classes:
            self._in_title = True
        if tag == "g" and "trace" in classes and ({"bars", "scatter"} & classes):
            plot["traces"] = int(plot["traces"]) + 1  # type: ignore[call-overload]
        d = a.get("d") or ""
        if tag == "path" and d and d not in ("M0,0Z", "M0,0"):
            parents = set().union(*(c for _, c in self._stack[-3:-1]))
            if "point" in classes or "point" in parents or "js-line" in classes:
                plot["points"] = int(plot["points"]) + 1  # type: ignore[call-overload]

    def handle_endtag(self, tag: str) -> None:
        if tag == "text":
            self._in_title = False
        while self._stack:
            t, _ = self._stack.pop()
            if self._plot_depth is not None and len(self._stack) < self._plot_depth:
                self._plot_depth = None
            if t == tag:
                break

    def handle_data(self, data: str) -> None:
        if self._in_title and self.plots:
            self.plots[-1]["title"] = str(self.plots[-1]["title"]) + data


def plots_in_dom(dom: str) -> list[RenderedPlot]:
    """The plotly charts in a rendered DOM, in page order."""
    p = _PlotParser()
    p.feed(dom)
    return [RenderedPlot(str(x["title"]), int(x["traces"]), int(x["points"]))  # type: ignore[call-overload]
            for x in p.plots]


def rendered_plots(chromium: str, html: Path, width: int = 1440) -> list[RenderedPlot]:
    """:func:`plots_in_dom` of ``html`` rendered by Chromium. Raises BrowserError."""
    return plots_in_dom(rendered_dom(chromium, html, width))
