"""Decoder LMs used functionally: `graphdef, params = create(cfg, seed)`, then pure functions."""
from rft_jax.models.functional import (create, forward, forward_cached, forward_completions,
                                       init_cache, positions_from_mask, abstract_params)
from rft_jax.models.llama import ModelConfig, Transformer

__all__ = ['ModelConfig', 'Transformer', 'create', 'forward', 'forward_cached',
           'forward_completions', 'init_cache', 'positions_from_mask', 'abstract_params']
