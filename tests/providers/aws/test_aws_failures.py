"""How the AWS provider fails: an endpoint that refuses the connection, one that accepts
it and never answers, one that keeps throttling. Every failure is a ``DriverError``
naming the driver, the instance and the call, within the configured bounds, and the
secret access key is in no message and no log line.

The throttling peer is a stand-in, not AWS: a small HTTP server that answers EC2's
``RequestLimitExceeded`` error document (the shape EC2's query API returns) a set number
of times, then an empty ``DescribeInstances``. moto cannot be made to throttle.
"""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gpufleet.core.errors import DriverError
from gpufleet.providers.aws.config import AwsConfig, AwsPlacement
from gpufleet.providers.aws.driver import AwsProvider
from gpufleet.providers.base import Credential, PowerState

SECRET = "wJalrXUtnFEMI-K7MDENG-bPxRfiCYEXAMPLEKEY"  # made up; must never be printed
CREDENTIAL = Credential(username="AKIAIOSFODNN7EXAMPLE", secret=SECRET)
INSTANCE = "i-0123456789abcdef0"

THROTTLED = b"""<?xml version="1.0" encoding="UTF-8"?>
<Response><Errors><Error><Code>RequestLimitExceeded</Code><Message>Request limit exceeded.\
</Message></Error></Errors><RequestID>stand-in</RequestID></Response>"""
EMPTY = b"""<?xml version="1.0" encoding="UTF-8"?>
<DescribeInstancesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/">\
<requestId>stand-in</requestId><reservationSet/></DescribeInstancesResponse>"""


@pytest.fixture(autouse=True)
def no_real_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.delenv("AWS_PROFILE", raising=False)


def config(endpoint: str, **overrides: float) -> AwsConfig:
    settings: dict[str, object] = {
        "region": "us-east-1",
        "endpoint_url": endpoint,
        "clusters": {"c1": AwsPlacement(launch_template_name="gpu-template")},
        "connect_timeout_s": 1.0,
        "read_timeout_s": 1.0,
        "max_attempts": 1,
        "throttle_retries": 0,
        "call_timeout_s": 10.0,
    }
    settings.update(overrides)
    return AwsConfig(**settings)  # type: ignore[arg-type]


def assert_no_secret(exc: BaseException, caplog: pytest.LogCaptureFixture) -> None:
    texts = [caplog.text]
    seen: BaseException | None = exc
    while seen is not None:  # the message, and every exception chained to it
        texts += [str(seen), repr(seen)]
        seen = seen.__cause__ or seen.__context__
    assert not any(SECRET in text for text in texts)


@pytest.fixture
def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port  # closed again: connecting is refused


@pytest.fixture
def silent_endpoint() -> Iterator[str]:
    """Accepts TCP connections and never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            held.append(conn)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    thread.join(timeout=2)
    for conn in held:
        conn.close()
    listener.close()


class Throttler(ThreadingHTTPServer):
    daemon_threads = True
    throttle_first = 0
    requests = 0


class ThrottleHandler(BaseHTTPRequestHandler):
    server: Throttler

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.server.requests += 1
        throttled = self.server.requests <= self.server.throttle_first
        body = THROTTLED if throttled else EMPTY
        self.send_response(503 if throttled else 200)
        self.send_header("Content-Type", "text/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def throttler() -> Iterator[Throttler]:
    server = Throttler(("127.0.0.1", 0), ThrottleHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


async def test_a_closed_port_is_a_driver_error(
    closed_port: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    provider = AwsProvider(config(f"http://127.0.0.1:{closed_port}"), CREDENTIAL)
    with pytest.raises(DriverError) as raised:
        await provider.reboot(INSTANCE)
    message = raised.value.message
    assert message.startswith(f"aws: instance {INSTANCE}: ec2 DescribeInstances")
    assert "cannot connect" in message
    seen = await provider.check_reach(INSTANCE)
    assert not seen.reachable and seen.power is PowerState.UNKNOWN
    assert "cannot connect" in seen.detail
    assert_no_secret(raised.value, caplog)


async def test_a_silent_endpoint_times_out(
    silent_endpoint: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    provider = AwsProvider(config(silent_endpoint, read_timeout_s=0.5), CREDENTIAL)
    with pytest.raises(DriverError) as raised:
        await provider.terminate(INSTANCE)
    assert f"instance {INSTANCE}" in raised.value.message
    assert "did not answer" in raised.value.message
    seen = await provider.check_reach(INSTANCE)
    assert not seen.reachable and "did not answer" in seen.detail
    assert_no_secret(raised.value, caplog)


async def test_the_call_deadline_bounds_retries(silent_endpoint: str) -> None:
    # Two slow attempts and botocore's backoff outlast a short deadline: the deadline wins.
    # (The worker thread ends its own attempts in the background; the loop waits for it
    # at teardown, so they are kept few here.)
    provider = AwsProvider(
        config(silent_endpoint, read_timeout_s=0.4, max_attempts=2, call_timeout_s=0.6),
        CREDENTIAL,
    )
    with pytest.raises(DriverError, match=r"no answer within 0\.6 s \(call_timeout_s\)"):
        await provider.get_instance(INSTANCE)


async def test_throttling_is_retried_with_backoff_then_given_up(
    throttler: Throttler, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    endpoint = f"http://127.0.0.1:{throttler.server_address[1]}"
    settings = {"max_attempts": 2, "throttle_retries": 2, "throttle_base_s": 0.01}
    provider = AwsProvider(config(endpoint, **settings), CREDENTIAL)
    throttler.throttle_first = 3  # botocore's 2 attempts, then one of ours more
    assert await provider.list_instances("c1") == []
    assert throttler.requests == 4
    throttler.requests, throttler.throttle_first = 0, 100
    with pytest.raises(DriverError, match="RequestLimitExceeded") as raised:
        await provider.list_instances("c1")
    assert throttler.requests == 2 * 3  # (1 + throttle_retries) rounds of max_attempts
    assert raised.value.message.startswith("aws: cluster c1: ec2 DescribeInstances failed")
    assert_no_secret(raised.value, caplog)


def test_the_credential_is_never_printed() -> None:
    provider = AwsProvider(config("http://127.0.0.1:9"), CREDENTIAL)
    assert SECRET not in repr(CREDENTIAL)
    assert SECRET not in repr(provider) and SECRET not in repr(vars(provider))
    with pytest.raises(ValueError, match="access key id as its username"):
        AwsProvider(config("http://127.0.0.1:9"), Credential(username=None, secret=SECRET))


def test_placement_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="auto_scaling_group, a launch template"):
        AwsPlacement()
    with pytest.raises(ValueError, match="not both"):
        AwsPlacement(launch_template_id="lt-1", launch_template_name="t")
    with pytest.raises(ValueError, match="set by gpufleet/AWS"):
        AwsPlacement(auto_scaling_group="g", tags={"aws:x": "1"})
    with pytest.raises(ValueError, match="read_timeout_s must be > 0"):
        config("http://127.0.0.1:9", read_timeout_s=0)


def test_importing_the_driver_loads_no_boto3() -> None:
    # The server imports every configured driver at start; boto3 loads on the first call.
    code = (
        "import sys, gpufleet.providers.aws.driver\n"
        "assert 'boto3' not in sys.modules and 'botocore' not in sys.modules, 'loaded'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
