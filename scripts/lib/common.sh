# Shared by the scripts in scripts/; sourced, not run:
#
#   . "$(dirname "$0")/lib/common.sh"
#   rerun_as_root "what root is for" "$0" "$@"   # before any cd
#   ringway_target_dir                            # cargo's target directory

# rerun_as_root WHY SCRIPT [ARGS...]
#
# Returns when this is root. Otherwise re-runs SCRIPT with ARGS under sudo
# and does not return. What the scripts and cargo read from the
# environment goes along (sudo would reset it): PATH, so that cargo and
# rustup are found (sudo's secure_path leaves out ~/.cargo/bin), with the
# sbin directories added where it lacks them, and every
# CARGO_*, RUSTUP_*, RUST_*, RUSTFLAGS, RUSTC*, RINGWAY and RINGWAY_*
# variable (CARGO_TARGET_DIR, RINGWAY_ZTUNNEL, ...). CARGO_HOME and
# RUSTUP_HOME, when unset, are set to this user's ~/.cargo and ~/.rustup
# if they exist, so that root runs the same toolchain instead of looking
# in its own home. sudo keeps the working directory, so relative paths in
# those variables keep their meaning. Without sudo it stops with a clear
# message.
rerun_as_root() {
  local why=$1 script=$2
  shift 2
  if [ "$(id -u)" -eq 0 ]; then
    return 0
  fi
  local name
  name=$(basename "$script")
  if ! command -v sudo >/dev/null 2>&1; then
    echo "scripts/$name: needs root ($why); this is uid $(id -u) and sudo is not installed: run it as root" >&2
    exit 1
  fi
  script=$(readlink -f "$script")
  # The user's PATH first (cargo, rustup), then root's usual directories,
  # which a user's PATH often lacks (nft, iptables and ip live in sbin).
  local path=$PATH dir var
  for dir in /usr/local/sbin /usr/local/bin /usr/sbin /usr/bin /sbin /bin; do
    case ":$path:" in
      *":$dir:"*) ;;
      *) path=$path:$dir ;;
    esac
  done
  local keep=("PATH=$path")
  if [ -z "${CARGO_HOME:-}" ] && [ -d "${HOME:-}/.cargo" ]; then
    keep+=("CARGO_HOME=$HOME/.cargo")
  fi
  if [ -z "${RUSTUP_HOME:-}" ] && [ -d "${HOME:-}/.rustup" ]; then
    keep+=("RUSTUP_HOME=$HOME/.rustup")
  fi
  while IFS= read -r var; do
    case $var in
      CARGO_* | RUSTUP_* | RUST_* | RUSTFLAGS | RUSTDOCFLAGS | RUSTC | RUSTC_* | RINGWAY | RINGWAY_*)
        keep+=("$var=${!var}")
        ;;
    esac
  done < <(compgen -e)
  echo "scripts/$name: not root (uid $(id -u)): re-running under sudo, since it needs root ($why)" >&2
  exec sudo -- env "${keep[@]}" bash "$script" "$@"
}

# ringway_target_dir: cargo's target directory for this workspace, as an
# absolute path: $CARGO_TARGET_DIR when set (relative to the working
# directory, as cargo reads it), else build.target-dir from cargo's
# config, else target/ in the workspace. Asks cargo, so it agrees with
# where `cargo build` just put the binaries.
ringway_target_dir() {
  local meta dir
  meta=$(cargo metadata --format-version 1 --no-deps) || return 1
  dir=$(sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p' <<<"$meta")
  if [ -z "$dir" ]; then
    echo "no target_directory in cargo metadata's output" >&2
    return 1
  fi
  printf '%s\n' "$dir"
}
