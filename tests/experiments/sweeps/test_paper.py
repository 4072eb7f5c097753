"""Tests of experiments/sweeps/paper.py's choices: the drift sweep's systematic-drift test is the
log-odds of two exchangeable phrasings, which keeps its level, not a log-share, which does not."""
import numpy as np

from experiments import stats


def _phrasing_walk(rng, num_runs, *, steps=150, prompts=16, group=8, lr=8.0, bias=0.0):
  """Changes of log q(f) for (answer, result, final) over ``num_runs`` tabular policies trained
  with token-level group-normalised REINFORCE (exchangeable updates). Like the phrasing task's
  tokens: the first choice is 'F'inal vs 'T'he (p = 1/3 vs 2/3), then 'a'nswer vs 'r'esult.
  Reward ~ Bernoulli(0.5 + bias * [answer]): bias = 0 is phrasing-irrelevant. [num_runs, 3]."""
  z1, z2 = np.full(num_runs, np.log(0.5)), np.zeros(num_runs)
  shape = (num_runs, prompts, group)
  for _ in range(steps):
    p_final, p_answer = 1 / (1 + np.exp(-z1)), 1 / (1 + np.exp(-z2))
    final = rng.random(shape) < p_final[:, None, None]
    answer = (rng.random(shape) < p_answer[:, None, None]) & ~final
    r = (rng.random(shape) < 0.5 + bias * answer).astype(np.float64)
    adv = (r - r.mean(-1, keepdims=True)) / (r.std(-1, keepdims=True) + 1e-6)
    z1 += lr * (adv * (final - p_final[:, None, None])).mean((1, 2))
    z2 += lr * (adv * ~final * (answer - p_answer[:, None, None])).mean((1, 2))
  p_final, p_answer = 1 / (1 + np.exp(-z1)), 1 / (1 + np.exp(-z2))
  q = np.stack([(1 - p_final) * p_answer, (1 - p_final) * (1 - p_answer), p_final], 1)
  return np.log(q) - np.log(1 / 3)


def _rejection_rate(changes_R, seeds=8):
  """Share of sets of ``seeds`` runs whose exact sign-flip test against 0 has p < 0.05."""
  sets = changes_R.reshape(-1, seeds)
  return np.mean([stats.paired_signflip_pvalue(x, np.zeros(seeds)) < 0.05 for x in sets])


def test_drift_of_a_phrasing_pair_log_odds_is_a_valid_test_and_a_log_share_is_not():
  """The drift sweep's systematic-drift table: with phrasing-irrelevant reward and exchangeable
  updates, the phrasing distribution still collapses (a random walk), and every log-share falls
  on most seeds, so testing one log-share against 0 rejects far above 5%; the log-odds of the
  two phrasings exchangeable by construction keeps its level, and detects a reward that
  prefers one of them (the known-positive control)."""
  null = _phrasing_walk(np.random.default_rng(0), 160)
  q = np.exp(null + np.log(1 / 3))
  assert np.mean(-(q * np.log(q)).sum(1)) < 0.8  # collapsed from log 3 = 1.10, as in the runs
  assert max(_rejection_rate(null[:, 0]), _rejection_rate(null[:, 1])) >= 0.2
  assert _rejection_rate(null[:, 0] - null[:, 1]) <= 0.1
  biased = _phrasing_walk(np.random.default_rng(1), 160, bias=0.05)
  assert _rejection_rate(biased[:, 0] - biased[:, 1]) >= 0.8
