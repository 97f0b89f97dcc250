#!/usr/bin/env bash
# Checks ringway's container image (scripts/build-image.sh) and runs it
# under runc, the OCI runtime under containerd and CRI-O, as the chart
# runs it:
#
#   1. the image's config is what deploy/image/Dockerfile says (entrypoint,
#      user, working directory, environment, exposed ports), and the chart's
#      default image and command name it (deploy/manifests/ringway.yaml);
#   2. `ringway --help` runs inside the container;
#   3. the image's entrypoint with no arguments (the embedded default
#      config and the built-in CA under /tmp) becomes ready: GET
#      /healthz/ready on 15021 answers 200, and SIGTERM stops it.
#
# Each run uses the bundle `umoci unpack` makes of the image, changed as
# the chart's pod spec would have it: the seccomp profile
# deploy/seccomp/ringway.json, only NET_ADMIN, SYS_ADMIN and NET_RAW, a
# read-only root with a tmpfs on /tmp, and a network namespace this
# script creates (rwimg-<pid>), so nothing binds on the host. Containers
# and the namespace are removed on exit, failed or not.
#
#   scripts/check-image.sh [<ringway binary>]
#   RINGWAY_BIN=<path> scripts/check-image.sh
#
# With a binary, it is packaged into a fresh image in a temporary
# directory; without one, build-image.sh builds the release binary and
# the image at its default place. Needs root (runc, network namespaces);
# installs umoci and runc with apt when missing. Runs every check and
# reports all failures at the end.
set -euo pipefail
. "$(dirname "$0")/lib/common.sh"
. "$(dirname "$0")/lib/checks.sh"
rerun_as_root "runc and network namespaces" "$0" "$@"
cd "$(dirname "$0")/.."

die() {
  echo "check-image.sh: $*" >&2
  exit 1
}

ringway=${1:-${RINGWAY_BIN:-}}
version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml)
[ -n "$version" ] || die "no version in Cargo.toml's [workspace.package]"
command -v python3 >/dev/null 2>&1 || die "python3 is needed"
command -v ip >/dev/null 2>&1 || die "ip (iproute2) is needed"
if ! command -v runc >/dev/null 2>&1; then
  echo "installing runc"
  { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends runc ||
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends runc; }; } >/dev/null 2>&1 ||
    die "could not install runc (apt-get install runc)"
fi

id=rwimg-$$
netns=rwimg-$$
work=$(mktemp -d)
started=()
cleanup() {
  local c
  for c in "${started[@]}"; do
    runc delete -f "$c" >/dev/null 2>&1 || true
  done
  ip netns del "$netns" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# --- the image ----------------------------------------------------------------
if [ -n "$ringway" ]; then
  [ -x "$ringway" ] || die "$ringway is not an executable file"
  oci=$work/oci
  scripts/build-image.sh --binary "$ringway" --out "$oci" || die "build-image.sh failed"
else
  scripts/build-image.sh || die "build-image.sh failed"
  oci=$(ringway_target_dir)/image/oci
fi
bundle=$work/bundle
umoci unpack --image "$oci:$version" "$bundle" >/dev/null || die "umoci could not unpack $oci:$version"

# --- 1. the image against the Dockerfile and the chart -------------------------
manifest=$(python3 -c 'import json, sys; m = json.load(open(sys.argv[1]))["manifests"]; print(m[0]["digest"].split(":")[1])' "$oci/index.json")
config=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["config"]["digest"].split(":")[1])' "$oci/blobs/sha256/$manifest")
python3 - "$oci/blobs/sha256/$config" deploy/image/Dockerfile deploy/manifests/ringway.yaml "$version" >"$work/consistency.out" <<'PY' || true
import json, re, shlex, sys

config_path, dockerfile, manifest, version = sys.argv[1:]
c = json.load(open(config_path))["config"]

