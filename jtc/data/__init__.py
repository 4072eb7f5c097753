"""Prompts and verifiers: synthetic tasks, reward functions, the expression evaluator, prepared datasets, the grain pipeline."""
