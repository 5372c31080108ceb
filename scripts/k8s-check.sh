#!/usr/bin/env bash
# Offline check of the Kubernetes manifests in deploy/k8s (docs/deploy.md, "Kubernetes"):
#   1. renders every overlay (deploy/k8s/overlays/*), alone and with each component
#      (deploy/k8s/components/*), with `kubectl kustomize`;
#   2. validates each rendering with kubernetes-validate in strict mode (unknown fields are
#      errors) against the schemas of the oldest Kubernetes it targets and the newest the package
#      ships, after making sure the validator rejects a broken manifest;
#   3. checks what schemas cannot: references between the objects, the probes on /health, the
#      security context, and that terminationGracePeriodSeconds covers the drain (preStop, the
#      server's shutdown grace, its own drain, an NPU worker's stop);
#   4. with --play (as root), runs the rendered cpu Deployment (one replica) with `podman kube
#      play` on the image scripts/image.sh builds (onebit-tts:VERSION), the generated test model
#      mounted at /models/tiny: /health without a key, a synthesis refused without the key and
#      answered with it, the manifest's uid on a read-only root, the voice store writable, and a
#      request in flight at SIGTERM finishing with its whole WAV.
# Any error fails the script. kubernetes-validate is installed into .onebit/venv if missing.
#
# Usage: scripts/k8s-check.sh [--play] [--keep]
#   --keep   leave the renderings in the temporary directory and say where
# Environment: K8S_PLAY_MODEL (default models/tiny), K8S_PLAY_PORT (default 18880),
#   K8S_PLAY_IMAGE (default onebit-tts:VERSION from Cargo.toml).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

# Pinned: the schemas it ships are part of the check's result.
KUBERNETES_VALIDATE_VERSION=1.37.0
# 1.30: the oldest Kubernetes these manifests target; 1.37: the newest
# schema kubernetes-validate 1.37.0 ships. Image volumes (components/models-image-volume) exist
# from 1.31 (beta 1.33): that component is validated from 1.33 on.
SCHEMAS="1.30.0 1.37.0"
SCHEMAS_IMAGE_VOLUME="1.33.0 1.37.0"

play=0
keep=0
for a in "$@"; do
  case "$a" in
    --play) play=1 ;;
    --keep) keep=1 ;;
    -h | --help)
      sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
      exit 0
      ;;
    *)
      echo "k8s-check: unknown argument $a (--play, --keep)" >&2
      exit 2
      ;;
  esac
done

die() {
  echo "k8s-check: $*" >&2
  exit 1
}

command -v kubectl >/dev/null || die "kubectl is not installed (it renders the overlays: kubectl kustomize)"
py="$root/.onebit/venv/bin/python"
[ -x "$py" ] || die "no .onebit/venv: run scripts/setup.sh first"
installed="$("$py" -c 'import importlib.metadata as m; print(m.version("kubernetes-validate"))' 2>/dev/null || true)"
if [ "$installed" != "$KUBERNETES_VALIDATE_VERSION" ]; then
  echo "k8s-check: installing kubernetes-validate==$KUBERNETES_VALIDATE_VERSION into .onebit/venv"
  "$py" -m pip install -q --disable-pip-version-check "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION"
fi

tmp="$(mktemp -d)"
cleanup() {
  if [ "$keep" = 1 ]; then
    echo "k8s-check: renderings kept in $tmp"
  else
    rm -rf "$tmp"
  fi
}
trap cleanup EXIT

# What schemas cannot see. Argument: a rendering (multi-document YAML) and its name.
cat >"$tmp/semantics.py" <<'PY'
import os
import sys

import yaml

path, name = sys.argv[1], sys.argv[2]
docs = [d for d in yaml.safe_load_all(open(path)) if d]
errors = []


def err(msg):
    errors.append(msg)


def only(kind, prefix=""):
    found = [
        d for d in docs if d.get("kind") == kind and d["metadata"]["name"].startswith(prefix)
    ]
    if len(found) != 1:
        err(f"expected one {kind}{' ' + prefix + '*' if prefix else ''}, found {len(found)}")
        return None
    return found[0]


