package redistest

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TLSFiles are the PEM files of a small test PKI made by NewTLSFiles: a CA,
// a server certificate signed by it for 127.0.0.1 and localhost, and a
// client certificate signed by it for client authentication.
type TLSFiles struct {
	CA         string // the CA certificate
	ServerCert string // the server certificate
	ServerKey  string // the server certificate's private key (PKCS #8)
	ClientCert string // the client certificate
	ClientKey  string // the client certificate's private key (PKCS #8)
}

// NewTLSFiles generates a fresh CA, server certificate and client
// certificate (ECDSA P-256, valid from an hour ago for a day) and writes
// them into a temporary directory of the test.
func NewTLSFiles(tb testing.TB) TLSFiles {
	tb.Helper()
	dir := tb.TempDir()
	f := TLSFiles{
		CA:         filepath.Join(dir, "ca.pem"),
		ServerCert: filepath.Join(dir, "server.pem"),
		ServerKey:  filepath.Join(dir, "server-key.pem"),
		ClientCert: filepath.Join(dir, "client.pem"),
		ClientKey:  filepath.Join(dir, "client-key.pem"),
	}
	if err := f.generate(); err != nil {
		tb.Fatalf("redistest: generating TLS files: %v", err)
	}
	return f
}

func (f TLSFiles) generate() error {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		Subject:               pkix.Name{CommonName: "redistest CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := signCert(caTmpl, caTmpl, caKey.Public(), caKey)
	if err != nil {
		return err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return err
	}
	if err := writePEM(f.CA, "CERTIFICATE", caDER); err != nil {
		return err
	}
	leaves := []struct {
		tmpl          *x509.Certificate
		cert, keyFile string
	}{
		{&x509.Certificate{
			Subject:     pkix.Name{CommonName: "redistest server"},
			DNSNames:    []string{"localhost"},
			IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		}, f.ServerCert, f.ServerKey},
		{&x509.Certificate{
			Subject:     pkix.Name{CommonName: "redistest client"},
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		}, f.ClientCert, f.ClientKey},
	}
	for _, l := range leaves {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return err
		}
		l.tmpl.NotBefore, l.tmpl.NotAfter = caTmpl.NotBefore, caTmpl.NotAfter
		l.tmpl.KeyUsage = x509.KeyUsageDigitalSignature
		der, err := signCert(l.tmpl, ca, key.Public(), caKey)
		if err != nil {
			return err
		}
		keyDER, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			return err
		}
		if err := writePEM(l.cert, "CERTIFICATE", der); err != nil {
			return err
		}
		if err := writePEM(l.keyFile, "PRIVATE KEY", keyDER); err != nil {
			return err
		}
	}
	return nil
}

// signCert gives tmpl a random serial number and signs it with the key of
// parent.
func signCert(tmpl, parent *x509.Certificate, pub crypto.PublicKey, signer crypto.Signer) ([]byte, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		return nil, err
	}
	tmpl.SerialNumber = serial
	return x509.CreateCertificate(rand.Reader, tmpl, parent, pub, signer)
}

func writePEM(path, typ string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
}

