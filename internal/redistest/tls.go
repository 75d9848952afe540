package redistest

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
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
// its CA. Its Server's URL is rediss:// and its Client speaks TLS with the
// client certificate. Its methods are safe for concurrent use.
type TLSServer struct {
	*Server
	files TLSFiles
}

// StartTLS generates a test PKI (see NewTLSFiles) and starts a redis-server
// that serves TLS only, on a free loopback port, with that server
// certificate and client authentication required (--tls-auth-clients yes).
// It waits until a TLS client with the client certificate gets an answer to
// PING, and stops the server when the test ends.
func StartTLS(tb testing.TB) (*TLSServer, TLSFiles) {
	tb.Helper()
	files := NewTLSFiles(tb)
	srv := startTLS(tb, []string{
		"--tls-cert-file", files.ServerCert,
		"--tls-key-file", files.ServerKey,
		"--tls-ca-cert-file", files.CA,
		"--tls-auth-clients", "yes",
	}, files.ClientConfig(tb))
	return &TLSServer{Server: srv, files: files}, files
}

// Files returns the server's PKI files.
func (s *TLSServer) Files() TLSFiles { return s.files }

// clientTLS returns a client TLS configuration that the server accepts: it
// trusts the CA and presents the client certificate.
func (s *TLSServer) clientTLS() *tls.Config { return s.tls.Clone() }
