/* packet.h: finding a datagram in an skb wherever the stack left it.
 *
 * Offsets here are relative to skb->data, the only anchor every point
 * agrees on: on TX skb->data is the MAC header and the network header
 * offset is set; on RX a driver's fresh skb has skb->data at the network
 * header (eth_type_trans, or napi_frags_skb for napi_gro_frags, pulled the
 * MAC header) while network_header is not set yet, and the headers may lie
 * in page fragments with an empty linear area.
 *
 * Parsing starts with one read of XL_CACHE bytes at the network header
 * (IP and UDP headers and the payload's first bytes); the fields are then
 * taken from that copy, since every helper call costs about as much as the
 * parsing itself. Reads in the linear area are probe reads; a non-linear
 * skb also gets a dynptr over its page fragments (kfunc
 * bpf_dynptr_from_skb, allowed in tracing programs since Linux 6.12). On
 * older kernels only the linear area is readable and a datagram whose
 * fields lie in the fragments is counted as XLAP_LOSS_FRAG.
 */
#ifndef XLAP_CAPTURE_PACKET_H
#define XLAP_CAPTURE_PACKET_H

#include "common.h"
#include "layout.h"

#define ETH_HLEN_ 14
#define ETH_P_IP_ 0x0800
#define ETH_P_IPV6_ 0x86DD
#define ETH_P_8021Q_ 0x8100
#define ETH_P_8021AD_ 0x88A8
#define ETH_P_TEB_ 0x6558 /* transparent Ethernet bridging (Geneve) */
#define GENEVE_PORT_ 6081
#define NEXTHDR_HOP_ 0
#define NEXTHDR_ROUTING_ 43
#define NEXTHDR_FRAGMENT_ 44
#define NEXTHDR_AUTH_ 51
#define NEXTHDR_DEST_ 60
/* IPv6 extension headers walked before giving up (counted as parse loss). */
#define IPV6_EXT_MAX 6

/* Bytes read at once where parsing starts: IPv6 + UDP headers and 16
 * payload bytes, IPv4 + UDP and 36. One read instead of one per header and
 * field (each a helper call) keeps the common path as cheap as it was
 * before fragments and extension headers were handled. */
#define XL_CACHE 64

/* Bytes of one parse that do not fit the stack: the device points' frames,
 * plus the stamp path's frames below them, must stay within the combined
 * stack of a BPF-to-BPF call chain (512 bytes; kernels before private
 * stacks for tracing programs count every frame: Debian's 6.1 and 6.12). */
struct xl_room {
  __u8 c[XL_CACHE]; /* the parse cache */
  __u8 h[48];       /* an IP header read outside the cache; the shared info */
};

/* Per-CPU rooms, one per nesting level: programs on one CPU nest strictly
 * (an interrupt's program runs to completion before the interrupted one
 * goes on), so the level taken at rd_enter is this parse's until
 * rd_leave, as with the stamp batch's depth. */
#define XL_ROOM_LEVELS 4 /* task, softirq, hardirq, NMI */

struct xl_rooms {
  __u32 depth;
  __u32 _pad;
  struct xl_room lv[XL_ROOM_LEVELS];
};

struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, 1);
  __type(key, __u32);
  __type(value, struct xl_rooms);
} ROOMS SEC(".maps");

/* A read-only view of an skb's bytes. */
struct xl_rd {
  struct bpf_dynptr dp;
  /* dp is set up (a non-linear skb). A whole stack slot of its own, so the
   * verifier knows its value and which reads may use dp. */
  __u64 dp_ok;
  unsigned char *data; /* skb->data, for the linear fallback */
  __u32 linear;        /* bytes in the linear area from data */
  __u32 len;           /* skb->len: bytes from data to the end */
  __u32 c_off;         /* offset of c (parse_at's network header) */
  __u32 c_len;         /* valid bytes in c: 0, XL_CACHE / 2 or XL_CACHE */
  __u8 *c;             /* XL_CACHE bytes: this level's room */
  __u8 *h;             /* 48 bytes: this level's room */
  struct xl_rooms *rooms;
};

