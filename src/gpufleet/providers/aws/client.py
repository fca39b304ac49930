"""The only I/O of the AWS driver: boto3 calls to EC2 and EC2 Auto Scaling.

boto3 is imported when the first call is made, so importing the driver (the server does,
for every configured provider) does not load it. Each call runs in a worker thread
(``asyncio.to_thread``: boto3 blocks), with botocore's timeouts and "standard" retries,
our own bounded backoff for throttling, and one hard deadline. Every failure becomes an
``AwsError`` (a ``DriverError``) naming the driver, what it was about, the API call and
AWS's error code; the secret access key never appears in it.
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Mapping
from typing import Any

from gpufleet.core.errors import DriverError, OutOfCapacity
from gpufleet.providers.aws.config import AwsConfig
from gpufleet.providers.base import Credential

THROTTLE_CODES = frozenset(
    {
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestLimitExceeded",
        "RequestThrottled",
        "RequestThrottledException",
        "TooManyRequestsException",
        "SlowDown",
    }
)
AUTH_CODES = frozenset(
    {
        "AuthFailure",
        "InvalidClientTokenId",
        "SignatureDoesNotMatch",
        "UnrecognizedClientException",
        "ExpiredToken",
        "ExpiredTokenException",
        "UnauthorizedOperation",
        "AccessDenied",
        "AccessDeniedException",
    }
)
_MESSAGE_LIMIT = 500  # characters of AWS's own message kept in an error


class AwsError(DriverError):
    """An AWS call failed. ``aws_code`` is AWS's error code (``InvalidInstanceID.NotFound``,
    ``AuthFailure``...), or None when no answer came (unreachable, timed out)."""

    def __init__(self, message: str, *, aws_code: str | None) -> None:
        super().__init__(message)
        self.aws_code = aws_code


# AWS's words for "no machine of that kind now": a stockout in the zone, or an account
# limit. Not the request's fault; Cluster Autoscaler backs off the group on them.
CAPACITY_CODES = frozenset(
    {
        "InsufficientInstanceCapacity",
        "InsufficientHostCapacity",
        "InsufficientReservedInstanceCapacity",
        "InsufficientCapacity",
        "InstanceLimitExceeded",
        "VcpuLimitExceeded",
        "MaxSpotInstanceCountExceeded",
        "SpotMaxPriceTooLow",
        "ReservationCapacityExceeded",
    }
)


class AwsCapacityError(AwsError, OutOfCapacity):
    """An AWS call refused for capacity or quota (``CAPACITY_CODES``)."""


def aws_error(message: str, *, aws_code: str | None) -> AwsError:
    """The error for an AWS refusal: one of capacity (``OutOfCapacity``) or any other."""
    if aws_code in CAPACITY_CODES:
        return AwsCapacityError(message, aws_code=aws_code)
    return AwsError(message, aws_code=aws_code)


def api_name(operation: str) -> str:
    """``run_instances`` → ``RunInstances``, the name AWS's docs and IAM use."""
    return "".join(part.capitalize() for part in operation.split("_"))


