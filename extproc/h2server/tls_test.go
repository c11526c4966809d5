package h2server

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/infergate/infergate/internal/testcert"
)

// tlsPair is a TLS connection over loopback TCP, both ends handshaken.
func tlsPair(t *testing.T) (server, client *tls.Conn) {
	t.Helper()
	ca := testcert.NewCA(t, "records")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	raw, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	client = tls.Client(raw, &tls.Config{RootCAs: ca.Pool, ServerName: "127.0.0.1"})
	server = tls.Server(<-accepted, &tls.Config{Certificates: []tls.Certificate{ca.Server(t)}})
	done := make(chan error, 1)
	go func() { done <- server.Handshake() }()
	if err := client.Handshake(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close(); _ = server.Close() })
	return server, client
}

// TestRecordsReaderTakesEveryRecordReceived: records that have all arrived
// come back from one Read (crypto/tls alone returns the first), then the
// next Read waits for more; an end after data comes with the next Read.
func TestRecordsReaderTakesEveryRecordReceived(t *testing.T) {
	server, client := tlsPair(t)
	for _, rec := range []string{"one,", "two,", "three"} {
		if _, err := client.Write([]byte(rec)); err != nil { // a record each
			t.Fatal(err)
		}
	}
	time.Sleep(100 * time.Millisecond) // all three in the server's socket
	buf := make([]byte, 1024)
	n, err := recordsReader{server}.Read(buf)
	if err != nil || string(buf[:n]) != "one,two,three" {
		t.Fatalf("read %q, %v; want all three records", buf[:n], err)
	}

	// The deadline is cleared again: the next Read waits for data.
	go func() {
		time.Sleep(50 * time.Millisecond)
		_, _ = client.Write([]byte("four"))
		_ = client.Close()
	}()
	n, err = recordsReader{server}.Read(buf)
	if err != nil || string(buf[:n]) != "four" {
		t.Fatalf("read %q, %v; want the later record", buf[:n], err)
	}
	if n, err = (recordsReader{server}).Read(buf); !errors.Is(err, io.EOF) {
		t.Fatalf("after the client closed: %d bytes, %v; want EOF", n, err)
	}
}
