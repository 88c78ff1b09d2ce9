/* mmsg_peer.c: a UDP sender and receiver that move datagrams in batches with
 * sendmmsg(2) and recvmmsg(2), for the conformance matrix
 * (tests/it/conformance.rs). Each end logs what it did, one line per
 * datagram: its own account, against which the tracer is checked.
 *
 *   mmsg_peer recv ADDR PORT COUNT LOG READY [echo]
 *   mmsg_peer send ADDR PORT COUNT BURST PERIOD_US LOG READY START
 *                  [unbound] [echo]
 *
 * recv binds ADDR:PORT, writes READY, then reads with recvmmsg (up to 16
 * per call) until it has COUNT datagrams or, after the first, none came for
 * 2 s; with echo
 * it sends each batch back to where it came from with one sendmmsg. Log
 * lines: "received SEQ", "echoed SEQ".
 *
 * send opens its socket first (connected to ADDR:PORT, which binds it to a
 * port the kernel picks; with unbound it is neither bound nor connected, so
 * it has no port until its first datagram), writes READY, waits for START
 * to exist, then sends COUNT datagrams in bursts of BURST (one sendmmsg per
 * burst; one sendto per datagram when BURST is 1), one burst every
 * PERIOD_US. With echo it reads the burst's echoes (recvmmsg, up to 1 s)
 * before the next burst. Log lines: "sent SEQ", "echoed SEQ".
 *
 * Datagram (64 bytes): kind u8 at 0 (always 7), seq u64 little endian at 8;
 * trace it with --seq-offset 8 --seq-size 8 --seq-endian little, and
 * --kind-offset 0 --kind-size 1 for its kind. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#define LEN 64
#define BATCH 16
#define KIND 7

static int fail(const char *what) {
  perror(what);
  return 1;
}

static uint64_t seq_of(const unsigned char *buf) {
  uint64_t seq;
  memcpy(&seq, buf + 8, sizeof(seq)); /* little endian on x86-64 */
  return seq;
}

static int set_timeout(int fd, long seconds) {
  struct timeval tv = {.tv_sec = seconds};
  return setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
}

static int touch(const char *path) {
  FILE *f = fopen(path, "w");
  if (!f)
    return -1;
  fprintf(f, "%d\n", (int)getpid());
  return fclose(f);
}

static int has_flag(int argc, char **argv, int from, const char *flag) {
  for (int i = from; i < argc; i++)
    if (strcmp(argv[i], flag) == 0)
      return 1;
  return 0;
}

static int addr_of(const char *ip, const char *port, struct sockaddr_in *at) {
  memset(at, 0, sizeof(*at));
  at->sin_family = AF_INET;
  at->sin_port = htons((uint16_t)atoi(port));
  return inet_pton(AF_INET, ip, &at->sin_addr) == 1 ? 0 : -1;
}

static int receiver(int argc, char **argv) {
  struct sockaddr_in at;
  if (addr_of(argv[2], argv[3], &at))
    return fail("address");
  long count = atol(argv[4]);
  int echo = has_flag(argc, argv, 7, "echo");
  FILE *log = fopen(argv[5], "w");
  if (!log)
    return fail("log");
  int fd = socket(AF_INET, SOCK_DGRAM, 0);
  if (fd < 0)
    return fail("socket");
  if (bind(fd, (struct sockaddr *)&at, sizeof(at)))
    return fail("bind");
  if (touch(argv[6]))
    return fail("ready file");
  static unsigned char bufs[BATCH][LEN];
  struct sockaddr_in from[BATCH];
  struct iovec iov[BATCH];
  struct mmsghdr msgs[BATCH];
  long got = 0;
  while (got < count) {
    memset(msgs, 0, sizeof(msgs));
    for (int i = 0; i < BATCH; i++) {
      iov[i].iov_base = bufs[i];
      iov[i].iov_len = LEN;
      msgs[i].msg_hdr.msg_iov = &iov[i];
      msgs[i].msg_hdr.msg_iovlen = 1;
      msgs[i].msg_hdr.msg_name = &from[i];
      msgs[i].msg_hdr.msg_namelen = sizeof(from[i]);
    }
    int n = recvmmsg(fd, msgs, BATCH, MSG_WAITFORONE, NULL);
    if (n < 0)
      break; /* 2 s without a datagram: the sender is done */
    /* The first datagram may take long (a tracer attaching); then the
       sender's pace. */
    if (got == 0 && set_timeout(fd, 2))
      return fail("SO_RCVTIMEO");
    for (int i = 0; i < n; i++)
      fprintf(log, "received %llu\n", (unsigned long long)seq_of(bufs[i]));
    got += n;
    if (echo) {
      for (int i = 0; i < n; i++)
        iov[i].iov_len = msgs[i].msg_len;
      int sent = sendmmsg(fd, msgs, (unsigned)n, 0);
      for (int i = 0; i < sent; i++)
        fprintf(log, "echoed %llu\n", (unsigned long long)seq_of(bufs[i]));
    }
  }
  return fclose(log) ? fail("log") : 0;
}