// ClientConfig returns a TLS client configuration that trusts the CA and
// presents the client certificate: what a client of a server started by
// StartTLS needs.
func (f TLSFiles) ClientConfig(tb testing.TB) *tls.Config {
	tb.Helper()
	caPEM, err := os.ReadFile(f.CA)
	if err != nil {
		tb.Fatalf("redistest: %v", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		tb.Fatalf("redistest: no certificate in %s", f.CA)
	}
	cert, err := tls.LoadX509KeyPair(f.ClientCert, f.ClientKey)
	if err != nil {
		tb.Fatalf("redistest: client key pair: %v", err)
	}
	return &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
}

// TLSServer is a standalone redis-server on 127.0.0.1 that accepts only TLS
// connections (no plain port) and requires a client certificate signed by
// its CA. Its methods are safe for concurrent use.
type TLSServer struct {
	srv   *Server
	files TLSFiles
	conf  *tls.Config // client configuration
}

// StartTLS generates a test PKI (see NewTLSFiles) and starts a redis-server
// that serves TLS only, on a free loopback port, with that server
// certificate and client authentication required (--tls-auth-clients yes).
// It waits until a TLS client with the client certificate gets an answer to
// PING, and stops the server when the test ends.
func StartTLS(tb testing.TB) (*TLSServer, TLSFiles) {
	tb.Helper()
	files := NewTLSFiles(tb)
	s := &TLSServer{files: files, conf: files.ClientConfig(tb)}
	bin := Binary(tb)
	dir := tb.TempDir()
	var lastErr error
	for attempt := 0; attempt < 20; attempt++ {
		port, err := freePort(false)
		if err != nil {
			lastErr = err
			continue
		}
		s.srv = &Server{tb: tb, bin: bin, dir: dir, port: port}
		if err := s.launch(); err != nil {
			// Most likely the port was taken meanwhile: try another one.
			lastErr = err
			continue
		}
		tb.Cleanup(s.srv.Stop)
		return s, files
	}
	tb.Fatalf("redistest: cannot start a TLS redis-server: %v", lastErr)
	return nil, files
}

// launch starts the process with TLS only and waits until it answers PING
// over TLS.
func (s *TLSServer) launch() error {
	srv := s.srv
	args := []string{
		"--port", "0",
		"--tls-port", strconv.Itoa(srv.port),
		"--tls-cert-file", s.files.ServerCert,
		"--tls-key-file", s.files.ServerKey,
		"--tls-ca-cert-file", s.files.CA,
		"--tls-auth-clients", "yes",
		"--bind", "127.0.0.1",
		"--dir", srv.dir,
		"--save", "",
		"--appendonly", "no",
		"--daemonize", "no",
		"--logfile", filepath.Join(srv.dir, "redis.log"),
	}
	cmd := exec.Command(srv.bin, args...)
	cmd.Dir = srv.dir
	setDeathSignal(cmd)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", srv.bin, err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	srv.mu.Lock()
	srv.cmd, srv.exited = cmd, exited
	srv.mu.Unlock()

	if err := s.waitPing(exited); err != nil {
		_ = cmd.Process.Kill()
		<-exited
		return fmt.Errorf("TLS redis-server on port %d: %w\n%s%s", srv.port, err, out.String(), srv.logTail())
	}
	return nil
}

// waitPing polls PING over TLS until it succeeds, the process exits or
// startTimeout passes.
func (s *TLSServer) waitPing(exited <-chan struct{}) error {
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), TLSConfig: s.conf, MaxRetries: -1, DialTimeout: time.Second, PoolSize: 1})
	defer c.Close()
	deadline := time.Now().Add(startTimeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-exited:
			return errors.New("exited during start-up")
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no answer to PING over TLS within %v: %w", startTimeout, err)
		}
		time.Sleep(pollInterval)
	}
}

// Addr returns the server's TLS address, "127.0.0.1:port".
func (s *TLSServer) Addr() string { return s.srv.Addr() }

// Port returns the server's TLS port.
func (s *TLSServer) Port() int { return s.srv.Port() }

// URL returns the server's rediss:// URL (database 0).
func (s *TLSServer) URL() string { return "rediss://" + s.Addr() + "/0" }

// Files returns the server's PKI files.
func (s *TLSServer) Files() TLSFiles { return s.files }

// ClientTLS returns a client TLS configuration that the server accepts: it
// trusts the CA and presents the client certificate.
func (s *TLSServer) ClientTLS() *tls.Config { return s.conf.Clone() }

// Client returns a go-redis client of the server over TLS with the client
// certificate, closed when the test ends.
func (s *TLSServer) Client() *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), TLSConfig: s.ClientTLS()})
	s.srv.tb.Cleanup(func() { c.Close() })
	return c
}

// Running reports whether the process is running.
func (s *TLSServer) Running() bool { return s.srv.Running() }

// Stop kills the server (SIGKILL) and waits until it has exited.
func (s *TLSServer) Stop() { s.srv.Stop() }
