"""The HTTP status -> Dynamo error_type mapping shared by the gateway and the bench."""

from __future__ import annotations

import pytest

from servelens.core.status import ERROR_TYPES, error_type_for_status


@pytest.mark.parametrize(
    ("status", "error_type"),
    [
        (400, "validation"), (401, "validation"), (413, "validation"), (422, "validation"),
        (404, "not_found"),
        (429, "overload"), (503, "overload"),
        (408, "response_timeout"), (504, "response_timeout"),
        (500, "backend_error"), (502, "backend_error"), (599, "backend_error"),
        (302, "backend_error"),
    ],
)
def test_error_type_for_status(status: int, error_type: str) -> None:
    assert error_type_for_status(status) == error_type
    assert error_type in ERROR_TYPES


def test_label_checks_accept_the_vocabulary_and_say_what_is_wrong() -> None:
    from servelens.core.status import ENDPOINTS, REQUEST_TYPES, check_error_type, check_request_labels

    assert [check_error_type(t) for t in ("", *ERROR_TYPES)] == ["", *ERROR_TYPES]
    for e in ENDPOINTS:
        for r in REQUEST_TYPES:
            check_request_labels(e, r)
    cases = [
        (lambda: check_error_type("oops"), "unknown error_type 'oops'; expected one of " + ", ".join(ERROR_TYPES)),
        (lambda: check_request_labels("embeddings", "stream"),
         "unknown endpoint 'embeddings'; expected one of chat_completions, completions"),
        (lambda: check_request_labels("completions", "batch"),
         "unknown request_type 'batch'; expected one of stream, unary"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError) as err:
            call()
        assert str(err.value) == message
