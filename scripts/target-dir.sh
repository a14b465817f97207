# Sourced by scripts/test.sh and scripts/demo.sh (from the repository root): sets
# CARGO_TARGET_DIR, unless already set, to a build directory outside the checkout, one per
# checkout path, under ~/.cache/kinference.
#
# One per path, because cargo reuses a workspace crate's artifacts across checkouts at different
# paths (its fingerprints are relative to the workspace root) while they embed the path they
# were built at (`env!("CARGO_MANIFEST_DIR")` in tests and build scripts): a shared directory
# ran tests built for another checkout. A new checkout starts from a copy of the most recently
# used directory with the workspace's own crates forgotten, so only the dependencies are reused.
if [[ -z "${CARGO_TARGET_DIR:-}" ]]; then
  _kinf_cache="$HOME/.cache/kinference"
  _kinf_key="$(printf %s "$PWD" | sha256sum | cut -c1-12)"
  CARGO_TARGET_DIR="$_kinf_cache/target-$_kinf_key"
  if [[ ! -d "$CARGO_TARGET_DIR" ]]; then
    _kinf_seed="$(ls -dt "$_kinf_cache"/target-* "$_kinf_cache"/target 2>/dev/null | head -n 1 || true)"
    if [[ -n "$_kinf_seed" && -d "$_kinf_seed" ]]; then
      echo "build directory: $CARGO_TARGET_DIR (dependencies copied from $_kinf_seed)"
      # Without the incremental-compilation caches: they serve only the workspace's own
      # crates, which the copy rebuilds anyway, and they are most of a directory's size.
      mkdir -p "$CARGO_TARGET_DIR.tmp"
      tar -C "$_kinf_seed" --exclude='./*/incremental' -cf - . | tar -C "$CARGO_TARGET_DIR.tmp" -xf -
      rm -rf "$CARGO_TARGET_DIR.tmp"/*/.fingerprint/kinf-* "$CARGO_TARGET_DIR.tmp"/*/.fingerprint/kinfctl-*
      mv "$CARGO_TARGET_DIR.tmp" "$CARGO_TARGET_DIR"
    fi
    # Keep the two most recently used build directories (about 8 GB each), and drop the single
    # shared one of earlier versions of this script.
    # (`|| true`: on a machine without any, `ls` fails, and callers run under `pipefail`.)
    { ls -dt "$_kinf_cache"/target-* 2>/dev/null || true; } | tail -n +3 | xargs -r rm -rf
    rm -rf "$_kinf_cache/target"
  fi
  touch "$CARGO_TARGET_DIR" 2>/dev/null || true
  export CARGO_TARGET_DIR
  unset _kinf_cache _kinf_key _kinf_seed
fi
mkdir -p "$CARGO_TARGET_DIR"
