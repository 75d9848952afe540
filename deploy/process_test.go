package deploy_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"
)

// process is a started envoy-rls.
type process struct {
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan struct{}
	err  error // set when done is closed
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// start runs cmd and stops it (SIGTERM, then SIGKILL) at cleanup.
func start(t *testing.T, cmd *exec.Cmd) *process {
	t.Helper()
	p := &process{cmd: cmd, out: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", cmd.Path, err)
	}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
			return
		default:
		}
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(15 * time.Second):
			cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// waitHTTP polls url until it answers 200, failing if the process exits or
// a minute passes (the machine may be very busy).
func (p *process) waitHTTP(t *testing.T, url string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	var last string
	for {
		select {
		case <-p.done:
			t.Fatalf("envoy-rls exited (%v) before %s answered; output:\n%s", p.err, url, p.out.String())
		default:
		}
		resp, err := http.Get(url)
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
			last = fmt.Sprintf("%d %s", resp.StatusCode, body)
		} else {
			last = err.Error()
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not answer 200 within a minute (last: %s); output:\n%s", url, last, p.out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// entry is one (key, value) of a rate limit descriptor.
type entry struct{ Key, Value string }

// limitFor sends one descriptor to envoy-rls's POST /json and reports
// whether a rate limit applied to it (the status names a current limit).
func limitFor(t *testing.T, httpAddr, domain string, entries []entry) bool {
	t.Helper()
	type jsonEntry struct {
		Key   string `json:"key"`
		Value string `json:"value"`
	}
	var es []jsonEntry
	for _, e := range entries {
		es = append(es, jsonEntry(e))
	}
	body, err := json.Marshal(map[string]any{
		"domain":      domain,
		"descriptors": []any{map[string]any{"entries": es}},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+httpAddr+"/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("POST /json %s: %d %s", body, resp.StatusCode, raw)
	}
	var out struct {
		Statuses []struct {
			CurrentLimit *struct {
				RequestsPerUnit uint32 `json:"requestsPerUnit"`
			} `json:"currentLimit"`
		} `json:"statuses"`
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("POST /json answer %s: %v", raw, err)
	}
	if len(out.Statuses) != 1 {
		t.Fatalf("POST /json %s: want 1 status, got %s", body, raw)
	}
	return out.Statuses[0].CurrentLimit != nil
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// stop sends SIGTERM and waits for the exit; it fails the test unless the
// process exits 0.
func (p *process) stop(t *testing.T) {
	t.Helper()
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("no exit 30s after SIGTERM; output:\n%s", p.out.String())
	}
	if p.err != nil {
		t.Fatalf("exit after SIGTERM: %v; output:\n%s", p.err, p.out.String())
	}
}