/* Reads up to `want` echoes (1 s at most). */
static void read_echoes(int fd, int want, FILE *log) {
  static unsigned char bufs[BATCH][LEN];
  struct iovec iov[BATCH];
  struct mmsghdr msgs[BATCH];
  while (want > 0) {
    int batch = want < BATCH ? want : BATCH;
    memset(msgs, 0, sizeof(msgs));
    for (int i = 0; i < batch; i++) {
      iov[i].iov_base = bufs[i];
      iov[i].iov_len = LEN;
      msgs[i].msg_hdr.msg_iov = &iov[i];
      msgs[i].msg_hdr.msg_iovlen = 1;
    }
    int n = recvmmsg(fd, msgs, (unsigned)batch, MSG_WAITFORONE, NULL);
    if (n <= 0)
      return;
    for (int i = 0; i < n; i++)
      fprintf(log, "echoed %llu\n", (unsigned long long)seq_of(bufs[i]));
    want -= n;
  }
}

static int sender(int argc, char **argv) {
  struct sockaddr_in to;
  if (addr_of(argv[2], argv[3], &to))
    return fail("address");
  long count = atol(argv[4]);
  int burst = atoi(argv[5]);
  long period_us = atol(argv[6]);
  int unbound = has_flag(argc, argv, 10, "unbound");
  int echo = has_flag(argc, argv, 10, "echo");
  if (burst < 1 || burst > BATCH) {
    fprintf(stderr, "BURST must be 1..%d\n", BATCH);
    return 2;
  }
  FILE *log = fopen(argv[7], "w");
  if (!log)
    return fail("log");
  int fd = socket(AF_INET, SOCK_DGRAM, 0);
  if (fd < 0)
    return fail("socket");
  if (!unbound && connect(fd, (struct sockaddr *)&to, sizeof(to)))
    return fail("connect");
  if (set_timeout(fd, 1))
    return fail("SO_RCVTIMEO");
  if (touch(argv[8]))
    return fail("ready file");
  while (access(argv[9], F_OK) != 0)
    usleep(1000);
  static unsigned char bufs[BATCH][LEN];
  struct iovec iov[BATCH];
  struct mmsghdr msgs[BATCH];
  for (long next = 0; next < count;) {
    int n = count - next < burst ? (int)(count - next) : burst;
    memset(msgs, 0, sizeof(msgs));
    for (int i = 0; i < n; i++) {
      uint64_t seq = (uint64_t)(next + i);
      memset(bufs[i], 0, LEN);
      bufs[i][0] = KIND;
      memcpy(bufs[i] + 8, &seq, sizeof(seq));
      iov[i].iov_base = bufs[i];
      iov[i].iov_len = LEN;
      msgs[i].msg_hdr.msg_iov = &iov[i];
      msgs[i].msg_hdr.msg_iovlen = 1;
      if (unbound) {
        msgs[i].msg_hdr.msg_name = &to;
        msgs[i].msg_hdr.msg_namelen = sizeof(to);
      }
    }
    int sent;
    if (n == 1) {
      ssize_t len =
          sendto(fd, bufs[0], LEN, 0, unbound ? (struct sockaddr *)&to : NULL,
                 unbound ? sizeof(to) : 0);
      sent = len == LEN ? 1 : -1;
    } else {
      sent = sendmmsg(fd, msgs, (unsigned)n, 0);
    }
    if (sent <= 0)
      return fail("send");
    for (int i = 0; i < sent; i++)
      fprintf(log, "sent %llu\n", (unsigned long long)(next + i));
    next += sent;
    if (echo)
      read_echoes(fd, sent, log);
    if (period_us > 0)
      usleep((useconds_t)period_us);
  }
  return fclose(log) ? fail("log") : 0;
}

int main(int argc, char **argv) {
  if (argc >= 7 && strcmp(argv[1], "recv") == 0)
    return receiver(argc, argv);
  if (argc >= 10 && strcmp(argv[1], "send") == 0)
    return sender(argc, argv);
  fprintf(stderr,
          "usage: %s recv ADDR PORT COUNT LOG READY [echo]\n"
          "       %s send ADDR PORT COUNT BURST PERIOD_US LOG READY START "
          "[unbound] [echo]\n",
          argv[0], argv[0]);
  return 2;
}
