"""What the scaling fits say about what the data cannot tell them: where R0 came from, and
prediction bands that a bootstrap with nothing to resample would give zero width."""
import numpy as np

from rft_jax import scaling

A, B, C_MID, R0 = 0.8, 2.0, 1e16, 0.3


def noisy_run(n=20, seed=0):
  rng = np.random.default_rng(seed)
  c = np.arange(1, n + 1) * C_MID * 4 / n
  return c, scaling.sigmoid_curve(c, A, B, C_MID, R0) + rng.normal(0, 0.01, n)


def test_sigmoid_says_where_r0_came_from():
  """The note said the base eval at C = 0 'sets R0' when an API caller passed R0= too (the base
  eval then has no part in the fit)."""
  c, r = noisy_run()
  c0, r0 = np.r_[0.0, c], np.r_[0.45, r]
  given = scaling.fit_sigmoid(c0, r0, R0=R0, n_boot=20)
  text = given.summary()
  assert 'it sets R0' not in text and given.R0 == R0, text
  assert ('(excluded: the base eval at C = 0 (unused: R0 was given); 2 with C <= 0.1 * max C, '
          'the start of the run), R0=0.3 (given), ') in text, text
  assert given.to_dict()['R0_source'] == 'given'
  base = scaling.fit_sigmoid(c0, r0, n_boot=20)
  assert base.R0 == 0.45 and '(it sets R0)' in base.summary() and 'R0=0.45, ' in base.summary()
  assert base.to_dict()['R0_source'] == 'base_eval'
  first = scaling.fit_sigmoid(c, r, n_boot=20)   # no base eval: the first eval's value
  assert first.R0 == r[0] and first.to_dict()['R0_source'] == 'first_eval'
  assert '(the eval at the smallest compute)' in first.summary(), first.summary()
