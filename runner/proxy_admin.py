"""A small client for the proxy admin API (`tracefleet.contract.proxy_admin`): create and close sessions."""

from __future__ import annotations

from typing import Any

import httpx

from tracefleet.contract.proxy_admin import AdminPath, CreateSession, ProxySession, RegisteredSession

__all__ = ["ProxyAdmin", "ProxyAdminError", "ProxySession", "RegisteredSession"]


class ProxyAdminError(RuntimeError):
    pass


class ProxyAdmin:
    def __init__(self, base_url: str, admin_token: str, *, timeout_s: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        self._client = httpx.Client(
            base_url=self.base_url,
            headers={"Authorization": f"Bearer {admin_token}"},
            timeout=timeout_s,
        )

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._client.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise ProxyAdminError(f"proxy admin {method} {path} failed: {type(exc).__name__}: {exc}") from exc
        if response.status_code >= 400:
            raise ProxyAdminError(f"proxy admin {method} {path} -> {response.status_code}: {response.text[:500]}")
        return response.json()

    def create_session(self, session_id: str | None = None, metadata: dict[str, Any] | None = None,
                       guided_calls: int = 0) -> RegisteredSession:
        body = CreateSession(session_id=session_id or None, metadata=metadata or {}, guided_calls=guided_calls)
        return RegisteredSession.model_validate(
            self._call("POST", AdminPath.SESSIONS, json=body.model_dump(mode="json", exclude_none=True)))

    def session(self, session_id: str) -> ProxySession:
        return ProxySession.model_validate(self._call("GET", AdminPath.session(session_id)))

    def close_session(self, session_id: str) -> ProxySession:
        return ProxySession.model_validate(self._call("DELETE", AdminPath.session(session_id)))

    def close(self) -> None:
        self._client.close()
