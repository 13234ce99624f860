"""A small client for the proxy admin API (the contract in the brief): create and close sessions."""

from __future__ import annotations

from typing import Any

import httpx
from pydantic import BaseModel


class ProxyAdminError(RuntimeError):
    pass


class RegisteredSession(BaseModel):
    session_id: str
    secret: str
    base_path: str


class SessionInfo(BaseModel):
    session_id: str
    calls: int = 0
    errors: int = 0
    abandoned: int = 0  # calls cut off in flight (harness gone, or still running when the session closed)
    capture_path: str | None = None
    active: bool = False


class ProxyAdmin:
    def __init__(self, base_url: str, admin_token: str, *, timeout_s: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        self._client = httpx.Client(
            base_url=self.base_url,
            headers={"Authorization": f"Bearer {admin_token}"},
            timeout=timeout_s,
        )

    def _call(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        try:
            response = self._client.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise ProxyAdminError(f"proxy admin {method} {path} failed: {type(exc).__name__}: {exc}") from exc
        if response.status_code >= 400:
            raise ProxyAdminError(f"proxy admin {method} {path} -> {response.status_code}: {response.text[:500]}")
        return response.json()

    def create_session(self, session_id: str | None = None, metadata: dict[str, Any] | None = None) -> RegisteredSession:
        body: dict[str, Any] = {"metadata": metadata or {}}
        if session_id:
            body["session_id"] = session_id
        return RegisteredSession.model_validate(self._call("POST", "/admin/sessions", json=body))

    def session(self, session_id: str) -> SessionInfo:
        return SessionInfo.model_validate(self._call("GET", f"/admin/sessions/{session_id}"))

    def close_session(self, session_id: str) -> SessionInfo:
        return SessionInfo.model_validate(self._call("DELETE", f"/admin/sessions/{session_id}"))

    def close(self) -> None:
        self._client.close()
