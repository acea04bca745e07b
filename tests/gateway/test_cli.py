"""``servelens gateway``: flags, config file, the ready line, clean stop, one-line errors."""

from __future__ import annotations

import json
import signal
import urllib.error
import urllib.request
from pathlib import Path

import aiohttp
import pytest

from servelens.cli.gateway import config_from_args
from servelens.cli.main import build_parser, main
from servelens.gateway.config import GatewayConfig
from servelens.gateway.requestlog import read_request_log
from servelens.process import ServerProcess


def parse(*argv: str) -> GatewayConfig:
    return config_from_args(build_parser().parse_args(["gateway", *argv]))


def test_flags_and_config_file(tmp_path: Path) -> None:
    cfg = parse("--upstream", "http://127.0.0.1:9/v1/", "--port", "0", "--isl-buckets", "100,200",
                "--metrics-prefix", "dynamo_frontend", "--by-isl-only", "--continuous-usage", "off")
    assert cfg.upstream == "http://127.0.0.1:9" and cfg.port == 0 and cfg.isl_buckets == "100,200"
    assert cfg.by_isl_only and cfg.continuous_usage == "off" and cfg.discover
    f = tmp_path / "gw.yaml"
    f.write_text("upstream: http://127.0.0.1:8000\nmodels:\n  a: http://127.0.0.1:8001\n"
                 "  b: {upstream: http://127.0.0.1:8002}\nisl_buckets: [512, 1024]\nread-timeout-s: 5\n")
    cfg = parse("--config", str(f), "--isl-buckets", "64")
    assert cfg.models == (("a", "http://127.0.0.1:8001"), ("b", "http://127.0.0.1:8002"))
    assert cfg.isl_buckets == "64" and cfg.read_timeout_s == 5 and not cfg.discover
    assert cfg.upstreams == ("http://127.0.0.1:8000", "http://127.0.0.1:8001", "http://127.0.0.1:8002")
    assert parse("--upstream", "http://h:1", "--model", "x", "--model", "y").models == (
        ("x", "http://h:1"), ("y", "http://h:1"))
    assert parse("--upstream", "http://h:1", "--isl-buckets", "off").isl_buckets is None
    assert parse("--upstream", "http://h:1").port == 8080


@pytest.mark.parametrize(("given", "expected"), [
    ("16MiB", 16 * 1024 * 1024), ("16 MiB", 16 * 1024 * 1024), ("16M", 16 * 1024 * 1024), ("16m", 16 * 1024 * 1024),
    ("512KiB", 512 * 1024), ("1GiB", 1024**3), ("16MB", 16_000_000), ("64kB", 64_000), ("2048", 2048),
    ("2048B", 2048), ("1.5MiB", 1536 * 1024),
])
def test_max_body_bytes_takes_a_size(given: str, expected: int, tmp_path: Path) -> None:
    """The help's own default, ``16MiB``, is accepted (it was refused), on the flag and in the file."""
    assert parse("--upstream", "http://h:1", "--max-body-bytes", given).max_body_bytes == expected
    f = tmp_path / "gw.yaml"
    f.write_text(f"upstream: http://h:1\nmax_body_bytes: {given}\n")
    assert parse("--config", str(f)).max_body_bytes == expected


@pytest.mark.parametrize("given", ["16XB", "MiB", "-5", "1.5", "16iB", ""])
def test_max_body_bytes_refuses_what_is_not_a_size(given: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["gateway", "--upstream", "http://h:1", "--max-body-bytes", given]) == 2
    err = capsys.readouterr().err
    assert err.startswith("servelens: error: max_body_bytes: a size must be") and err.count("\n") == 1, err