# One of each; of ConfigMaps, one with the server's settings (the npu overlay adds xrt.ini's).
dep, svc, hpa, pdb, cm, secret = (
    only("Deployment"),
    only("Service"),
    only("HorizontalPodAutoscaler"),
    only("PodDisruptionBudget"),
    only("ConfigMap", "onebit-tts-config"),
    only("Secret"),
)
if errors:
    sys.exit(f"{name}: " + "; ".join(errors))
objects = {(d["kind"], d["metadata"]["name"]): d for d in docs}
template = dep["spec"]["template"]
spec = template["spec"]
labels = template["metadata"].get("labels", {})


def selects(selector):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


if not selects(dep["spec"]["selector"].get("matchLabels")):
    err("the Deployment's selector does not match its pod labels")
if not selects(svc["spec"].get("selector")):
    err("the Service's selector does not match the pods")
if not selects(pdb["spec"]["selector"].get("matchLabels")):
    err("the PodDisruptionBudget's selector does not match the pods")
target = hpa["spec"]["scaleTargetRef"]
if (target["kind"], target["name"]) != ("Deployment", dep["metadata"]["name"]):
    err(f"the HPA scales {target['kind']}/{target['name']}, not the Deployment")
if hpa["spec"].get("minReplicas", 1) > hpa["spec"]["maxReplicas"]:
    err("the HPA's minReplicas is above its maxReplicas")
if not hpa["spec"].get("metrics"):
    err("the HPA has no metrics")

containers = spec["containers"]
if len(containers) != 1:
    err(f"expected one container, found {len(containers)}")
c = containers[0]
ports = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}
if "http" not in ports:
    err("the container has no port named http")
svc_ports = [p for p in svc["spec"]["ports"] if p.get("name") == "http"]
if not svc_ports or svc_ports[0].get("targetPort") not in ("http", ports.get("http")):
    err("the Service has no port http that targets the container's http port")

args = c.get("args", [])
if args[:1] != ["serve"]:
    err(f"the container's args must start with serve, not {args[:1]}")


def flag(name):
    return args[args.index(name) + 1] if name in args and args.index(name) + 1 < len(args) else None


env = {}
for ref in c.get("envFrom", []):
    name_ = ref.get("configMapRef", {}).get("name")
    if name_ is not None:
        if ("ConfigMap", name_) not in objects:
            err(f"envFrom names ConfigMap {name_}, which is not rendered")
        else:
            env.update(objects[("ConfigMap", name_)].get("data", {}))
for e in c.get("env", []):
    if "value" in e:
        env[e["name"]] = e["value"]
if flag("--host") != "0.0.0.0":
    err("serve must listen on 0.0.0.0 (--host) to be reachable through the Service")
if flag("--port") != str(ports.get("http")):
    err(f"--port {flag('--port')} is not the container's http port {ports.get('http')}")

volumes = {v["name"]: v for v in spec.get("volumes", [])}
mounts = c.get("volumeMounts", [])
for m in mounts:
    if m["name"] not in volumes:
        err(f"mount {m['mountPath']} names volume {m['name']}, which the pod lacks")
for v in volumes.values():
    for field, kind, key in (
        ("persistentVolumeClaim", "PersistentVolumeClaim", "claimName"),
        ("secret", "Secret", "secretName"),
        ("configMap", "ConfigMap", "name"),
    ):
        if field in v and (kind, v[field][key]) not in objects:
            err(f"volume {v['name']} names {kind} {v[field][key]}, which is not rendered")


def mount_of(path):
    """The mount that holds path (the longest mountPath above it)."""
    best = None
    for m in mounts:
        mp = m["mountPath"].rstrip("/")
        if (path == mp or path.startswith(mp + "/")) and (
            best is None or len(mp) > len(best["mountPath"].rstrip("/"))
        ):
            best = m
    return best


keys = flag("--api-key-file")
m = mount_of(keys) if keys else None
if not keys:
    err("no --api-key-file: serve refuses 0.0.0.0 without a key")
elif not m or "secret" not in volumes.get(m["name"], {}):
    err(f"--api-key-file {keys} is not on a Secret volume")
