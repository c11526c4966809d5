package wasmtest

import (
	"context"

	"github.com/tetratelabs/wazero/api"
)

// buffer finds the buffer a proxy_*_buffer_bytes call names. A nil pointer with statusOK is a
// buffer that exists but is not bound right now (a body outside its callbacks): Envoy reads it as
// empty and refuses writes with NotFound.
func (h *Host) buffer(t bufferType) (buf *[]byte, writable bool, st status) {
	switch t {
	case bufferHTTPRequestBody, bufferHTTPResponseBody:
		s := h.activeStream()
		if s == nil {
			return nil, true, statusOK
		}
		d := &s.req
		if t == bufferHTTPResponseBody {
			d = &s.resp
		}
		if !d.hasBody {
			return nil, true, statusOK
		}
		return &d.body, true, statusOK
	case bufferPluginConfiguration, bufferVMConfiguration:
		if !h.starting {
			return nil, false, statusNotFound
		}
		if t == bufferVMConfiguration {
			return &h.opts.VMConfig, false, statusOK
		}
		return &h.opts.PluginConfig, false, statusOK
	}
	if t > bufferMax {
		return nil, false, statusBadArgument
	}
	return nil, false, statusNotFound
}

func (h *Host) proxyGetBufferBytes(ctx context.Context, mod api.Module, stack []uint64) {
	start, maxSize, ptrPtr, sizePtr := u32(stack[1]), u32(stack[2]), u32(stack[3]), u32(stack[4])
	buf, _, st := h.buffer(bufferType(u32(stack[0])))
	if st != statusOK || buf == nil {
		ret(stack, st)
		return
	}
	data, st := getBufferRange(*buf, start, maxSize)
	if st != statusOK || len(data) == 0 {
		// Envoy returns Ok without touching the out-parameters; the SDK reports that as NotFound.
		ret(stack, st)
		return
	}
	ret(stack, h.returnBytes(ctx, mod, data, ptrPtr, sizePtr))
}

func (h *Host) proxySetBufferBytes(_ context.Context, mod api.Module, stack []uint64) {
	start, size := u32(stack[1]), u32(stack[2])
	data, ok := view(mod, u32(stack[3]), u32(stack[4]))
	if !ok {
		ret(stack, statusInvalidMemoryAccess)
		return
	}
	buf, writable, st := h.buffer(bufferType(u32(stack[0])))
	switch {
	case st != statusOK:
		ret(stack, st)
	case buf == nil:
		ret(stack, statusNotFound)
	case !writable:
		ret(stack, statusUnimplemented)
	default:
		*buf, st = setBufferRange(*buf, start, size, data)
		ret(stack, st)
	}
}

// headerMap finds the map a proxy_*_header_map_* call names. Trailers exist only once delivered;
// the HTTP-call response maps never exist because this host makes no HTTP calls.
func (h *Host) headerMap(t mapType) (*headerMap, status) {
	if t > mapMax || t == 4 || t == 5 {
		return nil, statusBadArgument
	}
	s := h.activeStream()
	if s == nil || t > mapResponseTrailers {
		return nil, statusNotFound
	}
	d := &s.req
	if t == mapResponseHeaders || t == mapResponseTrailers {
		d = &s.resp
	}
	if t == mapRequestTrailers || t == mapResponseTrailers {
		if !d.hasTrailers {
			return nil, statusNotFound
		}
		return &d.trailers, statusOK
	}
	if !d.hasHeaders {
		return nil, statusNotFound
	}
	return &d.headers, statusOK
}

func (h *Host) proxyGetHeaderMapPairs(ctx context.Context, mod api.Module, stack []uint64) {
	m, st := h.headerMap(mapType(u32(stack[0])))
	if st != statusOK {
		ret(stack, st)
		return
	}
	ret(stack, h.returnBytes(ctx, mod, serializePairs(*m), u32(stack[1]), u32(stack[2])))
}

func (h *Host) proxySetHeaderMapPairs(_ context.Context, mod api.Module, stack []uint64) {
	raw, ok := view(mod, u32(stack[1]), u32(stack[2]))
	if !ok {
		ret(stack, statusInvalidMemoryAccess)
		return
	}
	pairs, err := deserializePairs(raw)
	if err != nil {
		ret(stack, statusSerializationFailed)
		return
	}
	m, st := h.headerMap(mapType(u32(stack[0])))
	if st != statusOK {
		ret(stack, st)
		return
	}
	*m = newHeaderMap(pairs)
	ret(stack, statusOK)
}