/* Takes this nesting level's room for the parse cache. Returns 0, or -1
 * when there is none (deeper nesting than XL_ROOM_LEVELS: the caller counts
 * the datagram lost if it is its own). Every 0 is paired with rd_leave. */
static __always_inline int rd_enter(struct xl_rd *r) {
  __u32 zero = 0;
  struct xl_rooms *s = bpf_map_lookup_elem(&ROOMS, &zero);
  if (!s)
    return -1;
  volatile __u32 *d = &s->depth;
  __u32 old = *d;
  if (old >= XL_ROOM_LEVELS)
    return -1;
  *d = old + 1;
  asm volatile("" ::: "memory");
  old &= XL_ROOM_LEVELS - 1;
  r->c = s->lv[old].c;
  r->h = s->lv[old].h;
  r->rooms = s;
  return 0;
}

static __always_inline void rd_leave(struct xl_rd *r) {
  struct xl_rooms *s = r->rooms;
  if (!s)
    return;
  volatile __u32 *d = &s->depth;
  asm volatile("" ::: "memory");
  *d = *d - 1;
}

/* bpf_dynptr_from_skb(skb, 0, dp): a kfunc call with a placeholder BTF id
 * that the loader replaces (xlap_abi.h, XLAP_KFUNC_DYNPTR_FROM_SKB). */
static __always_inline int dynptr_from_skb(struct sk_buff *skb,
                                           struct bpf_dynptr *dp) {
  int ret;
  asm volatile("r1 = %[skb]\n"
               "r2 = 0\n"
               "r3 = %[dp]\n"
               ".byte 0x85, 0x20, 0x00, 0x00\n"
               ".long 0x7eadbeef\n"
               "%[ret] = r0\n"
               : [ret] "=r"(ret)
               : [skb] "r"(skb), [dp] "r"(dp)
               : "r0", "r1", "r2", "r3", "r4", "r5", "memory");
  return ret;
}

static __always_inline void rd_init(struct xl_rd *r, struct sk_buff *skb) {
  r->data = skb->data;
  r->len = skb->len;
  r->linear = skb->len - skb->data_len;
  r->c_off = 0;
  r->c_len = 0;
  r->dp_ok = 0;
  /* The linear area is read with plain probe reads (cheaper); a dynptr,
   * which reads through page fragments too, only for a non-linear skb. */
  if (CFG.have_dynptr && skb->data_len && !dynptr_from_skb(skb, &r->dp))
    r->dp_ok = 1;
}

/* The same view of a socket-filter context (cgroup_skb): skb->data is the
 * network header there, and the linear area is readable directly
 * (rd_fill_ctx); the rest needs a dynptr (without one the point is not
 * attached). */
static __always_inline void rd_init_ctx(struct xl_rd *r,
                                        struct __sk_buff *ctx) {
  r->data = 0;
  r->len = ctx->len;
  r->linear = 0;
  r->c_off = 0;
  r->c_len = 0;
  r->dp_ok = 0;
  if (CFG.have_dynptr && !dynptr_from_skb((struct sk_buff *)ctx, &r->dp))
    r->dp_ok = 1;
}

/* Reads n bytes at off from the skb. Returns 0, -1 beyond the packet, -2
 * in page fragments we cannot read (no dynptr). */
static __always_inline int rd_read_skb(struct xl_rd *r, __u32 off, void *buf,
                                       __u32 n) {
  if ((__u64)off + n > r->len)
    return -1;
  if ((__u64)off + n <= r->linear)
    return bpf_probe_read_kernel(buf, n, r->data + off) ? -1 : 0;
  if (r->dp_ok)
    return bpf_dynptr_read(buf, n, &r->dp, off, 0) ? -1 : 0;
  return -2;
}

