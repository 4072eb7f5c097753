"""DelTA's options: `DeltaOptions` (every knob of `jtc.objectives.delta.token_coefficients`) and
the named ablations of DelTA Table 4 and Figure 3 (`DELTA_ABLATIONS`, chosen with
``--config.delta.ablation=NAME``)."""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

_SCOPES = ('batch', 'group')
_PROXIES = ('lm_head', 'topk_hidden')
_SELECTIONS = (None, 'top', 'bottom', 'random', 'top_pooled', 'bottom_pooled', 'random_pooled')

# Named configurations reproducing DelTA Table 4 (component, within-side and proxy
# ablations) and Figure 3 (hard token selection). Each value is a dict of keyword
# options for `token_coefficients`; pick one with `ablation_options(name)`.
DELTA_ABLATIONS: dict[str, dict[str, Any]] = {
    # Full DelTA: adaptive gamma, soft assignment, K = 1, range map, normalisation.
    'full': {},
    # Table 4 "w/o adaptive gamma": one fixed temperature for both sides and every
    # refinement step. The digest does not state the paper's value. Margins are
    # differences of squared distances, so gamma is stated in units of the mean squared
    # proxy norm E||v||^2 of the scored tokens (the scale margins are measured in): the
    # ablation means the same on any model, whatever its hidden-state norms. 1.0 is our
    # choice; the trainer logs the resulting gamma next to the adaptive one.
    'no_adaptive_gamma': {
        'gamma': 1.0
    },
    # Table 4 "w/o h(alpha)": no entropy regulariser in the assignment objective, so
    # its maximiser is the hard assignment alpha = 1[margin > 0].
    'no_soft_assignment': {
        'soft_assignment': False
    },
    # Table 4 "w/o lambda-norm": keep lam in [lam_min, lam_max], no N / sum(lam).
    'no_normalization': {
        'normalize': False
    },
    # Table 4 "w/o range map": raw scores alpha* in [0, 1] instead of the affine map.
    'no_range_map': {
        'range_map': False
    },
    # Table 4 "w/o refinement": K = 0, score against the initial |A|-weighted centroids.
    'no_refinement': {
        'num_refine': 0
    },
    # Table 4 "within-side only": own-side centrality, no opposite-side comparison.
    'within_side_only': {
        'within_side_only': True
    },
    # Table 4 "random lambda": i.i.d. uniform alpha, same range map and normalisation.
    'random_lambda': {
        'random_lambda': True
    },
    # Table 4 "top-K hidden-gradient proxy" (see `topk_hidden_proxy`).
    'topk_proxy': {
        'proxy': 'topk_hidden'
    },
    # Figure 3: hard masks keeping the top-lambda, bottom-lambda or a random half of
    # the tokens of EACH advantage side (the same share kept on both sides), so the
    # comparison is about which tokens, not about positive- vs negative-only training.
    'select_top': {
        'selection': 'top'
    },
    'select_bottom': {
        'selection': 'bottom'
    },
    'select_random': {
        'selection': 'random'
    },
    # The same masks ranked over all valid tokens of the batch pooled (the rule of the
    # first jtc runs): lam differs mostly by side, so top keeps mostly positive-side and
    # bottom mostly negative-side (and zero-advantage) tokens.
    'select_top_pooled': {
        'selection': 'top_pooled'
    },
    'select_bottom_pooled': {
        'selection': 'bottom_pooled'
    },
    'select_random_pooled': {
        'selection': 'random_pooled'
    },
}


def ablation_options(name: str) -> dict[str, Any]:
  """Options dict of the named DelTA ablation (a copy); unknown name -> ValueError."""
  if name not in DELTA_ABLATIONS:
    raise ValueError(f'Unknown DelTA ablation {name!r}; valid: {sorted(DELTA_ABLATIONS)}')
  return dict(DELTA_ABLATIONS[name])