else:
    sec = objects.get(("Secret", volumes[m["name"]]["secret"]["secretName"]))
    key = os.path.relpath(keys, m["mountPath"])
    if sec is not None and key not in {**sec.get("data", {}), **sec.get("stringData", {})}:
        err(f"the Secret has no key {key} for --api-key-file {keys}")

store = flag("--voice-store")
m = mount_of(store) if store else None
if not store:
    err("no --voice-store: voices created over HTTP would stay inside one pod")
elif not m or "persistentVolumeClaim" not in volumes.get(m["name"], {}) or m.get("readOnly"):
    err(f"--voice-store {store} is not on a writable PersistentVolumeClaim")
else:
    pvc = objects.get(("PersistentVolumeClaim", volumes[m["name"]]["persistentVolumeClaim"]["claimName"]))
    if pvc is not None and "ReadWriteMany" not in pvc["spec"]["accessModes"]:
        err("the voice store's claim is not ReadWriteMany: replicas would not share it")

model = flag("--model") or env.get("ONEBIT_MODEL")
m = mount_of(model) if model else None
if not model or not m:
    err(f"the model {model} is not on a mounted volume")
elif not m.get("readOnly"):
    err("the models volume should be mounted read-only")

for probe in ("startupProbe", "readinessProbe"):
    p = c.get(probe, {}).get("httpGet", {})
    if p.get("path") != "/health" or p.get("port") not in ("http", ports.get("http")):
        err(f"{probe} must be an httpGet of /health on the http port")
live = c.get("livenessProbe", {})
if live.get("httpGet", {}).get("path") != "/health" and live.get("tcpSocket", {}).get("port") not in (
    "http",
    ports.get("http"),
):
    err("livenessProbe must be /health or the http port")

psc = spec.get("securityContext", {})
csc = c.get("securityContext", {})
if psc.get("runAsNonRoot") is not True or psc.get("runAsUser", csc.get("runAsUser")) in (0, None):
    err("the pod must run as a non-root user (runAsNonRoot, a numeric runAsUser)")
if csc.get("allowPrivilegeEscalation") is not False or csc.get("privileged"):
    err("the container must not be privileged nor allow privilege escalation")
if "ALL" not in csc.get("capabilities", {}).get("drop", []):
    err("the container must drop all capabilities")
limits = c.get("resources", {}).get("limits", {})
if "cpu" not in limits or "memory" not in limits:
    err("the container needs CPU and memory limits (the CPU limit sets the thread count)")


def seconds(v, default):
    try:
        return int(float(v)) if v is not None else default
    except ValueError:
        err(f"not a number of seconds: {v}")
        return default


# The drain (src/server/shutdown.rs): preStop, then SIGTERM; in-flight requests get the shutdown
# grace, then 5 s for their connections and up to 5 s for the engine; a worker child (NPU,
# --isolate) then gets its own stop grace. The kubelet SIGKILLs at terminationGracePeriodSeconds.
pre = 0
hook = c.get("lifecycle", {}).get("preStop", {})
cmd = hook.get("exec", {}).get("command", [])
if len(cmd) == 2 and os.path.basename(cmd[0]) == "sleep":
    pre = seconds(cmd[1], 0)
elif "sleep" in hook:
    pre = hook["sleep"]["seconds"]
else:
    err("no preStop sleep: connections routed to the pod after SIGTERM would be refused")
request_timeout = seconds(flag("--request-timeout-s") or env.get("ONEBIT_REQUEST_TIMEOUT_S"), 300)
grace = seconds(flag("--shutdown-grace-s") or env.get("ONEBIT_SHUTDOWN_GRACE_S"), 30)
if grace < request_timeout:
    err(
        f"--shutdown-grace-s {grace} is below --request-timeout-s {request_timeout}: a request "
        "running at SIGTERM could be cut before its own deadline"
    )
worker = env.get("ONEBIT_DEVICE") == "npu" or "--isolate" in args
worker_grace = seconds(env.get("ONEBIT_BACKEND_STOP_GRACE_S"), 30) if worker else 0
need = pre + grace + 5 + 5 + worker_grace
have = spec.get("terminationGracePeriodSeconds", 30)
if have < need:
    err(
        f"terminationGracePeriodSeconds {have} < {need} (preStop {pre} + grace {grace} + drain 5 "
        f"+ engine 5 + worker {worker_grace}): the kubelet would SIGKILL during the drain"
    )
