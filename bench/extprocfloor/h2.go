package main

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"sync"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/protobuf/proto"

	"github.com/infergate/infergate/bench/extprocload"
)

// serveH2 serves the floor processor on HTTP/2 of its own: one goroutine
// per connection reads its frames, answers each request as its body ends
// and writes what it answered in one system call once it has read all
// that was there, as an event loop does. Plain text only, no health
// service, no limits: it measures how far below grpc-go's floor a picker
// on such a transport could go, and is not a server to run. It accepts
// connections on ln until ctx ends, then closes them.
func serveH2(ctx context.Context, ln net.Listener) error {
	var wg sync.WaitGroup
	var mu sync.Mutex
	open := map[net.Conn]bool{}
	stop := context.AfterFunc(ctx, func() {
		_ = ln.Close()
		mu.Lock()
		for c := range open {
			_ = c.Close()
		}
		mu.Unlock()
	})
	defer stop()
	for {
		c, err := ln.Accept()
		if err != nil {
			break
		}
		mu.Lock()
		open[c] = true
		mu.Unlock()
		wg.Go(func() {
			_ = serveConn(c)
			mu.Lock()
			delete(open, c)
			mu.Unlock()
			_ = c.Close()
		})
	}
	wg.Wait()
	return nil
}

// stream is a request in progress.
type stream struct {
	buf      []byte // gRPC bytes not yet read
	body     []byte
	answered bool
}

// conn is one connection's state, touched by its goroutine alone.
type conn struct {
	fr                 *http2.Framer
	bw                 *bufio.Writer
	streams            map[uint32]*stream
	unacked            uint32
	respHeaders, trail []byte
	pick               []byte // the headers response, as a gRPC message
}

func serveConn(nc net.Conn) error {
	br := bufio.NewReaderSize(nc, 64<<10)
	preface := make([]byte, len(http2.ClientPreface))
	if _, err := io.ReadFull(br, preface); err != nil || string(preface) != http2.ClientPreface {
		return errors.New("no HTTP/2 client preface")
	}
	c := &conn{
		bw:          bufio.NewWriterSize(nc, 64<<10),
		streams:     map[uint32]*stream{},
		respHeaders: extprocload.HeaderBlock([2]string{":status", "200"}, [2]string{"content-type", "application/grpc"}),
		trail:       extprocload.HeaderBlock([2]string{"grpc-status", "0"}),
	}
	c.fr = http2.NewFramer(c.bw, br)
	c.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	pick, err := extprocload.Frame(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{
		Response: &extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
			{Header: &corev3.HeaderValue{Key: "x-gateway-destination-endpoint", RawValue: []byte("10.0.0.1:8000")}}}}}}}})
	if err != nil {
		return err
	}
	c.pick = pick
	if err := c.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 20}); err != nil {
		return err
	}
	if err := c.fr.WriteWindowUpdate(0, 1<<30); err != nil {
		return err
	}
	for {
		if br.Buffered() == 0 {
			// All that was read is answered: write it in one go.
			if err := c.bw.Flush(); err != nil {
				return err
			}
		}
		f, err := c.fr.ReadFrame()
		if err != nil {
			return err
		}
		if err := c.handle(f); err != nil {
			return err
		}
	}
}

func (c *conn) handle(f http2.Frame) error {
	switch f := f.(type) {
	case *http2.SettingsFrame:
		if !f.IsAck() {
			return c.fr.WriteSettingsAck()
		}
	case *http2.PingFrame:
		if !f.IsAck() {
			return c.fr.WritePing(true, f.Data)
		}
	case *http2.MetaHeadersFrame:
		c.streams[f.StreamID] = &stream{}
	case *http2.RSTStreamFrame:
		delete(c.streams, f.StreamID)
	case *http2.DataFrame:
		c.unacked += f.Length
		if c.unacked >= 1<<29 {
			if err := c.fr.WriteWindowUpdate(0, c.unacked); err != nil {
				return err
			}
			c.unacked = 0
		}
		st := c.streams[f.StreamID]
		if st == nil {
			return nil
		}
		if n := len(f.Data()); n > 0 {
			// A stream's window is 1 MiB; grant back what it used.
			if err := c.fr.WriteWindowUpdate(f.StreamID, uint32(n)); err != nil {
				return err
			}
		}
		st.buf = append(st.buf, f.Data()...)
		if err := c.messages(f.StreamID, st); err != nil {
			return err
		}
		if f.StreamEnded() {
			delete(c.streams, f.StreamID)
			return c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: f.StreamID, BlockFragment: c.trail, EndHeaders: true, EndStream: true})
		}
	}
	return nil
}

// messages reads the whole gRPC messages st holds and answers the request
// once its body has ended: response headers, the pick, the body back.
func (c *conn) messages(id uint32, st *stream) error {
	for {
		msg, rest, ok, err := extprocload.NextMessage(st.buf)
		if err != nil || !ok {
			return err
		}
		var m extprocv3.ProcessingRequest
		if err := proto.Unmarshal(msg, &m); err != nil {
			return err
		}
		st.buf = rest
		b := m.GetRequestBody()
		if b == nil || st.answered {
			continue
		}
		st.body = append(st.body, b.GetBody()...)
		if !b.GetEndOfStream() {
			continue
		}
		st.answered = true
		body, err := extprocload.Frame(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{
			Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{
				StreamedResponse: &extprocv3.StreamedBodyResponse{Body: st.body, EndOfStream: true}}}}}}})
		if err != nil {
			return err
		}
		if err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: c.respHeaders, EndHeaders: true}); err != nil {
			return err
		}
		if err := c.fr.WriteData(id, false, c.pick); err != nil {
			return err
		}
		// The driver grants windows far larger than any answer here; a
		// real server would wait for them.
		for len(body) > 0 {
			k := min(len(body), 16384)
			if err := c.fr.WriteData(id, false, body[:k]); err != nil {
				return err
			}
			body = body[k:]
		}
	}
}
