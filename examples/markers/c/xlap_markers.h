/* xlap_markers.h: X-LAP stamp points for any C/C++ protocol.
 *
 * Each marker is a SystemTap SDT probe (USDT) in provider "xlap" with two
 * arguments: the packet's sequence number and its kind. Untraced, a marker is
 * one nop plus a note in `.note.stapsdt`; `xlap-trace --pid PID` turns
 * every `xlap:NAME` marker into the stamp point `app.NAME`.
 *
 *   #include "xlap_markers.h"
 *   XLAP_MARK(send_start, seq, XLAP_KIND_DATA);
 *
 * Needs <sys/sdt.h> (Debian: systemtap-sdt-dev).
 */
#ifndef XLAP_MARKERS_H
#define XLAP_MARKERS_H

#include <stdint.h>
#include <sys/sdt.h>

/* The probe site is the 5-byte nop 0f 1f 44 00 00 instead of sdt.h's
 * 1-byte nop: Linux 6.18 and later rewrite a uprobe on it into a call to a
 * per-process trampoline (arch_uprobe_optimize), cheaper than the trap a
 * 1-byte nop takes. Redefined after the include: sdt.h expands it where a
 * probe is written, so every DTRACE_PROBE of a file that includes this
 * header gets it. Written as bytes: an assembler may drop the zero
 * displacement of `nopl 0(%rax,%rax,1)` and emit 4 bytes. */
#undef _SDT_NOP
#define _SDT_NOP                                                               \
  .byte 0x0f;                                                                  \
  .byte 0x1f;                                                                  \
  .byte 0x44;                                                                  \
  .byte 0x00;                                                                  \
  .byte 0x00

/* Packet kinds of the example protocol; other protocols pass their own. */
#define XLAP_KIND_DATA 1
#define XLAP_KIND_REDUNDANCY 2
#define XLAP_KIND_FEEDBACK 3

