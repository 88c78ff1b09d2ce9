#!/usr/bin/env python3
"""The two-kernel stage's clock oracle and control channel (tests/it/two_kernels.rs,
tests/vm/two_kernels.sh), over the link between the host and the guest,
independent of xlap-trace: plain UDP, CLOCK_MONOTONIC on both sides (the
clock of bpf_ktime_get_ns, which stamps every point).

    clock_echo.py serve PORT DIR       (guest) answer probes; "go NAME" creates DIR/go.NAME
    clock_echo.py probe ADDR PORT N    (host) N NTP-style exchanges; prints the one with
                                       the smallest round trip as JSON
    clock_echo.py go ADDR PORT NAME    (host) ask the guest to start step NAME; retried
                                       until acknowledged

An exchange: the host stamps t1 and sends it; the guest stamps t2 when the
datagram is read and t3 just before its answer leaves; the host stamps t4
when the answer is read. The guest's clock is the host's plus theta, and
causality alone bounds theta: t2 - t1 >= theta (t2 comes after the send,
which came after t1) and theta >= t3 - t4 (t4 comes after t3). So theta lies
in [t3 - t4, t2 - t1], whatever the delays and however unequal: the centre
((t2 - t1) + (t3 - t4)) / 2 is the estimate and half the interval's width,
((t4 - t1) - (t3 - t2)) / 2, a hard bound on its error. The narrowest of N
exchanges is kept (minimum-RTT filter).
"""
import json
import os
import re
import socket
import struct
import sys
import time


def now():
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


def serve(port, directory):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("0.0.0.0", port))
    while True:
        data, peer = s.recvfrom(256)
        t2 = now()
        if data[:1] == b"T" and len(data) == 9:
            t3 = now()
            s.sendto(data + struct.pack("<qq", t2, t3), peer)
        elif data[:1] == b"G":
            name = data[1:].decode("ascii", "replace")
            # The name becomes a file name: letters and digits only.
            if re.fullmatch(r"[a-z0-9]{1,16}", name):
                open(os.path.join(directory, "go." + name), "w").close()
                s.sendto(data, peer)


def probe(addr, port, n):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(1.0)
    best = None
    answered = 0
    for _ in range(n):
        t1 = now()
        s.sendto(b"T" + struct.pack("<q", t1), (addr, port))
        try:
            while True:
                data = s.recv(64)
                t4 = now()
                # A late answer to an earlier probe is not this one's.
                if len(data) == 25 and struct.unpack("<q", data[1:9])[0] == t1:
                    break
        except socket.timeout:
            continue
        answered += 1
        t2, t3 = struct.unpack("<qq", data[9:25])
        half = ((t4 - t1) - (t3 - t2)) / 2
        if best is None or half < best["half_width_ns"]:
            best = {
                "host_ns": (t1 + t4) // 2,
                "theta_ns": ((t2 - t1) + (t3 - t4)) / 2,
                "half_width_ns": half,
                "rtt_ns": t4 - t1,
            }
        time.sleep(0.002)
    if best is None:
        sys.exit(f"clock_echo: no answer from {addr}:{port} to {n} probes")
    best["answered"] = answered
    best["sent"] = n
    print(json.dumps(best))


def go(addr, port, name):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(0.5)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        s.sendto(b"G" + name.encode(), (addr, port))
        try:
            if s.recv(64) == b"G" + name.encode():
                return
        except socket.timeout:
            pass
    sys.exit(f"clock_echo: the guest did not acknowledge {name} within 60 s")


mode = sys.argv[1]
if mode == "serve":
    serve(int(sys.argv[2]), sys.argv[3])
elif mode == "probe":
    probe(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
elif mode == "go":
    go(sys.argv[2], int(sys.argv[3]), sys.argv[4])
else:
    sys.exit(__doc__)
