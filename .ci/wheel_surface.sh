#!/usr/bin/env bash
# Everything a user of the installed wheel has, each command checked by what it leaves behind
# (.ci/wheel_checks.py), not only by its exit code: the CLI, the demo (dry, and against the shipped
# stand-in optimizer), analyze, relog, importers, reflact.reflect(), the SkillOpt entry, the
# joblib sweep of docs/sweeps.md twice into one sweep dir (fresh, then resumed), the grid report, and a soak of demo runs.
#
#   .ci/wheel_surface.sh VENV LAUNCH_DIR     (from .ci/run: the wheel's venv, an empty directory)
set -euo pipefail
ci=$(cd "$(dirname "$0")" && pwd)
py="$1/bin/python"
reflact="$1/bin/reflact"
cd "$2"
mkdir logs
export MLFLOW_DISABLE_TELEMETRY=true
unset PYTHONPATH OPENAI_API_KEY OPENAI_BASE_URL

logs=logs
# check, logged, mistaken
. "$ci/steps.sh"

step() { echo "[$SECONDS s] $*"; }

check installed
logged help "$reflact" --help
grep -q "exp: demo" logs/help.out && grep -q "optimizer: " logs/help.out  # the shipped config groups
echo "reflact --help: lists the shipped config groups"
logged dry "$reflact" +exp=demo optimizer=dry_run
check dry-run

# the stand-in optimizer, from the wheel: for tests and offline try-outs, on 127.0.0.1 only
"$py" -m reflact.testing.optimizer_server --help >logs/server.help
tr -s ' \n' '  ' <logs/server.help | grep -q "for tests and offline try-outs"
"$py" -m reflact.testing.optimizer_server >logs/server.url 2>logs/server.err &
server_pid=$!
trap 'kill "$server_pid" 2>/dev/null || true' EXIT
for _ in $(seq 100); do [ -s logs/server.url ] && break; sleep 0.1; done
url=$(head -n 1 logs/server.url)
[[ "$url" =~ ^http://127\.0\.0\.1:[0-9]+/v1$ ]] || { echo "stand-in printed '$url'" >&2; exit 1; }
served=(optimizer=compatible "optimizer.base_url=$url" optimizer.model=test)

step "the demo against the stand-in at $url"
logged served "$py" -m reflact.run +exp=demo "${served[@]}" hydra.run.dir=outputs/runs/served
check served outputs/runs/served
logged analyze "$py" -m reflact.analyze outputs/runs/served
check analyzed outputs/runs/served "$(cat logs/analyze.out)"
logged relog "$py" -m reflact.relog outputs/runs/served
check relogged outputs/runs/served "$(cat logs/relog.out)"
check write-chat-log runs.jsonl
logged importers "$py" -m reflact.importers chat_jsonl runs.jsonl data/mine
check imported data/mine
logged reflect check reflect data/mine "$url"
tail -n 1 logs/reflect.out
logged skillopt check skillopt "$url"
tail -n 1 logs/skillopt.out

# docs/sweeps.md's parallel sweep, on 2 x 2 of its 3 x 3 M x L cells (the command line's values
# replace the grid's; its 3 seeds stay: 12 jobs); then the same command again resumes it
for round in fresh resume; do
    step "joblib sweep, $round"
    logged "sweep_$round" "$py" -m reflact.run -m +exp=demo_grid hydra/launcher=joblib hydra.launcher.n_jobs=4 \
        reflect.minibatch_size=2,8 reflect.edit_budget=1,4 "${served[@]}"
    check sweep "$round"
done
logged report "$py" -m reflact.report outputs/sweeps/demo_grid
check report

# the soak: demo runs of their own (seeds no earlier run used, so each calls the stand-in), then
# reruns answered from the response cache; two at a time, like a user's parallel shells (even
# counts; the suite's tests/test_imports.py runs more of the fastest kind)
soak_fresh=12
soak_cached=8
step "soak: $soak_fresh demo runs, then $soak_cached answered from the cache"
soak_run() {  # KIND SEED INDEX
    logged "soak_$1_$3" "$py" -m reflact.run +exp=demo "${served[@]}" "reflect.seed=$2" \
        "hydra.run.dir=outputs/soak/$1/$3" || echo "$1 $3" >>logs/soak.failed
}
for i in $(seq 0 2 $((soak_fresh - 1))); do
    soak_run fresh $((100 + i)) "$i" & first=$!
    soak_run fresh $((101 + i)) $((i + 1)) & wait "$first" $!  # not a bare wait: the stand-in runs in the background too
done
for i in $(seq 0 2 $((soak_cached - 1))); do
    soak_run cached $((100 + i)) "$i" & first=$!
    soak_run cached $((101 + i)) $((i + 1)) & wait "$first" $!
done
if [ -s logs/soak.failed ]; then
    races=$(grep -l "partially initialized module" logs/soak_*.err | wc -l)
    echo "soak: $(wc -l <logs/soak.failed) of $((soak_fresh + soak_cached)) runs failed ($races with a partially initialised module)" >&2
    exit 1
fi
check soak outputs/soak/fresh $soak_fresh fresh
check soak outputs/soak/cached $soak_cached cached
step "wheel surface checked"
