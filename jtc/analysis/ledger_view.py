"""The ledger in a browser and in a picture: a group's G completions as rows of tokens coloured by
what each objective does to each token.

  python -m jtc.ledger html W --step N --objectives grpo,gspo,dfpo_min_replace --out step.html

`html` writes ONE self-contained page (the data inline as JSON, no network): controls for the
point (behaviour policy / off-policy), the group and the objective (or all objectives side by
side); each token is a cell coloured by u = -c_{b,t}, the direction the objective moves that
token's log-prob (red: raised, blue: lowered, white: untouched; one colour scale per group and
point, shared by the objectives so they compare); hovering shows the numbers and the flags;
tokens the whole group shares at that position are underlined. `png` draws one group for the
docs/ledger.md.
"""

import html as html_lib
import json
import os

import numpy as np

from jtc.analysis import curve_plots

_STYLE = '''
body { font-family: sans-serif; margin: 1em; }
#controls { margin-bottom: 0.8em; } #controls > * { margin-right: 1.2em; }
.objective { display: inline-block; vertical-align: top; margin-right: 1.5em; }
.objective h3 { font-size: 0.95em; margin: 0.3em 0; }
.row { font-family: monospace; white-space: pre; margin: 2px 0; }
.meta { display: inline-block; width: 9em; color: #555; font-size: 0.8em; }
.tok { display: inline-block; min-width: 0.7em; padding: 1px 0; border: 1px solid transparent; }
.tok.shared { border-bottom: 2px solid #000; }
.tok.clipped { outline: 1px dashed #444; }
#legend span { display: inline-block; width: 2.2em; text-align: center; font-size: 0.75em; }
'''

_SCRIPT = '''
const D = JSON.parse(document.getElementById('ledger-data').textContent);
function colour(u, scale) {
  const x = Math.max(-1, Math.min(1, u / scale));
  const a = Math.round(255 * (1 - Math.abs(x)));
  return x >= 0 ? `rgb(255,${a},${a})` : `rgb(${a},${a},255)`;
}
const fmt = (x, d) => x === null ? 'n/a' : x.toFixed(d);
function shown(n, P, b, t) {  // the value a cell is coloured by: jtc's c, the framework's, or c - theirs
  const by = document.getElementById('colour') ? document.getElementById('colour').value : 'jtc';
  const c = P[n].coef[b][t];
  if (by === 'jtc') return c;
  if (by === 'routing') return D.routing[b][t] ? -1 : 0;  // red: the token's experts flipped
  const f = D.framework.coef[b][t];
  return by === 'framework' ? f : c - f;
}
function render() {
  const point = document.getElementById('point').value;
  const g = +document.getElementById('group').value;
  const chosen = document.querySelector('input[name=objective]:checked').value;
  const names = chosen === '*' ? D.objectives : [chosen];
  const P = D.points[point], G = D.group_size;
  let scale = 1e-30;
  for (const n of D.objectives) for (let i = 0; i < G; i++)
    for (let t = 0; t < D.tokens[g * G + i].length; t++)
      scale = Math.max(scale, Math.abs(shown(n, P, g * G + i, t)));
  const view = document.getElementById('view');
  view.innerHTML = '';
  for (const n of names) {
    const box = document.createElement('div');
    box.className = 'objective';
    box.dataset.objective = n;
    box.innerHTML = `<h3>${n} (residual on shared tokens: ${P[n].residual_by_group[g] === null ?
        'n/a' : P[n].residual_by_group[g].toFixed(3)})</h3>`;
    for (let i = 0; i < G; i++) {
      const b = g * G + i, row = document.createElement('div');
      row.className = 'row';
      row.innerHTML = `<span class="meta">A=${D.advantages[b].toFixed(2)} r=${fmt(D.rewards[b], 2)}</span>`;
      for (let t = 0; t < D.tokens[b].length; t++) {
        if (!D.real[b][t]) continue;
        const c = P[n].coef[b][t], cell = document.createElement('span');
        cell.className = 'tok' + (D.shared[b][t] ? ' shared' : '') +
            (P[n].clip_low[b][t] || P[n].clip_high[b][t] ? ' clipped' : '');
        cell.textContent = D.tokens[b][t];
        cell.style.background = colour(-shown(n, P, b, t), scale);
        cell.title = `${JSON.stringify(D.tokens[b][t])}  c=${c.toExponential(3)}  ` +
            (D.framework ? `framework=${D.framework.coef[b][t].toExponential(3)}  ` : '') +
            `ratio=${P[n].ratio[b][t].toFixed(4)}  log pi_old=${fmt(D.old_logps[b][t], 3)}  ` +
            `A=${D.advantages[b].toFixed(3)}` + (D.shared[b][t] ? '  shared' : '') +
            (P[n].clip_low[b][t] ? '  clipped-low' : '') +
            (P[n].clip_high[b][t] ? '  clipped-high' : '') + (P[n].gated[b] ? '  gated' : '') +
            (D.mask[b][t] ? '' : '  masked') + (D.truncated[b] ? '  truncated' : '') +
            (D.weights ? `  weight=${D.weights[b][t].toFixed(3)}` : '') +
            (D.routing && D.routing[b][t] ? '  routing-flip' : '');
        row.appendChild(cell);
      }
      box.appendChild(row);
    }
    view.appendChild(box);
  }
}
for (const id of ['point', 'group', 'colour'])
  if (document.getElementById(id)) document.getElementById(id).onchange = render;
for (const el of document.querySelectorAll('input[name=objective]')) el.onchange = render;
render();
'''


