# Helpers the wheel's smoke scripts share (.ci/wheel_surface.sh, .ci/newest_stack.sh): sourced with
# `py` (the environment's python), `ci` (this folder) and `logs` (where each command's output goes).

check() { "$py" "$ci/wheel_checks.py" "$@"; }

# `logged NAME COMMAND...`: the command's output in $logs/NAME.out and .err; fails, showing its
# stderr, when it exits non-zero or prints a traceback
logged() {
    local name=$1 rc=0
    shift
    "$@" >"$logs/$name.out" 2>"$logs/$name.err" || rc=$?
    if [ "$rc" != 0 ] || grep -q Traceback "$logs/$name.err"; then
        echo "FAILED ($rc): $*" >&2
        tail -n 40 "$logs/$name.err" >&2
        return 1
    fi
}

# `mistaken NAME COMMAND...`: the command must end with its one line and exit code 2
mistaken() {
    local name=$1 rc=0
    shift
    "$@" >"$logs/$name.out" 2>"$logs/$name.err" || rc=$?
    if [ "$rc" != 2 ] || [ "$(wc -l <"$logs/$name.err")" != 1 ] || ! grep -q "^reflact: error: " "$logs/$name.err"; then
        echo "FAILED: expected one line and exit code 2, got $rc: $*" >&2
        tail -n 40 "$logs/$name.err" >&2
        return 1
    fi
}
