package wasmtest

import "strconv"

// status is a proxy-wasm WasmResult (spec 0.2.1; the Go SDK's internal/abi_enums.go names a subset).
type status uint32

const (
	statusOK                  status = 0
	statusNotFound            status = 1
	statusBadArgument         status = 2
	statusSerializationFailed status = 3
	statusInvalidMemoryAccess status = 6
	statusCasMismatch         status = 8
	statusUnimplemented       status = 12
)

type bufferType uint32

const (
	bufferHTTPRequestBody     bufferType = 0
	bufferHTTPResponseBody    bufferType = 1
	bufferVMConfiguration     bufferType = 6
	bufferPluginConfiguration bufferType = 7
	bufferMax                 bufferType = 8 // CallData, the last one the spec defines
)

type mapType uint32

const (
	mapRequestHeaders   mapType = 0
	mapRequestTrailers  mapType = 1
	mapResponseHeaders  mapType = 2
	mapResponseTrailers mapType = 3
	mapMax              mapType = 7 // HttpCallResponseTrailers
)

type streamType uint32

const (
	streamRequest    streamType = 0
	streamResponse   streamType = 1
	streamDownstream streamType = 2
	streamUpstream   streamType = 3
)

type metricType uint32

const (
	metricCounter   metricType = 0
	metricGauge     metricType = 1
	metricHistogram metricType = 2
)

// Action is what an HTTP callback returned. The Go SDK only produces these two; Envoy maps Pause to
// StopIteration for headers and StopIterationAndBuffer for bodies.
type Action uint32

const (
	ActionContinue Action = 0
	ActionPause    Action = 1
)

func (a Action) String() string {
	switch a {
	case ActionContinue:
		return "Continue"
	case ActionPause:
		return "Pause"
	}
	return "Action(" + strconv.FormatUint(uint64(a), 10) + ")"
}

func logLevelName(level uint32) string {
	switch level {
	case 0:
		return "trace"
	case 1:
		return "debug"
	case 2:
		return "info"
	case 3:
		return "warn"
	case 4:
		return "error"
	case 5:
		return "critical"
	}
	return "level" + strconv.FormatUint(uint64(level), 10)
}
