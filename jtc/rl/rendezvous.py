"""The check before `jax.distributed.initialize`: every process reaches process 0 at the
coordinator address, within a timeout, or fails saying what it tried.

JAX's runtime reports none of these start-up failures as an error: a coordinator that is not
there, a peer that never starts, and a process 0 whose port is taken all end in an abort (a
C++ stack trace saying that "another task died"), or a segmentation fault, minutes later. So
before handing over, the processes meet on the coordinator's port themselves:

  process 0   listens on the port (another program holding it is named at once), connects to
              the address itself (an address that does not reach process 0's host is named at
              once), then waits until every process 0..N-1 has said hello;
  process i   resolves the address and connects, retrying until the timeout (process 0 may
              start later), says hello, and waits for process 0's go.

A hello is ``jtc-rendezvous <process id> <process count>``; process 0 answers ``go`` once all
have arrived, or ``refused <why>`` (another process count, a process id given twice, the
timeout). Then process 0 closes the port and JAX's coordination service takes it over.
"""

import errno
import selectors
import socket
import time

HELLO = 'jtc-rendezvous'
RETRY_S = 1.0  # between connection attempts of a process waiting for process 0
# A process connected to process 0 waits this long past its own deadline for process 0's verdict,
# which comes at process 0's deadline at the latest: with equal timeouts the two deadlines
# coincide, and the verdict (what is wrong) is the message worth waiting for.
VERDICT_GRACE_S = 2.0


class RendezvousError(RuntimeError):
  """A start-up that cannot go on (the message says what was tried and what to check)."""


def parse_address(address):
  """'host:port' (or '[v6]:port') -> (host, port); RendezvousError at once when malformed."""
  host, sep, port = str(address).rpartition(':')
  host = host[1:-1] if host.startswith('[') and host.endswith(']') else host
  if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
    raise RendezvousError(f'JAX_COORDINATOR_ADDRESS={address!r} is not host:port (a host name or '
                          'IP address, a colon, a port in 1..65535; e.g. 10.0.0.1:1234)')
  return host, int(port)


def _hello(process_id, num_processes):
  return f'{HELLO} {process_id} {num_processes}\n'.encode()


def _read_line(sock, deadline):
  """A line from ``sock`` ('' at EOF or when the deadline passes first)."""
  data = b''
  while not data.endswith(b'\n'):
    sock.settimeout(max(deadline - time.monotonic(), 0.01))
    try:
      chunk = sock.recv(256)
    except (socket.timeout, OSError):
      return ''
    if not chunk:
      return ''
    data += chunk
  return data.decode(errors='replace').strip()


def join(host, port, *, process_id, num_processes, deadline):
  """Process ``process_id`` > 0: connects and says hello until process 0 answers go (returns)
  or refuses, or the deadline passes (RendezvousError with the last thing that went wrong)."""
  last = 'nothing tried'
  while time.monotonic() < deadline:
    wait_s = min(5.0, max(deadline - time.monotonic(), 0.1))
    try:
      with socket.create_connection((host, port), timeout=wait_s) as s:
        s.sendall(_hello(process_id, num_processes))
        answer = _read_line(s, deadline + VERDICT_GRACE_S)
    except socket.gaierror as e:
      last = f'the host name {host!r} does not resolve ({e.strerror})'
    except OSError as e:
      last = f'the last connection attempt failed: {e.strerror or e}'
    else:
      if answer == 'go':
        return
      if answer.startswith('refused '):
        raise RendezvousError(f'process 0 refused this process: {answer[len("refused "):]}')
      if answer:
        raise RendezvousError(f'the program listening there answered {answer[:80]!r}, not as '
                              'jtc\'s process 0: is the port another program\'s?')
      last = ('process 0 was there but still waiting for other processes (its log names them)'
              if time.monotonic() >= deadline else 'process 0 closed the connection')
    time.sleep(min(RETRY_S, max(deadline - time.monotonic(), 0)))
  raise RendezvousError(last)


