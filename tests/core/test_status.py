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
