package wasmtest

// getBufferRange is proxy_get_buffer_bytes' slicing: maxSize is clamped to the buffer's end. Envoy
// does not guard start > len (its size_t subtraction wraps); BadArgument is the sane reading.
func getBufferRange(buf []byte, start, maxSize uint32) ([]byte, status) {
	if uint64(start) > uint64(len(buf)) {
		return nil, statusBadArgument
	}
	end := min(uint64(start)+uint64(maxSize), uint64(len(buf)))
	return buf[start:end], statusOK
}

// setBufferRange is proxy_set_buffer_bytes as Envoy's Buffer::copyFrom implements it. The spec
// describes replacing any range [start, start+size); Envoy accepts only start=0 with size 0
// (prepend), start=0 with size >= len (replace everything, the SDK passes MaxInt32) and
// start >= len (append, the SDK passes MaxInt32), and returns BadArgument for anything else.
// Reproducing the restriction keeps a plugin that relies on partial ranges from passing here and
// failing in Envoy.
func setBufferRange(buf []byte, start, size uint32, data []byte) ([]byte, status) {
	n := uint64(len(buf))
	switch {
	case start == 0 && size == 0:
		return append(append(make([]byte, 0, len(data)+len(buf)), data...), buf...), statusOK
	case start == 0 && uint64(size) >= n:
		return append(make([]byte, 0, len(data)), data...), statusOK
	case uint64(start) >= n:
		return append(buf, data...), statusOK
	}
	return buf, statusBadArgument
}
