"""API errors of the sandbox, shaped like the metav1.Status bodies a real kube-apiserver returns.

Both the in-process store API and the HTTP layer raise :class:`ApiError`; the HTTP layer turns it
into a response with the same code and body, so clients see what they would see on a real cluster.
"""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """A failed API call: HTTP ``code``, Kubernetes ``reason`` and a human ``message``."""

    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        *,
        name: str = "",
        group: str = "",
        kind: str = "",
        causes: list[dict[str, str]] | None = None,
        retry_after: int | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.name = name
        self.group = group
        self.kind = kind
        self.causes = causes or []
        self.retry_after = retry_after

    def status(self) -> dict[str, Any]:
        """The metav1.Status body of this error."""
        details: dict[str, Any] = {}
        if self.name:
            details["name"] = self.name
        if self.group:
            details["group"] = self.group
        if self.kind:
            details["kind"] = self.kind
        if self.causes:
            details["causes"] = self.causes
        if self.retry_after is not None:
            details["retryAfterSeconds"] = self.retry_after
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if details:
            body["details"] = details
        return body


def _gr(plural: str, group: str) -> str:
    return f"{plural}.{group}" if group else plural


def not_found(plural: str, group: str, name: str) -> ApiError:
    return ApiError(
        404, "NotFound", f'{_gr(plural, group)} "{name}" not found',
        name=name, group=group, kind=plural,
    )


def already_exists(plural: str, group: str, name: str) -> ApiError:
    return ApiError(
        409, "AlreadyExists", f'{_gr(plural, group)} "{name}" already exists',
        name=name, group=group, kind=plural,
    )


def conflict(plural: str, group: str, name: str, why: str | None = None) -> ApiError:
    why = why or (
        "the object has been modified; please apply your changes to the latest version "
        "and try again"
    )
    return ApiError(
        409, "Conflict", f'Operation cannot be fulfilled on {_gr(plural, group)} "{name}": {why}',
        name=name, group=group, kind=plural,
    )


def invalid(kind: str, group: str, name: str, field: str, detail: str) -> ApiError:
    return ApiError(
        422, "Invalid", f'{kind}.{group or "core"} "{name}" is invalid: {field}: {detail}',
        name=name, group=group, kind=kind,
        causes=[{"reason": "FieldValueInvalid", "message": detail, "field": field}],
    )


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def too_large_resource_version(wanted: int, current: int) -> ApiError:
    """The apiserver's answer to a read at a resourceVersion its watch cache has not
    reached within 3 s (``storage.NewTooLargeResourceVersionError``): 504 Timeout, cause
    ResourceVersionTooLarge, retry after 1 s (``errors.NewTimeoutError`` prefixes the
    message with "Timeout: ")."""
    return ApiError(
        504, "Timeout", f"Timeout: Too large resource version: {wanted}, current: {current}",
        causes=[{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
        retry_after=1,
    )


def gone(message: str) -> ApiError:
    return ApiError(410, "Expired", message)
