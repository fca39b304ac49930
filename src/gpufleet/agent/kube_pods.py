"""Kubernetes mode: the pods on this node, so a finding says what ran on the node then.

``NodePods`` lists ``GET /api/v1/pods?fieldSelector=spec.nodeName=<node>`` every
``interval_s`` with the pod's service-account token (read again before each listing: the
kubelet rotates it) and keeps the last good listing of the pods that hold GPUs and have
not ended. ``NodePods.context()`` renders it as one evidence line::

    pods on gpu-7: ml/train-0 (Job train, 8 GPUs), ml/infer-1 (Deployment infer, 1 GPU)

A listing that fails (no token, 401/403, API unreachable, a body that is not a pod list)
keeps the last good one, marked stale; each kind of failure is logged once until a
listing works again, and never with the token. Nothing here stops the agent.

httpx only (a base dependency) and the pure pod parser of the Kubernetes driver: the
agent never imports ``kubernetes_asyncio``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import logging
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from gpufleet.core.clock import Clock
from gpufleet.schedulers.kubernetes.parsing import KubePod, parse_pod

log = logging.getLogger(__name__)

REQUEST_TIMEOUT_S = 10.0  # a list of one node's pods is small; the apiserver answers in ms
MAX_NAMED = 5  # pods named on the evidence line; the rest are counted
STALE_AFTER_INTERVALS = 2  # a listing older than this many intervals shows its time
# The label a Deployment's ReplicaSet stamps on its pods (and appends to its own name).
_TEMPLATE_HASH = "pod-template-hash"


@dataclass(frozen=True, slots=True)
class PodListing:
    pods: tuple[KubePod, ...]  # not ended, holding GPUs; most GPUs first
    read_at: dt.datetime
    stale: bool = False  # the latest listing failed: this is the last good one


class PodsUnavailable(Exception):
    """One listing failed. ``kind`` groups failures for logging (once per kind)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def in_cluster_api_url(environ: Mapping[str, str]) -> str | None:
    """The API server as every pod sees it (``KUBERNETES_SERVICE_HOST``/``_PORT``), or
    None outside a pod."""
    host, port = environ.get("KUBERNETES_SERVICE_HOST"), environ.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        return None
    if ":" in host:  # an IPv6 cluster
        host = f"[{host}]"
    return f"https://{host}:{port}"


