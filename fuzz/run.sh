#!/usr/bin/env bash
# Runs fuzz targets one after another for SECONDS each (default 60) on the kept corpus:
#   fuzz/run.sh [SECONDS] [TARGET...]        (no target: all of them)
# New inputs that reach new code are added to corpus/TARGET; a crash stops that target with
# its input in artifacts/TARGET and this script's status non-zero. Needs cargo-fuzz and a
# compiler that takes -Z flags (nightly; or stable with RUSTC_BOOTSTRAP=1 and SANITIZER=none).
set -uo pipefail
cd "$(dirname "$0")"
seconds=${1:-60}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  mapfile -t targets < <(cargo fuzz list)
fi
toolchain=${FUZZ_TOOLCHAIN:-+nightly}
sanitizer=${SANITIZER:-address}
# Build once, then run the binaries: edits to the sources while a long run goes on do not
# change what is being fuzzed halfway.
# FUZZ_NO_BUILD=1: run the binaries already in FUZZ_BIN_DIR (a second run beside a first).
bin_dir=${FUZZ_BIN_DIR:-$(mktemp -d)}
if [ -z "${FUZZ_NO_BUILD:-}" ]; then
  cargo $toolchain fuzz build -s "$sanitizer" -O || exit 1
  for t in "${targets[@]}"; do cp "target/x86_64-unknown-linux-gnu/release/$t" "$bin_dir/"; done
fi
status=0
for t in "${targets[@]}"; do
  mkdir -p "corpus/$t" "artifacts/$t"
  before=$(ls "corpus/$t" | wc -l)
  log=$(mktemp)
  # -rss_limit_mb: a decoder that allocates past 2 GiB on a small input is a finding too.
  if "$bin_dir/$t" "corpus/$t" \
      -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 \
      -artifact_prefix="artifacts/$t/" >"$log" 2>&1; then
    result=ok
  else
    result=FAILED
    status=1
    grep -E "panicked|ERROR|SUMMARY|Test unit written" "$log" | head -5
  fi
  runs=$(grep -oE '#[0-9]+' "$log" | tail -1)
  echo "$t: $result, ${seconds}s, ${runs:-#0} runs, corpus $before -> $(ls "corpus/$t" | wc -l)"
  rm -f "$log"
done
exit $status
