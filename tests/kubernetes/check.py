"""What the deployment guides promise of the Kubernetes examples in deploy/kubernetes/, read from their pod specs.

    python tests/kubernetes/check.py deploy/kubernetes/*.yaml     # every promise, for every file
    python tests/kubernetes/check.py --self-test deploy/kubernetes/*.yaml

For the sidecar's container in each file: liveness on `/` and readiness on `/keepalive`, both on the port the
sidecar listens on (`server.listen` in the ConfigMap's sidecar.toml); no volume for state (what a restart must not
forget is kept in the change DB); resource requests; non-root, a read-only root filesystem and no privilege
escalation. Where view-syncers are pointed at it (`ZERO_CHANGE_STREAMER_URI`), the URI names a Service that selects
the sidecar's pod and whose port leads to the sidecar's; where
the RM advertises it (`ZERO_CHANGE_STREAMER_ADDRESS`), it is the sidecar's port too, or, with
`discovery.mode = "owner"`, exactly `upstream.advertised_address`. Sidecars in a Deployment of their own (two for
availability) are at least two, rolled one at a time with none unavailable, kept by a PodDisruptionBudget, and
reach the RM by its pod's stable name, through a headless Service that has the ports they use; the RM's Zero reads
its metrics page on localhost from a forwarder in its pod that leads to a Service of the sidecars' metrics proxy.
Schema validity is kubernetes-validate's (scripts/lint-kubernetes.sh).

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
            check_advertised(docs, config, listen_port)
            check_uris(docs, template, container, listen_port)
            if owner["kind"] == "Deployment":
                check_pair(docs, owner, template, container, config)
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


def check_advertised(docs, config, listen_port):
    owner_mode = config.get("discovery", {}).get("mode") == "owner"
    for env in env_vars(docs, "ZERO_CHANGE_STREAMER_ADDRESS"):
        if owner_mode:
            advertised = config.get("upstream", {}).get("advertised_address", "")
            assert env["value"] == advertised, (
                f"ZERO_CHANGE_STREAMER_ADDRESS {env['value']} (the RM's ownerAddress) is not "
                f"upstream.advertised_address {advertised!r}: the sidecars would hold cleanup for good"
            )
            continue
        port = int(env["value"].rsplit(":", 1)[1])
        assert port == listen_port, f"ZERO_CHANGE_STREAMER_ADDRESS {env['value']} is not the sidecar's port"


def env_value(container, name):
    return next((e.get("value") for e in container.get("env", []) if e["name"] == name), None)


def selects(service, template):
    labels = template["metadata"].get("labels", {})
    selector = service["spec"].get("selector", {})
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def check_pair(docs, owner, template, sidecar, config):
    """Sidecars in a Deployment of their own, apart from the RM's pod."""
    name = f"Deployment/{owner['metadata']['name']}"
    assert owner["spec"].get("replicas", 1) >= 2, f"{name}: fewer than two sidecars"
    rolling = owner["spec"].get("strategy", {}).get("rollingUpdate", {})
    assert rolling.get("maxUnavailable") == 0, f"{name}: a rollout may leave fewer sidecars ready"
    budgets = [
        d for d in docs
        if d.get("kind") == "PodDisruptionBudget"
        and all(template["metadata"]["labels"].get(k) == v for k, v in d["spec"]["selector"]["matchLabels"].items())
    ]
    assert budgets and budgets[0]["spec"].get("minAvailable", 0) >= 1, f"{name}: no PodDisruptionBudget keeps one"

    # The RM's pod: the StatefulSet whose Zero container has no sidecar beside it.
    rms = [
        (o, t) for o, t in pod_templates(docs)
        if o["kind"] == "StatefulSet" and any(env_value(c, "ZERO_CHANGE_STREAMER_PORT") for c in t["spec"]["containers"])
    ]
    assert len(rms) == 1, f"{name}: no StatefulSet of one replication-manager"
    rm, rm_template = rms[0]
    zero = next(c for c in rm_template["spec"]["containers"] if env_value(c, "ZERO_CHANGE_STREAMER_PORT"))
    services = {d["metadata"]["name"]: d for d in docs if d.get("kind") == "Service"}
    stable = f"{rm['metadata']['name']}-0.{rm['spec']['serviceName']}"
    headless = services.get(rm["spec"]["serviceName"])
    assert headless and headless["spec"].get("clusterIP") == "None" and selects(headless, rm_template), (
        f"{name}: no headless Service {rm['spec']['serviceName']} selects the RM's pod"
    )
    exposed = {p["port"] for p in headless["spec"]["ports"]}
    litestream_addr = next(
        d["data"]["config.yml"] for d in docs if d.get("kind") == "ConfigMap" and "config.yml" in d.get("data", {})
    )
    reaches = {
        "upstream.address": (config["upstream"]["address"], env_value(zero, "ZERO_CHANGE_STREAMER_PORT")),
        "litestream.metrics_url": (
            urlsplit(config["litestream"]["metrics_url"]).netloc,
            [line.split(":")[-1] for line in litestream_addr.splitlines() if line.startswith("addr:")][0],
        ),
    }
    for key, (address, rm_port) in reaches.items():
        host, port = address.rsplit(":", 1)
        assert host == stable, f"{name}: {key} {address} is not the RM pod's stable name {stable}"
        assert port == str(rm_port), f"{name}: {key} {address} is not the RM's port {rm_port}"
        assert int(port) in exposed, f"{name}: {key} {address}: Service {rm['spec']['serviceName']} has no port {port}"

    # Zero's BackupMonitor reads localhost:$ZERO_LITESTREAM_PORT: a forwarder in the RM's pod binds it and leads to
    # a Service of the sidecars whose port targets their metrics proxy.
    zero_port = env_value(zero, "ZERO_LITESTREAM_PORT")
    proxy_port = int(config["litestream"]["proxy_listen"].rsplit(":", 1)[1])
    forwards = []
    for c in rm_template["spec"]["containers"]:
        for mount in c.get("volumeMounts", []):
            volume = next(v for v in rm_template["spec"]["volumes"] if v["name"] == mount["name"])
            config_map = volume.get("configMap", {}).get("name")
            for d in docs:
                if d.get("kind") == "ConfigMap" and d["metadata"]["name"] == config_map:
                    forwards.extend(d.get("data", {}).get("haproxy.cfg", "").splitlines())
    binds = [line.split()[1] for line in forwards if line.strip().startswith("bind ")]
    assert f"127.0.0.1:{zero_port}" in [b.strip() for b in binds], (
        f"{name}: nothing in the RM's pod serves localhost:{zero_port} (ZERO_LITESTREAM_PORT): {binds}"
    )
    servers = [line.split()[2] for line in forwards if line.strip().startswith("server ")]
    assert servers, f"{name}: the RM's metrics forwarder leads nowhere"
    for server in servers:
        host, port = server.rsplit(":", 1)
        service = services.get(host)
        assert service and selects(service, template), f"{name}: the metrics forwarder's {host} is not the sidecars'"
        target = next((p.get("targetPort", p["port"]) for p in service["spec"]["ports"] if p["port"] == int(port)), None)
        assert target is not None and port_number(sidecar, target) == proxy_port, (
            f"{name}: the metrics forwarder's {server} does not lead to the sidecars' proxy port {proxy_port}"
        )


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
        if sidecar_toml(docs).get("discovery", {}).get("mode") == "owner":

            def other_owner(d, t, c):
                for e in env_vars(d, "ZERO_CHANGE_STREAMER_ADDRESS"):
                    e["value"] = "10.0.0.5:4849"

            yield broken("ownerAddress not the sidecars' advertised_address", other_owner)
        else:
            yield broken("ownerAddress the RM's own port", to_rm_port("ZERO_CHANGE_STREAMER_ADDRESS"))

    if any(env_vars(docs, "ZERO_CHANGE_STREAMER_URI")):
        yield broken("URI to the RM's own port", to_rm_port("ZERO_CHANGE_STREAMER_URI"))

        def service_elsewhere(d, t, c):
            for doc in d:
                if doc.get("kind") == "Service":
                    doc["spec"]["selector"] = {"app": "zero-view-syncer"}

        yield broken("Service selecting other pods", service_elsewhere)

    if any(o["kind"] == "Deployment" and c["name"] == SIDECAR for o, t in pod_templates(docs) for c in t["spec"]["containers"]):

        def one_sidecar(d, t, c):
            for o, tt in pod_templates(d):
                if tt is t:
                    o["spec"]["replicas"] = 1

        yield broken("one sidecar", one_sidecar)

        def no_budget(d, t, c):
            d[:] = [doc for doc in d if doc.get("kind") != "PodDisruptionBudget"]

        yield broken("no disruption budget", no_budget)

        def edit_toml(old, new):
            def change(d, t, c):
                for doc in d:
                    if doc.get("kind") == "ConfigMap" and "sidecar.toml" in doc.get("data", {}):
                        doc["data"]["sidecar.toml"] = doc["data"]["sidecar.toml"].replace(old, new)

            return change

        yield broken("advertised address not ownerAddress", edit_toml('advertised_address = "zero-replication-manager-0.zero-replication-manager:4849"', 'advertised_address = "10.0.0.5:4849"'))
        yield broken("upstream by the pod's changing address", edit_toml('\naddress = "zero-replication-manager-0.zero-replication-manager:4849"', '\naddress = "10.0.0.5:4849"'))
        yield broken("metrics from another port", edit_toml(":4860/metrics", ":4861/metrics"))

        def forwarder_elsewhere(d, t, c):
            for doc in d:
                if doc.get("kind") == "ConfigMap" and "haproxy.cfg" in doc.get("data", {}):
                    doc["data"]["haproxy.cfg"] = doc["data"]["haproxy.cfg"].replace("127.0.0.1:4850", "127.0.0.1:4851")

        yield broken("no forwarder on ZERO_LITESTREAM_PORT", forwarder_elsewhere)

        def forwarder_to_rm(d, t, c):
            for doc in d:
                if doc.get("kind") == "ConfigMap" and "haproxy.cfg" in doc.get("data", {}):
                    doc["data"]["haproxy.cfg"] = doc["data"]["haproxy.cfg"].replace(
                        "litestream-sidecar:4850", "zero-replication-manager:4860"
                    )

        yield broken("forwarder to litestream itself", forwarder_to_rm)



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
