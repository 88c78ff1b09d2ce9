/* holds.h: a traced process is held where its code changes, so that its
 * markers are attached before they can fire: at its exec (a shell script
 * starting the protocol, `env`, `timeout`), and where the dynamic loader
 * tells debuggers that it mapped libraries (at start-up and at dlopen).
 * The process is stopped with SIGSTOP, taken before it returns to user
 * mode, and userspace resumes it with SIGCONT once the markers of what was
 * mapped are attached (record/markers.rs). Userspace attaches these only
 * when markers are traced.
 *
 * Most processes of a job have no marker (compilers, `sed`, a test
 * runner): each hold of theirs cost them milliseconds and the recorder a
 * scan. So a process is held only for code the recorder has not read yet:
 * the files it read and found without a traced marker are in KNOWN_CODE,
 * and a process whose new code is all there runs on, counted in
 * HOLD_SKIPS. A process the recorder attached markers to (MARKED_PIDS) is
 * held at every exec: its new image needs them again. */
#ifndef XLAP_CAPTURE_HOLDS_H
#define XLAP_CAPTURE_HOLDS_H

#include "lib/common.h"

#define SIGSTOP_ 19
#define AT_BASE_ 7
#define CTIME_NSEC_MASK ((1U << 30) - 1)

struct {
  __uint(type, BPF_MAP_TYPE_RINGBUF);
  __uint(max_entries, 1 << 14);
} HOLDS SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, 16384);
  __type(key, struct xlap_code_key);
  __type(value, struct xlap_code_version);
} KNOWN_CODE SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, 1024);
  __type(key, __u32); /* tgid */
  __type(value, __u8);
} MARKED_PIDS SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, XLAP_SKIP_COUNT);
  __type(key, __u32);
  __type(value, __u64);
} HOLD_SKIPS SEC(".maps");

/* The inode's ctime in each kernel's layout: a timespec64 `i_ctime` before
 * 6.6, `__i_ctime` in 6.6-6.10, seconds and nanoseconds apart since. */
struct inode___ctime_pre66 {
  struct timespec64 i_ctime;
} __attribute__((preserve_access_index));

struct inode___ctime_pre611 {
  struct timespec64 __i_ctime;
} __attribute__((preserve_access_index));

static __always_inline void inode_ctime(struct inode *inode,
                                        struct xlap_code_version *v) {
  if (bpf_core_field_exists(inode->i_ctime_sec)) {
    v->ctime_sec = BPF_CORE_READ(inode, i_ctime_sec);
    /* Since 6.13 the top bit says whether the time was queried
     * (multigrain timestamps): nanoseconds are the low 30 bits. */
    v->ctime_nsec = BPF_CORE_READ(inode, i_ctime_nsec) & CTIME_NSEC_MASK;
  } else if (bpf_core_field_exists(
                 ((struct inode___ctime_pre611 *)inode)->__i_ctime)) {
    struct inode___ctime_pre611 *i = (void *)inode;
    v->ctime_sec = BPF_CORE_READ(i, __i_ctime.tv_sec);
    v->ctime_nsec = BPF_CORE_READ(i, __i_ctime.tv_nsec);
  } else {
    struct inode___ctime_pre66 *i = (void *)inode;
    v->ctime_sec = BPF_CORE_READ(i, i_ctime.tv_sec);
    v->ctime_nsec = BPF_CORE_READ(i, i_ctime.tv_nsec);
  }
}

struct code_check {
  __u32 unknown;
};

/* bpf_find_vma's callback: the mapping's file is unknown code unless
 * KNOWN_CODE has it at its current version; a mapping of no file (the
 * vDSO, anonymous memory) has no markers. */
static long check_mapping(struct task_struct *task, struct vm_area_struct *vma,
                          void *data) {
  struct code_check *c = data;
  struct file *file = BPF_CORE_READ(vma, vm_file);
  if (!file)
    return 0;
  struct inode *inode = BPF_CORE_READ(file, f_inode);
  struct xlap_code_key key = {
      .dev = BPF_CORE_READ(inode, i_sb, s_dev),
      .ino = BPF_CORE_READ(inode, i_ino),
  };
  struct xlap_code_version *known = bpf_map_lookup_elem(&KNOWN_CODE, &key);
  struct xlap_code_version now = {};
  inode_ctime(inode, &now);
  if (!known || known->ctime_sec != now.ctime_sec ||
      known->ctime_nsec != now.ctime_nsec)
    c->unknown = 1;
  return 0;
}

/* Whether the current process maps code at `addr` the recorder has not
 * read; what cannot be looked at (the mm busy, nothing mapped there)
 * counts as unknown: the process is held, as it was before this check. */
static __always_inline int unknown_code_at(__u64 addr) {
  struct code_check c = {};
  if (bpf_find_vma(bpf_get_current_task_btf(), addr, check_mapping, &c, 0))
    return 1;
  return c.unknown;
}