# ----------------------------------------------------------------------------------
# The estimator.
# ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class DeltaOptions:
  """Every option of the DelTA estimator (hashable: static under jit).

    lam_min, lam_max: range map bounds (paper: [0.8, 1.2]).
    num_refine: K refinement iterations (paper: 1; Table 4 "w/o refinement" = 0).
    gamma: None = adaptive per side (std of the margins); a float = fixed temperature for
      both sides and every refinement step, in units of E||v||^2 (the mean squared proxy
      norm of the scored tokens of the scope segment; Table 4 "w/o adaptive gamma").
    scope: 'batch' (centroids over the rollout batch, as the paper computes once per
      rollout batch) or 'group' (centroids per prompt group). Normalisation and selection
      use the same scope.
    soft_assignment: False = hard alpha = 1[m > 0] (Table 4 "w/o h(alpha)").
    normalize: False = skip lam * N / sum(lam) (Table 4 "w/o lambda-norm"): the loss is
      then sum(lam * ppo) / N (`surrogates.delta` does not renormalise).
    range_map: False = raw scores lam = alpha* (Table 4 "w/o range map").
    within_side_only: own-side centrality m = mean(d_own) - d_own instead of the
      opposite-side margin (Table 4 "within-side only").
    random_lambda: alpha ~ U(0, 1) i.i.d. for scored tokens (Table 4 "random lambda").
    proxy: 'lm_head' (paper default) or 'topk_hidden' (Table 4, `topk_hidden_proxy`).
    topk: K of the top-K proxy.
    selection: None, or Figure 3 hard masks 'top' / 'bottom' (the ceil(n/2) tokens of
      highest / lowest lam among the A != 0 tokens of each advantage side of a scope
      segment) / 'random' (a random half of each side); '*_pooled' rank all valid
      tokens of the segment together. lam becomes 1 for kept and 0 for dropped tokens
      (zero-advantage tokens are dropped by the per-side rules: they carry no gradient),
      then normalised.
    chunk_size: tokens per chunk of v.
    """
  lam_min: float = 0.8
  lam_max: float = 1.2
  num_refine: int = 1
  gamma: Optional[float] = None
  scope: str = 'batch'
  soft_assignment: bool = True
  normalize: bool = True
  range_map: bool = True
  within_side_only: bool = False
  random_lambda: bool = False
  proxy: str = 'lm_head'
  topk: int = 16
  selection: Optional[str] = None
  chunk_size: int = 4096

  def __post_init__(self):
    if self.scope not in _SCOPES:
      raise ValueError(f'Unknown scope {self.scope!r}; valid: {list(_SCOPES)}')
    if self.proxy not in _PROXIES:
      raise ValueError(f'Unknown proxy {self.proxy!r}; valid: {list(_PROXIES)}')
    if self.selection not in _SELECTIONS:
      raise ValueError(f'Unknown selection {self.selection!r}; valid: {list(_SELECTIONS)}')
    if not self.lam_min <= self.lam_max:
      raise ValueError(f'Need lam_min <= lam_max, got lam_min={self.lam_min}, '
                       f'lam_max={self.lam_max}')
    if not (isinstance(self.num_refine, int) and self.num_refine >= 0):
      raise ValueError(f'num_refine must be an int >= 0, got {self.num_refine!r}')
    if self.gamma is not None and not self.gamma > 0:
      raise ValueError(f'gamma must be None (adaptive) or > 0, got {self.gamma!r}')
    if not (isinstance(self.chunk_size, int) and self.chunk_size >= 1):
      raise ValueError(f'chunk_size must be an int >= 1, got {self.chunk_size!r}')
    if not (isinstance(self.topk, int) and self.topk >= 1):
      raise ValueError(f'topk must be an int >= 1, got {self.topk!r}')

  @property
  def uses_rng(self) -> bool:
    return self.random_lambda or self.selection in ('random', 'random_pooled')


def options_for(ablation: str, **settings: Any) -> DeltaOptions:
  """`DeltaOptions` of the named ablation on top of ``settings`` (the ablation wins)."""
  return DeltaOptions(**{**settings, **ablation_options(ablation)})