/* Fills the cache with the bytes at off (the whole cache, or half of it
 * for a short packet). */
static __always_inline void rd_fill(struct xl_rd *r, __u32 off) {
  r->c_off = off;
  r->c_len = 0;
  if (rd_read_skb(r, off, r->c, XL_CACHE) == 0)
    r->c_len = XL_CACHE;
  else if (rd_read_skb(r, off, r->c, XL_CACHE / 2) == 0)
    r->c_len = XL_CACHE / 2;
}

/* rd_fill for a cgroup_skb context: the linear area by direct packet
 * access (no helper call), else through the dynptr. */
static __always_inline void rd_fill_ctx(struct xl_rd *r,
                                        struct __sk_buff *ctx) {
  void *data = (void *)(long)ctx->data;
  void *end = (void *)(long)ctx->data_end;
  r->c_off = 0;
  r->c_len = 0;
  if (data + XL_CACHE <= end) {
    __builtin_memcpy(r->c, data, XL_CACHE);
    r->c_len = XL_CACHE;
  } else if (data + XL_CACHE / 2 <= end) {
    __builtin_memcpy(r->c, data, XL_CACHE / 2);
    r->c_len = XL_CACHE / 2;
  } else {
    rd_fill(r, 0);
  }
}

/* Reads n bytes at off: small reads inside the cache from there, the rest
 * from the skb. Returns as rd_read_skb. */
static __always_inline int rd_read(struct xl_rd *r, __u32 off, void *buf,
                                   __u32 n) {
  __u32 rel = off - r->c_off;
  if (n <= 8 && off >= r->c_off && (__u64)rel + n <= r->c_len) {
    __u8 *dst = buf;
#pragma unroll
    for (int i = 0; i < 8; i++) {
      if (i >= n)
        break;
      dst[i] = r->c[(rel + i) & (XL_CACHE - 1)];
    }
    return 0;
  }
  return rd_read_skb(r, off, buf, n);
}

/* What parsing found. */
struct xl_dgram {
  __u64 flow;     /* addresses folded to 16 bits each, ports */
  __u32 pay;      /* offset of the UDP payload */
  __u32 pay_len;  /* payload bytes of the first datagram, whole datagram */
  __u32 pay_all;  /* payload bytes in the skb (GSO/GRO: every segment) */
  __u32 frag_key; /* IP id (v4) or fragment id (v6) of a fragment */
  __u32 l3;       /* offset of the (inner) IP header (flows.h) */
  __u16 dport;
  __u8 frag;   /* 0 whole, 1 first fragment, 2 later fragment */
  __u8 tunnel; /* keyed by the datagram inside a UDP tunnel */
};

enum {
  XL_FOREIGN = -1, /* not UDP over IP */
  XL_OK = 0,
  XL_LATER_FRAGMENT = 1, /* an IP fragment without the UDP header */
  XL_TRUNCATED = 2,      /* headers cut short: counted as a parse loss */
  XL_UNREADABLE = 3,     /* headers in fragments we cannot read */
};

static __always_inline __u16 fold16(const __u32 *words, int n) {
  __u32 x = 0;
#pragma unroll
  for (int i = 0; i < 4; i++)
    if (i < n)
      x ^= words[i];
  return (__u16)(x ^ (x >> 16));
}

/* The flow of a datagram (XLAP_FLOW_* in xlap_abi.h) from its folded
 * addresses and its ports. */
static __always_inline __u64 make_flow(__u16 src, __u16 dst, __u16 sport,
                                       __u16 dport) {
  return (__u64)src << 48 | (__u64)dst << 32 | (__u64)sport << 16 | dport;
}

static __always_inline int rd_status(int err) {
  return err == -2 ? XL_UNREADABLE : XL_TRUNCATED;
}

