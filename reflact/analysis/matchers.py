"""The matcher `analysis.matcher` names, built from the config: lexical (reflact.analysis.matching, no
call), embedding (reflact.analysis.embedding) or judge (reflact.analysis.judge), with what its calls cost."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from reflact.analysis.embedding import Embedder, EmbeddingMatcher, Spent
from reflact.analysis.guards import NAMES
from reflact.analysis.matching import Lexical
from reflact.config import AnalysisConfig, CacheMode, Matcher, OptimizerConfig
from reflact.core.errors import UserError
from reflact.core.imports import one_at_a_time
from reflact.core.launch import LaunchDir


@dataclass
class Chosen:
    matcher: object
    spent: dict[str, Spent] = field(default_factory=dict)  # per kind of call: embedding, judge
    closers: list = field(default_factory=list)

    def usage(self) -> dict:
        """The analysis's calls, for analysis.json: per kind and in all."""
        if not self.spent:
            return {}
        parts = {kind: spent.as_dict() for kind, spent in self.spent.items()}
        total = {key: round(sum(p[key] for p in parts.values()), 6) for key in ("requests", "tokens", "cost_usd")}
        return {
            "analysis_calls": parts,
            "analysis_tokens": int(total["tokens"]),
            "analysis_cost_usd": total["cost_usd"],
        }

    def close(self) -> None:
        for close in self.closers:
            close()


def matcher_for(
    a: AnalysisConfig,
    o: OptimizerConfig,
    launch_dir: Path,
    spent_usd: float | None = 0.0,
    raw_dir: Path | None = None,
    threshold: float | None = None,
    environ: Mapping[str, str] | None = None,
) -> Chosen:
    """The configured matcher; `spent_usd`: what the invocation already spent against the cap;
    `threshold` (the --threshold of reflact.analyze) replaces the matcher's own; `o`: the endpoint,
    cache, prices and cap the calls share with the stage."""
    if a.matcher is Matcher.lexical:
        return Chosen(Lexical(a.match_threshold if threshold is None else threshold))
    from reflact.running.ask import Spend

    # spent_usd is None for an unpriced model, which has no cap (config.validate)
    spend = Spend(o.max_cost_usd, spent=spent_usd or 0.0)
    embedder, closers = _embedder(a, o, launch_dir, spend, environ)
    chosen = Chosen(None, {"embedding": embedder.spent}, closers)
    guards = tuple(name for name in NAMES if name in a.guards)
    if a.matcher is Matcher.embedding:
        chosen.matcher = EmbeddingMatcher(embedder, a.embedding.threshold if threshold is None else threshold, guards)
        return chosen
    candidates = EmbeddingMatcher(embedder, a.judge.candidate_threshold if threshold is None else threshold, guards)
    _add_judge(chosen, candidates, a, o, launch_dir, spend, raw_dir, environ)
    return chosen


def _add_judge(
    chosen: Chosen, candidates, a: AnalysisConfig, o: OptimizerConfig, launch_dir: Path, spend, raw_dir, environ
) -> None:
    """The judge matcher: the optimizer model decides on the embedding matcher's candidate pairs."""
    from reflact.analysis.judge import JudgeMatcher
    from reflact.calls.client import make_client

    client = make_client(o, launch_dir, environ)
    chosen.closers.append(client.close)
    chosen.spent["judge"] = Spent()
    j = a.judge
    price = o.prices.get(o.model)
    chosen.matcher = JudgeMatcher(
        candidates, client, price, spend, j.batch, j.max_output_tokens, raw_dir, chosen.spent["judge"]
    )


def _embedder(
    a: AnalysisConfig, o: OptimizerConfig, launch_dir: Path, spend, environ: Mapping[str, str] | None
) -> tuple[Embedder, list]:
    from reflact.calls.cache import ResponseCache

    e = a.embedding
    environ = os.environ if environ is None else environ
    base_url, key_env = e.base_url or o.base_url, e.api_key_env or o.api_key_env
    key = environ.get(key_env, "")
    if not key and not base_url:
        raise UserError(
            f"analysis.matcher={a.matcher.value}: no key for the embeddings: set the "
            f"environment variable {key_env}, or analysis.embedding.base_url for a local server"
        )
    with one_at_a_time():
        import openai

    sdk = openai.OpenAI(base_url=base_url, api_key=key or "not-needed", timeout=o.timeout_s, max_retries=0)
    cache = None
    if o.cache is not CacheMode.off:
        cache = ResponseCache(LaunchDir(launch_dir).cache(o.cache_path), o.cache)
    embedder = Embedder(
        sdk, e.model, {"base_url": str(sdk.base_url)}, cache, o.prices.get(e.model), spend, o.retry, e.batch, key
    )
    return embedder, [sdk.close] + ([cache.close] if cache else [])
