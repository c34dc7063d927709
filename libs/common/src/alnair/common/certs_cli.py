"""`alnair certs`: the serving certificate of a service's webhook, in the Secret the service mounts.

    alnair certs --namespace alnair-system --secret alnair-dispatcher-webhook-tls \\
        --host alnair-dispatcher.alnair-system.svc --webhook alnair-dispatcher \\
        --apiservice v1alpha1.dispatcher.query.alnair.io

Run by the deploy (a Job of its own, `deploy/kustomize/base/dispatcher/webhook.yaml`) and safe
to run again: a Secret whose certificate names every host and is valid for more than
`--renew-days` is kept; otherwise a new CA and certificate replace it (the mounting service
reloads it, `alnair.common.tls`). Then the CA goes into `clientConfig.caBundle` of every webhook
of the named Mutating/ValidatingWebhookConfigurations and into `spec.caBundle` of the named
APIServices, so the API server trusts the service.
Exit status 0 when done, 1 with the reason on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import datetime as dt
import ipaddress
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from cryptography import x509

from alnair.common.errors import AlnairError
from alnair.common.kube import (
    APISERVICES,
    CONFIGMAPS,
    MUTATING_WEBHOOKS,
    SECRETS,
    VALIDATING_WEBHOOKS,
    ApiError,
    KubeClient,
    NotFound,
    Obj,
)
from alnair.common.tls import CA_FILE, CERT_FILE, KEY_FILE, issue


@dataclass(frozen=True, slots=True)
class Outcome:
    issued: bool
    why: str
    ca_pem: bytes
    webhooks_patched: int


def _decoded(secret: Obj | None) -> dict[str, bytes]:
    if secret is None:
        return {}
    return {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}


def still_good(files: dict[str, bytes], hosts: Sequence[str], renew_before: dt.timedelta) -> str:
    """'' when `files` hold a certificate for every host, valid beyond `renew_before`; else why
    not."""
    if not all(files.get(k) for k in (CERT_FILE, KEY_FILE, CA_FILE)):
        return "no certificate yet"
    try:
        cert = x509.load_pem_x509_certificate(files[CERT_FILE])
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, x509.ExtensionNotFound) as exc:
        return f"unreadable certificate: {exc}"
    named = set(sans.get_values_for_type(x509.DNSName))
    named |= {str(ip) for ip in sans.get_values_for_type(x509.IPAddress)}
    wanted = set()
    for host in hosts:
        try:
            wanted.add(str(ipaddress.ip_address(host)))
        except ValueError:
            wanted.add(host)
    if missing := sorted(wanted - named):
        return f"certificate does not name {', '.join(missing)}"
    left = cert.not_valid_after_utc - dt.datetime.now(dt.UTC)
    if left < renew_before:
        return f"certificate expires in {left.days} days"
    return ""


async def _ca_into_webhooks(kube: KubeClient, names: Sequence[str], ca_pem: bytes) -> int:
    bundle = base64.b64encode(ca_pem).decode()
    patched = 0
    for name in names:
        for resource in (MUTATING_WEBHOOKS, VALIDATING_WEBHOOKS):
            try:
                config = await kube.get(resource, name)
            except NotFound:
                continue
            ops = [
                {"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": bundle}
                for i, hook in enumerate(config.get("webhooks") or [])
                if (hook.get("clientConfig") or {}).get("caBundle") != bundle
            ]
            if ops:
                ops.insert(0, {"op": "test", "path": "/metadata/resourceVersion",
                               "value": config["metadata"]["resourceVersion"]})  # fmt: skip
                await kube.patch(resource, name, ops, patch_type="json")
                patched += len(ops) - 1
    return patched


async def _ca_into_api_services(kube: KubeClient, names: Sequence[str], ca_pem: bytes) -> int:
    """The CA into each named APIService's `caBundle` (an aggregated API the service serves
    on the same certificate); a missing one is skipped, as a webhook configuration is."""
    bundle = base64.b64encode(ca_pem).decode()
    patched = 0
    for name in names:
        try:
            api = await kube.get(APISERVICES, name)
        except NotFound:
            continue
        if (api.get("spec") or {}).get("caBundle") == bundle:
            continue
        await kube.patch(APISERVICES, name, [
            {"op": "test", "path": "/metadata/resourceVersion",
             "value": api["metadata"]["resourceVersion"]},
            {"op": "add", "path": "/spec/caBundle", "value": bundle},
        ], patch_type="json")  # fmt: skip
        patched += 1
    return patched


async def _ca_into_configmap(kube: KubeClient, namespace: str, name: str, ca_pem: bytes) -> None:
    """Publish the CA for clients to verify the server with (`ca.crt` of ConfigMap `name`):
    every client mounts it, none needs the Secret that holds the server's key."""
    body: Obj = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/part-of": "alnair"},
        },
        "data": {CA_FILE: ca_pem.decode()},
    }
    try:
        current = await kube.get(CONFIGMAPS, name, namespace)
    except NotFound:
        await kube.create(CONFIGMAPS, body, namespace)
        return
    if (current.get("data") or {}).get(CA_FILE) != body["data"][CA_FILE]:
        body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        await kube.replace(CONFIGMAPS, body)


