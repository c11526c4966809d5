package wasmtest

import "strings"

// PropertyPath joins a property path the way the ABI serialises it (segments separated by NUL).
// Options.Properties is keyed by this form, so PropertyPath("plugin_name") is "plugin_name" and
// PropertyPath("request", "path") is "request\x00path".
func PropertyPath(segments ...string) string {
	return strings.Join(segments, "\x00")
}

type sharedValue struct {
	data []byte
	cas  uint32
}

// sharedData follows Envoy's SharedData: a cas of 0 writes unconditionally, a cas for a missing key
// is ignored, and every write gets a fresh non-zero cas.
type sharedData struct {
	values  map[string]sharedValue
	lastCas uint32
}

func (d *sharedData) get(key string) (sharedValue, bool) {
	v, ok := d.values[key]
	return v, ok
}

func (d *sharedData) set(key string, data []byte, cas uint32) status {
	if d.values == nil {
		d.values = make(map[string]sharedValue)
	}
	if cur, ok := d.values[key]; ok && cas != 0 && cas != cur.cas {
		return statusCasMismatch
	}
	d.lastCas++
	if d.lastCas == 0 {
		d.lastCas++
	}
	d.values[key] = sharedValue{data: append([]byte(nil), data...), cas: d.lastCas}
	return statusOK
}

type metric struct {
	kind  metricType
	value int64 // counter or gauge; for a histogram, the sum of recorded values
}

// metrics mirrors Envoy's Context::{define,increment,record,get}Metric return codes, including the
// ones that surprise: a counter rejects an increment of 0 or less, and a histogram cannot be read.
type metrics struct {
	byID   map[uint32]*metric
	byName map[string]uint32
}

func (m *metrics) define(kind metricType, name string) (uint32, status) {
	if kind > metricHistogram {
		return 0, statusBadArgument
	}
	if m.byID == nil {
		m.byID = make(map[uint32]*metric)
		m.byName = make(map[string]uint32)
	}
	key := string(rune('0'+kind)) + name
	if id, ok := m.byName[key]; ok {
		return id, statusOK
	}
	// Envoy keeps the type in the low bits of the id; doing the same makes ids look familiar in logs.
	id := uint32(len(m.byID)+1)<<2 | uint32(kind)
	m.byID[id] = &metric{kind: kind}
	m.byName[key] = id
	return id, statusOK
}

func (m *metrics) increment(id uint32, offset int64) status {
	x, ok := m.byID[id]
	if !ok {
		return statusNotFound
	}
	switch x.kind {
	case metricCounter:
		if offset <= 0 {
			return statusBadArgument
		}
		x.value += offset
	case metricGauge:
		x.value += offset
	default:
		return statusBadArgument
	}
	return statusOK
}

func (m *metrics) record(id uint32, value uint64) status {
	x, ok := m.byID[id]
	if !ok {
		return statusNotFound
	}
	switch x.kind {
	case metricGauge:
		x.value = int64(value)
	default: // counters add, histograms accumulate
		x.value += int64(value)
	}
	return statusOK
}

func (m *metrics) get(id uint32) (uint64, status) {
	x, ok := m.byID[id]
	if !ok {
		return 0, statusNotFound
	}
	if x.kind == metricHistogram {
		return 0, statusBadArgument
	}
	return uint64(x.value), statusOK
}

func (m *metrics) byNameAny(name string) (int64, bool) {
	for _, kind := range []metricType{metricCounter, metricGauge, metricHistogram} {
		if id, ok := m.byName[string(rune('0'+kind))+name]; ok {
			return m.byID[id].value, true
		}
	}
	return 0, false
}
