#!/usr/bin/env bash
# Checks the Kubernetes deployment material under deploy/:
#
#   1. every manifest in deploy/manifests/ and fresh renders of the Helm
#      chart (default values and a set of non-default ones) validate
#      against Kubernetes' schemas in strict mode (unknown fields fail);
#   2. the committed deploy/manifests/ringway.yaml is exactly what
#      scripts/render-manifests.sh renders now (no drift from the chart);
#   3. every --flag and every environment variable the manifests give the
#      ringway container is one that `ringway --help` lists (or one of the
#      few variables ringway reads outside its flags, listed below);
#   4. deploy/seccomp/ringway.json is a seccomp profile that blocks by
#      default and allows io_uring, setns and the syscalls ringway makes;
#   5. as root: under runc with that profile and the chart's capabilities,
#      ringway starts and setns works (installs runc with apt if missing).
#
#   scripts/check-deploy.sh <path to the ringway binary>
#   RINGWAY_BIN=<path> scripts/check-deploy.sh
#
# Installs what it needs when missing, pinned: kubernetes-validate from
# PyPI (into target/tools, not the system's Python) and helm (see
# scripts/render-manifests.sh). Fails, rather than skipping, when it
# cannot. Runs every check and reports all failures at the end.
set -euo pipefail
. "$(dirname "$0")/lib/checks.sh"
cd "$(dirname "$0")/.."

KUBERNETES_VALIDATE_VERSION=1.37.0
# Kubernetes versions to validate against: the oldest one the chart is
# meant for and a recent one.
K8S_VERSIONS=(1.30.0 1.35.0)

die() {
  echo "check-deploy.sh: $*" >&2
  exit 1
}

ringway=${1:-${RINGWAY_BIN:-}}
[ -n "$ringway" ] ||
  die "no ringway binary: pass its path (or set RINGWAY_BIN), e.g. after 'cargo build -p ringway-dataplane --bin ringway': target/debug/ringway"
[ -x "$ringway" ] || die "$ringway is not an executable file"
command -v python3 >/dev/null 2>&1 || die "python3 is needed (apt-get install python3 python3-pip)"

tools=${RINGWAY_TOOLS_DIR:-$(pwd)/target/tools}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# --- tools ---------------------------------------------------------------
pyver=$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
kv_dir=$tools/kubernetes-validate-$KUBERNETES_VALIDATE_VERSION-py$pyver
kv() {
  PYTHONPATH=$kv_dir python3 -m kubernetes_validate "$@"
}
if ! kv --version 2>/dev/null | grep -qx "$KUBERNETES_VALIDATE_VERSION"; then
  python3 -m pip --version >/dev/null 2>&1 ||
    die "pip is needed to install kubernetes-validate (apt-get install python3-pip)"
  echo "installing kubernetes-validate $KUBERNETES_VALIDATE_VERSION into $kv_dir"
  rm -rf "$kv_dir"
  # --target: a private directory, so neither the system's Python nor a
  # distribution's "externally managed" rule is involved.
  PIP_ROOT_USER_ACTION=ignore python3 -m pip install --quiet --disable-pip-version-check --target "$kv_dir" \
    "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION" ||
    die "pip could not install kubernetes-validate==$KUBERNETES_VALIDATE_VERSION from PyPI"
  kv --version 2>/dev/null | grep -qx "$KUBERNETES_VALIDATE_VERSION" ||
    die "kubernetes-validate does not run after installing it into $kv_dir"
fi
helm=$(scripts/render-manifests.sh --helm) || die "could not obtain helm (see the message above)"
echo "using $helm ($("$helm" version --template '{{.Version}}')), kubernetes-validate $KUBERNETES_VALIDATE_VERSION, $ringway"

# --- renders -------------------------------------------------------------
scripts/render-manifests.sh --stdout >"$work/default.yaml" || die "rendering the chart failed"
# The branches the defaults do not take.
if "$helm" template ringway deploy/helm/ringway --namespace istio-system \
  --set revision=canary --set caAddress=ca.example:15012 \
  --set xdsAddress=https://xds.example:15012 --set global.network=net1 \
  --set multiCluster.clusterName=c1 --set logAsJson=true --set logLevel=debug \
  --set pin=true --set cores=0-3 --set seccompProfile.type=RuntimeDefault \
  --set image=registry.example/ringway:dev --set imagePullPolicy=Always \
  --set 'imagePullSecrets[0]=pull' --set labels.team=mesh \
  --set annotations.note=x --set podLabels.extra=y --set env.RINGWAY_COPY_MODE=copy \
  --set nodeSelector.pool=mesh --set seLinuxOptions.type=spc_t \
  --set resources.limits.cpu=2 >"$work/custom.yaml" 2>"$work/custom.err"; then
  ok "chart renders with non-default values"