/* Parses the IP header at l3 and the UDP header after it. */
static __always_inline int parse_ip(struct xl_rd *r, __u32 l3,
                                    struct xl_dgram *d) {
  __u8 *hbuf = r->h;
  const __u8 *h = hbuf;
  /* The addresses where they lie in the header (the cache or r->h, both
   * in this level's room, not on the stack). */
  const __u32 *saddr, *daddr;
  int words, err;
  __u32 l4;
  /* The IP header straight from the cache when it holds it. */
  int cached = l3 == r->c_off && r->c_len >= 40;
  if (cached)
    h = r->c;
  else if ((err = rd_read_skb(r, l3, hbuf, 20)))
    return err == -1 ? XL_FOREIGN : XL_UNREADABLE;
  if ((h[0] >> 4) == 4) {
    struct iphdr *iph = (struct iphdr *)h;
    __u16 frag = bpf_ntohs(iph->frag_off);
    if (iph->protocol != IPPROTO_UDP_)
      return XL_FOREIGN;
    saddr = (const __u32 *)(h + 12);
    daddr = (const __u32 *)(h + 16);
    words = 1;
    d->frag_key = ((__u32)bpf_ntohs(iph->id) << 16) ^ iph->saddr ^ iph->daddr;
    if (frag & 0x1fff) {
      d->frag = 2;
      return XL_LATER_FRAGMENT;
    }
    d->frag = (frag & 0x2000) ? 1 : 0; /* more fragments follow */
    l4 = l3 + (h[0] & 0xf) * 4;
  } else if ((h[0] >> 4) == 6) {
    if (!cached && (err = rd_read_skb(r, l3, hbuf, 40)))
      return rd_status(err);
    struct ipv6hdr *ip6 = (struct ipv6hdr *)h;
    saddr = (const __u32 *)(h + 8);
    daddr = (const __u32 *)(h + 24);
    words = 4;
    __u8 next = ip6->nexthdr;
    l4 = l3 + 40;
    /* Extension headers, bounded: hop-by-hop, routing (SRv6), destination
     * options, fragment, authentication. */
    for (int i = 0; i < IPV6_EXT_MAX; i++) {
      if (next == IPPROTO_UDP_)
        break;
      __u8 e[8];
      if (next != NEXTHDR_HOP_ && next != NEXTHDR_ROUTING_ &&
          next != NEXTHDR_DEST_ && next != NEXTHDR_FRAGMENT_ &&
          next != NEXTHDR_AUTH_)
        return XL_FOREIGN;
      if ((err = rd_read(r, l4, e, 8)))
        return rd_status(err);
      __u32 hlen = ((__u32)e[1] + 1) * 8;
      if (next == NEXTHDR_AUTH_)
        hlen = ((__u32)e[1] + 2) * 4;
      if (next == NEXTHDR_FRAGMENT_) {
        __u16 off = ((__u16)e[2] << 8 | e[3]);
        d->frag_key =
            ((__u32)e[4] << 24 | (__u32)e[5] << 16 | (__u32)e[6] << 8 | e[7]) ^
            saddr[3] ^ daddr[3];
        if (off & 0xfff8) {
          d->frag = 2;
          return XL_LATER_FRAGMENT;
        }
        d->frag = off & 1;
        hlen = 8;
      }
      next = e[0];
      /* One state per iteration, whatever the header types so far (see
       * xl_opaque). */
      l4 = xl_opaque(l4 + hlen);
    }
    if (next != IPPROTO_UDP_)
      return XL_TRUNCATED; /* more extension headers than we walk */
  } else {
    return XL_FOREIGN;
  }
  struct udphdr uh;
  /* Without options or extension headers the UDP header sits at a fixed
   * place in the cache. */
  if (cached && l4 - l3 == 20)
    __builtin_memcpy(&uh, r->c + 20, sizeof(uh));
  else if (cached && l4 - l3 == 40)
    __builtin_memcpy(&uh, r->c + 40, sizeof(uh));
  else if ((err = rd_read(r, l4, &uh, sizeof(uh))))
    return rd_status(err);
  __u16 sport = bpf_ntohs(uh.source);
  d->dport = bpf_ntohs(uh.dest);
  d->flow =
      make_flow(fold16(saddr, words), fold16(daddr, words), sport, d->dport);
  d->pay = l4 + 8;
  /* Only the flow table reads it, after checking it: a value the verifier
   * need not carry along the parser's paths. */
  d->l3 = xl_opaque(l3);
  __u32 udp_len = bpf_ntohs(uh.len);
  d->pay_len = udp_len >= 8 ? udp_len - 8 : 0;
  d->pay_all = r->len > d->pay ? r->len - d->pay : 0;
  return XL_OK;
}

