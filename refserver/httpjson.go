package refserver

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/metnos/agent/wire"
)

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		b = []byte(`{"error":"internal_error","message":"encoding the response failed"}`)
	}
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	w.Write(b)
}

func writeError(w http.ResponseWriter, status int, code, format string, args ...any) {
	writeJSON(w, status, map[string]string{"error": code, "message": fmt.Sprintf(format, args...)})
}

// readBody reads at most wire.MaxBodyBytes. When the body is larger it answers
// 413 with a plain-text body, as aiohttp does, and returns ok=false.
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, wire.MaxBodyBytes))
	var tooBig *http.MaxBytesError
	switch {
	case errors.As(err, &tooBig):
		http.Error(w, fmt.Sprintf("Maximum request body size %d exceeded", wire.MaxBodyBytes), http.StatusRequestEntityTooLarge)
		return nil, false
	case err != nil:
		http.Error(w, "reading the request body failed", http.StatusBadRequest)
		return nil, false
	}
	return b, true
}

// decodeObject parses a JSON object keeping numbers exact.
func decodeObject(b []byte) (map[string]any, bool) {
	v, err := wire.Decode(b)
	if err != nil {
		return nil, false
	}
	m, ok := v.(map[string]any)
	return m, ok
}

// truthy is Python's truth value of a decoded JSON value.
func truthy(v any) bool {
	switch x := v.(type) {
	case nil:
		return false
	case bool:
		return x
	case string:
		return x != ""
	case json.Number:
		f, err := x.Float64()
		return err != nil || f != 0
	case []any:
		return len(x) > 0
	case map[string]any:
		return len(x) > 0
	}
	return true
}

// readObject reads the body as one JSON object; it answers 413 or
// 400 invalid_json itself when it cannot.
func readObject(w http.ResponseWriter, r *http.Request) ([]byte, map[string]any, bool) {
	body, ok := readBody(w, r)
	if !ok {
		return nil, nil, false
	}
	m, ok := decodeObject(body)
	if !ok {
		writeError(w, http.StatusBadRequest, wire.CodeInvalidJSON, "body must be a JSON object")
		return nil, nil, false
	}
	return body, m, true
}