def page_data(ledger, replayed, names):
  """What the page needs, as plain lists (the per-point results of `replay.replay`)."""
  c = ledger.columns
  real = c['completion_mask_BT'] > 0
  return {
      'step': ledger.meta['step'],
      'loss': ledger.meta['loss'],
      'objectives': list(names),
      'group_size': ledger.meta['group_size'],
      'tokens': [[ledger.token_text(i) for i in row] for row in c['completion_BT']],
      'real': real.tolist(),
      'mask': (c['mask_BT'] > 0).tolist(),
      'shared': c['shared_BT'].astype(bool).tolist(),
      'advantages': c['advantages_B'].astype(float).tolist(),
      'rewards': _finite(c['rewards_B']),
      'truncated': c['truncated_B'].astype(bool).tolist(),
      'old_logps': _finite(c['old_logps_BT']),
      'weights': c['token_weights_BT'].astype(float).tolist() if 'token_weights_BT' in c else None,
      # An imported ledger's framework coefficient (`jtc.interop.ledger_import`).
      'framework': {
          'name': ledger.meta['source']['format'],
          'coef': _finite(c['framework_coef_BT'])
      } if 'framework_coef_BT' in c else None,
      # A mixture-of-experts run's routing flips (sampler vs trainer experts differ, any layer).
      'routing': (c['routing_flip_BT'] > 0).tolist() if 'routing_flip_BT' in c else None,
      'points': {
          p: {
              n: r['objectives'][n] for n in names
          } for p, r in replayed.items()
      }
  }


def _finite(x):
  """Nested lists of floats with None for NaN (unavailable; JSON has no NaN)."""
  x = np.asarray(x, float)
  return np.where(np.isnan(x), None, x).tolist()


def html(ledger, replayed, names):
  """The page (a string): see the module docstring."""
  data = page_data(ledger, replayed, names)
  groups = len(data['tokens']) // data['group_size']
  last = list(replayed)[-1]  # shown first: off-policy, where the objectives differ
  points = ''.join(
      f'<option value="{p}"{" selected" if p == last else ""}>{p}</option>' for p in replayed)
  group_opts = ''.join(f'<option value="{g}">group {g}</option>' for g in range(groups))
  radios = ''.join(f'<label><input type="radio" name="objective" value="{html_lib.escape(n)}"'
                   f'{" checked" if i == 0 else ""}>{html_lib.escape(n)}</label> '
                   for i, n in enumerate(names))
  radios += '<label><input type="radio" name="objective" value="*">side by side</label>'
  colours = []
  if data['framework']:
    fw = html_lib.escape(data['framework']['name'])
    colours += [('framework', f"{fw}'s coefficient"), ('diff', f'jtc - {fw}')]
  if data['routing']:
    colours.append(('routing', 'routing flip (red)'))
  if colours:
    radios += (' <label>Colour by <select id="colour"><option value="jtc">jtc\'s coefficient'
               '</option>' + ''.join(f'<option value="{v}">{t}</option>' for v, t in colours) +
               '</select></label>')
  legend = ''.join(
      f'<span style="background:{_css_colour(x)}">{x:+.1f}</span>' for x in np.linspace(-1, 1, 9))
  payload = json.dumps(data, allow_nan=False).replace('</', '<\\/')
  source = ledger.meta.get('source')
  source = f', imported from {html_lib.escape(source["format"])}' if source else ''
  return f'''<!doctype html>
<html><head><meta charset="utf-8"><title>jtc ledger: step {data["step"]}</title>
<style>{_STYLE}</style></head><body>
<h2>Per-token ledger, step {data["step"]} (run objective: {html_lib.escape(data["loss"])}){source}</h2>
<p>Cell colour: u = -dL/d log pi of the token (red: the update raises its log-prob, blue: lowers
it), scaled by the largest |c| of the group at this point over all objectives. Underlined: every
member of the group has this token at this position after the same prefix. Dashed: clipped.</p>
<div id="controls"><label>Point <select id="point">{points}</select></label>
<label>Group <select id="group">{group_opts}</select></label> <span>{radios}</span></div>
<div id="legend">u / max|c|: {legend}</div>
<div id="view"></div>
<script type="application/json" id="ledger-data">{payload}</script>
<script>{_SCRIPT}</script>
</body></html>
'''


