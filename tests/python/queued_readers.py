"""A UDP socket read by several threads at once, holding datagrams queued
before tracing began: the reads the socket's queue cannot tell apart.

Usage: queued_readers.py DIR COUNT THREADS

Binds a socket on 127.0.0.1, sends itself 40 datagrams (a u64
little-endian seq, then padding) from a second socket, writes DIR/ready
and waits for DIR/start: those 40 wait in the queue while the recorder
starts. Then THREADS threads block on the same socket at once, each in
its own receive call (recvfrom, recvmsg and read in turn), while the main
thread sends COUNT more in bursts of 4, then one stop datagram per
thread (seq 2**62 + i). Every datagram read is logged as `received SEQ`
in DIR/log (stop datagrams too); DIR/done is written at the end.
"""

import os
import socket
import struct
import sys
import threading
import time

out, count, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
QUEUED = 40
STOP = 1 << 62

rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
rx.bind(("127.0.0.1", 0))
tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
log = open(os.path.join(out, "log"), "w")
lock = threading.Lock()


def send(seq):
    tx.sendto(struct.pack("<Q", seq) + b"x" * 56, rx.getsockname())


def wait_for(name):
    path = os.path.join(out, name)
    deadline = time.time() + 300
    while not os.path.exists(path):
        if time.time() > deadline:
            sys.exit(f"no {path} after 300 s")
        time.sleep(0.01)


def reader(i):
    while True:
        call = i % 3
        if call == 0:
            data, _ = rx.recvfrom(2048)
        elif call == 1:
            data, _, _, _ = rx.recvmsg(2048)
        else:
            data = os.read(rx.fileno(), 2048)
        seq = struct.unpack("<Q", data[:8])[0]
        with lock:
            log.write(f"received {seq}\n")
        if seq >= STOP:
            return


for seq in range(QUEUED):
    send(seq)
open(os.path.join(out, "ready"), "w").close()
wait_for("start")
workers = [threading.Thread(target=reader, args=(i,)) for i in range(threads)]
for w in workers:
    w.start()
for seq in range(QUEUED, QUEUED + count, 4):
    for s in range(seq, min(seq + 4, QUEUED + count)):
        send(s)
    time.sleep(0.0005)
for i in range(threads):
    send(STOP + i)
for w in workers:
    w.join()
log.close()
open(os.path.join(out, "done"), "w").close()