/* Whether UDP port `port` carries a tunnel whose payload is an Ethernet
 * frame (VXLAN: 4789 and Linux's old 8472, --tunnel-port) or Geneve. */
static __always_inline int tunnel_port(__u16 port) {
  if (port == GENEVE_PORT_)
    return 1;
#pragma unroll
  for (int i = 0; i < XLAP_TUNNEL_PORTS; i++)
    if (CFG.tunnel_ports[i] && CFG.tunnel_ports[i] == port)
      return 1;
  return 0;
}

/* Offset of the IP header in an Ethernet frame at `eth` (one or two VLAN
 * tags skipped), or 0 if it carries no IP. */
static __always_inline __u32 ip_in_frame(struct xl_rd *r, __u32 eth) {
  __u32 off = eth + 12;
#pragma unroll
  for (int i = 0; i < 3; i++) {
    __u8 t[2];
    if (rd_read(r, off, t, 2))
      return 0;
    __u16 type = (__u16)t[0] << 8 | t[1];
    if (type == ETH_P_IP_ || type == ETH_P_IPV6_)
      return off + 2;
    if (type != ETH_P_8021Q_ && type != ETH_P_8021AD_)
      return 0;
    off += 4;
  }
  return 0;
}

/* Parses the datagram whose IP header is at l3; a UDP tunnel's inner
 * datagram replaces the outer one (one level). */
static __always_inline int parse_at(struct xl_rd *r, __u32 l3,
                                    struct xl_dgram *d) {
  rd_fill(r, l3);
  int ret = parse_ip(r, l3, d);
  if (ret != XL_OK || !tunnel_port(d->dport))
    return ret;
  __u32 inner = 0;
  if (d->dport == GENEVE_PORT_) {
    __u8 g[4];
    if (rd_read(r, d->pay, g, 4))
      return XL_TRUNCATED;
    __u32 hl = 8 + (g[0] & 0x3f) * 4;
    __u16 proto = (__u16)g[2] << 8 | g[3];
    if (proto == ETH_P_TEB_)
      inner = ip_in_frame(r, d->pay + hl);
    else if (proto == ETH_P_IP_ || proto == ETH_P_IPV6_)
      inner = d->pay + hl;
  } else {
    inner = ip_in_frame(r, d->pay + 8); /* VXLAN header: 8 bytes */
  }
  if (!inner)
    return XL_FOREIGN; /* a tunnel packet without IP inside */
  struct xl_dgram in = {};
  ret = parse_ip(r, inner, &in);
  if (ret == XL_OK || ret == XL_LATER_FRAGMENT) {
    in.tunnel = 1;
    *d = in;
  }
  return ret;
}

/* The skb's datagram at the network header (TX points: the stack set
 * it). */
static __always_inline int parse_tx(struct sk_buff *skb, struct xl_rd *r,
                                    struct xl_dgram *d) {
  rd_init(r, skb);
  __u16 nh = skb->network_header;
  if (nh == (__u16)~0U)
    return XL_FOREIGN;
  long l3 = (long)(skb->head + nh) - (long)skb->data;
  if (l3 < 0 || l3 > 256)
    return XL_FOREIGN;
  return parse_at(r, (__u32)l3, d);
}

/* The skb's datagram on the receive path: at skb->data (the driver pulled
 * the MAC header). */