# The last stage of the Dockerfile: what a docker build's image gets.
lines = open(dockerfile).read().replace("\\\n", " ").splitlines()
stages = [i for i, l in enumerate(lines) if re.match(r"\s*FROM\s", l, re.I)]
final = lines[stages[-1]:] if stages else []
want = {"entrypoint": None, "user": None, "workdir": None, "stopsignal": None, "env": {}, "ports": set()}
for l in final:
    m = re.match(r"\s*(\w+)\s+(.*)", l)
    if not m:
        continue
    op, rest = m.group(1).upper(), m.group(2).strip()
    if op == "ENTRYPOINT":
        want["entrypoint"] = json.loads(rest)
    elif op == "USER":
        want["user"] = rest
    elif op == "STOPSIGNAL":
        want["stopsignal"] = rest
    elif op == "WORKDIR":
        want["workdir"] = rest
    elif op == "ENV":
        for word in shlex.split(rest):
            k, _, v = word.partition("=")
            want["env"][k] = v
    elif op == "EXPOSE":
        for p in rest.split():
            want["ports"].add(p if "/" in p else p + "/tcp")

def check(what, image, docker):
    if image == docker:
        print(f"OK image and Dockerfile agree on {what}: {image}")
    else:
        print(f"FAIL image and Dockerfile differ on {what}: image {image!r}, Dockerfile {docker!r}")

check("the entrypoint", c.get("Entrypoint"), want["entrypoint"])
check("the user", c.get("User"), want["user"])
check("the working directory", c.get("WorkingDir", "/"), want["workdir"] or "/")
check("the stop signal", c.get("StopSignal"), want["stopsignal"])
image_env = dict(e.split("=", 1) for e in c.get("Env", []))
for k, v in want["env"].items():
    check(f"${k}", image_env.get(k), v)
extra = sorted(k for k in image_env if k not in want["env"] and k != "PATH")
if extra:
    print(f"FAIL the image sets {' '.join(extra)}, the Dockerfile does not")
check("the exposed ports", sorted(c.get("ExposedPorts", {})), sorted(want["ports"]))
need = {f"{p}/tcp" for p in (15001, 15006, 15008, 15020, 15021, 15053, 15080)} | {"15053/udp"}
missing = need - set(c.get("ExposedPorts", {}))
if missing:
    print(f"FAIL the image does not expose {' '.join(sorted(missing))}")
else:
    print("OK the image exposes ringway's ports (15001 15006 15008 15020 15021 15053 tcp+udp 15080)")

# The chart's default render: image ringway:<version>, command = entrypoint.
text = open(manifest).read()
images = re.findall(r'^\s+image: "?([^"\s]+)"?\s*$', text, re.M)
if images == [f"ringway:{version}"]:
    print(f"OK the chart's default image is ringway:{version}, the image build-image.sh makes")
else:
    print(f"FAIL the chart's default image is {images}, not ['ringway:{version}']")
m = re.search(r"^(\s+)command:\n((?:\1  - .*\n)+)", text, re.M)
command = [x.strip()[2:].strip('"') for x in m.group(2).splitlines()] if m else None
if command == c.get("Entrypoint"):
    print(f"OK the chart's command is the image's entrypoint: {command}")
else:
    print(f"FAIL the chart's command {command} is not the image's entrypoint {c.get('Entrypoint')}")
PY
report_lines "$work/consistency.out" "the image/Dockerfile/chart comparison"

