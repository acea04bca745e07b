"""Request outcome vocabulary, following NVIDIA Dynamo's frontend ``requests_total`` labels.

``status`` is ``success`` or ``error``; ``error_type`` is empty on success and otherwise one of
:data:`ERROR_TYPES` (Dynamo 1.6 frontend vocabulary).
"""

from __future__ import annotations

from typing import Final, Literal

SUCCESS: Final = "success"
ERROR: Final = "error"

Status = Literal["success", "error"]

ErrorType = Literal[
    "",
    "validation",
    "not_found",
    "overload",
    "unavailable",
    "cancelled",
    "response_timeout",
    "internal",
    "backend_error",
    "truncated_stream",
]

ERROR_TYPES: Final[tuple[str, ...]] = (
    "validation",  # bad request, or the upstream's 400
    "not_found",  # unknown model (counted under model="unknown_model")
    "overload",  # 429, or the upstream's 503
    "unavailable",  # upstream unreachable
    "cancelled",  # the client went away
    "response_timeout",  # the upstream did not answer in time
    "internal",  # a bug of ours
    "backend_error",  # upstream 5xx, or an error object inside a 200 stream
    "truncated_stream",  # the stream ended with neither finish_reason nor [DONE]
)

UNKNOWN_MODEL: Final = "unknown_model"
"""Model label used for requests naming an unregistered model (as Dynamo does)."""

ENDPOINTS: Final[tuple[str, ...]] = ("chat_completions", "completions")
REQUEST_TYPES: Final[tuple[str, ...]] = ("stream", "unary")


def error_type_for_status(status: int) -> str:
    """Dynamo ``error_type`` for an HTTP error status (an upstream's, or a server's seen by a client).

    404 -> ``not_found``; 429 and 503 -> ``overload``; 408 and 504 -> ``response_timeout`` (a timeout
    further down the chain, e.g. a load balancer in front of the engine, or the gateway's own 504);
    other 4xx -> ``validation`` (the request was refused as sent); other 5xx, and any other status
    the caller did not expect (a 3xx where a completion was due), -> ``backend_error``.
    """
    if status == 404:
        return "not_found"
    if status in (429, 503):
        return "overload"
    if status in (408, 504):
        return "response_timeout"
    if 400 <= status < 500:
        return "validation"
    return "backend_error"


def check_error_type(error_type: str) -> str:
    """Return ``error_type`` if it is in the vocabulary (or empty); raise ValueError otherwise."""
    if error_type and error_type not in ERROR_TYPES:
        raise ValueError(f"unknown error_type {error_type!r}; expected one of {', '.join(ERROR_TYPES)}")
    return error_type


def check_request_labels(endpoint: str, request_type: str) -> None:
    """Check the ``endpoint`` and ``request_type`` label values of ``requests_total``.

    Raises ValueError unless ``endpoint`` is one of :data:`ENDPOINTS` and ``request_type`` one of
    :data:`REQUEST_TYPES` (Dynamo's frontend label values).
    """
    if endpoint not in ENDPOINTS:
        raise ValueError(f"unknown endpoint {endpoint!r}; expected one of {', '.join(ENDPOINTS)}")
    if request_type not in REQUEST_TYPES:
        raise ValueError(f"unknown request_type {request_type!r}; expected one of {', '.join(REQUEST_TYPES)}")