static __always_inline int parse_rx(struct sk_buff *skb, struct xl_rd *r,
                                    struct xl_dgram *d) {
  rd_init(r, skb);
  __u16 proto = bpf_ntohs(skb->protocol);
  if (proto != ETH_P_IP_ && proto != ETH_P_IPV6_)
    return XL_FOREIGN;
  return parse_at(r, 0, d);
}

/* Reads the seq and kind of the datagram whose payload (of pay_len bytes)
 * starts at `pay`, by the layout of its ports (q->ports): from the parse
 * cache when it holds the window, else the cache is refilled with the
 * window (no stack of its own: the programs' stacks are full). Returns 0,
 * XL_TRUNCATED or XL_UNREADABLE. */
static __always_inline int read_ident_at(struct xl_rd *r, __u32 pay,
                                         __u32 pay_len, struct xl_idq *q) {
  __u32 ws = CFG.win_start, need = CFG.win_len;
  __u32 off = pay + ws;
  q->avail = pay_len > ws ? pay_len - ws : 0;
  if (q->avail < need)
    need = q->avail;
  __u32 rel = off - r->c_off;
  if (!(off >= r->c_off && (__u64)rel + need <= r->c_len)) {
    /* The bound in the register the read uses. */
    asm volatile("" : "+r"(need));
    if (need > XL_CACHE)
      need = XL_CACHE;
    /* Bounded again in the register itself, after the compiler's last
     * copy: Linux 6.1's verifier lost the bound above on a copy (the read
     * was refused as unbounded in a bpf_loop body). */
    asm volatile("if %[n] <= %[max] goto +1\n"
                 "%[n] = %[max]\n"
                 : [n] "+r"(need)
                 : [max] "i"(XL_CACHE));
    r->c_len = 0;
    int err = rd_read_skb(r, off, r->c, need);
    if (err)
      return rd_status(err);
    r->c_off = off;
    r->c_len = need;
    rel = 0;
  }
  return xl_ident((const struct xl_bytes64 *)r->c, rel, r->c_len, q)
             ? XL_TRUNCATED
             : 0;
}

static __always_inline __u32 skb_gso_size(struct sk_buff *skb) {
  struct skb_shared_info *sh = (struct skb_shared_info *)(skb->head + skb->end);
  return BPF_CORE_READ(sh, gso_size);
}

/* What the skb's shared info says: its GSO size (0: not a GSO/GRO skb)
 * and the NIC's hardware timestamp (0: none), in one probe read. */
struct xl_shinfo {
  __u32 gso_size;
  __u64 hw_ts;
};

#define XL_SHINFO_WIN 48

/* buf: XL_SHINFO_WIN bytes of room (the parse's r->h, once parsed). */
static __always_inline void skb_shinfo_read(struct sk_buff *skb, __u8 *buf,
                                            struct xl_shinfo *out) {
  unsigned char *sh = skb->head + skb->end;
  __u32 o_gso = bpf_core_field_offset(struct skb_shared_info, gso_size);
  __u32 o_hw = bpf_core_field_offset(struct skb_shared_info, hwtstamps);
  out->gso_size = 0;
  out->hw_ts = 0;
  /* gso_size (near the start) and hwtstamps (a few words later) fall in
   * one 48-byte window on every kernel we know; otherwise two reads. */
  if (o_hw > o_gso && o_hw - o_gso + 8 <= XL_SHINFO_WIN) {
    if (bpf_probe_read_kernel(buf, XL_SHINFO_WIN, sh + o_gso))
      return;
    out->gso_size = *(__u16 *)buf;
    __u32 at = (o_hw - o_gso) & (XL_SHINFO_WIN - 8 - 1);
    __builtin_memcpy(&out->hw_ts, buf + at, 8);
    return;
  }
  struct skb_shared_info *s = (struct skb_shared_info *)sh;
  out->gso_size = skb_gso_size(skb);
  out->hw_ts = (__u64)BPF_CORE_READ(s, hwtstamps.hwtstamp);
}

