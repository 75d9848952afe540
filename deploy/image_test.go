package deploy_test

import (
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// imageRoot lays the built binary out as the image does (at
// /usr/local/bin/envoy-rls and /bin/ratelimit) under a root-owned directory
// that is read-only for everyone while the test runs.
func imageRoot(t *testing.T) string {
	t.Helper()
	bin := envoyRLS(t)
	root := worldReadableTempDir(t)
	for _, p := range []string{"usr/local/bin/envoy-rls", "bin/ratelimit"} {
		if err := copyFile(bin, filepath.Join(root, p), 0o555); err != nil {
			t.Fatal(err)
		}
	}
	var dirs []string
	filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
		if err == nil && e.IsDir() {
			dirs = append(dirs, p)
		}
		return err
	})
	for _, d := range dirs {
		os.Chmod(d, 0o555)
	}
	t.Cleanup(func() { // so the temp dir can be removed
		for _, d := range dirs {
			os.Chmod(d, 0o755)
		}
	})
	return root
}

// imageRun is /bin/ratelimit started as the image starts it.
type imageRun struct {
	*process
	root   string
	dirs   []string // directories the process was given (config, certificates)
	asRoot bool
	start  time.Time
}

// runAsImage starts root/bin/ratelimit with args and env, as uid/gid 65534
// when the test runs as root (else as the test's own non-root user), from
// the read-only root with HOME and TMPDIR pointing at it.
func runAsImage(t *testing.T, root string, args, env []string, dirs ...string) *imageRun {
	t.Helper()
	cmd := exec.Command(filepath.Join(root, "bin/ratelimit"), args...)
	cmd.Dir = root
	cmd.Env = append([]string{"HOME=" + root, "TMPDIR=" + root}, env...)
	r := &imageRun{root: root, dirs: dirs, asRoot: os.Geteuid() == 0}
	if r.asRoot {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	} else {
		t.Logf("not root: running as uid %d instead of 65534", os.Geteuid())
	}
	r.start = time.Now()
	r.process = start(t, cmd)
	return r
}

// checkUser fails unless the process runs as uid 65534 (when the test can
// switch users).
func (r *imageRun) checkUser(t *testing.T) {
	t.Helper()
	if !r.asRoot {
		return
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", r.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(status), "\nUid:\t65534\t65534\t65534\t65534\n") ||
		!strings.Contains(string(status), "\nGid:\t65534\t65534\t65534\t65534\n") {
		t.Fatalf("the process does not run as uid/gid 65534:\n%s", status)
	}
}

// stopAndCheckNoWrites checks that the running process holds no file open
// for writing, stops it (exit 0 on SIGTERM), and checks that nothing owned
// by its user appeared where it could have written: the top level of the
// world-writable directories (a nested file would need a directory it made
// there first), and the directories it was given.
func (r *imageRun) stopAndCheckNoWrites(t *testing.T) {
	t.Helper()
	checkNoWritableFiles(t, r.cmd.Process.Pid)
	r.stop(t)
	uid := uint32(os.Geteuid())
	if r.asRoot {
		uid = 65534
	}
	var entries []string
	for _, dir := range []string{"/tmp", "/var/tmp", "/dev/shm", os.TempDir()} {
		es, _ := os.ReadDir(dir)
		for _, e := range es {
			entries = append(entries, filepath.Join(dir, e.Name()))
		}
	}
	for _, dir := range append([]string{r.root}, r.dirs...) {
		filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
			if err == nil {
				entries = append(entries, p)
			}
			return nil
		})
	}
	for _, p := range entries {
		info, err := os.Lstat(p)
		if err != nil {
			continue // gone: not the process's
		}
		st, ok := info.Sys().(*syscall.Stat_t)
		if !ok || st.Uid != uid || info.ModTime().Before(r.start) {
			continue
		}
		if !r.asRoot && !strings.HasPrefix(p, r.root) {
			continue // the test's own user writes elsewhere all the time
		}
		t.Errorf("envoy-rls left %s behind", p)
	}
}

// TestImageRunsAsNobodyReadOnly starts the binary as the image runs it: from
// a read-only tree, as uid/gid 65534. It must serve, hold no file open for
// writing and leave no file behind.
func TestImageRunsAsNobodyReadOnly(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	root := imageRoot(t)
	redisAddr := startRedis(t)

	t.Run("native flags", func(t *testing.T) {
		configDir := configMapDir(t, map[string]string{"ratelimit.yaml": configMapConfig(t)})
		httpAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
		r := runAsImage(t, root, []string{"serve"}, []string{
			"ENVOY_RLS_CONFIG=" + configDir,
			fmt.Sprintf("ENVOY_RLS_GRPC_ADDR=127.0.0.1:%d", freePort(t)),
			"ENVOY_RLS_HTTP_ADDR=" + httpAddr,
			"ENVOY_RLS_BACKEND=redis",
			"ENVOY_RLS_REDIS_URL=redis://" + redisAddr + "/0",
		}, configDir)
		r.waitHTTP(t, "http://"+httpAddr+"/healthz")
		r.checkUser(t)
		for i := 0; i < 3; i++ {
			if !limitFor(t, httpAddr, "ratelimit", []entry{{"remote_address", "10.9.8.7"}}) {
				t.Fatal("no limit applied")
			}
		}
		resp, err := http.Get("http://" + httpAddr + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		r.stopAndCheckNoWrites(t)
	})
}
