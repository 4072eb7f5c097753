"""jtc.rl.rendezvous: processes (threads here) meeting on a free localhost port before JAX's
runtime starts. All arrive: every one returns, whatever the order they start in. One missing,
a count or an id that disagrees: process 0 names it and the others are refused with the same
words, within the deadline."""
import socket
import threading
import time

import pytest

from jtc.rl import rendezvous


def _free_port():
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def _meet(ids, num_processes, *, timeout_s=10.0, delay_0=0.0, counts=None):
  """Runs process 0 (after ``delay_0`` s) and each process of ``ids`` in threads; for each
  (0 first, then ``ids``) None when it went on, else its RendezvousError message."""
  port, out = _free_port(), {}
  deadline = time.monotonic() + timeout_s

  def process(i, pid):
    try:
      if pid == 0:
        time.sleep(delay_0)
        rendezvous.wait_for_all('127.0.0.1', port, num_processes=num_processes, deadline=deadline)
      else:
        rendezvous.join('127.0.0.1', port, process_id=pid,
                        num_processes=(counts or {}).get(pid, num_processes), deadline=deadline)
      out[i] = None
    except rendezvous.RendezvousError as e:
      out[i] = str(e)

  threads = [threading.Thread(target=process, args=a) for a in enumerate([0, *ids])]
  for t in threads:
    t.start()
  for t in threads:
    t.join(timeout_s + 10)
  return [out[i] for i in range(len(threads))]


@pytest.mark.parametrize('delay_0', [0.0, 0.5])  # process 0 first, or the others retrying
def test_every_process_goes_on_once_all_have_arrived(delay_0):
  assert _meet([1, 2, 3], 4, delay_0=delay_0) == [None] * 4


@pytest.mark.parametrize('ids, counts, said', [
    ([1], {}, 'process 2 of 3 never arrived'),
    ([1, 2], {
        2: 4
    }, 'process 2 says JAX_NUM_PROCESSES=4, process 0 says 3'),
    ([1, 1], {}, 'two processes say JAX_PROCESS_ID=1'),
])
def test_process_0_names_what_is_wrong_and_refuses_the_others(ids, counts, said):
  # A duplicate id is named as soon as the second hello arrives, so its case can afford a long
  # deadline (on a loaded machine a thread's hello came after 1.5 s, and the duplicate read as a
  # missing process); the other two are named at the deadline, which stays short.
  out = _meet(ids, 3, timeout_s=8.0 if 'two processes' in said else 1.5, counts=counts)
  assert said in out[0], out
  # Every other process stops too: refused with process 0's words, or (one that came after
  # process 0 stopped) unable to reach it.
  assert all(f'process 0 refused this process: {said}' in o or 'Connection refused' in o
             for o in out[1:]), out
  assert any('process 0 refused' in o for o in out[1:]), out


def test_a_port_that_answers_otherwise_is_not_taken_for_process_0():
  with socket.socket() as other:
    other.bind(('127.0.0.1', 0))
    other.listen()
    port = other.getsockname()[1]

    def answer():
      conn, _ = other.accept()
      conn.sendall(b'HTTP/1.1 400 Bad Request\n')
      conn.close()

    threading.Thread(target=answer, daemon=True).start()
    with pytest.raises(rendezvous.RendezvousError, match="answered 'HTTP/1.1 400 Bad Request'"):
      rendezvous.join('127.0.0.1', port, process_id=1, num_processes=2,
                      deadline=time.monotonic() + 5)


@pytest.mark.parametrize('address, parsed', [('h:1', ('h', 1)),
                                             ('10.0.0.1:1234', ('10.0.0.1', 1234)),
                                             ('[::1]:80', ('::1', 80))])
def test_an_address_is_host_and_port(address, parsed):
  assert rendezvous.parse_address(address) == parsed
