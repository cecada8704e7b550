#!/usr/bin/env bash
# The short fuzz run of `.ci/run`: builds every target on the stable compiler (coverage
# instrumentation only, no sanitizer: RUSTC_BOOTSTRAP lets cargo-fuzz pass its -Z flags) and
# runs each for a few seconds from the corpus kept in the repository, so the targets keep
# building and the corpus keeps passing. New inputs go to a scratch directory, not the
# repository. A crash fails the run; missing tools (no cargo-fuzz and no registry to install it
# from) skip it with a message.
set -uo pipefail
cd "$(dirname "$0")"
seconds=${FUZZ_CI_SECONDS:-5}

if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "== installing cargo-fuzz"
  if ! cargo install --locked --quiet cargo-fuzz --version 0.13.2; then
    echo "fuzz: SKIPPED (cargo-fuzz is not installed and could not be installed)"
    exit 0
  fi
fi

export RUSTC_BOOTSTRAP=1
cargo fuzz build -s none -O --target-dir target/ci || exit 1
bin_dir=target/ci/x86_64-unknown-linux-gnu/release
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
status=0
for t in $(cargo fuzz list); do
  mkdir -p "$scratch/$t" "$scratch/artifacts-$t"
  log="$scratch/$t.log"
  # First directory: where new inputs go; second: the kept corpus, read only.
  if "$bin_dir/$t" "$scratch/$t" "corpus/$t" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 \
      -artifact_prefix="$scratch/artifacts-$t/" >"$log" 2>&1; then
    echo "fuzz $t: ok, $(grep -oE '#[0-9]+' "$log" | tail -1) runs"
  else
    status=1
    echo "fuzz $t: FAILED"
    grep -E -A20 "panicked|ERROR|SUMMARY" "$log" | head -40
    for a in "$scratch/artifacts-$t"/*; do
      [ -f "$a" ] && { echo "input ($a), base64:"; base64 -w0 "$a" | head -c 4000; echo; }
    done
  fi
done
exit $status
