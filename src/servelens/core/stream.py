"""What a stream's chunks say taken together: the tokens each chunk carries for ITL, and how the
stream ended. Pure; shared by the gateway's meter and the bench client, so both count alike.

Definitions (design notes, after NVIDIA Dynamo's frontend):

* Tokens per chunk come from the cumulative ``usage.completion_tokens`` when the server sends it on
  every chunk (vLLM's and SGLang's ``continuous_usage_stats``): a chunk carries the increase of its
  choice's count. A chunk whose count did not move carries no token (its gap joins the next token's);
  a chunk whose count moved carries tokens even with empty text (a token the detokenizer holds back,
  a stop token on the ``finish_reason`` chunk). Without such usage, one output-bearing chunk is one
  token (flagged: :attr:`FirstChoiceTokens.from_usage` is False).
* The first token is the first chunk carrying output (TTFT): tokens counted on chunks before it
  (empty text) are not a first token; they join the first output chunk, whose extra tokens get no
  ITL (they have no gap before them).
* With several choices (``n`` > 1) TTFT and ITL are those of the first choice (``index`` 0), from its
  own counts: vLLM (``serving_chat.py``, ``serving_completion.py``: ``previous_num_tokens[i]``) and
  SGLang (``completion_tokens[index]``) put on each chunk, which carries one choice, that choice's own
  cumulative count, and the request's total only on the final usage-only chunk (``choices`` empty).
  A chunk carrying several choices and usage cannot be split among them: from then on one output
  chunk is one token.
"""

from __future__ import annotations

from servelens.core.openai import ChunkInfo


class FirstChoiceTokens:
    """How many of the first choice's tokens each chunk of one stream carries. Not thread-safe.

    Feed every parsed chunk that is neither ``[DONE]``, malformed nor an error to :meth:`step`, in
    order; it returns the chunk's tokens, 0 when the chunk carries none (its time is not a token's).
    """

    __slots__ = ("_counted", "_prev", "from_usage", "started")

    def __init__(self) -> None:
        self._prev = 0  # the first choice's last cumulative count
        self._counted = False  # a count of the first choice was seen
        self.from_usage = True
        """False once a chunk showed the counts are not per chunk of the first choice (an output
        chunk without usage, a count that went back, usage on a chunk of several choices)."""
        self.started = False
        """The first output-bearing chunk of the first choice was seen (TTFT is known)."""

    @property
    def counted_from_usage(self) -> bool:
        """True when the tokens given so far came from cumulative usage (else one per output chunk)."""
        return self.from_usage and self._counted

    def step(self, info: ChunkInfo) -> int:
        """Tokens of the first choice in chunk ``info`` (>= 0; >= 1 for the first output chunk)."""
        output = info.first_output
        usage = info.usage
        ct = usage.completion_tokens if usage is not None else None
        increase = 0
        if self.from_usage:
            if info.choices > 1 and ct is not None:
                self.from_usage = False  # one count for several choices: not one choice's
            elif info.choices == 1 and info.first_choice:
                if ct is None:
                    if output:
                        self.from_usage = False  # usage only on some chunks: not per chunk
                elif ct < self._prev:
                    self.from_usage = False  # not cumulative
                else:
                    increase = ct - self._prev
                    self._prev = ct
                    self._counted = True
            elif output:  # output of the first choice in a chunk of several, without usage
                self.from_usage = False
        if not self.started:
            if not output:
                return 0
            self.started = True
            return max(increase, 1) if self.from_usage else 1
        if self.from_usage:
            return increase
        return 1 if output else 0


def stream_outcome(*, failed: bool, complete: bool, produced: bool, cut: bool = False) -> str:
    """The ``error_type`` (Dynamo's vocabulary) of a 200 stream that ended; ``""`` for success.

    ``failed``: an in-stream error (``error`` object, ``"object": "error"``, ``event: error``) or a
    malformed ``data`` payload -> ``backend_error``. ``cut``: the body ended inside an event (see
    :func:`cut_mid_event`) -> ``truncated_stream``, whatever came before it. ``complete``: ``[DONE]`` or
    every choice's ``finish_reason`` was seen; else ``truncated_stream``. ``produced``: the stream carried
    output (an output-bearing chunk, or usage counting completion tokens > 0, e.g. a reply that is only an
    end of sequence); a complete stream that produced nothing (``[DONE]`` alone, a role-only chunk then
    ``[DONE]``) is not a success: ``backend_error`` (the engine answered but generated nothing).
    See docs/counting.md.
    """
    if failed:
        return "backend_error"
    if cut or not complete:
        return "truncated_stream"
    if not produced:
        return "backend_error"
    return ""


def cut_mid_event(info: ChunkInfo) -> bool:
    """Whether the last event of a body, dispatched at its end without its blank line (what the SSE
    decoder's ``flush()`` gives), is the body cut inside an event: its ``data`` does not parse
    (``data: {"choi``). Such an event is a truncation, not a malformed chunk: an SSE client drops an
    event without its blank line. One that parses (a whole final ``data:`` line whose blank line is
    missing) is read as any other event."""
    return info.malformed
