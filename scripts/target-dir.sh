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
      # Without the workspace's own crates, which the copy rebuilds anyway: their fingerprints,
      # their build-script outputs, their outputs in deps/ (`<target>-<hash>`, where old test
      # binaries accumulate: about half of a directory) and the incremental-compilation caches,
      # which serve only them. A target named like a dependency keeps its files.
      _kinf_skip="$(mktemp)"
      {
        printf '%s\n' './*/incremental' './*/.fingerprint/kinf-*' './*/.fingerprint/kinfctl-*' \
          './*/build/kinf-*' './*/build/kinfctl-*'
        _kinf_deps="$(ls "$_kinf_seed"/*/.fingerprint 2>/dev/null | sed -n 's/-[0-9a-f]\{16\}$//p' |
          grep -v '^kinf' | tr - _ | sort -u || true)"
        { sed -n 's/^name = "\(.*\)"$/\1/p' ./*/Cargo.toml
          ls ./*/tests/*.rs ./*/benches/*.rs ./*/examples/*.rs 2>/dev/null | sed 's#.*/##; s/\.rs$//'
        } | tr - _ | sort -u | comm -23 - <(printf '%s\n' "$_kinf_deps") |
          sed 's#.*#./*/deps/&-*\n./*/deps/lib&-*#'
      } >"$_kinf_skip"
      mkdir -p "$CARGO_TARGET_DIR.tmp"
      tar -C "$_kinf_seed" --exclude-from="$_kinf_skip" -cf - . | tar -C "$CARGO_TARGET_DIR.tmp" -xf -
      rm -f "$_kinf_skip"
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
  unset _kinf_cache _kinf_key _kinf_seed _kinf_skip _kinf_deps
fi
mkdir -p "$CARGO_TARGET_DIR"
