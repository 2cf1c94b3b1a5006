"""A stranger flooding a job's store (tests/process/test_store_owner.py), meant to run as another uid: waits until
127.0.0.1:PORT listens, opens COUNT more connections at once (non-blocking connects), sends torch's VALIDATE, a SET
of key `intruder` and GETNUMKEYS on each, and watches them until each one is answered or closed by the store, or
SECONDS pass. Prints JSON: how many connected, were answered (any byte back), were closed, and stayed open."""

import errno
import json
import select
import socket
import struct
import sys
import time

port, count, seconds = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
REQUEST = (struct.pack("=BI", 0, 0x3C85F7CE) + struct.pack("=BQ", 1, 8) + b"intruder" + struct.pack("=Q", 1) + b"x"
           + struct.pack("=B", 7))

deadline = time.monotonic() + 120
while True:  # the store is not listening yet: try again
    first = socket.socket()
    if first.connect_ex(("127.0.0.1", port)) == 0:
        break
    first.close()
    if time.monotonic() > deadline:
        sys.exit("the store never listened")
    time.sleep(0.002)

poll = select.epoll()
socks = {first.fileno(): first}
first.setblocking(False)
poll.register(first.fileno(), select.EPOLLOUT | select.EPOLLIN)
for _ in range(count - 1):
    sock = socket.socket()
    sock.setblocking(False)
    code = sock.connect_ex(("127.0.0.1", port))
    if code not in (0, errno.EINPROGRESS):
        sock.close()
        continue
    socks[sock.fileno()] = sock
    poll.register(sock.fileno(), select.EPOLLOUT | select.EPOLLIN)

sent: set[int] = set()
outcome: dict[int, str] = {}
end = time.monotonic() + seconds
while len(outcome) < len(socks) and time.monotonic() < end:
    for fd, ready in poll.poll(0.1):
        sock = socks[fd]
        if fd not in sent and ready & select.EPOLLOUT and not ready & (select.EPOLLERR | select.EPOLLHUP):
            try:
                sock.send(REQUEST)
            except OSError:
                outcome[fd] = "closed"
                poll.unregister(fd)
                continue
            sent.add(fd)
            poll.modify(fd, select.EPOLLIN)
            continue
        try:
            data = sock.recv(64)
        except BlockingIOError:
            continue
        except OSError:
            data = b""
        outcome[fd] = "answered" if data else "closed"
        poll.unregister(fd)
print(json.dumps({"connected": len(socks), "answered": sum(v == "answered" for v in outcome.values()),
                  "closed": sum(v == "closed" for v in outcome.values()), "open": len(socks) - len(outcome)}))
