"""jtc: what an intra-group RL objective does to each token, in JAX."""