func (h *Host) proxyGetHeaderMapValue(ctx context.Context, mod api.Module, stack []uint64) {
	key, ok := readString(mod, u32(stack[1]), u32(stack[2]))
	if !ok {
		ret(stack, statusInvalidMemoryAccess)
		return
	}
	m, st := h.headerMap(mapType(u32(stack[0])))
	if st != statusOK {
		ret(stack, st)
		return
	}
	v, found := m.get(key)
	if !found {
		ret(stack, statusNotFound)
		return
	}
	ret(stack, h.returnBytes(ctx, mod, []byte(v), u32(stack[3]), u32(stack[4])))
}

// editHeader runs the shared part of replace, add and remove: read the key (and value), find the map.
func (h *Host) editHeader(mod api.Module, stack []uint64, withValue bool, edit func(m *headerMap, k, v string)) {
	key, ok := readString(mod, u32(stack[1]), u32(stack[2]))
	value := ""
	if ok && withValue {
		value, ok = readString(mod, u32(stack[3]), u32(stack[4]))
	}
	if !ok {
		ret(stack, statusInvalidMemoryAccess)
		return
	}
	m, st := h.headerMap(mapType(u32(stack[0])))
	if st == statusOK {
		edit(m, key, value)
	}
	ret(stack, st)
}

func (h *Host) proxyReplaceHeaderMapValue(_ context.Context, mod api.Module, stack []uint64) {
	h.editHeader(mod, stack, true, func(m *headerMap, k, v string) { m.replace(k, v) })
}

func (h *Host) proxyAddHeaderMapValue(_ context.Context, mod api.Module, stack []uint64) {
	h.editHeader(mod, stack, true, func(m *headerMap, k, v string) { m.add(k, v) })
}

func (h *Host) proxyRemoveHeaderMapValue(_ context.Context, mod api.Module, stack []uint64) {
	h.editHeader(mod, stack, false, func(m *headerMap, k, _ string) { m.remove(k) })
}

func (h *Host) proxySendLocalResponse(_ context.Context, mod api.Module, stack []uint64) {
	details, ok1 := readString(mod, u32(stack[1]), u32(stack[2]))
	body, ok2 := readBytes(mod, u32(stack[3]), u32(stack[4]))
	rawHeaders, ok3 := view(mod, u32(stack[5]), u32(stack[6]))
	if !ok1 || !ok2 || !ok3 {
		ret(stack, statusInvalidMemoryAccess)
		return
	}
	var headers headerMap
	if len(rawHeaders) > 0 {
		pairs, err := deserializePairs(rawHeaders)
		if err != nil {
			ret(stack, statusSerializationFailed)
			return
		}
		// Envoy applies them with setCopy on top of its own reply headers.
		for _, p := range pairs {
			headers.replace(p[0], p[1])
		}
	}
	s := h.activeStream()
	if s == nil {
		ret(stack, statusNotFound)
		return
	}
	// The first reply wins; Envoy cannot send a second one on a stream that has already answered.
	if s.local == nil {
		s.local = &LocalResponse{
			Status:     u32(stack[0]),
			Details:    details,
			Headers:    headers.clone(),
			Body:       body,
			GRPCStatus: int32(u32(stack[7])),
		}
	}
	ret(stack, statusOK)
}

// proxyContinueStream does nothing but check its stream: a test host has no event loop from which a
// paused stream could be resumed, and the SDK documents that Envoy does not implement it for TCP.
func (h *Host) proxyContinueStream(_ context.Context, _ api.Module, stack []uint64) {
	h.streamControl(stack, func(*Stream, streamType) {})
}

// proxyCloseStream resets the stream, as Envoy does.
func (h *Host) proxyCloseStream(_ context.Context, _ api.Module, stack []uint64) {
	h.streamControl(stack, func(s *Stream, _ streamType) { s.reset = true })
}

func (h *Host) streamControl(stack []uint64, record func(*Stream, streamType)) {
	t := streamType(u32(stack[0]))
	s := h.activeStream()
	switch {
	case t == streamDownstream || t == streamUpstream:
		ret(stack, statusUnimplemented)
	case t > streamUpstream:
		ret(stack, statusBadArgument)
	case s == nil:
		ret(stack, statusNotFound)
	default:
		record(s, t)
		ret(stack, statusOK)
	}
}