else
  fail "chart does not render with non-default values: $(cat "$work/custom.err")"
fi
if "$helm" template ringway deploy/helm/ringway --namespace istio-system \
  --set pin=false --set cores=2 --set inpod.enabled=false \
  --set seccompProfile.type=Unconfined >"$work/custom2.yaml" 2>"$work/custom2.err"; then
  ok "chart renders with in-pod mode off, --no-pin and an unconfined seccomp profile"
else
  fail "chart does not render with inpod.enabled=false: $(cat "$work/custom2.err")"
fi
if "$helm" template ringway deploy/helm/ringway --set pin=sometimes >/dev/null 2>&1; then
  fail "chart accepts pin=sometimes (must be auto, true or false)"
else
  ok "chart refuses a pin value other than auto, true or false"
fi

# --- 1. schemas ------------------------------------------------------------
kflags=()
for v in "${K8S_VERSIONS[@]}"; do kflags+=(-k "$v"); done
shopt -s nullglob
manifests=(deploy/manifests/*.yaml deploy/manifests/*.yml)
shopt -u nullglob
[ ${#manifests[@]} -gt 0 ] || fail "no manifests in deploy/manifests/"
for f in "${manifests[@]}" "$work/default.yaml" "$work/custom.yaml" "$work/custom2.yaml"; do
  case "$f" in
    "$work"/*) name="fresh render ${f#"$work"/}" ;;
    *) name=$f ;;
  esac
  if kv --strict --quiet "${kflags[@]}" "$f" >"$work/kv.out" 2>&1; then
    ok "$name is valid Kubernetes ${K8S_VERSIONS[*]} (strict)"
  else
    fail "$name does not validate: $(cat "$work/kv.out")"
  fi
done

# --- 2. drift ------------------------------------------------------------
if [ ! -f deploy/manifests/ringway.yaml ]; then
  fail "deploy/manifests/ringway.yaml is missing: run scripts/render-manifests.sh"
elif cmp -s deploy/manifests/ringway.yaml "$work/default.yaml"; then
  ok "deploy/manifests/ringway.yaml equals a fresh render of the chart"
else
  fail "deploy/manifests/ringway.yaml differs from a fresh render; run scripts/render-manifests.sh and commit it:
$(diff -u deploy/manifests/ringway.yaml "$work/default.yaml" | head -40)"
fi

# --- 3. flags and environment against ringway --help --------------------
if ! "$ringway" --help >"$work/help.txt" 2>&1; then
  fail "$ringway --help failed: $(cat "$work/help.txt")"
fi
PYTHONPATH=$kv_dir python3 - "$work/help.txt" "${manifests[@]}" \
  "$work/default.yaml" "$work/custom.yaml" "$work/custom2.yaml" >"$work/flags.out" <<'PY' || true
import re, sys, yaml

help_text = open(sys.argv[1]).read()
# Option lines of clap's long help: "  -h, --help", "      --cores <CORES>".
flags = set(re.findall(r"^\s+(?:-\w, )?(--[a-z0-9][a-z0-9-]*)", help_text, re.M))
envs = set(re.findall(r"\[env: ([A-Za-z_][A-Za-z0-9_]*)=", help_text))
# ztunnel's variables ringway reads besides its flags' own (the end of
# `ringway --help`, from dataplane/src/app/ztunnel_env.rs).
for line in re.findall(r"^\s+honoured: (.*)$", help_text, re.M):
    envs |= {v for v in line.split() if not v.endswith("*")}

# Variables ringway reads outside its flags, and where.
OUTSIDE_FLAGS = {
    "POD_NAME": "xDS node identity (controlplane-client NodeInfo::from_env)",
    "POD_NAMESPACE": "xDS node identity (controlplane-client NodeInfo::from_env)",
    "INSTANCE_IP": "xDS node identity (controlplane-client NodeInfo::from_env)",
    "RUST_LOG": "log filter (tracing EnvFilter)",
    "RUST_BACKTRACE": "Rust runtime",
}
OUTSIDE_PREFIXES = ("ISTIO_META_", "ISTIO_METAJSON_")

for path in sys.argv[2:]:
    name = path.rsplit("/", 1)[-1]
    containers = []
    for doc in yaml.safe_load_all(open(path)):
        if not isinstance(doc, dict):
            continue
        spec = doc.get("spec", {}).get("template", {}).get("spec", {})
        for c in spec.get("containers", []) + spec.get("initContainers", []):
            cmd = (c.get("command") or [])[:1]
            if c.get("name") == "ringway" or any(x.endswith("ringway") for x in cmd):
                containers.append((doc.get("metadata", {}).get("name"), c))
    if not containers:
        print(f"FAIL {name}: no ringway container found")
        continue
    for owner, c in containers:
        where = f"{name} ({owner}/{c['name']})"
        words = (c.get("command") or [])[1:] + (c.get("args") or [])
        used = [w.split("=", 1)[0] for w in words if w.startswith("--")]
        if not used:
            print(f"FAIL {where}: passes no --flags at all")
        bad = 0
        for flag in used:
            if flag not in flags:
                bad += 1
                print(f"FAIL {where}: {flag} is not a flag of this ringway (not in ringway --help)")
        names = [e["name"] for e in c.get("env") or []]
        for var in names:
            if var in envs or var in OUTSIDE_FLAGS or var.startswith(OUTSIDE_PREFIXES):
                continue
            bad += 1
            print(f"FAIL {where}: env {var} is not read by this ringway (not in ringway --help)")
        if not bad:
            print(f"OK {where}: ringway --help knows its {len(used)} flags and {len(names)} env vars ({' '.join(used + names)})")
PY
report_lines "$work/flags.out" "the flag check"
# The variables ringway is said to read outside its flags must still be
# read by the source.
for var in POD_NAME POD_NAMESPACE INSTANCE_IP; do
  if grep -rqs "\"$var\"" controlplane-client/src dataplane/src; then
    ok "the source still reads $var"
  else
    fail "no source file reads \"$var\" any more: update the list in scripts/check-deploy.sh and the chart"
  fi
done

# --- 4. seccomp profile ----------------------------------------------------
python3 - deploy/seccomp/ringway.json >"$work/seccomp.out" <<'PY' || true
import json, sys

path = sys.argv[1]
try:
    profile = json.load(open(path))
except (OSError, ValueError) as e:
    print(f"FAIL {path} is not valid JSON: {e}")
    sys.exit()
print(f"OK {path} is valid JSON")
if profile.get("defaultAction") == "SCMP_ACT_ERRNO":
    print(f"OK {path} refuses what it does not list (defaultAction SCMP_ACT_ERRNO)")
else:
    print(f"FAIL {path}: defaultAction is {profile.get('defaultAction')!r}, not SCMP_ACT_ERRNO")
# Allowed whatever the arguments, capabilities or architecture.
allowed = set()
for rule in profile.get("syscalls", []):
    if rule.get("action") != "SCMP_ACT_ALLOW" or rule.get("args") or rule.get("includes") or rule.get("excludes"):
        continue
    allowed.update(rule.get("names", []))
    if rule.get("name"):
        allowed.add(rule["name"])
denied = set()
for rule in profile.get("syscalls", []):
    if rule.get("action") != "SCMP_ACT_ALLOW":
        denied.update(rule.get("names", []))
need = {
    "io_uring": ["io_uring_setup", "io_uring_enter", "io_uring_register"],
    "in-pod mode": ["setns"],
    # Seen in an strace of ringway's start, serving and shutdown, plus
    # the calls of paths that run outside io_uring.
    "ringway": """accept4 bind clone clone3 close connect epoll_create1 epoll_ctl
        epoll_wait eventfd2 exit exit_group fcntl fsync futex getrandom getsockname
        getsockopt ioctl listen madvise mmap mprotect munmap newfstatat openat pipe2
        poll prctl prlimit64 read recvfrom recvmsg rseq rt_sigaction rt_sigprocmask
        sched_getaffinity sched_setaffinity sched_yield sendmsg sendto
        set_robust_list setrlimit setsockopt shutdown sigaltstack socketpair splice
        statx write writev""".split(),
}
for why, names in need.items():
    missing = [n for n in names if n not in allowed or n in denied]
    if missing:
        print(f"FAIL {path} does not allow, unconditionally, what {why} needs: {' '.join(missing)}")
    else:
        print(f"OK {path} allows what {why} needs: {' '.join(names) if len(names) < 5 else str(len(names)) + ' syscalls'}")
socket_rules = [r for r in profile.get("syscalls", []) if "socket" in r.get("names", []) and r.get("action") == "SCMP_ACT_ALLOW"]
if socket_rules:
    print(f"OK {path} allows socket")
else:
    print(f"FAIL {path} does not allow socket")
PY
report_lines "$work/seccomp.out" "the seccomp check"

# --- 5. the seccomp profile applied by a real runtime ----------------------
# runc, the OCI runtime under containerd and CRI-O, runs ringway with the
# profile and the chart's capabilities on a read-only root: ringway must
# start, enter another network namespace (setns), and, as a control that
# the profile is in force, fail to start once io_uring is taken out of it.
if [ "$(id -u)" -ne 0 ]; then
  echo "NOT RUN: the seccomp profile under runc (needs root)"
else
  if ! command -v runc >/dev/null 2>&1; then
    echo "installing runc"
    { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends runc ||
      { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends runc; }; } >/dev/null 2>&1 ||
      die "could not install runc (apt-get install runc)"
  fi
  bundle=$work/bundle
  mkdir -p "$bundle/rootfs"/{bin,tmp,proc,dev,sys}
  cp "$ringway" "$bundle/rootfs/bin/ringway"
  nsenter=$(command -v nsenter) || die "nsenter (util-linux) is needed for the setns check"
  cp "$nsenter" "$bundle/rootfs/bin/nsenter"
  # The shared libraries both load (one ldd per file: with two it adds
  # "file:" headers).
  for lib in $({ ldd "$ringway" || true; ldd "$nsenter" || true; } | grep -o '/[^ ]*' | sort -u); do
    mkdir -p "$bundle/rootfs$(dirname "$lib")"
    cp -L "$lib" "$bundle/rootfs$lib"
  done
  (cd "$bundle" && runc spec) || die "runc spec failed"
  # run_in_runc <name> <variant: as-is|no-io_uring> <args...>: the output
  run_in_runc() {
    local name=$1 variant=$2
    shift 2
    python3 - "$bundle/config.json" deploy/seccomp/ringway.json "$variant" "$@" <<'PY'
import json, sys
config_path, profile_path, variant, args = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
c = json.load(open(config_path))
profile = json.load(open(profile_path))
if variant == "no-io_uring":
    profile["syscalls"] = [r for r in profile["syscalls"] if "io_uring_setup" not in r.get("names", [])]
c["process"].update(terminal=False, args=args, noNewPrivileges=False)
caps = ["CAP_NET_ADMIN", "CAP_SYS_ADMIN", "CAP_NET_RAW"]
c["process"]["capabilities"] = {k: caps for k in ("bounding", "effective", "permitted")}
c["root"]["readonly"] = True
c["mounts"].append({"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev"]})
c["linux"]["seccomp"] = profile
json.dump(c, open(config_path, "w"))
PY
    (cd "$bundle" && timeout -s TERM 5 runc run "$name" 2>&1) || true
    runc delete -f "$name" >/dev/null 2>&1 || true
  }
  id=ringway-check-$$
  listen=(--cores 1 --ca-dir /tmp/ca --outbound-addr 127.0.0.1:0
    --inbound-passthrough-addr 127.0.0.1:0 --inbound-addr 127.0.0.1:0
    --readiness-addr 127.0.0.1:0 --stats-addr 127.0.0.1:0 --admin-addr 127.0.0.1:0)
  # ringway runs until `timeout` stops it; "ready" is what counts.
  out=$(run_in_runc "$id-a" as-is /bin/ringway "${listen[@]}")
  if grep -q "ringway ready" <<<"$out"; then
    ok "under runc with deploy/seccomp/ringway.json and the chart's capabilities, ringway starts"
  else
    fail "under runc with deploy/seccomp/ringway.json, ringway did not start: $(tail -5 <<<"$out")"
  fi
  out=$(run_in_runc "$id-b" as-is /bin/nsenter --net=/proc/1/ns/net /bin/ringway --version)
  if grep -q "^ringway " <<<"$out"; then
    ok "under runc with deploy/seccomp/ringway.json, setns into another network namespace works"
  else
    fail "under runc with deploy/seccomp/ringway.json, setns failed: $(tail -3 <<<"$out")"
  fi
  out=$(run_in_runc "$id-c" no-io_uring /bin/ringway "${listen[@]}")
  if grep -q "io_uring_setup is not permitted" <<<"$out"; then
    ok "runc applies the profile: without its io_uring entry ringway refuses to start, naming seccomp"
  else
    fail "without the io_uring entry ringway should fail on io_uring_setup under runc, but: $(tail -3 <<<"$out")"
  fi
fi

checks_summary "deploy check"