class AwsClient:
    """EC2 and Auto Scaling clients for one account and region."""

    def __init__(self, config: AwsConfig, credential: Credential | None) -> None:
        if credential is not None and not credential.username:
            raise ValueError("an AWS credential needs the access key id as its username")
        self._config = config
        self._credential = credential
        self._clients: dict[str, Any] = {}
        self._lock = threading.Lock()  # boto3 clients are thread-safe; building them is not

    def _redact(self, text: str) -> str:
        secret = self._credential.secret if self._credential is not None else ""
        return text.replace(secret, "***") if secret else text

    def _client(self, service: str) -> Any:
        with self._lock:
            client = self._clients.get(service)
            if client is None:
                client = self._build(service)
                self._clients[service] = client
            return client

    def _build(self, service: str) -> Any:
        import boto3  # type: ignore[import-untyped]  # lazily: see the module docstring
        from botocore.config import Config  # type: ignore[import-untyped]

        cfg = self._config
        keys: dict[str, str] = {}
        if self._credential is not None:
            keys = {
                "aws_access_key_id": self._credential.username or "",
                "aws_secret_access_key": self._credential.secret,
            }
        # A session of our own: boto3's default session is shared, not thread-safe, and
        # would read AWS_PROFILE from the environment over the keys we were given.
        session = boto3.session.Session(region_name=cfg.region, **keys)
        return session.client(
            service,
            endpoint_url=cfg.endpoint_url,
            config=Config(
                connect_timeout=cfg.connect_timeout_s,
                read_timeout=cfg.read_timeout_s,
                retries={"mode": "standard", "total_max_attempts": cfg.max_attempts},
                user_agent_extra="gpufleet",
            ),
        )

    def _endpoint(self, service: str) -> str:
        return self._config.endpoint_url or f"{service}.{self._config.region}.amazonaws.com"

    def _call_sync(
        self, service: str, operation: str, about: str, params: Mapping[str, Any]
    ) -> dict[str, Any]:
        from botocore import exceptions as bx  # type: ignore[import-untyped]

        where = f"aws: {about}: {service} {api_name(operation)}"
        try:
            client = self._client(service)
        except ValueError as exc:  # boto3's check of the settings: a malformed endpoint URL
            raise AwsError(self._redact(f"{where}: bad settings: {exc}"), aws_code=None) from None
        try:
            answer: dict[str, Any] = getattr(client, operation)(**params)
        except bx.ClientError as exc:
            error = exc.response.get("Error", {})
            code = str(error.get("Code") or "Unknown")
            text = str(error.get("Message") or "")[:_MESSAGE_LIMIT]
            hint = " (credentials refused or not allowed)" if code in AUTH_CODES else ""
            raise aws_error(
                self._redact(f"{where} failed: {code}: {text}{hint}"), aws_code=code
            ) from None
        except (bx.ConnectTimeoutError, bx.ReadTimeoutError) as exc:
            raise AwsError(
                self._redact(
                    f"{where}: {self._endpoint(service)} did not answer "
                    f"(connect timeout {self._config.connect_timeout_s:g} s, read timeout "
                    f"{self._config.read_timeout_s:g} s, {self._config.max_attempts} "
                    f"attempts): {type(exc).__name__}"
                ),
                aws_code=None,
            ) from None
        except bx.EndpointConnectionError:
            raise AwsError(
                self._redact(f"{where}: cannot connect to {self._endpoint(service)}"),
                aws_code=None,
            ) from None
        except bx.NoCredentialsError:
            raise AwsError(
                f"{where}: no AWS credentials (give the provider an access key, or run with "
                "an instance profile)",
                aws_code=None,
            ) from None
        except bx.BotoCoreError as exc:
            # ResponseParserError (an answer that is not AWS's: a proxy, or moto's 500 for
            # an action it lacks), ConnectionClosedError... str() holds no credential.
            raise AwsError(
                self._redact(f"{where} failed: {type(exc).__name__}: {exc}"[:_MESSAGE_LIMIT]),
                aws_code=None,
            ) from None
        return answer

    async def call(
        self, service: str, operation: str, *, about: str, **params: Any
    ) -> dict[str, Any]:
        """Make one AWS API call and return its answer.

        Args:
            service: ``"ec2"`` or ``"autoscaling"``.
            operation: the boto3 method, e.g. ``"describe_instances"``.
            about: what the call is about, for messages: ``"instance i-0ab (node gpu-3)"``.
            params: the call's parameters, as boto3 takes them.

        Raises:
            AwsError: AWS refused (its code is ``aws_code``), the endpoint was unreachable
                or silent past the timeouts, throttling outlasted our retries, or the
                whole call passed ``call_timeout_s``.
        """
        cfg = self._config
        try:
            async with asyncio.timeout(cfg.call_timeout_s):
                for attempt in range(cfg.throttle_retries + 1):
                    try:
                        return await asyncio.to_thread(
                            self._call_sync, service, operation, about, params
                        )
                    except AwsError as exc:
                        if exc.aws_code not in THROTTLE_CODES or attempt == cfg.throttle_retries:
                            raise
                    ceiling = min(cfg.throttle_cap_s, cfg.throttle_base_s * 2**attempt)
                    await asyncio.sleep(random.uniform(0, ceiling))  # noqa: S311 (jitter)
        except TimeoutError:
            raise AwsError(
                f"aws: {about}: {service} {api_name(operation)}: no answer within "
                f"{cfg.call_timeout_s:g} s (call_timeout_s)",
                aws_code=None,
            ) from None
        raise AssertionError("unreachable: the loop returns or raises")  # pragma: no cover
