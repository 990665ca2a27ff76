"""The connection to a live cluster: the user's kubeconfig (its context and namespace) or, inside a
pod, the pod's own ServiceAccount, through the Kubernetes Python client.

Reads return the API server's JSON as dicts (the kinds read here include custom resources of four
controllers, which the client's typed models do not have). A missing object is None; an object this
account may not read raises Forbidden, so a check can say it could not look instead of saying the
object is missing.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

IN_CLUSTER_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


class Forbidden(Exception):
    """The API server refused this account the read (403)."""


class Unreachable(Exception):
    """No API server answered, or it answered with an error other than 403/404."""


@dataclass
class Target:
    """Where the connection goes: shown at the top of every answer, so a wrong context is seen."""

    server: str
    context: str
    namespace: str


class Cluster:
    def __init__(self, api_client, target: Target, timeout_s: float = 30.0):
        self.client = api_client
        self.target = target
        self.namespace = target.namespace
        self.timeout_s = timeout_s

    @classmethod
    def connect(
        cls, kubeconfig: str | None = None, context: str | None = None, namespace: str | None = None
    ) -> Cluster:
        """The kubeconfig's (KUBECONFIG, ~/.kube/config) context, or the pod's account when run in a
        pod with neither; the namespace: the argument, the context's, the pod's, else `default`."""
        from kubernetes import client, config

        conf = client.Configuration()
        in_pod = not kubeconfig and "KUBERNETES_SERVICE_HOST" in os.environ and not _kubeconfig_exists()
        if in_pod:
            config.load_incluster_config(client_configuration=conf)
            ns = namespace or (IN_CLUSTER_NAMESPACE.read_text().strip() if IN_CLUSTER_NAMESPACE.exists() else "default")
            return cls(client.ApiClient(conf), Target(conf.host, "(in-cluster)", ns))
        try:
            contexts, active = config.list_kube_config_contexts(config_file=kubeconfig)
        except config.ConfigException as err:
            raise Unreachable(f"no kubeconfig to read ({err}): pass --kubeconfig or set KUBECONFIG") from None
        chosen = next((c for c in contexts if c["name"] == context), None) if context else active
        if chosen is None:
            names = ", ".join(c["name"] for c in contexts)
            raise Unreachable(f"no context {context!r} in the kubeconfig (it has: {names})")
        config.load_kube_config(config_file=kubeconfig, context=chosen["name"], client_configuration=conf)
        ns = namespace or chosen.get("context", {}).get("namespace") or "default"
        return cls(client.ApiClient(conf), Target(conf.host, chosen["name"], ns))

    def _call(self, method: str, path: str, query: dict | None = None, body: dict | None = None) -> dict | None:
        from urllib3.exceptions import HTTPError

        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        m, url, headers, data, post = self.client.param_serialize(
            method,
            path,
            query_params=sorted((query or {}).items()),
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        try:
            resp = self.client.call_api(
                m, url, header_params=headers, body=data, post_params=post, _request_timeout=self.timeout_s
            )
            raw = resp.read()
        except HTTPError as err:
            raise Unreachable(f"{self.target.server}: {err}") from None
        if resp.status == 404:
            return None
        if resp.status == 403:
            raise Forbidden(_message(raw) or f"{method} {path}: forbidden")
        if resp.status >= 400:
            raise Unreachable(f"{method} {path}: HTTP {resp.status} {_message(raw)}")
        return json.loads(raw)

    def get(self, path: str) -> dict | None:
        """GET an API path (`/api/v1/nodes`, `/apis/kubeflow.org/v1/namespaces/x/pytorchjobs`): the
        object or list, None when it does not exist."""
        return self._call("GET", path)

    def items(self, path: str, label_selector: str | None = None, field_selector: str | None = None) -> list[dict]:
        """The items of a list path; [] when the resource does not exist here."""
        query = {k: v for k, v in (("labelSelector", label_selector), ("fieldSelector", field_selector)) if v}
        found = self._call("GET", path, query or None)
        return list((found or {}).get("items") or [])

    def create(self, path: str, body: dict) -> dict:
        """POST: only reviews are created (access reviews write nothing)."""
        return self._call("POST", path, body=body) or {}


def _kubeconfig_exists() -> bool:
    paths = os.environ.get("KUBECONFIG", "").split(os.pathsep) if os.environ.get("KUBECONFIG") else ["~/.kube/config"]
    return any(Path(p).expanduser().exists() for p in paths if p)


def _message(raw: bytes) -> str:
    try:
        return str(json.loads(raw).get("message", ""))
    except (ValueError, AttributeError):
        return raw[:200].decode(errors="replace")