sp = c.get("startupProbe", {})
startup = sp.get("periodSeconds", 10) * sp.get("failureThreshold", 3)
if env.get("ONEBIT_DEVICE") == "npu" and startup < seconds(env.get("ONEBIT_LOAD_TIMEOUT_S"), 900):
    err(f"the startup probe gives {startup} s, less than the NPU load timeout")

if csc.get("readOnlyRootFilesystem") is not True:
    err("the root file system must be read-only (what is written has a volume of its own)")

device = env.get("ONEBIT_DEVICE")
# The NPU compile cache: ONEBIT_NPU_CACHE_DIR on a writable volume of its own, so the models
# volume and the root file system stay read-only.
if device == "npu":
    cache = env.get("ONEBIT_NPU_CACHE_DIR")
    m = mount_of(cache) if cache else None
    if not cache:
        err("the NPU route needs ONEBIT_NPU_CACHE_DIR (its compile cache) set")
    elif not m or m.get("readOnly"):
        err(f"ONEBIT_NPU_CACHE_DIR {cache} is not on a writable volume")
    elif model and mount_of(model) is m:
        err(f"ONEBIT_NPU_CACHE_DIR {cache} is on the models volume, which is read-only")
# XRT_INI_PATH: a file of a mounted ConfigMap that sets [Debug] num_heap_pages.
ini = env.get("XRT_INI_PATH")
if ini:
    m = mount_of(ini)
    vol = volumes.get(m["name"], {}) if m else {}
    if "configMap" not in vol:
        err(f"XRT_INI_PATH {ini} is not on a ConfigMap volume")
    else:
        data = objects.get(("ConfigMap", vol["configMap"]["name"]), {}).get("data", {})
        text = data.get(os.path.relpath(ini, m["mountPath"]))
        if text is None:
            err(f"the ConfigMap {vol['configMap']['name']} has no key for XRT_INI_PATH {ini}")
        else:
            section, pages = None, None
            for line in text.splitlines():
                line = line.strip()
                if not line or line[0] in ";#":
                    continue
                if line.startswith("[") and line.endswith("]"):
                    section = line[1:-1].strip()
                elif section == "Debug" and line.partition("=")[0].strip() == "num_heap_pages":
                    pages = line.partition("=")[2].strip()
            if pages is None or not pages.isdigit() or int(pages) < 1:
                err(f"XRT_INI_PATH {ini} sets no [Debug] num_heap_pages (got {pages})")

image = c["image"]
if not image.split("/")[-1].startswith("onebit-tts:"):
    err(f"unexpected image {image}")
# Each accelerator's image variant (scripts/image.sh): the vulkan one carries Mesa >= 24.1, the
# npu one is Ubuntu 24.04 with the NPU cache directory.
for dev in ("vulkan", "npu"):
    if device == dev and not image.endswith(f"-{dev}"):
        err(f"ONEBIT_DEVICE={dev} needs the {dev} image (a tag ending -{dev}), not {image}")

if errors:
    sys.exit(f"{name}:\n  " + "\n  ".join(errors))
print(
    f"{len(docs)} objects, image {image}, device {env.get('ONEBIT_DEVICE', 'auto')}, "
    f"drain needs {need} s <= termination grace {have} s, startup budget {startup} s"
)
PY

validate() { # file, schema versions
  local file="$1" v out
  for v in $2; do
    if ! out="$("$root/.onebit/venv/bin/kubernetes-validate" --strict --quiet -k "$v" "$file" 2>&1)"; then
      echo "$out" >&2
      return 1
    fi
    # --quiet prints only warnings and failures; a warning is a failure here too.
    if [ -n "$out" ]; then
      echo "$out" >&2
      return 1
    fi
  done
}

# The validator must reject a broken manifest, or a pass means nothing (wrong schema directory,
# a release that stopped being strict).
kubectl kustomize deploy/k8s/overlays/cpu >"$tmp/sanity.yaml"
"$py" - "$tmp/sanity.yaml" "$tmp/broken.yaml" <<'PY'
import sys

