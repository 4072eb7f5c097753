"""Prompts and verifiers: synthetic tasks, reward functions (jtc's, verl's rules, users' own), the expression evaluator, dataset formats, prepared datasets, the grain pipeline."""

# The submodules (``from jtc.data import *`` imports them).
__all__ = [
    'custom_rewards',
    'datasets',
    'examples',
    'expressions',
    'file_lists',
    'formats',
    'math_verifier',
    'overlong',
    'pipeline',
    'preview',
    'rewards',
    'selection',
    'tasks',
    'traps',
    'verifiers',
    'verify_pool',
    'verl_rules',
]
