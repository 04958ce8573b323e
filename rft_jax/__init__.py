"""rft_jax: JAX-native RL post-training for language models."""