def test_empty_isl_buckets_is_an_error_not_off(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--isl-buckets ''`` (an unset shell variable) silently turned the by-ISL metrics off; only the
    words say off on purpose."""
    for value in ("", "  "):
        assert main(["gateway", "--upstream", "http://h:1", "--isl-buckets", value]) == 2
        assert "isl_buckets is empty: give boundaries in tokens" in capsys.readouterr().err
    f = tmp_path / "gw.yaml"
    for text in ('isl_buckets: ""\n', "isl_buckets:\n"):
        f.write_text("upstream: http://h:1\n" + text)
        assert main(["gateway", "--config", str(f)]) == 2
        assert "isl_buckets is empty" in capsys.readouterr().err
    for off in ("off", "none", "false"):
        assert parse("--upstream", "http://h:1", "--isl-buckets", off).isl_buckets is None


def test_edges_and_series_budget_from_flags_and_file(tmp_path: Path) -> None:
    from servelens.core.edges import FINE_ITL_EDGES_S, FINE_TTFT_EDGES_S, MetricEdges

    cfg = parse("--upstream", "http://h:1")
    assert cfg.ttft_edges_s is None and cfg.metric_edges == MetricEdges()
    assert cfg.metric_edges.ttft_s == FINE_TTFT_EDGES_S and cfg.metric_edges.itl_s == FINE_ITL_EDGES_S
    assert parse("--upstream", "http://h:1", "--metrics-prefix", "dynamo_frontend").metric_edges.is_dynamo
    cfg = parse("--upstream", "http://h:1", "--ttft-edges", "0.05,0.1,0.2", "--itl-edges", "dynamo",
                "--max-series", "9000", "--request-log-chunks")
    assert cfg.ttft_edges_s == (0.05, 0.1, 0.2) and cfg.metric_edges.ttft_s == (0.05, 0.1, 0.2)
    assert cfg.metric_edges.itl_s == MetricEdges.dynamo().itl_s and cfg.max_series == 9000 and cfg.request_log_chunks
    f = tmp_path / "gw.yaml"
    f.write_text("upstream: http://127.0.0.1:8000\nttft_edges_s: [0.1, 1, 10]\nitl_edges_s: fine\n"
                 "max_series: 100000\nrequest_log_chunks: true\n")
    cfg = parse("--config", str(f))
    assert cfg.metric_edges.ttft_s == (0.1, 1.0, 10.0) and cfg.metric_edges.itl_s == FINE_ITL_EDGES_S
    assert cfg.max_series == 100000 and cfg.request_log_chunks
    assert parse("--config", str(f), "--ttft-edges", "fine").ttft_edges_s == FINE_TTFT_EDGES_S  # flag wins
    # Dynamo's names: Dynamo's edges are accepted when spelt out, nothing else
    assert parse("--upstream", "http://h:1", "--metrics-prefix", "dynamo_frontend", "--ttft-edges",
                 "dynamo").metric_edges.is_dynamo


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "give --upstream"),
        (["--upstream", "ftp://x"], "upstream URL must look like"),
        (["--upstream", "http://h:1", "--isl-buckets", "512,100"], "strictly increasing"),
        (["--upstream", "http://h:1", "--by-isl-only", "--isl-buckets", "off"], "--by-isl-only needs"),
        (["--upstream", "http://h:1", "--config", "/nonexistent.yaml"], "cannot read config file"),
        (["--upstream", "http://h:1", "--metrics-prefix", "9bad"], "not a valid Prometheus"),
        (["--upstream", "http://h:1", "--tokenizer", "/nonexistent.json"], "tokenizer file not found"),
        (["--upstream", "http://h:1", "--ttft-edges", "1,0.5"], "ttft edges: histogram edges must be strictly"),
        (["--upstream", "http://h:1", "--itl-edges", "coarse"], "itl edges must be fine, dynamo or"),
        (["--upstream", "http://h:1", "--metrics-prefix", "dynamo_frontend", "--by-isl-only", "--ttft-edges",
          "fine"], "the TTFT, ITL and duration edges are Dynamo's"),
        (["--upstream", "http://h:1", "--duration-edges", "2,1"], "duration edges: histogram edges must be strictly"),
        (["--upstream", "http://h:1", "--max-series", "0"], "max_series must be >= 1"),
    ],
)
def test_user_errors_are_one_line(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["gateway", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("servelens: error: ") and message in err and err.count("\n") == 1


def test_bad_yaml_and_unknown_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text("upstream: [unclosed\n")
    assert main(["gateway", "--config", str(f)]) == 2
    assert "not valid YAML" in capsys.readouterr().err
    f.write_text("upstream: http://h:1\nbogus: 1\n")
    assert main(["gateway", "--config", str(f)]) == 2
    assert "unknown gateway setting(s): bogus" in capsys.readouterr().err


def test_misspelt_key_is_named_before_a_missing_upstream(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A file holding only ``porrt: 1`` said "give --upstream URL": the misspelt key, which explains it,
    is what the error names."""
    f = tmp_path / "gateway.yaml"
    f.write_text("porrt: 1\n")
    assert main(["gateway", "--config", str(f)]) == 2
    assert capsys.readouterr().err == (
        f"servelens: error: config file {f}: unknown gateway setting(s): porrt (did you mean port?)\n")


@pytest.mark.parametrize(
    ("setting", "message"),
    [  # each was a TypeError traceback, or accepted and broken later
        ("max_body_bytes: abc", "max_body_bytes: a size must be a number of bytes or e.g. 16MiB"),
        ("max_models: x", "max_models must be an integer"),
        ("max_models: .inf", "max_models must be an integer"),
        ("models_refresh_s: x", "models_refresh_s must be a number of seconds"),
        ("models_refresh_s: .nan", "models_refresh_s must be a number of seconds"),  # the refresher died
        ("repoll_min_interval_s: .nan", "repoll_min_interval_s must be a number of seconds"),  # never re-polled
        ("read_timeout_s: abc", "read_timeout_s must be a number of seconds, got 'abc'"),
        ("isl_buckets: 5.5", "isl_buckets must be a list or a comma-separated string"),
        ("host: 5", "host must be a string"),
        ("metrics_prefix: 5", "metrics_prefix must be a string"),
        ("tokenizer: 5", "tokenizer must be a string"),
        ("request_log: [1]", "request_log must be a string"),
        ('by_isl_only: "yes"', "by_isl_only must be true or false"),
        ("inject_usage: 0", "inject_usage must be true or false"),
        ("request_log_chunks: 1", "request_log_chunks must be true or false"),
        ("max_series: 1e5", "max_series must be an integer"),
        ("ttft_edges_s: {a: 1}", "ttft edges must be fine, dynamo or a list"),
        ("itl_edges_s: [0.1, x]", "itl edges must be fine, dynamo or comma-separated seconds, got 'x'"),
        ("models: [unknown_model]", "'unknown_model' is reserved"),  # was a warning, and a server without it
    ],
)
def test_config_file_settings_of_the_wrong_type_are_one_line(setting: str, message: str, tmp_path: Path) -> None:
    # checked on the config (main() would serve, had a bad value been accepted); main() prints a
    # ValueError as one line (test_user_errors_are_one_line)
    f = tmp_path / "gw.yaml"
    f.write_text(f"upstream: http://127.0.0.1:9\n{setting}\n")
    with pytest.raises(ValueError) as err:
        parse("--config", str(f), "--port", "0")
    assert message in str(err.value) and "\n" not in str(err.value)


def test_config_file_that_is_not_text_and_infinite_timeouts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "gw.yaml"
    f.write_bytes(b"\xab\xcd\x00")
    assert main(["gateway", "--config", str(f)]) == 2
    assert capsys.readouterr().err == f"servelens: error: config file {f} is not UTF-8 text (invalid start byte)\n"
    # inf stays allowed for the timeouts and the refresh period: no limit, never
    f.write_text("upstream: http://127.0.0.1:9\nread_timeout_s: .inf\nresponse_timeout_s: .inf\n"
                 "models_refresh_s: .inf\nclient_timeout_s: .inf\n")
    cfg = parse("--config", str(f))
    assert cfg.read_timeout_s == cfg.response_timeout_s == cfg.models_refresh_s == float("inf")
    assert cfg.client_timeout_s == float("inf")
    assert parse("--upstream", "http://h:1", "--client-timeout", "7").client_timeout_s == 7


README = Path(__file__).resolve().parents[2] / "README.md"


def _readme_gateway_yaml() -> str:
    """The README's example ``gateway.yaml`` (the yaml block that starts ``# gateway.yaml``)."""
    text = README.read_text()
    start = text.index("```yaml\n# gateway.yaml\n") + len("```yaml\n")
    return text[start:text.index("```", start)]


def test_readme_gateway_yaml_parses_and_starts(tmp_path: Path) -> None:
    """The README's example file: every setting is accepted, and a gateway starts from it (its engines
    need not be up); the test binds free ports over the file's 8080 and 9100. Its request log is a path in
    the working folder (a folder that does not exist failed the README's command as written)."""
    f = tmp_path / "gateway.yaml"
    f.write_text(_readme_gateway_yaml())
    assert parse("--config", str(f)).request_log == "gateway-requests.jsonl"
    log = tmp_path / "requests.jsonl"
    cfg = parse("--config", str(f), "--request-log", str(log))
    assert cfg.models == (("llama-3.1-8b", "http://127.0.0.1:8000"), ("qwen3-32b", "http://127.0.0.1:8001"))
    assert (cfg.host, cfg.port, cfg.metrics_port) == ("127.0.0.1", 8080, 9100)
    assert cfg.max_body_bytes == 16 * 1024 * 1024 and cfg.isl_buckets == "512,1024,2048,4096,8192,16384"
    assert cfg.continuous_usage == "auto" and cfg.request_log == str(log) and cfg.shutdown_timeout_s == 25
    with ServerProcess(["gateway", "--config", str(f), "--metrics-port", "0", "--request-log", str(log)]) as gw:
        assert gw.url.startswith("http://127.0.0.1:")
        with urllib.request.urlopen(gw.url + "/health", timeout=10) as resp:
            assert resp.status == 200
        with pytest.raises(urllib.error.HTTPError) as err:  # /metrics is on its own port
            urllib.request.urlopen(gw.url + "/metrics", timeout=10)
        assert err.value.code == 404
    assert "models llama-3.1-8b, qwen3-32b" in gw.startup_lines[0], gw.startup_lines


async def test_cli_serves_measures_and_stops_cleanly(tmp_path: Path) -> None:
    log = tmp_path / "req.jsonl"
    with ServerProcess(["sim", "--speedup", "20"]) as sim:
        gw = ServerProcess(["gateway", "--upstream", sim.url, "--request-log", str(log), "--by-isl-only"]).start()
        try:
            assert gw.url.startswith("http://127.0.0.1:")
            async with aiohttp.ClientSession() as s:
                async with s.get(gw.url + "/health") as r:
                    assert r.status == 200
                async with s.get(gw.url + "/ready") as r:
                    assert r.status == 200
                body = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
                        "stream": True}
                async with s.post(gw.url + "/v1/chat/completions", json=body) as r:
                    assert r.status == 200 and (await r.read()).endswith(b"data: [DONE]\n\n")
                async with s.get(gw.url + "/metrics") as r:
                    text = await r.text()
            assert "servelens_time_to_first_token_by_isl_seconds_count" in text
            assert "servelens_requests_total" not in text  # sidecar mode: no stock families
        finally:
            assert gw.proc is not None
            gw.proc.send_signal(signal.SIGTERM)
            assert gw.proc.wait(timeout=60) == 0  # a bound for a hung test only
            gw.stop()
    (entry,) = read_request_log(log)
    assert entry["status"] == "success" and entry["model"] == "sim-model"
    assert json.dumps(entry)


def test_unreachable_upstream_still_starts() -> None:
    with ServerProcess(["gateway", "--upstream", "http://127.0.0.1:9"]) as gw:
        assert gw.url


@pytest.mark.parametrize("command", ["gateway", "sim"])
def test_address_that_cannot_be_listened_on_is_one_line(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        extra = ["--upstream", "http://127.0.0.1:9"] if command == "gateway" else []
        assert main([command, *extra, "--host", "127.0.0.1", "--port", str(port)]) == 2
    last = capsys.readouterr().err.splitlines()[-1]
    # one clean line, as --workers 2 gives (asyncio's text repeated the address: "error while attempting to bind
    # on address ('127.0.0.1', PORT): address already in use")
    assert last == f"servelens: error: cannot listen on 127.0.0.1:{port}: Address already in use"
    assert main([command, *extra, "--host", "256.1.1.1", "--port", "0"]) == 2
    assert capsys.readouterr().err.splitlines()[-1].startswith("servelens: error: cannot listen on 256.1.1.1:0: ")