class NodePods:
    def __init__(
        self,
        *,
        node: str,
        api_url: str,
        token_file: Path,
        ca_file: Path,
        interval_s: float,
        clock: Clock,
        timeout_s: float = REQUEST_TIMEOUT_S,
    ) -> None:
        self.node = node
        self.api_url = api_url.rstrip("/")
        self.token_file = token_file
        self.ca_file = ca_file
        self.interval_s = interval_s
        self.listing: PodListing | None = None
        self._clock = clock
        self._timeout_s = timeout_s
        self._http: httpx.AsyncClient | None = None
        self._failing: set[str] = set()  # kinds logged since the last good listing
        self._bad_pods: set[str] = set()  # pods left out as unreadable, logged once each

    # -- one step (tests drive this directly) -------------------------------------------

    async def refresh(self) -> PodListing | None:
        """List the pods once. Returns the listing now kept (None before any worked)."""
        try:
            pods = await self._list()
        except PodsUnavailable as exc:
            self._failed(exc)
            if self.listing is not None and not self.listing.stale:
                self.listing = dataclasses.replace(self.listing, stale=True)
            return self.listing
        if self._failing:
            failed = ", ".join(sorted(self._failing))
            log.info("pods on %s: listed again after %s", self.node, failed)
            self._failing.clear()
        self.listing = PodListing(pods=pods, read_at=self._clock.now())
        return self.listing

    def context(self) -> str | None:
        """The evidence line for a finding opened now; None before any listing worked."""
        if self.listing is None:
            return None
        return pods_line(
            self.node,
            self.listing,
            now=self._clock.now(),
            stale_after_s=STALE_AFTER_INTERVALS * self.interval_s,
        )

    # -- loop ----------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.refresh()
            except Exception as exc:  # noqa: BLE001 - a bug here must not end the listings
                self._failed(PodsUnavailable(f"bug {type(exc).__name__}", repr(exc)), exc_info=exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.interval_s)

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    # -- internals -----------------------------------------------------------------------

    async def _list(self) -> tuple[KubePod, ...]:
        token = self._read_token()
        http = self._client()
        try:
            body = await self._get(http, token)
        except PodsUnavailable as exc:
            # Belt and braces: whatever a server or a library echoes, the token stays out.
            raise PodsUnavailable(exc.kind, str(exc).replace(token, "<token>")) from None
        pods: list[KubePod] = []
        for item in body:
            try:
                pod = parse_pod(item)
            except ValueError as exc:
                self._unreadable(item, exc)
                continue
            if pod.gpus > 0 and not pod.ended:
                pods.append(pod)
        return tuple(sorted(pods, key=lambda p: (-p.gpus, p.key)))

    async def _get(self, http: httpx.AsyncClient, token: str) -> list[Any]:
        url = f"{self.api_url}/api/v1/pods"
        try:
            response = await http.get(
                url,
                # resourceVersion=0: served from the apiserver's watch cache, not etcd; a
                # second or two behind at most, which a finding's context can afford.
                params={"fieldSelector": f"spec.nodeName={self.node}", "resourceVersion": "0"},
                headers={"Authorization": f"Bearer {token}", "Accept": "application/json"},
            )
        except httpx.HTTPError as exc:
            # Dropped, so the next listing connects afresh and reads the CA again.
            self._http = None
            await http.aclose()
            raise PodsUnavailable("unreachable", f"cannot reach {url}: {_describe(exc)}") from None
        if response.status_code != httpx.codes.OK:
            raise PodsUnavailable(
                f"http {response.status_code}",
                f"GET {url} answered {response.status_code}: {_status_message(response)}",
            )
        try:
            items = response.json()["items"]
        except (ValueError, KeyError, TypeError):
            items = None
        if not isinstance(items, list):
            raise PodsUnavailable("bad response", f"GET {url} answered no pod list")
        return items

    def _read_token(self) -> str:
        try:
            token = self.token_file.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise PodsUnavailable(
                "token", f"cannot read the service-account token {self.token_file}: {exc}"
            ) from None
        if not token:
            raise PodsUnavailable("token", f"the service-account token {self.token_file} is empty")
        return token

    def _client(self) -> httpx.AsyncClient:
        if self._http is None:
            verify: ssl.SSLContext | bool = True
            if self.api_url.startswith("https://"):
                try:
                    verify = ssl.create_default_context(cafile=str(self.ca_file))
                except OSError as exc:  # ssl.SSLError too: a file that is not PEM
                    raise PodsUnavailable(
                        "ca", f"cannot use the cluster CA {self.ca_file}: {exc}"
                    ) from None
            self._http = httpx.AsyncClient(verify=verify, timeout=self._timeout_s)
        return self._http

    def _failed(self, exc: PodsUnavailable, *, exc_info: BaseException | None = None) -> None:
        if exc.kind in self._failing:
            return
        self._failing.add(exc.kind)
        kept = (
            f"keeping the listing of {self.listing.read_at:%H:%M:%SZ}"
            if self.listing is not None
            else "no listing yet: findings carry no pod context"
        )
        log.warning(
            "pods on %s: %s (%s; logged once until a listing works)",
            self.node,
            exc,
            kept,
            exc_info=exc_info,
        )

    def _unreadable(self, item: Any, exc: ValueError) -> None:
        meta = item.get("metadata") if isinstance(item, Mapping) else None
        name = meta.get("name") if isinstance(meta, Mapping) else None
        if str(name) not in self._bad_pods:
            self._bad_pods.add(str(name))
            log.warning("pods on %s: left out: %s", self.node, exc)


def pods_line(node: str, listing: PodListing, *, now: dt.datetime, stale_after_s: float) -> str:
    """``pods on NODE: ns/name (Kind owner, N GPUs), ... and N more``, or ``pods on NODE:
    none with GPUs``. A listing older than ``stale_after_s`` says when it was read, first,
    so that a line cut to fit the evidence keeps it."""
    head = f"pods on {node}"
    if (now - listing.read_at).total_seconds() > stale_after_s:
        fmt = "%H:%M:%SZ" if listing.read_at.date() == now.date() else "%Y-%m-%dT%H:%M:%SZ"
        head += f" (as of {listing.read_at.astimezone(dt.UTC):{fmt}})"
    if not listing.pods:
        return f"{head}: none with GPUs"
    named = [describe_pod(p) for p in listing.pods[:MAX_NAMED]]
    more = len(listing.pods) - len(named)
    if more:
        named.append(f"and {more} more")
    return f"{head}: {', '.join(named)}"


def describe_pod(pod: KubePod) -> str:
    """``ns/name (Job train, 8 GPUs)``; a ReplicaSet's pod is named by its Deployment."""
    kind, owner = pod.owner_kind, pod.owner_name
    template = pod.labels.get(_TEMPLATE_HASH)
    if kind == "ReplicaSet" and owner and template and owner.endswith(f"-{template}"):
        kind, owner = "Deployment", owner.removesuffix(f"-{template}")
    parts = [" ".join(p for p in (kind, owner) if p)] if kind or owner else []
    parts.append(f"{pod.gpus} GPU" if pod.gpus == 1 else f"{pod.gpus} GPUs")
    if pod.terminating:
        parts.append("terminating")
    return f"{pod.key} ({', '.join(parts)})"


def _describe(exc: httpx.HTTPError) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _status_message(response: httpx.Response) -> str:
    """The apiserver's Status ``message`` (``pods is forbidden: User ... cannot list``)."""
    try:
        message = response.json().get("message")
    except (ValueError, AttributeError):
        message = None
    if isinstance(message, str) and message:
        return message[:300]
    return response.reason_phrase or "no reason given"
