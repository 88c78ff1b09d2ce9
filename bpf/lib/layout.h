/* layout.h: where a datagram keeps its seq and kind.
 *
 * A run has a default layout (CFG.layouts[0]) and up to three per UDP port
 * (--layout PORT=...): a datagram takes the layout of its destination port,
 * else of its source port, else the default. Seq and kind are read from a
 * window of the payload that holds the fields of every layout
 * (CFG.win_start, CFG.win_len <= XLAP_WINDOW): one copy of at most 64
 * bytes, or none when the parse cache holds it.
 *
 * The read is a global function: which layout applies is only known per
 * datagram, so its offsets and sizes are unknown to the verifier, and a
 * global function is checked once with them unknown instead of multiplying
 * the paths of every program that stamps. */
#ifndef XLAP_CAPTURE_LAYOUT_H
#define XLAP_CAPTURE_LAYOUT_H

#include "common.h"

/* 64 bytes of a datagram (the parse cache, a payload window, a header). */
struct xl_bytes64 {
  __u8 b[64];
};

_Static_assert(XLAP_WINDOW == sizeof(struct xl_bytes64),
               "the payload window is one xl_bytes64");

/* A request to read seq and kind, and its answer. */
struct xl_idq {
  __u64 seq;   /* out */
  __u64 kind;  /* out */
  __u32 ports; /* in: source port << 16 | destination port (flow bits) */
  __u32 avail; /* in: payload bytes of the datagram from the window start */
  __u32 flags; /* out: XLAP_FLAG_SEQ_VALID, and XLAP_FLAG_KIND if it has one */
  __u32 _pad;
};

/* Index of the layout of a datagram with these ports (see above). */
static __always_inline __u32 layout_of(__u32 ports) {
  __u16 dport = ports & 0xffff, sport = ports >> 16;
  __u32 li = 0;
#pragma unroll
  for (int i = 1; i < XLAP_LAYOUTS; i++)
    if (!li && CFG.layouts[i].port && CFG.layouts[i].port == dport)
      li = i;
#pragma unroll
  for (int i = 1; i < XLAP_LAYOUTS; i++)
    if (!li && CFG.layouts[i].port && CFG.layouts[i].port == sport)
      li = i;
  return li;
}

/* Reads seq and kind of the datagram whose window starts at `start` of
 * `w` (`valid` bytes of w hold data). Returns 0, or 1 when a field lies
 * beyond the datagram (a parse loss). */
__attribute__((noinline)) int xl_ident(const struct xl_bytes64 *w, __u32 start,
                                       __u32 valid, struct xl_idq *q) {
  if (!w || !q)
    return 1;
  __u32 li = layout_of(q->ports) & (XLAP_LAYOUTS - 1);
  __u32 ss = CFG.layouts[li].seq_size, ks = CFG.layouts[li].kind_size;
  __u32 so = CFG.layouts[li].seq_offset - CFG.win_start;
  __u32 ko = CFG.layouts[li].kind_offset - CFG.win_start;
  __u8 be = CFG.layouts[li].big_endian;
  if (ss == 0 || ss > 8 || ks > 8 || so > XLAP_WINDOW ||
      (ks && ko > XLAP_WINDOW) || start > XLAP_WINDOW || valid > XLAP_WINDOW)
    return 1;
  if (so + ss > q->avail || start + so + ss > valid)
    return 1;
  if (ks && (ko + ks > q->avail || start + ko + ks > valid))
    return 1;
  q->seq = field_at(w->b, start + so, XLAP_WINDOW - 1, ss, be);
  q->kind = 0;
  q->flags = XLAP_FLAG_SEQ_VALID;
  if (ks) {
    q->kind = field_at(w->b, start + ko, XLAP_WINDOW - 1, ks, be);
    if (CFG.layouts[li].kind_mask)
      q->kind &= CFG.layouts[li].kind_mask;
    q->flags |= XLAP_FLAG_KIND;
  }
  return 0;
}

#endif
