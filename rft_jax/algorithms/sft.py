"""Supervised fine-tuning step: token-mean cross-entropy on the answer tokens.

batch: tokens_bs [B,S], mask_bs [B,S] (real tokens), loss_mask_bs [B,S] (answer + EOS). Targets
live on L = S - 1 positions: loss_l = -log p(token_{l+1} | tokens_{<=l}) where
loss_mask[l+1] = 1.
"""
import jax
import jax.numpy as jnp

from rft_jax.algorithms import train_state as ts
from rft_jax.models import functional as lm


def loss_fn(params, mb, *, graphdef):
  """(sum of answer-token NLL, (answer-token count, {'loss', 'accuracy'} sums))."""
  logits = lm.forward(graphdef, params, mb['tokens'], mb['mask'])[:, :-1]
  targets = mb['tokens'][:, 1:]
  weight = mb['loss_mask'][:, 1:].astype(jnp.float32)
  nll = -jnp.take_along_axis(jax.nn.log_softmax(logits, -1), targets[..., None], -1)[..., 0]
  hit = (jnp.argmax(logits, -1) == targets).astype(jnp.float32)
  loss_sum, count = (nll * weight).sum(), weight.sum()
  return loss_sum, (count, {'loss': jax.lax.stop_gradient(loss_sum),
                            'token_acc': (hit * weight).sum()})


def train_step(state: ts.TrainState, batch: dict, *, graphdef, tx, schedule):
  """One optimiser update -> (state, metrics). Pure; jit with donation."""
  grads, metrics = ts.accumulate_grads(lambda p, mb: loss_fn(p, mb, graphdef=graphdef),
                                       state.params, batch, 1)
  state, opt_stats = ts.apply_gradients(state, grads, tx, schedule)
  return state, {**metrics, **opt_stats}
