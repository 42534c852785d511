"""Compute Engine over real HTTP on 127.0.0.1 for the cloud tier: the project's Compute REST
fake (``tests/providers/gcp_fake.py``, which speaks the wire format google-cloud-compute's
REST transport uses), reporting physical host topology, plus the OAuth token endpoint a
Muster process needs to get a bearer token without Google's servers.

Muster is pointed at it with ``MUSTER_GCP_API_ENDPOINT`` (``client_options.api_endpoint``)
and ``GOOGLE_APPLICATION_CREDENTIALS`` naming a service account key (generated, with a
``token_uri`` on this endpoint; an ``authorized_user`` file cannot redirect its token
endpoint): the provider's ordinary Application Default Credentials path, with no test hook in
the provider.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from tests.providers.gcp_fake import FakeCompute, serve

TOKEN_PATH = "/token"


@dataclass
class TierCompute(FakeCompute):
    """The Compute fake with host topology on, answering OAuth token refreshes."""

    host_topology: bool = True

    def handle(self, method: str, url: str, body: Any) -> tuple[int, Any]:
        if urlsplit(url).path == TOKEN_PATH:
            return 200, {"access_token": "cloud-tier", "token_type": "Bearer", "expires_in": 3600}
        return super().handle(method, url, body)


def credentials_file(endpoint: str, path: Path) -> Path:
    """ADC for a process talking to ``endpoint``: a service account key of its own, whose
    token requests go there."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    path.write_text(
        json.dumps(
            {
                "type": "service_account",
                "project_id": "muster-cloud",
                "private_key_id": "cloud-tier",
                "private_key": pem,
                "client_email": "muster@muster-cloud.iam.gserviceaccount.com",
                "client_id": "1",
                "token_uri": endpoint + TOKEN_PATH,
            }
        )
    )
    path.chmod(0o600)
    return path


@contextlib.contextmanager
def compute_endpoint() -> Iterator[tuple[str, TierCompute]]:
    """Yields (endpoint URL, the fake behind it)."""
    compute = TierCompute()
    with serve(compute) as url:
        yield url, compute


def gcp_env(endpoint: str, credentials: Path) -> dict[str, str]:
    """Environment of a Muster process using the GCP provider against ``endpoint``."""
    return {
        "MUSTER_GCP_API_ENDPOINT": endpoint,
        "GOOGLE_APPLICATION_CREDENTIALS": str(credentials),
        "GOOGLE_CLOUD_PROJECT": "muster-cloud",
    }
