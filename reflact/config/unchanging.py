"""The settings that cannot change a run's patches (UNCHANGING), and which overrides they are:
a sweep leaves them out of its fixed settings and its job folder names."""

from __future__ import annotations

from reflact.core.imports import one_at_a_time

# Settings that cannot change a run's patches, each with everything under it: where the calls go
# and with which key, how they are paced, retried, capped and priced, the response cache, tracking,
# the analysis after the stage, the sweep's name. None of them reaches the patch fingerprint
# (rundir.fingerprint: the model, mode, L, decoding, draw and the messages, which the data, reflect
# and prompts settings build); they only decide whether a call succeeds and what is recorded of it,
# and a rerun redoes what failed. A sweep leaves them out of its fixed settings and (with Hydra's
# launch keys) of its job folder names, so changing one resumes the sweep.
UNCHANGING = (
    "name",
    "optimized_metric",
    "reflect.workers",
    "optimizer.base_url",
    "optimizer.azure.endpoint",
    "optimizer.api_key_env",
    "optimizer.timeout_s",
    "optimizer.retry",
    "optimizer.rpm",
    "optimizer.tpm",
    "optimizer.max_cost_usd",
    "optimizer.prices",
    "optimizer.cache",
    "optimizer.cache_path",
    "optimizer.service_tier",
    "optimizer.flex_timeout_s",
    "optimizer.flex_fallback_after",
    "optimizer.execution",
    "optimizer.batch_wait",
    "optimizer.batch_reasks",
    "optimizer.batch_max_wait_h",
    "optimizer.batch_max_requests",
    "optimizer.batch_max_mb",
    "mlflow",
    "analysis",
)


LAUNCH = ("hydra", "cluster")  # override keys that choose where and how jobs run, not what they do


def unchanging(key: str) -> bool:
    """Whether a setting (`section.key`, as in params) is one of UNCHANGING or under one."""
    return any(key == name or key.startswith(name + ".") for name in UNCHANGING)


def unchanging_overrides(overrides) -> list[str]:
    """The keys of the overrides that leave the results alone, for Hydra's override_dirname.exclude_keys
    (which matches whole keys: a price override names its model, +optimizer.prices.<model>=...)."""
    with one_at_a_time():
        from hydra.core.override_parser.overrides_parser import OverridesParser

    keys = [o.key_or_group for o in OverridesParser.create().parse_overrides(list(overrides))]
    return [key for key in keys if unchanging(key) or key.replace("/", ".").split(".")[0] in LAUNCH]
