package inference

import "strconv"

// ErrorJSON is the OpenAI-style error body inference clients parse:
// {"error":{"message":…,"type":…,"code":…}}. type carries a
// machine-readable reason; an empty message becomes the status text.
func ErrorJSON(status int, typ, message string) []byte {
	if message == "" {
		message = statusText(status)
	}
	b := make([]byte, 0, 48+len(message)+len(typ))
	b = append(b, `{"error":{"message":`...)
	b = AppendQuoted(b, message)
	b = append(b, `,"type":`...)
	b = AppendQuoted(b, typ)
	b = append(b, `,"code":`...)
	b = strconv.AppendInt(b, int64(status), 10)
	return append(b, "}}"...)
}

// statusText covers the statuses the processors send; net/http is not
// imported so the Wasm build stays small.
func statusText(status int) string {
	switch status {
	case 400:
		return "Bad Request"
	case 403:
		return "Forbidden"
	case 404:
		return "Not Found"
	case 413:
		return "Request Entity Too Large"
	case 429:
		return "Too Many Requests"
	case 500:
		return "Internal Server Error"
	case 503:
		return "Service Unavailable"
	}
	return "Error " + strconv.Itoa(status)
}
