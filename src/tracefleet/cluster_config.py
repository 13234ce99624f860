"""Which Kubernetes cluster a command talks to: the one it runs in (its pod's service account), else the
kubeconfig's current context ($KUBECONFIG, else ~/.kube/config). Neither is the user's to fix: one line, no
traceback (tracefleet.cli turns the SystemExit into `tracefleet COMMAND: ...`, exit status 2)."""

from __future__ import annotations

import os


def load_cluster_config() -> None:
    from kubernetes import config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        try:
            # KUBECONFIG as it is now (the client reads it once, at import)
            config.load_kube_config(config_file=os.environ.get("KUBECONFIG"))
        except (config.ConfigException, OSError) as exc:
            raise SystemExit(f"no Kubernetes cluster to talk to: not in a pod, and no usable kubeconfig "
                             f"($KUBECONFIG or ~/.kube/config: {exc})") from None
