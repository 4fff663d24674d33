package refserver

import (
	"net/http"

	"github.com/metnos/agent/wire"
)

// deviceMux routes the device-facing endpoints (docs/protocol.md §5.1).
func (s *Server) deviceMux() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+wire.PathRegister, s.handleRegister)
	mux.HandleFunc("POST "+wire.PathPoll, s.handlePoll)
	mux.HandleFunc("POST "+wire.PathHeartbeat, s.handleHeartbeat)
	mux.HandleFunc("POST "+wire.PathResult, s.handleResult)
	mux.HandleFunc("GET "+wire.PathExecutor+"{name}", s.handleExecutor)
	mux.HandleFunc("GET "+wire.PathShim, s.handleShim)
	mux.HandleFunc("GET "+wire.PathRuntimeDescriptor+"{filename}", s.handleRuntimeDescriptor)
	mux.HandleFunc("GET "+wire.PathRuntime+"{filename}", s.handleRuntimeFile)
	mux.HandleFunc("GET "+wire.PathClientFiles+"update/{target}", s.handleClientDescriptor)
	mux.HandleFunc("GET "+wire.PathComponent+"{component}/update/{target}", s.handleComponentDescriptor)
	mux.HandleFunc("GET "+wire.PathJoin+"{id}", s.handleJoinPage)
	mux.HandleFunc("GET "+wire.PathJoin+"{id}/status", s.handleJoinStatus)
	mux.HandleFunc("GET "+wire.PathJoin+"{id}/installer", s.handleJoinInstaller)
	mux.HandleFunc("GET "+wire.PathClientFiles+ManifestName, s.handleClientManifest)
	mux.HandleFunc("GET "+wire.PathClientFiles+"{version}/{target}/{filename}", s.handleClientVersioned)
	mux.HandleFunc("GET "+wire.PathClientFiles+"{filename}", s.handleClientFile)
	mux.HandleFunc("GET "+wire.PathHealth, func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	return mux
}
