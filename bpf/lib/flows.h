/* flows.h: the addresses and sockets behind each flow.
 *
 * A stamp carries its flow folded to 64 bits (XLAP_FLOW_*): exact ports,
 * addresses folded to 16 bits each. The full addresses are noted once per
 * flow in FLOWS, with the cookies of the traced sockets that sent and
 * received it, where a traced datagram is parsed anyway: its first
 * transmit device point and its socket queue point. A small per-CPU cache
 * of the flows noted recently (with a hash of their addresses, so that a
 * different address pair folding to the same flow is still checked) keeps
 * the map out of the common path. */
#ifndef XLAP_CAPTURE_FLOWS_H
#define XLAP_CAPTURE_FLOWS_H

#include "common.h"
#include "packet.h"

#define FLOW_SEEN_BITS 4
#define FLOW_SEEN_SLOTS (1 << FLOW_SEEN_BITS) /* per direction */

/* Per-CPU room for the header when the parse cache does not hold it (the
 * inner header of a tunnel). */
struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, 1);
  __type(key, __u32);
  __type(value, struct xl_bytes64);
} HEADER_SCRATCH SEC(".maps");

struct xl_flow_seen {
  __u64 flow[2 * FLOW_SEEN_SLOTS];
  __u32 sig[2 * FLOW_SEEN_SLOTS];
  struct xlap_flow_tuple t; /* the entry being built (off the stack) */
};

struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, 1);
  __type(key, __u32);
  __type(value, struct xl_flow_seen);
} FLOW_SEEN SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, 16384);
  __type(key, __u64); /* the flow */
  __type(value, struct xlap_flow_tuple);
} FLOWS SEC(".maps");

/* Times a flow's addresses found no room in FLOWS (reported by the
 * recorder: their stamps have no address columns). */
struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, 1);
  __type(key, __u32);
  __type(value, __u64);
} FLOWS_FULL SEC(".maps");

/* A signature of an address pair (`w`: source then destination, 1 or 4
 * words each), telling apart address pairs that fold to one flow. */
static __always_inline __u32 addr_sig(const __u32 *w, int v6) {
  __u32 sig = 0x9e3779b9;
  if (v6) {
    for (int i = 0; i < 4; i++) {
      sig = (sig ^ w[i]) * 0x85ebca6b + (sig >> 13);
      sig = (sig ^ w[4 + i]) * 0xc2b2ae35 + (sig >> 16);
    }
  } else {
    sig = (sig ^ w[0]) * 0x85ebca6b + (sig >> 13);
    sig = (sig ^ w[1]) * 0xc2b2ae35 + (sig >> 16);
  }
  return sig;
}

/* The FLOW_SEEN slot of a flow in a direction. A multiplicative hash, not
 * a fold: XOR-folding the flow's four 16-bit fields gives a flow and its
 * reply (addresses and ports swapped) the same slot, and a ping-pong's
 * two flows then evicted each other on every datagram (a FLOWS lookup
 * each time). */
static __always_inline __u32 flow_seen_slot(__u64 flow, __u32 rx) {
  __u32 slot = (__u32)((flow * 0x9E3779B97F4A7C15ULL) >> (64 - FLOW_SEEN_BITS));
  slot = (slot & (FLOW_SEEN_SLOTS - 1)) + (rx ? FLOW_SEEN_SLOTS : 0);
  return slot & (2 * FLOW_SEEN_SLOTS - 1);
}

/* Whether this CPU noted `flow` with addresses of signature `sig` last in
 * direction `rx` (xl_note_tuple would do nothing). */
static __always_inline int flow_noted(__u64 flow, __u32 sig, __u32 rx) {
  __u32 zero = 0;
  struct xl_flow_seen *seen = bpf_map_lookup_elem(&FLOW_SEEN, &zero);
  if (!seen)
    return 0;
  __u32 slot = flow_seen_slot(flow, rx);
  return seen->flow[slot] == flow && seen->sig[slot] == sig;
}

/* Notes the addresses of the IP header at `start` of buf (IPv4 or IPv6,
 * as its version says) under `flow`, with the traced socket that sent or
 * received it (`rx`). A global function: checked once, and the callers'
 * paths do not multiply by its branches. */
