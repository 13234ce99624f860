"""Where `tracefleet dashboard` shows a job: its routes, and the job page's URL a driver can name (the operator
puts it in the RolloutJob's status.dashboardUrl when the chart runs the dashboard over the job's bucket)."""

from __future__ import annotations

from urllib.parse import urlencode

JOB_ROUTE = "/job"  # ?path=<the job's folder under the dashboard's URI>


def job_path(dashboard_uri: str, output_uri: str, job: str) -> str | None:
    """The job's folder as the dashboard reading `dashboard_uri` names it (its pages' `path`); None when the job's
    output (`output_uri`, the folder holding the job's own) is not under it: that dashboard does not show the job."""
    root, out = dashboard_uri.rstrip("/"), output_uri.rstrip("/")
    if not root or not (out == root or out.startswith(root + "/")):
        return None
    return "/".join(p for p in (out[len(root):].strip("/"), job) if p)


def job_page_url(base_url: str, dashboard_uri: str, output_uri: str, job: str) -> str | None:
    """The job's page on the dashboard at `base_url` that reads `dashboard_uri` (None: it does not show the job)."""
    path = job_path(dashboard_uri, output_uri, job)
    if not base_url or path is None:
        return None
    return f"{base_url.rstrip('/')}{JOB_ROUTE}?{urlencode({'path': path})}"