import yaml

docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
for d in docs:
    if d["kind"] == "Deployment":
        c = d["spec"]["template"]["spec"]["containers"][0]
        c["readinesProbe"] = c.pop("readinessProbe")  # a typo strict mode must catch
yaml.safe_dump_all(docs, open(sys.argv[2], "w"))
PY
if "$root/.onebit/venv/bin/kubernetes-validate" --strict --quiet -k "${SCHEMAS%% *}" "$tmp/broken.yaml" >/dev/null 2>&1; then
  die "kubernetes-validate --strict accepted a Deployment with an unknown field: the validation would prove nothing"
fi

renders=0
failed=0
check() { # name, kustomization directory, schema versions
  local name="$1" dir="$2" schemas="$3" file summary
  file="$tmp/$(echo "$name" | tr '/+' '__').yaml"
  if ! kubectl kustomize "$dir" >"$file" 2>"$file.err"; then
    echo "FAIL $name: kubectl kustomize" >&2
    cat "$file.err" >&2
    failed=$((failed + 1))
    return
  fi
  if ! validate "$file" "$schemas"; then
    echo "FAIL $name: kubernetes-validate --strict ($schemas)" >&2
    failed=$((failed + 1))
    return
  fi
  if ! summary="$("$py" "$tmp/semantics.py" "$file" "$name" 2>&1)"; then
    echo "FAIL $summary" >&2
    failed=$((failed + 1))
    return
  fi
  renders=$((renders + 1))
  echo "ok   $name: schemas $schemas strict; $summary"
}

overlays=(deploy/k8s/overlays/*/)
components=(deploy/k8s/components/*/)
[ -e "${overlays[0]}" ] || die "no overlays under deploy/k8s/overlays"
for o in "${overlays[@]}"; do
  o="${o%/}"
  check "overlays/${o##*/}" "$o" "$SCHEMAS"
  for comp in "${components[@]}"; do
    [ -e "$comp" ] || continue
    comp="${comp%/}"
    d="$tmp/kust-${o##*/}-${comp##*/}"
    mkdir -p "$d"
    # kustomize takes only relative paths to other kustomizations.
    cat >"$d/kustomization.yaml" <<EOF
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - $(realpath --relative-to="$d" "$o")
components:
  - $(realpath --relative-to="$d" "$comp")
EOF
    schemas="$SCHEMAS"
    [ "${comp##*/}" = models-image-volume ] && schemas="$SCHEMAS_IMAGE_VOLUME"
    check "overlays/${o##*/}+components/${comp##*/}" "$d" "$schemas"
  done
done
[ "$failed" = 0 ] || die "$failed of $((renders + failed)) renderings failed"
echo "k8s-check: $renders renderings of ${#overlays[@]} overlays and ${#components[@]} components rendered, validated (kubernetes-validate $KUBERNETES_VALIDATE_VERSION, strict) and checked"

[ "$play" = 1 ] || exit 0

# --play: the rendered cpu Deployment under podman, one replica, the test model in /models.
command -v podman >/dev/null || die "--play needs podman"
# A pod needs its infra (pause) container; with no registry podman builds that image locally
# from catatonit, installed here as root as scripts/image.sh installs its tools.
if ! command -v catatonit >/dev/null && [ ! -x /usr/libexec/podman/catatonit ]; then
  if [ "$(id -u)" = 0 ] && [ "${ONEBIT_SETUP_INSTALL:-1}" != 0 ] && command -v apt-get >/dev/null; then
    echo "k8s-check: installing catatonit (podman's pause image for kube play)"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends catatonit >/dev/null
  else
    die "--play needs catatonit (podman builds its pause image from it): sudo apt-get install catatonit"
  fi
fi
version="$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)"
image="${K8S_PLAY_IMAGE:-onebit-tts:$version}"
podman image exists "$image" ||
  die "--play needs the image $image (scripts/image.sh builds it); podman has no such image"
