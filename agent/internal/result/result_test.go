package result

import (
	"errors"
	"strings"
	"testing"
)

// The protocol's example result, byte for byte (docs/protocol.md §9.2).
func TestResultBodyMatchesSpec(t *testing.T) {
	r := FromStdout([]byte(` {"entries":[{"echo":{"n":3}}],"ok":true,"ok_count":1,"score":0.5}` + "\n"))
	r.InvocationID, r.DeviceID, r.ElapsedMS, r.Sandbox = "inv-18ed65bd51bdc701fcd26b58", "7d23…68d5", 12, "none"
	b, err := r.Body()
	if err != nil {
		t.Fatal(err)
	}
	const want = `{"device_id":"7d23…68d5","elapsed_ms":12,"entries":[{"echo":{"n":3}}],"invocation_id":"inv-18ed65bd51bdc701fcd26b58","n_processed":1,"ok":true,"payload":{"entries":[{"echo":{"n":3}}],"ok":true,"ok_count":1,"score":0.5},"sandbox":"none"}`
	if string(b) != want {
		t.Errorf("body:\n got %s\nwant %s", b, want)
	}
}

func TestFromStdoutRules(t *testing.T) {
	for _, c := range []struct {
		out       string
		ok        bool
		n         int64
		err, cls  string
		entriesIs string
	}{
		{`{"ok":"yes","results":[1,2,3]}`, false, 3, "", "", "results"},
		{`{"ok":true,"entries":[1],"n_processed":7}`, true, 7, "", "", "entries"},
		{`{"ok":true,"entries":[1,2],"ok_count":"many"}`, true, 2, "", "", "entries"},
		{`{"ok":false,"error":"no such file","error_class":"not_found"}`, false, 0, "no such file", "not_found", "empty"},
		{`[1,2]`, false, 0, "", "", "empty"},
		{`not json`, false, 0, "the executor's output is not one JSON value", "device_error", "empty"},
	} {
		r := FromStdout([]byte(c.out))
		if r.OK != c.ok || r.NProcessed != c.n || !strings.HasPrefix(r.Error, c.err) || r.ErrorClass != c.cls {
			t.Errorf("%s: got ok=%v n=%d error=%q class=%q", c.out, r.OK, r.NProcessed, r.Error, r.ErrorClass)
		}
	}
}

func TestOversizedResultIsCutNotLost(t *testing.T) {
	r := FromStdout([]byte(`{"ok":true,"entries":["` + strings.Repeat("x", MaxResultBytes) + `"]}`))
	r.InvocationID = "inv-big"
	b, err := r.Body()
	if err != nil {
		t.Fatal(err)
	}
	if len(b) > MaxResultBytes || !strings.Contains(string(b), `"error_class":"result_too_large"`) || !strings.Contains(string(b), `"ok":false`) {
		t.Errorf("oversized body (%d bytes): %.300s", len(b), b)
	}
}

func TestTimeoutAndDeviceError(t *testing.T) {
	b, _ := Timeout("bwrap+landlock+seccomp").Body()
	if !strings.Contains(string(b), `"error":"deadline exceeded","error_class":"timeout"`) || !strings.Contains(string(b), `"sandbox":"bwrap+landlock+seccomp"`) {
		t.Errorf("timeout body %s", b)
	}
	b, _ = DeviceError(errors.New("manifest signature")).Body()
	if !strings.Contains(string(b), `"error_class":"device_error"`) || !strings.Contains(string(b), `"sandbox":"none"`) {
		t.Errorf("device error body %s", b)
	}
}

// TestFromOutputOverLimit: a stdout the sandbox cut at its limit is not
// decoded (it used to say "unexpected EOF"): the result says which
// executor went over the limit, and the limit.
func TestFromOutputOverLimit(t *testing.T) {
	cut := []byte(`{"ok":true,"entries":["xxxxxxxx`)
	r := FromOutput("big_output", cut, true, 8<<20)
	if r.OK || r.ErrorClass != "device_error" {
		t.Fatalf("ok %v, class %q", r.OK, r.ErrorClass)
	}
	for _, want := range []string{"big_output", "more than 8 MiB", "stdout", "limit"} {
		if !strings.Contains(r.Error, want) {
			t.Errorf("error %q does not say %q", r.Error, want)
		}
	}
	if strings.Contains(r.Error, "EOF") || strings.Contains(r.Error, "JSON") {
		t.Errorf("error %q reports a decoding failure, not the limit", r.Error)
	}
	// Whole output is read as before.
	if r := FromOutput("echo", []byte(`{"ok":true}`), false, 8<<20); !r.OK || r.Error != "" {
		t.Errorf("whole output: %+v", r)
	}
}
