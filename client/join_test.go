package client

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// joinServer answers a join link's three endpoints as the real server
// does (runtime/agent_server.py), with what each test sets.
type joinServer struct {
	status     int    // of /status
	statusBody string // JSON
	page       int
	installer  map[string]func(w http.ResponseWriter) // by platform
	hits       []string
}

func (js *joinServer) start(t *testing.T) (*Client, string) {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		js.hits = append(js.hits, r.URL.RequestURI())
		switch {
		case r.URL.Path == "/agent/client/join/0123456789abcdef/status":
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(js.status)
			w.Write([]byte(js.statusBody))
		case r.URL.Path == "/agent/client/join/0123456789abcdef":
			w.Header().Set("Content-Type", "text/html")
			w.WriteHeader(js.page)
			w.Write([]byte("<!DOCTYPE html><html>" + strings.Repeat("x", 100<<10) + "</html>"))
		case r.URL.Path == "/agent/client/join/0123456789abcdef/installer":
			if f := js.installer[r.URL.Query().Get("platform")]; f != nil {
				f(w)
				return
			}
			http.Error(w, "no", http.StatusTeapot)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return New(srv.URL, nil, "", nil), srv.URL + "/agent/client/join/0123456789abcdef"
}

func jsonError(status int, code string) func(w http.ResponseWriter) {
	return func(w http.ResponseWriter) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		w.Write([]byte(`{"error": "` + code + `", "message": "m"}`))
	}
}

func TestJoinHappyPath(t *testing.T) {
	js := &joinServer{status: 200, page: 200,
		statusBody: `{"join_id": "0123456789abcdef", "state": "created", "device_name": "laptop", "platform": "auto", "expires_at": 1790000000}`,
		installer:  map[string]func(http.ResponseWriter){"linux": func(w http.ResponseWriter) { w.Write([]byte("#!/bin/sh\n")) }}}
	c, link := js.start(t)
	ctx := context.Background()
	st, err := c.JoinStatus(ctx, link)
	if err != nil || st.State != "created" || st.DeviceName != "laptop" || st.Device != nil {
		t.Fatalf("JoinStatus = %+v, %v", st, err)
	}
	// The page is larger than what is read: read up to the limit, dropped.
	if err := c.OpenJoinPage(ctx, link); err != nil {
		t.Fatalf("OpenJoinPage: %v", err)
	}
	b, err := c.JoinInstaller(ctx, link, "linux")
	if err != nil || string(b) != "#!/bin/sh\n" {
		t.Fatalf("JoinInstaller = %q, %v", b, err)
	}
	want := []string{"/agent/client/join/0123456789abcdef/status", "/agent/client/join/0123456789abcdef", "/agent/client/join/0123456789abcdef/installer?platform=linux"}
	if strings.Join(js.hits, " ") != strings.Join(want, " ") {
		t.Errorf("requests %q, want %q", js.hits, want)
	}
}

func TestJoinStatusPaired(t *testing.T) {
	js := &joinServer{status: 200, statusBody: `{"join_id": "0123456789abcdef", "state": "heartbeat", "device_name": "laptop", "platform": "linux", "expires_at": 1, "device": {"id": "dev-1", "name": "laptop", "fingerprint": "abcd", "os_family": "linux", "os_arch": "x86_64", "last_heartbeat": null, "last_poll": null}}`}
	c, link := js.start(t)
	st, err := c.JoinStatus(context.Background(), link)
	if err != nil || st.Device == nil || st.Device.ID != "dev-1" || st.Device.Fingerprint != "abcd" {
		t.Fatalf("JoinStatus = %+v, %v", st, err)
	}
}

