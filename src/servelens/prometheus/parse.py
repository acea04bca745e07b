"""Parsing Prometheus text exposition with ``prometheus_client.parser`` into flat samples."""

from __future__ import annotations

LabelKey = tuple[tuple[str, str], ...]


def parse_exposition(text: str) -> dict[tuple[str, LabelKey], float]:
    """``{(sample_name, sorted label items): value}`` for every sample of a text exposition.

    Raises ValueError (one line) when the text is not Prometheus exposition format.
    """
    from prometheus_client.parser import text_string_to_metric_families

    samples: dict[tuple[str, LabelKey], float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                samples[(s.name, tuple(sorted(s.labels.items())))] = float(s.value)
    except Exception as exc:  # the parser raises assorted errors on garbage
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else "it does not parse as metric lines"
        raise ValueError(f"not Prometheus text exposition: {reason}") from None
    return samples