__attribute__((noinline)) int xl_note_tuple(const struct xl_bytes64 *buf,
                                            __u32 start, __u64 flow,
                                            __u64 cookie, __u32 rx) {
  if (!buf || start > XL_CACHE - 20)
    return 0;
  start &= XL_CACHE - 1; /* the bound, in a form the verifier keeps */
  int v6 = buf->b[start] >> 4 == 6;
  __u32 off = start + (v6 ? 8 : 12);
  __u32 zero = 0;
  struct xl_flow_seen *seen = bpf_map_lookup_elem(&FLOW_SEEN, &zero);
  if (!seen)
    return 0;
  /* IP headers start 4-byte aligned in the cache: word loads, from an
   * offset masked where the verifier sees it (a multiple of 4 up to 28,
   * so that 32 bytes fit); any other offset is not an address pair we
   * read. */
  __u32 at = off;
  asm volatile("%[at] &= 0x1c" : [at] "+r"(at));
  if (at != off)
    return 0;
  const __u32 *w = (const __u32 *)(buf->b + at);
  __u32 sig = addr_sig(w, v6);
  __u32 slot = flow_seen_slot(flow, rx);
  if (seen->flow[slot] == flow && seen->sig[slot] == sig)
    return 0;
  seen->flow[slot] = flow;
  seen->sig[slot] = sig;
  struct xlap_flow_tuple *have = bpf_map_lookup_elem(&FLOWS, &flow);
  if (have) {
    if (have->addr_sig != sig)
      have->collided = 1;
    else if (rx && !have->rx_cookie)
      have->rx_cookie = cookie;
    else if (!rx && !have->tx_cookie)
      have->tx_cookie = cookie;
    return 0;
  }
  /* A flow new to the table: the entry is built off the stack. */
  struct xlap_flow_tuple *t = &seen->t;
  __u32 *a = (__u32 *)t->saddr, *b = (__u32 *)t->daddr;
  if (v6) {
    for (int i = 0; i < 4; i++) {
      a[i] = w[i];
      b[i] = w[4 + i];
    }
  } else {
    a[0] = w[0];
    b[0] = w[1];
    a[1] = a[2] = a[3] = b[1] = b[2] = b[3] = 0;
  }
  t->addr_sig = sig;
  t->family = v6 ? 6 : 4;
  t->collided = 0;
  t->rx_cookie = rx ? cookie : 0;
  t->tx_cookie = rx ? 0 : cookie;
  long err = bpf_map_update_elem(&FLOWS, &flow, t, BPF_NOEXIST);
  if (err && err != -17 /* EEXIST: another CPU was first */) {
    __u64 *full = bpf_map_lookup_elem(&FLOWS_FULL, &zero);
    if (full)
      *full += 1;
  }
  return 0;
}

/* Notes the addresses of datagram `d` (parsed from `r`) under its flow,
 * and the traced socket (`cookie`) that sent (rx = 0) or received it:
 * straight from the parse cache when it holds the header's addresses (no
 * helper call), else from a copy of the header (40 bytes; 20 for a short
 * IPv4 datagram). */
static __always_inline void
note_tuple(struct xl_rd *r, const struct xl_dgram *d, __u64 cookie, int rx) {
  __u32 rel = d->l3 - r->c_off;
  if (d->l3 >= r->c_off && rel + 20 <= r->c_len &&
      (r->c[rel & (XL_CACHE - 1)] >> 4 == 4 || rel + 40 <= r->c_len)) {
    xl_note_tuple((const struct xl_bytes64 *)r->c, rel, d->flow, cookie, rx);
    return;
  }
  __u32 zero = 0;
  struct xl_bytes64 *buf = bpf_map_lookup_elem(&HEADER_SCRATCH, &zero);
  if (buf && (!rd_read_skb(r, d->l3, buf->b, 40) ||
              !rd_read_skb(r, d->l3, buf->b, 20)))
    xl_note_tuple(buf, 0, d->flow, cookie, rx);
}

#endif
