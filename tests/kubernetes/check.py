"""What the deployment guides promise of the Kubernetes examples in deploy/kubernetes/, read from their pod specs.

    python tests/kubernetes/check.py deploy/kubernetes/*.yaml     # every promise, for every file
    python tests/kubernetes/check.py --self-test deploy/kubernetes/*.yaml

For the sidecar's container in each file: liveness on `/` and readiness on `/keepalive`, both on the port the
sidecar listens on (`server.listen` in the ConfigMap's sidecar.toml); no volume for state (what a restart must not
forget is kept in the change DB); resource requests; non-root, a read-only root filesystem and no privilege
escalation. Where view-syncers are pointed at it (`ZERO_CHANGE_STREAMER_URI`), the URI names a Service that selects
the sidecar's pod and whose port leads to the sidecar's; where
the RM advertises it (`ZERO_CHANGE_STREAMER_ADDRESS`), it is the sidecar's port too. Schema validity is
kubernetes-validate's (scripts/lint-kubernetes.sh).

`--self-test` breaks each promise in turn in a copy of each file and fails unless the check notices: a check that
cannot fail proves nothing.
"""

import copy
import sys
import tomllib
from urllib.parse import urlsplit

import yaml

SIDECAR = "litestream-sidecar"
STATE_DIR = "/var/lib/litestream-sidecar"


def pod_templates(docs):
    for doc in docs:
        if doc.get("kind") in ("StatefulSet", "Deployment", "DaemonSet"):
            yield doc, doc["spec"]["template"]


def env_vars(docs, name):
    """Every container's environment entry called `name`, in every pod template."""
    for _, template in pod_templates(docs):
        for container in template["spec"]["containers"]:
            for env in container.get("env", []):
                if env["name"] == name:
                    yield env


def sidecar_toml(docs):
    for doc in docs:
        if doc.get("kind") == "ConfigMap" and "sidecar.toml" in doc.get("data", {}):
            return tomllib.loads(doc["data"]["sidecar.toml"])
    raise AssertionError("no ConfigMap carries sidecar.toml")


def port_number(container, port):
    """A probe's or a Service's target port, by number or by the container port's name."""
    if isinstance(port, int):
        return port
    for declared in container.get("ports", []):
        if declared.get("name") == port:
            return declared["containerPort"]
    raise AssertionError(f"{container['name']}: no port named {port!r}")


def check(docs):
    """Every promise; raises AssertionError naming the first one broken."""
    config = sidecar_toml(docs)
    listen_port = int(config["server"]["listen"].rsplit(":", 1)[1])
    found = False
    for owner, template in pod_templates(docs):
        spec = template["spec"]
        for container in spec["containers"]:
            if container["name"] != SIDECAR:
                continue
            found = True
            check_sidecar(owner, spec, container, listen_port)
            check_advertised(docs, listen_port)
            check_uris(docs, template, container, listen_port)
    assert found, f"no container named {SIDECAR}"


def check_sidecar(owner, spec, container, listen_port):
    name = f"{owner['kind']}/{owner['metadata']['name']}: {SIDECAR}"
    ports = [p["containerPort"] for p in container.get("ports", [])]
    assert listen_port in ports, f"{name}: port {listen_port} (server.listen) not declared: {ports}"
    for probe, path in (("livenessProbe", "/"), ("readinessProbe", "/keepalive")):
        get = container.get(probe, {}).get("httpGet")
        assert get, f"{name}: no HTTP {probe}"
        assert get["path"] == path, f"{name}: {probe} on {get['path']}, not {path}"
        assert port_number(container, get["port"]) == listen_port, f"{name}: {probe} not on {listen_port}"
    requests = container.get("resources", {}).get("requests", {})
    assert "cpu" in requests and "memory" in requests, f"{name}: no cpu and memory requests"
    context = container.get("securityContext", {})
    pod_context = spec.get("securityContext", {})
    non_root = context.get("runAsNonRoot", pod_context.get("runAsNonRoot"))
    assert non_root is True, f"{name}: not runAsNonRoot"
    assert context.get("readOnlyRootFilesystem") is True, f"{name}: root filesystem writable"
    assert context.get("allowPrivilegeEscalation") is False, f"{name}: privilege escalation allowed"
    mounts = [m for m in container.get("volumeMounts", []) if m["mountPath"] == STATE_DIR]
    assert not mounts, f"{name}: a volume at {STATE_DIR}: the state is in the change DB, a volume there only hides that"


def check_advertised(docs, listen_port):
    for env in env_vars(docs, "ZERO_CHANGE_STREAMER_ADDRESS"):
        port = int(env["value"].rsplit(":", 1)[1])
        assert port == listen_port, f"ZERO_CHANGE_STREAMER_ADDRESS {env['value']} is not the sidecar's port"


