package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"sync"
	"sync/atomic"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/protobuf/proto"
)

// rawConn is an HTTP/2 client connection written frame by frame, for the
// shapes no well-behaved gRPC client can make: it opens streams beyond the
// server's SETTINGS_MAX_CONCURRENT_STREAMS and sends gRPC messages whose
// length prefix announces more than follows. It answers SETTINGS and PING
// and otherwise only counts what the server did: streams it refused or
// reset, and streams it ended with trailers.
type rawConn struct {
	nc     net.Conn
	mu     sync.Mutex // guards fr, enc and hb (writes)
	fr     *http2.Framer
	enc    *hpack.Encoder
	hb     bytes.Buffer
	nextID uint32

	resets, trailers atomic.Int64
	closed           chan struct{}
}

// dialRaw connects and sends the preface and SETTINGS; the server's own
// SETTINGS are acknowledged by the reader.
func dialRaw(ctx context.Context, addr string) (*rawConn, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	c := &rawConn{nc: nc, nextID: 1, closed: make(chan struct{})}
	c.fr = http2.NewFramer(nc, bufio.NewReaderSize(nc, 64<<10))
	c.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	c.fr.MaxHeaderListSize = 1 << 20
	c.enc = hpack.NewEncoder(&c.hb)
	context.AfterFunc(ctx, c.close)
	if _, err := nc.Write([]byte(http2.ClientPreface)); err != nil {
		c.close()
		return nil, err
	}
	if err := c.fr.WriteSettings(http2.Setting{ID: http2.SettingEnablePush, Val: 0}); err != nil {
		c.close()
		return nil, err
	}
	go c.read()
	return c, nil
}

func (c *rawConn) close() {
	select {
	case <-c.closed:
	default:
		close(c.closed)
		_ = c.nc.Close()
	}
}

// read answers the server's SETTINGS and PINGs and counts stream endings
// until the connection closes.
func (c *rawConn) read() {
	defer c.close()
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			return
		}
		c.mu.Lock()
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				err = c.fr.WriteSettingsAck()
			}
		case *http2.PingFrame:
			if !f.IsAck() {
				err = c.fr.WritePing(true, f.Data)
			}
		case *http2.RSTStreamFrame:
			c.resets.Add(1)
		case *http2.MetaHeadersFrame:
			if f.StreamEnded() {
				c.trailers.Add(1)
			}
		case *http2.DataFrame:
			// Grant the window back so answers do not pile up here.
			if n := uint32(len(f.Data())); n > 0 {
				err = c.fr.WriteWindowUpdate(0, n)
				if err == nil {
					err = c.fr.WriteWindowUpdate(f.StreamID, n)
				}
			}
		}
		c.mu.Unlock()
		if err != nil {
			return
		}
	}
}

// open starts a Process call and sends data (gRPC-framed messages, whole
// or cut short) on it, without ending the stream.
func (c *rawConn) open(authority string, data []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.hb.Reset()
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":authority", authority},
		{":path", "/envoy.service.ext_proc.v3.ExternalProcessor/Process"}, {"content-type", "application/grpc"}, {"te", "trailers"}} {
		if err := c.enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]}); err != nil {
			return err
		}
	}
	id := c.nextID
	c.nextID += 2
	if err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: c.hb.Bytes(), EndHeaders: true}); err != nil {
		return err
	}
	if len(data) == 0 {
		return nil
	}
	return c.fr.WriteData(id, false, data)
}

// grpcMessage frames msg as one gRPC message.
func grpcMessage(msg proto.Message) ([]byte, error) {
	b, err := proto.Marshal(msg)
	if err != nil {
		return nil, err
	}
	return announced(uint32(len(b)), b), nil
}

// announced is a gRPC message prefix announcing size bytes, followed by
// the bytes actually sent.
func announced(size uint32, sent []byte) []byte {
	out := make([]byte, 5, 5+len(sent))
	binary.BigEndian.PutUint32(out[1:], size)
	return append(out, sent...)
}

// rawHeaders is the ext_proc request-headers message, gRPC-framed.
func rawHeaders() []byte {
	b, err := grpcMessage(headers(0))
	if err != nil {
		panic(err) // a fixed message always marshals
	}
	return b
}
