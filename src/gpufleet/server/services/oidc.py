"""The OpenID Connect relying party: discovery, JWKS, ID token verification, code exchange.

All talk with the IdP is here (httpx, a fresh client per exchange: logins are rare), and
none of it happens inside a store transaction. ID tokens are verified with joserfc: the
``alg`` must be on the allowlist (asymmetric only, never ``none`` or HS*), the key comes
from the IdP's JWKS by ``kid`` (an unknown ``kid`` refetches the JWKS once, rate-limited:
that is how key rotation is followed), then iss, aud/azp, exp/iat/nbf (with leeway) and
the nonce are checked here, each with its own message. Nothing here logs a token, a code
or a secret.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import hashlib
import hmac
import json
import logging
import secrets
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

import httpx
from joserfc import jws
from joserfc.errors import JoseError
from joserfc.jwk import Key, KeySet

from gpufleet.core.clock import Clock
from gpufleet.core.errors import Unauthorized, Unavailable
from gpufleet.server.settings import ServerSettings

log = logging.getLogger(__name__)

DEVICE_CODE_GRANT = "urn:ietf:params:oauth:grant-type:device_code"
HTTP_TIMEOUT_S = 10.0
MAX_RESPONSE_BYTES = 1_048_576


@dataclass(frozen=True)
class OidcConfig:
    """What the relying party needs from the settings, resolved once."""

    issuer: str
    client_id: str
    client_secret: str | None
    cli_client_id: str
    redirect_url: str
    scopes: str
    groups_claim: str
    allowed_algs: tuple[str, ...]
    leeway_s: float
    metadata_ttl_s: float
    jwks_refetch_min_s: float

    @classmethod
    def from_settings(cls, settings: ServerSettings) -> OidcConfig | None:
        """None when OIDC is not configured (no issuer or no client id)."""
        if not settings.oidc_issuer or not settings.oidc_client_id:
            return None
        secret = None
        if settings.oidc_client_secret_file is not None:
            try:
                secret = settings.oidc_client_secret_file.read_text(encoding="utf-8").strip()
            except OSError as exc:
                raise Unavailable(
                    f"cannot read GPUFLEET_OIDC_CLIENT_SECRET_FILE "
                    f"{settings.oidc_client_secret_file}: {exc.strerror}"
                ) from exc
        return cls(
            issuer=settings.oidc_issuer,
            client_id=settings.oidc_client_id,
            client_secret=secret or None,
            cli_client_id=settings.oidc_cli_client_id or settings.oidc_client_id,
            redirect_url=settings.oidc_redirect_url
            or f"{settings.resolved_public_url()}/api/v1/auth/callback",
            scopes=settings.oidc_scopes,
            groups_claim=settings.oidc_groups_claim,
            allowed_algs=tuple(settings.oidc_allowed_algs),
            leeway_s=settings.oidc_leeway_s,
            metadata_ttl_s=settings.oidc_metadata_ttl_s,
            jwks_refetch_min_s=settings.oidc_jwks_refetch_min_s,
        )


@dataclass(frozen=True)
class ProviderMetadata:
    """The parts of the IdP's discovery document gpufleet uses."""

    issuer: str
    authorization_endpoint: str
    token_endpoint: str
    jwks_uri: str
    device_authorization_endpoint: str | None
    token_endpoint_auth_methods: tuple[str, ...]


@dataclass(frozen=True)
class IdTokenClaims:
    """A verified ID token's claims that gpufleet acts on."""

    issuer: str
    subject: str
    expires_at: dt.datetime
    issued_at: dt.datetime
    email: str | None
    name: str | None
    preferred_username: str | None
    groups: tuple[str, ...]


def new_code_verifier() -> str:
    """A PKCE verifier: 43 characters from 256 random bits (RFC 7636 §4.1)."""
    return secrets.token_urlsafe(32)


def code_challenge(verifier: str) -> str:
    """The S256 challenge of a verifier (RFC 7636 §4.2)."""
    digest = hashlib.sha256(verifier.encode("ascii")).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def _refuse(reason: str) -> Unauthorized:
    return Unauthorized(f"ID token refused: {reason}", field="id_token")


