"""``/metrics`` of ``muster run`` behind authentication and authorization, as
controller-runtime's secure metrics serve it (``filters.WithAuthenticationAndAuthorization``):

- HTTPS, with ``tls.crt``/``tls.key`` from ``server.metrics_cert_dir`` (cert-manager, a
  Secret) or else a self-signed certificate made at start-up, as controller-runtime does;
- the scraper's bearer token is checked with a TokenReview (401 without one, or when the API
  server does not authenticate it);
- the user it names must be allowed ``get`` on the non-resource URL ``/metrics`` by a
  SubjectAccessReview (403 otherwise): RBAC's ``nonResourceURLs: [/metrics]``, the ClusterRole
  ``muster-metrics-reader`` (config/rbac) bound to Prometheus' ServiceAccount.

Muster's own ServiceAccount needs ``create`` on tokenreviews and subjectaccessreviews
(``muster-metrics-auth``). Answers are cached as k8s.io/apiserver's delegating
authenticator and authorizer cache them: a token's identity for a minute, an allowed
decision for five minutes, a denied one for 30 seconds; API errors are not cached (500).
"""

from __future__ import annotations

import datetime
import hashlib
import ipaddress
import logging
import socket
import ssl
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from controller.kube import ApiError, KubeClient
from controller.kube.resources import SUBJECT_ACCESS_REVIEWS, TOKEN_REVIEWS

log = logging.getLogger("muster.metrics")

AUTHN_TTL = 60.0
ALLOW_TTL = 300.0
DENY_TTL = 30.0


class MetricsAuth:
    """TokenReview + SubjectAccessReview for each scrape, cached per token."""

    def __init__(self, kube: KubeClient, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.kube = kube
        self.clock = clock
        self._users: dict[str, tuple[float, dict[str, Any] | None]] = {}
        self._decisions: dict[tuple[str, str, str], tuple[float, bool]] = {}

    async def check(self, request: web.Request) -> web.Response | None:
        """None when the request may proceed, else the 401/403/500 answer."""
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return web.Response(status=401, text="Unauthorized: a bearer token is required\n")
        try:
            user = await self._authenticate(token.strip())
            if user is None:
                return web.Response(status=401, text="Unauthorized\n")
            if not await self._authorize(user, verb="get", path=request.path):
                name = user.get("username", "?")
                return web.Response(
                    status=403, text=f'Forbidden: user "{name}" may not get {request.path}\n')
        except ApiError as exc:
            log.warning("metrics: cannot check the scraper's token: %s", exc)
            return web.Response(status=500, text="Internal Server Error\n")
        return None

    async def _authenticate(self, token: str) -> dict[str, Any] | None:
        key = hashlib.sha256(token.encode()).hexdigest()
        now = self.clock()
        cached = self._users.get(key)
        if cached is not None and cached[0] > now:
            return cached[1]
        review = await self.kube.create(TOKEN_REVIEWS, {
            "apiVersion": TOKEN_REVIEWS.api_version, "kind": TOKEN_REVIEWS.kind,
            "spec": {"token": token},
        })
        status = review.get("status") or {}
        user = dict(status.get("user") or {}) if status.get("authenticated") else None
        self._users[key] = (now + AUTHN_TTL, user)
        return user

    async def _authorize(self, user: dict[str, Any], *, verb: str, path: str) -> bool:
        key = (str(user.get("uid") or user.get("username")), verb, path)
        now = self.clock()
        cached = self._decisions.get(key)
        if cached is not None and cached[0] > now:
            return cached[1]
        spec: dict[str, Any] = {
            "user": user.get("username", ""),
            "groups": list(user.get("groups") or []),
            "nonResourceAttributes": {"path": path, "verb": verb},
        }
        if user.get("uid"):
            spec["uid"] = user["uid"]
        if user.get("extra"):
            spec["extra"] = user["extra"]
        review = await self.kube.create(SUBJECT_ACCESS_REVIEWS, {
            "apiVersion": SUBJECT_ACCESS_REVIEWS.api_version, "kind": SUBJECT_ACCESS_REVIEWS.kind,
            "spec": spec,
        })
        allowed = bool((review.get("status") or {}).get("allowed"))
        self._decisions[key] = (now + (ALLOW_TTL if allowed else DENY_TTL), allowed)
        return allowed


def server_tls(cert_dir: Path | None, scratch: Path) -> ssl.SSLContext:
    """The HTTPS context of /metrics: ``cert_dir``'s ``tls.crt``/``tls.key`` if given, else
    a self-signed certificate written under ``scratch`` (a temporary directory)."""
    if cert_dir is not None:
        cert, key = cert_dir / "tls.crt", cert_dir / "tls.key"
    else:
        cert, key = self_signed(scratch)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    return context


def self_signed(directory: Path) -> tuple[Path, Path]:
    """An ECDSA P-256 certificate for this host (a year), as controller-runtime makes one
    when no certificate is given; Prometheus scrapes it with ``insecure_skip_verify``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    host = socket.gethostname()
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"muster-metrics@{host}")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=365))
        .add_extension(x509.SubjectAlternativeName([
            x509.DNSName(host), x509.DNSName("localhost"),
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        ]), critical=False)
        .sign(key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = directory / "tls.crt", directory / "tls.key"
    key_path.touch(mode=0o600)
    key_path.write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return cert_path, key_path