def _css_colour(x):
  a = round(255 * (1 - abs(x)))
  return f'rgb(255,{a},{a})' if x >= 0 else f'rgb({a},{a},255)'


def png(ledger, replayed, names, path, *, group=0, point=None):
  """One group of one point, the objectives side by side, as a picture for docs/ledger.md."""
  plt = curve_plots.plt
  point = point or list(replayed)[-1]
  G = ledger.meta['group_size']
  c = ledger.columns
  rows = range(group * G, group * G + G)
  coefs = {n: np.asarray(replayed[point]['objectives'][n]['coef']) for n in names}
  scale = max(max(float(np.abs(v[list(rows)]).max()) for v in coefs.values()), 1e-30)
  width = max(int(c['completion_mask_BT'][list(rows)].sum(-1).max()), 1)
  cols = min(2, len(names))
  nrows = -(-len(names) // cols)
  fig, axes = plt.subplots(nrows, cols,
                           figsize=(0.16 * width * cols + 2.0, (0.3 * G + 0.9) * nrows),
                           squeeze=False)
  for ax in axes.flat[len(names):]:
    ax.axis('off')
  for ax, n in zip(axes.flat, names):
    for i, b in enumerate(rows):
      for t in np.flatnonzero(c['completion_mask_BT'][b]):
        u = -coefs[n][b, t] / scale
        ax.add_patch(curve_plots.plt.Rectangle((t, -i - 0.5), 1, 1, color=_rgb(u)))
        ax.text(t + 0.5, -i, ledger.token_text(c['completion_BT'][b, t]), ha='center', va='center',
                fontsize=6, family='monospace')
        if c['shared_BT'][b, t]:
          ax.plot([t + 0.1, t + 0.9], [-i - 0.42, -i - 0.42], color='k', lw=0.8)
      ax.text(-0.5, -i, f'A={c["advantages_B"][b]:+.2f}', ha='right', va='center', fontsize=6)
    residual = replayed[point]['objectives'][n]['residual_by_group'][group]
    ax.set_title(
        f'{n}: shared-token residual ' + ('n/a (no coefficient on the tokens the group shares)'
                                          if residual is None else f'{residual:.3f}'), fontsize=8)
    ax.set_xlim(-4, width)
    ax.set_ylim(-G + 0.4, 0.6)
    ax.axis('off')
  fig.suptitle(
      f'step {ledger.meta["step"]}, group {group}, {point}: red = log-prob raised, '
      'blue = lowered, underline = shared by the group', fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=130)
  plt.close(fig)
  return path


def _rgb(x):
  x = float(np.clip(x, -1, 1))
  a = 1 - abs(x)
  return (1.0, a, a) if x >= 0 else (a, a, 1.0)


def check_outputs(paths, *, overwrite, group, num_groups):
  """ValueError, before any compute, for an existing output among ``paths`` (None entries are
  skipped) unless ``overwrite``, or a ``group`` the step does not have."""
  for path in paths:
    if path and os.path.exists(path) and not overwrite:
      raise ValueError(f'{path} exists; pass --overwrite to replace it')
  if not 0 <= group < num_groups:
    raise ValueError(f'--group {group}: the step has groups 0..{num_groups - 1}')


def write(ledger, replayed, names, out, *, png_path=None, group=0):
  """The page to ``out`` and, with ``png_path``, the picture of ``group``; returns the paths."""
  with open(out, 'w') as f:
    f.write(html(ledger, replayed, names))
  return [out] + ([png(ledger, replayed, names, png_path, group=group)] if png_path else [])
