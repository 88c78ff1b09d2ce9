/* dlopen_peer.c: a program whose markers live in a plugin it loads with
 * dlopen once it runs, for checking that the markers of libraries loaded
 * later are traced from their first hit. Built twice: with -DPLUGIN,
 * -shared -fPIC, as the plugin (plugin_send: one marker per call); without,
 * as the program:
 *
 *   ./dlopen_peer PLUGIN PORT COUNT LOG
 *
 * It sends COUNT datagrams from one UDP socket to another of its own on
 * 127.0.0.1:PORT (the sequence number, 8 bytes little endian, then 24 bytes
 * of padding), each after plugin_send(seq), and logs "received SEQ" for
 * each one it receives. */
#define _GNU_SOURCE
#include "xlap_markers.h"

#ifdef PLUGIN

void plugin_send(uint64_t seq) { XLAP_MARK(plugin_send, seq, XLAP_KIND_DATA); }

#else

#include <arpa/inet.h>
#include <dlfcn.h>
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
    fprintf(stderr, "usage: %s PLUGIN PORT COUNT LOG\n", argv[0]);
    return 2;
  }
  void *plugin = dlopen(argv[1], RTLD_NOW);
  if (!plugin) {
    fprintf(stderr, "dlopen: %s\n", dlerror());
    return 1;
  }
  void (*plugin_send)(uint64_t) =
      (void (*)(uint64_t))dlsym(plugin, "plugin_send");
  if (!plugin_send)
    return fail("dlsym");
  int port = atoi(argv[2]);
  long count = atol(argv[3]);
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
  for (long i = 0; i < count; i++) {
    unsigned char out[32] = {0}, in[64];
    uint64_t seq = (uint64_t)i;
    memcpy(out, &seq, sizeof(seq)); /* little endian on x86-64 */
    plugin_send(seq);
    if (send(tx, out, sizeof(out), 0) != (ssize_t)sizeof(out))
      return fail("send");
    ssize_t n = recv(rx, in, sizeof(in), 0);
    if (n < 8)
      return fail("recv");
    uint64_t got;
    memcpy(&got, in, sizeof(got));
    fprintf(log, "received %llu\n", (unsigned long long)got);
  }
  return fclose(log) ? fail("log") : 0;
}

#endif
