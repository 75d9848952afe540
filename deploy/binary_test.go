package deploy_test

import (
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// TestBuiltBinary checks what the Dockerfile's build command produced: a
// static executable that reports the stamped version.
func TestBuiltBinary(t *testing.T) {
	bin := envoyRLS(t)
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Errorf("the binary has a dynamic loader: it is not static")
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		t.Errorf("the binary links %v: it is not static", libs)
	}
	out, err := exec.Command(bin, "version").CombinedOutput()
	if err != nil {
		t.Fatalf("envoy-rls version: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), builtVersion) {
		t.Errorf("envoy-rls version says %q, the build stamped %q", out, builtVersion)
	}
}

// checkNoWritableFiles fails the test if the process holds a regular file
// open for writing (its stdout and stderr are pipes).
func checkNoWritableFiles(t *testing.T, pid int) {
	t.Helper()
	fdDir := fmt.Sprintf("/proc/%d/fd", pid)
	fds, err := os.ReadDir(fdDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, fd := range fds {
		target, err := os.Readlink(filepath.Join(fdDir, fd.Name()))
		if err != nil || !strings.HasPrefix(target, "/") || strings.HasPrefix(target, "/dev/") {
			continue // sockets, pipes, anon inodes, devices
		}
		info, err := os.ReadFile(fmt.Sprintf("/proc/%d/fdinfo/%s", pid, fd.Name()))
		if err != nil {
			continue
		}
		for line := range strings.SplitSeq(string(info), "\n") {
			if v, ok := strings.CutPrefix(line, "flags:"); ok {
				flags, _ := strconv.ParseInt(strings.TrimSpace(v), 8, 64)
				if flags&(syscall.O_WRONLY|syscall.O_RDWR) != 0 {
					t.Errorf("envoy-rls holds %s open for writing", target)
				}
			}
		}
	}
}

// addrPort is the port of a listen address such as ":8081".
func addrPort(t *testing.T, addr string) int {
	t.Helper()
	_, p, ok := strings.Cut(addr, ":")
	n, err := strconv.Atoi(p)
	if !ok || err != nil {
		t.Fatalf("listen address %q has no port", addr)
	}
	return n
}

// cmpVersion compares dotted version numbers ("1.26.8").
func cmpVersion(a, b string) int {
	as, bs := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < max(len(as), len(bs)); i++ {
		var x, y int
		if i < len(as) {
			x, _ = strconv.Atoi(as[i])
		}
		if i < len(bs) {
			y, _ = strconv.Atoi(bs[i])
		}
		if x != y {
			return x - y
		}
	}
	return 0
}
