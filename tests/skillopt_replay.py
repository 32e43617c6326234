"""A replay environment for SkillOpt's own trainer, and a stand-in optimizer that answers its calls.

The environment is a small support desk: each task has a recorded failing run and a recorded
passing one, and a rollout replays the passing run when the skill holds the rule that task needs
(so what the reflect stage proposes decides the scores, the gate and the next step). The optimizer
stand-in answers analyst, merge, ranking and rewrite calls with valid replies built from what the
request shows (trajectory ids, the items to merge), so both reflect stages, SkillOpt's and
reflact's, face the same model. The templates are stand-ins of the tests' own, each naming its role.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from pathlib import Path

from reflact.testing.optimizer_server import Response, chat_body

# (task id, what the user asked, the rule that makes the agent pass, how the run failed without it)
TASKS = [
    ("t01", "Refund order #4411, the blender arrived cracked.", "Amounts passed to refund() are in cents.",
     "refunded 49 instead of 4900"),
    ("t02", "Change the delivery address on order #5120 to 12 Elm Road.",
     "Verify the order is not shipped before editing it.", "edited an order already in transit"),
    ("t03", "Cancel my subscription, I was charged twice this month.",
     "Check for a duplicate charge before cancelling.", "cancelled without refunding the duplicate"),
    ("t04", "Why is my parcel late? Tracking says it left Leeds on Monday.",
     "Quote the carrier's latest scan to the user.", "guessed a delay reason"),
    ("t05", "Swap the red kettle on #6031 for the black one.", "Look up stock before promising an exchange.",
     "promised an item out of stock"),
    ("t06", "I want to return shoes bought 40 days ago.", "State the 30-day return window before refusing.",
     "refused without giving the policy"),
    ("t07", "Apply my student discount to order #7002.", "Ask for the discount code instead of guessing it.",
     "applied a made-up code"),
    ("t08", "Split the payment for #7310 across two cards.", "Confirm both card endings before charging.",
     "charged the wrong card"),
    ("t09", "The invoice for #8120 lists the wrong company name.", "Reissue invoices instead of editing them.",
     "edited a sent invoice"),
    ("t10", "My account is locked after three password tries.", "Never reset a password without identity checks.",
     "reset the password at once"),
    ("t11", "Add gift wrapping to order #8804 before it ships.", "Verify the order is not shipped before editing it.",
     "added wrapping to a shipped order"),
    ("t12", "Refund the shipping fee on #9015, it came a week late.", "Amounts passed to refund() are in cents.",
     "refunded 5 instead of 500"),
]
VALID = ["t03", "t07", "t10", "t12"]
SKILL = """# Support agent skill

## Orders
- Look up the order before acting on it.
- Be polite and brief.
"""

RULES = sorted({rule for _, _, rule, _ in TASKS})
NOTES = ["Re-read the order status line before any change.", "Say which policy applies when refusing."]


def _number(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def conversation(task: tuple, passed: bool) -> list[dict]:
    tid, ask, rule, failure = task
    reply = (f"I checked first: {rule[0].lower() + rule[1:-1]}. Done, and I have noted it on the ticket."
             if passed else f"Done. (It later turned out the agent {failure}.)")
    return [
        {"role": "user", "content": ask},
        {"type": "tool_call", "cmd": f"lookup_order(ref='{tid}')", "obs": '{"status": "processing", "total": 4900}'},
        {"role": "assistant", "content": reply},
    ]


class Replay:
    """The environment manager: the tasks one rollout replays."""

    def __init__(self, ids: list[str]) -> None:
        self.ids = sorted(ids)

    def __len__(self) -> int:
        return len(self.ids)


def rollout(ids: list[str], skill: str, out_dir: str) -> list[dict]:
    """Each task's passing run when the skill holds its rule, else its failing run (sorted by id)."""
    results = []
    for task in (t for t in TASKS if t[0] in ids):
        passed = task[2] in skill
        folder = Path(out_dir) / "predictions" / task[0]
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "conversation.json").write_text(json.dumps(conversation(task, passed), indent=1))
        results.append({"id": task[0], "hard": 1 if passed else 0, "soft": 1.0 if passed else 0.3,
                        "task_description": task[1], "task_type": "orders", "n_turns": 3,
                        "fail_reason": "" if passed else f"wrong action: the agent {task[3]}"})
    return results


def train_ids(batch_size: int, seed: int) -> list[str]:
    pool = [t[0] for t in TASKS if t[0] not in VALID]
    return random.Random(seed).sample(pool, batch_size)


# ---------------------------------------------------------------- the stand-in optimizer

TEMPLATES = {  # the role each stand-in names, so the optimizer knows what it is asked
    **{f"analyst_{g}{s}": f"ROLE analyst {g} {m}\nStudy the trajectories and answer with one JSON object."
       for g in ("error", "success") for s, m in (("", "patch"), ("_rewrite", "rewrite"), ("_full_rewrite", "full"))},
    **{f"merge_{k}{s}": f"ROLE merge {m}\nMerge the patches into one JSON patch."
       for k in ("failure", "success", "final") for s, m in (("", "patch"), ("_rewrite", "rewrite"),
                                                              ("_full_rewrite", "full"))},
    "ranking": "ROLE ranking\nReturn selected_indices.", "ranking_rewrite": "ROLE ranking\nReturn selected_indices.",
    "rewrite_skill": "ROLE rewrite\nReturn the new skill.",
}


