"""api.sample / api.evaluate refuse arguments the recipe's config rules refuse, in one line:
sample(temperature=-1) sampled garbage silently, evaluate(k=0) was a shape error inside JAX."""
import pytest

from rft_jax import api


@pytest.fixture(scope='module')
def policy():
  return api.load_policy(api.load_config('grpo_arith:tiny'))


@pytest.mark.parametrize('kwargs,message', [
    (dict(temperature=-1.0), 'sample: temperature=-1.0: must be >= 0'),
    (dict(top_p=0.0), 'sample: top_p=0.0: must be in (0, 1]'),
    (dict(top_k=-1), 'sample: top_k=-1: must be >= 0'),
    (dict(max_new_tokens=0), 'sample: max_new_tokens=0: must be >= 1'),
])
def test_sample_refuses_bad_arguments(policy, kwargs, message):
  with pytest.raises(ValueError) as e:
    api.sample(policy, ['12+7='], **kwargs)
  assert str(e.value) == message


@pytest.mark.parametrize('kwargs,message', [
    (dict(k=0), 'evaluate: k=0: must be >= 1'),
    (dict(temperature=-0.5), 'evaluate: temperature=-0.5: must be >= 0'),
])
def test_evaluate_refuses_bad_arguments(policy, kwargs, message):
  with pytest.raises(ValueError) as e:
    api.evaluate(policy, **kwargs)
  assert str(e.value) == message
