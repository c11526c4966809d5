package main

import (
	"context"
	"net"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/proto"

	"github.com/infergate/infergate/extproc/h2server"
)

// serveH2 serves the floor processor on extproc/h2server, the transport
// infergate's processors serve with unless a handler may block.
func serveH2(ctx context.Context, ln net.Listener) error {
	answer, err := proto.Marshal(pickAnswer())
	if err != nil {
		return err
	}
	hs := h2server.New(h2Floor{answer: answer}, h2server.Options{})
	stop := context.AfterFunc(ctx, hs.Close)
	defer stop()
	err = hs.Serve(ln)
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// h2Floor answers every request the same way.
type h2Floor struct {
	answer []byte // the headers response, encoded
}

func (f h2Floor) Open(st *h2server.Stream) (h2server.Receiver, error) {
	return &h2FloorStream{answer: f.answer, st: st}, nil
}

// h2FloorStream is one request: its body is kept until it ends, then the
// destination and the body go back.
type h2FloorStream struct {
	answer   []byte
	st       *h2server.Stream
	body     []byte
	answered bool
}

func (s *h2FloorStream) Message(b []byte) (bool, error) {
	var m extprocv3.ProcessingRequest
	if err := proto.Unmarshal(b, &m); err != nil {
		return false, err
	}
	rb := m.GetRequestBody()
	if rb == nil || s.answered {
		return false, nil
	}
	s.body = append(s.body, rb.GetBody()...)
	if !rb.GetEndOfStream() {
		return false, nil
	}
	s.answered = true
	if err := s.st.Send(s.answer); err != nil {
		return false, err
	}
	body, err := proto.Marshal(bodyAnswer(s.body))
	if err != nil {
		return false, err
	}
	// The proxy ends the stream once its request is done.
	return false, s.st.Send(body)
}

func (s *h2FloorStream) Close(error) {}
