"""A sender whose sends move from CPU to CPU inside the call.

Usage: moved_sender.py DIR HOST PORT COUNT WAIT_S

Sends COUNT datagrams (a u64 little-endian seq, then 1000 bytes) to
HOST:PORT, each naming its destination (sendto), through a socket whose
send buffer holds about two of them: on a link slower than the sender,
most sends sleep in the kernel for buffer room. Meanwhile another thread
moves the sending thread from CPU to CPU every half millisecond, so a send
that sleeps goes on on another CPU. Each send is logged in DIR/log as
`sent SEQ CPU_BEFORE CPU_AFTER` (the CPU the thread ran on just before and
just after the call: the program's own account of the moves). Starts once
DIR/start exists (waits up to WAIT_S seconds: a recorder in an emulated
guest takes more than a minute to attach).
"""

import ctypes
import os
import socket
import struct
import sys
import threading
import time

out, host, port, count = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
wait_s = float(sys.argv[5])
libc = ctypes.CDLL(None, use_errno=True)
cpus = sorted(os.sched_getaffinity(0))
if len(cpus) < 2:
    sys.exit("moved_sender.py: needs two CPUs to move between")

tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
tx.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 2048)  # the kernel's least
deadline = time.monotonic() + wait_s
while not os.path.exists(os.path.join(out, "start")):
    if time.monotonic() > deadline:
        sys.exit(f"moved_sender.py: no start file in {wait_s} s")
    time.sleep(0.01)

sender = threading.get_native_id()
done = threading.Event()


def mover():
    i = 0
    while not done.is_set():
        i += 1
        os.sched_setaffinity(sender, {cpus[i % 2]})
        time.sleep(0.0005)


threading.Thread(target=mover, daemon=True).start()
with open(os.path.join(out, "log"), "w") as log:
    for seq in range(count):
        payload = struct.pack("<Q", seq) + b"x" * 1000
        before = libc.sched_getcpu()
        tx.sendto(payload, (host, port))
        after = libc.sched_getcpu()
        log.write(f"sent {seq} {before} {after}\n")
done.set()
