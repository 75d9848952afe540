package main

import (
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"

	goredis "github.com/redis/go-redis/v9"
)

// redisURLFlag is --redis-url, read once when the flag is set: the text
// (normalized as the reference server reads REDIS_URL) and its parts. A
// value go-redis cannot use is refused there, naming the format, instead of
// when the store is built.
type redisURLFlag struct {
	text string   // empty when not set
	url  *url.URL // nil when not set
	// skipVerify is the URL's skip_verify=true, which go-redis honours.
	skipVerify bool
}

// UnmarshalText reads host:port (no scheme) as redis://host:port, and a
// path as a Unix socket, as the reference server reads REDIS_URL; a URL with
// a scheme is taken as it is.
func (f *redisURLFlag) UnmarshalText(b []byte) error {
	s := strings.TrimSpace(string(b))
	switch {
	case s == "":
		*f = redisURLFlag{}
		return nil
	case strings.HasPrefix(s, "/"):
		s = "unix://" + s
	case !strings.Contains(s, "://"):
		s = "redis://" + s
	}
	u, err := url.Parse(s)
	if err != nil {
		return fmt.Errorf("%q: %v (want redis://[user:pass@]host:port/db, rediss:// for TLS, unix:///path or host:port)", string(b), err)
	}
	ro, err := goredis.ParseURL(s)
	if err != nil {
		return fmt.Errorf("%q: %v (want redis://[user:pass@]host:port/db, rediss:// for TLS, unix:///path or host:port)", string(b), err)
	}
	*f = redisURLFlag{text: s, url: u, skipVerify: ro.TLSConfig != nil && ro.TLSConfig.InsecureSkipVerify}
	return nil
}

// MarshalText returns the normalized URL.
func (f redisURLFlag) MarshalText() ([]byte, error) { return []byte(f.text), nil }

// String returns the normalized URL, "" when not set.
func (f redisURLFlag) String() string { return f.text }

// set reports whether the flag was given a URL.
func (f redisURLFlag) set() bool { return f.url != nil }

// tls reports whether the URL asks for TLS (rediss://).
func (f redisURLFlag) tls() bool { return f.url != nil && strings.EqualFold(f.url.Scheme, "rediss") }

// addrList is a comma-separated list of host:port addresses
// (--redis-sentinel, --redis-cluster), split and checked once when the flag
// is set. Empty items are dropped.
type addrList []string

// UnmarshalText splits the list and checks each address.
func (l *addrList) UnmarshalText(b []byte) error {
	var out addrList
	for _, p := range strings.Split(string(b), ",") {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		host, port, err := net.SplitHostPort(p)
		if err == nil && host == "" {
			err = fmt.Errorf("no host")
		}
		if err == nil {
			if n, perr := strconv.Atoi(port); perr != nil || n < 1 || n > 65535 {
				err = fmt.Errorf("port %q is not a number in 1-65535", port)
			}
		}
		if err != nil {
			return fmt.Errorf("%q: %v (want HOST:PORT[,HOST:PORT...])", p, err)
		}
		out = append(out, p)
	}
	*l = out
	return nil
}

// MarshalText joins the list with commas.
func (l addrList) MarshalText() ([]byte, error) { return []byte(strings.Join(l, ",")), nil }