/* ---- The in-process ring (the same as the Rust crate's ring.rs) ------------
 * When xlap-trace switches it on (it writes the control block below through
 * /proc/PID/mem), a marker writes its stamp into a shared-memory ring that
 * xlap-trace created and reads, with no trap; untraced, a marker costs one
 * load and a predictable branch. The layout is checked against the Rust
 * definition by a test (tests/it/usdt_notes.rs). One control block per
 * executable or shared object (weak, hidden: the files of one binary share
 * it); its address is in the xlap_ring:control note every marker writes. */
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#ifdef __cplusplus
extern "C" {
#endif

#define XLAP_RING_MAGIC 0x31474e5250414c58ULL /* "XLAPRNG1" */
#define XLAP_RING_PATH_BYTES 112
#define XLAP_RING_RECORDS_OFFSET 256

struct xlap_ring_control {
  uint32_t state;      /* non-zero while a tracer reads the ring at path */
  uint32_t generation; /* changed by each tracer that sets path */
  char path[XLAP_RING_PATH_BYTES];
};

struct xlap_ring_header {
  uint64_t magic;
  uint64_t capacity; /* slots, a power of two */
  uint64_t _pad0[6];
  uint64_t head; /* the next slot to reserve */
  uint64_t _pad1[7];
  uint64_t tail; /* the next slot the tracer reads */
  uint64_t _pad2[7];
  uint64_t dropped; /* stamps not written: the ring was full */
  uint64_t _pad3[7];
};

struct xlap_ring_record {
  uint64_t commit; /* the slot's sequence number + 1 once written */
  uint64_t ts_ns;  /* CLOCK_MONOTONIC */
  uint64_t site;   /* run-time address of the marker's nop */
  int64_t seq;
  int64_t kind;
  uint32_t pid;
  uint32_t tid;
  uint32_t cpu;
  uint32_t _pad[3];
};

/* glibc declares it only under _GNU_SOURCE, which a header cannot set. */
extern int sched_getcpu(void);

__attribute__((
    weak,
    visibility("hidden"))) struct xlap_ring_control xlap_ring_control_block;
__attribute__((
    weak, visibility("hidden"))) struct xlap_ring_header *xlap_ring_mapped_;
__attribute__((weak, visibility("hidden"))) uint32_t xlap_ring_mapped_gen_;
__attribute__((weak, visibility("hidden"))) uint32_t xlap_ring_forks_;
__attribute__((weak, visibility("hidden"))) int xlap_ring_atfork_;
__attribute__((weak, visibility("hidden"))) pthread_mutex_t xlap_ring_lock_ =
    PTHREAD_MUTEX_INITIALIZER;

static void xlap_ring_after_fork_(void) {
  __atomic_fetch_add(&xlap_ring_forks_, 1, __ATOMIC_RELAXED);
}

/* Maps the ring of the current generation (once per generation). */
static struct xlap_ring_header *xlap_ring_get_(void) {
  uint32_t gen =
      __atomic_load_n(&xlap_ring_control_block.generation, __ATOMIC_ACQUIRE);
  struct xlap_ring_header *h =
      __atomic_load_n(&xlap_ring_mapped_, __ATOMIC_ACQUIRE);
  if (h && __atomic_load_n(&xlap_ring_mapped_gen_, __ATOMIC_ACQUIRE) == gen)
    return h;
  pthread_mutex_lock(&xlap_ring_lock_);
  h = xlap_ring_mapped_;
  if (!h || xlap_ring_mapped_gen_ != gen) {
    char path[XLAP_RING_PATH_BYTES];
    struct stat st;
    void *p = MAP_FAILED;
    __builtin_memcpy(path, xlap_ring_control_block.path, sizeof(path));
    path[sizeof(path) - 1] = 0;
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd >= 0 && fstat(fd, &st) == 0 &&
        st.st_size >= XLAP_RING_RECORDS_OFFSET)
      p = mmap(0, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
               0);
    if (fd >= 0)
      close(fd);
    h = 0;
    if (p != MAP_FAILED) {
      struct xlap_ring_header *m = (struct xlap_ring_header *)p;
      uint64_t cap = m->capacity;
      if (m->magic == XLAP_RING_MAGIC && cap && !(cap & (cap - 1)) &&
          XLAP_RING_RECORDS_OFFSET + cap * sizeof(struct xlap_ring_record) <=
              (uint64_t)st.st_size)
        h = m;
      else
        munmap(p, (size_t)st.st_size);
    }
    if (h) {
      /* Old mappings stay: another thread may still write one. */
      if (!xlap_ring_atfork_) {
        pthread_atfork(0, 0, xlap_ring_after_fork_);
        xlap_ring_atfork_ = 1;
      }
      __atomic_store_n(&xlap_ring_mapped_, h, __ATOMIC_RELEASE);
      __atomic_store_n(&xlap_ring_mapped_gen_, gen, __ATOMIC_RELEASE);
    }
  }
  pthread_mutex_unlock(&xlap_ring_lock_);
  return h;
}

/* Writes one stamp: the marker's slow path, only while traced. */
__attribute__((noinline, cold, unused)) static void
xlap_ring_stamp_(uint64_t site, int64_t seq, int64_t kind) {
  static __thread uint32_t forks_seen = UINT32_MAX, pid, tid;
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  struct xlap_ring_header *h = xlap_ring_get_();
  if (!h)
    return;
  uint32_t forks = __atomic_load_n(&xlap_ring_forks_, __ATOMIC_RELAXED);
  if (forks_seen != forks) {
    pid = (uint32_t)getpid();
    tid = (uint32_t)syscall(SYS_gettid);
    forks_seen = forks;
  }
  int cpu = sched_getcpu();
  uint64_t at = __atomic_load_n(&h->head, __ATOMIC_RELAXED);
  do {
    if (at - __atomic_load_n(&h->tail, __ATOMIC_ACQUIRE) >= h->capacity) {
      __atomic_fetch_add(&h->dropped, 1, __ATOMIC_RELAXED);
      return;
    }
  } while (!__atomic_compare_exchange_n(&h->head, &at, at + 1, 1,
                                        __ATOMIC_ACQ_REL, __ATOMIC_RELAXED));
  struct xlap_ring_record *r =
      (struct xlap_ring_record *)((char *)h + XLAP_RING_RECORDS_OFFSET) +
      (at & (h->capacity - 1));
  r->ts_ns = (uint64_t)now.tv_sec * 1000000000ULL + (uint64_t)now.tv_nsec;
  r->site = site;
  r->seq = seq;
  r->kind = kind;
  r->pid = pid;
  r->tid = tid;
  r->cpu = cpu > 0 ? (uint32_t)cpu : 0;
  __atomic_store_n(&r->commit, at + 1, __ATOMIC_RELEASE);
}

