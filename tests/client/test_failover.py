"""Several server URLs: the clients move to the next replica when one is down, stay on the
one that answers, and never take a 4xx (or a request that may have acted) elsewhere."""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError

from gpufleet.agent.settings import AgentSettings
from gpufleet.cli import config
from gpufleet.cli.errors import CliError
from gpufleet.client.agent import AgentClient, enroll
from gpufleet.client.api import ApiClient
from gpufleet.client.errors import ApiError, ServerUnreachable
from gpufleet.client.http import ServerUrls, parse_server_urls
from gpufleet.core.agent_protocol import EnrollRequest, NodeReport, ReportBatch

A, B, C = "http://a.test", "http://b.test", "http://c.test"
URLS = f"{A},{B},{C}"
Behaviour = Callable[[httpx.Request], httpx.Response]


def refuse(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("connection refused", request=request)


def cut_off(request: httpx.Request) -> httpx.Response:
    """The replica died after reading the request: it may have acted on it."""
    raise httpx.RemoteProtocolError("server disconnected without sending a response")


def status(code: int) -> Behaviour:
    return lambda _request: httpx.Response(code, json={"status": "ok"})


OK = status(200)


class Replicas:
    """A mock transport answering for each host as told, counting the calls each got."""

    def __init__(self, **by_host: Behaviour) -> None:
        self.by_host = by_host
        self.calls: Counter[str] = Counter()

    def __call__(self, request: httpx.Request) -> httpx.Response:
        host = request.url.host.removesuffix(".test")
        self.calls[host] += 1
        return self.by_host[host](request)

    def api(self, urls: str = URLS) -> ApiClient:
        return ApiClient(base_url=urls, token="t", transport=httpx.MockTransport(self))

    def agent(self, urls: str = URLS) -> AgentClient:
        http = httpx.AsyncClient(transport=httpx.MockTransport(self))
        return AgentClient(base_url=urls, node_token="n", http=http)


def test_urls_parse_from_a_comma_separated_list() -> None:
    assert parse_server_urls(" http://a:1/ , https://b:2,, ") == ["http://a:1", "https://b:2"]
    assert parse_server_urls("http://one:8080/") == ["http://one:8080"]
    for bad in ("", " , ", "a.test:8080", f"{A},{A}/"):
        with pytest.raises(ValueError, match=r"server URL|twice"):
            parse_server_urls(bad)
    urls = ServerUrls(URLS)
    assert urls.in_order() == [A, B, C]
    urls.settle(C)
    assert (urls.current, urls.in_order()) == (C, [C, A, B])


def test_api_client_fails_over_and_sticks_to_the_replica_that_answers() -> None:
    replicas = Replicas(a=refuse, b=status(503), c=OK)
    with replicas.api() as client:
        assert client.health() == "ok"
        assert client.base_url == C
        assert client.health() == "ok"
    assert replicas.calls == {"a": 1, "b": 1, "c": 2}  # the second call went to c at once


def test_a_4xx_is_an_answer_not_a_reason_to_fail_over() -> None:
    replicas = Replicas(a=status(404), b=OK, c=OK)
    with replicas.api() as client, pytest.raises(ApiError) as err:
        client.health()
    assert err.value.status == 404
    assert replicas.calls == {"a": 1}


def test_every_replica_down_names_each_one() -> None:
    replicas = Replicas(a=refuse, b=refuse, c=refuse)
    with replicas.api() as client, pytest.raises(ServerUnreachable) as err:
        client.health()
    assert all(url in str(err.value) for url in (A, B, C)), err.value
    # One URL: the message users know, naming it.
    with Replicas(a=refuse).api(A) as one, pytest.raises(ServerUnreachable) as err:
        one.health()
    assert str(err.value).startswith(f"cannot reach the gpufleet server at {A}: ")


def test_every_replica_unavailable_is_the_last_answer() -> None:
    replicas = Replicas(a=status(503), b=status(502), c=status(503))
    with replicas.api() as client, pytest.raises(ApiError) as err:
        client.health()
    assert err.value.status == 503 and replicas.calls == {"a": 1, "b": 1, "c": 1}


def test_a_post_that_may_have_acted_is_not_sent_to_another_replica() -> None:
    body = {"id": "p1", "name": "ml", "description": "", "created_at": "2026-01-01T00:00:00Z"}
    created: Behaviour = lambda _request: httpx.Response(201, json=body)  # noqa: E731
    replicas = Replicas(a=cut_off, b=created, c=created)
    with replicas.api() as client, pytest.raises(ServerUnreachable):
        client.create_project("ml")
    assert replicas.calls == {"a": 1}
    # Refused before it was sent, or a 503: safe, it goes on.
    for first in (refuse, status(503)):
        replicas = Replicas(a=first, b=created, c=created)
        with replicas.api() as client:
            assert client.create_project("ml").name == "ml"
        assert replicas.calls == {"a": 1, "b": 1}
    # A gateway timeout may come after the server acted: a POST stops there too.
    replicas = Replicas(a=status(504), b=created, c=created)
    with replicas.api() as client, pytest.raises(ApiError) as err:
        client.create_project("ml")
    assert err.value.status == 504 and replicas.calls == {"a": 1}
    # A GET is safe to repeat anywhere.
    replicas = Replicas(a=cut_off, b=status(504), c=OK)
    with replicas.api() as client:
        assert client.health() == "ok"


async def test_agent_posts_fail_over_even_when_cut_off_and_stick() -> None:
    ack = {"node_id": "n1", "accepted": 1, "duplicates": 0, "last_seq": 7, "report_interval_s": 1}
    batch = ReportBatch(reports=[NodeReport(seq=7, sampled_at=dt.datetime.now(dt.UTC), gpus=[])])
    acked: Behaviour = lambda _request: httpx.Response(200, json=ack)  # noqa: E731
    replicas = Replicas(a=cut_off, b=refuse, c=acked)
    client = replicas.agent()
    try:
        # The server drops repeats by seq, so a batch that may have landed on a can go on.
        got = await client.send_reports(batch)
        assert got.last_seq == 7 and client.server_url == C
        await client.send_reports(batch)
        assert replicas.calls == {"a": 1, "b": 1, "c": 2}
        replicas.by_host["c"] = status(401)  # a refused token is the server's word
        with pytest.raises(ApiError):
            await client.send_reports(batch)
        assert replicas.calls["a"] == 1
    finally:
        await client.aclose()


async def test_enrollment_fails_over_only_when_no_replica_took_it() -> None:
    answer = {"node_id": "n1", "node_name": "gpu-a-0", "cluster_id": "c1", "node_token": "x"}
    enrolled: Behaviour = lambda _request: httpx.Response(200, json=answer)  # noqa: E731
    request = EnrollRequest(hostname="gpu-a", boot_id="b")
    for first, reaches_b in ((refuse, True), (cut_off, False)):
        replicas = Replicas(a=first, b=enrolled, c=enrolled)
        async with httpx.AsyncClient(transport=httpx.MockTransport(replicas)) as http:
            if reaches_b:
                ack = await enroll(http, base_url=URLS, enroll_token="e", request=request)
                assert ack.node_name == "gpu-a-0"
            else:
                with pytest.raises(ServerUnreachable):
                    await enroll(http, base_url=URLS, enroll_token="e", request=request)
        assert replicas.calls["b"] == int(reaches_b)


def test_agent_setting_takes_a_list_and_checks_it(tmp_path: Path) -> None:
    settings = AgentSettings(server_url=f"{A}/, {B}", state_dir=tmp_path)
    assert settings.server_url == f"{A},{B}"
    assert AgentSettings(server_url=f"{A}/", state_dir=tmp_path).server_url == A
    with pytest.raises(ValidationError, match="not a server URL"):
        AgentSettings(server_url=f"{A},b.test", state_dir=tmp_path)


def test_cli_saved_login_serves_any_of_its_replicas(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    config.save_credentials(config.Credentials(url=f"{A}, {B}/", token="saved"))
    assert config.resolve_credentials(url=None, token=None).token == "saved"
    assert config.resolve_credentials(url=f"{B},{A}", token=None).token == "saved"
    assert config.resolve_credentials(url=B, token=None).token == "saved"
    with pytest.raises(CliError, match="no API token"):  # c is another server
        config.resolve_credentials(url=f"{A},{C}", token=None)
    with pytest.raises(CliError, match="bad server URL"):
        config.make_client(config.Credentials(url=f"{A},c.test", token="t"))
    # A login saved before lists existed works as it did.
    config.save_credentials(config.Credentials(url=f"{A}/", token="old"))
    assert config.resolve_credentials(url=A, token=None).token == "old"
    with config.make_client(config.resolve_credentials(url=None, token=None)) as client:
        assert client.base_url == A
