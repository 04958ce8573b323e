"""The repository's size rules for its Python modules: under 400 lines, lines of at most 100
characters (rft_jax/checkpoint.py had grown to 403 lines unnoticed: nothing checked)."""
import os

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODULES = sorted(os.path.relpath(os.path.join(root, name), REPO)
                 for top in ('rft_jax', 'tools', 'tests', 'configs')
                 for root, _, names in os.walk(os.path.join(REPO, top))
                 for name in names if name.endswith('.py'))


@pytest.mark.parametrize('rule', ['module under 400 lines', 'lines of <= 100 characters'])
def test_every_module_keeps_the_size_rules(rule):
  broken = []
  for rel in MODULES:
    with open(os.path.join(REPO, rel), encoding='utf-8') as f:
      lines = f.read().splitlines()
    if rule.startswith('module') and len(lines) >= 400:
      broken.append(f'{rel}: {len(lines)} lines')
    if rule.startswith('lines'):
      broken += [f'{rel}:{i}: {len(line)} characters' for i, line in enumerate(lines, 1)
                 if len(line) > 100]
  assert not broken, broken
