"""Printing a bench result: the per-bucket table (client beside server when the server was scraped)
and a few summary lines."""

from __future__ import annotations

from urllib.parse import urlsplit

from rich.console import Console

from servelens.bench.summary import BenchResult
from servelens.core.clumping import detect_clumping
from servelens.formats.columnar import COLUMNS_DIR
from servelens.formats.slo_table import attainment_table
from servelens.formats.table import UNCACHED_HEADER, cells_wrap, fit_to, fitted_table, side_by_side


def server_source(result: BenchResult) -> str:
    """How the tables name the server side: ``gateway /metrics`` when a servelens gateway served the
    scrape (:func:`~servelens.bench.control.server_kind`), else the scraped address without its scheme
    (``127.0.0.1:8000/metrics``: the ASGI middleware's engine, another exporter), else ``/metrics``."""
    if result.summary.get("server_kind") == "gateway":
        return "gateway /metrics"
    url = (result.summary.get("config") or {}).get("metrics_url")
    if url:
        parts = urlsplit(url)
        return f"{parts.netloc}{parts.path}"
    return "/metrics"


def print_result(result: BenchResult, console: Console | None = None) -> None:
    """Print the client table (the client/server table instead when there are server rows; on a
    terminal too narrow for it without wrapping a cell, the client's table and then the server's, with
    the unit in the headers when a unit in every cell would wrap, as at 80 columns) and a few summary
    lines to ``console`` (stdout by default)."""
    if console is None:
        console = Console()
        if not console.is_terminal:
            console = Console(width=max(console.width, 150))  # a file or pipe: do not wrap the columns
    s = result.summary
    lines = [result.lag.verdict(), result.prompt_deviation.line()]
    clumping = detect_clumping(r.chunk_offsets_ns for r in result.records if r.ok)
    if clumping.clumped:  # a buffering proxy: the client's ITL and TTFT are the proxy's, whatever the lag says
        lines.insert(0, clumping.line())
    if result.dropped or result.clipped:
        template = s.get("template_tokens")
        lines.append(f"over the context ({s['max_context']} tokens"
                     + (f", {template} of them the endpoint's chat template" if template else "")
                     + f"): {result.dropped} dropped, {result.clipped} clipped")
    if s.get("server_all_from_buckets"):
        lines.append("server 'all requests': the by-ISL histograms summed over the buckets (the endpoint exports "
                     "no stock histograms; a request that failed before its first token is in no bucket)")
    if s.get("tokens_per_chunk_from_usage") is False:
        lines.append("the server sent no continuous usage: ITL counts one token per chunk")
    title = f"servelens bench: {result.model} ({result.endpoint}), {len(result.records)} requests"
    if not result.lag.trustworthy:
        title += " [CLIENT FIGURES NOT TRUSTWORTHY]"
    if clumping.clumped:
        title += " [TOKENS ARRIVE IN CLUMPS: A PROXY BUFFERS THE STREAM]"
    source = server_source(result)
    both = side_by_side(result.client_rows, result.server_rows, title=f"{title}\nClient vs server ({source})",
                        notes=lines) if result.server_rows else None
    if both is not None and fit_to(both, console.width) and not cells_wrap(both, console.width):
        console.print(both)  # one table: the client's figures beside the server's, no cell wrapped
    elif both is not None:  # a narrower terminal: the client's table, then the server's
        console.print(fitted_table(result.client_rows, console.width, title=title + "\nClient (exact percentiles)",
                                   caption="\n".join(lines)))
        console.print(fitted_table(result.server_rows or [], console.width, title=f"Server ({source})"))
    else:
        console.print(fitted_table(result.client_rows, console.width, title=title, caption="\n".join(lines)))
        if s.get("server_error"):
            console.print(f"server side: none, the final scrape failed: {s['server_error']}")
        elif result.server_rows is not None:
            console.print("server side: the /metrics endpoint has no servelens by-ISL histograms "
                          f"(prefix {s['config']['metrics_prefix']!r})")
    if result.uncached_client_rows is not None:
        _print_uncached(result, console)
    if result.attainment is not None and result.slo is not None:
        table = attainment_table(result.attainment, result.slo, "SLO attainment (client, exact)")
        fit_to(table, console.width)
        console.print(table)
    rps = s.get("requests_per_s")
    console.print(
        f"{s['requests']} requests, {s['errors']} errors in {result.elapsed_s:.1f} s"
        + (f" ({rps:.1f} req/s, {s['chunks_per_s']:.0f} chunks/s)" if rps else "")
    )
    if result.results_path is not None:
        cols = result.results_path.parent / COLUMNS_DIR
        extra = f"  columns: {cols}" if cols.is_dir() else ""
        console.print(f"results: {result.results_path}{extra}  summary: {result.summary_path}")


def _print_uncached(result: BenchResult, console: Console) -> None:
    """The second table: by uncached prompt tokens (ISL minus cached tokens), client beside server when
    the server has the by-uncached families (the gateway's ``--uncached-buckets``)."""
    assert result.uncached_client_rows is not None
    title = "By uncached prompt tokens (ISL - cached tokens; requests without cached tokens: 'all' only)"
    server = result.uncached_server_rows
    source = server_source(result)
    table = (side_by_side(result.uncached_client_rows, server, title=f"{title}\nClient vs server ({source})",
                          label_header=UNCACHED_HEADER) if server else None)
    if table is not None and fit_to(table, console.width) and not cells_wrap(table, console.width):
        console.print(table)
    else:  # one above the other, as the ISL tables at a narrow width
        console.print(fitted_table(result.uncached_client_rows, console.width, label_header=UNCACHED_HEADER,
                                   title=title + ("\nClient (exact percentiles)" if server else "")))
        if server:
            console.print(fitted_table(server, console.width, label_header=UNCACHED_HEADER,
                                       title=f"Server ({source})"))
    if server is not None and not server:
        console.print("server side by uncached prompt tokens: none (run the gateway with --uncached-buckets)")
