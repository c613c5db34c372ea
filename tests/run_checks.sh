#!/usr/bin/env bash
# `make test`: lint first (a second), then the test suite in the foreground and, beside it, the two
# checks that need no test process: the documentation site (`make docs`) and the installed wheel
# (`make wheel-check`). The suite leaves about a third of two cores idle (its tests wait on child
# processes, servers and sockets), which those two fill: run after the suite they added 70-80 s to a
# clean clone's `make test`, beside it about 10 s.
#
# Their output is kept in build/checks/ and printed after the suite's; a failure anywhere fails the
# run and is named in the last line.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${1:-.venv/bin/python}
JOBS=${2:-3}
LOGS=build/checks

make --no-print-directory lint || { echo "make test: lint failed (ruff, above)"; exit 1; }

# Byte-compiled once here, read by every process the suite starts (hundreds: torchrun ranks, Ray
# workers, fresh interpreters), which otherwise compile each stoker module they import again when
# the environment says PYTHONDONTWRITEBYTECODE (as CI machines often do): 1.4 CPU s once against
# up to that much a process.
"$PY" -m compileall -q -x '/(\.venv|build|\.git)/' . >/dev/null

rm -rf "$LOGS" && mkdir -p "$LOGS"
declare -A pid
for check in docs wheel-check; do
    # a session of its own, so the whole check (make, pip, the build) can be ended as one group
    setsid make --no-print-directory "$check" >"$LOGS/$check.log" 2>&1 &
    pid[$check]=$!
done
# Ctrl-C or a kill ends the background checks too, not only the suite
stop_checks() {
    for p in "${pid[@]}"; do kill -TERM -- "-$p" 2>/dev/null; done
    exit 130
}
trap stop_checks INT TERM

failed=()
"$PY" -m pytest -q -n "$JOBS" || failed+=("the test suite")
for check in docs wheel-check; do
    if wait "${pid[$check]}"; then
        echo "--- make $check: ok"
        cat "$LOGS/$check.log"
    else
        echo "--- make $check: FAILED ($LOGS/$check.log)"
        cat "$LOGS/$check.log"
        failed+=("make $check")
    fi
done
if [ ${#failed[@]} -gt 0 ]; then
    echo "make test: failed: ${failed[*]}"
    exit 1
fi
echo "make test: the suite, the site and the wheel check passed"
