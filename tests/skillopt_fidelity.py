"""SkillOpt's own trainer run as its users run it, once with its reflect and once with reflact's, and
every file the trainer wrote compared.

Each training run is its own process (SkillOpt keeps its settings process-wide): SkillOpt 0.2.0's
`ReflACTTrainer` for two steps on the replay environment (tests/skillopt_replay.py), the stand-in
optimizer on 127.0.0.1 named only in SkillOpt's own settings (no OPENAI_* variable), reflact
installed by the documented line or not. Used by tests/test_skillopt_trainer.py and
bench/skillopt_fidelity.py.

    python -m tests.skillopt_fidelity SPEC.json    # one training run (what `train` starts)
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from tests import skillopt_replay as replay

REPO = Path(__file__).resolve().parent.parent
MODES = ("patch", "rewrite_from_suggestions", "full_rewrite_minibatch")
# SkillOpt's built-in adapters (alfworld, searchqa, spreadsheetbench, docvqa, ...) default to 16 analyst workers
DEFAULT_WORKERS = 16
# the values that are the run's clock, not its outcome: equal files apart from these are the same
TIMINGS = {"timing", "wall_time_s", "total_wall_time_s", "total_wall_s", "wall_s", "elapsed_s", "timestamp"}
OWN = ".reflact"  # reflact's record beside each patches folder (`<patches_dir>.reflact/`): not SkillOpt's


@dataclass(frozen=True)
class Setup:
    mode: str
    skill_aware: bool = True
    workers: int = DEFAULT_WORKERS
    minibatch_size: int = 8  # SkillOpt's default M: one failure and one success minibatch a step
    seed: int = 7

    def __str__(self) -> str:
        aware = "on" if self.skill_aware else "off"
        return f"{self.mode}, skill-aware {aware}, workers {self.workers}, M={self.minibatch_size}, seed {self.seed}"


@dataclass(frozen=True)
class Compared:
    name: str  # the file's path under out_root
    identical: bool
    why: str = ""  # where the two first differ


def trainer_config(out_root: Path, base_url: str, setup: Setup) -> dict:
    """As a SkillOpt user writes it: the optimizer endpoint and auth in SkillOpt's own keys."""
    skill = out_root.parent / "skill_init.md"
    skill.write_text(replay.SKILL)
    return {
        "out_root": str(out_root), "skill_init": str(skill), "env": "replay",
        "optimizer_azure_openai_endpoint": base_url, "optimizer_azure_openai_auth_mode": "openai_compatible",
        "optimizer_azure_openai_api_key": "sk-local-test", "optimizer_model": "skillopt-test-model",
        "target_model": "unused", "reasoning_effort": "medium",
        "batch_size": 6, "num_epochs": 1, "accumulation": 1, "seed": setup.seed, "train_size": 12,
        "merge_batch_size": 2, "edit_budget": 3, "min_edit_budget": 2, "sel_env_num": 4,
        "analyst_workers": setup.workers, "skill_update_mode": setup.mode,
        "use_skill_aware_reflection": setup.skill_aware, "skill_aware_appendix_source": "both",
        "rewrite_reasoning_effort": "high", "eval_test": False, "use_gate": True,
    }


