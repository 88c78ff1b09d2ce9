/* hostile_target.c: a traced program that attacks its tracer, for the
 * security tests (tests/it/hostile_targets.rs). It is udp_loop (the same
 * datagrams, markers and log) plus:
 *
 * - a marker whose name is SQL (`xlap:send_start';COPY ...;--`): the tracer
 *   must refuse it, never splice it into a query;
 * - a thread that, once the tracer has switched the in-process ring on,
 *   attacks the ring file according to MODE:
 *     scribble  switches its own markers off, then every millisecond writes
 *               extreme heads, tails and capacities into the ring's header
 *               and forged records (valid commit, bogus site, pid or kind)
 *               into its slots, until the program ends;
 *     truncate  switches its markers off and truncates the ring file to 0;
 *     unlink    removes the ring file (the markers go on writing);
 *     none      nothing.
 *
 *   ./hostile_target PORT COUNT PERIOD_US LOG GATE MODE
 */
#define _GNU_SOURCE
#include "xlap_markers.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

/* A marker whose name no point may have. */
#define EVIL_MARK(seq)                                                         \
  __asm__ __volatile__(                                                        \
      "990: .byte 0x0f, 0x1f, 0x44, 0x00, 0x00\n"                              \
      ".pushsection .note.stapsdt, \"\", \"note\"\n"                           \
      ".balign 4\n"                                                            \
      ".4byte 992f-991f, 994f-993f, 3\n"                                       \
      "991: .asciz \"stapsdt\"\n"                                              \
      "992: .balign 4\n"                                                       \
      "993: .8byte 990b\n"                                                     \
      ".8byte _.stapsdt.base\n"                                                \
      ".8byte 0\n"                                                             \
      ".asciz \"xlap\"\n"                                                      \
      ".asciz \"send_start';COPY (SELECT 42) TO '/tmp/xlap-pwn.csv';--\"\n"    \
      ".asciz \"-8@%0\"\n"                                                     \
      "994: .balign 4\n"                                                       \
      ".popsection\n"                                                          \
      :                                                                        \
      : "r"((int64_t)(seq))                                                    \
      : "memory")

static volatile int done;

static uint64_t next(uint64_t *x) {
  *x ^= *x << 13;
  *x ^= *x >> 7;
  *x ^= *x << 17;
  return *x;
}

static void scribble(char *p, size_t size) {
  struct xlap_ring_header *h = (struct xlap_ring_header *)p;
  struct xlap_ring_record *recs =
      (struct xlap_ring_record *)(p + XLAP_RING_RECORDS_OFFSET);
  uint64_t slots = (size - XLAP_RING_RECORDS_OFFSET) / sizeof(*recs);
  /* A real site: the record the markers wrote first. */
  uint64_t site = recs[0].site;
  uint64_t x = 88172645463325252ULL;
  const uint64_t extreme[] = {0, 1, 1ULL << 39, 1ULL << 40, ~0ULL, 1ULL << 63};
  while (!done) {
    uint64_t r = next(&x);
    if (r % 4 == 0) {
      /* An impossible header. */
      h->capacity = extreme[next(&x) % 6];
      h->head = extreme[next(&x) % 6];
      h->tail = extreme[next(&x) % 6];
      h->dropped = next(&x);
    } else {
      /* Forged records right where the reader reads next. */
      uint64_t tail = __atomic_load_n(&h->tail, __ATOMIC_ACQUIRE);
      for (uint64_t i = 0; i < 4; i++) {
        struct xlap_ring_record *rec = &recs[(tail + i) % slots];
        uint64_t how = next(&x) % 3;
        rec->ts_ns = next(&x);
        rec->site = how == 0 ? next(&x) : site;
        rec->pid = how == 1 ? 1 : (uint32_t)getpid(); /* init's */
        rec->kind = how == 2 ? (int64_t)(1ULL << 40) : 1;
        rec->seq = (int64_t)next(&x);
        __atomic_store_n(&rec->commit, tail + i + 1, __ATOMIC_RELEASE);
      }
      __atomic_store_n(&h->head, tail + 4, __ATOMIC_RELEASE);
    }
    usleep(1000);
  }
}

static void *attack(void *arg) {
  const char *mode = arg;
  while (!done &&
         !__atomic_load_n(&xlap_ring_control_block.state, __ATOMIC_ACQUIRE))
    usleep(1000);
  if (done || !strcmp(mode, "none"))
    return 0;
  usleep(100000); /* some honest stamps first */
  char path[XLAP_RING_PATH_BYTES];
  memcpy(path, xlap_ring_control_block.path, sizeof(path));
  path[sizeof(path) - 1] = 0;
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    perror("hostile_target: ring");
    return 0;
  }
  struct stat st;
  if (fstat(fd, &st))
    return 0;
  if (!strcmp(mode, "unlink")) {
    unlink(path);
  } else {
    /* Its own markers off first: a marker writing while the header is
     * scribbled (or the file gone) would crash this program, not the
     * tracer. */
    __atomic_store_n(&xlap_ring_control_block.state, 0, __ATOMIC_RELEASE);
    usleep(10000);
    if (!strcmp(mode, "truncate")) {
      if (ftruncate(fd, 0))
        perror("hostile_target: ftruncate");
    } else {
      char *p = mmap(0, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED,
                     fd, 0);
      if (p != MAP_FAILED)
        scribble(p, (size_t)st.st_size);
    }
  }
  close(fd);
  return 0;
}

static int fail(const char *what) {
  perror(what);
  return 1;
}

int main(int argc, char **argv) {
  if (argc < 7) {
    fprintf(stderr, "usage: %s PORT COUNT PERIOD_US LOG GATE MODE\n", argv[0]);
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
  pthread_t attacker;
  if (pthread_create(&attacker, 0, attack, argv[6]))
    return fail("pthread_create");
  while (access(argv[5], F_OK) != 0)
    usleep(1000);
  uint32_t tid = (uint32_t)syscall(SYS_gettid);
  for (long i = 0; i < count; i++) {
    unsigned char out[32] = {0}, in[64];
    uint64_t seq = (uint64_t)i;
    memcpy(out, &seq, sizeof(seq)); /* little endian on x86-64 */
    XLAP_MARK(send_start, seq, XLAP_KIND_DATA);
    EVIL_MARK(seq);
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
  done = 1;
  pthread_join(attacker, 0);
  return fclose(log) ? fail("log") : 0;
}