model="$(realpath "${K8S_PLAY_MODEL:-models/tiny}")"
[ -f "$model/genai_config.json" ] || ls "$model"/*.gguf >/dev/null 2>&1 ||
  die "no model package at $model (scripts/gen-test-models.sh makes models/tiny)"
port="${K8S_PLAY_PORT:-18880}"
key="k8s-check-$(od -An -N8 -tx8 /dev/urandom | tr -d ' ')"
mkdir -p "$tmp/play/voices" "$tmp/play/keys"
printf '%s\n' "$key" >"$tmp/play/keys/api-keys"
uid="$("$py" -c 'import sys, yaml
for d in yaml.safe_load_all(open(sys.argv[1])):
    if d and d["kind"] == "Deployment":
        print(d["spec"]["template"]["spec"]["securityContext"]["runAsUser"])' "$tmp/overlays_cpu.yaml")"
# hostPath volumes keep the host's owners: the pod's user must read the keys and write the store.
chown -R "$uid:$uid" "$tmp/play"
chmod 0755 "$tmp" "$tmp/play"
chmod 0400 "$tmp/play/keys/api-keys"
# What a cluster would provide is put in place for podman alone: the ConfigMap's variables
# inlined, $(POD_NAMESPACE) expanded as in namespace "default", host directories for the claims
# and the Secret, the port published on loopback. Everything else (args, probes, the security
# context, resources, the read-only root, /tmp) runs as rendered.
"$py" - "$tmp/overlays_cpu.yaml" "$tmp/play/pod.yaml" "$model" "$tmp/play" "$port" "$image" <<'PY'
import sys

import yaml

src, out, model, play, port, image = sys.argv[1:]
docs = [d for d in yaml.safe_load_all(open(src)) if d]
cms = {d["metadata"]["name"]: d.get("data", {}) for d in docs if d["kind"] == "ConfigMap"}
dep = next(d for d in docs if d["kind"] == "Deployment")
dep["spec"]["replicas"] = 1
spec = dep["spec"]["template"]["spec"]
c = spec["containers"][0]
c["image"] = image
env = {}
for ref in c.pop("envFrom", []):
    env.update(cms[ref["configMapRef"]["name"]])
for e in c.get("env", []):
    if "valueFrom" in e:
        env[e["name"]] = "default"  # POD_NAMESPACE
    else:
        v = e["value"]
        for k, val in env.items():
            v = v.replace(f"$({k})", val)
        env[e["name"]] = v
env["ONEBIT_MODEL"] = "/models/" + model.rstrip("/").split("/")[-1]
c["env"] = [{"name": k, "value": v} for k, v in env.items()]
for p in c["ports"]:
    if p["name"] == "http":
        p["hostPort"] = int(port)
        p["hostIP"] = "127.0.0.1"
paths = {
    "models": model.rstrip("/").rsplit("/", 1)[0],  # the package's parent: /models/NAME
    "voices": f"{play}/voices",
    "api-keys": f"{play}/keys",
}
spec["volumes"] = [
    {"name": v["name"], "hostPath": {"path": paths[v["name"]], "type": "Directory"}}
    if v["name"] in paths
    else v
    for v in spec["volumes"]
]
yaml.safe_dump(dep, open(out, "w"))
PY

# podman's configuration for this machine: scripts/image.sh --podman-env says what it needs (on
# cgroup v1 or without CAP_SYS_RESOURCE: runc, and rlimits it may set); a CONTAINERS_CONF of
# your own wins.
if [ -z "${CONTAINERS_CONF:-}" ]; then
  conf_line="$(bash scripts/image.sh --podman-env)" || die "scripts/image.sh --podman-env failed"
  [ -z "$conf_line" ] || eval "export $conf_line"
fi
down() {
  podman kube play --down "$tmp/play/pod.yaml" >/dev/null 2>&1 || true
}
trap 'down; cleanup' EXIT
echo "k8s-check: podman kube play of the rendered cpu Deployment ($image, model $model, 127.0.0.1:$port)"
podman kube play "$tmp/play/pod.yaml" >"$tmp/play/play.log" 2>&1 || {
  cat "$tmp/play/play.log" >&2
  die "podman kube play failed"
}
pod="$(podman pod ps --filter "label=app.kubernetes.io/name=onebit-tts" --format '{{.Name}}' | head -n 1)"
ctr="$(podman ps -a --filter "pod=$pod" --format '{{.Names}}' | grep -v -- '-infra$' | head -n 1)"
logs() {
  echo "--- podman logs $ctr" >&2
  podman logs "$ctr" 2>&1 | tail -n 40 >&2
}
url="http://127.0.0.1:$port"
for _ in $(seq 1 120); do
  code="$(curl -s -m 5 -o "$tmp/play/health.json" -w '%{http_code}' "$url/health" || true)"
  [ "$code" = 200 ] && break
  sleep 1
done
[ "$code" = 200 ] || {
  logs
  die "/health did not answer 200 within 120 s (last: $code)"
}
echo "k8s-check: /health 200 without a key: $(head -c 300 "$tmp/play/health.json")"
body='{"model": "tts-1", "voice": "test", "input": "Hello from Kubernetes.", "response_format": "wav"}'
code="$(curl -s -m 60 -o /dev/null -w '%{http_code}' "$url/v1/audio/speech" -H 'Content-Type: application/json' -d "$body")"
[ "$code" = 401 ] || {
  logs
  die "a speech request without the key answered $code, not 401"
}
code="$(curl -s -m 120 -o "$tmp/play/out.wav" -w '%{http_code}' "$url/v1/audio/speech" \
  -H "Authorization: Bearer $key" -H 'Content-Type: application/json' -d "$body")"
if [ "$code" != 200 ] || [ "$(head -c 4 "$tmp/play/out.wav")" != RIFF ]; then
  logs
  die "synthesis answered $code: $(head -c 300 "$tmp/play/out.wav")"
fi
echo "k8s-check: POST /v1/audio/speech with the Secret's key: 200, $(stat -c %s "$tmp/play/out.wav") bytes of WAV; without it: 401"
user="$(podman exec "$ctr" id -u)"
[ "$user" = "$uid" ] || die "the server runs as uid $user, not the manifest's $uid"
! podman exec "$ctr" touch /k8s-check-probe 2>/dev/null || die "the container's root file system is writable"
podman exec "$ctr" sh -c 'touch /voices/.k8s-check && rm /voices/.k8s-check' ||
  die "the voice store is not writable by the server's user"
echo "k8s-check: the server runs as uid $user on a read-only root, the voice store writable"

# Drain: a request in flight when the pod is stopped (SIGTERM through tini) still gets its audio.
text="$(printf 'This sentence is one of many that keep the server busy while it is asked to stop. %.0s' $(seq 1 12))"
body="{\"model\": \"tts-1\", \"voice\": \"test\", \"input\": \"$text\", \"response_format\": \"wav\"}"
curl -s -m 120 -o "$tmp/play/drain.wav" -w '%{http_code}' "$url/v1/audio/speech" -H "Authorization: Bearer $key" \
  -H 'Content-Type: application/json' -d "$body" >"$tmp/play/drain.code" &
client=$!
running=0
for _ in $(seq 1 100); do
  running="$(curl -s -m 10 "$url/metrics" -H "Authorization: Bearer $key" | awk '$1 == "onebit_running" {print $2}')"
  [ "${running:-0}" != 0 ] && break
  sleep 0.1
done
[ "${running:-0}" != 0 ] || die "the long request never showed as running in /metrics"
t0=$SECONDS
# The server's container only, as the kubelet stops containers before the pod's sandbox:
# `podman pod stop` takes the infra container, and with it the network, down first.
podman stop -t 60 "$ctr" >/dev/null 2>&1
wait "$client" || true
code="$(cat "$tmp/play/drain.code")"
if [ "$code" != 200 ] || [ "$(head -c 4 "$tmp/play/drain.wav")" != RIFF ]; then
  logs
  die "the request in flight at SIGTERM answered $code, not its audio"
fi
podman logs "$ctr" >"$tmp/play/server.log" 2>&1 || true
grep -q "shutting down" "$tmp/play/server.log" || die "the server's log does not show the drain"
echo "k8s-check: a request in flight at SIGTERM finished with 200 and $(stat -c %s "$tmp/play/drain.wav") bytes of WAV; the server exited $((SECONDS - t0)) s after SIGTERM"
down
echo "k8s-check: --play passed"
