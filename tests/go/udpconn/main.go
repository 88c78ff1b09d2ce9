// udpconn: a UDP sender and receiver on Go's net.UDPConn (the runtime's
// netpoller: non-blocking sockets, reads parked in epoll), for the
// conformance matrix (tests/it/conformance.rs). Standard library only;
// built at test time with the system's Go (Debian's golang-go).
//
//	udpconn recv ADDR:PORT COUNT LOG READY
//	udpconn send BIND_ADDR:PORT DEST_ADDR:PORT COUNT PERIOD_US LOG READY START
//
// recv reads until it has COUNT datagrams or, after the first, none came
// for 2 s; send opens its socket (bound and connected), writes READY, waits
// for START to exist, then sends COUNT datagrams, one every PERIOD_US. Each
// end logs one line per datagram, "sent SEQ" or "received SEQ": its own
// account.
//
// Datagram (48 bytes): "GoUD", then seq u32 little endian at 4, no kind
// field: trace it with --seq-offset 4 --seq-size 4 --seq-endian little.
package main

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"time"
)

const datagramLen = 48

func main() {
	var err error
	switch {
	case len(os.Args) == 6 && os.Args[1] == "recv":
		err = recv(os.Args[2:])
	case len(os.Args) == 9 && os.Args[1] == "send":
		err = send(os.Args[2:])
	default:
		fmt.Fprintln(os.Stderr, "usage: udpconn recv ADDR:PORT COUNT LOG READY | send BIND DEST COUNT PERIOD_US LOG READY START")
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "udpconn:", err)
		os.Exit(1)
	}
}

func recv(a []string) error {
	at, err := net.ResolveUDPAddr("udp4", a[0])
	if err != nil {
		return err
	}
	count, err := strconv.Atoi(a[1])
	if err != nil {
		return err
	}
	file, err := os.Create(a[2])
	if err != nil {
		return err
	}
	log := bufio.NewWriter(file)
	conn, err := net.ListenUDP("udp4", at)
	if err != nil {
		return err
	}
	defer conn.Close()
	if err := os.WriteFile(a[3], []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
		return err
	}
	buf := make([]byte, 2048)
	for got := 0; got < count; got++ {
		// The first datagram may take long (a tracer attaching); then
		// the sender's pace.
		if got > 0 {
			if err := conn.SetReadDeadline(time.Now().Add(2 * time.Second)); err != nil {
				return err
			}
		}
		n, _, err := conn.ReadFromUDP(buf)
		var timeout net.Error
		if errors.As(err, &timeout) && timeout.Timeout() {
			break // the sender is done
		}
		if err != nil {
			return err
		}
		if n < 8 {
			return fmt.Errorf("a datagram of %d bytes", n)
		}
		fmt.Fprintf(log, "received %d\n", binary.LittleEndian.Uint32(buf[4:8]))
	}
	if err := log.Flush(); err != nil {
		return err
	}
	return file.Close()
}

func send(a []string) error {
	bind, err := net.ResolveUDPAddr("udp4", a[0])
	if err != nil {
		return err
	}
	dest, err := net.ResolveUDPAddr("udp4", a[1])
	if err != nil {
		return err
	}
	count, err := strconv.Atoi(a[2])
	if err != nil {
		return err
	}
	periodUs, err := strconv.Atoi(a[3])
	if err != nil {
		return err
	}
	file, err := os.Create(a[4])
	if err != nil {
		return err
	}
	log := bufio.NewWriter(file)
	conn, err := net.DialUDP("udp4", bind, dest)
	if err != nil {
		return err
	}
	defer conn.Close()
	if err := os.WriteFile(a[5], []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
		return err
	}
	for {
		if _, err := os.Stat(a[6]); err == nil {
			break
		}
		time.Sleep(time.Millisecond)
	}
	out := make([]byte, datagramLen)
	copy(out, "GoUD")
	for seq := 0; seq < count; seq++ {
		binary.LittleEndian.PutUint32(out[4:8], uint32(seq))
		if _, err := conn.Write(out); err != nil {
			return err
		}
		fmt.Fprintf(log, "sent %d\n", seq)
		time.Sleep(time.Duration(periodUs) * time.Microsecond)
	}
	if err := log.Flush(); err != nil {
		return err
	}
	return file.Close()
}
