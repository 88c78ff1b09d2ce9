#!/usr/bin/env bash
# What the failing tests of a `cargo test` log said (their panics and
# stdout), at most 60 lines each, then their names: printed last by
# `just test`, so a CI log shown by its ends still tells why it failed.
set -euo pipefail
log=${1:?usage: tests/failures.sh CARGO_TEST_LOG}
awk '
    /^---- .* stdout ----$/ { inside = 1; lines = 0; print; next }
    /^failures:$/ && inside { inside = 0 }
    /^test result:/ { inside = 0 }
    inside && lines < 60 { print; lines++; next }
    inside && lines == 60 { print "    [... cut at 60 lines]"; lines++ }
' "$log"
echo "failed tests:"
grep -E '^test .* \.\.\. FAILED$' "$log" | sed 's/^test /    /; s/ \.\.\. FAILED$//' || echo "    (none named: see the log above)"