async def ensure(
    kube: KubeClient,
    *,
    namespace: str,
    secret: str,
    hosts: Sequence[str],
    webhooks: Sequence[str] = (),
    api_services: Sequence[str] = (),
    days: int = 365,
    renew_days: int = 30,
    ca_configmap: str | None = None,
) -> Outcome:
    try:
        current: Obj | None = await kube.get(SECRETS, secret, namespace)
    except NotFound:
        current = None
    files = _decoded(current)
    why = still_good(files, hosts, dt.timedelta(days=renew_days))
    ca_pem = files.get(CA_FILE, b"")
    if why:
        made = issue(hosts, days=days)
        body: Obj = {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "kubernetes.io/tls",
            "metadata": {
                "name": secret,
                "namespace": namespace,
                "labels": {"app.kubernetes.io/part-of": "alnair"},
            },
            "data": {k: base64.b64encode(v).decode() for k, v in made.secret_data().items()},
        }
        if current is None:
            await kube.create(SECRETS, body, namespace)
        else:
            body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
            await kube.replace(SECRETS, body)
        ca_pem = made.ca_pem
    if ca_configmap:
        await _ca_into_configmap(kube, namespace, ca_configmap, ca_pem)
    patched = await _ca_into_webhooks(kube, webhooks, ca_pem)
    patched += await _ca_into_api_services(kube, api_services, ca_pem)
    return Outcome(bool(why), why or "certificate still good", ca_pem, patched)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="alnair certs", description=__doc__.splitlines()[0])
    p.add_argument("--namespace", required=True)
    p.add_argument("--secret", required=True, help="the kubernetes.io/tls Secret to keep")
    p.add_argument("--host", action="append", required=True, help="a name the certificate is for")
    p.add_argument("--webhook", action="append", default=[],
                   help="a webhook configuration whose caBundle is set")  # fmt: skip
    p.add_argument("--apiservice", action="append", default=[],
                   help="an APIService whose caBundle is set")  # fmt: skip
    p.add_argument("--ca-configmap", default=None,
                   help="a ConfigMap that gets the CA (ca.crt) for clients")  # fmt: skip
    p.add_argument("--days", type=int, default=365)
    p.add_argument("--renew-days", type=int, default=30)
    p.add_argument("--kubeconfig", default=None)
    args = p.parse_args(argv)

    async def run() -> Outcome:
        async with KubeClient.from_config(args.kubeconfig) as kube:
            return await ensure(
                kube, namespace=args.namespace, secret=args.secret, hosts=args.host,
                webhooks=args.webhook, api_services=args.apiservice, days=args.days,
                renew_days=args.renew_days, ca_configmap=args.ca_configmap,
            )  # fmt: skip

    try:
        out = asyncio.run(run())
    except (AlnairError, ApiError) as exc:
        print(f"alnair certs: {exc}", file=sys.stderr)
        return 1
    verb = "issued" if out.issued else "kept"
    print(f"{verb} {args.namespace}/{args.secret} ({out.why}); "
          f"caBundle set on {out.webhooks_patched} webhook(s) and APIService(s)")  # fmt: skip
    return 0
