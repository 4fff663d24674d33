package agent

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// TestUnspoolableResultDelivered: a result that cannot be spooled (the
// data folder full after the run) is delivered from memory all the
// same, recorded in the ledger once there is room, and after a restart
// the invocation is neither run again nor reported as outcome unknown.
func TestUnspoolableResultDelivered(t *testing.T) {
	var mu sync.Mutex
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		got = append(got, string(b))
		mu.Unlock()
	}))
	defer srv.Close()
	a := testAgent(t, srv.URL)
	id := "inv-18ed65bd51bdc701fcd26b58"
	if err := a.spool.Start(id, "revertible", true); err != nil {
		t.Fatal(err)
	}
	// The result's file cannot be written, as on a full disk.
	block := filepath.Join(a.cfg.Layout.SpoolResults(), id+".json.tmp")
	os.MkdirAll(filepath.Join(block, "x"), 0o700)
	body := `{"invocation_id":"` + id + `","ok":true}`
	if err := a.spoolResult(id, []byte(body)); err == nil {
		t.Fatal("spooling succeeded")
	}
	ctx := context.Background()
	if !a.flush(ctx) {
		t.Fatal("the result kept in memory was not delivered")
	}
	mu.Lock()
	if len(got) != 1 || got[0] != body {
		t.Fatalf("the server got %q, want the result once", got)
	}
	mu.Unlock()
	if len(a.unsettled) != 1 {
		t.Fatalf("unsettled %v", a.unsettled)
	}
	// The next round records it in the ledger (which has room).
	a.flush(ctx)
	if len(a.unsettled) != 0 {
		t.Fatalf("still unsettled after space returned: %v", a.unsettled)
	}
	if m, _ := filepath.Glob(filepath.Join(a.cfg.Layout.SpoolStarted(), "*")); len(m) != 0 {
		t.Errorf("STARTED markers left: %v", m)
	}
	a.Close()

	b, err := New(a.cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if !b.spool.Executed(id) {
		t.Error("after a restart the invocation could run again")
	}
	b.flush(ctx)
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 1 {
		t.Errorf("after a restart the server got %d results, want the one delivered before: %q", len(got), got)
	}
}

// TestUnspoolableResultSpooledLater: a result kept in memory before the
// first flush survives the flush's read of the spool, and is spooled
// once there is room, before the server takes it.
func TestUnspoolableResultSpooledLater(t *testing.T) {
	status := http.StatusServiceUnavailable
	var mu sync.Mutex
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		w.WriteHeader(status)
	}))
	defer srv.Close()
	a := testAgent(t, srv.URL)
	id := "inv-18ed65bd51bdc701fcd26b58"
	a.spool.Start(id, "revertible", true)
	block := filepath.Join(a.cfg.Layout.SpoolResults(), id+".json.tmp")
	os.MkdirAll(filepath.Join(block, "x"), 0o700)
	if err := a.spoolResult(id, []byte(`{"invocation_id":"`+id+`"}`)); err == nil {
		t.Fatal("spooling succeeded")
	}
	ctx := context.Background()
	if a.flush(ctx) || len(a.outbox) != 1 {
		t.Fatalf("the result kept in memory is gone: outbox %v", a.outboxIDs())
	}
	os.RemoveAll(block)
	a.flush(ctx)
	if pending, _ := a.spool.Pending(); len(pending) != 1 || len(a.unsettled) != 0 || !a.outbox[0].OnDisk() {
		t.Fatalf("not spooled once there was room: pending %v, unsettled %v", pending, a.unsettled)
	}
	mu.Lock()
	status = http.StatusOK
	mu.Unlock()
	if !a.flush(ctx) {
		t.Fatal("not delivered")
	}
	if pending, _ := a.spool.Pending(); len(pending) != 0 {
		t.Errorf("left in the spool: %v", pending)
	}
}