# --- the bundle as the chart's pod spec would run it ---------------------------
ip netns add "$netns" || die "cannot create network namespace $netns"
ip -n "$netns" link set lo up
entrypoint=$(python3 -c 'import json, sys; print(json.dumps(json.load(open(sys.argv[1]))["process"]["args"]))' "$bundle/config.json")
cp "$bundle/config.json" "$work/config.image.json"
# configure <args as JSON>: config.json from the image's, with the chart's
# security settings and the test's network namespace.
configure() {
  python3 - "$work/config.image.json" "$bundle/config.json" deploy/seccomp/ringway.json "/var/run/netns/$netns" "$1" <<'PY'
import json, sys
src, dst, profile_path, netns, args = sys.argv[1:]
c = json.load(open(src))
c["process"].update(terminal=False, args=json.loads(args), noNewPrivileges=False)
caps = ["CAP_NET_ADMIN", "CAP_SYS_ADMIN", "CAP_NET_RAW"]
c["process"]["capabilities"] = {k: caps for k in ("bounding", "effective", "permitted")}
c["root"]["readonly"] = True
c["hostname"] = "rwimg"
c["mounts"].append({"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev", "mode=1777"]})
c["linux"]["seccomp"] = json.load(open(profile_path))
for ns in c["linux"]["namespaces"]:
    if ns["type"] == "network":
        ns["path"] = netns
json.dump(c, open(dst, "w"), indent=1)
PY
}

# --- 2. ringway --help in the container ----------------------------------------
configure "$(python3 -c 'import json, sys; print(json.dumps(json.loads(sys.argv[1]) + ["--help"]))' "$entrypoint")"
started+=("$id-help")
if out=$(cd "$bundle" && timeout 30 runc run "$id-help" 2>&1) && grep -q "^Usage: ringway" <<<"$out"; then
  ok "ringway --help runs in the image under runc (seccomp profile, chart capabilities, read-only root)"
else
  fail "ringway --help in the image under runc: $(tail -5 <<<"$out")"
fi
runc delete -f "$id-help" >/dev/null 2>&1 || true

# --- 3. the embedded default becomes ready ---------------------------------
configure "$entrypoint"
started+=("$id-run")
(cd "$bundle" && runc run -d "$id-run" >"$work/run.log" 2>&1 </dev/null) ||
  fail "runc could not start the image's entrypoint: $(tail -5 "$work/run.log")"
code=""
t0=$(date +%s)
deadline=$((t0 + 60))
while [ "$(date +%s)" -lt "$deadline" ]; do
  code=$(ip netns exec "$netns" python3 -c '
import sys, urllib.request, urllib.error
try:
    print(urllib.request.urlopen("http://127.0.0.1:15021/healthz/ready", timeout=2).status)
except urllib.error.HTTPError as e:
    print(e.code)
except Exception:
    print("none")' 2>/dev/null) || code=none
  [ "$code" = 200 ] && break
  state=$(runc state "$id-run" 2>/dev/null | python3 -c 'import json, sys; print(json.load(sys.stdin)["status"])' 2>/dev/null) || state=gone
  [ "$state" = running ] || break
  sleep 0.5
done
if [ "$code" = 200 ]; then
  ok "the image's entrypoint on the embedded default is ready in $(($(date +%s) - t0)) s: /healthz/ready on 15021 answers 200"
else
  fail "the image's entrypoint did not become ready (last answer: $code, container: ${state:-?}); its log: $(tail -8 "$work/run.log")"
fi
# The CA's root was written where the image's environment says.
if grep -q "root CA.*dir=/tmp/ringway-ca" "$work/run.log"; then
  ok "the built-in CA keeps its root in /tmp/ringway-ca (RINGWAY_CA_DIR) under the read-only root"
else
  fail "the log does not say the built-in CA is in /tmp/ringway-ca: $(grep -i 'ca' "$work/run.log" | tail -3)"
fi
# Kubernetes stops the container with the image's stop signal.
runc kill "$id-run" TERM >/dev/null 2>&1 || true
stopped=""
for _ in $(seq 1 40); do
  state=$(runc state "$id-run" 2>/dev/null | python3 -c 'import json, sys; print(json.load(sys.stdin)["status"])' 2>/dev/null) || state=gone
  if [ "$state" != running ]; then
    stopped=yes
    break
  fi
  sleep 0.25
done
if [ -n "$stopped" ]; then
  ok "SIGTERM stops the container within 10 s"
else
  fail "the container still runs 10 s after SIGTERM"
fi

checks_summary "image check"
