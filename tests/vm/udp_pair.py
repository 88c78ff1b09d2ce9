#!/usr/bin/env python3
"""Two UDP programs we did not instrument, for the kernel matrix's recording
(tests/vm/guest.sh): each datagram begins with a 32-bit big-endian counter.

    udp_pair.py recv PORT COUNT LOG     receive until COUNT datagrams, 5 s idle or 3 min
    udp_pair.py send PORT COUNT GO LOG  wait for the file GO, send COUNT, 1 per ms

LOG gets the program's own account: one line, the number of datagrams it
sent or received.
"""
import os
import socket
import sys
import time

mode, port, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
if mode == "recv":
    log = sys.argv[4]
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", port))
    s.settimeout(5)
    seen = set()
    deadline = time.monotonic() + 180
    while len(seen) < count and time.monotonic() < deadline:
        try:
            data = s.recv(2048)
        except socket.timeout:
            if seen:
                break
            continue
        seen.add(int.from_bytes(data[:4], "big"))
    with open(log, "w") as f:
        f.write(f"{len(seen)}\n")
else:
    go, log = sys.argv[4], sys.argv[5]
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    deadline = time.monotonic() + 120
    while not os.path.exists(go):
        if time.monotonic() > deadline:
            sys.exit("udp_pair: the recorder never became ready")
        time.sleep(0.05)
    sent = 0
    for seq in range(count):
        sent += s.sendto(seq.to_bytes(4, "big") + bytes(60), ("127.0.0.1", port)) > 0
        time.sleep(0.001)
    with open(log, "w") as f:
        f.write(f"{sent}\n")
