#!/usr/bin/env bash
# The command line on the newest Hydra and OmegaConf that install, pre-releases included (the
# project pins the versions its tests run on; reflact reaches into Hydra, so a new Hydra must not
# find out first). A short smoke, each command checked by what it leaves (.ci/wheel_checks.py): a
# run, a mistaken rerun (the run dir left byte for byte), a mistaken fresh run (no folder left), a
# rerun (every patch reused), a sweep.
#
#   .ci/newest_stack.sh WHEEL WORK     (from .ci/run, beside the tests: the wheel, an empty directory)
set -euo pipefail
unset PYTHONPATH
ci=$(cd "$(dirname "$0")" && pwd)
wheel=$1
work=$2
started=$SECONDS
step() { echo "[$((SECONDS - started)) s] $*"; }

# the project's dependencies as pyproject.toml names them, less Hydra and OmegaConf, which come
# next at their newest, then the wheel without dependencies (its pins would hold them back)
python3 -m venv "$work/venv"
py="$work/venv/bin/python"
mapfile -t deps < <(python3 -c '
import sys, tomllib
deps = tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]
print("\n".join(d for d in deps if not d.startswith(("hydra-core", "omegaconf"))))' "$ci/../pyproject.toml")
"$py" -m pip install --quiet "${deps[@]}"
"$py" -m pip install --quiet --pre --upgrade hydra-core omegaconf
"$py" -m pip install --quiet --no-deps "$wheel"
step "installed: $("$py" -c 'import hydra, omegaconf; print(f"hydra-core {hydra.__version__}, omegaconf {omegaconf.__version__}")')"

mkdir "$work/launch" "$work/logs"
cd "$work/launch"
logs=$work/logs
export MLFLOW_DISABLE_TELEMETRY=true
unset OPENAI_API_KEY OPENAI_BASE_URL
# check, logged, mistaken
. "$ci/steps.sh"

check installed
"$py" -m reflact.testing.optimizer_server >"$logs/server.url" 2>"$logs/server.err" &
server_pid=$!
trap 'kill "$server_pid" 2>/dev/null || true' EXIT
for _ in $(seq 100); do [ -s "$logs/server.url" ] && break; sleep 0.1; done
served=(+exp=demo optimizer=compatible "optimizer.base_url=$(head -n 1 "$logs/server.url")" optimizer.model=test)

run=outputs/runs/smoke
logged run "$py" -m reflact.run "${served[@]}" "hydra.run.dir=$run"
check served "$run"
files() { find "$run" -type f -exec sha256sum {} + | sort; }
before=$(files)
mistaken rerun_mistake "$py" -m reflact.run "${served[@]}" "hydra.run.dir=$run" reflect.minibatch_size=0
[ "$(files)" = "$before" ] || { echo "a mistaken rerun changed $run" >&2; exit 1; }
mistaken fresh_mistake "$py" -m reflact.run "${served[@]}" hydra.run.dir=outputs/runs/mistake reflect.minibatch_size=0
[ ! -e outputs/runs/mistake ] || { echo "a mistaken fresh run left outputs/runs/mistake" >&2; exit 1; }
logged rerun "$py" -m reflact.run "${served[@]}" "hydra.run.dir=$run"
check reused "$run"
step "a run, a mistaken rerun and fresh run, a rerun"
logged sweep "$py" -m reflact.run -m +exp=demo_grid reflect.minibatch_size=2,8 reflect.edit_budget=1,4 "${served[@]:1}"
check sweep fresh
step "newest stack checked"