def adapter_class(workers: int, minibatch_size: int) -> type:
    """SkillOpt's environment adapter over the replay: its analyst workers and M as given, L=2."""
    import skillopt.envs.base as base

    class ReplayAdapter(base.EnvAdapter):
        analyst_workers, failure_only, edit_budget = workers, False, 2

        def build_train_env(self, batch_size, seed, **kwargs):
            return Replay(train_ids(batch_size, seed))

        def build_eval_env(self, env_num, split, seed, **kwargs):
            return Replay(VALID[:env_num])

        def rollout(self, env_manager, skill_content, out_dir, **kwargs):
            return rollout(env_manager.ids, skill_content, out_dir)

        def get_task_types(self):
            return ["orders"]

    ReplayAdapter.minibatch_size = minibatch_size
    return ReplayAdapter


def write_templates(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in TEMPLATES.items():
        (folder / f"{name}.md").write_text(text + "\n")


# SkillOpt's own reflect keeps its patches in the order its analyst calls end; it submits failure
# minibatches before success ones. A success reply comes this much later, so that, with one minibatch
# of each (SkillOpt's default M=8 over a batch of 6), they end in the order SkillOpt made them at any
# number of workers, as they always do with one. reflact's order never depends on it.
SUCCESS_DELAY_S = 0.3


def answer(request: dict, number: int) -> Response:
    system, user = request["messages"][0]["content"], request["messages"][1]["content"]
    role = re.search(r"ROLE (\w+)(?: (\w+))?(?: (\w+))?", system)
    kind = role.group(1) if role else "other"
    handler = {"analyst": _analyst, "merge": _merge, "ranking": _ranking, "rewrite": _rewrite}.get(kind)
    reply = handler(role, system, user) if handler else {"note": "not asked for"}
    late = kind == "analyst" and role.group(2) == "success"
    return Response(body=chat_body(json.dumps(reply)), delay_s=SUCCESS_DELAY_S if late else 0.0)


def _analyst(role, system: str, user: str) -> dict:
    group, mode = role.group(2), role.group(3)
    ids = re.findall(r"\(id[=:] ?([^)\s]+)\)", user)  # SkillOpt's "(id=X)" and reflact's "(id: X)"
    n = int(re.search(r"at most L=(\d+)", user).group(1)) + 1 if "at most L=" in user else 1
    rules = [RULES[(_number(",".join(ids)) + i) % len(RULES)] for i in range(n)]
    aware = "## Skill-Aware Reflection" in system
    reply: dict = {}
    if group == "error":
        reply["failure_summary"] = [{"failure_type": "wrong_action", "count": len(ids), "trajectories": ids,
                                     "description": f"the agent acted before checking, in {len(ids)} run(s)"}]
    if aware:
        reply["appendix_notes"] = [NOTES[_number(ids[0]) % 2]] if ids else []
        if group == "error" and _number(",".join(ids)) % 3 == 0:
            return reply  # execution lapses only: notes and no patch
    reply["patch"] = {"reasoning": f"{len(ids)} runs", **_payload(mode, rules, user)}
    return reply


def _payload(mode: str, rules: list[str], user: str) -> dict:
    if mode == "rewrite":
        return {"revise_suggestions": [{"type": "add_rule", "title": rule[:30], "motivation": "seen in the runs",
                                        "instruction": rule, "priority_hint": "high"} for rule in rules]}
    if mode == "full":
        body = SKILL.rstrip() + "\n" + "".join(f"- {rule}\n" for rule in rules[:2])
        return {"skill_candidates": [{"title": "tighter", "change_summary": rules[:2], "new_skill": body}]}
    skill_lines = user.split("## Current Skill\n", 1)[-1].splitlines()
    anchor = next((line for line in skill_lines if line.startswith("- ")), "")
    # the first targets a line that is not there (SkillOpt's update appends it), the second one that is
    targets = ["- no such line", anchor]
    edits = [{"op": "insert_after", "target": targets[i], "content": f"- {rule}"} if i < 2
             else {"op": "append", "content": f"- {rule}"} for i, rule in enumerate(rules)]
    return {"edits": edits}


def _merge(role, system: str, user: str) -> dict:
    """The items of the patches shown, each once, without the bookkeeping the trainer added."""
    key = {"patch": "edits", "rewrite": "revise_suggestions", "full": "skill_candidates"}[role.group(2)]
    patches = json.loads(user[user.index("\n[") + 1:])
    seen, items = set(), []
    for patch in patches:
        for item in patch.get(key, []):
            clean = {k: v for k, v in item.items() if k not in ("support_count", "merge_level", "source_type")}
            marker = json.dumps(clean, sort_keys=True)
            if marker not in seen:
                seen.add(marker)
                items.append(clean)
    return {"reasoning": f"merged {len(items)}", key: items[:1] if key == "skill_candidates" else items}


def _ranking(role, system: str, user: str) -> dict:
    pool = int(re.search(r"Pool \((\d+)", user).group(1))
    budget = int(re.search(r"budget=(\d+)", user).group(1))
    return {"selected_indices": list(range(pool))[::-1][:budget]}


def _rewrite(role, system: str, user: str) -> dict:
    suggestions = json.loads(user.split("total)\n", 1)[1].split("\n\n", 1)[0])
    skill = user.split("## Current Skill\n", 1)[1].split("\n\n## Selected", 1)[0]
    new = skill.rstrip() + "\n" + "".join(f"- {s['instruction']}\n" for s in suggestions)
    return {"new_skill": new, "change_summary": [s["title"] for s in suggestions]}
