"""Verifiers and the runner that scores completions with them.

Importing the package registers every built-in verifier (modules that use @register_verifier).
"""
from rft_jax.rewards import code_exec  # noqa: F401  (registers python_tests)
