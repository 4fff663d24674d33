package refserver

import "net/http"

// deviceMux routes the device-facing endpoints (§5.1).
func (s *Server) deviceMux() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /agent/register", s.handleRegister)
	mux.HandleFunc("POST /agent/poll", s.handlePoll)
	mux.HandleFunc("POST /agent/heartbeat", s.handleHeartbeat)
	mux.HandleFunc("POST /agent/result", s.handleResult)
	mux.HandleFunc("GET /agent/executor/{name}", s.handleExecutor)
	mux.HandleFunc("GET /agent/shim", s.handleShim)
	mux.HandleFunc("GET /agent/runtime/descriptor/{filename}", s.handleRuntimeDescriptor)
	mux.HandleFunc("GET /agent/runtime/{filename}", s.handleRuntimeFile)
	mux.HandleFunc("GET /agent/health", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	return mux
}
