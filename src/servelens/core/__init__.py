"""Pure measurement core: no I/O, no clock reads, no asyncio, no prometheus_client.

Everything here takes plain numbers (integer nanoseconds, token counts) and returns
frozen values, so it can be tested with synthetic timestamps and reused by the gateway,
the bench client, the simulator and library users alike.

- Measuring: :mod:`.buckets` (ISL buckets), :mod:`.timing` (a request's timestamps -> its record;
  the TTFT/ITL definitions), :mod:`.sse` (the incremental SSE decoder), :mod:`.openai` (reading
  chunks: output, usage, errors), :mod:`.status` (Dynamo's outcome vocabulary).
- Aggregating: :mod:`.histogram` (owned histogram state), :mod:`.state` (per-model, per-bucket
  state the exporters read), :mod:`.snapshot` (a copy of its exported values, what a scrape formats),
  :mod:`.quantiles` (exact and ``histogram_quantile``), :mod:`.summary`
  (the per-bucket table as data).
- Analysis: :mod:`.windows` (inputs), :mod:`.decompose` and :mod:`.uncertainty` (a latency change
  split into traffic mix and latency, ``servelens explain``), :mod:`.verdict` (its one line),
  :mod:`.units` (times in running text, one unit per group of figures), :mod:`.compare` (two runs
  bucket by bucket), :mod:`.slo` (attainment and goodput),
  :mod:`.capacity` (where the capacity is short: TTFT split into queue and prefill) and
  :mod:`.prefill_fit` (the prefill throughput fitted from TTFT against uncached tokens).

May import: nothing of servelens outside ``core`` (numpy and scipy are allowed; asyncio, sockets,
the clock and prometheus_client are not). tests/test_layering.py keeps it so.
"""
