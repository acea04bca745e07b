"""Render a servelens HTML report in headless Chromium and save PNGs at desktop and laptop widths.

Usage::

    python scripts/screenshot_report.py servelens-demo/report.html --out shots/
    python scripts/screenshot_report.py report.html --widths 1440,1280,1024 --height 7000

Writes ``<out>/<report stem>-<width>.png`` per width (the page from its top, ``--height`` pixels
tall), and prints what the rendered page holds (:func:`servelens.testing.browser.rendered_plots`):
every plotly chart, its drawn traces and points, so an empty or broken chart shows without looking.
Needs Chromium (Debian: ``apt-get install chromium``); exits 2 with one line when it is missing.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from servelens.testing.browser import BrowserError, find_chromium, rendered_plots, screenshot


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("html", type=Path, help="the report (an HTML file)")
    ap.add_argument("--out", type=Path, default=Path("screenshots"), help="folder for the PNGs (default screenshots)")
    ap.add_argument("--widths", default="1440,1280,1024",
                    help="viewport widths in CSS px, comma-separated (default 1440,1280,1024)")
    ap.add_argument("--height", type=int, default=6000, help="viewport height in CSS px (default 6000)")
    args = ap.parse_args(argv)
    try:
        chromium = find_chromium()
        if not args.html.is_file():
            raise BrowserError(f"{args.html}: no such file")
        args.out.mkdir(parents=True, exist_ok=True)
        for width in (int(w) for w in args.widths.split(",")):
            png = args.out / f"{args.html.stem}-{width}.png"
            screenshot(chromium, args.html, png, width, args.height)
            print(f"wrote {png}")
        for plot in rendered_plots(chromium, args.html):
            print(f"{plot.title}: {plot.traces} traces, {plot.points} points drawn")
    except BrowserError as exc:
        print(f"screenshot_report: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
