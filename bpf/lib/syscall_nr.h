/* syscall_nr.h: the syscalls the capture looks at (x86-64 numbers), for
 * the syscall boundary (hooks/syscall.h) and the send syscalls' entry of
 * --boundary auto (hooks/calls.h). */
#ifndef XLAP_CAPTURE_SYSCALL_NR_H
#define XLAP_CAPTURE_SYSCALL_NR_H

#include "common.h"

/* Syscall numbers (x86-64). */
#define NR_READ 0
#define NR_WRITE 1
#define NR_WRITEV 20
#define NR_SENDFILE 40
#define NR_SENDTO 44
#define NR_RECVFROM 45
#define NR_SENDMSG 46
#define NR_RECVMSG 47
#define NR_RECVMMSG 299
#define NR_SENDMMSG 307
/* Calls that wait for a file descriptor to become ready (event loops):
 * poll, select, ppoll, pselect6, epoll_wait, epoll_pwait, epoll_pwait2,
 * io_uring_enter (waiting for completions). */
#define NR_POLL 7
#define NR_SELECT 23
#define NR_EPOLL_WAIT 232
#define NR_PSELECT6 270
#define NR_PPOLL 271
#define NR_EPOLL_PWAIT 281
#define NR_IO_URING_ENTER 426
#define NR_EPOLL_PWAIT2 441

static __always_inline int is_send(__u32 nr) {
  return nr == NR_SENDTO || nr == NR_SENDMSG || nr == NR_SENDMMSG ||
         nr == NR_WRITE || nr == NR_WRITEV || nr == NR_SENDFILE;
}

static __always_inline int is_recv(__u32 nr) {
  return nr == NR_RECVFROM || nr == NR_RECVMSG || nr == NR_RECVMMSG ||
         nr == NR_READ;
}

static __always_inline int is_wait(__u32 nr) {
  return nr == NR_POLL || nr == NR_SELECT || nr == NR_EPOLL_WAIT ||
         nr == NR_PSELECT6 || nr == NR_PPOLL || nr == NR_EPOLL_PWAIT ||
         nr == NR_IO_URING_ENTER || nr == NR_EPOLL_PWAIT2;
}

#endif
