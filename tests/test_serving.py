"""servelens.serving: how CLI servers log."""

from __future__ import annotations

import logging

from aiohttp.http_exceptions import BadHttpMessage

from servelens.serving import OneLineBadRequests


def logged(exc: BaseException) -> str:
    """What aiohttp's server logs for ``exc`` ("Error handling request from PEER", with exc_info),
    after the filter."""
    try:
        raise exc
    except BaseException as raised:
        record = logging.LogRecord("aiohttp.server", logging.ERROR, __file__, 1, "Error handling request from %s",
                                   ("127.0.0.1",), (type(raised), raised, raised.__traceback__))
    assert OneLineBadRequests().filter(record)
    return logging.Formatter().format(record)


def test_malformed_client_request_is_logged_in_one_line() -> None:
    text = logged(BadHttpMessage("Missing expected LF after header value:\n\n  b'X-A: a\\rb'\n       ^"))
    assert text == "bad HTTP request from 127.0.0.1: Missing expected LF after header value"


def test_other_errors_keep_their_traceback() -> None:
    assert "Traceback" in logged(RuntimeError("a bug"))