def _listen(port, bind_host):
  """A listening socket on the port JAX's service will bind (all interfaces, as JAX does)."""
  family = socket.AF_INET6 if ':' in bind_host or bind_host == '' else socket.AF_INET
  try:
    listener = socket.socket(family, socket.SOCK_STREAM)
  except OSError:  # no IPv6 on this host
    listener, bind_host = socket.socket(socket.AF_INET, socket.SOCK_STREAM), '0.0.0.0'
  listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # not refused by TIME_WAIT
  try:
    listener.bind((bind_host, port))
    listener.listen(64)
  except OSError as e:
    listener.close()
    if e.errno == errno.EADDRINUSE:
      raise RendezvousError(f'port {port} is taken by another program on this host (another '
                            'run\'s coordinator?); choose a free port') from None
    raise RendezvousError(f'cannot listen on port {port}: {e.strerror}') from None
  return listener


def wait_for_all(host, port, *, num_processes, deadline, bind_host=''):
  """Process 0: listens, checks that ``host`` reaches it, waits for every process's hello
  and answers go (returns), or refuses them all and raises RendezvousError naming who is
  missing or what disagrees."""
  listener = _listen(port, bind_host)
  peers = {}  # socket -> the process id it said hello for (None until it has)
  sel = selectors.DefaultSelector()
  sel.register(listener, selectors.EVENT_READ)
  try:
    try:
      me = socket.create_connection((host, port), timeout=5)
    except OSError as e:
      raise RendezvousError(f'the address does not reach this host ({e.strerror or e}); process 0 '
                            'must run on the host that JAX_COORDINATOR_ADDRESS names') from None
    me.sendall(_hello(0, num_processes))
    try:
      _gather(sel, listener, peers, num_processes, deadline)
    except RendezvousError as e:
      _answer(peers, f'refused {e}')
      raise
    _answer(peers, 'go')
    me.close()
  finally:
    for s in [listener, *peers]:
      s.close()
    sel.close()


def _gather(sel, listener, peers, num_processes, deadline):
  """Accepts connections and reads hellos until processes 0..N-1 are all there."""
  while True:
    arrived = sorted(p for p in peers.values() if p is not None)
    if arrived == list(range(num_processes)):
      return
    left = deadline - time.monotonic()
    if left <= 0:
      missing = sorted(set(range(num_processes)) - set(arrived))
      raise RendezvousError(_missing(missing, num_processes))
    for key, _ in sel.select(timeout=min(left, 1.0)):
      if key.fileobj is listener:
        conn, _ = listener.accept()
        peers[conn] = None
        sel.register(conn, selectors.EVENT_READ)
        continue
      conn = key.fileobj
      line = _read_line(conn, time.monotonic() + 1.0) if peers[conn] is None else ''
      sel.unregister(conn)
      if peers[conn] is not None or not line:  # a peer that left, or said nothing
        peers.pop(conn).close()
        continue
      peers[conn] = _check_hello(line, arrived, num_processes)
      sel.register(conn, selectors.EVENT_READ)


def _check_hello(line, arrived, num_processes):
  parts = line.split()
  if len(parts) != 3 or parts[0] != HELLO or not parts[1].isdigit() or not parts[2].isdigit():
    raise RendezvousError(f'a connection to the coordinator port said {line[:80]!r}, not a jtc '
                          'process\'s hello: is another program using this port?')
  pid, num = int(parts[1]), int(parts[2])
  if num != num_processes:
    raise RendezvousError(f'process {pid} says JAX_NUM_PROCESSES={num}, process 0 says '
                          f'{num_processes}: every process needs the same count')
  if pid in arrived:
    raise RendezvousError(f'two processes say JAX_PROCESS_ID={pid}: each needs its own id in '
                          f'0..{num_processes - 1}')
  return pid


def _missing(missing, num_processes):
  if missing == [0]:
    return ('process 0 never reached itself through the address: it must name the host that '
            'process 0 runs on')
  return (f'process{"es" if len(missing) > 1 else ""} {", ".join(map(str, missing))} of '
          f'{num_processes} never arrived')


def _answer(peers, text):
  """Sends ``text`` to every connection but process 0's own."""
  for conn, pid in peers.items():
    if pid != 0:
      try:
        conn.sendall(f'{text}\n'.encode())
      except OSError:
        pass
