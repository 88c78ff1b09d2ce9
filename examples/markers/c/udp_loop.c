/* udp_loop.c: a small C program with X-LAP markers, for trying (and testing)
 * the C header: it sends COUNT datagrams from one UDP socket to another of its
 * own on 127.0.0.1:PORT, one every PERIOD_US, and logs each one it receives.
 *
 *   cc -O2 -I examples/markers/c examples/markers/c/udp_loop.c -o udp_loop
 *   ./udp_loop PORT COUNT PERIOD_US LOG [GATE]
 *
 * Datagram: the sequence number (8 bytes, little endian), then 24 bytes of
 * padding; trace it with --seq-offset 0 --seq-size 8 --seq-endian little.
 * With GATE, it waits for that file to exist before the first datagram (so a
 * tracer can attach first). Markers per datagram: send_start before the
 * send call, submit after it, deliver after the receive call. LOG gets one
 * line "received SEQ TID" per datagram (TID: the thread that received). */
#define _GNU_SOURCE
#include "xlap_markers.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

static int fail(const char *what) {
  perror(what);
  return 1;
}

int main(int argc, char **argv) {
  if (argc < 5) {
    fprintf(stderr, "usage: %s PORT COUNT PERIOD_US LOG [GATE]\n", argv[0]);
    return 2;
  }
  int port = atoi(argv[1]);
  long count = atol(argv[2]);
  long period_us = atol(argv[3]);
  FILE *log = fopen(argv[4], "w");
  if (!log)
    return fail("log");
  struct sockaddr_in at = {.sin_family = AF_INET, .sin_port = htons(port)};
  at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int rx = socket(AF_INET, SOCK_DGRAM, 0);
  int tx = socket(AF_INET, SOCK_DGRAM, 0);
  if (rx < 0 || tx < 0)
    return fail("socket");
  if (bind(rx, (struct sockaddr *)&at, sizeof(at)))
    return fail("bind");
  if (connect(tx, (struct sockaddr *)&at, sizeof(at)))
    return fail("connect");
  if (argc > 5) {
    while (access(argv[5], F_OK) != 0)
      usleep(1000);
  }
  uint32_t tid = (uint32_t)syscall(SYS_gettid);
  for (long i = 0; i < count; i++) {
    unsigned char out[32] = {0}, in[64];
    uint64_t seq = (uint64_t)i;
    memcpy(out, &seq, sizeof(seq)); /* little endian on x86-64 */
    XLAP_MARK(send_start, seq, XLAP_KIND_DATA);
    if (send(tx, out, sizeof(out), 0) != (ssize_t)sizeof(out))
      return fail("send");
    XLAP_MARK(submit, seq, XLAP_KIND_DATA);
    ssize_t n = recv(rx, in, sizeof(in), 0);
    if (n < 8)
      return fail("recv");
    uint64_t got;
    memcpy(&got, in, sizeof(got));
    XLAP_MARK(deliver, got, XLAP_KIND_DATA);
    fprintf(log, "received %llu %u\n", (unsigned long long)got, tid);
    if (period_us > 0)
      usleep((useconds_t)period_us);
  }
  return fclose(log) ? fail("log") : 0;
}
