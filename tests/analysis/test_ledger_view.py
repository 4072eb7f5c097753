"""The ledger viewer in a real headless Chromium (Debian's chromium, driven by playwright with the
system browser): the page shows one cell per token of a group, switching the objective changes the
colours, side by side shows every objective, hovering carries the numbers. It runs in CI (.ci/run
installs chromium and sets CI=true), where a missing browser fails the test. Elsewhere (the
README's test command on a machine without Chromium, where installing a system package needs
root) it skips with the command that installs it: the README's command stays one line that any
user can run, and CI still cannot pass without the browser."""
import os
import shutil

import numpy as np
import pytest
from playwright.sync_api import sync_playwright

from jtc.cli import ledger as ledger_cli
from jtc.analysis import ledger as ledger_lib

CHROMIUM = os.environ.get('JTC_CHROMIUM') or shutil.which('chromium') or '/usr/bin/chromium'
INSTALL = 'apt-get install -y chromium (Debian), or JTC_CHROMIUM=/path/to/chromium'
FLAGS = [
    '--headless', '--no-sandbox', '--disable-gpu', '--disable-background-networking',
    '--no-first-run'
]


@pytest.fixture(scope='session')  # before the session-scoped run_with_ledger
def chromium():
  """The browser's path; checked before the ledger run the test also needs is trained."""
  if not os.path.exists(CHROMIUM):
    missing = f'no Chromium at {CHROMIUM}: {INSTALL}'
    if os.environ.get('CI', '').lower() in ('1', 'true'):
      pytest.fail(missing)
    pytest.skip(missing)
  return CHROMIUM


def test_the_viewer_shows_tokens_and_switches_objectives(chromium, run_with_ledger, tmp_path):
  page_path, png_path = str(tmp_path / 'step.html'), str(tmp_path / 'step.png')
  assert ledger_cli.main([
      'html', run_with_ledger, '--step', '2', '--objectives', 'grpo,gspo', '--out', page_path,
      '--png', png_path
  ]) == 0
  with open(png_path, 'rb') as f:
    assert f.read(8) == b'\x89PNG\r\n\x1a\n'
  ledger = ledger_lib.load(run_with_ledger, 2)
  G = ledger.meta['group_size']
  real_tokens = int((ledger['completion_mask_BT'][:G] > 0).sum())
  with sync_playwright() as p:
    browser = p.chromium.launch(executable_path=chromium, args=FLAGS)
    page = browser.new_page()
    errors = []
    page.on('pageerror', lambda e: errors.append(str(e)))
    page.goto('file://' + page_path)
    cells = page.locator('#view .tok')
    assert cells.count() == real_tokens
    colours = lambda: page.eval_on_selector_all('#view .tok',
                                                'els => els.map(e => e.style.background)')
    grpo = colours()
    assert len(set(grpo)) > 1  # the coefficients differ between tokens
    assert 'c=' in cells.first.get_attribute('title') and 'ratio=' in cells.first.get_attribute(
        'title')
    page.check('input[value="gspo"]')
    assert page.locator('#view .objective').get_attribute('data-objective') == 'gspo'
    assert cells.count() == real_tokens and colours() != grpo  # off-policy: they differ
    # At the behaviour policy every ratio is 1 and GSPO's weights equal GRPO's: same colours.
    page.select_option('#point', 'behaviour')
    gspo_on_policy = colours()
    page.check('input[value="grpo"]')
    assert colours() == gspo_on_policy
    page.select_option('#point', 'offpolicy')
    page.check('input[value="grpo"]')
    assert colours() == grpo
    page.check('input[value="*"]')
    assert page.locator('#view .objective').count() == 2 and cells.count() == 2 * real_tokens
    page.select_option('#group', '1')
    assert cells.count() == 2 * int((ledger['completion_mask_BT'][G:2 * G] > 0).sum())
    browser.close()
  assert not errors, errors


def test_the_viewer_opens_an_imported_ledger_and_colours_by_the_framework(chromium, tmp_path):
  """A prime-rl token export imported by `jtc ledger import` (tests/interop/test_prime_rl.py
  writes it as prime-rl does) opens in the viewer, which colours by jtc's coefficient, prime-rl's
  or their difference."""
  from jtc import cli  # pylint: disable=import-outside-toplevel
  from tests.interop import test_prime_rl  # pylint: disable=import-outside-toplevel
  step_dir = test_prime_rl._step(tmp_path / 'run')[0]  # pylint: disable=protected-access
  out, page_path = str(tmp_path / 'W'), str(tmp_path / 'view.html')
  assert cli.main(['ledger', 'import', '--from', 'prime-rl', step_dir, '--out', out]) == 0
  assert cli.main(
      ['ledger', 'html', out, '--step', '7', '--objectives', 'dapo,grpo', '--out', page_path]) == 0
  ledger = ledger_lib.load(out, 7)
  G = ledger.meta['group_size']
  real_tokens = int((ledger['completion_mask_BT'][:G] > 0).sum())
  with sync_playwright() as p:
    browser = p.chromium.launch(executable_path=chromium, args=FLAGS)
    page = browser.new_page()
    errors = []
    page.on('pageerror', lambda e: errors.append(str(e)))
    page.goto('file://' + page_path)
    cells = page.locator('#view .tok')
    assert cells.count() == real_tokens
    colours = lambda: page.eval_on_selector_all('#view .tok',
                                                'els => els.map(e => e.style.background)')
    jtc_colours = colours()
    assert len(set(jtc_colours)) > 1 and 'framework=' in cells.first.get_attribute('title')
    page.select_option('#colour', 'framework')
    framework = colours()
    page.select_option('#colour', 'diff')
    diff = colours()
    assert framework != jtc_colours and diff != framework and cells.count() == real_tokens
    browser.close()
  assert not errors, errors


def test_the_viewer_colours_a_moe_run_by_its_routing_flips(chromium, run_with_ledger, tmp_path):
  """A ledger with a routing-flip column (a mixture-of-experts run's, `jtc.rl.routing`; here set
  on every other real token of a copy): 'Colour by routing flip' paints exactly those red, the
  others white, and their hover text says so."""
  run = tmp_path / 'run'
  shutil.copytree(run_with_ledger, run)
  path = run / ledger_lib.LEDGER_DIR / '2' / 'ledger.npz'
  columns = dict(np.load(path))
  flips = np.zeros_like(columns['completion_mask_BT'])
  flips[:, ::2] = columns['completion_mask_BT'][:, ::2]
  np.savez(path, **columns, routing_flip_BT=flips)
  page_path = str(tmp_path / 'step.html')
  assert ledger_cli.main(
      ['html', str(run), '--step', '2', '--objectives', 'gspo', '--out', page_path]) == 0
  G = ledger_lib.load(str(run), 2).meta['group_size']
  real = columns['completion_mask_BT'][:G] > 0
  expected = [bool(f) for f, r in zip(flips[:G].ravel(), real.ravel()) if r]
  with sync_playwright() as p:
    browser = p.chromium.launch(executable_path=chromium, args=FLAGS)
    page = browser.new_page()
    page.goto('file://' + page_path)
    page.select_option('#colour', 'routing')
    colours = page.eval_on_selector_all('#view .tok', 'els => els.map(e => e.style.background)')
    titles = page.eval_on_selector_all('#view .tok', 'els => els.map(e => e.title)')
    browser.close()
  assert [c == 'rgb(255, 0, 0)' for c in colours] == expected
  assert [c == 'rgb(255, 255, 255)' for c in colours] == [not e for e in expected]
  assert ['routing-flip' in t for t in titles] == expected
