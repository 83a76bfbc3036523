#!/usr/bin/env bash
# The adversarial suite N times in a row under a CPU burn (issue 27's "done when": five green runs
# in a row under a 2-core burn). Not part of CI (each run is minutes); run it as root, by hand:
#
#     sudo scripts/adversarial-under-burn.sh            # 5 runs, 2 burners
#     RUNS=3 BURNERS=4 scripts/adversarial-under-burn.sh tests/adversarial/test_dns.py
#
# Rules:
# 1. Bounded: every pytest run is cut at RUN_SECONDS (SIGINT, so its fixtures still stop their
#    servers and remove their namespaces; SIGKILL 120 s later), and each burner exits by itself
#    after the whole budget (RUNS x RUN_SECONDS), so nothing outlives this script.
# 2. The burners are busy processes of our own (stress-ng when installed, else a bare Python loop),
#    started here and stopped by their PIDs on every exit path; nothing is killed by name.
# 3. Stops at the first run that is not green and exits with its status; the per-run summary
#    (pytest's counts, seconds, load average before and after) goes to stdout and to
#    $LOG_DIR/summary.txt, each run's whole output to $LOG_DIR/run-N.log.
# Arguments are pytest's: test paths replace the selection (default tests/adversarial), options
# are added (`-x`, `-k EXPR`).
set -uo pipefail
cd "$(dirname "$0")/.."

RUNS=${RUNS:-5}
BURNERS=${BURNERS:-2}
RUN_SECONDS=${RUN_SECONDS:-3600}  # the suite took over 20 min at load average 14
LOG_DIR=${LOG_DIR:-$(mktemp -d /tmp/adversarial-under-burn.XXXXXX)}
selection=("$@")
names_a_path=0
for arg in "$@"; do [ -e "${arg%%::*}" ] && names_a_path=1; done
[ $names_a_path -eq 0 ] && selection=(tests/adversarial "$@")  # only options: the whole suite

if [ "$(id -u)" -ne 0 ]; then
    echo "adversarial-under-burn: the adversarial suite needs root (namespaces, nftables); run it with sudo" >&2
    exit 2
fi

budget=$((RUNS * (RUN_SECONDS + 120) + 60))
burner_pids=()
stop_burn() {
    for pid in "${burner_pids[@]}"; do kill "$pid" 2>/dev/null; done
    for pid in "${burner_pids[@]}"; do wait "$pid" 2>/dev/null; done
    burner_pids=()
}
trap stop_burn EXIT
trap 'exit 130' INT TERM

for _ in $(seq "$BURNERS"); do
    if command -v stress-ng >/dev/null; then
        stress-ng --cpu 1 --timeout "${budget}s" --quiet &
    else
        timeout "$budget" python3 -c 'while True: pass' &
    fi
    burner_pids+=("$!")
done

loadavg() { cut -d' ' -f1-3 /proc/loadavg; }
mkdir -p "$LOG_DIR"
summary="$LOG_DIR/summary.txt"
echo "adversarial-under-burn: ${RUNS} runs of ${selection[*]} under ${BURNERS} burners (pids ${burner_pids[*]}); logs in $LOG_DIR" | tee "$summary"

status=0
for run in $(seq "$RUNS"); do
    before=$(loadavg)
    started=$(date +%s)
    timeout --signal=INT --kill-after=120 "$RUN_SECONDS" .venv/bin/pytest -p no:cacheprovider -q "${selection[@]}" \
        >"$LOG_DIR/run-$run.log" 2>&1
    status=$?
    seconds=$(($(date +%s) - started))
    counts=$(grep -E '(passed|failed|error).* in [0-9.]+s' "$LOG_DIR/run-$run.log" | tail -1 | tr -d '=')
    [ $status -eq 124 ] && counts="cut at ${RUN_SECONDS}s"
    echo "run $run/$RUNS: exit $status,${counts:- no summary}; ${seconds}s; load average $before -> $(loadavg)" | tee -a "$summary"
    if [ $status -ne 0 ]; then
        grep -E '^(FAILED|ERROR) ' "$LOG_DIR/run-$run.log" | tee -a "$summary"
        break
    fi
done
exit $status