def check_uris(docs, template, sidecar, listen_port):
    labels = template["metadata"].get("labels", {})
    services = {d["metadata"]["name"]: d for d in docs if d.get("kind") == "Service"}
    for env in env_vars(docs, "ZERO_CHANGE_STREAMER_URI"):
        url = urlsplit(env["value"])
        assert url.scheme in ("ws", "wss"), f"ZERO_CHANGE_STREAMER_URI {env['value']}: not ws:// or wss://"
        service = services.get(url.hostname)
        assert service, f"ZERO_CHANGE_STREAMER_URI names {url.hostname}, not a Service here"
        selector = service["spec"].get("selector", {})
        assert selector and all(labels.get(k) == v for k, v in selector.items()), (
            f"Service {url.hostname} does not select the sidecar's pod"
        )
        port = url.port or (443 if url.scheme == "wss" else 80)
        matching = [p for p in service["spec"]["ports"] if p["port"] == port]
        assert matching, f"Service {url.hostname} has no port {port}"
        target = matching[0].get("targetPort", port)
        assert port_number(sidecar, target) == listen_port, (
            f"ZERO_CHANGE_STREAMER_URI {env['value']} leads to port {target}, not the sidecar's {listen_port}"
        )


def breakages(docs):
    """Copies of `docs`, each with one promise broken, and what was broken."""

    def sidecars(d):
        for _, template in pod_templates(d):
            for c in template["spec"]["containers"]:
                if c["name"] == SIDECAR:
                    yield template, c

    def broken(what, change):
        d = copy.deepcopy(docs)
        for template, c in sidecars(d):
            change(d, template, c)
        return what, d

    yield broken("readiness on /", lambda d, t, c: c["readinessProbe"]["httpGet"].update(path="/"))
    yield broken("liveness on another port", lambda d, t, c: c["livenessProbe"]["httpGet"].update(port=9))
    yield broken("no memory request", lambda d, t, c: c["resources"]["requests"].pop("memory"))
    yield broken("writable root", lambda d, t, c: c["securityContext"].update(readOnlyRootFilesystem=False))
    yield broken("escalation", lambda d, t, c: c["securityContext"].update(allowPrivilegeEscalation=True))

    def as_root(d, t, c):
        c["securityContext"].pop("runAsNonRoot", None)
        t["spec"].get("securityContext", {}).pop("runAsNonRoot", None)

    yield broken("root allowed", as_root)

    def state_volume(d, t, c):
        c.setdefault("volumeMounts", []).append({"name": "scratch", "mountPath": STATE_DIR})
        t["spec"].setdefault("volumes", []).append({"name": "scratch", "emptyDir": {}})

    yield broken("a state volume", state_volume)

    def other_listen(d, t, c):
        for doc in d:
            if doc.get("kind") == "ConfigMap" and "sidecar.toml" in doc.get("data", {}):
                doc["data"]["sidecar.toml"] = doc["data"]["sidecar.toml"].replace(":4851", ":4852")

    yield broken("server.listen elsewhere", other_listen)

    def to_rm_port(name):
        def change(d, t, c):
            for e in env_vars(d, name):
                e["value"] = e["value"].replace(":4851", ":4849")

        return change

    if any(env_vars(docs, "ZERO_CHANGE_STREAMER_ADDRESS")):
        yield broken("ownerAddress the RM's own port", to_rm_port("ZERO_CHANGE_STREAMER_ADDRESS"))

    if any(env_vars(docs, "ZERO_CHANGE_STREAMER_URI")):
        yield broken("URI to the RM's own port", to_rm_port("ZERO_CHANGE_STREAMER_URI"))

        def service_elsewhere(d, t, c):
            for doc in d:
                if doc.get("kind") == "Service":
                    doc["spec"]["selector"] = {"app": "zero-view-syncer"}

        yield broken("Service selecting other pods", service_elsewhere)



def main(args):
    self_test = "--self-test" in args
    paths = [a for a in args if a != "--self-test"]
    failed = False
    for path in paths:
        with open(path) as f:
            docs = [d for d in yaml.safe_load_all(f) if d]
        try:
            check(docs)
        except AssertionError as err:
            print(f"FAIL {path}: {err}")
            failed = True
            continue
        if not self_test:
            print(f"ok   {path}: probes, no state volume, requests, security context, ports")
            continue
        for what, broken in breakages(docs):
            try:
                check(broken)
            except AssertionError as err:
                print(f"ok   {path}: {what} is caught ({err})")
            else:
                print(f"FAIL {path}: {what} goes unnoticed")
                failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
