"""servelens.serving: how CLI servers log."""

from __future__ import annotations

import logging

from aiohttp.http_exceptions import BadHttpMessage

from servelens.serving import OneLineBadRequests


def test_malformed_client_request_is_logged_in_one_line() -> None:
    try:
        raise BadHttpMessage("Missing expected LF after header value:\n\n  b'X-A: a\\rb'\n       ^")
    except BadHttpMessage as exc:
        record = logging.LogRecord("aiohttp.server", logging.ERROR, __file__, 1, "Error handling request from %s",
                                   ("127.0.0.1",), (type(exc), exc, exc.__traceback__))
    assert OneLineBadRequests().filter(record)
    text = logging.Formatter().format(record)
    assert text == "bad HTTP request from 127.0.0.1: Missing expected LF after header value"


def test_other_errors_keep_their_traceback() -> None:
    try:
        raise RuntimeError("a bug")
    except RuntimeError as exc:
        record = logging.LogRecord("aiohttp.server", logging.ERROR, __file__, 1, "Error handling request from %s",
                                   ("127.0.0.1",), (type(exc), exc, exc.__traceback__))
    assert OneLineBadRequests().filter(record)
    assert "Traceback" in logging.Formatter().format(record)