/* Scratch space for the datagrams of one GSO/GRO skb (too big for the
 * stack). */
struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, 1);
  __type(key, __u32);
  __type(value, struct xl_segs);
} SEG_SCRATCH SEC(".maps");

struct xl_seg_loop {
  struct xl_rd *r;
  struct xl_segs *s;
  __u32 pay, gso, pay_all, n, got, ports;
};

/* Datagram idx+1 of a GSO/GRO skb (a bpf_loop body, see emit_all). */
static long read_seg(__u32 idx, void *ctx) {
  struct xl_seg_loop *c = ctx;
  __u32 i = idx + 1;
  if (i >= c->n || i >= XLAP_MAX_SEGS)
    return 1;
  /* The comparison may bound a copy of i the compiler does not index
   * with: hide i from the optimiser, then bound it by a mask
   * (XLAP_MAX_SEGS is a power of two) the verifier sees. */
  asm volatile("" : "+r"(i));
  i &= XLAP_MAX_SEGS - 1;
  __u32 this_len = i == c->n - 1 ? c->pay_all - i * c->gso : c->gso;
  struct xl_idq q = {.ports = c->ports};
  if (read_ident_at(c->r, c->pay + i * c->gso, this_len, &q))
    return 1; /* the rest is counted by the caller */
  c->s->seq[i] = q.seq;
  c->s->kind[i] = q.kind;
  c->got = i + 1;
  return 0;
}

/* The datagrams of a parsed skb: identity of datagram 0 into `id`, every
 * datagram's seq/kind into `segs` (when more than one). Returns the number
 * of datagrams stamped (0 on failure: `*loss` set to the loss reason), and
 * `*beyond` the datagrams over XLAP_MAX_SEGS. */
static __always_inline __u32 read_datagrams(__u32 gso, struct xl_rd *r,
                                            const struct xl_dgram *d,
                                            struct xl_ident *id,
                                            struct xl_segs **segs, __u32 *loss,
                                            __u32 *beyond) {
  struct xl_idq q = {.ports = (__u32)d->flow};
  __u32 pay = d->pay, pay_all = d->pay_all;
  __u32 n = 1, seg_len = d->pay_len;
  *beyond = 0;
  *segs = 0;
  if (gso && pay_all > gso) {
    n = (pay_all + gso - 1) / gso;
    seg_len = gso;
  }
  id->flow = d->flow;
  id->len = n > 1 ? seg_len : d->pay_len;
  int err = read_ident_at(r, pay, seg_len, &q);
  if (err) {
    *loss = err == XL_UNREADABLE ? XLAP_LOSS_FRAG : XLAP_LOSS_PARSE;
    *beyond = n > 1 ? n - 1 : 0;
    return 0;
  }
  id->seq = q.seq;
  id->kind = q.kind;
  id->flags |= q.flags;
  if (n == 1)
    return 1;
  __u32 zero = 0;
  struct xl_segs *s = bpf_map_lookup_elem(&SEG_SCRATCH, &zero);
  if (!s) {
    *loss = XLAP_LOSS_MAP_FULL;
    *beyond = n - 1;
    return 1;
  }
  s->seq[0] = q.seq;
  s->kind[0] = q.kind;
  struct xl_seg_loop c = {.r = r,
                          .s = s,
                          .pay = pay,
                          .gso = gso,
                          .pay_all = pay_all,
                          .n = n,
                          .ports = q.ports};
  c.got = 1;
  bpf_loop(XLAP_MAX_SEGS - 1, read_seg, &c, 0);
  /* Every exit of the loop continues in one state (see xl_opaque). */
  __u32 got = xl_opaque(c.got);
  *loss = got < n && n <= XLAP_MAX_SEGS ? XLAP_LOSS_PARSE : XLAP_LOSS_GSO;
  *beyond = n - got;
  *segs = s;
  return got;
}

#endif
