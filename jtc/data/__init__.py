"""Prompts and verifiers: synthetic tasks, reward functions, the expression evaluator, dataset formats, prepared datasets, the grain pipeline."""

# The submodules (``from jtc.data import *`` imports them).
__all__ = [
    'datasets',
    'expressions',
    'formats',
    'math_verifier',
    'pipeline',
    'rewards',
    'tasks',
    'verify_pool',
]
