"""The reference-mix file: the share of requests per ISL bucket that mix-adjusted figures are
computed at (``servelens explain --reference-mix``, ``servelens dashboard --reference-mix``).

YAML (JSON is YAML too)::

    # servelens reference mix: share of requests per ISL bucket (any positive scale)
    shares:
      0-512: 0.31
      513-1024: 0.22
      ...

A bare mapping of label to share is read as well. Every label of the buckets it is used with must
be named, and nothing else (:func:`servelens.core.windows.aligned_mix` says which differ).
"""

from __future__ import annotations

from pathlib import Path

import yaml

from servelens.core.windows import ExplainError, Mix

HEADER = "# servelens reference mix: share of requests per ISL bucket (any positive scale)\n"


def read_mix(path: str | Path) -> Mix:
    """The mix in ``path`` (labels in the file's order). Raises ExplainError (one line) for an
    unreadable file, one that is not a mapping of bucket labels to numbers, or shares that are
    negative, not finite or all zero."""
    try:
        doc = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise ExplainError(f"cannot read reference mix {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise ExplainError(f"reference mix {path} is not YAML: {str(exc).splitlines()[0]}") from None
    shares = doc.get("shares", doc) if isinstance(doc, dict) else None
    if not isinstance(shares, dict) or not shares:
        raise ExplainError(f"reference mix {path} must map ISL bucket labels to shares (shares: {{0-512: 0.3, ...}})")
    try:
        values = {str(k): float(v) for k, v in shares.items()}
    except (TypeError, ValueError):
        raise ExplainError(f"reference mix {path}: every share must be a number") from None
    try:
        return Mix(tuple(values), tuple(values.values()))
    except ExplainError as exc:
        raise ExplainError(f"reference mix {path}: {exc}") from None


def write_mix(path: str | Path, mix: Mix, source: str = "") -> Path:
    """Write ``mix`` as a reference-mix file (parent folders created). Returns the path; raises OSError."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    text = HEADER + (f"# from {source}\n" if source else "")
    text += yaml.safe_dump({"shares": {k: round(v, 6) for k, v in zip(mix.labels, mix.shares, strict=True)}},
                           sort_keys=False)
    p.write_text(text)
    return p
