package result

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"
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
	b, _ = CPUTimeExceeded("bwrap+landlock+seccomp", "busy", 120*time.Second).Body()
	if !strings.Contains(string(b), `"error":"CPU time limit exceeded: executor busy used the 120 s of processor time it may use, and was stopped","error_class":"timeout"`) || !strings.Contains(string(b), `"entries":[]`) {
		t.Errorf("CPU time body %s", b)
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

// TestEncodeReturnsTheResultSent: Encode returns, beside the body, the
// Result the body encodes. Cut to fit, it says ok false, error_class
// result_too_large, with no entries nor payload; the Result it was
// cut from is left as it was (its payload is still the executor's
// whole output). The body is byte for byte the cut result's own.
func TestEncodeReturnsTheResultSent(t *testing.T) {
	pad := strings.Repeat("x", MaxResultBytes)
	r := FromStdout([]byte(`{"ok":true,"results":[{"path":"/h/a.txt","created":true}],"pad":"` + pad + `"}`))
	r.InvocationID, r.DeviceID, r.ElapsedMS, r.Sandbox, r.Policy = "inv-big", "dev", 7, "bwrap", "pol1:x"
	sent, body, cut, err := r.Encode()
	if err != nil || !cut {
		t.Fatalf("cut %v, err %v", cut, err)
	}
	if sent.OK || sent.ErrorClass != "result_too_large" || sent.NProcessed != 0 || len(sent.Entries.([]any)) != 0 || len(sent.Payload.(map[string]any)) != 0 {
		t.Errorf("the result sent: ok %v class %q n %d entries %v payload %.80v", sent.OK, sent.ErrorClass, sent.NProcessed, sent.Entries, sent.Payload)
	}
	if sent.InvocationID != "inv-big" || sent.DeviceID != "dev" || sent.ElapsedMS != 7 || sent.Sandbox != "bwrap" || sent.Policy != "pol1:x" {
		t.Errorf("the result sent lost the run's facts: %+v", sent)
	}
	if !r.OK || r.ErrorClass != "" || r.NProcessed != 1 || r.Payload.(map[string]any)["pad"] != pad {
		t.Errorf("the result cut from was changed: ok %v class %q n %d", r.OK, r.ErrorClass, r.NProcessed)
	}
	size := len(pad) + len(`{"device_id":"dev","elapsed_ms":7,"entries":[{"created":true,"path":"/h/a.txt"}],"invocation_id":"inv-big","n_processed":1,"ok":true,"payload":{"ok":true,"pad":"","results":[{"created":true,"path":"/h/a.txt"}]},"sandbox":"bwrap"}`)
	want := `{"device_id":"dev","elapsed_ms":7,"entries":[],"error":"the result was ` + strconv.Itoa(size) + ` bytes, over the server's 4194304-byte limit: its payload was dropped on the device","error_class":"result_too_large","invocation_id":"inv-big","n_processed":0,"ok":false,"payload":{},"sandbox":"bwrap"}`
	if string(body) != want {
		t.Errorf("body:\n got %s\nwant %s", body, want)
	}
	if again, _ := sent.Body(); string(again) != string(body) {
		t.Errorf("the body is not the result sent's own:\n got %s\nwant %s", body, again)
	}
	// Under the limit, the result sent is r itself.
	small := FromStdout([]byte(`{"ok":true,"entries":[1]}`))
	if s, b, cut, err := small.Encode(); err != nil || cut || !s.OK || s.ErrorClass != "" || s.NProcessed != 1 {
		t.Errorf("a result under the limit: %+v %s cut %v err %v", s, b, cut, err)
	}
}

// TestCutAtStop: a run cut short at the stop budget is ok false with
// nothing processed; an executor that writes gets the outcome-unknown
// class and payload, one that writes nothing "interrupted" and {}.
func TestCutAtStop(t *testing.T) {
	for _, tc := range []struct {
		name   string
		writes bool
		want   string
	}{
		{name: "writes", writes: true,
			want: `{"device_id":"d","elapsed_ms":0,"entries":[],"error":"cut","error_class":"execution_outcome_unknown","invocation_id":"i","n_processed":0,"ok":false,"payload":{"effect_status":"unknown","recovery":"cut_at_stop"},"sandbox":"bwrap+landlock+seccomp"}`},
		{name: "read only", writes: false,
			want: `{"device_id":"d","elapsed_ms":0,"entries":[],"error":"cut","error_class":"interrupted","invocation_id":"i","n_processed":0,"ok":false,"payload":{},"sandbox":"bwrap+landlock+seccomp"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := CutAtStop("bwrap+landlock+seccomp", tc.writes, "cut")
			r.InvocationID, r.DeviceID = "i", "d"
			b, err := r.Body()
			if err != nil {
				t.Fatal(err)
			}
			if string(b) != tc.want {
				t.Errorf("body\n got %s\nwant %s", b, tc.want)
			}
		})
	}
}