def child_env() -> dict[str, str]:
    """The environment of a training run: none of the variables that would name a server or key."""
    prefixes = ("OPENAI_", "AZURE_OPENAI", "OPTIMIZER_", "TARGET_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    env["MLFLOW_DISABLE_TELEMETRY"] = "true"
    return env


def train(side: Path, base_url: str, setup: Setup, with_reflact: bool, timeout: float = 300) -> Path:
    """One training run in its own process, in the folder `side`; its out_root (the trainer's token
    summary is `tokens.json` beside it, its output `train.log`)."""
    side.mkdir(parents=True)
    spec = {"out_root": str(side / "out"), "base_url": base_url, "setup": asdict(setup), "with_reflact": with_reflact}
    (side / "spec.json").write_text(json.dumps(spec))
    done = subprocess.run([sys.executable, "-m", "tests.skillopt_fidelity", str(side / "spec.json")], cwd=side,
                          env=child_env(), capture_output=True, text=True, timeout=timeout)
    (side / "train.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise RuntimeError(f"the trainer ({setup}, reflact {with_reflact}) ended {done.returncode}:\n"
                           + done.stderr[-3000:])
    return side / "out"


@dataclass(frozen=True)
class Pair:
    theirs: Path  # out_root of the run with SkillOpt's own reflect
    ours: Path  # out_root of the run with reflact installed
    attempts: int  # SkillOpt runs made until one finished its analyst calls in its plan's order


def train_both(work: Path, base_url: str, setup: Setup, attempts: int = 8) -> Pair:
    """SkillOpt's trainer with its own reflect, then with reflact's. With more than one worker SkillOpt
    keeps its patches in the order its analyst calls end, so its files vary from run to run: its run is
    repeated (at most `attempts` times) until the calls ended in the order it made them, the run that
    reflact's order (the plan's, at any number of workers) reproduces."""
    for attempt in range(1, attempts + 1):
        theirs = train(work / f"skillopt-{attempt}", base_url, setup, with_reflact=False)
        if in_plan_order(theirs):
            break
    else:
        raise RuntimeError(f"SkillOpt's analyst calls never ended in plan order in {attempts} runs ({setup})")
    return Pair(theirs, train(work / "reflact", base_url, setup, with_reflact=True), attempt)


def in_plan_order(out_root: Path) -> bool:
    """Did SkillOpt's own reflect finish each step's analyst calls in the order it submitted them
    (failures by index, then successes)? It keeps its patches in completion order, so only then is
    its run the one reflact's deterministic order reproduces (with one worker it always is)."""
    log = (out_root.parent / "train.log").read_text()
    done = re.findall(r"\[analyst\] (\d+)/\d+ (minibatch_\w+)", log)
    steps, step = [], []
    for number, tag in done:
        if number == "1" and step:
            steps.append(step)
            step = []
        step.append(tag)
    return all(tags == sorted(tags) for tags in [*steps, step])


def compare(theirs: Path, ours: Path) -> list[Compared]:
    """Every file either trainer run wrote (reflact's own record aside), byte for byte once each
    run's folder (out_root's parent, where its skill_init is) reads `<run>`; a JSON file whose only
    differences are timing values counts as the same (its bytes are compared with those blanked)."""
    names = sorted({str(p.relative_to(root)) for root in (theirs, ours) for p in _files(root)})
    return [_compare_one(name, theirs, ours) for name in names]


def _files(root: Path):
    return (p for p in root.rglob("*") if p.is_file() and not any(part.endswith(OWN) for part in p.parts))


def _compare_one(name: str, theirs: Path, ours: Path) -> Compared:
    a, b = theirs / name, ours / name
    if not (a.exists() and b.exists()):
        return Compared(name, False, "written by SkillOpt only" if a.exists() else "written with reflact only")
    ta, tb = (p.read_bytes().replace(str(root.parent).encode(), b"<run>") for p, root in ((a, theirs), (b, ours)))
    if ta == tb:
        return Compared(name, True)
    if name.endswith(".json"):
        try:
            ja, jb = json.loads(ta), json.loads(tb)
        except ValueError:
            return Compared(name, False, "not JSON")
        if _dumped(_blank_timings(ja)) == _dumped(_blank_timings(jb)):
            return Compared(name, True, "timings")
        return Compared(name, False, first_difference(ja, jb))
    return Compared(name, False, "text differs")


def _dumped(value) -> str:
    return json.dumps(value, ensure_ascii=False, indent=2)  # key order kept: an order change is a difference


def _blank_timings(value):
    if isinstance(value, dict):
        return {k: None if k in TIMINGS else _blank_timings(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_blank_timings(v) for v in value]
    return value


def first_difference(a, b, where: str = "") -> str:
    """The JSON path of the first place two values differ, with both sides (shortened)."""
    if isinstance(a, dict) and isinstance(b, dict):
        if list(a) != list(b):
            return f"{where or '.'}: keys {list(a)} vs {list(b)}"
        for key in (k for k in a if k not in TIMINGS):
            if _dumped(_blank_timings(a[key])) != _dumped(_blank_timings(b[key])):
                return first_difference(a[key], b[key], f"{where}.{key}")
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            if _dumped(_blank_timings(x)) != _dumped(_blank_timings(y)):
                return first_difference(x, y, f"{where}[{i}]")
    return f"{where or '.'}: {json.dumps(a)[:80]} vs {json.dumps(b)[:80]}"


# ---------------------------------------------------------------- the child: one training run


def _adapter(setup: Setup):
    return replay.adapter_class(setup.workers, setup.minibatch_size)()


def _run(spec: dict) -> None:
    import skillopt.engine.trainer as trainer_module
    import skillopt.model.azure_openai as skillopt_openai
    import skillopt.prompts as skillopt_prompts

    out_root = Path(spec["out_root"])
    setup = Setup(**spec["setup"])
    prompts = out_root.parent / "prompts"  # the stand-in templates, each naming its role for the stand-in
    replay.write_templates(prompts)
    skillopt_prompts._PROMPTS_DIR = str(prompts)
    cfg = trainer_config(out_root, spec["base_url"], setup)
    if spec["with_reflact"]:
        import reflact.compat.skillopt

        reflact.compat.skillopt.install()
    trainer_module.ReflACTTrainer(cfg, _adapter(setup)).train()
    (out_root.parent / "tokens.json").write_text(json.dumps(skillopt_openai.get_token_summary(), indent=1))


if __name__ == "__main__":
    _run(json.loads(Path(sys.argv[1]).read_text()))
