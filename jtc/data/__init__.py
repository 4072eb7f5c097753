"""Prompts and verifiers: synthetic tasks, reward functions, the expression evaluator, prepared datasets, the grain pipeline."""

# The submodules (``from jtc.data import *`` imports them).
__all__ = [
    'datasets',
    'expressions',
    'math_verifier',
    'pipeline',
    'rewards',
    'tasks',
    'verify_pool',
]
