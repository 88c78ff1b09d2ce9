"""A UDP sender and receiver on Python's asyncio (DatagramProtocol: the
event loop waits in epoll and reads when the socket is readable), for the
conformance matrix (tests/it/conformance.rs). Standard library only.

    asyncio_pair.py recv ADDR PORT COUNT LOG READY
    asyncio_pair.py send ADDR PORT COUNT PERIOD_US LOG READY START

recv reads until it has COUNT datagrams or, after the first, none came for
2 s; send opens its endpoint (connected to ADDR:PORT), writes READY, waits
for START to exist, then sends COUNT datagrams, one every PERIOD_US. Each
end logs one line per datagram, "sent SEQ" or "received SEQ": its own
account.

Datagram (48 bytes): seq u32 big endian at 0, kind u8 at 4 (always 5):
trace it with --seq-offset 0 --seq-size 4 --seq-endian big --kind-offset 4
--kind-size 1.
"""

import asyncio
import os
import struct
import sys

KIND = 5
LEN = 48


class Receiver(asyncio.DatagramProtocol):
    def __init__(self, count, log, done):
        self.count, self.log, self.done = count, log, done
        self.got = 0
        self.last = asyncio.get_running_loop().time()

    def datagram_received(self, data, addr):
        (seq,) = struct.unpack_from(">I", data, 0)
        self.log.write(f"received {seq}\n")
        self.got += 1
        self.last = asyncio.get_running_loop().time()
        if self.got >= self.count and not self.done.done():
            self.done.set_result(None)


async def recv(addr, port, count, log_path, ready):
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    with open(log_path, "w") as log:
        transport, proto = await loop.create_datagram_endpoint(
            lambda: Receiver(count, log, done), local_addr=(addr, port)
        )
        with open(ready, "w") as f:
            f.write(f"{os.getpid()}\n")
        # The first datagram may take long (a tracer attaching); then the
        # sender's pace.
        while not done.done() and (proto.got == 0 or loop.time() - proto.last < 2.0):
            await asyncio.wait([done], timeout=0.1)
        transport.close()


async def send(addr, port, count, period_us, log_path, ready, start):
    loop = asyncio.get_running_loop()
    transport, _ = await loop.create_datagram_endpoint(
        asyncio.DatagramProtocol, remote_addr=(addr, port)
    )
    with open(ready, "w") as f:
        f.write(f"{os.getpid()}\n")
    while not os.path.exists(start):
        await asyncio.sleep(0.001)
    with open(log_path, "w") as log:
        for seq in range(count):
            out = struct.pack(">IB", seq, KIND).ljust(LEN, b"\0")
            transport.sendto(out)
            log.write(f"sent {seq}\n")
            await asyncio.sleep(period_us / 1e6)
    transport.close()


def main(argv):
    if len(argv) == 7 and argv[1] == "recv":
        asyncio.run(recv(argv[2], int(argv[3]), int(argv[4]), argv[5], argv[6]))
    elif len(argv) == 9 and argv[1] == "send":
        asyncio.run(
            send(argv[2], int(argv[3]), int(argv[4]), int(argv[5]), argv[6], argv[7], argv[8])
        )
    else:
        sys.stderr.write(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