#ifdef __cplusplus
}
#endif

/* A marker: the 5-byte nop with its xlap:POINT note (arguments: seq and kind
 * as signed 8-byte values, the same as the Rust macro, so one decoder reads
 * both), the xlap_ring:control note, the site's address (one lea), and the
 * ring switch's test. The asm may read and write memory: a compiler barrier,
 * so the marker stays where it is written. */
#define XLAP_MARK(point, seq, kind)                                            \
  do {                                                                         \
    int64_t xlap_seq_ = (int64_t)(seq), xlap_kind_ = (int64_t)(kind);          \
    uint64_t xlap_site_;                                                       \
    __asm__ __volatile__(                                                      \
        "990: .byte 0x0f, 0x1f, 0x44, 0x00, 0x00\n"                            \
        "lea 990b(%%rip), %0\n"                                                \
        ".pushsection .note.stapsdt, \"\", \"note\"\n"                         \
        ".balign 4\n"                                                          \
        ".4byte 992f-991f, 994f-993f, 3\n"                                     \
        "991: .asciz \"stapsdt\"\n"                                            \
        "992: .balign 4\n"                                                     \
        "993: .8byte 990b\n"                                                   \
        ".8byte _.stapsdt.base\n"                                              \
        ".8byte 0\n"                                                           \
        ".asciz \"xlap\"\n"                                                    \
        ".asciz \"" #point "\"\n"                                              \
        ".asciz \"-8@%1 -8@%2\"\n"                                             \
        "994: .balign 4\n"                                                     \
        ".popsection\n"                                                        \
        ".pushsection .note.stapsdt, \"\", \"note\"\n"                         \
        ".balign 4\n"                                                          \
        ".4byte 996f-995f, 998f-997f, 3\n"                                     \
        "995: .asciz \"stapsdt\"\n"                                            \
        "996: .balign 4\n"                                                     \
        "997: .8byte 990b\n"                                                   \
        ".8byte _.stapsdt.base\n"                                              \
        ".8byte xlap_ring_control_block\n"                                     \
        ".asciz \"xlap_ring\"\n"                                               \
        ".asciz \"control\"\n"                                                 \
        ".asciz \"\"\n"                                                        \
        "998: .balign 4\n"                                                     \
        ".popsection\n"                                                        \
        ".ifndef _.stapsdt.base\n"                                             \
        ".pushsection .stapsdt.base, \"aG\", \"progbits\", .stapsdt.base, "    \
        "comdat\n"                                                             \
        ".weak _.stapsdt.base\n"                                               \
        ".hidden _.stapsdt.base\n"                                             \
        "_.stapsdt.base: .space 1\n"                                           \
        ".size _.stapsdt.base, 1\n"                                            \
        ".popsection\n"                                                        \
        ".endif\n"                                                             \
        : "=r"(xlap_site_)                                                     \
        : "r"(xlap_seq_), "r"(xlap_kind_)                                      \
        : "memory");                                                           \
    if (__builtin_expect(                                                      \
            __atomic_load_n(&xlap_ring_control_block.state, __ATOMIC_RELAXED), \
            0))                                                                \
      xlap_ring_stamp_(xlap_site_, xlap_seq_, xlap_kind_);                     \
  } while (0)

#endif