def _number(claims: dict[str, Any], name: str, *, required: bool) -> float | None:
    value = claims.get(name)
    if value is None:
        if required:
            raise _refuse(f"no {name!r} claim")
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _refuse(f"{name!r} is not a number")
    return float(value)


def _optional_str(claims: dict[str, Any], name: str) -> str | None:
    value = claims.get(name)
    return value if isinstance(value, str) and value else None


class OidcRelyingParty:
    """gpufleet as an OIDC client of one issuer; holds the discovery and JWKS caches."""

    def __init__(
        self,
        config: OidcConfig,
        *,
        clock: Clock,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.config = config
        self._clock = clock
        self._transport = transport
        self._lock = asyncio.Lock()
        self._metadata: ProviderMetadata | None = None
        self._metadata_at: dt.datetime | None = None
        self._keys: dict[str | None, Key] = {}
        self._jwks_at: dt.datetime | None = None

    # -- talking to the IdP ---------------------------------------------------------
    def _http(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            timeout=HTTP_TIMEOUT_S,
            transport=self._transport,
            headers={"User-Agent": "gpufleet-server", "Accept": "application/json"},
        )

    async def _get_json(self, url: str, *, what: str) -> dict[str, Any]:
        try:
            async with self._http() as client:
                response = await client.get(url)
        except httpx.HTTPError as exc:
            raise Unavailable(
                f"cannot reach the identity provider's {what} at {url}: {exc}"
            ) from exc
        if response.status_code != httpx.codes.OK:
            raise Unavailable(
                f"the identity provider's {what} at {url} answered HTTP {response.status_code}"
            )
        return self._json_object(response, what=what, url=url)

    @staticmethod
    def _json_object(response: httpx.Response, *, what: str, url: str) -> dict[str, Any]:
        if len(response.content) > MAX_RESPONSE_BYTES:
            raise Unavailable(f"the identity provider's {what} at {url} is too large")
        try:
            body = response.json()
        except ValueError as exc:
            raise Unavailable(f"the identity provider's {what} at {url} is not JSON") from exc
        if not isinstance(body, dict):
            raise Unavailable(f"the identity provider's {what} at {url} is not a JSON object")
        return body

    def _fresh(self, fetched_at: dt.datetime | None) -> bool:
        if fetched_at is None:
            return False
        age = (self._clock.now() - fetched_at).total_seconds()
        return 0 <= age < self.config.metadata_ttl_s

    async def metadata(self) -> ProviderMetadata:
        """The IdP's discovery document, cached for ``metadata_ttl_s``."""
        if self._metadata is not None and self._fresh(self._metadata_at):
            return self._metadata
        async with self._lock:
            if self._metadata is not None and self._fresh(self._metadata_at):
                return self._metadata
            url = self.config.issuer.rstrip("/") + "/.well-known/openid-configuration"
            doc = await self._get_json(url, what="discovery document")
            if doc.get("issuer") != self.config.issuer:
                # OIDC Discovery §4.3: the document must name exactly the issuer asked for.
                raise Unavailable(
                    f"discovery at {url} names issuer {doc.get('issuer')!r}, not "
                    f"{self.config.issuer!r}: set GPUFLEET_OIDC_ISSUER to the exact issuer"
                )
            try:
                metadata = ProviderMetadata(
                    issuer=doc["issuer"],
                    authorization_endpoint=str(doc["authorization_endpoint"]),
                    token_endpoint=str(doc["token_endpoint"]),
                    jwks_uri=str(doc["jwks_uri"]),
                    device_authorization_endpoint=(
                        str(doc["device_authorization_endpoint"])
                        if doc.get("device_authorization_endpoint")
                        else None
                    ),
                    token_endpoint_auth_methods=tuple(
                        str(m) for m in doc.get("token_endpoint_auth_methods_supported") or ()
                    ),
                )
            except KeyError as exc:
                raise Unavailable(f"discovery at {url} lacks {exc.args[0]!r}") from exc
            self._metadata, self._metadata_at = metadata, self._clock.now()
            return metadata

    async def _refresh_jwks(self, metadata: ProviderMetadata) -> None:
        doc = await self._get_json(metadata.jwks_uri, what="JWKS")
        raw_keys = doc.get("keys")
        if not isinstance(raw_keys, list):
            raise Unavailable(f"the JWKS at {metadata.jwks_uri} has no 'keys' list")
        signing = [k for k in raw_keys if isinstance(k, dict) and k.get("use", "sig") == "sig"]
        try:
            keyset = KeySet.import_key_set({"keys": signing})
        except JoseError as exc:
            raise Unavailable(f"the JWKS at {metadata.jwks_uri} has no usable key: {exc}") from exc
        self._keys = {key.kid: key for key in keyset.keys}
        self._jwks_at = self._clock.now()
        log.info("oidc: fetched the JWKS from %s (%d keys)", metadata.jwks_uri, len(self._keys))

    async def _key_for(self, kid: str | None) -> Key:
        """The IdP's key with this ``kid``; an unknown ``kid`` refetches the JWKS once."""
        metadata = await self.metadata()
        async with self._lock:
            if not self._fresh(self._jwks_at):
                await self._refresh_jwks(metadata)
            key = self._lookup(kid)
            if key is None and self._jwks_at is not None:
                since = (self._clock.now() - self._jwks_at).total_seconds()
                if since >= self.config.jwks_refetch_min_s:
                    # The IdP may have rotated its keys since we last looked.
                    await self._refresh_jwks(metadata)
                    key = self._lookup(kid)
        if key is None:
            raise _refuse(f"signed with a key the issuer does not publish (kid {kid!r})")
        return key

    def _lookup(self, kid: str | None) -> Key | None:
        if kid is None:
            return next(iter(self._keys.values())) if len(self._keys) == 1 else None
        return self._keys.get(kid)

    # -- verification ---------------------------------------------------------------
    async def verify_id_token(
        self,
        token: str,
        *,
        audience: str,
        nonce: str | None,
        max_age_s: float | None = None,
    ) -> IdTokenClaims:
        """Verify an ID token from this issuer for ``audience``, or raise ``Unauthorized``.

        ``nonce``: the one sent with the authorization request (None for the device
        grant, which has none). ``max_age_s``: refuse tokens issued longer ago.
        """
        try:
            unverified = jws.extract_compact(token.encode("ascii"))
        except (JoseError, UnicodeEncodeError, ValueError) as exc:
            raise _refuse("not a signed JWT (JWS compact serialization)") from exc
        header = unverified.headers()
        alg = header.get("alg")
        if not isinstance(alg, str) or alg not in self.config.allowed_algs:
            raise _refuse(
                f"alg {alg!r} is not accepted (accepted: {', '.join(self.config.allowed_algs)})"
            )
        kid = header.get("kid")
        if kid is not None and not isinstance(kid, str):
            raise _refuse("kid is not a string")
        key = await self._key_for(kid)
        if key.alg is not None and key.alg != alg:
            raise _refuse(f"alg {alg!r} does not match the key's alg {key.alg!r}")
        try:
            verified = jws.deserialize_compact(token, key, algorithms=[alg])
        except JoseError as exc:
            raise _refuse(f"bad signature ({exc.__class__.__name__})") from exc
        try:
            claims = json.loads(verified.payload)
        except ValueError as exc:
            raise _refuse("payload is not JSON") from exc
        if not isinstance(claims, dict):
            raise _refuse("payload is not a JSON object")
        return self._check_claims(claims, audience=audience, nonce=nonce, max_age_s=max_age_s)

    def _check_claims(
        self,
        claims: dict[str, Any],
        *,
        audience: str,
        nonce: str | None,
        max_age_s: float | None,
    ) -> IdTokenClaims:
        if claims.get("iss") != self.config.issuer:
            raise _refuse(f"issuer {claims.get('iss')!r} is not {self.config.issuer!r}")
        aud = claims.get("aud")
        audiences = [aud] if isinstance(aud, str) else aud if isinstance(aud, list) else []
        if audience not in audiences:
            raise _refuse(f"audience {aud!r} does not include {audience!r}")
        azp = claims.get("azp")
        if (len(audiences) > 1 or azp is not None) and azp != audience:
            # OIDC Core §3.1.3.7: with several audiences the token must be for us (azp).
            raise _refuse(f"authorized party {azp!r} is not {audience!r}")
        now = self._clock.now().timestamp()
        leeway = self.config.leeway_s
        exp = _number(claims, "exp", required=True)
        iat = _number(claims, "iat", required=True)
        nbf = _number(claims, "nbf", required=False)
        assert exp is not None and iat is not None
        if now > exp + leeway:
            raise _refuse(f"expired {int(now - exp)} s ago")
        if iat > now + leeway:
            raise _refuse("issued in the future (check the clocks)")
        if nbf is not None and nbf > now + leeway:
            raise _refuse("not valid yet (nbf)")
        if max_age_s is not None and now - iat > max_age_s + leeway:
            raise _refuse(f"issued {int(now - iat)} s ago; get a fresh one")
        if nonce is not None:
            got = claims.get("nonce")
            if not isinstance(got, str) or not hmac.compare_digest(got.encode(), nonce.encode()):
                raise _refuse("nonce does not match this login")
        sub = claims.get("sub")
        if not isinstance(sub, str) or not sub:
            raise _refuse("no 'sub' claim")
        raw_groups = claims.get(self.config.groups_claim)
        groups: tuple[str, ...] = ()
        if isinstance(raw_groups, list):
            groups = tuple(g for g in raw_groups if isinstance(g, str))
        elif isinstance(raw_groups, str):  # some IdPs send a single group as a string
            groups = (raw_groups,)
        return IdTokenClaims(
            issuer=self.config.issuer,
            subject=sub,
            expires_at=dt.datetime.fromtimestamp(exp, dt.UTC),
            issued_at=dt.datetime.fromtimestamp(iat, dt.UTC),
            email=_optional_str(claims, "email"),
            name=_optional_str(claims, "name"),
            preferred_username=_optional_str(claims, "preferred_username"),
            groups=groups,
        )

    # -- the authorization-code flow -----------------------------------------------
    async def authorization_url(self, *, state: str, nonce: str, verifier: str) -> str:
        """Where to send the browser: the IdP's login with state, nonce and PKCE S256."""
        metadata = await self.metadata()
        query = urlencode(
            {
                "response_type": "code",
                "client_id": self.config.client_id,
                "redirect_uri": self.config.redirect_url,
                "scope": self.config.scopes,
                "state": state,
                "nonce": nonce,
                "code_challenge": code_challenge(verifier),
                "code_challenge_method": "S256",
            }
        )
        separator = "&" if "?" in metadata.authorization_endpoint else "?"
        return f"{metadata.authorization_endpoint}{separator}{query}"

    async def exchange_code(self, code: str, *, verifier: str) -> str:
        """Trade an authorization code (and the PKCE verifier) for the ID token."""
        metadata = await self.metadata()
        form = {
            "grant_type": "authorization_code",
            "code": code,
            "redirect_uri": self.config.redirect_url,
            "code_verifier": verifier,
        }
        headers: dict[str, str] = {}
        secret = self.config.client_secret
        methods = metadata.token_endpoint_auth_methods
        if secret is None:
            form["client_id"] = self.config.client_id
        elif not methods or "client_secret_basic" in methods:
            # RFC 6749 §2.3.1: id and secret are form-encoded before going into Basic.
            user, password = quote(self.config.client_id, safe=""), quote(secret, safe="")
            basic = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
            headers["Authorization"] = f"Basic {basic}"
        else:
            form["client_id"], form["client_secret"] = self.config.client_id, secret
        try:
            async with self._http() as client:
                response = await client.post(metadata.token_endpoint, data=form, headers=headers)
        except httpx.HTTPError as exc:
            raise Unavailable(
                f"cannot reach the identity provider's token endpoint "
                f"{metadata.token_endpoint}: {exc}"
            ) from exc
        body = self._json_object(response, what="token response", url=metadata.token_endpoint)
        if response.status_code != httpx.codes.OK:
            error = body.get("error", f"HTTP {response.status_code}")
            detail = body.get("error_description")
            raise Unauthorized(
                f"the identity provider refused the authorization code: {error}"
                + (f" ({detail})" if isinstance(detail, str) else ""),
                field="code",
            )
        id_token = body.get("id_token")
        if not isinstance(id_token, str):
            raise Unauthorized(
                "the identity provider returned no ID token; is 'openid' in GPUFLEET_OIDC_SCOPES?",
                field="code",
            )
        return id_token
