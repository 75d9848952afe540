// Package certreload serves TLS with certificate files that may change while
// the process runs, as Kubernetes rotates a mounted Secret (an atomic
// symlink swap) or as an operator overwrites the files. Every new handshake
// uses the files' current content; connections already open keep theirs,
// so a rotation drops no call. Files are checked at most once per
// CheckInterval, on a handshake, by their size, modification time and inode;
// a set that does not load (for example a certificate written before its
// key) is logged and the previous one keeps serving until the files are
// whole again.
package certreload

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"syscall"
	"time"
)

// Options name the files of a server.
type Options struct {
	// CertFile and KeyFile are the PEM certificate chain and private key.
	CertFile, KeyFile string
	// ClientCAFile, when set, requires client certificates signed by one
	// of its PEM certificates (mutual TLS).
	ClientCAFile string
	// ClientSAN, when set, requires the client certificate to carry this
	// DNS name or IP address (with ClientCAFile).
	ClientSAN string
	// CheckInterval is how often, at most, the files are looked at (zero:
	// one second).
	CheckInterval time.Duration
	// Logger receives reload and reload-failure lines (nil: slog.Default()).
	Logger *slog.Logger
}

// Server holds the current certificates of a TLS server.
type Server struct {
	o Options

	mu        sync.Mutex
	checked   time.Time
	stamps    []stamp
	cert      *tls.Certificate
	pool      *x509.CertPool
	lastError string
}

// stamp identifies a file's content cheaply.
type stamp struct {
	size  int64
	mtime time.Time
	ino   uint64
}

// New loads the files once; an error names the file that is wrong.
func New(o Options) (*Server, error) {
	if o.CertFile == "" || o.KeyFile == "" {
		return nil, errors.New("certreload: a certificate and a key file are needed")
	}
	if o.ClientSAN != "" && o.ClientCAFile == "" {
		return nil, errors.New("certreload: a client SAN needs a client CA file")
	}
	if o.CheckInterval <= 0 {
		o.CheckInterval = time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	s := &Server{o: o}
	stamps, err := s.stampFiles()
	if err != nil {
		return nil, err
	}
	cert, pool, err := s.load()
	if err != nil {
		return nil, err
	}
	s.stamps, s.cert, s.pool, s.checked = stamps, cert, pool, time.Now()
	return s, nil
}

func (s *Server) files() []string {
	f := []string{s.o.CertFile, s.o.KeyFile}
	if s.o.ClientCAFile != "" {
		f = append(f, s.o.ClientCAFile)
	}
	return f
}

func (s *Server) stampFiles() ([]stamp, error) {
	var out []stamp
	for _, f := range s.files() {
		st, err := os.Stat(f) // follows symlinks: a swapped link shows
		if err != nil {
			return nil, err
		}
		var ino uint64
		if sys, ok := st.Sys().(*syscall.Stat_t); ok {
			ino = uint64(sys.Ino)
		}
		out = append(out, stamp{size: st.Size(), mtime: st.ModTime(), ino: ino})
	}
	return out, nil
}

func (s *Server) load() (*tls.Certificate, *x509.CertPool, error) {
	cert, err := tls.LoadX509KeyPair(s.o.CertFile, s.o.KeyFile)
	if err != nil {
		return nil, nil, fmt.Errorf("TLS certificate %s with key %s: %v", s.o.CertFile, s.o.KeyFile, err)
	}
	if s.o.ClientCAFile == "" {
		return &cert, nil, nil
	}
	pem, err := os.ReadFile(s.o.ClientCAFile)
	if err != nil {
		return nil, nil, fmt.Errorf("TLS client CA %s: %v", s.o.ClientCAFile, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, nil, fmt.Errorf("TLS client CA %s: no PEM certificate in it", s.o.ClientCAFile)
	}
	return &cert, pool, nil
}

// current returns the certificate and client CAs to use now, reloading the
// files when they changed.
func (s *Server) current() (*tls.Certificate, *x509.CertPool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	if now.Sub(s.checked) < s.o.CheckInterval {
		return s.cert, s.pool
	}
	s.checked = now
	stamps, err := s.stampFiles()
	if err == nil && equalStamps(stamps, s.stamps) {
		return s.cert, s.pool
	}
	var cert *tls.Certificate
	var pool *x509.CertPool
	if err == nil {
		cert, pool, err = s.load()
	}
	if err != nil {
		if msg := err.Error(); msg != s.lastError {
			s.lastError = msg
			s.o.Logger.Error("TLS files changed but do not load; the previous certificates keep serving", "error", msg)
		}
		return s.cert, s.pool
	}
	s.stamps, s.cert, s.pool, s.lastError = stamps, cert, pool, ""
	s.o.Logger.Info("TLS certificates reloaded", "cert", s.o.CertFile)
	return s.cert, s.pool
}

func equalStamps(a, b []stamp) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].size != b[i].size || !a[i].mtime.Equal(b[i].mtime) || a[i].ino != b[i].ino {
			return false
		}
	}
	return true
}

// Certificate returns the certificate in use (for tests and logs).
func (s *Server) Certificate() *tls.Certificate {
	c, _ := s.current()
	return c
}

// Config returns a server TLS configuration that takes the current files at
// every handshake.
func (s *Server) Config() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			cert, pool := s.current()
			c := &tls.Config{
				MinVersion:   tls.VersionTLS12,
				Certificates: []tls.Certificate{*cert},
				NextProtos:   []string{"h2"},
			}
			if pool != nil {
				c.ClientAuth = tls.RequireAndVerifyClientCert
				c.ClientCAs = pool
				if san := s.o.ClientSAN; san != "" {
					c.VerifyConnection = func(cs tls.ConnectionState) error {
						if len(cs.PeerCertificates) == 0 {
							return errors.New("no client certificate")
						}
						if err := cs.PeerCertificates[0].VerifyHostname(san); err != nil {
							return fmt.Errorf("client certificate does not name %q", san)
						}
						return nil
					}
				}
			}
			return c, nil
		},
	}
}
