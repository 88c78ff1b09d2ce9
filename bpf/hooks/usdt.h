/* usdt.h: the application points, USDT markers in the traced programs
 * (uprobes with one argument spec per site, see userspace usdt.rs). */
#ifndef XLAP_CAPTURE_USDT_H
#define XLAP_CAPTURE_USDT_H

#include "lib/common.h"

struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __uint(max_entries, XLAP_USDT_MAX_SPECS);
  __type(key, __u32); /* the uprobe's cookie */
  __type(value, struct xlap_usdt_spec);
} USDT_SPECS SEC(".maps");

static __always_inline __u64 reg_at(struct pt_regs *ctx, __u16 off) {
  __u64 v = 0;
  bpf_probe_read_kernel(&v, sizeof(v), (void *)ctx + (off & 0xff8));
  return v;
}

/* Reads one USDT argument; returns 0 on success. */
static __always_inline int usdt_arg(struct pt_regs *ctx,
                                    const struct xlap_usdt_arg *a,
                                    __u64 probe_addr, __u64 *out) {
  __u64 v = 0;
  __u64 addr;
  switch (a->kind) {
  case XLAP_ARG_CONST:
    *out = a->value;
    return 0;
  case XLAP_ARG_REG:
    v = reg_at(ctx, a->reg_off);
    break;
  case XLAP_ARG_MEM:
    addr = reg_at(ctx, a->reg_off) + a->value;
    if (a->idx_reg_off != XLAP_USDT_NO_REG)
      addr += reg_at(ctx, a->idx_reg_off) * a->scale;
    if (bpf_probe_read_user(&v, a->size & 0xf, (void *)addr))
      return -1;
    break;
  case XLAP_ARG_GLOBAL:
    /* The load bias is page aligned: mask off the breakpoint's ip skew. */
    addr = a->value + ((PT_REGS_IP(ctx) - probe_addr) & ~0xfffULL);
    if (bpf_probe_read_user(&v, a->size & 0xf, (void *)addr))
      return -1;
    break;
  default:
    return -1;
  }
  /* Keep the argument's own width, sign-extended if signed. */
  if (a->size < 8) {
    int shift = 64 - 8 * (a->size & 0xf);
    if (a->is_signed)
      v = (__u64)(((__s64)(v << shift)) >> shift);
    else
      v = (v << shift) >> shift;
  }
  *out = v;
  return 0;
}

SEC("uprobe")
int on_usdt(struct pt_regs *ctx) {
  RETURN_IF_EMPTY(0);
  __u64 now = bpf_ktime_get_ns();
  __u32 spec_id = (__u32)bpf_get_attach_cookie(ctx);
  struct xlap_usdt_spec *spec = bpf_map_lookup_elem(&USDT_SPECS, &spec_id);
  if (!spec)
    return 0;
  __u64 pid_tgid = bpf_get_current_pid_tgid();
  struct xl_ident id = {};
  id.pid = pid_tgid >> 32;
  __u64 seq = 0, kind = 0;
  if (usdt_arg(ctx, &spec->seq, spec->probe_addr, &seq) ||
      (spec->kind.kind != XLAP_ARG_NONE &&
       usdt_arg(ctx, &spec->kind, spec->probe_addr, &kind))) {
    count_loss(spec->point, XLAP_LOSS_PARSE);
    return 0;
  }
  id.seq = seq;
  id.kind = kind;
  id.flags = XLAP_FLAG_SEQ_VALID | XLAP_FLAG_FROM_USER;
  if (spec->kind.kind != XLAP_ARG_NONE)
    id.flags |= XLAP_FLAG_KIND;
  emit(spec->point, now, &id, (__u32)pid_tgid, 0, 0,
       bpf_get_current_cgroup_id());
  return 0;
}

#endif
