"""A UDP program in two phases, for the `--boundary auto` tests.

Phase 1 sends COUNT datagrams to itself naming the destination (sendto);
then it writes DIR/phase1 and waits for DIR/go. Phase 2 connects the
sending socket and sends COUNT more without a destination (send). Every
datagram (a u64 little-endian seq) is read back with recvfrom and logged
as `sent SEQ` / `received SEQ` in DIR/log; then it writes DIR/done and
exits once DIR/end exists. It starts once DIR/start exists. With
--connect-first the
socket is connected before phase 1 too (a socket connected before the
recorder starts), and phase 1 sends with send.
"""

import os
import socket
import struct
import sys
import time

out, count = sys.argv[1], int(sys.argv[2])
connect_first = "--connect-first" in sys.argv

rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
rx.bind(("127.0.0.1", 0))
tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
if connect_first:
    tx.connect(rx.getsockname())
log = open(os.path.join(out, "log"), "w")


def send_and_read(seq, connected):
    payload = struct.pack("<Q", seq) + b"x" * 56
    if connected:
        tx.send(payload)
    else:
        tx.sendto(payload, rx.getsockname())
    log.write(f"sent {seq}\n")
    data, _ = rx.recvfrom(2048)
    log.write(f"received {struct.unpack('<Q', data[:8])[0]}\n")


def wait_for(name):
    path = os.path.join(out, name)
    deadline = time.time() + 60
    while not os.path.exists(path):
        if time.time() > deadline:
            sys.exit(f"no {path} after 60 s")
        time.sleep(0.01)


wait_for("start")
for seq in range(count):
    send_and_read(seq, connect_first)
    time.sleep(0.001)
log.flush()
open(os.path.join(out, "phase1"), "w").close()
wait_for("go")
if not connect_first:
    tx.connect(rx.getsockname())
for seq in range(count, 2 * count):
    send_and_read(seq, True)
    time.sleep(0.001)
log.close()
open(os.path.join(out, "done"), "w").close()
wait_for("end")