static __always_inline void hold(__u32 why) {
  __u32 tgid = bpf_get_current_pid_tgid() >> 32;
  struct xlap_hold *h = bpf_ringbuf_reserve(&HOLDS, sizeof(*h), 0);
  if (!h)
    return; /* not held: a full ring means userspace is not reading */
  h->ts_ns = bpf_ktime_get_ns();
  h->pid = tgid;
  h->why = why;
  h->stop = bpf_send_signal(SIGSTOP_);
  h->_pad = 0;
  bpf_ringbuf_submit(h, 0); /* wakes the reader at once */
}

static __always_inline void skipped(__u32 what) {
  __u64 *n = bpf_map_lookup_elem(&HOLD_SKIPS, &what);
  if (n)
    *n += 1;
}

static __always_inline int traced_process(void) {
  __u32 tgid = bpf_get_current_pid_tgid() >> 32;
  return bpf_map_lookup_elem(&TARGET_PIDS, &tgid) != NULL;
}

/* The new image's code at its exec: the program (its text starts at
 * start_code) and its ELF interpreter, the dynamic loader, whose base the
 * kernel left in the auxiliary vector (AT_BASE; 0 for a static program).
 * The loader is known code only once its hook is attached (markers.rs), so
 * a process whose loader is not hooked yet is held for it. */
SEC("tp_btf/sched_process_exec")
int BPF_PROG(on_sched_process_exec, struct task_struct *p, pid_t old_pid,
             struct linux_binprm *bprm) {
  if (!traced_process()) {
    /* Entered a target cgroup and exec'd (the way `systemd-run --scope`
     * and `docker exec` start a program): traced from its first
     * instruction, its markers attached as any target's. */
    if (!in_target_cgroup())
      return 0;
    adopt(bpf_get_current_pid_tgid() >> 32);
  }
  __u32 tgid = bpf_get_current_pid_tgid() >> 32;
  if (bpf_map_lookup_elem(&MARKED_PIDS, &tgid)) {
    hold(XLAP_HOLD_EXEC);
    return 0;
  }
  struct mm_struct *mm = BPF_CORE_READ(p, mm);
  if (!mm || unknown_code_at(BPF_CORE_READ(mm, start_code))) {
    hold(XLAP_HOLD_EXEC);
    return 0;
  }
  __u64 base = 0;
  for (int i = 0; i + 1 < 64; i += 2) {
    __u64 pair[2] = {};
    if (bpf_probe_read_kernel(pair, sizeof(pair),
                              (void *)mm +
                                  bpf_core_field_offset(mm->saved_auxv) +
                                  i * sizeof(__u64)))
      break;
    if (pair[0] == 0) /* AT_NULL: the end */
      break;
    if (pair[0] == AT_BASE_) {
      base = pair[1];
      break;
    }
  }
  if (base && unknown_code_at(base)) {
    hold(XLAP_HOLD_EXEC);
    return 0;
  }
  skipped(XLAP_SKIP_EXEC);
  return 0;
}

/* The loader's list of objects, in glibc's layout (musl's is the same for
 * these fields): r_debug.r_map, then per link_map l_ld (its dynamic
 * section, mapped from the object's file) and l_next. */
#define R_DEBUG_R_MAP 8
#define LINK_MAP_L_LD 16
#define LINK_MAP_L_NEXT 24

struct loader_walk {
  __u64 object; /* the link_map being looked at; 0: the list ended */
  __u32 unknown;
};

static long walk_one(__u64 index, void *data) {
  struct loader_walk *w = data;
  if (!w->object)
    return 1;
  __u64 fields[2] = {}; /* l_ld, l_next */
  if (bpf_probe_read_user(fields, sizeof(fields),
                          (void *)(w->object + LINK_MAP_L_LD))) {
    w->unknown = 1;
    return 1;
  }
  if (fields[0] && unknown_code_at(fields[0])) {
    w->unknown = 1;
    return 1;
  }
  w->object = fields[1];
  return 0;
}

/* Attached once per loader file, for every process (userspace attaches it
 * where that loader's _dl_debug_state is), which glibc and musl call after
 * mapping objects and before running any of their code. The cookie is the
 * distance from _dl_debug_state to the loader's r_debug (0: not found, the
 * process is held each time). The uprobe sets the ip to the probed
 * instruction before the program runs. */
SEC("uprobe")
int on_loader_hook(struct pt_regs *ctx) {
  if (!traced_process())
    return 0;
  __s64 to_r_debug = (__s64)bpf_get_attach_cookie(ctx);
  struct loader_walk w = {};
  if (!to_r_debug || bpf_probe_read_user(&w.object, sizeof(w.object),
                                         (void *)(PT_REGS_IP(ctx) + to_r_debug +
                                                  R_DEBUG_R_MAP))) {
    hold(XLAP_HOLD_LOADER);
    return 0;
  }
  long walked = bpf_loop(XLAP_LOADER_MAX_OBJECTS, walk_one, &w, 0);
  if (w.unknown || w.object || walked < 0) {
    /* unknown code, or a list longer than the walk: held */
    hold(XLAP_HOLD_LOADER);
    return 0;
  }
  skipped(XLAP_SKIP_LOADER);
  return 0;
}

#endif
