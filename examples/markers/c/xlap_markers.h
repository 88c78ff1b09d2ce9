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

/* The casts fix the argument sizes in the note: seq is 8 bytes, kind 8 bytes,
 * the same as the Rust macro, so one decoder reads both. */
#define XLAP_MARK(point, seq, kind)                                            \
  DTRACE_PROBE2(xlap, point, (int64_t)(seq), (int64_t)(kind))

#endif