func TestJoinErrors(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		js   joinServer
		step string // status, page, installer
		want error
		says string
	}{
		{name: "unknown", js: joinServer{status: 404, statusBody: `{"error": "unknown_join", "message": "join session not found"}`}, step: "status", want: ErrJoinUnknown},
		{name: "unknown page", js: joinServer{page: 404}, step: "page", want: ErrJoinUnknown},
		{name: "expired", js: joinServer{installer: map[string]func(http.ResponseWriter){"linux": jsonError(410, "expired")}}, step: "installer", want: ErrJoinExpired},
		{name: "no installer", js: joinServer{installer: map[string]func(http.ResponseWriter){"linux": jsonError(503, "installer_missing")}}, step: "installer", want: ErrJoinNoInstaller},
		{name: "no pin on linux either", js: joinServer{installer: map[string]func(http.ResponseWriter){"linux": jsonError(503, "pin_unavailable")}}, step: "installer", want: ErrJoinNoInstaller},
		{name: "status html", js: joinServer{status: 200, statusBody: "<html>hello</html>"}, step: "status", want: ErrNotMetnos, says: "with an HTML page"},
		{name: "status other json", js: joinServer{status: 200, statusBody: `{"join_id": "0123456789abcdef", "state": "weird"}`}, step: "status", want: ErrNotMetnos, says: "with JSON that is not a join session's status"},
		{name: "status 404 text", js: joinServer{status: 404, statusBody: "404 page not found"}, step: "status", want: ErrNotMetnos, says: "it answered 404 Not Found: 404 page not found"},
		{name: "page 500", js: joinServer{page: 500}, step: "page", want: ErrNotMetnos, says: "with an HTML page"},
		{name: "installer teapot", js: joinServer{}, step: "installer", want: ErrNotMetnos, says: "418"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, link := tc.js.start(t)
			var err error
			switch tc.step {
			case "status":
				_, err = c.JoinStatus(ctx, link)
			case "page":
				err = c.OpenJoinPage(ctx, link)
			case "installer":
				_, err = c.JoinInstaller(ctx, link, "linux")
			}
			if !errors.Is(err, tc.want) {
				t.Fatalf("%s: %v, want %v", tc.step, err, tc.want)
			}
			if !strings.Contains(err.Error(), tc.says) || strings.Contains(err.Error(), "\n") {
				t.Errorf("%s: %q, want one line saying %q", tc.step, err, tc.says)
			}
		})
	}
}

// A Windows request the real server cannot pin (503 pin_unavailable)
// is asked again for linux, whose script carries the same two values.
func TestJoinInstallerWindowsFallsBackToLinux(t *testing.T) {
	js := &joinServer{installer: map[string]func(http.ResponseWriter){
		"windows": jsonError(503, "pin_unavailable"),
		"linux":   func(w http.ResponseWriter) { w.Write([]byte("linux script")) },
	}}
	c, link := js.start(t)
	b, err := c.JoinInstaller(context.Background(), link, "windows")
	if err != nil || string(b) != "linux script" {
		t.Fatalf("JoinInstaller(windows) = %q, %v", b, err)
	}
	if len(js.hits) != 2 || !strings.HasSuffix(js.hits[0], "platform=windows") || !strings.HasSuffix(js.hits[1], "platform=linux") {
		t.Errorf("requests %q, want windows then linux", js.hits)
	}
}

func TestJoinInstallerTooLarge(t *testing.T) {
	js := &joinServer{installer: map[string]func(http.ResponseWriter){
		"linux": func(w http.ResponseWriter) { w.Write(make([]byte, installerLimit+1)) },
	}}
	c, link := js.start(t)
	if _, err := c.JoinInstaller(context.Background(), link, "linux"); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("JoinInstaller of %d bytes: %v, want ErrTooLarge", installerLimit+1, err)
	}
}

func TestJoinNothingListening(t *testing.T) {
	c := New("http://127.0.0.1:1", nil, "", nil)
	_, err := c.JoinStatus(context.Background(), "http://127.0.0.1:1/agent/client/join/0123456789abcdef")
	if err == nil || !strings.Contains(err.Error(), "nothing listens at 127.0.0.1:1") {
		t.Fatalf("JoinStatus: %v", err)
	}
}
