"""The Kubernetes API calls the driver makes, through ``kubernetes_asyncio`` (imported on
the first call, never at start-up), answering plain dicts (the API's JSON) so the pure
parsers read them.

Why kubernetes_asyncio and not lightkube: it is the official client's generated API for
asyncio (every resource and subresource the driver needs, the Eviction API included,
with the same names as the Go client's docs), it loads kubeconfigs with every auth kind
(tokens, client certificates, exec plugins) and in-cluster service accounts, and it
turns every error answer into ``ApiException`` with the status and body whatever the
content type. lightkube needs an exact ``application/json`` to raise its ``ApiError``
and cannot build a kubeconfig without a user entry; both matter with real API servers
behind proxies as much as with the emulator.

Errors: an answer with an HTTP status raises ``KubeStatusError`` (status, reason and the
API's message); no answer at all (refused, DNS, TLS, timeout) raises ``DriverError``
naming the API server and what happened, never the credential.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpufleet.core.errors import DriverError
from gpufleet.schedulers.kubernetes.config import (
    KubernetesConfig,
    check_kubeconfig,
    load_kubeconfig,
)

if TYPE_CHECKING:
    from kubernetes_asyncio.client import ApiClient, CoreV1Api

MERGE_PATCH = "application/merge-patch+json"


@dataclass(frozen=True, slots=True)
class KubeStatusError(Exception):
    """The API server answered with an error status."""

    status: int
    reason: str
    message: str
    request: str

    def __str__(self) -> str:
        return f"{self.request}: {self.status} {self.reason}: {self.message}"


class KubeClient:
    """One API server, one connection pool, opened on the first call."""

    def __init__(self, config: KubernetesConfig) -> None:
        self._config = config
        self._api: CoreV1Api | None = None
        self._client: ApiClient | None = None
        self._lock = asyncio.Lock()
        self.server = (
            "the in-cluster API server"
            if config.in_cluster
            else check_kubeconfig(config.kubeconfig or "", context=config.context).server
        )

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = self._api = None

    async def _core(self) -> CoreV1Api:
        async with self._lock:
            if self._api is None:
                from kubernetes_asyncio import client, config

                configuration = client.Configuration()
                try:
                    if self._config.in_cluster:
                        config.load_incluster_config(  # type: ignore[no-untyped-call]
                            client_configuration=configuration
                        )
                    else:
                        await config.load_kube_config_from_dict(
                            load_kubeconfig(self._config.kubeconfig or ""),
                            context=self._config.context,
                            client_configuration=configuration,
                        )
                except (config.ConfigException, ValueError, OSError) as exc:
                    raise DriverError(f"kubernetes: cannot use the credentials: {exc}") from None
                self._client = client.ApiClient(configuration=configuration)
                self._api = client.CoreV1Api(self._client)
            return self._api

    async def _call(self, what: str, method: str, *args: Any, **kwargs: Any) -> Any:
        """Run one API call (a ``CoreV1Api`` method, or ``VersionApi.get_code`` for
        ``version``) and answer its JSON body."""
        from kubernetes_asyncio.client import VersionApi
        from kubernetes_asyncio.client.exceptions import ApiException

        core = await self._core()
        api: Any = VersionApi(self._client) if method == "get_code" else core
        try:
            response = await getattr(api, method)(
                *args, _preload_content=False, _request_timeout=self._config.timeout_s, **kwargs
            )
            async with response:
                body = await response.read()
                code = response.status
        except ApiException as exc:
            raise _status_error(exc, what) from None
        except TimeoutError:
            raise DriverError(
                f"kubernetes: {what}: no answer from {self.server} within "
                f"{self._config.timeout_s:.0f} s"
            ) from None
        except Exception as exc:
            # aiohttp's connection errors (refused, DNS, TLS) are OSErrors or its own.
            if isinstance(exc, OSError) or type(exc).__module__.startswith("aiohttp"):
                raise DriverError(
                    f"kubernetes: {what}: cannot reach {self.server}: {exc}"
                ) from None
            raise
        if not 200 <= code <= 299:
            raise _answer_error(code, body, what)
        try:
            return json.loads(body) if body else {}
        except ValueError:
            raise DriverError(f"kubernetes: {what}: the answer is not JSON") from None

    # ------------------------------------------------------------------ the calls

    async def version(self) -> dict[str, Any]:
        answer: dict[str, Any] = await self._call("GET /version", "get_code")
        return answer

    async def list_nodes(self) -> dict[str, Any]:
        answer: dict[str, Any] = await self._call("GET nodes", "list_node")
        return answer

    async def get_node(self, name: str) -> dict[str, Any]:
        answer: dict[str, Any] = await self._call(f"GET node {name}", "read_node", name)
        return answer

    async def list_pods(self, *, field_selector: str = "") -> dict[str, Any]:
        answer: dict[str, Any] = await self._call(
            f"GET pods ({field_selector or 'all'})",
            "list_pod_for_all_namespaces",
            field_selector=field_selector,
        )
        return answer

    async def patch_node(self, name: str, body: dict[str, Any], *, status: bool) -> dict[str, Any]:
        method = "patch_node_status" if status else "patch_node"
        what = f"PATCH node {name}{'/status' if status else ''}"
        answer: dict[str, Any] = await self._call(
            what, method, name, body, _content_type=MERGE_PATCH
        )
        return answer

    async def evict(self, namespace: str, name: str) -> None:
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
        }
        await self._call(
            f"POST pod {namespace}/{name}/eviction",
            "create_namespaced_pod_eviction",
            name,
            namespace,
            body,
        )

    async def delete_pod(self, namespace: str, name: str) -> None:
        await self._call(f"DELETE pod {namespace}/{name}", "delete_namespaced_pod", name, namespace)


def _answer_error(
    code: int, body: bytes | str | None, what: str, *, fallback: str = ""
) -> KubeStatusError:
    """An error answer as the API's ``Status`` object describes it (``fallback``: the
    HTTP reason, when the body says nothing)."""
    raw = body.encode() if isinstance(body, str) else (body or b"")
    reason, message = fallback, raw[:300].decode(errors="replace") or fallback
    try:
        status = json.loads(raw)
        reason = str(status.get("reason") or reason)
        message = str(status.get("message") or message)
    except (ValueError, AttributeError):
        pass
    return KubeStatusError(status=code, reason=reason, message=message[:500], request=what)


def _status_error(exc: Any, what: str) -> KubeStatusError:
    """The client's own ``ApiException`` (raised before any answer is read)."""
    return _answer_error(
        int(getattr(exc, "status", 0) or 0),
        getattr(exc, "body", None),
        what,
        fallback=str(getattr(exc, "reason", "") or ""),
    )
