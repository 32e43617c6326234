"""Every shipped preset composes into a valid config: the experiments and optimizer presets
with the dry run, each checked by reflact's own validation (what a user's first command does)."""

from __future__ import annotations

import pytest

from reflact.core.modes import get_mode
from tests.conftest import PROJECT, make_config

EXPERIMENTS = sorted(p.stem for p in (PROJECT / "conf" / "exp").glob("*.yaml"))
OPTIMIZERS = sorted(p.stem for p in (PROJECT / "conf" / "optimizer").glob("*.yaml"))


def test_the_presets_are_found():
    assert {"demo", "demo_grid", "demo_optuna"} <= set(EXPERIMENTS)
    assert {"openai", "azure", "compatible", "dry_run"} <= set(OPTIMIZERS)


@pytest.mark.parametrize("exp", EXPERIMENTS)
def test_every_experiment_composes_and_validates(exp):
    cfg = make_config(f"+exp={exp}", "optimizer=dry_run")
    assert cfg.optimizer.dry_run
    assert get_mode(cfg.reflect.update_mode).name == cfg.reflect.update_mode
    assert cfg.data.dir  # every experiment names its data


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_every_optimizer_preset_composes_and_validates(optimizer):
    # what a preset leaves to the user (a local server's model, Azure's endpoint), given as they would
    served = ["optimizer.model=qwen3:32b"]
    needs = {
        "azure": ["optimizer.azure.endpoint=https://example.openai.azure.com", "optimizer.azure.deployment=d"],
        "compatible": served,
        "ollama": served,
        "vllm": served,
    }
    cfg = make_config("+exp=demo", f"optimizer={optimizer}", *needs.get(optimizer, []))
    assert cfg.optimizer.model


@pytest.mark.parametrize("optimizer", ["compatible", "ollama", "vllm"])
def test_a_local_server_preset_without_a_model_is_one_clear_error(optimizer):
    from reflact.core.errors import UserError

    with pytest.raises(UserError, match="optimizer.model is not set"):
        make_config("+exp=demo", f"optimizer={optimizer}")


@pytest.mark.parametrize("exp", EXPERIMENTS)
def test_no_shipped_config_sets_hydra_mode(exp):
    # reflact.run lets `-m` alone choose run or sweep, saving Hydra's second compose (~0.3 s before
    # the first request); a preset that set hydra.mode would be ignored
    from hydra import compose, initialize_config_dir

    from reflact import config

    config.register()
    with initialize_config_dir(config_dir=str(PROJECT / "conf"), version_base="1.3"):
        composed = compose(config_name="config", overrides=[f"+exp={exp}"], return_hydra_config=True)
    assert composed.hydra.mode is None
